/*
 * What the benchmarks share: the clock, reproducible random numbers, the
 * median of a run's figures. Header-only, so that each benchmark stays
 * one file and one Makefile rule.
 */
#ifndef L3KV_BENCH_H
#define L3KV_BENCH_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* CLOCK_MONOTONIC, in seconds. */
static inline double
bench_now(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The next number of the xorshift64* generator whose state is *s (never 0). */
static inline uint64_t
bench_xorshift(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dULL;
}

static int
bench_cmp(const void *a, const void *b)
{
	double	x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Sorts v and returns its median (of the two middle figures when n is even). */
static inline double
bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), bench_cmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif /* L3KV_BENCH_H */
