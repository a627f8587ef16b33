/* tmpl_eval: the interpreter: statements stream into rt->out, expressions evaluate to values with
 * the semantics of @huggingface/jinja (JS loose ==, string + anything, undefined tolerated in
 * attribute access, dynamic macro scope). Bounded by a step and a time budget, a recursion depth
 * limit, the arena byte limit and a per-string size limit, so any template terminates with bounded
 * memory. */
#include "chat/tmpl_internal.h"

#include <math.h>
#include <string.h>

#include "core/clock.h"

enum flow { FLOW_NORMAL = 0, FLOW_BREAK, FLOW_CONTINUE };

static int exec_block(csd_chat_rt *rt, csd_chat_node *const *list, size_t n, csd_chat_scope *s);

#define RAISE(rt, pos, ...) csd_chat_raise((rt)->fail, CSD_EINVAL, (pos), __VA_ARGS__)

/* Counts a step against the budgets. The time budget stops what steps do not measure: one step
 * may scan a string of megabytes or an object of many keys. Read every 64 steps, the clock costs
 * a few percent of a render. */
void csd_chat_step(csd_chat_rt *rt, uint32_t pos) {
    if (++rt->steps > rt->max_steps)
        csd_chat_raise(rt->fail, CSD_ERANGE, pos, "template exceeded its budget of %llu steps",
                       (unsigned long long)rt->max_steps);
    if ((rt->steps & 63) == 0 && csd_now_ns() > rt->deadline_ns)
        csd_chat_raise(rt->fail, CSD_ERANGE, pos, "template exceeded its time budget of %llu ms",
                       (unsigned long long)rt->max_ms);
}

static void enter(csd_chat_rt *rt, uint32_t pos) {
    if (++rt->depth > CSD_CHAT_MAX_EVAL_DEPTH)
        csd_chat_raise(rt->fail, CSD_ERANGE, pos, "recursion deeper than %d",
                       CSD_CHAT_MAX_EVAL_DEPTH);
    csd_chat_step(rt, pos);
}

void csd_chat_scope_set(csd_chat_rt *rt, csd_chat_scope *s, const char *k, size_t kn,
                        csd_chat_val v) {
    csd_chat_obj_set(rt->arena, &s->vars, k, kn, v);
}

csd_chat_val csd_chat_scope_lookup(const csd_chat_scope *s, const char *k, size_t kn) {
    for (; s; s = s->parent) {
        csd_chat_val *v = csd_chat_obj_get(&s->vars, k, kn);
        if (v) return *v;
    }
    return csd_chat_v_undef();
}

static csd_chat_scope *child(csd_chat_rt *rt, csd_chat_scope *parent) {
    csd_chat_scope *s = csd_chat_arena_alloc(rt->arena, sizeof *s);
    s->parent = parent;
    return s;
}

csd_chat_val csd_chat_new_str(csd_chat_rt *rt, const csd_chat_buf *b) {
    (void)rt; /* strings live in rt's arena already; kept for symmetry with other constructors */
    return csd_chat_v_str(b->p ? b->p : "", b->len);
}

/* Runs a block into a fresh buffer and returns it as a string (set blocks, macros, filter
 * blocks). */
static csd_chat_val render_to_string(csd_chat_rt *rt, csd_chat_node *const *list, size_t n,
                                     csd_chat_scope *s, uint32_t pos) {
    csd_chat_buf tmp;
    csd_chat_buf_init(&tmp, rt->arena, rt->max_str);
    csd_chat_buf *saved = rt->out;
    rt->out = &tmp;
    int flow = exec_block(rt, list, n, s);
    rt->out = saved;
    if (flow != FLOW_NORMAL) RAISE(rt, pos, "break/continue outside of a loop");
    return csd_chat_new_str(rt, &tmp);
}

/* ---- arguments and calls ---- */

