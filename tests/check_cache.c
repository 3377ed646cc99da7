/*
 * The cache contract on the DRAM tier, end to end: a real l3kvd driven
 * through libl3kv by engines whose memory is memfds (the host copy
 * engine). Every test asserts statuses, destination bytes and counters,
 * and the teardown asserts that no lease, pin or in-flight object is
 * left behind.
 */
#include <sys/mman.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "l3kv.h"
#include "proto.h"
#include "tests.h"

#define PAGES		64		/* pages of each engine's KV region */
#define LAYERS		4
#define PAGE_TOKENS	8
#define TOKEN_BYTES	64
#define PAGE_BYTES	(PAGE_TOKENS * LAYERS * TOKEN_BYTES)
#define KV_REGION	TEST_RANK_KV

/* Each engine rank: an MLA layout, a page_first KV memfd (struct test_rank). */
static const struct test_rank_kv	kv = { "cache-test", "latent:64:fp8_e4m3", L3KV_ATTN_MLA,
    PAGES, PAGE_TOKENS, LAYERS, TOKEN_BYTES };

static void
setup(void)
{
	test_td_setup_with("{\"testing\": {\"debug_ops\": true}, \"tiers\": {\"dram\": {\"size\": "
	    "\"8 MiB\"}}}");
}

static void
teardown(void)
{
	/* Nothing held once every engine is gone. */
	ck_assert_int_eq(test_td_stat_wait("cache", "leases_open", 0), 0);
	ck_assert_int_eq(test_td_stat_wait("dram", "pins", 0), 0);
	ck_assert_int_eq(test_td_stat("dram", "pinned_objects"), 0);
	ck_assert_int_eq(test_td_stat("dram", "writing"), 0);
	test_td_teardown();
}

static void
rank_attach(struct test_rank *r)
{
	test_rank_attach(r, test_td.sock);
}

/* A rank alone in group g1, attached. */
static void
solo_attach(struct test_rank *r)
{
	test_rank_init(r, &kv, "g1", 1, 0);
	rank_attach(r);
}

/*
 * Publishes n pages of a prefix from engine slots [first, first+n): fills
 * them, publishes, expects `stored` new objects.
 */
static void
publish_prefix(struct test_rank *r, uint32_t prefix, uint32_t n, uint32_t first, uint32_t stored)
{
	struct l3kv_publish_result	res;

	test_rank_publish_kv(r, prefix, 0, n, first, &res);
	ck_assert_uint_eq(res.stored, stored);
	ck_assert_uint_eq(res.present, n - stored);
	ck_assert_uint_eq(res.bytes, (uint64_t)stored * PAGE_BYTES);
}

static uint32_t
probe(struct test_rank *r, uint32_t prefix, uint32_t n)
{
	return test_rank_probe(r, prefix, n, NULL, NULL);
}

static struct l3kv_admit_result
admit(struct test_rank *r, uint64_t req, uint32_t prefix, uint32_t n, uint32_t reserved)
{
	return test_rank_admit(r, req, prefix, n, reserved, L3KV_SLOT_NONE);
}

static int
page_is(struct test_rank *r, uint32_t slot, uint32_t prefix, uint32_t i)
{
	return test_rank_page_is(r, KV_REGION, slot, prefix, i);
}

START_TEST(test_publish_then_restore_lands_the_exact_bytes)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint32_t			i;

	solo_attach(&r);
	publish_prefix(&r, 1, 8, 0, 8);
	ck_assert_uint_eq(probe(&r, 1, 12), 8);
	a = admit(&r, 100, 1, 12, 12);
	ck_assert_int_eq(a.decline, L3KV_DECLINE_NONE);
	ck_assert_uint_eq(a.admitted_pages, 8);
	ck_assert_uint_eq(a.group_hit, 8);
	ck_assert_uint_ne(a.lease, 0);
	test_rank_sentinel(&r, KV_REGION, 32, 16);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 32, 8, &res), 0);
	ck_assert_uint_eq(res.pages, 8);
	ck_assert_int_eq(res.partial, 0);
	ck_assert_uint_eq(res.bytes, 8ULL * PAGE_BYTES);
	for (i = 0; i < 8; i++)
		ck_assert_msg(page_is(&r, 32 + i, 1, i), "page %u", i);
	ck_assert(test_rank_is_sentinel(&r, KV_REGION, 32 + 8, 8));
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	ck_assert_int_eq(test_td_stat("cache", "pages_restored"), 8);
	ck_assert_int_eq(test_td_stat("cache", "restores_ready"), 1);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_promise_never_exceeds_the_reservation)
{
	struct l3kv_admit_result	a;
	struct test_rank		r;

	solo_attach(&r);
	publish_prefix(&r, 2, 10, 0, 10);
	a = admit(&r, 1, 2, 10, 3);
	ck_assert_uint_eq(a.admitted_pages, 3);
	ck_assert_uint_eq(a.group_hit, 10);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 3);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);

	/* A declined admission promises 0 and holds nothing; it is not an error. */
	a = admit(&r, 2, 2, 10, 0);
	ck_assert_uint_eq(a.admitted_pages, 0);
	ck_assert_uint_eq(a.lease, 0);
	ck_assert_int_eq(a.decline, L3KV_DECLINE_NO_RESERVATION);
	a = admit(&r, 3, 99, 4, 4);
	ck_assert_uint_eq(a.admitted_pages, 0);
	ck_assert_int_eq(a.decline, L3KV_DECLINE_NO_HIT);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	ck_assert_int_eq(test_td_stat("cache", "leases_open"), 0);
	test_rank_fini(&r);
}
END_TEST

/* Everything but the counters that only the probe and the stats calls move. */
static char *
state_without_probe_counters(void)
{
	json_t	*j = test_td_stats();
	char	*out;

	json_object_del(json_object_get(j, "cache"), "probes");
	json_object_del(json_object_get(j, "daemon"), "uptime_ms");
	json_object_del(j, "frames");
	json_object_del(j, "requests");
	json_object_del(j, "connections");
	out = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
	json_decref(j);
	return out;
}

START_TEST(test_probe_changes_nothing)
{
	struct test_rank	 r;
	char			*before, *after;
	int			 i;

	solo_attach(&r);
	publish_prefix(&r, 3, 6, 0, 6);
	before = state_without_probe_counters();
	for (i = 0; i < 5; i++)
		ck_assert_uint_eq(probe(&r, 3, 10), 6);
	after = state_without_probe_counters();
	ck_assert_str_eq(before, after);
	ck_assert_int_eq(test_td_stat("cache", "probes"), 5);
	free(before);
	free(after);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_eviction_pressure_never_evicts_a_leased_object)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint32_t			p, i;

	solo_attach(&r);
	publish_prefix(&r, 4, 16, 0, 16);
	a = admit(&r, 1, 4, 16, 16);
	ck_assert_uint_eq(a.admitted_pages, 16);
	/* 8 MiB of 2 KiB objects is 4096: publish three times that. */
	for (p = 0; p < 200; p++)
		publish_prefix(&r, 1000 + p, 60, 0, 60);
	ck_assert_int_gt(test_td_stat("dram", "evictions"), 0);
	ck_assert_uint_eq(probe(&r, 4, 16), 16);
	test_rank_sentinel(&r, KV_REGION, 40, 16);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 40, 16, &res), 0);
	ck_assert_uint_eq(res.pages, 16);
	for (i = 0; i < 16; i++)
		ck_assert(page_is(&r, 40 + i, 4, i));
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
}
END_TEST

