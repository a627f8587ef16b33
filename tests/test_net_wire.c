/* test_net_wire: every message type round-trips through the codecs, and truncated, corrupt,
 * oversized, wrong-magic/version and payload_len-mismatch inputs are all refused (never crash). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "net/wire.h"

static uint32_t rng_state = 12345u;
static uint32_t rng(void) { /* xorshift32: seeded, non-constant */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void test_hdr_roundtrip_every_type(void **state) {
    (void)state;
    static const uint32_t lens[CSD_WIRE_TYPE_COUNT] = {
        [CSD_WIRE_HELLO] = CSD_WIRE_HELLO_SIZE,  [CSD_WIRE_HELLO_OK] = CSD_WIRE_HELLO_SIZE,
        [CSD_WIRE_ERROR] = 10,                   [CSD_WIRE_AUTH] = CSD_WIRE_AUTH_SIZE,
        [CSD_WIRE_OPEN] = CSD_WIRE_OPEN_SIZE,    [CSD_WIRE_FORWARD] = 12 + 4096,
        [CSD_WIRE_RESULT] = 12 + 8,              [CSD_WIRE_TRUNCATE] = 4,
        [CSD_WIRE_CLOSE] = 0,                    [CSD_WIRE_STATS] = 0,
        [CSD_WIRE_STATS_REPLY] = CSD_WIRE_STATS_SIZE, [CSD_WIRE_PING] = 8,
        [CSD_WIRE_PONG] = 8,                     [CSD_WIRE_ROUTE] = 2 + 14,
        [CSD_WIRE_COPY_PREFIX] = CSD_WIRE_COPY_PREFIX_SIZE};
    for (int t = 1; t < CSD_WIRE_TYPE_COUNT; t++) {
        uint16_t flags = (t == CSD_WIRE_FORWARD || t == CSD_WIRE_RESULT)
                             ? (CSD_WIRE_FLAG_OUT_LOGITS | CSD_WIRE_FLAG_ALL_TOKENS)
                             : 0;
        csd_wire_hdr h = csd_wire_hdr_make(t, flags, 0xdeadbeefu + (uint32_t)t, 77u * (uint32_t)t,
                                           lens[t]);
        uint8_t b[CSD_WIRE_HDR_SIZE];
        csd_err err = {0};
        assert_int_equal(csd_wire_encode_hdr(b, &h, &err), 0);
        assert_int_equal(csd_wire_get_u16(b), CSD_WIRE_MAGIC);
        assert_int_equal(b[0], 0x5C); /* little-endian on the wire */
        csd_wire_hdr d;
        assert_int_equal(csd_wire_decode_hdr(b, sizeof b, &d, &err), 0);
        assert_int_equal(d.type, t);
        assert_int_equal(d.flags, flags);
        assert_int_equal(d.request_id, h.request_id);
        assert_int_equal(d.position, h.position);
        assert_int_equal(d.payload_len, h.payload_len);
        assert_string_not_equal(csd_wire_type_name(t), "?");
        /* Every strict prefix is a truncated header. */
        for (size_t n = 0; n < sizeof b; n++)
            assert_int_equal(csd_wire_decode_hdr(b, n, &d, NULL), CSD_EPROTO);
    }
}

static void encode_hdr_raw(uint8_t b[20], uint16_t magic, uint8_t ver, uint8_t type,
                           uint16_t flags, uint16_t reserved, uint32_t len) {
    csd_wire_put_u16(b, magic);
    b[2] = ver;
    b[3] = type;
    csd_wire_put_u16(b + 4, flags);
    csd_wire_put_u16(b + 6, reserved);
    csd_wire_put_u32(b + 8, 1);
    csd_wire_put_u32(b + 12, 2);
    csd_wire_put_u32(b + 16, len);
}

