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
 *
 * The definition is written here once, in two steps that checksum_obj
 * and copy.c's fused copy+hash loops share: checksum_chunk, the digest
 * of one chunk (copy.c may run the same XXH3-64 built for AVX2), and
 * checksum_combine, the final step over the digests. The chunk bounds
 * are checksum_chunks and checksum_chunk_len (daemon.h, inline).
 */
#define CHECKSUM_STACK		512	/* digests on the stack: objects to 32 MiB */

/* One chunk's digest; n is checksum_chunk_len's. */
uint64_t
checksum_chunk(const void *chunk, size_t n)
{
	return XXH3_64bits(chunk, n);
}

/*
 * The checksum from the digests of an object's nchunks chunks, in
 * dig[0 .. nchunks - 1]; dig has room for nchunks + 1 entries and is
 * rewritten in place: each word little-endian, then the length.
 */
uint64_t
checksum_combine(uint64_t *dig, size_t nchunks, uint64_t len)
{
	uint8_t		*b;
	uint64_t	 v;
	size_t		 i;
	int		 j;

	dig[nchunks] = len;
	for (i = 0; i <= nchunks; i++) {
		v = dig[i];
		b = (uint8_t *)&dig[i];
		for (j = 0; j < 8; j++)
			b[j] = (uint8_t)(v >> (8 * j));
	}
	return XXH3_64bits(dig, (nchunks + 1) * 8);
}

uint64_t
checksum_obj(const void *buf, size_t len)
{
	const uint8_t	*p = buf;
	uint64_t	 stackbuf[CHECKSUM_STACK + 1], *dig = stackbuf, h;
	size_t		 nchunks = checksum_chunks(len), i;

	/* Past 32 MiB the digest array is a heap copy; the value is the same. */
	if (nchunks > CHECKSUM_STACK && (dig = malloc((nchunks + 1) * 8)) == NULL)
		fatalx("checksum", "out of memory for %zu digests", nchunks);
	for (i = 0; i < nchunks; i++)
		dig[i] = checksum_chunk(p + i * CHECKSUM_CHUNK, checksum_chunk_len(len, i));
	h = checksum_combine(dig, nchunks, len);
	if (dig != stackbuf)
		free(dig);
	return h;
}