static void
lost_after_admit(unsigned op)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint8_t				h[L3KV_HASH_LEN];

	solo_attach(&r);
	publish_prefix(&r, 5, 8, 0, 8);
	a = admit(&r, 1, 5, 8, 8);
	ck_assert_uint_eq(a.admitted_pages, 8);
	test_page_hash(5, 5, h);
	ck_assert_int_eq(l3kv_debug(r.k, op, 0, h), 0);
	test_rank_sentinel(&r, KV_REGION, 20, 8);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 20, 8, &res), -ENODATA);
	ck_assert_int_eq(l3kv_last_status(r.k), PROTO_S_LOST);
	/* Never a shorter success; pages from the bad one on are untouched. */
	ck_assert(test_rank_is_sentinel(&r, KV_REGION, 20 + 5, 3));
	ck_assert_int_eq(test_td_stat("cache", "restores_ready"), 0);
	ck_assert_int_eq(test_td_stat("cache", "pages_restored"), 0);
	/* The bad object is gone from the index. */
	ck_assert_uint_eq(probe(&r, 5, 8), 5);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
}

START_TEST(test_object_corrupted_after_admit_fails_the_restore)
{
	lost_after_admit(L3KV_DEBUG_CORRUPT);
	ck_assert_int_eq(test_td_stat("cache", "objects_lost"), 1);
}
END_TEST

START_TEST(test_object_deleted_after_admit_fails_the_restore)
{
	lost_after_admit(L3KV_DEBUG_DROP);
	ck_assert_int_eq(test_td_stat("cache", "objects_lost"), 1);
}
END_TEST

START_TEST(test_out_of_bounds_destination_is_refused_with_nothing_written)
{
	struct l3kv_restore_result	res;
	struct l3kv_restore_args	ra;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint32_t			dst[4] = { 1, 2, PAGES, 3 }, i;

	solo_attach(&r);
	publish_prefix(&r, 7, 4, 0, 4);
	a = admit(&r, 1, 7, 4, 4);
	test_rank_sentinel(&r, KV_REGION, 0, PAGES);
	ck_assert_int_eq(l3kv_restore(r.k, a.lease, KV_REGION, dst, 4, 5000, &res), -ERANGE);
	ck_assert_int_eq(l3kv_last_status(r.k), PROTO_S_OUT_OF_BOUNDS);
	ck_assert_int_eq(l3kv_restore(r.k, a.lease, 5, dst, 4, 5000, &res), -ERANGE);
	/* Fewer pages than promised is refused too: never a partial success. */
	ck_assert_int_eq(l3kv_restore(r.k, a.lease, KV_REGION, dst, 2, 5000, &res), -EINVAL);
	/* Waiting on an event needs an event registration, not memory or nothing. */
	dst[2] = 9;
	ra = (struct l3kv_restore_args){ .lease = a.lease, .pages = dst, .npages = 4,
	    .region = KV_REGION, .state_region = L3KV_REGION_NONE, .state_slot = L3KV_SLOT_NONE,
	    .event_region = KV_REGION };
	ck_assert_int_eq(l3kv_restore_with(r.k, &ra, 5000, &res), -EINVAL);
	ck_assert_str_eq(l3kv_last_error(r.k), "RESTORE: event region 0 is not an event registration");
	ra.event_region = 7;
	ck_assert_int_eq(l3kv_restore_with(r.k, &ra, 5000, &res), -EINVAL);
	ck_assert_str_eq(l3kv_last_error(r.k), "RESTORE: event region 7 is not an event registration");
	dst[2] = PAGES;
	usleep(50000);
	for (i = 0; i < PAGES; i++)
		ck_assert_msg(test_rank_is_sentinel(&r, KV_REGION, i, 1), "page %u written", i);
	/* The lease is still good. */
	dst[2] = 9;
	ck_assert_int_eq(l3kv_restore(r.k, a.lease, KV_REGION, dst, 4, 5000, &res), 0);
	ck_assert(page_is(&r, 9, 7, 2));
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_duplicate_publish_is_present_not_rewritten)
{
	struct test_rank	r;

	solo_attach(&r);
	publish_prefix(&r, 8, 6, 0, 6);
	publish_prefix(&r, 8, 10, 0, 4);	/* 6 present, 4 new */
	ck_assert_int_eq(test_td_stat("dram", "objects"), 10);
	ck_assert_int_eq(test_td_stat("cache", "pages_present"), 6);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_publish_with_bad_source_indices_stores_nothing)
{
	struct l3kv_publish_result	res;
	struct l3kv_publish_page	pg[3];
	struct test_rank		r;
	uint32_t			i;

	solo_attach(&r);
	for (i = 0; i < 3; i++) {
		test_page_hash(9, i, pg[i].hash);
		pg[i].src_page = i;
	}
	pg[2].src_page = PAGES + 7;
	ck_assert_int_eq(l3kv_publish(r.k, KV_REGION, pg, 3, &res), -ERANGE);
	ck_assert_int_eq(l3kv_last_status(r.k), PROTO_S_OUT_OF_BOUNDS);
	ck_assert_ptr_nonnull(strstr(l3kv_last_error(r.k), "source 2"));
	ck_assert_uint_eq(probe(&r, 9, 3), 0);
	ck_assert_int_eq(test_td_stat("dram", "objects"), 0);
	ck_assert_int_eq(test_td_stat("cache", "publishes_failed"), 1);
	test_rank_fini(&r);
}
END_TEST

/* Publishes 60 pages of a prefix; returns l3kv_publish's result. */
static int
try_publish(struct test_rank *r, uint32_t prefix)
{
	struct l3kv_publish_result	res;
	struct l3kv_publish_page	pg[60];
	uint32_t			i;

	for (i = 0; i < 60; i++) {
		test_rank_fill_page(r, KV_REGION, i, prefix, i);
		test_page_hash(prefix, i, pg[i].hash);
		pg[i].src_page = i;
	}
	return l3kv_publish(r->k, KV_REGION, pg, 60, &res);
}

