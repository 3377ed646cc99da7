/*
 * CUDA errors at the boundary, shared by the kernels/ translation units:
 * CUDA's own text goes to the caller's buffer, the error becomes -errno,
 * and a non-sticky error is cleared so the next call does not see it.
 * Private to kernels/: the daemon never includes a CUDA header.
 */
#ifndef L3KV_CUDA_ERR_H
#define L3KV_CUDA_ERR_H

#include <errno.h>
#include <stdio.h>

#include <cuda_runtime.h>

static inline int
kernels_cuda_err(cudaError_t e, const char *what, char *err, size_t len)
{
	if (err != NULL && len > 0)
		snprintf(err, len, "%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
	(void)cudaGetLastError();
	switch (e) {
	case cudaErrorInsufficientDriver:
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
		return -ENODEV;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
		return -EINVAL;
	default:
		return -EIO;
	}
}

/* Returns the mapped error from the calling function when call fails. */
#define KERNELS_TRY(call, what) do {					\
	cudaError_t _e = (call);					\
	if (_e != cudaSuccess)						\
		return kernels_cuda_err(_e, what, err, len);		\
} while (0)

#endif /* L3KV_CUDA_ERR_H */
