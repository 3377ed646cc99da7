/*
 * Micro-benchmark of the DRAM tier's metadata paths: alloc+commit into
 * an empty arena, lookups (hits in publish order as PROBE walks a prefix,
 * hits in random order, misses), alloc+commit with one eviction each once
 * the arena is full, and the chunked checksum. Object bytes are never
 * written, so the arena stays unfaulted and only metadata is measured.
 *
 *   bench_dram [objects [object_bytes]]	(default 1000000 x 4096)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"

static double
bench_now(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A page hash from a counter, spread like sha256 output. */
static void
bench_key(struct obj_key *k, uint64_t n)
{
	uint64_t	x = n * 0x9e3779b97f4a7c15ULL + 1;
	int		i;

	memset(k, 0, sizeof(*k));
	memset(k->fingerprint, 0x42, sizeof(k->fingerprint));
	for (i = 0; i < 4; i++) {
		x ^= x >> 31;
		x *= 0xbf58476d1ce4e5b9ULL;
		x ^= x >> 29;
		memcpy(k->hash + 8 * i, &x, 8);
	}
}

static void
bench_report(const char *what, uint64_t n, double secs)
{
	printf("%-40s %10.2f M/s  %7.1f ns/op\n", what, (double)n / secs / 1e6, secs * 1e9 / (double)n);
}

