/*
 * Hybrid models and DCP against a real l3kvd (docs/contract.md, items
 * 1, 3, 4, 6, 8, 9): legal stop points across ranks and pools, canonical
 * and live state slots, all-or-nothing checkpoints, one writer per DCP
 * shard, SET_POLICY and its guards, and layout identity.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "l3kv.h"
#include "proto.h"
#include "tests.h"

#define PAGES		16
#define LAYERS		2
#define TOKEN_BYTES	64
#define SLOTS		4
#define SLOT_BYTES	512
#define SIDE_BYTES	32	/* per token, one layer */
#define R_KV		TEST_RANK_KV
#define R_STATE		TEST_RANK_STATE
#define R_SIDE		TEST_RANK_SIDE

enum side { SIDE_NONE, SIDE_ALL, SIDE_TRAILING };

/* The KV pages of each engine rank (struct test_rank); a state region and maybe a sidecar follow. */
static const struct test_rank_kv	kv = { "kimi-linear-test", "latent:64:fp8_e4m3", L3KV_ATTN_MHA,
    PAGES, 8, LAYERS, TOKEN_BYTES };

static void
setup(void)
{
	test_td_setup_with("{\"testing\": {\"debug_ops\": true}}");
}

static void
teardown(void)
{
	ck_assert_int_eq(test_td_stat_wait("dram", "pins", 0), 0);
	ck_assert_int_eq(test_td_stat("cache", "leases_open"), 0);
	test_td_teardown();
}

static uint64_t
kv_page_bytes(const struct test_rank *h)
{
	return (uint64_t)h->regions[R_KV].page_tokens * LAYERS * TOKEN_BYTES;
}

/*
 * A rank of group `group` (size ranks); with a state pool, and a sidecar
 * of the given policy. Slot 0 is live.
 */
static void
hrank_init(struct test_rank *h, const char *group, unsigned size, unsigned idx, enum side side,
    unsigned trailing)
{
	test_rank_init(h, &kv, group, size, idx);
	test_rank_add_state(h, SLOTS, SLOT_BYTES, "conv:512");
	if (side != SIDE_NONE)
		test_rank_add_sidecar(h, side == SIDE_ALL ? L3KV_HIT_ALL_PAGES : L3KV_HIT_TRAILING,
		    trailing, 8, SIDE_BYTES, "swa:32");
}

static void
hrank_attach(struct test_rank *h)
{
	test_rank_attach(h, test_td.sock);
}

/*
 * Rank idx of an MLA group of TP tp x DCP dcp ranks (tp_rank idx % tp,
 * dcp_rank idx / tp) with the KV pool alone.
 */
static void
dcp_rank_init(struct test_rank *h, const char *group, unsigned tp, unsigned dcp, unsigned idx)
{
	test_rank_init(h, &kv, group, tp * dcp, idx);
	h->args.layout.attention = L3KV_ATTN_MLA;
	h->args.layout.tp_size = tp;
	h->args.tp_rank = idx % tp;
	h->args.layout.dcp_size = dcp;
	h->args.layout.dcp_rank = idx / tp;
}

/* Deterministic bytes for (what, prefix, i, shard); `what` keeps pools apart. */
static void
content(uint8_t *p, size_t len, uint32_t what, uint32_t prefix, uint32_t i, uint32_t shard)
{
	uint32_t	x = what * 7919U + prefix * 104729U + i * 1299709U + shard * 15485863U + 1;
	size_t		j;

	for (j = 0; j < len; j++) {
		x = x * 1103515245U + 12345U;
		p[j] = (uint8_t)(x >> 16);
	}
}

static int
has_content(const uint8_t *p, size_t len, uint32_t what, uint32_t prefix, uint32_t i,
    uint32_t shard)
{
	uint8_t	*want = malloc(len);
	int	 ok;

	content(want, len, what, prefix, i, shard);
	ok = memcmp(p, want, len) == 0;
	free(want);
	return ok;
}

static int
all_bytes(const uint8_t *p, size_t len, uint8_t v)
{
	size_t	j;

	for (j = 0; j < len; j++)
		if (p[j] != v)
			return 0;
	return 1;
}

/*
 * Publishes one page of a pool from region r, slot/page `src`, with the
 * content of (what, prefix, hash_index, the rank's DCP shard); expects
 * stored or present.
 */
