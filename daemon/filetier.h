/*
 * The file tier's private header, shared by its family of files and by
 * nothing else (daemon.h has the tier's API):
 * - filetier.c: the tier itself: its lifecycle and API, the namespaces,
 *   the index of objects and its LRU, eviction and capacity, the jobs
 *   handed to the workers and their completions on the loop;
 * - filetier_obj.c: the on-disk format: keys as paths, the object header,
 *   and the walk of paths by descriptor with no link followed;
 * - filetier_read.c: reader threads (io_uring rings, preadv) and the
 *   open-file cache;
 * - filetier_write.c: writer threads (temp file and rename, unlinks, a
 *   deleted namespace directory made again);
 * - filetier_scan.c: a namespace's startup scan, off the loop.
 * filetier.c's opening comment says how the tier works as a whole.
 */
#ifndef L3KV_FILETIER_H
#define L3KV_FILETIER_H

#include <sys/uio.h>

#include <linux/openat2.h>

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <event2/event.h>
#include <liburing.h>

#include "daemon.h"

#define FILETIER_HDR_USED	104
#define FILETIER_OBJ_PATH	80		/* "pp-ssss/hh/<64 hex>.obj" and its NUL */
#define FILETIER_TMP_PREFIX	".tmp-"

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

/*
 * A job as the tier allocates it: the caller's struct filetier_job first,
 * then the tier's links. wq carries the finished job to the loop (the
 * tier's workq); all lists every job the tier owns, whatever queue it is
 * in, so that filetier_free frees those no completion will run for
 * (workq_free drops its entries). Loop thread only, except wq.
 * (wq belongs in struct filetier_job, daemon.h, with the module's fields.)
 */
struct filetier_qjob {
	struct filetier_job	 job;
	struct workq_entry	 wq;
	TAILQ_ENTRY(filetier_qjob) all;
};
TAILQ_HEAD(filetier_qjob_list, filetier_qjob);

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
	int			 stop;
	struct workq		*wq;		/* workers -> loop: finished jobs */
	struct filetier_qjob_list jobs;		/* every job allocated: loop thread */
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


_Static_assert(FILETIER_OBJ_PATH == 80, "pp-ssss/hh/ + 64 hex + .obj + NUL");
#define FILETIER_OBJ_NAME	11		/* the file's name in its path */

static inline uint64_t
filetier_file_bytes(uint64_t len)
{
	return FILETIER_HDR + len;
}

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

static inline int64_t
filetier_now_ns(clockid_t clk)
{
	struct timespec	ts;

	clock_gettime(clk, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* filetier.c */
struct filetier_ns *filetier_ns_find(const struct filetier *, const uint8_t fp[16]);
int	 filetier_ns_open(struct filetier *, struct filetier_ns *, int create, int check,
	    char *err, size_t errlen);
void	 filetier_ns_idle(struct filetier *, struct filetier_ns *);
int	 filetier_ns_add(struct filetier *, const char *name, const uint8_t fp[16],
	    struct filetier_ns **, char *err, size_t errlen);
void	 filetier_ns_visible(struct filetier_ns *, const struct obj_key *, int delta);
int	 filetier_make_room(struct filetier *, uint64_t need);
void	 filetier_post(struct filetier *, struct filetier_job_list *);

/* filetier_obj.c: pure functions, called by every thread */
extern _Atomic int filetier_has_openat2;
int	 filetier_unhex_digit(char);
int	 filetier_unhex(uint8_t *out, const char *in, size_t n);
void	 filetier_obj_path(const struct obj_key *, char *buf);
int	 filetier_dir_errno(int dirfd, const char *name, int err);
int	 filetier_open_beneath(int dirfd, const char *path, int flags, mode_t mode);
int	 filetier_leaf_open(int nsfd, const struct obj_key *, int create, int *made, int *poolfd);
int	 filetier_unlink_obj(int nsfd, const struct obj_key *);
void	 filetier_hdr_build(uint8_t *h, const struct obj_key *, uint64_t len, uint64_t csum);
int	 filetier_hdr_check(const uint8_t *h, const struct obj_key *, uint64_t *len,
	    uint64_t *csum);
int	 filetier_ns_name_check(const char *name, const uint8_t fp[16], char *err, size_t errlen);
int	 filetier_mkdir_p(int dirfd, const char *path, char *err, size_t errlen);
void	 filetier_dir_check(int fd, const char *root, const char *rel);
int	 filetier_dir_open(int dirfd, const char *name, int create, int *made);

/* filetier_read.c */
struct filetier_fdc;
struct filetier_fdc *filetier_fdc_new(uint32_t cap, uint64_t seed);
void	 filetier_fdc_free(struct filetier_fdc *);
void	 filetier_fdc_forget(struct filetier_fdc *, const struct filetier_ns *,
	    const struct obj_key *);
void	 filetier_fdc_forget_ns(struct filetier_fdc *, const struct filetier_ns *);
int	 filetier_unlink_bad(int status);
int	 filetier_status_lost(int status);
int	 filetier_reader_init(struct filetier_reader *, struct filetier *);
void	 filetier_reader_fini(struct filetier_reader *);
void	*filetier_reader_main(void *);

/* filetier_write.c */
void	*filetier_writer_main(void *);

/* filetier_scan.c */
void	 filetier_scan_note_gone(struct filetier *, const struct obj_key *);
void	 filetier_scans_stop(struct filetier *);

#endif /* L3KV_FILETIER_H */
