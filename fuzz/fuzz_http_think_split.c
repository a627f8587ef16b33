/* fuzz_http_think_split: libFuzzer target for the thinking splitter (http/think_split.h), which
 * reads model output. The first byte picks open mode and a piece size; the rest is the answer,
 * pushed in pieces of that size. Checks: no error; the same reasoning and content as the answer
 * pushed at once; never more bytes out than in; and an answer that does not start with <think>
 * (after whitespace) comes out as content, byte for byte. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/think_split.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct result {
    char *text[2];
    size_t len[2];
} result;

static void take(result *r, size_t cap, const char *rs, size_t rn, const char *cs, size_t cn) {
    if (r->len[0] + rn + r->len[1] + cn > cap) __builtin_trap();
    memcpy(r->text[0] + r->len[0], rs, rn);
    r->len[0] += rn;
    memcpy(r->text[1] + r->len[1], cs, cn);
    r->len[1] += cn;
}

static void run(const char *text, size_t len, bool open, size_t piece, result *r) {
    r->text[0] = malloc(len + 1);
    r->text[1] = malloc(len + 1);
    r->len[0] = r->len[1] = 0;
    csd_think_split s;
    csd_think_split_init(&s, open);
    const char *rs, *cs;
    size_t rn, cn;
    for (size_t at = 0; at < len; at += piece) {
        size_t step = len - at < piece ? len - at : piece;
        if (csd_think_split_push(&s, text + at, step, &rs, &rn, &cs, &cn)) __builtin_trap();
        take(r, len, rs, rn, cs, cn);
    }
    if (csd_think_split_finish(&s, &rs, &rn, &cs, &cn)) __builtin_trap();
    take(r, len, rs, rn, cs, cn);
    csd_think_split_fini(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    bool open = data[0] & 1;
    size_t piece = 1 + (data[0] >> 1);
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    result a, b;
    run(text, len, open, len ? len : 1, &a);
    run(text, len, open, piece, &b);
    for (int k = 0; k < 2; k++)
        if (a.len[k] != b.len[k] || memcmp(a.text[k], b.text[k], a.len[k])) __builtin_trap();
    size_t ws = 0;
    while (ws < len && strchr(" \n\t\r", text[ws]) && text[ws]) ws++;
    bool thinks = open || (len - ws >= 7 && !memcmp(text + ws, "<think>", 7));
    if (!thinks && (a.len[1] != len || memcmp(a.text[1], text, len))) __builtin_trap();
    for (int k = 0; k < 2; k++) {
        free(a.text[k]);
        free(b.text[k]);
    }
    return 0;
}
