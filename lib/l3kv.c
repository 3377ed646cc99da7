/*
 * libl3kv: one connection to l3kvd, with blocking calls built on a
 * non-blocking core.
 *
 * Every request is a struct l3kv_req keyed by its seq (the ticket). It
 * sits on `pending` from submission until its reply arrives; a frame the
 * socket could not take at once waits, copied, on `sendq`. Replies are
 * matched to requests by seq, whatever their order. A reply completes its
 * request: one submitted without waiting moves to `done`, where
 * l3kv_poll_completion() finds it; one a blocking call waits for is only
 * marked done, and the caller takes it. A blocking call that times out
 * orphans its request, whose late reply is then dropped.
 *
 * l3kv_fd() is an epoll fd over the socket and an eventfd. The eventfd is
 * kept readable while `done` is not empty (or the connection is broken),
 * because a blocking call may have read those replies off the socket, and
 * an event loop polling the socket alone would never hear of them.
 *
 * Any reply libl3kv cannot parse breaks the connection: the socket is
 * closed, every pending request completes with the error, and later calls
 * fail with -ENOTCONN. Frames are read into a small buffer, or straight
 * into their payload allocation when large; a reply's payload becomes
 * its completion's, with no copy.
 */
#define L3KV_BUILDING
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "l3kv.h"
#include "proto.h"

/*
 * The public numbers are the wire's, so that they pass through unchanged
 * (and a Python binding can use either).
 */
#define L3KV_SAME(a, b)	_Static_assert((long long)(a) == (long long)(b), #a " is " #b)
L3KV_SAME(L3KV_OP_HELLO, PROTO_T_HELLO);
L3KV_SAME(L3KV_OP_ATTACH, PROTO_T_ATTACH);
L3KV_SAME(L3KV_OP_DETACH, PROTO_T_DETACH);
L3KV_SAME(L3KV_OP_STATS, PROTO_T_STATS);
L3KV_SAME(L3KV_OP_HEALTH, PROTO_T_HEALTH);
L3KV_SAME(L3KV_OP_PROBE, PROTO_T_PROBE);
L3KV_SAME(L3KV_OP_ADMIT, PROTO_T_ADMIT);
L3KV_SAME(L3KV_OP_RESTORE, PROTO_T_RESTORE);
L3KV_SAME(L3KV_OP_CANCEL, PROTO_T_CANCEL);
L3KV_SAME(L3KV_OP_RELEASE, PROTO_T_RELEASE);
L3KV_SAME(L3KV_OP_PUBLISH, PROTO_T_PUBLISH);
L3KV_SAME(L3KV_OP_SET_POLICY, PROTO_T_SET_POLICY);
L3KV_SAME(L3KV_LAYOUT_PAGE_FIRST, PROTO_LAYOUT_PAGE_FIRST);
L3KV_SAME(L3KV_LAYOUT_LAYER_FIRST, PROTO_LAYOUT_LAYER_FIRST);
L3KV_SAME(L3KV_LAYOUT_PAGE_FIRST_DIRECT, PROTO_LAYOUT_PAGE_FIRST_DIRECT);
L3KV_SAME(L3KV_LAYOUT_SLOTS, PROTO_LAYOUT_SLOTS);
L3KV_SAME(L3KV_ATTN_MLA, PROTO_ATTN_MLA);
L3KV_SAME(L3KV_ATTN_MHA, PROTO_ATTN_MHA);
L3KV_SAME(L3KV_ATTN_GQA, PROTO_ATTN_GQA);
L3KV_SAME(L3KV_POOL_KV, PROTO_POOL_KV);
L3KV_SAME(L3KV_POOL_STATE, PROTO_POOL_STATE);
L3KV_SAME(L3KV_POOL_SIDECAR, PROTO_POOL_SIDECAR);
L3KV_SAME(L3KV_HIT_ALL_PAGES, PROTO_HIT_ALL_PAGES);
L3KV_SAME(L3KV_HIT_TRAILING, PROTO_HIT_TRAILING);
L3KV_SAME(L3KV_PREFETCH_WAIT_COMPLETE, PROTO_PREFETCH_WAIT_COMPLETE);
L3KV_SAME(L3KV_PREFETCH_BEST_EFFORT, PROTO_PREFETCH_BEST_EFFORT);
L3KV_SAME(L3KV_PREFETCH_TIMEOUT, PROTO_PREFETCH_TIMEOUT);
L3KV_SAME(L3KV_WRITE_THROUGH, PROTO_WRITE_THROUGH);
L3KV_SAME(L3KV_WRITE_BACK, PROTO_WRITE_BACK);
L3KV_SAME(L3KV_WRITE_OFFLOAD, PROTO_WRITE_OFFLOAD);
L3KV_SAME(L3KV_MEM_MEMFD, PROTO_MEM_MEMFD);
L3KV_SAME(L3KV_MEM_CUDA_IPC, PROTO_MEM_CUDA_IPC);
L3KV_SAME(L3KV_MEM_CUMEM_FD, PROTO_MEM_CUMEM_FD);
L3KV_SAME(L3KV_CAP_HOST_COPY, PROTO_CAP_HOST_COPY);
L3KV_SAME(L3KV_CAP_CUDA_COPY, PROTO_CAP_CUDA_COPY);
L3KV_SAME(L3KV_CAP_NONBLOCK, PROTO_CAP_NONBLOCK);
L3KV_SAME(L3KV_NAME_LEN, PROTO_NAME_LEN);
L3KV_SAME(L3KV_NSNAME_LEN, PROTO_NSNAME_LEN);
L3KV_SAME(L3KV_ERRMSG_MAX, PROTO_ERRMSG_MAX);
L3KV_SAME(L3KV_POOLS_MAX, PROTO_POOLS_MAX);
L3KV_SAME(L3KV_REGIONS_MAX, PROTO_REGIONS_MAX);
L3KV_SAME(L3KV_FDS_MAX, PROTO_FDS_MAX);
L3KV_SAME(L3KV_LIVE_MAX, PROTO_LIVE_MAX);
L3KV_SAME(L3KV_HANDLE_LEN, sizeof(((struct proto_region *)0)->handle));
L3KV_SAME(L3KV_PROTOCOL_MIN, PROTO_VERSION_MIN);
L3KV_SAME(L3KV_PROTOCOL_MAX, PROTO_VERSION_MAX);
L3KV_SAME(L3KV_OP_DEBUG, PROTO_T_DEBUG);
L3KV_SAME(L3KV_HASH_LEN, PROTO_HASH_LEN);
L3KV_SAME(L3KV_SLOT_NONE, PROTO_SLOT_NONE);
L3KV_SAME(L3KV_PAGES_MAX, PROTO_PAGES_MAX);
L3KV_SAME(L3KV_DECLINE_NONE, PROTO_DECLINE_NONE);
L3KV_SAME(L3KV_DECLINE_NO_HIT, PROTO_DECLINE_NO_HIT);
L3KV_SAME(L3KV_DECLINE_NO_RESERVATION, PROTO_DECLINE_NO_RESERVATION);
L3KV_SAME(L3KV_DECLINE_GROUP_TIMEOUT, PROTO_DECLINE_GROUP_TIMEOUT);
L3KV_SAME(L3KV_DECLINE_GROUP_MISMATCH, PROTO_DECLINE_GROUP_MISMATCH);
L3KV_SAME(L3KV_DECLINE_SHUTTING_DOWN, PROTO_DECLINE_SHUTTING_DOWN);
L3KV_SAME(L3KV_DECLINE_RANK_LEFT, PROTO_DECLINE_RANK_LEFT);
L3KV_SAME(L3KV_DECLINE_NO_SLOT, PROTO_DECLINE_NO_SLOT);
L3KV_SAME(L3KV_DECLINE_SLOT_BUSY, PROTO_DECLINE_SLOT_BUSY);
L3KV_SAME(L3KV_DECLINE_SLOT_BUSY + 1, PROTO_DECLINE__MAX);
L3KV_SAME(L3KV_DEBUG_DROP, PROTO_DEBUG_DROP);
L3KV_SAME(L3KV_DEBUG_CORRUPT, PROTO_DEBUG_CORRUPT);
L3KV_SAME(sizeof(((struct l3kv_publish_page *)0)->hash), PROTO_HASH_LEN);

#define L3KV_HDR		sizeof(struct proto_hdr)
/* Small replies are read in batches; larger payloads go straight to their buffer. */
#define L3KV_RBUF		16384
#define L3KV_IOV_MAX		8
#define L3KV_FLUSH_IOV		64	/* queued frames sent by one sendmsg */

struct l3kv_req {
	uint64_t		 seq;
	uint16_t		 type;
	uint16_t		 proto_status;
	int			 flags;
#define L3KV_REQ_F_WAITED	0x01	/* a blocking call takes it: never on `done` */
#define L3KV_REQ_F_ORPHAN	0x02	/* its blocking call gave up: drop the reply */
#define L3KV_REQ_F_DONE		0x04
	int			 status;	/* 0 or -errno, once done */
	char			*payload;	/* reply payload or error text, NUL-terminated */
	uint32_t		 len;
	int64_t			 t0_us;		/* submitted (CLOCK_MONOTONIC) */
	uint32_t		 frame_len;	/* the request's frame: RESTORE's size proxy */
	/* While on sendq: the unsent rest of the frame. */
	uint8_t			*out;
	size_t			 out_len;
	size_t			 out_off;
	int			 fds[PROTO_FDS_MAX];	/* dups, until the first byte is sent */
	int			 nfds;
	TAILQ_ENTRY(l3kv_req)	 entry;		/* on pending or done */
	TAILQ_ENTRY(l3kv_req)	 send_entry;	/* on sendq */
};
TAILQ_HEAD(l3kv_req_list, l3kv_req);

/* One connection; one thread at a time (see l3kv.h). */
struct l3kv {
	int			 sock;		/* -1 once broken */
	int			 cause;		/* -errno that broke it, 0 while whole */
	int			 epfd;		/* l3kv_fd() */
	int			 evfd;		/* readable while done is not empty or broken */
	int			 signalled;	/* evfd holds a count */
	int			 epoll_out;	/* the socket is watched for EPOLLOUT */
	int			 corked;	/* submits queue on sendq until l3kv_uncork() */
	int			 rshort;	/* l3kv_read() stopped at a short read */
	int			 emptied;	/* this drain of completions emptied the socket */
	int			 timeout_ms;
	unsigned		 spin_us;	/* l3kv_set_spin, or L3KV_SPIN_AUTO */
	double			 restore_ns_per_byte;	/* auto spin: RESTOREs' wait per frame byte */
	int			 device;	/* l3kv_set_device: ATTACH's claim, or -1 */
	uint16_t		 kv_pool;	/* PROBE's pool: the first kv pool at ATTACH */
	uint64_t		 next_seq;
	struct l3kv_server_info	 info;
	struct l3kv_req_list	 pending;
	struct l3kv_req_list	 done;
	struct l3kv_req_list	 sendq;
	/* The reply being read: its header, then its payload. */
	struct proto_hdr	 rhdr;
	size_t			 rhdr_len;
	struct l3kv_req		*rreq;		/* whose reply it is; NULL for ERROR */
	char			*rpay;
	uint32_t		 rpay_len;
	int			 last_status;
	char			 last_error[L3KV_ERRMSG_MAX + 1];
	size_t			 rbuf_off;
	size_t			 rbuf_len;
	uint8_t			 rbuf[L3KV_RBUF];
};

