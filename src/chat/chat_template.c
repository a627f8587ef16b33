/* chat_template: public entry points of the chat-template engine: compile once, render many times.
 * Each call sets up one csd_chat_fail jump target and one arena; any error inside the lexer,
 * parser or interpreter unwinds here, the arena is freed and a CSD_E* code is returned.
 * Message validation for the OpenAI-style convenience lives here too. */
#include "chat/chat_template.h"

#include <string.h>

#include "chat/tmpl_internal.h"
#include "core/alloc.h"
#include "core/clock.h"

struct csd_chat_template {
    csd_chat_fail fail;       /* only used while parsing */
    csd_chat_arena arena;     /* owns src copy, tokens and AST */
    const char *src;
    csd_chat_node *prog;
};

/* Bytes the parser may allocate: generous for real templates, bounded for hostile ones. */
static size_t parse_budget(size_t len) { return ((size_t)64 << 20) + len * 64; }

static int do_parse(csd_chat_template *t, const char *src, size_t len) {
    if (setjmp(t->fail.jb)) return t->fail.code;
    t->src = csd_chat_arena_strndup(&t->arena, src, len);
    t->fail.src = t->src;
    csd_chat_tok *toks;
    size_t n;
    csd_chat_lex(&t->arena, t->src, len, &toks, &n);
    t->prog = csd_chat_parse(&t->arena, toks, n);
    return 0;
}

int csd_chat_template_create(csd_chat_template **out, const char *src, csd_err *err) {
    if (!out || !src) return csd_err_set(err, CSD_EINVAL, "chat template: NULL argument");
    *out = NULL;
    size_t len = strlen(src);
    if (len > CSD_CHAT_MAX_TEMPLATE)
        return csd_err_set(err, CSD_ERANGE, "chat template: %zu bytes exceeds the limit of %u", len,
                           CSD_CHAT_MAX_TEMPLATE);
    csd_chat_template *t = csd_alloc(sizeof *t);
    if (!t) return csd_err_set(err, CSD_ENOMEM, "chat template: out of memory");
    t->fail.err = err;
    t->fail.what = "chat template syntax error";
    t->fail.src = NULL;
    csd_chat_arena_init(&t->arena, parse_budget(len), &t->fail);
    int rc = do_parse(t, src, len);
    if (rc != 0) {
        csd_chat_template_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void csd_chat_template_destroy(csd_chat_template *t) {
    if (!t) return;
    csd_chat_arena_fini(&t->arena);
    csd_free(t);
}

/* Everything one render owns; kept off the stack frame that calls setjmp. */
typedef struct render_state {
    csd_chat_fail fail;
    csd_chat_arena arena;
    csd_chat_rt rt;
    csd_chat_buf out;
    char *result;
} render_state;

static void add_global(csd_chat_rt *rt, csd_chat_scope *g, const char *name, csd_chat_val v) {
    csd_chat_scope_set(rt, g, name, strlen(name), v);
}

static csd_chat_val global_fn(csd_chat_rt *rt, int kind, const char *name) {
    csd_chat_func *f = csd_chat_arena_alloc(rt->arena, sizeof *f);
    f->kind = kind;
    f->name = name;
    csd_chat_val v = {.type = CSD_CHAT_V_FUNC};
    v.u.fn = f;
    return v;
}

static int do_render(render_state *st, const csd_chat_template *t, const json_t *ctx) {
    if (setjmp(st->fail.jb)) return st->fail.code;
    csd_chat_rt *rt = &st->rt;
    csd_chat_scope *g = csd_chat_arena_alloc(&st->arena, sizeof *g);
    add_global(rt, g, "namespace", global_fn(rt, CSD_CHAT_FN_NAMESPACE, "namespace"));
    add_global(rt, g, "false", csd_chat_v_bool(false));
    add_global(rt, g, "true", csd_chat_v_bool(true));
    add_global(rt, g, "none", csd_chat_v_null());
    add_global(rt, g, "raise_exception", global_fn(rt, CSD_CHAT_FN_RAISE, "raise_exception"));
    add_global(rt, g, "range", global_fn(rt, CSD_CHAT_FN_RANGE, "range"));
    add_global(rt, g, "strftime_now", global_fn(rt, CSD_CHAT_FN_STRFTIME, "strftime_now"));
    add_global(rt, g, "True", csd_chat_v_bool(true));
    add_global(rt, g, "False", csd_chat_v_bool(false));
    add_global(rt, g, "None", csd_chat_v_null());
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)ctx, k, v) {
        size_t kn = strlen(k);
        if (csd_chat_obj_get(&g->vars, k, kn))
            csd_chat_raise(&st->fail, CSD_EINVAL, CSD_CHAT_NOPOS,
                           "context variable '%s' clashes with a built-in name", k);
        csd_chat_scope_set(rt, g, csd_chat_arena_strndup(&st->arena, k, kn), kn,
                           csd_chat_from_json(&st->arena, v, 0));
    }
    csd_chat_exec_program(rt, t->prog, g);
    st->result = csd_alloc(st->out.len + 1);
    if (!st->result) csd_chat_raise(&st->fail, CSD_ENOMEM, CSD_CHAT_NOPOS, "out of memory");
    if (st->out.len) memcpy(st->result, st->out.p, st->out.len);
    st->result[st->out.len] = '\0';
    return 0;
}

