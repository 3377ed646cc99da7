/*
 * The systemd unit: config/l3kvd.service, with its install-time paths
 * pointed at this build, passes `systemd-analyze verify` with nothing on
 * stderr (systemd reports unit problems there and still exits 0 for
 * many of them, so the exit code alone proves little).
 *
 * And the notification protocol as systemd sees it, through a datagram
 * socket of the test's own on $NOTIFY_SOCKET: READY=1, WATCHDOG=1 at half
 * of $WATCHDOG_USEC (none when $WATCHDOG_PID names another process),
 * RELOADING=1 with MONOTONIC_USEC= then READY=1 around a SIGHUP, and
 * STOPPING=1.
 */
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests.h"

/* Copies src to dst replacing @SBINDIR@ and @SYSCONFDIR@. */
static void
service_render(const char *src, const char *dst, const char *sbindir, const char *sysconfdir)
{
	FILE	*in, *out;
	char	 line[1024], *at;

	in = fopen(src, "r");
	ck_assert_ptr_nonnull(in);
	out = fopen(dst, "w");
	ck_assert_ptr_nonnull(out);
	while (fgets(line, sizeof(line), in) != NULL) {
		char *p = line;

		while ((at = strchr(p, '@')) != NULL) {
			fwrite(p, 1, (size_t)(at - p), out);
			if (strncmp(at, "@SBINDIR@", 9) == 0) {
				fputs(sbindir, out);
				p = at + 9;
			} else if (strncmp(at, "@SYSCONFDIR@", 12) == 0) {
				fputs(sysconfdir, out);
				p = at + 12;
			} else {
				fputc('@', out);
				p = at + 1;
			}
		}
		fputs(p, out);
	}
	fclose(in);
	fclose(out);
}

START_TEST(test_service_unit_passes_systemd_analyze_verify)
{
	char	dir[PATH_MAX], unit[PATH_MAX], build[PATH_MAX], cmd[PATH_MAX * 3];
	char	errlog[PATH_MAX], etc[PATH_MAX], buf[4096];
	FILE	*f;
	size_t	n;
	int	rc;

	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	ck_assert_ptr_nonnull(realpath(test_build_dir(), build));
	snprintf(etc, sizeof(etc), "%s/etc", dir);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/l3kv && cp config/l3kvd.json config/README.md %s/l3kv/",
	    etc, etc);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(unit, sizeof(unit), "%s/l3kvd.service", dir);
	service_render("config/l3kvd.service", unit, build, etc);
	snprintf(errlog, sizeof(errlog), "%s/verify.err", dir);
	snprintf(cmd, sizeof(cmd), "systemd-analyze verify --man=no %s >/dev/null 2>%s", unit,
	    errlog);
	rc = system(cmd);
	f = fopen(errlog, "r");
	ck_assert_ptr_nonnull(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	test_rmtree(dir);
	ck_assert_msg(n == 0, "systemd-analyze verify wrote to stderr: %s", buf);
	ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "systemd-analyze verify failed");
}
END_TEST

/* The ExecStartPre line really checks the config the unit starts with. */
START_TEST(test_service_exec_start_pre_checks_the_config)
{
	FILE	*f = fopen("config/l3kvd.service", "r");
	char	 line[1024];
	int	 pre = 0, start = 0, notify = 0, reload = 0, watchdog = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strcmp(line, "ExecStartPre=@SBINDIR@/l3kvd -n -f @SYSCONFDIR@/l3kv/l3kvd.json\n") == 0)
			pre = 1;
		if (strcmp(line, "ExecStart=@SBINDIR@/l3kvd -f @SYSCONFDIR@/l3kv/l3kvd.json\n") == 0)
			start = 1;
		if (strcmp(line, "Type=notify\n") == 0)
			notify = 1;
		if (strcmp(line, "ExecReload=/bin/kill -HUP $MAINPID\n") == 0)
			reload = 1;
		if (strncmp(line, "WatchdogSec=", 12) == 0 && atoi(line + 12) > 0)
			watchdog = 1;
	}
	fclose(f);
	ck_assert(pre && start && notify);
	ck_assert_msg(reload, "no ExecReload= sending SIGHUP");
	ck_assert_msg(watchdog, "no WatchdogSec=");
}
END_TEST

/* The test's end of $NOTIFY_SOCKET: a datagram socket in dir. */
static int
notify_listen(const char *dir, char *path, size_t len)
{
	struct sockaddr_un	sun;
	int			fd;

	ck_assert((size_t)snprintf(path, len, "%s/notify.sock", dir) < sizeof(sun.sun_path));
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, strlen(path));
	ck_assert_int_ge(fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0), 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	return fd;
}

/* The next datagram within ms, NUL-terminated into buf; 0, or -ETIMEDOUT. */
static int
notify_recv(int fd, char *buf, size_t len, int ms)
{
	struct pollfd	pfd = { fd, POLLIN, 0 };
	ssize_t		n;

	if (poll(&pfd, 1, ms) != 1)
		return -ETIMEDOUT;
	ck_assert_int_ge(n = recv(fd, buf, len - 1, 0), 0);
	buf[n] = '\0';
	return 0;
}