static void	l3kv_break(struct l3kv *, int, unsigned, const char *);
static int	l3kv_read(struct l3kv *);
static void	l3kv_update(struct l3kv *);

__attribute__((format(printf, 2, 3)))
static void
l3kv_seterr(struct l3kv *k, const char *fmt, ...)
{
	va_list	ap;

	va_start(ap, fmt);
	vsnprintf(k->last_error, sizeof(k->last_error), fmt, ap);
	va_end(ap);
}

static void
l3kv_clear_last(struct l3kv *k)
{
	k->last_status = 0;
	k->last_error[0] = '\0';
}

/* Milliseconds on the monotonic clock. */
static int64_t
l3kv_now_ms(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t
l3kv_now_us(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The deadline of a timeout, or -1 for none. */
static int64_t
l3kv_deadline(const struct l3kv *k, int timeout_ms)
{
	if (timeout_ms == L3KV_TIMEOUT_DEFAULT)
		timeout_ms = k != NULL ? k->timeout_ms : L3KV_DEFAULT_TIMEOUT_MS;
	if (timeout_ms < 0)
		return -1;
	return l3kv_now_ms() + timeout_ms;
}

/* What is left until a deadline, as poll() wants it. */
static int
l3kv_remaining(int64_t deadline)
{
	int64_t	left;

	if (deadline < 0)
		return -1;
	left = deadline - l3kv_now_ms();
	return left <= 0 ? 0 : left > 0x7fffffff ? 0x7fffffff : (int)left;
}

static void
l3kv_req_close_fds(struct l3kv_req *r)
{
	while (r->nfds > 0)
		close(r->fds[--r->nfds]);
}

static void
l3kv_req_free(struct l3kv_req *r)
{
	if (r == NULL)
		return;
	l3kv_req_close_fds(r);
	free(r->out);
	free(r->payload);
	free(r);
}

/* Takes r off sendq, dropping what it has not sent: the rest of its frame, its fds. */
static void
l3kv_req_unqueue(struct l3kv *k, struct l3kv_req *r)
{
	TAILQ_REMOVE(&k->sendq, r, send_entry);
	l3kv_req_close_fds(r);
	free(r->out);
	r->out = NULL;
}

/* Copies text into a new NUL-terminated string, or NULL (also when empty). */
static char *
l3kv_text(const char *s, size_t len)
{
	char	*p;

	if (len == 0 || (p = malloc(len + 1)) == NULL)
		return NULL;
	memcpy(p, s, len);
	p[len] = '\0';
	return p;
}

/*
 * Finishes a request: takes payload (NULL or NUL-terminated, len bytes).
 * Orphans are freed; requests nobody waits for join `done`.
 */
static void
l3kv_complete(struct l3kv *k, struct l3kv_req *r, int status, unsigned proto_status,
    char *payload, uint32_t len)
{
	int	cut = 0;

	TAILQ_REMOVE(&k->pending, r, entry);
	if (r->out != NULL) {
		/*
		 * Answered before it was all sent: a framing error, which the
		 * daemon answers from the header and then closes. Sending the
		 * rest would be pointless, and half a frame desynchronises
		 * every frame queued behind it.
		 */
		cut = r->out_off > 0;
		l3kv_req_unqueue(k, r);
	}
	if (r->flags & L3KV_REQ_F_ORPHAN) {
		free(payload);
		l3kv_req_free(r);
	} else {
		r->status = status;
		r->proto_status = (uint16_t)proto_status;
		r->payload = payload;
		r->len = payload != NULL ? len : 0;
		r->flags |= L3KV_REQ_F_DONE;
		if (!(r->flags & L3KV_REQ_F_WAITED))
			TAILQ_INSERT_TAIL(&k->done, r, entry);
	}
	if (cut)
		l3kv_break(k, -ECONNRESET, 0, "libl3kv: a request was answered while half sent");
}

/*
 * Breaks the connection: closes the socket and completes every pending
 * request with err and the text msg (and proto_status, when a daemon's
 * ERROR was the cause). Later calls fail with -ENOTCONN.
 */
static void
l3kv_break(struct l3kv *k, int err, unsigned proto_status, const char *msg)
{
	size_t		 len = msg != NULL ? strlen(msg) : 0;
	struct l3kv_req	*r;

	if (k->sock < 0)
		return;
	close(k->sock);		/* also leaves the epoll set */
	k->sock = -1;
	k->cause = err;
	k->epoll_out = 0;
	while ((r = TAILQ_FIRST(&k->sendq)) != NULL)
		l3kv_req_unqueue(k, r);
	free(k->rpay);
	k->rpay = NULL;
	k->rreq = NULL;
	k->rhdr_len = 0;
	k->rbuf_off = k->rbuf_len = 0;
	while ((r = TAILQ_FIRST(&k->pending)) != NULL)
		l3kv_complete(k, r, err, proto_status, l3kv_text(msg, len), (uint32_t)len);
	l3kv_update(k);
}

/*
 * Breaks the connection for a reply that cannot be parsed. The text is
 * the last error too: a reply found bad only once its call has its
 * payload (a PROBE's stop points, an ATTACH's namespace) completes no
 * request that would carry it there.
 */
__attribute__((format(printf, 2, 3)))
static int
l3kv_bad_reply(struct l3kv *k, const char *fmt, ...)
{
	char	msg[L3KV_ERRMSG_MAX + 1];
	va_list	ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	l3kv_seterr(k, "%s", msg);
	l3kv_break(k, -EPROTO, 0, msg);
	return -EPROTO;
}

/*
 * Brings the epoll fd in line with the queues: the eventfd readable while
 * completions wait (or the connection is broken), the socket watched for
 * writing while output waits.
 */
static void
l3kv_update(struct l3kv *k)
{
	struct epoll_event	ev;
	uint64_t		one = 1, n;
	int			want;

	want = !TAILQ_EMPTY(&k->done) || k->sock < 0;
	if (want && !k->signalled) {
		if (write(k->evfd, &one, sizeof(one)) == sizeof(one))
			k->signalled = 1;
	} else if (!want && k->signalled) {
		if (read(k->evfd, &n, sizeof(n)) == sizeof(n) || errno == EAGAIN)
			k->signalled = 0;
	}
	want = k->sock >= 0 && !TAILQ_EMPTY(&k->sendq) && !k->corked;
	if (want != k->epoll_out) {
		memset(&ev, 0, sizeof(ev));
		ev.events = EPOLLIN | (want ? EPOLLOUT : 0);
		ev.data.fd = k->sock;
		if (epoll_ctl(k->epfd, EPOLL_CTL_MOD, k->sock, &ev) == 0)
			k->epoll_out = want;
	}
}

static struct l3kv_req *
l3kv_find(struct l3kv *k, uint64_t seq)
{
	struct l3kv_req	*r;

	TAILQ_FOREACH(r, &k->pending, entry)
		if (r->seq == seq)
			return r;
	return NULL;
}

/*
 * Whether a successful reply's payload length suits its type: so that
 * the decoders, and a caller's *_result(), can trust it. JSON replies
 * have any length; PROBE's carries stop points (u32) after its 8 bytes.
 */
static int
l3kv_reply_size_ok(unsigned type, uint32_t len)
{
	switch (type) {
	case PROTO_T_HELLO:
		return len == sizeof(struct proto_hello_reply);
	case PROTO_T_ATTACH:
		return len == sizeof(struct proto_attach_reply);
	case PROTO_T_PROBE:
		return len >= sizeof(struct proto_probe_reply) &&
		    (len - sizeof(struct proto_probe_reply)) % sizeof(uint32_t) == 0;
	case PROTO_T_ADMIT:
		return len == sizeof(struct proto_admit_reply);
	case PROTO_T_RESTORE:
		return len == sizeof(struct proto_restore_reply);
	case PROTO_T_CANCEL:
		return len == sizeof(struct proto_cancel_reply);
	case PROTO_T_PUBLISH:
		return len == sizeof(struct proto_publish_reply);
	case PROTO_T_DETACH:
	case PROTO_T_RELEASE:
	case PROTO_T_DEBUG:
		return len == 0;
	}
	return 1;
}

/*
 * Checks a reply header before anything is allocated for its payload;
 * on failure the connection is broken.
 */
static int
l3kv_reply_hdr(struct l3kv *k)
{
	const struct proto_hdr	*h = &k->rhdr;

	if (h->magic != PROTO_MAGIC)
		return l3kv_bad_reply(k, "libl3kv: reply with bad magic 0x%08x", h->magic);
	if (h->version != PROTO_VERSION)
		return l3kv_bad_reply(k, "libl3kv: reply in protocol version %u", h->version);
	if (h->length > PROTO_FRAME_MAX)
		return l3kv_bad_reply(k, "libl3kv: reply of %u bytes is over the protocol's %u",
		    h->length, PROTO_FRAME_MAX);
	/* v1 replies carry no fds; recv() lets the kernel drop any sent anyway. */
	if (h->flags != PROTO_F_REPLY)
		return l3kv_bad_reply(k, "libl3kv: reply with flags 0x%x", h->flags);
	k->rreq = NULL;
	if (h->type == PROTO_T_ERROR) {
		if (h->status == PROTO_S_OK)
			return l3kv_bad_reply(k, "libl3kv: ERROR reply with status ok");
		return 0;
	}
	if ((k->rreq = l3kv_find(k, h->seq)) == NULL)
		return l3kv_bad_reply(k, "libl3kv: %s reply to seq %llu, which is not in flight",
		    proto_type_name(h->type), (unsigned long long)h->seq);
	if (k->rreq->type != h->type)
		return l3kv_bad_reply(k, "libl3kv: %s reply to seq %llu, a %s request",
		    proto_type_name(h->type), (unsigned long long)h->seq,
		    proto_type_name(k->rreq->type));
	if (h->status == PROTO_S_OK && !l3kv_reply_size_ok(h->type, h->length))
		return l3kv_bad_reply(k, "libl3kv: %s reply of %u bytes", proto_type_name(h->type),
		    h->length);
	return 0;
}

/* Acts on a whole reply, whose payload (NUL-terminated) is k->rpay. */
static void
l3kv_reply(struct l3kv *k)
{
	struct l3kv_req	*r = k->rreq;
	char		*pay = k->rpay;
	uint32_t	 len = k->rhdr.length;
	unsigned	 status = k->rhdr.status;

	k->rpay = NULL;
	k->rreq = NULL;
	k->rhdr_len = 0;
	k->rpay_len = 0;
	if (status != PROTO_S_OK && len > L3KV_ERRMSG_MAX) {
		/* Error texts are short; a longer one is cut, not refused. */
		len = L3KV_ERRMSG_MAX;
		pay[len] = '\0';
	}
	if (k->rhdr.type == PROTO_T_ERROR) {
		/*
		 * The daemon could not parse a frame of ours, or refused us
		 * before HELLO, and closes the connection: every request in
		 * flight fails with its reason, as does the call that saw it.
		 */
		k->last_status = (int)status;
		snprintf(k->last_error, sizeof(k->last_error), "%s", pay != NULL ? pay : "");
		l3kv_break(k, proto_status_errno(status), status, pay);
		free(pay);
		return;
	}
	l3kv_complete(k, r, proto_status_errno(status), status, pay, len);
}

/*
 * Takes what the read buffer holds of the current reply; a reply that
 * is whole is acted on. Returns 0, or -errno with the connection broken.
 */
static int
l3kv_consume(struct l3kv *k)
{
	size_t	avail = k->rbuf_len - k->rbuf_off, n;
	int	rc;

	if (k->rhdr_len < L3KV_HDR) {
		n = L3KV_HDR - k->rhdr_len;
		if (n > avail)
			n = avail;
		memcpy((uint8_t *)&k->rhdr + k->rhdr_len, k->rbuf + k->rbuf_off, n);
		k->rhdr_len += n;
		k->rbuf_off += n;
		avail -= n;
		if (k->rhdr_len < L3KV_HDR)
			return 0;
		if ((rc = l3kv_reply_hdr(k)) != 0)
			return rc;
		/* One spare byte for the NUL that makes JSON and error texts C strings. */
		if (k->rhdr.length > 0 && (k->rpay = malloc((size_t)k->rhdr.length + 1)) == NULL) {
			l3kv_break(k, -ENOMEM, 0, "libl3kv: out of memory for a reply");
			return -ENOMEM;
		}
		k->rpay_len = 0;
	}
	n = k->rhdr.length - k->rpay_len;
	if (n > avail)
		n = avail;
	if (n > 0) {
		memcpy(k->rpay + k->rpay_len, k->rbuf + k->rbuf_off, n);
		k->rpay_len += (uint32_t)n;
		k->rbuf_off += n;
	}
	if (k->rpay_len < k->rhdr.length)
		return 0;
	if (k->rpay != NULL)
		k->rpay[k->rhdr.length] = '\0';
	l3kv_reply(k);
	return 0;
}

/* A peer that is gone, as send() and recv() report it. */
static int
l3kv_errno_is_hangup(int err)
{
	return err == -EPIPE || err == -ECONNRESET || err == -ENOTCONN;
}

/* Breaks the connection after a failed recv or send (err 0: EOF). */
static int
l3kv_io_error(struct l3kv *k, int err, const char *what)
{
	char	msg[L3KV_ERRMSG_MAX + 1];

	if (err == 0 || l3kv_errno_is_hangup(err)) {
		snprintf(msg, sizeof(msg), "libl3kv: the daemon closed the connection%s",
		    k->rhdr_len > 0 ? " inside a reply" : "");
		err = -ECONNRESET;
	} else {
		snprintf(msg, sizeof(msg), "libl3kv: %s: %s", what, strerror(-err));
	}
	l3kv_break(k, err, 0, msg);
	return err;
}

/*
 * Reads every reply the socket has now, without blocking. A read that
 * comes up short emptied the socket, so it is the last (k->rshort): the
 * bytes that come later make the socket, and l3kv_fd(), readable again.
 * Returns 0, or what broke the connection (its requests are then
 * completed).
 */
static int
l3kv_read(struct l3kv *k)
{
	ssize_t	n;
	size_t	want;
	int	rc;

	k->rshort = 0;
	for (;;) {
		while (k->sock >= 0 && k->rbuf_off < k->rbuf_len)
			if ((rc = l3kv_consume(k)) != 0)
				return rc;
		if (k->sock < 0)
			return k->cause;
		if (k->rshort)
			return 0;
		k->rbuf_off = k->rbuf_len = 0;
		/* A large payload is read in place rather than through the buffer. */
		want = k->rhdr_len == L3KV_HDR ? k->rhdr.length - k->rpay_len : 0;
		if (want >= L3KV_RBUF / 2)
			n = recv(k->sock, k->rpay + k->rpay_len, want, MSG_DONTWAIT);
		else
			n = recv(k->sock, k->rbuf, sizeof(k->rbuf), MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0)
			return l3kv_io_error(k, n == 0 ? 0 : -errno, "recv");
		k->rshort = (size_t)n < (want >= L3KV_RBUF / 2 ? want : sizeof(k->rbuf));
		if (want < L3KV_RBUF / 2) {
			k->rbuf_len = (size_t)n;
			continue;
		}
		k->rpay_len += (uint32_t)n;
		if (k->rpay_len == k->rhdr.length) {
			k->rpay[k->rhdr.length] = '\0';
			l3kv_reply(k);
		}
	}
}

/*
 * One sendmsg, fds riding on its first byte. MSG_NOSIGNAL: a daemon that
 * went away must be an error, never a SIGPIPE in the engine.
 */
static ssize_t
l3kv_sendmsg(int sock, struct iovec *iov, int iovcnt, const int *fds, int nfds)
{
	union {
		struct cmsghdr	hdr;
		char		buf[CMSG_SPACE(sizeof(int) * PROTO_FDS_MAX)];
	} cbuf;
	struct msghdr	 msg;
	struct cmsghdr	*cm;
	ssize_t		 n;

	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = iov;
	msg.msg_iovlen = (size_t)iovcnt;
	if (nfds > 0) {
		memset(&cbuf, 0, sizeof(cbuf));
		msg.msg_control = cbuf.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

/*
 * The socket refused bytes for good. Replies the daemon sent before it
 * closed say why, so they are read first; then the connection breaks.
 */
static int
l3kv_send_failed(struct l3kv *k, int err)
{
	int	rc;

	if ((rc = l3kv_read(k)) != 0)
		return rc;
	return l3kv_io_error(k, err, "send");
}

/*
 * Sends what waits on sendq: consecutive frames in one sendmsg, except
 * that a frame with fds starts a sendmsg of its own, so that fds always
 * go with their own frame's first byte. Returns 0 (also when the socket
 * is full) or -errno with the connection broken.
 */
static int
l3kv_flush(struct l3kv *k)
{
	struct l3kv_req	*r, *first;
	struct iovec	 iov[L3KV_FLUSH_IOV];
	ssize_t		 n;
	size_t		 take;
	int		 niov;

	while (k->sock >= 0 && (first = TAILQ_FIRST(&k->sendq)) != NULL) {
		niov = 0;
		for (r = first; r != NULL && niov < L3KV_FLUSH_IOV; r = TAILQ_NEXT(r, send_entry)) {
			if (r != first && r->nfds > 0)
				break;
			iov[niov].iov_base = r->out + r->out_off;
			iov[niov++].iov_len = r->out_len - r->out_off;
		}
		n = l3kv_sendmsg(k->sock, iov, niov, first->fds, first->out_off == 0 ? first->nfds : 0);
		if (n == -EAGAIN || n == -EWOULDBLOCK)
			return 0;
		if (n < 0)
			return l3kv_send_failed(k, (int)n);
		while (n > 0) {
			r = TAILQ_FIRST(&k->sendq);
			take = r->out_len - r->out_off < (size_t)n ? r->out_len - r->out_off : (size_t)n;
			r->out_off += take;
			n -= (ssize_t)take;
			l3kv_req_close_fds(r);	/* they went with the first byte */
			if (r->out_off < r->out_len)
				return 0;
			l3kv_req_unqueue(k, r);
		}
	}
	return k->sock >= 0 ? 0 : k->cause;
}

/* Copies the frame from byte `skip` on into r->out, for sendq. */
static int
l3kv_req_keep(struct l3kv_req *r, const struct iovec *iov, int iovcnt, size_t total, size_t skip)
{
	size_t	off = 0, n;
	int	i;

	if ((r->out = malloc(total - skip)) == NULL)
		return -ENOMEM;
	for (i = 0; i < iovcnt; i++) {
		n = iov[i].iov_len;
		if (skip >= n) {
			skip -= n;
			continue;
		}
		memcpy(r->out + off, (const uint8_t *)iov[i].iov_base + skip, n - skip);
		off += n - skip;
		skip = 0;
	}
	r->out_len = off;
	r->out_off = 0;
	return 0;
}

/*
 * The one way a request leaves: frames it as type with the payload in
 * iov and the fds (borrowed), sends what the socket takes now and queues
 * the rest. Returns 0 with *out a new request on `pending` (the ticket is
 * its seq), or -errno with no request made.
 */
static int
l3kv_submit(struct l3kv *k, unsigned type, const struct iovec *payload, int npayload,
    const int *fds, int nfds, int flags, struct l3kv_req **out)
{
	struct iovec		 iov[L3KV_IOV_MAX];
	struct proto_hdr	 h;
	struct l3kv_req		*r;
	uint64_t		 len = 0;
	ssize_t			 n = -EAGAIN;
	int			 i, niov = 1, rc;

	*out = NULL;
	if (k->sock < 0) {
		l3kv_seterr(k, "libl3kv: the connection broke earlier: %s", l3kv_strerror(k->cause));
		return -ENOTCONN;
	}
	if (npayload + 1 > L3KV_IOV_MAX || nfds > PROTO_FDS_MAX)
		return -EINVAL;
	iov[0].iov_base = &h;
	iov[0].iov_len = sizeof(h);
	for (i = 0; i < npayload; i++) {
		if (payload[i].iov_len == 0)
			continue;
		iov[niov++] = payload[i];
		len += payload[i].iov_len;
	}
	/* The daemon answers too_big and closes; better refused here, connection kept. */
	if (len > (k->info.max_frame != 0 ? k->info.max_frame : PROTO_FRAME_MAX)) {
		l3kv_seterr(k, "libl3kv: %s of %llu bytes is over the daemon's max_frame %u",
		    proto_type_name(type), (unsigned long long)len, k->info.max_frame);
		return -EMSGSIZE;
	}
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return -ENOMEM;
	r->seq = k->next_seq++;
	r->type = (uint16_t)type;
	r->flags = flags;
	r->t0_us = l3kv_now_us();
	r->frame_len = (uint32_t)(len + sizeof(h));
	proto_hdr_init(&h, type, (uint32_t)len, r->seq);
	if (nfds > 0)
		h.flags |= PROTO_F_FDS;
	len += sizeof(h);

	/*
	 * Behind a queued frame, this one waits its turn, to keep the stream
	 * in order; corked, it waits for l3kv_uncork().
	 */
	if (TAILQ_EMPTY(&k->sendq) && !k->corked)
		n = l3kv_sendmsg(k->sock, iov, niov, fds, nfds);
	if (n == (ssize_t)len) {
		TAILQ_INSERT_TAIL(&k->pending, r, entry);
		*out = r;
		return 0;
	}
	if (n < 0 && n != -EAGAIN && n != -EWOULDBLOCK) {
		l3kv_req_free(r);
		if (l3kv_errno_is_hangup((int)n))
			return l3kv_send_failed(k, (int)n);
		/* Nothing was sent (a bad fd, say): the stream is intact. */
		l3kv_seterr(k, "libl3kv: send %s: %s", proto_type_name(type), strerror((int)-n));
		return (int)n;
	}
	if ((rc = l3kv_req_keep(r, iov, niov, (size_t)len, n > 0 ? (size_t)n : 0)) != 0)
		goto fail;
	if (n <= 0) {
		/* Nothing went: the fds must outlive the caller's copies until they do. */
		for (i = 0; i < nfds; i++) {
			if ((r->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0)) < 0) {
				rc = -errno;
				goto fail;
			}
			r->nfds = i + 1;
		}
	}
	TAILQ_INSERT_TAIL(&k->pending, r, entry);
	TAILQ_INSERT_TAIL(&k->sendq, r, send_entry);
	*out = r;
	return 0;

fail:
	l3kv_req_free(r);
	/* With part of the frame on the wire, the stream can no longer be framed. */
	if (n > 0)
		l3kv_break(k, -ECONNRESET, 0, "libl3kv: out of memory in the middle of a frame");
	return rc;
}

/*
 * Waits until r is done or the deadline passes. On a timeout r is
 * orphaned (its late reply will be dropped) and -ETIMEDOUT returned;
 * otherwise 0, and r's status is the caller's to read.
 */
static int
l3kv_wait(struct l3kv *k, struct l3kv_req *r, int64_t deadline)
{
	struct pollfd	pfd;
	struct timespec	ts;
	int64_t		now = l3kv_now_us(), sleep_end = 0, spin_end = 0, expect = 0, us;
	int		left;

	if (k->spin_us == L3KV_SPIN_AUTO) {
		/*
		 * Sleep until shortly before the reply is due, then spin
		 * through it: a RESTORE is due after as long per frame byte as
		 * the last ones took (a frame's length grows with its pages);
		 * anything else, or the first RESTORE, is due at once.
		 */
		if (r->type == PROTO_T_RESTORE && k->restore_ns_per_byte > 0)
			expect = (int64_t)(k->restore_ns_per_byte * r->frame_len / 1000);
		sleep_end = r->t0_us + expect - L3KV_SPIN_AUTO_US;
		spin_end = (sleep_end > now ? sleep_end : now) + 2 * L3KV_SPIN_AUTO_US;
	} else if (k->spin_us > 0)
		spin_end = now + k->spin_us;
	for (;;) {
		/* A broken connection completes every request: r is done then. */
		if (l3kv_flush(k) == 0)
			l3kv_read(k);
		if (r->flags & L3KV_REQ_F_DONE) {
			if (r->type == PROTO_T_RESTORE && r->status == 0 && r->frame_len > 0) {
				us = l3kv_now_us() - r->t0_us;
				k->restore_ns_per_byte = k->restore_ns_per_byte <= 0 ?
				    (double)us * 1000 / r->frame_len :
				    0.75 * k->restore_ns_per_byte + 0.25 * us * 1000 / r->frame_len;
			}
			return 0;
		}
		if (k->sock < 0)
			return -ENOTCONN;
		if ((left = l3kv_remaining(deadline)) == 0) {
			r->flags |= L3KV_REQ_F_ORPHAN;
			l3kv_seterr(k, "libl3kv: no reply to %s within the timeout",
			    proto_type_name(r->type));
			return -ETIMEDOUT;
		}
		pfd.fd = k->sock;
		pfd.events = POLLIN | (TAILQ_EMPTY(&k->sendq) ? 0 : POLLOUT);
		pfd.revents = 0;
		now = l3kv_now_us();
		us = -1;				/* sleep until the deadline */
		if (now < sleep_end)
			us = sleep_end - now;		/* until the spin starts */
		else if (now < spin_end)
			us = 0;				/* spin: look again at once */
		if (us >= 0 && (left < 0 || us < (int64_t)left * 1000)) {
			ts.tv_sec = us / 1000000;
			ts.tv_nsec = (us % 1000000) * 1000;
		} else {
			ts.tv_sec = left / 1000;
			ts.tv_nsec = (left % 1000) * 1000000L;
		}
		if (ppoll(&pfd, 1, us < 0 && left < 0 ? NULL : &ts, NULL) < 0 && errno != EINTR) {
			left = -errno;
			r->flags |= L3KV_REQ_F_ORPHAN;
			l3kv_seterr(k, "libl3kv: poll: %s", strerror(-left));
			return left;
		}
	}
}

/*
 * A blocking call: submits, waits until the deadline, and hands back the
 * reply's payload (the caller's to free; NULL when empty). Sets the
 * connection's last status and error text.
 */
static int
l3kv_call(struct l3kv *k, unsigned type, const struct iovec *payload, int npayload,
    const int *fds, int nfds, int64_t deadline, char **reply, uint32_t *reply_len)
{
	struct l3kv_req	*r;
	int		 rc;

	*reply = NULL;
	*reply_len = 0;
	l3kv_clear_last(k);
	rc = l3kv_submit(k, type, payload, npayload, fds, nfds, L3KV_REQ_F_WAITED, &r);
	if (rc == 0)
		rc = l3kv_wait(k, r, deadline);
	l3kv_update(k);
	if (rc != 0)
		return rc;
	rc = r->status;
	k->last_status = r->proto_status;
	if (rc != 0) {
		snprintf(k->last_error, sizeof(k->last_error), "%s", r->payload ? r->payload : "");
	} else {
		*reply = r->payload;
		*reply_len = r->len;
		r->payload = NULL;
	}
	l3kv_req_free(r);
	return rc;
}

/* Copies a C string into a fixed NUL-padded wire field. */
static int
l3kv_put_string(struct l3kv *k, char *dst, size_t cap, const char *src, const char *field)
{
	size_t	n = src != NULL ? strlen(src) : 0;

	if (n >= cap) {
		l3kv_seterr(k, "libl3kv: %s: %zu bytes is longer than the wire's %zu", field, n,
		    cap - 1);
		return -EINVAL;
	}
	memset(dst, 0, cap);
	if (n > 0)
		memcpy(dst, src, n);
	return 0;
}

/* Checks that a value fits its wire field. */
static int
l3kv_fits(struct l3kv *k, uint64_t v, uint64_t max, const char *field)
{
	if (v <= max)
		return 0;
	l3kv_seterr(k, "libl3kv: %s: %llu does not fit the wire's %llu", field,
	    (unsigned long long)v, (unsigned long long)max);
	return -EINVAL;
}

#define L3KV_PUT(dst, v, field) do {						\
	if ((rc = l3kv_fits(k, (v), (__typeof__(dst))~0ULL, (field))) != 0)	\
		return rc;							\
	(dst) = (__typeof__(dst))(v);						\
} while (0)

static int
l3kv_encode_layout(struct l3kv *k, const struct l3kv_layout *l, unsigned npools,
    struct proto_layout *w)
{
	int	rc;

	if ((rc = l3kv_put_string(k, w->model, sizeof(w->model), l->model, "layout.model")) != 0 ||
	    (rc = l3kv_put_string(k, w->kv_dtype, sizeof(w->kv_dtype), l->kv_dtype,
	    "layout.kv_dtype")) != 0 ||
	    (rc = l3kv_put_string(k, w->hash_scheme, sizeof(w->hash_scheme), l->hash_scheme,
	    "layout.hash_scheme")) != 0)
		return rc;
	L3KV_PUT(w->hash_len, l->hash_len, "layout.hash_len");
	L3KV_PUT(w->tp_size, l->tp_size, "layout.tp_size");
	L3KV_PUT(w->dcp_size, l->dcp_size, "layout.dcp_size");
	L3KV_PUT(w->pp_size, l->pp_size, "layout.pp_size");
	L3KV_PUT(w->cp_size, l->cp_size, "layout.cp_size");
	L3KV_PUT(w->dcp_rank, l->dcp_rank, "layout.dcp_rank");
	L3KV_PUT(w->pp_rank, l->pp_rank, "layout.pp_rank");
	L3KV_PUT(w->host_layout, (unsigned)l->host_layout, "layout.host_layout");
	L3KV_PUT(w->attention, (unsigned)l->attention, "layout.attention");
	L3KV_PUT(w->npools, npools, "npools");
	w->page_tokens = l->page_tokens;
	w->logical_page_tokens = l->logical_page_tokens;
	w->seed = l->seed;
	return 0;
}

static int
l3kv_encode_pool(struct l3kv *k, const struct l3kv_pool *p, unsigned i, struct proto_pool *w)
{
	char	field[32];
	int	rc;

	snprintf(field, sizeof(field), "pools[%u].name", i);
	if ((rc = l3kv_put_string(k, w->name, sizeof(w->name), p->name, field)) != 0)
		return rc;
	snprintf(field, sizeof(field), "pools[%u].schema", i);
	if ((rc = l3kv_put_string(k, w->schema, sizeof(w->schema), p->schema, field)) != 0)
		return rc;
	snprintf(field, sizeof(field), "pools[%u].kind", i);
	L3KV_PUT(w->kind, (unsigned)p->kind, field);
	snprintf(field, sizeof(field), "pools[%u].hit_policy", i);
	L3KV_PUT(w->hit_policy, (unsigned)p->hit_policy, field);
	snprintf(field, sizeof(field), "pools[%u].trailing", i);
	L3KV_PUT(w->trailing, p->trailing, field);
	w->layers = p->layers;
	w->object_bytes = p->object_bytes;
	return 0;
}

/*
 * Encodes one region; memfd and cuMem regions get the index of their fd
 * in fds[], each distinct fd sent once.
 */
static int
l3kv_encode_region(struct l3kv *k, const struct l3kv_region *g, unsigned i,
    struct proto_region *w, int *fds, int *nfds)
{
	char	field[32];
	int	rc, j;

	memset(w, 0, sizeof(*w));
	snprintf(field, sizeof(field), "regions[%u].pool", i);
	L3KV_PUT(w->pool, g->pool, field);
	snprintf(field, sizeof(field), "regions[%u].kind", i);
	L3KV_PUT(w->kind, (unsigned)g->kind, field);
	snprintf(field, sizeof(field), "regions[%u].layout", i);
	L3KV_PUT(w->layout, (unsigned)g->layout, field);
	if (g->kind == L3KV_MEM_MEMFD || g->kind == L3KV_MEM_CUMEM_FD) {
		if (g->fd < 0) {
			l3kv_seterr(k, "libl3kv: regions[%u].fd: %d is not an fd", i, g->fd);
			return -EBADF;
		}
		for (j = 0; j < *nfds && fds[j] != g->fd; j++)
			;
		if (j == *nfds) {
			if (*nfds == PROTO_FDS_MAX) {
				l3kv_seterr(k, "libl3kv: regions[%u].fd: more than %d distinct fds", i,
				    PROTO_FDS_MAX);
				return -EINVAL;
			}
			fds[(*nfds)++] = g->fd;
		}
		w->fd_index = (uint16_t)j;
	} else if (g->kind == L3KV_MEM_CUDA_IPC || g->kind == L3KV_MEM_CUDA_EVENT) {
		memcpy(w->handle, g->handle, sizeof(w->handle));
	}
	/* GPU memory's device claim, l3kv_set_device's: 0 on the wire is none. */
	if ((g->kind == L3KV_MEM_CUDA_IPC || g->kind == L3KV_MEM_CUMEM_FD) && k->device >= 0)
		w->device = (uint16_t)(k->device + 1);
	w->offset = g->offset;
	w->size = g->size;
	w->num_pages = g->num_pages;
	w->page_tokens = g->page_tokens;
	w->layers = g->layers;
	w->token_bytes = g->token_bytes;
	w->page_stride = g->page_stride;
	w->layer_stride = g->layer_stride;
	w->token_stride = g->token_stride;
	return 0;
}

/*
 * Builds the ATTACH payload in the caller's buffers. Only what cannot be
 * put on the wire is refused here; the daemon validates every field, so
 * that there is one validator and one set of error texts.
 */
static int
l3kv_encode_attach(struct l3kv *k, const struct l3kv_attach_args *a, struct proto_attach *w,
    struct proto_pool *pools, struct proto_region *regions, int *fds, int *nfds)
{
	unsigned	i;
	int		rc;

	if (a->npools > PROTO_POOLS_MAX || (a->npools > 0 && a->pools == NULL)) {
		l3kv_seterr(k, "libl3kv: npools: %u pools (at most %u, pools not NULL)", a->npools,
		    PROTO_POOLS_MAX);
		return -EINVAL;
	}
	if (a->nregions > PROTO_REGIONS_MAX || (a->nregions > 0 && a->regions == NULL)) {
		l3kv_seterr(k, "libl3kv: nregions: %u regions (at most %u, regions not NULL)",
		    a->nregions, PROTO_REGIONS_MAX);
		return -EINVAL;
	}
	if (a->nlive > PROTO_LIVE_MAX || (a->nlive > 0 && a->live_slots == NULL)) {
		l3kv_seterr(k, "libl3kv: nlive: %u live slots (at most %u, live_slots not NULL)",
		    a->nlive, PROTO_LIVE_MAX);
		return -EINVAL;
	}
	memset(w, 0, sizeof(*w));
	if ((rc = l3kv_encode_layout(k, &a->layout, a->npools, &w->layout)) != 0)
		return rc;
	if ((rc = l3kv_put_string(k, w->group, sizeof(w->group), a->group, "group")) != 0)
		return rc;
	L3KV_PUT(w->group_size, a->group_size, "group_size");
	L3KV_PUT(w->group_rank, a->group_rank, "group_rank");
	L3KV_PUT(w->tp_rank, a->tp_rank, "tp_rank");
	L3KV_PUT(w->prefetch, (unsigned)a->prefetch, "prefetch");
	L3KV_PUT(w->write, (unsigned)a->write, "write");
	w->prefetch_timeout_ms = a->prefetch_timeout_ms;
	w->nregions = (uint16_t)a->nregions;
	w->nlive = a->nlive;
	for (i = 0; i < a->npools; i++) {
		memset(&pools[i], 0, sizeof(pools[i]));
		if ((rc = l3kv_encode_pool(k, &a->pools[i], i, &pools[i])) != 0)
			return rc;
	}
	*nfds = 0;
	for (i = 0; i < a->nregions; i++)
		if ((rc = l3kv_encode_region(k, &a->regions[i], i, &regions[i], fds, nfds)) != 0)
			return rc;
	return 0;
}

/* Fills a C string from a NUL-padded wire field known to hold a NUL. */
static void
l3kv_get_string(char *dst, size_t cap, const char *src)
{
	snprintf(dst, cap, "%s", src);
}

/* The client name sent in HELLO: the program's, cut to printable ASCII. */
static void
l3kv_client_name(char *dst, size_t cap)
{
	const char	*s = program_invocation_short_name;
	size_t		 i;

	if (s == NULL || *s == '\0')
		s = "libl3kv";
	for (i = 0; i + 1 < cap && s[i] != '\0'; i++)
		dst[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] <= 0x7e ? s[i] : '_';
	dst[i] = '\0';
}

/* HELLO: offers this library's versions and reads the daemon's terms. */
static int
l3kv_hello(struct l3kv *k, int64_t deadline)
{
	struct proto_hello		 h;
	struct proto_hello_reply	 r;
	struct iovec			 iov;
	char				*reply;
	uint32_t			 len;
	int				 rc;

	memset(&h, 0, sizeof(h));
	h.version_min = PROTO_VERSION_MIN;
	h.version_max = PROTO_VERSION_MAX;
	l3kv_client_name(h.client, sizeof(h.client));
	iov.iov_base = &h;
	iov.iov_len = sizeof(h);
	rc = l3kv_call(k, PROTO_T_HELLO, &iov, 1, NULL, 0, deadline, &reply, &len);
	if (rc != 0)
		return rc;
	if (len != sizeof(r)) {
		free(reply);
		return l3kv_bad_reply(k, "libl3kv: HELLO reply of %u bytes", len);
	}
	memcpy(&r, reply, sizeof(r));
	free(reply);
	if (r.version < PROTO_VERSION_MIN || r.version > PROTO_VERSION_MAX)
		return l3kv_bad_reply(k, "libl3kv: the daemon chose version %u, not offered",
		    r.version);
	if (!proto_string_ok(r.server, sizeof(r.server), 1) ||
	    !proto_string_ok(r.role, sizeof(r.role), 1))
		return l3kv_bad_reply(k, "libl3kv: HELLO reply names are not terminated text");
	k->info.protocol = r.version;
	k->info.caps = r.caps;
	k->info.max_frame = r.max_frame;
	k->info.lease_ttl_ms = r.lease_ttl_ms;
	l3kv_get_string(k->info.server, sizeof(k->info.server), r.server);
	l3kv_get_string(k->info.role, sizeof(k->info.role), r.role);
	return 0;
}

/*
 * Connects the non-blocking socket. A Unix socket connects at once or
 * fails at once; only a full listen backlog (EAGAIN) is worth retrying,
 * briefly, until the deadline.
 */
static int
l3kv_connect_sock(int sock, const char *path, int64_t deadline)
{
	struct sockaddr_un	sun;
	struct pollfd		pfd;
	socklen_t		sl;
	int			err, left;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sun.sun_path))
		return -ENAMETOOLONG;
	memcpy(sun.sun_path, path, strlen(path));
	for (;;) {
		if (connect(sock, (struct sockaddr *)&sun, sizeof(sun)) == 0)
			return 0;
		err = errno;
		if (err == EINTR)
			continue;
		if (err == EINPROGRESS)
			break;
		if (err != EAGAIN)
			return -err;
		if ((left = l3kv_remaining(deadline)) == 0)
			return -ETIMEDOUT;
		poll(NULL, 0, left < 0 || left > 5 ? 5 : left);
	}
	pfd.fd = sock;
	pfd.events = POLLOUT;
	do {
		if ((left = l3kv_remaining(deadline)) == 0)
			return -ETIMEDOUT;
		pfd.revents = 0;
	} while (poll(&pfd, 1, left) <= 0);
	sl = sizeof(err);
	if (getsockopt(sock, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
		return -errno;
	return -err;
}

const char *
l3kv_default_socket(void)
{
	const char	*s = getenv(L3KV_SOCKET_ENV);

	return s != NULL && *s != '\0' ? s : L3KV_SOCKET_DEFAULT;
}

const char *
l3kv_version(void)
{
	return L3KV_LIB_VERSION;
}

int
l3kv_connect(const char *socket_path, int timeout_ms, struct l3kv **out)
{
	struct epoll_event	 ev;
	struct l3kv		*k;
	int64_t			 deadline;
	int			 rc;

	if (out == NULL || timeout_ms < L3KV_TIMEOUT_INFINITE)
		return -EINVAL;
	*out = NULL;
	if (socket_path == NULL)
		socket_path = l3kv_default_socket();
	if ((k = calloc(1, sizeof(*k))) == NULL)
		return -ENOMEM;
	TAILQ_INIT(&k->pending);
	TAILQ_INIT(&k->done);
	TAILQ_INIT(&k->sendq);
	k->epfd = k->evfd = -1;
	k->device = L3KV_DEVICE_ANY;
	k->spin_us = L3KV_SPIN_AUTO;
	k->next_seq = 1;
	k->timeout_ms = timeout_ms == L3KV_TIMEOUT_DEFAULT ? L3KV_DEFAULT_TIMEOUT_MS : timeout_ms;
	deadline = l3kv_deadline(k, timeout_ms);
	/* The socket first: a daemon that is down must cost one failed connect, no more. */
	if ((k->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) {
		rc = -errno;
		goto fail;
	}
	if ((rc = l3kv_connect_sock(k->sock, socket_path, deadline)) != 0)
		goto fail;
	if ((k->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
	    (k->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
		rc = -errno;
		goto fail;
	}
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.fd = k->sock;
	if (epoll_ctl(k->epfd, EPOLL_CTL_ADD, k->sock, &ev) != 0) {
		rc = -errno;
		goto fail;
	}
	ev.data.fd = k->evfd;
	if (epoll_ctl(k->epfd, EPOLL_CTL_ADD, k->evfd, &ev) != 0) {
		rc = -errno;
		goto fail;
	}
	if ((rc = l3kv_hello(k, deadline)) != 0)
		goto fail;
	/* An ERROR right behind the HELLO reply (a daemon stopping) is this call's failure. */
	if (k->sock < 0) {
		rc = k->cause;
		goto fail;
	}
	*out = k;
	return 0;

fail:
	l3kv_close(k);
	return rc;
}

void
l3kv_close(struct l3kv *k)
{
	struct l3kv_req	*r;

	if (k == NULL)
		return;
	if (k->sock >= 0)
		close(k->sock);
	k->sock = -1;
	while ((r = TAILQ_FIRST(&k->sendq)) != NULL)
		TAILQ_REMOVE(&k->sendq, r, send_entry);
	while ((r = TAILQ_FIRST(&k->pending)) != NULL) {
		TAILQ_REMOVE(&k->pending, r, entry);
		l3kv_req_free(r);
	}
	while ((r = TAILQ_FIRST(&k->done)) != NULL) {
		TAILQ_REMOVE(&k->done, r, entry);
		l3kv_req_free(r);
	}
	free(k->rpay);
	if (k->evfd >= 0)
		close(k->evfd);
	if (k->epfd >= 0)
		close(k->epfd);
	free(k);
}

int
l3kv_set_spin(struct l3kv *k, unsigned spin_us)
{
	if (k == NULL || (spin_us > 1000000 && spin_us != L3KV_SPIN_AUTO))
		return -EINVAL;
	k->spin_us = spin_us;
	return 0;
}

int
l3kv_set_device(struct l3kv *k, int device)
{
	if (k == NULL || device < L3KV_DEVICE_ANY || device > 65534)
		return -EINVAL;
	k->device = device;
	return 0;
}

int
l3kv_set_timeout(struct l3kv *k, int timeout_ms)
{
	if (k == NULL || timeout_ms < L3KV_TIMEOUT_INFINITE)
		return -EINVAL;
	k->timeout_ms = timeout_ms == L3KV_TIMEOUT_DEFAULT ? L3KV_DEFAULT_TIMEOUT_MS : timeout_ms;
	return 0;
}

int
l3kv_server_info(const struct l3kv *k, struct l3kv_server_info *info)
{
	if (k == NULL || info == NULL)
		return -EINVAL;
	*info = k->info;
	return 0;
}

int
l3kv_attach(struct l3kv *k, const struct l3kv_attach_args *a, struct l3kv_attach_info *info)
{
	/* 9 KiB: on the heap, as engines may call from threads with small stacks. */
	struct l3kv_attach_wire {
		struct proto_attach	fixed;
		struct proto_pool	pools[PROTO_POOLS_MAX];
		struct proto_region	regions[PROTO_REGIONS_MAX];
	}				*w;
	struct proto_attach_reply	 r;
	struct iovec			 iov[4];
	char				*reply = NULL;
	uint32_t			 len;
	unsigned			 i;
	int				 fds[PROTO_FDS_MAX], nfds = 0, rc;

	if (k == NULL || a == NULL)
		return -EINVAL;
	if (info != NULL)
		memset(info, 0, sizeof(*info));
	l3kv_clear_last(k);
	if ((w = malloc(sizeof(*w))) == NULL)
		return -ENOMEM;
	rc = l3kv_encode_attach(k, a, &w->fixed, w->pools, w->regions, fds, &nfds);
	if (rc != 0)
		goto out;
	/* The live slot list goes out as the caller's array: the wire is little-endian like us. */
	iov[0].iov_base = &w->fixed;
	iov[0].iov_len = sizeof(w->fixed);
	iov[1].iov_base = w->pools;
	iov[1].iov_len = a->npools * sizeof(w->pools[0]);
	iov[2].iov_base = w->regions;
	iov[2].iov_len = a->nregions * sizeof(w->regions[0]);
	iov[3].iov_base = (void *)(uintptr_t)a->live_slots;
	iov[3].iov_len = (size_t)a->nlive * sizeof(uint32_t);
	rc = l3kv_call(k, PROTO_T_ATTACH, iov, 4, fds, nfds, l3kv_deadline(k, a->timeout_ms),
	    &reply, &len);
	if (rc != 0)
		goto out;
	if (len != sizeof(r)) {
		rc = l3kv_bad_reply(k, "libl3kv: ATTACH reply of %u bytes", len);
		goto out;
	}
	memcpy(&r, reply, sizeof(r));
	if (!proto_string_ok(r.ns, sizeof(r.ns), 0)) {
		rc = l3kv_bad_reply(k, "libl3kv: ATTACH reply namespace is not terminated text");
		goto out;
	}
	/* The pool ADMIT uses (the daemon's choice too): PROBE must ask about the same. */
	k->kv_pool = 0;
	for (i = a->npools; i-- > 0;)
		if (a->pools[i].kind == L3KV_POOL_KV)
			k->kv_pool = (uint16_t)i;
	if (info != NULL) {
		memcpy(info->fingerprint, r.fingerprint, sizeof(info->fingerprint));
		l3kv_get_string(info->ns, sizeof(info->ns), r.ns);
		info->session = r.session;
		info->lease_ttl_ms = r.lease_ttl_ms;
		info->group_members = r.group_members;
	}
out:
	free(reply);
	free(w);
	return rc;
}

int
l3kv_detach(struct l3kv *k)
{
	char		*reply;
	uint32_t	 len;
	int		 rc;

	if (k == NULL)
		return -EINVAL;
	rc = l3kv_call(k, PROTO_T_DETACH, NULL, 0, NULL, 0, l3kv_deadline(k, L3KV_TIMEOUT_DEFAULT),
	    &reply, &len);
	free(reply);
	return rc;
}

/* STATS, HEALTH, RELOAD, LIST: a small request, a JSON reply handed to the caller. */
static int
l3kv_json_call(struct l3kv *k, unsigned type, const struct iovec *payload, int npayload,
    char **json)
{
	char		*reply;
	uint32_t	 len;
	int		 rc;

	if (k == NULL || json == NULL)
		return -EINVAL;
	*json = NULL;
	rc = l3kv_call(k, type, payload, npayload, NULL, 0, l3kv_deadline(k, L3KV_TIMEOUT_DEFAULT),
	    &reply, &len);
	if (rc != 0)
		return rc;
	if (reply == NULL && (reply = strdup("")) == NULL)
		return -ENOMEM;
	*json = reply;
	return 0;
}

int
l3kv_stats(struct l3kv *k, char **json)
{
	return l3kv_json_call(k, PROTO_T_STATS, NULL, 0, json);
}

int
l3kv_health(struct l3kv *k, char **json)
{
	return l3kv_json_call(k, PROTO_T_HEALTH, NULL, 0, json);
}

int
l3kv_reload(struct l3kv *k, char **json)
{
	return l3kv_json_call(k, PROTO_T_RELOAD, NULL, 0, json);
}

int
l3kv_list(struct l3kv *k, enum l3kv_list_what what, unsigned max, char **json)
{
	struct proto_list	l;
	struct iovec		iov = { &l, sizeof(l) };

	memset(&l, 0, sizeof(l));
	l.what = (uint16_t)what;
	l.max = max;
	return l3kv_json_call(k, PROTO_T_LIST, &iov, 1, json);
}

void
l3kv_free(void *p)
{
	free(p);
}

int
l3kv_fd(const struct l3kv *k)
{
	return k != NULL ? k->epfd : -EINVAL;
}

/* Submits a request without waiting; the ticket is its seq. */
static int
l3kv_submit_async(struct l3kv *k, unsigned type, const struct iovec *iov, int niov,
    uint64_t *ticket)
{
	struct l3kv_req	*r;
	int		 rc;

	rc = l3kv_submit(k, type, iov, niov, NULL, 0, 0, &r);
	l3kv_update(k);
	if (rc != 0)
		return rc;
	*ticket = r->seq;
	return 0;
}

/*
 * The start of a call: clears the caller's result (out, size bytes;
 * NULL: none), refuses a missing argument (args_ok 0), and clears the
 * last error, so that what encoding refuses is what l3kv_last_error()
 * says.
 */
static int
l3kv_begin(struct l3kv *k, int args_ok, void *out, size_t size)
{
	if (out != NULL)
		memset(out, 0, size);
	if (k == NULL || !args_ok)
		return -EINVAL;
	l3kv_clear_last(k);
	return 0;
}

/* A non-blocking request with no payload. */
static int
l3kv_submit_empty(struct l3kv *k, unsigned type, uint64_t *ticket)
{
	int	rc;

	if ((rc = l3kv_begin(k, ticket != NULL, ticket, sizeof(*ticket))) != 0)
		return rc;
	return l3kv_submit_async(k, type, NULL, 0, ticket);
}

int
l3kv_submit_stats(struct l3kv *k, uint64_t *ticket)
{
	return l3kv_submit_empty(k, PROTO_T_STATS, ticket);
}

int
l3kv_submit_health(struct l3kv *k, uint64_t *ticket)
{
	return l3kv_submit_empty(k, PROTO_T_HEALTH, ticket);
}

int
l3kv_poll_completion(struct l3kv *k, struct l3kv_completion *out)
{
	int	rc = l3kv_poll_completions(k, out, 1);

	return rc > 0 ? 0 : rc;
}

int
l3kv_poll_completions(struct l3kv *k, struct l3kv_completion *out, unsigned max)
{
	struct l3kv_req	*r;
	unsigned	 n = 0;

	if (out != NULL)
		memset(out, 0, (size_t)max * sizeof(*out));
	if (k == NULL || out == NULL || max == 0)
		return -EINVAL;
	/*
	 * Output always moves on (a no-op when none waits); the socket is
	 * read only once the queued completions are used up, and not again
	 * in the same drain once a read emptied it: the caller polls next,
	 * and replies that arrive meanwhile make l3kv_fd() readable.
	 */
	if (k->sock >= 0 && l3kv_flush(k) == 0 && TAILQ_EMPTY(&k->done) && !k->emptied) {
		l3kv_read(k);
		k->emptied = k->rshort;
	}
	for (; n < max && (r = TAILQ_FIRST(&k->done)) != NULL; n++) {
		TAILQ_REMOVE(&k->done, r, entry);
		out[n].ticket = r->seq;
		out[n].op = r->type;
		out[n].status = r->status;
		out[n].proto_status = r->proto_status;
		out[n].payload = r->payload;
		out[n].len = r->len;
		r->payload = NULL;
		k->last_status = r->proto_status;
		if (r->status != 0 && out[n].payload != NULL)
			snprintf(k->last_error, sizeof(k->last_error), "%s", out[n].payload);
		else
			k->last_error[0] = '\0';
		l3kv_req_free(r);
	}
	if (n == 0)
		k->emptied = 0;
	/* The eventfd moves only where completions are left after the batch. */
	l3kv_update(k);
	if (n == 0)
		return k->sock >= 0 ? -EAGAIN : -ENOTCONN;
	return (int)n;
}

int
l3kv_cork(struct l3kv *k)
{
	if (k == NULL)
		return -EINVAL;
	k->corked = 1;
	return 0;
}

int
l3kv_uncork(struct l3kv *k)
{
	int	rc;

	if (k == NULL)
		return -EINVAL;
	k->corked = 0;
	rc = k->sock >= 0 ? l3kv_flush(k) : -ENOTCONN;
	l3kv_update(k);
	return rc;
}

void
l3kv_completion_release(struct l3kv_completion *c)
{
	if (c == NULL)
		return;
	free(c->payload);
	c->payload = NULL;
	c->len = 0;
}

/*
 * The cache operations. Each request is encoded into a struct l3kv_wire
 * (its fixed part, and the caller's arrays as iovecs where the wire
 * layout is the caller's: hashes, destination pages), then either
 * called (blocking) or submitted. Replies were checked for their length
 * when their header arrived, so the decoders only copy fields out.
 */
struct l3kv_wire {
	union {
		struct proto_probe	probe;
		struct proto_admit	admit;
		struct proto_restore	restore;
		struct proto_set_policy	set_policy;
		struct proto_lease_op	lease;
		struct proto_publish	publish;
		struct proto_debug	debug;
	}			 u;
	struct iovec		 iov[2];
	int			 niov;
	void			*buf;	/* PUBLISH's pages in wire layout, freed once submitted */
};

static void
l3kv_wire_init(struct l3kv_wire *w, size_t fixed)
{
	memset(w, 0, sizeof(*w));
	w->iov[0].iov_base = &w->u;
	w->iov[0].iov_len = fixed;
	w->niov = 1;
}

/* Adds a counted array; n elements of elem bytes. */
static void
l3kv_wire_array(struct l3kv_wire *w, const void *array, uint32_t n, size_t elem)
{
	w->iov[1].iov_base = (void *)(uintptr_t)array;
	w->iov[1].iov_len = (size_t)n * elem;
	w->niov = 2;
}

/*
 * What libl3kv refuses about a page array: more pages than a request
 * may carry (the daemon would answer bad_length and close), or none to
 * read.
 */
static int
l3kv_check_pages(struct l3kv *k, unsigned type, const void *array, uint32_t npages,
    const char *field)
{
	if (npages > PROTO_PAGES_MAX) {
		l3kv_seterr(k, "libl3kv: %s of %u pages is over the %u one request may carry",
		    proto_type_name(type), npages, PROTO_PAGES_MAX);
		return -EMSGSIZE;
	}
	if (npages > 0 && array == NULL) {
		l3kv_seterr(k, "libl3kv: %s: %s is NULL with %u pages", proto_type_name(type), field,
		    npages);
		return -EINVAL;
	}
	return 0;
}

/* A blocking cache call: sends w, waits until the timeout, frees w's buffer. */
static int
l3kv_wire_call(struct l3kv *k, unsigned type, struct l3kv_wire *w, int timeout_ms,
    char **reply, uint32_t *len)
{
	int	rc;

	rc = l3kv_call(k, type, w->iov, w->niov, NULL, 0, l3kv_deadline(k, timeout_ms), reply, len);
	free(w->buf);
	w->buf = NULL;
	return rc;
}

/* A non-blocking cache request; w's buffer is not needed once submitted. */
static int
l3kv_wire_submit(struct l3kv *k, unsigned type, struct l3kv_wire *w, uint64_t *ticket)
{
	int	rc;

	rc = l3kv_submit_async(k, type, w->iov, w->niov, ticket);
	free(w->buf);
	w->buf = NULL;
	return rc;
}

static void
l3kv_decode_admit(const char *p, struct l3kv_admit_result *out)
{
	struct proto_admit_reply	r;

	memcpy(&r, p, sizeof(r));
	out->lease = r.lease;
	out->admitted_pages = r.admitted_pages;
	out->decline = r.decline;
	out->ttl_ms = r.ttl_ms;
	out->group_hit = r.group_hit;
}

static void
l3kv_decode_restore(const char *p, struct l3kv_restore_result *out)
{
	struct proto_restore_reply	r;

	memcpy(&r, p, sizeof(r));
	out->pages = r.pages;
	out->partial = (r.flags & PROTO_RESTORE_F_PARTIAL) != 0;
	out->bytes = r.bytes;
}

static void
l3kv_decode_cancel(const char *p, uint32_t *pages_landed)
{
	struct proto_cancel_reply	r;

	memcpy(&r, p, sizeof(r));
	*pages_landed = r.pages_landed;
}

static void
l3kv_decode_publish(const char *p, struct l3kv_publish_result *out)
{
	struct proto_publish_reply	r;

	memcpy(&r, p, sizeof(r));
	out->stored = r.stored;
	out->present = r.present;
	out->bytes = r.bytes;
}

/*
 * Decodes a successful reply of type into out, the caller's result for
 * that type: struct l3kv_admit_result for ADMIT, l3kv_restore_result
 * for RESTORE, l3kv_publish_result for PUBLISH, the pages landed
 * (uint32_t) for CANCEL. The blocking calls and the *_result() of their
 * completions share it.
 */
static void
l3kv_decode(unsigned type, const char *p, void *out)
{
	switch (type) {
	case PROTO_T_ADMIT:
		l3kv_decode_admit(p, out);
		break;
	case PROTO_T_RESTORE:
		l3kv_decode_restore(p, out);
		break;
	case PROTO_T_CANCEL:
		l3kv_decode_cancel(p, out);
		break;
	case PROTO_T_PUBLISH:
		l3kv_decode_publish(p, out);
		break;
	}
}

/*
 * A blocking cache call whose reply is decoded into out (NULL: the
 * caller wants only the status).
 */
static int
l3kv_wire_run(struct l3kv *k, unsigned type, struct l3kv_wire *w, int timeout_ms, void *out)
{
	char		*reply;
	uint32_t	 len;
	int		 rc;

	if ((rc = l3kv_wire_call(k, type, w, timeout_ms, &reply, &len)) != 0)
		return rc;
	if (out != NULL)
		l3kv_decode(type, reply, out);
	free(reply);
	return 0;
}

/*
 * Clears a *_result()'s out (size bytes) and returns c's payload when c
 * is a successful reply of type, of a length that type's replies have;
 * NULL otherwise, and when out is NULL.
 */
static const char *
l3kv_completion_reply(const struct l3kv_completion *c, unsigned type, void *out, size_t size)
{
	if (out == NULL)
		return NULL;
	memset(out, 0, size);
	if (c == NULL || c->op != (int)type || c->status != 0 || c->len > PROTO_FRAME_MAX ||
	    !l3kv_reply_size_ok(type, (uint32_t)c->len))
		return NULL;
	return c->payload;
}

/* A *_result(): c decoded into out, or -EINVAL (out cleared). */
static int
l3kv_result(const struct l3kv_completion *c, unsigned type, void *out, size_t size)
{
	const char	*p;

	if ((p = l3kv_completion_reply(c, type, out, size)) == NULL)
		return -EINVAL;
	l3kv_decode(type, p, out);
	return 0;
}

int
l3kv_probe(struct l3kv *k, const uint8_t *hashes, uint32_t npages, uint32_t *hit_pages)
{
	uint32_t	nstops;

	/* The stop points, if any, are checked for length and not kept. */
	return l3kv_probe_stops(k, hashes, npages, hit_pages, NULL, 0, &nstops);
}

static int
l3kv_encode_probe(struct l3kv *k, const uint8_t *hashes, uint32_t npages, struct l3kv_wire *w)
{
	int	rc;

	if ((rc = l3kv_check_pages(k, PROTO_T_PROBE, hashes, npages, "hashes")) != 0)
		return rc;
	l3kv_wire_init(w, sizeof(w->u.probe));
	w->u.probe.npages = npages;
	w->u.probe.pool = k->kv_pool;
	l3kv_wire_array(w, hashes, npages, PROTO_HASH_LEN);
	return 0;
}

/*
 * Reads a PROBE reply's fixed part into r; -EINVAL unless its stop
 * points (u32) fill exactly the rest of its len bytes.
 */
static int
l3kv_probe_reply(const char *p, size_t len, struct proto_probe_reply *r)
{
	memset(r, 0, sizeof(*r));
	if (p == NULL || len < sizeof(*r))
		return -EINVAL;
	memcpy(r, p, sizeof(*r));
	return (uint64_t)len == sizeof(*r) + (uint64_t)r->nstops * sizeof(uint32_t) ? 0 : -EINVAL;
}

/*
 * PROBE with the legal stop points: stops gets at most max of them
 * (ascending), *nstops how many the daemon sent (0: every length up to
 * the hit is one).
 */
int
l3kv_probe_stops(struct l3kv *k, const uint8_t *hashes, uint32_t npages, uint32_t *hit_pages,
    uint32_t *stops, uint32_t max, uint32_t *nstops)
{
	struct proto_probe_reply	 r;
	struct l3kv_wire		 w;
	char				*reply;
	uint32_t			 len, n;
	int				 rc;

	if ((rc = l3kv_begin(k, hit_pages != NULL && nstops != NULL && (stops != NULL || max == 0),
	    NULL, 0)) != 0)
		return rc;
	*hit_pages = 0;
	*nstops = 0;
	if ((rc = l3kv_encode_probe(k, hashes, npages, &w)) != 0)
		return rc;
	if ((rc = l3kv_wire_call(k, PROTO_T_PROBE, &w, L3KV_TIMEOUT_DEFAULT, &reply, &len)) != 0)
		return rc;
	if (l3kv_probe_reply(reply, len, &r) != 0) {
		free(reply);
		return l3kv_bad_reply(k, "libl3kv: PROBE reply of %u bytes with %u stop points",
		    len, r.nstops);
	}
	n = r.nstops < max ? r.nstops : max;
	if (n > 0)
		memcpy(stops, reply + sizeof(r), (size_t)n * sizeof(uint32_t));
	*hit_pages = r.hit_pages;
	*nstops = r.nstops;
	free(reply);
	return 0;
}

/* SET_POLICY: the group's policies; refused with -EPERM by a guard, -EBUSY while busy. */
int
l3kv_set_policy(struct l3kv *k, enum l3kv_prefetch prefetch, enum l3kv_write write,
    uint32_t prefetch_timeout_ms)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, 1, NULL, 0)) != 0)
		return rc;
	l3kv_wire_init(&w, sizeof(w.u.set_policy));
	L3KV_PUT(w.u.set_policy.prefetch, (unsigned)prefetch, "prefetch");
	L3KV_PUT(w.u.set_policy.write, (unsigned)write, "write");
	w.u.set_policy.prefetch_timeout_ms = prefetch_timeout_ms;
	return l3kv_wire_run(k, PROTO_T_SET_POLICY, &w, L3KV_TIMEOUT_DEFAULT, NULL);
}

/* PROBE without waiting: an engine's scheduler asks and reads the answer on its next poll. */
int
l3kv_submit_probe(struct l3kv *k, const uint8_t *hashes, uint32_t npages, uint64_t *ticket)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, ticket != NULL, ticket, sizeof(*ticket))) != 0 ||
	    (rc = l3kv_encode_probe(k, hashes, npages, &w)) != 0)
		return rc;
	return l3kv_wire_submit(k, PROTO_T_PROBE, &w, ticket);
}

