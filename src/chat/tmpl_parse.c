/* tmpl_parse: recursive-descent parser from tokens to the template AST, following the grammar and
 * operator precedence of @huggingface/jinja's parser (including its quirks, e.g. `is` binding
 * tighter than `*`, comparisons chaining left to right). Recursion is bounded by
 * CSD_CHAT_MAX_PARSE_DEPTH; every error names the line and column of the offending token. */
#include "chat/tmpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    csd_chat_arena *a;
    const csd_chat_tok *t;
    size_t n, cur;
    int depth;
} parser;

typedef struct nvec {
    csd_chat_node **p;
    size_t n, cap;
} nvec;

static const char *TOK_NAMES[CSD_CHAT_T_COUNT] = {
    "text", "number", "string", "identifier", "'='", "'('", "')'", "'{%'", "'%}'", "'{{'", "'}}'",
    "'['", "']'", "'{'", "'}'", "','", "'.'", "':'", "'|'", "operator", "operator", "'**'",
    "comparison", "unary operator", "comment"};

static uint32_t here(const parser *P) {
    if (P->cur < P->n) return P->t[P->cur].pos;
    return P->n ? P->t[P->n - 1].pos : 0;
}

static _Noreturn void perr(parser *P, const char *fmt, const char *arg) {
    char got[64];
    if (P->cur < P->n) {
        const csd_chat_tok *tk = &P->t[P->cur];
        if (tk->type == CSD_CHAT_T_IDENT || tk->type == CSD_CHAT_T_NUM)
            snprintf(got, sizeof got, "'%.*s'", (int)(tk->n > 40 ? 40 : tk->n), tk->p);
        else
            snprintf(got, sizeof got, "%s", TOK_NAMES[tk->type]);
    } else {
        snprintf(got, sizeof got, "end of template");
    }
    csd_chat_raise(P->a->fail, CSD_EFORMAT, here(P), "%s%s (found %s)", fmt, arg ? arg : "", got);
}

static void enter(parser *P) {
    if (++P->depth > CSD_CHAT_MAX_PARSE_DEPTH)
        csd_chat_raise(P->a->fail, CSD_ERANGE, here(P), "template nesting deeper than %d",
                       CSD_CHAT_MAX_PARSE_DEPTH);
}
static void leave(parser *P) { P->depth--; }

