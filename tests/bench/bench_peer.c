/*
 * The peer tier's restore (issue 14): ADMIT to READY through libl3kv on
 * daemon B (node 2 of tests/netns.sh) of objects published on daemon A
 * (node 1), provider tcp;ofi_rxm, the landed bytes checked against A's
 * checksums by B and compared byte for byte here after each restore.
 *
 * The role is A and B. A PUBLISH on A offers the stripes homed on B to B,
 * which then holds them before any ADMIT; so each request (one stripe of
 * NP pages) is published on A and kept only when B's offers_stored did
 * not move (its home is A), and B pulls every page it restores. Keys are
 * fresh in every round (a prefix never used before), so nothing is
 * already in B's DRAM.
 *
 * Per size: requests of NP pages of that size, MIB MiB per measurement,
 * AHEAD of them in flight at once, as an engine's scheduler admits the
 * next requests while earlier ones restore: each request's ADMIT (B asks
 * A for a lease and pulls) is submitted without waiting
 * (l3kv_submit_admit), and once it is answered, and every earlier
 * request's has been, its RESTORE (l3kv_submit_restore, into that
 * request's own pages of the rank) follows; a request ends at READY (the
 * pages are there), and then the next ADMIT leaves. With AHEAD 1 (the
 * default) that is one request at a time: ADMIT, RESTORE, the next. The
 * time is the wall time from the first ADMIT to the last READY; GB/s is
 * the bytes restored over it. Every restored page is compared byte for
 * byte after the clock stopped; an ADMIT that came short (A evicted part
 * of the stripe) is released and left out of the bytes, not of the time.
 * Contiguous objects on A are pulled in reads of up to
 * 1 MiB (peer.c's PEER_RUN_MAX) whatever the size's label; STATS reads
 * and pulls are printed with -v.
 *
 * Each size of each round gets fresh daemons (B restarted: nothing of a
 * previous round in its DRAM) and a warm-up, see bp_up.
 *
 *   bench_peer [-a AHEAD] [-B BUILD] [-D DRAM_MIB] [-W WARM_MIB] [-r ROUNDS] [-L LANES]
 *              [-l] [-m MIB] [-p] [-s SIZE] [-S SCRIPT] [-v]
 *     -L gives both daemons peer.lanes LANES (1 to 8; 1, the default, sets
 *     no key, for a daemon from before lanes); -l puts both daemons on
 *     loopback (127.0.0.1, no namespaces: a host without veth or
 *     bridges); -s SIZE measures only that size (0 to 4, the table's
 *     order: for a profile of one size); ROUNDS rounds (each every size once), one line per round and size
 *     ("peer ROUND LABEL GB/s"), then the medians; -v adds how long an
 *     ADMIT took to be answered, the same requests restored again (as
 *     many ahead) from B's DRAM, reads and pulls; -p measures what the
 *     pulls cost each daemon's other clients (bp_probe_main): PROBE round
 *     trips on a connection of their own to A and to B, idle just before
 *     the restores and while they run, median and 99th percentile.
 *     Needs root (77 otherwise); tests/bench/peer.sh runs it.
 */
#include <sys/mman.h>
#include <sys/poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "l3kv.h"

#define BP_NP		16	/* pages of a request: one stripe (peer.stripe_pages) */
#define BP_TOKENS	16
#define BP_LAYERS	4

static const struct {
	const char	*label;
	uint32_t	 token_bytes;	/* page = BP_TOKENS * BP_LAYERS * token_bytes */
} bp_sizes[] = {
	{ "36 KiB object", 576 },
	{ "256 KiB object", 4096 },
	{ "2.25 MiB object", 36864 },
	{ "1 MiB coalesced", 1024 },	/* 16 x 64 KiB, contiguous */
	{ "8 MiB coalesced", 8192 },	/* 16 x 512 KiB, contiguous */
};
#define BP_NSIZES	(sizeof(bp_sizes) / sizeof(bp_sizes[0]))

struct bp_daemon {
	char	dir[256];
	char	sock[300];
	pid_t	pid;
};

struct bp_rank {
	struct l3kv		*k;
	struct l3kv_pool	 pool;
	struct l3kv_region	 region;
	struct l3kv_attach_args	 args;
	uint8_t			*mem;
	size_t			 page;
	uint32_t		 npages;	/* of the region: BP_NP per request restored */
	int			 fd;
};

