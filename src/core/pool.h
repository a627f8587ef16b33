/* pool: a fixed set of worker threads that run one parallel job at a time (fork-join).
 * A job is a number of chunks, each run exactly once by whichever thread claims it (the caller
 * works too); the call returns when all chunks are done, so a descheduled worker never stalls it.
 * Workers spin briefly between jobs (a decode step issues hundreds of small jobs, and a futex wake
 * costs more than the job), then sleep. No allocation per job. */
#ifndef CSD_POOL_H
#define CSD_POOL_H

#include <stdint.h>

#include "err.h"

typedef struct csd_pool csd_pool;
typedef void (*csd_pool_fn)(void *ctx, int ith, int nth);

/* n_threads counts the caller; 0 means one per online core. */
int csd_pool_create(csd_pool **out, int n_threads, csd_err *err);
void csd_pool_destroy(csd_pool *pool);
/* Calls fn(ctx, i, n_chunks) once for every chunk i in [0, n_chunks) and waits. Two chunks may run
 * at the same time on different threads, never the same chunk twice. Not reentrant: one caller
 * thread at a time. pool may be NULL, which runs every chunk inline. */
void csd_pool_run_chunks(csd_pool *pool, csd_pool_fn fn, void *ctx, int n_chunks);
/* csd_pool_run_chunks with one chunk per thread: fn(ctx, ith, nth) with nth = csd_pool_size, for
 * jobs that keep per-ith scratch (each ith runs once, so its scratch is never shared). */
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