int
main(int argc, char **argv)
{
	uint64_t		 n = argc > 1 ? strtoull(argv[1], NULL, 0) : 1000000;
	uint64_t		 len = argc > 2 ? strtoull(argv[2], NULL, 0) : 4096, i, hits = 0;
	uint64_t		*order, stride, csum = 0, rounds, r;
	struct dram		*d;
	struct dram_stats	 st;
	struct obj_key		 k;
	uint32_t		*ids, id, many[64];
	struct obj_key		*keys;
	uint8_t			*buf, *big;
	char			 err[256];
	double			 t;
	size_t			 sizes[] = { 36864, 2359296 }, s, reps;

	stride = len >= 65536 ? (len + 4095) / 4096 * 4096 : (len + 63) / 64 * 64;
	/* Room for every object: slabs waste up to 1/8 at their tails. */
	if (dram_new(&d, n * stride + n * stride / 8 + (4 << 20), err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_dram: %s\n", err);
		return 1;
	}
	ids = malloc(n * sizeof(*ids));
	order = malloc(n * sizeof(*order));
	keys = malloc(n * sizeof(*keys));
	if (ids == NULL || order == NULL || keys == NULL)
		return 1;
	dram_stats(d, &st);
	printf("dram: %llu objects of %llu bytes, arena %llu MiB (%s)\n", (unsigned long long)n,
	    (unsigned long long)len, (unsigned long long)(st.bytes_capacity >> 20),
	    st.hugetlb ? "hugetlb" : "THP advice");

	t = bench_now();
	for (i = 0; i < n; i++) {
		bench_key(&k, i);
		if (dram_alloc(d, &k, len, i ? ids[i - 1] : DRAM_NONE, &ids[i], &buf) != 0 ||
		    dram_commit(d, ids[i], i) != 0) {
			fprintf(stderr, "bench_dram: alloc %llu failed\n", (unsigned long long)i);
			return 1;
		}
	}
	bench_report("alloc+commit, empty arena", n, bench_now() - t);

	/* A PROBE's walk: the keys in publish order, over and over for small n. */
	rounds = n >= 4000000 ? 1 : 4000000 / n;
	t = bench_now();
	for (r = 0; r < rounds; r++) {
		for (i = 0; i < n; i++) {
			bench_key(&k, i);
			hits += dram_lookup(d, &k, &id) == 0;
		}
	}
	bench_report("lookup hit, publish order", n * rounds, bench_now() - t);
	hits -= n * (rounds - 1);

	/* A random permutation: every lookup misses the CPU caches. */
	for (i = 0; i < n; i++)
		order[i] = i;
	srand(1);
	for (i = n - 1; i > 0; i--) {
		uint64_t j = ((uint64_t)rand() << 31 ^ (uint64_t)rand()) % (i + 1), x = order[i];

		order[i] = order[j];
		order[j] = x;
	}
	t = bench_now();
	for (i = 0; i < n; i++) {
		bench_key(&k, order[i]);
		hits += dram_lookup(d, &k, &id) == 0;
	}
	bench_report("lookup hit, random order", n, bench_now() - t);

	t = bench_now();
	for (i = 0; i < n; i++) {
		bench_key(&k, n + order[i]);
		hits += dram_lookup(d, &k, &id) == 0;
	}
	bench_report("lookup miss", n, bench_now() - t);
	if (hits != 2 * n) {
		fprintf(stderr, "bench_dram: %llu hits, expected %llu\n", (unsigned long long)hits,
		    (unsigned long long)(2 * n));
		return 1;
	}

	t = bench_now();
	for (i = 0; i < n; i++)
		bench_key(&k, i);
	bench_report("(key generation alone)", n, bench_now() - t);

	/* PROBE's batches: keys built first, then looked up 64 at a time. */
	for (i = 0; i < n; i++)
		bench_key(&keys[i], order[i]);
	t = bench_now();
	for (r = 0; r < rounds; r++)
		for (i = 0; i < n; i += 64)
			hits += dram_lookup_many(d, keys + i, n - i < 64 ? n - i : 64, many);
	bench_report("lookup_many hit, random order", n * rounds, bench_now() - t);
	for (i = 0; i < n; i++)
		bench_key(&keys[i], i);
	t = bench_now();
	for (r = 0; r < rounds; r++)
		for (i = 0; i < n; i += 64)
			hits += dram_lookup_many(d, keys + i, n - i < 64 ? n - i : 64, many);
	bench_report("lookup_many hit, publish order", n * rounds, bench_now() - t);
	t = bench_now();
	for (r = 0; r < rounds; r++)
		for (i = 0; i < n; i++)
			hits += dram_lookup(d, &keys[i], &id) == 0;
	bench_report("lookup hit, publish order, keys built", n * rounds, bench_now() - t);
	if (hits != 2 * n + 3 * n * rounds) {
		fprintf(stderr, "bench_dram: lookup_many: wrong hits\n");
		return 1;
	}

	dram_stats(d, &st);
	printf("%-40s %10.2f bytes/object (%llu buckets, %.1f MiB in all)\n", "metadata",
	    st.meta_bytes_per_object, (unsigned long long)st.index_buckets,
	    (double)st.meta_bytes / (1 << 20));

	t = bench_now();
	for (i = 0; i < n; i++) {
		bench_key(&k, 2 * n + i);
		if (dram_alloc(d, &k, len, DRAM_NONE, &id, &buf) != 0 || dram_commit(d, id, i) != 0) {
			fprintf(stderr, "bench_dram: alloc with eviction failed\n");
			return 1;
		}
	}
	bench_report("alloc+commit, evicting (full arena)", n, bench_now() - t);
	dram_stats(d, &st);
	/* The arena is rounded up to whole units: a few more objects fit. */
	if (st.evictions == 0 || st.evictions > n) {
		fprintf(stderr, "bench_dram: %llu evictions\n", (unsigned long long)st.evictions);
		return 1;
	}

	t = bench_now();
	for (i = 0; i < n; i++) {
		bench_key(&k, 2 * n + i);
		if (dram_lookup(d, &k, &id) == 0 && dram_pin(d, id) == 0)
			dram_unpin(d, id);
	}
	bench_report("lookup+pin+unpin", n, bench_now() - t);
	dram_free(d);

	for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		if ((big = malloc(sizes[s])) == NULL)
			return 1;
		memset(big, 0x5a, sizes[s]);
		reps = (size_t)(4ULL << 30) / sizes[s];
		t = bench_now();
		for (i = 0; i < reps; i++)
			csum += checksum_obj(big, sizes[s]);
		t = bench_now() - t;
		printf("checksum of %7zu bytes %27.2f GB/s\n", sizes[s],
		    (double)reps * (double)sizes[s] / t / 1e9);
		free(big);
	}
	free(ids);
	free(order);
	free(keys);
	return csum == 0;
}
