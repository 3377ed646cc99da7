/*
 * The DRAM tier on its own: the object lifecycle (WRITING, visible,
 * dropped), one writer per key, lookups without side effects, LRU
 * eviction that never takes a pinned or WRITING object, slabs moving
 * between sizes, contiguous placement (a batch in one run of a churned
 * arena, opened without touching what is held), index growth, the
 * metadata budget, the chunked checksum, and a random operation sequence
 * checked against a reference model after every step. Also index.c on its own (the
 * "index" test case), which the DRAM and file tiers share: lookups see the
 * visible state alone, records come back zeroed, removal keeps chains
 * whole across growth, LRU lists link in the order they say.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "daemon.h"
#include "tests.h"

#define MIB	(1ULL << 20)

/*
 * check's ck_assert_* write a mark to a pipe on every success, which
 * costs a system call each: these check quietly and report on failure.
 */
#define EQ(a, b) do {							\
	long long _a = (long long)(a), _b = (long long)(b);		\
	if (_a != _b)							\
		ck_abort_msg("%s == %s: %lld != %lld", #a, #b, _a, _b);	\
} while (0)
#define PEQ(a, b) do {							\
	const void *_a = (a), *_b = (b);				\
	if (_a != _b)							\
		ck_abort_msg("%s == %s: %p != %p", #a, #b, _a, _b);	\
} while (0)
#define CHECK(e, ...) do {						\
	if (!(e))							\
		ck_abort_msg(__VA_ARGS__);				\
} while (0)

static struct dram *
dram_mk(uint64_t bytes)
{
	struct dram	*d;
	char		 err[256] = "";

	CHECK(dram_new(&d, bytes, err, sizeof(err)) == 0, "dram_new: %s", err);
	return d;
}

static void
key_of(struct obj_key *k, uint32_t n)
{
	memset(k, 0, sizeof(*k));
	memset(k->fingerprint, 0xab, sizeof(k->fingerprint));
	k->pool = 1;
	k->shard = 3;
	memcpy(k->hash, &n, sizeof(n));
	k->hash[31] = 0x5a;
}

/* A pattern that names its object: a different n gives different bytes. */
static void
fill(uint8_t *buf, uint64_t len, uint32_t n)
{
	memset(buf, (int)(n * 37 + 11) & 0xff, len);
	memcpy(buf, &n, len < sizeof(n) ? len : sizeof(n));
}

static int
intact(const uint8_t *buf, uint64_t len, uint32_t n)
{
	uint32_t	got = 0;
	uint64_t	i;

	memcpy(&got, buf, len < sizeof(got) ? len : sizeof(got));
	if (len >= sizeof(n) && got != n)
		return 0;
	for (i = sizeof(n); i < len; i++)
		if (buf[i] != ((n * 37 + 11) & 0xff))
			return 0;
	return 1;
}

static int
try_put(struct dram *d, uint32_t n, uint64_t len, uint32_t near, uint32_t *idp)
{
	struct obj_key	 k;
	uint8_t		*buf;
	uint32_t	 id;
	int		 rc;

	key_of(&k, n);
	if ((rc = dram_alloc(d, &k, len, near, 1, &id, &buf)) != 0)
		return rc;
	fill(buf, len, n);
	EQ(dram_commit(d, id, checksum_obj(buf, len)), 0);
	if (idp != NULL)
		*idp = id;
	return 0;
}

static uint32_t
put(struct dram *d, uint32_t n, uint64_t len, uint32_t near)
{
	uint32_t	id = DRAM_NONE;
	int		rc;

	rc = try_put(d, n, len, near, &id);
	CHECK(rc == 0, "put %u: %s", n, strerror(-rc));
	return id;
}

/* The id of key n, or DRAM_NONE when it is not visible. */
static uint32_t
find(const struct dram *d, uint32_t n)
{
	struct obj_key	k;
	uint32_t	id;

	key_of(&k, n);
	return dram_lookup(d, &k, &id) == 0 ? id : DRAM_NONE;
}

static void
assert_object(const struct dram *d, uint32_t id, uint32_t n, uint64_t len)
{
	const uint8_t	*p;
	uint64_t	 l, c;

	p = dram_data(d, id, &l, &c);
	ck_assert_ptr_nonnull(p);
	EQ(l, len);
	CHECK(intact(p, l, n), "object %u: bytes changed", n);
	EQ(c, checksum_obj(p, l));
}

static void
drop_keys(struct dram *d, uint32_t from, uint32_t to)
{
	uint32_t	n, id;

	for (n = from; n < to; n++)
		if ((id = find(d, n)) != DRAM_NONE)
			dram_drop(d, id);
}

static void
assert_empty(const struct dram *d)
{
	struct dram_stats	st;

	dram_stats(d, &st);
	EQ(st.objects, 0);
	EQ(st.visible, 0);
	EQ(st.writing, 0);
	EQ(st.dropped, 0);
	EQ(st.pins, 0);
	EQ(st.pinned_objects, 0);
	EQ(st.bytes_used, 0);
	EQ(st.bytes_slabs, 0);
	EQ(st.slabs, 0);
}

START_TEST(test_writing_object_is_invisible_until_commit)
{
	struct dram		*d = dram_mk(4 * MIB);
	struct dram_stats	 st;
	struct obj_key		 k;
	uint8_t			*buf;
	uint32_t		 id, got, lru[4];
	uint64_t		 len, csum;

	key_of(&k, 1);
	EQ(dram_alloc(d, &k, 5000, DRAM_NONE, 1, &id, &buf), 0);
	EQ(dram_lookup(d, &k, &got), -ENOENT);
	EQ(dram_pin(d, id), -ENOENT);
	EQ(dram_lru_order(d, 5000, lru, 4), 0);
	dram_stats(d, &st);
	EQ(st.writing, 1);
	EQ(st.visible, 0);
	EQ(st.objects, 1);
	EQ(st.bytes_used, 5000);
	/* The writer's buffer is the object's memory. */
	PEQ(dram_data_mut(d, id), buf);
	fill(buf, 5000, 1);
	EQ(dram_lookup(d, &k, &got), -ENOENT);
	EQ(dram_commit(d, id, checksum_obj(buf, 5000)), 0);
	EQ(dram_lookup(d, &k, &got), 0);
	EQ(got, id);
	PEQ(dram_data(d, id, &len, &csum), buf);
	EQ(len, 5000);
	EQ(csum, checksum_obj(buf, 5000));
	EQ(dram_lru_order(d, 5000, lru, 4), 1);
	EQ(dram_commit(d, id, 0), -EINVAL);
	dram_stats(d, &st);
	EQ(st.writing, 0);
	EQ(st.visible, 1);
	dram_drop(d, id);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_duplicate_key_is_refused_while_writing_and_after_commit)
{
	struct dram		*d = dram_mk(4 * MIB);
	struct dram_stats	 a, b;
	struct obj_key		 k;
	uint8_t			*buf, *buf2;
	uint32_t		 id, id2;

	key_of(&k, 7);
	EQ(dram_alloc(d, &k, 4096, DRAM_NONE, 1, &id, &buf), 0);
	dram_stats(d, &a);
	EQ(dram_alloc(d, &k, 4096, DRAM_NONE, 1, &id2, &buf2), -EEXIST);
	EQ(id2, id);		/* the object holding the key */
	EQ(dram_alloc(d, &k, 8192, DRAM_NONE, 1, &id2, &buf2), -EEXIST);
	dram_stats(d, &b);
	ck_assert_mem_eq(&a, &b, sizeof(a));
	EQ(dram_commit(d, id, 1), 0);
	EQ(dram_alloc(d, &k, 4096, DRAM_NONE, 1, &id2, &buf2), -EEXIST);
	dram_stats(d, &b);
	EQ(b.objects, 1);
	/* Dropped or aborted, the key may be published again. */
	dram_drop(d, id);
	EQ(dram_alloc(d, &k, 4096, DRAM_NONE, 1, &id2, &buf2), 0);
	dram_abort(d, id2);
	EQ(dram_alloc(d, &k, 4096, DRAM_NONE, 1, &id2, &buf2), 0);
	dram_abort(d, id2);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_lookup_has_no_side_effects)
{
	struct dram		*d = dram_mk(4 * MIB);
	struct dram_stats	 a, b;
	struct obj_key		 k;
	uint32_t		 ids[16], la[32], lb[32], id, w, n;
	size_t			 na, nb;
	uint8_t			*buf;

	for (n = 0; n < 16; n++)
		ids[n] = put(d, n, 1000, DRAM_NONE);
	dram_touch(d, ids[3]);
	EQ(dram_pin(d, ids[5]), 0);
	dram_drop(d, ids[9]);
	key_of(&k, 100);
	EQ(dram_alloc(d, &k, 1000, DRAM_NONE, 1, &w, &buf), 0);
	dram_stats(d, &a);
	na = dram_lru_order(d, 1000, la, 32);
	EQ(na, 14);
	EQ(la[na - 1], ids[3]);
	for (n = 0; n < 200; n++) {
		key_of(&k, n);
		if (dram_lookup(d, &k, &id) == 0)
			EQ(id, ids[n]);
		else
			CHECK(n == 9 || n >= 16, "n == 9 || n >= 16");
	}
	/* The lookups: hits, misses, a WRITING key and a dropped key. */
	for (n = 0; n < 1000; n++) {
		key_of(&k, n % 20);
		(void)dram_lookup(d, &k, &id);
		key_of(&k, 100);
		EQ(dram_lookup(d, &k, &id), -ENOENT);
	}
	dram_stats(d, &b);
	nb = dram_lru_order(d, 1000, lb, 32);
	ck_assert_mem_eq(&a, &b, sizeof(a));
	EQ(na, nb);
	ck_assert_mem_eq(la, lb, na * sizeof(la[0]));
	dram_abort(d, w);
	dram_unpin(d, ids[5]);
	drop_keys(d, 0, 16);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_lookup_many_answers_as_lookup_does)
{
	struct dram		*d = dram_mk(64 * MIB);
	struct dram_stats	 a, b;
	struct obj_key		*keys, k;
	uint32_t		*ids, id, w, n, hits = 0;
	uint8_t			*buf;

	keys = calloc(3000, sizeof(*keys));
	ids = calloc(3000, sizeof(*ids));
	ck_assert_ptr_nonnull(keys);
	ck_assert_ptr_nonnull(ids);
	/* Enough objects that chains have more than one entry. */
	for (n = 0; n < 2000; n++)
		put(d, n, 4096, DRAM_NONE);
	drop_keys(d, 100, 200);
	key_of(&k, 300);
	dram_drop(d, find(d, 300));
	ck_assert_int_eq(dram_alloc(d, &k, 4096, DRAM_NONE, 1, &w, &buf), 0);	/* WRITING */
	for (n = 0; n < 3000; n++)
		key_of(&keys[n], (n * 7919) % 3000);
	dram_stats(d, &a);
	EQ(dram_lookup_many(d, keys, 3000, ids), 1899);
	dram_stats(d, &b);
	ck_assert_mem_eq(&a, &b, sizeof(a));
	for (n = 0; n < 3000; n++) {
		if (dram_lookup(d, &keys[n], &id) == 0) {
			EQ(ids[n], id);
			hits++;
		} else
			EQ(ids[n], DRAM_NONE);
	}
	EQ(hits, 1899);
	EQ(dram_lookup_many(d, keys, 0, ids), 0);
	/* A short batch, not a multiple of the pipeline depth. */
	for (n = 0, hits = 0; n < 17; n++)
		hits += dram_lookup(d, &keys[5 + n], &id) == 0;
	EQ(dram_lookup_many(d, keys + 5, 17, ids), hits);
	dram_abort(d, w);
	drop_keys(d, 0, 2000);
	assert_empty(d);
	free(keys);
	free(ids);
	dram_free(d);
}
END_TEST

