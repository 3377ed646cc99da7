/*
 * RESTORE and CANCEL: wait_complete across the group (docs/contract.md,
 * items 5, 7, 10, 11).
 *
 * A RESTORE names its lease and one destination page per admitted page.
 * Everything is checked before any byte moves: the lease's state, the page
 * count (exactly the promise: never fewer), the region and every index
 * against the registered memory. Then one copy job per rank goes to the
 * copy engine; the job verifies each object's checksum before writing it.
 *
 * The group completes together. A rank whose copy finished waits (COPIED)
 * until every rank of the admission has; then all are answered READY. If
 * any rank fails (a lost or corrupt object, a cancel, an engine gone), the
 * whole group fails with that reason: copies still running are cancelled
 * and every waiting RESTORE is answered FAILED once its own copy stopped,
 * so a FAILED or CANCELLED answer never races a late write. A lost object
 * is dropped from the tier.
 *
 * best_effort and timeout (DCP 1 only, by the guard) arm a deadline: at it
 * the copy stops at a page boundary and READY reports the whole, verified,
 * contiguous prefix that landed, flagged partial.
 *
 * This file drives a lease through its states (LEASE_*) and calls down:
 * lease.c for the lease itself, staging.c for objects still on their way
 * from a slower tier (a RESTORE that comes before they landed is parked
 * and goes on from staging_wait's callback), then the copy engine. Neither
 * calls back up by name: lease.c fails a group through the hook server.c
 * gives it (restore_fail_group).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "daemon.h"

static void	restore_group_check(struct server *, struct admission *, struct lease *);

/*
 * Hits by tier: of the kv pages a READY restore put in place (its first
 * `pages`), those DRAM held at ADMIT, those staged from the file tier and
 * those pulled from a peer. hits.dram + hits.file + hits.peer = pages_restored.
 */
static void
restore_count_hits(const struct lease *l, uint32_t pages)
{
	uint32_t	i, file = 0, peer = 0;

	for (i = 0; i < l->nobjs; i++) {
		if (l->objs[i].pool != l->adm->pool || l->objs[i].page >= pages)
			continue;
		file += l->objs[i].staged == 1;
		peer += l->objs[i].staged == 2;
	}
	metrics.hits_file += file;
	metrics.hits_peer += peer;
	metrics.hits_dram += pages - file - peer;
	/* Per namespace, the same split: a pulled page landed in DRAM but is a peer's hit. */
	l->sess->m->restored_pages[0] += pages - file - peer;
	l->sess->m->restored_pages[1] += file;
	l->sess->m->restored_pages[2] += peer;
}

static void
restore_answer(struct lease *l, unsigned status, const char *why, uint32_t pages, int partial)
{
	struct proto_restore_reply	r;
	struct metrics_ns		*m = l->sess->m;

	if (!l->restore_waiting)
		return;
	l->restore_waiting = 0;
	if (status != PROTO_S_OK) {
		metrics.restores_failed[status]++;
		m->restores_failed[status]++;
		session_reply_error(l->sess, &l->restore_req, status, "RESTORE: %s", why);
		metrics_observe(METRICS_OP_RESTORE, 1, l->restore_ns);
		return;
	}
	memset(&r, 0, sizeof(r));
	r.pages = pages;
	r.flags = partial ? PROTO_RESTORE_F_PARTIAL : 0;
	r.bytes = (uint64_t)pages * l->sess->ns->pools[l->adm->pool].object_bytes;
	metrics.restores_ready++;
	metrics.restores_partial += partial != 0;
	metrics.pages_restored += pages;
	restore_count_hits(l, pages);
	metrics.bytes_restored += r.bytes;
	m->restores_ready++;
	m->restores_partial += partial != 0;
	m->restored_bytes += r.bytes;
	m->prefetched_tokens += (uint64_t)pages * l->sess->ns->layout.page_tokens;
	l->ready = 1;
	l->ready_pages = pages;
	session_reply(l->sess, &l->restore_req, PROTO_S_OK, &r, sizeof(r));
	if (l->job_times.submit != 0) {
		metrics.last_restore = l->job_times;
		metrics.last_restore.reply = server_now_ns();
	}
	metrics_observe(METRICS_OP_RESTORE, 0, l->restore_ns);
}

static void
restore_answer_cancel(struct lease *l)
{
	struct proto_cancel_reply	r;

	if (!l->cancel_waiting)
		return;
	l->cancel_waiting = 0;
	memset(&r, 0, sizeof(r));
	r.pages_landed = l->landed;
	metrics.cancels++;
	session_reply(l->sess, &l->cancel_req, PROTO_S_OK, &r, sizeof(r));
}

