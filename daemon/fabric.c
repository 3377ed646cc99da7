/*
 * The peer tier's data path: libfabric FI_EP_RDM endpoints with FI_RMA,
 * one-sided reads only. A peer reads our exposed memory (FI_REMOTE_READ);
 * we read theirs into ours (FI_READ). Nothing is ever registered with
 * FI_REMOTE_WRITE, so no peer can write a byte of this process.
 *
 * Structure:
 * - One fabric and domain per struct fabric, and 1 to FABRIC_LANES_MAX
 *   lanes (struct fabric_lane): each a thread with a serving endpoint of
 *   its own. The serving endpoints are the ones whose names (fi_getname)
 *   peers are given; they are never used to post and never rebuilt, so the
 *   names stay valid for the life of the process. Registrations are the
 *   domain's: every lane reads and serves every chunk under the same keys.
 * - One reading endpoint per peer and lane (fabric_peer_add: a struct
 *   fabric_peer on each lane both sides have), each with its own
 *   completion queue and address vector holding that one peer's endpoint
 *   on the same lane. fabric_read gives a read to the lane that owes that
 *   peer the fewest bytes (ties in turn), and its parts are posted
 *   there. On tcp;ofi_rxm each lane is a connection and a thread on
 *   either side: one lane is bound by one thread's socket copies.
 * - On tcp;ofi_rxm one bad key fails the read FI_ECANCELED and then
 *   every read on that endpoint FI_ENOTCONN until rxm reconnects (0.2 s
 *   here, about 2.6 s under load; re-inserting the address does not help,
 *   measured): a failed or expired read therefore closes and reopens that
 *   lane's endpoint and CQ to that peer (fabric_peer_rebuild), which takes
 *   a few milliseconds, and the next read connects afresh. Only the reads
 *   on that lane to that one peer are affected.
 * - Retiring an endpoint (a rebuild, fabric_peer_remove, fabric_close)
 *   never closes it with parts on the wire: libfabric 1.17's tcp provider
 *   (Debian 12's) completes a read whose response is half received twice
 *   when its endpoint is closed, and rxm then dereferences the second,
 *   NULL-context completion (segfault in rxm_handle_comp_error; fixed in
 *   1.18 by a74ea0fcd, "RX entry is freed twice"). A retired endpoint with
 *   parts owed becomes a drain (struct fabric_drain): the peer gets a
 *   fresh endpoint at once, the drain's CQ is progressed until every part
 *   on it completed (then nothing is half received, and it is closed), for
 *   at most FABRIC_DRAIN_MS. A read's done() runs once its own parts
 *   completed, so its dst is never written after done(). A drain that does
 *   not empty in time (an owner stopped with our reads on the wire) is
 *   closed where the provider can close it safely, and otherwise left open
 *   and never progressed again (stats.abandoned; nothing writes its dsts
 *   since only our progress would): a leak of one endpoint bought against
 *   a crash, at most FABRIC_ABANDON_MAX of them in a process, then closed
 *   regardless. They stay listed (fabric_abandoned), so that the leak is
 *   reachable, hence deliberate to a leak checker.
 * - Memory: fabric_expose registers a region in chunks (1 GiB by default)
 *   with FI_READ | FI_REMOTE_READ. We offer every FI_MR_* mode bit except
 *   FI_MR_ENDPOINT (a registration bound to one endpoint could not serve
 *   as the local descriptor of every peer's reading endpoint) and FI_MR_RAW
 *   (its keys do not fit the uint64 key of the peer HELLO), and obey the
 *   answer: FI_MR_LOCAL passes each chunk's descriptor, FI_MR_VIRT_ADDR
 *   makes remote addresses virtual addresses (else offsets into the chunk),
 *   FI_MR_PROV_KEY takes the provider's keys, else keys are random per
 *   process start (getrandom), so that a restarted owner's new bytes can
 *   never be read under a key a peer cached from its previous life (the
 *   sockets provider returns them otherwise).
 * - A read (struct fabric_op) is cut into parts at the provider's maximum
 *   message size and at the local chunk boundaries (one descriptor per
 *   part); each part carries its own fi_context2. Parts that the provider
 *   refuses with -FI_EAGAIN (a connection still being set up, a full
 *   queue) wait on the peer's pending list and are posted again on the
 *   next progress.
 * - done() runs on the loop thread, from the queue of finished reads
 *   (fabric_done_cb), never from inside fabric_read or
 *   fabric_peer_remove, exactly once per read that fabric_read accepted.
 *
 * Progress model: a thread per lane, the fabric thread, which owns every
 * endpoint, CQ, AV, drain and read in flight of its lane, and runs them
 * on an event base of its own through each CQ's wait fd. tcp;ofi_rxm
 * makes data progress manual: the owner of the memory must call into its CQ or a
 * peer's read of it stalls. Each CQ is opened with FI_WAIT_FD; its fd
 * (FI_GETWAIT) is a read event of the fabric thread's base; the callback
 * reads the CQ (which runs the provider's progress), posts what waits, and
 * calls fi_trywait before the thread may sleep: when that says there is
 * more, a zero timer runs the callback again on the next turn. A backstop
 * timer (FABRIC_BACKSTOP_MS) progresses every CQ in case a provider
 * signals less than it should. A provider without a wait fd falls back to
 * a polling timer (FABRIC_POLL_MS).
 *
 * The loop thread and the fabric threads share nothing but workqs
 * (workq.c) and what is fixed once the threads run (the provider's info,
 * the domain, the serving endpoints' names); the lanes share nothing with
 * each other but doneq and the abandoned list. The loop builds a read (its
 * parts, cut against the exposed regions, which only the loop reads and
 * writes) and pushes it on `cmdq`, its lane's queue; the fabric threads
 * push every finished read on `doneq`, the loop's, whose done callback
 * counts it and runs its done(). Adding a peer is the one call that waits
 * for the fabric threads (its endpoints are opened there; a HELLO is
 * rare); removing one (a REMOVE per lane) and closing (a STOP per lane)
 * are commands in the same queues, so they come after every read pushed
 * before them. The domain is opened FI_THREAD_SAFE: the loop registers
 * memory (fabric_expose) while the fabric threads progress. Until 2026-12-03 the loop thread
 * progressed every CQ itself: on the 16-core H200 host, pulls of 256 KiB
 * stripes kept the owner's loop 90 % busy in tcp's socket copies (the
 * puller's 76 %), and every engine request and lease answer waited
 * behind them. The fabric thread sleeps in epoll like the loop did, so
 * that an idle daemon takes no core (a server that always spun measured
 * worse there: 2.11, 0.93, 0.65 GB/s at 2.25 MiB in three runs against
 * 1.04, 1.42, 1.16 sleeping on the wait fd), but after an endpoint's
 * completions or wait fd it polls that endpoint for FABRIC_SPIN_US before
 * sleeping again: while reads flow, the next burst of the provider's
 * progress is found without a sleep and a wake-up between.
 */
#include <sys/random.h>
#include <sys/socket.h>

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "daemon.h"

#define FABRIC_VERSION		FI_VERSION(1, 17)
#define FABRIC_CHUNK_DEFAULT	(1ULL << 30)
#define FABRIC_CQ_BATCH		64	/* completions per fi_cq_read */
#define FABRIC_CQ_ROUNDS	8	/* fi_cq_read calls per wakeup, then yield */
#define FABRIC_CQ_SIZE		4096
#define FABRIC_BACKSTOP_MS	100	/* every CQ, even when its fd said nothing */
#define FABRIC_POLL_MS		1	/* a CQ without a wait fd, while reads are out */
#define FABRIC_FINISH_BATCH	256	/* done() calls per loop turn */
#define FABRIC_CMD_BATCH	256	/* commands per fabric thread turn */
#define FABRIC_DRAIN_MS		250	/* a retired endpoint's parts may land this long */
/*
 * After a CQ gave completions or its wait fd fired, the fabric thread
 * polls that endpoint for this long before it sleeps again
 * (L3KV_FABRIC_SPIN_US overrides, 0 to FABRIC_SPIN_MAX_US; 0: never). An
 * idle daemon never spins; while reads flow, the provider's next burst
 * is found without a sleep and a wake-up in between. Measured on the
 * 16-core host, alternated, 3 rounds, peer restores at 8 ahead: 256 KiB
 * 2.78 -> 3.60 GB/s, 1 MiB coalesced 3.32 -> 3.90, 8 MiB 2.73 -> 3.20
 * with 30 us; 200 us did no better (tests/bench/RESULTS.md).
 */
#define FABRIC_SPIN_US		30
#define FABRIC_SPIN_MAX_US	10000
#define FABRIC_ABANDON_MAX	32	/* endpoints left open (8.5 MiB each), then closed regardless */
/*
 * How long a peer may refuse every post (-FI_EAGAIN with nothing on the
 * wire: rxm is still connecting, or retrying an owner that is gone) before
 * its reads fail -ENOTCONN. First contact took up to 5.4 s under load.
 */
#define FABRIC_CONNECT_MS	10000

