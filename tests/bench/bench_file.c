/*
 * File-tier benchmark: restores through the file tier's read path (open,
 * read, header check and checksum, into 4096-aligned staging buffers)
 * against a raw O_DIRECT io_uring read loop over the same files, side by
 * side in one run, cold (page cache dropped before every measurement,
 * when root) and warm, as the median of RUNS runs each. The raw loop is
 * the device's limit: files opened before the clock starts, whole files
 * read with the same number of reads in flight, nothing checked. A second
 * raw column opens and closes each file inside the loop, as any reader of
 * files by name must. Also: the startup scan of many small objects, its
 * time and its memory.
 *
 *   bench_file -d DIR [-s SIZES] [-t MIB] [-r RUNS] [-R READERS] [-q DEPTH] [-F FDS] [-b] [-O]
 *   bench_file -d DIR --gpu [-s SIZES] [-t MIB] [-r RUNS] [-R READERS] [-q DEPTH] [-F FDS]
 *   bench_file -d DIR -S OBJECTS [-l LEN] [-T SCAN_THREADS]
 *   bench_file -d DIR -P OBJECTS [-l LEN] [-m DRAM_MIB]
 *
 * -s sizes in KiB, comma separated (default 2304,256,36: MLA FP8 pages of
 * 61 layers, mid-size pages, 64-token MLA pages); -t MiB of payload per
 * size (default 1024); -b adds buffered runs (both sides through the page
 * cache); -F sets the tier's open-file cache (entries, 0 for none; the
 * default is the tier's); -O runs the tier's loop alone, to profile it (the
 * raw columns then read 1.00 and mean nothing). The "rq" columns are the
 * read requests DIR's device completed per object, after the block layer
 * merged neighbouring files (other processes' reads count too; cold, the
 * tier's include the directory and inode blocks its opens read). --gpu
 * restores into GPU memory: reads land in staging registered with CUDA,
 * and each batch of reads is copied to the device (H2D) while the next
 * batch is read; the raw loop does the same with the same copies. Without
 * a CUDA device it says so and exits 0.
 * -P measures write-through: a real l3kvd (the one built next to this
 * binary, or $L3KVD) with a file tier under DIR; one engine publishes
 * OBJECTS objects of LEN bytes (default 16 KiB), 64 a request, as fast as
 * the daemon answers, and retries a no_space (a DRAM tier of -m MiB full
 * of objects not written yet) after 1 ms. It prints the sustained publish
 * rate (first request to last answer), the rate at which the tier wrote
 * the same objects (first request to last file), how many reached files,
 * and the tier's own write rate for as many objects with no daemon
 * (filetier_write, 64 in flight, no sync).
 * DIR must be on the filesystem to measure; the benchmark's files are
 * removed at the end.
 */
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <jansson.h>
#include <liburing.h>
#include <signal.h>

#include "daemon.h"
#include "kernels.h"
#include "l3kv.h"
#include "bench.h"

#define KIB		1024ULL
#define MIB		(1024ULL * 1024)
#define NS_NAME		"decode/bench-0123456789abcdef0123456789abcdef"

static const uint8_t bench_fp[16] = { 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
	0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef };

static void
bench_key(struct obj_key *k, unsigned pool, uint64_t n)
{
	uint64_t	x = n * 0x9e3779b97f4a7c15ULL + pool + 1;
	int		i;

	memset(k, 0, sizeof(*k));
	memcpy(k->fingerprint, bench_fp, 16);
	k->pool = (uint8_t)pool;
	for (i = 0; i < 4; i++) {
		x ^= x >> 31;
		x *= 0xbf58476d1ce4e5b9ULL;
		x ^= x >> 29;
		memcpy(k->hash + 8 * i, &x, 8);
	}
}

