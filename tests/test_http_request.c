/* test_http_request: the OpenAI request parser accepts every documented parameter in each of its
 * forms, applies OpenAI defaults, ignores unknown fields, and refuses every bad type and range with
 * a 400 that names the field. Also the stop-string hold-back helper (stop_text). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "http/openai_request.h"
#include "http/stop_text.h"
#include "model/json_accept.h"

static int parse(csd_http_req *r, int kind, const char *body, csd_http_error *e) {
    return csd_http_req_parse(r, kind, body, strlen(body), 1000, e);
}

#define CHAT CSD_HTTP_KIND_CHAT
#define COMP CSD_HTTP_KIND_COMPLETION
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

/* Parses a chat body made of MSGS plus extra fields and expects a 400 naming field. */
static void expect_chat_error(const char *extra, const char *field) {
    char body[2048];
    snprintf(body, sizeof body, "{" MSGS "%s%s}", extra[0] ? "," : "", extra);
    csd_http_req r;
    csd_http_error e;
    int rc = parse(&r, CHAT, body, &e);
    if (rc == 0 || e.status != 400 || strcmp(e.param, field) != 0)
        fail_msg("body %s: rc=%d status=%d param='%s' (want '%s') msg=%s", body, rc, e.status,
                 e.param, field, e.message);
    assert_string_equal(e.type, "invalid_request_error");
    assert_non_null(strstr(e.message, field)); /* the message names the field too */
    csd_http_req_fini(&r);
}

static void expect_error(int kind, const char *body, int status, const char *field) {
    csd_http_req r;
    csd_http_error e;
    int rc = parse(&r, kind, body, &e);
    if (rc == 0 || e.status != status || strcmp(e.param, field) != 0)
        fail_msg("body %s: rc=%d status=%d param='%s' (want %d '%s') msg=%s", body, rc, e.status,
                 e.param, status, field, e.message);
    csd_http_req_fini(&r);
}

static void test_chat_minimal_defaults(void **state) {
    (void)state;
    csd_http_req r;
    csd_http_error e;
    assert_int_equal(parse(&r, CHAT, "{\"model\":\"m\"," MSGS "}", &e), 0);
    assert_int_equal(r.kind, CHAT);
    assert_string_equal(r.model, "m");
    assert_false(r.stream);
    assert_false(r.include_usage);
    assert_int_equal(r.max_tokens, 0);
    assert_true(fabsf(r.sampling.temperature - 1.0f) < 1e-6f);
    assert_true(fabsf(r.sampling.top_p - 1.0f) < 1e-6f);
    assert_int_equal(r.sampling.top_k, 0);
    assert_true(r.sampling.min_p == 0.0f);
    assert_true(r.sampling.repetition_penalty == 1.0f);
    assert_int_equal(r.sampling.penalty_scope, CSD_PENALTY_OPENAI); /* the answer's tokens */
    assert_false(r.has_seed);
    assert_int_equal(r.n_stop, 0);
    assert_false(r.logprobs);
    assert_false(r.ignore_eos);
    assert_int_equal(r.n, 1);
    assert_null(r.tools);
    assert_int_equal(json_array_size(r.messages), 1);
    json_t *m = json_array_get(r.messages, 0);
    assert_string_equal(json_string_value(json_object_get(m, "role")), "user");
    assert_string_equal(json_string_value(json_object_get(m, "content")), "hi");
    csd_http_req_fini(&r);
}

