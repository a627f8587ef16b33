/* openai_request: the OpenAI request parser (see openai_request.h). Each field has one small reader
 * that checks its type and range and names the field on failure; absent and null fields keep the
 * OpenAI defaults. Nothing here trusts the body: every length and count is bounded first. */
#include "openai_request.h"
#include "tool_request.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/utf8.h"

/* Bytes of text parts joined into one message (the whole body is already bounded by the server). */
#define TEXT_PART_SEP "\n"

const char *csd_http_kind_name(int kind) {
    switch (kind) {
    case CSD_HTTP_KIND_CHAT: return "chat";
    case CSD_HTTP_KIND_COMPLETION: return "completion";
    default: return "unknown";
    }
}

int csd_http_error_set(csd_http_error *e, int status, const char *type, const char *param,
                       const char *code, const char *fmt, ...) {
    if (!e) return CSD_EINVAL;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* The message may quote the request (jansson's parse errors do), and it or param may be cut
     * inside a character: JSON strings must be valid UTF-8, or csd_http_error_json would have no
     * body to send. type and code are always our own ASCII names. */
    csd_utf8_scrub(e->message);
    csd_utf8_scrub(e->param);
    return CSD_EINVAL;
}

char *csd_http_error_json(const csd_http_error *e) {
    json_t *inner = json_pack("{s:s, s:s, s:o, s:o}", "message", e->message, "type",
                              e->type[0] ? e->type : "invalid_request_error", "param",
                              e->param[0] ? json_string(e->param) : json_null(), "code",
                              e->code[0] ? json_string(e->code) : json_null());
    if (!inner) return NULL;
    json_t *root = json_pack("{s:o}", "error", inner);
    if (!root) return NULL;
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* ---- field readers: each returns 0, or CSD_EINVAL with the error naming the field ---- */

int csd_http_bad_type(csd_http_error *e, const char *field, const char *want) {
    return csd_http_error_set(e, 400, NULL, field, "invalid_type", "'%s' must be %s", field, want);
}

int csd_http_bad_value(csd_http_error *e, const char *field, const char *want) {
    return csd_http_error_set(e, 400, NULL, field, "invalid_value", "'%s' must be %s", field,
                              want);
}

/* Finds, depth first, the first number at or beyond 2^63 in magnitude (an integer jansson could
 * not hold, read as a real) and writes its path ("seed", "a.b[2]") into path. */
static bool find_huge_number(const json_t *v, char *path, size_t cap, size_t used) {
    if (json_is_real(v)) return fabs(json_real_value(v)) >= 9223372036854775808.0;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            int n = snprintf(path + used, cap - used, "[%zu]", i);
            if (n > 0 && (size_t)n < cap - used &&
                find_huge_number(json_array_get(v, i), path, cap, used + (size_t)n))
                return true;
        }
    } else if (json_is_object(v)) {
        const char *key;
        const json_t *x;
        json_object_foreach((json_t *)v, key, x) {
            int n = snprintf(path + used, cap - used, "%s%s", used ? "." : "", key);
            if (n > 0 && (size_t)n < cap - used && find_huge_number(x, path, cap, used + (size_t)n))
                return true;
        }
    }
    path[used] = '\0';
    return false;
}

/* jansson refuses an integer beyond 64 bits with line and column only: the error names the field
 * instead where a second reading (integers as reals) finds it. False when it does not. */
static bool name_too_big_integer(const char *body, size_t len, csd_http_error *e) {
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL);
    char path[128] = "";
    bool found = root && find_huge_number(root, path, sizeof path, 0) && path[0];
    json_decref(root);
    if (found)
        csd_http_error_set(e, 400, NULL, path, "invalid_value",
                           "'%s' is an integer out of range (beyond 64 bits)", path);
    return found;
}

