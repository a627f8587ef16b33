/* The flag parsers every subcommand shares (cli/cli_util.h): whole integers and numbers within a
 * range, and id lists ("1,2,3") for --ids and --concurrency. A refused value must not be half
 * taken: the output stays untouched (numbers) or empty (lists). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cli/cli_util.h"
#include "core/alloc.h"

static void test_int_in_range(void **state) {
    (void)state;
    int64_t v = -7;
    assert_true(csd_cli_int("t", "--n", "42", 1, 100, &v));
    assert_int_equal(v, 42);
    assert_true(csd_cli_int("t", "--n", "-3", -5, 5, &v));
    assert_int_equal(v, -3);
    assert_true(csd_cli_int("t", "--n", "100", 1, 100, &v)); /* both ends are allowed */
    assert_int_equal(v, 100);
    assert_true(csd_cli_int("t", "--n", "1", 1, 100, &v));
    assert_int_equal(v, 1);
}

static void test_int_refused(void **state) {
    (void)state;
    const char *bad[] = {"", "0", "101", "4x", "x4", "4.5", "1e2", "99999999999999999999999", NULL};
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        int64_t v = -7;
        assert_false(csd_cli_int("t", "--n", bad[i], 1, 100, &v));
        assert_int_equal(v, -7);
    }
}

static void test_float_in_range_and_refused(void **state) {
    (void)state;
    double v = -1;
    assert_true(csd_cli_float("t", "--x", "0.25", 0, 1, &v));
    assert_true(v == 0.25);
    assert_true(csd_cli_float("t", "--x", "2", 0, 2, &v));
    assert_true(v == 2.0);
    const char *bad[] = {"", "nan", "inf", "-0.1", "2.01", "1,5", "0.5x", "1e999", NULL};
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        v = -1;
        assert_false(csd_cli_float("t", "--x", bad[i], 0, 2, &v));
        assert_true(v == -1);
    }
}

/* Parses text and checks the ids against want[0..n_want). */
static void expect_ids(const char *text, const int32_t *want, int64_t n_want) {
    int32_t *ids = NULL;
    int64_t n = -1;
    assert_true(csd_cli_id_list("t", "--ids", text, &ids, &n));
    assert_int_equal(n, n_want);
    for (int64_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    csd_free(ids);
}

static void test_id_list_accepted(void **state) {
    (void)state;
    expect_ids("1,2,3", (const int32_t[]){1, 2, 3}, 3);
    expect_ids("7", (const int32_t[]){7}, 1);
    expect_ids("0,2147483647", (const int32_t[]){0, INT32_MAX}, 2);
    expect_ids(" 1, 2 ,3 ", (const int32_t[]){1, 2, 3}, 3); /* blanks around items */
    expect_ids("4 5 6", (const int32_t[]){4, 5, 6}, 3);     /* blanks alone separate too */
    expect_ids("007", (const int32_t[]){7}, 1);
}

static void test_id_list_refused(void **state) {
    (void)state;
    const char *bad[] = {
        "",     " ",   ",",    "1,",  "1, ", "1,,2", ",1",         "1;2",
        "-1",   "+1",  "0x10", "1.5", "1a",  "a",    "2147483648", "99999999999999999999",
        "1,-2", "1,,", "1\t2",
    };
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        int32_t *ids = (int32_t *)&ids; /* must come back NULL */
        int64_t n = -1;
        assert_false(csd_cli_id_list("t", "--ids", bad[i], &ids, &n));
        assert_null(ids);
        assert_int_equal(n, 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int_in_range),
        cmocka_unit_test(test_int_refused),
        cmocka_unit_test(test_float_in_range_and_refused),
        cmocka_unit_test(test_id_list_accepted),
        cmocka_unit_test(test_id_list_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