/* Every mode bit we can honour (fi_getinfo(3)); see the top comment for the two left out. */
#define FABRIC_MR_OFFER		(FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | \
				 FI_MR_PROV_KEY | FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT | \
				 FI_MR_HMEM | FI_MR_COLLECTIVE)
/* Modes that only constrain what we do not do (receives, messages) or what we always do. */
#define FABRIC_MODE_OFFER	(FI_CONTEXT | FI_CONTEXT2 | FI_ASYNC_IOV | FI_RX_CQ_DATA | \
				 FI_MSG_PREFIX | FI_BUFFERED_RECV)

struct fabric_chunk {
	uint8_t		*base;
	size_t		 len;
	struct fid_mr	*mr;
	void		*desc;		/* fi_mr_desc: passed only under FI_MR_LOCAL */
	uint64_t	 key;
};

/* One fabric_expose call: chunks of `chunk` bytes from base. */
struct fabric_region {
	uint8_t			*base;
	size_t			 len;
	size_t			 chunk;
	size_t			 nchunks;
	struct fabric_chunk	*chunks;
};

struct fabric_op;
struct fabric_peer;

/*
 * What the loop hands the fabric thread on cmdq (the first member of what
 * carries it); a read goes back on doneq in the same entry.
 */
enum fabric_cmd_type { FABRIC_CMD_READ, FABRIC_CMD_ADD, FABRIC_CMD_REMOVE, FABRIC_CMD_STOP };
struct fabric_cmd {
	struct workq_entry	 wq;
	enum fabric_cmd_type	 type;
	uint64_t		 peer;		/* REMOVE: the peer's id */
	struct fabric_peer	*add;		/* ADD: the peer to open */
	sem_t			*answered;	/* ADD: posted once rc is set */
	int			 rc;		/* ADD: the answer; STOP: 1 once it ran */
};

/* One posted piece of a read; its context is the first member (FI_CONTEXT2). */
struct fabric_part {
	struct fi_context2	 ctx;
	struct fabric_op	*op;
	uint8_t			*dst;
	size_t			 len;
	uint64_t		 raddr;
	void			*desc;
	uint8_t			 posted;	/* on an endpoint, completion owed */
};

/*
 * One fabric_read. Lives from fabric_read until its done() ran: the loop's
 * until it is pushed on cmdq, then the fabric thread's, on its peer's `ops`
 * list while any part is unposted or owed, and the loop's again once
 * pushed on doneq.
 */
struct fabric_op {
	struct fabric_cmd	 cmd;		/* first: cmdq, then doneq */
	TAILQ_ENTRY(fabric_op)	 entry;
	struct fabric		*f;
	struct fabric_ops	*list;		/* its peer's ops or a drain's; NULL: finished */
	struct fabric_peer	*peer;		/* while on its peer's ops */
	uint64_t		 peer_id;
	unsigned		 lane;		/* which lane's thread it went to */
	uint32_t		 deadline_ms;	/* 0: none */
	fabric_done_fn		 done;
	void			*arg;
	size_t			 len;
	uint64_t		 rkey;
	int			 err;		/* the first error: 0 or -errno */
	size_t			 nparts;
	size_t			 next;		/* first part not yet posted */
	size_t			 owed;		/* posted, completion not seen */
	struct event		*deadline;	/* NULL: none */
	struct fabric_part	 parts[];
};
TAILQ_HEAD(fabric_ops, fabric_op);

/* An endpoint with its CQ (and, for a peer, AV) and the loop's events on them. */
struct fabric_drain;
struct fabric_lane;
struct fabric_ep {
	struct fabric		*f;
	struct fabric_lane	*lane;		/* whose thread progresses it */
	struct fabric_peer	*peer;		/* a peer's reading endpoint */
	struct fabric_drain	*drain;		/* a retired one (peer NULL); both NULL: serving */
	struct fid_ep		*ep;
	struct fid_cq		*cq;
	struct fid_av		*av;
	struct event		*ev;		/* the CQ's wait fd; NULL without one */
	struct event		*again;		/* zero timer: progress again next turn */
	size_t			 posted;	/* parts on this endpoint */
	int64_t			 spin_until;	/* us: poll, not sleep, until then */
};

/* A peer's state on the fabric thread. */
struct fabric_peer {
	TAILQ_ENTRY(fabric_peer) entry;
	uint64_t		 id;
	uint8_t			 name[FABRIC_ADDR_MAX];
	size_t			 namelen;
	fi_addr_t		 addr;
	struct fabric_ep	 rd;		/* rd.ep NULL: broken, rebuilt at the next read */
	struct fabric_ops	 ops;		/* in posting order */
	int			 rebuild;	/* set while progressing: rebuild after */
	int			 busy;		/* inside fabric_ep_progress */
	int64_t			 stalled;	/* ms of the first refused post; 0: none */
};
TAILQ_HEAD(fabric_peers, fabric_peer);

/*
 * A peer as the loop knows it: added, not yet removed. It is read over
 * nlanes lanes (a fabric_peer on each); its REMOVEs are made at the add,
 * one per lane, and each lane frees its own.
 */
struct fabric_handle {
	TAILQ_ENTRY(fabric_handle) entry;
	uint64_t		 id;
	unsigned		 nlanes;
	unsigned		 turn;		/* where fabric_read's choice starts */
	struct fabric_cmd	*rm[FABRIC_LANES_MAX];
	size_t			 out[FABRIC_LANES_MAX];	/* bytes pushed, done() not run */
};
TAILQ_HEAD(fabric_handles, fabric_handle);

/* A retired reading endpoint with parts still owed, and the reads they belong to. */
struct fabric_drain {
	TAILQ_ENTRY(fabric_drain) entry;
	struct fabric_ep	 e;		/* its own AV: the peer has a new one */
	struct fabric_ops	 ops;
	uint64_t		 peer_id;	/* for the log */
	struct event		*limit;		/* FABRIC_DRAIN_MS */
};
TAILQ_HEAD(fabric_drains, fabric_drain);

/*
 * One lane: a fabric thread with its event base, a serving endpoint of
 * its own (peers' reads of our memory over this lane land there), and a
 * reading endpoint per peer. All of it is that thread's, but f, idx and
 * the thread's handle, fixed once it runs.
 */
struct fabric_lane {
	struct fabric		*f;
	unsigned		 idx;
	struct event_base	*base;
	struct fabric_ep	 srv;
	struct fabric_peers	 peers;
	struct fabric_drains	 drains;
	struct workq		*cmdq;		/* loop -> this thread, on base */
	struct fabric_cmd	 stop;
	struct event		*backstop;
	pthread_t		 thread;
	int			 started;
};

/*
 * Fixed once the fabric threads run: info, fabric, domain, nlanes, the
 * serving endpoints' names, prov, mr_mode, tx_size, close_unsafe. The
 * loop's: loop, regions, keys, max_msg, handles, peer_next, the doneq
 * side, late, stats. Each lane's: what struct fabric_lane says.
 */
struct fabric {
	struct event_base	*loop;		/* the caller's: done() runs there */
	struct fi_info		*info;
	struct fid_fabric	*fabric;
	struct fid_domain	*domain;
	struct fabric_lane	 lanes[FABRIC_LANES_MAX];
	unsigned		 nlanes;
	uint8_t			 own[FABRIC_LANES_MAX * FABRIC_ADDR_MAX];	/* the srvs' names */
	size_t			 ownlen;	/* of one name: every lane's is as long */
	char			 prov[64];
	uint64_t		 mr_mode;
	size_t			 max_msg;	/* split size */
	size_t			 tx_size;	/* parts in flight per endpoint */
	uint64_t		 key_next;	/* our keys: random base, + 1 per chunk */
	uint64_t		 key_mask;
	struct fabric_region	*regions;
	size_t			 nregions;
	struct fabric_handles	 handles;
	uint64_t		 peer_next;
	int			 close_unsafe;	/* closing mid-response crashes (see the top) */
	int64_t			 spin_us;	/* poll this long after activity; 0: never */
	struct workq		*doneq;		/* fabric threads -> loop: finished reads */
	struct fabric_ops	 late;		/* finished while a close was deferred */
	int			 dispatching;	/* inside a done() */
	int			 closing;	/* 1: fabric_close deferred; 2: closing */
	struct fabric_stats	 stats;		/* but abandoned: */
	uint64_t		 abandoned;	/* the fabric thread's; atomic */
};

static void	fabric_ep_progress(struct fabric_ep *);
static void	fabric_peer_rebuild(struct fabric_peer *);
static void	fabric_drain_end(struct fabric_drain *);
static struct fabric_handle *fabric_handle_find(const struct fabric *, uint64_t);
static void	fabric_handle_free(struct fabric_handle *);

