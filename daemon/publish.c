/*
 * PUBLISH: an engine hands pages to the daemon to keep (write-through).
 * docs/contract.md, item 8: an object becomes visible only when all its
 * bytes and its checksum are in the tier, and a failed publish leaves
 * nothing visible.
 *
 * The request is checked whole first (region, pool, every source index,
 * hash padding). A checkpoint is published from a state-slot region: its
 * "page" is the slot, its hash the hash of the page it ends on. Then each
 * page gets a DRAM object in the WRITING state,
 * invisible and never evicted, placed after the previous page of the
 * request so that a prefix lands contiguously; a key that is already
 * there, or being written by another publisher, is acknowledged as
 * present and not written twice. If the tier cannot hold every new page
 * even after eviction, every object of the request is aborted and the
 * answer is no_space. The copy engine copies and checksums; its
 * completion commits every page at once, or aborts them all.
 *
 * With a file tier, each committed object is then written through to it:
 * after the reply, because the DRAM tier already keeps the promise; a
 * file that fails to appear is counted and never visible, and the object
 * stays pinned in DRAM until its write finished, so the writer reads
 * bytes that eviction cannot reuse. Writes the tier cannot take yet wait
 * in a backlog (below), never refused.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

struct publish_op {
	struct session		*sess;		/* a reference, through the job */
	struct proto_hdr	 req;
	uint32_t		 present;
	uint8_t			*heads;		/* per job page, its stripe head's hash: offers */
	unsigned		 pool;		/* the region's pool */
	uint32_t		 tokens;	/* of one page: publish_tokens */
	uint64_t		 t0;		/* when the PUBLISH came (metrics_now_ns) */
};

/*
 * Counts an answered PUBLISH in its namespace's slot and its latency;
 * tokens: of one page of the pool, 0 unless it is the kv pool. The
 * session may have closed (sess->ns gone): its slot stays.
 */
static void
publish_count(const struct session *sess, unsigned pool, uint32_t tokens, int failed,
    uint32_t stored, uint32_t present, uint64_t bytes, uint64_t t0)
{
	struct metrics_ns	*m = sess->m;
	unsigned		 i = metrics_ns_pool(m, pool);

	if (failed)
		m->publishes_failed++;
	m->published_pages[i] += stored;
	m->published_bytes[i] += bytes;
	m->present_pages[i] += present;
	m->backed_up_tokens += (uint64_t)stored * tokens;
	metrics_observe(METRICS_OP_PUBLISH, failed, t0);
}

/* Tokens of one page of a pool for backed_up_tokens: the kv pool's page, else 0. */
static uint32_t
publish_tokens(const struct session *sess, unsigned pool)
{
	return pool < sess->ns->layout.npools && sess->ns->pools[pool].kind == PROTO_POOL_KV ?
	    sess->ns->layout.page_tokens : 0;
}

/*
 * The write-through backlog: committed DRAM objects acknowledged by a
 * PUBLISH whose write the file tier has not taken yet (its write queue was
 * full, or the key was still being unlinked). Each is pinned in DRAM from
 * its commit until its write ended, so DRAM eviction passes over it and
 * its bytes stay where the writer will read them: a dirty object is
 * written before it can be dropped, never lost to eviction. A DRAM tier
 * full of dirty objects answers PUBLISH no_space (the engine keeps its
 * pages) until writes drain: the publish rate is held to the tier's write
 * rate. The backlog keeps DRAM ids only (the key is the object's own), 4
 * bytes an object, in publish order; it is bounded by the DRAM tier.
 */
struct publish_backlog {
	uint32_t	*ids;		/* a ring of cap ids, n from head */
	size_t		 head;
	size_t		 n;
	size_t		 cap;
	uint64_t	 bytes;		/* of the ids in the ring */
	uint64_t	 dirty;		/* acknowledged, not on file yet: ring + tier */
	uint64_t	 dirty_bytes;
	struct event	*retry;		/* a drain that no completion will trigger */
};

#define PUBLISH_RETRY_MS	10	/* -EBUSY: the key's unlink is about to end */

/* One write-through: the DRAM object it reads, pinned until done. */
struct publish_file {
	struct server		*server;
	uint32_t		 id;
	uint64_t		 len;
};

