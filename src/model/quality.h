/* quality: how far a test model (any precision) is from a reference model (f32) on one token
 * sequence, teacher-forced: perplexity of each, mean KL(P_ref || P_test) per position and top-1
 * (argmax) agreement. Metric maths is in double; no sampling, no generation. See docs/quality.md.
 * Position t is scored when token t + 1 is known (it predicts it), so n tokens give n - 1
 * positions. */
#ifndef CSD_QUALITY_H
#define CSD_QUALITY_H

#include <stdint.h>

#include "core/err.h"
#include "model.h"

/* Logits held per model and forward call are capped at this many bytes (a 128K vocabulary would
 * otherwise take 256 MB per model for a 512-token window); the window is then fed in chunks. */
#define CSD_QUALITY_CHUNK_BYTES (64u * 1024u * 1024u)

/* Running sums over scored positions (open: callers may merge or print them). */
typedef struct csd_quality_stats {
    int64_t positions;  /* next-token predictions scored */
    int64_t top1_agree; /* positions where argmax(ref) == argmax(test) */
    double nll_ref;     /* sum of -ln P_ref(next token), nats */
    double nll_test;    /* sum of -ln P_test(next token), nats */
    double kl_sum;      /* sum of KL(P_ref || P_test), nats */
    double kl_max;      /* largest KL at one position, nats */
} csd_quality_stats;

/* ---- metric primitives (pure functions, unit-tested on hand-made distributions) ---- */

/* out[v] = logits[v] - logsumexp(logits), computed in double. */
void csd_quality_log_softmax(const float *logits, int64_t vocab, double *out);
/* KL(P || Q) = sum_v P(v) (ln P(v) - ln Q(v)) in nats, from log-probabilities; >= 0 (clamped at 0
 * against rounding). Terms with P(v) == 0 contribute 0. */
double csd_quality_kl(const double *logp, const double *logq, int64_t vocab);
/* Index of the largest logit (the first one on ties). */
int64_t csd_quality_argmax(const float *logits, int64_t vocab);

/* Adds n_pos positions to s: row i of ref / test (vocab floats each) predicts next_ids[i].
 * scratch holds 2 * vocab doubles. Returns CSD_ERANGE (nothing added for that row on) when an id is
 * outside [0, vocab). */
int csd_quality_accumulate(csd_quality_stats *s, const float *ref, const float *test, int64_t vocab,
                           const int32_t *next_ids, int64_t n_pos, double *scratch, csd_err *err);

/* exp(mean NLL); 0 when nothing was scored. */
double csd_quality_ppl_ref(const csd_quality_stats *s);
double csd_quality_ppl_test(const csd_quality_stats *s);
/* Mean KL per position (nats) and the top-1 agreement as a fraction in [0, 1]. */
double csd_quality_mean_kl(const csd_quality_stats *s);
double csd_quality_top1(const csd_quality_stats *s);

/* ---- whole-sequence measurement ---- */

/* Runs ref and test teacher-forced over ids[0, n) and fills *out (zeroed first). The sequence is
 * cut into windows of `window` tokens, each with a fresh KV cache; consecutive windows share one
 * token so every token after the first is predicted exactly once. window must be >= 2 and fit both
 * models' max_ctx. Both models must be whole (embeddings and head) with the same vocabulary.
 * *n_windows (may be NULL) receives the number of windows. Allocates its buffers per call. */
int csd_quality_measure(csd_model *ref, csd_model *test, const int32_t *ids, int64_t n,
                        int64_t window, csd_quality_stats *out, int64_t *n_windows, csd_err *err);

#endif
