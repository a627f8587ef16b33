/* tool_request: `tools` and `tool_choice` (see tool_request.h). */
#include "tool_request.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

static int out_of_memory(csd_http_error *e) {
    return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* tools[k]: {"type": "function", "function": {"name": ..., "parameters": {...}}}; the name must
 * differ from those of tools[0, k). */
static int check_tool(const json_t *tools, size_t k, csd_http_error *e) {
    const json_t *t = json_array_get(tools, k);
    char field[96];
    snprintf(field, sizeof field, "tools[%zu]", k);
    if (!json_is_object(t)) return csd_http_bad_type(e, field, "an object");
    const json_t *type = csd_http_member(t, "type");
    snprintf(field, sizeof field, "tools[%zu].type", k);
    if (type && !json_is_string(type)) return csd_http_bad_type(e, field, "a string");
    if (type && strcmp(json_string_value(type), "function"))
        return csd_http_error_set(e, 400, NULL, field, "unsupported_value",
                                  "only 'function' tools are supported");
    const json_t *fn = json_object_get(t, "function");
    snprintf(field, sizeof field, "tools[%zu].function", k);
    if (!json_is_object(fn)) return csd_http_bad_type(e, field, "an object");
    const json_t *name = json_object_get(fn, "name");
    snprintf(field, sizeof field, "tools[%zu].function.name", k);
    if (!json_is_string(name)) return csd_http_bad_type(e, field, "a string");
    size_t len = json_string_length(name);
    if (len == 0 || len > CSD_HTTP_MAX_TOOL_NAME || strlen(json_string_value(name)) != len)
        return csd_http_bad_value(e, field, "a name of 1 to 256 bytes");
    for (size_t i = 0; i < k; i++) {
        const json_t *other = json_object_get(json_object_get(json_array_get(tools, i), "function"),
                                              "name");
        if (json_equal(name, other))
            return csd_http_error_set(e, 400, NULL, field, "invalid_value",
                                      "tools[%zu] and tools[%zu] are both named '%.64s'", i, k,
                                      json_string_value(name));
    }
    const json_t *params = csd_http_member(fn, "parameters");
    snprintf(field, sizeof field, "tools[%zu].function.parameters", k);
    if (params && !json_is_object(params)) return csd_http_bad_type(e, field, "an object");
    return 0;
}

/* The index of the tool named name (compared whole: a NUL in it names no tool), or -1. */
static int tool_index(const json_t *tools, const json_t *name) {
    size_t k;
    const json_t *t;
    json_array_foreach(tools, k, t) {
        const json_t *n = json_object_get(json_object_get(t, "function"), "name");
        if (json_equal(n, name)) return (int)k;
    }
    return -1;
}

/* A forced call's answer is JSON already: response_format cannot ask for another. */
static int json_conflict(csd_http_error *e) {
    return csd_http_error_set(e, 400, NULL, "tool_choice", "invalid_value",
                              "a forced tool call cannot be combined with a JSON response_format "
                              "(the call's arguments are JSON already)");
}

/* tools[k]'s parameters as a schema: absent, a function that takes none. New reference. */
static json_t *params_schema(const json_t *tools, size_t k) {
    const json_t *fn = json_object_get(json_array_get(tools, k), "function");
    json_t *params = csd_http_member(fn, "parameters");
    return params ? json_incref(params) : json_pack("{s:s, s:{}}", "type", "object", "properties");
}

/* A named function: the answer is its arguments, valid against its parameters. */
static int force_named(csd_http_req *r, int k, csd_http_error *e) {
    if (r->json_object) return json_conflict(e);
    const json_t *fn = json_object_get(json_array_get(r->tools, (size_t)k), "function");
    r->tool_mode = CSD_HTTP_TOOLS_NAMED;
    r->tool_name = csd_strdup(json_string_value(json_object_get(fn, "name")));
    json_t *params = params_schema(r->tools, (size_t)k);
    if (!r->tool_name || !params) {
        json_decref(params);
        return out_of_memory(e);
    }
    char param[96];
    snprintf(param, sizeof param, "tools[%d].function.parameters", k);
    int rc = csd_http_compile_schema(r, params, param, e);
    json_decref(params);
    return rc;
}

/* A copy of a tool's parameters to be the "arguments" of a union's branch: with an "$id" that
 * starts a document (unless they have one) so that their "$ref"s keep naming their own "$defs",
 * and "type": "object" when nothing says what the arguments are. New reference or NULL. */
static json_t *own_params(const json_t *tools, size_t k) {
    json_t *params = params_schema(tools, k);
    json_t *own = params ? json_copy(params) : NULL;
    json_decref(params);
    if (!own) return NULL;
    static const char *const typed[] = {"type", "anyOf", "oneOf", "$ref", "enum", "const"};
    bool untyped = true;
    for (size_t i = 0; i < sizeof typed / sizeof *typed; i++)
        untyped &= !json_object_get(own, typed[i]);
    const char *had = json_string_value(json_object_get(own, "$id"));
    char id[64];
    snprintf(id, sizeof id, "cascadia:tools/%zu", k);
    int rc = had && had[0] != '#' ? 0 : json_object_set_new(own, "$id", json_string(id));
    if (!rc && untyped) rc = json_object_set_new(own, "type", json_string("object"));
    if (!rc) return own;
    json_decref(own);
    return NULL;
}

/* The schema of tools[k]'s arguments in "required"'s union (a new reference; NULL when out of
 * memory): its parameters, when they are inside the subset and allow nothing but objects; else
 * any object, the guarantee a tool keeps whose parameters a named call of it would refuse. */
static json_t *pick_arguments(const json_t *tools, size_t k) {
    json_t *own = own_params(tools, k);
    if (!own) return NULL;
    csd_json_schema *alone = NULL;
    csd_err err = {0};
    int rc = csd_json_schema_compile(&alone, own, &err);
    bool objects = !rc && alone->nodes[alone->root].types == CSD_JT_OBJECT &&
                   !alone->nodes[alone->root].n_lits;
    csd_json_schema_destroy(alone);
    if (objects) return own;
    json_decref(own);
    return rc == CSD_ENOMEM ? NULL : json_pack("{s:s}", "type", "object");
}

/* "required" among several tools: {"name": one of the tools, "arguments": ARGS(k)}, as a union of
 * objects told apart by the name (model/json_schema.h); ARGS(k) is tools[k]'s pick_arguments when
 * each_tool, else any object. New reference or NULL. */
static json_t *pick_schema(const json_t *tools, bool each_tool) {
    json_t *branches = json_array();
    for (size_t k = 0; k < json_array_size(tools) && branches; k++) {
        const json_t *name = json_object_get(json_object_get(json_array_get(tools, k), "function"),
                                             "name");
        json_t *args = each_tool ? pick_arguments(tools, k) : json_pack("{s:s}", "type", "object");
        json_t *branch = !args ? NULL
                               : json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s], s:b}", "type",
                                           "object", "properties", "name", "const", name,
                                           "arguments", args, "required", "name", "arguments",
                                           "additionalProperties", 0);
        if (!branch || json_array_append_new(branches, branch)) {
            json_decref(branches);
            branches = NULL;
        }
    }
    return branches ? json_pack("{s:o}", "anyOf", branches) : NULL;
}

