/*
 * Control-path benchmark: PROBE and ADMIT+RELEASE round trips per second
 * and their p50/p99 latency, over the Unix socket, through libl3kv, with
 * 1..N client connections.
 *
 *   bench_control -s SOCK -p PAGES -c CONNS -t SECONDS
 *       -o probe|admit|admit-nb|admit-cork|rtt
 *
 * probe: one PROBE. admit: ADMIT, then RELEASE of its lease once ADMIT
 * answered, the next ADMIT once RELEASE answered (two round trips a
 * pair). admit-nb: RELEASE is submitted when ADMIT answers and the next
 * ADMIT right after it, without waiting for RELEASE, whose completion is
 * drained on a later poll, as an engine's scheduler does (one round trip
 * a pair; two sendmsg). admit-cork: the same two requests submitted
 * between l3kv_cork() and l3kv_uncork(), so they leave in one sendmsg
 * (one round trip, one write each way). rtt: RELEASE of a lease that does
 * not exist, answered not_found: the round-trip floor of this machine,
 * the daemon doing next to nothing. Every pair's ADMIT is a new request
 * id over PAGES pages that all hit, and every lease is released.
 * A setup connection publishes PAGES pages first (every connection then
 * hits all of them). Like redis-benchmark, one process drives every
 * connection through the non-blocking API, one operation in flight per
 * connection, from one epoll set (redis-benchmark's ae loop is epoll
 * too) over the connections' l3kv_fd(). Prints: op pages conns ops/s keys/s p50_us p99_us; ops are
 * pairs for the admit modes, keys/s is ops/s x PAGES.
 * tests/bench/control.sh runs it side by side with redis-benchmark.
 */
#include <sys/epoll.h>
#include <sys/mman.h>


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

/* One connection of the closed loop: one request (or a pair) in flight. */
struct bconn {
	struct l3kv	*k;
	int		 memfd;
	unsigned	 idx;
	uint64_t	 n;		/* requests started */
	double		 t0;		/* when the current operation started */
	int		 phase;		/* admit: 0 waiting ADMIT, 1 waiting RELEASE */
};

static void
bconn_start(struct bconn *b, const uint8_t *h, uint32_t pages, int mode)
{
	struct l3kv_admit_args	a;
	uint64_t		ticket;
	uint32_t		hit;
	int			rc;

	(void)hit;
	b->t0 = now_s();
	b->phase = 0;
	if (mode == 0) {
		rc = l3kv_submit_probe(b->k, h, pages, &ticket);
	} else if (mode == 4) {
		rc = l3kv_submit_release(b->k, 0, &ticket);	/* no lease 0: not_found */
	} else {
		memset(&a, 0, sizeof(a));
		a.request_id = ((uint64_t)b->idx << 40) | b->n;
		a.hashes = h;
		a.npages = pages;
		a.reserved_pages = pages;
		a.state_slot = L3KV_SLOT_NONE;
		rc = l3kv_submit_admit(b->k, &a, &ticket);
	}
	if (rc != 0)
		die("submit", rc);
	b->n++;
}

/*
 * Handles one completion; returns 1 when an operation (PROBE, rtt, or
 * ADMIT+RELEASE) finished. mode 1 waits for RELEASE before the next
 * ADMIT; modes 2 and 3 send RELEASE and the next ADMIT together (3
 * corked: the caller uncorks after the next ADMIT).
 */
static int
bconn_complete(struct bconn *b, struct l3kv_completion *c, uint32_t pages, int mode)
{
	struct l3kv_admit_result	ar;
	uint64_t			ticket;
	int				rc;

	if (mode == 4)
		return c->status == -ENOENT ? 1 : (die("rtt", c->status), 0);
	if (c->status != 0)
		die("request", c->status);
	if (c->op == L3KV_OP_PROBE)
		return 1;
	if (c->op == L3KV_OP_RELEASE)
		return mode == 1;
	if ((rc = l3kv_admit_result(c, &ar)) != 0 || ar.admitted_pages != pages)
		die("admit: short promise", rc != 0 ? rc : -EIO);
	if (mode == 3)
		l3kv_cork(b->k);
	if ((rc = l3kv_submit_release(b->k, ar.lease, &ticket)) != 0)
		die("submit release", rc);
	b->phase = 1;
	return mode >= 2;
}

