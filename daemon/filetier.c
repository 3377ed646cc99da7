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
 * report through one workq (workq.c) to the loop, as copy.c does:
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
 * by scan_threads threads, off the loop: see filetier_scan.c), which
 * also removes stale temp files and anything in the object directories
 * that is not a valid object.
 *
 * The tier is a family of files sharing filetier.h: this one holds the
 * tier's API and lifecycle, namespaces, the index and eviction, jobs and
 * their completions; filetier_obj.c the on-disk format and path walk,
 * filetier_read.c the readers and open-file cache, filetier_write.c the
 * writers, filetier_scan.c the startup scan.
 */
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "filetier.h"

#define FILETIER_PINS_MAX	UINT16_MAX
#define FILETIER_NOSPACE_TRIES	8		/* a full filesystem: evict and retry, this often */
#define FILETIER_RECHECK_NS	1000000000LL	/* a lowered capacity is rechecked once a second */
#define FILETIER_WARN_NS	10000000000LL	/* a recreated directory is reported every 10 s */
#define FILETIER_BATCH		256		/* completions per loop wakeup */

/* Index: index.c's, loop thread only. */

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

struct filetier_ns *
filetier_ns_find(const struct filetier *ft, const uint8_t fp[16])
{
	unsigned	i;

	for (i = 0; i < ft->nns; i++)
		if (memcmp(ft->ns[i]->fingerprint, fp, 16) == 0)
			return ft->ns[i];
	return NULL;
}

/* Closes an idle namespace's directory: no session, no scan and no job use it. */
void
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

/* A new job, owned by the tier until its completion ran (filetier_job_free); NULL: no memory. */
static struct filetier_job *
filetier_job_new(struct filetier *ft)
{
	struct filetier_qjob	*q;

	if ((q = calloc(1, sizeof(*q))) == NULL)
		return NULL;
	TAILQ_INSERT_TAIL(&ft->jobs, q, all);
	return &q->job;
}

static void
filetier_job_free(struct filetier *ft, struct filetier_job *job)
{
	struct filetier_qjob	*q = (struct filetier_qjob *)job;	/* job is its first member */

	TAILQ_REMOVE(&ft->jobs, q, all);
	free(q);
}

/* Workers hand finished jobs to the loop; the list is left empty. Any thread. */
void
filetier_post(struct filetier *ft, struct filetier_job_list *batch)
{
	struct filetier_job	*job;

	/* Off the list first: once pushed, the loop may link job->entry elsewhere. */
	while ((job = TAILQ_FIRST(batch)) != NULL) {
		TAILQ_REMOVE(batch, job, entry);
		workq_push(ft->wq, &((struct filetier_qjob *)job)->wq);
	}
}

