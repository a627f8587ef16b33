/* response_format json_schema (model/json_schema.h, model/json_accept.h): schemas outside the
 * subset are refused naming the place and the keyword; valid answers are accepted to the end,
 * invalid ones refused at their first wrong byte; random walks through the acceptor always finish,
 * and what they write parses and is valid against the schema by an independent check
 * (json_schema_check.h); the mask allows exactly the tokens that fit, and never treats an enum's or
 * key's text as free. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "json_accept_expect.h"
#include "json_schema_check.h"
#include "model/json_accept.h"
#include "model/json_mask.h"
#include "model/json_schema.h"

static csd_json_schema *compile_text(const char *text, csd_err *err) {
    json_error_t je;
    json_t *s = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je); /* as the server reads */
    if (!s) fail_msg("test schema does not parse: %s: %s", je.text, text);
    csd_json_schema *c = NULL;
    int rc = csd_json_schema_compile(&c, s, err);
    json_decref(s);
    assert_true(rc == 0 || c == NULL);
    return c;
}

/* open n times, then leaf, then close n times, into out (room for it is the caller's). */
static void nest(char *out, const char *open, int n, const char *leaf, const char *close) {
    out[0] = '\0';
    for (int i = 0; i < n; i++) strcat(out, open);
    strcat(out, leaf);
    for (int i = 0; i < n; i++) strcat(out, close);
}

/* An object branch of a union: {"type": "object", "properties": {KEY: {"const": VALUE}, "x": {}},
 * "required": [REQ]}, as a string literal. */
#define OBJ(key, value, req)                                                                   \
    "{\"type\":\"object\",\"properties\":{\"" key "\":{\"const\":" value "},\"x\":{}},"           \
    "\"required\":[\"" req "\"]}"

