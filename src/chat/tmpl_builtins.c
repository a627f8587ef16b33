/* tmpl_builtins: everything the chat-template engine provides by name: attribute access and the
 * string/dict methods, global functions (namespace, raise_exception, range, strftime_now), filters
 * and tests. Each follows @huggingface/jinja's runtime (which filters exist per operand type, how
 * arguments are read, error cases), not Python Jinja2 where the two differ. */
#include "chat/tmpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RAISE(rt, pos, ...) csd_chat_raise((rt)->fail, CSD_EINVAL, (pos), __VA_ARGS__)

/* range() results above this many elements are refused (memory bound before the arena limit). */
#define MAX_RANGE 1000000

static bool name_is(const char *s, size_t n, const char *lit) {
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

static csd_chat_buf new_buf(csd_chat_rt *rt) {
    csd_chat_buf b;
    csd_chat_buf_init(&b, rt->arena, rt->max_str);
    csd_chat_buf_put(&b, "", 0);
    return b;
}

static csd_chat_val bound(csd_chat_rt *rt, int kind, const char *name, csd_chat_val self) {
    csd_chat_func *f = csd_chat_arena_alloc(rt->arena, sizeof *f);
    f->kind = kind;
    f->name = name;
    f->self = self;
    csd_chat_val v = {.type = CSD_CHAT_V_FUNC};
    v.u.fn = f;
    return v;
}

static const char *const STR_METHODS[] = {"upper",  "lower",      "strip",    "title",
                                          "capitalize", "rstrip", "lstrip",   "startswith",
                                          "endswith", "split",    "replace",  NULL};
static const char *const OBJ_METHODS[] = {"get", "items", "keys", "values", "dictsort", NULL};

static const char *find_name(const char *const *list, const char *s, size_t n) {
    for (; *list; list++)
        if (name_is(s, n, *list)) return *list;
    return NULL;
}

/* Object builtins reachable as attributes (`d.items`) when no key of that name exists. */
static csd_chat_val obj_builtin(csd_chat_rt *rt, csd_chat_val obj, const char *s, size_t n) {
    const char *m = find_name(OBJ_METHODS, s, n);
    return m ? bound(rt, CSD_CHAT_FN_OBJ_METHOD, m, obj) : csd_chat_v_undef();
}

static csd_chat_val str_builtin(csd_chat_rt *rt, csd_chat_val str, const char *s, size_t n) {
    if (name_is(s, n, "length"))
        return csd_chat_v_int((double)csd_chat_utf16_len(str.u.s.p, str.u.s.n));
    const char *m = find_name(STR_METHODS, s, n);
    return m ? bound(rt, CSD_CHAT_FN_STR_METHOD, m, str) : csd_chat_v_undef();
}

/* JS Array.prototype.at / String.prototype.at (strings by code point). */
static csd_chat_val index_at(csd_chat_val obj, double x) {
    if (isnan(x)) x = 0;
    x = trunc(x);
    if (obj.type == CSD_CHAT_V_ARR) {
        double len = (double)obj.u.arr->n;
        if (x < 0) x += len;
        if (!(x >= 0 && x < len)) return csd_chat_v_undef();
        return obj.u.arr->items[(size_t)x];
    }
    const char *p = obj.u.s.p, *end = p + obj.u.s.n;
    size_t count = 0;
    for (const char *q = p; q < end; count++) {
        uint32_t cp;
        q += csd_chat_utf8_next(q, end, &cp);
    }
    double len = (double)count;
    if (x < 0) x += len;
    if (!(x >= 0 && x < len)) return csd_chat_v_undef();
    size_t want = (size_t)x;
    for (size_t i = 0;; i++) {
        uint32_t cp;
        size_t k = csd_chat_utf8_next(p, end, &cp);
        if (i == want) return csd_chat_v_str(p, k);
        p += k;
    }
}

csd_chat_val csd_chat_member(csd_chat_rt *rt, csd_chat_val obj, csd_chat_val prop, uint32_t pos) {
    if (obj.type == CSD_CHAT_V_OBJ || obj.type == CSD_CHAT_V_NS) {
        if (prop.type != CSD_CHAT_V_STR)
            RAISE(rt, pos, "cannot access property with non-string: got %s",
                  csd_chat_type_name(prop.type));
        csd_chat_val *v = csd_chat_obj_get(obj.u.obj, prop.u.s.p, prop.u.s.n);
        if (v) return *v;
        return obj.type == CSD_CHAT_V_OBJ ? obj_builtin(rt, obj, prop.u.s.p, prop.u.s.n)
                                          : csd_chat_v_undef();
    }
    if (obj.type == CSD_CHAT_V_ARR || obj.type == CSD_CHAT_V_STR) {
        if (prop.type == CSD_CHAT_V_INT) return index_at(obj, prop.u.num);
        if (prop.type == CSD_CHAT_V_STR) {
            if (obj.type == CSD_CHAT_V_STR) return str_builtin(rt, obj, prop.u.s.p, prop.u.s.n);
            if (name_is(prop.u.s.p, prop.u.s.n, "length"))
                return csd_chat_v_int((double)obj.u.arr->n);
            return csd_chat_v_undef();
        }
        RAISE(rt, pos, "cannot access property with non-string/non-number: got %s",
              csd_chat_type_name(prop.type));
    }
    if (prop.type != CSD_CHAT_V_STR)
        RAISE(rt, pos, "cannot access property with non-string: got %s",
              csd_chat_type_name(prop.type));
    return csd_chat_v_undef();
}

/* ---- string helpers ---- */

typedef csd_chat_val (*str_fn)(csd_chat_rt *rt, csd_chat_val s);

static csd_chat_val str_case(csd_chat_rt *rt, csd_chat_val s, bool upper) {
    csd_chat_buf b = new_buf(rt);
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    while (p < end) {
        uint32_t cp;
        size_t k = csd_chat_utf8_next(p, end, &cp);
        if (upper && cp == 0xDF) {
            csd_chat_buf_put(&b, "SS", 2);
        } else {
            uint32_t m = upper ? csd_chat_to_upper(cp) : csd_chat_to_lower(cp);
            if (m == cp) csd_chat_buf_put(&b, p, k);
            else csd_chat_utf8_put(&b, m);
        }
        p += k;
    }
    return csd_chat_new_str(rt, &b);
}

static csd_chat_val str_trim(csd_chat_val s, bool left, bool right) {
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    size_t k;
    if (left)
        while (p < end && (k = csd_chat_js_space(p, end)) > 0) p += k;
    if (right)
        while (end > p && (k = csd_chat_js_space_back(p, end)) > 0) end -= k;
    return csd_chat_v_str(p, (size_t)(end - p));
}

static bool is_word_char(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static csd_chat_val str_title(csd_chat_rt *rt, csd_chat_val s) {
    char *p = csd_chat_arena_strndup(rt->arena, s.u.s.p, s.u.s.n);
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)p[i];
        bool boundary = i == 0 || !is_word_char((unsigned char)p[i - 1]);
        if (boundary && c >= 'a' && c <= 'z') p[i] = (char)(c - 32);
    }
    return csd_chat_v_str(p, s.u.s.n);
}

