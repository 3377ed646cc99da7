/*
 * Cache keys and the side-effect-free questions: which object a rank's
 * page is, how long a prefix a rank or its whole group holds, PROBE, and
 * the test-only DEBUG request.
 *
 * An object's key is (the rank's namespace fingerprint, pool, shard, page
 * hash): the fingerprint carries the layout, so another layout is a miss
 * by construction (docs/contract.md, item 1). PROBE only calls
 * dram_lookup() and filetier_lookup(), which move nothing, not even an
 * LRU (docs/contract.md, item 2).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

/*
 * The shard is the rank whose slice an object is: recurrent state belongs
 * to its TP owner; KV and sidecars to the DCP rank under MLA (so the TP
 * replicas of a DCP shard write one object between them) and to the TP
 * rank otherwise.
 */
void
cache_key(const struct session *sess, unsigned pool, const uint8_t *hash, struct obj_key *k)
{
	memset(k, 0, sizeof(*k));
	memcpy(k->fingerprint, sess->ns->fingerprint, sizeof(k->fingerprint));
	k->pool = (uint8_t)pool;
	k->shard = sess->ns->pools[pool].kind == PROTO_POOL_STATE ? sess->tp_rank : sess->shard;
	memcpy(k->hash, hash, PROTO_HASH_LEN);
}

/*
 * Whether a peer said it holds k (the view of the PROBE or ADMIT being
 * answered, s->peer_view): a lease's grant of the pool's length, or a
 * PROBE's presence. No side effects.
 */
static int
cache_peer_has(const struct server *s, const struct session *sess, unsigned pool,
    const struct obj_key *k)
{
	const struct peer_grant	*g;

	if (s->peer_view == NULL || (g = peer_view_find(s->peer_view, k)) == NULL)
		return 0;
	return g->len == UINT64_MAX || g->len == sess->ns->pools[pool].object_bytes;
}

/*
 * One object held in DRAM, by a peer (while its answer is counted) or,
 * where its pool allows, in the file tier; no side effects.
 */
static int
cache_has(struct server *s, const struct session *sess, unsigned pool, const uint8_t *hashes,
    uint32_t page)
{
	struct obj_key	k;
	uint64_t	len;
	uint32_t	id;

	cache_key(sess, pool, hashes + (size_t)page * PROTO_HASH_LEN, &k);
	if (dram_lookup(s->dram, &k, &id) == 0 || cache_peer_has(s, sess, pool, &k))
		return 1;
	return cache_file_ok(s, sess, pool) && filetier_lookup(s->file, &k, &id, &len) == 0 &&
	    len == sess->ns->pools[pool].object_bytes;
}

/*
 * Clears legal[p] (1 <= p <= n) wherever one rank cannot stop after p
 * pages: it lacks a KV page before p, the checkpoint at exactly p, or a
 * sidecar page its hit policy needs (all pages before p, or the last t).
 */
static void
cache_rank_stops(struct server *s, const struct session *sess, const uint8_t *hashes, uint32_t n,
    uint8_t *legal)
{
	const struct ns	*ns = sess->ns;
	uint32_t	 p, k, q;
	unsigned	 i;

	for (i = 0; i < ns->layout.npools; i++) {
		const struct proto_pool *pl = &ns->pools[i];

		switch (pl->kind == PROTO_POOL_SIDECAR && pl->hit_policy == PROTO_HIT_TRAILING ?
		    0 : pl->kind) {
		case PROTO_POOL_KV:
		case PROTO_POOL_SIDECAR:	/* all_pages: a contiguous prefix, like kv */
			k = cache_rank_hits(s, sess, i, hashes, n);
			for (p = k + 1; p <= n; p++)
				legal[p] = 0;
			break;
		case PROTO_POOL_STATE:
			for (p = 1; p <= n; p++)
				if (legal[p] && !cache_has(s, sess, i, hashes, p - 1))
					legal[p] = 0;
			break;
		case 0:				/* trailing_pages(t) */
			for (p = 1; p <= n; p++) {
				if (!legal[p])
					continue;
				for (q = p > pl->trailing ? p - pl->trailing : 0; q < p; q++) {
					if (!cache_has(s, sess, i, hashes, q)) {
						legal[p] = 0;
						break;
					}
				}
			}
			break;
		}
	}
}

/*
 * The legal stop points common to every rank: an intersection, never the
 * minimum of per-rank maxima (docs/contract.md, item 4). legal has n+1
 * entries; returns the largest common stop point, 0 when there is none.
 */
