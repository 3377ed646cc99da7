/*
 * Integration tests through libl3kv against a real l3kvd: ATTACH and
 * DETACH with memfd regions, the namespace fingerprint, groups, the DCP
 * guard (refused with nothing changed), bad registrations, engines that
 * vanish, and 200 concurrent clients.
 */
#include <sys/mman.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "l3kv.h"
#include "proto.h"
#include "tests.h"

#define PAGES		16
#define LAYERS		4
#define PAGE_TOKENS	8
#define TOKEN_BYTES	64
#define SLOTS		4
#define SLOT_BYTES	4096

/* Each engine rank (struct test_rank): an MLA page_first KV memfd, then a slot region. */
static const struct test_rank_kv	kv = { "test-model", "latent:576:fp8_e4m3", L3KV_ATTN_MLA,
    PAGES, PAGE_TOKENS, LAYERS, TOKEN_BYTES };

/* The text of a host region refused next to GPU memory. */
#define MIXED	"host (memfd) memory cannot be mixed with GPU memory or CUDA events"

static int
memfd(size_t size, unsigned flags)
{
	int	fd = memfd_create("l3kv-test", MFD_CLOEXEC | flags);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	return fd;
}

/*
 * Rank `rank` of a group of `size` ranks that are all TP 1 (they differ
 * in group_rank alone), namespace seed 7; state slots 0 and 2 are live.
 */
static void
engine_init(struct test_rank *e, const char *group, unsigned size, unsigned rank)
{
	test_rank_init(e, &kv, group, size, rank);
	test_rank_add_state(e, SLOTS, SLOT_BYTES, "conv:4096");
	e->live[1] = 2;
	e->args.nlive = 2;
	e->args.layout.tp_size = 1;
	e->args.tp_rank = 0;
	e->args.layout.seed = 7;
}

static struct l3kv *
client(void)
{
	struct l3kv	*k = NULL;

	ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &k), 0);
	return k;
}

static json_int_t
stat_int(json_t *j, const char *section, const char *key)
{
	json_t	*v = json_object_get(json_object_get(j, section), key);

	ck_assert_msg(json_is_integer(v), "stats %s.%s missing", section, key);
	return json_integer_value(v);
}

/* What an ATTACH may change: namespaces, groups, sessions, mapped memory. */
static char *
state_of_daemon(void)
{
	json_t	*j = test_td_stats(), *keep;
	char	*out;

	keep = json_pack("{s:O, s:O, s:O, s:I}", "namespaces", json_object_get(j, "namespaces"),
	    "groups", json_object_get(j, "groups"), "memory", json_object_get(j, "memory"),
	    "sessions", stat_int(j, "attach", "sessions"));
	out = json_dumps(keep, JSON_SORT_KEYS | JSON_COMPACT);
	json_decref(keep);
	json_decref(j);
	return out;
}

/* The daemon is still as state_of_daemon() said it was (before, which is freed). */
static void
assert_state_is(char *before)
{
	char	*after = state_of_daemon();

	ck_assert_str_eq(before, after);
	free(before);
	free(after);
}

/* STATS with the test's one session attached (n = 1) or none (n = 0). */
static void
assert_sessions(int n)
{
	json_t	*j = test_td_stats();

	ck_assert_int_eq(stat_int(j, "attach", "sessions"), n);
	ck_assert_int_eq(stat_int(j, "memory", "regions_mapped"), 2 * n);
	ck_assert_int_eq(stat_int(j, "memory", "region_bytes_mapped") > 0, n > 0);
	ck_assert_uint_eq(json_array_size(json_object_get(j, "namespaces")), n);
	ck_assert_uint_eq(json_array_size(json_object_get(j, "groups")), n);
	json_decref(j);
}

/* ATTACH of e on k is refused with status (and its errno), with want (unless NULL) in its text. */
static void
assert_refused(struct l3kv *k, const struct test_rank *e, unsigned status, const char *want)
{
	ck_assert_int_eq(l3kv_attach(k, &e->args, NULL), proto_status_errno(status));
	ck_assert_msg(l3kv_last_status(k) == (int)status, "status %s, want %s",
	    proto_status_name((unsigned)l3kv_last_status(k)), proto_status_name(status));
	if (want != NULL)
		ck_assert_msg(strstr(l3kv_last_error(k), want) != NULL, "no \"%s\" in \"%s\"", want,
		    l3kv_last_error(k));
}

