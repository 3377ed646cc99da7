/*
 * libl3kv: the client library of l3kvd, the decode-side KV-cache daemon.
 * This is its one installed header.
 *
 * A struct l3kv is one connection to one daemon over its Unix socket.
 * Every call returns 0 or a negative errno; results come back through
 * out-parameters. There are two ways to call, and they mix freely:
 *
 *  - blocking: l3kv_attach(), l3kv_stats(), ... send a request and wait
 *    for its reply, at most the call's timeout;
 *  - non-blocking: l3kv_submit_*() sends a request without waiting and
 *    returns a ticket. When l3kv_fd() polls readable, call
 *    l3kv_poll_completion() until it returns -EAGAIN; it hands back one
 *    completion per ticket, in the order the replies arrived (replies to
 *    different requests may arrive in any order). l3kv_poll_completions()
 *    takes several at once; requests submitted between l3kv_cork() and
 *    l3kv_uncork() leave in one write (a scheduler step's RELEASEs and
 *    ADMITs, say).
 *
 * Every ticket completes exactly once, also when the connection breaks
 * (then with the error). Completions that arrive while a blocking call
 * waits are queued, not lost, and l3kv_fd() stays readable while any are
 * queued, so an event loop never misses them.
 *
 * Threads: a struct l3kv is used by one thread at a time; callers that
 * share one lock around it. Distinct connections are independent.
 *
 * Errors the library itself returns (the daemon's statuses map to other
 * errnos, listed in proto/PROTOCOL.md):
 *   -ENOENT, -ECONNREFUSED  no daemon at the socket path (fast: treat it
 *                           as a cache miss)
 *   -ETIMEDOUT              no reply within the timeout; the request stays
 *                           in flight and its late reply is dropped
 *   -EPROTO                 the daemon sent bytes libl3kv cannot parse
 *                           (bad magic, version, length, an unknown seq);
 *                           the connection is then broken
 *   -ECONNRESET             the daemon closed the connection, or it broke
 *                           while a request was in flight
 *   -ENOTCONN               the connection is broken: every later call
 *                           fails with it; l3kv_close() and connect again
 *   -EMSGSIZE               a request longer than the daemon's max_frame,
 *                           or of more than L3KV_PAGES_MAX pages
 *   -EINVAL                 an argument libl3kv cannot encode (see
 *                           l3kv_last_error()), or the daemon's "invalid"
 * SIGPIPE is never raised: sends use MSG_NOSIGNAL.
 */
#ifndef L3KV_H
#define L3KV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(L3KV_BUILDING)
#define L3KV_API	__attribute__((visibility("default")))
#else
#define L3KV_API
#endif

/* The library's version; l3kv_version() gives the one actually loaded. */
#define L3KV_LIB_VERSION	"0.1.0"
/* The wire protocol versions this library speaks. */
#define L3KV_PROTOCOL_MIN	1
#define L3KV_PROTOCOL_MAX	1

/* Timeouts are in milliseconds; these two values are special. */
#define L3KV_TIMEOUT_DEFAULT	0	/* the connection's (l3kv_connect: 5000 ms) */
#define L3KV_TIMEOUT_INFINITE	(-1)
#define L3KV_DEFAULT_TIMEOUT_MS	5000

#define L3KV_SOCKET_ENV		"L3KV_SOCKET"
#define L3KV_SOCKET_DEFAULT	"./run/l3kvd.sock"

#define L3KV_NAME_LEN		32	/* server and role names, NUL included */
#define L3KV_NSNAME_LEN		96	/* namespace names, NUL included */
#define L3KV_ERRMSG_MAX		200	/* bytes of an error text */
#define L3KV_HANDLE_LEN		64	/* a cudaIpcMemHandle_t */
#define L3KV_POOLS_MAX		8
#define L3KV_REGIONS_MAX	64
#define L3KV_FDS_MAX		16	/* distinct fds one ATTACH may carry */
#define L3KV_LIVE_MAX		65536

