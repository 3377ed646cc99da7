/*
 * Staging: objects of a lease read from a slower tier into DRAM.
 *
 * ADMIT promises only what it reserved, so an object that DRAM lacks but
 * a slower tier holds is staged as it is pinned: staging_add() reserves
 * its DRAM object (WRITING: the staging memory, never evicted) and pins
 * it in its source tier, and starts the read, or refuses and holds
 * nothing, so that the promise stops before that page. The read commits
 * the DRAM object and pins it for the lease, or aborts it and marks the
 * lease failed with the first page it lost.
 *
 * Whoever must wait for a lease's objects (restore.c, for a RESTORE that
 * came before they all landed) asks staging_wait() for a callback: it
 * runs once no read of the lease is in flight any more, or one failed,
 * with the status and the first bad page. Staging never calls its users
 * by name.
 *
 * The source tier is named per object (STAGING_TIER_*): the file tier, or
 * a peer's DRAM (a pull from the owner that leased the object to this
 * ADMIT, peer.c through s->peer_view), with the same reservation, sharing
 * and completion. A file tier read is verified as it lands (filetier.c);
 * a pull is not: its bytes are checked against the owner's checksum by
 * the restore that reads them next, in the same pass as its copy, so
 * that no pulled byte is read twice on the host. Until then the DRAM
 * object is marked unverified (not served to other daemons) and each
 * waiter's entry names the peer (lease_obj.from) that a mismatch blames.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "daemon.h"

/*
 * A read staging one object for the leases that wait for it: the TP
 * ranks of one MLA shard (objects are sharded by DCP rank) admit the same
 * objects, and share one read of each rather than each reading the file.
 * It owns the WRITING DRAM object and a pin on the file entry until its
 * completion, which commits the object (a promotion to DRAM, useful even
 * to nobody) and pins it once per waiter, or aborts it. Until its
 * completion it is found by its key in staging_reads; a waiter's lease is
 * NULL once that lease let go of it, and the read is cancelled when no
 * waiter is left. A cancelled read still takes a new waiter (an ADMIT
 * right after a failed restore let go of the same objects): it is
 * uncancelled, or, where its reader skipped it already, started again, so
 * that the admission is promised what PROBE said rather than finding the
 * key's DRAM object busy.
 */
struct staging_waiter {
	struct lease		*lease;
	uint32_t		 obj;		/* index in lease->objs */
};
struct staging_read {
	struct server		*server;
	unsigned		 tier;		/* STAGING_TIER_* */
	struct obj_key		 key;
	uint32_t		 dram_id;
	uint32_t		 file_id;	/* the file tier's; a peer pull has none */
	uint64_t		 checksum;	/* a peer pull: what its owner said */
	uint32_t		 from;		/* a peer pull: its owner (peer_serial) */
	uint8_t			*buf;		/* the DRAM object's bytes */
	uint64_t		 len;
	struct filetier_job	*job;		/* until done() */
	int			 cancelled;
	struct staging_read	*next;		/* in its staging_reads bucket */
	struct staging_waiter	*wait;		/* inl, or allocated past two */
	unsigned		 nwait;
	unsigned		 wait_cap;
	unsigned		 nlive;		/* waiters with a lease */
	struct staging_waiter	 inl[2];
};

#define STAGING_READ_BUCKETS	4096	/* a power of two; chains stay short at any depth */
static struct staging_read	*staging_reads[STAGING_READ_BUCKETS];

static struct staging_read **
staging_bucket(const struct obj_key *k)
{
	return &staging_reads[XXH3_64bits(k, sizeof(*k)) & (STAGING_READ_BUCKETS - 1)];
}

/* The read staging k, cancelled or not, until its completion; or NULL. */
static struct staging_read *
staging_find(const struct obj_key *k)
{
	struct staging_read	*rd;

	for (rd = *staging_bucket(k); rd != NULL; rd = rd->next)
		if (memcmp(&rd->key, k, sizeof(*k)) == 0)
			return rd;
	return NULL;
}

