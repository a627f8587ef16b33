/* fuzz_model_json_schema: libFuzzer target for response_format json_schema (model/json_schema.h and
 * the acceptor's schema part). The input is a schema's JSON text, a NUL, then choices: the schema
 * is compiled (refusals are fine, crashes are not); when it compiles, each choice byte picks one of
 * the bytes the acceptor allows next. A state that is not done must always allow some byte, a
 * refused byte must leave the state unchanged, and a finished answer must parse and be valid
 * against the schema by an independent check (tests/json_schema_check.h). Run it with `scripts/fuzz
 * SECONDS model_json_schema`. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/json_schema_check.h"
#include "model/json_accept.h"
#include "model/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every byte a may take next, into out; returns their count. */
static int allowed_bytes(const csd_json_accept *a, uint8_t out[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        csd_json_accept t = *a;
        if (csd_json_accept_byte(&t, (uint8_t)b)) out[k++] = (uint8_t)b;
        else if (memcmp(&t, a, sizeof t) != 0) abort(); /* a refusal changed the state */
    }
    return k;
}

/* The answer the choices pick, or NULL when they run out first. */
static char *walk(const csd_json_schema *s, const uint8_t *choice, size_t n) {
    csd_json_accept a;
    csd_json_accept_init_schema(&a, s);
    char *text = malloc(n + 1);
    if (!text) return NULL;
    size_t len = 0;
    for (size_t i = 0; i < n && !csd_json_accept_done(&a); i++) {
        uint8_t allowed[256];
        int k = allowed_bytes(&a, allowed);
        if (k == 0) abort(); /* a dead end */
        uint8_t b = allowed[choice[i] % k];
        if (!csd_json_accept_byte(&a, b)) abort();
        text[len++] = (char)b;
    }
    text[len] = '\0';
    if (csd_json_accept_done(&a)) return text;
    free(text);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 14) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t schema_len = nul ? (size_t)(nul - data) : size;
    json_t *raw = json_loadb((const char *)data, schema_len, 0, NULL);
    if (!raw) return 0;
    csd_err err = {0};
    csd_json_schema *s = NULL;
    if (csd_json_schema_compile(&s, raw, &err) == 0) {
        size_t n_choices = nul ? size - schema_len - 1 : 0;
        char *text = walk(s, data + size - n_choices, n_choices);
        if (text) {
            json_error_t je;
            json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            bool too_big = !v && (strstr(je.text, "too big") || strstr(je.text, "overflow"));
            if (!v && !too_big) abort(); /* the answer does not parse */
            if (v && !schema_check_root(raw, v)) abort(); /* not valid against its schema */
            json_decref(v);
            free(text);
        }
        csd_json_schema_destroy(s);
    }
    json_decref(raw);
    return 0;
}
