/*
 * Device discovery for the cuda copy engine. cudart is linked statically,
 * and CUDA is only touched here at run time: on a machine without a
 * driver cudaGetDeviceCount() fails (cudaErrorInsufficientDriver, 35, or
 * cudaErrorNoDevice, 100) and the daemon falls back to the host engine.
 */
#include <stdio.h>

#include <cuda_runtime.h>

#include "kernels.h"

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
		return -5;	/* -EIO */
	}
	if (n > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
		snprintf(desc, len, "%d GPU(s), device 0: %s, sm_%d%d, %zu MiB", n, prop.name,
		    prop.major, prop.minor, prop.totalGlobalMem >> 20);
	else
		snprintf(desc, len, "%d GPU(s)", n);
	return n;
}
