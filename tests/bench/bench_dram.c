/*
 * Micro-benchmark of the DRAM tier's metadata paths: alloc+commit into
 * an empty arena, lookups (hits in publish order as PROBE walks a prefix,
 * hits in random order, misses), alloc+commit with one eviction each once
 * the arena is full (objects alone, then in batches of 128 as publish.c
 * allocates them), and the chunked checksum. Object bytes are never
 * written, so the arena stays unfaulted and only metadata is measured.
 *
 *   bench_dram [objects [object_bytes]]	(default 1000000 x 4096)
 *   bench_dram -c [-n] [-s seed] [-L file] [-B file] [objects [object_bytes]]	(default 4096 x 36864)
 *
 * -c: the arena's layout under churn (issue 16): an arena of exactly
 * `objects` objects, requests that publish batches of 16..256 pages (near
 * chained and their length given, as publish.c does) and reuse a prefix
 * of an earlier batch (lookup and pin as an ADMIT does, unpinned in order
 * at the lease's release, a few leases and publishes in flight), with a
 * skewed popularity; a reused prefix that misses is published again, as an
 * engine that recomputed it does. After a warm-up of 8 arenas' worth of
 * evictions it reports how many runs of consecutive host addresses each
 * new batch and each restored prefix occupy: what the GPU copy engine
 * sees (runs of >= 128 KiB go by batched DMA, shorter ones by a gather).
 * The request stream depends on the seed alone, never on what hit. -n
 * gives dram_alloc no batch length (each page alone): the placement of
 * before issue 16's runs, for comparison in one binary. -L writes each
 * measured restore's layout to file, for bench_gpu -L to replay on a GPU:
 * a line "l3kv-layout 1 ARENA_BYTES OBJECT_BYTES", then per restore its
 * object count and each object's offset in the arena, in page order.
 * -B writes each measured new batch's (what its PUBLISH wrote) the same way.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "bench.h"

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


/* The churn workload's shape. */
#define CHURN_RING		2048	/* batches a reuse may name */
#define CHURN_HOT		8	/* the first batches: system prompts */
#define CHURN_LEASES		4	/* restores holding pins at once */
#define CHURN_PUBLISHES		2	/* publishes WRITING at once */
#define CHURN_PAGES_MIN		16
#define CHURN_PAGES_MAX		256
#define CHURN_MEASURED		20000	/* steps after the warm-up */
#define CHURN_DMA_MIN		(128U << 10)	/* the copy engine's batched-DMA run */

struct churn_batch {
	uint64_t	base;		/* key of page 0 */
	uint32_t	npages;
};

struct churn_ids {
	uint32_t	n;
	uint32_t	ids[CHURN_PAGES_MAX];
};

struct churn_runs {
	uint64_t	 sets;		/* batches or restores */
	uint64_t	 single;	/* of them in one run */
	uint64_t	 pages, bytes, bytes_dma;
	uint32_t	*len;		/* pages per run */
	uint64_t	 nlen, caplen;
	uint32_t	*per;		/* runs per set */
	uint64_t	 nper, capper;
};

static uint64_t churn_rng;
static FILE	*churn_layout;		/* -L */
static FILE	*churn_blayout;		/* -B */

/* -L, -B: one restore's (or new batch's) objects, as offsets into the arena. */
static void
churn_layout_write(FILE *f, const struct dram *d, const uint32_t *ids, uint32_t n)
{
	const uint8_t	*base = dram_arena(d, NULL);
	uint32_t	 i;

	if (f == NULL || n == 0)
		return;
	fprintf(f, "%u", n);
	for (i = 0; i < n; i++)
		fprintf(f, " %llu", (unsigned long long)(dram_data(d, ids[i], NULL, NULL) - base));
	fputc('\n', f);
}

static uint64_t
churn_rand(void)
{
	return bench_xorshift(&churn_rng);
}

static double
churn_unif(void)
{
	return (double)(churn_rand() >> 11) / 9007199254740992.0;
}

