/*
 * The daemon's configuration: a JSON file, read with jansson into a
 * struct config.
 *
 * Every key is one row of config_keys[]: its dotted name, its type, the
 * struct field it fills, its bounds and its default. config_default()
 * and the parser both walk that table, so no key has a parser without a
 * default or a default without bounds. The parser walks the JSON
 * objects: a member is a key of the table, a section (a leading part of
 * some key's dotted name, which must then be an object), or an error.
 *
 * Messages have one shape, "FILE: key: problem", or "FILE:LINE:COLUMN:
 * problem" when jansson could not parse the text; they go into the
 * caller's buffer, truncated to fit, always on one line. A failed load
 * leaves the struct partly filled: callers discard it.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"

/* (uid_t)-1 means "no uid" to chown(2) and friends: never a real one. */
#define CONFIG_ID_MAX		4294967294ULL
/* A config is a few hundred bytes; this only stops a read of /dev/zero. */
#define CONFIG_FILE_MAX		(1U << 20)
/* Deepest nesting the duplicate-key rescan names; ours is 3. */
#define CONFIG_DEPTH_MAX	8
/* Bytes of a user's string quoted back in a message. */
#define CONFIG_QUOTE_MAX	48

_Static_assert(sizeof(uid_t) == sizeof(uint32_t) && sizeof(gid_t) == sizeof(uint32_t),
    "access ids are stored as uint32_t");

enum config_type {
	CONFIG_T_STRING,	/* char array; min and max bound the length */
	CONFIG_T_WORD,		/* char array holding one of names[] */
	CONFIG_T_ENUM,		/* int holding the value of one of names[] */
	CONFIG_T_MODE,		/* unsigned, from an octal string like "0660" */
	CONFIG_T_INT,		/* uint32_t or uint64_t */
	CONFIG_T_SIZE,		/* as INT, or a string with a unit: "64 MiB" */
	CONFIG_T_IDS,		/* uid_t/gid_t array, its size_t count at count_off */
	CONFIG_T_LISTEN,	/* "" or HOST:PORT; max bounds the length */
	CONFIG_T_BOOL,		/* int, 0 or 1, from JSON true or false only */
	CONFIG_T_MEMBERS,	/* peer_member array of {"id", "addr"}, its count at count_off */
};

struct config_name {
	const char	*name;
	int		 value;
};

struct config_key {
	const char		*name;		/* dotted: "tiers.dram.size" */
	enum config_type	 type;
	size_t			 off;		/* of the field in struct config */
	size_t			 size;		/* of the field */
	size_t			 count_off;	/* CONFIG_T_IDS: of the count */
	uint64_t		 min;		/* bound on the value, the length */
	uint64_t		 max;		/* or each element */
	uint64_t		 def;		/* default of MODE, INT, SIZE, BOOL */
	const char		*def_str;	/* default of STRING, WORD, ENUM, LISTEN */
	const struct config_name *names;	/* WORD, ENUM; NULL-terminated */
	int			 flags;
#define CONFIG_F_ASCII	0x1	/* STRING: printable ASCII only */
#define CONFIG_F_SECRET	0x2	/* STRING: never written in a message (a reload's old and new) */
	/*
	 * 1: a reload (SIGHUP, RELOAD) may change it while the daemon runs:
	 * the daemon reads it where it is used, or a reload hook (reload.c)
	 * applies it. 0: it takes effect at a restart; a reload that finds
	 * it changed refuses it, naming it, and keeps the running value.
	 */
	int			 live;
};

/* Where messages go, and the name they start with. */
struct config_ctx {
	const char	*name;
	char		*err;
	size_t		 errlen;
};

static const struct config_name config_log_levels[] = {
	{ "error",	LOG_LEVEL_ERROR },
	{ "warn",	LOG_LEVEL_WARN },
	{ "info",	LOG_LEVEL_INFO },
	{ "debug",	LOG_LEVEL_DEBUG },
	{ NULL,		0 }
};

static const struct config_name config_roles[] = {
	{ "decode",	0 },
	{ "prefill",	0 },
	{ NULL,		0 }
};

static const struct config_name config_copy_engines[] = {
	{ "auto",	CONFIG_COPY_AUTO },
	{ "cuda",	CONFIG_COPY_CUDA },
	{ "host",	CONFIG_COPY_HOST },
	{ NULL,		0 }
};

/* Size units, largest first so that bounds print in the largest that fits. */
static const struct config_unit {
	const char	*name;
	unsigned	 shift;
} config_units[] = {
	{ "PiB",	50 },
	{ "TiB",	40 },
	{ "GiB",	30 },
	{ "MiB",	20 },
	{ "KiB",	10 },
	{ "B",		0 },
};

/* A row's last argument: the key may change at a reload (the live field). */
#define CONFIG_LIVE	.live = 1

#define CONFIG_FIELD(f)							\
	.off = offsetof(struct config, f), .size = sizeof(((struct config *)0)->f)
#define CONFIG_STRING(k, f, lo, hi, d, fl, ...)				\
	{ .name = k, .type = CONFIG_T_STRING, CONFIG_FIELD(f), .min = lo, .max = hi,	\
	  .def_str = d, .flags = fl, __VA_ARGS__ }
#define CONFIG_WORD(k, f, n, d, ...)						\
	{ .name = k, .type = CONFIG_T_WORD, CONFIG_FIELD(f), .names = n, .def_str = d, __VA_ARGS__ }
#define CONFIG_ENUM(k, f, n, d, ...)						\
	{ .name = k, .type = CONFIG_T_ENUM, CONFIG_FIELD(f), .names = n, .def_str = d, __VA_ARGS__ }
#define CONFIG_MODE(k, f, hi, d, ...)					\
	{ .name = k, .type = CONFIG_T_MODE, CONFIG_FIELD(f), .max = hi, .def = d, __VA_ARGS__ }
#define CONFIG_INT(k, f, lo, hi, d, ...)					\
	{ .name = k, .type = CONFIG_T_INT, CONFIG_FIELD(f), .min = lo, .max = hi, .def = d, __VA_ARGS__ }
#define CONFIG_SIZE(k, f, lo, hi, d, ...)					\
	{ .name = k, .type = CONFIG_T_SIZE, CONFIG_FIELD(f), .min = lo, .max = hi, .def = d, __VA_ARGS__ }
#define CONFIG_IDS(k, f, n, hi, ...)						\
	{ .name = k, .type = CONFIG_T_IDS, CONFIG_FIELD(f),		\
	  .count_off = offsetof(struct config, n), .max = hi, __VA_ARGS__ }
#define CONFIG_LISTEN(k, f, hi, d, ...)					\
	{ .name = k, .type = CONFIG_T_LISTEN, CONFIG_FIELD(f), .max = hi, .def_str = d, __VA_ARGS__ }
#define CONFIG_BOOL(k, f, d, ...)						\
	{ .name = k, .type = CONFIG_T_BOOL, CONFIG_FIELD(f), .max = 1, .def = d, __VA_ARGS__ }
#define CONFIG_MEMBERS(k, f, n, ...)					\
	{ .name = k, .type = CONFIG_T_MEMBERS, CONFIG_FIELD(f),		\
	  .count_off = offsetof(struct config, n), __VA_ARGS__ }

/*
 * Every key. A default here must match config_default_json() and
 * config/l3kvd.json (tests/check_config.c compares all three).
 */
