/*
 * l3kvd's one internal header: a section per file, in layer order, bottom
 * first, as docs/architecture.md (section 1) lists the layers. The event
 * loop thread alone touches everything declared here unless a comment
 * says otherwise.
 */
#ifndef L3KV_DAEMON_H
#define L3KV_DAEMON_H

#include <sys/types.h>
#include <sys/queue.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <event2/event.h>

#include "proto.h"

#define L3KV_VERSION		"0.1.0"

/* log.c */
enum log_level {
	LOG_LEVEL_ERROR = 0,
	LOG_LEVEL_WARN,
	LOG_LEVEL_INFO,
	LOG_LEVEL_DEBUG,
};
void	 log_init(int level);
void	 log_set_level(int);
int	 log_get_level(void);
int	 log_level_parse(const char *, int *);
const char *log_level_name(int);
void	 log_msg(int level, const char *subsys, const char *fmt, ...)
	    __attribute__((format(printf, 3, 4)));
void	 fatalx(const char *subsys, const char *fmt, ...)
	    __attribute__((format(printf, 2, 3), noreturn));
#define log_error(s, ...)	log_msg(LOG_LEVEL_ERROR, s, __VA_ARGS__)
#define log_warn(s, ...)	log_msg(LOG_LEVEL_WARN, s, __VA_ARGS__)
#define log_info(s, ...)	log_msg(LOG_LEVEL_INFO, s, __VA_ARGS__)
#define log_debug(s, ...)	do {					\
	if (log_get_level() >= LOG_LEVEL_DEBUG)				\
		log_msg(LOG_LEVEL_DEBUG, s, __VA_ARGS__);		\
} while (0)

/* config.c */
#define CONFIG_PATH_MAX		108	/* sun_path */
#define CONFIG_IDS_MAX		64
#define CONFIG_ERR_MAX		512

/*
 * A member of the role (the peer tier, peer.c): its id (unique, stable:
 * "node-a") and its peer control address. The static list of peer.members
 * is one source of them; etcd's view another (peer_members_set).
 */
#define PEER_ID_LEN		64
#define PEER_ADDR_LEN		128
#define CONFIG_PEERS_MAX	64
struct peer_member {
	char	id[PEER_ID_LEN];	/* NUL-terminated */
	char	addr[PEER_ADDR_LEN];	/* "host:port" of its peer control channel, NUL-terminated */
};

enum config_copy_engine {
	CONFIG_COPY_AUTO = 0,
	CONFIG_COPY_CUDA,
	CONFIG_COPY_HOST,
};

struct config {
	char		socket_path[CONFIG_PATH_MAX];
	unsigned	socket_mode;		/* permission bits, e.g. 0660 */
	char		socket_group[64];	/* "" keeps the daemon's group */
	uid_t		allow_uids[CONFIG_IDS_MAX];
	size_t		nallow_uids;
	gid_t		allow_gids[CONFIG_IDS_MAX];
	size_t		nallow_gids;
	int		log_level;		/* LOG_LEVEL_* */
	char		role[32];		/* "decode" or "prefill" */
	char		model[128];		/* "" accepts any model at ATTACH */
	uint64_t	namespace_seed;
	uint64_t	dram_size;		/* bytes */
	char		file_path[256];		/* the file tier's root; "" disables it */
	uint64_t	file_capacity;		/* bytes of object files */
	int		file_fsync;		/* fdatasync objects, fsync directories */
	uint32_t	file_readers;		/* reader threads, one io_uring each */
	uint32_t	file_read_depth;	/* reads in flight per reader */
	uint32_t	file_fd_cache;		/* open files kept for small objects */
	int		copy_engine;		/* CONFIG_COPY_* */
	uint32_t	copy_workers;		/* host copy engine threads */
	uint32_t	max_connections;
	uint32_t	max_connections_per_uid;
	uint32_t	max_frame;		/* bytes, header included */
	uint32_t	hello_timeout_ms;	/* accept to HELLO */
	uint32_t	attach_timeout_ms;	/* idle after HELLO, unattached */
	uint32_t	frame_timeout_ms;	/* a frame's first byte to its last */
	uint32_t	max_output;		/* bytes of replies before reading stops */
	uint32_t	output_timeout_ms;	/* over max_output this long: closed */
	uint32_t	lease_ttl_ms;
	uint32_t	admit_timeout_ms;	/* group barrier deadline */
	uint32_t	admit_max_waiting;	/* ADMITs one session may have at a barrier */
	uint32_t	drain_ms;		/* shutdown drain bound */
	char		metrics_listen[64];	/* "" disables: the HTTP server (httpd.c) */
	uint32_t	test_copy_delay_ms;	/* testing only: slows copies */
	uint32_t	test_scan_delay_ms;	/* testing only: slows file tier scans */
	uint32_t	test_read_delay_ms;	/* testing only: slows file tier reads */
	uint32_t	max_namespaces;
	int		test_debug_ops;		/* testing only: allows DEBUG */
	uint32_t	test_peer_pull_delay_ms; /* testing only: a pull waits before its read */
	int		test_peer_bad_key;	/* testing only: PEER_LEASE answers name bad keys */
	char		test_resolv_conf[CONFIG_PATH_MAX];	/* testing only: evdns's resolv.conf */
	/* The peer tier (peer.c): off while peer.id is "". */
	char		peer_id[PEER_ID_LEN];
	char		peer_listen[PEER_ADDR_LEN];	/* HOST:PORT of the control channel */
	char		peer_provider[32];	/* libfabric provider: "tcp", "sockets" */
	char		peer_fabric_addr[64];	/* the data path's bind address; "": any */
	uint32_t	peer_lanes;	/* fabric threads, each with its endpoints (fabric.c) */
	uint32_t	peer_stripe_pages;	/* pages placed together (HRW key: the first) */
	uint32_t	peer_replicas;		/* homes per stripe, 1 or 2 */
	char		peer_secret[128];	/* "": peers are not authenticated */
	uint32_t	peer_timeout_ms;	/* a PROBE or LEASE answer; later is a miss */
	uint32_t	peer_pull_timeout_ms;	/* one pull's deadline */
	uint32_t	peer_lease_max_ms;	/* owner: a peer lease's pins at most this long */
	uint32_t	peer_ping_ms;		/* liveness pings; a peer silent 3 times is down */
	uint32_t	peer_user_timeout_ms;	/* TCP_USER_TIMEOUT and the connect deadline */
	struct peer_member peer_members[CONFIG_PEERS_MAX];
	size_t		npeer_members;
	uint32_t	test_cuda_engines_per_gpu;	/* testing only: engines per GPU */
	char		peer_etcd_endpoint[128];	/* "": no etcd; http://HOST:PORT */
	char		peer_etcd_prefix[201];	/* "": /l3kv/ROLE/ */
	uint32_t	peer_etcd_ttl_s;	/* our key's lease */
};

void	 config_default(struct config *);
int	 config_load_file(struct config *, const char *path, char *err, size_t errlen);
int	 config_load_string(struct config *, const char *text, const char *name,
	    char *err, size_t errlen);
int	 config_apply_env(struct config *, char *err, size_t errlen);
const char *config_default_json(void);
/* A key a reload found changed: applied (a live key, now in effect) or refused (old kept). */
#define CONFIG_VALUE_MAX	160
struct config_change {
	const char	*key;			/* the table's dotted name */
	int		 applied;
	char		 old[CONFIG_VALUE_MAX];	/* as the file writes it */
	char		 new[CONFIG_VALUE_MAX];
	char		 reason[CONFIG_VALUE_MAX + 64];	/* refused: why */
};
size_t	 config_nkeys(void);
int	 config_key_live(const char *key);
size_t	 config_reload(struct config *cur, const struct config *next, struct config_change *,
	    size_t max);
void	 config_key_restore(struct config *cur, const struct config *prev, const char *key);

/* notify.c */
int	 notify_send(const char *state);
int	 notify_sendf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* $WATCHDOG_USEC when it is meant for this process ($WATCHDOG_PID), else 0. */
uint64_t notify_watchdog_usec(void);
uint64_t notify_monotonic_usec(void);

/* gpu.c: run-time GPU detection through the kernels/ header */
int	 gpu_detect(char *desc, size_t len);

/* checksum.c: the object checksum of every tier and copy engine; thread-safe */
#define CHECKSUM_CHUNK		(64U << 10)
/* XXH3-64 over the little-endian XXH3-64 digests of each chunk, then the length. */
uint64_t checksum_obj(const void *, size_t);
/* Its two steps, for loops that hash as they copy (copy.c): a chunk's digest, the rest. */
uint64_t checksum_chunk(const void *, size_t);
uint64_t checksum_combine(uint64_t *dig, size_t nchunks, uint64_t len);

/* An object's chunks, and the length of chunk i (the last may be short). */
static inline size_t
checksum_chunks(uint64_t len)
{
	return (size_t)((len + CHECKSUM_CHUNK - 1) / CHECKSUM_CHUNK);
}

static inline size_t
checksum_chunk_len(uint64_t len, size_t i)
{
	uint64_t	n = len - (uint64_t)i * CHECKSUM_CHUNK;

	return n > CHECKSUM_CHUNK ? CHECKSUM_CHUNK : (size_t)n;
}

/*
 * workq.c: a completion queue from worker threads to the loop: a mutex,
 * a FIFO of entries embedded in the caller's objects, an eventfd the loop
 * watches. Any thread pushes; the loop runs done() for at most `batch`
 * entries per wakeup, then yields (the rest run at the next turn), and
 * after them wake() (if any), which is also what a foreign notifier
 * writing workq_fd() (a CUDA host callback) triggers.
 */