void csd_chat_eval_args(csd_chat_rt *rt, csd_chat_node *const *list, size_t n, csd_chat_scope *s,
                        csd_chat_args *out) {
    size_t npos = 0;
    csd_chat_val *pos = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < n; i++) {
        const csd_chat_node *x = list[i];
        if (x->kind == CSD_CHAT_N_KWARG || x->kind == CSD_CHAT_N_KWSPREAD) continue;
        csd_chat_val v = csd_chat_eval(rt, x->kind == CSD_CHAT_N_SPREAD ? x->a : x, s);
        size_t add = 1;
        if (x->kind == CSD_CHAT_N_SPREAD) {
            if (v.type != CSD_CHAT_V_ARR)
                RAISE(rt, x->pos, "cannot unpack non-iterable type: %s",
                      csd_chat_type_name(v.type));
            add = v.u.arr->n;
        }
        if (npos + add > cap) {
            size_t ncap = (npos + add) * 2 + 4;
            csd_chat_val *np = csd_chat_arena_alloc(rt->arena, ncap * sizeof *np);
            if (npos) memcpy(np, pos, npos * sizeof *np);
            pos = np;
            cap = ncap;
        }
        if (x->kind == CSD_CHAT_N_SPREAD) {
            for (size_t k = 0; k < add; k++) pos[npos++] = v.u.arr->items[k];
        } else {
            pos[npos++] = v;
        }
    }
    csd_chat_val kw = csd_chat_v_obj(rt->arena, CSD_CHAT_V_OBJ);
    kw.kwargs = true;
    for (size_t i = 0; i < n; i++) {
        const csd_chat_node *x = list[i];
        if (x->kind == CSD_CHAT_N_KWARG) {
            if (csd_chat_obj_get(kw.u.obj, x->s, x->slen))
                RAISE(rt, x->pos, "got multiple values for keyword argument '%.*s'", (int)x->slen,
                      x->s);
            csd_chat_obj_set(rt->arena, kw.u.obj, x->s, x->slen, csd_chat_eval(rt, x->a, s));
        } else if (x->kind == CSD_CHAT_N_KWSPREAD) {
            csd_chat_val v = csd_chat_eval(rt, x->a, s);
            if (v.type != CSD_CHAT_V_OBJ)
                RAISE(rt, x->pos, "argument after ** must be a mapping, not %s",
                      csd_chat_type_name(v.type));
            for (size_t k = 0; k < v.u.obj->n; k++) {
                if (csd_chat_obj_get(kw.u.obj, v.u.obj->keys[k], v.u.obj->klens[k]))
                    RAISE(rt, x->pos, "got multiple values for keyword argument '%.*s'",
                          (int)v.u.obj->klens[k], v.u.obj->keys[k]);
                csd_chat_obj_set(rt->arena, kw.u.obj, v.u.obj->keys[k], v.u.obj->klens[k],
                                 v.u.obj->vals[k]);
            }
        }
    }
    out->pos = pos;
    out->npos = npos;
    out->kw = kw;
}

static void param_name(const csd_chat_node *p, const char **s, size_t *n) {
    *s = p->s;
    *n = p->slen;
}

static csd_chat_val call_macro(csd_chat_rt *rt, const csd_chat_func *f, const csd_chat_args *args,
                               csd_chat_scope *caller, uint32_t pos) {
    const csd_chat_node *m = f->macro;
    csd_chat_scope *ms = child(rt, caller);
    csd_chat_obj *kw = csd_chat_v_obj(rt->arena, CSD_CHAT_V_OBJ).u.obj;
    for (size_t i = 0; i < args->kw.u.obj->n; i++)
        csd_chat_obj_set(rt->arena, kw, args->kw.u.obj->keys[i], args->kw.u.obj->klens[i],
                         args->kw.u.obj->vals[i]);
    const csd_chat_node **pending =
        csd_chat_arena_alloc(rt->arena, (m->nlist2 + 1) * sizeof *pending);
    size_t npending = 0;
    for (size_t i = 0; i < m->nlist2; i++) {
        const csd_chat_node *p = m->list2[i];
        const char *name;
        size_t nlen;
        param_name(p, &name, &nlen);
        csd_chat_val v = csd_chat_v_undef();
        bool have = false;
        if (i < args->npos) {
            v = args->pos[i];
            have = true;
        } else {
            csd_chat_val *k = csd_chat_obj_get(kw, name, nlen);
            if (k) {
                v = *k;
                have = true;
                /* delete: swap with the last entry keeps the rest in order for the error below */
                size_t idx = (size_t)(k - kw->vals);
                for (size_t j = idx + 1; j < kw->n; j++) {
                    kw->keys[j - 1] = kw->keys[j];
                    kw->klens[j - 1] = kw->klens[j];
                    kw->vals[j - 1] = kw->vals[j];
                }
                kw->n--;
            }
        }
        if (!have && p->kind == CSD_CHAT_N_KWARG) pending[npending++] = p;
        csd_chat_scope_set(rt, ms, name, nlen, v);
    }
    if (f->uses_kwargs) {
        csd_chat_val kv = {.type = CSD_CHAT_V_OBJ};
        kv.u.obj = kw;
        csd_chat_scope_set(rt, ms, "kwargs", 6, kv);
    } else if (kw->n > 0) {
        RAISE(rt, pos, "macro '%.*s' takes no keyword argument '%.*s'", (int)m->slen, m->s,
              (int)kw->klens[0], kw->keys[0]);
    }
    if (f->uses_varargs) {
        size_t extra = args->npos > m->nlist2 ? args->npos - m->nlist2 : 0;
        csd_chat_val va = csd_chat_v_arr(rt->arena, extra);
        for (size_t i = 0; i < extra; i++) va.u.arr->items[i] = args->pos[m->nlist2 + i];
        csd_chat_scope_set(rt, ms, "varargs", 7, va);
    } else if (args->npos > m->nlist2) {
        RAISE(rt, pos, "macro '%.*s' takes not more than %zu argument(s)", (int)m->slen, m->s,
              m->nlist2);
    }
    for (size_t i = 0; i < npending; i++)
        csd_chat_scope_set(rt, ms, pending[i]->s, pending[i]->slen,
                           csd_chat_eval(rt, pending[i]->a, ms));
    return render_to_string(rt, m->list, m->nlist, ms, pos);
}

