/* tok_internal: the csd_tok structure and the helpers shared by the files of src/tok/.
 * Not a public header: only the .c files of src/tok include it. Invariants: every string the
 * encoder can meet as a BPE symbol is interned once in `syms`; ids are in [0, n_ids); pieces are
 * NUL-terminated. See docs/tokenizer.md for what is supported and why. */
#ifndef CSD_TOK_INTERNAL_H
#define CSD_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "tok/tokenizer.h"

/* Bounds on what a tokenizer.json may declare, checked before anything is allocated. */
#define CSD_TOK_MAX_IDS (1 << 24)           /* largest token id + 1 we accept */
#define CSD_TOK_MAX_MERGES (1 << 24)        /* merge rules */
#define CSD_TOK_MAX_ADDED 100000            /* added tokens */
#define CSD_TOK_MAX_PATTERN 4096            /* bytes of a pre-tokenizer regex */
#define CSD_TOK_MAX_STEPS 16                /* normalizer / pre-tokenizer steps in a Sequence */
#define CSD_TOK_MAX_NORM_GROWTH 64          /* how many times the normalizers may lengthen text */
#define CSD_TOK_MAX_PREPEND 16              /* bytes a Prepend normalizer adds per section */
#define CSD_TOK_MAX_INPUT ((size_t)1 << 30) /* bytes of text one encode call accepts */

/* ---- growable buffers (csd_alloc based) ---- */
typedef struct csd_tok_buf {
    char *p;
    size_t len, cap;
} csd_tok_buf;

typedef struct csd_tok_ids {
    int32_t *p;
    size_t len, cap;
} csd_tok_ids;

int csd_tok_buf_reserve(csd_tok_buf *b, size_t extra);
int csd_tok_buf_put(csd_tok_buf *b, const void *data, size_t n);
void csd_tok_buf_free(csd_tok_buf *b);
int csd_tok_ids_push(csd_tok_ids *v, int32_t id);
void csd_tok_ids_free(csd_tok_ids *v);

/* ---- UTF-8 ---- */
/* WHATWG UTF-8 decoder state (what TextDecoder does: one U+FFFD per maximal invalid subpart). */
typedef struct csd_tok_u8dec {
    uint32_t cp;
    uint32_t errors; /* replacements emitted for invalid input so far */
    uint8_t needed, seen, lower, upper;
} csd_tok_u8dec;

void csd_tok_u8dec_init(csd_tok_u8dec *d);
/* Feeds one byte; appends completed characters or U+FFFD to out (at most 6 bytes). */
size_t csd_tok_u8dec_feed(csd_tok_u8dec *d, uint8_t byte, char *out);
/* Copies in to out replacing invalid sequences with U+FFFD; out needs 3 * n bytes. Returns length.
 */
size_t csd_tok_utf8_sanitize(const char *in, size_t n, char *out);
/* Length of the (valid) UTF-8 character starting at s and its code point. */
size_t csd_tok_utf8_next(const char *s, size_t n, uint32_t *cp);
size_t csd_tok_utf8_put(uint32_t cp, char *out);
bool csd_tok_utf8_valid(const char *s, size_t n);
/* JavaScript String.prototype.trim whitespace (WhiteSpace + LineTerminator). */
bool csd_tok_is_js_space(uint32_t cp);

/* ---- interned strings: every vocabulary, added and merge string, with a hash index ---- */
typedef struct csd_tok_strtab {
    char *buf; /* all strings, each NUL-terminated */
    size_t len, cap;
    uint32_t *off;  /* (n) offset of string i in buf */
    uint32_t *slen; /* (n) byte length of string i */
    size_t n, ncap;
    uint32_t *slots; /* (mask + 1) string index + 1, 0 = empty */
    size_t mask;
} csd_tok_strtab;

int csd_tok_strtab_intern(csd_tok_strtab *t, const char *s, size_t len, uint32_t *out);
/* Index of s, or -1. */
int64_t csd_tok_strtab_find(const csd_tok_strtab *t, const char *s, size_t len);
void csd_tok_strtab_free(csd_tok_strtab *t);
static inline const char *csd_tok_strtab_get(const csd_tok_strtab *t, uint32_t i) {
    return t->buf + t->off[i];
}

/* ---- merge ranks keyed by a pair of symbols ---- */
typedef struct csd_tok_pair {
    uint64_t key;    /* (left << 32) | right; UINT64_MAX = empty slot */
    int32_t rank;    /* position in the merges list (lower merges first) */
    uint32_t result; /* symbol of left + right */
} csd_tok_pair;

typedef struct csd_tok_pairmap {
    csd_tok_pair *slots;
    size_t mask, n;
} csd_tok_pairmap;

