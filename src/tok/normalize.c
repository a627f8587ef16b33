/* normalize: the normalizers of tokenizer.json we support, applied to one text section: Prepend,
 * Replace (literal string) and NFC (canonical decomposition, canonical ordering, canonical
 * composition per UAX #15, over the generated tables in nfc_table.c). Input is valid UTF-8. */
#include "tok/tok_internal.h"

#include <string.h>

#include "core/alloc.h"
#include "tok/nfc_table.h"

/* Hangul syllable arithmetic (UAX #15, 3.12) */
enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7 };
enum { L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = 11172 };

static uint8_t ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = csd_tok_n_ccc_ranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < csd_tok_ccc_ranges[mid].first)
            hi = mid;
        else if (cp > csd_tok_ccc_ranges[mid].last)
            lo = mid + 1;
        else
            return csd_tok_ccc_ranges[mid].ccc;
    }
    return 0;
}

static const csd_tok_decomp *decomp_of(uint32_t cp) {
    size_t lo = 0, hi = csd_tok_n_decomps;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < csd_tok_decomps[mid].cp)
            hi = mid;
        else if (cp > csd_tok_decomps[mid].cp)
            lo = mid + 1;
        else
            return &csd_tok_decomps[mid];
    }
    return NULL;
}

static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
        b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    size_t lo = 0, hi = csd_tok_n_comps;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const csd_tok_comp *c = &csd_tok_comps[mid];
        if (a < c->a || (a == c->a && b < c->b))
            hi = mid;
        else if (a > c->a || b > c->b)
            lo = mid + 1;
        else
            return c->cp;
    }
    return 0;
}

typedef struct cpvec {
    uint32_t *p;
    size_t len, cap;
} cpvec;

static int cp_push(cpvec *v, uint32_t cp) {
    uint32_t *p = csd_grow(v->p, &v->cap, v->len, sizeof *p, 256);
    if (!p) return CSD_ENOMEM;
    v->p = p;
    v->p[v->len++] = cp;
    return 0;
}

static int decompose(cpvec *v, uint32_t cp, int depth) {
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t s = cp - S_BASE;
        int rc = cp_push(v, L_BASE + s / N_COUNT);
        if (!rc) rc = cp_push(v, V_BASE + (s % N_COUNT) / T_COUNT);
        if (!rc && s % T_COUNT) rc = cp_push(v, T_BASE + s % T_COUNT);
        return rc;
    }
    const csd_tok_decomp *d = depth < 8 ? decomp_of(cp) : NULL;
    if (!d) return cp_push(v, cp);
    int rc = decompose(v, d->a, depth + 1);
    if (!rc && d->b) rc = decompose(v, d->b, depth + 1);
    return rc;
}

bool csd_tok_nfc_quick_ok(const char *s, size_t n) {
    /* Below U+0300 nothing decomposes under NFC, combines, or reorders. */
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0xCC) return false; /* a lead byte of U+0300 or above */
    return true;
}

/* Stable sort of one run of non-starters by combining class. Short runs (nearly all text) by
 * insertion; a long one by counting sort, linear where insertion is quadratic (a prompt of
 * alternating marks of two classes took seconds per 100 KB). */
#define SHORT_RUN 32
static int sort_run(uint32_t *p, size_t n) {
    if (n <= SHORT_RUN) {
        uint8_t cls[SHORT_RUN];
        for (size_t i = 0; i < n; i++) {
            uint32_t c = p[i];
            uint8_t cc = ccc_of(c);
            size_t j = i;
            for (; j > 0 && cls[j - 1] > cc; j--) {
                p[j] = p[j - 1];
                cls[j] = cls[j - 1];
            }
            p[j] = c;
            cls[j] = cc;
        }
        return 0;
    }
    uint32_t *sorted = csd_alloc_array(n, sizeof *sorted);
    if (!sorted) return CSD_ENOMEM;
    size_t at[257] = {0}; /* at[c]: where the next mark of class c goes */
    for (size_t i = 0; i < n; i++) at[ccc_of(p[i]) + 1]++;
    for (int c = 1; c < 257; c++) at[c] += at[c - 1];
    for (size_t i = 0; i < n; i++) sorted[at[ccc_of(p[i])]++] = p[i];
    memcpy(p, sorted, n * sizeof *p);
    csd_free(sorted);
    return 0;
}