int
l3kv_probe_result(const struct l3kv_completion *c, uint32_t *hit_pages)
{
	struct proto_probe_reply	 r;
	const char			*p;

	/* A hybrid layout's reply carries its stop points after the fixed part. */
	if ((p = l3kv_completion_reply(c, PROTO_T_PROBE, hit_pages, sizeof(*hit_pages))) == NULL ||
	    l3kv_probe_reply(p, c->len, &r) != 0)
		return -EINVAL;
	*hit_pages = r.hit_pages;
	return 0;
}

static int
l3kv_encode_admit(struct l3kv *k, const struct l3kv_admit_args *a, struct l3kv_wire *w)
{
	int	rc;

	if ((rc = l3kv_check_pages(k, PROTO_T_ADMIT, a->hashes, a->npages, "hashes")) != 0)
		return rc;
	l3kv_wire_init(w, sizeof(w->u.admit));
	w->u.admit.request_id = a->request_id;
	w->u.admit.npages = a->npages;
	w->u.admit.reserved_pages = a->reserved_pages;
	w->u.admit.state_slot = a->state_slot;
	l3kv_wire_array(w, a->hashes, a->npages, PROTO_HASH_LEN);
	return 0;
}

int
l3kv_admit(struct l3kv *k, const struct l3kv_admit_args *a, struct l3kv_admit_result *out)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, a != NULL && out != NULL, out, sizeof(*out))) != 0 ||
	    (rc = l3kv_encode_admit(k, a, &w)) != 0)
		return rc;
	return l3kv_wire_run(k, PROTO_T_ADMIT, &w, a->timeout_ms, out);
}

