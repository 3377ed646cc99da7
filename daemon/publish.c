/*
 * PUBLISH: an engine hands pages to the daemon to keep (write-through).
 * Contract item 8: an object becomes visible only when all its bytes and
 * its checksum are in the tier, and a failed publish leaves nothing
 * visible.
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
 * bytes that eviction cannot reuse.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

struct publish_op {
	struct session		*sess;		/* a reference, through the job */
	struct proto_hdr	 req;
	uint32_t		 present;
	struct obj_key		*keys;		/* of job->pages, with a file tier */
};

/* One write-through: the DRAM object it reads, pinned until done. */
struct publish_file {
	struct server		*server;
	uint32_t		 id;
};

static void
publish_file_done(struct filetier_job *fj)
{
	struct publish_file	*pf = fj->arg;
	struct server		*s = pf->server;

	if (fj->status == -EEXIST)
		metrics.file_writes_present++;
	else if (fj->status != 0) {
		metrics.file_writes_failed++;
		log_debug("publish", "file tier write: %s", strerror(-fj->status));
	}
	dram_unpin(s->dram, pf->id);
	free(pf);
	server_maybe_finish(s);
}

/* Queues a committed DRAM object's write to the file tier; failures are counted. */
static void
publish_write_through(struct server *s, const struct obj_key *k, uint32_t id)
{
	struct publish_file	*pf;
	const uint8_t		*data;
	uint64_t		 len, csum;
	int			 rc;

	if ((pf = malloc(sizeof(*pf))) == NULL) {
		metrics.file_writes_failed++;
		return;
	}
	pf->server = s;
	pf->id = id;
	if ((data = dram_data(s->dram, id, &len, &csum)) == NULL) {
		metrics.file_writes_failed++;
		free(pf);
		return;
	}
	dram_pin(s->dram, id);
	rc = filetier_write(s->file, k, data, len, csum, publish_file_done, pf);
	if (rc == 0) {
		metrics.file_writes++;
		return;
	}
	if (rc == -EEXIST)
		metrics.file_writes_present++;
	else {
		metrics.file_writes_failed++;
		log_debug("publish", "file tier write refused: %s", strerror(-rc));
	}
	dram_unpin(s->dram, id);
	free(pf);
}

static void
publish_abort_all(struct server *s, struct copy_job *job)
{
	uint32_t	i;

	for (i = 0; i < job->npages; i++)
		dram_abort(s->dram, job->pages[i].id);
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
		session_reply_error(sess, &op->req, (unsigned)job->status,
		    "PUBLISH: copy stopped%s%s; nothing was stored", job->why[0] != '\0' ? ": " : "",
		    job->why);
	} else {
		memset(&r, 0, sizeof(r));
		for (i = 0; i < job->npages; i++) {
			dram_commit(s->dram, job->pages[i].id, job->pages[i].checksum);
			r.bytes += job->pages[i].len;
		}
		for (i = 0; s->file != NULL && op->keys != NULL && i < job->npages; i++)
			publish_write_through(s, &op->keys[i], job->pages[i].id);
		r.stored = job->npages;
		r.present = op->present;
		metrics.pages_published += r.stored;
		metrics.bytes_published += r.bytes;
		metrics.pages_present += r.present;
		session_reply(sess, &op->req, PROTO_S_OK, &r, sizeof(r));
	}
	free(job->pages);
	free(job);
	free(op->keys);
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

	if (p->flags != 0) {
		snprintf(err, errlen, "unknown flags 0x%x", p->flags);
		return PROTO_S_INVALID;
	}
	if (p->region >= sess->nregions) {
		snprintf(err, errlen, "no region %u", p->region);
		return PROTO_S_OUT_OF_BOUNDS;
	}
	rg = &sess->regions[p->region];
	if (!region_is_memory(&rg->desc)) {
		snprintf(err, errlen, "region %u is an event, not memory", p->region);
		return PROTO_S_INVALID;
	}
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
	int				 rc;

	memcpy(&p, f->payload, sizeof(p));
	metrics.publishes++;
	pages = malloc((size_t)p.npages * sizeof(*pages) + 1);
	op = calloc(1, sizeof(*op));
	job = calloc(1, sizeof(*job));
	if (pages == NULL || op == NULL || job == NULL ||
	    (job->pages = calloc(p.npages + 1, sizeof(*job->pages))) == NULL ||
	    (s->file != NULL && (op->keys = calloc(p.npages + 1, sizeof(*op->keys))) == NULL)) {
		conn_reply_error(c, &f->hdr, PROTO_S_NO_MEMORY, "PUBLISH: out of memory");
		goto fail;
	}
	memcpy(pages, f->payload + sizeof(p), (size_t)p.npages * sizeof(*pages));
	if ((st = publish_check(sess, &p, pages, err, sizeof(err))) != PROTO_S_OK) {
		metrics.publishes_failed++;
		conn_reply_error(c, &f->hdr, st, "PUBLISH: %s", err);
		goto fail;
	}
	rg = &sess->regions[p.region];
	len = sess->ns->pools[rg->desc.pool].object_bytes;
	for (i = 0; i < p.npages; i++) {
		cache_key(sess, rg->desc.pool, pages[i].hash, &k);
		rc = dram_alloc(s->dram, &k, len, near, &id, &buf);
		if (rc == -EEXIST) {
			op->present++;
			continue;
		}
		if (rc != 0) {
			publish_abort_all(s, job);
			metrics.publishes_failed++;
			conn_reply_error(c, &f->hdr, rc == -ENOSPC ? PROTO_S_NO_SPACE : PROTO_S_NO_MEMORY,
			    "PUBLISH: page %u: %s; nothing was stored", i,
			    rc == -ENOSPC ? "no space in the DRAM tier after eviction" : strerror(-rc));
			goto fail;
		}
		if (op->keys != NULL)
			op->keys[job->npages] = k;
		job->pages[job->npages].id = id;
		job->pages[job->npages].obj = buf;
		job->pages[job->npages].len = len;
		job->pages[job->npages].region_page = pages[i].src_page;
		job->npages++;
		near = id;
	}
	free(pages);
	if (job->npages == 0) {
		memset(&r, 0, sizeof(r));
		r.present = op->present;
		metrics.pages_present += r.present;
		conn_reply(c, &f->hdr, PROTO_S_OK, &r, sizeof(r));
		free(job->pages);
		free(job);
		free(op->keys);
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
	session_ref(sess);
	sess->jobs++;
	if (rg->kreg != NULL)
		cuda_submit(s->cuda, job);	/* GPU memory: ATTACH made s->cuda exist */
	else
		copy_submit(s->copy, job);
	return;

fail:
	free(pages);
	if (job != NULL)
		free(job->pages);
	free(job);
	if (op != NULL)
		free(op->keys);
	free(op);
}