static void	publish_backlog_drain(struct server *);

static struct publish_backlog *
publish_backlog(struct server *s)
{
	if (s->backlog == NULL)
		s->backlog = calloc(1, sizeof(*s->backlog));
	return s->backlog;
}

/* The object is no longer dirty: written, present, or failed (counted). */
static void
publish_clean(struct server *s, uint32_t id, uint64_t len)
{
	s->backlog->dirty--;
	s->backlog->dirty_bytes -= len;
	dram_unpin(s->dram, id);
}

/* What /ready says of the file tier: the last write's failure, or 0 once one went through. */
static void
publish_file_status(int status)
{
	if (status == 0)
		metrics.file_write_error = 0;
	else if (status != -EEXIST && status != -ENOSPC && status != -EDQUOT)
		metrics.file_write_error = status;
}

/* A tier with nothing evictable fails every write: logged at the 1st, 2nd, 4th, 8th... */
static int
publish_log_now(uint64_t n)
{
	return (n & (n - 1)) == 0;
}

static void
publish_file_done(struct filetier_job *fj)
{
	struct publish_file	*pf = fj->arg;
	struct server		*s = pf->server;

	publish_file_status(fj->status);
	if (fj->status == -EEXIST)
		metrics.file_writes_present++;
	else if (fj->status != 0) {
		metrics.file_writes_failed++;
		log_debug("publish", "file tier write: %s", strerror(-fj->status));
	}
	publish_clean(s, pf->id, pf->len);
	free(pf);
	publish_backlog_drain(s);
	server_maybe_finish(s);
}

/*
 * Hands one dirty object's write to the file tier: 0 when it was taken or
 * settled (present, failed: counted), -EAGAIN when it must wait (the
 * tier's queue is full, its key is being unlinked, no memory now).
 */
static int
publish_file_submit(struct server *s, uint32_t id)
{
	struct publish_file	*pf;
	const struct obj_key	*k = dram_key(s->dram, id);
	const uint8_t		*data;
	uint64_t		 len, csum;
	int			 rc;

	data = dram_data(s->dram, id, &len, &csum);
	assert(k != NULL && data != NULL);	/* pinned: the record stays */
	if ((pf = malloc(sizeof(*pf))) == NULL)
		return -EAGAIN;
	pf->server = s;
	pf->id = id;
	pf->len = len;
	rc = filetier_write(s->file, k, data, len, csum, publish_file_done, pf);
	if (rc == 0) {
		metrics.file_writes++;
		return 0;
	}
	free(pf);
	if (rc == -EAGAIN || rc == -EBUSY || rc == -ENOMEM)
		return -EAGAIN;
	publish_file_status(rc);
	if (rc == -EEXIST)
		metrics.file_writes_present++;
	else {
		metrics.file_writes_failed++;
		if (publish_log_now(metrics.file_writes_failed))
			log_warn("publish", "file tier write refused: %s; the object stays in DRAM "
			    "only (%llu write-throughs failed so far)", strerror(-rc),
			    (unsigned long long)metrics.file_writes_failed);
	}
	publish_clean(s, id, len);
	return 0;
}

static void
publish_retry_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	publish_backlog_drain(arg);
}

/* Writes from the backlog's head while the tier takes them; a timer when nothing else will. */
static void
publish_backlog_drain(struct server *s)
{
	struct publish_backlog	*b = s->backlog;
	struct timeval		 tv = { 0, PUBLISH_RETRY_MS * 1000 };
	uint64_t		 len;
	uint32_t		 id;

	if (b == NULL)
		return;
	while (b->n > 0) {
		id = b->ids[b->head];
		if (publish_file_submit(s, id) != 0)
			break;
		(void)dram_data(s->dram, id, &len, NULL);
		b->bytes -= len;
		b->head = (b->head + 1) % b->cap;
		b->n--;
	}
	/* Waiting with no write of ours in flight: only time ends it. */
	if (b->n > 0 && b->dirty == b->n) {
		if (b->retry == NULL)
			b->retry = evtimer_new(s->base, publish_retry_cb, s);
		if (b->retry != NULL && !evtimer_pending(b->retry, NULL))
			evtimer_add(b->retry, &tv);
	}
	if (b->n == 0 && s->stopping)
		server_maybe_finish(s);
}

