/*
 * The host copy engine (copy.c) and the worker-to-loop queue (workq.c)
 * on their own, without a daemon: jobs large enough to be split into runs
 * over every worker land every byte and compute the tier's checksum; a
 * corrupt object, a cancel and a memfd truncated under the copy each
 * stop the whole job with its status, done_pages the contiguous prefix in
 * place; a completion queue runs at most its batch per wakeup.
 */
#include <sys/mman.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"
#include "tests.h"

#define CP_PAGE		(100U << 10)	/* 100 KiB: two chunks and a short one */
#define CP_PAGES	64		/* 6.25 MiB: runs on every worker */
#define CP_WORKERS	4

struct cp {
	struct event_base	*base;
	struct copy_engine	*ce;
	uint8_t			*arena;
	uint8_t			*mem;
	struct region		 reg;
	struct copy_job		 job;
	uint32_t		 page;		/* bytes of a page */
	int			 done;
};

static void
cp_done(struct copy_job *job)
{
	*(int *)job->arg = 1;
}

/* An engine of CP_WORKERS workers; an arena of random objects; an unsealed memfd region. */
static void
cp_init_page(struct cp *c, unsigned delay_ms, uint32_t page)
{
	char		err[256];
	uint64_t	x = 88172645463325252ULL, i, len = (uint64_t)page * CP_PAGES;
	int		fd;

	memset(c, 0, sizeof(*c));
	c->page = page;
	c->base = event_base_new();
	ck_assert_ptr_nonnull(c->base);
	ck_assert_int_eq(copy_engine_new(c->base, CP_WORKERS, delay_ms, &c->ce, err, sizeof(err)),
	    0);
	c->arena = malloc(len);
	ck_assert_ptr_nonnull(c->arena);
	for (i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		c->arena[i] = (uint8_t)x;
	}
	fd = memfd_create("check-copy", MFD_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	c->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(c->mem != MAP_FAILED);
	c->reg.desc = (struct proto_region){ .kind = PROTO_MEM_MEMFD,
	    .layout = PROTO_LAYOUT_PAGE_FIRST, .size = len, .num_pages = CP_PAGES,
	    .page_tokens = 1, .layers = 1, .token_bytes = page, .page_stride = page,
	    .layer_stride = page, .token_stride = page };
	c->reg.map = c->mem;
	c->reg.map_len = len;
	c->reg.base = c->mem;
	c->reg.fd = fd;
	c->reg.sealed = 0;
}

static void
cp_init(struct cp *c, unsigned delay_ms)
{
	cp_init_page(c, delay_ms, CP_PAGE);
}

static void
cp_fini(struct cp *c)
{
	copy_engine_free(c->ce);
	event_base_free(c->base);
	munmap(c->mem, (size_t)c->page * CP_PAGES);
	close(c->reg.fd);
	free(c->arena);
	free(c->job.pages);
}

/* A job of every page: object i <-> region page CP_PAGES - 1 - i. */
static void
cp_job(struct cp *c, int kind)
{
	uint32_t	i;

	free(c->job.pages);
	memset(&c->job, 0, sizeof(c->job));
	c->job.kind = kind;
	c->job.geom = &c->reg.desc;
	c->job.base = c->reg.base;
	c->job.region = &c->reg;
	c->job.npages = CP_PAGES;
	c->job.done = cp_done;
	c->job.arg = &c->done;
	c->job.pages = calloc(CP_PAGES, sizeof(*c->job.pages));
	ck_assert_ptr_nonnull(c->job.pages);
	for (i = 0; i < CP_PAGES; i++) {
		struct copy_page *pg = &c->job.pages[i];

		pg->obj = c->arena + (uint64_t)i * c->page;
		pg->len = c->page;
		pg->checksum = checksum_obj(pg->obj, c->page);
		pg->region_page = CP_PAGES - 1 - i;
	}
	c->done = 0;
}

static void
cp_run(struct cp *c)
{
	copy_host_submit(c->ce, &c->job);
	ck_assert_uint_eq(copy_inflight(c->ce), 1);
	while (!c->done)
		event_base_loop(c->base, EVLOOP_ONCE);
	ck_assert_uint_eq(copy_inflight(c->ce), 0);
}

static int
cp_page_landed(const struct cp *c, uint32_t i)
{
	return memcmp(c->mem + (uint64_t)(CP_PAGES - 1 - i) * c->page,
	    c->arena + (uint64_t)i * c->page, c->page) == 0;
}

START_TEST(test_a_split_restore_lands_every_page_and_a_split_publish_sums_them)
{
	struct cp	c;
	uint32_t	i;

	cp_init(&c, 0);
	cp_job(&c, COPY_RESTORE);
	cp_run(&c);
	ck_assert_int_eq(c.job.status, PROTO_S_OK);
	ck_assert_uint_gt(c.job.npieces, 1);
	ck_assert_uint_eq(c.job.done_pages, CP_PAGES);
	for (i = 0; i < CP_PAGES; i++)
		ck_assert_msg(cp_page_landed(&c, i), "page %u", i);
	/* Publish back into a zeroed arena: the same bytes, the tier's checksum. */
	memset(c.arena, 0, (size_t)c.page * CP_PAGES);
	cp_job(&c, COPY_PUBLISH);
	cp_run(&c);
	ck_assert_int_eq(c.job.status, PROTO_S_OK);
	for (i = 0; i < CP_PAGES; i++) {
		ck_assert_msg(cp_page_landed(&c, i), "page %u", i);
		ck_assert_uint_eq(c.job.pages[i].checksum,
		    checksum_obj(c.arena + (uint64_t)i * c.page, c.page));
	}
	cp_fini(&c);
}
END_TEST

/* The peer tier's digest job: every object's checksum, split over the workers, nothing moved. */
START_TEST(test_a_digest_job_sums_every_object_and_moves_nothing)
{
	struct cp	c;
	uint8_t		*before;
	uint32_t	i;

	cp_init(&c, 0);
	memset(c.mem, 0xa5, (size_t)c.page * CP_PAGES);
	c.arena[(uint64_t)7 * c.page + 99] ^= 1;	/* object 7 is not what it was */
	before = malloc((size_t)c.page * CP_PAGES);
	ck_assert_ptr_nonnull(before);
	memcpy(before, c.arena, (size_t)c.page * CP_PAGES);
	cp_job(&c, COPY_DIGEST);
	c.job.geom = NULL;
	c.job.base = NULL;
	c.job.region = NULL;
	for (i = 0; i < CP_PAGES; i++)
		c.job.pages[i].checksum = 0;
	cp_run(&c);
	ck_assert_int_eq(c.job.status, PROTO_S_OK);
	ck_assert_uint_gt(c.job.npieces, 1);
	for (i = 0; i < CP_PAGES; i++)
		ck_assert_msg(c.job.pages[i].checksum ==
		    checksum_obj(c.arena + (uint64_t)i * c.page, c.page), "object %u", i);
	ck_assert(memcmp(before, c.arena, (size_t)c.page * CP_PAGES) == 0);
	for (i = 0; i < (uint32_t)c.page * CP_PAGES; i++)
		ck_assert_msg(c.mem[i] == 0xa5, "the region was written at %u", i);
	free(before);
	cp_fini(&c);
}
END_TEST

START_TEST(test_publish_checksum_is_the_tiers_for_every_length)
{
	static const uint64_t	lens[] = { 1, 4095, 65536, 65537, 131072, 2248704, 5U << 20,
					   (9U << 20) + 3 };
	uint8_t			*src = malloc(10U << 20), *dst = malloc(10U << 20);
	size_t			 i;

	ck_assert(src != NULL && dst != NULL);
	for (i = 0; i < (10U << 20); i++)
		src[i] = (uint8_t)(i * 131 + (i >> 9));
	for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		memset(dst, 0, lens[i]);
		ck_assert_uint_eq(copy_page_publish(dst, src, lens[i]), checksum_obj(src, lens[i]));
		ck_assert(memcmp(dst, src, lens[i]) == 0);
	}
	free(src);
	free(dst);
}
END_TEST

