/*
 * l3kvctl, run as a user would against a real l3kvd: each command's
 * output and exit status (0 done, 1 the daemon could not be asked,
 * 2 bad usage, 3 a reload refused keys), the JSON it prints parsed back,
 * and the tables checked against the JSON. Reloads (SIGHUP and
 * `l3kvctl reload`): live keys apply, others are refused by name, a
 * broken file changes nothing, requests in flight complete. The lists
 * (namespaces, groups, leases) against a daemon with a group of two
 * ranks holding leases. `config check` on good and bad files. And the manual (man/): each
 * page clean under `mandoc -T lint -W warning`, and naming every option
 * and command the programs' usage texts print, every config key of
 * config/README.md and every function of lib/l3kv.h.
 */
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>

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
	/* A GPU UUID per device, what a client claims by; [] without a GPU. */
	ck_assert(json_is_array(json_object_get(j, "device_uuids")));
	if (!json_is_true(json_object_get(j, "gpu")))
		ck_assert_uint_eq(json_array_size(json_object_get(j, "device_uuids")), 0);
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
	static const char	*bad[] = { "", "frobnicate", "stats -X", "health --watch",
				    "-t x health", "-t -2 health", "--frobnicate health", "-X health",
				    "stats --watch 0", "stats --watch --count 0", "leases --max 0",
				    "health --max 3", "leases extra", "config", "config check",
				    "config frob x.json", "config check a.json b.json", "reload now",
				    "--socket", "devices extra", "devices --max 3", "devices --watch",
				    "devices --count 2", "devices -m 1" };
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

START_TEST(test_help_names_every_command_and_option)
{
	static const char	*want[] = { "health", "stats", "namespaces", "groups", "leases",
				    "devices", "reload", "config check FILE", "version", "--help", "--socket",
				    "--timeout", "--json", "--human", "--watch", "--count", "--max",
				    "exit status" };
	char			*out, *err;
	size_t			 i;

	ck_assert_int_eq(ctl_run("--help", &out, &err), 0);
	ck_assert_str_eq(err, "");
	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_assert_msg(strstr(out, want[i]) != NULL, "--help does not name %s:\n%s", want[i],
		    out);
	free(out);
	free(err);
	/* after the command too, and the same text */
	ck_assert_int_eq(ctl_run("stats --help", &out, &err), 0);
	ck_assert_ptr_nonnull(strstr(out, "usage: l3kvctl"));
	free(out);
	free(err);
}
END_TEST

/* Long options are the short ones: --socket, --json, --human, and -j / -H after the command. */
START_TEST(test_long_options_and_formats)
{
	char	args[PATH_MAX + 64], *out, *err;
	json_t	*j;

	snprintf(args, sizeof(args), "--socket %s --timeout 2000 health --human", td.sock);
	ck_assert_int_eq(ctl_run(args, &out, &err), 0);
	ck_assert_msg(strstr(out, "status ") != NULL && strstr(out, "ok\n") != NULL &&
	    strchr(out, '{') == NULL, "health --human: %s", out);
	free(out);
	free(err);
	snprintf(args, sizeof(args), "--socket=%s leases --json", td.sock);
	ck_assert_int_eq(ctl_run(args, &out, &err), 0);
	j = ctl_json(out);
	ck_assert(json_is_array(json_object_get(j, "leases")));
	json_decref(j);
	free(out);
	free(err);
	/* -j before the command */
	snprintf(args, sizeof(args), "-j -s %s groups", td.sock);
	ck_assert_int_eq(ctl_run(args, &out, &err), 0);
	j = ctl_json(out);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "total")), 0);
	json_decref(j);
	free(out);
	free(err);
}
END_TEST

/*
 * devices: one line per cuda copy engine of STATS' copy.devices, or the
 * line that says there is none (this suite's daemon has no GPU unless the
 * host has one: both are checked against STATS).
 */