uint32_t
cache_group_stops(struct server *s, struct session *const *ranks, unsigned nranks,
    const uint8_t *hashes, uint32_t n, uint8_t *legal)
{
	uint32_t	p;
	unsigned	r;

	legal[0] = 0;
	memset(legal + 1, 1, n);
	for (r = 0; r < nranks; r++)
		if (ranks[r] != NULL && ranks[r]->ns != NULL)
			cache_rank_stops(s, ranks[r], hashes, n, legal);
	for (p = n; p > 0; p--)
		if (legal[p])
			return p;
	return 0;
}

/*
 * Hashes shorter than 32 bytes are zero-padded: non-zero padding means
 * the engine and the layout disagree on the scheme, which must not
 * silently become another key.
 */
int
cache_hashes_ok(const struct session *sess, const uint8_t *hashes, uint32_t n, char *err,
    size_t errlen)
{
	unsigned	len = sess->ns->layout.hash_len, j;
	uint32_t	i;

	if (len >= PROTO_HASH_LEN)
		return 0;
	for (i = 0; i < n; i++) {
		for (j = len; j < PROTO_HASH_LEN; j++) {
			if (hashes[(size_t)i * PROTO_HASH_LEN + j] != 0) {
				snprintf(err, errlen, "hash %u: bytes past hash_len %u must be zero", i,
				    len);
				return -EINVAL;
			}
		}
	}
	return 0;
}

/*
 * The longest contiguous prefix of visible objects one rank holds. Keys
 * go to the index in batches so that their cache misses overlap; a batch
 * with a miss ends the DRAM prefix, which the file tier may continue.
 */
#define CACHE_BATCH	64

/*
 * Whether a pool's objects may come from the file tier: KV pages, sidecar
 * pages and checkpoints alike, when they are whole 4 KiB blocks, so that
 * a DRAM object can take an O_DIRECT read (dram.c aligns those). Other
 * pools are served from DRAM only (their files are written all the same);
 * in a hybrid layout a stop point that needs one of their objects outside
 * DRAM is then simply not a stop point.
 */
int
cache_file_ok(const struct server *s, const struct session *sess, unsigned pool)
{
	const struct proto_pool	*p = &sess->ns->pools[pool];

	return s->file != NULL && p->object_bytes > 0 && p->object_bytes % 4096 == 0 &&
	    p->object_bytes <= FILETIER_OBJ_MAX;
}

/*
 * Pages from `from` on held in DRAM, by a peer (while its answer is
 * counted) or, where allowed, in the file tier: the tiers in that order.
 * No side effects.
 */
static uint32_t
cache_rank_hits_file(struct server *s, const struct session *sess, unsigned pool,
    const uint8_t *hashes, uint32_t from, uint32_t n)
{
	struct obj_key	k;
	uint64_t	len;
	uint32_t	id, p;
	int		file = cache_file_ok(s, sess, pool);

	if (!file && s->peer_view == NULL)
		return from;
	for (p = from; p < n; p++) {
		cache_key(sess, pool, hashes + (size_t)p * PROTO_HASH_LEN, &k);
		if (dram_lookup(s->dram, &k, &id) == 0 || cache_peer_has(s, sess, pool, &k))
			continue;
		if (!file || filetier_lookup(s->file, &k, &id, &len) != 0 ||
		    len != sess->ns->pools[pool].object_bytes)
			break;
	}
	return p;
}

/*
 * The keys of pages [0, n) that local DRAM lacks, for every attached rank
 * of ranks and each pool (only `pool` unless all_pools), with each one's
 * placement head: the hash of the first page of its stripe for KV pages,
 * its own for a checkpoint or a sidecar page (published one at a time, at
 * any position): what to ask the peer tier's homes. 0, or -ENOMEM;
 * *nkeys may be 0.
 */