int csd_tok_pairmap_init(csd_tok_pairmap *m, size_t expected);
/* Inserts or overwrites (a later duplicate rule wins, as in the reference's Map). */
int csd_tok_pairmap_put(csd_tok_pairmap *m, uint32_t a, uint32_t b, int32_t rank, uint32_t result);
const csd_tok_pair *csd_tok_pairmap_get(const csd_tok_pairmap *m, uint32_t a, uint32_t b);
void csd_tok_pairmap_free(csd_tok_pairmap *m);

/* ---- components ---- */
enum csd_tok_norm_kind { CSD_TOK_NORM_PREPEND = 0, CSD_TOK_NORM_REPLACE = 1, CSD_TOK_NORM_NFC = 2 };

typedef struct csd_tok_norm_step {
    int kind;
    char *a; /* prepend text, or the string replaced */
    char *b; /* replacement */
} csd_tok_norm_step;

enum csd_tok_pre_kind {
    CSD_TOK_PRE_SPLIT = 0,
    CSD_TOK_PRE_BYTELEVEL = 1,
    CSD_TOK_PRE_METASPACE = 2
};

/* Metaspace prepend_scheme: when the replacement is put in front of a text section. */
enum csd_tok_prepend {
    CSD_TOK_PREPEND_ALWAYS = 0,
    CSD_TOK_PREPEND_FIRST = 1,
    CSD_TOK_PREPEND_NEVER = 2
};

typedef struct csd_tok_pre_step {
    int kind;
    void *code;            /* pcre2_code_8 * (split regex, or the GPT-2 regex of ByteLevel) */
    bool invert;           /* Split: keep only the matches */
    bool removed;          /* Split behavior Removed: drop the matches */
    bool add_prefix_space; /* ByteLevel */
    char *replacement;     /* Metaspace: what a space becomes ("\u2581") */
    int prepend;           /* Metaspace: a csd_tok_prepend */
} csd_tok_pre_step;

typedef struct csd_tok_added {
    uint32_t sym;     /* interned content */
    int64_t norm_sym; /* interned normalized content when matched after normalization, else -1 */
    int32_t id;
    bool lstrip, rstrip, normalized, special;
} csd_tok_added;

/* A byte trie of added tokens' strings (added_trie.c). Node 0 is the root. */
#define CSD_TOK_TRIE_SPECIAL 1u /* a special token's string ends here */
#define CSD_TOK_TRIE_PLAIN 2u   /* a non-special token's string ends here */
typedef struct csd_tok_trie_node {
    int32_t child, sibling; /* first child and next sibling, -1 for none */
    int32_t sym;            /* the symbol of the string ending here (when ends) */
    uint8_t byte;           /* the byte leading here from the parent */
    uint8_t ends;           /* CSD_TOK_TRIE_* */
} csd_tok_trie_node;

/* Strings up to CSD_TOK_TRIE_DEPTH bytes go in the trie, so a match costs at most that many steps
 * per byte of text; longer ones (no real file has them; at most CSD_TOK_MAX_LONG_ADDED) are
 * compared whole, as a list. The nodes are bounded too: a tokenizer beyond is refused. */
#define CSD_TOK_TRIE_DEPTH 256
#define CSD_TOK_MAX_LONG_ADDED 64
#define CSD_TOK_MAX_TRIE_NODES (8u << 20)

typedef struct csd_tok_long_added {
    uint32_t sym;
    uint8_t ends; /* CSD_TOK_TRIE_* */
} csd_tok_long_added;

typedef struct csd_tok_trie {
    csd_tok_trie_node *p;
    size_t n, cap;
    csd_tok_long_added long_added[CSD_TOK_MAX_LONG_ADDED];
    size_t n_long;
} csd_tok_trie;

enum csd_tok_dec_kind { CSD_TOK_DEC_NONE = 0, CSD_TOK_DEC_BYTELEVEL = 1, CSD_TOK_DEC_SP = 2 };

#define CSD_TOK_ID_SPECIAL 1u /* skipped by skip_special */
#define CSD_TOK_ID_ADDED \
    2u /* an added token: split out before the model, verbatim in ByteLevel decode */
#define CSD_TOK_ID_EOG 4u  /* ends generation */
#define CSD_TOK_ID_BYTE 8u /* a <0xXX> byte-fallback piece (SP decoder) */
#define CSD_TOK_ID_LSTRIP 16u /* an added token that trims the text before it */
#define CSD_TOK_ID_RSTRIP 32u /* an added token that trims the text after it */

