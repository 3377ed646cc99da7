/*
 * The cuda copy engine's daemon side: engine memory on the GPU (CUDA IPC
 * handles and cuMem fds opened at ATTACH) and RESTORE/PUBLISH copy jobs
 * run by kernels/ (kernels.h) instead of the host engine's workers.
 *
 * At start-up with a GPU: kernels_init(0), the DRAM arena registered
 * pinned, mapped and portable (objects are read and written there by DMA
 * and zero-copy kernels of every device), and a workq (workq.c) whose
 * eventfd is every engine's notify fd. A copy engine per device (struct
 * cuda_dev: a kernels_engine with its own streams, staging ring, kernels,
 * waiter thread and GPU clock calibration) starts at the first region
 * whose memory is on that device: opening the IPC handle or cuMem fd says
 * which, and the region's device claim must agree (cuda_pick_engine). The
 * waiter threads (or CUDA host callbacks) write the one fd after every
 * chunk; the queue's wake hook lets every engine issue its next chunks,
 * polls the ops in flight and runs the completions of those done; jobs
 * refused at submission go through the same queue as entries. A job runs
 * on one engine: a session's memory is on one device. A group whose ranks
 * sit on several devices restores on all of them at once; restore.c's
 * group logic (one rank fails, the others are cancelled and answered once
 * their copies stopped) is the same whichever engines run the copies. An op waiting for an engine's event
 * (RESTORE with PROTO_RESTORE_F_WAIT_EVENT) gets no callback when that
 * event completes, so while any does, a timer polls the engine too
 * (20 us, backing off to CUDA_POLL_MAX_US). Nothing here blocks the loop: a cancel
 * is kernels_op_cancel(), and the job's completion (which answers CANCEL)
 * runs only once every chunk already issued has finished.
 *
 * A copy job keeps the host engine's struct copy_job and its contract:
 * done() runs later on the loop thread with status, done_pages and
 * bad_page filled as copy.c fills them, so restore.c and publish.c never
 * tell the engines apart (copy_submit picks by the job's region). A job the engine refuses
 * (submit failed) completes the same way, with PROTO_S_INTERNAL and why.
 *
 * Regions: one mapping per allocation and session (regions of a session
 * naming the same IPC handle or the same cuMem fd share the first one's
 * mapping, which that region closes last), one kernels_region per region.
 * The session's reference counting keeps both until its jobs drained.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"
#include "kernels.h"
#include "kernels_uuid.h"

_Static_assert(CUDA_UUID_LEN >= KERNELS_UUID_LEN, "cuda_dev_stats.uuid holds a GPU UUID");

/*
 * cuMem mappings must cover whole granules, and the exporter's size is
 * not on the wire: 2 MiB is the allocation granularity of device memory
 * on every NVIDIA GPU with VMM, and an exporter's allocation is a
 * multiple of it, so offset + size rounded up to it lies inside.
 */
#define CUDA_CUMEM_GRAN		(2ULL << 20)
#define CUDA_POLL_MIN_US	20
#define CUDA_POLL_MAX_US	500
#define CUDA_TAIL_SPIN_US	150	/* the loop's poll of a restore's last kernels, at most */

/*
 * One copy engine: a kernels_engine on one GPU, with its own streams,
 * staging ring, loaded kernels, waiter thread and GPU clock calibration.
 * Engine i runs on GPU i / per_gpu: per_gpu is 1 but under
 * testing.cuda_engines_per_gpu, which gives one GPU several engines so
 * that a one-GPU host exercises the several-device paths.
 */
struct cuda_dev {
	struct cuda_engine	*ce;
	unsigned		 idx;		/* the engine's index: a region's device claim */
	int			 gpu;		/* the CUDA device it runs on */
	struct kernels_engine	*eng;
	struct copy_job_list	 running;	/* submitted to this engine */
	unsigned		 inflight;
	uint64_t		 jobs;		/* done, by kind */
	uint64_t		 restores, publishes, failed;
	uint64_t		 bytes;		/* moved by jobs done OK */
	unsigned		 regions;	/* open on it */
	struct copy_times	 last_restore;
};

struct cuda_engine {
	struct workq		*wq;		/* every engine's notify fd; refused jobs */
	struct event		*poll;		/* while ops wait for engine events */
	unsigned		 poll_us;	/* its interval, backing off */
	void			*arena;		/* registered pinned (portable), or NULL */
	size_t			 arena_len;
	size_t			 slot_bytes;	/* the largest object a job may move */
	struct kernels_conf	 conf;		/* every engine's */
	int			 ngpus;
	unsigned		 per_gpu;
	/* By GPU: its UUID, what an engine process with other ordinals names it by; "" unknown. */
	char			 uuid[CUDA_ENGINES_MAX][KERNELS_UUID_LEN];
	unsigned		 nengines;	/* ngpus * per_gpu, at most CUDA_ENGINES_MAX */
	struct cuda_dev		*devs[CUDA_ENGINES_MAX];	/* made at their first region */
	unsigned		 inflight;	/* all engines' */
	unsigned		 refused;	/* jobs queued on wq */
};

/*
 * The engine's state of one job. The engine takes each region page once
 * per op; a PUBLISH may name one source page for several objects, so the
 * GPU reads it once and the loop copies the object for the others.
 */