int csd_chat_template_render_opts(const csd_chat_template *t, const json_t *ctx,
                                  const csd_chat_render_opts *opts, char **out, csd_err *err) {
    if (!t || !out) return csd_err_set(err, CSD_EINVAL, "chat template render: NULL argument");
    *out = NULL;
    if (ctx && !json_is_object(ctx))
        return csd_err_set(err, CSD_EINVAL, "chat template render: context must be a JSON object");
    render_state *st = csd_alloc(sizeof *st);
    if (!st) return csd_err_set(err, CSD_ENOMEM, "chat template render: out of memory");
    csd_chat_render_opts o = {0};
    if (opts) o = *opts;
    st->fail.err = err;
    st->fail.what = "chat template render error";
    st->fail.src = t->src;
    csd_chat_arena_init(&st->arena, o.max_memory ? o.max_memory : CSD_CHAT_DEFAULT_MAX_MEMORY,
                        &st->fail);
    st->rt.arena = &st->arena;
    st->rt.fail = &st->fail;
    st->rt.max_str = o.max_output ? o.max_output : CSD_CHAT_DEFAULT_MAX_OUTPUT;
    st->rt.max_steps = o.max_steps ? o.max_steps : CSD_CHAT_DEFAULT_MAX_STEPS;
    st->rt.max_ms = o.max_ms ? o.max_ms : CSD_CHAT_DEFAULT_MAX_MS;
    st->rt.deadline_ns = csd_now_ns() + st->rt.max_ms * 1000000ull;
    st->rt.now = o.now;
    csd_chat_buf_init(&st->out, &st->arena, st->rt.max_str);
    st->rt.out = &st->out;
    json_t *empty = NULL;
    if (!ctx) ctx = empty = json_object();
    int rc = ctx ? do_render(st, t, ctx) : csd_err_set(err, CSD_ENOMEM, "out of memory");
    json_decref(empty);
    if (rc == 0) *out = st->result;
    else csd_free(st->result);
    csd_chat_arena_fini(&st->arena);
    csd_free(st);
    return rc;
}

int csd_chat_template_render(const csd_chat_template *t, const json_t *ctx, char **out,
                             csd_err *err) {
    return csd_chat_template_render_opts(t, ctx, NULL, out, err);
}

/* ---- messages ---- */