csd_chat_val csd_chat_call(csd_chat_rt *rt, csd_chat_val fn, const csd_chat_args *args,
                           csd_chat_scope *s, uint32_t pos) {
    if (fn.type != CSD_CHAT_V_FUNC)
        RAISE(rt, pos, "cannot call something that is not a function: got %s",
              csd_chat_type_name(fn.type));
    if (fn.u.fn->kind == CSD_CHAT_FN_MACRO) return call_macro(rt, fn.u.fn, args, s, pos);
    return csd_chat_call_builtin(rt, fn.u.fn, args, pos);
}

/* ---- expressions ---- */

static bool numeric_like(csd_chat_val v) {
    return v.type == CSD_CHAT_V_INT || v.type == CSD_CHAT_V_FLOAT || v.type == CSD_CHAT_V_BOOL;
}
static double num_of(csd_chat_val v) {
    return v.type == CSD_CHAT_V_BOOL ? (v.u.b ? 1 : 0) : v.u.num;
}
static bool is_num(csd_chat_val v) {
    return v.type == CSD_CHAT_V_INT || v.type == CSD_CHAT_V_FLOAT;
}

static csd_chat_val concat(csd_chat_rt *rt, csd_chat_val l, csd_chat_val r, uint32_t pos) {
    csd_chat_buf b;
    csd_chat_buf_init(&b, rt->arena, rt->max_str);
    csd_chat_js_string(&b, l, pos);
    csd_chat_js_string(&b, r, pos);
    return csd_chat_new_str(rt, &b);
}

static bool str_contains(csd_chat_val hay, csd_chat_val needle) {
    if (needle.u.s.n == 0) return true;
    return memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
}

/* l ** r on numbers (and booleans), as the reference computes it. */
static csd_chat_val eval_pow(csd_chat_rt *rt, csd_chat_val l, csd_chat_val r, uint32_t pos) {
    double a = num_of(l), b = num_of(r);
    if (a == 0 && b < 0) RAISE(rt, pos, "0.0 cannot be raised to a negative power");
    double res = pow(a, b);
    /* JS differs from C pow only where the base is +-1 and the exponent is not finite */
    if ((a == 1 || a == -1) && !isfinite(b)) res = NAN;
    if (!isfinite(res)) RAISE(rt, pos, "exponentiation result is not a finite real number");
    bool isf = l.type == CSD_CHAT_V_FLOAT || r.type == CSD_CHAT_V_FLOAT || b < 0;
    return isf ? csd_chat_v_float(res) : csd_chat_v_int(res);
}

static csd_chat_val number(double v, bool isf) {
    return isf ? csd_chat_v_float(v) : csd_chat_v_int(v);
}

/* Arithmetic and comparison of two numbers; undefined for an operator numbers do not have. An int
 * result stays an int unless a float took part (division always gives a float). */
static csd_chat_val eval_numeric(int op, csd_chat_val l, csd_chat_val r) {
    double a = l.u.num, b = r.u.num;
    bool isf = l.type == CSD_CHAT_V_FLOAT || r.type == CSD_CHAT_V_FLOAT;
    switch (op) {
    case CSD_CHAT_OP_ADD:
        return number(a + b, isf);
    case CSD_CHAT_OP_SUB:
        return number(a - b, isf);
    case CSD_CHAT_OP_MUL:
        return number(a * b, isf);
    case CSD_CHAT_OP_DIV:
        return number(a / b, true);
    case CSD_CHAT_OP_FLOORDIV:
        return number(floor(a / b), isf);
    case CSD_CHAT_OP_MOD:
        return number(fmod(a, b), isf);
    case CSD_CHAT_OP_LT:
        return csd_chat_v_bool(a < b);
    case CSD_CHAT_OP_GT:
        return csd_chat_v_bool(a > b);
    case CSD_CHAT_OP_GE:
        return csd_chat_v_bool(a >= b);
    case CSD_CHAT_OP_LE:
        return csd_chat_v_bool(a <= b);
    default:
        return csd_chat_v_undef();
    }
}

