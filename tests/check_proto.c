/*
 * The wire protocol's pure functions (proto/proto.c): every message
 * through its validators, every malformed header and every invalid
 * ATTACH field answered with its exact status and a text naming the
 * field, region geometry at and past its bounds, the status tables
 * total, and proto_dump() safe on anything.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "tests.h"

/* An ATTACH being built: room for one entry past every limit. */
struct pt_attach {
	struct proto_attach	fixed;
	struct proto_pool	pools[PROTO_POOLS_MAX + 1];
	struct proto_region	regions[PROTO_REGIONS_MAX + 1];
	uint32_t		live[PROTO_LIVE_MAX + 1];
};

static struct pt_attach *
pt_attach_new(void)
{
	struct pt_attach	*a = calloc(1, sizeof(*a));

	ck_assert_ptr_nonnull(a);
	a->fixed = (struct proto_attach){ .layout = { .model = "deepseek-v3",
	    .kv_dtype = "fp8_e4m3", .hash_scheme = "sha256", .tp_size = 2, .dcp_size = 2,
	    .pp_size = 1, .cp_size = 1, .dcp_rank = 1, .host_layout = PROTO_LAYOUT_PAGE_FIRST,
	    .attention = PROTO_ATTN_MLA, .hash_len = 32, .npools = 2, .page_tokens = 64,
	    .logical_page_tokens = 64, .seed = 7 }, .group = "engine-0", .group_size = 2,
	    .group_rank = 1, .tp_rank = 1, .prefetch = PROTO_PREFETCH_WAIT_COMPLETE,
	    .write = PROTO_WRITE_THROUGH, .nregions = 2, .nlive = 2 };
	a->pools[0] = (struct proto_pool){ .name = "kv", .kind = PROTO_POOL_KV,
	    .hit_policy = PROTO_HIT_ALL_PAGES, .layers = 61, .object_bytes = 61 * 64 * 576,
	    .schema = "mla:576" };
	a->pools[1] = (struct proto_pool){ .name = "state", .kind = PROTO_POOL_STATE,
	    .hit_policy = PROTO_HIT_TRAILING, .trailing = 1, .layers = 1, .object_bytes = 4096 };
	/* MLA FP8 pages, page_first: tokens x layers x 576 bytes. */
	a->regions[0] = (struct proto_region){ .pool = 0, .kind = PROTO_MEM_MEMFD,
	    .layout = PROTO_LAYOUT_PAGE_FIRST, .num_pages = 16, .page_tokens = 64, .layers = 61,
	    .token_bytes = 576, .layer_stride = 576, .token_stride = 61 * 576,
	    .page_stride = 64 * 61 * 576, .size = 16ULL * 64 * 61 * 576 };
	a->regions[1] = (struct proto_region){ .pool = 1, .kind = PROTO_MEM_MEMFD,
	    .layout = PROTO_LAYOUT_SLOTS, .fd_index = 1, .num_pages = 8, .page_tokens = 1,
	    .layers = 1, .token_bytes = 4096, .page_stride = 4096, .size = 8 * 4096 };
	a->live[0] = 3;
	a->live[1] = 5;
	return a;
}

/* A HELLO offering versions min..max, from client. */
static struct proto_hello
pt_hello(uint16_t min, uint16_t max, const char *client)
{
	struct proto_hello	h;

	memset(&h, 0, sizeof(h));
	h.version_min = min;
	h.version_max = max;
	ck_assert_uint_lt(strlen(client), sizeof(h.client));
	memcpy(h.client, client, strlen(client));
	return h;
}

/* proto_dump() of a HELLO request (seq 1) whose payload is at p. */
static void
pt_dump_hello(const void *p, char *out, size_t len)
{
	struct proto_hdr	h;

	proto_hdr_init(&h, PROTO_T_HELLO, sizeof(struct proto_hello), 1);
	proto_dump(&h, p, out, len);
}

/* The payload as the wire has it; *len gets its length. */
static uint8_t *
pt_attach_encode(const struct pt_attach *a, uint32_t *len)
{
	uint8_t	*buf, *p;
	size_t	 n;

	*len = proto_attach_length(a->fixed.layout.npools, a->fixed.nregions, a->fixed.nlive);
	ck_assert_uint_lt(*len, 1U << 24);
	buf = p = malloc(*len);
	ck_assert_ptr_nonnull(buf);
	memcpy(p, &a->fixed, sizeof(a->fixed));
	p += sizeof(a->fixed);
	n = a->fixed.layout.npools * sizeof(a->pools[0]);
	memcpy(p, a->pools, n);
	p += n;
	n = a->fixed.nregions * sizeof(a->regions[0]);
	memcpy(p, a->regions, n);
	p += n;
	memcpy(p, a->live, (size_t)a->fixed.nlive * 4);
	return buf;
}

/* Runs the daemon's two ATTACH checks; err gets decode's text. */
static int
pt_attach_check(const struct pt_attach *a, char *err, size_t errlen)
{
	static struct proto_attach_view	 v;
	uint8_t				*buf;
	uint32_t			 len;
	int				 st;

	err[0] = '\0';
	buf = pt_attach_encode(a, &len);
	st = proto_payload_check(PROTO_T_ATTACH, len, buf);
	if (st == 0)
		st = proto_attach_decode(buf, len, &v, err, errlen);
	free(buf);
	return st;
}

START_TEST(test_hdr_init_is_a_valid_request)
{
	struct proto_hdr	h;
	uint8_t			wire[sizeof(h)], *p = wire;

	proto_hdr_init(&h, PROTO_T_STATS, 0, 42);
	memcpy(wire, &h, sizeof(h));
	/* The documented offsets, byte by byte, little-endian. */
	ck_assert_uint_eq(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24, PROTO_MAGIC);
	ck_assert_mem_eq(p, "L3KV", 4);
	ck_assert_uint_eq(p[4] | p[5] << 8, PROTO_VERSION);
	ck_assert_uint_eq(p[6] | p[7] << 8, PROTO_T_STATS);
	ck_assert_uint_eq(p[8] | p[9] << 8, 0);
	ck_assert_uint_eq(p[10] | p[11] << 8, 0);
	ck_assert_uint_eq(p[12], 0);
	ck_assert_uint_eq(p[16], 42);
	ck_assert_int_eq(proto_hdr_check(&h, PROTO_FRAME_MIN), PROTO_S_OK);
	h.flags = PROTO_F_FDS;
	ck_assert_int_eq(proto_hdr_check(&h, PROTO_FRAME_MIN), PROTO_S_OK);
}
END_TEST

/* Each malformed header and the status the daemon answers it with. */
static const struct {
	const char	*name;
	uint32_t	 magic;
	uint16_t	 version;
	uint16_t	 type;
	uint16_t	 flags;
	uint16_t	 status;
	uint32_t	 length;
	int		 want;
} pt_bad_hdrs[] = {
	{ "bad magic",		0x4c334b56, 1, PROTO_T_STATS, 0, 0, 0, PROTO_S_BAD_MAGIC },
	{ "zero magic",		0, 1, PROTO_T_STATS, 0, 0, 0, PROTO_S_BAD_MAGIC },
	{ "magic before version", 1, 9, PROTO_T_STATS, 0, 0, 0, PROTO_S_BAD_MAGIC },
	{ "version 0",		PROTO_MAGIC, 0, PROTO_T_STATS, 0, 0, 0, PROTO_S_BAD_VERSION },
	{ "version 2",		PROTO_MAGIC, 2, PROTO_T_STATS, 0, 0, 0, PROTO_S_BAD_VERSION },
	{ "version before length", PROTO_MAGIC, 2, PROTO_T_STATS, 0, 0, ~0U, PROTO_S_BAD_VERSION },
	{ "length over max",	PROTO_MAGIC, 1, PROTO_T_ATTACH, 0, 0, 4097, PROTO_S_TOO_BIG },
	{ "length at 4 GiB",	PROTO_MAGIC, 1, PROTO_T_ATTACH, 0, 0, ~0U, PROTO_S_TOO_BIG },
	{ "length before type",	PROTO_MAGIC, 1, 77, 0, 0, 4097, PROTO_S_TOO_BIG },
	{ "unknown flag",	PROTO_MAGIC, 1, PROTO_T_STATS, 0x0004, 0, 0, PROTO_S_BAD_FLAGS },
	{ "high flag",		PROTO_MAGIC, 1, PROTO_T_STATS, 0x8000, 0, 0, PROTO_S_BAD_FLAGS },
	{ "reply flag",		PROTO_MAGIC, 1, PROTO_T_STATS, PROTO_F_REPLY, 0, 0, PROTO_S_BAD_FLAGS },
	{ "status in request",	PROTO_MAGIC, 1, PROTO_T_STATS, 0, 3, 0, PROTO_S_BAD_FLAGS },
	{ "type 0",		PROTO_MAGIC, 1, 0, 0, 0, 0, PROTO_S_BAD_TYPE },
	{ "type 6",		PROTO_MAGIC, 1, 6, 0, 0, 0, PROTO_S_BAD_TYPE },
	{ "ERROR is reply-only", PROTO_MAGIC, 1, PROTO_T_ERROR, 0, 0, 0, PROTO_S_BAD_TYPE },
	{ "type 65535",		PROTO_MAGIC, 1, 0xffff, 0, 0, 0, PROTO_S_BAD_TYPE },
};

