/*
 * The kernels stub, built when nvcc is absent: the daemon then runs with
 * the host copy engine only, and says so at start.
 */
#include <stdio.h>

#include "kernels.h"

int
kernels_built_with_cuda(void)
{
	return 0;
}

int
kernels_device_count(char *desc, size_t len)
{
	snprintf(desc, len, "built without CUDA (no nvcc at build time)");
	return 0;
}
