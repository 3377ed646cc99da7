/*
 * config.c: every fixture in tests/data against its expected message,
 * the defaults against config/l3kvd.json and the embedded text, sizes,
 * bounds, $L3KV_SOCKET, small error buffers, and `l3kvd -n`.
 *
 * Fixtures are found under $L3KV_SRCDIR (default "."), the repository
 * root that `make check` runs from.
 */
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "tests.h"

/*
 * Each bad fixture and what its message must say right after the file
 * name: the dotted key (or LINE:COLUMN for syntax errors) and the start
 * of the problem; problem, where set, must appear somewhere after.
 */
static const struct {
	const char	*file;
	const char	*after;
	const char	*problem;
} bad_fixtures[] = {
	{ "bad-unknown-top.json", ": sockets: unknown key", NULL },
	{ "bad-unknown-nested.json", ": socket.bogus: unknown key", NULL },
	{ "bad-unknown-deep.json", ": tiers.dram.pinned: unknown key", NULL },
	{ "bad-unknown-tier.json", ": tiers.nvme: unknown key", NULL },
	{ "bad-dotted-key.json", ": socket.path: unknown key", "nested objects" },
	{ "bad-duplicate.json", ":4:10: socket.path: duplicate key", NULL },
	{ "bad-duplicate-top.json", ":1:26: role: duplicate key", NULL },
	{ "bad-type-string.json",
	    ": limits.max_connections: expected an integer, got string \"many\"", NULL },
	{ "bad-type-real.json", ": lease.ttl_ms: expected an integer, got real 1.5", NULL },
	{ "bad-type-null.json", ": model: expected a string, got null", NULL },
	{ "bad-section-not-object.json",
	    ": tiers.dram: expected an object, got string \"1 GiB\"", NULL },
	{ "bad-range-low.json", ": tiers.dram.size: 0 is out of range [2 MiB, 1 TiB]", NULL },
	{ "bad-range-high.json",
	    ": limits.max_connections: 65537 is out of range [1, 65536]", NULL },
	{ "bad-range-negative.json", ": shutdown.drain_ms: -1 is out of range [0, 600000]", NULL },
	{ "bad-range-frame.json",
	    ": limits.max_frame: \"128 MiB\" is out of range [64 KiB, 64 MiB]", NULL },
	{ "bad-seed-too-big.json", ":3:31: namespace.seed: too big integer", NULL },
	{ "bad-size-unit.json", ": tiers.dram.size: unknown unit \"MB\" in \"64 MB\"", NULL },
	{ "bad-size-string.json",
	    ": limits.max_frame: expected an integer or a size string, got string \"abc\"", NULL },
	{ "bad-size-fraction.json", ": tiers.dram.size: \"1.5 GiB\": fractions", NULL },
	{ "bad-log-level.json",
	    ": log.level: \"verbose\" is not one of error, warn, info, debug", NULL },
	{ "bad-role.json", ": role: \"encode\" is not one of decode, prefill", NULL },
	{ "bad-copy-engine.json", ": copy_engine: \"gpu\" is not one of auto, cuda, host", NULL },
	{ "bad-copy-workers-range.json", ": copy_workers: 65 is out of range [1, 64]", NULL },
	{ "bad-copy-workers-zero.json", ": copy_workers: 0 is out of range [1, 64]", NULL },
	{ "bad-debug-ops-string.json",
	    ": testing.debug_ops: expected true or false, got string \"yes\"", NULL },
	{ "bad-debug-ops-integer.json",
	    ": testing.debug_ops: expected true or false, got integer 1", NULL },
	{ "bad-file-capacity-range.json",
	    ": tiers.file.capacity: \"512 KiB\" is out of range [1 MiB, 1 PiB]", NULL },
	{ "bad-file-fsync-string.json",
	    ": tiers.file.fsync: expected true or false, got string \"always\"", NULL },
	{ "bad-mode-digits.json", ": socket.mode: \"0968\" is not an octal mode", NULL },
	{ "bad-mode-integer.json",
	    ": socket.mode: expected an octal string like \"0660\", got integer 660", NULL },
	{ "bad-mode-range.json", ": socket.mode: \"4755\" is out of range [0000, 0777]", NULL },
	{ "bad-allow-not-array.json",
	    ": access.allow_uids: expected an array of integers, got integer 1000", NULL },
	{ "bad-allow-element.json",
	    ": access.allow_gids[1]: expected an integer, got string \"wheel\"", NULL },
	{ "bad-allow-range.json",
	    ": access.allow_uids[1]: 4294967295 is out of range [0, 4294967294]", NULL },
	{ "bad-allow-too-many.json", ": access.allow_uids: 65 entries, at most 64", NULL },
	{ "bad-socket-path-long.json", ": socket.path: ",
	    "is 108 bytes long, out of range [1, 107]" },
	{ "bad-socket-path-empty.json",
	    ": socket.path: \"\" is 0 bytes long, out of range [1, 107]", NULL },
	{ "bad-model-ascii.json", ": model: ", "is not printable ASCII" },
	{ "bad-syntax.json", ":4:10: ", "expected" },
	{ "bad-syntax-trailing-comma.json", ":3:1: ", "expected" },
	{ "bad-empty.json", ":1:0: ", "end of file" },
	{ "bad-top-array.json", ": (top level): expected an object, got an array", NULL },
	{ "bad-top-scalar.json",
	    ": (top level): expected an object, got string \"l3kvd\"", NULL },
	{ "bad-metrics-listen.json", ": metrics.listen: \"9100\" is not HOST:PORT", NULL },
	{ "bad-metrics-port.json", ": metrics.listen: port 70000 is out of range [1, 65535]",
	    NULL },
};
#define NBAD	((int)(sizeof(bad_fixtures) / sizeof(bad_fixtures[0])))

static const char *
srcdir(void)
{
	const char	*s = getenv("L3KV_SRCDIR");

	return s != NULL && *s != '\0' ? s : ".";
}

static char *
src_path(const char *rel, char *buf, size_t len)
{
	ck_assert((size_t)snprintf(buf, len, "%s/%s", srcdir(), rel) < len);
	return buf;
}

/* The whole file in a new NUL-terminated buffer, or NULL. */
static char *
read_text(const char *path)
{
	FILE	*f;
	char	*buf;
	long	 n;

	if ((f = fopen(path, "rb")) == NULL)
		return NULL;
	if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
	    (buf = malloc((size_t)n + 1)) == NULL) {
		fclose(f);
		return NULL;
	}
	if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		fclose(f);
		return NULL;
	}
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/*
 * Every field of struct config: how it compares (STR or INT), its
 * documented default (config/README.md), and what tests/data/good-full.json
 * sets it to. The fixture leaves tiers.file.readers, read_depth and
 * fd_cache, testing.scan_delay_ms and the connection deadlines and output
 * bound (limits.*_timeout_ms, limits.max_output) at their defaults.
 */
