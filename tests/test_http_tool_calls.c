/* Tool calls: the splitter that takes Hermes-style <tool_call> blocks out of a streamed answer
 * (any chunking gives the same content and calls; a bad call is content, as written; bounds), the
 * request's tools and tool_choice (modes, refusals naming the field), and the job that turns an
 * answer into OpenAI's message.tool_calls and streamed tool_calls deltas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "http/http_internal.h"
#include "http/tool_calls.h"
#include "json_accept_expect.h"
#include "model/json_accept.h"
#include "model/json_schema.h"

/* ---- the splitter ---- */

#define TAGS CSD_TOOL_SPLIT_TAGS
#define BARE CSD_TOOL_SPLIT_BARE
#define WHOLE CSD_TOOL_SPLIT_WHOLE
#define MISTRAL CSD_TOOL_SPLIT_MISTRAL

typedef struct split_result {
    char content[8192];
    size_t content_len;
    int n_calls;
    char names[CSD_TOOL_CALLS_MAX][64];
    char args[CSD_TOOL_CALLS_MAX][256];
} split_result;

static void add_content(split_result *r, const char *s, size_t n) {
    assert_true(r->content_len + n < sizeof r->content);
    memcpy(r->content + r->content_len, s, n);
    r->content_len += n;
    r->content[r->content_len] = 0;
}

/* Splits text pushed in pieces of the given sizes (cycled; 0: all at once). */
/* mode: enum csd_tool_split_mode */
static void split(const char *text, int mode, const size_t *sizes, int n_sizes,
                  split_result *r) {
    memset(r, 0, sizeof *r);
    csd_tool_split s;
    csd_tool_split_init(&s, mode);
    size_t len = strlen(text), at = 0;
    const char *out;
    size_t n;
    for (int k = 0; at < len; k++) {
        size_t step = n_sizes ? sizes[k % n_sizes] : len;
        if (step > len - at) step = len - at;
        assert_int_equal(csd_tool_split_push(&s, text + at, step, &out, &n), 0);
        add_content(r, out, n);
        at += step;
    }
    assert_int_equal(csd_tool_split_finish(&s, &out, &n), 0);
    add_content(r, out, n);
    r->n_calls = s.n_calls;
    for (int i = 0; i < s.n_calls; i++) {
        snprintf(r->names[i], sizeof r->names[i], "%s", s.calls[i].name);
        snprintf(r->args[i], sizeof r->args[i], "%s", s.calls[i].arguments);
    }
    csd_tool_split_fini(&s);
}

/* The same result whole, byte by byte, and in several other chunkings. */
static void split_every_way(const char *text, int mode, split_result *r) {
    static const size_t chunkings[][3] = {{1, 1, 1}, {2, 3, 5}, {7, 1, 4}, {11, 12, 13}};
    split(text, mode, NULL, 0, r);
    for (size_t c = 0; c < sizeof chunkings / sizeof chunkings[0]; c++) {
        split_result other;
        split(text, mode, chunkings[c], 3, &other);
        assert_string_equal(other.content, r->content);
        assert_int_equal(other.n_calls, r->n_calls);
        for (int i = 0; i < r->n_calls; i++) {
            assert_string_equal(other.names[i], r->names[i]);
            assert_string_equal(other.args[i], r->args[i]);
        }
    }
}

/* text, split every way in mode, is one call (name, args) and the content given. */
static void expect_one_call(const char *text, int mode, const char *name, const char *args,
                            const char *content) {
    split_result r;
    split_every_way(text, mode, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], name);
    assert_string_equal(r.args[0], args);
    assert_string_equal(r.content, content);
}

#define CALL(name, args) \
    "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " args "}\n</tool_call>"

static void test_split_plain_text(void **state) {
    (void)state;
    split_result r;
    const char *texts[] = {"Hello, world.", "trailing space \n\n", "a < b and <tool", "<tool_cal",
                           "x</tool_call>y", ""};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        split_every_way(texts[i], TAGS, &r);
        assert_string_equal(r.content, texts[i]); /* nothing lost, nothing added */
        assert_int_equal(r.n_calls, 0);
    }
}

static void test_split_one_call(void **state) {
    (void)state;
    /* the arguments as written */
#define PARIS "{\"city\": \"Paris\", \"days\": [1, 2]}"
    expect_one_call("Let me check.\n" CALL("get_weather", PARIS), TAGS, "get_weather", PARIS,
                    "Let me check.");
#undef PARIS
    /* the tags as the only text, and text after the call */
    expect_one_call(CALL("f", "{}") "\nDone.", TAGS, "f", "{}", "\nDone.");
}

static void test_split_calls_and_whitespace(void **state) {
    (void)state;
    split_result r;
    split_every_way("\n" CALL("a", "{\"x\": 1}") "\n\n" CALL("b", "{\"y\": \"\\u00e9\"}") "\n \n",
                    TAGS, &r);
    assert_string_equal(r.content, ""); /* only whitespace around the calls */
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.names[0], "a");
    assert_string_equal(r.names[1], "b");
    assert_string_equal(r.args[1], "{\"y\": \"\\u00e9\"}"); /* as written, escape and all */
}

static void test_split_bad_call_is_content(void **state) {
    (void)state;
    split_result r;
    const char *bad[] = {
        "Look: \n<tool_call>not json</tool_call> ok",
        "<tool_call>{\"arguments\": {}}</tool_call>",              /* no name */
        "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",  /* empty name */
        "<tool_call>{\"name\": 3}</tool_call>",                     /* not a string */
        "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", /* not an object */
        "<tool_call>[\"f\"]</tool_call>",                            /* not an object */
        "<tool_call>{\"name\": \"f\", \"name\": \"g\"}</tool_call>",     /* duplicate key */
        "<tool_call>{\"name\": \"a\\u0000b\"}</tool_call>",           /* NUL in the name */
        "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\u0000}\"}</tool_call>", /* NUL */
        "<tool_call>{\"name\": \"f\", \"n\\u0061me\": \"g\"}</tool_call>", /* name twice */
        "<tool_call>{\"name\": ",                                    /* cut short */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        split_every_way(bad[i], TAGS, &r);
        assert_string_equal(r.content, bad[i]); /* as written, whitespace before the tag too */
        assert_int_equal(r.n_calls, 0);
    }
}

static void test_split_call_forms(void **state) {
    (void)state;
    split_result r;
    /* an open call at the end (max_tokens, or no close tag) is parsed as it stands */
    split_every_way("ok <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": true}}", TAGS, &r);
    assert_string_equal(r.content, "ok");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{\"a\": true}");
    /* arguments as a string are kept as written; "parameters" is their other name; none: {} */
    split_every_way("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
                    "<tool_call>{\"name\": \"g\", \"parameters\": {\"b\": null}}</tool_call>"
                    "<tool_call>{\"name\": \"h\"}</tool_call>",
                    TAGS, &r);
    assert_int_equal(r.n_calls, 3);
    assert_string_equal(r.args[0], "{\"a\": 1}");
    assert_string_equal(r.args[1], "{\"b\": null}");
    assert_string_equal(r.args[2], "{}");
    assert_string_equal(r.content, "");
    /* an escaped key is the key it decodes to */
    split_every_way("<tool_call>{\"n\\u0061me\": \"f\", \"argument\\u0073\": {}}</tool_call>",
                    TAGS, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "f");
}

static void test_split_whole_mode(void **state) {
    (void)state;
    split_result r;
    expect_one_call("{\"name\": \"pick\", \"arguments\": {\"n\": 2}}", WHOLE, "pick",
                    "{\"n\": 2}", "");
    split_every_way("{\"name\": \"pick\", \"argum", WHOLE, &r); /* cut by max_tokens */
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "{\"name\": \"pick\", \"argum");
}

/* What the constrained decoder may write is a call, whatever jansson makes of it: integers beyond
 * 64 bits, a NUL character, a number beyond the double range; the digits are kept. */
