/*
 * libl3kv without a daemon: error texts, connecting to nothing, and a
 * fake server scripted per test that answers out of order, lies, stalls
 * or hangs up, to pin down what the library does in each case.
 *
 * The fake server is a forked child accepting on a socket in a mkdtemp
 * directory; it speaks the protocol through proto.c and reports a broken
 * expectation by its exit status, which the test asserts. Every test
 * counts its fds before and after.
 */
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "l3kv.h"
#include "proto.h"
#include "tests.h"

/* A script answers one connection; it returns the child's exit status. */
typedef int (*fake_script)(int fd);

struct fake {
	char	dir[PATH_MAX];
	char	sock[PATH_MAX];
	pid_t	pid;
};

static int64_t
ct_now_ms(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * A Unix socket bound at dir/name, listening when backlog > 0 (a bound
 * socket that never listens refuses connections); path gets its name.
 */
static int
ct_bind(const char *dir, const char *name, int backlog, char *path, size_t len)
{
	struct sockaddr_un	sun;
	int			s, n;

	n = snprintf(path, len, "%s/%s", dir, name);
	ck_assert(n > 0 && (size_t)n < len && (size_t)n < sizeof(sun.sun_path));
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, (size_t)n);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(s, 0);
	ck_assert_int_eq(bind(s, (struct sockaddr *)&sun, sizeof(sun)), 0);
	if (backlog > 0)
		ck_assert_int_eq(listen(s, backlog), 0);
	return s;
}

/* Reads len bytes into buf, or sends them from it when out is set; -1 short of that. */
static int
fake_io_full(int fd, uint8_t *buf, size_t len, int out)
{
	ssize_t	n;

	while (len > 0) {
		n = out ? send(fd, buf, len, MSG_NOSIGNAL) : read(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

static int
fake_read_full(int fd, void *buf, size_t len)
{
	return fake_io_full(fd, buf, len, 0);
}

static int
fake_write_full(int fd, const void *buf, size_t len)
{
	return fake_io_full(fd, (uint8_t *)(uintptr_t)buf, len, 1);
}

/*
 * Reads one frame the way l3kvd does: the header by recvmsg, which is
 * where fds must arrive, then exactly the payload. *payload is malloc'd.
 */
static int
fake_read_frame(int fd, struct proto_hdr *h, uint8_t **payload, int *fds, int *nfds)
{
	union {
		struct cmsghdr	hdr;
		char		buf[CMSG_SPACE(sizeof(int) * PROTO_FDS_MAX)];
	} cbuf;
	struct msghdr	 msg;
	struct cmsghdr	*cm;
	struct iovec	 iov;
	ssize_t		 n;
	size_t		 got;

	*payload = NULL;
	if (nfds != NULL)
		*nfds = 0;
	iov.iov_base = h;
	iov.iov_len = sizeof(*h);
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cbuf.buf;
	msg.msg_controllen = sizeof(cbuf.buf);
	do
		n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return -1;
	for (cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && nfds != NULL) {
			*nfds = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			memcpy(fds, CMSG_DATA(cm), sizeof(int) * (size_t)*nfds);
		}
	}
	got = (size_t)n;
	if (got < sizeof(*h) && fake_read_full(fd, (uint8_t *)h + got, sizeof(*h) - got) != 0)
		return -1;
	if (proto_hdr_check(h, PROTO_FRAME_MAX) != 0)
		return -1;
	*payload = malloc((size_t)h->length + 1);
	if (*payload == NULL || fake_read_full(fd, *payload, h->length) != 0)
		return -1;
	return 0;
}

/*
 * Sends a header with fields chosen by the test, and n payload bytes, in
 * one write: a client that hangs up after a bad header must not make the
 * fake fail on the payload's write.
 */
static int
fake_send_raw(int fd, unsigned type, unsigned flags, unsigned status, uint32_t length,
    uint64_t seq, const void *payload, size_t n)
{
	struct proto_hdr	 h;
	uint8_t			*buf;
	int			 rc;

	proto_hdr_init(&h, type, length, seq);
	h.flags = (uint16_t)flags;
	h.status = (uint16_t)status;
	if ((buf = malloc(sizeof(h) + n)) == NULL)
		return -1;
	memcpy(buf, &h, sizeof(h));
	if (n > 0)
		memcpy(buf + sizeof(h), payload, n);
	rc = fake_write_full(fd, buf, sizeof(h) + n);
	free(buf);
	return rc;
}

/* Sends a reply frame to req with status and payload. */
static int
fake_reply(int fd, const struct proto_hdr *req, unsigned status, const void *payload,
    uint32_t len)
{
	return fake_send_raw(fd, req->type, PROTO_F_REPLY, status, len, req->seq, payload, len);
}

/* Reads the next request and checks its type; frees the payload. */
static int
fake_expect(int fd, unsigned type, struct proto_hdr *h)
{
	uint8_t	*p;
	int	 rc;

	rc = fake_read_frame(fd, h, &p, NULL, NULL);
	free(p);
	return rc == 0 && h->type == type ? 0 : -1;
}

/* Answers the HELLO every connection starts with. */
static int
fake_hello(int fd)
{
	struct proto_hello_reply	 r;
	struct proto_hello		 hello;
	struct proto_hdr		 h;
	uint8_t				*p;
	uint16_t			 v;

	if (fake_read_frame(fd, &h, &p, NULL, NULL) != 0 || h.type != PROTO_T_HELLO ||
	    h.length != sizeof(hello)) {
		free(p);
		return -1;
	}
	memcpy(&hello, p, sizeof(hello));
	free(p);
	if (proto_hello_check(&hello, &v) != 0 || h.seq == 0)
		return -1;
	memset(&r, 0, sizeof(r));
	r.version = v;
	r.caps = PROTO_CAP_HOST_COPY | PROTO_CAP_NONBLOCK;
	r.max_frame = 1U << 20;
	r.lease_ttl_ms = 1234;
	strcpy(r.server, "fake 0.0");
	strcpy(r.role, "decode");
	return fake_reply(fd, &h, 0, &r, sizeof(r));
}

/* Reads until the client hangs up. */
static int
fake_drain(int fd)
{
	char	buf[4096];
	ssize_t	n;

	while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR))
		;
	return 0;
}

/*
 * Starts a fake that answers the HELLO (when hello is set) and then runs
 * the script on the connection.
 */
static void
fake_start(struct fake *f, fake_script script, int hello)
{
	int	lfd, fd, rc;

	memset(f, 0, sizeof(*f));
	ck_assert_ptr_nonnull(test_mkdtemp(f->dir, sizeof(f->dir)));
	lfd = ct_bind(f->dir, "fake.sock", 4, f->sock, sizeof(f->sock));
	f->pid = fork();
	ck_assert_int_ge(f->pid, 0);
	if (f->pid == 0) {
		alarm(10);	/* a fake that hangs must not hang the suite */
		fd = accept(lfd, NULL, NULL);
		close(lfd);
		rc = fd < 0 ? 100 : hello && fake_hello(fd) != 0 ? 101 : script(fd);
		if (fd >= 0)
			close(fd);
		_exit(rc);
	}
	close(lfd);
}

