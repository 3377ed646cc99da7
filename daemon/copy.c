/*
 * The host copy engine: worker threads that move page bytes between the
 * DRAM tier and engine memory registered as memfds, verifying checksums
 * on the way. It is the production path for host-memory engines (SGLang's
 * shm-allocated L2 pool) and what every CI test drives.
 *
 * Ownership: the loop thread builds a job, pins everything it touches
 * (objects, the session whose regions it writes) and submits it; from
 * then on the job belongs to the workers until its completion runs back
 * on the loop thread, which alone unpins. Workers never touch daemon
 * state: they read and write bytes, fill the job's result fields, and
 * report through an eventfd watched by the loop. Cancellation is a flag
 * the worker reads between pages, so a cancel is acknowledged only when
 * the completion ran, i.e. when no copy can still land.
 */
#include <sys/eventfd.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"

struct copy_engine {
	pthread_mutex_t		 lock;		/* guards both queues and stop */
	pthread_cond_t		 cond;
	struct copy_job_list	 todo;
	struct copy_job_list	 done;
	int			 stop;
	int			 efd;		/* workers -> loop */
	struct event		*ev;
	pthread_t		*threads;
	int			 nthreads;
	unsigned		 inflight;	/* loop thread's count */
	unsigned		 delay_ms;	/* testing.copy_delay_ms */
};

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

static void
copy_run(struct copy_engine *ce, struct copy_job *job)
{
	struct copy_page	*pg;
	uint32_t		 i;

	for (i = 0; i < job->npages; i++) {
		if (atomic_load_explicit(&job->cancel, memory_order_acquire)) {
			job->status = PROTO_S_CANCELLED;
			return;
		}
		if (ce->delay_ms > 0)
			copy_sleep_ms(ce->delay_ms);
		pg = &job->pages[i];
		if (job->kind == COPY_RESTORE) {
			/* Verify before writing: a corrupt page never lands. */
			if (checksum_obj(pg->obj, pg->len) != pg->checksum) {
				job->status = PROTO_S_LOST;
				job->bad_page = i;
				return;
			}
			copy_page_scatter(pg->geom != NULL ? pg->geom : job->geom,
			    pg->base != NULL ? pg->base : job->base, pg->region_page, pg->obj, 1);
		} else {
			copy_page_scatter(pg->geom != NULL ? pg->geom : job->geom,
			    pg->base != NULL ? pg->base : job->base, pg->region_page, pg->obj, 0);
			pg->checksum = checksum_obj(pg->obj, pg->len);
		}
		atomic_store_explicit(&job->done_pages, i + 1, memory_order_release);
	}
	job->status = PROTO_S_OK;
}

static void *
copy_worker(void *arg)
{
	struct copy_engine	*ce = arg;
	struct copy_job		*job;
	uint64_t		 one = 1;

	for (;;) {
		pthread_mutex_lock(&ce->lock);
		while (!ce->stop && TAILQ_EMPTY(&ce->todo))
			pthread_cond_wait(&ce->cond, &ce->lock);
		if (ce->stop && TAILQ_EMPTY(&ce->todo)) {
			pthread_mutex_unlock(&ce->lock);
			return NULL;
		}
		job = TAILQ_FIRST(&ce->todo);
		TAILQ_REMOVE(&ce->todo, job, entry);
		pthread_mutex_unlock(&ce->lock);

		copy_run(ce, job);

		pthread_mutex_lock(&ce->lock);
		TAILQ_INSERT_TAIL(&ce->done, job, entry);
		pthread_mutex_unlock(&ce->lock);
		if (write(ce->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			abort();	/* an eventfd write cannot fail otherwise */
	}
}

/* Runs finished jobs' completions on the loop thread. */
static void
copy_done_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct copy_engine	*ce = arg;
	struct copy_job_list	 done;
	struct copy_job		*job;
	uint64_t		 n;

	(void)ev;
	if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		log_warn("copy", "eventfd read: %s", strerror(errno));
	TAILQ_INIT(&done);
	pthread_mutex_lock(&ce->lock);
	TAILQ_CONCAT(&done, &ce->done, entry);
	pthread_mutex_unlock(&ce->lock);
	while ((job = TAILQ_FIRST(&done)) != NULL) {
		TAILQ_REMOVE(&done, job, entry);
		ce->inflight--;
		job->done(job);
	}
}

int
copy_engine_new(struct event_base *base, int nthreads, unsigned delay_ms,
    struct copy_engine **out, char *err, size_t errlen)
{
	struct copy_engine	*ce;
	int			 i, rc;

	if ((ce = calloc(1, sizeof(*ce))) == NULL)
		return -ENOMEM;
	ce->efd = -1;
	pthread_mutex_init(&ce->lock, NULL);
	pthread_cond_init(&ce->cond, NULL);
	TAILQ_INIT(&ce->todo);
	TAILQ_INIT(&ce->done);
	ce->delay_ms = delay_ms;
	ce->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ce->efd < 0) {
		rc = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(-rc));
		copy_engine_free(ce);
		return rc;
	}
	ce->ev = event_new(base, ce->efd, EV_READ | EV_PERSIST, copy_done_cb, ce);
	ce->threads = calloc((size_t)nthreads, sizeof(*ce->threads));
	if (ce->ev == NULL || ce->threads == NULL || event_add(ce->ev, NULL) != 0) {
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
	if (ce->ev != NULL)
		event_free(ce->ev);
	if (ce->efd >= 0)
		close(ce->efd);
	pthread_cond_destroy(&ce->cond);
	pthread_mutex_destroy(&ce->lock);
	free(ce);
}

/* Hands a job to the workers; its done() runs later on the loop thread. */
void
copy_submit(struct copy_engine *ce, struct copy_job *job)
{
	atomic_store(&job->done_pages, 0);
	job->status = PROTO_S_INTERNAL;
	ce->inflight++;
	pthread_mutex_lock(&ce->lock);
	TAILQ_INSERT_TAIL(&ce->todo, job, entry);
	pthread_cond_signal(&ce->cond);
	pthread_mutex_unlock(&ce->lock);
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