START_TEST(test_attach_and_detach_map_and_unmap_memory)
{
	struct l3kv_attach_info	 info;
	struct test_rank	 e;
	struct l3kv		*k = client();
	char			 want[64];

	engine_init(&e, "g-attach", 1, 0);
	ck_assert_int_eq(l3kv_attach(k, &e.args, &info), 0);
	ck_assert_uint_gt(info.session, 0);
	ck_assert_uint_eq(info.group_members, 1);
	ck_assert_uint_eq(info.lease_ttl_ms, 30000);
	snprintf(want, sizeof(want), "decode/test-model-%02x%02x", info.fingerprint[0],
	    info.fingerprint[1]);
	ck_assert_msg(strncmp(info.ns, want, strlen(want)) == 0, "ns %s", info.ns);
	ck_assert_uint_eq(strlen(info.ns), strlen("decode/test-model-") + 32);
	assert_sessions(1);
	ck_assert_int_eq(l3kv_detach(k), 0);
	assert_sessions(0);

	/* Detach twice: a state error, and the connection still works. */
	ck_assert_int_lt(l3kv_detach(k), 0);
	ck_assert_int_eq(l3kv_last_status(k), PROTO_S_STATE);
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	assert_refused(k, &e, PROTO_S_STATE, NULL);
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

START_TEST(test_dcp_guard_refuses_best_effort_with_nothing_changed)
{
	struct test_rank	 e;
	struct l3kv		*k = client(), *other = client();
	char			*before;

	engine_init(&e, "g-other", 1, 0);
	ck_assert_int_eq(l3kv_attach(other, &e.args, NULL), 0);
	test_rank_fini(&e);

	engine_init(&e, "g-dcp", 2, 0);
	e.args.layout.dcp_size = 2;
	e.args.prefetch = L3KV_PREFETCH_BEST_EFFORT;
	before = state_of_daemon();
	assert_refused(k, &e, PROTO_S_GUARD, "wait_complete");
	assert_state_is(before);
	ck_assert_int_eq(test_td_stat("attach", "guards_refused"), 1);

	/* The same rank with wait_complete is accepted: the refusal left nothing behind. */
	e.args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	l3kv_close(k);
	l3kv_close(other);
	test_rank_fini(&e);
}
END_TEST

START_TEST(test_dcp_guard_refuses_offload_and_non_mla)
{
	struct test_rank	 e;
	struct l3kv		*k = client();

	engine_init(&e, "g-dcp", 2, 1);
	e.args.layout.dcp_size = 2;
	e.args.layout.dcp_rank = 1;
	e.args.write = L3KV_WRITE_OFFLOAD;
	assert_refused(k, &e, PROTO_S_GUARD, "offload");
	e.args.write = L3KV_WRITE_THROUGH;
	e.args.layout.attention = L3KV_ATTN_MHA;
	assert_refused(k, &e, PROTO_S_GUARD, "MLA");
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

static void
fingerprint_of(const struct test_rank *e, uint8_t out[16])
{
	struct l3kv_attach_info	 info;
	struct l3kv		*k = client();

	ck_assert_int_eq(l3kv_attach(k, &e->args, &info), 0);
	memcpy(out, info.fingerprint, 16);
	l3kv_close(k);
}

START_TEST(test_fingerprint_is_stable_and_changes_with_the_layout)
{
	struct test_rank	e;
	uint8_t			a[16], b[16], c[16];

	engine_init(&e, "g-fp", 1, 0);
	fingerprint_of(&e, a);
	usleep(50000);	/* the first session's close reaches the daemon */
	fingerprint_of(&e, b);
	ck_assert_mem_eq(a, b, 16);
	usleep(50000);
	e.args.layout.kv_dtype = "fp8_e5m2";
	fingerprint_of(&e, c);
	ck_assert(memcmp(a, c, 16) != 0);
	usleep(50000);
	e.args.layout.kv_dtype = "fp8_e4m3";
	e.args.layout.hash_scheme = "xxh64";
	e.args.layout.hash_len = 8;
	fingerprint_of(&e, c);
	ck_assert(memcmp(a, c, 16) != 0);
	test_rank_fini(&e);
}
END_TEST

/*
 * Issue 11 item 1: the fingerprint's canonical text is injective. v1
 * pasted strings between ';', '=', ',' and ':', so two layouts that
 * moved a separator-laden piece from one string into the next shared a
 * namespace. The layouts here are random, their strings drawn mostly from
 * separators; each is compared with copies that differ in exactly one
 * field, and with copies whose adjacent strings trade characters.
 */
struct fp_case {
	struct proto_layout	l;
	struct proto_pool	pools[PROTO_POOLS_MAX];
	char			role[32];
	uint64_t		nsseed;
};

/* A random printable string of [min, cap - 1] characters, most of them separators. */
static void
fp_rand_str(char *s, size_t cap, size_t min)
{
	static const char	sep[] = ";=,:.{}[]()\"\\/| 0123456789-_";
	size_t			n = min + (size_t)random() % (cap - min), i;

	memset(s, 0, cap);
	for (i = 0; i < n; i++)
		s[i] = random() % 3 != 0 ? sep[random() % (sizeof(sep) - 1)] :
		    (char)(0x20 + random() % 95);
}

static uint64_t
fp_rand_num(void)
{
	switch (random() % 4) {
	case 0:		return (uint64_t)random() % 4;
	case 1:		return (uint64_t)random() % 65536;
	case 2:		return UINT64_MAX - (uint64_t)random() % 4;
	}
	return ((uint64_t)random() << 33) ^ (uint64_t)random();
}

static void
fp_rand_case(struct fp_case *c)
{
	struct proto_layout	*l = &c->l;
	int			 i;

	memset(c, 0, sizeof(*c));
	fp_rand_str(l->model, sizeof(l->model), 1);
	fp_rand_str(l->kv_dtype, sizeof(l->kv_dtype), 1);
	fp_rand_str(l->hash_scheme, sizeof(l->hash_scheme), 1);
	fp_rand_str(c->role, sizeof(c->role), 1);
	c->nsseed = fp_rand_num();
	l->tp_size = (uint16_t)fp_rand_num();
	l->dcp_size = (uint16_t)fp_rand_num();
	l->pp_size = (uint16_t)fp_rand_num();
	l->cp_size = (uint16_t)fp_rand_num();
	l->dcp_rank = (uint16_t)fp_rand_num();
	l->pp_rank = (uint16_t)fp_rand_num();
	l->host_layout = (uint8_t)(1 + random() % 3);
	l->attention = (uint8_t)(1 + random() % 3);
	l->hash_len = (uint8_t)(1 + random() % 32);
	l->npools = (uint8_t)(1 + random() % PROTO_POOLS_MAX);
	l->page_tokens = (uint32_t)fp_rand_num();
	l->logical_page_tokens = (uint32_t)fp_rand_num();
	l->seed = fp_rand_num();
	for (i = 0; i < PROTO_POOLS_MAX; i++) {
		struct proto_pool	*p = &c->pools[i];

		fp_rand_str(p->name, sizeof(p->name), 1);
		p->kind = (uint8_t)(1 + random() % 3);
		p->hit_policy = (uint8_t)(1 + random() % 2);
		p->trailing = (uint16_t)fp_rand_num();
		p->layers = (uint32_t)fp_rand_num();
		p->object_bytes = fp_rand_num();
		fp_rand_str(p->schema, sizeof(p->schema), 0);
	}
}

/* The case's string fields in text order, with their capacities. */
static unsigned
fp_strings(struct fp_case *c, char **str, size_t *cap)
{
	unsigned	n = 0;
	int		i;

#define FP_STR(f)	do { str[n] = (f); cap[n] = sizeof(f); n++; } while (0)
	FP_STR(c->role);
	FP_STR(c->l.model);
	FP_STR(c->l.kv_dtype);
	FP_STR(c->l.hash_scheme);
	for (i = 0; i < c->l.npools; i++) {
		FP_STR(c->pools[i].name);
		FP_STR(c->pools[i].schema);
	}
#undef FP_STR
	return n;
}

/* Changes field f (of FP_FIELDS) of c to another value; 0 if it could not. */
#define FP_FIELDS	30
static int
fp_mutate(struct fp_case *c, unsigned f)
{
	struct proto_layout	*l = &c->l;
	struct proto_pool	*p = &c->pools[random() % l->npools];
	char			*str[4 + 2 * PROTO_POOLS_MAX], tmp[PROTO_MODEL_LEN];
	size_t			 cap[4 + 2 * PROTO_POOLS_MAX], len;
	unsigned		 n, a, k;

	switch (f) {
	case 0:		fp_rand_str(l->model, sizeof(l->model), 1); break;
	case 1:		fp_rand_str(l->kv_dtype, sizeof(l->kv_dtype), 1); break;
	case 2:		fp_rand_str(l->hash_scheme, sizeof(l->hash_scheme), 1); break;
	case 3:		fp_rand_str(c->role, sizeof(c->role), 1); break;
	case 4:		c->nsseed ^= 1ULL << (random() % 64); break;
	case 5:		l->tp_size ^= (uint16_t)(1 + random() % 0xffff); break;
	case 6:		l->dcp_size ^= (uint16_t)(1 + random() % 0xffff); break;
	case 7:		l->pp_size ^= (uint16_t)(1 + random() % 0xffff); break;
	case 8:		l->cp_size ^= (uint16_t)(1 + random() % 0xffff); break;
	case 9:		l->dcp_rank ^= (uint16_t)(1 + random() % 0xffff); break;
	case 10:	l->pp_rank ^= (uint16_t)(1 + random() % 0xffff); break;
	case 11:	l->host_layout = (uint8_t)(1 + (l->host_layout + random() % 2) % 3); break;
	case 12:	l->attention = (uint8_t)(1 + (l->attention + random() % 2) % 3); break;
	case 13:	l->hash_len = (uint8_t)(1 + (l->hash_len + random() % 31) % 32); break;
	case 14:
		if (l->npools == 1)
			l->npools++;
		else
			l->npools--;
		break;
	case 15:	l->page_tokens ^= 1U << (random() % 32); break;
	case 16:	l->logical_page_tokens ^= 1U << (random() % 32); break;
	case 17:	l->seed ^= 1ULL << (random() % 64); break;
	case 18:	fp_rand_str(p->name, sizeof(p->name), 1); break;
	case 19:	p->kind = (uint8_t)(1 + p->kind % 3); break;
	case 20:	p->hit_policy = (uint8_t)(1 + p->hit_policy % 2); break;
	case 21:	p->trailing ^= (uint16_t)(1 + random() % 0xffff); break;
	case 22:	p->layers ^= 1U << (random() % 32); break;
	case 23:	p->object_bytes ^= 1ULL << (random() % 64); break;
	case 24:	fp_rand_str(p->schema, sizeof(p->schema), 0); break;
	default:
		/*
		 * 25..29: the attack. The tail of one string moves to the head of
		 * the next one in text order (or back), as model "fpc;kv_dtype=x"
		 * + kv_dtype "y" against "fpc" + "x;kv_dtype=y".
		 */
		n = fp_strings(c, str, cap);
		a = (unsigned)random() % (n - 1);
		if (random() % 2) {
			len = strlen(str[a]);
			k = 1 + (unsigned)random() % 4;
			if (k >= len || strlen(str[a + 1]) + k >= cap[a + 1])
				return 0;
			snprintf(tmp, sizeof(tmp), "%s%s", str[a] + len - k, str[a + 1]);
			memcpy(str[a + 1], tmp, strlen(tmp) + 1);
			str[a][len - k] = '\0';
		} else {
			len = strlen(str[a + 1]);
			k = 1 + (unsigned)random() % 4;
			if (k >= len || strlen(str[a]) + k >= cap[a])
				return 0;
			strncat(str[a], str[a + 1], k);
			memmove(str[a + 1], str[a + 1] + k, len - k + 1);
		}
		break;
	}
	return 1;
}

static void
fp_of(const struct fp_case *c, uint8_t fp[16], char *text, size_t len)
{
	ns_fingerprint(&c->l, c->pools, c->role, c->nsseed, fp);
	ck_assert_uint_lt(ns_canonical(&c->l, c->pools, c->role, c->nsseed, text, len), len);
}

START_TEST(test_fingerprint_never_shared_by_layouts_differing_in_one_field)
{
	static struct fp_case	a, b;
	static char		ta[NS_TEXT_MAX], tb[NS_TEXT_MAX];
	uint8_t			fa[16], fb[16];
	unsigned		iter, f, compared = 0;

	srandom(11);
	for (iter = 0; iter < 400; iter++) {
		fp_rand_case(&a);
		fp_of(&a, fa, ta, sizeof(ta));
		for (f = 0; f < FP_FIELDS; f++) {
			b = a;
			if (!fp_mutate(&b, f) || memcmp(&a, &b, sizeof(a)) == 0)
				continue;
			fp_of(&b, fb, tb, sizeof(tb));
			ck_assert_msg(strcmp(ta, tb) != 0, "field %u: one text for two layouts: %s",
			    f, ta);
			ck_assert_msg(memcmp(fa, fb, 16) != 0, "field %u: one fingerprint: %s / %s",
			    f, ta, tb);
			compared++;
		}
	}
	ck_assert_uint_gt(compared, 400 * 20);

	/*
	 * The splice itself, on random layouts: string s gains ";<key of
	 * the next string>=" and a piece w, against the next string starting
	 * with that piece and that key (v1's texts were equal).
	 */
	for (iter = 0; iter < 2000; iter++) {
		static const char	*key[] = { "model", "kv_dtype", "hash_scheme" };
		char			*sa[4 + 2 * PROTO_POOLS_MAX], *sb[4 + 2 * PROTO_POOLS_MAX];
		char			 w[8];
		size_t			 cap[4 + 2 * PROTO_POOLS_MAX];
		unsigned		 i;

		fp_rand_case(&a);
		i = 1 + (unsigned)random() % 2;		/* model | kv_dtype, kv_dtype | hash_scheme */
		fp_rand_str(w, i == 1 ? 4 : 2, 1);	/* what fits in 15 bytes */
		fp_strings(&a, sa, cap);
		sa[i][i == 1 ? random() % 3 : 1] = '\0';
		sa[i + 1][i == 1 ? 1 + random() % 2 : 1] = '\0';
		b = a;
		fp_strings(&b, sb, cap);
		snprintf(sa[i] + strlen(sa[i]), cap[i] - strlen(sa[i]), ";%s=%s", key[i], w);
		snprintf(tb, sizeof(tb), "%s;%s=%s", w, key[i], sb[i + 1]);
		snprintf(sb[i + 1], cap[i + 1], "%s", tb);
		fp_of(&a, fa, ta, sizeof(ta));
		fp_of(&b, fb, tb, sizeof(tb));
		ck_assert_uint_lt(strlen(sa[i]), cap[i]);
		ck_assert_msg(memcmp(fa, fb, 16) != 0, "one fingerprint: %s / %s", ta, tb);
	}
}
END_TEST

/* Issue 11 item 1's two layouts, and the longest text there can be. */
START_TEST(test_fingerprint_text_is_length_prefixed_and_bounded)
{
	static struct fp_case	a, b;
	static char		ta[NS_TEXT_MAX], tb[NS_TEXT_MAX];
	uint8_t			fa[16], fb[16];
	int			i;

	memset(&a, 0, sizeof(a));
	snprintf(a.role, sizeof(a.role), "decode");
	snprintf(a.l.model, sizeof(a.l.model), "fpc;kv_dtype=x");
	snprintf(a.l.kv_dtype, sizeof(a.l.kv_dtype), "y");
	snprintf(a.l.hash_scheme, sizeof(a.l.hash_scheme), "sha256");
	a.l.npools = 1;
	snprintf(a.pools[0].name, sizeof(a.pools[0].name), "kv");
	b = a;
	snprintf(b.l.model, sizeof(b.l.model), "fpc");
	snprintf(b.l.kv_dtype, sizeof(b.l.kv_dtype), "x;kv_dtype=y");
	fp_of(&a, fa, ta, sizeof(ta));
	fp_of(&b, fb, tb, sizeof(tb));
	ck_assert(memcmp(fa, fb, 16) != 0);
	ck_assert_ptr_nonnull(strstr(ta, "l3kv-ns-v2;role=6:decode;"));
	ck_assert_ptr_nonnull(strstr(ta, ";model=14:fpc;kv_dtype=x;kv_dtype=1:y;hash_scheme=6:sha256;"));
	ck_assert_ptr_nonnull(strstr(tb, ";model=3:fpc;kv_dtype=12:x;kv_dtype=y;hash_scheme=6:sha256;"));

	/* Every field at its longest: the debug text holds it whole. */
	memset(&a, 0, sizeof(a));
	memset(a.role, '=', sizeof(a.role) - 1);
	memset(a.l.model, ';', sizeof(a.l.model) - 1);
	memset(a.l.kv_dtype, ':', sizeof(a.l.kv_dtype) - 1);
	memset(a.l.hash_scheme, ',', sizeof(a.l.hash_scheme) - 1);
	a.nsseed = a.l.seed = UINT64_MAX;
	a.l.tp_size = a.l.dcp_size = a.l.pp_size = a.l.cp_size = UINT16_MAX;
	a.l.dcp_rank = a.l.pp_rank = UINT16_MAX;
	a.l.hash_len = UINT8_MAX;
	a.l.npools = PROTO_POOLS_MAX;
	a.l.page_tokens = a.l.logical_page_tokens = UINT32_MAX;
	a.l.host_layout = PROTO_LAYOUT_PAGE_FIRST_DIRECT;
	a.l.attention = PROTO_ATTN_MLA;
	for (i = 0; i < PROTO_POOLS_MAX; i++) {
		memset(a.pools[i].name, ';', sizeof(a.pools[i].name) - 1);
		memset(a.pools[i].schema, ';', sizeof(a.pools[i].schema) - 1);
		a.pools[i].kind = a.pools[i].hit_policy = UINT8_MAX;
		a.pools[i].trailing = UINT16_MAX;
		a.pools[i].layers = UINT32_MAX;
		a.pools[i].object_bytes = UINT64_MAX;
	}
	ck_assert_uint_lt(ns_canonical(&a.l, a.pools, a.role, a.nsseed, NULL, 0), NS_TEXT_MAX);
	/* A short buffer cuts the text, NUL-terminated, and still says its length. */
	ck_assert_uint_eq(ns_canonical(&a.l, a.pools, a.role, a.nsseed, ta, 11),
	    ns_canonical(&a.l, a.pools, a.role, a.nsseed, NULL, 0));
	ck_assert_str_eq(ta, "l3kv-ns-v2");
}
END_TEST

/*
 * One rank of layout (model, kv_dtype, hash_scheme) publishes pages of
 * `prefix`; a rank of the other layout sees a miss, is declined, and its
 * destination pages stay as they were.
 */
static void
fp_separate(const char *ma, const char *ka, const char *ha, const char *mb, const char *kb,
    const char *hb, uint32_t prefix)
{
	struct l3kv_attach_info		 ia, ib;
	struct l3kv_admit_result	 ad;
	struct l3kv_publish_result	 pr;
	struct test_rank		 a, b;

	test_rank_init(&a, &kv, "g-fp-a", 1, 0);
	a.args.layout.model = ma;
	a.args.layout.kv_dtype = ka;
	a.args.layout.hash_scheme = ha;
	test_rank_init(&b, &kv, "g-fp-b", 1, 0);
	b.args.layout.model = mb;
	b.args.layout.kv_dtype = kb;
	b.args.layout.hash_scheme = hb;
	ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &a.k), 0);
	ck_assert_msg(l3kv_attach(a.k, &a.args, &ia) == 0, "%s", l3kv_last_error(a.k));
	ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &b.k), 0);
	ck_assert_msg(l3kv_attach(b.k, &b.args, &ib) == 0, "%s", l3kv_last_error(b.k));
	ck_assert(memcmp(ia.fingerprint, ib.fingerprint, 16) != 0);
	ck_assert_str_ne(ia.ns, ib.ns);

	test_rank_publish_kv(&a, prefix, 0, 4, 0, &pr);
	ck_assert_uint_eq(pr.stored, 4);
	ck_assert_uint_eq(test_rank_probe(&a, prefix, 4, NULL, NULL), 4);
	test_rank_sentinel(&b, TEST_RANK_KV, 0, PAGES);
	ck_assert_uint_eq(test_rank_probe(&b, prefix, 4, NULL, NULL), 0);
	ad = test_rank_admit(&b, 1, prefix, 4, 4, L3KV_SLOT_NONE);
	ck_assert_uint_eq(ad.admitted_pages, 0);
	ck_assert_int_eq(ad.decline, L3KV_DECLINE_NO_HIT);
	ck_assert_uint_eq(ad.lease, 0);
	ck_assert(test_rank_is_sentinel(&b, TEST_RANK_KV, 0, PAGES));
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	ck_assert_int_eq(test_td_stat("cache", "leases_open"), 0);
	test_rank_fini(&b);
	test_rank_fini(&a);
}