static void test_refused_schemas(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"pattern\":\"a+\"}}}",
         "'/properties/name': unsupported keyword pattern"},
        {"{\"type\":\"string\"}", "root schema must allow an object"},
        {"{\"type\":\"object\",\"enum\":[1]}", "enum: no value has the schema's type"},
        {"{\"properties\":{\"x\":{\"oneOf\":[{\"enum\":[\"a\",null]},{\"type\":\"null\"}]}}}",
         "'/properties/x': oneOf branches allow the same value"},
        {"{\"properties\":{\"x\":{\"oneOf\":[{\"const\":1},{\"const\":1.0}]}}}",
         "oneOf branches allow the same value"},
        {"{\"properties\":{\"x\":{\"oneOf\":[{\"const\":-0},{\"const\":0}]}}}",
         "oneOf branches allow the same value"},
        {"{\"properties\":{\"x\":{\"const\":\"c\",\"enum\":[\"d\"]}}}",
         "const is not one of the enum's values"},
        {"{\"properties\":{\"a/b~c\":{\"minimum\":1}}}",
         "'/properties/a~1b~0c': unsupported keyword minimum"},
        {"{\"properties\":{\"a\":true},\"required\":[\"b\"]}", "not in properties: b"},
        {"{\"properties\":{\"a\":{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}}}",
         "minItems is above maxItems"},
        {"{\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}}}",
         "'/properties/a': anyOf branches must have different types"},
        {"{\"properties\":{\"a\":{\"anyOf\":[{\"enum\":[1]},{\"type\":\"string\"}]}}}",
         "anyOf may join an enum only with null or boolean branches"},
        {"{\"properties\":{\"a\":{\"enum\":[{\"x\":1}]}}}", "must be strings, numbers"},
        {"{\"properties\":{\"a\":{\"type\":\"text\"}}}", "unknown type text"},
        {"{\"properties\":{\"a\":{\"allOf\":[true]}}}", "unsupported keyword allOf"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"anyOf\":[true]}}}",
         "anyOf beside other constraints"},
        {"{\"additionalProperties\":{\"type\":\"string\"}}", "additionalProperties as a schema"},
        {"{\"properties\":{\"a\":{\"items\":[true]}}}", "lists of item schemas"},
        {"false", "must be an object or true"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/A\"}},\"$defs\":{\"A\":{\"properties\":"
         "{\"next\":{\"$ref\":\"#/$defs/A\"}}}}}",
         "'/$defs/A/properties/next': recursive $ref: #/$defs/A"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/B\"}},\"$defs\":{}}",
         "'/properties/a': $ref names no definition: #/$defs/B"},
        {"{\"properties\":{\"a\":{\"$ref\":\"other.json#/x\"}}}", "must name a definition"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/a~2\"}},\"$defs\":{\"a~2\":true}}",
         "a '~' that is not '~0' or '~1'"},
        {"{\"properties\":{\"a\":{\"$id\":7,\"type\":\"string\"}}}",
         "'/properties/a': $id must be a string"},
        /* below an $id, "#" is that schema: the root's definitions are out of reach */
        {"{\"properties\":{\"a\":{\"$id\":\"a\",\"properties\":{\"b\":{\"$ref\":"
         "\"#/$defs/B\"}}}},\"$defs\":{\"B\":true}}",
         "'/properties/a/properties/b': $ref names no definition: #/$defs/B"},
        /* unions of objects: a first property, required, const or enum, the same key, no value
         * in two branches */
        {"{\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\"}]}}}",
         "'/properties/u': anyOf object branches need a first property"},
        {"{\"properties\":{\"u\":{\"anyOf\":[" OBJ("k", "\"a\"", "k") "," OBJ("k", "\"a\"", "k")
         "]}}}", "anyOf object branches need"},
        {"{\"properties\":{\"u\":{\"oneOf\":[" OBJ("k", "1", "k") "," OBJ("k", "1.0", "k")
         "]}}}", "oneOf object branches need"},
        {"{\"properties\":{\"u\":{\"anyOf\":[" OBJ("k", "\"a\"", "k") "," OBJ("j", "\"b\"", "j")
         "]}}}", "anyOf object branches need"},
        {"{\"properties\":{\"u\":{\"anyOf\":[" OBJ("k", "\"a\"", "k") "," OBJ("k", "\"b\"", "x")
         "]}}}", "anyOf object branches need"},
        {"{\"properties\":{\"u\":{\"anyOf\":[" OBJ("k", "\"a\"", "k") ",{\"type\":\"object\","
         "\"properties\":{\"k\":{\"type\":\"string\"}},\"required\":[\"k\"]}]}}}",
         "anyOf object branches need"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/A\"}},\"$defs\":{\"A\":{\"properties\":"
         "{\"b\":{\"$ref\":\"#/$defs/%41\"}}}}}",
         "must name a definition"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/A\",\"type\":\"object\"}},"
         "\"$defs\":{\"A\":true}}", "$ref beside other constraints"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/A\"}},\"$defs\":{\"A\":{\"format\":\"x\"}}}",
         "'/$defs/A': unsupported keyword format"},
        /* a NUL cut a name short: "a\0b" stood for "a", "string\0x" for "string" */
        {"{\"properties\":{\"a\":{\"type\":\"boolean\"}},\"required\":[\"a\\u0000b\"]}",
         "a required name holds a NUL"},
        {"{\"properties\":{\"a\":{\"type\":\"string\\u0000x\"}}}", "unknown type string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        csd_err err = {0};
        csd_json_schema *c = compile_text(cases[i][0], &err);
        if (c) fail_msg("schema %zu was accepted: %s", i, cases[i][0]);
        if (!strstr(err.msg, cases[i][1]))
            fail_msg("schema %zu: message '%s' lacks '%s'", i, err.msg, cases[i][1]);
    }
    /* the bounds: 65 properties, nesting of 33 */
    char big[4096] = "{\"properties\":{";
    for (int i = 0; i < 65; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "%s\"p%d\":true", i ? "," : "", i);
    strcat(big, "}}");
    csd_err err = {0};
    assert_null(compile_text(big, &err));
    assert_non_null(strstr(err.msg, "more than 64 properties"));
    *strstr(big, ",\"p64\":true") = '\0'; /* 64 are fine */
    strcat(big, "}}");
    csd_json_schema *ok = compile_text(big, &err);
    if (!ok) fail_msg("64 properties: %s", err.msg);
    csd_json_schema_destroy(ok);
    /* a place too long to name whole ends in "/..." and cuts no "~1" escape in two */
    for (int pad = 490; pad < 500; pad++) {
        char key[600], schema[700];
        memset(key, 'k', (size_t)pad);
        strcpy(key + pad, "//////////"); /* each "/" is "~1" in the place */
        snprintf(schema, sizeof schema, "{\"properties\":{\"%s\":{\"minimum\":1}}}", key);
        assert_null(compile_text(schema, &err));
        const char *end = strstr(err.msg, "/...': unsupported keyword minimum");
        if (!end || end[-1] == '~') fail_msg("pad %d: %s", pad, err.msg);
    }
    /* a definition's name over 255 bytes is refused, not cut (a cut one could name another) */
    char name[300], longref[800];
    memset(name, 'd', 299);
    name[299] = '\0';
    snprintf(longref, sizeof longref,
             "{\"properties\":{\"a\":{\"$ref\":\"#/$defs/%s\"}},\"$defs\":{\"%s\":true}}", name,
             name);
    assert_null(compile_text(longref, &err));
    if (!strstr(err.msg, "over 255 bytes")) fail_msg("long $ref: %s", err.msg);
    /* anyOf inside anyOf: bounded although it nests no container */
    char chain[4096] = "{\"properties\":{\"a\":";
    nest(chain + strlen(chain), "{\"anyOf\":[", 65, "true", "]}");
    strcat(chain, "}}");
    assert_null(compile_text(chain, &err));
    if (!strstr(err.msg, "more than 64 schemas")) fail_msg("anyOf chain: %s", err.msg);
    char deep[4096];
    nest(deep, "{\"properties\":{\"a\":", 33, "true", "}}");
    assert_null(compile_text(deep, &err));
    if (!strstr(err.msg, "deeper than 32")) fail_msg("nesting of 33: %s", err.msg);
    /* 32 levels are fine: 31 objects in one another and an object in the last */
    nest(deep, "{\"properties\":{\"a\":", 31, "{\"type\":\"object\"}", "}}");
    ok = compile_text(deep, &err);
    if (!ok) fail_msg("32 levels: %s", err.msg);
    csd_json_accept a; /* and the 32nd object opens */
    csd_json_accept_init_schema(&a, ok);
    for (int i = 0; i < 31; i++)
        assert_true(csd_json_accept_bytes(&a, (const uint8_t *)"{\"a\":", 5));
    assert_true(csd_json_accept_byte(&a, '{'));
    csd_json_schema_destroy(ok);
}

