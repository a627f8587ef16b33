/* The router's slot choice and queue (route/route_pick.h): the upstream with the most free slots
 * wins, ties go round robin, no upstream ever holds more than its max, upstreams marked down are
 * avoided (and used only when nothing else is left), a request never goes back to an upstream
 * that failed it, and waiters are served in order, within the queue's bound. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "route/route_pick.h"

static void init(csd_route_slots *s, int n, const int *max) { csd_route_slots_init(s, n, max); }

/* Picks and takes in one go, as the scheduler does; the index, or the pick's failure. */
static int take(csd_route_slots *s, uint32_t tried, double now) {
    int i = csd_route_pick(s, tried, now);
    if (i >= 0) csd_route_take(s, i);
    return i;
}

static void test_most_free_wins(void **state) {
    (void)state;
    csd_route_slots s;
    init(&s, 3, (int[]){1, 4, 2});
    assert_int_equal(take(&s, 0, 0), 1); /* 4 free */
    assert_int_equal(take(&s, 0, 0), 1); /* 3 free, against 1 and 2 */
    assert_int_equal(take(&s, 0, 0), 2); /* 2 free: 1 and 2 tie at 2, the cursor is past 1 */
    assert_int_equal(s.up[1].in_flight, 2);
    assert_int_equal(s.up[2].in_flight, 1);
    assert_int_equal(s.up[0].in_flight, 0);
}

static void test_ties_round_robin(void **state) {
    (void)state;
    csd_route_slots s;
    init(&s, 3, (int[]){1, 1, 1});
    int seen[3] = {0};
    /* one request at a time: every upstream has the same free slots, so they take turns */
    for (int k = 0; k < 9; k++) {
        int i = take(&s, 0, 0);
        assert_int_equal(i, k % 3);
        seen[i]++;
        csd_route_release(&s, i);
    }
    assert_int_equal(seen[0], 3);
    assert_int_equal(seen[1], 3);
    assert_int_equal(seen[2], 3);
}

static void test_never_over_max(void **state) {
    (void)state;
    csd_route_slots s;
    init(&s, 2, (int[]){1, 2});
    assert_true(take(&s, 0, 0) >= 0);
    assert_true(take(&s, 0, 0) >= 0);
    assert_true(take(&s, 0, 0) >= 0);
    assert_int_equal(csd_route_pick(&s, 0, 0), CSD_ROUTE_PICK_BUSY); /* 3 slots, 3 taken */
    assert_int_equal(s.up[0].in_flight, 1);
    assert_int_equal(s.up[1].in_flight, 2);
    assert_int_equal(s.up[0].peak, 1);
    assert_int_equal(s.up[1].peak, 2);
    csd_route_release(&s, 1);
    assert_int_equal(take(&s, 0, 0), 1); /* the slot given back, and only it */
    assert_int_equal(csd_route_pick(&s, 0, 0), CSD_ROUTE_PICK_BUSY);
    assert_int_equal(s.up[1].peak, 2);
}

static void test_down_skipped_until_it_expires(void **state) {
    (void)state;
    csd_route_slots s;
    init(&s, 2, (int[]){4, 1});
    csd_route_mark_down(&s, 0, 10.0);
    assert_true(csd_route_is_down(&s, 0, 5.0));
    assert_int_equal(take(&s, 0, 5.0), 1); /* 0 has more free slots, but is down */
    /* 1 is full: wait for it rather than use the one that is down */
    assert_int_equal(csd_route_pick(&s, 0, 5.0), CSD_ROUTE_PICK_BUSY);
    assert_false(csd_route_is_down(&s, 0, 10.0));
    assert_int_equal(take(&s, 0, 10.0), 0); /* the mark has expired */
}

static void test_all_down_still_tried(void **state) {
    (void)state;
    csd_route_slots s;
    init(&s, 2, (int[]){1, 1});
    csd_route_mark_down(&s, 0, 10.0);
    csd_route_mark_down(&s, 1, 10.0);
    /* a mark is a guess: when every upstream is down, one is tried rather than failing unasked */
    assert_true(take(&s, 0, 1.0) >= 0);
}

