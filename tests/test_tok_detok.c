/* test_tok_detok: the streaming detokenizer: a character split over several byte tokens is held
 * back until complete, invalid bytes become U+FFFD where the whole-sequence decoder puts them,
 * every chunk is valid UTF-8, and the concatenated chunks equal csd_tok_decode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "core/alloc.h"
#include "test_util.h"
#include "tok/tokenizer.h"

#define LLAMA3_DIR CSD_SHARED_DIR "/tokenizers/llama3"

static csd_tok *load(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CSD_REQUIRE_FILE(path);
    csd_tok *tok = NULL;
    csd_err err = {0};
    assert_int_equal(csd_tok_load(&tok, dir, &err), 0);
    return tok;
}

/* A strict UTF-8 check (no surrogates, no overlongs, nothing above U+10FFFF). */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80                   ? 1
                   : (c >= 0xC2 && c <= 0xDF) ? 2
                   : (c >= 0xE0 && c <= 0xEF) ? 3
                   : (c >= 0xF0 && c <= 0xF4) ? 4
                                              : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return false;
        if (c == 0xE0 && s[i + 1] < 0xA0) return false;
        if (c == 0xED && s[i + 1] > 0x9F) return false;
        if (c == 0xF0 && s[i + 1] < 0x90) return false;
        if (c == 0xF4 && s[i + 1] > 0x8F) return false;
        i += k;
    }
    return true;
}

/* Streams ids, checking every chunk, and compares the concatenation with csd_tok_decode. */
static void stream_equals_decode(const csd_tok *tok, const int32_t *ids, size_t n, bool skip) {
    csd_detok d;
    csd_detok_init(&d, tok, skip);
    char all[8192], chunk[256];
    size_t len = 0, got = 0;
    for (size_t i = 0; i <= n; i++) {
        int rc = i < n ? csd_detok_push(&d, ids[i], chunk, sizeof chunk, &got)
                       : csd_detok_flush(&d, chunk, sizeof chunk, &got);
        assert_int_equal(rc, 0);
        assert_true(valid_utf8((const unsigned char *)chunk, got));
        assert_true(len + got < sizeof all);
        memcpy(all + len, chunk, got);
        len += got;
    }
    char *whole = NULL;
    assert_int_equal(csd_tok_decode(tok, ids, n, skip, &whole, NULL), 0);
    assert_int_equal(strlen(whole), len);
    assert_memory_equal(whole, all, len);
    csd_free(whole);
}

static void byte_fallback_split_character(void **state) {
    (void)state;
    csd_tok *tok = load(CSD_STORIES_DIR);
    /* U+1F600 is not in the 512-token vocabulary: it encodes as <0xF0><0x9F><0x98><0x80> */
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(csd_tok_encode(tok, "\xF0\x9F\x98\x80", 4, false, true, &ids, &n, NULL), 0);
    assert_int_equal(n, 5); /* "▁" then the four byte tokens */
    csd_detok d;
    csd_detok_init(&d, tok, false);
    char out[64];
    size_t got;
    assert_int_equal(csd_detok_push(&d, ids[0], out, sizeof out, &got), 0);
    assert_int_equal(got, 0); /* the leading space is stripped */
    for (size_t i = 1; i < 4; i++) {
        assert_int_equal(csd_detok_push(&d, ids[i], out, sizeof out, &got), 0);
        assert_int_equal(got, 0); /* held back: the character is not complete */
    }
    assert_int_equal(csd_detok_push(&d, ids[4], out, sizeof out, &got), 0);
    assert_int_equal(got, 4);
    assert_memory_equal(out, "\xF0\x9F\x98\x80", 4);
    assert_int_equal(d.carried, 0); /* completed, not broken: the whole character is this id's */
    stream_equals_decode(tok, ids, n, false);
    /* an unfinished character followed by a word: U+FFFD, then the word */
    int32_t broken[] = {ids[1], ids[2], 403};
    csd_detok_init(&d, tok, false);
    char all[64];
    size_t len = 0;
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(csd_detok_push(&d, broken[i], out, sizeof out, &got), 0);
        memcpy(all + len, out, got);
        len += got;
    }
    assert_int_equal(len, 3 + 5);
    assert_memory_equal(all, "\xEF\xBF\xBD Once", 8);
    assert_int_equal(d.carried, 3); /* the U+FFFD is the byte tokens' text, " Once" the word's */
    /* broken by a byte token: U+FFFD then "A", the U+FFFD still the earlier token's */
    int32_t byte_a = ids[1] - 0xF0 + 'A'; /* <0x00>..<0xFF> are consecutive ids */
    assert_string_equal(csd_tok_piece(tok, byte_a), "<0x41>");
    csd_detok_init(&d, tok, false);
    assert_int_equal(csd_detok_push(&d, ids[1], out, sizeof out, &got), 0);
    assert_int_equal(csd_detok_push(&d, byte_a, out, sizeof out, &got), 0);
    assert_int_equal(got, 4);
    assert_memory_equal(out, "\xEF\xBF\xBD" "A", 4);
    assert_int_equal(d.carried, 3);
    assert_int_equal(csd_detok_push(&d, byte_a, out, sizeof out, &got), 0);
    assert_int_equal(d.carried, 0); /* nothing was held */
    stream_equals_decode(tok, broken, 3, false);
    /* flush of a dangling prefix gives one U+FFFD */
    csd_detok_init(&d, tok, false);
    assert_int_equal(csd_detok_push(&d, ids[1], out, sizeof out, &got), 0);
    assert_int_equal(csd_detok_flush(&d, out, sizeof out, &got), 0);
    assert_int_equal(got, 3);
    assert_memory_equal(out, "\xEF\xBF\xBD", 3);
    csd_free(ids);
    csd_tok_destroy(tok);
}

