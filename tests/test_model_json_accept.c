/* The JSON object acceptor behind response_format json_object (model/json_accept.h) and the logits
 * mask over a vocabulary (model/json_mask.h): valid objects are accepted to the end and done there,
 * each invalid one is refused at its first wrong byte with the state unchanged, the limits hold
 * without dead ends, and the mask leaves exactly the tokens whose bytes can come next. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/json_accept.h"
#include "model/json_mask.h"

/* Feeds s; returns how many bytes were accepted before the first refusal (strlen(s) if none). */
static size_t feed(csd_json_accept *a, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if (!csd_json_accept_byte(a, (uint8_t)s[i])) return i;
    return n;
}

static void test_valid_objects(void **state) {
    (void)state;
    static const char *const ok[] = {
        "{}",
        "\n  { }",
        " {\n\t\"k\": [\n    1, 2]\n}",
        "{\"a\":1}",
        "{\"a\": [1, -2.5e+3, 0, 0.25, 1E9, true, false, null, \"x\"], \"b\": {\"c\": {}}}",
        ("{\"s\": \"tab\\t quote\\\" back\\\\ slash\\/ \\u00e9 \\ud83d\\ude00 "
         "caf\xc3\xa9 \xf0\x9f\x98\x80\"}"),
        "{\"\": []}",
        "{\"n\": [[], [[]], {\"k\": -0}]}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        csd_json_accept a;
        csd_json_accept_init(&a);
        size_t n = strlen(ok[i]);
        for (size_t k = 0; k < n; k++) {
            assert_false(csd_json_accept_done(&a)); /* nothing is done before its last byte */
            if (!csd_json_accept_byte(&a, (uint8_t)ok[i][k]))
                fail_msg("object %zu refused at byte %zu: %s", i, k, ok[i]);
        }
        assert_true(csd_json_accept_done(&a));
        assert_false(csd_json_accept_byte(&a, ' ')); /* nothing follows the object */
        assert_false(csd_json_accept_byte(&a, '{'));
    }
}

/* Each text is refused exactly at the byte after its valid prefix (where the '|' was). */
static void test_refused_at_first_wrong_byte(void **state) {
    (void)state;
    static const char *const bad[] = {
        "|[]", "|\"a\"", "|1", "{|1:2}", "{\"a\"|,1}", "{\"a\":|}", "{\"a\":1|\"b\":2}",
        "{\"a\":1,|}", "{\"a\":[1,|]}", "{\"a\":[1|}", "{\"a\":0|1}", "{\"a\":-|x}",
        "{\"a\":1.|}", "{\"a\":1e|}", "{\"a\":tr|e}", "{\"a\":nul|}", "{\"a\":\"\\|x\"}",
        "{\"a\":\"\\u12|g4\"}", "{\"a\":\"|\x01\"}", "{\"a\":\"|\xc0\xaf\"}",
        "{\"a\":\"\xe0|\x80\x80\"}", "{\"a\":\"\xed|\xa0\x80\"}", "{\"a\":\"|\xff\"}",
        "{\"a\":\"\\ud|c00\"}" /* a low half alone */,
        "{\"a\":\"\\ud83d\\ud|83d\"}" /* a high half after a high half */, "{\"a\":\"\\ud83d|\"}",
        "{\"a\":\"\\ud83d\\|n\"}", "{\"a\":\"\\ud83d\\u|0041\"}",
        "{}|}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *bar = strchr(bad[i], '|');
        size_t want = (size_t)(bar - bad[i]);
        char text[64];
        snprintf(text, sizeof text, "%.*s%s", (int)want, bad[i], bar + 1);
        csd_json_accept a;
        csd_json_accept_init(&a);
        size_t got = feed(&a, text);
        if (got != want) fail_msg("text %zu (%s): refused at %zu, not %zu", i, text, got, want);
        /* the refusal left the state as it was: the valid prefix goes on */
        csd_json_accept before = a;
        assert_false(csd_json_accept_byte(&a, (uint8_t)text[want]));
        assert_memory_equal(&a, &before, sizeof a);
    }
}

