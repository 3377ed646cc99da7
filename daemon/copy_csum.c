/*
 * The host copy engine's chunk digest, checksum.c's checksum_chunk
 * compiled for AVX2 (the Makefile builds this one file with -mavx2):
 * XXH3 picks its vector code when it is compiled, and the daemon's other
 * files are built for the baseline x86-64, where XXH3 runs SSE2 at half
 * the speed. copy.c calls it only where the CPU has AVX2 (checked once at
 * start); the value is the same XXH3-64 whatever the vector code.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon.h"

uint64_t
copy_csum_avx2(const void *p, size_t len)
{
	return XXH3_64bits(p, len);
}