static int64_t
fabric_us(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t
fabric_ms(void)
{
	return fabric_us() / 1000;
}

/* The endpoint had work: it is polled, not slept on, for the next spin_us. */
static void
fabric_ep_active(struct fabric_ep *e)
{
	if (e->f->spin_us > 0)
		e->spin_until = fabric_us() + e->f->spin_us;
}

/* FABRIC_SPIN_US, or L3KV_FABRIC_SPIN_US when it is a number in range (a warning if not). */
static int64_t
fabric_spin_env(void)
{
	const char	*v = getenv("L3KV_FABRIC_SPIN_US");
	char		*end;
	long		 n;

	if (v == NULL || *v == '\0')
		return FABRIC_SPIN_US;
	errno = 0;
	n = strtol(v, &end, 10);
	if (errno != 0 || *end != '\0' || n < 0 || n > FABRIC_SPIN_MAX_US) {
		log_warn("fabric", "L3KV_FABRIC_SPIN_US=%s is not a number from 0 to %d: "
		    "polling %d us", v, FABRIC_SPIN_MAX_US, FABRIC_SPIN_US);
		return FABRIC_SPIN_US;
	}
	return n;
}

/* A provider's error (a positive FI_E* / errno) as this API's -errno. */
static int
fabric_errno(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case FI_ECANCELED:
		return -ECANCELED;
	case FI_ENOTCONN:
	case FI_ECONNRESET:
	case FI_ECONNREFUSED:
	case FI_ECONNABORTED:
	case FI_EHOSTUNREACH:
	case FI_ENETUNREACH:
	case FI_ENETDOWN:
	case EPIPE:
	case ESHUTDOWN:
		return -ENOTCONN;
	case FI_ETIMEDOUT:
		return -ETIMEDOUT;
	default:
		return -EIO;
	}
}

static void
fabric_count_failure(struct fabric *f, int err)
{
	f->stats.failed++;
	if (err == -ECANCELED)
		f->stats.ecanceled++;
	else if (err == -ENOTCONN)
		f->stats.enotconn++;
	else if (err == -ETIMEDOUT)
		f->stats.timedout++;
}

/* Fabric thread: an op with nothing owed and nothing more to post goes back to the loop. */
static void
fabric_op_finish(struct fabric_op *op)
{
	assert(op->owed == 0);
	if (op->list != NULL) {
		TAILQ_REMOVE(op->list, op, entry);
		op->list = NULL;
		op->peer = NULL;
	}
	if (op->deadline != NULL) {
		event_free(op->deadline);
		op->deadline = NULL;
	}
	workq_push(op->f->doneq, &op->cmd.wq);	/* the loop's from here */
}

/* Records an op's first error; it stops posting and finishes once nothing is owed. */
static void
fabric_op_fail(struct fabric_op *op, int err)
{
	if (op->err == 0)
		op->err = err;
	op->nparts = op->next;		/* the parts not posted never will be */
	if (op->owed == 0 && op->list != NULL)
		fabric_op_finish(op);
}

/* Loop: counts a finished read and runs its done(). */
static void
fabric_deliver(struct fabric *f, struct fabric_op *op)
{
	struct fabric_handle	*h;

	if ((h = fabric_handle_find(f, op->peer_id)) != NULL)
		h->out[op->lane] -= op->len;
	if (op->err == 0) {
		f->stats.done++;
		f->stats.bytes += op->len;
	} else
		fabric_count_failure(f, op->err);
	f->dispatching++;
	op->done(op->arg, op->err);
	f->dispatching--;
	free(op);
}

/* Loop: doneq's done. While a close is deferred, the reads wait for it. */
static void
fabric_done_cb(struct workq_entry *e, void *arg)
{
	struct fabric		*f = arg;
	struct fabric_op	*op = (struct fabric_op *)(void *)e;

	if (f->closing == 1)
		TAILQ_INSERT_TAIL(&f->late, op, entry);
	else
		fabric_deliver(f, op);
}

/*
 * Loop: after each batch of doneq. A close asked from a done() runs here,
 * once the batch is over (nothing of the queue is touched after this).
 */
static void
fabric_done_wake(void *arg)
{
	struct fabric	*f = arg;

	if (f->closing == 1)
		fabric_close(f);
}

/* Arms the endpoint's zero timer (or a delay): its progress runs on a later loop turn. */
static void
fabric_ep_again(struct fabric_ep *e, int ms)
{
	struct timeval	tv = { ms / 1000, (ms % 1000) * 1000 };

	if (e->again != NULL && !evtimer_pending(e->again, NULL))
		evtimer_add(e->again, &tv);
}

/* A part's completion (err 0) or failure (-errno). */
static void
fabric_part_done(struct fabric_ep *e, struct fabric_part *pt, int err)
{
	struct fabric_op	*op = pt->op;

	if (!pt->posted)
		return;		/* a completion for a part already written off */
	pt->posted = 0;
	e->posted--;
	op->owed--;
	if (err != 0) {
		fabric_op_fail(op, err);
		if (e->peer != NULL)
			e->peer->rebuild = 1;
		return;
	}
	if (op->owed == 0 && op->next == op->nparts)
		fabric_op_finish(op);
}

/* Posts what the peer's ops have unposted, in order, while the endpoint takes them. */
static void
fabric_peer_post(struct fabric_peer *p)
{
	struct fabric_ep	*e = &p->rd;
	struct fabric_op	*op, *next;
	struct fabric_part	*pt;
	ssize_t			 rc;

	if (e->ep == NULL)
		return;
	for (op = TAILQ_FIRST(&p->ops); op != NULL; op = next) {
		next = TAILQ_NEXT(op, entry);
		while (op->next < op->nparts) {
			if (e->posted >= e->f->tx_size)
				return;
			pt = &op->parts[op->next];
			rc = fi_read(e->ep, pt->dst, pt->len, pt->desc, p->addr, pt->raddr, op->rkey,
			    &pt->ctx);
			if (rc == -FI_EAGAIN) {
				/* Connecting, or the queue is full: a completion or the retry posts it. */
				if (e->posted > 0) {
					fabric_ep_again(e, 0);
					return;
				}
				if (p->stalled == 0)
					p->stalled = fabric_ms();
				if (fabric_ms() - p->stalled < FABRIC_CONNECT_MS) {
					fabric_ep_again(e, FABRIC_POLL_MS);
					return;
				}
				log_warn("fabric", "peer %llu: no connection after %d ms",
				    (unsigned long long)p->id, FABRIC_CONNECT_MS);
				p->stalled = 0;
				fabric_op_fail(op, -ENOTCONN);
				p->rebuild = 1;
				return;
			}
			p->stalled = 0;
			if (rc != 0) {
				log_warn("fabric", "fi_read to peer %llu: %s", (unsigned long long)p->id,
				    fi_strerror((int)-rc));
				fabric_op_fail(op, fabric_errno((int)rc));
				p->rebuild = 1;		/* nothing more goes on this endpoint */
				return;
			}
			pt->posted = 1;
			op->next++;
			op->owed++;
			e->posted++;
		}
	}
}

/*
 * Reads the CQ a bounded number of times (each read runs the provider's
 * progress), posts what waits, then either re-arms the wait fd through
 * fi_trywait or, when that says there is more, runs again next turn.
 */
static void
fabric_ep_progress(struct fabric_ep *e)
{
	struct fi_cq_entry	 c[FABRIC_CQ_BATCH];
	struct fi_cq_err_entry	 ee;
	struct fabric_peer	*p = e->peer;
	struct fid		*fid;
	ssize_t			 n, i;
	unsigned		 round;
	int			 more = 0, rc, reading = p != NULL || e->drain != NULL;
	char			 buf[128];

	if (e->cq == NULL)
		return;
	if (p != NULL)
		p->busy = 1;
	for (round = 0; round < FABRIC_CQ_ROUNDS; round++) {
		n = fi_cq_read(e->cq, c, FABRIC_CQ_BATCH);
		if (n > 0) {
			for (i = 0; i < n; i++)
				if (c[i].op_context != NULL && reading)
					fabric_part_done(e, c[i].op_context, 0);
			fabric_ep_active(e);
			more = n == FABRIC_CQ_BATCH;
			if (!more)
				break;
			continue;
		}
		if (n == -FI_EAGAIN)
			break;
		if (n != -FI_EAVAIL) {
			log_warn("fabric", "fi_cq_read: %s", fi_strerror((int)-n));
			if (p != NULL)
				p->rebuild = 1;
			break;
		}
		memset(&ee, 0, sizeof(ee));
		if (fi_cq_readerr(e->cq, &ee, 0) != 1)
			break;
		log_info("fabric", "read from peer %llu failed: %s (%s)",
		    p != NULL ? (unsigned long long)p->id : 0ULL, fi_strerror(ee.err),
		    fi_cq_strerror(e->cq, ee.prov_errno, ee.err_data, buf, sizeof(buf)));
		if (!reading)
			continue;
		if (ee.op_context != NULL)
			fabric_part_done(e, ee.op_context, fabric_errno(ee.err));
		if (p != NULL)
			p->rebuild = 1;
		more = 1;
	}
	if (e->drain != NULL && e->posted == 0) {
		fabric_drain_end(e->drain);	/* nothing on its wire: closed */
		return;
	}
	if (p != NULL) {
		p->busy = 0;
		if (p->rebuild) {
			fabric_peer_rebuild(p);
			return;
		}
		fabric_peer_post(p);
		if (p->rebuild) {
			fabric_peer_rebuild(p);
			return;
		}
	}
	if (more || (e->f->spin_us > 0 && fabric_us() < e->spin_until)) {
		fabric_ep_again(e, 0);
		return;
	}
	if (e->ev != NULL) {
		fid = &e->cq->fid;
		if ((rc = fi_trywait(e->f->fabric, &fid, 1)) == 0)
			return;		/* the wait fd will say when */
		if (rc == -FI_EAGAIN) {
			fabric_ep_again(e, 0);
			return;
		}
	}
	/* No usable wait fd: poll while there is work (manual progress: always for the server). */
	if (e->posted > 0 || (p == NULL && e->f->info->domain_attr->data_progress ==
	    FI_PROGRESS_MANUAL))
		fabric_ep_again(e, FABRIC_POLL_MS);
}

