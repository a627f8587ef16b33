/* stop_text: stop-string matching with hold-back (see stop_text.h).
 * Invariant: no stop string occurrence starts inside text already emitted, because every suffix
 * of the pending text that is a proper prefix of a stop string is held back. So each push only
 * searches the pending text. */
#include "stop_text.h"

#include <string.h>

#include "core/err.h"

void csd_http_stop_init(csd_http_stop *s, char *const *stops, int n_stops) {
    memset(s, 0, sizeof *s);
    s->stops = stops;
    s->n_stops = stops ? n_stops : 0;
}

void csd_http_stop_fini(csd_http_stop *s) {
    if (!s) return;
    csd_http_buf_fini(&s->text);
    memset(s, 0, sizeof *s);
}

/* Length of the longest suffix of buf[0, n) that is a proper prefix of some stop string. */
static size_t held_back(const csd_http_stop *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        size_t k = sl - 1 < n ? sl - 1 : n;
        for (; k > best; k--)
            if (memcmp(s->text.data + n - k, s->stops[i], k) == 0) break;
        if (k > best) best = k;
    }
    return best;
}

int csd_http_stop_push(csd_http_stop *s, const char *text, size_t len, const char **emit,
                       size_t *emit_len) {
    *emit = "";
    *emit_len = 0;
    if (s->stopped) return 1;
    csd_http_buf_drop(&s->text, s->emitted); /* what the previous call handed out */
    s->emitted = 0;
    if (csd_http_buf_append(&s->text, text, len)) return CSD_ENOMEM;
    /* the earliest stop string wins */
    size_t cut = s->text.len;
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        if (sl == 0 || sl > s->text.len) continue;
        const char *hit = memmem(s->text.data, s->text.len, s->stops[i], sl);
        if (hit && (size_t)(hit - s->text.data) < cut) cut = (size_t)(hit - s->text.data);
    }
    if (cut < s->text.len) {
        s->stopped = true;
        s->text.len = cut;
        s->emitted = cut;
        *emit = s->text.data;
        *emit_len = cut;
        return 1;
    }
    s->emitted = s->text.len - held_back(s, s->text.len);
    *emit = s->text.data;
    *emit_len = s->emitted;
    return 0;
}

void csd_http_stop_flush(csd_http_stop *s, const char **emit, size_t *emit_len) {
    *emit = "";
    *emit_len = 0;
    if (s->stopped || !s->text.data) return;
    *emit = s->text.data + s->emitted;
    *emit_len = s->text.len - s->emitted;
    s->emitted = s->text.len;
}