/*
 * Fails the group's restore: every lease of the admission ends FAILED (or
 * CANCELLED for the one that asked), unpinned; those with a copy in flight
 * are answered when it stops. Also lease.c's group_fail hook.
 */
void
restore_fail_group(struct server *s, struct admission *a, unsigned status, const char *why)
{
	struct lease	*l;
	uint16_t	 r;

	if (a->failed == 0) {
		a->failed = (int)status;
		snprintf(a->why, sizeof(a->why), "%s", why);
	}
	for (r = 0; r < a->size; r++) {
		if ((l = a->ranks[r].lease) == NULL)
			continue;
		if (l->state == LEASE_RESTORING) {
			copy_cancel(l->job);
			continue;
		}
		if (l->state == LEASE_ADMITTED || l->state == LEASE_COPIED) {
			l->state = status == PROTO_S_CANCELLED ? LEASE_CANCELLED : LEASE_FAILED;
			lease_unpin(s, l);
			restore_answer(l, (unsigned)a->failed, a->why, 0, 0);
			evtimer_del(l->timer);
			lease_arm_ttl(s, l);
		}
	}
}

/*
 * READY for all once every rank's copy is in place. Leases restored with
 * PROTO_RESTORE_F_RELEASE end then, except self (the lease whose copy just
 * completed, freed by its caller when done with it; it keeps the
 * admission alive meanwhile).
 */
static void
restore_group_check(struct server *s, struct admission *a, struct lease *self)
{
	struct lease	*l;
	uint32_t	 pages = UINT32_MAX;
	int		 partial = 0;
	uint16_t	 r;

	(void)s;
	if (a->failed)
		return;
	for (r = 0; r < a->size; r++) {
		l = a->ranks[r].lease;
		if (l == NULL || l->state != LEASE_COPIED)
			return;
		if (l->landed < pages)
			pages = l->landed;
	}
	/* Partial only if the deadline really cut pages off, on any rank. */
	partial = pages < a->reply.admitted_pages;
	for (r = 0; r < a->size; r++) {
		l = a->ranks[r].lease;
		l->state = LEASE_READY;
		lease_release_slot(l);	/* the checkpoint is in place: the slot is the engine's */
		restore_answer(l, PROTO_S_OK, NULL, pages, partial);
		lease_arm_ttl(s, l);	/* pins stay until RELEASE or the TTL */
	}
	for (r = 0; r < a->size; r++) {
		l = a->ranks[r].lease;
		if (l != NULL && l != self && l->release_on_ready) {
			metrics.releases++;
			lease_free(s, l);
		}
	}
}

/* KV pages among the first `done` objects of a lease: what a cancel reports. */
static uint32_t
restore_kv_landed(const struct lease *l, uint32_t done)
{
	uint32_t	i, n = 0;

	for (i = 0; i < done && i < l->nobjs; i++)
		if (l->objs[i].pool == l->adm->pool)
			n++;
	return n;
}

/*
 * What the copy checked: every page below done_pages had its checksum, so
 * a pulled object among them is verified now (servable to other
 * daemons); a page that failed it and was pulled for this lease fails
 * the pull of the peer it came from, as a mismatch on landing would.
 * Nothing to do, and no walk, for a lease that pinned no unverified
 * object (l->nunverified, kept by lease.c and staging.c).
 */
static void
restore_checked(struct server *s, struct lease *l, const struct copy_job *job)
{
	struct lease_obj	*o;
	uint32_t		 i, done = atomic_load(&job->done_pages);

	if (l->nunverified == 0)
		return;
	for (i = 0; i < done && i < l->nobjs; i++) {
		o = &l->objs[i];
		if (!o->unverified)
			continue;
		(void)dram_set_unverified(s->dram, o->id, 0);
		o->unverified = 0;
		l->nunverified--;
	}
	if (job->status == PROTO_S_LOST && job->bad_page < l->nobjs &&
	    l->objs[job->bad_page].unverified && l->objs[job->bad_page].from != 0)
		peer_blame(s, l->objs[job->bad_page].from, job->pages[job->bad_page].len);
}