/*
 * Every type number is either served (its header passes) or bad_type,
 * for the header and for the payload check alike: a reserved number
 * (22, SET_POLICY, until its payload is defined) never slips through.
 */
START_TEST(test_every_unserved_type_is_bad_type)
{
	struct proto_hdr	h;
	unsigned		t;

	/* Plain ifs: 65536 check assertions are too slow under sanitizers. */
	for (t = 0; t <= 0xffff; t++) {
		proto_hdr_init(&h, t, 0, 1);
		if (proto_type_is_request(t)) {
			if (proto_hdr_check(&h, 4096) != PROTO_S_OK ||
			    strcmp(proto_type_name(t), "UNKNOWN") == 0)
				ck_abort_msg("served type %u: header refused or unnamed", t);
		} else if (proto_hdr_check(&h, 4096) != PROTO_S_BAD_TYPE ||
		    proto_payload_check(t, 0, NULL) != PROTO_S_BAD_TYPE) {
			ck_abort_msg("unserved type %u is not bad_type", t);
		}
	}
	ck_assert(!proto_type_is_request(PROTO_T_ERROR));
}
END_TEST

START_TEST(test_hdr_check_answers_each_malformed_header_exactly)
{
	struct proto_hdr	h;

	memset(&h, 0, sizeof(h));
	h.magic = pt_bad_hdrs[_i].magic;
	h.version = pt_bad_hdrs[_i].version;
	h.type = pt_bad_hdrs[_i].type;
	h.flags = pt_bad_hdrs[_i].flags;
	h.status = pt_bad_hdrs[_i].status;
	h.length = pt_bad_hdrs[_i].length;
	h.seq = 1;
	ck_assert_msg(proto_hdr_check(&h, 4096) == pt_bad_hdrs[_i].want, "%s: got %s, want %s",
	    pt_bad_hdrs[_i].name, proto_status_name(proto_hdr_check(&h, 4096)),
	    proto_status_name(pt_bad_hdrs[_i].want));
}
END_TEST

START_TEST(test_hdr_check_accepts_length_at_max)
{
	struct proto_hdr	h;

	proto_hdr_init(&h, PROTO_T_ATTACH, 4096, 1);
	ck_assert_int_eq(proto_hdr_check(&h, 4096), PROTO_S_OK);
	h.length = 4097;
	ck_assert_int_eq(proto_hdr_check(&h, 4096), PROTO_S_TOO_BIG);
	proto_hdr_init(&h, PROTO_T_ATTACH, PROTO_FRAME_MAX, 1);
	ck_assert_int_eq(proto_hdr_check(&h, PROTO_FRAME_MAX), PROTO_S_OK);
}
END_TEST

START_TEST(test_payload_check_lengths_per_type)
{
	struct pt_attach	*a = pt_attach_new();
	uint8_t			*buf, zero[sizeof(struct proto_hello) + 1] = { 0 };
	uint32_t		 len;

	ck_assert_int_eq(proto_payload_check(PROTO_T_HELLO, sizeof(struct proto_hello), zero), 0);
	ck_assert_int_eq(proto_payload_check(PROTO_T_HELLO, sizeof(struct proto_hello) - 1, zero),
	    PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_HELLO, sizeof(struct proto_hello) + 1, zero),
	    PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_HELLO, 0, NULL), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_DETACH, 0, NULL), 0);
	ck_assert_int_eq(proto_payload_check(PROTO_T_STATS, 0, NULL), 0);
	ck_assert_int_eq(proto_payload_check(PROTO_T_HEALTH, 0, NULL), 0);
	ck_assert_int_eq(proto_payload_check(PROTO_T_DETACH, 1, zero), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_STATS, 1, zero), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_HEALTH, 1, zero), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_RELOAD, 0, NULL), 0);
	ck_assert_int_eq(proto_payload_check(PROTO_T_RELOAD, 1, zero), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(99, 0, NULL), PROTO_S_BAD_TYPE);

	buf = pt_attach_encode(a, &len);
	ck_assert_uint_eq(len, sizeof(struct proto_attach) + 2 * sizeof(struct proto_pool) +
	    2 * sizeof(struct proto_region) + 2 * 4);
	ck_assert_int_eq(proto_payload_check(PROTO_T_ATTACH, len, buf), 0);
	ck_assert_int_eq(proto_payload_check(PROTO_T_ATTACH, len - 1, buf), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_ATTACH, len + 1, buf), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_ATTACH, sizeof(struct proto_attach) - 1, buf),
	    PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(PROTO_T_ATTACH, 0, NULL), PROTO_S_BAD_LENGTH);
	free(buf);
	free(a);
}
END_TEST

/*
 * The cache operations' requests: a fixed part, then count elements
 * (count a uint32 at count_at), or a fixed part alone (elem 0).
 */
static const struct {
	const char	*name;
	unsigned	 type;
	uint32_t	 fixed;
	uint32_t	 count_at;
	uint32_t	 elem;
} pt_cache_msgs[] = {
	{ "PROBE",	PROTO_T_PROBE,		8,	0,	32 },
	{ "ADMIT",	PROTO_T_ADMIT,		24,	8,	32 },
	{ "RESTORE",	PROTO_T_RESTORE,	24,	8,	4 },
	{ "PUBLISH",	PROTO_T_PUBLISH,	8,	0,	40 },
	{ "CANCEL",	PROTO_T_CANCEL,		8,	0,	0 },
	{ "RELEASE",	PROTO_T_RELEASE,	8,	0,	0 },
	{ "DEBUG",	PROTO_T_DEBUG,		40,	0,	0 },
	{ "SET_POLICY",	PROTO_T_SET_POLICY,	8,	0,	0 },
	{ "LIST",	PROTO_T_LIST,		8,	0,	0 },
};

/* A payload of the message with count n, and room for one more byte. */
static uint8_t *
pt_cache_payload(unsigned i, uint32_t n, uint32_t *len)
{
	uint8_t	*p;

	*len = pt_cache_msgs[i].fixed + n * pt_cache_msgs[i].elem;
	p = calloc(1, (size_t)*len + 1);
	ck_assert_ptr_nonnull(p);
	if (pt_cache_msgs[i].elem > 0)
		memcpy(p + pt_cache_msgs[i].count_at, &n, sizeof(n));
	return p;
}

START_TEST(test_payload_check_lengths_of_cache_operations)
{
	unsigned	 type = pt_cache_msgs[_i].type, fixed = pt_cache_msgs[_i].fixed;
	const char	*name = pt_cache_msgs[_i].name;
	uint8_t		*p;
	uint32_t	 len, n, counts[] = { 0, 1, 3, PROTO_PAGES_MAX };
	unsigned	 j;

	ck_assert_str_eq(proto_type_name(type), name);
	ck_assert(proto_type_is_request(type));
	for (j = 0; j < sizeof(counts) / sizeof(counts[0]); j++) {
		if (pt_cache_msgs[_i].elem == 0 && counts[j] > 0)
			break;
		p = pt_cache_payload(_i, counts[j], &len);
		ck_assert_msg(proto_payload_check(type, len, p) == 0, "%s of %u: refused", name,
		    counts[j]);
		ck_assert_msg(proto_payload_check(type, len + 1, p) == PROTO_S_BAD_LENGTH,
		    "%s of %u: one byte more passed", name, counts[j]);
		ck_assert_msg(proto_payload_check(type, len - 1, p) == PROTO_S_BAD_LENGTH,
		    "%s of %u: one byte less passed", name, counts[j]);
		free(p);
	}
	/* Shorter than the fixed part, the count unread. */
	p = calloc(1, fixed);
	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(proto_payload_check(type, fixed - 1, p), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_payload_check(type, 0, NULL), PROTO_S_BAD_LENGTH);
	free(p);
	if (pt_cache_msgs[_i].elem == 0)
		return;
	/* A count over PROTO_PAGES_MAX, with a length that matches it. */
	p = pt_cache_payload(_i, PROTO_PAGES_MAX + 1, &len);
	ck_assert_int_eq(proto_payload_check(type, len, p), PROTO_S_BAD_LENGTH);
	free(p);
	/*
	 * Counts whose array length wraps 32 bits to exactly 0 (n * elem =
	 * k * 2^32), or is the largest there is: refused, not wrapped.
	 */
	p = pt_cache_payload(_i, 0, &len);
	n = (uint32_t)(0x100000000ULL / (pt_cache_msgs[_i].elem & -pt_cache_msgs[_i].elem));
	memcpy(p + pt_cache_msgs[_i].count_at, &n, sizeof(n));
	ck_assert_int_eq(proto_payload_check(type, fixed, p), PROTO_S_BAD_LENGTH);
	n = UINT32_MAX;
	memcpy(p + pt_cache_msgs[_i].count_at, &n, sizeof(n));
	ck_assert_int_eq(proto_payload_check(type, fixed, p), PROTO_S_BAD_LENGTH);
	free(p);
}
END_TEST