/* "required" among several tools: each tool's arguments valid against its own parameters. When
 * the tools together pass the schema bounds, any object for every tool (a 400 would refuse tools
 * that each fit). */
static int force_pick(csd_http_req *r, csd_http_error *e) {
    if (r->json_object) return json_conflict(e);
    r->tool_mode = CSD_HTTP_TOOLS_PICK;
    if (json_array_size(r->tools) > CSD_SCHEMA_MAX_ENUM)
        return csd_http_error_set(e, 400, NULL, "tool_choice", "unsupported_value",
                                  "tool_choice 'required' takes at most %d tools (name one, or "
                                  "send fewer)", CSD_SCHEMA_MAX_ENUM);
    int rc = 0;
    for (int each_tool = 1; each_tool >= 0; each_tool--) {
        json_t *schema = pick_schema(r->tools, each_tool);
        if (!schema) return out_of_memory(e);
        rc = csd_http_compile_schema(r, schema, "tools", e);
        json_decref(schema);
        if (!rc || e->status != 400) break;
    }
    return rc;
}

/* tool_choice as a string: "none", "auto" or "required". */
static int choice_string(csd_http_req *r, const char *s, csd_http_error *e) {
    if (!strcmp(s, "none")) return 0;
    if (!strcmp(s, "auto")) {
        if (r->tools) r->tool_mode = CSD_HTTP_TOOLS_AUTO;
        return 0;
    }
    if (strcmp(s, "required"))
        return csd_http_bad_value(e, "tool_choice", "'none', 'auto', 'required' or an object");
    if (!r->tools)
        return csd_http_error_set(e, 400, NULL, "tool_choice", "invalid_value",
                                  "tool_choice 'required' needs tools");
    return json_array_size(r->tools) == 1 ? force_named(r, 0, e) : force_pick(r, e);
}

