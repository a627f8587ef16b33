/* utf8: see utf8.h. The ranges are Unicode's table of well-formed byte sequences (Table 3-7). */
#include "utf8.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static int in(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

/* How many bytes at u[0..n) belong to one sequence: all of a well-formed one (*whole set), or
 * the longest start that could still become one, which a decoder replaces by a single U+FFFD
 * (Unicode's "maximal subpart"). 0 for a byte that starts nothing. */
static size_t sequence_prefix(const uint8_t *u, size_t n, bool *whole) {
    *whole = false;
    if (n == 0) return 0;
    uint8_t b = u[0];
    if (b < 0x80) {
        *whole = true;
        return 1;
    }
    size_t len = in(b, 0xC2, 0xDF) ? 2 : in(b, 0xE0, 0xEF) ? 3 : in(b, 0xF0, 0xF4) ? 4 : 0;
    if (len == 0) return 0;
    /* the second byte's range depends on the first: no overlongs, surrogates or > U+10FFFF */
    uint8_t lo = 0x80, hi = 0xBF;
    if (b == 0xE0) lo = 0xA0;
    else if (b == 0xED) hi = 0x9F;
    else if (b == 0xF0) lo = 0x90;
    else if (b == 0xF4) hi = 0x8F;
    size_t i = 1;
    for (; i < len && i < n; i++) {
        if (!in(u[i], i == 1 ? lo : 0x80, i == 1 ? hi : 0xBF)) break;
    }
    *whole = i == len;
    return i;
}

size_t csd_utf8_seq_len(const char *s, size_t n) {
    bool whole;
    size_t len = sequence_prefix((const uint8_t *)s, n, &whole);
    return whole ? len : 0;
}

size_t csd_utf8_chars(const char *s, size_t n) {
    size_t chars = 0;
    for (size_t i = 0; i < n; chars++) {
        bool whole;
        size_t len = sequence_prefix((const uint8_t *)s + i, n - i, &whole);
        i += len ? len : 1;
    }
    return chars;
}

size_t csd_utf8_scrub(char *s) {
    size_t n = strlen(s), replaced = 0;
    for (size_t i = 0; i < n;) {
        size_t len = csd_utf8_seq_len(s + i, n - i);
        if (len) {
            i += len;
            continue;
        }
        s[i++] = '?';
        replaced++;
    }
    return replaced;
}