START_TEST(test_abort_frees_everything)
{
	struct dram		*d = dram_mk(8 * MIB);
	struct dram_stats	 st;
	struct obj_key		 k;
	uint32_t		 ids[300], n;
	uint8_t			*buf;

	for (n = 0; n < 300; n++) {
		key_of(&k, n);
		EQ(dram_alloc(d, &k, n % 2 ? 3000 : 40000, DRAM_NONE, 1, &ids[n], &buf), 0);
		fill(buf, n % 2 ? 3000 : 40000, n);
	}
	dram_stats(d, &st);
	EQ(st.writing, 300);
	EQ(st.bytes_used, 150 * 3000 + 150 * 40000);
	ck_assert_uint_ge(st.slabs, 2);
	for (n = 0; n < 300; n++)
		dram_abort(d, ids[n]);
	assert_empty(d);
	for (n = 0; n < 300; n++)
		EQ(find(d, n), DRAM_NONE);
	/* The keys are free again. */
	for (n = 0; n < 300; n++)
		put(d, n, 3000, DRAM_NONE);
	drop_keys(d, 0, 300);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_drop_of_pinned_object_frees_at_last_unpin)
{
	struct dram		*d = dram_mk(4 * MIB);
	struct dram_stats	 st;
	const uint8_t		*old, *nw;
	uint32_t		 id, id2;

	id = put(d, 1, 10000, DRAM_NONE);
	EQ(dram_pin(d, id), 0);
	EQ(dram_pin(d, id), 0);
	dram_drop(d, id);
	EQ(find(d, 1), DRAM_NONE);
	EQ(dram_pin(d, id), -ENOENT);
	dram_stats(d, &st);
	EQ(st.dropped, 1);
	EQ(st.visible, 0);
	EQ(st.objects, 1);
	EQ(st.pins, 2);
	EQ(st.pinned_objects, 1);
	EQ(st.drops, 1);
	/* Its bytes stay for the copies in flight. */
	assert_object(d, id, 1, 10000);
	old = dram_data(d, id, NULL, NULL);
	/* The key is published again, into other memory. */
	id2 = put(d, 1, 10000, DRAM_NONE);
	ck_assert_uint_ne(id2, id);
	nw = dram_data(d, id2, NULL, NULL);
	CHECK(nw + 10000 <= old || old + 10000 <= nw, "nw + 10000 <= old || old + 10000 <= nw");
	dram_drop(d, id);		/* idempotent */
	dram_stats(d, &st);
	EQ(st.drops, 1);
	dram_unpin(d, id);
	assert_object(d, id, 1, 10000);
	dram_stats(d, &st);
	EQ(st.dropped, 1);
	dram_unpin(d, id);
	dram_stats(d, &st);
	EQ(st.dropped, 0);
	EQ(st.objects, 1);
	EQ(st.pins, 0);
	EQ(st.bytes_used, 10000);
	EQ(find(d, 1), id2);
	dram_drop(d, id2);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_eviction_never_takes_a_pinned_object)
{
	struct dram		*d = dram_mk(4 * MIB);	/* 2 units, 256 objects of 16 KiB */
	struct dram_stats	 st;
	struct obj_key		 k;
	uint32_t		 ids[256], w, n, id;
	uint8_t			*wbuf, *buf;
	int			 rc;

	key_of(&k, 9999);
	EQ(dram_alloc(d, &k, 16384, DRAM_NONE, 1, &w, &wbuf), 0);
	fill(wbuf, 16384, 9999);
	for (n = 0; n < 255; n++) {
		ids[n] = put(d, n, 16384, DRAM_NONE);
		if (n % 3 == 0)
			EQ(dram_pin(d, ids[n]), 0);
	}
	for (n = 1000; n < 3000; n++) {
		key_of(&k, n);
		rc = dram_alloc(d, &k, 16384, DRAM_NONE, 1, &id, &buf);
		EQ(rc, 0);
		/* Never the memory of a WRITING or pinned object. */
		ck_assert_ptr_ne(buf, wbuf);
		fill(buf, 16384, n);
		EQ(dram_commit(d, id, checksum_obj(buf, 16384)), 0);
	}
	dram_stats(d, &st);
	EQ(st.evictions, 2000);
	EQ(st.pinned_objects, 85);
	EQ(st.writing, 1);
	EQ(st.objects, 256);
	CHECK(intact(wbuf, 16384, 9999), "a WRITING object was overwritten");
	for (n = 0; n < 255; n++) {
		if (n % 3 == 0) {
			EQ(find(d, n), ids[n]);
			assert_object(d, ids[n], n, 16384);
			dram_unpin(d, ids[n]);
		} else
			EQ(find(d, n), DRAM_NONE);
	}
	dram_abort(d, w);
	drop_keys(d, 0, 3000);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_eviction_follows_lru_order)
{
	struct dram		*d = dram_mk(2 * MIB);	/* 1 unit: 32 objects of 64 KiB */
	struct dram_stats	 st;
	uint32_t		 ids[32], lru[40], n;

	for (n = 0; n < 32; n++)
		ids[n] = put(d, n, 65536, DRAM_NONE);
	EQ(dram_lru_order(d, 65536, lru, 40), 32);
	EQ(lru[0], ids[0]);
	dram_touch(d, ids[0]);
	EQ(dram_pin(d, ids[1]), 0);
	dram_unpin(d, ids[1]);		/* the last unpin is a use */
	EQ(dram_lru_order(d, 65536, lru, 40), 32);
	EQ(lru[0], ids[2]);
	EQ(lru[30], ids[0]);
	EQ(lru[31], ids[1]);
	put(d, 100, 65536, DRAM_NONE);
	EQ(find(d, 2), DRAM_NONE);
	EQ(find(d, 0), ids[0]);
	put(d, 101, 65536, DRAM_NONE);
	EQ(find(d, 3), DRAM_NONE);
	dram_stats(d, &st);
	EQ(st.evictions, 2);
	drop_keys(d, 0, 200);
	assert_empty(d);
	dram_free(d);
}
END_TEST

/*
 * The peer tier's mark: a pulled object no restore has checked. Lookups
 * see it as any other; the mark and its count go with the object however
 * it goes (checked, dropped, evicted), and a slot reused holds no mark.
 */