static void
restore_job_done(struct copy_job *job)
{
	struct lease	*l = job->arg;
	struct session	*sess = l->sess;
	struct server	*s = sess->server;
	struct admission *a = l->adm;
	char		 why[160];
	unsigned	 st = (unsigned)job->status;

	restore_checked(s, l, job);
	l->landed = restore_kv_landed(l, atomic_load(&job->done_pages));
	l->job = NULL;
	l->job_times = job->t;
	if (l->job_times.done == 0)
		l->job_times.done = server_now_ns();
	evtimer_del(l->timer);
	if (st == PROTO_S_CANCELLED && l->deadline_hit && !a->failed) {
		/* best_effort / timeout: whole verified pages up to the deadline. */
		st = PROTO_S_OK;
	}
	if (st == PROTO_S_LOST) {
		metrics.objects_lost++;
		log_warn("restore", "session %u: lease %llu page %u failed its checksum; "
		    "object dropped, restore failed", sess->id, (unsigned long long)l->id,
		    job->bad_page);
		dram_drop(s->dram, job->pages[job->bad_page].id);
		snprintf(why, sizeof(why), "page %u of rank %u is lost or corrupt",
		    job->bad_page, l->rank);
		l->state = LEASE_FAILED;
		restore_fail_group(s, a, PROTO_S_LOST, why);
	} else if (st == PROTO_S_INTERNAL || st == PROTO_S_BAD_REGION) {
		/*
		 * The copy engine itself failed (the GPU's), or the engine's memory
		 * did (an unsealed memfd shrank): the group fails with its reason.
		 */
		log_warn("restore", "session %u: lease %llu: %s", sess->id,
		    (unsigned long long)l->id, job->why);
		snprintf(why, sizeof(why), "rank %u: %.140s", l->rank,
		    job->why[0] != '\0' ? job->why : "the copy failed");
		l->state = LEASE_FAILED;
		restore_fail_group(s, a, st, why);
	} else if (st != PROTO_S_OK) {
		l->state = a->failed ? LEASE_FAILED : LEASE_CANCELLED;
		if (!a->failed)
			restore_fail_group(s, a, PROTO_S_CANCELLED, "cancelled");
	} else if (a->failed) {
		/* Every page landed, but the group already failed: so does this rank. */
		l->state = LEASE_FAILED;
	} else
		l->state = LEASE_COPIED;

	if (l->state == LEASE_FAILED || l->state == LEASE_CANCELLED) {
		lease_unpin(s, l);
		restore_answer(l, a->failed ? (unsigned)a->failed : PROTO_S_CANCELLED,
		    a->failed ? a->why : "cancelled", 0, 0);
		restore_answer_cancel(l);
		lease_arm_ttl(s, l);
	} else {
		restore_answer_cancel(l);	/* a cancel that came too late: it all landed */
		restore_group_check(s, a, l);
	}
	free(job->pages);
	free(job);
	if (l->state == LEASE_READY && l->release_on_ready) {
		metrics.releases++;
		lease_free(s, l);	/* PROTO_RESTORE_F_RELEASE: answered ok, so it ends */
	} else if (sess->conn == NULL && !sess->detach_waiting)
		lease_free(s, l);	/* the engine is gone: nobody will release it */
	session_job_done(sess);
}

