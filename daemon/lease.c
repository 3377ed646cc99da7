/*
 * Leases: what one rank of an admission holds until it is done.
 *
 * admit.c makes a rank's lease (lease_new) over its own objects as it
 * answers the group: every object the restore needs is pinned in DRAM,
 * or staged into DRAM from a slower tier (staging.c), before the promise
 * is answered. A lease lives until RELEASE, its TTL (lease.ttl_ms without
 * a restore, or after one), a cancel, or its session's end; it holds a
 * reference on its admission (through which restore.c completes the
 * group) and on its session.
 *
 * restore.c drives a lease through RESTORE (its states, LEASE_*) and calls
 * down into this file; this file never calls up by name. What a lease's
 * end means above it goes through the hooks the top of the daemon set
 * once with lease_set_hooks: a lease the group still needs (its TTL ran
 * out, a RELEASE let go of it) fails the group's restore
 * (restore_fail_group), and a lease lets go of its admission
 * (admission_lease_gone).
 *
 * lease_list() is LIST's view of them (l3kvctl leases): what each lease
 * pins, for which session and process, since when, and its TTL left.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <jansson.h>

#include "daemon.h"

static void	lease_ttl_cb(evutil_socket_t, short, void *);

/*
 * Freed leases are kept for reuse, up to LEASE_CACHE_MAX, with their
 * object arrays (up to LEASE_CACHE_OBJS entries), so that a warm ADMIT
 * and RELEASE allocate nothing (admit.c does the same for admissions).
 * Loop thread only, like everything here.
 */
#define LEASE_CACHE_MAX		64
#define LEASE_CACHE_OBJS	1024
static struct lease_list	lease_cache = TAILQ_HEAD_INITIALIZER(lease_cache);
static unsigned			lease_ncache;

static struct lease_hooks	lease_hooks;

/* Set once at start-up (server.c), before any lease is made. */
void
lease_set_hooks(const struct lease_hooks *h)
{
	lease_hooks = *h;
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
		    (unsigned long long)l->id, l->ttl_ms);
		metrics.lease_expiries++;
		if (l->state != LEASE_READY) {
			/* The group cannot complete without this rank. */
			l->state = LEASE_EXPIRED;
			lease_hooks.group_fail(s, l->adm, PROTO_S_EXPIRED, "a lease of the group expired");
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
	/* A reload may change the TTL: libevent keeps a queue per duration (up to 256). */
	if ((ttl = event_base_init_common_timeout(s->base, &tv)) == NULL)
		ttl = &tv;
	evtimer_add(l->timer, ttl);
	l->ttl_ms = s->cfg->lease_ttl_ms;
	l->expires_ms = server_now_ms() + l->ttl_ms;
}

/* A DRAM hit just pinned: a pulled object no restore checked yet is marked for this one's. */
static void
lease_obj_hit(struct server *s, struct lease *l, struct lease_obj *o)
{
	o->unverified = (uint8_t)dram_unverified(s->dram, o->id);
	l->nunverified += o->unverified;
}

