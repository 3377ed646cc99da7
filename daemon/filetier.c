/*
 * The file tier: objects kept as files in a directory that several
 * daemons of one role may share (a local disk, or 3FS, Lustre, CephFS,
 * NFS). Operators trust it with their cache, so every rule here is about
 * never serving a byte that is not exactly what was published.
 *
 * On disk:
 * - <root>/<role>/<model>-<32 hex fingerprint>/ is a namespace, named by
 *   namespace.c; the name is checked again here, and below it every path
 *   is hex made by this module: <pool:2>-<shard:4>/<hash[0]:2>/<hash:64>.obj.
 *   No client string ever becomes a path.
 * - An object file is a 4096-byte header (magic, version, key, payload
 *   length, payload checksum, header checksum) followed by the payload,
 *   which therefore starts 4096-aligned and is read with O_DIRECT.
 * - A write goes to .tmp-<random> in the object's directory (optionally
 *   fdatasync'd) and is renamed into place: a reader sees the old complete
 *   file, the new complete file, or nothing. Two writers of one key write
 *   the same bytes, and the last rename wins harmlessly.
 *
 * In memory the loop thread alone owns an index of the objects (index.c's:
 * 80-byte records named by 32-bit ids, as dram.c's are), one LRU list of
 * the evictable ones, and pins. Worker threads do all file I/O and
 * report through one eventfd watched by the loop, as copy.c does:
 * - reader threads each drive an io_uring ring, read_depth objects in
 *   flight: an openat into a direct descriptor, then one readv of header
 *   and payload, the reads of a batch submitted together so that the block
 *   layer merges neighbours; no system call per object. Small objects are
 *   opened into plain descriptors that an open-file cache keeps once their
 *   read verified: reading them again costs one fstat and no open. The
 *   loop gives each read to the least busy reader. The header is
 *   validated against the key asked for and the payload checksummed
 *   before the read reports success; a file found missing, truncated,
 *   damaged or foreign fails its read with its own errno, is unlinked,
 *   and leaves the index;
 * - writer threads write, rename and unlink (eviction) with plain system
 *   calls, deletions first.
 * Every path below a namespace is walked by descriptor with no symbolic
 * link followed (openat2, or O_NOFOLLOW per component): nothing outside
 * the root is ever read, made or removed. A namespace without sessions
 * keeps no descriptor; its objects stay indexed.
 * A namespace enters the index by a scan of its directory (headers only,
 * by scan_threads threads, off the loop: see the scan's section), which
 * also removes stale temp files and anything in the object directories
 * that is not a valid object.
 */
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include <linux/openat2.h>

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <liburing.h>
#include <xxhash.h>

#include "daemon.h"

#define FILETIER_MAGIC		"l3kvobj"	/* 8 bytes with its NUL */
#define FILETIER_VERSION	1
#define FILETIER_HDR_CSUM_OFF	96		/* the header checksum covers bytes before it */
#define FILETIER_HDR_USED	104
#define FILETIER_PINS_MAX	UINT16_MAX
#define FILETIER_OBJ_PATH	80		/* "pp-ssss/hh/<64 hex>.obj" and its NUL */
#define FILETIER_DIR_MODE	0750		/* KV bytes are derived from prompts */
#define FILETIER_FILE_MODE	0640
#define FILETIER_TMP_PREFIX	".tmp-"
#define FILETIER_NOSPACE_TRIES	8		/* a full filesystem: evict and retry, this often */
#define FILETIER_RECHECK_NS	1000000000LL	/* a lowered capacity is rechecked once a second */
#define FILETIER_WARN_NS	10000000000LL	/* a recreated directory is reported every 10 s */

_Static_assert(FILETIER_HDR_USED <= FILETIER_HDR, "the header fits its block");
_Static_assert(FILETIER_OBJ_MAX + FILETIER_HDR <= 0x7ffff000, "a read's size fits a CQE");

/*
 * One object. Entry states: WRITING (indexed so a second write of the
 * key is refused, invisible, never evicted), VISIBLE, DELETING (indexed
 * until its unlink ran, so a write cannot race it; invisible) and DEAD
 * (out of the index, its file gone or disowned, kept for its pins until
 * the last unpin). The LRU list holds exactly the VISIBLE entries without pins,
 * so eviction takes its tail and can never reach a pinned one.
 */
struct filetier_ent {
	struct index_rec rec;		/* key and links: index.c's */
	uint8_t		state;		/* index.c reads it too */
#define FILETIER_S_FREE		0	/* as index.c frees a record */
#define FILETIER_S_WRITING	1
#define FILETIER_S_VISIBLE	2	/* what lookups see */
#define FILETIER_S_DELETING	3
#define FILETIER_S_DEAD		4
	uint8_t		scanned;	/* indexed by a scan, its LRU place not final yet */
	uint16_t	pins;
	uint64_t	len;		/* payload bytes */
};
_Static_assert(sizeof(struct filetier_ent) == INDEX_REC_SIZE, "filetier_ent is the per-object budget");
_Static_assert(offsetof(struct filetier_ent, rec) == 0 && FILETIER_S_FREE == 0 &&
    offsetof(struct filetier_ent, state) == INDEX_STATE_OFF, "a record as index.c sees it");

/*
 * A namespace the tier knows: attached by a session of the daemon, or
 * idle with its objects still indexed (they come back without a scan
 * when it is attached again). Only a namespace in use holds descriptors:
 * its directory is open while it is attached, scanned or named by a job,
 * and closed once none of these holds (filetier_ns_idle). Freed when it
 * is forgotten (idle, no object indexed, no job) or with the tier; jobs
 * and open-file cache entries point at it until then. Loop thread only,
 * except dirfd and direct, which the workers of its jobs read.
 */
struct filetier_ns {
	uint8_t		fingerprint[16];
	char		name[PROTO_NSNAME_LEN];
	int		dirfd;		/* -1 while idle */
	_Atomic int	direct;		/* 1 until a filesystem refuses O_DIRECT */
	uint64_t	scanned;	/* objects indexed by its scan, so far */
	uint64_t	objects;	/* its entries in the index, any state */
	uint64_t	visible[PROTO_POOLS_MAX];	/* its VISIBLE entries, by pool (STATS) */
	unsigned	jobs;		/* its jobs whose completion has not run */
	int		attached;	/* a session uses it (filetier_scan_start) */
	int		scan_err;	/* the scan's failure, once it ended */
	struct filetier_scan *scan;	/* its scan, while it runs */
	int		scanning;	/* the scan has not finished */
};

TAILQ_HEAD(filetier_job_list, filetier_job);

struct filetier {
	struct event_base	*base;
	struct filetier_params	 p;
	char			 root[PATH_MAX];
	int			 rootfd;
	struct filetier_ns	**ns;
	unsigned		 nns;
	unsigned		 ns_cap;

	/* The index: loop thread only. */
	struct index		 ix;		/* WRITING, VISIBLE and DELETING entries */
	struct index_lru	 lru;		/* exactly the VISIBLE entries without pins */
	struct filetier_stats	 st;		/* counters kept as they change */
	unsigned		 nscanning;	/* namespaces whose scan runs */
	/*
	 * What eviction keeps the files under: the configured capacity, or
	 * less since a write found the filesystem full (ENOSPC, EDQUOT): the
	 * bytes the tier had then plus what the filesystem had free. Raised
	 * again, at most once a second, as the filesystem frees up.
	 */
	uint64_t		 cap_eff;
	int64_t			 cap_checked_ns;
	struct filetier_job_list nospace;	/* writes to retry once the unlinks ran */
	uint64_t		 dirs_logged;	/* recreations reported so far, and when */
	int64_t			 dirs_logged_ns;

	/* Workers: the lock guards the queues, stop, and nothing else. */
	pthread_mutex_t		 lock;
	pthread_cond_t		 wcond;
	struct filetier_job_list writes;
	struct filetier_job_list deletes;
	struct filetier_job_list done;
	int			 stop;
	int			 efd;		/* workers -> loop */
	struct event		*ev;
	struct filetier_job_list delayed;	/* testing.read_delay_ms: loop thread */
	struct event		*delay_ev;
	pthread_t		*threads;
	unsigned		 nthreads;
	struct filetier_reader	*readers;
	struct filetier_fdc	*fdc;		/* open-file cache, or NULL */
	/* Writers that find a namespace directory deleted make it again, one at a time. */
	pthread_mutex_t		 dir_lock;
	_Atomic uint64_t	 dirs_recreated;
};

/*
 * A reader thread: its own queue (so that the loop can keep every ring
 * full), its ring and the ring's in-flight slots. A reader with a ring
 * sleeps only in the ring, on its reads and on a read of its kick eventfd,
 * which the loop writes when it queues work for an idle reader: a reader
 * waiting for one read never leaves new work waiting behind it.
 */
struct filetier_reader {
	struct filetier		*ft;
	struct filetier_job_list queue;		/* under ft->lock */
	pthread_cond_t		 cond;		/* readers without a ring sleep here */
	int			 kick_fd;	/* loop -> reader */
	uint64_t		 kick_buf;
	int			 kick_armed;
	unsigned		 outstanding;	/* loop thread: queued and in flight */
	struct io_uring		 ring;
	int			 uring;		/* 0: the ring could not be set up, pread */
	uint8_t			*hdrs;		/* read_depth aligned 4096-byte headers */
	struct filetier_slot {
		struct filetier_job	*job;
		struct iovec		 iov[2];
		char			 path[FILETIER_OBJ_PATH];
		struct open_how		 how;	/* read by the kernel at submission */
		int			 direct;
		int			 open_res;
		int			 read_res;
		int			 fd;	/* a plain descriptor (cache on), or -1 */
		uint32_t		 fdc;	/* fd's cache entry, or FILETIER_NONE */
	}			*slots;
	unsigned		*free_slots;
	unsigned		 nfree;
};

static struct filetier_ns *filetier_ns_find(const struct filetier *, const uint8_t fp[16]);
static int	filetier_ns_open(struct filetier *, struct filetier_ns *, int create, int check,
		    char *err, size_t errlen);
static int	filetier_unlink_bad(int status);
static int	filetier_status_lost(int status);
static void	filetier_scan_note_gone(struct filetier *, const struct obj_key *);
static int64_t	filetier_now_ns(clockid_t);

/* Keys and paths: pure functions, called by every thread. */

static const char filetier_hexd[] = "0123456789abcdef";

static void
filetier_hex(char *out, const uint8_t *in, size_t n)
{
	size_t	i;

	for (i = 0; i < n; i++) {
		out[2 * i] = filetier_hexd[in[i] >> 4];
		out[2 * i + 1] = filetier_hexd[in[i] & 15];
	}
	out[2 * n] = '\0';
}

static int
filetier_unhex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;	/* upper case too: names are made lower case, one spelling only */
}

/* n bytes from 2n lowercase hex digits; -1 on anything else. */
static int
filetier_unhex(uint8_t *out, const char *in, size_t n)
{
	size_t	i;
	int	hi, lo;

	for (i = 0; i < n; i++) {
		if ((hi = filetier_unhex_digit(in[2 * i])) < 0 ||
		    (lo = filetier_unhex_digit(in[2 * i + 1])) < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

/* "pp-ssss/hh/<64 hex>.obj", by hand: every read and write makes one. */
static void
filetier_obj_path(const struct obj_key *k, char *buf)
{
	uint8_t	ps[3] = { k->pool, (uint8_t)(k->shard >> 8), (uint8_t)k->shard };

	filetier_hex(buf, ps, 1);
	buf[2] = '-';
	filetier_hex(buf + 3, ps + 1, 2);
	buf[7] = '/';
	filetier_hex(buf + 8, k->hash, 1);
	buf[10] = '/';
	filetier_hex(buf + 11, k->hash, sizeof(k->hash));
	memcpy(buf + 75, ".obj", 5);
}
_Static_assert(FILETIER_OBJ_PATH == 80, "pp-ssss/hh/ + 64 hex + .obj + NUL");
#define FILETIER_OBJ_NAME	11		/* the file's name in its path */

/*
 * Paths below a namespace are walked by descriptor and never through a
 * symbolic link: a directory of the tier swapped for a link (by another
 * user of a shared filesystem, or an operator's mistake) must not lead a
 * read, a write, a rename or an unlink outside the root. openat2 says so
 * in one call (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: a link anywhere in
 * the path is ELOOP); kernels without it (before 5.6) get one openat per
 * component with O_NOFOLLOW. A link found fails with ELOOP or ENOTDIR.
 */
static _Atomic int	filetier_has_openat2 = 1;

/*
 * A directory's openat with O_NOFOLLOW failed: a link there is ELOOP, as
 * openat2 says it (O_DIRECTORY makes the kernel answer ENOTDIR).
 */
static int
filetier_dir_errno(int dirfd, const char *name, int err)
{
	struct stat	st;

	if (err == ENOTDIR && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    S_ISLNK(st.st_mode))
		return -ELOOP;
	return -err;
}

static int
filetier_open_walk(int dirfd, const char *path, int flags, mode_t mode)
{
	char		 comp[FILETIER_OBJ_PATH];
	const char	*p = path, *slash;
	int		 cur = dirfd, fd;

	while ((slash = strchr(p, '/')) != NULL) {
		if ((size_t)(slash - p) >= sizeof(comp) || slash == p) {
			fd = -EINVAL;
			goto out;
		}
		memcpy(comp, p, (size_t)(slash - p));
		comp[slash - p] = '\0';
		fd = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			fd = filetier_dir_errno(cur, comp, errno);
			goto out;
		}
		if (cur != dirfd)
			close(cur);
		cur = fd;
		p = slash + 1;
	}
	if ((fd = openat(cur, p, flags | O_NOFOLLOW, mode)) < 0)
		fd = filetier_dir_errno(cur, p, errno);
out:
	if (cur != dirfd)
		close(cur);
	return fd;
}

/* A descriptor of path under dirfd, no link followed; -errno. Thread-safe. */
static int
filetier_open_beneath(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how	how;
	long		fd;

	if (atomic_load_explicit(&filetier_has_openat2, memory_order_relaxed)) {
		memset(&how, 0, sizeof(how));
		how.flags = (uint64_t)(flags | O_NOFOLLOW);
		how.mode = (flags & O_CREAT) ? mode : 0;
		how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
		if ((fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how))) >= 0)
			return (int)fd;
		if (errno != ENOSYS)
			return -errno;
		atomic_store(&filetier_has_openat2, 0);
	}
	return filetier_open_walk(dirfd, path, flags, mode);
}

/*
 * The object's leaf directory "pp-ssss/hh", opened with no link followed;
 * create makes the missing ones, *made getting 1 (pool) | 2 (leaf) for
 * them. *poolfd, when asked for, gets the pool directory too. -errno.
 */