static void
fabric_ep_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct fabric_ep	*e = arg;

	(void)fd;
	if (ev & EV_READ)
		fabric_ep_active(e);
	fabric_ep_progress(e);
}

/* Closes an endpoint and its CQ (its AV stays: the peer's address is kept). Idempotent. */
static void
fabric_ep_close(struct fabric_ep *e)
{
	if (e->ev != NULL)
		event_free(e->ev);
	e->ev = NULL;
	if (e->again != NULL)
		event_free(e->again);
	e->again = NULL;
	if (e->ep != NULL)
		fi_close(&e->ep->fid);
	e->ep = NULL;
	if (e->cq != NULL)
		fi_close(&e->cq->fid);
	e->cq = NULL;
	e->posted = 0;
}

/* An endpoint of lane l with a new CQ on the domain, bound to e->av (opened here if NULL). */
static int
fabric_ep_open(struct fabric_lane *l, struct fabric_ep *e, char *err, size_t errlen)
{
	struct fabric		*f = l->f;
	struct fi_cq_attr	 ca;
	struct fi_av_attr	 aa;
	int			 rc, fd = -1;

	e->f = f;
	e->lane = l;
	memset(&ca, 0, sizeof(ca));
	ca.format = FI_CQ_FORMAT_CONTEXT;
	ca.size = FABRIC_CQ_SIZE;
	ca.wait_obj = FI_WAIT_FD;
	if ((rc = fi_cq_open(f->domain, &ca, &e->cq, NULL)) != 0) {
		ca.wait_obj = FI_WAIT_NONE;
		if ((rc = fi_cq_open(f->domain, &ca, &e->cq, NULL)) != 0) {
			snprintf(err, errlen, "fi_cq_open: %s", fi_strerror(-rc));
			goto fail;
		}
	}
	if (e->av == NULL) {
		memset(&aa, 0, sizeof(aa));
		aa.type = FI_AV_TABLE;
		aa.count = 1;
		if ((rc = fi_av_open(f->domain, &aa, &e->av, NULL)) != 0) {
			snprintf(err, errlen, "fi_av_open: %s", fi_strerror(-rc));
			goto fail;
		}
	}
	if ((rc = fi_endpoint(f->domain, f->info, &e->ep, NULL)) != 0) {
		snprintf(err, errlen, "fi_endpoint: %s", fi_strerror(-rc));
		goto fail;
	}
	if ((rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
	    (rc = fi_ep_bind(e->ep, &e->av->fid, 0)) != 0 || (rc = fi_enable(e->ep)) != 0) {
		snprintf(err, errlen, "endpoint setup: %s", fi_strerror(-rc));
		goto fail;
	}
	if (ca.wait_obj == FI_WAIT_FD && fi_control(&e->cq->fid, FI_GETWAIT, &fd) == 0 && fd >= 0) {
		e->ev = event_new(l->base, fd, EV_READ | EV_PERSIST, fabric_ep_cb, e);
		if (e->ev == NULL || event_add(e->ev, NULL) != 0) {
			rc = -ENOMEM;
			snprintf(err, errlen, "out of memory for an endpoint's event");
			goto fail;
		}
	}
	if ((e->again = evtimer_new(l->base, fabric_ep_cb, e)) == NULL) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory for an endpoint's timer");
		goto fail;
	}
	fabric_ep_again(e, 0);		/* the first progress arms the wait fd */
	return 0;
fail:
	fabric_ep_close(e);
	return rc < 0 ? rc : -EIO;
}

/*
 * The endpoints left open, for the life of the process (one list for every
 * fabric: the cap is what one process may leak). Holding them here keeps
 * them, and the domain they pin, reachable: a leak that is chosen, not lost.
 */
static struct {
	struct fid_ep	*ep;
	struct fid_cq	*cq;
	struct fid_av	*av;
} fabric_abandoned[FABRIC_ABANDON_MAX];
static size_t fabric_nabandoned;
static pthread_mutex_t fabric_abandon_lock = PTHREAD_MUTEX_INITIALIZER;	/* every fabric thread's */

/* Frees the loop's events of an endpoint left open, and forgets it: it is never progressed again. */
static void
fabric_ep_forget(struct fabric_ep *e)
{
	if (e->ev != NULL)
		event_free(e->ev);
	if (e->again != NULL)
		event_free(e->again);
	e->ev = e->again = NULL;
	e->ep = NULL;
	e->cq = NULL;
	e->av = NULL;
	e->posted = 0;
}

/*
 * Leaves an endpoint open for good, counted in f's stats, if the cap
 * allows one more (1); else it is not touched (0: the caller closes it).
 */
static int
fabric_ep_abandon(struct fabric_ep *e)
{
	int	ok;

	pthread_mutex_lock(&fabric_abandon_lock);
	if ((ok = fabric_nabandoned < FABRIC_ABANDON_MAX)) {
		fabric_abandoned[fabric_nabandoned].ep = e->ep;
		fabric_abandoned[fabric_nabandoned].cq = e->cq;
		fabric_abandoned[fabric_nabandoned].av = e->av;
		fabric_nabandoned++;
	}
	pthread_mutex_unlock(&fabric_abandon_lock);
	if (!ok)
		return 0;
	__atomic_add_fetch(&e->f->abandoned, 1, __ATOMIC_RELAXED);
	fabric_ep_forget(e);
	return 1;
}

/*
 * A drain is over: every part on it completed (then it is closed), or its
 * time ran out (closed where that is safe, else left open: see the top).
 * The reads still on it fail, with their own error or -ECANCELED.
 */
static void
fabric_drain_end(struct fabric_drain *d)
{
	struct fabric		*f = d->e.f;
	struct fabric_op	*op;
	size_t			 i, posted;

	posted = d->e.posted;
	if (posted > 0 && f->close_unsafe && fabric_ep_abandon(&d->e)) {
		log_warn("fabric", "peer %llu: %zu reads still on the wire %d ms after their "
		    "endpoint was retired: it is left open (closing it could crash %s)",
		    (unsigned long long)d->peer_id, posted, FABRIC_DRAIN_MS, f->prov);
	} else {
		if (d->e.posted > 0)
			log_warn("fabric", "peer %llu: closing an endpoint with %zu reads on the wire",
			    (unsigned long long)d->peer_id, d->e.posted);
		fabric_ep_close(&d->e);
		if (d->e.av != NULL)
			fi_close(&d->e.av->fid);
		d->e.av = NULL;
	}
	while ((op = TAILQ_FIRST(&d->ops)) != NULL) {
		for (i = 0; i < op->next; i++)
			op->parts[i].posted = 0;
		op->owed = 0;
		fabric_op_fail(op, op->err != 0 ? op->err : -ECANCELED);
	}
	if (d->limit != NULL)
		event_free(d->limit);
	TAILQ_REMOVE(&d->e.lane->drains, d, entry);
	free(d);
}

static void
fabric_drain_limit_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	fabric_drain_end(arg);
}

/*
 * Takes the peer's endpoint out of service; the peer is left without one
 * (rd.ep NULL). With nothing on its wire it is closed here (its AV stays
 * with the peer). Otherwise it becomes a drain, with its AV and the reads
 * that have parts on it: those fail (err, their own error, or -ECANCELED
 * when parts of them were never posted) unless their parts all land.
 */
