/*
 * XXH3-64 (seed 0, the default secret) for both sides of the bus,
 * written from the xxHash specification because there is no xxhash for
 * the GPU. Every function is __host__ __device__ under nvcc and plain
 * static inline C under cc, so the host test (tests/check_gpu.c, suite
 * gpu_host, runs in CI without a GPU) checks the very code the kernels
 * run against libxxhash.
 *
 * Two forms of the long (> 240 bytes) hash:
 *  - xxh3g_64(): the scalar reference, used by one thread on the device
 *    for short inputs;
 *  - the warp form: a 1024-byte block (16 stripes of 64 bytes) is split
 *    over 32 threads, 32 bytes each (xxh3g_part); within a block the
 *    accumulation is a sum, so the partial sums of the 16 threads of the
 *    same parity add up to the block's (a warp reduction on the device,
 *    xxh3g_long_emul() on the host); the scramble between blocks and the
 *    tail are per lane. xxh3g_long_emul() is the host model of exactly
 *    that decomposition, tested bit-exact against libxxhash.
 *
 * The object checksum (checksum_obj, daemon/checksum.c) is XXH3-64 of
 * each 64 KiB chunk, then XXH3-64 over the chunk digests as little-endian
 * words followed by the total length, little-endian: xxh3g_checksum().
 */
#ifndef L3KV_XXH3_H
#define L3KV_XXH3_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __CUDACC__
#define XXH3G_FN	__host__ __device__ static inline
#else
#define XXH3G_FN	static inline
#endif

#define XXH3G_P32_1	0x9E3779B1U
#define XXH3G_P32_2	0x85EBCA77U
#define XXH3G_P32_3	0xC2B2AE3DU
#define XXH3G_P64_1	0x9E3779B185EBCA87ULL
#define XXH3G_P64_2	0xC2B2AE3D27D4EB4FULL
#define XXH3G_P64_3	0x165667B19E3779F9ULL
#define XXH3G_P64_4	0x85EBCA77C2B2AE63ULL
#define XXH3G_P64_5	0x27D4EB2F165667C5ULL

#define XXH3G_SECRET_LEN	192
#define XXH3G_STRIPE		64
#define XXH3G_BLOCK		1024	/* (192 - 64) / 8 = 16 stripes */
#define XXH3G_MIDSIZE_MAX	240
#define XXH3G_CHUNK		(64U << 10)	/* CHECKSUM_CHUNK */

/* The default secret (FARSH's), from the xxHash specification. */
#define XXH3G_SECRET_INIT {						\
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c,	\
	0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb,	\
	0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,	\
	0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,	\
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,	\
	0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,	\
	0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97,	\
	0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,	\
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,	\
	0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,	\
	0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,	\
	0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,	\
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26,	\
	0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc,	\
	0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,	\
	0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,	\
}

#ifdef __CUDACC__
static __constant__ uint8_t xxh3g_secret_dev[XXH3G_SECRET_LEN] = XXH3G_SECRET_INIT;
#endif
static const uint8_t xxh3g_secret_host[XXH3G_SECRET_LEN] = XXH3G_SECRET_INIT;

XXH3G_FN const uint8_t *
xxh3g_secret(void)
{
#ifdef __CUDA_ARCH__
	return xxh3g_secret_dev;
#else
	return xxh3g_secret_host;
#endif
}