START_TEST(test_unverified_mark_follows_its_object)
{
	struct dram		*d = dram_mk(2 * MIB);	/* 1 unit: 32 objects of 64 KiB */
	struct dram_stats	 st;
	uint32_t		 a, b, c, id, n;

	a = put(d, 1, 65536, DRAM_NONE);
	b = put(d, 2, 65536, DRAM_NONE);
	c = put(d, 3, 65536, DRAM_NONE);
	EQ(dram_unverified(d, a), 0);
	EQ(dram_set_unverified(d, a, 1), 0);
	EQ(dram_set_unverified(d, a, 1), 0);	/* counted once */
	EQ(dram_set_unverified(d, b, 1), 0);
	EQ(dram_set_unverified(d, c, 1), 0);
	EQ(dram_set_unverified(d, 999999, 1), -EINVAL);
	EQ(dram_unverified(d, a), 1);
	EQ(find(d, 1), a);			/* still a hit */
	dram_stats(d, &st);
	EQ(st.unverified, 3);
	EQ(dram_set_unverified(d, a, 0), 0);	/* a restore checked it */
	EQ(dram_unverified(d, a), 0);
	dram_drop(d, b);			/* a restore found it corrupt */
	dram_stats(d, &st);
	EQ(st.unverified, 1);
	/* c is the least recently used: the next allocations evict it first. */
	dram_touch(d, a);
	for (n = 10; n < 10 + 31; n++)
		put(d, n, 65536, DRAM_NONE);
	EQ(find(d, 3), DRAM_NONE);
	dram_stats(d, &st);
	EQ(st.unverified, 0);
	for (n = 10; n < 10 + 31; n++)
		if ((id = find(d, n)) != DRAM_NONE)
			EQ(dram_unverified(d, id), 0);
	/* A WRITING object cannot be marked. */
	{
		struct obj_key	k;
		uint8_t		*buf;

		key_of(&k, 100);
		EQ(dram_alloc(d, &k, 65536, DRAM_NONE, 1, &id, &buf), 0);
		EQ(dram_set_unverified(d, id, 1), -EINVAL);
		dram_abort(d, id);
	}
	drop_keys(d, 0, 200);
	assert_empty(d);
	dram_free(d);
}
END_TEST

/*
 * publish.c's placement: a PUBLISH whose first pages are present (a prefix
 * published before, now extended) places its first new page right after
 * the prefix's last, where that slot is free, rather than wherever a run
 * for the whole batch begins.
 */
START_TEST(test_publish_continues_a_present_prefix)
{
	struct dram	*d = dram_mk(4 * MIB);
	struct obj_key	 k;
	uint32_t	 n, id, near = DRAM_NONE;
	uint8_t		*buf;
	const uint8_t	*last = NULL;

	/* The prefix 0..7 in slots 0..7, two slots free after it, then another object. */
	for (n = 0; n < 8; n++)
		put(d, n, 65536, n == 0 ? DRAM_NONE : find(d, n - 1));
	put(d, 998, 65536, find(d, 7));
	put(d, 999, 65536, find(d, 998));
	put(d, 1000, 65536, find(d, 999));
	drop_keys(d, 998, 1000);
	/* The extended prefix, 0..15, reserved as publish_request does. */
	for (n = 0; n < 16; n++) {
		key_of(&k, n);
		if (n < 8) {
			EQ(publish_reserve(d, &k, 65536, &near, 16 - n, &id, &buf), -EEXIST);
			last = dram_data(d, find(d, n), NULL, NULL);
			EQ(near, find(d, n));
			continue;
		}
		EQ(publish_reserve(d, &k, 65536, &near, 16 - n, &id, &buf), 0);
		EQ(near, id);
		if (n == 8)
			CHECK(buf == last + 65536, "page 8 is not after the prefix's last page");
		fill(buf, 65536, n);
		EQ(dram_commit(d, id, checksum_obj(buf, 65536)), 0);
	}
	drop_keys(d, 0, 1001);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_no_space_when_everything_is_pinned)
{
	struct dram		*d = dram_mk(2 * MIB);
	struct dram_stats	 a, b;
	struct obj_key		 k;
	uint32_t		 ids[32], n, id;
	uint8_t			*buf;

	for (n = 0; n < 32; n++) {
		ids[n] = put(d, n, 65536, DRAM_NONE);
		EQ(dram_pin(d, ids[n]), 0);
	}
	dram_stats(d, &a);
	key_of(&k, 100);
	EQ(dram_alloc(d, &k, 65536, DRAM_NONE, 1, &id, &buf), -ENOSPC);
	/* Another size cannot take a slab that holds pinned objects. */
	EQ(dram_alloc(d, &k, 1000, DRAM_NONE, 1, &id, &buf), -ENOSPC);
	dram_stats(d, &b);
	EQ(b.evict_failures, a.evict_failures + 2);
	b.evict_failures = a.evict_failures;
	ck_assert_mem_eq(&a, &b, sizeof(a));
	for (n = 0; n < 32; n++)
		assert_object(d, ids[n], n, 65536);
	/* One unpinned object makes room: it is the one evicted. */
	dram_unpin(d, ids[17]);
	EQ(dram_alloc(d, &k, 65536, DRAM_NONE, 1, &id, &buf), 0);
	EQ(find(d, 17), DRAM_NONE);
	dram_abort(d, id);
	for (n = 0; n < 32; n++)
		if (n != 17)
			dram_unpin(d, ids[n]);
	drop_keys(d, 0, 32);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_writing_objects_are_never_evicted)
{
	struct dram		*d = dram_mk(2 * MIB);
	struct obj_key		 k;
	uint32_t		 ids[32], n, id;
	uint8_t			*bufs[32], *buf;

	for (n = 0; n < 32; n++) {
		key_of(&k, n);
		EQ(dram_alloc(d, &k, 65536, DRAM_NONE, 1, &ids[n], &bufs[n]), 0);
		fill(bufs[n], 65536, n);
	}
	key_of(&k, 100);
	EQ(dram_alloc(d, &k, 65536, DRAM_NONE, 1, &id, &buf), -ENOSPC);
	EQ(dram_alloc(d, &k, 100, DRAM_NONE, 1, &id, &buf), -ENOSPC);
	for (n = 0; n < 32; n++) {
		CHECK(intact(bufs[n], 65536, n), "WRITING object %u changed", n);
		dram_abort(d, ids[n]);
	}
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_slab_returns_to_arena_and_serves_another_size)
{
	struct dram		*d = dram_mk(8 * MIB);	/* 4 units */
	struct dram_stats	 st;
	uint32_t		 n;

	for (n = 0; n < 2048; n++)
		put(d, n, 4096, DRAM_NONE);
	dram_stats(d, &st);
	EQ(st.slabs, 4);
	EQ(st.bytes_slabs, 8 * MIB);
	EQ(st.evictions, 0);
	drop_keys(d, 0, 2048);
	assert_empty(d);
	/* All of the arena now serves 1 MiB objects, without eviction. */
	for (n = 0; n < 8; n++)
		put(d, 10000 + n, MIB, DRAM_NONE);
	dram_stats(d, &st);
	EQ(st.slabs, 4);
	EQ(st.evictions, 0);
	EQ(st.bytes_used, 8 * MIB);
	put(d, 10008, MIB, DRAM_NONE);
	dram_stats(d, &st);
	EQ(st.evictions, 1);
	EQ(find(d, 10000), DRAM_NONE);
	drop_keys(d, 10000, 10009);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_other_size_evicts_the_least_recently_used_whole_slab)
{
	struct dram		*d = dram_mk(8 * MIB);
	struct dram_stats	 st;
	struct obj_key		 k;
	uint32_t		 n, id;
	uint8_t			*buf;

	for (n = 0; n < 2048; n++)
		put(d, n, 4096, DRAM_NONE);
	/* Use the first slab again: the second is now the oldest. */
	for (n = 0; n < 512; n++)
		dram_touch(d, find(d, n));
	put(d, 5000, MIB, DRAM_NONE);
	dram_stats(d, &st);
	EQ(st.evictions, 512);
	for (n = 0; n < 2048; n++)
		CHECK((find(d, n) == DRAM_NONE) == (n >= 512 && n < 1024),
		    "key %u: evicted from the wrong slab", n);
	/* A pinned object in every slab protects them all. */
	EQ(dram_pin(d, find(d, 0)), 0);
	EQ(dram_pin(d, find(d, 1024)), 0);
	EQ(dram_pin(d, find(d, 1536)), 0);
	put(d, 5001, MIB, DRAM_NONE);	/* the 1 MiB slab has a free slot */
	EQ(dram_pin(d, find(d, 5000)), 0);
	EQ(dram_pin(d, find(d, 5001)), 0);
	key_of(&k, 6000);
	EQ(dram_alloc(d, &k, 3 * MIB, DRAM_NONE, 1, &id, &buf), -ENOSPC);
	dram_stats(d, &st);
	EQ(st.evictions, 512);
	EQ(st.evict_failures, 1);
	dram_unpin(d, find(d, 0));
	dram_unpin(d, find(d, 1024));
	dram_unpin(d, find(d, 1536));
	dram_unpin(d, find(d, 5000));
	dram_unpin(d, find(d, 5001));
	/* Unpinned, whole slabs of either size make room. */
	EQ(dram_alloc(d, &k, 3 * MIB, DRAM_NONE, 1, &id, &buf), 0);
	fill(buf, 3 * MIB, 6000);
	dram_abort(d, id);
	drop_keys(d, 0, 7000);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_near_hint_places_pages_contiguously)
{
	struct dram	*d = dram_mk(2 * MIB);	/* one slab of 32 x 64 KiB */
	uint32_t	 ids[32], a, b, c, n;
	const uint8_t	*p19, *pa, *pb, *pc, *p0;

	for (n = 0; n < 32; n++)
		ids[n] = put(d, n, 65536, DRAM_NONE);
	p0 = dram_data(d, ids[0], NULL, NULL);
	/* Published in order, a prefix is contiguous already. */
	for (n = 1; n < 32; n++)
		PEQ(dram_data(d, ids[n], NULL, NULL), p0 + n * 65536);
	p19 = dram_data(d, ids[19], NULL, NULL);
	for (n = 4; n < 7; n++)
		dram_drop(d, ids[n]);
	for (n = 20; n < 23; n++)
		dram_drop(d, ids[n]);
	/* A page with a hint follows its predecessor... */
	a = put(d, 100, 65536, ids[19]);
	b = put(d, 101, 65536, a);
	c = put(d, 102, 65536, b);
	pa = dram_data(d, a, NULL, NULL);
	pb = dram_data(d, b, NULL, NULL);
	pc = dram_data(d, c, NULL, NULL);
	PEQ(pa, p19 + 65536);
	PEQ(pb, pa + 65536);
	PEQ(pc, pb + 65536);
	/* ...and without one, or when the next slot is taken, takes the first hole. */
	a = put(d, 103, 65536, ids[30]);
	PEQ(dram_data(d, a, NULL, NULL), p0 + 4 * 65536);
	a = put(d, 104, 65536, DRAM_NONE);
	PEQ(dram_data(d, a, NULL, NULL), p0 + 5 * 65536);
	drop_keys(d, 0, 200);
	assert_empty(d);
	dram_free(d);
}
END_TEST