struct cuda_job {
	struct kernels_op	*op;		/* NULL when refused */
	uint32_t		 nsub;		/* pages submitted */
	uint32_t		*sub;		/* the job page of each submitted page */
	uint32_t		*first;		/* publish: the job page read for this one */
	uint8_t			*page_status;	/* nsub, KERNELS_PAGE_* */
	uint64_t		*checksums;	/* nsub */
};

static const char *
cuda_kind_name(unsigned kind)
{
	return kind == PROTO_MEM_CUDA_IPC ? "cuda_ipc" : kind == PROTO_MEM_CUMEM_FD ? "cumem_fd" :
	    "memfd";
}

/* The engine's part of a done job's timeline (copy_times). */
static void
cuda_job_times(struct copy_job *job)
{
	struct kernels_op_times	t;

	if (kernels_op_times(job->cuda->op, &t) != 0)
		return;
	job->t.first_issue = t.first_issue;
	job->t.last_issue = t.last_issue;
	job->t.gpu_dma_start = t.gpu_dma_start;
	job->t.gpu_dma_end = t.gpu_dma_end;
	job->t.gpu_csum_start = t.gpu_csum_start;
	job->t.gpu_csum_end = t.gpu_csum_end;
	job->t.gpu_verified = t.gpu_verified;
	job->t.gpu_end = t.gpu_end;
	job->t.notify = t.notify;
	job->t.done = t.done;
}

/* Fills in the results of a done op: status, done_pages, bad_page, checksums. */
static void
cuda_job_result(struct copy_job *job)
{
	struct cuda_job		*cj = job->cuda;
	struct kernels_result	 res;
	uint32_t		 i, n = 0;
	int			 rc;

	memset(&res, 0, sizeof(res));
	cuda_job_times(job);
	rc = kernels_op_result(cj->op, &res, cj->page_status, cj->checksums);
	if (rc != 0) {
		job->status = PROTO_S_INTERNAL;
		snprintf(job->why, sizeof(job->why), "the cuda engine lost the op's result (%d)", rc);
		return;
	}
	/* Whole pages in place, in order: what a cancel or a deadline reports. */
	while (n < cj->nsub && cj->sub[n] == n && cj->page_status[n] == KERNELS_PAGE_DONE)
		n++;
	atomic_store(&job->done_pages, n);
	if (res.status == 0) {
		job->status = PROTO_S_OK;
		if (job->kind != COPY_PUBLISH)
			return;
		for (i = 0; i < cj->nsub; i++)
			job->pages[cj->sub[i]].checksum = cj->checksums[i];
		for (i = 0; i < job->npages; i++) {
			struct copy_page *pg = &job->pages[i], *f = &job->pages[cj->first[i]];

			if (f != pg) {
				memcpy(pg->obj, f->obj, pg->len);
				pg->checksum = f->checksum;
			}
		}
	} else if (res.status == -EBADMSG) {
		/* The corrupt page was not written; the others may have been. */
		job->status = PROTO_S_LOST;
		job->bad_page = res.first_bad < cj->nsub ? cj->sub[res.first_bad] : 0;
	} else if (res.status == -ECANCELED) {
		job->status = PROTO_S_CANCELLED;
	} else {
		job->status = PROTO_S_INTERNAL;
		snprintf(job->why, sizeof(job->why), "GPU copy failed: %.140s", res.err);
		log_error("cuda", "%s %u pages: %s", job->kind == COPY_RESTORE ? "restore" : "publish",
		    job->npages, res.err);
	}
}

static void
cuda_job_free(struct copy_job *job)
{
	struct cuda_job	*cj = job->cuda;

	if (cj == NULL)
		return;
	kernels_op_free(cj->op);	/* a done op: nothing to wait for */
	free(cj->sub);
	free(cj->first);
	free(cj->page_status);
	free(cj->checksums);
	free(cj);
	job->cuda = NULL;
}

static int
cuda_cmp_u64(const void *a, const void *b)
{
	uint64_t	x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Which job pages go to the engine: all of a restore's (the engine
 * refuses a destination named twice), and for a publish the first page
 * reading each source page; first[] says which one each page copies.
 */
static int
cuda_job_pages(struct copy_job *job, struct cuda_job *cj)
{
	uint64_t	*key;
	uint32_t	 i, page, idx;

	cj->nsub = 0;
	if (job->kind != COPY_PUBLISH) {
		for (i = 0; i < job->npages; i++)
			cj->sub[cj->nsub++] = i;
		return 0;
	}
	if ((cj->first = calloc(job->npages, sizeof(*cj->first))) == NULL ||
	    (key = calloc(job->npages, sizeof(*key))) == NULL)
		return -ENOMEM;
	/* A publish reads one region: sort by (page, job index) to find repeats. */
	for (i = 0; i < job->npages; i++)
		key[i] = (uint64_t)job->pages[i].region_page << 32 | i;
	qsort(key, job->npages, sizeof(*key), cuda_cmp_u64);
	for (i = 0; i < job->npages; i++) {
		page = (uint32_t)(key[i] >> 32);
		idx = (uint32_t)key[i];
		if (i > 0 && (uint32_t)(key[i - 1] >> 32) == page) {
			cj->first[idx] = cj->first[(uint32_t)key[i - 1]];
			continue;
		}
		cj->first[idx] = idx;
	}
	free(key);
	for (i = 0; i < job->npages; i++)
		if (cj->first[i] == i)
			cj->sub[cj->nsub++] = i;
	return 0;
}

