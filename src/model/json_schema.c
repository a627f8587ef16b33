/* json_schema: compiling a JSON Schema into nodes for the acceptor (json_schema.h). A builder with
 * room for the largest schema allowed gathers the nodes, properties and literals while the schema
 * is walked; the result is packed into one allocation. */
#include "model/json_schema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "model/json_accept.h"

#define MAX_LITS 4096
#define PATH_MAX_LEN 512
#define MAX_SCHEMA_LEVELS 64 /* schemas inside schemas, anyOf branches too: bounds the recursion */

typedef struct builder {
    csd_schema_node nodes[CSD_SCHEMA_MAX_NODES];
    csd_schema_prop props[CSD_SCHEMA_MAX_NODES];
    csd_schema_lit lits[MAX_LITS];
    uint8_t bytes[CSD_SCHEMA_MAX_BYTES];
    uint32_t n_nodes, n_props, n_lits, n_bytes;
    int levels; /* schemas being compiled, one inside the other */
    const json_t *root;                          /* whose $defs a $ref names */
    const json_t *expanding[MAX_SCHEMA_LEVELS];  /* definitions being compiled, outermost first */
    int n_expanding;
    csd_err *err;
} builder;

/* The error, naming the place (its last 100 characters when longer) and the problem. */
static int fail(builder *b, const char *path, const char *what, const char *detail) {
    size_t len = strlen(path);
    const char *shown = len > 100 ? path + len - 100 : *path ? path : "/";
    return csd_err_set(b->err, CSD_EINVAL, "schema at '%s%s': %s%s",
                       len > 100 ? "..." : "", shown, what, detail);
}

/* path + "/" + a + "/" + b as a JSON Pointer (b escaped: "~" as "~0", "/" as "~1"; NULL: none).
 * A place too long for out ends in "/..." instead of being cut anywhere. */
static void child_path(char *out, size_t cap, const char *path, const char *a, const char *b) {
    size_t n = (size_t)snprintf(out, cap, "%s/%s%s", path, a, b ? "/" : "");
    for (const char *c = b; c && *c && n < cap; c++) {
        if (*c == '~' || *c == '/') {
            n += (size_t)snprintf(out + n, cap - n, "~%c", *c == '~' ? '0' : '1');
        } else if (n + 1 < cap) {
            out[n++] = *c;
            out[n] = '\0';
        } else {
            n = cap;
        }
    }
    if (n < cap) return;
    size_t end = cap - 5; /* the marker goes here, moved back off a cut escape or character */
    while (end > 0 && (out[end - 1] == '~' || ((uint8_t)out[end] & 0xC0) == 0x80)) end--;
    memcpy(out + end, "/...", 5);
}

/* Keywords that constrain nothing here ($defs and definitions only hold what a $ref names). */
static const char *const annotations[] = {"title", "description", "default", "examples", "$schema",
                                          "$id", "$comment", "deprecated", "readOnly",
                                          "writeOnly", "$defs", "definitions", NULL};
static const char *const supported[] = {"type", "properties", "required", "additionalProperties",
                                        "items", "minItems", "maxItems", "enum", "const", "anyOf",
                                        "oneOf", "$ref", NULL};

static bool listed(const char *const *list, const char *key) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], key)) return true;
    return false;
}

static int new_node(builder *b, const char *path, uint16_t *out) {
    if (b->n_nodes >= CSD_SCHEMA_MAX_NODES)
        return fail(b, path, "more than 1024 schemas in one response_format", "");
    csd_schema_node *n = &b->nodes[b->n_nodes];
    memset(n, 0, sizeof *n);
    n->types = CSD_JT_ANY;
    n->free_object = true;
    n->max_items = CSD_SCHEMA_MAX_ITEMS;
    *out = (uint16_t)b->n_nodes++;
    return 0;
}

/* v in compact JSON; a real with the fewest digits that read back as the same double (0.1, not
 * jansson's default 0.10000000000000001). NULL when out of memory. */