static void test_split_numbers_kept(void **state) {
    (void)state;
    split_result r;
    const char *args[] = {"{\"id\": 12345678901234567890123}", "{\"s\": \"a\\u0000b\"}",
                          "{\"x\": 1e999, \"y\": 0.1, \"z\": 1E+2}",
                          /* two spaces: outside the decoder's grammar, jansson's to accept */
                          "{\"id\":  12345678901234567890123, \"s\":  \"\\u0000\"}"};
    for (int i = 0; i < 4; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"name\": \"f\", \"arguments\": %s}", args[i]);
        split_every_way(text, WHOLE, &r);
        assert_int_equal(r.n_calls, 1);
        assert_string_equal(r.args[0], args[i]);
        snprintf(text, sizeof text, "<tool_call>{\"name\": \"f\", \"arguments\": %s}</tool_call>",
                 args[i]);
        split_every_way(text, TAGS, &r);
        assert_int_equal(r.n_calls, 1);
        assert_string_equal(r.args[0], args[i]);
    }
}

/* A call cut inside its close tag (a tag of several tokens) is still a call. */
static void test_split_cut_close_tag(void **state) {
    (void)state;
    split_result r;
    split_every_way("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_c", TAGS,
                    &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{\"a\": 1}");
    assert_string_equal(r.content, "");
}

/* At most CSD_TOOL_SPACE_MAX bytes of whitespace are dropped before a call: the rest of a longer
 * run stays content (and nothing scans more than that per piece). */
static void test_split_long_space(void **state) {
    (void)state;
    size_t run = 3 * CSD_TOOL_SPACE_MAX + 7;
    char *text = malloc(run + 64);
    strcpy(text, "x");
    memset(text + 1, '\n', run);
    strcpy(text + 1 + run, "<tool_call>{\"name\": \"f\"}</tool_call>");
    split_result r;
    split_every_way(text, TAGS, &r);
    assert_int_equal(r.n_calls, 1);
    assert_int_equal(r.content_len, 1 + run - CSD_TOOL_SPACE_MAX);
    /* the same run at the end of an answer with a call */
    strcpy(text, "<tool_call>{\"name\": \"f\"}</tool_call>");
    size_t at = strlen(text);
    memset(text + at, ' ', run);
    text[at + run] = 0;
    split_every_way(text, TAGS, &r);
    assert_int_equal(r.n_calls, 1);
    assert_int_equal(r.content_len, run - CSD_TOOL_SPACE_MAX);
    free(text);
}

/* Calls beyond CSD_TOOL_CALLS_MAX stay content; a body beyond CSD_TOOL_CALL_MAX_BYTES is content,
 * every byte of it. */
static void test_split_bounds(void **state) {
    (void)state;
    csd_tool_split s;
    csd_tool_split_init(&s, TAGS);
    const char *one = "<tool_call>{\"name\": \"f\"}</tool_call>";
    const char *out;
    size_t n, total = 0;
    for (int i = 0; i < CSD_TOOL_CALLS_MAX + 1; i++) {
        assert_int_equal(csd_tool_split_push(&s, one, strlen(one), &out, &n), 0);
        total += n;
    }
    assert_int_equal(csd_tool_split_finish(&s, &out, &n), 0);
    total += n;
    assert_int_equal(s.n_calls, CSD_TOOL_CALLS_MAX);
    assert_int_equal(total, strlen(one));
    csd_tool_split_fini(&s);

    for (int whole = 0; whole < 2; whole++) {
        csd_tool_split_init(&s, whole ? WHOLE : TAGS);
        size_t chunk = 4096, pushed = 0, got = 0;
        char *filler = malloc(chunk);
        memset(filler, 'x', chunk);
        const char *open = whole ? "{\"name\": \"f\", \"arguments\": {\"a\": \"" : "<tool_call>";
        assert_int_equal(csd_tool_split_push(&s, open, strlen(open), &out, &n), 0);
        pushed += strlen(open), got += n;
        while (pushed <= CSD_TOOL_CALL_MAX_BYTES + chunk) {
            assert_int_equal(csd_tool_split_push(&s, filler, chunk, &out, &n), 0);
            pushed += chunk, got += n;
        }
        assert_true(got > CSD_TOOL_CALL_MAX_BYTES); /* handed out as it came, once too long */
        assert_int_equal(csd_tool_split_push(&s, "</tool_call>", 12, &out, &n), 0);
        pushed += 12, got += n;
        assert_int_equal(csd_tool_split_finish(&s, &out, &n), 0);
        got += n;
        assert_int_equal(got, pushed);
        assert_int_equal(s.n_calls, 0);
        free(filler);
        csd_tool_split_fini(&s);
    }
}

/* Pushes text through s in pieces of piece bytes, then finishes it; returns how many content bytes
 * it handed out. */
static size_t push_in_pieces(csd_tool_split *s, const char *text, size_t piece) {
    size_t len = strlen(text), got = 0;
    const char *out;
    size_t n;
    for (size_t at = 0; at < len; at += piece) {
        size_t step = len - at < piece ? len - at : piece;
        assert_int_equal(csd_tool_split_push(s, text + at, step, &out, &n), 0);
        got += n;
    }
    assert_int_equal(csd_tool_split_finish(s, &out, &n), 0);
    return got + n;
}

/* A body of exactly CSD_TOOL_CALL_MAX_BYTES is a call and one byte more is content, whole or in
 * small pieces (a close tag still arriving does not count against the body). */
static void test_split_bound_exact(void **state) {
    (void)state;
    for (size_t extra = 0; extra < 2; extra++) {
        size_t body = CSD_TOOL_CALL_MAX_BYTES + extra;
        char *text = malloc(body + 64);
        const char *head = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"";
        strcpy(text, head);
        size_t fill = body - (strlen(head) - 11) - 3; /* the body ends with "\"}}" */
        memset(text + strlen(head), 'x', fill);
        strcpy(text + strlen(head) + fill, "\"}}</tool_call>");
        static const size_t sizes[] = {4, 1 << 16, (size_t)1 << 30};
        for (int k = 0; k < 3; k++) {
            csd_tool_split s;
            csd_tool_split_init(&s, TAGS);
            size_t got = push_in_pieces(&s, text, sizes[k]);
            assert_int_equal(s.n_calls, extra ? 0 : 1);
            assert_int_equal(got, extra ? strlen(text) : 0);
            csd_tool_split_fini(&s);
        }
        free(text);
    }
}

/* A call too long to be one is content through its close tag however it arrives: a tag inside
 * it never starts a call. */
static void test_split_long_call_skipped(void **state) {
    (void)state;
    size_t fill = CSD_TOOL_CALL_MAX_BYTES + 10;
    const char *inner = "<tool_call>{\"name\": \"g\"}</tool_call>";
    char *text = malloc(fill + 128);
    strcpy(text, "<tool_call>");
    memset(text + 11, 'x', fill);
    strcpy(text + 11 + fill, inner);
    strcat(text, CALL("h", "{}"));
    static const size_t sizes[] = {1 << 16, 4, (size_t)1 << 30};
    for (int k = 0; k < 3; k++) {
        csd_tool_split s;
        csd_tool_split_init(&s, TAGS);
        size_t got = push_in_pieces(&s, text, sizes[k]);
        assert_int_equal(s.n_calls, 1); /* h, after the long one; never g inside it */
        assert_string_equal(s.calls[0].name, "h");
        assert_int_equal(got, 11 + fill + strlen(inner));
        csd_tool_split_fini(&s);
    }
    free(text);
}

/* Random answers from fragments that make and break tags, bare and Mistral calls, split in each of
 * those modes by turns: every chunking gives the same result, and an answer with no call comes out
 * whole. */
static void test_split_random(void **state) {
    (void)state;
    static const char *frags[] = {"a", " ", "\n", "<tool_call>", "</tool_call>", "<tool", "_call>",
                                  "{\"name\": \"f\"}", "{\"name\": \"g\", \"arguments\": {}}", "}",
                                  "<", "</tool_call", "x y", ";", "<|python_tag|>", "{", "\"",
                                  "[TOOL_CALLS]", "[ARGS]", "f", "[", "]", ","};
    unsigned seed = 12345;
    for (int t = 0; t < 400; t++) {
        char text[512] = {0};
        int parts = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 12;
        for (int p = 0; p < parts; p++) {
            seed = seed * 1103515245u + 12345u;
            strcat(text, frags[(seed >> 16) % (sizeof frags / sizeof frags[0])]);
        }
        split_result r;
        static const int modes[] = {TAGS, BARE, MISTRAL};
        split_every_way(text, modes[t % 3], &r);
        if (r.n_calls == 0) assert_string_equal(r.content, text);
    }
}

/* Llama 3.1/3.2's bare calls: an answer that starts with '{' (after whitespace and the python
 * tag) is ';'-separated calls; anything else, or a part that is not a call, is content as
 * written. */
static void test_split_bare(void **state) {
    (void)state;
    split_result r;
    expect_one_call("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", BARE,
                    "get_weather", "{\"city\": \"Paris\"}", "");
    split_every_way(" \n<|python_tag|> {\"name\": \"a\", \"parameters\": {\"s\": \"}{;\\\"]\"}};"
                    "\n{\"name\": \"b\", \"arguments\": {}}; ", BARE, &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.args[0], "{\"s\": \"}{;\\\"]\"}"); /* braces in strings do not count */
    assert_string_equal(r.names[1], "b");
    assert_string_equal(r.content, "");
    const char *content[] = {
        "Hello {\"name\": \"f\"}",                         /* not at the start */
        "{\"name\": \"f\", \"parameters\": {}} and then",   /* text after the call */
        "{\"name\": \"f\"} {\"name\": \"g\"}",               /* no ';' between them */
        "{\"name\": \"f\"}; {\"city\": \"Oslo\"}",            /* one part is not a call */
        "{\"name\": \"f\", \"parameters\": {\"a\": 1",        /* cut short */
        "<|python_tag|>brave_search.call(query=\"x\")",     /* Llama's built-in tools */
        "{\"name\": \"Alice\", \"age\": 30}",               /* neither parameters nor arguments */
        "{}}", "  \n", "<|python", "",
    };
    for (size_t i = 0; i < sizeof content / sizeof *content; i++) {
        split_every_way(content[i], BARE, &r);
        assert_int_equal(r.n_calls, 0);
        assert_string_equal(r.content, content[i]);
    }
    /* what comes before the first '{' is bounded the same way however the text arrives: past
     * CSD_TOOL_SPACE_MAX bytes the answer is content */
    for (size_t lead = CSD_TOOL_SPACE_MAX - 1; lead <= CSD_TOOL_SPACE_MAX + 1; lead++) {
        char text[CSD_TOOL_SPACE_MAX + 64];
        memset(text, ' ', lead);
        strcpy(text + lead, "{\"name\": \"f\", \"parameters\": {}}");
        split_every_way(text, BARE, &r);
        assert_int_equal(r.n_calls, lead <= CSD_TOOL_SPACE_MAX);
        assert_string_equal(r.content, lead <= CSD_TOOL_SPACE_MAX ? "" : text);
    }
    /* an answer that is not calls streams as it comes; one that may be is held back */
    csd_tool_split s;
    const char *out;
    size_t n;
    csd_tool_split_init(&s, BARE);
    assert_int_equal(csd_tool_split_push(&s, " <|python_", 10, &out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(csd_tool_split_push(&s, "Sure", 4, &out, &n), 0);
    assert_int_equal(n, 14);
    assert_int_equal(csd_tool_split_push(&s, " thing", 6, &out, &n), 0);
    assert_int_equal(n, 6);
    csd_tool_split_fini(&s);
    csd_tool_split_init(&s, BARE);
    assert_int_equal(csd_tool_split_push(&s, "\n{\"name\": ", 10, &out, &n), 0);
    assert_int_equal(n, 0);
    csd_tool_split_fini(&s);
}

/* Mistral's calls: [TOOL_CALLS] and a list of calls (tokenizer v3) or name[ARGS]{...} after each
 * tag (v11, a [CALL_ID] skipped); text before the tag is content; anything that is not calls, from
 * the tag on, is content as written. */
static void test_split_mistral(void **state) {
    (void)state;
    split_result r;
#define CITY "{\"city\": \"Paris\"}"
    expect_one_call("[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " CITY "}]", MISTRAL,
                    "get_weather", CITY, "");
    split_every_way("Let me check. \n[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"s\": "
                    "\"]}\"}}, {\"name\": \"b\", \"arguments\": {}}]\n",
                    MISTRAL, &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.args[0], "{\"s\": \"]}\"}");
    assert_string_equal(r.names[1], "b");
    assert_string_equal(r.content, "Let me check.");
    split_every_way("[TOOL_CALLS]get_weather[ARGS]" CITY "[TOOL_CALLS]now[ARGS]{}", MISTRAL, &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.names[0], "get_weather");
    assert_string_equal(r.args[0], CITY);
    assert_string_equal(r.names[1], "now");
    assert_string_equal(r.args[1], "{}");
    expect_one_call("[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]" CITY, MISTRAL, "f", CITY, "");
#undef CITY
    const char *content[] = {
        "[TOOL_CALLS]", "[TOOL_CALLS][]", "Hi [TOOL_CALLS]bad",
        "[TOOL_CALLS][{\"name\": \"f\"}]",                   /* no arguments */
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}",   /* cut short */
        "[TOOL_CALLS]f[ARGS]{\"a\": ",                          /* cut short */
        "[TOOL_CALLS]f[ARGS]{} and more", "[TOOL_CALLS]f{}", "[TOOL_CALLS]a b[ARGS]{}",
        "[TOOL_CALLS]f[ARGS][1]", "a [TOOL b", "[TOOL_CALL", "", "[TOOL_CALLS]][ARGS]{}",
        "[TOOL_CALLS]f[CALL_ID]abc[TOOL_CALLS]g[ARGS]{}",         /* an id runs to [ARGS] */
        "[TOOL_CALLS]f[CALL_ID]some words [ARGS]{}",
        "<tool_call>{\"name\": \"f\"}</tool_call>",             /* not this format's */
    };
    for (size_t i = 0; i < sizeof content / sizeof *content; i++) {
        split_every_way(content[i], MISTRAL, &r);
        assert_int_equal(r.n_calls, 0);
        assert_string_equal(r.content, content[i]);
    }
    /* calls over CSD_TOOL_CALL_MAX_BYTES are content, pushed at once or in pieces */
    size_t len = CSD_TOOL_CALL_MAX_BYTES + 100;
    char *big = malloc(len + 1);
    memset(big, 'x', len);
    memcpy(big, "[TOOL_CALLS]f[ARGS]{\"a\":\"", 25);
    memcpy(big + len - 2, "\"}", 3);
    for (size_t piece = 4096; piece <= len; piece += len - 4096) {
        csd_tool_split s;
        csd_tool_split_init(&s, MISTRAL);
        size_t got = 0;
        const char *out;
        size_t n;
        for (size_t at = 0; at < len; at += piece) {
            size_t step = len - at < piece ? len - at : piece;
            assert_int_equal(csd_tool_split_push(&s, big + at, step, &out, &n), 0);
            assert_memory_equal(out, big + got, n);
            got += n;
        }
        assert_int_equal(csd_tool_split_finish(&s, &out, &n), 0);
        got += n;
        assert_int_equal(got, len);
        assert_int_equal(s.n_calls, 0);
        csd_tool_split_fini(&s);
    }
    free(big);
}

/* The format a chat template asks for: Llama 3.1's bare JSON, Mistral's [TOOL_CALLS], Hermes tags
 * otherwise. */
static void test_split_mode_for_template(void **state) {
    (void)state;
    assert_int_equal(csd_tool_split_mode_for_template(NULL), TAGS);
    assert_int_equal(csd_tool_split_mode_for_template("{{ messages }}"), TAGS);
    assert_int_equal(csd_tool_split_mode_for_template(
                         "{{- '<tool_call>\\n' }}{{ tool_call | tojson }}{{- '</tool_call>' }}"),
                     TAGS);
    assert_int_equal(csd_tool_split_mode_for_template(
                         "{{- \"Given the following functions, please respond with a JSON for a "
                         "function call with its proper arguments\" }}"),
                     BARE);
    assert_int_equal(csd_tool_split_mode_for_template("{{- '<|python_tag|>' + tool_call.name }}"),
                     BARE);
    assert_int_equal(csd_tool_split_mode_for_template(
                         "{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}"
                         "{{- '[TOOL_CALLS]' + tool_calls|tojson + eos_token }}"),
                     MISTRAL);
}

/* ---- the request ---- */

#define USER "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOL(name, params) \
    "{\"type\":\"function\",\"function\":{\"name\":\"" name "\",\"parameters\":" params "}}"
#define WEATHER TOOL("get_weather", "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":" \
                     "\"string\"}},\"required\":[\"city\"],\"additionalProperties\":false}")

static void parse_ok(const char *body, csd_http_req *r) {
    csd_http_error e;
    int rc = csd_http_req_parse(r, CSD_HTTP_KIND_CHAT, body, strlen(body), 0, &e);
    if (rc) fail_msg("%s: %s", body, e.message);
}

static void parse_fails(const char *body, const char *param, const char *in_message) {
    csd_http_req r;
    csd_http_error e;
    int rc = csd_http_req_parse(&r, CSD_HTTP_KIND_CHAT, body, strlen(body), 0, &e);
    if (!rc) fail_msg("accepted: %s", body);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    if (!strstr(e.message, in_message)) fail_msg("'%s' lacks '%s'", e.message, in_message);
    csd_http_req_fini(&r);
}

static void test_request_modes(void **state) {
    (void)state;
    csd_http_req r;
    parse_ok("{" USER "}", &r);
    assert_int_equal(r.tool_mode, CSD_HTTP_TOOLS_OFF);
    csd_http_req_fini(&r);
    parse_ok("{" USER ",\"tools\":[" WEATHER "]}", &r);
    assert_int_equal(r.tool_mode, CSD_HTTP_TOOLS_AUTO);
    assert_false(r.json_object);
    csd_http_req_fini(&r);
    parse_ok("{" USER ",\"tools\":[" WEATHER "],\"tool_choice\":\"none\"}", &r);
    assert_int_equal(r.tool_mode, CSD_HTTP_TOOLS_OFF);
    assert_non_null(r.tools); /* still shown to the template */
    csd_http_req_fini(&r);
    parse_ok("{" USER ",\"tool_choice\":\"auto\"}", &r);
    assert_int_equal(r.tool_mode, CSD_HTTP_TOOLS_OFF);
    csd_http_req_fini(&r);
    const char *named[] = {
        "{" USER ",\"tools\":[" TOOL("x", "{}") "," WEATHER "],\"tool_choice\":{\"type\":"
        "\"function\",\"function\":{\"name\":\"get_weather\"}}}",
        "{" USER ",\"tools\":[" WEATHER "],\"tool_choice\":\"required\"}",
    };
    for (int i = 0; i < 2; i++) {
        parse_ok(named[i], &r);
        assert_int_equal(r.tool_mode, CSD_HTTP_TOOLS_NAMED);
        assert_string_equal(r.tool_name, "get_weather");
        assert_true(r.json_object);
        assert_non_null(r.json_schema);
        csd_http_req_fini(&r);
    }
    parse_ok("{" USER ",\"tools\":[" TOOL("x", "{}") "," WEATHER "],\"tool_choice\":\"required\"}",
             &r);
    assert_int_equal(r.tool_mode, CSD_HTTP_TOOLS_PICK);
    assert_non_null(r.json_schema);
    csd_http_req_fini(&r);
    /* a function without parameters takes none: its arguments are {} */
    parse_ok("{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"now\"}}],"
             "\"tool_choice\":\"required\"}",
             &r);
    assert_int_equal(r.tool_mode, CSD_HTTP_TOOLS_NAMED);
    assert_int_equal(r.json_schema->nodes[r.json_schema->root].n_props, 0);
    assert_false(r.json_schema->nodes[r.json_schema->root].free_object);
    csd_http_req_fini(&r);
}

/* "required" among several tools: each tool's arguments follow that tool's parameters, told
 * apart by the name; a tool's "$ref"s name its own "$defs"; parameters that say nothing are an
 * object. */
static void test_request_pick_schema(void **state) {
    (void)state;
    csd_http_req r;
    parse_ok("{" USER ",\"tools\":[" TOOL("x", "{}") "," WEATHER ","
             TOOL("get_weather_at", "{\"$defs\":{\"D\":{\"enum\":[\"mon\",\"tue\"]}},"
                  "\"properties\":{\"day\":{\"$ref\":\"#/$defs/D\"}},\"required\":[\"day\"]}")
             "],\"tool_choice\":\"required\"}",
             &r);
    assert_int_equal(r.tool_mode, CSD_HTTP_TOOLS_PICK);
    static const char *const ok[] = {
        "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}",
        "{\"name\": \"x\", \"arguments\": {\"any\": [1]}}",
        "{\"name\":\"get_weather_at\",\"arguments\":{\"day\":\"tue\"}}",
    };
    expect_accepted(r.json_schema, ok, sizeof ok / sizeof *ok);
    /* '|' marks the first byte refused */
    static const char *const bad[] = {
        "{\"|arguments\":{}}",                                     /* the name comes first */
        "{\"name\":\"get_|time\"}",                                /* a tool's name */
        "{\"name\":\"get_weather\",\"arguments\":{|}}",            /* city is required */
        "{\"name\":\"get_weather\",\"arguments\":{\"|day\":\"mon\"}}", /* not get_weather's */
        "{\"name\":\"get_weather_at\",\"arguments\":{\"day\":\"|wed\"}}", /* its own D */
        "{\"name\":\"x\",\"arguments\":|5}",                       /* arguments are an object */
    };
    expect_refused_at_bar(r.json_schema, bad, sizeof bad / sizeof *bad);
    csd_http_req_fini(&r);
    /* parameters outside the subset (a 400 when named), or that allow more than objects (a root
     * $ref to an untyped definition): any object for that tool, its own schema for the others;
     * an $id that is only an anchor does not keep a tool's $refs from its own $defs */
    parse_ok("{" USER ",\"tools\":[" WEATHER "," TOOL("t", "{\"properties\":{\"n\":"
             "{\"minimum\":1}}}") "," TOOL("r", "{\"$ref\":\"#/$defs/P\",\"$defs\":{\"P\":"
             "{\"properties\":{\"x\":{\"type\":\"integer\"}}}}}") "," TOOL("a", "{\"$id\":\"#a\","
             "\"$defs\":{\"D\":{\"const\":1}},\"properties\":{\"d\":{\"$ref\":\"#/$defs/D\"}}}")
             "],\"tool_choice\":\"required\"}",
             &r);
    static const char *const loose_ok[] = {
        "{\"name\":\"t\",\"arguments\":{\"n\":\"not checked\"}}",
        "{\"name\":\"r\",\"arguments\":{\"x\":\"not checked\"}}",
        "{\"name\":\"a\",\"arguments\":{\"d\":1}}",
    };
    expect_accepted(r.json_schema, loose_ok, sizeof loose_ok / sizeof *loose_ok);
    static const char *const loose_bad[] = {
        "{\"name\":\"r\",\"arguments\":|5}",
        "{\"name\":\"r\",\"arguments\":|\"hello\"}",
        "{\"name\":\"a\",\"arguments\":{\"d\":|2}}",
        "{\"name\":\"get_weather\",\"arguments\":{\"|x\":1}}",
    };
    expect_refused_at_bar(r.json_schema, loose_bad, sizeof loose_bad / sizeof *loose_bad);
    csd_http_req_fini(&r);
    /* tools that fit the bounds alone and not together: any object for each */
    char *big = malloc(64 * 1024);
    strcpy(big, "{" USER ",\"tools\":[");
    for (int t = 0; t < 40; t++) {
        sprintf(big + strlen(big), "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\","
                "\"parameters\":{\"type\":\"object\",\"properties\":{", t ? "," : "", t);
        for (int p = 0; p < 30; p++)
            sprintf(big + strlen(big), "%s\"p%d\":{\"type\":\"integer\"}", p ? "," : "", p);
        strcat(big, "},\"additionalProperties\":false}}}");
    }
    strcat(big, "],\"tool_choice\":\"required\"}");
    parse_ok(big, &r);
    free(big);
    const char *free_args[] = {"{\"name\":\"f7\",\"arguments\":{\"zz\":\"any\"}}"};
    expect_accepted(r.json_schema, free_args, 1);
    csd_http_req_fini(&r);
}

static void test_request_refusals(void **state) {
    (void)state;
    parse_fails("{" USER ",\"tools\":[{\"type\":\"retrieval\"}]}", "tools[0].type", "function");
    parse_fails("{" USER ",\"tools\":[{\"type\":\"function\"}]}", "tools[0].function", "object");
    parse_fails("{" USER ",\"tools\":[{\"function\":{\"name\":\"\"}}]}", "tools[0].function.name",
                "1 to 256");
    parse_fails("{" USER ",\"tools\":[" TOOL("f", "5") "]}", "tools[0].function.parameters",
                "object");
    parse_fails("{" USER ",\"tools\":[" WEATHER "," WEATHER "]}", "tools[1].function.name",
                "both named");
    parse_fails("{" USER ",\"tool_choice\":\"required\"}", "tool_choice", "needs tools");
    parse_fails("{" USER ",\"chat_template_kwargs\":5}", "chat_template_kwargs", "object");
    parse_fails("{" USER ",\"parallel_tool_calls\":1}", "parallel_tool_calls", "boolean");
    parse_fails("{" USER ",\"chat_template_kwargs\":{\"add_generation_prompt\":false}}",
                "chat_template_kwargs", "add_generation_prompt");
    parse_fails("{" USER ",\"chat_template_kwargs\":{\"range\":1}}", "chat_template_kwargs",
                "range");
    parse_fails("{" USER ",\"tools\":[" WEATHER "],\"tool_choice\":\"always\"}", "tool_choice",
                "'required'");
    parse_fails("{" USER ",\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\","
                "\"function\":{\"name\":\"nope\"}}}",
                "tool_choice.function.name", "not among the tools");
    parse_fails("{" USER ",\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\","
                "\"function\":{\"name\":\"get_weather\\u0000zzz\"}}}",
                "tool_choice.function.name", "not among the tools"); /* not get_weather */
    parse_fails("{" USER ",\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"code\"}}",
                "tool_choice.type", "function");
    parse_fails("{" USER ",\"tools\":[" WEATHER "],\"tool_choice\":\"required\","
                "\"response_format\":{\"type\":\"json_object\"}}",
                "tool_choice", "response_format");
    /* a forced call's parameters must be inside the schema subset; in auto mode they are only
     * shown to the model */
    const char *mail = TOOL("send", "{\"type\":\"object\",\"properties\":{\"to\":{\"type\":"
                                    "\"string\",\"format\":\"email\"}}}");
    char body[1024];
    snprintf(body, sizeof body, "{" USER ",\"tools\":[%s],\"tool_choice\":\"required\"}", mail);
    parse_fails(body, "tools[0].function.parameters", "at '/properties/to': unsupported keyword");
    csd_http_req r;
    snprintf(body, sizeof body, "{" USER ",\"tools\":[%s]}", mail);
    parse_ok(body, &r);
    csd_http_req_fini(&r);
    /* bounds: 128 tools; "required" among more than 64 */
    char *big = malloc(64 * 1024);
    for (int n = 65; n <= 129; n += 64) {
        strcpy(big, "{" USER ",\"tools\":[");
        for (int i = 0; i < n; i++)
            sprintf(big + strlen(big), "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}",
                    i ? "," : "", i);
        strcat(big, "],\"tool_choice\":\"required\"}");
        if (n == 65)
            parse_fails(big, "tool_choice", "at most 64 tools");
        else
            parse_fails(big, "tools", "at most 128 tools");
    }
    free(big);
}

/* ---- the job ---- */

/* A tokenizer whose tokens are single characters (ASCII 32..126 and newline), plus the two tags
 * as single tokens, as Qwen's vocabularies have them; tags_special: added tokens marked special,
 * as other vocabularies have them. */
static csd_tok *char_tokenizer(bool tags_special) {
    char vocab[4096] = "\"<unk>\": 0, \"<s>\": 1, \"\\n\": 2, \"<tool_call>\": 3, "
                       "\"</tool_call>\": 4, \"<think>\": 5, \"</think>\": 6, \"\\u00e9\": 200, "
                       "\"<0xC3>\": 201";
    for (int c = 32; c < 127; c++) {
        size_t at = strlen(vocab);
        if (c == '"' || c == '\\')
            sprintf(vocab + at, ", \"\\%c\": %d", c, c);
        else
            sprintf(vocab + at, ", \"%c\": %d", c, c);
    }
    char json[8192];
    const char *tags = tags_special
                           ? ", {\"id\": 3, \"content\": \"<tool_call>\", \"special\": true}, "
                             "{\"id\": 4, \"content\": \"</tool_call>\", \"special\": true}, "
                             "{\"id\": 5, \"content\": \"<think>\", \"special\": true}, "
                             "{\"id\": 6, \"content\": \"</think>\", \"special\": true}"
                           : "";
    snprintf(json, sizeof json,
             "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, "
             "{\"id\": 1, \"content\": \"<s>\", \"special\": true}%s], \"normalizer\": null, "
             "\"pre_tokenizer\": null, \"decoder\": {\"type\": \"Sequence\", \"decoders\": "
             "[{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}, \"model\": "
             "{\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {%s}, \"merges\": []}}",
             tags, vocab);
    csd_tok *tok = NULL;
    csd_err err = {0};
    if (csd_tok_load_mem(&tok, json, strlen(json), NULL, 0, &err)) fail_msg("%s", err.msg);
    return tok;
}

/* Token ids of text: a tag is one token, and so is U+00E9; every other byte one (0xC3 alone is
 * the byte token <0xC3>). */
static int ids_of(const char *text, int32_t *ids) {
    static const char *const tags[] = {"<tool_call>", "</tool_call>", "<think>", "</think>"};
    int n = 0;
    for (const char *p = text; *p;) {
        int tag = -1;
        for (int t = 0; t < 4 && tag < 0; t++)
            if (!strncmp(p, tags[t], strlen(tags[t]))) tag = t;
        if (tag >= 0) {
            ids[n++] = 3 + tag;
            p += strlen(tags[tag]);
        } else {
            bool e_acute = !strncmp(p, "\xC3\xA9", 2); /* U+00E9, one token */
            int byte = (unsigned char)*p; /* <0xC3> alone: a byte token */
            ids[n++] = e_acute ? 200 : byte == '\n' ? 2 : byte == 0xC3 ? 201 : byte;
            p += e_acute ? 2 : 1;
        }
    }
    return n;
}

/* The thinking split the server would set for the next run_job (it depends on the prompt). */
static int job_think = CSD_HTTP_THINK_OFF;
static int job_kind = CSD_HTTP_KIND_CHAT; /* the route the body came to */
static const char *job_echo = "";         /* the prompt a completion echoes */
static int job_tool_format = CSD_TOOL_SPLIT_TAGS; /* what the server would set */
static bool job_oom_at_end; /* every allocation fails while the answer ends */

/* Runs one answer through a job made for body: the response object (non-stream) or the stream's
 * events as an array (each "data:" JSON; "[DONE]" as the string). */
static json_t *run_job(csd_tok *tok, const char *body, const char *answer, int end) {
    csd_http_req req;
    csd_http_error perr;
    if (csd_http_req_parse(&req, job_kind, body, strlen(body), 0, &perr))
        fail_msg("%s: %s", body, perr.message);
    req.think = job_think;
    req.tool_format = job_tool_format;
    csd_http_job *j = NULL;
    assert_int_equal(csd_http_job_create(&j, &req, tok, "m", NULL, 5), 0);
    assert_int_equal(csd_http_job_begin(j, job_echo, strlen(job_echo)), 0);
    j->n_submitted = 1;
    j->refs++; /* the engine's */
    int32_t ids[2048];
    int n = ids_of(answer, ids);
    for (int i = 0; i < n; i++) {
        csd_token_event ev = {.id = ids[i]};
        if (csd_http_job_on_token(&j->choices[0], &ev)) { /* a stop string, or the one call */
            assert_true(req.n_stop > 0 || req.one_tool_call);
            break;
        }
    }
    csd_req_result res = {.end = end, .prompt_tokens = 5, .completion_tokens = n};
    if (job_oom_at_end) csd_alloc_fail_after(0);
    csd_http_job_on_done(&j->choices[0], &res);
    csd_alloc_fail_after(-1);
    json_t *out;
    if (req.stream) {
        out = json_array();
        char *s = j->out.data;
        for (char *ev = strstr(s, "data: "); ev; ev = strstr(ev, "data: ")) {
            ev += 6;
            char *e = strstr(ev, "\n\n");
            assert_non_null(e);
            json_t *v = !strncmp(ev, "[DONE]", 6) ? json_string("[DONE]")
                                                   : json_loadb(ev, (size_t)(e - ev), 0, NULL);
            assert_non_null(v);
            json_array_append_new(out, v);
            ev = e;
        }
    } else {
        int status = 0;
        char *s = csd_http_job_response(j, &status);
        assert_int_equal(status, job_oom_at_end ? 500 : 200);
        out = json_loads(s, 0, NULL);
        free(s);
    }
    csd_http_job_release(j);
    csd_http_req_fini(&req);
    return out;
}

static void assert_call(const json_t *call, const char *name, const char *args) {
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
    const char *id = json_string_value(json_object_get(call, "id"));
    assert_non_null(id);
    assert_int_equal(strncmp(id, "call_", 5), 0);
    assert_int_equal(strlen(id), 5 + 24);
    const json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), name);
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), args);
}

