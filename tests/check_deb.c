/*
 * The Debian packages (debian/, `make deb`): built once for the suite, by
 * an unchecked fixture, from a copy of the tree into a mkdtemp directory
 * (so that neither build/ nor debian/ of the tree is touched), then checked
 * one aspect a test. tests/deb.sh does the work, a subcommand a test, and
 * prints what it found; a test fails with that output.
 *
 * The user tcase switches to the package's user and to two strangers, so
 * it runs as root only (CI's case); elsewhere it is listed as SKIPPED and
 * not counted.
 */
#include <sys/wait.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests.h"

#define DEB_OUT_MAX	(1 << 20)

static char	deb_dir[PATH_MAX];
static int	deb_build_status = -1;

/* Runs `tests/deb.sh CMD deb_dir`; returns its exit status, *out its stdout and stderr. */
static int
deb_sh(const char *cmd, char **out)
{
	const char	*src = getenv("L3KV_SRCDIR");
	char		 full[PATH_MAX * 3];
	FILE		*p;
	size_t		 n = 0, r;
	int		 st;

	snprintf(full, sizeof(full), "%s/tests/deb.sh %s %s 2>&1",
	    src != NULL && *src != '\0' ? src : ".", cmd, deb_dir);
	*out = calloc(1, DEB_OUT_MAX);
	if (*out == NULL || (p = popen(full, "r")) == NULL)
		return -1;
	while (n < DEB_OUT_MAX - 1 && (r = fread(*out + n, 1, DEB_OUT_MAX - 1 - n, p)) > 0)
		n += r;
	st = pclose(p);
	return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The last len bytes of s, for a failure message. */
static const char *
deb_tail(const char *s, size_t len)
{
	size_t	n = strlen(s);

	return n > len ? s + n - len : s;
}

/* Once for the tcase, in the runner's process: `make deb` on a copy of the tree. */
static void
deb_setup(void)
{
	char		*out = NULL, log[PATH_MAX + 16];
	const char	*t;
	FILE		*f;

	if (test_mkdtemp(deb_dir, sizeof(deb_dir)) == NULL) {
		deb_dir[0] = '\0';
		return;
	}
	deb_build_status = deb_sh("build", &out);
	if (out == NULL)
		return;
	snprintf(log, sizeof(log), "%s/build.log", deb_dir);
	if ((f = fopen(log, "w")) != NULL) {
		fputs(out, f);
		fclose(f);
	}
	/* The measured build time, in the test log. */
	if ((t = strstr(out, "make deb took")) != NULL)
		printf("deb: %.*s\n", (int)strcspn(t, "\n"), t);
	free(out);
}

static void
deb_teardown(void)
{
	if (deb_dir[0] != '\0' && getenv("L3KV_KEEP_DEB") == NULL)
		test_rmtree(deb_dir);
}

/* One check of tests/deb.sh on the built packages: passes when it exits 0. */
static void
deb_check(const char *cmd)
{
	char	*out, log[PATH_MAX + 16], *build = NULL;
	FILE	*f;
	int	 rc;

	ck_assert_msg(deb_dir[0] != '\0', "no temporary directory for the build");
	if (deb_build_status != 0) {
		snprintf(log, sizeof(log), "%s/build.log", deb_dir);
		build = calloc(1, DEB_OUT_MAX);
		if (build != NULL && (f = fopen(log, "r")) != NULL) {
			build[fread(build, 1, DEB_OUT_MAX - 1, f)] = '\0';
			fclose(f);
		}
		ck_abort_msg("make deb failed (status %d):\n%s", deb_build_status,
		    build != NULL ? deb_tail(build, 3000) : "");
	}
	rc = deb_sh(cmd, &out);
	ck_assert_ptr_nonnull(out);
	printf("deb %s:\n%s", cmd, out);
	ck_assert_msg(rc == 0, "tests/deb.sh %s exited %d:\n%s", cmd, rc, deb_tail(out, 3000));
	free(out);
}

/* Daemon, ctl, unit, conffile, man pages; library, soname link, headers, l3kv.pc; Python. */
START_TEST(test_deb_packages_hold_their_files)
{
	deb_check("contents");
}
END_TEST

/* Depends resolved through shlibs for every NEEDED library; the symbols file complete. */
START_TEST(test_deb_control_fields_and_shlibs)
{
	deb_check("control");
}
END_TEST

/* The conffile, the unit's enable and purge, the postinst making the l3kv user. */
START_TEST(test_deb_maintainer_scripts_make_the_user)
{
	deb_check("scripts");
}
END_TEST

START_TEST(test_deb_lintian_reports_no_error)
{
	deb_check("lintian");
}
END_TEST

/* The unpacked daemon answers the unpacked l3kvctl, C library (via l3kv.pc) and Python client. */
START_TEST(test_deb_unpacked_programs_work_together)
{
	deb_check("run");
}
END_TEST

/* As the unit runs it: the package's user, a 0750 runtime directory, README.Debian's access rules. */
START_TEST(test_deb_daemon_as_the_service_user)
{
	deb_check("scripts");
	deb_check("user");
}
END_TEST

Suite *
suite_deb(void)
{
	Suite	*s = suite_create("deb");
	TCase	*tc = tcase_create("packages");

	tcase_set_timeout(tc, 120);
	tcase_add_unchecked_fixture(tc, deb_setup, deb_teardown);
	tcase_add_test(tc, test_deb_packages_hold_their_files);
	tcase_add_test(tc, test_deb_control_fields_and_shlibs);
	tcase_add_test(tc, test_deb_maintainer_scripts_make_the_user);
	tcase_add_test(tc, test_deb_lintian_reports_no_error);
	tcase_add_test(tc, test_deb_unpacked_programs_work_together);
	if (geteuid() == 0)
		tcase_add_test(tc, test_deb_daemon_as_the_service_user);
	else
		printf("SKIPPED test deb/packages/test_deb_daemon_as_the_service_user: needs root "
		    "(it switches to the package's user)\n");
	suite_add_tcase(s, tc);
	return s;
}
