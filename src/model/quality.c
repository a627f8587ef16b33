/* quality: teacher-forced comparison of a test model against a reference model (perplexity of both,
 * mean KL(P_ref || P_test), top-1 agreement). Probabilities are computed in double from the float
 * logits, so the metric adds no error of its own at the scales we care about (KL ~ 1e-4).
 * Not a hot path: it allocates its buffers once per call. See docs/quality.md. */
#include "quality.h"

#include <math.h>

#include "core/alloc.h"

void csd_quality_log_softmax(const float *logits, int64_t vocab, double *out) {
    double mx = -INFINITY;
    for (int64_t v = 0; v < vocab; v++)
        if ((double)logits[v] > mx) mx = (double)logits[v];
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; v++) sum += exp((double)logits[v] - mx);
    double lse = mx + log(sum);
    for (int64_t v = 0; v < vocab; v++) out[v] = (double)logits[v] - lse;
}

double csd_quality_kl(const double *logp, const double *logq, int64_t vocab) {
    double kl = 0.0;
    for (int64_t v = 0; v < vocab; v++) {
        double p = exp(logp[v]);
        if (p > 0.0) kl += p * (logp[v] - logq[v]); /* 0 * ln 0 = 0 by convention */
    }
    return kl > 0.0 ? kl : 0.0; /* KL >= 0; tiny negatives are rounding */
}

int64_t csd_quality_argmax(const float *logits, int64_t vocab) {
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    return best;
}

int csd_quality_accumulate(csd_quality_stats *s, const float *ref, const float *test, int64_t vocab,
                           const int32_t *next_ids, int64_t n_pos, double *scratch, csd_err *err) {
    double *lp = scratch, *lq = scratch + vocab;
    for (int64_t i = 0; i < n_pos; i++) {
        const float *r = ref + i * vocab, *t = test + i * vocab;
        int32_t next = next_ids[i];
        if (next < 0 || next >= vocab)
            return csd_err_set(err, CSD_ERANGE, "token id %d outside the vocabulary of %lld", next,
                               (long long)vocab);
        csd_quality_log_softmax(r, vocab, lp);
        csd_quality_log_softmax(t, vocab, lq);
        double kl = csd_quality_kl(lp, lq, vocab);
        s->positions++;
        s->nll_ref -= lp[next];
        s->nll_test -= lq[next];
        s->kl_sum += kl;
        if (kl > s->kl_max) s->kl_max = kl;
        if (csd_quality_argmax(r, vocab) == csd_quality_argmax(t, vocab)) s->top1_agree++;
    }
    return 0;
}

double csd_quality_ppl_ref(const csd_quality_stats *s) {
    return s->positions ? exp(s->nll_ref / (double)s->positions) : 0.0;
}

double csd_quality_ppl_test(const csd_quality_stats *s) {
    return s->positions ? exp(s->nll_test / (double)s->positions) : 0.0;
}

double csd_quality_mean_kl(const csd_quality_stats *s) {
    return s->positions ? s->kl_sum / (double)s->positions : 0.0;
}

double csd_quality_top1(const csd_quality_stats *s) {
    return s->positions ? (double)s->top1_agree / (double)s->positions : 0.0;
}

/* Both models are whole, agree on the vocabulary, and can hold a window. */
static int check_models(csd_model *ref, csd_model *test, int64_t window, csd_err *err) {
    csd_model *ms[2] = {ref, test};
    for (int k = 0; k < 2; k++) {
        const csd_weights *w = csd_model_weights(ms[k]);
        if (!w->has_embed || !w->has_head)
            return csd_err_set(err, CSD_EINVAL, "quality: the %s model is a partial stage",
                               k ? "test" : "reference");
        if (window > csd_model_max_ctx(ms[k]))
            return csd_err_set(
                err, CSD_ERANGE, "quality: window %lld exceeds the %s model's context %lld",
                (long long)window, k ? "test" : "reference", (long long)csd_model_max_ctx(ms[k]));
    }
    if (csd_model_cfg(ref)->vocab_size != csd_model_cfg(test)->vocab_size)
        return csd_err_set(err, CSD_EMISMATCH, "quality: vocabularies differ (%lld vs %lld)",
                           (long long)csd_model_cfg(ref)->vocab_size,
                           (long long)csd_model_cfg(test)->vocab_size);
    return 0;
}