static csd_chat_val str_capitalize(csd_chat_rt *rt, csd_chat_val s) {
    if (s.u.s.n == 0) return s;
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    uint32_t cp;
    size_t k = csd_chat_utf8_next(p, end, &cp);
    csd_chat_buf b = new_buf(rt);
    csd_chat_val first = str_case(rt, csd_chat_v_str(p, k), true);
    csd_chat_buf_put(&b, first.u.s.p, first.u.s.n);
    csd_chat_buf_put(&b, p + k, s.u.s.n - k);
    return csd_chat_new_str(rt, &b);
}

static bool starts_with(csd_chat_val s, csd_chat_val x) {
    return x.u.s.n <= s.u.s.n && memcmp(s.u.s.p, x.u.s.p, x.u.s.n) == 0;
}
static bool ends_with(csd_chat_val s, csd_chat_val x) {
    return x.u.s.n <= s.u.s.n && memcmp(s.u.s.p + s.u.s.n - x.u.s.n, x.u.s.p, x.u.s.n) == 0;
}

static csd_chat_val str_affix(csd_chat_rt *rt, csd_chat_val s, const csd_chat_val *args, size_t n,
                              bool start, uint32_t pos) {
    const char *fn = start ? "startswith" : "endswith";
    if (n == 0) RAISE(rt, pos, "%s() requires at least one argument", fn);
    csd_chat_val pat = args[0];
    if (pat.type == CSD_CHAT_V_STR)
        return csd_chat_v_bool(start ? starts_with(s, pat) : ends_with(s, pat));
    if (pat.type == CSD_CHAT_V_ARR) {
        for (size_t i = 0; i < pat.u.arr->n; i++) {
            csd_chat_val it = pat.u.arr->items[i];
            if (it.type != CSD_CHAT_V_STR)
                RAISE(rt, pos, "%s() tuple elements must be strings", fn);
            if (start ? starts_with(s, it) : ends_with(s, it)) return csd_chat_v_bool(true);
        }
        return csd_chat_v_bool(false);
    }
    RAISE(rt, pos, "%s() argument must be a string or tuple of strings", fn);
}

static void arr_push(csd_chat_rt *rt, csd_chat_val *arr, size_t *cap, csd_chat_val v) {
    csd_chat_arr *a = arr->u.arr;
    if (a->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        csd_chat_val *items = csd_chat_arena_alloc(rt->arena, nc * sizeof *items);
        if (a->n) memcpy(items, a->items, a->n * sizeof *items);
        a->items = items;
        *cap = nc;
    }
    a->items[a->n++] = v;
}

static csd_chat_val str_split(csd_chat_rt *rt, csd_chat_val s, const csd_chat_val *args, size_t n,
                              uint32_t pos) {
    csd_chat_val sep = n > 0 ? args[0] : csd_chat_v_null();
    if (sep.type != CSD_CHAT_V_STR && sep.type != CSD_CHAT_V_NULL)
        RAISE(rt, pos, "sep argument must be a string or null");
    csd_chat_val ms = n > 1 ? args[1] : csd_chat_v_int(-1);
    if (ms.type != CSD_CHAT_V_INT) RAISE(rt, pos, "maxsplit argument must be a number");
    double maxsplit = ms.u.num;
    csd_chat_val out = csd_chat_v_arr(rt->arena, 0);
    size_t cap = 0;
    if (sep.type == CSD_CHAT_V_NULL) {
        csd_chat_val t = str_trim(s, true, false);
        const char *p = t.u.s.p, *end = p + t.u.s.n;
        while (p < end) {
            size_t k;
            while (p < end && (k = csd_chat_js_space(p, end)) > 0) p += k;
            if (p >= end) break;
            const char *w = p;
            while (p < end && csd_chat_js_space(p, end) == 0) {
                uint32_t cp;
                p += csd_chat_utf8_next(p, end, &cp);
            }
            if (maxsplit != -1 && (double)out.u.arr->n >= maxsplit) {
                arr_push(rt, &out, &cap, csd_chat_v_str(w, (size_t)(end - w)));
                break;
            }
            arr_push(rt, &out, &cap, csd_chat_v_str(w, (size_t)(p - w)));
        }
        return out;
    }
    if (sep.u.s.n == 0) RAISE(rt, pos, "empty separator");
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    for (;;) {
        const char *hit = memmem(p, (size_t)(end - p), sep.u.s.p, sep.u.s.n);
        if (!hit) {
            arr_push(rt, &out, &cap, csd_chat_v_str(p, (size_t)(end - p)));
            break;
        }
        arr_push(rt, &out, &cap, csd_chat_v_str(p, (size_t)(hit - p)));
        p = hit + sep.u.s.n;
    }
    size_t len = out.u.arr->n;
    if (maxsplit != -1 && (double)len > maxsplit) {
        double keepd = maxsplit >= 0 ? maxsplit : fmax((double)len + maxsplit, 0);
        size_t keep = (size_t)keepd;
        /* rejoin the tail: it is the original text from the start of part `keep` */
        const char *tail = out.u.arr->items[keep].u.s.p;
        out.u.arr->items[keep] = csd_chat_v_str(tail, (size_t)(s.u.s.p + s.u.s.n - tail));
        out.u.arr->n = keep + 1;
    }
    return out;
}

static csd_chat_val str_replace(csd_chat_rt *rt, csd_chat_val s, const csd_chat_val *args, size_t n,
                                uint32_t pos) {
    if (n < 2) RAISE(rt, pos, "replace() requires at least two arguments");
    csd_chat_val from = args[0], to = args[1];
    if (from.type != CSD_CHAT_V_STR || to.type != CSD_CHAT_V_STR)
        RAISE(rt, pos, "replace() arguments must be strings");
    csd_chat_val count = csd_chat_v_null();
    if (n > 2) {
        if (args[2].type == CSD_CHAT_V_OBJ && args[2].kwargs) {
            csd_chat_val *c = csd_chat_obj_get(args[2].u.obj, "count", 5);
            count = c ? *c : csd_chat_v_null();
        } else {
            count = args[2];
        }
    }
    if (count.type != CSD_CHAT_V_INT && count.type != CSD_CHAT_V_NULL)
        RAISE(rt, pos, "replace() count argument must be a number or null");
    if (count.type == CSD_CHAT_V_INT && count.u.num == 0) return s;
    double remaining = (count.type == CSD_CHAT_V_NULL || count.u.num < 0) ? INFINITY : count.u.num;
    csd_chat_buf b = new_buf(rt);
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    if (from.u.s.n == 0) {
        for (;;) {
            if (remaining > 0) {
                csd_chat_buf_put(&b, to.u.s.p, to.u.s.n);
                remaining--;
            }
            if (p >= end) break;
            uint32_t cp;
            size_t k = csd_chat_utf8_next(p, end, &cp);
            csd_chat_buf_put(&b, p, k);
            p += k;
        }
        return csd_chat_new_str(rt, &b);
    }
    while (p < end && remaining > 0) {
        const char *hit = memmem(p, (size_t)(end - p), from.u.s.p, from.u.s.n);
        if (!hit) break;
        csd_chat_buf_put(&b, p, (size_t)(hit - p));
        csd_chat_buf_put(&b, to.u.s.p, to.u.s.n);
        p = hit + from.u.s.n;
        remaining--;
    }
    csd_chat_buf_put(&b, p, (size_t)(end - p));
    return csd_chat_new_str(rt, &b);
}