static void test_hdr_refusals(void **state) {
    (void)state;
    uint8_t b[20];
    csd_wire_hdr d;
    csd_err err = {0};
    encode_hdr_raw(b, 0xCA5D, 1, CSD_WIRE_PING, 0, 0, 8);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    assert_non_null(strstr(err.msg, "magic"));
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 2, CSD_WIRE_PING, 0, 0, 8);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    assert_non_null(strstr(err.msg, "peer speaks 2, local speaks 1"));
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_PING, 0, 1, 8);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, 0, 0, 0, 0);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_TYPE_COUNT, 0, 0, 0);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, 255, 0, 0, 0);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    /* flags not allowed for the type */
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_PING, 1, 0, 8);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_FORWARD, 0x0100, 0, 100);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    /* oversized and wrong fixed lengths */
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_FORWARD, 1, 0, CSD_WIRE_MAX_PAYLOAD + 1);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_RESULT, 1, 0, 0xFFFFFFFFu);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_HELLO, 0, 0, CSD_WIRE_HELLO_SIZE - 1);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_CLOSE, 0, 0, 1);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_ERROR, 0, 0,
                   CSD_WIRE_ERROR_HDR_SIZE + CSD_WIRE_MAX_ERROR_TEXT + 1);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), CSD_EPROTO);
    encode_hdr_raw(b, CSD_WIRE_MAGIC, 1, CSD_WIRE_FORWARD, 1, 0, CSD_WIRE_MAX_PAYLOAD);
    assert_int_equal(csd_wire_decode_hdr(b, 20, &d, &err), 0); /* the limit itself is fine */
    /* encode refuses what decode refuses */
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_HELLO, 0, 0, 0, 3);
    assert_int_equal(csd_wire_encode_hdr(b, &h, NULL), CSD_EINVAL);
    h = csd_wire_hdr_make(CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_HIDDEN, 0, 0, 12);
    h.version = 9;
    assert_int_equal(csd_wire_encode_hdr(b, &h, NULL), CSD_EINVAL);
}

/* Decodes every strict prefix and every longer buffer of a valid payload: all must be refused. */
typedef int (*decode_fn)(const uint8_t *in, size_t len, void *out, csd_err *err);

static void check_len_strict(decode_fn fn, const uint8_t *p, size_t len, void *out) {
    uint8_t big[256];
    assert_true(len + 1 <= sizeof big);
    for (size_t n = 0; n < len; n++) assert_int_equal(fn(p, n, out, NULL), CSD_EPROTO);
    memcpy(big, p, len);
    big[len] = 0;
    assert_int_equal(fn(big, len + 1, out, NULL), CSD_EPROTO);
}

static int dec_hello(const uint8_t *in, size_t len, void *out, csd_err *err) {
    return csd_wire_decode_hello(in, len, out, err);
}
static int dec_open(const uint8_t *in, size_t len, void *out, csd_err *err) {
    return csd_wire_decode_open(in, len, out, err);
}
static int dec_stats(const uint8_t *in, size_t len, void *out, csd_err *err) {
    return csd_wire_decode_stats(in, len, out, err);
}
static int dec_trunc(const uint8_t *in, size_t len, void *out, csd_err *err) {
    return csd_wire_decode_truncate(in, len, out, err);
}
static int dec_ping(const uint8_t *in, size_t len, void *out, csd_err *err) {
    return csd_wire_decode_ping(in, len, out, err);
}
static int dec_error(const uint8_t *in, size_t len, void *out, csd_err *err) {
    return csd_wire_decode_error(in, len, out, err);
}

