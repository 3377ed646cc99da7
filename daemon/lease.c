/*
 * ADMIT and leases: the promise (contract item 3).
 *
 * ADMIT is a group barrier. The first rank to ask for a request id opens
 * an admission in its group; it is answered once every rank of the group
 * asked for the same id, or declined for all at admit.timeout_ms, or when
 * a rank leaves. The answer is computed once, on the loop thread, for the
 * whole group: the common prefix every rank holds in its own shard,
 * capped by the smallest reservation any rank made; the objects of every
 * rank are pinned in the same step, before anything is answered, so the
 * promise can never exceed what is pinned and never changes after it.
 *
 * Each rank gets its own lease over its own pinned objects. A lease lives
 * until RELEASE, its TTL (lease.ttl_ms without a restore, or after one),
 * a cancel, or its session's end; it holds a reference on its admission
 * (which restore.c uses to complete the group) and on its session.
 * ADMIT is idempotent per request id: asking again returns the same
 * answer while the admission lives.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <xxhash.h>

#include "daemon.h"

static void	admit_answer(struct server *, struct admission *, unsigned decline);
static void	lease_ttl_cb(evutil_socket_t, short, void *);

/*
 * Freed admissions and leases are kept for reuse, up to CACHE_MAX each,
 * with their arrays (up to CACHE_PAGES pages, CACHE_RANKS ranks), so that a warm ADMIT and
 * RELEASE allocate nothing: a prefix's hash copy and object array are
 * too large for malloc's per-thread cache, and were most of what the
 * allocations cost. Loop thread only, like everything here.
 */
#define CACHE_MAX	64
#define CACHE_PAGES	1024
#define CACHE_RANKS	64
static struct admission_list	adm_cache = TAILQ_HEAD_INITIALIZER(adm_cache);
static struct lease_list	lease_cache = TAILQ_HEAD_INITIALIZER(lease_cache);
static unsigned			adm_ncache, lease_ncache;

/* A zeroed admission with room for size ranks and npages hashes, or NULL. */
static struct admission *
admission_alloc(uint16_t size, uint32_t npages)
{
	struct admission	*a;
	struct admit_rank	*ranks = NULL;
	uint8_t			*hashes = NULL;
	uint32_t		 hcap = 0;
	uint16_t		 rcap = 0;

	if ((a = TAILQ_FIRST(&adm_cache)) != NULL) {
		TAILQ_REMOVE(&adm_cache, a, entry);
		adm_ncache--;
		ranks = a->ranks;
		rcap = a->ranks_cap;
		hashes = a->hashes;
		hcap = a->hashes_cap;
	} else if ((a = malloc(sizeof(*a))) == NULL)
		return NULL;
	if (rcap < size) {
		free(ranks);
		rcap = size;
		ranks = malloc((size_t)size * sizeof(*ranks));
	}
	if (hcap < npages || hashes == NULL) {
		free(hashes);
		hcap = npages;
		hashes = malloc(npages > 0 ? (size_t)npages * PROTO_HASH_LEN : 1);
	}
	if (ranks == NULL || hashes == NULL) {
		free(ranks);
		free(hashes);
		free(a);
		return NULL;
	}
	memset(a, 0, sizeof(*a));
	memset(ranks, 0, (size_t)size * sizeof(*ranks));
	a->ranks = ranks;
	a->ranks_cap = rcap;
	a->hashes = hashes;
	a->hashes_cap = hcap;
	return a;
}

/* A zeroed lease with room for nobjs objects and its timer, or NULL. */
static struct lease *
lease_alloc(struct server *s, uint32_t nobjs)
{
	struct lease_obj	*objs = NULL;
	struct lease		*l;
	uint32_t		 cap = 0;

	if ((l = TAILQ_FIRST(&lease_cache)) != NULL) {
		TAILQ_REMOVE(&lease_cache, l, entry);
		lease_ncache--;
		objs = l->objs;
		cap = l->objs_cap;
	} else if ((l = malloc(sizeof(*l) + event_get_struct_event_size())) == NULL)
		return NULL;
	if (cap < nobjs || objs == NULL) {
		free(objs);
		cap = nobjs > 0 ? nobjs : 1;
		if ((objs = malloc((size_t)cap * sizeof(*objs))) == NULL) {
			free(l);
			return NULL;
		}
	}
	memset(l, 0, sizeof(*l));
	memset(objs, 0, (size_t)cap * sizeof(*objs));
	l->objs = objs;
	l->objs_cap = cap;
	/* The timer lives behind the lease: one allocation, none once cached. */
	l->timer = (struct event *)(void *)(l + 1);
	event_assign(l->timer, s->base, -1, 0, lease_ttl_cb, l);
	return l;
}

