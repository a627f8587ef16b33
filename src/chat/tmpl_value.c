/* tmpl_value: runtime values of the chat-template engine and their JavaScript-compatible
 * conversions (number printing, String(), JSON.stringify-style tojson, == and ===), plus the small
 * UTF-8/UTF-16 and case-mapping helpers the reference gets from JS strings. Case mapping covers
 * ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic; other scripts pass through unchanged. */
#include "chat/tmpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

csd_chat_val csd_chat_v_undef(void) { return (csd_chat_val){.type = CSD_CHAT_V_UNDEF}; }
csd_chat_val csd_chat_v_null(void) { return (csd_chat_val){.type = CSD_CHAT_V_NULL}; }
csd_chat_val csd_chat_v_bool(bool b) { return (csd_chat_val){.type = CSD_CHAT_V_BOOL, .u.b = b}; }
csd_chat_val csd_chat_v_int(double x) { return (csd_chat_val){.type = CSD_CHAT_V_INT, .u.num = x}; }
csd_chat_val csd_chat_v_float(double x) {
    return (csd_chat_val){.type = CSD_CHAT_V_FLOAT, .u.num = x};
}

csd_chat_val csd_chat_v_str(const char *p, size_t n) {
    csd_chat_val v = {.type = CSD_CHAT_V_STR};
    v.u.s.p = p ? p : "";
    v.u.s.n = p ? n : 0;
    return v;
}

csd_chat_val csd_chat_v_cstr(const char *p) { return csd_chat_v_str(p, strlen(p)); }

csd_chat_val csd_chat_v_arr(csd_chat_arena *a, size_t n) {
    csd_chat_val v = {.type = CSD_CHAT_V_ARR};
    v.u.arr = csd_chat_arena_alloc(a, sizeof *v.u.arr);
    v.u.arr->n = n;
    if (n > SIZE_MAX / sizeof(csd_chat_val))
        csd_chat_raise(a->fail, CSD_EFULL, CSD_CHAT_NOPOS, "array too large");
    v.u.arr->items = csd_chat_arena_alloc(a, n * sizeof(csd_chat_val));
    return v;
}

csd_chat_val csd_chat_v_obj(csd_chat_arena *a, int type) {
    csd_chat_val v = {.type = type};
    v.u.obj = csd_chat_arena_alloc(a, sizeof *v.u.obj);
    return v;
}

csd_chat_val *csd_chat_obj_get(const csd_chat_obj *o, const char *k, size_t kn) {
    for (size_t i = 0; i < o->n; i++)
        if (o->klens[i] == kn && memcmp(o->keys[i], k, kn) == 0) return &o->vals[i];
    return NULL;
}

void csd_chat_obj_set(csd_chat_arena *a, csd_chat_obj *o, const char *k, size_t kn,
                      csd_chat_val v) {
    csd_chat_val *slot = csd_chat_obj_get(o, k, kn);
    if (slot) {
        *slot = v;
        return;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 4;
        const char **keys = csd_chat_arena_alloc(a, cap * sizeof *keys);
        size_t *klens = csd_chat_arena_alloc(a, cap * sizeof *klens);
        csd_chat_val *vals = csd_chat_arena_alloc(a, cap * sizeof *vals);
        if (o->n) {
            memcpy(keys, o->keys, o->n * sizeof *keys);
            memcpy(klens, o->klens, o->n * sizeof *klens);
            memcpy(vals, o->vals, o->n * sizeof *vals);
        }
        o->keys = keys;
        o->klens = klens;
        o->vals = vals;
        o->cap = cap;
    }
    o->keys[o->n] = k;
    o->klens[o->n] = kn;
    o->vals[o->n] = v;
    o->n++;
}

bool csd_chat_truthy(csd_chat_val v) {
    switch (v.type) {
    case CSD_CHAT_V_BOOL: return v.u.b;
    case CSD_CHAT_V_INT:
    case CSD_CHAT_V_FLOAT: return v.u.num != 0 && !isnan(v.u.num);
    case CSD_CHAT_V_STR: return v.u.s.n > 0;
    case CSD_CHAT_V_ARR: return v.u.arr->n > 0;
    case CSD_CHAT_V_OBJ: return v.u.obj->n > 0;
    case CSD_CHAT_V_NS:
    case CSD_CHAT_V_FUNC: return true;
    default: return false;
    }
}