struct l3kv;

/* Connecting. */

/*
 * Connects to the daemon at socket_path (NULL: l3kv_default_socket()),
 * says HELLO and waits for its answer, all within timeout_ms, which also
 * becomes the connection's default timeout. On success *out is a new
 * connection, freed by l3kv_close().
 */
L3KV_API int	 l3kv_connect(const char *socket_path, int timeout_ms, struct l3kv **out);
/* Closes the connection and frees it; in-flight requests are dropped. NULL is fine. */
L3KV_API void	 l3kv_close(struct l3kv *);
/* $L3KV_SOCKET when set and not empty, else L3KV_SOCKET_DEFAULT. */
L3KV_API const char *l3kv_default_socket(void);
/* The library's version string, e.g. "0.1.0". */
L3KV_API const char *l3kv_version(void);
/* Sets the connection's default timeout for blocking calls. */
L3KV_API int	 l3kv_set_timeout(struct l3kv *, int timeout_ms);
/*
 * The device the next ATTACH's GPU memory claims to be on: the daemon's
 * device index (its copy engine; as the daemon numbers them, not as this
 * process's CUDA_VISIBLE_DEVICES does), or L3KV_DEVICE_ANY (the default)
 * to let the daemon take the device the memory is on. Find the index by
 * UUID: HEALTH's "device_uuids" lists each device's GPU UUID in order
 * ("GPU-...", as nvidia-smi -L prints it); claim the first index whose
 * UUID is that of the GPU the memory is on, or nothing where none is. A
 * claim the memory contradicts is refused at ATTACH (-ENXIO, status
 * wrong_device). 0..65534.
 */
#define L3KV_DEVICE_ANY		(-1)
L3KV_API int	 l3kv_set_device(struct l3kv *, int device);
/*
 * Blocking calls poll the socket without sleeping for up to spin_us
 * microseconds before they sleep in poll(2). Waking a sleeping thread
 * costs tens of microseconds on some hosts (virtual machines most), which
 * a GPU restore of a millisecond notices; spinning costs this thread's
 * core meanwhile. At most 1 s; 0: they sleep at once. L3KV_SPIN_AUTO,
 * the default: a call sleeps until L3KV_SPIN_AUTO_US before its reply is
 * due and spins for up to twice that: a RESTORE is due after as long,
 * per byte of its request, as this connection's last RESTOREs took; any
 * other call at once. At most 2 * L3KV_SPIN_AUTO_US of spinning a call.
 */
#define L3KV_SPIN_AUTO		0xffffffffU
#define L3KV_SPIN_AUTO_US	150
L3KV_API int	 l3kv_set_spin(struct l3kv *, unsigned spin_us);

#define L3KV_CAP_HOST_COPY	0x0001	/* memfd regions, host copy engine */
#define L3KV_CAP_CUDA_COPY	0x0002	/* the daemon found a GPU */
#define L3KV_CAP_NONBLOCK	0x0004	/* replies may come out of order */

/* What the daemon said in its HELLO reply. */
struct l3kv_server_info {
	unsigned	protocol;	/* the version the connection speaks */
	unsigned	caps;		/* L3KV_CAP_* */
	uint32_t	max_frame;	/* the longest request payload it reads */
	uint32_t	lease_ttl_ms;
	char		server[L3KV_NAME_LEN];	/* name and version, "l3kvd 0.1.0" */
	char		role[L3KV_NAME_LEN];	/* "decode" or "prefill" */
};
L3KV_API int	 l3kv_server_info(const struct l3kv *, struct l3kv_server_info *);

/* ATTACH: the engine's layout, policies and memory. */

enum l3kv_host_layout {
	L3KV_LAYOUT_PAGE_FIRST		= 1,	/* page: tokens x layers x bytes */
	L3KV_LAYOUT_LAYER_FIRST		= 2,	/* per layer: pages x tokens x bytes */
	L3KV_LAYOUT_PAGE_FIRST_DIRECT	= 3,	/* page: layers x tokens x bytes */
	L3KV_LAYOUT_SLOTS		= 4,	/* state slots: slot x bytes (regions only) */
};