static void
publish_one(struct test_rank *h, unsigned r, uint32_t src, uint32_t prefix, uint32_t hash_index,
    uint32_t what)
{
	size_t	bytes = h->regions[r].page_stride;

	content(h->mem[r] + (size_t)src * bytes, bytes, what, prefix, hash_index,
	    h->args.layout.dcp_rank);
	test_rank_publish(h, r, prefix, hash_index, 1, src, NULL);
}

static void
publish_kv(struct test_rank *h, uint32_t prefix, uint32_t n)
{
	uint32_t	i;

	for (i = 0; i < n; i++)
		publish_one(h, R_KV, i, prefix, i, 1);
}

/* The checkpoint at `len` pages ends on page len-1; published from slot 3. */
static void
publish_state(struct test_rank *h, uint32_t prefix, uint32_t len)
{
	publish_one(h, R_STATE, 3, prefix, len - 1, 2);
}

static void
publish_side(struct test_rank *h, uint32_t prefix, uint32_t page)
{
	publish_one(h, R_SIDE, page, prefix, page, 3);
}

/* ADMIT of n pages, all of them reserved, with canonical state slot `slot`. */
static struct l3kv_admit_result
admit(struct test_rank *h, uint64_t req, uint32_t prefix, uint32_t n, uint32_t slot)
{
	return test_rank_admit(h, req, prefix, n, n, slot);
}

/*
 * A rank alone in group hy, attached, with n KV pages of a prefix and its
 * checkpoint at len: ADMIT of the n pages into canonical slot `slot` must
 * promise `want`.
 */
static struct l3kv_admit_result
solo_admitted(struct test_rank *h, uint32_t prefix, uint32_t n, uint32_t len, uint32_t slot,
    uint32_t want)
{
	struct l3kv_admit_result	a;

	hrank_init(h, "hy", 1, 0, SIDE_NONE, 0);
	hrank_attach(h);
	publish_kv(h, prefix, n);
	publish_state(h, prefix, len);
	a = admit(h, 1, prefix, n, slot);
	ck_assert_uint_eq(a.admitted_pages, want);
	return a;
}

/* ADMIT (canonical slot 1) on every rank of a group at once; all answers must agree. */
static struct l3kv_admit_result
admit_group(struct test_rank *h, unsigned n, uint64_t req, uint32_t prefix, uint32_t pages,
    uint64_t *leases)
{
	struct l3kv_admit_result	res[8];
	struct l3kv_admit_args		a;
	uint8_t				*hs = test_page_hashes(prefix, pages);
	unsigned			r;

	ck_assert_uint_le(n, 8);
	a = (struct l3kv_admit_args){ .request_id = req, .hashes = hs, .npages = pages,
	    .reserved_pages = pages, .state_slot = 1 };
	memset(res, 0, sizeof(res));
	test_rank_admit_group(h, n, &a, res);
	for (r = 0; r < n; r++) {
		leases[r] = res[r].lease;
		ck_assert_uint_eq(res[r].admitted_pages, res[0].admitted_pages);
		ck_assert_uint_eq(res[r].group_hit, res[0].group_hit);
	}
	free(hs);
	return res[0];
}

/* state at {1,4} and a trailing_pages(1) sidecar at {1,3}: the common stop is 1. */
START_TEST(test_state_and_sidecar_stop_points_intersect)
{
	struct l3kv_admit_result	a;
	struct test_rank		h;
	uint32_t			stops[4], nstops;

	hrank_init(&h, "hy", 1, 0, SIDE_TRAILING, 1);
	hrank_attach(&h);
	publish_kv(&h, 1, 4);
	publish_state(&h, 1, 1);
	publish_state(&h, 1, 4);
	publish_side(&h, 1, 0);
	publish_side(&h, 1, 2);
	ck_assert_uint_eq(test_rank_probe(&h, 1, 4, stops, &nstops), 1);
	ck_assert_uint_eq(nstops, 1);
	ck_assert_uint_eq(stops[0], 1);
	a = admit(&h, 1, 1, 4, 1);
	ck_assert_int_eq(a.decline, L3KV_DECLINE_NONE);
	ck_assert_uint_eq(a.admitted_pages, 1);
	ck_assert_int_eq(l3kv_release(h.k, a.lease), 0);
	/* With the sidecar page at 3 the stop points are {1, 4}. */
	publish_side(&h, 1, 3);
	ck_assert_uint_eq(test_rank_probe(&h, 1, 4, stops, &nstops), 4);
	ck_assert_uint_eq(nstops, 2);
	ck_assert_uint_eq(stops[1], 4);
	test_rank_fini(&h);
}
END_TEST

