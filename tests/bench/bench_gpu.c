/*
 * GPU data-path benchmark (issue 5), through kernels.h alone: restore N
 * pages from pinned host memory into random page slots of a device
 * region, at four object sizes, side by side in one run with
 *  - one pinned cudaMemcpy of the same bytes (the peak; goal >= 0.97x),
 *  - one cudaMemcpyAsync per page (goal >= 4x at 36 KiB),
 *  - one cudaMemcpy2DAsync per (page, layer);
 * with objects contiguous in the arena (a prefix allocated together) and
 * scattered in it; the alternatives (DMA only, zero-copy gather only, no
 * checksum, page_first destination); the restore while a busy kernel
 * holds every SM; publish (device -> host objects) against one pinned
 * D2H cudaMemcpy; and a sweep of engine configurations. Checksums are
 * verified on the GPU in every restore unless the column says otherwise.
 * Each figure is the median of RUNS timed runs after one warm-up, timed
 * on the host around submit..done. Results are checked: op status, 8
 * pages compared byte for byte per size, publish checksums.
 *
 *   bench_gpu [-r RUNS] [-m MIB_PER_RUN] [-s SIZES] [-L LAYOUT]... [-q]
 *
 * SIZES is a comma list of indices into the size table (default all).
 * -L (up to 4; with them only their table is made): restores laid out as
 * in LAYOUT, a file of `bench_dram -c -L`: the arena of that run, objects
 * at the offsets its restores found them at after churn; the restores,
 * in order, joined into one op of up to MIB_PER_RUN, against the same
 * run's pinned cudaMemcpy of those bytes, and the same objects at random
 * slots and back to back in the same arena; then the same three as
 * publishes (the region holds those objects: the same bytes written
 * back), against the D2H cudaMemcpy.
 * Prints markdown tables on stdout, progress on stderr.
 */
#include <sys/mman.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "kernels.h"
#include "bench.h"

#define BENCH_MIB	(1ULL << 20)
#define BENCH_RUNS_MAX	64

struct bench_size {
	const char	*name;
	uint32_t	 tokens, layers, tbytes;
};

static const struct bench_size bench_sizes[] = {
	{ "36 KiB (64 tok x 1 layer x 576 B)", 64, 1, 576 },
	{ "256 KiB (64 tok x 4 layers x 1 KiB)", 64, 4, 1024 },
	{ "2.25 MB (64 tok x 61 layers x 576 B, MLA)", 64, 61, 576 },
	{ "8 MiB (64 tok x 64 layers x 2 KiB)", 64, 64, 2048 },
};
#define BENCH_NSIZES	(sizeof(bench_sizes) / sizeof(bench_sizes[0]))

static int	bench_runs = 5;
static int	bench_quiet;
static uint64_t	bench_rng = 0x9e3779b97f4a7c15ULL;

static uint64_t
bench_rnd(void)
{
	return bench_xorshift(&bench_rng);
}

static void
bench_fill(uint8_t *p, size_t n)
{
	uint64_t	v;

	for (; n >= 8; n -= 8, p += 8) {
		v = bench_rnd();
		memcpy(p, &v, 8);
	}
	for (v = bench_rnd(); n > 0; n--, v >>= 8)
		*p++ = (uint8_t)v;
}

static void
bench_die(const char *what, int rc, const char *err)
{
	fprintf(stderr, "bench_gpu: %s: %d (%s) %s\n", what, rc, strerror(rc < 0 ? -rc : rc),
	    err != NULL ? err : "");
	exit(1);
}

static void
bench_note(const char *fmt, const char *s)
{
	if (!bench_quiet)
		fprintf(stderr, fmt, s);
}

/* One size's setup: the arena, two placements of N objects, the device region. */
struct bench_set {
	const struct bench_size	*sz;
	uint64_t		 obj;
	uint32_t		 n;
	size_t			 alen;
	uint8_t			*arena;
	struct kernels_page	*contig;	/* objects back to back, in order */
	struct kernels_page	*scat;		/* objects at random arena slots */
	struct kernels_geom	 lf;		/* layer_first over dev */
	struct kernels_geom	 pf;		/* page_first over the same bytes */
	void			*dev;
	size_t			 dlen;
	struct kernels_region	*rlf;
	struct kernels_region	*rpf;
};

static void
bench_set_make(struct bench_set *s, const struct bench_size *sz, uint64_t bytes,
    struct kernels_engine *e)
{
	uint32_t	 i, j, nslots, t, *slot, *pages;
	char		 err[256] = "";
	int		 rc;

	memset(s, 0, sizeof(*s));
	s->sz = sz;
	s->obj = (uint64_t)sz->tokens * sz->layers * sz->tbytes;
	s->n = (uint32_t)(bytes / s->obj);
	if (s->n < 8)
		s->n = 8;
	nslots = 2 * s->n;
	s->alen = (size_t)nslots * s->obj;
	s->arena = mmap(NULL, s->alen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s->arena == MAP_FAILED)
		bench_die("mmap", -errno, NULL);
	bench_fill(s->arena, s->alen);
	if ((rc = kernels_host_register(s->arena, s->alen, err, sizeof(err))) != 0)
		bench_die("kernels_host_register", rc, err);

