/*
 * The index both tiers keep of their objects (dram.c, filetier.c): which
 * key names which record, which records are free, and in what order the
 * evictable ones were last used. The event loop thread alone calls it,
 * so there are no locks. It knows the first 64 bytes of a record (struct
 * index_rec: the key and three links) and the tier's state byte after
 * them: 0 for a free record, and one state that the tier calls visible.
 * Every other state, pins, lengths and every policy (what may be evicted,
 * where an LRU list lives) are the tier's.
 *
 * Structure:
 * - A record is INDEX_REC_SIZE (80) bytes, a tier's struct with index_rec
 *   first: the size is fixed so that finding a record by id costs a shift
 *   and a multiply by a constant, as it did in each tier. Records sit in
 *   blocks of INDEX_BLOCK, named by 32-bit ids: ids, not pointers, so that
 *   links are 4 bytes and blocks never move. A free record is zeros but
 *   its chain, which links the free list, so a tier's FREE state is 0.
 * - The hash is a power-of-two array of 32-bit bucket heads; the chain
 *   link lives in the record. Keys hash with XXH3 under a secret seed.
 *   Every state but FREE may be indexed (a tier indexes what it writes,
 *   so that a second writer of the key is refused): index_find sees them
 *   all, index_lookup only the visible ones.
 * - An LRU list is a head and a tail (struct index_lru) that the tier
 *   keeps where it wants: dram.c has one per size class, filetier.c one.
 *   A record is on one list at most, through lru_prev and lru_next.
 */
#include <sys/random.h>

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * Inlined: a 52-byte index key hashes in a few nanoseconds, less than the
 * call into the shared library costs; a PROBE or ADMIT hashes one key per
 * page. (The same XXH3, so hashes are unchanged.)
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon.h"

#define INDEX_BUCKETS_MIN	1024
#define INDEX_BATCH		16	/* keys whose cache misses index_lookup_many overlaps */

_Static_assert(sizeof(struct obj_key) == 52, "obj_key is compared with memcmp");
_Static_assert(sizeof(struct index_rec) == INDEX_STATE_OFF, "the tier's state byte follows index_rec");

/* Sets up an empty index whose lookups see the state visible: 0 or -ENOMEM. index_fini frees it. */
int
index_init(struct index *ix, uint8_t visible)
{
	assert(visible != 0);
	memset(ix, 0, sizeof(*ix));
	ix->visible = visible;
	ix->rec_free = INDEX_NONE;
	if ((ix->buckets = malloc(INDEX_BUCKETS_MIN * sizeof(*ix->buckets))) == NULL)
		return -ENOMEM;
	memset(ix->buckets, 0xff, INDEX_BUCKETS_MIN * sizeof(*ix->buckets));
	ix->nbuckets = INDEX_BUCKETS_MIN;
	/* A secret seed: clients choose page hashes, so they must not choose chains. */
	if (getrandom(&ix->seed, sizeof(ix->seed), GRND_NONBLOCK) != sizeof(ix->seed))
		ix->seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)ix;
	return 0;
}

/* Frees every record and the hash; idempotent, and fine on a zeroed index. */
void
index_fini(struct index *ix)
{
	uint32_t	i;

	for (i = 0; i < ix->nblocks; i++)
		free(ix->blocks[i]);
	free(ix->blocks);
	free(ix->buckets);
	memset(ix, 0, sizeof(*ix));
	ix->rec_free = INDEX_NONE;
}

uint64_t
index_hash(const struct index *ix, const struct obj_key *k)
{
	return XXH3_64bits_withSeed(k, sizeof(*k), ix->seed);
}

/* The chain walk of index_find and index_lookup, inlined in both. */
static inline uint32_t
index_chain_find(const struct index *ix, const struct obj_key *k, uint64_t h)
{
	const struct index_rec	*r;
	uint32_t		 id = ix->buckets[h & (ix->nbuckets - 1)];

	while (id != INDEX_NONE) {
		r = index_rec(ix, id);
		if (memcmp(&r->key, k, sizeof(*k)) == 0)
			return id;
		id = r->chain;
	}
	return INDEX_NONE;
}

static inline int
index_rec_state(const struct index_rec *r)
{
	return ((const uint8_t *)r)[INDEX_STATE_OFF];
}

uint32_t
index_find(const struct index *ix, const struct obj_key *k, uint64_t *hash)
{
	uint64_t	h = index_hash(ix, k);

	if (hash != NULL)
		*hash = h;
	return index_chain_find(ix, k, h);
}

/* O(1) and free of side effects: PROBE calls it. */
uint32_t
index_lookup(const struct index *ix, const struct obj_key *k)
{
	uint32_t	id = index_chain_find(ix, k, index_hash(ix, k));

	return id == INDEX_NONE || index_rec_state(index_rec(ix, id)) != ix->visible ? INDEX_NONE : id;
}

/*
 * index_lookup for n keys: ids[i] is the id of keys[i] or INDEX_NONE;
 * returns the number of hits. The same answers as n index_lookup calls,
 * but the cache misses of INDEX_BATCH keys overlap (bucket heads first,
 * then records), which is most of a lookup's cost once the index is
 * larger than the CPU caches.
 */
