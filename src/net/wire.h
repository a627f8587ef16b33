/* wire: the Cascadia frame format as pure encode/decode functions over byte buffers (no sockets).
 * Mirrors docs/protocol.md field for field: a fixed 20-byte little-endian header, then a payload
 * whose layout depends on the type. Every length and count from a peer is checked against a named
 * limit before it is used; decoders never allocate and return CSD_EPROTO with a message on bad
 * input. Link framing (checksum or AEAD trailer) lives in conn.c and the handshake in
 * conn_handshake.c; this file knows frames only. */
#ifndef CSD_NET_WIRE_H
#define CSD_NET_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* ---- constants (docs/protocol.md "Limits") ---- */

#define CSD_WIRE_MAGIC 0xCA5Cu  /* first two bytes on the wire: 5C CA */
#define CSD_WIRE_VERSION 1u     /* bump on any layout change; add a changelog line to the spec */
#define CSD_WIRE_HDR_SIZE 20u   /* fixed header size in bytes */

#define CSD_WIRE_MAX_PAYLOAD (64u << 20)  /* 64 MiB: largest payload of any frame */
#define CSD_WIRE_MAX_TOKENS 8192u         /* rows in one FORWARD/RESULT (prompt chunk) */
#define CSD_WIRE_MAX_DIM 65536u           /* hidden-state width (elements per row) */
#define CSD_WIRE_MAX_VOCAB (1u << 20)     /* logits row width */
#define CSD_WIRE_MAX_CONTEXT (1u << 22)   /* OPEN max_context upper bound (tokens) */
#define CSD_WIRE_MAX_ERROR_TEXT 1024u     /* ERROR text bytes (not NUL-terminated on the wire) */
#define CSD_WIRE_HASH_SIZE 32u            /* model hash bytes */
#define CSD_WIRE_NONCE_SIZE 32u           /* handshake nonce bytes */
#define CSD_WIRE_ANY 0xFFFFFFFFu /* HELLO wildcard for stage_index, layer_begin, layer_end */
/* A connected coordinator PINGs every stage at least this often; a worker takes a coordinator it
 * has heard nothing from for three of these to be gone (docs/protocol.md "Topology"). */
#define CSD_WIRE_KEEPALIVE_MS 15000u
#define CSD_WIRE_MAX_ROUTE 255u           /* ROUTE address bytes ("host:port") */

/* Fixed payload sizes. */
#define CSD_WIRE_HELLO_SIZE 84u
#define CSD_WIRE_AUTH_SIZE 32u
/* Largest frame payload a handshake takes (HELLO, HELLO_OK, AUTH, or an ERROR with its text). */
#define CSD_WIRE_HANDSHAKE_MAX_PAYLOAD (6u + CSD_WIRE_MAX_ERROR_TEXT)
#define CSD_WIRE_OPEN_SIZE 32u
#define CSD_WIRE_ACT_HDR_SIZE 12u
#define CSD_WIRE_TRUNCATE_SIZE 4u
#define CSD_WIRE_COPY_PREFIX_SIZE 8u
#define CSD_WIRE_STATS_SIZE 72u
#define CSD_WIRE_PING_SIZE 8u
#define CSD_WIRE_ERROR_HDR_SIZE 6u
#define CSD_WIRE_ROUTE_HDR_SIZE 2u

/* Message types: explicit values, append only; a removed value stays as a comment. */
enum csd_wire_type {
    /* 0: never valid (catches zeroed buffers) */
    CSD_WIRE_HELLO = 1,        /* client -> server, first frame: who I am, what I expect */
    CSD_WIRE_HELLO_OK = 2,     /* server -> client: who I am (same layout as HELLO) */
    CSD_WIRE_ERROR = 3,        /* either way: {code, text}; for a request or the whole link */
    CSD_WIRE_AUTH = 4,         /* either way, first encrypted frame: proves the fleet key */
    CSD_WIRE_OPEN = 5,         /* open request_id: max context, dtype, sampling */
    CSD_WIRE_FORWARD = 6,      /* token ids or hidden states for [position, position+n) */
    CSD_WIRE_RESULT = 7,       /* hidden states to the next stage, or logits / sampled ids */
    CSD_WIRE_TRUNCATE = 8,     /* cut request_id's KV to keep_tokens (speculative decoding) */
    CSD_WIRE_CLOSE = 9,        /* free request_id everywhere */
    CSD_WIRE_STATS = 10,       /* ask for counters (empty payload) */
    CSD_WIRE_STATS_REPLY = 11, /* counters */
    CSD_WIRE_PING = 12,        /* liveness: u64 echoed back in PONG */
    CSD_WIRE_PONG = 13,
    CSD_WIRE_ROUTE = 14, /* coordinator -> stage: send your RESULTs to the stage at "host:port" */
    CSD_WIRE_COPY_PREFIX =
        15, /* request_id gets the first n positions of another request (prefix cache) */
    CSD_WIRE_TYPE_COUNT = 16
};