static void test_limits_without_dead_ends(void **state) {
    (void)state;
    csd_json_accept a;
    csd_json_accept_init(&a);
    assert_true(csd_json_accept_byte(&a, '{'));
    assert_int_equal(feed(&a, "\"d\":"), 4);
    for (int d = 1; d < CSD_JSON_MAX_DEPTH; d++) assert_true(csd_json_accept_byte(&a, '['));
    assert_false(csd_json_accept_byte(&a, '['));        /* one level too deep */
    assert_false(csd_json_accept_byte(&a, '{'));
    assert_true(csd_json_accept_byte(&a, ']'));          /* but it can always close */
    csd_json_accept_init(&a); /* whitespace: one space, or a newline and an indent */
    assert_true(csd_json_accept_byte(&a, '\n'));
    for (int i = 0; i < CSD_JSON_MAX_INDENT; i++) assert_true(csd_json_accept_byte(&a, ' '));
    assert_false(csd_json_accept_byte(&a, '\t'));
    assert_false(csd_json_accept_byte(&a, '\n'));
    assert_true(csd_json_accept_byte(&a, '{'));
    assert_true(csd_json_accept_byte(&a, ' '));
    assert_false(csd_json_accept_byte(&a, ' '));
    assert_false(csd_json_accept_byte(&a, '\n'));
    assert_false(csd_json_accept_byte(&a, '\r'));
    assert_true(csd_json_accept_byte(&a, '}'));
    csd_json_accept_init(&a);
    assert_true(csd_json_accept_byte(&a, '{'));
    assert_int_equal(feed(&a, "\"n\":1"), 5);
    for (int i = 1; i < CSD_JSON_MAX_NUMBER; i++) assert_true(csd_json_accept_byte(&a, '7'));
    assert_false(csd_json_accept_byte(&a, '7'));         /* a complete number at the cap ends */
    assert_false(csd_json_accept_byte(&a, '.'));
    assert_true(csd_json_accept_byte(&a, '}'));
    assert_true(csd_json_accept_done(&a));
    csd_json_accept_init(&a); /* an incomplete number at the cap may still complete */
    assert_int_equal(feed(&a, "{\"n\":-1"), 7);
    for (int i = 2; i < CSD_JSON_MAX_NUMBER - 1; i++) assert_true(csd_json_accept_byte(&a, '0'));
    assert_true(csd_json_accept_byte(&a, '.')); /* the cap's byte: "-1000...0." */
    assert_true(csd_json_accept_byte(&a, '5'));
    assert_false(csd_json_accept_byte(&a, '5'));
    assert_true(csd_json_accept_byte(&a, '}'));
}

static void test_bytes_all_or_none(void **state) {
    (void)state;
    csd_json_accept a;
    csd_json_accept_init(&a);
    assert_true(csd_json_accept_bytes(&a, (const uint8_t *)"{\"k", 3));
    csd_json_accept before = a;
    assert_false(csd_json_accept_bytes(&a, (const uint8_t *)"\":x", 3)); /* x is refused */
    assert_memory_equal(&a, &before, sizeof a);
    assert_true(csd_json_accept_bytes(&a, (const uint8_t *)"\":1}", 4));
    assert_true(csd_json_accept_done(&a));
}

/* A tiny vocabulary: token i is pieces[i]; the empty one stands for a special token. */
static const char *const pieces[] = {
    "{", "}", "\"", "ab", "\":", " ", "1", "", "x", "{\"", "}}",
    /* beyond the sets checked by hand: tokens the mask's shortcuts must not misjudge */
    "\":\"\",\"",      /* leaves a key and enters the next one: not plain text */
    "caf\xc3\xa9", "\xc3", "\xa9", "\\n", "\\ud83d", "\\ude00", "\n  ", "\t", "-0.5e+1", "true",
};
#define N_PIECES ((int32_t)(sizeof pieces / sizeof *pieces))