/* Ops waiting for an engine event, on every engine. */
static unsigned
cuda_gated(const struct cuda_engine *ce)
{
	unsigned	i, n = 0;

	for (i = 0; i < ce->nengines; i++)
		if (ce->devs[i] != NULL)
			n += kernels_engine_gated(ce->devs[i]->eng);
	return n;
}

/* While ops wait for engine events, the engines are polled on a timer. */
static void
cuda_arm_poll(struct cuda_engine *ce)
{
	struct timeval	tv;

	if (cuda_gated(ce) == 0) {
		ce->poll_us = 0;
		return;
	}
	if (evtimer_pending(ce->poll, NULL))
		return;
	ce->poll_us = ce->poll_us == 0 ? CUDA_POLL_MIN_US : ce->poll_us * 2;
	if (ce->poll_us > CUDA_POLL_MAX_US)
		ce->poll_us = CUDA_POLL_MAX_US;
	tv.tv_sec = 0;
	tv.tv_usec = ce->poll_us;
	if (evtimer_add(ce->poll, &tv) != 0)
		log_warn("cuda", "cannot arm the event poll timer");
}

/* The bytes a job moves: its pages' objects. */
static uint64_t
cuda_job_bytes(const struct copy_job *job)
{
	uint64_t	n = 0;
	uint32_t	i;

	for (i = 0; i < job->npages; i++)
		n += job->pages[i].len;
	return n;
}

/* A job of engine dev is done: its counters, then it leaves the engine. */
static void
cuda_dev_done(struct cuda_dev *dev, struct copy_job *job)
{
	dev->jobs++;
	if (job->kind == COPY_RESTORE)
		dev->restores++;
	else
		dev->publishes++;
	if (job->status == PROTO_S_OK)
		dev->bytes += cuda_job_bytes(job);
	else
		dev->failed++;
	if (job->kind == COPY_RESTORE && job->status == PROTO_S_OK)
		dev->last_restore = job->t;
	dev->inflight--;
	dev->ce->inflight--;
}

/*
 * Issues more chunks and completes the done jobs, on every engine (they
 * share the one notify fd). Woken at the end of a restore's last DMA
 * (kernels_engine_tail), it polls the engines until that restore's
 * kernels are done, for at most CUDA_TAIL_SPIN_US: the loop's wake-up
 * (tens of microseconds on a virtual machine) then overlaps the checksum
 * and scatter instead of following them.
 */
static void
cuda_progress(struct cuda_engine *ce)
{
	struct copy_job_list	 done;
	struct copy_job		*job, *next;
	struct cuda_dev		*dev;
	uint64_t		 t0 = 0;
	unsigned		 i;
	int			 tail;

	TAILQ_INIT(&done);
	for (;;) {
		tail = 0;
		for (i = 0; i < ce->nengines; i++) {
			if ((dev = ce->devs[i]) == NULL || dev->inflight == 0)
				continue;
			kernels_engine_progress(dev->eng);
			for (job = TAILQ_FIRST(&dev->running); job != NULL; job = next) {
				next = TAILQ_NEXT(job, entry);
				if (!kernels_op_poll(job->cuda->op))
					continue;
				TAILQ_REMOVE(&dev->running, job, entry);
				cuda_job_result(job);
				TAILQ_INSERT_TAIL(&done, job, entry);
			}
			tail += kernels_engine_tail(dev->eng);
		}
		if (!TAILQ_EMPTY(&done) || tail == 0)
			break;
		if (t0 == 0)
			t0 = server_now_ns();
		else if (server_now_ns() - t0 > CUDA_TAIL_SPIN_US * 1000ULL)
			break;	/* the chunk's own notification comes later */
	}
	/* Completions may submit or cancel other jobs: the lists are consistent now. */
	while ((job = TAILQ_FIRST(&done)) != NULL) {
		TAILQ_REMOVE(&done, job, entry);
		cuda_job_free(job);
		cuda_dev_done(job->cuda_dev, job);
		job->cuda_dev = NULL;
		job->done(job);
	}
	cuda_arm_poll(ce);
}

/* A notify fd was written (a chunk completed), or a refused job was queued. */
static void
cuda_wake(void *arg)
{
	cuda_progress(arg);
}

/* A job refused at submission completes, as cuda_progress completes the others. */
static void
cuda_refused_done(struct workq_entry *e, void *arg)
{
	struct cuda_engine	*ce = arg;
	struct copy_job		*job = WORKQ_ITEM(e, struct copy_job, wq);

	cuda_job_free(job);
	ce->refused--;
	if (job->cuda_dev != NULL) {
		cuda_dev_done(job->cuda_dev, job);
		job->cuda_dev = NULL;
	} else {
		ce->inflight--;
	}
	job->done(job);
}

static void
cuda_poll_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	cuda_progress(arg);
}