/* Checks a RESTORE fully; 0 or a PROTO_S_* status with err filled. */
static unsigned
restore_check(struct session *sess, struct lease *l, const struct proto_restore *p,
    const uint32_t *dst, char *err, size_t errlen)
{
	const struct region	*rg;
	uint32_t		 i;
	unsigned		 st;

	switch (l->state) {
	case LEASE_ADMITTED:
		if (l->parked != NULL) {
			snprintf(err, errlen, "lease %llu is being restored", (unsigned long long)l->id);
			return PROTO_S_STATE;
		}
		break;
	case LEASE_EXPIRED:
		snprintf(err, errlen, "lease %llu expired", (unsigned long long)l->id);
		return PROTO_S_EXPIRED;
	case LEASE_CANCELLED:
		snprintf(err, errlen, "lease %llu was cancelled", (unsigned long long)l->id);
		return PROTO_S_CANCELLED;
	case LEASE_FAILED:
		snprintf(err, errlen, "%s", l->adm->why);
		return l->adm->failed ? (unsigned)l->adm->failed : PROTO_S_LOST;
	default:
		snprintf(err, errlen, "lease %llu was already restored", (unsigned long long)l->id);
		return PROTO_S_STATE;
	}
	if (l->adm->failed) {
		snprintf(err, errlen, "%s", l->adm->why);
		return (unsigned)l->adm->failed;
	}
	if ((p->flags & ~(PROTO_RESTORE_F_WAIT_EVENT | PROTO_RESTORE_F_RELEASE)) != 0) {
		snprintf(err, errlen, "unknown flags 0x%x", p->flags);
		return PROTO_S_INVALID;
	}
	if (p->flags & PROTO_RESTORE_F_WAIT_EVENT) {
		if (p->event_region >= sess->nregions ||
		    region_is_memory(&sess->regions[p->event_region].desc)) {
			snprintf(err, errlen, "event region %u is not an event registration",
			    p->event_region);
			return PROTO_S_INVALID;
		}
	} else if (p->event_region != 0) {
		snprintf(err, errlen, "event_region %u without the wait flag", p->event_region);
		return PROTO_S_INVALID;
	}
	if (p->npages != l->npages) {
		snprintf(err, errlen, "%u destination pages for %u admitted", p->npages, l->npages);
		return PROTO_S_INVALID;
	}
	if ((st = session_memory_region(sess, p->region, &rg, err, errlen)) != PROTO_S_OK)
		return st;
	if (rg->desc.pool != l->adm->pool) {
		snprintf(err, errlen, "region %u holds pool %u, not the kv pool", p->region,
		    rg->desc.pool);
		return PROTO_S_INVALID;
	}
	if (l->slot != PROTO_SLOT_NONE) {
		/* docs/contract.md, item 6: live state is sacred, and so is another lease's slot. */
		if (p->state_region != sess->slot_region) {
			snprintf(err, errlen, "state region %u is not the slot region %d",
			    p->state_region, sess->slot_region);
			return PROTO_S_INVALID;
		}
		if (p->state_slot >= sess->regions[sess->slot_region].desc.num_pages) {
			snprintf(err, errlen, "state slot %u is outside the slot region", p->state_slot);
			return PROTO_S_OUT_OF_BOUNDS;
		}
		if (session_slot_is_live(sess, p->state_slot)) {
			snprintf(err, errlen, "state slot %u is live", p->state_slot);
			return PROTO_S_SLOT;
		}
		if (p->state_slot != l->slot) {
			snprintf(err, errlen, "state slot %u is %s; this lease holds slot %u",
			    p->state_slot, sess->slot_held[p->state_slot] ?
			    "held by another lease" : "not the one admitted", l->slot);
			return sess->slot_held[p->state_slot] ? PROTO_S_SLOT : PROTO_S_INVALID;
		}
	}
	/* Sidecars go to the same page slots in their own region: bound those too. */
	for (i = 0; i < l->nobjs; i++) {
		const struct lease_obj	*o = &l->objs[i];
		int			 reg;

		if (o->pool == l->adm->pool || sess->ns->pools[o->pool].kind == PROTO_POOL_STATE)
			continue;
		if ((reg = session_region_of_pool(sess, o->pool)) < 0) {
			snprintf(err, errlen, "no region registered for pool %u", o->pool);
			return PROTO_S_INVALID;
		}
		if (dst[o->page] >= sess->regions[reg].desc.num_pages) {
			snprintf(err, errlen, "destination %u is page %u, outside pool %u's %u-page "
			    "region", o->page, dst[o->page], o->pool, sess->regions[reg].desc.num_pages);
			return PROTO_S_OUT_OF_BOUNDS;
		}
	}
	for (i = 0; i < p->npages; i++) {
		if (dst[i] >= rg->desc.num_pages) {
			snprintf(err, errlen, "destination %u is page %u of a %u-page region", i,
			    dst[i], rg->desc.num_pages);
			return PROTO_S_OUT_OF_BOUNDS;
		}
	}
	return PROTO_S_OK;
}

/*
 * The first admitted object that was dropped from the tier since the
 * admission (lost data, found by another reader or removed by an
 * operator), or UINT32_MAX. Its pinned bytes may still be there, but the
 * tier has declared them lost: the promise cannot be kept.
 */
static uint32_t
restore_first_dropped(struct server *s, struct lease *l)
{
	struct obj_key	k;
	uint32_t	i, id;

	for (i = 0; i < l->nobjs; i++) {
		cache_key(l->sess, l->objs[i].pool,
		    l->adm->hashes + (size_t)l->objs[i].page * PROTO_HASH_LEN, &k);
		if (dram_lookup(s->dram, &k, &id) != 0 || id != l->objs[i].id)
			return l->objs[i].page;
	}
	return UINT32_MAX;
}