START_TEST(test_publish_without_space_stores_nothing)
{
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint64_t			leases[100];
	uint32_t			p, n = 0, i;
	int				rc = 0;

	solo_attach(&r);
	/* Fill the 8 MiB tier with leased (pinned) prefixes until a publish fails. */
	for (p = 0; p < 100; p++) {
		if ((rc = try_publish(&r, 2000 + p)) != 0)
			break;
		a = admit(&r, 500 + p, 2000 + p, 60, 60);
		ck_assert_uint_eq(a.admitted_pages, 60);
		leases[n++] = a.lease;
	}
	ck_assert_int_eq(rc, -ENOSPC);
	ck_assert_int_eq(l3kv_last_status(r.k), PROTO_S_NO_SPACE);
	ck_assert_uint_gt(n, 10);
	/* The failed publish left nothing visible and nothing half-written. */
	ck_assert_uint_eq(probe(&r, 2000 + p, 60), 0);
	ck_assert_int_eq(test_td_stat("dram", "writing"), 0);
	ck_assert_int_eq(test_td_stat("dram", "objects"), (long long)n * 60);
	for (i = 0; i < n; i++)
		ck_assert_int_eq(l3kv_release(r.k, leases[i]), 0);
	/* With the pins gone, eviction makes room again. */
	ck_assert_int_eq(try_publish(&r, 2000 + p), 0);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_cancel_during_slow_copy_is_answered_after_the_copy)
{
	struct l3kv_restore_result	res;
	struct l3kv_completion		c;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint32_t			dst[10], i, landed = 0;
	uint64_t			ticket;

	test_td_restart("{\"testing\": {\"copy_delay_ms\": 100}}");
	solo_attach(&r);
	publish_prefix(&r, 10, 10, 0, 10);
	a = admit(&r, 1, 10, 10, 10);
	for (i = 0; i < 10; i++) {
		dst[i] = 30 + i;
		test_rank_sentinel(&r, KV_REGION, 30 + i, 1);
	}
	ck_assert_int_eq(l3kv_submit_restore(r.k, a.lease, KV_REGION, dst, 10, &ticket), 0);
	usleep(350000);
	/* STATS shows the copy running (and no RESTORE waits for an engine event here) */
	ck_assert_int_eq(test_td_stat("copy", "jobs_inflight"), 1);
	ck_assert_int_eq(test_td_stat("copy", "waiting_on_events"), 0);
	/* The host engine ran it: no cuda copy engine (no GPU here), so no device. */
	{
		json_t	*st = test_td_stats();

		ck_assert(json_is_array(json_object_get(json_object_get(st, "copy"), "devices")));
		ck_assert_int_eq(json_array_size(json_object_get(json_object_get(st, "copy"),
		    "devices")), 0);
		json_decref(st);
	}
	ck_assert_int_eq(l3kv_cancel(r.k, a.lease, &landed), 0);
	ck_assert_uint_gt(landed, 0);
	ck_assert_uint_lt(landed, 10);
	/* Answered after the copy stopped: nothing changes after the answer. */
	usleep(300000);
	for (i = 0; i < landed; i++)
		ck_assert(page_is(&r, 30 + i, 10, i));
	for (i = landed; i < 10; i++)
		ck_assert_msg(test_rank_is_sentinel(&r, KV_REGION, 30 + i, 1),
		    "page %u written after the cancel", i);
	test_rank_wait_completion(&r, &c);
	ck_assert_uint_eq(c.ticket, ticket);
	ck_assert_int_eq(c.status, -ECANCELED);
	ck_assert_int_eq(l3kv_restore_result(&c, &res), -EINVAL);
	l3kv_completion_release(&c);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	ck_assert_int_eq(test_td_stat("copy", "jobs_inflight"), 0);
	ck_assert_int_eq(test_td_stat("cache", "pages_restored"), 0);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_three_concurrent_restores_land_the_right_bytes)
{
	struct l3kv_restore_result	res;
	struct l3kv_completion		c;
	struct l3kv_admit_result	a[3];
	struct test_rank		r[3];
	uint64_t			ticket[3];
	uint32_t			dst[20], i, e;
	char				group[16];

	for (e = 0; e < 3; e++) {
		snprintf(group, sizeof(group), "g%u", e);
		test_rank_init(&r[e], &kv, strdup(group), 1, 0);
		rank_attach(&r[e]);
		publish_prefix(&r[e], 20 + e, 6 + e * 4, 0, 6 + e * 4);
		a[e] = admit(&r[e], 1, 20 + e, 6 + e * 4, 64);
		ck_assert_uint_eq(a[e].admitted_pages, 6 + e * 4);
		for (i = 0; i < a[e].admitted_pages; i++) {
			dst[i] = 40 + i;
			test_rank_sentinel(&r[e], KV_REGION, 40 + i, 1);
		}
		ck_assert_int_eq(l3kv_submit_restore(r[e].k, a[e].lease, KV_REGION, dst,
		    a[e].admitted_pages, &ticket[e]), 0);
	}
	for (e = 0; e < 3; e++) {
		test_rank_wait_completion(&r[e], &c);
		ck_assert_uint_eq(c.ticket, ticket[e]);
		ck_assert_int_eq(c.status, 0);
		ck_assert_int_eq(l3kv_restore_result(&c, &res), 0);
		ck_assert_uint_eq(res.pages, 6 + e * 4);
		l3kv_completion_release(&c);
		for (i = 0; i < res.pages; i++)
			ck_assert(page_is(&r[e], 40 + i, 20 + e, i));
		ck_assert_int_eq(l3kv_release(r[e].k, a[e].lease), 0);
		free((void *)(uintptr_t)r[e].args.group);
		test_rank_fini(&r[e]);
	}
}
END_TEST

START_TEST(test_engine_killed_mid_restore_leaves_no_pins)
{
	struct l3kv_admit_result	a;
	struct test_rank		r, other;
	uint32_t			dst[10], i;
	uint64_t			ticket;
	pid_t				pid;
	int				st;

	test_td_restart("{\"testing\": {\"copy_delay_ms\": 100}}");
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		test_rank_init(&r, &kv, "victim", 1, 0);
		rank_attach(&r);
		publish_prefix(&r, 30, 10, 0, 10);
		a = admit(&r, 1, 30, 10, 10);
		for (i = 0; i < 10; i++)
			dst[i] = 20 + i;
		if (l3kv_submit_restore(r.k, a.lease, KV_REGION, dst, 10, &ticket) != 0)
			_exit(1);
		pause();
		_exit(0);
	}
	ck_assert_int_eq(test_td_stat_wait("dram", "pins", 10), 10);
	usleep(150000);		/* the copy is under way */
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	/* Another engine is served meanwhile, and sees what the dead one published. */
	test_rank_init(&other, &kv, "other", 1, 0);
	rank_attach(&other);
	ck_assert_uint_eq(probe(&other, 30, 10), 10);
	test_rank_fini(&other);
	ck_assert_int_eq(test_td_stat_wait("dram", "pins", 0), 0);
	ck_assert_int_eq(test_td_stat_wait("cache", "leases_open", 0), 0);
	ck_assert_int_eq(test_td_stat_wait("memory", "regions_mapped", 0), 0);
	ck_assert_int_eq(test_td_stat("cache", "pages_restored"), 0);
}
END_TEST

#define GROUP	4