static void
bench_path(const char *root, const struct obj_key *k, char *buf, size_t len)
{
	char	hex[65];
	int	i;

	for (i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", k->hash[i]);
	snprintf(buf, len, "%s/%s/%02x-%04x/%02x/%s.obj", root, NS_NAME, k->pool, k->shard,
	    k->hash[0], hex);
}

/* CPU seconds of this process so far, all its threads (the tier's readers, io-wq workers). */
static double
bench_cpu(void)
{
	struct rusage	ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	    (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double	bench_raw_cpu;		/* CPU seconds of bench_raw_preopened's timed reads */
static char	bench_dev_stat[64];	/* /sys/dev/block/M:m/stat of DIR's device, or "" */
static uint64_t	bench_raw_rq;		/* device reads of bench_raw_preopened's timed reads */

/*
 * Read requests the device of DIR completed so far (after merging), or 0
 * when /sys does not say; other processes' reads count too.
 */
static uint64_t
bench_dev_reads(void)
{
	unsigned long long	n = 0;
	FILE			*f;

	if (bench_dev_stat[0] == '\0' || (f = fopen(bench_dev_stat, "r")) == NULL)
		return 0;
	if (fscanf(f, "%llu", &n) != 1)
		n = 0;
	fclose(f);
	return n;
}

static int
bench_drop_caches(void)
{
	int	fd, ok;

	sync();
	if ((fd = open("/proc/sys/vm/drop_caches", O_WRONLY)) < 0)
		return -1;
	ok = write(fd, "3\n", 2) == 2;
	close(fd);
	return ok ? 0 : -1;
}

static long
bench_status_kib(const char *field)
{
	FILE	*f = fopen("/proc/self/status", "r");
	char	 line[256];
	long	 v = -1;

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, strlen(field)) == 0)
			v = strtol(line + strlen(field) + 1, NULL, 10);
	fclose(f);
	return v;
}

static unsigned	bench_scan_threads;	/* 0: the default */
static long	bench_fd_cache = -1;	/* -F: the tier's open-file cache; -1: its default */
static int	bench_tier_only;	/* -O: the tier's loop alone, to profile it */
static unsigned	bench_writers = 4;	/* the tier's writer threads; -P: the daemon's 2 */

/* Descriptors open now: the raw loop's windows leave room for the tier's cache. */
static long
bench_fds_open(void)
{
	DIR		*d = opendir("/proc/self/fd");
	struct dirent	*de;
	long		 n = 0;

	if (d == NULL)
		return 64;
	while ((de = readdir(d)) != NULL)
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

static struct filetier *
bench_tier(struct event_base *base, const char *root, unsigned readers, unsigned depth,
    int direct, uint64_t *found)
{
	struct filetier_params	 p;
	struct filetier		*ft;
	uint64_t		 n;
	char			 err[512];

	filetier_params_default(&p);
	p.root = root;
	p.readers = readers;
	p.read_depth = depth;
	p.writers = bench_writers;
	p.direct = direct;
	if (bench_fd_cache >= 0)
		p.fd_cache = (unsigned)bench_fd_cache;
	if (bench_scan_threads > 0)
		p.scan_threads = bench_scan_threads;
	if (filetier_new(base, &p, &ft, err, sizeof(err)) != 0 ||
	    filetier_scan(ft, NS_NAME, bench_fp, &n, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_file: %s\n", err);
		exit(1);
	}
	if (found != NULL)
		*found = n;
	return ft;
}

/* Writes n objects of len bytes in pool `pool`, up to 64 in flight. */
struct bench_wr {
	int	inflight;
	int	failed;
};

static void
bench_write_done(struct filetier_job *job)
{
	struct bench_wr	*w = job->arg;

	w->inflight--;
	w->failed += job->status != 0;
}

/* Writes n objects; do_sync: and syncs the filesystem inside the time. */
static double
bench_fill_sync(struct event_base *base, struct filetier *ft, unsigned pool, uint64_t n,
    uint64_t len, int do_sync)
{
	struct bench_wr	 w = { 0, 0 };
	struct obj_key	 k;
	uint8_t		*data = malloc(len);
	uint64_t	 i, csum, x = 88172645463325252ULL;
	double		 t0 = bench_now();
	int		 rc;

	if (data == NULL)
		exit(1);
	for (i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(data + i, &x, len - i < 8 ? len - i : 8);
	}
	csum = checksum_obj(data, len);
	for (i = 0; i < n; i++) {
		while (w.inflight >= 64)
			event_base_loop(base, EVLOOP_ONCE);
		bench_key(&k, pool, i);
		rc = filetier_write(ft, &k, data, len, csum, bench_write_done, &w);
		if (rc == -EEXIST)
			continue;
		if (rc != 0) {
			fprintf(stderr, "bench_file: write: %s\n", strerror(-rc));
			exit(1);
		}
		w.inflight++;
	}
	while (w.inflight > 0)
		event_base_loop(base, EVLOOP_ONCE);
	if (w.failed) {
		fprintf(stderr, "bench_file: %d writes failed\n", w.failed);
		exit(1);
	}
	if (do_sync)
		sync();
	free(data);
	return bench_now() - t0;
}

static double
bench_fill(struct event_base *base, struct filetier *ft, unsigned pool, uint64_t n,
    uint64_t len)
{
	return bench_fill_sync(base, ft, pool, n, len, 1);
}

/* The tier's read path: depth reads in flight, each buffer reused when its read is done. */
struct bench_rd {
	struct filetier	*ft;
	unsigned	 pool;
	uint64_t	 n;
	uint64_t	 next;
	uint64_t	 done;
	uint64_t	 cap;
	int		 failed;
};

static void	bench_read_done(struct filetier_job *);

static void
bench_read_submit(struct bench_rd *r, void *buf)
{
	struct obj_key	k;
	int		rc;

	bench_key(&k, r->pool, r->next++);
	if ((rc = filetier_read(r->ft, &k, buf, r->cap, bench_read_done, r, NULL)) != 0) {
		fprintf(stderr, "bench_file: read: %s\n", strerror(-rc));
		exit(1);
	}
}

static void
bench_read_done(struct filetier_job *job)
{
	struct bench_rd	*r = job->arg;

	r->done++;
	if (job->status != 0) {
		fprintf(stderr, "bench_file: read failed: %s\n", filetier_strerror(job->status));
		r->failed++;
	}
	if (r->next < r->n)
		bench_read_submit(r, job->buf);
}

static double
bench_tier_read(struct event_base *base, struct filetier *ft, unsigned pool, uint64_t n,
    uint64_t len, uint8_t *bufs, unsigned depth)
{
	struct bench_rd	r = { ft, pool, n, 0, 0, FILETIER_READ_SIZE(len), 0 };
	double		t0 = bench_now(), t;
	unsigned	i;

	for (i = 0; i < depth && r.next < n; i++)
		bench_read_submit(&r, bufs + (size_t)i * r.cap);
	while (r.done < n)
		event_base_loop(base, EVLOOP_ONCE);
	t = bench_now() - t0;
	if (r.failed)
		exit(1);
	return t;
}

/*
 * The raw loop: one ring, depth reads of whole files in flight. With
 * fds, files were opened before the clock; without, each is opened
 * before its read and closed after it.
 */
static double
bench_raw_read(const char *root, unsigned pool, uint64_t first, uint64_t n, uint64_t len,
    uint8_t *bufs, unsigned depth, const int *fds, int direct)
{
	struct io_uring		 ring;
	struct io_uring_cqe	*cqe;
	struct io_uring_sqe	*sqe;
	struct obj_key		 k;
	uint64_t		 stride = FILETIER_READ_SIZE(len) + FILETIER_HDR, next = 0, done = 0;
	double			 t0, t;
	char			 path[PATH_MAX];
	unsigned		*free_slots, nfree, slot, i;
	int			*slot_fd, fd, rc;

	if ((rc = io_uring_queue_init(depth, &ring, 0)) != 0) {
		fprintf(stderr, "bench_file: io_uring_queue_init: %s\n", strerror(-rc));
		exit(1);
	}
	slot_fd = calloc(depth, sizeof(*slot_fd));
	free_slots = calloc(depth, sizeof(*free_slots));
	for (i = 0; i < depth; i++)
		free_slots[i] = i;
	nfree = depth;
	t0 = bench_now();
	while (done < n) {
		while (nfree > 0 && next < n) {
			slot = free_slots[--nfree];
			if (fds != NULL)
				fd = fds[next];
			else {
				bench_key(&k, pool, first + next);
				bench_path(root, &k, path, sizeof(path));
				if ((fd = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0))) < 0) {
					perror(path);
					exit(1);
				}
			}
			slot_fd[slot] = fd;
			/* The whole file in one read, header and payload, as the tier reads it. */
			sqe = io_uring_get_sqe(&ring);
			io_uring_prep_read(sqe, fd, bufs + (size_t)slot * stride, (unsigned)stride, 0);
			io_uring_sqe_set_data64(sqe, slot);
			next++;
		}
		if ((rc = io_uring_submit_and_wait(&ring, 1)) < 0 && rc != -EINTR) {
			fprintf(stderr, "bench_file: submit: %s\n", strerror(-rc));
			exit(1);
		}
		while (io_uring_peek_cqe(&ring, &cqe) == 0) {
			slot = (unsigned)cqe->user_data;
			if (cqe->res != (int)(FILETIER_HDR + len)) {
				fprintf(stderr, "bench_file: raw read: %d of %llu bytes\n", cqe->res,
				    (unsigned long long)(FILETIER_HDR + len));
				exit(1);
			}
			if (fds == NULL)
				close(slot_fd[slot]);
			free_slots[nfree++] = slot;
			io_uring_cqe_seen(&ring, cqe);
			done++;
		}
	}
	t = bench_now() - t0;
	io_uring_queue_exit(&ring);
	free(free_slots);
	free(slot_fd);
	return t;
}

static int *
bench_open_all(const char *root, unsigned pool, uint64_t first, uint64_t n, int direct)
{
	struct obj_key	 k;
	char		 path[PATH_MAX];
	uint64_t	 i;
	int		*fds = malloc(n * sizeof(*fds));

	for (i = 0; i < n; i++) {
		bench_key(&k, pool, first + i);
		bench_path(root, &k, path, sizeof(path));
		if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0))) < 0) {
			perror(path);
			exit(1);
		}
	}
	return fds;
}

