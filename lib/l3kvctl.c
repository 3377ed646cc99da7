/*
 * l3kvctl: asks a running l3kvd what it holds and how it is doing, and
 * tells it to re-read its config, through libl3kv like any engine would;
 * checks a config file offline with the daemon's own parser.
 *
 * Every command prints JSON with -j (scripts pipe it to jq) or a table
 * for people with -H. health, stats and version print JSON unless -H
 * (as they always did); namespaces, groups, leases, devices, reload and
 * config check print a table unless -j. `stats --watch` prints the
 * per-second rates of the counters every interval.
 *
 * Exit status: 0 done, 1 the daemon could not be asked or refused (or
 * the file config check read is bad), 2 bad usage, 3 a reload refused
 * some changed keys (they need a restart).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "l3kv.h"
/* config check: the daemon's own parser (daemon/config.c, linked in). */
#include "daemon.h"

#define CTL_EXIT_FAIL		1
#define CTL_EXIT_USAGE		2
#define CTL_EXIT_REFUSED	3

/* What the command line asked for. */
struct ctl_opts {
	const char	*sock;
	int		 timeout;
	int		 format;	/* CTL_FMT_* */
#define CTL_FMT_DEFAULT	0	/* the command's own */
#define CTL_FMT_JSON	1
#define CTL_FMT_TABLE	2
	double		 watch;		/* stats --watch: seconds; 0: off */
	long		 count;		/* --count: reports; 0: until interrupted */
	unsigned	 max;		/* --max: list entries; 0: the daemon's cap */
};

static void
ctl_usage(FILE *f)
{
	fprintf(f,
	    "usage: l3kvctl [-hjH] [-s socket] [-t timeout_ms] command [options] [argument]\n"
	    "\n"
	    "commands:\n"
	    "  health             the daemon's health (JSON; -H: a table)\n"
	    "  stats              the daemon's counters (JSON; -H: a table); --watch: their rates\n"
	    "  namespaces         the namespaces attached: layout, sessions, objects per pool\n"
	    "  groups             the engine groups: policies, ranks (session, pid), leases\n"
	    "  leases             what is pinned, by whom (session, pid, group), age, TTL left\n"
	    "  devices            the GPU copy engines: GPU, UUID, jobs, bytes, staging in use\n"
	    "  reload             the daemon re-reads its config file: what it applied, refused\n"
	    "  config check FILE  parse and check a config file as l3kvd would, offline\n"
	    "  version            the client's and the daemon's versions (JSON)\n"
	    "\n"
	    "options (before or after the command):\n"
	    "  -h, --help             this help\n"
	    "  -s, --socket PATH      the daemon's socket (default $%s or %s)\n"
	    "  -t, --timeout MS       how long to wait for the daemon (default %d; -1: no limit)\n"
	    "  -j, --json             print JSON (the default of health, stats and version)\n"
	    "  -H, --human            print a table (the default of the other commands)\n"
	    "  -w, --watch [SECONDS]  stats: per-second rates every SECONDS (default 1)\n"
	    "  -n, --count N          stats --watch: stop after N reports (default: never)\n"
	    "  -m, --max N            namespaces, groups, leases: at most N (the daemon's cap: %d)\n"
	    "\n"
	    "exit status: 0 done; 1 the daemon could not be asked or refused, or the config\n"
	    "file is bad; 2 bad usage; 3 reload refused keys that need a restart\n",
	    L3KV_SOCKET_ENV, L3KV_SOCKET_DEFAULT, L3KV_DEFAULT_TIMEOUT_MS, PROTO_LIST_MAX);
}

/* Prints a JSON value with two-space indents and a final newline. */
static int
ctl_print_json(const json_t *j)
{
	if (json_dumpf(j, stdout, JSON_INDENT(2) | JSON_ENCODE_ANY) != 0)
		return -EIO;
	putchar('\n');
	return 0;
}

/* A counter's value as text: scalars plainly, anything else as compact JSON. */
static char *
ctl_value_text(const json_t *v)
{
	char	*s = NULL;

	switch (json_typeof(v)) {
	case JSON_STRING:
		/* An empty string would print as nothing at all. */
		return strdup(json_string_length(v) > 0 ? json_string_value(v) : "\"\"");
	case JSON_INTEGER:
		if (asprintf(&s, "%" JSON_INTEGER_FORMAT, json_integer_value(v)) < 0)
			return NULL;
		return s;
	case JSON_REAL:
		if (asprintf(&s, "%g", json_real_value(v)) < 0)
			return NULL;
		return s;
	case JSON_NULL:
		return strdup("null");
	case JSON_OBJECT:
	case JSON_ARRAY:
		/* only empty ones get here: ctl_flatten() descends into the rest */
		return strdup("(none)");
	default:
		return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
	}
}

struct ctl_row {
	char	*name;
	char	*value;
};

struct ctl_table {
	struct ctl_row	*rows;
	size_t		 n;
	size_t		 cap;
};

static int
ctl_table_add(struct ctl_table *t, const char *name, const json_t *v)
{
	struct ctl_row	*r;

	if (t->n == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 32;
		if ((r = realloc(t->rows, t->cap * sizeof(*r))) == NULL)
			return -ENOMEM;
		t->rows = r;
	}
	r = &t->rows[t->n];
	r->name = strdup(name);
	r->value = ctl_value_text(v);
	if (r->name == NULL || r->value == NULL) {
		free(r->name);
		free(r->value);
		return -ENOMEM;
	}
	t->n++;
	return 0;
}

static void
ctl_table_clear(struct ctl_table *t)
{
	size_t	i;

	for (i = 0; i < t->n; i++) {
		free(t->rows[i].name);
		free(t->rows[i].value);
	}
	t->n = 0;
}

static int	ctl_flatten(struct ctl_table *, const char *, json_t *);