START_TEST(test_a_corrupt_object_fails_a_split_restore_and_is_named)
{
	struct cp	c;
	uint32_t	i, bad = CP_PAGES / 2 + 3;

	cp_init(&c, 0);
	cp_job(&c, COPY_RESTORE);
	c.job.pages[bad].checksum ^= 1;
	cp_run(&c);
	ck_assert_int_eq(c.job.status, PROTO_S_LOST);
	ck_assert_uint_eq(c.job.bad_page, bad);
	/* The prefix reported is in place; the corrupt page never landed. */
	ck_assert_uint_le(c.job.done_pages, bad);
	for (i = 0; i < c.job.done_pages; i++)
		ck_assert_msg(cp_page_landed(&c, i), "page %u", i);
	ck_assert(!cp_page_landed(&c, bad));
	cp_fini(&c);
}
END_TEST

/* Pages over 256 KiB are verified as they are copied: one pass, still never a success. */
START_TEST(test_large_pages_restore_in_one_pass_and_a_corrupt_one_fails)
{
	struct cp	c;
	uint32_t	i, bad = 40;

	cp_init_page(&c, 0, (2248704 / 64) * 64);
	cp_job(&c, COPY_RESTORE);
	cp_run(&c);
	ck_assert_int_eq(c.job.status, PROTO_S_OK);
	for (i = 0; i < CP_PAGES; i++)
		ck_assert_msg(cp_page_landed(&c, i), "page %u", i);
	memset(c.mem, 0, (size_t)c.page * CP_PAGES);
	cp_job(&c, COPY_RESTORE);
	c.job.pages[bad].checksum ^= 1;
	cp_run(&c);
	ck_assert_int_eq(c.job.status, PROTO_S_LOST);
	ck_assert_uint_eq(c.job.bad_page, bad);
	ck_assert_uint_le(c.job.done_pages, bad);
	for (i = 0; i < c.job.done_pages; i++)
		ck_assert_msg(cp_page_landed(&c, i), "page %u", i);
	cp_fini(&c);
}
END_TEST

