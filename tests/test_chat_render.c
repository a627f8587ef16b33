/* test_chat_render: unit tests of the chat-template engine with hand-checked expected strings:
 * syntax features, filters, tests, operators, errors with line/column, raise_exception, the depth,
 * step, output and memory limits, built-in templates and the OpenAI-messages convenience. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_template.h"
#include "core/alloc.h"
#include "test_util.h"

/* Renders tpl with the JSON context ctx; returns the rc, *out owned by the caller. */
static int render_opts(const char *tpl, const char *ctx, const csd_chat_render_opts *o, char **out,
                       csd_err *err) {
    csd_chat_template *t = NULL;
    *out = NULL;
    int rc = csd_chat_template_create(&t, tpl, err);
    if (rc) return rc;
    json_error_t je;
    json_t *j = json_loads(ctx ? ctx : "{}", 0, &je);
    assert_non_null(j);
    rc = csd_chat_template_render_opts(t, j, o, out, err);
    json_decref(j);
    csd_chat_template_destroy(t);
    return rc;
}

static void expect_render(const char *tpl, const char *ctx, const char *want) {
    char *out = NULL;
    csd_err err = {0};
    int rc = render_opts(tpl, ctx, NULL, &out, &err);
    if (rc) fail_msg("render of %s failed: %s", tpl, err.msg);
    if (strcmp(out, want) != 0) fail_msg("template %s\n  got:  [%s]\n  want: [%s]", tpl, out, want);
    csd_free(out);
}

/* Expects failure with code and a message containing each given fragment. */
static void expect_error(const char *tpl, const char *ctx, int code, const char *frag1,
                         const char *frag2) {
    char *out = NULL;
    csd_err err = {0};
    int rc = render_opts(tpl, ctx, NULL, &out, &err);
    if (rc == 0) fail_msg("template %s rendered [%s], expected an error", tpl, out);
    assert_null(out);
    if (rc != code)
        fail_msg("template %s: code %s, want %s (%s)", tpl, csd_err_name(rc), csd_err_name(code),
                 err.msg);
    if (frag1 && !strstr(err.msg, frag1)) fail_msg("error [%s] lacks [%s]", err.msg, frag1);
    if (frag2 && !strstr(err.msg, frag2)) fail_msg("error [%s] lacks [%s]", err.msg, frag2);
}

static const char *CTX =
    "{\"name\": \"world\", \"xs\": [1, 2, 3], \"d\": {\"k\": \"v\", \"n\": 1},"
    " \"objs\": [{\"t\": \"x\", \"n\": 1}, {\"t\": \"y\", \"n\": 2}, {\"t\": \"x\", \"n\": 3}],"
    " \"e\": \"\", \"nul\": null}";

static void test_expressions(void **state) {
    (void)state;
    expect_render("Hello {{ name }}!", CTX, "Hello world!");
    expect_render("{{ 1 + 2 }} {{ 1.5 + 1 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}",
                  NULL, "3 2.5 3.5 3 1 1024");
    expect_render("{{ -3 }} {{ 1.0 }} {{ 10 / 5 }} {{ 0.1 + 0.2 }} {{ 1 - 4 }} {{ 3 * 1.5 }}", NULL,
                  "-3 1.0 2.0 0.30000000000000004 -3 4.5");
    expect_render("{{ 'a' ~ 1 ~ true ~ 1.5 }} {{ 'x' + 1 }} {{ [1, 2] + [3] }}", NULL,
                  "a1true1.5 x1 [1, 2, 3]");
    expect_render(
        "{{ 'a' in 'abc' }} {{ 1 in xs }} {{ 'k' in d }} {{ 5 not in xs }} {{ 'q' in nope }}", CTX,
        "true true true true false");
    expect_render(
        "{{ 1 == 1.0 }} {{ '1' == 1 }} {{ nul == nope }} {{ 1 != 2 }} {{ 2 < 3 }} {{ 2 > 3 }}", CTX,
        "true true true true true false");
    expect_render("{{ true and 'x' }} {{ false or 'y' }} {{ not e }} {{ e or 'empty' }}", CTX,
                  "x y true empty");
    expect_render("{{ 'x' if false else 'y' }}[{{ 'z' if false }}]", NULL, "y[]");
    expect_render("{{ nope }}[{{ nope.attr.deeper }}][{{ nul }}]", CTX, "[][]");
    expect_render("{{ 'a\\n\\t\\'\\\"\\\\b' }}|{{ \"\\x41\\u00e9\" }}|{{ 'ab' 'cd' }}", NULL,
                  "a\n\t'\"\\b|A\xc3\xa9|abcd");
    expect_render("{{ [1, 'a', none, true, 1.5, {'a': [1]}] }}", NULL,
                  "[1, \"a\", null, true, 1.5, {\"a\": [1]}]");
    expect_render("{{ d }} {{ d['k'] }} {{ d.n }} {{ xs[0] }} {{ xs[-1] }} {{ xs.1 }}", CTX,
                  "{\"k\": \"v\", \"n\": 1} v 1 1 3 2");
}

