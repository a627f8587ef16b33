/* fuzz_tok_encode: libFuzzer target encoding arbitrary bytes with the real stories260K tokenizer
 * (directory from $CSD_FUZZ_TOK_DIR, default ../shared/models/stories260K). Checks that encoding
 * never fails, every id is in range, and streamed decoding equals whole decoding (up to the first
 * NUL, where csd_tok_decode's C string ends). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "fuzz_tok_load.h"

static csd_tok *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tok = fuzz_tok_load("fuzz_tok_encode");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int32_t *ids = NULL;
    size_t n = 0;
    bool parse = size > 0 && (data[0] & 1);
    if (csd_tok_encode(tok, (const char *)data, size, true, parse, &ids, &n, NULL) != 0)
        __builtin_trap();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= csd_tok_vocab_size(tok)) __builtin_trap();
    char *text = NULL;
    if (csd_tok_decode(tok, ids, n, false, &text, NULL) != 0) __builtin_trap();
    /* stream into one buffer; csd_tok_decode's text ends at its first NUL, so compare up to there
     */
    csd_detok d;
    csd_detok_init(&d, tok, false);
    size_t cap = size * 4 + 64, pos = 0;
    char *all = csd_alloc(cap + 256);
    if (!all) return 0;
    for (size_t i = 0; i <= n; i++) {
        size_t got = 0;
        int rc = i < n ? csd_detok_push(&d, ids[i], all + pos, cap + 256 - pos, &got)
                       : csd_detok_flush(&d, all + pos, cap + 256 - pos, &got);
        if (rc != 0) __builtin_trap();
        pos += got;
        if (pos > cap) __builtin_trap(); /* more text than 4 bytes per input byte */
    }
    size_t len = strlen(text);
    if (strnlen(all, pos) != len || memcmp(all, text, len) != 0) __builtin_trap();
    csd_free(all);
    csd_free(text);
    csd_free(ids);
    return 0;
}