static char *dump_literal(const json_t *v) {
    size_t flags = JSON_ENCODE_ANY | JSON_COMPACT;
    if (!json_is_real(v)) return json_dumps(v, flags);
    double x = fabs(json_real_value(v)); /* fewer digits than the integer part's: an exponent */
    int first = x >= 1 && x < 1e17 ? (int)floor(log10(x)) + 1 : 1;
    for (int digits = first; digits < 17; digits++) {
        char *s = json_dumps(v, flags | JSON_REAL_PRECISION(digits));
        if (!s || strtod(s, NULL) == json_real_value(v)) return s;
        free(s);
    }
    return json_dumps(v, flags | JSON_REAL_PRECISION(17));
}

/* A literal: v in compact JSON. */
static int add_lit(builder *b, const char *path, const json_t *v, uint16_t *out) {
    char *s = dump_literal(v);
    if (!s) return csd_err_set(b->err, CSD_ENOMEM, "schema literal");
    size_t len = strlen(s);
    int rc = 0;
    if (b->n_lits >= MAX_LITS || len > CSD_SCHEMA_MAX_BYTES - b->n_bytes)
        rc = fail(b, path, "more than 4096 keys and enum values, or 64 KB of them", "");
    else if (json_is_number(v) && len > CSD_JSON_MAX_NUMBER)
        rc = fail(b, path, "a number literal longer than 32 characters", "");
    if (!rc) {
        memcpy(b->bytes + b->n_bytes, s, len);
        b->lits[b->n_lits] = (csd_schema_lit){.off = b->n_bytes, .len = (uint32_t)len};
        b->n_bytes += (uint32_t)len;
        *out = (uint16_t)b->n_lits++;
    }
    free(s); /* jansson's allocator */
    return rc;
}

/* A string without a NUL (a name cut at its NUL would stand for another). */
static bool whole_string(const json_t *s) {
    return json_is_string(s) && strlen(json_string_value(s)) == json_string_length(s);
}

static int type_bit(const json_t *name) {
    static const char *const names[] = {"object", "array", "string", "integer", "number",
                                        "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (whole_string(name) && !strcmp(json_string_value(name), names[i])) return 1 << i;
    return 0;
}

/* "type": one name or a non-empty list of names. */
static int parse_type(builder *b, const char *path, const json_t *t, uint8_t *types) {
    if (json_is_string(t)) {
        *types = (uint8_t)type_bit(t);
        if (!*types) return fail(b, path, "unknown type ", json_string_value(t));
    } else if (json_is_array(t) && json_array_size(t) > 0 && json_array_size(t) <= 7) {
        *types = 0;
        size_t i;
        const json_t *name;
        json_array_foreach(t, i, name) {
            int bit = type_bit(name);
            if (!bit) return fail(b, path, "type lists an unknown type", "");
            *types |= (uint8_t)bit;
        }
    } else {
        return fail(b, path, "type must be a type name or a list of up to 7 of them", "");
    }
    if (*types & CSD_JT_NUMBER) *types |= CSD_JT_INTEGER;
    return 0;
}

/* The JSON type of a scalar literal, as a CSD_JT_* bit. */
static uint8_t value_type(const json_t *v) {
    if (json_is_string(v)) return CSD_JT_STRING;
    if (json_is_integer(v)) return CSD_JT_INTEGER | CSD_JT_NUMBER;
    if (json_is_real(v)) { /* 2.0 is an integer too (JSON Schema draft 6 on) */
        double x = json_real_value(v);
        return CSD_JT_NUMBER | (isfinite(x) && floor(x) == x ? CSD_JT_INTEGER : 0);
    }
    if (json_is_boolean(v)) return CSD_JT_BOOLEAN;
    if (json_is_null(v)) return CSD_JT_NULL;
    return 0; /* an object or array */
}

/* "enum" (a list) or "const" (one value, kw names which): the literals of node n that have its
 * types. */
static int parse_enum(builder *b, const char *path, const char *kw, const json_t *list,
                      csd_schema_node *n) {
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail(b, path, kw, " must be a non-empty list");
    if (json_array_size(list) > CSD_SCHEMA_MAX_ENUM)
        return fail(b, path, kw, " has more than 64 values");
    n->first_lit = (uint16_t)b->n_lits;
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v) {
        uint8_t t = value_type(v);
        if (!t) return fail(b, path, kw, " values must be strings, numbers, booleans or null");
        if (!(t & n->types)) continue; /* a value of another type can never be valid */
        uint16_t lit;
        int rc = add_lit(b, path, v, &lit);
        if (rc) return rc;
        n->n_lits++;
    }
    if (n->n_lits == 0) return fail(b, path, kw, ": no value has the schema's type");
    return 0;
}

