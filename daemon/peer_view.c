/*
 * The peer tier's placement and its view of what other daemons hold.
 *
 * Placement is rendezvous (highest random weight) hashing, as memcached
 * clients and CARP do it, with no directory: the homes of an object are
 * the members with the highest scores hash(member id, placement key),
 * where the placement key is the object's key with the page hash of the
 * first page of its stripe (stripe_pages pages of one request) in place
 * of its own, so that a prefix lands on a few homes and the DCP shards of
 * one prefix (their keys differ in the shard) on different ones. Every
 * daemon computes the same homes from the same member list; a member that
 * joins or leaves moves only the keys it wins or held (about 1/n of
 * them). A view that is stale makes misses, never wrong bytes: every
 * pulled object is verified.
 *
 * A view (struct peer_view) is what a round of questions to the homes
 * found: per key, where its owner keeps it (and, for a lease, under which
 * owner lease). peer.c fills one for a PROBE or an ADMIT and makes it the
 * server's current view (s->peer_view) while the cache's synchronous
 * questions run (cache.c, staging.c read it), then drops it. Loop thread
 * only; no side effects on anything but the view itself.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "daemon.h"

/* A member's score for a placement key: the same on every daemon, whatever its start. */
uint64_t
peer_hrw_score(const char *id, const struct obj_key *pk)
{
	return XXH3_64bits_withSeed(pk, sizeof(*pk), XXH3_64bits(id, strlen(id)));
}

/*
 * The placement key of a page: its key with the hash of its stripe's
 * first page (head, PROTO_HASH_LEN bytes).
 */
void
peer_place_key(const struct obj_key *k, const uint8_t *head, struct obj_key *pk)
{
	*pk = *k;
	memcpy(pk->hash, head, sizeof(pk->hash));
}

/*
 * The indices in m[0..n) of the `want` homes of placement key pk, best
 * first, into out; returns how many (fewer with fewer members). Ties (a
 * 64-bit collision) go to the smaller id, so that every daemon agrees.
 */
unsigned
peer_homes(const struct peer_member *m, size_t n, const struct obj_key *pk, unsigned want,
    unsigned *out)
{
	uint64_t	best[PEER_REPLICAS_MAX] = { 0 }, sc;
	unsigned	got = 0, j, k;
	size_t		i;

	if (want > PEER_REPLICAS_MAX)
		want = PEER_REPLICAS_MAX;
	for (i = 0; i < n; i++) {
		sc = peer_hrw_score(m[i].id, pk);
		for (j = 0; j < got; j++)
			if (sc > best[j] || (sc == best[j] && strcmp(m[i].id, m[out[j]].id) < 0))
				break;
		if (j >= want)
			continue;
		if (got < want)
			got++;
		for (k = got - 1; k > j; k--) {
			best[k] = best[k - 1];
			out[k] = out[k - 1];
		}
		best[j] = sc;
		out[j] = (unsigned)i;
	}
	return got;
}

static struct peer_grant **
peer_view_bucket(const struct peer_view *v, const struct obj_key *k)
{
	return &v->buckets[XXH3_64bits(k, sizeof(*k)) & (v->nbuckets - 1)];
}

/* An empty view sized for about n keys; 0 or -ENOMEM. */
int
peer_view_init(struct peer_view *v, size_t n)
{
	memset(v, 0, sizeof(*v));
	v->nbuckets = 64;
	while (v->nbuckets < n && v->nbuckets < (1U << 20))
		v->nbuckets <<= 1;
	if ((v->buckets = calloc(v->nbuckets, sizeof(*v->buckets))) == NULL)
		return -ENOMEM;
	return 0;
}

/* The grant for k, or NULL; no side effects. */
struct peer_grant *
peer_view_find(const struct peer_view *v, const struct obj_key *k)
{
	struct peer_grant	*g;

	if (v == NULL || v->buckets == NULL)
		return NULL;
	for (g = *peer_view_bucket(v, k); g != NULL; g = g->next)
		if (memcmp(&g->key, k, sizeof(*k)) == 0)
			return g;
	return NULL;
}

/* A copy of g under its key; a key held already keeps its first grant (-EEXIST). */
int
peer_view_add(struct peer_view *v, const struct peer_grant *g)
{
	struct peer_grant	*n, **b;

	if (peer_view_find(v, &g->key) != NULL)
		return -EEXIST;
	if ((n = malloc(sizeof(*n))) == NULL)
		return -ENOMEM;
	*n = *g;
	b = peer_view_bucket(v, &g->key);
	n->next = *b;
	*b = n;
	v->n++;
	return 0;
}

/* Frees every grant, calling drop (unless NULL) on each first. */
void
peer_view_fini(struct peer_view *v, void (*drop)(struct peer_grant *))
{
	struct peer_grant	*g, *next;
	unsigned		 i;

	if (v->buckets == NULL)
		return;
	for (i = 0; i < v->nbuckets; i++)
		for (g = v->buckets[i]; g != NULL; g = next) {
			next = g->next;
			if (drop != NULL)
				drop(g);
			free(g);
		}
	free(v->buckets);
	v->buckets = NULL;
	v->n = 0;
}