/* Rank A {2,4}, rank B {3,4}: 4. Rank A {2,4}, rank B {3}: nothing, not min(4,3). */
START_TEST(test_ranks_intersect_their_stop_points)
{
	static const struct {
		uint32_t	prefix;
		uint32_t	stops[2][2];	/* each rank's checkpoints; 0: none */
		uint32_t	hit;
	} cases[] = {
		{ 2, { { 2, 4 }, { 3, 4 } }, 4 },
		{ 3, { { 2, 4 }, { 3, 0 } }, 0 },
	};
	struct l3kv_admit_result	a;
	struct test_rank		h[2];
	uint64_t			leases[2];
	uint32_t			c, r, j;

	for (r = 0; r < 2; r++) {
		hrank_init(&h[r], "pair", 2, r, SIDE_NONE, 0);
		hrank_attach(&h[r]);
	}
	for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (r = 0; r < 2; r++) {
			publish_kv(&h[r], cases[c].prefix, 4);
			for (j = 0; j < 2 && cases[c].stops[r][j] != 0; j++)
				publish_state(&h[r], cases[c].prefix, cases[c].stops[r][j]);
		}
		for (r = 0; r < 2; r++)
			ck_assert_msg(test_rank_probe(&h[r], cases[c].prefix, 4, NULL, NULL) ==
			    cases[c].hit, "prefix %u: rank %u's PROBE is not %u", cases[c].prefix, r,
			    cases[c].hit);
		a = admit_group(h, 2, 10 + c, cases[c].prefix, 4, leases);
		ck_assert_msg(a.admitted_pages == cases[c].hit, "prefix %u: %u admitted, not %u",
		    cases[c].prefix, a.admitted_pages, cases[c].hit);
		if (cases[c].hit == 0)
			ck_assert_int_eq(a.decline, L3KV_DECLINE_NO_HIT);
		for (r = 0; r < 2 && cases[c].hit != 0; r++)
			ck_assert_int_eq(l3kv_release(h[r].k, leases[r]), 0);
	}
	for (r = 0; r < 2; r++)
		test_rank_fini(&h[r]);
}
END_TEST

/*
 * The checkpoint at 4 is missing, one at 2 exists: 2 pages are admitted and
 * restored, exactly, with the checkpoint in the canonical slot and the live
 * slot untouched.
 */
START_TEST(test_missing_checkpoint_admits_the_earlier_stop_exactly)
{
	struct l3kv_restore_result	res;
	struct l3kv_state_dest		sd = { R_STATE, 1 };
	struct l3kv_admit_result	a;
	struct test_rank		h;
	uint32_t			dst[2] = { 8, 9 }, i;
	uint64_t			page;

	a = solo_admitted(&h, 4, 4, 2, 1, 2);
	page = kv_page_bytes(&h);
	memset(h.mem[R_KV], 0xee, h.len[R_KV]);
	memset(h.mem[R_STATE], 0xee, h.len[R_STATE]);
	ck_assert_int_eq(l3kv_restore_state(h.k, a.lease, R_KV, dst, 2, &sd, 5000, &res), 0);
	ck_assert_uint_eq(res.pages, 2);
	for (i = 0; i < 2; i++)
		ck_assert(has_content(h.mem[R_KV] + dst[i] * page, page, 1, 4, i, 0));
	ck_assert(all_bytes(h.mem[R_KV] + 10 * page, page, 0xee));
	ck_assert(has_content(h.mem[R_STATE] + 1 * SLOT_BYTES, SLOT_BYTES, 2, 4, 1, 0));
	ck_assert(all_bytes(h.mem[R_STATE], SLOT_BYTES, 0xee));		/* live slot 0 */
	ck_assert(all_bytes(h.mem[R_STATE] + 2 * SLOT_BYTES, 2 * SLOT_BYTES, 0xee));
	ck_assert_int_eq(l3kv_release(h.k, a.lease), 0);
	test_rank_fini(&h);
}
END_TEST