START_TEST(test_group_of_four_gets_identical_answers)
{
	struct l3kv_admit_result	res[GROUP];
	struct l3kv_restore_result	rr;
	struct l3kv_completion		c;
	struct l3kv_admit_args		args;
	struct test_rank		r[GROUP];
	uint64_t			ticket[GROUP];
	uint32_t			dst[8], i, g;
	uint8_t				*h = test_page_hashes(40, 8);

	for (g = 0; g < GROUP; g++) {
		test_rank_init(&r[g], &kv, "tp4", GROUP, g);
		r[g].args.layout.attention = L3KV_ATTN_MHA;	/* a shard per TP rank */
		rank_attach(&r[g]);
	}
	/* Every rank holds 8 pages of its own shard but rank 2, which holds 5. */
	for (g = 0; g < GROUP; g++)
		publish_prefix(&r[g], 40, g == 2 ? 5 : 8, 0, g == 2 ? 5 : 8);
	for (g = 0; g < GROUP; g++)
		ck_assert_uint_eq(probe(&r[g], 40, 8), 5);
	args = (struct l3kv_admit_args){ .request_id = 77, .hashes = h, .npages = 8,
	    .state_slot = L3KV_SLOT_NONE };
	for (g = 0; g < GROUP; g++) {
		args.reserved_pages = g == 1 ? 4 : 8;
		ck_assert_int_eq(l3kv_submit_admit(r[g].k, &args, &ticket[g]), 0);
	}
	for (g = 0; g < GROUP; g++) {
		test_rank_wait_completion(&r[g], &c);
		ck_assert_int_eq(c.status, 0);
		ck_assert_int_eq(l3kv_admit_result(&c, &res[g]), 0);
		l3kv_completion_release(&c);
		ck_assert_uint_eq(res[g].admitted_pages, 4);
		ck_assert_uint_eq(res[g].group_hit, 5);
		ck_assert_int_eq(res[g].decline, L3KV_DECLINE_NONE);
	}
	for (g = 0; g < GROUP; g++) {
		for (i = 0; i < 4; i++)
			dst[i] = 50 + i;
		ck_assert_int_eq(l3kv_submit_restore(r[g].k, res[g].lease, KV_REGION, dst, 4,
		    &ticket[g]), 0);
	}
	for (g = 0; g < GROUP; g++) {
		test_rank_wait_completion(&r[g], &c);
		ck_assert_int_eq(c.status, 0);
		ck_assert_int_eq(l3kv_restore_result(&c, &rr), 0);
		ck_assert_uint_eq(rr.pages, 4);
		l3kv_completion_release(&c);
		for (i = 0; i < 4; i++)
			ck_assert(page_is(&r[g], 50 + i, 40, i));
		ck_assert_int_eq(l3kv_release(r[g].k, res[g].lease), 0);
	}
	free(h);
	for (g = 0; g < GROUP; g++)
		test_rank_fini(&r[g]);
}
END_TEST

START_TEST(test_missing_rank_makes_admit_decline_for_all_at_the_deadline)
{
	struct l3kv_admit_result	res[GROUP - 1];
	struct l3kv_admit_args		args;
	struct test_rank		r[GROUP];
	uint32_t			g;
	uint8_t				*h = test_page_hashes(41, 4);

	test_td_restart("{\"admit\": {\"timeout_ms\": 300}}");
	for (g = 0; g < GROUP; g++) {
		test_rank_init(&r[g], &kv, "tp4", GROUP, g);
		r[g].args.layout.attention = L3KV_ATTN_MHA;
		rank_attach(&r[g]);
		publish_prefix(&r[g], 41, 4, 0, 4);
	}
	args = (struct l3kv_admit_args){ .request_id = 5, .hashes = h, .npages = 4,
	    .reserved_pages = 4, .state_slot = L3KV_SLOT_NONE };
	test_rank_admit_group(r, GROUP - 1, &args, res);	/* rank 3 never asks */
	for (g = 0; g < GROUP - 1; g++) {
		ck_assert_uint_eq(res[g].admitted_pages, 0);
		ck_assert_uint_eq(res[g].lease, 0);
		ck_assert_int_eq(res[g].decline, L3KV_DECLINE_GROUP_TIMEOUT);
	}
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	free(h);
	for (g = 0; g < GROUP; g++)
		test_rank_fini(&r[g]);
}
END_TEST

/*
 * Issue 11 item 6: a rank's ADMITs waiting at its group's barrier are
 * capped (admit.max_waiting): one more is refused `limit`, with its text,
 * nothing opened; asking again for one it waits on is not a new one; the
 * waiting ones are answered as usual, and the cap frees as they are.
 */
START_TEST(test_admits_waiting_at_the_barrier_are_capped_per_rank)
{
	struct l3kv_admit_result	ar;
	struct l3kv_completion		c;
	struct l3kv_admit_args		args;
	struct test_rank		r[2];
	uint64_t			t[6], extra, again;
	uint32_t			g, i;
	uint8_t				*h = test_page_hashes(43, 4);

	test_td_restart("{\"admit\": {\"max_waiting\": 4, \"timeout_ms\": 60000}}");
	for (g = 0; g < 2; g++) {
		test_rank_init(&r[g], &kv, "tp2-cap", 2, g);
		r[g].args.layout.attention = L3KV_ATTN_MHA;
		rank_attach(&r[g]);
		publish_prefix(&r[g], 43, 4, 0, 4);
	}
	args = (struct l3kv_admit_args){ .hashes = h, .npages = 4, .reserved_pages = 4,
	    .state_slot = L3KV_SLOT_NONE };
	for (i = 0; i < 4; i++) {
		args.request_id = 100 + i;
		ck_assert_int_eq(l3kv_submit_admit(r[0].k, &args, &t[i]), 0);
	}
	/* The fifth would wait too: refused at once, with its reason. */
	args.request_id = 104;
	ck_assert_int_eq(l3kv_submit_admit(r[0].k, &args, &extra), 0);
	test_rank_wait_completion(&r[0], &c);
	ck_assert_uint_eq(c.ticket, extra);
	ck_assert_int_eq(c.status, -EUSERS);
	ck_assert_int_eq(c.proto_status, PROTO_S_LIMIT);
	ck_assert_str_eq(c.payload, "ADMIT: 4 admissions of this rank are already waiting for their "
	    "group (admit.max_waiting)");
	l3kv_completion_release(&c);
	ck_assert_int_eq(test_td_stat("cache", "admits_limited"), 1);
	/* Asking again for a waiting one supersedes it: the old one is answered busy. */
	args.request_id = 101;
	ck_assert_int_eq(l3kv_submit_admit(r[0].k, &args, &again), 0);
	test_rank_wait_completion(&r[0], &c);
	ck_assert_uint_eq(c.ticket, t[1]);
	ck_assert_int_eq(c.proto_status, PROTO_S_BUSY);
	l3kv_completion_release(&c);
	t[1] = again;
	ck_assert_int_eq(test_td_stat("cache", "admits_limited"), 1);

	/* Rank 1 completes the four barriers: each rank gets its leases. */
	for (i = 0; i < 4; i++) {
		args.request_id = 100 + i;
		ck_assert_int_eq(l3kv_submit_admit(r[1].k, &args, &t[4]), 0);
		test_rank_wait_completion(&r[1], &c);
		ck_assert_int_eq(c.status, 0);
		ck_assert_int_eq(l3kv_admit_result(&c, &ar), 0);
		l3kv_completion_release(&c);
		ck_assert_uint_eq(ar.admitted_pages, 4);
		ck_assert_int_eq(l3kv_release(r[1].k, ar.lease), 0);
	}
	for (i = 0; i < 4; i++) {
		test_rank_wait_completion(&r[0], &c);
		ck_assert_int_eq(c.status, 0);
		ck_assert_int_eq(l3kv_admit_result(&c, &ar), 0);
		l3kv_completion_release(&c);
		ck_assert_uint_eq(ar.admitted_pages, 4);
		ck_assert_int_eq(l3kv_release(r[0].k, ar.lease), 0);
	}
	/* The cap is free again: the refused request goes through now. */
	args.request_id = 104;
	ck_assert_int_eq(l3kv_submit_admit(r[0].k, &args, &t[0]), 0);
	ck_assert_int_eq(l3kv_submit_admit(r[1].k, &args, &t[1]), 0);
	for (g = 0; g < 2; g++) {
		test_rank_wait_completion(&r[g], &c);
		ck_assert_int_eq(c.status, 0);
		ck_assert_int_eq(l3kv_admit_result(&c, &ar), 0);
		l3kv_completion_release(&c);
		ck_assert_uint_eq(ar.admitted_pages, 4);
		ck_assert_int_eq(l3kv_release(r[g].k, ar.lease), 0);
	}
	ck_assert_int_eq(test_td_stat("cache", "admits_limited"), 1);
	free(h);
	for (g = 0; g < 2; g++)
		test_rank_fini(&r[g]);
}
END_TEST