static int compile(builder *b, const json_t *s, const char *path, int depth, uint16_t *out);

static int parse_properties(builder *b, const char *path, const json_t *s, int depth,
                            csd_schema_node *n) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    char sub[PATH_MAX_LEN];
    if (!json_is_object(props)) return fail(b, path, "properties must be an object", "");
    if (json_object_size(props) > CSD_SCHEMA_MAX_PROPS)
        return fail(b, path, "more than 64 properties in one object", "");
    if (b->n_props + json_object_size(props) > CSD_SCHEMA_MAX_NODES)
        return fail(b, path, "more than 1024 properties in one response_format", "");
    /* the properties take consecutive places first: the nested ones come after */
    uint16_t first = (uint16_t)b->n_props;
    n->first_prop = first;
    n->n_props = (uint16_t)json_object_size(props);
    n->free_object = false;
    b->n_props += n->n_props;
    const char *key;
    const json_t *v;
    uint16_t i = 0;
    /* the keys first, so an object's keys are consecutive literals (the acceptor's candidates) */
    json_object_foreach((json_t *)props, key, v) {
        csd_schema_prop *p = &b->props[first + i++];
        json_t *k = json_string(key);
        int rc = k ? add_lit(b, path, k, &p->key_lit) : csd_err_set(b->err, CSD_ENOMEM, "key");
        json_decref(k);
        if (rc) return rc;
        p->required = false;
    }
    i = 0;
    json_object_foreach((json_t *)props, key, v) {
        child_path(sub, sizeof sub, path, "properties", key);
        int rc = compile(b, v, sub, depth + 1, &b->props[first + i++].node);
        if (rc) return rc;
    }
    if (!req) return 0;
    if (!json_is_array(req) || json_array_size(req) > CSD_SCHEMA_MAX_PROPS)
        return fail(b, path, "required must be a list of up to 64 names", "");
    size_t j;
    json_array_foreach(req, j, v) {
        const char *name = json_string_value(v);
        if (!name) return fail(b, path, "required must be a list of names", "");
        if (!whole_string(v)) return fail(b, path, "a required name holds a NUL: ", name);
        uint16_t k = 0;
        const json_t *pv;
        json_object_foreach((json_t *)props, key, pv) {
            if (!strcmp(key, name)) break;
            k++;
        }
        if (k == n->n_props) return fail(b, path, "required names a property not in properties: ",
                                         name);
        b->props[first + k].required = true;
    }
    return 0;
}

static int parse_count(builder *b, const char *path, const json_t *v, const char *name,
                       uint16_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > CSD_SCHEMA_MAX_ITEMS)
        return fail(b, path, name, " must be an integer from 0 to 65535");
    *out = (uint16_t)json_integer_value(v);
    return 0;
}

static int parse_array(builder *b, const char *path, const json_t *s, int depth,
                       csd_schema_node *n) {
    const json_t *items = json_object_get(s, "items");
    const json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems");
    int rc = 0;
    char sub[PATH_MAX_LEN];
    child_path(sub, sizeof sub, path, "items", NULL);
    uint16_t item_node = 0;
    if (items && !json_is_object(items) && !json_is_true(items))
        return fail(b, path, "items must be a schema (lists of item schemas are not supported)",
                    "");
    if (items) rc = compile(b, items, sub, depth + 1, &item_node);
    if (!rc && lo) rc = parse_count(b, path, lo, "minItems", &n->min_items);
    if (!rc && hi) rc = parse_count(b, path, hi, "maxItems", &n->max_items);
    if (!rc && n->min_items > n->max_items)
        rc = fail(b, path, "minItems is above maxItems", "");
    n->items = item_node;
    return rc;
}