/* Waits for a datagram that is exactly want, counting the WATCHDOG=1 seen on the way. */
static int
notify_wait(int fd, const char *want, int ms, int *pings)
{
	char	buf[512];

	for (; ms > 0; ms -= 10) {
		if (notify_recv(fd, buf, sizeof(buf), 10) != 0)
			continue;
		if (strcmp(buf, want) == 0)
			return 1;
		if (pings != NULL && strcmp(buf, "WATCHDOG=1") == 0)
			(*pings)++;
	}
	return 0;
}

static uint64_t
notify_now_usec(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

START_TEST(test_notify_ready_watchdog_reload_stopping)
{
	struct test_daemon	d;
	char			dir[PATH_MAX], path[PATH_MAX], buf[512];
	uint64_t		before, mono;
	int			fd, st, pings = 0, i;

	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	fd = notify_listen(dir, path, sizeof(path));
	ck_assert_int_eq(setenv("NOTIFY_SOCKET", path, 1), 0);
	/* 200 ms: a ping every 100 ms */
	ck_assert_int_eq(setenv("WATCHDOG_USEC", "200000", 1), 0);
	unsetenv("WATCHDOG_PID");
	ck_assert_int_eq(test_daemon_start_in(&d, dir, NULL), 0);
	ck_assert_msg(notify_wait(fd, "READY=1", 5000, NULL), "no READY=1");
	/* 1 s of pings: about 10 */
	for (before = notify_now_usec(); notify_now_usec() - before < 1000000; )
		if (notify_recv(fd, buf, sizeof(buf), 10) == 0 && strcmp(buf, "WATCHDOG=1") == 0)
			pings++;
	ck_assert_msg(pings >= 4 && pings <= 15, "%d pings in a second at a 200 ms watchdog", pings);
	ck_assert(test_daemon_log_has(&d, "systemd watchdog: WATCHDOG=1 every 100 ms"));

	/* a reload: RELOADING=1 with the monotonic clock, then READY=1 */
	before = notify_now_usec();
	ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
	for (i = 0; i < 200; i++) {
		ck_assert_int_eq(notify_recv(fd, buf, sizeof(buf), 1000), 0);
		if (strncmp(buf, "RELOADING=1\n", 12) == 0)
			break;
		ck_assert_str_eq(buf, "WATCHDOG=1");
	}
	ck_assert_msg(sscanf(buf, "RELOADING=1\nMONOTONIC_USEC=%" SCNu64, &mono) == 1, "%s", buf);
	ck_assert_msg(mono >= before && mono <= notify_now_usec(), "MONOTONIC_USEC=%" PRIu64
	    " is not between %" PRIu64 " and now", mono, before);
	ck_assert_msg(notify_wait(fd, "READY=1", 5000, NULL), "no READY=1 after the reload");

	ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
	ck_assert_msg(notify_wait(fd, "STOPPING=1", 5000, NULL), "no STOPPING=1");
	ck_assert_int_eq(test_daemon_stop(&d, SIGTERM, &st), 0);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(fd);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
}
END_TEST

/* $WATCHDOG_PID names the process the watchdog is for: another one's means no pings. */
START_TEST(test_notify_watchdog_is_for_its_pid_only)
{
	struct test_daemon	d;
	char			dir[PATH_MAX], path[PATH_MAX];
	int			fd, st, pings = 0;

	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	fd = notify_listen(dir, path, sizeof(path));
	ck_assert_int_eq(setenv("NOTIFY_SOCKET", path, 1), 0);
	ck_assert_int_eq(setenv("WATCHDOG_USEC", "100000", 1), 0);
	ck_assert_int_eq(setenv("WATCHDOG_PID", "1", 1), 0);
	ck_assert_int_eq(test_daemon_start_in(&d, dir, NULL), 0);
	ck_assert_msg(notify_wait(fd, "READY=1", 5000, &pings), "no READY=1");
	ck_assert(!notify_wait(fd, "WATCHDOG=1", 600, &pings));
	ck_assert_int_eq(pings, 0);
	ck_assert(!test_daemon_log_has(&d, "systemd watchdog"));
	ck_assert_int_eq(test_daemon_stop(&d, SIGTERM, &st), 0);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(fd);
}
END_TEST

Suite *
suite_service(void)
{
	Suite	*s = suite_create("service");
	TCase	*tc = tcase_create("unit");
	TCase	*notify = tcase_create("notify");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_service_unit_passes_systemd_analyze_verify);
	tcase_add_test(tc, test_service_exec_start_pre_checks_the_config);
	suite_add_tcase(s, tc);
	tcase_set_timeout(notify, 30);
	tcase_add_test(notify, test_notify_ready_watchdog_reload_stopping);
	tcase_add_test(notify, test_notify_watchdog_is_for_its_pid_only);
	suite_add_tcase(s, notify);
	return s;
}