/* One request of a measurement on its way from ADMIT to READY. */
struct bp_req {
	uint32_t			prefix;
	int				state;
#define BP_R_IDLE	0	/* not submitted yet */
#define BP_R_ADMITTING	1	/* ADMIT submitted */
#define BP_R_ADMITTED	2	/* answered, waiting for the earlier requests' RESTOREs */
#define BP_R_RESTORING	3	/* RESTORE submitted */
#define BP_R_RELEASING	4	/* came short: RELEASE submitted */
#define BP_R_DONE	5	/* READY, or short and released */
	uint64_t			ticket;	/* of the ADMIT, then of the RESTORE or RELEASE */
	double				t_admit;	/* when its ADMIT was submitted */
	struct l3kv_admit_result	ar;
	uint8_t				h[BP_NP * L3KV_HASH_LEN];
	uint32_t			dst[BP_NP];
};

static char		bp_ns[64];
static unsigned		bp_loop_port;	/* -l: both daemons on loopback, from this port */
static struct bp_daemon	bp_d[2];
static const char	*bp_script = "tests/netns.sh";
static int		bp_verbose;
static unsigned		bp_dram_mib = 256;	/* each daemon's tiers.dram.size */
static unsigned		bp_warm_mib = 192;	/* published on each before measuring */
static unsigned		bp_ahead = 1;	/* requests between ADMIT and READY at once */
static unsigned		bp_lanes = 1;	/* -L: each daemon's peer.lanes */
static double		bp_admit_s;	/* of a measurement: ADMIT submitted to answered, summed */
static struct bp_rank	*bp_owner;	/* -v: A's rank of the size measured */
static uint64_t		bp_req;		/* ADMIT's request ids */
static double		bp_local_s;	/* -v: the same restores from B's DRAM, wall */
static int		bp_probing;	/* -p */

/*
 * -p: an engine's other requests to a daemon while it pulls or serves. A
 * rank of a group of its own, one page, on its own connection; a thread
 * sends one PROBE at a time, BP_PROBE_GAP_US apart, and keeps each round
 * trip until told to stop. It probes a stripe the daemon holds and is the
 * home of (A: a request's; B: one that A offered it), so that the answer
 * is the loop's alone, with no question to the other daemon; `missed`
 * counts the answers that were not all of it.
 */
#define BP_PROBE_GAP_US		200
#define BP_PROBE_IDLE		200	/* round trips before the restores */
#define BP_PROBE_MAX		100000
struct bp_prober {
	struct bp_rank	 r;
	pthread_t	 t;
	int		 stop;		/* atomic */
	uint8_t		 h[BP_NP * L3KV_HASH_LEN];
	double		*us;		/* BP_PROBE_MAX round trips */
	unsigned	 n;
	unsigned	 max;		/* this phase's: BP_PROBE_IDLE or BP_PROBE_MAX */
	unsigned	 missed;
};

static void
bp_die(const char *fmt, const char *arg)
{
	fprintf(stderr, "bench_peer: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	exit(1);
}

static void
bp_script_run(const char *args)
{
	char	cmd[512];

	snprintf(cmd, sizeof(cmd), "%s %s", bp_script, args);
	if (system(cmd) != 0)
		bp_die("%s failed", cmd);
}

/* Daemon i in node i + 1: A (n0) or B (n1) of a two-member role. */
static void
bp_start(unsigned i, const char *build)
{
	struct bp_daemon	*d = &bp_d[i];
	char			 cfg[2048], path[512], bin[512], host[2][32], fab[32], lanes[32] = "";
	FILE			*f;
	int			 fd, t;

	snprintf(d->dir, sizeof(d->dir), "%s/l3kv-bench-peer-XXXXXX",
	    getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
	if (mkdtemp(d->dir) == NULL)
		bp_die("mkdtemp: %s", strerror(errno));
	memcpy(d->sock, d->dir, sizeof(d->dir));
	strcat(d->sock, "/l3kvd.sock");
	/* Node K is 10.77.0.K:7400; on loopback (-l) 127.0.0.1 and a port of this run's. */
	if (bp_loop_port != 0)
		for (t = 0; t < 2; t++)
			snprintf(host[t], sizeof(host[t]), "127.0.0.1:%u", bp_loop_port + (unsigned)t);
	else
		for (t = 0; t < 2; t++)
			snprintf(host[t], sizeof(host[t]), "10.77.0.%d:7400", t + 1);
	snprintf(fab, sizeof(fab), "%s", host[i]);
	*strchr(fab, ':') = '\0';
	/* peer.lanes only when asked for: a daemon from before lanes knows no such key. */
	if (bp_lanes > 1)
		snprintf(lanes, sizeof(lanes), ", \"lanes\": %u", bp_lanes);
	snprintf(cfg, sizeof(cfg), "{\"socket\": {\"path\": \"%s\", \"mode\": \"0600\"}, "
	    "\"log\": {\"level\": \"info\"}, \"tiers\": {\"dram\": {\"size\": \"%u MiB\"}}, "
	    "\"peer\": {\"id\": \"n%u\", \"listen\": \"%s\", \"fabric_addr\": \"%s\", "
	    "\"provider\": \"tcp\"%s, \"members\": [{\"id\": \"n0\", \"addr\": \"%s\"}, "
	    "{\"id\": \"n1\", \"addr\": \"%s\"}]}}\n", d->sock, bp_dram_mib, i, host[i], fab,
	    lanes, host[0], host[1]);
	snprintf(path, sizeof(path), "%s/l3kvd.json", d->dir);
	if ((f = fopen(path, "w")) == NULL || fputs(cfg, f) < 0 || fclose(f) != 0)
		bp_die("cannot write %s", path);
	snprintf(bin, sizeof(bin), "%s/l3kvd", build);
	if ((d->pid = fork()) < 0)
		bp_die("fork: %s", strerror(errno));
	if (d->pid == 0) {
		char	ns[128], log[512];

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		snprintf(ns, sizeof(ns), "/run/netns/%s-%u", bp_ns, i + 1);
		if (bp_loop_port == 0 && ((fd = open(ns, O_RDONLY | O_CLOEXEC)) < 0 ||
		    setns(fd, CLONE_NEWNET) != 0))
			_exit(126);
		snprintf(log, sizeof(log), "%s/l3kvd.log", d->dir);
		if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600)) >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execl(bin, "l3kvd", "-f", path, (char *)NULL);
		_exit(127);
	}
	for (t = 0; t < 300; t++) {
		struct stat	st;

		if (stat(d->sock, &st) == 0)
			return;
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid)
			bp_die("l3kvd exited; see %s/l3kvd.log", d->dir);
		usleep(100000);
	}
	bp_die("l3kvd did not start; see %s/l3kvd.log", d->dir);
}