static csd_chat_val join_arrays(csd_chat_rt *rt, csd_chat_val l, csd_chat_val r) {
    size_t na = l.u.arr->n, nb = r.u.arr->n;
    csd_chat_val v = csd_chat_v_arr(rt->arena, na + nb);
    if (na) memcpy(v.u.arr->items, l.u.arr->items, na * sizeof(csd_chat_val));
    if (nb) memcpy(v.u.arr->items + na, r.u.arr->items, nb * sizeof(csd_chat_val));
    return v;
}

static bool is_membership(int op) { return op == CSD_CHAT_OP_IN || op == CSD_CHAT_OP_NOTIN; }

/* l in r for an array r (strict equality), a string r (substring) or an object r (a key). */
static csd_chat_val eval_membership(int op, csd_chat_val l, csd_chat_val r) {
    bool in = false;
    if (r.type == CSD_CHAT_V_ARR)
        for (size_t i = 0; i < r.u.arr->n && !in; i++)
            in = csd_chat_strict_eq(r.u.arr->items[i], l);
    else if (r.type == CSD_CHAT_V_STR)
        in = str_contains(r, l);
    else
        in = csd_chat_obj_get(r.u.obj, l.u.s.p, l.u.s.n) != NULL;
    return csd_chat_v_bool(op == CSD_CHAT_OP_IN ? in : !in);
}

static csd_chat_val eval_binary(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s) {
    csd_chat_val l = csd_chat_eval(rt, n->a, s);
    int op = n->op;
    if (op == CSD_CHAT_OP_AND) return csd_chat_truthy(l) ? csd_chat_eval(rt, n->b, s) : l;
    if (op == CSD_CHAT_OP_OR) return csd_chat_truthy(l) ? l : csd_chat_eval(rt, n->b, s);
    csd_chat_val r = csd_chat_eval(rt, n->b, s);
    if (op == CSD_CHAT_OP_EQ) return csd_chat_v_bool(csd_chat_loose_eq(rt->arena, l, r, n->pos));
    if (op == CSD_CHAT_OP_NE) return csd_chat_v_bool(!csd_chat_loose_eq(rt->arena, l, r, n->pos));
    if (l.type == CSD_CHAT_V_UNDEF || r.type == CSD_CHAT_V_UNDEF) {
        if (r.type == CSD_CHAT_V_UNDEF && is_membership(op))
            return csd_chat_v_bool(op == CSD_CHAT_OP_NOTIN);
        RAISE(rt, n->pos, "cannot perform operation %s on undefined values", csd_chat_op_name(op));
    }
    if (l.type == CSD_CHAT_V_NULL || r.type == CSD_CHAT_V_NULL)
        RAISE(rt, n->pos, "cannot perform operation %s on null values", csd_chat_op_name(op));
    if (op == CSD_CHAT_OP_CONCAT) return concat(rt, l, r, n->pos);
    if (op == CSD_CHAT_OP_POW && numeric_like(l) && numeric_like(r))
        return eval_pow(rt, l, r, n->pos);
    if (is_num(l) && is_num(r)) {
        csd_chat_val v = eval_numeric(op, l, r);
        if (v.type != CSD_CHAT_V_UNDEF) return v;
    } else if (l.type == CSD_CHAT_V_ARR && r.type == CSD_CHAT_V_ARR) {
        if (op == CSD_CHAT_OP_ADD) return join_arrays(rt, l, r);
    } else if (r.type == CSD_CHAT_V_ARR && is_membership(op)) {
        return eval_membership(op, l, r);
    }
    if ((l.type == CSD_CHAT_V_STR || r.type == CSD_CHAT_V_STR) && op == CSD_CHAT_OP_ADD)
        return concat(rt, l, r, n->pos);
    if (is_membership(op) && l.type == CSD_CHAT_V_STR &&
        (r.type == CSD_CHAT_V_STR || r.type == CSD_CHAT_V_OBJ))
        return eval_membership(op, l, r);
    RAISE(rt, n->pos, "unknown operator \"%s\" between %s and %s", csd_chat_op_name(op),
          csd_chat_type_name(l.type), csd_chat_type_name(r.type));
}

