/*
 * Client connections. Reads are raw recvmsg() calls, because bufferevents
 * silently drop the SCM_RIGHTS fds that ATTACH carries: first exactly one
 * header (with room for fds), then exactly its payload, so that fds are
 * always attributed to the frame whose first byte they came with. Replies
 * are copied into one output buffer: the replies to one wakeup's frames
 * leave together in one write at its end, any other reply at once, and
 * what the socket does not take is flushed by a write event.
 *
 * Framing errors (bad magic, version, length, type, flags, fds, a stream
 * cut inside a frame) are answered with an ERROR frame and the connection
 * is closed: after them the stream cannot be trusted to be in sync. A
 * connection is never freed inside its own callback: conn_close() marks
 * it dead and stops reading; it is freed from a fresh loop iteration once
 * its last reply is flushed. A socket the daemon closes lingers a moment
 * (conn_linger): its write side shut, its input read and dropped until
 * EOF, so that the peer reads the last frame instead of a reset.
 *
 * Nothing a client does holds memory or a slot for long: input buffers
 * grow with the bytes that arrived, never with what a header promises;
 * before HELLO a frame may carry at most CONN_PREHELLO_MAX bytes; replies
 * over limits.max_output stop the reading until the peer takes them; and
 * one timer per connection runs whichever deadline is nearest (HELLO,
 * ATTACH, finishing a frame, draining replies).
 *
 * conn.c is the transport only: it knows the framing, not what a frame
 * means. Its owner passes two callbacks to conn_new(), as tmux's
 * proc_add_peer() takes its dispatcher: one for each checked frame, one
 * when the connection goes (for the engines, dispatch_frame() and
 * server.c's server_conn_closed(), which ends the session through
 * dispatch_session_end()); another dispatcher can reuse the framing.
 */
#include <sys/socket.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"

/* Frames handled per wakeup before yielding to other connections. */
#define CONN_FRAMES_PER_WAKEUP	32
#define CONN_HDR		sizeof(struct proto_hdr)
#define CONN_KEEP_BUFFER	(256U << 10)
#define CONN_BULK		(64U << 10)	/* free space an attached read asks for */
/* HELLO is 40 bytes; anything else before it is answered `state`: no need for more. */
#define CONN_PREHELLO_MAX	4096U
/* Long enough for a peer that connected and wrote to reach its read; bounded in number. */
#define CONN_LINGER_MS		2000
#define CONN_LINGER_MAX		64

#define CONN_PENDING(c)		((c)->out_len - (c)->out_off)
/* Fds (or the news that the kernel dropped some) wait for a frame to take them. */
#define CONN_HAS_FDS(c)		((c)->in_nfds > 0 || ((c)->flags & CONN_F_FDS_LOST))

static void	conn_read_cb(evutil_socket_t, short, void *);
static void	conn_write_cb(evutil_socket_t, short, void *);
static void	conn_timer_cb(evutil_socket_t, short, void *);
static void	conn_timer_update(struct conn *);
static void	conn_close_fds(struct conn *);

/*
 * Returns a new connection, owned by the caller; takes fd. frame_cb gets
 * each checked frame (borrowed, with its fds); closed_cb is called once,
 * first thing in conn_free(), while replies can still be sent; both get
 * arg. A connection that conn_new() failed to make calls neither.
 */