/* Fails a restore whose lease lost an object (page i) before the copy. */
static void
restore_lost(struct server *s, struct lease *l, uint32_t i, const char *where, int count)
{
	char	err[160];

	metrics.objects_lost += count != 0;
	snprintf(err, sizeof(err), "page %u of rank %u was lost from the %s", i, l->rank, where);
	log_warn("restore", "session %u: lease %llu: %s; restore failed", l->sess->id,
	    (unsigned long long)l->id, err);
	l->state = LEASE_FAILED;
	restore_fail_group(s, l->adm, PROTO_S_LOST, err);
	lease_unpin(s, l);
	restore_answer(l, PROTO_S_LOST, err, 0, 0);
}

/*
 * Starts the copy of a checked RESTORE (restore_waiting and restore_req
 * set) whose staging did not fail; dst stays the caller's. Its objects
 * are all in DRAM by now.
 */
static void
restore_start(struct server *s, struct lease *l, const struct proto_restore *pp,
    uint32_t *dst)
{
	struct proto_restore	 p = *pp;
	struct session		*sess = l->sess;
	struct copy_job		*job;
	struct timeval		 tv;
	uint32_t		 i;

	if ((i = restore_first_dropped(s, l)) != UINT32_MAX) {
		restore_lost(s, l, i, "tier", 1);
		return;
	}
	job = calloc(1, sizeof(*job));
	if (job == NULL || (job->pages = calloc(l->nobjs, sizeof(*job->pages))) == NULL) {
		free(job);
		restore_answer(l, PROTO_S_NO_MEMORY, "out of memory", 0, 0);
		return;
	}
	job->kind = COPY_RESTORE;
	job->geom = &sess->regions[p.region].desc;
	job->base = sess->regions[p.region].base;
	job->region = &sess->regions[p.region];
	job->wait = p.flags & PROTO_RESTORE_F_WAIT_EVENT ? &sess->regions[p.event_region] : NULL;
	job->npages = l->nobjs;
	job->done = restore_job_done;
	job->arg = l;
	job->t.arrive = l->restore_arrive;
	job->t.handled = l->restore_handled;
	for (i = 0; i < l->nobjs; i++) {
		struct copy_page	*pg = &job->pages[i];
		const struct lease_obj	*o = &l->objs[i];
		int			 reg = o->pool == l->adm->pool ? p.region :
					     session_region_of_pool(sess, o->pool);

		pg->id = o->id;
		pg->obj = (uint8_t *)(uintptr_t)dram_data(s->dram, pg->id, &pg->len, &pg->checksum);
		pg->geom = &sess->regions[reg].desc;
		pg->base = sess->regions[reg].base;
		pg->region = &sess->regions[reg];
		if (sess->ns->pools[o->pool].kind == PROTO_POOL_STATE)
			pg->region_page = p.state_slot;
		else
			pg->region_page = dst[o->page];	/* restore_check() bounded it */
		dram_touch(s->dram, pg->id);
	}
	l->state = LEASE_RESTORING;
	l->job = job;
	evtimer_del(l->timer);
	/*
	 * best_effort / timeout stop at their deadline with whole KV pages; a
	 * hybrid layout cannot stop between its stop points, so it waits.
	 */
	if (sess->prefetch != PROTO_PREFETCH_WAIT_COMPLETE && sess->prefetch_timeout_ms > 0 &&
	    !session_is_hybrid(sess)) {
		tv.tv_sec = sess->prefetch_timeout_ms / 1000;
		tv.tv_usec = (sess->prefetch_timeout_ms % 1000) * 1000;
		evtimer_add(l->timer, &tv);
	}
	session_ref(sess);
	sess->jobs++;
	job->t.submit = server_now_ns();
	copy_submit(s, job);	/* the engine of the job's region */
}

/*
 * staging_wait's callback: the lease's staged objects all landed, or one
 * failed (restore_start sees which); the parked RESTORE goes on, or fails
 * as lost.
 */
static void
restore_staged(struct server *s, struct lease *l, int status, uint32_t bad_page)
{
	struct proto_restore	*p = l->parked;

	l->parked = NULL;
	if (l->state != LEASE_ADMITTED || !l->restore_waiting) {
		/* The group failed meanwhile, and that answered the RESTORE. */
		free(p);
		return;
	}
	if (status != 0)
		restore_lost(s, l, bad_page, "file tier", 0);	/* the read counted the loss */
	else
		restore_start(s, l, p, (uint32_t *)(p + 1));
	free(p);
}