	/* destination: 2N page slots, N of them at random */
	s->lf.num_pages = nslots;
	s->lf.page_tokens = sz->tokens;
	s->lf.layers = sz->layers;
	s->lf.token_bytes = sz->tbytes;
	s->lf.token_stride = sz->tbytes;
	s->lf.page_stride = (uint64_t)sz->tokens * sz->tbytes;
	s->lf.layer_stride = (uint64_t)nslots * s->lf.page_stride;
	s->dlen = (size_t)sz->layers * s->lf.layer_stride;
	if ((rc = kernels_dev_alloc(s->dlen, &s->dev, err, sizeof(err))) != 0)
		bench_die("kernels_dev_alloc", rc, err);
	s->lf.base = s->dev;
	s->lf.size = s->dlen;
	s->pf = s->lf;
	s->pf.token_stride = (uint64_t)sz->layers * sz->tbytes;
	s->pf.layer_stride = sz->tbytes;
	s->pf.page_stride = s->obj;
	if ((rc = kernels_region_new(e, &s->lf, &s->rlf, err, sizeof(err))) != 0 ||
	    (rc = kernels_region_new(e, &s->pf, &s->rpf, err, sizeof(err))) != 0)
		bench_die("kernels_region_new", rc, err);

	slot = malloc(nslots * sizeof(*slot));
	pages = malloc(nslots * sizeof(*pages));
	s->contig = calloc(s->n, sizeof(*s->contig));
	s->scat = calloc(s->n, sizeof(*s->scat));
	if (slot == NULL || pages == NULL || s->contig == NULL || s->scat == NULL)
		bench_die("malloc", -ENOMEM, NULL);
	for (i = 0; i < nslots; i++)
		slot[i] = pages[i] = i;
	for (i = 0; i < nslots; i++) {
		j = i + (uint32_t)(bench_rnd() % (nslots - i));
		t = slot[i], slot[i] = slot[j], slot[j] = t;
		j = i + (uint32_t)(bench_rnd() % (nslots - i));
		t = pages[i], pages[i] = pages[j], pages[j] = t;
	}
	for (i = 0; i < s->n; i++) {
		s->contig[i].host = s->arena + (uint64_t)i * s->obj;
		s->scat[i].host = s->arena + (uint64_t)slot[i] * s->obj;
		s->contig[i].page = s->scat[i].page = pages[i];
	}
	for (i = 0; i < s->n; i++) {
		s->contig[i].checksum = checksum_obj(s->contig[i].host, s->obj);
		s->scat[i].checksum = checksum_obj(s->scat[i].host, s->obj);
	}
	free(slot);
	free(pages);
}

static void
bench_set_free(struct bench_set *s)
{
	char	err[256];

	kernels_region_free(s->rlf);
	kernels_region_free(s->rpf);
	kernels_dev_free(s->dev);
	kernels_host_unregister(s->arena, err, sizeof(err));
	munmap(s->arena, s->alen);
	free(s->contig);
	free(s->scat);
}

/* Compares 8 restored pages of a layer_first restore with their objects. */
static void
bench_verify(const struct bench_set *s, const struct kernels_page *pg, const char *what)
{
	uint64_t	 row = (uint64_t)s->sz->tokens * s->sz->tbytes;
	uint8_t		*back = malloc(row);
	uint32_t	 k, i, l, t;
	char		 err[256] = "";
	int		 rc;

	if (back == NULL)
		bench_die("malloc", -ENOMEM, NULL);
	for (k = 0; k < 8; k++) {
		i = k == 0 ? 0 : k == 7 ? s->n - 1 : (uint32_t)(bench_rnd() % s->n);
		for (l = 0; l < s->sz->layers; l++) {
			const uint8_t *d = (const uint8_t *)s->dev + l * s->lf.layer_stride +
			    pg[i].page * s->lf.page_stride;

			if ((rc = kernels_copy(back, d, row, err, sizeof(err))) != 0)
				bench_die("kernels_copy", rc, err);
			for (t = 0; t < s->sz->tokens; t++) {
				const uint8_t *o = (const uint8_t *)pg[i].host +
				    ((uint64_t)t * s->sz->layers + l) * s->sz->tbytes;

				if (memcmp(back + (uint64_t)t * s->sz->tbytes, o, s->sz->tbytes) != 0) {
					fprintf(stderr, "bench_gpu: %s: page %u layer %u token %u "
					    "differs\n", what, i, l, t);
					exit(1);
				}
			}
		}
	}
	free(back);
}

/* One timed thing: a restore, a publish, a plain copy or a baseline. */
enum { BENCH_RESTORE, BENCH_PUBLISH, BENCH_COPY, BENCH_BASELINE, BENCH_CHUNKED };
struct bench_call {
	int				 kind;
	struct kernels_engine		*e;
	struct kernels_region		*r;
	const struct kernels_page	*pg;
	uint32_t			 n;
	unsigned			 flags;	/* restore/publish; KERNELS_BENCH_* for baselines */
	uint64_t			*cs;	/* publish: checksums out */
	const struct kernels_geom	*g;
	void				*dst;
	const void			*src;
	size_t				 len;
};