json_t *csd_http_body_object(const char *body, size_t len, csd_http_error *e) {
    if (!body || len == 0) {
        csd_http_error_set(e, 400, NULL, NULL, "invalid_json", "the request body is empty");
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &jerr);
    if (!root) {
        if (strstr(jerr.text, "too big") && name_too_big_integer(body, len, e)) return NULL;
        csd_http_error_set(e, 400, NULL, NULL, "invalid_json",
                           "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                           jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        csd_http_error_set(e, 400, NULL, NULL, "invalid_json", "the body must be a JSON object");
        return NULL;
    }
    return root;
}

json_t *csd_http_member(const json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

int csd_http_read_bool(const json_t *root, const char *key, bool *out, csd_http_error *e) {
    json_t *v = csd_http_member(root, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return csd_http_bad_type(e, key, "a boolean");
    *out = json_is_true(v);
    return 0;
}

/* A number in [lo, hi] (both inclusive; lo_open makes the lower bound exclusive). */
static int read_num(const json_t *root, const char *key, double lo, bool lo_open, double hi,
                    const char *range, float *out, csd_http_error *e) {
    json_t *v = csd_http_member(root, key);
    if (!v) return 0;
    if (!json_is_number(v)) return csd_http_bad_type(e, key, "a number");
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || (lo_open && d == lo) || d > hi)
        return csd_http_bad_value(e, key, range);
    float f = (float)d;
    /* a positive value under an open bound of 0 may round to it in single precision (1e-60):
     * it stays the smallest float above the bound, as the request asked for more than 0 */
    if (lo_open && f <= (float)lo) f = nextafterf((float)lo, (float)hi);
    *out = f;
    return 0;
}

static int read_int(const json_t *root, const char *key, int64_t lo, int64_t hi, const char *range,
                    bool *present, int64_t *out, csd_http_error *e) {
    json_t *v = csd_http_member(root, key);
    if (present) *present = false;
    if (!v) return 0;
    if (!json_is_integer(v)) return csd_http_bad_type(e, key, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return csd_http_bad_value(e, key, range);
    *out = (int64_t)x;
    if (present) *present = true;
    return 0;
}

static int read_string(const json_t *root, const char *key, char **out, csd_http_error *e) {
    json_t *v = csd_http_member(root, key);
    if (!v) return 0;
    if (!json_is_string(v)) return csd_http_bad_type(e, key, "a string");
    if (strlen(json_string_value(v)) != json_string_length(v))
        return csd_http_bad_value(e, key, "free of NUL characters");
    *out = csd_strdup(json_string_value(v));
    if (!*out) return csd_http_error_set(e, 500, "server_error", key, NULL, "out of memory");
    return 0;
}

/* JSON nesting depth of v, stopping once it passes limit. */
int csd_http_json_depth(const json_t *v, int limit) {
    if (limit < 0) return 1;
    int best = 0;
    if (json_is_object(v)) {
        const char *k;
        json_t *c;
        json_object_foreach((json_t *)v, k, c) {
            int d = csd_http_json_depth(c, limit - 1);
            if (d > best) best = d;
            if (best > limit) break;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *c;
        json_array_foreach(v, i, c) {
            int d = csd_http_json_depth(c, limit - 1);
            if (d > best) best = d;
            if (best > limit) break;
        }
    } else {
        return 0;
    }
    return best + 1;
}

/* ---- shared sampling fields ---- */

static int parse_sampling(const json_t *root, csd_http_req *r, csd_http_error *e) {
    csd_sampler_params *sp = &r->sampling;
    int rc;
    if ((rc = read_num(root, "temperature", 0, false, 2, "in [0, 2]", &sp->temperature, e)))
        return rc;
    if ((rc = read_num(root, "top_p", 0, true, 1, "in (0, 1]", &sp->top_p, e))) return rc;
    if ((rc = read_num(root, "min_p", 0, false, 1, "in [0, 1]", &sp->min_p, e))) return rc;
    if ((rc = read_num(root, "presence_penalty", -2, false, 2, "in [-2, 2]", &sp->presence_penalty,
                       e)))
        return rc;
    if ((rc = read_num(root, "frequency_penalty", -2, false, 2, "in [-2, 2]",
                       &sp->frequency_penalty, e)))
        return rc;
    if ((rc = read_num(root, "repetition_penalty", 0, true, 10, "in (0, 10]",
                       &sp->repetition_penalty, e)))
        return rc;
    int64_t v = 0;
    bool present = false;
    /* -1 means off in vLLM's convention, 0 in llama.cpp's: accept both */
    if ((rc = read_int(root, "top_k", -1, 1 << 20, "an integer in [-1, 1048576]", &present, &v, e)))
        return rc;
    if (present) sp->top_k = v < 0 ? 0 : (int32_t)v;
    if ((rc = read_int(root, "seed", INT64_MIN, INT64_MAX, "an integer", &r->has_seed, &v, e)))
        return rc;
    if (r->has_seed) sp->seed = (uint64_t)v;
    /* max_completion_tokens is the newer name; it wins when both are given */
    const char *max_keys[2] = {"max_tokens", "max_completion_tokens"};
    for (int i = 0; i < 2; i++) {
        if ((rc = read_int(root, max_keys[i], 1, INT32_MAX, "an integer >= 1", &present, &v, e)))
            return rc;
        if (present) r->max_tokens = v;
    }
    if ((rc = read_int(root, "n", 1, INT32_MAX, "an integer >= 1", &present, &v, e))) return rc;
    if (present && v > CSD_HTTP_MAX_N)
        return csd_http_error_set(e, 400, NULL, "n", "invalid_value",
                                  "'n' is %lld; at most %d choices per request", (long long)v,
                                  CSD_HTTP_MAX_N);
    r->n = present ? (int)v : 1;
    if ((rc = read_int(root, "best_of", 1, 1, "1 (best_of > 1 is not supported)", NULL, &v, e)))
        return rc;
    return csd_http_read_bool(root, "ignore_eos", &r->ignore_eos, e);
}

/* A logit_bias key: a token id below hi, written in decimal digits without leading zeros (so two
 * keys never name one token). */
static bool parse_bias_key(const char *key, size_t len, int64_t hi, int32_t *id) {
    int64_t v = 0;
    if (len == 0 || len > 10 || (len > 1 && key[0] == '0')) return false;
    for (size_t i = 0; i < len; i++) {
        if (key[i] < '0' || key[i] > '9') return false;
        v = v * 10 + (key[i] - '0');
    }
    if (v >= hi) return false;
    *id = (int32_t)v;
    return true;
}

/* logit_bias: {"token id": bias in [-100, 100], ...}, as OpenAI. */
static int parse_logit_bias(const json_t *root, int32_t vocab, csd_http_req *r, csd_http_error *e) {
    json_t *v = csd_http_member(root, "logit_bias"), *bias;
    if (!v) return 0;
    if (!json_is_object(v)) return csd_http_bad_type(e, "logit_bias", "an object");
    if (json_object_size(v) > CSD_SAMPLER_MAX_LOGIT_BIAS)
        return csd_http_error_set(e, 400, NULL, "logit_bias", "invalid_value",
                                  "'logit_bias' holds at most %d tokens",
                                  CSD_SAMPLER_MAX_LOGIT_BIAS);
    int64_t hi = vocab > 0 ? vocab : INT32_MAX;
    const char *key;
    size_t key_len;
    csd_sampler_params *sp = &r->sampling;
    json_object_keylen_foreach(v, key, key_len, bias) {
        csd_logit_bias *b = &sp->logit_bias[sp->n_logit_bias];
        if (!parse_bias_key(key, key_len, hi, &b->id))
            return csd_http_error_set(e, 400, NULL, "logit_bias", "invalid_value",
                                      "'logit_bias' keys must be token ids in [0, %lld), got "
                                      "'%.32s'",
                                      (long long)hi, key);
        double d = json_is_number(bias) ? json_number_value(bias) : NAN;
        if (!(d >= -100 && d <= 100))
            return csd_http_error_set(e, 400, NULL, "logit_bias", "invalid_value",
                                      "'logit_bias' of token %d must be a number in [-100, 100]",
                                      (int)b->id);
        b->bias = (float)d;
        sp->n_logit_bias++;
    }
    return 0;
}

static int add_stop(csd_http_req *r, const json_t *s, const char *field, csd_http_error *e) {
    if (!json_is_string(s)) return csd_http_bad_type(e, field, "a string or an array of strings");
    size_t len = json_string_length(s);
    if (len == 0) return csd_http_bad_value(e, field, "a non-empty string");
    if (len > CSD_HTTP_MAX_STOP_LEN) return csd_http_bad_value(e, field, "at most 256 bytes long");
    if (memchr(json_string_value(s), 0, len))
        return csd_http_bad_value(e, field, "free of NUL characters");
    if (r->n_stop >= CSD_HTTP_MAX_STOP)
        return csd_http_bad_value(e, field, "a list of at most 16 strings");
    r->stop[r->n_stop] = csd_strdup(json_string_value(s));
    if (!r->stop[r->n_stop])
        return csd_http_error_set(e, 500, "server_error", field, NULL, "out of memory");
    r->n_stop++;
    return 0;
}

static int parse_stop(const json_t *root, csd_http_req *r, csd_http_error *e) {
    json_t *v = csd_http_member(root, "stop");
    if (!v) return 0;
    if (json_is_string(v)) return add_stop(r, v, "stop", e);
    if (!json_is_array(v)) return csd_http_bad_type(e, "stop", "a string or an array of strings");
    if (json_array_size(v) > CSD_HTTP_MAX_STOP)
        return csd_http_bad_value(e, "stop", "a list of at most 16 strings");
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        int rc = add_stop(r, s, "stop", e);
        if (rc) return rc;
    }
    return 0;
}

static int parse_stream(const json_t *root, csd_http_req *r, csd_http_error *e) {
    int rc = csd_http_read_bool(root, "stream", &r->stream, e);
    if (rc) return rc;
    json_t *so = csd_http_member(root, "stream_options");
    if (!so) return 0;
    if (!json_is_object(so)) return csd_http_bad_type(e, "stream_options", "an object");
    json_t *iu = csd_http_member(so, "include_usage");
    if (iu) {
        if (!json_is_boolean(iu))
            return csd_http_bad_type(e, "stream_options.include_usage", "a boolean");
        r->include_usage = json_is_true(iu);
    }
    return 0;
}

int csd_http_compile_schema(csd_http_req *r, const json_t *schema, const char *param,
                            csd_http_error *e) {
    csd_err err = {0};
    int rc = csd_json_schema_compile(&r->json_schema, schema, &err);
    if (rc == CSD_ENOMEM)
        return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (rc) {
        /* the compiler's messages start "schema at '/pointer'": say whose schema it is */
        const char *msg = !strncmp(err.msg, "schema", 6) ? err.msg + 6 : err.msg;
        return csd_http_error_set(e, 400, NULL, param, "invalid_json_schema", "%s%s", param, msg);
    }
    r->json_object = true;
    return 0;
}

/* response_format json_schema: {"name": ..., "schema": {...}, "strict": ...}; the schema is
 * compiled here so that one outside the supported subset is refused before any work
 * (model/json_schema.h). "strict" changes nothing: the answer always follows the schema. */
static int parse_json_schema(const json_t *v, csd_http_req *r, csd_http_error *e) {
    json_t *js = json_object_get(v, "json_schema");
    if (!json_is_object(js))
        return csd_http_bad_type(e, "response_format.json_schema", "an object");
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    if (name && !json_is_string(name))
        return csd_http_bad_type(e, "response_format.json_schema.name", "a string");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return csd_http_bad_type(e, "response_format.json_schema.strict", "a boolean");
    json_t *schema = json_object_get(js, "schema");
    if (!json_is_object(schema) && !json_is_true(schema))
        return csd_http_bad_type(e, "response_format.json_schema.schema", "an object or true");
    json_t *any = json_is_true(schema) ? json_object() : NULL; /* true: any value, as {} is */
    if (json_is_true(schema) && !any)
        return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    int rc =
        csd_http_compile_schema(r, any ? any : schema, "response_format.json_schema.schema", e);
    json_decref(any);
    return rc;
}

/* response_format: plain text, one JSON object, or one object valid against a JSON schema
 * (constrained decoding: model/json_mask.h). */
static int parse_response_format(const json_t *root, csd_http_req *r, csd_http_error *e) {
    json_t *v = csd_http_member(root, "response_format");
    if (!v) return 0;
    if (!json_is_object(v)) return csd_http_bad_type(e, "response_format", "an object");
    json_t *t = json_object_get(v, "type");
    if (!json_is_string(t)) return csd_http_bad_type(e, "response_format.type", "a string");
    const char *type = json_string_value(t);
    r->json_object = !strcmp(type, "json_object") || !strcmp(type, "json_schema");
    if (!strcmp(type, "json_schema")) return parse_json_schema(v, r, e);
    if (!r->json_object && strcmp(type, "text") != 0)
        return csd_http_error_set(e, 400, NULL, "response_format", "unsupported_value",
                                  "response_format '%s' is not supported (only 'text', "
                                  "'json_object' and 'json_schema')",
                                  type);
    return 0;
}

/* ---- chat ---- */

/* content: a string, or a list of {"type": "text", "text": ...} parts joined by newlines. */
static int message_content(const json_t *c, const char *field, json_t **out, csd_http_error *e) {
    char name[160];
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return 0;
    }
    if (!json_is_array(c))
        return csd_http_bad_type(e, field, "a string or an array of content parts");
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        snprintf(name, sizeof name, "%s[%zu]", field, i);
        if (!json_is_object(part)) return csd_http_bad_type(e, name, "an object");
        json_t *type = json_object_get(part, "type");
        snprintf(name, sizeof name, "%s[%zu].type", field, i);
        if (!json_is_string(type)) return csd_http_bad_type(e, name, "a string");
        if (strcmp(json_string_value(type), "text") != 0)
            return csd_http_error_set(e, 400, NULL, name, "unsupported_value",
                                      "content part type '%s' is not supported (only 'text')",
                                      json_string_value(type));
        json_t *text = json_object_get(part, "text");
        snprintf(name, sizeof name, "%s[%zu].text", field, i);
        if (!json_is_string(text)) return csd_http_bad_type(e, name, "a string");
        total += json_string_length(text) + 1;
    }
    char *buf = csd_alloc(total + 1);
    if (!buf) return csd_http_error_set(e, 500, "server_error", field, NULL, "out of memory");
    size_t pos = 0;
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        if (i > 0) {
            memcpy(buf + pos, TEXT_PART_SEP, 1);
            pos++;
        }
        memcpy(buf + pos, json_string_value(text), json_string_length(text));
        pos += json_string_length(text);
    }
    *out = json_stringn_nocheck(buf, pos);
    csd_free(buf);
    return 0;
}

