/*
 * The cuda copy engine (kernels/engine.cu) checked byte for byte against
 * the host engine's own reference, copy_page_scatter() and
 * checksum_obj().
 *
 * Suite gpu (tag gpu: runs only where kernels_device_count() finds a
 * GPU): restores of several geometries (MLA layer_first, page_first and
 * per-layer buffers; MHA K and V as two regions; geometries that allow
 * only 8-, 4- or 1-byte accesses) from objects placed in runs and
 * scattered in a registered arena, by DMA, by the zero-copy gather and
 * by the automatic choice; a corrupt object reported and its page left
 * as it was; the GPU checksum equal to checksum_obj for 1 B .. 9 MiB at
 * any alignment; publish and back; cancel; the notify eventfd; input
 * rejected before anything moves; restores while a busy kernel holds the
 * GPU; memory opened from a second process (legacy IPC with an IPC
 * event, and cuMem POSIX fds). CUDA does not survive fork(), and check
 * forks every test: each test does its own CUDA set-up, and the tests
 * with a second process fork it before touching CUDA at all.
 *
 * Suite gpu_host (no tag, runs everywhere, CI included): the XXH3 code
 * the kernels run (kernels/xxh3.h), compiled as host code here, equal to
 * libxxhash for every length to 4 KiB and around every path boundary,
 * the warp decomposition's host model too; the chunked checksum equal to
 * checksum_obj; kernels_init failing cleanly where there is no GPU.
 *
 * Every run draws new random bytes (never zeros); a failure prints the
 * seed, and L3KV_SEED=N repeats a run.
 */
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "daemon.h"
#include "kernels.h"
#include "kernels_uuid.h"
#include "l3kv.h"
#include "tests.h"
#include "xxh3.h"

#define GPU_MIB		(1ULL << 20)
#define GPU_MAX_LAYERS	128

static unsigned long long	gpu_seed;
static uint64_t			gpu_rng;

/* check's ck_assert_* cost a system call per success: these check quietly. */
#define CHECK(e, ...) do {						\
	if (!(e)) {							\
		char _m[512];						\
		snprintf(_m, sizeof(_m), __VA_ARGS__);			\
		ck_abort_msg("%s (seed %llu)", _m, gpu_seed);		\
	}								\
} while (0)
#define EQ(a, b) do {							\
	long long _a = (long long)(a), _b = (long long)(b);		\
	CHECK(_a == _b, "%s == %s: %lld != %lld", #a, #b, _a, _b);	\
} while (0)

static void
gpu_rnd_init(void)
{
	const char	*s = getenv("L3KV_SEED");
	struct timespec	 ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	gpu_seed = s != NULL ? strtoull(s, NULL, 0) :
	    (unsigned long long)ts.tv_nsec ^ (unsigned long long)ts.tv_sec << 20 ^
	    (unsigned long long)getpid() << 40;
	gpu_rng = gpu_seed * 0x9e3779b97f4a7c15ULL + 1;
}

static uint64_t
gpu_rnd(void)
{
	gpu_rng ^= gpu_rng >> 12;
	gpu_rng ^= gpu_rng << 25;
	gpu_rng ^= gpu_rng >> 27;
	return gpu_rng * 0x2545F4914F6CDD1DULL;
}

static void
gpu_rnd_fill(void *buf, size_t n)
{
	uint8_t		*p = buf;
	uint64_t	 v;

	for (; n >= 8; n -= 8, p += 8) {
		v = gpu_rnd();
		memcpy(p, &v, 8);
	}
	for (v = gpu_rnd(); n > 0; n--, v >>= 8)
		*p++ = (uint8_t)v;
}

static void
gpu_cuda_init(void)
{
	char	err[256] = "";
	int	rc;

	rc = kernels_init(0, err, sizeof(err));
	CHECK(rc == 0, "kernels_init: %d %s", rc, err);
}

static void
gpu_init(void)
{
	gpu_rnd_init();
	gpu_cuda_init();
}

static struct kernels_engine *
gpu_engine(size_t slot_bytes, unsigned slots, unsigned streams, int notify_fd)
{
	struct kernels_engine	*e = NULL;
	struct kernels_conf	 c;
	char			 err[256] = "";
	int			 rc;

	kernels_conf_default(&c);
	if (slot_bytes != 0)
		c.slot_bytes = slot_bytes;
	if (slots != 0)
		c.slots = slots;
	if (streams != 0)
		c.streams = streams;
	c.notify_fd = notify_fd;
	rc = kernels_engine_new(&c, &e, err, sizeof(err));
	CHECK(rc == 0, "kernels_engine_new: %d %s", rc, err);
	return e;
}

static void *
gpu_dev(size_t n)
{
	void	*d = NULL;
	char	 err[256] = "";
	int	 rc;

	rc = kernels_dev_alloc(n, &d, err, sizeof(err));
	CHECK(rc == 0, "kernels_dev_alloc(%zu): %d %s", n, rc, err);
	return d;
}

static void
gpu_copy(void *dst, const void *src, size_t n)
{
	char	err[256] = "";
	int	rc;

	rc = kernels_copy(dst, src, n, err, sizeof(err));
	CHECK(rc == 0, "kernels_copy(%zu): %d %s", n, rc, err);
}

/* Host memory, random, whole pages; registered with CUDA when reg. */
static uint8_t *
gpu_host(size_t n, int reg)
{
	uint8_t	*p;
	char	 err[256] = "";
	int	 rc;

	n = (n + 4095) & ~(size_t)4095;
	p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED, "mmap %zu: %s", n, strerror(errno));
	gpu_rnd_fill(p, n);
	if (reg) {
		rc = kernels_host_register(p, n, err, sizeof(err));
		CHECK(rc == 0, "kernels_host_register: %d %s", rc, err);
	}
	return p;
}

static void
gpu_host_free(uint8_t *p, size_t n, int reg)
{
	char	err[256] = "";

	if (reg)
		EQ(kernels_host_unregister(p, err, sizeof(err)), 0);
	munmap(p, (n + 4095) & ~(size_t)4095);
}

/* The first differing byte of two buffers, or -1. */
static long long
gpu_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
	size_t	i;

	if (memcmp(a, b, n) == 0)
		return -1;
	for (i = 0; i < n && a[i] == b[i]; i++)
		;
	return (long long)i;
}

/*
 * A test destination: device memory in one of three layouts, a host
 * mirror of what it must hold (random at first: the sentinel), and the
 * same geometry as a proto_region for copy_page_scatter().
 */
enum { GPU_LAYER_FIRST, GPU_PAGE_FIRST, GPU_LAYER_TABLE };

struct gpu_reg {
	int			 layout;
	struct kernels_geom	 g;
	struct proto_region	 pr;
	struct kernels_region	*kr;
	size_t			 bytes;		/* of each allocation */
	unsigned		 nalloc;	/* 1, or layers with a layer table */
	void			*dev[GPU_MAX_LAYERS];
	uint8_t			*mirror[GPU_MAX_LAYERS];
	uint64_t		 obj;
};

/* Fills the geometry of r (not its memory) for a layout and padding. */
static void
gpu_reg_geom(struct gpu_reg *r, int layout, uint32_t pages, uint32_t tokens, uint32_t layers,
    uint32_t tbytes, uint64_t pad)
{
	struct kernels_geom	*g = &r->g;

	memset(r, 0, sizeof(*r));
	CHECK(layers <= GPU_MAX_LAYERS, "too many layers");
	r->layout = layout;
	r->obj = (uint64_t)tokens * layers * tbytes;
	g->num_pages = pages;
	g->page_tokens = tokens;
	g->layers = layers;
	g->token_bytes = tbytes;
	switch (layout) {
	case GPU_LAYER_FIRST:
		g->token_stride = tbytes;
		g->page_stride = (uint64_t)tokens * tbytes + pad;
		g->layer_stride = pages * g->page_stride + pad;
		r->bytes = layers * g->layer_stride;
		r->nalloc = 1;
		break;
	case GPU_PAGE_FIRST:
		g->token_stride = (uint64_t)layers * tbytes;
		g->layer_stride = tbytes;
		g->page_stride = r->obj + pad;
		r->bytes = pages * g->page_stride;
		r->nalloc = 1;
		break;
	default:
		g->token_stride = tbytes;
		g->page_stride = (uint64_t)tokens * tbytes + pad;
		r->bytes = pages * g->page_stride;
		r->nalloc = layers;
		g->layer_size = r->bytes;
		break;
	}
	g->size = r->bytes;
	r->pr.layout = layout == GPU_PAGE_FIRST ? PROTO_LAYOUT_PAGE_FIRST : PROTO_LAYOUT_LAYER_FIRST;
	r->pr.num_pages = pages;
	r->pr.page_tokens = tokens;
	r->pr.layers = layers;
	r->pr.token_bytes = tbytes;
	r->pr.page_stride = g->page_stride;
	r->pr.layer_stride = g->layer_stride;
	r->pr.token_stride = g->token_stride;
	r->pr.size = r->bytes;
}

/* Device memory for the geometry (or dev, given), its random sentinel, the kernels region. */
static void
gpu_reg_make(struct gpu_reg *r, struct kernels_engine *e, void *dev)
{
	char		err[256] = "";
	unsigned	i;
	int		rc;

	for (i = 0; i < r->nalloc; i++) {
		r->dev[i] = dev != NULL ? dev : gpu_dev(r->bytes);
		r->mirror[i] = malloc(r->bytes);
		CHECK(r->mirror[i] != NULL, "malloc %zu", r->bytes);
		gpu_rnd_fill(r->mirror[i], r->bytes);
		gpu_copy(r->dev[i], r->mirror[i], r->bytes);
	}
	r->g.base = r->dev[0];
	if (r->layout == GPU_LAYER_TABLE)
		r->g.layer_bases = r->dev;
	rc = kernels_region_new(e, &r->g, &r->kr, err, sizeof(err));
	CHECK(rc == 0, "kernels_region_new: %d %s", rc, err);
	EQ(kernels_region_obj_bytes(r->kr), r->obj);
}

static void
gpu_reg_free(struct gpu_reg *r, int own_dev)
{
	unsigned	i;

	kernels_region_free(r->kr);
	for (i = 0; i < r->nalloc; i++) {
		if (own_dev)
			kernels_dev_free(r->dev[i]);
		free(r->mirror[i]);
	}
}

/* What a page's bytes must become: the host engine's scatter, into the mirror. */
static void
gpu_reg_apply(struct gpu_reg *r, uint32_t page, uint8_t *obj, int to_region)
{
	const struct kernels_geom	*g = &r->g;
	uint32_t			 t, l;

	if (r->layout != GPU_LAYER_TABLE) {
		copy_page_scatter(&r->pr, r->mirror[0], page, obj, to_region);
		return;
	}
	for (t = 0; t < g->page_tokens; t++) {
		for (l = 0; l < g->layers; l++) {
			uint8_t *d = r->mirror[l] + page * g->page_stride + t * g->token_stride;
			uint8_t *o = obj + ((uint64_t)t * g->layers + l) * g->token_bytes;

			if (to_region)
				memcpy(d, o, g->token_bytes);
			else
				memcpy(o, d, g->token_bytes);
		}
	}
}

/* The device memory equals the mirror, every byte. */
static void
gpu_reg_compare(struct gpu_reg *r, const char *what)
{
	uint8_t		*back = malloc(r->bytes);
	long long	 d;
	unsigned	 i;

	CHECK(back != NULL, "malloc");
	for (i = 0; i < r->nalloc; i++) {
		gpu_copy(back, r->dev[i], r->bytes);
		d = gpu_diff(back, r->mirror[i], r->bytes);
		CHECK(d < 0, "%s: allocation %u differs at byte %lld of %zu: %02x, want %02x", what, i,
		    d, r->bytes, d < 0 ? 0 : back[d], d < 0 ? 0 : r->mirror[i][d]);
	}
	free(back);
}

/* n distinct random page indices below npages. */
static void
gpu_pick_pages(uint32_t *out, uint32_t n, uint32_t npages)
{
	uint32_t	*all = malloc(npages * sizeof(*all)), i, j, t;

	CHECK(all != NULL && n <= npages, "pick %u of %u", n, npages);
	for (i = 0; i < npages; i++)
		all[i] = i;
	for (i = 0; i < n; i++) {
		j = i + (uint32_t)(gpu_rnd() % (npages - i));
		t = all[i];
		all[i] = all[j];
		all[j] = t;
		out[i] = all[i];
	}
	free(all);
}

enum { GPU_MIXED, GPU_CONTIG, GPU_SCATTERED };

/*
 * Places n objects of obj bytes in an arena of 2n + 1 slots (plus shift,
 * to misalign them): contiguous runs, scattered objects, or a mix.
 */
static void
gpu_place(uint8_t **objs, uint32_t n, uint64_t obj, uint8_t *arena, int how, size_t shift)
{
	uint32_t	 nslots = 2 * n + 1, i, s, cur = 0;
	uint8_t		*used = calloc(nslots, 1);

	CHECK(used != NULL, "calloc");
	for (i = 0; i < n; i++) {
		if (how == GPU_CONTIG)
			s = i;
		else if (i > 0 && how == GPU_MIXED && gpu_rnd() % 3 != 0 && cur + 1 < nslots &&
		    !used[cur + 1])
			s = cur + 1;
		else
			do
				s = (uint32_t)(gpu_rnd() % nslots);
			while (used[s]);
		used[s] = 1;
		cur = s;
		objs[i] = arena + shift + (uint64_t)s * obj;
	}
	free(used);
}

static size_t
gpu_arena_bytes(uint32_t n, uint64_t obj)
{
	return (size_t)(2 * n + 1) * obj + 64;
}

/*
 * n objects of r's size placed `how` in a new pinned arena (*alen bytes,
 * for gpu_host_free), and pg[0..n) restoring them with their checksums
 * into n distinct random pages of r (region 0). Returns the arena.
 */
static uint8_t *
gpu_case(const struct gpu_reg *r, uint32_t n, int how, uint8_t **objs, struct kernels_page *pg,
    size_t *alen)
{
	uint32_t	*pages = calloc(n, sizeof(*pages)), i;
	uint8_t		*arena;

	CHECK(pages != NULL, "calloc");
	*alen = gpu_arena_bytes(n, r->obj);
	arena = gpu_host(*alen, 1);
	gpu_place(objs, n, r->obj, arena, how, 0);
	gpu_pick_pages(pages, n, r->g.num_pages);
	for (i = 0; i < n; i++) {
		memset(&pg[i], 0, sizeof(pg[i]));
		pg[i].host = objs[i];
		pg[i].checksum = checksum_obj(objs[i], r->obj);
		pg[i].page = pages[i];
	}
	free(pages);
	return arena;
}

/* Submits, waits, and checks the op's status; returns the result. */
static void
gpu_run(struct kernels_engine *e, int publish, struct kernels_region *const *regs,
    unsigned nregs, const struct kernels_page *pg, uint32_t n, const struct kernels_event *wait,
    unsigned flags, int want, struct kernels_result *res, uint8_t *pstat, uint64_t *csums)
{
	struct kernels_op	*op = NULL;
	char			 err[256] = "";
	int			 rc;

	rc = (publish ? kernels_publish_submit : kernels_restore_submit)(e, regs, nregs, pg, n,
	    wait, flags, &op, err, sizeof(err));
	CHECK(rc == 0, "%s submit: %d %s", publish ? "publish" : "restore", rc, err);
	rc = kernels_op_wait(op);
	EQ(kernels_op_poll(op), 1);
	EQ(kernels_op_result(op, res, pstat, csums), 0);
	CHECK(rc == want && res->status == want, "%s flags %#x: status %d (%s), want %d",
	    publish ? "publish" : "restore", flags, rc, res->err, want);
	EQ(res->pages, n);
	kernels_op_free(op);
}

/*
 * Restores n objects placed `how` into random pages of the regions
 * (object i goes to region i % nregs), with flags, and compares every
 * byte of every region with the host engine's result.
 */
static void
gpu_restore_case(struct kernels_engine *e, struct gpu_reg *regs, unsigned nregs, uint32_t n,
    int how, size_t shift, unsigned flags)
{
	struct kernels_region	*kr[KERNELS_REGIONS_MAX];
	struct kernels_page	*pg = calloc(n, sizeof(*pg));
	struct kernels_result	 res;
	uint8_t			**objs = calloc(n, sizeof(*objs)), *arena, *st = calloc(n, 1);
	uint32_t		*pages[KERNELS_REGIONS_MAX], per = (n + nregs - 1) / nregs, i;
	uint64_t		 obj = regs[0].obj;
	size_t			 alen = gpu_arena_bytes(n, obj);
	unsigned		 r;
	char			 what[128];

	CHECK(pg != NULL && objs != NULL && st != NULL, "calloc");
	for (r = 1; r < nregs; r++)
		EQ(regs[r].obj, obj);
	arena = gpu_host(alen, 1);
	gpu_place(objs, n, obj, arena, how, shift);
	for (r = 0; r < nregs; r++) {
		kr[r] = regs[r].kr;
		pages[r] = calloc(per, sizeof(uint32_t));
		CHECK(pages[r] != NULL, "calloc");
		gpu_pick_pages(pages[r], per, regs[r].g.num_pages);
	}
	for (i = 0; i < n; i++) {
		pg[i].host = objs[i];
		pg[i].checksum = checksum_obj(objs[i], obj);
		pg[i].region = i % nregs;
		pg[i].page = pages[i % nregs][i / nregs];
	}
	gpu_run(e, 0, kr, nregs, pg, n, NULL, flags, 0, &res, st, NULL);
	EQ(res.launched, n);
	EQ(res.done, n);
	EQ(res.nbad, 0);
	for (i = 0; i < n; i++) {
		EQ(st[i], KERNELS_PAGE_DONE);
		gpu_reg_apply(&regs[pg[i].region], pg[i].page, objs[i], 1);
	}
	for (r = 0; r < nregs; r++) {
		snprintf(what, sizeof(what), "region %u, objects %s, shift %zu, flags %#x", r,
		    how == GPU_CONTIG ? "contiguous" : how == GPU_SCATTERED ? "scattered" : "mixed",
		    shift, flags);
		gpu_reg_compare(&regs[r], what);
		free(pages[r]);
	}
	gpu_host_free(arena, alen, 1);
	free(pg);
	free(objs);
	free(st);
}

