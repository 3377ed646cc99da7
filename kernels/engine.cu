/*
 * The cuda copy engine: restore (pinned host objects -> device staging ->
 * verified scatter into an engine's pages) and publish (gather from
 * pages -> staging -> checksum -> host objects), pipelined in chunks.
 *
 * Structure. An engine owns `slots` staging slots (device: the staging
 * bytes, the chunk digests, ok flags; mapped host memory: the chunk's
 * descriptors, copied to device memory per chunk, and its results,
 * which the kernels write directly), `streams` kernel streams and one
 * copy stream per direction. An op is a list of pages; ops queue FIFO,
 * and the scheduler (engine_schedule) gives each free slot the next
 * chunk of the op at the head: as many of its next pages as fit the
 * slot. A chunk's DMA goes on the copy stream, its kernels on the next
 * kernel stream in rotation, and the slot's `staged` event hands the
 * chunk from one to the other. So the copies of consecutive chunks run
 * back to back, and a chunk's DMA never queues behind a kernel stream
 * held up by a slow kernel (measured: no change on an idle GPU, where
 * the kernels are short). A slot is
 * reused only once the host has seen its chunk's event complete, so
 * neither its staging bytes nor its descriptors can be overwritten while
 * in use, whatever the streams' order.
 *
 * Staging layout: objects that are contiguous in host memory stay
 * contiguous in staging (one DMA for the run); each run starts 256-byte
 * aligned. The checksum is computed per 64 KiB unit by a CTA of eight
 * warps (engine_csum_cta_kernel; conf.csum can pick one warp,
 * engine_csum_kernel), then per object over the digests
 * (engine_finish_kernel), which also compares it with the expected value
 * and sets the object's ok flag; the scatter kernel writes only objects
 * whose flag is set. A chunk's kernels run in one stream, after its DMA
 * (the `staged` event), so each sees the previous step's writes.
 *
 * Engine events: an op given one that has not completed is gated (see
 * kernels.h): its chunks stage and verify, and wait in their slots (at
 * most half of them) until engine_open_gates() sees the event complete
 * with cudaEventQuery; engine_release_held() then scatters them, or
 * drops them if the op was cancelled meanwhile.
 *
 * Ownership: ops and regions are the caller's until freed; the engine
 * borrows them while queued or in flight. Host registrations are
 * process-wide (a table below).
 */
#include <sys/types.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "cuda_err.h"
#include "kernels.h"
#include "xxh3.h"

#define ENGINE_ALIGN		256	/* a host run's staging offset */
#define ENGINE_THREADS		256
#define ENGINE_UNROLL		4	/* loads in flight per thread in copies */
#define ENGINE_SLOT_MAX		(1ULL << 30)	/* 32-bit unit indices in kernels */
#define ENGINE_DESC_BLOCKS	16	/* of the descriptor copy: ~100 KiB a chunk */
#define ENGINE_FIN_VERIFY	0	/* checksum, compare, set ok */
#define ENGINE_FIN_SKIP		1	/* no checksum: ok */
#define ENGINE_FIN_COMPUTE	2	/* checksum only (publish) */
#define ENGINE_STAMPS		6	/* per slot: DMA start, DMA end, verified, end, kernels
					   start, checksum end */
#define ENGINE_WAITQ		64	/* the notify thread's queue of chunk events */

/* A launch; a host build of this file (an emulation harness) may define its own. */
#ifndef ENGINE_KERNEL
#define ENGINE_KERNEL(k, grid, block, stream)	k<<<(grid), (block), 0, (stream)>>>
#endif

/* Descriptors the kernels read from mapped host memory. */
struct engine_item {
	uint64_t	off;		/* in the slot's staging */
	uint64_t	bytes;
	uint64_t	expect;
	uint32_t	page;
	uint32_t	region;
	uint32_t	dig0;		/* first digest; dig0 + nunits holds the length */
	uint32_t	nunits;
};

struct engine_unit {
	uint64_t	off;
	uint32_t	len;
	uint32_t	dig;
};

struct engine_seg {
	uint64_t	src;		/* device addresses (host memory: its mapping) */
	uint64_t	dst;
	uint64_t	bytes;
};

struct engine_res {
	uint64_t	csum;
	uint32_t	status;		/* KERNELS_PAGE_DONE or _BAD */
	uint32_t	pad;
};

/* A region as the kernels see it (by value in the launch parameters). */
struct engine_dregion {
	uint8_t		*base;
	const uint64_t	*layer_tab;	/* device array of per-layer bases, or NULL */
	uint64_t	 page_stride;
	uint64_t	 layer_stride;
	uint64_t	 token_stride;
	uint32_t	 token_bytes;
	uint32_t	 layers;
	uint32_t	 page_tokens;
	uint32_t	 width;		/* widest access the geometry allows */
};

struct engine_dregions {
	struct engine_dregion	r[KERNELS_REGIONS_MAX];
};

struct engine_run {
	const uint8_t	*host;
	const uint8_t	*hdev;
	uint64_t	 off;
	uint64_t	 bytes;
};

struct engine_slot {
	struct kernels_op	*op;		/* NULL: free */
	uint32_t		 first;		/* the op's pages [first, first + n) */
	uint32_t		 n;
	uint64_t		 seq;		/* issue order, for waits */
	int			 bad_issue;	/* something of this chunk failed to issue */
	int			 held;		/* staged and verified; its scatter waits for the
						   op's gate */
	int			 tail;		/* a restore's last chunk, `staged` recorded: past
						   its DMA only kernels are left (kernels_engine_tail) */
	cudaEvent_t		 done;
	cudaEvent_t		 staged;	/* hands the chunk between copy and kernel streams */
	int			 have_done;
	int			 have_staged;
	uint8_t			*stage;		/* device */
	uint64_t		*dig;
	uint32_t		*ok;
	struct engine_item	*items;		/* mapped host; kernels use the d* aliases */
	struct engine_unit	*units;
	struct engine_seg	*segs;
	struct engine_res	*res;
	struct engine_item	*ditems;	/* device copies, made per chunk */
	struct engine_unit	*dunits;
	struct engine_seg	*dsegs;
	const struct engine_item *hitems;	/* the mapped host ones, as the device sees them */
	const struct engine_unit *hunits;
	const struct engine_seg	*hsegs;
	struct engine_res	*dres;
	struct engine_run	*runs;		/* host scratch */
	uint64_t		 maxb;		/* the chunk's largest object */
	uint64_t		*stamps;	/* mapped host: ENGINE_STAMPS GPU clock stamps */
	uint64_t		*dstamps;	/* the same, as the device sees them */
	void			**bdst;		/* host scratch for cudaMemcpyBatchAsync */
	const void		**bsrc;
	size_t			*bsize;
};

struct kernels_engine {
	struct kernels_conf	 conf;
	int			 device;
	cudaStream_t		 streams[16];	/* the kernels' */
	unsigned		 nstreams;
	unsigned		 rr;
	cudaStream_t		 h2dv[2];	/* the chunks' DMA, slot i on stream i % ncopy */
	cudaStream_t		 d2hv[2];
	unsigned		 ncopy;		/* conf.copy_streams */
	unsigned		 have_copy;	/* streams of h2dv and d2hv created */
	cudaStream_t		 notify;
	int			 have_notify;
	struct engine_slot	*slots;
	uint8_t			*dmem;		/* every slot's device memory */
	uint8_t			*hmem;		/* every slot's mapped host memory */
	uint32_t		 units_cap;
	uint32_t		 dig_cap;
	uint64_t		 seq;
	struct kernels_op	*qhead;		/* ops with chunks left to issue, FIFO */
	struct kernels_op	*qtail;
	unsigned		 nops;		/* live ops */
	unsigned		 ngated;	/* ops whose gate is shut */
	struct kernels_op	*gated;		/* those ops, linked by gnext */
	int			 broken;	/* a sticky CUDA error: every op fails */
	char			 broken_err[192];
	uint64_t		*hstamp;	/* every slot's stamps, mapped (timeline) */
	int64_t			 gt_off;	/* host clock - GPU clock, ns (timeline) */
	uint64_t		 last_notify;	/* ns of the last notification (atomic) */
	/* KERNELS_NOTIFY_THREAD: chunk events the waiter thread waits for, FIFO. */
	pthread_t		 waiter;
	int			 have_waiter;
	pthread_mutex_t		 wlock;
	pthread_cond_t		 wcond;
	cudaEvent_t		 wq[ENGINE_WAITQ];
	unsigned		 whead, wtail;	/* wtail - whead events queued */
	int			 wstop;
};

struct kernels_region {
	struct kernels_engine	*e;
	struct engine_dregion	 d;
	uint32_t		 num_pages;
	uint64_t		 obj_bytes;
	uint64_t		*layer_tab;	/* cudaMalloc */
};

struct engine_page {
	const uint8_t	*host;
	const uint8_t	*hdev;
	uint64_t	 bytes;
	uint64_t	 expect;
	uint32_t	 page;
	uint32_t	 region;
};

struct kernels_op {
	struct kernels_engine	*e;
	int			 publish;
	unsigned		 flags;
	struct engine_dregions	 dregs;
	struct engine_page	*pages;
	uint8_t			*status;	/* KERNELS_PAGE_* */
	uint64_t		*csum;
	uint32_t		 n;
	uint32_t		 next;		/* first page not issued */
	uint32_t		 inflight;	/* chunks */
	cudaEvent_t		 wait;		/* borrowed, or NULL */
	int			 gate;		/* 1 while `wait` has not completed */
	uint32_t		 held;		/* slots staged or staging while the gate is shut */
	uint32_t		 scattered;	/* leading pages whose writes were issued */
	uint32_t		 dropped;	/* pages staged, then dropped at a cancel */
	int			 cancel;
	int			 queued;
	int			 failed;
	int			 done;
	int			 rc;
	char			 err[192];
	struct kernels_op_times	 t;
	struct kernels_op	*qnext;
	struct kernels_op	*gnext;		/* the engine's gated ops */
};

struct kernels_event {
	cudaEvent_t	ev;
};


/* ---- pinned host memory ------------------------------------------------ */

static struct engine_hreg {
	uint8_t		*host;
	size_t		 len;
	uint8_t		*dev;		/* its device mapping */
} engine_hregs[KERNELS_HOST_REGS];
static unsigned	engine_nhregs;

extern "C" int
kernels_host_register(void *p, size_t len, char *err, size_t errlen)
{
	struct engine_hreg	*r;
	void			*d = NULL;
	cudaError_t		 e;

	if (engine_nhregs == KERNELS_HOST_REGS) {
		snprintf(err, errlen, "more than %d host registrations", KERNELS_HOST_REGS);
		return -ENOSPC;
	}
	e = cudaHostRegister(p, len, cudaHostRegisterMapped | cudaHostRegisterPortable);
	if (e != cudaSuccess)
		return kernels_cuda_err(e, "cudaHostRegister", err, errlen);
	if ((e = cudaHostGetDevicePointer(&d, p, 0)) != cudaSuccess) {
		(void)cudaHostUnregister(p);
		return kernels_cuda_err(e, "cudaHostGetDevicePointer", err, errlen);
	}
	r = &engine_hregs[engine_nhregs++];
	r->host = (uint8_t *)p;
	r->len = len;
	r->dev = (uint8_t *)d;
	return 0;
}