/*
 * The promise of a hybrid layout: the largest stop point common to every
 * rank and every pool that fits every reservation. *hit gets the largest
 * common stop point before the reservation cap.
 */
static uint32_t
admit_stop_point(struct server *s, struct admission *a, uint32_t reserved, uint32_t *hit)
{
	struct session	*ranks[PROTO_GROUP_SIZE_MAX];
	uint8_t		*legal;
	uint32_t	 p;
	uint16_t	 r;

	*hit = 0;
	if ((legal = malloc((size_t)a->npages + 1)) == NULL)
		return 0;
	for (r = 0; r < a->size; r++)
		ranks[r] = a->ranks[r].sess;
	*hit = cache_group_stops(s, ranks, a->size, a->hashes, a->npages, legal);
	for (p = *hit < reserved ? *hit : reserved; p > 0 && !legal[p]; p--)
		;
	free(legal);
	return p;
}

/*
 * With a state pool every rank must have reserved a canonical slot that
 * is in its slot region, not live and not outstanding for another lease.
 */
static unsigned
admit_check_slots(struct admission *a)
{
	struct session	*sess;
	uint32_t	 slot;
	uint16_t	 r;

	for (r = 0; r < a->size; r++) {
		sess = a->ranks[r].sess;
		if (session_pool_of(sess, PROTO_POOL_STATE) < 0)
			continue;
		slot = a->ranks[r].slot;
		if (sess->slot_region < 0 || slot == PROTO_SLOT_NONE ||
		    slot >= sess->regions[sess->slot_region].desc.num_pages ||
		    session_slot_is_live(sess, slot))
			return PROTO_DECLINE_NO_SLOT;
		if (sess->slot_held[slot])
			return PROTO_DECLINE_SLOT_BUSY;
	}
	return PROTO_DECLINE_NONE;
}

static struct admission *
admit_find(struct rank_group *g, uint64_t request_id)
{
	struct admission	*a;

	TAILQ_FOREACH(a, &g->admissions, entry)
		if (a->request_id == request_id)
			return a;
	return NULL;
}

/* Unlinks from the group (the group's reference). */
static void
admit_unlink(struct server *s, struct admission *a)
{
	if (a->group == NULL)
		return;
	TAILQ_REMOVE(&a->group->admissions, a, entry);
	a->group = NULL;
	admission_unref(s, a);
}

void
admission_unref(struct server *s, struct admission *a)
{
	uint16_t	r;

	(void)s;
	if (a == NULL || --a->refs > 0)
		return;
	for (r = 0; r < a->size; r++)
		if (a->ranks[r].sess != NULL)
			session_unref(a->ranks[r].sess);
	if (a->deadline != NULL)
		event_free(a->deadline);
	if (adm_ncache < CACHE_MAX && a->hashes_cap <= CACHE_PAGES && a->ranks_cap <= CACHE_RANKS) {
		TAILQ_INSERT_HEAD(&adm_cache, a, entry);
		adm_ncache++;
		return;
	}
	free(a->ranks);
	free(a->hashes);
	free(a);
}

static void
lease_ttl_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct lease	*l = arg;
	struct server	*s = l->sess->server;

	(void)fd;
	(void)ev;
	if (l->state == LEASE_RESTORING) {
		/* The restore deadline of best_effort / timeout: stop at a page boundary. */
		l->deadline_hit = 1;
		copy_cancel(l->job);
		return;
	}
	if (l->state == LEASE_ADMITTED || l->state == LEASE_READY || l->state == LEASE_COPIED) {
		log_info("lease", "session %u: lease %llu expired after %u ms", l->sess->id,
		    (unsigned long long)l->id, s->cfg->lease_ttl_ms);
		metrics.lease_expiries++;
		if (l->state != LEASE_READY) {
			/* The group cannot complete without this rank. */
			l->state = LEASE_EXPIRED;
			restore_fail_group(s, l->adm, PROTO_S_EXPIRED, "a lease of the group expired");
		}
		lease_unpin(s, l);
		l->state = LEASE_EXPIRED;
		lease_arm_ttl(s, l);	/* the tombstone goes after another TTL */
		return;
	}
	/* A tombstone (expired, failed, cancelled) nobody released. */
	lease_free(s, l);
}

/*
 * Every lease has the same TTL, so leases expire in the order their TTL
 * was armed: libevent keeps timers of such a "common timeout" in one FIFO
 * queue behind one heap entry, where adding and deleting are O(1),
 * instead of a heap entry per lease. (The restore deadlines restore.c
 * arms on the same event are plain timeouts.)
 */
void
lease_arm_ttl(struct server *s, struct lease *l)
{
	const struct timeval	*ttl;
	struct timeval		 tv;

	tv.tv_sec = s->cfg->lease_ttl_ms / 1000;
	tv.tv_usec = (s->cfg->lease_ttl_ms % 1000) * 1000;
	if ((ttl = event_base_init_common_timeout(s->base, &tv)) == NULL)
		ttl = &tv;
	evtimer_add(l->timer, ttl);
}