static void
bp_stop(unsigned i)
{
	char	cmd[300];

	if (bp_d[i].pid <= 0)
		return;
	kill(bp_d[i].pid, SIGTERM);
	waitpid(bp_d[i].pid, NULL, 0);
	bp_d[i].pid = 0;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", bp_d[i].dir);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_peer: could not remove %s\n", bp_d[i].dir);
}

static json_t *
bp_stats(struct l3kv *k)
{
	char	*s;
	json_t	*j;

	if (l3kv_stats(k, &s) != 0)
		bp_die("STATS: %s", l3kv_last_error(k));
	j = json_loads(s, 0, NULL);
	free(s);
	if (j == NULL)
		bp_die("%s", "STATS is not JSON");
	return j;
}

static long long
bp_stat(struct l3kv *k, const char *sect, const char *key)
{
	json_t		*j = bp_stats(k);
	long long	 v = json_integer_value(json_object_get(json_object_get(j, sect), key));

	json_decref(j);
	return v;
}

/* Sum of key over daemon k's peers (STATS peers.peers[]). */
static long long
bp_peer_sum(struct l3kv *k, const char *key)
{
	json_t		*j = bp_stats(k), *e;
	long long	 v = 0;
	size_t		 i;

	json_array_foreach(json_object_get(json_object_get(j, "peers"), "peers"), i, e)
		v += json_integer_value(json_object_get(e, key));
	json_decref(j);
	return v;
}

static int
bp_peer_up(struct l3kv *k)
{
	json_t		*j = bp_stats(k), *e;
	size_t		 i;
	int		 up = 0;

	json_array_foreach(json_object_get(json_object_get(j, "peers"), "peers"), i, e)
		up += strcmp(json_string_value(json_object_get(e, "state")), "up") == 0;
	json_decref(j);
	return up;
}

