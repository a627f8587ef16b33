/* test_chat_parity: renders every template (the real Llama 3 and Qwen3 ones from ../shared, our
 * fixtures in tests/data/chat_templates/, our built-ins) with every conversation in
 * tests/data/chat_conversations.json, here and with @huggingface/jinja through node
 * (tools/ref/render_template_ref.mjs --batch), and requires byte-identical output, or an error on
 * both sides. Each conversation runs twice: the raw context through csd_chat_template_render, and
 * the OpenAI-messages path through csd_chat_template_apply (text parts joined). Skips, saying why,
 * when node or tools/ref/node_modules is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat/chat_template.h"
#include "core/alloc.h"
#include "test_util.h"

#define REF_DIR CSD_SOURCE_DIR "/tools/ref"
#define FIXED_NOW "2024-07-26T10:05:00"

/* The same instant as FIXED_NOW, for our side. */
static const struct tm NOW = {
    .tm_year = 2024 - 1900, .tm_mon = 6, .tm_mday = 26, .tm_hour = 10, .tm_min = 5};

typedef struct tmpl_spec {
    const char *name;
    const char *file;         /* fixture path, or NULL for shared/builtin */
    const char *shared;       /* tokenizer dir under ../shared/tokenizers, or NULL */
    const char *builtin;      /* builtin name, or NULL */
    const char *bos, *eos;
} tmpl_spec;

static const tmpl_spec SPECS[] = {
    {"llama3 (shared)", NULL, "llama3", NULL, "<|begin_of_text|>", "<|end_of_text|>"},
    {"qwen3 (shared)", NULL, "qwen3", NULL, NULL, "<|im_end|>"},
    {"qwen2.5 (fixture)", "qwen2.5.jinja", NULL, NULL, NULL, "<|im_end|>"},
    {"llama3.1 (fixture)", "llama3.1.jinja", NULL, NULL, "<|begin_of_text|>", "<|eot_id|>"},
    {"llama3.2 (fixture)", "llama3.2.jinja", NULL, NULL, "<|begin_of_text|>", "<|eot_id|>"},
    {"mistral-v0.1 (fixture)", "mistral-v0.1.jinja", NULL, NULL, "<s>", "</s>"},
    {"mistral-v0.3 (fixture)", "mistral-v0.3.jinja", NULL, NULL, "<s>", "</s>"},
    {"gemma (fixture)", "gemma.jinja", NULL, NULL, "<bos>", "<eos>"},
    {"chatml (builtin)", NULL, NULL, "chatml", NULL, "<|im_end|>"},
    {"llama3 (builtin)", NULL, NULL, "llama3", "<|begin_of_text|>", "<|eot_id|>"},
    {"llama2 (builtin)", NULL, NULL, "llama2", "<s>", "</s>"},
    {"mistral (builtin)", NULL, NULL, "mistral", "<s>", "</s>"},
    {"gemma (builtin)", NULL, NULL, "gemma", "<bos>", "<eos>"},
};
#define N_SPECS (sizeof SPECS / sizeof SPECS[0])

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* Template text (malloc'd), or NULL when its source is absent. */
static char *load_template(const tmpl_spec *s) {
    char path[1024];
    if (s->builtin) {
        const char *b = csd_chat_template_builtin(s->builtin);
        return b ? strdup(b) : NULL;
    }
    if (s->file) {
        snprintf(path, sizeof path, "%s/tests/data/chat_templates/%s", CSD_SOURCE_DIR, s->file);
        return read_file(path);
    }
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer_config.json", CSD_SHARED_DIR,
             s->shared);
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL);
    if (!cfg) return NULL;
    const char *t = json_string_value(json_object_get(cfg, "chat_template"));
    char *out = t ? strdup(t) : NULL;
    json_decref(cfg);
    return out;
}

/* The test's own joining of text-only content lists (what apply() is specified to do). */
static json_t *flatten(const json_t *messages) {
    json_t *copy = json_deep_copy(messages);
    size_t i, j;
    json_t *m, *part;
    json_array_foreach(copy, i, m) {
        json_t *c = json_object_get(m, "content");
        if (!json_is_array(c) || json_array_size(c) == 0) continue;
        char buf[4096] = "";
        bool all_text = true;
        json_array_foreach(c, j, part) {
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!type || strcmp(type, "text") != 0) all_text = false;
            else
                strncat(buf, json_string_value(json_object_get(part, "text")),
                        sizeof buf - strlen(buf) - 1);
        }
        if (all_text) json_object_set_new(m, "content", json_string(buf));
    }
    return copy;
}

