/* encode: text -> ids, in the reference's order: replace invalid UTF-8 with U+FFFD, split out added
 * tokens (leftmost-longest, lstrip/rstrip), normalize each remaining section, split out normalized
 * added tokens, pre-tokenize, BPE each piece, then add the BOS/EOS template when asked.
 * Allocates scratch per call, so one csd_tok can encode from several threads at once. */
#include "tok/tokenizer.h"

#include <string.h>

#include "core/alloc.h"
#include "tok/tok_internal.h"

typedef struct section {
    size_t off, len;
    int32_t id; /* added token id, -1 for text */
} section;

typedef struct sections {
    section *p;
    size_t n, cap;
} sections;

typedef struct enc_ctx {
    const csd_tok *tok;
    bool parse_special;
    bool first_section; /* the text being encoded is section 0 of the input */
    csd_tok_ids *out;
    csd_tok_pieces pieces, tmp;
    csd_tok_bpe_scratch bpe;
    csd_err *err;
} enc_ctx;

static int sec_push(sections *s, size_t off, size_t len, int32_t id) {
    section *p = csd_grow(s->p, &s->cap, s->n, sizeof *p, 16);
    if (!p) return CSD_ENOMEM;
    s->p = p;
    s->p[s->n++] = (section){off, len, id};
    return 0;
}

static size_t trim_end(const char *s, size_t n) {
    while (n > 0) {
        size_t k = n - 1;
        while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
        uint32_t cp;
        csd_tok_utf8_next(s + k, n - k, &cp);
        if (!csd_tok_is_js_space(cp)) break;
        n = k;
    }
    return n;
}

static size_t trim_start(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = csd_tok_utf8_next(s + i, n - i, &cp);
        if (!csd_tok_is_js_space(cp)) break;
        i += l;
    }
    return i;
}

/* Splits s into text and added-token sections (leftmost, then longest match), then applies the
 * lstrip/rstrip of each matched token to its neighbours. A neighbour that is itself an added token
 * and loses spaces is looked up again, as the reference does: text unless the shorter string names
 * an added token. */
static int split_added(const csd_tok *tok, const char *s, size_t n, bool normalized,
                       bool parse_special, sections *out) {
    out->n = 0;
    const csd_tok_trie *trie = normalized ? &tok->added_norm : &tok->added_raw;
    size_t start = 0, i = 0;
    while ((trie->n > 1 || trie->n_long) && i < n) {
        int32_t id = -1;
        size_t len = csd_tok_trie_longest(tok, trie, s + i, n - i, parse_special, &id);
        if (len == 0) {
            i++;
            continue;
        }
        if (i > start && sec_push(out, start, i - start, -1)) return CSD_ENOMEM;
        if (sec_push(out, i, len, id)) return CSD_ENOMEM;
        i += len;
        start = i;
    }
    if (start < n && sec_push(out, start, n - start, -1)) return CSD_ENOMEM;
    for (size_t k = 0; k < out->n; k++) {
        int32_t id = out->p[k].id;
        if (id < 0) continue;
        uint8_t flags = tok->id_flags[id];
        if ((flags & CSD_TOK_ID_LSTRIP) && k > 0) {
            section *before = &out->p[k - 1];
            size_t len = trim_end(s + before->off, before->len);
            if (len < before->len && before->id >= 0) /* what is left may name another, or none */
                before->id = csd_tok_added_exact(tok, s + before->off, len, parse_special);
            before->len = len;
        }
        if ((flags & CSD_TOK_ID_RSTRIP) && k + 1 < out->n) {
            section *after = &out->p[k + 1];
            size_t cut = trim_start(s + after->off, after->len);
            after->off += cut;
            after->len -= cut;
            if (cut && after->id >= 0) /* its own strips then apply to what follows it */
                after->id = csd_tok_added_exact(tok, s + after->off, after->len, parse_special);
        }
    }
    return 0;
}

