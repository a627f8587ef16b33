/* UTF-8 well-formedness (core/utf8.h): every boundary of Unicode's table of well-formed sequences,
 * sequences cut short, and the in-place scrub that makes outside text safe for a JSON string. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "core/utf8.h"

typedef struct seq_case {
    const char *bytes;
    size_t n;
    size_t want; /* csd_utf8_seq_len */
} seq_case;

static void test_sequence_lengths(void **state) {
    (void)state;
    static const seq_case cases[] = {
        {"a", 1, 1},
        {"\x7F", 1, 1},
        {"\xC3\xA9", 2, 2},         /* U+00E9 */
        {"\xC2\x80", 2, 2},         /* U+0080, the first two-byte one */
        {"\xC0\x80", 2, 0},         /* overlong */
        {"\xC1\xBF", 2, 0},         /* overlong */
        {"\xE0\xA0\x80", 3, 3},     /* U+0800 */
        {"\xE0\x9F\xBF", 3, 0},     /* overlong */
        {"\xED\x9F\xBF", 3, 3},     /* U+D7FF */
        {"\xED\xA0\x80", 3, 0},     /* a surrogate */
        {"\xEF\xBF\xBF", 3, 3},     /* U+FFFF */
        {"\xE2\x82", 2, 0},         /* cut short */
        {"\xF0\x90\x80\x80", 4, 4}, /* U+10000 */
        {"\xF0\x8F\xBF\xBF", 4, 0}, /* overlong */
        {"\xF4\x8F\xBF\xBF", 4, 4}, /* U+10FFFF */
        {"\xF4\x90\x80\x80", 4, 0}, /* past U+10FFFF */
        {"\xF5\x80\x80\x80", 4, 0}, /* no such lead byte */
        {"\x80", 1, 0},             /* a continuation byte alone */
        {"\xE2\x28\xA1", 3, 0},     /* a bad second byte */
        {"\xC3\xA9", 1, 0},         /* n cuts a good one */
        {"", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t got = csd_utf8_seq_len(cases[i].bytes, cases[i].n);
        if (got != cases[i].want) fail_msg("case %zu: length %zu, want %zu", i, got, cases[i].want);
    }
}

static void test_scrub(void **state) {
    (void)state;
    char ok[] = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";
    assert_int_equal(csd_utf8_scrub(ok), 0);
    assert_string_equal(ok, "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
    /* a lone lead byte, a cut-short tail at the end, a surrogate, a stray continuation byte */
    char bad[] = "n\\\xDA' x\xED\xA0\x80y\x80z\xE2\x82";
    assert_int_equal(csd_utf8_scrub(bad), 7);
    assert_string_equal(bad, "n\\?' x???y?z??");
}

/* Characters as a decoder shows them: a sequence is one, a stray byte is one (its U+FFFD). */
static void test_chars(void **state) {
    (void)state;
    assert_int_equal(csd_utf8_chars("", 0), 0);
    assert_int_equal(csd_utf8_chars("abc", 3), 3);
    assert_int_equal(csd_utf8_chars("a\xC3\xA9" "b", 4), 3);            /* a, U+00E9, b */
    assert_int_equal(csd_utf8_chars("\xF0\x9F\x98\x80\xE2\x82\xAC", 7), 2); /* U+1F600, U+20AC */
    /* as Python's len(b.decode("utf-8", "replace")) */
    assert_int_equal(csd_utf8_chars("\x80\x80", 2), 2);         /* two stray bytes */
    assert_int_equal(csd_utf8_chars("\xE2\x82", 2), 1);         /* cut short: one U+FFFD */
    assert_int_equal(csd_utf8_chars("\xF0\x9F\x98", 3), 1);
    assert_int_equal(csd_utf8_chars("\xC3" "b", 2), 2);         /* broken by 'b' */
    assert_int_equal(csd_utf8_chars("\xE0\x80", 2), 2);         /* overlong: no start */
    assert_int_equal(csd_utf8_chars("\xED\xA0\x80", 3), 3);     /* a surrogate: no start */
    assert_int_equal(csd_utf8_chars("\xF4\x90", 2), 2);         /* past U+10FFFF */
    assert_int_equal(csd_utf8_chars("a\0b", 3), 3);                       /* NUL is a character */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequence_lengths),
        cmocka_unit_test(test_scrub),
        cmocka_unit_test(test_chars),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