static int
churn_push(uint32_t **v, uint64_t *n, uint64_t *cap, uint32_t x)
{
	uint32_t	*nv;

	if (*n == *cap) {
		*cap = *cap ? *cap * 2 : 4096;
		if ((nv = realloc(*v, *cap * sizeof(*nv))) == NULL)
			return -1;
		*v = nv;
	}
	(*v)[(*n)++] = x;
	return 0;
}

/* The runs of consecutive host addresses that objects ids[0..n) make, in order. */
static int
churn_count(const struct dram *d, struct churn_runs *r, const uint32_t *ids, uint32_t n,
    uint64_t len)
{
	const uint8_t	*p, *prev = NULL;
	uint32_t	 i, run = 0, nruns = 0;

	if (n == 0)
		return 0;
	for (i = 0; i <= n; i++) {
		p = i < n ? dram_data(d, ids[i], NULL, NULL) : NULL;
		if (i > 0 && (p == NULL || p != prev + len)) {
			if (churn_push(&r->len, &r->nlen, &r->caplen, run) != 0)
				return -1;
			if ((uint64_t)run * len >= CHURN_DMA_MIN)
				r->bytes_dma += (uint64_t)run * len;
			nruns++;
			run = 0;
		}
		prev = p;
		run++;
	}
	r->sets++;
	r->single += nruns == 1;

	r->pages += n;
	r->bytes += (uint64_t)n * len;
	return churn_push(&r->per, &r->nper, &r->capper, nruns);
}