int
l3kv_submit_admit(struct l3kv *k, const struct l3kv_admit_args *a, uint64_t *ticket)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, a != NULL && ticket != NULL, ticket, sizeof(*ticket))) != 0 ||
	    (rc = l3kv_encode_admit(k, a, &w)) != 0)
		return rc;
	return l3kv_wire_submit(k, PROTO_T_ADMIT, &w, ticket);
}

int
l3kv_admit_result(const struct l3kv_completion *c, struct l3kv_admit_result *out)
{
	return l3kv_result(c, PROTO_T_ADMIT, out, sizeof(*out));
}

static int
l3kv_encode_restore(struct l3kv *k, const struct l3kv_restore_args *a, struct l3kv_wire *w)
{
	int	rc;

	if ((rc = l3kv_check_pages(k, PROTO_T_RESTORE, a->pages, a->npages, "dst_pages")) != 0)
		return rc;
	if ((a->flags & ~L3KV_RESTORE_RELEASE) != 0) {
		l3kv_seterr(k, "libl3kv: RESTORE: unknown flags 0x%x", a->flags);
		return -EINVAL;
	}
	l3kv_wire_init(w, sizeof(w->u.restore));
	w->u.restore.lease = a->lease;
	w->u.restore.npages = a->npages;
	w->u.restore.region = a->region;
	w->u.restore.state_region = a->state_region;
	w->u.restore.state_slot = a->state_slot;
	if (a->event_region != L3KV_REGION_NONE) {
		w->u.restore.flags |= PROTO_RESTORE_F_WAIT_EVENT;
		w->u.restore.event_region = a->event_region;
	}
	if (a->flags & L3KV_RESTORE_RELEASE)
		w->u.restore.flags |= PROTO_RESTORE_F_RELEASE;
	/* Destination indices go out as the caller's array: the wire is little-endian like us. */
	l3kv_wire_array(w, a->pages, a->npages, sizeof(uint32_t));
	return 0;
}