/* Runs c once; returns the seconds from submit to done. */
static double
bench_once(const struct bench_call *c)
{
	struct kernels_result	 res;
	struct kernels_op	*op = NULL;
	struct kernels_region	*r = c->r;
	double			 t0 = bench_now();
	char			 err[256] = "";
	int			 rc;

	switch (c->kind) {
	case BENCH_COPY:
		if ((rc = kernels_copy(c->dst, c->src, c->len, err, sizeof(err))) != 0)
			bench_die("kernels_copy", rc, err);
		break;
	case BENCH_CHUNKED:
		/* c->n: the chunk in bytes; c->flags: streams */
		rc = kernels_bench_chunked(c->dst, c->src, c->len, c->n, c->flags, err, sizeof(err));
		if (rc != 0)
			bench_die("kernels_bench_chunked", rc, err);
		break;
	case BENCH_BASELINE:
		if ((rc = kernels_bench_copy((int)c->flags, c->g, c->pg, c->n, err, sizeof(err))) != 0)
			bench_die("kernels_bench_copy", rc, err);
		break;
	default:
		rc = (c->kind == BENCH_PUBLISH ? kernels_publish_submit : kernels_restore_submit)(
		    c->e, &r, 1, c->pg, c->n, NULL, c->flags, &op, err, sizeof(err));
		if (rc != 0)
			bench_die("submit", rc, err);
		rc = kernels_op_wait(op);
		kernels_op_result(op, &res, NULL, c->cs);
		if (rc != 0)
			bench_die(c->kind == BENCH_PUBLISH ? "publish" : "restore", rc, res.err);
		kernels_op_free(op);
		break;
	}
	return bench_now() - t0;
}

/* GB/s (decimal) of bytes, the median of bench_runs runs after a warm-up. */
static double
bench_measure(uint64_t bytes, const struct bench_call *c)
{
	double	v[BENCH_RUNS_MAX] = { 0 };
	int	i;

	(void)bench_once(c);
	for (i = 0; i < bench_runs; i++)
		v[i] = (double)bytes / bench_once(c) / 1e9;
	return bench_median(v, bench_runs);
}

static double
bench_op(struct kernels_engine *e, int kind, struct kernels_region *r,
    const struct kernels_page *pg, uint32_t n, unsigned flags, uint64_t *cs)
{
	struct bench_call	c;

	memset(&c, 0, sizeof(c));
	c.kind = kind;
	c.e = e;
	c.r = r;
	c.pg = pg;
	c.n = n;
	c.flags = flags;
	c.cs = cs;
	return bench_measure(n * kernels_region_obj_bytes(r), &c);
}

static double
bench_copy(void *dst, const void *src, size_t len)
{
	struct bench_call	c;

	memset(&c, 0, sizeof(c));
	c.kind = BENCH_COPY;
	c.dst = dst;
	c.src = src;
	c.len = len;
	return bench_measure(len, &c);
}

/* H2D as cudaMemcpyAsync pieces of chunk bytes over 2 streams: the engine's DMA pattern. */
static double
bench_chunked(void *dst, const void *src, size_t len, uint32_t chunk)
{
	struct bench_call	c;

	memset(&c, 0, sizeof(c));
	c.kind = BENCH_CHUNKED;
	c.dst = dst;
	c.src = src;
	c.len = len;
	c.n = chunk;
	c.flags = 2;
	return bench_measure(len, &c);
}

static double
bench_baseline(int how, const struct kernels_geom *g, const struct kernels_page *pg, uint32_t n)
{
	struct bench_call	c;

	memset(&c, 0, sizeof(c));
	c.kind = BENCH_BASELINE;
	c.flags = (unsigned)how;
	c.g = g;
	c.pg = pg;
	c.n = n;
	return bench_measure((uint64_t)n * g->page_tokens * g->layers * g->token_bytes, &c);
}

struct bench_row {
	double	peak, contig, scat, per_page, per_layer;
	double	scat_dma, scat_zc, contig_nov, contig_pf, busy, d2h, publish;
	/*
	 * Host-scattered restores and publishes by engine variant (bench_var):
	 * the old default (no batch: the kernel below 1 MiB, a copy per run
	 * above), the default, every run batched, short runs mixed between
	 * batch and kernel, and the default and all-batched with two copy
	 * streams per direction.
	 */
	double	var_restore[6], var_publish[6];
	double	contig_slot[3];	/* host-contiguous with 16, 64 and 128 MiB slots */
	double	chunked;	/* H2D in 32 MiB cudaMemcpyAsync pieces over 2 streams */
};
static const size_t	bench_slot_sizes[3] = { 16 << 20, 64 << 20, 128 << 20 };

static struct kernels_engine *
bench_engine_conf(const struct kernels_conf *c)
{
	struct kernels_engine	*e = NULL;
	char			 err[256] = "";
	int			 rc;

	if ((rc = kernels_engine_new(c, &e, err, sizeof(err))) != 0)
		bench_die("kernels_engine_new", rc, err);
	return e;
}

/* The engine variants of the scattered table (struct bench_row's var_*). */
static const struct bench_var {
	const char	*name;
	int		 batch_dma;
	unsigned	 copy_streams;
	unsigned	 flags;
} bench_vars[] = {
	{ "old default (no batch)", 0, 1, 0 },
	{ "default", 1, 1, 0 },
	{ "all runs batched", 1, 1, KERNELS_F_BATCH },
	{ "short runs mixed", 1, 1, KERNELS_F_MIX },
	{ "default, 2 copy streams", 1, 2, 0 },
	{ "all batched, 2 copy streams", 1, 2, KERNELS_F_BATCH },
};
#define BENCH_NVARS	(sizeof(bench_vars) / sizeof(bench_vars[0]))