START_TEST(test_gpu_restore_mla_layer_first)
{
	struct kernels_engine	*e;
	struct gpu_reg		 r;

	gpu_init();
	/* 5 MiB slots: two 2.25 MB objects a chunk, many more chunks than slots */
	e = gpu_engine(5 * GPU_MIB, 0, 0, -1);
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 40, 64, 61, 576, 0);
	gpu_reg_make(&r, e, NULL);
	gpu_restore_case(e, &r, 1, 24, GPU_MIXED, 0, 0);
	gpu_restore_case(e, &r, 1, 12, GPU_SCATTERED, 0, KERNELS_F_ZEROCOPY);
	gpu_reg_free(&r, 1);
	kernels_engine_free(e);
	/* the default engine: a 32 MiB slot takes 14 objects */
	e = gpu_engine(0, 0, 0, -1);
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 40, 64, 61, 576, 0);
	gpu_reg_make(&r, e, NULL);
	gpu_restore_case(e, &r, 1, 32, GPU_MIXED, 0, 0);
	gpu_reg_free(&r, 1);
	kernels_engine_free(e);
}
END_TEST

START_TEST(test_gpu_restore_mla_page_first)
{
	struct kernels_engine	*e;
	struct gpu_reg		 r;

	gpu_init();
	e = gpu_engine(0, 3, 3, -1);
	gpu_reg_geom(&r, GPU_PAGE_FIRST, 32, 64, 61, 576, 0);
	gpu_reg_make(&r, e, NULL);
	gpu_restore_case(e, &r, 1, 24, GPU_CONTIG, 0, 0);
	gpu_restore_case(e, &r, 1, 8, GPU_SCATTERED, 0, KERNELS_F_DMA);
	gpu_reg_free(&r, 1);
	kernels_engine_free(e);
}
END_TEST

START_TEST(test_gpu_restore_per_layer_buffers)
{
	struct kernels_engine	*e;
	struct gpu_reg		 r;

	gpu_init();
	e = gpu_engine(0, 0, 0, -1);
	/* 61 separate per-layer buffers, SGLang's layer_first device pool; padded pages */
	gpu_reg_geom(&r, GPU_LAYER_TABLE, 24, 64, 61, 576, 256);
	gpu_reg_make(&r, e, NULL);
	gpu_restore_case(e, &r, 1, 16, GPU_MIXED, 0, 0);
	gpu_reg_free(&r, 1);
	kernels_engine_free(e);
}
END_TEST

START_TEST(test_gpu_restore_mha_k_and_v)
{
	static const unsigned	 flags[] = { 0, KERNELS_F_DMA, KERNELS_F_ZEROCOPY };
	struct kernels_engine	*e;
	struct gpu_reg		 kv[2];
	unsigned		 f;

	gpu_init();
	e = gpu_engine(256 << 10, 0, 0, -1);
	for (f = 0; f < 3; f++) {
		/* 16 tokens x 4 layers x 256 bytes (2 heads of 128 FP8): 16 KiB objects */
		gpu_reg_geom(&kv[0], GPU_LAYER_FIRST, 96, 16, 4, 256, 0);
		gpu_reg_geom(&kv[1], GPU_LAYER_FIRST, 96, 16, 4, 256, 0);
		gpu_reg_make(&kv[0], e, NULL);
		gpu_reg_make(&kv[1], e, NULL);
		gpu_restore_case(e, kv, 2, 128, GPU_MIXED, 0, flags[f]);
		gpu_reg_free(&kv[0], 1);
		gpu_reg_free(&kv[1], 1);
	}
	kernels_engine_free(e);
}
END_TEST

START_TEST(test_gpu_restore_narrow_geometries)
{
	static const unsigned	 flags[] = { 0, KERNELS_F_DMA, KERNELS_F_ZEROCOPY };
	static const struct {
		int		layout;
		uint32_t	tokens, layers, tbytes;
		uint64_t	pad;
		size_t		shift;
	} cases[] = {
		{ GPU_LAYER_FIRST, 8, 5, 36, 4, 0 },	/* 4-byte accesses */
		{ GPU_PAGE_FIRST, 16, 3, 24, 8, 8 },	/* 8-byte */
		{ GPU_PAGE_FIRST, 16, 3, 7, 3, 1 },	/* bytes; objects at odd addresses */
		{ GPU_LAYER_FIRST, 9, 2, 7, 1, 3 },
		{ GPU_LAYER_TABLE, 4, 3, 20, 12, 4 },
		/* a 100-byte last checksum unit (the scalar path), 24-byte digest input */
		{ GPU_PAGE_FIRST, 1, 1, 65636, 0, 4 },
	};
	struct kernels_engine	*e;
	struct gpu_reg		 r;
	unsigned		 c, f;

	gpu_init();
	e = gpu_engine(256 << 10, 0, 0, -1);
	for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (f = 0; f < 3; f++) {
			gpu_reg_geom(&r, cases[c].layout, 48, cases[c].tokens, cases[c].layers,
			    cases[c].tbytes, cases[c].pad);
			gpu_reg_make(&r, e, NULL);
			gpu_restore_case(e, &r, 1, 20, GPU_CONTIG, cases[c].shift, flags[f]);
			gpu_restore_case(e, &r, 1, 20, GPU_MIXED, cases[c].shift, flags[f]);
			gpu_reg_free(&r, 1);
		}
	}
	kernels_engine_free(e);
}
END_TEST

START_TEST(test_gpu_corrupt_object_reported_and_not_written)
{
	struct kernels_engine	*e;
	struct kernels_region	*kr;
	struct kernels_result	 res;
	struct kernels_page	 pg[12];
	struct gpu_reg		 r;
	uint8_t			*objs[12], *arena, st[12];
	uint32_t		 bad[2], i;
	uint64_t		 cs[12];
	size_t			 alen;

	gpu_init();
	e = gpu_engine(2 * GPU_MIB, 0, 0, -1);
	/* 64 tokens x 4 layers x 576: 144 KiB objects, three checksum units */
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 16, 64, 4, 576, 0);
	gpu_reg_make(&r, e, NULL);
	kr = r.kr;
	arena = gpu_case(&r, 12, GPU_MIXED, objs, pg, &alen);
	/* a flipped byte after the checksum was taken, in two objects */
	bad[0] = 3 + (uint32_t)(gpu_rnd() % 3);
	bad[1] = 9 + (uint32_t)(gpu_rnd() % 3);
	objs[bad[0]][gpu_rnd() % r.obj] ^= 0x5a;
	objs[bad[1]][r.obj - 1] ^= 0x01;	/* the last byte of the last unit */
	gpu_run(e, 0, &kr, 1, pg, 12, NULL, 0, -EBADMSG, &res, st, cs);
	EQ(res.nbad, 2);
	EQ(res.first_bad, bad[0]);
	EQ(res.done, 10);
	EQ(res.launched, 12);
	for (i = 0; i < 12; i++) {
		if (i == bad[0] || i == bad[1]) {
			EQ(st[i], KERNELS_PAGE_BAD);
			EQ(cs[i], checksum_obj(objs[i], r.obj));	/* what the GPU saw */
			continue;	/* the mirror keeps the sentinel */
		}
		EQ(st[i], KERNELS_PAGE_DONE);
		EQ(cs[i], pg[i].checksum);
		gpu_reg_apply(&r, pg[i].page, objs[i], 1);
	}
	gpu_reg_compare(&r, "corrupt objects left out");
	gpu_host_free(arena, alen, 1);
	gpu_reg_free(&r, 1);
	kernels_engine_free(e);
}
END_TEST

START_TEST(test_gpu_checksum_kernel_equals_checksum_obj)
{
	static const size_t	 lens[] = { 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64,
	    65, 96, 97, 127, 128, 129, 200, 239, 240, 241, 255, 256, 257, 511, 1023, 1024, 1025,
	    1087, 1088, 2047, 2048, 2049, 4096, 65535, 65536, 65537, 65536 + 240, 65536 + 241,
	    131071, 131072, 131073, 2248704, 9 * GPU_MIB - 1, 9 * GPU_MIB };
	size_t			 max = 9 * GPU_MIB + 64, len, off;
	uint8_t			*h;
	void			*d;
	uint64_t		 got;
	unsigned		 i, k;
	char			 err[256] = "";
	int			 rc;

	gpu_init();
	h = malloc(max);
	CHECK(h != NULL, "malloc");
	gpu_rnd_fill(h, max);
	d = gpu_dev(max);
	gpu_copy(d, h, max);
	for (i = 0; i < sizeof(lens) / sizeof(lens[0]) + 24; i++) {
		len = i < sizeof(lens) / sizeof(lens[0]) ? lens[i] : 1 + gpu_rnd() % (9 * GPU_MIB);
		for (k = 0; k < 3; k++) {
			/* aligned, 8-aligned, and anywhere */
			off = k == 0 ? 0 : k == 1 ? 8 : 1 + gpu_rnd() % 15;
			rc = kernels_checksum_device((uint8_t *)d + off, len, &got, err, sizeof(err));
			CHECK(rc == 0, "kernels_checksum_device: %d %s", rc, err);
			CHECK(got == checksum_obj(h + off, len),
			    "checksum of %zu bytes at +%zu: %016llx, want %016llx", len, off,
			    (unsigned long long)got, (unsigned long long)checksum_obj(h + off, len));
		}
	}
	kernels_dev_free(d);
	free(h);
}
END_TEST

/* Publishes n pages of a random region into host objects, checks them, and restores them back. */
static void
gpu_publish_case(struct kernels_engine *e, int layout, uint32_t tokens, uint32_t layers,
    uint32_t tbytes, uint32_t n, unsigned flags)
{
	struct kernels_region	*kr;
	struct kernels_result	 res;
	struct kernels_page	*pg = calloc(n, sizeof(*pg));
	struct gpu_reg		 src, dst;
	uint8_t			**objs = calloc(n, sizeof(*objs)), *arena, *want, *st = calloc(n, 1);
	uint64_t		*cs = calloc(n, sizeof(*cs));
	uint32_t		*pages = calloc(n, sizeof(*pages)), i;
	size_t			 alen;
	long long		 d;

	CHECK(pg != NULL && objs != NULL && st != NULL && cs != NULL && pages != NULL, "calloc");
	gpu_reg_geom(&src, layout, n + 8, tokens, layers, tbytes, 0);
	gpu_reg_make(&src, e, NULL);
	alen = gpu_arena_bytes(n, src.obj);
	arena = gpu_host(alen, 1);
	want = malloc(alen);
	CHECK(want != NULL, "malloc");
	memcpy(want, arena, alen);
	gpu_place(objs, n, src.obj, arena, GPU_MIXED, 0);
	gpu_pick_pages(pages, n, src.g.num_pages);
	for (i = 0; i < n; i++) {
		pg[i].host = objs[i];
		pg[i].page = pages[i];
		pg[i].region = 0;
		gpu_reg_apply(&src, pages[i], want + (objs[i] - arena), 0);
	}
	kr = src.kr;
	gpu_run(e, 1, &kr, 1, pg, n, NULL, flags, 0, &res, st, cs);
	EQ(res.done, n);
	d = gpu_diff(arena, want, alen);
	CHECK(d < 0, "published arena (flags %#x) differs at byte %lld", flags, d);
	for (i = 0; i < n; i++) {
		EQ(st[i], KERNELS_PAGE_DONE);
		CHECK(cs[i] == checksum_obj(objs[i], src.obj), "page %u: GPU checksum %016llx",
		    i, (unsigned long long)cs[i]);
		pg[i].checksum = cs[i];
	}
	/* and back, into other pages of another region */
	gpu_reg_geom(&dst, layout, n + 8, tokens, layers, tbytes, 0);
	gpu_reg_make(&dst, e, NULL);
	gpu_pick_pages(pages, n, dst.g.num_pages);
	for (i = 0; i < n; i++) {
		pg[i].page = pages[i];
		gpu_reg_apply(&dst, pages[i], objs[i], 1);
	}
	kr = dst.kr;
	gpu_run(e, 0, &kr, 1, pg, n, NULL, flags, 0, &res, st, NULL);
	gpu_reg_compare(&dst, "published and restored");
	gpu_reg_compare(&src, "publish source untouched");
	gpu_reg_free(&dst, 1);
	gpu_reg_free(&src, 1);
	gpu_host_free(arena, alen, 1);
	free(want);
	free(pg);
	free(objs);
	free(st);
	free(cs);
	free(pages);
}

START_TEST(test_gpu_publish_round_trip)
{
	struct kernels_engine	*e;

	gpu_init();
	e = gpu_engine(5 * GPU_MIB, 0, 0, -1);
	gpu_publish_case(e, GPU_LAYER_FIRST, 64, 61, 576, 16, 0);
	gpu_publish_case(e, GPU_PAGE_FIRST, 64, 61, 576, 6, KERNELS_F_ZEROCOPY);
	gpu_publish_case(e, GPU_LAYER_TABLE, 16, 4, 256, 40, 0);
	gpu_publish_case(e, GPU_LAYER_FIRST, 16, 4, 256, 40, KERNELS_F_DMA);
	gpu_publish_case(e, GPU_PAGE_FIRST, 9, 2, 7, 40, 0);
	kernels_engine_free(e);
}
END_TEST

START_TEST(test_gpu_cancel_leaves_later_pages_untouched)
{
	struct kernels_engine	*e;
	struct kernels_region	*kr;
	struct kernels_result	 res;
	struct kernels_op	*op = NULL;
	struct kernels_page	*pg;
	struct gpu_reg		 r;
	uint8_t			*objs[64], *arena, st[64];
	uint32_t		 i, n = 64;
	size_t			 alen;
	char			 err[256] = "";
	int			 rc;

	gpu_init();
	/* two slots of two 2.25 MB objects: the first four pages are issued at submit */
	e = gpu_engine(5 * GPU_MIB, 2, 2, -1);
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 80, 64, 61, 576, 0);
	gpu_reg_make(&r, e, NULL);
	kr = r.kr;
	pg = calloc(n, sizeof(*pg));
	CHECK(pg != NULL, "calloc");
	arena = gpu_case(&r, n, GPU_MIXED, objs, pg, &alen);
	rc = kernels_restore_submit(e, &kr, 1, pg, n, NULL, 0, &op, err, sizeof(err));
	CHECK(rc == 0, "submit: %d %s", rc, err);
	kernels_op_cancel(op);
	/* done means: every issued chunk completed; nothing of the op can land any more */
	rc = kernels_op_wait(op);
	EQ(rc, -ECANCELED);
	EQ(kernels_op_result(op, &res, st, NULL), 0);
	EQ(res.status, -ECANCELED);
	EQ(res.launched, 4);
	EQ(res.done, 4);
	kernels_op_free(op);
	for (i = 0; i < n; i++) {
		EQ(st[i], i < res.launched ? KERNELS_PAGE_DONE : KERNELS_PAGE_SKIPPED);
		if (i < res.launched)
			gpu_reg_apply(&r, pg[i].page, objs[i], 1);
	}
	gpu_reg_compare(&r, "cancelled restore");
	/* the engine is still usable, and an op freed in flight is waited for */
	rc = kernels_restore_submit(e, &kr, 1, pg + res.launched, 8, NULL, 0, &op, err,
	    sizeof(err));
	CHECK(rc == 0, "submit: %d %s", rc, err);
	kernels_op_free(op);
	gpu_reg_free(&r, 1);
	gpu_host_free(arena, alen, 1);
	free(pg);
	kernels_engine_free(e);
}
END_TEST

/*
 * A restore given an event that has not completed is gated: staged, not
 * written, until the event completes, with no stream waiting on it.
 * Round 0 cancels it behind the gate: nothing of it lands, even once the
 * event completes. Round 1 lets it through: it lands after the late
 * kernel's writes. An event already complete gates nothing.
 */