static void nv_push(parser *P, nvec *v, csd_chat_node *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        csd_chat_node **np = csd_chat_arena_alloc(P->a, cap * sizeof *np);
        if (v->n) memcpy(np, v->p, v->n * sizeof *np);
        v->p = np;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

static csd_chat_node *mk(parser *P, int kind, uint32_t pos) {
    csd_chat_node *x = csd_chat_arena_alloc(P->a, sizeof *x);
    x->kind = kind;
    x->pos = pos;
    return x;
}

static bool is(const parser *P, int type) { return P->cur < P->n && P->t[P->cur].type == type; }

static bool tok_is_ident(const csd_chat_tok *tk, const char *name) {
    size_t k = strlen(name);
    return tk->type == CSD_CHAT_T_IDENT && tk->n == k && memcmp(tk->p, name, k) == 0;
}

static bool is_ident(const parser *P, const char *name) {
    return P->cur < P->n && tok_is_ident(&P->t[P->cur], name);
}

static bool is_ident2(const parser *P, const char *a, const char *b) {
    return P->cur + 1 < P->n && tok_is_ident(&P->t[P->cur], a) &&
           tok_is_ident(&P->t[P->cur + 1], b);
}

/* {% name ... with name among the NULL-terminated list */
static bool is_statement(const parser *P, const char *const *names) {
    if (P->cur + 1 >= P->n || P->t[P->cur].type != CSD_CHAT_T_OPEN_STMT) return false;
    for (; *names; names++)
        if (tok_is_ident(&P->t[P->cur + 1], *names)) return true;
    return false;
}

static const csd_chat_tok *expect(parser *P, int type, const char *what) {
    if (!is(P, type)) perr(P, "expected ", what);
    return &P->t[P->cur++];
}

static void expect_ident(parser *P, const char *name) {
    if (!is_ident(P, name)) perr(P, "expected ", name);
    P->cur++;
}

static csd_chat_node *parse_any(parser *P);
static csd_chat_node *parse_expression(parser *P);
static csd_chat_node *parse_primary(parser *P);
static csd_chat_node *parse_call(parser *P, csd_chat_node *callee);
static csd_chat_node *parse_logical_or(parser *P);

/* Parses statements until one of `until` (or fails at the end of input). */
static void parse_body(parser *P, nvec *v, const char *const *until, const char *what) {
    while (!is_statement(P, until)) {
        if (P->cur >= P->n) perr(P, "missing ", what);
        if (P->cur + 1 < P->n && P->t[P->cur].type == CSD_CHAT_T_OPEN_STMT &&
            P->t[P->cur + 1].type == CSD_CHAT_T_IDENT) {
            const csd_chat_tok *nt = &P->t[P->cur + 1];
            if ((nt->n > 3 && memcmp(nt->p, "end", 3) == 0) || tok_is_ident(nt, "else") ||
                tok_is_ident(nt, "elif")) {
                P->cur++;
                perr(P, "expected ", what);
            }
        }
        nv_push(P, v, parse_any(P));
    }
}

static void set_list(csd_chat_node *x, const nvec *v) {
    x->list = v->p;
    x->nlist = v->n;
}
static void set_list2(csd_chat_node *x, const nvec *v) {
    x->list2 = v->p;
    x->nlist2 = v->n;
}

static csd_chat_node *parse_sequence(parser *P, bool primary) {
    uint32_t pos = here(P);
    csd_chat_node *first = primary ? parse_primary(P) : parse_expression(P);
    if (!is(P, CSD_CHAT_T_COMMA)) return first;
    nvec v = {0};
    nv_push(P, &v, first);
    while (is(P, CSD_CHAT_T_COMMA)) {
        P->cur++;
        nv_push(P, &v, primary ? parse_primary(P) : parse_expression(P));
    }
    csd_chat_node *t = mk(P, CSD_CHAT_N_TUPLE, pos);
    set_list(t, &v);
    return t;
}

static void parse_args(parser *P, nvec *out, bool params) {
    expect(P, CSD_CHAT_T_LPAREN, "'(' to open the argument list");
    bool saw_kw = false, saw_spread = false;
    while (!is(P, CSD_CHAT_T_RPAREN)) {
        if (P->cur >= P->n) perr(P, "expected ", "')'");
        uint32_t pos = here(P);
        bool kwspread = is(P, CSD_CHAT_T_POW);
        bool spread = is(P, CSD_CHAT_T_MUL) && P->t[P->cur].n == 1 && P->t[P->cur].p[0] == '*';
        if (params && (kwspread || spread))
            perr(P, "argument unpacking is not allowed in parameters", NULL);
        if (kwspread) {
            P->cur++;
            csd_chat_node *x = mk(P, CSD_CHAT_N_KWSPREAD, pos);
            x->a = parse_expression(P);
            nv_push(P, out, x);
            if (is(P, CSD_CHAT_T_COMMA)) P->cur++;
            if (!is(P, CSD_CHAT_T_RPAREN))
                perr(P, "`**` must be applied to the final argument", NULL);
            break;
        }
        csd_chat_node *arg;
        if (spread) {
            if (saw_spread) perr(P, "only one `*` argument unpacking is allowed", NULL);
            saw_spread = true;
            P->cur++;
            arg = mk(P, CSD_CHAT_N_SPREAD, pos);
            arg->a = parse_expression(P);
        } else {
            arg = parse_expression(P);
            if (is(P, CSD_CHAT_T_EQUALS)) {
                P->cur++;
                if (arg->kind != CSD_CHAT_N_IDENT)
                    perr(P, "expected an identifier before '='", NULL);
                csd_chat_node *kw = mk(P, CSD_CHAT_N_KWARG, arg->pos);
                kw->s = arg->s;
                kw->slen = arg->slen;
                kw->a = parse_expression(P);
                arg = kw;
            }
            if (params) {
                if (arg->kind != CSD_CHAT_N_IDENT && arg->kind != CSD_CHAT_N_KWARG)
                    perr(P, "expected identifier for parameter declaration", NULL);
                if (out->n >= CSD_CHAT_MAX_PARAMS)
                    perr(P, "a macro with more than 255 parameters", NULL);
                for (size_t i = 0; i < out->n; i++)
                    if (out->p[i]->slen == arg->slen &&
                        memcmp(out->p[i]->s, arg->s, arg->slen) == 0)
                        perr(P, "duplicate parameter name", NULL);
            }
            if (arg->kind == CSD_CHAT_N_KWARG) saw_kw = true;
            else if (saw_kw)
                perr(P, params ? "non-default argument follows default argument"
                               : "positional arguments must come before keyword arguments", NULL);
            else if (saw_spread)
                perr(P, "positional arguments must not follow `*` argument unpacking", NULL);
        }
        nv_push(P, out, arg);
        if (is(P, CSD_CHAT_T_COMMA)) P->cur++;
    }
    expect(P, CSD_CHAT_T_RPAREN, "')' to close the argument list");
}

static csd_chat_node *parse_member_args(parser *P) {
    nvec sl = {0};
    bool is_slice = false;
    uint32_t pos = here(P);
    while (!is(P, CSD_CHAT_T_RBRACKET)) {
        if (P->cur >= P->n) perr(P, "expected ", "']'");
        if (is(P, CSD_CHAT_T_COLON)) {
            nv_push(P, &sl, NULL);
            P->cur++;
            is_slice = true;
        } else {
            nv_push(P, &sl, parse_expression(P));
            if (is(P, CSD_CHAT_T_COLON)) {
                P->cur++;
                is_slice = true;
            }
        }
    }
    if (sl.n == 0) perr(P, "expected at least one argument for member/slice expression", NULL);
    /* like the reference, `x[a b]` (no colon) silently uses the first expression */
    if (!is_slice) return sl.p[0];
    if (sl.n > 3)
        csd_chat_raise(P->a->fail, CSD_EFORMAT, pos, "expected 0-3 arguments for slice expression");
    csd_chat_node *x = mk(P, CSD_CHAT_N_SLICE, pos);
    x->a = sl.p[0];
    x->b = sl.n > 1 ? sl.p[1] : NULL;
    x->c = sl.n > 2 ? sl.p[2] : NULL;
    return x;
}

static csd_chat_node *parse_member(parser *P, csd_chat_node *obj) {
    while (is(P, CSD_CHAT_T_DOT) || is(P, CSD_CHAT_T_LBRACKET)) {
        bool computed = is(P, CSD_CHAT_T_LBRACKET);
        uint32_t pos = here(P);
        P->cur++;
        csd_chat_node *prop;
        if (computed) {
            prop = parse_member_args(P);
            expect(P, CSD_CHAT_T_RBRACKET, "']'");
        } else {
            prop = parse_primary(P);
            if (prop->kind != CSD_CHAT_N_IDENT && prop->kind != CSD_CHAT_N_INT)
                csd_chat_raise(P->a->fail, CSD_EFORMAT, prop->pos,
                               "expected identifier or integer following '.'");
        }
        csd_chat_node *m = mk(P, CSD_CHAT_N_MEMBER, pos);
        m->a = obj;
        m->b = prop;
        m->flag = computed;
        obj = m;
    }
    return obj;
}

static csd_chat_node *parse_call(parser *P, csd_chat_node *callee) {
    enter(P);
    csd_chat_node *c = mk(P, CSD_CHAT_N_CALL, callee->pos);
    c->a = callee;
    nvec v = {0};
    parse_args(P, &v, false);
    set_list(c, &v);
    csd_chat_node *x = parse_member(P, c);
    if (is(P, CSD_CHAT_T_LPAREN)) x = parse_call(P, x);
    leave(P);
    return x;
}

static csd_chat_node *parse_call_member(parser *P) {
    csd_chat_node *m = parse_member(P, parse_primary(P));
    if (is(P, CSD_CHAT_T_LPAREN)) return parse_call(P, m);
    return m;
}

static csd_chat_node *parse_unary_sign(parser *P) {
    if (P->cur < P->n) {
        const csd_chat_tok *tk = &P->t[P->cur];
        if ((tk->type == CSD_CHAT_T_UNARY || tk->type == CSD_CHAT_T_ADD) && tk->n == 1 &&
            (tk->p[0] == '-' || tk->p[0] == '+')) {
            enter(P);
            P->cur++;
            csd_chat_node *u = mk(P, CSD_CHAT_N_UNARY, tk->pos);
            u->op = tk->p[0] == '-' ? CSD_CHAT_OP_SUB : CSD_CHAT_OP_ADD;
            u->a = parse_unary_sign(P);
            leave(P);
            return u;
        }
    }
    return parse_call_member(P);
}

static csd_chat_node *parse_filter(parser *P) {
    csd_chat_node *operand = parse_unary_sign(P);
    while (is(P, CSD_CHAT_T_PIPE)) {
        uint32_t pos = here(P);
        P->cur++;
        csd_chat_node *f = parse_primary(P);
        if (f->kind != CSD_CHAT_N_IDENT)
            csd_chat_raise(P->a->fail, CSD_EFORMAT, f->pos, "expected identifier for the filter");
        if (is(P, CSD_CHAT_T_LPAREN)) f = parse_call(P, f);
        csd_chat_node *x = mk(P, CSD_CHAT_N_FILTER, pos);
        x->a = operand;
        x->b = f;
        operand = x;
    }
    return operand;
}

static csd_chat_node *parse_test(parser *P) {
    csd_chat_node *operand = parse_filter(P);
    while (is_ident(P, "is")) {
        uint32_t pos = here(P);
        P->cur++;
        bool negate = is_ident(P, "not");
        if (negate) P->cur++;
        csd_chat_node *t = parse_primary(P);
        if (t->kind != CSD_CHAT_N_IDENT)
            csd_chat_raise(P->a->fail, CSD_EFORMAT, t->pos, "expected identifier for the test");
        csd_chat_node *x = mk(P, CSD_CHAT_N_TEST, pos);
        x->a = operand;
        x->s = t->s;
        x->slen = t->slen;
        x->flag = negate;
        operand = x;
    }
    return operand;
}

static int op_of(const csd_chat_tok *tk) {
    static const struct {
        const char *s;
        int op;
    } ops[] = {{"==", CSD_CHAT_OP_EQ}, {"!=", CSD_CHAT_OP_NE},   {"<", CSD_CHAT_OP_LT},
               {">", CSD_CHAT_OP_GT},  {"<=", CSD_CHAT_OP_LE},   {">=", CSD_CHAT_OP_GE},
               {"+", CSD_CHAT_OP_ADD}, {"-", CSD_CHAT_OP_SUB},   {"~", CSD_CHAT_OP_CONCAT},
               {"*", CSD_CHAT_OP_MUL}, {"/", CSD_CHAT_OP_DIV},   {"//", CSD_CHAT_OP_FLOORDIV},
               {"%", CSD_CHAT_OP_MOD}, {"**", CSD_CHAT_OP_POW}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strlen(ops[i].s) == tk->n && memcmp(ops[i].s, tk->p, tk->n) == 0) return ops[i].op;
    return CSD_CHAT_OP_NONE;
}

static csd_chat_node *binary(parser *P, int op, uint32_t pos, csd_chat_node *l, csd_chat_node *r) {
    csd_chat_node *x = mk(P, CSD_CHAT_N_BINARY, pos);
    x->op = op;
    x->a = l;
    x->b = r;
    return x;
}

static csd_chat_node *parse_power(parser *P) {
    csd_chat_node *l = parse_test(P);
    while (is(P, CSD_CHAT_T_POW)) {
        uint32_t pos = here(P);
        P->cur++;
        l = binary(P, CSD_CHAT_OP_POW, pos, l, parse_test(P));
    }
    return l;
}

static csd_chat_node *parse_mul(parser *P) {
    csd_chat_node *l = parse_power(P);
    while (is(P, CSD_CHAT_T_MUL)) {
        const csd_chat_tok *tk = &P->t[P->cur++];
        l = binary(P, op_of(tk), tk->pos, l, parse_power(P));
    }
    return l;
}

static csd_chat_node *parse_add(parser *P) {
    csd_chat_node *l = parse_mul(P);
    while (is(P, CSD_CHAT_T_ADD)) {
        const csd_chat_tok *tk = &P->t[P->cur++];
        l = binary(P, op_of(tk), tk->pos, l, parse_mul(P));
    }
    return l;
}

static csd_chat_node *parse_comparison(parser *P) {
    csd_chat_node *l = parse_add(P);
    for (;;) {
        uint32_t pos = here(P);
        int op;
        if (is_ident2(P, "not", "in")) {
            op = CSD_CHAT_OP_NOTIN;
            P->cur += 2;
        } else if (is_ident(P, "in")) {
            op = CSD_CHAT_OP_IN;
            P->cur++;
        } else if (is(P, CSD_CHAT_T_CMP)) {
            op = op_of(&P->t[P->cur++]);
        } else {
            break;
        }
        l = binary(P, op, pos, l, parse_add(P));
    }
    return l;
}

static csd_chat_node *parse_not(parser *P) {
    csd_chat_node *right = NULL;
    while (is_ident(P, "not")) {
        uint32_t pos = here(P);
        enter(P);
        P->cur++;
        csd_chat_node *u = mk(P, CSD_CHAT_N_UNARY, pos);
        u->op = CSD_CHAT_OP_NOT;
        u->a = parse_not(P);
        leave(P);
        right = u;
    }
    return right ? right : parse_comparison(P);
}

static csd_chat_node *parse_and(parser *P) {
    csd_chat_node *l = parse_not(P);
    while (is_ident(P, "and")) {
        uint32_t pos = here(P);
        P->cur++;
        l = binary(P, CSD_CHAT_OP_AND, pos, l, parse_not(P));
    }
    return l;
}

static csd_chat_node *parse_logical_or(parser *P) {
    csd_chat_node *l = parse_and(P);
    while (is_ident(P, "or")) {
        uint32_t pos = here(P);
        P->cur++;
        l = binary(P, CSD_CHAT_OP_OR, pos, l, parse_and(P));
    }
    return l;
}

static csd_chat_node *parse_if_expr(parser *P) {
    csd_chat_node *a = parse_logical_or(P);
    if (!is_ident(P, "if")) return a;
    uint32_t pos = here(P);
    P->cur++;
    csd_chat_node *test = parse_logical_or(P);
    if (is_ident(P, "else")) {
        P->cur++;
        enter(P);
        csd_chat_node *x = mk(P, CSD_CHAT_N_TERNARY, pos);
        x->a = test;
        x->b = a;
        x->c = parse_if_expr(P);
        leave(P);
        return x;
    }
    csd_chat_node *x = mk(P, CSD_CHAT_N_SELECT, pos);
    x->a = a;
    x->b = test;
    return x;
}

static csd_chat_node *parse_expression(parser *P) {
    enter(P);
    csd_chat_node *x = parse_if_expr(P);
    leave(P);
    return x;
}

/* JS Number(): any digit count is fine (huge values become 1e+63 or Infinity). */
static csd_chat_node *parse_number(parser *P, const csd_chat_tok *tk) {
    char *buf = csd_chat_arena_strndup(P->a, tk->p, tk->n);
    csd_chat_node *x =
        mk(P, memchr(tk->p, '.', tk->n) ? CSD_CHAT_N_FLOAT : CSD_CHAT_N_INT, tk->pos);
    x->num = strtod(buf, NULL);
    return x;
}

/* A string literal; adjacent ones are joined ("a" "b" is "ab"). */
static csd_chat_node *parse_string(parser *P, const csd_chat_tok *tk) {
    csd_chat_node *x = mk(P, CSD_CHAT_N_STR, tk->pos);
    if (!is(P, CSD_CHAT_T_STR)) {
        x->s = tk->p;
        x->slen = tk->n;
        return x;
    }
    csd_chat_buf b;
    csd_chat_buf_init(&b, P->a, SIZE_MAX / 2);
    csd_chat_buf_put(&b, tk->p, tk->n);
    while (is(P, CSD_CHAT_T_STR)) {
        csd_chat_buf_put(&b, P->t[P->cur].p, P->t[P->cur].n);
        P->cur++;
    }
    x->s = b.p ? b.p : "";
    x->slen = b.len;
    return x;
}

/* [a, b, ...] after the "[" (commas optional, as in the reference). */
static csd_chat_node *parse_array(parser *P, const csd_chat_tok *tk) {
    enter(P);
    csd_chat_node *x = mk(P, CSD_CHAT_N_ARRAY, tk->pos);
    nvec v = {0};
    while (!is(P, CSD_CHAT_T_RBRACKET)) {
        nv_push(P, &v, parse_expression(P));
        if (is(P, CSD_CHAT_T_COMMA)) P->cur++;
    }
    P->cur++;
    set_list(x, &v);
    leave(P);
    return x;
}

/* {key: value, ...} after the "{": the list holds keys and values in turn. */
static csd_chat_node *parse_object(parser *P, const csd_chat_tok *tk) {
    enter(P);
    csd_chat_node *x = mk(P, CSD_CHAT_N_OBJECT, tk->pos);
    nvec v = {0};
    while (!is(P, CSD_CHAT_T_RBRACE)) {
        nv_push(P, &v, parse_expression(P));
        expect(P, CSD_CHAT_T_COLON, "':' between key and value in object literal");
        nv_push(P, &v, parse_expression(P));
        if (is(P, CSD_CHAT_T_COMMA)) P->cur++;
    }
    P->cur++;
    set_list(x, &v);
    leave(P);
    return x;
}

static csd_chat_node *parse_primary(parser *P) {
    if (P->cur >= P->n) perr(P, "expected an expression", NULL);
    const csd_chat_tok *tk = &P->t[P->cur++];
    switch (tk->type) {
    case CSD_CHAT_T_NUM:
        return parse_number(P, tk);
    case CSD_CHAT_T_STR:
        return parse_string(P, tk);
    case CSD_CHAT_T_LBRACKET:
        return parse_array(P, tk);
    case CSD_CHAT_T_LBRACE:
        return parse_object(P, tk);
    case CSD_CHAT_T_IDENT: {
        csd_chat_node *x = mk(P, CSD_CHAT_N_IDENT, tk->pos);
        x->s = tk->p;
        x->slen = tk->n;
        return x;
    }
    case CSD_CHAT_T_LPAREN: {
        enter(P);
        csd_chat_node *x = parse_sequence(P, false);
        expect(P, CSD_CHAT_T_RPAREN, "')'");
        leave(P);
        return x;
    }
    default:
        P->cur--;
        perr(P, "expected an expression", NULL);
    }
}

static const char *const END_IF[] = {"endif", NULL};
static const char *const ELSE_END_IF[] = {"elif", "else", "endif", NULL};

static csd_chat_node *parse_if(parser *P, uint32_t pos) {
    enter(P);
    csd_chat_node *x = mk(P, CSD_CHAT_N_IF, pos);
    x->a = parse_expression(P);
    expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
    nvec body = {0}, alt = {0};
    parse_body(P, &body, ELSE_END_IF, "{% endif %}");
    if (is_statement(P, (const char *const[]){"elif", NULL})) {
        uint32_t epos = P->t[P->cur + 1].pos;
        P->cur += 2;
        nv_push(P, &alt, parse_if(P, epos));
    } else if (is_statement(P, (const char *const[]){"else", NULL})) {
        P->cur += 2;
        expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
        parse_body(P, &alt, END_IF, "{% endif %}");
    }
    set_list(x, &body);
    set_list2(x, &alt);
    leave(P);
    return x;
}

static void expect_end(parser *P, const char *name) {
    expect(P, CSD_CHAT_T_OPEN_STMT, "'{%'");
    expect_ident(P, name);
    expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
}

/* The rest of a block statement after its head: "%}", the body into x's list, "{% END %}". */
static void parse_block(parser *P, csd_chat_node *x, const char *end, const char *end_text) {
    expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
    nvec body = {0};
    parse_body(P, &body, (const char *const[]){end, NULL}, end_text);
    set_list(x, &body);
    expect_end(P, end);
}

/* {% set target = value %} or the block form {% set target %}...{% endset %} (after "set"). */
static csd_chat_node *parse_set(parser *P, uint32_t pos) {
    csd_chat_node *x = mk(P, CSD_CHAT_N_SET, pos);
    x->a = parse_sequence(P, false);
    if (is(P, CSD_CHAT_T_EQUALS)) {
        P->cur++;
        x->b = parse_sequence(P, false);
    } else {
        expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
        nvec body = {0};
        parse_body(P, &body, (const char *const[]){"endset", NULL}, "{% endset %}");
        set_list(x, &body);
        expect(P, CSD_CHAT_T_OPEN_STMT, "'{%'");
        expect_ident(P, "endset");
    }
    expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
    return x;
}

/* CSD_CHAT_MENTIONS_* for the names kwargs / varargs read in n (an identifier node, not a
 * keyword argument's or a test's name), nested macros' bodies included. */
static int mentions(const csd_chat_node *n, int depth) {
    if (!n || depth > CSD_CHAT_MAX_PARSE_DEPTH * 4) return 0;
    int m = 0;
    if (n->kind == CSD_CHAT_N_IDENT && n->slen == 6 && memcmp(n->s, "kwargs", 6) == 0)
        m |= CSD_CHAT_MENTIONS_KWARGS;
    if (n->kind == CSD_CHAT_N_IDENT && n->slen == 7 && memcmp(n->s, "varargs", 7) == 0)
        m |= CSD_CHAT_MENTIONS_VARARGS;
    m |= mentions(n->a, depth + 1) | mentions(n->b, depth + 1) | mentions(n->c, depth + 1);
    for (size_t i = 0; i < n->nlist; i++) m |= mentions(n->list[i], depth + 1);
    for (size_t i = 0; i < n->nlist2; i++) m |= mentions(n->list2[i], depth + 1);
    return m;
}

/* {% macro name(params) %}...{% endmacro %} (after "macro"). */
static csd_chat_node *parse_macro(parser *P, uint32_t pos) {
    csd_chat_node *x = mk(P, CSD_CHAT_N_MACRO, pos);
    csd_chat_node *name = parse_primary(P);
    if (name->kind != CSD_CHAT_N_IDENT)
        csd_chat_raise(P->a->fail, CSD_EFORMAT, name->pos, "expected identifier after macro");
    x->s = name->s;
    x->slen = name->slen;
    nvec params = {0};
    parse_args(P, &params, true);
    set_list2(x, &params);
    parse_block(P, x, "endmacro", "{% endmacro %}");
    for (size_t i = 0; i < x->nlist; i++) x->op |= mentions(x->list[i], 0);
    return x;
}

/* {% for target in iterable %}...[{% else %}...]{% endfor %} (after "for"). */
static csd_chat_node *parse_for(parser *P, uint32_t pos) {
    csd_chat_node *x = mk(P, CSD_CHAT_N_FOR, pos);
    x->a = parse_sequence(P, true);
    if (x->a->kind != CSD_CHAT_N_IDENT && x->a->kind != CSD_CHAT_N_TUPLE)
        csd_chat_raise(P->a->fail, CSD_EFORMAT, x->a->pos,
                       "expected identifier/tuple for the loop variable");
    if (!is_ident(P, "in")) perr(P, "expected `in` keyword following loop variable", NULL);
    P->cur++;
    x->b = parse_expression(P);
    expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
    nvec body = {0}, alt = {0};
    parse_body(P, &body, (const char *const[]){"endfor", "else", NULL}, "{% endfor %}");
    if (is_statement(P, (const char *const[]){"else", NULL})) {
        P->cur += 2;
        expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
        parse_body(P, &alt, (const char *const[]){"endfor", NULL}, "{% endfor %}");
    }
    set_list(x, &body);
    set_list2(x, &alt);
    expect_end(P, "endfor");
    return x;
}

/* {% filter name[(args)] %}...{% endfilter %} (after "filter"). */
static csd_chat_node *parse_filter_block(parser *P, uint32_t pos) {
    csd_chat_node *x = mk(P, CSD_CHAT_N_FILTER_STMT, pos);
    csd_chat_node *f = parse_primary(P);
    if (f->kind == CSD_CHAT_N_IDENT && is(P, CSD_CHAT_T_LPAREN)) f = parse_call(P, f);
    x->b = f;
    parse_block(P, x, "endfilter", "{% endfilter %}");
    return x;
}

static csd_chat_node *parse_statement(parser *P) {
    const csd_chat_tok *open = expect(P, CSD_CHAT_T_OPEN_STMT, "'{%'");
    if (!is(P, CSD_CHAT_T_IDENT)) perr(P, "unknown statement", NULL);
    const csd_chat_tok *nt = &P->t[P->cur];
    uint32_t pos = open->pos;
    if (tok_is_ident(nt, "break") || tok_is_ident(nt, "continue")) {
        csd_chat_node *x =
            mk(P, tok_is_ident(nt, "break") ? CSD_CHAT_N_BREAK : CSD_CHAT_N_CONTINUE, pos);
        P->cur++;
        expect(P, CSD_CHAT_T_CLOSE_STMT, "'%}'");
        return x;
    }
    P->cur++; /* the keyword */
    if (tok_is_ident(nt, "set")) return parse_set(P, pos);
    if (tok_is_ident(nt, "macro")) return parse_macro(P, pos);
    if (tok_is_ident(nt, "for")) return parse_for(P, pos);
    if (tok_is_ident(nt, "filter")) return parse_filter_block(P, pos);
    if (tok_is_ident(nt, "if")) {
        csd_chat_node *x = parse_if(P, pos);
        expect_end(P, "endif");
        return x;
    }
    P->cur--; /* the error points at the keyword */
    perr(P, "unknown or unsupported statement", NULL);
}

static csd_chat_node *parse_any(parser *P) {
    const csd_chat_tok *tk = &P->t[P->cur];
    switch (tk->type) {
    case CSD_CHAT_T_COMMENT:
        P->cur++;
        return mk(P, CSD_CHAT_N_COMMENT, tk->pos);
    case CSD_CHAT_T_TEXT: {
        P->cur++;
        csd_chat_node *x = mk(P, CSD_CHAT_N_TEXT, tk->pos);
        x->s = tk->p;
        x->slen = tk->n;
        return x;
    }
    case CSD_CHAT_T_OPEN_STMT: {
        enter(P);
        csd_chat_node *x = parse_statement(P);
        leave(P);
        return x;
    }
    case CSD_CHAT_T_OPEN_EXPR: {
        P->cur++;
        csd_chat_node *x = parse_expression(P);
        expect(P, CSD_CHAT_T_CLOSE_EXPR, "'}}'");
        return x;
    }
    default:
        perr(P, "unexpected token", NULL);
    }
}

csd_chat_node *csd_chat_parse(csd_chat_arena *a, const csd_chat_tok *toks, size_t n) {
    parser P = {.a = a, .t = toks, .n = n, .cur = 0, .depth = 0};
    csd_chat_node *prog = mk(&P, CSD_CHAT_N_PROGRAM, 0);
    nvec body = {0};
    while (P.cur < P.n) nv_push(&P, &body, parse_any(&P));
    set_list(prog, &body);
    return prog;
}

const char *csd_chat_op_name(int op) {
    static const char *names[CSD_CHAT_OP_COUNT] = {
        "?", "and", "or", "not", "==", "!=", "<", ">", "<=", ">=", "in", "not in",
        "+", "-", "~", "*", "/", "//", "%", "**"};
    return op >= 0 && op < CSD_CHAT_OP_COUNT ? names[op] : "?";
}
