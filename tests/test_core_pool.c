/* The fork-join pool: every chunk of a job runs exactly once whatever the thread count, jobs follow
 * each other without mixing, and the guided split tiles its range in order with chunks that never
 * grow (the big ones first), as the matmul driver relies on; plain memory passes between the
 * caller and the chunks, barriers order a job's phases, and a waiting thread's idle work runs only
 * while it waits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/pool.h"

#define MAX_CHUNKS 4096

typedef struct count_job {
    atomic_int runs[MAX_CHUNKS];
    atomic_int bad_nth;
    int n;
} count_job;

static void count_chunk(void *ctx, int ith, int nth) {
    count_job *j = ctx;
    if (nth != j->n || ith < 0 || ith >= nth) atomic_fetch_add(&j->bad_nth, 1);
    else atomic_fetch_add(&j->runs[ith], 1);
}

static void test_every_chunk_once(void **state) {
    (void)state;
    static count_job job;
    for (int threads = 1; threads <= 4; threads++) {
        csd_pool *pool = NULL;
        csd_err err = {0};
        assert_int_equal(csd_pool_create(&pool, threads, &err), 0);
        assert_int_equal(csd_pool_size(pool), threads);
        /* many jobs back to back: no chunk of one leaks into the next */
        for (int rep = 0; rep < 200; rep++) {
            int n = 1 + (rep * 37) % 300;
            for (int i = 0; i < n; i++) atomic_store(&job.runs[i], 0);
            atomic_store(&job.bad_nth, 0);
            job.n = n;
            csd_pool_run_chunks(pool, count_chunk, &job, n);
            assert_int_equal(atomic_load(&job.bad_nth), 0);
            for (int i = 0; i < n; i++) assert_int_equal(atomic_load(&job.runs[i]), 1);
        }
        csd_pool_destroy(pool);
    }
}

static void test_guided_split_tiles_in_order(void **state) {
    (void)state;
    static const int64_t sizes[] = {0, 1, 5, 16, 160, 704, 2000, 100003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        for (int threads = 1; threads <= 4; threads++)
            for (int rounds = 1; rounds <= 7; rounds++) {
                int chunks = rounds * threads;
                int64_t next = 0, prev_round_size = INT64_MAX;
                for (int c = 0; c < chunks; c++) {
                    int64_t b, e;
                    csd_split_guided(n, c, chunks, threads, &b, &e);
                    assert_int_equal(b, next); /* contiguous, in order */
                    assert_true(e >= b);
                    next = e;
                    if (c % threads == 0) { /* a round's first chunk is its largest */
                        if (rounds > 1 && c / threads < rounds - 1 &&
                            n >= (int64_t)threads << rounds)
                            assert_true(e - b <= prev_round_size);
                        prev_round_size = e - b;
                    }
                }
                assert_int_equal(next, n); /* the chunks cover [0, n) exactly */
            }
    }
    /* 12 chunks over 2 threads, 128 blocks: half the range in the first round */
    int64_t b, e;
    csd_split_guided(128, 0, 12, 2, &b, &e);
    assert_int_equal(e - b, 32);
    csd_split_guided(128, 11, 12, 2, &b, &e);
    assert_int_equal(e, 128);
    assert_true(e - b <= 2);
    /* not a multiple of the threads: the even split */
    csd_split_guided(100, 3, 7, 2, &b, &e);
    int64_t b2, e2;
    csd_split_range(100, 3, 7, &b2, &e2);
    assert_int_equal(b, b2);
    assert_int_equal(e, e2);
}

/* Plain (non-atomic) memory handed over by the pool, as the kernels rely on: what the caller
 * wrote before csd_pool_run_chunks is seen by every chunk, and what the chunks wrote is seen by
 * the caller once it returns. On x86 a wrong memory order rarely shows in the values; under
 * ThreadSanitizer (scripts/test's third pass) a missing release/acquire pair in the pool is a
 * reported race. */
#define HANDOVER_CHUNKS 64

typedef struct handover_job {
    int in[HANDOVER_CHUNKS];
    int out[HANDOVER_CHUNKS];
} handover_job;

static void handover_chunk(void *ctx, int ith, int nth) {
    handover_job *j = ctx;
    (void)nth;
    j->out[ith] = 2 * j->in[ith] + 1;
}

static void test_plain_data_handed_over(void **state) {
    (void)state;
    static handover_job job;
    for (int threads = 2; threads <= 4; threads++) {
        csd_pool *pool = NULL;
        assert_int_equal(csd_pool_create(&pool, threads, NULL), 0);
        for (int rep = 0; rep < 100; rep++) {
            for (int i = 0; i < HANDOVER_CHUNKS; i++) job.in[i] = rep * 1000 + i;
            csd_pool_run_chunks(pool, handover_chunk, &job, HANDOVER_CHUNKS);
            for (int i = 0; i < HANDOVER_CHUNKS; i++)
                assert_int_equal(job.out[i], 2 * (rep * 1000 + i) + 1);
        }
        csd_pool_destroy(pool);
    }
}

/* The same through a barrier: plain writes before it are seen by every thread after it. */
typedef struct barrier_plain_job {
    csd_pool_barrier barrier;
    int slot[8];
    atomic_int bad;
} barrier_plain_job;