enum l3kv_attention {
	L3KV_ATTN_MLA	= 1,
	L3KV_ATTN_MHA	= 2,
	L3KV_ATTN_GQA	= 3,
};

enum l3kv_pool_kind {
	L3KV_POOL_KV		= 1,	/* attention KV pages */
	L3KV_POOL_STATE		= 2,	/* recurrent-state checkpoints */
	L3KV_POOL_SIDECAR	= 3,	/* swa, indexer */
};

enum l3kv_hit_policy {
	L3KV_HIT_ALL_PAGES	= 1,
	L3KV_HIT_TRAILING	= 2,	/* trailing_pages(n), n in l3kv_pool.trailing */
};

enum l3kv_prefetch {
	L3KV_PREFETCH_WAIT_COMPLETE	= 1,
	L3KV_PREFETCH_BEST_EFFORT	= 2,
	L3KV_PREFETCH_TIMEOUT		= 3,
};

enum l3kv_write {
	L3KV_WRITE_THROUGH	= 1,
	L3KV_WRITE_BACK		= 2,
	L3KV_WRITE_OFFLOAD	= 3,	/* decode KV offload */
};

enum l3kv_mem_kind {
	L3KV_MEM_MEMFD		= 1,	/* host shared memory; fd */
	L3KV_MEM_CUDA_IPC	= 2,	/* legacy cudaIpcMemHandle_t in handle */
	L3KV_MEM_CUMEM_FD	= 3,	/* cuMem allocation exported as a POSIX fd */
	/*
	 * Not memory: an interprocess CUDA event (cudaIpcEventHandle_t in
	 * handle, every other field 0) that a RESTORE may wait for.
	 */
	L3KV_MEM_CUDA_EVENT	= 4,
};

/*
 * Everything that shapes bytes; the daemon hashes it into the namespace
 * fingerprint. Strings are borrowed for the call; NULL is sent as "".
 */
struct l3kv_layout {
	const char		*model;		/* < 128 bytes */
	const char		*kv_dtype;	/* the real dtype: "fp8_e4m3", "bf16"; < 16 bytes */
	const char		*hash_scheme;	/* "sha256" or an engine's scheme; < 16 bytes */
	unsigned		 hash_len;	/* engine hash bytes, 1..32 */
	unsigned		 tp_size;
	unsigned		 dcp_size;
	unsigned		 pp_size;
	unsigned		 cp_size;
	unsigned		 dcp_rank;
	unsigned		 pp_rank;
	enum l3kv_host_layout	 host_layout;	/* of stored objects */
	enum l3kv_attention	 attention;
	uint32_t		 page_tokens;
	uint32_t		 logical_page_tokens;
	uint64_t		 seed;
};

struct l3kv_pool {
	const char		*name;		/* "kv", "state", "swa", "indexer"; < 16 bytes */
	enum l3kv_pool_kind	 kind;
	enum l3kv_hit_policy	 hit_policy;
	unsigned		 trailing;	/* n of trailing_pages(n) */
	uint32_t		 layers;
	uint64_t		 object_bytes;	/* bytes of one object of the pool */
	const char		*schema;	/* per-pool tensor schema; NULL is ""; < 64 bytes */
};

/*
 * A memory registration. Byte (page p, layer l, token t) lives at
 * offset + p*page_stride + l*layer_stride + t*token_stride, token_bytes
 * long, and the last such byte must lie inside size. A state-slot region
 * (L3KV_LAYOUT_SLOTS) has num_pages slots of token_bytes, one layer and
 * one token each.
 */