#define PT_AT(type, field, off)	\
	ck_assert_msg(offsetof(type, field) == (off), #type "." #field " is not at " #off)

/* The offsets proto/PROTOCOL.md §4.7-4.13 documents. */
START_TEST(test_cache_structs_have_the_documented_layout)
{
	PT_AT(struct proto_probe, npages, 0);
	PT_AT(struct proto_probe, pool, 4);
	PT_AT(struct proto_probe, flags, 6);
	PT_AT(struct proto_probe_reply, hit_pages, 0);
	PT_AT(struct proto_probe_reply, nstops, 4);
	PT_AT(struct proto_admit, request_id, 0);
	PT_AT(struct proto_admit, npages, 8);
	PT_AT(struct proto_admit, reserved_pages, 12);
	PT_AT(struct proto_admit, state_slot, 16);
	PT_AT(struct proto_admit, flags, 20);
	PT_AT(struct proto_admit_reply, lease, 0);
	PT_AT(struct proto_admit_reply, admitted_pages, 8);
	PT_AT(struct proto_admit_reply, decline, 12);
	PT_AT(struct proto_admit_reply, pad, 14);
	PT_AT(struct proto_admit_reply, ttl_ms, 16);
	PT_AT(struct proto_admit_reply, group_hit, 20);
	PT_AT(struct proto_restore, lease, 0);
	PT_AT(struct proto_restore, npages, 8);
	PT_AT(struct proto_restore, region, 12);
	PT_AT(struct proto_restore, flags, 14);
	PT_AT(struct proto_restore_reply, pages, 0);
	PT_AT(struct proto_restore_reply, flags, 4);
	PT_AT(struct proto_restore_reply, bytes, 8);
	PT_AT(struct proto_lease_op, lease, 0);
	PT_AT(struct proto_cancel_reply, pages_landed, 0);
	PT_AT(struct proto_cancel_reply, pad, 4);
	PT_AT(struct proto_publish, npages, 0);
	PT_AT(struct proto_publish, region, 4);
	PT_AT(struct proto_publish, flags, 6);
	PT_AT(struct proto_publish_page, hash, 0);
	PT_AT(struct proto_publish_page, src_page, 32);
	PT_AT(struct proto_publish_page, pad, 36);
	PT_AT(struct proto_publish_reply, stored, 0);
	PT_AT(struct proto_publish_reply, present, 4);
	PT_AT(struct proto_publish_reply, bytes, 8);
	PT_AT(struct proto_debug, op, 0);
	PT_AT(struct proto_debug, pool, 4);
	PT_AT(struct proto_debug, pad, 6);
	PT_AT(struct proto_debug, hash, 8);
	ck_assert_uint_eq(PROTO_SLOT_NONE, 0xffffffffU);
	ck_assert_uint_eq(PROTO_PAGES_MAX, 65536);
	ck_assert_uint_eq(PROTO_RESTORE_F_PARTIAL, 1);
}
END_TEST

START_TEST(test_hello_round_trip)
{
	struct proto_hello	h = pt_hello(1, 1, "sglang-decode"), back;
	struct proto_hdr	hdr, hdr2;
	uint8_t			frame[sizeof(hdr) + sizeof(h)];
	uint16_t		v = 0;

	proto_hdr_init(&hdr, PROTO_T_HELLO, sizeof(h), 1);
	memcpy(frame, &hdr, sizeof(hdr));
	memcpy(frame + sizeof(hdr), &h, sizeof(h));

	memcpy(&hdr2, frame, sizeof(hdr2));
	ck_assert_int_eq(proto_hdr_check(&hdr2, PROTO_FRAME_MIN), 0);
	ck_assert_int_eq(proto_payload_check(hdr2.type, hdr2.length, frame + sizeof(hdr2)), 0);
	memcpy(&back, frame + sizeof(hdr2), sizeof(back));
	ck_assert_int_eq(proto_hello_check(&back, &v), 0);
	ck_assert_uint_eq(v, 1);
	ck_assert_str_eq(back.client, "sglang-decode");
	ck_assert_mem_eq(&back, &h, sizeof(h));
}
END_TEST

START_TEST(test_hello_check_picks_the_highest_common_version)
{
	struct proto_hello	h = pt_hello(1, 9, "");
	uint16_t		v = 0;

	ck_assert_int_eq(proto_hello_check(&h, &v), 0);	/* an empty client name is fine */
	ck_assert_uint_eq(v, PROTO_VERSION_MAX);
	h.version_min = 0;
	h.version_max = 1;
	ck_assert_int_eq(proto_hello_check(&h, &v), 0);
	ck_assert_uint_eq(v, 1);
}
END_TEST

START_TEST(test_hello_check_rejects_each_bad_field)
{
	struct proto_hello	h = pt_hello(1, 1, "");
	uint16_t		v = 0;

	h.flags = 1;
	ck_assert_int_eq(proto_hello_check(&h, &v), PROTO_S_INVALID);
	h.flags = 0;
	memset(h.client, 'a', sizeof(h.client));
	ck_assert_int_eq(proto_hello_check(&h, &v), PROTO_S_INVALID);
	strcpy(h.client, "tab\there");
	ck_assert_int_eq(proto_hello_check(&h, &v), PROTO_S_INVALID);
	strcpy(h.client, "ok");
	h.version_min = 2;
	h.version_max = 1;
	ck_assert_int_eq(proto_hello_check(&h, &v), PROTO_S_BAD_VERSION);
	h.version_min = 2;
	h.version_max = 3;
	ck_assert_int_eq(proto_hello_check(&h, &v), PROTO_S_BAD_VERSION);
	h.version_min = 0;
	h.version_max = 0;
	ck_assert_int_eq(proto_hello_check(&h, &v), PROTO_S_BAD_VERSION);
	ck_assert_uint_eq(v, 0);
}
END_TEST

START_TEST(test_reply_structs_round_trip)
{
	struct proto_hello_reply	hr, hr2;
	struct proto_attach_reply	ar, ar2;
	struct proto_hdr		h;
	char				dump[512];
	unsigned			i;

	memset(&hr, 0, sizeof(hr));
	hr.version = 1;
	hr.caps = PROTO_CAP_HOST_COPY | PROTO_CAP_NONBLOCK;
	hr.max_frame = 16U << 20;
	hr.lease_ttl_ms = 30000;
	strcpy(hr.server, "l3kvd 0.1.0");
	strcpy(hr.role, "decode");
	memcpy(&hr2, &hr, sizeof(hr));
	ck_assert(proto_string_ok(hr2.server, sizeof(hr2.server), 0));
	ck_assert(proto_string_ok(hr2.role, sizeof(hr2.role), 0));
	ck_assert_uint_eq(hr2.max_frame, 16U << 20);

	memset(&ar, 0, sizeof(ar));
	for (i = 0; i < sizeof(ar.fingerprint); i++)
		ar.fingerprint[i] = (uint8_t)(0xf0 + i);
	strcpy(ar.ns, "decode/deepseek-v3-f0f1");
	ar.session = 9;
	ar.lease_ttl_ms = 30000;
	ar.group_members = 2;
	memcpy(&ar2, &ar, sizeof(ar));
	ck_assert(proto_string_ok(ar2.ns, sizeof(ar2.ns), 0));
	ck_assert_mem_eq(&ar2, &ar, sizeof(ar));

	/* A reply header is never accepted as a request. */
	proto_hdr_init(&h, PROTO_T_ATTACH, sizeof(ar), 5);
	h.flags = PROTO_F_REPLY;
	ck_assert_int_eq(proto_hdr_check(&h, PROTO_FRAME_MIN), PROTO_S_BAD_FLAGS);
	proto_dump(&h, &ar, dump, sizeof(dump));
	ck_assert_str_eq(dump, "ATTACH reply seq=5 len=128 flags=0x1 status=ok");
}
END_TEST

START_TEST(test_attach_decode_accepts_a_valid_attach)
{
	static struct proto_attach_view	 v;
	struct pt_attach		*a = pt_attach_new();
	char				 err[256] = "";
	uint8_t				*buf;
	uint32_t			 len;

	buf = pt_attach_encode(a, &len);
	ck_assert_int_eq(proto_attach_decode(buf, len, &v, err, sizeof(err)), PROTO_S_OK);
	ck_assert_str_eq(err, "");
	ck_assert_mem_eq(&v.fixed, &a->fixed, sizeof(a->fixed));
	ck_assert_mem_eq(v.pools, a->pools, 2 * sizeof(a->pools[0]));
	ck_assert_mem_eq(v.regions, a->regions, 2 * sizeof(a->regions[0]));
	ck_assert_uint_eq(proto_attach_live(&v, 0), 3);
	ck_assert_uint_eq(proto_attach_live(&v, 1), 5);
	/* A NULL error buffer is allowed. */
	ck_assert_int_eq(proto_attach_decode(buf, len, &v, NULL, 0), PROTO_S_OK);
	ck_assert_int_eq(proto_attach_decode(buf, len - 1, &v, err, sizeof(err)), PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_attach_decode(buf, 10, &v, err, sizeof(err)), PROTO_S_BAD_LENGTH);
	free(buf);

	/* The smallest: one pool, no regions, no live slots. */
	a->fixed.layout.npools = 1;
	a->fixed.nregions = 0;
	a->fixed.nlive = 0;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	/* The largest counts. */
	a->fixed.layout.npools = PROTO_POOLS_MAX;
	for (unsigned i = 2; i < PROTO_POOLS_MAX; i++) {
		a->pools[i] = a->pools[0];
		snprintf(a->pools[i].name, sizeof(a->pools[i].name), "side%u", i);
	}
	a->fixed.nregions = PROTO_REGIONS_MAX;
	for (unsigned i = 1; i < PROTO_REGIONS_MAX; i++)
		a->regions[i] = a->regions[0];
	a->fixed.nlive = PROTO_LIVE_MAX;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	free(a);
}
END_TEST

/* One invalid field per case, and the field its error text must name. */
#define PT_MUT(name, body)						\
static void								\
pt_mut_##name(struct pt_attach *a)					\
{									\
	body;								\
}
PT_MUT(model_empty, a->fixed.layout.model[0] = '\0')
PT_MUT(model_unterminated, memset(a->fixed.layout.model, 'm', PROTO_MODEL_LEN))
PT_MUT(model_control, a->fixed.layout.model[2] = '\n')
PT_MUT(model_high, a->fixed.layout.model[0] = (char)0xc3)
PT_MUT(kv_dtype_empty, a->fixed.layout.kv_dtype[0] = '\0')
PT_MUT(hash_scheme_unterminated, memset(a->fixed.layout.hash_scheme, 's', 16))
PT_MUT(tp_size_0, a->fixed.layout.tp_size = 0)
PT_MUT(tp_size_big, a->fixed.layout.tp_size = PROTO_RANK_MAX + 1)
PT_MUT(dcp_size_0, a->fixed.layout.dcp_size = 0; a->fixed.layout.dcp_rank = 0)
PT_MUT(pp_size_0, a->fixed.layout.pp_size = 0)
PT_MUT(cp_size_big, a->fixed.layout.cp_size = PROTO_RANK_MAX + 1)
PT_MUT(dcp_rank, a->fixed.layout.dcp_rank = 2)
PT_MUT(pp_rank, a->fixed.layout.pp_rank = 1)
PT_MUT(host_layout_0, a->fixed.layout.host_layout = 0)
PT_MUT(host_layout_slots, a->fixed.layout.host_layout = PROTO_LAYOUT_SLOTS)
PT_MUT(attention_0, a->fixed.layout.attention = 0)
PT_MUT(attention_4, a->fixed.layout.attention = 4)
PT_MUT(hash_len_0, a->fixed.layout.hash_len = 0)
PT_MUT(hash_len_33, a->fixed.layout.hash_len = 33)
PT_MUT(npools_0, a->fixed.layout.npools = 0; a->fixed.nregions = 0)
PT_MUT(npools_9, a->fixed.layout.npools = PROTO_POOLS_MAX + 1)
PT_MUT(page_tokens_0, a->fixed.layout.page_tokens = 0)
PT_MUT(page_tokens_big, a->fixed.layout.page_tokens = 65537)
PT_MUT(logical_0, a->fixed.layout.logical_page_tokens = 0)
PT_MUT(logical_not_multiple, a->fixed.layout.logical_page_tokens = 96)
PT_MUT(nregions_65, a->fixed.nregions = PROTO_REGIONS_MAX + 1)
PT_MUT(nlive_big, a->fixed.nlive = PROTO_LIVE_MAX + 1)
PT_MUT(group_empty, a->fixed.group[0] = '\0')
PT_MUT(group_unterminated, memset(a->fixed.group, 'g', PROTO_GROUP_LEN))
PT_MUT(group_size_0, a->fixed.group_size = 0; a->fixed.group_rank = 0)
PT_MUT(group_size_big, a->fixed.group_size = PROTO_GROUP_SIZE_MAX + 1)
PT_MUT(group_rank, a->fixed.group_rank = 2)
PT_MUT(tp_rank, a->fixed.tp_rank = 2)
PT_MUT(prefetch_0, a->fixed.prefetch = 0)
PT_MUT(prefetch_4, a->fixed.prefetch = 4)
PT_MUT(write_0, a->fixed.write = 0)
PT_MUT(write_4, a->fixed.write = 4)
PT_MUT(timeout_policy_without_timeout, a->fixed.prefetch = PROTO_PREFETCH_TIMEOUT)
PT_MUT(pool_name_empty, a->pools[1].name[0] = '\0')
PT_MUT(pool_name_twice, strcpy(a->pools[1].name, "kv"))
PT_MUT(pool_kind_0, a->pools[0].kind = 0)
PT_MUT(pool_kind_4, a->pools[1].kind = 4)
PT_MUT(pool_hit_policy_0, a->pools[0].hit_policy = 0)
PT_MUT(pool_hit_policy_3, a->pools[0].hit_policy = 3)
PT_MUT(pool_trailing_0, a->pools[1].trailing = 0)
PT_MUT(pool_object_bytes_0, a->pools[0].object_bytes = 0)
PT_MUT(pool_object_bytes_big, a->pools[0].object_bytes = (1ULL << 30) + 1)
PT_MUT(pool_schema_unterminated, memset(a->pools[0].schema, 's', PROTO_SCHEMA_LEN))
PT_MUT(region_pool, a->regions[1].pool = 2)
PT_MUT(region_kind_0, a->regions[0].kind = 0)
PT_MUT(region_kind_5, a->regions[0].kind = 5)
PT_MUT(region_event_with_geometry, a->regions[0].kind = PROTO_MEM_CUDA_EVENT)
PT_MUT(region_memfd_device, a->regions[0].device = 1)
PT_MUT(region_event_device, (a->regions[0] = (struct proto_region){ .kind =
    PROTO_MEM_CUDA_EVENT, .device = 1 }))
PT_MUT(region_layout_0, a->regions[0].layout = 0)
PT_MUT(region_layout_5, a->regions[0].layout = 5)
PT_MUT(region_fd_index, a->regions[1].fd_index = PROTO_FDS_MAX)
PT_MUT(region_num_pages_0, a->regions[0].num_pages = 0)
PT_MUT(region_layers_0, a->regions[0].layers = 0)
PT_MUT(region_page_tokens_0, a->regions[0].page_tokens = 0)
PT_MUT(region_token_bytes_0, a->regions[0].token_bytes = 0)
PT_MUT(region_slots_layers, a->regions[1].layers = 2)
PT_MUT(region_slots_tokens, a->regions[1].page_tokens = 2)
PT_MUT(region_past_size, a->regions[0].size -= 1)
PT_MUT(region_stride_overflow, a->regions[0].page_stride = 1ULL << 63)
PT_MUT(region_layer_overflow, a->regions[0].layer_stride = UINT64_MAX / 32)
PT_MUT(region_offset_overflow, a->regions[0].offset = UINT64_MAX - 4096)

static const struct {
	const char	*name;
	void		(*mut)(struct pt_attach *);
	const char	*field;
} pt_bad_attach[] = {
#define PT_CASE(name, field)	{ #name, pt_mut_##name, field }
	PT_CASE(model_empty, "layout.model"),
	PT_CASE(model_unterminated, "layout.model"),
	PT_CASE(model_control, "layout.model"),
	PT_CASE(model_high, "layout.model"),
	PT_CASE(kv_dtype_empty, "layout.kv_dtype"),
	PT_CASE(hash_scheme_unterminated, "layout.hash_scheme"),
	PT_CASE(tp_size_0, "layout.tp_size"),
	PT_CASE(tp_size_big, "layout.tp_size"),
	PT_CASE(dcp_size_0, "layout.dcp_size"),
	PT_CASE(pp_size_0, "layout.pp_size"),
	PT_CASE(cp_size_big, "layout.cp_size"),
	PT_CASE(dcp_rank, "layout.dcp_rank"),
	PT_CASE(pp_rank, "layout.pp_rank"),
	PT_CASE(host_layout_0, "layout.host_layout"),
	PT_CASE(host_layout_slots, "layout.host_layout"),
	PT_CASE(attention_0, "layout.attention"),
	PT_CASE(attention_4, "layout.attention"),
	PT_CASE(hash_len_0, "layout.hash_len"),
	PT_CASE(hash_len_33, "layout.hash_len"),
	PT_CASE(npools_0, "layout.npools"),
	PT_CASE(npools_9, "layout.npools"),
	PT_CASE(page_tokens_0, "layout.page_tokens"),
	PT_CASE(page_tokens_big, "layout.page_tokens"),
	PT_CASE(logical_0, "layout.logical_page_tokens"),
	PT_CASE(logical_not_multiple, "layout.logical_page_tokens"),
	PT_CASE(nregions_65, "nregions"),
	PT_CASE(nlive_big, "nlive"),
	PT_CASE(group_empty, "group"),
	PT_CASE(group_unterminated, "group"),
	PT_CASE(group_size_0, "group_size"),
	PT_CASE(group_size_big, "group_size"),
	PT_CASE(group_rank, "group_rank"),
	PT_CASE(tp_rank, "tp_rank"),
	PT_CASE(prefetch_0, "prefetch"),
	PT_CASE(prefetch_4, "prefetch"),
	PT_CASE(write_0, "write"),
	PT_CASE(write_4, "write"),
	PT_CASE(timeout_policy_without_timeout, "prefetch_timeout_ms"),
	PT_CASE(pool_name_empty, "pools[1].name"),
	PT_CASE(pool_name_twice, "pools[1].name"),
	PT_CASE(pool_kind_0, "pools[0].kind"),
	PT_CASE(pool_kind_4, "pools[1].kind"),
	PT_CASE(pool_hit_policy_0, "pools[0].hit_policy"),
	PT_CASE(pool_hit_policy_3, "pools[0].hit_policy"),
	PT_CASE(pool_trailing_0, "pools[1].trailing"),
	PT_CASE(pool_object_bytes_0, "pools[0].object_bytes"),
	PT_CASE(pool_object_bytes_big, "pools[0].object_bytes"),
	PT_CASE(pool_schema_unterminated, "pools[0].schema"),
	PT_CASE(region_pool, "regions[1].pool"),
	PT_CASE(region_kind_0, "regions[0].kind"),
	PT_CASE(region_kind_5, "regions[0].kind"),
	PT_CASE(region_event_with_geometry, "regions[0]"),
	PT_CASE(region_memfd_device, "regions[0].device"),
	PT_CASE(region_event_device, "regions[0]"),
	PT_CASE(region_layout_0, "regions[0].layout"),
	PT_CASE(region_layout_5, "regions[0].layout"),
	PT_CASE(region_fd_index, "regions[1].fd_index"),
	PT_CASE(region_num_pages_0, "regions[0]"),
	PT_CASE(region_layers_0, "regions[0]"),
	PT_CASE(region_page_tokens_0, "regions[0]"),
	PT_CASE(region_token_bytes_0, "regions[0]"),
	PT_CASE(region_slots_layers, "regions[1]"),
	PT_CASE(region_slots_tokens, "regions[1]"),
	PT_CASE(region_past_size, "regions[0]"),
	PT_CASE(region_stride_overflow, "regions[0]"),
	PT_CASE(region_layer_overflow, "regions[0]"),
	PT_CASE(region_offset_overflow, "regions[0]"),
#undef PT_CASE
};

START_TEST(test_attach_decode_rejects_each_invalid_field)
{
	struct pt_attach	*a = pt_attach_new();
	char			 err[256];
	size_t			 n = strlen(pt_bad_attach[_i].field);
	int			 st;

	pt_bad_attach[_i].mut(a);
	st = pt_attach_check(a, err, sizeof(err));
	ck_assert_msg(st == PROTO_S_INVALID, "%s: status %s, err \"%s\"", pt_bad_attach[_i].name,
	    proto_status_name(st), err);
	/* The text starts with the field's name, then a colon: "layout.tp_size: ..." */
	ck_assert_msg(strncmp(err, pt_bad_attach[_i].field, n) == 0 && err[n] == ':',
	    "%s: err \"%s\" does not name %s", pt_bad_attach[_i].name, err,
	    pt_bad_attach[_i].field);
	free(a);
}
END_TEST

/* An event registration is its kind and its handle; any other field set is refused. */
START_TEST(test_event_registration_is_a_kind_and_a_handle)
{
	struct pt_attach	*a = pt_attach_new();
	struct proto_region	*r = &a->regions[1];
	char			 err[256] = "";
	size_t			 off;

	memset(r, 0, sizeof(*r));
	r->kind = PROTO_MEM_CUDA_EVENT;
	memset(r->handle, 0x3c, sizeof(r->handle));
	ck_assert_msg(pt_attach_check(a, err, sizeof(err)) == PROTO_S_OK, "%s", err);
	for (off = 0; off < offsetof(struct proto_region, handle); off++) {
		if (off == offsetof(struct proto_region, kind))
			continue;
		((uint8_t *)r)[off] = 1;
		ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
		ck_assert_str_eq(err, "regions[1]: an event registration has only a kind and a "
		    "handle; every other field must be 0");
		((uint8_t *)r)[off] = 0;
	}
	free(a);
}
END_TEST

START_TEST(test_region_geometry_at_and_past_its_bounds)
{
	struct pt_attach	*a = pt_attach_new();
	struct proto_region	*r = &a->regions[0];
	char			 err[256], want[256];

	/* The last byte of the last token of the last layer of the last page is size - 1. */
	ck_assert_uint_eq(r->size, (r->num_pages - 1) * r->page_stride +
	    (r->layers - 1) * r->layer_stride + (r->page_tokens - 1) * r->token_stride +
	    r->token_bytes);
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	r->size -= 1;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	snprintf(want, sizeof(want), "regions[0]: geometry reaches past size %llu",
	    (unsigned long long)r->size);
	ck_assert_str_eq(err, want);

	/* Each stride's product overflowing 64 bits is refused, never wrapped. */
	r->size = UINT64_MAX;
	r->page_stride = UINT64_MAX / 8;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "geometry reaches past size"));
	r->page_stride = 64 * 61 * 576;
	r->token_stride = UINT64_MAX / 32;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "geometry reaches past size"));
	/* Sums that wrap: a stride just under the top plus token_bytes. */
	r->token_stride = 0;
	r->num_pages = 2;
	r->page_stride = UINT64_MAX - 100;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "geometry reaches past size"));

	/* Inside size but offset + size wraps. */
	r->num_pages = 1;
	r->page_stride = 0;
	r->layer_stride = 0;
	r->size = 1ULL << 40;
	r->offset = UINT64_MAX - (1ULL << 39);
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_str_eq(err, "regions[0]: offset + size overflows");
	r->offset = UINT64_MAX - (1ULL << 40);
	r->layer_stride = 576;		/* a single page, but its layers and tokens apart */
	r->token_stride = 61 * 576;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	free(a);
}
END_TEST

