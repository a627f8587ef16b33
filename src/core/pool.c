/* pool: fork-join thread pool with dynamically claimed chunks (see pool.h).
 *
 * A job is n chunks. Every thread, the caller included, claims chunks one at a time from one
 * atomic ticket until none is left; the caller returns when all chunks are done. So a worker the
 * OS has descheduled (a busy 2-core machine, or another process of a local fleet) never holds
 * the job up: its chunks are taken by whoever is running. The ticket packs the job's generation,
 * its chunk count and the next chunk, so a late worker can never claim a chunk of a job it did not
 * see start; fn and ctx are read only after a successful claim, while the caller cannot have moved
 * on (the claimed chunk is not done yet). */
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
/* Spinning longer than this yields the core now and then, for a preempted peer on a busy
 * machine; shorter waits (almost all, at the joins of a decode step) make no system call,
 * which under a hypervisor costs microseconds (perf: ~1% of a decode token went there). */
#define POOL_YIELD_AFTER_NS 20000ull

/* ticket = gen (24 bits) | n_chunks (20 bits) | next (20 bits) */
#define TICKET_BITS 20
#define TICKET_MASK ((1ull << TICKET_BITS) - 1)
#define POOL_MAX_CHUNKS ((int)TICKET_MASK)

typedef struct pool_worker {
    csd_pool *pool;
    pthread_t thread;
} pool_worker;

