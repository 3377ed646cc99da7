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
	/* Operations (issue 15): 24-31. */
	PROTO_T_RELOAD		= 24,	/* re-read the config file; JSON reply */
	PROTO_T_LIST		= 25,	/* namespaces, groups or leases; JSON reply */
	/* The peer channel, daemon to daemon (48-63): section 7 of PROTOCOL.md. */
	PROTO_T_PEER_HELLO	= 48,
	PROTO_T_PEER_AUTH	= 49,
	PROTO_T_PEER_PING	= 50,
	PROTO_T_PEER_PROBE	= 51,
	PROTO_T_PEER_LEASE	= 52,
	PROTO_T_PEER_RELEASE	= 53,
	PROTO_T_PEER_OFFER	= 54,
	PROTO_T_DEBUG		= 240,	/* tests only: testing.debug_ops */
	PROTO_T_ERROR		= 255,
};
#define PROTO_TYPES_MAX		256	/* every type number is below it */

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
	PROTO_S_SLOT		= 28,	/* a live or another lease's state slot */
	/* The peer channel (32-39). */
	PROTO_S_PEER_UNKNOWN	= 32,	/* not in this daemon's member list */
	PROTO_S_PEER_AUTH	= 33,	/* the shared-secret proof is wrong */
	PROTO_S_PEER_ROLE	= 34,	/* another role, or this daemon's own id */
	PROTO_S_PEER_STALE	= 35,	/* an owner lease of another incarnation or session */
	/* 29-31 and 36-39 are not assigned. */
	PROTO_S_WRONG_DEVICE	= 40,	/* GPU memory is not on the device claimed */
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
	PROTO_MEM_CUDA_EVENT	= 4,	/* cudaIpcEventHandle_t in `handle`: not memory */
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
	uint16_t	device;		/* GPU memory: 0 any, n claims device n - 1 */
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
 * The cache operations. Page hashes are PROTO_HASH_LEN bytes on the wire;
 * an engine hash shorter than that (layout.hash_len) is zero-padded, and
 * the padding must be zero.
 */

/* PROBE: followed by npages hashes. No side effects. */
struct proto_probe {
	uint32_t	npages;
	uint16_t	pool;		/* pool index; the kv pool for now */
	uint16_t	flags;		/* none defined; must be 0 */
};
_Static_assert(sizeof(struct proto_probe) == 8, "proto_probe");

/*
 * PROBE reply: the largest legal stop point every attached rank of the
 * group holds. With a state or sidecar pool, the legal stop points
 * (ascending page counts) follow; without, nstops is 0 and every length
 * up to hit_pages is one.
 */
struct proto_probe_reply {
	uint32_t	hit_pages;
	uint32_t	nstops;		/* legal stop points that follow (u32); 0: every length */
};
_Static_assert(sizeof(struct proto_probe_reply) == 8, "proto_probe_reply");

/* ADMIT: followed by npages hashes. A group barrier on request_id. */
struct proto_admit {
	uint64_t	request_id;	/* the same on every rank of the group */
	uint32_t	npages;
	uint32_t	reserved_pages;	/* destination pages the engine holds for the gap */
	uint32_t	state_slot;	/* canonical slot reserved; PROTO_SLOT_NONE */
	uint32_t	flags;		/* none defined; must be 0 */
};
_Static_assert(sizeof(struct proto_admit) == 24, "proto_admit");
#define PROTO_SLOT_NONE		UINT32_MAX

enum proto_decline {
	PROTO_DECLINE_NONE		= 0,
	PROTO_DECLINE_NO_HIT		= 1,	/* no common prefix */
	PROTO_DECLINE_NO_RESERVATION	= 2,	/* the engine reserved nothing */
	PROTO_DECLINE_GROUP_TIMEOUT	= 3,	/* a rank did not ask in time */
	PROTO_DECLINE_GROUP_MISMATCH	= 4,	/* ranks asked different things */
	PROTO_DECLINE_SHUTTING_DOWN	= 5,
	PROTO_DECLINE_RANK_LEFT		= 6,	/* a rank detached while waiting */
	PROTO_DECLINE_NO_SLOT		= 7,	/* state pool, but no usable canonical slot */
	PROTO_DECLINE_SLOT_BUSY		= 8,	/* the slot is outstanding for another lease */
	PROTO_DECLINE__MAX
};