static const struct config_key config_keys[] = {
	CONFIG_STRING("socket.path", socket_path, 1, CONFIG_PATH_MAX - 1, "./run/l3kvd.sock", 0),
	CONFIG_MODE("socket.mode", socket_mode, 0777, 0660),
	CONFIG_STRING("socket.group", socket_group, 0, 63, "", 0),
	CONFIG_IDS("access.allow_uids", allow_uids, nallow_uids, CONFIG_ID_MAX, CONFIG_LIVE),
	CONFIG_IDS("access.allow_gids", allow_gids, nallow_gids, CONFIG_ID_MAX, CONFIG_LIVE),
	CONFIG_ENUM("log.level", log_level, config_log_levels, "info", CONFIG_LIVE),
	CONFIG_WORD("role", role, config_roles, "decode"),
	/* ATTACH's layout.model is printable ASCII: nothing else could match. */
	CONFIG_STRING("model", model, 0, PROTO_MODEL_LEN - 1, "", CONFIG_F_ASCII),
	CONFIG_INT("namespace.seed", namespace_seed, 0, INT64_MAX, 0),
	/* The arena is whole 2 MiB units, rounded down (dram.c): at least one. */
	CONFIG_SIZE("tiers.dram.size", dram_size, 2ULL << 20, 1ULL << 40, 256ULL << 20),
	/* The file tier is off until a directory is named. */
	CONFIG_STRING("tiers.file.path", file_path, 0, 255, "", 0),
	CONFIG_SIZE("tiers.file.capacity", file_capacity, 1ULL << 20, 1ULL << 50, 64ULL << 30),
	CONFIG_BOOL("tiers.file.fsync", file_fsync, 0),
	CONFIG_INT("tiers.file.readers", file_readers, 1, 64, 4),
	CONFIG_INT("tiers.file.read_depth", file_read_depth, 1, 1024, 32),
	CONFIG_INT("tiers.file.fd_cache", file_fd_cache, 0, 1048576, 32768),
	CONFIG_ENUM("copy_engine", copy_engine, config_copy_engines, "auto"),
	CONFIG_INT("copy_workers", copy_workers, 1, 64, 2),
	CONFIG_INT("limits.max_connections", max_connections, 1, 65536, 1024, CONFIG_LIVE),
	CONFIG_INT("limits.max_connections_per_uid", max_connections_per_uid, 1, 65536, 256, CONFIG_LIVE),
	CONFIG_INT("limits.max_namespaces", max_namespaces, 1, 65536, 1024),
	CONFIG_SIZE("limits.max_frame", max_frame, PROTO_FRAME_MIN, PROTO_FRAME_MAX, 16U << 20),
	/* Per-connection deadlines and the output bound (conn.c). */
	CONFIG_INT("limits.hello_timeout_ms", hello_timeout_ms, 10, 600000, 5000, CONFIG_LIVE),
	CONFIG_INT("limits.attach_timeout_ms", attach_timeout_ms, 10, 3600000, 60000, CONFIG_LIVE),
	CONFIG_INT("limits.frame_timeout_ms", frame_timeout_ms, 10, 600000, 10000, CONFIG_LIVE),
	CONFIG_SIZE("limits.max_output", max_output, 64U << 10, 1U << 30, 4U << 20, CONFIG_LIVE),
	CONFIG_INT("limits.output_timeout_ms", output_timeout_ms, 10, 600000, 10000, CONFIG_LIVE),
	CONFIG_INT("lease.ttl_ms", lease_ttl_ms, 100, 3600000, 30000, CONFIG_LIVE),
	CONFIG_INT("admit.timeout_ms", admit_timeout_ms, 1, 600000, 2000, CONFIG_LIVE),
	CONFIG_INT("admit.max_waiting", admit_max_waiting, 1, 65536, 128, CONFIG_LIVE),
	CONFIG_INT("shutdown.drain_ms", drain_ms, 0, 600000, 5000, CONFIG_LIVE),
	CONFIG_LISTEN("metrics.listen", metrics_listen, 63, "", CONFIG_LIVE),
	CONFIG_INT("testing.copy_delay_ms", test_copy_delay_ms, 0, 60000, 0),
	CONFIG_INT("testing.scan_delay_ms", test_scan_delay_ms, 0, 60000, 0),
	CONFIG_INT("testing.read_delay_ms", test_read_delay_ms, 0, 60000, 0),
	/* Lets a client destroy cached data: off unless a test asks. */
	CONFIG_BOOL("testing.debug_ops", test_debug_ops, 0),
	CONFIG_INT("testing.peer_pull_delay_ms", test_peer_pull_delay_ms, 0, 60000, 0),
	CONFIG_BOOL("testing.peer_bad_key", test_peer_bad_key, 0),
	CONFIG_STRING("testing.resolv_conf", test_resolv_conf, 0, CONFIG_PATH_MAX - 1, "", 0),
	/* Several cuda copy engines on each GPU, as if they were GPUs (cuda.c). */
	CONFIG_INT("testing.cuda_engines_per_gpu", test_cuda_engines_per_gpu, 1, 8, 1),
	/* The peer tier: off while peer.id is "" (config_check_peer checks the whole). */
	CONFIG_STRING("peer.id", peer_id, 0, PEER_ID_LEN - 1, "", CONFIG_F_ASCII),
	CONFIG_LISTEN("peer.listen", peer_listen, PEER_ADDR_LEN - 1, ""),
	/* Live: peer.c's reload hook gives the new list to peer_members_set. */
	CONFIG_MEMBERS("peer.members", peer_members, npeer_members, CONFIG_LIVE),
	CONFIG_STRING("peer.provider", peer_provider, 1, 31, "tcp", CONFIG_F_ASCII),
	CONFIG_STRING("peer.fabric_addr", peer_fabric_addr, 0, 63, "", CONFIG_F_ASCII),
	CONFIG_INT("peer.lanes", peer_lanes, 1, FABRIC_LANES_MAX, 1),
	CONFIG_INT("peer.stripe_pages", peer_stripe_pages, 1, 65536, 16),
	CONFIG_INT("peer.replicas", peer_replicas, 1, 2, 1),
	CONFIG_STRING("peer.secret", peer_secret, 0, 127, "", CONFIG_F_SECRET),
	CONFIG_INT("peer.timeout_ms", peer_timeout_ms, 1, 600000, 1000),
	CONFIG_INT("peer.pull_timeout_ms", peer_pull_timeout_ms, 10, 600000, 5000),
	CONFIG_INT("peer.lease_max_ms", peer_lease_max_ms, 10, 3600000, 30000),
	CONFIG_INT("peer.ping_ms", peer_ping_ms, 10, 600000, 1000),
	CONFIG_INT("peer.user_timeout_ms", peer_user_timeout_ms, 10, 600000, 5000),
	/* Membership from etcd (etcd.c): read at start only. */
	CONFIG_STRING("peer.etcd.endpoint", peer_etcd_endpoint, 0, 127, "", CONFIG_F_ASCII),
	CONFIG_STRING("peer.etcd.prefix", peer_etcd_prefix, 0, 200, "", CONFIG_F_ASCII),
	CONFIG_INT("peer.etcd.ttl_s", peer_etcd_ttl_s, 2, 3600, 10),
};
#define CONFIG_NKEYS	(sizeof(config_keys) / sizeof(config_keys[0]))

#undef CONFIG_FIELD
#undef CONFIG_STRING
#undef CONFIG_WORD
#undef CONFIG_ENUM
#undef CONFIG_MODE
#undef CONFIG_INT
#undef CONFIG_SIZE
#undef CONFIG_IDS
#undef CONFIG_LISTEN
#undef CONFIG_BOOL
#undef CONFIG_MEMBERS
#undef CONFIG_LIVE

/*
 * The embedded default, for a first run without a file: the text of
 * config/l3kvd.json but for the socket path, which is relative here so
 * that an unprivileged `make run` works.
 */