static csd_chat_val eval_unary(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s) {
    csd_chat_val v = csd_chat_eval(rt, n->a, s);
    if (n->op == CSD_CHAT_OP_NOT) return csd_chat_v_bool(!csd_chat_truthy(v));
    if (!numeric_like(v))
        RAISE(rt, n->pos, "unknown operator \"%s\" for %s", csd_chat_op_name(n->op),
              csd_chat_type_name(v.type));
    double x = (n->op == CSD_CHAT_OP_SUB ? -1.0 : 1.0) * num_of(v);
    return v.type == CSD_CHAT_V_FLOAT ? csd_chat_v_float(x) : csd_chat_v_int(x);
}

/* Python-style slicing with the reference's clamping rules (utils.ts slice). */
static csd_chat_val eval_slice(csd_chat_rt *rt, csd_chat_val obj, const csd_chat_node *sl,
                               csd_chat_scope *s) {
    if (obj.type != CSD_CHAT_V_ARR && obj.type != CSD_CHAT_V_STR)
        RAISE(rt, sl->pos, "slice object must be an array or string");
    csd_chat_val sv[3];
    const csd_chat_node *parts[3] = {sl->a, sl->b, sl->c};
    static const char *names[3] = {"start", "stop", "step"};
    for (int i = 0; i < 3; i++) {
        sv[i] = parts[i] ? csd_chat_eval(rt, parts[i], s) : csd_chat_v_undef();
        if (sv[i].type != CSD_CHAT_V_INT && sv[i].type != CSD_CHAT_V_UNDEF)
            RAISE(rt, sl->pos, "slice %s must be numeric or undefined", names[i]);
    }
    /* element boundaries: array items or code points */
    size_t len;
    const char **cps = NULL;
    if (obj.type == CSD_CHAT_V_ARR) {
        len = obj.u.arr->n;
    } else {
        const char *p = obj.u.s.p, *end = p + obj.u.s.n;
        len = 0;
        cps = csd_chat_arena_alloc(rt->arena, (obj.u.s.n + 1) * sizeof *cps);
        while (p < end) {
            uint32_t cp;
            cps[len++] = p;
            p += csd_chat_utf8_next(p, end, &cp);
        }
        cps[len] = end;
    }
    double L = (double)len;
    double step = sv[2].type == CSD_CHAT_V_UNDEF ? 1 : sv[2].u.num;
    double dir = step > 0 ? 1 : step < 0 ? -1 : step == 0 ? 0 : NAN;
    double start, stop;
    if (dir >= 0) {
        start = sv[0].type == CSD_CHAT_V_UNDEF ? 0 : sv[0].u.num;
        start = start < 0 ? fmax(L + start, 0) : fmin(start, L);
        stop = sv[1].type == CSD_CHAT_V_UNDEF ? L : sv[1].u.num;
        stop = stop < 0 ? fmax(L + stop, 0) : fmin(stop, L);
    } else {
        start = sv[0].type == CSD_CHAT_V_UNDEF ? L - 1 : sv[0].u.num;
        start = start < 0 ? fmax(L + start, -1) : fmin(start, L - 1);
        stop = sv[1].type == CSD_CHAT_V_UNDEF ? -1 : sv[1].u.num;
        stop = stop < -1 ? fmax(L + stop, -1) : fmin(stop, L - 1);
    }
    size_t count = 0;
    size_t *idx = csd_chat_arena_alloc(rt->arena, (len + 1) * sizeof *idx);
    for (double i = start; dir * i < dir * stop && count <= len; i += step) {
        if (!(i >= 0 && i < L)) break;
        idx[count++] = (size_t)i;
    }
    if (obj.type == CSD_CHAT_V_ARR) {
        csd_chat_val v = csd_chat_v_arr(rt->arena, count);
        for (size_t i = 0; i < count; i++) v.u.arr->items[i] = obj.u.arr->items[idx[i]];
        return v;
    }
    csd_chat_buf b;
    csd_chat_buf_init(&b, rt->arena, rt->max_str);
    csd_chat_buf_put(&b, "", 0);
    for (size_t i = 0; i < count; i++)
        csd_chat_buf_put(&b, cps[idx[i]], (size_t)(cps[idx[i] + 1] - cps[idx[i]]));
    return csd_chat_new_str(rt, &b);
}

static csd_chat_val eval_member(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s) {
    csd_chat_val obj = csd_chat_eval(rt, n->a, s);
    csd_chat_val prop;
    if (n->flag) {
        if (n->b->kind == CSD_CHAT_N_SLICE) return eval_slice(rt, obj, n->b, s);
        prop = csd_chat_eval(rt, n->b, s);
    } else if (n->b->kind == CSD_CHAT_N_INT) {
        prop = csd_chat_v_int(n->b->num);
    } else {
        prop = csd_chat_v_str(n->b->s, n->b->slen);
    }
    return csd_chat_member(rt, obj, prop, n->pos);
}