struct csd_pool {
    int n_threads;
    pool_worker *workers;     /* n_threads - 1 entries; the caller is the other thread */
    csd_pool_fn fn;           /* the current job: stable while any of its chunks is running */
    void *ctx;
    uint64_t gen;             /* caller-side generation counter (24 bits used) */
    _Atomic uint64_t ticket;
    atomic_int done;          /* chunks of the current job finished */
    atomic_bool stop;
    atomic_bool rest;         /* csd_pool_rest: idle workers sleep now instead of spinning */
    pthread_mutex_t mutex;    /* only for sleeping workers */
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

/* Waiting for other threads to finish their part, one pause at a time: no system calls for the
 * first POOL_YIELD_AFTER_NS, then a yield now and then, since a thread being waited for may have
 * been preempted and need this core. */
typedef struct spin_wait {
    unsigned spins;
    uint64_t start; /* first clock reading, 0 before it */
} spin_wait;

static inline void spin_wait_step(spin_wait *w) {
    cpu_relax();
    if (++w->spins % 256 == 0) {
        uint64_t now = csd_now_ns();
        if (!w->start) w->start = now;
        else if (now - w->start > POOL_YIELD_AFTER_NS) sched_yield();
    }
}

static inline uint64_t ticket_gen(uint64_t t) { return t >> (2 * TICKET_BITS); }

/* Claims and runs chunks of job `gen` until there are none left (or the job is another one). */
static void work_on(csd_pool *pool, uint64_t gen) {
    for (;;) {
        uint64_t t = atomic_load_explicit(&pool->ticket, memory_order_acquire);
        if (ticket_gen(t) != gen) return;
        int n = (int)((t >> TICKET_BITS) & TICKET_MASK), idx = (int)(t & TICKET_MASK);
        if (idx >= n) return;
        if (!atomic_compare_exchange_weak_explicit(&pool->ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        pool->fn(pool->ctx, idx, n);
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
    }
}

static uint64_t wait_for_job(csd_pool *pool, uint64_t seen) {
    uint64_t start = csd_now_ns();
    unsigned spins = 0;
    for (;;) {
        uint64_t gen = ticket_gen(atomic_load_explicit(&pool->ticket, memory_order_acquire));
        if (gen != seen || atomic_load(&pool->stop)) return gen;
        if (atomic_load_explicit(&pool->rest, memory_order_relaxed)) break;
        cpu_relax();
        if (++spins % 1024 == 0) {
            uint64_t spun = csd_now_ns() - start;
            if (spun > POOL_SPIN_NS) break;
            if (spun > POOL_YIELD_AFTER_NS) sched_yield(); /* a preempted peer may want this core */
        }
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->sleepers, 1);
    uint64_t gen;
    while ((gen = ticket_gen(atomic_load(&pool->ticket))) == seen && !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->wake, &pool->mutex);
    atomic_fetch_sub(&pool->sleepers, 1);
    pthread_mutex_unlock(&pool->mutex);
    return gen;
}

static void *worker_main(void *arg) {
    pool_worker *w = arg;
    csd_pool *pool = w->pool;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) return NULL;
        work_on(pool, seen);
    }
}

int csd_cpu_count(void) {
#ifdef __linux__
    cpu_set_t set; /* a container or taskset may give this process fewer than the machine has */
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int csd_pool_create(csd_pool **out, int n_threads, csd_err *err) {
    *out = NULL;
    if (n_threads <= 0) {
        int cores = csd_cpu_count();
        n_threads = cores < CSD_POOL_MAX_THREADS ? cores : CSD_POOL_MAX_THREADS;
    }
    if (n_threads > CSD_POOL_MAX_THREADS)
        return csd_err_set(err, CSD_ERANGE, "threads=%d exceeds %d", n_threads,
                           CSD_POOL_MAX_THREADS);
    csd_pool *pool = csd_alloc(sizeof *pool);
    if (!pool) return csd_err_set(err, CSD_ENOMEM, "thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->workers = csd_alloc_array((size_t)n_threads, sizeof *pool->workers);
    if (!pool->workers) {
        pool->n_threads = 1;
        csd_pool_destroy(pool);
        return csd_err_set(err, CSD_ENOMEM, "thread pool workers");
    }
    for (int i = 1; i < n_threads; i++) {
        pool_worker *w = &pool->workers[i - 1];
        w->pool = pool;
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

void csd_pool_run_chunks(csd_pool *pool, csd_pool_fn fn, void *ctx, int n_chunks) {
    if (n_chunks <= 0) return;
    if (n_chunks > POOL_MAX_CHUNKS) n_chunks = POOL_MAX_CHUNKS;
    if (!pool || pool->n_threads == 1 || n_chunks == 1) {
        for (int i = 0; i < n_chunks; i++) fn(ctx, i, n_chunks);
        return;
    }
    atomic_store_explicit(&pool->rest, false, memory_order_relaxed);
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    pool->gen = (pool->gen + 1) & ((1ull << (64 - 2 * TICKET_BITS)) - 1);
    if (pool->gen == 0) pool->gen = 1; /* 0 is what idle workers start from */
    /* seq_cst: the publication is ordered before the sleepers load below */
    atomic_store(&pool->ticket,
                 (pool->gen << (2 * TICKET_BITS)) | ((uint64_t)n_chunks << TICKET_BITS));
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }
    work_on(pool, pool->gen);
    spin_wait w = {0, 0}; /* a claimed chunk's thread may have been preempted */
    while (atomic_load_explicit(&pool->done, memory_order_acquire) < n_chunks) spin_wait_step(&w);
}

void csd_pool_barrier_wait_idle(csd_pool_barrier *b, int64_t *passed, int nth,
                                bool (*idle)(void *), void *ctx) {
    int64_t target = ++*passed * nth;
    atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel);
    spin_wait w = {0, 0}; /* a peer may have been preempted */
    while (atomic_load_explicit(&b->arrived, memory_order_acquire) < target) {
        if (idle && idle(ctx)) continue;
        idle = NULL;
        spin_wait_step(&w);
    }
}

void csd_pool_barrier_wait(csd_pool_barrier *b, int64_t *passed, int nth) {
    csd_pool_barrier_wait_idle(b, passed, nth, NULL, NULL);
}

void csd_pool_rest(csd_pool *pool) {
    if (pool) atomic_store_explicit(&pool->rest, true, memory_order_relaxed);
}

void csd_pool_run(csd_pool *pool, csd_pool_fn fn, void *ctx) {
    csd_pool_run_chunks(pool, fn, ctx, csd_pool_size(pool));
}

int csd_pool_size(const csd_pool *pool) { return pool ? pool->n_threads : 1; }