/* Appends a literal entry (the same bytes as literal i: a node's literals must be consecutive). */
static int repeat_lit(builder *b, const char *path, uint16_t i) {
    if (b->n_lits >= MAX_LITS) return fail(b, path, "more than 4096 keys and enum values", "");
    b->lits[b->n_lits++] = b->lits[i];
    return 0;
}

/* Literals x and y are the same JSON value: the same bytes, or equal numbers (1 and 1.0). */
static bool same_value(const builder *b, const csd_schema_lit *x, const csd_schema_lit *y) {
    const uint8_t *p = b->bytes + x->off, *q = b->bytes + y->off;
    if (x->len == y->len && !memcmp(p, q, x->len)) return true;
    bool numbers = (*p == '-' || (*p >= '0' && *p <= '9')) &&
                   (*q == '-' || (*q >= '0' && *q <= '9'));
    if (!numbers || x->len > CSD_JSON_MAX_NUMBER || y->len > CSD_JSON_MAX_NUMBER) return false;
    char u[CSD_JSON_MAX_NUMBER + 1], v[CSD_JSON_MAX_NUMBER + 1];
    snprintf(u, sizeof u, "%.*s", (int)x->len, (const char *)p);
    snprintf(v, sizeof v, "%.*s", (int)y->len, (const char *)q);
    if (!strpbrk(u, ".eE") && !strpbrk(v, ".eE")) /* integers: exactly (doubles lose past 2^53) */
        return !strcmp(strcmp(u, "-0") ? u : "0", strcmp(v, "-0") ? v : "0");
    return strtod(u, NULL) == strtod(v, NULL);
}

/* oneOf: a value two branches allow is valid against neither. */
static int check_one_of(builder *b, const char *path, const csd_schema_node *m) {
    for (uint16_t i = 0; i < m->n_lits; i++)
        for (uint16_t j = i + 1; j < m->n_lits; j++)
            if (same_value(b, &b->lits[m->first_lit + i], &b->lits[m->first_lit + j]))
                return fail(b, path, "oneOf branches allow the same value", "");
    return 0;
}

/* anyOf branches where one is an enum: every value any branch allows is a literal, so the merged
 * node is one enum (Pydantic's Optional[Literal[...]]: an enum and null). */
static int merge_enums(builder *b, const char *path, const char *kw, const uint16_t *br, size_t n,
                       csd_schema_node *m) {
    m->first_lit = (uint16_t)b->n_lits;
    for (size_t i = 0; i < n; i++) {
        const csd_schema_node bn = b->nodes[br[i]];
        int rc = 0;
        for (uint16_t k = 0; k < bn.n_lits && !rc; k++) rc = repeat_lit(b, path, bn.first_lit + k);
        if (!rc && !bn.n_lits) {
            if (bn.types & ~(CSD_JT_NULL | CSD_JT_BOOLEAN))
                return fail(b, path, kw, " may join an enum only with null or boolean branches");
            uint16_t lit;
            if (bn.types & CSD_JT_NULL) rc = add_lit(b, path, json_null(), &lit);
            if (!rc && (bn.types & CSD_JT_BOOLEAN)) rc = add_lit(b, path, json_true(), &lit);
            if (!rc && (bn.types & CSD_JT_BOOLEAN)) rc = add_lit(b, path, json_false(), &lit);
        }
        if (rc) return rc;
        m->types |= bn.types;
    }
    m->n_lits = (uint16_t)(b->n_lits - m->first_lit);
    if (m->n_lits > CSD_SCHEMA_MAX_ENUM) return fail(b, path, kw, " allows more than 64 values");
    return strcmp(kw, "oneOf") ? 0 : check_one_of(b, path, m);
}

/* Object branch bn's discriminator: its first property, required, an enum or const. Returns that
 * property's index in b->props, or -1 (the branch cannot be told apart by its first bytes). */
static int discriminator(const builder *b, const csd_schema_node *bn) {
    if (bn->free_object || bn->tagged || bn->n_props == 0) return -1;
    const csd_schema_prop *p = &b->props[bn->first_prop];
    return p->required && b->nodes[p->node].n_lits ? (int)bn->first_prop : -1;
}