/* FORWARD/RESULT header flags: what the last stage returns. Exactly one OUT_* bit is set;
 * RESULT frames carry the flags of the FORWARD they answer so every stage knows the request. */
#define CSD_WIRE_FLAG_OUT_LOGITS 0x0001u  /* last stage returns f32 logits */
#define CSD_WIRE_FLAG_OUT_SAMPLE 0x0002u  /* last stage returns sampled token ids */
#define CSD_WIRE_FLAG_OUT_HIDDEN 0x0004u  /* last stage returns final hidden states */
#define CSD_WIRE_FLAG_ALL_TOKENS 0x0008u  /* for every row, not only the last one */
#define CSD_WIRE_FLAG_BATCH_MORE 0x0010u  /* another FORWARD of the same batch follows on this link:
                                           * the receiver may run them as one batched forward */
#define CSD_WIRE_FLAG_OUT_MASK 0x0007u
#define CSD_WIRE_FLAGS_ACT 0x001Fu        /* all flags valid on FORWARD/RESULT */

/* HELLO capability bits. CSD_WIRE_CAP_INSECURE must agree on both sides; others are
 * informational. */
#define CSD_WIRE_CAP_INSECURE 0x0001u     /* link has no encryption, xxhash64 per frame only */
#define CSD_WIRE_CAP_HIDDEN_F32 0x0002u   /* can send/receive f32 hidden states */
#define CSD_WIRE_CAP_HIDDEN_BF16 0x0004u  /* can send/receive bf16 hidden states */
#define CSD_WIRE_CAP_SAMPLE 0x0008u       /* can sample (last stage) */
#define CSD_WIRE_CAP_TRUNCATE 0x0010u     /* supports TRUNCATE */

/* OPEN options. */
#define CSD_WIRE_OPEN_GREEDY 0x0001u      /* ignore temperature/top_p/top_k: argmax */
#define CSD_WIRE_OPEN_MASK 0x0001u

enum csd_wire_role {
    /* 0: invalid */
    CSD_WIRE_ROLE_COORD = 1,  /* the coordinator */
    CSD_WIRE_ROLE_STAGE = 2,  /* a worker serving a layer range */
    CSD_WIRE_ROLE_COUNT = 3
};

enum csd_wire_act_kind {
    CSD_WIRE_ACT_TOKENS = 0,  /* u32 token ids, dim 1 (stage 0 input) */
    CSD_WIRE_ACT_HIDDEN = 1,  /* hidden states, dtype f32/f16/bf16, [n_tokens x dim] */
    CSD_WIRE_ACT_LOGITS = 2,  /* f32 logits [n_tokens x vocab] */
    CSD_WIRE_ACT_SAMPLED = 3, /* u32 sampled ids, dim 1 */
    CSD_WIRE_ACT_KIND_COUNT = 4
};

/* ---- types ---- */

/* The header; magic and the reserved u16 are implied (written as constants, checked on decode). */
typedef struct csd_wire_hdr {
    uint8_t version;      /* CSD_WIRE_VERSION */
    uint8_t type;         /* enum csd_wire_type */
    uint16_t flags;       /* per type; unknown bits refused */
    uint32_t request_id;  /* 0 for link-level frames */
    uint32_t position;    /* first token position of FORWARD/RESULT, else 0 */
    uint32_t payload_len; /* bytes after the header, <= CSD_WIRE_MAX_PAYLOAD */
} csd_wire_hdr;

