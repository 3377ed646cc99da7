/*
 * The peer tier's data path against raw libfabric: one reader pulling
 * spans of an owner's memory with one-sided reads, DEPTH in flight, on
 * the same provider, either on loopback or between two nodes of
 * tests/netns.sh (the owners in node 1, the reader in node 2).
 *
 * raw: the reader and its owner are plain libfabric loops (fi_read, then
 * fi_cq_read until EAGAIN, then fi_trywait and poll(2) on the CQ's wait
 * fd; the owner the same, to progress its side on tcp;ofi_rxm), no event
 * loop, no bookkeeping: the floor of what the provider costs.
 * fabric: the same reads through fabric.c on both sides: fabric_read on a
 * libevent loop, the owner a fabric_expose'd region served by its loop.
 *
 * Both owners live for the whole run; each round measures every size
 * twice, raw and fabric, in alternating order (raw first in even rounds),
 * and prints per size the median GB/s of each and the median of the
 * per-round ratios fabric/raw.
 *
 *   bench_fabric [-p PROV] [-n] [-O] [-L] [-e N] [-r ROUNDS] [-d DEPTH] [-m MIB] [-S SCRIPT]
 *     -n: between two network namespaces (needs root; SCRIPT is
 *     tests/netns.sh), else on loopback; -m: MiB read per measurement;
 *     -e: raw reads on N (1 to 8) independent endpoint pairs at once: N
 *     raw owners (all in node 1), and N reader threads, each with its own
 *     fabric, domain, endpoint, CQ and buffers, doing its share of the
 *     reads (rounded up) with DEPTH in flight; raw GB/s is then all their
 *     bytes over the time from their common start to the last one's end,
 *     the ceiling of what more endpoints (rails, threads) could buy; the
 *     fabric side then runs fabric.c with N lanes on both sides (its
 *     fabric threads, endpoints and connections) and DEPTH times N reads
 *     in flight, as many as the raw endpoints have together;
 *     -O: fabric_read reads the raw owner too (the reader's side alone);
 *     -L: both readers also land every read as the peer tier must where
 *     its restores go to host memory: the object checksum of the bytes
 *     read (checksum_obj, on the reading thread, as peer.c verifies a
 *     pull), then a copy of them into a second buffer (the restore into
 *     the engine's pages). Without a GPU, this is the least work a peer
 *     restore does beyond the read.
 */
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "bench.h"
#include "daemon.h"

#define BF_DEPTH_MAX	256
#define BF_EP_MAX	8		/* -e */
#define BF_RAW_KEY	0x6c33766b	/* the raw owner's key, when the provider lets us pick */

static const char	*bf_prov = "tcp";
static int		 bf_depth = 16;
static unsigned		 bf_mib = 256;
static int		 bf_land_on;
static int		 bf_neps = 1;		/* -e: raw endpoint pairs */
static size_t		 bf_len = 64 << 20;	/* each buffer: a slot per read in flight */
static uint8_t		*bf_rank;		/* -L: the copies' destination */
static volatile uint64_t bf_sink;		/* -L: the checksums, kept */

/*
 * -L: what a peer restore does with a read's bytes once they landed, into
 * rank; each raw reader thread passes its own rank and sink, so that no two
 * threads write the same memory.
 */
static void
bf_land_into(uint8_t *rank, volatile uint64_t *sink, const uint8_t *buf, size_t off, size_t len)
{
	if (!bf_land_on)
		return;
	*sink ^= checksum_obj(buf + off, len);
	memcpy(rank + off, buf + off, len);
}

static void
bf_land(const uint8_t *buf, size_t off, size_t len)
{
	bf_land_into(bf_rank, &bf_sink, buf, off, len);
}

