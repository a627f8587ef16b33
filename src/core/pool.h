/* pool: a fixed set of worker threads that run one parallel job at a time (fork-join).
 * csd_pool_run calls fn(ctx, ith, nth) on every thread, the caller being ith 0, and returns when all
 * are done. Workers spin briefly between jobs (a decode step issues hundreds of small jobs, and a
 * futex wake costs more than the job), then sleep. No allocation per job. */
#ifndef CSD_POOL_H
#define CSD_POOL_H

#include <stdint.h>

#include "err.h"

typedef struct csd_pool csd_pool;
typedef void (*csd_pool_fn)(void *ctx, int ith, int nth);

/* n_threads counts the caller; 0 means one per online core. */
int csd_pool_create(csd_pool **out, int n_threads, csd_err *err);
void csd_pool_destroy(csd_pool *pool);
/* Runs fn on all threads and waits. Not reentrant: one caller thread at a time. pool may be NULL,
 * which runs fn(ctx, 0, 1) inline. */
void csd_pool_run(csd_pool *pool, csd_pool_fn fn, void *ctx);
int csd_pool_size(const csd_pool *pool);
/* Online cores of this machine (at least 1). */
int csd_cpu_count(void);

/* The slice [*begin, *end) of n items owned by thread ith of nth (contiguous, balanced). */
static inline void csd_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t base = n / nth, extra = n % nth;
    *begin = ith * base + (ith < extra ? ith : extra);
    *end = *begin + base + (ith < extra ? 1 : 0);
}

#endif