/* Latencies of finished operations, in seconds. */
struct lat {
	double		*v;
	size_t		 n;
	size_t		 cap;
};

/*
 * Takes every completion a connection has, up to 16 at a time, starting
 * the next operation where one finished. Returns what ended the drain
 * (-EAGAIN when all was taken).
 */
static int
bconn_drain(struct bconn *b, const uint8_t *h, uint32_t pages, int mode, double end,
    struct lat *lat)
{
	struct l3kv_completion	c[16];
	double			t;
	int			rc, j;

	while ((rc = l3kv_poll_completions(b->k, c, 16)) > 0) {
		for (j = 0; j < rc; j++) {
			if (bconn_complete(b, &c[j], pages, mode)) {
				t = now_s();
				if (lat->n == lat->cap) {
					lat->cap *= 2;
					lat->v = realloc(lat->v, lat->cap * sizeof(double));
				}
				lat->v[lat->n++] = t - b->t0;
				if (t < end)
					bconn_start(b, h, pages, mode);
				if (mode == 3 && l3kv_uncork(b->k) != 0)
					die("uncork", -EIO);
			}
			l3kv_completion_release(&c[j]);
		}
	}
	return rc;
}

static int
run(const char *sock, uint32_t pages, unsigned conns, double seconds, int mode, double **lat,
    size_t *nlat)
{
	struct epoll_event	 ev[64];
	struct bconn		 b[64];
	struct lat		 l;
	uint8_t			*h = malloc((size_t)pages * L3KV_HASH_LEN);
	double			 end;
	unsigned		 i;
	int			 rc, n, ep;

	make_hashes(h, pages);
	if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
		die("epoll", -errno);
	l.cap = 1 << 16;
	l.n = 0;
	l.v = malloc(l.cap * sizeof(double));
	for (i = 0; i < conns; i++) {
		memset(&b[i], 0, sizeof(b[i]));
		b[i].idx = i;
		b[i].k = attach(sock, i, pages, &b[i].memfd);
		memset(&ev[0], 0, sizeof(ev[0]));
		ev[0].events = EPOLLIN;
		ev[0].data.u32 = i;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, l3kv_fd(b[i].k), &ev[0]) != 0)
			die("epoll_ctl", -errno);
	}
	end = now_s() + seconds;
	for (i = 0; i < conns; i++)
		bconn_start(&b[i], h, pages, mode);
	while (now_s() < end) {
		if ((n = epoll_wait(ep, ev, (int)conns, 1000)) <= 0)
			continue;
		for (i = 0; i < (unsigned)n; i++)
			if ((rc = bconn_drain(&b[ev[i].data.u32], h, pages, mode, end, &l)) != -EAGAIN)
				die("poll", rc);
	}
	for (i = 0; i < conns; i++) {
		l3kv_close(b[i].k);
		close(b[i].memfd);
	}
	close(ep);
	free(h);
	*lat = l.v;
	*nlat = l.n;
	return 0;
}

int
main(int argc, char **argv)
{
	const char	*sock = NULL, *op = "probe";
	struct l3kv	*k;
	uint32_t	 pages = 64;
	double		 seconds = 2, *all = NULL;
	size_t		 total = 0;
	unsigned	 conns = 1;
	int		 ch, memfd, mode;
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
			    "-o probe|admit|admit-nb|admit-cork|rtt\n");
			return 2;
		}
	}
	mode = strcmp(op, "probe") == 0 ? 0 : strcmp(op, "admit") == 0 ? 1 :
	    strcmp(op, "admit-nb") == 0 ? 2 : strcmp(op, "admit-cork") == 0 ? 3 :
	    strcmp(op, "rtt") == 0 ? 4 : -1;
	if (sock == NULL || conns == 0 || conns > 64 || pages == 0 || mode < 0)
		return 2;
	k = attach(sock, 999, pages, &memfd);
	h = malloc((size_t)pages * L3KV_HASH_LEN);
	make_hashes(h, pages);
	publish(k, h, pages);
	run(sock, pages, conns, seconds, mode, &all, &total);
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