struct conn *
conn_new(struct server *s, int fd, uid_t uid, gid_t gid, pid_t pid, unsigned chan,
    void (*frame_cb)(struct conn *, struct proto_frame *, void *),
    void (*closed_cb)(struct conn *, void *), void *arg)
{
	struct conn	*c;
	int		 i;

	if ((c = calloc(1, sizeof(*c))) == NULL)
		return NULL;
	c->fd = fd;
	c->server = s;
	c->uid = uid;
	c->gid = gid;
	c->pid = pid;
	c->chan = chan;
	c->frame_cb = frame_cb;
	c->closed_cb = closed_cb;
	c->cb_arg = arg;
	c->id = ++s->next_conn_id;
	c->accepted_ms = c->idle_ms = server_now_ms();
	for (i = 0; i < PROTO_FDS_MAX; i++)
		c->in_fds[i] = -1;
	c->ev_read = event_new(s->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
	c->ev_write = event_new(s->base, fd, EV_WRITE, conn_write_cb, c);
	c->ev_timer = evtimer_new(s->base, conn_timer_cb, c);
	if (c->ev_read == NULL || c->ev_write == NULL || c->ev_timer == NULL ||
	    event_add(c->ev_read, NULL) != 0) {
		c->fd = -1;	/* the caller still owns fd on failure */
		conn_free(c);
		return NULL;
	}
	metrics.connections_open++;
	conn_timer_update(c);	/* the HELLO deadline */
	return c;
}

/* Frees a connection and everything it owns. Idempotent fields. */
void
conn_free(struct conn *c)
{
	if (c == NULL)
		return;
	/*
	 * First, while the connection still works: the owner ends what it
	 * held (a session's last replies may still go out) and lets go of it.
	 */
	if (c->fd >= 0)
		c->closed_cb(c, c->cb_arg);
	conn_close_fds(c);
	if (c->ev_read != NULL)
		event_free(c->ev_read);
	if (c->ev_write != NULL)
		event_free(c->ev_write);
	if (c->ev_timer != NULL)
		event_free(c->ev_timer);
	free(c->out);
	free(c->in);
	if (c->fd >= 0) {
		/* Closed by the daemon with its replies out: the peer must get to read them. */
		if ((c->flags & (CONN_F_DEAD | CONN_F_PEER_GONE)) == CONN_F_DEAD)
			conn_linger(c->server, c->fd);
		else
			close(c->fd);
		metrics.connections_open--;
	}
	free(c);
}

static void
conn_free_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	conn_free(arg);
}

/* Schedules the free from a fresh loop iteration. */
static void
conn_reap(struct conn *c)
{
	struct timeval	now = { 0, 0 };

	if (c->flags & CONN_F_REAPED)
		return;
	c->flags |= CONN_F_REAPED;
	event_del(c->ev_read);
	event_del(c->ev_write);
	event_del(c->ev_timer);
	if (event_base_once(c->server->base, -1, EV_TIMEOUT, conn_free_cb, c, &now) != 0)
		fatalx("conn", "cannot schedule a connection free");
}

/*
 * Marks the connection dead: no more frames are read; pending replies
 * are still flushed, then the connection is freed.
 */
void
conn_close(struct conn *c)
{
	if (c->flags & CONN_F_DEAD)
		return;
	c->flags |= CONN_F_DEAD;
	event_del(c->ev_read);
	if (c->out_len == c->out_off) {
		conn_reap(c);
		return;
	}
	/* A peer that does not read its last replies has output_timeout_ms to. */
	if (c->out_ms == 0)
		c->out_ms = server_now_ms();
	conn_timer_update(c);
	if (!event_pending(c->ev_write, EV_WRITE, NULL))
		event_add(c->ev_write, NULL);
}

static void
conn_linger_free(struct server *s, struct conn_linger *l)
{
	TAILQ_REMOVE(&s->lingering, l, entry);
	s->nlingering--;
	event_free(l->ev);
	close(l->fd);
	free(l);
}

static void
conn_linger_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct conn_linger	*l = arg;
	char			 buf[4096];
	ssize_t			 n;
	int			 i;

	if (!(ev & EV_TIMEOUT) && server_now_ms() < l->until) {
		/* A bounded number of reads per wakeup; fds sent now are closed by the kernel. */
		for (i = 0; i < 16; i++) {
			n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
			if (n > 0)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EINTR))
				return;
			break;	/* EOF, or the peer is gone */
		}
		if (i == 16)
			return;
	}
	conn_linger_free(l->server, l);
}

/*
 * Takes fd, a socket whose last frame was written: shuts its write side
 * (the peer reads that frame, then EOF) and reads and drops what the peer
 * still sends, until EOF or CONN_LINGER_MS. Closing a Unix socket with
 * unread input instead would fail the peer's next write with EPIPE or
 * ECONNRESET, and a client that is still sending its HELLO never gets to
 * read why it was refused.
 */
void
conn_linger(struct server *s, int fd)
{
	struct conn_linger	*l = NULL;
	struct timeval		 tv = { CONN_LINGER_MS / 1000, (CONN_LINGER_MS % 1000) * 1000 };

	if (shutdown(fd, SHUT_WR) < 0 || s->nlingering >= CONN_LINGER_MAX ||
	    (l = calloc(1, sizeof(*l))) == NULL)
		goto fail;
	l->fd = fd;
	l->server = s;
	l->until = server_now_ms() + CONN_LINGER_MS;
	if ((l->ev = event_new(s->base, fd, EV_READ | EV_PERSIST, conn_linger_cb, l)) == NULL ||
	    event_add(l->ev, &tv) != 0)
		goto fail;
	TAILQ_INSERT_TAIL(&s->lingering, l, entry);
	s->nlingering++;
	return;

fail:
	if (l != NULL && l->ev != NULL)
		event_free(l->ev);
	free(l);
	close(fd);
}

