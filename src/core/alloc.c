/* alloc: aligned, zeroed, counted allocation (see alloc.h). */
#include "alloc.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static atomic_uint_fast64_t alloc_count;
static _Atomic int64_t fail_after = -1; /* csd_alloc_fail_after: allocations left to succeed */

void csd_alloc_fail_after(int64_t n) { atomic_store(&fail_after, n < 0 ? -1 : n); }

/* Whether csd_alloc_fail_after says this allocation fails (counting it when it does not). */
static bool failure_injected(void) {
    int64_t left = atomic_load_explicit(&fail_after, memory_order_relaxed);
    while (left > 0)
        if (atomic_compare_exchange_weak(&fail_after, &left, left - 1)) return false;
    return left == 0;
}

/* Buffers this large (model weights, KV caches) are placed on 2 MiB boundaries and offered to the
 * kernel for transparent huge pages: decoding streams every weight once per token, and fewer TLB
 * misses measurably speed that up. */
#define HUGE_ALLOC_MIN (8u << 20)
#define HUGE_PAGE (2u << 20)

void *csd_alloc(size_t n) {
    size_t rounded = (n + 63) & ~(size_t)63;
    if (rounded < n) return NULL; /* overflow */
    if (rounded == 0) rounded = 64;
    if (failure_injected()) return NULL;
    void *p;
    if (rounded >= HUGE_ALLOC_MIN) {
        size_t huge = (rounded + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
        p = huge >= rounded ? aligned_alloc(HUGE_PAGE, huge) : NULL;
#ifdef MADV_HUGEPAGE
        if (p) (void)madvise(p, huge, MADV_HUGEPAGE); /* best effort */
#endif
    } else {
        p = aligned_alloc(64, rounded);
    }
    if (!p) return NULL;
    memset(p, 0, rounded);
    atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
    return p;
}

void *csd_alloc_array(size_t n, size_t size) {
    if (size != 0 && n > SIZE_MAX / size) return NULL;
    return csd_alloc(n * size);
}

void csd_free(void *p) { free(p); }

void *csd_grow(void *p, size_t *cap, size_t n, size_t elem, size_t first) {
    if (n < *cap) return p;
    size_t more = *cap ? *cap * 2 : first;
    void *q = csd_alloc_array(more, elem);
    if (!q) return NULL;
    if (n) memcpy(q, p, n * elem);
    csd_free(p);
    *cap = more;
    return q;
}

char *csd_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = csd_alloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

uint64_t csd_alloc_count(void) { return atomic_load_explicit(&alloc_count, memory_order_relaxed); }