static void
bench_close_all(int *fds, uint64_t n)
{
	uint64_t	i;

	for (i = 0; i < n; i++)
		close(fds[i]);
	free(fds);
}

/*
 * --gpu: restores into device memory. The staging holds two batches of
 * `inflight` payloads back to back and is registered with CUDA; batch b
 * is read into half b % 2 while batch b - 1 is copied to the device by
 * one cudaMemcpy of its payloads (kernels_copy). The raw loop reads the
 * same files into the same places (header into scratch, payload into the
 * staging, as the tier reads them) and makes the same copies.
 */
struct bench_gpu {
	uint8_t		*stage;		/* 2 * inflight * cap, registered */
	uint8_t		*hdrs;		/* raw loop: 2 * inflight headers */
	void		*dev;		/* inflight * cap of device memory */
	uint64_t	 cap;		/* FILETIER_READ_SIZE(len) */
	unsigned	 inflight;
};

static void
bench_gpu_copy(struct bench_gpu *g, unsigned half, uint64_t cnt)
{
	char	err[256];
	int	rc;

	rc = kernels_copy(g->dev, g->stage + (size_t)half * g->inflight * g->cap, cnt * g->cap, err,
	    sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "bench_file: kernels_copy: %s\n", err);
		exit(1);
	}
}

/* One half of the staging: reads of its batch still out. */
struct bench_ghalf {
	uint64_t	left;
	int		failed;
};

static void
bench_gpu_read_done(struct filetier_job *job)
{
	struct bench_ghalf	*h = job->arg;

	h->left--;
	if (job->status != 0) {
		fprintf(stderr, "bench_file: read failed: %s\n", filetier_strerror(job->status));
		h->failed++;
	}
}

static double
bench_tier_read_gpu(struct event_base *base, struct filetier *ft, unsigned pool, uint64_t n,
    struct bench_gpu *g)
{
	struct bench_ghalf	 h[2] = { { 0, 0 }, { 0, 0 } };
	struct obj_key		 k;
	uint64_t		 first, cnt = 0, prev = 0, i;
	unsigned		 b, half;
	double			 t0 = bench_now(), t;
	int			 rc;

	for (first = 0, b = 0; first < n; first += cnt, b++) {
		half = b % 2;
		cnt = n - first < g->inflight ? n - first : g->inflight;
		h[half].left = cnt;
		for (i = 0; i < cnt; i++) {
			bench_key(&k, pool, first + i);
			rc = filetier_read(ft, &k, g->stage + ((size_t)half * g->inflight + i) * g->cap,
			    g->cap, bench_gpu_read_done, &h[half], NULL);
			if (rc != 0) {
				fprintf(stderr, "bench_file: read: %s\n", strerror(-rc));
				exit(1);
			}
		}
		if (b > 0) {
			while (h[!half].left > 0)
				event_base_loop(base, EVLOOP_ONCE);
			bench_gpu_copy(g, !half, prev);
		}
		prev = cnt;
	}
	half = (b - 1) % 2;
	while (h[half].left > 0)
		event_base_loop(base, EVLOOP_ONCE);
	bench_gpu_copy(g, half, prev);
	t = bench_now() - t0;
	if (h[0].failed + h[1].failed > 0)
		exit(1);
	return t;
}

/*
 * The raw loop with the same batches and copies, over files opened before
 * the clock. As many reads in flight as the tier has (its queue holds the
 * rest): the next batch's reads go out as the current one's complete.
 */
