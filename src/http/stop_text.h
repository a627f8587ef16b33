/* stop_text: stop strings over streamed text. Text arrives in pieces (one per token); what could
 * still be the start of a stop string is held back, and at a stop string the text is cut there.
 * Pure and allocation-bounded (the held-back text is shorter than the longest stop string plus one
 * piece), so it is unit-tested apart from the server. Text must be whole UTF-8 pieces. */
#ifndef CSD_HTTP_STOP_TEXT_H
#define CSD_HTTP_STOP_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include "mhd/text_buf.h"

typedef struct csd_http_stop {
    char *const *stops; /* borrowed: n_stops non-empty strings, alive as long as this */
    int n_stops;
    csd_http_buf text; /* pending text; [0, emitted) was handed out by the last call */
    size_t emitted;
    bool stopped; /* a stop string was found; everything after it is dropped */
} csd_http_stop;

/* stops may be NULL when n_stops == 0 (then text passes straight through). */
void csd_http_stop_init(csd_http_stop *s, char *const *stops, int n_stops);
void csd_http_stop_fini(csd_http_stop *s);

/* Adds len bytes of text. *emit / *emit_len: the text now safe to send (borrowed; valid until the
 * next call). Returns 1 when a stop string was found (the emitted text ends just before it), 0
 * otherwise, CSD_ENOMEM on allocation failure. After a stop, further pushes emit nothing. */
int csd_http_stop_push(csd_http_stop *s, const char *text, size_t len, const char **emit,
                       size_t *emit_len);
/* End of generation: hands out the held-back text (nothing after a stop). */
void csd_http_stop_flush(csd_http_stop *s, const char **emit, size_t *emit_len);

#endif