/*
 * A rank whose ADMIT waits at its group's barrier and that DETACHes on the
 * same connection gets its ADMIT declined rank_left before the DETACH's
 * ok (the connection stays open: the engine reads on), and nothing of
 * that session reaches the connection's next ATTACH, whose barriers work.
 */
START_TEST(test_admit_waiting_at_the_barrier_is_declined_at_detach)
{
	struct l3kv_admit_result	ar, res[2];
	struct l3kv_completion		c;
	struct l3kv_admit_args		args;
	struct test_rank		r[2];
	uint64_t			t;
	uint32_t			g;
	uint8_t				*h = test_page_hashes(44, 4);

	test_td_restart("{\"admit\": {\"timeout_ms\": 60000}}");
	for (g = 0; g < 2; g++) {
		test_rank_init(&r[g], &kv, "tp2-left", 2, g);
		r[g].args.layout.attention = L3KV_ATTN_MHA;
		rank_attach(&r[g]);
		publish_prefix(&r[g], 44, 4, 0, 4);
	}
	args = (struct l3kv_admit_args){ .request_id = 7, .hashes = h, .npages = 4,
	    .reserved_pages = 4, .state_slot = L3KV_SLOT_NONE };
	/* Rank 1 never asks: the ADMIT waits for it (60 s), then the DETACH comes. */
	ck_assert_int_eq(l3kv_submit_admit(r[0].k, &args, &t), 0);
	ck_assert_int_eq(l3kv_detach(r[0].k), 0);
	/* The DETACH's reply was read: the ADMIT's answer came before it, or never. */
	ck_assert_msg(l3kv_poll_completion(r[0].k, &c) == 0,
	    "the waiting ADMIT was not answered before the DETACH's reply");
	ck_assert_uint_eq(c.ticket, t);
	ck_assert_int_eq(c.op, L3KV_OP_ADMIT);
	ck_assert_int_eq(c.status, 0);
	ck_assert_int_eq(l3kv_admit_result(&c, &ar), 0);
	l3kv_completion_release(&c);
	ck_assert_int_eq(ar.decline, L3KV_DECLINE_RANK_LEFT);
	ck_assert_uint_eq(ar.admitted_pages, 0);
	ck_assert_uint_eq(ar.lease, 0);
	ck_assert_int_eq(test_td_stat("cache", "leases_open"), 0);

	/* The connection attaches again; the group's barrier works, nothing stray arrives. */
	ck_assert_int_eq(l3kv_attach(r[0].k, &r[0].args, NULL), 0);
	ck_assert_int_eq(l3kv_poll_completion(r[0].k, &c), -EAGAIN);
	args.request_id = 8;
	test_rank_admit_group(r, 2, &args, res);
	for (g = 0; g < 2; g++) {
		ck_assert_int_eq(res[g].decline, L3KV_DECLINE_NONE);
		ck_assert_uint_eq(res[g].admitted_pages, 4);
		ck_assert_int_eq(l3kv_release(r[g].k, res[g].lease), 0);
	}
	ck_assert_int_eq(l3kv_poll_completion(r[0].k, &c), -EAGAIN);
	free(h);
	for (g = 0; g < 2; g++)
		test_rank_fini(&r[g]);
}
END_TEST
/*
 * Issue 11 item 11, through the daemon: 3 MiB of tiers.dram.size is a
 * 2 MiB arena (it was 4 MiB, over the budget), and the start says so.
 */
START_TEST(test_dram_size_is_rounded_down_and_said_at_start)
{
	test_td_restart("{\"tiers\": {\"dram\": {\"size\": \"3 MiB\"}}}");
	ck_assert_int_eq(test_td_stat("dram", "bytes_capacity"), 2LL << 20);
	ck_assert(test_daemon_log_has(&test_td, "dram: arena of 2097152 bytes: 3145728 configured, "
	    "rounded down to whole 2 MiB units"));
	test_td_restart("{\"tiers\": {\"dram\": {\"size\": \"4 MiB\"}}}");
	ck_assert_int_eq(test_td_stat("dram", "bytes_capacity"), 4LL << 20);
	ck_assert(!test_daemon_log_has(&test_td, "rounded down"));
}
END_TEST

START_TEST(test_lease_expires_and_restore_says_expired)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	struct test_rank		r;

	test_td_restart("{\"lease\": {\"ttl_ms\": 200}}");
	solo_attach(&r);
	publish_prefix(&r, 50, 4, 0, 4);
	a = admit(&r, 1, 50, 4, 4);
	ck_assert_uint_eq(a.ttl_ms, 200);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 4);
	ck_assert_int_eq(test_td_stat_wait("cache", "lease_expiries", 1), 1);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 10, 4, &res), -ETIME);
	ck_assert_int_eq(l3kv_last_status(r.k), PROTO_S_EXPIRED);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
}
END_TEST

/*
 * Leases share one TTL queue (and reuse freed leases): each still expires
 * its own TTL after its ADMIT, the older first, the younger untouched.
 */
START_TEST(test_leases_expire_in_admission_order_each_after_its_ttl)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a, b, c;
	struct test_rank		r;

	test_td_restart("{\"lease\": {\"ttl_ms\": 400}}");
	solo_attach(&r);
	publish_prefix(&r, 52, 4, 0, 4);
	publish_prefix(&r, 53, 3, 4, 3);
	a = admit(&r, 1, 52, 4, 4);
	ck_assert_uint_eq(a.admitted_pages, 4);
	poll(NULL, 0, 200);
	/* A lease freed now is reused by the next ADMIT. */
	c = admit(&r, 2, 53, 3, 3);
	ck_assert_int_eq(l3kv_release(r.k, c.lease), 0);
	b = admit(&r, 3, 53, 3, 3);
	ck_assert_uint_eq(b.admitted_pages, 3);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 7);
	ck_assert_int_eq(test_td_stat_wait("cache", "lease_expiries", 1), 1);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 3);	/* a's pins went, b's are held */
	ck_assert_int_eq(test_td_stat_wait("cache", "lease_expiries", 2), 2);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 10, 4, &res), -ETIME);
	ck_assert_int_eq(test_rank_restore(&r, b.lease, 10, 3, &res), -ETIME);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	ck_assert_int_eq(l3kv_release(r.k, b.lease), 0);
	ck_assert_int_eq(test_td_stat("cache", "leases_open"), 0);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_best_effort_ends_at_its_deadline_with_whole_pages)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint32_t			i;

	test_td_restart("{\"testing\": {\"copy_delay_ms\": 100}}");
	test_rank_init(&r, &kv, "g1", 1, 0);
	r.args.prefetch = L3KV_PREFETCH_BEST_EFFORT;
	r.args.prefetch_timeout_ms = 350;
	rank_attach(&r);
	publish_prefix(&r, 60, 12, 0, 12);
	a = admit(&r, 1, 60, 12, 12);
	test_rank_sentinel(&r, KV_REGION, 20, 12);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 20, 12, &res), 0);
	ck_assert_int_eq(res.partial, 1);
	ck_assert_uint_gt(res.pages, 0);
	ck_assert_uint_lt(res.pages, 12);
	for (i = 0; i < res.pages; i++)
		ck_assert(page_is(&r, 20 + i, 60, i));
	for (i = res.pages; i < 12; i++)
		ck_assert(test_rank_is_sentinel(&r, KV_REGION, 20 + i, 1));
	ck_assert_int_eq(test_td_stat("cache", "restores_partial"), 1);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_debug_is_refused_without_the_testing_knob)
{
	struct test_rank	r;
	uint8_t			h[L3KV_HASH_LEN];

	test_td_restart(NULL);
	solo_attach(&r);
	publish_prefix(&r, 70, 1, 0, 1);
	test_page_hash(70, 0, h);
	ck_assert_int_lt(l3kv_debug(r.k, L3KV_DEBUG_CORRUPT, 0, h), 0);
	ck_assert_int_eq(l3kv_last_status(r.k), PROTO_S_STATE);
	test_rank_fini(&r);
}
END_TEST