/* Flattens child, named key under prefix. */
static int
ctl_flatten_child(struct ctl_table *t, const char *prefix, const char *key, json_t *child)
{
	char	*name;
	int	 rc;

	if (asprintf(&name, "%s%s%s", prefix, *prefix ? "." : "", key) < 0)
		return -ENOMEM;
	rc = ctl_flatten(t, name, child);
	free(name);
	return rc;
}

/*
 * Flattens v under the dotted name prefix: objects by key, arrays by
 * index, so that "groups": [{"id": "a"}] becomes groups.0.id.
 */
static int
ctl_flatten(struct ctl_table *t, const char *prefix, json_t *v)
{
	const char	*key;
	json_t		*child;
	char		 index[24];
	size_t		 i;
	int		 rc;

	if (json_is_object(v) && json_object_size(v) > 0) {
		json_object_foreach(v, key, child)
			if ((rc = ctl_flatten_child(t, prefix, key, child)) != 0)
				return rc;
		return 0;
	}
	if (json_is_array(v) && json_array_size(v) > 0) {
		json_array_foreach(v, i, child) {
			snprintf(index, sizeof(index), "%zu", i);
			if ((rc = ctl_flatten_child(t, prefix, index, child)) != 0)
				return rc;
		}
		return 0;
	}
	return ctl_table_add(t, prefix, v);
}

static void
ctl_table_print(const struct ctl_table *t, const char *indent)
{
	size_t	i, w = 0;

	for (i = 0; i < t->n; i++)
		if (strlen(t->rows[i].name) > w)
			w = strlen(t->rows[i].name);
	for (i = 0; i < t->n; i++)
		printf("%s%-*s  %s\n", indent, (int)w, t->rows[i].name, t->rows[i].value);
}

/* A top-level member that prints as a group: an object, an array, or null (off). */
static int
ctl_is_section(const json_t *v)
{
	return json_is_object(v) || json_is_array(v) || json_is_null(v);
}

/*
 * The peer tier's members, one line each: who, state, RTT, pulls, bytes
 * and failures by reason (only the reasons that happened).
 */
static void
ctl_print_peers(json_t *peers)
{
	const char	*why;
	json_t		*p, *n;
	size_t		 i;
	int		 any;

	json_array_foreach(peers, i, p) {
		printf("  %-16s %-10s rtt %6" JSON_INTEGER_FORMAT " us  pulls %8" JSON_INTEGER_FORMAT
		    "  bytes %12" JSON_INTEGER_FORMAT "  failures",
		    json_string_value(json_object_get(p, "id")) != NULL ?
		    json_string_value(json_object_get(p, "id")) : "?",
		    json_string_value(json_object_get(p, "state")) != NULL ?
		    json_string_value(json_object_get(p, "state")) : "?",
		    json_integer_value(json_object_get(p, "rtt_us")),
		    json_integer_value(json_object_get(p, "pulls")),
		    json_integer_value(json_object_get(p, "pull_bytes")));
		any = 0;
		json_object_foreach(json_object_get(p, "failures"), why, n)
			if (json_integer_value(n) > 0) {
				printf(" %s=%" JSON_INTEGER_FORMAT, why, json_integer_value(n));
				any = 1;
			}
		printf("%s\n", any ? "" : " none");
	}
}

/*
 * The table for people: top-level scalars first, then one group per
 * top-level object, array or null section (in the daemon's order), its
 * counters named relative to it.
 */
static int
ctl_print_table(json_t *doc)
{
	struct ctl_table	 t = { NULL, 0, 0 };
	const char		*key;
	json_t			*v;
	int			 rc = 0, groups = 0;

	if (!json_is_object(doc))
		return ctl_print_json(doc);
	json_object_foreach(doc, key, v) {
		if (ctl_is_section(v))
			continue;
		if ((rc = ctl_table_add(&t, key, v)) != 0)
			goto out;
	}
	ctl_table_print(&t, "");
	groups = t.n > 0;
	ctl_table_clear(&t);
	json_object_foreach(doc, key, v) {
		if (!ctl_is_section(v))
			continue;
		printf("%s%s\n", groups++ ? "\n" : "", key);
		if (json_is_null(v)) {
			/* a section the daemon does not have: a tier that is off */
			printf("  off\n");
			continue;
		}
		if ((json_is_object(v) ? json_object_size(v) : json_array_size(v)) == 0) {
			printf("  (none)\n");
			continue;
		}
		if (strcmp(key, "peers") == 0 && json_is_array(json_object_get(v, "peers"))) {
			/* The tier's counters, then a line per member. */
			json_t *copy = json_copy(v);

			json_object_del(copy, "peers");
			rc = ctl_flatten(&t, "", copy);
			json_decref(copy);
			if (rc != 0)
				goto out;
			ctl_table_print(&t, "  ");
			ctl_table_clear(&t);
			ctl_print_peers(json_object_get(v, "peers"));
			continue;
		}
		if ((rc = ctl_flatten(&t, "", v)) != 0)
			goto out;
		ctl_table_print(&t, "  ");
		ctl_table_clear(&t);
	}
out:
	ctl_table_clear(&t);
	free(t.rows);
	return rc;
}

/* Parses the daemon's JSON text; complains on stderr when it is not JSON. */
static json_t *
ctl_parse(const char *what, const char *text)
{
	json_error_t	 jerr;
	json_t		*j;

	if ((j = json_loads(text, JSON_DECODE_ANY, &jerr)) == NULL)
		fprintf(stderr, "l3kvctl: %s: the daemon sent invalid JSON: %s (line %d)\n", what,
		    jerr.text, jerr.line);
	return j;
}