struct l3kv_region {
	unsigned		 pool;		/* index into l3kv_attach_args.pools */
	enum l3kv_mem_kind	 kind;
	enum l3kv_host_layout	 layout;
	int			 fd;		/* memfd or cuMem fd: borrowed, sent, not closed */
	uint64_t		 offset;	/* into the allocation */
	uint64_t		 size;		/* bytes usable from offset */
	uint32_t		 num_pages;
	uint32_t		 page_tokens;
	uint32_t		 layers;
	uint32_t		 token_bytes;
	uint64_t		 page_stride;
	uint64_t		 layer_stride;
	uint64_t		 token_stride;
	uint8_t			 handle[L3KV_HANDLE_LEN];	/* CUDA_IPC, CUDA_EVENT only */
};

struct l3kv_attach_args {
	struct l3kv_layout	 layout;
	const struct l3kv_pool	*pools;
	unsigned		 npools;	/* 1..L3KV_POOLS_MAX */
	const struct l3kv_region *regions;
	unsigned		 nregions;	/* 0..L3KV_REGIONS_MAX */
	const uint32_t		*live_slots;	/* state slots a restore must never write */
	uint32_t		 nlive;		/* 0..L3KV_LIVE_MAX */
	const char		*group;		/* the engine instance's id, < 64 bytes */
	unsigned		 group_size;	/* ranks that attach with this group id */
	unsigned		 group_rank;	/* this rank's index in the group */
	unsigned		 tp_rank;
	enum l3kv_prefetch	 prefetch;
	uint32_t		 prefetch_timeout_ms;	/* L3KV_PREFETCH_TIMEOUT only */
	enum l3kv_write		 write;
	int			 timeout_ms;	/* this call's; L3KV_TIMEOUT_DEFAULT */
};

struct l3kv_attach_info {
	uint8_t		fingerprint[16];	/* the namespace's layout hash */
	char		ns[L3KV_NSNAME_LEN];	/* "role/model-fingerprint" */
	uint32_t	session;		/* the daemon's id for this attach */
	uint32_t	lease_ttl_ms;
	uint32_t	group_members;		/* ranks of the group attached so far */
};

/*
 * Registers this rank: layout, policies, memory. The fds of memfd and
 * cuMem regions are sent with the request (each distinct fd once) and
 * stay the caller's. info may be NULL.
 */
L3KV_API int	 l3kv_attach(struct l3kv *, const struct l3kv_attach_args *,
		    struct l3kv_attach_info *info);
/* Leaves; the daemon keeps the stored data. */
L3KV_API int	 l3kv_detach(struct l3kv *);

/* Administration: the daemon's JSON documents; free *json with l3kv_free(). */
L3KV_API int	 l3kv_stats(struct l3kv *, char **json);
L3KV_API int	 l3kv_health(struct l3kv *, char **json);
L3KV_API void	 l3kv_free(void *);

/*
 * Operations (l3kvctl). l3kv_reload() makes the daemon re-read its config
 * file (root and the daemon's uid only: -EACCES otherwise): *json says
 * which changed keys were applied and which refused; a bad file is
 * -EINVAL with l3kv_last_error() naming the key, and changed nothing.
 * l3kv_list() lists what the daemon holds, at most max entries (0: the
 * daemon's cap of 1024), with the total and whether it was truncated.
 */
enum l3kv_list_what {
	L3KV_LIST_NAMESPACES	= 1,
	L3KV_LIST_GROUPS	= 2,
	L3KV_LIST_LEASES	= 3,
};
L3KV_API int	 l3kv_reload(struct l3kv *, char **json);
L3KV_API int	 l3kv_list(struct l3kv *, enum l3kv_list_what, unsigned max, char **json);

/* The non-blocking path. */

