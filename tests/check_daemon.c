/*
 * Integration tests of the server itself, speaking raw frames to a real
 * l3kvd: every malformed-frame case answered with its exact status while
 * another client keeps working, the socket's safety rules, SIGTERM, the
 * per-uid cap, foreign uids, and systemd notification; and what bounds an
 * abusive client (the "limits" case): deadlines, the output bound, input
 * sized by bytes received, refusals a peer can read, running out of fds.
 */
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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
	/* Only the header: large frames wait for HELLO, so nothing waits for these bytes. */
	{ "large frame before HELLO", PROTO_T_ATTACH, 1U << 20, .cut = HDR, .no_hello = 1,
	    .status = PROTO_S_TOO_BIG, .reply = PROTO_T_ATTACH },
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

/* The "limits" case: what bounds an abusive client. */

/* A field of the daemon's /proc/PID/status, in kB ("VmSize:", "VmRSS:"). */
static long
proc_status_kb(pid_t pid, const char *field)
{
	char	path[64], line[256];
	FILE	*f;
	long	kb = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	ck_assert_ptr_nonnull(f = fopen(path, "r"));
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, strlen(field)) == 0)
			kb = strtol(line + strlen(field), NULL, 10);
	fclose(f);
	ck_assert_int_ge(kb, 0);
	return kb;
}

/*
 * The lowest fd number the daemon does not hold: with its open-file limit
 * there, it can open nothing more (it may have inherited fds far above).
 */
static int
proc_first_free_fd(pid_t pid)
{
	char		path[64];
	struct stat	st;
	int		fd;

	for (fd = 0; fd < 65536; fd++) {
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
		if (lstat(path, &st) != 0)
			return fd;
	}
	ck_abort_msg("daemon holds 65536 fds");
	return -1;
}