static int parse_message(const json_t *m, size_t idx, json_t *out_arr, csd_http_error *e) {
    char field[96];
    snprintf(field, sizeof field, "messages[%zu]", idx);
    if (!json_is_object(m)) return csd_http_bad_type(e, field, "an object");
    json_t *role = json_object_get(m, "role");
    snprintf(field, sizeof field, "messages[%zu].role", idx);
    if (!json_is_string(role)) return csd_http_bad_type(e, field, "a string");
    const char *rs = json_string_value(role);
    /* "developer" is OpenAI's newer name for system */
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    bool known = false;
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(rs, roles[i])) known = true;
    if (!known)
        return csd_http_error_set(e, 400, NULL, field, "invalid_value",
                                  "'%s' must be one of system, user, assistant, tool, developer",
                                  field);
    json_t *nm = json_object();
    if (!nm) return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    json_array_append_new(out_arr, nm);
    json_object_set_new(nm, "role", json_string(strcmp(rs, "developer") ? rs : "system"));

    json_t *content = csd_http_member(m, "content");
    json_t *tool_calls = csd_http_member(m, "tool_calls");
    snprintf(field, sizeof field, "messages[%zu].content", idx);
    if (content) {
        json_t *c = NULL;
        int rc = message_content(content, field, &c, e);
        if (rc) return rc;
        if (!c) return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        json_object_set_new(nm, "content", c);
    } else if (strcmp(rs, "assistant") == 0 && tool_calls) {
        json_object_set_new(nm, "content", json_null()); /* a pure tool-call turn */
    } else {
        return csd_http_error_set(e, 400, NULL, field, "missing_required_parameter",
                                  "'%s' is required", field);
    }
    if (tool_calls) {
        snprintf(field, sizeof field, "messages[%zu].tool_calls", idx);
        if (!json_is_array(tool_calls)) return csd_http_bad_type(e, field, "an array");
        if (csd_http_json_depth(tool_calls, CSD_HTTP_MAX_JSON_DEPTH) > CSD_HTTP_MAX_JSON_DEPTH)
            return csd_http_bad_value(e, field, "nested less deeply");
        json_t *calls = csd_http_history_calls(tool_calls);
        if (!calls) return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        json_object_set_new(nm, "tool_calls", calls);
    }
    static const char *const strs[] = {"name", "tool_call_id", "reasoning_content"};
    for (size_t i = 0; i < 3; i++) {
        json_t *v = csd_http_member(m, strs[i]);
        if (!v) continue;
        snprintf(field, sizeof field, "messages[%zu].%s", idx, strs[i]);
        if (!json_is_string(v)) return csd_http_bad_type(e, field, "a string");
        json_object_set(nm, strs[i], v);
    }
    return 0;
}

