/* The tokenization gate of the HTTP server: large texts are tokenized at most a budget's worth at
 * a time (however many connections ask at once), a text larger than the whole budget goes alone,
 * and short texts never wait. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "http/tok_gate.h"

#define BUDGET ((size_t)1 << 20)

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct worker_arg {
    csd_tok_gate *g;
    size_t bytes;
    atomic_int *inside; /* texts between enter and leave now */
    atomic_int *most;   /* the most that ever were */
} worker_arg;

static void *tokenize_like(void *arg) {
    worker_arg *a = arg;
    csd_tok_gate_enter(a->g, a->bytes);
    int now = atomic_fetch_add(a->inside, 1) + 1;
    for (int m = atomic_load(a->most); now > m && !atomic_compare_exchange_weak(a->most, &m, now);)
        ;
    sleep_ms(20);
    atomic_fetch_sub(a->inside, 1);
    csd_tok_gate_leave(a->g, a->bytes);
    return NULL;
}

static void test_budget_bounds_large_texts(void **state) {
    (void)state;
    csd_tok_gate g;
    csd_tok_gate_init(&g, BUDGET);
    atomic_int inside = 0, most = 0;
    enum { N = 8 };
    pthread_t t[N];
    worker_arg a = {&g, 400 << 10, &inside, &most}; /* two fit in 1 MiB, three do not */
    for (int i = 0; i < N; i++) assert_int_equal(pthread_create(&t[i], NULL, tokenize_like, &a), 0);
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    assert_true(atomic_load(&most) >= 1 && atomic_load(&most) <= 2);
    assert_true(csd_tok_gate_peak(&g) <= 2 * (400 << 10));
    csd_tok_gate_fini(&g);
}

static void test_oversized_text_goes_alone(void **state) {
    (void)state;
    csd_tok_gate g;
    csd_tok_gate_init(&g, BUDGET);
    atomic_int inside = 0, most = 0;
    worker_arg big = {&g, 3 * BUDGET, &inside, &most}, mid = {&g, BUDGET / 2, &inside, &most};
    pthread_t t[4];
    assert_int_equal(pthread_create(&t[0], NULL, tokenize_like, &big), 0); /* not refused */
    for (int i = 1; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, tokenize_like, &mid), 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    /* the big one never shared the gate: at most two halves were ever in at once */
    assert_true(atomic_load(&most) <= 2);
    assert_int_equal(csd_tok_gate_peak(&g), 3 * BUDGET); /* when it was in, it was alone */
    csd_tok_gate_fini(&g);
}

static void *enter_small(void *arg) {
    worker_arg *a = arg;
    csd_tok_gate_enter(a->g, a->bytes);
    atomic_fetch_add(a->inside, 1);
    csd_tok_gate_leave(a->g, a->bytes);
    return NULL;
}

static void test_short_texts_never_wait(void **state) {
    (void)state;
    csd_tok_gate g;
    csd_tok_gate_init(&g, BUDGET);
    csd_tok_gate_enter(&g, BUDGET); /* the gate is full */
    atomic_int done = 0, unused = 0;
    worker_arg small = {&g, CSD_TOK_GATE_MIN_BYTES - 1, &done, &unused};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, enter_small, &small), 0);
    for (int i = 0; i < 500 && !atomic_load(&done); i++) sleep_ms(10);
    assert_int_equal(atomic_load(&done), 1); /* it went through a full gate */
    pthread_join(t, NULL);
    worker_arg large = {&g, CSD_TOK_GATE_MIN_BYTES, &done, &unused};
    assert_int_equal(pthread_create(&t, NULL, enter_small, &large), 0);
    sleep_ms(100);
    assert_int_equal(atomic_load(&done), 1); /* this one waits for room */
    csd_tok_gate_leave(&g, BUDGET);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&done), 2);
    csd_tok_gate_fini(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_bounds_large_texts),
        cmocka_unit_test(test_oversized_text_goes_alone),
        cmocka_unit_test(test_short_texts_never_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
