/* wire: frame header and payload codecs (see wire.h and docs/protocol.md).
 * Pure functions over byte buffers: no sockets, no allocation, no globals. Every field is written
 * with an explicit little-endian helper; decoders check lengths before reading anything. */
#include "wire.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"

_Static_assert(2 + 1 + 1 + 2 + 2 + 4 + 4 + 4 == CSD_WIRE_HDR_SIZE, "header layout is 20 bytes");
_Static_assert(2 + 1 + 1 + 4 + 4 + 4 + 4 + CSD_WIRE_HASH_SIZE + CSD_WIRE_NONCE_SIZE ==
                   CSD_WIRE_HELLO_SIZE,
               "HELLO layout");
_Static_assert(4 + 4 + 1 + 3 + 4 + 4 + 4 + 8 == CSD_WIRE_OPEN_SIZE, "OPEN layout");
_Static_assert(4 + 4 + 8 * 8 == CSD_WIRE_STATS_SIZE, "STATS_REPLY layout");
_Static_assert(CSD_WIRE_TYPE_COUNT == 16,
               "message types changed: bump CSD_WIRE_VERSION and the spec");
_Static_assert((uint64_t)CSD_WIRE_MAX_PAYLOAD < UINT32_MAX, "payload_len is a u32");

/* Per type: allowed flags and payload length bounds, so a header alone can refuse a frame before
 * its payload is read or any buffer is grown. */
typedef struct type_rule {
    const char *name;
    uint16_t flags;
    uint32_t min_len, max_len;
} type_rule;

static const type_rule rules[CSD_WIRE_TYPE_COUNT] = {
    [0] = {"INVALID", 0, 0, 0},
    [CSD_WIRE_HELLO] = {"HELLO", 0, CSD_WIRE_HELLO_SIZE, CSD_WIRE_HELLO_SIZE},
    [CSD_WIRE_HELLO_OK] = {"HELLO_OK", 0, CSD_WIRE_HELLO_SIZE, CSD_WIRE_HELLO_SIZE},
    [CSD_WIRE_ERROR] = {"ERROR", 0, CSD_WIRE_ERROR_HDR_SIZE,
                        CSD_WIRE_ERROR_HDR_SIZE + CSD_WIRE_MAX_ERROR_TEXT},
    [CSD_WIRE_AUTH] = {"AUTH", 0, CSD_WIRE_AUTH_SIZE, CSD_WIRE_AUTH_SIZE},
    [CSD_WIRE_OPEN] = {"OPEN", 0, CSD_WIRE_OPEN_SIZE, CSD_WIRE_OPEN_SIZE},
    [CSD_WIRE_FORWARD] = {"FORWARD", CSD_WIRE_FLAGS_ACT, CSD_WIRE_ACT_HDR_SIZE,
                          CSD_WIRE_MAX_PAYLOAD},
    [CSD_WIRE_RESULT] = {"RESULT", CSD_WIRE_FLAGS_ACT, CSD_WIRE_ACT_HDR_SIZE, CSD_WIRE_MAX_PAYLOAD},
    [CSD_WIRE_TRUNCATE] = {"TRUNCATE", 0, CSD_WIRE_TRUNCATE_SIZE, CSD_WIRE_TRUNCATE_SIZE},
    [CSD_WIRE_CLOSE] = {"CLOSE", 0, 0, 0},
    [CSD_WIRE_STATS] = {"STATS", 0, 0, 0},
    [CSD_WIRE_STATS_REPLY] = {"STATS_REPLY", 0, CSD_WIRE_STATS_SIZE, CSD_WIRE_STATS_SIZE},
    [CSD_WIRE_PING] = {"PING", 0, CSD_WIRE_PING_SIZE, CSD_WIRE_PING_SIZE},
    [CSD_WIRE_PONG] = {"PONG", 0, CSD_WIRE_PING_SIZE, CSD_WIRE_PING_SIZE},
    [CSD_WIRE_ROUTE] = {"ROUTE", 0, CSD_WIRE_ROUTE_HDR_SIZE + 1,
                        CSD_WIRE_ROUTE_HDR_SIZE + CSD_WIRE_MAX_ROUTE},
    [CSD_WIRE_COPY_PREFIX] = {"COPY_PREFIX", 0, CSD_WIRE_COPY_PREFIX_SIZE,
                              CSD_WIRE_COPY_PREFIX_SIZE},
};

const char *csd_wire_type_name(int type) {
    if (type <= 0 || type >= CSD_WIRE_TYPE_COUNT) return "?";
    return rules[type].name;
}