/* Names chat_template_kwargs may not set: what the server sets itself (the request has fields for
 * messages, tools and tool_choice; the generation prompt and BOS/EOS belong to the model) and the
 * template language's own globals. */
static bool reserved_template_name(const char *k) {
    static const char *const names[] = {
        "messages", "tools",     "tool_choice",     "add_generation_prompt", "bos_token",
        "eos_token", "namespace", "raise_exception", "range",                 "strftime_now",
        "true",      "false",     "none",            "True",                  "False",
        "None",      "loop"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(k, names[i])) return true;
    return false;
}

/* chat_template_kwargs (vLLM's and llama-server's): more variables for the chat template, such as
 * Qwen3's enable_thinking. */
static int parse_template_kwargs(const json_t *root, csd_http_req *r, csd_http_error *e) {
    json_t *kw = csd_http_member(root, "chat_template_kwargs");
    if (!kw) return 0;
    if (!json_is_object(kw)) return csd_http_bad_type(e, "chat_template_kwargs", "an object");
    if (json_object_size(kw) > CSD_HTTP_MAX_TEMPLATE_KWARGS)
        return csd_http_bad_value(e, "chat_template_kwargs", "at most 64 variables");
    if (csd_http_json_depth(kw, CSD_HTTP_MAX_JSON_DEPTH) > CSD_HTTP_MAX_JSON_DEPTH)
        return csd_http_bad_value(e, "chat_template_kwargs", "nested less deeply");
    const char *k;
    json_t *v;
    json_object_foreach(kw, k, v) {
        if (reserved_template_name(k))
            return csd_http_error_set(e, 400, NULL, "chat_template_kwargs", "invalid_value",
                                      "chat_template_kwargs may not set '%.64s' (the server sets "
                                      "it, or the template language defines it)", k);
    }
    r->template_kwargs = json_incref(kw);
    return 0;
}