/* How many fds the daemon holds. */
static int
proc_fd_count(pid_t pid)
{
	char		path[64];
	DIR		*d;
	struct dirent	*e;
	int		 n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	ck_assert_ptr_nonnull(d = opendir(path));
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* Sets the daemon's soft open-file limit (the hard one stays), returning the old soft one. */
static rlim_t
daemon_set_nofile(pid_t pid, rlim_t soft)
{
	struct rlimit	old, rl;

	ck_assert_int_eq(prlimit(pid, RLIMIT_NOFILE, NULL, &old), 0);
	rl = old;
	rl.rlim_cur = soft;
	ck_assert_int_eq(prlimit(pid, RLIMIT_NOFILE, &rl, NULL), 0);
	return old.rlim_cur;
}

/* Lines of the daemon's log that contain needle. */
static int
log_count(const struct test_daemon *d, const char *needle)
{
	char	line[1024];
	FILE	*f;
	int	n = 0;

	ck_assert_ptr_nonnull(f = fopen(d->log, "r"));
	while (fgets(line, sizeof(line), f) != NULL)
		if (strstr(line, needle) != NULL)
			n++;
	fclose(f);
	return n;
}

/* STATS over an open raw connection (one that needs no new fd in the daemon). */
static long long
raw_stat(int fd, const char *section, const char *key)
{
	static char	 buf[1 << 16];
	struct proto_hdr h;
	json_t		*j, *v;
	long long	 n;

	h = raw_request(fd, PROTO_T_STATS, 99, buf, sizeof(buf));
	ck_assert_uint_eq(h.status, PROTO_S_OK);
	ck_assert_ptr_nonnull(j = json_loads(buf, 0, NULL));
	v = json_object_get(json_object_get(j, section), key);
	ck_assert_msg(json_is_integer(v), "stats %s.%s missing", section, key);
	n = json_integer_value(v);
	json_decref(j);
	return n;
}

/* The next reply is an ERROR frame of status st whose text has want; then EOF. */
static void
raw_expect_error(int fd, unsigned st, const char *want)
{
	struct proto_hdr	h;
	char			buf[512];

	h = raw_reply(fd, buf, sizeof(buf));
	ck_assert_msg(h.status == st, "status %s (%s), want %s", proto_status_name(h.status), buf,
	    proto_status_name(st));
	ck_assert_uint_eq(h.type, PROTO_T_ERROR);
	ck_assert_msg(strstr(buf, want) != NULL, "\"%s\" has no \"%s\"", buf, want);
	ck_assert(raw_eof(fd));
}

static void
raw_hello_frame(int fd)
{
	struct proto_hello	hello;

	memset(&hello, 0, sizeof(hello));
	hello.version_min = hello.version_max = 1;
	raw_frame(fd, PROTO_T_HELLO, 1, &hello, sizeof(hello));
}

/*
 * A refused peer that writes its HELLO after the daemon refused it (the
 * usual client: connect, send, read) still reads the refusal: the daemon
 * lingers instead of closing with the HELLO unread, which failed the
 * peer's write with EPIPE (52 of 60 refusals lost in the test).
 */
START_TEST(test_refusal_is_read_by_a_peer_that_writes_first)
{
	struct proto_hdr	h;
	char			buf[512];
	int			keep, fd, i;

	test_td_restart("{\"limits\": {\"max_connections_per_uid\": 1}}");
	/* The start-up probe's connection may not be gone yet. */
	for (i = 0; i < 100; i++) {
		keep = raw_connect(test_td.sock);
		h = raw_request(keep, PROTO_T_HEALTH, 1, buf, sizeof(buf));
		if (h.status == PROTO_S_STATE)	/* served: HEALTH before HELLO */
			break;
		close(keep);
		usleep(10000);
	}
	ck_assert_uint_eq(h.status, PROTO_S_STATE);
	raw_hello(keep);
	/*
	 * What an engine sees: libl3kv's connect (connect, HELLO, read) fails
	 * with the limit. It writes its HELLO before the daemon refuses, so
	 * this held on the old daemon too; the raw peers below wait 5 ms
	 * first, as a busy client may, and lost every refusal to EPIPE.
	 */
	for (i = 0; i < 60; i++) {
		struct l3kv	*k = NULL;

		ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &k), -EUSERS);
		ck_assert_ptr_null(k);
	}
	for (i = 0; i < 60; i++) {
		fd = raw_connect(test_td.sock);
		ck_assert_int_ge(fd, 0);
		usleep(5000);	/* the daemon accepts and refuses meanwhile */
		raw_hello_frame(fd);	/* asserts the whole frame was sent: no EPIPE */
		raw_expect_error(fd, PROTO_S_LIMIT, "connection limit reached");
		close(fd);
	}
	ck_assert_int_ge(raw_stat(keep, "connections", "limited"), 120);
	close(keep);
}
END_TEST

/* The same for a framing error: a peer still writing gets to read its ERROR. */
START_TEST(test_peer_writing_after_a_framing_error_still_reads_it)
{
	struct proto_hdr	h;
	char			buf[512];
	int			fd, i;

	for (i = 0; i < 20; i++) {
		fd = raw_connect(test_td.sock);
		raw_hello(fd);
		proto_hdr_init(&h, PROTO_T_HEALTH, 0, 5);
		h.magic = 0x11223344;
		raw_send(fd, &h, sizeof(h), -1);
		usleep(5000);	/* answered and closed meanwhile */
		raw_frame(fd, PROTO_T_HEALTH, 6, NULL, 0);
		h = raw_reply(fd, buf, sizeof(buf));
		ck_assert_uint_eq(h.status, PROTO_S_BAD_MAGIC);
		ck_assert(raw_eof(fd));
		close(fd);
	}
	assert_daemon_serves(test_td.sock);
}
END_TEST