static csd_chat_val eval_object(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s) {
    csd_chat_val v = csd_chat_v_obj(rt->arena, CSD_CHAT_V_OBJ);
    for (size_t i = 0; i + 1 < n->nlist; i += 2) {
        csd_chat_val k = csd_chat_eval(rt, n->list[i], s);
        if (k.type != CSD_CHAT_V_STR)
            RAISE(rt, n->list[i]->pos, "object keys must be strings: got %s",
                  csd_chat_type_name(k.type));
        csd_chat_obj_set(rt->arena, v.u.obj, k.u.s.p, k.u.s.n,
                         csd_chat_eval(rt, n->list[i + 1], s));
    }
    return v;
}

csd_chat_val csd_chat_eval(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s) {
    if (!n) return csd_chat_v_undef();
    enter(rt, n->pos);
    csd_chat_val v;
    switch (n->kind) {
    case CSD_CHAT_N_TEXT:
    case CSD_CHAT_N_STR: v = csd_chat_v_str(n->s, n->slen); break;
    case CSD_CHAT_N_INT: v = csd_chat_v_int(n->num); break;
    case CSD_CHAT_N_FLOAT: v = csd_chat_v_float(n->num); break;
    case CSD_CHAT_N_ARRAY:
    case CSD_CHAT_N_TUPLE:
        v = csd_chat_v_arr(rt->arena, n->nlist);
        for (size_t i = 0; i < n->nlist; i++) v.u.arr->items[i] = csd_chat_eval(rt, n->list[i], s);
        v.tuple = n->kind == CSD_CHAT_N_TUPLE;
        break;
    case CSD_CHAT_N_OBJECT: v = eval_object(rt, n, s); break;
    case CSD_CHAT_N_IDENT: v = csd_chat_scope_lookup(s, n->s, n->slen); break;
    case CSD_CHAT_N_CALL: {
        csd_chat_args args;
        csd_chat_eval_args(rt, n->list, n->nlist, s, &args);
        csd_chat_val fn = csd_chat_eval(rt, n->a, s);
        v = csd_chat_call(rt, fn, &args, s, n->pos);
        break;
    }
    case CSD_CHAT_N_MEMBER: v = eval_member(rt, n, s); break;
    case CSD_CHAT_N_UNARY: v = eval_unary(rt, n, s); break;
    case CSD_CHAT_N_BINARY: v = eval_binary(rt, n, s); break;
    case CSD_CHAT_N_FILTER:
        v = csd_chat_apply_filter(rt, csd_chat_eval(rt, n->a, s), n->b, s);
        break;
    case CSD_CHAT_N_TEST:
        v = csd_chat_v_bool(csd_chat_apply_test(rt, n->s, n->slen, csd_chat_eval(rt, n->a, s), NULL,
                                                n->pos) != n->flag);
        break;
    case CSD_CHAT_N_SELECT:
        v = csd_chat_truthy(csd_chat_eval(rt, n->b, s)) ? csd_chat_eval(rt, n->a, s)
                                                        : csd_chat_v_undef();
        break;
    case CSD_CHAT_N_TERNARY:
        v = csd_chat_truthy(csd_chat_eval(rt, n->a, s)) ? csd_chat_eval(rt, n->b, s)
                                                         : csd_chat_eval(rt, n->c, s);
        break;
    case CSD_CHAT_N_COMMENT: v = csd_chat_v_null(); break;
    default: RAISE(rt, n->pos, "unexpected node in expression");
    }
    rt->depth--;
    return v;
}

/* ---- statements ---- */

static void exec_set(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s) {
    csd_chat_val rhs =
        n->b ? csd_chat_eval(rt, n->b, s) : render_to_string(rt, n->list, n->nlist, s, n->pos);
    const csd_chat_node *t = n->a;
    if (t->kind == CSD_CHAT_N_IDENT) {
        csd_chat_scope_set(rt, s, t->s, t->slen, rhs);
    } else if (t->kind == CSD_CHAT_N_TUPLE) {
        if (rhs.type != CSD_CHAT_V_ARR)
            RAISE(rt, n->pos, "cannot unpack non-iterable type in set: %s",
                  csd_chat_type_name(rhs.type));
        if (rhs.u.arr->n != t->nlist)
            RAISE(rt, n->pos, "too %s items to unpack in set",
                  t->nlist > rhs.u.arr->n ? "few" : "many");
        for (size_t i = 0; i < t->nlist; i++) {
            if (t->list[i]->kind != CSD_CHAT_N_IDENT)
                RAISE(rt, n->pos, "cannot unpack to non-identifier in set");
            csd_chat_scope_set(rt, s, t->list[i]->s, t->list[i]->slen, rhs.u.arr->items[i]);
        }
    } else if (t->kind == CSD_CHAT_N_MEMBER) {
        csd_chat_val obj = csd_chat_eval(rt, t->a, s);
        if (obj.type != CSD_CHAT_V_NS)
            RAISE(rt, n->pos, "cannot assign attribute on non-namespace object");
        if (t->b->kind != CSD_CHAT_N_IDENT)
            RAISE(rt, n->pos, "cannot assign to member with non-identifier property");
        csd_chat_obj_set(rt->arena, obj.u.obj, t->b->s, t->b->slen, rhs);
    } else {
        RAISE(rt, n->pos, "invalid left-hand side in assignment");
    }
}