static double
bench_raw_read_gpu(uint64_t n, uint64_t len, struct bench_gpu *g, const int *fds)
{
	struct io_uring		 ring;
	struct io_uring_cqe	*cqe;
	struct io_uring_sqe	*sqe;
	struct iovec		*iov;
	uint64_t		 done[2] = { 0, 0 }, next = 0, cnt, limit, b;
	unsigned		 half, slot, now = 0;
	double			 t0, t;
	int			 rc;

	if ((rc = io_uring_queue_init(g->inflight, &ring, 0)) != 0) {
		fprintf(stderr, "bench_file: io_uring_queue_init: %s\n", strerror(-rc));
		exit(1);
	}
	if ((iov = calloc(4 * (size_t)g->inflight, sizeof(*iov))) == NULL)
		exit(1);
	t0 = bench_now();
	for (b = 0; b * g->inflight < n; b++) {
		half = b % 2;
		cnt = n - b * g->inflight < g->inflight ? n - b * g->inflight : g->inflight;
		limit = (b + 2) * g->inflight < n ? (b + 2) * g->inflight : n;
		while (done[half] < cnt) {
			for (; now < g->inflight && next < limit; now++, next++) {
				slot = (unsigned)((next / g->inflight) % 2 * g->inflight +
				    next % g->inflight);
				iov[2 * slot].iov_base = g->hdrs + (size_t)slot * FILETIER_HDR;
				iov[2 * slot].iov_len = FILETIER_HDR;
				iov[2 * slot + 1].iov_base = g->stage + (size_t)slot * g->cap;
				iov[2 * slot + 1].iov_len = g->cap;
				sqe = io_uring_get_sqe(&ring);
				io_uring_prep_readv(sqe, fds[next], &iov[2 * slot], 2, 0);
				io_uring_sqe_set_data64(sqe, (next / g->inflight) % 2);
			}
			if ((rc = io_uring_submit_and_wait(&ring, 1)) < 0 && rc != -EINTR) {
				fprintf(stderr, "bench_file: submit: %s\n", strerror(-rc));
				exit(1);
			}
			while (io_uring_peek_cqe(&ring, &cqe) == 0) {
				if (cqe->res != (int)(FILETIER_HDR + len)) {
					fprintf(stderr, "bench_file: raw read: %d of %llu bytes\n",
					    cqe->res, (unsigned long long)(FILETIER_HDR + len));
					exit(1);
				}
				done[cqe->user_data]++;
				now--;
				io_uring_cqe_seen(&ring, cqe);
			}
		}
		bench_gpu_copy(g, half, cnt);
		done[half] = 0;
	}
	t = bench_now() - t0;
	io_uring_queue_exit(&ring);
	free(iov);
	return t;
}

/*
 * The raw loop over files opened before its clock starts, in windows as
 * large as the open file limit allows; only the reads (and with g, the
 * copies to the device) are timed.
 */
static double
bench_raw_preopened(const char *root, unsigned pool, uint64_t n, uint64_t len, uint8_t *bufs,
    unsigned depth, int direct, int cold, struct bench_gpu *g)
{
	struct rlimit	rl;
	uint64_t	w = 256, first, cnt;
	double		t = 0;
	long		open_now = bench_fds_open();
	int		*fds;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && (long)rl.rlim_cur > open_now + 512)
		w = (uint64_t)((long)rl.rlim_cur - open_now - 256);
	bench_raw_cpu = 0;
	bench_raw_rq = 0;
	for (first = 0; first < n; first += cnt) {
		double		c0;
		uint64_t	q0;

		cnt = n - first < w ? n - first : w;
		fds = bench_open_all(root, pool, first, cnt, direct);
		if (cold)
			bench_drop_caches();	/* the opens stay in the fds; the data goes */
		c0 = bench_cpu();
		q0 = bench_dev_reads();
		t += g != NULL ? bench_raw_read_gpu(cnt, len, g, fds) :
		    bench_raw_read(root, pool, first, cnt, len, bufs, depth, fds, direct);
		bench_raw_rq += bench_dev_reads() - q0;
		bench_raw_cpu += bench_cpu() - c0;
		bench_close_all(fds, cnt);
	}
	return t;
}

enum { B_COLD, B_WARM, B_BUFFERED, B_MODES };
static const char *const bench_mode_name[B_MODES] = { "cold", "warm", "buffered" };