START_TEST(test_gpu_gated_restore_waits_for_its_event_or_drops_at_cancel)
{
	struct kernels_engine	*e;
	struct kernels_event	*ev = NULL;
	struct kernels_region	*kr;
	struct kernels_result	 res;
	struct kernels_op	*op = NULL;
	struct kernels_page	 pg[8];
	struct gpu_reg		 r;
	uint8_t			*objs[8], *arena, st[8];
	uint32_t		 i, n = 8, round;
	size_t			 alen;
	char			 err[256] = "";
	int			 rc, polls;

	gpu_init();
	/* 5 MiB slots of two objects: 4 chunks, more than a gated op may stage */
	e = gpu_engine(5 * GPU_MIB, 4, 2, -1);
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 16, 64, 61, 576, 0);
	gpu_reg_make(&r, e, NULL);
	kr = r.kr;
	arena = gpu_case(&r, n, GPU_CONTIG, objs, pg, &alen);
	rc = kernels_event_new(0, &ev, err, sizeof(err));
	CHECK(rc == 0, "kernels_event_new: %d %s", rc, err);
	for (round = 0; round < 2; round++) {
		/* the whole region turns 0xee 300 ms from now; the event marks that */
		rc = kernels_late_fill(r.dev[0], r.bytes, r.bytes, 1, 0xee, 300, err, sizeof(err));
		CHECK(rc == 0, "kernels_late_fill: %d %s", rc, err);
		rc = kernels_event_record(ev, err, sizeof(err));
		CHECK(rc == 0, "kernels_event_record: %d %s", rc, err);
		memset(r.mirror[0], 0xee, r.bytes);
		rc = kernels_restore_submit(e, &kr, 1, pg, n, ev, 0, &op, err, sizeof(err));
		CHECK(rc == 0, "submit: %d %s", rc, err);
		EQ(kernels_engine_gated(e), 1);
		for (polls = 0; polls < 20; polls++) {
			EQ(kernels_op_poll(op), 0);
			usleep(2000);
		}
		if (round == 0) {
			kernels_op_cancel(op);
			EQ(kernels_op_wait(op), -ECANCELED);
			EQ(kernels_op_result(op, &res, st, NULL), 0);
			EQ(res.launched, 0);
			EQ(res.done, 0);
			for (i = 0; i < n; i++)
				EQ(st[i], KERNELS_PAGE_SKIPPED);
		} else {
			EQ(kernels_op_wait(op), 0);
			EQ(kernels_op_result(op, &res, st, NULL), 0);
			EQ(res.launched, n);
			EQ(res.done, n);
			for (i = 0; i < n; i++)
				gpu_reg_apply(&r, pg[i].page, objs[i], 1);
		}
		EQ(kernels_engine_gated(e), 0);
		kernels_op_free(op);
		/* read back on the default stream: after the late kernel */
		gpu_reg_compare(&r, round == 0 ? "a gated restore cancelled" :
		    "a gated restore after its event");
	}
	/* the event has completed: the next restore is not gated */
	rc = kernels_restore_submit(e, &kr, 1, pg, n, ev, 0, &op, err, sizeof(err));
	CHECK(rc == 0, "submit: %d %s", rc, err);
	EQ(kernels_engine_gated(e), 0);
	EQ(kernels_op_wait(op), 0);
	kernels_op_free(op);
	kernels_event_free(ev);
	gpu_reg_free(&r, 1);
	gpu_host_free(arena, alen, 1);
	kernels_engine_free(e);
}
END_TEST

/*
 * The daemon's loop against the engine: sleep on the eventfd, then
 * progress; 8 chunks in 2 slots. Written by a CUDA host function
 * (KERNELS_NOTIFY_CALLBACK) or the engine's waiter thread
 * (KERNELS_NOTIFY_THREAD, the default, which also writes it when the last
 * chunk's DMA ends: kernels_engine_tail then says kernels are left). With
 * the timeline, the op's times are in order on one clock.
 */
static void
gpu_notify_case(int mode, int timeline)
{
	struct kernels_engine	*e = NULL;
	struct kernels_op_times	 t;
	struct kernels_region	*kr;
	struct kernels_result	 res;
	struct kernels_conf	 c;
	struct kernels_op	*op = NULL;
	struct kernels_page	 pg[16];
	struct timespec		 ts;
	struct gpu_reg		 r;
	struct pollfd		 pfd;
	uint8_t			*objs[16], *arena;
	uint32_t		 i, wakeups = 0;
	uint64_t		 v, before, after;
	size_t			 alen;
	char			 err[256] = "";
	int			 efd, rc;

	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	CHECK(efd >= 0, "eventfd: %s", strerror(errno));
	kernels_conf_default(&c);
	c.slot_bytes = 5 * GPU_MIB;
	c.slots = 2;
	c.streams = 2;
	c.notify_fd = efd;
	c.notify = mode;
	c.timeline = timeline;
	rc = kernels_engine_new(&c, &e, err, sizeof(err));
	CHECK(rc == 0, "kernels_engine_new: %d %s", rc, err);
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 16, 64, 61, 576, 0);
	gpu_reg_make(&r, e, NULL);
	kr = r.kr;
	arena = gpu_case(&r, 16, GPU_SCATTERED, objs, pg, &alen);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	before = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
	rc = kernels_restore_submit(e, &kr, 1, pg, 16, NULL, 0, &op, err, sizeof(err));
	CHECK(rc == 0, "submit: %d %s", rc, err);
	EQ(kernels_op_times(op, &t), -EBUSY);
	for (;;) {
		pfd.fd = efd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		rc = poll(&pfd, 1, 10000);
		CHECK(rc == 1, "mode %d: the notify eventfd never turned readable (%u wakeups)",
		    mode, wakeups);
		CHECK(read(efd, &v, sizeof(v)) == sizeof(v), "eventfd read: %s", strerror(errno));
		wakeups++;
		CHECK(kernels_engine_progress(e) >= 0, "progress");
		/* woken at the last DMA's end: poll the few kernels left, as cuda.c does */
		while (!kernels_op_poll(op) && kernels_engine_tail(e) > 0)
			;
		if (kernels_op_poll(op))
			break;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	after = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
	EQ(kernels_engine_tail(e), 0);
	EQ(kernels_op_result(op, &res, NULL, NULL), 0);
	EQ(res.status, 0);
	EQ(res.done, 16);
	EQ(kernels_op_times(op, &t), 0);
	CHECK(before <= t.submit && t.submit <= t.first_issue && t.first_issue <= t.last_issue &&
	    t.last_issue <= t.done && t.done <= after, "mode %d: host times out of order: "
	    "submit %llu first %llu last %llu done %llu (window %llu..%llu)", mode,
	    (unsigned long long)t.submit, (unsigned long long)t.first_issue,
	    (unsigned long long)t.last_issue, (unsigned long long)t.done,
	    (unsigned long long)before, (unsigned long long)after);
	CHECK(t.notify > t.first_issue && t.notify <= after, "mode %d: notify %llu", mode,
	    (unsigned long long)t.notify);
	if (timeline) {
		/* GPU stamps, on the host clock within the calibration's few microseconds */
		CHECK(t.gpu_dma_start != 0 && t.gpu_dma_start < t.gpu_dma_end &&
		    t.gpu_dma_end <= t.gpu_verified && t.gpu_verified <= t.gpu_end,
		    "GPU stamps out of order: %llu %llu %llu %llu",
		    (unsigned long long)t.gpu_dma_start, (unsigned long long)t.gpu_dma_end,
		    (unsigned long long)t.gpu_verified, (unsigned long long)t.gpu_end);
		CHECK(t.gpu_dma_start + 100000 > t.first_issue && t.gpu_end < t.done + 100000,
		    "GPU stamps %llu..%llu outside the op's host time %llu..%llu",
		    (unsigned long long)t.gpu_dma_start, (unsigned long long)t.gpu_end,
		    (unsigned long long)t.first_issue, (unsigned long long)t.done);
	} else {
		EQ(t.gpu_dma_start, 0);
		EQ(t.gpu_end, 0);
	}
	kernels_op_free(op);
	for (i = 0; i < 16; i++)
		gpu_reg_apply(&r, pg[i].page, objs[i], 1);
	gpu_reg_compare(&r, "restore driven by the eventfd");
	gpu_reg_free(&r, 1);
	gpu_host_free(arena, alen, 1);
	kernels_engine_free(e);
	close(efd);
}

START_TEST(test_gpu_notify_eventfd_drives_completion)
{
	gpu_init();
	gpu_notify_case(KERNELS_NOTIFY_CALLBACK, 0);
	gpu_notify_case(KERNELS_NOTIFY_THREAD, 0);
	gpu_notify_case(KERNELS_NOTIFY_THREAD, 1);
}
END_TEST

/*
 * Issue 16: host runs by one cudaMemcpyBatchAsync a chunk (the default
 * for runs of 128 KiB and more), every run batched, short runs mixed
 * between the batch and the gather kernel, one copy stream and two (with
 * each form of the checksum kernel, KERNELS_CSUM_WARP and _CTA: each
 * restore verifies by it, each publish's checksums come from it);
 * restores and publishes byte for byte, objects of 36 KiB, 256 KiB and
 * 2.25 MB, contiguous, scattered and misaligned in the arena.
 */
START_TEST(test_gpu_batched_dma_restores_and_publishes)
{
	static const unsigned	 flags[3] = { 0, KERNELS_F_BATCH, KERNELS_F_MIX };
	struct kernels_engine	*e;
	struct kernels_conf	 c;
	struct gpu_reg		 r;
	char			 err[256] = "";
	unsigned		 cs, f;
	int			 rc;

	gpu_init();
	for (cs = 0; cs < 2; cs++) {
		kernels_conf_default(&c);
		c.slot_bytes = 5 * GPU_MIB;
		c.copy_streams = cs == 0 ? 1 : 2;
		/* both forms of the checksum kernel: each restore verifies by it */
		c.csum = cs == 0 ? KERNELS_CSUM_WARP : KERNELS_CSUM_CTA;
		e = NULL;
		rc = kernels_engine_new(&c, &e, err, sizeof(err));
		CHECK(rc == 0, "kernels_engine_new: %d %s", rc, err);
		for (f = 0; f < 3; f++) {
			gpu_reg_geom(&r, GPU_LAYER_FIRST, 200, 64, 1, 576, 0);	/* 36 KiB */
			gpu_reg_make(&r, e, NULL);
			gpu_restore_case(e, &r, 1, 150, GPU_SCATTERED, 0, flags[f]);
			gpu_restore_case(e, &r, 1, 150, GPU_MIXED, 8, flags[f]);
			gpu_reg_free(&r, 1);
			gpu_reg_geom(&r, GPU_LAYER_FIRST, 64, 64, 4, 1024, 0);	/* 256 KiB */
			gpu_reg_make(&r, e, NULL);
			gpu_restore_case(e, &r, 1, 40, GPU_SCATTERED, 0, flags[f]);
			gpu_restore_case(e, &r, 1, 40, GPU_MIXED, 24, flags[f]);
			gpu_reg_free(&r, 1);
			gpu_reg_geom(&r, GPU_LAYER_FIRST, 24, 64, 61, 576, 0);	/* 2.25 MB */
			gpu_reg_make(&r, e, NULL);
			gpu_restore_case(e, &r, 1, 12, GPU_SCATTERED, 0, flags[f]);
			gpu_restore_case(e, &r, 1, 12, GPU_CONTIG, 0, flags[f]);
			gpu_reg_free(&r, 1);
			gpu_publish_case(e, GPU_LAYER_FIRST, 64, 4, 1024, 30, flags[f]);
			gpu_publish_case(e, GPU_PAGE_FIRST, 64, 1, 576, 60, flags[f]);
			gpu_publish_case(e, GPU_LAYER_FIRST, 64, 61, 576, 6, flags[f]);
		}
		kernels_engine_free(e);
	}
}
END_TEST

START_TEST(test_gpu_submit_rejects_bad_input)
{
	struct kernels_engine	*e;
	struct kernels_region	*kr, *big = NULL, *none = NULL;
	struct kernels_op	*op = NULL;
	struct kernels_page	 pg[4];
	struct kernels_geom	 g;
	struct kernels_result	 res;
	struct gpu_reg		 r, rb;
	uint8_t			*arena, *loose;
	size_t			 alen;
	uint32_t		 i;
	char			 err[256];
	int			 rc;

	gpu_init();
	e = gpu_engine(GPU_MIB, 0, 0, -1);
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 8, 16, 4, 256, 0);	/* 16 KiB objects */
	gpu_reg_make(&r, e, NULL);
	kr = r.kr;
	alen = gpu_arena_bytes(4, r.obj);
	arena = gpu_host(alen, 1);
	loose = gpu_host(r.obj, 0);
	for (i = 0; i < 4; i++) {
		pg[i].host = arena + i * r.obj;
		pg[i].checksum = checksum_obj(pg[i].host, r.obj);
		pg[i].page = i;
		pg[i].region = 0;
	}
#define REJECT(want, needle, ...) do {					\
	err[0] = '\0';							\
	op = NULL;							\
	rc = kernels_restore_submit(__VA_ARGS__, &op, err, sizeof(err));	\
	CHECK(rc == (want) && op == NULL && strstr(err, needle) != NULL,	\
	    "line %d: rc %d, want %d; err \"%s\", want \"%s\"", __LINE__, rc, want, err, needle); \
} while (0)
	pg[3].page = 8;
	REJECT(-EINVAL, "destination 8 of a 8-page region", e, &kr, 1, pg, 4, NULL, 0);
	pg[3].page = 1;
	REJECT(-EINVAL, "named twice", e, &kr, 1, pg, 4, NULL, 0);
	pg[3].page = 3;
	pg[2].region = 1;
	REJECT(-EINVAL, "region 1 of 1", e, &kr, 1, pg, 4, NULL, 0);
	pg[2].region = 0;
	pg[1].host = loose;
	REJECT(-EINVAL, "not in registered host memory", e, &kr, 1, pg, 4, NULL, 0);
	pg[1].host = arena + alen - r.obj / 2;	/* straddles the registration's end */
	REJECT(-EINVAL, "not in registered host memory", e, &kr, 1, pg, 4, NULL, 0);
	pg[1].host = arena + r.obj;
	REJECT(-EINVAL, "0 regions", e, &kr, 0, pg, 4, NULL, 0);
	REJECT(-EINVAL, "not this engine's", e, &none, 1, pg, 4, NULL, 0);
	/* a 2 MiB object does not fit a 1 MiB staging slot */
	gpu_reg_geom(&rb, GPU_PAGE_FIRST, 1, 64, 32, 1024, 0);
	gpu_reg_make(&rb, e, NULL);
	big = rb.kr;
	REJECT(-E2BIG, "exceeds the", e, &big, 1, pg, 1, NULL, 0);
	/* geometries that overrun their memory */
	g = r.g;
	g.size = r.bytes - 1;
	rc = kernels_region_new(e, &g, &none, err, sizeof(err));
	CHECK(rc == -ERANGE && strstr(err, "overruns its memory"), "size - 1: %d %s", rc, err);
	g = r.g;
	g.num_pages = 8192;	/* far past the allocation, whatever its rounding */
	g.size = UINT64_MAX;	/* and claims the memory is there */
	rc = kernels_region_new(e, &g, &none, err, sizeof(err));
	CHECK(rc == -ERANGE && strstr(err, "overruns its allocation"), "oversize: %d %s", rc, err);
	g = r.g;
	g.base = loose;
	rc = kernels_region_new(e, &g, &none, err, sizeof(err));
	CHECK(rc == -EFAULT && strstr(err, "not device memory"), "host base: %d %s", rc, err);
	g = r.g;
	g.layers = 0;
	rc = kernels_region_new(e, &g, &none, err, sizeof(err));
	CHECK(rc == -EINVAL, "no layers: %d %s", rc, err);
	/* nothing moved, and the engine still works */
	gpu_reg_compare(&r, "rejected submits");
	gpu_run(e, 0, &kr, 1, pg, 4, NULL, 0, 0, &res, NULL, NULL);
	for (i = 0; i < 4; i++)
		gpu_reg_apply(&r, pg[i].page, pg[i].host, 1);
	gpu_reg_compare(&r, "after the rejected submits");
#undef REJECT
	gpu_reg_free(&rb, 1);
	gpu_reg_free(&r, 1);
	gpu_host_free(arena, alen, 1);
	gpu_host_free(loose, r.obj, 0);
	kernels_engine_free(e);
}
END_TEST

