/*
 * The file tier's startup scan of one namespace, off the loop: a scan
 * thread lists the leaf directories and shares them with scan_threads - 1
 * helpers; each reads headers and hands what it found, a leaf directory
 * at a time, to the loop through the scan's workq (workq.c; its eventfd
 * lives as long as the scan). The loop indexes each
 * batch at once (PROBE and ADMIT see the objects found so far, and a
 * key already indexed, written since the start, is never replaced),
 * at the LRU's end: older than anything written since. When every
 * batch is in, the scan thread sorts the scanned entries by write time
 * and the loop relinks them in that order, a bounded step per turn, so
 * that eviction after a restart follows the order the files were
 * written (the last access before the restart is not on disk).
 * filetier_scan_start attaches a namespace and starts its scan.
 */
#include <sys/resource.h>
#include <sys/stat.h>

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

#include "filetier.h"

struct filetier_found {
	struct obj_key	key;
	uint32_t	pad;
	uint64_t	len;
	int64_t		mtime_ns;
};

/* What one scan thread found in a leaf directory, for the loop to index. */
struct filetier_scan_batch {
	struct workq_entry	 wq;		/* scan thread -> loop */
	TAILQ_ENTRY(filetier_scan_batch) entry;	/* the loop's taken list */
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
	/*
	 * Scan threads -> loop: the batches, then found_wq once every batch
	 * is pushed (removed, skipped and err are final then), then
	 * sorted_wq; the loop pushes again_wq to itself to go on next turn.
	 * The queue's eventfd goes with the scan.
	 */
	struct workq		*wq;
	struct workq_entry	 found_wq;
	struct workq_entry	 sorted_wq;
	struct workq_entry	 again_wq;
	/* Under lock: the loop's word to the scan thread. */
	pthread_mutex_t		 lock;
	pthread_cond_t		 cond;
	int			 order_given;	/* the loop lets the scan thread sort order[] */
	uint64_t		 removed;	/* bad objects, stale temp files, junk */
	uint64_t		 skipped;
	int			 err;		/* the scan's first failure */
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
	int			 found_all;	/* found_wq ran: every batch is in taken */
	int			 sorted;	/* sorted_wq ran */
	int			 again;		/* again_wq is queued */
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
	workq_push(sc->wq, &b->wq);
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
		if (i > 0 && pthread_create(&parts[i].thread, NULL, filetier_scan_main, &parts[i]) == 0) {
			pthread_setname_np(parts[i].thread, "l3kv-scan");
			parts[i].started = 1;
		}
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
	pthread_mutex_unlock(&sc->lock);
	workq_push(sc->wq, &sc->found_wq);	/* after every batch: the queue keeps order */

	pthread_mutex_lock(&sc->lock);
	while (!sc->order_given && !atomic_load(&sc->stop))
		pthread_cond_wait(&sc->cond, &sc->lock);
	given = sc->order_given && !atomic_load(&sc->stop);
	pthread_mutex_unlock(&sc->lock);
	if (given && sc->norder > 1)
		qsort(sc->order, sc->norder, sizeof(*sc->order), filetier_scan_order_cmp);
	workq_push(sc->wq, &sc->sorted_wq);
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
void
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

/* The scan's workq done(): what the scan threads sent, noted on the loop thread. */
static void
filetier_scan_done(struct workq_entry *e, void *arg)
{
	struct filetier_scan	*sc = arg;

	if (e == &sc->found_wq)
		sc->found_all = 1;
	else if (e == &sc->sorted_wq)
		sc->sorted = 1;
	else if (e == &sc->again_wq)
		sc->again = 0;
	else
		TAILQ_INSERT_TAIL(&sc->taken, (struct filetier_scan_batch *)e, entry);
}

/* Leaves the rest of the scan's work to the loop's next turn, after its sockets. */
static void
filetier_scan_again(struct filetier_scan *sc)
{
	if (sc->again)
		return;		/* queued already: runs this wake-up's successor */
	sc->again = 1;
	workq_push(sc->wq, &sc->again_wq);
}

/* The scan's workq wake(), the loop's side of a scan: batches in, then the order, then the end. */
static void
filetier_scan_wake(void *arg)
{
	struct filetier_scan		*sc = arg;
	struct filetier			*ft = sc->ft;
	struct filetier_scan_batch	*b;
	size_t				 budget = FILETIER_SCAN_TAKE_STEP;

	while ((b = TAILQ_FIRST(&sc->taken)) != NULL && budget > 0) {
		TAILQ_REMOVE(&sc->taken, b, entry);
		budget -= b->n < budget ? b->n : budget;
		filetier_scan_take(ft, sc, b);
		free(b->found);
		free(b);
	}
	if (!TAILQ_EMPTY(&sc->taken)) {
		filetier_scan_again(sc);
		return;
	}
	if (sc->found_all && !sc->asked) {
		/* Every batch was posted before found_all and is indexed now: order[] is complete. */
		sc->asked = 1;
		pthread_mutex_lock(&sc->lock);
		sc->order_given = 1;
		pthread_cond_signal(&sc->cond);
		pthread_mutex_unlock(&sc->lock);
		return;
	}
	if (!sc->sorted)
		return;
	if (!filetier_scan_relink(ft, sc)) {
		filetier_scan_again(sc);
		return;
	}
	filetier_scan_finish(ft, sc);
}

/* Frees a scan whose thread was joined (or never started). */
static void
filetier_scan_free(struct filetier_scan *sc)
{
	if (sc == NULL)
		return;
	/* Batches still queued join taken (done() only links them), then go with it. */
	workq_flush(sc->wq);
	workq_free(sc->wq);
	sc->wq = NULL;
	filetier_scan_batches_free(&sc->taken);
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
	char			 wqerr[128];
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
	TAILQ_INIT(&sc->taken);
	/* A batch is a leaf; the wake-up bounds the objects indexed per turn. */
	if ((rc = workq_new(ft->base, "filetier scan", 64, filetier_scan_done, filetier_scan_wake,
	    sc, &sc->wq, wqerr, sizeof(wqerr))) != 0)
		goto fail;
	if ((rc = pthread_create(&sc->thread, NULL, filetier_scan_thread, sc)) != 0) {
		rc = -rc;
		goto fail;
	}
	pthread_setname_np(sc->thread, "l3kv-scan");
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

/* Ends every scan: threads stop between files and are joined; nothing more is indexed. */
void
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