static void
bench_reads(const char *dir, const char *sizes, uint64_t total, int runs, unsigned readers,
    unsigned depth, int buffered)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft, *ftb;
	char			 root[PATH_MAX], list[256], *tok, *save = NULL;
	uint64_t		 len, n;
	uint8_t			*bufs;
	double			 tier[16], raw[16], rawo[16], tcpu[16], rcpu[16], trq[16], rrq[16];
	double			 tw, gb, c0;
	uint64_t		 q0;
	int			 can_drop, mode, run;
	unsigned		 pool = 0, inflight = readers * depth, i;

	snprintf(root, sizeof(root), "%s/root", dir);
	can_drop = bench_drop_caches() == 0;
	if (!can_drop)
		printf("note: cannot drop the page cache (not root?): cold runs are skipped\n");
	printf("file tier: %u readers x %u reads in flight; raw: one ring, %u reads in flight\n",
	    readers, depth, inflight);
	printf("(cpu: CPU time of the whole process per object, us: the tier's threads; the raw "
	    "loop's reads alone;\n rq/obj: read requests the device completed per object, after "
	    "merging, metadata included)\n");
	printf("%-9s %-8s %7s %6s | %9s %9s %9s | %6s %6s | %8s %8s | %6s %6s\n", "size", "cache",
	    "objects", "GiB", "tier GB/s", "raw GB/s", "raw+open", "ratio", "r+open", "tier cpu",
	    "raw cpu", "tier rq", "raw rq");
	snprintf(list, sizeof(list), "%s", sizes);
	for (tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save), pool++) {
		len = strtoull(tok, NULL, 0) * KIB;
		n = total / len;
		ft = bench_tier(base, root, readers, depth, 1, NULL);
		tw = bench_fill(base, ft, pool, n, len);
		printf("%-9s %-8s %7llu %6.2f | write %.2f GB/s (no fsync, page cache, then sync)\n",
		    tok, "", (unsigned long long)n, (double)(n * len) / (1 << 30),
		    (double)(n * len) / tw / 1e9);
		bufs = aligned_alloc(4096, (size_t)inflight * (FILETIER_READ_SIZE(len) + FILETIER_HDR));
		if (bufs == NULL)
			exit(1);
		memset(bufs, 0, (size_t)inflight * (FILETIER_READ_SIZE(len) + FILETIER_HDR));
		gb = (double)(n * len) / 1e9;
		for (mode = can_drop ? B_COLD : B_WARM; mode < (buffered ? B_MODES : B_BUFFERED);
		    mode++) {
			int direct = mode != B_BUFFERED;

			ftb = direct ? ft : bench_tier(base, root, readers, depth, 0, NULL);
			if (mode == B_BUFFERED) {
				/* Warm the page cache once: both sides then read from it. */
				bench_raw_read(root, pool, 0, n, len, bufs, inflight, NULL, 0);
			}
			for (run = 0; run < runs; run++) {
				/*
				 * The three loops take turns at going first: on a virtual
				 * disk the host's cache and the disk's burst credits
				 * favour whichever comes at a given place.
				 */
				for (i = 0; i < 3; i++) {
					if (bench_tier_only && (i + (unsigned)run) % 3 != 0) {
						raw[run] = rawo[run] = 1;
						rcpu[run] = rrq[run] = 0;
						continue;
					}
					switch ((i + (unsigned)run) % 3) {
					case 0:
						if (mode == B_COLD)
							bench_drop_caches();
						c0 = bench_cpu();
						q0 = bench_dev_reads();
						tier[run] = gb / bench_tier_read(base, ftb, pool, n,
						    len, bufs, inflight);
						trq[run] = (double)(bench_dev_reads() - q0) / (double)n;
						tcpu[run] = (bench_cpu() - c0) * 1e6 / (double)n;
						break;
					case 1:
						if (mode == B_COLD)
							bench_drop_caches();
						rawo[run] = gb / bench_raw_read(root, pool, 0, n, len, bufs,
						    inflight, NULL, direct);
						break;
					default:
						raw[run] = gb / bench_raw_preopened(root, pool, n, len, bufs,
						    inflight, direct, mode == B_COLD, NULL);
						rcpu[run] = bench_raw_cpu * 1e6 / (double)n;
						rrq[run] = (double)bench_raw_rq / (double)n;
						break;
					}
				}
			}
			if (ftb != ft)
				filetier_free(ftb);
			{
				double t = bench_median(tier, runs), r = bench_median(raw, runs);
				double ro = bench_median(rawo, runs);

				printf("%-9s %-8s %7llu %6.2f | %9.2f %9.2f %9.2f | %6.2f %6.2f | %8.1f "
				    "%8.1f | %6.2f %6.2f\n", tok, bench_mode_name[mode],
				    (unsigned long long)n, (double)(n * len) / (1 << 30), t, r, ro, t / r,
				    t / ro, bench_median(tcpu, runs), bench_median(rcpu, runs),
				    bench_median(trq, runs), bench_median(rrq, runs));
			}
			fflush(stdout);
		}
		free(bufs);
		filetier_free(ft);
	}
	event_base_free(base);
}

static void
bench_reads_gpu(const char *dir, const char *sizes, uint64_t total, int runs, unsigned readers,
    unsigned depth)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft;
	struct bench_gpu	 g;
	char			 root[PATH_MAX], list[256], err[256], *tok, *save = NULL;
	uint64_t		 len, n;
	size_t			 slen;
	double			 tier[16], raw[16], tw, gb, t, r;
	int			 can_drop, mode, run, rc;
	unsigned		 pool = 0;

	snprintf(root, sizeof(root), "%s/root", dir);
	can_drop = bench_drop_caches() == 0;
	if (!can_drop)
		printf("note: cannot drop the page cache (not root?): cold runs are skipped\n");
	g.inflight = readers * depth;
	printf("restore into GPU memory: batches of %u reads into pinned staging, each batch copied "
	    "H2D while the next is read;\nfile tier: %u readers x %u reads in flight; raw: one ring, "
	    "files opened before the clock\n", g.inflight, readers, depth);
	printf("%-9s %-8s %7s %6s | %12s %12s | %6s\n", "size", "cache", "objects", "GiB",
	    "tier+H2D GB/s", "raw+H2D GB/s", "ratio");
	snprintf(list, sizeof(list), "%s", sizes);
	for (tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save), pool++) {
		len = strtoull(tok, NULL, 0) * KIB;
		n = total / len;
		g.cap = FILETIER_READ_SIZE(len);
		slen = 2 * (size_t)g.inflight * g.cap;
		g.stage = aligned_alloc(4096, slen);
		g.hdrs = aligned_alloc(4096, 2 * (size_t)g.inflight * FILETIER_HDR);
		if (g.stage == NULL || g.hdrs == NULL)
			exit(1);
		memset(g.stage, 0, slen);
		if ((rc = kernels_host_register(g.stage, slen, err, sizeof(err))) != 0 ||
		    (rc = kernels_dev_alloc((size_t)g.inflight * g.cap, &g.dev, err, sizeof(err))) != 0) {
			fprintf(stderr, "bench_file: staging: %s\n", err);
			exit(1);
		}
		ft = bench_tier(base, root, readers, depth, 1, NULL);
		tw = bench_fill(base, ft, pool, n, len);
		printf("%-9s %-8s %7llu %6.2f | write %.2f GB/s (no fsync, page cache, then sync)\n",
		    tok, "", (unsigned long long)n, (double)(n * len) / (1 << 30),
		    (double)(n * len) / tw / 1e9);
		gb = (double)(n * len) / 1e9;
		for (mode = can_drop ? B_COLD : B_WARM; mode < B_BUFFERED; mode++) {
			for (run = 0; run < runs; run++) {
				/* Each goes first in turn, as in bench_reads. */
				if (run % 2 == 0) {
					if (mode == B_COLD)
						bench_drop_caches();
					tier[run] = gb / bench_tier_read_gpu(base, ft, pool, n, &g);
				}
				raw[run] = gb / bench_raw_preopened(root, pool, n, len, NULL, 0, 1,
				    mode == B_COLD, &g);
				if (run % 2 == 1) {
					if (mode == B_COLD)
						bench_drop_caches();
					tier[run] = gb / bench_tier_read_gpu(base, ft, pool, n, &g);
				}
			}
			t = bench_median(tier, runs);
			r = bench_median(raw, runs);
			printf("%-9s %-8s %7llu %6.2f | %12.2f %12.2f | %6.2f\n", tok,
			    bench_mode_name[mode], (unsigned long long)n, (double)(n * len) / (1 << 30),
			    t, r, t / r);
			fflush(stdout);
		}
		filetier_free(ft);
		kernels_dev_free(g.dev);
		kernels_host_unregister(g.stage, err, sizeof(err));
		free(g.stage);
		free(g.hdrs);
	}
	event_base_free(base);
}