/* Reports a failed request with the daemon's own words when it gave some. */
static int
ctl_fail(struct l3kv *k, const char *what, int rc)
{
	const char	*msg = l3kv_last_error(k);

	if (msg[0] != '\0')
		fprintf(stderr, "l3kvctl: %s: %s: %s\n", what, l3kv_strerror(rc), msg);
	else
		fprintf(stderr, "l3kvctl: %s: %s\n", what, l3kv_strerror(rc));
	return CTL_EXIT_FAIL;
}


/* A string member of the daemon's reply, or "?" where it has none. */
static const char *
ctl_str(const json_t *o, const char *key)
{
	const char	*s = json_string_value(json_object_get(o, key));

	return s != NULL ? s : "?";
}

/* Prints a document: pretty JSON, or the table of ctl_print_table(). */
static int
ctl_output(const char *what, json_t *j, int table)
{
	int	rc = table ? ctl_print_table(j) : ctl_print_json(j);

	if (rc != 0) {
		fprintf(stderr, "l3kvctl: %s: %s\n", what, strerror(-rc));
		return CTL_EXIT_FAIL;
	}
	return 0;
}

/* STATS or HEALTH, parsed; NULL (said on stderr) when the daemon did not answer with JSON. */
static json_t *
ctl_fetch(struct l3kv *k, const char *what)
{
	json_t	*j;
	char	*text = NULL;
	int	 rc;

	if (strcmp(what, "stats") == 0)
		rc = l3kv_stats(k, &text);
	else
		rc = l3kv_health(k, &text);
	if (rc != 0) {
		ctl_fail(k, what, rc);
		return NULL;
	}
	j = ctl_parse(what, text);
	l3kv_free(text);
	return j;
}

static int
ctl_document(struct l3kv *k, const char *what, const struct ctl_opts *o)
{
	json_t	*j;
	int	 rc;

	if ((j = ctl_fetch(k, what)) == NULL)
		return CTL_EXIT_FAIL;
	rc = ctl_output(what, j, o->format == CTL_FMT_TABLE);
	json_decref(j);
	return rc;
}

/* A counter of a STATS document, flattened: its dotted name and value. */
struct ctl_counter {
	char		*name;
	json_int_t	 value;
};

struct ctl_counters {
	struct ctl_counter	*c;
	size_t			 n;
	size_t			 cap;
};

static void
ctl_counters_free(struct ctl_counters *cs)
{
	size_t	i;

	for (i = 0; i < cs->n; i++)
		free(cs->c[i].name);
	free(cs->c);
	memset(cs, 0, sizeof(*cs));
}

/*
 * The integers of v under prefix, by dotted name, as ctl_flatten() names
 * them. The "daemon" section (pid, uptime) is identity, not a counter.
 */
static int
ctl_counters_add(struct ctl_counters *cs, const char *prefix, json_t *v)
{
	struct ctl_counter	*nc;
	const char		*key;
	json_t			*child;
	char			*name;
	size_t			 i;
	int			 rc = 0;

	if (json_is_integer(v)) {
		if (cs->n == cs->cap) {
			cs->cap = cs->cap ? cs->cap * 2 : 128;
			if ((nc = realloc(cs->c, cs->cap * sizeof(*nc))) == NULL)
				return -ENOMEM;
			cs->c = nc;
		}
		if ((cs->c[cs->n].name = strdup(prefix)) == NULL)
			return -ENOMEM;
		cs->c[cs->n++].value = json_integer_value(v);
		return 0;
	}
	if (json_is_object(v)) {
		json_object_foreach(v, key, child) {
			if (*prefix == '\0' && strcmp(key, "daemon") == 0)
				continue;
			if (asprintf(&name, "%s%s%s", prefix, *prefix ? "." : "", key) < 0)
				return -ENOMEM;
			rc = ctl_counters_add(cs, name, child);
			free(name);
			if (rc != 0)
				return rc;
		}
	} else if (json_is_array(v)) {
		json_array_foreach(v, i, child) {
			if (asprintf(&name, "%s%s%zu", prefix, *prefix ? "." : "", i) < 0)
				return -ENOMEM;
			rc = ctl_counters_add(cs, name, child);
			free(name);
			if (rc != 0)
				return rc;
		}
	}
	return 0;
}

static const struct ctl_counter *
ctl_counter_find(const struct ctl_counters *cs, const char *name, size_t hint)
{
	size_t	i;

	/* Same document shape: the same index, almost always. */
	if (hint < cs->n && strcmp(cs->c[hint].name, name) == 0)
		return &cs->c[hint];
	for (i = 0; i < cs->n; i++)
		if (strcmp(cs->c[i].name, name) == 0)
			return &cs->c[i];
	return NULL;
}

