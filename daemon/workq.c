/*
 * The worker-to-loop completion queue. Thread pools (the host copy
 * engine's workers, the CUDA host callbacks of cuda.c, and the file
 * tier's readers, writers and scans) hand finished work
 * to the loop thread here, so the handoff is written once: a mutex over a
 * FIFO of entries the callers embed in their own objects (no allocation
 * on the way back, so a completion can never fail), an eventfd written
 * when the FIFO goes from empty to not empty, and a loop callback that
 * runs at most `batch` completions per wakeup and leaves the rest to a
 * zero timer, which fires only after the loop has polled its sockets
 * again (event_active would run it in the same pass), so that a burst of
 * completions cannot starve the connections.
 *
 * Ownership: an entry pushed belongs to the queue until its done() runs
 * on the loop thread; workq_free drops the entries not yet run (the loop
 * is gone), as the hand-written queues did.
 *
 * "The loop" is whichever thread runs the event base the queue was made
 * on: fabric.c's command queue is made on its fabric thread's base, and
 * the daemon's loop is the producer there.
 */
#include <sys/eventfd.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"

struct workq {
	pthread_mutex_t		 lock;		/* guards head, tail */
	struct workq_entry	*head;
	struct workq_entry	*tail;
	int			 efd;
	struct event		*ev;
	struct event		*more;		/* a zero timer: the rest, next loop turn */
	unsigned		 batch;
	workq_done_fn		*done;
	workq_wake_fn		*wake;
	void			*arg;
	const char		*name;		/* for log lines */
};

/* The loop's side: bounded drain, then the owner's wake hook. */
static void
workq_drain(struct workq *q)
{
	static const struct timeval	 now = { 0, 0 };
	struct workq_entry		*first, *last = NULL, *e, *next;
	unsigned			 n = 0;
	int				 more;

	pthread_mutex_lock(&q->lock);
	first = q->head;
	for (e = first; e != NULL && n < q->batch; e = e->next, n++)
		last = e;
	if (last != NULL) {
		q->head = last->next;
		if (q->head == NULL)
			q->tail = NULL;
		last->next = NULL;
	}
	more = q->head != NULL;
	pthread_mutex_unlock(&q->lock);
	/* Entries pushed from now on write the eventfd only if the FIFO was empty. */
	if (more && evtimer_add(q->more, &now) != 0)
		event_active(q->ev, EV_READ, 0);	/* cannot fail; never strand entries */
	for (e = last != NULL ? first : NULL; e != NULL; e = next) {
		next = e->next;
		q->done(e, q->arg);
	}
	if (q->wake != NULL)
		q->wake(q->arg);
}

static void
workq_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct workq	*q = arg;
	uint64_t	 v;

	(void)ev;
	if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn(q->name, "eventfd read: %s", strerror(errno));
	workq_drain(q);
}

static void
workq_more_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	workq_drain(arg);
}

/*
 * A new queue on base. done runs on the loop thread for each entry pushed,
 * at most batch per wakeup; wake (may be NULL) after them on every wakeup.
 * 0 or -errno with err filled; *out is the caller's (workq_free).
 */
int
workq_new(struct event_base *base, const char *name, unsigned batch, workq_done_fn *done,
    workq_wake_fn *wake, void *arg, struct workq **out, char *err, size_t errlen)
{
	struct workq	*q;
	int		 rc;

	*out = NULL;
	if ((q = calloc(1, sizeof(*q))) == NULL) {
		snprintf(err, errlen, "out of memory for the %s queue", name);
		return -ENOMEM;
	}
	pthread_mutex_init(&q->lock, NULL);
	q->batch = batch > 0 ? batch : 1;
	q->done = done;
	q->wake = wake;
	q->arg = arg;
	q->name = name;
	if ((q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
		rc = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(-rc));
		workq_free(q);
		return rc;
	}
	q->ev = event_new(base, q->efd, EV_READ | EV_PERSIST, workq_cb, q);
	q->more = evtimer_new(base, workq_more_cb, q);
	if (q->ev == NULL || q->more == NULL || event_add(q->ev, NULL) != 0) {
		snprintf(err, errlen, "out of memory for the %s queue", name);
		workq_free(q);
		return -ENOMEM;
	}
	*out = q;
	return 0;
}

/* The producers must have stopped. Entries not yet run are dropped. Idempotent on NULL. */
void
workq_free(struct workq *q)
{
	if (q == NULL)
		return;
	if (q->ev != NULL)
		event_free(q->ev);
	if (q->more != NULL)
		event_free(q->more);
	if (q->efd >= 0)
		close(q->efd);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

/*
 * The producers must have stopped: runs done() for every entry still
 * queued, on the calling (loop) thread, with no wake(); for an owner
 * whose entries hold memory that workq_free would drop with them (a
 * scan's batches). Idempotent on NULL.
 */
void
workq_flush(struct workq *q)
{
	struct workq_entry	*e, *next;

	if (q == NULL)
		return;
	pthread_mutex_lock(&q->lock);
	e = q->head;
	q->head = q->tail = NULL;
	pthread_mutex_unlock(&q->lock);
	for (; e != NULL; e = next) {
		next = e->next;
		q->done(e, q->arg);
	}
}

/* Any thread: e's done() will run on the loop thread. */
void
workq_push(struct workq *q, struct workq_entry *e)
{
	uint64_t	one = 1;
	int		was_empty;

	e->next = NULL;
	pthread_mutex_lock(&q->lock);
	was_empty = q->head == NULL;
	if (q->tail != NULL)
		q->tail->next = e;
	else
		q->head = e;
	q->tail = e;
	pthread_mutex_unlock(&q->lock);
	if (was_empty && write(q->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		abort();	/* an eventfd write cannot fail otherwise */
}

/* The eventfd, for a notifier outside the daemon's code (kernels_conf.notify_fd). */
int
workq_fd(const struct workq *q)
{
	return q->efd;
}
