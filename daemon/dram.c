/*
 * The DRAM tier: one arena of host memory holding objects, an index from
 * key to object, per-size-class LRU lists and pins. No I/O, no protocol:
 * the event loop thread alone calls this module, so there are no locks.
 * Worker threads may read or write an object's bytes (never its metadata)
 * while the loop holds the object pinned or WRITING: neither state can be
 * evicted or freed, so the bytes stay put by construction.
 *
 * Structure:
 * - The arena is one mapping cut into 2 MiB units (the huge page size, so
 *   slabs never share a huge page). A slab is a run of units holding the
 *   objects of one size class; a slab whose objects are all gone returns
 *   its units at once, so memory moves between classes.
 * - A size class is one exact object length (a namespace pool's objects
 *   all have the same length, so exact classes waste nothing and the
 *   length lives in the class, not in each object). Objects sit at a
 *   stride of the length rounded up to 64 bytes, or to 4 KiB from 64 KiB
 *   up, so every object of 4 KiB multiples is O_DIRECT-aligned.
 * - Objects are 80-byte records of index.c (the key, the hash chain and
 *   LRU links, then this tier's fields), named by 32-bit ids: a chained
 *   hash from key to id, records in blocks that never move.
 * - Object states: WRITING (indexed so duplicates are refused, invisible,
 *   never evicted), VISIBLE, DROPPED (out of the index, still pinned,
 *   freed at the last unpin). A class's LRU list holds exactly the
 *   evictable objects (VISIBLE, no pins), so eviction takes the tail
 *   in O(1) and can never reach a pinned or WRITING object.
 * - A VISIBLE object may be marked unverified: its bytes landed from a
 *   peer and nothing has compared them with their checksum yet (the
 *   restore that reads them does, in the same pass as its copy). Lookups
 *   see it as any other; only the peer tier's serving side asks.
 * - An object alone takes, in order: the slot after its `near` object, a
 *   free slot of its class, free units for a new slab, its class's LRU
 *   victim, and last whole slabs of other classes that hold nothing
 *   WRITING or pinned (the least recently used run of units).
 * - Batches (issue 16): a restore reads a request's pages as runs of
 *   consecutive host addresses, and the GPU copies long runs by DMA,
 *   short ones by a slower gather; but LRU victims lie where reuse left
 *   them, so once the arena is full a batch placed on them is scattered
 *   (bench_dram -c: 36 KiB pages in runs of 1-4). So the caller says how
 *   many objects of a batch are still to come, and the first of them, or
 *   one whose near slot is taken, goes to the start of a free run long
 *   enough for them (else the longest of the first partial slabs), or to
 *   a new slab when only shorter runs are free; with no free slot at all
 *   dram_run_open evicts runs of consecutive slots among the class's
 *   oldest objects, the longest first, as many slots as the batch needs.
 *   So eviction still takes only objects on the LRU list (never a pinned
 *   or WRITING one), each among the W oldest (W = 4 x the batch + 256,
 *   at most 1/16 of the class): LRU order is kept to within W objects,
 *   at a cost of W record reads per up to 256 objects placed. A batch
 *   never evicts while a free slot of its class remains, so it evicts no
 *   more than its own allocations would, only sooner.
 * - An object's checksum is checksum.c's (checksum_obj), computed by the
 *   caller and kept with the object.
 */
#include <sys/mman.h>

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

#define DRAM_UNIT_SHIFT		21
#define DRAM_UNIT		(1ULL << DRAM_UNIT_SHIFT)
#define DRAM_UNITS_MAX		(1U << 24)	/* slab ids are 24 bits: 32 TiB */
/* A slab grows past its fewest units only while that cuts waste. */
#define DRAM_SLAB_UNITS_PREF	16
#define DRAM_PINS_MAX		UINT16_MAX
/*
 * Runs for batches (issue 16): a free-run search looks at this many
 * partial slabs; an opening evicts at most DRAM_RUN_OPEN_MAX objects,
 * chosen among the DRAM_RUN_WINDOW x as many oldest and
 * DRAM_RUN_WINDOW_MIN more (so that a short batch still finds a run),
 * but never among more than 1/DRAM_RUN_WINDOW_SHARE of the class's
 * slots (a small arena keeps its LRU order). Chosen with bench_dram -c:
 * x2 or +32 left up to twice the runs, x8 cost a point of hit rate, and
 * without the cap 4096 objects lost 1 point of hit rate, not 0.2.
 */
#define DRAM_RUN_SCAN		16
#define DRAM_RUN_OPEN_MAX	256
#define DRAM_RUN_WINDOW		4
#define DRAM_RUN_WINDOW_MIN	256
#define DRAM_RUN_WINDOW_SHARE	16
#define DRAM_RUN_WINDOW_MAX	(DRAM_RUN_WINDOW * DRAM_RUN_OPEN_MAX + DRAM_RUN_WINDOW_MIN)
#define DRAM_RUN_HASH_MAX	4096	/* a power of 2 >= 2 x the largest window */
_Static_assert(DRAM_RUN_HASH_MAX >= 2 * DRAM_RUN_WINDOW_MAX &&
    (DRAM_RUN_HASH_MAX & (DRAM_RUN_HASH_MAX - 1)) == 0, "dram_run_open's hash set");

/*
 * One object. 80 bytes: with a 4-byte slot-owner entry in its slab and
 * 4 to 8 bytes of bucket array, the index costs at most 92 bytes per
 * object (the budget is 96).
 */
struct dram_obj {
	struct index_rec rec;		/* key and links: index.c's */
	uint8_t		state;		/* index.c reads it too */
#define DRAM_S_FREE	0		/* as index.c frees a record */
#define DRAM_S_WRITING	1
#define DRAM_S_VISIBLE	2		/* what lookups see */
#define DRAM_S_DROPPED	3
	uint32_t	slab : 24;	/* in state's 4 bytes */
	uint16_t	slot : 15;	/* index in the slab (below 32768) */
	uint16_t	unverified : 1;	/* pulled, csum not yet checked (dram_set_unverified) */
	uint16_t	pins;
	uint64_t	csum;
};
_Static_assert(sizeof(struct dram_obj) == INDEX_REC_SIZE, "dram_obj is the per-object budget");
_Static_assert(offsetof(struct dram_obj, rec) == 0 && DRAM_S_FREE == 0 &&
    offsetof(struct dram_obj, state) == INDEX_STATE_OFF, "a record as index.c sees it");