static void test_hello_roundtrip_and_refusals(void **state) {
    (void)state;
    csd_wire_hello h = {.proto_version = CSD_WIRE_VERSION,
                        .role = CSD_WIRE_ROLE_COORD,
                        .caps = CSD_WIRE_CAP_SAMPLE | CSD_WIRE_CAP_HIDDEN_BF16,
                        .stage_index = 3,
                        .layer_begin = 12,
                        .layer_end = 24};
    for (int i = 0; i < 32; i++) {
        h.model_hash[i] = (uint8_t)rng();
        h.nonce[i] = (uint8_t)rng();
    }
    uint8_t b[CSD_WIRE_HELLO_SIZE];
    size_t len = 0;
    assert_int_equal(csd_wire_encode_hello(b, sizeof b, &h, &len, NULL), 0);
    assert_int_equal(len, CSD_WIRE_HELLO_SIZE);
    csd_wire_hello d;
    assert_int_equal(csd_wire_decode_hello(b, len, &d, NULL), 0);
    assert_int_equal(d.proto_version, h.proto_version);
    assert_int_equal(d.role, h.role);
    assert_int_equal(d.caps, h.caps);
    assert_int_equal(d.stage_index, 3);
    assert_int_equal(d.layer_begin, 12);
    assert_int_equal(d.layer_end, 24);
    assert_memory_equal(d.model_hash, h.model_hash, 32);
    assert_memory_equal(d.nonce, h.nonce, 32);
    check_len_strict(dec_hello, b, len, &d);
    /* wildcard layers */
    h.layer_begin = h.layer_end = h.stage_index = CSD_WIRE_ANY;
    assert_int_equal(csd_wire_encode_hello(b, sizeof b, &h, &len, NULL), 0);
    assert_int_equal(csd_wire_decode_hello(b, len, &d, NULL), 0);
    assert_int_equal(d.layer_begin, CSD_WIRE_ANY);
    /* bad role, empty range, half wildcard, reserved byte, small buffer */
    uint8_t c[CSD_WIRE_HELLO_SIZE];
    memcpy(c, b, sizeof c);
    c[2] = 0;
    assert_int_equal(csd_wire_decode_hello(c, len, &d, NULL), CSD_EPROTO);
    c[2] = CSD_WIRE_ROLE_COUNT;
    assert_int_equal(csd_wire_decode_hello(c, len, &d, NULL), CSD_EPROTO);
    memcpy(c, b, sizeof c);
    c[3] = 1;
    assert_int_equal(csd_wire_decode_hello(c, len, &d, NULL), CSD_EPROTO);
    memcpy(c, b, sizeof c);
    csd_wire_put_u32(c + 12, 5);
    csd_wire_put_u32(c + 16, 5);
    assert_int_equal(csd_wire_decode_hello(c, len, &d, NULL), CSD_EPROTO);
    /* a half wildcard is an expectation like "starts at 5, ends anywhere" */
    csd_wire_put_u32(c + 16, CSD_WIRE_ANY);
    assert_int_equal(csd_wire_decode_hello(c, len, &d, NULL), 0);
    assert_int_equal(d.layer_begin, 5);
    assert_int_equal(d.layer_end, CSD_WIRE_ANY);
    assert_int_equal(csd_wire_encode_hello(b, 10, &h, &len, NULL), CSD_EINVAL);
}

static void test_error_roundtrip(void **state) {
    (void)state;
    uint8_t b[CSD_WIRE_ERROR_HDR_SIZE + CSD_WIRE_MAX_ERROR_TEXT];
    size_t len = 0;
    const char *text = "model hash mismatch: peer 01.., local 02..";
    assert_int_equal(csd_wire_encode_error(b, sizeof b, CSD_EMISMATCH, text, &len, NULL), 0);
    assert_int_equal(len, 6 + strlen(text));
    csd_wire_error e;
    assert_int_equal(csd_wire_decode_error(b, len, &e, NULL), 0);
    assert_int_equal(e.code, CSD_EMISMATCH);
    assert_string_equal(e.text, text);
    check_len_strict(dec_error, b, len, &e);
    /* control bytes from the peer never reach a log line */
    b[6] = '\n';
    b[7] = 0x1b;
    assert_int_equal(csd_wire_decode_error(b, len, &e, NULL), 0);
    assert_int_equal(e.text[0], '?');
    assert_int_equal(e.text[1], '?');
    /* text_len beyond the limit, declared longer than present */
    csd_wire_put_u16(b + 4, CSD_WIRE_MAX_ERROR_TEXT + 1);
    assert_int_equal(csd_wire_decode_error(b, sizeof b, &e, NULL), CSD_EPROTO);
    /* long text is cut to the limit */
    char *longtext = malloc(3000);
    memset(longtext, 'x', 2999);
    longtext[2999] = 0;
    assert_int_equal(csd_wire_encode_error(b, sizeof b, CSD_EIO, longtext, &len, NULL), 0);
    assert_int_equal(len, sizeof b);
    assert_int_equal(csd_wire_decode_error(b, len, &e, NULL), 0);
    assert_int_equal(strlen(e.text), CSD_WIRE_MAX_ERROR_TEXT);
    free(longtext);
    assert_int_equal(csd_wire_encode_error(b, 0, CSD_EIO, "", &len, NULL), CSD_EINVAL);
    assert_int_equal(csd_wire_encode_error(b, 6, CSD_EIO, NULL, &len, NULL), 0);
    assert_int_equal(len, 6);
}

