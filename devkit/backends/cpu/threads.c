/*
 * threads.c -- the cpu plugin's thread pool behind cpu_parallel_for.
 *
 * This first version runs every range on the calling thread; see kernel.h
 * for the contract the pooled version keeps.
 */
#include "kernel.h"

void cpu_parallel_for(int64_t n, int64_t grain, cpu_range_fn fn, void *ctx) {
  (void)grain;
  if (n > 0) fn(ctx, 0, n);
}
