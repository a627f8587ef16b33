/* pool: fork-join thread pool with spin-then-sleep workers (see pool.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"

/* How long an idle worker spins before sleeping: long enough to bridge the gap between the
 * kernels of one forward (microseconds), short enough that a pipeline stage waiting for the next
 * step, or another process on the same machine (a local fleet), gets the cores back at once. */
#define POOL_SPIN_NS 100000ull

typedef struct pool_worker {
    csd_pool *pool;
    pthread_t thread;
    int ith;
} pool_worker;

struct csd_pool {
    int n_threads;
    pool_worker *workers; /* n_threads - 1 entries; the caller is thread 0 */
    csd_pool_fn fn;
    void *ctx;
    atomic_uint generation; /* bumped once per job */
    atomic_int pending;     /* workers still running the current job */
    atomic_bool stop;
    pthread_mutex_t mutex; /* only for sleeping workers */
    pthread_cond_t wake;
    atomic_int sleepers;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static unsigned wait_for_job(csd_pool *pool, unsigned seen) {
    uint64_t start = csd_now_ns();
    unsigned spins = 0;
    for (;;) {
        unsigned gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (gen != seen || atomic_load(&pool->stop)) return gen;
        cpu_relax();
        if (++spins % 1024 == 0) {
            if (csd_now_ns() - start > POOL_SPIN_NS) break;
            sched_yield(); /* let a preempted peer (busy machine) have this core */
        }
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->sleepers, 1);
    unsigned gen;
    while ((gen = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->wake, &pool->mutex);
    atomic_fetch_sub(&pool->sleepers, 1);
    pthread_mutex_unlock(&pool->mutex);
    return gen;
}

static void *worker_main(void *arg) {
    pool_worker *w = arg;
    csd_pool *pool = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) return NULL;
        pool->fn(pool->ctx, w->ith, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel);
    }
}

int csd_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int csd_pool_create(csd_pool **out, int n_threads, csd_err *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = csd_cpu_count();
    if (n_threads > 256) return csd_err_set(err, CSD_ERANGE, "threads=%d exceeds 256", n_threads);
    csd_pool *pool = csd_alloc(sizeof *pool);
    if (!pool) return csd_err_set(err, CSD_ENOMEM, "thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->workers = csd_alloc_array((size_t)n_threads, sizeof *pool->workers);
    if (!pool->workers) {
        csd_pool_destroy(pool);
        return csd_err_set(err, CSD_ENOMEM, "thread pool workers");
    }
    for (int i = 1; i < n_threads; i++) {
        pool_worker *w = &pool->workers[i - 1];
        w->pool = pool;
        w->ith = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            pool->n_threads = i; /* destroy joins only the started ones */
            csd_pool_destroy(pool);
            return csd_err_set(err, CSD_EIO, "cannot start thread %d", i);
        }
    }
    *out = pool;
    return 0;
}

void csd_pool_destroy(csd_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, true);
    pthread_mutex_lock(&pool->mutex);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    if (pool->workers)
        for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->workers[i - 1].thread, NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    csd_free(pool->workers);
    csd_free(pool);
}

void csd_pool_run(csd_pool *pool, csd_pool_fn fn, void *ctx) {
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&pool->generation, 1); /* seq_cst: ordered before the sleepers load */
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }
    fn(ctx, 0, pool->n_threads);
    /* Workers normally finish within microseconds; if one was preempted (more runnable threads
     * than cores), yielding gives it this core instead of spinning away the time slice. */
    for (unsigned spins = 1; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0;
         spins++) {
        cpu_relax();
        if (spins % 256 == 0) sched_yield();
    }
}

int csd_pool_size(const csd_pool *pool) { return pool ? pool->n_threads : 1; }