/* Several object branches: a union told apart by the first property all of them share (Pydantic's
 * discriminated unions, tool calls by name). m gets one property, that key, whose value is one of
 * the branches' values; each of those literals names its branch (alt), which the acceptor follows
 * once the value is written. */
static int merge_objects(builder *b, const char *path, const char *kw, const uint16_t *obj,
                         size_t n, csd_schema_node *m) {
    static const char why[] = " object branches need a first property, required, const or enum, "
                              "with the same key in each and values no other branch has";
    uint16_t tag, key = 0;
    int rc = new_node(b, path, &tag);
    if (rc) return rc;
    if (b->n_props >= CSD_SCHEMA_MAX_NODES)
        return fail(b, path, "more than 1024 properties in one response_format", "");
    csd_schema_node t = b->nodes[tag];
    t.types = 0;
    t.first_lit = (uint16_t)b->n_lits;
    for (size_t i = 0; i < n; i++) {
        int p = discriminator(b, &b->nodes[obj[i]]);
        if (p < 0 || (i > 0 && !same_value(b, &b->lits[key], &b->lits[b->props[p].key_lit])))
            return fail(b, path, kw, why);
        key = b->props[p].key_lit;
        const csd_schema_node v = b->nodes[b->props[p].node];
        for (uint16_t k = 0; k < v.n_lits && !rc; k++) rc = repeat_lit(b, path, v.first_lit + k);
        if (rc) return rc;
        for (uint32_t k = b->n_lits - v.n_lits; k < b->n_lits; k++) b->lits[k].alt = obj[i];
        t.types |= v.types;
    }
    t.n_lits = (uint16_t)(b->n_lits - t.first_lit);
    if (t.n_lits > CSD_SCHEMA_MAX_ENUM)
        return fail(b, path, kw, " discriminator has more than 64 values in all");
    for (uint16_t i = 0; i < t.n_lits; i++)
        for (uint16_t j = i + 1; j < t.n_lits; j++)
            if (b->lits[t.first_lit + i].alt != b->lits[t.first_lit + j].alt &&
                same_value(b, &b->lits[t.first_lit + i], &b->lits[t.first_lit + j]))
                return fail(b, path, kw, why);
    b->nodes[tag] = t;
    m->free_object = false;
    m->tagged = true;
    m->first_prop = (uint16_t)b->n_props;
    m->n_props = 1;
    b->props[b->n_props++] = (csd_schema_prop){.node = tag, .key_lit = key, .required = true};
    return 0;
}

/* anyOf branches of different types merge into one node: the first byte of a value tells which
 * branch it is in, so decoding needs no look-ahead. Object branches may be several when a
 * discriminator tells them apart (merge_objects). */
static int merge_types(builder *b, const char *path, const char *kw, const uint16_t *br, size_t n,
                       csd_schema_node *m) {
    uint16_t obj[CSD_SCHEMA_MAX_ENUM];
    size_t n_obj = 0;
    for (size_t i = 0; i < n; i++) {
        const csd_schema_node bn = b->nodes[br[i]];
        if (bn.types & CSD_JT_OBJECT) obj[n_obj++] = br[i];
        uint8_t t = bn.types | ((bn.types & CSD_JT_INTEGER) ? CSD_JT_NUMBER : 0);
        uint8_t have = m->types | ((m->types & CSD_JT_INTEGER) ? CSD_JT_NUMBER : 0);
        if (t & have & ~CSD_JT_OBJECT)
            return fail(b, path, kw, " branches must have different types");
        m->types |= bn.types;
        if (bn.types & CSD_JT_OBJECT) {
            m->free_object = bn.free_object;
            m->tagged = bn.tagged;
            m->first_prop = bn.first_prop;
            m->n_props = bn.n_props;
        }
        if (bn.types & CSD_JT_ARRAY) {
            m->items = bn.items;
            m->min_items = bn.min_items;
            m->max_items = bn.max_items;
        }
    }
    return n_obj > 1 ? merge_objects(b, path, kw, obj, n_obj, m) : 0;
}