/* Feeds ids[0, n) to kv's sequence in one forward; logits of every token into out. */
static int forward_all(csd_model *m, csd_kv *kv, csd_kv **kvs, const int32_t *ids, int64_t n,
                       float *out, csd_err *err) {
    for (int64_t i = 0; i < n; i++) kvs[i] = kv;
    csd_batch b = {n, ids, NULL, kvs, NULL};
    return csd_model_forward(m, &b, out, err);
}

int csd_quality_measure(csd_model *ref, csd_model *test, const int32_t *ids, int64_t n,
                        int64_t window, csd_quality_stats *out, int64_t *n_windows, csd_err *err) {
    *out = (csd_quality_stats){0};
    if (n_windows) *n_windows = 0;
    if (n < 2)
        return csd_err_set(err, CSD_EINVAL, "quality: need at least 2 tokens, got %lld",
                           (long long)n);
    if (window < 2)
        return csd_err_set(err, CSD_EINVAL, "quality: window %lld < 2", (long long)window);
    int rc = check_models(ref, test, window, err);
    if (rc) return rc;
    int64_t vocab = csd_model_cfg(ref)->vocab_size;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return csd_err_set(err, CSD_ERANGE,
                               "quality: token %lld (id %d) outside the vocabulary of %lld",
                               (long long)i, ids[i], (long long)vocab);
    /* Tokens per forward call: both batch limits and the logits cap. */
    int64_t chunk = csd_model_max_batch(ref) < csd_model_max_batch(test)
                        ? csd_model_max_batch(ref)
                        : csd_model_max_batch(test);
    int64_t cap = (int64_t)(CSD_QUALITY_CHUNK_BYTES / ((size_t)vocab * sizeof(float)));
    if (chunk > cap) chunk = cap > 0 ? cap : 1;
    if (chunk > window) chunk = window;
    float *lr = csd_alloc_array((size_t)(chunk * vocab), sizeof(float));
    float *lt = csd_alloc_array((size_t)(chunk * vocab), sizeof(float));
    double *scratch = csd_alloc_array((size_t)(2 * vocab), sizeof(double));
    csd_kv **kvs = csd_alloc_array((size_t)chunk, sizeof(csd_kv *));
    csd_kv *kv_ref = NULL, *kv_test = NULL;
    if (!lr || !lt || !scratch || !kvs)
        rc = csd_err_set(err, CSD_ENOMEM, "quality: buffers for %lld tokens", (long long)chunk);
    if (!rc) rc = csd_kv_create(&kv_ref, ref, window, err);
    if (!rc) rc = csd_kv_create(&kv_test, test, window, err);
    /* Window w covers [start, start + len) and scores the predictions of tokens start+1 ..
     * start+len-1; the next window starts at its last token, which becomes context. */
    for (int64_t start = 0; !rc && start < n - 1; start += window - 1) {
        int64_t len = n - start < window ? n - start : window;
        rc = csd_kv_truncate(kv_ref, 0);
        if (!rc) rc = csd_kv_truncate(kv_test, 0);
        if (rc) {
            csd_err_set(err, rc, "quality: resetting the KV cache");
            break;
        }
        for (int64_t off = 0; !rc && off < len; off += chunk) {
            int64_t c = len - off < chunk ? len - off : chunk;
            const int32_t *chunk_ids = ids + start + off;
            rc = forward_all(ref, kv_ref, kvs, chunk_ids, c, lr, err);
            if (!rc) rc = forward_all(test, kv_test, kvs, chunk_ids, c, lt, err);
            /* The window's last token predicts nothing. */
            int64_t scored = len - 1 - off < c ? len - 1 - off : c;
            if (!rc && scored > 0)
                rc =
                    csd_quality_accumulate(out, lr, lt, vocab, chunk_ids + 1, scored, scratch, err);
        }
        if (!rc && n_windows) (*n_windows)++;
    }
    csd_kv_destroy(kv_test);
    csd_kv_destroy(kv_ref);
    csd_free(kvs);
    csd_free(scratch);
    csd_free(lt);
    csd_free(lr);
    return rc;
}
