/*
 * Namespaces: role + layout fingerprint. Objects of one namespace are
 * never read under another: a layout difference is a miss, never a
 * conversion.
 *
 * The fingerprint is XXH3-128 over a canonical text that names every
 * field that shapes bytes, in a fixed order, plus the role and the
 * daemon's namespace seed; every string in it is length-prefixed, so no
 * two layouts share it. Text rather than the raw struct so that the hash
 * does not depend on padding, and so that a human can read (in debug
 * logs) exactly what was hashed. It is hashed as it is written, with no
 * length limit. Namespaces are reference counted by the
 * sessions attached to them and live in the server's list.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define XXH_INLINE_ALL		/* XXH3_state_t on the stack, as dram.c and index.c do */
#include <xxhash.h>

#include "daemon.h"

static const char *
ns_layout_name(unsigned layout)
{
	switch (layout) {
	case PROTO_LAYOUT_PAGE_FIRST:		return "page_first";
	case PROTO_LAYOUT_LAYER_FIRST:		return "layer_first";
	case PROTO_LAYOUT_PAGE_FIRST_DIRECT:	return "page_first_direct";
	case PROTO_LAYOUT_SLOTS:		return "slots";
	}
	return "?";
}

static const char *
ns_attention_name(unsigned a)
{
	switch (a) {
	case PROTO_ATTN_MLA:	return "mla";
	case PROTO_ATTN_MHA:	return "mha";
	case PROTO_ATTN_GQA:	return "gqa";
	}
	return "?";
}

/*
 * The canonical text is written through ns_put, which feeds the
 * streaming XXH3 state and, when a buffer is given, copies what fits into
 * it for humans. The hash never depends on that buffer: no layout can be
 * cut short by it, silently or otherwise.
 */
struct ns_text {
	XXH3_state_t	 st;
	char		*buf;		/* NULL: hash only */
	size_t		 len;
	size_t		 n;		/* bytes of text so far, hashed */
};

static void
ns_put(struct ns_text *t, const char *s, size_t n)
{
	XXH3_128bits_update(&t->st, s, n);
	if (t->buf != NULL && t->n < t->len) {
		size_t	room = t->len - 1 - t->n;

		memcpy(t->buf + t->n, s, n < room ? n : room);
		t->buf[t->n + (n < room ? n : room)] = '\0';
	}
	t->n += n;
}

/* ";key=<number>" */
static void
ns_num(struct ns_text *t, const char *key, unsigned long long v)
{
	char	num[48];
	int	w;

	w = snprintf(num, sizeof(num), ";%s=%llu", key, v);
	ns_put(t, num, (size_t)w);	/* keys are this file's and short */
}

/*
 * ";key=<length>:<bytes>". The length prefix is what makes the text
 * unambiguous: the protocol lets a string hold every separator (";=,:"),
 * and v1, which pasted strings bare, gave model "fpc;kv_dtype=x" with
 * kv_dtype "y" the text (and so the namespace) of model "fpc" with
 * kv_dtype "x;kv_dtype=y" (issue 11 item 1). cap bounds a fixed-size
 * field that proto validated as NUL-terminated anyway.
 */
static void
ns_str(struct ns_text *t, const char *key, const char *v, size_t cap)
{
	size_t	n = strnlen(v, cap);
	char	head[48];
	int	w;

	w = snprintf(head, sizeof(head), ";%s=%zu:", key, n);
	ns_put(t, head, (size_t)w);
	ns_put(t, v, n);
}

/*
 * The canonical text. Field order and spelling are part of the on-disk
 * and on-wire identity of every object: changing them changes every
 * fingerprint, so it is versioned. v2 ("l3kv-ns-v2") length-prefixes
 * every string; every other value is a decimal number or one of this
 * file's enum names, none of which holds a separator, so the text reads
 * back one way only: two layouts share it only when every field is equal.
 */
