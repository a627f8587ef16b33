/* alloc: the one allocation entry point. Every heap allocation goes through csd_alloc/csd_free so a
 * test can assert that the per-token loop allocates nothing (csd_alloc_count before and after). */
#ifndef CSD_ALLOC_H
#define CSD_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* Returns zeroed memory aligned to 64 bytes (a cache line, and enough for AVX-512 loads), or NULL.
 * Free with csd_free. n == 0 returns a valid unique pointer. */
void *csd_alloc(size_t n);
/* n * size with overflow check; NULL on overflow or failure. Zeroed, 64-byte aligned. */
void *csd_alloc_array(size_t n, size_t size);
void csd_free(void *p);
/* Room for one more element in array p of *cap elements of elem bytes, n of them in use: p itself
 * while n < *cap, else a new array of twice the capacity (first when empty) holding the n, p
 * freed and *cap updated. NULL when that allocation fails (p and *cap are then as they were). */
void *csd_grow(void *p, size_t *cap, size_t n, size_t elem, size_t first);
/* Duplicates a NUL-terminated string (csd_free it). */
char *csd_strdup(const char *s);
/* Number of successful csd_alloc* calls since start (all threads). */
uint64_t csd_alloc_count(void);
/* For tests of out-of-memory paths: the next n csd_alloc calls (all threads) succeed and every one
 * after them fails, until a call with a negative n ends it. */
void csd_alloc_fail_after(int64_t n);

#endif