/* anyOf/oneOf: the branches compiled, then merged into one node (merge_types, merge_enums). */
static int parse_any_of(builder *b, const char *path, const char *kw, const json_t *list,
                        int depth, uint16_t *out) {
    char sub[PATH_MAX_LEN];
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail(b, path, kw, " must be a non-empty list of schemas");
    if (json_array_size(list) > CSD_SCHEMA_MAX_ENUM)
        return fail(b, path, kw, " has more than 64 branches");
    uint16_t br[CSD_SCHEMA_MAX_ENUM];
    bool any_enum = false;
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v) {
        char place[24];
        snprintf(place, sizeof place, "%zu", i);
        child_path(sub, sizeof sub, path, kw, place);
        int rc = compile(b, v, sub, depth, &br[i]);
        if (rc) return rc;
        any_enum |= b->nodes[br[i]].n_lits > 0;
    }
    uint16_t merged;
    int rc = new_node(b, path, &merged);
    if (rc) return rc;
    csd_schema_node m = b->nodes[merged];
    m.types = 0;
    size_t n = json_array_size(list);
    rc = any_enum ? merge_enums(b, path, kw, br, n, &m) : merge_types(b, path, kw, br, n, &m);
    b->nodes[merged] = m;
    *out = merged;
    return rc;
}

/* "$ref": "#/$defs/NAME" (or "#/definitions/NAME"), a definition of the root schema, compiled
 * where it is used. A recursive one is refused: its answers could nest without end, and the
 * acceptor's nodes are a tree. Errors inside it name its place ("/$defs/NAME/..."). */
static int parse_ref(builder *b, const char *path, const json_t *ref, int depth, uint16_t *out) {
    const char *r = json_string_value(ref), *name = NULL, *defs = NULL;
    if (r && !strncmp(r, "#/$defs/", 8)) defs = "$defs", name = r + 8;
    else if (r && !strncmp(r, "#/definitions/", 14)) defs = "definitions", name = r + 14;
    if (!name || !*name || strlen(r) != json_string_length(ref) || strpbrk(name, "/%"))
        return fail(b, path, "$ref must name a definition of the root (#/$defs/NAME)", "");
    char key[256]; /* the name with its JSON Pointer escapes undone */
    size_t k = 0;
    for (const char *c = name; *c; c++) {
        if (k + 1 >= sizeof key) return fail(b, path, "$ref names a definition over 255 bytes", "");
        if (*c != '~') {
            key[k++] = *c;
            continue;
        }
        if (c[1] != '0' && c[1] != '1')
            return fail(b, path, "$ref has a '~' that is not '~0' or '~1'", "");
        key[k++] = *++c == '0' ? '~' : '/';
    }
    key[k] = '\0';
    const json_t *target = json_object_get(json_object_get(b->root, defs), key);
    if (!target) return fail(b, path, "$ref names no definition: ", r);
    for (int i = 0; i < b->n_expanding; i++) /* the definition itself, however it was spelled */
        if (b->expanding[i] == target) return fail(b, path, "recursive $ref: ", r);
    if (b->n_expanding >= MAX_SCHEMA_LEVELS) return fail(b, path, "too many nested $refs", "");
    char place[PATH_MAX_LEN];
    child_path(place, sizeof place, "", defs, key);
    b->expanding[b->n_expanding++] = target;
    int rc = compile(b, target, place, depth, out);
    b->n_expanding--;
    return rc;
}

/* Every keyword of s is supported or an annotation; anyOf, oneOf and $ref stand alone. */
static int check_keywords(builder *b, const char *path, const json_t *s, const char **any_kw) {
    const char *key;
    const json_t *v;
    int constraints = 0;
    *any_kw = NULL;
    json_object_foreach((json_t *)s, key, v) {
        if (!strcmp(key, "$id") && !json_is_string(v))
            return fail(b, path, "$id must be a string", "");
        if (listed(annotations, key)) continue;
        if (!listed(supported, key)) return fail(b, path, "unsupported keyword ", key);
        if (!strcmp(key, "anyOf") || !strcmp(key, "oneOf") || !strcmp(key, "$ref")) {
            if (*any_kw) return fail(b, path, "more than one of anyOf, oneOf and $ref", "");
            *any_kw = key;
        } else {
            constraints++;
        }
    }
    if (*any_kw && constraints)
        return fail(b, path, *any_kw, " beside other constraints is not supported");
    return 0;
}