/* A publish's checksums against the objects', and the objects unchanged. */
static void
bench_check_publish(const struct bench_set *s, const uint64_t *cs, const char *what)
{
	uint32_t	i;

	for (i = 0; i < s->n; i++) {
		if (cs[i] != s->scat[i].checksum || checksum_obj(s->scat[i].host, s->obj) !=
		    s->scat[i].checksum) {
			fprintf(stderr, "bench_gpu: %s: page %u checksum %016llx, want %016llx\n",
			    what, i, (unsigned long long)cs[i], (unsigned long long)s->scat[i].checksum);
			exit(1);
		}
	}
}

static struct kernels_engine *
bench_engine(size_t slot, unsigned slots, unsigned streams, size_t dma_min)
{
	struct kernels_engine	*e = NULL;
	struct kernels_conf	 c;
	char			 err[256] = "";
	int			 rc;

	kernels_conf_default(&c);
	if (slot)
		c.slot_bytes = slot;
	if (slots)
		c.slots = slots;
	if (streams)
		c.streams = streams;
	if (dma_min) {
		c.dma_min_bytes = dma_min;
		c.batch_dma = 0;	/* the sweep of the old knob: a copy per run from dma_min */
	}
	if ((rc = kernels_engine_new(&c, &e, err, sizeof(err))) != 0)
		bench_die("kernels_engine_new", rc, err);
	return e;
}

static void
bench_size_run(const struct bench_size *sz, uint64_t bytes, struct bench_row *row,
    double sweep[2][3])
{
	static const size_t	 dma_mins[3] = { 256 << 10, 1 << 20, 4 << 20 };
	static const unsigned	 nstreams[2] = { 2, 4 };
	struct kernels_engine	*e, *e2;
	struct kernels_region	*r2;
	struct bench_set	 s;
	uint64_t		*cs, total;
	unsigned		 a, b;
	char			 err[256] = "";
	int			 rc;

	e = bench_engine(0, 0, 0, 0);
	bench_note("  setting up %s\n", sz->name);
	bench_set_make(&s, sz, bytes, e);
	total = (uint64_t)s.n * s.obj;
	bench_note("  measuring %s\n", sz->name);

	row->peak = bench_copy(s.dev, s.arena, total);
	row->chunked = bench_chunked(s.dev, s.arena, total, 32U << 20);
	row->contig = bench_op(e, BENCH_RESTORE, s.rlf, s.contig, s.n, 0, NULL);
	bench_verify(&s, s.contig, "restore, host-contiguous");
	row->contig_nov = bench_op(e, BENCH_RESTORE, s.rlf, s.contig, s.n, KERNELS_F_NOVERIFY,
	    NULL);
	row->contig_pf = bench_op(e, BENCH_RESTORE, s.rpf, s.contig, s.n, 0, NULL);
	row->per_page = bench_baseline(KERNELS_BENCH_PER_PAGE, &s.pf, s.scat, s.n);
	row->per_layer = bench_baseline(KERNELS_BENCH_PER_LAYER, &s.lf, s.scat, s.n);
	row->scat_dma = bench_op(e, BENCH_RESTORE, s.rlf, s.scat, s.n, KERNELS_F_DMA, NULL);
	bench_verify(&s, s.scat, "restore, scattered, DMA");
	row->scat_zc = bench_op(e, BENCH_RESTORE, s.rlf, s.scat, s.n, KERNELS_F_ZEROCOPY, NULL);
	bench_verify(&s, s.scat, "restore, scattered, zero-copy");
	row->scat = bench_op(e, BENCH_RESTORE, s.rlf, s.scat, s.n, 0, NULL);
	bench_verify(&s, s.scat, "restore, host-scattered");

	/* the region holds the scattered objects: publishing writes the same bytes back */
	if ((cs = calloc(s.n, sizeof(*cs))) == NULL)
		bench_die("calloc", -ENOMEM, NULL);
	row->publish = bench_op(e, BENCH_PUBLISH, s.rlf, s.scat, s.n, 0, cs);
	bench_check_publish(&s, cs, "publish");
	for (a = 0; a < BENCH_NVARS; a++) {
		struct kernels_conf	kc;

		kernels_conf_default(&kc);
		kc.batch_dma = bench_vars[a].batch_dma;
		kc.copy_streams = bench_vars[a].copy_streams;
		e2 = bench_engine_conf(&kc);
		if ((rc = kernels_region_new(e2, &s.lf, &r2, err, sizeof(err))) != 0)
			bench_die("kernels_region_new", rc, err);
		row->var_restore[a] = bench_op(e2, BENCH_RESTORE, r2, s.scat, s.n,
		    bench_vars[a].flags, NULL);
		bench_verify(&s, s.scat, bench_vars[a].name);
		memset(cs, 0, s.n * sizeof(*cs));
		row->var_publish[a] = bench_op(e2, BENCH_PUBLISH, r2, s.scat, s.n,
		    bench_vars[a].flags, cs);
		bench_check_publish(&s, cs, bench_vars[a].name);
		kernels_region_free(r2);
		kernels_engine_free(e2);
	}
	free(cs);

	if ((rc = kernels_busy_start(err, sizeof(err))) != 0)
		bench_die("kernels_busy_start", rc, err);
	row->busy = bench_op(e, BENCH_RESTORE, s.rlf, s.scat, s.n, 0, NULL);
	if ((rc = kernels_busy_stop(err, sizeof(err))) != 0)
		bench_die("kernels_busy_stop", rc, err);
	bench_verify(&s, s.scat, "restore beside the busy kernel");

	for (a = 0; a < 2; a++) {
		for (b = 0; b < 3; b++) {
			e2 = bench_engine(0, 2 * nstreams[a], nstreams[a], dma_mins[b]);
			if ((rc = kernels_region_new(e2, &s.lf, &r2, err, sizeof(err))) != 0)
				bench_die("kernels_region_new", rc, err);
			sweep[a][b] = bench_op(e2, BENCH_RESTORE, r2, s.scat, s.n, 0, NULL);
			kernels_region_free(r2);
			kernels_engine_free(e2);
		}
	}
	for (a = 0; a < 3; a++) {
		e2 = bench_engine(bench_slot_sizes[a], 0, 0, 0);
		if ((rc = kernels_region_new(e2, &s.lf, &r2, err, sizeof(err))) != 0)
			bench_die("kernels_region_new", rc, err);
		row->contig_slot[a] = bench_op(e2, BENCH_RESTORE, r2, s.contig, s.n, 0, NULL);
		kernels_region_free(r2);
		kernels_engine_free(e2);
	}
	/* last: it overwrites host objects */
	row->d2h = bench_copy(s.arena, s.dev, total);
	bench_set_free(&s);
	kernels_engine_free(e);
}