static const char config_default_text[] =
    "{\n"
    "  \"socket\": {\n"
    "    \"path\": \"./run/l3kvd.sock\",\n"
    "    \"mode\": \"0660\",\n"
    "    \"group\": \"\"\n"
    "  },\n"
    "  \"access\": {\n"
    "    \"allow_uids\": [],\n"
    "    \"allow_gids\": []\n"
    "  },\n"
    "  \"log\": {\n"
    "    \"level\": \"info\"\n"
    "  },\n"
    "  \"role\": \"decode\",\n"
    "  \"model\": \"\",\n"
    "  \"namespace\": {\n"
    "    \"seed\": 0\n"
    "  },\n"
    "  \"tiers\": {\n"
    "    \"dram\": {\n"
    "      \"size\": \"256 MiB\"\n"
    "    },\n"
    "    \"file\": {\n"
    "      \"path\": \"\",\n"
    "      \"capacity\": \"64 GiB\",\n"
    "      \"fsync\": false,\n"
    "      \"readers\": 4,\n"
    "      \"read_depth\": 32,\n"
    "      \"fd_cache\": 32768\n"
    "    }\n"
    "  },\n"
    "  \"copy_engine\": \"auto\",\n"
    "  \"copy_workers\": 2,\n"
    "  \"limits\": {\n"
    "    \"max_connections\": 1024,\n"
    "    \"max_connections_per_uid\": 256,\n"
    "    \"max_namespaces\": 1024,\n"
    "    \"max_frame\": \"16 MiB\",\n"
    "    \"hello_timeout_ms\": 5000,\n"
    "    \"attach_timeout_ms\": 60000,\n"
    "    \"frame_timeout_ms\": 10000,\n"
    "    \"max_output\": \"4 MiB\",\n"
    "    \"output_timeout_ms\": 10000\n"
    "  },\n"
    "  \"lease\": {\n"
    "    \"ttl_ms\": 30000\n"
    "  },\n"
    "  \"admit\": {\n"
    "    \"timeout_ms\": 2000,\n"
    "    \"max_waiting\": 128\n"
    "  },\n"
    "  \"shutdown\": {\n"
    "    \"drain_ms\": 5000\n"
    "  },\n"
    "  \"metrics\": {\n"
    "    \"listen\": \"\"\n"
    "  },\n"
    "  \"testing\": {\n"
    "    \"copy_delay_ms\": 0,\n"
    "    \"scan_delay_ms\": 0,\n"
    "    \"read_delay_ms\": 0,\n"
    "    \"debug_ops\": false,\n"
    "    \"peer_pull_delay_ms\": 0,\n"
    "    \"peer_bad_key\": false,\n"
    "    \"cuda_engines_per_gpu\": 1\n"
    "  },\n"
    "  \"peer\": {\n"
    "    \"id\": \"\",\n"
    "    \"listen\": \"\",\n"
    "    \"members\": [],\n"
    "    \"provider\": \"tcp\",\n"
    "    \"fabric_addr\": \"\",\n"
    "    \"lanes\": 1,\n"
    "    \"stripe_pages\": 16,\n"
    "    \"replicas\": 1,\n"
    "    \"secret\": \"\",\n"
    "    \"timeout_ms\": 1000,\n"
    "    \"pull_timeout_ms\": 5000,\n"
    "    \"lease_max_ms\": 30000,\n"
    "    \"ping_ms\": 1000,\n"
    "    \"user_timeout_ms\": 5000\n"
    "  }\n"
    "}\n";

static void	 config_error(struct config_ctx *, const char *, ...)
		    __attribute__((format(printf, 2, 3)));
static void	 config_error_at(struct config_ctx *, int, int, const char *, ...)
		    __attribute__((format(printf, 4, 5)));

/* Control characters become '?': a message is always one printable line. */
static void
config_sanitize(char *s)
{
	unsigned char	*p;

	for (p = (unsigned char *)s; *p != '\0'; p++)
		if (*p < 0x20 || *p == 0x7f)
			*p = '?';
}

/*
 * Writes "NAME: " (or "NAME:LINE:COLUMN: " where line > 0) and the
 * message into the caller's buffer, if it has one. The user's keys and
 * values and jansson's "near '...'" can carry control characters, hence
 * the sanitizing.
 */
static void
config_verror(struct config_ctx *ctx, int line, int column, const char *fmt, va_list ap)
{
	int	n;

	if (ctx->err == NULL || ctx->errlen == 0)
		return;
	if (line > 0)
		n = snprintf(ctx->err, ctx->errlen, "%s:%d:%d: ", ctx->name, line, column);
	else
		n = snprintf(ctx->err, ctx->errlen, "%s: ", ctx->name);
	if (n >= 0 && (size_t)n < ctx->errlen)
		vsnprintf(ctx->err + n, ctx->errlen - (size_t)n, fmt, ap);
	config_sanitize(ctx->err);
}

static void
config_error(struct config_ctx *ctx, const char *fmt, ...)
{
	va_list	ap;

	va_start(ap, fmt);
	config_verror(ctx, 0, 0, fmt, ap);
	va_end(ap);
}

static void
config_error_at(struct config_ctx *ctx, int line, int column, const char *fmt, ...)
{
	va_list	ap;

	va_start(ap, fmt);
	config_verror(ctx, line, column, fmt, ap);
	va_end(ap);
}

/* s as a double-quoted string, cut at CONFIG_QUOTE_MAX bytes ("..."). */
static const char *
config_quote(const char *s, char *buf, size_t len)
{
	size_t	n = strlen(s);

	if (n <= CONFIG_QUOTE_MAX) {
		snprintf(buf, len, "\"%s\"", s);
		return buf;
	}
	/* Cut on a UTF-8 character boundary. */
	n = CONFIG_QUOTE_MAX;
	while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
		n--;
	snprintf(buf, len, "\"%.*s\"...", (int)n, s);
	return buf;
}

/* What a JSON value is, for "expected X, got Y". */
static const char *
config_describe(const json_t *v, char *buf, size_t len)
{
	char	q[CONFIG_QUOTE_MAX + 8];

	switch (json_typeof(v)) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		snprintf(buf, len, "string %s", config_quote(json_string_value(v), q, sizeof(q)));
		return buf;
	case JSON_INTEGER:
		snprintf(buf, len, "integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
		return buf;
	case JSON_REAL:
		snprintf(buf, len, "real %g", json_real_value(v));
		return buf;
	case JSON_TRUE:
		return "true";
	case JSON_FALSE:
		return "false";
	case JSON_NULL:
		return "null";
	}
	return "something else";
}

static void
config_type_error(struct config_ctx *ctx, const struct config_key *k, const char *expected,
    const json_t *v)
{
	char	buf[CONFIG_QUOTE_MAX + 32];

	config_error(ctx, "%s: expected %s, got %s", k->name, expected,
	    config_describe(v, buf, sizeof(buf)));
}