static int
churn_cmp(const void *a, const void *b)
{
	uint32_t	x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static void
churn_print(const char *what, struct churn_runs *r, uint64_t len)
{
	uint64_t	i, acc = 0, wmed = 0, nruns = r->nlen;

	if (r->sets == 0) {
		printf("%-10s none\n", what);
		return;
	}
	qsort(r->len, r->nlen, sizeof(*r->len), churn_cmp);
	qsort(r->per, r->nper, sizeof(*r->per), churn_cmp);
	/* The run that the median byte lies in. */
	for (i = 0; i < r->nlen; i++) {
		acc += r->len[i];
		if (acc * 2 >= r->pages) {
			wmed = r->len[i];
			break;
		}
	}
	printf("%-10s %7llu sets %8.1f pages/set | runs/set mean %6.2f median %3u p90 %3u | "
	    "one run %5.1f%% | KiB/run p10 %6llu median %6llu byte-weighted median %6llu | "
	    "bytes in runs >= 128 KiB %5.1f%%\n", what, (unsigned long long)r->sets,
	    (double)r->pages / (double)r->sets, (double)nruns / (double)r->sets,
	    r->per[r->nper / 2], r->per[r->nper * 9 / 10], 100.0 * (double)r->single / (double)r->sets,
	    (unsigned long long)(r->len[r->nlen / 10] * len >> 10),
	    (unsigned long long)(r->len[r->nlen / 2] * len >> 10),
	    (unsigned long long)(wmed * len >> 10),
	    100.0 * (double)r->bytes_dma / (double)r->bytes);
}

/* Commits the oldest publish in flight, in page order as publish_job_done does. */
static void
churn_commit(struct dram *d, struct churn_ids *q, uint32_t *nq)
{
	uint32_t	i;

	for (i = 0; i < q[0].n; i++)
		if (dram_commit(d, q[0].ids[i], i) != 0)
			abort();
	memmove(q, q + 1, (*nq - 1) * sizeof(*q));
	(*nq)--;
}

/* Lets the oldest lease go: its pins, in page order as lease_unpin does. */
static void
churn_release(struct dram *d, struct churn_ids *q, uint32_t *nq)
{
	uint32_t	i;

	for (i = 0; i < q[0].n; i++)
		dram_unpin(d, q[0].ids[i]);
	memmove(q, q + 1, (*nq - 1) * sizeof(*q));
	(*nq)--;
}

/*
 * Publishes pages [from, to) of batch b as publish_request does: each
 * page after the previous one allocated, the pages left given (unless
 * batch is 0: -n, each page alone, as before issue 16); pages present
 * are skipped. -1 when the arena refused (everything held).
 */
static int
churn_publish(struct dram *d, const struct churn_batch *b, uint32_t from, uint32_t to,
    uint64_t len, int batch, struct churn_ids *out, uint64_t *ns)
{
	struct obj_key	 k;
	uint32_t	 p, near = DRAM_NONE, id;
	uint8_t		*buf;
	double		 t = bench_now();
	int		 rc;

	out->n = 0;
	for (p = from; p < to; p++) {
		bench_key(&k, b->base + p);
		rc = dram_alloc(d, &k, len, near, batch ? to - p : 1, &id, &buf);
		if (rc == -EEXIST)
			continue;
		if (rc != 0) {
			fprintf(stderr, "bench_dram: churn alloc: %s\n", strerror(-rc));
			return -1;
		}
		out->ids[out->n++] = id;
		near = id;
	}
	*ns += (uint64_t)((bench_now() - t) * 1e9);
	return 0;
}

static int
bench_churn(uint64_t n, uint64_t len, uint64_t seed, int batch)
{
	struct churn_batch	*ring;
	struct churn_ids	 pubs[CHURN_PUBLISHES + 1], leases[CHURN_LEASES + 1];
	struct churn_runs	 rn = { 0 }, rr = { 0 }, rp = { 0 };
	struct dram		*d;
	struct dram_stats	 st;
	struct obj_key		 k;
	struct churn_ids	*l;
	double			*cdf, h = 0, u_kind, u_age, u_hot, u_whole, u_pre, u_len, u_ext;
	uint64_t		 stride, per, units, next_key = 0, nb = 0, step, warm = 0;
	uint64_t		 ev0 = 0, alloc_ns = 0, allocs = 0, want_pages = 0, hit_pages = 0;
	uint64_t		 evictions;
	uint32_t		 npubs = 0, nleases = 0, i, lo, hi, mid, age, want, hits, id;
	struct churn_batch	*b, fresh;
	char			 err[256];
	int			 measuring = 0;

	stride = len >= 65536 ? (len + 4095) / 4096 * 4096 : (len + 63) / 64 * 64;
	if (stride > (256U << 10) || n < 2 * CHURN_PAGES_MAX) {
		fprintf(stderr, "bench_dram: -c wants objects of at most 256 KiB and at least %u "
		    "of them\n", 2 * CHURN_PAGES_MAX);
		return 1;
	}
	/* One unit per slab up to 256 KiB: exactly n objects' worth of slabs. */
	per = (2ULL << 20) / stride;
	units = (n + per - 1) / per;
	if (dram_new(&d, units << 21, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_dram: %s\n", err);
		return 1;
	}
	ring = calloc(CHURN_RING, sizeof(*ring));
	cdf = malloc((CHURN_RING - CHURN_HOT) * sizeof(*cdf));
	if (ring == NULL || cdf == NULL)
		return 1;
	/* A batch's popularity falls with its age as 1/age (Zipf, s = 1). */
	for (i = 0; i < CHURN_RING - CHURN_HOT; i++)
		cdf[i] = h += 1.0 / (i + 1);
	for (i = 0; i < CHURN_RING - CHURN_HOT; i++)
		cdf[i] /= h;
	churn_rng = seed * 0x9e3779b97f4a7c15ULL + 0x1234567;
	if (churn_layout != NULL)
		fprintf(churn_layout, "l3kv-layout 1 %llu %llu\n", (unsigned long long)(units << 21),
		    (unsigned long long)len);
	if (churn_blayout != NULL)
		fprintf(churn_blayout, "l3kv-layout 1 %llu %llu\n", (unsigned long long)(units << 21),
		    (unsigned long long)len);
	printf("dram churn: %llu objects of %llu bytes (%llu per slab, %llu slabs), seed %llu, %s\n",
	    (unsigned long long)(units * per), (unsigned long long)len, (unsigned long long)per,
	    (unsigned long long)units, (unsigned long long)seed,
	    batch ? "batch lengths given" : "no batch lengths (-n)");

	for (step = 0; !measuring || step < warm + CHURN_MEASURED; step++) {
		dram_stats(d, &st);
		if (!measuring && st.evictions >= 8 * n) {
			measuring = 1;
			warm = step;
			ev0 = st.evictions;
			allocs = alloc_ns = 0;
		}
		/* Every step draws the same numbers, whatever hit: one request stream per seed. */
		u_kind = churn_unif();
		u_age = churn_unif();
		u_hot = churn_unif();
		u_whole = churn_unif();
		u_pre = churn_unif();
		u_len = churn_unif();
		u_ext = churn_unif();
		if (npubs == CHURN_PUBLISHES)
			churn_commit(d, pubs, &npubs);
		fresh.base = next_key;
		fresh.npages = CHURN_PAGES_MIN + (uint32_t)(u_len * (CHURN_PAGES_MAX -
		    CHURN_PAGES_MIN + 1));
		if (u_kind >= 0.4 && nb > CHURN_HOT) {
			/* A reuse: 10% of them of a hot batch, the others by age. */
			if (u_hot < 0.1)
				b = &ring[(uint32_t)(u_age * CHURN_HOT)];
			else {
				for (lo = 0, hi = CHURN_RING - CHURN_HOT - 1; lo < hi;) {
					mid = (lo + hi) / 2;
					if (cdf[mid] < u_age)
						lo = mid + 1;
					else
						hi = mid;
				}
				age = lo < nb - CHURN_HOT ? lo : (uint32_t)(nb - CHURN_HOT - 1);
				b = &ring[CHURN_HOT + (nb - 1 - CHURN_HOT - age) % (CHURN_RING -
				    CHURN_HOT)];
			}
			want = u_whole < 0.5 ? b->npages : 1 + (uint32_t)(u_pre * b->npages);
			if (want > b->npages)
				want = b->npages;
			if (nleases == CHURN_LEASES)
				churn_release(d, leases, &nleases);
			l = &leases[nleases++];
			l->n = 0;
			for (hits = 0; hits < want; hits++) {
				bench_key(&k, b->base + hits);
				if (dram_lookup(d, &k, &id) != 0 || dram_pin(d, id) != 0)
					break;
				l->ids[l->n++] = id;
			}
			if (measuring) {
				want_pages += want;
				hit_pages += hits;
				if (churn_count(d, &rr, l->ids, l->n, len) != 0)
					return 1;
				churn_layout_write(churn_layout, d, l->ids, l->n);
			}
			if (hits < want) {
				if (churn_publish(d, b, hits, want, len, batch, &pubs[npubs], &alloc_ns) != 0)
					return 1;
				allocs += pubs[npubs].n;
				if (measuring && churn_count(d, &rp, pubs[npubs].ids, pubs[npubs].n,
				    len) != 0)
					return 1;
				npubs++;
			}
			/* Half of the reuses go on with new pages of their own. */
			if (u_ext >= 0.5)
				continue;
			if (npubs == CHURN_PUBLISHES)
				churn_commit(d, pubs, &npubs);
		}
		/* A new batch. */
		b = nb < CHURN_HOT ? &ring[nb] : &ring[CHURN_HOT + (nb - CHURN_HOT) %
		    (CHURN_RING - CHURN_HOT)];
		*b = fresh;
		next_key += fresh.npages;
		nb++;
		if (churn_publish(d, b, 0, b->npages, len, batch, &pubs[npubs], &alloc_ns) != 0)
			return 1;
		allocs += pubs[npubs].n;
		if (measuring && churn_count(d, &rn, pubs[npubs].ids, pubs[npubs].n, len) != 0)
			return 1;
		if (measuring)
			churn_layout_write(churn_blayout, d, pubs[npubs].ids, pubs[npubs].n);
		npubs++;
	}
	dram_stats(d, &st);
	evictions = st.evictions - ev0;
	printf("%llu steps measured after %llu of warm-up; reuse hit %.1f%% of %llu pages asked; "
	    "%.2f evictions per page allocated; alloc %.1f ns/page (evictions included)\n",
	    (unsigned long long)(step - warm), (unsigned long long)warm,
	    100.0 * (double)hit_pages / (double)(want_pages ? want_pages : 1),
	    (unsigned long long)want_pages, (double)evictions / (double)(allocs ? allocs : 1),
	    (double)alloc_ns / (double)(allocs ? allocs : 1));
	churn_print("new batch", &rn, len);
	churn_print("republish", &rp, len);
	churn_print("restore", &rr, len);
	while (npubs > 0)
		churn_commit(d, pubs, &npubs);
	while (nleases > 0)
		churn_release(d, leases, &nleases);
	dram_free(d);
	free(rn.len);
	free(rn.per);
	free(rr.len);
	free(rr.per);
	free(rp.len);
	free(rp.per);
	free(ring);
	free(cdf);
	return 0;
}

int
main(int argc, char **argv)
{
	uint64_t		 n, len, i, hits = 0, seed = 1;
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
	int			 c, churn = 0, batch = 1;

	while ((c = getopt(argc, argv, "cns:L:B:")) != -1) {
		switch (c) {
		case 'c':
			churn = 1;
			break;
		case 'n':
			batch = 0;
			break;
		case 's':
			seed = strtoull(optarg, NULL, 0);
			break;
		case 'B':
			if ((churn_blayout = fopen(optarg, "w")) == NULL) {
				fprintf(stderr, "bench_dram: %s: %s\n", optarg, strerror(errno));
				return 1;
			}
			break;
		case 'L':
			if ((churn_layout = fopen(optarg, "w")) == NULL) {
				fprintf(stderr, "bench_dram: %s: %s\n", optarg, strerror(errno));
				return 1;
			}
			break;
		default:
			fprintf(stderr, "usage: bench_dram [objects [object_bytes]]\n"
			    "       bench_dram -c [-n] [-s seed] [-L file] [-B file] [objects [object_bytes]]\n");
			return 1;
		}
	}
	argc -= optind;
	argv += optind;
	n = argc > 0 ? strtoull(argv[0], NULL, 0) : churn ? 4096 : 1000000;
	len = argc > 1 ? strtoull(argv[1], NULL, 0) : churn ? 36864 : 4096;
	if (churn) {
		c = bench_churn(n, len, seed, batch);
		if (churn_layout != NULL && fclose(churn_layout) != 0)
			c = 1;
		if (churn_blayout != NULL && fclose(churn_blayout) != 0)
			c = 1;
		return c;
	}

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
		if (dram_alloc(d, &k, len, i ? ids[i - 1] : DRAM_NONE, 1, &ids[i], &buf) != 0 ||
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
		if (dram_alloc(d, &k, len, DRAM_NONE, 1, &id, &buf) != 0 || dram_commit(d, id, i) != 0) {
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

	/* As publish.c allocates: near chained, the pages still to come given (issue 16). */
	t = bench_now();
	for (i = 0, id = DRAM_NONE; i < n; i++) {
		bench_key(&k, 3 * n + i);
		if (dram_alloc(d, &k, len, i % 128 ? id : DRAM_NONE, 128 - (uint32_t)(i % 128), &id,
		    &buf) != 0 || dram_commit(d, id, i) != 0) {
			fprintf(stderr, "bench_dram: alloc of a batch with eviction failed\n");
			return 1;
		}
	}
	bench_report("alloc+commit, evicting, batches of 128", n, bench_now() - t);
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