static csd_chat_val call_str_method(csd_chat_rt *rt, const csd_chat_func *f,
                                    const csd_chat_val *args, size_t n, uint32_t pos) {
    csd_chat_val s = f->self;
    const char *m = f->name;
    if (!strcmp(m, "upper")) return str_case(rt, s, true);
    if (!strcmp(m, "lower")) return str_case(rt, s, false);
    if (!strcmp(m, "strip")) return str_trim(s, true, true);
    if (!strcmp(m, "lstrip")) return str_trim(s, true, false);
    if (!strcmp(m, "rstrip")) return str_trim(s, false, true);
    if (!strcmp(m, "title")) return str_title(rt, s);
    if (!strcmp(m, "capitalize")) return str_capitalize(rt, s);
    if (!strcmp(m, "startswith")) return str_affix(rt, s, args, n, true, pos);
    if (!strcmp(m, "endswith")) return str_affix(rt, s, args, n, false, pos);
    if (!strcmp(m, "split")) return str_split(rt, s, args, n, pos);
    return str_replace(rt, s, args, n, pos);
}

/* ---- comparison and sorting (compareRuntimeValues) ---- */

static int compare_vals(csd_chat_rt *rt, csd_chat_val a, csd_chat_val b, bool case_sensitive,
                        uint32_t pos) {
    if (a.type == CSD_CHAT_V_NULL && b.type == CSD_CHAT_V_NULL) return 0;
    if (a.type == CSD_CHAT_V_NULL || b.type == CSD_CHAT_V_NULL)
        RAISE(rt, pos, "cannot compare %s with %s", csd_chat_type_name(a.type),
              csd_chat_type_name(b.type));
    if (a.type == CSD_CHAT_V_UNDEF && b.type == CSD_CHAT_V_UNDEF) return 0;
    if (a.type == CSD_CHAT_V_UNDEF || b.type == CSD_CHAT_V_UNDEF)
        RAISE(rt, pos, "cannot compare %s with %s", csd_chat_type_name(a.type),
              csd_chat_type_name(b.type));
    bool an = a.type == CSD_CHAT_V_INT || a.type == CSD_CHAT_V_FLOAT || a.type == CSD_CHAT_V_BOOL;
    bool bn = b.type == CSD_CHAT_V_INT || b.type == CSD_CHAT_V_FLOAT || b.type == CSD_CHAT_V_BOOL;
    if (an && bn) {
        double x = a.type == CSD_CHAT_V_BOOL ? a.u.b : a.u.num;
        double y = b.type == CSD_CHAT_V_BOOL ? b.u.b : b.u.num;
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.type != b.type || a.tuple != b.tuple)
        RAISE(rt, pos, "cannot compare different types: %s and %s", csd_chat_type_name(a.type),
              csd_chat_type_name(b.type));
    if (a.type != CSD_CHAT_V_STR)
        RAISE(rt, pos, "cannot compare type: %s", csd_chat_type_name(a.type));
    if (!case_sensitive) {
        a = str_case(rt, a, false);
        b = str_case(rt, b, false);
    }
    size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
    int c = memcmp(a.u.s.p, b.u.s.p, n);
    if (c) return c < 0 ? -1 : 1;
    return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n ? 1 : 0;
}

typedef struct sort_ctx {
    csd_chat_rt *rt;
    bool case_sensitive, reverse;
    const char *attr;         /* NULL: compare items themselves */
    size_t attr_len;
    uint32_t pos;
} sort_ctx;

/* getAttributeValue: dotted path through objects and array indices. */
static csd_chat_val attr_path(csd_chat_val v, const char *path, size_t n) {
    const char *p = path, *end = path + n;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *pe = dot ? dot : end;
        size_t pl = (size_t)(pe - p);
        if (v.type == CSD_CHAT_V_OBJ || v.type == CSD_CHAT_V_NS) {
            csd_chat_val *x = csd_chat_obj_get(v.u.obj, p, pl);
            v = x ? *x : csd_chat_v_undef();
        } else if (v.type == CSD_CHAT_V_ARR) {
            /* parseInt: leading digits */
            size_t i = 0;
            double idx = 0;
            while (i < pl && p[i] >= '0' && p[i] <= '9') idx = idx * 10 + (p[i++] - '0');
            if (i == 0 || idx >= (double)v.u.arr->n) return csd_chat_v_undef();
            v = v.u.arr->items[(size_t)idx];
        } else {
            return csd_chat_v_undef();
        }
        if (!dot) return v;
        p = dot + 1;
    }
}

static int sort_cmp(const sort_ctx *c, csd_chat_val a, csd_chat_val b) {
    if (c->attr) {
        a = attr_path(a, c->attr, c->attr_len);
        b = attr_path(b, c->attr, c->attr_len);
    }
    int r = compare_vals(c->rt, a, b, c->case_sensitive, c->pos);
    return c->reverse ? -r : r;
}

