/*
 * The kernels stub, built when nvcc is absent: the daemon then runs with
 * the host copy engine only, and says so at start. Every call answers
 * -ENOSYS (and "built without CUDA" where there is an error buffer);
 * kernels_device_count() answers 0 devices.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "kernels_uuid.h"

#define STUB_WHY	"built without CUDA (no nvcc at build time)"

static int
stub_nosys(char *err, size_t len)
{
	if (err != NULL && len > 0)
		snprintf(err, len, "%s", STUB_WHY);
	return -ENOSYS;
}

int
kernels_built_with_cuda(void)
{
	return 0;
}

int
kernels_device_count(char *desc, size_t len)
{
	snprintf(desc, len, "%s", STUB_WHY);
	return 0;
}

int
kernels_device_uuid(int device, char *out, size_t outlen, char *err, size_t len)
{
	(void)device;
	if (out != NULL && outlen > 0)
		out[0] = '\0';
	return stub_nosys(err, len);
}

int
kernels_init(int device, char *err, size_t len)
{
	(void)device;
	return stub_nosys(err, len);
}

void
kernels_fini(void)
{
}

int
kernels_host_register(void *p, size_t len, char *err, size_t errlen)
{
	(void)p;
	(void)len;
	return stub_nosys(err, errlen);
}

int
kernels_host_unregister(void *p, char *err, size_t errlen)
{
	(void)p;
	return stub_nosys(err, errlen);
}

int
kernels_ipc_open(const void *handle, void **dptr, size_t *size, char *err, size_t len)
{
	(void)handle;
	(void)dptr;
	(void)size;
	return stub_nosys(err, len);
}

int
kernels_ipc_close(void *dptr, char *err, size_t len)
{
	(void)dptr;
	return stub_nosys(err, len);
}

int
kernels_dev_range(const void *p, uintptr_t *base, size_t *size)
{
	(void)p;
	(void)base;
	(void)size;
	return -ENOSYS;
}

int
kernels_cumem_import(int fd, size_t size, void **dptr, char *err, size_t len)
{
	(void)fd;
	(void)size;
	(void)dptr;
	return stub_nosys(err, len);
}

int
kernels_cumem_unmap(void *dptr, size_t size, char *err, size_t len)
{
	(void)dptr;
	(void)size;
	return stub_nosys(err, len);
}

int
kernels_event_open_ipc(const void *handle, struct kernels_event **out, char *err, size_t len)
{
	(void)handle;
	(void)out;
	return stub_nosys(err, len);
}

void
kernels_event_free(struct kernels_event *ev)
{
	(void)ev;
}

int
kernels_engine_new(const struct kernels_conf *c, struct kernels_engine **out, char *err,
    size_t len)
{
	(void)c;
	(void)out;
	return stub_nosys(err, len);
}

void
kernels_engine_free(struct kernels_engine *e)
{
	(void)e;
}

int
kernels_engine_progress(struct kernels_engine *e)
{
	(void)e;
	return -ENOSYS;
}

unsigned
kernels_engine_gated(const struct kernels_engine *e)
{
	(void)e;
	return 0;
}

int
kernels_region_new(struct kernels_engine *e, const struct kernels_geom *g,
    struct kernels_region **out, char *err, size_t len)
{
	(void)e;
	(void)g;
	(void)out;
	return stub_nosys(err, len);
}

void
kernels_region_free(struct kernels_region *r)
{
	(void)r;
}

uint64_t
kernels_region_obj_bytes(const struct kernels_region *r)
{
	(void)r;
	return 0;
}

int
kernels_restore_submit(struct kernels_engine *e, struct kernels_region *const *regions,
    unsigned nregions, const struct kernels_page *pages, uint32_t n,
    const struct kernels_event *wait, unsigned flags, struct kernels_op **out, char *err,
    size_t len)
{
	(void)e;
	(void)regions;
	(void)nregions;
	(void)pages;
	(void)n;
	(void)wait;
	(void)flags;
	(void)out;
	return stub_nosys(err, len);
}

int
kernels_publish_submit(struct kernels_engine *e, struct kernels_region *const *regions,
    unsigned nregions, const struct kernels_page *pages, uint32_t n,
    const struct kernels_event *wait, unsigned flags, struct kernels_op **out, char *err,
    size_t len)
{
	return kernels_restore_submit(e, regions, nregions, pages, n, wait, flags, out, err, len);
}

int
kernels_op_poll(struct kernels_op *op)
{
	(void)op;
	return 1;
}

int
kernels_op_wait(struct kernels_op *op)
{
	(void)op;
	return -ENOSYS;
}

void
kernels_op_cancel(struct kernels_op *op)
{
	(void)op;
}

int
kernels_op_result(const struct kernels_op *op, struct kernels_result *r, uint8_t *page_status,
    uint64_t *checksums)
{
	(void)op;
	(void)page_status;
	(void)checksums;
	memset(r, 0, sizeof(*r));
	r->status = -ENOSYS;
	snprintf(r->err, sizeof(r->err), "%s", STUB_WHY);
	return -ENOSYS;
}

void
kernels_op_free(struct kernels_op *op)
{
	(void)op;
}

int
kernels_engine_tail(struct kernels_engine *e)
{
	(void)e;
	return 0;
}

int
kernels_op_times(const struct kernels_op *op, struct kernels_op_times *t)
{
	(void)op;
	memset(t, 0, sizeof(*t));
	return -ENOSYS;
}

int
kernels_checksum_device(const void *dptr, size_t len, uint64_t *out, char *err, size_t errlen)
{
	(void)dptr;
	(void)len;
	(void)out;
	return stub_nosys(err, errlen);
}

int
kernels_dev_alloc(size_t len, void **dptr, char *err, size_t errlen)
{
	(void)len;
	(void)dptr;
	return stub_nosys(err, errlen);
}

void
kernels_dev_free(void *dptr)
{
	(void)dptr;
}

int
kernels_copy(void *dst, const void *src, size_t len, char *err, size_t errlen)
{
	(void)dst;
	(void)src;
	(void)len;
	return stub_nosys(err, errlen);
}

int
kernels_memset(void *dptr, int c, size_t len, char *err, size_t errlen)
{
	(void)dptr;
	(void)c;
	(void)len;
	return stub_nosys(err, errlen);
}

int
kernels_ipc_export(void *dptr, void *handle, char *err, size_t len)
{
	(void)dptr;
	(void)handle;
	return stub_nosys(err, len);
}

int
kernels_event_new(int interprocess, struct kernels_event **out, char *err, size_t len)
{
	(void)interprocess;
	(void)out;
	return stub_nosys(err, len);
}

int
kernels_event_record(struct kernels_event *ev, char *err, size_t len)
{
	(void)ev;
	return stub_nosys(err, len);
}

int
kernels_event_export(struct kernels_event *ev, void *handle, char *err, size_t len)
{
	(void)ev;
	(void)handle;
	return stub_nosys(err, len);
}

int
kernels_cumem_alloc(size_t len, void **dptr, size_t *alloc_size, int *fd, char *err,
    size_t errlen)
{
	(void)len;
	(void)dptr;
	(void)alloc_size;
	(void)fd;
	return stub_nosys(err, errlen);
}

int
kernels_cumem_free(void *dptr, size_t alloc_size, char *err, size_t errlen)
{
	(void)dptr;
	(void)alloc_size;
	return stub_nosys(err, errlen);
}

int
kernels_bench_copy(int how, const struct kernels_geom *g, const struct kernels_page *pages,
    uint32_t n, char *err, size_t len)
{
	(void)how;
	(void)g;
	(void)pages;
	(void)n;
	return stub_nosys(err, len);
}

int
kernels_busy_start(char *err, size_t len)
{
	return stub_nosys(err, len);
}

int
kernels_busy_stop(char *err, size_t len)
{
	return stub_nosys(err, len);
}

int
kernels_late_fill(void *dptr, size_t pitch, size_t width, size_t height, int c, unsigned ms,
    char *err, size_t len)
{
	(void)dptr;
	(void)pitch;
	(void)width;
	(void)height;
	(void)c;
	(void)ms;
	return stub_nosys(err, len);
}

int
kernels_bench_chunked(void *dst, const void *src, size_t len, size_t chunk, unsigned streams,
    char *err, size_t errlen)
{
	(void)dst;
	(void)src;
	(void)len;
	(void)chunk;
	(void)streams;
	return stub_nosys(err, errlen);
}

int
kernels_mem_device(const void *dptr, int *device)
{
	(void)dptr;
	(void)device;
	return -ENOSYS;
}

int
kernels_current_device(void)
{
	return -1;
}

void
kernels_engine_staging(const struct kernels_engine *e, unsigned *slots, unsigned *busy)
{
	(void)e;
	*slots = 0;
	*busy = 0;
}

int
kernels_engine_device(const struct kernels_engine *e)
{
	(void)e;
	return -1;
}

void
kernels_engine_kill(struct kernels_engine *e, const char *why)
{
	(void)e;
	(void)why;
}