static void
ns_walk(struct ns_text *t, const struct proto_layout *l, const struct proto_pool *pools,
    const char *role, uint64_t seed)
{
	const char	*tag = "l3kv-ns-v2";
	int		 i;

	ns_put(t, tag, strlen(tag));
	ns_str(t, "role", role, SIZE_MAX);
	ns_num(t, "nsseed", seed);
	ns_str(t, "model", l->model, sizeof(l->model));
	ns_str(t, "kv_dtype", l->kv_dtype, sizeof(l->kv_dtype));
	ns_str(t, "hash_scheme", l->hash_scheme, sizeof(l->hash_scheme));
	ns_num(t, "hash_len", l->hash_len);
	ns_put(t, ";attention=", 11);
	ns_put(t, ns_attention_name(l->attention), strlen(ns_attention_name(l->attention)));
	ns_num(t, "tp", l->tp_size);
	ns_num(t, "dcp", l->dcp_size);
	ns_num(t, "dcp_rank", l->dcp_rank);
	ns_num(t, "pp", l->pp_size);
	ns_num(t, "pp_rank", l->pp_rank);
	ns_num(t, "cp", l->cp_size);
	ns_num(t, "page", l->page_tokens);
	ns_num(t, "logical_page", l->logical_page_tokens);
	ns_put(t, ";host_layout=", 13);
	ns_put(t, ns_layout_name(l->host_layout), strlen(ns_layout_name(l->host_layout)));
	ns_num(t, "seed", l->seed);
	ns_num(t, "pools", l->npools);
	for (i = 0; i < l->npools; i++) {
		ns_str(t, "pool.name", pools[i].name, sizeof(pools[i].name));
		ns_num(t, "pool.kind", pools[i].kind);
		ns_num(t, "pool.hit", pools[i].hit_policy);
		ns_num(t, "pool.trailing", pools[i].trailing);
		ns_num(t, "pool.layers", pools[i].layers);
		ns_num(t, "pool.bytes", pools[i].object_bytes);
		ns_str(t, "pool.schema", pools[i].schema, sizeof(pools[i].schema));
	}
}

/*
 * Writes the canonical text into buf (for logs and tests; cut to len - 1
 * bytes, always NUL-terminated when len > 0) and returns its whole
 * length, which is what was hashed, like snprintf.
 */
size_t
ns_canonical(const struct proto_layout *l, const struct proto_pool *pools, const char *role,
    uint64_t seed, char *buf, size_t len)
{
	struct ns_text	t;

	XXH3_128bits_reset(&t.st);
	t.buf = len > 0 ? buf : NULL;
	t.len = len;
	t.n = 0;
	if (t.buf != NULL)
		buf[0] = '\0';
	ns_walk(&t, l, pools, role, seed);
	return t.n;
}

void
ns_fingerprint(const struct proto_layout *l, const struct proto_pool *pools, const char *role,
    uint64_t seed, uint8_t out[16])
{
	XXH128_canonical_t	c;
	struct ns_text		t;
	char			text[NS_TEXT_MAX];

	XXH3_128bits_reset(&t.st);
	t.buf = log_get_level() >= LOG_LEVEL_DEBUG ? text : NULL;
	t.len = sizeof(text);
	t.n = 0;
	text[0] = '\0';
	ns_walk(&t, l, pools, role, seed);
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&t.st));
	memcpy(out, c.digest, 16);
	if (t.buf != NULL)
		log_debug("ns", "fingerprint %02x%02x%02x%02x... of %zu bytes: %s%s", out[0], out[1],
		    out[2], out[3], t.n, text, t.n >= sizeof(text) ? "..." : "");
}

