/* Prompt-lookup drafts: the tokens after the latest earlier occurrence of the text's last three
 * tokens (else two) are proposed, continuing periodically past the end of the text; no
 * occurrence, or a text too short, proposes nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coord/ngram_draft.h"

#define LEN(a) ((int64_t)(sizeof(a) / sizeof((a)[0])))

static void test_no_occurrence(void **state) {
    (void)state;
    const int32_t hist[] = {1, 2, 3, 4, 5, 6};
    int32_t out[4];
    assert_int_equal(csd_ngram_draft(hist, LEN(hist), out, 4), 0);
    assert_int_equal(csd_ngram_draft(hist, 2, out, 4), 0); /* no room for an earlier one */
    assert_int_equal(csd_ngram_draft(hist, 0, out, 4), 0);
    const int32_t twice[] = {7, 8, 9, 7, 8};
    assert_int_equal(csd_ngram_draft(twice, LEN(twice), out, 0), 0); /* nothing asked */
}

static void test_follows_the_occurrence(void **state) {
    (void)state;
    /* the last three (1 2 3) occurred at 1, followed by 9 */
    const int32_t hist[] = {5, 1, 2, 3, 9, 1, 2, 3};
    int32_t out[6];
    assert_int_equal(csd_ngram_draft(hist, LEN(hist), out, 3), 3);
    const int32_t three[] = {9, 1, 2};
    assert_memory_equal(out, three, sizeof three);
    /* past the text's end the draft goes on with itself: period 4 (9 1 2 3) */
    assert_int_equal(csd_ngram_draft(hist, LEN(hist), out, 6), 6);
    const int32_t six[] = {9, 1, 2, 3, 9, 1};
    assert_memory_equal(out, six, sizeof six);
}

static void test_longer_match_first(void **state) {
    (void)state;
    /* two tokens (2 3) last occurred at 4 (then 8); three (1 2 3) only at 0 (then 7) */
    const int32_t hist[] = {1, 2, 3, 7, 2, 3, 8, 1, 2, 3};
    int32_t out[1];
    assert_int_equal(csd_ngram_draft(hist, LEN(hist), out, 1), 1);
    assert_int_equal(out[0], 7);
}

static void test_latest_occurrence_wins(void **state) {
    (void)state;
    /* (1 2) occurred at 0 (then 7) and at 3 (then 8); no three-token match */
    const int32_t hist[] = {1, 2, 7, 1, 2, 8, 1, 2};
    int32_t out[2];
    assert_int_equal(csd_ngram_draft(hist, LEN(hist), out, 2), 2);
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 1);
}

static void test_a_run_repeats(void **state) {
    (void)state;
    /* an overlapping occurrence: a run of one token goes on */
    const int32_t hist[] = {3, 4, 4, 4};
    int32_t out[5];
    assert_int_equal(csd_ngram_draft(hist, LEN(hist), out, 5), 5);
    for (int i = 0; i < 5; i++) assert_int_equal(out[i], 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_occurrence),
        cmocka_unit_test(test_follows_the_occurrence),
        cmocka_unit_test(test_longer_match_first),
        cmocka_unit_test(test_latest_occurrence_wins),
        cmocka_unit_test(test_a_run_repeats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