extern "C" int
kernels_host_unregister(void *p, char *err, size_t errlen)
{
	unsigned	i;
	cudaError_t	e;

	for (i = 0; i < engine_nhregs; i++)
		if (engine_hregs[i].host == p)
			break;
	if (i == engine_nhregs) {
		snprintf(err, errlen, "%p is not a registered host range", p);
		return -ENOENT;
	}
	engine_hregs[i] = engine_hregs[--engine_nhregs];
	if ((e = cudaHostUnregister(p)) != cudaSuccess)
		return kernels_cuda_err(e, "cudaHostUnregister", err, errlen);
	return 0;
}

/* The device mapping of [h, h + n), or NULL where no registration holds it all. */
static const uint8_t *
engine_host_dev(const uint8_t *h, uint64_t n)
{
	unsigned	i;

	for (i = 0; i < engine_nhregs; i++) {
		const struct engine_hreg *r = &engine_hregs[i];

		if (h >= r->host && n <= r->len && (uint64_t)(h - r->host) <= r->len - n)
			return r->dev + (h - r->host);
	}
	return NULL;
}

/* ---- events ------------------------------------------------------------- */

extern "C" int
kernels_event_open_ipc(const void *handle, struct kernels_event **out, char *err, size_t len)
{
	struct kernels_event	*ev;
	cudaIpcEventHandle_t	 h;
	cudaError_t		 e;

	if ((ev = (struct kernels_event *)calloc(1, sizeof(*ev))) == NULL)
		return -ENOMEM;
	memcpy(&h, handle, sizeof(h));
	if ((e = cudaIpcOpenEventHandle(&ev->ev, h)) != cudaSuccess) {
		free(ev);
		return kernels_cuda_err(e, "cudaIpcOpenEventHandle", err, len);
	}
	*out = ev;
	return 0;
}

extern "C" int
kernels_event_new(int interprocess, struct kernels_event **out, char *err, size_t len)
{
	struct kernels_event	*ev;
	cudaError_t		 e;

	if ((ev = (struct kernels_event *)calloc(1, sizeof(*ev))) == NULL)
		return -ENOMEM;
	e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming |
	    (interprocess ? cudaEventInterprocess : 0));
	if (e != cudaSuccess) {
		free(ev);
		return kernels_cuda_err(e, "cudaEventCreateWithFlags", err, len);
	}
	*out = ev;
	return 0;
}

extern "C" int
kernels_event_record(struct kernels_event *ev, char *err, size_t len)
{
	KERNELS_TRY(cudaEventRecord(ev->ev, 0), "cudaEventRecord");
	return 0;
}

extern "C" int
kernels_event_export(struct kernels_event *ev, void *handle, char *err, size_t len)
{
	cudaIpcEventHandle_t	h;

	KERNELS_TRY(cudaIpcGetEventHandle(&h, ev->ev), "cudaIpcGetEventHandle");
	memcpy(handle, &h, sizeof(h));
	return 0;
}

extern "C" void
kernels_event_free(struct kernels_event *ev)
{
	if (ev == NULL)
		return;
	(void)cudaEventDestroy(ev->ev);
	free(ev);
}

/* ---- kernels ------------------------------------------------------------ */

/* Copies bytes with accesses of T, ENGINE_UNROLL loads in flight per thread. */
template <typename T>
static __device__ void
engine_copy_span(uint8_t *dst, const uint8_t *src, uint64_t bytes, uint64_t tid, uint64_t nt)
{
	T		*d = (T *)dst;
	const T		*s = (const T *)src;
	uint64_t	 n = bytes / sizeof(T), base, i;
	T		 v[ENGINE_UNROLL];
	int		 u;

	for (base = tid; base < n; base += nt * ENGINE_UNROLL) {
#pragma unroll
		for (u = 0; u < ENGINE_UNROLL; u++) {
			i = base + u * nt;
			if (i < n)
				v[u] = s[i];
		}
#pragma unroll
		for (u = 0; u < ENGINE_UNROLL; u++) {
			i = base + u * nt;
			if (i < n)
				d[i] = v[u];
		}
	}
}

/*
 * One segment per blockIdx.y: host runs gathered into staging by reading
 * the mapped host memory (restore), or staging into host runs (publish).
 */
static __global__ void
engine_copy_kernel(const struct engine_seg *segs)
{
	__shared__ struct engine_seg	sg;
	uint64_t			tid, nt, a;

	if (threadIdx.x == 0)
		sg = segs[blockIdx.y];
	__syncthreads();
	tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	nt = (uint64_t)gridDim.x * blockDim.x;
	a = sg.src | sg.dst | sg.bytes;
	if ((a & 15) == 0)
		engine_copy_span<uint4>((uint8_t *)sg.dst, (const uint8_t *)sg.src, sg.bytes, tid, nt);
	else if ((a & 7) == 0)
		engine_copy_span<uint2>((uint8_t *)sg.dst, (const uint8_t *)sg.src, sg.bytes, tid, nt);
	else if ((a & 3) == 0)
		engine_copy_span<uint32_t>((uint8_t *)sg.dst, (const uint8_t *)sg.src, sg.bytes, tid,
		    nt);
	else
		engine_copy_span<uint8_t>((uint8_t *)sg.dst, (const uint8_t *)sg.src, sg.bytes, tid,
		    nt);
}

/*
 * A chunk's descriptors (items, units, segments), from the slot's mapped
 * host memory into its device copy, once: the kernels after it read them
 * from device memory (L2) instead of every block fetching its own over
 * PCIe beside the chunk's DMA. Each span is a multiple of 16 bytes.
 */
struct engine_desc_spans {
	uint64_t	src[3];
	uint64_t	dst[3];
	uint64_t	bytes[3];
};

static __global__ void
engine_desc_kernel(struct engine_desc_spans sp)
{
	uint64_t	tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	uint64_t	nt = (uint64_t)gridDim.x * blockDim.x;
	int		k;

	for (k = 0; k < 3; k++)
		engine_copy_span<uint4>((uint8_t *)sp.dst[k], (const uint8_t *)sp.src[k],
		    sp.bytes[k], tid, nt);
}

/* The sum of v over the 16 lanes of this lane's parity. */
static __device__ uint64_t
engine_warp_sum16(uint64_t v)
{
	v += __shfl_xor_sync(0xffffffffU, v, 2);
	v += __shfl_xor_sync(0xffffffffU, v, 4);
	v += __shfl_xor_sync(0xffffffffU, v, 8);
	v += __shfl_xor_sync(0xffffffffU, v, 16);
	return v;
}

template <bool A16>
static __device__ void
engine_load32(const uint8_t *p, uint64_t d[4])
{
	if (A16) {
		ulonglong2 x = ((const ulonglong2 *)p)[0], y = ((const ulonglong2 *)p)[1];

		d[0] = x.x;
		d[1] = x.y;
		d[2] = y.x;
		d[3] = y.y;
	} else {
		for (int j = 0; j < 4; j++)
			d[j] = xxh3g_read64(p + 8 * j);
	}
}

/*
 * XXH3-64 of len (> 240) bytes at p by a whole warp (all 32 lanes call);
 * lane 0 returns the hash. A16: p is 16-byte aligned.
 */
template <bool A16>
static __device__ uint64_t
engine_warp_long(const uint8_t *p, uint32_t len, unsigned t)
{
	uint64_t	k[4], ks[4], acc[4], d[4], dn[4] = { 0, 0, 0, 0 }, a[4], all[8];
	uint32_t	nb = (len - 1) / XXH3G_BLOCK, n, ns;
	unsigned	g = (t & 1) * 4, j;

	xxh3g_part_keys(t, k);
#pragma unroll
	for (j = 0; j < 4; j++) {
		acc[j] = xxh3g_init_acc(g + j);
		ks[j] = xxh3g_scramble_key(g + j);
	}
	if (nb > 0)
		engine_load32<A16>(p + 32 * t, d);
	for (n = 0; n < nb; n++) {
		/* the next block's loads go out before this block's reduction */
		if (n + 1 < nb)
			engine_load32<A16>(p + (uint64_t)(n + 1) * XXH3G_BLOCK + 32 * t, dn);
#pragma unroll
		for (j = 0; j < 4; j++)
			a[j] = 0;
		xxh3g_part(a, d, k);
#pragma unroll
		for (j = 0; j < 4; j++) {
			acc[j] = xxh3g_scramble(acc[j] + engine_warp_sum16(a[j]), ks[j]);
			d[j] = dn[j];
		}
	}
	/* the last, partial block: its first ns stripes, no scramble */
	ns = ((len - 1) - nb * XXH3G_BLOCK) / XXH3G_STRIPE;
#pragma unroll
	for (j = 0; j < 4; j++)
		a[j] = 0;
	if ((t >> 1) < ns) {
		engine_load32<A16>(p + (uint64_t)nb * XXH3G_BLOCK + 32 * t, d);
		xxh3g_part(a, d, k);
	}
#pragma unroll
	for (j = 0; j < 4; j++) {
		acc[j] += engine_warp_sum16(a[j]);
		all[j] = acc[j];
		all[4 + j] = __shfl_sync(0xffffffffU, acc[j], 1);	/* lanes 4..7 */
	}
	return t == 0 ? xxh3g_long_tail(all, p, len) : 0;
}

/* XXH3-64 of len bytes at p by a whole warp; lane 0 returns it. */
static __device__ uint64_t
engine_warp_hash(const uint8_t *p, uint32_t len, unsigned t)
{
	if (len <= XXH3G_MIDSIZE_MAX)
		return t == 0 ? xxh3g_64(p, len) : 0;
	if (((uintptr_t)p & 15) == 0)
		return engine_warp_long<true>(p, len, t);
	return engine_warp_long<false>(p, len, t);
}

/* One warp per 64 KiB unit (KERNELS_CSUM_WARP): its XXH3-64 into dig[unit.dig]. */
static __global__ void
engine_csum_kernel(const struct engine_unit *units, uint32_t nunits, const uint8_t *stage,
    uint64_t *dig)
{
	unsigned	t = threadIdx.x & 31;
	uint32_t	w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, len = 0, di = 0;
	uint64_t	off = 0, h;

	if (w >= nunits)
		return;		/* whole warps: blockDim is a multiple of 32 */
	if (t == 0) {
		off = units[w].off;
		len = units[w].len;
		di = units[w].dig;
	}
	off = __shfl_sync(0xffffffffU, off, 0);
	len = __shfl_sync(0xffffffffU, len, 0);
	di = __shfl_sync(0xffffffffU, di, 0);
	h = engine_warp_hash(stage + off, len, t);
	if (t == 0)
		dig[di] = h;
}

/*
 * KERNELS_CSUM_CTA: one CTA (ENGINE_THREADS, 8 warps) per unit. The
 * tail of a restore is its last chunk's checksum, and that measured
 * bound by the bytes each warp has in flight (a warp per 64 KiB unit,
 * a block or two of loads at a time: about 38 us for 72 units, whatever
 * the order of the arithmetic). Here warp w loads all 8 of its blocks
 * (w * 8 ... w * 8 + 7) at once, reduces each across the warp into the
 * CTA's block sums, and after the barrier lanes 0..7 of warp 0 run the
 * eight scramble chains and the tail.
 */
