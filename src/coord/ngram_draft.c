/* ngram_draft: prompt-lookup drafts (see ngram_draft.h). */
#include "ngram_draft.h"

#include <string.h>

/* The start of the latest occurrence of hist's last n tokens that starts before them, or -1. */
static int64_t latest_match(const int32_t *hist, int64_t n_hist, int n) {
    const int32_t *tail = hist + n_hist - n;
    for (int64_t i = n_hist - n - 1; i >= 0; i--)
        if (hist[i] == tail[0] && memcmp(hist + i, tail, (size_t)n * sizeof *hist) == 0) return i;
    return -1;
}

int64_t csd_spec_draft_limit(int64_t want, int64_t max_tokens, int64_t max_ctx, int64_t n_prompt,
                             int64_t n_gen) {
    int64_t k = want, left = max_tokens - n_gen - 1, ctx_left = max_ctx - (n_prompt + n_gen);
    if (left < k) k = left;
    return ctx_left < k ? ctx_left : k;
}

int64_t csd_spec_text_cap(int64_t n_prompt, int64_t max_tokens, int64_t max_ctx) {
    return n_prompt + (max_ctx - n_prompt < max_tokens ? max_ctx - n_prompt : max_tokens);
}

int csd_ngram_draft(const int32_t *hist, int64_t n_hist, int32_t *out, int max_out) {
    if (max_out <= 0) return 0;
    for (int n = CSD_NGRAM_MAX; n >= CSD_NGRAM_MIN; n--) {
        if (n_hist <= n) continue;
        int64_t at = latest_match(hist, n_hist, n);
        if (at < 0) continue;
        /* What followed it, read on through the draft itself: the text after the occurrence
         * is predicted to repeat, period tokens back (a loop of period tokens goes on). */
        int64_t period = n_hist - n - at;
        for (int j = 0; j < max_out; j++) {
            int64_t src = n_hist + j - period;
            out[j] = src < n_hist ? hist[src] : out[src - n_hist];
        }
        return max_out;
    }
    return 0;
}
