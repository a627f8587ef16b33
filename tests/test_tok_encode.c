/* test_tok_encode: encoding with the real tokenizers of ../shared (stories260K, llama3, qwen3):
 * golden ids from the reference (npm @huggingface/tokenizers), BOS rules, special-token parsing,
 * NFC, invalid UTF-8, and the speed of a 100 KB encode (printed; only a generous bound asserted).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "test_util.h"
#include "tok/tokenizer.h"

#define LLAMA3_DIR CSD_SHARED_DIR "/tokenizers/llama3"
#define QWEN3_DIR CSD_SHARED_DIR "/tokenizers/qwen3"

static csd_tok *load(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CSD_REQUIRE_FILE(path);
    csd_err err = {0};
    csd_tok *tok = NULL;
    int rc = csd_tok_load(&tok, dir, &err);
    if (rc) printf("load %s: %s\n", dir, err.msg);
    assert_int_equal(rc, 0);
    return tok;
}

/* Encodes s and compares with want[0..n). */
static void expect_ids(const csd_tok *tok, const char *s, size_t len, bool add_special,
                       bool parse_special, const int32_t *want, size_t n) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    csd_err err = {0};
    assert_int_equal(csd_tok_encode(tok, s, len, add_special, parse_special, &ids, &n_ids, &err),
                     0);
    if (n_ids != n) {
        printf("'%s': got %zu ids:", s, n_ids);
        for (size_t i = 0; i < n_ids; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    assert_int_equal(n_ids, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    csd_free(ids);
}

#define EXPECT(tok, s, add, parse, ...)                                                   \
    do {                                                                                  \
        const int32_t want_[] = {__VA_ARGS__};                                            \
        expect_ids(tok, s, strlen(s), add, parse, want_, sizeof want_ / sizeof want_[0]); \
    } while (0)

static void stories_once_upon_a_time(void **state) {
    (void)state;
    csd_tok *tok = load(CSD_STORIES_DIR);
    EXPECT(tok, "Once upon a time", true, true, 1, 403, 407, 261, 378);
    EXPECT(tok, "Once upon a time", false, true, 403, 407, 261, 378);
    assert_int_equal(csd_tok_bos(tok), 1);
    assert_int_equal(csd_tok_eos(tok), 2);
    assert_true(csd_tok_is_eog(tok, 2));
    assert_false(csd_tok_is_eog(tok, 403));
    assert_string_equal(csd_tok_piece(tok, 403), "\xE2\x96\x81Once");
    assert_int_equal(csd_tok_find(tok, "\xE2\x96\x81upon"), 407);
    assert_string_equal(csd_tok_bos_text(tok), "<s>");
    assert_int_equal(csd_tok_vocab_size(tok), 512);
    char *text = NULL;
    const int32_t ids[] = {1, 403, 407, 261, 378};
    assert_int_equal(csd_tok_decode(tok, ids, 5, true, &text, NULL), 0);
    assert_string_equal(text, "Once upon a time");
    csd_free(text);
    assert_int_equal(csd_tok_decode(tok, ids, 5, false, &text, NULL), 0);
    assert_string_equal(text, "<s> Once upon a time");
    csd_free(text);
    csd_tok_destroy(tok);
}

static void llama3_golden(void **state) {
    (void)state;
    csd_tok *tok = load(LLAMA3_DIR);
    /* ids from the reference; its ByteLevel post-processor adds no BOS (docs/tokenizer.md) */
    EXPECT(tok, "Hello world<|eot_id|>", true, true, 9906, 1917, 128009);
    EXPECT(tok, "Hello world<|im_end|>", true, true, 9906, 1917, 27, 91, 318, 6345, 91, 29);
    EXPECT(tok, "I'LL don't 12345", true, true, 40, 6, 4178, 1541, 956, 220, 4513, 1774);
    EXPECT(tok, "\xE4\xBD\xA0\xE5\xA5\xBD\xF0\x9F\x98\x80", true, true, 57668, 53901, 76460, 222);
    EXPECT(tok, "caf\xC3\xA9", true, true, 936, 59958);        /* precomposed */
    EXPECT(tok, "cafe\xCC\x81", true, true, 936, 1897, 54939); /* no normalizer: stays decomposed */
    /* parse_special off: the special string is plain text */
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(csd_tok_encode(tok, "<|eot_id|>", 10, false, false, &ids, &n, NULL), 0);
    assert_true(n > 1);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 128009);
    csd_free(ids);
    assert_int_equal(csd_tok_eos(tok), 128001);
    assert_true(csd_tok_is_eog(tok, 128009));
    assert_true(csd_tok_is_eog(tok, 128001));
    assert_true(csd_tok_is_special(tok, 128000));
    assert_string_equal(csd_tok_bos_text(tok), "<|begin_of_text|>");
    assert_non_null(csd_tok_chat_template(tok));
    assert_non_null(strstr(csd_tok_chat_template(tok), "start_header_id"));
    csd_tok_destroy(tok);
}

static void qwen3_nfc_and_specials(void **state) {
    (void)state;
    csd_tok *tok = load(QWEN3_DIR);
    EXPECT(tok, "Hello world<|im_end|>", true, true, 9707, 1879, 151645);
    EXPECT(tok, "caf\xC3\xA9", true, true, 924, 58858);
    EXPECT(tok, "cafe\xCC\x81", true, true, 924, 58858); /* NFC composes e + U+0301 */
    EXPECT(tok, "I'LL don't 12345", true, true, 40, 6, 4086, 1513, 944, 220, 16, 17, 18, 19, 20);
    EXPECT(tok, "\xE4\xBD\xA0\xE5\xA5\xBD\xF0\x9F\x98\x80", true, true, 108386, 141334);
    assert_int_equal(csd_tok_bos(tok), -1);
    assert_int_equal(csd_tok_eos(tok), 151645);
    assert_true(csd_tok_is_eog(tok, 151643));      /* <|endoftext|> */
    /* "</s>" is an ordinary piece here, not Llama 2's end of sequence: text, not an end */
    int32_t plain_eos = csd_tok_find(tok, "</s>");
    assert_true(plain_eos > 0 && !csd_tok_is_special(tok, plain_eos));
    assert_false(csd_tok_is_eog(tok, plain_eos));
    assert_false(csd_tok_is_special(tok, 151667)); /* <think> is added but not special */
    /* non-special added tokens are still split out when special parsing is off */
    const int32_t think = 151667;
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(csd_tok_encode(tok, "<think><|im_end|>", 17, false, false, &ids, &n, NULL), 0);
    assert_true(n > 2);
    assert_int_equal(ids[0], think);
    for (size_t i = 1; i < n; i++) assert_int_not_equal(ids[i], 151645);
    csd_free(ids);
    csd_tok_destroy(tok);
}

static void invalid_utf8_is_replacement(void **state) {
    (void)state;
    csd_tok *tok = load(CSD_STORIES_DIR);
    /* "\xFF" and a truncated 3-byte sequence both read as one U+FFFD, i.e. its 3 fallback bytes */
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    assert_int_equal(csd_tok_encode(tok, "x\xFFy", 3, false, true, &a, &na, NULL), 0);
    assert_int_equal(csd_tok_encode(tok, "x\xEF\xBF\xBDy", 5, false, true, &b, &nb, NULL), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    csd_free(a);
    csd_free(b);
    assert_int_equal(csd_tok_encode(tok, "x\xE2\x82y", 4, false, true, &a, &na, NULL), 0);
    assert_int_equal(na, nb);
    csd_free(a);
    /* every byte value, every length: must not fail */
    char buf[512];
    uint32_t seed = 12345;
    for (int round = 0; round < 200; round++) {
        size_t len = (size_t)round * 2 + 1;
        for (size_t i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            buf[i] = (char)(seed >> 16);
        }
        assert_int_equal(csd_tok_encode(tok, buf, len, true, true, &a, &na, NULL), 0);
        assert_true(na >= 1);
        char *text = NULL;
        assert_int_equal(csd_tok_decode(tok, a, na, true, &text, NULL), 0);
        csd_free(text);
        csd_free(a);
    }
    csd_tok_destroy(tok);
}

/* 100 KB of mixed text: prints the time; asserts only a generous bound (machines are noisy). */
static void encode_100k_speed(void **state) {
    (void)state;
    const char *dirs[] = {LLAMA3_DIR, QWEN3_DIR, CSD_STORIES_DIR};
    const char *chunk =
        "The quick brown fox jumps over the lazy dog; it's 2026-11-22 and "
        "\xE4\xBD\xA0\xE5\xA5\xBD, caf\xC3\xA9 \xF0\x9F\x98\x80\n    if (x) { y += 42; }\n";
    size_t cl = strlen(chunk), n = 0, cap = 100 * 1024;
    char *text = csd_alloc(cap + 1);
    assert_non_null(text);
    while (n + cl <= cap) {
        memcpy(text + n, chunk, cl);
        n += cl;
    }
    for (size_t d = 0; d < 3; d++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tokenizer.json", dirs[d]);
        struct stat st;
        if (stat(path, &st) != 0) {
            printf("SKIP speed for %s: absent\n", dirs[d]);
            continue;
        }
        csd_tok *tok = load(dirs[d]);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        double t0 = csd_now_s();
        assert_int_equal(csd_tok_encode(tok, text, n, false, true, &ids, &n_ids, NULL), 0);
        double dt = csd_now_s() - t0;
        printf("encode %zu bytes with %s: %zu ids in %.1f ms (%.1f MB/s)\n", n, dirs[d], n_ids,
               dt * 1e3, (double)n / dt / 1e6);
        assert_true(dt < 5.0);
        assert_true(n_ids > n / 10);
        char *back = NULL;
        assert_int_equal(csd_tok_decode(tok, ids, n_ids, false, &back, NULL), 0);
        assert_int_equal(strlen(back), n);
        assert_memory_equal(back, text, n);
        csd_free(back);
        csd_free(ids);
        /* one 100 KB word: the merge loop must not be quadratic */
        memset(text, 'a', n);
        t0 = csd_now_s();
        assert_int_equal(csd_tok_encode(tok, text, n, false, true, &ids, &n_ids, NULL), 0);
        dt = csd_now_s() - t0;
        printf("encode one %zu-byte word: %zu ids in %.1f ms\n", n, n_ids, dt * 1e3);
        assert_true(dt < 5.0);
        csd_free(ids);
        n = 0;
        while (n + cl <= cap) {
            memcpy(text + n, chunk, cl);
            n += cl;
        }
        csd_tok_destroy(tok);
    }
    csd_free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stories_once_upon_a_time), cmocka_unit_test(llama3_golden),
        cmocka_unit_test(qwen3_nfc_and_specials),   cmocka_unit_test(invalid_utf8_is_replacement),
        cmocka_unit_test(encode_100k_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