static void test_chat_every_parameter(void **state) {
    (void)state;
    const char *body =
        "{\"model\":\"tiny\",\"messages\":["
        "{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"developer\",\"content\":\"dev\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
        "\"text\":\"b\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
        "\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"name\":\"f\",\"content\":\"42\"}],"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":5,"
        "\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,"
        "\"seed\":-3,\"stop\":[\"x\",\"yy\"],\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
        "\"repetition_penalty\":1.1,\"logprobs\":true,\"top_logprobs\":3,\"n\":3,\"user\":\"u1\","
        "\"ignore_eos\":true,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
        "\"tool_choice\":\"auto\",\"response_format\":{\"type\":\"text\"},"
        "\"some_future_field\":{\"ignored\":[1,2,3]},\"metadata\":null}";
    csd_http_req r;
    csd_http_error e;
    int rc = parse(&r, CHAT, body, &e);
    if (rc) fail_msg("%s (%s)", e.message, e.param);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_int_equal(r.max_tokens, 7); /* max_completion_tokens wins */
    assert_true(fabsf(r.sampling.temperature - 0.5f) < 1e-6f);
    assert_true(fabsf(r.sampling.top_p - 0.9f) < 1e-6f);
    assert_int_equal(r.sampling.top_k, 40);
    assert_true(fabsf(r.sampling.min_p - 0.05f) < 1e-6f);
    assert_true(r.has_seed);
    assert_true(r.sampling.seed == (uint64_t)(int64_t)-3);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "x");
    assert_string_equal(r.stop[1], "yy");
    assert_true(fabsf(r.sampling.presence_penalty - 0.5f) < 1e-6f);
    assert_true(fabsf(r.sampling.frequency_penalty + 0.5f) < 1e-6f);
    assert_true(fabsf(r.sampling.repetition_penalty - 1.1f) < 1e-6f);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_true(r.ignore_eos);
    assert_int_equal(r.n, 3);
    assert_string_equal(r.user, "u1");
    assert_false(r.json_object); /* response_format text */
    assert_non_null(r.tools);
    assert_string_equal(json_string_value(r.tool_choice), "auto");
    assert_int_equal(json_array_size(r.messages), 5);
    json_t *dev = json_array_get(r.messages, 1);
    assert_string_equal(json_string_value(json_object_get(dev, "role")), "system");
    json_t *parts = json_array_get(r.messages, 2);
    assert_string_equal(json_string_value(json_object_get(parts, "content")), "a\nb");
    json_t *asst = json_array_get(r.messages, 3);
    assert_true(json_is_null(json_object_get(asst, "content")));
    assert_int_equal(json_array_size(json_object_get(asst, "tool_calls")), 1);
    json_t *tool = json_array_get(r.messages, 4);
    assert_string_equal(json_string_value(json_object_get(tool, "tool_call_id")), "c1");
    assert_string_equal(json_string_value(json_object_get(tool, "name")), "f");
    csd_http_req_fini(&r);
}

static void test_nulls_are_absent(void **state) {
    (void)state;
    csd_http_req r;
    csd_http_error e;
    assert_int_equal(
        parse(&r, CHAT,
              "{" MSGS ",\"model\":null,\"stream\":null,\"temperature\":null,\"stop\":null,"
              "\"max_tokens\":null,\"seed\":null,\"tools\":null,\"n\":null,\"logprobs\":null}",
              &e),
        0);
    assert_null(r.model);
    assert_false(r.has_seed);
    assert_true(r.sampling.temperature == 1.0f);
    csd_http_req_fini(&r);
}

static void test_stop_forms(void **state) {
    (void)state;
    csd_http_req r;
    csd_http_error e;
    assert_int_equal(parse(&r, CHAT, "{" MSGS ",\"stop\":\"END\"}", &e), 0);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "END");
    csd_http_req_fini(&r);
    assert_int_equal(parse(&r, CHAT, "{" MSGS ",\"stop\":[]}", &e), 0);
    assert_int_equal(r.n_stop, 0);
    csd_http_req_fini(&r);
    char body[1024] = "{" MSGS ",\"stop\":[";
    for (int i = 0; i < 16; i++)
        strcat(body, i ? ",\"s\"" : "\"s\"");
    strcat(body, "]}");
    assert_int_equal(parse(&r, CHAT, body, &e), 0);
    assert_int_equal(r.n_stop, 16);
    csd_http_req_fini(&r);
    body[strlen(body) - 2] = 0;
    strcat(body, ",\"s\"]}");
    expect_error(CHAT, body, 400, "stop"); /* 17 */
}