/* "64 MiB" for exact multiples of a unit, plain bytes otherwise. */
static const char *
config_fmt_size(uint64_t v, char *buf, size_t len)
{
	const struct config_unit	*u;
	size_t				 i;

	for (i = 0; i < sizeof(config_units) / sizeof(config_units[0]); i++) {
		u = &config_units[i];
		if (u->shift > 0 && v >= (1ULL << u->shift) &&
		    v % (1ULL << u->shift) == 0) {
			snprintf(buf, len, "%" PRIu64 " %s", v >> u->shift, u->name);
			return buf;
		}
	}
	snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

/* A bound as the key's type writes it: sizes with units, modes in octal. */
static const char *
config_fmt_bound(const struct config_key *k, uint64_t v, char *buf, size_t len)
{
	if (k->type == CONFIG_T_SIZE)
		return config_fmt_size(v, buf, len);
	if (k->type == CONFIG_T_MODE)
		snprintf(buf, len, "%04" PRIo64, v);
	else
		snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

/* "KEY: SHOWN is out of range [MIN, MAX]"; key may carry an index. */
static int
config_range_error(struct config_ctx *ctx, const struct config_key *k, const char *key,
    const char *shown)
{
	char	lo[32], hi[32];

	config_error(ctx, "%s: %s is out of range [%s, %s]", key, shown,
	    config_fmt_bound(k, k->min, lo, sizeof(lo)),
	    config_fmt_bound(k, k->max, hi, sizeof(hi)));
	return -EINVAL;
}

/* Stores an integer into a uint32_t or uint64_t field; the table bounds it. */
static void
config_store(void *field, size_t size, uint64_t v)
{
	uint32_t	v32;

	if (size == sizeof(uint64_t)) {
		memcpy(field, &v, sizeof(v));
		return;
	}
	assert(size == sizeof(v32) && v <= UINT32_MAX);
	v32 = (uint32_t)v;
	memcpy(field, &v32, sizeof(v32));
}

/* Fills the whole array so that equal configs compare equal byte for byte. */
static void
config_store_string(void *field, size_t size, const char *s, size_t len)
{
	assert(len < size);
	memset(field, 0, size);
	memcpy(field, s, len);
}

static const struct config_name *
config_name_find(const struct config_name *names, const char *s)
{
	for (; names->name != NULL; names++)
		if (strcmp(names->name, s) == 0)
			return names;
	return NULL;
}

static const struct config_key *
config_key_find(const char *name)
{
	size_t	i;

	for (i = 0; i < CONFIG_NKEYS; i++)
		if (strcmp(config_keys[i].name, name) == 0)
			return &config_keys[i];
	return NULL;
}

static int
config_set_string(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const char *s, size_t len)
{
	char	q[CONFIG_QUOTE_MAX + 8];
	size_t	i;

	if (len < k->min || len > k->max) {
		config_error(ctx, "%s: %s is %zu bytes long, out of range [%" PRIu64 ", %"
		    PRIu64 "]", k->name, config_quote(s, q, sizeof(q)), len, k->min, k->max);
		return -EINVAL;
	}
	for (i = 0; i < len; i++) {
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) {
			config_error(ctx, "%s: %s contains a control character", k->name,
			    config_quote(s, q, sizeof(q)));
			return -EINVAL;
		}
		if ((k->flags & CONFIG_F_ASCII) && (unsigned char)s[i] > 0x7e) {
			config_error(ctx, "%s: %s is not printable ASCII", k->name,
			    config_quote(s, q, sizeof(q)));
			return -EINVAL;
		}
	}
	config_store_string((char *)cfg + k->off, k->size, s, len);
	return 0;
}

static int
config_set_name(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	const struct config_name	*n;
	char				 list[128], q[CONFIG_QUOTE_MAX + 8];
	size_t				 off = 0;

	if (!json_is_string(v)) {
		config_type_error(ctx, k, "a string", v);
		return -EINVAL;
	}
	if ((n = config_name_find(k->names, json_string_value(v))) == NULL) {
		list[0] = '\0';
		for (n = k->names; n->name != NULL && off < sizeof(list); n++)
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s",
			    n == k->names ? "" : ", ", n->name);
		config_error(ctx, "%s: %s is not one of %s", k->name,
		    config_quote(json_string_value(v), q, sizeof(q)), list);
		return -EINVAL;
	}
	if (k->type == CONFIG_T_WORD)
		config_store_string((char *)cfg + k->off, k->size, n->name, strlen(n->name));
	else
		memcpy((char *)cfg + k->off, &n->value, sizeof(n->value));
	return 0;
}

/*
 * A mode is a string because JSON has no octal: 0660 written as a number
 * would be 660 decimal, a mode nobody means.
 */
static int
config_set_mode(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	const char	*s, *p;
	char		 q[CONFIG_QUOTE_MAX + 8];
	uint64_t	 mode = 0;

	if (!json_is_string(v)) {
		config_type_error(ctx, k, "an octal string like \"0660\"", v);
		return -EINVAL;
	}
	s = json_string_value(v);
	for (p = s; *p >= '0' && *p <= '7'; p++) {
		/* Stop early: the digits left could overflow. */
		if (mode <= k->max)
			mode = mode * 8 + (uint64_t)(*p - '0');
	}
	if (p == s || *p != '\0') {
		config_error(ctx, "%s: %s is not an octal mode like \"0660\"", k->name,
		    config_quote(s, q, sizeof(q)));
		return -EINVAL;
	}
	if (mode > k->max)
		return config_range_error(ctx, k, k->name, config_quote(s, q, sizeof(q)));
	config_store((char *)cfg + k->off, k->size, mode);
	return 0;
}

/* Checks an integer against the row's bounds; shown is how the user wrote it. */
static int
config_set_uint(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    int negative, uint64_t n, const char *shown)
{
	if (negative || n < k->min || n > k->max)
		return config_range_error(ctx, k, k->name, shown);
	config_store((char *)cfg + k->off, k->size, n);
	return 0;
}

static int
config_set_int(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	json_int_t	i;
	char		shown[32];

	if (!json_is_integer(v)) {
		config_type_error(ctx, k, k->type == CONFIG_T_SIZE ?
		    "an integer or a size string" : "an integer", v);
		return -EINVAL;
	}
	i = json_integer_value(v);
	snprintf(shown, sizeof(shown), "%" JSON_INTEGER_FORMAT, i);
	return config_set_uint(ctx, cfg, k, i < 0, (uint64_t)i, shown);
}

/*
 * A size is an integer number of bytes or a string: digits, at most one
 * space, and one of B, KiB, MiB, GiB, TiB, PiB ("1048576", "64 MiB", "1GiB").
 * Decimal units (MB) are refused rather than guessed at.
 */
static int
config_set_size(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	const struct config_unit	*u = NULL;
	const char			*s, *p;
	char				 q[CONFIG_QUOTE_MAX + 8], uq[CONFIG_QUOTE_MAX + 8];
	uint64_t			 n = 0;
	size_t				 i;
	int				 overflow = 0;

	if (!json_is_string(v))
		return config_set_int(ctx, cfg, k, v);
	s = json_string_value(v);
	if (*s < '0' || *s > '9') {
		config_type_error(ctx, k, "an integer or a size string", v);
		return -EINVAL;
	}
	for (p = s; *p >= '0' && *p <= '9'; p++) {
		if (n > (UINT64_MAX - 9) / 10)
			overflow = 1;
		else
			n = n * 10 + (uint64_t)(*p - '0');
	}
	if (*p == '.' || *p == ',') {
		config_error(ctx, "%s: %s: fractions are not allowed, use a smaller unit",
		    k->name, config_quote(s, q, sizeof(q)));
		return -EINVAL;
	}
	if (*p == '\0')
		u = &config_units[sizeof(config_units) / sizeof(config_units[0]) - 1];
	else {
		if (*p == ' ')
			p++;
		for (i = 0; i < sizeof(config_units) / sizeof(config_units[0]); i++)
			if (strcmp(p, config_units[i].name) == 0)
				u = &config_units[i];
	}
	if (u == NULL) {
		config_error(ctx, "%s: unknown unit %s in %s (use B, KiB, MiB, GiB, TiB or PiB)",
		    k->name, config_quote(p, uq, sizeof(uq)), config_quote(s, q, sizeof(q)));
		return -EINVAL;
	}
	if (overflow || n > (UINT64_MAX >> u->shift))
		return config_range_error(ctx, k, k->name, config_quote(s, q, sizeof(q)));
	return config_set_uint(ctx, cfg, k, 0, n << u->shift, config_quote(s, q, sizeof(q)));
}

