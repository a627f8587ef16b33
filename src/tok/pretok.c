/* pretok: the pre-tokenizers (Split by a regex or a literal string, ByteLevel) turning one
 * normalized text section into the pieces BPE sees. Regexes are written for Oniguruma and run by
 * the reference as translated JavaScript; we translate them for PCRE2 (UTF + UCP, JIT when
 * available) so the few constructs where the engines disagree (\s, (?i:...)) behave as in the
 * reference. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok/tok_internal.h"

#include <pcre2.h>
#include <string.h>

#include "core/alloc.h"

/* Unicode White_Space (what the reference uses for \s in tokenizer.json patterns). */
#define WS_CLASS_BODY      \
    "\\t\\n\\x{0B}\\f\\r " \
    "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
/* JavaScript's own \s (used by the ByteLevel pre-tokenizer's built-in GPT-2 regex). */
#define JS_WS_CLASS_BODY   \
    "\\t\\n\\x{0B}\\f\\r " \
    "\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"
#define GPT2_PATTERN                                                    \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" JS_WS_CLASS_BODY \
    "\\p{L}\\p{N}]+|[" JS_WS_CLASS_BODY "]+(?![^" JS_WS_CLASS_BODY "])|[" JS_WS_CLASS_BODY "]+"

static bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static char other_case(char c) { return (char)(c >= 'a' && c <= 'z' ? c - 32 : c + 32); }

/* The state of translate(): where it is in the pattern, and whether ASCII letters fold there. */
typedef struct translator {
    const char *p;
    size_t n, i;
    bool fold, in_class;
    bool fold_stack[64]; /* fold outside each open group */
    size_t depth;
    csd_tok_buf *out;
    csd_err *err;
} translator;

static int put(translator *t, const char *s, size_t len) { return csd_tok_buf_put(t->out, s, len); }

/* A backslash escape at t->i (with at least one byte after the backslash). */
static int translate_escape(translator *t) {
    const char *at = t->p + t->i;
    size_t left = t->n - t->i, len;
    char e = at[1];
    if (e == 's' || e == 'S') {
        t->i += 2;
        if (t->in_class && e == 'S')
            return csd_err_set(t->err, CSD_EUNSUPPORTED, "pre-tokenizer regex: \\S inside a class");
        if (t->in_class) return put(t, WS_CLASS_BODY, strlen(WS_CLASS_BODY));
        if (e == 's') return put(t, "[" WS_CLASS_BODY "]", strlen(WS_CLASS_BODY) + 2);
        return put(t, "[^" WS_CLASS_BODY "]", strlen(WS_CLASS_BODY) + 3);
    }
    if ((e == 'p' || e == 'P' || e == 'x') && left > 2 && at[2] == '{') {
        /* \p{Name}, \x{HHHH}: copied whole, the name is not case-folded */
        const char *close = memchr(at, '}', left);
        len = close ? (size_t)(close - at) + 1 : left;
    } else if ((e == 'p' || e == 'P') && left > 2) { /* \pL */
        len = 3;
    } else { /* any other escape, of one (UTF-8) character, is PCRE2's as well */
        uint32_t cp;
        len = 1 + csd_tok_utf8_next(at + 1, left - 1, &cp);
    }
    t->i += len;
    return put(t, at, len);
}

/* One character inside [...]: a folded letter becomes both cases. */
static int translate_class_char(translator *t) {
    char c = t->p[t->i++];
    if (c == ']') t->in_class = false;
    if (!t->fold || !is_ascii_letter(c)) return put(t, &c, 1);
    if (t->i < t->n && t->p[t->i] == '-')
        return csd_err_set(t->err, CSD_EUNSUPPORTED,
                           "pre-tokenizer regex: a range inside (?i:...)");
    char two[2] = {c, other_case(c)};
    return put(t, two, 2);
}

/* "[" at t->i, with a "^" and a literal leading "]" that may follow. */
static int open_class(translator *t) {
    t->in_class = true;
    t->i++;
    int rc = put(t, "[", 1);
    if (!rc && t->i < t->n && t->p[t->i] == '^') {
        rc = put(t, "^", 1);
        t->i++;
    }
    if (!rc && t->i < t->n && t->p[t->i] == ']') { /* a leading ] is literal */
        rc = put(t, "\\]", 2);
        t->i++;
    }
    return rc;
}

/* Anything else outside a class: groups track folding, (?i: becomes (?:, a folded letter [xX]. */
static int translate_char(translator *t) {
    char c = t->p[t->i];
    if (c == '(') {
        if (t->depth == sizeof t->fold_stack / sizeof t->fold_stack[0])
            return csd_err_set(t->err, CSD_EUNSUPPORTED, "pre-tokenizer regex nests too deeply");
        t->fold_stack[t->depth++] = t->fold;
        if (t->n - t->i >= 4 && memcmp(t->p + t->i, "(?i:", 4) == 0) {
            t->fold = true;
            t->i += 4;
            return put(t, "(?:", 3);
        }
    } else if (c == ')' && t->depth > 0) {
        t->fold = t->fold_stack[--t->depth];
    }
    t->i++;
    if (!t->fold || !is_ascii_letter(c)) return put(t, &c, 1);
    char cls[4] = {'[', c, other_case(c), ']'};
    return put(t, cls, 4);
}