/*
 * A file tier read staging one object for the leases that wait for it:
 * the TP ranks of one MLA shard (objects are sharded by DCP rank) admit
 * the same objects, and share one read of each rather than each reading
 * the file. It owns the WRITING DRAM object and a pin on the file entry
 * until its completion, which commits the object (a promotion to DRAM,
 * useful even to nobody) and pins it once per waiter, or aborts it. Until
 * its completion it is found by its key in lease_reads; a waiter's lease
 * is NULL once that lease let go of it, and the read is cancelled when no
 * waiter is left. A cancelled read still takes a new waiter (an ADMIT
 * right after a failed restore let go of the same objects): it is
 * uncancelled, or, where its reader skipped it already, started again, so
 * that the admission is promised what PROBE said rather than finding the
 * key's DRAM object busy.
 */
struct lease_read_waiter {
	struct lease		*lease;
	uint32_t		 obj;		/* index in lease->objs */
};
struct lease_read {
	struct server		*server;
	struct obj_key		 key;
	uint32_t		 dram_id;
	uint32_t		 file_id;
	uint8_t			*buf;		/* the DRAM object's bytes */
	uint64_t		 len;
	struct filetier_job	*job;		/* until done() */
	int			 cancelled;
	struct lease_read	*next;		/* in its lease_reads bucket */
	struct lease_read_waiter *wait;		/* inl, or allocated past two */
	unsigned		 nwait;
	unsigned		 wait_cap;
	unsigned		 nlive;		/* waiters with a lease */
	struct lease_read_waiter inl[2];
};

#define LEASE_READ_BUCKETS	4096	/* a power of two; chains stay short at any depth */
static struct lease_read	*lease_reads[LEASE_READ_BUCKETS];

static struct lease_read **
lease_read_bucket(const struct obj_key *k)
{
	return &lease_reads[XXH3_64bits(k, sizeof(*k)) & (LEASE_READ_BUCKETS - 1)];
}

/* The read staging k, cancelled or not, until its completion; or NULL. */
static struct lease_read *
lease_read_find(const struct obj_key *k)
{
	struct lease_read	*rd;

	for (rd = *lease_read_bucket(k); rd != NULL; rd = rd->next)
		if (memcmp(&rd->key, k, sizeof(*k)) == 0)
			return rd;
	return NULL;
}

static void
lease_read_unhash(struct lease_read *rd)
{
	struct lease_read	**link = lease_read_bucket(&rd->key);

	while (*link != rd)
		link = &(*link)->next;
	*link = rd->next;
}

static struct lease_read_waiter *
lease_read_waiter_of(struct lease_read *rd, const struct lease *l, uint32_t obj)
{
	unsigned	i;

	for (i = 0; i < rd->nwait; i++)
		if (rd->wait[i].lease == l && rd->wait[i].obj == obj)
			return &rd->wait[i];
	fatalx("lease", "a staged object is not among its read's waiters");
}