int
cache_peer_keys(struct server *s, struct session *const *ranks, unsigned nranks, unsigned pool,
    int all_pools, const uint8_t *hashes, uint32_t n, struct obj_key **keysp, uint8_t **headsp,
    size_t *nkeys)
{
	struct obj_key	*keys = NULL, k;
	uint8_t		*heads = NULL;
	size_t		 cap = 0, m = 0;
	uint32_t	 p, id, head, stripe = s->cfg->peer_stripe_pages;
	unsigned	 r, q;

	*keysp = NULL;
	*headsp = NULL;
	*nkeys = 0;
	for (r = 0; r < nranks; r++) {
		const struct session *sess = ranks[r];

		if (sess == NULL || sess->ns == NULL)
			continue;
		for (q = 0; q < sess->ns->layout.npools; q++) {
			if (!all_pools && q != pool)
				continue;
			for (p = 0; p < n; p++) {
				cache_key(sess, q, hashes + (size_t)p * PROTO_HASH_LEN, &k);
				if (dram_lookup(s->dram, &k, &id) == 0)
					continue;
				if (m == cap) {
					struct obj_key	*nk;
					uint8_t		*nh;

					cap = cap == 0 ? 64 : cap * 2;
					nk = realloc(keys, cap * sizeof(*keys));
					if (nk != NULL)
						keys = nk;
					nh = realloc(heads, cap * PROTO_HASH_LEN);
					if (nh != NULL)
						heads = nh;
					if (nk == NULL || nh == NULL) {
						free(keys);
						free(heads);
						return -ENOMEM;
					}
				}
				keys[m] = k;
				/* Stripes for KV pages; a checkpoint or sidecar page alone. */
				head = sess->ns->pools[q].kind == PROTO_POOL_KV ? p - p % stripe : p;
				memcpy(heads + m * PROTO_HASH_LEN, hashes + (size_t)head * PROTO_HASH_LEN,
				    PROTO_HASH_LEN);
				m++;
			}
		}
	}
	*keysp = keys;
	*headsp = heads;
	*nkeys = m;
	return 0;
}

uint32_t
cache_rank_hits(struct server *s, const struct session *sess, unsigned pool,
    const uint8_t *hashes, uint32_t n)
{
	return cache_rank_hits_ids(s, sess, pool, hashes, n, NULL);
}

/*
 * cache_rank_hits, and where ids is not NULL (n entries) the DRAM object
 * of each page of the DRAM prefix, DRAM_NONE from the first page found
 * elsewhere or nowhere: ADMIT pins those without looking them up again.
 */
uint32_t
cache_rank_hits_ids(struct server *s, const struct session *sess, unsigned pool,
    const uint8_t *hashes, uint32_t n, uint32_t *ids)
{
	struct obj_key	keys[CACHE_BATCH];
	uint32_t	found[CACHE_BATCH], done = 0, m, i;

	while (done < n) {
		m = n - done < CACHE_BATCH ? n - done : CACHE_BATCH;
		for (i = 0; i < m; i++)
			cache_key(sess, pool, hashes + (size_t)(done + i) * PROTO_HASH_LEN, &keys[i]);
		if (dram_lookup_many(s->dram, keys, m, found) == m) {
			if (ids != NULL)
				memcpy(ids + done, found, m * sizeof(*found));
			done += m;
			continue;
		}
		for (i = 0; i < m && found[i] != DRAM_NONE; i++)
			;
		if (ids != NULL) {
			memcpy(ids + done, found, i * sizeof(*found));
			memset(ids + done + i, 0xff, (size_t)(n - done - i) * sizeof(*ids));
		}
		return cache_rank_hits_file(s, sess, pool, hashes, done + i, n);
	}
	return n;
}

/*
 * The prefix every attached rank of the session's group holds, for the
 * same page hashes: each rank looks in its own namespace and shard. The
 * pool is named by index, the same for every rank (one layout schema).
 */
uint32_t
cache_group_hits(struct server *s, const struct session *sess, unsigned pool,
    const uint8_t *hashes, uint32_t n)
{
	struct rank_group	*g = sess->group;
	uint32_t		 hit = n, h;
	unsigned		 r;

	for (r = 0; r < g->size && hit > 0; r++) {
		const struct session *m = g->members[r];

		if (m == NULL || m->ns == NULL || pool >= m->ns->layout.npools)
			continue;
		h = cache_rank_hits(s, m, pool, hashes, hit);
		if (h < hit)
			hit = h;
	}
	return hit;
}