/* The restore pipeline's step: the chunk's digest, and the bytes written between its slices. */
START_TEST(test_the_digest_that_writes_between_its_slices_is_the_chunks)
{
	static const size_t	lens[] = { 1, 240, 241, 4095, 8191, 8192, 8193, 36864, 40000,
				   65535, 65536 };
	static const size_t	wlens[] = { 1, 100, 4096, 36864, 65536, 100000 };
	uint8_t			*src = malloc(1U << 18), *w = malloc(1U << 18), *d = malloc(1U << 18);
	size_t			 i, j;

#if defined(__x86_64__)
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2")) {
		fprintf(stderr, "SKIPPED test_the_digest_that_writes_between_its_slices_is_the_"
		    "chunks: the CPU has no AVX2 (copy_csum_avx2_write is not used here)\n");
		free(src);
		free(w);
		free(d);
		return;
	}
#endif
	ck_assert(src != NULL && w != NULL && d != NULL);
	for (i = 0; i < (1U << 18); i++) {
		src[i] = (uint8_t)(i * 131 + (i >> 9));
		w[i] = (uint8_t)(i * 7 + 3);
	}
	for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		for (j = 0; j < sizeof(wlens) / sizeof(wlens[0]); j++) {
			memset(d, 0, 1U << 18);
			/* An odd destination: the stores' head and tail. */
			ck_assert_uint_eq(copy_csum_avx2_write(src + 3, lens[i], w + 5, d + 1,
			    wlens[j]), checksum_chunk(src + 3, lens[i]));
			ck_assert_msg(memcmp(d + 1, w + 5, wlens[j]) == 0, "%zu %zu", lens[i],
			    wlens[j]);
			ck_assert_uint_eq(d[0], 0);
			ck_assert_uint_eq(d[1 + wlens[j]], 0);
		}
	}
	free(src);
	free(w);
	free(d);
}
END_TEST