START_TEST(test_devices_lists_each_device_or_says_there_is_none)
{
	char		*out, *err, *tab, *terr, *line, want[160], args[PATH_MAX + 64];
	json_t		*j, *st, *devs, *d;
	const char	*engine;
	size_t		 i, n;

	ck_assert_int_eq(ctl_run_here("stats", &out, &err), 0);
	st = ctl_json(out);
	free(out);
	free(err);
	n = json_array_size(json_object_get(json_object_get(st, "copy"), "devices"));
	engine = json_string_value(json_object_get(json_object_get(st, "daemon"), "copy_engine"));
	ck_assert_ptr_nonnull(engine);

	ck_assert_int_eq(ctl_run_here("devices -j", &out, &err), 0);
	ck_assert_str_eq(err, "");
	j = ctl_json(out);
	devs = json_object_get(j, "devices");
	ck_assert(json_is_array(devs));
	ck_assert_uint_eq(json_array_size(devs), n);
	ck_assert_str_eq(json_string_value(json_object_get(j, "copy_engine")), engine);

	ck_assert_int_eq(ctl_run_here("devices", &tab, &terr), 0);
	ck_assert_str_eq(terr, "");
	if (n == 0) {
		snprintf(want, sizeof(want), "no GPU devices: the daemon copies with its %s copy "
		    "engine\n", engine);
		ck_assert_str_eq(tab, want);
	} else {
		ck_assert_msg(strncmp(tab, "DEVICE  GPU  UUID", 17) == 0 &&
		    strstr(tab, "STAGING(in use/slots)\n") != NULL, "devices: %s", tab);
		line = strchr(tab, '\n') + 1;
		json_array_foreach(devs, i, d) {
			snprintf(want, sizeof(want), "%zu ", i);
			ck_assert_msg(strncmp(line, want, strlen(want)) == 0, "line %zu: %s", i, tab);
			if (json_is_string(json_object_get(d, "uuid")))
				ck_assert_msg(strstr(line, json_string_value(json_object_get(d, "uuid"))) !=
				    NULL, "line %zu has no UUID: %s", i, tab);
			ck_assert_ptr_nonnull(line = strchr(line, '\n'));
			line++;
		}
		ck_assert_str_eq(line, "");
	}
	free(tab);
	free(terr);
	/* -H is the default; the table for people either way */
	ck_assert_int_eq(ctl_run_here("devices -H", &tab, &terr), 0);
	ck_assert(strstr(tab, n == 0 ? "no GPU devices" : "DEVICE") == tab);
	free(tab);
	free(terr);
	json_decref(j);
	json_decref(st);
	free(out);
	free(err);

	/* no daemon: exit 1, said on stderr, nothing on stdout */
	snprintf(args, sizeof(args), "-s %s/nobody.sock -t 200 devices", td.dir);
	ck_assert_int_eq(ctl_run(args, &out, &err), 1);
	ck_assert_msg(strncmp(err, "l3kvctl: connect ", 17) == 0, "stderr: %s", err);
	ck_assert_str_eq(out, "");
	free(out);
	free(err);
}
END_TEST

/* A counter the watch itself moves (every sample is a STATS) shows its per-second rate. */
START_TEST(test_stats_watch_prints_rates)
{
	char	*out, *err, *p, *line;
	json_t	*j;
	double	 r;
	int	 n = 0;

	ck_assert_int_eq(ctl_run_here("stats --watch 0.2 --count 3", &out, &err), 0);
	ck_assert_str_eq(err, "");
	for (p = out; (p = strstr(p, "\n  requests.stats ")) != NULL; p++) {
		line = strchr(p + 1, '\n');
		ck_assert_ptr_nonnull(line);
		ck_assert_msg(sscanf(p, " requests.stats %*d %lf/s", &r) == 1, "no rate in: %.*s",
		    (int)(line - p), p);
		/* one STATS per sample, 0.2 s apart at least: at most 5/s, and it moved */
		ck_assert_msg(r > 0 && r < 5.01, "requests.stats at %f/s", r);
		n++;
	}
	ck_assert_msg(n == 3, "%d reports of requests.stats in:\n%s", n, out);
	ck_assert_ptr_nonnull(strstr(out, " over 0."));
	free(out);
	free(err);
	/* -j: one JSON line per report, every counter's rate */
	ck_assert_int_eq(ctl_run_here("stats -j -w 0.2 -n 2", &out, &err), 0);
	line = strchr(out, '\n');
	ck_assert_ptr_nonnull(line);
	*line = '\0';
	j = ctl_json(out);
	r = json_real_value(json_object_get(json_object_get(j, "rates"), "requests.stats"));
	ck_assert_msg(r > 0 && r < 5.01, "requests.stats at %f/s", r);
	ck_assert(json_is_real(json_object_get(json_object_get(j, "rates"), "cache.probes")));
	ck_assert_ptr_null(json_object_get(json_object_get(j, "rates"), "daemon.uptime_ms"));
	json_decref(j);
	j = ctl_json(line + 1);
	ck_assert(json_is_object(json_object_get(j, "rates")));
	json_decref(j);
	free(out);
	free(err);
}
END_TEST

/* config check: the daemon's parser, offline; the message names the file and the key. */
START_TEST(test_config_check_good_and_bad_files)
{
	static const struct {
		const char	*text;
		const char	*err;
	} bad[] = {
		{ "{\"limits\": {\"max_output\": 1}}",
		  "bad.json: limits.max_output: 1 is out of range [64 KiB, 1 GiB]" },
		{ "{\"log\": {\"level\": \"loud\"}}", "bad.json: log.level: \"loud\" is not one of" },
		{ "{\"socket\": {\"path\": 3}}", "bad.json: socket.path: expected a string" },
		{ "{\"nope\": 1}", "bad.json: nope: unknown key" },
		{ "{\"log\": ", "bad.json:1:" },
	};
	char	 args[PATH_MAX * 2], path[PATH_MAX], *out, *err;
	json_t	*j;
	FILE	*f;
	size_t	 i;

	snprintf(args, sizeof(args), "config check %s", td.config);
	ck_assert_int_eq(ctl_run(args, &out, &err), 0);
	ck_assert_msg(strstr(out, "configuration OK") != NULL, "%s", out);
	free(out);
	free(err);
	snprintf(args, sizeof(args), "config check --json %s", td.config);
	ck_assert_int_eq(ctl_run(args, &out, &err), 0);
	j = ctl_json(out);
	ck_assert(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
	free(out);
	free(err);
	snprintf(path, sizeof(path), "%s/bad.json", td.dir);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_ptr_nonnull(f = fopen(path, "w"));
		fputs(bad[i].text, f);
		fclose(f);
		snprintf(args, sizeof(args), "config check %s", path);
		ck_assert_int_eq(ctl_run(args, &out, &err), 1);
		ck_assert_msg(strstr(err, bad[i].err) != NULL, "%s: stderr %s", bad[i].text, err);
		ck_assert_str_eq(out, "");
		free(out);
		free(err);
		snprintf(args, sizeof(args), "-j config check %s", path);
		ck_assert_int_eq(ctl_run(args, &out, &err), 1);
		j = ctl_json(out);
		ck_assert(json_is_false(json_object_get(j, "ok")));
		ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(j, "error")), bad[i].err));
		json_decref(j);
		free(out);
		free(err);
	}
	snprintf(args, sizeof(args), "config check %s/missing.json", td.dir);
	ck_assert_int_eq(ctl_run(args, &out, &err), 1);
	ck_assert_ptr_nonnull(strstr(err, "missing.json: cannot read: No such file"));
	free(out);
	free(err);
}
END_TEST

