/* detok: ids -> text. Whole-sequence decoding is the streaming detokenizer run over every id, so
 * the two can never disagree; a token's raw bytes (csd_tok_token_bytes) come from the same step.
 * Bytes (byte-level pieces, <0xXX> fallback pieces) go through the WHATWG UTF-8 decoder: an
 * unfinished character is held back, an invalid one becomes U+FFFD exactly where the reference's
 * TextDecoder puts it. Writes only into the caller's buffer: no allocation per token. */
#include "tok/tokenizer.h"

#include <string.h>

#include "core/alloc.h"
#include "tok/tok_internal.h"

typedef struct sink {
    char *p;
    size_t len, cap;
    csd_tok_buf *grow; /* when set, text goes here instead of p */
    bool raw;          /* bytes as they are, not UTF-8 decoded (csd_tok_token_bytes) */
    bool earlier;      /* the step began with an earlier id's unfinished character */
    size_t carried;    /* bytes at the start of p that ended it (csd_detok.carried) */
    int rc;
} sink;

static void put(sink *s, const char *data, size_t n) {
    if (s->rc || n == 0) return;
    if (s->grow) {
        s->rc = csd_tok_buf_put(s->grow, data, n);
        return;
    }
    if (s->len + n + 1 > s->cap) {
        s->rc = CSD_EFULL;
        return;
    }
    memcpy(s->p + s->len, data, n);
    s->len += n;
}

/* Text after decoding: the decoder's Strip removes a leading space of the whole output. */
static void emit(csd_detok *d, sink *s, const char *t, size_t n) {
    if (n == 0) return;
    if (d->at_start) {
        if (d->tok->dec_strip_start && t[0] == ' ') {
            t++;
            n--;
        }
        d->at_start = false;
    }
    put(s, t, n);
}

/* An earlier id's unfinished character was broken: its U+FFFD, the first text of this step, is
 * that id's text, not this one's. */
static void note_broken(sink *s) {
    if (s->earlier && s->len == 0) s->carried = 3;
}

static void flush_pending(csd_detok *d, sink *s) {
    if (d->n_pending == 0) return;
    d->n_pending = 0;
    note_broken(s);
    emit(d, s, "\xEF\xBF\xBD", 3); /* an unfinished character at the end of a byte run */
}

static void feed_byte(csd_detok *d, sink *s, uint8_t b) {
    if (s->raw) {
        emit(d, s, (const char *)&b, 1);
        return;
    }
    csd_tok_u8dec dec;
    csd_tok_u8dec_init(&dec);
    char tmp[16];
    for (size_t i = 0; i < d->n_pending; i++) csd_tok_u8dec_feed(&dec, d->pending[i], tmp);
    uint32_t errors = dec.errors;
    bool open = dec.needed > 0;
    size_t n = csd_tok_u8dec_feed(&dec, b, tmp);
    if (open && dec.errors > errors) note_broken(s); /* b did not continue it */
    if (dec.needed) {
        /* the unfinished character is its lead byte and the continuation bytes seen so far */
        uint8_t all[CSD_DETOK_MAX_PENDING + 1];
        memcpy(all, d->pending, d->n_pending);
        all[d->n_pending] = b;
        size_t keep = (size_t)dec.seen + 1;
        memmove(d->pending, all + d->n_pending + 1 - keep, keep);
        d->n_pending = keep;
    } else {
        d->n_pending = 0;
    }
    emit(d, s, tmp, n);
}

static void emit_replaced(csd_detok *d, sink *s, const char *t) {
    const char *from = d->tok->dec_from, *to = d->tok->dec_to;
    size_t fl = from ? strlen(from) : 0, tl = to ? strlen(to) : 0;
    if (!fl) {
        emit(d, s, t, strlen(t));
        return;
    }
    for (;;) {
        const char *hit = strstr(t, from);
        if (!hit) break;
        emit(d, s, t, (size_t)(hit - t));
        emit(d, s, to, tl);
        t = hit + fl;
    }
    emit(d, s, t, strlen(t));
}

static bool kept(const csd_detok *d, int32_t id) {
    for (int i = 0; i < CSD_DETOK_MAX_KEEP; i++)
        if (d->keep[i] == id) return true;
    return false;
}

static int step(csd_detok *d, int32_t id, sink *s) {
    const csd_tok *tok = d->tok;
    if (id < 0 || id >= tok->n_ids || tok->id_sym[id] < 0) return CSD_ERANGE;
    uint8_t flags = tok->id_flags[id];
    if (d->skip_special && (flags & CSD_TOK_ID_SPECIAL) && !kept(d, id)) return 0;
    s->earlier = d->n_pending > 0;
    const char *piece = csd_tok_strtab_get(&tok->syms, (uint32_t)tok->id_sym[id]);
    size_t plen = tok->syms.slen[tok->id_sym[id]];
    switch (tok->dec_kind) {
    case CSD_TOK_DEC_BYTELEVEL:
        if (flags & CSD_TOK_ID_ADDED) { /* added tokens are written as they are */
            flush_pending(d, s);
            emit(d, s, piece, plen);
            break;
        }
        for (size_t i = 0; i < plen;) {
            uint32_t cp;
            i += csd_tok_utf8_next(piece + i, plen - i, &cp);
            int b = csd_tok_bytelevel_byte(cp);
            feed_byte(d, s, (uint8_t)(b < 0 ? 0 : b)); /* the reference reads unknown chars as 0 */
        }
        break;
    case CSD_TOK_DEC_SP:
        if (tok->dec_byte_fallback && (flags & CSD_TOK_ID_BYTE)) {
            feed_byte(d, s, tok->id_byte[id]);
            break;
        }
        flush_pending(d, s);
        emit_replaced(d, s, piece);
        break;
    default: /* no decoder: pieces joined by spaces */
        if (!d->at_start) put(s, " ", 1);
        d->at_start = false;
        put(s, piece, plen);
        break;
    }
    return s->rc;
}