#define ENGINE_CTA_BLOCKS	8	/* blocks per warp: 8 warps cover a 64 KiB unit */
static __global__ void
engine_csum_cta_kernel(const struct engine_unit *units, uint32_t nunits, const uint8_t *stage,
    uint64_t *dig)
{
	__shared__ uint64_t	sums[XXH3G_CHUNK / XXH3G_BLOCK][8];
	unsigned		t = threadIdx.x & 31, w = threadIdx.x >> 5, q, j;
	uint64_t		k[4], d[ENGINE_CTA_BLOCKS][4], a[4], acc = 0, ks, all[8], h;
	uint32_t		u = blockIdx.x, len, nb, ns, b;
	const uint8_t		*p;

	if (u >= nunits)
		return;		/* the whole CTA: u is the same for every thread */
	len = units[u].len;
	p = stage + units[u].off;
	if (len <= XXH3G_MIDSIZE_MAX || len > XXH3G_CHUNK) {
		/* short (or, never from this engine, over-long) units: one warp, as before */
		if (w == 0) {
			h = engine_warp_hash(p, len, t);
			if (t == 0)
				dig[units[u].dig] = h;
		}
		return;
	}
	nb = (len - 1) / XXH3G_BLOCK;
	ns = ((len - 1) - nb * XXH3G_BLOCK) / XXH3G_STRIPE;
	xxh3g_part_keys(t, k);
	/* every load of this warp's blocks first: they are all in flight together */
#pragma unroll
	for (q = 0; q < ENGINE_CTA_BLOCKS; q++) {
		b = w * ENGINE_CTA_BLOCKS + q;
		if ((b < nb || (b == nb && (t >> 1) < ns)) && ((uintptr_t)p & 15) == 0)
			engine_load32<true>(p + (uint64_t)b * XXH3G_BLOCK + 32 * t, d[q]);
		else if (b < nb || (b == nb && (t >> 1) < ns))
			engine_load32<false>(p + (uint64_t)b * XXH3G_BLOCK + 32 * t, d[q]);
		else
			for (j = 0; j < 4; j++)
				d[q][j] = 0;
	}
#pragma unroll
	for (q = 0; q < ENGINE_CTA_BLOCKS; q++) {
		b = w * ENGINE_CTA_BLOCKS + q;
		if (b > nb)
			break;		/* the same for the whole warp */
#pragma unroll
		for (j = 0; j < 4; j++)
			a[j] = 0;
		if (b < nb || (t >> 1) < ns)
			xxh3g_part(a, d[q], k);
#pragma unroll
		for (j = 0; j < 4; j++)
			a[j] = engine_warp_sum16(a[j]);
		if (t < 2)
			for (j = 0; j < 4; j++)
				sums[b][t * 4 + j] = a[j];
	}
	__syncthreads();
	if (w != 0)
		return;
	if (t < 8) {
		acc = xxh3g_init_acc(t);
		ks = xxh3g_scramble_key(t);
		for (b = 0; b < nb; b++)
			acc = xxh3g_scramble(acc + sums[b][t], ks);
		acc += sums[nb][t];		/* the partial block: no scramble */
	}
#pragma unroll
	for (j = 0; j < 8; j++)
		all[j] = __shfl_sync(0xffffffffU, acc, j);
	if (t == 0)
		dig[units[u].dig] = xxh3g_long_tail(all, p, len);
}

/*
 * One warp per object: the length after its digests, the XXH3-64 of
 * those bytes (checksum_obj's final step), the comparison, the ok flag.
 */
static __global__ void
engine_finish_kernel(const struct engine_item *items, uint32_t nitems, uint64_t *dig,
    struct engine_res *res, uint32_t *ok, int mode)
{
	unsigned	t = threadIdx.x & 31;
	uint32_t	w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, dig0 = 0, nunits = 0;
	uint64_t	bytes = 0, expect = 0, h, *d;
	int		good;

	if (w >= nitems)
		return;
	if (t == 0) {
		bytes = items[w].bytes;
		expect = items[w].expect;
		dig0 = items[w].dig0;
		nunits = items[w].nunits;
	}
	if (mode == ENGINE_FIN_SKIP) {
		if (t == 0) {
			res[w].csum = 0;
			res[w].status = KERNELS_PAGE_DONE;
			ok[w] = 1;
		}
		return;
	}
	bytes = __shfl_sync(0xffffffffU, bytes, 0);
	dig0 = __shfl_sync(0xffffffffU, dig0, 0);
	nunits = __shfl_sync(0xffffffffU, nunits, 0);
	d = dig + dig0;
	if (t == 0)
		d[nunits] = bytes;	/* little-endian, as checksum_le64 writes it */
	__syncwarp();
	h = engine_warp_hash((const uint8_t *)d, (nunits + 1) * 8, t);
	if (t == 0) {
		good = mode != ENGINE_FIN_VERIFY || h == expect;
		res[w].csum = h;
		res[w].status = good ? KERNELS_PAGE_DONE : KERNELS_PAGE_BAD;
		ok[w] = good;
	}
}

/* The GPU's clock (ns) into *p: a timeline stamp (conf.timeline). */
static __global__ void
engine_stamp_kernel(uint64_t *p)
{
	uint64_t	t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	*(volatile uint64_t *)p = t;
}

/* Waits for the host to set *flag, then stamps: maps the GPU clock onto the host's. */
static __global__ void
engine_calib_kernel(volatile uint64_t *flag, uint64_t *p, uint64_t spins)
{
	uint64_t	t, i;

	for (i = 0; i < spins && *flag == 0; i++)
		;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	*(volatile uint64_t *)p = t;
}

/*
 * Moves one object between staging (page_first: tokens x layers x
 * token_bytes) and its region page, with accesses of T.
 */
template <typename T>
static __device__ void
engine_move(const struct engine_item &it, const struct engine_dregion &r, uint8_t *obj,
    int to_region)
{
	uint32_t	upr = r.token_bytes / sizeof(T), layers = r.layers;
	uint32_t	total = upr * layers * r.page_tokens, u, row, col, tk, l;
	uint64_t	pg = (uint64_t)it.page * r.page_stride;
	uint8_t		*rb;
	T		*dst, *src;

	for (u = blockIdx.x * blockDim.x + threadIdx.x; u < total; u += gridDim.x * blockDim.x) {
		row = u / upr;
		col = u - row * upr;
		tk = row / layers;
		l = row - tk * layers;
		rb = r.layer_tab != NULL ? (uint8_t *)r.layer_tab[l] :
		    r.base + (uint64_t)l * r.layer_stride;
		dst = (T *)(rb + pg + (uint64_t)tk * r.token_stride) + col;
		src = (T *)(obj + (uint64_t)row * r.token_bytes) + col;
		if (to_region)
			*dst = *src;
		else
			*src = *dst;
	}
}

/*
 * One object per blockIdx.y: staging -> region (restore; objects whose
 * ok flag is clear are skipped whole) or region -> staging (publish).
 */
static __global__ void
engine_scatter_kernel(const struct engine_item *items, uint8_t *stage,
    struct engine_dregions regs, const uint32_t *ok, int to_region)
{
	__shared__ struct engine_item		it;
	__shared__ struct engine_dregion	r;
	__shared__ uint32_t			go;
	uint8_t					*obj;
	unsigned				w;

	if (threadIdx.x == 0) {
		it = items[blockIdx.y];
		r = regs.r[it.region];
		go = !to_region || ok[blockIdx.y];
	}
	__syncthreads();
	if (!go)
		return;
	obj = stage + it.off;
	/* an object inside a host run of another region's objects may sit less aligned */
	for (w = r.width; w > 1 && ((uintptr_t)obj & (w - 1)) != 0; w >>= 1)
		;
	switch (w) {
	case 16:
		engine_move<uint4>(it, r, obj, to_region);
		break;
	case 8:
		engine_move<uint2>(it, r, obj, to_region);
		break;
	case 4:
		engine_move<uint32_t>(it, r, obj, to_region);
		break;
	case 2:
		engine_move<uint16_t>(it, r, obj, to_region);
		break;
	default:
		engine_move<uint8_t>(it, r, obj, to_region);
		break;
	}
}

/* ---- the engine --------------------------------------------------------- */

