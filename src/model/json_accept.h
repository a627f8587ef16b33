/* json_accept: a byte-at-a-time acceptor for one JSON object (RFC 8259 grammar, UTF-8 checked), the
 * state behind OpenAI's response_format {"type": "json_object"}. Feeding a byte either moves the
 * state on (the bytes so far are the start of some valid object) or is refused and leaves the state
 * as it was. A small value type: copying it is how a caller tries a byte sequence (a token) and
 * throws the attempt away.
 *
 * Limits keep a constrained generation from running on without end inside one construct: nesting
 * CSD_JSON_MAX_DEPTH, CSD_JSON_MAX_NUMBER bytes per number (and the two bytes that may be needed to
 * complete one), and whitespace between tokens (as llama.cpp's JSON grammar has it): one space, or
 * a newline and up to CSD_JSON_MAX_INDENT spaces or tabs. Small models given free whitespace spend
 * their tokens on it. A string's length is bounded only
 * by the request's max_tokens. Escapes of UTF-16 surrogates must pair, so that every parser takes
 * the text. No state is a dead end: some byte always continues it, until the object closes.
 *
 * With a schema (json_schema.h) the object must also be valid against it: each value's type,
 * an object's properties (in the schema's order, required ones always), an array's items and
 * count, enum and const values. The schema is borrowed and must outlive the state. */
#ifndef CSD_JSON_ACCEPT_H
#define CSD_JSON_ACCEPT_H

#include <stdbool.h>
#include <stdint.h>

struct csd_json_schema; /* json_schema.h */

#define CSD_JSON_MAX_DEPTH 32
#define CSD_JSON_MAX_INDENT 20
#define CSD_JSON_MAX_NUMBER 32

typedef struct csd_json_accept {
    uint8_t mode;                       /* what comes next (json_accept.c's enum mode) */
    uint8_t sub;                        /* the place inside a string, number or literal */
    uint8_t depth;
    uint8_t ws;                         /* whitespace since the last token (json_accept.c) */
    uint8_t len;                        /* bytes of the current number, or of the literal */
    uint8_t literal;                    /* which of true/false/null */
    uint8_t utf8_left;                  /* continuation bytes a string's character still needs */
    uint8_t utf8_lo, utf8_hi;           /* the range of the next continuation byte */
    bool key;                           /* the current string is an object's key */
    bool want_low;                      /* a \uD800-\uDBFF escape needs its \uDC00-\uDFFF */
    bool escape_d;                      /* the current \u escape's first digit is d or D */
    uint8_t stack[CSD_JSON_MAX_DEPTH];  /* '{' or '[' per open container */
    /* the schema's part (json_accept.c, "Schema"); schema NULL: any object */
    const struct csd_json_schema *schema;
    bool matching;                      /* the current key or value must be one of the literals */
    bool integer_only;                  /* the current number has no fraction or exponent */
    uint16_t lit_base;                  /* bit i of cand is literal lit_base + i */
    uint32_t match_len;                 /* bytes of the literal matched so far */
    uint64_t cand;                      /* the literals the bytes so far still match */
    uint16_t value_node;                /* the schema of the current value, or of an object's
                                         * member that comes next (an item's: its array's items) */
    uint16_t node[CSD_JSON_MAX_DEPTH];  /* per open container: its schema */
    uint16_t count[CSD_JSON_MAX_DEPTH]; /* object: the place of its next property; array: items */
} csd_json_accept;

/* Expects an object, optionally after whitespace. */
void csd_json_accept_init(csd_json_accept *a);
/* Expects an object valid against schema (borrowed). */
void csd_json_accept_init_schema(csd_json_accept *a, const struct csd_json_schema *schema);
/* Moves a on by byte b; false (a unchanged) when b cannot come next. */
bool csd_json_accept_byte(csd_json_accept *a, uint8_t b);
/* Moves a on by n bytes, all or none: false (a unchanged) when one of them cannot come next. */
bool csd_json_accept_bytes(csd_json_accept *a, const uint8_t *p, uint32_t n);
/* The object is complete: nothing may follow. */
bool csd_json_accept_done(const csd_json_accept *a);
/* Inside a string between whole characters, no escape or surrogate half pending, and the string is
 * free text (not a key or an enum value the schema names): the state a token of plain text (no
 * quote, backslash or control byte) leaves as it found it. */
bool csd_json_accept_in_text(const csd_json_accept *a);

#endif