/*
 * Issue 11 item 2: a geometry under which two distinct indices reach a
 * common byte is refused, for every kind of region. The slot region with
 * a stride under a slot (0 included) let canonical slot 1 overwrite live
 * slot 0.
 */
START_TEST(test_region_geometry_with_aliasing_indices_is_refused)
{
	struct pt_attach	*a = pt_attach_new();
	struct proto_region	*kv = &a->regions[0], *sl = &a->regions[1];
	char			 err[256];

	/* Slots: stride 0 and stride half a slot; one slot's stride is never used. */
	sl->page_stride = 0;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_str_eq(err, "regions[1]: page_stride 0 is under the 4096 bytes one slot spans, "
	    "so two slots would overlap");
	sl->page_stride = 2048;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_str_eq(err, "regions[1]: page_stride 2048 is under the 4096 bytes one slot spans, "
	    "so two slots would overlap");
	sl->page_stride = 4095;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	sl->page_stride = 4096;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	sl->page_stride = 8192;		/* gaps between slots are fine */
	sl->size = 8 * 8192;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	sl->num_pages = 1;
	sl->page_stride = 0;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	sl->num_pages = 8;
	sl->page_stride = 4096;

	/* page_first (tokens x layers x 576): each stride one below its span. */
	kv->layer_stride = 575;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_str_eq(err, "regions[0]: layer_stride 575 is under the 576 bytes one layer "
	    "spans, so two layers would overlap");
	kv->layer_stride = 576;
	kv->token_stride = 61 * 576 - 1;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_str_eq(err, "regions[0]: token_stride 35135 is under the 35136 bytes one token "
	    "spans, so two tokens would overlap");
	kv->token_stride = 61 * 576;
	kv->page_stride = 64 * 61 * 576 - 1;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_str_eq(err, "regions[0]: page_stride 2248703 is under the 2248704 bytes one page "
	    "spans, so two pages would overlap");
	kv->page_stride = 0;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "regions[0]: page_stride 0 is under"));
	/* Two dimensions on one stride alias. */
	kv->page_stride = 576;
	kv->layer_stride = 576;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "would overlap"));

	/* layer_first: per layer, pages x tokens x 576; layers far apart. */
	kv->layout = PROTO_LAYOUT_LAYER_FIRST;
	kv->token_stride = 576;
	kv->page_stride = 64 * 576;
	kv->layer_stride = 16ULL * 64 * 576;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	kv->layer_stride = 15ULL * 64 * 576;	/* layer l's last page is layer l+1's first */
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_ptr_nonnull(strstr(err, "regions[0]: layer_stride"));

	/* page_first_direct: page: layers x tokens x 576. */
	kv->layout = PROTO_LAYOUT_PAGE_FIRST_DIRECT;
	kv->token_stride = 576;
	kv->layer_stride = 64 * 576;
	kv->page_stride = 61ULL * 64 * 576;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_OK);
	kv->token_stride = 0;
	ck_assert_int_eq(pt_attach_check(a, err, sizeof(err)), PROTO_S_INVALID);
	ck_assert_str_eq(err, "regions[0]: token_stride 0 is under the 576 bytes one token spans, "
	    "so two tokens would overlap");
	free(a);
}
END_TEST

