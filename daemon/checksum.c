/*
 * The object checksum, one function for every tier and copy engine: DRAM
 * objects carry it, file objects keep it in their header (so its value
 * must never change: stored files are checked against it), publishes
 * compute it and restores verify it, on the host here and on the GPU in
 * kernels/ (xxh3.h, engine.cu), which compute the same value.
 *
 * It is chunked (XXH3-64 of 64 KiB chunks, then of their digests) so
 * that the GPU path can verify staged bytes in HBM with the same function
 * instead of spending CPU cores on it.
 */
#include <stdint.h>
#include <stdlib.h>

/* Inlined, as it was in dram.c: every publish and restore checksums its bytes. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon.h"

/*
 * The chunked checksum: XXH3-64 of each CHECKSUM_CHUNK bytes (the last
 * chunk may be short), then XXH3-64 of those digests as little-endian
 * 64-bit words followed by the total length, also little-endian. The
 * chunks are independent, so a GPU kernel computes the same value over
 * staged bytes with one thread block per chunk. Thread-safe: workers
 * call it.
 */
#define CHECKSUM_STACK		512	/* digests on the stack: objects to 32 MiB */

static void
checksum_le64(uint8_t *p, uint64_t v)
{
	int	i;

	for (i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t
checksum_obj(const void *buf, size_t len)
{
	const uint8_t	*p = buf;
	uint8_t		 stackbuf[(CHECKSUM_STACK + 1) * 8], *dig = stackbuf;
	size_t		 nchunks = (len + CHECKSUM_CHUNK - 1) / CHECKSUM_CHUNK, i, n;
	uint64_t	 h;

	/* Past 32 MiB the digest array is a heap copy; the value is the same. */
	if (nchunks > CHECKSUM_STACK && (dig = malloc((nchunks + 1) * 8)) == NULL)
		fatalx("checksum", "out of memory for %zu digests", nchunks);
	for (i = 0; i < nchunks; i++) {
		n = len - i * CHECKSUM_CHUNK;
		if (n > CHECKSUM_CHUNK)
			n = CHECKSUM_CHUNK;
		checksum_le64(dig + i * 8, XXH3_64bits(p + i * CHECKSUM_CHUNK, n));
	}
	checksum_le64(dig + nchunks * 8, (uint64_t)len);
	h = XXH3_64bits(dig, (nchunks + 1) * 8);
	if (dig != stackbuf)
		free(dig);
	return h;
}