int csd_chat_messages_validate(const json_t *messages, csd_err *err) {
    if (!json_is_array(messages))
        return csd_err_set(err, CSD_EINVAL, "messages: expected an array");
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m))
            return csd_err_set(err, CSD_EINVAL, "messages[%zu]: expected an object", i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role))
            return csd_err_set(err, CSD_EINVAL, "messages[%zu].role: expected a string", i);
        json_t *c = json_object_get(m, "content");
        if (c && !json_is_string(c) && !json_is_null(c) && !json_is_array(c))
            return csd_err_set(err, CSD_EINVAL,
                               "messages[%zu].content: expected a string, null or a list of parts",
                               i);
        if (json_is_array(c)) {
            size_t j;
            json_t *part;
            json_array_foreach(c, j, part) {
                json_t *type = json_object_get(part, "type");
                if (!json_is_object(part) || !json_is_string(type))
                    return csd_err_set(err, CSD_EINVAL,
                                       "messages[%zu].content[%zu]: expected {type, ...}", i, j);
                if (strcmp(json_string_value(type), "text") == 0 &&
                    !json_is_string(json_object_get(part, "text")))
                    return csd_err_set(err, CSD_EINVAL,
                                       "messages[%zu].content[%zu].text: expected a string", i, j);
            }
        }
        json_t *tc = json_object_get(m, "tool_calls");
        if (tc && !json_is_null(tc)) {
            if (!json_is_array(tc))
                return csd_err_set(err, CSD_EINVAL, "messages[%zu].tool_calls: expected an array",
                                   i);
            size_t j;
            json_t *call;
            json_array_foreach(tc, j, call) {
                if (!json_is_object(call))
                    return csd_err_set(err, CSD_EINVAL,
                                       "messages[%zu].tool_calls[%zu]: expected an object", i, j);
            }
        }
    }
    return 0;
}

/* Copy of messages where every content list holding only text parts becomes one string. */
static json_t *flatten_parts(const json_t *messages) {
    json_t *copy = json_deep_copy(messages);
    if (!copy) return NULL;
    size_t i;
    json_t *m;
    json_array_foreach(copy, i, m) {
        json_t *c = json_object_get(m, "content");
        if (!json_is_array(c) || json_array_size(c) == 0) continue;
        bool all_text = true;
        size_t total = 0, j;
        json_t *part;
        json_array_foreach(c, j, part) {
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!type || strcmp(type, "text") != 0) all_text = false;
            else total += json_string_length(json_object_get(part, "text"));
        }
        if (!all_text) continue;
        char *joined = csd_alloc(total + 1);
        if (!joined) {
            json_decref(copy);
            return NULL;
        }
        size_t at = 0;
        json_array_foreach(c, j, part) {
            json_t *text = json_object_get(part, "text");
            memcpy(joined + at, json_string_value(text), json_string_length(text));
            at += json_string_length(text);
        }
        int bad = json_object_set_new(m, "content", json_stringn(joined, at));
        csd_free(joined);
        if (bad) {
            json_decref(copy);
            return NULL;
        }
    }
    return copy;
}

int csd_chat_template_apply(const csd_chat_template *t, const csd_chat_apply_params *p, char **out,
                            csd_err *err) {
    if (!t || !p || !out) return csd_err_set(err, CSD_EINVAL, "chat template apply: NULL argument");
    *out = NULL;
    int rc = csd_chat_messages_validate(p->messages, err);
    if (rc) return rc;
    if (p->tools && !json_is_array(p->tools) && !json_is_null(p->tools))
        return csd_err_set(err, CSD_EINVAL, "tools: expected an array");
    if (p->extra && !json_is_object(p->extra))
        return csd_err_set(err, CSD_EINVAL, "extra template variables: expected an object");
    json_t *ctx = json_object();
    json_t *msgs =
        p->keep_content_parts ? json_incref((json_t *)p->messages) : flatten_parts(p->messages);
    if (!ctx || !msgs) {
        json_decref(ctx);
        json_decref(msgs);
        return csd_err_set(err, CSD_ENOMEM, "out of memory");
    }
    int bad = json_object_set_new(ctx, "messages", msgs);
    bad |=
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(p->add_generation_prompt));
    if (p->bos_token) bad |= json_object_set_new(ctx, "bos_token", json_string(p->bos_token));
    if (p->eos_token) bad |= json_object_set_new(ctx, "eos_token", json_string(p->eos_token));
    if (p->tools) bad |= json_object_set(ctx, "tools", (json_t *)p->tools);
    if (p->extra) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)p->extra, k, v) bad |= json_object_set(ctx, k, v);
    }
    if (bad) {
        json_decref(ctx);
        return csd_err_set(err, CSD_EINVAL, "chat template apply: cannot build the context "
                                            "(bos/eos not valid UTF-8?)");
    }
    rc = csd_chat_template_render_opts(t, ctx, p->opts, out, err);
    json_decref(ctx);
    return rc;
}
