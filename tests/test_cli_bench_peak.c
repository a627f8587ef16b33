/* The peak bandwidth of `cascadia bench`'s roofline (cli/bench_internal.h, csd_cli_bench_peak):
 * the read test's best pass, raised by any longer-than-cache rate the run sustained above it, and
 * never by a short pass that ran from cache. And the median pass printed beside the best one
 * (csd_cli_bench_median_gbs): the way's own passes only, odd and even counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "cli/bench_internal.h"

#define MIB ((size_t)1 << 20)

static void test_read_test_stays_when_nothing_beats_it(void **state) {
    (void)state;
    const csd_bench_rate rates[] = {
        {"paired reads", 70.0, 600 * MIB},
        {"weight stream", 79.9, 590 * MIB},
        {"tokens", 66.0, 600 * MIB},
    };
    const char *source = NULL;
    assert_true(csd_cli_bench_peak(80.0, rates, 3, 256 * MIB, &source) == 80.0);
    assert_string_equal(source, "read test");
}

static void test_highest_sustained_rate_raises_it(void **state) {
    (void)state;
    const csd_bench_rate rates[] = {
        {"paired reads", 81.0, 600 * MIB},
        {"weight stream", 82.5, 590 * MIB},
        {"tokens", 81.5, 600 * MIB},
    };
    const char *source = NULL;
    assert_true(csd_cli_bench_peak(80.0, rates, 3, 256 * MIB, &source) == 82.5);
    assert_string_equal(source, "weight stream");
}

static void test_passes_shorter_than_the_minimum_do_not_count(void **state) {
    (void)state;
    const csd_bench_rate rates[] = {
        {"paired reads", 300.0, 1 * MIB}, /* from cache */
        {"weight stream", 250.0, 255 * MIB},
        {"tokens", 85.0, 256 * MIB}, /* exactly the minimum counts */
    };
    const char *source = NULL;
    assert_true(csd_cli_bench_peak(80.0, rates, 3, 256 * MIB, &source) == 85.0);
    assert_string_equal(source, "tokens");
    /* with no minimum every pass counts */
    assert_true(csd_cli_bench_peak(80.0, rates, 3, 0, &source) == 300.0);
    assert_string_equal(source, "paired reads");
}

static void test_no_rates_and_unmeasured_rates(void **state) {
    (void)state;
    const char *source = NULL;
    assert_true(csd_cli_bench_peak(42.0, NULL, 0, 256 * MIB, &source) == 42.0);
    assert_string_equal(source, "read test");
    const csd_bench_rate zero[] = {{"paired reads", 0.0, 600 * MIB}}; /* a test that did not run */
    assert_true(csd_cli_bench_peak(42.0, zero, 1, 256 * MIB, &source) == 42.0);
    assert_string_equal(source, "read test");
}

static void add_passes(csd_bench_passes *p, csd_bench_read_way way, const double *gbs, int n) {
    int *count = &p->n[way.nta][way.streams - 1];
    for (int i = 0; i < n; i++) p->gbs[way.nta][way.streams - 1][(*count)++] = gbs[i];
}

static void test_median_pass_of_one_way(void **state) {
    (void)state;
    csd_bench_passes p;
    memset(&p, 0, sizeof p);
    const csd_bench_read_way three_nta = {3, true}, three = {3, false}, one = {1, false};
    const double odd[] = {30.0, 41.0, 27.0, 33.0, 29.0}; /* sorted: 27 29 30 33 41 */
    add_passes(&p, three_nta, odd, 5);
    const double other[] = {90.0, 95.0}; /* another way's passes must not count */
    add_passes(&p, three, other, 2);
    int n = -1;
    assert_true(csd_cli_bench_median_gbs(&p, three_nta, &n) == 30.0);
    assert_int_equal(n, 5);
    const double more[] = {35.0}; /* even count: 27 29 30 33 35 41 -> (30 + 33) / 2 */
    add_passes(&p, three_nta, more, 1);
    assert_true(csd_cli_bench_median_gbs(&p, three_nta, &n) == 31.5);
    assert_int_equal(n, 6);
    assert_true(csd_cli_bench_median_gbs(&p, three, NULL) == 92.5);
    assert_true(csd_cli_bench_median_gbs(&p, one, &n) == 0.0); /* no passes */
    assert_int_equal(n, 0);
    const csd_bench_read_way bad = {CSD_BENCH_READ_PARTS + 1, false};
    assert_true(csd_cli_bench_median_gbs(&p, bad, &n) == 0.0);
    assert_int_equal(n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_test_stays_when_nothing_beats_it),
        cmocka_unit_test(test_highest_sustained_rate_raises_it),
        cmocka_unit_test(test_passes_shorter_than_the_minimum_do_not_count),
        cmocka_unit_test(test_no_rates_and_unmeasured_rates),
        cmocka_unit_test(test_median_pass_of_one_way),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