/*
 * Diagnostics from the environment (tests/bench/GPU_NOTES.md), for
 * benchmarks that compare engine variants with one build:
 * L3KV_CUDA_NOTIFY=callback|thread, L3KV_CUDA_TIMELINE=1 (GPU stamps in
 * STATS "copy"."last_restore"), L3KV_CUDA_BATCH=0|1 (runs >= 128 KiB by
 * cudaMemcpyBatchAsync), L3KV_CUDA_CSUM=cta|warp (the checksum kernel's
 * form: a CTA or a warp per 64 KiB unit).
 */
static void
cuda_conf_env(struct kernels_conf *c)
{
	const char	*v;

	if ((v = getenv("L3KV_CUDA_NOTIFY")) != NULL && *v) {
		if (strcmp(v, "callback") == 0)
			c->notify = KERNELS_NOTIFY_CALLBACK;
		else if (strcmp(v, "thread") == 0)
			c->notify = KERNELS_NOTIFY_THREAD;
		else
			log_warn("cuda", "L3KV_CUDA_NOTIFY=%s: not callback or thread; ignored", v);
	}
	if ((v = getenv("L3KV_CUDA_TIMELINE")) != NULL && *v)
		c->timeline = strcmp(v, "0") != 0;
	if ((v = getenv("L3KV_CUDA_BATCH")) != NULL && *v)
		c->batch_dma = strcmp(v, "0") != 0;
	if ((v = getenv("L3KV_CUDA_CSUM")) != NULL && *v) {
		if (strcmp(v, "cta") == 0)
			c->csum = KERNELS_CSUM_CTA;
		else if (strcmp(v, "warp") == 0)
			c->csum = KERNELS_CSUM_WARP;
		else
			log_warn("cuda", "L3KV_CUDA_CSUM=%s: not cta or warp; ignored", v);
	}
}

/*
 * The UUIDs of the GPUs that have engines: HEALTH and STATS report them,
 * so that a client whose CUDA numbers the GPUs otherwise can find the
 * daemon's index of its own. A GPU whose UUID the driver does not give
 * is still served; it is just not found by UUID.
 */
static void
cuda_read_uuids(struct cuda_engine *ce)
{
	char		why[256] = "";
	unsigned	g;

	for (g = 0; g < (unsigned)ce->ngpus && g * ce->per_gpu < ce->nengines; g++) {
		if (kernels_device_uuid((int)g, ce->uuid[g], sizeof(ce->uuid[g]), why,
		    sizeof(why)) != 0) {
			ce->uuid[g][0] = '\0';
			log_warn("cuda", "GPU %u: no UUID: %s", g, why);
			continue;
		}
		log_info("cuda", "GPU %u is %s", g, ce->uuid[g]);
	}
}

/*
 * Starts the cuda side over the DRAM arena: a context on GPU 0, the arena
 * registered pinned and portable (every device's engines DMA from it and
 * map it), the notify queue. The copy engines come later, each at the
 * first region of its device (cuda_dev_get). 0 or -errno with err
 * filled; *out is owned by the caller (cuda_engine_free).
 */
int
cuda_engine_new(struct event_base *base, struct dram *dram, int ngpus, unsigned per_gpu,
    struct cuda_engine **out, char *err, size_t errlen)
{
	struct cuda_engine	*ce;
	char			 why[256] = "";
	size_t			 alen;
	void			*arena;
	int			 rc;

	*out = NULL;
	if ((ce = calloc(1, sizeof(*ce))) == NULL) {
		snprintf(err, errlen, "out of memory for the cuda copy engine");
		return -ENOMEM;
	}
	ce->ngpus = ngpus;
	ce->per_gpu = per_gpu < 1 ? 1 : per_gpu;
	ce->nengines = (unsigned)ngpus * ce->per_gpu;
	if (ce->nengines > CUDA_ENGINES_MAX) {
		log_warn("cuda", "%d GPUs x %u engines each: only the first %u engines are used",
		    ngpus, ce->per_gpu, (unsigned)CUDA_ENGINES_MAX);
		ce->nengines = CUDA_ENGINES_MAX;
	}
	if ((rc = kernels_init(0, why, sizeof(why))) != 0) {
		snprintf(err, errlen, "cuda: %s", why);
		goto fail;
	}
	cuda_read_uuids(ce);
	arena = dram_arena(dram, &alen);
	if ((rc = kernels_host_register(arena, alen, why, sizeof(why))) != 0) {
		snprintf(err, errlen, "cuda: registering the %zu-byte DRAM arena: %s", alen, why);
		goto fail;
	}
	ce->arena = arena;
	ce->arena_len = alen;
	if ((rc = workq_new(base, "cuda", 64, cuda_refused_done, cuda_wake, ce, &ce->wq, err,
	    errlen)) != 0)
		goto fail;
	kernels_conf_default(&ce->conf);
	ce->conf.notify_fd = workq_fd(ce->wq);
	cuda_conf_env(&ce->conf);
	ce->slot_bytes = ce->conf.slot_bytes;
	ce->poll = evtimer_new(base, cuda_poll_cb, ce);
	if (ce->poll == NULL) {
		snprintf(err, errlen, "out of memory for the cuda copy engine");
		rc = -ENOMEM;
		goto fail;
	}
	log_info("cuda", "cuda copy engine on GPU 0: %zu-byte DRAM arena pinned for every "
	    "device; %d GPU(s), %u engine(s) each, made at their first region: %u slots of "
	    "%zu bytes, %u streams, notify by %s%s%s", alen, ngpus, ce->per_gpu, ce->conf.slots,
	    ce->conf.slot_bytes, ce->conf.streams,
	    ce->conf.notify == KERNELS_NOTIFY_THREAD ? "thread" : "callback",
	    ce->conf.timeline ? ", timeline" : "", ce->conf.batch_dma ? ", batched DMA" : "");
	*out = ce;
	return 0;

fail:
	cuda_engine_free(ce);
	return rc;
}

