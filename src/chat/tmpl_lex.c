/* tmpl_lex: preprocessing and tokenizing of chat templates, mirroring @huggingface/jinja's lexer.
 * Preprocessing applies what HF applies (trailing newline, lstrip_blocks, trim_blocks, the
 * transformers `generation` tag) as text rewrites while keeping a map back to original offsets, so
 * every token and error carries a line/column in the text the user wrote. */
#include "chat/tmpl_internal.h"

#include <string.h>

/* Text plus, for each byte, its offset in the original template. */
typedef struct ptext {
    char *s;
    uint32_t *map;            /* len + 1 entries; map[len] = original end */
    size_t len;
} ptext;

static void pt_alloc(csd_chat_arena *a, ptext *t, size_t cap) {
    t->s = csd_chat_arena_alloc(a, cap + 1);
    t->map = csd_chat_arena_alloc(a, (cap + 1) * sizeof(uint32_t));
    t->len = 0;
}

static void pt_push(ptext *t, const ptext *from, size_t i) {
    t->s[t->len] = from->s[i];
    t->map[t->len] = from->map[i];
    t->len++;
}

static void pt_end(ptext *t, const ptext *from) {
    t->map[t->len] = from->map[from->len];
    t->s[t->len] = '\0';
}

static bool is_line_start(const ptext *t, size_t i) {
    if (i == 0) return true;
    char c = t->s[i - 1];
    if (c == '\n' || c == '\r') return true;
    /* U+2028 / U+2029 also end lines for a JS multiline ^ */
    return i >= 3 && (unsigned char)t->s[i - 3] == 0xE2 && (unsigned char)t->s[i - 2] == 0x80 &&
           ((unsigned char)c == 0xA8 || (unsigned char)c == 0xA9);
}

/* lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1" */
static void lstrip_blocks(csd_chat_arena *a, ptext *t) {
    ptext o;
    pt_alloc(a, &o, t->len);
    size_t i = 0;
    while (i < t->len) {
        if (is_line_start(t, i)) {
            size_t j = i;
            while (j < t->len && (t->s[j] == ' ' || t->s[j] == '\t')) j++;
            if (j + 1 < t->len && t->s[j] == '{' &&
                (t->s[j + 1] == '#' || t->s[j + 1] == '%' || t->s[j + 1] == '-')) {
                i = j;
            }
        }
        /* copy up to and including the next character */
        pt_push(&o, t, i);
        i++;
    }
    pt_end(&o, t);
    *t = o;
}

/* trim_blocks: /([#%-]})\n/g -> "$1" */
static void trim_blocks(csd_chat_arena *a, ptext *t) {
    ptext o;
    pt_alloc(a, &o, t->len);
    size_t i = 0;
    while (i < t->len) {
        char c = t->s[i];
        if ((c == '#' || c == '%' || c == '-') && i + 2 < t->len && t->s[i + 1] == '}' &&
            t->s[i + 2] == '\n') {
            pt_push(&o, t, i);
            pt_push(&o, t, i + 1);
            i += 3;
            continue;
        }
        pt_push(&o, t, i);
        i++;
    }
    pt_end(&o, t);
    *t = o;
}

static size_t ws_at(const ptext *t, size_t i) {
    return csd_chat_js_space(t->s + i, t->s + t->len);
}

static size_t ws_run(const ptext *t, size_t i) {
    size_t k;
    while (i < t->len && (k = ws_at(t, i)) > 0) i += k;
    return i;
}

/* /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> (lstrip ? "" : before) + (rstrip ? "" :
 * after) */