static int
lease_read_join(struct lease_read *rd, struct lease *l, uint32_t obj)
{
	struct lease_read_waiter	*nw;
	unsigned			 cap;

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

static void
lease_read_done(struct filetier_job *fj)
{
	struct lease_read	*rd = fj->arg;
	struct server		*s = rd->server;
	struct lease_obj	*o;
	struct lease		*l;
	unsigned		 i;

	rd->job = NULL;
	/*
	 * Cancelled before its reader reached it, and joined again since: read
	 * it now (the staging and the file pin are still held).
	 */
	if (fj->status == -ECANCELED && rd->nlive > 0 && filetier_read(s->file, &rd->key, rd->buf,
	    FILETIER_READ_SIZE(rd->len), lease_read_done, rd, &rd->job) == 0)
		return;
	lease_read_unhash(rd);
	filetier_unpin(s->file, rd->file_id);
	if (fj->status == 0)
		dram_commit(s->dram, rd->dram_id, fj->checksum);
	else {
		/* The file tier dropped a faulty file itself; the staging goes too. */
		dram_abort(s->dram, rd->dram_id);
		if (fj->status != -ECANCELED) {
			metrics.objects_lost++;
			log_warn("lease", "file tier read failed: %s; object dropped",
			    filetier_strerror(fj->status));
		}
	}
	/* Every waiter's object settles first: a waiting RESTORE may then go on. */
	for (i = 0; i < rd->nwait; i++) {
		if ((l = rd->wait[i].lease) == NULL)
			continue;
		o = &l->objs[rd->wait[i].obj];
		if (fj->status == 0)
			dram_pin(s->dram, rd->dram_id);
		else {
			o->id = DRAM_NONE;
			if (!l->read_failed || o->page < l->read_bad_page)
				l->read_bad_page = o->page;
			l->read_failed = 1;
		}
		o->read = NULL;
		l->reads--;
	}
	for (i = 0; i < rd->nwait; i++)
		if ((l = rd->wait[i].lease) != NULL)
			restore_reads_done(s, l);
	if (rd->wait != rd->inl)
		free(rd->wait);
	free(rd);
	server_maybe_finish(s);
}

/* Lets go of one object: its pin, or its place in a read (cancelled when nobody waits). */
static void
lease_obj_release(struct server *s, struct lease *l, struct lease_obj *o)
{
	struct lease_read_waiter	*w;
	struct lease_read		*rd;

	if ((rd = o->read) != NULL) {
		w = lease_read_waiter_of(rd, l, (uint32_t)(o - l->objs));
		w->lease = NULL;
		if (--rd->nlive == 0 && !rd->cancelled) {
			/* Hashed still: a new admission of the key may take it up again. */
			rd->cancelled = 1;
			if (rd->job != NULL)
				atomic_store(&rd->job->cancel, 1);
		}
		o->read = NULL;
		l->reads--;
	} else if (o->id != DRAM_NONE)
		dram_unpin(s->dram, o->id);
	o->id = DRAM_NONE;
}

/* Drops the lease's pins. Idempotent. */
void
lease_unpin(struct server *s, struct lease *l)
{
	uint32_t	i;

	lease_release_slot(l);
	if (!l->pinned)
		return;
	for (i = 0; i < l->nobjs; i++)
		lease_obj_release(s, l, &l->objs[i]);
	l->pinned = 0;
}

/* Cuts a kv-only lease's promise to its first n pages. */
static void
lease_trim(struct server *s, struct lease *l, uint32_t n)
{
	uint32_t	i, j = 0;

	for (i = 0; i < l->nobjs; i++) {
		if (l->objs[i].page >= n) {
			lease_obj_release(s, l, &l->objs[i]);
			continue;
		}
		l->objs[j] = l->objs[i];
		if (l->objs[j].read != NULL)
			lease_read_waiter_of(l->objs[j].read, l, i)->obj = j;
		j++;
	}
	l->nobjs = j;
	l->npages = n;
}

/* The canonical slot stops being outstanding. Idempotent. */
void
lease_release_slot(struct lease *l)
{
	if (!l->slot_held)
		return;
	l->sess->slot_held[l->slot] = 0;
	l->slot_held = 0;
}

/* Frees a lease that has no copy in flight. */
void
lease_free(struct server *s, struct lease *l)
{
	if (l == NULL)
		return;
	lease_unpin(s, l);
	event_del(l->timer);
	TAILQ_REMOVE(&l->sess->leases, l, entry);
	if (l->adm != NULL) {
		if (l->adm->ranks[l->rank].lease == l)
			l->adm->ranks[l->rank].lease = NULL;
		/* The last lease of an answered admission takes it out of its group. */
		if (l->adm->refs == 2 && l->adm->group != NULL)
			admit_unlink(s, l->adm);
		admission_unref(s, l->adm);
	}
	metrics.leases_open--;
	session_unref(l->sess);
	free(l->parked);
	l->parked = NULL;
	if (lease_ncache < CACHE_MAX && l->objs_cap <= CACHE_PAGES) {
		TAILQ_INSERT_HEAD(&lease_cache, l, entry);
		lease_ncache++;
		return;
	}
	free(l->objs);
	free(l);
}

struct lease *
lease_find(const struct session *sess, uint64_t id)
{
	struct lease	*l;

	TAILQ_FOREACH(l, &sess->leases, entry)
		if (l->id == id)
			return l;
	return NULL;
}

/*
 * Stages (pool, page) from the file tier: pins the file, reserves a
 * WRITING DRAM object for it (the staging memory, reserved now so that
 * the promise never depends on memory found later) and starts the read.
 * 0, or -errno and nothing held: the promise must stop before this page.
 */
static int
lease_stage_one(struct server *s, struct lease *l, const struct obj_key *k,
    struct lease_obj *o)
{
	struct lease_read	*rd, **b;
	uint64_t		 len;
	uint32_t		 fid, did;
	uint8_t			*buf;
	int			 rc;

	if (!cache_file_ok(s, l->sess, o->pool))
		return -ENOENT;
	if (filetier_lookup(s->file, k, &fid, &len) != 0 ||
	    len != l->sess->ns->pools[o->pool].object_bytes)
		return -ENOENT;
	if ((rd = lease_read_find(k)) != NULL) {
		/*
		 * Being staged for another lease (a TP replica of this shard), or
		 * for one that let go of it just now: one read for both.
		 */
		if (lease_read_join(rd, l, l->nobjs) != 0)
			return -ENOMEM;
		if (rd->cancelled) {
			rd->cancelled = 0;
			if (rd->job != NULL)
				atomic_store(&rd->job->cancel, 0);
		}
		log_debug("lease", "session %u page %u shares a file tier read (%u waiters)",
		    l->sess->id, o->page, rd->nwait);
		o->id = rd->dram_id;
		o->read = rd;
		l->reads++;
		return 0;
	}
	if ((rd = calloc(1, sizeof(*rd))) == NULL)
		return -ENOMEM;
	if ((rc = filetier_pin(s->file, fid)) != 0)
		goto fail;
	/*
	 * -EEXIST: someone else is writing the key into DRAM (a publisher, or
	 * a read nobody waits for any more): not promised here.
	 */
	if ((rc = dram_alloc(s->dram, k, len, DRAM_NONE, &did, &buf)) != 0)
		goto unpin;
	/* O_DIRECT: dram.c aligns objects of 4 KiB multiples; check, never assume. */
	if (((uintptr_t)buf & 4095) != 0) {
		rc = -EINVAL;
		goto abort;
	}
	rd->server = s;
	rd->key = *k;
	rd->wait = rd->inl;
	rd->wait_cap = 2;
	(void)lease_read_join(rd, l, l->nobjs);		/* into inl: cannot fail */
	rd->dram_id = did;
	rd->file_id = fid;
	rd->buf = buf;
	rd->len = len;
	if ((rc = filetier_read(s->file, k, buf, FILETIER_READ_SIZE(len), lease_read_done, rd,
	    &rd->job)) != 0)
		goto abort;
	b = lease_read_bucket(k);
	rd->next = *b;
	*b = rd;
	o->id = did;
	o->read = rd;
	l->reads++;
	return 0;

abort:
	dram_abort(s->dram, did);
unpin:
	filetier_unpin(s->file, fid);
fail:
	free(rd);
	return rc;
}

/*
 * Pins the object of (pool, page) into the lease's next entry, from DRAM
 * or staged from the file tier; -errno where neither can promise it.
 */
static int
lease_pin_one(struct server *s, struct lease *l, const struct admission *a, unsigned pool,
    uint32_t page)
{
	struct lease_obj	*o = &l->objs[l->nobjs];
	struct obj_key		 k;

	cache_key(l->sess, pool, a->hashes + (size_t)page * PROTO_HASH_LEN, &k);
	o->pool = (uint16_t)pool;
	o->page = page;
	o->read = NULL;
	o->staged = 0;
	/* admit_answer() just found these on this same loop turn. */
	if (dram_lookup(s->dram, &k, &o->id) == 0) {
		dram_pin(s->dram, o->id);
		l->nobjs++;
		return 0;
	}
	/* Gone only where staging an earlier object evicted it: the promise stops. */
	if (lease_stage_one(s, l, &k, o) != 0)
		return -ENOENT;
	o->staged = 1;
	l->nobjs++;
	return 0;
}

/*
 * Makes rank r's lease over its first n pages, pinning every object the
 * restore needs: the KV pages, each sidecar's pages (all, or the last t),
 * and the checkpoint at exactly n pages. ids, when not NULL, holds the
 * DRAM objects admit_answer() found for the kv pool's pages on this loop
 * turn (DRAM_NONE where it found none), pinned without a second lookup.
 */
static struct lease *
lease_new(struct server *s, struct admission *a, uint16_t r, uint32_t n, const uint32_t *ids)
{
	struct session	*sess = a->ranks[r].sess;
	struct lease	*l;
	uint32_t	 i, max = 0, from, want = n;
	unsigned	 p;
	int		 hybrid = session_is_hybrid(sess);

	for (p = 0; p < sess->ns->layout.npools; p++)
		max += sess->ns->pools[p].kind == PROTO_POOL_STATE ? 1 : n;
	if ((l = lease_alloc(s, max)) == NULL)
		return NULL;
	l->sess = sess;
	for (p = 0; p < sess->ns->layout.npools && (!hybrid || n == want); p++) {
		const struct proto_pool *pl = &sess->ns->pools[p];

		if (pl->kind == PROTO_POOL_STATE) {
			if (lease_pin_one(s, l, a, p, n - 1) != 0)
				n = 0;
			continue;
		}
		from = pl->kind == PROTO_POOL_SIDECAR && pl->hit_policy == PROTO_HIT_TRAILING &&
		    n > pl->trailing ? n - pl->trailing : 0;
		for (i = from; i < n; i++) {
			if (ids != NULL && p == a->pool && ids[i] != DRAM_NONE &&
			    dram_pin(s->dram, ids[i]) == 0) {
				l->objs[l->nobjs].id = ids[i];
				l->objs[l->nobjs].pool = (uint16_t)p;
				l->objs[l->nobjs].page = i;
				l->objs[l->nobjs].staged = 0;
				l->objs[l->nobjs++].read = NULL;
				continue;
			}
			if (lease_pin_one(s, l, a, p, i) != 0)
				break;		/* kv-only with a file tier: the promise stops here */
		}
		if (i < n)
			n = i;
	}
	if (hybrid && n < want) {
		/*
		 * Only the stop point itself is legal, and an object of it could
		 * not be staged (DRAM full, or a file gone): this rank promises
		 * nothing, and so the group declines (admit_answer takes the
		 * shortest lease).
		 */
		for (i = 0; i < l->nobjs; i++)
			lease_obj_release(s, l, &l->objs[i]);
		l->nobjs = 0;
		n = 0;
	}
	l->slot = PROTO_SLOT_NONE;
	if (sess->slot_region >= 0 && session_pool_of(sess, PROTO_POOL_STATE) >= 0) {
		l->slot = a->ranks[r].slot;
		l->slot_held = 1;
		sess->slot_held[l->slot] = 1;
	}
	l->pinned = 1;
	l->id = ++s->next_lease;
	l->adm = a;
	a->refs++;
	l->rank = r;
	session_ref(sess);
	l->state = LEASE_ADMITTED;
	l->npages = n;
	TAILQ_INSERT_TAIL(&sess->leases, l, entry);
	metrics.leases_open++;
	lease_arm_ttl(s, l);
	return l;
}

static void
admit_reply_rank(struct admission *a, uint16_t r)
{
	struct proto_admit_reply	reply = a->reply;
	struct admit_rank		*ar = &a->ranks[r];

	reply.lease = ar->lease != NULL ? ar->lease->id : 0;
	session_reply(ar->sess, &ar->req, PROTO_S_OK, &reply, sizeof(reply));
}

/*
 * Answers every rank that asked, once. With decline == NONE the common
 * prefix is computed and pinned for every rank first.
 */
static void
admit_answer(struct server *s, struct admission *a, unsigned decline)
{
	uint32_t	hit = a->npages, reserved = UINT32_MAX, n, h, *ids = NULL;
	uint16_t	r;

	a->answered = 1;
	if (a->deadline != NULL)
		evtimer_del(a->deadline);
	for (r = 0; r < a->size; r++)
		if (a->ranks[r].asked && a->ranks[r].sess != NULL)
			a->ranks[r].sess->admits_waiting--;	/* no longer at the barrier */
	if (decline == PROTO_DECLINE_NONE) {
		for (r = 0; r < a->size; r++)
			if (a->ranks[r].reserved < reserved)
				reserved = a->ranks[r].reserved;
		if (session_is_hybrid(a->ranks[0].sess)) {
			n = admit_stop_point(s, a, reserved, &hit);
		} else {
			/* The objects found are pinned below without a second lookup (or none: NULL). */
			ids = malloc((size_t)a->size * a->npages * sizeof(*ids));
			for (r = 0; r < a->size; r++) {
				h = cache_rank_hits_ids(s, a->ranks[r].sess, a->pool, a->hashes, hit,
				    ids != NULL ? ids + (size_t)r * a->npages : NULL);
				if (h < hit)
					hit = h;
			}
			n = hit < reserved ? hit : reserved;
		}
		a->reply.group_hit = hit;
		if (hit == 0)
			decline = PROTO_DECLINE_NO_HIT;
		else if (n == 0)
			decline = PROTO_DECLINE_NO_RESERVATION;
		else
			decline = admit_check_slots(a);
		if (decline == PROTO_DECLINE_NONE) {
			for (r = 0; r < a->size; r++) {
				a->ranks[r].lease = lease_new(s, a, r, n,
				    ids != NULL ? ids + (size_t)r * a->npages : NULL);
				if (a->ranks[r].lease == NULL)
					break;
				/*
				 * Staging from the file tier may evict: what later
				 * ranks found may be gone, so they look again.
				 */
				if (a->ranks[r].lease->reads > 0) {
					free(ids);
					ids = NULL;
				}
			}
			/*
			 * Staging from the file tier may have cut a rank's lease
			 * short (DRAM full, a file gone): every rank gets the
			 * shortest, and none at all means no reservation.
			 */
			if (r == a->size) {
				for (r = 0; r < a->size; r++)
					if (a->ranks[r].lease->npages < n)
						n = a->ranks[r].lease->npages;
				for (r = 0; n > 0 && r < a->size; r++)
					if (a->ranks[r].lease->npages > n)
						lease_trim(s, a->ranks[r].lease, n);
				r = a->size;
			}
			if (r < a->size || n == 0) {
				/*
				 * Out of memory or nothing stageable: take back what
				 * was made. Each lease lets go of the admission first:
				 * lease_free would unlink an answered admission from
				 * its group with its last lease, and free it under us.
				 */
				while (r-- > 0) {
					struct lease *l = a->ranks[r].lease;

					a->ranks[r].lease = NULL;
					l->adm = NULL;
					a->refs--;
					lease_free(s, l);
				}
				decline = PROTO_DECLINE_NO_RESERVATION;
			} else
				a->reply.admitted_pages = n;
		}
	}
	free(ids);
	a->reply.decline = (uint16_t)decline;
	a->reply.ttl_ms = s->cfg->lease_ttl_ms;
	if (decline == PROTO_DECLINE_NONE) {
		metrics.admits_admitted += a->size;
		metrics.admit_pages += (uint64_t)a->reply.admitted_pages * a->size;
	} else
		metrics.admits_declined[decline] += a->nasked;
	for (r = 0; r < a->size; r++)
		if (a->ranks[r].asked)
			admit_reply_rank(a, r);
	log_debug("admit", "request %llu: %u of %u pages admitted for %u ranks (decline %u)",
	    (unsigned long long)a->request_id, a->reply.admitted_pages, a->npages, a->size,
	    decline);
	/* A declined admission holds nothing; an admitted one lives with its leases. */
	if (decline != PROTO_DECLINE_NONE)
		admit_unlink(s, a);
}

static void
admit_deadline_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct admission	*a = arg;
	struct server		*s = NULL;
	uint16_t		 r;

	(void)fd;
	(void)ev;
	for (r = 0; r < a->size && s == NULL; r++)
		if (a->ranks[r].sess != NULL)
			s = a->ranks[r].sess->server;
	log_info("admit", "request %llu: %u of %u ranks asked by the deadline; declined for all",
	    (unsigned long long)a->request_id, a->nasked, a->size);
	admit_answer(s, a, PROTO_DECLINE_GROUP_TIMEOUT);
}