/* "role/model-fingerprint", the model cut to its safe characters. */
static void
ns_make_name(struct ns *ns, const char *role)
{
	char	model[41];
	size_t	i;

	for (i = 0; i < sizeof(model) - 1 && ns->layout.model[i] != '\0'; i++) {
		char ch = ns->layout.model[i];

		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		    (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_')
			model[i] = ch;
		else
			model[i] = '_';
	}
	model[i] = '\0';
	snprintf(ns->name, sizeof(ns->name), "%s/%s-", role, model);
	for (i = 0; i < 16; i++)
		snprintf(ns->name + strlen(ns->name), sizeof(ns->name) - strlen(ns->name), "%02x",
		    ns->fingerprint[i]);
}

/*
 * Attaches the namespace to the file tier. The first time in the
 * daemon's life its directory is indexed: the scan runs on the tier's
 * threads, the ATTACH is answered at once, and PROBE and ADMIT see the
 * files as they are found (a file not found yet is a miss, never an
 * error). A namespace the tier knows already (its last session left, its
 * objects stayed indexed) comes back without a scan. -EUSERS when the
 * tier knows limits.max_namespaces namespaces and none can make room:
 * the ATTACH is refused. Any other failure leaves the tier unusable for
 * the namespace (writes fail with -ESRCH and are counted), never the
 * ATTACH.
 */
static int
ns_scan(struct server *s, const struct ns *ns, char *err, size_t errlen)
{
	int	rc;

	if (s->file == NULL)
		return 0;
	err[0] = '\0';
	if ((rc = filetier_scan_start(s->file, ns->name, ns->fingerprint, err, errlen)) == 0)
		return 0;
	if (rc == -EUSERS)
		return rc;	/* the ATTACH's answer says it */
	log_warn("ns", "file tier scan of %s: %s", ns->name, err[0] != '\0' ? err : strerror(-rc));
	err[0] = '\0';
	return 0;
}

/*
 * Finds or creates the namespace of a layout; *out gets a new reference.
 * -EUSERS (err says why) past limits.max_namespaces, -ENOMEM.
 */
int
ns_ref(struct server *s, const struct proto_layout *l, const struct proto_pool *pools,
    struct ns **out, char *err, size_t errlen)
{
	struct ns	*ns;
	uint8_t		 fp[16];
	unsigned	 n = 0;
	int		 rc;

	*out = NULL;
	ns_fingerprint(l, pools, s->cfg->role, s->cfg->namespace_seed, fp);
	TAILQ_FOREACH(ns, &s->namespaces, entry) {
		if (memcmp(ns->fingerprint, fp, sizeof(fp)) == 0) {
			ns->refs++;
			*out = ns;
			return 0;
		}
		n++;
	}
	if (n >= s->cfg->max_namespaces) {
		snprintf(err, errlen, "limits.max_namespaces: %u namespaces are attached; a new "
		    "layout is refused", n);
		return -EUSERS;
	}
	if ((ns = calloc(1, sizeof(*ns))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(ns->fingerprint, fp, sizeof(fp));
	ns->layout = *l;
	memcpy(ns->pools, pools, l->npools * sizeof(*pools));
	ns_make_name(ns, s->cfg->role);
	if ((rc = ns_scan(s, ns, err, errlen)) != 0) {
		free(ns);
		return rc;
	}
	ns->m = metrics_ns_slot(ns);
	ns->refs = 1;
	TAILQ_INSERT_TAIL(&s->namespaces, ns, entry);
	log_info("ns", "namespace %s created", ns->name);
	*out = ns;
	return 0;
}

/*
 * Drops a reference. The namespace entry goes with its last session; the
 * objects stored under its fingerprint stay in their tiers (the file tier
 * keeps them indexed and closes the namespace's directory).
 */
void
ns_unref(struct server *s, struct ns *ns)
{
	if (ns == NULL || --ns->refs > 0)
		return;
	TAILQ_REMOVE(&s->namespaces, ns, entry);
	if (s->file != NULL)
		filetier_ns_detach(s->file, ns->fingerprint);
	log_debug("ns", "namespace %s has no sessions", ns->name);
	free(ns);
}

/* One namespace for LIST: its layout, its sessions, its pools with the objects each tier holds. */
static json_t *
ns_json(struct server *s, const struct ns *ns)
{
	static const char *const kinds[] = { "?", "kv", "state", "sidecar" };
	const struct proto_layout *l = &ns->layout;
	uint64_t		 dram[PROTO_POOLS_MAX], file[PROTO_POOLS_MAX], scanned;
	json_t			*o, *pools, *p;
	char			 fp[33];
	int			 i, has_file, scan;

	for (i = 0; i < 16; i++)
		snprintf(fp + 2 * i, 3, "%02x", ns->fingerprint[i]);
	o = json_pack("{s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s}",
	    "name", ns->name, "model", l->model, "fingerprint", fp,
	    "sessions", (json_int_t)ns->refs, "kv_dtype", l->kv_dtype,
	    "page_tokens", (json_int_t)l->page_tokens, "tp_size", (json_int_t)l->tp_size,
	    "dcp_size", (json_int_t)l->dcp_size, "pp_size", (json_int_t)l->pp_size,
	    "cp_size", (json_int_t)l->cp_size, "pp_rank", (json_int_t)l->pp_rank,
	    "attention", ns_attention_name(l->attention),
	    "host_layout", ns_layout_name(l->host_layout));
	if (o == NULL)
		return NULL;
	if (s->dram != NULL)
		dram_ns_objects(s->dram, ns->fingerprint, dram);
	else
		memset(dram, 0, sizeof(dram));
	has_file = s->file != NULL && filetier_ns_objects(s->file, ns->fingerprint, file) == 0;
	pools = json_array();
	for (i = 0; i < l->npools && i < PROTO_POOLS_MAX; i++) {
		p = json_pack("{s:s, s:s, s:I, s:I, s:I}", "name", ns->pools[i].name,
		    "kind", kinds[ns->pools[i].kind <= PROTO_POOL_SIDECAR ? ns->pools[i].kind : 0],
		    "object_bytes", (json_int_t)ns->pools[i].object_bytes,
		    "layers", (json_int_t)ns->pools[i].layers, "dram_objects", (json_int_t)dram[i]);
		if (p != NULL)
			json_object_set_new(p, "file_objects", has_file ?
			    json_integer((json_int_t)file[i]) : json_null());
		json_array_append_new(pools, p);
	}
	json_object_set_new(o, "pools", pools);
	scan = s->file != NULL ? filetier_scan_state(s->file, ns->fingerprint, &scanned) : -ENOENT;
	json_object_set_new(o, "file_scan", scan < 0 ? json_null() :
	    json_string(scan ? "scanning" : "done"));
	return o;
}

void
ns_list(struct server *s, json_t *array, size_t max, size_t *total)
{
	const struct ns	*ns;

	*total = 0;
	TAILQ_FOREACH(ns, &s->namespaces, entry)
		if ((*total)++ < max)
			json_array_append_new(array, ns_json(s, ns));
}