static const struct {
	const char	*label;
	size_t		 len;
} bf_sizes[] = {
	{ "36 KiB object", 36 << 10 },
	{ "256 KiB object", 256 << 10 },
	{ "2.25 MiB object", 2304 << 10 },
	{ "1 MiB coalesced", 1 << 20 },
	{ "8 MiB coalesced", 8 << 20 },
};
#define BF_NSIZES	(sizeof(bf_sizes) / sizeof(bf_sizes[0]))

static void
bf_die(const char *what, int rc)
{
	fprintf(stderr, "bench_fabric: %s: %s\n", what, rc < 0 ? fi_strerror(-rc) : "failed");
	exit(1);
}

/* A buffer of bf_len bytes filled with c: faulted in before any clock. */
static uint8_t *
bf_buf(int c)
{
	void	*p;

	p = mmap(NULL, bf_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		bf_die("mmap", 0);
	memset(p, c, bf_len);
	return p;
}

/* The raw side: one endpoint, CQ with a wait fd, AV, and one registration. */
struct bf_raw {
	struct fi_info		*info;
	struct fid_fabric	*fabric;
	struct fid_domain	*domain;
	struct fid_ep		*ep;
	struct fid_cq		*cq;
	struct fid_av		*av;
	struct fid_mr		*mr;
	void			*desc;
	int			 fd;
	uint64_t		 mr_mode;
};

static void
bf_raw_open(struct bf_raw *r, const char *node, void *buf, size_t len)
{
	struct fi_info		*h = fi_allocinfo();
	struct fi_cq_attr	 ca = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_FD,
				    .size = 4096 };
	struct fi_av_attr	 aa = { .type = FI_AV_TABLE };
	int			 rc;

	memset(r, 0, sizeof(*r));
	h->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
	h->mode = FI_CONTEXT | FI_CONTEXT2 | FI_ASYNC_IOV | FI_RX_CQ_DATA | FI_MSG_PREFIX |
	    FI_BUFFERED_RECV;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	h->domain_attr->threading = FI_THREAD_DOMAIN;
	h->fabric_attr->prov_name = strdup(bf_prov);
	if ((rc = fi_getinfo(FI_VERSION(1, 17), node, NULL, FI_SOURCE, h, &r->info)) != 0)
		bf_die("fi_getinfo", rc);
	fi_freeinfo(h);
	r->mr_mode = (uint64_t)r->info->domain_attr->mr_mode;
	if ((rc = fi_fabric(r->info->fabric_attr, &r->fabric, NULL)) != 0 ||
	    (rc = fi_domain(r->fabric, r->info, &r->domain, NULL)) != 0 ||
	    (rc = fi_cq_open(r->domain, &ca, &r->cq, NULL)) != 0 ||
	    (rc = fi_av_open(r->domain, &aa, &r->av, NULL)) != 0 ||
	    (rc = fi_endpoint(r->domain, r->info, &r->ep, NULL)) != 0 ||
	    (rc = fi_ep_bind(r->ep, &r->cq->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
	    (rc = fi_ep_bind(r->ep, &r->av->fid, 0)) != 0 || (rc = fi_enable(r->ep)) != 0 ||
	    (rc = fi_control(&r->cq->fid, FI_GETWAIT, &r->fd)) != 0)
		bf_die("raw endpoint", rc);
	if ((rc = fi_mr_reg(r->domain, buf, len, FI_READ | FI_REMOTE_READ, 0, BF_RAW_KEY, 0, &r->mr,
	    NULL)) != 0)
		bf_die("fi_mr_reg", rc);
	r->desc = fi_mr_desc(r->mr);
}

/*
 * Progresses the CQ once; waits on its fd first if fi_trywait allows.
 * Returns completions, their contexts in ctxs when not NULL (64 entries).
 */
static int
bf_raw_progress(struct bf_raw *r, int wait, int stop_fd, void **ctxs)
{
	struct fi_cq_entry	 c[64];
	struct fi_cq_err_entry	 ee;
	struct pollfd		 p[2] = { { r->fd, POLLIN, 0 }, { stop_fd, POLLIN, 0 } };
	struct fid		*fid = &r->cq->fid;
	ssize_t			 n;

	if (wait && fi_trywait(r->fabric, &fid, 1) == 0)
		(void)poll(p, stop_fd >= 0 ? 2 : 1, 1000);
	n = fi_cq_read(r->cq, c, 64);
	if (n == -FI_EAVAIL) {
		memset(&ee, 0, sizeof(ee));
		fi_cq_readerr(r->cq, &ee, 0);
		fprintf(stderr, "bench_fabric: raw read failed: %s\n", fi_strerror(ee.err));
		exit(1);
	}
	if (n > 0 && ctxs != NULL)
		for (ssize_t i = 0; i < n; i++)
			ctxs[i] = c[i].op_context;
	return n > 0 ? (int)n : 0;
}

/* An owner, in a child: serves its 64 MiB until its command pipe closes. */
struct bf_owner {
	pid_t		pid;
	int		cmd;
	uint8_t		name[FABRIC_LANES_MAX * FABRIC_ADDR_MAX];
	size_t		namelen;
	uint64_t	raddr, rkey;
};

static void
bf_eof_cb(evutil_socket_t fd, short ev, void *arg)
{
	char	c;

	(void)ev;
	if (read(fd, &c, 1) <= 0)
		event_base_loopbreak(arg);
}

static int
bf_enter(const char *ns, unsigned k)
{
	char	path[256];
	int	fd, rc;

	snprintf(path, sizeof(path), "/run/netns/%s-%u", ns, k);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -1;
	rc = setns(fd, CLONE_NEWNET);
	close(fd);
	return rc;
}

static void
bf_owner_start(struct bf_owner *o, int raw, const char *ns, const char *node)
{
	int	up[2], down[2];

	if (pipe(up) != 0 || pipe(down) != 0 || (o->pid = fork()) < 0)
		bf_die("fork", 0);
	if (o->pid == 0) {
		uint8_t		*buf;
		uint8_t		 name[FABRIC_LANES_MAX * FABRIC_ADDR_MAX];
		size_t		 nl = sizeof(name);
		uint64_t	 raddr, rkey;
		char		 err[256];

		close(up[0]);
		close(down[1]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (ns != NULL && bf_enter(ns, 1) != 0)
			bf_die("setns", 0);
		buf = bf_buf(0x5a);
		if (raw) {
			struct bf_raw	r;

			bf_raw_open(&r, node, buf, bf_len);
			fi_getname(&r.ep->fid, name, &nl);
			raddr = (r.mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)buf : 0;
			rkey = fi_mr_key(r.mr);
			if (write(up[1], &nl, sizeof(nl)) < 0 || write(up[1], name, nl) < 0 ||
			    write(up[1], &raddr, 8) < 0 || write(up[1], &rkey, 8) < 0)
				_exit(1);
			for (;;) {
				struct pollfd	p = { down[0], POLLIN, 0 };

				bf_raw_progress(&r, 1, down[0], NULL);
				if (poll(&p, 1, 0) > 0)
					break;
			}
			_exit(0);
		} else {
			struct event_base	*b = event_base_new();
			struct fabric		*f;
			struct event		*ev;

			log_init(LOG_LEVEL_WARN);
			if (fabric_open(b, bf_prov, node, (unsigned)bf_neps, &f, err,
			    sizeof(err)) != 0) {
				fprintf(stderr, "bench_fabric: owner: %s\n", err);
				_exit(1);
			}
			if (fabric_expose(f, buf, bf_len, 0) != 0 || fabric_name(f, name, &nl) != 0 ||
			    fabric_rkey(f, buf, bf_len, &raddr, &rkey) != 0)
				_exit(1);
			if (write(up[1], &nl, sizeof(nl)) < 0 || write(up[1], name, nl) < 0 ||
			    write(up[1], &raddr, 8) < 0 || write(up[1], &rkey, 8) < 0)
				_exit(1);
			ev = event_new(b, down[0], EV_READ | EV_PERSIST, bf_eof_cb, b);
			event_add(ev, NULL);
			event_base_dispatch(b);
			_exit(0);
		}
	}
	close(up[1]);
	close(down[0]);
	o->cmd = down[1];
	if (read(up[0], &o->namelen, sizeof(o->namelen)) != sizeof(o->namelen) ||
	    o->namelen > sizeof(o->name) || read(up[0], o->name, o->namelen) != (ssize_t)o->namelen ||
	    read(up[0], &o->raddr, 8) != 8 || read(up[0], &o->rkey, 8) != 8)
		bf_die("an owner did not start", 0);
	close(up[0]);
}

/*
 * One raw reader: its endpoint, the owner it reads, its buffers, the
 * contexts of its reads in flight, and (-e N > 1) its thread and what that
 * thread is asked to do. Endpoint 0 reads main's raw_o into main's dst and
 * bf_rank, as the one raw reader of -e 1 does.
 */
struct bf_rawt {
	struct bf_raw		 r;
	struct bf_owner		 own;		/* the owner of endpoints 1 and up */
	const struct bf_owner	*o;
	fi_addr_t		 a;
	uint8_t			*dst, *rank;
	volatile uint64_t	 sink;
	struct fi_context2	 ctx[BF_DEPTH_MAX];
	size_t			 slot_of[BF_DEPTH_MAX];
	pthread_t		 tid;
	size_t			 len, n;	/* the next measurement; n 0: exit */
	double			 t0, t1;
};

static struct bf_rawt		bf_rt[BF_EP_MAX];
static pthread_barrier_t	bf_go, bf_end;	/* -e N > 1: the threads and main */

/* The raw reader: n reads of len, depth in flight, cycling through the buffers. */
static double
bf_raw_run(struct bf_rawt *t, size_t len, size_t n)
{
	struct bf_raw	*r = &t->r;
	void		*ctxs[64];
	size_t		 posted = 0, done = 0, slots = bf_len / len, s;
	int		 out = 0, k;
	ssize_t		 rc;

	t->t0 = bench_now();
	while (done < n) {
		while (out < bf_depth && posted < n) {
			s = posted % slots;
			t->slot_of[posted % BF_DEPTH_MAX] = s;
			rc = fi_read(r->ep, t->dst + s * len, len, r->desc, t->a, t->o->raddr + s * len,
			    t->o->rkey, &t->ctx[posted % BF_DEPTH_MAX]);
			if (rc == -FI_EAGAIN)
				break;
			if (rc != 0)
				bf_die("fi_read", (int)rc);
			posted++;
			out++;
		}
		rc = bf_raw_progress(r, out > 0 && (out >= bf_depth || posted == n), -1, ctxs);
		for (k = 0; k < rc; k++)
			bf_land_into(t->rank, &t->sink, t->dst,
			    t->slot_of[(struct fi_context2 *)ctxs[k] - t->ctx] * len, len);
		done += (size_t)rc;
		out -= (int)rc;
	}
	t->t1 = bench_now();
	return (double)(n * len) / (t->t1 - t->t0) / 1e9;
}

/* -e N > 1: a raw reader's thread, one measurement per release of bf_go. */
static void *
bf_raw_thread(void *arg)
{
	struct bf_rawt	*t = arg;

	for (;;) {
		pthread_barrier_wait(&bf_go);
		if (t->n == 0)
			return NULL;
		bf_raw_run(t, t->len, t->n);
		pthread_barrier_wait(&bf_end);
	}
}

/*
 * A raw measurement of n reads of len: on this thread with one endpoint;
 * else each thread reads its share, all released together, and the figure
 * is all their bytes over the time from the first start to the last end.
 */
static double
bf_raw_measure(size_t len, size_t n)
{
	size_t	per = (n + (size_t)bf_neps - 1) / (size_t)bf_neps;
	double	t0, t1;
	int	k;

	if (bf_neps == 1)
		return bf_raw_run(&bf_rt[0], len, n);
	for (k = 0; k < bf_neps; k++) {
		bf_rt[k].len = len;
		bf_rt[k].n = per;
	}
	pthread_barrier_wait(&bf_go);
	pthread_barrier_wait(&bf_end);
	t0 = bf_rt[0].t0;
	t1 = bf_rt[0].t1;
	for (k = 1; k < bf_neps; k++) {
		if (bf_rt[k].t0 < t0)
			t0 = bf_rt[k].t0;
		if (bf_rt[k].t1 > t1)
			t1 = bf_rt[k].t1;
	}
	return (double)(per * (size_t)bf_neps * len) / (t1 - t0) / 1e9;
}

/* The fabric reader. */
struct bf_fab {
	struct event_base	*base;
	struct fabric		*f;
	uint64_t		 peer;
	const struct bf_owner	*o;
	uint8_t			*dst;
	size_t			 len, n, posted, done, slots;
	int			 err;
	struct bf_fab_rd {
		struct bf_fab	*b;
		size_t		 slot;
	}			 rd[BF_DEPTH_MAX];	/* one per read in flight */
};

static void bf_fab_post(struct bf_fab *);

static void
bf_fab_done(void *arg, int err)
{
	struct bf_fab_rd	*rd = arg;
	struct bf_fab		*b = rd->b;

	if (err != 0 && b->err == 0)
		b->err = err;
	if (err == 0)
		bf_land(b->dst, rd->slot * b->len, b->len);
	b->done++;
	if (b->done == b->n)
		event_base_loopbreak(b->base);
	else
		bf_fab_post(b);
}

static void
bf_fab_post(struct bf_fab *b)
{
	size_t	s;
	int	rc;

	while (b->posted < b->n && b->posted - b->done < (size_t)bf_depth * (size_t)bf_neps) {
		struct bf_fab_rd	*rd = &b->rd[b->posted % BF_DEPTH_MAX];

		s = b->posted % b->slots;
		rd->b = b;
		rd->slot = s;
		rc = fabric_read(b->f, b->peer, b->dst + s * b->len, b->len, b->o->raddr + s * b->len,
		    b->o->rkey, 0, bf_fab_done, rd);
		if (rc != 0)
			bf_die("fabric_read", rc);
		b->posted++;
	}
}

static double
bf_fab_run(struct bf_fab *b, size_t len, size_t n)
{
	double	t0 = bench_now();

	b->len = len;
	b->n = n;
	b->posted = b->done = 0;
	b->slots = bf_len / len;
	bf_fab_post(b);
	event_base_dispatch(b->base);
	if (b->err != 0) {
		fprintf(stderr, "bench_fabric: a fabric read failed: %s\n", strerror(-b->err));
		exit(1);
	}
	return (double)(n * len) / (bench_now() - t0) / 1e9;
}

static int
bf_script(const char *script, const char *args)
{
	char	cmd[1024];

	snprintf(cmd, sizeof(cmd), "%s %s", script, args);
	return system(cmd);
}

int
main(int argc, char **argv)
{
	const char	*script = "tests/netns.sh", *node = "127.0.0.1";
	char		 ns[64] = "", args[128], err[256], eps[32] = "";
	struct bf_owner	 raw_o, fab_o;
	struct bf_rawt	*t;
	struct bf_fab	 fb;
	uint8_t		*dst;
	double		 graw[BF_NSIZES][64], gfab[BF_NSIZES][64], ratio[BF_NSIZES][64];
	int		 netns = 0, rounds = 7, c, rd, one_owner = 0, k;
	size_t		 i, n, slots;

	while ((c = getopt(argc, argv, "p:nr:d:m:S:OLe:")) != -1) {
		switch (c) {
		case 'O': one_owner = 1; break;
		case 'L': bf_land_on = 1; break;
		case 'e': bf_neps = atoi(optarg); break;
		case 'p': bf_prov = optarg; break;
		case 'n': netns = 1; break;
		case 'r': rounds = atoi(optarg); break;
		case 'd': bf_depth = atoi(optarg); break;
		case 'm': bf_mib = (unsigned)atoi(optarg); break;
		case 'S': script = optarg; break;
		default:
			fprintf(stderr, "usage: bench_fabric [-p PROV] [-n] [-O] [-L] [-e N] [-r ROUNDS] "
			    "[-d DEPTH] [-m MIB] [-S NETNS_SCRIPT]\n");
			return 2;
		}
	}
	if (rounds < 1 || rounds > 64 || bf_depth < 1 || bf_depth > BF_DEPTH_MAX)
		bf_die("bad -r or -d", 0);
	if (bf_neps < 1 || bf_neps > BF_EP_MAX || bf_depth * bf_neps > BF_DEPTH_MAX)
		bf_die("bad -e (or -d times -e over 256)", 0);
	/*
	 * At least 64 MiB, and a slot of the largest size per read that can be
	 * in flight (bf_sizes ends with its largest), so that no two reads of
	 * one measurement share bytes.
	 */
	slots = (size_t)bf_depth * (size_t)bf_neps * bf_sizes[BF_NSIZES - 1].len;
	if (bf_len < slots)
		bf_len = slots;
	if (netns) {
		snprintf(ns, sizeof(ns), "l3kvt%ldxbench", (long)getpid());
		snprintf(args, sizeof(args), "up %s 2", ns);
		if (bf_script(script, args) != 0)
			bf_die("tests/netns.sh up", 0);
	}
	bf_owner_start(&raw_o, 1, netns ? ns : NULL, netns ? "10.77.0.1" : node);
	bf_rt[0].o = &raw_o;
	for (k = 1; k < bf_neps; k++) {
		bf_owner_start(&bf_rt[k].own, 1, netns ? ns : NULL, netns ? "10.77.0.1" : node);
		bf_rt[k].o = &bf_rt[k].own;
	}
	bf_owner_start(&fab_o, 0, netns ? ns : NULL, netns ? "10.77.0.1" : node);
	if (netns) {
		if (bf_enter(ns, 2) != 0)
			bf_die("setns", 0);
		node = "10.77.0.2";
	}
	dst = bf_buf(0);
	if (bf_land_on)
		bf_rank = bf_buf(0);
	/* Endpoint 0 lands in dst and bf_rank, the others each in their own pair. */
	for (k = 0; k < bf_neps; k++) {
		t = &bf_rt[k];
		t->dst = dst;
		t->rank = bf_rank;
		if (k > 0)
			t->dst = bf_buf(0);
		if (k > 0 && bf_land_on)
			t->rank = bf_buf(0);
		bf_raw_open(&t->r, node, t->dst, bf_len);
		if (fi_av_insert(t->r.av, t->o->name, 1, &t->a, 0, NULL) != 1)
			bf_die("fi_av_insert", 0);
	}
	if (bf_neps > 1) {
		if (pthread_barrier_init(&bf_go, NULL, (unsigned)bf_neps + 1) != 0 ||
		    pthread_barrier_init(&bf_end, NULL, (unsigned)bf_neps + 1) != 0)
			bf_die("pthread_barrier_init", 0);
		for (k = 0; k < bf_neps; k++)
			if (pthread_create(&bf_rt[k].tid, NULL, bf_raw_thread, &bf_rt[k]) != 0)
				bf_die("pthread_create", 0);
		snprintf(eps, sizeof(eps), ", raw: %d endpoints", bf_neps);
	}
	/* The fabric reader registers its own (second) view of dst. */
	memset(&fb, 0, sizeof(fb));
	log_init(LOG_LEVEL_WARN);
	fb.base = event_base_new();
	fb.o = &fab_o;
	fb.dst = bf_buf(0);
	if (fabric_open(fb.base, bf_prov, node, (unsigned)bf_neps, &fb.f, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_fabric: %s\n", err);
		return 1;
	}
	/* -O: both readers read the raw owner, which isolates the reader's side. */
	if (one_owner)
		fb.o = &raw_o;
	if (fabric_expose(fb.f, fb.dst, bf_len, 0) != 0 ||
	    fabric_peer_add(fb.f, fb.o->name, fb.o->namelen, &fb.peer) != 0)
		bf_die("fabric setup", 0);
	printf("bench_fabric: %s (%s), %s, %d reads in flight, %u MiB per measurement, "
	    "%d rounds, %ld cpus%s%s%s\n", bf_prov, fabric_provider(fb.f),
	    netns ? "two network namespaces over a bridge (tests/netns.sh)" : "loopback",
	    bf_depth, bf_mib, rounds, sysconf(_SC_NPROCESSORS_ONLN), eps,
	    one_owner ? ", both reading the raw owner" : "",
	    bf_land_on ? ", every read landed (checksum + copy)" : "");
	/* Warm both paths (connections, page faults), checked once. */
	bf_raw_measure(1 << 20, 64);
	bf_fab_run(&fb, 1 << 20, 64);
	if (dst[12345] != 0x5a || fb.dst[12345] != 0x5a || (bf_land_on && bf_rank[12345] != 0x5a))
		bf_die("the bytes read are not the owner's", 0);
	for (k = 1; k < bf_neps; k++)
		if (bf_rt[k].dst[12345] != 0x5a || (bf_land_on && bf_rt[k].rank[12345] != 0x5a))
			bf_die("the bytes read are not the owner's", 0);
	for (rd = 0; rd < rounds; rd++) {
		for (i = 0; i < BF_NSIZES; i++) {
			n = ((size_t)bf_mib << 20) / bf_sizes[i].len;
			if (n < 16)
				n = 16;
			if (rd % 2 == 0) {
				graw[i][rd] = bf_raw_measure(bf_sizes[i].len, n);
				gfab[i][rd] = bf_fab_run(&fb, bf_sizes[i].len, n);
			} else {
				gfab[i][rd] = bf_fab_run(&fb, bf_sizes[i].len, n);
				graw[i][rd] = bf_raw_measure(bf_sizes[i].len, n);
			}
			ratio[i][rd] = gfab[i][rd] / graw[i][rd];
		}
	}
	printf("%-18s %12s %12s %14s\n", "read size", "raw GB/s", "fabric GB/s", "fabric/raw");
	for (i = 0; i < BF_NSIZES; i++)
		printf("%-18s %12.2f %12.2f %13.2fx\n", bf_sizes[i].label, bench_median(graw[i], rounds),
		    bench_median(gfab[i], rounds), bench_median(ratio[i], rounds));
	fabric_close(fb.f);
	event_base_free(fb.base);
	if (bf_neps > 1) {
		for (k = 0; k < bf_neps; k++)
			bf_rt[k].n = 0;
		pthread_barrier_wait(&bf_go);
		for (k = 0; k < bf_neps; k++)
			pthread_join(bf_rt[k].tid, NULL);
	}
	close(raw_o.cmd);
	for (k = 1; k < bf_neps; k++)
		close(bf_rt[k].own.cmd);
	close(fab_o.cmd);
	waitpid(raw_o.pid, NULL, 0);
	for (k = 1; k < bf_neps; k++)
		waitpid(bf_rt[k].own.pid, NULL, 0);
	waitpid(fab_o.pid, NULL, 0);
	if (netns) {
		snprintf(args, sizeof(args), "down %s", ns);
		bf_script(script, args);
	}
	return 0;
}