struct dram_class {
	uint64_t	len;		/* 0: slot unused */
	uint64_t	stride;
	uint32_t	nunits;		/* per slab */
	uint32_t	nobj;		/* per slab, at most 32768 */
	struct index_lru lru;		/* exactly the evictable objects */
	uint32_t	partial;	/* slabs with a free slot */
	uint32_t	nslabs;
};

struct dram_slab {
	uint64_t	off;		/* in the arena */
	uint64_t	tick;		/* last use of any object, for cross-class eviction */
	uint64_t	*used;		/* bitmap, tail bits past nobj set */
	uint32_t	*owner;		/* object id per slot, DRAM_NONE when free */
	uint32_t	cls;
	uint32_t	nused;
	uint32_t	nheld;		/* WRITING or pinned objects: blocks slab eviction */
	uint32_t	hint;		/* lowest bitmap word that may have a zero */
	uint32_t	prev;		/* class partial list; free slab list */
	uint32_t	next;
	int		partial;
};

struct dram {
	uint8_t		*arena;
	size_t		 arena_len;
	int		 hugetlb;
	uint32_t	 nunits;
	uint64_t	*unit_used;	/* bitmap */
	uint32_t	*unit_slab;	/* slab id per unit, DRAM_NONE when free */
	uint32_t	*scratch;	/* nunits entries for dram_reclaim */
	struct dram_runs *runs;		/* dram_run_open's scratch */

	struct dram_slab *slabs;	/* nunits entries: at most one slab per unit */
	uint32_t	 nslab_ids;	/* high-water mark */
	uint32_t	 slab_free;

	struct dram_class *classes;
	uint32_t	 nclasses;
	uint32_t	 classes_cap;
	uint32_t	 class_last;

	struct index	 ix;		/* WRITING and VISIBLE objects */

	uint64_t	 tick;
	uint64_t	 nvisible, nwriting, ndropped;
	uint64_t	 nunverified;	/* live objects marked unverified */
	uint64_t	 npinned, npins;
	uint64_t	 bytes_used;
	uint64_t	 nslabs, units_used;
	uint64_t	 evictions, evict_failures, drops;
	uint64_t	 slab_meta;	/* bytes of slab bitmaps and owner arrays */

	/*
	 * VISIBLE objects per fingerprint and pool, for STATS: kept as they
	 * change so that asking costs a lookup, not a walk of the index. An
	 * entry goes when its last object does, so namespaces come and go.
	 */
	struct dram_nscount {
		uint8_t		 fingerprint[16];
		uint64_t	 objects[PROTO_POOLS_MAX];
		uint64_t	 total;
	}		*nsc;
	uint32_t	 nnsc, nsc_cap;
};

/*
 * dram_run_open's scratch, made with the tier: the window's slots in LRU
 * order, a hash set of them (bit 63: counted in a run already), the runs
 * found and their order, the ids it evicts.
 */
struct dram_run {
	uint64_t	start;		/* slab << 16 | first slot */
	uint32_t	len;
};
struct dram_runs {
	uint64_t	window[DRAM_RUN_WINDOW_MAX];
	uint64_t	set[DRAM_RUN_HASH_MAX];
	struct dram_run	run[DRAM_RUN_WINDOW_MAX];
	uint32_t	order[DRAM_RUN_WINDOW_MAX];
	uint32_t	count[DRAM_RUN_OPEN_MAX + 1];
	uint32_t	ids[DRAM_RUN_OPEN_MAX];
};
#define DRAM_RUN_EMPTY		UINT64_MAX
#define DRAM_RUN_SEEN		(1ULL << 63)

static inline struct dram_obj *
dram_obj(const struct dram *d, uint32_t id)
{
	return (struct dram_obj *)index_rec(&d->ix, id);
}

/* The record of a live object, or NULL for an id that names none. */
static inline struct dram_obj *
dram_obj_live(const struct dram *d, uint32_t id)
{
	return (struct dram_obj *)index_rec_live(&d->ix, id);
}

static inline struct dram_slab *
dram_obj_slab(const struct dram *d, const struct dram_obj *o)
{
	return &d->slabs[o->slab];
}

static inline struct dram_class *
dram_obj_class(const struct dram *d, const struct dram_obj *o)
{
	return &d->classes[d->slabs[o->slab].cls];
}

static inline uint8_t *
dram_obj_bytes(const struct dram *d, const struct dram_obj *o)
{
	const struct dram_slab	*s = dram_obj_slab(d, o);

	return d->arena + s->off + (uint64_t)o->slot * d->classes[s->cls].stride;
}

/* LRU lists: per class, holding exactly the evictable objects. */

static void
dram_lru_push(struct dram *d, uint32_t id)
{
	/* The slab first: after index.c's stores the compiler would read o->slab again. */
	struct dram_slab	*s = dram_obj_slab(d, dram_obj(d, id));

	index_lru_push(&d->ix, &d->classes[s->cls].lru, id);
	s->tick = ++d->tick;
}

static void
dram_lru_unlink(struct dram *d, uint32_t id)
{
	index_lru_unlink(&d->ix, &dram_obj_class(d, dram_obj(d, id))->lru, id);
}

/* Size classes. */

static uint64_t
dram_stride(uint64_t len)
{
	if (len >= (64U << 10))
		return (len + 4095) & ~(uint64_t)4095;
	return (len + 63) & ~(uint64_t)63;
}

/*
 * Slab geometry for a stride: the fewest units whose tail waste is at
 * most 1/8, looking up to DRAM_SLAB_UNITS_PREF units, else the least
 * wasteful; never more units than the arena has. Strides up to 256 KiB
 * always take one unit (waste below one stride), so a slab holds at most
 * 2 MiB / 64 = 32768 objects and a slot fits 16 bits.
 */
static int
dram_geometry(const struct dram *d, uint64_t stride, uint32_t *nunits, uint32_t *nobj)
{
	uint64_t	nmin, n, last, bytes, waste, best = 0, best_waste = 0, best_bytes = 1;

	nmin = (stride + DRAM_UNIT - 1) >> DRAM_UNIT_SHIFT;
	if (nmin > d->nunits)
		return -EFBIG;
	last = nmin > DRAM_SLAB_UNITS_PREF ? nmin : DRAM_SLAB_UNITS_PREF;
	if (last > d->nunits)
		last = d->nunits;
	for (n = nmin; n <= last; n++) {
		bytes = n << DRAM_UNIT_SHIFT;
		waste = bytes % stride;
		if (waste * 8 <= bytes) {
			best = n;
			break;
		}
		/* waste / bytes < best_waste / best_bytes, without division */
		if (best == 0 || waste * best_bytes < best_waste * bytes) {
			best = n;
			best_waste = waste;
			best_bytes = bytes;
		}
	}
	*nunits = (uint32_t)best;
	*nobj = (uint32_t)((best << DRAM_UNIT_SHIFT) / stride);
	assert(*nobj >= 1 && *nobj <= (DRAM_UNIT >> 6));
	return 0;
}