static void test_open_roundtrip(void **state) {
    (void)state;
    csd_wire_open o = csd_wire_open_default(4096);
    o.options = 0;
    o.hidden_dtype = CSD_DTYPE_BF16;
    o.temperature = 0.7f;
    o.top_p = 0.9f;
    o.top_k = 40;
    o.seed = 0x0123456789abcdefull;
    uint8_t b[CSD_WIRE_OPEN_SIZE];
    size_t len;
    assert_int_equal(csd_wire_encode_open(b, sizeof b, &o, &len, NULL), 0);
    csd_wire_open d;
    assert_int_equal(csd_wire_decode_open(b, len, &d, NULL), 0);
    assert_int_equal(d.max_context, 4096);
    assert_int_equal(d.options, 0);
    assert_int_equal(d.hidden_dtype, CSD_DTYPE_BF16);
    assert_true(d.temperature == 0.7f && d.top_p == 0.9f);
    assert_int_equal(d.top_k, 40);
    assert_true(d.seed == o.seed);
    check_len_strict(dec_open, b, len, &d);
    uint8_t c[CSD_WIRE_OPEN_SIZE];
    /* invalid fields are refused on decode */
    memcpy(c, b, sizeof c);
    csd_wire_put_u32(c, 0);
    assert_int_equal(csd_wire_decode_open(c, len, &d, NULL), CSD_EPROTO);
    csd_wire_put_u32(c, CSD_WIRE_MAX_CONTEXT + 1);
    assert_int_equal(csd_wire_decode_open(c, len, &d, NULL), CSD_EPROTO);
    memcpy(c, b, sizeof c);
    c[8] = CSD_DTYPE_Q4;
    assert_int_equal(csd_wire_decode_open(c, len, &d, NULL), CSD_EPROTO);
    memcpy(c, b, sizeof c);
    csd_wire_put_u32(c + 4, 0x80);
    assert_int_equal(csd_wire_decode_open(c, len, &d, NULL), CSD_EPROTO);
    memcpy(c, b, sizeof c);
    csd_wire_put_u32(c + 12, 0x7fc00000u); /* NaN temperature */
    assert_int_equal(csd_wire_decode_open(c, len, &d, NULL), CSD_EPROTO);
    memcpy(c, b, sizeof c);
    csd_wire_put_u32(c + 16, 0); /* top_p 0 */
    assert_int_equal(csd_wire_decode_open(c, len, &d, NULL), CSD_EPROTO);
    memcpy(c, b, sizeof c);
    c[10] = 1;
    assert_int_equal(csd_wire_decode_open(c, len, &d, NULL), CSD_EPROTO);
    o.top_p = 1.5f;
    assert_int_equal(csd_wire_encode_open(b, sizeof b, &o, &len, NULL), CSD_EINVAL);
}

