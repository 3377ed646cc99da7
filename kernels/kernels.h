/*
 * The CUDA kernels behind a plain C header: the daemon never includes a
 * CUDA header. Every function returns 0 (or a count) or -errno and
 * describes CUDA's own error text in a caller-supplied buffer. Builds
 * without nvcc link kernels_stub.c, whose functions answer -ENOSYS (and
 * 0 devices).
 *
 * Threading: every call about one engine, its regions and its ops comes
 * from one thread (the daemon's loop). The engine's notify fd is written
 * from a CUDA callback thread.
 *
 * The copy engine moves pages between objects in pinned host memory
 * (the DRAM arena, registered with kernels_host_register) and an
 * engine's device memory (an IPC-opened allocation described by a
 * kernels_geom). An object is one page in the page_first host layout:
 * page_tokens x layers x token_bytes bytes.
 *
 * Restore, per chunk of pages (at most one staging slot of bytes):
 *   1. host -> device staging slot: objects contiguous in host memory are
 *      coalesced into one cudaMemcpyAsync; runs shorter than
 *      conf.dma_min_bytes are gathered instead by a kernel reading the
 *      mapped host memory (zero-copy), which avoids the ~3 us per copy;
 *   2. the chunked checksum (checksum_obj's) of every staged object,
 *      computed on the GPU, compared with the expected value;
 *   3. if an engine event was given and has not completed, the chunk
 *      stays staged until the engine sees it complete (below);
 *   4. a scatter kernel writes the verified objects into the region
 *      (16-byte accesses where the geometry allows); an object whose
 *      checksum did not match is not written at all.
 * Chunks use conf.slots staging slots; their copies go back to back on
 * one copy stream per direction and their kernels rotate over
 * conf.streams streams, so the copy of one chunk overlaps the kernels of
 * the previous one and the link never waits for a kernel.
 *
 * Publish is the reverse: a gather kernel from the region into staging,
 * the checksum on the GPU, then device -> host into the objects.
 *
 * Completion: the engine issues at most conf.slots chunks ahead and
 * issues more from kernels_engine_progress(), which the daemon calls
 * whenever conf.notify_fd (an eventfd) turns readable: a CUDA host
 * callback writes 1 to it after every chunk. kernels_op_poll() also
 * progresses. An op given an engine event that has not completed yet
 * is gated: no stream ever waits on another process's event (one whose
 * process died would never complete and would wedge the stream), so the
 * engine queries the event at every progress and scatters (restore) or
 * starts (publish) only once it has completed; while kernels_engine_gated()
 * is nonzero the caller must call kernels_engine_progress() periodically,
 * since no callback reports another process's event. A gated restore
 * stages at most half the slots ahead; a gated publish waits whole; other
 * ops go on meanwhile. Nothing blocks except kernels_op_wait() and the _free
 * functions.
 *
 * Cancellation: kernels_op_cancel() sets a flag that the engine reads
 * before it issues each chunk; chunks already issued run to completion
 * (a GPU copy cannot be recalled). The op turns done only once every
 * issued chunk has completed, so CANCEL is answered when the op is done:
 * from then on nothing of it can land. The result's `launched` says how
 * many leading pages may have been written; the rest are untouched.
 */
#ifndef L3KV_KERNELS_H
#define L3KV_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when built with nvcc, 0 for the stub. */
int	kernels_built_with_cuda(void);

/*
 * Number of CUDA devices usable now, 0 when there is no driver or no
 * device (desc says which), -errno on other failures.
 */
int	kernels_device_count(char *desc, size_t len);

/*
 * Makes `device` current for the calling thread and creates its primary
 * context. -ENODEV when there is no driver (CUDA error 35) or no such
 * device (100, 101); -ENOSYS in the stub. kernels_fini() waits for the
 * device's work; resources are freed by their own _free/_close calls.
 */
int	kernels_init(int device, char *err, size_t len);
void	kernels_fini(void);