/*
 * Publishes a batch of n new objects (keys from key) as publish.c does:
 * each after the previous one, with the count still to come; their
 * buffers into bufs.
 */
static void
put_batch(struct dram *d, uint32_t key, uint32_t n, uint64_t len, uint32_t *ids,
    const uint8_t **bufs)
{
	struct obj_key	 k;
	uint32_t	 i, near = DRAM_NONE;
	uint8_t		*buf;

	for (i = 0; i < n; i++) {
		key_of(&k, key + i);
		EQ(dram_alloc(d, &k, len, near, n - i, &ids[i], &buf), 0);
		fill(buf, len, key + i);
		EQ(dram_commit(d, ids[i], checksum_obj(buf, len)), 0);
		bufs[i] = buf;
		near = ids[i];
	}
}

/*
 * An arena of 8 slabs of 32 x 64 KiB, full (object i at slot i), its LRU
 * churned: oldest the four isolated objects `lone` (their neighbours
 * used after), then those of slab 3's slots 10..21, then all others in
 * an order that never has two neighbours follow each other. Today's
 * eviction order alone would put a new batch on the lone ones first.
 */
static const uint32_t churn_lone[4] = { 5, 32 + 7, 64 + 9, 128 + 1 };

static struct dram *
churned_arena(uint32_t *ids, const uint8_t **p0)
{
	struct dram	*d = dram_mk(16 * MIB);
	uint32_t	 i, j, x;

	for (i = 0; i < 256; i++)
		ids[i] = put(d, i, 65536, DRAM_NONE);
	*p0 = dram_data(d, ids[0], NULL, NULL);
	for (i = 0; i < 256; i++)
		PEQ(dram_data(d, ids[i], NULL, NULL), *p0 + (uint64_t)i * 65536);
	for (i = 0; i < 4; i++)
		dram_touch(d, ids[churn_lone[i]]);
	for (i = 96 + 10; i < 96 + 22; i++)
		dram_touch(d, ids[i]);
	for (j = 0; j < 256; j++) {
		x = j * 97 % 256;	/* 97 is odd: a permutation */
		if (x == churn_lone[0] || x == churn_lone[1] || x == churn_lone[2] ||
		    x == churn_lone[3] || (x >= 96 + 10 && x < 96 + 22))
			continue;
		dram_touch(d, ids[x]);
	}
	return d;
}

START_TEST(test_batch_lands_in_one_run_in_a_churned_arena)
{
	struct dram		*d;
	struct dram_stats	 st;
	const uint8_t		*p0, *bufs[12];
	uint32_t		 ids[256], b[12], i;

	/* Room made by eviction: the run among the oldest objects is opened. */
	d = churned_arena(ids, &p0);
	put_batch(d, 1000, 12, 65536, b, bufs);
	for (i = 0; i < 12; i++)
		PEQ(bufs[i], p0 + (uint64_t)(96 + 10 + i) * 65536);
	dram_stats(d, &st);
	EQ(st.evictions, 12);
	for (i = 0; i < 256; i++)
		EQ(find(d, i) == DRAM_NONE, i >= 96 + 10 && i < 96 + 22);
	for (i = 0; i < 12; i++)
		assert_object(d, b[i], 1000 + i, 65536);
	drop_keys(d, 0, 2000);
	assert_empty(d);
	dram_free(d);

	/* Room free already: the run long enough, not the first hole. */
	d = dram_mk(4 * MIB);
	for (i = 0; i < 32; i++)
		ids[i] = put(d, i, 65536, DRAM_NONE);
	p0 = dram_data(d, ids[0], NULL, NULL);
	dram_drop(d, ids[3]);
	for (i = 10; i < 26; i++)
		dram_drop(d, ids[i]);
	put_batch(d, 1000, 12, 65536, b, bufs);
	for (i = 0; i < 12; i++)
		PEQ(bufs[i], p0 + (uint64_t)(10 + i) * 65536);
	/* Runs too short for it (slots 3, 22..25): a new slab, not the holes. */
	put_batch(d, 2000, 6, 65536, b, bufs);
	for (i = 0; i < 6; i++)
		PEQ(bufs[i], p0 + (uint64_t)(32 + i) * 65536);
	dram_stats(d, &st);
	EQ(st.evictions, 0);
	EQ(st.slabs, 2);
	drop_keys(d, 0, 3000);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_opening_a_run_never_evicts_pinned_or_writing_objects)
{
	struct dram		*d;
	struct dram_stats	 st;
	struct obj_key		 k;
	const uint8_t		*p0, *bufs[12];
	uint32_t		 ids[256], b[12], pinned, w, i;
	uint8_t			*wbuf;

	/* Slab 3's slots 10..21, but 15 pinned and 18 WRITING. */
	d = churned_arena(ids, &p0);
	pinned = ids[96 + 15];
	EQ(dram_pin(d, pinned), 0);
	dram_drop(d, ids[96 + 18]);
	key_of(&k, 999);
	EQ(dram_alloc(d, &k, 65536, ids[96 + 17], 1, &w, &wbuf), 0);
	PEQ(wbuf, p0 + (uint64_t)(96 + 18) * 65536);
	fill(wbuf, 65536, 999);
	put_batch(d, 1000, 12, 65536, b, bufs);
	/* The longest runs first: 10..14, 19..21, 16..17; then the two oldest lone ones. */
	for (i = 0; i < 5; i++)
		PEQ(bufs[i], p0 + (uint64_t)(96 + 10 + i) * 65536);
	for (i = 5; i < 8; i++)
		PEQ(bufs[i], p0 + (uint64_t)(96 + 19 + i - 5) * 65536);
	for (i = 8; i < 10; i++)
		PEQ(bufs[i], p0 + (uint64_t)(96 + 16 + i - 8) * 65536);
	dram_stats(d, &st);
	EQ(st.evictions, 12);
	EQ(st.writing, 1);
	EQ(st.pinned_objects, 1);
	EQ(find(d, 96 + 15), pinned);
	assert_object(d, pinned, 96 + 15, 65536);
	CHECK(intact(wbuf, 65536, 999), "a WRITING object was overwritten");
	EQ(find(d, churn_lone[0]), DRAM_NONE);
	EQ(find(d, churn_lone[1]), DRAM_NONE);
	EQ(find(d, churn_lone[2]), ids[churn_lone[2]]);
	EQ(find(d, churn_lone[3]), ids[churn_lone[3]]);
	for (i = 0; i < 12; i++) {
		CHECK(bufs[i] != wbuf && bufs[i] != dram_data(d, pinned, NULL, NULL),
		    "batch page %u on a held object", i);
		assert_object(d, b[i], 1000 + i, 65536);
	}
	dram_unpin(d, pinned);
	dram_abort(d, w);
	drop_keys(d, 0, 2000);
	assert_empty(d);
	dram_free(d);

	/* Everything held but one lone object: the batch still gets room, one page at a time. */
	d = churned_arena(ids, &p0);
	for (i = 0; i < 256; i++)
		if (i != churn_lone[2])
			EQ(dram_pin(d, ids[i]), 0);
	key_of(&k, 1000);
	EQ(dram_alloc(d, &k, 65536, DRAM_NONE, 12, &b[0], &wbuf), 0);
	PEQ(wbuf, p0 + (uint64_t)churn_lone[2] * 65536);
	key_of(&k, 1001);
	EQ(dram_alloc(d, &k, 65536, b[0], 11, &b[1], &wbuf), -ENOSPC);
	dram_abort(d, b[0]);
	for (i = 0; i < 256; i++)
		if (i != churn_lone[2])
			dram_unpin(d, ids[i]);
	dram_stats(d, &st);
	EQ(st.evictions, 1);
	EQ(st.pins, 0);
	drop_keys(d, 0, 2000);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_index_grows_past_initial_capacity)
{
	struct dram		*d = dram_mk(16 * MIB);	/* 262144 slots of 64 bytes */
	struct dram_stats	 st;
	struct obj_key		 k;
	uint32_t		*ids, n, id;
	uint8_t			*buf;

	ids = malloc(200000 * sizeof(*ids));
	ck_assert_ptr_nonnull(ids);
	for (n = 0; n < 200000; n++) {
		key_of(&k, n);
		EQ(dram_alloc(d, &k, 64, DRAM_NONE, 1, &ids[n], &buf), 0);
		memcpy(buf, &n, sizeof(n));
		EQ(dram_commit(d, ids[n], n), 0);
	}
	dram_stats(d, &st);
	EQ(st.visible, 200000);
	EQ(st.evictions, 0);
	ck_assert_uint_ge(st.index_buckets, 200000);
	for (n = 0; n < 200000; n++) {
		key_of(&k, n);
		EQ(dram_lookup(d, &k, &id), 0);
		EQ(id, ids[n]);
		EQ(memcmp(dram_data(d, id, NULL, NULL), &n, sizeof(n)), 0);
		key_of(&k, n + 200000);
		EQ(dram_lookup(d, &k, &id), -ENOENT);
	}
	for (n = 0; n < 200000; n += 2)
		dram_drop(d, ids[n]);
	for (n = 0; n < 200000; n++)
		EQ(find(d, n), n % 2 ? ids[n] : DRAM_NONE);
	for (n = 1; n < 200000; n += 2)
		dram_drop(d, ids[n]);
	assert_empty(d);
	free(ids);
	dram_free(d);
}
END_TEST

