/* text_buf: a growable byte buffer, always NUL-terminated, for the text the HTTP layer builds up:
 * request bodies, response bodies, streamed events and the splitters' held-back text. */
#ifndef CSD_HTTP_TEXT_BUF_H
#define CSD_HTTP_TEXT_BUF_H

#include <stddef.h>

typedef struct csd_http_buf {
    char *data; /* NULL until the first append */
    size_t len, cap;
} csd_http_buf;

/* Appends n bytes of s. Returns 0 or CSD_ENOMEM (the buffer is then unchanged). */
int csd_http_buf_append(csd_http_buf *b, const char *s, size_t n);
/* Removes the first n bytes (n <= len). */
void csd_http_buf_drop(csd_http_buf *b, size_t n);
void csd_http_buf_fini(csd_http_buf *b);

#endif