/*
 * Pinned host memory: registers [p, p + len) with CUDA, mapped and
 * portable, so that copies from it are DMA and kernels can read it
 * (zero-copy). Objects given to the engine must lie in a registered
 * range. At most KERNELS_HOST_REGS ranges.
 */
#define KERNELS_HOST_REGS	64
int	kernels_host_register(void *p, size_t len, char *err, size_t errlen);
int	kernels_host_unregister(void *p, char *err, size_t errlen);

/*
 * Engine memory. A legacy CUDA IPC handle (cudaIpcMemHandle_t, 64 bytes)
 * opened once per allocation; *size is the whole allocation's size as the
 * driver knows it (0 where it cannot say). IPC handles cannot be opened
 * by the process that made them.
 */
#define KERNELS_IPC_HANDLE_LEN	64
int	kernels_ipc_open(const void *handle, void **dptr, size_t *size, char *err, size_t len);
int	kernels_ipc_close(void *dptr, char *err, size_t len);

/*
 * The device allocation holding p, as the driver knows it (cudaMalloc,
 * IPC-opened and cuMem-mapped ranges alike): -EFAULT where p is not
 * device memory, -ENOTSUP where the driver cannot say.
 */
int	kernels_dev_range(const void *p, uintptr_t *base, size_t *size);

/*
 * The device whose memory dptr is (an IPC-opened or cuMem-mapped range
 * reports the GPU the exporter allocated it on): 0 and *device, or
 * -EFAULT where dptr is not device memory. kernels_current_device(): the
 * calling thread's current device, or -1.
 */
int	kernels_mem_device(const void *dptr, int *device);
int	kernels_current_device(void);

/*
 * cuMem allocations exported as POSIX fds: maps `size` bytes (the
 * exporter's size, a multiple of the allocation granularity) of the
 * allocation behind `fd` read-write on the current device. The fd stays
 * the caller's. Unmap with kernels_cumem_unmap(dptr, size).
 */
int	kernels_cumem_import(int fd, size_t size, void **dptr, char *err, size_t len);
int	kernels_cumem_unmap(void *dptr, size_t size, char *err, size_t len);

/*
 * Events: an engine's CUDA IPC event handle (cudaIpcEventHandle_t, 64
 * bytes). A restore or publish given one touches the region only after
 * the event's last record (as of the engine's query) has completed. The
 * event must outlive every op that names it.
 */
struct kernels_event;
int	kernels_event_open_ipc(const void *handle, struct kernels_event **out, char *err,
	    size_t len);
void	kernels_event_free(struct kernels_event *);

/* The copy engine: streams, staging slots, the chunk scheduler. */
struct kernels_engine;
struct kernels_conf {
	size_t		slot_bytes;	/* one staging slot; the largest object */
	unsigned	slots;		/* staging slots = chunks in flight (>= 2) */
	unsigned	streams;	/* kernel streams the chunks rotate over (>= 1) */
	unsigned	max_items;	/* pages per chunk */
	size_t		dma_min_bytes;	/* shorter host runs: zero-copy gather kernel */
	int		high_priority;	/* streams at the device's highest priority */
	int		notify_fd;	/* eventfd written after every chunk, or -1 */
	int		notify;		/* how the fd learns of a chunk: KERNELS_NOTIFY_* */
	int		timeline;	/* GPU timestamps of each op (kernels_op_times) */
	int		batch_dma;	/* runs >= batch_min_bytes by the chunk's one
					   cudaMemcpyBatchAsync, shorter by the kernel */
	size_t		batch_min_bytes;
	unsigned	copy_streams;	/* 1 or 2 per direction: chunks' DMA in flight at once */
	int		csum;		/* the checksum kernel's form: KERNELS_CSUM_* */
};
/*
 * The checksum kernel (XXH3-64 of each 64 KiB unit): CTA, the default,
 * gives each unit a CTA of 8 warps whose loads are all in flight at
 * once; WARP gives it one warp, which reduces each 1 KiB block across
 * the warp and scrambles, block after block (any other value is WARP).
 * On the H200 the last chunk's checksum kernel took 38 us by WARP and 13
 * by CTA (RESULTS.md, issue 16): the tail is the bytes in flight per
 * warp, not the order of the arithmetic (two other orders of it, since
 * removed, took 36 and 42 us).
 */