/*
 * The class of objects of exactly len bytes, made on first use. A class
 * without slabs has no objects, so its slot may be reused for another
 * length; classes are few (one per pool object size), a linear search
 * with a one-entry cache is enough.
 */
static int
dram_class_get(struct dram *d, uint64_t len, uint32_t *cp)
{
	struct dram_class	*c, *nc;
	uint32_t		 i, reuse = DRAM_NONE, nunits, nobj, cap;
	int			 rc;

	if (d->class_last < d->nclasses && d->classes[d->class_last].len == len) {
		*cp = d->class_last;
		return 0;
	}
	for (i = 0; i < d->nclasses; i++) {
		if (d->classes[i].len == len) {
			*cp = d->class_last = i;
			return 0;
		}
		if (reuse == DRAM_NONE && d->classes[i].nslabs == 0)
			reuse = i;
	}
	if ((rc = dram_geometry(d, dram_stride(len), &nunits, &nobj)) != 0)
		return rc;
	if (reuse == DRAM_NONE) {
		if (d->nclasses == d->classes_cap) {
			cap = d->classes_cap == 0 ? 8 : d->classes_cap * 2;
			if ((nc = realloc(d->classes, cap * sizeof(*nc))) == NULL)
				return -ENOMEM;
			d->classes = nc;
			d->classes_cap = cap;
		}
		reuse = d->nclasses++;
	}
	c = &d->classes[reuse];
	memset(c, 0, sizeof(*c));
	c->len = len;
	c->stride = dram_stride(len);
	c->nunits = nunits;
	c->nobj = nobj;
	index_lru_init(&c->lru);
	c->partial = DRAM_NONE;
	*cp = d->class_last = reuse;
	return 0;
}

static const struct dram_class *
dram_class_find(const struct dram *d, uint64_t len)
{
	uint32_t	i;

	for (i = 0; i < d->nclasses; i++)
		if (d->classes[i].len == len && d->classes[i].nslabs > 0)
			return &d->classes[i];
	return NULL;
}

/* Units and slabs. */

static inline int
dram_unit_is_used(const struct dram *d, uint32_t u)
{
	return (d->unit_used[u >> 6] >> (u & 63)) & 1;
}

/* First fit: the lowest run of n free units, keeping slabs packed. */
static uint32_t
dram_units_find(const struct dram *d, uint32_t n)
{
	uint32_t	u, run = 0;

	for (u = 0; u < d->nunits; u++) {
		if ((u & 63) == 0 && u + 64 <= d->nunits && d->unit_used[u >> 6] == UINT64_MAX) {
			run = 0;
			u += 63;
			continue;
		}
		if (dram_unit_is_used(d, u))
			run = 0;
		else if (++run == n)
			return u + 1 - n;
	}
	return DRAM_NONE;
}

static void
dram_partial_push(struct dram *d, uint32_t sid)
{
	struct dram_slab	*s = &d->slabs[sid];
	struct dram_class	*c = &d->classes[s->cls];

	s->prev = DRAM_NONE;
	s->next = c->partial;
	if (c->partial != DRAM_NONE)
		d->slabs[c->partial].prev = sid;
	c->partial = sid;
	s->partial = 1;
}

static void
dram_partial_unlink(struct dram *d, uint32_t sid)
{
	struct dram_slab	*s = &d->slabs[sid];
	struct dram_class	*c = &d->classes[s->cls];

	if (s->prev != DRAM_NONE)
		d->slabs[s->prev].next = s->next;
	else
		c->partial = s->next;
	if (s->next != DRAM_NONE)
		d->slabs[s->next].prev = s->prev;
	s->prev = s->next = DRAM_NONE;
	s->partial = 0;
}

/* A new, empty slab of class c on free units: 0, -ENOSPC or -ENOMEM. */
static int
dram_slab_new(struct dram *d, uint32_t cls)
{
	struct dram_class	*c = &d->classes[cls];
	struct dram_slab	*s;
	uint32_t		 first, sid, u, nwords;
	size_t			 bytes;
	void			*mem;

	if ((first = dram_units_find(d, c->nunits)) == DRAM_NONE)
		return -ENOSPC;
	nwords = (c->nobj + 63) / 64;
	bytes = nwords * sizeof(uint64_t) + c->nobj * sizeof(uint32_t);
	if ((mem = malloc(bytes)) == NULL)
		return -ENOMEM;
	if ((sid = d->slab_free) != DRAM_NONE)
		d->slab_free = d->slabs[sid].next;
	else
		sid = d->nslab_ids++;
	s = &d->slabs[sid];
	memset(s, 0, sizeof(*s));
	s->used = mem;
	s->owner = (uint32_t *)(s->used + nwords);
	memset(s->used, 0, nwords * sizeof(uint64_t));
	if (c->nobj & 63)
		s->used[nwords - 1] = ~((1ULL << (c->nobj & 63)) - 1);
	memset(s->owner, 0xff, c->nobj * sizeof(uint32_t));
	s->off = (uint64_t)first << DRAM_UNIT_SHIFT;
	s->cls = cls;
	s->tick = ++d->tick;
	for (u = first; u < first + c->nunits; u++) {
		d->unit_used[u >> 6] |= 1ULL << (u & 63);
		d->unit_slab[u] = sid;
	}
	dram_partial_push(d, sid);
	c->nslabs++;
	d->nslabs++;
	d->units_used += c->nunits;
	d->slab_meta += bytes;
	return 0;
}

static void
dram_slab_release(struct dram *d, uint32_t sid)
{
	struct dram_slab	*s = &d->slabs[sid];
	struct dram_class	*c = &d->classes[s->cls];
	uint32_t		 u, first = (uint32_t)(s->off >> DRAM_UNIT_SHIFT);

	assert(s->nused == 0 && s->nheld == 0);
	if (s->partial)
		dram_partial_unlink(d, sid);
	for (u = first; u < first + c->nunits; u++) {
		d->unit_used[u >> 6] &= ~(1ULL << (u & 63));
		d->unit_slab[u] = DRAM_NONE;
	}
	d->slab_meta -= (c->nobj + 63) / 64 * sizeof(uint64_t) + c->nobj * sizeof(uint32_t);
	free(s->used);
	memset(s, 0, sizeof(*s));
	s->next = d->slab_free;
	d->slab_free = sid;
	c->nslabs--;
	d->nslabs--;
	d->units_used -= c->nunits;
}