/* Little-endian reads at any alignment (one load where it is aligned). */
XXH3G_FN uint64_t
xxh3g_read64(const uint8_t *p)
{
	uint64_t	v = 0;
	int		i;

#ifdef __CUDA_ARCH__
	if (((uintptr_t)p & 7) == 0)
		return *(const uint64_t *)(const void *)p;
#endif
	for (i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

XXH3G_FN uint32_t
xxh3g_read32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	    (uint32_t)p[3] << 24;
}

XXH3G_FN uint64_t
xxh3g_swap64(uint64_t x)
{
	uint64_t	r = 0;
	int		i;

	for (i = 0; i < 8; i++)
		r = r << 8 | ((x >> (8 * i)) & 0xff);
	return r;
}

XXH3G_FN uint64_t
xxh3g_rotl64(uint64_t x, unsigned r)
{
	return x << r | x >> (64 - r);
}

/* The 128-bit product of a and b, its halves xor'ed. */
XXH3G_FN uint64_t
xxh3g_mul128_fold64(uint64_t a, uint64_t b)
{
#ifdef __CUDA_ARCH__
	return (a * b) ^ __umul64hi(a, b);
#else
	__extension__ unsigned __int128 p = (unsigned __int128)a * b;

	return (uint64_t)p ^ (uint64_t)(p >> 64);
#endif
}

XXH3G_FN uint64_t
xxh3g_xxh64_avalanche(uint64_t h)
{
	h ^= h >> 33;
	h *= XXH3G_P64_2;
	h ^= h >> 29;
	h *= XXH3G_P64_3;
	h ^= h >> 32;
	return h;
}

XXH3G_FN uint64_t
xxh3g_avalanche(uint64_t h)
{
	h ^= h >> 37;
	h *= 0x165667919E3779F9ULL;
	h ^= h >> 32;
	return h;
}

XXH3G_FN uint64_t
xxh3g_rrmxmx(uint64_t h, uint64_t len)
{
	h ^= xxh3g_rotl64(h, 49) ^ xxh3g_rotl64(h, 24);
	h *= 0x9FB21C651E98DF25ULL;
	h ^= (h >> 35) + len;
	h *= 0x9FB21C651E98DF25ULL;
	return h ^ (h >> 28);
}

XXH3G_FN uint64_t
xxh3g_len_0to16(const uint8_t *in, size_t len)
{
	const uint8_t	*s = xxh3g_secret();

	if (len > 8) {
		uint64_t lo = xxh3g_read64(in) ^ (xxh3g_read64(s + 24) ^ xxh3g_read64(s + 32));
		uint64_t hi = xxh3g_read64(in + len - 8) ^
		    (xxh3g_read64(s + 40) ^ xxh3g_read64(s + 48));
		uint64_t acc = len + xxh3g_swap64(lo) + hi + xxh3g_mul128_fold64(lo, hi);

		return xxh3g_avalanche(acc);
	}
	if (len >= 4) {
		uint32_t in1 = xxh3g_read32(in), in2 = xxh3g_read32(in + len - 4);
		uint64_t bitflip = xxh3g_read64(s + 8) ^ xxh3g_read64(s + 16);
		uint64_t in64 = in2 + ((uint64_t)in1 << 32);

		return xxh3g_rrmxmx(in64 ^ bitflip, len);
	}
	if (len > 0) {
		uint32_t c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
		uint32_t combined = c1 << 16 | c2 << 24 | c3 | (uint32_t)len << 8;
		uint64_t bitflip = xxh3g_read32(s) ^ xxh3g_read32(s + 4);

		return xxh3g_xxh64_avalanche((uint64_t)combined ^ bitflip);
	}
	return xxh3g_xxh64_avalanche(xxh3g_read64(s + 56) ^ xxh3g_read64(s + 64));
}

XXH3G_FN uint64_t
xxh3g_mix16(const uint8_t *in, const uint8_t *s)
{
	return xxh3g_mul128_fold64(xxh3g_read64(in) ^ xxh3g_read64(s),
	    xxh3g_read64(in + 8) ^ xxh3g_read64(s + 8));
}

XXH3G_FN uint64_t
xxh3g_len_17to128(const uint8_t *in, size_t len)
{
	const uint8_t	*s = xxh3g_secret();
	uint64_t	 acc = len * XXH3G_P64_1;

	if (len > 32) {
		if (len > 64) {
			if (len > 96) {
				acc += xxh3g_mix16(in + 48, s + 96);
				acc += xxh3g_mix16(in + len - 64, s + 112);
			}
			acc += xxh3g_mix16(in + 32, s + 64);
			acc += xxh3g_mix16(in + len - 48, s + 80);
		}
		acc += xxh3g_mix16(in + 16, s + 32);
		acc += xxh3g_mix16(in + len - 32, s + 48);
	}
	acc += xxh3g_mix16(in, s);
	acc += xxh3g_mix16(in + len - 16, s + 16);
	return xxh3g_avalanche(acc);
}

XXH3G_FN uint64_t
xxh3g_len_129to240(const uint8_t *in, size_t len)
{
	const uint8_t	*s = xxh3g_secret();
	uint64_t	 acc = len * XXH3G_P64_1;
	unsigned	 i, rounds = (unsigned)len / 16;

	for (i = 0; i < 8; i++)
		acc += xxh3g_mix16(in + 16 * i, s + 16 * i);
	acc = xxh3g_avalanche(acc);
	for (i = 8; i < rounds; i++)
		acc += xxh3g_mix16(in + 16 * i, s + 16 * (i - 8) + 3);
	/* 136 is the minimum secret size, 17 the "last offset" */
	acc += xxh3g_mix16(in + len - 16, s + 136 - 17);
	return xxh3g_avalanche(acc);
}

XXH3G_FN uint64_t
xxh3g_init_acc(unsigned lane)
{
	switch (lane) {
	case 0:	return XXH3G_P32_3;
	case 1:	return XXH3G_P64_1;
	case 2:	return XXH3G_P64_2;
	case 3:	return XXH3G_P64_3;
	case 4:	return XXH3G_P64_4;
	case 5:	return XXH3G_P32_2;
	case 6:	return XXH3G_P64_5;
	default: return XXH3G_P32_1;
	}
}

/* One stripe into all 8 lanes, the secret at sec (any alignment). */
XXH3G_FN void
xxh3g_accumulate_512(uint64_t acc[8], const uint8_t *in, const uint8_t *sec)
{
	unsigned	i;

	for (i = 0; i < 8; i++) {
		uint64_t dv = xxh3g_read64(in + 8 * i);
		uint64_t dk = dv ^ xxh3g_read64(sec + 8 * i);

		acc[i ^ 1] += dv;
		acc[i] += (dk & 0xffffffffULL) * (dk >> 32);
	}
}

/* The scramble of one lane between blocks; key is secret word 16 + lane. */
XXH3G_FN uint64_t
xxh3g_scramble(uint64_t acc, uint64_t key)
{
	acc ^= acc >> 47;
	acc ^= key;
	return acc * XXH3G_P32_1;
}

XXH3G_FN uint64_t
xxh3g_scramble_key(unsigned lane)
{
	return xxh3g_read64(xxh3g_secret() + XXH3G_SECRET_LEN - XXH3G_STRIPE + 8 * lane);
}

/*
 * The end of the long hash, once the full blocks and the last partial
 * block are in acc: the last stripe (the secret at 192 - 64 - 7), then
 * the merge of the lanes (the secret at 11) and the avalanche.
 */
XXH3G_FN uint64_t
xxh3g_long_tail(uint64_t acc[8], const uint8_t *in, size_t len)
{
	const uint8_t	*s = xxh3g_secret();
	uint64_t	 r = (uint64_t)len * XXH3G_P64_1;
	unsigned	 i;

	xxh3g_accumulate_512(acc, in + len - XXH3G_STRIPE,
	    s + XXH3G_SECRET_LEN - XXH3G_STRIPE - 7);
	for (i = 0; i < 4; i++)
		r += xxh3g_mul128_fold64(acc[2 * i] ^ xxh3g_read64(s + 11 + 16 * i),
		    acc[2 * i + 1] ^ xxh3g_read64(s + 11 + 16 * i + 8));
	return xxh3g_avalanche(r);
}

/* The scalar long hash (len > 240). */
XXH3G_FN uint64_t
xxh3g_long(const uint8_t *in, size_t len)
{
	const uint8_t	*s = xxh3g_secret();
	uint64_t	 acc[8];
	size_t		 nb = (len - 1) / XXH3G_BLOCK, n, st, ns;
	unsigned	 i;

	for (i = 0; i < 8; i++)
		acc[i] = xxh3g_init_acc(i);
	for (n = 0; n < nb; n++) {
		for (st = 0; st < XXH3G_BLOCK / XXH3G_STRIPE; st++)
			xxh3g_accumulate_512(acc, in + n * XXH3G_BLOCK + st * XXH3G_STRIPE,
			    s + st * 8);
		for (i = 0; i < 8; i++)
			acc[i] = xxh3g_scramble(acc[i], xxh3g_scramble_key(i));
	}
	ns = ((len - 1) - XXH3G_BLOCK * nb) / XXH3G_STRIPE;
	for (st = 0; st < ns; st++)
		xxh3g_accumulate_512(acc, in + nb * XXH3G_BLOCK + st * XXH3G_STRIPE, s + st * 8);
	return xxh3g_long_tail(acc, in, len);
}

/* XXH3_64bits(in, len), the scalar reference. */
XXH3G_FN uint64_t
xxh3g_64(const void *input, size_t len)
{
	const uint8_t	*in = (const uint8_t *)input;

	if (len <= 16)
		return xxh3g_len_0to16(in, len);
	if (len <= 128)
		return xxh3g_len_17to128(in, len);
	if (len <= XXH3G_MIDSIZE_MAX)
		return xxh3g_len_129to240(in, len);
	return xxh3g_long(in, len);
}

/*
 * The warp form. Thread t (0..31) of a block takes bytes 32t..32t+31:
 * stripe t/2, lanes g..g+3 with g = 4 (t & 1). Its secret words are the
 * same for every block, so they are read once (xxh3g_part_keys).
 */
XXH3G_FN void
xxh3g_part_keys(unsigned t, uint64_t k[4])
{
	unsigned	st = t >> 1, g = (t & 1) * 4, j;

	for (j = 0; j < 4; j++)
		k[j] = xxh3g_read64(xxh3g_secret() + 8 * (st + g + j));
}

/* Adds thread t's share of one block (its 4 data words d) into a[4]. */
XXH3G_FN void
xxh3g_part(uint64_t a[4], const uint64_t d[4], const uint64_t k[4])
{
	unsigned	j;

	for (j = 0; j < 4; j++) {
		uint64_t dk = d[j] ^ k[j];

		a[j ^ 1] += d[j];
		a[j] += (dk & 0xffffffffULL) * (dk >> 32);
	}
}

/*
 * The host model of the warp form: the same per-thread shares, summed
 * over the 16 threads of each parity as the warp reduction does, then the
 * same per-lane scramble and tail. Only the host test uses it.
 */
XXH3G_FN uint64_t
xxh3g_long_emul(const uint8_t *in, size_t len)
{
	uint64_t	acc[8], sum[8], k[4], d[4], a[4];
	size_t		nb = (len - 1) / XXH3G_BLOCK, n, ns;
	unsigned	i, t, j;

	for (i = 0; i < 8; i++)
		acc[i] = xxh3g_init_acc(i);
	for (n = 0; n <= nb; n++) {
		/* block nb is the partial one: only its first ns stripes */
		ns = n < nb ? XXH3G_BLOCK / XXH3G_STRIPE :
		    ((len - 1) - XXH3G_BLOCK * nb) / XXH3G_STRIPE;
		for (i = 0; i < 8; i++)
			sum[i] = 0;
		for (t = 0; t < 32; t++) {
			if ((t >> 1) >= ns)
				continue;
			for (j = 0; j < 4; j++) {
				d[j] = xxh3g_read64(in + n * XXH3G_BLOCK + 32 * t + 8 * j);
				a[j] = 0;
			}
			xxh3g_part_keys(t, k);
			xxh3g_part(a, d, k);
			for (j = 0; j < 4; j++)
				sum[(t & 1) * 4 + j] += a[j];
		}
		for (i = 0; i < 8; i++) {
			acc[i] += sum[i];
			if (n < nb)
				acc[i] = xxh3g_scramble(acc[i], xxh3g_scramble_key(i));
		}
	}
	return xxh3g_long_tail(acc, in, len);
}

/* checksum_obj(), on the host, with the scalar hash; NULL-safe for len 0. */
static inline uint64_t
xxh3g_checksum(const void *buf, size_t len)
{
	const uint8_t	*p = (const uint8_t *)buf;
	size_t		 nchunks = (len + XXH3G_CHUNK - 1) / XXH3G_CHUNK, i, n;
	uint8_t		*dig;
	uint64_t	 h, v;
	int		 b;

	dig = (uint8_t *)malloc((nchunks + 1) * 8);
	if (dig == NULL)
		abort();
	for (i = 0; i <= nchunks; i++) {
		n = len - i * XXH3G_CHUNK;
		v = i == nchunks ? (uint64_t)len :
		    xxh3g_64(p + i * XXH3G_CHUNK, n > XXH3G_CHUNK ? XXH3G_CHUNK : n);
		for (b = 0; b < 8; b++)
			dig[i * 8 + b] = (uint8_t)(v >> (8 * b));
	}
	h = xxh3g_64(dig, (nchunks + 1) * 8);
	free(dig);
	return h;
}

#endif /* L3KV_XXH3_H */
