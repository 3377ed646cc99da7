/*
 * The CUDA kernels behind a plain C header: the daemon never includes a
 * CUDA header. Every function returns 0 (or a count) or -errno and
 * describes CUDA's own error text in a caller-supplied buffer.
 */
#ifndef L3KV_KERNELS_H
#define L3KV_KERNELS_H

#include <stddef.h>

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

#ifdef __cplusplus
}
#endif

#endif /* L3KV_KERNELS_H */
