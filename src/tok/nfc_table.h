/* nfc_table: declarations of the generated Unicode tables in nfc_table.c (see
 * tools/gen_nfc_table.py). Internal to src/tok/. */
#ifndef CSD_TOK_NFC_TABLE_H
#define CSD_TOK_NFC_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct csd_tok_ccc_range {
    uint32_t first, last; /* inclusive code point range */
    uint8_t ccc;          /* canonical combining class, nonzero */
} csd_tok_ccc_range;

typedef struct csd_tok_decomp {
    uint32_t cp, a, b; /* cp -> a b (b == 0 for a singleton) */
} csd_tok_decomp;

typedef struct csd_tok_comp {
    uint32_t a, b, cp; /* a b -> cp */
} csd_tok_comp;

extern const char csd_tok_nfc_unicode_version[];
extern const csd_tok_ccc_range csd_tok_ccc_ranges[];
extern const size_t csd_tok_n_ccc_ranges;
extern const csd_tok_decomp csd_tok_decomps[];
extern const size_t csd_tok_n_decomps;
extern const csd_tok_comp csd_tok_comps[];
extern const size_t csd_tok_n_comps;

#endif