struct workq_entry {
	struct workq_entry	*next;
};
#define WORKQ_ITEM(e, type, member)	\
	((type *)(void *)((char *)(e) - offsetof(type, member)))
struct workq;
typedef void workq_done_fn(struct workq_entry *, void *arg);
typedef void workq_wake_fn(void *arg);
int	 workq_new(struct event_base *, const char *name, unsigned batch, workq_done_fn *done,
	    workq_wake_fn *wake, void *arg, struct workq **out, char *err, size_t errlen);
void	 workq_free(struct workq *);
/* Runs done() for what is still queued, once the producers have stopped. */
void	 workq_flush(struct workq *);
void	 workq_push(struct workq *, struct workq_entry *);
int	 workq_fd(const struct workq *);

/*
 * fabric.c: one libfabric FI_EP_RDM endpoint with FI_RMA, one-sided reads
 * only (a serving endpoint peers read, one reading endpoint per peer).
 * Called from the loop thread only, and done() runs there; the endpoints'
 * progress runs on the fabric's own thread, which owns them (fabric.c).
 */
#define FABRIC_ADDR_MAX		128	/* bytes of an endpoint name (fi_getname) */
#define FABRIC_LANES_MAX	8	/* fabric threads, each with its own endpoints */

struct fabric;
typedef void (*fabric_done_fn)(void *arg, int err);	/* on the loop; err 0 or -errno */

/*
 * Before any thread and any libfabric call (main does it first): the
 * rxm buffer sizes a reads-only user needs, where the environment does
 * not name them already (87 MiB of RSS per endpoint down to 6, measured).
 */
void	 fabric_init_env(void);
int	 fabric_open(struct event_base *base, const char *prov, const char *node, unsigned lanes,
	    struct fabric **fp, char *err, size_t errlen);
void	 fabric_close(struct fabric *);
const char *fabric_provider(const struct fabric *);	/* e.g. "tcp;ofi_rxm" */
unsigned fabric_spin_us(const struct fabric *);	/* L3KV_FABRIC_SPIN_US, or 30 */
unsigned fabric_lanes(const struct fabric *);	/* fabric threads: 1 to FABRIC_LANES_MAX */
/* The serving endpoints' names, one per lane, lane 0's first: what peers are given. */
int	 fabric_name(const struct fabric *, uint8_t *buf, size_t *len);
/* Registers [base, base + len) for FI_READ | FI_REMOTE_READ in chunks (0: 1 GiB). */
int	 fabric_expose(struct fabric *, void *base, size_t len, size_t chunk);
/* A peer's remote address and key for [p, p + len); -ERANGE unless inside one chunk. */
int	 fabric_rkey(const struct fabric *, const void *p, size_t len, uint64_t *raddr,
	    uint64_t *rkey);
/*
 * A peer by its serving endpoints' names (from its HELLO: len a multiple
 * of our name's length, one per lane of the peer); it is read over as
 * many lanes as both have. *peer is an opaque handle.
 */
int	 fabric_peer_add(struct fabric *, const uint8_t *name, size_t len, uint64_t *peer);
void	 fabric_peer_remove(struct fabric *, uint64_t peer);
/*
 * One-sided read into dst (inside the exposed region); done runs once, on
 * the loop, after every posted part completed or could no longer land.
 * -ECANCELED / -ENOTCONN / -EIO from the provider, -ETIMEDOUT past
 * deadline_ms (0: none); a read failed with parts on the wire answers
 * once they drained, at most 250 ms later (fabric.c's top comment).
 */
int	 fabric_read(struct fabric *, uint64_t peer, void *dst, size_t len, uint64_t raddr,
	    uint64_t rkey, uint32_t deadline_ms, fabric_done_fn done, void *arg);
/* Counters for STATS: reads posted, completed, failed by reason, bytes. */
/* abandoned: retired endpoints left open, parts still on their wire (fabric.c). */
struct fabric_stats {
	uint64_t	reads, done, failed, bytes, ecanceled, enotconn, timedout, abandoned;
	uint64_t	lane_reads[FABRIC_LANES_MAX];	/* reads handed to each lane's thread */
};
void	 fabric_get_stats(const struct fabric *, struct fabric_stats *);
/* Lowers the size reads are split at (tests, tuning); 0 restores the provider's. */
void	 fabric_set_max_msg(struct fabric *, size_t);

/*
 * etcd.c: membership from etcd's v3 JSON gateway (evhttp): this member's
 * key under a lease kept alive, a watch on the prefix; fn gets each new
 * view (self included). Losing etcd keeps the last view (fn is not
 * called); sessions restart with backoff and re-register.
 */
struct etcd;
typedef void (*etcd_view_fn)(void *arg, const struct peer_member *m, size_t n);
struct evdns_base;
int	 etcd_open(struct event_base *, struct evdns_base * /* NULL: names resolve blocking */,
	    const char *endpoint /* "http://127.0.0.1:2379" */,
	    const char *prefix, const struct peer_member *self, unsigned ttl_s,
	    etcd_view_fn fn, void *arg, struct etcd **ep, char *err, size_t errlen);
void	 etcd_close(struct etcd *);	/* revokes the lease when it can */

/*
 * index.c: the index both tiers keep of their objects: 80-byte records
 * named by 32-bit ids, a chained hash from key to id, a free list, LRU
 * lists. Loop thread only. A record is a struct index_rec (the index's
 * 64 bytes), then the tier's state byte (0: a free record; lookups see
 * the one state the tier calls visible), then 15 bytes of the tier's.
 * An object's key is the same in both tiers.
 */
struct obj_key {			/* 52 bytes, compared with memcmp */
	uint8_t		fingerprint[16];
	uint8_t		pool;		/* pool index in the namespace */
	uint8_t		pad;		/* must be 0 */
	uint16_t	shard;
	uint8_t		hash[32];	/* page hash, zero-padded */
};
#define INDEX_NONE		UINT32_MAX
#define INDEX_REC_SIZE		80		/* a tier's struct, index_rec first */
#define INDEX_STATE_OFF		64		/* the tier's state byte, after index_rec */
#define INDEX_BLOCK_SHIFT	10		/* 1024 records: 80 KiB a block */
#define INDEX_BLOCK		(1U << INDEX_BLOCK_SHIFT)
struct index_rec {			/* 64 bytes */
	struct obj_key	key;
	uint32_t	chain;		/* next in bucket; next free record when free */
	uint32_t	lru_prev;	/* towards MRU */
	uint32_t	lru_next;	/* towards LRU */
};
struct index_lru {			/* a list of records, kept where the tier wants */
	uint32_t	head;		/* MRU */
	uint32_t	tail;		/* LRU: the next victim */
};
struct index {
	uint8_t		**blocks;	/* INDEX_BLOCK records each; blocks never move */
	uint32_t	  nblocks;
	uint32_t	  blocks_cap;
	uint32_t	  nrecords;	/* ids handed out: a high-water mark */
	uint32_t	  rec_free;	/* free list, through chain */
	uint32_t	 *buckets;
	uint32_t	  nbuckets;	/* a power of two */
	uint8_t		  visible;	/* the state lookups see */
	uint64_t	  seed;		/* secret: clients choose page hashes */
	uint64_t	  nindexed;
};
int	 index_init(struct index *, uint8_t visible);
void	 index_fini(struct index *);
uint64_t index_hash(const struct index *, const struct obj_key *);
/* The id indexed under a key, in any state, or INDEX_NONE; *hash (unless NULL) is for index_insert. */
uint32_t index_find(const struct index *, const struct obj_key *, uint64_t *hash);
/* The same for a visible record only; no side effects at all (PROBE). */
uint32_t index_lookup(const struct index *, const struct obj_key *);
size_t	 index_lookup_many(const struct index *, const struct obj_key *, size_t n, uint32_t *ids);
void	 index_insert(struct index *, uint32_t id, uint64_t hash);
void	 index_remove(struct index *, uint32_t id);
/* A record of zeros, its links INDEX_NONE: 0 or -ENOMEM. */
int	 index_rec_new(struct index *, uint32_t *id);
void	 index_rec_free(struct index *, uint32_t id);
void	 index_lru_init(struct index_lru *);
size_t	 index_lru_order(const struct index *, const struct index_lru *, uint32_t *ids, size_t max);
uint64_t index_meta_bytes(const struct index *);

/*
 * Inline: every pin, unpin and PROBE hit of a tier goes through these,
 * and a call costs more than their bodies.
 */

/* The record of an id handed out (id < nrecords), free or not; a tier casts it to its own. */
static inline struct index_rec *
index_rec(const struct index *ix, uint32_t id)
{
	return (struct index_rec *)(ix->blocks[id >> INDEX_BLOCK_SHIFT] +
	    (size_t)(id & (INDEX_BLOCK - 1)) * INDEX_REC_SIZE);
}

/* The record of a live id, or NULL for an id that names none. */
static inline struct index_rec *
index_rec_live(const struct index *ix, uint32_t id)
{
	struct index_rec	*r;

	if (id >= ix->nrecords)
		return NULL;
	r = index_rec(ix, id);
	return ((const uint8_t *)r)[INDEX_STATE_OFF] == 0 ? NULL : r;
}