struct csd_tok {
    csd_tok_strtab syms;
    int32_t *sym_id;   /* (syms.n) token id of each symbol, -1 when not a token */
    int32_t n_ids;     /* largest id + 1 */
    int32_t *id_sym;   /* (n_ids) symbol holding the piece of id, -1 for a hole */
    uint8_t *id_flags; /* (n_ids) CSD_TOK_ID_* bits */
    uint8_t *id_byte;  /* (n_ids) the byte of a CSD_TOK_ID_BYTE piece */

    /* BPE model */
    csd_tok_pairmap merges;
    int32_t unk_id; /* -1 when the model has no unk_token */
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_ids[256]; /* id of "<0xXX>" or -1 */

    csd_tok_added *added; /* (n_added) in file order */
    size_t n_added;
    bool any_normalized_added;
    csd_tok_trie added_raw, added_norm; /* their strings, matched before / after normalizing */
    /* (syms.n) the id of the last added token registered under a symbol (its content or its
     * normalized content), with special tokens parsed (all) or not (plain); -1 for none */
    int32_t *added_id_all, *added_id_plain;

    csd_tok_norm_step norm[CSD_TOK_MAX_STEPS];
    size_t n_norm;
    csd_tok_pre_step pre[CSD_TOK_MAX_STEPS];
    size_t n_pre;
    void *gctx; /* pcre2_general_context_8 * routing pcre2 memory through csd_alloc */

    int dec_kind;
    char *dec_from, *dec_to; /* SP decoder Replace (NULL when absent) */
    bool dec_byte_fallback;
    int dec_strip_start; /* leading copies of ' ' removed from the decoded text (0 or 1) */

    int32_t prefix[8], suffix[8]; /* ids added around the text when add_special */
    size_t n_prefix, n_suffix;
    int32_t bos, eos;
    char *bos_text, *eos_text, *chat_template;
};

/* ---- internal entry points ---- */
/* Indexes the added tokens (after their normalized forms and the ids are known). */
int csd_tok_build_added_tries(csd_tok *tok, csd_err *err);
/* The length of the longest added-token string usable with parse_special that s starts with,
 * and its id in *id; 0 when none. */
size_t csd_tok_trie_longest(const csd_tok *tok, const csd_tok_trie *t, const char *s, size_t n,
                            bool parse_special, int32_t *id);
/* The id of the added token whose content (or normalized content) is exactly s, else -1. */
int32_t csd_tok_added_exact(const csd_tok *tok, const char *s, size_t n, bool parse_special);
void csd_tok_free_added_index(csd_tok *tok);
int csd_tok_nfc(const char *in, size_t n, csd_tok_buf *out);
bool csd_tok_nfc_quick_ok(const char *s, size_t n); /* true when NFC cannot change s */
int csd_tok_normalize(const csd_tok *tok, const char *in, size_t n, csd_tok_buf *out);

/* Byte-level alphabet: byte b is written as the character csd_tok_bytelevel_char(b). */
uint32_t csd_tok_bytelevel_char(uint8_t b);
int csd_tok_bytelevel_byte(uint32_t cp); /* the byte, or -1 when cp is not in the alphabet */

/* Pre-tokenization: text -> pieces (spans into pieces->buf). */
typedef struct csd_tok_pieces {
    csd_tok_buf text;
    size_t *off, *len;
    size_t n, cap;
} csd_tok_pieces;

int csd_tok_pieces_add(csd_tok_pieces *p, const char *s, size_t n);
void csd_tok_pieces_reset(csd_tok_pieces *p);
void csd_tok_pieces_free(csd_tok_pieces *p);
/* first_section: s comes from the first section of the input (Metaspace prepend_scheme "first"). */
int csd_tok_pretokenize(const csd_tok *tok, const char *s, size_t n, bool first_section,
                        csd_tok_pieces *out, csd_tok_pieces *tmp, csd_err *err);
int csd_tok_regex_compile(csd_tok *tok, const char *pattern, size_t len, bool is_regex, void **code,
                          csd_err *err);
void csd_tok_regex_free(void *code);

/* BPE over one pre-token (in the model's alphabet); appends ids. */
typedef struct csd_tok_bpe_scratch {
    void *sym;  /* symbol nodes */
    void *heap; /* candidate merges */
    size_t sym_cap, heap_cap;
} csd_tok_bpe_scratch;

int csd_tok_bpe_word(const csd_tok *tok, const char *w, size_t n, csd_tok_bpe_scratch *s,
                     csd_tok_ids *out);
void csd_tok_bpe_scratch_free(csd_tok_bpe_scratch *s);

/* Refuses a vocabulary with a token whose text would not fit CSD_DETOK_PIECE_MAX (detok.c). */
int csd_tok_check_pieces(const csd_tok *tok, csd_err *err);

#endif