typedef struct csd_wire_hello {
    uint16_t proto_version;                 /* CSD_WIRE_VERSION */
    uint8_t role;                           /* enum csd_wire_role of the sender */
    uint32_t caps;                          /* CSD_WIRE_CAP_* */
    uint32_t stage_index;                   /* or CSD_WIRE_ANY in a client's expectation */
    uint32_t layer_begin;                   /* [begin, end); either may be CSD_WIRE_ANY in an */
    uint32_t layer_end;                     /* expectation (e.g. "starts at 12, ends anywhere") */
    uint8_t model_hash[CSD_WIRE_HASH_SIZE]; /* identity of the weights (shard manifest hash) */
    uint8_t nonce[CSD_WIRE_NONCE_SIZE];     /* fresh random per connection (session keys) */
} csd_wire_hello;

typedef struct csd_wire_error {
    int32_t code;                               /* a CSD_E* value */
    char text[CSD_WIRE_MAX_ERROR_TEXT + 1];     /* NUL-terminated, control bytes replaced by '?' */
} csd_wire_error;

typedef struct csd_wire_open {
    uint32_t max_context; /* tokens of KV to reserve, 1..CSD_WIRE_MAX_CONTEXT */
    uint32_t options;     /* CSD_WIRE_OPEN_* */
    uint8_t hidden_dtype; /* CSD_DTYPE_F16 (default), F32 or BF16 between stages */
    float temperature;    /* >= 0, finite */
    float top_p;          /* (0, 1] */
    uint32_t top_k;       /* 0 = off */
    uint64_t seed;        /* sampler seed */
} csd_wire_open;

/* An activation payload: decode gives a borrowed view into the payload bytes. */
typedef struct csd_wire_act {
    uint8_t kind;         /* enum csd_wire_act_kind */
    uint8_t dtype;        /* CSD_DTYPE_* for HIDDEN/LOGITS; 0 for TOKENS/SAMPLED */
    uint32_t n_tokens;    /* rows, 1..CSD_WIRE_MAX_TOKENS */
    uint32_t dim;         /* elements per row: 1 for ids, hidden width, or vocab */
    const uint8_t *data;  /* borrowed: little-endian rows, valid while the payload buffer is */
    size_t data_bytes;    /* n_tokens * dim * element size */
} csd_wire_act;

typedef struct csd_wire_stats {
    uint32_t open_requests;
    uint64_t frames_in, frames_out;
    uint64_t bytes_in, bytes_out;
    uint64_t kv_bytes_used, kv_bytes_total;
    uint64_t forward_ns;      /* total time spent in forward */
    uint64_t forward_tokens;  /* total rows forwarded */
} csd_wire_stats;

/* ---- little-endian helpers ---- */

static inline void csd_wire_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void csd_wire_put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline void csd_wire_put_u64(uint8_t *p, uint64_t v) {
    csd_wire_put_u32(p, (uint32_t)v);
    csd_wire_put_u32(p + 4, (uint32_t)(v >> 32));
}
static inline uint16_t csd_wire_get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t csd_wire_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t csd_wire_get_u64(const uint8_t *p) {
    return (uint64_t)csd_wire_get_u32(p) | ((uint64_t)csd_wire_get_u32(p + 4) << 32);
}

/* ---- names ---- */

const char *csd_wire_type_name(int type);
const char *csd_wire_role_name(int role);
const char *csd_wire_act_kind_name(int kind);

/* ---- header ---- */

/* Builds a header for the current version. */
csd_wire_hdr csd_wire_hdr_make(int type, uint16_t flags, uint32_t request_id, uint32_t position,
                               uint32_t payload_len);
/* Writes exactly CSD_WIRE_HDR_SIZE bytes. Refuses (CSD_EINVAL) what decode would refuse. */
int csd_wire_encode_hdr(uint8_t out[CSD_WIRE_HDR_SIZE], const csd_wire_hdr *h, csd_err *err);
/* Parses and validates a header: magic, version, reserved == 0, known type, flags allowed for the
 * type, payload_len within the type's bounds and CSD_WIRE_MAX_PAYLOAD. len < 20 is CSD_EPROTO.
 * On a version mismatch the message names both versions. */
int csd_wire_decode_hdr(const uint8_t *in, size_t len, csd_wire_hdr *out, csd_err *err);

/* ---- payloads: encode writes into out[cap] and sets *len; decode checks len exactly ---- */

int csd_wire_encode_hello(uint8_t *out, size_t cap, const csd_wire_hello *h, size_t *len,
                          csd_err *err);
int csd_wire_decode_hello(const uint8_t *in, size_t len, csd_wire_hello *out, csd_err *err);