#define KERNELS_CSUM_WARP	0
#define KERNELS_CSUM_CTA	1	/* a CTA per unit, 8 warps, every block's loads at once */
/*
 * KERNELS_NOTIFY_CALLBACK: a CUDA host function (cudaLaunchHostFunc) after
 * each chunk writes the fd. KERNELS_NOTIFY_THREAD: a thread of the engine
 * waits (cudaEventSynchronize, spinning under the default scheduling) for
 * each chunk's event while chunks are in flight and writes the fd; it
 * sleeps on a condition variable when none are.
 */
#define KERNELS_NOTIFY_CALLBACK	0
#define KERNELS_NOTIFY_THREAD	1
/* The defaults (kernels_conf.c, built with and without nvcc). */
void	kernels_conf_default(struct kernels_conf *);
int	kernels_engine_new(const struct kernels_conf *, struct kernels_engine **out, char *err,
	    size_t len);
/* Waits for everything in flight; every op must have been freed. */
void	kernels_engine_free(struct kernels_engine *);
/*
 * Reaps completed chunks and issues the next ones; returns how many ops
 * turned done in this call (submit and poll progress too, so the caller
 * then checks its ops with kernels_op_poll()). The daemon calls it when
 * the notify fd is readable, after reading the fd.
 */
int	kernels_engine_progress(struct kernels_engine *);
/* Ops waiting for an engine event: while nonzero, progress must be polled. */
unsigned kernels_engine_gated(const struct kernels_engine *);
/*
 * Restores whose last chunk's DMA has ended and whose kernels (checksum,
 * scatter) are still running: a few tens of microseconds of GPU work. With
 * KERNELS_NOTIFY_THREAD the notify fd is written at that DMA's end as well
 * as at the chunk's end, so that a caller that polls while this is nonzero
 * (kernels_engine_progress) completes the op as soon as it is done, its
 * wake-up hidden behind the kernels.
 */
int	kernels_engine_tail(struct kernels_engine *);
/* Staging slots, and those holding a chunk now. */
void	kernels_engine_staging(const struct kernels_engine *, unsigned *slots, unsigned *busy);
/* The device the engine was created on (the current one at kernels_engine_new). */
int	kernels_engine_device(const struct kernels_engine *);
/*
 * Marks the engine broken, as a sticky CUDA error does: every op in flight
 * or submitted later fails (-EIO, why). For tests of a dead engine.
 */
void	kernels_engine_kill(struct kernels_engine *, const char *why);

/*
 * A destination in device memory, with proto_region's geometry: byte
 * (page p, layer l, token t) lives at base + p*page_stride +
 * l*layer_stride + t*token_stride, token_bytes long. With layer_bases
 * (layers device pointers, e.g. SGLang's per-layer buffers) it lives at
 * layer_bases[l] + p*page_stride + t*token_stride instead, and
 * layer_size bounds each. MLA is one region (one tensor per layer), MHA
 * two (K and V). FP8 is bytes. kernels_region_new checks that every
 * byte of every page lies within [base, base + size) and within the
 * device allocation the driver knows for that address, and picks the
 * widest access (16, 8, 4, 2 or 1 bytes) that base, strides and
 * token_bytes allow.
 */
struct kernels_geom {
	void		*base;
	uint64_t	 size;
	void *const	*layer_bases;	/* optional; copied */
	uint64_t	 layer_size;
	uint32_t	 num_pages;
	uint32_t	 page_tokens;
	uint32_t	 layers;
	uint32_t	 token_bytes;
	uint64_t	 page_stride;
	uint64_t	 layer_stride;
	uint64_t	 token_stride;
};
struct kernels_region;
int	kernels_region_new(struct kernels_engine *, const struct kernels_geom *,
	    struct kernels_region **out, char *err, size_t len);
/* Free only once no op names the region. */
void	kernels_region_free(struct kernels_region *);
/* The object size of a region's pages: page_tokens * layers * token_bytes. */
uint64_t kernels_region_obj_bytes(const struct kernels_region *);

