/*
 * ADMIT: the group barrier and the promise (docs/contract.md, item 3).
 *
 * ADMIT is a group barrier. The first rank to ask for a request id opens
 * an admission in its group; it is answered once every rank of the group
 * asked for the same id, or declined for all at admit.timeout_ms, or when
 * a rank leaves. The answer is computed once, on the loop thread, for the
 * whole group: the common prefix every rank holds in its own shard,
 * capped by the smallest reservation any rank made; the objects of every
 * rank are pinned in the same step (each rank's lease, lease.c), before
 * anything is answered, so the promise can never exceed what is pinned
 * and never changes after it.
 *
 * An admission lives while its group lists it (answered or not) and while
 * a lease holds it; ADMIT is idempotent per request id: asking again
 * returns the same answer while the admission lives.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "daemon.h"

/*
 * Freed admissions are kept for reuse, up to ADMIT_CACHE_MAX, with their
 * arrays (up to ADMIT_CACHE_PAGES pages, ADMIT_CACHE_RANKS ranks), so that
 * a warm ADMIT and RELEASE allocate nothing: a prefix's hash copy and
 * object array are too large for malloc's per-thread cache, and were most
 * of what the allocations cost (lease.c keeps leases the same way). Loop
 * thread only, like everything here.
 */
#define ADMIT_CACHE_MAX		64
#define ADMIT_CACHE_PAGES	1024
#define ADMIT_CACHE_RANKS	64
static struct admission_list	adm_cache = TAILQ_HEAD_INITIALIZER(adm_cache);
static unsigned			adm_ncache;

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

static void
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
	if (adm_ncache < ADMIT_CACHE_MAX && a->hashes_cap <= ADMIT_CACHE_PAGES &&
	    a->ranks_cap <= ADMIT_CACHE_RANKS) {
		TAILQ_INSERT_HEAD(&adm_cache, a, entry);
		adm_ncache++;
		return;
	}
	free(a->ranks);
	free(a->hashes);
	free(a);
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

/* A lease of a lets go of it: the last lease of an answered admission takes it out of its group. */
void
admission_lease_gone(struct server *s, struct admission *a)
{
	if (a->refs == 2 && a->group != NULL)
		admit_unlink(s, a);
	admission_unref(s, a);
}

/* The namespace's counters: every rank of an admission is in the same namespace. */
static struct metrics_ns *
admit_metrics(const struct admission *a)
{
	uint16_t	r;

	for (r = 0; r < a->size; r++)
		if (a->ranks[r].sess != NULL)
			return a->ranks[r].sess->m;
	return &metrics_ns[METRICS_NS_MAX];
}

/*
 * Counts an answer: admitted or declined per rank, and of the group hit
 * each rank was told, what the promise left out and why (hit beyond the
 * reservation, cut short while staging, declined whole).
 */