/* Engine i's GPU UUID for a message. */
static const char *
cuda_uuid_text(const struct cuda_engine *ce, unsigned i)
{
	const char	*u = cuda_device_uuid(ce, i);

	return u[0] != '\0' ? u : "UUID unknown";
}

/*
 * Engine idx, made now if this is its first region: its GPU made current
 * (and its primary context created), then the kernels_engine there.
 * NULL with err filled when it cannot start.
 */
static struct cuda_dev *
cuda_dev_get(struct cuda_engine *ce, unsigned idx, char *err, size_t errlen)
{
	struct cuda_dev	*dev;
	char		 why[256] = "";
	int		 rc;

	if ((dev = ce->devs[idx]) != NULL)
		return dev;
	if ((dev = calloc(1, sizeof(*dev))) == NULL) {
		snprintf(err, errlen, "out of memory for a cuda copy engine");
		return NULL;
	}
	dev->ce = ce;
	dev->idx = idx;
	dev->gpu = (int)(idx / ce->per_gpu);
	TAILQ_INIT(&dev->running);
	if ((rc = kernels_init(dev->gpu, why, sizeof(why))) != 0 ||
	    (rc = kernels_engine_new(&ce->conf, &dev->eng, why, sizeof(why))) != 0) {
		snprintf(err, errlen, "starting copy engine %u on GPU %d: %s", idx, dev->gpu, why);
		log_error("cuda", "%s", err);
		free(dev);
		return NULL;
	}
	log_info("cuda", "copy engine %u started on GPU %d (%s)", idx, dev->gpu,
	    cuda_uuid_text(ce, idx));
	ce->devs[idx] = dev;
	return dev;
}

/*
 * Stops the engines: ops still in flight are cancelled and waited for,
 * their completions dropped (the loop is gone). Idempotent on NULL.
 */
void
cuda_engine_free(struct cuda_engine *ce)
{
	struct copy_job	*job;
	struct cuda_dev	*dev;
	char		 why[256];
	unsigned	 i;

	if (ce == NULL)
		return;
	for (i = 0; i < CUDA_ENGINES_MAX; i++) {
		if ((dev = ce->devs[i]) == NULL)
			continue;
		while ((job = TAILQ_FIRST(&dev->running)) != NULL) {
			TAILQ_REMOVE(&dev->running, job, entry);
			cuda_job_free(job);	/* kernels_op_free cancels and waits */
		}
		kernels_engine_free(dev->eng);
		free(dev);
		ce->devs[i] = NULL;
	}
	workq_free(ce->wq);	/* refused jobs not completed yet hold no GPU state */
	if (ce->poll != NULL)
		event_free(ce->poll);
	if (ce->arena != NULL && kernels_host_unregister(ce->arena, why, sizeof(why)) != 0)
		log_warn("cuda", "unregistering the DRAM arena: %s", why);
	free(ce);
}

unsigned
cuda_inflight(const struct cuda_engine *ce)
{
	return ce == NULL ? 0 : ce->inflight;
}

/* RESTOREs whose writes wait for an engine's event to complete. */
unsigned
cuda_waiting_on_events(const struct cuda_engine *ce)
{
	return ce == NULL ? 0 : cuda_gated(ce);
}

/*
 * DEBUG (testing.debug_ops): the copy engine of these regions dies, as on
 * a sticky CUDA error: its ops in flight fail once their issued chunks
 * are done, later ones are refused. The loop is woken to see it. 0, or
 * -ENOENT where no region is GPU memory.
 */
int
cuda_kill_engine(struct cuda_engine *ce, const struct region *regions, unsigned n)
{
	uint64_t	one = 1;
	unsigned	i;

	for (i = 0; ce != NULL && i < n; i++) {
		if (regions[i].kreg == NULL || regions[i].cdev == NULL)
			continue;
		kernels_engine_kill(regions[i].cdev->eng, "copy engine killed (DEBUG)");
		if (write(workq_fd(ce->wq), &one, sizeof(one)) < 0)
			log_debug("cuda", "waking the loop: %s", strerror(errno));
		return 0;
	}
	return -ENOENT;
}

/* Copy engines this daemon may start: GPUs x testing.cuda_engines_per_gpu. */
unsigned
cuda_devices(const struct cuda_engine *ce)
{
	return ce == NULL ? 0 : ce->nengines;
}

/* Engine i's GPU UUID ("GPU-..."), or "" where it is not known or there is no engine i. */
const char *
cuda_device_uuid(const struct cuda_engine *ce, unsigned i)
{
	if (ce == NULL || i >= ce->nengines)
		return "";
	return ce->uuid[i / ce->per_gpu];
}

