/* text_buf: see text_buf.h. */
#include "text_buf.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

int csd_http_buf_append(csd_http_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *nd = csd_alloc(cap);
        if (!nd) return CSD_ENOMEM;
        if (b->len) memcpy(nd, b->data, b->len);
        csd_free(b->data);
        b->data = nd;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
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
