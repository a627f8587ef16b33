/* fuzz_net_frame: arbitrary bytes through the frame header and every payload decoder.
 * Whatever decodes must re-encode to the same bytes (the codecs are canonical), and activation
 * views must convert without reading past the payload. Never crashes, never leaks (ASan/UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/wire.h"

static void check(int cond) {
    if (!cond) abort(); /* a fuzz finding: libFuzzer reports it */
}

static void payload(int type, const uint8_t *p, size_t n) {
    uint8_t out[CSD_WIRE_ERROR_HDR_SIZE + CSD_WIRE_MAX_ERROR_TEXT];
    size_t len = 0;
    switch (type) {
    case CSD_WIRE_HELLO:
    case CSD_WIRE_HELLO_OK: {
        csd_wire_hello h;
        if (csd_wire_decode_hello(p, n, &h, NULL) == 0) {
            check(csd_wire_encode_hello(out, sizeof out, &h, &len, NULL) == 0);
            check(len == n && memcmp(out, p, n) == 0);
        }
        break;
    }
    case CSD_WIRE_ERROR: {
        csd_wire_error e;
        if (csd_wire_decode_error(p, n, &e, NULL) == 0) {
            check(strlen(e.text) == n - CSD_WIRE_ERROR_HDR_SIZE);
            check(csd_wire_encode_error(out, sizeof out, e.code, e.text, &len, NULL) == 0);
            check(len == n);
        }
        break;
    }
    case CSD_WIRE_OPEN: {
        csd_wire_open o;
        if (csd_wire_decode_open(p, n, &o, NULL) == 0) {
            check(csd_wire_encode_open(out, sizeof out, &o, &len, NULL) == 0);
            check(len == n && memcmp(out, p, n) == 0);
        }
        break;
    }
    case CSD_WIRE_FORWARD:
    case CSD_WIRE_RESULT: {
        csd_wire_act a;
        if (csd_wire_decode_act(p, n, &a, NULL) == 0) {
            check(a.data + a.data_bytes == p + n);
            size_t count = (size_t)a.n_tokens * a.dim;
            if (a.kind == CSD_WIRE_ACT_TOKENS || a.kind == CSD_WIRE_ACT_SAMPLED) {
                uint32_t *ids = malloc(count * sizeof *ids);
                check(csd_wire_act_ids(&a, ids, a.n_tokens, NULL) == 0);
                free(ids);
            } else {
                float *f = malloc(count * sizeof *f);
                check(csd_wire_act_to_f32(&a, f, count, NULL) == 0);
                free(f);
            }
        }
        break;
    }
    case CSD_WIRE_TRUNCATE: {
        uint32_t k;
        if (csd_wire_decode_truncate(p, n, &k, NULL) == 0) {
            check(csd_wire_encode_truncate(out, sizeof out, k, &len, NULL) == 0);
            check(len == n && memcmp(out, p, n) == 0);
        }
        break;
    }
    case CSD_WIRE_STATS_REPLY: {
        csd_wire_stats s;
        if (csd_wire_decode_stats(p, n, &s, NULL) == 0) {
            check(csd_wire_encode_stats(out, sizeof out, &s, &len, NULL) == 0);
            check(len == n && memcmp(out, p, n) == 0);
        }
        break;
    }
    case CSD_WIRE_ROUTE: {
        char addr[CSD_WIRE_MAX_ROUTE + 1];
        if (csd_wire_decode_route(p, n, addr, sizeof addr, NULL) == 0) {
            check(csd_wire_encode_route(out, sizeof out, addr, &len, NULL) == 0);
            check(len == n && memcmp(out, p, n) == 0);
        }
        break;
    }
    case CSD_WIRE_PING:
    case CSD_WIRE_PONG: {
        uint64_t t;
        if (csd_wire_decode_ping(p, n, &t, NULL) == 0) {
            check(csd_wire_encode_ping(out, sizeof out, t, &len, NULL) == 0);
            check(len == n && memcmp(out, p, n) == 0);
        }
        break;
    }
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    csd_err err;
    csd_wire_hdr h;
    if (csd_wire_decode_hdr(data, size, &h, &err) == 0) {
        uint8_t again[CSD_WIRE_HDR_SIZE];
        check(csd_wire_encode_hdr(again, &h, NULL) == 0);
        check(memcmp(again, data, CSD_WIRE_HDR_SIZE) == 0);
        /* As a receiver would: the payload is exactly payload_len bytes (fewer = truncated). */
        size_t rest = size - CSD_WIRE_HDR_SIZE;
        if (rest >= h.payload_len) {
            if (h.type == CSD_WIRE_FORWARD || h.type == CSD_WIRE_RESULT)
                (void)csd_wire_check_act_flags(h.flags, NULL);
            payload(h.type, data + CSD_WIRE_HDR_SIZE, h.payload_len);
        }
    } else {
        check(err.msg[0] != '\0');
    }
    /* Also every payload decoder over the raw input, selected by the first byte. */
    if (size > 0) payload(1 + data[0] % (CSD_WIRE_TYPE_COUNT - 1), data + 1, size - 1);
    return 0;
}