/* Text longer than CSD_WIRE_MAX_ERROR_TEXT is cut. */
int csd_wire_encode_error(uint8_t *out, size_t cap, int32_t code, const char *text, size_t *len,
                          csd_err *err);
int csd_wire_decode_error(const uint8_t *in, size_t len, csd_wire_error *out, csd_err *err);

int csd_wire_encode_open(uint8_t *out, size_t cap, const csd_wire_open *o, size_t *len,
                         csd_err *err);
int csd_wire_decode_open(const uint8_t *in, size_t len, csd_wire_open *out, csd_err *err);
/* Defaults: f16 hidden, greedy, temperature 1, top_p 1, top_k 0, seed 0. */
csd_wire_open csd_wire_open_default(uint32_t max_context);

int csd_wire_encode_truncate(uint8_t *out, size_t cap, uint32_t keep_tokens, size_t *len,
                             csd_err *err);
int csd_wire_decode_truncate(const uint8_t *in, size_t len, uint32_t *keep_tokens, csd_err *err);

int csd_wire_encode_stats(uint8_t *out, size_t cap, const csd_wire_stats *s, size_t *len,
                          csd_err *err);
int csd_wire_decode_stats(const uint8_t *in, size_t len, csd_wire_stats *out, csd_err *err);

/* ROUTE: the next stage's address, printable ASCII "host:port", 1..CSD_WIRE_MAX_ROUTE bytes.
 * decode writes it NUL-terminated into addr[addr_cap] (addr_cap > CSD_WIRE_MAX_ROUTE always
 * fits). */
int csd_wire_encode_route(uint8_t *out, size_t cap, const char *addr, size_t *len, csd_err *err);
int csd_wire_decode_route(const uint8_t *in, size_t len, char *addr, size_t addr_cap,
                          csd_err *err);

/* COPY_PREFIX: request_id (already open) takes the first n_tokens positions of src_request's KV
 * cache, in every stage: a prompt prefix computed once serves every request that shares it. */
int csd_wire_encode_copy_prefix(uint8_t *out, size_t cap, uint32_t src_request, uint32_t n_tokens,
                                size_t *len, csd_err *err);
int csd_wire_decode_copy_prefix(const uint8_t *in, size_t len, uint32_t *src_request,
                                uint32_t *n_tokens, csd_err *err);

/* PING and PONG carry one u64 (the sender's clock, echoed). */
int csd_wire_encode_ping(uint8_t *out, size_t cap, uint64_t stamp, size_t *len, csd_err *err);
int csd_wire_decode_ping(const uint8_t *in, size_t len, uint64_t *stamp, csd_err *err);

/* ---- activations (FORWARD / RESULT payloads) ---- */

/* Bytes of one element of kind/dtype, or 0 if the combination is invalid. */
size_t csd_wire_act_elem_size(int kind, int dtype);
/* Full payload size (12-byte activation header + rows), or 0 if invalid or over the limits. */
size_t csd_wire_act_payload_size(int kind, int dtype, uint32_t n_tokens, uint32_t dim);

/* u32 ids (kind TOKENS or SAMPLED), dim 1. */
int csd_wire_encode_ids(uint8_t *out, size_t cap, int kind, const uint32_t *ids,
                        uint32_t n_tokens, size_t *len, csd_err *err);
/* f32 rows [n_tokens x dim] converted to dtype (HIDDEN: f32/f16/bf16; LOGITS: f32 only). */
int csd_wire_encode_rows_f32(uint8_t *out, size_t cap, int kind, int dtype, const float *x,
                             uint32_t n_tokens, uint32_t dim, size_t *len, csd_err *err);
/* Validates the activation header and payload_len == 12 + n_tokens * dim * elem_size. */
int csd_wire_decode_act(const uint8_t *in, size_t len, csd_wire_act *out, csd_err *err);
/* Copies ids out of a TOKENS/SAMPLED view; n must equal a->n_tokens. */
int csd_wire_act_ids(const csd_wire_act *a, uint32_t *out, uint32_t n, csd_err *err);
/* Converts a HIDDEN/LOGITS view to f32; n must equal n_tokens * dim. */
int csd_wire_act_to_f32(const csd_wire_act *a, float *out, size_t n, csd_err *err);

/* Checks FORWARD/RESULT flags: exactly one OUT_* bit, no unknown bits. */
int csd_wire_check_act_flags(uint16_t flags, csd_err *err);

#endif