static double
ctl_now(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
ctl_sleep(double s)
{
	struct timespec	ts;

	ts.tv_sec = (time_t)s;
	ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/*
 * One report: the change of every counter since the last sample, per
 * second. JSON: one line per report with every counter's rate; the table
 * shows the ones that moved.
 */
static int
ctl_watch_report(const struct ctl_counters *prev, const struct ctl_counters *cur, double dt,
    int json)
{
	const struct ctl_counter	*p;
	json_t				*j, *rates;
	char				 when[32];
	time_t				 t = time(NULL);
	struct tm			 tm;
	size_t				 i, w = 0, moved = 0;
	double				 r;

	gmtime_r(&t, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	if (json) {
		rates = json_object();
		for (i = 0; i < cur->n; i++)
			if ((p = ctl_counter_find(prev, cur->c[i].name, i)) != NULL)
				json_object_set_new(rates, cur->c[i].name,
				    json_real((double)(cur->c[i].value - p->value) / dt));
		j = json_pack("{s:s, s:f, s:o}", "time", when, "interval_s", dt, "rates", rates);
		if (j == NULL || json_dumpf(j, stdout, JSON_COMPACT) != 0) {
			json_decref(j);
			return -ENOMEM;
		}
		json_decref(j);
		putchar('\n');
		fflush(stdout);
		return 0;
	}
	for (i = 0; i < cur->n; i++)
		if (strlen(cur->c[i].name) > w)
			w = strlen(cur->c[i].name);
	printf("%s  over %.2f s\n", when, dt);
	for (i = 0; i < cur->n; i++) {
		if ((p = ctl_counter_find(prev, cur->c[i].name, i)) == NULL ||
		    p->value == cur->c[i].value)
			continue;
		r = (double)(cur->c[i].value - p->value) / dt;
		printf("  %-*s  %14" JSON_INTEGER_FORMAT "  %12.1f/s\n", (int)w, cur->c[i].name,
		    cur->c[i].value, r);
		moved++;
	}
	if (moved == 0)
		printf("  (no counter moved)\n");
	putchar('\n');
	fflush(stdout);
	return 0;
}

static int
ctl_sample(struct l3kv *k, struct ctl_counters *cs)
{
	json_t	*j;
	int	 rc;

	if ((j = ctl_fetch(k, "stats")) == NULL)
		return -EIO;
	rc = ctl_counters_add(cs, "", j);
	json_decref(j);
	return rc;
}

/* stats --watch: a sample, then one report per interval (--count of them, or forever). */
static int
ctl_watch(struct l3kv *k, const struct ctl_opts *o)
{
	struct ctl_counters	 a = { NULL, 0, 0 }, b = { NULL, 0, 0 }, t;
	double			 t0, t1;
	long			 i;
	int			 rc;

	t0 = ctl_now();
	if ((rc = ctl_sample(k, &a)) != 0)
		goto out;
	for (i = 0; o->count == 0 || i < o->count; i++) {
		ctl_sleep(o->watch);
		t1 = ctl_now();
		if ((rc = ctl_sample(k, &b)) != 0)
			goto out;
		if ((rc = ctl_watch_report(&a, &b, t1 - t0, o->format == CTL_FMT_JSON)) != 0)
			goto out;
		ctl_counters_free(&a);
		t = a;
		a = b;
		b = t;
		t0 = t1;
	}
out:
	ctl_counters_free(&a);
	ctl_counters_free(&b);
	if (rc == -ENOMEM)
		fprintf(stderr, "l3kvctl: stats --watch: out of memory\n");
	return rc == 0 ? 0 : CTL_EXIT_FAIL;
}

/* A list's table: rows of cells, columns as wide as their widest cell. */
struct ctl_grid {
	char		**cells;	/* nrows x ncols, row 0 the header */
	size_t		  ncols;
	size_t		  nrows;
};

/* A cell's text: null is "-", booleans yes/no, numbers and strings as they are. */
static char *
ctl_cell(const json_t *v)
{
	if (v == NULL || json_is_null(v))
		return strdup("-");
	if (json_is_boolean(v))
		return strdup(json_is_true(v) ? "yes" : "no");
	if (json_is_string(v) && json_string_length(v) == 0)
		return strdup("\"\"");
	return ctl_value_text(v);
}

/* Milliseconds as people read them: 850ms, 12.3s, 4m05s. */
static char *
ctl_cell_ms(const json_t *v)
{
	json_int_t	 ms;
	char		*s = NULL;
	int		 n;

	if (!json_is_integer(v))
		return ctl_cell(v);
	ms = json_integer_value(v);
	if (ms < 1000)
		n = asprintf(&s, "%" JSON_INTEGER_FORMAT "ms", ms);
	else if (ms < 60000)
		n = asprintf(&s, "%.1fs", (double)ms / 1000);
	else
		n = asprintf(&s, "%" JSON_INTEGER_FORMAT "m%02" JSON_INTEGER_FORMAT "s",
		    ms / 60000, ms / 1000 % 60);
	return n < 0 ? NULL : s;
}

/* A column of a list's table: a header and a member, or a function of the entry. */
struct ctl_col {
	const char	*header;
	const char	*key;
	char		*(*fn)(const json_t *entry, const char *key);
};

static char *
ctl_col_plain(const json_t *e, const char *key)
{
	return ctl_cell(json_object_get(e, key));
}

static char *
ctl_col_ms(const json_t *e, const char *key)
{
	return ctl_cell_ms(json_object_get(e, key));
}

/* Appends "sep" and s to *acc (a malloc'd string); frees s. */
static int
ctl_join(char **acc, const char *sep, char *s)
{
	char	*n;
	int	 rc;

	if (s == NULL)
		return -ENOMEM;
	rc = *acc == NULL ? asprintf(&n, "%s", s) : asprintf(&n, "%s%s%s", *acc, sep, s);
	free(s);
	free(*acc);
	*acc = rc < 0 ? NULL : n;
	return rc < 0 ? -ENOMEM : 0;
}

/* namespaces: each pool as NAME:DRAM_OBJECTS[/FILE_OBJECTS]. */
static char *
ctl_col_pools(const json_t *e, const char *key)
{
	json_t	*p, *f;
	char	*acc = NULL, *s;
	size_t	 i;
	int	 n;

	json_array_foreach(json_object_get(e, key), i, p) {
		f = json_object_get(p, "file_objects");
		if (json_is_integer(f))
			n = asprintf(&s, "%s:%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT,
			    ctl_str(p, "name"),
			    json_integer_value(json_object_get(p, "dram_objects")),
			    json_integer_value(f));
		else
			n = asprintf(&s, "%s:%" JSON_INTEGER_FORMAT,
			    ctl_str(p, "name"),
			    json_integer_value(json_object_get(p, "dram_objects")));
		if (ctl_join(&acc, " ", n < 0 ? NULL : s) != 0)
			return NULL;
	}
	return acc != NULL ? acc : strdup("-");
}

/* groups: each attached rank as RANK=sSESSION/PID. */
static char *
ctl_col_members(const json_t *e, const char *key)
{
	json_t	*m, *pid;
	char	*acc = NULL, *s;
	size_t	 i;

	json_array_foreach(json_object_get(e, key), i, m) {
		pid = json_object_get(m, "pid");
		if (asprintf(&s, "%" JSON_INTEGER_FORMAT "=s%" JSON_INTEGER_FORMAT "/%s%"
		    JSON_INTEGER_FORMAT, json_integer_value(json_object_get(m, "rank")),
		    json_integer_value(json_object_get(m, "session")),
		    json_is_integer(pid) ? "pid" : "gone", json_integer_value(pid)) < 0)
			s = NULL;
		if (ctl_join(&acc, " ", s) != 0)
			return NULL;
	}
	return acc != NULL ? acc : strdup("-");
}

static const struct ctl_col ctl_ns_cols[] = {
	{ "NAME", "name", ctl_col_plain },
	{ "SESSIONS", "sessions", ctl_col_plain },
	{ "MODEL", "model", ctl_col_plain },
	{ "KV_DTYPE", "kv_dtype", ctl_col_plain },
	{ "PAGE", "page_tokens", ctl_col_plain },
	{ "TP", "tp_size", ctl_col_plain },
	{ "DCP", "dcp_size", ctl_col_plain },
	{ "POOLS(dram/file)", "pools", ctl_col_pools },
	{ NULL, NULL, NULL }
};

static const struct ctl_col ctl_group_cols[] = {
	{ "GROUP", "id", ctl_col_plain },
	{ "SIZE", "size", ctl_col_plain },
	{ "ATTACHED", "attached", ctl_col_plain },
	{ "PREFETCH", "prefetch", ctl_col_plain },
	{ "WRITE", "write", ctl_col_plain },
	{ "WAITING", "admissions_waiting", ctl_col_plain },
	{ "LEASES", "leases", ctl_col_plain },
	{ "RANKS(rank=session/pid)", "members", ctl_col_members },
	{ NULL, NULL, NULL }
};

static const struct ctl_col ctl_lease_cols[] = {
	{ "LEASE", "id", ctl_col_plain },
	{ "SESSION", "session", ctl_col_plain },
	{ "PID", "pid", ctl_col_plain },
	{ "GROUP", "group", ctl_col_plain },
	{ "RANK", "rank", ctl_col_plain },
	{ "STATE", "state", ctl_col_plain },
	{ "PAGES", "pages", ctl_col_plain },
	{ "PINNED", "objects", ctl_col_plain },
	{ "AGE", "age_ms", ctl_col_ms },
	{ "TTL_LEFT", "ttl_left_ms", ctl_col_ms },
	{ NULL, NULL, NULL }
};

/* Bytes as people read them: 512 B, 1.5 KiB, 3.0 GiB. */
static char *
ctl_col_bytes(const json_t *e, const char *key)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	const json_t	*v = json_object_get(e, key);
	double		 b;
	char		*s = NULL;
	size_t		 u;

	if (!json_is_integer(v))
		return ctl_cell(v);
	if (json_integer_value(v) < 1024)
		return asprintf(&s, "%" JSON_INTEGER_FORMAT " B", json_integer_value(v)) < 0 ?
		    NULL : s;
	b = (double)json_integer_value(v) / 1024;
	for (u = 0; b >= 1024 && u + 1 < sizeof(units) / sizeof(units[0]); u++)
		b /= 1024;
	return asprintf(&s, "%.1f %s", b, units[u]) < 0 ? NULL : s;
}

/* devices: the staging slots holding a chunk now, of the engine's slots; "-" before it started. */
static char *
ctl_col_staging(const json_t *e, const char *key)
{
	char	*s = NULL;

	(void)key;
	if (!json_is_true(json_object_get(e, "started")))
		return strdup("-");
	return asprintf(&s, "%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT,
	    json_integer_value(json_object_get(e, "staging_in_use")),
	    json_integer_value(json_object_get(e, "staging_slots"))) < 0 ? NULL : s;
}

static const struct ctl_col ctl_dev_cols[] = {
	{ "DEVICE", "device", ctl_col_plain },
	{ "GPU", "gpu", ctl_col_plain },
	{ "UUID", "uuid", ctl_col_plain },
	{ "STARTED", "started", ctl_col_plain },
	{ "REGIONS", "regions", ctl_col_plain },
	{ "INFLIGHT", "jobs_inflight", ctl_col_plain },
	{ "JOBS", "jobs", ctl_col_plain },
	{ "FAILED", "failed", ctl_col_plain },
	{ "BYTES", "bytes", ctl_col_bytes },
	{ "STAGING(in use/slots)", "", ctl_col_staging },
	{ NULL, NULL, NULL }
};

static void
ctl_grid_free(struct ctl_grid *g)
{
	size_t	i;

	for (i = 0; i < g->nrows * g->ncols; i++)
		free(g->cells[i]);
	free(g->cells);
}

/* Prints the entries as a table with the columns; "(none)" for none; says when truncated. */
static int
ctl_print_list(json_t *doc, const char *member, const struct ctl_col *cols)
{
	struct ctl_grid	 g = { NULL, 0, 0 };
	json_t		*a = json_object_get(doc, member), *e;
	size_t		*w, i, c, n;
	int		 rc = 0;

	for (g.ncols = 0; cols[g.ncols].header != NULL; g.ncols++)
		;
	n = (json_array_size(a) + 1) * g.ncols;
	if ((g.cells = calloc(n, sizeof(*g.cells))) == NULL ||
	    (w = calloc(g.ncols, sizeof(*w))) == NULL) {
		free(g.cells);
		return -ENOMEM;
	}
	g.nrows = json_array_size(a) + 1;
	for (c = 0; c < g.ncols; c++)
		g.cells[c] = strdup(cols[c].header);
	json_array_foreach(a, i, e) {
		for (c = 0; c < g.ncols; c++)
			g.cells[(i + 1) * g.ncols + c] = cols[c].fn(e, cols[c].key);
	}
	for (i = 0; i < n; i++) {
		if (g.cells[i] == NULL) {
			rc = -ENOMEM;
			goto out;
		}
		if (strlen(g.cells[i]) > w[i % g.ncols])
			w[i % g.ncols] = strlen(g.cells[i]);
	}
	for (i = 0; i < g.nrows; i++) {
		for (c = 0; c < g.ncols; c++) {
			if (c + 1 < g.ncols)
				printf("%-*s  ", (int)w[c], g.cells[i * g.ncols + c]);
			else
				printf("%s\n", g.cells[i * g.ncols + c]);
		}
	}
	if (g.nrows == 1)
		printf("(none)\n");
	if (json_is_true(json_object_get(doc, "truncated")))
		printf("(truncated: %" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT " shown)\n",
		    json_integer_value(json_object_get(doc, "count")),
		    json_integer_value(json_object_get(doc, "total")));
out:
	ctl_grid_free(&g);
	free(w);
	return rc;
}

/* namespaces, groups, leases: LIST, printed as a table or as JSON. */
static int
ctl_list(struct l3kv *k, const char *what, const struct ctl_opts *o)
{
	const struct ctl_col	*cols;
	enum l3kv_list_what	 w;
	json_t			*j;
	char			*text = NULL;
	int			 rc;

	if (strcmp(what, "namespaces") == 0) {
		w = L3KV_LIST_NAMESPACES;
		cols = ctl_ns_cols;
	} else if (strcmp(what, "groups") == 0) {
		w = L3KV_LIST_GROUPS;
		cols = ctl_group_cols;
	} else {
		w = L3KV_LIST_LEASES;
		cols = ctl_lease_cols;
	}
	if ((rc = l3kv_list(k, w, o->max, &text)) != 0)
		return ctl_fail(k, what, rc);
	j = ctl_parse(what, text);
	l3kv_free(text);
	if (j == NULL)
		return CTL_EXIT_FAIL;
	if (o->format == CTL_FMT_JSON)
		rc = ctl_print_json(j);
	else if (!json_is_array(json_object_get(j, what))) {
		fprintf(stderr, "l3kvctl: %s: the daemon's reply has no \"%s\" list\n", what, what);
		json_decref(j);
		return CTL_EXIT_FAIL;
	} else
		rc = ctl_print_list(j, what, cols);
	json_decref(j);
	if (rc != 0) {
		fprintf(stderr, "l3kvctl: %s: %s\n", what, strerror(-rc));
		return CTL_EXIT_FAIL;
	}
	return 0;
}

/*
 * devices: STATS' copy.devices, one line per cuda copy engine, or a
 * line saying there is none (no GPU: the host copy engine copies). -j:
 * {"copy_engine", "devices": [...]} as STATS has them.
 */
static int
ctl_devices(struct l3kv *k, const struct ctl_opts *o)
{
	json_t		*j, *devs, *out;
	const char	*engine;
	int		 rc;

	if ((j = ctl_fetch(k, "stats")) == NULL)
		return CTL_EXIT_FAIL;
	devs = json_object_get(json_object_get(j, "copy"), "devices");
	engine = ctl_str(json_object_get(j, "daemon"), "copy_engine");
	if (!json_is_array(devs)) {
		fprintf(stderr, "l3kvctl: devices: the daemon's STATS has no copy.devices list "
		    "(a daemon older than this l3kvctl)\n");
		json_decref(j);
		return CTL_EXIT_FAIL;
	}
	/* O: a new reference to devs; the string is copied. */
	if ((out = json_pack("{s:s, s:O}", "copy_engine", engine, "devices", devs)) == NULL) {
		json_decref(j);
		fprintf(stderr, "l3kvctl: devices: out of memory\n");
		return CTL_EXIT_FAIL;
	}
	json_decref(j);	/* devs and engine were its: out has its own copies */
	rc = 0;
	if (o->format == CTL_FMT_JSON)
		rc = ctl_print_json(out);
	else if (json_array_size(json_object_get(out, "devices")) == 0)
		printf("no GPU devices: the daemon copies with its %s copy engine\n",
		    ctl_str(out, "copy_engine"));
	else
		rc = ctl_print_list(out, "devices", ctl_dev_cols);
	json_decref(out);
	if (rc != 0) {
		fprintf(stderr, "l3kvctl: devices: %s\n", strerror(-rc));
		return CTL_EXIT_FAIL;
	}
	return 0;
}

/* reload: what the daemon applied and refused; exit 3 when it refused any. */
static int
ctl_reload(struct l3kv *k, const struct ctl_opts *o)
{
	json_t		*j, *applied, *refused, *e;
	char		*text = NULL;
	size_t		 i, w = 0;
	int		 rc;

	if ((rc = l3kv_reload(k, &text)) != 0)
		return ctl_fail(k, "reload", rc);
	j = ctl_parse("reload", text);
	l3kv_free(text);
	if (j == NULL)
		return CTL_EXIT_FAIL;
	applied = json_object_get(j, "applied");
	refused = json_object_get(j, "refused");
	if (o->format == CTL_FMT_JSON)
		rc = ctl_print_json(j) != 0 ? CTL_EXIT_FAIL : 0;
	else {
		printf("reloaded %s: %zu applied, %zu refused\n", ctl_str(j, "file"),
		    json_array_size(applied), json_array_size(refused));
		json_array_foreach(applied, i, e) {
			if (strlen(ctl_str(e, "key")) > w)
				w = strlen(ctl_str(e, "key"));
		}
		json_array_foreach(refused, i, e) {
			if (strlen(ctl_str(e, "key")) > w)
				w = strlen(ctl_str(e, "key"));
		}
		json_array_foreach(applied, i, e) {
			printf("  applied  %-*s  %s -> %s\n", (int)w, ctl_str(e, "key"),
			    ctl_str(e, "old"), ctl_str(e, "new"));
		}
		json_array_foreach(refused, i, e) {
			printf("  refused  %-*s  %s -> %s: %s\n", (int)w, ctl_str(e, "key"),
			    ctl_str(e, "old"), ctl_str(e, "new"), ctl_str(e, "reason"));
		}
		rc = 0;
	}
	if (rc == 0 && json_array_size(refused) > 0)
		rc = CTL_EXIT_REFUSED;
	json_decref(j);
	return rc;
}

/* config check FILE: the daemon's parser, offline; the message names the file and the key. */
static int
ctl_config_check(const char *file, const struct ctl_opts *o)
{
	static struct config	 cfg;
	char			 err[CONFIG_ERR_MAX];
	json_t			*j;
	int			 rc;

	rc = config_load_file(&cfg, file, err, sizeof(err));
	if (o->format == CTL_FMT_JSON) {
		j = json_pack("{s:s, s:b, s:s?}", "file", file, "ok", rc == 0, "error",
		    rc == 0 ? NULL : err);
		if (j == NULL || ctl_print_json(j) != 0) {
			json_decref(j);
			fprintf(stderr, "l3kvctl: config check: out of memory\n");
			return CTL_EXIT_FAIL;
		}
		json_decref(j);
	} else if (rc == 0)
		printf("%s: configuration OK\n", file);
	if (rc != 0)
		fprintf(stderr, "l3kvctl: config check: %s\n", err);
	return rc == 0 ? 0 : CTL_EXIT_FAIL;
}

/* The client's versions, and the daemon's when it answered (else null). */
static int
ctl_version(struct l3kv *k, const struct ctl_opts *o)
{
	struct l3kv_server_info	 info;
	json_t			*j, *server = json_null();
	int			 rc;

	if (k != NULL && l3kv_server_info(k, &info) == 0) {
		json_decref(server);
		server = json_pack("{s:s, s:s, s:i, s:i, s:b, s:b, s:I, s:I}",
		    "name", info.server, "role", info.role, "protocol", (int)info.protocol,
		    "caps", (int)info.caps, "cuda_copy", (info.caps & L3KV_CAP_CUDA_COPY) != 0,
		    "nonblock", (info.caps & L3KV_CAP_NONBLOCK) != 0,
		    "max_frame", (json_int_t)info.max_frame,
		    "lease_ttl_ms", (json_int_t)info.lease_ttl_ms);
	}
	j = json_pack("{s:{s:s, s:i, s:i}, s:o*}",
	    "client", "version", l3kv_version(), "protocol_min", L3KV_PROTOCOL_MIN,
	    "protocol_max", L3KV_PROTOCOL_MAX, "server", server);
	if (j == NULL || (rc = ctl_output("version", j, o->format == CTL_FMT_TABLE)) != 0) {
		json_decref(j);
		if (j == NULL)
			fprintf(stderr, "l3kvctl: version: out of memory\n");
		return CTL_EXIT_FAIL;
	}
	json_decref(j);
	return 0;
}

static int
ctl_parse_long(const char *s, long min, long max, long *out)
{
	char	*end;
	long	 v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

/* SECONDS of --watch: a positive number, fractions allowed (0.5), at most a day. */
static int
ctl_parse_seconds(const char *s, double *out)
{
	char	*end;
	double	 v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0.01 || v > 86400)
		return -EINVAL;
	*out = v;
	return 0;
}

/* The commands, with the options each takes beyond -s, -t, -j and -H. */
static const struct ctl_cmd {
	const char	*name;
	int		 flags;
#define CTL_C_DAEMON	0x01	/* asks the daemon */
#define CTL_C_WATCH	0x02	/* --watch, --count */
#define CTL_C_MAX	0x04	/* --max */
#define CTL_C_TABLE	0x08	/* prints a table unless -j */
#define CTL_C_ARG	0x10	/* takes "check FILE" */
} ctl_cmds[] = {
	{ "health",	CTL_C_DAEMON },
	{ "stats",	CTL_C_DAEMON | CTL_C_WATCH },
	{ "namespaces",	CTL_C_DAEMON | CTL_C_MAX | CTL_C_TABLE },
	{ "groups",	CTL_C_DAEMON | CTL_C_MAX | CTL_C_TABLE },
	{ "leases",	CTL_C_DAEMON | CTL_C_MAX | CTL_C_TABLE },
	{ "devices",	CTL_C_DAEMON | CTL_C_TABLE },
	{ "reload",	CTL_C_DAEMON | CTL_C_TABLE },
	{ "config",	CTL_C_TABLE | CTL_C_ARG },
	{ "version",	CTL_C_DAEMON },
	{ NULL,		0 }
};

static const struct option ctl_longopts[] = {
	{ "help",	no_argument,		NULL, 'h' },
	{ "socket",	required_argument,	NULL, 's' },
	{ "timeout",	required_argument,	NULL, 't' },
	{ "json",	no_argument,		NULL, 'j' },
	{ "human",	no_argument,		NULL, 'H' },
	{ "watch",	optional_argument,	NULL, 'w' },
	{ "count",	required_argument,	NULL, 'n' },
	{ "max",	required_argument,	NULL, 'm' },
	{ NULL,		0,			NULL, 0 }
};

static int
ctl_bad(const char *fmt, const char *arg)
{
	fprintf(stderr, "l3kvctl: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	ctl_usage(stderr);
	return CTL_EXIT_USAGE;
}

/*
 * Options of one stretch of the command line (before the command, or
 * after it: argv[0] is then the command). cmd is NULL before the
 * command; options that belong to a command are refused on another.
 * Returns 0, -1 for --help (printed), or CTL_EXIT_USAGE (said).
 */
static int
ctl_getopt(int argc, char **argv, const struct ctl_cmd *cmd, struct ctl_opts *o, int *next)
{
	long	v;
	int	ch;

	optind = 0;	/* glibc: start again from argv[1], state reset */
	opterr = 1;
	/* '+': stop at the first operand (the command, or "check FILE"). */
	while ((ch = getopt_long(argc, argv, "+hs:t:jHw::n:m:", ctl_longopts, NULL)) != -1) {
		switch (ch) {
		case 'h':
			ctl_usage(stdout);
			return -1;
		case 's':
			o->sock = optarg;
			break;
		case 't':
			if (ctl_parse_long(optarg, -1, INT_MAX, &v) != 0)
				return ctl_bad("-t %s: not a timeout in ms (-1 or more)", optarg);
			o->timeout = (int)v;
			break;
		case 'j':
			o->format = CTL_FMT_JSON;
			break;
		case 'H':
			o->format = CTL_FMT_TABLE;
			break;
		case 'w':
			if (cmd == NULL || !(cmd->flags & CTL_C_WATCH))
				return ctl_bad("%s: only stats takes --watch", cmd ? cmd->name : "-w");
			/* "--watch 2": an optional argument may also be the next word, if a number. */
			if (optarg == NULL && optind < argc &&
			    ctl_parse_seconds(argv[optind], &o->watch) == 0)
				optind++;
			else if (optarg == NULL)
				o->watch = 1;
			else if (ctl_parse_seconds(optarg, &o->watch) != 0)
				return ctl_bad("--watch %s: not a number of seconds (0.01 to 86400)",
				    optarg);
			break;
		case 'n':
			if (cmd == NULL || !(cmd->flags & CTL_C_WATCH))
				return ctl_bad("%s: only stats --watch takes --count",
				    cmd ? cmd->name : "-n");
			if (ctl_parse_long(optarg, 1, LONG_MAX, &o->count) != 0)
				return ctl_bad("--count %s: not a count (1 or more)", optarg);
			break;
		case 'm':
			if (cmd == NULL || !(cmd->flags & CTL_C_MAX))
				return ctl_bad("%s: only namespaces, groups and leases take --max",
				    cmd ? cmd->name : "-m");
			if (ctl_parse_long(optarg, 1, UINT32_MAX, &v) != 0)
				return ctl_bad("--max %s: not a count (1 or more)", optarg);
			o->max = (unsigned)v;
			break;
		default:
			ctl_usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	*next = optind;
	return 0;
}

#define CTL_OPERANDS_MAX	4

/* Connects and runs a command that asks the daemon. */
static int
ctl_daemon(const struct ctl_cmd *cmd, struct ctl_opts *o)
{
	struct l3kv	*k = NULL;
	int		 rc;

	if (o->sock == NULL)
		o->sock = l3kv_default_socket();
	/* 0 would mean the library's default: the user's 0 means "do not wait". */
	rc = l3kv_connect(o->sock, o->timeout == 0 ? 1 : o->timeout, &k);
	if (rc != 0) {
		fprintf(stderr, "l3kvctl: connect %s: %s\n", o->sock, l3kv_strerror(rc));
		if (strcmp(cmd->name, "version") == 0)
			ctl_version(NULL, o);
		return CTL_EXIT_FAIL;
	}
	if (strcmp(cmd->name, "version") == 0)
		rc = ctl_version(k, o);
	else if (strcmp(cmd->name, "stats") == 0 && o->watch > 0)
		rc = ctl_watch(k, o);
	else if (strcmp(cmd->name, "reload") == 0)
		rc = ctl_reload(k, o);
	else if (strcmp(cmd->name, "devices") == 0)
		rc = ctl_devices(k, o);
	else if (cmd->flags & CTL_C_MAX)
		rc = ctl_list(k, cmd->name, o);
	else
		rc = ctl_document(k, cmd->name, o);
	l3kv_close(k);
	return rc;
}

int
main(int argc, char **argv)
{
	struct ctl_opts		 o = { NULL, L3KV_DEFAULT_TIMEOUT_MS, CTL_FMT_DEFAULT, 0, 0, 0 };
	const struct ctl_cmd	*cmd;
	const char		*ops[CTL_OPERANDS_MAX];
	int			 rc, next, pos, nops = 0;

	if ((rc = ctl_getopt(argc, argv, NULL, &o, &next)) != 0)
		return rc < 0 ? 0 : rc;
	if (next >= argc) {
		ctl_usage(stderr);
		return CTL_EXIT_USAGE;
	}
	for (cmd = ctl_cmds; cmd->name != NULL && strcmp(cmd->name, argv[next]) != 0; cmd++)
		;
	if (cmd->name == NULL)
		return ctl_bad("unknown command \"%s\"", argv[next]);
	/*
	 * The command's options and operands, in any order: each operand
	 * found becomes the argv[0] of the next stretch getopt reads.
	 */
	for (pos = next;;) {
		if ((rc = ctl_getopt(argc - pos, argv + pos, cmd, &o, &next)) != 0)
			return rc < 0 ? 0 : rc;
		if ((pos += next) >= argc)
			break;
		if (nops == CTL_OPERANDS_MAX || !(cmd->flags & CTL_C_ARG))
			return ctl_bad("unexpected argument \"%s\"", argv[pos]);
		ops[nops++] = argv[pos];
	}
	if (cmd->flags & CTL_C_ARG) {
		if (nops != 2 || strcmp(ops[0], "check") != 0)
			return ctl_bad("%s: the command is \"config check FILE\"", cmd->name);
	}
	if (o.format == CTL_FMT_DEFAULT)
		o.format = cmd->flags & CTL_C_TABLE || o.watch > 0 ? CTL_FMT_TABLE : CTL_FMT_JSON;
	if (!(cmd->flags & CTL_C_DAEMON))
		return ctl_config_check(ops[1], &o);
	return ctl_daemon(cmd, &o);
}
