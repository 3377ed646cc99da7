/*
 * The copy engine's default configuration, in one place for both builds:
 * compiled by the C compiler whether the kernels come from nvcc
 * (engine.cu) or from the stub, so the defaults the daemon starts with
 * and those the GPU tests and benchmarks assume cannot drift apart.
 */
#include <string.h>

#include "kernels.h"

void
kernels_conf_default(struct kernels_conf *c)
{
	memset(c, 0, sizeof(*c));
	c->slot_bytes = 32U << 20;	/* one staging slot: objects to 32 MiB */
	c->slots = 4;
	c->streams = 2;
	c->max_items = 1024;
	c->dma_min_bytes = 1U << 20;	/* without batch_dma: shorter runs by the gather kernel */
	c->batch_dma = 1;		/* runs >= batch_min_bytes: one cudaMemcpyBatchAsync */
	c->batch_min_bytes = 128U << 10;
	c->copy_streams = 1;
	c->high_priority = 1;
	c->notify_fd = -1;
	c->notify = KERNELS_NOTIFY_THREAD;	/* bench_e2e: 30-40 us less a RESTORE than callbacks */
	c->csum = KERNELS_CSUM_CTA;	/* the last chunk's checksum kernel: 13 us, not 38 (H200) */
}