static int parse_chat(const json_t *root, csd_http_req *r, csd_http_error *e) {
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs || json_is_null(msgs))
        return csd_http_error_set(e, 400, NULL, "messages", "missing_required_parameter",
                                  "'messages' is required");
    if (!json_is_array(msgs)) return csd_http_bad_type(e, "messages", "an array");
    if (json_array_size(msgs) == 0) return csd_http_bad_value(e, "messages", "a non-empty array");
    if (json_array_size(msgs) > CSD_HTTP_MAX_MESSAGES)
        return csd_http_bad_value(e, "messages", "at most 4096 messages");
    r->messages = json_array();
    if (!r->messages)
        return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        int rc = parse_message(m, i, r->messages, e);
        if (rc) return rc;
    }
    int rc = csd_http_read_bool(root, "logprobs", &r->logprobs, e);
    if (rc) return rc;
    int64_t v = 0;
    bool present = false;
    if ((rc = read_int(root, "top_logprobs", 0, CSD_HTTP_MAX_TOP_LOGPROBS, "an integer in [0, 20]",
                       &present, &v, e)))
        return rc;
    if (present) {
        if (!r->logprobs && v > 0)
            return csd_http_error_set(e, 400, NULL, "top_logprobs", "invalid_value",
                                      "'top_logprobs' requires 'logprobs' to be true");
        r->top_logprobs = (int)v;
    }
    if ((rc = csd_http_parse_tools(root, r, e))) return rc;
    if ((rc = parse_template_kwargs(root, r, e))) return rc;
    return 0;
}