static void test_whitespace(void **state) {
    (void)state;
    /* trim_blocks + lstrip_blocks, as HF configures the reference */
    expect_render("  {% if true %}\n  yes\n  {% endif %}\n  after\n", NULL, "  yes\n  after");
    expect_render("{{- '  a  ' -}}  {{ 'b' }}  {#- c -#}  d", NULL, "  a  bd");
    expect_render("a\n{%- if true -%}\n  b  \n{%- endif %}\nc", NULL, "abc");
    expect_render("x {# comment #} y", NULL, "x  y");
    expect_render("{% for i in xs %}\n{{ i }}\n{% endfor %}\n", CTX, "1\n2\n3\n");
    /* transformers' {% generation %} markers are dropped */
    expect_render("A{% generation %}B{% endgeneration %}C", NULL, "ABC");
}

static void test_statements(void **state) {
    (void)state;
    expect_render(
        "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}"
        "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %} {% endfor %}",
        CTX, "1/0/3/3F 2/1/2/3 3/2/1/3L ");
    expect_render(
        "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}"
        "{% endfor %}",
        CTX, "k=v;n=1;kn");
    expect_render("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
    expect_render("{% for x in xs if x != 2 %}{{ x }}{% endfor %}", CTX, "13");
    expect_render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}|"
                  "{% for x in xs %}{{ x }}{% if x == 2 %}{% break %}{% endif %}{% endfor %}",
                  CTX, "13|1");
    expect_render("{% if 0 %}a{% elif e %}b{% elif xs %}c{% else %}d{% endif %}", CTX, "c");
    expect_render(
        "{% set ns = namespace(a=1, b='x') %}{% for x in xs %}{% set ns.a = ns.a + x %}{% endfor %}"
        "{{ ns.a }}{{ ns.b }}",
        CTX, "7x");
    expect_render("{% set x = 1 %}{% for i in xs %}{% set x = i %}{% endfor %}{{ x }}", CTX, "1");
    expect_render(
        "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set blk %}in {{ a }}{% endset %}[{{ blk }}]", NULL,
        "12[in 1]");
    expect_render(
        "{% macro f(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, b=3) }}"
        " {{ f('z', 9) }}",
        NULL, "1-2 1-3 z-9");
    expect_render(
        "{% macro g() %}{{ varargs | length }}{{ kwargs.k }}{% endmacro %}{{ g(1, 2, k='v') }}",
        NULL, "2v");
    expect_render("{% filter upper %}abc{{ 1 }}{% endfilter %}", NULL, "ABC1");
}