#define AUTO_BODY "{" USER ",\"tools\":[" WEATHER "]"
#define ANSWER "I will look.\n" CALL("get_weather", "{\"city\": \"Paris\"}") "\n"

/* The job of body (a request without its closing brace) answering `answer` is one call (name,
 * args) and no content: in the message, with finish_reason "tool_calls", and streamed. */
static void expect_call_answer(csd_tok *tok, const char *body, const char *answer,
                               const char *name, const char *args) {
    char full[1024];
    snprintf(full, sizeof full, "%s}", body);
    json_t *r = run_job(tok, full, answer, CSD_REQ_END_STOP);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    assert_call(json_array_get(json_object_get(msg, "tool_calls"), 0), name, args);
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")),
                        "tool_calls");
    json_decref(r);
    snprintf(full, sizeof full, "%s,\"stream\":true}", body);
    json_t *evs = run_job(tok, full, answer, CSD_REQ_END_STOP);
    int n_calls = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        json_t *delta = json_object_get(json_array_get(json_object_get(ev, "choices"), 0), "delta");
        const char *c = json_string_value(json_object_get(delta, "content"));
        assert_true(!c || !*c); /* no text: the answer is the call */
        json_t *call = json_array_get(json_object_get(delta, "tool_calls"), 0);
        if (call) assert_call(call, name, args);
        n_calls += call != NULL;
    }
    assert_int_equal(n_calls, 1);
    json_decref(evs);
}