static void test_tried_never_again(void **state) {
    (void)state;
    csd_route_slots s;
    init(&s, 3, (int[]){2, 2, 2});
    uint32_t tried = 0;
    for (int k = 0; k < 3; k++) {
        int i = csd_route_pick(&s, tried, 0);
        assert_true(i >= 0);
        assert_false(tried & (1u << i));
        tried |= 1u << i;
    }
    assert_int_equal(csd_route_pick(&s, tried, 0), CSD_ROUTE_PICK_NONE);
    /* an untried upstream that is only full means waiting, not failing */
    csd_route_take(&s, 2);
    csd_route_take(&s, 2);
    assert_int_equal(csd_route_pick(&s, 3u, 0), CSD_ROUTE_PICK_BUSY);
}

static void test_queue_fifo_and_bound(void **state) {
    (void)state;
    csd_route_queue q;
    csd_route_queue_init(&q, 3);
    csd_route_waiter w[5] = {0};
    for (int i = 0; i < 3; i++) assert_true(csd_route_queue_push_back(&q, &w[i]));
    assert_false(csd_route_queue_push_back(&q, &w[3])); /* the bound */
    assert_false(w[3].queued);
    assert_int_equal(q.count, 3);
    csd_route_queue_push_front(&q, &w[4]); /* a failover: not bounded, first in line */
    assert_int_equal(q.count, 4);
    assert_ptr_equal(q.head, &w[4]);
    csd_route_queue_remove(&q, &w[1]); /* a client that left */
    assert_false(w[1].queued);
    csd_route_waiter *order[] = {&w[4], &w[0], &w[2]};
    csd_route_waiter *it = q.head;
    for (int i = 0; i < 3; i++, it = it->next) assert_ptr_equal(it, order[i]);
    assert_null(it);
    assert_ptr_equal(q.tail, &w[2]);
}

/* Slots go to waiters in the order they came: with one slot at a time, the first waiter first. */
static void test_dispatch_in_order(void **state) {
    (void)state;
    csd_route_slots s;
    init(&s, 2, (int[]){1, 1});
    take(&s, 0, 0);
    take(&s, 0, 0);
    csd_route_queue q;
    csd_route_queue_init(&q, 8);
    csd_route_waiter w[3] = {0};
    for (int i = 0; i < 3; i++) assert_true(csd_route_queue_push_back(&q, &w[i]));
    assert_int_equal(csd_route_dispatch(&s, &q, 0), 0); /* nothing free: all wait */
    csd_route_release(&s, 1);
    assert_int_equal(csd_route_dispatch(&s, &q, 0), 1);
    assert_int_equal(w[0].granted, 1);
    assert_false(w[0].queued);
    assert_int_equal(w[1].granted, CSD_ROUTE_PICK_BUSY);
    csd_route_release(&s, 0);
    assert_int_equal(csd_route_dispatch(&s, &q, 0), 1);
    assert_int_equal(w[1].granted, 0);
    assert_true(w[2].queued);
    assert_int_equal(s.up[0].in_flight + s.up[1].in_flight, 2);
}

/* A waiter that failed on the one free upstream stays; the one behind it takes that slot. One
 * with nothing left to try leaves the queue with PICK_NONE. */
static void test_dispatch_skips_tried(void **state) {
    (void)state;
    csd_route_slots s;
    init(&s, 2, (int[]){1, 1});
    take(&s, 0, 0); /* upstream 0 busy */
    csd_route_queue q;
    csd_route_queue_init(&q, 8);
    csd_route_waiter failed_on_1 = {.tried = 2u}, fresh = {0}, failed_on_both = {.tried = 3u};
    csd_route_queue_push_back(&q, &failed_on_1);
    csd_route_queue_push_back(&q, &fresh);
    csd_route_queue_push_back(&q, &failed_on_both);
    assert_int_equal(csd_route_dispatch(&s, &q, 0), 2);
    assert_true(failed_on_1.queued); /* waits for upstream 0 */
    assert_int_equal(fresh.granted, 1);
    assert_int_equal(failed_on_both.granted, CSD_ROUTE_PICK_NONE);
    assert_int_equal(q.count, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_most_free_wins),
        cmocka_unit_test(test_ties_round_robin),
        cmocka_unit_test(test_never_over_max),
        cmocka_unit_test(test_down_skipped_until_it_expires),
        cmocka_unit_test(test_all_down_still_tried),
        cmocka_unit_test(test_tried_never_again),
        cmocka_unit_test(test_queue_fifo_and_bound),
        cmocka_unit_test(test_dispatch_in_order),
        cmocka_unit_test(test_dispatch_skips_tried),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