static struct admission *
admit_new(struct server *s, struct rank_group *g, uint64_t request_id, unsigned pool,
    uint32_t npages, const uint8_t *hashes)
{
	struct admission	*a;
	struct timeval		 tv;

	if ((a = admission_alloc(g->size, npages)) == NULL)
		return NULL;
	/* A one-rank group is answered at once: no barrier, no timer. */
	if (g->size > 1)
		a->deadline = evtimer_new(s->base, admit_deadline_cb, a);
	if (g->size > 1 && a->deadline == NULL) {
		a->refs = 1;
		a->size = 0;
		admission_unref(s, a);
		return NULL;
	}
	memcpy(a->hashes, hashes, (size_t)npages * PROTO_HASH_LEN);
	a->request_id = request_id;
	a->pool = pool;
	a->group = g;
	a->size = g->size;
	a->npages = npages;
	a->refs = 1;	/* the group's list */
	TAILQ_INSERT_TAIL(&g->admissions, a, entry);
	if (a->deadline != NULL) {
		tv.tv_sec = s->cfg->admit_timeout_ms / 1000;
		tv.tv_usec = (s->cfg->admit_timeout_ms % 1000) * 1000;
		evtimer_add(a->deadline, &tv);
	}
	return a;
}

void
admit_request(struct conn *c, struct proto_frame *f)
{
	struct proto_admit	 p;
	struct session		*sess = c->session;
	struct server		*s = c->server;
	struct admission	*a;
	struct admit_rank	*ar;
	const uint8_t		*hashes = f->payload + sizeof(p);
	char			 err[128];
	int			 pool;

	memcpy(&p, f->payload, sizeof(p));
	if ((pool = session_pool_of(sess, PROTO_POOL_KV)) < 0) {
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID, "ADMIT: the layout has no kv pool");
		return;
	}
	if (p.flags != 0 || p.npages == 0) {
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID, "ADMIT: %s",
		    p.flags != 0 ? "unknown flags" : "no pages");
		return;
	}
	if (cache_hashes_ok(sess, hashes, p.npages, err, sizeof(err)) != 0) {
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID, "ADMIT: %s", err);
		return;
	}
	metrics.admits++;
	a = admit_find(sess->group, p.request_id);
	/*
	 * Each waiting admission holds its hashes (up to 2 MiB) and a timer:
	 * a rank may keep admit.max_waiting of them at its group's barrier
	 * (issue 11 item 6: 300 of them held 596 MiB). Asking again for one
	 * it already waits on, or for an answered one, is not a new one.
	 */
	if (sess->group->size > 1 && (a == NULL || (!a->answered &&
	    !a->ranks[sess->group_rank].asked)) &&
	    sess->admits_waiting >= s->cfg->admit_max_waiting) {
		metrics.admits_limited++;
		conn_reply_error(c, &f->hdr, PROTO_S_LIMIT, "ADMIT: %u admissions of this rank are "
		    "already waiting for their group (admit.max_waiting)", sess->admits_waiting);
		return;
	}
	if (a == NULL) {
		a = admit_new(s, sess->group, p.request_id, (unsigned)pool, p.npages, hashes);
		if (a == NULL) {
			conn_reply_error(c, &f->hdr, PROTO_S_NO_MEMORY, "ADMIT: out of memory");
			return;
		}
	}
	ar = &a->ranks[sess->group_rank];
	if (a->answered) {
		/* Idempotent: the same answer again, for this rank. */
		ar->req = f->hdr;
		if (ar->sess == NULL) {
			conn_reply_error(c, &f->hdr, PROTO_S_NOT_FOUND,
			    "ADMIT: request %llu was answered without this rank",
			    (unsigned long long)p.request_id);
			return;
		}
		if (ar->lease == NULL && a->reply.decline == PROTO_DECLINE_NONE) {
			conn_reply_error(c, &f->hdr, PROTO_S_NOT_FOUND,
			    "ADMIT: this rank's lease of request %llu is already gone",
			    (unsigned long long)p.request_id);
			return;
		}
		admit_reply_rank(a, sess->group_rank);
		return;
	}
	if (p.npages != a->npages ||
	    memcmp(hashes, a->hashes, (size_t)p.npages * PROTO_HASH_LEN) != 0) {
		/* Ranks of one request must ask for the same prefix. */
		if (!ar->asked) {
			ar->sess = sess;
			session_ref(sess);
			ar->asked = 1;
			a->nasked++;
			sess->admits_waiting++;	/* until admit_answer, just below */
		} else {
			session_reply_error(sess, &ar->req, PROTO_S_BUSY,
			    "ADMIT: superseded by seq %llu", (unsigned long long)f->hdr.seq);
		}
		ar->req = f->hdr;
		admit_answer(s, a, PROTO_DECLINE_GROUP_MISMATCH);
		return;
	}
	if (ar->asked) {
		/* Asked again while waiting: the newer request gets the answer. */
		session_reply_error(sess, &ar->req, PROTO_S_BUSY, "ADMIT: superseded by seq %llu",
		    (unsigned long long)f->hdr.seq);
		ar->req = f->hdr;
		return;
	}
	ar->sess = sess;
	session_ref(sess);
	ar->asked = 1;
	ar->req = f->hdr;
	ar->reserved = p.reserved_pages;
	ar->slot = p.state_slot;
	a->nasked++;
	sess->admits_waiting++;
	if (s->stopping)
		admit_answer(s, a, PROTO_DECLINE_SHUTTING_DOWN);
	else if (a->nasked == a->size)
		admit_answer(s, a, PROTO_DECLINE_NONE);
}