/* Lets go of one object: its pin, or its place in a read (cancelled when nobody waits). */
static void
lease_obj_release(struct server *s, struct lease *l, struct lease_obj *o)
{
	l->nunverified -= o->unverified;
	o->unverified = 0;
	if (o->read != NULL)
		staging_drop(l, o);
	else if (o->id != DRAM_NONE)
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
void
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
			staging_moved(l, i, j);
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

/*
 * A promise that did not all land, by why, as the lease ends: what a
 * READY answer left out (a deadline), or all of it (failed, cancelled,
 * expired, released unrestored). A lease admit.c takes back before its
 * answer (no adm) promised nothing.
 */
static void
lease_count_unfulfilled(const struct lease *l)
{
	uint64_t	*u = l->sess->m->unfulfilled;

	if (l->adm == NULL || l->npages == 0)
		return;
	if (l->ready)
		u[METRICS_UNF_DEADLINE] += l->npages - l->ready_pages;
	else if (l->state == LEASE_FAILED)
		u[METRICS_UNF_FAILED] += l->npages;
	else if (l->state == LEASE_CANCELLED)
		u[METRICS_UNF_CANCELLED] += l->npages;
	else if (l->state == LEASE_EXPIRED)
		u[METRICS_UNF_EXPIRED] += l->npages;
	else
		u[METRICS_UNF_RELEASED] += l->npages;
}

/* Frees a lease that has no copy in flight. */
void
lease_free(struct server *s, struct lease *l)
{
	if (l == NULL)
		return;
	lease_count_unfulfilled(l);
	lease_unpin(s, l);
	event_del(l->timer);
	TAILQ_REMOVE(&l->sess->leases, l, entry);
	if (l->adm != NULL) {
		if (l->adm->ranks[l->rank].lease == l)
			l->adm->ranks[l->rank].lease = NULL;
		lease_hooks.admission_gone(s, l->adm);
	}
	metrics.leases_open--;
	session_unref(l->sess);
	free(l->parked);
	l->parked = NULL;
	if (lease_ncache < LEASE_CACHE_MAX && l->objs_cap <= LEASE_CACHE_OBJS) {
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
 * Pins the object of (pool, page) into the lease's next entry, from DRAM
 * or staged from the file tier; -errno where neither can promise it.
 * batch: this page and the pool's pages the lease pins after it, for a
 * staged object's placement.
 */
static int
lease_pin_one(struct server *s, struct lease *l, const struct admission *a, unsigned pool,
    uint32_t page, uint32_t batch)
{
	struct lease_obj	*o = &l->objs[l->nobjs];
	struct obj_key		 k;

	cache_key(l->sess, pool, a->hashes + (size_t)page * PROTO_HASH_LEN, &k);
	o->pool = (uint16_t)pool;
	o->page = page;
	o->read = NULL;
	o->staged = 0;
	o->unverified = 0;
	o->from = 0;
	/* admit_answer() just found these on this same loop turn. */
	if (dram_lookup(s->dram, &k, &o->id) == 0) {
		dram_pin(s->dram, o->id);
		lease_obj_hit(s, l, o);
		l->nobjs++;
		return 0;
	}
	/*
	 * The tiers in order: a peer's DRAM (while an ADMIT counts what its
	 * owners leased, s->peer_view), then the file tier. Gone only where
	 * staging an earlier object evicted it: the promise stops.
	 */
	if (s->peer_view != NULL && staging_add(s, l, o, &k, STAGING_TIER_PEER, batch) == 0) {
		o->staged = 2;
		l->nobjs++;
		return 0;
	}
	if (staging_add(s, l, o, &k, STAGING_TIER_FILE, batch) != 0)
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
struct lease *
lease_new(struct server *s, struct admission *a, uint16_t r, uint32_t n, const uint32_t *ids)
{
	struct session	*sess = a->ranks[r].sess;
	struct lease	*l;
	uint32_t	 i, max = 0, from, want = n, miss_end, batch;
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
			if (lease_pin_one(s, l, a, p, n - 1, 1) != 0)
				n = 0;
			continue;
		}
		from = pl->kind == PROTO_POOL_SIDECAR && pl->hit_policy == PROTO_HIT_TRAILING &&
		    n > pl->trailing ? n - pl->trailing : 0;
		for (i = from, miss_end = from; i < n; i++) {
			if (ids != NULL && p == a->pool && ids[i] != DRAM_NONE &&
			    dram_pin(s->dram, ids[i]) == 0) {
				l->objs[l->nobjs].id = ids[i];
				l->objs[l->nobjs].pool = (uint16_t)p;
				l->objs[l->nobjs].page = i;
				l->objs[l->nobjs].staged = 0;
				l->objs[l->nobjs].from = 0;
				l->objs[l->nobjs].read = NULL;
				lease_obj_hit(s, l, &l->objs[l->nobjs++]);
				continue;
			}
			/*
			 * Staged objects are placed as a batch (dram_alloc): as many
			 * as DRAM lacked from here on where admit_answer() said so,
			 * else the rest of the pool's pages.
			 */
			batch = n - i;
			if (ids != NULL && p == a->pool) {
				if (i >= miss_end)
					for (miss_end = i + 1; miss_end < n && ids[miss_end] == DRAM_NONE;
					    miss_end++)
						;
				batch = miss_end - i;
			}
			if (lease_pin_one(s, l, a, p, i, batch) != 0)
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
	l->created_ms = server_now_ms();
	TAILQ_INSERT_TAIL(&sess->leases, l, entry);
	metrics.leases_open++;
	lease_arm_ttl(s, l);
	return l;
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
		lease_hooks.group_fail(c->server, l->adm, PROTO_S_CANCELLED,
		    "a rank of the group released its lease");
	lease_free(c->server, l);
	conn_reply(c, &f->hdr, PROTO_S_OK, NULL, 0);
}

static const char *
lease_state_name(int state)
{
	switch (state) {
	case LEASE_ADMITTED:	return "admitted";
	case LEASE_RESTORING:	return "restoring";
	case LEASE_COPIED:	return "copied";
	case LEASE_READY:	return "ready";
	case LEASE_FAILED:	return "failed";
	case LEASE_CANCELLED:	return "cancelled";
	case LEASE_EXPIRED:	return "expired";
	}
	return "?";
}

/* One lease for LIST: who holds it, what it pins, its age and TTL left (null while restoring). */
static json_t *
lease_json(const struct lease *l, uint64_t now)
{
	const struct session	*sess = l->sess;
	json_t			*o;
	uint32_t		 i, staging = 0;

	for (i = 0; i < l->nobjs; i++)
		if (l->objs[i].read != NULL)
			staging++;
	o = json_pack("{s:I, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:b, s:I, s:I}",
	    "id", (json_int_t)l->id, "session", (json_int_t)sess->id,
	    "request_id", (json_int_t)(l->adm != NULL ? l->adm->request_id : 0),
	    "rank", (json_int_t)l->rank, "state", lease_state_name(l->state),
	    "pages", (json_int_t)l->npages, "objects", (json_int_t)(l->pinned ? l->nobjs : 0),
	    "staging", (json_int_t)staging, "pinned", l->pinned,
	    "age_ms", (json_int_t)(now - l->created_ms), "ttl_ms", (json_int_t)l->ttl_ms);
	if (o == NULL)
		return NULL;
	json_object_set_new(o, "group", sess->group != NULL ? json_string(sess->group->id) :
	    json_null());
	json_object_set_new(o, "pid", sess->conn != NULL ? json_integer(sess->conn->pid) :
	    json_null());
	json_object_set_new(o, "uid", sess->conn != NULL ?
	    json_integer((json_int_t)sess->conn->uid) : json_null());
	json_object_set_new(o, "slot", l->slot != PROTO_SLOT_NONE ?
	    json_integer((json_int_t)l->slot) : json_null());
	json_object_set_new(o, "ttl_left_ms", l->state != LEASE_RESTORING && l->expires_ms > 0 ?
	    json_integer((json_int_t)(l->expires_ms > now ? l->expires_ms - now : 0)) :
	    json_null());
	return o;
}

/* The leases of every attached session, by connection then admission order. */
void
lease_list(struct server *s, json_t *array, size_t max, size_t *total)
{
	const struct conn	*c;
	const struct lease	*l;
	uint64_t		 now = server_now_ms();

	*total = 0;
	TAILQ_FOREACH(c, &s->conns, entry) {
		if (c->session == NULL)
			continue;
		TAILQ_FOREACH(l, &c->session->leases, entry) {
			if ((*total)++ < max)
				json_array_append_new(array, lease_json(l, now));
		}
	}
}