/*
 * A group of two ranks (MLA, one shard) with 6 pages published and two
 * admissions answered: each rank holds two leases.
 */
#define LIST_PAGES	6
static const struct test_rank_kv	list_kv = { "ctl-list-model", "latent:64:fp8_e4m3",
					    L3KV_ATTN_MLA, 16, 16, 2, 64 };

static void
list_setup_group(struct test_rank r[2], struct l3kv_admit_result res[2][2])
{
	struct l3kv_publish_result	pub;
	struct l3kv_admit_args		a;
	uint8_t				*h = test_page_hashes(7, LIST_PAGES);
	unsigned			 g, i;

	for (g = 0; g < 2; g++) {
		test_rank_init(&r[g], &list_kv, "ctl-list", 2, g);
		test_rank_attach(&r[g], td.sock);
	}
	test_rank_publish_kv(&r[0], 7, 0, LIST_PAGES, 0, &pub);
	ck_assert_uint_eq(pub.stored, LIST_PAGES);
	for (i = 0; i < 2; i++) {
		struct l3kv_admit_result	two[2];

		a = (struct l3kv_admit_args){ .request_id = 100 + i, .hashes = h,
		    .npages = LIST_PAGES - i, .reserved_pages = LIST_PAGES,
		    .state_slot = L3KV_SLOT_NONE };
		test_rank_admit_group(r, 2, &a, two);
		for (g = 0; g < 2; g++) {
			ck_assert_uint_eq(two[g].admitted_pages, LIST_PAGES - i);
			res[g][i] = two[g];
		}
	}
	free(h);
}

static json_t *
list_json(const char *what, int expect_count)
{
	char	cmd[64], *out, *err;
	json_t	*j;

	snprintf(cmd, sizeof(cmd), "%s -j", what);
	ck_assert_int_eq(ctl_run_here(cmd, &out, &err), 0);
	ck_assert_str_eq(err, "");
	j = ctl_json(out);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "count")), expect_count);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "total")), expect_count);
	ck_assert(json_is_false(json_object_get(j, "truncated")));
	ck_assert_int_eq(json_array_size(json_object_get(j, what)), expect_count);
	free(out);
	free(err);
	return j;
}

