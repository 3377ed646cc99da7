/*
 * Device discovery, context, engine memory and the benchmarks' side of
 * the cuda copy engine. cudart is linked statically, and CUDA is only
 * touched here at run time: on a machine without a driver
 * cudaGetDeviceCount() fails (cudaErrorInsufficientDriver, 35, or
 * cudaErrorNoDevice, 100) and the daemon falls back to the host engine.
 *
 * The driver API (cuMem VMM for POSIX-fd allocations, the address range
 * of a device pointer) is reached through cudaGetDriverEntryPointByVersion,
 * never by linking libcuda: cuda.h is included for its types only.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda_err.h"
#include "kernels.h"
#include "kernels_uuid.h"

extern "C" int
kernels_built_with_cuda(void)
{
	return 1;
}

extern "C" int
kernels_device_count(char *desc, size_t len)
{
	cudaDeviceProp	prop;
	cudaError_t	e;
	int		n = 0;

	e = cudaGetDeviceCount(&n);
	if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
		snprintf(desc, len, "no usable GPU: %s", cudaGetErrorString(e));
		return 0;
	}
	if (e != cudaSuccess) {
		snprintf(desc, len, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
		return -EIO;
	}
	if (n > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
		snprintf(desc, len, "%d GPU(s), device 0: %s, sm_%d%d, %zu MiB", n, prop.name,
		    prop.major, prop.minor, prop.totalGlobalMem >> 20);
	else
		snprintf(desc, len, "%d GPU(s)", n);
	return n;
}

/*
 * The device's UUID from its properties (cudaDeviceProp.uuid is what
 * cuDeviceGetUuid answers, and what nvidia-smi and torch print), without
 * making a context on it.
 */
extern "C" int
kernels_device_uuid(int device, char *out, size_t outlen, char *err, size_t len)
{
	cudaDeviceProp		 prop;
	const unsigned char	*u;

	if (outlen < KERNELS_UUID_LEN) {
		snprintf(err, len, "a GPU UUID needs %d bytes, not %zu", KERNELS_UUID_LEN, outlen);
		return -ENOSPC;
	}
	KERNELS_TRY(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
	u = (const unsigned char *)prop.uuid.bytes;
	snprintf(out, outlen, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
	    "%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8],
	    u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
	return 0;
}

extern "C" int
kernels_init(int device, char *err, size_t len)
{
	cudaDeviceProp	prop;
	int		n = 0;

	KERNELS_TRY(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
	if (device < 0 || device >= n) {
		snprintf(err, len, "no CUDA device %d (%d present)", device, n);
		return -ENODEV;
	}
	KERNELS_TRY(cudaSetDevice(device), "cudaSetDevice");
	KERNELS_TRY(cudaFree(0), "creating the primary context");
	KERNELS_TRY(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
	/* Zero-copy gathers read the arena through its device mapping. */
	if (!prop.canMapHostMemory || !prop.unifiedAddressing) {
		snprintf(err, len, "device %d (%s) cannot map host memory", device, prop.name);
		return -ENOTSUP;
	}
	return 0;
}

extern "C" void
kernels_fini(void)
{
	(void)cudaDeviceSynchronize();
	(void)cudaGetLastError();
}

/*
 * The driver API, resolved once. Each pointer stays NULL where the driver
 * lacks the symbol; callers say so.
 */
typedef CUresult (*device_fn_range)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*device_fn_errstr)(CUresult, const char **);
typedef CUresult (*device_fn_import)(CUmemGenericAllocationHandle *, void *,
    CUmemAllocationHandleType);
typedef CUresult (*device_fn_export)(void *, CUmemGenericAllocationHandle,
    CUmemAllocationHandleType, unsigned long long);
typedef CUresult (*device_fn_create)(CUmemGenericAllocationHandle *, size_t,
    const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*device_fn_gran)(size_t *, const CUmemAllocationProp *,
    CUmemAllocationGranularity_flags);
typedef CUresult (*device_fn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
    unsigned long long);
typedef CUresult (*device_fn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
    unsigned long long);
typedef CUresult (*device_fn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*device_fn_handle)(CUmemGenericAllocationHandle);
typedef CUresult (*device_fn_span)(CUdeviceptr, size_t);

static struct {
	int			resolved;
	device_fn_range		range;
	device_fn_errstr	errstr;
	device_fn_import	import;
	device_fn_export	exportfd;
	device_fn_create	create;
	device_fn_gran		gran;
	device_fn_reserve	reserve;
	device_fn_map		map;
	device_fn_access	access;
	device_fn_handle	release;
	device_fn_span		unmap;
	device_fn_span		addrfree;
} device_drv;

static void *
device_sym(const char *name)
{
	cudaDriverEntryPointQueryResult	q;
	void				*fn = NULL;

	/* 12000: the CUDA 12 ABI of each symbol (cuMemGetAddressRange_v2, ...). */
	if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) !=
	    cudaSuccess || q != cudaDriverEntryPointSuccess) {
		(void)cudaGetLastError();
		return NULL;
	}
	return fn;
}

static void
device_resolve(void)
{
	if (device_drv.resolved)
		return;
	device_drv.range = (device_fn_range)device_sym("cuMemGetAddressRange");
	device_drv.errstr = (device_fn_errstr)device_sym("cuGetErrorString");
	device_drv.import = (device_fn_import)device_sym("cuMemImportFromShareableHandle");
	device_drv.exportfd = (device_fn_export)device_sym("cuMemExportToShareableHandle");
	device_drv.create = (device_fn_create)device_sym("cuMemCreate");
	device_drv.gran = (device_fn_gran)device_sym("cuMemGetAllocationGranularity");
	device_drv.reserve = (device_fn_reserve)device_sym("cuMemAddressReserve");
	device_drv.map = (device_fn_map)device_sym("cuMemMap");
	device_drv.access = (device_fn_access)device_sym("cuMemSetAccess");
	device_drv.release = (device_fn_handle)device_sym("cuMemRelease");
	device_drv.unmap = (device_fn_span)device_sym("cuMemUnmap");
	device_drv.addrfree = (device_fn_span)device_sym("cuMemAddressFree");
	device_drv.resolved = 1;
}

static int
device_cu_err(CUresult r, const char *what, char *err, size_t len)
{
	const char	*s = NULL;

	if (device_drv.errstr == NULL || device_drv.errstr(r, &s) != CUDA_SUCCESS || s == NULL)
		s = "unknown driver error";
	if (err != NULL && len > 0)
		snprintf(err, len, "%s: %s (CUDA driver error %d)", what, s, (int)r);
	return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM :
	    r == CUDA_ERROR_INVALID_VALUE ? -EINVAL : -EIO;
}

#define DEVICE_CU(call, what) do {					\
	CUresult _r = (call);						\
	if (_r != CUDA_SUCCESS)						\
		return device_cu_err(_r, what, err, len);		\
} while (0)