/* At the head: the most recently used. */
static inline void
index_lru_push(struct index *ix, struct index_lru *l, uint32_t id)
{
	struct index_rec	*r = index_rec(ix, id);

	r->lru_prev = INDEX_NONE;
	r->lru_next = l->head;
	if (l->head != INDEX_NONE)
		index_rec(ix, l->head)->lru_prev = id;
	else
		l->tail = id;
	l->head = id;
}

/* At the tail: the next victim. */
static inline void
index_lru_push_tail(struct index *ix, struct index_lru *l, uint32_t id)
{
	struct index_rec	*r = index_rec(ix, id);

	r->lru_next = INDEX_NONE;
	r->lru_prev = l->tail;
	if (l->tail != INDEX_NONE)
		index_rec(ix, l->tail)->lru_next = id;
	else
		l->head = id;
	l->tail = id;
}

static inline void
index_lru_unlink(struct index *ix, struct index_lru *l, uint32_t id)
{
	struct index_rec	*r = index_rec(ix, id);

	if (r->lru_prev != INDEX_NONE)
		index_rec(ix, r->lru_prev)->lru_next = r->lru_next;
	else
		l->head = r->lru_next;
	if (r->lru_next != INDEX_NONE)
		index_rec(ix, r->lru_next)->lru_prev = r->lru_prev;
	else
		l->tail = r->lru_prev;
	r->lru_prev = r->lru_next = INDEX_NONE;
}

/*
 * dram.c: the DRAM tier (arena, slabs, index, LRU, pins). Loop thread
 * only; workers touch an object's bytes, never its metadata, while it is
 * pinned or WRITING.
 */
struct dram;
#define DRAM_NONE		INDEX_NONE
struct dram_stats {
	uint64_t	objects;	/* visible + writing + dropped */
	uint64_t	visible;
	uint64_t	writing;
	uint64_t	dropped;	/* out of the index, freed at last unpin */
	uint64_t	unverified;	/* pulled, not yet checked by a restore */
	uint64_t	pinned_objects;
	uint64_t	pins;
	uint64_t	bytes_used;	/* object lengths */
	uint64_t	bytes_slabs;	/* arena held by slabs */
	uint64_t	bytes_capacity;
	uint64_t	slabs;
	uint64_t	evictions;
	uint64_t	evict_failures;	/* allocations refused with -ENOSPC */
	uint64_t	drops;
	uint64_t	index_buckets;
	uint64_t	meta_bytes;	/* all metadata allocated */
	double		meta_bytes_per_object;
	int		hugetlb;	/* 1: MAP_HUGETLB arena, 0: THP advice */
};
int	 dram_new(struct dram **, uint64_t arena_bytes, char *err, size_t errlen);
void	 dram_free(struct dram *);
/* Visible objects only; no side effects at all (PROBE). */
int	 dram_lookup(const struct dram *, const struct obj_key *, uint32_t *id);
size_t	 dram_lookup_many(const struct dram *, const struct obj_key *, size_t n, uint32_t *ids);
/*
 * A new WRITING object: invisible, never evicted; placed after near if
 * free, else where the batch's other objects (batch: this one and those
 * the caller allocates after it; 1: none) can follow it.
 */
int	 dram_alloc(struct dram *, const struct obj_key *, uint64_t len, uint32_t near,
	    uint32_t batch, uint32_t *id, uint8_t **buf);
int	 dram_commit(struct dram *, uint32_t id, uint64_t checksum);
void	 dram_abort(struct dram *, uint32_t id);
/* Pulled bytes that no restore has checked yet: the peer tier serves none of them. */
int	 dram_set_unverified(struct dram *, uint32_t id, int unverified);
int	 dram_unverified(const struct dram *, uint32_t id);
int	 dram_pin(struct dram *, uint32_t id);
void	 dram_unpin(struct dram *, uint32_t id);
void	 dram_touch(struct dram *, uint32_t id);
/* Out of the index now; a pinned object's memory goes at its last unpin. */
void	 dram_drop(struct dram *, uint32_t id);
const uint8_t *dram_data(const struct dram *, uint32_t id, uint64_t *len, uint64_t *checksum);
uint8_t	*dram_data_mut(struct dram *, uint32_t id);
const struct obj_key *dram_key(const struct dram *, uint32_t id);
void	 dram_stats(const struct dram *, struct dram_stats *);
void	 dram_ns_objects(const struct dram *, const uint8_t fingerprint[16],
	    uint64_t objects[PROTO_POOLS_MAX]);
size_t	 dram_lru_order(const struct dram *, uint64_t len, uint32_t *ids, size_t max);
void	*dram_arena(const struct dram *, size_t *len);

/*
 * filetier.c: the file tier, one directory of object files that daemons
 * of a role may share. Loop thread only; the module's threads do the I/O
 * and every completion runs on the loop. Keys are obj_keys; a key's
 * namespace must have been attached (filetier_scan_start) first. Files:
 * see filetier.c; the family (filetier_*.c) shares filetier.h.
 */
#define FILETIER_NONE		INDEX_NONE
#define FILETIER_HDR		4096			/* header block; the payload follows */
#define FILETIER_OBJ_MAX	(1ULL << 30)		/* payload bytes */
/* What a read destination must hold: the payload rounded up for O_DIRECT. */
#define FILETIER_READ_SIZE(len)	(((uint64_t)(len) + 4095) & ~(uint64_t)4095)
struct filetier_params {
	const char	*root;		/* made if missing */
	uint64_t	 capacity;	/* bytes of object files, headers included */
	int		 fsync;		/* fdatasync each object, fsync its directory */
	unsigned	 readers;	/* threads, one io_uring each */
	unsigned	 writers;	/* threads; unlinks go first */
	unsigned	 read_depth;	/* reads in flight per reader */
	unsigned	 write_queue;	/* writes queued or running before -EAGAIN */
	unsigned	 scan_threads;
	unsigned	 tmp_stale_s;	/* a scan removes temp files older than this */
	int		 direct;	/* O_DIRECT reads where the filesystem takes them */
	int		 io_uring;	/* 0: readers use preadv (also the fallback) */
	unsigned	 fd_cache;	/* open descriptors kept for small objects; 0: none */
	unsigned	 scan_delay_ms;	/* testing: a scan pauses before each directory */
	unsigned	 max_namespaces; /* known at once, attached or idle with objects */
	unsigned	 read_delay_ms;	/* testing: a read that succeeded reports this late */
	int		 openat2;	/* 0: walk paths as kernels without openat2 (tests) */
};
enum filetier_job_kind {
	FILETIER_JOB_READ = 1,
	FILETIER_JOB_WRITE,
	FILETIER_JOB_DELETE,	/* the module's own */
};
struct filetier_ns;
/*
 * A job belongs to the module from submission until its done() returned,
 * then it is freed: done() must not keep the pointer.
 */
struct filetier_job {
	int			 kind;		/* FILETIER_JOB_* */
	struct obj_key		 key;
	void			*buf;		/* read: destination; write: the payload */
	uint64_t		 len;		/* payload bytes */
	uint64_t		 checksum;	/* write: the caller's; read: verified */
	int			 status;	/* 0 or -errno, valid in done() */
	_Atomic int		 cancel;	/* a read not yet started ends -ECANCELED */
	void			(*done)(struct filetier_job *);	/* on the loop thread */
	void			*arg;
	/* The module's. */
	TAILQ_ENTRY(filetier_job) entry;
	struct filetier_ns	*ns;
	uint32_t		 id;
	uint16_t		 reader;
	int64_t			 due_ns;	/* testing.read_delay_ms: reported then */
	uint8_t			 tries;		/* write: retries after a full filesystem */
};
struct filetier_stats {
	uint64_t	namespaces;
	uint64_t	namespaces_open;	/* with their directory open: in use */
	uint64_t	namespaces_released;	/* directories closed as they went idle */
	uint64_t	namespaces_forgotten;	/* idle and empty, dropped for a new one */
	uint64_t	scanning;	/* namespaces whose scan still runs */
	uint64_t	visible;
	uint64_t	writing;
	uint64_t	deleting;	/* unlink queued */
	uint64_t	dead;		/* out of the index, kept until their last unpin */
	uint64_t	pinned_objects;
	uint64_t	pins;
	uint64_t	bytes_used;	/* files of visible and writing objects */
	uint64_t	bytes_deleting;
	uint64_t	bytes_capacity;
	uint64_t	bytes_capacity_effective;	/* lower while the filesystem is full */
	uint64_t	reads;
	uint64_t	read_failures;	/* each dropped its object */
	uint64_t	reads_cancelled;
	uint64_t	reads_inflight;
	uint64_t	bytes_read;
	uint64_t	writes;
	uint64_t	write_failures;
	uint64_t	write_nospace;	/* of those, ENOSPC or EDQUOT from the filesystem */
	uint64_t	write_nospace_retries;	/* ENOSPC, EDQUOT: evicted, written again */
	uint64_t	dirs_recreated;	/* namespace directories deleted while running, made again */
	uint64_t	writes_refused;	/* -EAGAIN: the write queue was full */
	uint64_t	writes_present;	/* -EEXIST */
	uint64_t	writes_inflight;
	uint64_t	bytes_written;
	uint64_t	evictions;
	uint64_t	evict_failures;	/* -ENOSPC: everything left is pinned or writing */
	uint64_t	drops;
	uint64_t	scan_objects;
	uint64_t	scan_bytes;
	uint64_t	scan_removed;	/* bad objects, stale temp files, junk */
	uint64_t	scan_skipped;
	uint64_t	scan_ms;
	uint64_t	index_buckets;
	uint64_t	meta_bytes;
	double		meta_bytes_per_object;
	unsigned	readers_uring;	/* readers with a ring */
};
struct filetier;
void	 filetier_params_default(struct filetier_params *);
int	 filetier_new(struct event_base *, const struct filetier_params *, struct filetier **,
	    char *err, size_t errlen);