/* Two MHA ranks admitted together; returns their leases. */
static void
pair_admitted(struct test_rank r[2], uint32_t prefix, uint32_t n, uint64_t lease[2])
{
	struct l3kv_admit_result	res[2];
	struct l3kv_admit_args		args;
	uint8_t				*h = test_page_hashes(prefix, n);
	uint32_t			g;

	for (g = 0; g < 2; g++) {
		test_rank_init(&r[g], &kv, "pair", 2, g);
		r[g].args.layout.attention = L3KV_ATTN_MHA;
		rank_attach(&r[g]);
		publish_prefix(&r[g], prefix, n, 0, n);
	}
	args = (struct l3kv_admit_args){ .request_id = 9, .hashes = h, .npages = n,
	    .reserved_pages = n, .state_slot = L3KV_SLOT_NONE };
	test_rank_admit_group(r, 2, &args, res);
	for (g = 0; g < 2; g++) {
		ck_assert_uint_eq(res[g].admitted_pages, n);
		lease[g] = res[g].lease;
	}
	free(h);
}

START_TEST(test_a_lost_page_on_one_rank_fails_every_rank)
{
	struct l3kv_restore_result	res;
	struct l3kv_completion		c;
	struct test_rank		r[2];
	uint64_t			lease[2], ticket;
	uint32_t			dst[6] = { 10, 11, 12, 13, 14, 15 };
	uint8_t				h[L3KV_HASH_LEN];

	pair_admitted(r, 80, 6, lease);
	test_page_hash(80, 3, h);
	ck_assert_int_eq(l3kv_debug(r[1].k, L3KV_DEBUG_CORRUPT, 0, h), 0);
	ck_assert_int_eq(l3kv_submit_restore(r[0].k, lease[0], KV_REGION, dst, 6, &ticket), 0);
	ck_assert_int_eq(l3kv_restore(r[1].k, lease[1], KV_REGION, dst, 6, 5000, &res), -ENODATA);
	test_rank_wait_completion(&r[0], &c);
	ck_assert_int_eq(c.status, -ENODATA);
	ck_assert_ptr_nonnull(strstr(c.payload, "rank 1"));
	l3kv_completion_release(&c);
	ck_assert_int_eq(test_td_stat("cache", "restores_ready"), 0);
	ck_assert_int_eq(l3kv_release(r[0].k, lease[0]), 0);
	ck_assert_int_eq(l3kv_release(r[1].k, lease[1]), 0);
	test_rank_fini(&r[0]);
	test_rank_fini(&r[1]);
}
END_TEST

START_TEST(test_a_rank_releasing_fails_the_waiting_rank)
{
	struct l3kv_completion	c;
	struct test_rank	r[2];
	uint64_t		lease[2], ticket;
	uint32_t		dst[4] = { 1, 2, 3, 4 };

	pair_admitted(r, 81, 4, lease);
	ck_assert_int_eq(l3kv_submit_restore(r[0].k, lease[0], KV_REGION, dst, 4, &ticket), 0);
	usleep(100000);		/* rank 0's copy is done; it waits for rank 1 */
	ck_assert_int_eq(l3kv_release(r[1].k, lease[1]), 0);
	test_rank_wait_completion(&r[0], &c);
	ck_assert_int_eq(c.status, -ECANCELED);
	l3kv_completion_release(&c);
	ck_assert_int_eq(l3kv_release(r[0].k, lease[0]), 0);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	test_rank_fini(&r[0]);
	test_rank_fini(&r[1]);
}
END_TEST

START_TEST(test_release_without_waiting_drops_the_pins)
{
	struct l3kv_admit_result	a;
	struct l3kv_completion		c;
	struct test_rank		r;
	uint64_t			ticket;

	solo_attach(&r);
	publish_prefix(&r, 90, 5, 0, 5);
	a = admit(&r, 1, 90, 5, 5);
	ck_assert_int_eq(l3kv_submit_release(r.k, a.lease, &ticket), 0);
	test_rank_wait_completion(&r, &c);
	ck_assert_uint_eq(c.ticket, ticket);
	ck_assert_int_eq(c.status, 0);
	ck_assert_int_eq(c.op, L3KV_OP_RELEASE);
	l3kv_completion_release(&c);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	/* The lease is gone: a second release says so. */
	ck_assert_int_eq(l3kv_release(r.k, a.lease), -ENOENT);
	test_rank_fini(&r);
}
END_TEST

/* RESTORE with L3KV_RESTORE_RELEASE (issue 16), into engine slots first..first+n-1. */
static struct l3kv_restore_args
release_args(uint64_t lease, uint32_t *dst, uint32_t first, uint32_t n)
{
	struct l3kv_restore_args	a;
	uint32_t			i;

	for (i = 0; i < n; i++)
		dst[i] = first + i;
	memset(&a, 0, sizeof(a));
	a.lease = lease;
	a.pages = dst;
	a.npages = n;
	a.region = KV_REGION;
	a.state_region = L3KV_REGION_NONE;
	a.state_slot = L3KV_SLOT_NONE;
	a.event_region = L3KV_REGION_NONE;
	a.flags = L3KV_RESTORE_RELEASE;
	return a;
}

