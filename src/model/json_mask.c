/* json_mask: the vocabulary's bytes in one table, and the logits mask (json_mask.h). */
#include "model/json_mask.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"

struct csd_vocab_bytes {
    int32_t n_ids;
    uint32_t *offset; /* n_ids + 1: token id's bytes are bytes[offset[id], offset[id + 1]) */
    uint8_t *bytes;
    /* n_ids: 1 when the token is whole characters of string text (no quote, backslash or control
     * byte): inside a string it is allowed and changes nothing */
    uint8_t *plain;
};

/* Gathers every token's bytes into one buffer that grows as needed (once per tokenizer). */
static int fill(csd_vocab_bytes *v, csd_token_bytes_fn fn, void *ctx, csd_err *err) {
    size_t cap = (size_t)v->n_ids * 8 + CSD_VOCAB_MAX_TOKEN_BYTES, used = 0;
    v->bytes = csd_alloc(cap);
    if (!v->bytes) return csd_err_set(err, CSD_ENOMEM, "token bytes");
    for (int32_t id = 0; id < v->n_ids; id++) {
        if (cap - used < CSD_VOCAB_MAX_TOKEN_BYTES) {
            uint8_t *more = csd_alloc(cap * 2);
            if (!more) return csd_err_set(err, CSD_ENOMEM, "token bytes");
            memcpy(more, v->bytes, used);
            csd_free(v->bytes);
            v->bytes = more;
            cap *= 2;
        }
        size_t len = 0;
        int rc = fn(ctx, id, v->bytes + used, CSD_VOCAB_MAX_TOKEN_BYTES, &len);
        if (rc == CSD_EFULL || len > CSD_VOCAB_MAX_TOKEN_BYTES) len = 0; /* too long: never used */
        else if (rc) return csd_err_set(err, rc, "the bytes of token %d", id);
        v->offset[id] = (uint32_t)used;
        used += len;
        if (used > UINT32_MAX - CSD_VOCAB_MAX_TOKEN_BYTES)
            return csd_err_set(err, CSD_ERANGE, "token bytes over 4 GiB");
    }
    v->offset[v->n_ids] = (uint32_t)used;
    return 0;
}

/* Token id's bytes, and their count in *n. */
static const uint8_t *token(const csd_vocab_bytes *v, int32_t id, uint32_t *n) {
    *n = v->offset[id + 1] - v->offset[id];
    return v->bytes + v->offset[id];
}

/* No byte that ends a string or starts an escape, and no control byte. */
static bool text_bytes(const uint8_t *p, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] == '"' || p[i] == '\\') return false;
    return true;
}

/* The plain tokens: text bytes only, and whole UTF-8 characters (inside a string the acceptor is
 * between characters again after them). */
static void mark_plain(csd_vocab_bytes *v) {
    csd_json_accept in_text;
    csd_json_accept_init(&in_text);
    csd_json_accept_bytes(&in_text, (const uint8_t *)"{\"", 2);
    for (int32_t id = 0; id < v->n_ids; id++) {
        uint32_t n;
        const uint8_t *p = token(v, id, &n);
        csd_json_accept after = in_text;
        v->plain[id] = n > 0 && text_bytes(p, n) && csd_json_accept_bytes(&after, p, n) &&
                       csd_json_accept_in_text(&after);
    }
}

int csd_vocab_bytes_create(csd_vocab_bytes **out, int32_t n_ids, csd_token_bytes_fn fn, void *ctx,
                           csd_err *err) {
    *out = NULL;
    if (n_ids <= 0) return csd_err_set(err, CSD_EINVAL, "a vocabulary of %d tokens", n_ids);
    csd_vocab_bytes *v = csd_alloc(sizeof *v);
    if (!v) return csd_err_set(err, CSD_ENOMEM, "token bytes");
    v->n_ids = n_ids;
    v->offset = csd_alloc_array((size_t)n_ids + 1, sizeof *v->offset);
    v->plain = csd_alloc((size_t)n_ids);
    int rc = v->offset && v->plain ? fill(v, fn, ctx, err)
                                   : csd_err_set(err, CSD_ENOMEM, "token offsets");
    if (!rc) mark_plain(v);
    if (rc) {
        csd_vocab_bytes_destroy(v);
        return rc;
    }
    *out = v;
    return 0;
}

void csd_vocab_bytes_destroy(csd_vocab_bytes *v) {
    if (!v) return;
    csd_free(v->plain);
    csd_free(v->offset);
    csd_free(v->bytes);
    csd_free(v);
}

static bool token_fits(const csd_json_accept *a, const csd_vocab_bytes *v, int32_t id) {
    csd_json_accept trial = *a;
    return csd_json_accept_token(&trial, v, id);
}

/* Which one- and two-byte starts can come next: one trial per byte value, and per byte after each
 * allowed first byte (outside string text, where few first bytes are allowed). */
typedef struct starts {
    bool first[256];
    bool two;                /* second[][] is filled */
    uint8_t second[256][32]; /* bit b2 of row b1: b1 b2 can come next */
} starts;

static void find_starts(const csd_json_accept *a, bool in_text, starts *st) {
    st->two = !in_text;
    for (int b = 0; b < 256; b++) {
        csd_json_accept after = *a;
        st->first[b] = csd_json_accept_byte(&after, (uint8_t)b);
        if (!st->two) continue;
        memset(st->second[b], 0, sizeof st->second[b]);
        for (int c = 0; st->first[b] && c < 256; c++) {
            csd_json_accept trial = after;
            if (csd_json_accept_byte(&trial, (uint8_t)c)) st->second[b][c >> 3] |= 1u << (c & 7);
        }
    }
}

/* Whether a token may come next, decided fast where it can be: a token whose first two bytes cannot
 * come next is out, plain text inside a string is in; the rest run through the acceptor. For
 * Qwen3's 151,669 tokens a mask then takes 0.6-1.3 ms on a Zen 3 core, where running every token
 * through the acceptor took 1.9-6.7 (docs/api.md). */
static bool allowed(const csd_json_accept *a, const csd_vocab_bytes *v, int32_t id,
                    const starts *st, bool in_text) {
    uint32_t n;
    const uint8_t *p = token(v, id, &n);
    if (n == 0 || !st->first[p[0]]) return false;
    if (in_text && v->plain[id]) return true;
    if (n >= 2 && st->two) {
        uint8_t b1 = p[0], b2 = p[1];
        if (!(st->second[b1][b2 >> 3] & (1u << (b2 & 7)))) return false;
        if (n == 2) return true;
    } else if (n == 1) {
        return true;
    }
    return token_fits(a, v, id);
}

int32_t csd_json_mask(const csd_json_accept *a, const csd_vocab_bytes *v, float *logits,
                      int32_t vocab) {
    bool in_text = csd_json_accept_in_text(a);
    starts st;
    find_starts(a, in_text, &st);
    int32_t n_allowed = 0;
    for (int32_t id = 0; id < vocab; id++) {
        if (logits[id] == -INFINITY) continue; /* already out (a logit bias of -inf, say) */
        if (id < v->n_ids && allowed(a, v, id, &st, in_text)) n_allowed++;
        else logits[id] = -INFINITY;
    }
    return n_allowed;
}

bool csd_json_accept_token(csd_json_accept *a, const csd_vocab_bytes *v, int32_t id) {
    if (id < 0 || id >= v->n_ids) return false;
    uint32_t n;
    const uint8_t *p = token(v, id, &n);
    return n > 0 && csd_json_accept_bytes(a, p, n);
}