static void
staging_unhash(struct staging_read *rd)
{
	struct staging_read	**link = staging_bucket(&rd->key);

	while (*link != rd)
		link = &(*link)->next;
	*link = rd->next;
}

static struct staging_waiter *
staging_waiter_of(struct staging_read *rd, const struct lease *l, uint32_t obj)
{
	unsigned	i;

	for (i = 0; i < rd->nwait; i++)
		if (rd->wait[i].lease == l && rd->wait[i].obj == obj)
			return &rd->wait[i];
	fatalx("staging", "a staged object is not among its read's waiters");
}

static int
staging_join(struct staging_read *rd, struct lease *l, uint32_t obj)
{
	struct staging_waiter	*nw;
	unsigned		 cap;

	if (rd->nwait == rd->wait_cap) {
		cap = rd->wait_cap * 2;
		if ((nw = malloc(cap * sizeof(*nw))) == NULL)
			return -ENOMEM;
		memcpy(nw, rd->wait, rd->nwait * sizeof(*nw));
		if (rd->wait != rd->inl)
			free(rd->wait);
		rd->wait = nw;
		rd->wait_cap = cap;
	}
	rd->wait[rd->nwait].lease = l;
	rd->wait[rd->nwait++].obj = obj;
	rd->nlive++;
	return 0;
}

/* A lease's wait ends once nothing of it is in flight, or something failed. */
static void
staging_settle(struct server *s, struct lease *l)
{
	staging_done_fn	*done = l->staging.done;

	if (done == NULL || (l->staging.inflight > 0 && !l->staging.failed))
		return;
	l->staging.done = NULL;
	done(s, l, l->staging.failed ? -EIO : 0, l->staging.bad_page);
}

/*
 * A read ended (status 0: its bytes are in the DRAM object, verified for
 * a file, still to be verified for a pull): the object is committed or
 * aborted, and every waiter's entry settles.
 */
static void
staging_complete(struct staging_read *rd, int status, uint64_t checksum)
{
	struct server		*s = rd->server;
	struct lease_obj	*o;
	struct lease		*l;
	unsigned		 i;

	staging_unhash(rd);
	if (rd->tier == STAGING_TIER_FILE)
		filetier_unpin(s->file, rd->file_id);
	if (status == 0) {
		dram_commit(s->dram, rd->dram_id, checksum);
		if (rd->tier == STAGING_TIER_PEER)
			(void)dram_set_unverified(s->dram, rd->dram_id, 1);
	} else {
		/*
		 * The file tier dropped a faulty file itself; a failed pull was
		 * never visible here: the staging goes, and the object is not
		 * in this daemon's view.
		 */
		dram_abort(s->dram, rd->dram_id);
		if (status != -ECANCELED) {
			metrics.objects_lost++;
			log_warn("lease", "%s failed: %s; object dropped", rd->tier ==
			    STAGING_TIER_FILE ? "file tier read" : "peer pull", rd->tier ==
			    STAGING_TIER_FILE ? filetier_strerror(status) : strerror(-status));
		}
	}
	/* Every waiter's object settles first: a waiting RESTORE may then go on. */
	for (i = 0; i < rd->nwait; i++) {
		if ((l = rd->wait[i].lease) == NULL)
			continue;
		o = &l->objs[rd->wait[i].obj];
		if (status == 0) {
			dram_pin(s->dram, rd->dram_id);
			if (rd->tier == STAGING_TIER_PEER) {
				o->from = rd->from;
				o->unverified = 1;
				l->nunverified++;
			}
		} else {
			o->id = DRAM_NONE;
			if (!l->staging.failed || o->page < l->staging.bad_page)
				l->staging.bad_page = o->page;
			l->staging.failed = 1;
		}
		o->read = NULL;
		l->staging.inflight--;
	}
	for (i = 0; i < rd->nwait; i++)
		if ((l = rd->wait[i].lease) != NULL)
			staging_settle(s, l);
	if (rd->wait != rd->inl)
		free(rd->wait);
	free(rd);
	server_maybe_finish(s);
}