/* Rewrites an Oniguruma pattern for PCRE2: \s and \S become explicit White_Space classes, and
 * (?i:...) folds ASCII letters only (as the reference does) instead of full Unicode folding. */
static int translate(const char *p, size_t n, csd_tok_buf *out, csd_err *err) {
    translator t = {.p = p, .n = n, .out = out, .err = err};
    int rc = 0;
    while (t.i < n && !rc) {
        char c = p[t.i];
        if (c == '\\' && t.i + 1 < n)
            rc = translate_escape(&t);
        else if (t.in_class)
            rc = translate_class_char(&t);
        else if (c == '[')
            rc = open_class(&t);
        else
            rc = translate_char(&t);
    }
    return rc;
}

int csd_tok_regex_compile(csd_tok *tok, const char *pattern, size_t len, bool is_regex, void **code,
                          csd_err *err) {
    if (len > CSD_TOK_MAX_PATTERN)
        return csd_err_set(err, CSD_EFORMAT, "pre-tokenizer pattern too long (%zu bytes)", len);
    csd_tok_buf t = {0};
    int rc;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    if (is_regex) {
        rc = translate(pattern, len, &t, err);
        if (rc) {
            csd_tok_buf_free(&t);
            return err && err->code ? rc : csd_err_set(err, rc, "translating pre-tokenizer regex");
        }
    } else {
        rc = csd_tok_buf_put(&t, pattern, len);
        opts |= PCRE2_LITERAL;
        if (rc) return rc;
    }
    pcre2_compile_context *cc = pcre2_compile_context_create(tok->gctx);
    if (!cc) {
        csd_tok_buf_free(&t);
        return csd_err_set(err, CSD_ENOMEM, "pcre2 context");
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int ecode = 0;
    PCRE2_SIZE eoff = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(t.p ? t.p : ""), t.len, opts, &ecode, &eoff, cc);
    pcre2_compile_context_free(cc);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        csd_tok_buf_free(&t);
        return csd_err_set(err, CSD_EFORMAT, "pre-tokenizer regex does not compile at %zu: %s",
                           (size_t)eoff, (const char *)msg);
    }
    csd_tok_buf_free(&t);
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
    *code = re;
    return 0;
}

int csd_tok_regex_compile_gpt2(csd_tok *tok, void **code, csd_err *err);
int csd_tok_regex_compile_gpt2(csd_tok *tok, void **code, csd_err *err) {
    /* Already in PCRE2 syntax: compile without translation. */
    pcre2_compile_context *cc = pcre2_compile_context_create(tok->gctx);
    if (!cc) return csd_err_set(err, CSD_ENOMEM, "pcre2 context");
    int ecode = 0;
    PCRE2_SIZE eoff = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &ecode, &eoff, cc);
    pcre2_compile_context_free(cc);
    if (!re) return csd_err_set(err, CSD_EFORMAT, "internal GPT-2 regex does not compile");
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *code = re;
    return 0;
}

void csd_tok_regex_free(void *code) { pcre2_code_free((pcre2_code *)code); }

int csd_tok_pieces_add(csd_tok_pieces *p, const char *s, size_t n) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        size_t *off = csd_alloc_array(cap, sizeof *off), *len = csd_alloc_array(cap, sizeof *len);
        if (!off || !len) {
            csd_free(off);
            csd_free(len);
            return CSD_ENOMEM;
        }
        if (p->n) {
            memcpy(off, p->off, p->n * sizeof *off);
            memcpy(len, p->len, p->n * sizeof *len);
        }
        csd_free(p->off);
        csd_free(p->len);
        p->off = off;
        p->len = len;
        p->cap = cap;
    }
    p->off[p->n] = p->text.len;
    p->len[p->n] = n;
    p->n++;
    return csd_tok_buf_put(&p->text, s, n);
}

void csd_tok_pieces_reset(csd_tok_pieces *p) {
    p->n = 0;
    p->text.len = 0;
}

void csd_tok_pieces_free(csd_tok_pieces *p) {
    csd_tok_buf_free(&p->text);
    csd_free(p->off);
    csd_free(p->len);
    memset(p, 0, sizeof *p);
}