static void
fabric_ep_retire(struct fabric_peer *p, int err)
{
	struct fabric		*f = p->rd.f;
	struct fabric_lane	*l = p->rd.lane;
	struct fabric_drain	*d;
	struct fabric_op	*op, *next;
	size_t			 i;
	int			 broken = 0;
	struct timeval		 tv = { FABRIC_DRAIN_MS / 1000, (FABRIC_DRAIN_MS % 1000) * 1000 };
	evutil_socket_t		 fd = p->rd.ev != NULL ? event_get_fd(p->rd.ev) : -1;

	if (p->rd.posted == 0) {
		fabric_ep_close(&p->rd);
		return;
	}
	if ((d = calloc(1, sizeof(*d))) == NULL) {
		/* No drain without memory: never progressed again, nothing lands. */
		if (f->close_unsafe && fabric_ep_abandon(&p->rd)) {
			log_warn("fabric", "peer %llu: out of memory: an endpoint is left open",
			    (unsigned long long)p->id);
		} else {
			log_warn("fabric", "peer %llu: out of memory: closing an endpoint with "
			    "%zu reads on the wire", (unsigned long long)p->id, p->rd.posted);
			fabric_ep_close(&p->rd);
		}
		d = NULL;
	} else {
		TAILQ_INIT(&d->ops);
		d->peer_id = p->id;
		d->e = p->rd;
		d->e.peer = NULL;
		d->e.drain = d;
		d->e.ev = d->e.again = NULL;
		if (fd >= 0)
			d->e.ev = event_new(l->base, fd, EV_READ | EV_PERSIST, fabric_ep_cb, &d->e);
		d->e.again = evtimer_new(l->base, fabric_ep_cb, &d->e);
		d->limit = evtimer_new(l->base, fabric_drain_limit_cb, d);
		if ((fd >= 0 && d->e.ev == NULL) || d->e.again == NULL || d->limit == NULL ||
		    (d->e.ev != NULL && event_add(d->e.ev, NULL) != 0) ||
		    evtimer_add(d->limit, &tv) != 0) {
			/* Nothing would progress it, or end it: it ends below, now. */
			log_warn("fabric", "peer %llu: out of memory for a drain's events",
			    (unsigned long long)p->id);
			broken = 1;
		}
		TAILQ_INSERT_TAIL(&l->drains, d, entry);
		fabric_ep_forget(&p->rd);	/* frees the old events: the drain has its own */
	}
	for (op = TAILQ_FIRST(&p->ops); op != NULL; op = next) {
		next = TAILQ_NEXT(op, entry);
		if (op->owed == 0)
			continue;
		if (op->err == 0)
			op->err = err != 0 ? err : op->next < op->nparts ? -ECANCELED : 0;
		op->nparts = op->next;
		if (op->deadline != NULL) {
			event_free(op->deadline);
			op->deadline = NULL;
		}
		if (d == NULL) {
			/* Left open: its parts never complete; the op fails now. */
			for (i = 0; i < op->next; i++)
				op->parts[i].posted = 0;
			op->owed = 0;
			fabric_op_fail(op, op->err != 0 ? op->err : -ECANCELED);
			continue;
		}
		TAILQ_REMOVE(&p->ops, op, entry);
		op->peer = NULL;
		op->list = &d->ops;
		TAILQ_INSERT_TAIL(&d->ops, op, entry);
	}
	if (d != NULL && broken)
		fabric_drain_end(d);	/* closed where safe, else left open; its reads fail */
	else if (d != NULL)
		fabric_ep_again(&d->e, 0);
}

/* Opens the peer's endpoint (and its AV, with the peer's address in it, when it has none). */
static int
fabric_peer_open(struct fabric_peer *p, char *err, size_t errlen)
{
	int	fresh = p->rd.av == NULL, rc;

	if ((rc = fabric_ep_open(p->rd.lane, &p->rd, err, errlen)) != 0)
		return rc;
	if (fresh && fi_av_insert(p->rd.av, p->name, 1, &p->addr, 0, NULL) != 1) {
		snprintf(err, errlen, "fi_av_insert: the peer's address was refused");
		fabric_ep_close(&p->rd);
		fi_close(&p->rd.av->fid);
		p->rd.av = NULL;
		return -EINVAL;
	}
	return 0;
}

/*
 * Retires the peer's endpoint (fabric_ep_retire: the reads with parts on
 * it drain there) and opens a fresh one on the same address; the unposted
 * parts go there. If that fails the peer stays broken: its reads fail
 * -ENOTCONN and the next fabric_read tries again.
 */
static void
fabric_peer_rebuild(struct fabric_peer *p)
{
	struct fabric_op	*op;
	char			 err[256];

	p->rebuild = 0;
	fabric_ep_retire(p, 0);
	if (fabric_peer_open(p, err, sizeof(err)) != 0) {
		log_warn("fabric", "peer %llu: rebuilding its endpoint: %s", (unsigned long long)p->id,
		    err);
		while ((op = TAILQ_FIRST(&p->ops)) != NULL)
			fabric_op_fail(op, -ENOTCONN);
		return;
	}
	log_debug("fabric", "peer %llu: endpoint rebuilt", (unsigned long long)p->id);
	fabric_peer_post(p);
}

static struct fabric_peer *
fabric_peer_find(const struct fabric_lane *l, uint64_t id)
{
	struct fabric_peer	*p;

	TAILQ_FOREACH(p, &l->peers, entry)
		if (p->id == id)
			return p;
	return NULL;
}

static void
fabric_deadline_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct fabric_op	*op = arg;
	struct fabric_peer	*p = op->peer;

	(void)fd;
	(void)ev;
	if (p == NULL)
		return;
	if (op->err == 0)
		op->err = -ETIMEDOUT;
	op->nparts = op->next;
	if (op->owed == 0) {
		fabric_op_finish(op);
		return;
	}
	/* Parts on the wire: only closing the endpoint guarantees they never land. */
	log_info("fabric", "peer %llu: a read of %zu bytes passed its deadline",
	    (unsigned long long)p->id, op->len);
	fabric_peer_rebuild(p);
}

static void
fabric_backstop_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct fabric_lane	*l = arg;
	struct fabric_peer	*p;
	struct fabric_drain	*d;

	(void)fd;
	(void)ev;
	fabric_ep_again(&l->srv, 0);
	TAILQ_FOREACH(p, &l->peers, entry)
		fabric_ep_again(&p->rd, 0);
	TAILQ_FOREACH(d, &l->drains, entry)
		fabric_ep_again(&d->e, 0);
}

/* The region and chunk holding [p, p + len), or NULL. */
static const struct fabric_chunk *
fabric_chunk_find(const struct fabric *f, const void *p, size_t len)
{
	const struct fabric_region	*r;
	const struct fabric_chunk	*c;
	uintptr_t			 a = (uintptr_t)p;
	size_t				 i;

	for (i = 0; i < f->nregions; i++) {
		r = &f->regions[i];
		if (a < (uintptr_t)r->base || a - (uintptr_t)r->base >= r->len)
			continue;
		c = &r->chunks[(a - (uintptr_t)r->base) / r->chunk];
		if (len > c->len - (size_t)(a - (uintptr_t)c->base))
			return NULL;
		return c;
	}
	return NULL;
}

/* Whether [p, p + len) lies inside the exposed regions (it may cross chunks). */
static int
fabric_local_ok(const struct fabric *f, const void *p, size_t len)
{
	const struct fabric_region	*r;
	uintptr_t			 a = (uintptr_t)p;
	size_t				 i;

	for (i = 0; i < f->nregions; i++) {
		r = &f->regions[i];
		if (a >= (uintptr_t)r->base && a - (uintptr_t)r->base < r->len)
			return len <= r->len - (size_t)(a - (uintptr_t)r->base);
	}
	return 0;
}

/*
 * Fabric thread: a read the loop built goes onto its peer. It fails here
 * (through doneq, as every read) when the peer's endpoint cannot be
 * reopened or its deadline's timer made.
 */
static void
fabric_thread_read(struct fabric_lane *l, struct fabric_op *op)
{
	struct fabric_peer	*p;
	struct timeval		 tv;
	char			 err[256];

	if ((p = fabric_peer_find(l, op->peer_id)) == NULL) {
		op->err = -ECANCELED;	/* not reached: a REMOVE follows its peer's reads */
		fabric_op_finish(op);
		return;
	}
	if (p->rd.ep == NULL && fabric_peer_open(p, err, sizeof(err)) != 0) {
		log_warn("fabric", "peer %llu: %s", (unsigned long long)p->id, err);
		op->err = -ENOTCONN;
		fabric_op_finish(op);
		return;
	}
	if (op->deadline_ms > 0) {
		tv.tv_sec = op->deadline_ms / 1000;
		tv.tv_usec = (op->deadline_ms % 1000) * 1000;
		if ((op->deadline = evtimer_new(l->base, fabric_deadline_cb, op)) == NULL ||
		    evtimer_add(op->deadline, &tv) != 0) {
			op->err = -ENOMEM;
			fabric_op_finish(op);
			return;
		}
	}
	op->list = &p->ops;
	op->peer = p;
	TAILQ_INSERT_TAIL(&p->ops, op, entry);
	fabric_peer_post(p);
	if (p->rebuild)
		fabric_peer_rebuild(p);
	else
		fabric_ep_again(&p->rd, 0);
}

/* Fabric thread: fails the peer's reads (-ECANCELED, once their parts drained) and forgets it. */
static void
fabric_thread_remove(struct fabric_lane *l, uint64_t id)
{
	struct fabric_peer	*p;
	struct fabric_op	*op;

	if ((p = fabric_peer_find(l, id)) == NULL)
		return;
	fabric_ep_retire(p, -ECANCELED);
	while ((op = TAILQ_FIRST(&p->ops)) != NULL)
		fabric_op_fail(op, -ECANCELED);
	if (p->rd.av != NULL)
		fi_close(&p->rd.av->fid);
	TAILQ_REMOVE(&l->peers, p, entry);
	free(p);
}

/*
 * Fabric thread, its last command: every peer removed, and the reads with
 * parts on the wire drained, here, for at most FABRIC_DRAIN_MS.
 */
