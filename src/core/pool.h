/* pool: a fixed set of worker threads that run one parallel job at a time (fork-join).
 * A job is a number of chunks, each run exactly once by whichever thread claims it (the caller
 * works too); the call returns when all chunks are done, so a descheduled worker never stalls it.
 * Workers spin briefly between jobs (a decode step issues hundreds of small jobs, and a futex wake
 * costs more than the job), then sleep. No allocation per job. */
#ifndef CSD_POOL_H
#define CSD_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"

typedef struct csd_pool csd_pool;
typedef void (*csd_pool_fn)(void *ctx, int ith, int nth);

/* Most threads a pool may have. */
#define CSD_POOL_MAX_THREADS 256

/* n_threads counts the caller; 0 means one per online core (at most CSD_POOL_MAX_THREADS). */
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
/* No job is coming soon (a pipeline stage between steps): idle workers stop spinning and sleep
 * until the next job, leaving the cores to whoever shares the machine (the other stages of a local
 * fleet). The next csd_pool_run_chunks wakes them. */
void csd_pool_rest(csd_pool *pool);
/* A barrier inside one csd_pool_run job whose chunks all meet at every barrier (a decode step's
 * layers as one job, src/model/decode_step.c). Such a job's chunks each get a thread of their
 * own: a chunk cannot finish before the others reach its barriers, so no thread claims two.
 * Unlike claimed chunks, a preempted thread holds the others up at the next barrier, so waits
 * longer than a few microseconds yield the core to it. Zero-initialise before the job. */
typedef struct csd_pool_barrier {
    _Alignas(64) _Atomic int64_t arrived;
} csd_pool_barrier;
/* Returns once all nth chunks have called it as many times as this one has; *passed counts this
 * chunk's calls (start it at 0). Acquire/release: writes before it are seen after it. */
void csd_pool_barrier_wait(csd_pool_barrier *b, int64_t *passed, int nth);
/* The same, calling idle(ctx) instead of pausing while it waits, until idle returns false (work
 * that fills the wait: a decode step reads the next matmul's first weights ahead). */
void csd_pool_barrier_wait_idle(csd_pool_barrier *b, int64_t *passed, int nth,
                                bool (*idle)(void *), void *ctx);
/* Cores this process may run on (its CPU affinity on Linux, else the online cores; at least 1). */
int csd_cpu_count(void);

/* The slice [*begin, *end) of n items owned by thread ith of nth (contiguous, balanced). */
static inline void csd_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t base = n / nth, extra = n % nth;
    *begin = ith * base + (ith < extra ? ith : extra);
    *end = *begin + base + (ith < extra ? 1 : 0);
}

/* Guided chunking for csd_pool_run_chunks: the slice of chunk ith of nth = rounds * threads.
 * Round r covers half of what the rounds before it left (the last round: all the rest), split
 * evenly among the threads: big chunks first, small ones last, so threads that run at different
 * speeds (a busy core, memory contention) finish a job within one small chunk of each other,
 * while most of the work still goes in long runs. The chunks tile [0, n) in order. nth not a
 * multiple of threads (or threads < 1): csd_split_range. */
static inline void csd_split_guided(int64_t n, int ith, int nth, int threads, int64_t *begin,
                                    int64_t *end) {
    if (threads < 1 || nth % threads) {
        csd_split_range(n, ith, nth, begin, end);
        return;
    }
    int rounds = nth / threads, r = ith / threads;
    int64_t rb = n - (n >> r), re = r == rounds - 1 ? n : n - (n >> (r + 1));
    int64_t b, e;
    csd_split_range(re - rb, ith % threads, threads, &b, &e);
    *begin = rb + b;
    *end = rb + e;
}

#endif