struct proto_admit_reply {
	uint64_t	lease;		/* 0 when declined */
	uint32_t	admitted_pages;	/* the promise: never grows, same on every rank */
	uint16_t	decline;	/* proto_decline */
	uint16_t	pad;
	uint32_t	ttl_ms;
	uint32_t	group_hit;	/* the common hit before the reservation cap */
};
_Static_assert(sizeof(struct proto_admit_reply) == 24, "proto_admit_reply");

/*
 * RESTORE: followed by npages uint32 destination page indices. Sidecar
 * pools are restored to the same page indices in their own region; a
 * layout with a state pool names the canonical slot it admitted.
 */
struct proto_restore {
	uint64_t	lease;
	uint32_t	npages;		/* must equal the admitted pages */
	uint16_t	region;		/* the destination region (index at ATTACH) */
	uint16_t	flags;		/* PROTO_RESTORE_F_WAIT_EVENT, _F_RELEASE */
	uint16_t	state_region;	/* the slot region, PROTO_REGION_NONE without state */
	uint16_t	event_region;	/* with PROTO_RESTORE_F_WAIT_EVENT: an event region; else 0 */
	uint32_t	state_slot;	/* the canonical slot admitted */
};
_Static_assert(sizeof(struct proto_restore) == 24, "proto_restore");
#define PROTO_REGION_NONE	UINT16_MAX
/*
 * RESTORE's request flag: the copy's writes into engine memory wait (on
 * the GPU, never on the loop) for the engine's last record of the CUDA
 * IPC event registered as region event_region.
 */
#define PROTO_RESTORE_F_WAIT_EVENT	0x0001
/*
 * And: the lease ends when the RESTORE is answered ok, as if RELEASE had
 * come right after (its pins stay until every copy landed); a RESTORE
 * that fails leaves the lease as without the flag. One round trip less.
 */
#define PROTO_RESTORE_F_RELEASE		0x0002

/* SET_POLICY: the group's policies, guarded; allowed while the group is idle. */
struct proto_set_policy {
	uint8_t		prefetch;	/* proto_prefetch */
	uint8_t		write;		/* proto_write */
	uint16_t	pad;
	uint32_t	prefetch_timeout_ms;
};
_Static_assert(sizeof(struct proto_set_policy) == 8, "proto_set_policy");

#define PROTO_RESTORE_F_PARTIAL	0x0001	/* best_effort/timeout ended at its deadline */

struct proto_restore_reply {
	uint32_t	pages;		/* whole, verified, contiguous pages in place */
	uint32_t	flags;		/* PROTO_RESTORE_F_* */
	uint64_t	bytes;
};
_Static_assert(sizeof(struct proto_restore_reply) == 16, "proto_restore_reply");

/* CANCEL and RELEASE. */
struct proto_lease_op {
	uint64_t	lease;
};
_Static_assert(sizeof(struct proto_lease_op) == 8, "proto_lease_op");

struct proto_cancel_reply {
	uint32_t	pages_landed;	/* destination pages written before the cancel */
	uint32_t	pad;
};
_Static_assert(sizeof(struct proto_cancel_reply) == 8, "proto_cancel_reply");

/* PUBLISH: followed by npages proto_publish_page. */
struct proto_publish {
	uint32_t	npages;
	uint16_t	region;		/* the source region */
	uint16_t	flags;		/* none defined; must be 0 */
};
_Static_assert(sizeof(struct proto_publish) == 8, "proto_publish");

struct proto_publish_page {
	uint8_t		hash[PROTO_HASH_LEN];
	uint32_t	src_page;	/* page index in the source region */
	uint32_t	pad;
};
_Static_assert(sizeof(struct proto_publish_page) == 40, "proto_publish_page");

struct proto_publish_reply {
	uint32_t	stored;		/* new objects, now visible */
	uint32_t	present;	/* already there (or being written): not written twice */
	uint64_t	bytes;
};
_Static_assert(sizeof(struct proto_publish_reply) == 16, "proto_publish_reply");

/*
 * DEBUG: test-only fault injection, refused unless the daemon runs with
 * testing.debug_ops. Acts on this session's object for (pool, hash).
 */
struct proto_debug {
	uint32_t	op;		/* PROTO_DEBUG_* */
	uint16_t	pool;
	uint16_t	pad;
	uint8_t		hash[PROTO_HASH_LEN];
};
_Static_assert(sizeof(struct proto_debug) == 40, "proto_debug");
#define PROTO_DEBUG_DROP	1	/* remove the object, as if lost */
#define PROTO_DEBUG_CORRUPT	2	/* flip a byte of the object's data */
#define PROTO_DEBUG_KILL_ENGINE	3	/* break this session's cuda copy engine (pool, hash unused) */