/* Stable merge sort (Array.prototype.sort is stable); the comparator may raise. */
static void merge_sort(const sort_ctx *c, csd_chat_val *v, csd_chat_val *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, v, tmp, h);
    merge_sort(c, v + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = sort_cmp(c, v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static csd_chat_val sorted_copy(csd_chat_rt *rt, csd_chat_val arr, const sort_ctx *c) {
    size_t n = arr.u.arr->n;
    csd_chat_val out = csd_chat_v_arr(rt->arena, n);
    if (n) memcpy(out.u.arr->items, arr.u.arr->items, n * sizeof(csd_chat_val));
    csd_chat_val *tmp = csd_chat_arena_alloc(rt->arena, (n + 1) * sizeof *tmp);
    merge_sort(c, out.u.arr->items, tmp, n);
    return out;
}

/* ---- object methods ---- */

static csd_chat_val obj_pairs(csd_chat_rt *rt, const csd_chat_obj *o) {
    csd_chat_val out = csd_chat_v_arr(rt->arena, o->n);
    for (size_t i = 0; i < o->n; i++) {
        csd_chat_val pair = csd_chat_v_arr(rt->arena, 2);
        pair.u.arr->items[0] = csd_chat_v_str(o->keys[i], o->klens[i]);
        pair.u.arr->items[1] = o->vals[i];
        out.u.arr->items[i] = pair;
    }
    return out;
}

/* Positional argument i, else keyword `name`, else NULL. */
static const csd_chat_val *arg_or_kw(const csd_chat_args *a, size_t i, const char *name) {
    if (i < a->npos) return &a->pos[i];
    return csd_chat_obj_get(a->kw.u.obj, name, strlen(name));
}

static csd_chat_val call_obj_method(csd_chat_rt *rt, const csd_chat_func *f, const csd_chat_args *a,
                                    uint32_t pos) {
    const csd_chat_obj *o = f->self.u.obj;
    const char *m = f->name;
    if (!strcmp(m, "get")) {
        csd_chat_val key = a->npos > 0 ? a->pos[0] : a->kw.u.obj->n ? a->kw : csd_chat_v_undef();
        if (key.type != CSD_CHAT_V_STR)
            RAISE(rt, pos, "object key must be a string: got %s", csd_chat_type_name(key.type));
        csd_chat_val *v = csd_chat_obj_get(o, key.u.s.p, key.u.s.n);
        if (v) return *v;
        if (a->npos > 1) return a->pos[1];
        if (a->npos == 1 && a->kw.u.obj->n) return a->kw;
        return csd_chat_v_null();
    }
    if (!strcmp(m, "items")) return obj_pairs(rt, o);
    if (!strcmp(m, "keys") || !strcmp(m, "values")) {
        csd_chat_val out = csd_chat_v_arr(rt->arena, o->n);
        for (size_t i = 0; i < o->n; i++)
            out.u.arr->items[i] =
                m[0] == 'k' ? csd_chat_v_str(o->keys[i], o->klens[i]) : o->vals[i];
        return out;
    }
    /* dictsort(case_sensitive=false, by='key', reverse=false) */
    const csd_chat_val *cs = arg_or_kw(a, 0, "case_sensitive");
    const csd_chat_val *by = arg_or_kw(a, 1, "by");
    const csd_chat_val *rev = arg_or_kw(a, 2, "reverse");
    if (cs && cs->type != CSD_CHAT_V_BOOL) RAISE(rt, pos, "case_sensitive must be a boolean");
    if (by && by->type != CSD_CHAT_V_STR) RAISE(rt, pos, "by must be a string");
    bool by_value = false;
    if (by) {
        if (name_is(by->u.s.p, by->u.s.n, "value")) by_value = true;
        else if (!name_is(by->u.s.p, by->u.s.n, "key"))
            RAISE(rt, pos, "by must be either 'key' or 'value'");
    }
    if (rev && rev->type != CSD_CHAT_V_BOOL) RAISE(rt, pos, "reverse must be a boolean");
    sort_ctx c = {.rt = rt, .case_sensitive = cs && cs->u.b, .reverse = rev && rev->u.b,
                  .attr = by_value ? "1" : "0", .attr_len = 1, .pos = pos};
    return sorted_copy(rt, obj_pairs(rt, o), &c);
}

/* ---- globals ---- */

static csd_chat_val fn_namespace(csd_chat_rt *rt, const csd_chat_args *a, uint32_t pos) {
    if (a->npos > 1) RAISE(rt, pos, "namespace expected at most 1 argument, got %zu", a->npos);
    csd_chat_val ns = csd_chat_v_obj(rt->arena, CSD_CHAT_V_NS);
    if (a->npos == 1) {
        csd_chat_val src = a->pos[0];
        if (src.type == CSD_CHAT_V_OBJ) {
            for (size_t i = 0; i < src.u.obj->n; i++)
                csd_chat_obj_set(rt->arena, ns.u.obj, src.u.obj->keys[i], src.u.obj->klens[i],
                                 src.u.obj->vals[i]);
        } else if (src.type == CSD_CHAT_V_ARR) {
            for (size_t i = 0; i < src.u.arr->n; i++) {
                csd_chat_val pr = src.u.arr->items[i];
                if (pr.type != CSD_CHAT_V_ARR || pr.u.arr->n != 2)
                    RAISE(rt, pos,
                          "namespace expected an object or an iterable of [key, value] pairs");
                if (pr.u.arr->items[0].type != CSD_CHAT_V_STR)
                    RAISE(rt, pos, "namespace keys must be strings");
                csd_chat_obj_set(rt->arena, ns.u.obj, pr.u.arr->items[0].u.s.p,
                                 pr.u.arr->items[0].u.s.n, pr.u.arr->items[1]);
            }
        } else {
            RAISE(rt, pos, "'%s' object is not iterable", csd_chat_type_name(src.type));
        }
    }
    for (size_t i = 0; i < a->kw.u.obj->n; i++)
        csd_chat_obj_set(rt->arena, ns.u.obj, a->kw.u.obj->keys[i], a->kw.u.obj->klens[i],
                         a->kw.u.obj->vals[i]);
    return ns;
}

/* JS ToNumber for range() arguments (the reference passes raw JS values to its range()). */
static double range_num(csd_chat_rt *rt, csd_chat_val v, uint32_t pos) {
    switch (v.type) {
    case CSD_CHAT_V_UNDEF: return NAN;
    case CSD_CHAT_V_NULL: return NAN; /* none holds undefined in the reference */
    case CSD_CHAT_V_BOOL: return v.u.b ? 1 : 0;
    case CSD_CHAT_V_INT:
    case CSD_CHAT_V_FLOAT: return v.u.num;
    case CSD_CHAT_V_OBJ: return NAN;
    default: RAISE(rt, pos, "range() arguments must be numbers");
    }
}

static csd_chat_val fn_range(csd_chat_rt *rt, const csd_chat_args *a, uint32_t pos) {
    /* range(start, stop?, step = 1) over the positional values plus the keyword bag, like JS */
    csd_chat_val argv[3] = {csd_chat_v_undef(), csd_chat_v_undef(), csd_chat_v_undef()};
    size_t n = 0;
    for (size_t i = 0; i < a->npos && n < 3; i++) argv[n++] = a->pos[i];
    if (n < 3 && a->kw.u.obj->n) argv[n++] = a->kw;
    bool have_stop = argv[1].type != CSD_CHAT_V_UNDEF;
    double start = range_num(rt, argv[0], pos);
    double stop = have_stop ? range_num(rt, argv[1], pos) : 0;
    double step = argv[2].type == CSD_CHAT_V_UNDEF ? 1 : range_num(rt, argv[2], pos);
    if (!have_stop) {
        stop = start;
        start = 0;
    }
    if (step == 0) RAISE(rt, pos, "range() step must not be zero");
    csd_chat_val out = csd_chat_v_arr(rt->arena, 0);
    size_t cap = 0;
    for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.u.arr->n >= MAX_RANGE)
            RAISE(rt, pos, "range() of more than %d elements", MAX_RANGE);
        arr_push(rt, &out, &cap, i == floor(i) ? csd_chat_v_int(i) : csd_chat_v_float(i));
    }
    return out;
}

