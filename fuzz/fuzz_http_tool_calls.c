/* fuzz_http_tool_calls: libFuzzer target for the tool-call splitter (http/tool_calls.h), which
 * reads model output. The first byte picks the mode (tags, bare, whole, mistral) and a piece size;
 * the rest is the answer, pushed in pieces of that size. Checks: no error; the same content and
 * calls as the answer pushed at once; and an answer in which no call was found comes out whole,
 * byte for byte. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/tool_calls.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct result {
    char *content;
    size_t len;
    csd_tool_split s; /* its calls */
} result;

static void run(const char *text, size_t len, int mode, size_t piece, result *r) {
    r->content = malloc(len + 1);
    r->len = 0;
    csd_tool_split_init(&r->s, mode);
    const char *out;
    size_t n;
    for (size_t at = 0; at < len; at += piece) {
        size_t step = len - at < piece ? len - at : piece;
        if (csd_tool_split_push(&r->s, text + at, step, &out, &n)) __builtin_trap();
        if (r->len + n > len) __builtin_trap(); /* more content than text */
        memcpy(r->content + r->len, out, n);
        r->len += n;
    }
    if (csd_tool_split_finish(&r->s, &out, &n)) __builtin_trap();
    if (r->len + n > len) __builtin_trap();
    memcpy(r->content + r->len, out, n);
    r->len += n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int mode = data[0] % 4; /* enum csd_tool_split_mode */
    size_t piece = 1 + data[0] / 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    result a, b;
    run(text, len, mode, len ? len : 1, &a);
    run(text, len, mode, piece, &b);
    if (a.len != b.len || memcmp(a.content, b.content, a.len)) __builtin_trap();
    if (a.s.n_calls != b.s.n_calls) __builtin_trap();
    for (int i = 0; i < a.s.n_calls; i++)
        if (strcmp(a.s.calls[i].name, b.s.calls[i].name) ||
            strcmp(a.s.calls[i].arguments, b.s.calls[i].arguments))
            __builtin_trap();
    if (a.s.n_calls == 0 && (a.len != len || memcmp(a.content, text, len))) __builtin_trap();
    free(a.content);
    free(b.content);
    csd_tool_split_fini(&a.s);
    csd_tool_split_fini(&b.s);
    return 0;
}
