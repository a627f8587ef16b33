/* text_buf: see text_buf.h. */
#include "text_buf.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

/* Makes room for n more bytes and the NUL. */
static int reserve(csd_http_buf *b, size_t n) {
    if (b->len + n + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *nd = csd_alloc(cap);
    if (!nd) return CSD_ENOMEM;
    if (b->len) memcpy(nd, b->data, b->len);
    csd_free(b->data);
    b->data = nd;
    b->cap = cap;
    return 0;
}

int csd_http_buf_append(csd_http_buf *b, const char *s, size_t n) {
    if (reserve(b, n)) return CSD_ENOMEM;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

int csd_http_buf_vprintf(csd_http_buf *b, const char *fmt, va_list ap) {
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    int rc = n < 0 ? CSD_EINVAL : reserve(b, (size_t)n);
    if (!rc) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, again);
        b->len += (size_t)n;
    }
    va_end(again);
    return rc;
}

int csd_http_buf_printf(csd_http_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = csd_http_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void csd_http_buf_drop(csd_http_buf *b, size_t n) {
    if (!n) return;
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

void csd_http_buf_fini(csd_http_buf *b) {
    csd_free(b->data);
    memset(b, 0, sizeof *b);
}