/* ---- completions ---- */

static int read_ids(const json_t *arr, const char *field, int32_t vocab, csd_http_req *r,
                    csd_http_error *e) {
    size_t n = json_array_size(arr);
    if (n == 0) return csd_http_bad_value(e, field, "a non-empty list of token ids");
    if (n > CSD_HTTP_MAX_PROMPT_IDS)
        return csd_http_bad_value(e, field, "at most 1048576 token ids");
    r->prompt_ids = csd_alloc_array(n, sizeof *r->prompt_ids);
    if (!r->prompt_ids)
        return csd_http_error_set(e, 500, "server_error", field, NULL, "out of memory");
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v))
            return csd_http_bad_type(e, field,
                                     "a string, a list of one string, or a list of token ids");
        json_int_t id = json_integer_value(v);
        int64_t hi = vocab > 0 ? vocab : INT32_MAX;
        if (id < 0 || id >= hi)
            return csd_http_error_set(e, 400, NULL, field, "invalid_value",
                                      "token id %lld in '%s' is outside the vocabulary [0, %lld)",
                                      (long long)id, field, (long long)hi);
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = (int64_t)n;
    return 0;
}

static int set_prompt_text(csd_http_req *r, const json_t *s, csd_http_error *e) {
    r->prompt_len = json_string_length(s);
    r->prompt = csd_alloc(r->prompt_len + 1);
    if (!r->prompt)
        return csd_http_error_set(e, 500, "server_error", "prompt", NULL, "out of memory");
    memcpy(r->prompt, json_string_value(s), r->prompt_len);
    return 0;
}