static void
staging_read_done(struct filetier_job *fj)
{
	struct staging_read	*rd = fj->arg;
	struct server		*s = rd->server;

	rd->job = NULL;
	/*
	 * Cancelled before its reader reached it, and joined again since: read
	 * it now (the staging and the file pin are still held).
	 */
	if (fj->status == -ECANCELED && rd->nlive > 0 && filetier_read(s->file, &rd->key, rd->buf,
	    FILETIER_READ_SIZE(rd->len), staging_read_done, rd, &rd->job) == 0)
		return;
	staging_complete(rd, fj->status, fj->checksum);
}

/* A pull's end (peer.c): its bytes landed, unverified, or err. */
static void
staging_pull_done(void *arg, int err)
{
	struct staging_read	*rd = arg;

	staging_complete(rd, err, rd->checksum);
}

/*
 * The DRAM object a staged object should follow: the lease's previous
 * one of the same pool, so that a restore reads the lease's objects as
 * few host runs (dram.c places it right after where that slot is free).
 */
static uint32_t
staging_near(const struct lease *l, const struct lease_obj *o)
{
	return o > l->objs && o[-1].pool == o->pool && o[-1].id != DRAM_NONE ? o[-1].id :
	    DRAM_NONE;
}

/*
 * A pull from the peer that leased k to this ADMIT (s->peer_view): a
 * WRITING DRAM object reserved, the pull started; a pull nobody waits for
 * any more still lands and stays in DRAM (a hot prefix costs one pull per
 * node).
 */
static int
staging_add_peer(struct server *s, struct lease *l, struct lease_obj *o, const struct obj_key *k,
    uint32_t batch)
{
	const struct peer_grant	*g = peer_view_find(s->peer_view, k);
	struct staging_read	*rd, **b;
	uint32_t		 did, near;
	uint8_t			*buf;
	int			 rc;

	if (g == NULL || g->len != l->sess->ns->pools[o->pool].object_bytes)
		return -ENOENT;
	if ((rd = calloc(1, sizeof(*rd))) == NULL)
		return -ENOMEM;
	/* After the lease's previous object, where that is free: the pulls coalesce (peer.c). */
	near = staging_near(l, o);
	if ((rc = dram_alloc(s->dram, k, g->len, near, batch, &did, &buf)) != 0) {
		free(rd);
		return rc;
	}
	rd->server = s;
	rd->tier = STAGING_TIER_PEER;
	rd->key = *k;
	rd->wait = rd->inl;
	rd->wait_cap = 2;
	(void)staging_join(rd, l, (uint32_t)(o - l->objs));
	rd->dram_id = did;
	rd->file_id = FILETIER_NONE;
	rd->buf = buf;
	rd->len = g->len;
	rd->checksum = g->checksum;
	rd->from = peer_serial(g->peer);
	if ((rc = s->peer_view->pull(s, g, buf, 0, staging_pull_done, rd)) != 0) {
		dram_abort(s->dram, did);
		free(rd);
		return rc;
	}
	b = staging_bucket(k);
	rd->next = *b;
	*b = rd;
	o->id = did;
	o->read = rd;
	l->staging.inflight++;
	return 0;
}

/*
 * Stages o (the lease's entry for key k) from tier: pins the file,
 * reserves a WRITING DRAM object for it (the staging memory, reserved now
 * so that the promise never depends on memory found later) and starts the
 * read. 0, or -errno and nothing held: the promise must stop before this
 * page. batch counts o and the objects the lease stages after it, for
 * dram_alloc's placement.
 */