#define CONFIG_FIELDS(X)								\
	X(STR, socket_path,		"./run/l3kvd.sock",	"/tmp/l3kv-check/l3kvd.sock") \
	X(INT, socket_mode,		0660,			0600)			\
	X(STR, socket_group,		"",			"l3kv")			\
	X(INT, nallow_uids,		0,			2)			\
	X(INT, allow_uids[0],		0,			1000)			\
	X(INT, allow_uids[1],		0,			1001)			\
	X(INT, nallow_gids,		0,			1)			\
	X(INT, allow_gids[0],		0,			100)			\
	X(INT, log_level,		LOG_LEVEL_INFO,		LOG_LEVEL_DEBUG)	\
	X(STR, role,			"decode",		"prefill")		\
	X(STR, model,			"",			"deepseek-ai/DeepSeek-V3") \
	X(INT, namespace_seed,		0,			42)			\
	X(INT, dram_size,		256ULL << 20,		1ULL << 30)		\
	X(STR, file_path,		"",			"/var/cache/l3kv")	\
	X(INT, file_capacity,		64ULL << 30,		2ULL << 40)		\
	X(INT, file_fsync,		0,			1)			\
	X(INT, file_readers,		4,			4)			\
	X(INT, file_read_depth,		32,			32)			\
	X(INT, file_fd_cache,		32768,			32768)			\
	X(INT, copy_engine,		CONFIG_COPY_AUTO,	CONFIG_COPY_HOST)	\
	X(INT, copy_workers,		2,			8)			\
	X(INT, max_connections,		1024,			64)			\
	X(INT, max_connections_per_uid,	256,			8)			\
	X(INT, max_namespaces,		1024,			16)			\
	X(INT, max_frame,		16U << 20,		1U << 20)		\
	X(INT, hello_timeout_ms,	5000,			5000)			\
	X(INT, attach_timeout_ms,	60000,			60000)			\
	X(INT, frame_timeout_ms,	10000,			10000)			\
	X(INT, max_output,		4U << 20,		4U << 20)		\
	X(INT, output_timeout_ms,	10000,			10000)			\
	X(INT, lease_ttl_ms,		30000,			5000)			\
	X(INT, admit_timeout_ms,	2000,			500)			\
	X(INT, admit_max_waiting,	128,			16)			\
	X(INT, drain_ms,		5000,			0)			\
	X(STR, metrics_listen,		"",			"127.0.0.1:9100")	\
	X(INT, test_copy_delay_ms,	0,			10)			\
	X(INT, test_scan_delay_ms,	0,			0)			\
	X(INT, test_read_delay_ms,	0,			0)			\
	X(INT, test_debug_ops,		0,			1)			\
	X(INT, test_peer_pull_delay_ms,	0,			0)			\
	X(INT, test_peer_bad_key,	0,			0)			\
	X(INT, test_cuda_engines_per_gpu, 1,			2)			\
	X(STR, peer_id,			"",			"node-b")		\
	X(STR, peer_listen,		"",			"10.0.0.2:7400")	\
	X(STR, peer_provider,		"tcp",			"sockets")		\
	X(STR, peer_fabric_addr,	"",			"10.0.0.2")		\
	X(INT, peer_lanes,		1,			4)			\
	X(INT, peer_stripe_pages,	16,			8)			\
	X(INT, peer_replicas,		1,			2)			\
	X(STR, peer_secret,		"",			"s3cret")		\
	X(INT, peer_timeout_ms,		1000,			250)			\
	X(INT, peer_pull_timeout_ms,	5000,			2000)			\
	X(INT, peer_lease_max_ms,	30000,			10000)			\
	X(INT, peer_ping_ms,		1000,			500)			\
	X(INT, peer_user_timeout_ms,	5000,			3000)			\
	X(STR, peer_etcd_endpoint,	"",			"http://10.0.0.9:2379")	\
	X(STR, peer_etcd_prefix,	"",			"/l3kv/test/")		\
	X(INT, peer_etcd_ttl_s,		10,			5)			\
	X(INT, npeer_members,		0,			2)			\
	X(STR, peer_members[0].id,	"",			"node-a")		\
	X(STR, peer_members[0].addr,	"",			"10.0.0.1:7400")	\
	X(STR, peer_members[1].id,	"",			"node-b")		\
	X(STR, peer_members[1].addr,	"",			"10.0.0.2:7400")

#define WANT_DEFAULT(kind, field, def, full)	.field = def,
#define WANT_FULL(kind, field, def, full)	.field = full,
static const struct config	want_defaults = { CONFIG_FIELDS(WANT_DEFAULT) };
static const struct config	want_full = { CONFIG_FIELDS(WANT_FULL) };
#undef WANT_DEFAULT
#undef WANT_FULL

/* Field by field, so that a failure names the field and both values. */
static void
assert_config_equal(const struct config *a, const struct config *b, const char *what)
{
#define EQ_STR(f)	ck_assert_msg(strcmp(a->f, b->f) == 0, "%s: " #f " \"%s\", want \"%s\"", \
	    what, a->f, b->f)
#define EQ_INT(f)	ck_assert_msg(a->f == b->f, "%s: " #f " %llu, want %llu", what, \
	    (unsigned long long)a->f, (unsigned long long)b->f)
#define EQ(kind, field, def, full)	EQ_##kind(field);
	CONFIG_FIELDS(EQ)
#undef EQ
#undef EQ_STR
#undef EQ_INT
	/* And nothing the list above forgot (more ids, new fields): config.c zero-fills strings. */
	ck_assert_msg(memcmp(a, b, sizeof(*a)) == 0, "%s: bytes differ", what);
}

/* Loads text, expecting success. */
static void
load_ok(struct config *cfg, const char *text)
{
	char	err[CONFIG_ERR_MAX];
	int	rc;

	rc = config_load_string(cfg, text, "t.json", err, sizeof(err));
	ck_assert_msg(rc == 0, "%s: rc %d: %s", text, rc, err);
}

/* Loads text, expecting -EINVAL and a message starting "t.json" + after. */
static void
load_bad(const char *text, const char *after)
{
	struct config	cfg;
	char		err[CONFIG_ERR_MAX];
	int		rc;

	rc = config_load_string(&cfg, text, "t.json", err, sizeof(err));
	ck_assert_msg(rc == -EINVAL, "%s: rc %d", text, rc);
	ck_assert_msg(strncmp(err, "t.json", 6) == 0 && strncmp(err + 6, after, strlen(after)) == 0,
	    "%s: got \"%s\", want \"t.json%s...\"", text, err, after);
}

/* {"a": {"b": VALUE}} from "a.b" and VALUE. */
static char *
nest(const char *key, const char *value, char *buf, size_t len)
{
	const char	*dot;
	size_t		 off = 0, depth = 0;

	while ((dot = strchr(key, '.')) != NULL) {
		off += (size_t)snprintf(buf + off, len - off, "{\"%.*s\": ", (int)(dot - key), key);
		key = dot + 1;
		depth++;
	}
	off += (size_t)snprintf(buf + off, len - off, "{\"%s\": %s}", key, value);
	while (depth-- > 0)
		off += (size_t)snprintf(buf + off, len - off, "}");
	ck_assert(off < len);
	return buf;
}

/* value as a JSON string, in buf. */
static char *
quote(const char *value, char *buf, size_t len)
{
	ck_assert((size_t)snprintf(buf, len, "\"%s\"", value) < len);
	return buf;
}

/* Loads key (dotted) set to the string value, expecting success. */
static void
load_ok_key(struct config *cfg, const char *key, const char *value)
{
	char	q[128], text[256];

	load_ok(cfg, nest(key, quote(value, q, sizeof(q)), text, sizeof(text)));
}

/* Loads key (dotted) set to the string value, expecting what load_bad expects. */
static void
load_bad_key(const char *key, const char *value, const char *after)
{
	char	q[128], text[256];

	load_bad(nest(key, quote(value, q, sizeof(q)), text, sizeof(text)), after);
}

/* A value of a key and the start of the message it must be refused with. */
struct bad_value {
	const char	*text;
	const char	*after;
};

/* Each value of the key, nested, is refused with its message. */
static void
load_bad_values(const char *key, const struct bad_value *bad, size_t n)
{
	char	text[256];
	size_t	i;

	for (i = 0; i < n; i++)
		load_bad(nest(key, bad[i].text, text, sizeof(text)), bad[i].after);
}

START_TEST(test_good_fixtures_load)
{
	struct config	cfg;
	glob_t		g;
	char		pattern[PATH_MAX], err[CONFIG_ERR_MAX];
	size_t		i;
	int		rc;

	ck_assert_int_eq(glob(src_path("tests/data/good-*.json", pattern, sizeof(pattern)), 0,
	    NULL, &g), 0);
	ck_assert_msg(g.gl_pathc >= 4, "only %zu good fixtures", g.gl_pathc);
	for (i = 0; i < g.gl_pathc; i++) {
		rc = config_load_file(&cfg, g.gl_pathv[i], err, sizeof(err));
		ck_assert_msg(rc == 0, "%s: rc %d: %s", g.gl_pathv[i], rc, err);
	}
	globfree(&g);
}
END_TEST

START_TEST(test_bad_fixture_fails_naming_its_key)
{
	struct config	cfg;
	char		path[PATH_MAX], rel[PATH_MAX], err[CONFIG_ERR_MAX];
	size_t		n;
	int		rc;

	snprintf(rel, sizeof(rel), "tests/data/%s", bad_fixtures[_i].file);
	src_path(rel, path, sizeof(path));
	rc = config_load_file(&cfg, path, err, sizeof(err));
	ck_assert_msg(rc == -EINVAL, "%s: rc %d: %s", path, rc, err);
	n = strlen(path);
	ck_assert_msg(strncmp(err, path, n) == 0, "%s: message does not start with the file: %s",
	    path, err);
	ck_assert_msg(strncmp(err + n, bad_fixtures[_i].after, strlen(bad_fixtures[_i].after)) == 0,
	    "%s: got \"%s\", want \"%s\" after the file name", path, err, bad_fixtures[_i].after);
	if (bad_fixtures[_i].problem != NULL)
		ck_assert_msg(strstr(err + n, bad_fixtures[_i].problem) != NULL,
		    "%s: \"%s\" lacks \"%s\"", path, err, bad_fixtures[_i].problem);
	ck_assert_msg(strchr(err, '\n') == NULL, "%s: message is not one line", path);
}
END_TEST