/* The older calls' arguments as l3kv_restore_args; -ERANGE for a region past 16 bits. */
static int
l3kv_restore_args_of(struct l3kv *k, uint64_t lease, unsigned region, const uint32_t *dst,
    uint32_t npages, const struct l3kv_state_dest *state, struct l3kv_restore_args *a)
{
	int	rc;

	memset(a, 0, sizeof(*a));
	a->lease = lease;
	a->pages = dst;
	a->npages = npages;
	a->state_region = L3KV_REGION_NONE;
	a->state_slot = L3KV_SLOT_NONE;
	a->event_region = L3KV_REGION_NONE;
	L3KV_PUT(a->region, region, "region");
	if (state != NULL) {
		L3KV_PUT(a->state_region, state->region, "state region");
		a->state_slot = state->slot;
	}
	return 0;
}

int
l3kv_restore(struct l3kv *k, uint64_t lease, unsigned region, const uint32_t *dst_pages,
    uint32_t npages, int timeout_ms, struct l3kv_restore_result *out)
{
	return l3kv_restore_state(k, lease, region, dst_pages, npages, NULL, timeout_ms, out);
}

int
l3kv_restore_state(struct l3kv *k, uint64_t lease, unsigned region, const uint32_t *dst_pages,
    uint32_t npages, const struct l3kv_state_dest *state, int timeout_ms,
    struct l3kv_restore_result *out)
{
	struct l3kv_restore_args	a;
	int				rc;