static json_t *make_ctx(const tmpl_spec *s, const json_t *conv, bool flat) {
    json_t *ctx = json_object();
    json_t *msgs = json_object_get(conv, "messages");
    json_object_set_new(ctx, "messages", flat ? flatten(msgs) : json_deep_copy(msgs));
    json_object_set(ctx, "add_generation_prompt", json_object_get(conv, "add_generation_prompt"));
    if (s->bos) json_object_set_new(ctx, "bos_token", json_string(s->bos));
    if (s->eos) json_object_set_new(ctx, "eos_token", json_string(s->eos));
    if (json_object_get(conv, "tools"))
        json_object_set(ctx, "tools", json_object_get(conv, "tools"));
    json_t *extra = json_object_get(conv, "extra");
    if (extra) json_object_update(ctx, extra);
    return ctx;
}

static char *run_node(const char *cases_path) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && CSD_FIXED_NOW=%s node render_template_ref.mjs --batch '%s'", REF_DIR,
             FIXED_NOW, cases_path);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += k;
        if (cap - len >= 1024) continue;
        char *grown = realloc(buf, cap *= 2);
        if (!grown) free(buf);
        buf = grown;
    }
    if (!buf) {
        pclose(p);
        return NULL;
    }
    buf[len] = '\0';
    int st = pclose(p);
    if (st != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Runs the reference over cases and compares with ours ([ok, text, label] each); prints a
 * summary and up to 5 mismatches; returns the number of identical cases (fails on a node error). */
static size_t compare_with_ref(json_t *cases, json_t *ours, const char *what, size_t n_templates) {
    char tmp[] = "/tmp/csd_chat_parity_XXXXXX";
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(json_dump_file(cases, tmp, JSON_COMPACT), 0);
    char *ref_text = run_node(tmp);
    unlink(tmp);
    if (!ref_text) fail_msg("node render_template_ref.mjs failed");
    json_t *ref = json_loads(ref_text, 0, NULL);
    free(ref_text);
    assert_non_null(ref);
    assert_int_equal(json_array_size(ref), json_array_size(cases));

    size_t total = json_array_size(cases), same = 0, rendered = 0, shown = 0;
    for (size_t i = 0; i < total; i++) {
        json_t *r = json_array_get(ref, i), *o = json_array_get(ours, i);
        bool ref_ok = json_is_true(json_object_get(r, "ok"));
        bool our_ok = json_is_true(json_array_get(o, 0));
        const char *ro = ref_ok ? json_string_value(json_object_get(r, "out"))
                                : json_string_value(json_object_get(r, "error"));
        const char *oo = json_string_value(json_array_get(o, 1));
        bool eq = ref_ok == our_ok && (!ref_ok || strcmp(ro, oo) == 0);
        if (eq) {
            same++;
            rendered += ref_ok;
        } else if (shown++ < 5) {
            size_t at = 0;
            while (ro[at] && ro[at] == oo[at]) at++;
            printf(
                "MISMATCH %s (first difference at byte %zu)\n  ref %s: %.300s\n  our %s: %.300s\n",
                json_string_value(json_array_get(o, 2)), at, ref_ok ? "ok" : "error", ro,
                our_ok ? "ok" : "error", oo);
        }
    }
    printf(
        "chat template parity (%s): %zu/%zu identical (%zu templates; %zu rendered, "
        "%zu rejected by both)\n",
        what, same, total, n_templates, rendered, same - rendered);
    json_decref(ref);
    if (same != total)
        fail_msg("%zu of %zu %s cases differ from @huggingface/jinja", total - same, total, what);
    return same;
}


static bool have_reference(void) {
    if (system("command -v node > /dev/null 2>&1") != 0) {
        printf("SKIP: node is not installed\n");
        return false;
    }
    return true;
}

static void test_parity(void **state) {
    (void)state;
    if (!have_reference()) skip();
    CSD_REQUIRE_FILE(REF_DIR "/node_modules/@huggingface/jinja/package.json");
    json_t *convs = json_load_file(CSD_SOURCE_DIR "/tests/data/chat_conversations.json", 0, NULL);
    assert_non_null(convs);
    csd_chat_render_opts opts = {.now = &NOW};

    json_t *cases = json_array();
    json_t *ours = json_array();  /* [ok, text or error, label] per case */
    size_t n_templates = 0;
    for (size_t si = 0; si < N_SPECS; si++) {
        const tmpl_spec *s = &SPECS[si];
        char *src = load_template(s);
        if (!src) {
            printf("note: %s not available (../shared absent?), not compared\n", s->name);
            continue;
        }
        n_templates++;
        csd_chat_template *t = NULL;
        csd_err err = {0};
        if (csd_chat_template_create(&t, src, &err)) fail_msg("%s: %s", s->name, err.msg);
        size_t ci;
        json_t *conv;
        json_array_foreach(convs, ci, conv) {
            for (int flat = 0; flat < 2; flat++) {
                json_t *ctx = make_ctx(s, conv, flat);
                json_t *c = json_object();
                json_object_set_new(c, "template", json_string(src));
                json_object_set_new(c, "context", ctx);
                json_array_append_new(cases, c);
                char *out = NULL;
                int rc;
                if (!flat) {
                    rc = csd_chat_template_render_opts(t, ctx, &opts, &out, &err);
                } else {
                    csd_chat_apply_params p = {.messages = json_object_get(conv, "messages"),
                                               .tools = json_object_get(conv, "tools"),
                                               .add_generation_prompt = json_is_true(
                                                   json_object_get(conv, "add_generation_prompt")),
                                               .bos_token = s->bos,
                                               .eos_token = s->eos,
                                               .extra = json_object_get(conv, "extra"),
                                               .opts = &opts};
                    rc = csd_chat_template_apply(t, &p, &out, &err);
                }
                char label[256];
                snprintf(label, sizeof label, "%s / %s / %s", s->name,
                         json_string_value(json_object_get(conv, "name")),
                         flat ? "apply" : "render");
                json_array_append_new(
                    ours, json_pack("[b, s, s]", rc == 0, rc == 0 ? out : err.msg, label));
                csd_free(out);
            }
        }
        csd_chat_template_destroy(t);
        free(src);
    }

    size_t same = compare_with_ref(cases, ours, "conversations", n_templates);
    json_decref(cases);
    json_decref(ours);
    json_decref(convs);
    (void)same;
}

/* Groups of small templates sharing one context: features, generated expressions, token soup,
 * libFuzzer finds, mutated real templates (tests/data/chat_template_snippets.json). */
static void test_snippets(void **state) {
    (void)state;
    if (!have_reference()) skip();
    CSD_REQUIRE_FILE(REF_DIR "/node_modules/@huggingface/jinja/package.json");
    json_t *doc = json_load_file(CSD_SOURCE_DIR "/tests/data/chat_template_snippets.json", 0, NULL);
    assert_non_null(doc);
    json_t *cases = json_array(), *ours = json_array();
    csd_chat_render_opts opts = {.now = &NOW};
    size_t gi, i;
    json_t *g, *tv;
    json_array_foreach(json_object_get(doc, "groups"), gi, g) {
        json_t *ctx = json_object_get(g, "context");
        json_array_foreach(json_object_get(g, "templates"), i, tv) {
            json_array_append_new(cases, json_pack("{s:O, s:O}", "template", tv, "context", ctx));
            csd_chat_template *t = NULL;
            csd_err err = {0};
            char *out = NULL;
            int rc = csd_chat_template_create(&t, json_string_value(tv), &err);
            if (rc == 0) rc = csd_chat_template_render_opts(t, ctx, &opts, &out, &err);
            char label[128];
            snprintf(label, sizeof label, "%s #%zu", json_string_value(json_object_get(g, "name")),
                     i);
            json_array_append_new(ours,
                                  json_pack("[b, s, s]", rc == 0, rc == 0 ? out : err.msg, label));
            csd_free(out);
            csd_chat_template_destroy(t);
        }
    }
    compare_with_ref(cases, ours, "snippets", json_array_size(cases));
    json_decref(cases);
    json_decref(ours);
    json_decref(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_parity),
                                       cmocka_unit_test(test_snippets)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