static void test_chat_type_errors(void **state) {
    (void)state;
    expect_chat_error("\"model\":3", "model");
    expect_chat_error("\"stream\":\"yes\"", "stream");
    expect_chat_error("\"stream_options\":true", "stream_options");
    expect_chat_error("\"stream_options\":{\"include_usage\":1}", "stream_options.include_usage");
    expect_chat_error("\"max_tokens\":\"5\"", "max_tokens");
    expect_chat_error("\"max_tokens\":1.5", "max_tokens");
    expect_chat_error("\"max_completion_tokens\":[]", "max_completion_tokens");
    expect_chat_error("\"temperature\":\"hot\"", "temperature");
    expect_chat_error("\"top_p\":true", "top_p");
    expect_chat_error("\"top_k\":2.5", "top_k");
    expect_chat_error("\"min_p\":{}", "min_p");
    expect_chat_error("\"seed\":1.5", "seed");
    expect_chat_error("\"stop\":5", "stop");
    expect_chat_error("\"stop\":[\"a\",5]", "stop");
    expect_chat_error("\"presence_penalty\":\"x\"", "presence_penalty");
    expect_chat_error("\"frequency_penalty\":\"x\"", "frequency_penalty");
    expect_chat_error("\"repetition_penalty\":[1]", "repetition_penalty");
    expect_chat_error("\"logprobs\":1", "logprobs");
    expect_chat_error("\"top_logprobs\":\"2\"", "top_logprobs");
    expect_chat_error("\"n\":\"1\"", "n");
    expect_chat_error("\"ignore_eos\":1", "ignore_eos");
    expect_chat_error("\"user\":5", "user");
    expect_chat_error("\"tools\":{}", "tools");
    expect_chat_error("\"tools\":[5]", "tools[0]");
    expect_chat_error("\"tool_choice\":5", "tool_choice");
    expect_chat_error("\"response_format\":\"json\"", "response_format");
    expect_chat_error("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}",
                      "response_format.json_schema.schema");
    expect_chat_error("\"response_format\":{\"type\":\"json_schema\"}",
                      "response_format.json_schema");
    expect_chat_error("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                      "{\"name\":5,\"schema\":{}}}",
                      "response_format.json_schema.name");
    expect_chat_error("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                      "{\"schema\":{\"type\":\"object\",\"minProperties\":1}}}",
                      "response_format.json_schema.schema");
    expect_chat_error("\"response_format\":{\"type\":\"yaml\"}", "response_format");
    expect_chat_error("\"response_format\":{\"type\":7}", "response_format.type");
}

/* response_format json_object: the answer is to be one JSON object, on both endpoints; json_schema
 * also carries the compiled schema */
static void test_response_format_json_object(void **state) {
    (void)state;
    static const char *const bodies[] = {
        "{" MSGS ",\"response_format\":{\"type\":\"json_object\"}}",
        "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}",
    };
    for (int i = 0; i < 2; i++) {
        csd_http_req r;
        csd_http_error e;
        if (parse(&r, i == 0 ? CHAT : CSD_HTTP_KIND_COMPLETION, bodies[i], &e))
            fail_msg("%s: %s", bodies[i], e.message);
        assert_true(r.json_object);
        assert_null(r.json_schema);
        csd_http_req_fini(&r);
    }
    /* json_schema: compiled with the request, owned by it */
    const char *body = "{" MSGS ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                       "{\"name\":\"a\",\"strict\":true,\"schema\":{\"type\":\"object\","
                       "\"properties\":{\"ok\":{\"type\":\"boolean\"}},\"required\":[\"ok\"]}}}}";
    csd_http_req r;
    csd_http_error e;
    if (parse(&r, CHAT, body, &e)) fail_msg("%s: %s", body, e.message);
    assert_true(r.json_object);
    assert_non_null(r.json_schema);
    csd_json_accept a, b;
    csd_json_accept_init_schema(&a, r.json_schema);
    b = a;
    assert_false(csd_json_accept_bytes(&b, (const uint8_t *)"{}", 2));       /* ok is required */
    assert_false(csd_json_accept_bytes(&b, (const uint8_t *)"{\"ok\":1", 7)); /* a boolean */
    assert_true(csd_json_accept_bytes(&a, (const uint8_t *)"{\"ok\":true}", 11));
    assert_true(csd_json_accept_done(&a));
    csd_http_req_fini(&r);
}

static void test_chat_range_errors(void **state) {
    (void)state;
    expect_chat_error("\"temperature\":-0.1", "temperature");
    expect_chat_error("\"temperature\":2.5", "temperature");
    expect_chat_error("\"top_p\":0", "top_p");
    expect_chat_error("\"top_p\":1.01", "top_p");
    expect_chat_error("\"top_k\":-2", "top_k");
    expect_chat_error("\"min_p\":1.5", "min_p");
    expect_chat_error("\"presence_penalty\":2.5", "presence_penalty");
    expect_chat_error("\"frequency_penalty\":-3", "frequency_penalty");
    expect_chat_error("\"repetition_penalty\":0", "repetition_penalty");
    expect_chat_error("\"repetition_penalty\":11", "repetition_penalty");
    expect_chat_error("\"max_tokens\":0", "max_tokens");
    expect_chat_error("\"max_tokens\":-5", "max_tokens");
    expect_chat_error("\"max_completion_tokens\":0", "max_completion_tokens");
    expect_chat_error("\"n\":17", "n"); /* CSD_HTTP_MAX_N choices at most */
    expect_chat_error("\"n\":0", "n");
    expect_chat_error("\"n\":1.5", "n");
    expect_chat_error("\"best_of\":3", "best_of");
    expect_chat_error("\"top_logprobs\":21", "top_logprobs");
    expect_chat_error("\"top_logprobs\":-1", "top_logprobs");
    expect_chat_error("\"top_logprobs\":2", "top_logprobs"); /* without logprobs: true */
    expect_chat_error("\"stop\":\"\"", "stop");
    char big[400];
    memset(big, 'a', 300);
    big[300] = 0;
    char extra[512];
    snprintf(extra, sizeof extra, "\"stop\":\"%s\"", big);
    expect_chat_error(extra, "stop");
    /* n beyond the cap says what the cap is */
    csd_http_req r;
    csd_http_error e;
    assert_int_not_equal(parse(&r, CHAT, "{" MSGS ",\"n\":17}", &e), 0);
    assert_non_null(strstr(e.message, "at most 16 choices"));
    csd_http_req_fini(&r);
}

static void test_messages_errors(void **state) {
    (void)state;
    expect_error(CHAT, "{}", 400, "messages");
    expect_error(CHAT, "{\"messages\":null}", 400, "messages");
    expect_error(CHAT, "{\"messages\":\"hi\"}", 400, "messages");
    expect_error(CHAT, "{\"messages\":[]}", 400, "messages");
    expect_error(CHAT, "{\"messages\":[5]}", 400, "messages[0]");
    expect_error(CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role");
    expect_error(CHAT, "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400,
                 "messages[0].role");
    expect_error(CHAT, "{\"messages\":[{\"role\":5,\"content\":\"x\"}]}", 400, "messages[0].role");
    expect_error(CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content");
    expect_error(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
                 "messages[0].content");
    expect_error(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                 "\"content\":[5]}]}",
                 400, "messages[1].content[0]");
    expect_error(CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
                 "messages[0].content[0].type");
    expect_error(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
                 400, "messages[0].content[0].text");
    expect_error(CHAT,
                 "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":5}]}", 400,
                 "messages[0].tool_calls");
    expect_error(CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":3}]}",
                 400, "messages[0].tool_call_id");
}

/* A positive value under an open bound of 0 that rounds to 0 in single precision (found by
 * fuzz_http_request): accepted as the smallest positive float, which the sampler accepts too. */
static void test_tiny_positive_values(void **state) {
    (void)state;
    csd_http_req r;
    csd_http_error e;
    const char *body = "{" MSGS ",\"top_p\":1e-60,\"repetition_penalty\":1e-60}";
    assert_int_equal(parse(&r, CHAT, body, &e), 0);
    assert_true(r.sampling.top_p > 0.0f && r.sampling.top_p < 1e-30f);
    assert_true(r.sampling.repetition_penalty > 0.0f && r.sampling.repetition_penalty < 1e-30f);
    assert_int_equal(csd_sampler_params_check(&r.sampling, 1000, NULL), 0);
    csd_http_req_fini(&r);
    expect_chat_error("\"top_p\":-1e-60", "top_p"); /* below the bound stays refused */
}

static void test_body_errors(void **state) {
    (void)state;
    csd_http_req r;
    csd_http_error e;
    assert_int_not_equal(csd_http_req_parse(&r, CHAT, "", 0, 0, &e), 0);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "invalid_json");
    assert_int_not_equal(parse(&r, CHAT, "{\"messages\":[", &e), 0);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "invalid_json");
    assert_int_not_equal(parse(&r, CHAT, "[1,2]", &e), 0);
    assert_string_equal(e.code, "invalid_json");
    assert_int_not_equal(parse(&r, CHAT, "{\"a\":1} trailing", &e), 0);
    /* an integer beyond 64 bits: jansson gives only its line and column; the error names it */
    expect_chat_error("\"seed\":18446744073709551616", "seed");
    expect_chat_error("\"stream_options\":{\"include_usage\":-99999999999999999999}",
                      "stream_options.include_usage");
    expect_chat_error("\"stop\":[\"a\",1e3,123456789012345678901234567890]", "stop[2]");
    assert_int_not_equal(parse(&r, 7, "{}", &e), 0);
    /* deep nesting is refused, not recursed into */
    char *deep = csd_alloc(200000);
    strcpy(deep, "{" MSGS ",\"tools\":[");
    size_t n = strlen(deep);
    for (int i = 0; i < 90000; i++)
        deep[n++] = '[';
    deep[n] = 0;
    assert_int_not_equal(parse(&r, CHAT, deep, &e), 0);
    assert_int_equal(e.status, 400);
    csd_free(deep);
    csd_http_req_fini(&r);
}