/* The schema most cases use: required and optional properties, an enum, an integer, a nullable
 * string, an array with bounds, a nested object and a const. */
static const char *const person =
    "{\"title\":\"Person\",\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"description\":\"full name\"},"
    "\"age\":{\"type\":\"integer\"},"
    "\"mood\":{\"enum\":[\"happy\",\"sad\",\"happy-ish\",3.5,null]},"
    "\"nick\":{\"type\":[\"string\",\"null\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2},"
    "\"home\":{\"type\":\"object\",\"properties\":{\"city\":{\"const\":\"Oslo\"}},"
    "\"required\":[\"city\"],\"additionalProperties\":false},"
    "\"extra\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"object\"}]}},"
    "\"required\":[\"name\",\"age\",\"tags\"]}";

static void test_valid_and_refused(void **state) {
    (void)state;
    csd_err err = {0};
    csd_json_schema *s = compile_text(person, &err);
    if (!s) fail_msg("%s", err.msg);
    static const char *const ok[] = {
        "{\"name\":\"Ada\",\"age\":36,\"tags\":[true]}",
        ("{\"name\": \"\", \"age\": -0, \"mood\": \"happy-ish\", \"nick\": null, "
         "\"tags\": [false, true]}"),
        "{\"name\":\"x\",\"age\":1,\"mood\":3.5,\"tags\":[true],\"home\":{\"city\":\"Oslo\"}}",
        "{\"name\":\"x\",\"age\":1,\"mood\":null,\"tags\":[true],\"extra\":{\"any\":[1,{}]}}",
        "{\"name\":\"x\",\"age\":12,\"tags\":[true],\"extra\":-1.5e3}",
    };
    expect_accepted(s, ok, sizeof ok / sizeof *ok);
    /* '|' marks the first byte that must be refused */
    static const char *const bad[] = {
        "{\"|age\":1}",                                   /* name must come first */
        "{\"name\":\"x\"|}",                              /* age and tags are required */
        "{\"name\":\"x\",\"age\":1|.5}",                  /* an integer */
        "{\"name\":\"x\",\"age\":1|e3}",
        "{\"name\":|1}",                                  /* a string */
        "{\"name\":\"x\",\"age\":1,\"mood\":\"happ|\"}", /* "happ" is not an enum value... */
        "{\"name\":\"x\",\"age\":1,\"mood\":\"happy|!\"}", /* ...nor "happy!" */
        "{\"name\":\"x\",\"age\":1,\"mood\":3|,",         /* 3 is not 3.5 */
        "{\"name\":\"x\",\"age\":1,\"tags\":[|]}",        /* minItems 1 */
        "{\"name\":\"x\",\"age\":1,\"tags\":[true,false|,",  /* maxItems 2 */
        "{\"name\":\"x\",\"age\":1,\"tags\":[|1]}",       /* boolean items */
        "{\"name\":\"x\",\"age\":1,\"tags\":[true],\"home\":{|}}",     /* city required */
        "{\"name\":\"x\",\"age\":1,\"tags\":[true],\"home\":{\"city\":\"Osl|x\"}}",
        "{\"name\":\"x\",\"age\":1,\"tags\":[true],\"|nix\":1}", /* not a property */
        "{\"name\":\"x\",\"age\":1,\"tags\":[true],\"|mood\":1}", /* out of order */
        "{\"name\":\"x\",\"age\":1,\"tags\":[true],\"extra\":|\"s\"}",
        "{\"name\":\"x\",\"age\":1,\"tags\":[true],\"home\":{\"city\":\"Oslo\"|,",
    };
    expect_refused_at_bar(s, bad, sizeof bad / sizeof *bad);
    csd_json_schema_destroy(s);
    /* Pydantic's Optional[Literal["a", "b"]]: an enum joined by null */
    s = compile_text("{\"properties\":{\"m\":{\"anyOf\":[{\"type\":\"string\",\"enum\":"
                     "[\"a\",\"b\"]},{\"type\":\"null\"}]}},\"required\":[\"m\"]}", &err);
    if (!s) fail_msg("%s", err.msg);
    static const char *const optional[][2] = {{"{\"m\":\"b\"}", ""}, {"{\"m\":null}", ""},
                                              {"{\"m\":", "1}"}, {"{\"m\":\"", "c\"}"}};
    for (size_t i = 0; i < sizeof optional / sizeof *optional; i++) {
        char text[64];
        snprintf(text, sizeof text, "%s%s", optional[i][0], optional[i][1]);
        csd_json_accept a;
        csd_json_accept_init_schema(&a, s);
        assert_int_equal(feed(&a, text), strlen(optional[i][0]));
        assert_true(csd_json_accept_done(&a) == (optional[i][1][0] == '\0'));
    }
    csd_json_schema_destroy(s);
}

