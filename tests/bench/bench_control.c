/*
 * Control-path benchmark: PROBE and ADMIT+RELEASE round trips per second
 * and their p50/p99 latency, over the Unix socket, through libl3kv, with
 * 1..N client connections (one process each, as engines are).
 *
 *   bench_control -s SOCK -p PAGES -c CONNS -t SECONDS -o probe|admit
 *
 * Connection 0 publishes PAGES pages first (every connection then hits
 * all of them). Prints one line: op pages conns ops/s keys/s p50_us p99_us.
 * tests/bench/control.sh runs it side by side with redis-benchmark.
 */
#include <sys/mman.h>
#include <sys/wait.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "l3kv.h"

#define PAGE_BYTES	4096
#define MAX_SAMPLES	(1 << 20)

static double
now_s(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int
cmp_double(const void *a, const void *b)
{
	double	x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void
die(const char *what, int rc)
{
	fprintf(stderr, "bench_control: %s: %s\n", what, l3kv_strerror(rc));
	exit(1);
}

/* Attaches as a one-rank group whose KV region holds `pages` pages. */
static struct l3kv *
attach(const char *sock, unsigned idx, uint32_t pages, int *memfd)
{
	struct l3kv_attach_args	a;
	struct l3kv_region	r;
	struct l3kv_pool	p;
	struct l3kv		*k;
	char			group[32];
	int			rc;

	if ((rc = l3kv_connect(sock, 5000, &k)) != 0)
		die("connect", rc);
	*memfd = memfd_create("bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (*memfd < 0 || ftruncate(*memfd, (off_t)pages * PAGE_BYTES) != 0)
		die("memfd", -errno);
	memset(&p, 0, sizeof(p));
	p.name = "kv";
	p.kind = L3KV_POOL_KV;
	p.hit_policy = L3KV_HIT_ALL_PAGES;
	p.layers = 1;
	p.object_bytes = PAGE_BYTES;
	memset(&r, 0, sizeof(r));
	r.kind = L3KV_MEM_MEMFD;
	r.layout = L3KV_LAYOUT_PAGE_FIRST;
	r.fd = *memfd;
	r.size = (uint64_t)pages * PAGE_BYTES;
	r.num_pages = pages;
	r.page_tokens = 64;
	r.layers = 1;
	r.token_bytes = PAGE_BYTES / 64;
	r.page_stride = PAGE_BYTES;
	r.layer_stride = PAGE_BYTES / 64;
	r.token_stride = PAGE_BYTES / 64;
	memset(&a, 0, sizeof(a));
	a.layout.model = "bench";
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
	snprintf(group, sizeof(group), "bench-%u-%d", idx, (int)getpid());
	a.group = group;
	a.group_size = 1;
	a.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	a.write = L3KV_WRITE_THROUGH;
	if ((rc = l3kv_attach(k, &a, NULL)) != 0)
		die("attach", rc);
	return k;
}

static void
make_hashes(uint8_t *h, uint32_t n)
{
	uint32_t	i, j;

	for (i = 0; i < n; i++)
		for (j = 0; j < L3KV_HASH_LEN; j++)
			h[(size_t)i * L3KV_HASH_LEN + j] = (uint8_t)(i * 31 + j * 7 + (i >> 8) + 1);
}

static void
publish(struct l3kv *k, const uint8_t *h, uint32_t n)
{
	struct l3kv_publish_result	 res;
	struct l3kv_publish_page	*pg = calloc(n, sizeof(*pg));
	uint32_t			 i;
	int				 rc;

	for (i = 0; i < n; i++) {
		memcpy(pg[i].hash, h + (size_t)i * L3KV_HASH_LEN, L3KV_HASH_LEN);
		pg[i].src_page = i;
	}
	if ((rc = l3kv_publish(k, 0, pg, n, &res)) != 0)
		die("publish", rc);
	free(pg);
}

/* One connection's loop; writes "count" and its sorted latencies to fd. */
static void
client(const char *sock, unsigned idx, uint32_t pages, double seconds, int admit, int out)
{
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 a;
	struct l3kv			*k;
	uint8_t				*h = malloc((size_t)pages * L3KV_HASH_LEN);
	double				*lat = malloc(MAX_SAMPLES * sizeof(double)), t0, t1, end;
	uint32_t			 hit;
	size_t				 n = 0;
	int				 memfd, rc;

	k = attach(sock, idx, pages, &memfd);
	make_hashes(h, pages);
	memset(&a, 0, sizeof(a));
	a.hashes = h;
	a.npages = pages;
	a.reserved_pages = pages;
	a.state_slot = L3KV_SLOT_NONE;
	end = now_s() + seconds;
	while ((t0 = now_s()) < end && n < MAX_SAMPLES) {
		if (admit) {
			a.request_id = ((uint64_t)idx << 40) | n;
			if ((rc = l3kv_admit(k, &a, &ar)) != 0)
				die("admit", rc);
			if (ar.admitted_pages != pages)
				die("admit: short promise", -EIO);
			if ((rc = l3kv_release(k, ar.lease)) != 0)
				die("release", rc);
		} else {
			if ((rc = l3kv_probe(k, h, pages, &hit)) != 0)
				die("probe", rc);
			if (hit != pages)
				die("probe: short hit", -EIO);
		}
		t1 = now_s();
		lat[n++] = t1 - t0;
	}
	if (write(out, &n, sizeof(n)) != sizeof(n) ||
	    write(out, lat, n * sizeof(double)) != (ssize_t)(n * sizeof(double)))
		exit(1);
	l3kv_close(k);
	close(memfd);
	exit(0);
}

static size_t
read_all(int fd, void *buf, size_t len)
{
	size_t	got = 0;
	ssize_t	r;

	while (got < len && (r = read(fd, (char *)buf + got, len - got)) > 0)
		got += (size_t)r;
	return got;
}

int
main(int argc, char **argv)
{
	const char	*sock = NULL, *op = "probe";
	struct l3kv	*k;
	uint32_t	 pages = 64;
	double		 seconds = 2, *all = NULL;
	size_t		 total = 0, n;
	unsigned	 conns = 1, i;
	int		 ch, memfd, pipes[64][2], st;
	uint8_t		*h;

	while ((ch = getopt(argc, argv, "s:p:c:t:o:")) != -1) {
		switch (ch) {
		case 's': sock = optarg; break;
		case 'p': pages = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'c': conns = (unsigned)strtoul(optarg, NULL, 10); break;
		case 't': seconds = strtod(optarg, NULL); break;
		case 'o': op = optarg; break;
		default:
			fprintf(stderr, "usage: bench_control -s SOCK -p PAGES -c CONNS -t SECONDS "
			    "-o probe|admit\n");
			return 2;
		}
	}
	if (sock == NULL || conns == 0 || conns > 64 || pages == 0)
		return 2;
	k = attach(sock, 999, pages, &memfd);
	h = malloc((size_t)pages * L3KV_HASH_LEN);
	make_hashes(h, pages);
	publish(k, h, pages);
	for (i = 0; i < conns; i++) {
		if (pipe(pipes[i]) != 0)
			return 1;
		if (fork() == 0) {
			close(pipes[i][0]);
			client(sock, i, pages, seconds, strcmp(op, "admit") == 0, pipes[i][1]);
		}
		close(pipes[i][1]);
	}
	for (i = 0; i < conns; i++) {
		if (read_all(pipes[i][0], &n, sizeof(n)) != sizeof(n))
			return 1;
		all = realloc(all, (total + n) * sizeof(double));
		if (read_all(pipes[i][0], all + total, n * sizeof(double)) != n * sizeof(double))
			return 1;
		total += n;
		close(pipes[i][0]);
	}
	for (i = 0; i < conns; i++)
		wait(&st);
	qsort(all, total, sizeof(double), cmp_double);
	printf("%s pages=%u conns=%u ops/s=%.0f keys/s=%.0f p50_us=%.1f p99_us=%.1f\n", op,
	    pages, conns, (double)total / seconds, (double)total * pages / seconds,
	    all[total / 2] * 1e6, all[(size_t)((double)total * 0.99)] * 1e6);
	l3kv_close(k);
	close(memfd);
	free(all);
	free(h);
	return 0;
}