static void test_job_auto(void **state) {
    csd_tok *tok = *state;
    json_t *r = run_job(tok, AUTO_BODY "}", ANSWER, CSD_REQ_END_STOP);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "I will look.");
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    assert_call(json_array_get(json_object_get(msg, "tool_calls"), 0), "get_weather",
                "{\"city\": \"Paris\"}");
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")),
                        "tool_calls");
    json_decref(r);
    /* a stop string after a whole call: the call stands, and so does "tool_calls" */
    r = run_job(tok, AUTO_BODY ",\"stop\":[\"\\nDone\"]}", ANSWER "\nDone.", CSD_REQ_END_STOP);
    choice = json_array_get(json_object_get(r, "choices"), 0);
    assert_int_equal(json_array_size(json_object_get(json_object_get(choice, "message"),
                                                     "tool_calls")),
                     1);
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")),
                        "tool_calls");
    json_decref(r);
    /* parallel_tool_calls false: the answer ends at its first call */
    r = run_job(tok, AUTO_BODY ",\"parallel_tool_calls\":false}",
                CALL("get_weather", "{\"city\": \"A\"}") CALL("get_weather", "{\"city\": \"B\"}"),
                CSD_REQ_END_STOP);
    choice = json_array_get(json_object_get(r, "choices"), 0);
    msg = json_object_get(choice, "message");
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")),
                        "tool_calls");
    json_decref(r);
    /* only the call: content is null */
    r = run_job(tok, AUTO_BODY "}", CALL("get_weather", "{\"city\": \"Oslo\"}"), CSD_REQ_END_STOP);
    msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    json_decref(r);
    /* without tools the tags are text */
    r = run_job(tok, "{" USER "}", ANSWER, CSD_REQ_END_STOP);
    choice = json_array_get(json_object_get(r, "choices"), 0);
    msg = json_object_get(choice, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), ANSWER);
    assert_null(json_object_get(msg, "tool_calls"));
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
    json_decref(r);
}