static void test_small_messages_roundtrip(void **state) {
    (void)state;
    uint8_t b[CSD_WIRE_STATS_SIZE];
    size_t len;
    uint32_t k = 0;
    assert_int_equal(csd_wire_encode_truncate(b, sizeof b, 1234, &len, NULL), 0);
    assert_int_equal(csd_wire_decode_truncate(b, len, &k, NULL), 0);
    assert_int_equal(k, 1234);
    check_len_strict(dec_trunc, b, len, &k);
    csd_wire_put_u32(b, CSD_WIRE_MAX_CONTEXT + 1);
    assert_int_equal(csd_wire_decode_truncate(b, 4, &k, NULL), CSD_EPROTO);

    uint64_t t = 0;
    assert_int_equal(csd_wire_encode_ping(b, sizeof b, 0xfedcba9876543210ull, &len, NULL), 0);
    assert_int_equal(csd_wire_decode_ping(b, len, &t, NULL), 0);
    assert_true(t == 0xfedcba9876543210ull);
    check_len_strict(dec_ping, b, len, &t);

    csd_wire_stats s = {.open_requests = 7, .frames_in = 1, .frames_out = 2, .bytes_in = 3,
                        .bytes_out = 4, .kv_bytes_used = 5, .kv_bytes_total = 6,
                        .forward_ns = 1ull << 40, .forward_tokens = 9};
    csd_wire_stats d;
    assert_int_equal(csd_wire_encode_stats(b, sizeof b, &s, &len, NULL), 0);
    assert_int_equal(csd_wire_decode_stats(b, len, &d, NULL), 0);
    assert_int_equal(d.open_requests, 7);
    assert_true(d.frames_in == 1 && d.frames_out == 2 && d.bytes_in == 3 && d.bytes_out == 4);
    assert_true(d.kv_bytes_used == 5 && d.kv_bytes_total == 6);
    assert_true(d.forward_ns == (1ull << 40) && d.forward_tokens == 9);
    check_len_strict(dec_stats, b, len, &d);
    csd_wire_put_u64(b + 8 + 8 * 4, 100); /* used > total */
    assert_int_equal(csd_wire_decode_stats(b, len, &d, NULL), CSD_EPROTO);
}

static int dec_route(const uint8_t *in, size_t len, void *out, csd_err *err) {
    return csd_wire_decode_route(in, len, out, CSD_WIRE_MAX_ROUTE + 1, err);
}

static void test_copy_prefix_roundtrip(void **state) {
    (void)state;
    uint8_t b[CSD_WIRE_COPY_PREFIX_SIZE];
    size_t len = 0;
    uint32_t src = 0, n = 0;
    assert_int_equal(csd_wire_encode_copy_prefix(b, sizeof b, 77, 2000, &len, NULL), 0);
    assert_int_equal(len, CSD_WIRE_COPY_PREFIX_SIZE);
    assert_int_equal(csd_wire_decode_copy_prefix(b, len, &src, &n, NULL), 0);
    assert_int_equal(src, 77);
    assert_int_equal(n, 2000);
    csd_err err = {0};
    assert_int_equal(csd_wire_decode_copy_prefix(b, len - 1, &src, &n, &err),
                     CSD_EPROTO);                      /* short */
    csd_wire_put_u32(b + 4, CSD_WIRE_MAX_CONTEXT + 1); /* too long */
    assert_int_equal(csd_wire_decode_copy_prefix(b, len, &src, &n, &err), CSD_EPROTO);
    assert_non_null(strstr(err.msg, "COPY_PREFIX"));
    assert_int_equal(csd_wire_encode_copy_prefix(b, 4, 1, 1, &len, NULL), CSD_EINVAL); /* no room */
}