/* Rank of daemon d for one size, its memfd region npages pages. */
static void
bp_rank(struct bp_rank *r, unsigned d, unsigned size, uint32_t npages, const char *group)
{
	static char	models[BP_NSIZES][32];
	uint32_t	tb = bp_sizes[size].token_bytes;
	int		t;

	memset(r, 0, sizeof(*r));
	r->page = (size_t)BP_TOKENS * BP_LAYERS * tb;
	r->npages = npages;
	r->fd = memfd_create("bench-peer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (r->fd < 0 || ftruncate(r->fd, (off_t)(r->page * npages)) != 0)
		bp_die("memfd: %s", strerror(errno));
	r->mem = mmap(NULL, r->page * npages, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	if (r->mem == MAP_FAILED)
		bp_die("mmap: %s", strerror(errno));
	r->region = (struct l3kv_region){ .pool = 0, .kind = L3KV_MEM_MEMFD,
	    .layout = L3KV_LAYOUT_PAGE_FIRST, .fd = r->fd, .size = r->page * npages,
	    .num_pages = npages, .page_tokens = BP_TOKENS, .layers = BP_LAYERS, .token_bytes = tb,
	    .page_stride = r->page, .layer_stride = tb, .token_stride = (uint64_t)BP_LAYERS * tb };
	r->pool = (struct l3kv_pool){ "kv", L3KV_POOL_KV, L3KV_HIT_ALL_PAGES, 0, BP_LAYERS,
	    r->page, "latent:bench:fp8_e4m3" };
	snprintf(models[size], sizeof(models[size]), "bench-peer-%u", size);
	r->args.layout = (struct l3kv_layout){ .model = models[size], .kv_dtype = "fp8_e4m3",
	    .hash_scheme = "sha256", .hash_len = 32, .tp_size = 1, .dcp_size = 1, .pp_size = 1,
	    .cp_size = 1, .host_layout = L3KV_LAYOUT_PAGE_FIRST, .attention = L3KV_ATTN_MLA,
	    .page_tokens = BP_TOKENS, .logical_page_tokens = BP_TOKENS };
	r->args.pools = &r->pool;
	r->args.npools = 1;
	r->args.regions = &r->region;
	r->args.nregions = 1;
	r->args.group = group != NULL ? group : models[size];
	r->args.group_size = 1;
	r->args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	r->args.write = L3KV_WRITE_THROUGH;
	for (t = 0; l3kv_connect(bp_d[d].sock, 5000, &r->k) != 0; t++) {
		if (t == 100)
			bp_die("cannot connect to %s", bp_d[d].sock);
		usleep(100000);
	}
	if (l3kv_attach(r->k, &r->args, NULL) != 0)
		bp_die("attach: %s", l3kv_last_error(r->k));
}

static void
bp_hash(uint32_t prefix, uint32_t i, uint8_t *h)
{
	uint32_t	j, x = prefix * 2654435761U + i * 40503U + 1;

	for (j = 0; j < L3KV_HASH_LEN; j++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		h[j] = (uint8_t)x;
	}
}

static void
bp_content(uint8_t *p, size_t len, uint32_t prefix, uint32_t i)
{
	uint64_t	x = ((uint64_t)prefix << 32 | i) * 0x9e3779b97f4a7c15ULL + 1;
	size_t		o;

	for (o = 0; o + 8 <= len; o += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + o, &x, 8);
	}
}

/*
 * Publishes request `prefix` (BP_NP pages) on A; 1 when its home is A
 * (B's offers_stored did not move once A's offer pins are gone).
 */
static int
bp_publish(struct bp_rank *a, struct bp_rank *b, uint32_t prefix)
{
	struct l3kv_publish_page	pg[BP_NP];
	struct l3kv_publish_result	res;
	long long			before = bp_stat(b->k, "peers", "offers_stored");
	uint32_t			i;
	int				t;

	for (i = 0; i < BP_NP; i++) {
		bp_content(a->mem + i * a->page, a->page, prefix, i);
		bp_hash(prefix, i, pg[i].hash);
		pg[i].src_page = i;
	}
	if (l3kv_publish(a->k, 0, pg, BP_NP, &res) != 0)
		bp_die("publish: %s", l3kv_last_error(a->k));
	if (res.stored != BP_NP)
		bp_die("%s", "publish stored fewer pages than asked (fresh keys)");
	for (t = 0; bp_stat(a->k, "dram", "pins") != 0; t++) {
		if (t == 1000)
			bp_die("%s", "A's offer pins never went");
		usleep(2000);
	}
	return bp_stat(b->k, "peers", "offers_stored") == before;
}

/* The request of r[0..n) whose ADMIT, RESTORE or RELEASE has ticket t. */
static struct bp_req *
bp_req_of(struct bp_req *r, unsigned n, uint64_t t)
{
	unsigned	k;

	for (k = 0; k < n; k++)
		if (r[k].state >= BP_R_ADMITTING && r[k].state < BP_R_DONE && r[k].ticket == t)
			return &r[k];
	bp_die("%s", "a completion for no request in flight");
	return NULL;
}

/* One completion of B's connection, as it moves its request on: 1 when it ended. */
static int
bp_complete(struct bp_req *r, unsigned n, struct l3kv_completion *c, double *t_ready)
{
	struct l3kv_restore_result	rr;
	struct bp_req			*q = bp_req_of(r, n, c->ticket);

	if (c->status != 0)
		bp_die("%s", c->payload != NULL ? c->payload : l3kv_strerror(c->status));
	switch (q->state) {
	case BP_R_ADMITTING:
		if (l3kv_admit_result(c, &q->ar) != 0)
			bp_die("%s", "admit: a reply that is not ADMIT's");
		bp_admit_s += bench_now() - q->t_admit;
		q->state = BP_R_ADMITTED;
		return 0;
	case BP_R_RESTORING:
		if (l3kv_restore_result(c, &rr) != 0)
			bp_die("%s", "restore: a reply that is not RESTORE's");
		*t_ready = bench_now();
		if (rr.pages != BP_NP)
			bp_die("%s", "restored fewer pages than admitted");
		break;
	}
	q->state = BP_R_DONE;	/* READY, or released */
	return 1;
}

static void *
bp_probe_main(void *arg)
{
	struct bp_prober	*p = arg;
	uint32_t		 hit;
	double			 t;

	while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE) && p->n < p->max) {
		t = bench_now();
		if (l3kv_probe(p->r.k, p->h, BP_NP, &hit) != 0)
			bp_die("probe: %s", l3kv_last_error(p->r.k));
		p->us[p->n++] = (bench_now() - t) * 1e6;
		p->missed += hit != BP_NP;
		usleep(BP_PROBE_GAP_US);
	}
	return NULL;
}

