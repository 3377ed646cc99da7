/*
 * l3kvctl, run as a user would against a real l3kvd: each command's
 * output and exit status (0 done, 1 the daemon could not be asked,
 * 2 bad usage), the JSON it prints parsed back, and the `stats -H`
 * table checked against the JSON's counters. And the manual (man/): each
 * page clean under `mandoc -T lint -W warning`, and naming every option
 * and command the programs' usage texts print, every config key of
 * config/README.md and every function of lib/l3kv.h.
 */
#include <sys/wait.h>

#include <ctype.h>
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

/* The manual. Pages are found under $L3KV_SRCDIR (default "."), the repository root. */

static const char *const man_pages[] = { "l3kvd.8", "l3kvctl.1", "l3kvd.json.5", "libl3kv.3" };
#define MAN_NPAGES	(sizeof(man_pages) / sizeof(man_pages[0]))

static char *
man_src(const char *rel, char *buf, size_t len)
{
	const char	*s = getenv("L3KV_SRCDIR");

	ck_assert((size_t)snprintf(buf, len, "%s/%s", s != NULL && *s != '\0' ? s : ".", rel) < len);
	return buf;
}

/* Runs a shell command; returns its exit status, *out its stdout and stderr (freed by the caller). */
static int
man_run(const char *cmd, char **out)
{
	char	 full[PATH_MAX * 3];
	FILE	*p;
	size_t	 n = 0, r;
	int	 st;

	snprintf(full, sizeof(full), "%s 2>&1", cmd);
	ck_assert_ptr_nonnull(p = popen(full, "r"));
	ck_assert_ptr_nonnull(*out = calloc(1, 1 << 20));
	while (n < (1 << 20) - 1 && (r = fread(*out + n, 1, (1 << 20) - 1 - n, p)) > 0)
		n += r;
	st = pclose(p);
	ck_assert_msg(st != -1 && WIFEXITED(st), "%s: status %#x", cmd, st);
	return WEXITSTATUS(st);
}

/* mandoc is required (make deps installs it): its absence fails, never skips. */
static void
man_need_mandoc(void)
{
	char	*out;
	int	 rc = man_run("command -v mandoc", &out);

	free(out);
	ck_assert_msg(rc == 0, "mandoc is not installed: `make deps` installs it (apt-get install mandoc)");
}

/* Does the page's source hold "\n" NEEDLE followed by the end of a word? */
static int
man_has_line(const char *page, const char *needle)
{
	const char	*p = page;
	size_t		 n = strlen(needle);

	while ((p = strstr(p, needle)) != NULL) {
		if (p > page && p[-1] == '\n' && (p[n] == '\n' || p[n] == ' '))
			return 1;
		p += n;
	}
	return 0;
}

static char *
man_page(const char *name)
{
	char	rel[64], path[PATH_MAX];

	snprintf(rel, sizeof(rel), "man/%s", name);
	return ctl_slurp(man_src(rel, path, sizeof(path)));
}

/*
 * The options a usage text names: each "-x" of a bracketed cluster
 * ("[-dhnV]") and each word-initial "-x"/"--long" after it, into opts
 * (as they would follow mdoc's "Fl ": "d", "f", "-long"); a number
 * ("-1: no limit") is a value, not an option. Returns how many.
 */
static size_t
man_usage_options(const char *usage, char opts[][64], size_t max)
{
	const char	*p;
	size_t		 n = 0, i, k;

	for (p = usage; *p != '\0'; p++) {
		if (*p != '-' || (p > usage && !isspace((unsigned char)p[-1]) && p[-1] != '['))
			continue;
		if (p[1] == '-') {
			for (k = 0; isalnum((unsigned char)p[1 + k]) || p[1 + k] == '-'; k++)
				;
			if (k < 2 || n == max)
				continue;
			snprintf(opts[n], sizeof(opts[n]), "%.*s", (int)k, p + 1);
		} else if (isalpha((unsigned char)p[1])) {
			/* a cluster "-dhnV" only inside brackets; "-f FILE" is one option */
			for (k = 1; p[-1] == '[' && isalpha((unsigned char)p[k + 1]); k++)
				;
			for (i = 0; i < k && n < max; i++, n++)
				snprintf(opts[n], sizeof(opts[n]), "%c", p[1 + i]);
			continue;
		} else
			continue;
		n++;
	}
	return n;
}

START_TEST(test_man_pages_lint_clean)
{
	char	cmd[PATH_MAX * 2], path[PATH_MAX], rel[64], *out;
	size_t	i;
	int	rc;

	man_need_mandoc();
	for (i = 0; i < MAN_NPAGES; i++) {
		snprintf(rel, sizeof(rel), "man/%s", man_pages[i]);
		ck_assert_msg(access(man_src(rel, path, sizeof(path)), R_OK) == 0, "%s is missing", path);
		snprintf(cmd, sizeof(cmd), "mandoc -T lint -W warning %s", path);
		rc = man_run(cmd, &out);
		ck_assert_msg(rc == 0 && out[0] == '\0', "%s: exit %d:\n%s", cmd, rc, out);
		free(out);
	}
}
END_TEST

