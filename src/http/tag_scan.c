/* tag_scan: see tag_scan.h. */
#include "tag_scan.h"

#include <string.h>

bool csd_tag_is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t csd_tag_partial(const char *buf, size_t n, const char *tag, size_t tag_len) {
    size_t k = tag_len - 1 < n ? tag_len - 1 : n;
    for (; k > 0; k--)
        if (!memcmp(buf + n - k, tag, k)) return k;
    return 0;
}

size_t csd_tag_space_after(const char *buf, size_t n, size_t max) {
    size_t k = 0;
    while (k < n && k < max && csd_tag_is_space(buf[k])) k++;
    return k;
}

size_t csd_tag_space_before(const char *buf, size_t n, size_t max) {
    size_t k = 0;
    while (k < n && k < max && csd_tag_is_space(buf[n - 1 - k])) k++;
    return k;
}