static int
dram_slot_is_free(const struct dram_slab *s, uint32_t slot)
{
	return !((s->used[slot >> 6] >> (slot & 63)) & 1);
}

static uint32_t
dram_slab_first_free(struct dram_slab *s, uint32_t nobj)
{
	uint32_t	w, nwords = (nobj + 63) / 64;

	for (w = s->hint; w < nwords; w++) {
		if (s->used[w] != UINT64_MAX) {
			s->hint = w;
			return w * 64 + (uint32_t)__builtin_ctzll(~s->used[w]);
		}
	}
	fatalx("dram", "partial slab %llu without a free slot", (unsigned long long)s->off);
}

static void
dram_slot_take(struct dram *d, uint32_t sid, uint32_t slot, uint32_t id)
{
	struct dram_slab	*s = &d->slabs[sid];
	struct dram_obj		*o = dram_obj(d, id);

	s->used[slot >> 6] |= 1ULL << (slot & 63);
	s->owner[slot] = id;
	if (++s->nused == d->classes[s->cls].nobj)
		dram_partial_unlink(d, sid);
	o->slab = sid;
	o->slot = (uint16_t)slot;
}

/* Frees an object's slot and record; an emptied slab goes back to the arena. */
static void
dram_obj_release(struct dram *d, uint32_t id)
{
	struct dram_obj		*o = dram_obj(d, id);
	uint32_t		 sid = o->slab, slot = o->slot;
	struct dram_slab	*s = &d->slabs[sid];
	struct dram_class	*c = &d->classes[s->cls];

	d->bytes_used -= c->len;
	s->used[slot >> 6] &= ~(1ULL << (slot & 63));
	s->owner[slot] = DRAM_NONE;
	if (slot / 64 < s->hint)
		s->hint = slot / 64;
	if (s->nused-- == c->nobj)
		dram_partial_push(d, sid);
	if (o->unverified)
		d->nunverified--;
	index_rec_free(&d->ix, id);
	if (s->nused == 0)
		dram_slab_release(d, sid);
}

/* The counter entry of a fingerprint, or NULL. */
static struct dram_nscount *
dram_nscount_find(const struct dram *d, const uint8_t fp[16])
{
	uint32_t	i;

	for (i = 0; i < d->nnsc; i++)
		if (memcmp(d->nsc[i].fingerprint, fp, 16) == 0)
			return &d->nsc[i];
	return NULL;
}

/*
 * An object of key k became VISIBLE (delta 1) or stopped being (-1).
 * Out of memory for a new entry, the object goes uncounted: STATS is
 * then short, nothing else is wrong, and its later -1 finds no entry.
 */
static void
dram_nscount(struct dram *d, const struct obj_key *k, int delta)
{
	struct dram_nscount	*c = dram_nscount_find(d, k->fingerprint), *n;
	unsigned		 pool = k->pool < PROTO_POOLS_MAX ? k->pool : PROTO_POOLS_MAX - 1;

	if (c == NULL && delta < 0)
		return;
	if (c == NULL) {
		if (d->nnsc == d->nsc_cap) {
			uint32_t cap = d->nsc_cap == 0 ? 8 : d->nsc_cap * 2;

			if ((n = realloc(d->nsc, cap * sizeof(*n))) == NULL)
				return;
			d->nsc = n;
			d->nsc_cap = cap;
		}
		c = &d->nsc[d->nnsc++];
		memset(c, 0, sizeof(*c));
		memcpy(c->fingerprint, k->fingerprint, 16);
	}
	if (delta < 0 && c->objects[pool] == 0)
		return;		/* counted before an allocation failure: never below 0 */
	c->objects[pool] += (uint64_t)(int64_t)delta;
	c->total += (uint64_t)(int64_t)delta;
	if (c->total == 0)
		*c = d->nsc[--d->nnsc];
}

/* VISIBLE objects of fingerprint fp, per pool index: into objects[PROTO_POOLS_MAX]. */
void
dram_ns_objects(const struct dram *d, const uint8_t fp[16], uint64_t objects[PROTO_POOLS_MAX])
{
	const struct dram_nscount	*c = dram_nscount_find(d, fp);

	if (c != NULL)
		memcpy(objects, c->objects, sizeof(c->objects));
	else
		memset(objects, 0, sizeof(c->objects));
}

static void
dram_evict(struct dram *d, uint32_t id)
{
	struct dram_obj	*o = dram_obj(d, id);

	assert(o->state == DRAM_S_VISIBLE && o->pins == 0);
	index_remove(&d->ix, id);
	dram_lru_unlink(d, id);
	d->nvisible--;
	dram_nscount(d, &o->rec.key, -1);
	d->evictions++;
	dram_obj_release(d, id);
}

/*
 * Frees a run of n units by evicting whole slabs of any class, taking
 * only slabs without WRITING or pinned objects. Of the runs possible it
 * takes the one whose most recently used slab is oldest (a sliding
 * window maximum over the units, O(units)). This is the slow path: it
 * runs only when a class has nothing of its own to evict and no free
 * run exists, and the slab it makes serves many allocations.
 */
static int
dram_reclaim(struct dram *d, uint32_t n)
{
	uint32_t	*dq = d->scratch, head = 0, tail = 0, bad = 0, u, v, sid, slot;
	uint32_t	 start = DRAM_NONE;
	uint64_t	 best = UINT64_MAX, sc;
	struct dram_slab *s;

#define DRAM_UNIT_BAD(u)	(d->unit_slab[u] != DRAM_NONE && d->slabs[d->unit_slab[u]].nheld > 0)
#define DRAM_UNIT_TICK(u)	(d->unit_slab[u] == DRAM_NONE ? 0 : d->slabs[d->unit_slab[u]].tick)
	for (u = 0; u < d->nunits; u++) {
		bad += DRAM_UNIT_BAD(u);
		sc = DRAM_UNIT_TICK(u);
		while (tail > head && DRAM_UNIT_TICK(dq[tail - 1]) <= sc)
			tail--;
		dq[tail++] = u;
		if (u >= n) {
			bad -= DRAM_UNIT_BAD(u - n);
			if (dq[head] == u - n)
				head++;
		}
		if (u + 1 >= n && bad == 0 && (sc = DRAM_UNIT_TICK(dq[head])) < best) {
			best = sc;
			start = u + 1 - n;
		}
	}
#undef DRAM_UNIT_BAD
#undef DRAM_UNIT_TICK
	if (start == DRAM_NONE)
		return -ENOSPC;
	for (u = start; u < start + n; u++) {
		if ((sid = d->unit_slab[u]) == DRAM_NONE)
			continue;
		s = &d->slabs[sid];
		/* The last eviction releases the slab and its arrays. */
		for (slot = 0, v = s->nused; v > 0; slot++) {
			if (s->owner[slot] == DRAM_NONE)
				continue;
			v--;
			dram_evict(d, s->owner[slot]);
		}
	}
	return 0;
}