/*
 * A memfd shorter than the pages written, with no delay (the pipeline: a
 * page lands while the next is hashed): the fault is in page 20's write.
 * As one run (24 pages of 36 KiB, under COPY_PIECE_MIN), exactly 20 pages
 * are reported, all in place; split into runs (large pages, one pass),
 * the others stop at their next page, so at most 20, all in place.
 */
START_TEST(test_a_fault_in_a_pipelined_restore_stops_at_the_page_that_faulted)
{
	struct cp	c;
	uint32_t	i, k = 20;
	int		size;

	for (size = 0; size < 2; size++) {
		cp_init_page(&c, 0, size == 0 ? 36864 : (2248704 / 64) * 64);
		cp_job(&c, COPY_RESTORE);
		if (size == 0)
			c.job.npages = 24;
		for (i = 0; i < c.job.npages; i++)
			c.job.pages[i].region_page = i;
		ck_assert_int_eq(ftruncate(c.reg.fd, (off_t)c.page * k), 0);
		c.reg.desc.size = (uint64_t)c.page * k;	/* the size check passes */
		cp_run(&c);
		ck_assert_int_eq(c.job.status, PROTO_S_BAD_REGION);
		ck_assert_msg(strstr(c.job.why, "faulted") != NULL, "%s", c.job.why);
		if (size == 0) {
			ck_assert_uint_eq(c.job.npieces, 1);
			ck_assert_msg(c.job.done_pages == k && c.job.bad_page == k,
			    "%u pages, bad %u: %s", c.job.done_pages, c.job.bad_page, c.job.why);
		}
		ck_assert_uint_le(c.job.done_pages, k);
		for (i = 0; i < c.job.done_pages; i++)
			ck_assert_msg(memcmp(c.mem + (uint64_t)i * c.page,
			    c.arena + (uint64_t)i * c.page, c.page) == 0, "page %u", i);
		cp_fini(&c);
	}
}
END_TEST

START_TEST(test_a_cancelled_split_restore_reports_its_landed_prefix)
{
	struct cp	c;
	uint32_t	i;

	cp_init(&c, 0);
	cp_job(&c, COPY_RESTORE);
	copy_cancel(&c.job);	/* before any run starts: nothing lands */
	cp_run(&c);
	ck_assert_int_eq(c.job.status, PROTO_S_CANCELLED);
	ck_assert_uint_eq(c.job.done_pages, 0);
	for (i = 0; i < CP_PAGES; i++)
		ck_assert(!cp_page_landed(&c, i));
	cp_fini(&c);
}
END_TEST

static void *
cp_shrink(void *arg)
{
	struct cp	*c = arg;

	usleep(120000);
	ck_assert_int_eq(ftruncate(c->reg.fd, (off_t)c->page * 2), 0);
	return NULL;
}

/* copy_delay_ms paces one run; the memfd shrinks under it: SIGBUS in the guard. */
START_TEST(test_a_memfd_shrunk_under_a_copy_fails_the_job_not_the_process)
{
	struct cp	c;
	pthread_t	t;
	int		kind;

	for (kind = COPY_RESTORE; kind <= COPY_PUBLISH; kind++) {
		cp_init(&c, 50);
		cp_job(&c, kind);
		ck_assert_int_eq(pthread_create(&t, NULL, cp_shrink, &c), 0);
		cp_run(&c);
		ck_assert_int_eq(pthread_join(t, NULL), 0);
		ck_assert_int_eq(c.job.status, PROTO_S_BAD_REGION);
		ck_assert_msg(strstr(c.job.why, "faulted") != NULL, "%s", c.job.why);
		ck_assert_uint_lt(c.job.done_pages, CP_PAGES);
		/* Shrunk before it starts: the size check refuses it, nothing faults. */
		cp_job(&c, kind);
		cp_run(&c);
		ck_assert_int_eq(c.job.status, PROTO_S_BAD_REGION);
		ck_assert_msg(strstr(c.job.why, "shrank") != NULL, "%s", c.job.why);
		ck_assert_uint_eq(c.job.done_pages, 0);
		cp_fini(&c);
	}
}
END_TEST