static void test_filters(void **state) {
    (void)state;
    expect_render(
        "[{{ '  a b  ' | trim }}] {{ 'aB' | upper }} {{ 'aB' | lower }}"
        " {{ 'hi there' | capitalize }}",
        NULL, "[a b] AB ab Hi there");
    expect_render(
        "{{ xs | length }} {{ 'h\xc3\xa9llo' | length }} {{ d | length }} {{ xs | first }}"
        " {{ xs | last }}",
        CTX, "3 5 2 1 3");
    expect_render("{{ xs | join('-') }} {{ xs | join }} {{ 'abc' | join(',') }}", CTX,
                  "1-2-3 123 a,b,c");
    expect_render("{{ d | tojson }} {{ 'caf\xc3\xa9 \"q\"' | tojson }} {{ nope | tojson }}", CTX,
                  "{\"k\": \"v\", \"n\": 1} \"caf\xc3\xa9 \\\"q\\\"\" null");
    expect_render("{{ d | tojson(indent=2) }}", CTX, "{\n  \"k\": \"v\",\n  \"n\": 1\n}");
    expect_render("{{ [1, [2]] | tojson(indent=2) }}", NULL, "[\n  1,\n  [\n    2\n  ]\n]");
    expect_render(
        "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"
        " {{ '\xc3\xa9' | tojson(ensure_ascii=true) }}",
        NULL, "{\"a\": 2, \"b\": 1} \"\\u00e9\"");
    expect_render("{{ 3 | string }} {{ 3.0 | string }} {{ true | string }} {{ xs | string }}", CTX,
                  "3 3.0 true [1, 2, 3]");
    expect_render(
        "{{ '12abc' | int }} {{ 'x' | int }} {{ 3.7 | int }} {{ '3.5' | float }}"
        " {{ 'z' | int(7) }}",
        NULL, "12 0 3 3.5 7");
    expect_render(
        "{{ 'aaa' | replace('a', 'b') }} {{ nope | default('dflt') }} {{ e | default('e', true) }}"
        "{{ e | default('unused') }}",
        CTX, "bbb dflt e");
    expect_render("{{ d | items }} {{ xs | list }} {{ '<b>' | safe }} {{ xs | reverse | list }}",
                  CTX, "[[\"k\", \"v\"], [\"n\", 1]] [1, 2, 3] <b> [3, 2, 1]");
    expect_render("{{ objs | selectattr('t', 'equalto', 'x') | map(attribute='n') | join(',') }} "
                  "{{ objs | rejectattr('t', 'equalto', 'x') | map(attribute='n') | join(',') }} "
                  "{{ objs | selectattr('n') | list | length }}", CTX, "1,3 2 3");
    expect_render(
        "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [1, 2] | sort(reverse=true) }}",
        NULL, "[1, 2, 3] [\"A\", \"b\", \"c\"] [2, 1]");
    expect_render("{{ 'a\nb\n\nc' | indent(2) }}|{{ -5 | abs }}|{{ [1, 1, 2] | unique | list }}",
                  NULL, "a\n  b\n\n  c|5|[1, 2]");
}

static void test_tests(void **state) {
    (void)state;
    expect_render(
        "{{ name is defined }} {{ nope is defined }} {{ nope is undefined }} {{ nul is none }}"
        " {{ name is not none }}",
        CTX, "true false true true true");
    expect_render("{{ name is string }} {{ xs is string }} {{ d is mapping }} {{ xs is mapping }}",
                  CTX, "true false true false");
    expect_render(
        "{{ xs is iterable }} {{ name is iterable }} {{ d is iterable }} {{ xs is sequence }}", CTX,
        "true true false true");
    expect_render("{{ 1 is number }} {{ 1.5 is number }} {{ '1' is number }} {{ 1 is integer }}",
                  NULL, "true true false true");
    expect_render(
        "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ 3 is odd }}"
        " {{ 'ab' is lower }}",
        NULL, "true false true false true true");
}