/* Closes every lingering socket (server_free). */
void
conn_linger_free_all(struct server *s)
{
	struct conn_linger	*l;

	while ((l = TAILQ_FIRST(&s->lingering)) != NULL)
		conn_linger_free(s, l);
}

/* The nearest deadline that applies to the connection now, or 0. */
static uint64_t
conn_deadline(const struct conn *c)
{
	const struct config	*cfg = c->server->cfg;
	uint64_t		 at = 0, t;

	if (c->flags & CONN_F_REAPED)
		return 0;
	if (c->out_ms != 0)
		at = c->out_ms + cfg->output_timeout_ms;
	if (c->flags & CONN_F_DEAD)
		return at;
	if (!(c->flags & CONN_F_HELLO))
		t = c->accepted_ms + cfg->hello_timeout_ms;
	else if (!(c->flags & CONN_F_ATTACHED))
		t = c->idle_ms + cfg->attach_timeout_ms;
	else
		t = 0;
	if (t != 0 && (at == 0 || t < at))
		at = t;
	/* Not while the daemon itself stopped reading (CONN_F_OVER). */
	if ((c->flags & (CONN_F_PARTIAL | CONN_F_OVER)) == CONN_F_PARTIAL) {
		t = c->frame_ms + cfg->frame_timeout_ms;
		if (at == 0 || t < at)
			at = t;
	}
	return at;
}

/*
 * Sets the timer for the nearest deadline. Lazily: a timer already set
 * earlier is left to fire and look again, so that a busy connection whose
 * deadlines come and go (a partial frame per read) costs no event_add per
 * request.
 */
static void
conn_timer_update(struct conn *c)
{
	struct timeval	tv;
	uint64_t	at = conn_deadline(c), now;

	if (at == 0 || (c->timer_at != 0 && c->timer_at <= at))
		return;
	now = server_now_ms();
	at = at > now ? at - now : 0;
	tv.tv_sec = (time_t)(at / 1000);
	tv.tv_usec = (suseconds_t)(at % 1000) * 1000;
	if (evtimer_add(c->ev_timer, &tv) == 0)
		c->timer_at = now + at;
}

/* A deadline passed: one ERROR `timeout` frame, then the connection is closed. */
static void
conn_timeout(struct conn *c, const char *why)
{
	metrics.connections_timed_out++;
	log_info("conn", "conn %llu (pid %d uid %u): %s; closing", (unsigned long long)c->id,
	    (int)c->pid, (unsigned)c->uid, why);
	conn_reply_error(c, NULL, PROTO_S_TIMEOUT, "%s", why);
	conn_close(c);
}

static void
conn_timer_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct conn		*c = arg;
	const struct config	*cfg = c->server->cfg;
	char			 why[160];
	uint64_t		 now = server_now_ms();

	(void)fd;
	(void)ev;
	c->timer_at = 0;
	if (c->flags & CONN_F_REAPED)
		return;
	if (c->out_ms != 0 && now >= c->out_ms + cfg->output_timeout_ms) {
		metrics.connections_slow++;
		log_info("conn", "conn %llu (pid %d uid %u): %zu bytes of replies not read within "
		    "%u ms; closing", (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid,
		    CONN_PENDING(c), cfg->output_timeout_ms);
		/* Nothing more can be delivered: no last frame, no linger. */
		c->out_off = c->out_len = 0;
		c->flags |= CONN_F_DEAD | CONN_F_PEER_GONE;
		c->flags &= ~CONN_F_OVER;
		event_del(c->ev_read);
		conn_reap(c);
		return;
	}
	if (!(c->flags & CONN_F_DEAD)) {
		why[0] = '\0';
		if (!(c->flags & CONN_F_HELLO) && now >= c->accepted_ms + cfg->hello_timeout_ms)
			snprintf(why, sizeof(why), "no HELLO within %u ms of connecting",
			    cfg->hello_timeout_ms);
		else if ((c->flags & (CONN_F_HELLO | CONN_F_ATTACHED)) == CONN_F_HELLO &&
		    now >= c->idle_ms + cfg->attach_timeout_ms)
			snprintf(why, sizeof(why), "not attached and idle for %u ms",
			    cfg->attach_timeout_ms);
		else if ((c->flags & (CONN_F_PARTIAL | CONN_F_OVER)) == CONN_F_PARTIAL &&
		    now >= c->frame_ms + cfg->frame_timeout_ms)
			snprintf(why, sizeof(why), "a frame not finished within %u ms of its first "
			    "bytes (%zu bytes held)", cfg->frame_timeout_ms, c->in_len - c->in_off);
		if (why[0] != '\0') {
			conn_timeout(c, why);
			return;
		}
	}
	conn_timer_update(c);
}