/* A union of objects told apart by "kind" (Pydantic's discriminated union), beside null; and a
 * tool's parameters with their own $defs below an $id. */
static const char *const shapes =
    "{\"properties\":{\"shape\":{\"anyOf\":["
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},"
    "\"r\":{\"type\":\"number\"}},\"required\":[\"kind\",\"r\"]},"
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"rect\",\"box\"]},"
    "\"w\":{\"type\":\"integer\"},\"h\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"w\"],"
    "\"additionalProperties\":false},"
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circles\"},"
    "\"n\":{\"enum\":[1,2]}},\"required\":[\"kind\"]},"
    "{\"type\":\"null\"}]},"
    "\"tool\":{\"$id\":\"tool\",\"$defs\":{\"P\":{\"type\":\"integer\"}},\"type\":\"object\","
    "\"properties\":{\"p\":{\"$ref\":\"#/$defs/P\"}},\"required\":[\"p\"]}},"
    "\"required\":[\"shape\"],\"$defs\":{\"P\":{\"type\":\"string\"}}}";

/* Discriminators that are numbers (which end only at the byte after them), booleans and null,
 * in a union that is an array's items. */
static const char *const tagged_items =
    "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"maxItems\":3,\"items\":"
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"v\":{\"const\":1},\"a\":"
    "{\"type\":\"string\"}},\"required\":[\"v\",\"a\"]},{\"type\":\"object\",\"properties\":"
    "{\"v\":{\"const\":12},\"b\":{\"type\":\"boolean\"}},\"required\":[\"v\"],"
    "\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"v\":{\"enum\":"
    "[true,null,-1.5]},\"c\":{}},\"required\":[\"v\"]}]}}},\"required\":[\"items\"]}";