void
cuda_dev_stats(const struct cuda_engine *ce, unsigned i, struct cuda_dev_stats *st)
{
	const struct cuda_dev	*dev = ce->devs[i];

	memset(st, 0, sizeof(*st));
	st->device = i;
	st->gpu = (int)(i / ce->per_gpu);
	snprintf(st->uuid, sizeof(st->uuid), "%s", cuda_device_uuid(ce, i));
	st->staging_bytes = ce->slot_bytes;
	if (dev == NULL)
		return;
	st->started = 1;
	st->jobs_inflight = dev->inflight;
	st->regions = dev->regions;
	st->jobs = dev->jobs;
	st->restores = dev->restores;
	st->publishes = dev->publishes;
	st->failed = dev->failed;
	st->bytes = dev->bytes;
	kernels_engine_staging(dev->eng, &st->staging_slots, &st->staging_in_use);
	st->waiting_on_events = kernels_engine_gated(dev->eng);
	st->last_restore = dev->last_restore;
}

/* Completes a job at the next loop callback, with status and why as set. */
static void
cuda_refuse(struct cuda_engine *ce, struct copy_job *job)
{
	ce->refused++;
	workq_push(ce->wq, &job->wq);
}

/*
 * Hands a job whose regions are GPU memory to the engine of their device;
 * its done() runs later on the loop thread, as copy_submit's do. Every
 * page names its region (copy_page.region, else the job's); one job's
 * regions are all on one engine (a session's are: cuda_region_open).
 */
void
cuda_submit(struct cuda_engine *ce, struct copy_job *job)
{
	struct kernels_region	*kregs[KERNELS_REGIONS_MAX];
	struct kernels_page	*kp = NULL;
	struct cuda_job		*cj;
	struct cuda_dev		*dev = NULL;
	unsigned		 nk = 0, k;
	uint32_t		 i;
	char			 why[256] = "";
	int			 rc;

	atomic_store(&job->done_pages, 0);
	job->status = PROTO_S_INTERNAL;
	job->why[0] = '\0';
	job->cuda_dev = NULL;
	ce->inflight++;
	if (job->npages == 0) {
		job->status = PROTO_S_OK;
		cuda_refuse(ce, job);
		return;
	}
	cj = calloc(1, sizeof(*cj));
	kp = calloc(job->npages, sizeof(*kp));
	if (cj == NULL || kp == NULL ||
	    (cj->sub = calloc(job->npages, sizeof(*cj->sub))) == NULL ||
	    (cj->page_status = calloc(job->npages, 1)) == NULL ||
	    (cj->checksums = calloc(job->npages, sizeof(*cj->checksums))) == NULL ||
	    cuda_job_pages(job, cj) != 0) {
		snprintf(job->why, sizeof(job->why), "out of memory for a GPU copy");
		goto refuse;
	}
	for (i = 0; i < cj->nsub; i++) {
		const struct copy_page	*pg = &job->pages[cj->sub[i]];
		const struct region	*rg = pg->region != NULL ? pg->region : job->region;

		if (rg == NULL || rg->kreg == NULL) {
			snprintf(job->why, sizeof(job->why), "page %u is not in GPU memory", i);
			goto refuse;
		}
		if (dev == NULL)
			dev = ce->devs[rg->gpu_engine];
		if (dev == NULL || rg->gpu_engine != dev->idx) {
			snprintf(job->why, sizeof(job->why), "one copy may touch the regions of one "
			    "copy engine only");
			goto refuse;
		}
		for (k = 0; k < nk && kregs[k] != rg->kreg; k++)
			;
		if (k == nk) {
			if (nk == KERNELS_REGIONS_MAX) {
				snprintf(job->why, sizeof(job->why), "one copy may touch at most %u "
				    "GPU regions", (unsigned)KERNELS_REGIONS_MAX);
				goto refuse;
			}
			kregs[nk++] = rg->kreg;
		}
		kp[i].host = pg->obj;
		kp[i].checksum = pg->checksum;
		kp[i].page = pg->region_page;
		kp[i].region = k;
	}
	/* From here the job is the engine's: its counters see it even if refused. */
	dev->inflight++;
	job->cuda_dev = dev;
	if (job->kind == COPY_RESTORE)
		rc = kernels_restore_submit(dev->eng, kregs, nk, kp, cj->nsub,
		    job->wait != NULL ? job->wait->kev : NULL, 0, &cj->op, why, sizeof(why));
	else
		rc = kernels_publish_submit(dev->eng, kregs, nk, kp, cj->nsub, NULL, 0, &cj->op,
		    why, sizeof(why));
	if (rc != 0) {
		log_error("cuda", "%s of %u pages refused by copy engine %u: %s",
		    job->kind == COPY_RESTORE ? "restore" : "publish", job->npages, dev->idx, why);
		snprintf(job->why, sizeof(job->why), "the GPU copy was refused: %.130s", why);
		goto refuse;
	}
	free(kp);
	job->cuda = cj;
	TAILQ_INSERT_TAIL(&dev->running, job, entry);
	cuda_arm_poll(ce);
	return;

refuse:
	free(kp);
	if (cj != NULL) {
		free(cj->sub);
		free(cj->first);
		free(cj->page_status);
		free(cj->checksums);
		free(cj);
	}
	job->cuda = NULL;
	cuda_refuse(ce, job);
}

/*
 * Stops issuing a job's chunks; its done() runs once those issued have
 * finished, with PROTO_S_CANCELLED unless everything had landed.
 */