static csd_chat_val fn_strftime(csd_chat_rt *rt, const csd_chat_args *a, uint32_t pos) {
    static const char *const LONG_M[12] = {"January", "February", "March",     "April",
                                           "May",     "June",     "July",      "August",
                                           "September", "October", "November", "December"};
    static const char *const SHORT_M[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    if (a->npos < 1 || a->pos[0].type != CSD_CHAT_V_STR)
        RAISE(rt, pos, "strftime_now() needs a format string");
    struct tm now;
    if (rt->now) {
        now = *rt->now;
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &now);
    }
    int mon = now.tm_mon >= 0 && now.tm_mon < 12 ? now.tm_mon : 0;
    csd_chat_buf b = new_buf(rt);
    const char *p = a->pos[0].u.s.p, *end = p + a->pos[0].u.s.n;
    char tmp[32];
    while (p < end) {
        if (*p == '%' && p + 1 < end && strchr("YmdbBHM%", p[1])) {
            switch (p[1]) {
            case 'Y': snprintf(tmp, sizeof tmp, "%d", now.tm_year + 1900); break;
            case 'm': snprintf(tmp, sizeof tmp, "%02d", mon + 1); break;
            case 'd': snprintf(tmp, sizeof tmp, "%02d", now.tm_mday); break;
            case 'b': snprintf(tmp, sizeof tmp, "%s", SHORT_M[mon]); break;
            case 'B': snprintf(tmp, sizeof tmp, "%s", LONG_M[mon]); break;
            case 'H': snprintf(tmp, sizeof tmp, "%02d", now.tm_hour); break;
            case 'M': snprintf(tmp, sizeof tmp, "%02d", now.tm_min); break;
            default: snprintf(tmp, sizeof tmp, "%%"); break;
            }
            csd_chat_buf_puts(&b, tmp);
            p += 2;
        } else {
            csd_chat_buf_putc(&b, *p++);
        }
    }
    return csd_chat_new_str(rt, &b);
}

csd_chat_val csd_chat_call_builtin(csd_chat_rt *rt, const csd_chat_func *f, const csd_chat_args *a,
                                   uint32_t pos) {
    switch (f->kind) {
    case CSD_CHAT_FN_NAMESPACE: return fn_namespace(rt, a, pos);
    case CSD_CHAT_FN_RANGE: return fn_range(rt, a, pos);
    case CSD_CHAT_FN_STRFTIME: return fn_strftime(rt, a, pos);
    case CSD_CHAT_FN_RAISE: {
        csd_chat_buf b = new_buf(rt);
        if (a->npos > 0) csd_chat_js_string(&b, a->pos[0], pos);
        csd_chat_raise(rt->fail, CSD_EINVAL, pos, "raise_exception: %s", b.p);
    }
    case CSD_CHAT_FN_STR_METHOD: {
        /* the reference passes keyword arguments as one trailing mapping */
        size_t n = a->npos + (a->kw.u.obj->n ? 1 : 0);
        csd_chat_val *args = csd_chat_arena_alloc(rt->arena, (n + 1) * sizeof *args);
        if (a->npos) memcpy(args, a->pos, a->npos * sizeof *args);
        if (n > a->npos) args[a->npos] = a->kw;
        return call_str_method(rt, f, args, n, pos);
    }
    case CSD_CHAT_FN_OBJ_METHOD: return call_obj_method(rt, f, a, pos);
    default: RAISE(rt, pos, "not a builtin function");
    }
}

/* ---- tests ---- */

bool csd_chat_apply_test(csd_chat_rt *rt, const char *name, size_t n, csd_chat_val v,
                         const csd_chat_val *arg, uint32_t pos) {
    int t = v.type;
#define IS(lit) name_is(name, n, lit)
    if (IS("boolean")) return t == CSD_CHAT_V_BOOL;
    if (IS("callable")) return t == CSD_CHAT_V_FUNC;
    if (IS("odd") || IS("even")) {
        if (t != CSD_CHAT_V_INT)
            RAISE(rt, pos, "cannot %.*s on %s", (int)n, name, csd_chat_type_name(t));
        double r = fmod(v.u.num, 2);
        return IS("odd") ? r != 0 : r == 0;
    }
    if (IS("false")) return t == CSD_CHAT_V_BOOL && !v.u.b;
    if (IS("true")) return t == CSD_CHAT_V_BOOL && v.u.b;
    if (IS("none")) return t == CSD_CHAT_V_NULL;
    if (IS("string")) return t == CSD_CHAT_V_STR;
    if (IS("number")) return t == CSD_CHAT_V_INT || t == CSD_CHAT_V_FLOAT;
    if (IS("integer")) return t == CSD_CHAT_V_INT;
    if (IS("iterable")) return (t == CSD_CHAT_V_ARR && !v.tuple) || t == CSD_CHAT_V_STR;
    if (IS("mapping")) return t == CSD_CHAT_V_OBJ;
    if (IS("sequence")) return t == CSD_CHAT_V_ARR || t == CSD_CHAT_V_OBJ || t == CSD_CHAT_V_STR;
    if (IS("lower") || IS("upper")) {
        if (t != CSD_CHAT_V_STR) return false;
        csd_chat_val c = str_case(rt, v, IS("upper"));
        return c.u.s.n == v.u.s.n && memcmp(c.u.s.p, v.u.s.p, v.u.s.n) == 0;
    }
    if (IS("defined")) return t != CSD_CHAT_V_UNDEF;
    if (IS("undefined")) return t == CSD_CHAT_V_UNDEF;
    if (IS("equalto") || IS("eq")) {
        if (!arg) RAISE(rt, pos, "test '%.*s' needs an argument", (int)n, name);
        return csd_chat_strict_eq(v, *arg);
    }
#undef IS
    RAISE(rt, pos, "unknown test: %.*s", (int)n, name);
}

/* ---- filters ---- */

static csd_chat_val js_parse_int(const char *p, size_t n) {
    const char *end = p + n;
    size_t k;
    while (p < end && (k = csd_chat_js_space(p, end)) > 0) p += k;
    bool neg = false;
    if (p < end && (*p == '+' || *p == '-')) neg = *p++ == '-';
    const char *d = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    if (p == d) return csd_chat_v_undef();
    char buf[512];
    size_t len = (size_t)(p - d);
    double x;
    if (len >= sizeof buf) {
        x = INFINITY;
    } else {
        memcpy(buf, d, len);
        buf[len] = '\0';
        x = strtod(buf, NULL);
    }
    return csd_chat_v_int(neg ? -x : x);
}