static void test_completion_prompt_forms(void **state) {
    (void)state;
    csd_http_req r;
    csd_http_error e;
    assert_int_equal(parse(&r, COMP, "{\"prompt\":\"Once upon\",\"echo\":true}", &e), 0);
    assert_string_equal(r.prompt, "Once upon");
    assert_int_equal(r.prompt_len, 9);
    assert_true(r.echo);
    assert_null(r.prompt_ids);
    csd_http_req_fini(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":[\"one\"]}", &e), 0);
    assert_string_equal(r.prompt, "one");
    csd_http_req_fini(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":[1,2,999]}", &e), 0);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 999);
    csd_http_req_fini(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":[[5,6]]}", &e), 0);
    assert_int_equal(r.n_prompt_ids, 2);
    csd_http_req_fini(&r);
    /* embedded NUL survives with its length */
    assert_int_equal(parse(&r, COMP, "{\"prompt\":\"a\\u0000b\"}", &e), 0);
    assert_int_equal(r.prompt_len, 3);
    csd_http_req_fini(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":\"x\",\"logprobs\":3}", &e), 0);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    csd_http_req_fini(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":\"x\",\"logprobs\":0}", &e), 0);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    csd_http_req_fini(&r);
}

static void test_completion_errors(void **state) {
    (void)state;
    expect_error(COMP, "{}", 400, "prompt");
    expect_error(COMP, "{\"prompt\":5}", 400, "prompt");
    expect_error(COMP, "{\"prompt\":[]}", 400, "prompt");
    expect_error(COMP, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt");
    expect_error(COMP, "{\"prompt\":[1,\"b\"]}", 400, "prompt");
    expect_error(COMP, "{\"prompt\":[1,-1]}", 400, "prompt");
    expect_error(COMP, "{\"prompt\":[1000]}", 400, "prompt"); /* vocab is 1000 */
    expect_error(COMP, "{\"prompt\":[[]]}", 400, "prompt");
    expect_error(COMP, "{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs");
    expect_error(COMP, "{\"prompt\":\"x\",\"logprobs\":\"3\"}", 400, "logprobs");
    expect_error(COMP, "{\"prompt\":\"x\",\"echo\":1}", 400, "echo");
    expect_error(COMP, "{\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "suffix");
    expect_error(COMP, "{\"prompt\":\"x\",\"temperature\":3}", 400, "temperature");
    expect_error(COMP, "{\"prompt\":\"x\",\"n\":99}", 400, "n");
}

/* logit_bias: token-id keys (vocab 1000 here) with biases in [-100, 100], as OpenAI. */
static void test_logit_bias(void **state) {
    (void)state;
    csd_http_req r;
    csd_http_error e;
    assert_int_equal(
        parse(&r, CHAT, "{" MSGS ",\"logit_bias\":{\"5\":-100,\"999\":2.5,\"0\":100}}", &e), 0);
    assert_int_equal(r.sampling.n_logit_bias, 3);
    float want[1000] = {0}, got[1000] = {0};
    want[5] = -100, want[999] = 2.5f, want[0] = 100;
    for (int i = 0; i < r.sampling.n_logit_bias; i++)
        got[r.sampling.logit_bias[i].id] = r.sampling.logit_bias[i].bias;
    assert_memory_equal(got, want, sizeof want);
    csd_http_req_fini(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":\"x\",\"logit_bias\":{}}", &e), 0);
    assert_int_equal(r.sampling.n_logit_bias, 0);
    csd_http_req_fini(&r);
    expect_chat_error("\"logit_bias\":[1]", "logit_bias");
    expect_chat_error("\"logit_bias\":{\"1000\":1}", "logit_bias"); /* outside the vocabulary */
    expect_chat_error("\"logit_bias\":{\"-1\":1}", "logit_bias");
    expect_chat_error("\"logit_bias\":{\"01\":1}", "logit_bias"); /* would alias "1" */
    expect_chat_error("\"logit_bias\":{\"1x\":1}", "logit_bias");
    expect_chat_error("\"logit_bias\":{\"\":1}", "logit_bias");
    /* a NUL in a key: jansson refuses the body (invalid_json) before any field is read */
    expect_error(CHAT, "{" MSGS ",\"logit_bias\":{\"1\\u0000\":1}}", 400, "");
    expect_chat_error("\"logit_bias\":{\"99999999999\":1}", "logit_bias");
    expect_chat_error("\"logit_bias\":{\"1\":100.5}", "logit_bias");
    expect_chat_error("\"logit_bias\":{\"1\":-101}", "logit_bias");
    expect_chat_error("\"logit_bias\":{\"1\":\"5\"}", "logit_bias");
    expect_chat_error("\"logit_bias\":{\"1\":null}", "logit_bias");
    expect_error(COMP, "{\"prompt\":\"x\",\"logit_bias\":{\"1000\":1}}", 400, "logit_bias");
    /* as many tokens as the sampler holds, and one more (vocab unknown: 0) */
    for (int extra = 0; extra < 2; extra++) {
        int keys = CSD_SAMPLER_MAX_LOGIT_BIAS + extra;
        size_t cap = 16 * (size_t)keys + 128, n;
        char *body = malloc(cap);
        assert_non_null(body);
        n = (size_t)snprintf(body, cap, "{" MSGS ",\"logit_bias\":{");
        for (int i = 0; i < keys; i++)
            n += (size_t)snprintf(body + n, cap - n, "%s\"%d\":1", i ? "," : "", i);
        snprintf(body + n, cap - n, "}}");
        int rc = csd_http_req_parse(&r, CHAT, body, strlen(body), 0, &e);
        if (extra == 0) {
            assert_int_equal(rc, 0);
            assert_int_equal(r.sampling.n_logit_bias, keys);
        } else {
            assert_int_not_equal(rc, 0);
            assert_string_equal(e.param, "logit_bias");
        }
        csd_http_req_fini(&r);
        free(body);
    }
}

static void test_error_json(void **state) {
    (void)state;
    csd_http_error e;
    csd_http_error_set(&e, 400, NULL, "temperature", "invalid_value", "bad %d", 7);
    char *s = csd_http_error_json(&e);
    json_t *j = json_loads(s, 0, NULL);
    free(s);
    json_t *inner = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(inner, "message")), "bad 7");
    assert_string_equal(json_string_value(json_object_get(inner, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(inner, "param")), "temperature");
    assert_string_equal(json_string_value(json_object_get(inner, "code")), "invalid_value");
    json_decref(j);
    csd_http_error_set(&e, 500, "server_error", NULL, NULL, "x");
    s = csd_http_error_json(&e);
    j = json_loads(s, 0, NULL);
    free(s);
    assert_true(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    json_decref(j);
}

/* An error about a request with bad UTF-8 still has a body that says what is wrong: jansson's parse
 * error quotes the bytes near the problem, and a JSON string must be valid UTF-8 (found by
 * fuzz_http_request, which then got no error body at all). */
static void test_error_json_bad_utf8(void **state) {
    (void)state;
    static const char body[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                               "\"stop\": [\"n\\\xDA\xBA\xD3\xB1]}";
    csd_http_req r;
    csd_http_error e;
    assert_int_not_equal(parse(&r, CHAT, body, &e), 0);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "invalid_json");
    char *s = csd_http_error_json(&e);
    assert_non_null(s);
    json_t *j = json_loads(s, 0, NULL);
    free(s);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    assert_non_null(msg);
    assert_non_null(strstr(msg, "not valid JSON"));
    json_decref(j);
    /* a field name or message cut inside a character, or carrying stray bytes */
    csd_http_error_set(&e, 400, NULL, "x\xC3", "invalid_value", "'%s' must be \xFF%s", "a", "\xE2");
    s = csd_http_error_json(&e);
    assert_non_null(s);
    j = json_loads(s, 0, NULL);
    free(s);
    json_t *inner = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(inner, "message")), "'a' must be ??");
    assert_string_equal(json_string_value(json_object_get(inner, "param")), "x?");
    json_decref(j);
}