/* A rank leaves: admissions still waiting for the group decline now. */
void
admit_session_closing(struct session *sess)
{
	struct rank_group	*g = sess->group;
	struct admission	*a, *next;

	for (a = TAILQ_FIRST(&g->admissions); a != NULL; a = next) {
		next = TAILQ_NEXT(a, entry);
		if (a->answered)
			continue;
		if (a->ranks[sess->group_rank].asked) {
			a->ranks[sess->group_rank].asked = 0;	/* nobody to answer there */
			sess->admits_waiting--;
		}
		admit_answer(sess->server, a, PROTO_DECLINE_RANK_LEFT);
	}
}

/* The group's last rank left: its admissions live on with their leases. */
void
admit_group_gone(struct server *s, struct rank_group *g)
{
	struct admission	*a;

	while ((a = TAILQ_FIRST(&g->admissions)) != NULL)
		admit_unlink(s, a);
}

void
release_request(struct conn *c, struct proto_frame *f)
{
	struct proto_lease_op	 op;
	struct lease		*l;

	memcpy(&op, f->payload, sizeof(op));
	if ((l = lease_find(c->session, op.lease)) == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_NOT_FOUND, "RELEASE: no lease %llu",
		    (unsigned long long)op.lease);
		return;
	}
	if (l->state == LEASE_RESTORING || l->state == LEASE_COPIED) {
		conn_reply_error(c, &f->hdr, PROTO_S_BUSY,
		    "RELEASE: lease %llu is restoring; CANCEL it first", (unsigned long long)op.lease);
		return;
	}
	metrics.releases++;
	/*
	 * The other ranks of the group cannot complete without this one, and
	 * a RESTORE parked for file tier reads is answered. A one-rank lease
	 * with neither just goes.
	 */
	if (l->state == LEASE_ADMITTED && l->adm != NULL &&
	    (l->adm->size > 1 || l->restore_waiting))
		restore_fail_group(c->server, l->adm, PROTO_S_CANCELLED,
		    "a rank of the group released its lease");
	lease_free(c->server, l);
	conn_reply(c, &f->hdr, PROTO_S_OK, NULL, 0);
}