/*
 * The latency of a 4096-token MLA FP8 restore (64 pages of 64 tokens x 61
 * layers x 576 B, host-contiguous, layer_first) against one pinned
 * cudaMemcpy of the same bytes, in ms (median). No socket: the daemon's
 * round trips come on top.
 */
static void
bench_latency(double *restore_ms, double *copy_ms)
{
	const struct bench_size	*sz = &bench_sizes[2];
	struct kernels_engine	*e = bench_engine(0, 0, 0, 0);
	struct bench_set	 s;
	uint64_t		 total;

	bench_set_make(&s, sz, 64ULL * sz->tokens * sz->layers * sz->tbytes, e);
	total = (uint64_t)s.n * s.obj;
	*copy_ms = (double)total / (bench_copy(s.dev, s.arena, total) * 1e9) * 1e3;
	*restore_ms = (double)total / (bench_op(e, BENCH_RESTORE, s.rlf, s.contig, s.n, 0, NULL) *
	    1e9) * 1e3;
	bench_verify(&s, s.contig, "latency restore");
	bench_set_free(&s);
	kernels_engine_free(e);
}

/* A publish's checksums against the objects' own. */
static void
bench_layout_check(const struct kernels_page *pg, const uint64_t *cs, uint32_t n, uint64_t olen,
    const char *what)
{
	uint32_t	i;

	for (i = 0; i < n; i++)
		if (cs[i] != pg[i].checksum || checksum_obj(pg[i].host, olen) != pg[i].checksum) {
			fprintf(stderr, "bench_gpu: %s: object %u checksum %016llx, want %016llx\n",
			    what, i, (unsigned long long)cs[i], (unsigned long long)pg[i].checksum);
			exit(1);
		}
}

/*
 * -L: one layout of bench_dram -c, replayed. Each restore's objects keep
 * their offsets; restores are taken whole, evenly spaced over the file
 * (every k-th, k so that they fill bytes), while the op stays within bytes
 * and the arena. Runs (of consecutive offsets) end at each restore's end
 * too, as separate RESTOREs would.
 */