const char *csd_chat_type_name(int type) {
    static const char *names[CSD_CHAT_V_COUNT] = {
        "UndefinedValue", "NullValue",  "BooleanValue", "IntegerValue",   "FloatValue",
        "StringValue",    "ArrayValue", "ObjectValue",  "NamespaceValue", "FunctionValue"};
    return type >= 0 && type < CSD_CHAT_V_COUNT ? names[type] : "?";
}

/* A canonical array index ("0", "17"; < 2^32 - 1): JS orders such object keys first. */
static bool index_key(const char *k, size_t n, unsigned long long *out) {
    if (n == 0 || n > 10 || (n > 1 && k[0] == '0')) return false;
    unsigned long long x = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return false;
        x = x * 10 + (unsigned)(k[i] - '0');
    }
    if (x >= 4294967295ULL) return false;
    *out = x;
    return true;
}

/* An integer-like key of a JSON object and where it goes. */
typedef struct index_entry {
    unsigned long long idx;
    const char *key;
} index_entry;

static int by_index(const void *pa, const void *pb) {
    const index_entry *a = pa, *b = pb;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* An object with room for n entries, filled by obj_push. */
static csd_chat_val obj_with_room(csd_chat_arena *a, size_t n) {
    csd_chat_val v = csd_chat_v_obj(a, CSD_CHAT_V_OBJ);
    if (n == 0) return v;
    if (n > SIZE_MAX / sizeof(csd_chat_val))
        csd_chat_raise(a->fail, CSD_EFULL, CSD_CHAT_NOPOS, "object too large");
    v.u.obj->keys = csd_chat_arena_alloc(a, n * sizeof *v.u.obj->keys);
    v.u.obj->klens = csd_chat_arena_alloc(a, n * sizeof *v.u.obj->klens);
    v.u.obj->vals = csd_chat_arena_alloc(a, n * sizeof *v.u.obj->vals);
    v.u.obj->cap = n;
    return v;
}

/* Appends without looking k up: a JSON object's keys are already unique (jansson keeps the last
 * of duplicates), and a lookup per key made large objects cost O(n^2). */
static void obj_push(csd_chat_arena *a, csd_chat_obj *o, const char *k, csd_chat_val v) {
    size_t kn = strlen(k);
    o->keys[o->n] = csd_chat_arena_strndup(a, k, kn);
    o->klens[o->n] = kn;
    o->vals[o->n] = v;
    o->n++;
}

/* JS property order, as the reference engine gives it: integer-like keys first, ascending, then
 * the others in insertion order. */
static csd_chat_val object_from_json(csd_chat_arena *a, const json_t *j, int depth) {
    size_t n = json_object_size(j);
    csd_chat_val v = obj_with_room(a, n);
    index_entry *ix = n ? csd_chat_arena_alloc(a, n * sizeof *ix) : NULL;
    size_t n_idx = 0;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)j, k, x) {
        if (index_key(k, strlen(k), &ix[n_idx].idx)) ix[n_idx++].key = k;
    }
    if (n_idx > 1) qsort(ix, n_idx, sizeof *ix, by_index);
    for (size_t i = 0; i < n_idx; i++)
        obj_push(a, v.u.obj, ix[i].key,
                 csd_chat_from_json(a, json_object_get(j, ix[i].key), depth + 1));
    json_object_foreach((json_t *)j, k, x) {
        unsigned long long idx;
        if (!index_key(k, strlen(k), &idx))
            obj_push(a, v.u.obj, k, csd_chat_from_json(a, x, depth + 1));
    }
    return v;
}

csd_chat_val csd_chat_from_json(csd_chat_arena *a, const json_t *j, int depth) {
    if (depth > CSD_CHAT_MAX_JSON_DEPTH)
        csd_chat_raise(a->fail, CSD_ERANGE, CSD_CHAT_NOPOS, "context JSON nested deeper than %d",
                       CSD_CHAT_MAX_JSON_DEPTH);
    switch (json_typeof(j)) {
    case JSON_NULL: return csd_chat_v_null();
    case JSON_TRUE: return csd_chat_v_bool(true);
    case JSON_FALSE: return csd_chat_v_bool(false);
    case JSON_INTEGER: return csd_chat_v_int((double)json_integer_value(j));
    case JSON_REAL: {
        double x = json_real_value(j);
        return (isfinite(x) && x == floor(x)) ? csd_chat_v_int(x) : csd_chat_v_float(x);
    }
    case JSON_STRING:
        return csd_chat_v_str(
            csd_chat_arena_strndup(a, json_string_value(j), json_string_length(j)),
            json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        csd_chat_val v = csd_chat_v_arr(a, n);
        for (size_t i = 0; i < n; i++)
            v.u.arr->items[i] = csd_chat_from_json(a, json_array_get(j, i), depth + 1);
        return v;
    }
    case JSON_OBJECT:
        return object_from_json(a, j, depth);
    default: return csd_chat_v_undef();
    }
}