/*
 * Issue 11 item 1, through the daemon: v1's canonical text gave each pair
 * one namespace, and B restored A's bytes. The second pair works under a
 * configured model too, which pins the model but not the strings after it.
 */
START_TEST(test_separator_laden_layouts_get_their_own_namespaces)
{
	fp_separate("fpc;kv_dtype=x", "y", "sha256", "fpc", "x;kv_dtype=y", "sha256", 41);
	test_td_restart("{\"model\": \"fpc\"}");
	fp_separate("fpc", "x;hash_scheme=y", "z", "fpc", "x", "y;hash_scheme=z", 42);
}
END_TEST

START_TEST(test_group_ranks_must_agree)
{
	struct l3kv_attach_info	 info;
	struct test_rank	 e0, e1;
	struct l3kv		*k0 = client(), *k1 = client(), *k2 = client();

	engine_init(&e0, "g-pair", 2, 0);
	engine_init(&e1, "g-pair", 2, 1);
	ck_assert_int_eq(l3kv_attach(k0, &e0.args, &info), 0);
	ck_assert_uint_eq(info.group_members, 1);
	/* The same rank twice. */
	assert_refused(k1, &e0, PROTO_S_GROUP_MISMATCH, NULL);
	/* Another size. */
	e1.args.group_size = 3;
	assert_refused(k1, &e1, PROTO_S_GROUP_MISMATCH, NULL);
	/* Another policy. */
	e1.args.group_size = 2;
	e1.args.write = L3KV_WRITE_BACK;
	assert_refused(k1, &e1, PROTO_S_GROUP_MISMATCH, NULL);
	e1.args.write = L3KV_WRITE_THROUGH;
	ck_assert_int_eq(l3kv_attach(k1, &e1.args, &info), 0);
	ck_assert_uint_eq(info.group_members, 2);
	/* A rank that leaves frees its place. */
	l3kv_close(k0);
	usleep(100000);
	ck_assert_int_eq(l3kv_attach(k2, &e0.args, &info), 0);
	ck_assert_uint_eq(info.group_members, 2);
	l3kv_close(k1);
	l3kv_close(k2);
	test_rank_fini(&e0);
	test_rank_fini(&e1);
}
END_TEST