static void test_object_union(void **state) {
    (void)state;
    csd_err err = {0};
    csd_json_schema *s = compile_text(shapes, &err);
    if (!s) fail_msg("%s", err.msg);
    static const char *const ok[] = {
        "{\"shape\":{\"kind\":\"circle\",\"r\":1.5}}",
        "{\"shape\":{\"kind\":\"rect\",\"w\":2,\"h\":3}}",
        "{\"shape\":{\"kind\":\"box\",\"w\":2}}",
        "{\"shape\":{\"kind\":\"circles\"},\"tool\":{\"p\":7}}",
        "{\"shape\":{\"kind\":\"circles\",\"n\":2}}",
        "{\"shape\":null}",
    };
    expect_accepted(s, ok, sizeof ok / sizeof *ok);
    static const char *const bad[] = {
        "{\"shape\":{|}}",                                  /* the discriminator is required */
        "{\"shape\":{\"|r\":1}}",                            /* and comes first */
        "{\"shape\":{\"kind\":\"|square\"}}",                /* one of the branches' values */
        "{\"shape\":{\"kind\":\"circle\"|}}",                 /* circle's r is required */
        "{\"shape\":{\"kind\":\"circle\",\"|w\":1}}",         /* circle has no w */
        "{\"shape\":{\"kind\":\"rect\",\"|r\":1}}",           /* rect has no r */
        "{\"shape\":{\"kind\":\"rect\",\"w\":2|.5}}",          /* rect's w is an integer */
        "{\"shape\":{\"kind\":\"box\",\"w\":2,\"h\":3|,",      /* no others after h */
        "{\"shape\":{\"kind\":\"circles\",\"n\":|3}}",         /* circles' n is 1 or 2 */
        "{\"shape\":{\"kind\":\"circle\",\"r\":1},\"tool\":{\"p\":|\"s\"}}", /* tool's P */
    };
    expect_refused_at_bar(s, bad, sizeof bad / sizeof *bad);
    csd_json_schema_destroy(s);
    s = compile_text(tagged_items, &err);
    if (!s) fail_msg("%s", err.msg);
    static const char *const items_ok[] = {
        "{\"items\":[{\"v\":12,\"b\":true},{\"v\":1,\"a\":\"x\"},{\"v\":-1.5}]}",
        "{\"items\":[{\"v\":null},{\"v\":true,\"c\":{}}]}",
    };
    expect_accepted(s, items_ok, sizeof items_ok / sizeof *items_ok);
    static const char *const items_bad[] = {
        "{\"items\":[{\"v\":1,\"|b\":true}]}",   /* 1's a is required */
        "{\"items\":[{\"v\":12,\"|a\":\"x\"}]}", /* 12 has no a */
        "{\"items\":[{\"v\":true,\"c\":[]},{\"v\":|false}]}",
        "{\"items\":[{\"v\":-1.5|0}]}",
    };
    expect_refused_at_bar(s, items_bad, sizeof items_bad / sizeof *items_bad);
    csd_json_schema_destroy(s);
}