/*
 * The aliasing check agrees with brute force: over small random
 * geometries, proto_region_alias says disjoint exactly when no two
 * cells share a byte, or refuses (never accepts an aliasing one).
 */
START_TEST(test_region_alias_check_never_accepts_overlapping_cells)
{
	struct proto_region	r;
	uint64_t		stride, span, cell[512];
	unsigned		iter, n, i, j, p, l, t;
	int			overlap;

	srandom(1111);
	for (iter = 0; iter < 20000; iter++) {
		memset(&r, 0, sizeof(r));
		r.num_pages = 1 + (uint32_t)random() % 8;
		r.layers = 1 + (uint32_t)random() % 8;
		r.page_tokens = 1 + (uint32_t)random() % 8;
		r.token_bytes = 1 + (uint32_t)random() % 8;
		r.page_stride = (uint64_t)random() % 200;
		r.layer_stride = (uint64_t)random() % 40;
		r.token_stride = (uint64_t)random() % 20;
		n = 0;
		for (p = 0; p < r.num_pages; p++)
			for (l = 0; l < r.layers; l++)
				for (t = 0; t < r.page_tokens; t++)
					cell[n++] = p * r.page_stride + l * r.layer_stride +
					    t * r.token_stride;
		overlap = 0;
		for (i = 0; i < n && !overlap; i++)
			for (j = i + 1; j < n && !overlap; j++)
				overlap = (cell[i] > cell[j] ? cell[i] - cell[j] : cell[j] - cell[i]) <
				    r.token_bytes;
		if (overlap)
			ck_assert_int_ge(proto_region_alias(&r, &stride, &span), 0);
	}
}
END_TEST