static int parse_completion(const json_t *root, int32_t vocab, csd_http_req *r, csd_http_error *e) {
    static const char *const want = "a string, a list of one string, or a list of token ids";
    json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p))
        return csd_http_error_set(e, 400, NULL, "prompt", "missing_required_parameter",
                                  "'prompt' is required");
    int rc;
    if (json_is_string(p)) {
        rc = set_prompt_text(r, p, e);
    } else if (json_is_array(p)) {
        json_t *first = json_array_get(p, 0);
        if (!first) return csd_http_bad_value(e, "prompt", "a non-empty string or list");
        if (json_is_string(first) || json_is_array(first)) {
            if (json_array_size(p) != 1)
                return csd_http_error_set(e, 400, NULL, "prompt", "unsupported_value",
                                          "a list of several prompts is not supported: send one "
                                          "request per prompt");
            if (json_is_string(first))
                rc = set_prompt_text(r, first, e);
            else
                rc = read_ids(first, "prompt", vocab, r, e);
        } else {
            rc = read_ids(p, "prompt", vocab, r, e);
        }
    } else {
        return csd_http_bad_type(e, "prompt", want);
    }
    if (rc) return rc;
    if ((rc = csd_http_read_bool(root, "echo", &r->echo, e))) return rc;
    json_t *lp = csd_http_member(root, "logprobs");
    if (lp) {
        if (json_is_boolean(lp)) { /* lenient: some clients send the chat form */
            r->logprobs = json_is_true(lp);
        } else if (json_is_integer(lp)) {
            json_int_t n = json_integer_value(lp);
            if (n < 0 || n > CSD_HTTP_MAX_TOP_LOGPROBS)
                return csd_http_bad_value(e, "logprobs", "an integer in [0, 20]");
            r->logprobs = true;
            r->top_logprobs = (int)n;
        } else {
            return csd_http_bad_type(e, "logprobs", "an integer");
        }
    }
    json_t *suffix = csd_http_member(root, "suffix");
    if (suffix && (!json_is_string(suffix) || json_string_length(suffix) > 0))
        return csd_http_error_set(e, 400, NULL, "suffix", "unsupported_value",
                                  "'suffix' is not supported");
    return 0;
}