void	 filetier_free(struct filetier *);
/*
 * Attaches a namespace ("role/model-<fingerprint hex>") and, the first
 * time, starts indexing its files on the tier's threads: lookups see them
 * as they are found; keys written meanwhile are kept, never replaced by
 * what the scan finds. Writes to the namespace work at once. A namespace
 * known already (idle since filetier_ns_detach) is attached again without
 * a scan. -EUSERS: max_namespaces are known and none can be forgotten.
 */
int	 filetier_scan_start(struct filetier *, const char *ns_name, const uint8_t fingerprint[16],
	    char *err, size_t errlen);
/* The same, waited for: runs the tier's event base until the scan ended. */
int	 filetier_scan(struct filetier *, const char *ns_name, const uint8_t fingerprint[16],
	    uint64_t *objects, char *err, size_t errlen);
/* The last session of a namespace left: its descriptors go once unused, its objects stay. */
void	 filetier_ns_detach(struct filetier *, const uint8_t fingerprint[16]);
/* 1 while a namespace's scan runs, 0 once it ended, -ENOENT: not attached; *objects so far. */
int	 filetier_scan_state(const struct filetier *, const uint8_t fingerprint[16],
	    uint64_t *objects);
/* Its VISIBLE objects per pool index: 0, or -ENOENT where the tier does not know it. */
int	 filetier_ns_objects(const struct filetier *, const uint8_t fingerprint[16],
	    uint64_t objects[PROTO_POOLS_MAX]);
/* Visible objects only; no side effects at all (PROBE). */
int	 filetier_lookup(const struct filetier *, const struct obj_key *, uint32_t *id,
	    uint64_t *len);
int	 filetier_pin(struct filetier *, uint32_t id);
void	 filetier_unpin(struct filetier *, uint32_t id);
void	 filetier_drop(struct filetier *, uint32_t id);
/*
 * Queues a write-through; data stays valid and unchanged until done().
 * -EEXIST (present or being written), -EBUSY (being unlinked), -EAGAIN
 * (queue full), -ENOSPC (capacity, nothing evictable), -ESRCH (namespace
 * not scanned), -EFBIG, -EINVAL, -ENOMEM. done() gets 0 once the object
 * is visible, or the -errno that left nothing visible.
 */
int	 filetier_write(struct filetier *, const struct obj_key *, const void *data,
	    uint64_t len, uint64_t checksum, void (*done)(struct filetier_job *), void *arg);
/*
 * Queues a read into dst (4096-aligned, cap >= FILETIER_READ_SIZE(len)),
 * which must stay valid until done(). -ENOENT (not visible), -EINVAL,
 * -EMSGSIZE, -ENOMEM. done() gets 0 with the payload verified, or the
 * file's fault (-ENOENT, -ENODATA, -EUCLEAN, -ESTALE, -EBADMSG, see
 * filetier_strerror) after the object left the tier, or -ECANCELED.
 */
int	 filetier_read(struct filetier *, const struct obj_key *, void *dst, uint64_t cap,
	    void (*done)(struct filetier_job *), void *arg, struct filetier_job **);
const char *filetier_strerror(int status);
/* The object header block alone (the fuzzer's): decode against a key, and encode. */
int	 filetier_hdr_parse(const uint8_t *h, size_t n, const struct obj_key *, uint64_t *len,
	    uint64_t *csum);
void	 filetier_hdr_make(uint8_t *h, const struct obj_key *, uint64_t len, uint64_t csum);
void	 filetier_stats(const struct filetier *, struct filetier_stats *);
size_t	 filetier_lru_order(const struct filetier *, uint32_t *ids, size_t max);
unsigned filetier_inflight(const struct filetier *);

/* region.c: engine memory registered at ATTACH */
struct kernels_region;
struct region {
	struct proto_region	 desc;
	void			*map;		/* memfd: the whole mapping */
	size_t			 map_len;
	uint8_t			*base;		/* memfd: map + (offset - aligned offset);
						   GPU: dev + offset, a device address */
	int			 fd;		/* memfd, unsealed: a duplicate for fstat; else -1 */
	int			 sealed;	/* memfd: F_SEAL_SHRINK held, it cannot shrink */
	/* GPU memory (cuda.c); kreg != NULL marks a GPU region. */
	void			*dev;		/* the IPC or cuMem mapping */
	size_t			 dev_len;	/* its length, 0 where the driver cannot say */
	int			 dev_owner;	/* opened it; other regions may share it */
	struct kernels_region	*kreg;
	struct kernels_event	*kev;		/* PROTO_MEM_CUDA_EVENT: the opened event */
	int			 gpu;		/* the GPU the memory is on */
	unsigned		 gpu_engine;	/* its copy engine's index (the device claim) */
	struct cuda_dev		*cdev;		/* that engine */
};
int	 region_map(struct region *, const struct proto_region *, int fd,
	    char *err, size_t errlen);
void	 region_unmap(struct region *);
int	 region_slot_ok(const struct region *, uint64_t slot);
int	 region_is_memory(const struct proto_region *);
int	 region_check_size(const struct region *, char *err, size_t errlen);

/*
 * copy.c: the copy-engine front (copy_submit, copy_cancel pick the host
 * or the cuda engine by the job's region) and the host copy engine:
 * worker threads that split each job into pieces run in parallel, under
 * a SIGBUS guard, and complete it through a workq.
 */
enum copy_kind {
	COPY_RESTORE = 1,	/* DRAM object -> engine region, verified first */
	COPY_PUBLISH,		/* engine region -> DRAM object, checksummed */
	COPY_DIGEST,		/* DRAM object -> its checksum; no region, nothing moves */
};
struct copy_page {
	uint8_t		*obj;		/* the object's bytes in the arena */
	uint64_t	 len;
	uint64_t	 checksum;	/* expected (restore) or computed (publish, digest) */
	uint32_t	 region_page;	/* page (or slot) index in the region */
	uint32_t	 id;		/* the DRAM object */
	const struct proto_region *geom;	/* this page's region, or NULL: the job's */
	uint8_t		*base;
	const struct region *region;	/* the same region, or NULL: the job's */
};
struct copy_job;
TAILQ_HEAD(copy_job_list, copy_job);
/*
 * Where one RESTORE's time went, CLOCK_MONOTONIC ns (0: not known): the
 * read callback that took its frame, restore_request(), the submit to the
 * copy engine, its first and last chunk issued, the GPU's stamps (with
 * the cuda engine's timeline on: first DMA start, last DMA end, the last
 * chunk's kernels start and checksum end, last chunk verified, last
 * chunk written), the last notification, done (the
 * loop saw it), its reply written. STATS "copy"."last_restore".
 */
struct copy_times {
	uint64_t	arrive, handled, submit, first_issue, last_issue;
	uint64_t	gpu_dma_start, gpu_dma_end, gpu_csum_start, gpu_csum_end, gpu_verified, gpu_end;
	uint64_t	notify, done, reply;
};

struct copy_job {
	TAILQ_ENTRY(copy_job)	 entry;
	int			 kind;		/* COPY_* */
	const struct proto_region *geom;	/* region geometry */
	uint8_t			*base;		/* region memory */
	const struct region	*region;	/* the same region: picks the engine */
	const struct region	*wait;		/* RESTORE: an event region to wait for, or NULL */
	struct copy_page	*pages;
	uint32_t		 npages;
	_Atomic int		 cancel;	/* set by the loop, read between pages */
	_Atomic uint32_t	 done_pages;	/* pages fully moved (and verified), in order */
	int			 status;	/* PROTO_S_*, valid in done() */
	uint32_t		 bad_page;	/* with PROTO_S_LOST */
	char			 why[160];	/* with PROTO_S_INTERNAL, _BAD_REGION: what failed */
	void			(*done)(struct copy_job *);	/* on the loop thread */
	void			*arg;
	struct cuda_job		*cuda;		/* cuda.c's, while on the GPU */
	struct cuda_dev		*cuda_dev;	/* cuda.c: the copy engine it went to */
	struct copy_times	 t;		/* RESTORE: its timeline */
	/* The host engine's, while on its workers (copy.c). */
	uint32_t		 npieces;	/* pages split into this many runs */
	uint32_t		 piece_pages;	/* pages per run, the last may be short */
	uint32_t		 next_piece;	/* the next run a worker takes, under its lock */
	_Atomic uint32_t	 pieces_left;	/* the worker ending the last one completes it */
	_Atomic uint32_t	 stop_page;	/* the first page a run stopped at; npages: none */
	_Atomic int		 failed;	/* a run failed: the others stop */
	struct workq_entry	 wq;
};
struct copy_engine;
struct server;
int	 copy_engine_new(struct event_base *, int nthreads, unsigned delay_ms,
	    struct copy_engine **, char *err, size_t errlen);
void	 copy_engine_free(struct copy_engine *);
void	 copy_submit(struct server *, struct copy_job *);
void	 copy_cancel(struct copy_job *);
unsigned copy_inflight(const struct copy_engine *);
void	 copy_host_submit(struct copy_engine *, struct copy_job *);
void	 copy_page_scatter(const struct proto_region *, uint8_t *base, uint32_t page,
	    uint8_t *obj, int to_region);