/* ---- numbers ---- */

void csd_chat_fmt_number(csd_chat_buf *b, double x) {
    if (isnan(x)) {
        csd_chat_buf_puts(b, "NaN");
        return;
    }
    if (isinf(x)) {
        csd_chat_buf_puts(b, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        csd_chat_buf_putc(b, '0');
        return;
    }
    if (x < 0) {
        csd_chat_buf_putc(b, '-');
        x = -x;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp = d[.ddd]e[+-]XX */
    char digits[24];
    int k = 0;
    const char *p = tmp;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0') k--;
    digits[k] = '\0';
    int e = atoi(p + 1);
    int n = e + 1;
    if (k <= n && n <= 21) {
        csd_chat_buf_put(b, digits, (size_t)k);
        for (int i = k; i < n; i++) csd_chat_buf_putc(b, '0');
    } else if (0 < n && n <= 21) {
        csd_chat_buf_put(b, digits, (size_t)n);
        csd_chat_buf_putc(b, '.');
        csd_chat_buf_put(b, digits + n, (size_t)(k - n));
    } else if (-6 < n && n <= 0) {
        csd_chat_buf_puts(b, "0.");
        for (int i = 0; i < -n; i++) csd_chat_buf_putc(b, '0');
        csd_chat_buf_put(b, digits, (size_t)k);
    } else {
        csd_chat_buf_putc(b, digits[0]);
        if (k > 1) {
            csd_chat_buf_putc(b, '.');
            csd_chat_buf_put(b, digits + 1, (size_t)(k - 1));
        }
        char ex[16];
        snprintf(ex, sizeof ex, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
        csd_chat_buf_puts(b, ex);
    }
}

static void fmt_float(csd_chat_buf *b, double x) {
    if (x == 0 && signbit(x)) {
        csd_chat_buf_puts(b, "-0.0");
    } else if (isfinite(x) && x == floor(x) && fabs(x) < 1e21) {
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.1f", x);
        csd_chat_buf_puts(b, tmp);
    } else {
        csd_chat_fmt_number(b, x);
    }
}

/* ---- strings ---- */

void csd_chat_to_string(csd_chat_buf *b, csd_chat_val v, uint32_t pos) {
    switch (v.type) {
    case CSD_CHAT_V_UNDEF: csd_chat_buf_puts(b, "undefined"); break;
    case CSD_CHAT_V_NULL:
        csd_chat_buf_puts(b, "undefined");
        break; /* the reference's none holds undefined */
    case CSD_CHAT_V_BOOL: csd_chat_buf_puts(b, v.u.b ? "true" : "false"); break;
    case CSD_CHAT_V_INT: csd_chat_fmt_number(b, v.u.num); break;
    case CSD_CHAT_V_FLOAT: fmt_float(b, v.u.num); break;
    case CSD_CHAT_V_STR: csd_chat_buf_put(b, v.u.s.p, v.u.s.n); break;
    case CSD_CHAT_V_ARR:
    case CSD_CHAT_V_OBJ:
    case CSD_CHAT_V_NS: {
        csd_chat_json_opts o = {0};
        csd_chat_to_json(b, v, &o, 0, pos);
        break;
    }
    default:
        csd_chat_raise(b->arena->fail, CSD_EINVAL, pos, "cannot convert a function to a string");
    }
}

void csd_chat_js_string(csd_chat_buf *b, csd_chat_val v, uint32_t pos) {
    switch (v.type) {
    case CSD_CHAT_V_UNDEF:
    case CSD_CHAT_V_NULL: break;
    case CSD_CHAT_V_FLOAT: csd_chat_fmt_number(b, v.u.num); break;
    case CSD_CHAT_V_ARR:
        for (size_t i = 0; i < v.u.arr->n; i++) {
            if (i) csd_chat_buf_putc(b, ',');
            csd_chat_to_string(b, v.u.arr->items[i], pos);
        }
        break;
    case CSD_CHAT_V_OBJ:
    case CSD_CHAT_V_NS: csd_chat_buf_puts(b, "[object Map]"); break;
    default: csd_chat_to_string(b, v, pos);
    }
}

static void json_str(csd_chat_buf *b, const char *s, size_t n, bool ascii) {
    csd_chat_buf_putc(b, '"');
    const char *p = s, *end = s + n;
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        char esc[16];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            csd_chat_buf_put(b, esc, 2);
            p++;
        } else if (c < 0x20) {
            const char *named = c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n"
                              : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
            if (named) {
                csd_chat_buf_puts(b, named);
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                csd_chat_buf_puts(b, esc);
            }
            p++;
        } else if (ascii && c >= 0x7f) {
            uint32_t cp;
            size_t k = csd_chat_utf8_next(p, end, &cp);
            if (cp >= 0x10000) {
                uint32_t x = cp - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (x >> 10),
                         0xDC00 + (x & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            csd_chat_buf_puts(b, esc);
            p += k;
        } else {
            const char *q = p;
            while (q < end && (unsigned char)*q >= 0x20 && *q != '"' && *q != '\\' &&
                   !(ascii && (unsigned char)*q >= 0x7f))
                q++;
            csd_chat_buf_put(b, p, (size_t)(q - p));
            p = q;
        }
    }
    csd_chat_buf_putc(b, '"');
}

static void put_indent(csd_chat_buf *b, int indent, int depth) {
    csd_chat_buf_putc(b, '\n');
    for (int i = 0; i < indent * depth; i++) csd_chat_buf_putc(b, ' ');
}

void csd_chat_to_json(csd_chat_buf *b, csd_chat_val v, const csd_chat_json_opts *o, int depth,
                      uint32_t pos) {
    csd_chat_fail *f = b->arena->fail;
    if (depth > CSD_CHAT_MAX_JSON_DEPTH)
        csd_chat_raise(f, CSD_ERANGE, pos, "value nested deeper than %d (cycle?)",
                       CSD_CHAT_MAX_JSON_DEPTH);
    const char *item_sep = o->item_sep ? o->item_sep : o->indent > 0 ? "," : ", ";
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    switch (v.type) {
    case CSD_CHAT_V_NULL: csd_chat_buf_puts(b, "null"); return;
    case CSD_CHAT_V_UNDEF:
        csd_chat_buf_puts(b, o->undefined_as_null ? "null" : "undefined");
        return;
    case CSD_CHAT_V_INT:
    case CSD_CHAT_V_FLOAT:
        if (!isfinite(v.u.num)) csd_chat_buf_puts(b, "null");
        else csd_chat_fmt_number(b, v.u.num);
        return;
    case CSD_CHAT_V_BOOL: csd_chat_buf_puts(b, v.u.b ? "true" : "false"); return;
    case CSD_CHAT_V_STR: json_str(b, v.u.s.p, v.u.s.n, o->ensure_ascii); return;
    case CSD_CHAT_V_ARR: {
        if (v.tuple) csd_chat_raise(f, CSD_EINVAL, pos, "cannot convert to JSON: TupleValue");
        const csd_chat_arr *a = v.u.arr;
        csd_chat_buf_putc(b, '[');
        bool ind = o->indent > 0 && a->n > 0;
        for (size_t i = 0; i < a->n; i++) {
            if (i) csd_chat_buf_puts(b, item_sep);
            if (ind) put_indent(b, o->indent, depth + 1);
            csd_chat_to_json(b, a->items[i], o, depth + 1, pos);
        }
        if (ind) put_indent(b, o->indent, depth);
        csd_chat_buf_putc(b, ']');
        return;
    }
    case CSD_CHAT_V_OBJ:
    case CSD_CHAT_V_NS: {
        const csd_chat_obj *m = v.u.obj;
        size_t *order = NULL;
        if (o->sort_keys && m->n > 1) {
            order = csd_chat_arena_alloc(b->arena, m->n * sizeof *order);
            for (size_t i = 0; i < m->n; i++) {
                size_t p = i;
                while (p > 0) {
                    size_t q = order[p - 1];
                    size_t ln = m->klens[q] < m->klens[i] ? m->klens[q] : m->klens[i];
                    int c = memcmp(m->keys[q], m->keys[i], ln);
                    if (c < 0 || (c == 0 && m->klens[q] <= m->klens[i])) break;
                    order[p] = q;
                    p--;
                }
                order[p] = i;
            }
        }
        csd_chat_buf_putc(b, '{');
        bool ind = o->indent > 0 && m->n > 0;
        for (size_t i = 0; i < m->n; i++) {
            size_t k = order ? order[i] : i;
            if (i) csd_chat_buf_puts(b, item_sep);
            if (ind) put_indent(b, o->indent, depth + 1);
            json_str(b, m->keys[k], m->klens[k], o->ensure_ascii);
            csd_chat_buf_puts(b, key_sep);
            csd_chat_to_json(b, m->vals[k], o, depth + 1, pos);
        }
        if (ind) put_indent(b, o->indent, depth);
        csd_chat_buf_putc(b, '}');
        return;
    }
    default:
        csd_chat_raise(f, CSD_EINVAL, pos, "cannot convert to JSON: %s",
                       csd_chat_type_name(v.type));
    }
}

/* ---- equality ---- */

static double js_to_number(const char *p, size_t n) {
    const char *s = p, *e = p + n;
    size_t k;
    while (s < e && (k = csd_chat_js_space(s, e)) > 0) s += k;
    while (e > s && (k = csd_chat_js_space_back(s, e)) > 0) e -= k;
    if (s == e) return 0;
    size_t len = (size_t)(e - s);
    if (len > 400) return NAN;
    char buf[401];
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (strcmp(buf, "Infinity") == 0 || strcmp(buf, "+Infinity") == 0) return INFINITY;
    if (strcmp(buf, "-Infinity") == 0) return -INFINITY;
    if (len > 2 && buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X' || buf[1] == 'o' ||
                                     buf[1] == 'O' || buf[1] == 'b' || buf[1] == 'B')) {
        int base = (buf[1] | 0x20) == 'x' ? 16 : (buf[1] | 0x20) == 'o' ? 8 : 2;
        double x = 0;
        for (size_t i = 2; i < len; i++) {
            int d = buf[i] >= '0' && buf[i] <= '9'                     ? buf[i] - '0'
                    : (buf[i] | 0x20) >= 'a' && (buf[i] | 0x20) <= 'f' ? (buf[i] | 0x20) - 'a' + 10
                                                                       : 99;
            if (d >= base) return NAN;
            x = x * base + d;
        }
        return x;
    }
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
            return NAN;
    }
    char *end;
    double x = strtod(buf, &end);
    return *end ? NAN : x;
}

static bool is_num(int t) { return t == CSD_CHAT_V_INT || t == CSD_CHAT_V_FLOAT; }
static bool is_ref(int t) {
    return t == CSD_CHAT_V_ARR || t == CSD_CHAT_V_OBJ || t == CSD_CHAT_V_NS || t == CSD_CHAT_V_FUNC;
}

static const void *ref_of(csd_chat_val v) {
    return v.type == CSD_CHAT_V_ARR ? (const void *)v.u.arr
         : v.type == CSD_CHAT_V_FUNC ? (const void *)v.u.fn : (const void *)v.u.obj;
}

bool csd_chat_strict_eq(csd_chat_val x, csd_chat_val y) {
    if (is_num(x.type) && is_num(y.type)) return x.u.num == y.u.num;
    /* the reference's none carries JS undefined, so none === undefined */
    bool xn = x.type == CSD_CHAT_V_UNDEF || x.type == CSD_CHAT_V_NULL;
    bool yn = y.type == CSD_CHAT_V_UNDEF || y.type == CSD_CHAT_V_NULL;
    if (xn || yn) return xn && yn;
    if (x.type != y.type) return false;
    switch (x.type) {
    case CSD_CHAT_V_UNDEF:
    case CSD_CHAT_V_NULL: return true;
    case CSD_CHAT_V_BOOL: return x.u.b == y.u.b;
    case CSD_CHAT_V_STR: return x.u.s.n == y.u.s.n && memcmp(x.u.s.p, y.u.s.p, x.u.s.n) == 0;
    default: return ref_of(x) == ref_of(y);
    }
}

bool csd_chat_loose_eq(csd_chat_arena *a, csd_chat_val x, csd_chat_val y, uint32_t pos) {
    bool xn = x.type == CSD_CHAT_V_UNDEF || x.type == CSD_CHAT_V_NULL;
    bool yn = y.type == CSD_CHAT_V_UNDEF || y.type == CSD_CHAT_V_NULL;
    if (xn || yn) return xn && yn;
    if (is_ref(x.type) && is_ref(y.type)) return x.type == y.type && ref_of(x) == ref_of(y);
    if (x.type == y.type || (is_num(x.type) && is_num(y.type))) return csd_chat_strict_eq(x, y);
    if (x.type == CSD_CHAT_V_BOOL) return csd_chat_loose_eq(a, csd_chat_v_int(x.u.b), y, pos);
    if (y.type == CSD_CHAT_V_BOOL) return csd_chat_loose_eq(a, x, csd_chat_v_int(y.u.b), pos);
    if (is_num(x.type) && y.type == CSD_CHAT_V_STR)
        return x.u.num == js_to_number(y.u.s.p, y.u.s.n);
    if (x.type == CSD_CHAT_V_STR && is_num(y.type))
        return y.u.num == js_to_number(x.u.s.p, x.u.s.n);
    if (is_ref(x.type) || is_ref(y.type)) {
        if ((is_ref(x.type) && x.type == CSD_CHAT_V_FUNC) ||
            (is_ref(y.type) && y.type == CSD_CHAT_V_FUNC))
            return false;
        csd_chat_buf b;
        csd_chat_buf_init(&b, a, SIZE_MAX / 2);
        csd_chat_js_string(&b, is_ref(x.type) ? x : y, pos);
        csd_chat_val s = csd_chat_v_str(b.p, b.len);
        return is_ref(x.type) ? csd_chat_loose_eq(a, s, y, pos) : csd_chat_loose_eq(a, x, s, pos);
    }
    return false;
}

/* ---- UTF-8 / JS whitespace / case ---- */

size_t csd_chat_utf8_next(const char *p, const char *end, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)p;
    size_t avail = (size_t)(end - p);
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len = c >= 0xF0 && c <= 0xF4  ? 4
                 : c >= 0xE0 && c < 0xF0 ? 3
                 : c >= 0xC2 && c < 0xE0 ? 2
                                         : 0;
    if (len == 0 || len > avail) {
        *cp = 0xFFFD;
        return 1;
    }
    uint32_t x = c & (0xFF >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        x = (x << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && (x < 0x800 || (x >= 0xD800 && x < 0xE000))) ||
        (len == 4 && (x < 0x10000 || x > 0x10FFFF))) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = x;
    return len;
}