/*
 * The longest run of free slots of slab s, or the first one of at least
 * target slots: its length (0: none) and, in *startp, its first slot.
 */
static uint32_t
dram_slab_run(const struct dram_slab *s, uint32_t nobj, uint32_t target, uint32_t *startp)
{
	uint32_t	w, b, n, nwords = (nobj + 63) / 64, run = 0, start = 0, best = 0;
	uint64_t	fr, rest;

	/* Words below the hint are full; tail bits past nobj read as used. */
	for (w = s->hint; w < nwords; w++) {
		fr = ~s->used[w];
		for (b = 0; b < 64; b += n) {
			rest = fr >> b;
			if (rest & 1) {
				/* Free from b: the run goes on (into the next word, maybe). */
				n = ~rest == 0 ? 64 : (uint32_t)__builtin_ctzll(~rest);
				if (run == 0)
					start = w * 64 + b;
				run += n;
				continue;
			}
			n = rest == 0 ? 64 - b : (uint32_t)__builtin_ctzll(rest);
			if (run > best) {
				best = run;
				*startp = start;
				if (best >= target)
					return best;
			}
			run = 0;
		}
	}
	if (run > best) {
		best = run;
		*startp = start;
	}
	return best;
}

/*
 * The longest free run in the class's first DRAM_RUN_SCAN partial slabs,
 * or the first of at least target slots: its length, 0 when the class has
 * no partial slab. The head of the list is where runs were last opened
 * or freed, so the bound rarely hides one.
 */
static uint32_t
dram_run_free(struct dram *d, uint32_t cls, uint32_t target, uint32_t *sidp, uint32_t *slotp)
{
	const struct dram_class	*c = &d->classes[cls];
	uint32_t		 sid, i, n, slot = 0, best = 0;

	for (sid = c->partial, i = 0; sid != DRAM_NONE && i < DRAM_RUN_SCAN;
	    sid = d->slabs[sid].next, i++) {
		if ((n = dram_slab_run(&d->slabs[sid], c->nobj, target, &slot)) > best) {
			best = n;
			*sidp = sid;
			*slotp = slot;
			if (best >= target)
				break;
		}
	}
	return best;
}

static inline uint32_t
dram_run_slot(uint64_t key, uint32_t mask)
{
	return (uint32_t)((key * 0x9e3779b97f4a7c15ULL) >> 40) & mask;
}

/* The hash set's entry of key, or NULL. */
static uint64_t *
dram_run_find(struct dram_runs *r, uint64_t key, uint32_t mask)
{
	uint32_t	h;

	for (h = dram_run_slot(key, mask); r->set[h] != DRAM_RUN_EMPTY; h = (h + 1) & mask)
		if ((r->set[h] & ~DRAM_RUN_SEEN) == key)
			return &r->set[h];
	return NULL;
}

/*
 * Opens runs of consecutive slots for a batch of want more objects of
 * class cls, which has no free slot: it looks at the W oldest evictable
 * objects (W = DRAM_RUN_WINDOW x n + DRAM_RUN_WINDOW_MIN, n = want up to
 * DRAM_RUN_OPEN_MAX), groups those in consecutive slots of one slab into
 * runs, and evicts the longest runs (of equal ones, those with the older
 * objects) until n slots are free. So every object evicted is among the
 * W oldest: LRU order is kept to within W objects, and at most W - n
 * objects older than the youngest one evicted stay. Only objects on the
 * LRU list are looked at: never a pinned or WRITING one. Cost: W record
 * reads and O(W) hashing, for n allocations.
 */
static void
dram_run_open(struct dram *d, uint32_t cls, uint32_t want)
{
	struct dram_class	*c = &d->classes[cls];
	struct dram_runs	*r = d->runs;
	const struct dram_obj	*o;
	struct dram_run		*run;
	uint64_t		*e, key, k;
	uint32_t		 n, w, nk, nr = 0, mask, id, i, j, len, need, take, nids = 0;

	n = want < DRAM_RUN_OPEN_MAX ? want : DRAM_RUN_OPEN_MAX;
	w = DRAM_RUN_WINDOW * n + DRAM_RUN_WINDOW_MIN;
	if (w > (uint64_t)c->nslabs * c->nobj / DRAM_RUN_WINDOW_SHARE)
		w = (uint32_t)((uint64_t)c->nslabs * c->nobj / DRAM_RUN_WINDOW_SHARE);
	if (w < n)
		w = n;
	/*
	 * A chain of dependent loads, but of the records the last opening
	 * walked too, less the n it evicted: they stay in the CPU's caches
	 * (bench_dram -c, 1M objects: about 17 us a walk).
	 */
	for (nk = 0, id = c->lru.tail; nk < w && id != DRAM_NONE; id = o->rec.lru_prev) {
		o = dram_obj(d, id);
		r->window[nk++] = (uint64_t)o->slab << 16 | o->slot;
	}
	/* A set of at least 2 x nk entries: sparse enough for linear probing. */
	for (mask = 63; mask + 1 < 2 * nk; mask = mask * 2 + 1)
		;
	memset(r->set, 0xff, (mask + 1) * sizeof(*r->set));
	for (i = 0; i < nk; i++) {
		for (j = dram_run_slot(r->window[i], mask); r->set[j] != DRAM_RUN_EMPTY;
		    j = (j + 1) & mask)
			;
		r->set[j] = r->window[i];
	}
	/*
	 * Runs, each found from its oldest member (the window is in LRU
	 * order) by walking both ways; a slot's key + 1 is the next slot of
	 * the same slab (slots are below 32768: no carry into the slab).
	 */
	for (i = 0; i < nk; i++) {
		key = r->window[i];
		if (*(e = dram_run_find(r, key, mask)) & DRAM_RUN_SEEN)
			continue;
		*e |= DRAM_RUN_SEEN;
		for (k = key; (k & 0xffff) > 0 && (e = dram_run_find(r, k - 1, mask)) != NULL; k--)
			*e |= DRAM_RUN_SEEN;
		run = &r->run[nr++];
		run->start = k;
		for (k = key + 1; (e = dram_run_find(r, k, mask)) != NULL; k++)
			*e |= DRAM_RUN_SEEN;
		run->len = (uint32_t)(k - run->start);
	}
	/* Longest first, lengths counted up to n (longer is as good), stable. */
	memset(r->count, 0, (n + 1) * sizeof(*r->count));
	for (i = 0; i < nr; i++)
		r->count[n - (r->run[i].len < n ? r->run[i].len : n) + 1]++;
	for (i = 1; i <= n; i++)
		r->count[i] += r->count[i - 1];
	for (i = 0; i < nr; i++)
		r->order[r->count[n - (r->run[i].len < n ? r->run[i].len : n)]++] = i;
	/* The ids first: the last eviction in a slab frees its owner array. */
	for (need = n, i = 0; need > 0 && i < nr; i++) {
		run = &r->run[r->order[i]];
		len = run->len;
		take = len < need ? len : need;
		for (j = 0; j < take; j++) {
			key = run->start + j;
			r->ids[nids++] = d->slabs[key >> 16].owner[key & 0xffff];
		}
		need -= take;
	}
	for (i = 0; i < nids; i++)
		dram_evict(d, r->ids[i]);
}