	if ((rc = l3kv_begin(k, 1, out, sizeof(*out))) != 0 ||
	    (rc = l3kv_restore_args_of(k, lease, region, dst_pages, npages, state, &a)) != 0)
		return rc;
	return l3kv_restore_with(k, &a, timeout_ms, out);
}

int
l3kv_restore_with(struct l3kv *k, const struct l3kv_restore_args *a, int timeout_ms,
    struct l3kv_restore_result *out)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, a != NULL, out, sizeof(*out))) != 0 ||
	    (rc = l3kv_encode_restore(k, a, &w)) != 0)
		return rc;
	return l3kv_wire_run(k, PROTO_T_RESTORE, &w, timeout_ms, out);
}

int
l3kv_submit_restore(struct l3kv *k, uint64_t lease, unsigned region, const uint32_t *dst_pages,
    uint32_t npages, uint64_t *ticket)
{
	return l3kv_submit_restore_state(k, lease, region, dst_pages, npages, NULL, ticket);
}

int
l3kv_submit_restore_state(struct l3kv *k, uint64_t lease, unsigned region,
    const uint32_t *dst_pages, uint32_t npages, const struct l3kv_state_dest *state,
    uint64_t *ticket)
{
	struct l3kv_restore_args	a;
	int				rc;

	if ((rc = l3kv_begin(k, ticket != NULL, ticket, sizeof(*ticket))) != 0 ||
	    (rc = l3kv_restore_args_of(k, lease, region, dst_pages, npages, state, &a)) != 0)
		return rc;
	return l3kv_submit_restore_with(k, &a, ticket);
}