/* JSON Schema's equality: numbers by value (1 and 1.0), the rest as jansson compares. */
static bool same_json(const json_t *x, const json_t *y) {
    if (json_is_number(x) && json_is_number(y)) return json_number_value(x) == json_number_value(y);
    return json_equal(x, y);
}

static int compile_object(builder *b, const json_t *s, const char *path, int depth,
                          uint16_t *out) {
    const char *any_kw;
    int rc = check_keywords(b, path, s, &any_kw);
    if (rc) return rc;
    if (any_kw && !strcmp(any_kw, "$ref"))
        return parse_ref(b, path, json_object_get(s, any_kw), depth, out);
    if (any_kw) return parse_any_of(b, path, any_kw, json_object_get(s, any_kw), depth, out);
    uint16_t id;
    if ((rc = new_node(b, path, &id))) return rc;
    csd_schema_node n = b->nodes[id];
    const json_t *t = json_object_get(s, "type"), *add = json_object_get(s, "additionalProperties");
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (t) rc = parse_type(b, path, t, &n.types);
    if (!rc && add && !json_is_boolean(add))
        rc = fail(b, path, "additionalProperties as a schema is not supported", "");
    if (!rc && add && json_is_false(add)) n.free_object = false;
    if (!rc && json_object_get(s, "properties")) rc = parse_properties(b, path, s, depth, &n);
    else if (!rc && json_object_get(s, "required"))
        rc = fail(b, path, "required without properties", "");
    if (!rc && (n.types & CSD_JT_ARRAY)) rc = parse_array(b, path, s, depth, &n);
    if (!rc && en && cn) { /* Pydantic writes both for a one-value Literal */
        if (!json_is_array(en) || json_array_size(en) > CSD_SCHEMA_MAX_ENUM)
            return fail(b, path, "enum must be a non-empty list of up to 64 values", "");
        bool in = false;
        size_t i;
        const json_t *x;
        json_array_foreach(en, i, x) in |= same_json(x, cn);
        if (!in) rc = fail(b, path, "const is not one of the enum's values", "");
        en = NULL; /* the const alone says the same */
    }
    if (!rc && en) rc = parse_enum(b, path, "enum", en, &n);
    if (!rc && cn) {
        json_t *one = json_pack("[O]", cn);
        rc = one ? parse_enum(b, path, "const", one, &n)
                 : csd_err_set(b->err, CSD_ENOMEM, "const");
        json_decref(one);
    }
    b->nodes[id] = n;
    *out = id;
    return rc;
}

/* Does s start a document of its own? It does with an "$id" that is not only a fragment ("#a" is
 * draft 7's anchor, which changes nothing about where "$ref"s resolve). */
static bool starts_document(const json_t *s) {
    const char *id = json_string_value(json_object_get(s, "$id"));
    return id && id[0] != '#';
}

/* A schema that starts a document of its own: the "$ref"s inside it name its "$defs", not the
 * root's (a tool's parameters keep their own definitions when several tools are joined). */
static int compile_resource(builder *b, const json_t *s, const char *path, int depth,
                            uint16_t *out) {
    const json_t *outer = b->root;
    if (starts_document(s)) b->root = s;
    int rc = compile_object(b, s, path, depth, out);
    b->root = outer;
    return rc;
}

/* depth: the containers a value of s sits in (the root object's properties: 2). */
static int compile(builder *b, const json_t *s, const char *path, int depth, uint16_t *out) {
    if (json_is_true(s)) {
        *out = 0; /* the empty schema */
        return 0;
    }
    if (depth > CSD_JSON_MAX_DEPTH) return fail(b, path, "nested deeper than 32 levels", "");
    if (b->levels >= MAX_SCHEMA_LEVELS)
        return fail(b, path, "more than 64 schemas inside one another", "");
    if (!json_is_object(s)) return fail(b, path, "a schema must be an object or true", "");
    b->levels++;
    int rc = compile_resource(b, s, path, depth, out);
    b->levels--;
    return rc;
}

