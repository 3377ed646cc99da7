/*
 * The file tier's readers: threads that each drive an io_uring ring with
 * read_depth objects in flight (an openat into a direct descriptor, then
 * one readv of header and payload, the reads of a batch submitted
 * together), or read with preadv where the ring is missing or refused.
 * A read is checked against its key and its payload checksummed before
 * it reports success; a bad file is unlinked. Finished reads go back to
 * the loop through filetier_post (filetier.c). Small objects' descriptors
 * stay in an open-file cache shared by the readers, described below.
 */
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <sys/uio.h>

#include <linux/openat2.h>

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <liburing.h>
#include <xxhash.h>

#include "filetier.h"

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
	if ((*csum = checksum_obj(job->buf, len)) != want)
		return -EBADMSG;
	return 0;
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

struct filetier_fdc *
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
void
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
void
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

/* The namespace is forgotten: no entry may name it by its address. NULL is fine. */
void
filetier_fdc_forget_ns(struct filetier_fdc *c, const struct filetier_ns *ns)
{
	uint32_t	j;
	int		fd;

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
}

/* Reader threads. */

/* 1 for the statuses that mean the file itself is bad and must go. */
int
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
int
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

void *
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

int
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

void
filetier_reader_fini(struct filetier_reader *r)
{
	if (r->ft == NULL)
		return;		/* never initialised; queued jobs are filetier_free's */
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
