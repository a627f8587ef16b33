/* json_accept: the JSON object acceptor (json_accept.h). step() moves a scratch copy of the state
 * by one byte; csd_json_accept_byte keeps the copy only when the byte was accepted. */
#include "model/json_accept.h"

#include <string.h>

#include "model/json_schema.h"

enum mode {
    M_START,          /* before the object: '{' */
    M_VALUE,          /* after ':' or an array's ',': any value */
    M_VALUE_OR_CLOSE, /* after '[': a value or ']' */
    M_KEY_OR_CLOSE,   /* after '{': a key or '}' */
    M_KEY,            /* after an object's ',': a key */
    M_COLON,          /* after a key */
    M_AFTER,          /* after a value: ',' or the container's close */
    M_STRING,
    M_NUMBER,
    M_LITERAL,
    M_DONE,           /* the object closed */
};

enum string_place { S_CHAR, S_ESCAPE, S_HEX };

/* A number's grammar, -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, one place per state. */
enum number_place { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const literals[] = {"true", "false", "null"};

static bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
static bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
static bool is_hex(uint8_t b) {
    return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

/* a->ws: 0 none since the last token, WS_SPACE after its one space, 1 + n after a newline and n
 * spaces or tabs */
#define WS_SPACE 0xFF

/* Whitespace between tokens of the grammar: " ", or "\n" and up to CSD_JSON_MAX_INDENT of [ \t]. */
static bool take_ws(csd_json_accept *a, uint8_t b) {
    if (a->ws == 0) {
        if (b != ' ' && b != '\n') return false;
        a->ws = b == ' ' ? WS_SPACE : 1;
        return true;
    }
    if (a->ws == WS_SPACE || (b != ' ' && b != '\t') || a->ws > CSD_JSON_MAX_INDENT) return false;
    a->ws++;
    return true;
}

/* ---- Schema ----
 * With a schema, every value starts against a node (a->value_node): its first byte must be of one
 * of the node's types, and an enum's value must be one of its literals byte for byte. Keys of an
 * object with properties are matched the same way against the properties that may come next. The
 * base grammar above still decides what is JSON; these checks only narrow it, and never to
 * nothing: every node has a type or a literal, and an object or array closes whenever its
 * required properties or minItems allow. A union of objects starts as a node whose one property
 * is the discriminator; its value picks the branch, whose node the object takes from there. */

static const csd_schema_node *node_at(const csd_json_accept *a, uint16_t id) {
    return &a->schema->nodes[id];
}

static const csd_schema_node *top_node(const csd_json_accept *a) {
    return node_at(a, a->node[a->depth - 1]);
}

static uint64_t low_bits(uint32_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

/* Byte b against the candidates' bytes at match_len: the ones that go on with it stay. */
static bool match_byte(csd_json_accept *a, uint8_t b) {
    uint64_t keep = 0;
    for (uint64_t c = a->cand; c; c &= c - 1) {
        int i = __builtin_ctzll(c);
        const csd_schema_lit *l = &a->schema->lits[a->lit_base + i];
        if (l->len > a->match_len && a->schema->bytes[l->off + a->match_len] == b)
            keep |= 1ull << i;
    }
    if (!keep) return false;
    a->cand = keep;
    a->match_len++;
    return true;
}

/* The key or value ended: the candidate it spelled whole (its bit place), or -1. */
static int match_end(csd_json_accept *a) {
    a->matching = false;
    for (uint64_t c = a->cand; c; c &= c - 1) {
        int i = __builtin_ctzll(c);
        if (a->schema->lits[a->lit_base + i].len == a->match_len) return i;
    }
    return -1;
}

static void start_match(csd_json_accept *a, uint16_t base, uint64_t cand) {
    a->matching = true;
    a->lit_base = base;
    a->cand = cand;
    a->match_len = 0;
}

/* The first required property at or after place i, or n when none is. */
static uint16_t next_required(const csd_json_accept *a, const csd_schema_node *n, uint16_t i) {
    while (i < n->n_props && !a->schema->props[n->first_prop + i].required) i++;
    return i;
}

/* The type of a value starting with b, as CSD_JT_* bits. */
static uint8_t type_of_start(uint8_t b) {
    if (b == '{') return CSD_JT_OBJECT;
    if (b == '[') return CSD_JT_ARRAY;
    if (b == '"') return CSD_JT_STRING;
    if (b == '-' || is_digit(b)) return CSD_JT_INTEGER | CSD_JT_NUMBER;
    if (b == 't' || b == 'f') return CSD_JT_BOOLEAN;
    return b == 'n' ? CSD_JT_NULL : 0;
}

/* A value starting with b: an array's item (which counts) against the array's items node, any
 * other value against a->value_node. Either way it becomes a->value_node, which a container the
 * value opens takes. */
static bool schema_value(csd_json_accept *a, uint8_t b) {
    if (!a->schema) return true;
    bool item = a->depth > 0 && a->stack[a->depth - 1] == '[';
    if (item) a->value_node = top_node(a)->items;
    const csd_schema_node *n = node_at(a, a->value_node);
    if (!(n->types & type_of_start(b))) return false;
    if (item) {
        if (a->count[a->depth - 1] >= top_node(a)->max_items) return false;
        a->count[a->depth - 1]++;
    }
    a->integer_only = !n->n_lits && !(n->types & CSD_JT_NUMBER); /* literals decide for enums */
    a->matching = false;
    if (!n->n_lits) return true;
    start_match(a, n->first_lit, low_bits(n->n_lits));
    return match_byte(a, b);
}

/* A container just opened (its depth pushed): it takes the value's node. */
static void schema_open(csd_json_accept *a) {
    if (!a->schema) return;
    a->node[a->depth - 1] = a->value_node;
    a->count[a->depth - 1] = 0;
}

/* May the open container close now (its required properties written, minItems reached)? */
static bool schema_may_close(const csd_json_accept *a) {
    if (!a->schema) return true;
    const csd_schema_node *n = top_node(a);
    uint16_t k = a->count[a->depth - 1];
    if (a->stack[a->depth - 1] == '[') return k >= n->min_items;
    return n->free_object || next_required(a, n, k) == n->n_props;
}

/* May another member or item follow (a ',')? */
static bool schema_may_continue(const csd_json_accept *a) {
    if (!a->schema) return true;
    const csd_schema_node *n = top_node(a);
    uint16_t k = a->count[a->depth - 1];
    if (a->stack[a->depth - 1] == '[') return k < n->max_items;
    return n->free_object || k < n->n_props;
}

/* A key starts (its opening quote): the properties that may come next are its candidates. */
static bool schema_key(csd_json_accept *a) {
    if (!a->schema) return true;
    const csd_schema_node *n = top_node(a);
    if (n->free_object) return true;
    uint16_t k = a->count[a->depth - 1];
    if (k >= n->n_props) return false;
    uint16_t last = next_required(a, n, k);
    if (last == n->n_props) last = n->n_props - 1;
    uint64_t cand = low_bits(last + 1u) & ~low_bits(k);
    start_match(a, a->schema->props[n->first_prop].key_lit, cand);
    return match_byte(a, '"');
}

/* A key ended: the property it names sets the value's node and the object's next place. */
static bool schema_key_end(csd_json_accept *a) {
    if (!a->schema) return true;
    if (!a->matching) {
        a->value_node = 0; /* a member of a free object: any value */
        return true;
    }
    int p = match_end(a);
    if (p < 0) return false;
    const csd_schema_node *n = top_node(a);
    a->value_node = a->schema->props[n->first_prop + p].node;
    a->count[a->depth - 1] = (uint16_t)(p + 1);
    return true;
}

/* A byte of the current key or value while it is matched, and its end. */
static bool schema_byte(csd_json_accept *a, uint8_t b) { return !a->matching || match_byte(a, b); }

/* A matched value ended. In a union of objects it is the discriminator (a tagged node's one
 * property), and the literal it spelled names the branch whose properties follow. */
static bool schema_value_end(csd_json_accept *a) {
    if (!a->matching) return true;
    int i = match_end(a);
    if (i < 0) return false;
    if (a->depth > 0 && a->stack[a->depth - 1] == '{' && top_node(a)->tagged)
        a->node[a->depth - 1] = a->schema->lits[a->lit_base + i].alt;
    return true;
}

static bool open_container(csd_json_accept *a, uint8_t b) {
    if (a->depth >= CSD_JSON_MAX_DEPTH) return false;
    a->stack[a->depth++] = b;
    a->mode = b == '{' ? M_KEY_OR_CLOSE : M_VALUE_OR_CLOSE;
    schema_open(a);
    return true;
}

static bool close_container(csd_json_accept *a, uint8_t b) {
    uint8_t want = b == '}' ? '{' : '[';
    if (a->depth == 0 || a->stack[a->depth - 1] != want || !schema_may_close(a)) return false;
    a->depth--;
    a->mode = a->depth == 0 ? M_DONE : M_AFTER;
    return true;
}

static void start_string(csd_json_accept *a, bool key) {
    a->mode = M_STRING;
    a->sub = S_CHAR;
    a->key = key;
    a->utf8_left = 0;
}

static bool start_value(csd_json_accept *a, uint8_t b) {
    if (!schema_value(a, b)) return false;
    if (b == '{' || b == '[') return open_container(a, b);
    if (b == '"') {
        start_string(a, false);
        return true;
    }
    if (b == '-' || is_digit(b)) {
        a->mode = M_NUMBER;
        a->sub = b == '-' ? N_MINUS : b == '0' ? N_ZERO : N_INT;
        a->len = 1;
        return true;
    }
    for (uint8_t i = 0; i < 3; i++) {
        if (b == (uint8_t)literals[i][0]) {
            a->mode = M_LITERAL;
            a->literal = i;
            a->len = 1;
            return true;
        }
    }
    return false;
}

/* The first byte of a UTF-8 character inside a string: how many continuation bytes follow, and the
 * range of the first of them (which excludes overlong forms, surrogates and beyond U+10FFFF). */
static bool start_utf8(csd_json_accept *a, uint8_t b) {
    a->utf8_lo = 0x80;
    a->utf8_hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) a->utf8_left = 1;
    else if (b >= 0xE0 && b <= 0xEF) a->utf8_left = 2;
    else if (b >= 0xF0 && b <= 0xF4) a->utf8_left = 3;
    else return false;
    if (b == 0xE0) a->utf8_lo = 0xA0;
    if (b == 0xED) a->utf8_hi = 0x9F;
    if (b == 0xF0) a->utf8_lo = 0x90;
    if (b == 0xF4) a->utf8_hi = 0x8F;
    return true;
}

/* Digit a->len (0-3) of a \u escape. A low surrogate (DC00-DFFF) may come only right after a
 * high one (D800-DBFF), and must come then. The first two digits decide it, so no digit is a dead
 * end. */
static bool hex_digit(csd_json_accept *a, uint8_t b) {
    if (!is_hex(b)) return false;
    uint8_t lower = b | 0x20, place = a->len++;
    if (place == 0) {
        if (a->want_low && lower != 'd') return false;
        a->escape_d = lower == 'd';
    } else if (place == 1 && a->escape_d) {
        bool low = lower >= 'c' && lower <= 'f';
        bool high = (lower >= '8' && lower <= '9') || lower == 'a' || lower == 'b';
        if (a->want_low != low) return false;
        a->want_low = high; /* a high half waits for its low half; a low half completes a pair */
    }
    if (a->len == 4) a->sub = S_CHAR;
    return true;
}

static bool string_byte(csd_json_accept *a, uint8_t b) {
    if (!schema_byte(a, b)) return false;
    if (a->utf8_left) {
        if (b < a->utf8_lo || b > a->utf8_hi) return false;
        a->utf8_left--;
        a->utf8_lo = 0x80;
        a->utf8_hi = 0xBF;
        return true;
    }
    if (a->sub == S_ESCAPE) {
        if (b == 'u') {
            a->sub = S_HEX;
            a->len = 0;
            return true;
        }
        a->sub = S_CHAR;
        return !a->want_low && b != 0 && strchr("\"\\/bfnrt", b) != NULL;
    }
    if (a->sub == S_HEX) return hex_digit(a, b);
    if (a->want_low) { /* only the low half's escape may follow a high half */
        if (b != '\\') return false;
        a->sub = S_ESCAPE;
        return true;
    }
    if (b == '"') {
        a->mode = a->key ? M_COLON : M_AFTER;
        return a->key ? schema_key_end(a) : schema_value_end(a);
    }
    if (b == '\\') {
        a->sub = S_ESCAPE;
        return true;
    }
    if (b < 0x20) return false; /* control characters must be escaped */
    return b < 0x80 || start_utf8(a, b);
}

static bool step(csd_json_accept *a, uint8_t b);

/* The number's place after byte b, or -1 when b does not continue it. */
static int number_next(uint8_t place, uint8_t b) {
    bool digit = is_digit(b), exp = b == 'e' || b == 'E';
    switch (place) {
    case N_MINUS: return b == '0' ? N_ZERO : digit ? N_INT : -1;
    case N_ZERO: return b == '.' ? N_DOT : exp ? N_E : -1;
    case N_INT: return digit ? N_INT : b == '.' ? N_DOT : exp ? N_E : -1;
    case N_DOT: return digit ? N_FRAC : -1;
    case N_FRAC: return digit ? N_FRAC : exp ? N_E : -1;
    case N_E: return b == '+' || b == '-' ? N_ESIGN : digit ? N_EXP : -1;
    case N_ESIGN: return digit ? N_EXP : -1;
    default: return digit ? N_EXP : -1; /* N_EXP */
    }
}

/* A number ends at the first byte that does not continue it, which then counts as what follows the
 * value; it may end only where its grammar is complete. */
static bool number_byte(csd_json_accept *a, uint8_t b) {
    int next = number_next(a->sub, b);
    bool complete = a->sub == N_ZERO || a->sub == N_INT || a->sub == N_FRAC || a->sub == N_EXP;
    if (next >= 0) {
        /* past the cap a complete number must end; an incomplete one may still complete */
        if (a->len >= CSD_JSON_MAX_NUMBER && complete) return false;
        if (a->integer_only && (next == N_DOT || next == N_E)) return false;
        if (!schema_byte(a, b)) return false;
        if (a->len < UINT8_MAX) a->len++;
        a->sub = (uint8_t)next;
        return true;
    }
    if (!complete || !schema_value_end(a)) return false;
    a->mode = M_AFTER;
    return step(a, b);
}

static bool literal_byte(csd_json_accept *a, uint8_t b) {
    const char *lit = literals[a->literal];
    if (b != (uint8_t)lit[a->len] || !schema_byte(a, b)) return false;
    if (lit[++a->len] != '\0') return true;
    a->mode = M_AFTER;
    return schema_value_end(a);
}

static bool structural_byte(csd_json_accept *a, uint8_t b) {
    switch (a->mode) {
    case M_START: return b == '{' && open_container(a, b);
    case M_VALUE: return start_value(a, b);
    case M_VALUE_OR_CLOSE: return b == ']' ? close_container(a, b) : start_value(a, b);
    case M_KEY_OR_CLOSE:
        if (b == '}') return close_container(a, b);
        /* fall through */
    case M_KEY:
        if (b != '"') return false;
        start_string(a, true);
        return schema_key(a);
    case M_COLON:
        if (b != ':') return false;
        a->mode = M_VALUE;
        return true;
    case M_AFTER:
        if (b == '}' || b == ']') return close_container(a, b);
        if (b != ',' || !schema_may_continue(a)) return false;
        a->mode = a->stack[a->depth - 1] == '{' ? M_KEY : M_VALUE;
        return true;
    default: return false; /* M_DONE */
    }
}

static bool step(csd_json_accept *a, uint8_t b) {
    switch (a->mode) {
    case M_STRING: return string_byte(a, b);
    case M_NUMBER: return number_byte(a, b);
    case M_LITERAL: return literal_byte(a, b);
    case M_DONE: return false;
    default: break;
    }
    if (is_ws(b)) return take_ws(a, b);
    a->ws = 0;
    return structural_byte(a, b);
}

void csd_json_accept_init(csd_json_accept *a) {
    memset(a, 0, sizeof *a);
    a->mode = M_START;
}

void csd_json_accept_init_schema(csd_json_accept *a, const csd_json_schema *schema) {
    csd_json_accept_init(a);
    a->schema = schema;
    a->value_node = schema->root;
}

bool csd_json_accept_byte(csd_json_accept *a, uint8_t b) {
    csd_json_accept next = *a;
    if (!step(&next, b)) return false;
    *a = next;
    return true;
}

bool csd_json_accept_bytes(csd_json_accept *a, const uint8_t *p, uint32_t n) {
    csd_json_accept next = *a;
    for (uint32_t i = 0; i < n; i++)
        if (!step(&next, p[i])) return false;
    *a = next;
    return true;
}

bool csd_json_accept_done(const csd_json_accept *a) { return a->mode == M_DONE; }

bool csd_json_accept_in_text(const csd_json_accept *a) {
    return a->mode == M_STRING && a->sub == S_CHAR && a->utf8_left == 0 && !a->want_low &&
           !a->matching;
}