static int
config_set_ids(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	size_t		 i, cap = k->size / sizeof(uint32_t);
	json_t		*e;
	json_int_t	 id;
	uint32_t	 id32;
	char		 key[64], shown[32], buf[CONFIG_QUOTE_MAX + 32];

	if (!json_is_array(v)) {
		config_type_error(ctx, k, "an array of integers", v);
		return -EINVAL;
	}
	if (json_array_size(v) > cap) {
		config_error(ctx, "%s: %zu entries, at most %zu are allowed", k->name,
		    json_array_size(v), cap);
		return -EINVAL;
	}
	json_array_foreach(v, i, e) {
		snprintf(key, sizeof(key), "%s[%zu]", k->name, i);
		if (!json_is_integer(e)) {
			config_error(ctx, "%s: expected an integer, got %s", key,
			    config_describe(e, buf, sizeof(buf)));
			return -EINVAL;
		}
		id = json_integer_value(e);
		if (id < 0 || (uint64_t)id > k->max) {
			snprintf(shown, sizeof(shown), "%" JSON_INTEGER_FORMAT, id);
			return config_range_error(ctx, k, key, shown);
		}
		id32 = (uint32_t)id;
		memcpy((char *)cfg + k->off + i * sizeof(id32), &id32, sizeof(id32));
	}
	i = json_array_size(v);
	memcpy((char *)cfg + k->count_off, &i, sizeof(i));
	return 0;
}