START_TEST(test_attach_length_saturates)
{
	ck_assert_uint_eq(proto_attach_length(0, 0, 0), sizeof(struct proto_attach));
	ck_assert_uint_eq(proto_attach_length(255, 65535, UINT32_MAX), UINT32_MAX);
	ck_assert_uint_eq(proto_attach_length(1, 1, 1), 280 + 96 + 128 + 4);
}
END_TEST

START_TEST(test_string_ok)
{
	char	s[4];

	ck_assert(proto_string_ok("abc", 4, 0));
	ck_assert(!proto_string_ok("", 4, 0));
	ck_assert(proto_string_ok("", 4, 1));
	memcpy(s, "abcd", 4);
	ck_assert(!proto_string_ok(s, 4, 1));
	ck_assert(!proto_string_ok("a\x7f", 4, 1));
	ck_assert(!proto_string_ok("a\tb", 4, 1));
	/* Bytes after the NUL are padding and not looked at. */
	memcpy(s, "a\0\x01\xff", 4);
	ck_assert(proto_string_ok(s, 4, 0));
}
END_TEST

START_TEST(test_status_tables_are_total)
{
	unsigned	s, t;

	for (s = 0; s < PROTO_S__MAX; s++) {
		/* 29-31 and 36-39 are not assigned. */
		if (((s >= 29 && s <= 31) || (s >= 36 && s <= 39)) &&
		    strcmp(proto_status_name(s), "unknown") == 0)
			continue;
		ck_assert_msg(strcmp(proto_status_name(s), "unknown") != 0, "status %u has no name", s);
		ck_assert_msg(strcmp(proto_status_text(s), "unknown status") != 0,
		    "status %u has no text", s);
		if (s == PROTO_S_OK)
			ck_assert_int_eq(proto_status_errno(s), 0);
		else
			ck_assert_msg(proto_status_errno(s) < 0, "status %u maps to no errno", s);
		for (t = 0; t < s; t++)
			ck_assert_msg(strcmp(proto_status_name(s), proto_status_name(t)) != 0,
			    "statuses %u and %u share a name", t, s);
	}
	ck_assert_str_eq(proto_status_name(PROTO_S__MAX), "unknown");
	ck_assert_str_eq(proto_status_text(9999), "unknown status");
	ck_assert_int_eq(proto_status_errno(PROTO_S__MAX), -EPROTO);
	ck_assert_int_eq(proto_status_errno(PROTO_S_INVALID), -EINVAL);
	ck_assert_int_eq(proto_status_errno(PROTO_S_TOO_BIG), -EMSGSIZE);
	ck_assert_int_eq(proto_status_errno(PROTO_S_TIMEOUT), -ETIMEDOUT);
}
END_TEST

START_TEST(test_type_names_and_requests)
{
	static const unsigned	served[] = { PROTO_T_HELLO, PROTO_T_ATTACH, PROTO_T_DETACH,
	    PROTO_T_STATS, PROTO_T_HEALTH, PROTO_T_PROBE, PROTO_T_ADMIT, PROTO_T_RESTORE,
	    PROTO_T_CANCEL, PROTO_T_RELEASE, PROTO_T_PUBLISH, PROTO_T_DEBUG, PROTO_T_RELOAD,
	    PROTO_T_LIST };
	unsigned		t;

	for (t = 0; t < sizeof(served) / sizeof(served[0]); t++)
		ck_assert(proto_type_is_request(served[t]));
	/* The cache operations' numbers are named whether or not they are served yet. */
	for (t = PROTO_T_PROBE; t <= PROTO_T_SET_POLICY; t++)
		ck_assert_str_ne(proto_type_name(t), "UNKNOWN");
	ck_assert_str_eq(proto_type_name(PROTO_T_DEBUG), "DEBUG");
	ck_assert(proto_type_is_request(PROTO_T_SET_POLICY));
	ck_assert(!proto_type_is_request(23));
	ck_assert_str_eq(proto_type_name(PROTO_T_RELOAD), "RELOAD");
	ck_assert_str_eq(proto_type_name(PROTO_T_LIST), "LIST");
	/* the operators' range: 24 and 25 served, 26-31 reserved */
	for (t = 26; t <= 31; t++)
		ck_assert(!proto_type_is_request(t));
	ck_assert(!proto_type_is_request(0));
	ck_assert(!proto_type_is_request(6));
	ck_assert(!proto_type_is_request(PROTO_T_ERROR));
	ck_assert_str_eq(proto_type_name(PROTO_T_ERROR), "ERROR");
	ck_assert_str_eq(proto_type_name(6), "UNKNOWN");
}
END_TEST

/* Each channel serves its own types: the seam conn.c checks per connection. */
START_TEST(test_channels_serve_their_own_types)
{
	static const unsigned	peer[] = { PROTO_T_PEER_HELLO, PROTO_T_PEER_AUTH, PROTO_T_PEER_PING,
	    PROTO_T_PEER_PROBE, PROTO_T_PEER_LEASE, PROTO_T_PEER_RELEASE, PROTO_T_PEER_OFFER };
	struct proto_hdr	h;
	uint8_t			buf[2 * sizeof(struct proto_peer_obj) + 64];
	uint32_t		n;
	unsigned		t, i;

	for (i = 0; i < sizeof(peer) / sizeof(peer[0]); i++) {
		ck_assert(peer[i] >= 48 && peer[i] <= 63);
		ck_assert(proto_type_served(peer[i], PROTO_CHAN_PEER));
		ck_assert(!proto_type_served(peer[i], PROTO_CHAN_ENGINE));
		ck_assert(!proto_type_is_request(peer[i]));
		ck_assert_str_ne(proto_type_name(peer[i]), "UNKNOWN");
		proto_hdr_init(&h, peer[i], 0, 1);
		ck_assert_int_eq(proto_hdr_check(&h, 4096), PROTO_S_BAD_TYPE);
		ck_assert_int_eq(proto_hdr_check_chan(&h, 4096, PROTO_CHAN_PEER), PROTO_S_OK);
		/* Replies come both ways on the peer channel, with their status. */
		h.flags = PROTO_F_REPLY;
		h.status = PROTO_S_PEER_UNKNOWN;
		ck_assert_int_eq(proto_hdr_check_chan(&h, 4096, PROTO_CHAN_PEER), PROTO_S_OK);
		ck_assert_int_eq(proto_payload_check_chan(&h, NULL, PROTO_CHAN_PEER), 0);
		ck_assert_int_eq(proto_hdr_check(&h, 4096), PROTO_S_BAD_FLAGS);
		/* Never fds, never a status on a request. */
		h.flags = PROTO_F_FDS;
		h.status = 0;
		ck_assert_int_eq(proto_hdr_check_chan(&h, 4096, PROTO_CHAN_PEER), PROTO_S_BAD_FLAGS);
		h.flags = 0;
		h.status = 1;
		ck_assert_int_eq(proto_hdr_check_chan(&h, 4096, PROTO_CHAN_PEER), PROTO_S_BAD_FLAGS);
	}
	for (t = 0; t < PROTO_TYPES_MAX; t++) {
		if (!proto_type_is_request(t))
			continue;
		ck_assert(!proto_type_served(t, PROTO_CHAN_PEER));
		proto_hdr_init(&h, t, 0, 1);
		ck_assert_int_eq(proto_hdr_check_chan(&h, 4096, PROTO_CHAN_PEER), PROTO_S_BAD_TYPE);
	}
	ck_assert(!proto_type_served(PROTO_T_HELLO, 0));
	/* Lengths: fixed, and counted by the request's own count. */
	memset(buf, 0, sizeof(buf));
	proto_hdr_init(&h, PROTO_T_PEER_HELLO, sizeof(struct proto_peer_hello), 1);
	ck_assert_int_eq(proto_payload_check_chan(&h, buf, PROTO_CHAN_PEER), 0);
	h.length--;
	ck_assert_int_eq(proto_payload_check_chan(&h, buf, PROTO_CHAN_PEER), PROTO_S_BAD_LENGTH);
	n = 1;
	memcpy(buf, &n, 4);
	proto_hdr_init(&h, PROTO_T_PEER_PROBE, 8 + sizeof(struct proto_peer_key), 1);
	ck_assert_int_eq(proto_payload_check_chan(&h, buf, PROTO_CHAN_PEER), 0);
	h.length++;
	ck_assert_int_eq(proto_payload_check_chan(&h, buf, PROTO_CHAN_PEER), PROTO_S_BAD_LENGTH);
	memcpy(buf + 8, &n, 4);
	proto_hdr_init(&h, PROTO_T_PEER_LEASE, 16 + sizeof(struct proto_peer_key), 1);
	ck_assert_int_eq(proto_payload_check_chan(&h, buf, PROTO_CHAN_PEER), 0);
	proto_hdr_init(&h, PROTO_T_PEER_OFFER, 16 + sizeof(struct proto_peer_obj), 1);
	ck_assert_int_eq(proto_payload_check_chan(&h, buf, PROTO_CHAN_PEER), 0);
	h.length += sizeof(struct proto_peer_obj);
	ck_assert_int_eq(proto_payload_check_chan(&h, buf, PROTO_CHAN_PEER), PROTO_S_BAD_LENGTH);
	n = PROTO_PEER_OBJS_MAX + 1;
	memcpy(buf + 8, &n, 4);
	ck_assert_int_eq(proto_payload_check_chan(&h, buf, PROTO_CHAN_PEER), PROTO_S_BAD_LENGTH);
}
END_TEST

