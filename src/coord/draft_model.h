/* draft_model: the draft of speculative decoding from a small model that shares the served
 * model's tokenizer (`--draft-model DIR`). It runs in the coordinator, next to the sampler: for
 * each decoding request it continues the text so far greedily for k tokens, and the served model
 * checks them all in its next step (engine.c, generate.c), keeping the answer exactly what it is
 * without a draft. On a fleet this turns k + 1 trips through every stage into one whenever the
 * draft is right.
 *
 * The draft model keeps a KV cache per request (a slot). Between two drafts, the text grew by the
 * tokens the served model agreed with and one of its own; the slot keeps the longest prefix it
 * shares with the new text and computes only the rest, so a step costs the draft model about k
 * one-token forwards. The drafts of all the requests of a step run as one batch. A slot freed by a
 * finished request keeps its KV: a new request whose prompt starts the same (a system prompt)
 * takes it and skips that prefix, or copies it from a slot still held, or from another request
 * of the same call that computes it first (the choices of an n group). Thread-safe: one propose
 * at a time. */
#ifndef CSD_DRAFT_MODEL_H
#define CSD_DRAFT_MODEL_H

#include <stdint.h>

#include "core/err.h"
#include "model/model.h"

typedef struct csd_draft_model csd_draft_model;

/* One request's part of a propose call. */
typedef struct csd_draft_job {
    uint64_t key;        /* the request (non-zero); its slot is kept between calls */
    const int32_t *text; /* its prompt then its answer so far (n_text > 0) */
    int64_t n_text;
    int32_t *out;        /* room for k tokens */
    int k;               /* in: tokens wanted; out: tokens written (fewer when the draft model's
                          * context or slots run out, it proposes a token the served model does
                          * not have or is unsure of its token (p_min); none when the text holds
                          * a token the draft model does not have) */
} csd_draft_job;

/* A draft model over model (borrowed: the caller destroys it after this) with n_slots request
 * slots of up to max_ctx positions each (0: the model's), for calls of up to max_jobs jobs. A
 * slot's KV cache is made when a request first takes it. vocab_limit is the served model's
 * vocabulary: a draft stops before a token at or beyond it. */
int csd_draft_model_create(csd_draft_model **out, csd_model *model, int n_slots, int max_jobs,
                           int64_t max_ctx, int64_t vocab_limit, csd_err *err);
void csd_draft_model_destroy(csd_draft_model *d);

/* Drafts for n jobs at once, each of its own key (at most max_jobs; the rest get none). On an
 * error every job gets none and the slots involved start afresh next time. */
int csd_draft_model_propose(csd_draft_model *d, csd_draft_job *jobs, int n, csd_err *err);

/* The request ended: its slot is free for another (its KV stays, for a prompt that starts the
 * same), from the next propose on; this call does not wait for one running. Unknown keys are
 * ignored. */
void csd_draft_model_release(csd_draft_model *d, uint64_t key);

/* A request's next draft length after a step checked `drafted` of its draft tokens and agreed
 * with `agreed`: 2 longer after a draft held whole, 1 shorter after a miss, within [1, max] (the
 * schedule of Hugging Face's assisted generation). A request whose drafts keep failing (a
 * sampled answer, say) comes down to 1 draft token per step, having drafted max(max+1)/2 on the
 * way. Halving after a miss (or one more than agreed) came out slower across a round trip,
 * where a longer draft costs little: 3.03x against 3.51x (docs/benchmarks.md). */
int csd_draft_next_k(int k, int drafted, int agreed, int max);

/* Drafts end before a token the draft model gives a probability below p_min (its confidence
 * cut-off, llama.cpp's --draft-p-min), the first one included; 0 (the default): they run to k. */
void csd_draft_model_set_p_min(csd_draft_model *d, float p_min);

/* Positions per request slot. */
int64_t csd_draft_model_max_ctx(const csd_draft_model *d);
/* Positions the draft model has computed so far (its cost: a slot that keeps a prefix skips it). */
int64_t csd_draft_model_computed(csd_draft_model *d);

#endif