static void test_strings_and_slices(void **state) {
    (void)state;
    expect_render("[{{ ' x '.strip() }}][{{ ' x '.lstrip() }}][{{ ' x '.rstrip() }}]", NULL,
                  "[x][x ][ x]");
    expect_render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }}",
                  NULL, "[\"a\", \"b\", \"\", \"c\"] [\"a\", \"b\"] [\"a\", \"b c\"]");
    expect_render(
        "{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.startswith('b') }}",
        NULL, "true true false");
    expect_render(
        "{{ 'Hi'.upper() }} {{ 'Hi'.lower() }} {{ 'aaa'.replace('a', 'b', 2) }}"
        " {{ 'hello world'.title() }}",
        NULL, "HI hi bba Hello World");
    expect_render("{{ '\xc3\xa9t\xc3\xa9'.upper() }} {{ 'stra\xc3\x9f' | upper }}", NULL,
                  "\xc3\x89T\xc3\x89 STRASS");
    expect_render(
        "{{ d.get('k') }} {{ d.get('zz', 'def') }} {{ d.get('zz') }} {{ d.keys() }}"
        " {{ d.values() }}",
        CTX, "v def  [\"k\", \"n\"] [\"v\", 1]");
    expect_render(
        "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:2] }} {{ xs[::2] }} {{ 'hello'[1:3] }}"
        " {{ 'h\xc3\xa9llo'[::-1] }}",
        CTX, "[3, 2, 1] [2, 3] [1, 2] [1, 3] el oll\xc3\xa9h");
    expect_render("{{ 'x</think>y'.split('</think>')[-1] }} {{ 'abc'[-1] }} {{ xs.length }}", CTX,
                  "y c 3");
}

static void test_strftime_fixed(void **state) {
    (void)state;
    struct tm now = {0};
    now.tm_year = 2024 - 1900;
    now.tm_mon = 8;
    now.tm_mday = 5;
    now.tm_hour = 7;
    now.tm_min = 3;
    csd_chat_render_opts o = {.now = &now};
    char *out = NULL;
    csd_err err = {0};
    assert_int_equal(
        render_opts("{{ strftime_now('%d %b %Y|%B|%H:%M|%m|%%|%q') }}", NULL, &o, &out, &err), 0);
    assert_string_equal(out, "05 Sep 2024|September|07:03|09|%|%q");
    csd_free(out);
}

static void test_syntax_errors(void **state) {
    (void)state;
    expect_error("ok\n{% if %}", NULL, CSD_EFORMAT, "line 2, column 7", "expected an expression");
    expect_error("{{ x + }}", NULL, CSD_EFORMAT, "line 1, column 8", NULL);
    expect_error("line1\nline2 {% for x in xs %}", NULL, CSD_EFORMAT, "missing {% endfor %}",
                 "line 2");
    expect_error("{{ 'unterminated }}", NULL, CSD_EFORMAT, "line 1, column 4", "unterminated");
    expect_error("{% frobnicate %}", NULL, CSD_EFORMAT, "unknown", "line 1, column 4");
    expect_error("{{ a ! b }}", NULL, CSD_EFORMAT, "unexpected character: !", "column 6");
    expect_error("{# never closed", NULL, CSD_EFORMAT, "missing end of comment", NULL);
    expect_error("{{ '\\q' }}", NULL, CSD_EFORMAT, "escaped character", NULL);
    expect_error("{% if x %}a{% endfor %}", NULL, CSD_EFORMAT,
                 "expected {% endif %} (found 'endfor')", "column 15");
}

static void test_runtime_errors(void **state) {
    (void)state;
    expect_error("a\n  {{ raise_exception('Roles must alternate!') }}", NULL, CSD_EINVAL,
                 "raise_exception: Roles must alternate!", "line 2, column 6");
    expect_error("{{ nope + 1 }}", NULL, CSD_EINVAL, "undefined", "line 1, column 9");
    expect_error("{{ nul + 1 }}", CTX, CSD_EINVAL, "null", NULL);
    expect_error("{{ xs | trim }}", CTX, CSD_EINVAL, "unknown ArrayValue filter: trim", NULL);
    expect_error("{{ name() }}", CTX, CSD_EINVAL, "not a function", NULL);
    expect_error("{% for c in name %}{% endfor %}", CTX, CSD_EINVAL, "expected iterable", NULL);
    expect_error("{{ x is frob }}", NULL, CSD_EINVAL, "unknown test: frob", NULL);
    expect_error("{% break %}", NULL, CSD_EINVAL, "outside of a loop", NULL);
    expect_error("{{ d[1] }}", CTX, CSD_EINVAL, "non-string", NULL);
    /* context names may not shadow the built-ins */
    expect_error("x", "{\"range\": 1}", CSD_EINVAL, "clashes", NULL);
}