static bool match_generation(const ptext *t, size_t i, size_t *tag, size_t *tag_end, size_t *end,
                             bool *lstrip, bool *rstrip) {
    size_t j = ws_run(t, i);
    if (j + 1 >= t->len || t->s[j] != '{' || t->s[j + 1] != '%') return false;
    *tag = j;
    j += 2;
    *lstrip = j < t->len && t->s[j] == '-';
    if (*lstrip) j++;
    j = ws_run(t, j);
    if (t->len - j >= 3 && memcmp(t->s + j, "end", 3) == 0 &&
        !(t->len - j >= 10 && memcmp(t->s + j, "generation", 10) == 0))
        j += 3;
    if (t->len - j < 10 || memcmp(t->s + j, "generation", 10) != 0) return false;
    j = ws_run(t, j + 10);
    *rstrip = j < t->len && t->s[j] == '-';
    if (*rstrip) j++;
    if (j + 1 >= t->len || t->s[j] != '%' || t->s[j + 1] != '}') return false;
    *tag_end = j + 2;
    *end = ws_run(t, j + 2);
    return true;
}

static void strip_generation(csd_chat_arena *a, ptext *t) {
    if (!memmem(t->s, t->len, "generation", 10)) return;
    ptext o;
    pt_alloc(a, &o, t->len);
    size_t i = 0;
    bool prev_ws = false;
    while (i < t->len) {
        size_t tag, tag_end, end;
        bool ls, rs;
        /* inside a whitespace run an earlier attempt at the run's start already decided */
        if (!prev_ws && match_generation(t, i, &tag, &tag_end, &end, &ls, &rs)) {
            if (!ls)
                for (size_t k = i; k < tag; k++) pt_push(&o, t, k);
            if (!rs)
                for (size_t k = tag_end; k < end; k++) pt_push(&o, t, k);
            i = end;
            prev_ws = false;
            continue;
        }
        size_t k = ws_at(t, i);
        prev_ws = k > 0;
        if (k == 0) k = 1;
        for (size_t m = 0; m < k && i < t->len; m++) pt_push(&o, t, i++);
    }
    pt_end(&o, t);
    *t = o;
}

/* ---- tokenizer ---- */

typedef struct lexer {
    csd_chat_arena *a;
    csd_chat_fail *f;
    ptext t;
    size_t i;
    csd_chat_tok *toks;
    size_t n, cap;
} lexer;

static _Noreturn void lex_fail(lexer *L, size_t at, const char *msg, const char *arg) {
    uint32_t pos = L->t.map[at < L->t.len ? at : L->t.len];
    csd_chat_raise(L->f, CSD_EFORMAT, pos, "%s%s", msg, arg ? arg : "");
}

static csd_chat_tok *push(lexer *L, int type, const char *p, size_t n, size_t at) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        csd_chat_tok *nt = csd_chat_arena_alloc(L->a, cap * sizeof *nt);
        if (L->n) memcpy(nt, L->toks, L->n * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    csd_chat_tok *tk = &L->toks[L->n++];
    tk->type = type;
    tk->p = p;
    tk->n = n;
    tk->pos = L->t.map[at];
    return tk;
}

static int last_type(const lexer *L) { return L->n ? L->toks[L->n - 1].type : -1; }