START_TEST(test_every_bad_fixture_has_an_expected_message)
{
	glob_t		 g;
	char		 pattern[PATH_MAX];
	const char	*base;
	size_t		 i;
	int		 j, found;

	ck_assert_int_eq(glob(src_path("tests/data/bad-*.json", pattern, sizeof(pattern)), 0,
	    NULL, &g), 0);
	ck_assert_msg(g.gl_pathc >= 12, "only %zu bad fixtures", g.gl_pathc);
	for (i = 0; i < g.gl_pathc; i++) {
		base = strrchr(g.gl_pathv[i], '/') + 1;
		for (found = 0, j = 0; j < NBAD && !found; j++)
			found = strcmp(bad_fixtures[j].file, base) == 0;
		ck_assert_msg(found, "%s has no entry in bad_fixtures[]", base);
	}
	ck_assert_msg(g.gl_pathc == (size_t)NBAD, "%zu files, %d table entries", g.gl_pathc,
	    NBAD);
	globfree(&g);
}
END_TEST

START_TEST(test_full_fixture_sets_every_field)
{
	struct config	cfg;
	char		path[PATH_MAX], err[CONFIG_ERR_MAX];

	src_path("tests/data/good-full.json", path, sizeof(path));
	ck_assert_msg(config_load_file(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	assert_config_equal(&cfg, &want_full, "good-full.json");
}
END_TEST

START_TEST(test_defaults_are_the_documented_values)
{
	struct config	cfg;

	config_default(&cfg);
	assert_config_equal(&cfg, &want_defaults, "config_default");
}
END_TEST

START_TEST(test_embedded_default_parses_to_config_default)
{
	struct config	def, cfg;

	config_default(&def);
	load_ok(&cfg, config_default_json());
	assert_config_equal(&cfg, &def, "embedded default");
	/* And {} is the same config: every key is optional. */
	load_ok(&cfg, "{}");
	assert_config_equal(&cfg, &def, "{}");
}
END_TEST

START_TEST(test_shipped_config_equals_defaults_but_socket_path)
{
	struct config	def, cfg;
	char		path[PATH_MAX], err[CONFIG_ERR_MAX];

	src_path("config/l3kvd.json", path, sizeof(path));
	ck_assert_msg(config_load_file(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(cfg.socket_path, "/run/l3kvd/l3kvd.sock");
	config_default(&def);
	memset(def.socket_path, 0, sizeof(def.socket_path));
	memcpy(def.socket_path, cfg.socket_path, strlen(cfg.socket_path));
	assert_config_equal(&cfg, &def, "config/l3kvd.json");
}
END_TEST

START_TEST(test_shipped_config_text_is_the_embedded_text)
{
	const char	*emb = config_default_json(), *from = "\"./run/l3kvd.sock\"";
	const char	*to = "\"/run/l3kvd/l3kvd.sock\"", *at;
	char		 path[PATH_MAX], want[4096], *file;

	at = strstr(emb, from);
	ck_assert_ptr_nonnull(at);
	snprintf(want, sizeof(want), "%.*s%s%s", (int)(at - emb), emb, to, at + strlen(from));
	file = read_text(src_path("config/l3kvd.json", path, sizeof(path)));
	ck_assert_ptr_nonnull(file);
	ck_assert_str_eq(file, want);
	free(file);
}
END_TEST

START_TEST(test_unknown_key_is_rejected_with_its_name)
{
	load_bad("{\"bogus\": 1}", ": bogus: unknown key");
	load_bad("{\"socket\": {\"size\": 1}}", ": socket.size: unknown key");
	load_bad("{\"tiers\": {\"dram\": {\"size\": 2097152, \"x\": 1}}}",
	    ": tiers.dram.x: unknown key");
	load_bad("{\"tiers\": {\"dram.size\": 2097152}}", ": tiers.dram.size: unknown key");
	load_bad("{\"\": 1}", ": : unknown key");
	/* A leaf is not a section, and a section is not a leaf. */
	load_bad("{\"role\": {\"x\": 1}}", ": role: expected a string, got an object");
	load_bad("{\"socket\": 1}", ": socket: expected an object, got integer 1");
	load_bad("{\"socket\": {\"path\": {\"x\": 1}}}",
	    ": socket.path: expected a string, got an object");
}
END_TEST

START_TEST(test_wrong_types_name_what_was_found)
{
	load_bad("{\"model\": 5}", ": model: expected a string, got integer 5");
	load_bad("{\"model\": true}", ": model: expected a string, got true");
	load_bad("{\"model\": false}", ": model: expected a string, got false");
	load_bad("{\"model\": []}", ": model: expected a string, got an array");
	load_bad("{\"lease\": {\"ttl_ms\": \"5000\"}}",
	    ": lease.ttl_ms: expected an integer, got string \"5000\"");
	load_bad("{\"lease\": {\"ttl_ms\": 5e3}}", ": lease.ttl_ms: expected an integer, got real");
	load_bad("{\"log\": {\"level\": 3}}", ": log.level: expected a string, got integer 3");
	load_bad("{\"tiers\": {\"dram\": {\"size\": null}}}",
	    ": tiers.dram.size: expected an integer or a size string, got null");
	load_bad("{\"access\": {\"allow_gids\": {}}}",
	    ": access.allow_gids: expected an array of integers, got an object");
	load_bad("{\"access\": {\"allow_gids\": [[1]]}}",
	    ": access.allow_gids[0]: expected an integer, got an array");
}
END_TEST

START_TEST(test_duplicate_key_names_the_dotted_key)
{
	load_bad("{\"tiers\": {\"dram\": {\"size\": 2097152, \"size\": 2097152}}}",
	    ":1:43: tiers.dram.size: duplicate key");
	load_bad("{\"socket\": {}, \"socket\": {}}", ":1:23: socket: duplicate key");
	/* Strings with brackets and escaped quotes do not confuse the rescan. */
	load_bad("{\"model\": \"a\\\"{[,\", \"model\": \"b\"}", ":1:27: model: duplicate key");
	load_bad("{\"a\": [1, {\"b\": 1, \"b\": 2}]}", ":1:22: a[1].b: duplicate key");
	load_bad("{\"access\": {\"allow_uids\": [1, 99999999999999999999]}}",
	    ":1:50: access.allow_uids[1]: too big integer");
}
END_TEST

START_TEST(test_messages_are_one_printable_line)
{
	struct config	 cfg;
	char		 err[CONFIG_ERR_MAX];
	const char	*texts[] = {
		"{\"a\\u0001\\n\\u007f\": 1}",
		"{\"model\": \"\\n\"}",
		"{\"log\": {\"level\": \"\\t\"}}",
		"{\"x\": \"\x01\"}",
		"{\"model\": \"\\u0001\"}",
	};
	size_t		 i;
	unsigned char	*p;

	for (i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		ck_assert_int_eq(config_load_string(&cfg, texts[i], "t.json", err, sizeof(err)),
		    -EINVAL);
		for (p = (unsigned char *)err; *p != '\0'; p++)
			ck_assert_msg(*p >= 0x20 && *p != 0x7f, "%zu: control byte in \"%s\"", i,
			    err);
	}
	load_bad("{\"model\": \"\\u0001\"}", ": model: \"?\" contains a control character");
}
END_TEST

START_TEST(test_sizes_parse_with_and_without_units)
{
	static const struct {
		const char	*text;
		uint64_t	 bytes;
	} sizes[] = {
		{ "\"64 MiB\"", 64ULL << 20 },
		{ "\"64MiB\"", 64ULL << 20 },
		{ "\"2097152\"", 2ULL << 20 },
		{ "\"2097152 B\"", 2ULL << 20 },
		{ "\"2048 KiB\"", 2ULL << 20 },
		{ "\"1 GiB\"", 1ULL << 30 },
		{ "\"3 GiB\"", 3ULL << 30 },
		{ "\"1 TiB\"", 1ULL << 40 },
		{ "\"0001 TiB\"", 1ULL << 40 },
		{ "67108864", 64ULL << 20 },
	};
	struct config	cfg;
	char		text[256];
	size_t		i;

	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		load_ok(&cfg, nest("tiers.dram.size", sizes[i].text, text, sizeof(text)));
		ck_assert_msg(cfg.dram_size == sizes[i].bytes, "%s: %llu", sizes[i].text,
		    (unsigned long long)cfg.dram_size);
	}
	load_ok(&cfg, "{\"limits\": {\"max_frame\": \"512 KiB\"}}");
	ck_assert_uint_eq(cfg.max_frame, 512U << 10);
}
END_TEST

START_TEST(test_bad_size_strings_are_rejected)
{
	static const struct bad_value	bad[] = {
		{ "\"64 mib\"", ": tiers.dram.size: unknown unit \"mib\"" },
		{ "\"64 MB\"", ": tiers.dram.size: unknown unit \"MB\"" },
		{ "\"64 M\"", ": tiers.dram.size: unknown unit \"M\"" },
		{ "\"64  MiB\"", ": tiers.dram.size: unknown unit \" MiB\"" },
		{ "\"64 MiB \"", ": tiers.dram.size: unknown unit \"MiB \"" },
		{ "\"64 \"", ": tiers.dram.size: unknown unit \"\"" },
		{ "\" 64 MiB\"", ": tiers.dram.size: expected an integer or a size string" },
		{ "\"-1 MiB\"", ": tiers.dram.size: expected an integer or a size string" },
		{ "\"+1 MiB\"", ": tiers.dram.size: expected an integer or a size string" },
		{ "\"\"", ": tiers.dram.size: expected an integer or a size string" },
		{ "\"MiB\"", ": tiers.dram.size: expected an integer or a size string" },
		{ "\"0x10 MiB\"", ": tiers.dram.size: unknown unit \"x10 MiB\"" },
		{ "\"1.5 GiB\"", ": tiers.dram.size: \"1.5 GiB\": fractions" },
		{ "\"1,5 GiB\"", ": tiers.dram.size: \"1,5 GiB\": fractions" },
		{ "\"2 TiB\"", ": tiers.dram.size: \"2 TiB\" is out of range [2 MiB, 1 TiB]" },
		{ "\"16777216 TiB\"", ": tiers.dram.size: \"16777216 TiB\" is out of range" },
		{ "\"18446744073709551616\"",
		    ": tiers.dram.size: \"18446744073709551616\" is out of range" },
		{ "\"2097151 B\"", ": tiers.dram.size: \"2097151 B\" is out of range [2 MiB, 1 TiB]" },
		{ "1.0", ": tiers.dram.size: expected an integer or a size string, got real 1" },
	};

	load_bad_values("tiers.dram.size", bad, sizeof(bad) / sizeof(bad[0]));
}
END_TEST

/* Loading key = num is refused as out of range. */
static void
load_out_of_range(const char *key, const char *num, const char *range)
{
	char	text[256], after[128];

	snprintf(after, sizeof(after), ": %s: %s is out of range %s", key, num, range);
	load_bad(nest(key, num, text, sizeof(text)), after);
}

/* Every integer key: the bounds are accepted, one past them is not. */
START_TEST(test_bounds_are_inclusive)
{
	static const struct {
		const char	*key;
		size_t		 off;
		size_t		 size;
		uint64_t	 lo, hi;
		const char	*range;
	} keys[] = {
#define F(f)	offsetof(struct config, f), sizeof(((struct config *)0)->f)
		{ "namespace.seed", F(namespace_seed), 0, INT64_MAX, "[0, 9223372036854775807]" },
		{ "tiers.dram.size", F(dram_size), 2ULL << 20, 1ULL << 40, "[2 MiB, 1 TiB]" },
		{ "tiers.file.capacity", F(file_capacity), 1ULL << 20, 1ULL << 50,
		    "[1 MiB, 1 PiB]" },
		{ "tiers.file.readers", F(file_readers), 1, 64, "[1, 64]" },
		{ "tiers.file.read_depth", F(file_read_depth), 1, 1024, "[1, 1024]" },
		{ "tiers.file.fd_cache", F(file_fd_cache), 0, 1048576, "[0, 1048576]" },
		{ "copy_workers", F(copy_workers), 1, 64, "[1, 64]" },
		{ "limits.max_connections", F(max_connections), 1, 65536, "[1, 65536]" },
		{ "limits.max_connections_per_uid", F(max_connections_per_uid), 1, 65536,
		    "[1, 65536]" },
		{ "limits.max_frame", F(max_frame), 64 << 10, 64 << 20, "[64 KiB, 64 MiB]" },
		{ "limits.hello_timeout_ms", F(hello_timeout_ms), 10, 600000, "[10, 600000]" },
		{ "limits.attach_timeout_ms", F(attach_timeout_ms), 10, 3600000, "[10, 3600000]" },
		{ "limits.frame_timeout_ms", F(frame_timeout_ms), 10, 600000, "[10, 600000]" },
		{ "limits.max_output", F(max_output), 64 << 10, 1 << 30, "[64 KiB, 1 GiB]" },
		{ "limits.output_timeout_ms", F(output_timeout_ms), 10, 600000, "[10, 600000]" },
		{ "lease.ttl_ms", F(lease_ttl_ms), 100, 3600000, "[100, 3600000]" },
		{ "admit.timeout_ms", F(admit_timeout_ms), 1, 600000, "[1, 600000]" },
		{ "shutdown.drain_ms", F(drain_ms), 0, 600000, "[0, 600000]" },
		{ "testing.copy_delay_ms", F(test_copy_delay_ms), 0, 60000, "[0, 60000]" },
		{ "testing.scan_delay_ms", F(test_scan_delay_ms), 0, 60000, "[0, 60000]" },
#undef F
	};
	struct config	cfg;
	char		text[256], num[32];
	uint64_t	bound[2], got;
	uint32_t	got32;
	size_t		i, b;

	for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		bound[0] = keys[i].lo;
		bound[1] = keys[i].hi;
		for (b = 0; b < 2; b++) {
			snprintf(num, sizeof(num), "%llu", (unsigned long long)bound[b]);
			load_ok(&cfg, nest(keys[i].key, num, text, sizeof(text)));
			if (keys[i].size == sizeof(got32)) {
				memcpy(&got32, (char *)&cfg + keys[i].off, sizeof(got32));
				got = got32;
			} else
				memcpy(&got, (char *)&cfg + keys[i].off, sizeof(got));
			ck_assert_msg(got == bound[b], "%s: %s bound stored as %llu", keys[i].key,
			    b == 0 ? "low" : "high", (unsigned long long)got);
		}

		if (keys[i].lo > 0)
			snprintf(num, sizeof(num), "%llu", (unsigned long long)keys[i].lo - 1);
		else
			snprintf(num, sizeof(num), "-1");
		load_out_of_range(keys[i].key, num, keys[i].range);
		/* INT64_MAX + 1 does not fit jansson's integers: a syntax error. */
		if (keys[i].hi == INT64_MAX)
			continue;
		snprintf(num, sizeof(num), "%llu", (unsigned long long)keys[i].hi + 1);
		load_out_of_range(keys[i].key, num, keys[i].range);
	}
}
END_TEST

START_TEST(test_string_lengths_are_bounded_exactly)
{
	static const struct {
		const char	*key;
		size_t		 max;
		size_t		 min;
	} keys[] = {
		{ "socket.path", CONFIG_PATH_MAX - 1, 1 },
		{ "socket.group", 63, 0 },
		{ "model", 127, 0 },
	};
	struct config	cfg;
	char		value[256], text[512], after[128], err[CONFIG_ERR_MAX];
	size_t		i;

	for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		memset(value, 0, sizeof(value));
		value[0] = '"';
		memset(value + 1, 'a', keys[i].max);
		value[keys[i].max + 1] = '"';
		load_ok(&cfg, nest(keys[i].key, value, text, sizeof(text)));
		value[keys[i].max + 1] = 'a';
		value[keys[i].max + 2] = '"';
		snprintf(after, sizeof(after), ": %s: ", keys[i].key);
		load_bad(nest(keys[i].key, value, text, sizeof(text)), after);
		snprintf(after, sizeof(after), "is %zu bytes long, out of range [%zu, %zu]",
		    keys[i].max + 1, keys[i].min, keys[i].max);
		config_load_string(&cfg, text, "t.json", err, sizeof(err));
		ck_assert_msg(strstr(err, after) != NULL, "%s: %s", keys[i].key, err);
	}
	load_ok(&cfg, "{\"socket\": {\"path\": \"s\"}}");
	ck_assert_str_eq(cfg.socket_path, "s");
	/* 63 bytes of HOST:PORT, then 64. */
	snprintf(value, sizeof(value), "\"%0*d:9100\"", 58, 1);
	load_ok(&cfg, nest("metrics.listen", value, text, sizeof(text)));
	snprintf(value, sizeof(value), "\"%0*d:9100\"", 59, 1);
	load_bad(nest("metrics.listen", value, text, sizeof(text)), ": metrics.listen: ");
}
END_TEST

START_TEST(test_modes_are_octal_strings)
{
	static const struct {
		const char	*text;
		unsigned	 mode;
	} good[] = {
		{ "0660", 0660 }, { "660", 0660 }, { "0", 0 }, { "0777", 0777 }, { "0000600", 0600 },
	};
	static const char *bad[] = { "", "0o660", "0x1b0", " 0660", "0660 ", "-1", "8" };
	struct config	cfg;
	size_t		i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		load_ok_key(&cfg, "socket.mode", good[i].text);
		ck_assert_uint_eq(cfg.socket_mode, good[i].mode);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		load_bad_key("socket.mode", bad[i], ": socket.mode: \"");
	load_bad("{\"socket\": {\"mode\": \"01000\"}}",
	    ": socket.mode: \"01000\" is out of range [0000, 0777]");
	load_bad("{\"socket\": {\"mode\": \"7777777777777777777777777\"}}",
	    ": socket.mode: \"7777777777777777777777777\" is out of range");
}
END_TEST

START_TEST(test_names_map_to_their_values)
{
	static const struct {
		const char	*text;
		int		 level;
	} levels[] = {
		{ "error", LOG_LEVEL_ERROR }, { "warn", LOG_LEVEL_WARN },
		{ "info", LOG_LEVEL_INFO }, { "debug", LOG_LEVEL_DEBUG },
	};
	struct config	cfg;
	size_t		i;

	for (i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
		load_ok_key(&cfg, "log.level", levels[i].text);
		ck_assert_int_eq(cfg.log_level, levels[i].level);
	}
	load_ok(&cfg, "{\"copy_engine\": \"cuda\", \"role\": \"prefill\"}");
	ck_assert_int_eq(cfg.copy_engine, CONFIG_COPY_CUDA);
	ck_assert_str_eq(cfg.role, "prefill");
	load_ok(&cfg, "{\"copy_engine\": \"auto\", \"role\": \"decode\"}");
	ck_assert_int_eq(cfg.copy_engine, CONFIG_COPY_AUTO);
	ck_assert_str_eq(cfg.role, "decode");
	load_bad("{\"log\": {\"level\": \"INFO\"}}", ": log.level: \"INFO\" is not one of");
	load_bad("{\"role\": \"\"}", ": role: \"\" is not one of decode, prefill");
}
END_TEST

START_TEST(test_booleans_are_only_true_or_false)
{
	static const struct bad_value	bad[] = {
		{ "1", ": testing.debug_ops: expected true or false, got integer 1" },
		{ "0", ": testing.debug_ops: expected true or false, got integer 0" },
		{ "\"yes\"", ": testing.debug_ops: expected true or false, got string \"yes\"" },
		{ "\"true\"", ": testing.debug_ops: expected true or false, got string \"true\"" },
		{ "null", ": testing.debug_ops: expected true or false, got null" },
		{ "1.0", ": testing.debug_ops: expected true or false, got real 1" },
		{ "[]", ": testing.debug_ops: expected true or false, got an array" },
		{ "{}", ": testing.debug_ops: expected true or false, got an object" },
	};
	struct config	cfg;

	load_ok(&cfg, "{\"testing\": {\"debug_ops\": true}}");
	ck_assert_int_eq(cfg.test_debug_ops, 1);
	load_ok(&cfg, "{\"testing\": {\"debug_ops\": false}}");
	ck_assert_int_eq(cfg.test_debug_ops, 0);
	load_ok(&cfg, "{\"testing\": {\"copy_delay_ms\": 5}}");
	ck_assert_int_eq(cfg.test_debug_ops, 0);
	load_bad_values("testing.debug_ops", bad, sizeof(bad) / sizeof(bad[0]));
}
END_TEST

#define PEER_OK(m)	"{\"peer\": {\"id\": \"a\", \"listen\": \"127.0.0.1:7400\", " \
	"\"members\": [{\"id\": \"a\", \"addr\": \"127.0.0.1:7400\"}" m "]}}"
START_TEST(test_peer_keys_are_checked_together)
{
	static const struct bad_value	bad_members[] = {
		{ "{}", ": peer.members: expected an array of {\"id\", \"addr\"} objects, got an "
		  "object" },
		{ "[1]", ": peer.members[0]: expected an object, got integer 1" },
		{ "[{\"id\": \"a\"}]", ": peer.members[0].addr: a member needs its HOST:PORT" },
		{ "[{\"addr\": \"h:1\"}]", ": peer.members[0].id: expected a string, got nothing" },
		{ "[{\"id\": \"a b\", \"addr\": \"h:1\"}]",
		  ": peer.members[0].id: \"a b\" is not 1-63 letters" },
		{ "[{\"id\": \"\", \"addr\": \"h:1\"}]", ": peer.members[0].id: \"\" is not 1-63" },
		{ "[{\"id\": \"a\", \"addr\": \"h\"}]",
		  ": peer.members[0].addr: \"h\" is not HOST:PORT" },
		{ "[{\"id\": \"a\", \"addr\": \"h:0\"}]",
		  ": peer.members[0].addr: port 0 is out of range [1, 65535]" },
		{ "[{\"id\": \"a\", \"addr\": \"h:1\", \"x\": 1}]",
		  ": peer.members[0].x: unknown key" },
		{ "[{\"id\": \"a\", \"addr\": \"h:1\"}, {\"id\": \"a\", \"addr\": \"h:2\"}]",
		  ": peer.members[1].id: \"a\" is listed twice" },
	};
	static const struct bad_value	bad_replicas[] = {
		{ "0", ": peer.replicas: 0 is out of range [1, 2]" },
		{ "3", ": peer.replicas: 3 is out of range [1, 2]" },
	};
	static const struct bad_value	bad_stripe[] = {
		{ "0", ": peer.stripe_pages: 0 is out of range [1, 65536]" },
	};
	struct config	cfg;

	load_ok(&cfg, PEER_OK(", {\"id\": \"node-b.2\", \"addr\": \"[::1]:7401\"}"));
	ck_assert_uint_eq(cfg.npeer_members, 2);
	ck_assert_str_eq(cfg.peer_members[1].id, "node-b.2");
	ck_assert_str_eq(cfg.peer_members[1].addr, "[::1]:7401");
	ck_assert_uint_eq(cfg.peer_stripe_pages, 16);
	ck_assert_uint_eq(cfg.peer_replicas, 1);
	ck_assert_str_eq(cfg.peer_provider, "tcp");
	load_bad_values("peer.members", bad_members, sizeof(bad_members) / sizeof(bad_members[0]));
	load_bad_values("peer.replicas", bad_replicas,
	    sizeof(bad_replicas) / sizeof(bad_replicas[0]));
	load_bad_values("peer.stripe_pages", bad_stripe, sizeof(bad_stripe) / sizeof(bad_stripe[0]));
	/* The keys together: an id needs a listener and itself in the list, and the reverse. */
	load_bad("{\"peer\": {\"id\": \"a\", \"members\": [{\"id\": \"a\", \"addr\": \"h:1\"}]}}",
	    ": peer.listen: the peer tier (peer.id \"a\") needs a HOST:PORT");
	load_bad("{\"peer\": {\"id\": \"a\", \"listen\": \"h:1\", \"members\": [{\"id\": \"b\", "
	    "\"addr\": \"h:1\"}]}}", ": peer.members: this daemon's peer.id \"a\" is not in the list");
	load_bad("{\"peer\": {\"listen\": \"h:1\"}}", ": peer.id: the peer tier needs this daemon's id");
	load_bad("{\"peer\": {\"id\": \"a/b\", \"listen\": \"h:1\", \"members\": [{\"id\": \"a\", "
	    "\"addr\": \"h:1\"}]}}", ": peer.id: \"a/b\" is not letters");
}
END_TEST

#define ETCD_OK(extra)	"{\"peer\": {\"id\": \"a\", \"listen\": \"h:1\", \"etcd\": " \
	"{\"endpoint\": \"http://127.0.0.1:2379\"" extra "}}}"

START_TEST(test_peer_etcd_keys)
{
	static const struct bad_value	bad_endpoint[] = {
		{ "\"127.0.0.1:2379\"", ": peer.etcd.endpoint: \"127.0.0.1:2379\" is not http://" },
		{ "\"https://h:1\"", ": peer.etcd.endpoint: \"https://h:1\" is not http://" },
		{ "\"http://h\"", ": peer.etcd.endpoint: \"http://h\" is not http://" },
		{ "\"http://:1\"", ": peer.etcd.endpoint: \"http://:1\" is not http://" },
		{ "\"http://h:1/v3\"", ": peer.etcd.endpoint: \"http://h:1/v3\" is not http://" },
		{ "\"http://h:0\"", ": peer.etcd.endpoint: \"http://h:0\" has no port" },
		{ "\"http://h:70000\"", ": peer.etcd.endpoint: \"http://h:70000\" has no port" },
		{ "\"http://h:x\"", ": peer.etcd.endpoint: \"http://h:x\" has no port" },
		{ "3", ": peer.etcd.endpoint: expected a string" },
	};
	static const struct bad_value	bad_prefix[] = {
		{ "\"l3kv/\"", ": peer.etcd.prefix: \"l3kv/\" does not start with /" },
		{ "\"/a b/\"", ": peer.etcd.prefix: \"/a b/\" does not start with /" },
	};
	static const struct bad_value	bad_ttl[] = {
		{ "1", ": peer.etcd.ttl_s: 1 is out of range [2, 3600]" },
		{ "3601", ": peer.etcd.ttl_s: 3601 is out of range [2, 3600]" },
	};
	struct config	cfg;

	/* With etcd, peer.members may be empty: etcd's view is the list. */
	load_ok(&cfg, ETCD_OK(""));
	ck_assert_str_eq(cfg.peer_etcd_endpoint, "http://127.0.0.1:2379");
	ck_assert_str_eq(cfg.peer_etcd_prefix, "");
	ck_assert_uint_eq(cfg.peer_etcd_ttl_s, 10);
	ck_assert_uint_eq(cfg.npeer_members, 0);
	load_ok(&cfg, ETCD_OK(", \"prefix\": \"/x/decode\", \"ttl_s\": 2"));
	ck_assert_str_eq(cfg.peer_etcd_prefix, "/x/decode");
	ck_assert_uint_eq(cfg.peer_etcd_ttl_s, 2);
	/* A static list given with etcd must still name this daemon. */
	load_bad("{\"peer\": {\"id\": \"a\", \"listen\": \"h:1\", \"members\": [{\"id\": \"b\", "
	    "\"addr\": \"h:1\"}], \"etcd\": {\"endpoint\": \"http://h:1\"}}}",
	    ": peer.members: this daemon's peer.id \"a\" is not in the list");
	/* etcd without an id: the tier is off, so it is refused. */
	load_bad("{\"peer\": {\"etcd\": {\"endpoint\": \"http://h:1\"}}}",
	    ": peer.id: the peer tier needs this daemon's id");
	load_bad_values("peer.etcd.endpoint", bad_endpoint,
	    sizeof(bad_endpoint) / sizeof(bad_endpoint[0]));
	load_bad_values("peer.etcd.prefix", bad_prefix, sizeof(bad_prefix) / sizeof(bad_prefix[0]));
	load_bad_values("peer.etcd.ttl_s", bad_ttl, sizeof(bad_ttl) / sizeof(bad_ttl[0]));
}
END_TEST

START_TEST(test_id_lists_fill_the_arrays)
{
	struct config	cfg;
	char		text[1024];
	size_t		off, i;

	load_ok(&cfg, "{\"access\": {\"allow_uids\": [0, 7, 4294967294], \"allow_gids\": [9]}}");
	ck_assert_uint_eq(cfg.nallow_uids, 3);
	ck_assert_uint_eq(cfg.allow_uids[0], 0);
	ck_assert_uint_eq(cfg.allow_uids[1], 7);
	ck_assert_uint_eq(cfg.allow_uids[2], 4294967294U);
	ck_assert_uint_eq(cfg.nallow_gids, 1);
	ck_assert_uint_eq(cfg.allow_gids[0], 9);

	/* Exactly CONFIG_IDS_MAX entries fit. */
	off = (size_t)snprintf(text, sizeof(text), "{\"access\": {\"allow_gids\": [");
	for (i = 0; i < CONFIG_IDS_MAX; i++)
		off += (size_t)snprintf(text + off, sizeof(text) - off, "%s%zu", i ? ", " : "",
		    i + 100);
	snprintf(text + off, sizeof(text) - off, "]}}");
	load_ok(&cfg, text);
	ck_assert_uint_eq(cfg.nallow_gids, CONFIG_IDS_MAX);
	ck_assert_uint_eq(cfg.allow_gids[CONFIG_IDS_MAX - 1], CONFIG_IDS_MAX - 1 + 100);
	load_bad("{\"access\": {\"allow_gids\": [-1]}}",
	    ": access.allow_gids[0]: -1 is out of range [0, 4294967294]");
}
END_TEST

START_TEST(test_metrics_listen_takes_host_and_port)
{
	static const char *good[] = {
		"", "127.0.0.1:9100", "localhost:1", "[::1]:65535", "[::]:9100",
		"metrics-host.example_1:80",
	};
	static const char *bad[] = {
		":9100", "host:", "host", "[::1]9100", "::1:9100", "[]:80", "[::1:80",
		"a b:1", "host:+80", "host:80a", "host:123456", "host: 80",
	};
	struct config	cfg;
	size_t		i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		load_ok_key(&cfg, "metrics.listen", good[i]);
		ck_assert_str_eq(cfg.metrics_listen, good[i]);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		load_bad_key("metrics.listen", bad[i], ": metrics.listen: ");
	load_bad("{\"metrics\": {\"listen\": \"h:0\"}}",
	    ": metrics.listen: port 0 is out of range [1, 65535]");
	load_bad("{\"metrics\": {\"listen\": \"h:65536\"}}",
	    ": metrics.listen: port 65536 is out of range [1, 65535]");
}
END_TEST

START_TEST(test_env_socket_overrides_path)
{
	struct config	cfg;
	char		err[CONFIG_ERR_MAX];

	config_default(&cfg);
	setenv("L3KV_SOCKET", "/tmp/l3kv-env.sock", 1);
	ck_assert_int_eq(config_apply_env(&cfg, err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.socket_path, "/tmp/l3kv-env.sock");
	unsetenv("L3KV_SOCKET");
}
END_TEST

START_TEST(test_unset_or_empty_env_socket_changes_nothing)
{
	struct config	cfg, def;
	char		err[CONFIG_ERR_MAX];

	config_default(&def);
	config_default(&cfg);
	unsetenv("L3KV_SOCKET");
	ck_assert_int_eq(config_apply_env(&cfg, err, sizeof(err)), 0);
	assert_config_equal(&cfg, &def, "unset");
	setenv("L3KV_SOCKET", "", 1);
	ck_assert_int_eq(config_apply_env(&cfg, err, sizeof(err)), 0);
	assert_config_equal(&cfg, &def, "empty");
	unsetenv("L3KV_SOCKET");
}
END_TEST

START_TEST(test_too_long_env_socket_is_rejected_and_changes_nothing)
{
	struct config	cfg, def;
	char		err[CONFIG_ERR_MAX], path[CONFIG_PATH_MAX + 1];

	memset(path, 'p', sizeof(path) - 1);
	path[sizeof(path) - 1] = '\0';		/* 108 bytes: one too many */
	config_default(&def);
	config_default(&cfg);
	setenv("L3KV_SOCKET", path, 1);
	ck_assert_int_eq(config_apply_env(&cfg, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, "$L3KV_SOCKET: socket.path: ", 27) == 0, "%s", err);
	ck_assert_msg(strstr(err, "is 108 bytes long, out of range [1, 107]") != NULL, "%s", err);
	assert_config_equal(&cfg, &def, "after a refused $L3KV_SOCKET");

	path[sizeof(path) - 2] = '\0';		/* 107 bytes: fits */
	setenv("L3KV_SOCKET", path, 1);
	ck_assert_int_eq(config_apply_env(&cfg, err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.socket_path, path);
	unsetenv("L3KV_SOCKET");
}
END_TEST

/* Small buffers get a truncated, terminated message and nothing past them. */
START_TEST(test_tiny_error_buffers_do_not_overflow)
{
	static const char *texts[] = {
		"{\"tiers\": {\"dram\": {\"size\": 0}}}",
		"{\"socket\": {\"path\": 1,",
		"{\"role\": \"decode\", \"role\": \"decode\"}",
		"[]",
	};
	struct config	cfg;
	char		buf[16];
	size_t		i, len;

	for (i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		ck_assert_int_eq(config_load_string(&cfg, texts[i], "t.json", NULL, 0), -EINVAL);
		memset(buf, 'x', sizeof(buf));
		ck_assert_int_eq(config_load_string(&cfg, texts[i], "t.json", buf, 0), -EINVAL);
		ck_assert_int_eq(buf[0], 'x');
		for (len = 1; len < 10; len++) {
			memset(buf, 'x', sizeof(buf));
			ck_assert_int_eq(config_load_string(&cfg, texts[i], "t.json", buf, len),
			    -EINVAL);
			ck_assert_uint_eq(strlen(buf), len - 1);
			ck_assert_msg(strncmp(buf, "t.json: ", len - 1) == 0 ||
			    strncmp(buf, "t.json:1:", len - 1) == 0, "%zu: %s", len, buf);
			ck_assert_int_eq(buf[len], 'x');
		}
	}
	memset(buf, 'x', sizeof(buf));
	ck_assert_int_eq(config_load_file(&cfg, "/nonexistent/l3kvd.json", buf, 1), -ENOENT);
	ck_assert_int_eq(buf[0], '\0');
	ck_assert_int_eq(buf[1], 'x');
	ck_assert_int_eq(config_load_file(&cfg, "/nonexistent/l3kvd.json", NULL, 0), -ENOENT);
	setenv("L3KV_SOCKET", "/tmp/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 1);
	memset(buf, 'x', sizeof(buf));
	ck_assert_int_eq(config_apply_env(&cfg, buf, 1), -EINVAL);
	ck_assert_int_eq(buf[0], '\0');
	ck_assert_int_eq(buf[1], 'x');
	ck_assert_int_eq(config_apply_env(&cfg, NULL, 0), -EINVAL);
	unsetenv("L3KV_SOCKET");
}
END_TEST

START_TEST(test_unreadable_file_reports_errno)
{
	struct config	 cfg;
	FILE		*f;
	char		 err[CONFIG_ERR_MAX], dir[PATH_MAX], path[PATH_MAX];

	ck_assert_int_eq(config_load_file(&cfg, "/nonexistent/l3kvd.json", err, sizeof(err)),
	    -ENOENT);
	ck_assert_str_eq(err, "/nonexistent/l3kvd.json: cannot read: No such file or directory");
	ck_assert_int_eq(config_load_file(&cfg, "/", err, sizeof(err)), -EISDIR);
	ck_assert_str_eq(err, "/: cannot read: Is a directory");

	/* A huge "file" is refused, not read forever. */
	ck_assert_int_eq(config_load_file(&cfg, "/dev/zero", err, sizeof(err)), -EFBIG);
	ck_assert_msg(strncmp(err, "/dev/zero: cannot read: ", 24) == 0, "%s", err);

	/* A NUL byte in a file is a syntax error, not the end of the text. */
	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	ck_assert((size_t)snprintf(path, sizeof(path), "%s/nul.json", dir) < sizeof(path));
	ck_assert_ptr_nonnull(f = fopen(path, "wb"));
	ck_assert_uint_eq(fwrite("{}\0{", 1, 4, f), 4);
	fclose(f);
	ck_assert_int_eq(config_load_file(&cfg, path, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, path, strlen(path)) == 0 && err[strlen(path)] == ':', "%s",
	    err);
	test_rmtree(dir);
}
END_TEST

START_TEST(test_null_text_and_name_are_handled)
{
	struct config	cfg;
	char		err[CONFIG_ERR_MAX];

	ck_assert_int_eq(config_load_string(&cfg, NULL, "t.json", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "t.json: no text");
	ck_assert_int_eq(config_load_string(&cfg, "[]", NULL, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, "config: (top level)", 19) == 0, "%s", err);
}
END_TEST

/* Runs $L3KV_BUILD/l3kvd with args; collects its exit status, stdout and stderr. */
static void
run_l3kvd(const char *arg_file, int *status, char *out, size_t outlen, char *errbuf,
    size_t errlen)
{
	char	 bin[PATH_MAX], dir[PATH_MAX], opath[PATH_MAX], epath[PATH_MAX], *s;
	pid_t	 pid;
	int	 fd;

	test_path("l3kvd", bin, sizeof(bin));
	ck_assert_msg(access(bin, X_OK) == 0, "%s is missing: build it first (make)", bin);
	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	ck_assert((size_t)snprintf(opath, sizeof(opath), "%s/stdout", dir) < sizeof(opath));
	ck_assert((size_t)snprintf(epath, sizeof(epath), "%s/stderr", dir) < sizeof(epath));
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if ((fd = open(opath, O_WRONLY | O_CREAT | O_TRUNC, 0600)) >= 0)
			dup2(fd, 1);
		if ((fd = open(epath, O_WRONLY | O_CREAT | O_TRUNC, 0600)) >= 0)
			dup2(fd, 2);
		unsetenv("L3KV_SOCKET");
		execl(bin, "l3kvd", "-n", "-f", arg_file, (char *)NULL);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, status, 0), pid);
	s = read_text(opath);
	snprintf(out, outlen, "%s", s != NULL ? s : "");
	free(s);
	s = read_text(epath);
	snprintf(errbuf, errlen, "%s", s != NULL ? s : "");
	free(s);
	test_rmtree(dir);
}

START_TEST(test_l3kvd_n_accepts_a_good_config)
{
	char	path[PATH_MAX], out[1024], err[1024];
	int	status;

	src_path("tests/data/good-full.json", path, sizeof(path));
	run_l3kvd(path, &status, out, sizeof(out), err, sizeof(err));
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x: %s", status,
	    err);
	ck_assert_str_eq(out, "configuration OK\n");
}
END_TEST

START_TEST(test_l3kvd_n_rejects_a_bad_config_naming_the_key)
{
	char	path[PATH_MAX], want[PATH_MAX + 128], out[1024], err[1024];
	int	status;

	src_path("tests/data/bad-range-low.json", path, sizeof(path));
	run_l3kvd(path, &status, out, sizeof(out), err, sizeof(err));
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %#x", status);
	snprintf(want, sizeof(want), "%s: tiers.dram.size: 0 is out of range [2 MiB, 1 TiB]\n",
	    path);
	ck_assert_str_eq(err, want);
	ck_assert_str_eq(out, "");
}
END_TEST

/*
 * A reload (config_reload): a changed live key takes the new value, any
 * other changed key is refused by name and keeps the old one; both come
 * back with their values as the file writes them.
 */
START_TEST(test_reload_applies_live_keys_and_refuses_the_rest)
{
	struct config_change	ch[64];
	struct config		cur, next;
	size_t			n, i;

	ck_assert_uint_ge(64, config_nkeys());
	load_ok(&cur, "{\"lease\": {\"ttl_ms\": 5000}}");
	load_ok(&next, "{\"log\": {\"level\": \"debug\"}, \"socket\": {\"path\": \"/x/y.sock\", "
	    "\"mode\": \"0600\"}, \"limits\": {\"max_output\": \"8 MiB\"}, \"access\": "
	    "{\"allow_uids\": [5, 6]}, \"lease\": {\"ttl_ms\": 5000}, \"tiers\": {\"file\": "
	    "{\"fsync\": true}}}");
	n = config_reload(&cur, &next, ch, 64);
	ck_assert_uint_eq(n, 6);
	/* in table order */
	ck_assert_str_eq(ch[0].key, "socket.path");
	ck_assert_int_eq(ch[0].applied, 0);
	ck_assert_str_eq(ch[0].old, "\"./run/l3kvd.sock\"");
	ck_assert_str_eq(ch[0].new, "\"/x/y.sock\"");
	ck_assert_msg(strstr(ch[0].reason, "restart") != NULL, "%s", ch[0].reason);
	ck_assert_str_eq(ch[1].key, "socket.mode");
	ck_assert_str_eq(ch[1].old, "\"0660\"");
	ck_assert_str_eq(ch[1].new, "\"0600\"");
	ck_assert_int_eq(ch[1].applied, 0);
	ck_assert_str_eq(ch[2].key, "access.allow_uids");
	ck_assert_str_eq(ch[2].old, "[]");
	ck_assert_str_eq(ch[2].new, "[5, 6]");
	ck_assert_int_eq(ch[2].applied, 1);
	ck_assert_str_eq(ch[3].key, "log.level");
	ck_assert_str_eq(ch[3].old, "info");
	ck_assert_str_eq(ch[3].new, "debug");
	ck_assert_int_eq(ch[3].applied, 1);
	ck_assert_str_eq(ch[4].key, "tiers.file.fsync");
	ck_assert_str_eq(ch[4].new, "true");
	ck_assert_int_eq(ch[4].applied, 0);
	ck_assert_str_eq(ch[5].key, "limits.max_output");
	ck_assert_str_eq(ch[5].old, "4 MiB");
	ck_assert_str_eq(ch[5].new, "8 MiB");
	ck_assert_int_eq(ch[5].applied, 1);
	for (i = 0; i < n; i++)
		ck_assert_int_eq(ch[i].applied, config_key_live(ch[i].key));
	/* applied in cur, refused kept */
	ck_assert_int_eq(cur.log_level, LOG_LEVEL_DEBUG);
	ck_assert_uint_eq(cur.max_output, 8U << 20);
	ck_assert_uint_eq(cur.nallow_uids, 2);
	ck_assert_uint_eq(cur.allow_uids[1], 6);
	ck_assert_str_eq(cur.socket_path, "./run/l3kvd.sock");
	ck_assert_uint_eq(cur.socket_mode, 0660);
	ck_assert_int_eq(cur.file_fsync, 0);
	/* the same again: nothing left but the refused keys */
	ck_assert_uint_eq(config_reload(&cur, &next, ch, 64), 3);
	/* a hook that failed puts its key back */
	config_key_restore(&cur, &want_defaults, "log.level");
	ck_assert_int_eq(cur.log_level, LOG_LEVEL_INFO);
	/* out bounds what is reported, never what is compared */
	ck_assert_uint_eq(config_reload(&cur, &next, ch, 1), 1);
	ck_assert_str_eq(ch[0].key, "socket.path");
	ck_assert_int_eq(config_key_live("no.such.key"), -1);
	/* a long id list is cut to fit, and says so */
	load_ok(&next, "{\"access\": {\"allow_gids\": [4000000001, 4000000002, 4000000003, "
	    "4000000004, 4000000005, 4000000006, 4000000007, 4000000008, 4000000009, 4000000010, "
	    "4000000011, 4000000012, 4000000013, 4000000014, 4000000015, 4000000016]}}");
	load_ok(&cur, "{}");
	ck_assert_uint_eq(config_reload(&cur, &next, ch, 64), 1);
	ck_assert_str_eq(ch[0].key, "access.allow_gids");
	ck_assert_uint_eq(strlen(ch[0].new), CONFIG_VALUE_MAX - 1);
	ck_assert_str_eq(ch[0].new + CONFIG_VALUE_MAX - 5, "...]");
	ck_assert_int_eq(strncmp(ch[0].new, "[4000000001, 4000000002, ", 25), 0);
	ck_assert_uint_eq(cur.nallow_gids, 16);
}
END_TEST

/*
 * The live keys are the ones config/README.md ("Reloading") and
 * l3kvd.json(5) (RELOADING) list, no more and no fewer.
 */
START_TEST(test_live_keys_are_the_documented_ones)
{
	char	 path[PATH_MAX], key[128], *readme, *man, *sec, *end, *p, *q;
	int	 nlive = 0, listed = 0, live;

	src_path("config/README.md", path, sizeof(path));
	ck_assert_ptr_nonnull(readme = read_text(path));
	src_path("man/l3kvd.json.5", path, sizeof(path));
	ck_assert_ptr_nonnull(man = read_text(path));
	ck_assert_ptr_nonnull(sec = strstr(readme, "\n## Reloading"));
	ck_assert_ptr_nonnull(end = strstr(sec + 1, "\n## "));
	/* every key of the table: live iff listed as "- `KEY`:" in the section */
	for (p = readme; (p = strstr(p, "\n| `")) != NULL; p = q) {
		p += 4;
		ck_assert_ptr_nonnull(q = strchr(p, '`'));
		snprintf(key, sizeof(key), "%.*s", (int)(q - p), p);
		ck_assert_int_ge(live = config_key_live(key), 0);
		nlive += live;
		snprintf(path, sizeof(path), "\n- `%s`:", key);
		p = strstr(sec, path);
		ck_assert_msg((p != NULL && p < end) == live, "config/README.md: %s is %slive but %s "
		    "under Reloading", key, live ? "" : "not ", live ? "not listed" : "listed");
		/* and in the manual's RELOADING section, as ".It Cm KEY" lines after it */
		snprintf(path, sizeof(path), "\n.It Cm %s\n", key);
		p = strstr(man, "\n.Sh RELOADING");
		ck_assert_ptr_nonnull(p);
		ck_assert_msg((strstr(p, path) != NULL &&
		    (strstr(p + 1, "\n.Sh ") == NULL || strstr(p, path) < strstr(p + 1, "\n.Sh "))) == live,
		    "man/l3kvd.json.5: %s is %slive but %s under RELOADING", key, live ? "" : "not ",
		    live ? "not listed" : "listed");
	}
	for (p = sec; (p = strstr(p, "\n- `")) != NULL && p < end; p++)
		listed++;
	ck_assert_int_eq(listed, nlive);
	ck_assert_int_ge(nlive, 10);
	free(readme);
	free(man);
}
END_TEST

Suite *
suite_config(void)
{
	Suite	*s = suite_create("config");
	TCase	*tc;

	tc = test_tcase(s, "fixtures", 0, NULL, NULL);
	tcase_add_test(tc, test_good_fixtures_load);
	tcase_add_loop_test(tc, test_bad_fixture_fails_naming_its_key, 0, NBAD);
	tcase_add_test(tc, test_every_bad_fixture_has_an_expected_message);
	tcase_add_test(tc, test_full_fixture_sets_every_field);

	tc = test_tcase(s, "defaults", 0, NULL, NULL);
	tcase_add_test(tc, test_defaults_are_the_documented_values);
	tcase_add_test(tc, test_embedded_default_parses_to_config_default);
	tcase_add_test(tc, test_shipped_config_equals_defaults_but_socket_path);
	tcase_add_test(tc, test_shipped_config_text_is_the_embedded_text);

	tc = test_tcase(s, "parse", 0, NULL, NULL);
	tcase_add_test(tc, test_unknown_key_is_rejected_with_its_name);
	tcase_add_test(tc, test_wrong_types_name_what_was_found);
	tcase_add_test(tc, test_duplicate_key_names_the_dotted_key);
	tcase_add_test(tc, test_messages_are_one_printable_line);
	tcase_add_test(tc, test_sizes_parse_with_and_without_units);
	tcase_add_test(tc, test_bad_size_strings_are_rejected);
	tcase_add_test(tc, test_bounds_are_inclusive);
	tcase_add_test(tc, test_string_lengths_are_bounded_exactly);
	tcase_add_test(tc, test_modes_are_octal_strings);
	tcase_add_test(tc, test_names_map_to_their_values);
	tcase_add_test(tc, test_booleans_are_only_true_or_false);
	tcase_add_test(tc, test_id_lists_fill_the_arrays);
	tcase_add_test(tc, test_peer_keys_are_checked_together);
	tcase_add_test(tc, test_peer_etcd_keys);
	tcase_add_test(tc, test_metrics_listen_takes_host_and_port);

	tc = test_tcase(s, "env_and_errors", 0, NULL, NULL);
	tcase_add_test(tc, test_env_socket_overrides_path);
	tcase_add_test(tc, test_unset_or_empty_env_socket_changes_nothing);
	tcase_add_test(tc, test_too_long_env_socket_is_rejected_and_changes_nothing);
	tcase_add_test(tc, test_tiny_error_buffers_do_not_overflow);
	tcase_add_test(tc, test_unreadable_file_reports_errno);
	tcase_add_test(tc, test_null_text_and_name_are_handled);

	tc = test_tcase(s, "l3kvd_n", 0, NULL, NULL);
	tcase_add_test(tc, test_l3kvd_n_accepts_a_good_config);
	tcase_add_test(tc, test_l3kvd_n_rejects_a_bad_config_naming_the_key);
	tcase_add_test(tc, test_reload_applies_live_keys_and_refuses_the_rest);
	tcase_add_test(tc, test_live_keys_are_the_documented_ones);
	return s;
}