static char *repeat(const char *a, int n, const char *mid, const char *b) {
    size_t la = strlen(a), lb = strlen(b), lm = strlen(mid);
    char *s = malloc(la * (size_t)n + lm + lb * (size_t)n + 1);
    char *p = s;
    for (int i = 0; i < n; i++, p += la) memcpy(p, a, la);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < n; i++, p += lb) memcpy(p, b, lb);
    *p = '\0';
    return s;
}

/* Context objects keep JS property order (integer-like keys ascending, then the rest as given),
 * also when large: n integer keys given in descending order interleaved with n named ones. */
static void test_context_object_order(void **state) {
    (void)state;
    expect_render("{% for k, v in o.items() %}{{ k }}={{ v }};{% endfor %}",
                  "{\"o\": {\"b\": 1, \"10\": 2, \"a\": 3, \"3\": 4, \"03\": 5, \"0\": 6}}",
                  "0=6;3=4;10=2;b=1;a=3;03=5;");
    enum { N = 3000 };
    size_t cap = 64 + 32 * (size_t)N;
    char *ctx = malloc(cap), *want = malloc(cap);
    assert_non_null(ctx);
    assert_non_null(want);
    size_t c = (size_t)snprintf(ctx, cap, "{\"o\": {"), w = 0;
    for (int i = N - 1; i >= 0; i--)
        c += (size_t)snprintf(ctx + c, cap - c, "%s\"%d\": %d, \"k%d\": %d", i < N - 1 ? ", " : "",
                              i, i, i, -i);
    snprintf(ctx + c, cap - c, "}}");
    for (int i = 0; i < N; i++) w += (size_t)snprintf(want + w, cap - w, "%d:%d,", i, i);
    for (int i = N - 1; i >= 0; i--) w += (size_t)snprintf(want + w, cap - w, "k%d:%d,", i, -i);
    expect_render("{% for k, v in o.items() %}{{ k }}:{{ v }},{% endfor %}", ctx, want);
    expect_render("{{ o['k7'] }} {{ o['7'] }} {{ o | length }}", ctx, "-7 7 6000");
    free(ctx);
    free(want);
}

/* The time budget stops what the step budget cannot see: here a million `|length` of an 8 MB
 * string, five steps each (about an hour and a half of scanning without the time budget). */
static void test_time_budget(void **state) {
    (void)state;
    char *out = NULL;
    csd_err err = {0};
    csd_chat_render_opts o = {.max_ms = 300};
    assert_int_equal(render_opts("{% set ns = namespace(s='ab') %}{% for i in range(22) %}"
                                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                                 "{% for i in range(1000000) %}{% if ns.s | length %}{% endif %}"
                                 "{% endfor %}",
                                 NULL, &o, &out, &err),
                     CSD_ERANGE);
    assert_non_null(strstr(err.msg, "time budget of 300 ms"));
}

/* A {% macro %} statement costs a step, not a walk of its body: a 420 KB body defined 100,000
 * times renders well within the time budget (looking for `kwargs` in the body at each definition
 * took about 30 s). Whether a body reads kwargs or varargs is found while it is parsed, nested
 * macros included; a macro declares at most 255 parameters. */