/* Splits s by code: gaps and matches are kept or dropped as the step says. */
static int split_piece(const csd_tok_pre_step *st, const char *s, size_t n, pcre2_match_data *md,
                       csd_tok_pieces *out, csd_err *err) {
    bool keep_gaps = !st->invert, keep_matches = !st->removed;
    size_t prev = 0, pos = 0;
    while (pos <= n) {
        int rc = pcre2_match((const pcre2_code *)st->code, (PCRE2_SPTR)s, n, pos,
                             PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return csd_err_set(err, CSD_ERANGE, "pre-tokenizer regex failed: %s",
                               (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        int r = 0;
        if (ms > prev && keep_gaps) r = csd_tok_pieces_add(out, s + prev, ms - prev);
        if (!r && me > ms && keep_matches) r = csd_tok_pieces_add(out, s + ms, me - ms);
        if (r) return csd_err_set(err, r, "out of memory splitting text");
        prev = me > prev ? me : prev;
        if (me == ms) {
            if (me >= n) break;
            uint32_t cp;
            pos = me + csd_tok_utf8_next(s + me, n - me, &cp);
        } else {
            pos = me;
        }
    }
    if (prev < n && keep_gaps) {
        int r = csd_tok_pieces_add(out, s + prev, n - prev);
        if (r) return csd_err_set(err, r, "out of memory splitting text");
    }
    return 0;
}

static int bytelevel_piece(const char *s, size_t n, csd_tok_pieces *out) {
    char tmp[1024];
    size_t o = 0;
    csd_tok_buf big = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        o += csd_tok_utf8_put(csd_tok_bytelevel_char((uint8_t)s[i]), tmp + o);
        if (o > sizeof tmp - 4) {
            rc = csd_tok_buf_put(&big, tmp, o);
            o = 0;
        }
    }
    if (!rc && big.len) rc = csd_tok_buf_put(&big, tmp, o);
    if (!rc)
        rc = big.len ? csd_tok_pieces_add(out, big.p, big.len) : csd_tok_pieces_add(out, tmp, o);
    csd_tok_buf_free(&big);
    return rc;
}

/* Metaspace as the reference does it: spaces become the replacement, which is also put in front
 * (per prepend_scheme) unless the text already starts with it; the piece is not split further. */
static int metaspace_piece(const csd_tok_pre_step *st, const char *s, size_t n, bool first,
                           csd_tok_pieces *out) {
    csd_tok_buf b = {0};
    size_t rl = strlen(st->replacement);
    bool prepend = st->prepend == CSD_TOK_PREPEND_ALWAYS ||
                   (st->prepend == CSD_TOK_PREPEND_FIRST && first);
    /* the text after replacement starts with the replacement iff s starts with it or a space */
    bool starts = (n >= rl && memcmp(s, st->replacement, rl) == 0) || (n > 0 && s[0] == ' ');
    int rc = prepend && !starts ? csd_tok_buf_put(&b, st->replacement, rl) : 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = s[i] == ' ' ? csd_tok_buf_put(&b, st->replacement, rl) : csd_tok_buf_put(&b, s + i, 1);
    if (!rc) rc = csd_tok_pieces_add(out, b.p ? b.p : "", b.len);
    csd_tok_buf_free(&b);
    return rc;
}

int csd_tok_pretokenize(const csd_tok *tok, const char *s, size_t n, bool first_section,
                        csd_tok_pieces *out, csd_tok_pieces *tmp, csd_err *err) {
    csd_tok_pieces_reset(out);
    int rc = csd_tok_pieces_add(out, s, n);
    if (rc) return csd_err_set(err, rc, "out of memory pre-tokenizing");
    pcre2_match_data *md = NULL;
    for (size_t k = 0; k < tok->n_pre && !rc; k++) {
        const csd_tok_pre_step *st = &tok->pre[k];
        csd_tok_pieces_reset(tmp);
        if (st->code && !md) {
            md = pcre2_match_data_create(4, (pcre2_general_context *)tok->gctx);
            if (!md) return csd_err_set(err, CSD_ENOMEM, "pcre2 match data");
        }
        for (size_t i = 0; i < out->n && !rc; i++) {
            const char *ps = out->text.p + out->off[i];
            size_t pn = out->len[i];
            if (st->kind == CSD_TOK_PRE_SPLIT) {
                rc = split_piece(st, ps, pn, md, tmp, err);
                continue;
            }
            if (st->kind == CSD_TOK_PRE_METASPACE) {
                rc = metaspace_piece(st, ps, pn, first_section, tmp);
                if (rc) csd_err_set(err, rc, "out of memory in Metaspace");
                continue;
            }
            /* ByteLevel: optional prefix space, optional GPT-2 split (matches only), byte map */
            csd_tok_buf pre = {0};
            if (st->add_prefix_space && (pn == 0 || ps[0] != ' ')) {
                rc = csd_tok_buf_put(&pre, " ", 1);
                if (!rc) rc = csd_tok_buf_put(&pre, ps, pn);
                ps = pre.p;
                pn = pre.len;
            }
            if (!rc && st->code) {
                csd_tok_pieces parts = {0};
                rc = split_piece(st, ps, pn, md, &parts, err);
                for (size_t j = 0; j < parts.n && !rc; j++)
                    rc = bytelevel_piece(parts.text.p + parts.off[j], parts.len[j], tmp);
                csd_tok_pieces_free(&parts);
            } else if (!rc) {
                rc = bytelevel_piece(ps, pn, tmp);
            }
            csd_tok_buf_free(&pre);
            if (rc && !(err && err->code)) csd_err_set(err, rc, "out of memory in ByteLevel");
        }
        csd_tok_pieces swap = *out;
        *out = *tmp;
        *tmp = swap;
    }
    pcre2_match_data_free(md);
    return rc;
}