/* tool_choice as an object: {"type": "function", "function": {"name": ...}}. */
static int choice_object(csd_http_req *r, const json_t *tc, csd_http_error *e) {
    const json_t *type = json_object_get(tc, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "function"))
        return csd_http_bad_value(e, "tool_choice.type", "'function'");
    const json_t *fn = json_object_get(tc, "function");
    if (!json_is_object(fn)) return csd_http_bad_type(e, "tool_choice.function", "an object");
    const json_t *name = json_object_get(fn, "name");
    if (!json_is_string(name))
        return csd_http_bad_type(e, "tool_choice.function.name", "a string");
    int k = r->tools ? tool_index(r->tools, name) : -1;
    if (k < 0)
        return csd_http_error_set(e, 400, NULL, "tool_choice.function.name", "invalid_value",
                                  "tool_choice names '%.64s', which is not among the tools",
                                  json_string_value(name));
    return force_named(r, k, e);
}

int csd_http_parse_tools(const json_t *root, csd_http_req *r, csd_http_error *e) {
    bool parallel = true;
    int prc = csd_http_read_bool(root, "parallel_tool_calls", &parallel, e);
    if (prc) return prc;
    r->one_tool_call = !parallel;
    const json_t *tools = csd_http_member(root, "tools");
    if (tools) {
        if (!json_is_array(tools)) return csd_http_bad_type(e, "tools", "an array");
        if (json_array_size(tools) > CSD_HTTP_MAX_TOOLS)
            return csd_http_bad_value(e, "tools", "at most 128 tools");
        if (csd_http_json_depth(tools, CSD_HTTP_MAX_JSON_DEPTH) > CSD_HTTP_MAX_JSON_DEPTH)
            return csd_http_bad_value(e, "tools", "nested less deeply");
        for (size_t k = 0; k < json_array_size(tools); k++) {
            int rc = check_tool(tools, k, e);
            if (rc) return rc;
        }
        if (json_array_size(tools) > 0) {
            r->tools = json_incref((json_t *)tools);
            r->tool_mode = CSD_HTTP_TOOLS_AUTO; /* OpenAI's default with tools */
        }
    }
    const json_t *tc = csd_http_member(root, "tool_choice");
    if (!tc) return 0;
    if (!json_is_string(tc) && !json_is_object(tc))
        return csd_http_bad_type(e, "tool_choice", "a string or an object");
    if (csd_http_json_depth(tc, CSD_HTTP_MAX_JSON_DEPTH) > CSD_HTTP_MAX_JSON_DEPTH)
        return csd_http_bad_value(e, "tool_choice", "nested less deeply");
    r->tool_choice = json_incref((json_t *)tc);
    r->tool_mode = CSD_HTTP_TOOLS_OFF;
    return json_is_string(tc) ? choice_string(r, json_string_value(tc), e)
                              : choice_object(r, tc, e);
}

json_t *csd_http_history_calls(const json_t *tool_calls) {
    json_t *copy = json_deep_copy(tool_calls);
    size_t i;
    json_t *call;
    json_array_foreach(copy, i, call) {
        json_t *fn = json_object_get(call, "function");
        const json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(args)) continue;
        json_error_t jerr;
        json_t *obj = json_loadb(json_string_value(args), json_string_length(args), 0, &jerr);
        if (json_is_object(obj) &&
            csd_http_json_depth(obj, CSD_HTTP_MAX_JSON_DEPTH) <= CSD_HTTP_MAX_JSON_DEPTH) {
            json_object_set_new(fn, "arguments", obj);
            continue;
        }
        json_decref(obj); /* not an object: the string stays */
    }
    return copy;
}