START_TEST(test_no_hello_within_the_deadline_is_timed_out)
{
	int	fd;

	test_td_restart("{\"limits\": {\"hello_timeout_ms\": 100}}");
	fd = raw_connect(test_td.sock);
	raw_expect_error(fd, PROTO_S_TIMEOUT, "no HELLO within 100 ms");
	close(fd);
	ck_assert_int_eq(test_td_stat("connections", "timed_out"), 1);
	ck_assert_int_eq(test_td_stat_wait("connections", "open", 1), 1);	/* the stats one */
}
END_TEST

/*
 * Unattached connections are closed once idle for limits.attach_timeout_ms;
 * one that keeps asking stays, and an attached one is never timed out.
 */
START_TEST(test_unattached_idle_connection_is_timed_out_attached_is_not)
{
	static const struct test_rank_kv kv = { "daemon-test", "latent:64:fp8_e4m3",
	    L3KV_ATTN_MLA, 8, 8, 2, 64 };
	struct test_rank	r;
	struct proto_hdr	h;
	char			buf[4096];
	uint32_t		nstops = 0;
	int			fd, busy, i;

	test_td_restart("{\"limits\": {\"attach_timeout_ms\": 150}}");
	test_rank_init(&r, &kv, "g-limits", 1, 0);
	test_rank_attach(&r, test_td.sock);
	fd = raw_connect(test_td.sock);
	raw_hello(fd);
	busy = raw_connect(test_td.sock);
	raw_hello(busy);
	for (i = 0; i < 10; i++) {
		usleep(50000);
		h = raw_request(busy, PROTO_T_HEALTH, 10 + (uint64_t)i, buf, sizeof(buf));
		ck_assert_uint_eq(h.status, PROTO_S_OK);
	}
	/* 500 ms later: the idle one is gone, the busy one and the attached rank serve. */
	raw_expect_error(fd, PROTO_S_TIMEOUT, "not attached and idle for 150 ms");
	close(fd);
	ck_assert_uint_eq(test_rank_probe(&r, 1, 4, NULL, &nstops), 0);
	close(busy);
	test_rank_fini(&r);
	ck_assert_int_eq(test_td_stat("connections", "timed_out"), 1);
}
END_TEST

/* A frame begun and not finished: the partial header, then a partial payload. */
START_TEST(test_unfinished_frame_is_timed_out)
{
	struct proto_hdr	h;
	uint8_t			bytes[HDR + 100] = { 0 };
	int			fd;

	test_td_restart("{\"limits\": {\"frame_timeout_ms\": 100}}");
	fd = raw_connect(test_td.sock);
	raw_hello(fd);
	proto_hdr_init(&h, PROTO_T_HEALTH, 0, 2);
	raw_send(fd, &h, 10, -1);
	raw_expect_error(fd, PROTO_S_TIMEOUT, "a frame not finished within 100 ms");
	close(fd);

	fd = raw_connect(test_td.sock);
	raw_hello(fd);
	proto_hdr_init(&h, PROTO_T_ATTACH, 4096, 2);
	memcpy(bytes, &h, sizeof(h));
	raw_send(fd, bytes, sizeof(bytes), -1);
	raw_expect_error(fd, PROTO_S_TIMEOUT, "(124 bytes held)");
	close(fd);
	ck_assert_int_eq(test_td_stat("connections", "timed_out"), 2);
}
END_TEST

/*
 * Headers promising max_frame (16 MiB) after HELLO, with 1 KiB of payload
 * each: the daemon's buffers follow the bytes, not the promise (the old
 * code reserved 32 MiB of address space per connection: 1.6 GiB here),
 * and the frame deadline frees them.
 */
#define PROMISES	50