/* Replies over limits.max_output: reading stops until the peer takes them. */
static void
conn_over(struct conn *c)
{
	c->flags |= CONN_F_OVER;
	event_del(c->ev_read);
	if (c->out_ms == 0)
		c->out_ms = server_now_ms();
	conn_timer_update(c);
}

/* Back under the bound: reading resumes, frames already read first. */
static void
conn_under(struct conn *c)
{
	c->flags &= ~CONN_F_OVER;
	if (c->flags & CONN_F_DEAD)
		return;
	c->out_ms = 0;
	/* The frame's clock ran while the daemon was not reading it: it starts again. */
	if (c->flags & CONN_F_PARTIAL)
		c->frame_ms = server_now_ms();
	conn_timer_update(c);
	if (event_add(c->ev_read, NULL) == 0 && c->in_len > c->in_off)
		event_active(c->ev_read, EV_READ, 0);
}

static void
conn_close_fds(struct conn *c)
{
	int	i;

	for (i = 0; i < c->in_nfds; i++) {
		if (c->in_fds[i] >= 0)
			close(c->in_fds[i]);
		c->in_fds[i] = -1;
	}
	c->in_nfds = 0;
	c->flags &= ~CONN_F_FDS_LOST;
}

/* Empties the output buffer; one that grew large is let go. */
static void
conn_out_reset(struct conn *c)
{
	c->out_off = c->out_len = 0;
	if (c->out_cap > CONN_KEEP_BUFFER) {
		free(c->out);
		c->out = NULL;
		c->out_cap = 0;
	}
}

static void
conn_flush(struct conn *c)
{
	ssize_t	n;

	while (c->out_len > c->out_off) {
		n = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
		if (n > 0) {
			metrics.bytes_out += (uint64_t)n;
			c->out_off += (size_t)n;
			if (c->out_off == c->out_len)
				conn_out_reset(c);
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			if (!event_pending(c->ev_write, EV_WRITE, NULL))
				event_add(c->ev_write, NULL);
			if ((c->flags & CONN_F_OVER) && CONN_PENDING(c) <= c->server->cfg->max_output)
				conn_under(c);
			return;
		}
		/* The peer is gone: nothing more can be delivered. */
		conn_out_reset(c);
		if (!(c->flags & CONN_F_DEAD))
			log_debug("conn", "conn %llu: write: %s", (unsigned long long)c->id,
			    strerror(errno));
		c->flags |= CONN_F_DEAD | CONN_F_PEER_GONE;
		event_del(c->ev_read);
		break;
	}
	if ((c->flags & CONN_F_OVER) && CONN_PENDING(c) <= c->server->cfg->max_output)
		conn_under(c);
	if (c->flags & CONN_F_DEAD)
		conn_reap(c);
}

static void
conn_write_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	conn_flush(arg);
}

/* Queues a reply frame and tries to send it at once. */
int
conn_reply(struct conn *c, const struct proto_hdr *req, unsigned status, const void *payload,
    uint32_t len)
{
	struct proto_hdr	h;

	proto_hdr_init(&h, req != NULL ? req->type : PROTO_T_ERROR, len, req != NULL ? req->seq : 0);
	h.flags = PROTO_F_REPLY;
	h.status = (uint16_t)status;
	return conn_send(c, &h, payload);
}

/*
 * Queues a request frame (the peer channel, where this daemon also asks)
 * and tries to send it at once.
 */
int
conn_request(struct conn *c, unsigned type, uint64_t seq, const void *payload, uint32_t len)
{
	struct proto_hdr	h;

	proto_hdr_init(&h, type, len, seq);
	return conn_send(c, &h, payload);
}