uint64_t copy_page_publish(uint8_t *obj, const uint8_t *src, uint64_t len);
/*
 * copy_csum.c: XXH3-64 built for AVX2; call only where the CPU has it.
 * _write: the digest of (p, n), with wlen bytes of wsrc copied to wdst
 * between its slices (the restore pipeline's step).
 */
uint64_t copy_csum_avx2(const void *, size_t);
uint64_t copy_csum_avx2_write(const void *p, size_t n, const uint8_t *wsrc, uint8_t *wdst,
	    size_t wlen);
void	 copy_csum_avx2_store(uint8_t *dst, const uint8_t *src, size_t n);

/*
 * cuda.c: the cuda copy engine's daemon side (kernels/ through kernels.h):
 * GPU regions (CUDA IPC handles, cuMem fds) and copy jobs on them, with
 * completions reported to the loop through the engine's notify eventfd.
 */
struct cuda_engine;
struct cuda_dev;
struct cuda_job;
int	 cuda_engine_new(struct event_base *, struct dram *, int ngpus, unsigned per_gpu,
	    struct cuda_engine **,
	    char *err, size_t errlen);
void	 cuda_engine_free(struct cuda_engine *);
unsigned cuda_inflight(const struct cuda_engine *);
unsigned cuda_waiting_on_events(const struct cuda_engine *);
#define CUDA_ENGINES_MAX	16	/* copy engines: GPUs x testing.cuda_engines_per_gpu */
#define CUDA_UUID_LEN		48	/* a GPU UUID's text, "GPU-" and 36, with room */
/* One copy engine's counters, for STATS "copy"."devices" (started: 0 until its first region). */
struct cuda_dev_stats {
	unsigned		 device;	/* the engine's index: what a region claims */
	int			 gpu;		/* the CUDA device it runs on */
	char			 uuid[CUDA_UUID_LEN];	/* its GPU's, "GPU-..." as nvidia-smi
							   prints it; "" where unknown */
	int			 started;
	unsigned		 jobs_inflight;
	unsigned		 regions;
	uint64_t		 jobs, restores, publishes, failed, bytes;
	unsigned		 staging_slots, staging_in_use;
	uint64_t		 staging_bytes;	/* one slot's */
	unsigned		 waiting_on_events;
	struct copy_times	 last_restore;
};
unsigned cuda_devices(const struct cuda_engine *);
const char *cuda_device_uuid(const struct cuda_engine *, unsigned i);
int	 cuda_kill_engine(struct cuda_engine *, const struct region *, unsigned nregions);
void	 cuda_dev_stats(const struct cuda_engine *, unsigned i, struct cuda_dev_stats *);
void	 cuda_submit(struct cuda_engine *, struct copy_job *);
void	 cuda_cancel(struct copy_job *);
int	 cuda_region_open(struct cuda_engine *, const char *none_why, struct region *regions,
	    unsigned i, const struct proto_region *, int fd, char *err, size_t errlen);
void	 cuda_region_close(struct region *);
int	 cuda_event_open(struct cuda_engine *, const char *none_why, struct region *,
	    const struct proto_region *, char *err, size_t errlen);

/* conn.c: one client connection; raw recvmsg in, one buffered write out */
struct session;
struct conn {
	int		 fd;
	struct server	*server;
	uid_t		 uid;
	gid_t		 gid;
	pid_t		 pid;
	uint64_t	 id;
	int		 flags;
#define CONN_F_HELLO	0x01	/* version fixed (set by the owner) */
#define CONN_F_DEAD	0x02	/* closing: no more reads, flush then free */
#define CONN_F_REAPED	0x04	/* free scheduled: nothing more is sent */
#define CONN_F_READING	0x08	/* in its read callback: replies are written at its end */
#define CONN_F_OVER	0x10	/* replies over limits.max_output: not reading */
#define CONN_F_PARTIAL	0x20	/* part of a frame is held: frame_ms runs */
#define CONN_F_PEER_GONE 0x40	/* EOF or an error from the peer: closed without linger */
#define CONN_F_FDS_LOST	0x80	/* the kernel dropped fds (MSG_CTRUNC) of a frame */
/* Set by the owner: past set-up (ATTACH), no frame takes fds; reads take what is there. */
#define CONN_F_ATTACHED	0x100
	uint16_t	 version;
	unsigned	 chan;		/* PROTO_CHAN_*: whose types its frames are */
	char		 client[PROTO_NAME_LEN];
	struct event	*ev_read;
	struct event	*ev_write;
	struct event	*ev_timer;	/* the earliest deadline below, when one runs */
	uint64_t	 timer_at;	/* what ev_timer is set for; 0: not set */
	uint64_t	 accepted_ms;	/* the HELLO deadline runs from here */
	uint64_t	 idle_ms;	/* unattached: the last frame, for the ATTACH deadline */
	uint64_t	 frame_ms;	/* CONN_F_PARTIAL: when the partial frame was first held */
	uint64_t	 out_ms;	/* CONN_F_OVER, or dead with replies left: since when */
	uint64_t	 wake_ns;	/* the read callback's start (a RESTORE's timeline) */
	uint8_t		*in;		/* header + payload being assembled */
	size_t		 in_off;	/* start of the current frame */
	size_t		 in_len;	/* bytes held */
	size_t		 in_cap;
	int		 in_fds[PROTO_FDS_MAX];
	int		 in_nfds;
	size_t		 fds_until;	/* a frame starting before this offset may take them */
	uint8_t		*out;		/* replies not yet written, from out_off */
	size_t		 out_off;
	size_t		 out_len;
	size_t		 out_cap;
	struct session	*session;	/* owned; NULL until ATTACH */
	/* The owner's callbacks (conn_new): a checked frame arrived, the connection closed. */
	void		(*frame_cb)(struct conn *, struct proto_frame *, void *);
	void		(*closed_cb)(struct conn *, void *);
	void		*cb_arg;
	TAILQ_ENTRY(conn) entry;	/* the owner's list (server.c: s->conns) */
};
TAILQ_HEAD(conn_list, conn);
struct conn *conn_new(struct server *, int fd, uid_t, gid_t, pid_t, unsigned chan,
	    void (*frame_cb)(struct conn *, struct proto_frame *, void *),
	    void (*closed_cb)(struct conn *, void *), void *arg);
void	 conn_free(struct conn *);
void	 conn_close(struct conn *);
int	 conn_reply(struct conn *, const struct proto_hdr *req, unsigned status,
	    const void *payload, uint32_t len);
