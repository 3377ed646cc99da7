/*
 * l3kv wire protocol, version 1: shared by the daemon and libl3kv.
 *
 * A frame is a fixed 24-byte header followed by `length` payload bytes.
 * Payloads are packed little-endian structures whose sizes are asserted
 * below, followed by counted arrays whose counts live in the fixed part.
 * Every structure is laid out with explicit padding so that the C layout
 * and the wire layout are the same on a little-endian host; the build
 * refuses big-endian hosts rather than byte-swapping.
 *
 * This module is pure: encode, decode, validate and dump. No I/O.
 * proto/PROTOCOL.md documents every message.
 */
#ifndef L3KV_PROTO_H
#define L3KV_PROTO_H

#include <stddef.h>
#include <stdint.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
    "the l3kv wire format is little-endian; big-endian hosts are unsupported");

#define PROTO_MAGIC		0x564b334cU	/* "L3KV" read as bytes */
#define PROTO_VERSION		1
#define PROTO_VERSION_MIN	1
#define PROTO_VERSION_MAX	1

/* The daemon's ceiling; the configured limit may only be lower. */
#define PROTO_FRAME_MAX		(64U << 20)
#define PROTO_FRAME_MIN		(64U << 10)
#define PROTO_FDS_MAX		16	/* fds one frame may carry */
#define PROTO_ERRMSG_MAX	200	/* bytes of text in an error reply */

struct proto_hdr {
	uint32_t	magic;		/* PROTO_MAGIC */
	uint16_t	version;	/* PROTO_VERSION */
	uint16_t	type;		/* PROTO_T_* */
	uint16_t	flags;		/* PROTO_F_* */
	uint16_t	status;		/* PROTO_S_*, replies only */
	uint32_t	length;		/* payload bytes after the header */
	uint64_t	seq;		/* chosen by the client, echoed in the reply */
};
_Static_assert(sizeof(struct proto_hdr) == 24, "proto_hdr is 24 bytes");

#define PROTO_F_REPLY		0x0001	/* sent by the daemon */
#define PROTO_F_FDS		0x0002	/* the frame's first byte carried SCM_RIGHTS fds */
#define PROTO_F_KNOWN		(PROTO_F_REPLY | PROTO_F_FDS)

/*
 * Message types. Numbers are never reused. Replies carry the request's
 * type with PROTO_F_REPLY; a frame the daemon could not attribute to a
 * type (bad header) is answered with PROTO_T_ERROR.
 */
enum proto_type {
	PROTO_T_HELLO		= 1,
	PROTO_T_ATTACH		= 2,
	PROTO_T_DETACH		= 3,
	PROTO_T_STATS		= 4,
	PROTO_T_HEALTH		= 5,
	/* The cache operations: numbers fixed in v1, payloads in issue 3. */
	PROTO_T_PROBE		= 16,
	PROTO_T_ADMIT		= 17,
	PROTO_T_RESTORE		= 18,
	PROTO_T_CANCEL		= 19,
	PROTO_T_RELEASE		= 20,
	PROTO_T_PUBLISH		= 21,
	PROTO_T_SET_POLICY	= 22,
	PROTO_T_ERROR		= 255,
};

/* Reply status codes. Numbers are never reused. */
enum proto_status {
	PROTO_S_OK		= 0,
	PROTO_S_BAD_MAGIC	= 1,	/* header magic is not PROTO_MAGIC */
	PROTO_S_BAD_VERSION	= 2,	/* header or HELLO version unsupported */
	PROTO_S_TOO_BIG		= 3,	/* length over the configured maximum */
	PROTO_S_BAD_TYPE	= 4,	/* unknown or reply-only type */
	PROTO_S_BAD_LENGTH	= 5,	/* payload length wrong for the type */
	PROTO_S_SHORT_HEADER	= 6,	/* stream ended inside a header */
	PROTO_S_TRUNCATED	= 7,	/* stream ended inside a payload */
	PROTO_S_UNEXPECTED_FDS	= 8,	/* fds on a frame that takes none */
	PROTO_S_DENIED		= 9,	/* peer credentials not allowed */
	PROTO_S_LIMIT		= 10,	/* connection cap reached */
	PROTO_S_INVALID		= 11,	/* a field's value is out of range */
	PROTO_S_STATE		= 12,	/* not allowed in this connection state */
	PROTO_S_GUARD		= 13,	/* a policy guard refused; nothing changed */
	PROTO_S_NO_MEMORY	= 14,
	PROTO_S_INTERNAL	= 15,
	PROTO_S_BAD_REGION	= 16,	/* memory registration unusable */
	PROTO_S_BAD_FLAGS	= 17,	/* unknown header flag bits */
	PROTO_S_SHUTTING_DOWN	= 18,
	/* Used by the cache operations (issue 3). */
	PROTO_S_OUT_OF_BOUNDS	= 19,
	PROTO_S_NOT_FOUND	= 20,
	PROTO_S_EXPIRED		= 21,
	PROTO_S_LOST		= 22,
	PROTO_S_CANCELLED	= 23,
	PROTO_S_NO_SPACE	= 24,
	PROTO_S_BUSY		= 25,
	PROTO_S_TIMEOUT		= 26,
	PROTO_S_GROUP_MISMATCH	= 27,	/* ATTACH disagrees with its group */
	PROTO_S__MAX
};