static int
device_need_vmm(char *err, size_t len)
{
	device_resolve();
	if (device_drv.import == NULL || device_drv.exportfd == NULL || device_drv.create == NULL ||
	    device_drv.gran == NULL || device_drv.reserve == NULL || device_drv.map == NULL ||
	    device_drv.access == NULL || device_drv.release == NULL || device_drv.unmap == NULL ||
	    device_drv.addrfree == NULL) {
		snprintf(err, len, "the CUDA driver lacks the cuMem VMM entry points");
		return -ENOTSUP;
	}
	return 0;
}

/*
 * The device allocation containing p, as the driver knows it: cudaMalloc,
 * IPC-opened and cuMem-mapped ranges alike. -ENOTSUP where the driver
 * cannot say, -EFAULT where p is not device memory.
 */
extern "C" int
kernels_dev_range(const void *p, uintptr_t *base, size_t *size)
{
	CUdeviceptr	b = 0;
	size_t		s = 0;

	device_resolve();
	if (device_drv.range == NULL)
		return -ENOTSUP;
	if (device_drv.range(&b, &s, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
		return -EFAULT;
	*base = (uintptr_t)b;
	*size = s;
	return 0;
}

extern "C" int
kernels_ipc_open(const void *handle, void **dptr, size_t *size, char *err, size_t len)
{
	cudaIpcMemHandle_t	h;
	uintptr_t		base;
	size_t			s;
	void			*p = NULL;

	memcpy(&h, handle, sizeof(h));
	KERNELS_TRY(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
	    "cudaIpcOpenMemHandle");
	*dptr = p;
	if (size != NULL)
		*size = kernels_dev_range(p, &base, &s) == 0 && base == (uintptr_t)p ? s : 0;
	return 0;
}

extern "C" int
kernels_mem_device(const void *dptr, int *device)
{
	cudaPointerAttributes	a;

	memset(&a, 0, sizeof(a));
	if (cudaPointerGetAttributes(&a, dptr) != cudaSuccess) {
		(void)cudaGetLastError();
		return -EFAULT;
	}
	if (a.type != cudaMemoryTypeDevice || a.device < 0)
		return -EFAULT;
	*device = a.device;
	return 0;
}

extern "C" int
kernels_current_device(void)
{
	int	d = -1;

	if (cudaGetDevice(&d) != cudaSuccess) {
		(void)cudaGetLastError();
		return -1;
	}
	return d;
}

extern "C" int
kernels_ipc_close(void *dptr, char *err, size_t len)
{
	KERNELS_TRY(cudaIpcCloseMemHandle(dptr), "cudaIpcCloseMemHandle");
	return 0;
}

extern "C" int
kernels_ipc_export(void *dptr, void *handle, char *err, size_t len)
{
	cudaIpcMemHandle_t	h;

	KERNELS_TRY(cudaIpcGetMemHandle(&h, dptr), "cudaIpcGetMemHandle");
	memcpy(handle, &h, sizeof(h));
	return 0;
}

static int
device_current(int *dev, char *err, size_t len)
{
	KERNELS_TRY(cudaGetDevice(dev), "cudaGetDevice");
	return 0;
}

static void
device_prop(CUmemAllocationProp *prop, int dev)
{
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Maps handle h at a new reservation of size bytes, read-write for dev. */
static int
device_map(CUmemGenericAllocationHandle h, size_t size, int dev, void **dptr, char *err,
    size_t len)
{
	CUmemAccessDesc	acc;
	CUdeviceptr	va = 0;
	CUresult	r;

	DEVICE_CU(device_drv.reserve(&va, size, 0, 0, 0), "cuMemAddressReserve");
	if ((r = device_drv.map(va, size, 0, h, 0)) != CUDA_SUCCESS) {
		device_drv.addrfree(va, size);
		return device_cu_err(r, "cuMemMap", err, len);
	}
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = dev;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if ((r = device_drv.access(va, size, &acc, 1)) != CUDA_SUCCESS) {
		device_drv.unmap(va, size);
		device_drv.addrfree(va, size);
		return device_cu_err(r, "cuMemSetAccess", err, len);
	}
	*dptr = (void *)(uintptr_t)va;
	return 0;
}

extern "C" int
kernels_cumem_import(int fd, size_t size, void **dptr, char *err, size_t len)
{
	CUmemGenericAllocationHandle	h;
	int				dev, rc;

	if ((rc = device_need_vmm(err, len)) != 0 || (rc = device_current(&dev, err, len)) != 0)
		return rc;
	DEVICE_CU(device_drv.import(&h, (void *)(uintptr_t)fd,
	    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), "cuMemImportFromShareableHandle");
	rc = device_map(h, size, dev, dptr, err, len);
	/* The mapping holds its own reference to the allocation. */
	device_drv.release(h);
	return rc;
}

extern "C" int
kernels_cumem_unmap(void *dptr, size_t size, char *err, size_t len)
{
	int	rc;

	if ((rc = device_need_vmm(err, len)) != 0)
		return rc;
	DEVICE_CU(device_drv.unmap((CUdeviceptr)(uintptr_t)dptr, size), "cuMemUnmap");
	DEVICE_CU(device_drv.addrfree((CUdeviceptr)(uintptr_t)dptr, size), "cuMemAddressFree");
	return 0;
}

extern "C" int
kernels_cumem_alloc(size_t size, void **dptr, size_t *alloc_size, int *fd, char *err, size_t len)
{
	CUmemGenericAllocationHandle	h;
	CUmemAllocationProp		prop;
	size_t				g = 0;
	int				dev, rc, f = -1;
	CUresult			r;

	if ((rc = device_need_vmm(err, len)) != 0 || (rc = device_current(&dev, err, len)) != 0)
		return rc;
	device_prop(&prop, dev);
	DEVICE_CU(device_drv.gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	    "cuMemGetAllocationGranularity");
	size = (size + g - 1) / g * g;
	DEVICE_CU(device_drv.create(&h, size, &prop, 0), "cuMemCreate");
	if ((r = device_drv.exportfd(&f, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) !=
	    CUDA_SUCCESS) {
		device_drv.release(h);
		return device_cu_err(r, "cuMemExportToShareableHandle", err, len);
	}
	rc = device_map(h, size, dev, dptr, err, len);
	device_drv.release(h);
	if (rc != 0)
		return rc;
	*alloc_size = size;
	*fd = f;
	return 0;
}

extern "C" int
kernels_cumem_free(void *dptr, size_t alloc_size, char *err, size_t len)
{
	return kernels_cumem_unmap(dptr, alloc_size, err, len);
}

extern "C" int
kernels_dev_alloc(size_t size, void **dptr, char *err, size_t len)
{
	KERNELS_TRY(cudaMalloc(dptr, size), "cudaMalloc");
	return 0;
}

extern "C" void
kernels_dev_free(void *dptr)
{
	if (dptr != NULL)
		(void)cudaFree(dptr);
}

extern "C" int
kernels_copy(void *dst, const void *src, size_t size, char *err, size_t len)
{
	KERNELS_TRY(cudaMemcpy(dst, src, size, cudaMemcpyDefault), "cudaMemcpy");
	return 0;
}

extern "C" int
kernels_memset(void *dptr, int c, size_t size, char *err, size_t len)
{
	KERNELS_TRY(cudaMemset(dptr, c, size), "cudaMemset");
	KERNELS_TRY(cudaDeviceSynchronize(), "cudaMemset (synchronize)");
	return 0;
}

/* Where (page, layer 0..) of a geometry starts, per layer. */
static uint8_t *
device_geom_at(const struct kernels_geom *g, uint32_t page, uint32_t layer)
{
	uint8_t	*b = g->layer_bases != NULL ? (uint8_t *)g->layer_bases[layer] :
	    (uint8_t *)g->base + (uint64_t)layer * g->layer_stride;

	return b + (uint64_t)page * g->page_stride;
}

extern "C" int
kernels_bench_copy(int how, const struct kernels_geom *g, const struct kernels_page *pages,
    uint32_t n, char *err, size_t len)
{
	uint64_t	row = (uint64_t)g->layers * g->token_bytes;
	uint64_t	obj = row * g->page_tokens;
	cudaStream_t	s;
	cudaError_t	e = cudaSuccess;
	uint32_t	i, l;

	if (how == KERNELS_BENCH_PER_PAGE && (g->layer_bases != NULL ||
	    g->layer_stride != g->token_bytes || g->token_stride != row)) {
		snprintf(err, len, "one copy per page needs a page_first geometry");
		return -EINVAL;
	}
	KERNELS_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
	for (i = 0; i < n && e == cudaSuccess; i++) {
		if (how == KERNELS_BENCH_PER_PAGE) {
			e = cudaMemcpyAsync(device_geom_at(g, pages[i].page, 0), pages[i].host, obj,
			    cudaMemcpyHostToDevice, s);
			continue;
		}
		for (l = 0; l < g->layers && e == cudaSuccess; l++)
			e = cudaMemcpy2DAsync(device_geom_at(g, pages[i].page, l), g->token_stride,
			    (const uint8_t *)pages[i].host + (uint64_t)l * g->token_bytes, row,
			    g->token_bytes, g->page_tokens, cudaMemcpyHostToDevice, s);
	}
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(s);
	(void)cudaStreamDestroy(s);
	if (e != cudaSuccess)
		return kernels_cuda_err(e, how == KERNELS_BENCH_PER_PAGE ? "cudaMemcpyAsync per page" :
		    "cudaMemcpy2DAsync per (page, layer)", err, len);
	return 0;
}

/*
 * The busy kernel: each block spins about 20 us of arithmetic, unless the
 * stop flag (mapped host memory) is set when it starts. A grid far larger
 * than the device holds keeps every SM occupied until the flag is set;
 * the remaining blocks then drain in microseconds.
 */
#define DEVICE_BUSY_BLOCKS	(1U << 20)
#define DEVICE_BUSY_CYCLES	40000LL

static __global__ void
device_busy_kernel(const volatile int *stop, float *sink)
{
	__shared__ int	quit;
	long long	t0;
	float		x = (float)threadIdx.x;

	if (threadIdx.x == 0)
		quit = *stop;
	__syncthreads();
	if (quit)
		return;
	t0 = clock64();
	while (clock64() - t0 < DEVICE_BUSY_CYCLES) {
		for (int i = 0; i < 64; i++)
			x = x * 1.0000001f + 0.5f;
	}
	if (x == 42.0f)
		sink[threadIdx.x] = x;	/* never: keeps the arithmetic alive */
}

static struct {
	cudaStream_t	 stream;
	int		*stop;		/* cudaHostAlloc, mapped */
	int		*dstop;
	float		*sink;
} device_busy;

extern "C" int
kernels_busy_start(char *err, size_t len)
{
	int	lo, hi;

	if (device_busy.stream != NULL) {
		snprintf(err, len, "the busy kernel is already running");
		return -EBUSY;
	}
	KERNELS_TRY(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
	if (device_busy.stop == NULL) {
		KERNELS_TRY(cudaHostAlloc((void **)&device_busy.stop, sizeof(int),
		    cudaHostAllocMapped), "cudaHostAlloc");
		KERNELS_TRY(cudaHostGetDevicePointer((void **)&device_busy.dstop, device_busy.stop, 0),
		    "cudaHostGetDevicePointer");
		KERNELS_TRY(cudaMalloc((void **)&device_busy.sink, 1024 * sizeof(float)), "cudaMalloc");
	}
	*(volatile int *)device_busy.stop = 0;
	/* lo is the least priority (the larger number) */
	KERNELS_TRY(cudaStreamCreateWithPriority(&device_busy.stream, cudaStreamNonBlocking, lo),
	    "cudaStreamCreateWithPriority");
	device_busy_kernel<<<DEVICE_BUSY_BLOCKS, 256, 0, device_busy.stream>>>(device_busy.dstop,
	    device_busy.sink);
	KERNELS_TRY(cudaGetLastError(), "launching the busy kernel");
	return 0;
}

extern "C" int
kernels_busy_stop(char *err, size_t len)
{
	cudaError_t	e;

	if (device_busy.stream == NULL)
		return 0;
	*(volatile int *)device_busy.stop = 1;
	e = cudaStreamSynchronize(device_busy.stream);
	(void)cudaStreamDestroy(device_busy.stream);
	device_busy.stream = NULL;
	if (e != cudaSuccess)
		return kernels_cuda_err(e, "the busy kernel", err, len);
	return 0;
}

/*
 * The late writer: every block's first thread waits on the global timer
 * (nanoseconds) until ns have passed since the block started, then the
 * block fills its share of the rows.
 */
static __global__ void
device_late_fill_kernel(uint8_t *p, size_t pitch, size_t width, size_t height, uint8_t c,
    unsigned long long ns)
{
	unsigned long long	t0, t;
	size_t			i, n = width * height;

	if (threadIdx.x == 0) {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
		do {
			__nanosleep(10000);
			asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
		} while (t - t0 < ns);
	}
	__syncthreads();
	for (i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	    i += (size_t)gridDim.x * blockDim.x)
		p[(i / width) * pitch + i % width] = c;
}

extern "C" int
kernels_late_fill(void *dptr, size_t pitch, size_t width, size_t height, int c, unsigned ms,
    char *err, size_t len)
{
	size_t	n = width * height;
	unsigned blocks = (unsigned)(n / 4096 > 1024 ? 1024 : n / 4096 + 1);

	if (dptr == NULL || width == 0 || height == 0 || (height > 1 && pitch < width)) {
		snprintf(err, len, "kernels_late_fill: bad arguments");
		return -EINVAL;
	}
	device_late_fill_kernel<<<blocks, 256, 0, 0>>>((uint8_t *)dptr, pitch, width, height,
	    (uint8_t)c, (unsigned long long)ms * 1000000ULL);
	KERNELS_TRY(cudaGetLastError(), "launching the late fill kernel");
	return 0;
}

extern "C" int
kernels_bench_chunked(void *dst, const void *src, size_t len, size_t chunk, unsigned streams,
    char *err, size_t errlen)
{
	cudaStream_t	s[8];
	cudaError_t	e = cudaSuccess;
	size_t		off;
	unsigned	i, n = streams < 1 ? 1 : streams > 8 ? 8 : streams;

	if (chunk == 0) {
		snprintf(err, errlen, "kernels_bench_chunked: chunk 0");
		return -EINVAL;
	}
	for (i = 0; i < n; i++)
		KERNELS_TRY(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking),
		    "cudaStreamCreateWithFlags");
	for (off = 0, i = 0; off < len && e == cudaSuccess; off += chunk, i++)
		e = cudaMemcpyAsync((uint8_t *)dst + off, (const uint8_t *)src + off,
		    len - off < chunk ? len - off : chunk, cudaMemcpyDefault, s[i % n]);
	if (e == cudaSuccess)
		e = cudaDeviceSynchronize();
	for (i = 0; i < n; i++)
		(void)cudaStreamDestroy(s[i]);
	if (e != cudaSuccess)
		return kernels_cuda_err(e, "chunked cudaMemcpyAsync", err, errlen);
	return 0;
}