START_TEST(test_restore_with_the_release_flag_ends_the_lease_when_it_succeeds)
{
	struct l3kv_restore_result	res;
	struct l3kv_restore_args	ra;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint32_t			dst[6], i;
	long long			releases;

	solo_attach(&r);
	publish_prefix(&r, 92, 6, 0, 6);
	a = admit(&r, 1, 92, 6, 6);
	ck_assert_uint_eq(a.admitted_pages, 6);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 6);
	releases = test_td_stat("cache", "releases");
	test_rank_sentinel(&r, KV_REGION, 40, 8);
	ra = release_args(a.lease, dst, 40, 6);
	ck_assert_int_eq(l3kv_restore_with(r.k, &ra, 5000, &res), 0);
	ck_assert_uint_eq(res.pages, 6);
	ck_assert_uint_eq(res.bytes, 6ULL * PAGE_BYTES);
	for (i = 0; i < 6; i++)
		ck_assert_msg(page_is(&r, 40 + i, 92, i), "page %u", i);
	ck_assert(test_rank_is_sentinel(&r, KV_REGION, 46, 2));
	/* Answered ok: the lease is gone and its pins with it, as after a RELEASE. */
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	ck_assert_int_eq(test_td_stat("cache", "leases_open"), 0);
	ck_assert_int_eq(test_td_stat("cache", "releases"), releases + 1);
	ck_assert_int_eq(test_td_stat("cache", "restores_ready"), 1);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), -ENOENT);
	/* The objects stay in the tier. */
	ck_assert_uint_eq(probe(&r, 92, 6), 6);
	/* An unknown flag is refused by the library before anything is sent. */
	a = admit(&r, 2, 92, 6, 6);
	ra = release_args(a.lease, dst, 40, 6);
	ra.flags = 0x2;
	ck_assert_int_eq(l3kv_restore_with(r.k, &ra, 5000, &res), -EINVAL);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_a_failed_restore_with_the_release_flag_keeps_its_lease)
{
	struct l3kv_restore_result	res;
	struct l3kv_restore_args	ra;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint32_t			dst[6];
	uint8_t				h[L3KV_HASH_LEN];

	solo_attach(&r);
	publish_prefix(&r, 93, 6, 0, 6);
	a = admit(&r, 1, 93, 6, 6);
	test_page_hash(93, 2, h);
	ck_assert_int_eq(l3kv_debug(r.k, L3KV_DEBUG_CORRUPT, 0, h), 0);
	ra = release_args(a.lease, dst, 10, 6);
	ck_assert_int_eq(l3kv_restore_with(r.k, &ra, 5000, &res), -ENODATA);
	/* As without the flag: the lease stays (failed, pinless) until RELEASE. */
	ck_assert_int_eq(test_td_stat("cache", "leases_open"), 1);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	ck_assert_int_eq(l3kv_restore_with(r.k, &ra, 5000, &res), -ENODATA);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), -ENOENT);
	test_rank_fini(&r);
}
END_TEST

START_TEST(test_the_release_flag_ends_only_the_leases_that_asked_in_a_group)
{
	struct l3kv_restore_result	res;
	struct l3kv_restore_args	ra;
	struct l3kv_completion		c;
	struct test_rank		r[2];
	uint64_t			lease[2], ticket;
	uint32_t			dst[5], dst1[5] = { 20, 21, 22, 23, 24 }, i;

	pair_admitted(r, 94, 5, lease);
	ra = release_args(lease[0], dst, 20, 5);
	ck_assert_int_eq(l3kv_submit_restore_with(r[0].k, &ra, &ticket), 0);
	ck_assert_int_eq(l3kv_restore(r[1].k, lease[1], KV_REGION, dst1, 5, 5000, &res), 0);
	ck_assert_uint_eq(res.pages, 5);
	test_rank_wait_completion(&r[0], &c);
	ck_assert_int_eq(c.status, 0);
	l3kv_completion_release(&c);
	for (i = 0; i < 5; i++) {
		ck_assert(page_is(&r[0], 20 + i, 94, i));
		ck_assert(page_is(&r[1], 20 + i, 94, i));
	}
	/* Rank 0 asked: its lease is gone; rank 1's stays ready, pinned, until RELEASE. */
	ck_assert_int_eq(test_td_stat("cache", "leases_open"), 1);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 5);
	ck_assert_int_eq(l3kv_release(r[0].k, lease[0]), -ENOENT);
	ck_assert_int_eq(l3kv_release(r[1].k, lease[1]), 0);
	test_rank_fini(&r[0]);
	test_rank_fini(&r[1]);
}
END_TEST

/*
 * Issue 13: SGLang's shm allocator makes its memfds without
 * MFD_ALLOW_SEALING. Rank r's KV region is swapped for such a memfd
 * (F_SEAL_SEAL set) before ATTACH, which accepts it unsealed.
 */
static void
unsealable_kv(struct test_rank *r)
{
	size_t	len = r->len[KV_REGION];
	int	fd = memfd_create("l3kv-test-unsealable", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_GET_SEALS), F_SEAL_SEAL);
	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	munmap(r->mem[KV_REGION], len);
	close(r->fd[KV_REGION]);
	r->fd[KV_REGION] = fd;
	r->regions[KV_REGION].fd = fd;
	r->mem[KV_REGION] = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(r->mem[KV_REGION] != MAP_FAILED);
}

/* The memfd back to its size (its pages come back zeroed). */
static void
regrow_kv(struct test_rank *r)
{
	ck_assert_int_eq(ftruncate(r->fd[KV_REGION], (off_t)r->len[KV_REGION]), 0);
}

struct shrink_arg {
	int		fd;
	unsigned	after_ms;
};

static void *
shrink_later(void *arg)
{
	const struct shrink_arg	*a = arg;

	usleep(a->after_ms * 1000);
	ck_assert_int_eq(ftruncate(a->fd, 0), 0);
	return NULL;
}

START_TEST(test_unsealable_memfd_is_accepted_and_restores_and_publishes)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	struct test_rank		r;
	uint32_t			i;

	test_rank_init(&r, &kv, "g1", 1, 0);
	unsealable_kv(&r);
	rank_attach(&r);
	publish_prefix(&r, 110, 8, 0, 8);
	a = admit(&r, 1, 110, 8, 8);
	ck_assert_uint_eq(a.admitted_pages, 8);
	test_rank_sentinel(&r, KV_REGION, 20, 8);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 20, 8, &res), 0);
	for (i = 0; i < 8; i++)
		ck_assert(page_is(&r, 20 + i, 110, i));
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);

	/* Shrunk between requests: the size check before the copy refuses it, nothing faults. */
	a = admit(&r, 2, 110, 8, 8);
	ck_assert_int_eq(ftruncate(r.fd[KV_REGION], PAGE_BYTES * 4), 0);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 20, 8, &res), -EFAULT);
	ck_assert_int_eq(l3kv_last_status(r.k), PROTO_S_BAD_REGION);
	ck_assert_msg(strstr(l3kv_last_error(r.k), "shrank") != NULL, "%s", l3kv_last_error(r.k));
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	/* Nothing was lost: the objects are all still there. */
	ck_assert_uint_eq(probe(&r, 110, 8), 8);
	ck_assert_int_eq(test_td_stat("cache", "objects_lost"), 0);

	/* Grown back, it works again. */
	regrow_kv(&r);
	a = admit(&r, 3, 110, 8, 8);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 20, 8, &res), 0);
	for (i = 0; i < 8; i++)
		ck_assert(page_is(&r, 20 + i, 110, i));
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
}
END_TEST

/*
 * A memfd truncated while a slow restore writes into it: the copy faults
 * (SIGBUS) inside the guard, the restore fails as bad_region, the daemon
 * lives and every count returns to zero; a sealed engine next to it is
 * untouched and still restores.
 */
