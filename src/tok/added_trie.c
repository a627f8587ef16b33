/* added_trie: the added tokens' strings in a byte trie, one for the raw text and one for the
 * normalized text. Splitting added tokens out of a text then costs, at each byte, the length of
 * the longest string matching there, not a comparison with every added token: files like Gemma's
 * have thousands, and a prompt of a million '<' compared each of them at every byte. */
#include <string.h>

#include "core/alloc.h"
#include "tok/tok_internal.h"

#define NONE (-1)

static int new_node(csd_tok_trie *t, uint8_t byte, int32_t *at) {
    if (t->n == CSD_TOK_MAX_TRIE_NODES) return CSD_ERANGE;
    csd_tok_trie_node *p = csd_grow(t->p, &t->cap, t->n, sizeof *p, 64);
    if (!p) return CSD_ENOMEM;
    t->p = p;
    t->p[t->n] = (csd_tok_trie_node){.child = NONE, .sibling = NONE, .sym = NONE, .byte = byte};
    *at = (int32_t)t->n++;
    return 0;
}

/* The child of node under byte b, or NONE. */
static int32_t child_of(const csd_tok_trie *t, int32_t node, uint8_t b) {
    int32_t c = t->p[node].child;
    while (c != NONE && t->p[c].byte != b) c = t->p[c].sibling;
    return c;
}

/* A string too long for the trie joins the list compared whole. */
static int insert_long(csd_tok_trie *t, uint32_t sym, bool special) {
    if (t->n_long == CSD_TOK_MAX_LONG_ADDED) return CSD_ERANGE;
    t->long_added[t->n_long++] =
        (csd_tok_long_added){sym, special ? CSD_TOK_TRIE_SPECIAL : CSD_TOK_TRIE_PLAIN};
    return 0;
}

static int insert(csd_tok_trie *t, const char *s, size_t n, uint32_t sym, bool special) {
    if (n > CSD_TOK_TRIE_DEPTH) return insert_long(t, sym, special);
    int32_t node = 0;
    int rc = t->n ? 0 : new_node(t, 0, &node);
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t c = child_of(t, node, (uint8_t)s[i]);
        if (c == NONE) {
            rc = new_node(t, (uint8_t)s[i], &c);
            if (rc) break;
            t->p[c].sibling = t->p[node].child;
            t->p[node].child = c;
        }
        node = c;
    }
    if (rc) return rc;
    t->p[node].ends |= special ? CSD_TOK_TRIE_SPECIAL : CSD_TOK_TRIE_PLAIN;
    t->p[node].sym = (int32_t)sym;
    return 0;
}

/* The reference maps each string (content or normalized content) to the last token registered
 * under it, among those usable with or without special tokens. */
static void register_ids(csd_tok *tok, const csd_tok_added *a, uint32_t sym) {
    tok->added_id_all[sym] = a->id;
    if (!a->special) tok->added_id_plain[sym] = a->id;
}

int csd_tok_build_added_tries(csd_tok *tok, csd_err *err) {
    size_t n_syms = tok->syms.n ? tok->syms.n : 1;
    tok->added_id_all = csd_alloc_array(n_syms, sizeof *tok->added_id_all);
    tok->added_id_plain = csd_alloc_array(n_syms, sizeof *tok->added_id_plain);
    if (!tok->added_id_all || !tok->added_id_plain)
        return csd_err_set(err, CSD_ENOMEM, "out of memory indexing the added tokens");
    for (size_t i = 0; i < n_syms; i++) tok->added_id_all[i] = tok->added_id_plain[i] = NONE;
    for (size_t i = 0; i < tok->n_added; i++) {
        const csd_tok_added *a = &tok->added[i];
        register_ids(tok, a, a->sym);
        if (a->norm_sym >= 0) register_ids(tok, a, (uint32_t)a->norm_sym);
        bool norm = a->norm_sym >= 0;
        uint32_t sym = norm ? (uint32_t)a->norm_sym : a->sym;
        size_t n = tok->syms.slen[sym];
        if (n == 0) continue; /* an empty string matches nowhere */
        int rc = insert(norm ? &tok->added_norm : &tok->added_raw,
                        csd_tok_strtab_get(&tok->syms, sym), n, sym, a->special);
        if (rc == CSD_ERANGE)
            return csd_err_set(err, CSD_EUNSUPPORTED,
                               "tokenizer.json: added tokens beyond what is supported (at most "
                               "%d longer than %d bytes, %u bytes of them in all)",
                               CSD_TOK_MAX_LONG_ADDED, CSD_TOK_TRIE_DEPTH,
                               CSD_TOK_MAX_TRIE_NODES);
        if (rc) return csd_err_set(err, rc, "out of memory indexing the added tokens");
    }
    return 0;
}

static int32_t id_of(const csd_tok *tok, int32_t sym, bool parse_special) {
    return parse_special ? tok->added_id_all[sym] : tok->added_id_plain[sym];
}

/* The longest usable string of the long list that s starts with (longer than any in the trie). */
static size_t longest_long(const csd_tok *tok, const csd_tok_trie *t, const char *s, size_t n,
                           uint8_t usable, int32_t *sym) {
    size_t best = 0;
    for (size_t k = 0; k < t->n_long; k++) {
        const csd_tok_long_added *l = &t->long_added[k];
        size_t len = tok->syms.slen[l->sym];
        const char *c = csd_tok_strtab_get(&tok->syms, l->sym);
        if ((l->ends & usable) && len > best && len <= n && c[0] == s[0] && !memcmp(c, s, len)) {
            best = len;
            *sym = (int32_t)l->sym;
        }
    }
    return best;
}

size_t csd_tok_trie_longest(const csd_tok *tok, const csd_tok_trie *t, const char *s, size_t n,
                            bool parse_special, int32_t *id) {
    uint8_t usable = CSD_TOK_TRIE_PLAIN | (parse_special ? CSD_TOK_TRIE_SPECIAL : 0);
    int32_t sym = NONE;
    size_t best = t->n_long ? longest_long(tok, t, s, n, usable, &sym) : 0;
    if (best) {
        *id = id_of(tok, sym, parse_special);
        return best;
    }
    int32_t node = t->n ? 0 : NONE;
    for (size_t i = 0; i < n && node != NONE; i++) {
        node = child_of(t, node, (uint8_t)s[i]);
        if (node != NONE && (t->p[node].ends & usable)) {
            best = i + 1;
            *id = id_of(tok, t->p[node].sym, parse_special);
        }
    }
    return best;
}

int32_t csd_tok_added_exact(const csd_tok *tok, const char *s, size_t n, bool parse_special) {
    int64_t sym = csd_tok_strtab_find(&tok->syms, s, n);
    return sym < 0 ? NONE : id_of(tok, (int32_t)sym, parse_special);
}

void csd_tok_free_added_index(csd_tok *tok) {
    csd_free(tok->added_raw.p);
    csd_free(tok->added_norm.p);
    csd_free(tok->added_id_all);
    csd_free(tok->added_id_plain);
    tok->added_raw = tok->added_norm = (csd_tok_trie){0};
    tok->added_id_all = tok->added_id_plain = NULL;
}