/*
 * A slot for a new object of class cls, the first of a batch of `batch`
 * objects that follow each other (1: an object alone): after near when
 * that slot is free; else, for a batch, the start of a free run long
 * enough for it (or of the longest one), a new slab where the free runs
 * are too short, or a run opened by dram_run_open; for an object alone,
 * a free slot of the class, a new slab, the class's LRU victim's slot.
 * Last, whole slabs of other classes. A batch never evicts while its
 * class has a free slot, so opening a run costs no more evictions than
 * the batch's own allocations would, only sooner (what the caller then
 * does not allocate stays free for the next).
 */
static int
dram_slot_find(struct dram *d, uint32_t cls, uint32_t near, uint32_t batch, uint32_t *sidp,
    uint32_t *slotp)
{
	struct dram_class	*c = &d->classes[cls];
	const struct dram_obj	*n;
	struct dram_slab	*s;
	uint32_t		 target = batch < c->nobj ? batch : c->nobj, len;
	int			 rc;

	if ((n = dram_obj_live(d, near)) != NULL && d->slabs[n->slab].cls == cls &&
	    (uint32_t)n->slot + 1 < c->nobj && dram_slot_is_free(&d->slabs[n->slab], n->slot + 1)) {
		*sidp = n->slab;
		*slotp = n->slot + 1;
		return 0;
	}
	for (;;) {
		if (c->partial != DRAM_NONE) {
			if (target > 1) {
				if ((len = dram_run_free(d, cls, target, sidp, slotp)) >= target)
					return 0;
				/* Only short runs free: a new slab is one whole run, if units are. */
				if (dram_slab_new(d, cls) == 0)
					continue;
				if (len > 0)
					return 0;	/* the longest short run */
			}
			s = &d->slabs[c->partial];
			*sidp = c->partial;
			*slotp = dram_slab_first_free(s, c->nobj);
			return 0;
		}
		if ((rc = dram_slab_new(d, cls)) == 0)
			continue;
		if (rc != -ENOSPC)
			return rc;
		if (c->lru.tail != DRAM_NONE) {
			if (target > 1)
				dram_run_open(d, cls, batch);
			else
				dram_evict(d, c->lru.tail);
			continue;
		}
		if ((rc = dram_reclaim(d, c->nunits)) != 0)
			return rc;
	}
}

/* The arena: huge pages reserved up front if the pool has them, else THP. */
static int
dram_map(struct dram *d, size_t len, char *err, size_t errlen)
{
	uint8_t		*p, *a;
	uintptr_t	 mis;
	int		 rc;

	/*
	 * No MAP_NORESERVE with MAP_HUGETLB: without a reservation a fault
	 * past the pool's end is a SIGBUS in the middle of a copy. Reserving
	 * fails here instead, and reserving does not fault pages in.
	 */
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
	    -1, 0);
	if (p != MAP_FAILED) {
		d->arena = p;
		d->arena_len = len;
		d->hugetlb = 1;
		return 0;
	}
	/* One unit more, trimmed, so that units are 2 MiB aligned for THP. */
	p = mmap(NULL, len + DRAM_UNIT, PROT_READ | PROT_WRITE,
	    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		snprintf(err, errlen, "dram arena: mmap of %zu bytes: %s", len, strerror(-rc));
		return rc;
	}
	mis = (uintptr_t)p & (DRAM_UNIT - 1);
	a = mis == 0 ? p : p + (DRAM_UNIT - mis);
	if (a > p)
		munmap(p, (size_t)(a - p));
	if (a + len < p + len + DRAM_UNIT)
		munmap(a + len, (size_t)(p + len + DRAM_UNIT - (a + len)));
	/* Advice only: a kernel without THP still gives a working arena. */
	(void)madvise(a, len, MADV_HUGEPAGE);
	d->arena = a;
	d->arena_len = len;
	d->hugetlb = 0;
	return 0;
}

/*
 * A new DRAM tier over an arena of arena_bytes, rounded down to whole
 * 2 MiB units: tiers.dram.size is a budget, and rounding up exceeded it
 * by up to 2 MiB (issue 11 item 11). Under one unit is refused. The
 * caller owns it and frees it with dram_free. Nothing of the arena is
 * touched here: pages fault in as objects are written.
 */