/* Starts p's thread for a phase of at most max round trips. */
static void
bp_probe_start(struct bp_prober *p, unsigned max)
{
	p->n = 0;
	p->max = max;
	__atomic_store_n(&p->stop, 0, __ATOMIC_RELEASE);
	if (pthread_create(&p->t, NULL, bp_probe_main, p) != 0)
		bp_die("%s", "pthread_create failed");
}

/*
 * Ends the phase, now or (now 0) once its round trips are done: their
 * median and 99th percentile, in us.
 */
static void
bp_probe_end(struct bp_prober *p, int now, double *p50, double *p99)
{
	if (now)
		__atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
	pthread_join(p->t, NULL);
	if (p->n == 0) {
		*p50 = *p99 = 0;
		return;
	}
	*p50 = bench_median(p->us, (int)p->n);	/* sorts */
	*p99 = p->us[(size_t)((p->n - 1) * 0.99)];
}

/* Daemon d's prober for size `size`, probing request prefix (published on A). */
static void
bp_probe_open(struct bp_prober *p, unsigned d, unsigned size, uint32_t prefix)
{
	static char	groups[2][BP_NSIZES][32];
	uint32_t	i;

	memset(p, 0, sizeof(*p));
	snprintf(groups[d][size], sizeof(groups[d][size]), "bench-probe-%u-%u", d, size);
	bp_rank(&p->r, d, size, 1, groups[d][size]);
	for (i = 0; i < BP_NP; i++)
		bp_hash(prefix, i, p->h + i * L3KV_HASH_LEN);
	if ((p->us = calloc(BP_PROBE_MAX, sizeof(*p->us))) == NULL)
		bp_die("%s", "out of memory");
}

static void
bp_probe_close(struct bp_prober *p)
{
	l3kv_close(p->r.k);
	munmap(p->r.mem, p->r.page * p->r.npages);
	close(p->r.fd);
	free(p->us);
}

/*
 * ADMIT to READY on B of the n requests keep[], up to bp_ahead of them in
 * flight at once, request k into B's pages k * BP_NP on; returns the wall
 * seconds from the first ADMIT to the last READY and the short ADMITs in
 * *short_. The bytes are compared with A's after the clock stopped.
 */