START_TEST(test_live_slot_is_refused_before_any_byte_moves)
{
	struct l3kv_restore_result	res;
	struct l3kv_state_dest		sd = { R_STATE, 0 };
	struct l3kv_admit_result	a;
	struct test_rank		h;
	uint32_t			dst[2] = { 3, 4 };

	a = solo_admitted(&h, 5, 2, 2, 2, 2);
	memset(h.mem[R_KV], 0xee, h.len[R_KV]);
	memset(h.mem[R_STATE], 0x5a, h.len[R_STATE]);
	ck_assert_int_eq(l3kv_restore_state(h.k, a.lease, R_KV, dst, 2, &sd, 5000, &res),
	    -EADDRINUSE);
	ck_assert_int_eq(l3kv_last_status(h.k), PROTO_S_SLOT);
	ck_assert_ptr_nonnull(strstr(l3kv_last_error(h.k), "live"));
	/* Another slot than the one admitted is refused too. */
	sd.slot = 3;
	ck_assert_int_eq(l3kv_restore_state(h.k, a.lease, R_KV, dst, 2, &sd, 5000, &res), -EINVAL);
	usleep(50000);
	ck_assert(all_bytes(h.mem[R_KV], h.len[R_KV], 0xee));
	ck_assert(all_bytes(h.mem[R_STATE], h.len[R_STATE], 0x5a));
	/* The lease still restores into its own slot. */
	sd.slot = 2;
	ck_assert_int_eq(l3kv_restore_state(h.k, a.lease, R_KV, dst, 2, &sd, 5000, &res), 0);
	ck_assert(has_content(h.mem[R_STATE] + 2 * SLOT_BYTES, SLOT_BYTES, 2, 5, 1, 0));
	ck_assert(all_bytes(h.mem[R_STATE], SLOT_BYTES, 0x5a));
	ck_assert_int_eq(l3kv_release(h.k, a.lease), 0);
	test_rank_fini(&h);
}
END_TEST

START_TEST(test_slot_is_outstanding_from_admit_until_the_restore_ends)
{
	struct l3kv_restore_result	res;
	struct l3kv_state_dest		sd = { R_STATE, 1 };
	struct l3kv_admit_result	a, b;
	struct test_rank		h;
	uint32_t			dst[2] = { 0, 1 };

	a = solo_admitted(&h, 6, 2, 2, 1, 2);
	b = admit(&h, 2, 6, 2, 1);
	ck_assert_int_eq(b.decline, L3KV_DECLINE_SLOT_BUSY);
	ck_assert_uint_eq(b.admitted_pages, 0);
	b = admit(&h, 3, 6, 2, 0);			/* the live slot */
	ck_assert_int_eq(b.decline, L3KV_DECLINE_NO_SLOT);
	b = admit(&h, 4, 6, 2, L3KV_SLOT_NONE);		/* no slot at all */
	ck_assert_int_eq(b.decline, L3KV_DECLINE_NO_SLOT);
	b = admit(&h, 5, 6, 2, SLOTS);			/* outside the region */
	ck_assert_int_eq(b.decline, L3KV_DECLINE_NO_SLOT);
	ck_assert_int_eq(l3kv_restore_state(h.k, a.lease, R_KV, dst, 2, &sd, 5000, &res), 0);
	/* The restore ended: the slot is the engine's again. */
	b = admit(&h, 6, 6, 2, 1);
	ck_assert_uint_eq(b.admitted_pages, 2);
	ck_assert_int_eq(l3kv_release(h.k, a.lease), 0);
	ck_assert_int_eq(l3kv_release(h.k, b.lease), 0);
	test_rank_fini(&h);
}
END_TEST

/* The checkpoint at the admitted length is lost: fail, never fall back to 2. */
START_TEST(test_lost_checkpoint_fails_without_falling_back)
{
	struct l3kv_restore_result	res;
	struct l3kv_state_dest		sd = { R_STATE, 1 };
	struct l3kv_admit_result	a;
	struct test_rank		h;
	uint32_t			dst[4] = { 0, 1, 2, 3 };
	uint8_t				hs[L3KV_HASH_LEN];

	hrank_init(&h, "hy", 1, 0, SIDE_NONE, 0);
	hrank_attach(&h);
	publish_kv(&h, 7, 4);
	publish_state(&h, 7, 2);
	publish_state(&h, 7, 4);
	a = admit(&h, 1, 7, 4, 1);
	ck_assert_uint_eq(a.admitted_pages, 4);
	test_page_hash(7, 3, hs);
	ck_assert_int_eq(l3kv_debug(h.k, L3KV_DEBUG_DROP, 1, hs), 0);
	memset(h.mem[R_STATE], 0xee, h.len[R_STATE]);
	ck_assert_int_eq(l3kv_restore_state(h.k, a.lease, R_KV, dst, 4, &sd, 5000, &res),
	    -ENODATA);
	ck_assert(all_bytes(h.mem[R_STATE], h.len[R_STATE], 0xee));
	ck_assert_int_eq(test_td_stat("cache", "restores_ready"), 0);
	ck_assert_int_eq(l3kv_release(h.k, a.lease), 0);
	/* A new admission now promises 2, honestly. */
	a = admit(&h, 2, 7, 4, 1);
	ck_assert_uint_eq(a.admitted_pages, 2);
	ck_assert_int_eq(l3kv_release(h.k, a.lease), 0);
	test_rank_fini(&h);
}
END_TEST