/* Queues one frame, header h and h->length payload bytes. */
int
conn_send(struct conn *c, const struct proto_hdr *hp, const void *payload)
{
	struct proto_hdr	h = *hp;
	char			dump[512];
	uint8_t			*p;
	size_t			 need, cap;
	uint32_t		 len = h.length;

	if (c->flags & CONN_F_REAPED)
		return -EPIPE;
	need = c->out_len + sizeof(h) + len;
	if (need > c->out_cap) {
		for (cap = c->out_cap ? c->out_cap : 4096; cap < need; cap *= 2)
			;
		if ((p = realloc(c->out, cap)) == NULL)
			return -ENOMEM;
		c->out = p;
		c->out_cap = cap;
	}
	memcpy(c->out + c->out_len, &h, sizeof(h));
	if (len > 0)
		memcpy(c->out + c->out_len + sizeof(h), payload, len);
	c->out_len = need;
	metrics.frames_out++;
	if (!(c->flags & CONN_F_OVER) && CONN_PENDING(c) > c->server->cfg->max_output)
		conn_over(c);
	if (log_get_level() >= LOG_LEVEL_DEBUG) {
		proto_dump(&h, payload, dump, sizeof(dump));
		log_debug("conn", "conn %llu: > %s", (unsigned long long)c->id, dump);
	}
	/* Replies made while a wakeup's frames are handled leave in one write at its end. */
	if (!(c->flags & CONN_F_READING) && !event_pending(c->ev_write, EV_WRITE, NULL))
		conn_flush(c);
	return 0;
}

int
conn_reply_error(struct conn *c, const struct proto_hdr *req, unsigned status, const char *fmt,
    ...)
{
	char	msg[PROTO_ERRMSG_MAX + 1];
	va_list	ap;
	int	n;

	va_start(ap, fmt);
	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if (n > PROTO_ERRMSG_MAX)
		n = PROTO_ERRMSG_MAX;
	return conn_reply(c, req, status, msg, (uint32_t)n);
}

/* Answers a framing error (with ERROR when the header was unusable), then closes. */
static void
conn_fail(struct conn *c, const struct proto_hdr *h, unsigned status, const char *why)
{
	metrics.frames_bad++;
	log_info("conn", "conn %llu (pid %d uid %u): %s: %s; closing", (unsigned long long)c->id,
	    (int)c->pid, (unsigned)c->uid, proto_status_name(status), why);
	conn_reply_error(c, h, status, "%s", why);
	conn_close(c);
}

/*
 * Takes any fds out of a received control message. -EMSGSIZE: more than
 * a frame may carry; -ENFILE: the kernel dropped some (MSG_CTRUNC with
 * room to spare: most often the daemon is out of fds), and those it
 * passed are closed, as a frame missing some fds is unusable.
 */
static int
conn_take_fds(struct conn *c, struct msghdr *msg)
{
	struct cmsghdr	*cm;
	int		 n, i, extra = 0, before = c->in_nfds;

	for (cm = CMSG_FIRSTHDR(msg); cm != NULL; cm = CMSG_NXTHDR(msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (c->in_nfds < PROTO_FDS_MAX)
				c->in_fds[c->in_nfds++] = fd;
			else {
				close(fd);
				extra = 1;
			}
		}
	}
	if (extra)
		return -EMSGSIZE;
	if (msg->msg_flags & MSG_CTRUNC) {
		if (c->in_nfds - before >= PROTO_FDS_MAX)
			return -EMSGSIZE;	/* the buffer was full: more were sent */
		for (i = before; i < c->in_nfds; i++) {
			close(c->in_fds[i]);
			c->in_fds[i] = -1;
		}
		c->in_nfds = before;
		return -ENFILE;
	}
	return 0;
}

/*
 * Reads toward the current frame: the header first, then the payload.
 * Returns bytes read, 0 at EOF, or -errno; *fds_lost is set when fds sent
 * with these bytes were dropped by the kernel.
 */
