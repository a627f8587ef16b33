/* tables: the two hash tables of the tokenizer: interned strings (vocabulary, added tokens, merge
 * parts) and merge ranks keyed by a pair of symbols. Open addressing, power-of-two sizes, load <=
 * 1/2. Built once at load time; read-only (so shareable between threads) afterwards. */
#include "tok/tok_internal.h"

#include <string.h>

#include "core/alloc.h"

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static int strtab_grow_index(csd_tok_strtab *t) {
    size_t cap = t->mask ? (t->mask + 1) * 2 : 1024;
    uint32_t *slots = csd_alloc_array(cap, sizeof *slots);
    if (!slots) return CSD_ENOMEM;
    for (size_t i = 0; i < t->n; i++) {
        size_t h = (size_t)hash_bytes(t->buf + t->off[i], t->slen[i]) & (cap - 1);
        while (slots[h]) h = (h + 1) & (cap - 1);
        slots[h] = (uint32_t)i + 1;
    }
    csd_free(t->slots);
    t->slots = slots;
    t->mask = cap - 1;
    return 0;
}

int64_t csd_tok_strtab_find(const csd_tok_strtab *t, const char *s, size_t len) {
    if (!t->slots) return -1;
    size_t h = (size_t)hash_bytes(s, len) & t->mask;
    for (;;) {
        uint32_t v = t->slots[h];
        if (!v) return -1;
        uint32_t i = v - 1;
        if (t->slen[i] == len && memcmp(t->buf + t->off[i], s, len) == 0) return i;
        h = (h + 1) & t->mask;
    }
}

int csd_tok_strtab_intern(csd_tok_strtab *t, const char *s, size_t len, uint32_t *out) {
    int64_t found = csd_tok_strtab_find(t, s, len);
    if (found >= 0) {
        *out = (uint32_t)found;
        return 0;
    }
    if (len > UINT32_MAX / 4 || t->len + len + 1 > UINT32_MAX) return CSD_ERANGE;
    if (t->n + 1 > (t->mask + 1) / 2) {
        int rc = strtab_grow_index(t);
        if (rc) return rc;
    }
    if (t->n == t->ncap) {
        size_t ncap = t->ncap ? t->ncap * 2 : 1024;
        uint32_t *off = csd_alloc_array(ncap, sizeof *off);
        uint32_t *sl = csd_alloc_array(ncap, sizeof *sl);
        if (!off || !sl) {
            csd_free(off);
            csd_free(sl);
            return CSD_ENOMEM;
        }
        if (t->n) {
            memcpy(off, t->off, t->n * sizeof *off);
            memcpy(sl, t->slen, t->n * sizeof *sl);
        }
        csd_free(t->off);
        csd_free(t->slen);
        t->off = off;
        t->slen = sl;
        t->ncap = ncap;
    }
    if (t->len + len + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 65536;
        while (cap < t->len + len + 1) cap *= 2;
        char *buf = csd_alloc(cap);
        if (!buf) return CSD_ENOMEM;
        if (t->len) memcpy(buf, t->buf, t->len);
        csd_free(t->buf);
        t->buf = buf;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, s, len);
    t->buf[t->len + len] = '\0';
    t->off[t->n] = (uint32_t)t->len;
    t->slen[t->n] = (uint32_t)len;
    t->len += len + 1;
    size_t h = (size_t)hash_bytes(s, len) & t->mask;
    while (t->slots[h]) h = (h + 1) & t->mask;
    t->slots[h] = (uint32_t)t->n + 1;
    *out = (uint32_t)t->n++;
    return 0;
}

void csd_tok_strtab_free(csd_tok_strtab *t) {
    csd_free(t->buf);
    csd_free(t->off);
    csd_free(t->slen);
    csd_free(t->slots);
    memset(t, 0, sizeof *t);
}

static size_t pair_hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)key;
}

int csd_tok_pairmap_init(csd_tok_pairmap *m, size_t expected) {
    size_t cap = 1024;
    while (cap < expected * 2 + 2) cap *= 2;
    m->slots = csd_alloc_array(cap, sizeof *m->slots);
    if (!m->slots) return CSD_ENOMEM;
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

int csd_tok_pairmap_put(csd_tok_pairmap *m, uint32_t a, uint32_t b, int32_t rank, uint32_t result) {
    uint64_t key = ((uint64_t)a << 32) | b;
    if ((m->n + 1) * 2 > m->mask + 1) return CSD_EFULL; /* sized by init; never grows */
    size_t h = pair_hash(key) & m->mask;
    while (m->slots[h].key != UINT64_MAX && m->slots[h].key != key) h = (h + 1) & m->mask;
    if (m->slots[h].key == UINT64_MAX) m->n++;
    m->slots[h].key = key;
    m->slots[h].rank = rank;
    m->slots[h].result = result;
    return 0;
}

const csd_tok_pair *csd_tok_pairmap_get(const csd_tok_pairmap *m, uint32_t a, uint32_t b) {
    if (!m->slots) return NULL;
    uint64_t key = ((uint64_t)a << 32) | b;
    size_t h = pair_hash(key) & m->mask;
    for (;;) {
        const csd_tok_pair *p = &m->slots[h];
        if (p->key == key) return p;
        if (p->key == UINT64_MAX) return NULL;
        h = (h + 1) & m->mask;
    }
}

void csd_tok_pairmap_free(csd_tok_pairmap *m) {
    csd_free(m->slots);
    memset(m, 0, sizeof *m);
}
