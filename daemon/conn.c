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
 * its last reply is flushed.
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

static void	conn_read_cb(evutil_socket_t, short, void *);
static void	conn_write_cb(evutil_socket_t, short, void *);
static void	conn_close_fds(struct conn *);

/* Returns a new connection owned by the server's list; takes fd. */
struct conn *
conn_new(struct server *s, int fd, uid_t uid, gid_t gid, pid_t pid)
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
	c->id = ++s->next_conn_id;
	for (i = 0; i < PROTO_FDS_MAX; i++)
		c->in_fds[i] = -1;
	c->ev_read = event_new(s->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
	c->ev_write = event_new(s->base, fd, EV_WRITE, conn_write_cb, c);
	if (c->ev_read == NULL || c->ev_write == NULL || event_add(c->ev_read, NULL) != 0) {
		c->fd = -1;	/* the caller still owns fd on failure */
		conn_free(c);
		return NULL;
	}
	TAILQ_INSERT_TAIL(&s->conns, c, entry);
	s->nconns++;
	metrics.connections_open++;
	return c;
}

/* Frees a connection and everything it owns. Idempotent fields. */
void
conn_free(struct conn *c)
{
	if (c == NULL)
		return;
	if (c->session != NULL) {
		session_close(c->session);
		c->session = NULL;
	}
	conn_close_fds(c);
	if (c->ev_read != NULL)
		event_free(c->ev_read);
	if (c->ev_write != NULL)
		event_free(c->ev_write);
	free(c->out);
	free(c->in);
	if (c->fd >= 0) {
		close(c->fd);
		TAILQ_REMOVE(&c->server->conns, c, entry);
		c->server->nconns--;
		metrics.connections_open--;
		server_conn_closed(c->server, c);
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
	if (c->out_len == c->out_off)
		conn_reap(c);
	else if (!event_pending(c->ev_write, EV_WRITE, NULL))
		event_add(c->ev_write, NULL);
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
			return;
		}
		/* The peer is gone: nothing more can be delivered. */
		conn_out_reset(c);
		if (!(c->flags & CONN_F_DEAD))
			log_debug("conn", "conn %llu: write: %s", (unsigned long long)c->id,
			    strerror(errno));
		c->flags |= CONN_F_DEAD;
		event_del(c->ev_read);
		break;
	}
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
	char			dump[512];
	uint8_t			*p;
	size_t			 need, cap;

	if (c->flags & CONN_F_REAPED)
		return -EPIPE;
	proto_hdr_init(&h, req != NULL ? req->type : PROTO_T_ERROR, len, req != NULL ? req->seq : 0);
	h.flags = PROTO_F_REPLY;
	h.status = (uint16_t)status;
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

/* Takes any fds out of a received control message. */
static int
conn_take_fds(struct conn *c, struct msghdr *msg)
{
	struct cmsghdr	*cm;
	int		 n, i, extra = 0;

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
	if (msg->msg_flags & MSG_CTRUNC)
		extra = 1;
	return extra ? -EMSGSIZE : 0;
}

/*
 * Reads toward the current frame: the header first, then the payload.
 * Returns bytes read, 0 at EOF, or -errno.
 */