/* PROBE for a hybrid layout: the legal stop points follow the reply. */
static void
cache_probe_stops(struct session *sess, const struct proto_hdr *hdr, const struct proto_probe *p,
    const uint8_t *hashes)
{
	struct proto_probe_reply	*r;
	struct server			*s = sess->server;
	uint8_t				*legal, *buf;
	uint32_t			*stops, i;

	legal = malloc((size_t)p->npages + 1);
	buf = malloc(sizeof(*r) + (size_t)p->npages * sizeof(uint32_t));
	if (legal == NULL || buf == NULL) {
		free(legal);
		free(buf);
		session_reply_error(sess, hdr, PROTO_S_NO_MEMORY, "PROBE: out of memory");
		return;
	}
	r = (struct proto_probe_reply *)(void *)buf;
	stops = (uint32_t *)(void *)(buf + sizeof(*r));
	r->hit_pages = cache_group_stops(s, sess->group->members, sess->group->size,
	    hashes, p->npages, legal);
	r->nstops = 0;
	for (i = 1; i <= p->npages; i++)
		if (legal[i])
			stops[r->nstops++] = i;
	session_reply(sess, hdr, PROTO_S_OK, buf, (uint32_t)(sizeof(*r) + r->nstops * 4));
	free(legal);
	free(buf);
}

/* The answer of a checked PROBE, from what the tiers (and s->peer_view) hold. */
static void
cache_probe_answer(struct session *sess, const struct proto_hdr *hdr, const struct proto_probe *p,
    const uint8_t *hashes)
{
	struct proto_probe_reply	r;

	memset(&r, 0, sizeof(r));
	if (!session_is_hybrid(sess)) {
		r.hit_pages = cache_group_hits(sess->server, sess, p->pool, hashes, p->npages);
		session_reply(sess, hdr, PROTO_S_OK, &r, sizeof(r));
		return;
	}
	cache_probe_stops(sess, hdr, p, hashes);
}

/*
 * A PROBE waiting for the peer tier's homes: its request, copied. It is
 * on its session's list until the answers came (cache_probe_peers_done)
 * or the session ended first (cache_probes_end).
 */
struct cache_probe_wait {
	struct session			*sess;	/* a reference */
	struct peer_ask			*ask;	/* borrowed: the peer tier frees it */
	uint64_t			 t0;	/* when the PROBE came (metrics_now_ns) */
	struct proto_hdr		 hdr;
	struct proto_probe		 p;
	TAILQ_ENTRY(cache_probe_wait)	 entry;	/* the session's probes */
	uint8_t				 hashes[];
};

static void
cache_probe_wait_free(struct cache_probe_wait *w)
{
	TAILQ_REMOVE(&w->sess->probes, w, entry);
	session_unref(w->sess);
	free(w);
}

/* The homes answered (or timed out): the session is still attached, or w is gone. */
static void
cache_probe_peers_done(struct server *s, void *arg, struct peer_view *v)
{
	struct cache_probe_wait	*w = arg;

	s->peer_view = v;
	cache_probe_answer(w->sess, &w->hdr, &w->p, w->hashes);
	s->peer_view = NULL;
	metrics_observe(METRICS_OP_PROBE, 0, w->t0);
	cache_probe_wait_free(w);
}

/*
 * The session ends while PROBEs wait for the homes: their answers are not
 * wanted (peer_ask_cancel: done never runs). At DETACH the connection
 * stays open and the engine reads on, so each is answered `state` now,
 * before the DETACH; once the connection closed, nobody is.
 */
void
cache_probes_end(struct session *sess, int detach)
{
	struct cache_probe_wait	*w;

	while ((w = TAILQ_FIRST(&sess->probes)) != NULL) {
		peer_ask_cancel(w->ask);
		if (detach)
			session_reply_error(sess, &w->hdr, PROTO_S_STATE, "PROBE: the session "
			    "detached before the peer tier's homes answered");
		cache_probe_wait_free(w);
	}
}

/*
 * With the peer tier: the pages DRAM lacks are asked of their homes
 * (PEER_PROBE: nothing pinned anywhere), and the answer waits for theirs;
 * a home that does not answer in time is a miss. 1 when it waits.
 */