/* Request types, as in the completion's op; equal to the wire's numbers. */
enum l3kv_op {
	L3KV_OP_HELLO		= 1,
	L3KV_OP_ATTACH		= 2,
	L3KV_OP_DETACH		= 3,
	L3KV_OP_STATS		= 4,
	L3KV_OP_HEALTH		= 5,
	L3KV_OP_PROBE		= 16,
	L3KV_OP_ADMIT		= 17,
	L3KV_OP_RESTORE		= 18,
	L3KV_OP_CANCEL		= 19,
	L3KV_OP_RELEASE		= 20,
	L3KV_OP_PUBLISH		= 21,
	L3KV_OP_SET_POLICY	= 22,
	L3KV_OP_RELOAD		= 24,
	L3KV_OP_LIST		= 25,
	L3KV_OP_DEBUG		= 240,
};

/*
 * One finished request. payload is the reply's payload when status is 0
 * (the JSON text of STATS and HEALTH) and the error text otherwise; it is
 * NUL-terminated, owned by the completion, and NULL when len is 0.
 */
struct l3kv_completion {
	uint64_t	 ticket;	/* as l3kv_submit_*() returned it */
	int		 op;		/* L3KV_OP_* */
	int		 status;	/* 0 or -errno */
	int		 proto_status;	/* the daemon's status number; 0 for local errors */
	char		*payload;
	size_t		 len;
};

/*
 * The pollable fd: readable while l3kv_poll_completion() has something to
 * do (a reply on the socket, queued completions, pending output that can
 * now be sent, a broken connection). Poll it for reading only; never read,
 * write or close it.
 */
L3KV_API int	 l3kv_fd(const struct l3kv *);
/*
 * Sends what is queued, reads what the socket has, without blocking.
 * Returns 0 with one completion in *out (release it), -EAGAIN when none
 * is ready, -ENOTCONN once the connection is broken and every ticket
 * has been handed back.
 */
L3KV_API int	 l3kv_poll_completion(struct l3kv *, struct l3kv_completion *out);
/*
 * The same for up to max completions at once: returns how many were
 * written to out[] (at least 1; release each), or -EAGAIN / -ENOTCONN as
 * l3kv_poll_completion(). Replies that arrive together are handed back
 * together, without the eventfd signalling that keeps l3kv_fd() readable
 * for completions left queued between two calls.
 */
L3KV_API int	 l3kv_poll_completions(struct l3kv *, struct l3kv_completion *out, unsigned max);
/* Frees a completion's payload. Idempotent. */
L3KV_API void	 l3kv_completion_release(struct l3kv_completion *);
/*
 * Batching: after l3kv_cork(), requests submitted are queued, not sent;
 * l3kv_uncork() sends them all, as few sendmsg calls as the socket
 * allows (one, unless it is full or a request carries fds). An engine's
 * scheduler that releases finished requests' leases and admits new ones
 * in one step wraps them so: one write, one wakeup of the daemon, and
 * its replies come back together. A blocking call, or
 * l3kv_poll_completion(), sends what is queued (still corked after).
 * l3kv_uncork() returns 0 (also when the socket is full: l3kv_fd() then
 * polls readable once it can take more), or -errno with the connection
 * broken; its requests then complete with the error.
 */
L3KV_API int	 l3kv_cork(struct l3kv *);
L3KV_API int	 l3kv_uncork(struct l3kv *);

/*
 * Tickets are unique per connection, increasing and never 0. A submit
 * that fails created no ticket.
 */
L3KV_API int	 l3kv_submit_stats(struct l3kv *, uint64_t *ticket);
L3KV_API int	 l3kv_submit_health(struct l3kv *, uint64_t *ticket);

/*
 * The cache operations (proto/PROTOCOL.md §4.6-4.13 has their full
 * semantics). They need an attached connection. Pages are named by
 * their hashes: npages * L3KV_HASH_LEN bytes, an engine's shorter hashes
 * zero-padded to 32. libl3kv refuses only what it cannot encode: more
 * than L3KV_PAGES_MAX pages, or a request longer than the daemon's
 * max_frame (-EMSGSIZE); a NULL array with npages > 0, or an index that
 * does not fit its wire field (-EINVAL). Every field's value is the
 * daemon's to check.
 *
 * The blocking forms wait at most the connection's default timeout,
 * except ADMIT and RESTORE, whose timeout is the caller's (0: the
 * default): a group barrier or a large copy may take long. A call that
 * times out leaves its request in flight, and the daemon still acts on
 * it: after an ADMIT timeout, ADMIT again with the same request id (the
 * daemon answers a repeat with the same admission); after a RESTORE
 * timeout, CANCEL the lease before reusing its destination pages.
 *
 * Each submit_*() has a *_result() that decodes its completion; it
 * returns -EINVAL for a completion that is not a successful reply of
 * that type (c->status says why it failed). The results of
 * l3kv_restore(), l3kv_cancel() and l3kv_publish() may be NULL.
 */