/* Fixed-size strings are NUL-padded and must contain a NUL. */
#define PROTO_NAME_LEN		32
#define PROTO_MODEL_LEN		128
#define PROTO_GROUP_LEN		64
#define PROTO_SCHEMA_LEN	64
#define PROTO_NSNAME_LEN	96
#define PROTO_HASH_LEN		32	/* page hashes are 32 bytes on the wire */

/* HELLO: the first frame on a connection; fixes the version. */
struct proto_hello {
	uint16_t	version_min;
	uint16_t	version_max;
	uint32_t	flags;		/* none defined; must be 0 */
	char		client[PROTO_NAME_LEN];
};
_Static_assert(sizeof(struct proto_hello) == 40, "proto_hello");

#define PROTO_CAP_HOST_COPY	0x0001	/* memfd regions, host copy engine */
#define PROTO_CAP_CUDA_COPY	0x0002	/* a GPU was found at start */
#define PROTO_CAP_NONBLOCK	0x0004	/* replies may come out of order */

struct proto_hello_reply {
	uint16_t	version;	/* the version the connection uses */
	uint16_t	pad;
	uint32_t	caps;		/* PROTO_CAP_* */
	uint32_t	max_frame;	/* the daemon's configured frame limit */
	uint32_t	lease_ttl_ms;
	char		server[PROTO_NAME_LEN];
	char		role[PROTO_NAME_LEN];
};
_Static_assert(sizeof(struct proto_hello_reply) == 80, "proto_hello_reply");

/* Layout enums. */
enum proto_host_layout {
	PROTO_LAYOUT_PAGE_FIRST		= 1,	/* page: tokens x layers x bytes */
	PROTO_LAYOUT_LAYER_FIRST	= 2,	/* per layer: pages x tokens x bytes */
	PROTO_LAYOUT_PAGE_FIRST_DIRECT	= 3,	/* page: layers x tokens x bytes */
	PROTO_LAYOUT_SLOTS		= 4,	/* state slots: slot x bytes */
};

enum proto_attention {
	PROTO_ATTN_MLA		= 1,
	PROTO_ATTN_MHA		= 2,
	PROTO_ATTN_GQA		= 3,
};

enum proto_pool_kind {
	PROTO_POOL_KV		= 1,
	PROTO_POOL_STATE	= 2,
	PROTO_POOL_SIDECAR	= 3,
};

enum proto_hit_policy {
	PROTO_HIT_ALL_PAGES	= 1,
	PROTO_HIT_TRAILING	= 2,	/* trailing_pages(n) */
};

enum proto_prefetch {
	PROTO_PREFETCH_WAIT_COMPLETE	= 1,
	PROTO_PREFETCH_BEST_EFFORT	= 2,
	PROTO_PREFETCH_TIMEOUT		= 3,
};

enum proto_write {
	PROTO_WRITE_THROUGH	= 1,
	PROTO_WRITE_BACK	= 2,
	PROTO_WRITE_OFFLOAD	= 3,	/* decode KV offload */
};

enum proto_mem_kind {
	PROTO_MEM_MEMFD		= 1,	/* host shared memory, fd by SCM_RIGHTS */
	PROTO_MEM_CUDA_IPC	= 2,	/* legacy cudaIpcMemHandle_t in `handle` */
	PROTO_MEM_CUMEM_FD	= 3,	/* cuMem POSIX fd by SCM_RIGHTS */
};

#define PROTO_POOLS_MAX		8
#define PROTO_REGIONS_MAX	64
#define PROTO_LIVE_MAX		65536
#define PROTO_GROUP_SIZE_MAX	1024
#define PROTO_RANK_MAX		4096	/* each of tp/dcp/pp/cp sizes */

/* Everything that shapes bytes; hashed into the namespace fingerprint. */
struct proto_layout {
	char		model[PROTO_MODEL_LEN];
	char		kv_dtype[16];	/* "fp8_e4m3", "fp8_e5m2", "bf16", ... */
	char		hash_scheme[16];/* "sha256" or an engine scheme name */
	uint16_t	tp_size;
	uint16_t	dcp_size;
	uint16_t	pp_size;
	uint16_t	cp_size;
	uint16_t	dcp_rank;	/* selects a KV shard under MLA + DCP */
	uint16_t	pp_rank;	/* selects the stage's layers */
	uint8_t		host_layout;	/* proto_host_layout of stored objects */
	uint8_t		attention;	/* proto_attention */
	uint8_t		hash_len;	/* engine hash bytes, 1..32, zero-padded */
	uint8_t		npools;		/* proto_pool entries that follow ATTACH */
	uint32_t	page_tokens;	/* physical page */
	uint32_t	logical_page_tokens;
	uint64_t	seed;		/* namespace seed */
};
_Static_assert(sizeof(struct proto_layout) == 192, "proto_layout");