/* Pre-tokenizes and BPE-encodes one section that holds no added token. */
static int encode_model(enc_ctx *c, const char *s, size_t n) {
    const csd_tok *tok = c->tok;
    int rc = csd_tok_pretokenize(tok, s, n, c->first_section, &c->pieces, &c->tmp, c->err);
    if (rc) return rc;
    size_t first = c->out->len;
    for (size_t i = 0; i < c->pieces.n; i++) {
        rc = csd_tok_bpe_word(tok, c->pieces.text.p + c->pieces.off[i], c->pieces.len[i], &c->bpe,
                              c->out);
        if (rc)
            return csd_err_set(c->err, rc, "BPE failed on a piece of %zu bytes", c->pieces.len[i]);
    }
    if (tok->fuse_unk && tok->unk_id >= 0) { /* runs of unk become one unk */
        size_t w = first;
        for (size_t r = first; r < c->out->len; r++) {
            if (c->out->p[r] == tok->unk_id && w > first && c->out->p[w - 1] == tok->unk_id)
                continue;
            c->out->p[w++] = c->out->p[r];
        }
        c->out->len = w;
    }
    return 0;
}

static int encode_text_section(enc_ctx *c, const char *s, size_t n) {
    const csd_tok *tok = c->tok;
    csd_tok_buf norm = {0};
    sections subs = {0};
    int rc = 0;
    if (tok->n_norm) {
        rc = csd_tok_normalize(tok, s, n, &norm);
        if (rc) {
            rc = csd_err_set(c->err, rc, "normalizing %zu bytes failed", n);
            goto done;
        }
        s = norm.p ? norm.p : "";
        n = norm.len;
    }
    if (n == 0) goto done;
    if (!tok->any_normalized_added) {
        rc = encode_model(c, s, n);
        goto done;
    }
    rc = split_added(tok, s, n, true, c->parse_special, &subs);
    for (size_t i = 0; i < subs.n && !rc; i++) {
        const section *q = &subs.p[i];
        if (q->len == 0) continue;
        int32_t id =
            q->id >= 0 ? q->id : csd_tok_added_exact(tok, s + q->off, q->len, c->parse_special);
        rc = id >= 0 ? csd_tok_ids_push(c->out, id) : encode_model(c, s + q->off, q->len);
    }
done:
    csd_tok_buf_free(&norm);
    csd_free(subs.p);
    return rc;
}

int csd_tok_encode(const csd_tok *tok, const char *text, size_t len, bool add_special,
                   bool parse_special, int32_t **ids, size_t *n_ids, csd_err *err) {
    *ids = NULL;
    *n_ids = 0;
    if (len > CSD_TOK_MAX_INPUT)
        return csd_err_set(err, CSD_ERANGE, "text of %zu bytes is too long", len);
    if (!text && len) return csd_err_set(err, CSD_EINVAL, "NULL text");
    char *clean = NULL;
    if (len && !csd_tok_utf8_valid(text, len)) {
        /* invalid UTF-8 is read as TextDecoder reads it: each maximal invalid subpart -> U+FFFD */
        clean = csd_alloc(len * 3 + 1);
        if (!clean) return csd_err_set(err, CSD_ENOMEM, "out of memory");
        len = csd_tok_utf8_sanitize(text, len, clean);
        text = clean;
    }
    csd_tok_ids out = {0};
    sections secs = {0};
    enc_ctx c = {.tok = tok, .parse_special = parse_special, .out = &out, .err = err};
    int rc = 0;
    for (size_t i = 0; add_special && i < tok->n_prefix && !rc; i++)
        rc = csd_tok_ids_push(&out, tok->prefix[i]);
    if (!rc && len) rc = split_added(tok, text, len, false, parse_special, &secs);
    for (size_t i = 0; i < secs.n && !rc; i++) {
        const section *q = &secs.p[i];
        if (q->len == 0) continue;
        int32_t id =
            q->id >= 0 ? q->id : csd_tok_added_exact(tok, text + q->off, q->len, parse_special);
        c.first_section = i == 0;
        rc = id >= 0 ? csd_tok_ids_push(&out, id) : encode_text_section(&c, text + q->off, q->len);
    }
    for (size_t i = 0; add_special && i < tok->n_suffix && !rc; i++)
        rc = csd_tok_ids_push(&out, tok->suffix[i]);
    csd_tok_pieces_free(&c.pieces);
    csd_tok_pieces_free(&c.tmp);
    csd_tok_bpe_scratch_free(&c.bpe);
    csd_free(secs.p);
    csd_free(clean);
    if (rc) {
        csd_tok_ids_free(&out);
        return err && err->code ? rc : csd_err_set(err, rc, "encoding failed");
    }
    if (!out.p) {
        out.p = csd_alloc(sizeof(int32_t));
        if (!out.p) return csd_err_set(err, CSD_ENOMEM, "out of memory");
    }
    *ids = out.p;
    *n_ids = out.len;
    return 0;
}
