/*
 * l3kvctl, run as a user would against a real l3kvd: each command's
 * output and exit status (0 done, 1 the daemon could not be asked,
 * 2 bad usage), the JSON it prints parsed back, and the `stats -H`
 * table checked against the JSON's counters.
 */
#include <sys/wait.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tests.h"

static struct test_daemon	td;

static void
setup(void)
{
	ck_assert_int_eq(test_daemon_start(&td, NULL), 0);
}

static void
teardown(void)
{
	int	st;

	ck_assert_int_eq(test_daemon_stop(&td, SIGTERM, &st), 0);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* A whole file, NUL-terminated; the caller frees. */
static char *
ctl_slurp(const char *path)
{
	FILE	*f = fopen(path, "r");
	char	*buf;
	size_t	 n;

	ck_assert_ptr_nonnull(f);
	buf = calloc(1, 1 << 20);
	ck_assert_ptr_nonnull(buf);
	n = fread(buf, 1, (1 << 20) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/*
 * Runs `l3kvctl ARGS` with stdout and stderr into files of the daemon's
 * directory; returns its exit status, *out and *err its output (freed
 * by the caller).
 */
static int
ctl_run(const char *args, char **out, char **err)
{
	char	bin[PATH_MAX], cmd[PATH_MAX * 4], o[PATH_MAX], e[PATH_MAX];
	int	rc;

	test_path("l3kvctl", bin, sizeof(bin));
	snprintf(o, sizeof(o), "%s/ctl.out", td.dir);
	snprintf(e, sizeof(e), "%s/ctl.err", td.dir);
	snprintf(cmd, sizeof(cmd), "%s %s >%s 2>%s", bin, args, o, e);
	rc = system(cmd);
	ck_assert_msg(WIFEXITED(rc), "%s: status %#x", cmd, rc);
	*out = ctl_slurp(o);
	*err = ctl_slurp(e);
	return WEXITSTATUS(rc);
}

/* ctl_run() against the test's daemon: `l3kvctl -s SOCKET CMD`. */
static int
ctl_run_here(const char *cmd, char **out, char **err)
{
	char	args[PATH_MAX + 64];

	ck_assert_int_lt(snprintf(args, sizeof(args), "-s %s %s", td.sock, cmd), (int)sizeof(args));
	return ctl_run(args, out, err);
}

static json_t *
ctl_json(const char *text)
{
	json_error_t	 jerr;
	json_t		*j = json_loads(text, 0, &jerr);

	ck_assert_msg(j != NULL, "not JSON (%s): %s", jerr.text, text);
	return j;
}

START_TEST(test_health_prints_the_daemons_document)
{
	char	*out, *err;
	json_t	*j;

	ck_assert_int_eq(ctl_run_here("health", &out, &err), 0);
	j = ctl_json(out);
	ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "ok");
	ck_assert_str_eq(json_string_value(json_object_get(j, "role")), "decode");
	ck_assert_str_eq(err, "");
	json_decref(j);
	free(out);
	free(err);
}
END_TEST

/* The socket may come from $L3KV_SOCKET too. */
START_TEST(test_stats_json_and_table_agree)
{
	char	*out, *err, *tab, *terr, row[128], *line;
	json_t	*j, *cache;
	long long n;

	ck_assert_int_eq(setenv("L3KV_SOCKET", td.sock, 1), 0);
	ck_assert_int_eq(ctl_run("stats", &out, &err), 0);
	j = ctl_json(out);
	cache = json_object_get(j, "cache");
	ck_assert(json_is_integer(json_object_get(cache, "leases_open")));
	ck_assert(json_is_null(json_object_get(j, "file")));	/* no file tier configured */
	n = json_integer_value(json_object_get(json_object_get(j, "requests"), "stats"));
	ck_assert_int_ge(n, 1);

	ck_assert_int_eq(ctl_run("stats -H", &tab, &terr), 0);
	ck_assert_str_eq(terr, "");
	ck_assert_ptr_null(strstr(tab, "\"cache\""));	/* a table, not JSON */
	ck_assert_ptr_nonnull(strstr(tab, "\ncache\n"));
	/* a tier that is off is a group of its own, in the daemon's order */
	line = strstr(tab, "\nfile\n  off\n");
	ck_assert_msg(line != NULL, "no \"file\" group saying off: %s", tab);
	ck_assert_msg(strstr(tab, "\ndram\n") != NULL && strstr(tab, "\ndram\n") < line,
	    "the file group is not after the dram group: %s", tab);
	ck_assert_msg(strstr(tab, "{}") == NULL, "an empty object printed as {}: %s", tab);
	/* the table's STATS came one request after the JSON's */
	snprintf(row, sizeof(row), "stats   %lld\n", n + 1);
	line = strstr(tab, "\nrequests\n");
	ck_assert_ptr_nonnull(line);
	ck_assert_msg(strstr(line, row) != NULL, "no \"%s\" under requests: %s", row, line);
	unsetenv("L3KV_SOCKET");
	json_decref(j);
	free(out);
	free(err);
	free(tab);
	free(terr);
}
END_TEST

/* Arrays (the groups attached) become one row per element's counter, named by index. */
START_TEST(test_stats_table_names_array_elements_by_index)
{
	static const struct test_rank_kv	kv = { "ctl-test", "latent:64:fp8_e4m3",
						    L3KV_ATTN_MLA, 4, 16, 2, 64 };
	struct test_rank			r;
	char					*out, *err, *groups;

	test_rank_init(&r, &kv, "ctl-group", 1, 0);
	test_rank_attach(&r, td.sock);
	ck_assert_int_eq(ctl_run_here("stats -H", &out, &err), 0);
	ck_assert_str_eq(err, "");
	groups = strstr(out, "\ngroups\n");
	ck_assert_msg(groups != NULL, "no groups section: %s", out);
	ck_assert_msg(strstr(groups, "\ngroups\n  0.id                   ctl-group\n"
	    "  0.size                 1\n  0.attached             1\n"
	    "  0.prefetch             wait_complete\n  0.write                write_through\n"
	    "  0.prefetch_timeout_ms  0\n") != NULL, "groups: %s", groups);
	/* A namespace's pools, with their DRAM objects (issue 11 item 12). */
	ck_assert_msg(strstr(out, "\n  0.pools.kv.kind          kv\n"
	    "  0.pools.kv.dram_objects  0\n") != NULL, "namespaces: %s", out);
	/* Hits by tier, under cache. */
	ck_assert_msg(strstr(out, "  hits.dram ") != NULL && strstr(out, "  hits.file ") != NULL,
	    "cache hits: %s", out);
	test_rank_fini(&r);
	free(out);
	free(err);
}
END_TEST

START_TEST(test_version_names_client_and_server)
{
	char	*out, *err;
	json_t	*j;

	ck_assert_int_eq(ctl_run_here("version", &out, &err), 0);
	j = ctl_json(out);
	ck_assert(json_is_string(json_object_get(json_object_get(j, "client"), "version")));
	ck_assert(json_is_object(json_object_get(j, "server")));
	json_decref(j);
	free(out);
	free(err);
}
END_TEST

START_TEST(test_no_daemon_is_exit_1_with_a_reason)
{
	char	args[PATH_MAX + 32], *out, *err, want[PATH_MAX + 64];
	json_t	*j;

	snprintf(args, sizeof(args), "-s %s/nobody.sock -t 200 health", td.dir);
	ck_assert_int_eq(ctl_run(args, &out, &err), 1);
	snprintf(want, sizeof(want), "l3kvctl: connect %s/nobody.sock: ", td.dir);
	ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "stderr: %s", err);
	ck_assert_str_eq(out, "");
	free(out);
	free(err);
	/* version still prints the client's, with a null server */
	snprintf(args, sizeof(args), "-s %s/nobody.sock -t 200 version", td.dir);
	ck_assert_int_eq(ctl_run(args, &out, &err), 1);
	j = ctl_json(out);
	ck_assert(json_is_null(json_object_get(j, "server")));
	json_decref(j);
	free(out);
	free(err);
}
END_TEST

START_TEST(test_bad_usage_is_exit_2)
{
	static const char	*bad[] = { "", "frobnicate", "stats -X", "health -H", "-t x health",
				    "-t -2 health" };
	char			*out, *err;
	size_t			 i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(ctl_run(bad[i], &out, &err) == 2, "l3kvctl %s: not exit 2", bad[i]);
		ck_assert_msg(strstr(err, "usage: l3kvctl") != NULL || strstr(err, "l3kvctl: ") != NULL,
		    "l3kvctl %s: stderr %s", bad[i], err);
		free(out);
		free(err);
	}
	ck_assert_int_eq(ctl_run("-h", &out, &err), 0);
	ck_assert_ptr_nonnull(strstr(out, "usage: l3kvctl"));
	free(out);
	free(err);
}
END_TEST

Suite *
suite_ctl(void)
{
	Suite	*s = suite_create("ctl");
	TCase	*tc = tcase_create("ctl");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_health_prints_the_daemons_document);
	tcase_add_test(tc, test_stats_json_and_table_agree);
	tcase_add_test(tc, test_stats_table_names_array_elements_by_index);
	tcase_add_test(tc, test_version_names_client_and_server);
	tcase_add_test(tc, test_no_daemon_is_exit_1_with_a_reason);
	tcase_add_test(tc, test_bad_usage_is_exit_2);
	suite_add_tcase(s, tc);
	return s;
}