/*
 * One scan in a fresh process (bench_file -M), so that the memory figures
 * are the scan's alone: VmHWM is the peak (the scan's transient lists
 * included), VmRSS after the scan is what the index keeps.
 */
static void
bench_scan_measure(const char *dir, const char *what)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft;
	struct filetier_stats	 st;
	struct mallinfo2	 mi;
	char			 root[PATH_MAX];
	uint64_t		 found;
	double			 t0, t;
	long			 rss0, rss1, hwm;

	snprintf(root, sizeof(root), "%s/root", dir);
	rss0 = bench_status_kib("VmRSS:");
	t0 = bench_now();
	ft = bench_tier(base, root, 2, 32, 1, &found);
	t = bench_now() - t0;
	rss1 = bench_status_kib("VmRSS:");
	hwm = bench_status_kib("VmHWM:");
	filetier_stats(ft, &st);
	mi = mallinfo2();
	printf("scan %s: %llu objects in %.2f s (%.0f objects/s); index %.1f MiB (%.1f bytes/object);"
	    " malloc in use %.1f MiB; RSS +%.1f MiB after, peak +%.1f MiB; removed %llu\n", what,
	    (unsigned long long)found, t, (double)found / t, (double)st.meta_bytes / MIB,
	    st.meta_bytes_per_object, (double)(mi.uordblks + mi.hblkhd) / MIB,
	    (double)(rss1 - rss0) / 1024, (double)(hwm - rss0) / 1024,
	    (unsigned long long)st.scan_removed);
	filetier_free(ft);
	event_base_free(base);
}

/* The startup scan: objects of len bytes, written once, then scanned cold and warm. */
static void
bench_scan(const char *dir, uint64_t objects, uint64_t len)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft;
	char			 root[PATH_MAX], threads[16];
	uint64_t		 found;
	double			 t;
	pid_t			 pid;
	int			 pass;

	snprintf(root, sizeof(root), "%s/root", dir);
	ft = bench_tier(base, root, 2, 32, 1, &found);
	if (found < objects) {
		t = bench_fill(base, ft, 0, objects, len);
		printf("scan: wrote %llu objects of %llu bytes in %.1f s (%.0f objects/s)\n",
		    (unsigned long long)objects, (unsigned long long)len, t, (double)objects / t);
	}
	filetier_free(ft);
	event_base_free(base);
	snprintf(threads, sizeof(threads), "%u", bench_scan_threads);
	for (pass = 0; pass < 2; pass++) {
		if (pass == 0 && bench_drop_caches() != 0) {
			printf("scan: cannot drop the page cache; cold pass skipped\n");
			continue;
		}
		fflush(stdout);
		if ((pid = fork()) == 0) {
			execl("/proc/self/exe", "bench_file", "-d", dir, "-M", pass == 0 ? "cold" : "warm",
			    "-T", threads, (char *)NULL);
			_exit(127);
		}
		waitpid(pid, NULL, 0);
	}
}

/* Write-through through a real l3kvd (-P). */
#define BENCH_PUB_BATCH	64

static void
bench_pub_die(const char *what, int rc)
{
	fprintf(stderr, "bench_file: %s: %s\n", what, l3kv_strerror(rc));
	exit(1);
}

/* An integer of STATS: section.key, or section.sub.key where sub is not NULL. */
static long long
bench_pub_stat(struct l3kv *k, const char *section, const char *sub, const char *key)
{
	json_error_t	 jerr;
	json_t		*j, *o;
	char		*text = NULL;
	long long	 v;
	int		 rc;

	if ((rc = l3kv_stats(k, &text)) != 0)
		bench_pub_die("stats", rc);
	if ((j = json_loads(text, 0, &jerr)) == NULL) {
		fprintf(stderr, "bench_file: STATS: %s\n", jerr.text);
		exit(1);
	}
	o = json_object_get(j, section);
	if (sub != NULL)
		o = json_object_get(o, sub);
	v = json_integer_value(json_object_get(o, key));
	json_decref(j);
	l3kv_free(text);
	return v;
}