/* Where each array starts in the one allocation (from its start, after the header), each at a
 * multiple of 8 bytes so that every element is aligned; and the allocation's size. */
typedef struct layout {
    size_t nodes, lits, props, bytes, size;
} layout;

static size_t round_up8(size_t n) { return (n + 7) & ~(size_t)7; }

static layout layout_of(size_t n_nodes, size_t n_lits, size_t n_props, size_t n_bytes) {
    layout l;
    l.nodes = round_up8(sizeof(csd_json_schema));
    l.lits = round_up8(l.nodes + n_nodes * sizeof(csd_schema_node));
    l.props = round_up8(l.lits + n_lits * sizeof(csd_schema_lit));
    l.bytes = l.props + n_props * sizeof(csd_schema_prop);
    l.size = l.bytes + n_bytes;
    return l;
}

/* Points s's arrays into its own allocation (once packed, and after a copy moved it). */
static void point(csd_json_schema *s) {
    const uint8_t *base = (const uint8_t *)s;
    layout l = layout_of(s->n_nodes, s->n_lits, s->n_props, s->n_bytes);
    s->nodes = (const csd_schema_node *)(base + l.nodes);
    s->lits = (const csd_schema_lit *)(base + l.lits);
    s->props = (const csd_schema_prop *)(base + l.props);
    s->bytes = base + l.bytes;
}

/* The builder's arrays packed into one allocation (header, nodes, lits, props, bytes). */
static csd_json_schema *pack(const builder *b, uint16_t root) {
    layout l = layout_of(b->n_nodes, b->n_lits, b->n_props, b->n_bytes);
    uint8_t *base = csd_alloc(l.size); /* zeroed: the padding too, so copies are byte-equal */
    if (!base) return NULL;
    memcpy(base + l.nodes, b->nodes, b->n_nodes * sizeof(csd_schema_node));
    memcpy(base + l.lits, b->lits, b->n_lits * sizeof(csd_schema_lit));
    memcpy(base + l.props, b->props, b->n_props * sizeof(csd_schema_prop));
    memcpy(base + l.bytes, b->bytes, b->n_bytes);
    csd_json_schema *s = (csd_json_schema *)base;
    *s = (csd_json_schema){.root = root, .n_nodes = (uint16_t)b->n_nodes,
                           .n_props = (uint16_t)b->n_props, .n_lits = (uint16_t)b->n_lits,
                           .n_bytes = b->n_bytes, .size = l.size};
    point(s);
    return s;
}

int csd_json_schema_compile(csd_json_schema **out, const json_t *schema, csd_err *err) {
    *out = NULL;
    builder *b = csd_alloc(sizeof *b);
    if (!b) return csd_err_set(err, CSD_ENOMEM, "schema builder"); /* zeroed: empty, level 0 */
    b->err = err;
    b->root = schema;
    uint16_t any, root;
    int rc = new_node(b, "", &any); /* node 0: any value */
    if (!rc) rc = compile(b, schema, "", 1, &root);
    if (!rc && json_is_true(schema))
        rc = fail(b, "", "the root schema must describe an object", "");
    if (!rc && (!(b->nodes[root].types & CSD_JT_OBJECT) || b->nodes[root].n_lits))
        rc = fail(b, "", "the root schema must allow an object (and not be an enum)", "");
    if (!rc && !(*out = pack(b, root))) rc = csd_err_set(err, CSD_ENOMEM, "schema");
    csd_free(b);
    return rc;
}

csd_json_schema *csd_json_schema_copy(const csd_json_schema *s) {
    csd_json_schema *c = csd_alloc(s->size);
    if (!c) return NULL;
    memcpy(c, s, s->size);
    point(c);
    return c;
}

void csd_json_schema_destroy(csd_json_schema *s) { csd_free(s); }
