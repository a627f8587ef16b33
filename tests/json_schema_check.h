/* json_schema_check: an independent check of a parsed JSON value against a JSON Schema of the
 * subset model/json_schema.h compiles, written from the JSON Schema rules and not from the
 * acceptor, for the tests and the fuzz target. Also checks what the acceptor promises beyond
 * validity: an object's members come in the schema's property order. */
#ifndef CSD_TEST_JSON_SCHEMA_CHECK_H
#define CSD_TEST_JSON_SCHEMA_CHECK_H

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

static bool check_type(const char *name, const json_t *v) {
    if (!strcmp(name, "object")) return json_is_object(v);
    if (!strcmp(name, "array")) return json_is_array(v);
    if (!strcmp(name, "string")) return json_is_string(v);
    if (!strcmp(name, "integer")) /* 2.0 is an integer too (JSON Schema draft 6 on) */
        return json_is_integer(v) || (json_is_real(v) && isfinite(json_real_value(v)) &&
                                      floor(json_real_value(v)) == json_real_value(v));
    if (!strcmp(name, "number")) return json_is_number(v);
    if (!strcmp(name, "boolean")) return json_is_boolean(v);
    if (!strcmp(name, "null")) return json_is_null(v);
    return false;
}

static bool check_types(const json_t *t, const json_t *v) {
    if (json_is_string(t)) return check_type(json_string_value(t), v);
    size_t i;
    const json_t *name;
    json_array_foreach(t, i, name)
        if (check_type(json_string_value(name), v)) return true;
    return false;
}

static bool schema_check(const json_t *s, const json_t *v);

/* The schema whose $defs a "$ref" names: the root (schema_check_root sets it), or the nearest
 * one with an "$id" around the place being checked. */
static const json_t *check_root;

/* The definition "#/$defs/NAME" or "#/definitions/NAME" names ("~0" in NAME is "~", "~1" is
 * "/"), or NULL. */
static const json_t *check_ref(const char *ref) {
    const char *defs = !ref ? NULL : !strncmp(ref, "#/$defs/", 8) ? "$defs"
                                   : !strncmp(ref, "#/definitions/", 14) ? "definitions" : NULL;
    if (!defs) return NULL;
    char name[256];
    size_t n = 0;
    for (const char *c = ref + strlen(defs) + 3; *c && n + 1 < sizeof name; c++) {
        bool esc = c[0] == '~' && (c[1] == '0' || c[1] == '1');
        name[n++] = esc ? (c[1] == '0' ? '~' : '/') : *c;
        c += esc;
    }
    name[n] = '\0';
    return json_object_get(json_object_get(check_root, defs), name);
}

/* JSON Schema's equality: numbers by value (1 and 1.0 are one number), the rest as jansson's. */
static bool same_json(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

/* Members: each named property valid, the required ones present, no others when
 * additionalProperties is false, and in the schema's order (a member's property comes after the one
 * before it). */
static bool check_members(const json_t *s, const json_t *v) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    size_t i;
    const json_t *name;
    json_array_foreach(req, i, name)
        if (!json_object_get(v, json_string_value(name))) return false;
    if (!props) return !json_is_false(json_object_get(s, "additionalProperties")) ||
                       json_object_size(v) == 0;
    const char *key, *pkey;
    const json_t *x, *ps;
    size_t last = 0;
    json_object_foreach((json_t *)v, key, x) {
        size_t place = 0;
        bool found = false;
        json_object_foreach((json_t *)props, pkey, ps) {
            place++;
            if (!strcmp(pkey, key)) {
                found = true;
                break;
            }
        }
        if (!found || place <= last || !schema_check(ps, x)) return false;
        last = place;
    }
    return true;
}

static bool check_items(const json_t *s, const json_t *v) {
    const json_t *items = json_object_get(s, "items"), *lo = json_object_get(s, "minItems"),
                 *hi = json_object_get(s, "maxItems");
    if (lo && (json_int_t)json_array_size(v) < json_integer_value(lo)) return false;
    if (hi && (json_int_t)json_array_size(v) > json_integer_value(hi)) return false;
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x)
        if (items && !schema_check(items, x)) return false;
    return true;
}

static bool schema_check_in(const json_t *s, const json_t *v);

/* A schema with an "$id" is a document of its own: its "$ref"s name its "$defs". An "$id" that is
 * only a fragment ("#a", draft 7's anchor) is not. */
static bool schema_check(const json_t *s, const json_t *v) {
    const char *id = json_string_value(json_object_get(s, "$id"));
    if (!id || id[0] == '#') return schema_check_in(s, v);
    const json_t *outer = check_root;
    check_root = s;
    bool ok = schema_check_in(s, v);
    check_root = outer;
    return ok;
}

static bool schema_check_in(const json_t *s, const json_t *v) {
    if (json_is_true(s)) return true;
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const json_t *target = check_ref(json_string_value(ref));
        return target && schema_check(target, v);
    }
    const json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any || one) { /* anyOf: at least one branch fits; oneOf: exactly one */
        size_t i, n = 0;
        const json_t *br;
        json_array_foreach(any ? any : one, i, br) n += schema_check(br, v);
        return any ? n >= 1 : n == 1;
    }
    const json_t *t = json_object_get(s, "type"), *en = json_object_get(s, "enum"),
                 *cn = json_object_get(s, "const");
    if (t && !check_types(t, v)) return false;
    if (cn && !same_json(cn, v)) return false;
    if (en) {
        bool in = false;
        size_t i;
        const json_t *x;
        json_array_foreach(en, i, x) in |= same_json(x, v);
        if (!in) return false;
    }
    if (json_is_object(v)) return check_members(s, v);
    if (json_is_array(v)) return check_items(s, v);
    return true;
}

/* v against the whole schema root (its $refs resolved in it). */
static bool schema_check_root(const json_t *root, const json_t *v) {
    check_root = root;
    return schema_check(root, v);
}

#endif