START_TEST(test_gpu_restore_while_a_busy_kernel_holds_the_gpu)
{
	struct kernels_engine	*e;
	struct kernels_region	*kr;
	struct kernels_result	 res;
	struct kernels_page	 pg[24];
	struct gpu_reg		 r;
	struct timespec		 t0, t1;
	uint8_t			*objs[24], *arena;
	uint32_t		 i;
	size_t			 alen;
	char			 err[256] = "";
	int			 rc;

	gpu_init();
	/* everything that allocates or frees (and so may synchronize) happens outside the busy time */
	e = gpu_engine(0, 0, 0, -1);
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 32, 64, 61, 576, 0);
	gpu_reg_make(&r, e, NULL);
	kr = r.kr;
	arena = gpu_case(&r, 24, GPU_MIXED, objs, pg, &alen);
	rc = kernels_busy_start(err, sizeof(err));
	CHECK(rc == 0, "kernels_busy_start: %d %s", rc, err);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	gpu_run(e, 0, &kr, 1, pg, 24, NULL, 0, 0, &res, NULL, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	rc = kernels_busy_stop(err, sizeof(err));
	CHECK(rc == 0, "kernels_busy_stop: %d %s", rc, err);
	/* high-priority streams get SMs between the busy blocks: not seconds */
	CHECK((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 5000,
	    "the restore waited for the busy kernel");
	for (i = 0; i < 24; i++)
		gpu_reg_apply(&r, pg[i].page, objs[i], 1);
	gpu_reg_compare(&r, "restore beside a busy kernel");
	gpu_reg_free(&r, 1);
	gpu_host_free(arena, alen, 1);
	kernels_engine_free(e);
}
END_TEST

/* What the engine process and the test share (MAP_SHARED, set up before the fork). */
struct gpu_share {
	uint8_t		mem[KERNELS_IPC_HANDLE_LEN];
	uint8_t		ev[KERNELS_IPC_HANDLE_LEN];
	uint64_t	alloc_size;
	char		err[256];
};

/* One byte, with fd as SCM_RIGHTS when fd >= 0. */
static int
gpu_send(int sock, char c, int fd)
{
	union {
		struct cmsghdr	h;
		char		b[CMSG_SPACE(sizeof(int))];
	}		 u;
	struct iovec	 iov = { &c, 1 };
	struct msghdr	 m;

	memset(&m, 0, sizeof(m));
	memset(&u, 0, sizeof(u));
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (fd >= 0) {
		m.msg_control = u.b;
		m.msg_controllen = sizeof(u.b);
		CMSG_FIRSTHDR(&m)->cmsg_level = SOL_SOCKET;
		CMSG_FIRSTHDR(&m)->cmsg_type = SCM_RIGHTS;
		CMSG_FIRSTHDR(&m)->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(CMSG_FIRSTHDR(&m)), &fd, sizeof(int));
	}
	return sendmsg(sock, &m, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

static int
gpu_recv(int sock, char *c, int *fd)
{
	union {
		struct cmsghdr	h;
		char		b[CMSG_SPACE(sizeof(int))];
	}		 u;
	struct iovec	 iov = { c, 1 };
	struct msghdr	 m;
	struct cmsghdr	*h;

	memset(&m, 0, sizeof(m));
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.b;
	m.msg_controllen = sizeof(u.b);
	*fd = -1;
	if (recvmsg(sock, &m, 0) != 1)
		return -1;
	if ((h = CMSG_FIRSTHDR(&m)) != NULL && h->cmsg_type == SCM_RIGHTS)
		memcpy(fd, CMSG_DATA(h), sizeof(int));
	return 0;
}

/*
 * The engine's side, in the second process: allocates device memory
 * (cudaMalloc + IPC handle, or a cuMem allocation exported as a POSIX fd),
 * fills it with the sentinel in `want`, records an IPC event, says ready;
 * then, told the test is done, checks that its memory equals `want`
 * (which the test has updated). Returns the exit status: 0 when it does.
 */
static int
gpu_engine_process(int sock, struct gpu_share *sh, uint8_t *want, size_t bytes, int cumem)
{
	struct kernels_event	*ev = NULL;
	uint8_t			*back = NULL;
	void			*d = NULL;
	size_t			 asize = 0;
	int			 fd = -1, rc;
	char			 c;

	if (kernels_init(0, sh->err, sizeof(sh->err)) != 0)
		return 10;
	if (cumem) {
		if (kernels_cumem_alloc(bytes, &d, &asize, &fd, sh->err, sizeof(sh->err)) != 0)
			return 11;
		sh->alloc_size = asize;
	} else if (kernels_dev_alloc(bytes, &d, sh->err, sizeof(sh->err)) != 0 ||
	    kernels_ipc_export(d, sh->mem, sh->err, sizeof(sh->err)) != 0) {
		return 12;
	}
	if (kernels_copy(d, want, bytes, sh->err, sizeof(sh->err)) != 0)
		return 13;
	if (!cumem && (kernels_event_new(1, &ev, sh->err, sizeof(sh->err)) != 0 ||
	    kernels_event_record(ev, sh->err, sizeof(sh->err)) != 0 ||
	    kernels_event_export(ev, sh->ev, sh->err, sizeof(sh->err)) != 0))
		return 14;
	if (gpu_send(sock, 'R', fd) != 0)
		return 15;
	if (read(sock, &c, 1) != 1 || c != 'D')
		return 16;	/* the test failed and went away */
	if ((back = malloc(bytes)) == NULL ||
	    kernels_copy(back, d, bytes, sh->err, sizeof(sh->err)) != 0)
		return 17;
	rc = memcmp(back, want, bytes) == 0 ? 0 : 18;
	if (rc != 0)
		snprintf(sh->err, sizeof(sh->err), "the engine process sees other bytes");
	free(back);
	kernels_event_free(ev);
	if (cumem) {
		kernels_cumem_free(d, asize, sh->err, sizeof(sh->err));
		close(fd);
	} else {
		kernels_dev_free(d);
	}
	return rc;
}

/* A restore into memory another process owns and exported. */
static void
gpu_second_process_case(int cumem)
{
	struct kernels_engine	*e;
	struct kernels_region	*kr;
	struct kernels_event	*ev = NULL;
	struct kernels_result	 res;
	struct kernels_page	 pg[20];
	struct gpu_share	*sh;
	struct gpu_reg		 r;
	struct pollfd		 pfd;
	uint8_t			*want, *objs[20], *arena;
	uint32_t		 i;
	size_t			 alen, size = 0;
	void			*d = NULL;
	pid_t			 pid;
	char			 err[256] = "", c = 0;
	int			 sv[2], fd = -1, st = 0, rc;

	gpu_rnd_init();
	/* 64 tokens x 8 layers x 576: 288 KiB objects; 32 pages */
	gpu_reg_geom(&r, GPU_LAYER_FIRST, 32, 64, 8, 576, 0);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	want = mmap(NULL, r.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED && want != MAP_FAILED, "mmap: %s", strerror(errno));
	gpu_rnd_fill(want, r.bytes);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %s", strerror(errno));
	/* before any CUDA call in this process: CUDA does not survive fork() */
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		close(sv[0]);
		_exit(gpu_engine_process(sv[1], sh, want, r.bytes, cumem));
	}
	close(sv[1]);
	pfd.fd = sv[0];
	pfd.events = POLLIN;
	rc = poll(&pfd, 1, 60000);
	if (rc != 1 || gpu_recv(sv[0], &c, &fd) != 0 || c != 'R') {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		CHECK(0, "the engine process never got ready: status %#x: %s", st, sh->err);
	}
	gpu_cuda_init();
	if (cumem) {
		CHECK(fd >= 0, "no fd came with the ready message");
		rc = kernels_cumem_import(fd, sh->alloc_size, &d, err, sizeof(err));
		CHECK(rc == 0, "kernels_cumem_import: %d %s", rc, err);
	} else {
		rc = kernels_ipc_open(sh->mem, &d, &size, err, sizeof(err));
		CHECK(rc == 0, "kernels_ipc_open: %d %s", rc, err);
		/* 0: the driver could not say */
		CHECK(size == 0 || size >= r.bytes, "the IPC mapping is %zu bytes, want >= %zu",
		    size, r.bytes);
		rc = kernels_event_open_ipc(sh->ev, &ev, err, sizeof(err));
		CHECK(rc == 0, "kernels_event_open_ipc: %d %s", rc, err);
	}
	e = gpu_engine(0, 0, 0, -1);
	gpu_reg_make(&r, e, d);	/* a new sentinel, written from this process */
	kr = r.kr;
	arena = gpu_case(&r, 20, GPU_MIXED, objs, pg, &alen);
	gpu_run(e, 0, &kr, 1, pg, 20, ev, 0, 0, &res, NULL, NULL);
	for (i = 0; i < 20; i++)
		gpu_reg_apply(&r, pg[i].page, objs[i], 1);
	gpu_reg_compare(&r, cumem ? "cuMem fd import" : "legacy IPC");
	memcpy(want, r.mirror[0], r.bytes);
	gpu_reg_free(&r, 0);
	kernels_engine_free(e);
	kernels_event_free(ev);
	if (cumem) {
		rc = kernels_cumem_unmap(d, sh->alloc_size, err, sizeof(err));
		close(fd);
	} else {
		rc = kernels_ipc_close(d, err, sizeof(err));
	}
	CHECK(rc == 0, "closing the mapping: %d %s", rc, err);
	/* the engine process now checks, from its side, what landed */
	CHECK(gpu_send(sv[0], 'D', -1) == 0, "send: %s", strerror(errno));
	CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "engine process status %#x: %s", st, sh->err);
	close(sv[0]);
	gpu_host_free(arena, alen, 1);
	munmap(want, r.bytes);
	munmap(sh, sizeof(*sh));
}

START_TEST(test_gpu_ipc_memory_from_a_second_process)
{
	gpu_second_process_case(0);
}
END_TEST

START_TEST(test_gpu_cumem_fd_from_a_second_process)
{
	gpu_second_process_case(1);
}
END_TEST

/*
 * The daemon's cuda copy engine, end to end: a real l3kvd (exec'd, with
 * copy_engine cuda) and an engine process that keeps its KV in device
 * memory, exports it with a legacy IPC handle and drives the daemon
 * through libl3kv. The test process itself never touches CUDA: it starts
 * the daemon, forks the engine, and reads the daemon's counters.
 *
 * The engine's region is layer_first (per layer: pages x tokens x bytes)
 * with 1 MiB objects (64 tokens x 16 layers x 1 KiB), so every restore
 * scatters and every publish gathers on the GPU.
 */
#define GD_TOKENS	64
#define GD_LAYERS	16
#define GD_TOKEN_BYTES	1024
#define GD_OBJ		((size_t)GD_TOKENS * GD_LAYERS * GD_TOKEN_BYTES)
#define GD_BLOCK	((size_t)GD_TOKENS * GD_TOKEN_BYTES)	/* one page of one layer */

enum gd_mode {
	GD_ROUND_TRIP = 1,	/* publish, admit, restore, check every byte */
	GD_CANCEL,		/* a large restore cancelled at once */
	GD_KILLED,		/* a large restore, then the engine is killed */
	GD_CORRUPT,		/* page 5's object corrupted (DEBUG) before the restore */
	GD_EVENT,		/* restores racing a late kernel of the engine, with and
				   without waiting for its IPC event */
	GD_STATE,		/* a hybrid engine: gd_state_engine() */
	GD_EVENT_KILLED,	/* a RESTORE waiting on the engine's own event, whose
				   kernel is still running when the engine is killed */
};
#define GD_F_CUMEM	0x100	/* the region is a cuMem allocation shared as a POSIX fd */
#define GD_LATE_MS	400	/* how long the engine's late kernel waits before writing */
#define GD_DOOMED_MS	3000	/* GD_EVENT_KILLED: the late kernel the engine dies in */

/* What the engine process and the test share (MAP_SHARED, set up before the fork). */
struct gd_share {
	char		err[512];
	uint32_t	landed;		/* GD_CANCEL: CANCEL's pages_landed */
	int		restore_rc;	/* GD_CANCEL: the RESTORE's completion status */
	uint32_t	clobbered;	/* GD_EVENT: pages the late kernel overwrote, no wait */
	double		wait_ms;	/* GD_EVENT: the waiting RESTORE's time */
};

#define GD_FAIL(code, ...) do {						\
	snprintf(sh->err, sizeof(sh->err), __VA_ARGS__);		\
	return (code);							\
} while (0)

/* 1 if region page q in `now` holds region page p of `was`, layer by layer. */
static int
gd_page_is(const uint8_t *now, uint32_t q, const uint8_t *was, uint32_t p, uint32_t pages)
{
	size_t	ls = (size_t)pages * GD_BLOCK;
	int	l;

	for (l = 0; l < GD_LAYERS; l++)
		if (memcmp(now + l * ls + q * GD_BLOCK, was + l * ls + p * GD_BLOCK, GD_BLOCK) != 0)
			return 0;
	return 1;
}

/*
 * One source page published under two hashes in one PUBLISH (the GPU
 * reads it once), both restored into the last two region pages.
 */
static int
gd_same_source(struct gd_share *sh, struct l3kv *k, void *d, size_t bytes, const uint8_t *src,
    uint32_t n, uint32_t prefix)
{
	struct l3kv_restore_result	 res;
	struct l3kv_restore_args	 ra;
	struct l3kv_publish_result	 pr;
	struct l3kv_publish_page	 pg[2];
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 aa;
	uint8_t				 h[2 * L3KV_HASH_LEN], *now;
	uint32_t			 dst[2] = { 2 * n - 1, 2 * n - 2 }, i;
	char				 err[256] = "";
	int				 rc;

	for (i = 0; i < 2; i++) {
		test_page_hash(prefix + 1000, i, pg[i].hash);
		memcpy(h + i * L3KV_HASH_LEN, pg[i].hash, L3KV_HASH_LEN);
		pg[i].src_page = 1;
	}
	if ((rc = l3kv_publish(k, 0, pg, 2, &pr)) != 0 || pr.stored != 2)
		GD_FAIL(30, "engine: PUBLISH of one page under two hashes: %d %s, stored %u", rc,
		    l3kv_last_error(k), pr.stored);
	memset(&aa, 0, sizeof(aa));
	aa.request_id = prefix + 1000;
	aa.hashes = h;
	aa.npages = 2;
	aa.reserved_pages = 2;
	aa.state_slot = L3KV_SLOT_NONE;
	if ((rc = l3kv_admit(k, &aa, &ar)) != 0 || ar.admitted_pages != 2)
		GD_FAIL(31, "engine: ADMIT of the two: %d, %u admitted", rc, ar.admitted_pages);
	/* with the release flag (issue 16): the lease ends with the RESTORE's ok */
	memset(&ra, 0, sizeof(ra));
	ra.lease = ar.lease;
	ra.pages = dst;
	ra.npages = 2;
	ra.state_region = L3KV_REGION_NONE;
	ra.state_slot = L3KV_SLOT_NONE;
	ra.event_region = L3KV_REGION_NONE;
	ra.flags = L3KV_RESTORE_RELEASE;
	if ((rc = l3kv_restore_with(k, &ra, 60000, &res)) != 0 || res.pages != 2)
		GD_FAIL(32, "engine: RESTORE of the two: %d %s", rc, l3kv_last_error(k));
	if ((now = malloc(bytes)) == NULL)
		GD_FAIL(2, "engine: out of memory");
	if ((rc = kernels_copy(now, d, bytes, err, sizeof(err))) != 0)
		GD_FAIL(17, "engine: kernels_copy back: %d %s", rc, err);
	for (i = 0; i < 2; i++)
		if (!gd_page_is(now, dst[i], src, 1, 2 * n))
			GD_FAIL(33, "engine: object %u published from page 1 differs", i);
	free(now);
	if ((rc = l3kv_release(k, ar.lease)) != -ENOENT)
		GD_FAIL(24, "engine: RELEASE after a RESTORE with the release flag: %d, want %d",
		    rc, -ENOENT);
	return 0;
}

/*
 * GD_EVENT: the engine has just reclaimed the destination pages (the upper
 * half of the region) while a kernel of its own will still write them: a
 * late kernel that waits GD_LATE_MS, then fills them with 0xee. First
 * without waiting: the daemon's restore lands before the late kernel, which
 * then overwrites it (counted in sh->clobbered: this shows the race is
 * real on this GPU). Then, with the event recorded after the late kernel
 * and named by the RESTORE: the restored bytes must be what is left.
 */
static int
gd_event_case(struct gd_share *sh, struct l3kv *k, void *d, size_t bytes, const uint8_t *before,
    uint8_t *after, const uint8_t *hashes, const uint32_t *dst, uint32_t n, uint32_t prefix,
    struct kernels_event *ev, unsigned event_region)
{
	struct l3kv_restore_result	 res;
	struct l3kv_restore_args	 ra;
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 aa;
	struct timespec			 t0, t1;
	uint32_t			 pages = 2 * n, i, round;
	char				 err[256] = "";
	int				 rc;