/* Literals: Pydantic's one-value Literal (const and enum together), reals with their shortest
 * digits, a real with an integer's value under "integer"; a deep place named short and whole. */
static void test_literals(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"{\"properties\":{\"k\":{\"const\":\"c\",\"enum\":[\"c\"],\"type\":\"string\"}},"
         "\"required\":[\"k\"]}", "{\"k\":\"c\"}"},
        {"{\"properties\":{\"x\":{\"enum\":[0.1]}},\"required\":[\"x\"]}", "{\"x\":0.1}"},
        {"{\"properties\":{\"x\":{\"const\":1e-7}},\"required\":[\"x\"]}", "{\"x\":1e-7}"},
        {"{\"properties\":{\"x\":{\"type\":\"integer\",\"enum\":[2.0]}},\"required\":[\"x\"]}",
         "{\"x\":2.0}"},
        {"{\"properties\":{\"x\":{\"enum\":[100.0,120.5]}},\"required\":[\"x\"]}",
         "{\"x\":100.0}"},
        {"{\"properties\":{\"x\":{\"const\":1,\"enum\":[1.0]}},\"required\":[\"x\"]}",
         "{\"x\":1}"},
        {"{\"properties\":{\"x\":{\"$ref\":\"#/definitions/a~1b~0\"}},\"required\":[\"x\"],"
         "\"definitions\":{\"a/b~\":{\"const\":true}}}", "{\"x\":true}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        csd_err err = {0};
        csd_json_schema *s = compile_text(cases[i][0], &err);
        if (!s) fail_msg("schema %zu: %s", i, err.msg);
        csd_json_accept a;
        csd_json_accept_init_schema(&a, s);
        size_t n = feed(&a, cases[i][1]);
        if (n != strlen(cases[i][1]) || !csd_json_accept_done(&a))
            fail_msg("schema %zu: refused at %zu: %s", i, n, cases[i][1]);
        json_t *raw = json_loads(cases[i][0], 0, NULL), *v = json_loads(cases[i][1], 0, NULL);
        if (!schema_check_root(raw, v))
            fail_msg("schema %zu: the check refuses %s", i, cases[i][1]);
        json_decref(raw);
        json_decref(v);
        csd_json_schema_destroy(s);
    }
    /* oneOf's integers compare exactly: 2^53 + 1 and 2^53 are two values */
    csd_err err = {0};
    csd_json_schema *s = compile_text("{\"properties\":{\"x\":{\"oneOf\":[{\"const\":"
                                      "9007199254740993},{\"const\":9007199254740992}]}}}", &err);
    if (!s) fail_msg("%s", err.msg);
    csd_json_schema_destroy(s);
}

/* A deterministic generator (xorshift), so a failure can be replayed. */
static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Walks a from the start to done, each byte drawn among the allowed ones (after `steer` bytes,
 * preferring closers and ends so the walk finishes; after 15 digits in a row, or 2 in an exponent,
 * anything else, so that jansson can read the numbers). Returns the text's length, 0 if stuck. */
