/* stop_text: stop-string matching with hold-back (see stop_text.h).
 * Invariant: no stop string occurrence starts inside text already emitted, because every suffix
 * of the pending text that is a proper prefix of a stop string is held back. So each push only
 * searches the pending text. */
#include "stop_text.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

void csd_http_stop_init(csd_http_stop *s, char *const *stops, int n_stops) {
    memset(s, 0, sizeof *s);
    s->stops = stops;
    s->n_stops = stops ? n_stops : 0;
}

void csd_http_stop_fini(csd_http_stop *s) {
    if (!s) return;
    csd_free(s->buf);
    memset(s, 0, sizeof *s);
}

static int reserve(csd_http_stop *s, size_t need) {
    if (need <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < need)
        cap *= 2;
    char *nb = csd_alloc(cap);
    if (!nb) return CSD_ENOMEM;
    if (s->len) memcpy(nb, s->buf, s->len);
    csd_free(s->buf);
    s->buf = nb;
    s->cap = cap;
    return 0;
}

/* Length of the longest suffix of buf[0, n) that is a proper prefix of some stop string. */
static size_t held_back(const csd_http_stop *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        size_t k = sl - 1 < n ? sl - 1 : n;
        for (; k > best; k--)
            if (memcmp(s->buf + n - k, s->stops[i], k) == 0) break;
        if (k > best) best = k;
    }
    return best;
}

int csd_http_stop_push(csd_http_stop *s, const char *text, size_t len, const char **emit,
                       size_t *emit_len) {
    *emit = "";
    *emit_len = 0;
    if (s->stopped) return 1;
    /* drop what the previous call handed out */
    if (s->emitted) {
        memmove(s->buf, s->buf + s->emitted, s->len - s->emitted);
        s->len -= s->emitted;
        s->emitted = 0;
    }
    if (reserve(s, s->len + len + 1)) return CSD_ENOMEM;
    if (len) memcpy(s->buf + s->len, text, len);
    s->len += len;
    s->buf[s->len] = 0;
    /* the earliest stop string wins */
    size_t cut = s->len;
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        if (sl == 0 || sl > s->len) continue;
        const char *hit = memmem(s->buf, s->len, s->stops[i], sl);
        if (hit && (size_t)(hit - s->buf) < cut) cut = (size_t)(hit - s->buf);
    }
    if (cut < s->len) {
        s->stopped = true;
        s->len = cut;
        s->emitted = cut;
        *emit = s->buf;
        *emit_len = cut;
        return 1;
    }
    s->emitted = s->len - held_back(s, s->len);
    *emit = s->buf;
    *emit_len = s->emitted;
    return 0;
}

void csd_http_stop_flush(csd_http_stop *s, const char **emit, size_t *emit_len) {
    *emit = "";
    *emit_len = 0;
    if (s->stopped || !s->buf) return;
    *emit = s->buf + s->emitted;
    *emit_len = s->len - s->emitted;
    s->emitted = s->len;
}