static double
bp_restore_all(struct bp_rank *b, const uint32_t *keep, unsigned n, unsigned *short_)
{
	struct l3kv_completion	 c[8];
	struct pollfd		 pfd = { l3kv_fd(b->k), POLLIN, 0 };
	struct bp_req		*r;
	struct l3kv_admit_args	 aa;
	uint8_t			*want;
	unsigned		 k, i, next_admit = 0, next_restore = 0, done = 0, busy = 0;
	double			 t0, t_wait, t_ready = 0;
	int			 got;

	if ((r = calloc(n, sizeof(*r))) == NULL || (want = malloc(b->page)) == NULL)
		bp_die("%s", "out of memory");
	for (k = 0; k < n; k++) {
		r[k].prefix = keep[k];
		for (i = 0; i < BP_NP; i++) {
			bp_hash(keep[k], i, r[k].h + i * L3KV_HASH_LEN);
			r[k].dst[i] = k * BP_NP + i;
		}
	}
	memset(b->mem, 0xee, b->page * b->npages);
	bp_admit_s = 0;
	t0 = bench_now();
	while (done < n) {
		/*
		 * One scheduler step, in one write: RESTOREs of the requests
		 * answered (in order), then ADMITs up to the window.
		 */
		if (l3kv_cork(b->k) != 0)
			bp_die("cork: %s", l3kv_last_error(b->k));
		for (; next_restore < next_admit && r[next_restore].state == BP_R_ADMITTED;
		    next_restore++) {
			struct bp_req	*q = &r[next_restore];

			if (q->ar.admitted_pages == BP_NP) {
				if (l3kv_submit_restore(b->k, q->ar.lease, 0, q->dst, BP_NP,
				    &q->ticket) != 0)
					bp_die("restore: %s", l3kv_last_error(b->k));
				q->state = BP_R_RESTORING;
				continue;
			}
			/* A evicted part of it meanwhile, or B had no room: not a measurement. */
			(*short_)++;
			if (q->ar.admitted_pages == 0) {
				q->state = BP_R_DONE;
				done++;
				busy--;
				continue;
			}
			if (l3kv_submit_release(b->k, q->ar.lease, &q->ticket) != 0)
				bp_die("release: %s", l3kv_last_error(b->k));
			q->state = BP_R_RELEASING;
		}
		for (; next_admit < n && busy < bp_ahead; next_admit++, busy++) {
			struct bp_req	*q = &r[next_admit];

			aa = (struct l3kv_admit_args){ .request_id = ++bp_req, .hashes = q->h,
			    .npages = BP_NP, .reserved_pages = BP_NP,
			    .state_slot = L3KV_SLOT_NONE };
			q->t_admit = bench_now();
			if (l3kv_submit_admit(b->k, &aa, &q->ticket) != 0)
				bp_die("admit: %s", l3kv_last_error(b->k));
			q->state = BP_R_ADMITTING;
		}
		if (l3kv_uncork(b->k) != 0)
			bp_die("uncork: %s", l3kv_last_error(b->k));
		if (done == n)
			break;
		for (t_wait = bench_now(); (got = l3kv_poll_completions(b->k, c, 8)) == -EAGAIN;) {
			if (bench_now() - t_wait > 10)
				bp_die("%s", "B answered nothing in 10 s");
			poll(&pfd, 1, 100);
		}
		if (got < 0)
			bp_die("completions: %s", l3kv_strerror(got));
		for (i = 0; i < (unsigned)got; i++) {
			if (bp_complete(r, n, &c[i], &t_ready)) {
				done++;
				busy--;
			}
			l3kv_completion_release(&c[i]);
		}
	}
	for (k = 0; k < n; k++) {
		if (r[k].ar.admitted_pages != BP_NP) {
			if (bp_verbose) {
				uint32_t	 hit = 0;
				json_t		*j = bp_stats(b->k);
				char		*d = json_dumps(json_object_get(j, "dram"),
						    JSON_COMPACT);

				(void)l3kv_probe(bp_owner->k, r[k].h, BP_NP, &hit);
				fprintf(stderr, "bench_peer: ADMIT of %u pages admitted %u; A holds "
				    "%u now; B's dram now %s\n", BP_NP, r[k].ar.admitted_pages, hit, d);
				free(d);
				json_decref(j);
			}
			continue;
		}
		for (i = 0; i < BP_NP; i++) {
			bp_content(want, b->page, r[k].prefix, i);
			if (memcmp(want, b->mem + ((size_t)k * BP_NP + i) * b->page, b->page) != 0)
				bp_die("%s", "a restored page differs from what A published");
		}
	}
	free(want);
	free(r);
	if (bp_verbose)
		fprintf(stderr, "bench_peer: restores from %.6f to %.6f s (CLOCK_MONOTONIC: perf "
		    "record -k mono, perf report --time)\n", t0, t_ready);
	return t_ready - t0;
}

/*
 * A and B started afresh for one size (B's rank with b_pages pages, room
 * for every request of the measurement): ranks attached, each sees the other
 * up, then the warm-up (not measured): WARM MiB of that size published on
 * each, so that the arena pages the measurement uses were touched once
 * (a cold arena's first touch, zeroing huge pages in the fault, cost more
 * than the pull itself: half of both cores in `perf` on a cold run) and
 * DRAM's slabs belong to that size's class (after a warm-up of another
 * size, the new objects evicted each other before B could pull them).
 * The warm-up is published from every page of each rank's region in turn,
 * so that the daemon's own mapping of the pages a RESTORE writes has
 * been faulted in (as an engine's long-lived KV pool's would be): a first
 * write to each 4 KiB page of a fresh mapping costs a fault in the daemon,
 * and with every request in its own pages that took the figure to 0.4-0.7
 * of a warm mapping's from 256 KiB up (3 alternated rounds, 2-core VM).
 */