static void
bench_layout(const char *path, uint64_t bytes)
{
	struct bench_set	 s;
	struct kernels_engine	*e;
	struct kernels_page	*lay, *rnd, *con;
	const struct bench_size	*sz = NULL;
	unsigned long long	 alen, olen, off;
	uint32_t		*pages, *slot, i, j, t, k, cnt, nslots, runs = 0, sets = 0;
	uint64_t		 prev = UINT64_MAX, total, all, every, nth, *cs;
	double			 d2h, play, prnd, pcon;
	long			 pos;
	double			 peak, vlay, vrnd, vcon;
	char			 err[256] = "";
	FILE			*f;
	int			 rc;

	if ((f = fopen(path, "r")) == NULL)
		bench_die(path, -errno, NULL);
	if (fscanf(f, "l3kv-layout 1 %llu %llu", &alen, &olen) != 2)
		bench_die(path, -EINVAL, "not a bench_dram -c -L layout");
	for (i = 0; i < BENCH_NSIZES; i++)
		if ((uint64_t)bench_sizes[i].tokens * bench_sizes[i].layers *
		    bench_sizes[i].tbytes == olen)
			sz = &bench_sizes[i];
	if (sz == NULL)
		bench_die(path, -EINVAL, "its object size is none of the table's");
	e = bench_engine(0, 0, 0, 0);
	memset(&s, 0, sizeof(s));
	s.sz = sz;
	s.obj = olen;
	s.alen = alen;
	if (bytes > alen)
		bytes = alen;
	lay = calloc(bytes / olen + 1, sizeof(*lay));
	if (lay == NULL)
		bench_die("malloc", -ENOMEM, NULL);
	/* Every k-th restore, whole: k from the file's objects against what fits. */
	pos = ftell(f);
	for (all = 0; fscanf(f, "%u", &cnt) == 1; all += cnt)
		for (k = 0; k < cnt; k++)
			if (fscanf(f, "%llu", &off) != 1)
				bench_die(path, -EINVAL, "a restore cut short");
	every = all * olen / bytes > 1 ? all * olen / bytes : 1;
	fseek(f, pos, SEEK_SET);
	for (nth = 0; fscanf(f, "%u", &cnt) == 1 && (uint64_t)(s.n + cnt) * olen <= bytes;
	    nth++) {
		for (k = 0; k < cnt; k++) {
			if (fscanf(f, "%llu", &off) != 1 || off + olen > alen || off % 64 != 0)
				bench_die(path, -EINVAL, "an offset outside the arena");
			if (nth % every != 0)
				continue;
			lay[s.n + k].host = (void *)(uintptr_t)off;
			runs += k == 0 || off != prev + olen;
			prev = off;
		}
		if (nth % every != 0)
			continue;
		s.n += cnt;
		sets++;
	}
	fclose(f);
	if (s.n < 8)
		bench_die(path, -EINVAL, "fewer than 8 objects fit");
	total = (uint64_t)s.n * olen;
	s.arena = mmap(NULL, alen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s.arena == MAP_FAILED)
		bench_die("mmap", -errno, NULL);
	bench_fill(s.arena, alen);
	if ((rc = kernels_host_register(s.arena, alen, err, sizeof(err))) != 0)
		bench_die("kernels_host_register", rc, err);
	nslots = 2 * s.n;
	s.lf.num_pages = nslots;
	s.lf.page_tokens = sz->tokens;
	s.lf.layers = sz->layers;
	s.lf.token_bytes = sz->tbytes;
	s.lf.token_stride = sz->tbytes;
	s.lf.page_stride = (uint64_t)sz->tokens * sz->tbytes;
	s.lf.layer_stride = (uint64_t)nslots * s.lf.page_stride;
	s.dlen = (size_t)sz->layers * s.lf.layer_stride;
	if ((rc = kernels_dev_alloc(s.dlen, &s.dev, err, sizeof(err))) != 0)
		bench_die("kernels_dev_alloc", rc, err);
	s.lf.base = s.dev;
	s.lf.size = s.dlen;
	if ((rc = kernels_region_new(e, &s.lf, &s.rlf, err, sizeof(err))) != 0)
		bench_die("kernels_region_new", rc, err);
	/* Destinations: N distinct random pages of 2N; random slots: N distinct of the arena's. */
	pages = malloc(nslots * sizeof(*pages));
	slot = malloc((alen / olen) * sizeof(*slot));
	rnd = calloc(s.n, sizeof(*rnd));
	con = calloc(s.n, sizeof(*con));
	if (pages == NULL || slot == NULL || rnd == NULL || con == NULL)
		bench_die("malloc", -ENOMEM, NULL);
	for (i = 0; i < nslots; i++)
		pages[i] = i;
	for (i = 0; i < alen / olen; i++)
		slot[i] = i;
	for (i = 0; i < nslots; i++) {
		j = i + (uint32_t)(bench_rnd() % (nslots - i));
		t = pages[i], pages[i] = pages[j], pages[j] = t;
	}
	for (i = 0; i < s.n; i++) {
		j = i + (uint32_t)(bench_rnd() % (alen / olen - i));
		t = slot[i], slot[i] = slot[j], slot[j] = t;
	}
	for (i = 0; i < s.n; i++) {
		lay[i].host = s.arena + (uintptr_t)lay[i].host;
		rnd[i].host = s.arena + (uint64_t)slot[i] * olen;
		con[i].host = s.arena + (uint64_t)i * olen;
		lay[i].page = rnd[i].page = con[i].page = pages[i];
		lay[i].checksum = checksum_obj(lay[i].host, olen);
		rnd[i].checksum = checksum_obj(rnd[i].host, olen);
		con[i].checksum = checksum_obj(con[i].host, olen);
	}
	bench_note("  replaying %s\n", path);
	if ((cs = calloc(s.n, sizeof(*cs))) == NULL)
		bench_die("calloc", -ENOMEM, NULL);
	peak = bench_copy(s.dev, s.arena, total);
	d2h = bench_copy(s.arena, s.dev, total);
	vlay = bench_op(e, BENCH_RESTORE, s.rlf, lay, s.n, 0, NULL);
	bench_verify(&s, lay, "restore, churned layout");
	/* the region now holds those objects: publishing them writes the same bytes back */
	play = bench_op(e, BENCH_PUBLISH, s.rlf, lay, s.n, 0, cs);
	bench_layout_check(lay, cs, s.n, olen, "publish, churned layout");
	vrnd = bench_op(e, BENCH_RESTORE, s.rlf, rnd, s.n, 0, NULL);
	bench_verify(&s, rnd, "restore, random slots");
	prnd = bench_op(e, BENCH_PUBLISH, s.rlf, rnd, s.n, 0, cs);
	bench_layout_check(rnd, cs, s.n, olen, "publish, random slots");
	vcon = bench_op(e, BENCH_RESTORE, s.rlf, con, s.n, 0, NULL);
	bench_verify(&s, con, "restore, back to back");
	pcon = bench_op(e, BENCH_PUBLISH, s.rlf, con, s.n, 0, cs);
	bench_layout_check(con, cs, s.n, olen, "publish, back to back");
	printf("| %s | %s | %u sets, %u objects, %.1f MB | %.2f | %.0f | %.1f | %.3f | %.3f | "
	    "%.3f | %.1f | %.3f | %.3f | %.3f |\n",
	    strrchr(path, '/') != NULL ? strrchr(path, '/') + 1 : path, sz->name, sets, s.n,
	    (double)total / 1e6, (double)runs / sets, (double)total / runs / 1024, peak,
	    vlay / peak, vrnd / peak, vcon / peak, d2h, play / d2h, prnd / d2h, pcon / d2h);
	free(cs);
	kernels_region_free(s.rlf);
	kernels_dev_free(s.dev);
	kernels_host_unregister(s.arena, err, sizeof(err));
	munmap(s.arena, alen);
	free(lay);
	free(rnd);
	free(con);
	free(pages);
	free(slot);
	kernels_engine_free(e);
}