static size_t walk(csd_json_accept *a, uint64_t *rng, char *out, size_t cap, size_t steer) {
    size_t n = 0, digits = 0, limit = 15;
    while (!csd_json_accept_done(a)) {
        uint8_t allowed[256];
        int k = 0, closers = 0;
        uint8_t close[256];
        for (int b = 1; b < 128; b++) { /* ASCII keeps the text readable; UTF-8 has its own tests */
            csd_json_accept t = *a;
            if (!csd_json_accept_byte(&t, (uint8_t)b)) continue;
            bool digit = b >= '0' && b <= '9';
            if (digits >= limit && digit) continue;
            allowed[k++] = (uint8_t)b;
            if (strchr("\"}]el,", b) || digit) close[closers++] = (uint8_t)b;
        }
        if (k == 0 || n + 1 >= cap) return 0;
        uint8_t b = n > steer && closers ? close[rng_next(rng) % (uint64_t)closers]
                                         : allowed[rng_next(rng) % (uint64_t)k];
        assert_true(csd_json_accept_byte(a, b));
        out[n++] = (char)b;
        bool exponent = (b == 'e' || b == 'E') && digits > 0;
        if (exponent || b == '+' || b == '-') limit = exponent ? 2 : limit;
        else if (b < '0' || b > '9') limit = 15;
        digits = b >= '0' && b <= '9' ? digits + 1 : 0;
    }
    out[n] = '\0';
    return n;
}

static void test_random_walks(void **state) {
    (void)state;
    static const char *const schemas[] = {
        NULL, /* person */
        "{\"type\":\"object\",\"properties\":{\"list\":{\"type\":\"array\",\"items\":"
        "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"ok\":{\"type\":"
        "\"boolean\"}},\"required\":[\"id\"]},\"maxItems\":3}},\"required\":[\"list\"]}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[\"a\",\"ab\",\"abc\",1,12,true]},"
        "\"ab\":{\"const\":null},\"b\":{},\"opt\":{\"anyOf\":[{\"enum\":[\"x\",\"y\"]},"
        "{\"type\":\"null\"},{\"type\":\"boolean\"}]}},\"additionalProperties\":false}",
        "{\"type\":\"object\"}",
        /* Pydantic's shape for nested models: $defs, $ref, an optional reference */
        "{\"$defs\":{\"Pet\":{\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\"},"
        "\"kind\":{\"enum\":[\"cat\",\"dog\"],\"type\":\"string\"}},\"required\":[\"name\","
        "\"kind\"],\"title\":\"Pet\",\"type\":\"object\"}},\"properties\":{\"pets\":{\"items\":"
        "{\"$ref\":\"#/$defs/Pet\"},\"maxItems\":3,\"type\":\"array\"},\"best\":{\"anyOf\":"
        "[{\"$ref\":\"#/$defs/Pet\"},{\"type\":\"null\"}],\"description\":\"favourite\"}},"
        "\"required\":[\"pets\",\"best\"],\"title\":\"Owner\",\"type\":\"object\"}",
        NULL, /* shapes */
        NULL, /* tagged_items */
    };
    char text[8192];
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        const char *src = schemas[i]   ? schemas[i]
                          : i == 0     ? person
                          : i == 5     ? shapes
                                       : tagged_items;
        csd_err err = {0};
        csd_json_schema *s = compile_text(src, &err);
        if (!s) fail_msg("%s", err.msg);
        json_t *raw = json_loads(src, 0, NULL);
        uint64_t rng = 0x9E3779B97F4A7C15ull + i;
        for (int w = 0; w < 200; w++) {
            csd_json_accept a;
            csd_json_accept_init_schema(&a, s);
            size_t n = walk(&a, &rng, text, sizeof text, (size_t)(w % 8) * 16);
            if (!n) fail_msg("schema %zu walk %d is stuck after: %s", i, w, text);
            json_error_t je;
            /* schema 1 has no free objects, so no key may come twice */
            size_t flags = JSON_ALLOW_NUL | (i == 1 ? JSON_REJECT_DUPLICATES : 0);
            json_t *v = json_loads(text, flags, &je);
            if (!v) fail_msg("schema %zu: walk %d does not parse (%s): %s", i, w, je.text, text);
            if (!schema_check_root(raw, v))
                fail_msg("schema %zu: walk %d is not valid: %s", i, w, text);
            json_decref(v);
        }
        json_decref(raw);
        csd_json_schema_destroy(s);
    }
}

