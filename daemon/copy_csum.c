/*
 * The host copy engine's chunk digest, checksum.c's checksum_chunk
 * compiled for AVX2 (the Makefile builds this one file with -mavx2):
 * XXH3 picks its vector code when it is compiled, and the daemon's other
 * files are built for the baseline x86-64, where XXH3 runs SSE2 at half
 * the speed. copy.c calls it only where the CPU has AVX2 (checked once at
 * start); the value is the same XXH3-64 whatever the vector code.
 *
 * copy_csum_avx2_write() is the restore's pipeline step: the digest of
 * one chunk (read from DRAM) computed in COPY_CSUM_STEP slices with
 * XXH3's streaming state, and between the slices, slices of an earlier,
 * already hashed range (in cache) written to engine memory with streaming
 * stores, fenced before it returns. The digest is the one-shot XXH3-64's
 * (the streaming API's contract); the bytes written were hashed before,
 * never the chunk being hashed. On the 16-core host the streaming stores
 * took a 1-4 thread restore from 0.64-0.83x a memmove to 0.88-1.54x; the
 * slices alone (COPY_CSUM_NT=0) did not move it, and the stores without
 * the slices (COPY_CSUM_STEP past a chunk) measured about the same as both
 * (tests/bench/RESULTS.md).
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string.h>

#include "daemon.h"

/* Slice of the digest between writes: 4 KiB of loads, then about as much of stores. */
#ifndef COPY_CSUM_STEP
#define COPY_CSUM_STEP	4096
#endif

/* Streaming (non-temporal) stores for the restore's writes; 0 for memcpy. */
#ifndef COPY_CSUM_NT
#define COPY_CSUM_NT	1
#endif

#if COPY_CSUM_NT && defined(__AVX2__)
#include <immintrin.h>

/* Streaming stores: the engine's memory is not read again by this core. */
static void
copy_csum_store(uint8_t *dst, const uint8_t *src, size_t n)
{
	size_t	h = (size_t)(-(uintptr_t)dst & 31);

	if (h > n)
		h = n;
	memcpy(dst, src, h);
	dst += h;
	src += h;
	n -= h;
	for (; n >= 128; n -= 128, dst += 128, src += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)src);
		__m256i b = _mm256_loadu_si256((const __m256i *)(src + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(src + 64));
		__m256i d = _mm256_loadu_si256((const __m256i *)(src + 96));

		_mm256_stream_si256((__m256i *)dst, a);
		_mm256_stream_si256((__m256i *)(dst + 32), b);
		_mm256_stream_si256((__m256i *)(dst + 64), c);
		_mm256_stream_si256((__m256i *)(dst + 96), d);
	}
	memcpy(dst, src, n);
}
#define COPY_STORE(d, s, n)	copy_csum_store(d, s, n)
#define COPY_FENCE()		_mm_sfence()
#else
#define COPY_STORE(d, s, n)	memcpy(d, s, n)
#define COPY_FENCE()		do { } while (0)
#endif

uint64_t
copy_csum_avx2(const void *p, size_t len)
{
	return XXH3_64bits(p, len);
}

/* The pipeline's last write (a run's pending range), with the same stores. */
void
copy_csum_avx2_store(uint8_t *dst, const uint8_t *src, size_t n)
{
	if (n == 0)
		return;
	COPY_STORE(dst, src, n);
	COPY_FENCE();
}

uint64_t
copy_csum_avx2_write(const void *p, size_t n, const uint8_t *wsrc, uint8_t *wdst, size_t wlen)
{
	XXH3_state_t	 st;
	const uint8_t	*c = p;
	size_t		 off, k, w, wstep;

	if (wlen == 0 || n < 2 * COPY_CSUM_STEP) {
		copy_csum_avx2_store(wdst, wsrc, wlen);
		return XXH3_64bits(p, n);
	}
	/* The write spread evenly over the slices, in whole cache lines. */
	wstep = ((wlen / ((n + COPY_CSUM_STEP - 1) / COPY_CSUM_STEP)) + 63) & ~(size_t)63;
	XXH3_64bits_reset(&st);
	for (off = 0, w = 0; off < n; off += k) {
		k = n - off < COPY_CSUM_STEP ? n - off : COPY_CSUM_STEP;
		XXH3_64bits_update(&st, c + off, k);
		if (w < wlen) {
			size_t	m = wlen - w < wstep ? wlen - w : wstep;

			COPY_STORE(wdst + w, wsrc + w, m);
			w += m;
		}
	}
	if (w < wlen)
		COPY_STORE(wdst + w, wsrc + w, wlen - w);
	COPY_FENCE();
	return XXH3_64bits_digest(&st);
}