static void test_macro_definition_cost(void **state) {
    (void)state;
    char *body = repeat("{{ a }}", 60000, "", "");
    size_t cap = strlen(body) + 256;
    char *tpl = malloc(cap);
    snprintf(tpl, cap,
             "{%% for i in range(100000) %%}{%% macro m(a) %%}%s{%% endmacro %%}"
             "{%% if loop.last %%}{{ m('x') | length }}{%% endif %%}{%% endfor %%}",
             body);
    csd_chat_render_opts o = {.max_ms = 10000};
    char *out = NULL;
    csd_err err = {0};
    if (render_opts(tpl, NULL, &o, &out, &err)) fail_msg("%s", err.msg);
    assert_string_equal(out, "60000");
    csd_free(out);
    free(tpl);
    free(body);
    expect_render("{% macro outer() %}{% macro inner() %}{{ kwargs.k }}{{ varargs | length }}"
                  "{% endmacro %}{{ inner(1, k=2) }}{% endmacro %}{{ outer() }}",
                  NULL, "21");
    expect_error("{% macro f() %}{{ kwargs }}{% endmacro %}{{ f(1) }}", NULL, CSD_EINVAL, NULL,
                 NULL);
    /* a name that is not read (a macro's, a keyword argument's, a test's) is no use of them */
    expect_error("{% macro m() %}{% macro kwargs() %}{% endmacro %}M{% endmacro %}{{ m(a=1) }}",
                 NULL, CSD_EINVAL, "macro 'm' takes no keyword argument 'a'", NULL);
    expect_error("{% macro m() %}{{ g(kwargs=1) }}{% endmacro %}{% macro g() %}G{% endmacro %}"
                 "{{ m(a=1) }}",
                 NULL, CSD_EINVAL, "macro 'm' takes no keyword argument 'a'", NULL);
    expect_error("{% macro m() %}{{ g(varargs=1) }}{% endmacro %}{% macro g() %}G{% endmacro %}"
                 "{{ m(1) }}",
                 NULL, CSD_EINVAL, "macro 'm' takes not more than 0 argument(s)", NULL);
    expect_error("{% macro m() %}{{ 1 is kwargs }}{% endmacro %}{{ m(a=1) }}", NULL, CSD_EINVAL,
                 "macro 'm' takes no keyword argument 'a'", NULL);
    char params[256 * 8] = "";
    for (int i = 0; i < 256; i++)
        snprintf(params + strlen(params), sizeof params - strlen(params), "%sp%d", i ? "," : "", i);
    char many[sizeof params + 255 * 4 + 64];
    snprintf(many, sizeof many, "{%% macro f(%s) %%}{%% endmacro %%}", params);
    expect_error(many, NULL, CSD_EFORMAT, "more than 255 parameters", NULL);
    *strrchr(params, ',') = '\0'; /* 255 */
    char args[255 * 4] = "";
    for (int i = 0; i < 255; i++)
        snprintf(args + strlen(args), sizeof args - strlen(args), "%s%d", i ? "," : "", i);
    snprintf(many, sizeof many, "{%% macro f(%s) %%}{{ p254 }}{%% endmacro %%}{{ f(%s) }}",
             params, args);
    expect_render(many, NULL, "254");
}

static void test_limits(void **state) {
    (void)state;
    /* parser depth */
    char *expr = repeat("(", 5000, "1", ")");
    char *tpl = malloc(strlen(expr) + 8);
    sprintf(tpl, "{{ %s }}", expr);
    expect_error(tpl, NULL, CSD_ERANGE, "nesting deeper", NULL);
    char *ifs = repeat("{% if true %}", 3000, "x", "{% endif %}");
    expect_error(ifs, NULL, CSD_ERANGE, "nesting deeper", NULL);
    char *nots = repeat("not ", 100000, "x", "");
    char *tpl2 = malloc(strlen(nots) + 8);
    sprintf(tpl2, "{{ %s }}", nots);
    expect_error(tpl2, NULL, CSD_ERANGE, "nesting deeper", NULL);
    free(expr);
    free(tpl);
    free(ifs);
    free(nots);
    free(tpl2);
    /* unbounded macro recursion */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, CSD_ERANGE,
                 "recursion", NULL);
    /* step budget */
    char *out = NULL;
    csd_err err = {0};
    csd_chat_render_opts os = {.max_steps = 100000};
    assert_int_equal(
        render_opts("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                    NULL, &os, &out, &err),
        CSD_ERANGE);
    assert_non_null(strstr(err.msg, "steps"));
    /* a huge nested loop is stopped by the memory or the step limit, whichever comes first */
    csd_chat_render_opts o32 = {.max_memory = 32u << 20};
    int rc = render_opts(
        "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", NULL,
        &o32, &out, &err);
    assert_true(rc == CSD_ERANGE || rc == CSD_EFULL);
    /* output and string size: doubling a string */
    csd_chat_render_opts o = {.max_output = 1000};
    assert_int_equal(render_opts("{% for i in range(2000) %}x{% endfor %}", NULL, &o, &out, &err),
                     CSD_ERANGE);
    assert_non_null(strstr(err.msg, "size limit"));
    assert_int_equal(render_opts("{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL, &o, &out, &err),
                     CSD_ERANGE);
    /* memory: many medium strings kept alive in a list */
    csd_chat_render_opts om = {.max_memory = 4u << 20};
    assert_int_equal(
        render_opts(
            "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
            "{% set ns.l = ns.l + ['xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' ~ i] %}{% endfor %}",
            NULL, &om, &out, &err),
        CSD_EFULL);
    /* range size and namespace self-reference */
    expect_error("{{ range(100000000) | length }}", NULL, CSD_EINVAL, "range()", NULL);
    expect_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}", NULL,
                 CSD_ERANGE, "nested", NULL);
}

