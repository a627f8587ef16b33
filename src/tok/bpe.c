/* bpe: byte-pair merging of one pre-token, the way the reference does it: repeatedly merge the
 * adjacent pair with the lowest rank, leftmost first, then map each symbol to its id (byte
 * fallback "<0xXX>" or unk when the symbol is not a token). A heap of candidate pairs with lazy
 * invalidation keeps long words O(n log n) instead of rescanning per merge. */
#include "tok/tok_internal.h"

#include <string.h>

#include "core/alloc.h"

typedef struct sym_node {
    int64_t sym;        /* interned symbol, -1 when the string was never interned (cannot merge) */
    uint32_t start;     /* byte offset in the word */
    uint32_t len;       /* bytes */
    int32_t prev, next; /* neighbours, -1 at the ends */
    uint32_t pos;       /* index of the first character: the tie-breaker */
} sym_node;

typedef struct heap_ent {
    int32_t rank;
    uint32_t pos;
    int32_t left;
    uint32_t lsym, rsym;
} heap_ent;

static bool ent_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ent_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n) {
    heap_ent top = h[0];
    heap_ent last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && ent_less(&h[c + 1], &h[c])) c++;
        if (!ent_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static int reserve(csd_tok_bpe_scratch *s, size_t nchars) {
    if (nchars > s->sym_cap) {
        csd_free(s->sym);
        csd_free(s->heap);
        s->sym = csd_alloc_array(nchars, sizeof(sym_node));
        /* every merge pushes at most two candidates: initial n-1 plus 2 per merge */
        s->heap = csd_alloc_array(nchars * 3 + 4, sizeof(heap_ent));
        if (!s->sym || !s->heap) {
            csd_free(s->sym);
            csd_free(s->heap);
            s->sym = s->heap = NULL;
            s->sym_cap = s->heap_cap = 0;
            return CSD_ENOMEM;
        }
        s->sym_cap = nchars;
        s->heap_cap = nchars * 3 + 4;
    }
    return 0;
}

static void try_pair(const csd_tok *tok, const sym_node *nodes, int32_t left, heap_ent *heap,
                     size_t *nheap) {
    int32_t right = nodes[left].next;
    if (right < 0 || nodes[left].sym < 0 || nodes[right].sym < 0) return;
    const csd_tok_pair *p =
        csd_tok_pairmap_get(&tok->merges, (uint32_t)nodes[left].sym, (uint32_t)nodes[right].sym);
    if (!p) return;
    heap_ent e = {p->rank, nodes[left].pos, left, (uint32_t)nodes[left].sym,
                  (uint32_t)nodes[right].sym};
    heap_push(heap, nheap, e);
}

static int emit_symbol(const csd_tok *tok, const char *s, size_t n, int64_t sym, csd_tok_ids *out) {
    if (sym < 0) sym = csd_tok_strtab_find(&tok->syms, s, n);
    if (sym >= 0 && tok->sym_id[sym] >= 0) return csd_tok_ids_push(out, tok->sym_id[sym]);
    if (tok->byte_fallback) {
        bool all = true;
        for (size_t i = 0; i < n; i++) all = all && tok->byte_ids[(uint8_t)s[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < n; i++) {
                int rc = csd_tok_ids_push(out, tok->byte_ids[(uint8_t)s[i]]);
                if (rc) return rc;
            }
            return 0;
        }
    }
    if (tok->unk_id >= 0) return csd_tok_ids_push(out, tok->unk_id);
    return 0; /* no unk token: the reference drops the symbol */
}

int csd_tok_bpe_word(const csd_tok *tok, const char *w, size_t n, csd_tok_bpe_scratch *s,
                     csd_tok_ids *out) {
    if (n == 0) return 0;
    if (n > UINT32_MAX / 2) return CSD_ERANGE;
    if (tok->ignore_merges) {
        int64_t whole = csd_tok_strtab_find(&tok->syms, w, n);
        if (whole >= 0 && tok->sym_id[whole] >= 0) return csd_tok_ids_push(out, tok->sym_id[whole]);
    }
    size_t nchars = 0;
    for (size_t i = 0; i < n; nchars++) {
        uint32_t cp;
        i += csd_tok_utf8_next(w + i, n - i, &cp);
    }
    int rc = reserve(s, nchars);
    if (rc) return rc;
    sym_node *nodes = s->sym;
    heap_ent *heap = s->heap;
    size_t nheap = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        uint32_t cp;
        size_t l = csd_tok_utf8_next(w + i, n - i, &cp);
        nodes[k].sym = csd_tok_strtab_find(&tok->syms, w + i, l);
        nodes[k].start = (uint32_t)i;
        nodes[k].len = (uint32_t)l;
        nodes[k].prev = (int32_t)k - 1;
        nodes[k].next = k + 1 < nchars ? (int32_t)k + 1 : -1;
        nodes[k].pos = (uint32_t)k;
        i += l;
    }
    for (size_t i = 0; i + 1 < nchars; i++) try_pair(tok, nodes, (int32_t)i, heap, &nheap);
    while (nheap > 0) {
        heap_ent e = heap_pop(heap, &nheap);
        sym_node *l = &nodes[e.left];
        if (l->sym != (int64_t)e.lsym || l->next < 0) continue; /* stale */
        sym_node *r = &nodes[l->next];
        if (r->sym != (int64_t)e.rsym) continue;
        const csd_tok_pair *p = csd_tok_pairmap_get(&tok->merges, e.lsym, e.rsym);
        l->sym = p->result;
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0) nodes[r->next].prev = e.left;
        r->sym = -2; /* dead */
        if (l->prev >= 0) try_pair(tok, nodes, l->prev, heap, &nheap);
        try_pair(tok, nodes, e.left, heap, &nheap);
    }
    for (int32_t i = 0; i >= 0; i = nodes[i].next) {
        rc = emit_symbol(tok, w + nodes[i].start, nodes[i].len, nodes[i].sym, out);
        if (rc) return rc;
    }
    return 0;
}

void csd_tok_bpe_scratch_free(csd_tok_bpe_scratch *s) {
    csd_free(s->sym);
    csd_free(s->heap);
    memset(s, 0, sizeof *s);
}