static void
bp_up(struct bp_rank *a, struct bp_rank *b, unsigned size, uint32_t b_pages, const char *build)
{
	struct l3kv_publish_page	pg[BP_NP];
	struct l3kv_publish_result	res;
	struct bp_rank			*w;
	size_t				i, j, nreq;
	int				c, t;

	bp_start(0, build);
	bp_start(1, build);
	bp_rank(a, 0, size, BP_NP, NULL);
	bp_rank(b, 1, size, b_pages, NULL);
	for (t = 0; bp_peer_up(a->k) < 1 || bp_peer_up(b->k) < 1; t++) {
		if (t == 1000)
			bp_die("%s", "A and B never saw each other up");
		usleep(10000);
	}
	for (c = 0; c < 2; c++) {
		w = c == 0 ? a : b;
		nreq = ((size_t)bp_warm_mib << 20) / (w->page * BP_NP);
		if (nreq < w->npages / BP_NP)
			nreq = w->npages / BP_NP;
		for (i = 0; i < nreq; i++) {
			uint32_t	base = (uint32_t)(i * BP_NP % w->npages);

			for (j = 0; j < BP_NP; j++) {
				memset(w->mem + (base + j) * w->page, (int)(i + j), w->page);
				bp_hash(0xf0000000U + (uint32_t)c * 0x1000000U + (uint32_t)i,
				    (uint32_t)j, pg[j].hash);
				pg[j].src_page = base + (uint32_t)j;
			}
			if (l3kv_publish(w->k, 0, pg, BP_NP, &res) != 0)
				bp_die("publish: %s", l3kv_last_error(w->k));
			for (t = 0; bp_stat(w->k, "dram", "pins") != 0 && t < 1000; t++)
				usleep(2000);
		}
	}
}

static void
bp_down(struct bp_rank *a, struct bp_rank *b)
{
	struct bp_rank	*r[2] = { a, b };
	unsigned	 i;

	for (i = 0; i < 2; i++) {
		l3kv_close(r[i]->k);
		munmap(r[i]->mem, r[i]->page * r[i]->npages);
		close(r[i]->fd);
	}
	bp_stop(1);
	bp_stop(0);
}

/* On a failure: no daemon, directory or namespace left behind. */
static void
bp_cleanup(void)
{
	char	args[128];

	bp_stop(1);
	bp_stop(0);
	if (bp_ns[0] != '\0') {
		snprintf(args, sizeof(args), "%s down %s", bp_script, bp_ns);
		if (system(args) != 0)
			fprintf(stderr, "bench_peer: %s failed\n", args);
	}
}

