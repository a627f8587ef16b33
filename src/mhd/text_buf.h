/* text_buf: a growable byte buffer, always NUL-terminated, for the text both HTTP fronts build up:
 * request bodies, response bodies, streamed events and the splitters' held-back text. */
#ifndef CSD_MHD_TEXT_BUF_H
#define CSD_MHD_TEXT_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct csd_http_buf {
    char *data; /* NULL until the first append */
    size_t len, cap;
} csd_http_buf;

/* Appends n bytes of s. Returns 0 or CSD_ENOMEM (the buffer is then unchanged). */
int csd_http_buf_append(csd_http_buf *b, const char *s, size_t n);
/* Appends printf-formatted text. Returns 0, or CSD_ENOMEM (or CSD_EINVAL for a bad format): the
 * buffer is then unchanged. */
int csd_http_buf_printf(csd_http_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int csd_http_buf_vprintf(csd_http_buf *b, const char *fmt, va_list ap);
/* Removes the first n bytes (n <= len). */
void csd_http_buf_drop(csd_http_buf *b, size_t n);
void csd_http_buf_fini(csd_http_buf *b);

#endif