/*
 * A HELLO's lanes: fabric_len-byte names back to back up to the first
 * slot of zeros or the field's end; one name and zeros (a daemon from
 * before lanes) is one lane; no name, none.
 */
START_TEST(test_peer_hello_lanes)
{
	struct proto_peer_hello	h;

	memset(&h, 0, sizeof(h));
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 0);
	h.fabric_len = 16;
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 1);	/* even a name of zeros */
	memset(h.fabric, 0x11, 16);
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 1);
	memset(h.fabric + 16, 0x22, 32);
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 3);
	h.fabric[40] = 0;	/* a zero byte inside a name does not end the list */
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 3);
	memset(h.fabric + 64, 0x33, 16);	/* after the slot of zeros: not counted */
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 3);
	memset(h.fabric, 0x44, sizeof(h.fabric));
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 8);	/* the whole field */
	h.fabric_len = 28;
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 4);	/* 112 of 128 bytes: IPv6 */
	h.fabric_len = 100;
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 1);
	h.fabric_len = PROTO_PEER_ADDR_MAX + 1;
	ck_assert_uint_eq(proto_peer_hello_lanes(&h), 0);
}
END_TEST

/* The peer channel's field checks: HELLO, an object, a lease answer. */
START_TEST(test_peer_payload_checks)
{
	struct proto_peer_hello	h;
	struct proto_peer_obj	o, objs[2];
	uint8_t			buf[sizeof(struct proto_peer_lease) + sizeof(objs)];
	struct proto_peer_lease	lh = { 7, 2, 0 };

	memset(&h, 0, sizeof(h));
	h.version_min = h.version_max = 1;
	snprintf(h.id, sizeof(h.id), "node-a");
	snprintf(h.role, sizeof(h.role), "decode");
	h.incarnation = 1;
	h.nmr = 1;
	h.mr[0].raddr = 4096;
	h.mr[0].len = 4096;
	ck_assert_int_eq(proto_peer_hello_check(&h), PROTO_S_OK);
	h.incarnation = 0;
	ck_assert_int_eq(proto_peer_hello_check(&h), PROTO_S_INVALID);
	h.incarnation = 1;
	h.mr[0].raddr = UINT64_MAX - 10;
	ck_assert_int_eq(proto_peer_hello_check(&h), PROTO_S_INVALID);
	h.mr[0].raddr = 4096;
	h.nmr = PROTO_PEER_KEYS_MAX + 1;
	ck_assert_int_eq(proto_peer_hello_check(&h), PROTO_S_INVALID);
	h.nmr = 1;
	h.fabric_len = PROTO_PEER_ADDR_MAX + 1;
	ck_assert_int_eq(proto_peer_hello_check(&h), PROTO_S_INVALID);
	h.fabric_len = 0;
	memset(h.id, 'x', sizeof(h.id));	/* unterminated */
	ck_assert_int_eq(proto_peer_hello_check(&h), PROTO_S_INVALID);
	snprintf(h.id, sizeof(h.id), "node-a");
	h.version_min = h.version_max = 2;
	ck_assert_int_eq(proto_peer_hello_check(&h), PROTO_S_BAD_VERSION);
	/* Its dump names who speaks, with a forged byte made harmless. */
	{
		struct proto_hdr	hd;
		char			line[512];

		h.role[1] = '\n';
		proto_hdr_init(&hd, PROTO_T_PEER_HELLO, sizeof(h), 5);
		proto_dump(&hd, &h, line, sizeof(line));
		ck_assert_ptr_nonnull(strstr(line, "PEER_HELLO seq=5"));
		ck_assert_ptr_nonnull(strstr(line, "id=\"node-a\" role=\"d?code\" incarnation="));
		snprintf(h.role, sizeof(h.role), "decode");
	}

	memset(&o, 0, sizeof(o));
	ck_assert_int_eq(proto_peer_obj_check(&o), PROTO_S_OK);	/* absent: zeros */
	o.len = 1;
	ck_assert_int_eq(proto_peer_obj_check(&o), PROTO_S_INVALID);
	o.present = 1;
	o.len = 4096;
	o.raddr = 8192;
	ck_assert_int_eq(proto_peer_obj_check(&o), PROTO_S_OK);
	o.len = (1ULL << 30) + 1;
	ck_assert_int_eq(proto_peer_obj_check(&o), PROTO_S_INVALID);
	o.len = 4096;
	o.present = 2;
	ck_assert_int_eq(proto_peer_obj_check(&o), PROTO_S_INVALID);
	o.present = 1;
	o.key.pad = 1;
	ck_assert_int_eq(proto_peer_obj_check(&o), PROTO_S_INVALID);
	o.key.pad = 0;

	objs[0] = o;
	memset(&objs[1], 0, sizeof(objs[1]));
	memcpy(buf, &lh, sizeof(lh));
	memcpy(buf + sizeof(lh), objs, sizeof(objs));
	ck_assert_int_eq(proto_peer_lease_reply_check(buf, sizeof(buf), 7, 2), PROTO_S_OK);
	ck_assert_int_eq(proto_peer_lease_reply_check(buf, sizeof(buf), 8, 2), PROTO_S_INVALID);
	ck_assert_int_eq(proto_peer_lease_reply_check(buf, sizeof(buf) - 1, 7, 2),
	    PROTO_S_BAD_LENGTH);
	ck_assert_int_eq(proto_peer_lease_reply_check(buf, sizeof(buf), 7, 1), PROTO_S_BAD_LENGTH);
	buf[sizeof(lh) + sizeof(o) + 60] = 1;	/* the absent object's len */
	ck_assert_int_eq(proto_peer_lease_reply_check(buf, sizeof(buf), 7, 2), PROTO_S_INVALID);
}
END_TEST

START_TEST(test_dump_names_every_type)
{
	static const unsigned	types[] = { PROTO_T_HELLO, PROTO_T_ATTACH, PROTO_T_DETACH,
	    PROTO_T_STATS, PROTO_T_HEALTH, PROTO_T_PROBE, PROTO_T_ADMIT, PROTO_T_RESTORE,
	    PROTO_T_CANCEL, PROTO_T_RELEASE, PROTO_T_PUBLISH, PROTO_T_SET_POLICY, PROTO_T_DEBUG,
	    PROTO_T_RELOAD, PROTO_T_LIST, PROTO_T_ERROR };
	struct proto_hdr	h;
	char			buf[512];
	size_t			i, n;

	for (i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		proto_hdr_init(&h, types[i], 0, 7);
		n = proto_dump(&h, NULL, buf, sizeof(buf));
		ck_assert_uint_eq(n, strlen(buf));
		ck_assert_msg(strncmp(buf, proto_type_name(types[i]), strlen(proto_type_name(types[i])))
		    == 0, "dump \"%s\" does not start with its type", buf);
		ck_assert_ptr_nonnull(strstr(buf, "seq=7"));
	}
	proto_hdr_init(&h, 300, 0, 1);
	proto_dump(&h, NULL, buf, sizeof(buf));
	ck_assert_str_eq(buf, "UNKNOWN seq=1 len=0 flags=0x0 status=ok");
}
END_TEST