static void bind_loopvar(csd_chat_rt *rt, const csd_chat_node *lv, csd_chat_scope *s,
                         csd_chat_val cur) {
    if (lv->kind == CSD_CHAT_N_IDENT) {
        csd_chat_scope_set(rt, s, lv->s, lv->slen, cur);
        return;
    }
    for (size_t j = 0; j < lv->nlist; j++) {
        if (lv->list[j]->kind != CSD_CHAT_N_IDENT)
            RAISE(rt, lv->pos, "cannot unpack non-identifier type");
        csd_chat_scope_set(rt, s, lv->list[j]->s, lv->list[j]->slen, cur.u.arr->items[j]);
    }
}

static void check_unpack(csd_chat_rt *rt, const csd_chat_node *lv, csd_chat_val cur) {
    if (lv->kind != CSD_CHAT_N_TUPLE) return;
    if (cur.type != CSD_CHAT_V_ARR || cur.tuple)
        RAISE(rt, lv->pos, "cannot unpack non-iterable type: %s",
              cur.tuple ? "TupleValue" : csd_chat_type_name(cur.type));
    if (cur.u.arr->n != lv->nlist)
        RAISE(rt, lv->pos, "too %s items to unpack", lv->nlist > cur.u.arr->n ? "few" : "many");
}

static void exec_for(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *outer) {
    csd_chat_scope *s = child(rt, outer);
    const csd_chat_node *test = NULL;
    csd_chat_val it;
    if (n->b->kind == CSD_CHAT_N_SELECT) {
        it = csd_chat_eval(rt, n->b->a, s);
        test = n->b->b;
    } else {
        it = csd_chat_eval(rt, n->b, s);
    }
    if (it.type == CSD_CHAT_V_OBJ) {
        csd_chat_val keys = csd_chat_v_arr(rt->arena, it.u.obj->n);
        for (size_t i = 0; i < it.u.obj->n; i++)
            keys.u.arr->items[i] = csd_chat_v_str(it.u.obj->keys[i], it.u.obj->klens[i]);
        it = keys;
    } else if (it.type != CSD_CHAT_V_ARR) {
        RAISE(rt, n->pos, "expected iterable or object type in for loop: got %s",
              csd_chat_type_name(it.type));
    }
    size_t total = it.u.arr->n, count = 0;
    csd_chat_val *items = csd_chat_arena_alloc(rt->arena, (total + 1) * sizeof *items);
    for (size_t i = 0; i < total; i++) {
        csd_chat_val cur = it.u.arr->items[i];
        check_unpack(rt, n->a, cur);
        if (test) {
            csd_chat_scope *ls = child(rt, s);
            bind_loopvar(rt, n->a, ls, cur);
            if (!csd_chat_truthy(csd_chat_eval(rt, test, ls))) continue;
        }
        items[count++] = cur;
    }
    bool none = true;
    for (size_t i = 0; i < count; i++) {
        csd_chat_step(rt, n->pos); /* an empty body still costs a step per iteration */
        csd_chat_val loop = csd_chat_v_obj(rt->arena, CSD_CHAT_V_OBJ);
        csd_chat_obj *lo = loop.u.obj;
        csd_chat_arena *a = rt->arena;
        csd_chat_obj_set(a, lo, "index", 5, csd_chat_v_int((double)i + 1));
        csd_chat_obj_set(a, lo, "index0", 6, csd_chat_v_int((double)i));
        csd_chat_obj_set(a, lo, "revindex", 8, csd_chat_v_int((double)(count - i)));
        csd_chat_obj_set(a, lo, "revindex0", 9, csd_chat_v_int((double)(count - i - 1)));
        csd_chat_obj_set(a, lo, "first", 5, csd_chat_v_bool(i == 0));
        csd_chat_obj_set(a, lo, "last", 4, csd_chat_v_bool(i == count - 1));
        csd_chat_obj_set(a, lo, "length", 6, csd_chat_v_int((double)count));
        csd_chat_obj_set(a, lo, "previtem", 8, i > 0 ? items[i - 1] : csd_chat_v_undef());
        csd_chat_obj_set(a, lo, "nextitem", 8, i + 1 < count ? items[i + 1] : csd_chat_v_undef());
        csd_chat_scope_set(rt, s, "loop", 4, loop);
        bind_loopvar(rt, n->a, s, items[i]);
        size_t mark = rt->out->len;
        int flow = exec_block(rt, n->list, n->nlist, s);
        if (flow != FLOW_NORMAL) {
            /* the reference drops the output of an interrupted iteration */
            rt->out->len = mark;
            if (rt->out->p) rt->out->p[mark] = '\0';
            if (flow == FLOW_BREAK) break;
            continue;
        }
        none = false;
    }
    if (none) {
        int flow = exec_block(rt, n->list2, n->nlist2, s);
        if (flow != FLOW_NORMAL) RAISE(rt, n->pos, "break/continue outside of a loop");
    }
}