static void
admit_count(const struct admission *a, unsigned decline, uint32_t unstaged)
{
	struct metrics_ns	*m = admit_metrics(a);
	uint64_t		 hit = a->reply.group_hit, n = a->reply.admitted_pages;

	m->requested_pages += (uint64_t)a->npages * a->nasked;
	if (decline == PROTO_DECLINE_NONE) {
		metrics.admits_admitted += a->size;
		metrics.admit_pages += n * a->size;
		m->admitted += a->size;
		m->admitted_pages += n * a->size;
		m->hit_pages += hit * a->size;
		m->unfulfilled[METRICS_UNF_RESERVATION] += (hit - unstaged) * a->size;
		m->unfulfilled[METRICS_UNF_STAGING] += (unstaged - n) * a->size;
		return;
	}
	metrics.admits_declined[decline] += a->nasked;
	m->declined[decline] += a->nasked;
	m->hit_pages += hit * a->nasked;
	m->unfulfilled[METRICS_UNF_DECLINED] += hit * a->nasked;
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
	uint32_t	hit = a->npages, reserved = UINT32_MAX, n = 0, h, *ids = NULL;
	uint32_t	unstaged = 0;	/* the promise before staging cut it */
	uint16_t	r;
	int		asked = a->peer_ask != NULL;

	/* Declined while the owners were asked: their answers are not wanted. */
	if (asked) {
		peer_ask_cancel(a->peer_ask);
		a->peer_ask = NULL;
	}
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
		unstaged = n;
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
				if (a->ranks[r].lease->staging.inflight > 0) {
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
	admit_count(a, decline, unstaged);
	for (r = 0; r < a->size; r++)
		if (a->ranks[r].asked) {
			admit_reply_rank(a, r);
			metrics_observe(METRICS_OP_ADMIT, decline != PROTO_DECLINE_NONE,
			    a->ranks[r].asked_ns);
		}
	log_debug("admit", "request %llu: %u of %u pages admitted for %u ranks (decline %u)",
	    (unsigned long long)a->request_id, a->reply.admitted_pages, a->npages, a->size,
	    decline);
	/* A declined admission holds nothing; an admitted one lives with its leases. */
	if (decline != PROTO_DECLINE_NONE)
		admit_unlink(s, a);
	if (asked)
		admission_unref(s, a);	/* the ask's */
}

/* The owners answered (or timed out): the promise counts what they leased. */
static void
admit_peers_done(struct server *s, void *arg, struct peer_view *v)
{
	struct admission	*a = arg;

	a->peer_ask = NULL;
	s->peer_view = v;
	admit_answer(s, a, PROTO_DECLINE_NONE);
	s->peer_view = NULL;
	admission_unref(s, a);	/* the ask's */
}

/*
 * Every rank asked. With the peer tier, what DRAM lacks is first asked of
 * the owners (PEER_LEASE), so that the promise counts only what an owner
 * pinned for this daemon; the answer waits for theirs (peer.timeout_ms at
 * most: a late owner is a miss). Without it, or with nothing to ask, the
 * answer is computed now.
 */
static void
admit_ready(struct server *s, struct admission *a)
{
	struct session	*ranks[PROTO_GROUP_SIZE_MAX];
	struct obj_key	*keys;
	uint8_t		*heads;
	size_t		 n;
	uint16_t	 r;
	int		 rc;

	if (!peer_enabled(s)) {
		admit_answer(s, a, PROTO_DECLINE_NONE);
		return;
	}
	for (r = 0; r < a->size; r++)
		ranks[r] = a->ranks[r].sess;
	if (cache_peer_keys(s, ranks, a->size, a->pool, 1, a->hashes, a->npages, &keys, &heads,
	    &n) != 0 || n == 0) {
		admit_answer(s, a, PROTO_DECLINE_NONE);
		return;
	}
	a->refs++;	/* the ask's, until its answer or its cancel */
	rc = peer_ask(s, PEER_ASK_LEASE, keys, heads, n, admit_peers_done, a, &a->peer_ask);
	free(keys);
	free(heads);
	if (rc == 0) {
		a->refs--;
		admit_answer(s, a, PROTO_DECLINE_NONE);
		return;
	}
	if (a->deadline != NULL)
		evtimer_del(a->deadline);
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
	sess->m->admits++;
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
		sess->m->admits_limited++;
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
			ar->asked_ns = metrics_now_ns();
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
	ar->asked_ns = metrics_now_ns();
	ar->req = f->hdr;
	ar->reserved = p.reserved_pages;
	ar->slot = p.state_slot;
	a->nasked++;
	sess->admits_waiting++;
	if (s->stopping)
		admit_answer(s, a, PROTO_DECLINE_SHUTTING_DOWN);
	else if (a->nasked == a->size && a->peer_ask == NULL)
		admit_ready(s, a);
}

/*
 * A rank leaves: admissions still waiting for the group decline now,
 * rank_left. At DETACH (detach != 0, from dispatch_detach before its
 * reply) the connection stays open and the engine reads on, so the
 * rank's own waiting ADMITs are declined with the others', before the
 * DETACH is answered; once the connection closed, nobody is there to
 * answer. Either way nothing of the rank waits on after this: a later
 * session on the same connection never sees an answer of this one.
 */
void
admit_session_closing(struct session *sess, int detach)
{
	struct rank_group	*g = sess->group;
	struct admission	*a, *next;

	for (a = TAILQ_FIRST(&g->admissions); a != NULL; a = next) {
		next = TAILQ_NEXT(a, entry);
		if (a->answered)
			continue;
		if (!detach && a->ranks[sess->group_rank].asked) {
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