const char *csd_wire_role_name(int role) {
    switch (role) {
    case CSD_WIRE_ROLE_COORD: return "coord";
    case CSD_WIRE_ROLE_STAGE: return "stage";
    default: return "?";
    }
}

const char *csd_wire_act_kind_name(int kind) {
    static const char *const names[CSD_WIRE_ACT_KIND_COUNT] = {"tokens", "hidden", "logits",
                                                               "sampled"};
    if (kind < 0 || kind >= CSD_WIRE_ACT_KIND_COUNT) return "?";
    return names[kind];
}

/* ---- header ---- */

csd_wire_hdr csd_wire_hdr_make(int type, uint16_t flags, uint32_t request_id, uint32_t position,
                               uint32_t payload_len) {
    csd_wire_hdr h = {.version = CSD_WIRE_VERSION,
                      .type = (uint8_t)type,
                      .flags = flags,
                      .request_id = request_id,
                      .position = position,
                      .payload_len = payload_len};
    return h;
}

/* Checks type, flags and length of a header (shared by encode and decode). */
static int check_hdr(const csd_wire_hdr *h, int code, csd_err *err) {
    if (h->type == 0 || h->type >= CSD_WIRE_TYPE_COUNT)
        return csd_err_set(err, code, "frame: unknown type %u", (unsigned)h->type);
    const type_rule *r = &rules[h->type];
    if (h->flags & (uint16_t)~r->flags)
        return csd_err_set(err, code, "frame %s: unknown flags 0x%04x", r->name,
                           (unsigned)(h->flags & (uint16_t)~r->flags));
    if (h->payload_len < r->min_len || h->payload_len > r->max_len)
        return csd_err_set(err, code, "frame %s: payload_len %u outside [%u, %u]", r->name,
                           (unsigned)h->payload_len, (unsigned)r->min_len, (unsigned)r->max_len);
    return 0;
}

int csd_wire_encode_hdr(uint8_t out[CSD_WIRE_HDR_SIZE], const csd_wire_hdr *h, csd_err *err) {
    if (h->version != CSD_WIRE_VERSION)
        return csd_err_set(err, CSD_EINVAL, "frame: cannot encode version %u",
                           (unsigned)h->version);
    int rc = check_hdr(h, CSD_EINVAL, err);
    if (rc) return rc;
    csd_wire_put_u16(out + 0, CSD_WIRE_MAGIC);
    out[2] = h->version;
    out[3] = h->type;
    csd_wire_put_u16(out + 4, h->flags);
    csd_wire_put_u16(out + 6, 0);
    csd_wire_put_u32(out + 8, h->request_id);
    csd_wire_put_u32(out + 12, h->position);
    csd_wire_put_u32(out + 16, h->payload_len);
    return 0;
}

int csd_wire_decode_hdr(const uint8_t *in, size_t len, csd_wire_hdr *out, csd_err *err) {
    if (len < CSD_WIRE_HDR_SIZE)
        return csd_err_set(err, CSD_EPROTO, "frame: truncated header (%zu of %u bytes)", len,
                           CSD_WIRE_HDR_SIZE);
    uint16_t magic = csd_wire_get_u16(in);
    if (magic != CSD_WIRE_MAGIC)
        return csd_err_set(err, CSD_EPROTO, "frame: bad magic 0x%04x (expected 0x%04x)",
                           (unsigned)magic, CSD_WIRE_MAGIC);
    if (in[2] != CSD_WIRE_VERSION)
        return csd_err_set(err, CSD_EPROTO,
                           "protocol version mismatch: peer speaks %u, local speaks %u",
                           (unsigned)in[2], CSD_WIRE_VERSION);
    uint16_t reserved = csd_wire_get_u16(in + 6);
    if (reserved != 0)
        return csd_err_set(err, CSD_EPROTO, "frame: reserved field is 0x%04x, must be 0",
                           (unsigned)reserved);
    csd_wire_hdr h = {.version = in[2],
                      .type = in[3],
                      .flags = csd_wire_get_u16(in + 4),
                      .request_id = csd_wire_get_u32(in + 8),
                      .position = csd_wire_get_u32(in + 12),
                      .payload_len = csd_wire_get_u32(in + 16)};
    int rc = check_hdr(&h, CSD_EPROTO, err);
    if (rc) return rc;
    *out = h;
    return 0;
}

/* ---- small helpers ---- */

static int need_cap(size_t cap, size_t n, const char *what, csd_err *err) {
    if (cap < n)
        return csd_err_set(err, CSD_EINVAL, "%s: output buffer %zu bytes, need %zu", what, cap, n);
    return 0;
}