START_TEST(test_lists_show_namespaces_groups_and_leases)
{
	struct l3kv_admit_result	 res[2][2];
	struct test_rank		 r[2];
	json_t				*j, *e, *m, *pool;
	char				*out, *err, row[256];
	size_t				 i;
	unsigned			 g, seen = 0;

	list_setup_group(r, res);

	/* namespaces: one, two sessions, the kv pool's 6 objects in DRAM */
	j = list_json("namespaces", 1);
	e = json_array_get(json_object_get(j, "namespaces"), 0);
	ck_assert_str_eq(json_string_value(json_object_get(e, "model")), "ctl-list-model");
	ck_assert_int_eq(json_integer_value(json_object_get(e, "sessions")), 2);
	ck_assert_int_eq(json_integer_value(json_object_get(e, "tp_size")), 2);
	ck_assert_int_eq(json_integer_value(json_object_get(e, "page_tokens")), 16);
	ck_assert_int_eq(strlen(json_string_value(json_object_get(e, "fingerprint"))), 32);
	pool = json_array_get(json_object_get(e, "pools"), 0);
	ck_assert_str_eq(json_string_value(json_object_get(pool, "name")), "kv");
	ck_assert_int_eq(json_integer_value(json_object_get(pool, "dram_objects")), LIST_PAGES);
	ck_assert(json_is_null(json_object_get(pool, "file_objects")));	/* no file tier */
	json_decref(j);

	/* groups: the group, both ranks with their session, pid and two leases each */
	j = list_json("groups", 1);
	e = json_array_get(json_object_get(j, "groups"), 0);
	ck_assert_str_eq(json_string_value(json_object_get(e, "id")), "ctl-list");
	ck_assert_int_eq(json_integer_value(json_object_get(e, "attached")), 2);
	ck_assert_int_eq(json_integer_value(json_object_get(e, "leases")), 4);
	ck_assert_int_eq(json_integer_value(json_object_get(e, "admissions_waiting")), 0);
	ck_assert_str_eq(json_string_value(json_object_get(e, "prefetch")), "wait_complete");
	ck_assert_int_eq(json_array_size(json_object_get(e, "members")), 2);
	json_array_foreach(json_object_get(e, "members"), i, m) {
		ck_assert_int_eq(json_integer_value(json_object_get(m, "rank")), (json_int_t)i);
		ck_assert_int_eq(json_integer_value(json_object_get(m, "pid")), getpid());
		ck_assert_int_eq(json_integer_value(json_object_get(m, "uid")), getuid());
		ck_assert_int_eq(json_integer_value(json_object_get(m, "leases")), 2);
	}
	json_decref(j);

	/* leases: four, each naming its session, pid, group, rank, pages and TTL left */
	j = list_json("leases", 4);
	json_array_foreach(json_object_get(j, "leases"), i, e) {
		for (g = 0; g < 2; g++) {
			unsigned k;

			for (k = 0; k < 2; k++) {
				if ((uint64_t)json_integer_value(json_object_get(e, "id")) !=
				    res[g][k].lease)
					continue;
				seen |= 1U << (g * 2 + k);
				ck_assert_int_eq(json_integer_value(json_object_get(e, "rank")), g);
				ck_assert_int_eq(json_integer_value(json_object_get(e, "request_id")),
				    100 + k);
				ck_assert_int_eq(json_integer_value(json_object_get(e, "pages")),
				    LIST_PAGES - k);
				ck_assert_int_eq(json_integer_value(json_object_get(e, "objects")),
				    LIST_PAGES - k);
			}
		}
		ck_assert_str_eq(json_string_value(json_object_get(e, "state")), "admitted");
		ck_assert_str_eq(json_string_value(json_object_get(e, "group")), "ctl-list");
		ck_assert_int_eq(json_integer_value(json_object_get(e, "pid")), getpid());
		ck_assert(json_is_true(json_object_get(e, "pinned")));
		ck_assert(json_is_null(json_object_get(e, "slot")));
		ck_assert_int_eq(json_integer_value(json_object_get(e, "ttl_ms")), 30000);
		ck_assert_int_gt(json_integer_value(json_object_get(e, "ttl_left_ms")), 20000);
		ck_assert_int_le(json_integer_value(json_object_get(e, "ttl_left_ms")), 30000);
		ck_assert_int_ge(json_integer_value(json_object_get(e, "age_ms")), 0);
		ck_assert_int_lt(json_integer_value(json_object_get(e, "age_ms")), 10000);
	}
	ck_assert_uint_eq(seen, 0xf);
	json_decref(j);

	/* --max bounds the reply, which says so */
	ck_assert_int_eq(ctl_run_here("leases --max 3 -j", &out, &err), 0);
	j = ctl_json(out);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "count")), 3);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "total")), 4);
	ck_assert(json_is_true(json_object_get(j, "truncated")));
	json_decref(j);
	free(out);
	free(err);

	/* the tables: a header, a row per entry, the truncation said */
	ck_assert_int_eq(ctl_run_here("leases -m 3", &out, &err), 0);
	ck_assert_msg(strncmp(out, "LEASE  SESSION  PID", 19) == 0, "%s", out);
	ck_assert_msg(strstr(out, "(truncated: 3 of 4 shown)\n") != NULL, "%s", out);
	snprintf(row, sizeof(row), "%d  ctl-list  0     admitted", (int)getpid());
	ck_assert_msg(strstr(out, row) != NULL, "no \"%s\" in:\n%s", row, out);
	free(out);
	free(err);
	ck_assert_int_eq(ctl_run_here("groups", &out, &err), 0);
	ck_assert_msg(strncmp(out, "GROUP ", 6) == 0 && strstr(out, "\nctl-list ") != NULL, "%s", out);
	snprintf(row, sizeof(row), "/pid%d 1=s", (int)getpid());
	ck_assert_msg(strstr(out, "0=s") != NULL && strstr(out, row) != NULL &&
	    strstr(out, "wait_complete") != NULL, "no \"%s\" in:\n%s", row, out);
	free(out);
	free(err);
	ck_assert_int_eq(ctl_run_here("namespaces", &out, &err), 0);
	ck_assert_msg(strstr(out, "decode/ctl-list-model-") != NULL && strstr(out, " kv:6") != NULL,
	    "%s", out);
	free(out);
	free(err);

	for (g = 0; g < 2; g++) {
		ck_assert_int_eq(l3kv_release(r[g].k, res[g][0].lease), 0);
		ck_assert_int_eq(l3kv_release(r[g].k, res[g][1].lease), 0);
		test_rank_fini(&r[g]);
	}
	/* nothing attached: empty lists, "(none)" in the tables */
	ck_assert_int_eq(test_stat_wait(td.sock, "attach", "sessions", 0), 0);
	j = list_json("leases", 0);
	json_decref(j);
	ck_assert_int_eq(ctl_run_here("namespaces", &out, &err), 0);
	ck_assert_msg(strstr(out, "\n(none)\n") != NULL, "%s", out);
	free(out);
	free(err);
}
END_TEST