	for (round = 0; round < 2; round++) {
		memset(&aa, 0, sizeof(aa));
		aa.request_id = (uint64_t)prefix << 8 | (round + 1);
		aa.hashes = hashes;
		aa.npages = n;
		aa.reserved_pages = n;
		aa.state_slot = L3KV_SLOT_NONE;
		if ((rc = l3kv_admit(k, &aa, &ar)) != 0 || ar.admitted_pages != n)
			GD_FAIL(40, "engine: ADMIT %u: %d, %u of %u pages", round, rc,
			    ar.admitted_pages, n);
		/* layer_first: pages n..2n-1 of each layer are one run of n blocks */
		rc = kernels_late_fill((uint8_t *)d + (size_t)n * GD_BLOCK, (size_t)pages * GD_BLOCK,
		    (size_t)n * GD_BLOCK, GD_LAYERS, 0xee, GD_LATE_MS, err, sizeof(err));
		if (rc != 0 || (rc = kernels_event_record(ev, err, sizeof(err))) != 0)
			GD_FAIL(41, "engine: the late kernel and its event: %d %s", rc, err);
		ra = (struct l3kv_restore_args){ .lease = ar.lease, .pages = dst, .npages = n,
		    .region = 0, .state_region = L3KV_REGION_NONE, .state_slot = L3KV_SLOT_NONE,
		    .event_region = round == 0 ? L3KV_REGION_NONE : (uint16_t)event_region };
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if ((rc = l3kv_restore_with(k, &ra, 60000, &res)) != 0 || res.pages != n)
			GD_FAIL(42, "engine: RESTORE %u: %d %s", round, rc, l3kv_last_error(k));
		clock_gettime(CLOCK_MONOTONIC, &t1);
		/* kernels_copy runs on the default stream: after the late kernel */
		if ((rc = kernels_copy(after, d, bytes, err, sizeof(err))) != 0)
			GD_FAIL(17, "engine: kernels_copy back: %d %s", rc, err);
		for (i = 0; i < n; i++) {
			if (gd_page_is(after, dst[i], before, i, pages))
				continue;
			if (round == 1)
				GD_FAIL(43, "engine: page %u (region page %u) is not the restored one "
				    "though the RESTORE waited for the engine's event", i, dst[i]);
			sh->clobbered++;
		}
		if (round == 1)
			sh->wait_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
			    (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
		if ((rc = l3kv_release(k, ar.lease)) != 0)
			GD_FAIL(24, "engine: RELEASE: %d %s", rc, l3kv_last_error(k));
	}
	return 0;
}

/*
 * The engine: n source pages published from device memory, then restored
 * into n other device pages of the same region (in reverse order). The
 * region holds 2n pages. Returns the exit status, 0 when all is well.
 */
static int
gd_engine(const char *sock, struct gd_share *sh, int mode, uint32_t n, uint32_t prefix, int wfd)
{
	struct l3kv_restore_result	 res;
	struct l3kv_publish_result	 pr;
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 aa;
	struct l3kv_completion		 c;
	struct l3kv_attach_args		 args;
	struct l3kv_publish_page	*pg;
	struct l3kv_region		 regs[2], *reg = &regs[0];
	struct kernels_event		*ev = NULL;
	struct l3kv_pool		 pool;
	struct l3kv			*k = NULL;
	struct pollfd			 pfd;
	uint8_t				*before, *after, *again, *hashes;
	uint32_t			*dst, pages = 2 * n, i, landed = 0;
	uint64_t			 ticket;
	size_t				 bytes = (size_t)pages * GD_OBJ, asize = 0;
	void				*d = NULL;
	char				 err[256] = "";
	int				 rc, tries, cumem = (mode & GD_F_CUMEM) != 0, fd = -1;

	mode &= ~GD_F_CUMEM;
	gpu_rnd_init();
	before = malloc(bytes);
	after = malloc(bytes);
	again = malloc(bytes);
	pg = calloc(n, sizeof(*pg));
	hashes = malloc((size_t)n * L3KV_HASH_LEN);
	dst = calloc(n, sizeof(*dst));
	if (before == NULL || after == NULL || again == NULL || pg == NULL || hashes == NULL ||
	    dst == NULL)
		GD_FAIL(2, "engine: out of memory");
	if ((rc = kernels_init(0, err, sizeof(err))) != 0)
		GD_FAIL(3, "engine: kernels_init: %d %s", rc, err);
	if (cumem)
		rc = kernels_cumem_alloc(bytes, &d, &asize, &fd, err, sizeof(err));
	else
		rc = kernels_dev_alloc(bytes, &d, err, sizeof(err));
	if (rc != 0)
		GD_FAIL(4, "engine: allocating %zu bytes (%s): %d %s", bytes,
		    cumem ? "cuMem" : "cudaMalloc", rc, err);
	gpu_rnd_fill(before, bytes);
	if ((rc = kernels_copy(d, before, bytes, err, sizeof(err))) != 0)
		GD_FAIL(5, "engine: kernels_copy to the device: %d %s", rc, err);

	pool = (struct l3kv_pool){ "kv", L3KV_POOL_KV, L3KV_HIT_ALL_PAGES, 0, GD_LAYERS, GD_OBJ,
	    "latent:1024:fp8_e4m3" };
	memset(regs, 0, sizeof(regs));
	reg->pool = 0;
	reg->kind = cumem ? L3KV_MEM_CUMEM_FD : L3KV_MEM_CUDA_IPC;
	reg->layout = L3KV_LAYOUT_LAYER_FIRST;
	reg->fd = fd;
	reg->size = bytes;
	reg->num_pages = pages;
	reg->page_tokens = GD_TOKENS;
	reg->layers = GD_LAYERS;
	reg->token_bytes = GD_TOKEN_BYTES;
	reg->page_stride = GD_BLOCK;
	reg->layer_stride = (uint64_t)pages * GD_BLOCK;
	reg->token_stride = GD_TOKEN_BYTES;
	if (!cumem && (rc = kernels_ipc_export(d, reg->handle, err, sizeof(err))) != 0)
		GD_FAIL(6, "engine: kernels_ipc_export: %d %s", rc, err);
	if (mode == GD_EVENT || mode == GD_EVENT_KILLED) {
		regs[1].kind = L3KV_MEM_CUDA_EVENT;
		regs[1].fd = -1;
		if ((rc = kernels_event_new(1, &ev, err, sizeof(err))) != 0 ||
		    (rc = kernels_event_export(ev, regs[1].handle, err, sizeof(err))) != 0)
			GD_FAIL(6, "engine: an interprocess event: %d %s", rc, err);
	}
	memset(&args, 0, sizeof(args));
	args.layout = (struct l3kv_layout){ .model = "gpu-test", .kv_dtype = "fp8_e4m3",
	    .hash_scheme = "sha256", .hash_len = 32, .tp_size = 1, .dcp_size = 1, .pp_size = 1,
	    .cp_size = 1, .host_layout = L3KV_LAYOUT_PAGE_FIRST, .attention = L3KV_ATTN_MLA,
	    .page_tokens = GD_TOKENS, .logical_page_tokens = GD_TOKENS };
	args.pools = &pool;
	args.npools = 1;
	args.regions = regs;
	args.nregions = mode == GD_EVENT || mode == GD_EVENT_KILLED ? 2 : 1;
	args.group = "gpu";
	args.group_size = 1;
	args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	args.write = L3KV_WRITE_THROUGH;
	if ((rc = l3kv_connect(sock, 10000, &k)) != 0)
		GD_FAIL(7, "engine: connect: %d", rc);
	l3kv_set_timeout(k, 60000);
	if ((rc = l3kv_attach(k, &args, NULL)) != 0)
		GD_FAIL(8, "engine: ATTACH with a %s region: %d %s", cumem ? "cuMem fd" : "CUDA IPC",
		    rc, l3kv_last_error(k));

	for (i = 0; i < n; i++) {
		test_page_hash(prefix, i, pg[i].hash);
		memcpy(hashes + (size_t)i * L3KV_HASH_LEN, pg[i].hash, L3KV_HASH_LEN);
		pg[i].src_page = i;
		dst[i] = pages - 1 - i;
	}
	if ((rc = l3kv_publish(k, 0, pg, n, &pr)) != 0)
		GD_FAIL(9, "engine: PUBLISH from device memory: %d %s", rc, l3kv_last_error(k));
	if (pr.stored != n || pr.present != 0 || pr.bytes != (uint64_t)n * GD_OBJ)
		GD_FAIL(10, "engine: PUBLISH stored %u, present %u, %llu bytes; want %u new",
		    pr.stored, pr.present, (unsigned long long)pr.bytes, n);
	memset(&aa, 0, sizeof(aa));
	aa.request_id = prefix;
	aa.hashes = hashes;
	aa.npages = n;
	aa.reserved_pages = n;
	aa.state_slot = L3KV_SLOT_NONE;
	if ((rc = l3kv_admit(k, &aa, &ar)) != 0 || ar.admitted_pages != n)
		GD_FAIL(11, "engine: ADMIT: %d, %u of %u pages admitted (decline %d)", rc,
		    ar.admitted_pages, n, ar.decline);

	if (mode == GD_EVENT) {
		if ((rc = l3kv_release(k, ar.lease)) != 0)
			GD_FAIL(24, "engine: RELEASE: %d %s", rc, l3kv_last_error(k));
		if ((rc = gd_event_case(sh, k, d, bytes, before, after, hashes, dst, n, prefix, ev,
		    1)) != 0)
			return rc;
		l3kv_close(k);
		kernels_event_free(ev);
		kernels_dev_free(d);
		return 0;
	}
	if (mode == GD_EVENT_KILLED) {
		struct l3kv_restore_args ra = { .lease = ar.lease, .pages = dst, .npages = n,
		    .region = 0, .state_region = L3KV_REGION_NONE,
		    .state_slot = L3KV_SLOT_NONE, .event_region = 1 };
		char			*health = NULL;
		json_t			*stats;
		json_int_t		 waiting;

		/* The event completes only after a kernel this process will not outlive. */
		rc = kernels_late_fill((uint8_t *)d + (size_t)n * GD_BLOCK, (size_t)pages * GD_BLOCK,
		    (size_t)n * GD_BLOCK, GD_LAYERS, 0xee, GD_DOOMED_MS, err, sizeof(err));
		if (rc != 0 || (rc = kernels_event_record(ev, err, sizeof(err))) != 0)
			GD_FAIL(41, "engine: the late kernel and its event: %d %s", rc, err);
		if ((rc = l3kv_submit_restore_with(k, &ra, &ticket)) != 0)
			GD_FAIL(14, "engine: submitting RESTORE: %d", rc);
		/* HEALTH behind it: the daemon has taken the RESTORE in when it answers. */
		if ((rc = l3kv_health(k, &health)) != 0)
			GD_FAIL(14, "engine: HEALTH behind the RESTORE: %d %s", rc,
			    l3kv_last_error(k));
		l3kv_free(health);
		/* STATS counts the RESTORE as waiting for the engine's event */
		if ((rc = l3kv_stats(k, &health)) != 0)
			GD_FAIL(14, "engine: STATS while the RESTORE waits: %d", rc);
		stats = json_loads(health, 0, NULL);
		waiting = json_integer_value(json_object_get(json_object_get(stats, "copy"),
		    "waiting_on_events"));
		json_decref(stats);
		l3kv_free(health);
		if (waiting != 1)
			GD_FAIL(14, "engine: STATS copy.waiting_on_events %lld while the RESTORE "
			    "waits, want 1", (long long)waiting);
		if (write(wfd, "S", 1) != 1)
			GD_FAIL(15, "engine: write: %s", strerror(errno));
		for (;;)
			pause();
	}
	if (mode == GD_CORRUPT) {
		if ((rc = l3kv_debug(k, L3KV_DEBUG_CORRUPT, 0, pg[5].hash)) != 0)
			GD_FAIL(26, "engine: DEBUG corrupt: %d %s", rc, l3kv_last_error(k));
		if ((rc = l3kv_restore(k, ar.lease, 0, dst, n, 60000, &res)) != -ENODATA ||
		    l3kv_last_status(k) != PROTO_S_LOST)
			GD_FAIL(27, "engine: RESTORE of a corrupt object: %d %s, want lost", rc,
			    l3kv_last_error(k));
		if ((rc = kernels_copy(after, d, bytes, err, sizeof(err))) != 0)
			GD_FAIL(17, "engine: kernels_copy back: %d %s", rc, err);
		/* The GPU verifies before it writes: the corrupt page never lands. */
		if (!gd_page_is(after, dst[5], before, dst[5], pages))
			GD_FAIL(28, "engine: the corrupt object was written to region page %u",
			    dst[5]);
		/* The bad object is gone from the index. */
		if ((rc = l3kv_probe(k, hashes, n, &i)) != 0 || i != 5)
			GD_FAIL(29, "engine: PROBE after the loss: %d, hit %u, want 5", rc, i);
		l3kv_close(k);
		kernels_dev_free(d);
		return 0;
	}
	if (mode == GD_ROUND_TRIP) {
		if ((rc = l3kv_restore(k, ar.lease, 0, dst, n, 60000, &res)) != 0)
			GD_FAIL(12, "engine: RESTORE into device memory: %d %s", rc,
			    l3kv_last_error(k));
		if (res.pages != n || res.partial || res.bytes != (uint64_t)n * GD_OBJ)
			GD_FAIL(13, "engine: RESTORE READY with %u pages (partial %d), want %u",
			    res.pages, res.partial, n);
		landed = n;
	} else {
		if ((rc = l3kv_submit_restore(k, ar.lease, 0, dst, n, &ticket)) != 0)
			GD_FAIL(14, "engine: submitting RESTORE: %d", rc);
		if (mode == GD_KILLED) {
			/* Told to the test, which kills this process while the copy runs. */
			if (write(wfd, "S", 1) != 1)
				GD_FAIL(15, "engine: write: %s", strerror(errno));
			for (;;)
				pause();
		}
		if ((rc = l3kv_cancel(k, ar.lease, &landed)) != 0)
			GD_FAIL(16, "engine: CANCEL: %d %s", rc, l3kv_last_error(k));
		sh->landed = landed;
		/* Answered once nothing can land: the memory must not change any more. */
		if ((rc = kernels_copy(after, d, bytes, err, sizeof(err))) != 0)
			GD_FAIL(17, "engine: kernels_copy back: %d %s", rc, err);
		usleep(300000);
		if ((rc = kernels_copy(again, d, bytes, err, sizeof(err))) != 0)
			GD_FAIL(17, "engine: kernels_copy back: %d %s", rc, err);
		if (memcmp(after, again, bytes) != 0)
			GD_FAIL(18, "engine: device memory changed after CANCEL was answered "
			    "(%u pages landed)", landed);
		pfd.fd = l3kv_fd(k);
		pfd.events = POLLIN;
		for (tries = 0; (rc = l3kv_poll_completion(k, &c)) == -EAGAIN && tries < 3000;
		    tries++)
			poll(&pfd, 1, 20);
		if (rc != 0 || c.ticket != ticket)
			GD_FAIL(19, "engine: no RESTORE completion after the CANCEL (%d)", rc);
		sh->restore_rc = c.status;
		if (c.status != -ECANCELED && !(c.status == 0 && landed == n))
			GD_FAIL(20, "engine: RESTORE answered %d after CANCEL with %u of %u landed",
			    c.status, landed, n);
		l3kv_completion_release(&c);
	}
	if ((rc = kernels_copy(after, d, bytes, err, sizeof(err))) != 0)
		GD_FAIL(17, "engine: kernels_copy back: %d %s", rc, err);
	for (i = 0; i < n; i++) {
		if (!gd_page_is(after, i, before, i, pages))
			GD_FAIL(21, "engine: source page %u changed", i);
		if (i < landed && !gd_page_is(after, dst[i], before, i, pages))
			GD_FAIL(22, "engine: restored page %u (region page %u) differs from the "
			    "published one", i, dst[i]);
		if (i >= landed && !gd_page_is(after, dst[i], before, dst[i], pages))
			GD_FAIL(23, "engine: page %u (region page %u) written though only %u landed",
			    i, dst[i], landed);
	}
	if ((rc = l3kv_release(k, ar.lease)) != 0)
		GD_FAIL(24, "engine: RELEASE: %d %s", rc, l3kv_last_error(k));
	/* Everything published is there: publishing again stores nothing. */
	if ((rc = l3kv_publish(k, 0, pg, n, &pr)) != 0 || pr.stored != 0 || pr.present != n)
		GD_FAIL(25, "engine: PUBLISH again: %d, stored %u, present %u", rc, pr.stored,
		    pr.present);
	if (mode == GD_ROUND_TRIP && (rc = gd_same_source(sh, k, d, bytes, before, n, prefix)) != 0)
		return rc;
	l3kv_close(k);
	if (cumem) {
		/* the daemon unmaps its import once the session drained; ours is independent */
		if ((rc = kernels_cumem_free(d, asize, err, sizeof(err))) != 0)
			GD_FAIL(34, "engine: kernels_cumem_free: %d %s", rc, err);
		close(fd);
	} else {
		kernels_dev_free(d);
	}
	free(before);
	free(after);
	free(again);
	free(pg);
	free(hashes);
	free(dst);
	return 0;
}

/*
 * A hybrid engine in device memory: KV pages (layer_first, 8 pages) and a
 * state-slot region of 4 slots, both CUDA IPC; slot 0 is live. It
 * publishes 4 KV pages and the checkpoint at 4 pages (from slot 3),
 * admits them with canonical slot 2, sees a RESTORE naming the live slot
 * refused with nothing written, then restores KV into pages 4..7 and the
 * checkpoint into slot 2: every other byte, the live slot's included,
 * must be as it was.
 */
#define GS_PAGES	8
#define GS_SLOTS	4
#define GS_SLOT_BYTES	(64U << 10)

static int
gd_state_engine(const char *sock, struct gd_share *sh, uint32_t prefix)
{
	struct l3kv_restore_result	 res;
	struct l3kv_publish_result	 pr;
	struct l3kv_publish_page	 pg[4];
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 aa;
	struct l3kv_attach_args		 args;
	struct l3kv_state_dest		 sd;
	struct l3kv_region		 regs[2];
	struct l3kv_pool		 pools[2];
	struct l3kv			*k = NULL;
	const size_t			 kvb = (size_t)GS_PAGES * GD_OBJ;
	const size_t			 sb = (size_t)GS_SLOTS * GS_SLOT_BYTES;
	uint8_t				*kv0, *kv1, *st0, *st1, hashes[4 * L3KV_HASH_LEN];
	uint32_t			 dst[4] = { 4, 5, 6, 7 }, live = 0, i;
	void				*dkv = NULL, *dst_mem = NULL;
	char				 err[256] = "";
	int				 rc;

	gpu_rnd_init();
	kv0 = malloc(kvb);
	kv1 = malloc(kvb);
	st0 = malloc(sb);
	st1 = malloc(sb);
	if (kv0 == NULL || kv1 == NULL || st0 == NULL || st1 == NULL)
		GD_FAIL(2, "state engine: out of memory");
	if ((rc = kernels_init(0, err, sizeof(err))) != 0 ||
	    (rc = kernels_dev_alloc(kvb, &dkv, err, sizeof(err))) != 0 ||
	    (rc = kernels_dev_alloc(sb, &dst_mem, err, sizeof(err))) != 0)
		GD_FAIL(3, "state engine: CUDA set-up: %d %s", rc, err);
	gpu_rnd_fill(kv0, kvb);
	gpu_rnd_fill(st0, sb);
	if ((rc = kernels_copy(dkv, kv0, kvb, err, sizeof(err))) != 0 ||
	    (rc = kernels_copy(dst_mem, st0, sb, err, sizeof(err))) != 0)
		GD_FAIL(5, "state engine: filling device memory: %d %s", rc, err);

	pools[0] = (struct l3kv_pool){ "kv", L3KV_POOL_KV, L3KV_HIT_ALL_PAGES, 0, GD_LAYERS,
	    GD_OBJ, "kv:1024:bf16" };
	pools[1] = (struct l3kv_pool){ "state", L3KV_POOL_STATE, L3KV_HIT_ALL_PAGES, 0, 1,
	    GS_SLOT_BYTES, "conv:65536" };
	memset(regs, 0, sizeof(regs));
	regs[0] = (struct l3kv_region){ .pool = 0, .kind = L3KV_MEM_CUDA_IPC,
	    .layout = L3KV_LAYOUT_LAYER_FIRST, .fd = -1, .size = kvb, .num_pages = GS_PAGES,
	    .page_tokens = GD_TOKENS, .layers = GD_LAYERS, .token_bytes = GD_TOKEN_BYTES,
	    .page_stride = GD_BLOCK, .layer_stride = (uint64_t)GS_PAGES * GD_BLOCK,
	    .token_stride = GD_TOKEN_BYTES };
	regs[1] = (struct l3kv_region){ .pool = 1, .kind = L3KV_MEM_CUDA_IPC,
	    .layout = L3KV_LAYOUT_SLOTS, .fd = -1, .size = sb, .num_pages = GS_SLOTS,
	    .page_tokens = 1, .layers = 1, .token_bytes = GS_SLOT_BYTES,
	    .page_stride = GS_SLOT_BYTES, .layer_stride = GS_SLOT_BYTES,
	    .token_stride = GS_SLOT_BYTES };
	if ((rc = kernels_ipc_export(dkv, regs[0].handle, err, sizeof(err))) != 0 ||
	    (rc = kernels_ipc_export(dst_mem, regs[1].handle, err, sizeof(err))) != 0)
		GD_FAIL(6, "state engine: kernels_ipc_export: %d %s", rc, err);
	memset(&args, 0, sizeof(args));
	args.layout = (struct l3kv_layout){ .model = "gpu-hybrid-test", .kv_dtype = "bf16",
	    .hash_scheme = "sha256", .hash_len = 32, .tp_size = 1, .dcp_size = 1, .pp_size = 1,
	    .cp_size = 1, .host_layout = L3KV_LAYOUT_PAGE_FIRST, .attention = L3KV_ATTN_MHA,
	    .page_tokens = GD_TOKENS, .logical_page_tokens = GD_TOKENS };
	args.pools = pools;
	args.npools = 2;
	args.regions = regs;
	args.nregions = 2;
	args.live_slots = &live;
	args.nlive = 1;
	args.group = "gpu-hybrid";
	args.group_size = 1;
	args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	args.write = L3KV_WRITE_THROUGH;
	if ((rc = l3kv_connect(sock, 10000, &k)) != 0)
		GD_FAIL(7, "state engine: connect: %d", rc);
	l3kv_set_timeout(k, 60000);
	if ((rc = l3kv_attach(k, &args, NULL)) != 0)
		GD_FAIL(8, "state engine: ATTACH: %d %s", rc, l3kv_last_error(k));

	for (i = 0; i < 4; i++) {
		test_page_hash(prefix, i, pg[i].hash);
		memcpy(hashes + (size_t)i * L3KV_HASH_LEN, pg[i].hash, L3KV_HASH_LEN);
		pg[i].src_page = i;
	}
	if ((rc = l3kv_publish(k, 0, pg, 4, &pr)) != 0 || pr.stored != 4)
		GD_FAIL(9, "state engine: PUBLISH of 4 KV pages: %d %s, stored %u", rc,
		    l3kv_last_error(k), pr.stored);
	/* The checkpoint at 4 pages: keyed by page 3's hash, from slot 3. */
	pg[3].src_page = 3;
	if ((rc = l3kv_publish(k, 1, &pg[3], 1, &pr)) != 0 || pr.stored != 1)
		GD_FAIL(10, "state engine: PUBLISH of the checkpoint: %d %s, stored %u", rc,
		    l3kv_last_error(k), pr.stored);
	memset(&aa, 0, sizeof(aa));
	aa.request_id = prefix;
	aa.hashes = hashes;
	aa.npages = 4;
	aa.reserved_pages = 4;
	aa.state_slot = 2;
	if ((rc = l3kv_admit(k, &aa, &ar)) != 0 || ar.admitted_pages != 4)
		GD_FAIL(11, "state engine: ADMIT: %d, %u of 4 pages (decline %d)", rc,
		    ar.admitted_pages, ar.decline);

	/* The live slot: refused before any byte moves. */
	sd = (struct l3kv_state_dest){ 1, 0 };
	if ((rc = l3kv_restore_state(k, ar.lease, 0, dst, 4, &sd, 60000, &res)) != -EADDRINUSE)
		GD_FAIL(12, "state engine: RESTORE into the live slot: %d %s, want -EADDRINUSE",
		    rc, l3kv_last_error(k));
	usleep(100000);
	if ((rc = kernels_copy(kv1, dkv, kvb, err, sizeof(err))) != 0 ||
	    (rc = kernels_copy(st1, dst_mem, sb, err, sizeof(err))) != 0)
		GD_FAIL(17, "state engine: kernels_copy back: %d %s", rc, err);
	if (memcmp(kv1, kv0, kvb) != 0 || memcmp(st1, st0, sb) != 0)
		GD_FAIL(13, "state engine: the refused RESTORE wrote device memory");

	sd.slot = 2;
	if ((rc = l3kv_restore_state(k, ar.lease, 0, dst, 4, &sd, 60000, &res)) != 0 ||
	    res.pages != 4)
		GD_FAIL(14, "state engine: RESTORE into slot 2: %d %s", rc, l3kv_last_error(k));
	if ((rc = kernels_copy(kv1, dkv, kvb, err, sizeof(err))) != 0 ||
	    (rc = kernels_copy(st1, dst_mem, sb, err, sizeof(err))) != 0)
		GD_FAIL(17, "state engine: kernels_copy back: %d %s", rc, err);
	for (i = 0; i < GS_PAGES; i++) {
		if (!gd_page_is(kv1, i, kv0, i < 4 ? i : i - 4, GS_PAGES))
			GD_FAIL(15, "state engine: KV page %u is not %s", i,
			    i < 4 ? "as it was" : "the restored one");
	}
	for (i = 0; i < GS_SLOTS; i++) {
		const uint8_t *want = st0 + (size_t)(i == 2 ? 3 : i) * GS_SLOT_BYTES;

		if (memcmp(st1 + (size_t)i * GS_SLOT_BYTES, want, GS_SLOT_BYTES) != 0)
			GD_FAIL(16, "state engine: slot %u is not %s", i, i == 2 ?
			    "the restored checkpoint" : i == 0 ? "the live sentinel" : "as it was");
	}
	if ((rc = l3kv_release(k, ar.lease)) != 0)
		GD_FAIL(24, "state engine: RELEASE: %d %s", rc, l3kv_last_error(k));
	l3kv_close(k);
	kernels_dev_free(dkv);
	kernels_dev_free(dst_mem);
	free(kv0);
	free(kv1);
	free(st0);
	free(st1);
	return 0;
}

/* A counter of the daemon's STATS. */
static long long
gd_stat(const char *sock, const char *section, const char *key)
{
	struct l3kv	*k = NULL;
	json_error_t	 jerr;
	json_t		*j, *v;
	char		*text = NULL;
	long long	 n;

	CHECK(l3kv_connect(sock, 5000, &k) == 0, "connect for STATS");
	CHECK(l3kv_stats(k, &text) == 0, "STATS");
	j = json_loads(text, 0, &jerr);
	CHECK(j != NULL, "STATS is not JSON: %s", jerr.text);
	v = json_object_get(json_object_get(j, section), key);
	CHECK(json_is_integer(v), "STATS %s.%s missing", section, key);
	n = json_integer_value(v);
	json_decref(j);
	l3kv_free(text);
	l3kv_close(k);
	return n;
}

/* Waits (bounded) for a counter to reach want; returns its last value. */
static long long
gd_stat_wait(const char *sock, const char *section, const char *key, long long want)
{
	long long	v = -1;
	int		i;

	for (i = 0; i < 500; i++) {
		if ((v = gd_stat(sock, section, key)) == want)
			break;
		usleep(10000);
	}
	return v;
}

/* Forks an engine process; wfd (or -1) is its end of the test's pipe. */
static pid_t
gd_fork_engine(const struct test_daemon *td, struct gd_share *sh, int mode, uint32_t n,
    uint32_t prefix, int rfd, int wfd)
{
	pid_t	pid;

	memset(sh, 0, sizeof(*sh));
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);	/* gone with a failed test */
		if (rfd >= 0)
			close(rfd);
		_exit(mode == GD_STATE ? gd_state_engine(td->sock, sh, prefix) :
		    gd_engine(td->sock, sh, mode, n, prefix, wfd));
	}
	return pid;
}