static ssize_t
conn_recv(struct conn *c, size_t want, int *fds_lost)
{
	union {
		struct cmsghdr	hdr;
		char		buf[CMSG_SPACE(sizeof(int) * PROTO_FDS_MAX)];
	} cbuf;
	struct msghdr	msg;
	struct iovec	iov;
	ssize_t		n;

	iov.iov_base = c->in + c->in_len;	/* conn_read_size() made room */
	iov.iov_len = want;
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cbuf.buf;
	msg.msg_controllen = sizeof(cbuf.buf);
	n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0)
		return -errno;
	/*
	 * Not only when a control message came: a kernel that could install
	 * none of the fds (EMFILE) passes none, and says so only in the flag.
	 */
	if (msg.msg_controllen > 0 || (msg.msg_flags & MSG_CTRUNC)) {
		switch (conn_take_fds(c, &msg)) {
		case 0:
			break;
		case -ENFILE:
			*fds_lost = 1;
			break;
		default:
			return -EMSGSIZE;
		}
	}
	return n;
}

static int
conn_grow(struct conn *c, size_t need)
{
	uint8_t	*p;
	size_t	 cap = c->in_cap ? c->in_cap : 4096;

	if (need <= c->in_cap)
		return 0;
	while (cap < need)
		cap *= 2;
	if ((p = realloc(c->in, cap)) == NULL)
		return -ENOMEM;
	c->in = p;
	c->in_cap = cap;
	return 0;
}

/*
 * Dispatches the frame at the front of the buffer if it is complete.
 * Returns 1 when a frame was handled, 0 when more bytes are needed, -1
 * when the connection is closing. The header is checked as soon as it is
 * there, before anything is allocated for its payload.
 */
static int
conn_next_frame(struct conn *c)
{
	struct proto_frame	f;
	struct proto_hdr	h;
	char			dump[512];
	size_t			avail = c->in_len - c->in_off;
	int			st, take_fds;

	if (avail < CONN_HDR)
		return 0;
	memcpy(&h, c->in + c->in_off, CONN_HDR);
	if ((st = proto_hdr_check_chan(&h, c->server->cfg->max_frame, c->chan)) != 0) {
		snprintf(dump, sizeof(dump), "%s (type %u, length %u)", proto_status_text(st),
		    h.type, h.length);
		conn_fail(c, st == PROTO_S_BAD_MAGIC || st == PROTO_S_BAD_TYPE ? NULL : &h, st,
		    dump);
		return -1;
	}
	/* Megabytes only for a peer that said HELLO, so that it has a deadline behind it. */
	if (!(c->flags & CONN_F_HELLO) && h.length > CONN_PREHELLO_MAX) {
		snprintf(dump, sizeof(dump), "length %u is over the %u bytes allowed before HELLO",
		    h.length, CONN_PREHELLO_MAX);
		conn_fail(c, &h, PROTO_S_TOO_BIG, dump);
		return -1;
	}
	if (avail < CONN_HDR + h.length) {
		/*
		 * The frame goes to the front of the buffer; the buffer grows
		 * as its bytes arrive (conn_read_size), never by the promise of
		 * a header alone.
		 */
		if (c->in_off > 0) {
			memmove(c->in, c->in + c->in_off, avail);
			c->fds_until = c->fds_until > c->in_off ? c->fds_until - c->in_off : 0;
			c->in_len = avail;
			c->in_off = 0;
		}
		return 0;
	}
	/*
	 * Fds from a bulk read wait for the frame flagged as carrying them,
	 * which must start in the bytes read with them; frames before it in
	 * those bytes pass them by.
	 */
	take_fds = CONN_HAS_FDS(c) && (h.flags & PROTO_F_FDS);
	if (CONN_HAS_FDS(c) && !take_fds && c->in_off >= c->fds_until) {
		conn_fail(c, &h, PROTO_S_UNEXPECTED_FDS, "fds on a frame not flagged as carrying them");
		return -1;
	}
	if (take_fds && !proto_type_takes_fds(h.type)) {
		conn_fail(c, &h, PROTO_S_UNEXPECTED_FDS, "fds on a frame that takes none");
		return -1;
	}
	if ((st = proto_payload_check_chan(&h, c->in + c->in_off + CONN_HDR, c->chan)) != 0) {
		snprintf(dump, sizeof(dump), "%u payload bytes are wrong for %s", h.length,
		    proto_type_name(h.type));
		conn_fail(c, &h, st, dump);
		return -1;
	}

	metrics.frames_in++;
	c->flags &= ~CONN_F_PARTIAL;
	c->idle_ms = server_now_ms();
	if (take_fds && (c->flags & CONN_F_FDS_LOST)) {
		/* In sync still: the frame is refused, the connection kept. */
		log_warn("conn", "conn %llu (pid %d uid %u): ATTACH: the kernel dropped its fds "
		    "(MSG_CTRUNC); refused", (unsigned long long)c->id, (int)c->pid,
		    (unsigned)c->uid);
		metrics.attaches_refused++;
		conn_reply_error(c, &h, PROTO_S_LIMIT, "ATTACH: the fds sent with it were dropped "
		    "by the kernel (MSG_CTRUNC): the daemon is out of file descriptors; nothing "
		    "was attached");
		conn_close_fds(c);
		c->in_off += CONN_HDR + h.length;
		goto consumed;
	}
	memset(&f, 0, sizeof(f));
	f.hdr = h;
	f.payload = c->in + c->in_off + CONN_HDR;
	if (take_fds) {
		memcpy(f.fds, c->in_fds, sizeof(f.fds));
		f.nfds = c->in_nfds;
	} else {
		memset(f.fds, 0xff, sizeof(f.fds));
		f.nfds = 0;
	}
	if (log_get_level() >= LOG_LEVEL_DEBUG) {
		proto_dump(&h, f.payload, dump, sizeof(dump));
		log_debug("conn", "conn %llu: < %s fds=%d", (unsigned long long)c->id, dump, f.nfds);
	}
	c->frame_cb(c, &f, c->cb_arg);
	/* The owner borrowed the fds; mappings outlive them. */
	if (take_fds)
		conn_close_fds(c);
	c->in_off += CONN_HDR + h.length;
	if (CONN_HAS_FDS(c) && c->in_off >= c->fds_until && !(c->flags & CONN_F_DEAD)) {
		conn_fail(c, NULL, PROTO_S_UNEXPECTED_FDS, "fds no frame was flagged to carry");
		return -1;
	}
consumed:
	if (c->in_off == c->in_len) {
		c->in_off = c->in_len = 0;
		if (c->in_cap > CONN_KEEP_BUFFER) {
			/* One large ATTACH must not pin megabytes for the connection's life. */
			free(c->in);
			c->in = NULL;
			c->in_cap = 0;
		}
	}
	return (c->flags & CONN_F_DEAD) ? -1 : 1;
}