START_TEST(test_promised_length_reserves_nothing)
{
	struct proto_hdr	h;
	uint8_t			bytes[HDR + 1024] = { 0 };
	long			vm0, vm1, rss0, rss1;
	int			fds[PROMISES], i;

	test_td_restart("{\"limits\": {\"frame_timeout_ms\": 1000}}");
	for (i = 0; i < PROMISES; i++) {
		fds[i] = raw_connect(test_td.sock);
		raw_hello(fds[i]);
	}
	vm0 = proc_status_kb(test_td.pid, "VmSize:");
	rss0 = proc_status_kb(test_td.pid, "VmRSS:");
	proto_hdr_init(&h, PROTO_T_ATTACH, 16U << 20, 2);
	memcpy(bytes, &h, sizeof(h));
	for (i = 0; i < PROMISES; i++)
		raw_send(fds[i], bytes, sizeof(bytes), -1);
	usleep(200000);	/* every connection read its bytes */
	vm1 = proc_status_kb(test_td.pid, "VmSize:");
	rss1 = proc_status_kb(test_td.pid, "VmRSS:");
	ck_assert_msg(vm1 - vm0 < 16 * 1024, "address space grew %ld kB for %d promises",
	    vm1 - vm0, PROMISES);
	ck_assert_msg(rss1 - rss0 < 8 * 1024, "RSS grew %ld kB", rss1 - rss0);
	for (i = 0; i < PROMISES; i++) {
		raw_expect_error(fds[i], PROTO_S_TIMEOUT, "a frame not finished");
		close(fds[i]);
	}
	ck_assert_int_eq(test_td_stat("connections", "timed_out"), PROMISES);
	ck_assert_int_eq(test_td_stat_wait("connections", "open", 1), 1);
}
END_TEST

/* Sends up to n STATS frames without reading; returns how many the socket took. */
static unsigned
send_stats_unread(int fd, unsigned n, int wait_ms)
{
	static uint8_t		frames[1024 * HDR];
	struct proto_hdr	h;
	struct pollfd		pfd = { fd, POLLOUT, 0 };
	size_t			off = 0, len = 0;
	unsigned		sent = 0, queued = 0, i;
	ssize_t			w;

	while (sent < n) {
		if (off == len) {
			for (i = 0, len = 0; i < 1024 && queued < n; i++, queued++) {
				proto_hdr_init(&h, PROTO_T_STATS, 0, 100 + queued);
				memcpy(frames + len, &h, sizeof(h));
				len += sizeof(h);
			}
			off = 0;
		}
		w = send(fd, frames + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0) {
			off += (size_t)w;
			sent = queued - (unsigned)((len - off) / HDR);
			continue;
		}
		ck_assert_msg(w < 0 && errno == EAGAIN, "send: %s", strerror(errno));
		if (poll(&pfd, 1, wait_ms) == 0)
			break;	/* the daemon stopped reading */
	}
	return sent;
}

/*
 * 100k STATS requests sent and no reply read (the issue: RSS from 5 MB
 * to 127 MB): the daemon stops reading once limits.max_output of replies
 * wait, so the client's sends block and the daemon's memory stays put;
 * the connection is closed when the replies are not taken within
 * limits.output_timeout_ms.
 */
START_TEST(test_unread_replies_stop_reading_and_are_dropped_at_the_deadline)
{
	long		rss0, rss1;
	unsigned	sent;
	int		fd;

	test_td_restart("{\"limits\": {\"max_output\": \"256 KiB\", \"output_timeout_ms\": 1500}}");
	fd = raw_connect(test_td.sock);
	raw_hello(fd);
	rss0 = proc_status_kb(test_td.pid, "VmRSS:");
	sent = send_stats_unread(fd, 100000, 500);
	rss1 = proc_status_kb(test_td.pid, "VmRSS:");
	/* The old daemon read all 100000 and grew by 120 MB (ASan's quarantine adds some here). */
	ck_assert_msg(sent < 20000, "the daemon read %u requests", sent);
	ck_assert_msg(rss1 - rss0 < 32 * 1024, "RSS grew %ld kB with %u requests unanswered",
	    rss1 - rss0, sent);
	ck_assert_int_eq(test_td_stat_wait("connections", "slow", 1), 1);
	ck_assert_int_eq(test_td_stat_wait("connections", "open", 1), 1);
	close(fd);
	assert_daemon_serves(test_td.sock);
}
END_TEST