#define L3KV_HASH_LEN		32		/* page hash bytes on the wire */
#define L3KV_SLOT_NONE		UINT32_MAX	/* no canonical state slot reserved */
#define L3KV_PAGES_MAX		65536		/* pages in one request */

/*
 * PROBE: the longest prefix of these pages that every attached rank of
 * the group holds, each in its own namespace and shard, in the layout's
 * first kv pool. Changes nothing on the daemon.
 */
L3KV_API int	 l3kv_probe(struct l3kv *, const uint8_t *hashes, uint32_t npages,
		    uint32_t *hit_pages);
/* PROBE without waiting, and its completion's answer. */
L3KV_API int	 l3kv_submit_probe(struct l3kv *, const uint8_t *hashes, uint32_t npages,
		    uint64_t *ticket);
L3KV_API int	 l3kv_probe_result(const struct l3kv_completion *, uint32_t *hit_pages);

/* Why an ADMIT promised nothing. */
enum l3kv_decline {
	L3KV_DECLINE_NONE		= 0,	/* admitted */
	L3KV_DECLINE_NO_HIT		= 1,	/* the group holds no common prefix */
	L3KV_DECLINE_NO_RESERVATION	= 2,	/* some rank reserved 0 pages */
	L3KV_DECLINE_GROUP_TIMEOUT	= 3,	/* a rank did not ask in time */
	L3KV_DECLINE_GROUP_MISMATCH	= 4,	/* ranks asked for different pages */
	L3KV_DECLINE_SHUTTING_DOWN	= 5,
	L3KV_DECLINE_RANK_LEFT		= 6,	/* a rank detached while waiting */
	L3KV_DECLINE_NO_SLOT		= 7,	/* a state pool but no usable canonical slot */
	L3KV_DECLINE_SLOT_BUSY		= 8,	/* the slot is held by another lease */
};

struct l3kv_admit_args {
	uint64_t	 request_id;	/* the same on every rank of the group */
	const uint8_t	*hashes;	/* npages * L3KV_HASH_LEN bytes */
	uint32_t	 npages;
	uint32_t	 reserved_pages;/* destination pages this rank holds for the prefix */
	uint32_t	 state_slot;	/* canonical state slot reserved, or L3KV_SLOT_NONE */
	int		 timeout_ms;	/* l3kv_admit() only; L3KV_TIMEOUT_DEFAULT */
};

/*
 * The promise. A declined admission is not an error: the call succeeds
 * with lease 0, admitted_pages 0 and the reason in decline.
 */
struct l3kv_admit_result {
	uint64_t	lease;		/* this rank's lease; 0 when declined */
	uint32_t	admitted_pages;	/* the same on every rank; never grows */
	int		decline;	/* enum l3kv_decline */
	uint32_t	ttl_ms;		/* the lease's life without a restore */
	uint32_t	group_hit;	/* the common hit, before the reservation cap */
};

/*
 * ADMIT: a group barrier on request_id, answered once every rank of the
 * group asked (or declined for all at the daemon's admit.timeout_ms, so
 * timeout_ms should be longer). The admitted prefix is pinned for this
 * rank until RELEASE, CANCEL or the lease's TTL.
 */
L3KV_API int	 l3kv_admit(struct l3kv *, const struct l3kv_admit_args *,
		    struct l3kv_admit_result *);
