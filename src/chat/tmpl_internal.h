/* tmpl_internal: shared internals of the chat-template engine (lexer, parser, values, interpreter).
 * Everything a template or a render allocates lives in one csd_chat_arena, so an error anywhere can
 * unwind with longjmp to the public entry point, which frees the arena: no per-value ownership.
 * Semantics mirror @huggingface/jinja (the reference); see docs/chat_templates.md. */
#ifndef CSD_CHAT_TMPL_INTERNAL_H
#define CSD_CHAT_TMPL_INTERNAL_H

#include <jansson.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/err.h"

/* Position unknown (errors without a location). */
#define CSD_CHAT_NOPOS UINT32_MAX
/* Parser recursion limit: nesting of blocks plus expression nesting. */
#define CSD_CHAT_MAX_PARSE_DEPTH 200
/* Interpreter recursion limit (statement + expression + macro frames). */
#define CSD_CHAT_MAX_EVAL_DEPTH 400
/* Parameters one macro may declare (their duplicate check is quadratic; real ones have < 10). */
#define CSD_CHAT_MAX_PARAMS 255
/* Nesting limit when converting JSON in or out (also breaks namespace self-reference cycles). */
#define CSD_CHAT_MAX_JSON_DEPTH 128

/* ---- failure: one jump target per public call ---- */

typedef struct csd_chat_fail {
    jmp_buf jb;
    int code;                 /* CSD_E* recorded by csd_chat_raise */
    csd_err *err;             /* may be NULL */
    const char *src;          /* original template text, for line/column */
    const char *what;         /* "syntax error" or "render error" */
} csd_chat_fail;

/* Records "<what> at line L, column C: message" and longjmps to f->jb. pos is an offset into the
 * original template source or CSD_CHAT_NOPOS. */