/*
 * A reader slower than its requests (a child sends 3000 STATS, blocking;
 * this process reads 4 KiB at a time): reading pauses and resumes at
 * limits.max_output, and every reply comes, in order.
 */
START_TEST(test_slow_reader_gets_every_reply_in_order)
{
	static uint8_t		in[1 << 16];
	struct proto_hdr	h;
	size_t			have = 0, used;
	unsigned		want = 3000, got = 0, i;
	pid_t			pid;
	int			fd, st;
	ssize_t			n;

	test_td_restart("{\"limits\": {\"max_output\": \"64 KiB\"}}");
	fd = raw_connect(test_td.sock);
	raw_hello(fd);
	ck_assert_int_ge(pid = fork(), 0);
	if (pid == 0) {
		for (i = 0; i < want; i++) {
			proto_hdr_init(&h, PROTO_T_STATS, 0, 100 + i);
			if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h))
				_exit(1);
		}
		_exit(0);
	}
	while (got < want) {
		usleep(500);
		n = recv(fd, in + have, sizeof(in) - have < 4096 ? sizeof(in) - have : 4096, 0);
		ck_assert_int_gt(n, 0);
		have += (size_t)n;
		for (used = 0; have - used >= HDR; used += HDR + h.length) {
			memcpy(&h, in + used, HDR);
			if (have - used < HDR + h.length)
				break;
			ck_assert_uint_eq(h.status, PROTO_S_OK);
			ck_assert_uint_eq(h.type, PROTO_T_STATS);
			ck_assert_uint_eq(h.seq, 100 + got);	/* each call numbers from 100 */
			got++;
		}
		memmove(in, in + used, have - used);
		have -= used;
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(fd);
	ck_assert_int_eq(test_td_stat("connections", "slow"), 0);
}
END_TEST

/*
 * Waits until the daemon holds no connection but fd's: the one that
 * started it may still be closing, and its fd would leave a hole below
 * the limit a test sets.
 */
static void
wait_open_raw(int fd)
{
	int	i;

	for (i = 0; i < 500 && raw_stat(fd, "connections", "open") != 1; i++)
		usleep(10000);
	ck_assert_int_eq(raw_stat(fd, "connections", "open"), 1);
}

/* connections.open, asked on k's own connection. */
static long long
stats_open(struct l3kv *k)
{
	json_t		*j;
	char		*text = NULL;
	long long	 n;

	ck_assert_int_eq(l3kv_stats(k, &text), 0);
	ck_assert_ptr_nonnull(j = json_loads(text, 0, NULL));
	n = json_integer_value(json_object_get(json_object_get(j, "connections"), "open"));
	json_decref(j);
	l3kv_free(text);
	return n;
}

/*
 * Connects until the daemon, at its open-file limit, refuses a peer with
 * the spare fd; the connections it could still accept are kept in held
 * (their count in *nheld). Returns the refused one's socket, its refusal
 * read. The old daemon left such a peer hanging in the backlog.
 */
static void
fill_daemon_fds(int *held, int max, int *nheld)
{
	struct pollfd	pfd;
	int		fd, i;

	for (i = 0; i < max; i++) {
		fd = raw_connect(test_td.sock);
		ck_assert_int_ge(fd, 0);
		pfd.fd = fd;
		pfd.events = POLLIN;
		if (poll(&pfd, 1, 1000) == 1) {
			raw_expect_error(fd, PROTO_S_LIMIT, "out of file descriptors");
			close(fd);
			return;
		}
		raw_hello(fd);	/* accepted: it holds one of the daemon's fds */
		ck_assert_int_lt(*nheld, max);
		held[(*nheld)++] = fd;
	}
	ck_abort_msg("%d connections and none refused", max);
}