/* Fills the arena with objects of len and returns meta bytes per object. */
static double
meta_at_full_load(uint64_t arena, uint64_t len, uint64_t count)
{
	struct dram		*d = dram_mk(arena);
	struct dram_stats	 st;
	struct obj_key		 k;
	uint32_t		 n, id;
	uint8_t			*buf;

	for (n = 0; n < count; n++) {
		key_of(&k, n);
		EQ(dram_alloc(d, &k, len, DRAM_NONE, 1, &id, &buf), 0);
		EQ(dram_commit(d, id, n), 0);
	}
	dram_stats(d, &st);
	EQ(st.evictions, 0);
	EQ(st.objects, count);
	printf("dram: %llu objects of %llu bytes: %.2f meta bytes/object, %llu buckets\n",
	    (unsigned long long)count, (unsigned long long)len, st.meta_bytes_per_object,
	    (unsigned long long)st.index_buckets);
	dram_free(d);
	return st.meta_bytes_per_object;
}

START_TEST(test_metadata_is_at_most_96_bytes_per_object)
{
	/* The arena full of 256-byte objects. */
	ck_assert_double_le(meta_at_full_load(32 * MIB, 256, 32 * MIB / 256), 96.0);
	/* Full of 4 KiB objects. */
	ck_assert_double_le(meta_at_full_load(256 * MIB, 4096, 256 * MIB / 4096), 96.0);
	/* The worst point: one object past an index doubling. */
	ck_assert_double_le(meta_at_full_load(16 * MIB, 64, 131073), 96.0);
}
END_TEST

static uint64_t
checksum_reference(const uint8_t *p, size_t len)
{
	size_t		 n = (len + CHECKSUM_CHUNK - 1) / CHECKSUM_CHUNK, i, j, l;
	uint8_t		*dig = malloc((n + 1) * 8);
	uint64_t	 h, v;

	ck_assert_ptr_nonnull(dig);
	for (i = 0; i < n; i++) {
		l = len - i * CHECKSUM_CHUNK < CHECKSUM_CHUNK ? len - i * CHECKSUM_CHUNK :
		    CHECKSUM_CHUNK;
		v = XXH3_64bits(p + i * CHECKSUM_CHUNK, l);
		for (j = 0; j < 8; j++)
			dig[i * 8 + j] = (uint8_t)(v >> (8 * j));
	}
	for (j = 0; j < 8; j++)
		dig[n * 8 + j] = (uint8_t)((uint64_t)len >> (8 * j));
	h = XXH3_64bits(dig, (n + 1) * 8);
	free(dig);
	return h;
}

START_TEST(test_checksum_chunked_matches_reference)
{
	static const size_t	 lens[] = { 0, 1, 63, 4096, CHECKSUM_CHUNK - 1, CHECKSUM_CHUNK,
	    CHECKSUM_CHUNK + 1, 5 * CHECKSUM_CHUNK + 123, 36864, 2359296,
	    600 * (size_t)CHECKSUM_CHUNK + 7 };	/* past the on-stack digests */
	size_t			 max = 600 * (size_t)CHECKSUM_CHUNK + 7, i;
	uint8_t			*p = malloc(max);
	uint64_t		 x = 0x9e3779b97f4a7c15ULL;

	ck_assert_ptr_nonnull(p);
	for (i = 0; i < max; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
	for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		EQ(checksum_obj(p, lens[i]), checksum_reference(p, lens[i]));
	/* The length is part of it: trailing zeros change the value. */
	memset(p, 0, 2 * CHECKSUM_CHUNK);
	ck_assert_uint_ne(checksum_obj(p, 100), checksum_obj(p, 101));
	ck_assert_uint_ne(checksum_obj(p, CHECKSUM_CHUNK), checksum_obj(p, 2 * CHECKSUM_CHUNK));
	free(p);
}
END_TEST

START_TEST(test_checksum_detects_a_flipped_byte)
{
	struct dram	*d = dram_mk(4 * MIB);
	static const uint64_t	at[] = { 0, 1, CHECKSUM_CHUNK - 1, CHECKSUM_CHUNK,
	    2 * CHECKSUM_CHUNK + 5, 200000 - 1 };
	uint64_t	 len, csum, i, bit;
	uint32_t	 id;
	uint8_t		*m, save[CHECKSUM_CHUNK];

	id = put(d, 1, 200000, DRAM_NONE);
	m = dram_data_mut(d, id);
	PEQ(dram_data(d, id, &len, &csum), m);
	EQ(checksum_obj(m, len), csum);
	for (i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		for (bit = 0; bit < 8; bit++) {
			m[at[i]] ^= (uint8_t)(1U << bit);
			ck_assert_uint_ne(checksum_obj(m, len), csum);
			m[at[i]] ^= (uint8_t)(1U << bit);
		}
	}
	EQ(checksum_obj(m, len), csum);
	/* Swapped chunks are caught: the digests are hashed in order. */
	memset(m, 0x11, CHECKSUM_CHUNK);
	memset(m + CHECKSUM_CHUNK, 0x22, CHECKSUM_CHUNK);
	csum = checksum_obj(m, len);
	memcpy(save, m, CHECKSUM_CHUNK);
	memmove(m, m + CHECKSUM_CHUNK, CHECKSUM_CHUNK);
	memcpy(m + CHECKSUM_CHUNK, save, CHECKSUM_CHUNK);
	ck_assert_uint_ne(checksum_obj(m, len), csum);
	dram_drop(d, id);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_objects_of_16_mib_and_more_fit_an_arena_that_holds_them)
{
	struct dram		*d = dram_mk(64 * MIB);
	struct dram_stats	 st;
	struct obj_key		 k;
	uint32_t		 ids[4], n, id;
	uint8_t			*buf;

	for (n = 0; n < 4; n++) {
		ids[n] = put(d, n, 16 * MIB, DRAM_NONE);
		EQ((uintptr_t)dram_data(d, ids[n], NULL, NULL) % (2 * MIB), 0);
	}
	dram_stats(d, &st);
	EQ(st.bytes_used, 64 * MIB);
	key_of(&k, 50);
	EQ(dram_alloc(d, &k, 65 * MIB, DRAM_NONE, 1, &id, &buf), -EFBIG);
	/* 40 MiB takes 20 units: the three oldest 16 MiB objects go. */
	put(d, 50, 40 * MIB, DRAM_NONE);
	dram_stats(d, &st);
	EQ(st.evictions, 3);
	EQ(find(d, 3), ids[3]);
	assert_object(d, ids[3], 3, 16 * MIB);
	assert_object(d, find(d, 50), 50, 40 * MIB);
	drop_keys(d, 0, 100);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_objects_are_aligned_for_copies_and_direct_io)
{
	struct dram	*d = dram_mk(32 * MIB);
	static const uint64_t	lens[] = { 100, 4000, 36864, 70000, 2359296 };
	uint32_t	 a, b, i;
	const uint8_t	*pa, *pb;
	uint64_t	 stride;

	for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		a = put(d, 2 * i, lens[i], DRAM_NONE);
		b = put(d, 2 * i + 1, lens[i], DRAM_NONE);
		pa = dram_data(d, a, NULL, NULL);
		pb = dram_data(d, b, NULL, NULL);
		stride = lens[i] >= 65536 ? (lens[i] + 4095) / 4096 * 4096 : (lens[i] + 63) / 64 * 64;
		EQ((uint64_t)(pb - pa), stride);
		EQ((uintptr_t)pa % 64, 0);
		if (lens[i] % 4096 == 0 || lens[i] >= 65536)
			EQ((uintptr_t)pa % 4096, 0);
	}
	drop_keys(d, 0, 20);
	assert_empty(d);
	dram_free(d);
}
END_TEST