static struct l3kv *
bench_pub_attach(const char *sock, uint64_t len, int *memfd)
{
	struct l3kv_attach_args	a;
	struct l3kv_region	r;
	struct l3kv_pool	p;
	struct l3kv		*k = NULL;
	int			rc, i;

	for (i = 0; i < 500 && (rc = l3kv_connect(sock, 5000, &k)) != 0; i++)
		usleep(10000);
	if (rc != 0)
		bench_pub_die("connect", rc);
	*memfd = memfd_create("bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (*memfd < 0 || ftruncate(*memfd, (off_t)(BENCH_PUB_BATCH * len)) != 0)
		bench_pub_die("memfd", -errno);
	memset(&p, 0, sizeof(p));
	p.name = "kv";
	p.kind = L3KV_POOL_KV;
	p.hit_policy = L3KV_HIT_ALL_PAGES;
	p.layers = 1;
	p.object_bytes = len;
	memset(&r, 0, sizeof(r));
	r.kind = L3KV_MEM_MEMFD;
	r.layout = L3KV_LAYOUT_PAGE_FIRST;
	r.fd = *memfd;
	r.size = BENCH_PUB_BATCH * len;
	r.num_pages = BENCH_PUB_BATCH;
	r.page_tokens = 64;
	r.layers = 1;
	r.token_bytes = (uint32_t)(len / 64);
	r.page_stride = len;
	r.layer_stride = len / 64;
	r.token_stride = len / 64;
	memset(&a, 0, sizeof(a));
	a.layout.model = "bench-wt";
	a.layout.kv_dtype = "fp8_e4m3";
	a.layout.hash_scheme = "sha256";
	a.layout.hash_len = 32;
	a.layout.tp_size = a.layout.dcp_size = a.layout.pp_size = a.layout.cp_size = 1;
	a.layout.host_layout = L3KV_LAYOUT_PAGE_FIRST;
	a.layout.attention = L3KV_ATTN_MLA;
	a.layout.page_tokens = a.layout.logical_page_tokens = 64;
	a.pools = &p;
	a.npools = 1;
	a.regions = &r;
	a.nregions = 1;
	a.group = "bench-wt";
	a.group_size = 1;
	a.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	a.write = L3KV_WRITE_THROUGH;
	if ((rc = l3kv_attach(k, &a, NULL)) != 0)
		bench_pub_die("attach", rc);
	return k;
}

/* The l3kvd next to this binary, or $L3KVD. */
static void
bench_pub_daemon_path(const char *argv0, char *out, size_t len)
{
	const char	*env = getenv("L3KVD"), *slash = strrchr(argv0, '/');

	if (env != NULL)
		snprintf(out, len, "%s", env);
	else if (slash != NULL)
		snprintf(out, len, "%.*s/l3kvd", (int)(slash - argv0), argv0);
	else
		snprintf(out, len, "./l3kvd");
}

static void
bench_publish(const char *argv0, const char *dir, uint64_t objects, uint64_t len,
    uint64_t dram_mib)
{
	struct l3kv_publish_page	 pg[BENCH_PUB_BATCH];
	struct l3kv_publish_result	 res;
	struct event_base		*base;
	struct filetier			*ft;
	struct l3kv			*k;
	char				 daemon[PATH_MAX], cfg[PATH_MAX + 16], sock[PATH_MAX + 16];
	char				 logp[PATH_MAX + 16], root[PATH_MAX + 16], tier[PATH_MAX + 16];
	char				 cmd[PATH_MAX + 32];
	uint8_t				*pages;
	uint64_t			 i, n, done = 0, nospace = 0;
	long long			 written = 0, failed, backlog, dirty_peak = 0, d;
	double				 t0, t_pub, t_file, t_tier;
	FILE				*f;
	pid_t				 pid;
	int				 memfd, rc, fd;

	if (len < 4096 || len % 4096 != 0) {
		fprintf(stderr, "bench_file: -P: LEN must be a multiple of 4096\n");
		exit(2);
	}
	if (dram_mib == 0)
		dram_mib = (objects * len * 5 / 4 >> 20) + 64;
	bench_pub_daemon_path(argv0, daemon, sizeof(daemon));
	snprintf(root, sizeof(root), "%s/root", dir);
	snprintf(tier, sizeof(tier), "%s/root/wt", dir);
	snprintf(cfg, sizeof(cfg), "%s/root/l3kvd.json", dir);
	snprintf(sock, sizeof(sock), "%s/root/l3kvd.sock", dir);
	snprintf(logp, sizeof(logp), "%s/root/l3kvd.log", dir);
	if (mkdir(root, 0700) != 0 && errno != EEXIST) {
		fprintf(stderr, "bench_file: mkdir %s: %s\n", root, strerror(errno));
		exit(1);
	}
	if ((f = fopen(cfg, "w")) == NULL) {
		fprintf(stderr, "bench_file: %s: %s\n", cfg, strerror(errno));
		exit(1);
	}
	fprintf(f, "{\"socket\": {\"path\": \"%s\", \"mode\": \"0600\"}, \"log\": {\"level\": "
	    "\"warn\"}, \"tiers\": {\"dram\": {\"size\": \"%llu MiB\"}, \"file\": {\"path\": "
	    "\"%s\"}}}\n", sock, (unsigned long long)dram_mib, tier);
	fclose(f);
	if ((pid = fork()) == 0) {
		if ((fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600)) >= 0)
			dup2(fd, 2);
		execl(daemon, "l3kvd", "-f", cfg, (char *)NULL);
		_exit(127);
	}
	k = bench_pub_attach(sock, len, &memfd);
	if ((pages = mmap(NULL, BENCH_PUB_BATCH * len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
	    0)) == MAP_FAILED)
		bench_pub_die("mmap", -errno);
	for (i = 0; i < BENCH_PUB_BATCH * len; i++)
		pages[i] = (uint8_t)(i * 131 + 7);
	t0 = bench_now();
	while (done < objects) {
		n = objects - done < BENCH_PUB_BATCH ? objects - done : BENCH_PUB_BATCH;
		for (i = 0; i < n; i++) {
			uint64_t x = done + i + 1;

			memset(pg[i].hash, 0, sizeof(pg[i].hash));
			memcpy(pg[i].hash, &x, sizeof(x));
			pg[i].hash[31] = 0x5a;
			pg[i].src_page = (uint32_t)i;
		}
		rc = l3kv_publish(k, 0, pg, (uint32_t)n, &res);
		if (rc == -ENOSPC) {
			/* DRAM holds only objects not written yet: the engine waits. */
			nospace++;
			usleep(1000);
			continue;
		}
		if (rc != 0)
			bench_pub_die("publish", rc);
		done += n;
		if ((done / BENCH_PUB_BATCH) % 64 == 0 &&
		    (d = bench_pub_stat(k, "file", "write_through", "dirty_objects")) > dirty_peak)
			dirty_peak = d;
	}
	t_pub = bench_now() - t0;
	backlog = bench_pub_stat(k, "file", "write_through", "dirty_objects");
	while ((written = bench_pub_stat(k, "file", NULL, "writes")) +
	    bench_pub_stat(k, "file", NULL, "write_failures") < (long long)objects)
		usleep(1000);
	t_file = bench_now() - t0;
	failed = bench_pub_stat(k, "file", "write_through", "failed");
	l3kv_close(k);
	close(memfd);
	munmap(pages, BENCH_PUB_BATCH * len);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tier);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_file: could not remove %s\n", tier);

	/* The tier alone, the same objects, in this process, with the daemon's writers. */
	bench_writers = 2;
	base = event_base_new();
	ft = bench_tier(base, root, 2, 32, 1, NULL);
	t_tier = bench_fill_sync(base, ft, 0, objects, len, 0);
	filetier_free(ft);
	event_base_free(base);

	printf("write-through: %llu objects of %llu KiB, DRAM %llu MiB, 2 writers\n",
	    (unsigned long long)objects, (unsigned long long)(len >> 10),
	    (unsigned long long)dram_mib);
	printf("  publish (acknowledged)  %9.0f objects/s %6.2f GB/s  (%llu no_space retries: "
	    "DRAM all dirty)\n", (double)objects / t_pub, (double)(objects * len) / t_pub / 1e9,
	    (unsigned long long)nospace);
	printf("  written by the daemon   %9.0f objects/s %6.2f GB/s  (%lld of %llu on file, "
	    "%lld failed; %lld dirty when publishing ended, peak sampled %lld)\n",
	    (double)written / t_file, (double)written * (double)len / t_file / 1e9, written,
	    (unsigned long long)objects, failed, backlog, dirty_peak);
	printf("  tier alone (no daemon)  %9.0f objects/s %6.2f GB/s  | publish / tier %.2f, "
	    "daemon writes / tier %.2f\n", (double)objects / t_tier,
	    (double)(objects * len) / t_tier / 1e9, t_tier / t_pub, t_tier / t_file);
}