static csd_chat_val js_parse_float(const char *p, size_t n) {
    const char *end = p + n;
    size_t k;
    while (p < end && (k = csd_chat_js_space(p, end)) > 0) p += k;
    const char *s = p;
    if (p < end && (*p == '+' || *p == '-')) p++;
    if ((size_t)(end - p) >= 8 && memcmp(p, "Infinity", 8) == 0)
        return csd_chat_v_float(*s == '-' ? -INFINITY : INFINITY);
    const char *m = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    bool digits = p > m;
    if (p < end && *p == '.') {
        const char *f = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        digits = digits || p > f;
        if (!digits) p = f - 1;
    }
    if (!digits) return csd_chat_v_undef();
    if (p < end && (*p == 'e' || *p == 'E')) {
        const char *e = p + 1;
        if (e < end && (*e == '+' || *e == '-')) e++;
        const char *ed = e;
        while (e < end && *e >= '0' && *e <= '9') e++;
        if (e > ed) p = e;
    }
    char buf[512];
    size_t len = (size_t)(p - s);
    if (len >= sizeof buf) return csd_chat_v_float(NAN);
    memcpy(buf, s, len);
    buf[len] = '\0';
    return csd_chat_v_float(strtod(buf, NULL));
}

static csd_chat_val json_filter(csd_chat_rt *rt, csd_chat_val v, const csd_chat_json_opts *o,
                                uint32_t pos) {
    csd_chat_buf b = new_buf(rt);
    csd_chat_to_json(&b, v, o, 0, pos);
    return csd_chat_new_str(rt, &b);
}

static csd_chat_val join_values(csd_chat_rt *rt, csd_chat_val arr, csd_chat_val sep, uint32_t pos) {
    csd_chat_buf b = new_buf(rt);
    for (size_t i = 0; i < arr.u.arr->n; i++) {
        if (i) csd_chat_buf_put(&b, sep.u.s.p, sep.u.s.n);
        csd_chat_js_string(&b, arr.u.arr->items[i], pos);
    }
    return csd_chat_new_str(rt, &b);
}

static csd_chat_val indent_str(csd_chat_rt *rt, csd_chat_val s, double width, bool first,
                               bool blank) {
    csd_chat_buf b = new_buf(rt);
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    size_t w = width > 0 ? (size_t)fmin(width, (double)rt->max_str) : 0;
    for (size_t line = 0;; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (!((!first && line == 0) || (!blank && le == p)))
            for (size_t i = 0; i < w; i++) csd_chat_buf_putc(&b, ' ');
        csd_chat_buf_put(&b, p, (size_t)(le - p));
        if (!nl) break;
        csd_chat_buf_putc(&b, '\n');
        p = nl + 1;
    }
    return csd_chat_new_str(rt, &b);
}

static csd_chat_val filter_ident(csd_chat_rt *rt, csd_chat_val v, const char *name, size_t n,
                                 uint32_t pos) {
#define IS(lit) name_is(name, n, lit)
    if (IS("safe")) return v;
    if (IS("tojson")) {
        csd_chat_json_opts o = {.undefined_as_null = true};
        return json_filter(rt, v, &o, pos);
    }
    switch (v.type) {
    case CSD_CHAT_V_ARR: {
        csd_chat_arr *a = v.u.arr;
        if (IS("list")) return v;
        if (IS("first")) return a->n ? a->items[0] : csd_chat_v_undef();
        if (IS("last")) return a->n ? a->items[a->n - 1] : csd_chat_v_undef();
        if (IS("length")) return csd_chat_v_int((double)a->n);
        if (IS("reverse")) {
            csd_chat_val out = csd_chat_v_arr(rt->arena, a->n);
            for (size_t i = 0; i < a->n; i++) out.u.arr->items[i] = a->items[a->n - 1 - i];
            return out;
        }
        if (IS("sort")) {
            sort_ctx c = {.rt = rt, .pos = pos};
            return sorted_copy(rt, v, &c);
        }
        if (IS("join")) return join_values(rt, v, csd_chat_v_str("", 0), pos);
        if (IS("string")) {
            csd_chat_json_opts o = {0};
            return json_filter(rt, v, &o, pos);
        }
        if (IS("unique")) {
            csd_chat_val out = csd_chat_v_arr(rt->arena, 0);
            size_t cap = 0;
            for (size_t i = 0; i < a->n; i++) {
                bool seen = false;
                for (size_t j = 0; j < out.u.arr->n && !seen; j++) {
                    csd_chat_val x = out.u.arr->items[j], y = a->items[i];
                    bool both_nan = (x.type == CSD_CHAT_V_INT || x.type == CSD_CHAT_V_FLOAT) &&
                                    (y.type == CSD_CHAT_V_INT || y.type == CSD_CHAT_V_FLOAT) &&
                                    isnan(x.u.num) && isnan(y.u.num);
                    seen = both_nan || csd_chat_strict_eq(x, y);
                }
                if (!seen) arr_push(rt, &out, &cap, a->items[i]);
            }
            return out;
        }
        RAISE(rt, pos, "unknown ArrayValue filter: %.*s", (int)n, name);
    }
    case CSD_CHAT_V_STR: {
        if (IS("length")) return csd_chat_v_int((double)csd_chat_utf16_len(v.u.s.p, v.u.s.n));
        if (IS("upper")) return str_case(rt, v, true);
        if (IS("lower")) return str_case(rt, v, false);
        if (IS("title")) return str_title(rt, v);
        if (IS("capitalize")) return str_capitalize(rt, v);
        if (IS("trim")) return str_trim(v, true, true);
        if (IS("indent")) return indent_str(rt, v, 4, false, false);
        if (IS("join") || IS("string")) return v;
        if (IS("int")) {
            csd_chat_val x = js_parse_int(v.u.s.p, v.u.s.n);
            return x.type == CSD_CHAT_V_UNDEF ? csd_chat_v_int(0) : x;
        }
        if (IS("float")) {
            csd_chat_val x = js_parse_float(v.u.s.p, v.u.s.n);
            return x.type == CSD_CHAT_V_UNDEF || isnan(x.u.num) ? csd_chat_v_float(0) : x;
        }
        RAISE(rt, pos, "unknown StringValue filter: %.*s", (int)n, name);
    }
    case CSD_CHAT_V_INT:
    case CSD_CHAT_V_FLOAT: {
        if (IS("abs"))
            return v.type == CSD_CHAT_V_INT ? csd_chat_v_int(fabs(v.u.num))
                                            : csd_chat_v_float(fabs(v.u.num));
        if (IS("int")) return csd_chat_v_int(floor(v.u.num));
        if (IS("float")) return csd_chat_v_float(v.u.num);
        if (IS("string")) {
            csd_chat_buf b = new_buf(rt);
            csd_chat_to_string(&b, v, pos);
            return csd_chat_new_str(rt, &b);
        }
        RAISE(rt, pos, "unknown NumericValue filter: %.*s", (int)n, name);
    }
    case CSD_CHAT_V_OBJ: {
        if (IS("items")) return obj_pairs(rt, v.u.obj);
        if (IS("length")) return csd_chat_v_int((double)v.u.obj->n);
        csd_chat_val m = obj_builtin(rt, v, name, n);
        if (m.type == CSD_CHAT_V_FUNC) {
            csd_chat_args none = {
                .pos = NULL, .npos = 0, .kw = csd_chat_v_obj(rt->arena, CSD_CHAT_V_OBJ)};
            return call_obj_method(rt, m.u.fn, &none, pos);
        }
        RAISE(rt, pos, "unknown ObjectValue filter: %.*s", (int)n, name);
    }
    case CSD_CHAT_V_BOOL:
        if (IS("bool")) return v;
        if (IS("int")) return csd_chat_v_int(v.u.b ? 1 : 0);
        if (IS("float")) return csd_chat_v_float(v.u.b ? 1 : 0);
        if (IS("string")) return csd_chat_v_cstr(v.u.b ? "true" : "false");
        RAISE(rt, pos, "unknown BooleanValue filter: %.*s", (int)n, name);
    default: break;
    }
    RAISE(rt, pos, "cannot apply filter \"%.*s\" to type: %s", (int)n, name,
          csd_chat_type_name(v.type));
#undef IS
}