static ssize_t
conn_recv(struct conn *c, size_t want)
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
	if (msg.msg_controllen > 0 && conn_take_fds(c, &msg) != 0)
		return -EMSGSIZE;
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
	if ((st = proto_hdr_check(&h, c->server->cfg->max_frame)) != 0) {
		snprintf(dump, sizeof(dump), "%s (type %u, length %u)", proto_status_text(st),
		    h.type, h.length);
		conn_fail(c, st == PROTO_S_BAD_MAGIC || st == PROTO_S_BAD_TYPE ? NULL : &h, st,
		    dump);
		return -1;
	}
	if (avail < CONN_HDR + h.length) {
		/* Make room for the whole frame at the front of the buffer. */
		if (c->in_off > 0) {
			memmove(c->in, c->in + c->in_off, avail);
			c->fds_until = c->fds_until > c->in_off ? c->fds_until - c->in_off : 0;
			c->in_len = avail;
			c->in_off = 0;
		}
		if (conn_grow(c, CONN_HDR + h.length) != 0) {
			conn_fail(c, &h, PROTO_S_NO_MEMORY, "out of memory for the payload");
			return -1;
		}
		return 0;
	}
	/*
	 * Fds from a bulk read wait for the frame flagged as carrying them,
	 * which must start in the bytes read with them; frames before it in
	 * those bytes pass them by.
	 */
	take_fds = c->in_nfds > 0 && (h.flags & PROTO_F_FDS);
	if (c->in_nfds > 0 && !take_fds && c->in_off >= c->fds_until) {
		conn_fail(c, &h, PROTO_S_UNEXPECTED_FDS, "fds on a frame not flagged as carrying them");
		return -1;
	}
	if (take_fds && h.type != PROTO_T_ATTACH) {
		conn_fail(c, &h, PROTO_S_UNEXPECTED_FDS, "fds on a frame that takes none");
		return -1;
	}
	if ((st = proto_payload_check(h.type, h.length, c->in + c->in_off + CONN_HDR)) != 0) {
		snprintf(dump, sizeof(dump), "%u payload bytes are wrong for %s", h.length,
		    proto_type_name(h.type));
		conn_fail(c, &h, st, dump);
		return -1;
	}

	metrics.frames_in++;
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
	dispatch_frame(c, &f);
	/* The dispatcher borrowed the fds; mappings outlive them. */
	if (take_fds)
		conn_close_fds(c);
	c->in_off += CONN_HDR + h.length;
	if (c->in_nfds > 0 && c->in_off >= c->fds_until && !(c->flags & CONN_F_DEAD)) {
		conn_fail(c, NULL, PROTO_S_UNEXPECTED_FDS, "fds no frame was flagged to carry");
		return -1;
	}
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

	*bulk = c->session != NULL;
	if (*bulk) {
		if (conn_grow(c, c->in_len + CONN_BULK) != 0)
			return 0;
		return c->in_cap - c->in_len;
	}
	if (avail < CONN_HDR)
		return CONN_HDR - avail;
	memcpy(&h, c->in + c->in_off, CONN_HDR);
	return CONN_HDR + h.length - avail;	/* conn_next_frame() made room */
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
	int	bulk, fds_before = c->in_nfds, in_header;

	if (conn_grow(c, CONN_HDR) != 0) {
		conn_fail(c, NULL, PROTO_S_NO_MEMORY, "out of memory");
		return -1;
	}
	if ((want = conn_read_size(c, &bulk)) == 0) {
		conn_fail(c, NULL, PROTO_S_NO_MEMORY, "out of memory");
		return -1;
	}
	in_header = c->in_len - c->in_off < CONN_HDR;
	n = conn_recv(c, want);
	if (n == -EAGAIN || n == -EINTR)
		return 0;
	if (n == -EMSGSIZE) {
		conn_fail(c, NULL, PROTO_S_UNEXPECTED_FDS, "more fds than a frame may carry");
		return -1;
	}
	if (n > 0 && c->in_nfds != fds_before) {
		if (!bulk && !in_header) {
			conn_fail(c, NULL, PROTO_S_UNEXPECTED_FDS, "fds arrived inside a payload");
			return -1;
		}
		if (fds_before > 0) {
			conn_fail(c, NULL, PROTO_S_UNEXPECTED_FDS, "fds of two frames at once");
			return -1;
		}
		/* Exact reads hold one frame: it alone may take them. */
		c->fds_until = bulk ? c->in_len + (size_t)n : c->in_off;
	}
	if (n < 0) {
		log_debug("conn", "conn %llu: read: %s", (unsigned long long)c->id,
		    strerror((int)-n));
		conn_close(c);
		return -1;
	}
	if (n == 0) {
		size_t avail = c->in_len - c->in_off;

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
	int		 frames = 0, rc, drained = 0;

	(void)fd;
	(void)ev;
	c->flags |= CONN_F_READING;
	for (;;) {
		while ((rc = conn_next_frame(c)) > 0)
			if (++frames >= CONN_FRAMES_PER_WAKEUP)
				break;
		if (rc < 0)
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
	/* conn_close() left what it found to the write event. */
	if (!(c->flags & CONN_F_REAPED) && c->out_len > c->out_off &&
	    !event_pending(c->ev_write, EV_WRITE, NULL))
		conn_flush(c);
}
