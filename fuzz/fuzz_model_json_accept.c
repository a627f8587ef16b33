/* fuzz_model_json_accept: libFuzzer target for the JSON object acceptor of response_format
 * json_object (model/json_accept.h), checked against jansson. Feeds the input byte by byte up to
 * the first refused byte; the accepted prefix must be what jansson parses as one object exactly
 * when the acceptor says it is done (jansson's own limits on numbers aside), a refused byte must
 * leave the state unchanged, and an unfinished object always has a byte that continues it. Run it
 * with `scripts/fuzz SECONDS model_json_accept`. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/json_accept.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* jansson refuses numbers beyond its integer and double ranges, which JSON itself allows. */
static bool beyond_jansson(const json_error_t *e) {
    return strstr(e->text, "too big") != NULL || strstr(e->text, "overflow") != NULL;
}

/* Some byte continues a (an unfinished object must never be stuck). */
static bool can_go_on(const csd_json_accept *a) {
    for (int b = 0; b < 256; b++) {
        csd_json_accept trial = *a;
        if (csd_json_accept_byte(&trial, (uint8_t)b)) return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 14) return 0;
    csd_json_accept a;
    csd_json_accept_init(&a);
    size_t n = 0;
    while (n < size) {
        csd_json_accept before = a;
        if (!csd_json_accept_byte(&a, data[n])) {
            if (memcmp(&a, &before, sizeof a) != 0) abort(); /* a refusal changed the state */
            break;
        }
        n++;
        if (!csd_json_accept_done(&a) && !can_go_on(&a)) abort(); /* a dead end */
    }
    json_error_t e;
    json_t *v = json_loadb((const char *)data, n, JSON_ALLOW_NUL, &e);
    bool parsed = v != NULL && json_is_object(v);
    json_decref(v);
    if (csd_json_accept_done(&a) && !parsed && !beyond_jansson(&e)) abort();
    if (!csd_json_accept_done(&a) && parsed) abort();
    return 0;
}