static int
filetier_leaf_open(int nsfd, const struct obj_key *k, int create, int *made, int *poolfd)
{
	char	pool[8], leaf[3], path[FILETIER_OBJ_PATH];
	int	pfd, lfd = -1;

	if (poolfd != NULL)
		*poolfd = -1;
	else {
		/* The common case, an existing leaf: one call (openat2 walks both components). */
		filetier_obj_path(k, path);
		path[10] = '\0';
		lfd = filetier_open_beneath(nsfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
		if (lfd >= 0 || lfd != -ENOENT || !create)
			return lfd;
	}
	snprintf(pool, sizeof(pool), "%02x-%04x", k->pool, k->shard);
	snprintf(leaf, sizeof(leaf), "%02x", k->hash[0]);
	pfd = openat(nsfd, pool, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (pfd < 0 && errno == ENOENT && create) {
		if (mkdirat(nsfd, pool, FILETIER_DIR_MODE) == 0)
			*made |= 1;
		else if (errno != EEXIST)
			return -errno;
		pfd = openat(nsfd, pool, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (pfd < 0)
		return filetier_dir_errno(nsfd, pool, errno);
	lfd = openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (lfd < 0 && errno == ENOENT && create) {
		if (mkdirat(pfd, leaf, FILETIER_DIR_MODE) == 0)
			*made |= 2;
		else if (errno != EEXIST) {
			lfd = -errno;
			close(pfd);
			return lfd;
		}
		lfd = openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (lfd < 0)
		lfd = filetier_dir_errno(pfd, leaf, errno);
	if (poolfd != NULL && lfd >= 0)
		*poolfd = pfd;
	else
		close(pfd);
	return lfd;
}

/* Unlinks the object's file, no link followed on the way: 0, or -errno (ENOENT is 0). */
static int
filetier_unlink_obj(int nsfd, const struct obj_key *k)
{
	char	path[FILETIER_OBJ_PATH];
	int	lfd, rc = 0;

	if ((lfd = filetier_leaf_open(nsfd, k, 0, NULL, NULL)) < 0)
		return lfd == -ENOENT ? 0 : lfd;
	filetier_obj_path(k, path);
	if (unlinkat(lfd, path + FILETIER_OBJ_NAME, 0) != 0 && errno != ENOENT)
		rc = -errno;
	close(lfd);
	return rc;
}

static inline uint64_t
filetier_file_bytes(uint64_t len)
{
	return FILETIER_HDR + len;
}

static void
filetier_le64(uint8_t *p, uint64_t v)
{
	int	i;

	for (i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
filetier_get64(const uint8_t *p)
{
	uint64_t	v = 0;
	int		i;

	for (i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint32_t
filetier_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/*
 * The header block, little-endian:
 *	 0  8	magic "l3kvobj\0"
 *	 8  4	format version (1)
 *	12  4	header length = payload offset (4096)
 *	16 16	namespace fingerprint
 *	32  1	pool	33  1  zero	34  2  shard
 *	36  4	flags (0)
 *	40 32	page hash
 *	72  8	payload length
 *	80  8	payload checksum (dram_checksum)
 *	88  8	written at, Unix ns (informative)
 *	96  8	XXH3-64 of bytes 0..95
 *     104	zeros to 4096
 */
static void
filetier_hdr_build(uint8_t *h, const struct obj_key *k, uint64_t len, uint64_t csum)
{
	struct timespec	ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	memset(h, 0, FILETIER_HDR);
	memcpy(h, FILETIER_MAGIC, 8);
	h[8] = FILETIER_VERSION;
	h[12] = FILETIER_HDR & 0xff;
	h[13] = FILETIER_HDR >> 8;
	memcpy(h + 16, k->fingerprint, 16);
	h[32] = k->pool;
	h[34] = (uint8_t)k->shard;
	h[35] = (uint8_t)(k->shard >> 8);
	memcpy(h + 40, k->hash, 32);
	filetier_le64(h + 72, len);
	filetier_le64(h + 80, csum);
	filetier_le64(h + 88, (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
	filetier_le64(h + FILETIER_HDR_CSUM_OFF, XXH3_64bits(h, FILETIER_HDR_CSUM_OFF));
}

/*
 * Checks a header against the key expected: 0 with the payload's length
 * and checksum, -EUCLEAN for a damaged or unknown header, -ESTALE for a
 * sound header of another object (another fingerprint, pool, shard or
 * page: a file copied or renamed by someone else).
 */
static int
filetier_hdr_check(const uint8_t *h, const struct obj_key *k, uint64_t *len, uint64_t *csum)
{
	if (memcmp(h, FILETIER_MAGIC, 8) != 0 || filetier_get32(h + 8) != FILETIER_VERSION ||
	    filetier_get32(h + 12) != FILETIER_HDR || h[33] != 0 || filetier_get32(h + 36) != 0 ||
	    filetier_get64(h + FILETIER_HDR_CSUM_OFF) != XXH3_64bits(h, FILETIER_HDR_CSUM_OFF))
		return -EUCLEAN;
	*len = filetier_get64(h + 72);
	*csum = filetier_get64(h + 80);
	if (*len == 0 || *len > FILETIER_OBJ_MAX)
		return -EUCLEAN;
	if (memcmp(h + 16, k->fingerprint, 16) != 0 || h[32] != k->pool ||
	    (uint16_t)(h[34] | h[35] << 8) != k->shard || memcmp(h + 40, k->hash, 32) != 0)
		return -ESTALE;
	return 0;
}

/*
 * The header decoder on its own, for the fuzzer: n bytes of a file's
 * start checked against the key expected, as a read or a scan checks
 * them. 0 with the payload's length and checksum, -ENODATA (short),
 * -EUCLEAN (damaged or unknown), -ESTALE (sound, another key).
 */
int
filetier_hdr_parse(const uint8_t *h, size_t n, const struct obj_key *k, uint64_t *len,
    uint64_t *csum)
{
	if (n < FILETIER_HDR_USED)
		return -ENODATA;
	return filetier_hdr_check(h, k, len, csum);
}

/* The header block of an object, as a write makes it (FILETIER_HDR bytes at h). */
void
filetier_hdr_make(uint8_t *h, const struct obj_key *k, uint64_t len, uint64_t csum)
{
	filetier_hdr_build(h, k, len, csum);
}

/*
 * A finished read: res bytes of the file are in hdr (4096) and buf. The
 * file must be exactly header + len and the payload must match the
 * header's checksum. Thread-safe.
 */
static int
filetier_read_verify(const struct filetier_job *job, const uint8_t *hdr, ssize_t res,
    uint64_t *csum)
{
	uint64_t	len, want;
	int		rc;

	if (res < FILETIER_HDR_USED)
		return -ENODATA;
	if ((rc = filetier_hdr_check(hdr, &job->key, &len, &want)) != 0)
		return rc;
	if (len != job->len)
		return -EUCLEAN;
	if ((uint64_t)res < filetier_file_bytes(len))
		return -ENODATA;
	if ((uint64_t)res > filetier_file_bytes(len))
		return -EUCLEAN;	/* bytes past the payload: not a file we wrote */
	if ((*csum = dram_checksum(job->buf, len)) != want)
		return -EBADMSG;
	return 0;
}

const char *
filetier_strerror(int status)
{
	switch (status) {
	case 0:		return "ok";
	case -ENOENT:	return "the object file is missing";
	case -ENODATA:	return "the object file is truncated";
	case -EUCLEAN:	return "the object header is damaged";
	case -ESTALE:	return "the object file belongs to another key or fingerprint";
	case -EBADMSG:	return "the object payload fails its checksum";
	case -ELOOP:	return "the object path is a symbolic link";
	case -ECANCELED: return "cancelled";
	}
	return strerror(-status);
}

/* Index: index.c's, loop thread only. */

static inline struct filetier_ent *
filetier_ent(const struct filetier *ft, uint32_t id)
{
	return (struct filetier_ent *)index_rec(&ft->ix, id);
}

static inline struct filetier_ent *
filetier_ent_live(const struct filetier *ft, uint32_t id)
{
	return (struct filetier_ent *)index_rec_live(&ft->ix, id);
}

/* Out of the index; a scan running meanwhile must not bring the key back. */
static void
filetier_index_remove(struct filetier *ft, uint32_t id)
{
	struct filetier_ns	*ns = filetier_ns_find(ft, filetier_ent(ft, id)->rec.key.fingerprint);

	index_remove(&ft->ix, id);
	if (ns != NULL)
		ns->objects--;
	if (ft->nscanning > 0)
		filetier_scan_note_gone(ft, &filetier_ent(ft, id)->rec.key);
}

static struct filetier_ns *
filetier_ns_find(const struct filetier *ft, const uint8_t fp[16])
{
	unsigned	i;

	for (i = 0; i < ft->nns; i++)
		if (memcmp(ft->ns[i]->fingerprint, fp, 16) == 0)
			return ft->ns[i];
	return NULL;
}

/* Closes an idle namespace's directory: no session, no scan and no job use it. */
static void
filetier_ns_idle(struct filetier *ft, struct filetier_ns *ns)
{
	if (ns->attached || ns->jobs > 0 || ns->scanning || ns->dirfd < 0)
		return;
	close(ns->dirfd);
	ns->dirfd = -1;
	ft->st.namespaces_released++;
}

/*
 * A job will name ns: its directory is opened again if it was idle (an
 * eviction or a write completing after the last session left). -errno
 * when it cannot be; then there is no job.
 */
static int
filetier_ns_hold(struct filetier *ft, struct filetier_ns *ns)
{
	char	err[256];
	int	rc;

	if (ns->dirfd < 0 && (rc = filetier_ns_open(ft, ns, 0, 0, err, sizeof(err))) != 0) {
		log_warn("filetier", "%s", err);
		return rc;
	}
	ns->jobs++;
	return 0;
}

static void
filetier_ns_put(struct filetier *ft, struct filetier_ns *ns)
{
	assert(ns->jobs > 0);
	ns->jobs--;
	filetier_ns_idle(ft, ns);
}

/* Jobs: handed to the workers under the lock. */

/*
 * A read goes to the reader with the least outstanding work, which keeps
 * the rings evenly full; a reader whose queue was empty may be asleep in
 * its ring and is kicked. Writes and unlinks share the writers' queues.
 */
static void
filetier_enqueue_read(struct filetier *ft, struct filetier_job *job)
{
	struct filetier_reader	*r = &ft->readers[0];
	uint64_t		 one = 1;
	unsigned		 i;
	int			 was_empty;

	for (i = 1; i < ft->p.readers; i++)
		if (ft->readers[i].outstanding < r->outstanding)
			r = &ft->readers[i];
	r->outstanding++;
	job->reader = (uint16_t)(r - ft->readers);
	pthread_mutex_lock(&ft->lock);
	was_empty = TAILQ_EMPTY(&r->queue);
	TAILQ_INSERT_TAIL(&r->queue, job, entry);
	if (!r->uring)
		pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&ft->lock);
	if (r->uring && was_empty && write(r->kick_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		abort();	/* an eventfd write cannot fail otherwise */
}

static void
filetier_enqueue(struct filetier *ft, struct filetier_job *job)
{
	if (job->kind == FILETIER_JOB_READ) {
		filetier_enqueue_read(ft, job);
		return;
	}
	pthread_mutex_lock(&ft->lock);
	switch (job->kind) {
	case FILETIER_JOB_WRITE:
		TAILQ_INSERT_TAIL(&ft->writes, job, entry);
		pthread_cond_signal(&ft->wcond);
		break;
	default:
		TAILQ_INSERT_TAIL(&ft->deletes, job, entry);
		pthread_cond_signal(&ft->wcond);
		break;
	}
	pthread_mutex_unlock(&ft->lock);
}

/* Workers post finished jobs in batches: one eventfd write per batch. */
static void
filetier_post(struct filetier *ft, struct filetier_job_list *batch)
{
	uint64_t	one = 1;

	if (TAILQ_EMPTY(batch))
		return;
	pthread_mutex_lock(&ft->lock);
	TAILQ_CONCAT(&ft->done, batch, entry);
	pthread_mutex_unlock(&ft->lock);
	if (write(ft->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		abort();	/* an eventfd write cannot fail otherwise */
}

/* An entry of ns became VISIBLE (delta 1) or stopped being (-1): STATS' per-pool counts. */
static void
filetier_ns_visible(struct filetier_ns *ns, const struct obj_key *k, int delta)
{
	unsigned	pool = k->pool < PROTO_POOLS_MAX ? k->pool : PROTO_POOLS_MAX - 1;

	if (ns == NULL || (delta < 0 && ns->visible[pool] == 0))
		return;
	ns->visible[pool] += (uint64_t)(int64_t)delta;
}

/*
 * Takes an entry out of service: VISIBLE -> DELETING with an unlink job
 * (the file is still there), or, when the file is already gone, out of
 * the index at once (DEAD while pinned). Bytes stop counting against the
 * capacity now; the unlink's own bytes are counted as deleting until it ran.
 */
static void
filetier_ent_retire(struct filetier *ft, uint32_t id, int file_gone)
{
	struct filetier_ent	*e = filetier_ent(ft, id);
	struct filetier_job	*job;
	struct filetier_ns	*ns;

	assert(e->state == FILETIER_S_VISIBLE);
	if (e->pins == 0)
		index_lru_unlink(&ft->ix, &ft->lru, id);
	ft->st.visible--;
	ft->st.bytes_used -= filetier_file_bytes(e->len);
	ns = filetier_ns_find(ft, e->rec.key.fingerprint);
	filetier_ns_visible(ns, &e->rec.key, -1);
	if (!file_gone && ns != NULL && (job = calloc(1, sizeof(*job))) != NULL) {
		if (filetier_ns_hold(ft, ns) != 0) {
			free(job);
			goto gone;
		}
		job->kind = FILETIER_JOB_DELETE;
		job->key = e->rec.key;
		job->id = id;
		job->len = e->len;
		job->ns = ns;
		e->state = FILETIER_S_DELETING;
		ft->st.deleting++;
		ft->st.bytes_deleting += filetier_file_bytes(e->len);
		filetier_enqueue(ft, job);
		return;
	}
	/*
	 * The file is gone, or disowned after a device error, or there was
	 * no memory (or no directory) for its unlink: then it stays on disk,
	 * out of the index, and the next scan judges it again. Nothing is
	 * wrong, only the disk may be fuller than the capacity says.
	 */
gone:
	filetier_index_remove(ft, id);
	if (e->pins > 0) {
		e->state = FILETIER_S_DEAD;
		ft->st.dead++;
	} else
		index_rec_free(&ft->ix, id);
}

/* Evicts from the LRU tail until need more bytes fit; -ENOSPC if they cannot. */
static int
filetier_make_room(struct filetier *ft, uint64_t need)
{
	uint64_t	avail, lru_bytes = 0;
	uint32_t	id;

	if (ft->st.bytes_used + need <= ft->cap_eff)
		return 0;
	/* Refuse before evicting anything when the evictable bytes cannot make it. */
	avail = ft->cap_eff - (need > ft->cap_eff ? ft->cap_eff : need);
	for (id = ft->lru.tail; id != FILETIER_NONE && ft->st.bytes_used - lru_bytes > avail;
	    id = filetier_ent(ft, id)->rec.lru_prev)
		lru_bytes += filetier_file_bytes(filetier_ent(ft, id)->len);
	if (need > ft->cap_eff || ft->st.bytes_used - lru_bytes > avail) {
		ft->st.evict_failures++;
		return -ENOSPC;
	}
	while (ft->st.bytes_used + need > ft->cap_eff) {
		id = ft->lru.tail;
		assert(id != FILETIER_NONE);
		ft->st.evictions++;
		filetier_ent_retire(ft, id, 0);
	}
	return 0;
}

/* Loop side: completions. */

static void
filetier_unpin_id(struct filetier *ft, uint32_t id)
{
	struct filetier_ent	*e = filetier_ent(ft, id);

	assert(e->state != FILETIER_S_FREE && e->pins > 0);
	ft->st.pins--;
	if (--e->pins > 0)
		return;
	ft->st.pinned_objects--;
	if (e->state == FILETIER_S_VISIBLE)
		index_lru_push(&ft->ix, &ft->lru, id);
	else if (e->state == FILETIER_S_DEAD) {
		ft->st.dead--;
		index_rec_free(&ft->ix, id);
	}
}

static void
filetier_read_done(struct filetier *ft, struct filetier_job *job)
{
	struct filetier_ent	*e = filetier_ent(ft, job->id);
	char			 path[FILETIER_OBJ_PATH];

	ft->st.reads_inflight--;
	ft->readers[job->reader].outstanding--;
	if (job->status == 0) {
		ft->st.reads++;
		ft->st.bytes_read += job->len;
	} else if (job->status == -ECANCELED)
		ft->st.reads_cancelled++;
	else if (!filetier_status_lost(job->status)) {
		ft->st.read_failures++;
		filetier_obj_path(&job->key, path);
		log_warn("filetier", "%s/%s/%s: %s; the object stays", ft->root, job->ns->name, path,
		    filetier_strerror(job->status));
	} else {
		ft->st.read_failures++;
		filetier_obj_path(&job->key, path);
		log_warn("filetier", "%s/%s/%s: %s; object dropped", ft->root, job->ns->name, path,
		    filetier_strerror(job->status));
		/*
		 * Lost data leaves the index now, so that it is not promised
		 * again. The bad files were unlinked by the worker; a file that
		 * failed with a device error stays for the next scan to judge.
		 */
		if (e->state == FILETIER_S_VISIBLE) {
			ft->st.drops++;
			filetier_ent_retire(ft, job->id, 1);
		}
	}
	filetier_unpin_id(ft, job->id);		/* the read's own pin: MRU at its last */
}

/* Bytes the filesystem under the root has free for an unprivileged writer; 0 if unknown. */
static uint64_t
filetier_fs_free(const struct filetier *ft)
{
	struct statvfs	sv;

	if (fstatvfs(ft->rootfd, &sv) != 0)
		return 0;
	return (uint64_t)sv.f_bavail * sv.f_frsize;
}

/* Resubmits the writes that waited for room once no unlink is pending. */
static void
filetier_nospace_resume(struct filetier *ft)
{
	struct filetier_job	*job;

	if (ft->st.deleting > 0)
		return;
	while ((job = TAILQ_FIRST(&ft->nospace)) != NULL) {
		TAILQ_REMOVE(&ft->nospace, job, entry);
		filetier_enqueue(ft, job);
	}
}

/*
 * A write found the filesystem full below the tier's capacity (other
 * files share it, or a quota): that is a signal to evict, not a reason
 * to fail every write from now on. The effective capacity drops to the
 * bytes the tier holds besides this object plus what the filesystem has
 * free (nothing, for a quota, which statvfs cannot see), the LRU objects
 * above it are evicted, and the write runs again once their unlinks ran.
 * 1: the job was kept for that; 0: it fails (nothing evictable, or tried
 * FILETIER_NOSPACE_TRIES times).
 */
static int
filetier_nospace_retry(struct filetier *ft, struct filetier_job *job)
{
	struct filetier_ent	*e = filetier_ent(ft, job->id);
	uint64_t		 need = filetier_file_bytes(e->len), others, room;
	int			 rc;

	if (job->tries >= FILETIER_NOSPACE_TRIES)
		return 0;
	others = ft->st.bytes_used - need;
	room = others + (job->status == -ENOSPC ? filetier_fs_free(ft) : 0);
	if (room < ft->cap_eff) {
		if (ft->cap_eff == ft->p.capacity)
			log_warn("filetier", "%s: the filesystem is full (%s) at %llu bytes of objects, "
			    "below the capacity of %llu: evicting down to what fits", ft->root,
			    filetier_strerror(job->status), (unsigned long long)others,
			    (unsigned long long)ft->p.capacity);
		ft->cap_eff = room;
	}
	ft->cap_checked_ns = filetier_now_ns(CLOCK_MONOTONIC);
	/* Room for this object as if it were new: its own bytes are already counted. */
	ft->st.bytes_used -= need;
	rc = filetier_make_room(ft, need);
	ft->st.bytes_used += need;
	if (rc != 0)
		return 0;
	job->tries++;
	job->status = -EINPROGRESS;
	ft->st.write_nospace_retries++;
	TAILQ_INSERT_TAIL(&ft->nospace, job, entry);
	filetier_nospace_resume(ft);
	return 1;
}

/* A capacity lowered by a full filesystem comes back as the filesystem frees up. */
static void
filetier_capacity_recheck(struct filetier *ft)
{
	int64_t		now;
	uint64_t	room;

	if (ft->cap_eff >= ft->p.capacity)
		return;
	now = filetier_now_ns(CLOCK_MONOTONIC);
	if (now - ft->cap_checked_ns < FILETIER_RECHECK_NS)
		return;
	ft->cap_checked_ns = now;
	room = ft->st.bytes_used + filetier_fs_free(ft);
	if (room > ft->cap_eff)
		ft->cap_eff = room < ft->p.capacity ? room : ft->p.capacity;
}

/* Says (at warn, at most every 10 s) that writers made a deleted namespace directory again. */
static void
filetier_dirs_report(struct filetier *ft, const struct filetier_ns *ns)
{
	uint64_t	n = atomic_load(&ft->dirs_recreated);
	int64_t		now;

	if (n == ft->dirs_logged)
		return;
	now = filetier_now_ns(CLOCK_MONOTONIC);
	if (ft->dirs_logged != 0 && now - ft->dirs_logged_ns < FILETIER_WARN_NS)
		return;
	log_warn("filetier", "%s/%s: a namespace directory was deleted under the tier; made it "
	    "again (%llu times so far); objects whose files went with it are lost", ft->root,
	    ns->name, (unsigned long long)n);
	ft->dirs_logged = n;
	ft->dirs_logged_ns = now;
}

/* 1: the job was queued again (a full filesystem), and is not done yet. */
static int
filetier_write_done(struct filetier *ft, struct filetier_job *job)
{
	struct filetier_ent	*e = filetier_ent(ft, job->id);

	assert(e->state == FILETIER_S_WRITING);
	filetier_dirs_report(ft, job->ns);
	if ((job->status == -ENOSPC || job->status == -EDQUOT) && filetier_nospace_retry(ft, job))
		return 1;
	ft->st.writes_inflight--;
	ft->st.writing--;
	if (job->status == 0) {
		e->state = FILETIER_S_VISIBLE;
		ft->st.visible++;
		filetier_ns_visible(job->ns, &job->key, 1);
		ft->st.writes++;
		ft->st.bytes_written += job->len;
		index_lru_push(&ft->ix, &ft->lru, job->id);
		filetier_capacity_recheck(ft);
		return 0;
	}
	/* Never visible: the temp file is gone, the entry goes too. */
	ft->st.write_failures++;
	if (job->status == -ENOSPC || job->status == -EDQUOT)
		ft->st.write_nospace++;
	/* A full disk fails every write: say so at the 1st, 2nd, 4th, 8th... */
	if ((ft->st.write_failures & (ft->st.write_failures - 1)) == 0)
		log_warn("filetier", "%s/%s: write failed: %s; nothing of it is visible "
		    "(%llu failed writes so far)", ft->root, job->ns->name,
		    filetier_strerror(job->status), (unsigned long long)ft->st.write_failures);
	ft->st.bytes_used -= filetier_file_bytes(e->len);
	filetier_index_remove(ft, job->id);
	index_rec_free(&ft->ix, job->id);
	return 0;
}

static void
filetier_delete_done(struct filetier *ft, struct filetier_job *job)
{
	struct filetier_ent	*e = filetier_ent(ft, job->id);

	assert(e->state == FILETIER_S_DELETING);
	ft->st.deleting--;
	ft->st.bytes_deleting -= filetier_file_bytes(e->len);
	if (job->status != 0)
		log_warn("filetier", "unlink in %s: %s; the next scan retries", job->ns->name,
		    strerror(-job->status));
	filetier_index_remove(ft, job->id);
	if (e->pins > 0) {
		e->state = FILETIER_S_DEAD;
		ft->st.dead++;
	} else
		index_rec_free(&ft->ix, job->id);
	filetier_nospace_resume(ft);
}

/* One finished job's bookkeeping and completion, on the loop thread; frees it. */
static void
filetier_job_complete(struct filetier *ft, struct filetier_job *job)
{
	switch (job->kind) {
	case FILETIER_JOB_READ:
		filetier_read_done(ft, job);
		break;
	case FILETIER_JOB_WRITE:
		if (filetier_write_done(ft, job))
			return;		/* queued again after eviction: not done */
		break;
	default:
		filetier_delete_done(ft, job);
		break;
	}
	if (job->done != NULL)
		job->done(job);
	filetier_ns_put(ft, job->ns);
	free(job);
}

static void
filetier_delay_arm(struct filetier *ft)
{
	struct filetier_job	*job = TAILQ_FIRST(&ft->delayed);
	struct timeval		 tv;
	int64_t			 left;

	if (job == NULL || evtimer_pending(ft->delay_ev, NULL))
		return;
	left = job->due_ns - filetier_now_ns(CLOCK_MONOTONIC);
	if (left < 0)
		left = 0;
	tv.tv_sec = left / 1000000000LL;
	tv.tv_usec = (left % 1000000000LL) / 1000;
	evtimer_add(ft->delay_ev, &tv);
}

/* testing.read_delay_ms: the reads that succeeded are reported now, in order. */
static void
filetier_delay_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct filetier		*ft = arg;
	struct filetier_job	*job;
	int64_t			 now = filetier_now_ns(CLOCK_MONOTONIC);

	(void)fd;
	(void)ev;
	while ((job = TAILQ_FIRST(&ft->delayed)) != NULL && job->due_ns <= now) {
		TAILQ_REMOVE(&ft->delayed, job, entry);
		filetier_job_complete(ft, job);
	}
	filetier_delay_arm(ft);
}

/* Runs finished jobs' bookkeeping and completions on the loop thread. */
static void
filetier_done_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct filetier		*ft = arg;
	struct filetier_job_list done;
	struct filetier_job	*job;
	uint64_t		 n;

	(void)ev;
	if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		log_warn("filetier", "eventfd read: %s", strerror(errno));
	TAILQ_INIT(&done);
	pthread_mutex_lock(&ft->lock);
	TAILQ_CONCAT(&done, &ft->done, entry);
	pthread_mutex_unlock(&ft->lock);
	while ((job = TAILQ_FIRST(&done)) != NULL) {
		TAILQ_REMOVE(&done, job, entry);
		/*
		 * Testing only: a read that succeeded is reported late, as a slow
		 * device would, while failures are reported at once; so a test
		 * can act while good reads are still in flight.
		 */
		if (ft->p.read_delay_ms > 0 && job->kind == FILETIER_JOB_READ && job->status == 0) {
			job->due_ns = filetier_now_ns(CLOCK_MONOTONIC) +
			    (int64_t)ft->p.read_delay_ms * 1000000LL;
			TAILQ_INSERT_TAIL(&ft->delayed, job, entry);
			continue;
		}
		filetier_job_complete(ft, job);
	}
	filetier_delay_arm(ft);
}

/*
 * The open-file cache: descriptors of small objects read before, kept so
 * that reading a warm object again costs no path walk, open or close. On
 * 36 KiB objects those were most of a read's CPU beside the checksum, and
 * a cold open waits on directory and inode blocks that the device reads
 * one by one. Readers share the cache under its own lock. A descriptor is
 * trusted only while its file has a link: every use checks st_nlink with
 * fstat (one call without a path walk), so that a file unlinked or
 * replaced by rename, by this daemon or by another one sharing the
 * directory, is opened again by name and then fails or succeeds exactly
 * as if it had never been cached. A truncated or damaged file is the same
 * inode: the read through the cached descriptor sees it. The tier's own
 * unlinks forget the entry first, so that an evicted file's blocks are
 * freed at once; a file deleted by another daemon keeps its blocks until
 * its entry is next used or falls off the LRU.
 */
#define FILETIER_FDC_LEN_MAX	(256 * 1024)	/* larger objects: an open is noise */
#define FILETIER_FDC_EVICT_SCAN	16		/* LRU entries tried for a victim */

struct filetier_fdc_ent {
	struct obj_key		 key;
	const struct filetier_ns *ns;
	int			 fd;
	uint32_t		 refs;		/* reads using fd now */
	uint32_t		 chain;		/* bucket chain; the free list */
	uint32_t		 lru_prev;	/* towards MRU */
	uint32_t		 lru_next;
	uint8_t			 state;
#define FILETIER_FDC_FREE	0
#define FILETIER_FDC_LIVE	1	/* hashed and in the LRU */
#define FILETIER_FDC_GONE	2	/* forgotten while in use: its last user closes it */
};

struct filetier_fdc {
	pthread_mutex_t		 lock;		/* guards everything below */
	struct filetier_fdc_ent	*ents;
	uint32_t		 cap;
	uint32_t		*buckets;
	uint32_t		 mask;		/* buckets - 1, a power of two minus one */
	uint32_t		 free;
	uint32_t		 lru_head;	/* MRU */
	uint32_t		 lru_tail;
	uint64_t		 seed;
};

static struct filetier_fdc *
filetier_fdc_new(uint32_t cap, uint64_t seed)
{
	struct filetier_fdc	*c;
	uint32_t		 i, nb = 1;

	while (nb < cap)
		nb <<= 1;
	if ((c = calloc(1, sizeof(*c))) == NULL)
		return NULL;
	c->ents = calloc(cap, sizeof(*c->ents));
	c->buckets = malloc((size_t)nb * sizeof(*c->buckets));
	if (c->ents == NULL || c->buckets == NULL) {
		free(c->ents);
		free(c->buckets);
		free(c);
		return NULL;
	}
	pthread_mutex_init(&c->lock, NULL);
	memset(c->buckets, 0xff, (size_t)nb * sizeof(*c->buckets));
	c->cap = cap;
	c->mask = nb - 1;
	c->seed = seed;
	for (i = 0; i < cap; i++)
		c->ents[i].chain = i + 1 < cap ? i + 1 : FILETIER_NONE;
	c->free = 0;
	c->lru_head = c->lru_tail = FILETIER_NONE;
	return c;
}

/* Closes every descriptor: the readers are gone. NULL is fine. */
static void
filetier_fdc_free(struct filetier_fdc *c)
{
	uint32_t	i;

	if (c == NULL)
		return;
	for (i = 0; i < c->cap; i++)
		if (c->ents[i].state != FILETIER_FDC_FREE)
			close(c->ents[i].fd);
	pthread_mutex_destroy(&c->lock);
	free(c->ents);
	free(c->buckets);
	free(c);
}

static uint32_t *
filetier_fdc_bucket(struct filetier_fdc *c, const struct obj_key *k)
{
	return &c->buckets[XXH3_64bits_withSeed(k, sizeof(*k), c->seed) & c->mask];
}

/* The live entry of (ns, k), or FILETIER_NONE. Locked. */
static uint32_t
filetier_fdc_find(struct filetier_fdc *c, const struct filetier_ns *ns, const struct obj_key *k)
{
	uint32_t	i = *filetier_fdc_bucket(c, k);

	while (i != FILETIER_NONE && (c->ents[i].ns != ns ||
	    memcmp(&c->ents[i].key, k, sizeof(*k)) != 0))
		i = c->ents[i].chain;
	return i;
}

static void
filetier_fdc_lru_unlink(struct filetier_fdc *c, uint32_t i)
{
	struct filetier_fdc_ent	*e = &c->ents[i];

	if (e->lru_prev != FILETIER_NONE)
		c->ents[e->lru_prev].lru_next = e->lru_next;
	else
		c->lru_head = e->lru_next;
	if (e->lru_next != FILETIER_NONE)
		c->ents[e->lru_next].lru_prev = e->lru_prev;
	else
		c->lru_tail = e->lru_prev;
}

static void
filetier_fdc_lru_push(struct filetier_fdc *c, uint32_t i)
{
	struct filetier_fdc_ent	*e = &c->ents[i];

	e->lru_prev = FILETIER_NONE;
	e->lru_next = c->lru_head;
	if (c->lru_head != FILETIER_NONE)
		c->ents[c->lru_head].lru_prev = i;
	else
		c->lru_tail = i;
	c->lru_head = i;
}

/*
 * Takes a live entry out of the hash and the LRU. Returns its descriptor
 * for the caller to close after unlocking, or -1 while it is in use (its
 * last release closes it). Locked.
 */
static int
filetier_fdc_unhash(struct filetier_fdc *c, uint32_t i)
{
	struct filetier_fdc_ent	*e = &c->ents[i];
	uint32_t		*link = filetier_fdc_bucket(c, &e->key);
	int			 fd = e->fd;

	while (*link != i)
		link = &c->ents[*link].chain;
	*link = e->chain;
	filetier_fdc_lru_unlink(c, i);
	if (e->refs > 0) {
		e->state = FILETIER_FDC_GONE;
		return -1;
	}
	e->state = FILETIER_FDC_FREE;
	e->chain = c->free;
	c->free = i;
	return fd;
}

/* A cached descriptor of (ns, k), with a reference, or FILETIER_NONE. */
static uint32_t
filetier_fdc_get(struct filetier_fdc *c, const struct filetier_ns *ns, const struct obj_key *k,
    int *fd)
{
	uint32_t	i;

	pthread_mutex_lock(&c->lock);
	if ((i = filetier_fdc_find(c, ns, k)) != FILETIER_NONE) {
		c->ents[i].refs++;
		*fd = c->ents[i].fd;
		filetier_fdc_lru_unlink(c, i);
		filetier_fdc_lru_push(c, i);
	}
	pthread_mutex_unlock(&c->lock);
	return i;
}

/* Gives back a reference; drop: the file proved bad or gone, the entry goes. */
static void
filetier_fdc_release(struct filetier_fdc *c, uint32_t i, int drop)
{
	struct filetier_fdc_ent	*e = &c->ents[i];
	int			 fd = -1;

	pthread_mutex_lock(&c->lock);
	assert(e->refs > 0 && e->state != FILETIER_FDC_FREE);
	e->refs--;
	if (e->state == FILETIER_FDC_LIVE && drop)
		fd = filetier_fdc_unhash(c, i);
	else if (e->state == FILETIER_FDC_GONE && e->refs == 0) {
		fd = e->fd;
		e->state = FILETIER_FDC_FREE;
		e->chain = c->free;
		c->free = i;
	}
	pthread_mutex_unlock(&c->lock);
	if (fd >= 0)
		close(fd);
}

/* Keeps fd, a verified object's descriptor (takes ownership), evicting the LRU's least used. */
static void
filetier_fdc_add(struct filetier_fdc *c, const struct filetier_ns *ns, const struct obj_key *k,
    int fd)
{
	struct filetier_fdc_ent	*e;
	uint32_t		 i, v, *b;
	int			 old = -1, n;

	pthread_mutex_lock(&c->lock);
	if (filetier_fdc_find(c, ns, k) != FILETIER_NONE) {
		/* Another reader cached it first. */
		pthread_mutex_unlock(&c->lock);
		close(fd);
		return;
	}
	if (c->free == FILETIER_NONE) {
		for (v = c->lru_tail, n = 0; v != FILETIER_NONE && n < FILETIER_FDC_EVICT_SCAN;
		    v = c->ents[v].lru_prev, n++)
			if (c->ents[v].refs == 0)
				break;
		if (v == FILETIER_NONE || n == FILETIER_FDC_EVICT_SCAN) {
			pthread_mutex_unlock(&c->lock);
			close(fd);
			return;
		}
		old = filetier_fdc_unhash(c, v);
	}
	i = c->free;
	e = &c->ents[i];
	c->free = e->chain;
	e->key = *k;
	e->ns = ns;
	e->fd = fd;
	e->refs = 0;
	e->state = FILETIER_FDC_LIVE;
	b = filetier_fdc_bucket(c, k);
	e->chain = *b;
	*b = i;
	filetier_fdc_lru_push(c, i);
	pthread_mutex_unlock(&c->lock);
	if (old >= 0)
		close(old);
}

/* The tier is about to unlink (ns, k): no descriptor may keep its blocks. */
static void
filetier_fdc_forget(struct filetier_fdc *c, const struct filetier_ns *ns, const struct obj_key *k)
{
	uint32_t	i;
	int		fd = -1;

	if (c == NULL)
		return;
	pthread_mutex_lock(&c->lock);
	if ((i = filetier_fdc_find(c, ns, k)) != FILETIER_NONE)
		fd = filetier_fdc_unhash(c, i);
	pthread_mutex_unlock(&c->lock);
	if (fd >= 0)
		close(fd);
}

/* Reader threads. */

/* 1 for the statuses that mean the file itself is bad and must go. */
static int
filetier_unlink_bad(int status)
{
	return status == -ENODATA || status == -EUCLEAN || status == -ESTALE || status == -EBADMSG ||
	    status == -ELOOP;
}

/*
 * 1 for the statuses that mean the object is lost: its file is gone, bad,
 * or unreadable by the device. Not for the daemon's own troubles (EMFILE,
 * ENOMEM, EACCES), which fail one read and keep the object.
 */
static int
filetier_status_lost(int status)
{
	return status == -ENOENT || status == -EIO || filetier_unlink_bad(status);
}

/*
 * Reads one object with plain system calls: the path for readers without
 * a ring, and the retry of a read that O_DIRECT refused.
 */
static int
filetier_read_sync(struct filetier_job *job, const char *path, uint8_t *hdr, int direct,
    ssize_t *res)
{
	struct iovec	iov[2];
	uint64_t	off = 0, total = FILETIER_HDR + FILETIER_READ_SIZE(job->len);
	ssize_t		n;
	int		fd, i;

	fd = filetier_open_beneath(job->ns->dirfd, path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0),
	    0);
	if (fd < 0)
		return fd;
	/*
	 * Until EOF: a network filesystem may return a read short of EOF,
	 * and a short read must never be taken for a truncated file (that
	 * would unlink a good one). Offsets stay 4096-aligned for O_DIRECT
	 * except at EOF, where the loop ends.
	 */
	while (off < total) {
		i = 0;
		if (off < FILETIER_HDR) {
			iov[i].iov_base = hdr + off;
			iov[i++].iov_len = FILETIER_HDR - off;
		}
		iov[i].iov_base = (uint8_t *)job->buf + (off > FILETIER_HDR ? off - FILETIER_HDR : 0);
		iov[i].iov_len = total - (off > FILETIER_HDR ? off : FILETIER_HDR);
		i++;
		if ((n = preadv(fd, iov, i, (off_t)off)) < 0) {
			if (errno == EINTR)
				continue;
			off = 0;
			*res = -errno;
			close(fd);
			return 0;
		}
		if (n == 0)
			break;
		off += (uint64_t)n;
	}
	*res = (ssize_t)off;
	close(fd);
	return 0;
}

/*
 * Finishes a read whose bytes are in: validation, checksum, and the
 * removal of a bad file, so that no other reader (nor this daemon's next
 * scan) finds it. Another daemon may have renamed a good copy into place
 * since; unlinking it costs one miss, never a wrong byte.
 */
static void
filetier_read_finish(struct filetier_job *job, const uint8_t *hdr, int open_res, ssize_t res)
{
	int	rc;

	if (open_res < 0)
		job->status = open_res;
	else if (res < 0)
		job->status = (int)res;
	else
		job->status = filetier_read_verify(job, hdr, res, &job->checksum);
	if (filetier_unlink_bad(job->status) && (rc = filetier_unlink_obj(job->ns->dirfd,
	    &job->key)) != 0 && rc != -ELOOP && rc != -ENOTDIR)
		log_warn("filetier", "unlink of a bad object in %s: %s", job->ns->name,
		    strerror(-rc));
}

/* A filesystem that refuses O_DIRECT is read buffered from now on. */
static int
filetier_direct_refused(struct filetier_job *job, int direct, int open_res, int read_res)
{
	int	on = 1;

	if (!direct || (open_res != -EINVAL && read_res != -EINVAL))
		return 0;
	if (atomic_compare_exchange_strong(&job->ns->direct, &on, 0))
		log_info("filetier", "%s: the filesystem refuses O_DIRECT; reads are buffered",
		    job->ns->name);
	return 1;
}

static void
filetier_reader_sync_one(struct filetier_reader *r, struct filetier_job *job)
{
	char		path[FILETIER_OBJ_PATH];
	ssize_t		res = 0;
	int		direct = atomic_load(&job->ns->direct), open_res;

	filetier_obj_path(&job->key, path);
	open_res = filetier_read_sync(job, path, r->hdrs, direct, &res);
	if (filetier_direct_refused(job, direct, open_res, open_res == 0 ? (int)res : 0))
		open_res = filetier_read_sync(job, path, r->hdrs, 0, &res);
	filetier_read_finish(job, r->hdrs, open_res, res);
}

/* A ring's open: openat2, no link followed (readers use a ring only where the kernel has it). */
static void
filetier_reader_how(struct filetier_slot *sl, int flags)
{
	memset(&sl->how, 0, sizeof(sl->how));
	sl->how.flags = (uint64_t)(O_RDONLY | O_NOFOLLOW | flags | (sl->direct ? O_DIRECT : 0));
	sl->how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
}

/*
 * A read on the ring is two steps. First openat into the slot's direct
 * descriptor (it replaces whatever file the slot held, so there is no
 * close to wait for; the slot keeps its last file open until reused).
 * Then, when the open completed, readv of the header and payload. The
 * reads made ready by one batch of completions go to the kernel in one
 * submission, which the block layer plugs: reads of files that lie next
 * to each other on disk (a prefix published in order) merge into large
 * requests. A linked open -> read chain would issue each read alone from
 * the open's completion and lose that (measured: 0.7x on 36 KiB objects).
 * With the open-file cache, a small object found there skips the open
 * (its read goes out at once), and an open makes a plain descriptor that
 * the cache may keep once the read verified.
 */
static void
filetier_reader_open(struct filetier_reader *r, unsigned s, struct filetier_job *job)
{
	struct filetier_slot	*sl = &r->slots[s];
	struct filetier_fdc	*fdc = r->ft->fdc;
	struct io_uring_sqe	*sqe;
	struct stat		 st;

	sl->job = job;
	sl->open_res = sl->read_res = 0;
	sl->direct = atomic_load(&job->ns->direct);
	sl->fd = -1;
	sl->fdc = FILETIER_NONE;
	filetier_obj_path(&job->key, sl->path);
	sl->iov[0].iov_base = r->hdrs + (size_t)s * FILETIER_HDR;
	sl->iov[0].iov_len = FILETIER_HDR;
	sl->iov[1].iov_base = job->buf;
	sl->iov[1].iov_len = FILETIER_READ_SIZE(job->len);
	sqe = io_uring_get_sqe(&r->ring);
	if (fdc != NULL && job->len <= FILETIER_FDC_LEN_MAX) {
		sl->fdc = filetier_fdc_get(fdc, job->ns, &job->key, &sl->fd);
		if (sl->fdc != FILETIER_NONE && fstat(sl->fd, &st) == 0 && st.st_nlink > 0) {
			io_uring_prep_readv(sqe, sl->fd, sl->iov, 2, 0);
			io_uring_sqe_set_data64(sqe, (uint64_t)s << 1 | 1);
			return;
		}
		/* Unlinked or replaced since: by name, as if never cached. */
		if (sl->fdc != FILETIER_NONE)
			filetier_fdc_release(fdc, sl->fdc, 1);
		sl->fdc = FILETIER_NONE;
		sl->fd = -1;
		filetier_reader_how(sl, O_CLOEXEC);
		io_uring_prep_openat2(sqe, job->ns->dirfd, sl->path, &sl->how);
		io_uring_sqe_set_data64(sqe, (uint64_t)s << 1);
		return;
	}
	/* Direct descriptors take no O_CLOEXEC: they are not in the fd table. */
	filetier_reader_how(sl, 0);
	io_uring_prep_openat2_direct(sqe, job->ns->dirfd, sl->path, &sl->how, s);
	io_uring_sqe_set_data64(sqe, (uint64_t)s << 1);
}

/* Ends a slot's read: the job goes onto batch, the slot is free. */
static void
filetier_reader_end(struct filetier_reader *r, unsigned s, struct filetier_job_list *batch)
{
	struct filetier_slot	*sl = &r->slots[s];
	struct filetier_job	*job = sl->job;
	ssize_t			 res = 0;
	int			 open_res, retried = 1;

	if (filetier_direct_refused(job, sl->direct, sl->open_res,
	    sl->open_res == 0 ? sl->read_res : 0)) {
		open_res = filetier_read_sync(job, sl->path, sl->iov[0].iov_base, 0, &res);
		filetier_read_finish(job, sl->iov[0].iov_base, open_res, res);
	} else if (sl->open_res == 0 && sl->read_res >= 0 &&
	    (uint64_t)sl->read_res < FILETIER_HDR + job->len) {
		/* Short: truncated, or a filesystem that reads short. Only EOF tells. */
		open_res = filetier_read_sync(job, sl->path, sl->iov[0].iov_base, sl->direct, &res);
		filetier_read_finish(job, sl->iov[0].iov_base, open_res, res);
	} else {
		filetier_read_finish(job, sl->iov[0].iov_base, sl->open_res,
		    sl->open_res == 0 ? sl->read_res : 0);
		retried = 0;
	}
	/*
	 * A descriptor whose own read verified the object is worth keeping;
	 * one that needed the retry by name (a bad file, O_DIRECT refused)
	 * goes.
	 */
	if (sl->fdc != FILETIER_NONE)
		filetier_fdc_release(r->ft->fdc, sl->fdc, job->status != 0 || retried);
	else if (sl->fd >= 0 && job->status == 0 && !retried)
		filetier_fdc_add(r->ft->fdc, job->ns, &job->key, sl->fd);
	else if (sl->fd >= 0)
		close(sl->fd);
	sl->fd = -1;
	sl->fdc = FILETIER_NONE;
	sl->job = NULL;
	r->free_slots[r->nfree++] = s;
	TAILQ_INSERT_TAIL(batch, job, entry);
}

/* One CQE: an open queues its read (submitted with the batch), a read ends its slot. */
static void
filetier_reader_cqe(struct filetier_reader *r, uint64_t ud, int res,
    struct filetier_job_list *batch)
{
	unsigned		 s = (unsigned)(ud >> 1);
	struct filetier_slot	*sl = &r->slots[s];
	struct io_uring_sqe	*sqe;

	if ((ud & 1) == 0) {
		if (res < 0) {
			sl->open_res = res;
			filetier_reader_end(r, s, batch);
			return;
		}
		/* One SQE per slot at a time, and the ring has a slot's worth each. */
		sqe = io_uring_get_sqe(&r->ring);
		if (r->ft->fdc != NULL && sl->job->len <= FILETIER_FDC_LEN_MAX) {
			sl->fd = res;	/* a plain descriptor, for the cache */
			io_uring_prep_readv(sqe, sl->fd, sl->iov, 2, 0);
		} else {
			io_uring_prep_readv(sqe, (int)s, sl->iov, 2, 0);
			sqe->flags |= IOSQE_FIXED_FILE;
		}
		io_uring_sqe_set_data64(sqe, (uint64_t)s << 1 | 1);
		return;
	}
	sl->read_res = res;
	filetier_reader_end(r, s, batch);
}

/* Takes queued reads for free slots; returns how many. Called locked. */
static unsigned
filetier_reader_take(struct filetier_reader *r, struct filetier_job_list *take,
    struct filetier_job_list *batch, unsigned max)
{
	struct filetier_job	*job;
	unsigned		 n = 0;

	while (n < max && (job = TAILQ_FIRST(&r->queue)) != NULL) {
		TAILQ_REMOVE(&r->queue, job, entry);
		if (atomic_load_explicit(&job->cancel, memory_order_acquire)) {
			job->status = -ECANCELED;
			TAILQ_INSERT_TAIL(batch, job, entry);
			continue;
		}
		TAILQ_INSERT_TAIL(take, job, entry);
		n++;
	}
	return n;
}

#define FILETIER_UD_KICK	UINT64_MAX

static void *
filetier_reader_ring_main(struct filetier_reader *r)
{
	struct filetier		*ft = r->ft;
	struct filetier_job_list take, batch;
	struct filetier_job	*job;
	struct io_uring_cqe	*cqe;
	struct io_uring_sqe	*sqe;
	unsigned		 busy = 0, head, n;
	int			 stop, rc;

	TAILQ_INIT(&take);
	TAILQ_INIT(&batch);
	for (;;) {
		pthread_mutex_lock(&ft->lock);
		/* Stopping: what is in flight lands (it writes caller memory), nothing new starts. */
		if (!(stop = ft->stop))
			filetier_reader_take(r, &take, &batch, r->nfree);
		pthread_mutex_unlock(&ft->lock);
		if (stop && busy == 0)
			return NULL;
		while ((job = TAILQ_FIRST(&take)) != NULL) {
			TAILQ_REMOVE(&take, job, entry);
			filetier_reader_open(r, r->free_slots[--r->nfree], job);
			busy++;
		}
		filetier_post(ft, &batch);
		if (!r->kick_armed && !stop) {
			sqe = io_uring_get_sqe(&r->ring);
			io_uring_prep_read(sqe, r->kick_fd, &r->kick_buf, sizeof(r->kick_buf), 0);
			io_uring_sqe_set_data64(sqe, FILETIER_UD_KICK);
			r->kick_armed = 1;
		}
		/* Submits what was queued and sleeps until a read or a kick completes. */
		rc = io_uring_submit_and_wait(&r->ring, 1);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
			fatalx("filetier", "io_uring_submit_and_wait: %s", strerror(-rc));
		n = 0;
		io_uring_for_each_cqe(&r->ring, head, cqe) {
			if (cqe->user_data == FILETIER_UD_KICK)
				r->kick_armed = 0;
			else
				filetier_reader_cqe(r, cqe->user_data, cqe->res, &batch);
			n++;
		}
		io_uring_cq_advance(&r->ring, n);
		busy = ft->p.read_depth - r->nfree;
		filetier_post(ft, &batch);
	}
}

static void *
filetier_reader_main(void *arg)
{
	struct filetier_reader	*r = arg;
	struct filetier		*ft = r->ft;
	struct filetier_job_list take, batch;
	struct filetier_job	*job;

	if (r->uring)
		return filetier_reader_ring_main(r);
	TAILQ_INIT(&take);
	TAILQ_INIT(&batch);
	for (;;) {
		pthread_mutex_lock(&ft->lock);
		while (!ft->stop && TAILQ_EMPTY(&r->queue))
			pthread_cond_wait(&r->cond, &ft->lock);
		if (ft->stop) {
			pthread_mutex_unlock(&ft->lock);
			return NULL;
		}
		filetier_reader_take(r, &take, &batch, 1);
		pthread_mutex_unlock(&ft->lock);
		if ((job = TAILQ_FIRST(&take)) != NULL) {
			TAILQ_REMOVE(&take, job, entry);
			filetier_reader_sync_one(r, job);
			TAILQ_INSERT_TAIL(&batch, job, entry);
		}
		filetier_post(ft, &batch);
	}
}

/* Writer threads: writes, renames and unlinks with plain system calls. */

static uint64_t
filetier_rand(uint64_t *s)
{
	/* xorshift64*: temp names need to differ, not to be secret. */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dULL;
}

static int	filetier_mkdir_p(int dirfd, const char *path, char *err, size_t errlen);

/*
 * Makes dirfd's directory again at path (relative to at) when it was
 * deleted: an operator's rm -r, a cleaner. dup3 puts the new directory
 * behind the same descriptor number atomically, so a thread using it
 * meanwhile works in the old directory or the new one, never on a closed
 * or reused number. 1: made again; 0: it was there; or -errno.
 */
static int
filetier_dir_remake(int at, const char *path, int dirfd)
{
	struct stat	st;
	char		err[64];
	int		fd, rc;

	if (fstat(dirfd, &st) != 0)
		return -errno;
	if (st.st_nlink > 0)
		return 0;	/* another writer made it again first */
	if ((rc = filetier_mkdir_p(at, path, err, sizeof(err))) != 0)
		return rc;
	/* The root may be a link (config/README.md); nothing below it is followed. */
	if (at == AT_FDCWD) {
		if ((fd = openat(at, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
			return -errno;
	} else if ((fd = filetier_open_beneath(at, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0)) < 0)
		return fd;
	rc = dup3(fd, dirfd, O_CLOEXEC) < 0 ? -errno : 1;
	close(fd);
	return rc;
}

/*
 * A namespace directory deleted under a running tier: made again, with
 * the root above it if that went too, so that writes land again. The
 * loop reports it (filetier_dirs_report).
 */
static int
filetier_ns_remake(struct filetier *ft, struct filetier_ns *ns)
{
	int	rc;

	pthread_mutex_lock(&ft->dir_lock);
	if ((rc = filetier_dir_remake(AT_FDCWD, ft->root, ft->rootfd)) >= 0 &&
	    (rc = filetier_dir_remake(ft->rootfd, ns->name, ns->dirfd)) > 0)
		atomic_fetch_add(&ft->dirs_recreated, 1);
	pthread_mutex_unlock(&ft->dir_lock);
	return rc < 0 ? rc : 0;
}

static int
filetier_pwrite_all(int fd, const void *hdr, const void *data, uint64_t len)
{
	struct iovec	iov[2];
	uint64_t	off = 0, total = FILETIER_HDR + len, skip;
	ssize_t		n;
	int		i;

	while (off < total) {
		/* The rest of the header, then the rest of the payload. */
		i = 0;
		if (off < FILETIER_HDR) {
			iov[i].iov_base = (uint8_t *)(uintptr_t)hdr + off;
			iov[i++].iov_len = FILETIER_HDR - off;
		}
		skip = off > FILETIER_HDR ? off - FILETIER_HDR : 0;
		iov[i].iov_base = (uint8_t *)(uintptr_t)data + skip;
		iov[i++].iov_len = len - skip;
		if ((n = pwritev(fd, iov, i, (off_t)off)) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		off += (uint64_t)n;
	}
	return 0;
}

/*
 * Writes one object: temp file, bytes, optional fdatasync, rename into
 * place, optional fsync of the directories that changed. Any failure
 * unlinks what it made, so nothing of a failed write is ever visible.
 * Everything happens inside the leaf directory, opened with no link
 * followed: the temp file, the rename and the unlink name one component.
 */
static int
filetier_write_file(struct filetier *ft, struct filetier_job *job, uint64_t *rng, uint8_t *hdr)
{
	struct filetier_ns	*ns = job->ns;
	char			 path[FILETIER_OBJ_PATH], tmp[32];
	const char		*name = path + FILETIER_OBJ_NAME;
	int			 fd = -1, lfd, pfd = -1, rc, tries, made = 0;

	/* A DRAM object that no longer matches its checksum is not made durable. */
	if (dram_checksum(job->buf, job->len) != job->checksum)
		return -EBADMSG;
	filetier_hdr_build(hdr, &job->key, job->len, job->checksum);
	filetier_obj_path(&job->key, path);
	lfd = filetier_leaf_open(ns->dirfd, &job->key, 1, &made, ft->p.fsync ? &pfd : NULL);
	if (lfd == -ENOENT) {
		/* The namespace directory itself is gone: made again, then once more. */
		if ((rc = filetier_ns_remake(ft, ns)) != 0)
			return rc;
		lfd = filetier_leaf_open(ns->dirfd, &job->key, 1, &made, ft->p.fsync ? &pfd : NULL);
	}
	if (lfd < 0)
		return lfd;
	for (tries = 0; tries < 8 && fd < 0; tries++) {
		snprintf(tmp, sizeof(tmp), FILETIER_TMP_PREFIX "%016llx",
		    (unsigned long long)filetier_rand(rng));
		fd = openat(lfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
		    FILETIER_FILE_MODE);
		if (fd < 0 && errno != EEXIST) {
			rc = -errno;
			goto out;
		}
	}
	if (fd < 0) {
		rc = -EEXIST;
		goto out;
	}
	rc = filetier_pwrite_all(fd, hdr, job->buf, job->len);
	if (rc == 0 && ft->p.fsync && fdatasync(fd) != 0)
		rc = -errno;
	/* NFS and FUSE report write errors (ENOSPC, EDQUOT) at close. */
	if (close(fd) != 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && renameat(lfd, tmp, lfd, name) != 0)
		rc = -errno;
	if (rc != 0) {
		unlinkat(lfd, tmp, 0);
		goto out;
	}
	if (ft->p.fsync) {
		rc = fsync(lfd) == 0 ? 0 : -errno;
		if (rc == 0 && (made & 2))
			rc = fsync(pfd) == 0 ? 0 : -errno;
		if (rc == 0 && (made & 1))
			rc = fsync(ns->dirfd) == 0 ? 0 : -errno;
		if (rc != 0)
			/* Not durable as configured: not visible either. */
			unlinkat(lfd, name, 0);
	}
out:
	if (pfd >= 0)
		close(pfd);
	close(lfd);
	return rc;
}

static void *
filetier_writer_main(void *arg)
{
	struct filetier		*ft = arg;
	struct filetier_job_list batch;
	struct filetier_job	*job;
	uint8_t			 hdr[FILETIER_HDR];
	uint64_t		 rng = 0;

	if (getrandom(&rng, sizeof(rng), GRND_NONBLOCK) != sizeof(rng))
		rng = (uint64_t)time(NULL);
	rng ^= (uint64_t)(uintptr_t)&rng;
	if (rng == 0)
		rng = 1;
	TAILQ_INIT(&batch);
	for (;;) {
		pthread_mutex_lock(&ft->lock);
		while (!ft->stop && TAILQ_EMPTY(&ft->deletes) && TAILQ_EMPTY(&ft->writes))
			pthread_cond_wait(&ft->wcond, &ft->lock);
		if (ft->stop) {
			/* Queued jobs are dropped by filetier_free: nothing of them exists yet. */
			pthread_mutex_unlock(&ft->lock);
			return NULL;
		}
		/* Deletions first: they give back the room that writes wait for. */
		if ((job = TAILQ_FIRST(&ft->deletes)) != NULL)
			TAILQ_REMOVE(&ft->deletes, job, entry);
		else {
			job = TAILQ_FIRST(&ft->writes);
			TAILQ_REMOVE(&ft->writes, job, entry);
		}
		pthread_mutex_unlock(&ft->lock);

		if (job->kind == FILETIER_JOB_WRITE)
			job->status = filetier_write_file(ft, job, &rng, hdr);
		else {
			filetier_fdc_forget(ft->fdc, job->ns, &job->key);
			job->status = filetier_unlink_obj(job->ns->dirfd, &job->key);
		}
		TAILQ_INSERT_TAIL(&batch, job, entry);
		filetier_post(ft, &batch);
	}
}

/*
 * The startup scan of one namespace, off the loop: a scan thread lists
 * the leaf directories and shares them with scan_threads - 1 helpers;
 * each reads headers and hands what it found, a leaf directory at a
 * time, to the loop through the scan's eventfd. The loop indexes each
 * batch at once (PROBE and ADMIT see the objects found so far, and a
 * key already indexed, written since the start, is never replaced),
 * at the LRU's end: older than anything written since. When every
 * batch is in, the scan thread sorts the scanned entries by write time
 * and the loop relinks them in that order, a bounded step per turn, so
 * that eviction after a restart follows the order the files were
 * written (the last access before the restart is not on disk).
 */

struct filetier_found {
	struct obj_key	key;
	uint32_t	pad;
	uint64_t	len;
	int64_t		mtime_ns;
};

/* What one scan thread found in a leaf directory, for the loop to index. */
struct filetier_scan_batch {
	TAILQ_ENTRY(filetier_scan_batch) entry;
	struct filetier_found	*found;
	size_t			 n;
};
TAILQ_HEAD(filetier_scan_batch_list, filetier_scan_batch);

/* A scanned entry's place in the write order, by the loop's id. */
struct filetier_scan_order {
	int64_t		mtime_ns;
	uint32_t	seq;		/* insertion order breaks ties */
	uint32_t	id;
};

#define FILETIER_SCAN_RELINK_STEP	65536	/* LRU moves per loop turn */
#define FILETIER_SCAN_TAKE_STEP		16384	/* objects indexed per loop turn, about */
/*
 * Scan threads run niced: a warm scan is CPU-bound in the kernel, and
 * scan_threads of them beside the loop on a small machine delayed the
 * loop's answers by up to 0.8 s (measured: 200k objects, 2 cores).
 */
#define FILETIER_SCAN_NICE		10

struct filetier_scan {
	struct filetier		*ft;
	struct filetier_ns	*ns;
	int64_t			 now_ns;
	unsigned		 delay_ms;	/* testing: a pause before each leaf */
	_Atomic int		 stop;		/* the tier is going: threads end early */
	/* The scan threads'. */
	char			(*leaves)[16];	/* "pp-ssss/hh" */
	size_t			 nleaves;
	size_t			 leaves_cap;
	_Atomic size_t		 next;
	pthread_t		 thread;
	int			 started;
	/* Under lock: batches and the hand-offs between the scan thread and the loop. */
	pthread_mutex_t		 lock;
	pthread_cond_t		 cond;
	struct filetier_scan_batch_list batches;
	int			 found_all;	/* every batch is posted */
	int			 order_given;	/* the loop lets the scan thread sort order[] */
	int			 sorted;
	uint64_t		 removed;	/* bad objects, stale temp files, junk */
	uint64_t		 skipped;
	int			 err;		/* the scan's first failure */
	int			 efd;		/* scan threads -> loop */
	struct event		*ev;
	/* The loop's (order[] the scan thread's while it sorts). */
	struct filetier_scan_batch_list taken;	/* handed over, not indexed yet */
	struct filetier_scan_order *order;
	size_t			 norder;
	size_t			 order_cap;
	size_t			 relinked;
	uint64_t		*gone;		/* key hashes that left the index meanwhile */
	size_t			 ngone;
	size_t			 gone_cap;
	int			 gone_sorted;
	int			 asked;		/* order_given sent */
	uint64_t		 bytes;
	int64_t			 t0;
};

struct filetier_scan_part {
	struct filetier_scan	*sc;
	pthread_t		 thread;
	int			 started;
	struct filetier_found	*found;
	size_t			 n;
	size_t			 cap;
	uint64_t		 removed;	/* bad objects, stale temp files, junk */
	uint64_t		 skipped;	/* left alone: directories, young temp files */
	int			 err;		/* -ENOMEM */
};

static int
filetier_scan_is_hex(const char *s, size_t n)
{
	size_t	i;

	for (i = 0; i < n; i++)
		if (filetier_unhex_digit(s[i]) < 0)
			return 0;
	return 1;
}

static int
filetier_is_dir(int dirfd, const struct dirent *de)
{
	struct stat	st;

	if (de->d_type != DT_UNKNOWN)
		return de->d_type == DT_DIR;
	return fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

/*
 * Checks one object file: 0 and *f filled, -ENOENT when it vanished (an
 * eviction by another daemon), another -errno for a bad file.
 */
static int
filetier_scan_file(int dfd, const char *name, const struct obj_key *k,
    struct filetier_found *f)
{
	struct stat	st;
	uint8_t		hdr[FILETIER_HDR_USED];
	uint64_t	len, csum;
	ssize_t		n;
	int		fd, rc;

	if ((fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) < 0)
		return errno == ENOENT ? -ENOENT : -EUCLEAN;
	/* Headers only: readahead would read the payload's first pages for nothing. */
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	n = pread(fd, hdr, sizeof(hdr), 0);
	rc = fstat(fd, &st);
	close(fd);
	if (rc != 0 || !S_ISREG(st.st_mode) || n != (ssize_t)sizeof(hdr))
		return -ENODATA;
	if ((rc = filetier_hdr_check(hdr, k, &len, &csum)) != 0)
		return rc;
	if ((uint64_t)st.st_size != filetier_file_bytes(len))
		return (uint64_t)st.st_size < filetier_file_bytes(len) ? -ENODATA : -EUCLEAN;
	f->key = *k;
	f->pad = 0;
	f->len = len;
	f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
	return 0;
}

static int
filetier_scan_add(struct filetier_scan_part *pt, const struct filetier_found *f)
{
	struct filetier_found	*nf;
	size_t			 cap;

	if (pt->n == pt->cap) {
		cap = pt->cap == 0 ? 4096 : pt->cap * 2;
		if ((nf = realloc(pt->found, cap * sizeof(*nf))) == NULL)
			return -ENOMEM;
		pt->found = nf;
		pt->cap = cap;
	}
	pt->found[pt->n++] = *f;
	return 0;
}

/*
 * One leaf directory: objects are checked and kept, stale temp files and
 * anything else that is not a directory are removed (these directories
 * are this module's own), directories are left alone.
 */
static void
filetier_scan_leaf(struct filetier_scan_part *pt, const char *leaf)
{
	struct filetier_scan	*sc = pt->sc;
	struct filetier_found	 f;
	struct obj_key		 k;
	struct dirent		*de;
	struct stat		 st;
	uint8_t			 ps[3];
	DIR			*d;
	int			 dfd, rc;
	size_t			 nl;
	char			 hex[5];

	memset(&k, 0, sizeof(k));
	memcpy(k.fingerprint, sc->ns->fingerprint, 16);
	/* "pp-ssss/hh": already checked to be hex */
	filetier_unhex(ps, leaf, 1);
	memcpy(hex, leaf + 3, 4);
	filetier_unhex(ps + 1, hex, 2);
	k.pool = ps[0];
	k.shard = (uint16_t)(ps[1] << 8 | ps[2]);
	/* Listed earlier: either directory may have been swapped for a link since. */
	if ((dfd = filetier_open_beneath(sc->ns->dirfd, leaf, O_RDONLY | O_DIRECTORY | O_CLOEXEC,
	    0)) < 0 || (d = fdopendir(dfd)) == NULL) {
		rc = dfd < 0 ? -dfd : errno;
		if (dfd >= 0)
			close(dfd);
		log_warn("filetier", "scan %s/%s: %s; skipped", sc->ns->name, leaf,
		    rc == ELOOP || rc == ENOTDIR ? "a symbolic link" : strerror(rc));
		pt->skipped++;
		return;
	}
	while ((de = readdir(d)) != NULL && !atomic_load_explicit(&sc->stop, memory_order_relaxed)) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (filetier_is_dir(dfd, de)) {
			pt->skipped++;
			continue;
		}
		if (strncmp(de->d_name, FILETIER_TMP_PREFIX, strlen(FILETIER_TMP_PREFIX)) == 0) {
			/* A young temp file may be another daemon's write in progress. */
			if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    sc->now_ns - ((int64_t)st.st_mtim.tv_sec * 1000000000LL +
			    st.st_mtim.tv_nsec) < (int64_t)sc->ft->p.tmp_stale_s * 1000000000LL) {
				pt->skipped++;
				continue;
			}
			if (unlinkat(dfd, de->d_name, 0) == 0)
				pt->removed++;
			continue;
		}
		nl = strlen(de->d_name);
		rc = -EUCLEAN;
		if (nl == 68 && strcmp(de->d_name + 64, ".obj") == 0 &&
		    memcmp(de->d_name, leaf + 8, 2) == 0 && filetier_unhex(k.hash, de->d_name, 32) == 0)
			rc = filetier_scan_file(dfd, de->d_name, &k, &f);
		if (rc == 0) {
			if ((pt->err = filetier_scan_add(pt, &f)) != 0)
				break;
		} else if (rc != -ENOENT) {
			log_debug("filetier", "scan %s/%s/%s: %s; removed", sc->ns->name, leaf,
			    de->d_name, filetier_strerror(rc));
			if (unlinkat(dfd, de->d_name, 0) == 0)
				pt->removed++;
		}
	}
	closedir(d);
}

static void
filetier_scan_kick(struct filetier_scan *sc)
{
	uint64_t	one = 1;

	if (write(sc->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		abort();	/* an eventfd write cannot fail otherwise */
}

/* Hands what a part found to the loop: its array goes with the batch. */
static void
filetier_scan_post(struct filetier_scan_part *pt)
{
	struct filetier_scan		*sc = pt->sc;
	struct filetier_scan_batch	*b;

	if (pt->n == 0)
		return;
	if ((b = malloc(sizeof(*b))) == NULL) {
		pt->err = -ENOMEM;
		return;
	}
	b->found = pt->found;
	b->n = pt->n;
	pt->found = NULL;
	pt->n = pt->cap = 0;
	pthread_mutex_lock(&sc->lock);
	TAILQ_INSERT_TAIL(&sc->batches, b, entry);
	pthread_mutex_unlock(&sc->lock);
	filetier_scan_kick(sc);
}

/* testing.scan_delay_ms: a pause that a stopping tier cuts short. */
static void
filetier_scan_nap(struct filetier_scan *sc)
{
	struct timespec	ts = { 0, 0 };
	unsigned	left = sc->delay_ms, step;

	while (left > 0 && !atomic_load(&sc->stop)) {
		step = left < 10 ? left : 10;
		ts.tv_nsec = (long)step * 1000000L;
		nanosleep(&ts, NULL);
		left -= step;
	}
}

static void *
filetier_scan_main(void *arg)
{
	struct filetier_scan_part	*pt = arg;
	struct filetier_scan		*sc = pt->sc;
	size_t				 i;

	/* Per thread on Linux; raising one's own nice value is always allowed. */
	(void)setpriority(PRIO_PROCESS, (id_t)gettid(), FILETIER_SCAN_NICE);
	while (pt->err == 0 && !atomic_load(&sc->stop) &&
	    (i = atomic_fetch_add(&sc->next, 1)) < sc->nleaves) {
		if (sc->delay_ms > 0)
			filetier_scan_nap(sc);
		filetier_scan_leaf(pt, sc->leaves[i]);
		filetier_scan_post(pt);
	}
	free(pt->found);	/* a batch that could not be posted */
	pt->found = NULL;
	return NULL;
}

static int
filetier_scan_leaf_add(struct filetier_scan *sc, const char *pool, const char *h)
{
	char	(*nl)[16];
	size_t	cap;

	if (sc->nleaves == sc->leaves_cap) {
		cap = sc->leaves_cap == 0 ? 256 : sc->leaves_cap * 2;
		if ((nl = realloc(sc->leaves, cap * sizeof(*nl))) == NULL)
			return -ENOMEM;
		sc->leaves = nl;
		sc->leaves_cap = cap;
	}
	/* "pp-ssss/hh": the caller checked both names' lengths. */
	memcpy(sc->leaves[sc->nleaves], pool, 7);
	sc->leaves[sc->nleaves][7] = '/';
	memcpy(sc->leaves[sc->nleaves] + 8, h, 2);
	sc->leaves[sc->nleaves++][10] = '\0';
	return 0;
}

/*
 * The leaf directories of a namespace: <pp-ssss>/<hh>. Anything else at
 * these two levels is skipped, never removed: an operator may keep notes
 * there, and only the leaf directories are certainly ours.
 */
static int
filetier_scan_list(struct filetier_scan *sc, uint64_t *skipped)
{
	struct dirent	*de, *le;
	DIR		*top, *pd;
	int		 fd, pfd, rc = 0;

	if ((fd = openat(sc->ns->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return -errno;
	if ((top = fdopendir(fd)) == NULL) {
		close(fd);
		return -errno;
	}
	while (rc == 0 && (de = readdir(top)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (strlen(de->d_name) != 7 || de->d_name[2] != '-' ||
		    !filetier_scan_is_hex(de->d_name, 2) || !filetier_scan_is_hex(de->d_name + 3, 4) ||
		    !filetier_is_dir(fd, de)) {
			(*skipped)++;
			continue;
		}
		pfd = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
		if (pfd < 0 || (pd = fdopendir(pfd)) == NULL) {
			if (pfd >= 0)
				close(pfd);
			(*skipped)++;
			continue;
		}
		while (rc == 0 && (le = readdir(pd)) != NULL) {
			if (strcmp(le->d_name, ".") == 0 || strcmp(le->d_name, "..") == 0)
				continue;
			if (strlen(le->d_name) != 2 || !filetier_scan_is_hex(le->d_name, 2) ||
			    !filetier_is_dir(pfd, le)) {
				(*skipped)++;
				continue;
			}
			rc = filetier_scan_leaf_add(sc, de->d_name, le->d_name);
		}
		closedir(pd);
	}
	closedir(top);
	return rc;
}

static int
filetier_scan_order_cmp(const void *a, const void *b)
{
	const struct filetier_scan_order	*x = a, *y = b;

	if (x->mtime_ns != y->mtime_ns)
		return x->mtime_ns < y->mtime_ns ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/*
 * The scan thread: lists the leaf directories, scans them with its
 * helpers, says every batch is posted, then waits for the loop to hand
 * it the write order of what was indexed, sorts it and says so.
 */
static void *
filetier_scan_thread(void *arg)
{
	struct filetier_scan		*sc = arg;
	struct filetier_scan_part	*parts = NULL;
	uint64_t			 removed = 0, skipped = 0;
	unsigned			 i, nparts = 0;
	int				 rc, given;

	if ((rc = filetier_scan_list(sc, &skipped)) == 0) {
		nparts = sc->ft->p.scan_threads;
		if (nparts > sc->nleaves)
			nparts = sc->nleaves > 0 ? (unsigned)sc->nleaves : 1;
		if ((parts = calloc(nparts, sizeof(*parts))) == NULL)
			rc = -ENOMEM;
	}
	for (i = 0; rc == 0 && i < nparts; i++) {
		parts[i].sc = sc;
		/* Part 0 runs on this thread; a helper that cannot start leaves its share to it. */
		if (i > 0 && pthread_create(&parts[i].thread, NULL, filetier_scan_main, &parts[i]) == 0)
			parts[i].started = 1;
	}
	if (rc == 0)
		filetier_scan_main(&parts[0]);
	for (i = 0; rc == 0 && i < nparts; i++) {
		if (parts[i].started)
			pthread_join(parts[i].thread, NULL);
		removed += parts[i].removed;
		skipped += parts[i].skipped;
		if (parts[i].err != 0 && rc == 0)
			rc = parts[i].err;
	}
	free(parts);
	pthread_mutex_lock(&sc->lock);
	sc->removed = removed;
	sc->skipped = skipped;
	sc->err = rc;
	sc->found_all = 1;
	pthread_mutex_unlock(&sc->lock);
	filetier_scan_kick(sc);

	pthread_mutex_lock(&sc->lock);
	while (!sc->order_given && !atomic_load(&sc->stop))
		pthread_cond_wait(&sc->cond, &sc->lock);
	given = sc->order_given && !atomic_load(&sc->stop);
	pthread_mutex_unlock(&sc->lock);
	if (given && sc->norder > 1)
		qsort(sc->order, sc->norder, sizeof(*sc->order), filetier_scan_order_cmp);
	pthread_mutex_lock(&sc->lock);
	sc->sorted = 1;
	pthread_mutex_unlock(&sc->lock);
	filetier_scan_kick(sc);
	return NULL;
}

static int
filetier_u64_cmp(const void *a, const void *b)
{
	uint64_t	x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * A key left the index while its namespace is scanned: its file is gone
 * or going (an eviction, a drop), or was never made (a failed write). A
 * batch found before the unlink must not bring it back as a visible
 * entry without a file. Kept as key hashes: a collision costs a miss.
 */
static void
filetier_scan_note_gone(struct filetier *ft, const struct obj_key *k)
{
	struct filetier_ns	*ns = filetier_ns_find(ft, k->fingerprint);
	struct filetier_scan	*sc;
	uint64_t		*ng;
	size_t			 cap;

	if (ns == NULL || !ns->scanning || (sc = ns->scan) == NULL)
		return;
	if (sc->ngone == sc->gone_cap) {
		cap = sc->gone_cap == 0 ? 64 : sc->gone_cap * 2;
		if ((ng = realloc(sc->gone, cap * sizeof(*ng))) == NULL)
			return;		/* then a ghost fails its read as lost, once */
		sc->gone = ng;
		sc->gone_cap = cap;
	}
	sc->gone[sc->ngone++] = index_hash(&ft->ix, k);
	sc->gone_sorted = 0;
}

static int
filetier_scan_was_gone(struct filetier_scan *sc, uint64_t h)
{
	if (sc->ngone == 0)
		return 0;
	if (!sc->gone_sorted) {
		qsort(sc->gone, sc->ngone, sizeof(*sc->gone), filetier_u64_cmp);
		sc->gone_sorted = 1;
	}
	return bsearch(&h, sc->gone, sc->ngone, sizeof(*sc->gone), filetier_u64_cmp) != NULL;
}

/* Indexes one batch on the loop: new keys only, at the LRU's end. */
static void
filetier_scan_take(struct filetier *ft, struct filetier_scan *sc, struct filetier_scan_batch *b)
{
	struct filetier_scan_order	*no;
	struct filetier_found		*f;
	struct filetier_ent		*e;
	uint64_t			 h;
	uint32_t			 id;
	size_t				 i, cap;
	int				 rc;

	for (i = 0; i < b->n; i++) {
		f = &b->found[i];
		if (index_find(&ft->ix, &f->key, &h) != FILETIER_NONE ||
		    filetier_scan_was_gone(sc, h))
			continue;
		if ((rc = index_rec_new(&ft->ix, &id)) != 0) {
			/* What was indexed is sound; the rest is found by the next start. */
			if (sc->err == 0)
				sc->err = rc;
			return;
		}
		e = filetier_ent(ft, id);
		e->rec.key = f->key;
		e->len = f->len;
		e->pins = 0;
		e->state = FILETIER_S_VISIBLE;
		index_insert(&ft->ix, id, h);
		sc->ns->objects++;
		/* At the LRU end: what a scan finds is older than anything written since the start. */
		index_lru_push_tail(&ft->ix, &ft->lru, id);
		ft->st.visible++;
		filetier_ns_visible(sc->ns, &f->key, 1);
		ft->st.bytes_used += filetier_file_bytes(f->len);
		ft->st.scan_objects++;
		ft->st.scan_bytes += filetier_file_bytes(f->len);
		sc->ns->scanned++;
		sc->bytes += filetier_file_bytes(f->len);
		if (sc->norder == sc->order_cap) {
			cap = sc->order_cap == 0 ? 4096 : sc->order_cap * 2;
			if ((no = realloc(sc->order, cap * sizeof(*no))) == NULL)
				continue;	/* this one keeps its place at the end */
			sc->order = no;
			sc->order_cap = cap;
		}
		e->scanned = 1;
		sc->order[sc->norder].mtime_ns = f->mtime_ns;
		sc->order[sc->norder].seq = (uint32_t)sc->norder;
		sc->order[sc->norder++].id = id;
	}
}

/*
 * Moves scanned entries to the LRU's end, newest first, so that the
 * oldest write ends up the next victim; skips those used or gone since
 * they were indexed. 1 once every entry was visited.
 */
static int
filetier_scan_relink(struct filetier *ft, struct filetier_scan *sc)
{
	const struct filetier_scan_order	*o;
	struct filetier_ent			*e;
	unsigned				 budget = FILETIER_SCAN_RELINK_STEP;

	while (sc->relinked < sc->norder && budget-- > 0) {
		o = &sc->order[sc->norder - 1 - sc->relinked++];
		if (o->id >= ft->ix.nrecords)
			continue;
		e = filetier_ent(ft, o->id);
		if (!e->scanned || memcmp(e->rec.key.fingerprint, sc->ns->fingerprint, 16) != 0)
			continue;
		e->scanned = 0;
		if (e->state != FILETIER_S_VISIBLE || e->pins > 0)
			continue;
		index_lru_unlink(&ft->ix, &ft->lru, o->id);
		index_lru_push_tail(&ft->ix, &ft->lru, o->id);
	}
	return sc->relinked == sc->norder;
}

static void
filetier_scan_batches_free(struct filetier_scan_batch_list *l)
{
	struct filetier_scan_batch	*b;

	while ((b = TAILQ_FIRST(l)) != NULL) {
		TAILQ_REMOVE(l, b, entry);
		free(b->found);
		free(b);
	}
}

static void	filetier_scan_free(struct filetier_scan *);

/* The scan ended: its counters, its log line, and the over-capacity the files may bring. */
static void
filetier_scan_finish(struct filetier *ft, struct filetier_scan *sc)
{
	struct filetier_ns	*ns = sc->ns;
	int64_t			 dt = filetier_now_ns(CLOCK_MONOTONIC) - sc->t0;

	if (sc->started)
		pthread_join(sc->thread, NULL);
	sc->started = 0;
	event_del(sc->ev);
	ns->scanning = 0;
	ft->nscanning--;
	ft->st.scan_removed += sc->removed;
	ft->st.scan_skipped += sc->skipped;
	ft->st.scan_ms += (uint64_t)dt / 1000000;
	if (sc->err != 0)
		log_warn("filetier", "scan of %s: %s after %llu objects; the rest is found by the "
		    "next start", ns->name, strerror(-sc->err), (unsigned long long)ns->scanned);
	log_info("filetier", "%s: %llu objects (%llu MiB) in %.1f ms; %llu bad or stale files "
	    "removed, %llu entries skipped", ns->name, (unsigned long long)ns->scanned,
	    (unsigned long long)(sc->bytes >> 20), (double)dt / 1e6,
	    (unsigned long long)sc->removed, (unsigned long long)sc->skipped);
	/* Its eventfd goes now: a namespace keeps no descriptor it does not use. */
	ns->scan_err = sc->err;
	ns->scan = NULL;
	filetier_scan_free(sc);
	filetier_ns_idle(ft, ns);
	/* A capacity lowered since the files were written: the oldest go. */
	if (ft->st.bytes_used > ft->cap_eff)
		(void)filetier_make_room(ft, 0);
	/* The scan threads' arenas held the found lists: give them back now. */
	malloc_trim(0);
}

/* The loop's side of a scan: batches in, then the order, then the end. */
static void
filetier_scan_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct filetier_scan		*sc = arg;
	struct filetier			*ft = sc->ft;
	struct filetier_scan_batch	*b;
	uint64_t			 n;
	size_t				 budget = FILETIER_SCAN_TAKE_STEP;
	int				 found_all, sorted;

	(void)ev;
	if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		log_warn("filetier", "scan eventfd read: %s", strerror(errno));
	pthread_mutex_lock(&sc->lock);
	TAILQ_CONCAT(&sc->taken, &sc->batches, entry);
	found_all = sc->found_all;
	sorted = sc->sorted;
	pthread_mutex_unlock(&sc->lock);
	while ((b = TAILQ_FIRST(&sc->taken)) != NULL && budget > 0) {
		TAILQ_REMOVE(&sc->taken, b, entry);
		budget -= b->n < budget ? b->n : budget;
		filetier_scan_take(ft, sc, b);
		free(b->found);
		free(b);
	}
	if (!TAILQ_EMPTY(&sc->taken)) {
		event_active(sc->ev, EV_READ, 0);	/* the rest on the next turn */
		return;
	}
	if (found_all && !sc->asked) {
		/* Every batch was posted before found_all and is indexed now: order[] is complete. */
		sc->asked = 1;
		pthread_mutex_lock(&sc->lock);
		sc->order_given = 1;
		pthread_cond_signal(&sc->cond);
		pthread_mutex_unlock(&sc->lock);
		return;
	}
	if (!sorted)
		return;
	if (!filetier_scan_relink(ft, sc)) {
		event_active(sc->ev, EV_READ, 0);	/* the rest on the next turn */
		return;
	}
	filetier_scan_finish(ft, sc);
}

static int
filetier_name_char_ok(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	    c == '.' || c == '-' || c == '_';
}

/*
 * A namespace name is "role/model-<32 hex>" with the hex equal to the
 * fingerprint, every character safe, exactly one slash and no "." or
 * ".." component: it becomes two directory names, so it is checked here
 * even though namespace.c made it.
 */
static int
filetier_ns_name_check(const char *name, const uint8_t fp[16], char *err, size_t errlen)
{
	const char	*slash, *rest;
	char		 hex[33];
	size_t		 n, i, rl;

	n = strnlen(name, PROTO_NSNAME_LEN);
	if (n == 0 || n >= PROTO_NSNAME_LEN || (slash = strchr(name, '/')) == NULL ||
	    strchr(slash + 1, '/') != NULL)
		goto bad;
	rl = (size_t)(slash - name);
	rest = slash + 1;
	if (rl == 0 || (rl == 1 && name[0] == '.') || (rl == 2 && name[0] == '.' && name[1] == '.'))
		goto bad;
	for (i = 0; i < n; i++)
		if (name + i != slash && !filetier_name_char_ok(name[i]))
			goto bad;
	filetier_hex(hex, fp, 16);
	if (strlen(rest) < 33 || rest[strlen(rest) - 33] != '-' ||
	    strcmp(rest + strlen(rest) - 32, hex) != 0) {
		snprintf(err, errlen, "file tier: namespace %.*s does not end in its fingerprint %s",
		    (int)n, name, hex);
		return -EINVAL;
	}
	return 0;
bad:
	snprintf(err, errlen, "file tier: namespace name \"%.*s\" is not role/model-fingerprint",
	    (int)strnlen(name, PROTO_NSNAME_LEN), name);
	return -EINVAL;
}

/* mkdir(1) -p relative to dirfd (or AT_FDCWD) for a path of checked components. */
static int
filetier_mkdir_p(int dirfd, const char *path, char *err, size_t errlen)
{
	char	buf[PATH_MAX], *p;

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) {
		snprintf(err, errlen, "file tier: path %s is too long", path);
		return -ENAMETOOLONG;
	}
	for (p = buf + 1; ; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		if (p[-1] != '/') {
			char c = *p;

			*p = '\0';
			if (mkdirat(dirfd, buf, FILETIER_DIR_MODE) != 0 && errno != EEXIST) {
				int rc = -errno;

				snprintf(err, errlen, "file tier: mkdir %s: %s", buf, strerror(-rc));
				return rc;
			}
			*p = c;
		}
		if (*p == '\0')
			return 0;
	}
}

static int64_t
filetier_now_ns(clockid_t clk)
{
	struct timespec	ts;

	clock_gettime(clk, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/*
 * Warns about a tier directory that someone else could change under the
 * daemon: owned by another user, or writable by others. Nothing is
 * refused (a shared filesystem may map owners oddly), but the operator
 * is told which directory and why.
 */
static void
filetier_dir_check(int fd, const char *root, const char *rel)
{
	struct stat	st;

	if (fstat(fd, &st) != 0)
		return;
	if (st.st_uid != geteuid())
		log_warn("filetier", "%s%s%s is owned by uid %u, not by this daemon's %u: that user "
		    "can change what the tier serves", root, rel[0] != '\0' ? "/" : "", rel,
		    (unsigned)st.st_uid, (unsigned)geteuid());
	if ((st.st_mode & S_IWOTH) != 0)
		log_warn("filetier", "%s%s%s is writable by others (mode %04o): anyone can change what "
		    "the tier serves", root, rel[0] != '\0' ? "/" : "", rel,
		    (unsigned)(st.st_mode & 07777));
}

/* One directory below dirfd, made if create and missing (*made then 1), never a link. */
static int
filetier_dir_open(int dirfd, const char *name, int create, int *made)
{
	int	fd;

	*made = 0;
	if ((fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) >= 0)
		return fd;
	if (errno != ENOENT || !create)
		return filetier_dir_errno(dirfd, name, errno);
	if (mkdirat(dirfd, name, FILETIER_DIR_MODE) == 0)
		*made = 1;
	else if (errno != EEXIST)
		return -errno;
	if ((fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return -errno;
	return fd;
}

/*
 * Opens a namespace's directory, <role>/<model-fingerprint> under the
 * root, one component at a time with no link followed; create makes the
 * missing ones, and removes them again when the directory cannot be
 * opened (no descriptor left), so that no directory is left behind for a
 * namespace the tier could not register.
 */
static int
filetier_ns_open(struct filetier *ft, struct filetier_ns *ns, int create, int check, char *err,
    size_t errlen)
{
	const char	*slash = strchr(ns->name, '/');
	char		 role[PROTO_NSNAME_LEN];
	int		 rfd, fd, made_role, made_ns;

	assert(slash != NULL && ns->dirfd < 0);
	memcpy(role, ns->name, (size_t)(slash - ns->name));
	role[slash - ns->name] = '\0';
	if ((rfd = filetier_dir_open(ft->rootfd, role, create, &made_role)) < 0) {
		fd = rfd;
		goto fail;
	}
	if ((fd = filetier_dir_open(rfd, slash + 1, create, &made_ns)) < 0) {
		if (made_role)
			(void)unlinkat(ft->rootfd, role, AT_REMOVEDIR);
		close(rfd);
		goto fail;
	}
	/* Once, at registration: directories found there (made here, they are ours). */
	if (check && !made_role)
		filetier_dir_check(rfd, ft->root, role);
	if (check && !made_ns)
		filetier_dir_check(fd, ft->root, ns->name);
	close(rfd);
	ns->dirfd = fd;
	return 0;
fail:
	snprintf(err, errlen, "file tier: open %s/%s: %s", ft->root, ns->name,
	    fd == -ELOOP || fd == -ENOTDIR ? "a component is a symbolic link or not a directory" :
	    strerror(-fd));
	return fd;
}

/*
 * Forgets one idle namespace with nothing indexed (its directory stays:
 * another daemon may use it, and a later ATTACH finds it again), to make
 * room for a new one. -EUSERS when every namespace is in use or holds
 * objects.
 */
static int
filetier_ns_forget_one(struct filetier *ft)
{
	struct filetier_ns	*ns;
	struct filetier_fdc	*c = ft->fdc;
	uint32_t		 j;
	unsigned		 i;
	int			 fd;

	for (i = 0; i < ft->nns; i++) {
		ns = ft->ns[i];
		if (!ns->attached && ns->jobs == 0 && !ns->scanning && ns->objects == 0)
			break;
	}
	if (i == ft->nns)
		return -EUSERS;
	filetier_ns_idle(ft, ns);
	/* Cache entries name the namespace by its address: none may outlive it. */
	if (c != NULL) {
		pthread_mutex_lock(&c->lock);
		for (j = 0; j < c->cap; j++) {
			if (c->ents[j].state != FILETIER_FDC_LIVE || c->ents[j].ns != ns)
				continue;
			if ((fd = filetier_fdc_unhash(c, j)) >= 0)
				close(fd);
		}
		pthread_mutex_unlock(&c->lock);
	}
	log_debug("filetier", "namespace %s forgotten: idle and empty", ns->name);
	ft->ns[i] = ft->ns[--ft->nns];
	free(ns);
	ft->st.namespaces_forgotten++;
	return 0;
}

/*
 * Registers a namespace: its directory made and opened. Everything that
 * can fail without touching the disk goes first.
 */
static int
filetier_ns_add(struct filetier *ft, const char *name, const uint8_t fp[16],
    struct filetier_ns **nsp, char *err, size_t errlen)
{
	struct filetier_ns	*ns, **nv;
	unsigned		 cap;
	int			 rc;

	if (ft->nns >= ft->p.max_namespaces && filetier_ns_forget_one(ft) != 0) {
		snprintf(err, errlen, "file tier: %u namespaces are known, each attached or holding "
		    "objects (limits.max_namespaces); namespace %s refused", ft->nns, name);
		return -EUSERS;
	}
	if (ft->nns == ft->ns_cap) {
		cap = ft->ns_cap == 0 ? 4 : ft->ns_cap * 2;
		if ((nv = realloc(ft->ns, cap * sizeof(*nv))) == NULL)
			goto nomem;
		ft->ns = nv;
		ft->ns_cap = cap;
	}
	if ((ns = calloc(1, sizeof(*ns))) == NULL)
		goto nomem;
	memcpy(ns->fingerprint, fp, 16);
	snprintf(ns->name, sizeof(ns->name), "%s", name);
	atomic_init(&ns->direct, ft->p.direct ? 1 : 0);
	ns->dirfd = -1;
	if ((rc = filetier_ns_open(ft, ns, 1, 1, err, errlen)) != 0) {
		free(ns);
		return rc;
	}
	ns->attached = 1;
	ft->ns[ft->nns++] = ns;
	*nsp = ns;
	return 0;
nomem:
	snprintf(err, errlen, "file tier: out of memory for namespace %s", name);
	return -ENOMEM;
}

/* Frees a scan whose thread was joined (or never started). */
static void
filetier_scan_free(struct filetier_scan *sc)
{
	if (sc == NULL)
		return;
	filetier_scan_batches_free(&sc->batches);
	filetier_scan_batches_free(&sc->taken);
	if (sc->ev != NULL)
		event_free(sc->ev);
	if (sc->efd >= 0)
		close(sc->efd);
	pthread_cond_destroy(&sc->cond);
	pthread_mutex_destroy(&sc->lock);
	free(sc->order);
	free(sc->gone);
	free(sc->leaves);
	free(sc);
}

int
filetier_scan_start(struct filetier *ft, const char *name, const uint8_t fp[16], char *err,
    size_t errlen)
{
	struct filetier_scan	*sc;
	struct filetier_ns	*ns;
	int			 rc;

	if ((rc = filetier_ns_name_check(name, fp, err, errlen)) != 0)
		return rc;
	if ((ns = filetier_ns_find(ft, fp)) != NULL) {
		if (strcmp(ns->name, name) != 0) {
			snprintf(err, errlen, "file tier: fingerprint of %s is attached as %s", name,
			    ns->name);
			return -EEXIST;
		}
		/* Known and indexed: attached again without a scan, its directory reopened. */
		if (ns->dirfd < 0 && (rc = filetier_ns_open(ft, ns, 1, 0, err, errlen)) != 0)
			return rc;
		ns->attached = 1;
		return 0;
	}
	/* Registered first: writes work from now on, whatever becomes of the scan. */
	if ((rc = filetier_ns_add(ft, name, fp, &ns, err, errlen)) != 0)
		return rc;
	if ((sc = calloc(1, sizeof(*sc))) == NULL) {
		snprintf(err, errlen, "file tier: out of memory scanning %s", name);
		return -ENOMEM;
	}
	sc->ft = ft;
	sc->ns = ns;
	sc->now_ns = filetier_now_ns(CLOCK_REALTIME);
	sc->t0 = filetier_now_ns(CLOCK_MONOTONIC);
	sc->delay_ms = ft->p.scan_delay_ms;
	atomic_init(&sc->stop, 0);
	atomic_init(&sc->next, 0);
	pthread_mutex_init(&sc->lock, NULL);
	pthread_cond_init(&sc->cond, NULL);
	TAILQ_INIT(&sc->batches);
	TAILQ_INIT(&sc->taken);
	if ((sc->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
	    (sc->ev = event_new(ft->base, sc->efd, EV_READ | EV_PERSIST, filetier_scan_cb,
	    sc)) == NULL || event_add(sc->ev, NULL) != 0) {
		rc = sc->efd < 0 ? -errno : -ENOMEM;
		goto fail;
	}
	if ((rc = pthread_create(&sc->thread, NULL, filetier_scan_thread, sc)) != 0) {
		rc = -rc;
		goto fail;
	}
	sc->started = 1;
	ns->scan = sc;
	ns->scanning = 1;
	ft->nscanning++;
	return 0;
fail:
	snprintf(err, errlen, "file tier: cannot start the scan of %s: %s", name, strerror(-rc));
	filetier_scan_free(sc);
	return rc;
}

/* VISIBLE objects of a namespace, per pool index: 0, or -ENOENT when the tier does not know it. */
int
filetier_ns_objects(const struct filetier *ft, const uint8_t fp[16],
    uint64_t objects[PROTO_POOLS_MAX])
{
	const struct filetier_ns	*ns = filetier_ns_find(ft, fp);

	if (ns == NULL)
		return -ENOENT;
	memcpy(objects, ns->visible, sizeof(ns->visible));
	return 0;
}

/*
 * The scan, waited for: runs the tier's event base until it ended (for
 * tests and tools, whose loop is this thread). Returns its failure, if
 * any, with what it indexed before in *objects.
 */
int
filetier_scan(struct filetier *ft, const char *name, const uint8_t fp[16], uint64_t *objects,
    char *err, size_t errlen)
{
	struct filetier_ns	*ns;
	int			 rc;

	*objects = 0;
	if ((rc = filetier_scan_start(ft, name, fp, err, errlen)) != 0)
		return rc;
	ns = filetier_ns_find(ft, fp);
	while (ns->scanning)
		if (event_base_loop(ft->base, EVLOOP_ONCE) < 0)
			return -EIO;
	*objects = ns->scanned;
	if (ns->scan_err != 0) {
		snprintf(err, errlen, "file tier: scan of %s: %s after %llu objects", name,
		    strerror(-ns->scan_err), (unsigned long long)ns->scanned);
		return ns->scan_err;
	}
	return 0;
}

int
filetier_scan_state(const struct filetier *ft, const uint8_t fp[16], uint64_t *objects)
{
	const struct filetier_ns	*ns = filetier_ns_find(ft, fp);

	if (ns == NULL)
		return -ENOENT;
	if (objects != NULL)
		*objects = ns->scanned;
	return ns->scanning ? 1 : 0;
}

/*
 * The daemon's last session of a namespace left: its objects stay
 * indexed, its directory closes once no scan or job uses it. Unknown
 * fingerprints are fine (the tier could not register the namespace).
 */
void
filetier_ns_detach(struct filetier *ft, const uint8_t fp[16])
{
	struct filetier_ns	*ns = filetier_ns_find(ft, fp);

	if (ns == NULL)
		return;
	ns->attached = 0;
	filetier_ns_idle(ft, ns);
}

/* Ends every scan: threads stop between files and are joined; nothing more is indexed. */
static void
filetier_scans_stop(struct filetier *ft)
{
	struct filetier_scan	*sc;
	unsigned		 i;

	for (i = 0; i < ft->nns; i++) {
		if ((sc = ft->ns[i]->scan) == NULL)
			continue;
		pthread_mutex_lock(&sc->lock);
		atomic_store(&sc->stop, 1);
		pthread_cond_broadcast(&sc->cond);
		pthread_mutex_unlock(&sc->lock);
		if (sc->started)
			pthread_join(sc->thread, NULL);
		sc->started = 0;
		if (ft->ns[i]->scanning)
			ft->nscanning--;
		ft->ns[i]->scanning = 0;
		ft->ns[i]->scan = NULL;
		filetier_scan_free(sc);
	}
}

/* The tier. */

void
filetier_params_default(struct filetier_params *p)
{
	memset(p, 0, sizeof(*p));
	p->capacity = UINT64_MAX;
	p->readers = 2;
	p->writers = 2;
	p->read_depth = 32;
	p->write_queue = 1024;
	/* A cold scan waits on one small read per file: depth is what makes it fast. */
	p->scan_threads = 32;
	/* Far longer than one object's write, even with fsync on a slow NFS. */
	p->tmp_stale_s = 300;
	p->direct = 1;
	p->io_uring = 1;
	/* 32 Ki descriptors: 1 GiB of 36 KiB pages, some 40 MiB of kernel memory. */
	p->fd_cache = 32768;
	p->max_namespaces = 1024;
	p->openat2 = 1;
}

static void
filetier_jobs_free(struct filetier_job_list *l)
{
	struct filetier_job	*job;

	while ((job = TAILQ_FIRST(l)) != NULL) {
		TAILQ_REMOVE(l, job, entry);
		free(job);
	}
}

static int
filetier_reader_init(struct filetier_reader *r, struct filetier *ft)
{
	unsigned	i, depth = ft->p.read_depth;
	int		rc;

	r->ft = ft;
	TAILQ_INIT(&r->queue);
	pthread_cond_init(&r->cond, NULL);
	if ((r->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
		return -errno;
	r->hdrs = aligned_alloc(FILETIER_HDR, (size_t)depth * FILETIER_HDR);
	r->slots = calloc(depth, sizeof(*r->slots));
	r->free_slots = calloc(depth, sizeof(*r->free_slots));
	if (r->hdrs == NULL || r->slots == NULL || r->free_slots == NULL)
		return -ENOMEM;
	for (i = 0; i < depth; i++)
		r->free_slots[i] = depth - 1 - i;
	r->nfree = depth;
	/* The ring opens files with openat2 (no link followed): without it, preadv. */
	if (!ft->p.io_uring || !atomic_load(&filetier_has_openat2))
		return 0;
	/* One SQE in flight per slot (its open, then its read), and the kick. */
	if ((rc = io_uring_queue_init(depth + 1, &r->ring, 0)) != 0) {
		log_warn("filetier", "io_uring_queue_init: %s; reads use pread", strerror(-rc));
		return 0;
	}
	if ((rc = io_uring_register_files_sparse(&r->ring, depth)) != 0) {
		log_warn("filetier", "io_uring direct descriptors: %s; reads use pread",
		    strerror(-rc));
		io_uring_queue_exit(&r->ring);
		return 0;
	}
	r->uring = 1;
	return 0;
}

static void
filetier_reader_fini(struct filetier_reader *r)
{
	if (r->ft == NULL)
		return;		/* never initialised */
	filetier_jobs_free(&r->queue);
	if (r->uring) {
		/*
		 * Slots keep their last file open. Unregistering closes them
		 * now; the ring's own teardown would close them later, in a
		 * kernel worker, and a filesystem could not be unmounted yet.
		 */
		io_uring_unregister_files(&r->ring);
		io_uring_queue_exit(&r->ring);
	}
	r->uring = 0;
	if (r->kick_fd >= 0)
		close(r->kick_fd);
	r->kick_fd = -1;
	pthread_cond_destroy(&r->cond);
	free(r->hdrs);
	free(r->slots);
	free(r->free_slots);
	r->hdrs = NULL;
	r->slots = NULL;
	r->free_slots = NULL;
}

int
filetier_new(struct event_base *base, const struct filetier_params *p, struct filetier **out,
    char *err, size_t errlen)
{
	struct filetier	*ft;
	unsigned	 i, n;
	int		 rc;

	*out = NULL;
	if (p->root == NULL || p->root[0] == '\0' || strlen(p->root) >= PATH_MAX - 128) {
		snprintf(err, errlen, "file tier: the root path is empty or too long");
		return -EINVAL;
	}
	if (p->capacity < (1ULL << 20) || p->readers < 1 || p->readers > 64 || p->writers < 1 ||
	    p->writers > 64 || p->read_depth < 1 || p->read_depth > 1024 || p->write_queue < 1 ||
	    p->scan_threads < 1 || p->scan_threads > 256 || p->max_namespaces < 1) {
		snprintf(err, errlen, "file tier: parameter out of range (capacity >= 1 MiB, "
		    "readers and writers 1..64, read depth 1..1024, scan threads 1..256)");
		return -EINVAL;
	}
	if ((ft = calloc(1, sizeof(*ft))) == NULL)
		goto nomem;
	ft->base = base;
	ft->p = *p;
	snprintf(ft->root, sizeof(ft->root), "%s", p->root);
	ft->p.root = ft->root;
	ft->rootfd = ft->efd = -1;
	index_lru_init(&ft->lru);
	pthread_mutex_init(&ft->lock, NULL);
	pthread_mutex_init(&ft->dir_lock, NULL);
	atomic_init(&ft->dirs_recreated, 0);
	pthread_cond_init(&ft->wcond, NULL);
	TAILQ_INIT(&ft->nospace);
	TAILQ_INIT(&ft->writes);
	TAILQ_INIT(&ft->deletes);
	TAILQ_INIT(&ft->done);
	TAILQ_INIT(&ft->delayed);
	if (index_init(&ft->ix, FILETIER_S_VISIBLE) != 0)
		goto nomem;
	if ((ft->delay_ev = evtimer_new(base, filetier_delay_cb, ft)) == NULL)
		goto nomem;

	if ((rc = filetier_mkdir_p(AT_FDCWD, ft->root, err, errlen)) != 0)
		goto fail;
	/* The root itself is the operator's to name, a link included; below it, never. */
	if ((ft->rootfd = open(ft->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		rc = -errno;
		snprintf(err, errlen, "file tier: open %s: %s", ft->root, strerror(-rc));
		goto fail;
	}
	filetier_dir_check(ft->rootfd, ft->root, "");
	/* Learns whether the kernel has openat2 (5.6): the walks and the readers' rings use it. */
	if (!p->openat2)
		atomic_store(&filetier_has_openat2, 0);	/* process-wide: tests only */
	if ((rc = filetier_open_beneath(ft->rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0)) >= 0)
		close(rc);
	if (!atomic_load(&filetier_has_openat2))
		log_info("filetier", "no openat2: paths are walked a component at a time, reads use "
		    "preadv");
	if ((ft->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
		rc = -errno;
		snprintf(err, errlen, "file tier: eventfd: %s", strerror(-rc));
		goto fail;
	}
	ft->ev = event_new(base, ft->efd, EV_READ | EV_PERSIST, filetier_done_cb, ft);
	ft->readers = calloc(p->readers, sizeof(*ft->readers));
	ft->threads = calloc(p->readers + p->writers, sizeof(*ft->threads));
	if (ft->ev == NULL || ft->readers == NULL || ft->threads == NULL ||
	    event_add(ft->ev, NULL) != 0)
		goto nomem;
	for (i = 0; i < p->readers; i++) {
		ft->readers[i].kick_fd = -1;
		if ((rc = filetier_reader_init(&ft->readers[i], ft)) != 0) {
			snprintf(err, errlen, "file tier: reader set-up: %s", strerror(-rc));
			goto fail;
		}
	}
	/*
	 * The open-file cache, for readers on a ring: at most half the open
	 * file limit, the rest is for connections and memory fds.
	 */
	if (p->fd_cache > 0 && ft->readers[0].uring) {
		struct rlimit	rl;
		uint64_t	cap = p->fd_cache;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
		    rl.rlim_cur / 2 < cap)
			cap = rl.rlim_cur / 2;
		if (cap > 0 && (ft->fdc = filetier_fdc_new((uint32_t)cap, ft->ix.seed)) == NULL)
			goto nomem;
	}
	for (i = 0, n = p->readers + p->writers; i < n; i++) {
		rc = pthread_create(&ft->threads[i], NULL,
		    i < p->readers ? filetier_reader_main : filetier_writer_main,
		    i < p->readers ? (void *)&ft->readers[i] : (void *)ft);
		if (rc != 0) {
			snprintf(err, errlen, "file tier: pthread_create: %s", strerror(rc));
			rc = -rc;
			goto fail;
		}
		ft->nthreads++;
	}
	ft->st.bytes_capacity = p->capacity;
	ft->cap_eff = p->capacity;
	*out = ft;
	return 0;

nomem:
	snprintf(err, errlen, "file tier: out of memory");
	rc = -ENOMEM;
fail:
	filetier_free(ft);
	return rc;
}

/*
 * Stops the threads: reads and writes already started finish (a read
 * lands in caller memory, so it must not be abandoned halfway), queued
 * ones never start. No completion runs: the loop is going away. The
 * files on disk are whatever finished. NULL is fine.
 */
void
filetier_free(struct filetier *ft)
{
	unsigned	i, j;

	if (ft == NULL)
		return;
	filetier_scans_stop(ft);
	pthread_mutex_lock(&ft->lock);
	ft->stop = 1;
	pthread_cond_broadcast(&ft->wcond);
	for (i = 0; ft->readers != NULL && i < ft->p.readers; i++)
		if (ft->readers[i].ft != NULL)
			pthread_cond_broadcast(&ft->readers[i].cond);
	pthread_mutex_unlock(&ft->lock);
	for (i = 0; ft->readers != NULL && i < ft->p.readers; i++) {
		uint64_t one = 1;

		if (ft->readers[i].ft != NULL && ft->readers[i].kick_fd >= 0 &&
		    write(ft->readers[i].kick_fd, &one, sizeof(one)) < 0)
			log_warn("filetier", "kick: %s", strerror(errno));
	}
	for (i = 0; i < ft->nthreads; i++)
		pthread_join(ft->threads[i], NULL);
	filetier_fdc_free(ft->fdc);
	ft->fdc = NULL;
	filetier_jobs_free(&ft->nospace);
	filetier_jobs_free(&ft->writes);
	filetier_jobs_free(&ft->deletes);
	filetier_jobs_free(&ft->done);
	filetier_jobs_free(&ft->delayed);
	if (ft->delay_ev != NULL)
		event_free(ft->delay_ev);
	if (ft->readers != NULL)
		for (i = 0; i < ft->p.readers; i++)
			filetier_reader_fini(&ft->readers[i]);
	free(ft->readers);
	free(ft->threads);
	if (ft->ev != NULL)
		event_free(ft->ev);
	if (ft->efd >= 0)
		close(ft->efd);
	for (j = 0; j < ft->nns; j++) {
		if (ft->ns[j]->dirfd >= 0)
			close(ft->ns[j]->dirfd);
		free(ft->ns[j]);
	}
	free(ft->ns);
	if (ft->rootfd >= 0)
		close(ft->rootfd);
	index_fini(&ft->ix);
	pthread_cond_destroy(&ft->wcond);
	pthread_mutex_destroy(&ft->dir_lock);
	pthread_mutex_destroy(&ft->lock);
	free(ft);
}

/* Visible objects only; no side effects at all (PROBE). */
int
filetier_lookup(const struct filetier *ft, const struct obj_key *k, uint32_t *idp,
    uint64_t *len)
{
	uint32_t	id;

	if ((id = index_lookup(&ft->ix, k)) == FILETIER_NONE)
		return -ENOENT;
	if (idp != NULL)
		*idp = id;
	if (len != NULL)
		*len = filetier_ent(ft, id)->len;
	return 0;
}

int
filetier_pin(struct filetier *ft, uint32_t id)
{
	struct filetier_ent	*e = filetier_ent_live(ft, id);

	if (e == NULL)
		return -EINVAL;
	if (e->state != FILETIER_S_VISIBLE)
		return -ENOENT;
	if (e->pins == FILETIER_PINS_MAX)
		return -EOVERFLOW;
	e->scanned = 0;		/* used since: its unpin makes it the MRU, the scan leaves it */
	if (e->pins++ == 0) {
		index_lru_unlink(&ft->ix, &ft->lru, id);
		ft->st.pinned_objects++;
	}
	ft->st.pins++;
	return 0;
}

void
filetier_unpin(struct filetier *ft, uint32_t id)
{
	assert(filetier_ent_live(ft, id) != NULL);
	filetier_unpin_id(ft, id);
}

/*
 * Takes a visible object out of the tier (the caller found it lost, or an
 * operator asked): later lookups miss, and its file is unlinked by a
 * worker. A pinned entry's id stays valid until its last unpin. Idempotent.
 */
void
filetier_drop(struct filetier *ft, uint32_t id)
{
	struct filetier_ent	*e = filetier_ent_live(ft, id);

	if (e == NULL || e->state != FILETIER_S_VISIBLE)
		return;
	ft->st.drops++;
	filetier_ent_retire(ft, id, 0);
}

int
filetier_write(struct filetier *ft, const struct obj_key *k, const void *data, uint64_t len,
    uint64_t checksum, void (*done)(struct filetier_job *), void *arg)
{
	struct filetier_job	*job;
	struct filetier_ent	*e;
	struct filetier_ns	*ns;
	uint64_t		 h;
	uint32_t		 id;
	int			 rc;

	if (k->pad != 0 || len == 0 || data == NULL || done == NULL)
		return -EINVAL;
	if (len > FILETIER_OBJ_MAX || filetier_file_bytes(len) > ft->p.capacity)
		return -EFBIG;
	if ((ns = filetier_ns_find(ft, k->fingerprint)) == NULL)
		return -ESRCH;
	if ((id = index_find(&ft->ix, k, &h)) != FILETIER_NONE) {
		/* One writer per key; a key being unlinked waits for its unlink. */
		if (filetier_ent(ft, id)->state == FILETIER_S_DELETING)
			return -EBUSY;
		ft->st.writes_present++;
		return -EEXIST;
	}
	if (ft->st.writes_inflight >= ft->p.write_queue) {
		ft->st.writes_refused++;
		return -EAGAIN;
	}
	if ((job = calloc(1, sizeof(*job))) == NULL)
		return -ENOMEM;
	/* A tier refusing writes after a full filesystem must still see it free up. */
	filetier_capacity_recheck(ft);
	if ((rc = filetier_make_room(ft, filetier_file_bytes(len))) != 0) {
		free(job);
		return rc;
	}
	if ((rc = filetier_ns_hold(ft, ns)) != 0) {
		free(job);
		return rc;
	}
	if ((rc = index_rec_new(&ft->ix, &id)) != 0) {
		filetier_ns_put(ft, ns);
		free(job);
		return rc;
	}
	e = filetier_ent(ft, id);
	e->rec.key = *k;
	e->len = len;
	e->pins = 0;
	e->state = FILETIER_S_WRITING;
	index_insert(&ft->ix, id, h);
	ns->objects++;
	ft->st.writing++;
	ft->st.writes_inflight++;
	ft->st.bytes_used += filetier_file_bytes(len);

	job->kind = FILETIER_JOB_WRITE;
	job->key = *k;
	job->buf = (void *)(uintptr_t)data;
	job->len = len;
	job->checksum = checksum;
	job->status = -EINPROGRESS;
	job->done = done;
	job->arg = arg;
	job->ns = ns;
	job->id = id;
	filetier_enqueue(ft, job);
	return 0;
}

int
filetier_read(struct filetier *ft, const struct obj_key *k, void *dst, uint64_t cap,
    void (*done)(struct filetier_job *), void *arg, struct filetier_job **jobp)
{
	struct filetier_job	*job;
	struct filetier_ent	*e;
	struct filetier_ns	*ns;
	uint32_t		 id;
	int			 rc;

	if (jobp != NULL)
		*jobp = NULL;
	if (dst == NULL || ((uintptr_t)dst & (FILETIER_HDR - 1)) != 0 || done == NULL)
		return -EINVAL;
	if ((rc = filetier_lookup(ft, k, &id, NULL)) != 0)
		return rc;
	e = filetier_ent(ft, id);
	if (cap < FILETIER_READ_SIZE(e->len))
		return -EMSGSIZE;
	if ((ns = filetier_ns_find(ft, k->fingerprint)) == NULL)
		return -ENOENT;
	if ((job = calloc(1, sizeof(*job))) == NULL)
		return -ENOMEM;
	if ((rc = filetier_ns_hold(ft, ns)) != 0) {
		free(job);
		return rc;
	}
	/* The read's own pin: eviction cannot unlink a file while it is read. */
	if ((rc = filetier_pin(ft, id)) != 0) {
		filetier_ns_put(ft, ns);
		free(job);
		return rc;
	}
	job->kind = FILETIER_JOB_READ;
	job->key = *k;
	job->buf = dst;
	job->len = e->len;
	job->status = -EINPROGRESS;
	atomic_init(&job->cancel, 0);
	job->done = done;
	job->arg = arg;
	job->ns = ns;
	job->id = id;
	ft->st.reads_inflight++;
	filetier_enqueue(ft, job);
	if (jobp != NULL)
		*jobp = job;
	return 0;
}

void
filetier_stats(const struct filetier *ft, struct filetier_stats *st)
{
	uint64_t	meta;
	unsigned	i;

	*st = ft->st;
	st->namespaces = ft->nns;
	st->namespaces_open = 0;
	for (i = 0; i < ft->nns; i++)
		st->namespaces_open += ft->ns[i]->dirfd >= 0;
	st->scanning = ft->nscanning;
	st->bytes_capacity = ft->p.capacity;
	st->bytes_capacity_effective = ft->cap_eff;
	st->dirs_recreated = atomic_load(&ft->dirs_recreated);
	st->index_buckets = ft->ix.nbuckets;
	st->readers_uring = 0;
	for (i = 0; i < ft->p.readers; i++)
		st->readers_uring += ft->readers[i].uring != 0;
	/* Everything allocated for the index, capacity rather than use. */
	meta = sizeof(*ft);
	meta += index_meta_bytes(&ft->ix);
	meta += (uint64_t)ft->ns_cap * sizeof(struct filetier_ns *) +
	    (uint64_t)ft->nns * sizeof(struct filetier_ns);
	st->meta_bytes = meta;
	st->meta_bytes_per_object = st->visible ? (double)meta / (double)st->visible : 0;
}

/* Visible unpinned entries, next victim first, up to max; for tests and debugging. */
size_t
filetier_lru_order(const struct filetier *ft, uint32_t *ids, size_t max)
{
	return index_lru_order(&ft->ix, &ft->lru, ids, max);
}

/* Jobs whose completion has not run yet: a drain waits for 0. */
unsigned
filetier_inflight(const struct filetier *ft)
{
	return (unsigned)(ft->st.reads_inflight + ft->st.writes_inflight + ft->st.deleting);
}