/* "" (off), or HOST:PORT where HOST is a name, an IPv4 address or [IPv6]. */
static int
config_set_listen(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	const char	*s, *colon, *p;
	char		 q[CONFIG_QUOTE_MAX + 8];
	size_t		 len;
	unsigned long	 port = 0;
	int		 ok;

	if (!json_is_string(v)) {
		config_type_error(ctx, k, "a string", v);
		return -EINVAL;
	}
	s = json_string_value(v);
	len = json_string_length(v);
	if (len == 0 || len > k->max)
		return config_set_string(ctx, cfg, k, s, len);

	ok = (colon = strrchr(s, ':')) != NULL && colon > s;
	if (ok && s[0] == '[') {
		ok = colon - s >= 3 && colon[-1] == ']';
		for (p = s + 1; ok && p < colon - 1; p++)
			ok = (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
			    (*p >= 'A' && *p <= 'F') || *p == ':' || *p == '.';
	} else {
		for (p = s; ok && p < colon; p++)
			ok = (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
			    (*p >= 'A' && *p <= 'Z') || *p == '.' || *p == '-' || *p == '_';
	}
	/* At most 5 digits, so that the value cannot overflow. */
	for (p = ok ? colon + 1 : s; ok && *p != '\0'; p++) {
		if (!(ok = *p >= '0' && *p <= '9' && p - colon <= 5))
			break;
		port = port * 10 + (unsigned long)(*p - '0');
	}
	if (!ok || colon[1] == '\0') {
		config_error(ctx, "%s: %s is not HOST:PORT (like \"127.0.0.1:9100\")", k->name,
		    config_quote(s, q, sizeof(q)));
		return -EINVAL;
	}
	if (port < 1 || port > 65535) {
		config_error(ctx, "%s: port %lu is out of range [1, 65535]", k->name, port);
		return -EINVAL;
	}
	return config_set_string(ctx, cfg, k, s, len);
}

/*
 * peer.members: [{"id": "node-a", "addr": "10.0.0.1:7400"}, ...]. An id
 * is 1-63 bytes of letters, digits, '.', '-' and '_'; an address is
 * HOST:PORT as peer.listen takes it; ids are unique.
 */
static int
config_set_members(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	struct peer_member	*m = (struct peer_member *)(void *)((char *)cfg + k->off);
	const struct config_key	*lk = config_key_find("peer.listen");
	struct config_key	 ak;
	struct config		 tmp;
	const char		*key, *id;
	json_t			*e, *f;
	size_t			 i, j, n;
	char			 name[64], buf[CONFIG_QUOTE_MAX + 32], q[CONFIG_QUOTE_MAX + 8];

	if (!json_is_array(v)) {
		config_type_error(ctx, k, "an array of {\"id\", \"addr\"} objects", v);
		return -EINVAL;
	}
	if ((n = json_array_size(v)) > CONFIG_PEERS_MAX) {
		config_error(ctx, "%s: %zu entries, at most %u are allowed", k->name, n,
		    CONFIG_PEERS_MAX);
		return -EINVAL;
	}
	memset(m, 0, k->size);
	json_array_foreach(v, i, e) {
		if (!json_is_object(e)) {
			config_error(ctx, "%s[%zu]: expected an object, got %s", k->name, i,
			    config_describe(e, buf, sizeof(buf)));
			return -EINVAL;
		}
		json_object_foreach(e, key, f) {
			if (strcmp(key, "id") != 0 && strcmp(key, "addr") != 0) {
				config_error(ctx, "%s[%zu].%s: unknown key (an entry has \"id\" and "
				    "\"addr\")", k->name, i, key);
				return -EINVAL;
			}
		}
		f = json_object_get(e, "id");
		if (f == NULL || !json_is_string(f)) {
			config_error(ctx, "%s[%zu].id: expected a string, got %s", k->name, i,
			    f == NULL ? "nothing" : config_describe(f, buf, sizeof(buf)));
			return -EINVAL;
		}
		id = json_string_value(f);
		for (j = 0; id[j] != '\0'; j++)
			if (!((id[j] >= '0' && id[j] <= '9') || (id[j] >= 'a' && id[j] <= 'z') ||
			    (id[j] >= 'A' && id[j] <= 'Z') || id[j] == '.' || id[j] == '-' ||
			    id[j] == '_'))
				break;
		if (j == 0 || id[j] != '\0' || j != json_string_length(f) || j >= PEER_ID_LEN) {
			config_error(ctx, "%s[%zu].id: %s is not 1-%u letters, digits, '.', '-' or "
			    "'_'", k->name, i, config_quote(id, q, sizeof(q)), PEER_ID_LEN - 1);
			return -EINVAL;
		}
		for (j = 0; j < i; j++)
			if (strcmp(m[j].id, id) == 0) {
				config_error(ctx, "%s[%zu].id: %s is listed twice", k->name, i,
				    config_quote(id, q, sizeof(q)));
				return -EINVAL;
			}
		snprintf(m[i].id, sizeof(m[i].id), "%s", id);
		f = json_object_get(e, "addr");
		snprintf(name, sizeof(name), "%s[%zu].addr", k->name, i);
		if (f == NULL || (json_is_string(f) && json_string_length(f) == 0)) {
			config_error(ctx, "%s: a member needs its HOST:PORT", name);
			return -EINVAL;
		}
		/* peer.listen's rules, under this entry's name. */
		ak = *lk;
		ak.name = name;
		if (config_set_listen(ctx, &tmp, &ak, f) != 0)
			return -EINVAL;
		memcpy(m[i].addr, (char *)&tmp + lk->off, sizeof(m[i].addr));
	}
	memcpy((char *)cfg + k->count_off, &n, sizeof(n));
	return 0;
}

/* Only JSON true and false: 1, "yes" or null would be a guess. */
static int
config_set_bool(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	int	b;

	if (!json_is_boolean(v)) {
		config_type_error(ctx, k, "true or false", v);
		return -EINVAL;
	}
	b = json_is_true(v);
	assert(k->size == sizeof(b));
	memcpy((char *)cfg + k->off, &b, sizeof(b));
	return 0;
}

static int
config_set(struct config_ctx *ctx, struct config *cfg, const struct config_key *k,
    const json_t *v)
{
	switch (k->type) {
	case CONFIG_T_STRING:
		if (!json_is_string(v)) {
			config_type_error(ctx, k, "a string", v);
			return -EINVAL;
		}
		return config_set_string(ctx, cfg, k, json_string_value(v),
		    json_string_length(v));
	case CONFIG_T_WORD:
	case CONFIG_T_ENUM:
		return config_set_name(ctx, cfg, k, v);
	case CONFIG_T_MODE:
		return config_set_mode(ctx, cfg, k, v);
	case CONFIG_T_INT:
		return config_set_int(ctx, cfg, k, v);
	case CONFIG_T_SIZE:
		return config_set_size(ctx, cfg, k, v);
	case CONFIG_T_IDS:
		return config_set_ids(ctx, cfg, k, v);
	case CONFIG_T_LISTEN:
		return config_set_listen(ctx, cfg, k, v);
	case CONFIG_T_BOOL:
		return config_set_bool(ctx, cfg, k, v);
	case CONFIG_T_MEMBERS:
		return config_set_members(ctx, cfg, k, v);
	}
	assert(!"unknown config type");
	return -EINVAL;
}

/*
 * The row named prefix.key, or if none, the first row under prefix.key.
 * (*section says which.) prefix is the first plen bytes of a row's name,
 * or empty at the top level.
 */
static const struct config_key *
config_match(const char *prefix, size_t plen, const char *key, int *section)
{
	const char	*n;
	size_t		 i, klen = strlen(key);

	for (i = 0; i < CONFIG_NKEYS; i++) {
		n = config_keys[i].name;
		if (plen > 0) {
			if (strncmp(n, prefix, plen) != 0 || n[plen] != '.')
				continue;
			n += plen + 1;
		}
		if (strncmp(n, key, klen) != 0)
			continue;
		if (n[klen] == '\0' || n[klen] == '.') {
			*section = n[klen] == '.';
			return &config_keys[i];
		}
	}
	return NULL;
}

/* Applies the members of one object, in file order; prefix names it. */
static int
config_walk(struct config_ctx *ctx, struct config *cfg, json_t *obj, const char *prefix,
    size_t plen)
{
	const struct config_key	*k;
	const char		*key;
	json_t			*v;
	char			 buf[CONFIG_QUOTE_MAX + 32];
	int			 section, rc;

	json_object_foreach(obj, key, v) {
		/*
		 * A dotted member would otherwise match a row through the
		 * back door: {"tiers": {"dram.size": 1}}.
		 */
		if (*key == '\0' || strchr(key, '.') != NULL ||
		    (k = config_match(prefix, plen, key, &section)) == NULL) {
			config_error(ctx, "%.*s%s%s: unknown key%s", (int)plen, prefix,
			    plen > 0 ? "." : "", key, strchr(key, '.') != NULL ?
			    " (sections are nested objects, not dotted names)" : "");
			return -EINVAL;
		}
		if (!section) {
			if ((rc = config_set(ctx, cfg, k, v)) != 0)
				return rc;
			continue;
		}
		if (!json_is_object(v)) {
			config_error(ctx, "%.*s%s%s: expected an object, got %s", (int)plen,
			    prefix, plen > 0 ? "." : "", key, config_describe(v, buf, sizeof(buf)));
			return -EINVAL;
		}
		rc = config_walk(ctx, cfg, v, k->name, (plen > 0 ? plen + 1 : 0) + strlen(key));
		if (rc != 0)
			return rc;
	}
	return 0;
}

/*
 * jansson reports a duplicate key or an integer too big for it with the
 * position just past the token, but without the token's path. Rescan the
 * text up to there (jansson has read it, so it is well formed) to name
 * the member as every other message does: "socket.path", or
 * "access.allow_uids[3]". Returns 0, or -1 where it cannot be named.
 */
static int
config_path_at(const char *text, size_t pos, char *buf, size_t len)
{
	struct {
		const char	*key;
		size_t		 klen;
		size_t		 idx;
		int		 array;
	}		 st[CONFIG_DEPTH_MAX];
	const char	*p, *end = text + pos, *str;
	size_t		 depth = 0, i, off = 0;
	int		 prev = 0;	/* last structural character or 's' for a string */

	for (p = text; p < end; p++) {
		switch (*p) {
		case '{':
		case '[':
			if (depth < CONFIG_DEPTH_MAX) {
				st[depth].key = NULL;
				st[depth].klen = 0;
				st[depth].idx = 0;
				st[depth].array = *p == '[';
			}
			depth++;
			prev = *p;
			break;
		case '}':
		case ']':
			if (depth == 0)
				return -1;
			depth--;
			prev = 'v';
			break;
		case ',':
			if (depth > 0 && depth <= CONFIG_DEPTH_MAX && st[depth - 1].array)
				st[depth - 1].idx++;
			prev = ',';
			break;
		case ':':
			prev = ':';
			break;
		case '"':
			str = ++p;
			for (; p < end && *p != '"'; p++)
				if (*p == '\\' && p + 1 < end)
					p++;
			if (p >= end)
				return -1;
			if (depth > 0 && depth <= CONFIG_DEPTH_MAX && !st[depth - 1].array &&
			    (prev == '{' || prev == ',')) {
				st[depth - 1].key = str;
				st[depth - 1].klen = (size_t)(p - str);
			}
			prev = 's';
			break;
		case ' ':
		case '\t':
		case '\n':
		case '\r':
			break;
		default:
			prev = 'v';
			break;
		}
	}
	if (depth == 0 || depth > CONFIG_DEPTH_MAX)
		return -1;
	buf[0] = '\0';
	for (i = 0; i < depth && off < len; i++) {
		if (st[i].array)
			off += (size_t)snprintf(buf + off, len - off, "[%zu]", st[i].idx);
		else if (st[i].key != NULL)
			off += (size_t)snprintf(buf + off, len - off, "%s%.*s",
			    off > 0 ? "." : "", (int)st[i].klen, st[i].key);
		else
			return -1;
	}
	return 0;
}

/* "FILE:LINE:COLUMN: problem" for text jansson could not parse. */
static int
config_syntax_error(struct config_ctx *ctx, const char *text, size_t len,
    const json_error_t *jerr)
{
	char	path[256];
	size_t	pos;

	if (json_error_code(jerr) == json_error_out_of_memory) {
		config_error(ctx, "out of memory");
		return -ENOMEM;
	}
	pos = jerr->position < 0 ? 0 : (size_t)jerr->position;
	if (pos > len)
		pos = len;
	switch (json_error_code(jerr)) {
	case json_error_duplicate_key:
		if (config_path_at(text, pos, path, sizeof(path)) == 0) {
			config_error_at(ctx, jerr->line, jerr->column, "%s: duplicate key", path);
			return -EINVAL;
		}
		break;
	case json_error_numeric_overflow:
		if (config_path_at(text, pos, path, sizeof(path)) == 0) {
			config_error_at(ctx, jerr->line, jerr->column, "%s: %s", path, jerr->text);
			return -EINVAL;
		}
		break;
	default:
		break;
	}
	config_error_at(ctx, jerr->line, jerr->column, "%s", jerr->text);
	return -EINVAL;
}

/*
 * peer.etcd.endpoint: "" or http://HOST:PORT (etcd's v3 JSON gateway);
 * peer.etcd.prefix: "" (/l3kv/ROLE/) or a key prefix starting with '/'.
 */
static int
config_check_etcd(struct config_ctx *ctx, const struct config *cfg)
{
	const char	*e = cfg->peer_etcd_endpoint, *h, *colon;
	char		*end;
	unsigned long	 port;

	if (e[0] != '\0') {
		h = e + 7;
		if (strncmp(e, "http://", 7) != 0 || (colon = strrchr(h, ':')) == NULL ||
		    colon == h || strchr(h, '/') != NULL || strchr(h, ' ') != NULL) {
			config_error(ctx, "peer.etcd.endpoint: \"%s\" is not http://HOST:PORT", e);
			return -EINVAL;
		}
		errno = 0;
		port = strtoul(colon + 1, &end, 10);
		if (errno != 0 || colon[1] < '0' || colon[1] > '9' || *end != '\0' || port == 0 ||
		    port > 65535) {
			config_error(ctx, "peer.etcd.endpoint: \"%s\" has no port in 1..65535", e);
			return -EINVAL;
		}
	}
	if (cfg->peer_etcd_prefix[0] != '\0' && (cfg->peer_etcd_prefix[0] != '/' ||
	    strchr(cfg->peer_etcd_prefix, ' ') != NULL)) {
		config_error(ctx, "peer.etcd.prefix: \"%s\" does not start with / (or has a space)",
		    cfg->peer_etcd_prefix);
		return -EINVAL;
	}
	return 0;
}

/*
 * The peer keys together: with peer.id set, the daemon listens
 * (peer.listen) and is itself in peer.members under that id and address;
 * without it, no other peer key may ask for the tier.
 */
static int
config_check_peer(struct config_ctx *ctx, const struct config *cfg)
{
	size_t	i;

	if (config_check_etcd(ctx, cfg) != 0)
		return -EINVAL;
	if (cfg->peer_id[0] == '\0') {
		if (cfg->npeer_members > 0 || cfg->peer_listen[0] != '\0' ||
		    cfg->peer_etcd_endpoint[0] != '\0') {
			config_error(ctx, "peer.id: the peer tier needs this daemon's id (peer.members, "
			    "peer.listen or peer.etcd.endpoint is set)");
			return -EINVAL;
		}
		return 0;
	}
	for (i = 0; i < strlen(cfg->peer_id); i++)
		if (!((cfg->peer_id[i] >= '0' && cfg->peer_id[i] <= '9') ||
		    (cfg->peer_id[i] >= 'a' && cfg->peer_id[i] <= 'z') ||
		    (cfg->peer_id[i] >= 'A' && cfg->peer_id[i] <= 'Z') || cfg->peer_id[i] == '.' ||
		    cfg->peer_id[i] == '-' || cfg->peer_id[i] == '_')) {
			config_error(ctx, "peer.id: \"%s\" is not letters, digits, '.', '-' or '_'",
			    cfg->peer_id);
			return -EINVAL;
		}
	if (cfg->peer_listen[0] == '\0') {
		config_error(ctx, "peer.listen: the peer tier (peer.id \"%s\") needs a HOST:PORT",
		    cfg->peer_id);
		return -EINVAL;
	}
	/* With etcd, the static list is optional (the view until etcd answers). */
	if (cfg->npeer_members == 0 && cfg->peer_etcd_endpoint[0] != '\0')
		return 0;
	for (i = 0; i < cfg->npeer_members; i++)
		if (strcmp(cfg->peer_members[i].id, cfg->peer_id) == 0)
			break;
	if (i == cfg->npeer_members) {
		config_error(ctx, "peer.members: this daemon's peer.id \"%s\" is not in the list",
		    cfg->peer_id);
		return -EINVAL;
	}
	return 0;
}

/* Loads len bytes of text; the common part of the two loaders. */
static int
config_load_buffer(struct config *cfg, const char *text, size_t len, const char *name,
    char *err, size_t errlen)
{
	struct config_ctx	 ctx = { name != NULL ? name : "config", err, errlen };
	json_t			*root;
	json_error_t		 jerr;
	char			 buf[CONFIG_QUOTE_MAX + 32];
	int			 rc;

	config_default(cfg);
	if (err != NULL && errlen > 0)
		err[0] = '\0';
	/* DECODE_ANY so that "42" gets our message rather than jansson's. */
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	if (root == NULL)
		return config_syntax_error(&ctx, text, len, &jerr);
	if (!json_is_object(root)) {
		config_error(&ctx, "(top level): expected an object, got %s",
		    config_describe(root, buf, sizeof(buf)));
		json_decref(root);
		return -EINVAL;
	}
	rc = config_walk(&ctx, cfg, root, "", 0);
	json_decref(root);
	if (rc == 0)
		rc = config_check_peer(&ctx, cfg);
	return rc;
}

void
config_default(struct config *cfg)
{
	const struct config_key		*k;
	const struct config_name	*n;
	size_t				 i;
	int				 b;

	memset(cfg, 0, sizeof(*cfg));
	for (i = 0; i < CONFIG_NKEYS; i++) {
		k = &config_keys[i];
		switch (k->type) {
		case CONFIG_T_STRING:
		case CONFIG_T_LISTEN:
			config_store_string((char *)cfg + k->off, k->size, k->def_str,
			    strlen(k->def_str));
			break;
		case CONFIG_T_WORD:
		case CONFIG_T_ENUM:
			n = config_name_find(k->names, k->def_str);
			assert(n != NULL);
			if (k->type == CONFIG_T_WORD)
				config_store_string((char *)cfg + k->off, k->size, n->name,
				    strlen(n->name));
			else
				memcpy((char *)cfg + k->off, &n->value, sizeof(n->value));
			break;
		case CONFIG_T_MODE:
		case CONFIG_T_INT:
		case CONFIG_T_SIZE:
			assert(k->def >= k->min && k->def <= k->max);
			config_store((char *)cfg + k->off, k->size, k->def);
			break;
		case CONFIG_T_IDS:
		case CONFIG_T_MEMBERS:
			break;		/* empty: the memset */
		case CONFIG_T_BOOL:
			b = k->def != 0;
			assert(k->size == sizeof(b));
			memcpy((char *)cfg + k->off, &b, sizeof(b));
			break;
		}
	}
}

/*
 * Parses text as a whole config over the defaults. name starts every
 * message. Returns 0, -EINVAL (err says why) or -ENOMEM.
 */
int
config_load_string(struct config *cfg, const char *text, const char *name, char *err,
    size_t errlen)
{
	struct config_ctx	ctx = { name != NULL ? name : "config", err, errlen };

	if (text == NULL) {
		config_default(cfg);
		config_error(&ctx, "no text");
		return -EINVAL;
	}
	return config_load_buffer(cfg, text, strlen(text), name, err, errlen);
}

/* Reads a whole file of at most CONFIG_FILE_MAX bytes into a new buffer. */
static int
config_read(const char *path, char **out, size_t *outlen)
{
	char	*buf = NULL, *nbuf;
	size_t	 len = 0, cap = 0;
	ssize_t	 n;
	int	 fd, rc;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) == -1)
		return -errno;
	for (;;) {
		if (len == cap) {
			if (cap > CONFIG_FILE_MAX) {
				rc = -EFBIG;
				goto fail;
			}
			cap = cap == 0 ? 4096 : cap * 2;
			if ((nbuf = realloc(buf, cap)) == NULL) {
				rc = -ENOMEM;
				goto fail;
			}
			buf = nbuf;
		}
		n = read(fd, buf + len, cap - len);
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1) {
			rc = -errno;
			goto fail;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	if (len > CONFIG_FILE_MAX) {
		rc = -EFBIG;
		goto fail;
	}
	close(fd);
	*out = buf;
	*outlen = len;
	return 0;

fail:
	free(buf);
	close(fd);
	return rc;
}

/*
 * Loads the file at path; messages start with path. Returns 0, -EINVAL
 * for a bad config, or the -errno of a file that cannot be read.
 */
int
config_load_file(struct config *cfg, const char *path, char *err, size_t errlen)
{
	struct config_ctx	 ctx = { path, err, errlen };
	char			*text = NULL;
	size_t			 len = 0;
	int			 rc;

	if ((rc = config_read(path, &text, &len)) != 0) {
		config_default(cfg);
		if (rc == -EFBIG)
			config_error(&ctx, "cannot read: larger than %u bytes", CONFIG_FILE_MAX);
		else
			config_error(&ctx, "cannot read: %s", strerror(-rc));
		return rc;
	}
	rc = config_load_buffer(cfg, text, len, path, err, errlen);
	free(text);
	return rc;
}

/*
 * A non-empty $L3KV_SOCKET replaces socket.path, within the same bounds.
 * Returns 0 or -EINVAL; on error cfg is unchanged.
 */
int
config_apply_env(struct config *cfg, char *err, size_t errlen)
{
	struct config_ctx	 ctx = { "$L3KV_SOCKET", err, errlen };
	const struct config_key	*k;
	const char		*s;

	if ((s = getenv("L3KV_SOCKET")) == NULL || *s == '\0')
		return 0;
	k = config_key_find("socket.path");
	assert(k != NULL);
	return config_set_string(&ctx, cfg, k, s, strlen(s));
}

const char *
config_default_json(void)
{
	return config_default_text;
}

/*
 * A key's value as the file would write it, into buf: strings quoted,
 * names and numbers bare, sizes with their unit, modes in octal, id
 * lists in brackets (cut with "..." where they do not fit).
 */
static const char *
config_value_text(const struct config_key *k, const struct config *cfg, char *buf, size_t len)
{
	const char			*field = (const char *)cfg + k->off;
	const struct config_name	*n;
	char				 q[CONFIG_QUOTE_MAX + 8];
	uint64_t			 v = 0;
	uint32_t			 v32, id;
	size_t				 i, count, off;
	int				 iv;

	switch (k->type) {
	case CONFIG_T_STRING:
	case CONFIG_T_WORD:
	case CONFIG_T_LISTEN:
		snprintf(buf, len, "%s", k->flags & CONFIG_F_SECRET ? "(secret)" :
		    config_quote(field, q, sizeof(q)));
		break;
	case CONFIG_T_ENUM:
		memcpy(&iv, field, sizeof(iv));
		for (n = k->names; n->name != NULL && n->value != iv; n++)
			;
		snprintf(buf, len, "%s", n->name != NULL ? n->name : "?");
		break;
	case CONFIG_T_BOOL:
		memcpy(&iv, field, sizeof(iv));
		snprintf(buf, len, "%s", iv ? "true" : "false");
		break;
	case CONFIG_T_MODE:
	case CONFIG_T_INT:
	case CONFIG_T_SIZE:
		if (k->size == sizeof(uint64_t))
			memcpy(&v, field, sizeof(v));
		else {
			memcpy(&v32, field, sizeof(v32));
			v = v32;
		}
		if (k->type == CONFIG_T_MODE)
			snprintf(buf, len, "\"%04" PRIo64 "\"", v);
		else
			config_fmt_bound(k, v, buf, len);
		break;
	case CONFIG_T_IDS:
		memcpy(&count, (const char *)cfg + k->count_off, sizeof(count));
		off = (size_t)snprintf(buf, len, "[");
		for (i = 0; i < count && off < len; i++) {
			memcpy(&id, field + i * sizeof(id), sizeof(id));
			off += (size_t)snprintf(buf + off, len - off, "%s%" PRIu32, i > 0 ? ", " : "",
			    id);
		}
		if (off + 2 > len && len > 5)
			snprintf(buf + len - 5, 5, "...]");
		else if (off < len)
			snprintf(buf + off, len - off, "]");
		break;
	case CONFIG_T_MEMBERS: {
		const struct peer_member *m = (const struct peer_member *)(const void *)field;

		memcpy(&count, (const char *)cfg + k->count_off, sizeof(count));
		off = (size_t)snprintf(buf, len, "[");
		for (i = 0; i < count && off < len; i++)
			off += (size_t)snprintf(buf + off, len - off, "%s%s@%s", i > 0 ? ", " : "",
			    m[i].id, m[i].addr);
		if (off + 2 > len && len > 5)
			snprintf(buf + len - 5, 5, "...]");
		else if (off < len)
			snprintf(buf + off, len - off, "]");
		break;
	}
	}
	return buf;
}

/* Whether a and b hold the same value of k (strings to their NUL, id lists to their count). */
static int
config_key_equal(const struct config_key *k, const struct config *a, const struct config *b)
{
	const char	*fa = (const char *)a + k->off, *fb = (const char *)b + k->off;
	size_t		 ca, cb;

	switch (k->type) {
	case CONFIG_T_STRING:
	case CONFIG_T_WORD:
	case CONFIG_T_LISTEN:
		return strncmp(fa, fb, k->size) == 0;
	case CONFIG_T_IDS:
		memcpy(&ca, (const char *)a + k->count_off, sizeof(ca));
		memcpy(&cb, (const char *)b + k->count_off, sizeof(cb));
		return ca == cb && memcmp(fa, fb, ca * sizeof(uint32_t)) == 0;
	case CONFIG_T_MEMBERS:
		memcpy(&ca, (const char *)a + k->count_off, sizeof(ca));
		memcpy(&cb, (const char *)b + k->count_off, sizeof(cb));
		return ca == cb && memcmp(fa, fb, ca * sizeof(struct peer_member)) == 0;
	default:
		return memcmp(fa, fb, k->size) == 0;
	}
}

/* Copies k's value (and an id list's count) from src into dst. */
static void
config_key_copy(const struct config_key *k, struct config *dst, const struct config *src)
{
	memcpy((char *)dst + k->off, (const char *)src + k->off, k->size);
	if (k->type == CONFIG_T_IDS || k->type == CONFIG_T_MEMBERS)
		memcpy((char *)dst + k->count_off, (const char *)src + k->count_off, sizeof(size_t));
}

/* How many keys the table has: the most changes one reload can report. */
size_t
config_nkeys(void)
{
	return CONFIG_NKEYS;
}

/* Whether the key (dotted name) may change at a reload; -1: no such key. */
int
config_key_live(const char *name)
{
	const struct config_key	*k = config_key_find(name);

	return k == NULL ? -1 : k->live;
}

/*
 * A reload: compares the running config cur with next (a whole config
 * just loaded and validated) key by key, in table order. A changed live
 * key takes next's value in cur; any other changed key is refused and
 * keeps cur's. Each change goes into out (at most max of them, which
 * config_nkeys() always covers), with its old and new values as text.
 * Returns the number of changes.
 */
size_t
config_reload(struct config *cur, const struct config *next, struct config_change *out,
    size_t max)
{
	const struct config_key	*k;
	struct config_change	*c;
	size_t			 i, n = 0;

	for (i = 0; i < CONFIG_NKEYS && n < max; i++) {
		k = &config_keys[i];
		if (config_key_equal(k, cur, next))
			continue;
		c = &out[n++];
		memset(c, 0, sizeof(*c));
		c->key = k->name;
		config_value_text(k, cur, c->old, sizeof(c->old));
		config_value_text(k, next, c->new, sizeof(c->new));
		if (k->live) {
			config_key_copy(k, cur, next);
			c->applied = 1;
		} else
			snprintf(c->reason, sizeof(c->reason), "not live: it changes only at a "
			    "restart; keeping %s", c->old);
	}
	return n;
}

/* Puts one key (a dotted name the table has) back to its value in prev: a reload hook failed. */
void
config_key_restore(struct config *cur, const struct config *prev, const char *name)
{
	const struct config_key	*k = config_key_find(name);

	assert(k != NULL);
	config_key_copy(k, cur, prev);
}