/* An entry of ns became VISIBLE (delta 1) or stopped being (-1): STATS' per-pool counts. */
void
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
	if (!file_gone && ns != NULL && (job = filetier_job_new(ft)) != NULL) {
		if (filetier_ns_hold(ft, ns) != 0) {
			filetier_job_free(ft, job);
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
int
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
	filetier_job_free(ft, job);
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

/* The workq's done(): a finished job's bookkeeping and completion, on the loop thread. */
static void
filetier_done(struct workq_entry *e, void *arg)
{
	struct filetier		*ft = arg;
	struct filetier_job	*job = &((struct filetier_qjob *)
				    ((char *)e - offsetof(struct filetier_qjob, wq)))->job;

	/*
	 * Testing only: a read that succeeded is reported late, as a slow
	 * device would, while failures are reported at once; so a test
	 * can act while good reads are still in flight.
	 */
	if (ft->p.read_delay_ms > 0 && job->kind == FILETIER_JOB_READ && job->status == 0) {
		job->due_ns = filetier_now_ns(CLOCK_MONOTONIC) +
		    (int64_t)ft->p.read_delay_ms * 1000000LL;
		TAILQ_INSERT_TAIL(&ft->delayed, job, entry);
		return;
	}
	filetier_job_complete(ft, job);
}

/* The workq's wake(), after each wakeup's completions. */
static void
filetier_wake(void *arg)
{
	filetier_delay_arm(arg);
}

/* Namespaces: registered, opened, forgotten (filetier_scan_start attaches them). */

/*
 * Opens a namespace's directory, <role>/<model-fingerprint> under the
 * root, one component at a time with no link followed; create makes the
 * missing ones, and removes them again when the directory cannot be
 * opened (no descriptor left), so that no directory is left behind for a
 * namespace the tier could not register.
 */
int
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
	unsigned		 i;

	for (i = 0; i < ft->nns; i++) {
		ns = ft->ns[i];
		if (!ns->attached && ns->jobs == 0 && !ns->scanning && ns->objects == 0)
			break;
	}
	if (i == ft->nns)
		return -EUSERS;
	filetier_ns_idle(ft, ns);
	/* Cache entries name the namespace by its address: none may outlive it. */
	filetier_fdc_forget_ns(ft->fdc, ns);
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
int
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

int
filetier_new(struct event_base *base, const struct filetier_params *p, struct filetier **out,
    char *err, size_t errlen)
{
	struct filetier	*ft;
	char		 wqerr[128];
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
	ft->rootfd = -1;
	index_lru_init(&ft->lru);
	pthread_mutex_init(&ft->lock, NULL);
	pthread_mutex_init(&ft->dir_lock, NULL);
	atomic_init(&ft->dirs_recreated, 0);
	pthread_cond_init(&ft->wcond, NULL);
	TAILQ_INIT(&ft->nospace);
	TAILQ_INIT(&ft->writes);
	TAILQ_INIT(&ft->deletes);
	TAILQ_INIT(&ft->jobs);
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
	if ((rc = workq_new(base, "filetier", FILETIER_BATCH, filetier_done, filetier_wake, ft,
	    &ft->wq, wqerr, sizeof(wqerr))) != 0) {
		snprintf(err, errlen, "file tier: %s", wqerr);
		goto fail;
	}
	ft->readers = calloc(p->readers, sizeof(*ft->readers));
	ft->threads = calloc(p->readers + p->writers, sizeof(*ft->threads));
	if (ft->readers == NULL || ft->threads == NULL)
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
		pthread_setname_np(ft->threads[i], i < p->readers ? "l3kv-fread" : "l3kv-fwrite");
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
	struct filetier_qjob	*q;
	unsigned		 i, j;

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
	/* Queued, delayed, waiting for room or finished: no completion runs now. */
	while ((q = TAILQ_FIRST(&ft->jobs)) != NULL)
		filetier_job_free(ft, &q->job);
	workq_free(ft->wq);	/* its producers were joined */
	ft->wq = NULL;
	if (ft->delay_ev != NULL)
		event_free(ft->delay_ev);
	if (ft->readers != NULL)
		for (i = 0; i < ft->p.readers; i++)
			filetier_reader_fini(&ft->readers[i]);
	free(ft->readers);
	free(ft->threads);
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
	if ((job = filetier_job_new(ft)) == NULL)
		return -ENOMEM;
	/* A tier refusing writes after a full filesystem must still see it free up. */
	filetier_capacity_recheck(ft);
	if ((rc = filetier_make_room(ft, filetier_file_bytes(len))) != 0) {
		filetier_job_free(ft, job);
		return rc;
	}
	if ((rc = filetier_ns_hold(ft, ns)) != 0) {
		filetier_job_free(ft, job);
		return rc;
	}
	if ((rc = index_rec_new(&ft->ix, &id)) != 0) {
		filetier_ns_put(ft, ns);
		filetier_job_free(ft, job);
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
	if ((job = filetier_job_new(ft)) == NULL)
		return -ENOMEM;
	if ((rc = filetier_ns_hold(ft, ns)) != 0) {
		filetier_job_free(ft, job);
		return rc;
	}
	/* The read's own pin: eviction cannot unlink a file while it is read. */
	if ((rc = filetier_pin(ft, id)) != 0) {
		filetier_ns_put(ft, ns);
		filetier_job_free(ft, job);
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