/* ---- stop strings ---- */

/* Feeds pieces, returns the concatenated emitted text and whether it stopped. */
static bool run_stop(char *const *stops, int n, const char *const *pieces, char *out) {
    csd_http_stop s;
    csd_http_stop_init(&s, stops, n);
    out[0] = 0;
    bool stopped = false;
    for (int i = 0; pieces[i] && !stopped; i++) {
        const char *emit;
        size_t len;
        int rc = csd_http_stop_push(&s, pieces[i], strlen(pieces[i]), &emit, &len);
        assert_true(rc >= 0);
        strncat(out, emit, len);
        stopped = rc == 1;
    }
    if (!stopped) {
        const char *emit;
        size_t len;
        csd_http_stop_flush(&s, &emit, &len);
        strncat(out, emit, len);
    }
    csd_http_stop_fini(&s);
    return stopped;
}

static void test_stop_text(void **state) {
    (void)state;
    char out[256];
    char *stops[] = {"END", "\n\n", "é!"};
    const char *p1[] = {"hello", " wor", "ld", NULL};
    assert_false(run_stop(stops, 3, p1, out));
    assert_string_equal(out, "hello world");
    const char *p2[] = {"abc E", "N", "D tail", NULL};
    assert_true(run_stop(stops, 3, p2, out));
    assert_string_equal(out, "abc ");
    const char *p3[] = {"a\n", "\nb", NULL};
    assert_true(run_stop(stops, 3, p3, out));
    assert_string_equal(out, "a");
    const char *p4[] = {"EN", "d", NULL}; /* a false start is released */
    assert_false(run_stop(stops, 3, p4, out));
    assert_string_equal(out, "ENd");
    const char *p5[] = {"xxEN", NULL}; /* held at the end, flushed */
    assert_false(run_stop(stops, 3, p5, out));
    assert_string_equal(out, "xxEN");
    const char *p6[] = {"caf\xc3\xa9", "!", NULL};
    assert_true(run_stop(stops, 3, p6, out));
    assert_string_equal(out, "caf");
    const char *p7[] = {"x END y \n\n", NULL}; /* the earliest stop wins */
    assert_true(run_stop(stops, 3, p7, out));
    assert_string_equal(out, "x ");
    const char *p8[] = {"no stops at all", NULL};
    assert_false(run_stop(NULL, 0, p8, out));
    assert_string_equal(out, "no stops at all");
    /* held back text never contains more than a stop prefix: streaming emits early */
    csd_http_stop s;
    csd_http_stop_init(&s, stops, 3);
    const char *emit;
    size_t len;
    assert_int_equal(csd_http_stop_push(&s, "abcE", 4, &emit, &len), 0);
    assert_int_equal(len, 3);
    assert_int_equal(csd_http_stop_push(&s, "N", 1, &emit, &len), 0);
    assert_int_equal(len, 0);
    assert_int_equal(csd_http_stop_push(&s, "x", 1, &emit, &len), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(emit, "ENx", 3);
    csd_http_stop_fini(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_minimal_defaults),
        cmocka_unit_test(test_chat_every_parameter),
        cmocka_unit_test(test_nulls_are_absent),
        cmocka_unit_test(test_stop_forms),
        cmocka_unit_test(test_chat_type_errors),
        cmocka_unit_test(test_chat_range_errors),
        cmocka_unit_test(test_response_format_json_object),
        cmocka_unit_test(test_tiny_positive_values),
        cmocka_unit_test(test_messages_errors),
        cmocka_unit_test(test_body_errors),
        cmocka_unit_test(test_completion_prompt_forms),
        cmocka_unit_test(test_completion_errors),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_error_json_bad_utf8),
        cmocka_unit_test(test_stop_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