/* A SIGBUS outside any guarded copy is not swallowed: the default action kills. */
START_TEST(test_a_fault_outside_the_guard_still_kills)
{
	struct cp	c;

	cp_init(&c, 0);
	ck_assert_int_eq(ftruncate(c.reg.fd, 0), 0);
	c.mem[0] = 1;	/* SIGBUS here, on this thread, outside any guard */
	cp_fini(&c);
}
END_TEST

struct wq_item {
	struct workq_entry	 e;
	int			 n;
};

struct wq_state {
	int		 ran;
	int		 last;
	int		 wakes;
	int		 order_ok;
};

static void
wq_done(struct workq_entry *e, void *arg)
{
	struct wq_state	*st = arg;
	struct wq_item	*it = WORKQ_ITEM(e, struct wq_item, e);

	st->order_ok &= it->n == st->last + 1;
	st->last = it->n;
	st->ran++;
}

static void
wq_wake(void *arg)
{
	((struct wq_state *)arg)->wakes++;
}

START_TEST(test_workq_runs_in_order_at_most_its_batch_per_wakeup)
{
	struct event_base	*base = event_base_new();
	struct wq_state		 st = { 0, -1, 0, 1 };
	struct wq_item		 items[200];
	struct workq		*q;
	char			 err[128];
	int			 i;

	ck_assert_int_eq(workq_new(base, "test", 64, wq_done, wq_wake, &st, &q, err, sizeof(err)),
	    0);
	for (i = 0; i < 200; i++) {
		items[i].n = i;
		workq_push(q, &items[i].e);
	}
	event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	ck_assert_int_eq(st.ran, 64);
	ck_assert_int_eq(st.wakes, 1);
	while (st.ran < 200)
		event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	ck_assert_int_eq(st.wakes, 4);	/* 64 + 64 + 64 + 8 */
	ck_assert(st.order_ok);
	/* A foreign notifier writing the fd runs the wake hook alone. */
	ck_assert_int_eq(write(workq_fd(q), &(uint64_t){ 1 }, 8), 8);
	event_base_loop(base, EVLOOP_ONCE);
	ck_assert_int_eq(st.wakes, 5);
	ck_assert_int_eq(st.ran, 200);
	workq_free(q);
	event_base_free(base);
}
END_TEST

Suite *
suite_copy(void)
{
	Suite	*s = suite_create("copy");
	TCase	*tc = test_tcase(s, "host", 30, NULL, NULL);

	tcase_add_test(tc, test_a_split_restore_lands_every_page_and_a_split_publish_sums_them);
	tcase_add_test(tc, test_a_digest_job_sums_every_object_and_moves_nothing);
	tcase_add_test(tc, test_publish_checksum_is_the_tiers_for_every_length);
	tcase_add_test(tc, test_a_corrupt_object_fails_a_split_restore_and_is_named);
	tcase_add_test(tc, test_large_pages_restore_in_one_pass_and_a_corrupt_one_fails);
	tcase_add_test(tc, test_the_digest_that_writes_between_its_slices_is_the_chunks);
	tcase_add_test(tc, test_a_fault_in_a_pipelined_restore_stops_at_the_page_that_faulted);
	tcase_add_test(tc, test_a_cancelled_split_restore_reports_its_landed_prefix);
	tcase_add_test(tc, test_a_memfd_shrunk_under_a_copy_fails_the_job_not_the_process);
	tcase_add_test_raise_signal(tc, test_a_fault_outside_the_guard_still_kills, SIGBUS);
	tcase_add_test(tc, test_workq_runs_in_order_at_most_its_batch_per_wakeup);
	return s;
}