static int piece_bytes(void *ctx, int32_t id, uint8_t *out, size_t cap, size_t *len) {
    (void)ctx;
    *len = strlen(pieces[id]);
    if (*len > cap) return CSD_EFULL;
    memcpy(out, pieces[id], *len);
    return 0;
}

/* The ids the mask leaves after the text so far, as a bit set. */
static uint32_t allowed_after(const csd_vocab_bytes *v, const char *text) {
    csd_json_accept a;
    csd_json_accept_init(&a);
    assert_int_equal(feed(&a, text), strlen(text));
    float logits[N_PIECES + 2]; /* the model's vocabulary may be larger than the tokenizer's */
    for (int i = 0; i < N_PIECES + 2; i++) logits[i] = (float)i;
    int32_t n = csd_json_mask(&a, v, logits, N_PIECES + 2);
    uint32_t set = 0;
    for (int i = 0; i < N_PIECES + 2; i++) {
        csd_json_accept trial = a; /* the mask's shortcuts agree with the acceptor itself */
        bool fits = csd_json_accept_token(&trial, v, i);
        if (fits != (logits[i] != -INFINITY))
            fail_msg("after '%s', token %d ('%s'): acceptor %d, mask %d", text, i,
                     i < N_PIECES ? pieces[i] : "", fits, !fits);
        if (fits) set |= 1u << i;
    }
    assert_int_equal(n, __builtin_popcount(set));
    return set & 0x7FF; /* the first 11 pieces, checked by hand */
}

#define BIT(i) (1u << (i))

static void test_mask(void **state) {
    (void)state;
    csd_vocab_bytes *v = NULL;
    csd_err err = {0};
    assert_int_equal(csd_vocab_bytes_create(&v, N_PIECES, piece_bytes, NULL, &err), 0);
    assert_int_equal(allowed_after(v, ""), BIT(0) | BIT(5) | BIT(9));
    /* "\":" starts a key (the colon is its text); "}}" closes one object too many */
    assert_int_equal(allowed_after(v, "{"), BIT(1) | BIT(2) | BIT(4) | BIT(5));
    /* inside a key every printable piece is text; "{\"" too */
    assert_int_equal(allowed_after(v, "{\"k"),
                     BIT(0) | BIT(1) | BIT(2) | BIT(3) | BIT(4) | BIT(5) | BIT(6) | BIT(8) |
                         BIT(9) | BIT(10));
    assert_int_equal(allowed_after(v, "{\"k\":"),
                     BIT(0) | BIT(2) | BIT(4) | BIT(5) | BIT(6) | BIT(9));
    assert_int_equal(allowed_after(v, "{\"k\":{\"a\":1"), BIT(1) | BIT(5) | BIT(6) | BIT(10));
    assert_int_equal(allowed_after(v, "{}"), 0); /* done: nothing, not even the special token */
    /* every prefix of a varied object: the mask equals the acceptor, token by token */
    static const char obj[] = "{\"k\u00e9\": [\"caf\xc3\xa9 \\ud83d\\ude00\", -0.5e+1, true],\n  "
                              "\"n\": {\"\": null}, \"s\": \"a\\\"b\"}";
    for (size_t k = 0; k < sizeof obj - 1; k++) {
        char prefix[sizeof obj];
        memcpy(prefix, obj, k);
        prefix[k] = '\0';
        allowed_after(v, prefix);
    }
    csd_json_accept a;
    csd_json_accept_init(&a);
    assert_true(csd_json_accept_token(&a, v, 9));  /* {" */
    assert_false(csd_json_accept_token(&a, v, 7)); /* a special token has no bytes */
    assert_false(csd_json_accept_token(&a, v, N_PIECES));
    csd_vocab_bytes_destroy(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_objects),
        cmocka_unit_test(test_refused_at_first_wrong_byte),
        cmocka_unit_test(test_limits_without_dead_ends),
        cmocka_unit_test(test_bytes_all_or_none),
        cmocka_unit_test(test_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