/* LIST of something the daemon does not list is answered invalid, the connection kept. */
START_TEST(test_list_of_an_unknown_kind_is_invalid)
{
	struct l3kv	*k;
	char		*json = NULL;

	ck_assert_int_eq(l3kv_connect(td.sock, 5000, &k), 0);
	ck_assert_int_eq(l3kv_list(k, (enum l3kv_list_what)9, 0, &json), -EINVAL);
	ck_assert_ptr_null(json);
	ck_assert_msg(strstr(l3kv_last_error(k), "LIST: what 9") != NULL, "%s", l3kv_last_error(k));
	ck_assert_int_eq(l3kv_list(k, L3KV_LIST_GROUPS, 0, &json), 0);
	ck_assert_ptr_nonnull(strstr(json, "\"groups\""));
	l3kv_free(json);
	l3kv_close(k);
}
END_TEST

/* Reloads. The daemon starts at log level info; the tests rewrite its file. */

static void
reload_setup(void)
{
	ck_assert_int_eq(test_daemon_start(&td, "{\"log\": {\"level\": \"info\"}}"), 0);
}

/* Waits up to ms for the daemon's log to hold needle. */
static int
reload_wait_log(const char *needle, int ms)
{
	for (; ms > 0; ms -= 20) {
		if (test_daemon_log_has(&td, needle))
			return 1;
		usleep(20000);
	}
	return test_daemon_log_has(&td, needle);
}

/* How many lines of the daemon's log hold needle. */
static int
reload_log_count(const char *needle)
{
	char	*log = ctl_slurp(td.log), *p;
	int	 n = 0;

	for (p = log; (p = strstr(p, needle)) != NULL; p++)
		n++;
	free(log);
	return n;
}

static void
reload_write(const char *extra)
{
	ck_assert_int_eq(test_daemon_write_config(&td, extra), 0);
}

/* SIGHUP and its log line: the reload is done once the line is there. */
static void
reload_sighup(const char *done_line)
{
	ck_assert_int_eq(kill(td.pid, SIGHUP), 0);
	ck_assert_msg(reload_wait_log(done_line, 5000), "no \"%s\" in the log", done_line);
}

START_TEST(test_reload_sighup_applies_the_log_level)
{
	char	*out, *err;
	int	 n;

	ck_assert_int_eq(ctl_run_here("health", &out, &err), 0);
	free(out);
	free(err);
	ck_assert_int_eq(reload_log_count(" debug "), 0);
	reload_write("{\"log\": {\"level\": \"debug\"}}");
	reload_sighup("reload: log.level: info -> debug");
	ck_assert(test_daemon_log_has(&td, "reload: SIGHUP: re-reading "));
	ck_assert_int_eq(ctl_run_here("health", &out, &err), 0);
	free(out);
	free(err);
	ck_assert_msg(reload_wait_log(" debug conn: ", 2000), "no debug line after the reload");
	ck_assert_int_eq(test_stat(td.sock, "reload", "reloads"), 1);
	ck_assert_int_eq(test_stat(td.sock, "reload", "keys_applied"), 1);
	ck_assert_int_eq(test_stat(td.sock, "reload", "keys_refused"), 0);
	/* and back: debug lines stop, and the reload still says what it did */
	reload_write("{\"log\": {\"level\": \"warn\"}}");
	reload_sighup("reload: log.level: debug -> warn");
	ck_assert_int_eq(reload_log_count("info reload:"), 6);
	n = reload_log_count(" debug ");
	ck_assert_int_eq(ctl_run_here("health", &out, &err), 0);
	free(out);
	free(err);
	usleep(100000);
	ck_assert_int_eq(reload_log_count(" debug "), n);
}
END_TEST

/* l3kvctl reload: a changed socket path is refused and named, in the reply and the log. */
START_TEST(test_reload_request_applies_and_refuses_by_name)
{
	char	extra[PATH_MAX + 128], *out, *err;
	json_t	*j, *e;

	snprintf(extra, sizeof(extra), "{\"log\": {\"level\": \"debug\"}, \"socket\": {\"path\": "
	    "\"%s/other.sock\"}, \"lease\": {\"ttl_ms\": 1234}}", td.dir);
	reload_write(extra);
	ck_assert_int_eq(ctl_run_here("reload -j", &out, &err), 3);
	ck_assert_str_eq(err, "");
	j = ctl_json(out);
	ck_assert_str_eq(json_string_value(json_object_get(j, "file")), td.config);
	ck_assert_int_eq(json_array_size(json_object_get(j, "applied")), 2);
	e = json_array_get(json_object_get(j, "applied"), 0);
	ck_assert_str_eq(json_string_value(json_object_get(e, "key")), "log.level");
	ck_assert_str_eq(json_string_value(json_object_get(e, "old")), "info");
	ck_assert_str_eq(json_string_value(json_object_get(e, "new")), "debug");
	e = json_array_get(json_object_get(j, "applied"), 1);
	ck_assert_str_eq(json_string_value(json_object_get(e, "key")), "lease.ttl_ms");
	ck_assert_str_eq(json_string_value(json_object_get(e, "new")), "1234");
	ck_assert_int_eq(json_array_size(json_object_get(j, "refused")), 1);
	e = json_array_get(json_object_get(j, "refused"), 0);
	ck_assert_str_eq(json_string_value(json_object_get(e, "key")), "socket.path");
	ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(e, "new")), "other.sock"));
	ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(e, "reason")), "restart"));
	json_decref(j);
	free(out);
	free(err);
	ck_assert(test_daemon_log_has(&td, "warn reload: socket.path: "));
	ck_assert(test_daemon_log_has(&td, "other.sock\" refused: not live"));
	ck_assert(test_daemon_log_has(&td, "info reload: lease.ttl_ms: 30000 -> 1234"));
	/* the old socket still serves, with the new TTL for new connections */
	ck_assert_int_eq(ctl_run_here("version", &out, &err), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"lease_ttl_ms\": 1234"));
	free(out);
	free(err);
	/* the table: nothing applied this time (the TTL is in), the path refused again */
	ck_assert_int_eq(ctl_run_here("reload", &out, &err), 3);
	ck_assert_msg(strstr(out, ": 0 applied, 1 refused\n") != NULL, "%s", out);
	ck_assert_msg(strstr(out, "\n  refused  socket.path  ") != NULL, "%s", out);
	free(out);
	free(err);
	/* the same file as the daemon's: nothing changed, exit 0 */
	snprintf(extra, sizeof(extra), "{\"log\": {\"level\": \"debug\"}, \"lease\": {\"ttl_ms\": 1234}}");
	reload_write(extra);
	ck_assert_int_eq(ctl_run_here("reload", &out, &err), 0);
	ck_assert_msg(strstr(out, ": 0 applied, 0 refused\n") != NULL, "%s", out);
	free(out);
	free(err);
}
END_TEST