START_TEST(test_dump_decodes_payloads)
{
	struct pt_attach	*a = pt_attach_new();
	struct proto_hello	 hello = pt_hello(1, 1, "engine");
	struct proto_hdr	 h;
	uint8_t			*buf;
	uint32_t		 len;
	char			 out[512];

	pt_dump_hello(&hello, out, sizeof(out));
	ck_assert_str_eq(out,
	    "HELLO seq=1 len=40 flags=0x0 status=ok versions=1..1 client=\"engine\"");

	buf = pt_attach_encode(a, &len);
	proto_hdr_init(&h, PROTO_T_ATTACH, len, 2);
	h.flags = PROTO_F_FDS;
	proto_dump(&h, buf, out, sizeof(out));
	ck_assert_str_eq(out, "ATTACH seq=2 len=736 flags=0x2 status=ok model=\"deepseek-v3\" "
	    "group=\"engine-0\" rank=1/2 tp=2 dcp=1/2 pools=2 regions=2 live=2");
	free(buf);

	proto_hdr_init(&h, PROTO_T_STATS, 11, 3);
	h.flags = PROTO_F_REPLY;
	h.status = PROTO_S_BUSY;
	proto_dump(&h, "daemon busy", out, sizeof(out));
	ck_assert_str_eq(out, "STATS reply seq=3 len=11 flags=0x1 status=busy msg=\"daemon busy\"");
	free(a);
}
END_TEST

START_TEST(test_dump_truncates_into_small_buffers)
{
	struct proto_hdr	h;
	char			full[512], small[16], mid[56];
	size_t			n;

	proto_hdr_init(&h, PROTO_T_STATS, 11, 3);
	h.flags = PROTO_F_REPLY;
	h.status = PROTO_S_BUSY;
	n = proto_dump(&h, "daemon busy", full, sizeof(full));
	ck_assert_uint_eq(n, strlen(full));
	/* Like snprintf: a count >= the buffer's size says it was cut; always NUL-terminated. */
	memset(small, 'x', sizeof(small));
	ck_assert_uint_ge(proto_dump(&h, "daemon busy", small, sizeof(small)), sizeof(small));
	ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
	ck_assert(strncmp(small, full, sizeof(small) - 1) == 0);
	/* Cut inside the payload's part: the count is the whole line's. */
	ck_assert_uint_eq(proto_dump(&h, "daemon busy", mid, sizeof(mid)), n);
	ck_assert_uint_eq(strlen(mid), sizeof(mid) - 1);
	ck_assert_uint_ge(proto_dump(&h, "daemon busy", NULL, 0), 1);
}
END_TEST

/* Fixed bug: a client's name with a newline forged a second log line. */
START_TEST(test_dump_keeps_client_bytes_on_one_line)
{
	struct proto_hello	hello = pt_hello(0, 1, "x\n2026 info fake\"\x1b");
	struct proto_hdr	h;
	char			out[512];

	pt_dump_hello(&hello, out, sizeof(out));
	ck_assert_str_eq(out,
	    "HELLO seq=1 len=40 flags=0x0 status=ok versions=0..1 client=\"x?2026 info fake??\"");
	proto_hdr_init(&h, PROTO_T_HELLO, 3, 1);
	h.flags = PROTO_F_REPLY;
	h.status = PROTO_S_INVALID;
	proto_dump(&h, "a\nb", out, sizeof(out));
	ck_assert_ptr_null(strchr(out, '\n'));
}
END_TEST

/* Fixed bug: the HELLO dump read the payload as an aligned struct. */
START_TEST(test_dump_reads_unaligned_payloads)
{
	struct proto_hello	hello = pt_hello(1, 1, "odd");
	uint8_t			raw[sizeof(hello) + 1];
	char			out[512];

	memcpy(raw + 1, &hello, sizeof(hello));
	pt_dump_hello(raw + 1, out, sizeof(out));
	ck_assert_ptr_nonnull(strstr(out, "versions=1..1 client=\"odd\""));
}
END_TEST

/* LIST's fields: a known what, no flags; any max (the daemon caps it). */
START_TEST(test_list_check_fields)
{
	struct proto_list	l = { PROTO_LIST_NAMESPACES, 0, 0 };
	struct proto_hdr	h;
	char			buf[256];

	ck_assert_uint_eq(sizeof(l), 8);
	ck_assert_uint_eq(offsetof(struct proto_list, max), 4);
	for (l.what = 0; l.what < 8; l.what++)
		ck_assert_int_eq(proto_list_check(&l), l.what >= 1 && l.what <= 3 ? PROTO_S_OK :
		    PROTO_S_INVALID);
	ck_assert_str_eq(proto_list_name(PROTO_LIST_NAMESPACES), "namespaces");
	ck_assert_str_eq(proto_list_name(PROTO_LIST_GROUPS), "groups");
	ck_assert_str_eq(proto_list_name(PROTO_LIST_LEASES), "leases");
	ck_assert_ptr_null(proto_list_name(0));
	ck_assert_ptr_null(proto_list_name(4));
	l.what = PROTO_LIST_LEASES;
	l.flags = 1;
	ck_assert_int_eq(proto_list_check(&l), PROTO_S_INVALID);
	l.flags = 0;
	l.max = UINT32_MAX;
	ck_assert_int_eq(proto_list_check(&l), PROTO_S_OK);
	/* the dump names what is asked */
	l.max = 5;
	proto_hdr_init(&h, PROTO_T_LIST, sizeof(l), 3);
	proto_dump(&h, &l, buf, sizeof(buf));
	ck_assert_str_eq(buf, "LIST seq=3 len=8 flags=0x0 status=ok what=leases(3) max=5 flags=0x0");
	l.what = 77;
	proto_dump(&h, &l, buf, sizeof(buf));
	ck_assert_ptr_nonnull(strstr(buf, " what=?(77) "));
}
END_TEST

/* Every decline reason has its own name (STATS and /metrics key on it); past the list, "unknown". */
START_TEST(test_every_decline_has_a_distinct_name)
{
	unsigned	i, j;

	for (i = 0; i < PROTO_DECLINE__MAX; i++) {
		ck_assert_str_ne(proto_decline_name(i), "unknown");
		for (j = 0; j < i; j++)
			ck_assert_str_ne(proto_decline_name(i), proto_decline_name(j));
	}
	ck_assert_str_eq(proto_decline_name(PROTO_DECLINE_NO_RESERVATION), "no_reservation");
	ck_assert_str_eq(proto_decline_name(PROTO_DECLINE__MAX), "unknown");
}
END_TEST

Suite *
suite_proto(void)
{
	Suite	*s = suite_create("proto");
	TCase	*tc = test_tcase(s, "proto", 0, NULL, NULL);

	tcase_add_test(tc, test_hdr_init_is_a_valid_request);
	tcase_add_test(tc, test_every_decline_has_a_distinct_name);
	tcase_add_loop_test(tc, test_hdr_check_answers_each_malformed_header_exactly, 0,
	    (int)(sizeof(pt_bad_hdrs) / sizeof(pt_bad_hdrs[0])));
	tcase_add_test(tc, test_every_unserved_type_is_bad_type);
	tcase_add_test(tc, test_hdr_check_accepts_length_at_max);
	tcase_add_test(tc, test_payload_check_lengths_per_type);
	tcase_add_loop_test(tc, test_payload_check_lengths_of_cache_operations, 0,
	    (int)(sizeof(pt_cache_msgs) / sizeof(pt_cache_msgs[0])));
	tcase_add_test(tc, test_cache_structs_have_the_documented_layout);
	tcase_add_test(tc, test_hello_round_trip);
	tcase_add_test(tc, test_hello_check_picks_the_highest_common_version);
	tcase_add_test(tc, test_hello_check_rejects_each_bad_field);
	tcase_add_test(tc, test_reply_structs_round_trip);
	tcase_add_test(tc, test_attach_decode_accepts_a_valid_attach);
	tcase_add_loop_test(tc, test_attach_decode_rejects_each_invalid_field, 0,
	    (int)(sizeof(pt_bad_attach) / sizeof(pt_bad_attach[0])));
	tcase_add_test(tc, test_region_geometry_at_and_past_its_bounds);
	tcase_add_test(tc, test_region_geometry_with_aliasing_indices_is_refused);
	tcase_add_test(tc, test_region_alias_check_never_accepts_overlapping_cells);
	tcase_add_test(tc, test_event_registration_is_a_kind_and_a_handle);
	tcase_add_test(tc, test_attach_length_saturates);
	tcase_add_test(tc, test_string_ok);
	tcase_add_test(tc, test_status_tables_are_total);
	tcase_add_test(tc, test_channels_serve_their_own_types);
	tcase_add_test(tc, test_peer_payload_checks);
	tcase_add_test(tc, test_peer_hello_lanes);
	tcase_add_test(tc, test_type_names_and_requests);
	tcase_add_test(tc, test_dump_names_every_type);
	tcase_add_test(tc, test_dump_decodes_payloads);
	tcase_add_test(tc, test_dump_truncates_into_small_buffers);
	tcase_add_test(tc, test_dump_keeps_client_bytes_on_one_line);
	tcase_add_test(tc, test_dump_reads_unaligned_payloads);
	tcase_add_test(tc, test_list_check_fields);
	return s;
}