START_TEST(test_every_key_field_is_part_of_identity)
{
	struct dram	*d = dram_mk(2 * MIB);
	struct obj_key	 k, o;
	uint32_t	 id, got;
	uint8_t		*buf;

	id = put(d, 1, 100, DRAM_NONE);
	key_of(&k, 1);
	EQ(dram_lookup(d, &k, &got), 0);
	EQ(got, id);
	o = k; o.fingerprint[15] ^= 1;
	EQ(dram_lookup(d, &o, &got), -ENOENT);
	o = k; o.pool = 2;
	EQ(dram_lookup(d, &o, &got), -ENOENT);
	o = k; o.shard = 4;
	EQ(dram_lookup(d, &o, &got), -ENOENT);
	o = k; o.hash[31] ^= 0x80;
	EQ(dram_lookup(d, &o, &got), -ENOENT);
	o = k; o.pad = 1;
	EQ(dram_lookup(d, &o, &got), -ENOENT);
	EQ(dram_alloc(d, &o, 100, DRAM_NONE, 1, &got, &buf), -EINVAL);
	dram_drop(d, id);
	assert_empty(d);
	dram_free(d);
}
END_TEST

/*
 * Issue 11 item 11: the arena is the configured size rounded down to
 * whole 2 MiB units, never up past the budget; under one unit is refused.
 */