/* A copy works alone: the original freed first. */
static void test_copy(void **state) {
    (void)state;
    csd_err err = {0};
    csd_json_schema *s = compile_text(person, &err), *c = csd_json_schema_copy(s);
    assert_non_null(c);
    memset((void *)s->nodes, 0xA5, s->size - sizeof *s); /* a copy reading it would see this */
    csd_json_schema_destroy(s);
    csd_json_accept a;
    csd_json_accept_init_schema(&a, c);
    const char *text = "{\"name\":\"x\",\"age\":2,\"mood\":\"sad\",\"tags\":[true]}";
    assert_int_equal(feed(&a, text), strlen(text));
    assert_true(csd_json_accept_done(&a));
    csd_json_schema_destroy(c);
}

/* A vocabulary of a few byte strings. */
static const char *const vocab[] = {"{", "\"", "name", "na", "me", "\":", " \"", "happy", "ha",
                                    "ppy", "\",", "x", "sad", "\"mood", "\": \"", "}", "\"}"};
#define N_VOCAB ((int32_t)(sizeof vocab / sizeof *vocab))

static int vocab_bytes(void *ctx, int32_t id, uint8_t *out, size_t cap, size_t *len) {
    (void)ctx;
    *len = strlen(vocab[id]);
    if (*len > cap) return CSD_EFULL;
    memcpy(out, vocab[id], *len);
    return 0;
}

static void test_mask(void **state) {
    (void)state;
    csd_err err = {0};
    csd_json_schema *s = compile_text("{\"properties\":{\"name\":{\"type\":\"string\"},"
                                      "\"mood\":{\"enum\":[\"happy\",\"sad\"]}},"
                                      "\"required\":[\"name\",\"mood\"]}",
                                      &err);
    assert_non_null(s);
    csd_vocab_bytes *v = NULL;
    assert_int_equal(csd_vocab_bytes_create(&v, N_VOCAB, vocab_bytes, NULL, &err), 0);
    static const char *const prefixes[] = {"",
                                           "{",
                                           "{\"",
                                           "{\"na",
                                           "{\"name\":\"",
                                           "{\"name\":\"x",
                                           "{\"name\":\"x\",\"mood\":\"",
                                           "{\"name\":\"x\",\"mood\":\"ha"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        csd_json_accept a;
        csd_json_accept_init_schema(&a, s);
        assert_int_equal(feed(&a, prefixes[i]), strlen(prefixes[i]));
        float logits[N_VOCAB];
        for (int32_t id = 0; id < N_VOCAB; id++) logits[id] = 0.0f;
        int32_t n = csd_json_mask(&a, v, logits, N_VOCAB), want = 0;
        for (int32_t id = 0; id < N_VOCAB; id++) {
            csd_json_accept t = a;
            bool fits = csd_json_accept_bytes(&t, (const uint8_t *)vocab[id],
                                              (uint32_t)strlen(vocab[id]));
            want += fits;
            if (fits != (logits[id] == 0.0f))
                fail_msg("prefix '%s': token '%s' %s", prefixes[i], vocab[id],
                         fits ? "masked but fits" : "allowed but does not fit");
        }
        assert_int_equal(n, want);
        assert_true(n > 0);
    }
    /* inside the enum's string, plain text is not free: "x" cannot follow "ha" */
    csd_json_accept a;
    csd_json_accept_init_schema(&a, s);
    feed(&a, "{\"name\":\"x\",\"mood\":\"ha");
    assert_false(csd_json_accept_in_text(&a));
    csd_vocab_bytes_destroy(v);
    csd_json_schema_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_schemas),
        cmocka_unit_test(test_valid_and_refused),
        cmocka_unit_test(test_literals),
        cmocka_unit_test(test_object_union),
        cmocka_unit_test(test_random_walks),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