void
cuda_cancel(struct copy_job *job)
{
	if (job->cuda != NULL && job->cuda->op != NULL)
		kernels_op_cancel(job->cuda->op);
}

/* Closes a mapping cuda_map_mem made. */
static void
cuda_unmap_mem(unsigned kind, void *dev, size_t len)
{
	char	why[256] = "";
	int	rc;

	if (kind == PROTO_MEM_CUDA_IPC)
		rc = kernels_ipc_close(dev, why, sizeof(why));
	else
		rc = kernels_cumem_unmap(dev, len, why, sizeof(why));
	if (rc != 0)
		log_warn("cuda", "closing %s memory: %s", cuda_kind_name(kind), why);
}

/*
 * Opens an allocation (IPC handle or cuMem fd) in the context of the GPU
 * its memory is on, which it reports in *gpu: opened in the current one
 * first, then, where the driver says the memory is another GPU's, closed
 * and opened again there, so that the engine of that GPU reaches it
 * without peer access.
 */
static int
cuda_map_mem(const struct proto_region *d, int fd, void **dev, size_t *len, int *gpu,
    char *err, size_t errlen)
{
	char	why[256] = "";
	size_t	asize = 0;
	int	rc, pass, cur;

	for (pass = 0; pass < 2; pass++) {
		if (d->kind == PROTO_MEM_CUDA_IPC) {
			if ((rc = kernels_ipc_open(d->handle, dev, &asize, why, sizeof(why))) != 0) {
				snprintf(err, errlen, "opening the CUDA IPC handle: %s", why);
				return rc;
			}
			*len = asize;
		} else {
			*len = (size_t)((d->offset + d->size + CUDA_CUMEM_GRAN - 1) &
			    ~(CUDA_CUMEM_GRAN - 1));
			if ((rc = kernels_cumem_import(fd, *len, dev, why, sizeof(why))) != 0) {
				snprintf(err, errlen, "importing the cuMem fd (%zu bytes): %s", *len,
				    why);
				return rc;
			}
		}
		cur = kernels_current_device();
		if (kernels_mem_device(*dev, gpu) != 0)
			*gpu = cur;	/* the driver cannot say: where it was opened */
		if (*gpu == cur || pass == 1)
			return 0;
		cuda_unmap_mem(d->kind, *dev, *len);
		*dev = NULL;
		if ((rc = kernels_init(*gpu, why, sizeof(why))) != 0) {
			snprintf(err, errlen, "the memory is on GPU %d, which cannot be used: %s",
			    *gpu, why);
			return rc;
		}
	}
	return 0;
}

/*
 * The engine a region goes to: the one its device claim names (wire
 * `device` n > 0: engine n - 1), checked against the GPU its memory is
 * on; without a claim, the first engine of that GPU. A session's regions
 * all go to one engine. -EXDEV (wrong_device) with err filled.
 */
static int
cuda_pick_engine(struct cuda_engine *ce, const struct region *regions, unsigned i,
    const struct proto_region *d, int gpu, unsigned *idx, char *err, size_t errlen)
{
	unsigned	j, want;

	if (gpu < 0 || gpu >= ce->ngpus) {
		snprintf(err, errlen, "the memory is on GPU %d, which this daemon does not use "
		    "(%d GPU(s))", gpu, ce->ngpus);
		return -EXDEV;
	}
	if (d->device == 0) {
		want = (unsigned)gpu * ce->per_gpu;
	} else {
		want = d->device - 1U;
		if (want >= ce->nengines) {
			snprintf(err, errlen, "device %u is claimed, but this daemon has copy "
			    "engines 0..%u", want, ce->nengines - 1);
			return -EXDEV;
		}
		/* With the UUIDs: a claim by index is wrong where the engine numbers GPUs otherwise. */
		if ((int)(want / ce->per_gpu) != gpu) {
			snprintf(err, errlen, "the memory is on GPU %d (%s), but the region claims "
			    "device %u (GPU %u, %s)", gpu, cuda_uuid_text(ce, (unsigned)gpu * ce->per_gpu),
			    want, want / ce->per_gpu, cuda_uuid_text(ce, want));
			return -EXDEV;
		}
	}
	if (want >= ce->nengines) {
		snprintf(err, errlen, "GPU %d has no copy engine (at most %u)", gpu,
		    (unsigned)CUDA_ENGINES_MAX);
		return -EXDEV;
	}
	for (j = 0; j < i; j++) {
		if (regions[j].kreg != NULL && regions[j].gpu_engine != want) {
			snprintf(err, errlen, "its copy engine is device %u, but regions[%u]'s is "
			    "device %u: one session's memory is on one device", want, j,
			    regions[j].gpu_engine);
			return -EXDEV;
		}
	}
	*idx = want;
	return 0;
}

/*
 * Opens regions[i], a GPU region, for a session: maps its allocation (or
 * shares the mapping of an earlier region of the same allocation), picks
 * its copy engine by the device its memory is on (checked against the
 * region's claim; the engine is made at its device's first region) and
 * checks its geometry against the allocation. fd is the frame's,
 * borrowed (cuMem). Without a cuda side (ce NULL) it is refused, saying
 * none_why. 0 or -errno with err filled (-EXDEV: the wrong device);
 * nothing is left open on failure.
 */