#define PROTO_PAGES_MAX		65536	/* pages in one request */

/*
 * The peer channel (PROTOCOL.md section 7): TCP between the daemons of a
 * role. Either end sends requests on a connection it dialled and answers
 * those it accepted; replies carry PROTO_F_REPLY as on the engine socket.
 */
#define PROTO_PEER_ID_LEN	64
#define PROTO_PEER_PROV_LEN	32
#define PROTO_PEER_ADDR_MAX	128	/* bytes of a fabric endpoint name */
#define PROTO_PEER_KEYS_MAX	16	/* registered arena chunks named in HELLO */
#define PROTO_PEER_NONCE	16
#define PROTO_PEER_PROOF	32	/* HMAC-SHA256 */
#define PROTO_PEER_OBJS_MAX	65536	/* objects in one request */

/* A chunk of the sender's arena that peers may read. */
struct proto_peer_mr {
	uint64_t	raddr;		/* the address a read names (FI_MR_VIRT_ADDR or 0) */
	uint64_t	rkey;
	uint64_t	len;
};
_Static_assert(sizeof(struct proto_peer_mr) == 24, "proto_peer_mr");

/* PEER_HELLO, request and reply alike: who is speaking, and how to read it. */
struct proto_peer_hello {
	uint16_t	version_min;
	uint16_t	version_max;
	uint32_t	flags;		/* none defined; must be 0 */
	char		id[PROTO_PEER_ID_LEN];		/* the sender's member id */
	char		role[PROTO_NAME_LEN];
	uint64_t	incarnation;	/* random per start, never 0 */
	uint8_t		nonce[PROTO_PEER_NONCE];	/* for the other side's proof */
	uint8_t		proof[PROTO_PEER_PROOF];	/* reply: over the request's nonce */
	char		provider[PROTO_PEER_PROV_LEN];	/* "" without a data path */
	uint16_t	fabric_len;	/* bytes of one endpoint name */
	uint16_t	nmr;		/* entries of mr used */
	uint32_t	pad;
	/*
	 * Endpoint names (fi_getname) of fabric_len bytes back to back, one
	 * per lane, lane 0's first; the first slot of zeros ends them
	 * (proto_peer_hello_lanes).
	 */
	uint8_t		fabric[PROTO_PEER_ADDR_MAX];
	struct proto_peer_mr mr[PROTO_PEER_KEYS_MAX];
};
_Static_assert(sizeof(struct proto_peer_hello) == 712, "proto_peer_hello");

/* PEER_AUTH: the dialler's proof over the listener's nonce (zeros without a secret). */
struct proto_peer_auth {
	uint8_t		proof[PROTO_PEER_PROOF];
};
_Static_assert(sizeof(struct proto_peer_auth) == 32, "proto_peer_auth");

/* PEER_PING: echoed in the reply. */
struct proto_peer_ping {
	uint64_t	sent_us;
	uint64_t	incarnation;	/* reply: the answering daemon's */
};
_Static_assert(sizeof(struct proto_peer_ping) == 16, "proto_peer_ping");

/* An object's key on the peer channel: the daemons' obj_key, byte for byte. */
struct proto_peer_key {
	uint8_t		fingerprint[16];
	uint8_t		pool;
	uint8_t		pad;		/* must be 0 */
	uint16_t	shard;
	uint8_t		hash[PROTO_HASH_LEN];
};
_Static_assert(sizeof(struct proto_peer_key) == 52, "proto_peer_key");

/* PEER_PROBE: followed by nkeys keys; the reply by nkeys bytes, 1 where held. No side effects. */
struct proto_peer_probe {
	uint32_t	nkeys;
	uint32_t	flags;		/* none defined; must be 0 */
};
_Static_assert(sizeof(struct proto_peer_probe) == 8, "proto_peer_probe");

/*
 * PEER_LEASE: followed by nkeys keys. The owner pins what it holds under
 * the requester's lease id, bound to this connection, for at most
 * max_age_ms; the reply is a proto_peer_lease and nkeys proto_peer_obj.
 */
struct proto_peer_lease {
	uint64_t	lease;		/* chosen by the requester, unique on the connection */
	uint32_t	nkeys;
	uint32_t	max_age_ms;
};
_Static_assert(sizeof(struct proto_peer_lease) == 16, "proto_peer_lease");