/* Every option of `PROG -h` is an ".It Fl X" of its page; commands are ".It Cm NAME". */
static void
man_check_program(const char *prog, const char *page_name)
{
	char	 bin[PATH_MAX], cmd[PATH_MAX + 8], opts[64][64], want[96], *out, *page, *p;
	size_t	 n, i;

	test_path(prog, bin, sizeof(bin));
	ck_assert_msg(access(bin, X_OK) == 0, "%s is missing: build it first (make)", bin);
	snprintf(cmd, sizeof(cmd), "%s -h", bin);
	ck_assert_int_eq(man_run(cmd, &out), 0);
	page = man_page(page_name);
	n = man_usage_options(out, opts, 64);
	ck_assert_msg(n >= 3, "%s -h: only %zu options found in:\n%s", prog, n, out);
	for (i = 0; i < n; i++) {
		snprintf(want, sizeof(want), ".It Fl %s", opts[i]);
		/* a command's own option ("stats [-H]") is documented on the command's line */
		if (!man_has_line(page, want)) {
			snprintf(want, sizeof(want), "Op Fl %s", opts[i]);
			ck_assert_msg(strstr(page, want) != NULL, "man/%s does not document %s's -%s",
			    page_name, prog, opts[i]);
		}
	}
	/* commands: the lines under "commands:" */
	if ((p = strstr(out, "\ncommands:\n")) != NULL) {
		for (p += 11; p[0] == ' ' && p[1] == ' ' && isalpha((unsigned char)p[2]); ) {
			for (i = 0; isalnum((unsigned char)p[2 + i]) && i < 40; i++)
				;
			snprintf(want, sizeof(want), ".It Cm %.*s", (int)i, p + 2);
			ck_assert_msg(man_has_line(page, want), "man/%s does not document the command %s",
			    page_name, want + 7);
			if ((p = strchr(p, '\n')) == NULL)
				break;
			p++;
		}
	}
	free(out);
	free(page);
}

START_TEST(test_man_pages_name_every_option)
{
	man_check_program("l3kvd", "l3kvd.8");
	man_check_program("l3kvctl", "l3kvctl.1");
}
END_TEST

/* Every key of config/README.md's table is an ".It Cm KEY" of l3kvd.json(5). */
START_TEST(test_man_config_names_every_key)
{
	char	 path[PATH_MAX], want[128], *readme, *page, *p, *end;
	int	 n = 0;

	readme = ctl_slurp(man_src("config/README.md", path, sizeof(path)));
	page = man_page("l3kvd.json.5");
	for (p = readme; (p = strstr(p, "\n| `")) != NULL; p = end) {
		p += 4;
		ck_assert_ptr_nonnull(end = strchr(p, '`'));
		snprintf(want, sizeof(want), ".It Cm %.*s", (int)(end - p), p);
		ck_assert_msg(man_has_line(page, want), "man/l3kvd.json.5 does not document %s", want + 7);
		n++;
	}
	ck_assert_int_ge(n, 30);
	free(readme);
	free(page);
}
END_TEST

/* Every function lib/l3kv.h declares is in libl3kv(3)'s synopsis. */
START_TEST(test_man_library_names_every_function)
{
	char	 path[PATH_MAX], want[128], *hdr, *page, *p, *q;
	size_t	 k;
	int	 n = 0;

	hdr = ctl_slurp(man_src("lib/l3kv.h", path, sizeof(path)));
	page = man_page("libl3kv.3");
	for (p = hdr; (p = strstr(p, "\nL3KV_API")) != NULL; p++) {
		ck_assert_ptr_nonnull(q = strstr(p, "l3kv_"));
		for (k = 0; isalnum((unsigned char)q[k]) || q[k] == '_'; k++)
			;
		snprintf(want, sizeof(want), ".Fo %.*s", (int)k, q);
		ck_assert_msg(man_has_line(page, want), "man/libl3kv.3 does not declare %s", want + 4);
		n++;
	}
	ck_assert_int_ge(n, 40);
	free(hdr);
	free(page);
}
END_TEST

Suite *
suite_ctl(void)
{
	Suite	*s = suite_create("ctl");
	TCase	*tc = tcase_create("ctl");
	TCase	*man = tcase_create("man");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_health_prints_the_daemons_document);
	tcase_add_test(tc, test_stats_json_and_table_agree);
	tcase_add_test(tc, test_stats_table_names_array_elements_by_index);
	tcase_add_test(tc, test_version_names_client_and_server);
	tcase_add_test(tc, test_no_daemon_is_exit_1_with_a_reason);
	tcase_add_test(tc, test_bad_usage_is_exit_2);
	suite_add_tcase(s, tc);
	tcase_set_timeout(man, 20);
	tcase_add_test(man, test_man_pages_lint_clean);
	tcase_add_test(man, test_man_pages_name_every_option);
	tcase_add_test(man, test_man_config_names_every_key);
	tcase_add_test(man, test_man_library_names_every_function);
	suite_add_tcase(s, man);
	return s;
}