L3KV_API int	 l3kv_submit_admit(struct l3kv *, const struct l3kv_admit_args *,
		    uint64_t *ticket);
L3KV_API int	 l3kv_admit_result(const struct l3kv_completion *, struct l3kv_admit_result *);

struct l3kv_restore_result {
	uint32_t	pages;		/* whole, verified, contiguous pages in place */
	int		partial;	/* best_effort/timeout stopped at its deadline */
	uint64_t	bytes;
};

/*
 * RESTORE: copies the lease's admitted pages, in order, into dst_pages
 * (page indices of the ATTACH region `region`); npages must be exactly
 * the admitted count. Answered when every rank of the group has its
 * pages in place, or fails for all (-ENODATA lost, -ECANCELED,
 * -ETIME expired, -ERANGE out of bounds, ...).
 */
L3KV_API int	 l3kv_restore(struct l3kv *, uint64_t lease, unsigned region,
		    const uint32_t *dst_pages, uint32_t npages, int timeout_ms,
		    struct l3kv_restore_result *);
L3KV_API int	 l3kv_submit_restore(struct l3kv *, uint64_t lease, unsigned region,
		    const uint32_t *dst_pages, uint32_t npages, uint64_t *ticket);
/*
 * The same with recurrent state: the checkpoint is restored into the
 * canonical slot the ADMIT reserved (state->slot in the slot region
 * state->region). Naming a live slot, or one another lease holds, is
 * refused with -EADDRINUSE before any byte moves.
 */
struct l3kv_state_dest {
	unsigned	region;		/* the state-slot region's index at ATTACH */
	uint32_t	slot;		/* the canonical slot given to ADMIT */
};
/*
 * RESTORE with every option. event_region names an L3KV_MEM_CUDA_EVENT
 * registration: the daemon's writes into engine memory wait, on the GPU
 * (never blocking the daemon), until the work the engine recorded on that
 * event before sending this RESTORE has finished, so pages the engine
 * just reclaimed are not overwritten while its kernels still read them.
 * The daemon may already stage (H2D) and verify before that point.
 */
#define L3KV_REGION_NONE	0xffff
struct l3kv_restore_args {
	uint64_t		 lease;
	const uint32_t		*pages;		/* dst_pages, npages of them */
	uint32_t		 npages;
	uint16_t		 region;
	uint16_t		 state_region;	/* L3KV_REGION_NONE without state */
	uint32_t		 state_slot;	/* L3KV_SLOT_NONE without state */
	uint16_t		 event_region;	/* L3KV_REGION_NONE: no wait */
	uint16_t		 flags;		/* L3KV_RESTORE_*, or 0 (was pad) */
};
/*
 * The lease ends when the RESTORE succeeds, as if l3kv_release() followed
 * at once (one round trip less); after a failure it stays, to be released
 * as without the flag. Its pins stay until every copy has landed.
 */
#define L3KV_RESTORE_RELEASE	0x0001
L3KV_API int	 l3kv_restore_with(struct l3kv *, const struct l3kv_restore_args *,
		    int timeout_ms, struct l3kv_restore_result *);
L3KV_API int	 l3kv_submit_restore_with(struct l3kv *, const struct l3kv_restore_args *,
		    uint64_t *ticket);
L3KV_API int	 l3kv_restore_state(struct l3kv *, uint64_t lease, unsigned region,
		    const uint32_t *dst_pages, uint32_t npages, const struct l3kv_state_dest *,
		    int timeout_ms, struct l3kv_restore_result *);
L3KV_API int	 l3kv_submit_restore_state(struct l3kv *, uint64_t lease, unsigned region,
		    const uint32_t *dst_pages, uint32_t npages, const struct l3kv_state_dest *,
		    uint64_t *ticket);
/*
 * PROBE with the legal stop points of a hybrid layout: up to max of them
 * go to stops, ascending; *nstops says how many the daemon sent (0 means
 * every length up to *hit_pages is one).
 */
