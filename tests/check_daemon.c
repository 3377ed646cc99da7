/*
 * Integration tests of the server itself, speaking raw frames to a real
 * l3kvd: every malformed-frame case answered with its exact status while
 * another client keeps working, the socket's safety rules, SIGTERM, the
 * per-uid cap, foreign uids, and systemd notification.
 */
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto.h"
#include "tests.h"

/* A socket of type (and SOCK_CLOEXEC) and the address of the path; sun gets it. */
static int
raw_socket(int type, const char *path, struct sockaddr_un *sun)
{
	int	fd;

	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	snprintf(sun->sun_path, sizeof(sun->sun_path), "%s", path);
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	return fd;
}

static int
raw_connect(const char *path)
{
	struct sockaddr_un	sun;
	int			fd = raw_socket(SOCK_STREAM, path, &sun);

	if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		close(fd);
		return -errno;
	}
	return fd;
}

/* Sends bytes, with one fd attached to the first byte when sendfd >= 0. */
static void
raw_send(int fd, const void *buf, size_t len, int sendfd)
{
	union {
		struct cmsghdr	hdr;
		char		buf[CMSG_SPACE(sizeof(int))];
	} cbuf;
	struct msghdr	msg;
	struct iovec	iov = { (void *)(uintptr_t)buf, len };
	struct cmsghdr	*cm;

	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	if (sendfd >= 0) {
		msg.msg_control = cbuf.buf;
		msg.msg_controllen = sizeof(cbuf.buf);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &sendfd, sizeof(int));
	}
	ck_assert_int_eq(sendmsg(fd, &msg, MSG_NOSIGNAL), (ssize_t)len);
}

static void
raw_frame(int fd, unsigned type, uint64_t seq, const void *payload, uint32_t len)
{
	uint8_t			buf[4096];
	struct proto_hdr	h;

	ck_assert_uint_le(len + sizeof(h), sizeof(buf));
	proto_hdr_init(&h, type, len, seq);
	memcpy(buf, &h, sizeof(h));
	if (len > 0)
		memcpy(buf + sizeof(h), payload, len);
	raw_send(fd, buf, sizeof(h) + len, -1);
}