/* Bare calls (Llama 3.1's format): the answer is the calls; streamed, they come at its end; an
 * answer that is not calls is content as it streams; parallel_tool_calls false keeps one. */
static void test_job_bare(void **state) {
    csd_tok *tok = *state;
    job_tool_format = CSD_TOOL_SPLIT_BARE;
    const char *answer = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    expect_call_answer(tok, AUTO_BODY, answer, "get_weather", "{\"city\": \"Paris\"}");
    json_t *r = run_job(tok, AUTO_BODY "}", "Paris is sunny.", CSD_REQ_END_STOP);
    json_t *msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Paris is sunny.");
    assert_null(json_object_get(msg, "tool_calls"));
    json_decref(r);
    char two[256];
    snprintf(two, sizeof two, "%s; %s", answer, answer);
    r = run_job(tok, AUTO_BODY "}", two, CSD_REQ_END_STOP);
    msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 2);
    json_decref(r);
    r = run_job(tok, AUTO_BODY ",\"parallel_tool_calls\":false}", two, CSD_REQ_END_STOP);
    msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    json_decref(r);
    /* a JSON response_format asked for JSON, not calls: the object is the content */
    r = run_job(tok, AUTO_BODY ",\"response_format\":{\"type\":\"json_object\"}}", answer,
                CSD_REQ_END_STOP);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    msg = json_object_get(choice, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), answer);
    assert_null(json_object_get(msg, "tool_calls"));
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
    json_decref(r);
    /* an answer held back to its end (not calls) that cannot be handed out: an error, not a 200
     * with the text lost */
    job_oom_at_end = true;
    r = run_job(tok, AUTO_BODY "}", "{not a call}", CSD_REQ_END_STOP);
    job_oom_at_end = false;
    const char *why = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
    if (!why || !strstr(why, "out of memory while finishing the answer"))
        fail_msg("%s", why ? why : "no error message");
    json_decref(r);
    job_tool_format = CSD_TOOL_SPLIT_TAGS;
}