static bool at(const lexer *L, const char *s) {
    size_t k = strlen(s);
    return L->t.len - L->i >= k && memcmp(L->t.s + L->i, s, k) == 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_word(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* Consumes a run of chars matching pred; like the reference, running into the end of input
 * while consuming is an error. */
static size_t consume_while(lexer *L, bool (*pred)(char)) {
    size_t start = L->i;
    while (L->i < L->t.len && pred(L->t.s[L->i])) {
        L->i++;
        if (L->i >= L->t.len) lex_fail(L, L->i, "unexpected end of input", NULL);
    }
    return L->i - start;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void lex_string(lexer *L) {
    char q = L->t.s[L->i];
    size_t start = L->i;
    L->i++;
    csd_chat_buf b;
    csd_chat_buf_init(&b, L->a, SIZE_MAX / 2);
    csd_chat_buf_put(&b, "", 0);
    for (;;) {
        if (L->i >= L->t.len) lex_fail(L, start, "unterminated string literal", NULL);
        char c = L->t.s[L->i];
        if (c == q) break;
        if (c == '\\') {
            L->i++;
            if (L->i >= L->t.len) lex_fail(L, start, "unterminated string literal", NULL);
            char e = L->t.s[L->i++];
            if (e == 'x' || e == 'u') {
                int len = e == 'x' ? 2 : 4;
                uint32_t cp = 0;
                for (int k = 0; k < len; k++) {
                    int h = L->i + (size_t)k < L->t.len ? hexval(L->t.s[L->i + (size_t)k]) : -1;
                    if (h < 0) lex_fail(L, L->i - 2, "invalid hexadecimal escape sequence", NULL);
                    cp = cp * 16 + (uint32_t)h;
                }
                L->i += (size_t)len;
                csd_chat_utf8_put(&b, cp);
                continue;
            }
            const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
            const char *hit = e ? strchr(from, e) : NULL;
            if (!hit) {
                char s[2] = {e, 0};
                lex_fail(L, L->i - 2, "unexpected escaped character: ", s);
            }
            csd_chat_buf_putc(&b, to[hit - from]);
            continue;
        }
        csd_chat_buf_putc(&b, c);
        L->i++;
        if (L->i >= L->t.len) lex_fail(L, start, "unterminated string literal", NULL);
    }
    L->i++; /* closing quote */
    push(L, CSD_CHAT_T_STR, b.p ? b.p : "", b.len, start);
}

static void strip_trailing_ws(lexer *L) {
    if (!L->n || L->toks[L->n - 1].type != CSD_CHAT_T_TEXT) return;
    csd_chat_tok *tk = &L->toks[L->n - 1];
    size_t k;
    while (tk->n > 0 && (k = csd_chat_js_space_back(tk->p, tk->p + tk->n)) > 0) tk->n -= k;
    if (tk->n == 0) L->n--;
}

static void skip_leading_ws(lexer *L) {
    size_t k;
    while (L->i < L->t.len && (k = ws_at(&L->t, L->i)) > 0) L->i += k;
}

typedef struct maprule {
    const char *seq;
    int type;
} maprule;

static const maprule RULES[] = {
    {"{%", CSD_CHAT_T_OPEN_STMT}, {"%}", CSD_CHAT_T_CLOSE_STMT}, {"{{", CSD_CHAT_T_OPEN_EXPR},
    {"}}", CSD_CHAT_T_CLOSE_EXPR}, {"(", CSD_CHAT_T_LPAREN},     {")", CSD_CHAT_T_RPAREN},
    {"{", CSD_CHAT_T_LBRACE},      {"}", CSD_CHAT_T_RBRACE},     {"[", CSD_CHAT_T_LBRACKET},
    {"]", CSD_CHAT_T_RBRACKET},    {",", CSD_CHAT_T_COMMA},      {".", CSD_CHAT_T_DOT},
    {":", CSD_CHAT_T_COLON},       {"|", CSD_CHAT_T_PIPE},       {"<=", CSD_CHAT_T_CMP},
    {">=", CSD_CHAT_T_CMP},        {"==", CSD_CHAT_T_CMP},       {"!=", CSD_CHAT_T_CMP},
    {"<", CSD_CHAT_T_CMP},         {">", CSD_CHAT_T_CMP},        {"+", CSD_CHAT_T_ADD},
    {"-", CSD_CHAT_T_ADD},         {"~", CSD_CHAT_T_ADD},        {"**", CSD_CHAT_T_POW},
    {"*", CSD_CHAT_T_MUL},         {"//", CSD_CHAT_T_MUL},       {"/", CSD_CHAT_T_MUL},
    {"%", CSD_CHAT_T_MUL},         {"=", CSD_CHAT_T_EQUALS},
};

/* Raw text up to the next tag, when the last token leaves the lexer outside a tag. True when a
 * text token was pushed. */
static bool lex_text(lexer *L) {
    int lt = last_type(L);
    if (!(lt < 0 || lt == CSD_CHAT_T_CLOSE_STMT || lt == CSD_CHAT_T_CLOSE_EXPR ||
          lt == CSD_CHAT_T_COMMENT))
        return false;
    const ptext *t = &L->t;
    size_t start = L->i;
    while (L->i < t->len &&
           !(t->s[L->i] == '{' && L->i + 1 < t->len &&
             (t->s[L->i + 1] == '%' || t->s[L->i + 1] == '{' || t->s[L->i + 1] == '#')))
        L->i++;
    if (L->i == start) return false;
    push(L, CSD_CHAT_T_TEXT, t->s + start, L->i - start, start);
    return true;
}

/* A {# comment #} (at "{#"), with its - whitespace controls. */
static void lex_comment(lexer *L) {
    const ptext *t = &L->t;
    size_t start = L->i;
    L->i += 2;
    bool strip_before = L->i < t->len && t->s[L->i] == '-';
    if (strip_before) L->i++;
    size_t cstart = L->i;
    while (!(L->i + 1 < t->len && t->s[L->i] == '#' && t->s[L->i + 1] == '}')) {
        if (L->i + 2 >= t->len) lex_fail(L, start, "missing end of comment tag", NULL);
        L->i++;
    }
    size_t clen = L->i - cstart;
    bool strip_after = clen > 0 && t->s[L->i - 1] == '-';
    if (strip_after) clen--;
    if (strip_before) strip_trailing_ws(L);
    push(L, CSD_CHAT_T_COMMENT, t->s + cstart, clen, start);
    L->i += 2;
    if (strip_after) skip_leading_ws(L);
}

/* "{%-" or "{{-": the tag opens and the text before it loses its trailing whitespace. */
static bool lex_open_strip(lexer *L, int *curly) {
    if (at(L, "{%-")) {
        strip_trailing_ws(L);
        push(L, CSD_CHAT_T_OPEN_STMT, "{%", 2, L->i);
    } else if (at(L, "{{-")) {
        strip_trailing_ws(L);
        push(L, CSD_CHAT_T_OPEN_EXPR, "{{", 2, L->i);
        *curly = 0;
    } else {
        return false;
    }
    L->i += 3;
    return true;
}

/* "-%}" or "-}}": the tag closes and the text after it loses its leading whitespace. */
static bool lex_close_strip(lexer *L) {
    if (at(L, "-%}"))
        push(L, CSD_CHAT_T_CLOSE_STMT, "%}", 2, L->i);
    else if (at(L, "-}}"))
        push(L, CSD_CHAT_T_CLOSE_EXPR, "}}", 2, L->i);
    else
        return false;
    L->i += 3;
    skip_leading_ws(L);
    return true;
}

/* Whitespace between the tokens of a tag; a tag may not end the input. */
static void skip_tag_ws(lexer *L) {
    size_t k;
    while (L->i < L->t.len && (k = ws_at(&L->t, L->i)) > 0) {
        L->i += k;
        if (L->i >= L->t.len) lex_fail(L, L->i, "unexpected end of input", NULL);
    }
}

/* A '-' or '+' where no operand precedes it: a signed number or a unary operator. False when it
 * follows an operand (then it is the binary operator, one of the RULES). */
static bool lex_sign(lexer *L, char c) {
    const ptext *t = &L->t;
    int lt = last_type(L);
    if (lt == CSD_CHAT_T_TEXT || lt < 0) {
        char s[2] = {c, 0};
        lex_fail(L, L->i, "unexpected character: ", s);
    }
    if (lt == CSD_CHAT_T_IDENT || lt == CSD_CHAT_T_NUM || lt == CSD_CHAT_T_STR ||
        lt == CSD_CHAT_T_RPAREN || lt == CSD_CHAT_T_RBRACKET)
        return false;
    size_t start = L->i;
    L->i++;
    size_t nd = consume_while(L, is_digit);
    if (nd > 0 && L->i + 1 < t->len && t->s[L->i] == '.' && is_digit(t->s[L->i + 1])) {
        L->i++;
        consume_while(L, is_digit);
    }
    push(L, nd > 0 ? CSD_CHAT_T_NUM : CSD_CHAT_T_UNARY, t->s + start, L->i - start, start);
    return true;
}

/* The first of the RULES that matches here (a "}}" inside an open { ... } literal is two braces).
 * curly counts the dict literals open in the current expression. */
static bool lex_rule(lexer *L, int *curly) {
    for (size_t r = 0; r < sizeof RULES / sizeof RULES[0]; r++) {
        if (RULES[r].type == CSD_CHAT_T_CLOSE_EXPR && *curly > 0) continue;
        if (!at(L, RULES[r].seq)) continue;
        size_t k = strlen(RULES[r].seq);
        push(L, RULES[r].type, L->t.s + L->i, k, L->i);
        if (RULES[r].type == CSD_CHAT_T_OPEN_EXPR)
            *curly = 0;
        else if (RULES[r].type == CSD_CHAT_T_LBRACE)
            (*curly)++;
        else if (RULES[r].type == CSD_CHAT_T_RBRACE)
            (*curly)--;
        L->i += k;
        return true;
    }
    return false;
}

/* Digits, with a fraction unless the number follows a '.': in x.0.1, 0 and 1 are attribute
 * steps. */
static void lex_number(lexer *L) {
    const ptext *t = &L->t;
    size_t start = L->i;
    consume_while(L, is_digit);
    if (last_type(L) != CSD_CHAT_T_DOT && L->i + 1 < t->len && t->s[L->i] == '.' &&
        is_digit(t->s[L->i + 1])) {
        L->i++;
        consume_while(L, is_digit);
    }
    push(L, CSD_CHAT_T_NUM, t->s + start, L->i - start, start);
}

static void lex_main(lexer *L) {
    const ptext *t = &L->t;
    int curly = 0;
    while (L->i < t->len) {
        if (lex_text(L)) continue;
        if (at(L, "{#")) {
            lex_comment(L);
            continue;
        }
        if (lex_open_strip(L, &curly)) continue;
        skip_tag_ws(L);
        if (L->i >= t->len) break;
        if (lex_close_strip(L)) continue;
        char c = t->s[L->i];
        if ((c == '-' || c == '+') && lex_sign(L, c)) continue;
        if (lex_rule(L, &curly)) continue;
        if (c == '\'' || c == '"') {
            lex_string(L);
        } else if (is_digit(c)) {
            lex_number(L);
        } else if (is_word(c)) {
            size_t start = L->i;
            consume_while(L, is_word);
            push(L, CSD_CHAT_T_IDENT, t->s + start, L->i - start, start);
        } else if ((unsigned char)c >= 0x80 || c < 0x20) {
            lex_fail(L, L->i, "unexpected character", NULL);
        } else {
            char s[2] = {c, 0};
            lex_fail(L, L->i, "unexpected character: ", s);
        }
    }
}

void csd_chat_lex(csd_chat_arena *a, const char *src, size_t len, csd_chat_tok **out,
                  size_t *n_out) {
    if (len >= UINT32_MAX - 1)
        csd_chat_raise(a->fail, CSD_ERANGE, CSD_CHAT_NOPOS, "template too large");
    lexer L;
    memset(&L, 0, sizeof L);
    L.a = a;
    L.f = a->fail;
    pt_alloc(a, &L.t, len);
    memcpy(L.t.s, src, len);
    for (size_t i = 0; i <= len; i++) L.t.map[i] = (uint32_t)i;
    L.t.len = len;
    L.t.s[len] = '\0';
    if (L.t.len > 0 && L.t.s[L.t.len - 1] == '\n') {
        L.t.len--;
        L.t.s[L.t.len] = '\0';
    }
    lstrip_blocks(a, &L.t);
    trim_blocks(a, &L.t);
    strip_generation(a, &L.t);
    lex_main(&L);
    *out = L.toks;
    *n_out = L.n;
}