/* Reads exactly len bytes within 5 s; returns bytes read (less at EOF). */
static size_t
raw_read(int fd, void *buf, size_t len)
{
	struct pollfd	pfd = { fd, POLLIN, 0 };
	size_t		got = 0;
	ssize_t		n;

	while (got < len) {
		ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
		n = read(fd, (uint8_t *)buf + got, len - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	return got;
}

/* Reads one reply frame; its payload (NUL-terminated) goes into buf. */
static struct proto_hdr
raw_reply(int fd, char *buf, size_t len)
{
	struct proto_hdr	h;

	ck_assert_uint_eq(raw_read(fd, &h, sizeof(h)), sizeof(h));
	ck_assert_uint_eq(h.magic, PROTO_MAGIC);
	ck_assert(h.flags & PROTO_F_REPLY);
	ck_assert_uint_lt(h.length, len);
	ck_assert_uint_eq(raw_read(fd, buf, h.length), h.length);
	buf[h.length] = '\0';
	return h;
}

/* Sends a frame without payload and reads its reply (into buf, as raw_reply). */
static struct proto_hdr
raw_request(int fd, unsigned type, uint64_t seq, char *buf, size_t len)
{
	raw_frame(fd, type, seq, NULL, 0);
	return raw_reply(fd, buf, len);
}

/* 1 when the daemon closed the connection (EOF within 5 s). */
static int
raw_eof(int fd)
{
	char	c;

	return raw_read(fd, &c, 1) == 0;
}

static void
raw_hello(int fd)
{
	struct proto_hello	hello;
	struct proto_hdr	h;
	char			buf[256];

	memset(&hello, 0, sizeof(hello));
	hello.version_min = 1;
	hello.version_max = 1;
	snprintf(hello.client, sizeof(hello.client), "check");
	raw_frame(fd, PROTO_T_HELLO, 1, &hello, sizeof(hello));
	h = raw_reply(fd, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_OK);
	ck_assert_uint_eq(h.type, PROTO_T_HELLO);
	ck_assert_uint_eq(h.seq, 1);
}

/* HEALTH on a fresh connection answers ok: the daemon still serves. */
static void
assert_daemon_serves(const char *sock)
{
	struct proto_hdr	h;
	char			buf[4096];
	int			fd;

	fd = raw_connect(sock);
	ck_assert_int_ge(fd, 0);
	raw_hello(fd);
	h = raw_request(fd, PROTO_T_HEALTH, 2, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_OK);
	ck_assert_ptr_nonnull(strstr(buf, "\"status\":\"ok\""));
	close(fd);
}

/*
 * Each malformed frame, answered with its exact status and reply type:
 * a header (proto_hdr_init's, with magic, version and flags where set)
 * and a payload of zeros, sent whole or only its first `cut` bytes (then
 * the write side shut where `shut`), with a /dev/null fd attached where
 * `fd`, after a HELLO unless `no_hello`.
 */
#define HDR	sizeof(struct proto_hdr)

static const struct {
	const char	*name;
	unsigned	 type;
	uint32_t	 length;
	uint32_t	 magic;
	uint16_t	 version;
	uint16_t	 flags;
	size_t		 cut;		/* 0: the whole frame */
	int		 shut;
	int		 fd;
	int		 no_hello;
	unsigned	 status;
	unsigned	 reply;		/* the reply's type */
} framing[] = {
	{ "short header", PROTO_T_HEALTH, 0, .cut = 10, .shut = 1,
	    .status = PROTO_S_SHORT_HEADER, .reply = PROTO_T_ERROR },
	{ "bad magic", PROTO_T_HEALTH, 0, .magic = 0x11223344,
	    .status = PROTO_S_BAD_MAGIC, .reply = PROTO_T_ERROR },
	{ "wrong version", PROTO_T_HEALTH, 0, .version = 9,
	    .status = PROTO_S_BAD_VERSION, .reply = PROTO_T_HEALTH },
	/* Only the header is sent: the daemon must not wait for 4 GiB. */
	{ "oversize length, refused before allocation", PROTO_T_ATTACH, 0xfffffff0U, .cut = HDR,
	    .status = PROTO_S_TOO_BIG, .reply = PROTO_T_ATTACH },
	{ "unknown type", 999, 0, .status = PROTO_S_BAD_TYPE, .reply = PROTO_T_ERROR },
	{ "reserved type (a number no message has)", 23, 0,
	    .status = PROTO_S_BAD_TYPE, .reply = PROTO_T_ERROR },
	{ "wrong payload length", PROTO_T_HEALTH, 4,
	    .status = PROTO_S_BAD_LENGTH, .reply = PROTO_T_HEALTH },
	{ "short HELLO", PROTO_T_HELLO, 8, .no_hello = 1,
	    .status = PROTO_S_BAD_LENGTH, .reply = PROTO_T_HELLO },
	{ "frame cut mid payload", PROTO_T_HELLO, sizeof(struct proto_hello), .cut = HDR + 10,
	    .shut = 1, .no_hello = 1, .status = PROTO_S_TRUNCATED, .reply = PROTO_T_HELLO },
	{ "fds on HEALTH", PROTO_T_HEALTH, 0, .flags = PROTO_F_FDS, .fd = 1,
	    .status = PROTO_S_UNEXPECTED_FDS, .reply = PROTO_T_HEALTH },
	{ "unflagged fds", PROTO_T_STATS, 0, .fd = 1,
	    .status = PROTO_S_UNEXPECTED_FDS, .reply = PROTO_T_STATS },
	{ "reply flag from a client", PROTO_T_HEALTH, 0, .flags = PROTO_F_REPLY,
	    .status = PROTO_S_BAD_FLAGS, .reply = PROTO_T_HEALTH },
};

/*
 * One malformed frame: the exact status and reply type, a reason, the
 * connection closed, and a second client, connected before, still served.
 */
START_TEST(test_malformed_frame_is_answered_with_its_status_and_closed)
{
	uint8_t			bytes[HDR + sizeof(struct proto_hello)] = { 0 };
	struct proto_hdr	h;
	const char		*name = framing[_i].name;
	char			buf[512];
	size_t			len = framing[_i].cut;
	int			bad, other, fd = -1;

	proto_hdr_init(&h, framing[_i].type, framing[_i].length, 42);
	if (framing[_i].magic != 0)
		h.magic = framing[_i].magic;
	if (framing[_i].version != 0)
		h.version = framing[_i].version;
	h.flags = framing[_i].flags;
	memcpy(bytes, &h, sizeof(h));
	if (len == 0)
		len = HDR + framing[_i].length;
	ck_assert_uint_le(len, sizeof(bytes));
	if (framing[_i].fd)
		ck_assert_int_ge(fd = open("/dev/null", O_RDONLY | O_CLOEXEC), 0);

	other = raw_connect(test_td.sock);
	ck_assert_int_ge(other, 0);
	raw_hello(other);
	bad = raw_connect(test_td.sock);
	ck_assert_int_ge(bad, 0);
	if (!framing[_i].no_hello)
		raw_hello(bad);
	raw_send(bad, bytes, len, fd);
	if (framing[_i].shut)
		shutdown(bad, SHUT_WR);
	h = raw_reply(bad, buf, sizeof(buf));
	ck_assert_msg(h.status == framing[_i].status, "%s: status %s (%s), want %s", name,
	    proto_status_name(h.status), buf, proto_status_name(framing[_i].status));
	ck_assert_msg(h.type == framing[_i].reply, "%s: reply type %u", name, h.type);
	ck_assert_msg(h.length > 0, "%s: no reason given", name);
	ck_assert_msg(raw_eof(bad), "%s: the connection stayed open", name);
	close(bad);
	if (fd >= 0)
		close(fd);

	h = raw_request(other, PROTO_T_HEALTH, 7, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_OK);
	ck_assert_uint_eq(h.seq, 7);
	close(other);
}
END_TEST

START_TEST(test_request_before_hello_is_answered_state_and_kept_open)
{
	struct proto_hdr	h;
	char			buf[4096];
	int			fd = raw_connect(test_td.sock);

	h = raw_request(fd, PROTO_T_STATS, 3, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_STATE);
	ck_assert_uint_eq(h.seq, 3);
	ck_assert_ptr_nonnull(strstr(buf, "before HELLO"));
	raw_hello(fd);
	h = raw_request(fd, PROTO_T_STATS, 4, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_OK);
	ck_assert_ptr_nonnull(strstr(buf, "\"frames\""));
	close(fd);
}
END_TEST

START_TEST(test_hello_without_common_version_is_refused)
{
	struct proto_hello	hello;
	struct proto_hdr	h;
	char			buf[512];
	int			fd = raw_connect(test_td.sock);

	memset(&hello, 0, sizeof(hello));
	hello.version_min = 2;
	hello.version_max = 5;
	raw_frame(fd, PROTO_T_HELLO, 1, &hello, sizeof(hello));
	h = raw_reply(fd, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_BAD_VERSION);
	ck_assert(raw_eof(fd));
	close(fd);
}
END_TEST

START_TEST(test_second_hello_is_answered_state)
{
	struct proto_hello	hello;
	struct proto_hdr	h;
	char			buf[512];
	int			fd = raw_connect(test_td.sock);

	raw_hello(fd);
	memset(&hello, 0, sizeof(hello));
	hello.version_min = hello.version_max = 1;
	raw_frame(fd, PROTO_T_HELLO, 2, &hello, sizeof(hello));
	h = raw_reply(fd, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_STATE);
	close(fd);
	assert_daemon_serves(test_td.sock);
}
END_TEST

START_TEST(test_garbage_stream_does_not_stop_the_daemon)
{
	uint8_t	junk[4096];
	size_t	i;
	int	fd;

	for (i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 131 + 7);
	fd = raw_connect(test_td.sock);
	raw_send(fd, junk, sizeof(junk), -1);
	close(fd);
	assert_daemon_serves(test_td.sock);
}
END_TEST

START_TEST(test_sigterm_exits_zero_and_removes_the_socket)
{
	struct stat	st;
	char		sock[PATH_MAX];
	int		status, fd;

	snprintf(sock, sizeof(sock), "%s", test_td.sock);
	fd = raw_connect(test_td.sock);	/* an idle client must not block the exit */
	raw_hello(fd);
	ck_assert_int_eq(kill(test_td.pid, SIGTERM), 0);
	ck_assert(raw_eof(fd));
	close(fd);
	ck_assert_int_eq(waitpid(test_td.pid, &status, 0), test_td.pid);
	test_td.pid = 0;
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	ck_assert_int_eq(stat(sock, &st), -1);
	ck_assert(test_daemon_log_has(&test_td, "stopping"));
}
END_TEST

/* A second daemon on a live socket exits 1 and the first keeps serving. */
START_TEST(test_second_daemon_on_live_socket_is_refused)
{
	char	bin[PATH_MAX], cmd[PATH_MAX * 3];
	int	rc;

	test_path("l3kvd", bin, sizeof(bin));
	snprintf(cmd, sizeof(cmd), "%s -f %s 2>%s/second.log", bin, test_td.config, test_td.dir);
	rc = system(cmd);
	ck_assert(WIFEXITED(rc));
	ck_assert_int_eq(WEXITSTATUS(rc), 1);
	assert_daemon_serves(test_td.sock);
}
END_TEST

/* A daemon started under a low soft open-file limit raises it to the hard one. */
START_TEST(test_soft_open_file_limit_is_raised_to_the_hard_one)
{
	struct test_daemon	d;
	struct rlimit		rl, low;
	char			want[96];
	int			st;

	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	ck_assert_msg(rl.rlim_max > 64, "hard open-file limit %llu", (unsigned long long)rl.rlim_max);
	low = rl;
	low.rlim_cur = rl.rlim_max > 512 ? 256 : rl.rlim_max - 1;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	st = test_daemon_start(&d, NULL);
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);	/* the test's own, back */
	ck_assert_int_eq(st, 0);
	snprintf(want, sizeof(want), "open-file limit raised from %llu to %llu",
	    (unsigned long long)low.rlim_cur,
	    rl.rlim_max == RLIM_INFINITY ? 1048576ULL : (unsigned long long)rl.rlim_max);
	ck_assert_msg(test_daemon_log_has(&d, want), "no \"%s\" in the daemon's log", want);
	ck_assert_int_eq(test_daemon_stop(&d, SIGTERM, &st), 0);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
END_TEST

START_TEST(test_per_uid_connection_cap_refuses_with_limit)
{
	struct proto_hdr	h;
	char			buf[512];
	int			fds[3], extra, i;

	test_td_restart("{\"limits\": {\"max_connections_per_uid\": 3}}");
	for (i = 0; i < 3; i++) {
		fds[i] = raw_connect(test_td.sock);
		raw_hello(fds[i]);
	}
	extra = raw_connect(test_td.sock);
	h = raw_reply(extra, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_LIMIT);
	ck_assert_uint_eq(h.type, PROTO_T_ERROR);
	ck_assert(raw_eof(extra));
	close(extra);
	close(fds[0]);
	/* A slot frees when a connection goes. */
	for (i = 0; i < 100; i++) {
		extra = raw_connect(test_td.sock);
		h = raw_request(extra, PROTO_T_HEALTH, 1, buf, sizeof(buf));
		close(extra);
		if (h.status == PROTO_S_STATE)	/* served: HEALTH before HELLO */
			break;
		ck_assert_uint_eq(h.status, PROTO_S_LIMIT);
		usleep(10000);
	}
	ck_assert_uint_eq(h.status, PROTO_S_STATE);
	close(fds[1]);
	close(fds[2]);
}
END_TEST

/* The daemon's socket gets exactly the configured mode. */
START_TEST(test_socket_gets_the_configured_mode)
{
	struct stat	st;

	ck_assert_int_eq(stat(test_td.sock, &st), 0);
	ck_assert(S_ISSOCK(st.st_mode));
	ck_assert_uint_eq(st.st_mode & 07777, 0600);
	test_td_restart("{\"socket\": {\"mode\": \"0660\"}}");
	ck_assert_int_eq(stat(test_td.sock, &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0660);
}
END_TEST

/* Tests that start their daemon themselves. */

static int
bind_stale_socket(const char *path)
{
	struct sockaddr_un	sun;
	int			fd = raw_socket(SOCK_STREAM, path, &sun);

	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	close(fd);	/* the path stays, nobody listens: stale */
	return 0;
}

START_TEST(test_stale_socket_is_removed_and_replaced)
{
	struct test_daemon	d;
	char			dir[PATH_MAX], sock[PATH_MAX];
	int			st, before = test_fd_count();

	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	snprintf(sock, sizeof(sock), "%s/l3kvd.sock", dir);
	bind_stale_socket(sock);
	ck_assert_int_eq(test_daemon_start_in(&d, dir, NULL), 0);
	ck_assert(test_daemon_log_has(&d, "removed stale socket"));
	assert_daemon_serves(d.sock);
	test_daemon_stop(&d, SIGTERM, &st);
	ck_assert_int_eq(WEXITSTATUS(st), 0);
	ck_assert_int_eq(test_fd_count(), before);
}
END_TEST

START_TEST(test_non_socket_at_the_path_is_left_alone)
{
	struct test_daemon	d;
	struct stat		sb;
	char			dir[PATH_MAX], sock[PATH_MAX];
	int			fd;

	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	snprintf(sock, sizeof(sock), "%s/l3kvd.sock", dir);
	fd = open(sock, O_WRONLY | O_CREAT, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "keep", 4), 4);
	close(fd);
	ck_assert_int_ne(test_daemon_start_in(&d, dir, NULL), 0);
	ck_assert_int_eq(stat(sock, &sb), 0);
	ck_assert(S_ISREG(sb.st_mode));
	ck_assert_int_eq(sb.st_size, 4);
	ck_assert(test_daemon_log_has(&d, "is not a socket"));
	test_rmtree(dir);
}
END_TEST

/* The next datagram on fd (within 5 s) is want. */
static void
notify_expect(int fd, const char *want)
{
	struct pollfd	pfd = { fd, POLLIN, 0 };
	char		msg[64];
	ssize_t		n;

	ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
	n = recv(fd, msg, sizeof(msg) - 1, 0);
	ck_assert_int_gt(n, 0);
	msg[n] = '\0';
	ck_assert_str_eq(msg, want);
}

/* NOTIFY_SOCKET gets READY=1 once the socket accepts, STOPPING=1 at SIGTERM. */
START_TEST(test_notify_socket_gets_ready_and_stopping)
{
	struct test_daemon	d;
	struct sockaddr_un	sun;
	char			dir[PATH_MAX], path[PATH_MAX];
	int			fd, st;

	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	snprintf(path, sizeof(path), "%s/notify", dir);
	fd = raw_socket(SOCK_DGRAM, path, &sun);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	setenv("NOTIFY_SOCKET", path, 1);
	ck_assert_int_eq(test_daemon_start_in(&d, dir, NULL), 0);
	unsetenv("NOTIFY_SOCKET");
	notify_expect(fd, "READY=1");
	kill(d.pid, SIGTERM);
	notify_expect(fd, "STOPPING=1");
	close(fd);
	test_daemon_stop(&d, SIGTERM, &st);
	ck_assert_int_eq(WEXITSTATUS(st), 0);
}
END_TEST

/* Root only: a peer whose uid is not allowed gets `denied` and is logged. */
START_TEST(test_foreign_uid_is_denied_and_logged)
{
	struct test_daemon	d;
	struct proto_hdr	h;
	char			dir[PATH_MAX], buf[512];
	pid_t			pid;
	int			st, fd;

	ck_assert_msg(geteuid() == 0, "this test must run as root");
	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	ck_assert_int_eq(chmod(dir, 0755), 0);
	ck_assert_int_eq(test_daemon_start_in(&d, dir, "{\"socket\": {\"mode\": \"0666\"}}"), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (setgid(65534) != 0 || setuid(65534) != 0)
			_exit(10);
		fd = raw_connect(d.sock);
		if (fd < 0)
			_exit(11);
		if (raw_read(fd, &h, sizeof(h)) != sizeof(h))
			_exit(12);
		if (h.status != PROTO_S_DENIED || h.type != PROTO_T_ERROR)
			_exit(13);
		if (raw_read(fd, buf, h.length) != h.length || !raw_eof(fd))
			_exit(14);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st));
	ck_assert_int_eq(WEXITSTATUS(st), 0);
	ck_assert(test_daemon_log_has(&d, "denied pid"));
	assert_daemon_serves(d.sock);
	test_daemon_stop(&d, SIGTERM, &st);

	/* The same uid on the allow-list is served. */
	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	ck_assert_int_eq(chmod(dir, 0755), 0);
	ck_assert_int_eq(test_daemon_start_in(&d, dir,
	    "{\"socket\": {\"mode\": \"0666\"}, \"access\": {\"allow_uids\": [65534]}}"), 0);
	pid = fork();
	if (pid == 0) {
		if (setgid(65534) != 0 || setuid(65534) != 0)
			_exit(10);
		fd = raw_connect(d.sock);
		raw_frame(fd, PROTO_T_HEALTH, 1, NULL, 0);
		if (raw_read(fd, &h, sizeof(h)) != sizeof(h) || h.status != PROTO_S_STATE)
			_exit(13);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(WEXITSTATUS(st), 0);
	test_daemon_stop(&d, SIGTERM, &st);
}
END_TEST

Suite *
suite_daemon(void)
{
	Suite	*s = suite_create("daemon");
	TCase	*tc;

	tc = test_tcase(s, "framing", 30, test_td_setup, test_td_teardown);
	tcase_add_loop_test(tc, test_malformed_frame_is_answered_with_its_status_and_closed, 0,
	    (int)(sizeof(framing) / sizeof(framing[0])));
	tcase_add_test(tc, test_request_before_hello_is_answered_state_and_kept_open);
	tcase_add_test(tc, test_hello_without_common_version_is_refused);
	tcase_add_test(tc, test_second_hello_is_answered_state);
	tcase_add_test(tc, test_garbage_stream_does_not_stop_the_daemon);

	tc = test_tcase(s, "lifecycle", 30, test_td_setup, test_td_teardown);
	tcase_add_test(tc, test_sigterm_exits_zero_and_removes_the_socket);
	tcase_add_test(tc, test_second_daemon_on_live_socket_is_refused);
	tcase_add_test(tc, test_soft_open_file_limit_is_raised_to_the_hard_one);
	tcase_add_test(tc, test_per_uid_connection_cap_refuses_with_limit);
	tcase_add_test(tc, test_socket_gets_the_configured_mode);

	tc = test_tcase(s, "socket", 30, NULL, NULL);
	tcase_add_test(tc, test_stale_socket_is_removed_and_replaced);
	tcase_add_test(tc, test_non_socket_at_the_path_is_left_alone);
	tcase_add_test(tc, test_notify_socket_gets_ready_and_stopping);
	return s;
}

Suite *
suite_root(void)
{
	Suite	*s = suite_create("root");
	TCase	*tc = test_tcase(s, "access", 30, NULL, NULL);

	tcase_add_test(tc, test_foreign_uid_is_denied_and_logged);
	return s;
}