static void
gd_wait_engine(pid_t pid, struct gd_share *sh, const char *what)
{
	int	st = 0;

	CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: engine process status %#x: %s", what,
	    st, sh->err);
}

/* Nothing held once the engines are gone, then a clean SIGTERM. */
static void
gd_daemon_done(struct test_daemon *td)
{
	int	st = 0;

	EQ(gd_stat_wait(td->sock, "cache", "leases_open", 0), 0);
	EQ(gd_stat_wait(td->sock, "dram", "pins", 0), 0);
	EQ(gd_stat(td->sock, "dram", "pinned_objects"), 0);
	EQ(gd_stat(td->sock, "dram", "writing"), 0);
	/* The IPC mapping closed once the session's copies drained. */
	EQ(gd_stat_wait(td->sock, "memory", "regions_mapped", 0), 0);
	test_daemon_stop(td, SIGTERM, &st);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "l3kvd exit status %#x", st);
}

/* The last bytes of the daemon's log, for a failure message (static buffer). */
static const char *
gd_log_tail(const struct test_daemon *td)
{
	static char	buf[400];
	FILE		*f;
	size_t		 n = 0;

	buf[0] = '\0';
	if ((f = fopen(td->log, "r")) != NULL) {
		if (fseek(f, -(long)(sizeof(buf) - 1), SEEK_END) != 0)
			rewind(f);
		n = fread(buf, 1, sizeof(buf) - 1, f);
		buf[n] = '\0';
		fclose(f);
	}
	return buf;
}

static struct gd_share *
gd_start(struct test_daemon *td, const char *dram)
{
	struct gd_share	*sh;
	char		 cfg[256], bin[PATH_MAX];
	int		 rc;

	gpu_rnd_init();
	snprintf(cfg, sizeof(cfg), "{\"copy_engine\": \"cuda\", \"testing\": {\"debug_ops\": "
	    "true}, \"tiers\": {\"dram\": {\"size\": \"%s\"}}}", dram);
	rc = test_daemon_start(td, cfg);
	CHECK(rc == 0, "starting %s with copy_engine cuda: %d; log ends: %s",
	    test_path("l3kvd", bin, sizeof(bin)), rc, gd_log_tail(td));
	CHECK(test_daemon_log_has(td, "cuda copy engine on GPU 0"), "l3kvd did not start the "
	    "cuda copy engine; log ends: %s", gd_log_tail(td));
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED, "mmap: %s", strerror(errno));
	return sh;
}

/*
 * STATS copy.last_restore (issue 16): the last RESTORE's timeline, every
 * host stage known and in order (the GPU stamps need L3KV_CUDA_TIMELINE).
 */
static void
gd_check_timeline(const char *sock)
{
	static const char *const stage[] = { "arrive", "handled", "submit", "first_issue",
	    "last_issue", "done", "reply" };
	struct l3kv	*k = NULL;
	json_error_t	 jerr;
	json_t		*j, *t, *v;
	char		*text = NULL;
	long long	 prev = 0, n;
	unsigned	 i;

	CHECK(l3kv_connect(sock, 5000, &k) == 0, "connect for STATS");
	CHECK(l3kv_stats(k, &text) == 0, "STATS");
	j = json_loads(text, 0, &jerr);
	CHECK(j != NULL, "STATS is not JSON: %s", jerr.text);
	t = json_object_get(json_object_get(j, "copy"), "last_restore");
	CHECK(json_is_object(t), "STATS copy.last_restore missing");
	for (i = 0; i < sizeof(stage) / sizeof(stage[0]); i++) {
		v = json_object_get(t, stage[i]);
		CHECK(json_is_integer(v), "STATS copy.last_restore.%s missing", stage[i]);
		n = json_integer_value(v);
		CHECK(n > 0 && n >= prev, "copy.last_restore.%s = %lld, after %lld", stage[i], n,
		    prev);
		prev = n;
	}
	v = json_object_get(t, "notify");
	CHECK(json_is_integer(v) && json_integer_value(v) > 0, "copy.last_restore.notify");
	json_decref(j);
	l3kv_free(text);
	l3kv_close(k);
}