int
dram_new(struct dram **dp, uint64_t arena_bytes, char *err, size_t errlen)
{
	struct dram	*d;
	uint64_t	 nunits;
	int		 rc;

	*dp = NULL;
	nunits = arena_bytes >> DRAM_UNIT_SHIFT;
	if (nunits == 0 || nunits > DRAM_UNITS_MAX) {
		snprintf(err, errlen, "dram arena: %llu bytes is out of range [2 MiB, 32 TiB]",
		    (unsigned long long)arena_bytes);
		return -EINVAL;
	}
	if (arena_bytes & (DRAM_UNIT - 1))
		log_info("dram", "arena of %llu bytes: %llu configured, rounded down to whole 2 MiB "
		    "units", (unsigned long long)(nunits << DRAM_UNIT_SHIFT),
		    (unsigned long long)arena_bytes);
	if ((d = calloc(1, sizeof(*d))) == NULL)
		goto nomem;
	d->nunits = (uint32_t)nunits;
	d->slab_free = DRAM_NONE;
	d->unit_used = calloc((nunits + 63) / 64, sizeof(uint64_t));
	d->unit_slab = malloc(nunits * sizeof(uint32_t));
	d->scratch = malloc(nunits * sizeof(uint32_t));
	d->slabs = calloc(nunits, sizeof(struct dram_slab));
	d->runs = malloc(sizeof(*d->runs));
	if (d->unit_used == NULL || d->unit_slab == NULL || d->scratch == NULL ||
	    d->slabs == NULL || d->runs == NULL || index_init(&d->ix, DRAM_S_VISIBLE) != 0)
		goto nomem;
	memset(d->unit_slab, 0xff, nunits * sizeof(uint32_t));
	if ((rc = dram_map(d, nunits << DRAM_UNIT_SHIFT, err, errlen)) != 0) {
		dram_free(d);
		return rc;
	}
	*dp = d;
	return 0;

nomem:
	snprintf(err, errlen, "dram: out of memory for the metadata of %llu units",
	    (unsigned long long)nunits);
	dram_free(d);
	return -ENOMEM;
}

/* Frees the tier with everything in it; NULL is fine. */
void
dram_free(struct dram *d)
{
	uint32_t	i;

	if (d == NULL)
		return;
	if (d->arena != NULL)
		munmap(d->arena, d->arena_len);
	if (d->slabs != NULL)
		for (i = 0; i < d->nslab_ids; i++)
			free(d->slabs[i].used);
	index_fini(&d->ix);
	free(d->nsc);
	free(d->classes);
	free(d->slabs);
	free(d->scratch);
	free(d->runs);
	free(d->unit_slab);
	free(d->unit_used);
	free(d);
}

/* O(1) and free of side effects: PROBE calls it. */
int
dram_lookup(const struct dram *d, const struct obj_key *k, uint32_t *idp)
{
	uint32_t	id;

	if ((id = index_lookup(&d->ix, k)) == DRAM_NONE)
		return -ENOENT;
	*idp = id;
	return 0;
}

/*
 * dram_lookup for n keys: ids[i] is the id of keys[i] or DRAM_NONE;
 * returns the number of hits. The same answers as n dram_lookup calls,
 * with the cache misses of several keys overlapped (index_lookup_many).
 */
size_t
dram_lookup_many(const struct dram *d, const struct obj_key *keys, size_t n, uint32_t *ids)
{
	return index_lookup_many(&d->ix, keys, n, ids);
}

/*
 * Reserves len bytes for a new WRITING object under k and returns its
 * buffer, which stays put until commit or abort. near: the object it
 * should follow (DRAM_NONE: none); batch: how many objects the caller is
 * allocating one after the other from this one on, this one included
 * (a request's pages; 0 or 1: this one alone), so that the first of them,
 * or one whose near slot is taken, is placed where the rest can follow
 * it. The caller need not allocate them all; what it does not is left
 * free. -EINVAL, -EEXIST (k is
 * indexed: one writer per key; *id is the object holding it, WRITING or
 * VISIBLE, which the caller's next object may follow), -EFBIG (larger than the arena allows),
 * -ENOSPC (nothing evictable makes room), -ENOMEM. A refusal changes
 * nothing but the evict_failures counter (and what eviction freed).
 */
int
dram_alloc(struct dram *d, const struct obj_key *k, uint64_t len, uint32_t near, uint32_t batch,
    uint32_t *idp, uint8_t **bufp)
{
	struct dram_obj	*o;
	uint64_t	 h;
	uint32_t	 cls, id, sid = 0, slot = 0;	/* set by dram_slot_find: gcc cannot tell */
	int		 rc;

	if (len == 0 || k->pad != 0)
		return -EINVAL;
	if (len > d->arena_len)
		return -EFBIG;
	if ((id = index_find(&d->ix, k, &h)) != DRAM_NONE) {
		*idp = id;		/* the object holding k: a neighbour for the next one */
		return -EEXIST;
	}
	if ((rc = dram_class_get(d, len, &cls)) != 0)
		return rc;
	if ((rc = index_rec_new(&d->ix, &id)) != 0)
		return rc;
	/*
	 * The record is taken first (eviction below frees records too) but
	 * stays FREE until placed, so that near can never name it.
	 */
	if ((rc = dram_slot_find(d, cls, near, batch, &sid, &slot)) != 0) {
		index_rec_free(&d->ix, id);
		if (rc == -ENOSPC)
			d->evict_failures++;
		return rc;
	}
	o = dram_obj(d, id);
	o->state = DRAM_S_WRITING;
	o->rec.key = *k;
	o->csum = 0;
	o->pins = 0;
	dram_slot_take(d, sid, slot, id);
	d->slabs[sid].nheld++;
	index_insert(&d->ix, id, h);
	d->nwriting++;
	d->bytes_used += len;
	*idp = id;
	*bufp = dram_obj_bytes(d, o);
	return 0;
}

/* WRITING -> VISIBLE, most recently used. -EINVAL unless WRITING. */
int
dram_commit(struct dram *d, uint32_t id, uint64_t checksum)
{
	struct dram_obj	*o = dram_obj_live(d, id);

	if (o == NULL || o->state != DRAM_S_WRITING)
		return -EINVAL;
	o->csum = checksum;
	o->state = DRAM_S_VISIBLE;
	dram_obj_slab(d, o)->nheld--;
	d->nwriting--;
	d->nvisible++;
	dram_nscount(d, &o->rec.key, 1);
	dram_lru_push(d, id);
	return 0;
}

/*
 * Marks a VISIBLE object's bytes as not yet checked against its checksum
 * (1), or as checked (0); -EINVAL for an id that is not VISIBLE.
 */
int
dram_set_unverified(struct dram *d, uint32_t id, int unverified)
{
	struct dram_obj	*o = dram_obj_live(d, id);

	if (o == NULL || o->state != DRAM_S_VISIBLE)
		return -EINVAL;
	if (o->unverified != (unverified != 0))
		d->nunverified += unverified ? 1 : (uint64_t)-1;
	o->unverified = unverified != 0;
	return 0;
}