/* Appends id to the backlog; -ENOMEM when the ring cannot grow. */
static int
publish_backlog_push(struct publish_backlog *b, uint32_t id, uint64_t len)
{
	uint32_t	*nv;
	size_t		 cap, i;

	if (b->n == b->cap) {
		cap = b->cap == 0 ? 1024 : b->cap * 2;
		if ((nv = malloc(cap * sizeof(*nv))) == NULL)
			return -ENOMEM;
		for (i = 0; i < b->n; i++)
			nv[i] = b->ids[(b->head + i) % b->cap];
		free(b->ids);
		b->ids = nv;
		b->head = 0;
		b->cap = cap;
	}
	b->ids[(b->head + b->n) % b->cap] = id;
	b->n++;
	b->bytes += len;
	return 0;
}

/*
 * Makes a committed DRAM object dirty and starts its write-through, or
 * queues it behind the writes that came first. Only a failure to keep it
 * (no memory for the backlog) leaves it unwritten, counted and logged.
 */
static void
publish_write_through(struct server *s, uint32_t id)
{
	struct publish_backlog	*b = publish_backlog(s);
	uint64_t		 len;

	if (b == NULL || dram_data(s->dram, id, &len, NULL) == NULL || dram_pin(s->dram, id) != 0) {
		metrics.file_writes_failed++;
		log_warn("publish", "no memory to keep a write-through; the object stays in DRAM only");
		return;
	}
	b->dirty++;
	b->dirty_bytes += len;
	if (b->n == 0 && publish_file_submit(s, id) == 0)
		return;
	metrics.file_writes_deferred++;
	if (publish_backlog_push(b, id, len) != 0) {
		metrics.file_writes_failed++;
		log_warn("publish", "no memory to keep a write-through; the object stays in DRAM only");
		publish_clean(s, id, len);
		return;
	}
	publish_backlog_drain(s);
}

/* Dirty objects (waiting in the backlog, or being written) and their bytes; waiting ones. */
void
publish_backlog_stats(const struct server *s, uint64_t *dirty, uint64_t *dirty_bytes,
    uint64_t *waiting, uint64_t *waiting_bytes)
{
	const struct publish_backlog	*b = s->backlog;

	*dirty = b != NULL ? b->dirty : 0;
	*dirty_bytes = b != NULL ? b->dirty_bytes : 0;
	*waiting = b != NULL ? b->n : 0;
	*waiting_bytes = b != NULL ? b->bytes : 0;
}

/* Objects waiting for the tier to take their write: a drain waits for 0. */
unsigned
publish_backlog_waiting(const struct server *s)
{
	return s->backlog != NULL ? (unsigned)s->backlog->n : 0;
}

/*
 * At exit, before the file tier and DRAM go: what still waits is never
 * written, and says so. Idempotent.
 */
void
publish_backlog_free(struct server *s)
{
	struct publish_backlog	*b = s->backlog;

	if (b == NULL)
		return;
	if (b->n > 0)
		log_warn("publish", "exiting with %zu objects (%llu bytes) not written to the file "
		    "tier; they were in DRAM only", b->n, (unsigned long long)b->bytes);
	if (b->retry != NULL)
		event_free(b->retry);
	free(b->ids);
	free(b);
	s->backlog = NULL;
}

static void
publish_abort_all(struct server *s, struct copy_job *job)
{
	uint32_t	i;

	for (i = 0; i < job->npages; i++)
		dram_abort(s->dram, job->pages[i].id);
}

/*
 * The new objects go to their homes in the peer tier (peer_offer): each
 * placed by the first page of its stripe of this request.
 */
static void
publish_offer(struct server *s, const struct copy_job *job, const uint8_t *heads)
{
	struct obj_key	*keys;
	uint32_t	*ids, i;

	keys = malloc((size_t)job->npages * sizeof(*keys));
	ids = malloc((size_t)job->npages * sizeof(*ids));
	for (i = 0; keys != NULL && ids != NULL && i < job->npages; i++) {
		keys[i] = *dram_key(s->dram, job->pages[i].id);
		ids[i] = job->pages[i].id;
	}
	if (keys != NULL && ids != NULL)
		peer_offer(s, keys, heads, ids, job->npages);
	free(keys);
	free(ids);
}