static csd_chat_val filter_select(csd_chat_rt *rt, csd_chat_val v, const csd_chat_node *f,
                                  csd_chat_scope *s, bool select) {
    const char *fname = select ? "selectattr" : "rejectattr";
    for (size_t i = 0; i < v.u.arr->n; i++)
        if (v.u.arr->items[i].type != CSD_CHAT_V_OBJ && v.u.arr->items[i].type != CSD_CHAT_V_NS)
            RAISE(rt, f->pos, "`%s` can only be applied to array of objects", fname);
    for (size_t i = 0; i < f->nlist; i++)
        if (f->list[i]->kind != CSD_CHAT_N_STR)
            RAISE(rt, f->pos, "arguments of `%s` must be strings", fname);
    if (f->nlist < 1) RAISE(rt, f->pos, "`%s` needs an attribute name", fname);
    csd_chat_val attr = csd_chat_eval(rt, f->list[0], s);
    csd_chat_val test = f->nlist > 1 ? csd_chat_eval(rt, f->list[1], s) : csd_chat_v_undef();
    csd_chat_val value = f->nlist > 2 ? csd_chat_eval(rt, f->list[2], s) : csd_chat_v_undef();
    if (test.type == CSD_CHAT_V_STR) {
        /* validate the test name up front, like the reference */
        bool known = false;
        static const char *const tests[] = {"boolean", "callable", "odd", "even", "false", "true",
                                            "none", "string", "number", "integer", "iterable",
                                            "mapping", "sequence", "lower", "upper", "defined",
                                            "undefined", "equalto", "eq", NULL};
        for (const char *const *t = tests; *t && !known; t++)
            known = name_is(test.u.s.p, test.u.s.n, *t);
        if (!known) RAISE(rt, f->pos, "unknown test: %.*s", (int)test.u.s.n, test.u.s.p);
    }
    csd_chat_val out = csd_chat_v_arr(rt->arena, 0);
    size_t cap = 0;
    for (size_t i = 0; i < v.u.arr->n; i++) {
        csd_chat_val *x = csd_chat_obj_get(v.u.arr->items[i].u.obj, attr.u.s.p, attr.u.s.n);
        bool r = false;
        if (x) {
            r = test.type == CSD_CHAT_V_STR
                    ? csd_chat_apply_test(rt, test.u.s.p, test.u.s.n, *x, &value, f->pos)
                    : csd_chat_truthy(*x);
        }
        if (r == select) arr_push(rt, &out, &cap, v.u.arr->items[i]);
    }
    return out;
}

