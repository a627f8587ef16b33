/* The thinking splitter: <think>...</think> at the start of an answer (or after a prompt that
 * opened it) becomes reasoning, the rest content; any chunking gives the same split; an answer that
 * does not think comes out whole; whitespace runs are bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/think_split.h"

typedef struct split_result {
    char *text[2]; /* reasoning, content */
    size_t len[2];
} split_result;

static void add(split_result *r, int k, const char *s, size_t n) {
    r->text[k] = realloc(r->text[k], r->len[k] + n + 1);
    memcpy(r->text[k] + r->len[k], s, n);
    r->len[k] += n;
    r->text[k][r->len[k]] = 0;
}

static void result_free(split_result *r) {
    free(r->text[0]);
    free(r->text[1]);
}

/* Splits text pushed in pieces of the given sizes (cycled; NULL: all at once). */
static void split(const char *text, bool open, const size_t *sizes, int n_sizes,
                  split_result *r) {
    memset(r, 0, sizeof *r);
    add(r, 0, "", 0);
    add(r, 1, "", 0);
    csd_think_split s;
    csd_think_split_init(&s, open);
    size_t len = strlen(text), at = 0;
    const char *rs, *cs;
    size_t rn, cn;
    for (int k = 0; at < len; k++) {
        size_t step = sizes ? sizes[k % n_sizes] : len;
        if (step > len - at) step = len - at;
        assert_int_equal(csd_think_split_push(&s, text + at, step, &rs, &rn, &cs, &cn), 0);
        add(r, 0, rs, rn);
        add(r, 1, cs, cn);
        at += step;
    }
    assert_int_equal(csd_think_split_finish(&s, &rs, &rn, &cs, &cn), 0);
    add(r, 0, rs, rn);
    add(r, 1, cs, cn);
    csd_think_split_fini(&s);
}

/* The split of text whole, which every other chunking must equal. */
static void split_every_way(const char *text, bool open, split_result *r) {
    static const size_t chunkings[][3] = {{1, 1, 1}, {2, 3, 5}, {7, 1, 4}, {9, 10, 11}};
    split(text, open, NULL, 0, r);
    for (size_t c = 0; c < sizeof chunkings / sizeof chunkings[0]; c++) {
        split_result other;
        split(text, open, chunkings[c], 3, &other);
        assert_string_equal(other.text[0], r->text[0]);
        assert_string_equal(other.text[1], r->text[1]);
        result_free(&other);
    }
}

static void expect(const char *text, bool open, const char *reasoning, const char *content) {
    split_result r;
    split_every_way(text, open, &r);
    assert_string_equal(r.text[0], reasoning);
    assert_string_equal(r.text[1], content);
    result_free(&r);
}

static void test_thinking_then_answer(void **state) {
    (void)state;
    expect("<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!", false,
           "The user greets me.\nI greet back.", "Hello!");
    expect("\n <think>x</think>y", false, "x", "y");              /* whitespace before the tag */
    expect("<think>\n\n</think>\n\nHi there", false, "", "Hi there"); /* thinking turned off */
    expect("<think>a</think>\n\n<tool_call>{}</tool_call>\n", false, "a",
           "<tool_call>{}</tool_call>\n"); /* the answer is passed on as written */
}

static void test_no_thinking_is_content(void **state) {
    (void)state;
    const char *texts[] = {"Hello!", "  spaced  \n", "<thinking>no</thinking>", "<thi",
                           "a <think>b</think>", "</think>x", "", "\n\n"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        expect(texts[i], false, "", texts[i]); /* byte for byte */
}

static void test_open_and_cut(void **state) {
    (void)state;
    /* the prompt opened <think>: the answer starts inside it */
    expect("Let me think.\n</think>\n\nDone.", true, "Let me think.", "Done.");
    expect("\nstill thinking", true, "still thinking", "");      /* never closed */
    expect("<think>cut short by max_tokens  \n", false, "cut short by max_tokens", "");
    expect("<think>half a tag </thi", false, "half a tag </thi", "");
    expect("<think>a</think>b</think>c", false, "a", "b</think>c"); /* only the first closes */
}

/* A whitespace run longer than CSD_THINK_SPACE_MAX before </think>: only its last
 * CSD_THINK_SPACE_MAX bytes are dropped. Before the answer starts, a longer run makes it
 * content. */
static void test_long_space(void **state) {
    (void)state;
    size_t run = 2 * CSD_THINK_SPACE_MAX + 5;
    char *text = malloc(run + 64);
    strcpy(text, "<think>x");
    memset(text + 8, ' ', run);
    strcpy(text + 8 + run, "</think>y");
    split_result r;
    split_every_way(text, false, &r);
    assert_int_equal(r.len[0], 1 + run - CSD_THINK_SPACE_MAX);
    assert_string_equal(r.text[1], "y");
    result_free(&r);
    memset(text, '\n', CSD_THINK_SPACE_MAX + 1);
    strcpy(text + CSD_THINK_SPACE_MAX + 1, "<think>x</think>y");
    split_every_way(text, false, &r);
    assert_string_equal(r.text[0], "");
    assert_string_equal(r.text[1], text);
    result_free(&r);
    free(text);
}

/* Random answers from fragments that make and break tags: every chunking splits the same, and an
 * answer that does not start with the tag (after whitespace) is all content. */
static void test_random(void **state) {
    (void)state;
    static const char *frags[] = {"<think>", "</think>", "<thi", "nk>", "</thi", "\n", " ", "a",
                                  "b c", "<", ">", "/"};
    unsigned seed = 777;
    for (int t = 0; t < 500; t++) {
        char text[256] = {0};
        int parts = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 10;
        for (int p = 0; p < parts; p++) {
            seed = seed * 1103515245u + 12345u;
            strcat(text, frags[(seed >> 16) % (sizeof frags / sizeof frags[0])]);
        }
        for (int open = 0; open < 2; open++) {
            split_result r;
            split_every_way(text, open, &r);
            const char *p = text;
            while (*p == ' ' || *p == '\n') p++;
            if (!open && strncmp(p, "<think>", 7)) assert_string_equal(r.text[1], text);
            result_free(&r);
        }
    }
}

/* A prompt that ends inside <think> opens the answer's thinking. */
static void test_prompt_opens(void **state) {
    (void)state;
    assert_true(csd_think_prompt_opens("<|Assistant|><think>\n"));
    assert_true(csd_think_prompt_opens("<think>"));
    assert_false(csd_think_prompt_opens("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert_false(csd_think_prompt_opens("<|im_start|>assistant\n"));
    assert_false(csd_think_prompt_opens("think>"));
    assert_false(csd_think_prompt_opens(""));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thinking_then_answer), cmocka_unit_test(test_no_thinking_is_content),
        cmocka_unit_test(test_open_and_cut),         cmocka_unit_test(test_long_space),
        cmocka_unit_test(test_random),           cmocka_unit_test(test_prompt_opens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
