/*
 * The copy-engine front and the host copy engine.
 *
 * The front: copy_submit() and copy_cancel() pick the engine by the job's
 * region (GPU memory: cuda.c; a memfd: the host engine here), so restore.c
 * and publish.c never choose.
 *
 * The host engine: worker threads that move page bytes between the DRAM
 * tier and engine memory registered as memfds, verifying checksums on the
 * way. It is the production path for host-memory engines (SGLang's
 * shm-allocated L2 pool) and what every CI test drives.
 *
 * Ownership: the loop thread builds a job, pins everything it touches
 * (objects, the session whose regions it writes) and submits it; from
 * then on the job belongs to the workers until its completion runs back
 * on the loop thread (through a workq), which alone unpins. Workers never
 * touch daemon state: they read and write bytes and fill the job's result
 * fields.
 *
 * Pieces: a job of more than COPY_PIECE_MIN bytes is split into runs of
 * whole pages (up to COPY_PIECES_PER_WORKER per worker, for balance) that
 * the workers take from the job at the head of the queue, so one RESTORE
 * or PUBLISH runs on every worker at once. A run that stops (a cancel, a
 * corrupt object, a fault) lowers the job's stop_page to where it stopped;
 * pages below it have all landed, so done_pages is the whole, verified,
 * contiguous prefix that a cancel or a deadline reports. A run that fails
 * raises `failed` and the others stop at their next page; the worker that
 * ends the job's last run completes it. Cancellation is a flag read
 * between pages, so a cancel is acknowledged only when the completion
 * ran, i.e. when no copy can still land. A restore verifies a page of up
 * to COPY_VERIFY_FIRST bytes whole before writing it (a corrupt page
 * never lands), a larger one chunk by chunk as it copies it (one pass over
 * DRAM; the restore still fails `lost`, never succeeds unverified); with
 * several runs, pages of other runs may have landed. A restore's writes
 * trail its digests by one page (past COPY_VERIFY_FIRST, one chunk) and
 * are streaming stores: see copy_restore_page. A publish checksums each
 * 64 KiB chunk right after copying it, while it is in cache. A digest job
 * (the peer tier's landed pulls, peer.c) only checksums objects in the
 * arena, so that the loop never hashes pulled bytes itself.
 *
 * The fault guard: a memfd that cannot be sealed against shrinking (an
 * engine that created it without MFD_ALLOW_SEALING, as SGLang's shm
 * allocator does) can be truncated under a copy, and a mapped page past
 * the file's end raises SIGBUS. Every run checks the sizes of its
 * unsealed regions (fstat) before it starts, and runs its copies under a
 * per-thread sigjmp_buf: the SIGBUS handler, installed once, jumps back
 * into the run when the faulting thread is inside a guarded copy (the run
 * fails its job with PROTO_S_BAD_REGION), and otherwise restores the
 * default action so that the fault kills the process as it would have.
 * The loop thread never touches engine memory: only these runs do.
 */
#include <sys/stat.h>

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"

/*
 * Below this many bytes a job is one run: a worker's wake-up (tens of us
 * on a loaded host) costs more than it saves, and small jobs keep their
 * page order (tests/check_cache.c's corrupt-object case relies on it).
 */
#define COPY_PIECE_MIN		(1ULL << 20)
#define COPY_PIECES_PER_WORKER	4
#define COPY_BATCH		64	/* completions per loop wakeup */
#define COPY_SUM_CHUNKS		128	/* digests on the stack: pages to 8 MiB */
/*
 * Restored pages up to this size are verified whole before any byte is
 * written (two passes over a page that stays in L2); larger ones in one
 * pass, each 64 KiB chunk hashed and then copied while in cache, so that
 * a corrupt one may have partly landed when its restore fails `lost`.
 */
#define COPY_VERIFY_FIRST	(256U << 10)

struct copy_engine {
	pthread_mutex_t		 lock;		/* guards todo, stop */
	pthread_cond_t		 cond;
	struct copy_job_list	 todo;		/* jobs with runs not taken yet */
	int			 stop;
	struct workq		*wq;		/* workers -> loop */
	pthread_t		*threads;
	int			 nthreads;
	unsigned		 inflight;	/* loop thread's count */
	unsigned		 delay_ms;	/* testing.copy_delay_ms */
};

/* The guarded copy this thread is in, or NULL (read by the SIGBUS handler). */
static __thread sigjmp_buf *volatile copy_guard;
static pthread_once_t	copy_once = PTHREAD_ONCE_INIT;