/* One page of a restore or publish. */
struct kernels_page {
	void		*host;		/* the object, in registered host memory */
	uint64_t	 checksum;	/* restore: checksum_obj(host, obj_bytes) */
	uint32_t	 page;		/* page index in the region */
	uint32_t	 region;	/* index into the op's region list */
};
#define KERNELS_REGIONS_MAX	4

#define KERNELS_F_NOVERIFY	0x01	/* restore without the checksum (benchmarks) */
#define KERNELS_F_DMA		0x02	/* every host run by cudaMemcpyAsync */
#define KERNELS_F_ZEROCOPY	0x04	/* every host run by the gather kernel */
#define KERNELS_F_BATCH		0x08	/* every host run by one cudaMemcpyBatchAsync a chunk */
#define KERNELS_F_MIX		0x10	/* short runs alternately by the batch and the kernel */

/*
 * Starts a restore of n pages (pages[] is copied) into the regions. The
 * pages are issued in order, in chunks. Returns 0 and the op, or -errno
 * with nothing started: -EINVAL for a page out of its region, a page
 * named twice, host memory not registered, -E2BIG for an object larger
 * than a staging slot. `wait` may be NULL.
 */
struct kernels_op;
int	kernels_restore_submit(struct kernels_engine *, struct kernels_region *const *regions,
	    unsigned nregions, const struct kernels_page *pages, uint32_t n,
	    const struct kernels_event *wait, unsigned flags, struct kernels_op **out,
	    char *err, size_t len);
/* The reverse: region pages into the objects at pages[i].host; checksums in the result. */
int	kernels_publish_submit(struct kernels_engine *, struct kernels_region *const *regions,
	    unsigned nregions, const struct kernels_page *pages, uint32_t n,
	    const struct kernels_event *wait, unsigned flags, struct kernels_op **out,
	    char *err, size_t len);

/* 1 once the op is done (progresses the engine), 0 while in flight. */
int	kernels_op_poll(struct kernels_op *);
/* Blocks until the op is done; returns its status. */
int	kernels_op_wait(struct kernels_op *);
/* No more chunks of the op are issued; it is done once the issued ones are. */
void	kernels_op_cancel(struct kernels_op *);

#define KERNELS_PAGE_DONE	0	/* verified and written / read and checksummed */
#define KERNELS_PAGE_BAD	1	/* checksum mismatch: its destination untouched */
#define KERNELS_PAGE_SKIPPED	2	/* never issued (cancel or error): untouched */
struct kernels_result {
	int		status;		/* 0, -EBADMSG (a page BAD), -ECANCELED, -EIO */
	uint32_t	pages;		/* n */
	uint32_t	launched;	/* leading pages whose writes were issued: only these
					   may have landed (a gated chunk counts once scattered) */
	uint32_t	done;		/* pages DONE */
	uint32_t	nbad;		/* pages BAD */
	uint32_t	first_bad;	/* index in pages[] of the first BAD, or UINT32_MAX */
	char		err[192];	/* CUDA's text for -EIO */
};
/*
 * The result of a done op (-EBUSY while in flight). page_status (n bytes,
 * KERNELS_PAGE_*) and checksums (n; publish: the objects' checksums,
 * restore: as computed on the GPU, 0 for pages not verified) may be NULL.
 */
int	kernels_op_result(const struct kernels_op *, struct kernels_result *, uint8_t *page_status,
	    uint64_t *checksums);
/* Frees an op; one still in flight is cancelled and waited for first. */
void	kernels_op_free(struct kernels_op *);

/*
 * Where a done op's time went, in CLOCK_MONOTONIC nanoseconds (0: not
 * known). Host side, always: submitted, its first and last chunk issued,
 * the last notification of one of its chunks (the CUDA host function or
 * the waiter thread), done (seen by a progress). GPU side, with
 * conf.timeline only (GPU clock stamps, mapped onto the host clock at
 * engine start, about 1-2 us apart): its first DMA started, its last DMA
 * ended, its last chunk's kernels began (their stream past the DMA's
 * event) and its checksum kernel ended, its last chunk verified (the
 * per-object verify kernel), its last chunk written
 * (scatter). For benchmarks and the daemon's STATS.
 */