/*
 * DCP 2 x TP 2: TP replicas of a shard write one object between them, so
 * pages x dcp objects exist; each rank restores its own shard; a shard
 * missing on one DCP rank lowers everyone's answer.
 */
START_TEST(test_dcp_shards_have_one_writer_and_restore_their_own)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	struct test_rank		h[4];
	uint64_t			leases[4], ticket;
	uint32_t			dst[4] = { 4, 5, 6, 7 }, r, i;

	for (r = 0; r < 4; r++) {
		dcp_rank_init(&h[r], "dcp", 2, 2, r);
		h[r].args.layout.logical_page_tokens = 2 * h[r].args.layout.page_tokens;
		hrank_attach(&h[r]);
	}
	for (r = 0; r < 4; r++)
		publish_kv(&h[r], 8, 4);
	ck_assert_int_eq(test_td_stat("dram", "objects"), 4 * 2);
	ck_assert_int_eq(test_td_stat("cache", "pages_present"), 4 * 2);
	a = admit_group(h, 4, 20, 8, 4, leases);
	ck_assert_uint_eq(a.admitted_pages, 4);
	for (r = 0; r < 4; r++) {
		memset(h[r].mem[R_KV], 0, h[r].len[R_KV]);
		ck_assert_int_eq(l3kv_submit_restore(h[r].k, leases[r], R_KV, dst, 4, &ticket), 0);
	}
	for (r = 0; r < 4; r++) {
		struct l3kv_completion	c;

		test_rank_wait_completion(&h[r], &c);
		ck_assert_int_eq(l3kv_restore_result(&c, &res), 0);
		l3kv_completion_release(&c);
		ck_assert_uint_eq(res.pages, 4);
		for (i = 0; i < 4; i++)
			ck_assert_msg(has_content(h[r].mem[R_KV] + dst[i] * kv_page_bytes(&h[r]),
			    kv_page_bytes(&h[r]), 1, 8, i, r / 2), "rank %u page %u", r, i);
	}
	for (r = 0; r < 4; r++)
		ck_assert_int_eq(l3kv_release(h[r].k, leases[r]), 0);

	/* DCP rank 1 holds only 2 pages of prefix 9: every rank hears 2. */
	publish_kv(&h[0], 9, 4);
	publish_kv(&h[2], 9, 2);
	for (r = 0; r < 4; r++)
		ck_assert_uint_eq(test_rank_probe(&h[r], 9, 4, NULL, NULL), 2);
	a = admit_group(h, 4, 21, 9, 4, leases);
	ck_assert_uint_eq(a.admitted_pages, 2);
	for (r = 0; r < 4; r++) {
		ck_assert_int_eq(l3kv_release(h[r].k, leases[r]), 0);
		test_rank_fini(&h[r]);
	}
}
END_TEST

/* What a refused change must leave alone. */
static char *
state_of_daemon(void)
{
	json_t	*j = test_td_stats(), *keep;
	char	*out;

	keep = json_pack("{s:O, s:O, s:O, s:O, s:O}", "namespaces",
	    json_object_get(j, "namespaces"), "groups", json_object_get(j, "groups"),
	    "memory", json_object_get(j, "memory"), "dram", json_object_get(j, "dram"),
	    "leases", json_object_get(json_object_get(j, "cache"), "leases_open"));
	out = json_dumps(keep, JSON_SORT_KEYS | JSON_COMPACT);
	json_decref(keep);
	json_decref(j);
	return out;
}