/* Waits for the fake (killing it after 3 s) and returns its exit status. */
static int
fake_stop(struct fake *f)
{
	int	st = 0, i;
	pid_t	r = 0;

	for (i = 0; i < 300 && (r = waitpid(f->pid, &st, WNOHANG)) == 0; i++)
		poll(NULL, 0, 10);
	if (r == 0) {
		kill(f->pid, SIGKILL);
		waitpid(f->pid, &st, 0);
	}
	test_rmtree(f->dir);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A test's connection to its fake, and the fds that were open before either. */
struct ct_conn {
	struct fake	 f;
	struct l3kv	*k;
	int		 fds;
};

/*
 * Counts the fds open, starts a fake that runs script (after answering
 * the HELLO when hello is set) and connects to it: l3kv_connect() must
 * return want. Returns the connection, NULL when it failed.
 */
static struct l3kv *
ct_open_with(struct ct_conn *c, fake_script script, int hello, int want)
{
	c->fds = test_fd_count();
	c->k = NULL;
	fake_start(&c->f, script, hello);
	ck_assert_int_eq(l3kv_connect(c->f.sock, 2000, &c->k), want);
	return c->k;
}

static struct l3kv *
ct_open(struct ct_conn *c, fake_script script)
{
	return ct_open_with(c, script, 1, 0);
}

/*
 * Closes the connection; the fake must exit 0 (every expectation of its
 * script met), and no fd be left open that was not before ct_open().
 */
static void
ct_close(struct ct_conn *c)
{
	l3kv_close(c->k);
	c->k = NULL;
	ck_assert_int_eq(fake_stop(&c->f), 0);
	ck_assert_int_eq(test_fd_count(), c->fds);
}

/* Asserts that what began at t0 took at least min_ms and less than max_ms. */
static void
ct_assert_took(int64_t t0, int64_t min_ms, int64_t max_ms)
{
	int64_t	dt = ct_now_ms() - t0;

	ck_assert_int_ge(dt, min_ms);
	ck_assert_int_lt(dt, max_ms);
}

/*
 * Connecting to path, where no daemon answers, fails with err at once
 * (well within its 5 s timeout) and leaves no connection.
 */
static void
ct_assert_connect_fails_fast(const char *path, int err)
{
	struct l3kv	*k = (struct l3kv *)&k;
	int64_t		 t0;

	t0 = ct_now_ms();
	ck_assert_int_eq(l3kv_connect(path, 5000, &k), err);
	ct_assert_took(t0, 0, 500);
	ck_assert_ptr_null(k);
}

/* Waits on l3kv_fd() for the next completion. */
static int
ct_next(struct l3kv *k, struct l3kv_completion *c, int timeout_ms)
{
	struct pollfd	pfd = { .fd = l3kv_fd(k), .events = POLLIN };
	int64_t		end = ct_now_ms() + timeout_ms;
	int		rc;

	for (;;) {
		if ((rc = l3kv_poll_completion(k, c)) != -EAGAIN)
			return rc;
		if (ct_now_ms() >= end)
			return -ETIMEDOUT;
		poll(&pfd, 1, (int)(end - ct_now_ms()));
	}
}

static int
ct_readable(const struct l3kv *k)
{
	struct pollfd	pfd = { .fd = l3kv_fd(k), .events = POLLIN };

	return poll(&pfd, 1, 0) == 1;
}

START_TEST(test_strerror_covers_every_status)
{
	unsigned	s;
	const char	*t;

	for (s = 1; s < PROTO_S__MAX; s++) {
		t = l3kv_strerror(proto_status_errno(s));
		ck_assert_ptr_nonnull(t);
		ck_assert_msg(t[0] != '\0', "status %s has no text", proto_status_name(s));
	}
	ck_assert_str_eq(l3kv_strerror(0), "success");
	/* Mapped uniquely, and never a local error: the protocol's words. */
	ck_assert_str_eq(l3kv_strerror(-EXDEV), proto_status_text(PROTO_S_GROUP_MISMATCH));
	ck_assert_str_eq(l3kv_strerror(-EUSERS), proto_status_text(PROTO_S_LIMIT));
	ck_assert_str_eq(l3kv_strerror(-EPROTONOSUPPORT), proto_status_text(PROTO_S_BAD_VERSION));
	/* Shared by several statuses, or also a local error: libc's words. */
	ck_assert_str_eq(l3kv_strerror(-EPROTO), strerror(EPROTO));
	ck_assert_str_eq(l3kv_strerror(-ENOENT), strerror(ENOENT));
	ck_assert_str_eq(l3kv_strerror(-ECONNREFUSED), strerror(ECONNREFUSED));
	ck_assert_str_eq(l3kv_strerror(-EINVAL), strerror(EINVAL));
	ck_assert_ptr_nonnull(l3kv_strerror(-12345));
	ck_assert_str_eq(l3kv_strerror(EXDEV), l3kv_strerror(-EXDEV));
}
END_TEST

START_TEST(test_connect_to_a_missing_socket_is_enoent_fast)
{
	char	dir[PATH_MAX], path[PATH_MAX + 16];
	int	fds = test_fd_count();

	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	ck_assert_int_lt(snprintf(path, sizeof(path), "%s/none.sock", dir), (int)sizeof(path));
	ct_assert_connect_fails_fast(path, -ENOENT);
	test_rmtree(dir);
	ck_assert_int_eq(test_fd_count(), fds);
}
END_TEST

START_TEST(test_connect_where_nothing_listens_is_refused_fast)
{
	char	dir[PATH_MAX], path[PATH_MAX];
	int	fds = test_fd_count();

	/* A socket file whose listener is gone: what a crashed daemon leaves. */
	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	close(ct_bind(dir, "stale.sock", 0, path, sizeof(path)));
	ct_assert_connect_fails_fast(path, -ECONNREFUSED);
	test_rmtree(dir);
	ck_assert_int_eq(test_fd_count(), fds);
}
END_TEST

START_TEST(test_connect_rejects_bad_arguments)
{
	struct l3kv	*k = NULL;
	char		 longpath[200];

	memset(longpath, 'p', sizeof(longpath) - 1);
	longpath[sizeof(longpath) - 1] = '\0';
	ck_assert_int_eq(l3kv_connect(longpath, 100, &k), -ENAMETOOLONG);
	ck_assert_int_eq(l3kv_connect("x", 100, NULL), -EINVAL);
	ck_assert_int_eq(l3kv_connect("x", -2, &k), -EINVAL);
	l3kv_close(NULL);
}
END_TEST

START_TEST(test_default_socket_follows_the_environment)
{
	unsetenv(L3KV_SOCKET_ENV);
	ck_assert_str_eq(l3kv_default_socket(), L3KV_SOCKET_DEFAULT);
	setenv(L3KV_SOCKET_ENV, "", 1);
	ck_assert_str_eq(l3kv_default_socket(), L3KV_SOCKET_DEFAULT);
	setenv(L3KV_SOCKET_ENV, "/run/l3kv/x.sock", 1);
	ck_assert_str_eq(l3kv_default_socket(), "/run/l3kv/x.sock");
	unsetenv(L3KV_SOCKET_ENV);
}
END_TEST

static int
script_hello_info(int fd)
{
	return fake_drain(fd);
}

START_TEST(test_connect_reads_the_hello_reply)
{
	struct l3kv_server_info	 info;
	struct ct_conn		 cn;
	struct l3kv		*k;

	k = ct_open(&cn, script_hello_info);
	ck_assert_int_eq(l3kv_server_info(k, &info), 0);
	ck_assert_uint_eq(info.protocol, 1);
	ck_assert_uint_eq(info.caps, L3KV_CAP_HOST_COPY | L3KV_CAP_NONBLOCK);
	ck_assert_uint_eq(info.max_frame, 1U << 20);
	ck_assert_uint_eq(info.lease_ttl_ms, 1234);
	ck_assert_str_eq(info.server, "fake 0.0");
	ck_assert_str_eq(info.role, "decode");
	ck_assert_int_ge(l3kv_fd(k), 0);
	ck_assert(!ct_readable(k));
	ck_assert_int_eq(l3kv_last_status(k), 0);
	ck_assert_str_eq(l3kv_last_error(k), "");
	ct_close(&cn);
}
END_TEST

/*
 * Reads a STATS and a HEALTH, then answers {"a":1} to the STATS and
 * {"b":2} to the HEALTH: in that order, or the HEALTH first when
 * reverse is set.
 */
static int
fake_stats_health(int fd, int reverse)
{
	static const char *const	json[2] = { "{\"a\":1}", "{\"b\":2}" };
	struct proto_hdr		h[2];
	int				i, j;

	if (fake_expect(fd, PROTO_T_STATS, &h[0]) != 0 || fake_expect(fd, PROTO_T_HEALTH, &h[1]) != 0)
		return 1;
	for (i = 0; i < 2; i++) {
		j = reverse ? 1 - i : i;
		if (fake_reply(fd, &h[j], 0, json[j], 7) != 0)
			return 2;
	}
	return fake_drain(fd);
}

/* Two requests answered in reverse order. */
static int
script_reverse(int fd)
{
	return fake_stats_health(fd, 1);
}

START_TEST(test_replies_out_of_order_reach_their_tickets)
{
	struct l3kv_completion	 c1, c2;
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint64_t		 ta, tb;

	k = ct_open(&cn, script_reverse);
	ck_assert_int_eq(l3kv_submit_stats(k, &ta), 0);
	ck_assert_int_eq(l3kv_submit_health(k, &tb), 0);
	ck_assert_uint_ne(ta, 0);
	ck_assert_uint_gt(tb, ta);
	ck_assert_int_eq(ct_next(k, &c1, 2000), 0);
	ck_assert_int_eq(ct_next(k, &c2, 2000), 0);
	ck_assert_uint_eq(c1.ticket, tb);
	ck_assert_int_eq(c1.op, L3KV_OP_HEALTH);
	ck_assert_int_eq(c1.status, 0);
	ck_assert_uint_eq(c1.len, 7);
	ck_assert_str_eq(c1.payload, "{\"b\":2}");
	ck_assert_uint_eq(c2.ticket, ta);
	ck_assert_int_eq(c2.op, L3KV_OP_STATS);
	ck_assert_str_eq(c2.payload, "{\"a\":1}");
	l3kv_completion_release(&c1);
	l3kv_completion_release(&c2);
	l3kv_completion_release(&c2);
	ck_assert_ptr_null(c2.payload);
	ck_assert_int_eq(l3kv_poll_completion(k, &c1), -EAGAIN);
	ck_assert(!ct_readable(k));
	ct_close(&cn);
}
END_TEST

/* A submitted STATS answered while a blocking HEALTH waits. */
static int
script_answer_both(int fd)
{
	return fake_stats_health(fd, 0);
}

START_TEST(test_blocking_call_queues_other_completions)
{
	struct l3kv_completion	 c;
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint64_t		 ta;
	char			*json;

	k = ct_open(&cn, script_answer_both);
	ck_assert_int_eq(l3kv_submit_stats(k, &ta), 0);
	ck_assert_int_eq(l3kv_health(k, &json), 0);
	ck_assert_str_eq(json, "{\"b\":2}");
	l3kv_free(json);
	/* The STATS reply was read by the blocking call: the fd must still say so. */
	ck_assert(ct_readable(k));
	ck_assert_int_eq(l3kv_poll_completion(k, &c), 0);
	ck_assert_uint_eq(c.ticket, ta);
	ck_assert_str_eq(c.payload, "{\"a\":1}");
	l3kv_completion_release(&c);
	ck_assert_int_eq(l3kv_poll_completion(k, &c), -EAGAIN);
	ck_assert(!ct_readable(k));
	ct_close(&cn);
}
END_TEST

/* Answers three STATS, each as soon as it is read, then a HEALTH. */
static int
script_three_stats(int fd)
{
	struct proto_hdr	h;
	int			i;

	for (i = 0; i < 3; i++)
		if (fake_expect(fd, PROTO_T_STATS, &h) != 0 || fake_reply(fd, &h, 0, "{}", 2) != 0)
			return 1;
	if (fake_expect(fd, PROTO_T_HEALTH, &h) != 0 || fake_reply(fd, &h, 0, "{}", 2) != 0)
		return 2;
	return fake_drain(fd);
}

START_TEST(test_corked_requests_wait_for_uncork_and_complete_in_order)
{
	struct l3kv_completion	 c[4];
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint64_t		 t[3];
	char			*json;
	int			 i, j, n = 0, rc;

	k = ct_open(&cn, script_three_stats);
	ck_assert_int_eq(l3kv_cork(k), 0);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(l3kv_submit_stats(k, &t[i]), 0);
	/* The fake answers what it reads at once: nothing was sent, nothing comes. */
	poll(NULL, 0, 100);
	ck_assert(!ct_readable(k));
	ck_assert_int_eq(l3kv_uncork(k), 0);
	for (i = 0; i < 100 && n < 3; i++) {
		poll(NULL, 0, 10);
		if ((rc = l3kv_poll_completions(k, c, 4)) == -EAGAIN)
			continue;
		ck_assert_int_gt(rc, 0);
		for (j = 0; j < rc; j++, n++) {
			ck_assert_uint_eq(c[j].ticket, t[n]);
			ck_assert_int_eq(c[j].status, 0);
			ck_assert_str_eq(c[j].payload, "{}");
			l3kv_completion_release(&c[j]);
		}
	}
	ck_assert_int_eq(n, 3);
	ck_assert_int_eq(l3kv_health(k, &json), 0);
	l3kv_free(json);
	ct_close(&cn);
}
END_TEST

START_TEST(test_poll_completions_takes_a_batch_and_keeps_the_rest_pollable)
{
	struct l3kv_completion	 c[2];
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint64_t		 t[3];
	char			*json;
	int			 i;

	k = ct_open(&cn, script_three_stats);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(l3kv_submit_stats(k, &t[i]), 0);
	/* The blocking call reads the three STATS replies before its own. */
	ck_assert_int_eq(l3kv_health(k, &json), 0);
	l3kv_free(json);
	ck_assert(ct_readable(k));
	ck_assert_int_eq(l3kv_poll_completions(k, c, 0), -EINVAL);
	ck_assert_int_eq(l3kv_poll_completions(k, c, 2), 2);
	ck_assert_uint_eq(c[0].ticket, t[0]);
	ck_assert_uint_eq(c[1].ticket, t[1]);
	l3kv_completion_release(&c[0]);
	l3kv_completion_release(&c[1]);
	/* One is left: the fd must still say so. */
	ck_assert(ct_readable(k));
	ck_assert_int_eq(l3kv_poll_completions(k, c, 2), 1);
	ck_assert_uint_eq(c[0].ticket, t[2]);
	ck_assert_str_eq(c[0].payload, "{}");
	l3kv_completion_release(&c[0]);
	ck_assert(!ct_readable(k));
	ck_assert_int_eq(l3kv_poll_completions(k, c, 2), -EAGAIN);
	ct_close(&cn);
}
END_TEST

static int
script_bad_magic(int fd)
{
	struct proto_hdr	h, r;

	if (fake_expect(fd, PROTO_T_STATS, &h) != 0)
		return 1;
	proto_hdr_init(&r, PROTO_T_STATS, 0, h.seq);
	r.flags = PROTO_F_REPLY;
	r.magic = 0x12345678;
	if (fake_write_full(fd, &r, sizeof(r)) != 0)
		return 2;
	return fake_drain(fd);
}

START_TEST(test_reply_with_bad_magic_is_eproto_and_breaks)
{
	struct l3kv_completion	 c;
	struct ct_conn		 cn;
	struct l3kv		*k;
	char			*json = NULL;
	uint64_t		 t;

	k = ct_open(&cn, script_bad_magic);
	ck_assert_int_eq(l3kv_stats(k, &json), -EPROTO);
	ck_assert_ptr_null(json);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: reply with bad magic 0x12345678");
	ck_assert_int_eq(l3kv_last_status(k), 0);
	/* Broken for good, and the fd says so. */
	ck_assert_int_eq(l3kv_stats(k, &json), -ENOTCONN);
	ck_assert_int_eq(l3kv_submit_stats(k, &t), -ENOTCONN);
	ck_assert(ct_readable(k));
	ck_assert_int_eq(l3kv_poll_completion(k, &c), -ENOTCONN);
	ct_close(&cn);
}
END_TEST

/*
 * Replies to a STATS that libl3kv cannot parse: the header each sends,
 * its seq the request's plus seq_off, with the payload bytes (none,
 * whatever the length says, when NULL), and what l3kv_last_error() says
 * about it.
 */
static const struct ct_bad_reply {
	unsigned	 type;
	unsigned	 flags;
	uint32_t	 length;
	uint64_t	 seq_off;
	const char	*payload;
	const char	*error;
} ct_bad_replies[] = {
	{ PROTO_T_STATS, PROTO_F_REPLY, PROTO_FRAME_MAX + 1, 0, NULL,
	    "libl3kv: reply of 67108865 bytes is over the protocol's 67108864" },
	{ PROTO_T_STATS, PROTO_F_REPLY, 2, 100, "{}",
	    "libl3kv: STATS reply to seq 102, which is not in flight" },
	{ PROTO_T_HEALTH, PROTO_F_REPLY, 2, 0, "{}", "libl3kv: HEALTH reply to seq 2, a STATS request" },
	{ PROTO_T_STATS, 0, 2, 0, "{}", "libl3kv: reply with flags 0x0" },
};

/* The reply script_bad_reply() sends: set by the test before the fake forks. */
static const struct ct_bad_reply	*ct_bad_reply;

static int
script_bad_reply(int fd)
{
	const struct ct_bad_reply	*b = ct_bad_reply;
	struct proto_hdr		 h;

	if (fake_expect(fd, PROTO_T_STATS, &h) != 0 ||
	    fake_send_raw(fd, b->type, b->flags, 0, b->length, h.seq + b->seq_off, b->payload,
	    b->payload != NULL ? strlen(b->payload) : 0) != 0)
		return 1;
	return fake_drain(fd);
}

START_TEST(test_unparseable_replies_are_eproto)
{
	struct ct_conn	 cn;
	struct l3kv	*k;
	char		*json = NULL;

	ct_bad_reply = &ct_bad_replies[_i];
	k = ct_open(&cn, script_bad_reply);
	ck_assert_int_eq(l3kv_stats(k, &json), -EPROTO);
	ck_assert_str_eq(l3kv_last_error(k), ct_bad_replies[_i].error);
	ck_assert_int_eq(l3kv_health(k, &json), -ENOTCONN);
	ct_close(&cn);
}
END_TEST

static int
script_close_mid_reply(int fd)
{
	struct proto_hdr	h;

	if (fake_expect(fd, PROTO_T_STATS, &h) != 0 ||
	    fake_send_raw(fd, PROTO_T_STATS, PROTO_F_REPLY, 0, 100, h.seq, "{\"cut\":", 7) != 0)
		return 1;
	return 0;	/* closes with 93 bytes still owed */
}

START_TEST(test_close_mid_reply_fails_without_hanging)
{
	struct ct_conn	 cn;
	struct l3kv	*k;
	char		*json = NULL;
	int64_t		 t0;

	k = ct_open(&cn, script_close_mid_reply);
	ck_assert_int_eq(l3kv_set_timeout(k, L3KV_TIMEOUT_INFINITE), 0);
	t0 = ct_now_ms();
	ck_assert_int_eq(l3kv_stats(k, &json), -ECONNRESET);
	ct_assert_took(t0, 0, 1000);
	ck_assert_ptr_null(json);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: the daemon closed the connection inside a reply");
	ck_assert_int_eq(l3kv_stats(k, &json), -ENOTCONN);
	ct_close(&cn);
}
END_TEST

static int
script_silent(int fd)
{
	struct proto_hdr	h;

	if (fake_expect(fd, PROTO_T_STATS, &h) != 0)
		return 1;
	return fake_drain(fd);
}

START_TEST(test_blocking_call_times_out)
{
	struct ct_conn	 cn;
	struct l3kv	*k;
	char		*json = NULL;
	int64_t		 t0;

	k = ct_open(&cn, script_silent);
	ck_assert_int_eq(l3kv_set_timeout(k, 100), 0);
	t0 = ct_now_ms();
	ck_assert_int_eq(l3kv_stats(k, &json), -ETIMEDOUT);
	ct_assert_took(t0, 95, 1000);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: no reply to STATS within the timeout");
	ct_close(&cn);
}
END_TEST

/* Two STATS, each answered 300 ms late. */
static int
script_slow(int fd)
{
	struct proto_hdr	h;
	int			i;

	for (i = 0; i < 2; i++) {
		if (fake_expect(fd, PROTO_T_STATS, &h) != 0)
			return 1;
		poll(NULL, 0, 300);
		if (fake_reply(fd, &h, 0, "{}", 2) != 0)
			return 2;
	}
	return fake_drain(fd);
}

static int64_t
ct_thread_cpu_us(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The times this thread blocked (slept in a poll, a read, a lock). */
static long
ct_thread_sleeps(void)
{
	struct rusage	ru;

	getrusage(RUSAGE_THREAD, &ru);
	return ru.ru_nvcsw;
}

/*
 * The default spin (L3KV_SPIN_AUTO) spins only around a reply's expected
 * time: a reply 300 ms late costs the waiting thread little CPU, where a
 * fixed spin of a second never sleeps. The spin is seen by its thread not
 * blocking (no voluntary context switch): its CPU time alone says little on
 * a loaded machine, where the scheduler runs others on the spinner's core.
 */
START_TEST(test_auto_spin_sleeps_through_a_slow_reply)
{
	struct ct_conn	 cn;
	struct l3kv	*k;
	char		*json = NULL;
	int64_t		 c0, t0;
	long		 s0;

	k = ct_open(&cn, script_slow);
	ck_assert_int_eq(l3kv_set_spin(k, 1000001), -EINVAL);
	ck_assert_int_eq(l3kv_set_spin(NULL, 0), -EINVAL);
	c0 = ct_thread_cpu_us();
	s0 = ct_thread_sleeps();
	t0 = ct_now_ms();
	ck_assert_int_eq(l3kv_stats(k, &json), 0);	/* the default: auto */
	ct_assert_took(t0, 290, 5000);
	ck_assert_msg(ct_thread_cpu_us() - c0 < 50000, "auto spin took %lld us of CPU over 300 ms",
	    (long long)(ct_thread_cpu_us() - c0));
	ck_assert_msg(ct_thread_sleeps() > s0, "auto spin never slept through a 300 ms wait");
	l3kv_free(json);
	ck_assert_int_eq(l3kv_set_spin(k, 1000000), 0);
	c0 = ct_thread_cpu_us();
	s0 = ct_thread_sleeps();
	t0 = ct_now_ms();
	ck_assert_int_eq(l3kv_stats(k, &json), 0);
	ct_assert_took(t0, 290, 5000);
	ck_assert_msg(ct_thread_sleeps() == s0, "a 1 s spin slept %ld times (%lld us of CPU)",
	    ct_thread_sleeps() - s0, (long long)(ct_thread_cpu_us() - c0));
	l3kv_free(json);
	ck_assert_int_eq(l3kv_set_spin(k, L3KV_SPIN_AUTO), 0);
	ct_close(&cn);
}
END_TEST

/* The first STATS answered after the client gave up, the second at once. */
static int
script_late(int fd)
{
	struct proto_hdr	h1, h2;

	if (fake_expect(fd, PROTO_T_STATS, &h1) != 0)
		return 1;
	poll(NULL, 0, 150);
	if (fake_reply(fd, &h1, 0, "{\"late\":1}", 10) != 0 ||
	    fake_expect(fd, PROTO_T_STATS, &h2) != 0 ||
	    fake_reply(fd, &h2, 0, "{\"n\":2}", 7) != 0)
		return 2;
	return fake_drain(fd);
}

START_TEST(test_late_reply_after_timeout_is_dropped)
{
	struct l3kv_completion	 c;
	struct ct_conn		 cn;
	struct l3kv		*k;
	char			*json = NULL;

	k = ct_open(&cn, script_late);
	ck_assert_int_eq(l3kv_set_timeout(k, 50), 0);
	ck_assert_int_eq(l3kv_stats(k, &json), -ETIMEDOUT);
	ck_assert_int_eq(l3kv_set_timeout(k, 2000), 0);
	ck_assert_int_eq(l3kv_stats(k, &json), 0);
	ck_assert_str_eq(json, "{\"n\":2}");
	l3kv_free(json);
	ck_assert_str_eq(l3kv_last_error(k), "");
	/* Nobody submitted the orphan: it is never handed out. */
	ck_assert_int_eq(l3kv_poll_completion(k, &c), -EAGAIN);
	ct_close(&cn);
}
END_TEST

static int
script_busy(int fd)
{
	struct proto_hdr	h;

	if (fake_expect(fd, PROTO_T_STATS, &h) != 0 ||
	    fake_reply(fd, &h, PROTO_S_BUSY, "too busy", 8) != 0 ||
	    fake_expect(fd, PROTO_T_HEALTH, &h) != 0 ||
	    fake_reply(fd, &h, 0, "{}", 2) != 0)
		return 1;
	return fake_drain(fd);
}

START_TEST(test_error_status_maps_to_errno_and_keeps_the_connection)
{
	struct ct_conn	 cn;
	struct l3kv	*k;
	char		*json = NULL;

	k = ct_open(&cn, script_busy);
	ck_assert_int_eq(l3kv_stats(k, &json), -EBUSY);
	ck_assert_ptr_null(json);
	ck_assert_int_eq(l3kv_last_status(k), PROTO_S_BUSY);
	ck_assert_str_eq(l3kv_last_error(k), "too busy");
	ck_assert_int_eq(l3kv_health(k, &json), 0);
	ck_assert_str_eq(json, "{}");
	l3kv_free(json);
	ck_assert_int_eq(l3kv_last_status(k), 0);
	ck_assert_str_eq(l3kv_last_error(k), "");
	ct_close(&cn);
}
END_TEST

/* What l3kvd does with a frame it cannot attribute: ERROR, seq 0, close. */
static int
script_error_frame(int fd)
{
	struct proto_hdr	h;

	if (fake_expect(fd, PROTO_T_STATS, &h) != 0 ||
	    fake_send_raw(fd, PROTO_T_ERROR, PROTO_F_REPLY, PROTO_S_BAD_TYPE, 12, 0,
	    "unknown type", 12) != 0)
		return 1;
	return 0;
}

START_TEST(test_error_frame_fails_every_request_in_flight)
{
	struct l3kv_completion	 c;
	struct ct_conn		 cn;
	struct l3kv		*k;
	char			*json = NULL;
	uint64_t		 t;

	k = ct_open(&cn, script_error_frame);
	ck_assert_int_eq(l3kv_submit_stats(k, &t), 0);
	ck_assert_int_eq(ct_next(k, &c, 2000), 0);
	ck_assert_uint_eq(c.ticket, t);
	ck_assert_int_eq(c.status, -EOPNOTSUPP);
	ck_assert_int_eq(c.proto_status, PROTO_S_BAD_TYPE);
	ck_assert_str_eq(c.payload, "unknown type");
	ck_assert_int_eq(l3kv_last_status(k), PROTO_S_BAD_TYPE);
	l3kv_completion_release(&c);
	ck_assert_int_eq(l3kv_poll_completion(k, &c), -ENOTCONN);
	ck_assert_int_eq(l3kv_stats(k, &json), -ENOTCONN);
	ct_close(&cn);
}
END_TEST

/* Hangs up once the client has surely finished connecting. */
static int
script_hang_up(int fd)
{
	(void)fd;
	poll(NULL, 0, 200);
	return 0;
}

START_TEST(test_daemon_hang_up_makes_the_fd_readable)
{
	struct l3kv_completion	 c;
	struct pollfd		 pfd;
	struct ct_conn		 cn;
	struct l3kv		*k;

	k = ct_open(&cn, script_hang_up);
	pfd.fd = l3kv_fd(k);
	pfd.events = POLLIN;
	ck_assert_int_eq(poll(&pfd, 1, 2000), 1);
	ck_assert_int_eq(l3kv_poll_completion(k, &c), -ENOTCONN);
	ck_assert(ct_readable(k));
	ct_close(&cn);
}
END_TEST

START_TEST(test_connect_times_out_without_hello_reply)
{
	struct l3kv	*k = NULL;
	char		 dir[PATH_MAX], path[PATH_MAX];
	int		 fds = test_fd_count(), s, c;
	int64_t		 t0;

	/* A listener that accepts (in the kernel) but never speaks. */
	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	s = ct_bind(dir, "mute.sock", 4, path, sizeof(path));
	t0 = ct_now_ms();
	ck_assert_int_eq(l3kv_connect(path, 100, &k), -ETIMEDOUT);
	ct_assert_took(t0, 95, 1000);
	ck_assert_ptr_null(k);
	c = accept(s, NULL, NULL);
	ck_assert_int_ge(c, 0);
	close(c);
	close(s);
	test_rmtree(dir);
	ck_assert_int_eq(test_fd_count(), fds);
}
END_TEST

/* What l3kvd does to a peer it refuses: an ERROR at accept, before any HELLO, and close. */
static int
script_denied(int fd)
{
	return fake_send_raw(fd, PROTO_T_ERROR, PROTO_F_REPLY, PROTO_S_DENIED, 23, 0,
	    "uid 1000 is not allowed", 23) == 0 ? 0 : 1;
}

START_TEST(test_refusal_before_hello_is_its_errno)
{
	struct ct_conn	cn;

	/* Whether HELLO went out before the close or hit EPIPE, the refusal is what counts. */
	ck_assert_ptr_null(ct_open_with(&cn, script_denied, 0, -EACCES));
	ct_close(&cn);
}
END_TEST

/* An ERROR and a close, once the client has surely finished connecting. */
static int
script_error_later_and_leave(int fd)
{
	poll(NULL, 0, 200);
	return fake_send_raw(fd, PROTO_T_ERROR, PROTO_F_REPLY, PROTO_S_SHUTTING_DOWN, 8, 0,
	    "stopping", 8) == 0 ? 0 : 1;
}

/* The HELLO reply with an ERROR right behind it, in one write: a daemon stopping. */
static int
script_hello_then_error(int fd)
{
	struct proto_hello_reply	r;
	struct proto_hdr		h, rh, eh;
	uint8_t				out[sizeof(rh) + sizeof(r) + sizeof(eh) + 8], *p = out;

	if (fake_expect(fd, PROTO_T_HELLO, &h) != 0)
		return 1;
	proto_hdr_init(&rh, PROTO_T_HELLO, sizeof(r), h.seq);
	rh.flags = PROTO_F_REPLY;
	memset(&r, 0, sizeof(r));
	r.version = 1;
	r.max_frame = 1U << 20;
	proto_hdr_init(&eh, PROTO_T_ERROR, 8, 0);
	eh.flags = PROTO_F_REPLY;
	eh.status = PROTO_S_SHUTTING_DOWN;
	memcpy(p, &rh, sizeof(rh));
	memcpy(p += sizeof(rh), &r, sizeof(r));
	memcpy(p += sizeof(r), &eh, sizeof(eh));
	memcpy(p + sizeof(eh), "stopping", 8);
	return fake_write_full(fd, out, sizeof(out)) == 0 ? 0 : 2;
}

START_TEST(test_error_right_after_hello_fails_the_connect)
{
	struct ct_conn	cn;

	ck_assert_ptr_null(ct_open_with(&cn, script_hello_then_error, 0, -ESHUTDOWN));
	ct_close(&cn);
}
END_TEST

START_TEST(test_send_after_the_daemon_left_reports_why)
{
	struct ct_conn	 cn;
	struct l3kv	*k;
	char		*json = NULL;

	k = ct_open(&cn, script_error_later_and_leave);
	/* The fake has exited: the STATS send fails, and the unread ERROR says why. */
	ck_assert_int_eq(fake_stop(&cn.f), 0);
	ck_assert_int_eq(l3kv_stats(k, &json), -ESHUTDOWN);
	ck_assert_int_eq(l3kv_last_status(k), PROTO_S_SHUTTING_DOWN);
	ck_assert_str_eq(l3kv_last_error(k), "stopping");
	ck_assert_int_eq(l3kv_stats(k, &json), -ENOTCONN);
	ck_assert_str_eq(l3kv_last_error(k),
	    "libl3kv: the connection broke earlier: daemon is shutting down");
	l3kv_close(k);
	ck_assert_int_eq(test_fd_count(), cn.fds);
}
END_TEST

#define CT_BIG	200000

static int
script_big(int fd)
{
	struct proto_hdr	 h;
	char			*big = malloc(CT_BIG);

	if (big == NULL)
		return 1;
	memset(big, 'x', CT_BIG);
	big[0] = '"';
	big[CT_BIG - 1] = '"';
	if (fake_expect(fd, PROTO_T_STATS, &h) != 0 || fake_reply(fd, &h, 0, big, CT_BIG) != 0) {
		free(big);
		return 2;
	}
	free(big);
	return fake_drain(fd);
}

START_TEST(test_large_reply_arrives_whole)
{
	struct ct_conn	 cn;
	struct l3kv	*k;
	char		*json = NULL;

	k = ct_open(&cn, script_big);
	ck_assert_int_eq(l3kv_stats(k, &json), 0);
	ck_assert_uint_eq(strlen(json), CT_BIG);
	ck_assert_int_eq(json[CT_BIG - 2], 'x');
	l3kv_free(json);
	ct_close(&cn);
}
END_TEST

#define CT_MAGIC	"l3kv-memfd-check"

/* What a script checks in an ATTACH, given the one fd it carried: 0, or its exit status. */
typedef int (*fake_attach_check)(const struct proto_attach_view *, int memfd);

/*
 * Reads an ATTACH as the daemon would: its one fd came with the header
 * and the FDS flag, and the payload checks and decodes. Then check (NULL:
 * none) judges the rest, and the ATTACH is answered with r. Returns 0,
 * or the script's exit status for what was wrong.
 */
static int
fake_attach(int fd, fake_attach_check check, const struct proto_attach_reply *r)
{
	static struct proto_attach_view	 v;
	struct proto_hdr		 h;
	uint8_t				*p;
	char				 err[256];
	int				 fds[PROTO_FDS_MAX], nfds, rc = 0, i;

	if (fake_read_frame(fd, &h, &p, fds, &nfds) != 0 || h.type != PROTO_T_ATTACH)
		rc = 1;
	else if (nfds != 1 || !(h.flags & PROTO_F_FDS))
		rc = 2;
	else if (proto_payload_check(h.type, h.length, p) != 0 ||
	    proto_attach_decode(p, h.length, &v, err, sizeof(err)) != 0)
		rc = 3;
	else if (check != NULL)
		rc = check(&v, fds[0]);
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	free(p);
	if (rc != 0)
		return rc;
	return fake_reply(fd, &h, 0, r, sizeof(*r)) == 0 ? 0 : 6;
}

/* The engine of ct_engine_init(): both regions name the one fd, which is its memfd. */
static int
check_attach_engine(const struct proto_attach_view *v, int memfd)
{
	char	got[sizeof(CT_MAGIC)];

	if (v->fixed.nregions != 2 || v->regions[0].fd_index != 0 ||
	    v->regions[1].fd_index != 0 || v->fixed.nlive != 2 || proto_attach_live(v, 0) != 1 ||
	    proto_attach_live(v, 1) != 5 || strcmp(v->fixed.layout.model, "tiny") != 0 ||
	    strcmp(v->pools[1].name, "state") != 0 || v->regions[1].offset != 65536 ||
	    v->fixed.prefetch != PROTO_PREFETCH_WAIT_COMPLETE)
		return 4;
	if (pread(memfd, got, sizeof(got), 0) != (ssize_t)sizeof(got) ||
	    memcmp(got, CT_MAGIC, sizeof(got)) != 0)
		return 5;
	return 0;
}

/* Checks the engine's ATTACH (check_attach_engine()) and answers it, then a DETACH. */
static int
script_attach(int fd)
{
	struct proto_attach_reply	r;
	struct proto_hdr		h;
	int				rc, i;

	memset(&r, 0, sizeof(r));
	for (i = 0; i < 16; i++)
		r.fingerprint[i] = (uint8_t)i;
	strcpy(r.ns, "decode/tiny-000102");
	r.session = 7;
	r.lease_ttl_ms = 1234;
	r.group_members = 1;
	if ((rc = fake_attach(fd, check_attach_engine, &r)) != 0)
		return rc;
	if (fake_expect(fd, PROTO_T_DETACH, &h) != 0 || fake_reply(fd, &h, 0, NULL, 0) != 0)
		return 7;
	return fake_drain(fd);
}

/* An engine's ATTACH: a page_first KV region and a slot region in one memfd. */
struct ct_engine {
	struct l3kv_attach_args	args;
	struct l3kv_pool	pools[2];
	struct l3kv_region	regions[2];
	uint32_t		live[2];
	int			mfd;
};

static void
ct_engine_init(struct ct_engine *e)
{
	int	i;

	memset(e, 0, sizeof(*e));
	e->mfd = memfd_create("l3kv-test", MFD_CLOEXEC);
	ck_assert_int_ge(e->mfd, 0);
	ck_assert_int_eq(ftruncate(e->mfd, 1 << 20), 0);
	ck_assert_int_eq(pwrite(e->mfd, CT_MAGIC, sizeof(CT_MAGIC), 0), (ssize_t)sizeof(CT_MAGIC));
	e->args.layout.model = "tiny";
	e->args.layout.kv_dtype = "bf16";
	e->args.layout.hash_scheme = "sha256";
	e->args.layout.hash_len = 32;
	e->args.layout.tp_size = e->args.layout.dcp_size = 1;
	e->args.layout.pp_size = e->args.layout.cp_size = 1;
	e->args.layout.host_layout = L3KV_LAYOUT_PAGE_FIRST;
	e->args.layout.attention = L3KV_ATTN_GQA;
	e->args.layout.page_tokens = e->args.layout.logical_page_tokens = 16;
	e->pools[0].name = "kv";
	e->pools[0].kind = L3KV_POOL_KV;
	e->pools[0].hit_policy = L3KV_HIT_ALL_PAGES;
	e->pools[0].layers = 2;
	e->pools[0].object_bytes = 16 * 2 * 64;
	e->pools[1].name = "state";
	e->pools[1].kind = L3KV_POOL_STATE;
	e->pools[1].hit_policy = L3KV_HIT_TRAILING;
	e->pools[1].trailing = 1;
	e->pools[1].layers = 1;
	e->pools[1].object_bytes = 256;
	for (i = 0; i < 2; i++) {
		e->regions[i].kind = L3KV_MEM_MEMFD;
		e->regions[i].fd = e->mfd;	/* one memfd, two slices: sent once */
	}
	e->regions[0].pool = 0;
	e->regions[0].layout = L3KV_LAYOUT_PAGE_FIRST;
	e->regions[0].size = 65536;
	e->regions[0].num_pages = 32;
	e->regions[0].page_tokens = 16;
	e->regions[0].layers = 2;
	e->regions[0].token_bytes = 64;
	e->regions[0].layer_stride = 64;
	e->regions[0].token_stride = 128;
	e->regions[0].page_stride = 2048;
	e->regions[1].pool = 1;
	e->regions[1].layout = L3KV_LAYOUT_SLOTS;
	e->regions[1].offset = 65536;
	e->regions[1].size = 8 * 256;
	e->regions[1].num_pages = 8;
	e->regions[1].page_tokens = 1;
	e->regions[1].layers = 1;
	e->regions[1].token_bytes = 256;
	e->regions[1].page_stride = 256;
	e->live[0] = 1;
	e->live[1] = 5;
	e->args.pools = e->pools;
	e->args.npools = 2;
	e->args.regions = e->regions;
	e->args.nregions = 2;
	e->args.live_slots = e->live;
	e->args.nlive = 2;
	e->args.group = "engine-x";
	e->args.group_size = 1;
	e->args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	e->args.write = L3KV_WRITE_THROUGH;
}

START_TEST(test_attach_sends_the_memfd_with_the_frame)
{
	struct l3kv_attach_info	 info;
	struct ct_engine	 e;
	struct ct_conn		 cn;
	struct l3kv		*k;

	ct_engine_init(&e);
	k = ct_open(&cn, script_attach);
	ck_assert_int_eq(l3kv_attach(k, &e.args, &info), 0);
	ck_assert_uint_eq(info.session, 7);
	ck_assert_uint_eq(info.lease_ttl_ms, 1234);
	ck_assert_uint_eq(info.group_members, 1);
	ck_assert_str_eq(info.ns, "decode/tiny-000102");
	ck_assert_uint_eq(info.fingerprint[15], 15);
	ck_assert_int_eq(l3kv_detach(k), 0);
	ct_close(&cn);
	close(e.mfd);
}
END_TEST

/* A STATS queued corked before the ATTACH: its bytes must come without the fd. */
static int
script_stats_then_attach(int fd)
{
	struct proto_hdr	 h;
	uint8_t			*p;
	int			 fds[PROTO_FDS_MAX], nfds, i;

	if (fake_read_frame(fd, &h, &p, fds, &nfds) != 0 || h.type != PROTO_T_STATS) {
		free(p);
		return 10;
	}
	free(p);
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	if (nfds != 0)
		return 11;
	if (fake_reply(fd, &h, 0, "{}", 2) != 0)
		return 12;
	return script_attach(fd);
}

START_TEST(test_corked_frames_keep_fds_with_their_own_frame)
{
	struct l3kv_completion	 c;
	struct l3kv_attach_info	 info;
	struct ct_engine	 e;
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint64_t		 t;

	ct_engine_init(&e);
	k = ct_open(&cn, script_stats_then_attach);
	ck_assert_int_eq(l3kv_cork(k), 0);
	ck_assert_int_eq(l3kv_submit_stats(k, &t), 0);
	/* A blocking call sends what is queued first: two frames, the fd with the second. */
	ck_assert_int_eq(l3kv_attach(k, &e.args, &info), 0);
	ck_assert_uint_eq(info.session, 7);
	ck_assert_int_eq(l3kv_poll_completion(k, &c), 0);
	ck_assert_uint_eq(c.ticket, t);
	ck_assert_int_eq(c.status, 0);
	l3kv_completion_release(&c);
	ck_assert_int_eq(l3kv_uncork(k), 0);
	ck_assert_int_eq(l3kv_detach(k), 0);
	ct_close(&cn);
	close(e.mfd);
}
END_TEST

/*
 * Reads a 256 KiB ATTACH only after the client's socket buffer is full,
 * so that its first sendmsg (with the fd) sent part of it and the rest
 * was queued: the fd must still come with the header, and the payload
 * whole.
 */
static int
check_attach_live_max(const struct proto_attach_view *v, int memfd)
{
	(void)memfd;
	return v->fixed.nlive == PROTO_LIVE_MAX &&
	    proto_attach_live(v, PROTO_LIVE_MAX - 1) == PROTO_LIVE_MAX - 1 ? 0 : 4;
}

static int
script_attach_big(int fd)
{
	struct proto_attach_reply	r;
	int				rc;

	poll(NULL, 0, 100);
	memset(&r, 0, sizeof(r));
	strcpy(r.ns, "decode/tiny-big");
	if ((rc = fake_attach(fd, check_attach_live_max, &r)) != 0)
		return rc;
	return fake_drain(fd);
}

START_TEST(test_attach_larger_than_the_socket_buffer_goes_whole)
{
	struct l3kv_attach_info	 info;
	struct ct_engine	 e;
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint32_t		*live;
	uint32_t		 i;

	ct_engine_init(&e);
	live = malloc(PROTO_LIVE_MAX * sizeof(*live));
	ck_assert_ptr_nonnull(live);
	for (i = 0; i < PROTO_LIVE_MAX; i++)
		live[i] = i;
	e.args.live_slots = live;
	e.args.nlive = PROTO_LIVE_MAX;
	k = ct_open(&cn, script_attach_big);
	ck_assert_int_eq(l3kv_attach(k, &e.args, &info), 0);
	ck_assert_str_eq(info.ns, "decode/tiny-big");
	ct_close(&cn);
	free(live);
	close(e.mfd);
}
END_TEST

START_TEST(test_attach_refuses_what_cannot_be_encoded)
{
	struct l3kv_attach_args	 a;
	struct l3kv_region	 region;
	struct l3kv_pool	 pool;
	struct ct_conn		 cn;
	struct l3kv		*k;
	char			 longname[200];

	k = ct_open(&cn, script_hello_info);
	memset(&a, 0, sizeof(a));
	memset(&pool, 0, sizeof(pool));
	memset(&region, 0, sizeof(region));
	memset(longname, 'm', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	a.pools = &pool;
	a.npools = 1;
	a.layout.model = longname;
	ck_assert_int_eq(l3kv_attach(k, &a, NULL), -EINVAL);
	ck_assert_str_eq(l3kv_last_error(k),
	    "libl3kv: layout.model: 199 bytes is longer than the wire's 127");
	a.layout.model = "m";
	a.layout.tp_size = 70000;
	ck_assert_int_eq(l3kv_attach(k, &a, NULL), -EINVAL);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: layout.tp_size: 70000 does not fit the wire's 65535");
	a.layout.tp_size = 1;
	a.npools = L3KV_POOLS_MAX + 1;
	ck_assert_int_eq(l3kv_attach(k, &a, NULL), -EINVAL);
	a.npools = 1;
	region.kind = L3KV_MEM_MEMFD;
	region.fd = -1;
	a.regions = &region;
	a.nregions = 1;
	ck_assert_int_eq(l3kv_attach(k, &a, NULL), -EBADF);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: regions[0].fd: -1 is not an fd");
	ck_assert_int_eq(l3kv_attach(k, NULL, NULL), -EINVAL);
	ct_close(&cn);
}
END_TEST

/*
 * The cache operations. Requests are checked byte for byte against the
 * offsets PROTOCOL.md documents, built here independently of the
 * library's structs; replies are built from proto.h's.
 */
#define CT_REQ_ID	0x1122334455667788ULL
#define CT_LEASE	0x0102030405060708ULL

/* Writes v as n little-endian bytes; returns the byte after them. */
static uint8_t *
ct_le(uint8_t *p, uint64_t v, unsigned n)
{
	unsigned	i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return p + n;
}

/* n distinct page hashes, the last 12 bytes of each zero as for a 20-byte scheme. */
static void
ct_hashes(uint8_t *h, uint32_t n)
{
	size_t	i;

	for (i = 0; i < (size_t)n * L3KV_HASH_LEN; i++)
		h[i] = i % L3KV_HASH_LEN < 20 ? (uint8_t)(i * 7 + i / L3KV_HASH_LEN + 1) : 0;
}

/* The ADMIT payload PROTOCOL.md §4.8 describes; returns its length. */
static size_t
ct_admit_bytes(uint8_t *out, uint64_t request_id, uint32_t n, uint32_t reserved, uint32_t slot)
{
	uint8_t	*p = out;

	p = ct_le(p, request_id, 8);
	p = ct_le(p, n, 4);
	p = ct_le(p, reserved, 4);
	p = ct_le(p, slot, 4);
	p = ct_le(p, 0, 4);
	ct_hashes(p, n);
	return 24 + (size_t)n * L3KV_HASH_LEN;
}

/* The same ADMIT as libl3kv's arguments; every other field 0. */
static void
ct_admit_args(struct l3kv_admit_args *a, uint64_t request_id, const uint8_t *hashes, uint32_t n,
    uint32_t reserved, uint32_t slot)
{
	memset(a, 0, sizeof(*a));
	a->request_id = request_id;
	a->hashes = hashes;
	a->npages = n;
	a->reserved_pages = reserved;
	a->state_slot = slot;
}

/*
 * Reads the next request: it must be of type, without flags, and carry
 * exactly the n bytes of want.
 */
static int
fake_expect_bytes(int fd, unsigned type, const void *want, size_t n, struct proto_hdr *h)
{
	uint8_t	*p;
	int	 rc;

	if (fake_read_frame(fd, h, &p, NULL, NULL) != 0) {
		free(p);
		return -1;
	}
	rc = h->type == type && h->flags == 0 && h->length == n &&
	    (n == 0 || memcmp(p, want, n) == 0) ? 0 : -1;
	free(p);
	return rc;
}

/* Expects an ADMIT of the 3 pages ct_hashes() makes, byte for byte, and answers it with ar. */
static int
fake_admit(int fd, uint64_t request_id, uint32_t reserved, uint32_t slot,
    const struct proto_admit_reply *ar)
{
	struct proto_hdr	h;
	uint8_t			want[24 + 3 * L3KV_HASH_LEN];
	size_t			n;

	n = ct_admit_bytes(want, request_id, 3, reserved, slot);
	if (fake_expect_bytes(fd, PROTO_T_ADMIT, want, n, &h) != 0)
		return -1;
	return fake_reply(fd, &h, 0, ar, sizeof(*ar));
}

static int
script_probe_admit(int fd)
{
	struct proto_probe_reply	pr;
	struct proto_admit_reply	ar;
	struct proto_hdr		h;
	uint8_t				want[8 + 3 * L3KV_HASH_LEN], *p, stops[12];

	/* PROBE of 3 pages: npages, pool 0 (no ATTACH: the default), flags, hashes. */
	p = ct_le(want, 3, 4);
	p = ct_le(p, 0, 2);
	p = ct_le(p, 0, 2);
	ct_hashes(p, 3);
	if (fake_expect_bytes(fd, PROTO_T_PROBE, want, 8 + 3 * L3KV_HASH_LEN, &h) != 0)
		return 1;
	memset(&pr, 0, sizeof(pr));
	pr.hit_pages = 2;
	if (fake_reply(fd, &h, 0, &pr, sizeof(pr)) != 0)
		return 2;
	/* Again, answered with one stop point: counted, not handed out. */
	if (fake_expect_bytes(fd, PROTO_T_PROBE, want, 8 + 3 * L3KV_HASH_LEN, &h) != 0)
		return 3;
	pr.hit_pages = 1;
	pr.nstops = 1;
	memcpy(stops, &pr, sizeof(pr));
	ct_le(stops + sizeof(pr), 1, 4);
	if (fake_reply(fd, &h, 0, stops, sizeof(stops)) != 0)
		return 4;

	memset(&ar, 0, sizeof(ar));
	ar.lease = CT_LEASE;
	ar.admitted_pages = 2;
	ar.ttl_ms = 1234;
	ar.group_hit = 3;
	if (fake_admit(fd, CT_REQ_ID, 2, 5, &ar) != 0)
		return 5;
	/* The next is declined: a successful reply all the same. */
	memset(&ar, 0, sizeof(ar));
	ar.decline = PROTO_DECLINE_NO_RESERVATION;
	ar.ttl_ms = 1234;
	ar.group_hit = 3;
	if (fake_admit(fd, CT_REQ_ID + 1, 0, UINT32_MAX, &ar) != 0)
		return 6;
	return fake_drain(fd);
}

START_TEST(test_probe_and_admit_encode_and_decode_exactly)
{
	struct l3kv_admit_result r;
	struct l3kv_admit_args	 a;
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint8_t			 hashes[3 * L3KV_HASH_LEN];
	uint32_t		 hit = 99;

	ct_hashes(hashes, 3);
	k = ct_open(&cn, script_probe_admit);
	ck_assert_int_eq(l3kv_probe(k, hashes, 3, &hit), 0);
	ck_assert_uint_eq(hit, 2);
	ck_assert_int_eq(l3kv_probe(k, hashes, 3, &hit), 0);
	ck_assert_uint_eq(hit, 1);

	ct_admit_args(&a, CT_REQ_ID, hashes, 3, 2, 5);
	ck_assert_int_eq(l3kv_admit(k, &a, &r), 0);
	ck_assert_uint_eq(r.lease, CT_LEASE);
	ck_assert_uint_eq(r.admitted_pages, 2);
	ck_assert_int_eq(r.decline, L3KV_DECLINE_NONE);
	ck_assert_uint_eq(r.ttl_ms, 1234);
	ck_assert_uint_eq(r.group_hit, 3);

	a.request_id = CT_REQ_ID + 1;
	a.reserved_pages = 0;
	a.state_slot = L3KV_SLOT_NONE;
	ck_assert_int_eq(l3kv_admit(k, &a, &r), 0);
	ck_assert_uint_eq(r.lease, 0);
	ck_assert_uint_eq(r.admitted_pages, 0);
	ck_assert_int_eq(r.decline, L3KV_DECLINE_NO_RESERVATION);
	ck_assert_uint_eq(r.group_hit, 3);
	ck_assert_int_eq(l3kv_last_status(k), 0);
	ck_assert_str_eq(l3kv_last_error(k), "");
	ct_close(&cn);
}
END_TEST

static int
script_restore_cancel_release(int fd)
{
	struct proto_restore_reply	rr;
	struct proto_cancel_reply	cr;
	struct proto_hdr		h;
	uint8_t				want[24 + 3 * 4], *p;

	/*
	 * RESTORE: lease, npages, region, flags, state region (none), pad,
	 * state slot (none), then the u32 destinations.
	 */
	p = ct_le(want, CT_LEASE, 8);
	p = ct_le(p, 3, 4);
	p = ct_le(p, 0x0102, 2);
	p = ct_le(p, 0, 2);
	p = ct_le(p, 0xffff, 2);
	p = ct_le(p, 0, 2);
	p = ct_le(p, 0xffffffff, 4);
	p = ct_le(p, 7, 4);
	p = ct_le(p, 3, 4);
	ct_le(p, 0xfffffffe, 4);
	if (fake_expect_bytes(fd, PROTO_T_RESTORE, want, sizeof(want), &h) != 0)
		return 1;
	memset(&rr, 0, sizeof(rr));
	rr.pages = 2;
	rr.flags = PROTO_RESTORE_F_PARTIAL;
	rr.bytes = 2 * 2048;
	if (fake_reply(fd, &h, 0, &rr, sizeof(rr)) != 0)
		return 2;
	/* A failed one: the status's errno, the text kept. */
	if (fake_expect_bytes(fd, PROTO_T_RESTORE, want, sizeof(want), &h) != 0 ||
	    fake_reply(fd, &h, PROTO_S_LOST, "RESTORE: page 1 of rank 0 is lost or corrupt",
	    44) != 0)
		return 3;
	ct_le(want, CT_LEASE, 8);
	if (fake_expect_bytes(fd, PROTO_T_CANCEL, want, 8, &h) != 0)
		return 4;
	memset(&cr, 0, sizeof(cr));
	cr.pages_landed = 2;
	if (fake_reply(fd, &h, 0, &cr, sizeof(cr)) != 0)
		return 5;
	if (fake_expect_bytes(fd, PROTO_T_CANCEL, want, 8, &h) != 0 ||
	    fake_reply(fd, &h, 0, &cr, sizeof(cr)) != 0)
		return 6;
	if (fake_expect_bytes(fd, PROTO_T_RELEASE, want, 8, &h) != 0 ||
	    fake_reply(fd, &h, PROTO_S_BUSY, "RELEASE: restoring", 18) != 0)
		return 7;
	if (fake_expect_bytes(fd, PROTO_T_RELEASE, want, 8, &h) != 0 ||
	    fake_reply(fd, &h, 0, NULL, 0) != 0)
		return 8;
	return fake_drain(fd);
}

START_TEST(test_restore_cancel_release_encode_and_decode_exactly)
{
	struct l3kv_restore_result	 r;
	struct ct_conn			 cn;
	struct l3kv			*k;
	uint32_t			 dst[3] = { 7, 3, 0xfffffffe }, landed = 99;

	k = ct_open(&cn, script_restore_cancel_release);
	ck_assert_int_eq(l3kv_restore(k, CT_LEASE, 0x0102, dst, 3, 0, &r), 0);
	ck_assert_uint_eq(r.pages, 2);
	ck_assert_int_eq(r.partial, 1);
	ck_assert_uint_eq(r.bytes, 4096);
	ck_assert_int_eq(l3kv_restore(k, CT_LEASE, 0x0102, dst, 3, 0, &r), -ENODATA);
	ck_assert_uint_eq(r.pages, 0);
	ck_assert_int_eq(l3kv_last_status(k), PROTO_S_LOST);
	ck_assert_str_eq(l3kv_last_error(k), "RESTORE: page 1 of rank 0 is lost or corrupt");
	ck_assert_int_eq(l3kv_cancel(k, CT_LEASE, &landed), 0);
	ck_assert_uint_eq(landed, 2);
	ck_assert_str_eq(l3kv_last_error(k), "");
	ck_assert_int_eq(l3kv_cancel(k, CT_LEASE, NULL), 0);
	ck_assert_int_eq(l3kv_release(k, CT_LEASE), -EBUSY);
	ck_assert_int_eq(l3kv_last_status(k), PROTO_S_BUSY);
	ck_assert_int_eq(l3kv_release(k, CT_LEASE), 0);
	ct_close(&cn);
}
END_TEST

static int
script_publish_debug(int fd)
{
	struct proto_publish_reply	pr;
	struct proto_hdr		h;
	uint8_t				want[8 + 2 * 40], hashes[2 * L3KV_HASH_LEN], *p;

	/* PUBLISH: npages, region, flags, then (hash, src_page, 4 bytes of zero) per page. */
	ct_hashes(hashes, 2);
	p = ct_le(want, 2, 4);
	p = ct_le(p, 2, 2);
	p = ct_le(p, 0, 2);
	memcpy(p, hashes, L3KV_HASH_LEN);
	p = ct_le(p + L3KV_HASH_LEN, 9, 4);
	p = ct_le(p, 0, 4);
	memcpy(p, hashes + L3KV_HASH_LEN, L3KV_HASH_LEN);
	p = ct_le(p + L3KV_HASH_LEN, 0x01020304, 4);
	ct_le(p, 0, 4);
	if (fake_expect_bytes(fd, PROTO_T_PUBLISH, want, sizeof(want), &h) != 0)
		return 1;
	memset(&pr, 0, sizeof(pr));
	pr.stored = 1;
	pr.present = 1;
	pr.bytes = 2048;
	if (fake_reply(fd, &h, 0, &pr, sizeof(pr)) != 0)
		return 2;
	if (fake_expect_bytes(fd, PROTO_T_PUBLISH, want, sizeof(want), &h) != 0 ||
	    fake_reply(fd, &h, PROTO_S_NO_SPACE, "PUBLISH: page 1: no space", 25) != 0)
		return 3;
	/* An empty PUBLISH is the daemon's to judge: it goes out. */
	p = ct_le(want, 0, 4);
	p = ct_le(p, 2, 2);
	ct_le(p, 0, 2);
	if (fake_expect_bytes(fd, PROTO_T_PUBLISH, want, 8, &h) != 0)
		return 4;
	memset(&pr, 0, sizeof(pr));
	if (fake_reply(fd, &h, 0, &pr, sizeof(pr)) != 0)
		return 5;
	/* DEBUG: op, pool, pad, hash. */
	p = ct_le(want, PROTO_DEBUG_CORRUPT, 4);
	p = ct_le(p, 1, 2);
	p = ct_le(p, 0, 2);
	memcpy(p, hashes + L3KV_HASH_LEN, L3KV_HASH_LEN);
	if (fake_expect_bytes(fd, PROTO_T_DEBUG, want, 40, &h) != 0 ||
	    fake_reply(fd, &h, 0, NULL, 0) != 0)
		return 6;
	if (fake_expect_bytes(fd, PROTO_T_DEBUG, want, 40, &h) != 0 ||
	    fake_reply(fd, &h, PROTO_S_STATE, "DEBUG is refused unless testing.debug_ops is true",
	    50) != 0)
		return 7;
	return fake_drain(fd);
}

START_TEST(test_publish_and_debug_encode_and_decode_exactly)
{
	struct l3kv_publish_result	 r;
	struct l3kv_publish_page	 pages[2];
	struct ct_conn			 cn;
	struct l3kv			*k;
	uint8_t				 hashes[2 * L3KV_HASH_LEN];

	ct_hashes(hashes, 2);
	memcpy(pages[0].hash, hashes, L3KV_HASH_LEN);
	pages[0].src_page = 9;
	memcpy(pages[1].hash, hashes + L3KV_HASH_LEN, L3KV_HASH_LEN);
	pages[1].src_page = 0x01020304;
	k = ct_open(&cn, script_publish_debug);
	ck_assert_int_eq(l3kv_publish(k, 2, pages, 2, &r), 0);
	ck_assert_uint_eq(r.stored, 1);
	ck_assert_uint_eq(r.present, 1);
	ck_assert_uint_eq(r.bytes, 2048);
	ck_assert_int_eq(l3kv_publish(k, 2, pages, 2, &r), -ENOSPC);
	ck_assert_uint_eq(r.stored, 0);
	ck_assert_str_eq(l3kv_last_error(k), "PUBLISH: page 1: no space");
	ck_assert_int_eq(l3kv_publish(k, 2, NULL, 0, NULL), 0);
	ck_assert_int_eq(l3kv_debug(k, L3KV_DEBUG_CORRUPT, 1, pages[1].hash), 0);
	ck_assert_int_eq(l3kv_debug(k, L3KV_DEBUG_CORRUPT, 1, pages[1].hash), -EISCONN);
	ck_assert_int_eq(l3kv_last_status(k), PROTO_S_STATE);
	ct_close(&cn);
}
END_TEST

/* An ATTACH whose pools are (state, kv), then a PROBE that must name pool 1. */
static int
script_probe_pool(int fd)
{
	struct proto_attach_reply	 ar;
	struct proto_probe_reply	 pr;
	struct proto_probe		 p;
	struct proto_hdr		 h;
	uint8_t				*pay;
	int				 rc;

	memset(&ar, 0, sizeof(ar));
	strcpy(ar.ns, "decode/tiny-0");
	if ((rc = fake_attach(fd, NULL, &ar)) != 0)
		return rc;
	if (fake_read_frame(fd, &h, &pay, NULL, NULL) != 0 || h.type != PROTO_T_PROBE ||
	    h.length != sizeof(p) + L3KV_HASH_LEN) {
		free(pay);
		return 3;
	}
	memcpy(&p, pay, sizeof(p));
	free(pay);
	if (p.pool != 1 || p.npages != 1)
		return 4;
	memset(&pr, 0, sizeof(pr));
	pr.hit_pages = 1;
	if (fake_reply(fd, &h, 0, &pr, sizeof(pr)) != 0)
		return 5;
	return fake_drain(fd);
}

START_TEST(test_probe_asks_about_the_pool_admit_uses)
{
	struct ct_engine	 e;
	struct l3kv_pool	 kv;
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint8_t			 hash[L3KV_HASH_LEN];
	uint32_t		 hit = 0;

	ct_engine_init(&e);
	kv = e.pools[0];
	e.pools[0] = e.pools[1];
	e.pools[1] = kv;
	e.regions[0].pool = 1;
	e.regions[1].pool = 0;
	ct_hashes(hash, 1);
	k = ct_open(&cn, script_probe_pool);
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	ck_assert_int_eq(l3kv_probe(k, hash, 1, &hit), 0);
	ck_assert_uint_eq(hit, 1);
	ct_close(&cn);
	close(e.mfd);
}
END_TEST

/*
 * Four requests submitted at once, answered in reverse: each completion
 * reaches its ticket and decodes with its own *_result(), and only that.
 */
static int
script_cache_reverse(int fd)
{
	struct proto_publish_reply	pr;
	struct proto_cancel_reply	cr;
	struct proto_admit_reply	ar;
	struct proto_hdr		ha, hr, hp, hc;

	if (fake_expect(fd, PROTO_T_ADMIT, &ha) != 0 || fake_expect(fd, PROTO_T_RESTORE, &hr) != 0 ||
	    fake_expect(fd, PROTO_T_PUBLISH, &hp) != 0 || fake_expect(fd, PROTO_T_CANCEL, &hc) != 0)
		return 1;
	memset(&cr, 0, sizeof(cr));
	cr.pages_landed = 4;
	memset(&pr, 0, sizeof(pr));
	pr.stored = 1;
	pr.bytes = 2048;
	memset(&ar, 0, sizeof(ar));
	ar.decline = PROTO_DECLINE_GROUP_TIMEOUT;
	ar.ttl_ms = 1234;
	if (fake_reply(fd, &hc, 0, &cr, sizeof(cr)) != 0 ||
	    fake_reply(fd, &hp, 0, &pr, sizeof(pr)) != 0 ||
	    fake_reply(fd, &hr, PROTO_S_EXPIRED, "RESTORE: lease 9 expired", 24) != 0 ||
	    fake_reply(fd, &ha, 0, &ar, sizeof(ar)) != 0)
		return 2;
	return fake_drain(fd);
}

START_TEST(test_cache_submits_complete_out_of_order)
{
	struct l3kv_publish_result	 pr;
	struct l3kv_restore_result	 rr;
	struct l3kv_admit_result	 ar;
	struct l3kv_publish_page	 page;
	struct l3kv_admit_args		 a;
	struct l3kv_completion		 c[4];
	struct ct_conn			 cn;
	struct l3kv			*k;
	uint64_t			 ta, tr, tp, tc;
	uint32_t			 dst[2] = { 0, 1 }, landed;
	uint8_t				 hashes[2 * L3KV_HASH_LEN];
	int				 i;

	ct_hashes(hashes, 2);
	ct_admit_args(&a, CT_REQ_ID, hashes, 2, 2, L3KV_SLOT_NONE);
	memcpy(page.hash, hashes, L3KV_HASH_LEN);
	page.src_page = 4;
	k = ct_open(&cn, script_cache_reverse);
	ck_assert_int_eq(l3kv_submit_admit(k, &a, &ta), 0);
	ck_assert_int_eq(l3kv_submit_restore(k, 9, 0, dst, 2, &tr), 0);
	ck_assert_int_eq(l3kv_submit_publish(k, 0, &page, 1, &tp), 0);
	ck_assert_int_eq(l3kv_submit_cancel(k, 9, &tc), 0);
	ck_assert(ta < tr && tr < tp && tp < tc);
	for (i = 0; i < 4; i++)
		ck_assert_int_eq(ct_next(k, &c[i], 2000), 0);

	ck_assert_uint_eq(c[0].ticket, tc);
	ck_assert_int_eq(c[0].op, L3KV_OP_CANCEL);
	ck_assert_int_eq(l3kv_cancel_result(&c[0], &landed), 0);
	ck_assert_uint_eq(landed, 4);

	ck_assert_uint_eq(c[1].ticket, tp);
	ck_assert_int_eq(c[1].op, L3KV_OP_PUBLISH);
	ck_assert_int_eq(l3kv_publish_result(&c[1], &pr), 0);
	ck_assert_uint_eq(pr.stored, 1);
	ck_assert_uint_eq(pr.bytes, 2048);
	/* Another type's completion does not decode. */
	ck_assert_int_eq(l3kv_admit_result(&c[1], &ar), -EINVAL);
	ck_assert_int_eq(l3kv_restore_result(&c[1], &rr), -EINVAL);
	ck_assert_int_eq(l3kv_cancel_result(&c[1], &landed), -EINVAL);

	ck_assert_uint_eq(c[2].ticket, tr);
	ck_assert_int_eq(c[2].op, L3KV_OP_RESTORE);
	ck_assert_int_eq(c[2].status, -ETIME);
	ck_assert_int_eq(c[2].proto_status, PROTO_S_EXPIRED);
	ck_assert_str_eq(c[2].payload, "RESTORE: lease 9 expired");
	/* Nor does a failed one. */
	rr.pages = 7;
	ck_assert_int_eq(l3kv_restore_result(&c[2], &rr), -EINVAL);
	ck_assert_uint_eq(rr.pages, 0);

	ck_assert_uint_eq(c[3].ticket, ta);
	ck_assert_int_eq(c[3].op, L3KV_OP_ADMIT);
	ck_assert_int_eq(l3kv_admit_result(&c[3], &ar), 0);
	ck_assert_uint_eq(ar.lease, 0);
	ck_assert_uint_eq(ar.admitted_pages, 0);
	ck_assert_int_eq(ar.decline, L3KV_DECLINE_GROUP_TIMEOUT);
	ck_assert_uint_eq(ar.ttl_ms, 1234);
	ck_assert_int_eq(l3kv_publish_result(&c[3], &pr), -EINVAL);
	ck_assert_int_eq(l3kv_admit_result(NULL, &ar), -EINVAL);
	ck_assert_int_eq(l3kv_admit_result(&c[3], NULL), -EINVAL);
	for (i = 0; i < 4; i++)
		l3kv_completion_release(&c[i]);
	ck_assert_int_eq(l3kv_poll_completion(k, &c[0]), -EAGAIN);
	ct_close(&cn);
}
END_TEST

/* The fake's max_frame is 1 MiB: ADMIT payloads hold at most (2^20 - 24) / 32 pages. */
#define CT_ADMIT_FITS	32767

static int
script_largest_admit(int fd)
{
	struct proto_admit_reply	ar;
	struct proto_hdr		h;
	uint8_t				*p;

	if (fake_read_frame(fd, &h, &p, NULL, NULL) != 0 || h.type != PROTO_T_ADMIT ||
	    h.length != 24 + CT_ADMIT_FITS * L3KV_HASH_LEN) {
		free(p);
		return 1;
	}
	free(p);
	memset(&ar, 0, sizeof(ar));
	ar.decline = PROTO_DECLINE_NO_HIT;
	if (fake_reply(fd, &h, 0, &ar, sizeof(ar)) != 0)
		return 2;
	/* Nothing refused locally reached the wire: the next frame is the STATS. */
	if (fake_expect(fd, PROTO_T_STATS, &h) != 0 || fake_reply(fd, &h, 0, "{}", 2) != 0)
		return 3;
	return fake_drain(fd);
}

START_TEST(test_cache_calls_refuse_what_cannot_be_encoded)
{
	struct l3kv_publish_page	*pages;
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 a;
	struct ct_conn			 cn;
	struct l3kv			*k;
	uint8_t				*hashes;
	uint32_t			 hit, dst = 0, publish_over;
	uint64_t			 t = 99;
	char				*json;

	/* Enough for the largest ADMIT that fits, and a PUBLISH that does not. */
	publish_over = ((1U << 20) - 8) / 40 + 1;
	hashes = calloc(CT_ADMIT_FITS + 1, L3KV_HASH_LEN);
	pages = calloc(publish_over, sizeof(*pages));
	ck_assert_ptr_nonnull(hashes);
	ck_assert_ptr_nonnull(pages);
	k = ct_open(&cn, script_largest_admit);

	/* More pages than a request may carry, whatever max_frame says. */
	ck_assert_int_eq(l3kv_probe(k, hashes, L3KV_PAGES_MAX + 1, &hit), -EMSGSIZE);
	ck_assert_str_eq(l3kv_last_error(k),
	    "libl3kv: PROBE of 65537 pages is over the 65536 one request may carry");
	ct_admit_args(&a, 0, hashes, L3KV_PAGES_MAX + 1, 0, 0);
	ck_assert_int_eq(l3kv_admit(k, &a, &ar), -EMSGSIZE);
	ck_assert_int_eq(l3kv_submit_admit(k, &a, &t), -EMSGSIZE);
	ck_assert_uint_eq(t, 0);
	ck_assert_int_eq(l3kv_restore(k, 1, 0, &dst, L3KV_PAGES_MAX + 1, 0, NULL), -EMSGSIZE);
	ck_assert_int_eq(l3kv_submit_restore(k, 1, 0, &dst, L3KV_PAGES_MAX + 1, &t), -EMSGSIZE);
	ck_assert_int_eq(l3kv_publish(k, 0, pages, L3KV_PAGES_MAX + 1, NULL), -EMSGSIZE);
	ck_assert_int_eq(l3kv_submit_publish(k, 0, pages, L3KV_PAGES_MAX + 1, &t), -EMSGSIZE);

	/* Longer than the daemon's max_frame. */
	a.npages = CT_ADMIT_FITS + 1;
	ck_assert_int_eq(l3kv_admit(k, &a, &ar), -EMSGSIZE);
	ck_assert_str_eq(l3kv_last_error(k),
	    "libl3kv: ADMIT of 1048600 bytes is over the daemon's max_frame 1048576");
	ck_assert_int_eq(l3kv_submit_publish(k, 0, pages, publish_over, &t), -EMSGSIZE);
	ck_assert_int_eq(l3kv_publish(k, 0, pages, publish_over, NULL), -EMSGSIZE);

	/* Nothing to read, or an index too wide for its field. */
	ck_assert_int_eq(l3kv_probe(k, NULL, 1, &hit), -EINVAL);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: PROBE: hashes is NULL with 1 pages");
	ck_assert_int_eq(l3kv_probe(k, hashes, 1, NULL), -EINVAL);
	a.hashes = NULL;
	a.npages = 1;
	ck_assert_int_eq(l3kv_admit(k, &a, &ar), -EINVAL);
	ck_assert_int_eq(l3kv_submit_admit(k, &a, &t), -EINVAL);
	ck_assert_int_eq(l3kv_admit(k, NULL, &ar), -EINVAL);
	ck_assert_int_eq(l3kv_restore(k, 1, 0, NULL, 1, 0, NULL), -EINVAL);
	ck_assert_int_eq(l3kv_submit_restore(k, 1, 0, NULL, 1, &t), -EINVAL);
	ck_assert_int_eq(l3kv_restore(k, 1, 65536, &dst, 1, 0, NULL), -EINVAL);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: region: 65536 does not fit the wire's 65535");
	ck_assert_int_eq(l3kv_publish(k, 0, NULL, 1, NULL), -EINVAL);
	ck_assert_int_eq(l3kv_publish(k, 65536, pages, 1, NULL), -EINVAL);
	ck_assert_int_eq(l3kv_debug(k, L3KV_DEBUG_DROP, 0, NULL), -EINVAL);
	ck_assert_int_eq(l3kv_debug(k, L3KV_DEBUG_DROP, 65536, hashes), -EINVAL);
	ck_assert_int_eq(l3kv_submit_cancel(k, 1, NULL), -EINVAL);
	ck_assert_int_eq(l3kv_last_status(k), 0);

	/* The largest ADMIT that fits goes out whole. */
	a.hashes = hashes;
	a.npages = CT_ADMIT_FITS;
	ck_assert_int_eq(l3kv_admit(k, &a, &ar), 0);
	ck_assert_int_eq(ar.decline, L3KV_DECLINE_NO_HIT);
	ck_assert_int_eq(l3kv_stats(k, &json), 0);
	l3kv_free(json);
	ct_close(&cn);
	free(pages);
	free(hashes);
}
END_TEST

static int
script_silent_cache(int fd)
{
	struct proto_hdr	h;

	if (fake_expect(fd, PROTO_T_ADMIT, &h) != 0 || fake_expect(fd, PROTO_T_RESTORE, &h) != 0)
		return 1;
	return fake_drain(fd);
}

/* ADMIT and RESTORE wait as long as their caller says, not the connection's default. */
START_TEST(test_admit_and_restore_take_their_own_timeout)
{
	struct l3kv_restore_result	 rr;
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 a;
	struct ct_conn			 cn;
	struct l3kv			*k;
	uint8_t				 hash[L3KV_HASH_LEN];
	uint32_t			 dst = 0;
	int64_t				 t0;

	ct_hashes(hash, 1);
	ct_admit_args(&a, 0, hash, 1, 1, 0);
	a.timeout_ms = 100;
	k = ct_open(&cn, script_silent_cache);
	/* A default longer than either call's timeout: it must not be the one waited. */
	ck_assert_int_eq(l3kv_set_timeout(k, 5000), 0);
	t0 = ct_now_ms();
	ck_assert_int_eq(l3kv_admit(k, &a, &ar), -ETIMEDOUT);
	ct_assert_took(t0, 95, 1000);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: no reply to ADMIT within the timeout");
	t0 = ct_now_ms();
	ck_assert_int_eq(l3kv_restore(k, 1, 0, &dst, 1, 100, &rr), -ETIMEDOUT);
	ct_assert_took(t0, 95, 1000);
	ct_close(&cn);
}
END_TEST

static int
script_short_admit_reply(int fd)
{
	struct proto_admit_reply	ar;
	struct proto_hdr		h;

	memset(&ar, 0, sizeof(ar));
	if (fake_expect(fd, PROTO_T_ADMIT, &h) != 0 ||
	    fake_reply(fd, &h, 0, &ar, sizeof(ar) - 1) != 0)
		return 1;
	return fake_drain(fd);
}

START_TEST(test_cache_reply_of_the_wrong_length_is_eproto)
{
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 a;
	struct ct_conn			 cn;
	struct l3kv			*k;
	uint8_t				 hash[L3KV_HASH_LEN];

	ct_hashes(hash, 1);
	ct_admit_args(&a, 0, hash, 1, 0, 0);
	k = ct_open(&cn, script_short_admit_reply);
	ck_assert_int_eq(l3kv_admit(k, &a, &ar), -EPROTO);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: ADMIT reply of 23 bytes");
	ck_assert_int_eq(l3kv_release(k, 1), -ENOTCONN);
	ct_close(&cn);
}
END_TEST

/* Two PROBEs answered with 2 stop points announced and 1 sent: 12 bytes, a whole u32 short. */
static int
script_probe_stops_short(int fd)
{
	struct proto_probe_reply	pr;
	struct proto_hdr		h;
	uint8_t				reply[sizeof(pr) + 4];
	int				i;

	memset(&pr, 0, sizeof(pr));
	pr.hit_pages = 1;
	pr.nstops = 2;
	memcpy(reply, &pr, sizeof(pr));
	ct_le(reply + sizeof(pr), 1, 4);
	for (i = 0; i < 2; i++)
		if (fake_expect(fd, PROTO_T_PROBE, &h) != 0 ||
		    fake_reply(fd, &h, 0, reply, sizeof(reply)) != 0)
			return 1;
	return fake_drain(fd);
}

START_TEST(test_probe_reply_short_of_its_stop_points_is_refused_and_says_why)
{
	struct l3kv_completion	 c;
	struct ct_conn		 cn;
	struct l3kv		*k;
	uint8_t			 hash[L3KV_HASH_LEN];
	uint64_t		 t;
	uint32_t		 hit = 99;

	ct_hashes(hash, 1);
	k = ct_open(&cn, script_probe_stops_short);
	/* Its length suits a PROBE reply: the completion is a success that does not decode. */
	ck_assert_int_eq(l3kv_submit_probe(k, hash, 1, &t), 0);
	ck_assert_int_eq(ct_next(k, &c, 2000), 0);
	ck_assert_int_eq(c.status, 0);
	ck_assert_int_eq(l3kv_probe_result(&c, &hit), -EINVAL);
	ck_assert_uint_eq(hit, 0);
	l3kv_completion_release(&c);
	/* Waited for, it breaks the connection. */
	hit = 99;
	ck_assert_int_eq(l3kv_probe(k, hash, 1, &hit), -EPROTO);
	ck_assert_uint_eq(hit, 0);
	ck_assert_str_eq(l3kv_last_error(k), "libl3kv: PROBE reply of 12 bytes with 2 stop points");
	ck_assert_int_eq(l3kv_probe(k, hash, 1, &hit), -ENOTCONN);
	ct_close(&cn);
}
END_TEST

Suite *
suite_client(void)
{
	Suite	*s = suite_create("client");
	TCase	*tc = tcase_create("client");

	tcase_add_test(tc, test_strerror_covers_every_status);
	tcase_add_test(tc, test_connect_to_a_missing_socket_is_enoent_fast);
	tcase_add_test(tc, test_connect_where_nothing_listens_is_refused_fast);
	tcase_add_test(tc, test_connect_rejects_bad_arguments);
	tcase_add_test(tc, test_default_socket_follows_the_environment);
	tcase_add_test(tc, test_connect_reads_the_hello_reply);
	tcase_add_test(tc, test_replies_out_of_order_reach_their_tickets);
	tcase_add_test(tc, test_blocking_call_queues_other_completions);
	tcase_add_test(tc, test_corked_requests_wait_for_uncork_and_complete_in_order);
	tcase_add_test(tc, test_poll_completions_takes_a_batch_and_keeps_the_rest_pollable);
	tcase_add_test(tc, test_reply_with_bad_magic_is_eproto_and_breaks);
	tcase_add_loop_test(tc, test_unparseable_replies_are_eproto, 0,
	    (int)(sizeof(ct_bad_replies) / sizeof(ct_bad_replies[0])));
	tcase_add_test(tc, test_close_mid_reply_fails_without_hanging);
	tcase_add_test(tc, test_blocking_call_times_out);
	tcase_add_test(tc, test_auto_spin_sleeps_through_a_slow_reply);
	tcase_add_test(tc, test_late_reply_after_timeout_is_dropped);
	tcase_add_test(tc, test_error_status_maps_to_errno_and_keeps_the_connection);
	tcase_add_test(tc, test_error_frame_fails_every_request_in_flight);
	tcase_add_test(tc, test_daemon_hang_up_makes_the_fd_readable);
	tcase_add_test(tc, test_connect_times_out_without_hello_reply);
	tcase_add_test(tc, test_refusal_before_hello_is_its_errno);
	tcase_add_test(tc, test_send_after_the_daemon_left_reports_why);
	tcase_add_test(tc, test_error_right_after_hello_fails_the_connect);
	tcase_add_test(tc, test_large_reply_arrives_whole);
	tcase_add_test(tc, test_attach_sends_the_memfd_with_the_frame);
	tcase_add_test(tc, test_corked_frames_keep_fds_with_their_own_frame);
	tcase_add_test(tc, test_attach_larger_than_the_socket_buffer_goes_whole);
	tcase_add_test(tc, test_attach_refuses_what_cannot_be_encoded);
	tcase_add_test(tc, test_probe_and_admit_encode_and_decode_exactly);
	tcase_add_test(tc, test_restore_cancel_release_encode_and_decode_exactly);
	tcase_add_test(tc, test_publish_and_debug_encode_and_decode_exactly);
	tcase_add_test(tc, test_probe_asks_about_the_pool_admit_uses);
	tcase_add_test(tc, test_cache_submits_complete_out_of_order);
	tcase_add_test(tc, test_cache_calls_refuse_what_cannot_be_encoded);
	tcase_add_test(tc, test_admit_and_restore_take_their_own_timeout);
	tcase_add_test(tc, test_cache_reply_of_the_wrong_length_is_eproto);
	tcase_add_test(tc, test_probe_reply_short_of_its_stop_points_is_refused_and_says_why);
	suite_add_tcase(s, tc);
	return s;
}
