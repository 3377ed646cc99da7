/*
 * l3kvctl: asks a running l3kvd for its health, its counters or its
 * version, through libl3kv like any engine would.
 *
 * Output is the daemon's JSON, pretty-printed, so that scripts can pipe
 * it to jq; `stats -H` prints the same counters as a table for people.
 * Exit status: 0 done, 1 the daemon could not be asked or refused,
 * 2 bad usage.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "l3kv.h"

#define CTL_EXIT_FAIL	1
#define CTL_EXIT_USAGE	2

static void
ctl_usage(FILE *f)
{
	fprintf(f,
	    "usage: l3kvctl [-h] [-s socket] [-t timeout_ms] command\n"
	    "\n"
	    "commands:\n"
	    "  health      the daemon's health document (JSON)\n"
	    "  stats [-H]  the daemon's counters (JSON; -H: a table for people)\n"
	    "  version     the client's and the daemon's versions (JSON)\n"
	    "\n"
	    "  -s socket      the daemon's socket (default $%s or %s)\n"
	    "  -t timeout_ms  how long to wait for the daemon (default %d; -1: no limit)\n",
	    L3KV_SOCKET_ENV, L3KV_SOCKET_DEFAULT, L3KV_DEFAULT_TIMEOUT_MS);
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

static int
ctl_document(struct l3kv *k, const char *what, int human)
{
	json_t	*j;
	char	*text = NULL;
	int	 rc;

	if (strcmp(what, "stats") == 0)
		rc = l3kv_stats(k, &text);
	else
		rc = l3kv_health(k, &text);
	if (rc != 0)
		return ctl_fail(k, what, rc);
	j = ctl_parse(what, text);
	l3kv_free(text);
	if (j == NULL)
		return CTL_EXIT_FAIL;
	rc = human ? ctl_print_table(j) : ctl_print_json(j);
	json_decref(j);
	if (rc != 0) {
		fprintf(stderr, "l3kvctl: %s: %s\n", what, strerror(-rc));
		return CTL_EXIT_FAIL;
	}
	return 0;
}

/* The client's versions, and the daemon's when it answered (else null). */
static int
ctl_version(struct l3kv *k)
{
	struct l3kv_server_info	 info;
	json_t			*j, *server = json_null();

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
	if (j == NULL || ctl_print_json(j) != 0) {
		json_decref(j);
		fprintf(stderr, "l3kvctl: version: out of memory\n");
		return CTL_EXIT_FAIL;
	}
	json_decref(j);
	return 0;
}

static int
ctl_parse_timeout(const char *s, int *out)
{
	char	*end;
	long	 v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < -1 || v > INT_MAX)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

int
main(int argc, char **argv)
{
	struct l3kv	*k = NULL;
	const char	*sock = NULL, *cmd;
	int		 ch, rc, timeout = L3KV_DEFAULT_TIMEOUT_MS, human = 0, i;

	/* '+': options end at the command, whose own options follow it. */
	while ((ch = getopt(argc, argv, "+hs:t:")) != -1) {
		switch (ch) {
		case 'h':
			ctl_usage(stdout);
			return 0;
		case 's':
			sock = optarg;
			break;
		case 't':
			if (ctl_parse_timeout(optarg, &timeout) != 0) {
				fprintf(stderr, "l3kvctl: -t %s: not a timeout in ms (-1 or more)\n",
				    optarg);
				return CTL_EXIT_USAGE;
			}
			break;
		default:
			ctl_usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		ctl_usage(stderr);
		return CTL_EXIT_USAGE;
	}
	cmd = argv[optind];
	if (strcmp(cmd, "health") != 0 && strcmp(cmd, "stats") != 0 &&
	    strcmp(cmd, "version") != 0) {
		fprintf(stderr, "l3kvctl: unknown command \"%s\"\n", cmd);
		ctl_usage(stderr);
		return CTL_EXIT_USAGE;
	}
	for (i = optind + 1; i < argc; i++) {
		if (strcmp(cmd, "stats") == 0 && strcmp(argv[i], "-H") == 0) {
			human = 1;
			continue;
		}
		fprintf(stderr, "l3kvctl: %s: unexpected argument \"%s\"\n", cmd, argv[i]);
		ctl_usage(stderr);
		return CTL_EXIT_USAGE;
	}
	if (sock == NULL)
		sock = l3kv_default_socket();
	/* 0 would mean the library's default: the user's 0 means "do not wait". */
	rc = l3kv_connect(sock, timeout == 0 ? 1 : timeout, &k);
	if (rc != 0) {
		fprintf(stderr, "l3kvctl: connect %s: %s\n", sock, l3kv_strerror(rc));
		if (strcmp(cmd, "version") == 0)
			ctl_version(NULL);
		return CTL_EXIT_FAIL;
	}
	if (strcmp(cmd, "version") == 0)
		rc = ctl_version(k);
	else
		rc = ctl_document(k, cmd, human);
	l3kv_close(k);
	return rc;
}