/* Mistral's calls through a job: the call alone, and after text, which is the content. */
static void test_job_mistral(void **state) {
    csd_tok *tok = *state;
    job_tool_format = CSD_TOOL_SPLIT_MISTRAL;
    expect_call_answer(tok, AUTO_BODY, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}",
                       "get_weather", "{\"city\": \"Oslo\"}");
    json_t *r = run_job(tok, AUTO_BODY "}",
                        "Checking. [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {}}]",
                        CSD_REQ_END_STOP);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Checking.");
    assert_call(json_array_get(json_object_get(msg, "tool_calls"), 0), "get_weather", "{}");
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")),
                        "tool_calls");
    json_decref(r);
    job_tool_format = CSD_TOOL_SPLIT_TAGS;
}

static void test_job_auto_stream(void **state) {
    csd_tok *tok = *state;
    json_t *evs = run_job(tok, AUTO_BODY ",\"stream\":true}", ANSWER, CSD_REQ_END_STOP);
    char content[256] = "";
    int n_calls = 0;
    const char *finish = NULL;
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        if (json_is_string(ev)) {
            assert_int_equal(i, json_array_size(evs) - 1); /* [DONE] last */
            continue;
        }
        json_t *choice = json_array_get(json_object_get(ev, "choices"), 0);
        json_t *delta = json_object_get(choice, "delta");
        const char *c = json_string_value(json_object_get(delta, "content"));
        if (c) strcat(content, c);
        json_t *calls = json_object_get(delta, "tool_calls");
        if (calls) {
            json_t *call = json_array_get(calls, 0);
            assert_int_equal(json_integer_value(json_object_get(call, "index")), n_calls++);
            assert_call(call, "get_weather", "{\"city\": \"Paris\"}");
        }
        if (json_is_string(json_object_get(choice, "finish_reason")))
            finish = json_string_value(json_object_get(choice, "finish_reason"));
    }
    assert_string_equal(content, "I will look.");
    assert_int_equal(n_calls, 1);
    assert_string_equal(finish, "tool_calls");
    json_decref(evs);
}