static void barrier_plain_chunk(void *ctx, int ith, int nth) {
    barrier_plain_job *j = ctx;
    int64_t passed = 0;
    for (int r = 0; r < 50; r++) {
        j->slot[ith] = r * 100 + ith;
        csd_pool_barrier_wait(&j->barrier, &passed, nth);
        for (int t = 0; t < nth; t++)
            if (j->slot[t] != r * 100 + t) atomic_fetch_add(&j->bad, 1);
        csd_pool_barrier_wait(&j->barrier, &passed, nth);
    }
}

static void test_barrier_hands_over_plain_data(void **state) {
    (void)state;
    for (int threads = 2; threads <= 4; threads++) {
        csd_pool *pool = NULL;
        assert_int_equal(csd_pool_create(&pool, threads, NULL), 0);
        barrier_plain_job job;
        memset(&job, 0, sizeof job);
        csd_pool_run(pool, barrier_plain_chunk, &job);
        assert_int_equal(atomic_load(&job.bad), 0);
        csd_pool_destroy(pool);
    }
}

/* Threads of one job meeting at csd_pool_barrier_wait: after each barrier every thread sees what
 * every other wrote before it, and the job's chunks each had a thread of their own. */
#define BARRIER_ROUNDS 200

typedef struct barrier_job {
    csd_pool_barrier barrier;
    _Atomic int slot[8];
    atomic_int bad;
} barrier_job;

static void barrier_chunk(void *ctx, int ith, int nth) {
    barrier_job *j = ctx;
    int64_t passed = 0;
    for (int r = 0; r < BARRIER_ROUNDS; r++) {
        atomic_store_explicit(&j->slot[ith], r * 100 + ith, memory_order_relaxed);
        csd_pool_barrier_wait(&j->barrier, &passed, nth);
        for (int t = 0; t < nth; t++)
            if (atomic_load_explicit(&j->slot[t], memory_order_relaxed) != r * 100 + t)
                atomic_fetch_add(&j->bad, 1);
        csd_pool_barrier_wait(&j->barrier, &passed, nth); /* nobody writes round r + 1 early */
    }
    if (passed != 2 * BARRIER_ROUNDS) atomic_fetch_add(&j->bad, 1); /* no cmocka off main */
}

static void test_barrier_orders_phases(void **state) {
    (void)state;
    for (int threads = 2; threads <= 4; threads++) {
        csd_pool *pool = NULL;
        csd_err err = {0};
        assert_int_equal(csd_pool_create(&pool, threads, &err), 0);
        barrier_job job;
        memset(&job, 0, sizeof job);
        csd_pool_run(pool, barrier_chunk, &job);
        assert_int_equal(atomic_load(&job.bad), 0);
        assert_int_equal(atomic_load(&job.barrier.arrived), 2 * BARRIER_ROUNDS * threads);
        csd_pool_destroy(pool);
    }
}

/* csd_pool_barrier_wait_idle: a waiting thread calls idle until it returns false and then no
 * more, and the barrier still orders the phases. Chunk 1 arrives only once chunk 0 has made every
 * call (made so, not timed: a preempted chunk 0 cannot be overtaken); the last to arrive never
 * waits. */
#define IDLE_CALLS_WANTED 5

typedef struct idle_job {
    csd_pool_barrier barrier;
    _Atomic int slot[2];
    atomic_int calls[2];
    atomic_int bad;
} idle_job;

typedef struct idle_ctx {
    atomic_int *calls;
} idle_ctx;

static bool count_idle(void *ctx) {
    idle_ctx *c = ctx;
    return atomic_fetch_add(c->calls, 1) + 1 < IDLE_CALLS_WANTED;
}

static void idle_chunk(void *ctx, int ith, int nth) {
    idle_job *j = ctx;
    int64_t passed = 0;
    /* chunk 1 waits (up to 30 s) for chunk 0's calls before it arrives */
    for (int waited = 0; ith == 1 && waited < 30000; waited++) {
        if (atomic_load(&j->calls[0]) >= IDLE_CALLS_WANTED) break;
        struct timespec ms = {0, 1000 * 1000};
        nanosleep(&ms, NULL);
    }
    atomic_store_explicit(&j->slot[ith], 1 + ith, memory_order_relaxed);
    idle_ctx c = {&j->calls[ith]};
    csd_pool_barrier_wait_idle(&j->barrier, &passed, nth, count_idle, &c);
    for (int t = 0; t < nth; t++)
        if (atomic_load_explicit(&j->slot[t], memory_order_relaxed) != 1 + t)
            atomic_fetch_add(&j->bad, 1);
}

static void test_barrier_idle_work(void **state) {
    (void)state;
    csd_pool *pool = NULL;
    assert_int_equal(csd_pool_create(&pool, 2, NULL), 0);
    idle_job job;
    memset(&job, 0, sizeof job);
    csd_pool_run(pool, idle_chunk, &job);
    assert_int_equal(atomic_load(&job.bad), 0);
    /* the first to arrive: every call, then no more; the last never waits */
    assert_int_equal(atomic_load(&job.calls[0]), IDLE_CALLS_WANTED);
    assert_int_equal(atomic_load(&job.calls[1]), 0);
    csd_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_chunk_once),
        cmocka_unit_test(test_guided_split_tiles_in_order),
        cmocka_unit_test(test_plain_data_handed_over),
        cmocka_unit_test(test_barrier_orders_phases),
        cmocka_unit_test(test_barrier_hands_over_plain_data),
        cmocka_unit_test(test_barrier_idle_work),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
