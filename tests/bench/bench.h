/*
 * What the benchmarks share: the median of a run's figures. Header-only,
 * so that each benchmark stays one file and one Makefile rule.
 */
#ifndef L3KV_BENCH_H
#define L3KV_BENCH_H

#include <stdlib.h>

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
