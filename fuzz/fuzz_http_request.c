/* fuzz_http_request: the OpenAI request parser over arbitrary bodies, as both endpoints. Whatever
 * parses must satisfy the documented bounds; every refusal must carry a status and a message; and
 * the stop-string matcher runs over the parsed stops with the body as text. Any violation traps.
 * Run it with `scripts/fuzz SECONDS http_request`: seeds are fuzz/seeds/http_request/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "http/openai_request.h"
#include "http/stop_text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const csd_http_req *r, const uint8_t *data, size_t size) {
    const csd_sampler_params *sp = &r->sampling;
    if (!(sp->temperature >= 0 && sp->temperature <= 2) || !(sp->top_p > 0 && sp->top_p <= 1) ||
        !(sp->min_p >= 0 && sp->min_p <= 1) || sp->top_k < 0 || r->max_tokens < 0 ||
        r->n_stop < 0 || r->n_stop > CSD_HTTP_MAX_STOP || r->top_logprobs < 0 ||
        r->top_logprobs > CSD_HTTP_MAX_TOP_LOGPROBS || (r->top_logprobs > 0 && !r->logprobs))
        __builtin_trap();
    /* what the parser accepts, the sampler accepts (logit_bias ids inside the vocabulary) */
    if (csd_sampler_params_check(sp, 5000, NULL) != 0) __builtin_trap();
    if (r->kind == CSD_HTTP_KIND_CHAT) {
        if (!json_is_array(r->messages) || json_array_size(r->messages) == 0) __builtin_trap();
    } else if (!r->prompt == !r->prompt_ids) {
        __builtin_trap();
    }
    for (int i = 0; i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= 5000) __builtin_trap();
    /* stop matching over the body's bytes cut into small pieces: never emits more than it got */
    csd_http_stop s;
    csd_http_stop_init(&s, r->stop, r->n_stop);
    size_t in = 0, out = 0;
    for (size_t pos = 0; pos < size;) {
        size_t n = 1 + data[pos] % 7;
        if (n > size - pos) n = size - pos;
        const char *emit;
        size_t len;
        int rc = csd_http_stop_push(&s, (const char *)data + pos, n, &emit, &len);
        in += n;
        out += len;
        pos += n;
        if (rc < 0 || out > in) __builtin_trap();
        if (rc == 1) break;
    }
    csd_http_stop_fini(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int kind = 0; kind < CSD_HTTP_KIND_COUNT; kind++) {
        csd_http_req r;
        csd_http_error e;
        if (csd_http_req_parse(&r, kind, (const char *)data, size, 5000, &e) != 0) {
            if (e.status < 400 || e.status > 599 || e.message[0] == 0) __builtin_trap();
            char *json = csd_http_error_json(&e);
            if (!json) __builtin_trap();
            free(json);
        } else {
            check(&r, data, size);
        }
        csd_http_req_fini(&r);
    }
    return 0;
}
