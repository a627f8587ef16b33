/* utf8: UTF-8 decoding exactly as the WHATWG TextDecoder does (one U+FFFD per maximal invalid
 * subpart), plus the small growable buffers the tokenizer uses. The decoder is byte-at-a-time so
 * the streaming detokenizer and whole-sequence decoding share it and cannot disagree. */
#include "tok/tok_internal.h"

#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"

int csd_tok_buf_reserve(csd_tok_buf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len) return CSD_ENOMEM;
    size_t need = b->len + extra + 1; /* room for a NUL */
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = csd_alloc(cap);
    if (!p) return CSD_ENOMEM;
    if (b->len) memcpy(p, b->p, b->len);
    csd_free(b->p);
    b->p = p;
    b->cap = cap;
    return 0;
}

int csd_tok_buf_put(csd_tok_buf *b, const void *data, size_t n) {
    int rc = csd_tok_buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

void csd_tok_buf_free(csd_tok_buf *b) {
    csd_free(b->p);
    memset(b, 0, sizeof *b);
}

int csd_tok_ids_push(csd_tok_ids *v, int32_t id) {
    int32_t *p = csd_grow(v->p, &v->cap, v->len, sizeof *p, 64);
    if (!p) return CSD_ENOMEM;
    v->p = p;
    v->p[v->len++] = id;
    return 0;
}

void csd_tok_ids_free(csd_tok_ids *v) {
    csd_free(v->p);
    memset(v, 0, sizeof *v);
}

size_t csd_tok_utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

void csd_tok_u8dec_init(csd_tok_u8dec *d) {
    d->cp = 0;
    d->errors = 0;
    d->needed = 0;
    d->seen = 0;
    d->lower = 0x80;
    d->upper = 0xBF;
}

size_t csd_tok_u8dec_feed(csd_tok_u8dec *d, uint8_t b, char *out) {
    size_t n = 0;
    if (d->needed == 0) {
        if (b < 0x80) {
            out[0] = (char)b;
            return 1;
        }
        if (b >= 0xC2 && b <= 0xDF) {
            d->needed = 1;
            d->cp = b & 0x1Fu;
        } else if (b >= 0xE0 && b <= 0xEF) {
            if (b == 0xE0) d->lower = 0xA0;
            if (b == 0xED) d->upper = 0x9F;
            d->needed = 2;
            d->cp = b & 0xFu;
        } else if (b >= 0xF0 && b <= 0xF4) {
            if (b == 0xF0) d->lower = 0x90;
            if (b == 0xF4) d->upper = 0x8F;
            d->needed = 3;
            d->cp = b & 0x7u;
        } else {
            d->errors++;
            return csd_tok_utf8_put(0xFFFD, out);
        }
        return 0;
    }
    if (b < d->lower || b > d->upper) {
        /* The sequence so far is one maximal invalid subpart; b is examined afresh. */
        uint32_t errors = d->errors + 1;
        csd_tok_u8dec_init(d);
        d->errors = errors;
        n = csd_tok_utf8_put(0xFFFD, out);
        return n + csd_tok_u8dec_feed(d, b, out + n);
    }
    d->lower = 0x80;
    d->upper = 0xBF;
    d->cp = (d->cp << 6) | (b & 0x3Fu);
    if (++d->seen == d->needed) {
        uint32_t cp = d->cp;
        d->cp = 0;
        d->needed = 0;
        d->seen = 0;
        return csd_tok_utf8_put(cp, out);
    }
    return 0;
}

size_t csd_tok_utf8_sanitize(const char *in, size_t n, char *out) {
    csd_tok_u8dec d;
    csd_tok_u8dec_init(&d);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += csd_tok_u8dec_feed(&d, (uint8_t)in[i], out + o);
    if (d.needed) o += csd_tok_utf8_put(0xFFFD, out + o);
    return o;
}

bool csd_tok_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t len = csd_utf8_seq_len(s + i, n - i);
        if (!len) return false;
        i += len;
    }
    return true;
}

size_t csd_tok_utf8_next(const char *s, size_t n, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)s;
    if (n == 0) {
        *cp = 0;
        return 0;
    }
    if (u[0] < 0x80 || n < 2) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0 || n < 4) {
        if (n < 3) {
            *cp = u[0];
            return 1;
        }
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
          ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

bool csd_tok_is_js_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000 || c == 0xFEFF;
}