START_TEST(test_out_of_fds_refuses_cleanly_logs_once_and_recovers)
{
	int	keep, held[32], nheld = 0, i, fds;
	rlim_t	was;

	keep = raw_connect(test_td.sock);
	raw_hello(keep);
	wait_open_raw(keep);
	fds = proc_fd_count(test_td.pid);
	was = daemon_set_nofile(test_td.pid, (rlim_t)proc_first_free_fd(test_td.pid));
	fill_daemon_fds(held, 32, &nheld);
	for (i = 0; i < 4; i++)
		fill_daemon_fds(held, 1, &nheld);
	ck_assert_int_eq(raw_stat(keep, "connections", "no_fd"), 5);
	ck_assert_int_eq(log_count(&test_td, "connections refused since the last such message"),
	    1);
	daemon_set_nofile(test_td.pid, was);
	assert_daemon_serves(test_td.sock);
	for (i = 0; i < nheld; i++)
		close(held[i]);
	close(keep);
	/* Every refused socket closed, the spare fd taken back: keep's fd alone is gone. */
	for (i = 0; i < 300 && proc_fd_count(test_td.pid) != fds - 1; i++)
		usleep(10000);
	ck_assert_int_eq(proc_fd_count(test_td.pid), fds - 1);
}
END_TEST

/*
 * An ATTACH whose fds the kernel could not install (the daemon at its
 * open-file limit: MSG_CTRUNC and no control message) is refused as such
 * and the connection kept: the same ATTACH succeeds once fds are back.
 * The old daemon took it as an ATTACH that carried no fds (bad_region).
 */
START_TEST(test_attach_whose_fds_the_kernel_dropped_is_refused_as_such)
{
	static const struct test_rank_kv kv = { "daemon-test", "latent:64:fp8_e4m3",
	    L3KV_ATTN_MLA, 8, 8, 2, 64 };
	struct test_rank	r;
	rlim_t			was;
	int			rc, i;

	test_rank_init(&r, &kv, "g-ctrunc", 1, 0);
	ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &r.k), 0);
	for (i = 0; i < 500 && stats_open(r.k) != 1; i++)
		usleep(10000);
	was = daemon_set_nofile(test_td.pid, (rlim_t)proc_first_free_fd(test_td.pid));
	rc = l3kv_attach(r.k, &r.args, NULL);
	ck_assert_msg(rc == -EUSERS, "attach: %d %s", rc, l3kv_last_error(r.k));
	ck_assert_uint_eq(l3kv_last_status(r.k), PROTO_S_LIMIT);
	ck_assert_ptr_nonnull(strstr(l3kv_last_error(r.k), "dropped by the kernel (MSG_CTRUNC)"));
	daemon_set_nofile(test_td.pid, was);
	ck_assert_msg(l3kv_attach(r.k, &r.args, NULL) == 0, "attach: %s", l3kv_last_error(r.k));
	test_rank_fini(&r);
	ck_assert_int_eq(test_td_stat("attach", "refused"), 1);
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

	tc = test_tcase(s, "limits", 30, test_td_setup, test_td_teardown);
	tcase_add_test(tc, test_refusal_is_read_by_a_peer_that_writes_first);
	tcase_add_test(tc, test_peer_writing_after_a_framing_error_still_reads_it);
	tcase_add_test(tc, test_no_hello_within_the_deadline_is_timed_out);
	tcase_add_test(tc, test_unattached_idle_connection_is_timed_out_attached_is_not);
	tcase_add_test(tc, test_unfinished_frame_is_timed_out);
	tcase_add_test(tc, test_promised_length_reserves_nothing);
	tcase_add_test(tc, test_unread_replies_stop_reading_and_are_dropped_at_the_deadline);
	tcase_add_test(tc, test_slow_reader_gets_every_reply_in_order);
	tcase_add_test(tc, test_out_of_fds_refuses_cleanly_logs_once_and_recovers);
	tcase_add_test(tc, test_attach_whose_fds_the_kernel_dropped_is_refused_as_such);

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