void csd_detok_init(csd_detok *d, const csd_tok *tok, bool skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
    for (int i = 0; i < CSD_DETOK_MAX_KEEP; i++) d->keep[i] = -1;
    d->at_start = true;
}

void csd_detok_keep(csd_detok *d, int32_t id) {
    for (int i = 0; i < CSD_DETOK_MAX_KEEP && id >= 0; i++) {
        if (d->keep[i] == id) return;
        if (d->keep[i] < 0) {
            d->keep[i] = id;
            return;
        }
    }
}

int csd_detok_push(csd_detok *d, int32_t id, char *out, size_t cap, size_t *out_len) {
    *out_len = 0;
    if (cap == 0) return CSD_EFULL;
    csd_detok saved = *d;
    sink s = {.p = out, .cap = cap};
    int rc = step(d, id, &s);
    if (rc) {
        *d = saved; /* nothing consumed: the caller may retry with more room */
        d->carried = 0;
        out[0] = '\0';
        return rc;
    }
    out[s.len] = '\0';
    *out_len = s.len;
    d->carried = s.carried;
    return 0;
}

int csd_detok_flush(csd_detok *d, char *out, size_t cap, size_t *out_len) {
    *out_len = 0;
    if (cap == 0) return CSD_EFULL;
    csd_detok saved = *d;
    sink s = {.p = out, .cap = cap};
    flush_pending(d, &s);
    d->carried = 0; /* the text is earlier ids' alone */
    if (s.rc) {
        *d = saved;
        out[0] = '\0';
        return s.rc;
    }
    out[s.len] = '\0';
    *out_len = s.len;
    return 0;
}

int csd_tok_token_bytes(const csd_tok *tok, int32_t id, uint8_t *out, size_t cap, size_t *len) {
    *len = 0;
    if (id >= 0 && id < tok->n_ids && tok->id_sym[id] < 0) return 0; /* a hole in the ids */
    csd_detok d; /* in the middle of a text: no leading-space strip */
    csd_detok_init(&d, tok, true);
    d.at_start = false;
    sink s = {.p = (char *)out, .cap = cap + 1, .raw = true}; /* (put keeps room for a NUL) */
    int rc = step(&d, id, &s);
    if (!rc) *len = s.len;
    return rc;
}

int csd_tok_decode(const csd_tok *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
                   csd_err *err) {
    return csd_tok_decode_len(tok, ids, n, skip_special, text, NULL, err);
}

int csd_tok_decode_len(const csd_tok *tok, const int32_t *ids, size_t n, bool skip_special,
                       char **text, size_t *len, csd_err *err) {
    *text = NULL;
    if (len) *len = 0;
    csd_detok d;
    csd_detok_init(&d, tok, skip_special);
    csd_tok_buf b = {0};
    sink s = {.grow = &b};
    for (size_t i = 0; i < n; i++) {
        int rc = step(&d, ids[i], &s);
        if (rc) {
            csd_tok_buf_free(&b);
            return rc == CSD_ERANGE ? csd_err_set(err, rc,
                                                  "token id %d at position %zu is out of range "
                                                  "(vocabulary %d)",
                                                  ids[i], i, tok->n_ids)
                                    : csd_err_set(err, rc, "out of memory decoding");
        }
    }
    flush_pending(&d, &s);
    if (!s.rc && !b.p) s.rc = csd_tok_buf_reserve(&b, 0);
    if (s.rc) {
        csd_tok_buf_free(&b);
        return csd_err_set(err, s.rc, "out of memory decoding");
    }
    b.p[b.len] = '\0';
    *text = b.p;
    if (len) *len = b.len;
    return 0;
}

int csd_tok_check_pieces(const csd_tok *tok, csd_err *err) {
    /* each id alone, into a buffer short of CSD_DETOK_PIECE_MAX by more than an earlier token's
     * unfinished character (one U+FFFD) and a separating space can add */
    size_t cap = CSD_DETOK_PIECE_MAX - 16;
    char *text = csd_alloc(cap);
    if (!text) return csd_err_set(err, CSD_ENOMEM, "tokenizer piece check");
    int rc = 0;
    for (int32_t id = 0; id < tok->n_ids && !rc; id++) {
        if (tok->id_sym[id] < 0) continue;
        csd_detok d;
        csd_detok_init(&d, tok, false);
        d.at_start = false;
        sink s = {.p = text, .cap = cap};
        if (step(&d, id, &s) == CSD_EFULL)
            rc = csd_err_set(err, CSD_EUNSUPPORTED,
                             "tokenizer.json: token %d decodes to more than %zu bytes (the most "
                             "supported)",
                             id, cap - 1);
    }
    csd_free(text);
    return rc;
}