/*
 * The chunk digest, alone and as the restore's pipeline step (the digest
 * of one chunk with an earlier range written between its slices):
 * checksum.c's and a digest-then-memcpy here, or copy_csum.c's XXH3-64
 * built for AVX2 where the CPU has it. The values are the same.
 */
static uint64_t	copy_digest_write_plain(const void *, size_t, const uint8_t *, uint8_t *,
		    size_t);
static void	copy_store_plain(uint8_t *, const uint8_t *, size_t);
static uint64_t	(*copy_digest)(const void *, size_t) = checksum_chunk;
static uint64_t	(*copy_digest_write)(const void *, size_t, const uint8_t *, uint8_t *,
		    size_t) = copy_digest_write_plain;
static void	(*copy_store)(uint8_t *, const uint8_t *, size_t) = copy_store_plain;

static void
copy_sigbus(int sig, siginfo_t *si, void *uc)
{
	sigjmp_buf		*jb = copy_guard;
	struct sigaction	 sa;

	(void)uc;
	if (jb != NULL && si->si_code == BUS_ADRERR) {
		copy_guard = NULL;
		siglongjmp(*jb, 1);
	}
	/* Not ours: the default action, as if no handler had been installed. */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	sigemptyset(&sa.sa_mask);
	sigaction(sig, &sa, NULL);
	if (si->si_code <= 0)
		raise(sig);	/* sent, not a fault: returning would not repeat it */
}

/* Once per process: the SIGBUS handler, the digest this CPU runs fastest. */
static void
copy_init(void)
{
	struct sigaction	sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = copy_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, NULL) != 0)
		fatalx("copy", "sigaction(SIGBUS): %s", strerror(errno));
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2")) {
		copy_digest = copy_csum_avx2;
		copy_digest_write = copy_csum_avx2_write;
		copy_store = copy_csum_avx2_store;
	}
#endif
}