int
cuda_region_open(struct cuda_engine *ce, const char *none_why, struct region *regions, unsigned i,
    const struct proto_region *d, int fd, char *err, size_t errlen)
{
	struct region		*r = &regions[i];
	struct kernels_geom	 g;
	struct cuda_dev		*dev;
	char			 why[256] = "";
	unsigned		 j, idx = 0;
	int			 rc, gpu = 0;

	memset(r, 0, sizeof(*r));
	if (ce == NULL) {
		snprintf(err, errlen, "%s memory needs the cuda copy engine, and this daemon has "
		    "none (%s)", cuda_kind_name(d->kind), none_why != NULL ? none_why : "no GPU");
		return -ENODEV;
	}
	for (j = 0; j < i; j++) {
		const struct region *o = &regions[j];

		if (o->dev_owner && o->desc.kind == d->kind &&
		    (d->kind == PROTO_MEM_CUDA_IPC ?
		    memcmp(o->desc.handle, d->handle, sizeof(d->handle)) == 0 :
		    o->desc.fd_index == d->fd_index))
			break;
	}
	if (j < i) {
		r->dev = regions[j].dev;
		r->dev_len = regions[j].dev_len;
		gpu = regions[j].gpu;
	} else {
		if ((rc = cuda_map_mem(d, fd, &r->dev, &r->dev_len, &gpu, err, errlen)) != 0)
			return rc;
		r->dev_owner = 1;
	}
	r->desc = *d;
	r->gpu = gpu;
	if ((rc = cuda_pick_engine(ce, regions, i, d, gpu, &idx, err, errlen)) != 0)
		goto fail;
	if ((dev = cuda_dev_get(ce, idx, err, errlen)) == NULL) {
		rc = -EIO;
		goto fail;
	}
	r->gpu_engine = idx;
	if (r->dev_len != 0 && d->offset + d->size > r->dev_len) {
		snprintf(err, errlen, "offset %llu + size %llu is past the allocation's %zu bytes",
		    (unsigned long long)d->offset, (unsigned long long)d->size, r->dev_len);
		rc = -ERANGE;
		goto fail;
	}
	memset(&g, 0, sizeof(g));
	g.base = (uint8_t *)r->dev + d->offset;
	g.size = d->size;
	g.num_pages = d->num_pages;
	g.page_tokens = d->page_tokens;
	g.layers = d->layers;
	g.token_bytes = d->token_bytes;
	g.page_stride = d->page_stride;
	g.layer_stride = d->layer_stride;
	g.token_stride = d->token_stride;
	if ((rc = kernels_region_new(dev->eng, &g, &r->kreg, why, sizeof(why))) != 0) {
		snprintf(err, errlen, "%s", why);
		goto fail;
	}
	if (kernels_region_obj_bytes(r->kreg) > ce->slot_bytes) {
		snprintf(err, errlen, "a page of %llu bytes is larger than the cuda engine's "
		    "%zu-byte staging slot", (unsigned long long)kernels_region_obj_bytes(r->kreg),
		    ce->slot_bytes);
		kernels_region_free(r->kreg);
		r->kreg = NULL;
		rc = -E2BIG;
		goto fail;
	}
	r->cdev = dev;
	dev->regions++;
	r->base = g.base;
	metrics.regions_mapped++;
	metrics.region_bytes_mapped += d->size;
	return 0;

fail:
	cuda_region_close(r);
	memset(r, 0, sizeof(*r));
	return rc;
}

/*
 * Opens an event registration: the engine's interprocess CUDA event, which
 * a RESTORE may name so that its writes wait (on the GPU) for the engine's
 * last record of it. Closed with the session's regions.
 */
int
cuda_event_open(struct cuda_engine *ce, const char *none_why, struct region *r,
    const struct proto_region *d, char *err, size_t errlen)
{
	char	why[256] = "";
	int	rc;

	memset(r, 0, sizeof(*r));
	if (ce == NULL) {
		snprintf(err, errlen, "a CUDA IPC event needs the cuda copy engine, and this "
		    "daemon has none (%s)", none_why != NULL ? none_why : "no GPU");
		return -ENODEV;
	}
	if ((rc = kernels_event_open_ipc(d->handle, &r->kev, why, sizeof(why))) != 0) {
		snprintf(err, errlen, "opening the CUDA IPC event: %s", why);
		return rc;
	}
	r->desc = *d;
	metrics.events_open++;
	return 0;
}

/* Idempotent. Only once no job names the region (the session's last reference). */
void
cuda_region_close(struct region *r)
{
	if (r->kev != NULL) {
		kernels_event_free(r->kev);
		r->kev = NULL;
		metrics.events_open--;
	}

	if (r->kreg != NULL) {
		kernels_region_free(r->kreg);
		r->kreg = NULL;
		if (r->cdev != NULL)
			r->cdev->regions--;
		r->cdev = NULL;
		metrics.regions_mapped--;
		metrics.region_bytes_mapped -= r->desc.size;
	}
	if (r->dev != NULL && r->dev_owner)
		cuda_unmap_mem(r->desc.kind, r->dev, r->dev_len);
	r->dev = NULL;
	r->dev_owner = 0;
	r->base = NULL;
}
