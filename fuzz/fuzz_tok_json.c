/* fuzz_tok_json: libFuzzer target over csd_tok_load_mem. The input is tokenizer.json, optionally
 * followed by a 0x01 byte and a tokenizer_config.json. When it loads, a fixed text is encoded and
 * decoded (whole and streamed) so whatever the loader accepted is exercised too. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "tok/tokenizer.h"

static const char sample[] =
    "Hello w\xC3\xB6rld <s> <|eot_id|> 12345 \xE4\xBD\xA0\xE5\xA5\xBD\xF0\x9F\x98\x80 "
    "e\xCC\x81  \t\n\xFF end";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data;
    size_t json_len = size;
    const char *cfg = NULL;
    size_t cfg_len = 0;
    const uint8_t *sep = memchr(data, 0x01, size);
    if (sep) {
        json_len = (size_t)(sep - data);
        cfg = (const char *)sep + 1;
        cfg_len = size - json_len - 1;
    }
    csd_tok *tok = NULL;
    csd_err err = {0};
    if (csd_tok_load_mem(&tok, json, json_len, cfg, cfg_len, &err) != 0) {
        if (tok != NULL || err.msg[0] == '\0')
            __builtin_trap(); /* failure must be clean and explained */
        return 0;
    }
    for (int parse = 0; parse < 2; parse++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (csd_tok_encode(tok, sample, sizeof sample - 1, true, parse, &ids, &n, &err) != 0)
            continue;
        char *text = NULL;
        if (csd_tok_decode(tok, ids, n, parse, &text, &err) == 0) {
            csd_detok d;
            csd_detok_init(&d, tok, parse);
            char out[4096];
            size_t got, total = 0;
            for (size_t i = 0; i < n; i++)
                if (csd_detok_push(&d, ids[i], out, sizeof out, &got) == 0) total += got;
            if (csd_detok_flush(&d, out, sizeof out, &got) == 0) total += got;
            if (total < strlen(text)) __builtin_trap(); /* streaming lost text */
            csd_free(text);
        }
        csd_free(ids);
    }
    (void)csd_tok_vocab_size(tok);
    (void)csd_tok_piece(tok, 0);
    csd_tok_destroy(tok);
    return 0;
}