size_t
index_lookup_many(const struct index *ix, const struct obj_key *keys, size_t n, uint32_t *ids)
{
	uint64_t		 h[INDEX_BATCH];
	uint32_t		 id[INDEX_BATCH], mask = ix->nbuckets - 1;
	const struct index_rec	*r;
	size_t			 i, j, m, hits = 0;
	/* A copy: a byte may alias the stores to ids, so ix->visible would be read again each time. */
	const uint8_t		 visible = ix->visible;

	for (i = 0; i < n; i += m) {
		m = n - i < INDEX_BATCH ? n - i : INDEX_BATCH;
		for (j = 0; j < m; j++) {
			h[j] = index_hash(ix, &keys[i + j]);
			__builtin_prefetch(&ix->buckets[h[j] & mask]);
		}
		for (j = 0; j < m; j++) {
			if ((id[j] = ix->buckets[h[j] & mask]) == INDEX_NONE)
				continue;
			/* 80-byte records straddle cache lines: fetch both. */
			r = index_rec(ix, id[j]);
			__builtin_prefetch(r);
			__builtin_prefetch((const uint8_t *)r + INDEX_REC_SIZE - 1);
		}
		for (j = 0; j < m; j++) {
			while (id[j] != INDEX_NONE) {
				r = index_rec(ix, id[j]);
				if (memcmp(&r->key, &keys[i + j], sizeof(r->key)) == 0)
					break;
				id[j] = r->chain;
			}
			if (id[j] != INDEX_NONE && index_rec_state(index_rec(ix, id[j])) != visible)
				id[j] = INDEX_NONE;
			ids[i + j] = id[j];
			hits += id[j] != INDEX_NONE;
		}
	}
	return hits;
}

/*
 * Doubles the bucket array, rehashing everything at once (about 10 ns a
 * record). On allocation failure the old table stays: chains get longer,
 * nothing breaks, so growth never fails an insert.
 */
static void
index_grow(struct index *ix)
{
	struct index_rec	*r;
	uint32_t		*nb, n = ix->nbuckets * 2, i, id, next;
	uint64_t		 h;

	if (ix->nbuckets >= (1U << 31))
		return;
	if ((nb = malloc((size_t)n * sizeof(*nb))) == NULL)
		return;
	memset(nb, 0xff, (size_t)n * sizeof(*nb));
	for (i = 0; i < ix->nbuckets; i++) {
		for (id = ix->buckets[i]; id != INDEX_NONE; id = next) {
			r = index_rec(ix, id);
			next = r->chain;
			h = index_hash(ix, &r->key);
			r->chain = nb[h & (n - 1)];
			nb[h & (n - 1)] = id;
		}
	}
	free(ix->buckets);
	ix->buckets = nb;
	ix->nbuckets = n;
}

/* Indexes a record under its key, whose hash index_find gave. */
void
index_insert(struct index *ix, uint32_t id, uint64_t hash)
{
	struct index_rec	*r = index_rec(ix, id);
	uint32_t		*b = &ix->buckets[hash & (ix->nbuckets - 1)];

	r->chain = *b;
	*b = id;
	if (++ix->nindexed > ix->nbuckets)
		index_grow(ix);
}

/* Takes an indexed record out of the hash; its key stays in it. */
void
index_remove(struct index *ix, uint32_t id)
{
	struct index_rec	*r = index_rec(ix, id);
	uint32_t		*link;

	link = &ix->buckets[index_hash(ix, &r->key) & (ix->nbuckets - 1)];
	while (*link != id) {
		assert(*link != INDEX_NONE);
		link = &index_rec(ix, *link)->chain;
	}
	*link = r->chain;
	r->chain = INDEX_NONE;
	ix->nindexed--;
}

int
index_rec_new(struct index *ix, uint32_t *idp)
{
	struct index_rec	*r;
	uint8_t			**nb, *blk;
	uint32_t		  id, cap;

	if ((id = ix->rec_free) != INDEX_NONE)
		ix->rec_free = index_rec(ix, id)->chain;
	else {
		if (ix->nrecords >= INDEX_NONE - INDEX_BLOCK)
			return -ENOMEM;
		if ((ix->nrecords >> INDEX_BLOCK_SHIFT) == ix->nblocks) {
			if (ix->nblocks == ix->blocks_cap) {
				cap = ix->blocks_cap == 0 ? 16 : ix->blocks_cap * 2;
				if ((nb = realloc(ix->blocks, cap * sizeof(*nb))) == NULL)
					return -ENOMEM;
				ix->blocks = nb;
				ix->blocks_cap = cap;
			}
			if ((blk = calloc(INDEX_BLOCK, INDEX_REC_SIZE)) == NULL)
				return -ENOMEM;
			ix->blocks[ix->nblocks++] = blk;
		}
		id = ix->nrecords++;
	}
	r = index_rec(ix, id);
	r->chain = r->lru_prev = r->lru_next = INDEX_NONE;
	*idp = id;
	return 0;
}

/* Zeroes a record (the tier's state with it) and puts it on the free list. */
void
index_rec_free(struct index *ix, uint32_t id)
{
	struct index_rec	*r = index_rec(ix, id);

	memset(r, 0, INDEX_REC_SIZE);
	r->chain = ix->rec_free;
	ix->rec_free = id;
}

/* LRU lists: linking is inline (daemon.h). */

void
index_lru_init(struct index_lru *l)
{
	l->head = l->tail = INDEX_NONE;
}

/* A list's ids, next victim first, up to max; returns how many. For tests and debugging. */
size_t
index_lru_order(const struct index *ix, const struct index_lru *l, uint32_t *ids, size_t max)
{
	uint32_t	id;
	size_t		n = 0;

	for (id = l->tail; id != INDEX_NONE && n < max; id = index_rec(ix, id)->lru_prev)
		ids[n++] = id;
	return n;
}

/* Bytes allocated for records and buckets, capacity rather than use. */
uint64_t
index_meta_bytes(const struct index *ix)
{
	return (uint64_t)ix->nblocks * INDEX_BLOCK * INDEX_REC_SIZE +
	    (uint64_t)ix->blocks_cap * sizeof(*ix->blocks) + (uint64_t)ix->nbuckets * sizeof(uint32_t);
}