int
main(int argc, char **argv)
{
	const char	*dir = NULL, *sizes = "2304,256,36";
	uint64_t	 total = 1024 * MIB, objects = 0, len = 4096;
	struct rlimit	 rl = { 1 << 20, 1 << 20 };
	struct stat	 st;
	unsigned	 readers = 2, depth = 32;
	const char	*measure = NULL;	/* -M: one scan, in this fresh process */
	uint64_t	 publish = 0, dram_mib = 0, len_set = 0;
	int		 runs = 3, buffered = 0, gpu = 0, c, rc;
	char		 cmd[PATH_MAX + 16], desc[256];
	static const struct option longopts[] = {
		{ "gpu", no_argument, NULL, 'g' },
		{ NULL, 0, NULL, 0 }
	};

	while ((c = getopt_long(argc, argv, "d:s:t:r:R:q:F:bgOS:l:T:M:P:m:", longopts, NULL)) != -1) {
		switch (c) {
		case 'd': dir = optarg; break;
		case 's': sizes = optarg; break;
		case 't': total = strtoull(optarg, NULL, 0) * MIB; break;
		case 'r': runs = atoi(optarg); break;
		case 'R': readers = (unsigned)atoi(optarg); break;
		case 'q': depth = (unsigned)atoi(optarg); break;
		case 'F': bench_fd_cache = atol(optarg); break;
		case 'b': buffered = 1; break;
		case 'O': bench_tier_only = 1; break;
		case 'g': gpu = 1; break;
		case 'S': objects = strtoull(optarg, NULL, 0); break;
		case 'l': len = len_set = strtoull(optarg, NULL, 0); break;
		case 'P': publish = strtoull(optarg, NULL, 0); break;
		case 'm': dram_mib = strtoull(optarg, NULL, 0); break;
		case 'T': bench_scan_threads = (unsigned)atoi(optarg); break;
		case 'M': measure = optarg; break;
		default:
			fprintf(stderr, "usage: bench_file -d DIR [--gpu] [-s KIB,..] [-t MIB] [-r RUNS] "
			    "[-R READERS] [-q DEPTH] [-F FDS] [-b] [-O] | -d DIR -S OBJECTS [-l LEN] "
			    "[-T THREADS] | -d DIR -P OBJECTS [-l LEN] [-m DRAM_MIB]\n");
			return 2;
		}
	}
	if (dir == NULL || runs < 1 || runs > 16) {
		fprintf(stderr, "bench_file: -d DIR is required; RUNS is 1..16\n");
		return 2;
	}
	if (gpu) {
		/* Before any file is written: no GPU, nothing to do. */
		if ((rc = kernels_device_count(desc, sizeof(desc))) <= 0) {
			printf("bench_file --gpu: skipped: no usable CUDA device (%s)\n", desc);
			return 0;
		}
		printf("bench_file --gpu: %s\n", desc);
		if ((rc = kernels_init(0, desc, sizeof(desc))) != 0) {
			fprintf(stderr, "bench_file: kernels_init: %s\n", desc);
			return 1;
		}
	}
	/* The raw loop holds every file open; root may raise the limit. */
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
		getrlimit(RLIMIT_NOFILE, &rl);
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	log_init(LOG_LEVEL_WARN);
	if (stat(dir, &st) == 0)
		snprintf(bench_dev_stat, sizeof(bench_dev_stat), "/sys/dev/block/%u:%u/stat",
		    major(st.st_dev), minor(st.st_dev));
	if (measure != NULL) {
		bench_scan_measure(dir, measure);
		return 0;
	}
	if (publish > 0)
		bench_publish(argv[0], dir, publish, len_set != 0 ? len : 16 * KIB, dram_mib);
	else if (objects > 0)
		bench_scan(dir, objects, len);
	else if (gpu) {
		bench_reads_gpu(dir, sizes, total, runs, readers, depth);
		kernels_fini();
	}
	else
		bench_reads(dir, sizes, total, runs, readers, depth, buffered);
	if (getenv("BENCH_KEEP") == NULL) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s/root'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "bench_file: could not remove %s/root\n", dir);
	}
	return 0;
}
