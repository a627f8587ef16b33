/* generate: the autoregressive loop over a pipeline: prompt prefill, then sample, feed back, until
 * an end-of-generation token, max_tokens, the context limit, or the caller says stop. Text
 * concerns (detokenizing, stop strings) belong to the caller's token callback. */
#ifndef CSD_GENERATE_H
#define CSD_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "draft_model.h"
#include "model/sampler.h"
#include "pipeline.h"

enum csd_finish {
    CSD_FINISH_NONE = 0,
    CSD_FINISH_STOP = 1,   /* end-of-generation token or a stop condition of the caller */
    CSD_FINISH_LENGTH = 2, /* max_tokens or the context limit */
    CSD_FINISH_COUNT
};

const char *csd_finish_name(int finish); /* "stop", "length" */

typedef struct csd_gen_params {
    int64_t max_tokens;          /* generated tokens at most (> 0) */
    csd_sampler_params sampling;
    bool ignore_eos;             /* keep going past end-of-generation tokens (benchmarks) */
    const int32_t *eog_ids;      /* end-of-generation ids; NULL: the config's eos ids */
    int n_eog;
    bool need_logits;            /* the token callback reads the logits (not only the token) */
    int spec_draft;              /* speculative decoding: draft tokens per step looked up in the
                                  * text so far (ngram_draft.h); 0: off; the tokens are the same */
    csd_draft_model *draft_model; /* with spec_draft: the drafts come from it instead (borrowed;
                                   * one csd_generate at a time uses it) */
} csd_gen_params;

typedef struct csd_gen_stats {
    int64_t n_prompt;
    int64_t n_gen;
    double prompt_s;     /* prefill time */
    double gen_s;        /* time spent producing tokens after the first */
    int finish;          /* enum csd_finish */
    int64_t spec_draft_tokens;    /* draft tokens proposed (spec_draft) */
    int64_t spec_accepted_tokens; /* of them, the ones the model agreed with */
} csd_gen_stats;

/* Called for every generated token (before the next forward) with its logits (the model's raw
 * distribution, for logprobs). Return true to stop (finish = stop). */
typedef bool (*csd_gen_token_fn)(void *ctx, int32_t id, const float *logits);

/* Runs one request req on the pipeline (opening and closing its state). */
int csd_generate(csd_pipeline *p, uint32_t req, const int32_t *prompt, int64_t n_prompt,
                 const csd_gen_params *params, csd_gen_token_fn on_token, void *ctx,
                 csd_gen_stats *stats, csd_err *err);

#endif