static void full_buffer_keeps_state(void **state) {
    (void)state;
    csd_tok *tok = load(CSD_STORIES_DIR);
    csd_detok d;
    csd_detok_init(&d, tok, false);
    char small[3], out[64];
    size_t got;
    assert_int_equal(csd_detok_push(&d, 1, out, sizeof out, &got), 0); /* "<s>" */
    assert_int_equal(csd_detok_push(&d, 403, small, sizeof small, &got), CSD_EFULL);
    assert_int_equal(csd_detok_push(&d, 403, out, sizeof out, &got), 0); /* retry succeeds */
    assert_string_equal(out, " Once");
    assert_int_equal(csd_detok_push(&d, 100000, out, sizeof out, &got), CSD_ERANGE);
    csd_tok_destroy(tok);
}

static void byte_level_stream(void **state) {
    (void)state;
    csd_tok *tok = load(LLAMA3_DIR);
    const char *texts[] = {
        ("\xE4\xBD\xA0\xE5\xA5\xBD\xF0\x9F\x98\x80 caf\xC3\xA9 "
         "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9"),
        "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4<|eot_id|>\xE6\x97\xA5\xE6\x9C\xAC",
        "plain ascii, numbers 12345 and    spaces\n\ttabs",
    };
    for (size_t t = 0; t < 3; t++) {
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(
            csd_tok_encode(tok, texts[t], strlen(texts[t]), true, true, &ids, &n, NULL), 0);
        stream_equals_decode(tok, ids, n, false);
        stream_equals_decode(tok, ids, n, true);
        char *back = NULL;
        assert_int_equal(csd_tok_decode(tok, ids, n, false, &back, NULL), 0);
        assert_string_equal(back, texts[t]);
        csd_free(back);
        csd_free(ids);
    }
    /* any id sequence at all: chunks stay valid UTF-8 and agree with the whole decode */
    uint32_t seed = 7;
    int32_t ids[64];
    for (int round = 0; round < 300; round++) {
        for (size_t i = 0; i < 64; i++) {
            seed = seed * 1664525u + 1013904223u;
            ids[i] = (int32_t)((seed >> 8) % (uint32_t)csd_tok_vocab_size(tok));
            const char *piece = csd_tok_piece(tok, ids[i]);
            if (!piece || strstr(piece, "\xC4\x80")) i--; /* U+0100 is byte 0: NUL breaks strlen */
        }
        stream_equals_decode(tok, ids, 64, round % 2);
    }
    csd_tok_destroy(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(byte_fallback_split_character),
        cmocka_unit_test(full_buffer_keeps_state),
        cmocka_unit_test(byte_level_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