static void
publish_job_done(struct copy_job *job)
{
	struct publish_op		*op = job->arg;
	struct session			*sess = op->sess;
	struct server			*s = sess->server;
	struct proto_publish_reply	 r;
	uint32_t			 i;

	if (job->status != PROTO_S_OK) {
		publish_abort_all(s, job);
		metrics.publishes_failed++;
		publish_count(sess, op->pool, op->tokens, 1, 0, 0, 0, op->t0);
		session_reply_error(sess, &op->req, (unsigned)job->status,
		    "PUBLISH: copy stopped%s%s; nothing was stored", job->why[0] != '\0' ? ": " : "",
		    job->why);
	} else {
		memset(&r, 0, sizeof(r));
		for (i = 0; i < job->npages; i++) {
			dram_commit(s->dram, job->pages[i].id, job->pages[i].checksum);
			r.bytes += job->pages[i].len;
		}
		for (i = 0; s->file != NULL && i < job->npages; i++)
			publish_write_through(s, job->pages[i].id);
		if (op->heads != NULL)
			publish_offer(s, job, op->heads);
		r.stored = job->npages;
		r.present = op->present;
		metrics.pages_published += r.stored;
		metrics.bytes_published += r.bytes;
		metrics.pages_present += r.present;
		publish_count(sess, op->pool, op->tokens, 0, r.stored, r.present, r.bytes, op->t0);
		session_reply(sess, &op->req, PROTO_S_OK, &r, sizeof(r));
	}
	free(job->pages);
	free(job);
	free(op->heads);
	free(op);
	session_job_done(sess);
}

/* Checks the request whole; 0 or a PROTO_S_* status with err filled. */
static unsigned
publish_check(struct session *sess, const struct proto_publish *p,
    const struct proto_publish_page *pages, char *err, size_t errlen)
{
	const struct region	*rg;
	uint32_t		 i;
	unsigned		 st;

	if (p->flags != 0) {
		snprintf(err, errlen, "unknown flags 0x%x", p->flags);
		return PROTO_S_INVALID;
	}
	if ((st = session_memory_region(sess, p->region, &rg, err, errlen)) != PROTO_S_OK)
		return st;
	for (i = 0; i < p->npages; i++) {
		if (pages[i].src_page >= rg->desc.num_pages) {
			snprintf(err, errlen, "source %u is page %u of a %u-page region", i,
			    pages[i].src_page, rg->desc.num_pages);
			return PROTO_S_OUT_OF_BOUNDS;
		}
		if (cache_hashes_ok(sess, pages[i].hash, 1, err, errlen) != 0)
			return PROTO_S_INVALID;
		if (pages[i].pad != 0) {
			snprintf(err, errlen, "page %u: padding must be zero", i);
			return PROTO_S_INVALID;
		}
	}
	return PROTO_S_OK;
}

/*
 * Reserves a PUBLISH page's DRAM object (dram_alloc) after *near, the
 * request's previous page, and makes it the next one's *near: the new
 * one, or where k is present already (-EEXIST) the object holding it, so
 * that a page after a prefix already in DRAM is placed right after that
 * prefix where the slot is free (one host run for a restore of it all).
 */
int
publish_reserve(struct dram *d, const struct obj_key *k, uint64_t len, uint32_t *near,
    uint32_t batch, uint32_t *id, uint8_t **buf)
{
	int	rc = dram_alloc(d, k, len, *near, batch, id, buf);

	if (rc == 0 || rc == -EEXIST)
		*near = *id;
	return rc;
}