START_TEST(test_arena_is_rounded_down_to_whole_units)
{
	struct dram_stats	 st;
	struct dram		*d;
	char			 err[256] = "";

	d = dram_mk(3 * MIB);
	dram_stats(d, &st);
	EQ(st.bytes_capacity, 2 * MIB);
	dram_free(d);
	d = dram_mk(4 * MIB - 1);
	dram_stats(d, &st);
	EQ(st.bytes_capacity, 2 * MIB);
	dram_free(d);
	d = dram_mk(4 * MIB);
	dram_stats(d, &st);
	EQ(st.bytes_capacity, 4 * MIB);
	dram_free(d);
	EQ(dram_new(&d, 2 * MIB - 1, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(d);
	ck_assert_str_eq(err, "dram arena: 2097151 bytes is out of range [2 MiB, 32 TiB]");
}
END_TEST

START_TEST(test_bad_arguments_are_refused)
{
	struct dram	*d;
	struct obj_key	 k;
	char		 err[256] = "";
	uint32_t	 id, w;
	uint8_t		*buf;

	EQ(dram_new(&d, 0, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(d);
	ck_assert_str_eq(err, "dram arena: 0 bytes is out of range [2 MiB, 32 TiB]");
	EQ(dram_new(&d, 64ULL << 40, err, sizeof(err)), -EINVAL);
	d = dram_mk(2 * MIB);
	key_of(&k, 1);
	EQ(dram_alloc(d, &k, 0, DRAM_NONE, 1, &id, &buf), -EINVAL);
	EQ(dram_alloc(d, &k, 3 * MIB, DRAM_NONE, 1, &id, &buf), -EFBIG);
	EQ(dram_commit(d, 12345, 0), -EINVAL);
	EQ(dram_pin(d, 12345), -EINVAL);
	EQ(dram_pin(d, DRAM_NONE), -EINVAL);
	ck_assert_ptr_null(dram_data(d, 12345, NULL, NULL));
	ck_assert_ptr_null(dram_data_mut(d, DRAM_NONE));
	EQ(dram_alloc(d, &k, 2 * MIB, 12345, 1, &w, &buf), 0);	/* a bad hint is ignored */
	EQ(dram_pin(d, w), -ENOENT);
	EQ(dram_commit(d, w, 5), 0);
	EQ(dram_commit(d, w, 5), -EINVAL);
	EQ(dram_pin(d, w), 0);
	dram_unpin(d, w);
	dram_drop(d, w);
	EQ(dram_commit(d, w, 5), -EINVAL);
	assert_empty(d);
	dram_free(d);
	dram_free(NULL);
}
END_TEST

START_TEST(test_pin_counts_are_exact)
{
	struct dram		*d = dram_mk(2 * MIB);
	struct dram_stats	 st;
	uint32_t		 a, b, lru[4];
	int			 i;

	a = put(d, 1, 1000, DRAM_NONE);
	b = put(d, 2, 1000, DRAM_NONE);
	for (i = 0; i < 3; i++)
		EQ(dram_pin(d, a), 0);
	EQ(dram_pin(d, b), 0);
	dram_stats(d, &st);
	EQ(st.pins, 4);
	EQ(st.pinned_objects, 2);
	EQ(dram_lru_order(d, 1000, lru, 4), 0);
	dram_touch(d, a);	/* pinned: nothing to move */
	for (i = 0; i < 65535 - 3; i++)
		EQ(dram_pin(d, a), 0);
	EQ(dram_pin(d, a), -EOVERFLOW);
	for (i = 0; i < 65535; i++)
		dram_unpin(d, a);
	dram_unpin(d, b);
	dram_stats(d, &st);
	EQ(st.pins, 0);
	EQ(st.pinned_objects, 0);
	EQ(dram_lru_order(d, 1000, lru, 4), 2);
	EQ(lru[0], a);
	EQ(lru[1], b);
	dram_drop(d, a);
	dram_drop(d, b);
	assert_empty(d);
	dram_free(d);
}
END_TEST

/*
 * The reference model: what each object should be, by the operations
 * alone. An unpinned visible object may vanish (eviction); nothing else
 * may, and no live object's memory may overlap another's.
 */
#define RM_KEYS		1500
#define RM_MAX		4096
#define RM_OPS		4000

enum { RM_W = 1, RM_V, RM_D };

struct rm_obj {
	int		 state;		/* 0: dead */
	uint32_t	 key;
	uint32_t	 id;
	uint32_t	 serial;
	unsigned	 pins;
	uint64_t	 len;
	uint64_t	 csum;
	const uint8_t	*buf;
};

struct rm {
	struct rm_obj	 o[RM_MAX];
	int		 bykey[RM_KEYS];	/* WRITING or visible entry, or -1 */
	uint64_t	 evictions, drops, rng;
	unsigned	 nenospc;
};

static uint64_t
rm_rand(struct rm *m)
{
	m->rng ^= m->rng << 13;
	m->rng ^= m->rng >> 7;
	m->rng ^= m->rng << 17;
	return m->rng;
}

/* A random live entry in state (0: any), or -1. */
static int
rm_pick(struct rm *m, int state, int pinned)
{
	int	i, start = (int)(rm_rand(m) % RM_MAX);

	for (i = 0; i < RM_MAX; i++) {
		struct rm_obj *o = &m->o[(start + i) % RM_MAX];

		if (o->state == 0 || (state != 0 && o->state != state) || (pinned && o->pins == 0))
			continue;
		return (start + i) % RM_MAX;
	}
	return -1;
}

static void
rm_check(struct dram *d, struct rm *m, int bytes)
{
	struct dram_stats	 st;
	struct obj_key		 k;
	uint64_t		 vis = 0, wr = 0, dr = 0, pins = 0, pinned = 0, used = 0, len, csum;
	uint32_t		 id;
	int			 i, rc;

	for (i = 0; i < RM_MAX; i++) {
		struct rm_obj *o = &m->o[i];

		if (o->state == 0)
			continue;
		key_of(&k, o->key);
		rc = dram_lookup(d, &k, &id);
		if (o->state == RM_V && o->pins == 0 && rc == -ENOENT) {
			m->evictions++;
			m->bykey[o->key] = -1;
			o->state = 0;
			continue;
		}
		if (o->state == RM_V) {
			EQ(rc, 0);
			EQ(id, o->id);
		} else
			CHECK(rc == -ENOENT || m->bykey[o->key] != i,
			    "a WRITING or dropped object is visible");
		PEQ(dram_data(d, o->id, &len, &csum), o->buf);
		EQ(len, o->len);
		if (bytes) {
			CHECK(intact(o->buf, o->len, o->serial), "object %u changed", o->serial);
			if (o->state != RM_W)
				EQ(csum, o->csum);
		}
		vis += o->state == RM_V;
		wr += o->state == RM_W;
		dr += o->state == RM_D;
		pins += o->pins;
		pinned += o->pins > 0;
		used += o->len;
	}
	dram_stats(d, &st);
	EQ(st.visible, vis);
	EQ(st.writing, wr);
	EQ(st.dropped, dr);
	EQ(st.objects, vis + wr + dr);
	EQ(st.pins, pins);
	EQ(st.pinned_objects, pinned);
	EQ(st.bytes_used, used);
	EQ(st.evictions, m->evictions);
	EQ(st.drops, m->drops);
	EQ(st.evict_failures, m->nenospc);
}

static void
rm_alloc(struct dram *d, struct rm *m, uint32_t serial)
{
	/* Six classes in four units: slabs are taken from one another. */
	static const uint64_t	 sizes[] = { 3000, 20000, 300000, 700000, 100, 90000 };
	struct rm_obj		*o;
	struct obj_key		 k;
	uint32_t		 key = (uint32_t)(rm_rand(m) % RM_KEYS), near = DRAM_NONE, id;
	uint32_t		 batch = rm_rand(m) % 2 ? 1 : 1 + (uint32_t)(rm_rand(m) % 48);
	uint64_t		 len = sizes[rm_rand(m) % 6], ev;
	uint8_t			*buf;
	int			 i, slot, held = 0, rc;

	if (rm_rand(m) % 2 && (i = rm_pick(m, 0, 0)) >= 0)
		near = m->o[i].id;
	for (slot = 0; slot < RM_MAX && m->o[slot].state != 0; slot++)
		;
	ck_assert_int_lt(slot, RM_MAX);
	key_of(&k, key);
	ev = m->evictions;
	rc = dram_alloc(d, &k, len, near, batch, &id, &buf);
	if (m->bykey[key] >= 0) {
		EQ(rc, -EEXIST);
		return;
	}
	if (rc == -ENOSPC) {
		m->nenospc++;
		rm_check(d, m, 0);
		EQ(m->evictions, ev);	/* a refusal evicts nothing */
		for (i = 0; i < RM_MAX; i++) {
			held += m->o[i].state == RM_W || m->o[i].pins > 0;
			/* An evictable object of the same size always makes room. */
			CHECK(!(m->o[i].state == RM_V && m->o[i].pins == 0 && m->o[i].len == len),
			    "-ENOSPC with object %u of the same size evictable", m->o[i].serial);
		}
		CHECK(held > 0, "-ENOSPC with nothing held");
		return;
	}
	EQ(rc, 0);
	fill(buf, len, serial);
	o = &m->o[slot];
	memset(o, 0, sizeof(*o));
	o->state = RM_W;
	o->key = key;
	o->id = id;
	o->serial = serial;
	o->len = len;
	o->buf = buf;
	m->bykey[key] = slot;
	rm_check(d, m, 0);	/* takes out what was evicted */
	for (i = 0; i < RM_MAX; i++) {
		struct rm_obj *p = &m->o[i];

		if (p->state == 0 || i == slot)
			continue;
		CHECK(p->buf + p->len <= buf || buf + len <= p->buf,
		    "object %u overlaps live object %u", serial, p->serial);
	}
}

START_TEST(test_random_operations_match_a_reference_model)
{
	struct dram	*d = dram_mk(8 * MIB);
	struct rm	*m = calloc(1, sizeof(*m));
	struct rm_obj	*o;
	const int	*mix;
	int		 i, op, n, rc;
	/*
	 * Cumulative percentages for alloc, commit/abort, pin, unpin, touch,
	 * drop (the rest looks up). Phases alternate: one commits quickly
	 * and churns through eviction, one holds objects until space runs out.
	 */
	static const int mixes[2][6] = {
		{ 30, 62, 70, 84, 90, 95 },
		{ 35, 50, 65, 80, 87, 94 },
	};

	ck_assert_ptr_nonnull(m);
	m->rng = 0x2545f4914f6cdd1dULL;
	memset(m->bykey, 0xff, sizeof(m->bykey));
	for (n = 0; n < RM_OPS; n++) {
		mix = mixes[(n / 500) % 2];
		op = (int)(rm_rand(m) % 100);
		if (op < mix[0]) {
			rm_alloc(d, m, (uint32_t)n);
		} else if (op < mix[1]) {
			if ((i = rm_pick(m, RM_W, 0)) < 0)
				continue;
			o = &m->o[i];
			if (rm_rand(m) % 4) {
				o->csum = checksum_obj(o->buf, o->len);
				EQ(dram_commit(d, o->id, o->csum), 0);
				o->state = RM_V;
			} else {
				dram_abort(d, o->id);
				m->bykey[o->key] = -1;
				o->state = 0;
			}
		} else if (op < mix[2]) {
			if ((i = rm_pick(m, 0, 0)) < 0)
				continue;
			o = &m->o[i];
			rc = dram_pin(d, o->id);
			if (o->state == RM_V) {
				EQ(rc, 0);
				o->pins++;
			} else
				EQ(rc, -ENOENT);
		} else if (op < mix[3]) {
			if ((i = rm_pick(m, 0, 1)) < 0)
				continue;
			o = &m->o[i];
			dram_unpin(d, o->id);
			if (--o->pins == 0 && o->state == RM_D)
				o->state = 0;
		} else if (op < mix[4]) {
			if ((i = rm_pick(m, 0, 0)) >= 0)
				dram_touch(d, m->o[i].id);
		} else if (op < mix[5]) {
			if ((i = rm_pick(m, (rm_rand(m) % 4) ? RM_V : RM_D, 0)) < 0)
				continue;
			o = &m->o[i];
			dram_drop(d, o->id);
			if (o->state == RM_V) {
				m->drops++;
				m->bykey[o->key] = -1;
				o->state = o->pins > 0 ? RM_D : 0;
			}
		}
		rm_check(d, m, n % 200 == 0);
	}
	rm_check(d, m, 1);
	ck_assert_uint_gt(m->evictions, 0);
	ck_assert_uint_gt(m->nenospc, 0);
	printf("dram model: %d ops, %llu evictions, %u refused for space, %llu drops\n",
	    RM_OPS, (unsigned long long)m->evictions, m->nenospc, (unsigned long long)m->drops);
	for (i = 0; i < RM_MAX; i++) {
		o = &m->o[i];
		if (o->state == 0)
			continue;
		while (o->pins > 0) {
			dram_unpin(d, o->id);
			o->pins--;
		}
		if (o->state == RM_W)
			dram_abort(d, o->id);
		else if (o->state == RM_V)
			dram_drop(d, o->id);
		o->state = 0;
	}
	assert_empty(d);
	free(m);
	dram_free(d);
}
END_TEST

/* index.c on its own, with a record of its minimal shape. */

struct test_rec {
	struct index_rec rec;
	uint8_t		state;		/* 0 free, TR_WRITING, TR_VISIBLE */
#define TR_WRITING	1
#define TR_VISIBLE	2
	uint8_t		tier[15];	/* the tier's own bytes */
};
_Static_assert(sizeof(struct test_rec) == INDEX_REC_SIZE, "a record as index.c sees it");

static void
index_mk(struct index *ix)
{
	EQ(index_init(ix, TR_VISIBLE), 0);
}

static struct test_rec *
test_rec(const struct index *ix, uint32_t id)
{
	return (struct test_rec *)index_rec(ix, id);
}

/* A new record under key n in state; returns its id. */
static uint32_t
index_put(struct index *ix, uint32_t n, uint8_t state)
{
	struct obj_key	 k;
	uint64_t	 h;
	uint32_t	 id;

	key_of(&k, n);
	EQ(index_find(ix, &k, &h), INDEX_NONE);
	EQ(index_rec_new(ix, &id), 0);
	test_rec(ix, id)->rec.key = k;
	test_rec(ix, id)->state = state;
	index_insert(ix, id, h);
	return id;
}

static uint32_t
index_lookup_n(const struct index *ix, uint32_t n)
{
	struct obj_key	k;

	key_of(&k, n);
	return index_lookup(ix, &k);
}

static uint32_t
index_find_n(const struct index *ix, uint32_t n)
{
	struct obj_key	k;

	key_of(&k, n);
	return index_find(ix, &k, NULL);
}

START_TEST(test_index_lookup_sees_only_the_visible_state)
{
	struct index	ix;
	struct obj_key	keys[3];
	uint32_t	w, v, ids[3];

	index_mk(&ix);
	w = index_put(&ix, 1, TR_WRITING);
	v = index_put(&ix, 2, TR_VISIBLE);
	/* index_find sees every indexed state: a second writer is refused. */
	EQ(index_find_n(&ix, 1), w);
	EQ(index_find_n(&ix, 2), v);
	EQ(index_lookup_n(&ix, 1), INDEX_NONE);
	EQ(index_lookup_n(&ix, 2), v);
	EQ(index_lookup_n(&ix, 3), INDEX_NONE);
	key_of(&keys[0], 1);
	key_of(&keys[1], 2);
	key_of(&keys[2], 3);
	EQ(index_lookup_many(&ix, keys, 3, ids), 1);
	EQ(ids[0], INDEX_NONE);
	EQ(ids[1], v);
	EQ(ids[2], INDEX_NONE);
	/* The tier's state decides, at once: no call to the index. */
	test_rec(&ix, w)->state = TR_VISIBLE;
	EQ(index_lookup_n(&ix, 1), w);
	EQ(index_lookup_many(&ix, keys, 3, ids), 2);
	EQ(ids[0], w);
	EQ(ix.nindexed, 2);
	index_fini(&ix);
}
END_TEST

START_TEST(test_index_records_come_back_zeroed_from_the_free_list)
{
	struct index		 ix;
	struct test_rec		*r;
	uint32_t		 a, b, c, id;

	index_mk(&ix);
	PEQ(index_rec_live(&ix, 0), NULL);
	a = index_put(&ix, 1, TR_VISIBLE);
	b = index_put(&ix, 2, TR_VISIBLE);
	c = index_put(&ix, 3, TR_WRITING);
	ck_assert(a != b && b != c && a != c);
	memset(test_rec(&ix, c)->tier, 0x77, sizeof(test_rec(&ix, c)->tier));
	PEQ(index_rec_live(&ix, c), index_rec(&ix, c));
	PEQ(index_rec_live(&ix, 3), NULL);
	PEQ(index_rec_live(&ix, INDEX_NONE), NULL);
	index_remove(&ix, a);
	index_rec_free(&ix, a);
	index_remove(&ix, c);
	index_rec_free(&ix, c);
	PEQ(index_rec_live(&ix, a), NULL);
	PEQ(index_rec_live(&ix, c), NULL);
	EQ(index_find_n(&ix, 1), INDEX_NONE);
	EQ(index_find_n(&ix, 2), b);
	EQ(index_find_n(&ix, 3), INDEX_NONE);
	/* The last freed id is the next one handed out, all zeros but its links. */
	EQ(index_rec_new(&ix, &id), 0);
	EQ(id, c);
	r = test_rec(&ix, id);
	EQ(r->state, 0);
	EQ(r->tier[0], 0);
	EQ(r->tier[14], 0);
	EQ(r->rec.key.hash[31], 0);
	EQ(r->rec.chain, INDEX_NONE);
	EQ(r->rec.lru_prev, INDEX_NONE);
	EQ(r->rec.lru_next, INDEX_NONE);
	EQ(index_rec_new(&ix, &id), 0);
	EQ(id, a);
	EQ(index_rec_new(&ix, &id), 0);
	EQ(id, 3);
	EQ(ix.nrecords, 4);
	index_fini(&ix);
	index_fini(&ix);	/* idempotent */
	EQ(ix.nrecords, 0);
	EQ(ix.nblocks, 0);
}
END_TEST

START_TEST(test_index_removal_keeps_chains_whole_across_growth)
{
	struct index	 ix;
	struct obj_key	*keys;
	uint32_t	*ids, *got, n, count = 5000;

	index_mk(&ix);
	ids = malloc(count * sizeof(*ids));
	got = malloc(count * sizeof(*got));
	keys = malloc(count * sizeof(*keys));
	ck_assert(ids != NULL && got != NULL && keys != NULL);
	/* More keys than the first 1024 buckets: chains, then growth. */
	for (n = 0; n < count; n++) {
		ids[n] = index_put(&ix, n, TR_VISIBLE);
		key_of(&keys[n], n);
	}
	ck_assert_uint_ge(ix.nbuckets, count);
	EQ(ix.nindexed, count);
	EQ(ix.nblocks, (count + INDEX_BLOCK - 1) / INDEX_BLOCK);
	/* Every third key out, from the middle and the ends of chains alike. */
	for (n = 0; n < count; n += 3) {
		index_remove(&ix, ids[n]);
		EQ(test_rec(&ix, ids[n])->rec.chain, INDEX_NONE);
		index_rec_free(&ix, ids[n]);
	}
	EQ(ix.nindexed, count - (count + 2) / 3);
	for (n = 0; n < count; n++)
		EQ(index_lookup_n(&ix, n), n % 3 ? ids[n] : INDEX_NONE);
	/* The batched lookup, over a count that is no multiple of its batch. */
	EQ(index_lookup_many(&ix, keys, count, got), count - (count + 2) / 3);
	for (n = 0; n < count; n++)
		EQ(got[n], n % 3 ? ids[n] : INDEX_NONE);
	/* Put back: the freed records are reused before any new block. */
	for (n = 0; n < count; n += 3)
		ids[n] = index_put(&ix, n, TR_VISIBLE);
	EQ(ix.nrecords, count);
	for (n = 0; n < count; n++)
		EQ(index_lookup_n(&ix, n), ids[n]);
	free(keys);
	free(got);
	free(ids);
	index_fini(&ix);
}
END_TEST

START_TEST(test_index_lru_lists_link_in_their_order)
{
	struct index		ix;
	struct index_lru	a, b;
	uint32_t		id[5], got[8], n;

	index_mk(&ix);
	index_lru_init(&a);
	index_lru_init(&b);
	EQ(index_lru_order(&ix, &a, got, 8), 0);
	for (n = 0; n < 5; n++)
		id[n] = index_put(&ix, n, TR_VISIBLE);
	index_lru_push(&ix, &a, id[0]);
	index_lru_push(&ix, &a, id[1]);
	index_lru_push_tail(&ix, &a, id[2]);	/* older than everything */
	index_lru_push(&ix, &b, id[3]);		/* lists are independent */
	/* Next victim first: 2, 0, 1. */
	EQ(index_lru_order(&ix, &a, got, 8), 3);
	EQ(got[0], id[2]);
	EQ(got[1], id[0]);
	EQ(got[2], id[1]);
	EQ(a.head, id[1]);
	EQ(a.tail, id[2]);
	EQ(index_lru_order(&ix, &a, got, 2), 2);
	EQ(index_lru_order(&ix, &b, got, 8), 1);
	EQ(got[0], id[3]);
	/* Out of the middle, then the tail, then the head. */
	index_lru_unlink(&ix, &a, id[0]);
	EQ(index_rec(&ix, id[0])->lru_prev, INDEX_NONE);
	EQ(index_rec(&ix, id[0])->lru_next, INDEX_NONE);
	EQ(index_lru_order(&ix, &a, got, 8), 2);
	EQ(got[0], id[2]);
	EQ(got[1], id[1]);
	index_lru_unlink(&ix, &a, id[2]);
	EQ(a.tail, id[1]);
	EQ(a.head, id[1]);
	index_lru_unlink(&ix, &a, id[1]);
	EQ(a.head, INDEX_NONE);
	EQ(a.tail, INDEX_NONE);
	EQ(index_lru_order(&ix, &a, got, 8), 0);
	/* push_tail on an empty list makes it head and tail. */
	index_lru_push_tail(&ix, &a, id[4]);
	EQ(a.head, id[4]);
	EQ(a.tail, id[4]);
	index_fini(&ix);
}
END_TEST

START_TEST(test_index_meta_bytes_count_blocks_and_buckets)
{
	struct index	ix;
	uint32_t	n;

	index_mk(&ix);
	/* 1024 buckets of 4 bytes, no record yet. */
	EQ(index_meta_bytes(&ix), 1024 * 4);
	index_put(&ix, 0, TR_VISIBLE);
	/* One block of 1024 records of 80 bytes, an array of 16 block pointers. */
	EQ(index_meta_bytes(&ix), 1024 * 4 + INDEX_BLOCK * INDEX_REC_SIZE + 16 * sizeof(void *));
	for (n = 1; n <= 1024; n++)
		index_put(&ix, n, TR_VISIBLE);
	/* 1025 keys: the buckets doubled, a second block. */
	EQ(ix.nbuckets, 2048);
	EQ(index_meta_bytes(&ix), 2048 * 4 + 2 * INDEX_BLOCK * INDEX_REC_SIZE + 16 * sizeof(void *));
	index_fini(&ix);
}
END_TEST

Suite *
suite_dram(void)
{
	Suite	*s = suite_create("dram");
	TCase	*tc = tcase_create("unit");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_writing_object_is_invisible_until_commit);
	tcase_add_test(tc, test_duplicate_key_is_refused_while_writing_and_after_commit);
	tcase_add_test(tc, test_lookup_has_no_side_effects);
	tcase_add_test(tc, test_lookup_many_answers_as_lookup_does);
	tcase_add_test(tc, test_abort_frees_everything);
	tcase_add_test(tc, test_drop_of_pinned_object_frees_at_last_unpin);
	tcase_add_test(tc, test_unverified_mark_follows_its_object);
	tcase_add_test(tc, test_publish_continues_a_present_prefix);
	tcase_add_test(tc, test_eviction_never_takes_a_pinned_object);
	tcase_add_test(tc, test_eviction_follows_lru_order);
	tcase_add_test(tc, test_no_space_when_everything_is_pinned);
	tcase_add_test(tc, test_writing_objects_are_never_evicted);
	tcase_add_test(tc, test_slab_returns_to_arena_and_serves_another_size);
	tcase_add_test(tc, test_other_size_evicts_the_least_recently_used_whole_slab);
	tcase_add_test(tc, test_near_hint_places_pages_contiguously);
	tcase_add_test(tc, test_batch_lands_in_one_run_in_a_churned_arena);
	tcase_add_test(tc, test_opening_a_run_never_evicts_pinned_or_writing_objects);
	tcase_add_test(tc, test_index_grows_past_initial_capacity);
	tcase_add_test(tc, test_metadata_is_at_most_96_bytes_per_object);
	tcase_add_test(tc, test_checksum_chunked_matches_reference);
	tcase_add_test(tc, test_checksum_detects_a_flipped_byte);
	tcase_add_test(tc, test_objects_of_16_mib_and_more_fit_an_arena_that_holds_them);
	tcase_add_test(tc, test_objects_are_aligned_for_copies_and_direct_io);
	tcase_add_test(tc, test_every_key_field_is_part_of_identity);
	tcase_add_test(tc, test_arena_is_rounded_down_to_whole_units);
	tcase_add_test(tc, test_bad_arguments_are_refused);
	tcase_add_test(tc, test_pin_counts_are_exact);
	tcase_add_test(tc, test_random_operations_match_a_reference_model);
	suite_add_tcase(s, tc);

	tc = tcase_create("index");
	tcase_add_test(tc, test_index_lookup_sees_only_the_visible_state);
	tcase_add_test(tc, test_index_records_come_back_zeroed_from_the_free_list);
	tcase_add_test(tc, test_index_removal_keeps_chains_whole_across_growth);
	tcase_add_test(tc, test_index_lru_lists_link_in_their_order);
	tcase_add_test(tc, test_index_meta_bytes_count_blocks_and_buckets);
	suite_add_tcase(s, tc);
	return s;
}