int	 conn_reply_error(struct conn *, const struct proto_hdr *req, unsigned status,
	    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int	 conn_request(struct conn *, unsigned type, uint64_t seq, const void *payload,
	    uint32_t len);
int	 conn_send(struct conn *, const struct proto_hdr *, const void *payload);
void	 conn_linger(struct server *, int fd);
void	 conn_linger_free_all(struct server *);

/* A closed socket read and discarded until EOF, so its last frame is read, not reset. */
struct conn_linger {
	int		 fd;
	struct server	*server;
	struct event	*ev;
	uint64_t	 until;
	TAILQ_ENTRY(conn_linger) entry;
};
TAILQ_HEAD(conn_linger_list, conn_linger);

/* namespace.c */
struct metrics_ns;
struct ns {
	uint8_t		 fingerprint[16];
	char		 name[PROTO_NSNAME_LEN];
	struct proto_layout layout;
	struct proto_pool pools[PROTO_POOLS_MAX];
	unsigned	 refs;		/* attached sessions */
	struct metrics_ns *m;		/* its counters (metrics.c), never NULL */
	TAILQ_ENTRY(ns)	 entry;
};
TAILQ_HEAD(ns_list, ns);
/* Room for the longest canonical text (tests/check_attach.c checks it). */
#define NS_TEXT_MAX		4096
size_t	 ns_canonical(const struct proto_layout *, const struct proto_pool *,
	    const char *role, uint64_t seed, char *buf, size_t len);
void	 ns_fingerprint(const struct proto_layout *, const struct proto_pool *,
	    const char *role, uint64_t seed, uint8_t out[16]);
int	 ns_ref(struct server *, const struct proto_layout *, const struct proto_pool *,
	    struct ns **, char *err, size_t errlen);
void	 ns_unref(struct server *, struct ns *);
struct json_t;
/* LIST's namespaces: up to max entries appended to a JSON array; *total counts them all. */
void	 ns_list(struct server *, struct json_t *array, size_t max, size_t *total);

/* group.c: ranks of one engine instance attached to this daemon */
struct session;
struct conn;
struct proto_frame;
struct admission;
TAILQ_HEAD(admission_list, admission);
struct rank_group {
	char		 id[PROTO_GROUP_LEN];
	uint16_t	 size;
	uint8_t		 prefetch;
	uint8_t		 write;
	uint32_t	 prefetch_timeout_ms;
	struct session	**members;	/* size entries, NULL where not attached */
	unsigned	 nmembers;
	struct admission_list admissions;	/* by request id, answered or not */
	TAILQ_ENTRY(rank_group) entry;
};
TAILQ_HEAD(group_list, rank_group);
int	 group_guard(uint16_t dcp_size, uint8_t prefetch, uint8_t write,
	    uint8_t attention, char *err, size_t errlen);
int	 group_check(struct server *, const struct proto_attach *, char *err, size_t errlen);
int	 group_join(struct server *, struct session *, const struct proto_attach *,
	    struct rank_group **);
void	 group_leave(struct server *, struct session *);
void	 group_set_policy(struct conn *, struct proto_frame *);
/* LIST's groups: up to max entries appended to a JSON array; *total counts them all. */
void	 group_list(struct server *, struct json_t *array, size_t max, size_t *total);

/* session.c: one attached engine rank */
struct conn;
struct lease;
TAILQ_HEAD(lease_list, lease);
struct cache_probe_wait;
TAILQ_HEAD(cache_probe_list, cache_probe_wait);
/*
 * A session is reference counted: its connection holds one reference,
 * and every copy job that reads or writes its regions holds another, so
 * an engine that goes away keeps its memory mapped until its in-flight
 * copies drained (docs/contract.md, item 10).
 */
struct session {
	uint32_t	 id;
	unsigned	 refs;
	struct server	*server;
	struct conn	*conn;		/* borrowed; NULL once the engine left */
	struct ns	*ns;		/* a reference */
	struct metrics_ns *m;		/* its namespace's counters: static, they outlive ns */
	struct rank_group	*group;
	uint16_t	 group_rank;
	uint16_t	 tp_rank;
	uint16_t	 shard;		/* DCP rank under MLA, TP rank otherwise */
	uint8_t		 prefetch;	/* the group's policies */
	uint32_t	 prefetch_timeout_ms;
	struct region	 regions[PROTO_REGIONS_MAX];
	unsigned	 nregions;
	uint32_t	*live;		/* sorted live state slots */
	uint32_t	 nlive;
	struct lease_list leases;	/* this rank's leases */
	int		 slot_region;	/* the state-slot region, or -1 */
	uint8_t		*slot_held;	/* outstanding canonical slots (by a lease) */
	unsigned	 jobs;		/* copy jobs in flight on its regions */
	unsigned	 admits_waiting;	/* its ADMITs at an unanswered group barrier */
	struct cache_probe_list probes;	/* its PROBEs waiting for the peer tier's homes */
	int		 detach_waiting;	/* DETACH answered when jobs drain */
	struct proto_hdr detach_req;
};
int	 session_attach(struct conn *, const struct proto_frame *, struct session **,
	    struct proto_attach_reply *, char *err, size_t errlen);
void	 session_ref(struct session *);
void	 session_unref(struct session *);
void	 session_close(struct session *);
int	 session_slot_is_live(const struct session *, uint32_t slot);
int	 session_reply(struct session *, const struct proto_hdr *, unsigned status,
	    const void *payload, uint32_t len);
int	 session_reply_error(struct session *, const struct proto_hdr *, unsigned status,
	    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void	 session_job_done(struct session *);
int	 session_is_hybrid(const struct session *);
int	 session_pool_of(const struct session *, unsigned kind);
int	 session_region_of_pool(const struct session *, unsigned pool);
unsigned session_memory_region(const struct session *, uint32_t idx, const struct region **,
	    char *err, size_t errlen);

/*
 * peer_view.c: the peer tier's placement (rendezvous hashing over the
 * member list) and a view of what other daemons said they hold.
 */
#define PEER_REPLICAS_MAX	2
struct peer;
struct peer_olease;
struct peer_grant {
	struct obj_key		 key;
	uint64_t		 len;
	uint64_t		 checksum;	/* checksum_obj of the owner's bytes */
	uint64_t		 raddr;
	uint64_t		 rkey;
	struct peer		*peer;		/* the owner (peer.c's) */
	uint64_t		 incarnation;	/* the owner's when it answered */
	struct peer_olease	*ol;		/* the owner lease pinning it; NULL: a PROBE's */
	struct peer_grant	*next;
};
typedef void	peer_pull_done_fn(void *arg, int err);
struct peer_view {
	struct peer_grant	**buckets;
	unsigned		  nbuckets;
	size_t			  n;
	/*
	 * Pulls g into dst (g->len bytes): 0 and done later, or -errno and
	 * nothing started. With verify 0 the landed bytes are not checked
	 * against g->checksum: the caller's restore does it (peer_blame).
	 */
	int			(*pull)(struct server *, const struct peer_grant *, void *dst,
				    int verify, peer_pull_done_fn *, void *arg);
};
uint64_t peer_hrw_score(const char *id, const struct obj_key *pk);
void	 peer_place_key(const struct obj_key *, const uint8_t *head, struct obj_key *pk);
unsigned peer_homes(const struct peer_member *, size_t n, const struct obj_key *pk,
	    unsigned want, unsigned *out);
int	 peer_view_init(struct peer_view *, size_t n);
struct peer_grant *peer_view_find(const struct peer_view *, const struct obj_key *);
int	 peer_view_add(struct peer_view *, const struct peer_grant *);
void	 peer_view_fini(struct peer_view *, void (*drop)(struct peer_grant *));

/*
 * peer.c: the peer tier: members, the daemon-to-daemon control channel
 * (over conn.c, its own dispatcher), asks to the homes, pulls, offers.
 * peer_serve.c answers what other daemons ask. The family shares peer.h.
 */
enum peer_ask_kind {
	PEER_ASK_PROBE = 1,	/* which keys the homes hold: nothing pinned anywhere */
	PEER_ASK_LEASE,		/* the owners pin them for this daemon's pulls */
};
struct peer_ask;
/* An ask's answer, once, on the loop: the view is valid during the call only. */
typedef void	peer_ask_fn(struct server *, void *arg, struct peer_view *);
int	 peer_init(struct server *, char *err, size_t errlen);
uint32_t peer_serial(const struct peer *);
void	 peer_blame(struct server *, uint32_t serial, uint64_t len);
void	 peer_stop(struct server *);
void	 peer_free(struct server *);
void	 peer_members_set(struct server *, const struct peer_member *, size_t n);
int	 peer_reload(struct server *, const struct config *prev, char *err, size_t errlen);
int	 peer_enabled(const struct server *);
int	 peer_ask(struct server *, unsigned kind, const struct obj_key *keys, const uint8_t *heads,
	    size_t n, peer_ask_fn *done, void *arg, struct peer_ask **askp);
void	 peer_ask_cancel(struct peer_ask *);
void	 peer_offer(struct server *, const struct obj_key *keys, const uint8_t *heads,
	    const uint32_t *ids, size_t n);
unsigned peer_inflight(const struct server *);
struct json_t *peer_stats_json(struct server *);

/* cache.c: keys, PROBE, DEBUG */
struct obj_key;
void	 cache_key(const struct session *, unsigned pool, const uint8_t *hash,
	    struct obj_key *);
int	 cache_hashes_ok(const struct session *, const uint8_t *hashes, uint32_t n,
	    char *err, size_t errlen);
uint32_t cache_rank_hits(struct server *, const struct session *, unsigned pool,
	    const uint8_t *hashes, uint32_t n);
uint32_t cache_rank_hits_ids(struct server *, const struct session *, unsigned pool,
	    const uint8_t *hashes, uint32_t n, uint32_t *ids);
uint32_t cache_group_hits(struct server *, const struct session *, unsigned pool,
	    const uint8_t *hashes, uint32_t n);
int	 cache_file_ok(const struct server *, const struct session *, unsigned pool);
int	 cache_peer_keys(struct server *, struct session *const *ranks, unsigned nranks,
	    unsigned pool, int all_pools, const uint8_t *hashes, uint32_t n, struct obj_key **keys,
	    uint8_t **heads, size_t *nkeys);
uint32_t cache_group_stops(struct server *, struct session *const *ranks, unsigned nranks,
	    const uint8_t *hashes, uint32_t n, uint8_t *legal);
void	 cache_probe(struct conn *, struct proto_frame *);
void	 cache_probes_end(struct session *, int detach);
void	 cache_debug(struct conn *, struct proto_frame *);

/*
 * staging.c: objects of a lease read from a slower tier into DRAM, the
 * reads shared between leases, with a completion callback per lease.
 */
struct lease;
struct lease_obj;
struct staging_read;
enum staging_tier {
	STAGING_TIER_FILE = 1,	/* filetier.c */
	STAGING_TIER_PEER,	/* another daemon's DRAM, pulled (peer.c, through s->peer_view) */
};
/* status 0: every staged object landed; -EIO: bad_page (a prefix page) was lost. */
typedef void	staging_done_fn(struct server *, struct lease *, int status, uint32_t bad_page);
/* A lease's staging, staging.c's alone (a part of struct lease). */
struct staging {
	uint32_t		 inflight;	/* objects still being read */
	int			 failed;
	uint32_t		 bad_page;	/* the first page lost, with failed */
	staging_done_fn		*done;		/* staging_wait's, until called */
};
/* batch: o and the lease's objects staged after it, as dram_alloc's */
int	 staging_add(struct server *, struct lease *, struct lease_obj *, const struct obj_key *,
	    unsigned tier, uint32_t batch);
void	 staging_drop(struct lease *, struct lease_obj *);
void	 staging_moved(struct lease *, uint32_t from, uint32_t to);
int	 staging_pending(const struct lease *);
void	 staging_wait(struct lease *, staging_done_fn *);
int	 staging_status(const struct lease *, uint32_t *bad_page);

/*
 * lease.c: what one rank of an admission holds (pins, a slot, a TTL)
 * until RELEASE, expiry or its session's end; RELEASE.
 */
enum lease_state {
	LEASE_ADMITTED = 1,	/* pinned, waiting for RESTORE */
	LEASE_RESTORING,	/* a copy job in flight */
	LEASE_COPIED,		/* this rank's pages are in place, group not yet */
	LEASE_READY,		/* answered READY; pinned until RELEASE */
	LEASE_FAILED,
	LEASE_CANCELLED,
	LEASE_EXPIRED,
};
/*
 * One pinned object of a lease: which pool, which page of the prefix.
 * An object staged from a slower tier is a WRITING DRAM object, not yet
 * pinned, while read != NULL; pinned once its read committed it; and
 * DRAM_NONE once its read failed.
 */
struct lease_obj {
	uint32_t		 id;		/* the DRAM object */
	uint16_t		 pool;
	uint8_t			 staged;	/* 1: read from the file tier (a file hit); 2: pulled
						   from a peer (a peer hit) */
	uint8_t			 unverified;	/* pinned or landed unverified (dram_unverified):
						   its restore clears the mark */
	uint32_t		 page;		/* index in the admitted hashes */
	uint32_t		 from;		/* pulled for this lease from this peer
						   (peer_serial), whom a bad checksum blames */
	struct staging_read	*read;		/* a staging read in flight (staging.c) */
};
struct lease {
	uint64_t		 id;
	struct admission	*adm;		/* a reference */
	uint16_t		 rank;
	struct session		*sess;		/* a reference */
	int			 state;		/* LEASE_* */
	uint32_t		 npages;	/* the promise, in pages */
	struct lease_obj	*objs;		/* kv pages, sidecar pages, the checkpoint */
	uint32_t		 nobjs;
	uint32_t		 objs_cap;	/* allocated entries (kept for reuse) */
	uint32_t		 nunverified;	/* objs marked unverified: 0, and a restore
						   skips restore_checked's walk */
	uint32_t		 slot;		/* canonical state slot, PROTO_SLOT_NONE */
	int			 slot_held;	/* outstanding in the session */
	int			 pinned;
	struct event		*timer;		/* TTL, or the restore deadline; in the
						   lease's own allocation */
	struct copy_job		*job;		/* while RESTORING */
	int			 deadline_hit;	/* best_effort/timeout ended early */
	uint32_t		 landed;	/* pages in place */
	int			 restore_waiting;
	struct proto_hdr	 restore_req;
	int			 release_on_ready;	/* PROTO_RESTORE_F_RELEASE */
	uint64_t		 restore_arrive;	/* its timeline (copy_times): the read */
	uint64_t		 restore_handled;	/* ... restore_request() */
	struct copy_times	 job_times;	/* its copy's, from the job's completion */
	uint64_t		 restore_ns;	/* when the RESTORE came (metrics_now_ns) */
	uint32_t		 ready_pages;	/* answered READY with these (restore.c) */
	int			 ready;
	int			 cancel_waiting;
	struct proto_hdr	 cancel_req;
	struct staging		 staging;	/* objects on their way from a slower tier */
	struct proto_restore	*parked;	/* a RESTORE waiting for them: its request
						   and destinations (malloc), restore.c's */
	TAILQ_ENTRY(lease)	 entry;		/* in the session's list */
	uint64_t		 created_ms;	/* server_now_ms() at ADMIT */
	uint64_t		 expires_ms;	/* the TTL armed last runs out; 0: none armed */
	uint32_t		 ttl_ms;	/* that TTL (lease.ttl_ms when it was armed) */
};
/*
 * What a lease's end means above lease.c, set once by server.c so that
 * lease.c never calls up by name: a lease the group still needs ended
 * (restore_fail_group), and a lease let go of its admission
 * (admission_lease_gone).
 */
struct lease_hooks {
	void	(*group_fail)(struct server *, struct admission *, unsigned status,
		    const char *why);
	void	(*admission_gone)(struct server *, struct admission *);
};
void	 lease_set_hooks(const struct lease_hooks *);
struct lease *lease_new(struct server *, struct admission *, uint16_t rank, uint32_t npages,
	    const uint32_t *ids);
void	 lease_trim(struct server *, struct lease *, uint32_t npages);
struct lease *lease_find(const struct session *, uint64_t id);
void	 lease_unpin(struct server *, struct lease *);
void	 lease_release_slot(struct lease *);
void	 lease_free(struct server *, struct lease *);
void	 lease_arm_ttl(struct server *, struct lease *);
void	 release_request(struct conn *, struct proto_frame *);
/* LIST's leases: up to max entries appended to a JSON array; *total counts them all. */
void	 lease_list(struct server *, struct json_t *array, size_t max, size_t *total);

/* admit.c: the ADMIT group barrier and the promise */
struct admission {
	uint64_t		 request_id;
	struct rank_group	*group;		/* NULL once the group is gone */
	uint16_t		 size;
	uint16_t		 nasked;
	int			 answered;
	unsigned		 pool;		/* the kv pool's index */
	uint32_t		 npages;	/* as the first rank asked */
	uint8_t			*hashes;
	struct admit_rank {
		struct session	*sess;		/* a reference while asked */
		struct proto_hdr req;
		uint32_t	 reserved;
		uint32_t	 slot;
		int		 asked;
		uint64_t	 asked_ns;	/* when it asked (metrics_now_ns) */
		struct lease	*lease;
	}			*ranks;
	uint16_t		 ranks_cap;	/* allocated entries (kept for reuse) */
	uint32_t		 hashes_cap;	/* allocated pages of hashes */
	struct event		*deadline;
	struct proto_admit_reply reply;		/* lease filled per rank */
	unsigned		 refs;		/* the group's list + leases */
	int			 failed;	/* PROTO_S_* once the group restore failed */
	char			 why[160];
	struct peer_ask		*peer_ask;	/* the owners asked for leases; not answered */
	TAILQ_ENTRY(admission)	 entry;
};
void	 admit_request(struct conn *, struct proto_frame *);
void	 admit_session_closing(struct session *, int detach);
void	 admit_group_gone(struct server *, struct rank_group *);
void	 admission_lease_gone(struct server *, struct admission *);

/*
 * restore.c: RESTORE and CANCEL, group completion; drives a lease's states,
 * calling lease.c and staging.c, which never call it by name.
 */
void	 restore_request(struct conn *, struct proto_frame *);
void	 cancel_request(struct conn *, struct proto_frame *);
void	 restore_session_closing(struct session *);
void	 restore_fail_group(struct server *, struct admission *, unsigned status,
	    const char *why);

/* publish.c */
struct publish_backlog;
void	 publish_request(struct conn *, struct proto_frame *);
int	 publish_reserve(struct dram *, const struct obj_key *, uint64_t len, uint32_t *near,
	    uint32_t batch, uint32_t *id, uint8_t **buf);
void	 publish_backlog_stats(const struct server *, uint64_t *dirty, uint64_t *dirty_bytes,
	    uint64_t *waiting, uint64_t *waiting_bytes);
unsigned publish_backlog_waiting(const struct server *);
void	 publish_backlog_free(struct server *);

/*
 * reload.c: SIGHUP and RELOAD re-read the config file; live keys apply,
 * the others are refused by name. A section whose live keys need work
 * beyond their stored value registers a hook ("metrics.", "peer.").
 */
typedef int	reload_hook_fn(struct server *, const struct config *prev, char *err,
		    size_t errlen);
int	 reload_set_hook(const char *prefix, reload_hook_fn *);
int	 reload_init(struct server *, char *err, size_t errlen);
void	 reload_free(struct server *);
int	 reload_run(struct server *, const char *why, struct json_t **out, char *err,
	    size_t errlen);
void	 reload_request(struct conn *, struct proto_frame *);

/* dispatch.c: the engine connections' callbacks; the served types' handlers */
void	 dispatch_init(void);
void	 dispatch_frame(struct conn *, struct proto_frame *, void *);
void	 dispatch_session_end(struct conn *, const struct proto_hdr *detach);

/* server.c */
struct server {
	struct config	 *cfg;
	struct event_base *base;
	int		 listen_fd;
	struct event	*ev_listen;
	struct event	*ev_sigterm;
	struct event	*ev_sigint;
	struct event	*ev_drain;
	struct conn_list conns;
	struct conn_linger_list lingering;
	unsigned	 nlingering;
	int		 spare_fd;	/* given up to accept and refuse a peer at EMFILE */
	struct event	*ev_accept_pause;
	uint64_t	 nofd_logged_ms;
	uint64_t	 nofd_unlogged;	/* refusals at EMFILE since the last log line */
	struct ns_list	 namespaces;
	struct group_list groups;
	unsigned	 nconns;
	uint64_t	 next_conn_id;
	uint32_t	 next_session_id;
	int		 stopping;
	int		 gpu_present;
	struct dram	*dram;
	struct copy_engine *copy;
	struct cuda_engine *cuda;	/* NULL without a usable GPU */
	struct filetier	*file;		/* NULL unless tiers.file.path is set */
	struct publish_backlog *backlog; /* write-throughs waiting for the file tier */
	struct peer_tier *peer;		/* NULL unless peer.id is set */
	struct peer_view *peer_view;	/* while a PROBE or ADMIT counts what peers hold */
	const char	*cuda_none;	/* why s->cuda is NULL, for ATTACH's refusal */
	uint64_t	 next_lease;
	uint64_t	 started_ms;
	int		 exit_code;
	const char	*config_path;	/* -f FILE, re-read at a reload; NULL: the embedded one */
	struct event	*ev_sighup;	/* reload.c's */
	struct event	*ev_watchdog;	/* WATCHDOG=1 at half of $WATCHDOG_USEC */
	struct httpd	*httpd;		/* metrics.listen's server, or NULL */
};
int	 server_init(struct server *, struct config *, int ngpu, char *err, size_t errlen);
unsigned server_copies_inflight(const struct server *);
int	 server_run(struct server *);
void	 server_free(struct server *);
void	 server_maybe_finish(struct server *);
unsigned server_conns_of_uid(struct server *, uid_t);
uint64_t server_now_ms(void);
uint64_t server_now_ns(void);

/* metrics.c: counters, owned by the loop */
struct metrics {
	uint64_t	connections_accepted;
	uint64_t	connections_denied;
	uint64_t	connections_limited;
	uint64_t	connections_open;
	uint64_t	connections_no_fd;	/* refused at EMFILE/ENFILE with the spare fd */
	uint64_t	connections_timed_out;	/* HELLO, ATTACH or frame deadline */
	uint64_t	connections_slow;	/* replies not drained in output_timeout_ms */
	uint64_t	frames_in;
	uint64_t	frames_out;
	uint64_t	frames_bad;
	uint64_t	bytes_in;
	uint64_t	bytes_out;
	uint64_t	attaches;
	uint64_t	attaches_refused;
	uint64_t	guards_refused;
	uint64_t	detaches;
	uint64_t	stats_requests;
	uint64_t	health_requests;
	uint64_t	regions_mapped;
	uint64_t	events_open;	/* CUDA IPC events registered */
	uint64_t	region_bytes_mapped;
	/* The cache operations. */
	uint64_t	probes;
	uint64_t	admits;
	uint64_t	admits_admitted;
	uint64_t	admits_limited;		/* refused: admit.max_waiting reached */
	uint64_t	hits_dram;		/* pages_restored that DRAM held at ADMIT */
	uint64_t	hits_file;		/* pages_restored staged from the file tier */
	uint64_t	hits_peer;		/* pages_restored pulled from a peer */
	uint64_t	admit_pages;
	uint64_t	admits_declined[PROTO_DECLINE__MAX];
	uint64_t	restores_ready;
	uint64_t	restores_partial;
	uint64_t	restores_failed[PROTO_S__MAX];
	uint64_t	pages_restored;
	uint64_t	bytes_restored;
	uint64_t	publishes;
	uint64_t	publishes_failed;
	uint64_t	pages_published;
	uint64_t	bytes_published;
	uint64_t	pages_present;
	uint64_t	cancels;
	uint64_t	releases;
	uint64_t	lease_expiries;
	uint64_t	leases_open;
	uint64_t	objects_lost;
	/* Write-through to the file tier (publish.c). */
	uint64_t	file_writes;		/* queued */
	uint64_t	file_writes_failed;	/* refused at queueing or failed after */
	uint64_t	file_writes_present;	/* -EEXIST: the file was there already */
	uint64_t	file_writes_deferred;	/* waited in the backlog: the tier's queue was full */
	/* Reloads (reload.c) and the systemd watchdog. */
	uint64_t	reloads;		/* the file was read and compared */
	uint64_t	reloads_failed;		/* a bad or unreadable file: nothing changed */
	uint64_t	reload_keys_applied;
	uint64_t	reload_keys_refused;
	uint64_t	watchdog_pings;
	struct copy_times last_restore;		/* the last RESTORE answered ok */
	/*
	 * The last write-through's failure (-errno), 0 once one succeeded:
	 * /ready reports the file tier down while it is set. A full tier
	 * (ENOSPC, EDQUOT) and a file already there are not failures of it.
	 */
	int		file_write_error;
	/* metrics.listen's HTTP server (httpd.c). */
	uint64_t	http_requests[4];	/* /metrics, /health, /ready, any other */
	uint64_t	http_rejected;		/* not GET or HEAD: 405 */
	uint64_t	http_conns_refused;	/* over HTTPD_CONNS_MAX: closed at once */
	uint64_t	http_conns_expired;	/* open past HTTPD_CONN_MS: closed */
	uint64_t	http_scrape_ns;		/* the last /metrics: time to print it */
};
extern struct metrics metrics;
struct server;
char	*metrics_stats_json(struct server *);
char	*metrics_health_json(struct server *);

/*
 * Latency histograms (prom.c exposes them): fixed bucket bounds, so an
 * observation is a few compares and three adds on the loop thread, no
 * allocation, no lock. Buckets are not cumulative here; the exposition
 * sums them.
 */
#define METRICS_HIST_BOUNDS	19
extern const uint64_t metrics_hist_bounds_ns[METRICS_HIST_BOUNDS];
struct metrics_hist {
	uint64_t	bucket[METRICS_HIST_BOUNDS + 1];	/* the last: over every bound */
	uint64_t	sum_ns;
	uint64_t	count;
};
enum metrics_op {
	METRICS_OP_PROBE = 0,
	METRICS_OP_ADMIT,	/* from the rank's ADMIT to its answer: the barrier wait included */
	METRICS_OP_RESTORE,	/* from the RESTORE to its answer: staging and copy included */
	METRICS_OP_PUBLISH,	/* from the PUBLISH to its acknowledgement */
	METRICS_OP__MAX
};
/* [op][0]: succeeded (admitted, ready, stored), [op][1]: declined or failed. */
extern struct metrics_hist metrics_hist[METRICS_OP__MAX][2];

static inline uint64_t
metrics_now_ns(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline void
metrics_observe(unsigned op, int failed, uint64_t since_ns)
{
	struct metrics_hist	*h = &metrics_hist[op][failed != 0];
	uint64_t		 d = metrics_now_ns() - since_ns;
	unsigned		 i = 0;

	while (i < METRICS_HIST_BOUNDS && d > metrics_hist_bounds_ns[i])
		i++;
	h->bucket[i]++;
	h->sum_ns += d;
	h->count++;
}

/*
 * Counters per namespace, for the labels of /metrics: the first
 * METRICS_NS_MAX namespaces of the daemon's life get a slot each (kept
 * when their last session leaves, so that their counters never go back),
 * every later one shares the last slot, exposed as namespace="other".
 * Pages are counted per rank, as the STATS counters are.
 */
#define METRICS_NS_MAX		16
enum metrics_unfulfilled {
	METRICS_UNF_RESERVATION = 0,	/* hit beyond what the engine reserved */
	METRICS_UNF_STAGING,		/* cut short staging from a slower tier */
	METRICS_UNF_DECLINED,		/* hit, but the admission declined (reason in declines) */
	METRICS_UNF_DEADLINE,		/* admitted, not landed by a best_effort/timeout deadline */
	METRICS_UNF_FAILED,		/* admitted, the restore failed */
	METRICS_UNF_CANCELLED,		/* admitted, the restore was cancelled */
	METRICS_UNF_EXPIRED,		/* admitted, the lease expired before its restore */
	METRICS_UNF_RELEASED,		/* admitted, released (or its engine left) unrestored */
	METRICS_UNF__MAX
};
struct metrics_ns {
	int		used;
	uint8_t		fingerprint[16];
	char		name[PROTO_NSNAME_LEN];	/* "" in the shared slot */
	unsigned	npools;			/* 1 in the shared slot: every pool as "other" */
	char		pools[PROTO_POOLS_MAX][16];
	uint64_t	probes;
	uint64_t	admits;
	uint64_t	admits_limited;
	uint64_t	admitted;
	uint64_t	declined[PROTO_DECLINE__MAX];
	uint64_t	requested_pages;	/* the pages each answered rank asked for */
	uint64_t	hit_pages;		/* the group hit each asking rank was told */
	uint64_t	admitted_pages;
	uint64_t	unfulfilled[METRICS_UNF__MAX];
	uint64_t	restores_ready;
	uint64_t	restores_partial;
	uint64_t	restores_failed[PROTO_S__MAX];
	uint64_t	restored_pages[3];	/* by the tier that held them: dram, file, peer */
	uint64_t	restored_bytes;
	uint64_t	prefetched_tokens;	/* restored kv pages x the layout's page_tokens */
	uint64_t	publishes;
	uint64_t	publishes_failed;
	uint64_t	published_pages[PROTO_POOLS_MAX];
	uint64_t	published_bytes[PROTO_POOLS_MAX];
	uint64_t	present_pages[PROTO_POOLS_MAX];
	uint64_t	backed_up_tokens;	/* stored kv pages x the layout's page_tokens */
};
extern struct metrics_ns metrics_ns[METRICS_NS_MAX + 1];
struct metrics_ns *metrics_ns_slot(const struct ns *);
/* The pool index in a slot's per-pool counters (0 in the shared slot). */
static inline unsigned
metrics_ns_pool(const struct metrics_ns *m, unsigned pool)
{
	return m->name[0] == '\0' ? 0 : pool % PROTO_POOLS_MAX;
}

/*
 * prom.c: the Prometheus text exposition (format 0.0.4) of the counters,
 * built on demand into an evbuffer, and the readiness the HTTP server
 * reports.
 */
struct evbuffer;
int	 prom_write(struct server *, struct evbuffer *);
/* 1 when ready; 0 with why filled (one line) when not. */
int	 prom_ready(struct server *, char *why, size_t len);

/*
 * httpd.c: metrics.listen's HTTP server (libevent's evhttp) on the
 * daemon's loop: /metrics, /health, /ready; GET and HEAD only.
 */
struct httpd;
int	 httpd_new(struct server *, const char *listen, struct httpd **, char *err,
	    size_t errlen);
void	 httpd_free(struct httpd *);
int	 httpd_reload(struct server *, const struct config *prev, char *err, size_t errlen);
/* The address it listens on, "host:port" (the port the kernel chose for port 0). */
const char *httpd_address(const struct httpd *);

#endif /* L3KV_DAEMON_H */