static void
fabric_thread_stop(struct fabric_lane *l)
{
	struct fabric_drain	*d, *dn;
	struct timespec		 nap = { 0, 200 * 1000 };
	int64_t			 t0;

	while (!TAILQ_EMPTY(&l->peers))
		fabric_thread_remove(l, TAILQ_FIRST(&l->peers)->id);
	for (t0 = fabric_ms(); !TAILQ_EMPTY(&l->drains) && fabric_ms() - t0 < FABRIC_DRAIN_MS;
	    nanosleep(&nap, NULL)) {
		for (d = TAILQ_FIRST(&l->drains); d != NULL; d = dn) {
			dn = TAILQ_NEXT(d, entry);
			fabric_ep_progress(&d->e);	/* may end d */
		}
	}
	while ((d = TAILQ_FIRST(&l->drains)) != NULL)
		fabric_drain_end(d);
	l->stop.rc = 1;		/* ran: fabric_thread_main returns */
	event_base_loopbreak(l->base);
}

/* Fabric thread: cmdq's done. */
static void
fabric_cmd_cb(struct workq_entry *e, void *arg)
{
	struct fabric_lane	*l = arg;
	struct fabric_cmd	*c = (struct fabric_cmd *)(void *)e;
	struct fabric_peer	*p;
	sem_t			*answered;
	char			 err[256];

	switch (c->type) {
	case FABRIC_CMD_READ:
		fabric_thread_read(l, (struct fabric_op *)(void *)c);
		break;
	case FABRIC_CMD_ADD:
		p = c->add;
		if ((c->rc = fabric_peer_open(p, err, sizeof(err))) != 0)
			log_warn("fabric", "a peer's endpoint (lane %u): %s", l->idx, err);
		else
			TAILQ_INSERT_TAIL(&l->peers, p, entry);
		answered = c->answered;
		sem_post(answered);	/* c is the loop's again */
		break;
	case FABRIC_CMD_REMOVE:
		fabric_thread_remove(l, c->peer);
		free(c);		/* made for this lane at the add */
		break;
	case FABRIC_CMD_STOP:
		fabric_thread_stop(l);
		break;
	}
}

/*
 * Runs until STOP. A failed turn of the base (epoll itself failing) is
 * retried after a pause rather than ending the thread: fabric_peer_add
 * waits for this thread, and a thread gone would hang the loop.
 */
static void *
fabric_thread_main(void *arg)
{
	struct fabric_lane	*l = arg;
	struct timespec		 nap = { 0, 10 * 1000 * 1000 };
	int			 said = 0;

	while (l->stop.rc == 0) {
		if (event_base_dispatch(l->base) == 0 || l->stop.rc != 0)
			continue;
		if (!said++)
			log_error("fabric", "the fabric thread's event loop failed: %s; retrying",
			    strerror(errno));
		nanosleep(&nap, NULL);
	}
	return NULL;
}

/*
 * rxm gives every connection receive buffers of FI_OFI_RXM_BUFFER_SIZE
 * (16 KiB), FI_OFI_RXM_MSG_RX_SIZE (128) of them and more pools sized by
 * it: with tcp;ofi_rxm a reading endpoint, connected, cost 87 MiB of RSS
 * here (ten endpoints, 1.17.0). We send no messages and post no receives
 * (reads are RMA straight on the message endpoint; only rxm's own
 * connection handshake uses these), so 2 KiB buffers, 16 of them: 6 MiB.
 * Providers read their variables once, at their first use; an operator's
 * own setting wins.
 */
void
fabric_init_env(void)
{
	setenv("FI_OFI_RXM_BUFFER_SIZE", "2048", 0);
	setenv("FI_OFI_RXM_MSG_RX_SIZE", "16", 0);
}

/*
 * A lane's event base, command queue, serving endpoint (its name goes to
 * f->own at its index; every lane's must be as long as lane 0's) and
 * backstop timer. Its thread is started by fabric_open.
 */
static int
fabric_lane_open(struct fabric_lane *l, char *err, size_t errlen)
{
	struct fabric	*f = l->f;
	struct timeval	 tv = { FABRIC_BACKSTOP_MS / 1000, (FABRIC_BACKSTOP_MS % 1000) * 1000 };
	size_t		 len = FABRIC_ADDR_MAX;
	int		 rc;

	if ((l->base = event_base_new()) == NULL) {
		snprintf(err, errlen, "fabric: out of memory for a fabric thread's event base");
		return -ENOMEM;
	}
	if ((rc = workq_new(l->base, "fabric", FABRIC_CMD_BATCH, fabric_cmd_cb, NULL, l, &l->cmdq,
	    err, errlen)) != 0 || (rc = fabric_ep_open(l, &l->srv, err, errlen)) != 0)
		return rc;
	if ((rc = fi_getname(&l->srv.ep->fid, f->own + l->idx * FABRIC_ADDR_MAX, &len)) != 0) {
		snprintf(err, errlen, "fabric: fi_getname: %s", fi_strerror(-rc));
		return fabric_errno(rc);
	}
	if (l->idx == 0)
		f->ownlen = len;
	else if (len != f->ownlen) {
		snprintf(err, errlen, "fabric: lane %u's endpoint name is %zu bytes, lane 0's %zu",
		    l->idx, len, f->ownlen);
		return -EIO;
	}
	l->backstop = event_new(l->base, -1, EV_PERSIST, fabric_backstop_cb, l);
	if (l->backstop == NULL || event_add(l->backstop, &tv) != 0) {
		snprintf(err, errlen, "fabric: out of memory for its events");
		return -ENOMEM;
	}
	return 0;
}

/* Frees what fabric_lane_open made; its thread has ended (or never ran). */
static void
fabric_lane_free(struct fabric_lane *l)
{
	if (l->backstop != NULL)
		event_free(l->backstop);
	l->backstop = NULL;
	fabric_ep_close(&l->srv);
	if (l->srv.av != NULL)
		fi_close(&l->srv.av->fid);
	l->srv.av = NULL;
	workq_free(l->cmdq);
	l->cmdq = NULL;
	if (l->base != NULL)
		event_base_free(l->base);
	l->base = NULL;
}

/*
 * Opens provider prov on node (NULL: the provider's choice) with `lanes`
 * fabric threads (1 to FABRIC_LANES_MAX), each with a serving endpoint
 * of its own and a reading endpoint per peer: a peer is read over as many
 * lanes as both sides have, so that its reads, and the serving side's
 * progress of them, spread over that many threads and connections.
 * done() callbacks run on base's loop, the caller's. The caller owns *fp
 * (fabric_close). 0 or -errno with err filled.
 */
int
fabric_open(struct event_base *base, const char *prov, const char *node, unsigned lanes,
    struct fabric **fp, char *err, size_t errlen)
{
	struct fi_info		*hints;
	struct fabric		*f;
	struct fabric_lane	*l;
	sigset_t		 all, old;
	size_t			 ks;
	unsigned		 i;
	int			 rc;

