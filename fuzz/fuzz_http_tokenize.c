/* fuzz_http_tokenize: libFuzzer target for the bodies of POST /tokenize and /detokenize, with the
 * real stories260K tokenizer (directory from $CSD_FUZZ_TOK_DIR, default
 * ../shared/models/stories260K). The first byte picks the endpoint. Checks: every body gets either
 * a JSON answer or a 4xx/5xx error with a message; an answer is valid JSON; a /tokenize answer's
 * count matches its list and every id is in the vocabulary. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_tok_load.h"
#include "http/tokenize_api.h"

static csd_tok *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tok = fuzz_tok_load("fuzz_http_tokenize");
    return 0;
}

static void check_tokens(const json_t *root) {
    const json_t *list = json_object_get(root, "tokens");
    if (!json_is_array(list)) __builtin_trap();
    if ((size_t)json_integer_value(json_object_get(root, "count")) != json_array_size(list))
        __builtin_trap();
    size_t i;
    const json_t *t;
    json_array_foreach(list, i, t) {
        const json_t *id = json_is_object(t) ? json_object_get(t, "id") : t;
        json_int_t v = json_integer_value(id);
        if (!json_is_integer(id) || v < 0 || v >= csd_tok_vocab_size(tok)) __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    bool detok = data[0] & 1;
    const char *body = (const char *)data + 1;
    csd_http_error e = {0};
    char *out = detok ? csd_http_detokenize(tok, body, size - 1, &e)
                      : csd_http_tokenize(tok, body, size - 1, 512, &e);
    if (!out) {
        if (e.status < 400 || e.status > 599 || !e.message[0]) __builtin_trap();
        return 0;
    }
    json_t *root = json_loads(out, 0, NULL);
    if (!root) __builtin_trap();
    if (!detok) check_tokens(root);
    else if (!json_is_string(json_object_get(root, "content"))) __builtin_trap();
    json_decref(root);
    free(out);
    return 0;
}