/*
 * How many bytes the next read may take. Until the connection is
 * attached, exactly the rest of the current frame: fds ride with the
 * first byte of an ATTACH, and a read that never crosses a frame boundary
 * attributes them to their frame by construction. Once attached no frame
 * takes fds, so reads take whatever the socket has (one syscall per
 * request instead of two, which is most of a small PROBE's cost); an fd
 * arriving then is an error whatever frame it came with.
 */
static size_t
conn_read_size(struct conn *c, int *bulk)
{
	struct proto_hdr	h;
	size_t			avail = c->in_len - c->in_off;

	size_t			rest, room;

	*bulk = (c->flags & CONN_F_ATTACHED) != 0;
	if (*bulk) {
		if (conn_grow(c, c->in_len + CONN_BULK) != 0)
			return 0;
		return c->in_cap - c->in_len;
	}
	if (avail < CONN_HDR)
		return CONN_HDR - avail;
	/*
	 * The rest of the payload, as far as the buffer reaches; a full buffer
	 * doubles. It grows with the bytes that came, so a header promising
	 * 16 MiB and sending nothing holds 4 KiB.
	 */
	memcpy(&h, c->in + c->in_off, CONN_HDR);
	rest = CONN_HDR + h.length - avail;
	if (c->in_len == c->in_cap && conn_grow(c, c->in_len + 1) != 0)
		return 0;
	room = c->in_cap - c->in_len;
	return rest < room ? rest : room;
}

/*
 * Reads once. Returns 2 when bytes came and the socket had no more than
 * that (a short read), 1 when bytes came and more may wait, 0 when none
 * are there now, -1 when closing.
 */