void
publish_request(struct conn *c, struct proto_frame *f)
{
	struct proto_publish		 p;
	struct proto_publish_page	*pages = NULL;
	struct proto_publish_reply	 r;
	struct session			*sess = c->session;
	struct server			*s = c->server;
	struct publish_op		*op = NULL;
	struct copy_job			*job = NULL;
	struct obj_key			 k;
	const struct region		*rg;
	uint64_t			 len;
	uint32_t			 i, id, near = DRAM_NONE;
	uint8_t				*buf;
	char				 err[160];
	unsigned			 st;
	int				 rc, kv;
	uint64_t			 t0 = metrics_now_ns();

	memcpy(&p, f->payload, sizeof(p));
	metrics.publishes++;
	sess->m->publishes++;
	pages = malloc((size_t)p.npages * sizeof(*pages) + 1);
	op = calloc(1, sizeof(*op));
	job = calloc(1, sizeof(*job));
	if (pages == NULL || op == NULL || job == NULL ||
	    (job->pages = calloc(p.npages + 1, sizeof(*job->pages))) == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_NO_MEMORY, "PUBLISH: out of memory");
		goto fail;
	}
	memcpy(pages, f->payload + sizeof(p), (size_t)p.npages * sizeof(*pages));
	if ((st = publish_check(sess, &p, pages, err, sizeof(err))) != PROTO_S_OK) {
		metrics.publishes_failed++;
		publish_count(sess, 0, 0, 1, 0, 0, 0, t0);
		conn_reply_error(c, &f->hdr, st, "PUBLISH: %s", err);
		goto fail;
	}
	rg = &sess->regions[p.region];
	len = sess->ns->pools[rg->desc.pool].object_bytes;
	/*
	 * Offered to the peer tier's homes once stored (without memory for it,
	 * not offered), each placed by its stripe's head: KV pages in stripes
	 * counted from the request's first page, other pools' pages alone.
	 */
	kv = sess->ns->pools[rg->desc.pool].kind == PROTO_POOL_KV;
	if (peer_enabled(s))
		op->heads = malloc((size_t)p.npages * PROTO_HASH_LEN);
	for (i = 0; i < p.npages; i++) {
		cache_key(sess, rg->desc.pool, pages[i].hash, &k);
		rc = publish_reserve(s->dram, &k, len, &near, p.npages - i, &id, &buf);
		if (rc == -EEXIST) {
			op->present++;
			continue;
		}
		if (rc != 0) {
			publish_abort_all(s, job);
			metrics.publishes_failed++;
			publish_count(sess, rg->desc.pool, 0, 1, 0, 0, 0, t0);
			conn_reply_error(c, &f->hdr, rc == -ENOSPC ? PROTO_S_NO_SPACE : PROTO_S_NO_MEMORY,
			    "PUBLISH: page %u: %s; nothing was stored", i,
			    rc == -ENOSPC ? "no space in the DRAM tier after eviction" : strerror(-rc));
			goto fail;
		}
		job->pages[job->npages].id = id;
		job->pages[job->npages].obj = buf;
		job->pages[job->npages].len = len;
		job->pages[job->npages].region_page = pages[i].src_page;
		if (op->heads != NULL)
			memcpy(op->heads + (size_t)job->npages * PROTO_HASH_LEN, pages[kv ?
			    i - i % s->cfg->peer_stripe_pages : i].hash, PROTO_HASH_LEN);
		job->npages++;
	}
	free(pages);
	if (job->npages == 0) {
		memset(&r, 0, sizeof(r));
		r.present = op->present;
		metrics.pages_present += r.present;
		publish_count(sess, rg->desc.pool, 0, 0, 0, r.present, 0, t0);
		conn_reply(c, &f->hdr, PROTO_S_OK, &r, sizeof(r));
		free(job->pages);
		free(job);
		free(op->heads);
		free(op);
		return;
	}
	job->kind = COPY_PUBLISH;
	job->geom = &rg->desc;
	job->base = rg->base;
	job->region = rg;
	job->done = publish_job_done;
	job->arg = op;
	op->sess = sess;
	op->req = f->hdr;
	op->pool = rg->desc.pool;
	op->tokens = publish_tokens(sess, rg->desc.pool);
	op->t0 = t0;
	session_ref(sess);
	sess->jobs++;
	copy_submit(s, job);	/* the engine of the job's region */
	return;

fail:
	free(pages);
	if (job != NULL)
		free(job->pages);
	free(job);
	if (op != NULL)
		free(op->heads);
	free(op);
}