static csd_chat_val filter_call(csd_chat_rt *rt, csd_chat_val v, const csd_chat_node *f,
                                csd_chat_scope *s) {
    if (f->a->kind != CSD_CHAT_N_IDENT) RAISE(rt, f->pos, "unknown filter");
    const char *name = f->a->s;
    size_t n = f->a->slen;
    uint32_t pos = f->pos;
#define IS(lit) name_is(name, n, lit)
    if (IS("selectattr") || IS("rejectattr")) {
        if (v.type == CSD_CHAT_V_ARR) return filter_select(rt, v, f, s, IS("selectattr"));
    }
    csd_chat_args a;
    csd_chat_eval_args(rt, f->list, f->nlist, s, &a);
    if (IS("tojson")) {
        csd_chat_json_opts o = {.undefined_as_null = true};
        const csd_chat_val *ind = csd_chat_obj_get(a.kw.u.obj, "indent", 6);
        if (ind && ind->type != CSD_CHAT_V_INT && ind->type != CSD_CHAT_V_NULL)
            RAISE(rt, pos, "if set, indent must be a number");
        if (ind && ind->type == CSD_CHAT_V_INT) {
            if (ind->u.num < 0 || ind->u.num > 1024) RAISE(rt, pos, "indent out of range");
            o.indent = (int)ind->u.num;
        }
        const csd_chat_val *ea = csd_chat_obj_get(a.kw.u.obj, "ensure_ascii", 12);
        if (ea && ea->type != CSD_CHAT_V_BOOL)
            RAISE(rt, pos, "if set, ensure_ascii must be a boolean");
        o.ensure_ascii = ea && ea->u.b;
        const csd_chat_val *sk = csd_chat_obj_get(a.kw.u.obj, "sort_keys", 9);
        if (sk && sk->type != CSD_CHAT_V_BOOL)
            RAISE(rt, pos, "if set, sort_keys must be a boolean");
        o.sort_keys = sk && sk->u.b;
        const csd_chat_val *sep = csd_chat_obj_get(a.kw.u.obj, "separators", 10);
        if (sep && sep->type == CSD_CHAT_V_ARR) {
            if (sep->u.arr->n != 2 || sep->u.arr->items[0].type != CSD_CHAT_V_STR ||
                sep->u.arr->items[1].type != CSD_CHAT_V_STR)
                RAISE(rt, pos, "separators must be a tuple of two strings");
            o.item_sep = csd_chat_arena_strndup(rt->arena, sep->u.arr->items[0].u.s.p,
                                                sep->u.arr->items[0].u.s.n);
            o.key_sep = csd_chat_arena_strndup(rt->arena, sep->u.arr->items[1].u.s.p,
                                               sep->u.arr->items[1].u.s.n);
        } else if (sep && sep->type != CSD_CHAT_V_NULL) {
            RAISE(rt, pos, "if set, separators must be a tuple of two strings");
        }
        return json_filter(rt, v, &o, pos);
    }
    if (IS("join")) {
        csd_chat_val arr;
        if (v.type == CSD_CHAT_V_STR) {
            csd_chat_val sl = csd_chat_v_arr(rt->arena, 0);
            size_t cap = 0;
            const char *p = v.u.s.p, *end = p + v.u.s.n;
            while (p < end) {
                uint32_t cp;
                size_t k = csd_chat_utf8_next(p, end, &cp);
                arr_push(rt, &sl, &cap, csd_chat_v_str(p, k));
                p += k;
            }
            arr = sl;
        } else if (v.type == CSD_CHAT_V_ARR) {
            arr = v;
        } else {
            RAISE(rt, pos, "cannot apply filter \"join\" to type: %s", csd_chat_type_name(v.type));
        }
        const csd_chat_val *sep = arg_or_kw(&a, 0, "separator");
        if (sep && sep->type != CSD_CHAT_V_STR) RAISE(rt, pos, "separator must be a string");
        return join_values(rt, arr, sep ? *sep : csd_chat_v_str("", 0), pos);
    }
    if (IS("int") || IS("float")) {
        bool is_int = IS("int");
        const csd_chat_val *d = arg_or_kw(&a, 0, "default");
        csd_chat_val def = d ? *d : is_int ? csd_chat_v_int(0) : csd_chat_v_float(0);
        if (v.type == CSD_CHAT_V_STR) {
            csd_chat_val x =
                is_int ? js_parse_int(v.u.s.p, v.u.s.n) : js_parse_float(v.u.s.p, v.u.s.n);
            return x.type == CSD_CHAT_V_UNDEF || isnan(x.u.num) ? def : x;
        }
        if (v.type == CSD_CHAT_V_INT || v.type == CSD_CHAT_V_FLOAT) return v;
        if (v.type == CSD_CHAT_V_BOOL)
            return is_int ? csd_chat_v_int(v.u.b) : csd_chat_v_float(v.u.b);
        RAISE(rt, pos, "cannot apply filter \"%.*s\" to type: %s", (int)n, name,
              csd_chat_type_name(v.type));
    }
    if (IS("default")) {
        csd_chat_val def = a.npos > 0 ? a.pos[0] : csd_chat_v_str("", 0);
        const csd_chat_val *bo = arg_or_kw(&a, 1, "boolean");
        if (bo && bo->type != CSD_CHAT_V_BOOL)
            RAISE(rt, pos, "`default` filter flag must be a boolean");
        if (v.type == CSD_CHAT_V_UNDEF || (bo && bo->u.b && !csd_chat_truthy(v))) return def;
        return v;
    }
    if (v.type == CSD_CHAT_V_ARR) {
        if (IS("sort")) {
            const csd_chat_val *rev = arg_or_kw(&a, 0, "reverse");
            const csd_chat_val *cs = arg_or_kw(&a, 1, "case_sensitive");
            const csd_chat_val *at = arg_or_kw(&a, 2, "attribute");
            if (rev && rev->type != CSD_CHAT_V_BOOL) RAISE(rt, pos, "reverse must be a boolean");
            if (cs && cs->type != CSD_CHAT_V_BOOL)
                RAISE(rt, pos, "case_sensitive must be a boolean");
            if (at && at->type != CSD_CHAT_V_STR && at->type != CSD_CHAT_V_INT &&
                at->type != CSD_CHAT_V_NULL)
                RAISE(rt, pos, "attribute must be a string, integer, or null");
            sort_ctx c = {
                .rt = rt, .reverse = rev && rev->u.b, .case_sensitive = cs && cs->u.b, .pos = pos};
            if (at && at->type == CSD_CHAT_V_STR) {
                c.attr = at->u.s.p;
                c.attr_len = at->u.s.n;
            } else if (at && at->type == CSD_CHAT_V_INT) {
                csd_chat_buf b = new_buf(rt);
                csd_chat_fmt_number(&b, at->u.num);
                c.attr = b.p;
                c.attr_len = b.len;
            }
            return sorted_copy(rt, v, &c);
        }
        if (IS("map")) {
            const csd_chat_val *at = csd_chat_obj_get(a.kw.u.obj, "attribute", 9);
            if (!at)
                RAISE(rt, pos,
                      "`map` expressions without `attribute` set are not currently supported");
            if (at->type != CSD_CHAT_V_STR) RAISE(rt, pos, "attribute must be a string");
            const csd_chat_val *def = csd_chat_obj_get(a.kw.u.obj, "default", 7);
            csd_chat_val out = csd_chat_v_arr(rt->arena, v.u.arr->n);
            for (size_t i = 0; i < v.u.arr->n; i++) {
                csd_chat_val it = v.u.arr->items[i];
                if (it.type != CSD_CHAT_V_OBJ && it.type != CSD_CHAT_V_NS)
                    RAISE(rt, pos, "items in map must be an object");
                csd_chat_val x = attr_path(it, at->u.s.p, at->u.s.n);
                out.u.arr->items[i] = x.type == CSD_CHAT_V_UNDEF && def ? *def : x;
            }
            return out;
        }
        RAISE(rt, pos, "unknown ArrayValue filter: %.*s", (int)n, name);
    }
    if (v.type == CSD_CHAT_V_STR) {
        if (IS("indent")) {
            const csd_chat_val *w = arg_or_kw(&a, 0, "width");
            if (w && w->type != CSD_CHAT_V_INT) RAISE(rt, pos, "width must be a number");
            const csd_chat_val *first = arg_or_kw(&a, 1, "first");
            const csd_chat_val *blank = arg_or_kw(&a, 2, "blank");
            return indent_str(rt, v, w ? w->u.num : 4, first && csd_chat_truthy(*first),
                              blank && csd_chat_truthy(*blank));
        }
        if (IS("replace")) {
            csd_chat_val *args = csd_chat_arena_alloc(rt->arena, (a.npos + 1) * sizeof *args);
            if (a.npos) memcpy(args, a.pos, a.npos * sizeof *args);
            args[a.npos] = a.kw;
            return str_replace(rt, v, args, a.npos + 1, pos);
        }
        RAISE(rt, pos, "unknown StringValue filter: %.*s", (int)n, name);
    }
    if (v.type == CSD_CHAT_V_OBJ) {
        csd_chat_val m = obj_builtin(rt, v, name, n);
        if (m.type == CSD_CHAT_V_FUNC) return call_obj_method(rt, m.u.fn, &a, pos);
        RAISE(rt, pos, "unknown ObjectValue filter: %.*s", (int)n, name);
    }
    RAISE(rt, pos, "cannot apply filter \"%.*s\" to type: %s", (int)n, name,
          csd_chat_type_name(v.type));
#undef IS
}

csd_chat_val csd_chat_apply_filter(csd_chat_rt *rt, csd_chat_val operand,
                                   const csd_chat_node *filter, csd_chat_scope *s) {
    if (filter->kind == CSD_CHAT_N_IDENT)
        return filter_ident(rt, operand, filter->s, filter->slen, filter->pos);
    if (filter->kind == CSD_CHAT_N_CALL) return filter_call(rt, operand, filter, s);
    RAISE(rt, filter->pos, "unknown filter");
}