START_TEST(test_bad_registrations_are_refused_with_nothing_mapped)
{
	struct test_rank	 e;
	struct l3kv		*k = client();
	char			*before, path[64];
	int			 plain, ro;

	engine_init(&e, "g-bad", 1, 0);
	before = state_of_daemon();

	/* Memory smaller than the geometry. */
	ck_assert_int_eq(ftruncate(e.fd[TEST_RANK_KV], 4096), 0);
	assert_refused(k, &e, PROTO_S_BAD_REGION, "regions[0]");
	ck_assert_int_eq(ftruncate(e.fd[TEST_RANK_KV], (off_t)e.regions[0].size), 0);

	/*
	 * Memory smaller than the geometry in a memfd that cannot be sealed
	 * (accepted unsealed since issue 13, as SGLang makes them): the size is
	 * checked all the same.
	 */
	plain = memfd(e.regions[1].size / 2, 0);
	e.regions[1].fd = plain;
	assert_refused(k, &e, PROTO_S_BAD_REGION, "past the memfd");
	close(plain);

	/* A read-only fd. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", e.fd[TEST_RANK_STATE]);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(ro, 0);
	e.regions[1].fd = ro;
	assert_refused(k, &e, PROTO_S_BAD_REGION, NULL);
	close(ro);
	e.regions[1].fd = e.fd[TEST_RANK_STATE];

	/* A live slot outside the slot region, and one listed twice. */
	e.live[1] = SLOTS;
	assert_refused(k, &e, PROTO_S_BAD_REGION, NULL);
	e.live[1] = 0;
	assert_refused(k, &e, PROTO_S_BAD_REGION, "twice");
	e.live[1] = 2;

	/* Geometry that overflows: refused by the protocol check. */
	e.regions[0].page_stride = UINT64_MAX / 2;
	assert_refused(k, &e, PROTO_S_INVALID, NULL);
	e.regions[0].page_stride = (uint64_t)PAGE_TOKENS * LAYERS * TOKEN_BYTES;

	assert_state_is(before);
	/* And the corrected registration is accepted on the same connection. */
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

/*
 * Issue 11 item 2: a slot region whose stride is under a slot (0
 * included) let a RESTORE into canonical slot 1 overwrite live slot 0.
 * ATTACH refuses it, and any other region reaching into the slot
 * region's bytes in the same memfd (through the same fd or another fd of
 * the same file), with nothing mapped; the honest geometry is accepted.
 */
START_TEST(test_aliasing_slot_geometry_is_refused_at_attach)
{
	struct test_rank	 e;
	struct l3kv		*k = client();
	char			*before;
	size_t			 kvlen;
	int			 one, dup1;

	engine_init(&e, "g-alias", 1, 0);
	before = state_of_daemon();
	e.regions[1].page_stride = 0;
	assert_refused(k, &e, PROTO_S_INVALID, NULL);
	ck_assert_str_eq(l3kv_last_error(k), "regions[1]: page_stride 0 is under the 4096 bytes one "
	    "slot spans, so two slots would overlap");
	e.regions[1].page_stride = SLOT_BYTES / 2;
	assert_refused(k, &e, PROTO_S_INVALID, "regions[1]: page_stride 2048 is under the 4096 "
	    "bytes one slot spans, so two slots would overlap");
	e.regions[1].page_stride = SLOT_BYTES;
	/* KV pages whose layers sit on one another. */
	e.regions[0].layer_stride = 0;
	assert_refused(k, &e, PROTO_S_INVALID, "regions[0]: layer_stride 0 is under");
	e.regions[0].layer_stride = TOKEN_BYTES;

	/* One memfd for both: the KV pages' last page is slot 0. */
	kvlen = e.regions[0].size;
	one = memfd(kvlen + SLOTS * SLOT_BYTES, MFD_ALLOW_SEALING);
	e.regions[0].fd = one;
	e.regions[1].fd = one;
	e.regions[1].offset = kvlen - SLOT_BYTES;
	assert_refused(k, &e, PROTO_S_BAD_REGION, NULL);
	ck_assert_str_eq(l3kv_last_error(k), "regions[0]: bytes [0, 32768) overlap the state slots "
	    "of regions[1] at [28672, 45056) in the same memory");
	/* The same file through a second fd. */
	dup1 = dup(one);
	ck_assert_int_ge(dup1, 0);
	e.regions[1].fd = dup1;
	assert_refused(k, &e, PROTO_S_BAD_REGION, "overlap the state slots");
	assert_state_is(before);
	/* Side by side in one memfd is fine. */
	e.regions[1].offset = kvlen;
	ck_assert_msg(l3kv_attach(k, &e.args, NULL) == 0, "%s", l3kv_last_error(k));
	l3kv_close(k);
	close(dup1);
	close(one);
	test_rank_fini(&e);
}
END_TEST

/*
 * GPU memory (CUDA IPC handles, cuMem fds) needs the cuda copy engine: a
 * daemon without a GPU refuses it as a bad region, saying so, with
 * nothing mapped; and no session mixes host and GPU memory.
 */
START_TEST(test_gpu_memory_is_refused_cleanly_without_a_gpu)
{
	struct l3kv_server_info	 si;
	struct test_rank	 e;
	struct l3kv		*k = client();
	char			*before;
	int			 gpu;

	engine_init(&e, "g-gpu", 1, 0);
	ck_assert_int_eq(l3kv_server_info(k, &si), 0);
	gpu = (si.caps & L3KV_CAP_CUDA_COPY) != 0;
	before = state_of_daemon();

	e.regions[0].kind = L3KV_MEM_CUDA_IPC;
	e.regions[1].kind = L3KV_MEM_CUDA_IPC;
	memset(e.regions[0].handle, 0x5a, sizeof(e.regions[0].handle));
	memset(e.regions[1].handle, 0xa5, sizeof(e.regions[1].handle));
	assert_refused(k, &e, PROTO_S_BAD_REGION, gpu ? "regions[0]" : "regions[0]: cuda_ipc memory "
	    "needs the cuda copy engine, and this daemon has none (no GPU)");

	/* A cuMem fd (here a memfd: no GPU could import it either). */
	e.regions[0].kind = L3KV_MEM_CUMEM_FD;
	e.regions[1].kind = L3KV_MEM_CUMEM_FD;
	assert_refused(k, &e, PROTO_S_BAD_REGION, gpu ? NULL :
	    "regions[0]: cumem_fd memory needs the cuda copy engine");

	/* Host and GPU memory in one session. */
	e.regions[0].kind = L3KV_MEM_MEMFD;
	e.regions[1].kind = L3KV_MEM_CUDA_IPC;
	assert_refused(k, &e, PROTO_S_BAD_REGION, "regions[1]: " MIXED);

	/* A CUDA IPC event: not with host memory, and not without a GPU. */
	e.regions[1] = (struct l3kv_region){ .kind = L3KV_MEM_CUDA_EVENT, .fd = -1 };
	e.args.nlive = 0;	/* no slot region any more */
	memset(e.regions[1].handle, 0x77, sizeof(e.regions[1].handle));
	assert_refused(k, &e, PROTO_S_BAD_REGION, "regions[1]: " MIXED);
	e.regions[0].kind = L3KV_MEM_CUDA_IPC;
	assert_refused(k, &e, PROTO_S_BAD_REGION, gpu ? NULL :
	    "regions[0]: cuda_ipc memory needs the cuda copy engine");
	e.regions[0] = e.regions[1];
	e.args.nregions = 1;
	assert_refused(k, &e, PROTO_S_BAD_REGION, gpu ? NULL :
	    "regions[0]: a CUDA IPC event needs the cuda copy engine, and this daemon has none");
	test_rank_fini(&e);
	engine_init(&e, "g-gpu", 1, 0);

	assert_state_is(before);
	/* The memfd registration is accepted on the same connection. */
	e.regions[1].kind = L3KV_MEM_MEMFD;
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

START_TEST(test_configured_model_refuses_other_models)
{
	struct test_rank	 e;
	struct l3kv		*k;

	test_td_restart("{\"model\": \"kimi-linear\"}");
	k = client();
	engine_init(&e, "g-model", 1, 0);
	assert_refused(k, &e, PROTO_S_INVALID, "kimi-linear");
	e.args.layout.model = "kimi-linear";
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

/* An engine killed without DETACH: its session and mappings go. */
START_TEST(test_killed_engine_releases_its_session)
{
	struct test_rank	 e;
	struct l3kv		*k;
	pid_t			 pid;
	int			 st;

	engine_init(&e, "g-kill", 1, 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (l3kv_connect(test_td.sock, 5000, &k) != 0 || l3kv_attach(k, &e.args, NULL) != 0)
			_exit(1);
		pause();
		_exit(0);
	}
	ck_assert_int_eq(test_td_stat_wait("attach", "sessions", 1), 1);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	ck_assert_int_eq(test_td_stat_wait("memory", "regions_mapped", 0), 0);
	test_rank_fini(&e);
}
END_TEST

#define CLIENTS	200

/* 200 connections at once, each asking HEALTH without blocking. */
START_TEST(test_200_concurrent_clients_are_served)
{
	struct l3kv_completion	 comp;
	struct l3kv		*k[CLIENTS];
	struct pollfd		 pfd[CLIENTS];
	uint64_t		 ticket[CLIENTS];
	int			 done[CLIENTS] = { 0 }, ndone = 0, i, rc;

	for (i = 0; i < CLIENTS; i++) {
		ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &k[i]), 0);
		ck_assert_int_eq(l3kv_submit_health(k[i], &ticket[i]), 0);
	}
	while (ndone < CLIENTS) {
		for (i = 0; i < CLIENTS; i++) {
			pfd[i].fd = done[i] ? -1 : l3kv_fd(k[i]);
			pfd[i].events = POLLIN;
		}
		ck_assert_int_gt(poll(pfd, CLIENTS, 5000), 0);
		for (i = 0; i < CLIENTS; i++) {
			if (done[i] || !(pfd[i].revents & POLLIN))
				continue;
			rc = l3kv_poll_completion(k[i], &comp);
			if (rc == -EAGAIN)
				continue;
			ck_assert_int_eq(rc, 0);
			ck_assert_uint_eq(comp.ticket, ticket[i]);
			ck_assert_int_eq(comp.status, 0);
			ck_assert_ptr_nonnull(strstr(comp.payload, "\"status\":\"ok\""));
			l3kv_completion_release(&comp);
			done[i] = 1;
			ndone++;
		}
	}
	for (i = 0; i < CLIENTS; i++)
		l3kv_close(k[i]);
}
END_TEST

Suite *
suite_attach(void)
{
	Suite	*s = suite_create("attach");
	TCase	*tc = test_tcase(s, "attach", 30, test_td_setup, test_td_teardown);

	tcase_add_test(tc, test_attach_and_detach_map_and_unmap_memory);
	tcase_add_test(tc, test_dcp_guard_refuses_best_effort_with_nothing_changed);
	tcase_add_test(tc, test_dcp_guard_refuses_offload_and_non_mla);
	tcase_add_test(tc, test_fingerprint_is_stable_and_changes_with_the_layout);
	tcase_add_test(tc, test_group_ranks_must_agree);
	tcase_add_test(tc, test_fingerprint_never_shared_by_layouts_differing_in_one_field);
	tcase_add_test(tc, test_fingerprint_text_is_length_prefixed_and_bounded);
	tcase_add_test(tc, test_separator_laden_layouts_get_their_own_namespaces);
	tcase_add_test(tc, test_bad_registrations_are_refused_with_nothing_mapped);
	tcase_add_test(tc, test_aliasing_slot_geometry_is_refused_at_attach);
	tcase_add_test(tc, test_gpu_memory_is_refused_cleanly_without_a_gpu);
	tcase_add_test(tc, test_configured_model_refuses_other_models);
	tcase_add_test(tc, test_killed_engine_releases_its_session);
	tcase_add_test(tc, test_200_concurrent_clients_are_served);
	return s;
}
