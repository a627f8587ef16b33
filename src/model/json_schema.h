/* json_schema: a JSON Schema compiled for constrained decoding (OpenAI's response_format
 * {"type": "json_schema", "json_schema": {"schema": ...}}). The acceptor (json_accept.h) walks the
 * compiled nodes byte by byte, so every answer it lets through is valid against the schema.
 *
 * The subset (docs/api.md): "type" (a name or a list of names), "properties" with "required",
 * "additionalProperties" false or true, "items" with "minItems"/"maxItems", "enum", "const",
 * "anyOf"/"oneOf" whose branches have different types (or join enums with null or booleans, or are
 * objects told apart by their first property: a discriminator), and "$ref" to the "$defs" of the
 * root or of the nearest schema with an "$id" (not recursive). Annotations (title, description,
 * default, examples, ...) are ignored. Any other keyword ("pattern", "format", "allOf",
 * "minimum", ...) is refused with its place in the schema: an answer that ignores a constraint
 * would not be valid.
 *
 * What is generated, when the schema leaves a choice: an object's properties in the schema's order,
 * every required one and any optional one, and no others; enum and const values in compact JSON
 * (jansson's serialization) exactly. */
#ifndef CSD_JSON_SCHEMA_H
#define CSD_JSON_SCHEMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"

/* Bounds on what one request may ask for (each refused with a message when exceeded). */
#define CSD_SCHEMA_MAX_NODES 1024
#define CSD_SCHEMA_MAX_PROPS 64   /* properties of one object */
#define CSD_SCHEMA_MAX_ENUM 64    /* values of one enum */
#define CSD_SCHEMA_MAX_BYTES 65536 /* all keys and enum values, serialized */
#define CSD_SCHEMA_MAX_ITEMS 65535 /* an array's minItems / maxItems */

/* JSON types, as bits of csd_schema_node.types. */
enum {
    CSD_JT_OBJECT = 1,
    CSD_JT_ARRAY = 2,
    CSD_JT_STRING = 4,
    CSD_JT_INTEGER = 8,  /* an integer: written without fraction or exponent, except an enum's
                          * integral real (2.0) */
    CSD_JT_NUMBER = 16,  /* any number (integers too) */
    CSD_JT_BOOLEAN = 32,
    CSD_JT_NULL = 64,
    CSD_JT_ANY = 127,
};

/* One schema (a value's constraints). Node 0 is the empty schema: any value at all. */
typedef struct csd_schema_node {
    uint8_t types;       /* CSD_JT_* bits the value may have */
    bool free_object;    /* an object without "properties": any members, any values */
    bool tagged;         /* a union of objects: its one property is the discriminator, whose
                          * literal's alt is the object the rest of the members follow */
    uint16_t first_prop; /* object: its properties [first_prop, first_prop + n_props) */
    uint16_t n_props;
    uint16_t items;      /* array: every item's node */
    uint16_t min_items, max_items;
    uint16_t first_lit;  /* enum/const: the value is one of these literals; n_lits 0: no enum */
    uint16_t n_lits;
} csd_schema_node;

typedef struct csd_schema_prop {
    uint16_t node;       /* the value's schema */
    uint16_t key_lit;    /* the key as a JSON string, quotes included */
    bool required;
} csd_schema_prop;

/* A literal: a key or an enum value in compact JSON, bytes [off, off + len). */
typedef struct csd_schema_lit {
    uint32_t off;
    uint32_t len;
    uint16_t alt;        /* a discriminator's value: the union's branch it selects (else 0) */
} csd_schema_lit;

/* Compiled: one allocation, arrays at fixed places after the header. */
typedef struct csd_json_schema {
    uint16_t root;
    uint16_t n_nodes, n_props, n_lits;
    uint32_t n_bytes;
    size_t size;         /* of the whole allocation */
    const csd_schema_node *nodes;
    const csd_schema_prop *props;
    const csd_schema_lit *lits;
    const uint8_t *bytes;
} csd_json_schema;

/* Compiles schema (a JSON object) into *out. The root must be an object schema. Errors name the
 * place in the schema ("/properties/name/type") and the problem; returns 0 or a CSD_E* code. */
int csd_json_schema_compile(csd_json_schema **out, const json_t *schema, csd_err *err);
/* An independent copy (a request keeps its own), or NULL when out of memory. */
csd_json_schema *csd_json_schema_copy(const csd_json_schema *s);
void csd_json_schema_destroy(csd_json_schema *s);

#endif