/* Whether a live object is marked unverified. */
int
dram_unverified(const struct dram *d, uint32_t id)
{
	const struct dram_obj	*o = dram_obj_live(d, id);

	return o != NULL && o->unverified;
}

/* WRITING -> freed; it was never visible. */
void
dram_abort(struct dram *d, uint32_t id)
{
	struct dram_obj	*o = dram_obj_live(d, id);

	assert(o != NULL && o->state == DRAM_S_WRITING);
	index_remove(&d->ix, id);
	dram_obj_slab(d, o)->nheld--;
	d->nwriting--;
	dram_obj_release(d, id);
}

/*
 * Pins a VISIBLE object: off its LRU list until the last unpin, so no
 * eviction can see it. -EINVAL for a bad id, -ENOENT unless VISIBLE,
 * -EOVERFLOW past 65535 pins.
 */
int
dram_pin(struct dram *d, uint32_t id)
{
	struct dram_obj	*o = dram_obj_live(d, id);

	if (o == NULL)
		return -EINVAL;
	if (o->state != DRAM_S_VISIBLE)
		return -ENOENT;
	if (o->pins == DRAM_PINS_MAX)
		return -EOVERFLOW;
	if (o->pins++ == 0) {
		dram_lru_unlink(d, id);
		dram_obj_slab(d, o)->nheld++;
		d->npinned++;
	}
	d->npins++;
	return 0;
}

/* The last unpin makes a VISIBLE object most recently used, and frees a DROPPED one. */
void
dram_unpin(struct dram *d, uint32_t id)
{
	struct dram_obj	*o = dram_obj_live(d, id);

	assert(o != NULL && o->pins > 0);
	d->npins--;
	if (--o->pins > 0)
		return;
	d->npinned--;
	dram_obj_slab(d, o)->nheld--;
	if (o->state == DRAM_S_VISIBLE) {
		dram_lru_push(d, id);
		return;
	}
	assert(o->state == DRAM_S_DROPPED);
	d->ndropped--;
	dram_obj_release(d, id);
}

/*
 * Makes an object most recently used. A pinned object is off the list
 * and becomes most recently used at its last unpin anyway.
 */
void
dram_touch(struct dram *d, uint32_t id)
{
	struct dram_obj	*o = dram_obj_live(d, id);

	assert(o != NULL);
	if (o->state != DRAM_S_VISIBLE || o->pins > 0)
		return;
	dram_lru_unlink(d, id);
	dram_lru_push(d, id);
}

/*
 * Takes a VISIBLE object out of the index now (its data is lost or
 * corrupt): later lookups miss and the key may be published again. A
 * pinned object's memory stays until its last unpin. Idempotent.
 */
void
dram_drop(struct dram *d, uint32_t id)
{
	struct dram_obj	*o = dram_obj_live(d, id);

	assert(o != NULL && o->state != DRAM_S_WRITING);
	if (o->state == DRAM_S_DROPPED)
		return;
	index_remove(&d->ix, id);
	d->nvisible--;
	dram_nscount(d, &o->rec.key, -1);
	d->drops++;
	if (o->pins > 0) {
		o->state = DRAM_S_DROPPED;
		d->ndropped++;
		return;
	}
	dram_lru_unlink(d, id);
	dram_obj_release(d, id);
}

/*
 * An object's bytes, length and checksum (0 while WRITING), or NULL for
 * an id that names no object. The pointer is valid while the object is
 * pinned or WRITING.
 */
const uint8_t *
dram_data(const struct dram *d, uint32_t id, uint64_t *len, uint64_t *checksum)
{
	const struct dram_obj	*o = dram_obj_live(d, id);

	if (o == NULL)
		return NULL;
	if (len != NULL)
		*len = dram_obj_class(d, o)->len;
	if (checksum != NULL)
		*checksum = o->csum;
	return dram_obj_bytes(d, o);
}

/* The key of a live object (writing, visible or dropped); NULL for a free id. */
const struct obj_key *
dram_key(const struct dram *d, uint32_t id)
{
	const struct dram_obj	*o = dram_obj_live(d, id);

	return o == NULL ? NULL : &o->rec.key;
}

/* The same, writable: the publish worker fills a WRITING object; tests corrupt. */
uint8_t *
dram_data_mut(struct dram *d, uint32_t id)
{
	const struct dram_obj	*o = dram_obj_live(d, id);

	return o == NULL ? NULL : dram_obj_bytes(d, o);
}

void
dram_stats(const struct dram *d, struct dram_stats *st)
{
	uint64_t	meta;

	memset(st, 0, sizeof(*st));
	st->objects = d->nvisible + d->nwriting + d->ndropped;
	st->visible = d->nvisible;
	st->writing = d->nwriting;
	st->dropped = d->ndropped;
	st->unverified = d->nunverified;
	st->pinned_objects = d->npinned;
	st->pins = d->npins;
	st->bytes_used = d->bytes_used;
	st->bytes_slabs = d->units_used << DRAM_UNIT_SHIFT;
	st->bytes_capacity = d->arena_len;
	st->slabs = d->nslabs;
	st->evictions = d->evictions;
	st->evict_failures = d->evict_failures;
	st->drops = d->drops;
	st->index_buckets = d->ix.nbuckets;
	st->hugetlb = d->hugetlb;
	/* Everything allocated for metadata, capacity rather than use. */
	meta = sizeof(*d);
	meta += index_meta_bytes(&d->ix);
	meta += (uint64_t)d->classes_cap * sizeof(struct dram_class);
	meta += (uint64_t)d->nunits * (sizeof(struct dram_slab) + 2 * sizeof(uint32_t));
	meta += (d->nunits + 63) / 64 * sizeof(uint64_t);
	meta += sizeof(struct dram_runs);
	meta += d->slab_meta;
	st->meta_bytes = meta;
	st->meta_bytes_per_object = st->objects ? (double)meta / (double)st->objects : 0;
}

/*
 * The ids of the objects of length len that eviction would take, oldest
 * first, up to max; returns how many it wrote. For tests and debugging.
 */
size_t
dram_lru_order(const struct dram *d, uint64_t len, uint32_t *ids, size_t max)
{
	const struct dram_class	*c = dram_class_find(d, len);

	return c == NULL ? 0 : index_lru_order(&d->ix, &c->lru, ids, max);
}

/* The arena, for registering it with CUDA. */
void *
dram_arena(const struct dram *d, size_t *len)
{
	if (len != NULL)
		*len = d->arena_len;
	return d->arena;
}