/* A file that does not parse, or holds one bad value among good ones, changes nothing. */
START_TEST(test_reload_broken_file_changes_nothing)
{
	char	*out, *err;
	FILE	*f;

	reload_write("{\"log\": {\"level\": \"debug\"}, \"limits\": {\"max_output\": 1}}");
	ck_assert_int_eq(ctl_run_here("reload", &out, &err), 1);
	ck_assert_msg(strstr(err, "limits.max_output: 1 is out of range") != NULL, "%s", err);
	ck_assert_str_eq(out, "");
	free(out);
	free(err);
	ck_assert(reload_wait_log("limits.max_output: 1 is out of range [64 KiB, 1 GiB]; nothing "
	    "changed", 2000));
	ck_assert_ptr_nonnull(f = fopen(td.config, "w"));
	fputs("{\"log\": {\"level\": \"debug\"", f);
	fclose(f);
	ck_assert_int_eq(kill(td.pid, SIGHUP), 0);
	ck_assert(reload_wait_log("nothing changed", 2000));
	ck_assert_msg(reload_wait_log("l3kvd.json:1:", 2000), "the syntax error's position is not logged");
	ck_assert_int_eq(reload_log_count("; nothing changed"), 2);
	ck_assert_int_eq(test_stat(td.sock, "reload", "failed"), 2);
	ck_assert_int_eq(test_stat(td.sock, "reload", "reloads"), 0);
	/* still at info: no debug line for the requests since */
	ck_assert_int_eq(ctl_run_here("health", &out, &err), 0);
	free(out);
	free(err);
	ck_assert_int_eq(reload_log_count(" debug "), 0);
}
END_TEST

/* A live limit applies to what comes after: limits.max_connections down to 1, and back. */
START_TEST(test_reload_live_limit_takes_effect)
{
	struct l3kv	*k;
	char		*out, *err;

	ck_assert_int_eq(l3kv_connect(td.sock, 5000, &k), 0);
	reload_write("{\"log\": {\"level\": \"info\"}, \"limits\": {\"max_connections\": 1}}");
	reload_sighup("reload: limits.max_connections: 1024 -> 1");
	ck_assert_int_eq(ctl_run_here("health", &out, &err), 1);
	ck_assert_msg(strstr(err, "l3kvctl: connect ") != NULL, "%s", err);
	free(out);
	free(err);
	ck_assert(reload_wait_log("connection limit (1 total", 2000));
	/* the connection that was there keeps working */
	ck_assert_int_eq(l3kv_health(k, &out), 0);
	l3kv_free(out);
	reload_write("{\"log\": {\"level\": \"info\"}}");
	reload_sighup("reload: limits.max_connections: 1 -> 1024");
	ck_assert_int_eq(ctl_run_here("health", &out, &err), 0);
	free(out);
	free(err);
	l3kv_close(k);
}
END_TEST

/*
 * Requests in flight during a reload complete: an ADMIT waiting at its
 * group's barrier and a RESTORE whose copy is running, both started before
 * the SIGHUP; a lease admitted after it has the new TTL.
 */