void csd_chat_utf8_put(csd_chat_buf *b, uint32_t cp) {
    char s[4];
    size_t n;
    if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* lone surrogate from \u escapes */
    if (cp < 0x80) {
        s[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        s[0] = (char)(0xC0 | (cp >> 6));
        s[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        s[0] = (char)(0xE0 | (cp >> 12));
        s[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        s[0] = (char)(0xF0 | (cp >> 18));
        s[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        s[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    csd_chat_buf_put(b, s, n);
}

size_t csd_chat_utf16_len(const char *p, size_t n) {
    const char *end = p + n;
    size_t units = 0;
    while (p < end) {
        uint32_t cp;
        p += csd_chat_utf8_next(p, end, &cp);
        units += cp >= 0x10000 ? 2 : 1;
    }
    return units;
}

static bool is_js_space_cp(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

size_t csd_chat_js_space(const char *p, const char *end) {
    if (p >= end) return 0;
    unsigned char c = (unsigned char)*p;
    if (c < 0x80) return (c == ' ' || (c >= 9 && c <= 13)) ? 1 : 0;
    uint32_t cp;
    size_t k = csd_chat_utf8_next(p, end, &cp);
    return (k > 1 && is_js_space_cp(cp)) ? k : 0;
}

size_t csd_chat_js_space_back(const char *start, const char *end) {
    if (end <= start) return 0;
    unsigned char c = (unsigned char)end[-1];
    if (c < 0x80) return (c == ' ' || (c >= 9 && c <= 13)) ? 1 : 0;
    for (size_t k = 2; k <= 3 && (size_t)(end - start) >= k; k++) {
        uint32_t cp;
        if (csd_chat_utf8_next(end - k, end, &cp) == k && is_js_space_cp(cp)) return k;
    }
    return 0;
}

uint32_t csd_chat_to_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x131) return 'I';
        if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c - 1 : c;
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
        if (c == 0x17F) return 'S';
        return c;
    }
    if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}

uint32_t csd_chat_to_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x130) return c; /* maps to two code points in JS; left alone */
        if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c : c + 1;
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
        return c;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}