START_TEST(test_set_policy_guard_changes_nothing)
{
	struct test_rank	 h[2];
	char			*before, *after;
	uint32_t		 r;

	for (r = 0; r < 2; r++) {
		dcp_rank_init(&h[r], "dcp2", 1, 2, r);
		hrank_attach(&h[r]);
	}
	before = state_of_daemon();
	ck_assert_int_eq(l3kv_set_policy(h[0].k, L3KV_PREFETCH_BEST_EFFORT, L3KV_WRITE_THROUGH, 100),
	    -EPERM);
	ck_assert_ptr_nonnull(strstr(l3kv_last_error(h[0].k), "wait_complete"));
	ck_assert_int_eq(l3kv_set_policy(h[0].k, L3KV_PREFETCH_WAIT_COMPLETE, L3KV_WRITE_OFFLOAD, 0),
	    -EPERM);
	after = state_of_daemon();
	ck_assert_str_eq(before, after);
	/* The same policy again is accepted and changes nothing. */
	ck_assert_int_eq(l3kv_set_policy(h[1].k, L3KV_PREFETCH_WAIT_COMPLETE, L3KV_WRITE_THROUGH, 0),
	    0);
	free(after);
	after = state_of_daemon();
	ck_assert_str_eq(before, after);
	free(before);
	free(after);
	for (r = 0; r < 2; r++)
		test_rank_fini(&h[r]);
}
END_TEST

START_TEST(test_set_policy_waits_for_an_idle_group)
{
	struct l3kv_admit_result	a;
	struct test_rank		h;

	test_rank_init(&h, &kv, "solo", 1, 0);		/* the KV pool alone */
	hrank_attach(&h);
	publish_kv(&h, 12, 2);
	a = admit(&h, 1, 12, 2, L3KV_SLOT_NONE);
	ck_assert_uint_eq(a.admitted_pages, 2);
	ck_assert_int_eq(l3kv_set_policy(h.k, L3KV_PREFETCH_BEST_EFFORT, L3KV_WRITE_THROUGH, 50),
	    -EBUSY);
	ck_assert_int_eq(l3kv_release(h.k, a.lease), 0);
	ck_assert_int_eq(l3kv_set_policy(h.k, L3KV_PREFETCH_BEST_EFFORT, L3KV_WRITE_THROUGH, 50), 0);
	ck_assert_int_eq(l3kv_set_policy(h.k, 9, L3KV_WRITE_THROUGH, 0), -EINVAL);
	ck_assert_int_eq(test_td_stat("attach", "guards_refused"), 0);
	test_rank_fini(&h);
}
END_TEST

/* Fingerprints of a base layout and of one variant per field. */
static void
fingerprint(struct test_rank *h, uint8_t out[16])
{
	struct l3kv_attach_info	info;

	ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &h->k), 0);
	ck_assert_msg(l3kv_attach(h->k, &h->args, &info) == 0, "attach: %s",
	    l3kv_last_error(h->k));
	memcpy(out, info.fingerprint, 16);
	l3kv_close(h->k);
	h->k = NULL;
}