int
main(int argc, char **argv)
{
	static struct bench_row	 rows[BENCH_NSIZES];
	static double		 sweep[BENCH_NSIZES][2][3];
	uint64_t		 bytes = 1024 * BENCH_MIB;
	int			 want[BENCH_NSIZES], c, rc, n;
	unsigned		 i, a, v;
	char			 desc[256] = "", err[256] = "", *p;
	const char		*layouts[4];
	double			 lat_restore, lat_copy;
	int			 nlayouts = 0;

	for (i = 0; i < BENCH_NSIZES; i++)
		want[i] = 1;
	while ((c = getopt(argc, argv, "r:m:s:L:q")) != -1) {
		switch (c) {
		case 'r':
			bench_runs = atoi(optarg);
			if (bench_runs < 1 || bench_runs > BENCH_RUNS_MAX)
				bench_die("-r: 1..64", -EINVAL, NULL);
			break;
		case 'm':
			bytes = strtoull(optarg, NULL, 10) * BENCH_MIB;
			break;
		case 's':
			for (i = 0; i < BENCH_NSIZES; i++)
				want[i] = 0;
			for (p = strtok(optarg, ","); p != NULL; p = strtok(NULL, ","))
				if ((unsigned)atoi(p) < BENCH_NSIZES)
					want[atoi(p)] = 1;
			break;
		case 'q':
			bench_quiet = 1;
			break;
		case 'L':
			if (nlayouts == 4)
				bench_die("-L: at most 4", -EINVAL, NULL);
			layouts[nlayouts++] = optarg;
			break;
		default:
			fprintf(stderr, "usage: bench_gpu [-r RUNS] [-m MIB_PER_RUN] [-s 0,1,2,3] "
			    "[-L LAYOUT]... [-q]\n");
			return 2;
		}
	}
	bench_rng ^= (uint64_t)time(NULL) << 16 ^ (uint64_t)getpid();
	n = kernels_device_count(desc, sizeof(desc));
	if (n <= 0) {
		fprintf(stderr, "bench_gpu: no GPU: %s\n", desc);
		return 1;
	}
	if ((rc = kernels_init(0, err, sizeof(err))) != 0)
		bench_die("kernels_init", rc, err);
	if (nlayouts > 0) {
		printf("## Restores laid out as a churned arena leaves them (bench_dram -c -L), %s\n\n"
		    "Up to %llu MiB per op (whole restores, in order), median of %d runs after a "
		    "warm-up; GB/s decimal; checksums verified; x the same bytes' pinned "
		    "cudaMemcpy; the same objects at random arena slots and back to back beside.\n\n",
		    desc, (unsigned long long)(bytes / BENCH_MIB), bench_runs);
		printf("| layout | object | op | runs/set | KiB/run | H2D peak | restore x peak | "
		    "random slots | back to back | D2H peak | publish x D2H peak | random slots | "
		    "back to back |\n");
		printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
		for (a = 0; a < (unsigned)nlayouts; a++)
			bench_layout(layouts[a], bytes);
		kernels_fini();
		return 0;
	}
	for (i = 0; i < BENCH_NSIZES; i++)
		if (want[i])
			bench_size_run(&bench_sizes[i], bytes, &rows[i], sweep[i]);
	bench_note("  %s\n", "measuring the 4096-token MLA restore latency");
	bench_latency(&lat_restore, &lat_copy);

	printf("## GPU restore/publish, %s\n\n", desc);
	printf("%llu MiB per run, median of %d runs after a warm-up; GB/s decimal; checksums "
	    "verified on the GPU unless said otherwise; destination: layer_first, random page "
	    "slots among 2N; engine defaults (32 MiB slots x 4, 2 streams, host runs >= 128 KiB "
	    "by one cudaMemcpyBatchAsync a chunk, the zero-copy gather kernel below).\n\n", (unsigned long long)(bytes / BENCH_MIB),
	    bench_runs);
	printf("| object | H2D peak (1 cudaMemcpy) | restore, host-contiguous | x peak | "
	    "restore, host-scattered | x peak | 1 memcpy/page | scattered / per-page | "
	    "1 memcpy2D/(page,layer) | scattered / per-layer |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|\n");
	for (i = 0; i < BENCH_NSIZES; i++) {
		const struct bench_row *r = &rows[i];

		if (!want[i])
			continue;
		printf("| %s | %.1f | %.1f | %.3f | %.1f | %.3f | %.1f | %.2fx | %.1f | %.2fx |\n",
		    bench_sizes[i].name, r->peak, r->contig, r->contig / r->peak, r->scat,
		    r->scat / r->peak, r->per_page, r->scat / r->per_page, r->per_layer,
		    r->scat / r->per_layer);
	}
	printf("\n| object | scattered, DMA only | scattered, zero-copy only | contiguous, no "
	    "checksum | contiguous, into page_first | scattered, GPU busy | x peak | D2H peak | "
	    "publish (scattered) | x D2H peak |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|\n");
	for (i = 0; i < BENCH_NSIZES; i++) {
		const struct bench_row *r = &rows[i];

		if (!want[i])
			continue;
		printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.3f | %.1f | %.1f | %.3f |\n",
		    bench_sizes[i].name, r->scat_dma, r->scat_zc, r->contig_nov, r->contig_pf,
		    r->busy, r->busy / r->peak, r->d2h, r->publish, r->publish / r->d2h);
	}
	for (a = 0; a < 2; a++) {
		printf("\nHost-scattered %s by engine variant, x the %s peak (GB/s in brackets); "
		    "batched: cudaMemcpyBatchAsync, one a chunk; the default batches runs >= 128 KiB "
		    "and gathers shorter ones with the kernel:\n\n", a ? "publish" : "restore",
		    a ? "D2H" : "H2D");
		printf("| object |");
		for (v = 0; v < BENCH_NVARS; v++)
			printf(" %s |", bench_vars[v].name);
		printf("\n|---|");
		for (v = 0; v < BENCH_NVARS; v++)
			printf("---|");
		printf("\n");
		for (i = 0; i < BENCH_NSIZES; i++) {
			const struct bench_row *r = &rows[i];

			if (!want[i])
				continue;
			printf("| %s |", bench_sizes[i].name);
			for (v = 0; v < BENCH_NVARS; v++) {
				double x = a ? r->var_publish[v] : r->var_restore[v];

				printf(" %.3f (%.1f) |", x / (a ? r->d2h : r->peak), x);
			}
			printf("\n");
		}
	}
	printf("\nEngine sweep, host-scattered restore GB/s (slots = 2 x streams):\n\n");
	printf("| object | 2 streams, DMA >= 256K | 2 st, >= 1M | 2 st, >= 4M | 4 streams, DMA "
	    ">= 256K | 4 st, >= 1M | 4 st, >= 4M |\n");
	printf("|---|---|---|---|---|---|---|\n");
	for (i = 0; i < BENCH_NSIZES; i++) {
		if (!want[i])
			continue;
		printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", bench_sizes[i].name,
		    sweep[i][0][0], sweep[i][0][1], sweep[i][0][2], sweep[i][1][0], sweep[i][1][1],
		    sweep[i][1][2]);
	}
	printf("\nStaging slot size, host-contiguous restore GB/s and x peak (4 slots, 2 streams; "
	    "the default is 32 MiB):\n\n");
	printf("| object | 16 MiB | x peak | 32 MiB | x peak | 64 MiB | x peak | 128 MiB | x peak |\n");
	printf("|---|---|---|---|---|---|---|---|---|\n");
	for (i = 0; i < BENCH_NSIZES; i++) {
		const struct bench_row *r = &rows[i];

		if (!want[i])
			continue;
		printf("| %s | %.1f | %.3f | %.1f | %.3f | %.1f | %.3f | %.1f | %.3f |\n",
		    bench_sizes[i].name, r->contig_slot[0], r->contig_slot[0] / r->peak, r->contig,
		    r->contig / r->peak, r->contig_slot[1], r->contig_slot[1] / r->peak,
		    r->contig_slot[2], r->contig_slot[2] / r->peak);
	}
	printf("\nThe engine's DMA pattern alone: H2D of the same bytes as 32 MiB cudaMemcpyAsync pieces "
	    "over 2 streams, against one cudaMemcpy; and the host-contiguous restore against it:\n\n");
	printf("| object | 1 cudaMemcpy GB/s | 32 MiB pieces GB/s | x 1 cudaMemcpy | restore, "
	    "host-contiguous | x 32 MiB pieces |\n");
	printf("|---|---|---|---|---|---|\n");
	for (i = 0; i < BENCH_NSIZES; i++) {
		const struct bench_row *r = &rows[i];

		if (!want[i])
			continue;
		printf("| %s | %.1f | %.1f | %.3f | %.1f | %.3f |\n", bench_sizes[i].name, r->peak,
		    r->chunked, r->chunked / r->peak, r->contig, r->contig / r->chunked);
	}
	printf("\n4096-token MLA FP8 restore (64 pages x 2.25 MB = %.1f MB, host-contiguous, "
	    "layer_first, checksums verified): %.2f ms submit..done; one pinned cudaMemcpy of the "
	    "same bytes: %.2f ms (%.3fx). No socket round trips in these figures.\n",
	    64.0 * 64 * 61 * 576 / 1e6, lat_restore, lat_copy, lat_copy / lat_restore);
	kernels_fini();
	return 0;
}