static void test_builtins(void **state) {
    (void)state;
    static const struct {
        const char *name, *want;
    } cases[] = {
        {"chatml",
         "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
         "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
         "<|im_start|>assistant\n"},
        {"llama3", "<B><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        {"llama2",
         "<B>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello <E><B>[INST] Bye [/INST]"},
        {"mistral", "<B>[INST] Hi[/INST] Hello<E>[INST] Be brief.\n\nBye[/INST]"},
        {"gemma",
         "<B><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
         "<start_of_turn>model\nHello<end_of_turn>\n"
         "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"},
    };
    json_t *msgs =
        json_loads("[{\"role\": \"system\", \"content\": \"Be brief.\"},"
                   " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"}]},"
                   " {\"role\": \"assistant\", \"content\": \"Hello\"},"
                   " {\"role\": \"user\", \"content\": \"Bye\"}]",
                   0, NULL);
    assert_non_null(msgs);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *src = csd_chat_template_builtin(cases[i].name);
        assert_non_null(src);
        csd_chat_template *t = NULL;
        csd_err err = {0};
        if (csd_chat_template_create(&t, src, &err)) fail_msg("%s: %s", cases[i].name, err.msg);
        /* keep the parts list: the built-ins handle it themselves */
        csd_chat_apply_params p = {.messages = msgs,
                                   .add_generation_prompt = true,
                                   .bos_token = "<B>",
                                   .eos_token = "<E>",
                                   .keep_content_parts = true};
        char *out = NULL;
        if (csd_chat_template_apply(t, &p, &out, &err)) fail_msg("%s: %s", cases[i].name, err.msg);
        if (strcmp(out, cases[i].want))
            fail_msg("%s:\n got [%s]\nwant [%s]", cases[i].name, out, cases[i].want);
        csd_free(out);
        csd_chat_template_destroy(t);
    }
    assert_null(csd_chat_template_builtin("nope"));
    assert_null(csd_chat_template_builtin(NULL));
    json_decref(msgs);
}

static void test_apply_validation(void **state) {
    (void)state;
    csd_chat_template *t = NULL;
    csd_err err = {0};
    assert_int_equal(csd_chat_template_create(&t,
                                              "{% for m in messages %}{{ m.content }}|{% endfor %}"
                                              "{{ tools | length }}{{ enable_thinking }}",
                                              &err),
                     0);
    static const struct {
        const char *json, *frag;
    } bad[] = {
        {"{\"role\": \"user\"}", "expected an array"},
        {"[1]", "messages[0]: expected an object"},
        {"[{\"content\": \"x\"}]", "messages[0].role"},
        {"[{\"role\": \"user\", \"content\": 5}]", "messages[0].content"},
        {"[{\"role\": \"user\", \"content\": [{\"text\": \"x\"}]}]", "content[0]"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 1}]}]",
         "content[0].text"},
        {"[{\"role\": \"assistant\", \"tool_calls\": {}}]", "tool_calls"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *m = json_loads(bad[i].json, JSON_DECODE_ANY, NULL);
        assert_non_null(m);
        csd_chat_apply_params p = {.messages = m};
        char *out = NULL;
        assert_int_equal(csd_chat_template_apply(t, &p, &out, &err), CSD_EINVAL);
        if (!strstr(err.msg, bad[i].frag)) fail_msg("[%s] lacks [%s]", err.msg, bad[i].frag);
        assert_null(out);
        json_decref(m);
    }
    json_t *m = json_loads(
        "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
        " {\"type\": \"text\", \"text\": \"b\"}]}, {\"role\": \"user\", \"content\": null}]",
        0, NULL);
    json_t *tools = json_loads("[{\"type\": \"function\"}]", 0, NULL);
    json_t *extra = json_loads("{\"enable_thinking\": false}", 0, NULL);
    csd_chat_apply_params p = {.messages = m, .tools = tools, .extra = extra};
    char *out = NULL;
    assert_int_equal(csd_chat_template_apply(t, &p, &out, &err), 0);
    assert_string_equal(out, "ab||1false");
    csd_free(out);
    json_decref(m);
    json_decref(tools);
    json_decref(extra);
    csd_chat_template_destroy(t);
}