START_TEST(test_every_layout_field_changes_the_fingerprint)
{
	struct test_rank	h;
	uint8_t			fp[20][16];
	unsigned		n = 0, i, j;

	hrank_init(&h, "fp", 1, 0, SIDE_NONE, 0);
	fingerprint(&h, fp[n++]);
#define VARIANT(stmt, undo) do { stmt; fingerprint(&h, fp[n++]); undo; usleep(20000); } while (0)
	VARIANT(h.args.layout.tp_size = 2, h.args.layout.tp_size = 1);
	VARIANT((h.args.layout.dcp_size = 2, h.args.layout.attention = L3KV_ATTN_MLA),
	    (h.args.layout.dcp_size = 1, h.args.layout.attention = L3KV_ATTN_MHA));
	VARIANT((h.args.layout.dcp_size = 2, h.args.layout.dcp_rank = 1,
	    h.args.layout.attention = L3KV_ATTN_MLA), (h.args.layout.dcp_size = 1,
	    h.args.layout.dcp_rank = 0, h.args.layout.attention = L3KV_ATTN_MHA));
	VARIANT(h.args.layout.pp_size = 2, h.args.layout.pp_size = 1);
	VARIANT((h.args.layout.pp_size = 2, h.args.layout.pp_rank = 1),
	    (h.args.layout.pp_size = 1, h.args.layout.pp_rank = 0));
	VARIANT(h.args.layout.logical_page_tokens = 16, h.args.layout.logical_page_tokens = 8);
	VARIANT(h.args.layout.kv_dtype = "fp8_e5m2", h.args.layout.kv_dtype = "fp8_e4m3");
	VARIANT(h.args.layout.kv_dtype = "bf16", h.args.layout.kv_dtype = "fp8_e4m3");
	VARIANT(h.args.layout.host_layout = L3KV_LAYOUT_PAGE_FIRST_DIRECT,
	    h.args.layout.host_layout = L3KV_LAYOUT_PAGE_FIRST);
	VARIANT(h.args.layout.model = "another-model", h.args.layout.model = "kimi-linear-test");
	VARIANT(h.pools[1].schema = "conv:512:v2", h.pools[1].schema = "conv:512");
	VARIANT((h.args.layout.hash_scheme = "xxh64", h.args.layout.hash_len = 8),
	    (h.args.layout.hash_scheme = "sha256", h.args.layout.hash_len = 32));
	VARIANT(h.args.layout.attention = L3KV_ATTN_GQA, h.args.layout.attention = L3KV_ATTN_MHA);
	VARIANT(h.args.layout.seed = 42, h.args.layout.seed = 0);
	/* The physical page: the pool's objects and the region change with it. */
	h.args.layout.page_tokens = h.args.layout.logical_page_tokens = 4;
	h.regions[R_KV].page_tokens = 4;
	h.pools[0].object_bytes = kv_page_bytes(&h);
	h.regions[R_KV].page_stride = kv_page_bytes(&h);
	fingerprint(&h, fp[n++]);
#undef VARIANT
	for (i = 0; i < n; i++)
		for (j = i + 1; j < n; j++)
			ck_assert_msg(memcmp(fp[i], fp[j], 16) != 0, "variants %u and %u collide", i,
			    j);
	h.k = NULL;
	test_rank_fini(&h);
}
END_TEST

/* Another layout's objects are a miss: nothing promised, nothing written. */
START_TEST(test_layout_mismatch_is_a_miss_with_the_destination_untouched)
{
	struct l3kv_admit_result	a;
	struct test_rank		writer, reader;

	hrank_init(&writer, "w", 1, 0, SIDE_NONE, 0);
	hrank_attach(&writer);
	publish_kv(&writer, 13, 4);
	publish_state(&writer, 13, 4);
	hrank_init(&reader, "r", 1, 0, SIDE_NONE, 0);
	reader.args.layout.kv_dtype = "fp8_e5m2";	/* the same bytes' size, another meaning */
	hrank_attach(&reader);
	memset(reader.mem[R_KV], 0xee, reader.len[R_KV]);
	ck_assert_uint_eq(test_rank_probe(&reader, 13, 4, NULL, NULL), 0);
	a = admit(&reader, 1, 13, 4, 1);
	ck_assert_uint_eq(a.admitted_pages, 0);
	ck_assert_int_eq(a.decline, L3KV_DECLINE_NO_HIT);
	ck_assert(all_bytes(reader.mem[R_KV], reader.len[R_KV], 0xee));
	ck_assert_uint_eq(test_rank_probe(&writer, 13, 4, NULL, NULL), 4);
	test_rank_fini(&reader);
	test_rank_fini(&writer);
}
END_TEST

Suite *
suite_hybrid(void)
{
	Suite	*s = suite_create("hybrid");
	TCase	*tc = test_tcase(s, "hybrid", 60, setup, teardown);

	tcase_add_test(tc, test_state_and_sidecar_stop_points_intersect);
	tcase_add_test(tc, test_ranks_intersect_their_stop_points);
	tcase_add_test(tc, test_missing_checkpoint_admits_the_earlier_stop_exactly);
	tcase_add_test(tc, test_live_slot_is_refused_before_any_byte_moves);
	tcase_add_test(tc, test_slot_is_outstanding_from_admit_until_the_restore_ends);
	tcase_add_test(tc, test_lost_checkpoint_fails_without_falling_back);
	tcase_add_test(tc, test_dcp_shards_have_one_writer_and_restore_their_own);
	tcase_add_test(tc, test_set_policy_guard_changes_nothing);
	tcase_add_test(tc, test_set_policy_waits_for_an_idle_group);
	tcase_add_test(tc, test_every_layout_field_changes_the_fingerprint);
	tcase_add_test(tc, test_layout_mismatch_is_a_miss_with_the_destination_untouched);
	return s;
}