L3KV_API int	 l3kv_probe_stops(struct l3kv *, const uint8_t *hashes, uint32_t npages,
		    uint32_t *hit_pages, uint32_t *stops, uint32_t max, uint32_t *nstops);
/*
 * SET_POLICY: changes the group's prefetch and write policies. Guards run
 * first (-EPERM, nothing changed); -EBUSY while the group has admissions
 * or leases; setting the same policy again changes nothing.
 */
L3KV_API int	 l3kv_set_policy(struct l3kv *, enum l3kv_prefetch, enum l3kv_write,
		    uint32_t prefetch_timeout_ms);
L3KV_API int	 l3kv_restore_result(const struct l3kv_completion *,
		    struct l3kv_restore_result *);

/*
 * CANCEL: stops the lease's restore (and fails its group's); answered
 * only once no copy for it can still land. pages_landed (may be NULL):
 * destination pages it wrote before stopping.
 */
L3KV_API int	 l3kv_cancel(struct l3kv *, uint64_t lease, uint32_t *pages_landed);
L3KV_API int	 l3kv_submit_cancel(struct l3kv *, uint64_t lease, uint64_t *ticket);
L3KV_API int	 l3kv_cancel_result(const struct l3kv_completion *, uint32_t *pages_landed);

/* RELEASE: ends the lease and drops its pins; -EBUSY while it restores. */
L3KV_API int	 l3kv_release(struct l3kv *, uint64_t lease);
/* RELEASE without waiting; its completion carries only the status. */
L3KV_API int	 l3kv_submit_release(struct l3kv *, uint64_t lease, uint64_t *ticket);

struct l3kv_publish_page {
	uint8_t		hash[L3KV_HASH_LEN];
	uint32_t	src_page;	/* page index in the source region */
};

struct l3kv_publish_result {
	uint32_t	stored;		/* new objects, now visible */
	uint32_t	present;	/* already stored or being stored: not written twice */
	uint64_t	bytes;		/* of the stored objects */
};

/*
 * PUBLISH: the daemon copies these pages of ATTACH region `region` and
 * keeps them. All or nothing: on any error nothing became visible.
 */
L3KV_API int	 l3kv_publish(struct l3kv *, unsigned region, const struct l3kv_publish_page *,
		    uint32_t npages, struct l3kv_publish_result *);
L3KV_API int	 l3kv_submit_publish(struct l3kv *, unsigned region,
		    const struct l3kv_publish_page *, uint32_t npages, uint64_t *ticket);
L3KV_API int	 l3kv_publish_result(const struct l3kv_completion *,
		    struct l3kv_publish_result *);

/*
 * DEBUG, for tests only: drops (as if lost) or corrupts this rank's
 * object (pool index, hash). The daemon refuses it (-EISCONN) unless it
 * runs with testing.debug_ops.
 */
#define L3KV_DEBUG_DROP		1
#define L3KV_DEBUG_CORRUPT	2
#define L3KV_DEBUG_KILL_ENGINE	3	/* the session's cuda copy engine dies: its copies fail */
L3KV_API int	 l3kv_debug(struct l3kv *, unsigned op, unsigned pool, const uint8_t *hash);

/* Errors. */

/*
 * Text for a negative errno returned by libl3kv: the protocol's wording
 * where exactly one daemon status maps to it (and libl3kv does not also
 * return it for a local reason), strerror()'s otherwise. Never NULL.
 */
L3KV_API const char *l3kv_strerror(int err);
/* The daemon's status number (PROTO_S_*) of the last call; 0 if it succeeded or failed locally. */
L3KV_API int	 l3kv_last_status(const struct l3kv *);
/*
 * The error text of the last failed call: the daemon's message, or
 * libl3kv's own for a failure found locally; "" after a success.
 */
L3KV_API const char *l3kv_last_error(const struct l3kv *);

#ifdef __cplusplus
}
#endif

#endif /* L3KV_H */