/* Canonical ordering: each run of non-starters sorted by class, stably. */
static int order_marks(uint32_t *p, size_t n) {
    for (size_t a = 0; a < n;) {
        if (ccc_of(p[a]) == 0) {
            a++;
            continue;
        }
        size_t b = a + 1;
        while (b < n && ccc_of(p[b]) != 0) b++;
        int rc = sort_run(p + a, b - a);
        if (rc) return rc;
        a = b;
    }
    return 0;
}

int csd_tok_nfc(const char *in, size_t n, csd_tok_buf *out) {
    if (csd_tok_nfc_quick_ok(in, n)) return csd_tok_buf_put(out, in, n);
    cpvec v = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        uint32_t cp;
        i += csd_tok_utf8_next(in + i, n - i, &cp);
        rc = decompose(&v, cp, 0);
    }
    if (rc) goto done;
    rc = order_marks(v.p, v.len);
    if (rc) goto done;
    /* canonical composition */
    size_t w = 0;
    int64_t starter = -1;
    int last_cc = -1; /* class of the last character kept after the starter, -1 when none */
    for (size_t i = 0; i < v.len; i++) {
        uint32_t c = v.p[i];
        int cc = ccc_of(c);
        if (starter >= 0 && !(last_cc != -1 && last_cc >= cc)) {
            uint32_t comp = compose(v.p[starter], c);
            if (comp) {
                v.p[starter] = comp;
                continue;
            }
        }
        if (cc == 0) {
            starter = (int64_t)w;
            last_cc = -1;
        } else {
            last_cc = cc;
        }
        v.p[w++] = c;
    }
    rc = csd_tok_buf_reserve(out, w * 4);
    if (rc) goto done;
    for (size_t i = 0; i < w; i++) out->len += csd_tok_utf8_put(v.p[i], out->p + out->len);
    out->p[out->len] = '\0';
done:
    csd_free(v.p);
    return rc;
}

/* Appends in with every occurrence of from replaced by to (left to right, non-overlapping). */
static int replace_all(const char *in, size_t n, const char *from, const char *to,
                       csd_tok_buf *out) {
    size_t fl = strlen(from), tl = strlen(to);
    if (fl == 0) return csd_tok_buf_put(out, in, n);
    size_t i = 0;
    while (i < n) {
        const char *hit = NULL;
        if (n - i >= fl) {
            hit = memchr(in + i, from[0], n - i - fl + 1);
            while (hit && memcmp(hit, from, fl) != 0) {
                size_t at = (size_t)(hit - in) + 1;
                hit = at + fl <= n ? memchr(in + at, from[0], n - at - fl + 1) : NULL;
            }
        }
        size_t stop = hit ? (size_t)(hit - in) : n;
        int rc = csd_tok_buf_put(out, in + i, stop - i);
        if (rc) return rc;
        if (!hit) break;
        rc = csd_tok_buf_put(out, to, tl);
        if (rc) return rc;
        i = stop + fl;
    }
    return 0;
}

int csd_tok_normalize(const csd_tok *tok, const char *in, size_t n, csd_tok_buf *out) {
    csd_tok_buf a = {0}, b = {0};
    int rc = csd_tok_buf_put(&a, in, n);
    for (size_t s = 0; s < tok->n_norm && !rc; s++) {
        const csd_tok_norm_step *st = &tok->norm[s];
        b.len = 0;
        if (st->kind == CSD_TOK_NORM_PREPEND) {
            rc = csd_tok_buf_put(&b, st->a, strlen(st->a));
            if (!rc) rc = csd_tok_buf_put(&b, a.p, a.len);
        } else if (st->kind == CSD_TOK_NORM_REPLACE) {
            rc = replace_all(a.p, a.len, st->a, st->b, &b);
        } else {
            rc = csd_tok_nfc(a.p, a.len, &b);
        }
        csd_tok_buf tmp = a;
        a = b;
        b = tmp;
    }
    if (!rc) rc = csd_tok_buf_put(out, a.p, a.len);
    csd_tok_buf_free(&a);
    csd_tok_buf_free(&b);
    return rc;
}
