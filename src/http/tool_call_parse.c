/* tool_call_parse: one tool call's body, {"name": ..., "arguments": {...}} (see tool_calls.h).
 *
 * The body must be one JSON object, valid for jansson (with NUL characters and integers beyond 64
 * bits allowed) or for the constrained decoder's own grammar (model/json_accept.h), which also
 * takes numbers beyond the double range: an answer the decoder was held to is always a call. The
 * arguments are then copied as the model wrote them, not parsed and written again, so their
 * numbers keep their digits. A scan over the (valid) text finds the members' spans. */
#include <jansson.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "model/json_accept.h"
#include "tag_scan.h"
#include "tool_calls.h"

static bool valid_object(const char *p, size_t n) {
    json_error_t jerr;
    json_t *v = json_loadb(p, n, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    bool ok = json_is_object(v);
    json_decref(v);
    if (ok) return true;
    csd_json_accept a;
    csd_json_accept_init(&a);
    return csd_json_accept_bytes(&a, (const uint8_t *)p, (uint32_t)n) && csd_json_accept_done(&a);
}

/* ---- spans of valid JSON ---- */

static size_t skip_space(const char *p, size_t i, size_t n) {
    while (i < n && csd_tag_is_space(p[i])) i++;
    return i;
}

/* p[i] is '"': the index just past the closing quote. */
static size_t skip_string(const char *p, size_t i, size_t n) {
    for (i++; i < n && p[i] != '"'; i++)
        if (p[i] == '\\') i++;
    return i + 1;
}

size_t csd_tool_json_close(const char *p, size_t n) {
    size_t depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return 0;
            if (--depth == 0) return i + 1;
        }
    }
    return 0;
}

/* The index just past the value that starts at p[i]. */
static size_t skip_value(const char *p, size_t i, size_t n) {
    if (p[i] == '"') return skip_string(p, i, n);
    if (p[i] != '{' && p[i] != '[') { /* a number, true, false or null */
        while (i < n && !csd_tag_is_space(p[i]) && p[i] != ',' && p[i] != '}' && p[i] != ']') i++;
        return i;
    }
    size_t end = csd_tool_json_close(p + i, n - i);
    return end ? i + end : n;
}

/* Decodes the JSON string at p[0, n) into *out (csd_alloc'd; *len its bytes). Returns 0, 1 when
 * it is not a string, or CSD_ENOMEM. */
static int decode_string(const char *p, size_t n, char **out, size_t *len) {
    json_error_t jerr;
    json_t *v = json_loadb(p, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    int rc = 1;
    if (json_is_string(v)) {
        *len = json_string_length(v);
        *out = csd_alloc(*len + 1);
        if (*out) memcpy(*out, json_string_value(v), *len);
        rc = *out ? 0 : CSD_ENOMEM;
    }
    json_decref(v);
    return rc;
}

typedef struct span {
    size_t at, len; /* len 0: absent */
} span;

/* Is the key string p[at, end) (quotes included) the name want? A key with escapes is decoded
 * first ("n\u0061me" is "name", as jansson reads it). */
static bool key_is(const char *p, size_t at, size_t end, const char *want) {
    size_t n = end - at - 2, len = 0;
    if (!memchr(p + at + 1, '\\', n)) return n == strlen(want) && !memcmp(p + at + 1, want, n);
    char *key = NULL;
    bool same = !decode_string(p + at, end - at, &key, &len) && len == strlen(want) &&
                !memcmp(key, want, len);
    csd_free(key);
    return same;
}

/* The spans of the members "name", "arguments" and "parameters" of the object p[0, n); false
 * when one of them appears twice. */
static bool find_members(const char *p, size_t n, span *name, span *args, span *params) {
    static const char *const keys[] = {"name", "arguments", "parameters"};
    span *slots[] = {name, args, params};
    size_t i = skip_space(p, 0, n) + 1; /* past '{' */
    for (;;) {
        i = skip_space(p, i, n);
        if (i >= n || p[i] == '}') return true;
        size_t key = i, key_end = skip_string(p, i, n); /* quotes included */
        i = skip_space(p, key_end, n) + 1; /* past ':' */
        i = skip_space(p, i, n);
        size_t value = i;
        i = skip_value(p, i, n);
        for (int k = 0; k < 3; k++) {
            if (!key_is(p, key, key_end, keys[k])) continue;
            if (slots[k]->len) return false;
            *slots[k] = (span){value, i - value};
        }
        i = skip_space(p, i, n);
        if (i < n && p[i] == ',') i++;
    }
}

/* ---- the call ---- */

static char *copy_n(const char *s, size_t n) {
    char *c = csd_alloc(n + 1);
    if (c && n) memcpy(c, s, n);
    return c;
}

/* The arguments as JSON text: an object as written, a string's contents, "{}" when absent or
 * null. Returns 0, 1 when they are none of these, or CSD_ENOMEM. */
static int arguments_text(const char *p, span args, char **out) {
    size_t len = 0;
    if (args.len && p[args.at] == '"') { /* arguments written as a string: its contents */
        int rc = decode_string(p + args.at, args.len, out, &len);
        if (!rc && strlen(*out) != len) { /* a NUL would cut them */
            csd_free(*out);
            *out = NULL;
            rc = 1;
        }
        return rc;
    }
    if (!args.len || (args.len == 4 && !memcmp(p + args.at, "null", 4)))
        *out = copy_n("{}", 2);
    else if (p[args.at] == '{')
        *out = copy_n(p + args.at, args.len);
    else
        return 1;
    return *out ? 0 : CSD_ENOMEM;
}

int csd_tool_call_parse(const char *body, size_t len, bool need_arguments, csd_tool_call *out) {
    memset(out, 0, sizeof *out);
    size_t lead = csd_tag_space_after(body, len, len);
    body += lead;
    len -= lead;
    len -= csd_tag_space_before(body, len, len);
    if (!len || body[0] != '{' || !valid_object(body, len)) return 1;
    span name = {0, 0}, args = {0, 0}, params = {0, 0};
    if (!find_members(body, len, &name, &args, &params)) return 1; /* a member twice */
    if (!name.len || body[name.at] != '"' || (need_arguments && !args.len && !params.len)) return 1;
    size_t name_len = 0;
    int rc = decode_string(body + name.at, name.len, &out->name, &name_len);
    if (!rc && (name_len == 0 || strlen(out->name) != name_len)) rc = 1; /* empty, or a NUL */
    if (!rc) rc = arguments_text(body, args.len ? args : params, &out->arguments);
    if (rc) csd_tool_call_fini(out);
    return rc;
}

int csd_tool_call_make(const char *name, size_t name_len, const char *args, size_t args_len,
                       csd_tool_call *out) {
    memset(out, 0, sizeof *out);
    if (!name_len || memchr(name, '\0', name_len) || !valid_object(args, args_len)) return 1;
    out->name = copy_n(name, name_len);
    out->arguments = copy_n(args, args_len);
    if (out->name && out->arguments) return 0;
    csd_tool_call_fini(out);
    return CSD_ENOMEM;
}

void csd_tool_call_fini(csd_tool_call *c) {
    if (!c) return;
    csd_free(c->name);
    csd_free(c->arguments);
    memset(c, 0, sizeof *c);
}