int
staging_add(struct server *s, struct lease *l, struct lease_obj *o, const struct obj_key *k,
    unsigned tier, uint32_t batch)
{
	struct staging_read	*rd, **b;
	uint32_t		 obj = (uint32_t)(o - l->objs), fid, did;
	uint64_t		 len;
	uint8_t			*buf;
	int			 rc;

	if (tier != STAGING_TIER_FILE && tier != STAGING_TIER_PEER)
		return -EPROTONOSUPPORT;
	if (tier == STAGING_TIER_PEER ? peer_view_find(s->peer_view, k) == NULL :
	    !cache_file_ok(s, l->sess, o->pool) || filetier_lookup(s->file, k, &fid, &len) != 0 ||
	    len != l->sess->ns->pools[o->pool].object_bytes)
		return -ENOENT;
	if ((rd = staging_find(k)) != NULL) {
		/*
		 * Being staged for another lease (a TP replica of this shard), or
		 * for one that let go of it just now: one read for both.
		 */
		if (staging_join(rd, l, obj) != 0)
			return -ENOMEM;
		if (rd->cancelled) {
			rd->cancelled = 0;
			if (rd->job != NULL)
				atomic_store(&rd->job->cancel, 0);
		}
		log_debug("lease", "session %u page %u shares a staging read (%u waiters)",
		    l->sess->id, o->page, rd->nwait);
		o->id = rd->dram_id;
		o->read = rd;
		l->staging.inflight++;
		return 0;
	}
	if (tier == STAGING_TIER_PEER)
		return staging_add_peer(s, l, o, k, batch);
	if ((rd = calloc(1, sizeof(*rd))) == NULL)
		return -ENOMEM;
	if ((rc = filetier_pin(s->file, fid)) != 0)
		goto fail;
	/*
	 * -EEXIST: someone else is writing the key into DRAM (a publisher, or
	 * a read nobody waits for any more): not promised here.
	 */
	if ((rc = dram_alloc(s->dram, k, len, staging_near(l, o), batch, &did, &buf)) != 0)
		goto unpin;
	/* O_DIRECT: dram.c aligns objects of 4 KiB multiples; check, never assume. */
	if (((uintptr_t)buf & 4095) != 0) {
		rc = -EINVAL;
		goto abort;
	}
	rd->server = s;
	rd->tier = tier;
	rd->key = *k;
	rd->wait = rd->inl;
	rd->wait_cap = 2;
	(void)staging_join(rd, l, obj);		/* into inl: cannot fail */
	rd->dram_id = did;
	rd->file_id = fid;
	rd->buf = buf;
	rd->len = len;
	if ((rc = filetier_read(s->file, k, buf, FILETIER_READ_SIZE(len), staging_read_done, rd,
	    &rd->job)) != 0)
		goto abort;
	b = staging_bucket(k);
	rd->next = *b;
	*b = rd;
	o->id = did;
	o->read = rd;
	l->staging.inflight++;
	return 0;

abort:
	dram_abort(s->dram, did);
unpin:
	filetier_unpin(s->file, fid);
fail:
	free(rd);
	return rc;
}

/* o lets go of its place in its read, which is cancelled when nobody waits for it. */
void
staging_drop(struct lease *l, struct lease_obj *o)
{
	struct staging_read	*rd = o->read;

	staging_waiter_of(rd, l, (uint32_t)(o - l->objs))->lease = NULL;
	if (--rd->nlive == 0 && !rd->cancelled) {
		/* Hashed still: a new admission of the key may take it up again. */
		rd->cancelled = 1;
		if (rd->job != NULL)
			atomic_store(&rd->job->cancel, 1);
	}
	o->read = NULL;
	l->staging.inflight--;
}

/* The lease's entry `from`, still being read, is now its entry `to`. */
void
staging_moved(struct lease *l, uint32_t from, uint32_t to)
{
	staging_waiter_of(l->objs[to].read, l, from)->obj = to;
}

/* Whether objects of the lease are still on their way, none failed yet. */
int
staging_pending(const struct lease *l)
{
	return l->staging.inflight > 0 && !l->staging.failed;
}

/*
 * With staging_pending(l): done(s, l, status, bad_page) runs on the loop
 * once every staged object of the lease landed (status 0) or one failed
 * (-EIO, bad_page the first page lost). Never from inside this call.
 */
void
staging_wait(struct lease *l, staging_done_fn *done)
{
	l->staging.done = done;
}

/* 0, or -EIO with *bad_page where a staged object of the lease was lost. */
int
staging_status(const struct lease *l, uint32_t *bad_page)
{
	if (!l->staging.failed)
		return 0;
	*bad_page = l->staging.bad_page;
	return -EIO;
}