static uint64_t
engine_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static uint64_t
engine_now(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* A notification: the fd, and when (for the op's timeline). */
static void
engine_notify(struct kernels_engine *e)
{
	uint64_t	one = 1;

	__atomic_store_n(&e->last_notify, engine_now(), __ATOMIC_RELAXED);
	if (write(e->conf.notify_fd, &one, sizeof(one)) < 0)
		return;	/* EAGAIN: the counter is already nonzero */
}

/*
 * KERNELS_NOTIFY_THREAD: waits for each queued chunk event in turn and
 * writes the notify fd when it completed. A slot's event may have been
 * recorded again by then (its chunk reaped, the slot reused): the wait is
 * then for the newer chunk, which has its own entry behind; an extra
 * notification costs the loop one empty progress.
 */
static void *
engine_waiter(void *arg)
{
	struct kernels_engine	*e = (struct kernels_engine *)arg;
	cudaEvent_t		 ev;

	(void)cudaSetDevice(e->device);
	pthread_mutex_lock(&e->wlock);
	for (;;) {
		while (e->whead == e->wtail && !e->wstop)
			pthread_cond_wait(&e->wcond, &e->wlock);
		if (e->wstop)
			break;
		ev = e->wq[e->whead % ENGINE_WAITQ];
		pthread_mutex_unlock(&e->wlock);
		(void)cudaEventSynchronize(ev);	/* an error is the chunk's: its reap reports it */
		engine_notify(e);
		pthread_mutex_lock(&e->wlock);
		e->whead++;
	}
	pthread_mutex_unlock(&e->wlock);
	return NULL;
}

/* Queues ev for the waiter; 0, or -1 when the queue is full (use a callback). */
static int
engine_wait_push(struct kernels_engine *e, cudaEvent_t ev)
{
	int	rc = -1;

	pthread_mutex_lock(&e->wlock);
	if (e->wtail - e->whead < ENGINE_WAITQ) {
		e->wq[e->wtail++ % ENGINE_WAITQ] = ev;
		pthread_cond_signal(&e->wcond);
		rc = 0;
	}
	pthread_mutex_unlock(&e->wlock);
	return rc;
}

/*
 * The GPU clock against the host's: a kernel spins until the host sets a
 * mapped flag, then stamps; the host notes its clock as it sets it. The
 * best of a few tries (the kernel sees the flag ~1 us after the write).
 */
static void
engine_calibrate(struct kernels_engine *e)
{
	volatile uint64_t	*flag = e->hstamp, *st = e->hstamp + 1;
	uint64_t		*dflag = NULL, h, best = UINT64_MAX, t0;
	int			 i;

	if (cudaHostGetDevicePointer((void **)&dflag, e->hstamp, 0) != cudaSuccess) {
		(void)cudaGetLastError();
		return;
	}
	for (i = 0; i < 5; i++) {
		*flag = 0;
		*st = 0;
		ENGINE_KERNEL(engine_calib_kernel, 1, 1, e->notify)(dflag, dflag + 1, 1ULL << 22);
		if (cudaGetLastError() != cudaSuccess)
			return;
		usleep(2000);	/* the kernel is spinning by now */
		t0 = engine_now();
		*flag = 1;
		h = engine_now();
		if (cudaStreamSynchronize(e->notify) != cudaSuccess || *st == 0) {
			(void)cudaGetLastError();
			return;
		}
		if (h - t0 < best) {
			best = h - t0;
			e->gt_off = (int64_t)(t0 + (h - t0) / 2) - (int64_t)*st;
		}
	}
}

/* A stamp of the GPU's clock as host time, or 0. */
static uint64_t
engine_host_time(const struct kernels_engine *e, uint64_t gt)
{
	return gt == 0 ? 0 : (uint64_t)((int64_t)gt + e->gt_off);
}

extern "C" void
kernels_engine_free(struct kernels_engine *e)
{
	unsigned	i;

	if (e == NULL)
		return;
	if (e->have_waiter) {
		pthread_mutex_lock(&e->wlock);
		e->wstop = 1;
		pthread_cond_signal(&e->wcond);
		pthread_mutex_unlock(&e->wlock);
		pthread_join(e->waiter, NULL);
	}
	for (i = 0; i < e->nstreams; i++)
		(void)cudaStreamSynchronize(e->streams[i]);
	for (i = 0; i < e->have_copy; i++)
		(void)cudaStreamSynchronize(i % 2 ? e->d2hv[i / 2] : e->h2dv[i / 2]);
	if (e->have_notify)
		(void)cudaStreamSynchronize(e->notify);
	if (e->slots != NULL) {
		for (i = 0; i < e->conf.slots; i++) {
			if (e->slots[i].have_done)
				(void)cudaEventDestroy(e->slots[i].done);
			if (e->slots[i].have_staged)
				(void)cudaEventDestroy(e->slots[i].staged);
			free(e->slots[i].runs);
			free(e->slots[i].bdst);
			free(e->slots[i].bsrc);
			free(e->slots[i].bsize);
		}
		free(e->slots);
	}
	for (i = 0; i < e->nstreams; i++)
		(void)cudaStreamDestroy(e->streams[i]);
	for (i = 0; i < e->have_copy; i++)
		(void)cudaStreamDestroy(i % 2 ? e->d2hv[i / 2] : e->h2dv[i / 2]);
	if (e->have_notify)
		(void)cudaStreamDestroy(e->notify);
	if (e->dmem != NULL)
		(void)cudaFree(e->dmem);
	if (e->hmem != NULL)
		(void)cudaFreeHost(e->hmem);
	if (e->hstamp != NULL)
		(void)cudaFreeHost(e->hstamp);
	if (e->have_waiter) {
		pthread_mutex_destroy(&e->wlock);
		pthread_cond_destroy(&e->wcond);
	}
	(void)cudaGetLastError();
	free(e);
}

extern "C" int
kernels_engine_new(const struct kernels_conf *c, struct kernels_engine **out, char *err,
    size_t len)
{
	struct kernels_engine	*e;
	struct cudaFuncAttributes fa;
	struct engine_slot	*sl;
	uint64_t		 dper, hper, o;
	uint8_t			*dh;
	int			 lo, hi, rc;
	unsigned		 i;
	cudaError_t		 ce;

	if (c->slots < 2 || c->slots > 64 || c->streams < 1 || c->streams > 16 ||
	    c->slot_bytes < XXH3G_CHUNK || c->slot_bytes > ENGINE_SLOT_MAX ||
	    c->max_items < 1 || c->max_items > 65535) {
		snprintf(err, len, "bad engine configuration: slots %u (2..64), streams %u (1..16), "
		    "slot_bytes %zu (64 KiB..1 GiB), max_items %u (1..65535)", c->slots, c->streams,
		    c->slot_bytes, c->max_items);
		return -EINVAL;
	}
	if ((e = (struct kernels_engine *)calloc(1, sizeof(*e))) == NULL)
		return -ENOMEM;
	e->conf = *c;
	e->conf.slot_bytes = c->slot_bytes / ENGINE_ALIGN * ENGINE_ALIGN;
	e->units_cap = (uint32_t)(e->conf.slot_bytes / XXH3G_CHUNK) + c->max_items + 1;
	e->dig_cap = e->units_cap + c->max_items;
#define ENGINE_FAIL(call, what) do {					\
	if ((ce = (call)) != cudaSuccess) {				\
		rc = kernels_cuda_err(ce, what, err, len);			\
		goto fail;						\
	}								\
} while (0)
	ENGINE_FAIL(cudaGetDevice(&e->device), "cudaGetDevice");
	/*
	 * Load the kernels now: under lazy loading (CUDA's default) the
	 * first launch of each loads it, and that waits for the work then
	 * in flight in this process, with the loop inside the launch.
	 */
	ENGINE_FAIL(cudaFuncGetAttributes(&fa, engine_desc_kernel), "loading the kernels");
	ENGINE_FAIL(cudaFuncGetAttributes(&fa, engine_copy_kernel), "loading the kernels");
	ENGINE_FAIL(cudaFuncGetAttributes(&fa, engine_csum_kernel), "loading the kernels");
	ENGINE_FAIL(cudaFuncGetAttributes(&fa, engine_csum_cta_kernel), "loading the kernels");
	ENGINE_FAIL(cudaFuncGetAttributes(&fa, engine_finish_kernel), "loading the kernels");
	ENGINE_FAIL(cudaFuncGetAttributes(&fa, engine_scatter_kernel), "loading the kernels");
	ENGINE_FAIL(cudaFuncGetAttributes(&fa, engine_stamp_kernel), "loading the kernels");
	ENGINE_FAIL(cudaFuncGetAttributes(&fa, engine_calib_kernel), "loading the kernels");
	ENGINE_FAIL(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
	for (i = 0; i < c->streams; i++) {
		ENGINE_FAIL(cudaStreamCreateWithPriority(&e->streams[i], cudaStreamNonBlocking,
		    c->high_priority ? hi : 0), "cudaStreamCreateWithPriority");
		e->nstreams++;
	}
	e->ncopy = c->copy_streams == 2 ? 2 : 1;
	for (i = 0; i < 2 * e->ncopy; i++) {
		ENGINE_FAIL(cudaStreamCreateWithPriority(i % 2 ? &e->d2hv[i / 2] : &e->h2dv[i / 2],
		    cudaStreamNonBlocking, c->high_priority ? hi : 0),
		    "cudaStreamCreateWithPriority");
		e->have_copy++;
	}
	ENGINE_FAIL(cudaStreamCreateWithFlags(&e->notify, cudaStreamNonBlocking),
	    "cudaStreamCreate");
	e->have_notify = 1;

	/* the descriptors' device copies follow the staging, digests and flags */
	dper = engine_up(e->conf.slot_bytes, ENGINE_ALIGN) +
	    engine_up((uint64_t)e->dig_cap * 8, ENGINE_ALIGN) +
	    engine_up((uint64_t)c->max_items * 4, ENGINE_ALIGN) +
	    engine_up((uint64_t)c->max_items * sizeof(struct engine_item), ENGINE_ALIGN) +
	    engine_up((uint64_t)e->units_cap * sizeof(struct engine_unit), ENGINE_ALIGN) +
	    engine_up((uint64_t)c->max_items * sizeof(struct engine_seg), ENGINE_ALIGN);
	hper = engine_up((uint64_t)c->max_items * sizeof(struct engine_item), ENGINE_ALIGN) +
	    engine_up((uint64_t)e->units_cap * sizeof(struct engine_unit), ENGINE_ALIGN) +
	    engine_up((uint64_t)c->max_items * sizeof(struct engine_seg), ENGINE_ALIGN) +
	    engine_up((uint64_t)c->max_items * sizeof(struct engine_res), ENGINE_ALIGN);
	ENGINE_FAIL(cudaMalloc((void **)&e->dmem, dper * c->slots), "cudaMalloc (staging)");
	ENGINE_FAIL(cudaHostAlloc((void **)&e->hmem, hper * c->slots,
	    cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc (descriptors)");
	ENGINE_FAIL(cudaHostGetDevicePointer((void **)&dh, e->hmem, 0), "cudaHostGetDevicePointer");
	/* two words for the clock calibration, then ENGINE_STAMPS per slot */
	ENGINE_FAIL(cudaHostAlloc((void **)&e->hstamp, (2 + (size_t)c->slots * ENGINE_STAMPS) * 8,
	    cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc (stamps)");
	memset(e->hstamp, 0, (2 + (size_t)c->slots * ENGINE_STAMPS) * 8);
	if ((e->slots = (struct engine_slot *)calloc(c->slots, sizeof(*e->slots))) == NULL) {
		rc = -ENOMEM;
		goto fail;
	}
	for (i = 0; i < c->slots; i++) {
		sl = &e->slots[i];
		o = dper * i;
		sl->stage = e->dmem + o;
		o += engine_up(e->conf.slot_bytes, ENGINE_ALIGN);
		sl->dig = (uint64_t *)(e->dmem + o);
		o += engine_up((uint64_t)e->dig_cap * 8, ENGINE_ALIGN);
		sl->ok = (uint32_t *)(e->dmem + o);
		o += engine_up((uint64_t)c->max_items * 4, ENGINE_ALIGN);
		sl->ditems = (struct engine_item *)(e->dmem + o);
		o += engine_up((uint64_t)c->max_items * sizeof(struct engine_item), ENGINE_ALIGN);
		sl->dunits = (struct engine_unit *)(e->dmem + o);
		o += engine_up((uint64_t)e->units_cap * sizeof(struct engine_unit), ENGINE_ALIGN);
		sl->dsegs = (struct engine_seg *)(e->dmem + o);

		o = hper * i;
		sl->items = (struct engine_item *)(e->hmem + o);
		sl->hitems = (const struct engine_item *)(dh + o);
		o += engine_up((uint64_t)c->max_items * sizeof(struct engine_item), ENGINE_ALIGN);
		sl->units = (struct engine_unit *)(e->hmem + o);
		sl->hunits = (const struct engine_unit *)(dh + o);
		o += engine_up((uint64_t)e->units_cap * sizeof(struct engine_unit), ENGINE_ALIGN);
		sl->segs = (struct engine_seg *)(e->hmem + o);
		sl->hsegs = (const struct engine_seg *)(dh + o);
		o += engine_up((uint64_t)c->max_items * sizeof(struct engine_seg), ENGINE_ALIGN);
		sl->res = (struct engine_res *)(e->hmem + o);
		sl->dres = (struct engine_res *)(dh + o);

		sl->stamps = e->hstamp + 2 + (size_t)i * ENGINE_STAMPS;
		ENGINE_FAIL(cudaHostGetDevicePointer((void **)&sl->dstamps, sl->stamps, 0),
		    "cudaHostGetDevicePointer");
		sl->runs = (struct engine_run *)calloc(c->max_items, sizeof(*sl->runs));
		sl->bdst = (void **)calloc(c->max_items, sizeof(*sl->bdst));
		sl->bsrc = (const void **)calloc(c->max_items, sizeof(*sl->bsrc));
		sl->bsize = (size_t *)calloc(c->max_items, sizeof(*sl->bsize));
		if (sl->runs == NULL || sl->bdst == NULL || sl->bsrc == NULL || sl->bsize == NULL) {
			rc = -ENOMEM;
			goto fail;
		}
		ENGINE_FAIL(cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming),
		    "cudaEventCreate");
		sl->have_done = 1;
		ENGINE_FAIL(cudaEventCreateWithFlags(&sl->staged, cudaEventDisableTiming),
		    "cudaEventCreate");
		sl->have_staged = 1;
	}
#undef ENGINE_FAIL
	if (c->timeline)
		engine_calibrate(e);
	if (c->notify == KERNELS_NOTIFY_THREAD && c->notify_fd >= 0) {
		pthread_mutex_init(&e->wlock, NULL);
		pthread_cond_init(&e->wcond, NULL);
		if ((rc = pthread_create(&e->waiter, NULL, engine_waiter, e)) != 0) {
			pthread_mutex_destroy(&e->wlock);
			pthread_cond_destroy(&e->wcond);
			snprintf(err, len, "the notify thread: %s", strerror(rc));
			rc = -rc;
			goto fail;
		}
		pthread_setname_np(e->waiter, "l3kv-cudawait");
		e->have_waiter = 1;
	}
	*out = e;
	return 0;
fail:
	kernels_engine_free(e);
	return rc;
}

/* ---- regions ------------------------------------------------------------ */

static int
engine_in_alloc(const void *p, uint64_t n, const char *what, char *err, size_t len)
{
	uintptr_t	base;
	size_t		size;
	int		rc;

	if ((rc = kernels_dev_range(p, &base, &size)) == -ENOTSUP)
		return 0;	/* an old driver: the geometry's own size bounds it */
	if (rc != 0) {
		cudaPointerAttributes	a;

		/* device memory the range query does not cover: its size is the caller's word */
		if (cudaPointerGetAttributes(&a, p) == cudaSuccess &&
		    a.type == cudaMemoryTypeDevice)
			return 0;
		(void)cudaGetLastError();
		snprintf(err, len, "%s %p is not device memory", what, p);
		return -EFAULT;
	}
	if ((uintptr_t)p - base > size || n > size - ((uintptr_t)p - base)) {
		snprintf(err, len, "%s %p + %llu overruns its allocation (%p + %zu)", what, p,
		    (unsigned long long)n, (void *)base, size);
		return -ERANGE;
	}
	return 0;
}

/* a * b + c, or UINT64_MAX on overflow. */
static uint64_t
engine_mad(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t	r;

	if (__builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r))
		return UINT64_MAX;
	return r;
}

extern "C" int
kernels_region_new(struct kernels_engine *e, const struct kernels_geom *g,
    struct kernels_region **out, char *err, size_t len)
{
	struct kernels_region	*r;
	uint64_t		 span, bits, obj, lim;
	unsigned		 w;
	uint32_t		 l;
	int			 rc;
	cudaError_t		 ce;

	if (g->num_pages == 0 || g->page_tokens == 0 || g->layers == 0 || g->token_bytes == 0) {
		snprintf(err, len, "empty geometry: %u pages, %u tokens, %u layers, %u bytes",
		    g->num_pages, g->page_tokens, g->layers, g->token_bytes);
		return -EINVAL;
	}
	(void)cudaSetDevice(e->device);	/* the per-layer table lives on the engine's GPU */
	obj = engine_mad(engine_mad(g->page_tokens, g->layers, 0), g->token_bytes, 0);
	/* the last byte of the last page, relative to its layer's base */
	span = engine_mad(g->num_pages - 1, g->page_stride,
	    engine_mad(g->page_tokens - 1, g->token_stride, g->token_bytes));
	if (g->layer_bases == NULL)
		span = engine_mad(g->layers - 1, g->layer_stride, span);
	lim = g->layer_bases != NULL ? g->layer_size : g->size;
	if (obj == UINT64_MAX || span == UINT64_MAX || span > lim) {
		snprintf(err, len, "geometry overruns its memory: %llu bytes needed, %llu given",
		    (unsigned long long)span, (unsigned long long)lim);
		return -ERANGE;
	}
	bits = g->page_stride | g->token_stride | g->token_bytes;
	if (g->layer_bases == NULL) {
		bits |= (uintptr_t)g->base | g->layer_stride;
		if ((rc = engine_in_alloc(g->base, span, "region base", err, len)) != 0)
			return rc;
	} else {
		for (l = 0; l < g->layers; l++) {
			bits |= (uintptr_t)g->layer_bases[l];
			if ((rc = engine_in_alloc(g->layer_bases[l], span, "layer base", err, len)) !=
			    0)
				return rc;
		}
	}
	for (w = 16; w > 1 && (bits & (w - 1)) != 0; w >>= 1)
		;
	if ((r = (struct kernels_region *)calloc(1, sizeof(*r))) == NULL)
		return -ENOMEM;
	r->e = e;
	r->num_pages = g->num_pages;
	r->obj_bytes = obj;
	r->d.base = (uint8_t *)g->base;
	r->d.page_stride = g->page_stride;
	r->d.layer_stride = g->layer_stride;
	r->d.token_stride = g->token_stride;
	r->d.token_bytes = g->token_bytes;
	r->d.layers = g->layers;
	r->d.page_tokens = g->page_tokens;
	r->d.width = w;
	if (g->layer_bases != NULL) {
		if ((ce = cudaMalloc((void **)&r->layer_tab, (size_t)g->layers * 8)) != cudaSuccess ||
		    (ce = cudaMemcpy(r->layer_tab, g->layer_bases, (size_t)g->layers * 8,
		    cudaMemcpyHostToDevice)) != cudaSuccess) {
			rc = kernels_cuda_err(ce, "uploading the layer table", err, len);
			kernels_region_free(r);
			return rc;
		}
		r->d.layer_tab = r->layer_tab;
	}
	*out = r;
	return 0;
}

extern "C" void
kernels_region_free(struct kernels_region *r)
{
	if (r == NULL)
		return;
	if (r->layer_tab != NULL)
		(void)cudaFree(r->layer_tab);
	free(r);
}

extern "C" uint64_t
kernels_region_obj_bytes(const struct kernels_region *r)
{
	return r->obj_bytes;
}

/* ---- ops: scheduling ---------------------------------------------------- */

static void
engine_fail(struct kernels_op *op, int rc, const char *err)
{
	if (!op->failed) {
		op->failed = 1;
		op->rc = rc;
		snprintf(op->err, sizeof(op->err), "%s", err);
	}
}

/* The op's gate opens (or it no longer matters): off the engine's list. */
static void
engine_ungate(struct kernels_op *op)
{
	struct kernels_op	**pp;

	if (!op->gate)
		return;
	for (pp = &op->e->gated; *pp != NULL; pp = &(*pp)->gnext) {
		if (*pp == op) {
			*pp = op->gnext;
			break;
		}
	}
	op->gnext = NULL;
	op->gate = 0;
	op->e->ngated--;
}

/* Turns an op done once nothing of it is queued or in flight; 1 if it did. */
static int
engine_op_settle(struct kernels_op *op)
{
	uint32_t	i, nbad = 0;

	if (op->done || op->queued || op->inflight > 0)
		return 0;
	engine_ungate(op);
	for (i = 0; i < op->n; i++)
		nbad += op->status[i] == KERNELS_PAGE_BAD;
	/* a failed op keeps the rc it failed with */
	if (!op->failed)
		op->rc = nbad > 0 ? -EBADMSG : op->next < op->n || op->dropped > 0 ? -ECANCELED :
		    0;
	op->done = 1;
	op->t.done = engine_now();
	return 1;
}

/* Takes op, which follows prev (NULL: op is the head), off the queue. */
static void
engine_unqueue(struct kernels_engine *e, struct kernels_op *prev, struct kernels_op *op)
{
	if (prev == NULL)
		e->qhead = op->qnext;
	else
		prev->qnext = op->qnext;
	if (e->qtail == op)
		e->qtail = prev;
	op->qnext = NULL;
	op->queued = 0;
}

static void
engine_break(struct kernels_engine *e, const char *err)
{
	if (!e->broken) {
		e->broken = 1;
		snprintf(e->broken_err, sizeof(e->broken_err), "%s", err);
	}
}

/* Blocks for one warp per item. */
static unsigned
engine_warps(uint32_t n)
{
	return (n * 32 + ENGINE_THREADS - 1) / ENGINE_THREADS;
}

/* Grid width for moving up to maxb bytes per blockIdx.y, ~16 KiB per block. */
static unsigned
engine_bx(uint64_t maxb, unsigned cap)
{
	uint64_t	bx = (maxb + 16383) / 16384;

	return bx < 1 ? 1 : bx > cap ? cap : (unsigned)bx;
}

static void CUDART_CB engine_notify_cb(void *);

/* The scatter of a staged, verified chunk into the op's regions, on s. */
static cudaError_t
engine_scatter(struct engine_slot *sl, cudaStream_t s)
{
	ENGINE_KERNEL(engine_scatter_kernel, dim3(engine_bx(sl->maxb, 128), sl->n),
	    ENGINE_THREADS, s)(sl->ditems, sl->stage, sl->op->dregs, sl->ok, 1);
	/*
	 * Held chunks are released in slot order, not page order (the ring
	 * wraps): every page before the furthest one scattered may have been
	 * written. Once it was first + n of the last release, which a wrapped
	 * ring left at 4 of 8 when all had landed (the gated test, H200).
	 */
	if (sl->first + sl->n > sl->op->scattered)
		sl->op->scattered = sl->first + sl->n;
	return cudaGetLastError();
}

/*
 * Records the slot's event on fin, where the chunk's work ends, and has
 * the notify fd written when it completes.
 */
static void
engine_track(struct kernels_engine *e, struct engine_slot *sl, cudaStream_t fin)
{
	struct kernels_op	*op = sl->op;
	cudaError_t		 ce;
	char			 msg[192];

	if ((ce = cudaEventRecord(sl->done, fin)) != cudaSuccess) {
		/* untrackable: wait here, so that nothing of it can land later */
		snprintf(msg, sizeof(msg), "cudaEventRecord: %s (CUDA error %d)",
		    cudaGetErrorString(ce), (int)ce);
		(void)cudaGetLastError();
		engine_fail(op, -EIO, msg);
		engine_break(e, msg);
		(void)cudaStreamSynchronize(fin);
		for (unsigned j = 0; j < e->ncopy; j++)
			(void)cudaStreamSynchronize(op->publish ? e->d2hv[j] : e->h2dv[j]);
		(void)cudaGetLastError();
		if (sl->held)
			op->held--;
		sl->held = 0;
		sl->op = NULL;
		op->inflight--;
		return;
	}
	if (e->conf.notify_fd < 0)
		return;
	if (e->have_waiter && engine_wait_push(e, sl->done) == 0)
		return;
	if (cudaStreamWaitEvent(e->notify, sl->done, 0) != cudaSuccess ||
	    cudaLaunchHostFunc(e->notify, engine_notify_cb, e) != cudaSuccess) {
		(void)cudaGetLastError();
		/* the chunk still completes; the caller's progress or wait reaps it */
	}
}

/*
 * The checksum kernel of the slot's nu units on s, in the form conf.csum
 * picks: a CTA per unit (KERNELS_CSUM_CTA), or a warp per unit.
 */
static void
engine_csum(const struct kernels_engine *e, struct engine_slot *sl, uint32_t nu, cudaStream_t s)
{
	if (e->conf.csum == KERNELS_CSUM_CTA)
		ENGINE_KERNEL(engine_csum_cta_kernel, nu, ENGINE_THREADS, s)(sl->dunits, nu,
		    sl->stage, sl->dig);
	else
		ENGINE_KERNEL(engine_csum_kernel, engine_warps(nu), ENGINE_THREADS, s)(sl->dunits,
		    nu, sl->stage, sl->dig);
}

/* A timeline stamp of the GPU's clock into the slot's word k, on s. */
static cudaError_t
engine_stamp(struct kernels_engine *e, struct engine_slot *sl, unsigned k, cudaStream_t s)
{
	if (!e->conf.timeline)
		return cudaSuccess;
	ENGINE_KERNEL(engine_stamp_kernel, 1, 1, s)(sl->dstamps + k);
	return cudaGetLastError();
}

/*
 * How host run k of a chunk moves: by the zero-copy gather (or scatter)
 * kernel, by a cudaMemcpyAsync of its own, or in the chunk's one
 * cudaMemcpyBatchAsync. By default (batch_dma) runs of at least
 * batch_min_bytes go in the batch and shorter ones through the kernel
 * (measured on the H200: the kernel's PCIe reads reach ~0.87x the DMA
 * peak whatever the size, one DMA per run pays ~3 us a copy, the batch
 * 0.96x at 256 KiB and 0.98x at 2.25 MB but 0.75x at 36 KiB); without
 * batch_dma, runs of at least dma_min_bytes each get a cudaMemcpyAsync.
 */
#define ENGINE_RUN_ZC		0
#define ENGINE_RUN_DMA		1
#define ENGINE_RUN_BATCH	2
static int
engine_run_how(const struct kernels_op *op, const struct kernels_conf *c,
    const struct engine_run *run, uint32_t k)
{
	if (op->flags & KERNELS_F_DMA)
		return ENGINE_RUN_DMA;
	if (op->flags & KERNELS_F_ZEROCOPY)
		return ENGINE_RUN_ZC;
	if (op->flags & KERNELS_F_BATCH)
		return ENGINE_RUN_BATCH;
	if (op->flags & KERNELS_F_MIX)
		return run->bytes >= c->batch_min_bytes || (k & 1) ? ENGINE_RUN_BATCH :
		    ENGINE_RUN_ZC;
	if (c->batch_dma)
		return run->bytes >= c->batch_min_bytes ? ENGINE_RUN_BATCH : ENGINE_RUN_ZC;
	return run->bytes >= c->dma_min_bytes ? ENGINE_RUN_DMA : ENGINE_RUN_ZC;
}

/* One cudaMemcpyBatchAsync of the slot's nb gathered copies on stream s. */
static cudaError_t
engine_batch(struct engine_slot *sl, size_t nb, cudaStream_t s)
{
	struct cudaMemcpyAttributes	a;
	size_t				idx = 0;

	if (nb == 1)
		return cudaMemcpyAsync(sl->bdst[0], sl->bsrc[0], sl->bsize[0], cudaMemcpyDefault, s);
	memset(&a, 0, sizeof(a));
	a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	return cudaMemcpyBatchAsync(sl->bdst, sl->bsrc, sl->bsize, nb, &a, &idx, 1, s);
}

/*
 * Plans the op's next chunk into slot sl and issues it on the next
 * stream. On failure the op is failed; what was issued stays tracked by
 * the slot's event where it could be recorded.
 */
static void
engine_issue(struct kernels_engine *e, struct engine_slot *sl, struct kernels_op *op)
{
	const struct kernels_conf	*c = &e->conf;
	const struct engine_page	*p, *prev = NULL;
	struct engine_item		*it;
	struct engine_run		*run;
	cudaStream_t			 s = e->streams[e->rr++ % e->nstreams], fin;
	struct engine_desc_spans	 dsp;
	uint32_t			 i = op->next, ni = 0, nu = 0, nd = 0, ns = 0, nr = 0, k, units;
	uint32_t			 ndma = 0;
	uint64_t			 off = 0, start, maxb = 0, maxs = 0;
	size_t				 nb = 0;
	int				 verify = !(op->flags & KERNELS_F_NOVERIFY);
	int				 first, how;
	/* the slot's copy stream, of one or two per direction */
	cudaStream_t			 cs = op->publish ? e->d2hv[(sl - e->slots) % e->ncopy] :
					     e->h2dv[(sl - e->slots) % e->ncopy];
	cudaError_t			 ce = cudaSuccess;
	const char			*what = "";
	char				 msg[192];

	while (i < op->n && ni < c->max_items) {
		p = &op->pages[i];
		int contig = prev != NULL && p->host == prev->host + prev->bytes &&
		    p->hdev == prev->hdev + prev->bytes;
		start = contig ? off : engine_up(off, ENGINE_ALIGN);
		units = (uint32_t)((p->bytes + XXH3G_CHUNK - 1) / XXH3G_CHUNK);
		if (start + p->bytes > c->slot_bytes || nu + units > e->units_cap ||
		    nd + units + 1 > e->dig_cap)
			break;
		it = &sl->items[ni];
		it->off = start;
		it->bytes = p->bytes;
		it->expect = p->expect;
		it->page = p->page;
		it->region = p->region;
		it->dig0 = nd;
		it->nunits = units;
		for (k = 0; k < units; k++) {
			sl->units[nu + k].off = start + (uint64_t)k * XXH3G_CHUNK;
			sl->units[nu + k].len = (uint32_t)(p->bytes - (uint64_t)k * XXH3G_CHUNK >
			    XXH3G_CHUNK ? XXH3G_CHUNK : p->bytes - (uint64_t)k * XXH3G_CHUNK);
			sl->units[nu + k].dig = nd + k;
		}
		nu += units;
		nd += units + 1;
		if (contig) {
			sl->runs[nr - 1].bytes += p->bytes;
		} else {
			run = &sl->runs[nr++];
			run->host = p->host;
			run->hdev = p->hdev;
			run->off = start;
			run->bytes = p->bytes;
		}
		if (p->bytes > maxb)
			maxb = p->bytes;
		off = start + p->bytes;
		prev = p;
		i++;
		ni++;
	}
	/* submit checked that one object always fits an empty slot */
	sl->op = op;
	sl->first = op->next;
	sl->n = ni;
	sl->seq = e->seq++;
	sl->bad_issue = 0;
	sl->held = 0;
	sl->tail = 0;
	first = op->next == 0;
	op->next = i;
	op->inflight++;
	op->t.last_issue = engine_now();
	if (first)
		op->t.first_issue = op->t.last_issue;
	if (e->conf.timeline)
		memset(sl->stamps, 0, ENGINE_STAMPS * sizeof(*sl->stamps));
	if (op->publish)
		op->scattered = i;	/* writes only host objects: counted as issued */

	/*
	 * The DMA runs go on the engine's copy stream for their direction,
	 * the kernels on stream s, and an event hands the chunk from one to
	 * the other: so the copies of consecutive chunks follow each other
	 * back to back whatever the kernels are doing (with DMA and kernels
	 * in one stream, the next chunk's copy waited for this one's kernels
	 * and the link idled meanwhile). `fin` is where the chunk ends.
	 */
	fin = s;
	/* the runs of the batch, gathered here and issued below (one alone: a plain copy) */
	for (k = 0; k < nr; k++) {
		run = &sl->runs[k];
		if ((how = engine_run_how(op, c, run, k)) == ENGINE_RUN_ZC)
			continue;
		ndma++;
		if (how != ENGINE_RUN_BATCH)
			continue;
		if (op->publish) {
			sl->bdst[nb] = (void *)run->host;
			sl->bsrc[nb] = sl->stage + run->off;
		} else {
			sl->bdst[nb] = sl->stage + run->off;
			sl->bsrc[nb] = run->host;
		}
		sl->bsize[nb++] = run->bytes;
	}
	if (!op->publish) {
		if (first && ndma > 0) {
			what = "the stamp kernel";
			ce = engine_stamp(e, sl, 0, cs);
		}
		for (k = 0; k < nr && ce == cudaSuccess; k++) {
			run = &sl->runs[k];
			if (engine_run_how(op, c, run, k) == ENGINE_RUN_DMA) {
				what = "cudaMemcpyAsync";
				ce = cudaMemcpyAsync(sl->stage + run->off, run->host, run->bytes,
				    cudaMemcpyHostToDevice, cs);
			}
		}
		if (nb > 0 && ce == cudaSuccess) {
			what = "cudaMemcpyBatchAsync";
			ce = engine_batch(sl, nb, cs);
		}
		if (ndma > 0 && ce == cudaSuccess) {
			what = "the stamp kernel";
			ce = engine_stamp(e, sl, 1, cs);
		}
		if (ndma > 0 && ce == cudaSuccess) {
			what = "cudaEventRecord (staged)";
			ce = cudaEventRecord(sl->staged, cs);
		}
		if (ce != cudaSuccess)
			goto record;
		/*
		 * The op's last chunk: the waiter thread says when its DMA ended
		 * too, so that the caller is awake (and polls, kernels_engine_tail)
		 * by the time its kernels end, instead of waking only then.
		 */
		if (ndma > 0 && i == op->n && !op->gate) {
			sl->tail = 1;
			if (e->have_waiter)
				(void)engine_wait_push(e, sl->staged);
		}
	}
	for (k = 0; k < nr; k++) {
		run = &sl->runs[k];
		if (engine_run_how(op, c, run, k) != ENGINE_RUN_ZC)
			continue;
		if (op->publish) {
			sl->segs[ns].src = (uintptr_t)(sl->stage + run->off);
			sl->segs[ns].dst = (uintptr_t)run->hdev;
		} else {
			sl->segs[ns].src = (uintptr_t)run->hdev;
			sl->segs[ns].dst = (uintptr_t)(sl->stage + run->off);
		}
		sl->segs[ns].bytes = run->bytes;
		if (run->bytes > maxs)
			maxs = run->bytes;
		ns++;
	}

#define ENGINE_LAUNCH(what_, ...) do {					\
	if (ce == cudaSuccess) {					\
		what = what_;						\
		__VA_ARGS__;						\
		ce = cudaGetLastError();				\
	}								\
} while (0)
#define ENGINE_CALL(what_, call) do {					\
	if (ce == cudaSuccess) {					\
		what = what_;						\
		ce = (call);						\
	}								\
} while (0)
	/* every span a multiple of 16: the capacities are ENGINE_ALIGN-rounded */
	dsp.src[0] = (uint64_t)(uintptr_t)sl->hitems;
	dsp.dst[0] = (uint64_t)(uintptr_t)sl->ditems;
	dsp.bytes[0] = engine_up((uint64_t)ni * sizeof(struct engine_item), 16);
	dsp.src[1] = (uint64_t)(uintptr_t)sl->hunits;
	dsp.dst[1] = (uint64_t)(uintptr_t)sl->dunits;
	dsp.bytes[1] = engine_up((uint64_t)nu * sizeof(struct engine_unit), 16);
	dsp.src[2] = (uint64_t)(uintptr_t)sl->hsegs;
	dsp.dst[2] = (uint64_t)(uintptr_t)sl->dsegs;
	dsp.bytes[2] = engine_up((uint64_t)ns * sizeof(struct engine_seg), 16);
	ENGINE_LAUNCH("the descriptor kernel", ENGINE_KERNEL(engine_desc_kernel,
	    ENGINE_DESC_BLOCKS, ENGINE_THREADS, s)(dsp));
	if (!op->publish) {
		/* the zero-copy gather needs no DMA; the rest waits for it */
		if (first && ndma == 0)
			ENGINE_CALL("the stamp kernel", engine_stamp(e, sl, 0, s));
		if (ns > 0)
			ENGINE_LAUNCH("the host gather kernel", ENGINE_KERNEL(engine_copy_kernel,
			    dim3(engine_bx(maxs, 256), ns), ENGINE_THREADS, s)(sl->dsegs));
		if (ndma == 0)
			ENGINE_CALL("the stamp kernel", engine_stamp(e, sl, 1, s));
		if (ndma > 0)
			ENGINE_CALL("cudaStreamWaitEvent (staged)",
			    cudaStreamWaitEvent(s, sl->staged, 0));
		ENGINE_CALL("the stamp kernel", engine_stamp(e, sl, 4, s));
		if (verify && nu > 0)
			ENGINE_LAUNCH("the checksum kernel", engine_csum(e, sl, nu, s));
		ENGINE_CALL("the stamp kernel", engine_stamp(e, sl, 5, s));
		ENGINE_LAUNCH("the verify kernel", ENGINE_KERNEL(engine_finish_kernel,
		    engine_warps(ni), ENGINE_THREADS, s)(sl->ditems, ni, sl->dig, sl->dres, sl->ok,
		    verify ? ENGINE_FIN_VERIFY : ENGINE_FIN_SKIP));
		ENGINE_CALL("the stamp kernel", engine_stamp(e, sl, 2, s));
		/* behind a shut gate the chunk stays staged: engine_open_gates() */
		sl->maxb = maxb;
		if (ce == cudaSuccess && op->gate) {
			sl->held = 1;
			op->held++;
		} else if (ce == cudaSuccess) {
			what = "the scatter kernel";
			ce = engine_scatter(sl, s);
			ENGINE_CALL("the stamp kernel", engine_stamp(e, sl, 3, s));
		}
	} else {
		ENGINE_LAUNCH("the gather kernel", ENGINE_KERNEL(engine_scatter_kernel,
		    dim3(engine_bx(maxb, 128), ni), ENGINE_THREADS, s)(sl->ditems, sl->stage,
		    op->dregs, sl->ok, 0));
		if (nu > 0)
			ENGINE_LAUNCH("the checksum kernel", engine_csum(e, sl, nu, s));
		ENGINE_LAUNCH("the checksum kernel (objects)", ENGINE_KERNEL(engine_finish_kernel,
		    engine_warps(ni), ENGINE_THREADS, s)(sl->ditems, ni, sl->dig, sl->dres, sl->ok,
		    ENGINE_FIN_COMPUTE));
		if (ns > 0)
			ENGINE_LAUNCH("the host scatter kernel", ENGINE_KERNEL(engine_copy_kernel,
			    dim3(engine_bx(maxs, 256), ns), ENGINE_THREADS, s)(sl->dsegs));
		if (ndma > 0) {
			ENGINE_CALL("cudaEventRecord (staged)", cudaEventRecord(sl->staged, s));
			ENGINE_CALL("cudaStreamWaitEvent (staged)",
			    cudaStreamWaitEvent(cs, sl->staged, 0));
			if (ce == cudaSuccess)
				fin = cs;
			for (k = 0; k < nr && ce == cudaSuccess; k++) {
				run = &sl->runs[k];
				if (engine_run_how(op, c, run, k) == ENGINE_RUN_DMA)
					ENGINE_CALL("cudaMemcpyAsync", cudaMemcpyAsync((void *)run->host,
					    sl->stage + run->off, run->bytes, cudaMemcpyDeviceToHost,
					    cs));
			}
			if (nb > 0)
				ENGINE_CALL("cudaMemcpyBatchAsync", engine_batch(sl, nb, cs));
		}
	}
#undef ENGINE_CALL
#undef ENGINE_LAUNCH
record:
	if (ce != cudaSuccess) {
		snprintf(msg, sizeof(msg), "%s: %s (CUDA error %d)", what, cudaGetErrorString(ce),
		    (int)ce);
		(void)cudaGetLastError();
		engine_fail(op, -EIO, msg);
		sl->bad_issue = 1;
		/*
		 * The hand-off may be missing: wait here for the copies
		 * issued, so that the chunk's event covers all of it.
		 */
		(void)cudaStreamSynchronize(cs);
		(void)cudaGetLastError();
		fin = s;
	}
	engine_track(e, sl, fin);
}

static void CUDART_CB
engine_notify_cb(void *arg)
{
	/* a CUDA callback thread: no CUDA calls here, only the eventfd */
	engine_notify((struct kernels_engine *)arg);
}

/* Takes a completed chunk's results into its op; 1 if the op turned done. */
static int
engine_reap(struct kernels_engine *e, struct engine_slot *sl, cudaError_t q)
{
	struct kernels_op	*op = sl->op;
	uint32_t		 k;
	char			 msg[192];

	if (q != cudaSuccess) {
		snprintf(msg, sizeof(msg), "a chunk failed on the device: %s (CUDA error %d)",
		    cudaGetErrorString(q), (int)q);
		(void)cudaGetLastError();
		engine_fail(op, -EIO, msg);
		engine_break(e, msg);
	} else if (!sl->bad_issue) {
		/* a whole chunk ran: its pages' results hold even if another chunk failed */
		for (k = 0; k < sl->n; k++) {
			op->status[sl->first + k] = (uint8_t)sl->res[k].status;
			op->csum[sl->first + k] = sl->res[k].csum;
		}
		if (e->conf.timeline && !op->publish) {
			if (sl->first == 0)
				op->t.gpu_dma_start = engine_host_time(e, sl->stamps[0]);
			if (sl->first + sl->n == op->n) {
				op->t.gpu_dma_end = engine_host_time(e, sl->stamps[1]);
				op->t.gpu_csum_start = engine_host_time(e, sl->stamps[4]);
				op->t.gpu_csum_end = engine_host_time(e, sl->stamps[5]);
				op->t.gpu_verified = engine_host_time(e, sl->stamps[2]);
				op->t.gpu_end = engine_host_time(e, sl->stamps[3]);
			}
		}
	}
	op->t.notify = __atomic_load_n(&e->last_notify, __ATOMIC_RELAXED);
	if (sl->held)
		op->held--;
	sl->held = 0;
	sl->op = NULL;
	op->inflight--;
	return engine_op_settle(op);
}

/*
 * Issues chunks into free slots, FIFO by op, except that an op behind a
 * shut gate does not hold the others up: a publish waits whole (its
 * first kernel reads the engine's memory), a restore stages at most half
 * the slots ahead. Returns the ops that turned done.
 */
static int
engine_schedule(struct kernels_engine *e)
{
	struct kernels_op	*op, *prev = NULL, *next;
	unsigned		 i, cap = e->conf.slots / 2;
	int			 ndone = 0;

	for (op = e->qhead; op != NULL; op = next) {
		next = op->qnext;
		if (op->cancel || op->failed || op->next >= op->n || e->broken) {
			if (e->broken)
				engine_fail(op, -EIO, e->broken_err);
			engine_unqueue(e, prev, op);
			ndone += engine_op_settle(op);
			continue;
		}
		if (op->gate && (op->publish || op->held >= cap)) {
			prev = op;
			continue;
		}
		for (i = 0; i < e->conf.slots; i++)
			if (e->slots[i].op == NULL)
				break;
		if (i == e->conf.slots)
			break;
		engine_issue(e, &e->slots[i], op);
		next = op;	/* the same op again, while it has chunks and slots */
	}
	return ndone;
}

/* Opens the gates whose event completed; one whose event fails fails its op. */
static void
engine_open_gates(struct kernels_engine *e)
{
	struct kernels_op	*op, *next;
	cudaError_t		 q;
	char			 msg[192];

	for (op = e->gated; op != NULL; op = next) {
		next = op->gnext;
		if ((q = cudaEventQuery(op->wait)) == cudaErrorNotReady)
			continue;
		if (q != cudaSuccess) {
			snprintf(msg, sizeof(msg), "the engine's event: %s (CUDA error %d)",
			    cudaGetErrorString(q), (int)q);
			(void)cudaGetLastError();
			engine_fail(op, -EIO, msg);
		}
		engine_ungate(op);
	}
}

/*
 * A staged chunk whose op's gate opened is scattered now; one whose op
 * was cancelled or failed meanwhile is dropped, nothing of it written.
 * Returns 1 if the op turned done.
 */
static int
engine_release_held(struct kernels_engine *e, struct engine_slot *sl)
{
	struct kernels_op	*op = sl->op;
	cudaStream_t		 s;
	cudaError_t		 ce;
	char			 msg[192];

	if (op->cancel || op->failed || e->broken) {
		op->dropped += sl->n;
		sl->held = 0;
		op->held--;
		sl->op = NULL;
		op->inflight--;
		return engine_op_settle(op);
	}
	if (op->gate)
		return 0;
	sl->held = 0;
	op->held--;
	s = e->streams[e->rr++ % e->nstreams];
	if ((ce = engine_scatter(sl, s)) != cudaSuccess) {
		snprintf(msg, sizeof(msg), "the scatter kernel: %s (CUDA error %d)",
		    cudaGetErrorString(ce), (int)ce);
		(void)cudaGetLastError();
		engine_fail(op, -EIO, msg);
		sl->bad_issue = 1;
	}
	engine_track(e, sl, s);
	return 0;
}

static int
engine_progress(struct kernels_engine *e)
{
	struct engine_slot	*sl;
	cudaError_t		 q;
	unsigned		 i;
	int			 ndone = 0;

	if (e->gated != NULL)
		engine_open_gates(e);
	for (i = 0; i < e->conf.slots; i++) {
		sl = &e->slots[i];
		if (sl->op == NULL)
			continue;
		q = cudaEventQuery(sl->done);
		if (q == cudaErrorNotReady)
			continue;
		if (q == cudaSuccess && sl->held)
			ndone += engine_release_held(e, sl);
		else
			ndone += engine_reap(e, sl, q);
	}
	return ndone + engine_schedule(e);
}

extern "C" int
kernels_engine_progress(struct kernels_engine *e)
{
	(void)cudaSetDevice(e->device);
	return engine_progress(e);
}

extern "C" unsigned
kernels_engine_gated(const struct kernels_engine *e)
{
	return e->ngated;
}

extern "C" void
kernels_engine_staging(const struct kernels_engine *e, unsigned *slots, unsigned *busy)
{
	unsigned	i, n = 0;

	for (i = 0; i < e->conf.slots; i++)
		n += e->slots[i].op != NULL;
	*slots = e->conf.slots;
	*busy = n;
}

extern "C" int
kernels_engine_device(const struct kernels_engine *e)
{
	return e->device;
}

extern "C" void
kernels_engine_kill(struct kernels_engine *e, const char *why)
{
	engine_break(e, why);
}

extern "C" int
kernels_engine_tail(struct kernels_engine *e)
{
	unsigned	i;
	int		n = 0;

	for (i = 0; i < e->conf.slots; i++) {
		struct engine_slot *sl = &e->slots[i];

		if (sl->op != NULL && sl->tail && !sl->held &&
		    cudaEventQuery(sl->staged) == cudaSuccess)
			n++;
	}
	(void)cudaGetLastError();
	return n;
}

/* ---- ops: the API ------------------------------------------------------- */

static int
engine_submit(struct kernels_engine *e, int publish, struct kernels_region *const *regions,
    unsigned nregions, const struct kernels_page *pages, uint32_t n,
    const struct kernels_event *wait, unsigned flags, struct kernels_op **out, char *err,
    size_t len)
{
	struct kernels_op	*op;
	struct engine_page	*p;
	uint8_t			*seen[KERNELS_REGIONS_MAX] = { NULL };
	uint64_t		 units;
	uint32_t		 i;
	unsigned		 r;
	int			 rc = -EINVAL;
	cudaError_t		 q;

	if (e->broken) {
		snprintf(err, len, "the engine is broken: %s", e->broken_err);
		return -EIO;
	}
	if (nregions < 1 || nregions > KERNELS_REGIONS_MAX) {
		snprintf(err, len, "%u regions (1..%d)", nregions, KERNELS_REGIONS_MAX);
		return -EINVAL;
	}
	for (r = 0; r < nregions; r++) {
		if (regions[r] == NULL || regions[r]->e != e) {
			snprintf(err, len, "region %u is not this engine's", r);
			return -EINVAL;
		}
	}
	if ((op = (struct kernels_op *)calloc(1, sizeof(*op))) == NULL)
		return -ENOMEM;
	op->pages = (struct engine_page *)calloc(n ? n : 1, sizeof(*op->pages));
	op->status = (uint8_t *)malloc(n ? n : 1);
	op->csum = (uint64_t *)calloc(n ? n : 1, sizeof(*op->csum));
	for (r = 0; r < nregions; r++)
		seen[r] = (uint8_t *)calloc((regions[r]->num_pages + 7) / 8, 1);
	if (op->pages == NULL || op->status == NULL || op->csum == NULL) {
		rc = -ENOMEM;
		goto fail;
	}
	for (r = 0; r < nregions; r++) {
		if (seen[r] == NULL) {
			rc = -ENOMEM;
			goto fail;
		}
		op->dregs.r[r] = regions[r]->d;
	}
	for (i = 0; i < n; i++) {
		const struct kernels_page *pg = &pages[i];
		const struct kernels_region *rg;

		if (pg->region >= nregions) {
			snprintf(err, len, "page %u: region %u of %u", i, pg->region, nregions);
			goto fail;
		}
		rg = regions[pg->region];
		if (pg->page >= rg->num_pages) {
			snprintf(err, len, "page %u: destination %u of a %u-page region", i, pg->page,
			    rg->num_pages);
			goto fail;
		}
		if (seen[pg->region][pg->page / 8] & (1U << (pg->page % 8))) {
			snprintf(err, len, "page %u: destination %u of region %u named twice", i,
			    pg->page, pg->region);
			goto fail;
		}
		seen[pg->region][pg->page / 8] |= (uint8_t)(1U << (pg->page % 8));
		if (rg->obj_bytes > e->conf.slot_bytes) {
			snprintf(err, len, "page %u: a %llu-byte object exceeds the %zu-byte staging "
			    "slot", i, (unsigned long long)rg->obj_bytes, e->conf.slot_bytes);
			rc = -E2BIG;
			goto fail;
		}
		units = (rg->obj_bytes + XXH3G_CHUNK - 1) / XXH3G_CHUNK;
		if (units + 1 > e->dig_cap) {
			snprintf(err, len, "page %u: too many checksum units", i);
			rc = -E2BIG;
			goto fail;
		}
		p = &op->pages[i];
		p->host = (const uint8_t *)pg->host;
		p->bytes = rg->obj_bytes;
		if ((p->hdev = engine_host_dev(p->host, p->bytes)) == NULL) {
			snprintf(err, len, "page %u: host object %p (+%llu) is not in registered host "
			    "memory", i, pg->host, (unsigned long long)p->bytes);
			goto fail;
		}
		p->expect = pg->checksum;
		p->page = pg->page;
		p->region = pg->region;
		op->status[i] = KERNELS_PAGE_SKIPPED;
	}
	for (r = 0; r < nregions; r++)
		free(seen[r]);
	op->e = e;
	op->publish = publish;
	op->flags = flags;
	op->n = n;
	op->wait = wait != NULL ? wait->ev : NULL;
	if (op->wait != NULL) {
		(void)cudaSetDevice(e->device);
		q = cudaEventQuery(op->wait);
		if (q != cudaSuccess && q != cudaErrorNotReady) {
			rc = kernels_cuda_err(q, "cudaEventQuery (the engine's event)", err, len);
			goto fail;
		}
		if (q == cudaErrorNotReady) {
			/* polled by engine_open_gates(); no stream ever waits on it */
			op->gate = 1;
			op->gnext = e->gated;
			e->gated = op;
			e->ngated++;
		}
	}
	op->queued = 1;
	op->t.submit = engine_now();
	if (e->qtail != NULL)
		e->qtail->qnext = op;
	else
		e->qhead = op;
	e->qtail = op;
	e->nops++;
	(void)cudaSetDevice(e->device);
	(void)engine_progress(e);
	*out = op;
	return 0;
fail:
	for (r = 0; r < nregions; r++)
		free(seen[r]);
	free(op->pages);
	free(op->status);
	free(op->csum);
	free(op);
	return rc;
}

extern "C" int
kernels_restore_submit(struct kernels_engine *e, struct kernels_region *const *regions,
    unsigned nregions, const struct kernels_page *pages, uint32_t n,
    const struct kernels_event *wait, unsigned flags, struct kernels_op **out, char *err,
    size_t len)
{
	return engine_submit(e, 0, regions, nregions, pages, n, wait, flags, out, err, len);
}

extern "C" int
kernels_publish_submit(struct kernels_engine *e, struct kernels_region *const *regions,
    unsigned nregions, const struct kernels_page *pages, uint32_t n,
    const struct kernels_event *wait, unsigned flags, struct kernels_op **out, char *err,
    size_t len)
{
	return engine_submit(e, 1, regions, nregions, pages, n, wait,
	    flags & ~(unsigned)KERNELS_F_NOVERIFY, out, err, len);
}

extern "C" int
kernels_op_poll(struct kernels_op *op)
{
	if (!op->done)
		(void)kernels_engine_progress(op->e);
	return op->done;
}

extern "C" int
kernels_op_wait(struct kernels_op *op)
{
	struct kernels_engine	*e = op->e;
	struct engine_slot	*oldest;
	unsigned		 i;

	(void)cudaSetDevice(e->device);
	while (!op->done) {
		(void)engine_progress(e);
		if (op->done)
			break;
		oldest = NULL;
		for (i = 0; i < e->conf.slots; i++)
			if (e->slots[i].op != NULL && !e->slots[i].held &&
			    (oldest == NULL || e->slots[i].seq < oldest->seq))
				oldest = &e->slots[i];
		if (oldest == NULL && e->ngated > 0) {
			/* only gates to wait for: poll them */
			usleep(50);
			continue;
		}
		if (oldest == NULL) {
			/* cannot happen: a queued op gets a free slot, an idle one settles */
			engine_fail(op, -EIO, "internal: op neither queued nor in flight");
			op->done = 1;
			break;
		}
		/* an error here is the chunk's own; its reap reports it */
		(void)cudaEventSynchronize(oldest->done);
	}
	return op->rc;
}

extern "C" void
kernels_op_cancel(struct kernels_op *op)
{
	op->cancel = 1;
}

extern "C" int
kernels_op_result(const struct kernels_op *op, struct kernels_result *r, uint8_t *page_status,
    uint64_t *checksums)
{
	uint32_t	i;

	if (!op->done)
		return -EBUSY;
	memset(r, 0, sizeof(*r));
	r->status = op->rc;
	r->pages = op->n;
	r->launched = op->scattered;
	r->first_bad = UINT32_MAX;
	for (i = 0; i < op->n; i++) {
		if (op->status[i] == KERNELS_PAGE_DONE)
			r->done++;
		if (op->status[i] == KERNELS_PAGE_BAD && r->nbad++ == 0)
			r->first_bad = i;
	}
	snprintf(r->err, sizeof(r->err), "%s", op->err);
	if (page_status != NULL)
		memcpy(page_status, op->status, op->n);
	if (checksums != NULL)
		memcpy(checksums, op->csum, (size_t)op->n * sizeof(*checksums));
	return 0;
}

extern "C" int
kernels_op_times(const struct kernels_op *op, struct kernels_op_times *t)
{
	if (!op->done)
		return -EBUSY;
	*t = op->t;
	return 0;
}

extern "C" void
kernels_op_free(struct kernels_op *op)
{
	if (op == NULL)
		return;
	if (!op->done) {
		op->cancel = 1;
		(void)kernels_op_wait(op);
	}
	op->e->nops--;
	free(op->pages);
	free(op->status);
	free(op->csum);
	free(op);
}

/* ---- the checksum of device bytes (tests) ------------------------------- */

extern "C" int
kernels_checksum_device(const void *dptr, size_t len, uint64_t *out, char *err, size_t errlen)
{
	struct engine_unit	*hu = NULL, *du = NULL;
	struct engine_item	 hi, *di = NULL;
	struct engine_res	 hr, *dr = NULL;
	uint64_t		*dig = NULL;
	uint32_t		*ok = NULL, nu = (uint32_t)((len + XXH3G_CHUNK - 1) / XXH3G_CHUNK), k;
	cudaError_t		 ce;
	const char		*what = "cudaMalloc";
	int			 rc = 0;

	if ((hu = (struct engine_unit *)calloc(nu + 1, sizeof(*hu))) == NULL)
		return -ENOMEM;
	for (k = 0; k < nu; k++) {
		hu[k].off = (uint64_t)k * XXH3G_CHUNK;
		hu[k].len = (uint32_t)(len - hu[k].off > XXH3G_CHUNK ? XXH3G_CHUNK : len - hu[k].off);
		hu[k].dig = k;
	}
	memset(&hi, 0, sizeof(hi));
	hi.bytes = len;
	hi.nunits = nu;
	if ((ce = cudaMalloc((void **)&du, (nu + 1) * sizeof(*du))) != cudaSuccess ||
	    (ce = cudaMalloc((void **)&di, sizeof(*di))) != cudaSuccess ||
	    (ce = cudaMalloc((void **)&dr, sizeof(*dr))) != cudaSuccess ||
	    (ce = cudaMalloc((void **)&dig, (nu + 1) * sizeof(*dig))) != cudaSuccess ||
	    (ce = cudaMalloc((void **)&ok, sizeof(*ok))) != cudaSuccess)
		goto out;
	what = "cudaMemcpy";
	if ((ce = cudaMemcpy(du, hu, (nu + 1) * sizeof(*du), cudaMemcpyHostToDevice)) !=
	    cudaSuccess ||
	    (ce = cudaMemcpy(di, &hi, sizeof(hi), cudaMemcpyHostToDevice)) != cudaSuccess)
		goto out;
	what = "the checksum kernel";
	if (nu > 0) {
		ENGINE_KERNEL(engine_csum_kernel, engine_warps(nu), ENGINE_THREADS, 0)(du, nu,
		    (const uint8_t *)dptr, dig);
		if ((ce = cudaGetLastError()) != cudaSuccess)
			goto out;
	}
	ENGINE_KERNEL(engine_finish_kernel, 1, 32, 0)(di, 1, dig, dr, ok, ENGINE_FIN_COMPUTE);
	if ((ce = cudaGetLastError()) != cudaSuccess ||
	    (ce = cudaMemcpy(&hr, dr, sizeof(hr), cudaMemcpyDeviceToHost)) != cudaSuccess)
		goto out;
	*out = hr.csum;
out:
	if (ce != cudaSuccess)
		rc = kernels_cuda_err(ce, what, err, errlen);
	(void)cudaFree(du);
	(void)cudaFree(di);
	(void)cudaFree(dr);
	(void)cudaFree(dig);
	(void)cudaFree(ok);
	free(hu);
	return rc;
}