/* Tags that the vocabulary marks special are still seen (the detokenizer skips other specials). */
static void test_job_auto_special_tags(void **state) {
    csd_tok *tok = *state;
    int32_t id = 3;
    char *text = NULL;
    assert_int_equal(csd_tok_decode(tok, &id, 1, true, &text, NULL), 0);
    assert_string_equal(text, ""); /* special: skipped by a plain decode */
    csd_free(text);
    job_think = CSD_HTTP_THINK_SPLIT; /* the thinking tags too */
    json_t *r = run_job(tok, AUTO_BODY "}", "<think>x</think>" ANSWER, CSD_REQ_END_STOP);
    job_think = CSD_HTTP_THINK_OFF;
    json_t *msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")), "x");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "I will look.");
    assert_call(json_array_get(json_object_get(msg, "tool_calls"), 0), "get_weather",
                "{\"city\": \"Paris\"}");
    json_decref(r);
    /* without the split (--reasoning-format none), special-marked thinking tags stay content */
    r = run_job(tok, "{" USER "}", "<think>x</think>y", CSD_REQ_END_STOP);
    msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "<think>x</think>y");
    json_decref(r);
}

/* "required" among several tools: the answer is {"name", "arguments"}, one call, also streamed. */
static void test_job_pick(void **state) {
    expect_call_answer(*state,
                       "{" USER ",\"tools\":[" TOOL("x", "{}") "," WEATHER "],"
                       "\"tool_choice\":\"required\"",
                       "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
                       "get_weather", "{\"city\": \"Oslo\"}");
}

/* A history's tool call arguments reach the template as the object their string holds. */
static void test_request_history_arguments(void **state) {
    (void)state;
    csd_http_req r;
    parse_ok("{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\","
             "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
             "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": [1, 2]}\"}},{\"id\":\"c2\",\"type\":"
             "\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}}]}]}",
             &r);
    json_t *calls = json_object_get(json_array_get(r.messages, 1), "tool_calls");
    json_t *f0 = json_object_get(json_array_get(calls, 0), "function");
    json_t *f1 = json_object_get(json_array_get(calls, 1), "function");
    json_t *a0 = json_object_get(f0, "arguments"), *a1 = json_object_get(f1, "arguments");
    assert_true(json_is_object(a0));
    assert_int_equal(json_array_size(json_object_get(a0, "a")), 2);
    assert_string_equal(json_string_value(a1), "not json"); /* not an object: kept */
    csd_http_req_fini(&r);
}

/* Thinking first, then a call: reasoning_content, no content, the call; streamed the same. */
static void test_job_think_then_call(void **state) {
    csd_tok *tok = *state;
    const char *answer = "<think>\nI should call it.\n</think>\n\n" CALL("get_weather", "{}");
    job_think = CSD_HTTP_THINK_SPLIT;
    json_t *r = run_job(tok, AUTO_BODY "}", answer, CSD_REQ_END_STOP);
    json_t *msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")),
                        "I should call it.");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_call(json_array_get(json_object_get(msg, "tool_calls"), 0), "get_weather", "{}");
    json_decref(r);
    json_t *evs = run_job(tok, AUTO_BODY ",\"stream\":true}", answer, CSD_REQ_END_STOP);
    char reasoning[128] = "", content[128] = "";
    int n_calls = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        json_t *delta = json_object_get(json_array_get(json_object_get(ev, "choices"), 0), "delta");
        const char *t = json_string_value(json_object_get(delta, "reasoning_content"));
        if (t) strcat(reasoning, t);
        t = json_string_value(json_object_get(delta, "content"));
        if (t) strcat(content, t);
        if (json_object_get(delta, "tool_calls")) n_calls++;
    }
    assert_string_equal(reasoning, "I should call it.");
    assert_string_equal(content, "");
    assert_int_equal(n_calls, 1);
    json_decref(evs);
    /* without the split (--reasoning-format none), the thinking is content */
    job_think = CSD_HTTP_THINK_OFF;
    r = run_job(tok, "{" USER "}", "<think>x</think>y", CSD_REQ_END_STOP);
    msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "<think>x</think>y");
    assert_null(json_object_get(msg, "reasoning_content"));
    json_decref(r);
}

/* Counts the a's of the content deltas in a stream's text. */
static size_t count_content_as(const char *text) {
    size_t as = 0;
    for (const char *p = strstr(text, "\"content\":\""); p; p = strstr(p + 1, "\"content\":\""))
        for (p += 11; *p == 'a'; p++) as++;
    return as;
}

/* A stream keeps only what waits to be sent, whatever the answer's length: read as it comes,
 * what was read is gone at once; read slowly from a backlog, the sent part is dropped once it is
 * the larger half. Every token's text is sent either way. */
static void test_job_stream_forgets_sent(void **state) {
    csd_tok *tok = *state;
    csd_http_req req;
    csd_http_error perr;
    const char *body = "{" USER ",\"stream\":true}";
    if (csd_http_req_parse(&req, CSD_HTTP_KIND_CHAT, body, strlen(body), 0, &perr))
        fail_msg("%s", perr.message);
    csd_http_job *j = NULL;
    assert_int_equal(csd_http_job_create(&j, &req, tok, "m", NULL, 5), 0);
    assert_int_equal(csd_http_job_begin(j, "", 0), 0);
    j->n_submitted = 1;
    j->refs++; /* the engine's */
    atomic_int stopping = 0;
    enum { TOKENS = 3000 };
    csd_token_event ev = {.id = 'a'};
    char buf[1001];
    size_t as = 0, largest = 0;
    for (int i = 0; i < TOKENS; i++) { /* a reader that keeps up */
        assert_false(csd_http_job_on_token(&j->choices[0], &ev));
        if (j->out.len > largest) largest = j->out.len; /* what waits to be sent */
        while (j->out_sent < j->out.len) {
            ssize_t n = csd_http_job_read(j, buf, sizeof buf - 1, -1, &stopping);
            assert_true(n > 0);
            buf[n] = 0;
            as += count_content_as(buf);
        }
    }
    assert_int_equal(as, TOKENS);
    assert_true(largest < 4096); /* one token's chunks (and the first's role), never the stream */
    for (int i = 0; i < TOKENS; i++) /* a reader that fell behind */
        assert_false(csd_http_job_on_token(&j->choices[0], &ev));
    size_t backlog = j->out.len;
    assert_true(backlog > 4 * 65536);
    csd_http_buf read = {0};
    bool dropped_early = false;
    while (j->out_sent < j->out.len) {
        ssize_t n = csd_http_job_read(j, buf, sizeof buf - 1, -1, &stopping);
        assert_true(n > 0);
        assert_int_equal(csd_http_buf_append(&read, buf, (size_t)n), 0);
        if (j->out_sent < j->out.len && j->out.len < backlog) dropped_early = true;
    }
    assert_true(dropped_early); /* the sent half went before the rest was read */
    assert_int_equal(read.len, backlog);
    assert_int_equal(count_content_as(read.data), TOKENS); /* nothing lost or repeated */
    csd_http_buf_fini(&read);
    csd_req_result res = {.end = CSD_REQ_END_STOP, .prompt_tokens = 5,
                          .completion_tokens = 2 * TOKENS};
    csd_http_job_on_done(&j->choices[0], &res);
    csd_http_job_release(j);
    csd_http_req_fini(&req);
}

