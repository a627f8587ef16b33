/* nfc_table: declarations of the generated Unicode tables in nfc_table.c (see
 * tools/gen_nfc_table.py). Internal to src/tok/. */
#ifndef CSD_TOK_NFC_TABLE_H
#define CSD_TOK_NFC_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_ccc_range {
    uint32_t first, last; /* inclusive code point range */
    uint8_t ccc;          /* canonical combining class, nonzero */
} tok_ccc_range;

typedef struct tok_decomp {
    uint32_t cp, a, b; /* cp -> a b (b == 0 for a singleton) */
} tok_decomp;

typedef struct tok_comp {
    uint32_t a, b, cp; /* a b -> cp */
} tok_comp;

extern const char tok_nfc_unicode_version[];
extern const tok_ccc_range tok_ccc_ranges[];
extern const size_t tok_n_ccc_ranges;
extern const tok_decomp tok_decomps[];
extern const size_t tok_n_decomps;
extern const tok_comp tok_comps[];
extern const size_t tok_n_comps;

#endif