	*fp = NULL;
	if (prov == NULL || *prov == '\0') {
		snprintf(err, errlen, "fabric: no provider named");
		return -EINVAL;
	}
	if (lanes < 1 || lanes > FABRIC_LANES_MAX) {
		snprintf(err, errlen, "fabric: %u lanes (1 to %d)", lanes, FABRIC_LANES_MAX);
		return -EINVAL;
	}
	if ((f = calloc(1, sizeof(*f))) == NULL || (hints = fi_allocinfo()) == NULL) {
		free(f);
		snprintf(err, errlen, "fabric: out of memory");
		return -ENOMEM;
	}
	f->loop = base;
	TAILQ_INIT(&f->handles);
	TAILQ_INIT(&f->late);
	f->nlanes = lanes;
	for (i = 0; i < lanes; i++) {
		l = &f->lanes[i];
		l->f = f;
		l->idx = i;
		TAILQ_INIT(&l->peers);
		TAILQ_INIT(&l->drains);
		l->stop.type = FABRIC_CMD_STOP;
	}
	hints->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
	hints->mode = FABRIC_MODE_OFFER;
	hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->mr_mode = FABRIC_MR_OFFER;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->fabric_attr->prov_name = strdup(prov);
	if (hints->fabric_attr->prov_name == NULL) {
		rc = -ENOMEM;
		snprintf(err, errlen, "fabric: out of memory");
		fi_freeinfo(hints);
		goto fail;
	}
	rc = fi_getinfo(FABRIC_VERSION, node, NULL, node != NULL ? FI_SOURCE : 0, hints, &f->info);
	fi_freeinfo(hints);
	if (rc != 0) {
		snprintf(err, errlen, "fabric: provider %s%s%s: %s", prov, node != NULL ? " on " : "",
		    node != NULL ? node : "", fi_strerror(-rc));
		rc = rc == -FI_ENODATA ? -ENODEV : fabric_errno(rc);
		goto fail;
	}
	if ((f->info->domain_attr->mr_mode & ~(uint64_t)FABRIC_MR_OFFER) != 0 ||
	    (f->info->mode & ~(uint64_t)FABRIC_MODE_OFFER) != 0) {
		snprintf(err, errlen, "fabric: %s asks for modes we did not offer (mr_mode %#x, mode %#llx)",
		    f->info->fabric_attr->prov_name, (unsigned)f->info->domain_attr->mr_mode,
		    (unsigned long long)f->info->mode);
		rc = -ENOTSUP;
		goto fail;
	}
	snprintf(f->prov, sizeof(f->prov), "%s", f->info->fabric_attr->prov_name);
	f->spin_us = fabric_spin_env();
	f->close_unsafe = strstr(f->prov, "tcp") != NULL &&
	    FI_VERSION_LT(fi_version(), FI_VERSION(1, 18));
	f->mr_mode = (uint64_t)f->info->domain_attr->mr_mode;
	f->max_msg = f->info->ep_attr->max_msg_size > SIZE_MAX ? SIZE_MAX :
	    (size_t)f->info->ep_attr->max_msg_size;
	if (f->max_msg == 0)
		f->max_msg = 1;
	f->tx_size = f->info->tx_attr->size;
	if (f->tx_size == 0 || f->tx_size > FABRIC_CQ_SIZE)
		f->tx_size = FABRIC_CQ_SIZE;
	ks = f->info->domain_attr->mr_key_size;
	f->key_mask = ks == 0 || ks >= sizeof(uint64_t) ? UINT64_MAX : (1ULL << (8 * ks)) - 1;
	if (getrandom(&f->key_next, sizeof(f->key_next), 0) != sizeof(f->key_next)) {
		rc = -errno;
		snprintf(err, errlen, "fabric: getrandom: %s", strerror(errno));
		goto fail;
	}
	if ((rc = fi_fabric(f->info->fabric_attr, &f->fabric, NULL)) != 0) {
		snprintf(err, errlen, "fabric: fi_fabric: %s", fi_strerror(-rc));
		goto fail;
	}
	if ((rc = fi_domain(f->fabric, f->info, &f->domain, NULL)) != 0) {
		snprintf(err, errlen, "fabric: fi_domain: %s", fi_strerror(-rc));
		goto fail;
	}
	if ((rc = workq_new(base, "fabric", FABRIC_FINISH_BATCH, fabric_done_cb, fabric_done_wake, f,
	    &f->doneq, err, errlen)) != 0)
		goto fail;
	for (i = 0; i < lanes; i++)
		if ((rc = fabric_lane_open(&f->lanes[i], err, errlen)) != 0)
			goto fail;
	/* Signals are the loop's (libevent's handlers there): the threads block them all. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (i = 0, rc = 0; i < lanes && rc == 0; i++) {
		l = &f->lanes[i];
		if ((rc = pthread_create(&l->thread, NULL, fabric_thread_main, l)) == 0) {
			pthread_setname_np(l->thread, "l3kv-fabric");
			l->started = 1;
		}
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		snprintf(err, errlen, "fabric: pthread_create: %s", strerror(rc));
		rc = -rc;
		goto fail;
	}
	log_info("fabric", "%s: mr_mode %#llx, max message %zu, %zu reads in flight per peer and "
	    "lane, %u lane%s, polls %lld us after activity", f->prov, (unsigned long long)f->mr_mode,
	    f->max_msg, f->tx_size, lanes, lanes == 1 ? "" : "s", (long long)f->spin_us);
	*fp = f;
	return 0;
fail:
	fabric_close(f);
	return rc < 0 ? rc : -EIO;
}

/*
 * Fails every read still in flight (-ECANCELED) and runs every done()
 * still owed, here, then stops the fabric thread and frees everything in
 * reverse order. Reads with parts on the wire drain first, for at most
 * FABRIC_DRAIN_MS. From inside a done() it takes effect once the batch of
 * done() callbacks that one belongs to is over, before the loop moves on.
 * Idempotent on NULL.
 */
void
fabric_close(struct fabric *f)
{
	struct fabric_op	*op;
	struct fabric_handle	*h;
	size_t			 i, j;

	if (f == NULL || f->closing == 2)
		return;
	if (f->dispatching > 0) {
		f->closing = 1;		/* fabric_done_wake closes */
		return;
	}
	f->closing = 2;
	for (i = 0; i < f->nlanes; i++)
		if (f->lanes[i].started)
			workq_push(f->lanes[i].cmdq, &f->lanes[i].stop.wq);
	for (i = 0; i < f->nlanes; i++)
		if (f->lanes[i].started) {
			pthread_join(f->lanes[i].thread, NULL);
			f->lanes[i].started = 0;
		}
	/*
	 * No fabric thread from here. STOP was each one's last command
	 * (nothing is pushed once closing) and removed every peer and drain
	 * of its lane; without threads (fabric_open failed before them) there
	 * never were any.
	 */
	while ((op = TAILQ_FIRST(&f->late)) != NULL) {
		TAILQ_REMOVE(&f->late, op, entry);
		fabric_deliver(f, op);
	}
	workq_flush(f->doneq);
	while ((h = TAILQ_FIRST(&f->handles)) != NULL) {
		TAILQ_REMOVE(&f->handles, h, entry);
		fabric_handle_free(h);
	}
	for (i = 0; i < f->nlanes; i++)
		fabric_lane_free(&f->lanes[i]);
	workq_free(f->doneq);
	for (i = 0; i < f->nregions; i++) {
		for (j = 0; j < f->regions[i].nchunks; j++)
			if (f->regions[i].chunks[j].mr != NULL)
				fi_close(&f->regions[i].chunks[j].mr->fid);
		free(f->regions[i].chunks);
	}
	free(f->regions);
	if (f->domain != NULL)
		fi_close(&f->domain->fid);
	if (f->fabric != NULL)
		fi_close(&f->fabric->fid);
	if (f->info != NULL)
		fi_freeinfo(f->info);
	free(f);
}

const char *
fabric_provider(const struct fabric *f)
{
	return f->prov;
}

/* How long the fabric thread polls an endpoint after activity, in us (0: never). */
unsigned
fabric_spin_us(const struct fabric *f)
{
	return (unsigned)f->spin_us;
}

unsigned
fabric_lanes(const struct fabric *f)
{
	return f->nlanes;
}

/*
 * The serving endpoints' names, lane 0's first, each as long as the
 * others; *len: the buffer's size in, the names' length out (a multiple
 * of one name's).
 */
int
fabric_name(const struct fabric *f, uint8_t *buf, size_t *len)
{
	size_t		room = *len;
	unsigned	i;

	*len = f->ownlen * f->nlanes;
	if (room < *len)
		return -ENOBUFS;
	for (i = 0; i < f->nlanes; i++)
		memcpy(buf + i * f->ownlen, f->own + i * FABRIC_ADDR_MAX, f->ownlen);
	return 0;
}

/* Lowers the size reads are split at (tests, tuning); never above the provider's maximum. */
void
fabric_set_max_msg(struct fabric *f, size_t n)
{
	size_t	max = f->info->ep_attr->max_msg_size > SIZE_MAX ? SIZE_MAX :
		    (size_t)f->info->ep_attr->max_msg_size;

	f->max_msg = n == 0 || n > max ? max : n;
}

/*
 * Registers [base, base + len) in chunks of at most `chunk` bytes (0: 1 GiB)
 * for FI_READ | FI_REMOTE_READ. -EEXIST when it overlaps a region already
 * exposed; the registrations live until fabric_close.
 */
int
fabric_expose(struct fabric *f, void *base, size_t len, size_t chunk)
{
	struct fabric_region	*r, *nr;
	struct fabric_chunk	*c;
	uint8_t			*b = base;
	uint64_t		 key;
	size_t			 i;
	int			 rc;

	if (base == NULL || len == 0)
		return -EINVAL;
	if (chunk == 0)
		chunk = FABRIC_CHUNK_DEFAULT;
	if ((uintptr_t)b + len < (uintptr_t)b)
		return -EINVAL;
	for (i = 0; i < f->nregions; i++)
		if ((uintptr_t)b < (uintptr_t)f->regions[i].base + f->regions[i].len &&
		    (uintptr_t)f->regions[i].base < (uintptr_t)b + len)
			return -EEXIST;
	if ((nr = reallocarray(f->regions, f->nregions + 1, sizeof(*nr))) == NULL)
		return -ENOMEM;
	f->regions = nr;
	r = &f->regions[f->nregions];
	memset(r, 0, sizeof(*r));
	r->base = b;
	r->len = len;
	r->chunk = chunk;
	r->nchunks = (len + chunk - 1) / chunk;
	if ((r->chunks = calloc(r->nchunks, sizeof(*r->chunks))) == NULL)
		return -ENOMEM;
	for (i = 0; i < r->nchunks; i++) {
		c = &r->chunks[i];
		c->base = b + i * chunk;
		c->len = i + 1 < r->nchunks ? chunk : len - i * chunk;
		do
			key = f->key_next++ & f->key_mask;
		while (key == 0 || key == (FI_KEY_NOTAVAIL & f->key_mask));
		rc = fi_mr_reg(f->domain, c->base, c->len, FI_READ | FI_REMOTE_READ, 0,
		    (f->mr_mode & FI_MR_PROV_KEY) != 0 ? 0 : key, 0, &c->mr, NULL);
		if (rc != 0) {
			log_error("fabric", "fi_mr_reg of %zu bytes: %s", c->len, fi_strerror(-rc));
			goto fail;
		}
		c->key = fi_mr_key(c->mr);
		if (c->key == FI_KEY_NOTAVAIL) {
			log_error("fabric", "%s gives raw keys, which a peer HELLO cannot carry", f->prov);
			rc = -ENOTSUP;
			goto fail;
		}
		c->desc = (f->mr_mode & FI_MR_LOCAL) != 0 ? fi_mr_desc(c->mr) : NULL;
	}
	f->nregions++;
	return 0;
fail:
	for (i = 0; i < r->nchunks; i++)
		if (r->chunks[i].mr != NULL)
			fi_close(&r->chunks[i].mr->fid);
	free(r->chunks);
	return rc < 0 ? fabric_errno(rc) : -EIO;
}

int
fabric_rkey(const struct fabric *f, const void *p, size_t len, uint64_t *raddr, uint64_t *rkey)
{
	const struct fabric_chunk	*c;

	if ((c = fabric_chunk_find(f, p, len)) == NULL)
		return -ERANGE;
	*raddr = (f->mr_mode & FI_MR_VIRT_ADDR) != 0 ? (uint64_t)(uintptr_t)p :
	    (uint64_t)((const uint8_t *)p - c->base);
	*rkey = c->key;
	return 0;
}

/* The handle and the REMOVEs it still holds (those not pushed). */
static void
fabric_handle_free(struct fabric_handle *h)
{
	unsigned	i;

	for (i = 0; i < FABRIC_LANES_MAX; i++)
		free(h->rm[i]);
	free(h);
}

/*
 * A peer by the names it sent (untrusted: len a multiple of this
 * provider's name length, one name per lane of the peer, lane 0's first,
 * each a socket address's family where the provider's names are socket
 * addresses). It is read over as many lanes as both sides have; lane i
 * of ours reads the peer's lane i. *peer is the handle for fabric_read
 * and fabric_peer_remove. Waits for the fabric threads to open the
 * peer's endpoints.
 */
int
fabric_peer_add(struct fabric *f, const uint8_t *name, size_t len, uint64_t *peer)
{
	struct fabric_peer	*p[FABRIC_LANES_MAX] = { 0 };
	struct fabric_handle	*h;
	struct fabric_cmd	 c[FABRIC_LANES_MAX];
	sem_t			 answered;
	uint16_t		 family;
	unsigned		 i, n;
	int			 rc = 0;

	if (f->closing || len == 0 || len % f->ownlen != 0)
		return -EINVAL;
	n = (unsigned)(len / f->ownlen < f->nlanes ? len / f->ownlen : f->nlanes);
	if (f->info->addr_format == FI_SOCKADDR_IN || f->info->addr_format == FI_SOCKADDR_IN6 ||
	    f->info->addr_format == FI_SOCKADDR)
		for (i = 0; i < len / f->ownlen; i++) {
			memcpy(&family, name + i * f->ownlen, sizeof(family));
			if (family != AF_INET && family != AF_INET6)
				return -EINVAL;
		}
	if ((h = calloc(1, sizeof(*h))) == NULL || sem_init(&answered, 0, 0) != 0) {
		free(h);
		return -ENOMEM;
	}
	h->id = ++f->peer_next;
	h->nlanes = n;
	for (i = 0; i < n; i++) {
		p[i] = calloc(1, sizeof(*p[i]));
		h->rm[i] = calloc(1, sizeof(*h->rm[i]));
		if (p[i] == NULL || h->rm[i] == NULL) {
			for (n = 0; n <= i; n++)
				free(p[n]);
			fabric_handle_free(h);
			sem_destroy(&answered);
			return -ENOMEM;
		}
		TAILQ_INIT(&p[i]->ops);
		memcpy(p[i]->name, name + i * f->ownlen, f->ownlen);
		p[i]->namelen = f->ownlen;
		p[i]->id = h->id;
		p[i]->rd.peer = p[i];
		p[i]->rd.f = f;
		p[i]->rd.lane = &f->lanes[i];
		h->rm[i]->type = FABRIC_CMD_REMOVE;
		h->rm[i]->peer = h->id;
	}
	memset(c, 0, sizeof(c));
	for (i = 0; i < n; i++) {
		c[i].type = FABRIC_CMD_ADD;
		c[i].add = p[i];
		c[i].answered = &answered;
		workq_push(f->lanes[i].cmdq, &c[i].wq);
	}
	for (i = 0; i < n; i++)
		while (sem_wait(&answered) != 0)
			;	/* EINTR only */
	sem_destroy(&answered);
	for (i = 0; i < n; i++)
		if (c[i].rc != 0 && rc == 0)
			rc = c[i].rc;
	if (rc != 0) {
		/* The lanes that kept theirs remove it; the others did not keep it. */
		for (i = 0; i < n; i++) {
			if (c[i].rc != 0) {
				free(p[i]);
				continue;
			}
			workq_push(f->lanes[i].cmdq, &h->rm[i]->wq);
			h->rm[i] = NULL;
		}
		fabric_handle_free(h);
		return rc;
	}
	TAILQ_INSERT_TAIL(&f->handles, h, entry);
	*peer = h->id;
	return 0;
}

static struct fabric_handle *
fabric_handle_find(const struct fabric *f, uint64_t id)
{
	struct fabric_handle	*h;

	TAILQ_FOREACH(h, &f->handles, entry)
		if (h->id == id)
			return h;
	return NULL;
}

/*
 * Fails the peer's reads (-ECANCELED; their done() runs later on the loop,
 * once the parts on the wire drained) and forgets it.
 */
void
fabric_peer_remove(struct fabric *f, uint64_t id)
{
	struct fabric_handle	*h;

	unsigned		 i;

	if ((h = fabric_handle_find(f, id)) == NULL)
		return;
	TAILQ_REMOVE(&f->handles, h, entry);
	if (f->closing != 2) {
		/* The close removes every peer itself; else each lane frees its REMOVE. */
		for (i = 0; i < h->nlanes; i++) {
			workq_push(f->lanes[i].cmdq, &h->rm[i]->wq);
			h->rm[i] = NULL;
		}
	}
	fabric_handle_free(h);
}

/*
 * Reads len bytes at the peer's (raddr, rkey) into dst, which must lie in
 * the exposed regions. 0: accepted, done(arg, err) will run exactly once,
 * on the loop, never from inside this call (-ENOTCONN there when the
 * peer's endpoint cannot be reopened). Otherwise -errno and done() never
 * runs: -EINVAL, -ENOENT (no such peer), -ERANGE (dst not exposed),
 * -ENOMEM.
 */
int
fabric_read(struct fabric *f, uint64_t peer, void *dst, size_t len, uint64_t raddr,
    uint64_t rkey, uint32_t deadline_ms, fabric_done_fn done, void *arg)
{
	const struct fabric_chunk	*c;
	struct fabric_handle		*h;
	struct fabric_op		*op;
	struct fabric_part		*pt;
	uint8_t				*d = dst;
	size_t				 n, off, np;
	unsigned			 i, lane, start;

	if (len == 0 || done == NULL || f->closing || raddr + len < raddr)
		return -EINVAL;
	if ((h = fabric_handle_find(f, peer)) == NULL)
		return -ENOENT;
	if (!fabric_local_ok(f, dst, len))
		return -ERANGE;
	for (np = 0, off = 0; off < len; off += n, np++) {
		c = fabric_chunk_find(f, d + off, 1);
		n = (size_t)(c->base + c->len - (d + off));
		n = n < len - off ? n : len - off;
		n = n < f->max_msg ? n : f->max_msg;
	}
	if ((op = calloc(1, sizeof(*op) + np * sizeof(op->parts[0]))) == NULL)
		return -ENOMEM;
	op->cmd.type = FABRIC_CMD_READ;
	op->f = f;
	op->peer_id = peer;
	op->deadline_ms = deadline_ms;
	op->done = done;
	op->arg = arg;
	op->len = len;
	op->rkey = rkey;
	op->nparts = np;
	for (np = 0, off = 0; off < len; off += n, np++) {
		c = fabric_chunk_find(f, d + off, 1);
		n = (size_t)(c->base + c->len - (d + off));
		n = n < len - off ? n : len - off;
		n = n < f->max_msg ? n : f->max_msg;
		pt = &op->parts[np];
		pt->op = op;
		pt->dst = d + off;
		pt->len = n;
		pt->raddr = raddr + off;
		pt->desc = c->desc;
	}
	/*
	 * The lane owing the fewest bytes (a slow or rebuilding one gets
	 * less), ties taken in turn, so that every lane's connection is made
	 * and kept warm while reads come one at a time.
	 */
	start = lane = h->turn++ % h->nlanes;
	for (i = 1; i < h->nlanes; i++)
		if (h->out[(start + i) % h->nlanes] < h->out[lane])
			lane = (start + i) % h->nlanes;
	h->out[lane] += len;
	op->lane = lane;
	f->stats.reads++;
	f->stats.lane_reads[lane]++;
	workq_push(f->lanes[lane].cmdq, &op->cmd.wq);	/* that fabric thread's from here */
	return 0;
}

void
fabric_get_stats(const struct fabric *f, struct fabric_stats *st)
{
	*st = f->stats;
	st->abandoned = __atomic_load_n(&f->abandoned, __ATOMIC_RELAXED);
}