static int need_len(size_t len, size_t n, const char *what, csd_err *err) {
    if (len != n)
        return csd_err_set(err, CSD_EPROTO, "%s: payload is %zu bytes, expected %zu", what, len,
                           n);
    return 0;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- HELLO / HELLO_OK ---- */

static int check_hello(const csd_wire_hello *h, int code, csd_err *err) {
    if (h->role == 0 || h->role >= CSD_WIRE_ROLE_COUNT)
        return csd_err_set(err, code, "HELLO: unknown role %u", (unsigned)h->role);
    bool any_begin = h->layer_begin == CSD_WIRE_ANY, any_end = h->layer_end == CSD_WIRE_ANY;
    if (!any_begin && !any_end && h->layer_begin >= h->layer_end)
        return csd_err_set(err, code, "HELLO: empty layer range [%u,%u)",
                           (unsigned)h->layer_begin, (unsigned)h->layer_end);
    return 0;
}

int csd_wire_encode_hello(uint8_t *out, size_t cap, const csd_wire_hello *h, size_t *len,
                          csd_err *err) {
    int rc = need_cap(cap, CSD_WIRE_HELLO_SIZE, "HELLO", err);
    if (rc) return rc;
    if ((rc = check_hello(h, CSD_EINVAL, err))) return rc;
    csd_wire_put_u16(out + 0, h->proto_version);
    out[2] = h->role;
    out[3] = 0;
    csd_wire_put_u32(out + 4, h->caps);
    csd_wire_put_u32(out + 8, h->stage_index);
    csd_wire_put_u32(out + 12, h->layer_begin);
    csd_wire_put_u32(out + 16, h->layer_end);
    memcpy(out + 20, h->model_hash, CSD_WIRE_HASH_SIZE);
    memcpy(out + 20 + CSD_WIRE_HASH_SIZE, h->nonce, CSD_WIRE_NONCE_SIZE);
    *len = CSD_WIRE_HELLO_SIZE;
    return 0;
}

int csd_wire_decode_hello(const uint8_t *in, size_t len, csd_wire_hello *out, csd_err *err) {
    int rc = need_len(len, CSD_WIRE_HELLO_SIZE, "HELLO", err);
    if (rc) return rc;
    if (in[3] != 0)
        return csd_err_set(err, CSD_EPROTO, "HELLO: reserved byte is %u, must be 0",
                           (unsigned)in[3]);
    csd_wire_hello h;
    memset(&h, 0, sizeof h);
    h.proto_version = csd_wire_get_u16(in + 0);
    h.role = in[2];
    h.caps = csd_wire_get_u32(in + 4);
    h.stage_index = csd_wire_get_u32(in + 8);
    h.layer_begin = csd_wire_get_u32(in + 12);
    h.layer_end = csd_wire_get_u32(in + 16);
    memcpy(h.model_hash, in + 20, CSD_WIRE_HASH_SIZE);
    memcpy(h.nonce, in + 20 + CSD_WIRE_HASH_SIZE, CSD_WIRE_NONCE_SIZE);
    if ((rc = check_hello(&h, CSD_EPROTO, err))) return rc;
    *out = h;
    return 0;
}

/* ---- ERROR ---- */

int csd_wire_encode_error(uint8_t *out, size_t cap, int32_t code, const char *text, size_t *len,
                          csd_err *err) {
    size_t n = text ? strlen(text) : 0;
    if (n > CSD_WIRE_MAX_ERROR_TEXT) n = CSD_WIRE_MAX_ERROR_TEXT;
    int rc = need_cap(cap, CSD_WIRE_ERROR_HDR_SIZE + n, "ERROR", err);
    if (rc) return rc;
    csd_wire_put_u32(out, (uint32_t)code);
    csd_wire_put_u16(out + 4, (uint16_t)n);
    if (n) memcpy(out + CSD_WIRE_ERROR_HDR_SIZE, text, n);
    *len = CSD_WIRE_ERROR_HDR_SIZE + n;
    return 0;
}

int csd_wire_decode_error(const uint8_t *in, size_t len, csd_wire_error *out, csd_err *err) {
    if (len < CSD_WIRE_ERROR_HDR_SIZE)
        return csd_err_set(err, CSD_EPROTO, "ERROR: payload %zu bytes, need at least %u", len,
                           CSD_WIRE_ERROR_HDR_SIZE);
    uint32_t n = csd_wire_get_u16(in + 4);
    if (n > CSD_WIRE_MAX_ERROR_TEXT)
        return csd_err_set(err, CSD_EPROTO, "ERROR: text_len %u over limit %u", (unsigned)n,
                           CSD_WIRE_MAX_ERROR_TEXT);
    int rc = need_len(len, CSD_WIRE_ERROR_HDR_SIZE + (size_t)n, "ERROR", err);
    if (rc) return rc;
    out->code = (int32_t)csd_wire_get_u32(in);
    /* The text comes from a peer and ends up in logs: keep printable ASCII and UTF-8 bytes only. */
    for (uint32_t i = 0; i < n; i++) {
        uint8_t c = in[CSD_WIRE_ERROR_HDR_SIZE + i];
        out->text[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    out->text[n] = '\0';
    return 0;
}

/* ---- OPEN ---- */

csd_wire_open csd_wire_open_default(uint32_t max_context) {
    csd_wire_open o = {.max_context = max_context,
                       .options = CSD_WIRE_OPEN_GREEDY,
                       .hidden_dtype = CSD_DTYPE_F16,
                       .temperature = 1.0f,
                       .top_p = 1.0f,
                       .top_k = 0,
                       .seed = 0};
    return o;
}

static int check_open(const csd_wire_open *o, int code, csd_err *err) {
    if (o->max_context == 0 || o->max_context > CSD_WIRE_MAX_CONTEXT)
        return csd_err_set(err, code, "OPEN: max_context %u outside [1, %u]",
                           (unsigned)o->max_context, CSD_WIRE_MAX_CONTEXT);
    if (o->options & ~CSD_WIRE_OPEN_MASK)
        return csd_err_set(err, code, "OPEN: unknown options 0x%x", (unsigned)o->options);
    if (o->hidden_dtype != CSD_DTYPE_F16 && o->hidden_dtype != CSD_DTYPE_F32 &&
        o->hidden_dtype != CSD_DTYPE_BF16)
        return csd_err_set(err, code, "OPEN: hidden dtype %u is not f32/f16/bf16",
                           (unsigned)o->hidden_dtype);
    if (!isfinite(o->temperature) || o->temperature < 0.0f)
        return csd_err_set(err, code, "OPEN: temperature must be finite and >= 0");
    if (!(o->top_p > 0.0f && o->top_p <= 1.0f))
        return csd_err_set(err, code, "OPEN: top_p must be in (0, 1]");
    if (o->top_k > CSD_WIRE_MAX_VOCAB)
        return csd_err_set(err, code, "OPEN: top_k %u over limit %u", (unsigned)o->top_k,
                           CSD_WIRE_MAX_VOCAB);
    return 0;
}

int csd_wire_encode_open(uint8_t *out, size_t cap, const csd_wire_open *o, size_t *len,
                         csd_err *err) {
    int rc = need_cap(cap, CSD_WIRE_OPEN_SIZE, "OPEN", err);
    if (rc) return rc;
    if ((rc = check_open(o, CSD_EINVAL, err))) return rc;
    csd_wire_put_u32(out + 0, o->max_context);
    csd_wire_put_u32(out + 4, o->options);
    out[8] = o->hidden_dtype;
    out[9] = out[10] = out[11] = 0;
    csd_wire_put_u32(out + 12, f32_bits(o->temperature));
    csd_wire_put_u32(out + 16, f32_bits(o->top_p));
    csd_wire_put_u32(out + 20, o->top_k);
    csd_wire_put_u64(out + 24, o->seed);
    *len = CSD_WIRE_OPEN_SIZE;
    return 0;
}

int csd_wire_decode_open(const uint8_t *in, size_t len, csd_wire_open *out, csd_err *err) {
    int rc = need_len(len, CSD_WIRE_OPEN_SIZE, "OPEN", err);
    if (rc) return rc;
    if (in[9] | in[10] | in[11])
        return csd_err_set(err, CSD_EPROTO, "OPEN: reserved bytes must be 0");
    csd_wire_open o = {.max_context = csd_wire_get_u32(in + 0),
                       .options = csd_wire_get_u32(in + 4),
                       .hidden_dtype = in[8],
                       .temperature = bits_f32(csd_wire_get_u32(in + 12)),
                       .top_p = bits_f32(csd_wire_get_u32(in + 16)),
                       .top_k = csd_wire_get_u32(in + 20),
                       .seed = csd_wire_get_u64(in + 24)};
    if ((rc = check_open(&o, CSD_EPROTO, err))) return rc;
    *out = o;
    return 0;
}

/* ---- ROUTE ---- */

/* An address is printable ASCII without spaces and holds a ':' (host:port, [v6]:port). */
static int check_route(const uint8_t *a, size_t n, int code, csd_err *err) {
    if (n == 0 || n > CSD_WIRE_MAX_ROUTE)
        return csd_err_set(err, code, "ROUTE: address length %zu outside [1, %u]", n,
                           CSD_WIRE_MAX_ROUTE);
    bool colon = false;
    for (size_t i = 0; i < n; i++) {
        if (a[i] <= 0x20 || a[i] >= 0x7f)
            return csd_err_set(err, code, "ROUTE: address byte %zu is 0x%02x, not printable", i,
                               (unsigned)a[i]);
        colon |= a[i] == ':';
    }
    if (!colon) return csd_err_set(err, code, "ROUTE: address has no ':port'");
    return 0;
}

int csd_wire_encode_route(uint8_t *out, size_t cap, const char *addr, size_t *len, csd_err *err) {
    size_t n = addr ? strlen(addr) : 0;
    int rc = check_route((const uint8_t *)addr, n, CSD_EINVAL, err);
    if (rc) return rc;
    if ((rc = need_cap(cap, CSD_WIRE_ROUTE_HDR_SIZE + n, "ROUTE", err))) return rc;
    csd_wire_put_u16(out, (uint16_t)n);
    memcpy(out + CSD_WIRE_ROUTE_HDR_SIZE, addr, n);
    *len = CSD_WIRE_ROUTE_HDR_SIZE + n;
    return 0;
}

int csd_wire_decode_route(const uint8_t *in, size_t len, char *addr, size_t addr_cap,
                          csd_err *err) {
    if (len < CSD_WIRE_ROUTE_HDR_SIZE)
        return csd_err_set(err, CSD_EPROTO, "ROUTE: payload %zu bytes, need at least %u", len,
                           CSD_WIRE_ROUTE_HDR_SIZE);
    size_t n = csd_wire_get_u16(in);
    if (n > CSD_WIRE_MAX_ROUTE)
        return csd_err_set(err, CSD_EPROTO, "ROUTE: address length %zu over limit %u", n,
                           CSD_WIRE_MAX_ROUTE);
    int rc = need_len(len, CSD_WIRE_ROUTE_HDR_SIZE + n, "ROUTE", err);
    if (rc) return rc;
    if ((rc = check_route(in + CSD_WIRE_ROUTE_HDR_SIZE, n, CSD_EPROTO, err))) return rc;
    if (addr_cap < n + 1)
        return csd_err_set(err, CSD_EINVAL, "ROUTE: address buffer %zu bytes, need %zu", addr_cap,
                           n + 1);
    memcpy(addr, in + CSD_WIRE_ROUTE_HDR_SIZE, n);
    addr[n] = '\0';
    return 0;
}

/* ---- TRUNCATE / STATS / PING ---- */

int csd_wire_encode_truncate(uint8_t *out, size_t cap, uint32_t keep_tokens, size_t *len,
                             csd_err *err) {
    int rc = need_cap(cap, CSD_WIRE_TRUNCATE_SIZE, "TRUNCATE", err);
    if (rc) return rc;
    if (keep_tokens > CSD_WIRE_MAX_CONTEXT)
        return csd_err_set(err, CSD_EINVAL, "TRUNCATE: keep_tokens %u over limit %u",
                           (unsigned)keep_tokens, CSD_WIRE_MAX_CONTEXT);
    csd_wire_put_u32(out, keep_tokens);
    *len = CSD_WIRE_TRUNCATE_SIZE;
    return 0;
}

int csd_wire_decode_truncate(const uint8_t *in, size_t len, uint32_t *keep_tokens, csd_err *err) {
    int rc = need_len(len, CSD_WIRE_TRUNCATE_SIZE, "TRUNCATE", err);
    if (rc) return rc;
    uint32_t k = csd_wire_get_u32(in);
    if (k > CSD_WIRE_MAX_CONTEXT)
        return csd_err_set(err, CSD_EPROTO, "TRUNCATE: keep_tokens %u over limit %u",
                           (unsigned)k, CSD_WIRE_MAX_CONTEXT);
    *keep_tokens = k;
    return 0;
}

int csd_wire_encode_copy_prefix(uint8_t *out, size_t cap, uint32_t src_request, uint32_t n_tokens,
                                size_t *len, csd_err *err) {
    int rc = need_cap(cap, CSD_WIRE_COPY_PREFIX_SIZE, "COPY_PREFIX", err);
    if (rc) return rc;
    if (n_tokens > CSD_WIRE_MAX_CONTEXT)
        return csd_err_set(err, CSD_EINVAL, "COPY_PREFIX: n_tokens %u over limit %u",
                           (unsigned)n_tokens, CSD_WIRE_MAX_CONTEXT);
    csd_wire_put_u32(out, src_request);
    csd_wire_put_u32(out + 4, n_tokens);
    *len = CSD_WIRE_COPY_PREFIX_SIZE;
    return 0;
}

int csd_wire_decode_copy_prefix(const uint8_t *in, size_t len, uint32_t *src_request,
                                uint32_t *n_tokens, csd_err *err) {
    int rc = need_len(len, CSD_WIRE_COPY_PREFIX_SIZE, "COPY_PREFIX", err);
    if (rc) return rc;
    uint32_t n = csd_wire_get_u32(in + 4);
    if (n > CSD_WIRE_MAX_CONTEXT)
        return csd_err_set(err, CSD_EPROTO, "COPY_PREFIX: n_tokens %u over limit %u", (unsigned)n,
                           CSD_WIRE_MAX_CONTEXT);
    *src_request = csd_wire_get_u32(in);
    *n_tokens = n;
    return 0;
}

int csd_wire_encode_stats(uint8_t *out, size_t cap, const csd_wire_stats *s, size_t *len,
                          csd_err *err) {
    int rc = need_cap(cap, CSD_WIRE_STATS_SIZE, "STATS_REPLY", err);
    if (rc) return rc;
    csd_wire_put_u32(out + 0, s->open_requests);
    csd_wire_put_u32(out + 4, 0);
    const uint64_t v[8] = {s->frames_in,     s->frames_out,     s->bytes_in,   s->bytes_out,
                           s->kv_bytes_used, s->kv_bytes_total, s->forward_ns, s->forward_tokens};
    for (int i = 0; i < 8; i++) csd_wire_put_u64(out + 8 + 8 * i, v[i]);
    *len = CSD_WIRE_STATS_SIZE;
    return 0;
}

int csd_wire_decode_stats(const uint8_t *in, size_t len, csd_wire_stats *out, csd_err *err) {
    int rc = need_len(len, CSD_WIRE_STATS_SIZE, "STATS_REPLY", err);
    if (rc) return rc;
    if (csd_wire_get_u32(in + 4) != 0)
        return csd_err_set(err, CSD_EPROTO, "STATS_REPLY: reserved field must be 0");
    uint64_t v[8];
    for (int i = 0; i < 8; i++) v[i] = csd_wire_get_u64(in + 8 + 8 * i);
    csd_wire_stats s = {.open_requests = csd_wire_get_u32(in),
                        .frames_in = v[0],
                        .frames_out = v[1],
                        .bytes_in = v[2],
                        .bytes_out = v[3],
                        .kv_bytes_used = v[4],
                        .kv_bytes_total = v[5],
                        .forward_ns = v[6],
                        .forward_tokens = v[7]};
    if (s.kv_bytes_used > s.kv_bytes_total)
        return csd_err_set(err, CSD_EPROTO, "STATS_REPLY: kv_bytes_used over kv_bytes_total");
    *out = s;
    return 0;
}

int csd_wire_encode_ping(uint8_t *out, size_t cap, uint64_t stamp, size_t *len, csd_err *err) {
    int rc = need_cap(cap, CSD_WIRE_PING_SIZE, "PING", err);
    if (rc) return rc;
    csd_wire_put_u64(out, stamp);
    *len = CSD_WIRE_PING_SIZE;
    return 0;
}

int csd_wire_decode_ping(const uint8_t *in, size_t len, uint64_t *stamp, csd_err *err) {
    int rc = need_len(len, CSD_WIRE_PING_SIZE, "PING", err);
    if (rc) return rc;
    *stamp = csd_wire_get_u64(in);
    return 0;
}

/* ---- activations ---- */

int csd_wire_check_act_flags(uint16_t flags, csd_err *err) {
    if (flags & (uint16_t)~CSD_WIRE_FLAGS_ACT)
        return csd_err_set(err, CSD_EPROTO, "activation: unknown flags 0x%04x", (unsigned)flags);
    uint16_t out = flags & CSD_WIRE_FLAG_OUT_MASK;
    if (out != CSD_WIRE_FLAG_OUT_LOGITS && out != CSD_WIRE_FLAG_OUT_SAMPLE &&
        out != CSD_WIRE_FLAG_OUT_HIDDEN)
        return csd_err_set(err, CSD_EPROTO,
                           "activation: flags 0x%04x must select exactly one output",
                           (unsigned)flags);
    return 0;
}

size_t csd_wire_act_elem_size(int kind, int dtype) {
    switch (kind) {
    case CSD_WIRE_ACT_TOKENS:
    case CSD_WIRE_ACT_SAMPLED: return dtype == 0 ? 4 : 0;
    case CSD_WIRE_ACT_HIDDEN:
        if (dtype == CSD_DTYPE_F32) return 4;
        if (dtype == CSD_DTYPE_F16 || dtype == CSD_DTYPE_BF16) return 2;
        return 0;
    case CSD_WIRE_ACT_LOGITS: return dtype == CSD_DTYPE_F32 ? 4 : 0;
    default: return 0;
    }
}

/* Checks kind/dtype/n_tokens/dim against the limits; on success sets *bytes to the row bytes. */
static int check_act(int kind, int dtype, uint32_t n_tokens, uint32_t dim, size_t *bytes, int code,
                     csd_err *err) {
    size_t es = csd_wire_act_elem_size(kind, dtype);
    if (es == 0)
        return csd_err_set(err, code, "activation: kind %d (%s) with dtype %d is not allowed", kind,
                           csd_wire_act_kind_name(kind), dtype);
    if (n_tokens == 0 || n_tokens > CSD_WIRE_MAX_TOKENS)
        return csd_err_set(err, code, "activation: n_tokens %u outside [1, %u]",
                           (unsigned)n_tokens, CSD_WIRE_MAX_TOKENS);
    uint32_t max_dim = kind == CSD_WIRE_ACT_HIDDEN   ? CSD_WIRE_MAX_DIM
                       : kind == CSD_WIRE_ACT_LOGITS ? CSD_WIRE_MAX_VOCAB
                                                     : 1;
    uint32_t min_dim = 1;
    if (dim < min_dim || dim > max_dim)
        return csd_err_set(err, code, "activation %s: dim %u outside [1, %u]",
                           csd_wire_act_kind_name(kind), (unsigned)dim, (unsigned)max_dim);
    /* n_tokens <= 2^13, dim <= 2^20, es <= 4: the product fits in 2^35, no overflow in 64 bits. */
    uint64_t total = (uint64_t)n_tokens * dim * es;
    if (total > CSD_WIRE_MAX_PAYLOAD - CSD_WIRE_ACT_HDR_SIZE)
        return csd_err_set(err, code, "activation: %u x %u rows of %zu bytes exceed %u bytes",
                           (unsigned)n_tokens, (unsigned)dim, es, CSD_WIRE_MAX_PAYLOAD);
    *bytes = (size_t)total;
    return 0;
}

size_t csd_wire_act_payload_size(int kind, int dtype, uint32_t n_tokens, uint32_t dim) {
    size_t bytes;
    if (check_act(kind, dtype, n_tokens, dim, &bytes, CSD_EINVAL, NULL)) return 0;
    return CSD_WIRE_ACT_HDR_SIZE + bytes;
}

static void put_act_hdr(uint8_t *out, int kind, int dtype, uint32_t n_tokens, uint32_t dim) {
    out[0] = (uint8_t)kind;
    out[1] = (uint8_t)dtype;
    csd_wire_put_u16(out + 2, 0);
    csd_wire_put_u32(out + 4, n_tokens);
    csd_wire_put_u32(out + 8, dim);
}

int csd_wire_encode_ids(uint8_t *out, size_t cap, int kind, const uint32_t *ids,
                        uint32_t n_tokens, size_t *len, csd_err *err) {
    if (kind != CSD_WIRE_ACT_TOKENS && kind != CSD_WIRE_ACT_SAMPLED)
        return csd_err_set(err, CSD_EINVAL, "encode ids: kind %d is not tokens/sampled", kind);
    size_t bytes;
    int rc = check_act(kind, 0, n_tokens, 1, &bytes, CSD_EINVAL, err);
    if (rc) return rc;
    if ((rc = need_cap(cap, CSD_WIRE_ACT_HDR_SIZE + bytes, "encode ids", err))) return rc;
    put_act_hdr(out, kind, 0, n_tokens, 1);
    uint8_t *p = out + CSD_WIRE_ACT_HDR_SIZE;
    for (uint32_t i = 0; i < n_tokens; i++) csd_wire_put_u32(p + 4 * (size_t)i, ids[i]);
    *len = CSD_WIRE_ACT_HDR_SIZE + bytes;
    return 0;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_LE 1
#else
#define HOST_LE 0
#endif

int csd_wire_encode_rows_f32(uint8_t *out, size_t cap, int kind, int dtype, const float *x,
                             uint32_t n_tokens, uint32_t dim, size_t *len, csd_err *err) {
    if (kind != CSD_WIRE_ACT_HIDDEN && kind != CSD_WIRE_ACT_LOGITS)
        return csd_err_set(err, CSD_EINVAL, "encode rows: kind %d is not hidden/logits", kind);
    size_t bytes;
    int rc = check_act(kind, dtype, n_tokens, dim, &bytes, CSD_EINVAL, err);
    if (rc) return rc;
    if ((rc = need_cap(cap, CSD_WIRE_ACT_HDR_SIZE + bytes, "encode rows", err))) return rc;
    put_act_hdr(out, kind, dtype, n_tokens, dim);
    uint8_t *p = out + CSD_WIRE_ACT_HDR_SIZE;
    size_t n = (size_t)n_tokens * dim;
    if (dtype == CSD_DTYPE_F32) {
        if (HOST_LE) {
            memcpy(p, x, n * 4);
        } else {
            for (size_t i = 0; i < n; i++) csd_wire_put_u32(p + 4 * i, f32_bits(x[i]));
        }
    } else if (dtype == CSD_DTYPE_F16) {
        for (size_t i = 0; i < n; i++) csd_wire_put_u16(p + 2 * i, csd_f32_to_f16(x[i]));
    } else {
        for (size_t i = 0; i < n; i++) csd_wire_put_u16(p + 2 * i, csd_f32_to_bf16(x[i]));
    }
    *len = CSD_WIRE_ACT_HDR_SIZE + bytes;
    return 0;
}

int csd_wire_decode_act(const uint8_t *in, size_t len, csd_wire_act *out, csd_err *err) {
    if (len < CSD_WIRE_ACT_HDR_SIZE)
        return csd_err_set(err, CSD_EPROTO, "activation: payload %zu bytes, need at least %u", len,
                           CSD_WIRE_ACT_HDR_SIZE);
    if (csd_wire_get_u16(in + 2) != 0)
        return csd_err_set(err, CSD_EPROTO, "activation: reserved field must be 0");
    int kind = in[0], dtype = in[1];
    uint32_t n_tokens = csd_wire_get_u32(in + 4), dim = csd_wire_get_u32(in + 8);
    size_t bytes;
    int rc = check_act(kind, dtype, n_tokens, dim, &bytes, CSD_EPROTO, err);
    if (rc) return rc;
    if (len - CSD_WIRE_ACT_HDR_SIZE != bytes)
        return csd_err_set(err, CSD_EPROTO,
                           "activation %s: payload_len %zu != %u + %u rows x %zu bytes",
                           csd_wire_act_kind_name(kind), len, CSD_WIRE_ACT_HDR_SIZE,
                           (unsigned)n_tokens, bytes / n_tokens);
    out->kind = (uint8_t)kind;
    out->dtype = (uint8_t)dtype;
    out->n_tokens = n_tokens;
    out->dim = dim;
    out->data = in + CSD_WIRE_ACT_HDR_SIZE;
    out->data_bytes = bytes;
    return 0;
}

int csd_wire_act_ids(const csd_wire_act *a, uint32_t *out, uint32_t n, csd_err *err) {
    if (a->kind != CSD_WIRE_ACT_TOKENS && a->kind != CSD_WIRE_ACT_SAMPLED)
        return csd_err_set(err, CSD_EINVAL, "act ids: view holds %s, not ids",
                           csd_wire_act_kind_name(a->kind));
    if (n != a->n_tokens)
        return csd_err_set(err, CSD_EINVAL, "act ids: out has %u slots, view has %u",
                           (unsigned)n, (unsigned)a->n_tokens);
    for (uint32_t i = 0; i < n; i++) out[i] = csd_wire_get_u32(a->data + 4 * (size_t)i);
    return 0;
}

int csd_wire_act_to_f32(const csd_wire_act *a, float *out, size_t n, csd_err *err) {
    if (a->kind != CSD_WIRE_ACT_HIDDEN && a->kind != CSD_WIRE_ACT_LOGITS)
        return csd_err_set(err, CSD_EINVAL, "act to f32: view holds %s, not rows",
                           csd_wire_act_kind_name(a->kind));
    if (n != (size_t)a->n_tokens * a->dim)
        return csd_err_set(err, CSD_EINVAL, "act to f32: out has %zu floats, view has %u x %u", n,
                           (unsigned)a->n_tokens, (unsigned)a->dim);
    const uint8_t *p = a->data;
    if (a->dtype == CSD_DTYPE_F32) {
        if (HOST_LE) {
            memcpy(out, p, n * 4);
        } else {
            for (size_t i = 0; i < n; i++) out[i] = bits_f32(csd_wire_get_u32(p + 4 * i));
        }
    } else if (a->dtype == CSD_DTYPE_F16) {
        for (size_t i = 0; i < n; i++) out[i] = csd_f16_to_f32(csd_wire_get_u16(p + 2 * i));
    } else if (a->dtype == CSD_DTYPE_BF16) {
        for (size_t i = 0; i < n; i++) out[i] = csd_bf16_to_f32(csd_wire_get_u16(p + 2 * i));
    } else {
        return csd_err_set(err, CSD_EINVAL, "act to f32: dtype %d", a->dtype);
    }
    return 0;
}