void
restore_request(struct conn *c, struct proto_frame *f)
{
	struct proto_restore	 p;
	struct session		*sess = c->session;
	struct server		*s = c->server;
	struct lease		*l;
	uint32_t		*dst, bad;
	char			 err[160];
	unsigned		 st;

	memcpy(&p, f->payload, sizeof(p));
	if ((l = lease_find(sess, p.lease)) == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_NOT_FOUND, "RESTORE: no lease %llu",
		    (unsigned long long)p.lease);
		return;
	}
	if ((dst = malloc((size_t)p.npages * sizeof(*dst) + 1)) == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_NO_MEMORY, "RESTORE: out of memory");
		return;
	}
	memcpy(dst, f->payload + sizeof(p), (size_t)p.npages * sizeof(*dst));
	if ((st = restore_check(sess, l, &p, dst, err, sizeof(err))) != PROTO_S_OK) {
		metrics.restores_failed[st]++;
		sess->m->restores_failed[st]++;
		conn_reply_error(c, &f->hdr, st, "RESTORE: %s", err);
		free(dst);
		return;
	}
	l->restore_waiting = 1;
	l->restore_req = f->hdr;
	l->release_on_ready = (p.flags & PROTO_RESTORE_F_RELEASE) != 0;
	l->restore_arrive = c->wake_ns;
	l->restore_handled = server_now_ns();
	memset(&l->job_times, 0, sizeof(l->job_times));
	l->restore_ns = metrics_now_ns();
	if (staging_pending(l)) {
		/*
		 * Objects still coming from a slower tier: park the request
		 * (the lease stays ADMITTED, its TTL stopped) until they are
		 * all in DRAM; a failed one fails it as lost, never shorter.
		 */
		l->parked = malloc(sizeof(p) + (size_t)p.npages * sizeof(*dst));
		if (l->parked == NULL) {
			free(dst);
			restore_answer(l, PROTO_S_NO_MEMORY, "out of memory", 0, 0);
			return;
		}
		memcpy(l->parked, &p, sizeof(p));
		memcpy(l->parked + 1, dst, (size_t)p.npages * sizeof(*dst));
		free(dst);
		staging_wait(l, restore_staged);
		evtimer_del(l->timer);
		return;
	}
	if (staging_status(l, &bad) != 0)
		restore_lost(s, l, bad, "file tier", 0);	/* the read counted the loss */
	else
		restore_start(s, l, &p, dst);
	free(dst);
}

void
cancel_request(struct conn *c, struct proto_frame *f)
{
	struct proto_cancel_reply	 r;
	struct proto_lease_op		 op;
	struct lease			*l;

	memcpy(&op, f->payload, sizeof(op));
	if ((l = lease_find(c->session, op.lease)) == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_NOT_FOUND, "CANCEL: no lease %llu",
		    (unsigned long long)op.lease);
		return;
	}
	if (l->state == LEASE_RESTORING) {
		/* Answered by the job's completion: only then can nothing land. */
		l->cancel_waiting = 1;
		l->cancel_req = f->hdr;
		restore_fail_group(c->server, l->adm, PROTO_S_CANCELLED, "cancelled");
		return;
	}
	if (l->state == LEASE_ADMITTED || l->state == LEASE_COPIED)
		restore_fail_group(c->server, l->adm, PROTO_S_CANCELLED, "cancelled");
	lease_unpin(c->server, l);
	memset(&r, 0, sizeof(r));
	r.pages_landed = l->landed;
	if (l->state == LEASE_READY || l->state == LEASE_ADMITTED)
		l->state = LEASE_CANCELLED;
	metrics.cancels++;
	conn_reply(c, &f->hdr, PROTO_S_OK, &r, sizeof(r));
}

/*
 * The session is going: cancel its copies (their completions drop the
 * references that keep its memory mapped), free every other lease.
 */
void
restore_session_closing(struct session *sess)
{
	struct server	*s = sess->server;
	struct lease	*l, *next;

	for (l = TAILQ_FIRST(&sess->leases); l != NULL; l = next) {
		next = TAILQ_NEXT(l, entry);
		if (l->state == LEASE_RESTORING) {
			restore_fail_group(s, l->adm, PROTO_S_CANCELLED, "a rank of the group left");
			continue;
		}
		if (l->adm != NULL && (l->state == LEASE_ADMITTED || l->state == LEASE_COPIED))
			restore_fail_group(s, l->adm, PROTO_S_CANCELLED, "a rank of the group left");
		lease_free(s, l);
	}
}