static int
conn_fill(struct conn *c)
{
	char	why[128];
	ssize_t	n;
	size_t	want;
	int	bulk, had_fds = CONN_HAS_FDS(c), fds_before = c->in_nfds, in_header, lost = 0;

	if (conn_grow(c, CONN_HDR) != 0) {
		conn_fail(c, NULL, PROTO_S_NO_MEMORY, "out of memory");
		return -1;
	}
	if ((want = conn_read_size(c, &bulk)) == 0) {
		conn_fail(c, NULL, PROTO_S_NO_MEMORY, "out of memory");
		return -1;
	}
	in_header = c->in_len - c->in_off < CONN_HDR;
	n = conn_recv(c, want, &lost);
	if (n == -EAGAIN || n == -EINTR)
		return 0;
	if (n == -EMSGSIZE) {
		conn_fail(c, NULL, PROTO_S_UNEXPECTED_FDS, "more fds than a frame may carry");
		return -1;
	}
	if (n > 0 && (c->in_nfds != fds_before || lost)) {
		if (!bulk && !in_header) {
			conn_fail(c, NULL, PROTO_S_UNEXPECTED_FDS, lost ? "fds arrived inside a "
			    "payload (and the kernel dropped them: MSG_CTRUNC)" :
			    "fds arrived inside a payload");
			return -1;
		}
		if (had_fds) {
			conn_fail(c, NULL, PROTO_S_UNEXPECTED_FDS, "fds of two frames at once");
			return -1;
		}
		if (lost)
			c->flags |= CONN_F_FDS_LOST;
		/* Exact reads hold one frame: it alone may take them. */
		c->fds_until = bulk ? c->in_len + (size_t)n : c->in_off;
	}
	if (n < 0) {
		log_debug("conn", "conn %llu: read: %s", (unsigned long long)c->id,
		    strerror((int)-n));
		c->flags |= CONN_F_PEER_GONE;
		conn_close(c);
		return -1;
	}
	if (n == 0) {
		size_t avail = c->in_len - c->in_off;

		/* The peer reads what is left of our replies, if it wants; nothing to linger for. */
		c->flags |= CONN_F_PEER_GONE;
		if (avail == 0)
			conn_close(c);
		else if (avail < CONN_HDR)
			conn_fail(c, NULL, PROTO_S_SHORT_HEADER, "stream ended inside a frame header");
		else {
			struct proto_hdr h;

			memcpy(&h, c->in + c->in_off, CONN_HDR);
			snprintf(why, sizeof(why), "stream ended after %zu of %u payload bytes",
			    avail - CONN_HDR, h.length);
			conn_fail(c, &h, PROTO_S_TRUNCATED, why);
		}
		return -1;
	}
	c->in_len += (size_t)n;
	metrics.bytes_in += (uint64_t)n;
	return (size_t)n < want ? 2 : 1;
}

/*
 * Handles what the socket holds, up to CONN_FRAMES_PER_WAKEUP frames.
 * Replies wait in c->out and leave together in one write at the end,
 * so that a client sending several frames at once is answered with one
 * syscall and one wakeup. A short read means the socket was empty: the
 * loop is level-triggered, so it comes back for bytes that arrive after,
 * and no read is spent learning that nothing is there.
 */
static void
conn_read_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct conn	*c = arg;
	int		 frames = 0, rc = 0, drained = 0;

	(void)fd;
	(void)ev;
	c->wake_ns = server_now_ns();
	c->flags |= CONN_F_READING;
	for (;;) {
		while (!(c->flags & CONN_F_OVER) && (rc = conn_next_frame(c)) > 0)
			if (++frames >= CONN_FRAMES_PER_WAKEUP)
				break;
		if (rc < 0)
			break;
		/* Replies over the bound: the rest waits for conn_under(). */
		if (c->flags & CONN_F_OVER)
			break;
		if (frames >= CONN_FRAMES_PER_WAKEUP) {
			/* Yield; frames already buffered must not wait for new bytes. */
			if (c->in_len > c->in_off)
				event_active(c->ev_read, EV_READ, 0);
			break;
		}
		if (drained || (rc = conn_fill(c)) <= 0)
			break;
		drained = rc == 2;
	}
	c->flags &= ~CONN_F_READING;
	/* Part of a frame held: the frame deadline runs from the first wakeup that saw it. */
	if (!(c->flags & (CONN_F_DEAD | CONN_F_PARTIAL)) && c->in_len > c->in_off) {
		c->flags |= CONN_F_PARTIAL;
		c->frame_ms = server_now_ms();
	}
	if (!(c->flags & CONN_F_REAPED))
		conn_timer_update(c);
	/* conn_close() left what it found to the write event. */
	if (!(c->flags & CONN_F_REAPED) && c->out_len > c->out_off &&
	    !event_pending(c->ev_write, EV_WRITE, NULL))
		conn_flush(c);
}
