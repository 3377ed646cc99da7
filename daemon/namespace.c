/*
 * Namespaces: role + layout fingerprint. Objects of one namespace are
 * never read under another: a layout difference is a miss, never a
 * conversion.
 *
 * The fingerprint is XXH3-128 over a canonical text that names every
 * field that shapes bytes, in a fixed order, plus the role and the
 * daemon's namespace seed. Text rather than the raw struct so that the
 * hash does not depend on padding, and so that a human can read (in debug
 * logs) exactly what was hashed. Namespaces are reference counted by the
 * sessions attached to them and live in the server's list.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
 * The canonical text. Field order and spelling are part of the on-disk
 * and on-wire identity of every object: changing them changes every
 * fingerprint, so it is versioned ("l3kv-ns-v1").
 */
void
ns_canonical(const struct proto_layout *l, const struct proto_pool *pools, const char *role,
    uint64_t seed, char *buf, size_t len)
{
	size_t	n;
	int	i, w;

	w = snprintf(buf, len,
	    "l3kv-ns-v1;role=%s;nsseed=%llu;model=%s;kv_dtype=%s;hash_scheme=%s;hash_len=%u;"
	    "attention=%s;tp=%u;dcp=%u;dcp_rank=%u;pp=%u;pp_rank=%u;cp=%u;page=%u;"
	    "logical_page=%u;host_layout=%s;seed=%llu;pools=%u",
	    role, (unsigned long long)seed, l->model, l->kv_dtype, l->hash_scheme, l->hash_len,
	    ns_attention_name(l->attention), l->tp_size, l->dcp_size, l->dcp_rank, l->pp_size,
	    l->pp_rank, l->cp_size, l->page_tokens, l->logical_page_tokens,
	    ns_layout_name(l->host_layout), (unsigned long long)l->seed, l->npools);
	n = w < 0 ? 0 : (size_t)w;
	for (i = 0; i < l->npools && n < len; i++) {
		w = snprintf(buf + n, len - n,
		    ";pool.%s=kind:%u,hit:%u,trailing:%u,layers:%u,bytes:%llu,schema:%s",
		    pools[i].name, pools[i].kind, pools[i].hit_policy, pools[i].trailing,
		    pools[i].layers, (unsigned long long)pools[i].object_bytes, pools[i].schema);
		n += w < 0 ? 0 : (size_t)w;
	}
}

void
ns_fingerprint(const struct proto_layout *l, const struct proto_pool *pools, const char *role,
    uint64_t seed, uint8_t out[16])
{
	XXH128_canonical_t	c;
	char			text[4096];

	ns_canonical(l, pools, role, seed, text, sizeof(text));
	XXH128_canonicalFromHash(&c, XXH3_128bits(text, strlen(text)));
	memcpy(out, c.digest, 16);
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
