/* token_bytes: the bytes one token adds to a decoded text, before UTF-8 decoding (a byte-level or
 * byte-fallback token may hold part of a character). It follows detok.c's step for a token in the
 * middle of a text: no leading-space strip, no held-back bytes. Constrained decoding (json_mask.h)
 * checks these bytes against a grammar. */
#include "tok/tokenizer.h"

#include <string.h>

#include "tok/tok_internal.h"

typedef struct out_buf {
    uint8_t *p;
    size_t len, cap;
    bool full;
} out_buf;

static void put(out_buf *o, const void *data, size_t n) {
    if (o->full || o->len + n > o->cap) {
        o->full = true;
        return;
    }
    memcpy(o->p + o->len, data, n);
    o->len += n;
}

/* A SentencePiece piece with the decoder's replacement (U+2581 -> space). */
static void put_replaced(const csd_tok *tok, out_buf *o, const char *t, size_t n) {
    const char *from = tok->dec_from, *to = tok->dec_to;
    size_t fl = from ? strlen(from) : 0, tl = to ? strlen(to) : 0;
    while (fl && n >= fl) {
        const char *hit = NULL;
        for (size_t i = 0; i + fl <= n && !hit; i++)
            if (!memcmp(t + i, from, fl)) hit = t + i;
        if (!hit) break;
        put(o, t, (size_t)(hit - t));
        put(o, to, tl);
        n -= (size_t)(hit - t) + fl;
        t = hit + fl;
    }
    put(o, t, n);
}

int csd_tok_token_bytes(const csd_tok *tok, int32_t id, uint8_t *out, size_t cap, size_t *len) {
    *len = 0;
    if (id < 0 || id >= tok->n_ids) return CSD_ERANGE;
    if (tok->id_sym[id] < 0 || (tok->id_flags[id] & CSD_TOK_ID_SPECIAL)) return 0;
    const char *piece = csd_tok_strtab_get(&tok->syms, (uint32_t)tok->id_sym[id]);
    size_t plen = tok->syms.slen[tok->id_sym[id]];
    out_buf o = {out, 0, cap, false};
    if (tok->dec_kind == CSD_TOK_DEC_BYTELEVEL && !(tok->id_flags[id] & CSD_TOK_ID_ADDED)) {
        for (size_t i = 0; i < plen;) {
            uint32_t cp;
            i += csd_tok_utf8_next(piece + i, plen - i, &cp);
            int b = csd_tok_bytelevel_byte(cp);
            uint8_t byte = (uint8_t)(b < 0 ? 0 : b); /* as detok reads an unknown char */
            put(&o, &byte, 1);
        }
    } else if (tok->dec_kind == CSD_TOK_DEC_BYTELEVEL) {
        put(&o, piece, plen); /* an added token is written as it is */
    } else if (tok->dec_kind == CSD_TOK_DEC_SP) {
        if (tok->dec_byte_fallback && (tok->id_flags[id] & CSD_TOK_ID_BYTE))
            put(&o, &tok->id_byte[id], 1);
        else
            put_replaced(tok, &o, piece, plen);
    } else { /* no decoder: pieces joined by spaces */
        put(&o, " ", 1);
        put(&o, piece, plen);
    }
    if (o.full) return CSD_EFULL;
    *len = o.len;
    return 0;
}