static void test_api_edges(void **state) {
    (void)state;
    csd_chat_template_destroy(NULL);
    csd_chat_template *t = NULL;
    csd_err err = {0};
    assert_int_equal(csd_chat_template_create(&t, NULL, &err), CSD_EINVAL);
    assert_int_equal(csd_chat_template_create(&t, "", &err), 0);
    char *out = NULL;
    assert_int_equal(csd_chat_template_render(t, NULL, &out, &err), 0);
    assert_string_equal(out, "");
    csd_free(out);
    json_t *arr = json_array();
    assert_int_equal(csd_chat_template_render(t, arr, &out, &err), CSD_EINVAL);
    json_decref(arr);
    csd_chat_template_destroy(t);
    /* errors need no csd_err */
    assert_int_equal(csd_chat_template_create(&t, "{% if %}", NULL), CSD_EFORMAT);
    assert_null(t);
}

/* The real templates on this machine, rendered for one conversation (hand-checked). */
static void test_real_templates(void **state) {
    (void)state;
    const char *path = CSD_SHARED_DIR "/tokenizers/qwen3/tokenizer_config.json";
    CSD_REQUIRE_FILE(path);
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL);
    assert_non_null(cfg);
    csd_chat_template *t = NULL;
    csd_err err = {0};
    if (csd_chat_template_create(&t, json_string_value(json_object_get(cfg, "chat_template")),
                                 &err))
        fail_msg("%s", err.msg);
    json_t *msgs = json_loads(
        "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Q\"},"
        " {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nA\"},"
        " {\"role\": \"user\", \"content\": \"Q2\"}]",
        0, NULL);
    json_t *extra = json_loads("{\"enable_thinking\": false}", 0, NULL);
    csd_chat_apply_params p = {.messages = msgs, .add_generation_prompt = true, .extra = extra};
    char *out = NULL;
    if (csd_chat_template_apply(t, &p, &out, &err)) fail_msg("%s", err.msg);
    assert_string_equal(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                             "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
                             "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    csd_free(out);
    csd_chat_template_destroy(t);
    json_decref(cfg);

    path = CSD_SHARED_DIR "/tokenizers/llama3/tokenizer_config.json";
    CSD_REQUIRE_FILE(path);
    cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL);
    assert_non_null(cfg);
    if (csd_chat_template_create(&t, json_string_value(json_object_get(cfg, "chat_template")),
                                 &err))
        fail_msg("%s", err.msg);
    p.bos_token = "<|begin_of_text|>";
    p.extra = NULL;
    if (csd_chat_template_apply(t, &p, &out, &err)) fail_msg("%s", err.msg);
    assert_string_equal(
        out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nr\n</think>\n\nA<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nQ2<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n");
    csd_free(out);
    csd_chat_template_destroy(t);
    json_decref(cfg);
    json_decref(msgs);
    json_decref(extra);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_statements),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tests),
        cmocka_unit_test(test_strings_and_slices),
        cmocka_unit_test(test_strftime_fixed),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_time_budget),
        cmocka_unit_test(test_macro_definition_cost),
        cmocka_unit_test(test_builtins),
        cmocka_unit_test(test_apply_validation),
        cmocka_unit_test(test_api_edges),
        cmocka_unit_test(test_real_templates),
        cmocka_unit_test(test_context_object_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
