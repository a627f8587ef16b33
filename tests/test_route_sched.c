/* The router's scheduler (route/route_sched.h) with real threads: requests blocked on a full
 * upstream get its slot in the order they came, a request failing over goes before them, the
 * queue's bound answers CSD_EFULL, a deadline CSD_ETIMEOUT, and a waiter whose client leaves is
 * out of the queue at once with CSD_ECANCELED. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/clock.h"
#include "core/err.h"
#include "route/route_sched.h"

#define N_WAITERS 5

typedef struct waiter_thread {
    csd_route_sched *s;
    int index;
    bool retry;
    int got;                 /* what acquire returned */
    int *order, *n_order;    /* where it writes its index once it has the slot */
    pthread_mutex_t *order_mu;
    pthread_t thread;
} waiter_thread;

static void *waiter_main(void *arg) {
    waiter_thread *t = arg;
    csd_route_waiter w = {0};
    t->got = csd_route_sched_acquire(t->s, &w, t->retry, csd_now_s() + 30, NULL);
    if (t->got >= 0) {
        pthread_mutex_lock(t->order_mu);
        t->order[(*t->n_order)++] = t->index;
        pthread_mutex_unlock(t->order_mu);
        csd_route_sched_release(t->s, t->got, false, false);
    }
    return NULL;
}

static int queue_depth(csd_route_sched *s) {
    csd_route_stats st;
    csd_route_sched_stats(s, &st);
    return st.queue_depth;
}

/* Waits (up to 10 s) until depth requests wait. */
static void wait_depth(csd_route_sched *s, int depth) {
    for (int i = 0; i < 10000 && queue_depth(s) != depth; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(queue_depth(s), depth);
}

static void test_fifo_and_failover_first(void **state) {
    (void)state;
    csd_route_sched s;
    assert_int_equal(csd_route_sched_init(&s, 1, (int[]){1}, 16), 0);
    csd_route_waiter holder = {0};
    assert_int_equal(csd_route_sched_acquire(&s, &holder, false, csd_now_s() + 1, NULL), 0);
    int order[N_WAITERS + 1], n_order = 0;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    waiter_thread t[N_WAITERS + 1];
    for (int i = 0; i <= N_WAITERS; i++) { /* one at a time, so that the queue's order is known */
        t[i] = (waiter_thread){&s, i, i == N_WAITERS, 0, order, &n_order, &mu, 0};
        assert_int_equal(pthread_create(&t[i].thread, NULL, waiter_main, &t[i]), 0);
        wait_depth(&s, i + 1);
    }
    csd_route_sched_release(&s, 0, false, false); /* the chain starts: each releases in turn */
    for (int i = 0; i <= N_WAITERS; i++) pthread_join(t[i].thread, NULL);
    assert_int_equal(n_order, N_WAITERS + 1);
    assert_int_equal(order[0], N_WAITERS); /* the failover (retry) went first */
    for (int i = 0; i < N_WAITERS; i++) assert_int_equal(order[i + 1], i); /* then in order */
    csd_route_stats st;
    csd_route_sched_stats(&s, &st);
    assert_int_equal(st.up[0].peak, 1); /* never two at once */
    assert_int_equal(st.up[0].in_flight, 0);
    csd_route_sched_fini(&s);
}

static atomic_bool client_left;
static bool left(void *ctx) {
    (void)ctx;
    return atomic_load(&client_left);
}

typedef struct leaver {
    csd_route_sched *s;
    int got;
} leaver;

static void *leaver_main(void *arg) {
    leaver *l = arg;
    csd_route_waiter w = {0};
    csd_route_abort ab = {left, NULL};
    l->got = csd_route_sched_acquire(l->s, &w, false, csd_now_s() + 30, &ab);
    return NULL;
}

static void test_full_timeout_and_leaving(void **state) {
    (void)state;
    csd_route_sched s;
    assert_int_equal(csd_route_sched_init(&s, 1, (int[]){1}, 1), 0);
    csd_route_waiter holder = {0};
    assert_int_equal(csd_route_sched_acquire(&s, &holder, false, csd_now_s() + 1, NULL), 0);
    /* one may wait; it leaves when its client does */
    atomic_store(&client_left, false);
    leaver l = {&s, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, leaver_main, &l), 0);
    wait_depth(&s, 1);
    csd_route_waiter second = {0}; /* the queue is full */
    assert_int_equal(csd_route_sched_acquire(&s, &second, false, csd_now_s() + 1, NULL), CSD_EFULL);
    atomic_store(&client_left, true);
    pthread_join(th, NULL);
    assert_int_equal(l.got, CSD_ECANCELED);
    assert_int_equal(queue_depth(&s), 0);
    /* room again: a waiter whose deadline passes gets CSD_ETIMEOUT and leaves the queue */
    csd_route_waiter late = {0};
    double t0 = csd_now_s();
    assert_int_equal(csd_route_sched_acquire(&s, &late, false, t0 + 0.2, NULL), CSD_ETIMEOUT);
    assert_true(csd_now_s() - t0 >= 0.15);
    assert_int_equal(queue_depth(&s), 0);
    csd_route_stats st;
    csd_route_sched_stats(&s, &st);
    assert_int_equal(st.rejected, 1);
    assert_int_equal(st.timeouts, 1);
    csd_route_sched_release(&s, 0, false, false);
    csd_route_sched_fini(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_and_failover_first),
        cmocka_unit_test(test_full_timeout_and_leaving),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
