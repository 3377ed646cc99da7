/*
 * A CUDA device's identity across processes: its GPU UUID. A device
 * ordinal depends on the process's CUDA_VISIBLE_DEVICES, the UUID does
 * not, so an engine and the daemon agree on a GPU by its UUID
 * (kernels/device.cu; the stub answers -ENOSYS). Beside kernels.h, with
 * the same conventions.
 */
#ifndef L3KV_KERNELS_UUID_H
#define L3KV_KERNELS_UUID_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "GPU-" and 8-4-4-4-12 hex digits, as nvidia-smi -L prints it, and the NUL. */
#define KERNELS_UUID_LEN	41

/*
 * The UUID of CUDA device `device` (this process's ordinal) into out
 * (at least KERNELS_UUID_LEN bytes), lower-case hex. 0, or -errno with
 * err filled: -ENODEV without a driver or without such a device,
 * -ENOSPC for a short out, -ENOSYS in the stub. Creates no context.
 */
int	kernels_device_uuid(int device, char *out, size_t outlen, char *err, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* L3KV_KERNELS_UUID_H */
