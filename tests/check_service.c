/*
 * The systemd unit: config/l3kvd.service, with its install-time paths
 * pointed at this build, passes `systemd-analyze verify` with nothing on
 * stderr (systemd reports unit problems there and still exits 0 for
 * many of them, so the exit code alone proves little).
 */
#include <sys/stat.h>
#include <sys/wait.h>

#include <limits.h>
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
	int	 pre = 0, start = 0, notify = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strcmp(line, "ExecStartPre=@SBINDIR@/l3kvd -n -f @SYSCONFDIR@/l3kv/l3kvd.json\n") == 0)
			pre = 1;
		if (strcmp(line, "ExecStart=@SBINDIR@/l3kvd -f @SYSCONFDIR@/l3kv/l3kvd.json\n") == 0)
			start = 1;
		if (strcmp(line, "Type=notify\n") == 0)
			notify = 1;
	}
	fclose(f);
	ck_assert(pre && start && notify);
}
END_TEST

Suite *
suite_service(void)
{
	Suite	*s = suite_create("service");
	TCase	*tc = tcase_create("unit");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_service_unit_passes_systemd_analyze_verify);
	tcase_add_test(tc, test_service_exec_start_pre_checks_the_config);
	suite_add_tcase(s, tc);
	return s;
}