static void exec_macro(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s) {
    csd_chat_func *f = csd_chat_arena_alloc(rt->arena, sizeof *f);
    f->kind = CSD_CHAT_FN_MACRO;
    f->macro = n;
    f->name = "macro";
    bool kw_param = false, va_param = false;
    for (size_t i = 0; i < n->nlist2; i++) {
        if (n->list2[i]->slen == 6 && memcmp(n->list2[i]->s, "kwargs", 6) == 0) kw_param = true;
        if (n->list2[i]->slen == 7 && memcmp(n->list2[i]->s, "varargs", 7) == 0) va_param = true;
    }
    f->uses_kwargs = !kw_param && (n->op & CSD_CHAT_MENTIONS_KWARGS);
    f->uses_varargs = !va_param && (n->op & CSD_CHAT_MENTIONS_VARARGS);
    csd_chat_val v = {.type = CSD_CHAT_V_FUNC};
    v.u.fn = f;
    csd_chat_scope_set(rt, s, n->s, n->slen, v);
}

static int exec_stmt(csd_chat_rt *rt, const csd_chat_node *n, csd_chat_scope *s) {
    switch (n->kind) {
    case CSD_CHAT_N_TEXT: csd_chat_buf_put(rt->out, n->s, n->slen); return FLOW_NORMAL;
    case CSD_CHAT_N_COMMENT: return FLOW_NORMAL;
    case CSD_CHAT_N_SET: exec_set(rt, n, s); return FLOW_NORMAL;
    case CSD_CHAT_N_IF: {
        bool t = csd_chat_truthy(csd_chat_eval(rt, n->a, s));
        return t ? exec_block(rt, n->list, n->nlist, s) : exec_block(rt, n->list2, n->nlist2, s);
    }
    case CSD_CHAT_N_FOR: exec_for(rt, n, s); return FLOW_NORMAL;
    case CSD_CHAT_N_MACRO: exec_macro(rt, n, s); return FLOW_NORMAL;
    case CSD_CHAT_N_BREAK: return FLOW_BREAK;
    case CSD_CHAT_N_CONTINUE: return FLOW_CONTINUE;
    case CSD_CHAT_N_FILTER_STMT: {
        csd_chat_val body = render_to_string(rt, n->list, n->nlist, s, n->pos);
        csd_chat_val v = csd_chat_apply_filter(rt, body, n->b, s);
        if (v.type != CSD_CHAT_V_NULL && v.type != CSD_CHAT_V_UNDEF)
            csd_chat_to_string(rt->out, v, n->pos);
        return FLOW_NORMAL;
    }
    default: {
        csd_chat_val v = csd_chat_eval(rt, n, s);
        if (v.type != CSD_CHAT_V_NULL && v.type != CSD_CHAT_V_UNDEF)
            csd_chat_to_string(rt->out, v, n->pos);
        return FLOW_NORMAL;
    }
    }
}

static int exec_block(csd_chat_rt *rt, csd_chat_node *const *list, size_t n, csd_chat_scope *s) {
    for (size_t i = 0; i < n; i++) {
        enter(rt, list[i]->pos);
        int flow = exec_stmt(rt, list[i], s);
        rt->depth--;
        if (flow != FLOW_NORMAL) return flow;
    }
    return FLOW_NORMAL;
}

void csd_chat_exec_program(csd_chat_rt *rt, const csd_chat_node *prog, csd_chat_scope *global) {
    int flow = exec_block(rt, prog->list, prog->nlist, global);
    if (flow != FLOW_NORMAL) RAISE(rt, CSD_CHAT_NOPOS, "break/continue outside of a loop");
}