struct proto_pool {
	char		name[16];	/* "kv", "state", "swa", "indexer" */
	uint8_t		kind;		/* proto_pool_kind */
	uint8_t		hit_policy;	/* proto_hit_policy */
	uint16_t	trailing;	/* n of trailing_pages(n) */
	uint32_t	layers;
	uint64_t	object_bytes;	/* bytes of one object of this pool */
	char		schema[PROTO_SCHEMA_LEN];
};
_Static_assert(sizeof(struct proto_pool) == 96, "proto_pool");

/*
 * A memory registration. Byte (page p, layer l, token t) of a page-shaped
 * region lives at offset + p*page_stride + l*layer_stride + t*token_stride,
 * token_bytes long. A state-slot region uses PROTO_LAYOUT_SLOTS with
 * num_pages slots of token_bytes each, page_stride apart.
 */
struct proto_region {
	uint16_t	pool;		/* index into the ATTACH pool list */
	uint8_t		kind;		/* proto_mem_kind */
	uint8_t		layout;		/* proto_host_layout */
	uint16_t	fd_index;	/* which SCM_RIGHTS fd (memfd, cumem) */
	uint16_t	pad;
	uint64_t	offset;		/* into the allocation */
	uint64_t	size;		/* bytes usable from offset */
	uint32_t	num_pages;
	uint32_t	page_tokens;
	uint32_t	layers;
	uint32_t	token_bytes;
	uint64_t	page_stride;
	uint64_t	layer_stride;
	uint64_t	token_stride;
	uint8_t		handle[64];	/* cudaIpcMemHandle_t for PROTO_MEM_CUDA_IPC */
};
_Static_assert(sizeof(struct proto_region) == 128, "proto_region");

/*
 * ATTACH: followed by layout.npools proto_pool, nregions proto_region and
 * nlive uint32_t live state-slot indices, in that order.
 */
struct proto_attach {
	struct proto_layout layout;
	char		group[PROTO_GROUP_LEN];
	uint16_t	group_size;
	uint16_t	group_rank;	/* this engine's index in the group */
	uint16_t	tp_rank;
	uint8_t		prefetch;	/* proto_prefetch */
	uint8_t		write;		/* proto_write */
	uint32_t	prefetch_timeout_ms;
	uint16_t	nregions;
	uint16_t	pad;
	uint32_t	nlive;
	uint32_t	pad2;
};
_Static_assert(sizeof(struct proto_attach) == 280, "proto_attach");

struct proto_attach_reply {
	uint8_t		fingerprint[16];
	char		ns[PROTO_NSNAME_LEN];	/* "role/model-fingerprint" */
	uint32_t	session;		/* daemon-wide attach id */
	uint32_t	lease_ttl_ms;
	uint32_t	group_members;		/* attached ranks so far */
	uint32_t	pad;
};
_Static_assert(sizeof(struct proto_attach_reply) == 128, "proto_attach_reply");

/*
 * A frame as parsed from the stream. `payload` points into the reader's
 * buffer and is valid until the next read.
 */
struct proto_frame {
	struct proto_hdr hdr;
	const uint8_t	*payload;
	int		 fds[PROTO_FDS_MAX];
	int		 nfds;
};

/* ATTACH decoded in place: views into the payload, valid while it is. */
struct proto_attach_view {
	struct proto_attach	 fixed;
	struct proto_pool	 pools[PROTO_POOLS_MAX];
	struct proto_region	 regions[PROTO_REGIONS_MAX];
	const uint8_t		*live;	/* nlive little-endian uint32_t */
};

/* proto.c */
const char	*proto_type_name(unsigned);
const char	*proto_status_name(unsigned);
const char	*proto_status_text(unsigned);
int		 proto_status_errno(unsigned);
int		 proto_type_is_request(unsigned);
void		 proto_hdr_init(struct proto_hdr *, unsigned type, uint32_t length,
		    uint64_t seq);
int		 proto_hdr_check(const struct proto_hdr *, uint32_t max_frame);
int		 proto_payload_check(unsigned type, uint32_t length, const void *payload);
int		 proto_string_ok(const char *, size_t cap, int allow_empty);
int		 proto_hello_check(const struct proto_hello *, uint16_t *version);
int		 proto_attach_decode(const void *, uint32_t length,
		    struct proto_attach_view *, char *err, size_t errlen);
uint32_t	 proto_attach_length(uint8_t npools, uint16_t nregions, uint32_t nlive);
uint32_t	 proto_attach_live(const struct proto_attach_view *, uint32_t i);
size_t		 proto_dump(const struct proto_hdr *, const void *payload,
		    char *buf, size_t len);

#endif /* L3KV_PROTO_H */