static void
copy_sleep_ms(unsigned ms)
{
	struct timespec	ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/*
 * Moves one page between the object format (page_first: tokens x layers x
 * bytes) and a region's geometry. Runs of the region that are contiguous
 * in both are copied with one memcpy, so a page_first region costs one
 * copy per page.
 */
void
copy_page_scatter(const struct proto_region *g, uint8_t *base, uint32_t page, uint8_t *obj,
    int to_region)
{
	uint64_t	tl = (uint64_t)g->layers * g->token_bytes;
	uint8_t		*p = base + (uint64_t)page * g->page_stride;
	uint32_t	t, l;

	if (g->layout == PROTO_LAYOUT_SLOTS ||
	    (g->layer_stride == g->token_bytes && g->token_stride == tl)) {
		uint64_t n = g->layout == PROTO_LAYOUT_SLOTS ? g->token_bytes : tl * g->page_tokens;

		if (to_region)
			memcpy(p, obj, n);
		else
			memcpy(obj, p, n);
		return;
	}
	for (t = 0; t < g->page_tokens; t++) {
		for (l = 0; l < g->layers; l++) {
			uint8_t *r = p + (uint64_t)l * g->layer_stride + (uint64_t)t * g->token_stride;
			uint8_t *o = obj + ((uint64_t)t * g->layers + l) * g->token_bytes;

			if (to_region)
				memcpy(r, o, g->token_bytes);
			else
				memcpy(o, r, g->token_bytes);
		}
	}
}

/*
 * The object checksum of obj's len bytes: checksum_obj()'s value, from
 * checksum.c's two steps (checksum_chunk, here the fastest digest this
 * CPU has, then checksum_combine). With src, each chunk is first copied
 * from src into obj and hashed right after, while it is in cache: a
 * publish is one pass over the bytes. With dst, each chunk of obj is
 * hashed and then copied to dst from cache: a large restore is one pass
 * (the hash is always of obj, the tier's bytes, never of engine memory).
 */
static uint64_t
copy_sum2(uint8_t *obj, const uint8_t *src, uint8_t *dst, uint64_t len)
{
	uint64_t	dig[COPY_SUM_CHUNKS + 1], h;
	size_t		nchunks = checksum_chunks(len), i, n;

	if (nchunks > COPY_SUM_CHUNKS) {
		/* Larger than any page: the tier's own function (the same value). */
		if (src != NULL)
			memcpy(obj, src, len);
		h = checksum_obj(obj, len);
		if (dst != NULL)
			memcpy(dst, obj, len);
		return h;
	}
	for (i = 0; i < nchunks; i++) {
		n = checksum_chunk_len(len, i);
		if (src != NULL)
			memcpy(obj + i * CHECKSUM_CHUNK, src + i * CHECKSUM_CHUNK, n);
		dig[i] = copy_digest(obj + i * CHECKSUM_CHUNK, n);
		if (dst != NULL)
			memcpy(dst + i * CHECKSUM_CHUNK, obj + i * CHECKSUM_CHUNK, n);
	}
	return checksum_combine(dig, nchunks, len);
}

static uint64_t
copy_sum(uint8_t *obj, const uint8_t *src, uint64_t len)
{
	return copy_sum2(obj, src, NULL, len);
}

/* Copies a contiguous page out of engine memory into its object; its checksum. */
uint64_t
copy_page_publish(uint8_t *obj, const uint8_t *src, uint64_t len)
{
	return copy_sum(obj, src, len);
}

/* Whether a region's page is one run of bytes in both layouts. */
static int
copy_contiguous(const struct proto_region *g)
{
	return g->layout == PROTO_LAYOUT_SLOTS ||
	    (g->layer_stride == g->token_bytes &&
	    g->token_stride == (uint64_t)g->layers * g->token_bytes);
}

static void
copy_store_plain(uint8_t *dst, const uint8_t *src, size_t n)
{
	memcpy(dst, src, n);
}

static uint64_t
copy_digest_write_plain(const void *p, size_t n, const uint8_t *wsrc, uint8_t *wdst, size_t wlen)
{
	if (wlen > 0)
		memcpy(wdst, wsrc, wlen);
	return checksum_chunk(p, n);
}

/*
 * The restore pipeline of one run. A restore is a read of the tier's
 * bytes (the digest) and a write of engine memory (the copy); done one
 * after the other with memcpy, 1 to 4 workers ran at 0.64-0.83x a memmove
 * by as many threads on the 16-core host. Here the write of what was
 * already verified is spread over the digest of what comes next
 * (copy_digest_write) and made with streaming stores where the CPU has
 * AVX2: no read-for-ownership of the engine's lines, which this core never
 * reads again (tests/bench/RESULTS.md: 0.88-1.54x; the same pipeline with
 * memcpy writes measured no better than before, so the stores are what
 * counts). So:
 *
 * - a page of up to COPY_VERIFY_FIRST bytes is hashed whole, compared,
 *   and only then becomes the pending write, which lands while the next
 *   page is hashed (a corrupt page never lands, as before);
 * - a larger page's chunk becomes the pending write as soon as it is
 *   hashed and lands while the next chunk is hashed (one pass over DRAM;
 *   a corrupt page may have partly landed and fails `lost`, as before).
 *
 * The bytes written are always the tier's, copied after they were hashed
 * and while they are still in cache. `lo` is the first page that may not
 * have landed (the pending write's, or the next one): a fault in engine
 * memory stops the run there.
 */
struct copy_pend {
	const uint8_t	*src;
	uint8_t		*dst;
	uint64_t	 len;
	uint64_t	 done;
};

/* Writes what is left of the pending range; `lo` moves past its page. */
static void
copy_pend_flush(struct copy_pend *pd, volatile uint32_t *lo, uint32_t next)
{
	if (pd->done < pd->len)
		copy_store(pd->dst + pd->done, pd->src + pd->done, pd->len - pd->done);
	pd->done = pd->len = 0;
	*lo = next;
}

/*
 * Restores page i (contiguous in its region, at dst) through the
 * pipeline: 0 when its checksum matched (it is now the pending write, or
 * part of it is), -1 when not (the earlier pages have all landed).
 */
static int
copy_restore_page(const struct copy_page *pg, uint8_t *dst, uint32_t i, struct copy_pend *pd,
    volatile uint32_t *lo)
{
	uint64_t	dig[COPY_SUM_CHUNKS + 1], share, left;
	size_t		nchunks = checksum_chunks(pg->len), c, n;
	int		whole = pg->len <= COPY_VERIFY_FIRST;

	if (nchunks > COPY_SUM_CHUNKS) {
		/* Larger than any page: verify whole, then write (the tier's function). */
		copy_pend_flush(pd, lo, i);
		if (checksum_obj(pg->obj, pg->len) != pg->checksum)
			return -1;
		memcpy(dst, pg->obj, pg->len);
		*lo = i + 1;
		return 0;
	}
	for (c = 0; c < nchunks; c++) {
		n = checksum_chunk_len(pg->len, c);
		left = pd->len - pd->done;
		/* A whole page's pending write is spread over its chunks; a chunk's, over the next. */
		share = left;
		if (whole && c + 1 < nchunks)
			share = (left / (nchunks - c) + 63) & ~(uint64_t)63;
		if (share > left)
			share = left;
		if (share == 0)
			dig[c] = copy_digest(pg->obj + c * CHECKSUM_CHUNK, n);
		else
			dig[c] = copy_digest_write(pg->obj + c * CHECKSUM_CHUNK, n,
			    pd->src + pd->done, pd->dst + pd->done, (size_t)share);
		pd->done += share;
		if (pd->done == pd->len)
			*lo = i;
		if (!whole) {
			pd->src = pg->obj + c * CHECKSUM_CHUNK;
			pd->dst = dst + c * CHECKSUM_CHUNK;
			pd->len = n;
			pd->done = 0;
		}
	}
	if (checksum_combine(dig, nchunks, pg->len) != pg->checksum) {
		/* The rest of a corrupt page is not written. */
		pd->len = pd->done = 0;
		*lo = i;
		return -1;
	}
	if (whole) {
		pd->src = pg->obj;
		pd->dst = dst;
		pd->len = pg->len;
		pd->done = 0;
	}
	return 0;
}

/* A run failed: the first failure names the job's status; the other runs stop. */
static void
copy_fail(struct copy_engine *ce, struct copy_job *job, int status, uint32_t page,
    const char *why)
{
	pthread_mutex_lock(&ce->lock);
	if (!atomic_load(&job->failed)) {
		job->status = status;
		job->bad_page = page;
		snprintf(job->why, sizeof(job->why), "%s", why != NULL ? why : "");
		atomic_store_explicit(&job->failed, 1, memory_order_release);
	}
	pthread_mutex_unlock(&ce->lock);
}

/* Lowers the job's stop page to `page` (an atomic minimum). */
static void
copy_stop_at(struct copy_job *job, uint32_t page)
{
	uint32_t	cur = atomic_load(&job->stop_page);

	while (page < cur && !atomic_compare_exchange_weak(&job->stop_page, &cur, page))
		;
}

/*
 * Checks, before a run touches them, that the unsealed regions of its
 * pages are still as large as they were registered. 0, or -ERANGE with
 * why filled.
 */
static int
copy_check_regions(const struct copy_job *job, uint32_t first, uint32_t last, char *why,
    size_t len)
{
	const struct region	*prev = NULL, *rg;
	uint32_t		 i;

	for (i = first; i < last; i++) {
		rg = job->pages[i].region != NULL ? job->pages[i].region : job->region;
		if (rg == NULL || rg == prev)
			continue;
		prev = rg;
		if (region_check_size(rg, why, len) != 0)
			return -ERANGE;
	}
	return 0;
}

/* Runs pages [first, last) of a job, under the fault guard. */
static void
copy_run(struct copy_engine *ce, struct copy_job *job, uint32_t first, uint32_t last)
{
	sigjmp_buf		 jb;
	volatile uint32_t	 i = first, lo = first;
	struct copy_pend	 pd = { NULL, NULL, 0, 0 };
	struct copy_page	*pg;
	const struct proto_region *g;
	uint8_t			*base;
	char			 why[160];
	int			 pipe = job->kind == COPY_RESTORE && ce->delay_ms == 0;

	if (copy_check_regions(job, first, last, why, sizeof(why)) != 0) {
		copy_fail(ce, job, PROTO_S_BAD_REGION, first, why);
		copy_stop_at(job, first);
		return;
	}
	if (sigsetjmp(jb, 1) != 0) {
		/* SIGBUS writing page lo: the engine shrank its memfd under the copy. */
		snprintf(why, sizeof(why), "the engine's memory faulted (its memfd shrank?) at "
		    "page %u of the copy", lo);
		copy_fail(ce, job, PROTO_S_BAD_REGION, lo, why);
		copy_stop_at(job, lo);
		return;
	}
	copy_guard = &jb;
	for (; i < last; i++) {
		if (atomic_load_explicit(&job->cancel, memory_order_acquire) ||
		    atomic_load_explicit(&job->failed, memory_order_acquire))
			break;
		pg = &job->pages[i];
		if (job->kind == COPY_DIGEST) {
			/* The peer tier's landed pulls: no region, no pacing. */
			pg->checksum = copy_sum(pg->obj, NULL, pg->len);
			lo = i + 1;
			continue;
		}
		if (ce->delay_ms > 0)
			copy_sleep_ms(ce->delay_ms);
		g = pg->geom != NULL ? pg->geom : job->geom;
		base = pg->base != NULL ? pg->base : job->base;
		if (pipe && copy_contiguous(g)) {
			/* Verified, then written while the next page or chunk is hashed. */
			if (copy_restore_page(pg, base + (uint64_t)pg->region_page * g->page_stride,
			    i, &pd, &lo) != 0) {
				copy_fail(ce, job, PROTO_S_LOST, i, NULL);
				break;
			}
			continue;
		}
		copy_pend_flush(&pd, &lo, i);
		if (job->kind == COPY_RESTORE && pg->len > COPY_VERIFY_FIRST && copy_contiguous(g)) {
			/* One pass: each chunk verified as it is copied; the page fails whole. */
			if (copy_sum2(pg->obj, NULL, base + (uint64_t)pg->region_page * g->page_stride,
			    pg->len) != pg->checksum) {
				copy_fail(ce, job, PROTO_S_LOST, i, NULL);
				break;
			}
		} else if (job->kind == COPY_RESTORE) {
			/* Verify before writing: a corrupt page never lands. */
			if (copy_sum(pg->obj, NULL, pg->len) != pg->checksum) {
				copy_fail(ce, job, PROTO_S_LOST, i, NULL);
				break;
			}
			copy_page_scatter(g, base, pg->region_page, pg->obj, 1);
		} else if (copy_contiguous(g)) {
			pg->checksum = copy_page_publish(pg->obj,
			    base + (uint64_t)pg->region_page * g->page_stride, pg->len);
		} else {
			copy_page_scatter(g, base, pg->region_page, pg->obj, 0);
			pg->checksum = copy_sum(pg->obj, NULL, pg->len);
		}
		lo = i + 1;
	}
	/* What was verified before the run stopped lands: pages below i are whole. */
	copy_pend_flush(&pd, &lo, i);
	copy_guard = NULL;
	if (i < last)
		copy_stop_at(job, i);
}

/* The last run ended: the job's results, then its completion on the loop. */
static void
copy_finish(struct copy_engine *ce, struct copy_job *job)
{
	uint32_t	stop = atomic_load(&job->stop_page);

	atomic_store_explicit(&job->done_pages, stop, memory_order_release);
	if (!atomic_load(&job->failed))
		job->status = stop < job->npages ? PROTO_S_CANCELLED : PROTO_S_OK;
	workq_push(ce->wq, &job->wq);
}

static void *
copy_worker(void *arg)
{
	struct copy_engine	*ce = arg;
	struct copy_job		*job;
	uint32_t		 k, first, last;

	for (;;) {
		pthread_mutex_lock(&ce->lock);
		while (!ce->stop && TAILQ_EMPTY(&ce->todo))
			pthread_cond_wait(&ce->cond, &ce->lock);
		if (ce->stop && TAILQ_EMPTY(&ce->todo)) {
			pthread_mutex_unlock(&ce->lock);
			return NULL;
		}
		job = TAILQ_FIRST(&ce->todo);
		k = job->next_piece++;
		if (job->next_piece == job->npieces)
			TAILQ_REMOVE(&ce->todo, job, entry);
		pthread_mutex_unlock(&ce->lock);

		first = k * job->piece_pages;
		last = first + job->piece_pages;
		if (last > job->npages || k + 1 == job->npieces)
			last = job->npages;
		copy_run(ce, job, first, last);
		if (atomic_fetch_sub(&job->pieces_left, 1) == 1)
			copy_finish(ce, job);
	}
}

/* Runs a finished job's completion on the loop thread. */
static void
copy_done(struct workq_entry *e, void *arg)
{
	struct copy_engine	*ce = arg;
	struct copy_job		*job = WORKQ_ITEM(e, struct copy_job, wq);

	ce->inflight--;
	job->done(job);
}

int
copy_engine_new(struct event_base *base, int nthreads, unsigned delay_ms,
    struct copy_engine **out, char *err, size_t errlen)
{
	struct copy_engine	*ce;
	int			 i, rc;

	if ((ce = calloc(1, sizeof(*ce))) == NULL)
		return -ENOMEM;
	pthread_mutex_init(&ce->lock, NULL);
	pthread_cond_init(&ce->cond, NULL);
	TAILQ_INIT(&ce->todo);
	ce->delay_ms = delay_ms;
	pthread_once(&copy_once, copy_init);
	if ((rc = workq_new(base, "copy", COPY_BATCH, copy_done, NULL, ce, &ce->wq, err,
	    errlen)) != 0) {
		copy_engine_free(ce);
		return rc;
	}
	ce->threads = calloc((size_t)nthreads, sizeof(*ce->threads));
	if (ce->threads == NULL) {
		snprintf(err, errlen, "out of memory for the copy engine");
		copy_engine_free(ce);
		return -ENOMEM;
	}
	for (i = 0; i < nthreads; i++) {
		if ((rc = pthread_create(&ce->threads[i], NULL, copy_worker, ce)) != 0) {
			snprintf(err, errlen, "pthread_create: %s", strerror(rc));
			copy_engine_free(ce);
			return -rc;
		}
		pthread_setname_np(ce->threads[i], "l3kv-copy");
		ce->nthreads++;
	}
	*out = ce;
	return 0;
}

/*
 * Stops the workers after the queued jobs ran; completions not yet run
 * are dropped (the loop is gone). Idempotent on NULL.
 */
void
copy_engine_free(struct copy_engine *ce)
{
	int	i;

	if (ce == NULL)
		return;
	pthread_mutex_lock(&ce->lock);
	ce->stop = 1;
	pthread_cond_broadcast(&ce->cond);
	pthread_mutex_unlock(&ce->lock);
	for (i = 0; i < ce->nthreads; i++)
		pthread_join(ce->threads[i], NULL);
	free(ce->threads);
	workq_free(ce->wq);
	pthread_cond_destroy(&ce->cond);
	pthread_mutex_destroy(&ce->lock);
	free(ce);
}

/* Hands a job to the host engine's workers; its done() runs later on the loop thread. */
void
copy_host_submit(struct copy_engine *ce, struct copy_job *job)
{
	uint64_t	bytes = 0;
	uint32_t	i, n;

	for (i = 0; i < job->npages; i++)
		bytes += job->pages[i].len;
	n = (uint32_t)(bytes / COPY_PIECE_MIN);
	if (n > (uint32_t)ce->nthreads * COPY_PIECES_PER_WORKER)
		n = (uint32_t)ce->nthreads * COPY_PIECES_PER_WORKER;
	if (n > job->npages)
		n = job->npages;
	/* testing.copy_delay_ms paces pages one after another, as tests expect. */
	if (n == 0 || ce->delay_ms > 0)
		n = 1;
	job->piece_pages = (job->npages + n - 1) / n;
	job->npieces = job->npages == 0 ? 1 : (job->npages + job->piece_pages - 1) / job->piece_pages;
	job->next_piece = 0;
	atomic_store(&job->pieces_left, job->npieces);
	atomic_store(&job->stop_page, job->npages);
	atomic_store(&job->failed, 0);
	atomic_store(&job->done_pages, 0);
	job->status = PROTO_S_INTERNAL;
	job->why[0] = '\0';
	ce->inflight++;
	pthread_mutex_lock(&ce->lock);
	TAILQ_INSERT_TAIL(&ce->todo, job, entry);
	if (job->npieces > 1)
		pthread_cond_broadcast(&ce->cond);
	else
		pthread_cond_signal(&ce->cond);
	pthread_mutex_unlock(&ce->lock);
}

/*
 * The front: hands a job to the engine its region is in (GPU memory: the
 * cuda engine, which ATTACH made exist; a memfd: the host engine). Its
 * done() runs later on the loop thread.
 */
void
copy_submit(struct server *s, struct copy_job *job)
{
	if (job->region != NULL && job->region->kreg != NULL)
		cuda_submit(s->cuda, job);
	else
		copy_host_submit(s->copy, job);
}

/*
 * Asks a job to stop at its next page (host) or chunk (GPU); its done()
 * still runs, once nothing of it can land.
 */
void
copy_cancel(struct copy_job *job)
{
	atomic_store_explicit(&job->cancel, 1, memory_order_release);
	if (job->cuda != NULL)
		cuda_cancel(job);
}

unsigned
copy_inflight(const struct copy_engine *ce)
{
	return ce->inflight;
}