struct kernels_op_times {
	uint64_t	submit;
	uint64_t	first_issue;
	uint64_t	last_issue;
	uint64_t	gpu_dma_start;
	uint64_t	gpu_dma_end;
	uint64_t	gpu_csum_start;	/* the last chunk's kernels stream past the DMA's event */
	uint64_t	gpu_csum_end;	/* its checksum kernel ended (the verify kernel next) */
	uint64_t	gpu_verified;
	uint64_t	gpu_end;
	uint64_t	notify;
	uint64_t	done;
};
int	kernels_op_times(const struct kernels_op *, struct kernels_op_times *);

/*
 * The chunked checksum (checksum_obj's) of len bytes at a device
 * address, computed by the engine's kernels on the current device;
 * synchronous. For tests.
 */
int	kernels_checksum_device(const void *dptr, size_t len, uint64_t *out, char *err,
	    size_t errlen);

/*
 * The engine's side, for tests and benchmarks (the daemon never calls
 * these): device memory, synchronous copies (cudaMemcpy, any direction),
 * exporting IPC handles, events recorded on the legacy default stream,
 * exportable cuMem allocations.
 */
int	kernels_dev_alloc(size_t len, void **dptr, char *err, size_t errlen);
void	kernels_dev_free(void *dptr);
int	kernels_copy(void *dst, const void *src, size_t len, char *err, size_t errlen);
int	kernels_memset(void *dptr, int c, size_t len, char *err, size_t errlen);
int	kernels_ipc_export(void *dptr, void *handle, char *err, size_t len);
int	kernels_event_new(int interprocess, struct kernels_event **out, char *err, size_t len);
int	kernels_event_record(struct kernels_event *, char *err, size_t len);
int	kernels_event_export(struct kernels_event *, void *handle, char *err, size_t len);
int	kernels_cumem_alloc(size_t len, void **dptr, size_t *alloc_size, int *fd, char *err,
	    size_t errlen);
int	kernels_cumem_free(void *dptr, size_t alloc_size, char *err, size_t errlen);

/*
 * Benchmark baselines, timed by the caller around the call (each ends
 * with a synchronize): the objects of pages[] copied by one
 * cudaMemcpyAsync per page into a page_first geometry
 * (KERNELS_BENCH_PER_PAGE), or by one cudaMemcpy2DAsync per (page,
 * layer) into any geometry (KERNELS_BENCH_PER_LAYER); no verification.
 */
#define KERNELS_BENCH_PER_PAGE	1
#define KERNELS_BENCH_PER_LAYER	2
int	kernels_bench_copy(int how, const struct kernels_geom *, const struct kernels_page *pages,
	    uint32_t n, char *err, size_t len);
/*
 * The same bytes as one cudaMemcpy, but as cudaMemcpyAsync pieces of
 * `chunk` bytes issued round robin on `streams` streams, then a
 * synchronize: what the restore engine's DMA alone can reach.
 */
int	kernels_bench_chunked(void *dst, const void *src, size_t len, size_t chunk,
	    unsigned streams, char *err, size_t errlen);
/*
 * A busy kernel on its own lowest-priority stream that keeps every SM
 * occupied (short blocks, a huge grid) until kernels_busy_stop().
 */
int	kernels_busy_start(char *err, size_t len);
int	kernels_busy_stop(char *err, size_t len);
/*
 * A late writer, for tests of event ordering: enqueues on the legacy
 * default stream a kernel that waits ms milliseconds (GPU time), then
 * sets height rows of width bytes, pitch apart, from dptr to c. Returns
 * once it is enqueued; kernels_event_record() after it marks its end.
 */
int	kernels_late_fill(void *dptr, size_t pitch, size_t width, size_t height, int c,
	    unsigned ms, char *err, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* L3KV_KERNELS_H */