int
l3kv_submit_restore_with(struct l3kv *k, const struct l3kv_restore_args *a, uint64_t *ticket)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, a != NULL && ticket != NULL, ticket, sizeof(*ticket))) != 0 ||
	    (rc = l3kv_encode_restore(k, a, &w)) != 0)
		return rc;
	return l3kv_wire_submit(k, PROTO_T_RESTORE, &w, ticket);
}

int
l3kv_restore_result(const struct l3kv_completion *c, struct l3kv_restore_result *out)
{
	return l3kv_result(c, PROTO_T_RESTORE, out, sizeof(*out));
}

/*
 * CANCEL and RELEASE carry only the lease: blocking, pages_landed gets
 * CANCEL's answer (NULL: not wanted, and always for RELEASE).
 */
static int
l3kv_lease_call(struct l3kv *k, unsigned type, uint64_t lease, uint32_t *pages_landed)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, 1, pages_landed, sizeof(*pages_landed))) != 0)
		return rc;
	l3kv_wire_init(&w, sizeof(w.u.lease));
	w.u.lease.lease = lease;
	return l3kv_wire_run(k, type, &w, L3KV_TIMEOUT_DEFAULT, pages_landed);
}

/* CANCEL or RELEASE without waiting. */
static int
l3kv_lease_submit(struct l3kv *k, unsigned type, uint64_t lease, uint64_t *ticket)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, ticket != NULL, ticket, sizeof(*ticket))) != 0)
		return rc;
	l3kv_wire_init(&w, sizeof(w.u.lease));
	w.u.lease.lease = lease;
	return l3kv_wire_submit(k, type, &w, ticket);
}