/* One object of a lease reply or an offer: where to read it and what it must be. */
struct proto_peer_obj {
	struct proto_peer_key key;	/* echoed: the puller checks it */
	uint8_t		present;	/* 0: not held (the rest is 0) */
	uint8_t		pad[3];
	uint64_t	len;
	uint64_t	checksum;	/* checksum_obj of the bytes */
	uint64_t	raddr;
	uint64_t	rkey;
};
_Static_assert(sizeof(struct proto_peer_obj) == 88, "proto_peer_obj");

/* PEER_RELEASE: the owner lets go of a lease. */
struct proto_peer_release {
	uint64_t	lease;
};
_Static_assert(sizeof(struct proto_peer_release) == 8, "proto_peer_release");

/* PEER_OFFER: followed by nobjs proto_peer_obj the sender pinned; the home pulls them. */
struct proto_peer_offer {
	uint64_t	offer;
	uint32_t	nobjs;
	uint32_t	flags;		/* none defined; must be 0 */
};
_Static_assert(sizeof(struct proto_peer_offer) == 16, "proto_peer_offer");

struct proto_peer_offer_reply {
	uint32_t	stored;		/* pulled, verified, now in the home's DRAM */
	uint32_t	present;	/* held already, or being written */
	uint32_t	failed;		/* refused (no space) or lost on the way */
	uint32_t	pad;
};
_Static_assert(sizeof(struct proto_peer_offer_reply) == 16, "proto_peer_offer_reply");

/* Which connection a frame came on: each dispatcher serves its own types. */
enum proto_chan {
	PROTO_CHAN_ENGINE	= 1,	/* the engines' Unix socket (dispatch.c) */
	PROTO_CHAN_PEER		= 2,	/* daemon to daemon (peer.c) */
};

/*
 * LIST: what the daemon holds, as JSON. At most `max` entries (0: the
 * daemon's cap, PROTO_LIST_MAX, which also bounds a larger max), in the
 * daemon's order; the reply says how many there were and whether it
 * was cut ("truncated").
 */
struct proto_list {
	uint16_t	what;		/* PROTO_LIST_* */
	uint16_t	flags;		/* none defined; must be 0 */
	uint32_t	max;
};
_Static_assert(sizeof(struct proto_list) == 8, "proto_list");
#define PROTO_LIST_NAMESPACES	1
#define PROTO_LIST_GROUPS	2
#define PROTO_LIST_LEASES	3
#define PROTO_LIST_MAX		1024

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
const char	*proto_decline_name(unsigned);
const char	*proto_status_text(unsigned);
int		 proto_status_errno(unsigned);
int		 proto_type_is_request(unsigned);
int		 proto_type_served(unsigned, unsigned chan);
int		 proto_type_takes_fds(unsigned);
void		 proto_hdr_init(struct proto_hdr *, unsigned type, uint32_t length,
		    uint64_t seq);
int		 proto_hdr_check(const struct proto_hdr *, uint32_t max_frame);
int		 proto_hdr_check_chan(const struct proto_hdr *, uint32_t max_frame, unsigned chan);
int		 proto_payload_check(unsigned type, uint32_t length, const void *payload);
int		 proto_payload_check_chan(const struct proto_hdr *, const void *payload,
		    unsigned chan);
int		 proto_string_ok(const char *, size_t cap, int allow_empty);
int		 proto_hello_check(const struct proto_hello *, uint16_t *version);
int		 proto_list_check(const struct proto_list *);
const char	*proto_list_name(unsigned what);
uint64_t	 proto_region_extent(const struct proto_region *);
int		 proto_region_alias(const struct proto_region *, uint64_t *stride, uint64_t *span);
int		 proto_attach_decode(const void *, uint32_t length,
		    struct proto_attach_view *, char *err, size_t errlen);
uint32_t	 proto_attach_length(uint8_t npools, uint16_t nregions, uint32_t nlive);
uint32_t	 proto_attach_live(const struct proto_attach_view *, uint32_t i);
int		 proto_peer_hello_check(const struct proto_peer_hello *);
unsigned	 proto_peer_hello_lanes(const struct proto_peer_hello *);
int		 proto_peer_obj_check(const struct proto_peer_obj *);
int		 proto_peer_lease_reply_check(const void *payload, uint32_t len, uint64_t lease,
		    uint32_t nkeys);
size_t		 proto_dump(const struct proto_hdr *, const void *payload,
		    char *buf, size_t len);

#endif /* L3KV_PROTO_H */
