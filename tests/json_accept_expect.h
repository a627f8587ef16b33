/* json_accept_expect: what the tests of constrained answers (test_model_json_schema,
 * test_http_tool_calls) check of the acceptor under a schema: answers accepted to their end, and
 * texts refused at the exact byte a '|' marks. Include after <cmocka.h>. */
#ifndef CSD_TEST_JSON_ACCEPT_EXPECT_H
#define CSD_TEST_JSON_ACCEPT_EXPECT_H

#include <stdio.h>
#include <string.h>

#include "model/json_accept.h"
#include "model/json_schema.h"

/* Feeds s to a byte by byte; returns how many bytes it took (the first refused one's place). */
static size_t feed(csd_json_accept *a, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if (!csd_json_accept_byte(a, (uint8_t)s[i])) return i;
    return n;
}

/* Each of the n answers is accepted to its end, and complete there. */
static void expect_accepted(const csd_json_schema *s, const char *const *answers, size_t n) {
    for (size_t i = 0; i < n; i++) {
        csd_json_accept a;
        csd_json_accept_init_schema(&a, s);
        size_t at = feed(&a, answers[i]);
        if (at != strlen(answers[i]) || !csd_json_accept_done(&a))
            fail_msg("answer %zu refused at byte %zu: %s", i, at, answers[i]);
    }
}

/* Each of the n texts, with its '|' taken out, is refused at the byte the '|' marked. */
static void expect_refused_at_bar(const csd_json_schema *s, const char *const *texts, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *bar = strchr(texts[i], '|');
        char text[256];
        size_t at = (size_t)(bar - texts[i]);
        snprintf(text, sizeof text, "%.*s%s", (int)at, texts[i], bar + 1);
        csd_json_accept a;
        csd_json_accept_init_schema(&a, s);
        size_t got = feed(&a, text);
        if (got != at) fail_msg("text %zu: refused at %zu, want %zu: %s", i, got, at, text);
    }
}

#endif