int
l3kv_cancel(struct l3kv *k, uint64_t lease, uint32_t *pages_landed)
{
	return l3kv_lease_call(k, PROTO_T_CANCEL, lease, pages_landed);
}

int
l3kv_submit_cancel(struct l3kv *k, uint64_t lease, uint64_t *ticket)
{
	return l3kv_lease_submit(k, PROTO_T_CANCEL, lease, ticket);
}

int
l3kv_cancel_result(const struct l3kv_completion *c, uint32_t *pages_landed)
{
	return l3kv_result(c, PROTO_T_CANCEL, pages_landed, sizeof(*pages_landed));
}

int
l3kv_release(struct l3kv *k, uint64_t lease)
{
	return l3kv_lease_call(k, PROTO_T_RELEASE, lease, NULL);
}

/*
 * RELEASE without waiting: an engine has nothing to learn from the answer
 * but an error, so it can drain that completion whenever it polls.
 */
int
l3kv_submit_release(struct l3kv *k, uint64_t lease, uint64_t *ticket)
{
	return l3kv_lease_submit(k, PROTO_T_RELEASE, lease, ticket);
}

/* PUBLISH's pages are converted: the wire's have 4 bytes of padding. */
static int
l3kv_encode_publish(struct l3kv *k, unsigned region, const struct l3kv_publish_page *pages,
    uint32_t npages, struct l3kv_wire *w)
{
	struct proto_publish_page	*wp;
	uint32_t			 i;
	int				 rc;

	if ((rc = l3kv_check_pages(k, PROTO_T_PUBLISH, pages, npages, "pages")) != 0)
		return rc;
	l3kv_wire_init(w, sizeof(w->u.publish));
	L3KV_PUT(w->u.publish.region, region, "region");
	w->u.publish.npages = npages;
	if (npages == 0)
		return 0;
	if ((wp = calloc(npages, sizeof(*wp))) == NULL) {
		l3kv_seterr(k, "libl3kv: out of memory for %u PUBLISH pages", npages);
		return -ENOMEM;
	}
	for (i = 0; i < npages; i++) {
		memcpy(wp[i].hash, pages[i].hash, sizeof(wp[i].hash));
		wp[i].src_page = pages[i].src_page;
	}
	w->buf = wp;
	l3kv_wire_array(w, wp, npages, sizeof(*wp));
	return 0;
}

int
l3kv_publish(struct l3kv *k, unsigned region, const struct l3kv_publish_page *pages,
    uint32_t npages, struct l3kv_publish_result *out)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, 1, out, sizeof(*out))) != 0 ||
	    (rc = l3kv_encode_publish(k, region, pages, npages, &w)) != 0)
		return rc;
	return l3kv_wire_run(k, PROTO_T_PUBLISH, &w, L3KV_TIMEOUT_DEFAULT, out);
}

int
l3kv_submit_publish(struct l3kv *k, unsigned region, const struct l3kv_publish_page *pages,
    uint32_t npages, uint64_t *ticket)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, ticket != NULL, ticket, sizeof(*ticket))) != 0 ||
	    (rc = l3kv_encode_publish(k, region, pages, npages, &w)) != 0)
		return rc;
	return l3kv_wire_submit(k, PROTO_T_PUBLISH, &w, ticket);
}

int
l3kv_publish_result(const struct l3kv_completion *c, struct l3kv_publish_result *out)
{
	return l3kv_result(c, PROTO_T_PUBLISH, out, sizeof(*out));
}

int
l3kv_debug(struct l3kv *k, unsigned op, unsigned pool, const uint8_t *hash)
{
	struct l3kv_wire	w;
	int			rc;

	if ((rc = l3kv_begin(k, hash != NULL, NULL, 0)) != 0)
		return rc;
	l3kv_wire_init(&w, sizeof(w.u.debug));
	L3KV_PUT(w.u.debug.pool, pool, "pool");
	w.u.debug.op = op;
	memcpy(w.u.debug.hash, hash, sizeof(w.u.debug.hash));
	return l3kv_wire_run(k, PROTO_T_DEBUG, &w, L3KV_TIMEOUT_DEFAULT, NULL);
}

/*
 * Errnos libl3kv also returns for reasons of its own (connect, malloc,
 * arguments): for them the status wording would mislead.
 */
static int
l3kv_errno_is_local(int err)
{
	switch (err) {
	case ENOENT:
	case EACCES:
	case EINVAL:
	case ENOMEM:
	case EBADF:
		return 1;
	}
	return 0;
}

const char *
l3kv_strerror(int err)
{
	unsigned	s, found = 0, n = 0;

	if (err < 0)
		err = -err;
	if (err == 0)
		return "success";
	if (!l3kv_errno_is_local(err)) {
		for (s = 1; s < PROTO_S__MAX; s++) {
			if (proto_status_errno(s) == -err) {
				found = s;
				n++;
			}
		}
		if (n == 1)
			return proto_status_text(found);
	}
	return strerror(err);
}

int
l3kv_last_status(const struct l3kv *k)
{
	return k != NULL ? k->last_status : 0;
}

const char *
l3kv_last_error(const struct l3kv *k)
{
	return k != NULL ? k->last_error : "";
}