/* Completions' text_offset is where each token's text starts, in characters, also when a stop
 * string held a token's text back until the next one (streamed or not), and when a token's text
 * begins with the U+FFFD of a character the token before began (a byte token) and it broke. */
static void check_text_offsets(csd_tok *tok, const char *answer, const char *text) {
    job_kind = CSD_HTTP_KIND_COMPLETION;
    const char *body = "{\"prompt\":\"x\",\"logprobs\":1,\"stop\":[\"zz\"]";
    char stream_body[128];
    snprintf(stream_body, sizeof stream_body, "%s,\"stream\":true}", body);
    char plain_body[128];
    snprintf(plain_body, sizeof plain_body, "%s}", body);
    job_echo = "x\xC3\xA9";
    json_t *r = run_job(tok, plain_body, answer, CSD_REQ_END_STOP);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(choice, "text")), text);
    json_t *offsets = json_object_get(json_object_get(choice, "logprobs"), "text_offset");
    assert_int_equal(json_array_size(offsets), 5);
    for (int i = 0; i < 5; i++) /* five tokens of one character each: characters 2 to 6 */
        assert_int_equal(json_integer_value(json_array_get(offsets, (size_t)i)), 2 + i);
    json_decref(r);
    json_t *evs = run_job(tok, stream_body, answer, CSD_REQ_END_STOP);
    int seen = 0;
    for (size_t i = 0; i < json_array_size(evs); i++) {
        json_t *ch = json_array_get(json_object_get(json_array_get(evs, i), "choices"), 0);
        json_t *lp = json_object_get(ch, "logprobs");
        json_t *o = json_object_get(lp, "text_offset");
        for (size_t k = 0; k < json_array_size(o); k++, seen++)
            assert_int_equal(json_integer_value(json_array_get(o, k)), 2 + seen);
    }
    assert_int_equal(seen, 5);
    json_decref(evs);
}

static void test_job_completion_text_offset(void **state) {
    /* "z" waits for "q"; "é" is one character of two bytes, in the echoed prompt and the answer */
    check_text_offsets(*state, "a\xC3\xA9" "bzq", "x\xC3\xA9" "a\xC3\xA9" "bzq");
    /* the lone byte token <0xC3>: "b" breaks its character, whose U+FFFD is the byte token's */
    check_text_offsets(*state, "a\xC3" "bzq", "x\xC3\xA9" "a\xEF\xBF\xBD" "bzq");
}

/* Each token's logprobs come exactly once, with its thinking or its content, streamed or not. */
static void test_job_think_logprobs(void **state) {
    csd_tok *tok = *state;
    const char *answer = "<think>ab</think>cd";
    int32_t ids[64];
    size_t n_tokens = (size_t)ids_of(answer, ids);
    job_think = CSD_HTTP_THINK_SPLIT;
    json_t *r = run_job(tok, "{" USER ",\"logprobs\":true}", answer, CSD_REQ_END_STOP);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    assert_int_equal(json_array_size(json_object_get(json_object_get(choice, "logprobs"),
                                                     "content")),
                     n_tokens);
    json_decref(r);
    json_t *evs = run_job(tok, "{" USER ",\"logprobs\":true,\"stream\":true}", answer,
                          CSD_REQ_END_STOP);
    job_think = CSD_HTTP_THINK_OFF;
    size_t counted = 0, on_thinking = 0, i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
        json_t *lp = json_object_get(json_object_get(ch, "logprobs"), "content");
        if (!lp) continue;
        counted += json_array_size(lp);
        json_t *delta = json_object_get(ch, "delta");
        if (json_object_get(delta, "reasoning_content")) on_thinking++;
    }
    assert_int_equal(counted, n_tokens);
    assert_int_equal(on_thinking, 2); /* "a" and "b" carry theirs on their thinking chunks */
    json_decref(evs);
}

#define NAMED_BODY                                                                               \
    "{" USER ",\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":" \
    "{\"name\":\"get_weather\"}}"

static void test_job_named(void **state) {
    csd_tok *tok = *state;
    const char *args = "{\"city\":\"Rome\"}";
    json_t *r = run_job(tok, NAMED_BODY "}", args, CSD_REQ_END_STOP);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_call(json_array_get(json_object_get(msg, "tool_calls"), 0), "get_weather", args);
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")),
                        "tool_calls");
    json_decref(r);
    /* streamed: the id and name first, then the arguments piece by piece */
    json_t *evs = run_job(tok, NAMED_BODY ",\"stream\":true}", args, CSD_REQ_END_LENGTH);
    char joined[256] = "";
    int with_id = 0;
    size_t i;
    json_t *ev;
    const char *finish = NULL;
    json_array_foreach(evs, i, ev) {
        json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
        json_t *delta = json_object_get(ch, "delta");
        if (i > 0) assert_null(json_object_get(delta, "content")); /* the role chunk has "" */
        json_t *call = json_array_get(json_object_get(delta, "tool_calls"), 0);
        if (call) {
            assert_int_equal(json_integer_value(json_object_get(call, "index")), 0);
            if (json_object_get(call, "id")) {
                assert_int_equal(with_id++, 0);
                assert_string_equal(joined, ""); /* before any arguments */
                assert_string_equal(json_string_value(json_object_get(
                                        json_object_get(call, "function"), "name")),
                                    "get_weather");
            }
            strcat(joined, json_string_value(
                               json_object_get(json_object_get(call, "function"), "arguments")));
        }
        if (json_is_string(json_object_get(ch, "finish_reason")))
            finish = json_string_value(json_object_get(ch, "finish_reason"));
    }
    assert_int_equal(with_id, 1);
    assert_string_equal(joined, args);
    assert_string_equal(finish, "length");
    json_decref(evs);
    /* a stop string that cuts the arguments: "stop", not a finished call */
    r = run_job(tok, NAMED_BODY ",\"stop\":[\"Ro\"]}", args, CSD_REQ_END_STOP);
    choice = json_array_get(json_object_get(r, "choices"), 0);
    msg = json_object_get(choice, "message");
    assert_call(json_array_get(json_object_get(msg, "tool_calls"), 0), "get_weather",
                "{\"city\":\"");
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
    json_decref(r);
}

/* The job settings back to their defaults, whatever a failed test left. */
static void job_defaults(void) {
    job_think = CSD_HTTP_THINK_OFF;
    job_kind = CSD_HTTP_KIND_CHAT;
    job_echo = "";
    job_tool_format = CSD_TOOL_SPLIT_TAGS;
    job_oom_at_end = false;
}

static int setup_tok(void **state) {
    job_defaults();
    *state = char_tokenizer(false);
    return 0;
}

static int setup_tok_special(void **state) {
    job_defaults();
    *state = char_tokenizer(true);
    return 0;
}

static int teardown_tok(void **state) {
    csd_tok_destroy(*state);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_plain_text),
        cmocka_unit_test(test_split_one_call),
        cmocka_unit_test(test_split_calls_and_whitespace),
        cmocka_unit_test(test_split_bad_call_is_content),
        cmocka_unit_test(test_split_call_forms),
        cmocka_unit_test(test_split_whole_mode),
        cmocka_unit_test(test_split_bounds),
        cmocka_unit_test(test_split_random),
        cmocka_unit_test(test_split_bare),
        cmocka_unit_test(test_split_mistral),
        cmocka_unit_test(test_split_mode_for_template),
        cmocka_unit_test(test_split_numbers_kept),
        cmocka_unit_test(test_split_bound_exact),
        cmocka_unit_test(test_split_long_call_skipped),
        cmocka_unit_test(test_split_cut_close_tag),
        cmocka_unit_test(test_split_long_space),
        cmocka_unit_test(test_request_modes),
        cmocka_unit_test(test_request_pick_schema),
        cmocka_unit_test(test_request_refusals),
        cmocka_unit_test(test_request_history_arguments),
        cmocka_unit_test_setup_teardown(test_job_auto, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_auto_stream, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_named, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_pick, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_bare, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_mistral, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_think_then_call, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_think_logprobs, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_completion_text_offset, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_stream_forgets_sent, setup_tok, teardown_tok),
        cmocka_unit_test_setup_teardown(test_job_auto_special_tags, setup_tok_special,
                                        teardown_tok),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
