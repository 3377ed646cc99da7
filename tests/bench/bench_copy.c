/*
 * The host copy engine alone (daemon/copy.c), against memmove of the same
 * bytes by the same number of threads: RESTORE (DRAM objects verified
 * against their checksums, then written into a memfd region at scattered
 * page slots) and PUBLISH (region pages copied into objects and
 * checksummed), for each page size and worker count. One job moves the
 * whole working set, as one large RESTORE or PUBLISH does; the region is
 * an unsealed memfd, as SGLang's shm pool is, so the engine's size check
 * and fault guard are on the measured path. Every run is verified after
 * it is timed: restored bytes compared, published checksums recomputed.
 *
 *   bench_copy [-m MiB] [-t 1,2,4,8,16] [-s 36864,2248704] [-r reps]
 *
 * -m: bytes moved per run (default 256 MiB; each of the arena and the
 * region holds that much); -t: worker (= memmove thread) counts; -s: page
 * sizes in bytes (36 KiB: MLA FP8 64 tokens x 576 B; 2248704: the same
 * for 61 layers, "2.25 MB"); -r: timed runs per cell, the median reported.
 */
#include <sys/mman.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"
#include "bench.h"

#define BENCH_MAX_LIST	16
#define BENCH_MAX_REPS	31

static int
bench_list(const char *s, uint64_t *out, int max)
{
	char	*end;
	int	 n = 0;

	while (*s != '\0' && n < max) {
		out[n++] = strtoull(s, &end, 0);
		if (end == s || out[n - 1] == 0)
			return -1;
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

struct bench {
	uint8_t			*arena;		/* objects, back to back */
	uint8_t			*mem;		/* the region's mapping */
	struct region		 reg;
	uint64_t		 len;		/* one page */
	uint32_t		 npages;
	uint32_t		*perm;		/* object i <-> region page perm[i] */
	uint64_t		*sums;		/* checksum_obj of object i */
};

/* memmove threads: each moves a contiguous share of the pages, page by page. */
struct bench_mm {
	struct bench		*b;
	pthread_barrier_t	*start, *end;
	int			 idx, n, to_region, rounds;
};

static void *
bench_mm_thread(void *arg)
{
	struct bench_mm	*m = arg;
	struct bench	*b = m->b;
	uint32_t	 per = (b->npages + (uint32_t)m->n - 1) / (uint32_t)m->n, i, first, last;
	int		 r;

	first = per * (uint32_t)m->idx;
	last = first + per > b->npages ? b->npages : first + per;
	for (r = 0; r < m->rounds; r++) {
		pthread_barrier_wait(m->start);
		for (i = first; i < last; i++) {
			uint8_t	*o = b->arena + (uint64_t)i * b->len;
			uint8_t	*p = b->mem + (uint64_t)b->perm[i] * b->len;

			if (m->to_region)
				memmove(p, o, b->len);
			else
				memmove(o, p, b->len);
		}
		pthread_barrier_wait(m->end);
	}
	return NULL;
}

/* The median GB/s of memmove by n threads, reps runs (after one warm-up). */
static double
bench_memmove(struct bench *b, int n, int to_region, int reps)
{
	pthread_barrier_t	 start, end;
	struct bench_mm		*m = calloc((size_t)n, sizeof(*m));
	pthread_t		*t = calloc((size_t)n, sizeof(*t));
	double			 secs[BENCH_MAX_REPS + 1], t0;
	int			 i, r;

	if (m == NULL || t == NULL)
		exit(1);
	pthread_barrier_init(&start, NULL, (unsigned)n + 1);
	pthread_barrier_init(&end, NULL, (unsigned)n + 1);
	for (i = 0; i < n; i++) {
		m[i] = (struct bench_mm){ b, &start, &end, i, n, to_region, reps + 1 };
		pthread_create(&t[i], NULL, bench_mm_thread, &m[i]);
	}
	for (r = 0; r <= reps; r++) {
		pthread_barrier_wait(&start);
		t0 = bench_now();
		pthread_barrier_wait(&end);
		secs[r] = bench_now() - t0;
	}
	for (i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&start);
	pthread_barrier_destroy(&end);
	free(m);
	free(t);
	return (double)b->npages * (double)b->len / bench_median(secs + 1, reps) / 1e9;
}

static void
bench_job_done(struct copy_job *job)
{
	*(int *)job->arg = 1;
}

/* One job of every page through the engine; its seconds, submit to completion. */
static double
bench_engine_run(struct event_base *base, struct copy_engine *ce, struct bench *b, int kind)
{
	struct copy_job	 job;
	double		 t0, secs;
	uint32_t	 i;
	int		 done = 0;

	memset(&job, 0, sizeof(job));
	job.kind = kind;
	job.geom = &b->reg.desc;
	job.base = b->reg.base;
	job.region = &b->reg;
	job.npages = b->npages;
	job.done = bench_job_done;
	job.arg = &done;
	if ((job.pages = calloc(b->npages, sizeof(*job.pages))) == NULL)
		exit(1);
	for (i = 0; i < b->npages; i++) {
		job.pages[i].obj = b->arena + (uint64_t)i * b->len;
		job.pages[i].len = b->len;
		job.pages[i].checksum = kind == COPY_RESTORE ? b->sums[i] : 0;
		job.pages[i].region_page = b->perm[i];
	}
	t0 = bench_now();
	copy_host_submit(ce, &job);
	while (!done)
		event_base_loop(base, EVLOOP_ONCE);
	secs = bench_now() - t0;
	if (job.status != PROTO_S_OK) {
		fprintf(stderr, "bench_copy: %s job failed: status %d (%s)\n",
		    kind == COPY_RESTORE ? "restore" : "publish", job.status, job.why);
		exit(1);
	}
	/* Verified after timing: the bytes restored, the checksums published. */
	for (i = 0; i < b->npages; i++) {
		const uint8_t	*o = b->arena + (uint64_t)i * b->len;
		const uint8_t	*p = b->mem + (uint64_t)b->perm[i] * b->len;

		if (kind == COPY_RESTORE ? memcmp(o, p, b->len) != 0 :
		    job.pages[i].checksum != b->sums[i] || checksum_obj(o, b->len) != b->sums[i]) {
			fprintf(stderr, "bench_copy: %s page %u does not verify\n",
			    kind == COPY_RESTORE ? "restore" : "publish", i);
			exit(1);
		}
	}
	free(job.pages);
	return secs;
}

static double
bench_engine(struct bench *b, int n, int kind, int reps)
{
	struct event_base	*base = event_base_new();
	struct copy_engine	*ce = NULL;
	double			 secs[BENCH_MAX_REPS + 1];
	char			 err[256];
	int			 r;

	if (base == NULL || copy_engine_new(base, n, 0, &ce, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_copy: copy engine: %s\n", err);
		exit(1);
	}
	for (r = 0; r <= reps; r++)
		secs[r] = bench_engine_run(base, ce, b, kind);
	copy_engine_free(ce);
	event_base_free(base);
	return (double)b->npages * (double)b->len / bench_median(secs + 1, reps) / 1e9;
}

/* Arena and region for npages pages of len bytes: filled, faulted in, shuffled slots. */
static void
bench_setup(struct bench *b, uint64_t len, uint32_t npages)
{
	uint64_t	total = len * npages, x = 0x9e3779b97f4a7c15ULL, i;
	int		fd;

	memset(b, 0, sizeof(*b));
	b->len = len;
	b->npages = npages;
	b->arena = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	/* No MFD_ALLOW_SEALING: the unsealed path SGLang's pool takes (fstat, guard). */
	fd = memfd_create("bench-copy", MFD_CLOEXEC);
	if (b->arena == MAP_FAILED || fd < 0 || ftruncate(fd, (off_t)total) != 0) {
		fprintf(stderr, "bench_copy: %llu bytes: %s\n", (unsigned long long)total,
		    strerror(errno));
		exit(1);
	}
	b->mem = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (b->mem == MAP_FAILED)
		exit(1);
	for (i = 0; i < total / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(b->arena + i * 8, &x, 8);
	}
	memset(b->mem, 0, total);
	b->perm = calloc(npages, sizeof(*b->perm));
	b->sums = calloc(npages, sizeof(*b->sums));
	if (b->perm == NULL || b->sums == NULL)
		exit(1);
	for (i = 0; i < npages; i++) {
		b->perm[i] = (uint32_t)i;
		b->sums[i] = checksum_obj(b->arena + i * len, len);
	}
	for (i = npages - 1; i > 0; i--) {
		uint64_t	j;
		uint32_t	t;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		j = x % (i + 1);
		t = b->perm[i];
		b->perm[i] = b->perm[j];
		b->perm[j] = t;
	}
	/* One page_first region: a page is one run, as SGLang's MLA pool is. */
	b->reg.desc = (struct proto_region){ .kind = PROTO_MEM_MEMFD,
	    .layout = PROTO_LAYOUT_PAGE_FIRST, .size = total, .num_pages = npages,
	    .page_tokens = 1, .layers = 1, .token_bytes = (uint32_t)len, .page_stride = len,
	    .layer_stride = len, .token_stride = len };
	b->reg.map = b->mem;
	b->reg.map_len = total;
	b->reg.base = b->mem;
	b->reg.fd = fd;
	b->reg.sealed = 0;
}

static void
bench_teardown(struct bench *b)
{
	munmap(b->arena, b->len * b->npages);
	munmap(b->mem, b->len * b->npages);
	close(b->reg.fd);
	free(b->perm);
	free(b->sums);
}

static void
bench_usage(void)
{
	fprintf(stderr, "usage: bench_copy [-m MiB] [-t 1,2,4,8,16] [-s 36864,2248704] [-r reps]\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	uint64_t	threads[BENCH_MAX_LIST] = { 1, 2, 4, 8, 16 };
	uint64_t	sizes[BENCH_MAX_LIST] = { 36864, 2248704 };
	uint64_t	mib = 256;
	int		nthreads = 5, nsizes = 2, reps = 5, si, ti, c;
	struct bench	b;

	while ((c = getopt(argc, argv, "m:t:s:r:")) != -1) {
		switch (c) {
		case 'm':
			mib = strtoull(optarg, NULL, 0);
			break;
		case 't':
			if ((nthreads = bench_list(optarg, threads, BENCH_MAX_LIST)) <= 0)
				bench_usage();
			break;
		case 's':
			if ((nsizes = bench_list(optarg, sizes, BENCH_MAX_LIST)) <= 0)
				bench_usage();
			break;
		case 'r':
			reps = atoi(optarg);
			if (reps < 1 || reps > BENCH_MAX_REPS)
				bench_usage();
			break;
		default:
			bench_usage();
		}
	}
	if (mib == 0)
		bench_usage();
	log_init(LOG_LEVEL_WARN);
	printf("host copy engine vs memmove, %llu MiB per run, median of %d, %ld CPUs online\n",
	    (unsigned long long)mib, reps, sysconf(_SC_NPROCESSORS_ONLN));
	printf("%-10s %7s | %12s %12s %6s | %12s %12s %6s\n", "page", "threads", "restore GB/s",
	    "memmove GB/s", "ratio", "publish GB/s", "memmove GB/s", "ratio");
	for (si = 0; si < nsizes; si++) {
		uint32_t	npages = (uint32_t)((mib << 20) / sizes[si]);

		if (npages == 0)
			npages = 1;
		bench_setup(&b, sizes[si], npages);
		for (ti = 0; ti < nthreads; ti++) {
			int	n = (int)threads[ti];
			double	rs = bench_engine(&b, n, COPY_RESTORE, reps);
			double	rm = bench_memmove(&b, n, 1, reps);
			double	ps = bench_engine(&b, n, COPY_PUBLISH, reps);
			double	pm = bench_memmove(&b, n, 0, reps);

			printf("%-10llu %7d | %12.2f %12.2f %6.2f | %12.2f %12.2f %6.2f\n",
			    (unsigned long long)sizes[si], n, rs, rm, rs / rm, ps, pm, ps / pm);
			fflush(stdout);
		}
		bench_teardown(&b);
	}
	return 0;
}
