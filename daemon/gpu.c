/*
 * Run-time GPU detection. cudart is linked statically, so the daemon
 * starts on machines without a driver; whether a GPU is usable is asked
 * once at start through the kernels/ C header (the stub answers "none"
 * in builds without nvcc).
 */
#include <stdio.h>

#include "daemon.h"
#include "kernels.h"

/* Number of usable GPUs (0 when none or no driver); desc says why. */
int
gpu_detect(char *desc, size_t len)
{
	int	n;

	n = kernels_device_count(desc, len);
	return n < 0 ? 0 : n;
}