START_TEST(test_reload_in_flight_requests_complete)
{
	struct l3kv_publish_result	pub;
	struct l3kv_restore_result	rr;
	struct l3kv_admit_result	res[2], solo;
	struct l3kv_completion		c;
	struct l3kv_admit_args		a;
	struct test_rank		r[2], s;
	uint32_t			dst[8], i;
	uint64_t			ticket;
	uint8_t				*h = test_page_hashes(9, 8);
	json_t				*j, *e;
	int				st;
	const char			*cfg = "{\"log\": {\"level\": \"info\"}, \"testing\": "
					    "{\"copy_delay_ms\": 400}, \"admit\": {\"timeout_ms\": 8000}}";

	ck_assert_int_eq(test_daemon_stop(&td, SIGTERM, &st), 0);
	ck_assert_int_eq(test_daemon_start(&td, cfg), 0);
	for (i = 0; i < 2; i++) {
		test_rank_init(&r[i], &list_kv, "reload-pair", 2, i);
		test_rank_attach(&r[i], td.sock);
	}
	test_rank_init(&s, &list_kv, "reload-solo", 1, 0);
	test_rank_attach(&s, td.sock);
	/* two namespaces (tp_size 2 and 1): the same pages in each */
	test_rank_publish_kv(&r[0], 9, 0, 8, 0, &pub);
	ck_assert_uint_eq(pub.stored, 8);
	test_rank_publish_kv(&s, 9, 0, 8, 0, &pub);
	ck_assert_uint_eq(pub.stored, 8);

	/* the solo rank's restore: 8 pages at 400 ms each */
	solo = test_rank_admit(&s, 1, 9, 8, 8, L3KV_SLOT_NONE);
	ck_assert_uint_eq(solo.admitted_pages, 8);
	for (i = 0; i < 8; i++)
		dst[i] = 8 + i;
	ck_assert_int_eq(l3kv_submit_restore(s.k, solo.lease, TEST_RANK_KV, dst, 8, &ticket), 0);
	/* rank 0 of the pair at the barrier */
	a = (struct l3kv_admit_args){ .request_id = 5, .hashes = h, .npages = 8,
	    .reserved_pages = 8, .state_slot = L3KV_SLOT_NONE };
	ck_assert_int_eq(l3kv_submit_admit(r[0].k, &a, &ticket), 0);
	ck_assert_int_eq(test_stat_wait(td.sock, "copy", "jobs_inflight", 1), 1);

	reload_write("{\"log\": {\"level\": \"info\"}, \"testing\": {\"copy_delay_ms\": 400}, "
	    "\"admit\": {\"timeout_ms\": 9000}, \"lease\": {\"ttl_ms\": 7000}}");
	reload_sighup("reload: lease.ttl_ms: 30000 -> 7000");
	ck_assert(test_daemon_log_has(&td, "reload: admit.timeout_ms: 8000 -> 9000"));
	/* both still in flight after the reload */
	ck_assert_int_eq(test_stat(td.sock, "copy", "jobs_inflight"), 1);
	ck_assert_int_eq(test_stat(td.sock, "cache", "admitted"), 1);

	/* the restore started before ends with every page in place */
	test_rank_wait_completion(&s, &c);
	ck_assert_int_eq(c.op, L3KV_OP_RESTORE);
	ck_assert_int_eq(c.status, 0);
	ck_assert_int_eq(l3kv_restore_result(&c, &rr), 0);
	ck_assert_uint_eq(rr.pages, 8);
	l3kv_completion_release(&c);
	for (i = 0; i < 8; i++)
		ck_assert(test_rank_page_is(&s, TEST_RANK_KV, 8 + i, 9, i));
	/* the barrier completes once rank 1 asks, after the reload */
	ck_assert_int_eq(l3kv_submit_admit(r[1].k, &a, &ticket), 0);
	for (i = 0; i < 2; i++) {
		test_rank_wait_completion(&r[i], &c);
		ck_assert_int_eq(c.status, 0);
		ck_assert_int_eq(l3kv_admit_result(&c, &res[i]), 0);
		l3kv_completion_release(&c);
		ck_assert_uint_eq(res[i].admitted_pages, 8);
		/* admitted after the reload: the new TTL */
		ck_assert_uint_eq(res[i].ttl_ms, 7000);
	}
	/* every TTL armed since runs 7 s: the pair's, and the solo one's re-armed at READY */
	j = list_json("leases", 3);
	json_array_foreach(json_object_get(j, "leases"), i, e) {
		ck_assert_int_eq(json_integer_value(json_object_get(e, "ttl_ms")), 7000);
		ck_assert_int_le(json_integer_value(json_object_get(e, "ttl_left_ms")), 7000);
		ck_assert_str_eq(json_string_value(json_object_get(e, "state")),
		    (uint64_t)json_integer_value(json_object_get(e, "id")) == solo.lease ? "ready" :
		    "admitted");
	}
	json_decref(j);
	ck_assert_int_eq(l3kv_release(s.k, solo.lease), 0);
	for (i = 0; i < 2; i++)
		ck_assert_int_eq(l3kv_release(r[i].k, res[i].lease), 0);
	test_rank_fini(&s);
	test_rank_fini(&r[0]);
	test_rank_fini(&r[1]);
	free(h);
}
END_TEST

/* RELOAD is for root and the daemon's user: another uid on the allow list is refused. */
START_TEST(test_reload_refused_for_another_uid)
{
	char	extra[256], *out = NULL;
	pid_t	pid;
	int	st;

	if (geteuid() != 0) {
		printf("SKIPPED test_reload_refused_for_another_uid: needs root to connect as "
		    "another uid\n");
		return;
	}
	ck_assert_int_eq(test_daemon_stop(&td, SIGTERM, &st), 0);
	ck_assert_int_eq(test_daemon_start(&td, "{\"log\": {\"level\": \"info\"}, \"socket\": "
	    "{\"mode\": \"0666\"}, \"access\": {\"allow_uids\": [65534]}}"), 0);
	ck_assert_int_eq(chmod(td.dir, 0755), 0);
	snprintf(extra, sizeof(extra), "{\"log\": {\"level\": \"debug\"}, \"socket\": "
	    "{\"mode\": \"0666\"}, \"access\": {\"allow_uids\": [65534]}}");
	reload_write(extra);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct l3kv	*k;
		int		 rc;

		if (setgid(65534) != 0 || setuid(65534) != 0)
			_exit(10);
		if (l3kv_connect(td.sock, 5000, &k) != 0)
			_exit(11);
		rc = l3kv_reload(k, &out);
		if (rc != -EACCES || strstr(l3kv_last_error(k), "uid 65534 may not reload") == NULL)
			_exit(12);
		/* LIST is for every allowed peer */
		if (l3kv_list(k, L3KV_LIST_LEASES, 0, &out) != 0)
			_exit(13);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
	ck_assert(test_daemon_log_has(&td, "RELOAD from pid"));
	ck_assert(test_daemon_log_has(&td, "uid 65534 refused"));
	ck_assert_int_eq(reload_log_count("re-reading"), 0);
}
END_TEST