START_TEST(test_memfd_truncated_during_a_restore_fails_it_and_the_daemon_lives)
{
	struct l3kv_restore_result	res;
	struct l3kv_completion		c;
	struct l3kv_admit_result	a, b;
	struct test_rank		r, sealed;
	struct shrink_arg		sa;
	pthread_t			t;
	uint32_t			dst[10], i;
	uint64_t			ticket;

	test_td_restart("{\"testing\": {\"copy_delay_ms\": 100, \"debug_ops\": true}}");
	test_rank_init(&r, &kv, "g1", 1, 0);
	unsealable_kv(&r);
	rank_attach(&r);
	test_rank_init(&sealed, &kv, "g2", 1, 0);
	rank_attach(&sealed);
	/* Published before the pacing matters: 10 pages at 100 ms each. */
	publish_prefix(&r, 120, 10, 0, 10);
	a = admit(&r, 1, 120, 10, 10);
	b = admit(&sealed, 1, 120, 10, 10);
	ck_assert_uint_eq(a.admitted_pages, 10);
	ck_assert_uint_eq(b.admitted_pages, 10);
	for (i = 0; i < 10; i++)
		dst[i] = 30 + i;
	ck_assert_int_eq(l3kv_submit_restore(r.k, a.lease, KV_REGION, dst, 10, &ticket), 0);
	sa = (struct shrink_arg){ r.fd[KV_REGION], 350 };
	ck_assert_int_eq(pthread_create(&t, NULL, shrink_later, &sa), 0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	test_rank_wait_completion(&r, &c);
	ck_assert_uint_eq(c.ticket, ticket);
	ck_assert_int_eq(c.status, -EFAULT);
	ck_assert_int_eq(c.proto_status, PROTO_S_BAD_REGION);
	/* The copy faulted inside the guard (the size check before it had passed). */
	ck_assert_msg(c.payload != NULL && memmem(c.payload, c.len, "faulted", 7) != NULL,
	    "%.*s", (int)c.len, c.payload != NULL ? c.payload : "");
	ck_assert_int_eq(l3kv_restore_result(&c, &res), -EINVAL);
	l3kv_completion_release(&c);
	ck_assert_int_eq(test_td_stat("copy", "jobs_inflight"), 0);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 1 * 10);	/* the sealed rank's lease */
	ck_assert_int_eq(test_td_stat("cache", "objects_lost"), 0);
	ck_assert_int_eq(test_td_stat("cache", "pages_restored"), 0);
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);

	/* The daemon lives, and the sealed engine restores as before. */
	test_rank_sentinel(&sealed, KV_REGION, 30, 10);
	ck_assert_int_eq(test_rank_restore(&sealed, b.lease, 30, 10, &res), 0);
	for (i = 0; i < 10; i++)
		ck_assert(page_is(&sealed, 30 + i, 120, i));
	ck_assert_int_eq(l3kv_release(sealed.k, b.lease), 0);
	ck_assert_int_eq(test_td_stat("dram", "pins"), 0);
	test_rank_fini(&sealed);
	test_rank_fini(&r);
}
END_TEST

/* The same during a slow PUBLISH: it fails as bad_region and stores nothing. */
START_TEST(test_memfd_truncated_during_a_publish_fails_it_and_stores_nothing)
{
	struct l3kv_publish_page	pg[10];
	struct l3kv_publish_result	pr;
	struct l3kv_completion		c;
	struct test_rank		r;
	struct shrink_arg		sa;
	pthread_t			t;
	uint64_t			ticket;
	uint32_t			i;

	test_td_restart("{\"testing\": {\"copy_delay_ms\": 100, \"debug_ops\": true}}");
	test_rank_init(&r, &kv, "g1", 1, 0);
	unsealable_kv(&r);
	rank_attach(&r);
	for (i = 0; i < 10; i++) {
		test_rank_fill_page(&r, KV_REGION, i, 130, i);
		test_page_hash(130, i, pg[i].hash);
		pg[i].src_page = i;
	}
	ck_assert_int_eq(l3kv_submit_publish(r.k, KV_REGION, pg, 10, &ticket), 0);
	sa = (struct shrink_arg){ r.fd[KV_REGION], 350 };
	ck_assert_int_eq(pthread_create(&t, NULL, shrink_later, &sa), 0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	test_rank_wait_completion(&r, &c);
	ck_assert_uint_eq(c.ticket, ticket);
	ck_assert_int_eq(c.status, -EFAULT);
	ck_assert_int_eq(c.proto_status, PROTO_S_BAD_REGION);
	ck_assert_msg(c.payload != NULL && memmem(c.payload, c.len, "faulted", 7) != NULL,
	    "%.*s", (int)c.len, c.payload != NULL ? c.payload : "");
	ck_assert_int_eq(l3kv_publish_result(&c, &pr), -EINVAL);
	l3kv_completion_release(&c);
	ck_assert_int_eq(test_td_stat("copy", "jobs_inflight"), 0);
	ck_assert_int_eq(test_td_stat("dram", "writing"), 0);
	ck_assert_int_eq(test_td_stat("cache", "pages_published"), 0);
	/* Nothing became visible, and the daemon serves on. */
	ck_assert_uint_eq(probe(&r, 130, 10), 0);
	regrow_kv(&r);
	publish_prefix(&r, 131, 2, 0, 2);
	ck_assert_uint_eq(probe(&r, 131, 2), 2);
	test_rank_fini(&r);
}
END_TEST

Suite *
suite_cache(void)
{
	Suite	*s = suite_create("cache");
	TCase	*tc = test_tcase(s, "dram", 60, setup, teardown);

	tcase_add_test(tc, test_publish_then_restore_lands_the_exact_bytes);
	tcase_add_test(tc, test_promise_never_exceeds_the_reservation);
	tcase_add_test(tc, test_probe_changes_nothing);
	tcase_add_test(tc, test_eviction_pressure_never_evicts_a_leased_object);
	tcase_add_test(tc, test_object_corrupted_after_admit_fails_the_restore);
	tcase_add_test(tc, test_object_deleted_after_admit_fails_the_restore);
	tcase_add_test(tc, test_out_of_bounds_destination_is_refused_with_nothing_written);
	tcase_add_test(tc, test_duplicate_publish_is_present_not_rewritten);
	tcase_add_test(tc, test_publish_with_bad_source_indices_stores_nothing);
	tcase_add_test(tc, test_publish_without_space_stores_nothing);
	tcase_add_test(tc, test_cancel_during_slow_copy_is_answered_after_the_copy);
	tcase_add_test(tc, test_three_concurrent_restores_land_the_right_bytes);
	tcase_add_test(tc, test_engine_killed_mid_restore_leaves_no_pins);
	tcase_add_test(tc, test_group_of_four_gets_identical_answers);
	tcase_add_test(tc, test_missing_rank_makes_admit_decline_for_all_at_the_deadline);
	tcase_add_test(tc, test_admits_waiting_at_the_barrier_are_capped_per_rank);
	tcase_add_test(tc, test_admit_waiting_at_the_barrier_is_declined_at_detach);
	tcase_add_test(tc, test_dram_size_is_rounded_down_and_said_at_start);
	tcase_add_test(tc, test_lease_expires_and_restore_says_expired);
	tcase_add_test(tc, test_leases_expire_in_admission_order_each_after_its_ttl);
	tcase_add_test(tc, test_best_effort_ends_at_its_deadline_with_whole_pages);
	tcase_add_test(tc, test_debug_is_refused_without_the_testing_knob);
	tcase_add_test(tc, test_a_lost_page_on_one_rank_fails_every_rank);
	tcase_add_test(tc, test_a_rank_releasing_fails_the_waiting_rank);
	tcase_add_test(tc, test_release_without_waiting_drops_the_pins);
	tcase_add_test(tc, test_restore_with_the_release_flag_ends_the_lease_when_it_succeeds);
	tcase_add_test(tc, test_a_failed_restore_with_the_release_flag_keeps_its_lease);
	tcase_add_test(tc, test_the_release_flag_ends_only_the_leases_that_asked_in_a_group);
	tcase_add_test(tc, test_unsealable_memfd_is_accepted_and_restores_and_publishes);
	tcase_add_test(tc, test_memfd_truncated_during_a_restore_fails_it_and_the_daemon_lives);
	tcase_add_test(tc, test_memfd_truncated_during_a_publish_fails_it_and_stores_nothing);
	return s;
}