/* ---- entry point ---- */

static void req_reset(csd_http_req *r, int kind) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    csd_sampler_params_default(&r->sampling);
    /* OpenAI's defaults, not llama.cpp's: a client that sends nothing gets plain sampling */
    r->sampling.temperature = 1.0f;
    r->sampling.top_k = 0;
    r->sampling.top_p = 1.0f;
    r->sampling.min_p = 0.0f;
    r->sampling.repetition_penalty = 1.0f;
    r->sampling.penalty_scope = CSD_PENALTY_OPENAI; /* the answer's tokens, not the prompt's */
}

int csd_http_req_parse_object(csd_http_req *req, int kind, const json_t *root, int32_t vocab_size,
                              csd_http_error *err) {
    csd_http_error scratch;
    csd_http_error *e = err ? err : &scratch;
    memset(e, 0, sizeof *e);
    req_reset(req, kind);
    if (kind != CSD_HTTP_KIND_CHAT && kind != CSD_HTTP_KIND_COMPLETION)
        return csd_http_error_set(e, 400, NULL, NULL, NULL, "unknown endpoint kind");
    int rc;
    if ((rc = read_string(root, "model", &req->model, e))) goto fail;
    if ((rc = read_string(root, "user", &req->user, e))) goto fail;
    if ((rc = parse_stream(root, req, e))) goto fail;
    if ((rc = parse_sampling(root, req, e))) goto fail;
    if ((rc = parse_logit_bias(root, vocab_size, req, e))) goto fail;
    if ((rc = parse_stop(root, req, e))) goto fail;
    if ((rc = parse_response_format(root, req, e))) goto fail;
    rc = kind == CSD_HTTP_KIND_CHAT ? parse_chat(root, req, e)
                                    : parse_completion(root, vocab_size, req, e);
    if (rc) goto fail;
    return 0;
fail:
    csd_http_req_fini(req);
    req->kind = kind;
    return rc;
}

int csd_http_req_parse(csd_http_req *req, int kind, const char *body, size_t len,
                       int32_t vocab_size, csd_http_error *err) {
    csd_http_error scratch;
    csd_http_error *e = err ? err : &scratch;
    memset(e, 0, sizeof *e);
    req_reset(req, kind);
    json_t *root = csd_http_body_object(body, len, e);
    if (!root) return CSD_EINVAL;
    int rc = csd_http_req_parse_object(req, kind, root, vocab_size, e);
    json_decref(root);
    return rc;
}

void csd_http_req_fini(csd_http_req *req) {
    if (!req) return;
    csd_free(req->model);
    csd_free(req->user);
    for (int i = 0; i < req->n_stop; i++)
        csd_free(req->stop[i]);
    json_decref(req->messages);
    json_decref(req->tools);
    json_decref(req->tool_choice);
    csd_free(req->tool_name);
    json_decref(req->template_kwargs);
    csd_free(req->prompt);
    csd_free(req->prompt_ids);
    csd_json_schema_destroy(req->json_schema);
    memset(req, 0, sizeof *req);
}