int
main(int argc, char **argv)
{
	struct bp_rank	a[BP_NSIZES], b[BP_NSIZES];
	double		gbs[BP_NSIZES][64];
	const char	*build = "build";
	char		args[128];
	unsigned	mib = 64, s, r, rounds = 5, only = BP_NSIZES;
	uint32_t	prefix = (uint32_t)getpid() << 12;
	int		c;

	while ((c = getopt(argc, argv, "a:B:D:lL:m:pr:s:S:vW:")) != -1) {
		switch (c) {
		case 'a': bp_ahead = (unsigned)atoi(optarg); break;
		case 'L': bp_lanes = (unsigned)atoi(optarg); break;
		case 'D': bp_dram_mib = (unsigned)atoi(optarg); break;
		case 'W': bp_warm_mib = (unsigned)atoi(optarg); break;
		case 'B': build = optarg; break;
		case 'm': mib = (unsigned)atoi(optarg); break;
		case 'r': rounds = (unsigned)atoi(optarg); break;
		case 's': only = (unsigned)atoi(optarg); break;
		case 'l': bp_loop_port = 1; break;
		case 'p': bp_probing = 1; break;
		case 'S': bp_script = optarg; break;
		case 'v': bp_verbose = 1; break;
		default:
			fprintf(stderr, "usage: bench_peer [-a AHEAD] [-B BUILD] [-D DRAM_MIB] "
			    "[-W WARM_MIB] [-l] [-L LANES] [-r ROUNDS] [-m MIB] [-p] [-s SIZE] "
			    "[-S SCRIPT] [-v]\n");
			return 2;
		}
	}
	if (rounds < 1 || rounds > 64 || mib < 1 || bp_dram_mib < 2 * mib + bp_warm_mib / 2)
		bp_die("%s", "bad -r or -m");
	if (bp_ahead < 1 || bp_ahead > 64)
		bp_die("%s", "bad -a (1 to 64)");
	if (bp_lanes < 1 || bp_lanes > 8)
		bp_die("%s", "bad -L (1 to 8)");
	if (only > BP_NSIZES)
		bp_die("%s", "bad -s (0 to 4)");
	if (bp_loop_port != 0) {
		/* Below Linux's ephemeral ports (32768 up), two per run. */
		bp_loop_port = 22000 + (unsigned)(getpid() % 4000) * 2;
	} else if (geteuid() != 0) {
		printf("SKIPPED bench_peer: network namespaces need root\n");
		return 77;
	} else {
		snprintf(args, sizeof(args), "up l3kvt%ldxpeer 2", (long)getpid());
		bp_script_run(args);
		snprintf(bp_ns, sizeof(bp_ns), "l3kvt%ldxpeer", (long)getpid());
	}
	atexit(bp_cleanup);
	printf("bench_peer: %s (tcp;ofi_rxm), requests of %u pages, %u MiB "
	    "per measurement, %u ahead (ADMITs submitted before the earlier requests are READY, "
	    "each RESTOREd in order once answered), GB/s over the wall time from the first ADMIT "
	    "to the last READY, %u rounds, fresh daemons with %u MiB of DRAM each and %u lane%s, "
	    "%u MiB published on each first\n",
	    bp_loop_port != 0 ? "A and B on loopback" : "A in node 1, B in node 2", BP_NP, mib,
	    bp_ahead, rounds, bp_dram_mib, bp_lanes, bp_lanes == 1 ? "" : "s", bp_warm_mib);
	for (r = 0; r < rounds; r++) {
		for (s = 0; s < BP_NSIZES; s++) {
			size_t		 req;
			unsigned	 n, k, skipped = 0,
					 short_ = 0, local_short = 0;
			uint32_t	*keep, on_b = 0;
			long long	 reads0, pulls0;
			double		 admit, wall, lat[2][4];
			struct bp_prober pr[2];
			unsigned	 d;

			if (only < BP_NSIZES && s != only)
				continue;
			req = (size_t)BP_TOKENS * BP_LAYERS * bp_sizes[s].token_bytes * BP_NP;
			n = (unsigned)(((size_t)mib << 20) / req);
			if (n < 2)
				n = 2;
			bp_up(&a[s], &b[s], s, n * BP_NP, build);
			if ((keep = calloc(n, sizeof(*keep))) == NULL)
				bp_die("%s", "out of memory");
			/* Publish first (not timed): requests homed on A only. */
			for (k = 0; k < n; prefix++) {
				if (bp_publish(&a[s], &b[s], prefix))
					keep[k++] = prefix;
				else if (skipped++ == 0)
					on_b = prefix;	/* B's: its home, offered by A */
			}
			bp_owner = &a[s];
			reads0 = bp_peer_sum(b[s].k, "reads");
			pulls0 = bp_peer_sum(b[s].k, "pulls");
			if (bp_probing) {
				for (d = 0; d < 2; d++) {
					bp_probe_open(&pr[d], d, s,
					    d == 1 && skipped > 0 ? on_b : keep[0]);
					bp_probe_start(&pr[d], BP_PROBE_IDLE);
				}
				for (d = 0; d < 2; d++)
					bp_probe_end(&pr[d], 0, &lat[d][0], &lat[d][1]);
				for (d = 0; d < 2; d++)
					bp_probe_start(&pr[d], BP_PROBE_MAX);
			}
			wall = bp_restore_all(&b[s], keep, n, &short_);
			if (bp_probing)
				for (d = 0; d < 2; d++) {
					bp_probe_end(&pr[d], 1, &lat[d][2], &lat[d][3]);
					bp_probe_close(&pr[d]);
				}
			if (short_ * 2 > n)
				bp_die("%s", "most ADMITs came short (A evicted them?)");
			/* -v: the same requests again, from B's own DRAM now (no pull). */
			admit = bp_admit_s;
			bp_local_s = bp_verbose ? bp_restore_all(&b[s], keep, n, &local_short) : 0;
			gbs[s][r] = (double)req * (n - short_) / wall / 1e9;
			printf("peer %u %s %.4f", r, bp_sizes[s].label, gbs[s][r]);
			if (short_ > 0)
				printf(" (%u of %u ADMITs short, left out)", short_, n);
			if (bp_verbose)
				printf(" (%u requests, %.0f us each, ADMIT answered in %.0f us, again "
				    "from B's DRAM %.0f us, %lld reads for %lld pulls, %u homed on B)", n,
				    wall / n * 1e6, admit / n * 1e6, bp_local_s / n * 1e6,
				    bp_peer_sum(b[s].k, "reads") - reads0,
				    bp_peer_sum(b[s].k, "pulls") - pulls0, skipped);
			if (bp_probing)
				printf(" (PROBE p50/p99 us, idle then pulling: A %.0f/%.0f %.0f/%.0f, "
				    "B %.0f/%.0f %.0f/%.0f)", lat[0][0], lat[0][1], lat[0][2], lat[0][3],
				    lat[1][0], lat[1][1], lat[1][2], lat[1][3]);
			if (bp_probing && pr[0].missed + pr[1].missed > 0)
				printf(" (PROBEs not answered whole: A %u, B %u)", pr[0].missed,
				    pr[1].missed);
			printf("\n");
			fflush(stdout);
			free(keep);
			bp_down(&a[s], &b[s]);
		}
	}
	printf("%-18s %12s\n", "size", "peer GB/s");
	for (s = 0; s < BP_NSIZES; s++)
		if (only == BP_NSIZES || s == only)
			printf("%-18s %12.2f\n", bp_sizes[s].label,
			    bench_median(gbs[s], (int)rounds));
	if (bp_ns[0] != '\0') {
		snprintf(args, sizeof(args), "down %s", bp_ns);
		bp_ns[0] = '\0';
		bp_script_run(args);
	}
	return 0;
}