START_TEST(test_gpu_daemon_publishes_and_restores_device_memory)
{
	struct test_daemon	 td;
	struct gd_share		*sh = gd_start(&td, "256 MiB");

	/*
	 * 48 pages of 1 MiB each way, and one page under two hashes (50 in
	 * all); then again from a second engine process.
	 */
	gd_wait_engine(gd_fork_engine(&td, sh, GD_ROUND_TRIP, 48, 1, -1, -1), sh, "first engine");
	EQ(gd_stat(td.sock, "cache", "pages_restored"), 50);
	gd_check_timeline(td.sock);
	EQ(gd_stat(td.sock, "cache", "pages_published"), 50);
	gd_wait_engine(gd_fork_engine(&td, sh, GD_ROUND_TRIP, 48, 2, -1, -1), sh, "second engine");
	EQ(gd_stat(td.sock, "cache", "pages_restored"), 100);
	/* A corrupt object: the restore fails as lost, its page untouched. */
	gd_wait_engine(gd_fork_engine(&td, sh, GD_CORRUPT, 16, 6, -1, -1), sh, "corrupt");
	EQ(gd_stat(td.sock, "cache", "objects_lost"), 1);
	EQ(gd_stat(td.sock, "cache", "pages_restored"), 100);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

START_TEST(test_gpu_daemon_restores_into_a_cumem_fd_region)
{
	struct test_daemon	 td;
	struct gd_share		*sh = gd_start(&td, "256 MiB");

	/* The region is a cuMem allocation whose POSIX fd went over the socket. */
	gd_wait_engine(gd_fork_engine(&td, sh, GD_ROUND_TRIP | GD_F_CUMEM, 32, 7, -1, -1), sh,
	    "cuMem engine");
	EQ(gd_stat(td.sock, "cache", "pages_restored"), 34);
	EQ(gd_stat(td.sock, "cache", "pages_published"), 34);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

START_TEST(test_gpu_daemon_restore_waits_for_the_engine_event)
{
	struct test_daemon	 td;
	struct gd_share		*sh = gd_start(&td, "256 MiB");

	gd_wait_engine(gd_fork_engine(&td, sh, GD_EVENT, 16, 8, -1, -1), sh, "event engine");
	fprintf(stderr, "gpu: without the event wait the engine's late kernel overwrote %u of 16 "
	    "restored pages; with it, none (the RESTORE took %.0f ms behind a %u ms kernel)\n",
	    sh->clobbered, sh->wait_ms, (unsigned)GD_LATE_MS);
	EQ(gd_stat_wait(td.sock, "memory", "events_open", 0), 0);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

START_TEST(test_gpu_daemon_live_state_slot_survives_a_hybrid_restore)
{
	struct test_daemon	 td;
	struct gd_share		*sh = gd_start(&td, "256 MiB");

	gd_wait_engine(gd_fork_engine(&td, sh, GD_STATE, 4, 9, -1, -1), sh, "hybrid engine");
	EQ(gd_stat(td.sock, "cache", "pages_restored"), 4);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

START_TEST(test_gpu_daemon_cancel_is_answered_after_the_copies)
{
	struct test_daemon	 td;
	struct gd_share		*sh = gd_start(&td, "1 GiB");

	/*
	 * 512 MiB to restore, 16 chunks of 32 MiB in 4 staging slots: the
	 * CANCEL right behind it finds chunks still to issue (if it does not,
	 * all landed, and the engine checks that instead).
	 */
	gd_wait_engine(gd_fork_engine(&td, sh, GD_CANCEL, 512, 3, -1, -1), sh, "engine");
	fprintf(stderr, "gpu: CANCEL behind a 512-page restore: %u pages landed, restore %d\n",
	    sh->landed, sh->restore_rc);
	EQ(gd_stat(td.sock, "cache", "pages_restored"), sh->restore_rc == 0 ? 512 : 0);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

/*
 * Forks an engine in mode (GD_KILLED or GD_EVENT_KILLED), kills it once
 * it has submitted its RESTORE, and checks that its session drains (no
 * lease, pin, mapping or event left) and that a new engine is served
 * byte for byte afterwards.
 */
static void
gd_kill_case(struct test_daemon *td, struct gd_share *sh, int mode, uint32_t n,
    uint32_t prefix)
{
	struct timespec	 t0, t1;
	struct pollfd	 pfd;
	pid_t		 pid;
	char		 c = 0;
	int		 p[2], st = 0;

	CHECK(pipe(p) == 0, "pipe: %s", strerror(errno));
	pid = gd_fork_engine(td, sh, mode, n, prefix, p[0], p[1]);
	close(p[1]);
	pfd.fd = p[0];
	pfd.events = POLLIN;
	if (poll(&pfd, 1, 60000) != 1 || read(p[0], &c, 1) != 1 || c != 'S') {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		CHECK(0, "the engine never submitted its restore: status %#x: %s", st, sh->err);
	}
	kill(pid, SIGKILL);
	CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
	close(p[0]);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* The session drains: no lease, no pin, no mapping, no event left. */
	EQ(gd_stat_wait(td->sock, "cache", "leases_open", 0), 0);
	EQ(gd_stat_wait(td->sock, "dram", "pins", 0), 0);
	EQ(gd_stat_wait(td->sock, "memory", "regions_mapped", 0), 0);
	EQ(gd_stat_wait(td->sock, "memory", "events_open", 0), 0);
	EQ(gd_stat_wait(td->sock, "copy", "waiting_on_events", 0), 0);
	EQ(gd_stat_wait(td->sock, "copy", "jobs_inflight", 0), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fprintf(stderr, "gpu: engine killed (%s): its session drained in %.0f ms\n",
	    mode == GD_KILLED ? "mid-restore" : "its RESTORE waiting on its own event",
	    (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
	/* And the daemon still serves a GPU engine, byte for byte. */
	gd_wait_engine(gd_fork_engine(td, sh, GD_ROUND_TRIP, 32, prefix + 100, -1, -1), sh,
	    "engine after the kill");
}

START_TEST(test_gpu_daemon_survives_an_engine_killed_mid_restore)
{
	struct test_daemon	 td;
	struct gd_share		*sh = gd_start(&td, "512 MiB");

	gd_kill_case(&td, sh, GD_KILLED, 256, 4);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

/*
 * The engine dies while its RESTORE waits on the engine's own event,
 * recorded behind a kernel that dies with it (the event never
 * completes): the session must still drain and the daemon's streams stay
 * usable.
 */
START_TEST(test_gpu_daemon_survives_an_engine_killed_while_its_event_is_pending)
{
	struct test_daemon	 td;
	struct gd_share		*sh = gd_start(&td, "256 MiB");

	gd_kill_case(&td, sh, GD_EVENT_KILLED, 16, 10);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

/*
 * Several copy engines (issue 17). One GPU is lent here, so the daemon
 * runs with testing.cuda_engines_per_gpu 2: engines 0 and 1, both on GPU
 * 0, are two devices of the code path (each its own kernels_engine:
 * streams, staging ring, waiter thread), and a rank names its engine by
 * its device claim (l3kv_set_device). A group is MLA TP 2 / DCP 2: each
 * rank publishes its own shard (its own namespace) and restores it into
 * its own device memory; the group is READY when both engines are done.
 */
#define GM_RANKS	2

enum gm_mode {
	GM_PARALLEL = 1,	/* both ranks restore; every byte checked */
	GM_CANCEL,		/* rank 0 cancels its restore at once */
	GM_KILL,		/* rank 1's copy engine dies (DEBUG) behind its RESTORE */
};

struct gm_share {
	char		err[GM_RANKS][512];
	int		restore_rc[GM_RANKS];	/* the RESTORE's status */
	uint32_t	landed;			/* GM_CANCEL: CANCEL's pages_landed */
};

#define GM_FAIL(code, ...) do {						\
	snprintf(sh->err[rank], sizeof(sh->err[rank]), __VA_ARGS__);	\
	return (code);							\
} while (0)

/* Waits (bounded) for the completion of ticket; its status, or 1 when none came. */
static int
gm_wait_ticket(struct l3kv *k, uint64_t ticket)
{
	struct l3kv_completion	c;
	struct pollfd		pfd = { .fd = l3kv_fd(k), .events = POLLIN };
	int			rc, tries, st;

	for (tries = 0; (rc = l3kv_poll_completion(k, &c)) == -EAGAIN && tries < 3000; tries++)
		poll(&pfd, 1, 20);
	if (rc != 0 || c.ticket != ticket)
		return 1;
	st = c.status;
	l3kv_completion_release(&c);
	return st;
}

/* One rank of the group: n pages published from its device memory, then restored. */
static int
gm_rank(const char *sock, struct gm_share *sh, int mode, unsigned rank, uint32_t n,
    uint32_t prefix)
{
	struct l3kv_publish_result	 pr;
	struct l3kv_admit_result	 ar;
	struct l3kv_admit_args		 aa;
	struct l3kv_attach_args		 args;
	struct l3kv_publish_page	*pg;
	struct l3kv_region		 reg;
	struct l3kv_pool		 pool;
	struct l3kv			*k = NULL;
	uint8_t				*before, *after, *hashes, zero[L3KV_HASH_LEN] = { 0 };
	uint32_t			*dst, pages = 2 * n, i, landed = n;
	uint64_t			 ticket;
	size_t				 bytes = (size_t)pages * GD_OBJ;
	void				*d = NULL;
	char				 err[256] = "";
	int				 rc;

	before = malloc(bytes);
	after = malloc(bytes);
	pg = calloc(n, sizeof(*pg));
	hashes = malloc((size_t)n * L3KV_HASH_LEN);
	dst = calloc(n, sizeof(*dst));
	if (before == NULL || after == NULL || pg == NULL || hashes == NULL || dst == NULL)
		GM_FAIL(2, "rank %u: out of memory", rank);
	if ((rc = kernels_init(0, err, sizeof(err))) != 0)
		GM_FAIL(3, "rank %u: kernels_init: %d %s", rank, rc, err);
	if ((rc = kernels_dev_alloc(bytes, &d, err, sizeof(err))) != 0)
		GM_FAIL(4, "rank %u: allocating %zu bytes: %d %s", rank, bytes, rc, err);
	gpu_rnd_fill(before, bytes);
	if ((rc = kernels_copy(d, before, bytes, err, sizeof(err))) != 0)
		GM_FAIL(5, "rank %u: kernels_copy to the device: %d %s", rank, rc, err);
	pool = (struct l3kv_pool){ "kv", L3KV_POOL_KV, L3KV_HIT_ALL_PAGES, 0, GD_LAYERS, GD_OBJ,
	    "latent:1024:fp8_e4m3" };
	memset(&reg, 0, sizeof(reg));
	reg = (struct l3kv_region){ .pool = 0, .kind = L3KV_MEM_CUDA_IPC,
	    .layout = L3KV_LAYOUT_LAYER_FIRST, .fd = -1, .size = bytes, .num_pages = pages,
	    .page_tokens = GD_TOKENS, .layers = GD_LAYERS, .token_bytes = GD_TOKEN_BYTES,
	    .page_stride = GD_BLOCK, .layer_stride = (uint64_t)pages * GD_BLOCK,
	    .token_stride = GD_TOKEN_BYTES };
	if ((rc = kernels_ipc_export(d, reg.handle, err, sizeof(err))) != 0)
		GM_FAIL(6, "rank %u: kernels_ipc_export: %d %s", rank, rc, err);
	memset(&args, 0, sizeof(args));
	args.layout = (struct l3kv_layout){ .model = "gpu-multi-test", .kv_dtype = "fp8_e4m3",
	    .hash_scheme = "sha256", .hash_len = 32, .tp_size = GM_RANKS, .dcp_size = GM_RANKS,
	    .dcp_rank = rank, .pp_size = 1, .cp_size = 1, .host_layout = L3KV_LAYOUT_PAGE_FIRST,
	    .attention = L3KV_ATTN_MLA, .page_tokens = GD_TOKENS,
	    .logical_page_tokens = GD_TOKENS * GM_RANKS };
	args.pools = &pool;
	args.npools = 1;
	args.regions = &reg;
	args.nregions = 1;
	args.group = "gpu-multi";
	args.group_size = GM_RANKS;
	args.group_rank = rank;
	args.tp_rank = rank;
	args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	args.write = L3KV_WRITE_THROUGH;
	if ((rc = l3kv_connect(sock, 10000, &k)) != 0)
		GM_FAIL(7, "rank %u: connect: %d", rank, rc);
	l3kv_set_timeout(k, 60000);
	/* This rank's copy engine: device `rank` (two engines on GPU 0). */
	if ((rc = l3kv_set_device(k, (int)rank)) != 0 || (rc = l3kv_attach(k, &args, NULL)) != 0)
		GM_FAIL(8, "rank %u: ATTACH claiming device %u: %d %s", rank, rank, rc,
		    l3kv_last_error(k));
	for (i = 0; i < n; i++) {
		test_page_hash(prefix, i, pg[i].hash);
		memcpy(hashes + (size_t)i * L3KV_HASH_LEN, pg[i].hash, L3KV_HASH_LEN);
		pg[i].src_page = i;
		dst[i] = pages - 1 - i;
	}
	if ((rc = l3kv_publish(k, 0, pg, n, &pr)) != 0 || pr.stored != n)
		GM_FAIL(9, "rank %u: PUBLISH of its shard: %d %s, stored %u", rank, rc,
		    l3kv_last_error(k), pr.stored);
	memset(&aa, 0, sizeof(aa));
	aa.request_id = prefix;
	aa.hashes = hashes;
	aa.npages = n;
	aa.reserved_pages = n;
	aa.state_slot = L3KV_SLOT_NONE;
	/* The group barrier: both ranks admit the request. */
	if ((rc = l3kv_admit(k, &aa, &ar)) != 0 || ar.admitted_pages != n)
		GM_FAIL(11, "rank %u: ADMIT: %d %s, %u of %u pages (decline %d)", rank, rc,
		    l3kv_last_error(k), ar.admitted_pages, n, ar.decline);
	if ((rc = l3kv_submit_restore(k, ar.lease, 0, dst, n, &ticket)) != 0)
		GM_FAIL(14, "rank %u: submitting RESTORE: %d", rank, rc);
	if (mode == GM_CANCEL && rank == 0) {
		if ((rc = l3kv_cancel(k, ar.lease, &landed)) != 0)
			GM_FAIL(16, "rank %u: CANCEL: %d %s", rank, rc, l3kv_last_error(k));
		sh->landed = landed;
	}
	if (mode == GM_KILL && rank == 1 &&
	    (rc = l3kv_debug(k, L3KV_DEBUG_KILL_ENGINE, 0, zero)) != 0)
		GM_FAIL(26, "rank %u: DEBUG kill_engine: %d %s", rank, rc, l3kv_last_error(k));
	sh->restore_rc[rank] = gm_wait_ticket(k, ticket);
	if (sh->restore_rc[rank] == 1)
		GM_FAIL(19, "rank %u: no RESTORE completion", rank);
	if (mode == GM_PARALLEL && sh->restore_rc[rank] != 0)
		GM_FAIL(12, "rank %u: RESTORE: %d", rank, sh->restore_rc[rank]);
	if ((rc = kernels_copy(after, d, bytes, err, sizeof(err))) != 0)
		GM_FAIL(17, "rank %u: kernels_copy back: %d %s", rank, rc, err);
	for (i = 0; i < n; i++) {
		if (!gd_page_is(after, i, before, i, pages))
			GM_FAIL(21, "rank %u: source page %u changed", rank, i);
		if (mode == GM_PARALLEL && !gd_page_is(after, dst[i], before, i, pages))
			GM_FAIL(22, "rank %u: restored page %u (region page %u) differs from the "
			    "published one", rank, i, dst[i]);
	}
	if (sh->restore_rc[rank] == 0 && (rc = l3kv_release(k, ar.lease)) != 0)
		GM_FAIL(24, "rank %u: RELEASE: %d %s", rank, rc, l3kv_last_error(k));
	l3kv_close(k);
	kernels_dev_free(d);
	free(before);
	free(after);
	free(pg);
	free(hashes);
	free(dst);
	return 0;
}

/* A counter of STATS copy.devices[dev]. */
static long long
gm_dev_stat(const char *sock, unsigned dev, const char *key)
{
	struct l3kv	*k = NULL;
	json_error_t	 jerr;
	json_t		*j, *v;
	char		*text = NULL;
	long long	 n;

	CHECK(l3kv_connect(sock, 5000, &k) == 0, "connect for STATS");
	CHECK(l3kv_stats(k, &text) == 0, "STATS");
	j = json_loads(text, 0, &jerr);
	CHECK(j != NULL, "STATS is not JSON: %s", jerr.text);
	v = json_array_get(json_object_get(json_object_get(j, "copy"), "devices"), dev);
	if (strchr(key, '.') != NULL)
		v = json_object_get(json_object_get(v, "last_restore"), strchr(key, '.') + 1);
	else
		v = json_object_get(v, key);
	CHECK(json_is_integer(v) || json_is_boolean(v), "STATS copy.devices[%u].%s missing",
	    dev, key);
	n = json_is_boolean(v) ? json_is_true(v) : json_integer_value(v);
	json_decref(j);
	l3kv_free(text);
	l3kv_close(k);
	return n;
}

static void
gm_start(struct test_daemon *td, unsigned per_gpu)
{
	char	cfg[320], bin[PATH_MAX];
	int	rc;

	gpu_rnd_init();
	snprintf(cfg, sizeof(cfg), "{\"copy_engine\": \"cuda\", \"testing\": {\"debug_ops\": "
	    "true, \"cuda_engines_per_gpu\": %u}, \"admit\": {\"timeout_ms\": 30000}, "
	    "\"tiers\": {\"dram\": {\"size\": \"1 GiB\"}}}", per_gpu);
	rc = test_daemon_start(td, cfg);
	CHECK(rc == 0, "starting %s with copy_engine cuda: %d; log ends: %s",
	    test_path("l3kvd", bin, sizeof(bin)), rc, gd_log_tail(td));
	CHECK(test_daemon_log_has(td, "cuda copy engine on GPU 0"), "l3kvd did not start the "
	    "cuda copy engine; log ends: %s", gd_log_tail(td));
}

/* Runs both ranks of a group at once; their exit statuses must be 0. */
static void
gm_group(struct test_daemon *td, struct gm_share *sh, int mode, uint32_t n, uint32_t prefix)
{
	pid_t		pid[GM_RANKS];
	unsigned	r;
	int		st;

	memset(sh, 0, sizeof(*sh));
	for (r = 0; r < GM_RANKS; r++) {
		pid[r] = fork();
		CHECK(pid[r] >= 0, "fork: %s", strerror(errno));
		if (pid[r] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			_exit(gm_rank(td->sock, sh, mode, r, n, prefix));
		}
	}
	for (r = 0; r < GM_RANKS; r++) {
		st = 0;
		CHECK(waitpid(pid[r], &st, 0) == pid[r], "waitpid: %s", strerror(errno));
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %u: status %#x: %s", r, st,
		    sh->err[r]);
	}
}

/* Every device's copies drained: nothing in flight on either engine. */
static void
gm_drained(const char *sock)
{
	unsigned	r;

	EQ(gd_stat_wait(sock, "copy", "jobs_inflight", 0), 0);
	for (r = 0; r < GM_RANKS; r++) {
		EQ(gm_dev_stat(sock, r, "jobs_inflight"), 0);
		EQ(gm_dev_stat(sock, r, "staging_in_use"), 0);
	}
}

START_TEST(test_gpu_multi_group_restores_on_two_engines_in_parallel)
{
	struct test_daemon	 td;
	struct gm_share		*sh;
	long long		 s0, d0, s1, d1, b0, b1;
	uint32_t		 n = 128;	/* 128 MiB a rank */
	unsigned		 r;

	gm_start(&td, 2);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED, "mmap: %s", strerror(errno));
	/* Before any region: two engines known, none started. */
	EQ(gm_dev_stat(td.sock, 0, "started"), 0);
	EQ(gm_dev_stat(td.sock, 1, "gpu"), 0);
	gm_group(&td, sh, GM_PARALLEL, n, 11);
	for (r = 0; r < GM_RANKS; r++) {
		EQ(gm_dev_stat(td.sock, r, "started"), 1);
		/* each engine did its own rank's publish and restore, and nothing else */
		EQ(gm_dev_stat(td.sock, r, "restores"), 1);
		EQ(gm_dev_stat(td.sock, r, "publishes"), 1);
		EQ(gm_dev_stat(td.sock, r, "failed"), 0);
		EQ(gm_dev_stat(td.sock, r, "bytes"), 2LL * n * (long long)GD_OBJ);
	}
	EQ(gd_stat(td.sock, "cache", "pages_restored"), 2 * n);
	s0 = gm_dev_stat(td.sock, 0, "last_restore.submit");
	d0 = gm_dev_stat(td.sock, 0, "last_restore.done");
	s1 = gm_dev_stat(td.sock, 1, "last_restore.submit");
	d1 = gm_dev_stat(td.sock, 1, "last_restore.done");
	b0 = gm_dev_stat(td.sock, 0, "last_restore.first_issue");
	b1 = gm_dev_stat(td.sock, 1, "last_restore.first_issue");
	CHECK(s0 > 0 && d0 > s0 && s1 > 0 && d1 > s1 && b0 > 0 && b1 > 0,
	    "per-device timelines: %lld..%lld, %lld..%lld", s0, d0, s1, d1);
	fprintf(stderr, "gpu: a TP 2 / DCP 2 group on two engines of GPU 0, %u MiB a rank: "
	    "engine 0 %.3f..%.3f ms, engine 1 %.3f..%.3f ms (from the first submit); the two "
	    "copies %s\n", n, 0.0, (d0 - s0) / 1e6, (s1 - s0) / 1e6, (d1 - s0) / 1e6,
	    s1 < d0 && s0 < d1 ? "overlapped" : "did not overlap");
	gm_drained(td.sock);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

START_TEST(test_gpu_multi_cancel_on_one_engine_fails_the_group_after_both_drained)
{
	struct test_daemon	 td;
	struct gm_share		*sh;

	gm_start(&td, 2);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED, "mmap: %s", strerror(errno));
	gm_group(&td, sh, GM_CANCEL, 256, 12);
	fprintf(stderr, "gpu: CANCEL on rank 0 of a two-engine group: %u pages landed; "
	    "rank 0 %d, rank 1 %d\n", sh->landed, sh->restore_rc[0], sh->restore_rc[1]);
	/* The cancel fails the group: the other engine's rank is not answered READY. */
	CHECK(sh->restore_rc[0] == -ECANCELED, "rank 0's RESTORE after its CANCEL: %d",
	    sh->restore_rc[0]);
	CHECK(sh->restore_rc[1] != 0, "rank 1 was answered READY though rank 0 cancelled");
	EQ(gd_stat(td.sock, "cache", "pages_restored"), 0);
	gm_drained(td.sock);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

START_TEST(test_gpu_multi_dead_engine_fails_the_group_after_both_drained)
{
	struct test_daemon	 td;
	struct gm_share		*sh;

	gm_start(&td, 2);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED, "mmap: %s", strerror(errno));
	gm_group(&td, sh, GM_KILL, 256, 13);
	fprintf(stderr, "gpu: engine 1 killed behind rank 1's RESTORE: rank 0 %d, rank 1 %d\n",
	    sh->restore_rc[0], sh->restore_rc[1]);
	CHECK(sh->restore_rc[1] == -EIO, "rank 1's RESTORE on the dead engine: %d, want -EIO",
	    sh->restore_rc[1]);
	CHECK(sh->restore_rc[0] != 0, "rank 0 was answered READY though engine 1 died");
	EQ(gm_dev_stat(td.sock, 1, "failed"), 1);
	EQ(gd_stat(td.sock, "cache", "pages_restored"), 0);
	gm_drained(td.sock);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

/* An engine process attaching with a device claim; the ATTACH's result. */
static int
gm_claim(const char *sock, int device, char *why, size_t len)
{
	struct l3kv_attach_args	 args;
	struct l3kv_region	 reg;
	struct l3kv_pool	 pool;
	struct l3kv		*k = NULL;
	size_t			 bytes = 4 * GD_OBJ;
	void			*d = NULL;
	char			 err[256] = "";
	int			 rc;

	if ((rc = kernels_init(0, err, sizeof(err))) != 0 ||
	    (rc = kernels_dev_alloc(bytes, &d, err, sizeof(err))) != 0) {
		snprintf(why, len, "CUDA: %d %s", rc, err);
		return 1000;
	}
	pool = (struct l3kv_pool){ "kv", L3KV_POOL_KV, L3KV_HIT_ALL_PAGES, 0, GD_LAYERS, GD_OBJ,
	    "latent:1024:fp8_e4m3" };
	reg = (struct l3kv_region){ .pool = 0, .kind = L3KV_MEM_CUDA_IPC,
	    .layout = L3KV_LAYOUT_LAYER_FIRST, .fd = -1, .size = bytes, .num_pages = 4,
	    .page_tokens = GD_TOKENS, .layers = GD_LAYERS, .token_bytes = GD_TOKEN_BYTES,
	    .page_stride = GD_BLOCK, .layer_stride = 4 * GD_BLOCK, .token_stride = GD_TOKEN_BYTES };
	if ((rc = kernels_ipc_export(d, reg.handle, err, sizeof(err))) != 0) {
		snprintf(why, len, "kernels_ipc_export: %d %s", rc, err);
		return 1000;
	}
	memset(&args, 0, sizeof(args));
	args.layout = (struct l3kv_layout){ .model = "gpu-claim-test", .kv_dtype = "fp8_e4m3",
	    .hash_scheme = "sha256", .hash_len = 32, .tp_size = 1, .dcp_size = 1, .pp_size = 1,
	    .cp_size = 1, .host_layout = L3KV_LAYOUT_PAGE_FIRST, .attention = L3KV_ATTN_MLA,
	    .page_tokens = GD_TOKENS, .logical_page_tokens = GD_TOKENS };
	args.pools = &pool;
	args.npools = 1;
	args.regions = &reg;
	args.nregions = 1;
	args.group = "gpu-claim";
	args.group_size = 1;
	args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	args.write = L3KV_WRITE_THROUGH;
	if ((rc = l3kv_connect(sock, 10000, &k)) != 0) {
		snprintf(why, len, "connect: %d", rc);
		return 1000;
	}
	l3kv_set_device(k, device);
	rc = l3kv_attach(k, &args, NULL);
	snprintf(why, len, "%s (status %d)", l3kv_last_error(k), l3kv_last_status(k));
	if (rc == 0 || l3kv_last_status(k) == PROTO_S_WRONG_DEVICE)
		rc = rc == 0 ? 0 : -ENXIO;
	l3kv_close(k);
	kernels_dev_free(d);
	return rc;
}

/* Forks gm_claim (the test process keeps off CUDA); its result, -rc as the exit code. */
static int
gm_fork_claim(const char *sock, int device, struct gm_share *sh)
{
	pid_t	pid;
	int	st = 0;

	memset(sh, 0, sizeof(*sh));
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(-gm_claim(sock, device, sh->err[0], sizeof(sh->err[0])) & 0xff);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st), "claim process: %#x", st);
	return -WEXITSTATUS(st);
}

/* "GPU-" and 8-4-4-4-12 lower-case hex digits, as nvidia-smi -L prints a GPU's UUID. */
static int
gpu_uuid_well_formed(const char *u)
{
	static const char	pat[] = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
	size_t			i;

	if (u == NULL || strlen(u) != sizeof(pat) - 1)
		return 0;
	for (i = 0; pat[i] != '\0'; i++)
		if (pat[i] == 'x' ? !isxdigit((unsigned char)u[i]) || isupper((unsigned char)u[i]) :
		    u[i] != pat[i])
			return 0;
	return 1;
}

/* STATS (stats 1) or HEALTH of the daemon at sock, parsed. */
static json_t *
gm_document(const char *sock, int stats)
{
	struct l3kv	*k = NULL;
	json_error_t	 jerr;
	json_t		*j;
	char		*text = NULL;

	CHECK(l3kv_connect(sock, 5000, &k) == 0, "connect");
	CHECK((stats ? l3kv_stats(k, &text) : l3kv_health(k, &text)) == 0, "STATS/HEALTH");
	j = json_loads(text, 0, &jerr);
	CHECK(j != NULL, "not JSON: %s", jerr.text);
	l3kv_free(text);
	l3kv_close(k);
	return j;
}

/*
 * Every device names its GPU by UUID, what the driver says of the GPU in
 * another process (asked in a child: the test process keeps off CUDA),
 * in STATS copy.devices[].uuid and in HEALTH device_uuids, in device
 * order; two engines of one GPU share it.
 */
START_TEST(test_gpu_multi_devices_are_named_by_their_gpu_uuid)
{
	struct test_daemon	 td;
	struct gm_share		*sh;
	json_t			*st, *h, *devs;
	const char		*u;
	pid_t			 pid;
	unsigned		 i;
	int			 status = 0;

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED, "mmap: %s", strerror(errno));
	memset(sh, 0, sizeof(*sh));
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(kernels_device_uuid(0, sh->err[0], sizeof(sh->err[0]), sh->err[1],
		    sizeof(sh->err[1])) == 0 ? 0 : 1);
	}
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	    "kernels_device_uuid(0): %#x %s", status, sh->err[1]);
	CHECK(gpu_uuid_well_formed(sh->err[0]), "kernels_device_uuid(0): \"%s\"", sh->err[0]);
	gm_start(&td, 2);
	st = gm_document(td.sock, 1);
	h = gm_document(td.sock, 0);
	devs = json_object_get(json_object_get(st, "copy"), "devices");
	EQ(json_array_size(devs), 2);
	EQ(json_array_size(json_object_get(h, "device_uuids")), 2);
	for (i = 0; i < 2; i++) {
		u = json_string_value(json_object_get(json_array_get(devs, i), "uuid"));
		CHECK(u != NULL && strcmp(u, sh->err[0]) == 0, "copy.devices[%u].uuid %s, GPU 0 is %s",
		    i, u != NULL ? u : "(absent)", sh->err[0]);
		u = json_string_value(json_array_get(json_object_get(h, "device_uuids"), i));
		CHECK(u != NULL && strcmp(u, sh->err[0]) == 0, "HEALTH device_uuids[%u] %s", i,
		    u != NULL ? u : "(not a string)");
	}
	json_decref(st);
	json_decref(h);
	CHECK(test_daemon_log_has(&td, sh->err[0]), "the log does not name %s", sh->err[0]);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST

START_TEST(test_gpu_multi_attach_checks_the_device_claim)
{
	struct test_daemon	 td;
	struct gm_share		*sh;
	int			 rc;

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED, "mmap: %s", strerror(errno));
	/* One engine per GPU: memory on GPU 0 claimed as device 1 is refused. */
	gm_start(&td, 1);
	rc = gm_fork_claim(td.sock, 1, sh);
	CHECK(rc == -ENXIO, "claim 1 on a one-GPU daemon: %d, %s", rc, sh->err[0]);
	CHECK(strstr(sh->err[0], "wrong_device") != NULL || strstr(sh->err[0], "device 1") != NULL,
	    "the refusal says why: %s", sh->err[0]);
	EQ(gd_stat(td.sock, "memory", "regions_mapped"), 0);
	EQ(gm_dev_stat(td.sock, 0, "started"), 0);
	/* No claim, and the right claim: both take engine 0. */
	rc = gm_fork_claim(td.sock, L3KV_DEVICE_ANY, sh);
	CHECK(rc == 0, "no claim: %d, %s", rc, sh->err[0]);
	rc = gm_fork_claim(td.sock, 0, sh);
	CHECK(rc == 0, "claim 0: %d, %s", rc, sh->err[0]);
	EQ(gm_dev_stat(td.sock, 0, "started"), 1);
	gd_daemon_done(&td);
	/* Two engines on the GPU: device 1 is served by engine 1, device 2 does not exist. */
	gm_start(&td, 2);
	rc = gm_fork_claim(td.sock, 1, sh);
	CHECK(rc == 0, "claim 1 with two engines: %d, %s", rc, sh->err[0]);
	EQ(gm_dev_stat(td.sock, 1, "started"), 1);
	EQ(gm_dev_stat(td.sock, 0, "started"), 0);
	rc = gm_fork_claim(td.sock, 2, sh);
	CHECK(rc == -ENXIO, "claim 2 with engines 0..1: %d, %s", rc, sh->err[0]);
	gd_daemon_done(&td);
	munmap(sh, sizeof(*sh));
}
END_TEST


Suite *
suite_gpu(void)
{
	Suite	*s = suite_create("gpu");
	TCase	*tc = tcase_create("gpu");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_gpu_restore_mla_layer_first);
	tcase_add_test(tc, test_gpu_restore_mla_page_first);
	tcase_add_test(tc, test_gpu_restore_per_layer_buffers);
	tcase_add_test(tc, test_gpu_restore_mha_k_and_v);
	tcase_add_test(tc, test_gpu_restore_narrow_geometries);
	tcase_add_test(tc, test_gpu_corrupt_object_reported_and_not_written);
	tcase_add_test(tc, test_gpu_checksum_kernel_equals_checksum_obj);
	tcase_add_test(tc, test_gpu_publish_round_trip);
	tcase_add_test(tc, test_gpu_cancel_leaves_later_pages_untouched);
	tcase_add_test(tc, test_gpu_gated_restore_waits_for_its_event_or_drops_at_cancel);
	tcase_add_test(tc, test_gpu_notify_eventfd_drives_completion);
	tcase_add_test(tc, test_gpu_batched_dma_restores_and_publishes);
	tcase_add_test(tc, test_gpu_submit_rejects_bad_input);
	tcase_add_test(tc, test_gpu_restore_while_a_busy_kernel_holds_the_gpu);
	tcase_add_test(tc, test_gpu_ipc_memory_from_a_second_process);
	tcase_add_test(tc, test_gpu_cumem_fd_from_a_second_process);
	tcase_add_test(tc, test_gpu_daemon_publishes_and_restores_device_memory);
	tcase_add_test(tc, test_gpu_daemon_restores_into_a_cumem_fd_region);
	tcase_add_test(tc, test_gpu_daemon_restore_waits_for_the_engine_event);
	tcase_add_test(tc, test_gpu_daemon_live_state_slot_survives_a_hybrid_restore);
	tcase_add_test(tc, test_gpu_daemon_cancel_is_answered_after_the_copies);
	tcase_add_test(tc, test_gpu_daemon_survives_an_engine_killed_mid_restore);
	tcase_add_test(tc, test_gpu_daemon_survives_an_engine_killed_while_its_event_is_pending);
	tcase_add_test(tc, test_gpu_multi_attach_checks_the_device_claim);
	tcase_add_test(tc, test_gpu_multi_devices_are_named_by_their_gpu_uuid);
	tcase_add_test(tc, test_gpu_multi_group_restores_on_two_engines_in_parallel);
	tcase_add_test(tc, test_gpu_multi_cancel_on_one_engine_fails_the_group_after_both_drained);
	tcase_add_test(tc, test_gpu_multi_dead_engine_fails_the_group_after_both_drained);
	suite_add_tcase(s, tc);
	return s;
}

/* ---- gpu_host: the kernels' XXH3 as host code, everywhere ---------------- */

START_TEST(test_xxh3_equals_libxxhash_at_every_length_to_4k)
{
	size_t		 len, off;
	uint8_t		*b = malloc(4096 + 8);
	uint64_t	 want;

	gpu_rnd_init();
	CHECK(b != NULL, "malloc");
	gpu_rnd_fill(b, 4096 + 8);
	for (len = 0; len <= 4096; len++) {
		for (off = 0; off < 4; off++) {
			want = XXH3_64bits(b + off, len);
			CHECK(xxh3g_64(b + off, len) == want, "scalar, %zu bytes at +%zu", len, off);
			CHECK(len <= XXH3G_MIDSIZE_MAX || xxh3g_long_emul(b + off, len) == want,
			    "warp model, %zu bytes at +%zu", len, off);
		}
	}
	free(b);
}
END_TEST

START_TEST(test_xxh3_equals_libxxhash_at_block_and_chunk_edges)
{
	size_t		 max = 300000, lens[400], n = 0, i, k;
	uint8_t		*b = malloc(max);
	uint64_t	 want;

	gpu_rnd_init();
	CHECK(b != NULL, "malloc");
	gpu_rnd_fill(b, max);
	/* around every block (1024) to 70 blocks, and the 64 KiB chunk */
	for (k = 1; k <= 70; k++) {
		lens[n++] = k * XXH3G_BLOCK - 1;
		lens[n++] = k * XXH3G_BLOCK;
		lens[n++] = k * XXH3G_BLOCK + 1;
		lens[n++] = k * XXH3G_BLOCK + 64;
	}
	lens[n++] = XXH3G_CHUNK - 1;
	lens[n++] = XXH3G_CHUNK;
	lens[n++] = XXH3G_CHUNK + 1;
	lens[n++] = XXH3G_CHUNK + 240;
	lens[n++] = XXH3G_CHUNK + 241;
	while (n < sizeof(lens) / sizeof(lens[0]))
		lens[n++] = 241 + gpu_rnd() % (max - 241 - 8);
	for (i = 0; i < n; i++) {
		size_t off = gpu_rnd() % 8;

		want = XXH3_64bits(b + off, lens[i]);
		CHECK(xxh3g_64(b + off, lens[i]) == want, "scalar, %zu bytes", lens[i]);
		CHECK(xxh3g_long_emul(b + off, lens[i]) == want, "warp model, %zu bytes", lens[i]);
	}
	free(b);
}
END_TEST

START_TEST(test_xxh3_checksum_equals_checksum_obj)
{
	size_t		 max = 9 * GPU_MIB + 1, lens[] = { 0, 1, 240, 241, 65535, 65536, 65537,
	    2248704, 4 * GPU_MIB, 9 * GPU_MIB, 0, 0, 0, 0 }, i;
	uint8_t		*b = malloc(max);

	gpu_rnd_init();
	CHECK(b != NULL, "malloc");
	gpu_rnd_fill(b, max);
	for (i = 10; i < sizeof(lens) / sizeof(lens[0]); i++)
		lens[i] = 1 + gpu_rnd() % (max - 1);
	for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		CHECK(xxh3g_checksum(b, lens[i]) == checksum_obj(b, lens[i]), "%zu bytes", lens[i]);
	free(b);
}
END_TEST

/*
 * kernels_device_uuid: the UUID as nvidia-smi prints it where there is a
 * GPU; without one (or in the stub) an error that says why, and nothing
 * that looks like a UUID. A buffer too short for one is refused first.
 */
START_TEST(test_kernels_device_uuid_fails_cleanly_without_a_gpu)
{
	char	desc[256] = "", err[256] = "", uuid[KERNELS_UUID_LEN], small[KERNELS_UUID_LEN - 1];
	int	n, rc;

	gpu_rnd_init();
	n = kernels_device_count(desc, sizeof(desc));
	CHECK(n >= 0, "kernels_device_count: %d %s", n, desc);
	rc = kernels_device_uuid(0, small, sizeof(small), err, sizeof(err));
	CHECK(rc == (kernels_built_with_cuda() ? -ENOSPC : -ENOSYS), "a %zu-byte buffer: %d %s",
	    sizeof(small), rc, err);
	memset(uuid, 'x', sizeof(uuid));
	uuid[sizeof(uuid) - 1] = '\0';
	err[0] = '\0';
	rc = kernels_device_uuid(0, uuid, sizeof(uuid), err, sizeof(err));
	if (n > 0) {
		CHECK(rc == 0, "%s, but kernels_device_uuid(0): %d %s", desc, rc, err);
		CHECK(gpu_uuid_well_formed(uuid), "GPU 0's UUID: \"%s\"", uuid);
		rc = kernels_device_uuid(n, uuid, sizeof(uuid), err, sizeof(err));
		CHECK(rc == -ENODEV && err[0] != '\0', "device %d of %d: %d %s", n, n, rc, err);
		return;
	}
	CHECK(rc == -ENODEV || rc == -ENOSYS, "no GPU (%s), kernels_device_uuid: %d %s", desc, rc,
	    err);
	CHECK(err[0] != '\0', "kernels_device_uuid failed without saying why");
	CHECK(kernels_built_with_cuda() || rc == -ENOSYS, "the stub answered %d", rc);
	CHECK(!gpu_uuid_well_formed(uuid), "a UUID without a GPU: %s", uuid);
}
END_TEST

START_TEST(test_kernels_init_fails_cleanly_without_a_gpu)
{
	char	desc[256] = "", err[256] = "";
	int	n, rc;

	gpu_rnd_init();
	n = kernels_device_count(desc, sizeof(desc));
	CHECK(n >= 0, "kernels_device_count: %d %s", n, desc);
	rc = kernels_init(0, err, sizeof(err));
	if (n > 0) {
		CHECK(rc == 0, "%s, but kernels_init: %d %s", desc, rc, err);
		return;
	}
	CHECK(rc == -ENODEV || rc == -ENOSYS, "no GPU (%s), kernels_init: %d %s", desc, rc, err);
	CHECK(err[0] != '\0', "kernels_init failed without saying why");
	CHECK(kernels_built_with_cuda() || rc == -ENOSYS, "the stub answered %d", rc);
}
END_TEST

Suite *
suite_gpu_host(void)
{
	Suite	*s = suite_create("gpu_host");
	TCase	*tc = tcase_create("xxh3");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_xxh3_equals_libxxhash_at_every_length_to_4k);
	tcase_add_test(tc, test_xxh3_equals_libxxhash_at_block_and_chunk_edges);
	tcase_add_test(tc, test_xxh3_checksum_equals_checksum_obj);
	tcase_add_test(tc, test_kernels_init_fails_cleanly_without_a_gpu);
	tcase_add_test(tc, test_kernels_device_uuid_fails_cleanly_without_a_gpu);
	suite_add_tcase(s, tc);
	return s;
}
