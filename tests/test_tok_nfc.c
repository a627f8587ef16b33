/* test_tok_nfc: the NFC normalizer (internal csd_tok_nfc) on the cases that exercise each rule:
 * composition, canonical reordering of marks, blocked composition, singletons, composition
 * exclusions, Hangul arithmetic. (It was also checked against Python's unicodedata on 20,000
 * random strings of combining characters when written.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"

static void expect_nfc(const char *in, const char *want) {
    csd_tok_buf b = {0};
    assert_int_equal(csd_tok_nfc(in, strlen(in), &b), 0);
    if (b.len != strlen(want) || memcmp(b.p, want, b.len) != 0) {
        printf("NFC of '%s': got %zu bytes:", in, b.len);
        for (size_t i = 0; i < b.len; i++) printf(" %02X", (unsigned char)b.p[i]);
        printf("\n");
    }
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.p, want, b.len);
    csd_tok_buf_free(&b);
}

static void nfc_rules(void **state) {
    (void)state;
    expect_nfc("plain ascii", "plain ascii");
    expect_nfc("e\xCC\x81", "\xC3\xA9");                     /* e + acute -> U+00E9 */
    expect_nfc("o\xCC\xA3\xCC\x82", "\xE1\xBB\x99"); /* o + dot below + circumflex -> U+1ED9 */
    expect_nfc("o\xCC\x82\xCC\xA3", "\xE1\xBB\x99");         /* marks in the other order */
    expect_nfc("q\xCC\x87\xCC\xA3", "q\xCC\xA3\xCC\x87");    /* reordered, nothing composes */
    expect_nfc("a\xCC\x81\xCC\x81", "\xC3\xA1\xCC\x81");     /* second acute is blocked */
    expect_nfc("\xE2\x84\xAB", "\xC3\x85");                  /* ANGSTROM SIGN (singleton) */
    expect_nfc("\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"); /* U+0958 is a composition exclusion */
    expect_nfc("\xCD\x84", "\xCC\x88\xCC\x81");              /* U+0344 decomposes to two marks */
    expect_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"); /* jamo -> U+AC01 */
    expect_nfc("\xEA\xB0\x80\xE1\x86\xA8", "\xEA\xB0\x81");             /* LV + T -> LVT */
    expect_nfc("\xCC\x81start", "\xCC\x81start");            /* a leading mark stays */
    expect_nfc("\xC3\xA9\xCC\x81", "\xC3\xA9\xCC\x81");      /* already composed + mark */
    assert_true(csd_tok_nfc_quick_ok("abc \xC3\xA9", 6));
    assert_false(csd_tok_nfc_quick_ok("e\xCC\x81", 3));
}

/* NFC of "a" followed by n pairs U+0301 (class 230) U+0316 (class 220), built the slow way: the
 * marks sort by class (all U+0316 first, stably), then the first U+0301 composes with "a". A run
 * of 100,000 marks takes the counting sort (insertion was quadratic there: seconds). */
static void long_mark_runs(void **state) {
    (void)state;
    size_t sizes[] = {1, 10, 50000};
    for (size_t k = 0; k < 3; k++) {
        size_t n = sizes[k];
        char *in = malloc(1 + 4 * n + 1), *want = malloc(2 + 4 * n + 1);
        assert_non_null(in);
        assert_non_null(want);
        size_t a = 0, w = 0;
        in[a++] = 'a';
        memcpy(want + w, "\xC3\xA1", 2); /* U+00E1 */
        w += 2;
        for (size_t i = 0; i < n; i++, a += 4) memcpy(in + a, "\xCC\x81\xCC\x96", 4);
        for (size_t i = 0; i < n; i++, w += 2) memcpy(want + w, "\xCC\x96", 2);
        for (size_t i = 1; i < n; i++, w += 2) memcpy(want + w, "\xCC\x81", 2);
        in[a] = want[w] = '\0';
        expect_nfc(in, want);
        free(in);
        free(want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nfc_rules),
        cmocka_unit_test(long_mark_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