static int
cache_probe_peers(struct server *s, struct session *sess, const struct proto_hdr *hdr,
    const struct proto_probe *p, const uint8_t *hashes, uint64_t t0)
{
	struct cache_probe_wait	*w;
	struct obj_key		*keys;
	uint8_t			*heads;
	size_t			 n;
	int			 rc;

	if (!peer_enabled(s))
		return 0;
	if (cache_peer_keys(s, sess->group->members, sess->group->size, p->pool,
	    session_is_hybrid(sess), hashes, p->npages, &keys, &heads, &n) != 0 || n == 0)
		return 0;
	if ((w = malloc(sizeof(*w) + (size_t)p->npages * PROTO_HASH_LEN)) == NULL) {
		free(keys);
		free(heads);
		return 0;
	}
	w->sess = sess;
	w->t0 = t0;
	w->hdr = *hdr;
	w->p = *p;
	memcpy(w->hashes, hashes, (size_t)p->npages * PROTO_HASH_LEN);
	rc = peer_ask(s, PEER_ASK_PROBE, keys, heads, n, cache_probe_peers_done, w, &w->ask);
	free(keys);
	free(heads);
	if (rc == 0) {
		free(w);
		return 0;
	}
	/* Answers come from the loop, never from inside peer_ask(). */
	session_ref(sess);
	TAILQ_INSERT_TAIL(&sess->probes, w, entry);
	return rc;
}

void
cache_probe(struct conn *c, struct proto_frame *f)
{
	struct proto_probe_reply	 r;
	struct proto_probe		 p;
	struct session			*sess = c->session;
	const uint8_t			*hashes = f->payload + sizeof(p);
	char				 err[128];
	uint64_t			 t0 = metrics_now_ns();

	memcpy(&p, f->payload, sizeof(p));
	if (p.flags != 0 || p.pool >= sess->ns->layout.npools) {
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID, "PROBE: pool %u or flags 0x%x invalid",
		    p.pool, p.flags);
		return;
	}
	if (cache_hashes_ok(sess, hashes, p.npages, err, sizeof(err)) != 0) {
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID, "PROBE: %s", err);
		return;
	}
	metrics.probes++;
	sess->m->probes++;
	if (!session_is_hybrid(sess)) {
		/* Everything local already: no question to the peers. */
		r.hit_pages = cache_group_hits(c->server, sess, p.pool, hashes, p.npages);
		if (r.hit_pages == p.npages || !cache_probe_peers(c->server, sess, &f->hdr, &p,
		    hashes, t0)) {
			r.nstops = 0;
			conn_reply(c, &f->hdr, PROTO_S_OK, &r, sizeof(r));
			metrics_observe(METRICS_OP_PROBE, 0, t0);
		}
		return;
	}
	if (!cache_probe_peers(c->server, sess, &f->hdr, &p, hashes, t0)) {
		cache_probe_stops(sess, &f->hdr, &p, hashes);
		metrics_observe(METRICS_OP_PROBE, 0, t0);
	}
}

/* DEBUG: drop or corrupt one of this session's objects (testing.debug_ops). */
void
cache_debug(struct conn *c, struct proto_frame *f)
{
	struct proto_debug	 d;
	struct obj_key		 k;
	struct session		*sess = c->session;
	uint8_t			*data;
	uint32_t		 id;

	if (!c->server->cfg->test_debug_ops) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE,
		    "DEBUG is refused unless testing.debug_ops is true");
		return;
	}
	memcpy(&d, f->payload, sizeof(d));
	if (d.op == PROTO_DEBUG_KILL_ENGINE) {
		if (cuda_kill_engine(c->server->cuda, sess->regions, sess->nregions) != 0) {
			conn_reply_error(c, &f->hdr, PROTO_S_STATE,
			    "DEBUG: this session has no GPU memory, so no copy engine");
			return;
		}
		log_warn("debug", "session %u: killed its cuda copy engine on request", sess->id);
		conn_reply(c, &f->hdr, PROTO_S_OK, NULL, 0);
		return;
	}
	if (d.pool >= sess->ns->layout.npools) {
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID, "DEBUG: no pool %u", d.pool);
		return;
	}
	cache_key(sess, d.pool, d.hash, &k);
	if (dram_lookup(c->server->dram, &k, &id) != 0) {
		conn_reply_error(c, &f->hdr, PROTO_S_NOT_FOUND, "DEBUG: no such object");
		return;
	}
	switch (d.op) {
	case PROTO_DEBUG_DROP:
		dram_drop(c->server->dram, id);
		log_warn("debug", "session %u: dropped an object on request", sess->id);
		break;
	case PROTO_DEBUG_CORRUPT:
		data = dram_data_mut(c->server->dram, id);
		data[0] ^= 0x5a;
		log_warn("debug", "session %u: corrupted an object on request", sess->id);
		break;
	default:
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID, "DEBUG: unknown op %u", d.op);
		return;
	}
	conn_reply(c, &f->hdr, PROTO_S_OK, NULL, 0);
}