static void test_route_roundtrip(void **state) {
    (void)state;
    uint8_t b[CSD_WIRE_ROUTE_HDR_SIZE + CSD_WIRE_MAX_ROUTE];
    char addr[CSD_WIRE_MAX_ROUTE + 1];
    size_t len;
    const char *good[3] = {"127.0.0.1:7001", "[::1]:9", "node-01.lan:65535"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(csd_wire_encode_route(b, sizeof b, good[i], &len, NULL), 0);
        assert_int_equal(len, 2 + strlen(good[i]));
        assert_int_equal(csd_wire_decode_route(b, len, addr, sizeof addr, NULL), 0);
        assert_string_equal(addr, good[i]);
    }
    check_len_strict(dec_route, b, len, addr);
    /* too small an output buffer is the caller's error, not the peer's */
    assert_int_equal(csd_wire_decode_route(b, len, addr, 5, NULL), CSD_EINVAL);
    /* refused addresses */
    const char *bad[4] = {"", "no-port", "has space:1", "tab\t:1"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(csd_wire_encode_route(b, sizeof b, bad[i], &len, NULL), CSD_EINVAL);
    char longaddr[CSD_WIRE_MAX_ROUTE + 2];
    memset(longaddr, 'a', sizeof longaddr - 1);
    longaddr[0] = ':';
    longaddr[sizeof longaddr - 1] = 0;
    assert_int_equal(csd_wire_encode_route(b, sizeof b, longaddr, &len, NULL), CSD_EINVAL);
    csd_wire_put_u16(b, 3);
    memcpy(b + 2, "a\0:", 3); /* NUL inside */
    assert_int_equal(csd_wire_decode_route(b, 5, addr, sizeof addr, NULL), CSD_EPROTO);
    csd_wire_put_u16(b, CSD_WIRE_MAX_ROUTE + 1);
    assert_int_equal(csd_wire_decode_route(b, sizeof b, addr, sizeof addr, NULL), CSD_EPROTO);
    csd_wire_put_u16(b, 0);
    assert_int_equal(csd_wire_decode_route(b, 2, addr, sizeof addr, NULL), CSD_EPROTO);
}

static void test_act_ids_roundtrip(void **state) {
    (void)state;
    uint32_t ids[37];
    for (int i = 0; i < 37; i++) ids[i] = rng() % 150000u;
    uint8_t b[12 + 4 * 37];
    size_t len;
    for (int kind = CSD_WIRE_ACT_TOKENS; kind <= CSD_WIRE_ACT_SAMPLED; kind += 3) {
        assert_int_equal(csd_wire_encode_ids(b, sizeof b, kind, ids, 37, &len, NULL), 0);
        assert_int_equal(len, sizeof b);
        assert_int_equal(csd_wire_act_payload_size(kind, 0, 37, 1), sizeof b);
        csd_wire_act a;
        assert_int_equal(csd_wire_decode_act(b, len, &a, NULL), 0);
        assert_int_equal(a.kind, kind);
        assert_int_equal(a.n_tokens, 37);
        assert_int_equal(a.dim, 1);
        uint32_t out[37];
        assert_int_equal(csd_wire_act_ids(&a, out, 37, NULL), 0);
        assert_memory_equal(out, ids, sizeof ids);
        assert_int_equal(csd_wire_act_ids(&a, out, 36, NULL), CSD_EINVAL);
        float f[37];
        assert_int_equal(csd_wire_act_to_f32(&a, f, 37, NULL), CSD_EINVAL);
        for (size_t n = 0; n < len; n++)
            assert_int_equal(csd_wire_decode_act(b, n, &a, NULL), CSD_EPROTO);
    }
    assert_int_equal(csd_wire_encode_ids(b, sizeof b, CSD_WIRE_ACT_HIDDEN, ids, 37, &len, NULL),
                     CSD_EINVAL);
    assert_int_equal(csd_wire_encode_ids(b, 10, CSD_WIRE_ACT_TOKENS, ids, 37, &len, NULL),
                     CSD_EINVAL);
}

static void test_act_rows_roundtrip(void **state) {
    (void)state;
    const uint32_t n = 5, dim = 67; /* odd sizes */
    float x[5 * 67], y[5 * 67];
    for (uint32_t i = 0; i < n * dim; i++) x[i] = ((float)(rng() % 20001u) - 10000.0f) / 1000.0f;
    const int dts[3] = {CSD_DTYPE_F32, CSD_DTYPE_F16, CSD_DTYPE_BF16};
    const float tol[3] = {0.0f, 1e-3f, 8e-3f}; /* relative, per dtype */
    size_t cap = 12 + 4 * n * dim;
    uint8_t *b = csd_alloc(cap + 1);
    for (int di = 0; di < 3; di++) {
        size_t len;
        assert_int_equal(csd_wire_encode_rows_f32(b, cap, CSD_WIRE_ACT_HIDDEN, dts[di], x, n, dim,
                                                  &len, NULL),
                         0);
        assert_int_equal(len, csd_wire_act_payload_size(CSD_WIRE_ACT_HIDDEN, dts[di], n, dim));
        csd_wire_act a;
        assert_int_equal(csd_wire_decode_act(b, len, &a, NULL), 0);
        assert_int_equal(a.dtype, dts[di]);
        assert_int_equal(a.data_bytes, len - 12);
        assert_int_equal(csd_wire_act_to_f32(&a, y, n * dim, NULL), 0);
        for (uint32_t i = 0; i < n * dim; i++)
            assert_true(fabsf(y[i] - x[i]) <= tol[di] * fabsf(x[i]) + 1e-6f);
        /* payload_len mismatch either way */
        assert_int_equal(csd_wire_decode_act(b, len - 1, &a, NULL), CSD_EPROTO);
        assert_int_equal(csd_wire_decode_act(b, len + 1, &a, NULL), CSD_EPROTO);
        /* a lying n_tokens or dim */
        csd_wire_put_u32(b + 4, n + 1);
        assert_int_equal(csd_wire_decode_act(b, len, &a, NULL), CSD_EPROTO);
        csd_wire_put_u32(b + 4, n);
        csd_wire_put_u32(b + 8, dim - 1);
        assert_int_equal(csd_wire_decode_act(b, len, &a, NULL), CSD_EPROTO);
        csd_wire_put_u32(b + 8, dim);
    }
    /* logits: f32 only */
    size_t len;
    assert_int_equal(csd_wire_encode_rows_f32(b, cap, CSD_WIRE_ACT_LOGITS, CSD_DTYPE_F32, x, n, dim,
                                              &len, NULL),
                     0);
    csd_wire_act a;
    assert_int_equal(csd_wire_decode_act(b, len, &a, NULL), 0);
    assert_int_equal(csd_wire_act_to_f32(&a, y, n * dim, NULL), 0);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(csd_wire_encode_rows_f32(b, cap, CSD_WIRE_ACT_LOGITS, CSD_DTYPE_F16, x, n,
                                              dim, &len, NULL),
                     CSD_EINVAL);
    b[1] = CSD_DTYPE_F16; /* logits claiming f16 */
    assert_int_equal(csd_wire_decode_act(b, 12 + 2 * n * dim, &a, NULL), CSD_EPROTO);
    csd_free(b);
}

static void test_act_limits(void **state) {
    (void)state;
    uint8_t b[12];
    csd_wire_act a;
    /* A header claiming huge sizes is refused before any data is touched. */
    b[0] = CSD_WIRE_ACT_HIDDEN;
    b[1] = CSD_DTYPE_F32;
    b[2] = b[3] = 0;
    csd_wire_put_u32(b + 4, CSD_WIRE_MAX_TOKENS);
    csd_wire_put_u32(b + 8, CSD_WIRE_MAX_DIM);
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    assert_int_equal(csd_wire_act_payload_size(CSD_WIRE_ACT_HIDDEN, CSD_DTYPE_F32,
                                               CSD_WIRE_MAX_TOKENS, CSD_WIRE_MAX_DIM),
                     0);
    csd_wire_put_u32(b + 4, 0);
    csd_wire_put_u32(b + 8, 16);
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    csd_wire_put_u32(b + 4, CSD_WIRE_MAX_TOKENS + 1);
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    csd_wire_put_u32(b + 4, 1);
    csd_wire_put_u32(b + 8, CSD_WIRE_MAX_DIM + 1);
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    csd_wire_put_u32(b + 8, 0);
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    csd_wire_put_u32(b + 8, 0xFFFFFFFFu);
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    b[0] = CSD_WIRE_ACT_KIND_COUNT;
    csd_wire_put_u32(b + 8, 4);
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    b[0] = CSD_WIRE_ACT_HIDDEN;
    b[1] = CSD_DTYPE_Q8;
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    b[0] = CSD_WIRE_ACT_TOKENS;
    b[1] = 0;
    csd_wire_put_u32(b + 8, 2); /* ids must have dim 1 */
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    b[1] = 0;
    b[2] = 1; /* reserved */
    assert_int_equal(csd_wire_decode_act(b, 12, &a, NULL), CSD_EPROTO);
    /* the largest vocab row is allowed for logits but not for hidden states */
    assert_true(csd_wire_act_payload_size(CSD_WIRE_ACT_LOGITS, CSD_DTYPE_F32, 1,
                                          CSD_WIRE_MAX_VOCAB) > 0);
    assert_int_equal(csd_wire_act_payload_size(CSD_WIRE_ACT_HIDDEN, CSD_DTYPE_F32, 1,
                                               CSD_WIRE_MAX_VOCAB),
                     0);
}

static void test_act_flags(void **state) {
    (void)state;
    assert_int_equal(csd_wire_check_act_flags(CSD_WIRE_FLAG_OUT_LOGITS, NULL), 0);
    assert_int_equal(
        csd_wire_check_act_flags(CSD_WIRE_FLAG_OUT_SAMPLE | CSD_WIRE_FLAG_ALL_TOKENS, NULL), 0);
    assert_int_equal(csd_wire_check_act_flags(CSD_WIRE_FLAG_OUT_HIDDEN, NULL), 0);
    assert_int_equal(csd_wire_check_act_flags(0, NULL), CSD_EPROTO);
    assert_int_equal(csd_wire_check_act_flags(CSD_WIRE_FLAG_ALL_TOKENS, NULL), CSD_EPROTO);
    assert_int_equal(
        csd_wire_check_act_flags(CSD_WIRE_FLAG_OUT_LOGITS | CSD_WIRE_FLAG_OUT_SAMPLE, NULL),
        CSD_EPROTO);
    assert_int_equal(
        csd_wire_check_act_flags(CSD_WIRE_FLAG_OUT_LOGITS | CSD_WIRE_FLAG_BATCH_MORE, NULL), 0);
    assert_int_equal(csd_wire_check_act_flags(CSD_WIRE_FLAG_OUT_LOGITS | 0x20, NULL), CSD_EPROTO);
}

/* Random bytes and random bit flips through every decoder: must return, never crash (ASan). */
static void test_corrupt_inputs_never_crash(void **state) {
    (void)state;
    uint8_t b[512];
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        size_t n = rng() % sizeof b;
        for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rng();
        if (it & 1) csd_wire_put_u16(b, CSD_WIRE_MAGIC); /* get past the magic sometimes */
        if (n > 2 && (it & 2)) b[2] = CSD_WIRE_VERSION;
        csd_wire_hdr h;
        csd_wire_hello he;
        csd_wire_error e;
        csd_wire_open o;
        csd_wire_stats s;
        csd_wire_act a;
        uint32_t k;
        uint64_t t;
        char addr[CSD_WIRE_MAX_ROUTE + 1];
        accepted += csd_wire_decode_route(b, n, addr, sizeof addr, NULL) == 0;
        accepted += csd_wire_decode_hdr(b, n, &h, NULL) == 0;
        accepted += csd_wire_decode_hello(b, n, &he, NULL) == 0;
        accepted += csd_wire_decode_error(b, n, &e, NULL) == 0;
        accepted += csd_wire_decode_open(b, n, &o, NULL) == 0;
        accepted += csd_wire_decode_stats(b, n, &s, NULL) == 0;
        accepted += csd_wire_decode_truncate(b, n, &k, NULL) == 0;
        accepted += csd_wire_decode_ping(b, n, &t, NULL) == 0;
        if (csd_wire_decode_act(b, n, &a, NULL) == 0) {
            accepted++;
            assert_true(a.data_bytes + 12 == n);
        }
    }
    assert_true(accepted > 0); /* some random inputs are valid (e.g. any 8-byte PING) */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hdr_roundtrip_every_type),
        cmocka_unit_test(test_hdr_refusals),
        cmocka_unit_test(test_hello_roundtrip_and_refusals),
        cmocka_unit_test(test_error_roundtrip),
        cmocka_unit_test(test_open_roundtrip),
        cmocka_unit_test(test_small_messages_roundtrip),
        cmocka_unit_test(test_route_roundtrip),
        cmocka_unit_test(test_copy_prefix_roundtrip),
        cmocka_unit_test(test_act_ids_roundtrip),
        cmocka_unit_test(test_act_rows_roundtrip),
        cmocka_unit_test(test_act_limits),
        cmocka_unit_test(test_act_flags),
        cmocka_unit_test(test_corrupt_inputs_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