_Noreturn void csd_chat_raise(csd_chat_fail *f, int code, uint32_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- arena ---- */

typedef struct csd_chat_chunk csd_chat_chunk;

typedef struct csd_chat_arena {
    csd_chat_chunk *head;
    size_t total;             /* bytes obtained from csd_alloc so far */
    size_t limit;             /* raise CSD_EFULL beyond this many bytes */
    csd_chat_fail *fail;      /* where allocation failures jump */
} csd_chat_arena;

void csd_chat_arena_init(csd_chat_arena *a, size_t limit, csd_chat_fail *fail);
void csd_chat_arena_fini(csd_chat_arena *a);
/* Zeroed, 16-byte aligned memory valid until fini; raises on failure (never returns NULL). */
void *csd_chat_arena_alloc(csd_chat_arena *a, size_t n);
char *csd_chat_arena_strndup(csd_chat_arena *a, const char *s, size_t n);

/* Growable byte buffer living in an arena (old storage is abandoned to the arena on growth). */
typedef struct csd_chat_buf {
    csd_chat_arena *arena;
    char *p;
    size_t len, cap;
    size_t limit;             /* raise CSD_ERANGE when len would exceed this */
} csd_chat_buf;

void csd_chat_buf_init(csd_chat_buf *b, csd_chat_arena *a, size_t limit);
void csd_chat_buf_put(csd_chat_buf *b, const char *s, size_t n);
void csd_chat_buf_puts(csd_chat_buf *b, const char *s);
void csd_chat_buf_putc(csd_chat_buf *b, char c);

/* ---- tokens (lexer) ---- */

enum csd_chat_tok_type {
    CSD_CHAT_T_TEXT = 0,
    CSD_CHAT_T_NUM,
    CSD_CHAT_T_STR,
    CSD_CHAT_T_IDENT,
    CSD_CHAT_T_EQUALS,
    CSD_CHAT_T_LPAREN,
    CSD_CHAT_T_RPAREN,
    CSD_CHAT_T_OPEN_STMT,
    CSD_CHAT_T_CLOSE_STMT,
    CSD_CHAT_T_OPEN_EXPR,
    CSD_CHAT_T_CLOSE_EXPR,
    CSD_CHAT_T_LBRACKET,
    CSD_CHAT_T_RBRACKET,
    CSD_CHAT_T_LBRACE,
    CSD_CHAT_T_RBRACE,
    CSD_CHAT_T_COMMA,
    CSD_CHAT_T_DOT,
    CSD_CHAT_T_COLON,
    CSD_CHAT_T_PIPE,
    CSD_CHAT_T_ADD,       /* + - ~ */
    CSD_CHAT_T_MUL,       /* * / // % */
    CSD_CHAT_T_POW,       /* ** */
    CSD_CHAT_T_CMP,       /* < > <= >= == != */
    CSD_CHAT_T_UNARY,     /* unary + - */
    CSD_CHAT_T_COMMENT,
    CSD_CHAT_T_COUNT
};

typedef struct csd_chat_tok {
    int type;
    const char *p;            /* token text (unescaped for strings), arena-owned */
    size_t n;
    uint32_t pos;             /* offset in the original source */
} csd_chat_tok;

/* Preprocesses (trim_blocks, lstrip_blocks, generation tags) and tokenizes src. */
void csd_chat_lex(csd_chat_arena *a, const char *src, size_t len, csd_chat_tok **out,
                  size_t *n_out);

/* ---- AST ---- */

enum csd_chat_node_kind {
    CSD_CHAT_N_PROGRAM = 0,
    CSD_CHAT_N_TEXT,          /* s */
    CSD_CHAT_N_STR,           /* s */
    CSD_CHAT_N_INT,           /* num */
    CSD_CHAT_N_FLOAT,         /* num */
    CSD_CHAT_N_ARRAY,         /* list */
    CSD_CHAT_N_TUPLE,         /* list */
    CSD_CHAT_N_OBJECT,        /* list = key0, val0, key1, val1 ... */
    CSD_CHAT_N_IDENT,         /* s */
    CSD_CHAT_N_MEMBER,        /* a = object, b = property, flag = computed */
    CSD_CHAT_N_SLICE,         /* a, b, c = start, stop, step (each may be NULL) */
    CSD_CHAT_N_CALL,          /* a = callee, list = args */
    CSD_CHAT_N_KWARG,         /* s = key, a = value */
    CSD_CHAT_N_SPREAD,        /* a */
    CSD_CHAT_N_KWSPREAD,      /* a */
    CSD_CHAT_N_UNARY,         /* op, a */
    CSD_CHAT_N_BINARY,        /* op, a, b */
    CSD_CHAT_N_FILTER,        /* a = operand, b = IDENT or CALL */
    CSD_CHAT_N_TEST,          /* a = operand, s = test name, flag = negate */
    CSD_CHAT_N_SELECT,        /* a = lhs, b = test */
    CSD_CHAT_N_TERNARY,       /* a = cond, b = true, c = false */
    CSD_CHAT_N_IF,            /* a = test, list = body, list2 = alternate */
    CSD_CHAT_N_FOR,           /* a = loopvar, b = iterable, list = body, list2 = else */
    CSD_CHAT_N_SET,           /* a = assignee, b = value or NULL, list = body */
    CSD_CHAT_N_MACRO,         /* s = name, list = body, list2 = params, op = CSD_CHAT_MENTIONS_* */
    CSD_CHAT_N_BREAK,
    CSD_CHAT_N_CONTINUE,
    CSD_CHAT_N_COMMENT,
    CSD_CHAT_N_FILTER_STMT,   /* b = filter (IDENT or CALL), list = body */
    CSD_CHAT_N_COUNT
};

/* A macro's op: its body (nested macros included) reads `kwargs` / `varargs`, found once when it
 * is parsed so that running the {% macro %} statement does not walk the body again. */
#define CSD_CHAT_MENTIONS_KWARGS 1
#define CSD_CHAT_MENTIONS_VARARGS 2

/* Binary / unary operators. */
enum csd_chat_op {
    CSD_CHAT_OP_NONE = 0,
    CSD_CHAT_OP_AND, CSD_CHAT_OP_OR, CSD_CHAT_OP_NOT,
    CSD_CHAT_OP_EQ, CSD_CHAT_OP_NE, CSD_CHAT_OP_LT, CSD_CHAT_OP_GT, CSD_CHAT_OP_LE, CSD_CHAT_OP_GE,
    CSD_CHAT_OP_IN, CSD_CHAT_OP_NOTIN,
    CSD_CHAT_OP_ADD, CSD_CHAT_OP_SUB, CSD_CHAT_OP_CONCAT,
    CSD_CHAT_OP_MUL, CSD_CHAT_OP_DIV, CSD_CHAT_OP_FLOORDIV, CSD_CHAT_OP_MOD, CSD_CHAT_OP_POW,
    CSD_CHAT_OP_COUNT
};

typedef struct csd_chat_node csd_chat_node;
struct csd_chat_node {
    int kind;
    int op;
    uint32_t pos;
    bool flag;
    const char *s;
    size_t slen;
    double num;
    csd_chat_node *a, *b, *c;
    csd_chat_node **list;
    size_t nlist;
    csd_chat_node **list2;
    size_t nlist2;
};

/* Parses tokens into a PROGRAM node (raises on error). */
csd_chat_node *csd_chat_parse(csd_chat_arena *a, const csd_chat_tok *toks, size_t n);
const char *csd_chat_op_name(int op);

/* ---- runtime values ---- */

enum csd_chat_vtype {
    CSD_CHAT_V_UNDEF = 0,
    CSD_CHAT_V_NULL,
    CSD_CHAT_V_BOOL,
    CSD_CHAT_V_INT,           /* a JS number flagged integral, like the reference's IntegerValue */
    CSD_CHAT_V_FLOAT,
    CSD_CHAT_V_STR,
    CSD_CHAT_V_ARR,           /* also tuples (flag) */
    CSD_CHAT_V_OBJ,           /* insertion-ordered map; also keyword-argument bags */
    CSD_CHAT_V_NS,            /* namespace(): mutable map without builtins */
    CSD_CHAT_V_FUNC,
    CSD_CHAT_V_COUNT
};

typedef struct csd_chat_arr csd_chat_arr;
typedef struct csd_chat_obj csd_chat_obj;
typedef struct csd_chat_func csd_chat_func;

typedef struct csd_chat_val {
    int type;
    bool tuple;               /* CSD_CHAT_V_ARR built from a tuple literal */
    bool kwargs;              /* CSD_CHAT_V_OBJ holding keyword arguments */
    union {
        bool b;
        double num;
        struct {
            const char *p;
            size_t n;
        } s;
        csd_chat_arr *arr;
        csd_chat_obj *obj;
        csd_chat_func *fn;
    } u;
} csd_chat_val;

struct csd_chat_arr {
    size_t n;
    csd_chat_val *items;
};

struct csd_chat_obj {
    size_t n, cap;
    const char **keys;
    size_t *klens;
    csd_chat_val *vals;
};

/* Function kinds: globals, bound string/object methods, macros. */
enum csd_chat_fn_kind {
    CSD_CHAT_FN_NAMESPACE = 0,
    CSD_CHAT_FN_RAISE,
    CSD_CHAT_FN_RANGE,
    CSD_CHAT_FN_STRFTIME,
    CSD_CHAT_FN_STR_METHOD,   /* name = method, self = string */
    CSD_CHAT_FN_OBJ_METHOD,   /* name = method, self = object */
    CSD_CHAT_FN_MACRO,        /* macro = MACRO node */
    CSD_CHAT_FN_COUNT
};

struct csd_chat_func {
    int kind;
    const char *name;
    csd_chat_val self;
    const csd_chat_node *macro;
    bool uses_kwargs, uses_varargs; /* macro body reads `kwargs` / `varargs` */
};

/* ---- value helpers (tmpl_value.c) ---- */

csd_chat_val csd_chat_v_undef(void);
csd_chat_val csd_chat_v_null(void);
csd_chat_val csd_chat_v_bool(bool b);
csd_chat_val csd_chat_v_int(double x);
csd_chat_val csd_chat_v_float(double x);
csd_chat_val csd_chat_v_str(const char *p, size_t n);
csd_chat_val csd_chat_v_cstr(const char *p);
csd_chat_val csd_chat_v_arr(csd_chat_arena *a, size_t n);
csd_chat_val csd_chat_v_obj(csd_chat_arena *a, int type);

/* Map access: returns NULL when absent. */
csd_chat_val *csd_chat_obj_get(const csd_chat_obj *o, const char *k, size_t kn);
void csd_chat_obj_set(csd_chat_arena *a, csd_chat_obj *o, const char *k, size_t kn, csd_chat_val v);

bool csd_chat_truthy(csd_chat_val v);
const char *csd_chat_type_name(int type);
/* Converts JSON (depth-limited) into a value; integral reals become integers, like JS. */
csd_chat_val csd_chat_from_json(csd_chat_arena *a, const json_t *j, int depth);

/* Appends JS Number.prototype.toString of x. */
void csd_chat_fmt_number(csd_chat_buf *b, double x);
/* Appends the reference's RuntimeValue.toString (what {{ }} prints). */
void csd_chat_to_string(csd_chat_buf *b, csd_chat_val v, uint32_t pos);
/* Appends JS String(value.value) (used by + and ~ and join). */
void csd_chat_js_string(csd_chat_buf *b, csd_chat_val v, uint32_t pos);

typedef struct csd_chat_json_opts {
    int indent;               /* <= 0: single line */
    bool ensure_ascii;
    bool sort_keys;
    const char *item_sep;     /* NULL: default */
    const char *key_sep;
    bool undefined_as_null;
} csd_chat_json_opts;
void csd_chat_to_json(csd_chat_buf *b, csd_chat_val v, const csd_chat_json_opts *o, int depth,
                      uint32_t pos);

/* JS loose equality (==) and strict equality of .value (===). */
bool csd_chat_loose_eq(csd_chat_arena *a, csd_chat_val x, csd_chat_val y, uint32_t pos);
bool csd_chat_strict_eq(csd_chat_val x, csd_chat_val y);

/* Byte length of a JS whitespace character at p (0 if none). */
size_t csd_chat_js_space(const char *p, const char *end);
/* Byte length of a JS whitespace character ending at end (0 if none). */
size_t csd_chat_js_space_back(const char *start, const char *end);
/* Decodes one UTF-8 code point (invalid bytes decode as themselves, length 1). */
size_t csd_chat_utf8_next(const char *p, const char *end, uint32_t *cp);
void csd_chat_utf8_put(csd_chat_buf *b, uint32_t cp);
/* Number of UTF-16 code units (JS string .length). */
size_t csd_chat_utf16_len(const char *p, size_t n);
/* Unicode-aware case mapping for the scripts we cover (ASCII, Latin-1, Latin Ext-A, Greek,
 * Cyrillic). */
uint32_t csd_chat_to_upper(uint32_t cp);
uint32_t csd_chat_to_lower(uint32_t cp);

/* ---- interpreter (tmpl_eval.c) and builtins (tmpl_builtins.c) ---- */

typedef struct csd_chat_scope csd_chat_scope;
typedef struct csd_chat_rt csd_chat_rt;

struct csd_chat_rt {
    csd_chat_arena *arena;
    csd_chat_fail *fail;
    csd_chat_buf *out;        /* where statements currently write */
    size_t max_str;           /* limit for any single string (and the output) */
    uint64_t steps, max_steps;
    uint64_t deadline_ns;     /* csd_now_ns() past which the render fails (its time budget) */
    uint64_t max_ms;          /* that budget, for the message */
    int depth;
    const struct tm *now;     /* fixed time for strftime_now, or NULL for the clock */
};

struct csd_chat_scope {
    csd_chat_scope *parent;
    csd_chat_obj vars;
};

void csd_chat_scope_set(csd_chat_rt *rt, csd_chat_scope *s, const char *k, size_t kn,
                        csd_chat_val v);
csd_chat_val csd_chat_scope_lookup(const csd_chat_scope *s, const char *k, size_t kn);
/* Runs a program; output goes to rt->out. */
void csd_chat_exec_program(csd_chat_rt *rt, const csd_chat_node *prog, csd_chat_scope *global);
csd_chat_val csd_chat_eval(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s);

/* Evaluated call arguments. */
typedef struct csd_chat_args {
    csd_chat_val *pos;
    size_t npos;
    csd_chat_val kw;          /* CSD_CHAT_V_OBJ (possibly empty) */
} csd_chat_args;

void csd_chat_eval_args(csd_chat_rt *rt, csd_chat_node *const *list, size_t n, csd_chat_scope *s,
                        csd_chat_args *out);
csd_chat_val csd_chat_call(csd_chat_rt *rt, csd_chat_val fn, const csd_chat_args *args,
                           csd_chat_scope *s, uint32_t pos);
csd_chat_val csd_chat_call_builtin(csd_chat_rt *rt, const csd_chat_func *f,
                                   const csd_chat_args *args, uint32_t pos);
csd_chat_val csd_chat_member(csd_chat_rt *rt, csd_chat_val obj, csd_chat_val prop, uint32_t pos);
csd_chat_val csd_chat_apply_filter(csd_chat_rt *rt, csd_chat_val operand,
                                   const csd_chat_node *filter, csd_chat_scope *s);
bool csd_chat_apply_test(csd_chat_rt *rt, const char *name, size_t n, csd_chat_val v,
                         const csd_chat_val *arg, uint32_t pos);
csd_chat_val csd_chat_new_str(csd_chat_rt *rt, const csd_chat_buf *b);
void csd_chat_step(csd_chat_rt *rt, uint32_t pos);

#endif