/* A daemon on the embedded default (no -f) has no file to re-read: RELOAD says so, SIGHUP logs it. */
START_TEST(test_reload_without_a_file_is_refused)
{
	char	bin[PATH_MAX], sock[PATH_MAX], log[PATH_MAX], args[PATH_MAX + 64], *out, *err;
	pid_t	pid;
	int	fd, st;

	test_path("l3kvd", bin, sizeof(bin));
	snprintf(sock, sizeof(sock), "%s/embedded.sock", td.dir);
	snprintf(log, sizeof(log), "%s/embedded.log", td.dir);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if ((fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600)) >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		setenv("L3KV_SOCKET", sock, 1);
		execl(bin, "l3kvd", (char *)NULL);
		_exit(127);
	}
	ck_assert_int_eq(test_wait_socket(sock, 20000), 0);
	snprintf(args, sizeof(args), "-s %s reload", sock);
	ck_assert_int_eq(ctl_run(args, &out, &err), 1);
	ck_assert_msg(strstr(err, "started without -f: there is no config file to re-read") != NULL,
	    "%s", err);
	free(out);
	free(err);
	ck_assert_int_eq(kill(pid, SIGHUP), 0);
	ck_assert_int_eq(ctl_run(args, &out, &err), 1);	/* still serving after it */
	free(out);
	free(err);
	ck_assert_int_eq(kill(pid, SIGTERM), 0);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	out = ctl_slurp(log);
	ck_assert_msg(strstr(out, "error reload: started without -f") != NULL, "%s", out);
	free(out);
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

/* mandoc is required (make deps installs it): its absence fails, never skips. */
static void
man_need_mandoc(void)
{
	char	*out;
	int	 rc = test_run_cmd("command -v mandoc", &out);

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
		rc = test_run_cmd(cmd, &out);
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
	ck_assert_int_eq(test_run_cmd(cmd, &out), 0);
	page = man_page(page_name);
	n = man_usage_options(out, opts, 64);
	ck_assert_msg(n >= 3, "%s -h: only %zu options found in:\n%s", prog, n, out);
	for (i = 0; i < n; i++) {
		snprintf(want, sizeof(want), ".It Fl %s", opts[i]);
		/*
		 * a command's own option ("stats [-H]") is documented on the
		 * command's line; a long alias beside its short one (".It Fl h ,
		 * Fl -help")
		 */
		if (!man_has_line(page, want)) {
			snprintf(want, sizeof(want), "Op Fl %s", opts[i]);
			if (strstr(page, want) == NULL)
				snprintf(want, sizeof(want), " , Fl %s", opts[i]);
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
	TCase	*reload = tcase_create("reload");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_health_prints_the_daemons_document);
	tcase_add_test(tc, test_stats_json_and_table_agree);
	tcase_add_test(tc, test_stats_table_names_array_elements_by_index);
	tcase_add_test(tc, test_version_names_client_and_server);
	tcase_add_test(tc, test_no_daemon_is_exit_1_with_a_reason);
	tcase_add_test(tc, test_bad_usage_is_exit_2);
	tcase_add_test(tc, test_help_names_every_command_and_option);
	tcase_add_test(tc, test_long_options_and_formats);
	tcase_add_test(tc, test_stats_watch_prints_rates);
	tcase_add_test(tc, test_devices_lists_each_device_or_says_there_is_none);
	tcase_add_test(tc, test_config_check_good_and_bad_files);
	tcase_add_test(tc, test_lists_show_namespaces_groups_and_leases);
	tcase_add_test(tc, test_list_of_an_unknown_kind_is_invalid);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(reload, reload_setup, teardown);
	tcase_set_timeout(reload, 30);
	tcase_add_test(reload, test_reload_sighup_applies_the_log_level);
	tcase_add_test(reload, test_reload_request_applies_and_refuses_by_name);
	tcase_add_test(reload, test_reload_broken_file_changes_nothing);
	tcase_add_test(reload, test_reload_live_limit_takes_effect);
	tcase_add_test(reload, test_reload_in_flight_requests_complete);
	tcase_add_test(reload, test_reload_refused_for_another_uid);
	tcase_add_test(reload, test_reload_without_a_file_is_refused);
	suite_add_tcase(s, reload);
	tcase_set_timeout(man, 20);
	tcase_add_test(man, test_man_pages_lint_clean);
	tcase_add_test(man, test_man_pages_name_every_option);
	tcase_add_test(man, test_man_config_names_every_key);
	tcase_add_test(man, test_man_library_names_every_function);
	suite_add_tcase(s, man);
	return s;
}
