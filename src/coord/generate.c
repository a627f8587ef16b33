/* generate: prefill + decode loop (see generate.h). Allocates the logits buffers once per request,
 * never per token. */
#include "generate.h"

#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "ngram_draft.h"

/* The draft model's key for the one request csd_generate runs. */
#define GEN_DRAFT_KEY 1

const char *csd_finish_name(int finish) {
    switch (finish) {
    case CSD_FINISH_STOP: return "stop";
    case CSD_FINISH_LENGTH: return "length";
    default: return "none";
    }
}

static bool is_eog(const csd_pipeline *p, const csd_gen_params *gp, int32_t id) {
    if (gp->eog_ids) {
        for (int i = 0; i < gp->n_eog; i++)
            if (gp->eog_ids[i] == id) return true;
        return false;
    }
    for (int i = 0; i < p->cfg.n_eos; i++)
        if (p->cfg.eos_ids[i] == id) return true;
    return false;
}

/* The request's buffers, allocated once: logits rows (one, or one per token of a step with a
 * draft), the raw copy a callback sees, and with speculation its text so far and the step's ids. */
typedef struct gen_bufs {
    float *logits;     /* (1 + spec_draft, vocab) */
    float *raw;        /* (vocab) */
    int32_t *hist;     /* prompt then answer (hist_cap), with speculation */
    int64_t hist_cap, n_hist;
    int32_t ids[CSD_SPEC_MAX_DRAFT + 1]; /* a step's tokens: the last one, then a draft */
    int draft_k;       /* the next draft's length from a draft model (csd_draft_next_k) */
} gen_bufs;

/* One decode step of n tokens (the last one and a draft), with logits after each when n > 1. A
 * greedy request without penalties only needs the argmax, so a fleet may send back token ids
 * instead of whole logits rows (128 KB each for a 32K vocabulary). */
static int decode_step(csd_pipeline *p, uint32_t req, const int32_t *ids, int64_t n,
                       bool argmax_only, float *logits, csd_err *err) {
    csd_step_entry e = {req, ids, n, true, argmax_only, n > 1};
    int rc = p->ops->step_begin(p, &e, 1, logits, err);
    return rc ? rc : p->ops->step_end(p, NULL, err);
}

/* The draft after the text so far into b->ids[1..], from the draft model or else looked up in
 * the text (ngram_draft.h): at most gp->spec_draft tokens, none past max_tokens, the context or a
 * step's size. A draft model that fails only costs this step its draft. */
static int draft(const csd_pipeline *p, const csd_gen_params *gp, gen_bufs *b, int64_t n_prompt,
                 int64_t n_gen) {
    int64_t k = csd_spec_draft_limit(gp->spec_draft, gp->max_tokens, p->max_ctx, n_prompt, n_gen);
    if (p->max_step_tokens - 1 < k) k = p->max_step_tokens - 1;
    if (k <= 0 || !b->hist) return 0;
    if (!gp->draft_model) return csd_ngram_draft(b->hist, b->n_hist, b->ids + 1, (int)k);
    if (k > b->draft_k) k = b->draft_k;
    csd_draft_job job = {GEN_DRAFT_KEY, b->hist, b->n_hist, b->ids + 1, (int)k};
    csd_err err = {0};
    if (csd_draft_model_propose(gp->draft_model, &job, 1, &err))
        CSD_LOGW("draft model: %s (this step goes without a draft)", err.msg);
    return job.k;
}

/* Draws the next token from logits and hands it to the caller; true when generation ends. */
static bool next_token(csd_pipeline *p, int64_t n_prompt, const csd_gen_params *gp, csd_sampler *s,
                       float *logits, gen_bufs *b, csd_gen_token_fn on_token, void *ctx,
                       csd_gen_stats *st, int32_t *id) {
    int32_t vocab = (int32_t)p->cfg.vocab_size;
    memcpy(b->raw, logits, (size_t)vocab * sizeof(float)); /* sampler edits logits in place */
    *id = csd_sampler_sample(s, logits);
    csd_sampler_accept(s, *id);
    st->n_gen++;
    if (b->hist && b->n_hist < b->hist_cap) b->hist[b->n_hist++] = *id;
    bool stop = on_token && on_token(ctx, *id, b->raw);
    if (stop || (!gp->ignore_eos && is_eog(p, gp, *id))) {
        st->finish = CSD_FINISH_STOP;
        return true;
    }
    if (st->n_gen >= gp->max_tokens || n_prompt + st->n_gen >= p->max_ctx) {
        st->finish = CSD_FINISH_LENGTH;
        return true;
    }
    return false;
}

/* Generates from the prompt's logits (row 0 of b->logits) on. With speculation a step carries the
 * last token and a draft; the token drawn from row i is the one drawn without a draft, and while
 * it equals draft token i + 1 the next comes from row i + 1 with no step. At the first difference
 * the KV of the draft's rest is dropped. */
static int decode_loop(csd_pipeline *p, uint32_t req, int64_t n_prompt, const csd_gen_params *gp,
                       csd_sampler *s, gen_bufs *b, csd_gen_token_fn on_token, void *ctx,
                       csd_gen_stats *st, csd_err *err) {
    int64_t vocab = p->cfg.vocab_size, kv_len = n_prompt, rows = 1, row = 0;
    bool argmax_only = csd_sampler_is_plain_argmax(&gp->sampling) && !gp->need_logits;
    uint64_t t0 = csd_now_ns();
    int rc = 0;
    for (;;) {
        int32_t id;
        if (next_token(p, n_prompt, gp, s, b->logits + row * vocab, b, on_token, ctx, st, &id))
            break;
        if (row + 1 < rows && id == b->ids[row + 1]) { /* the draft holds: its KV is there */
            st->spec_accepted_tokens++;
            row++;
            continue;
        }
        if (row + 1 < rows) { /* the rest of the draft is dropped */
            kv_len -= rows - (row + 1);
            if ((rc = p->ops->truncate(p, req, kv_len, err))) break;
        }
        /* the last step checked rows - 1 draft tokens and agreed with row of them */
        b->draft_k = csd_draft_next_k(b->draft_k, (int)rows - 1, (int)row, gp->spec_draft);
        b->ids[0] = id;
        rows = 1 + draft(p, gp, b, n_prompt, st->n_gen);
        st->spec_draft_tokens += rows - 1;
        row = 0;
        if ((rc = decode_step(p, req, b->ids, rows, argmax_only, b->logits, err))) break;
        kv_len += rows;
    }
    st->gen_s = (double)(csd_now_ns() - t0) * 1e-9;
    return rc;
}

int csd_generate(csd_pipeline *p, uint32_t req, const int32_t *prompt, int64_t n_prompt,
                 const csd_gen_params *gp, csd_gen_token_fn on_token, void *ctx,
                 csd_gen_stats *st, csd_err *err) {
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    if (n_prompt <= 0) return csd_err_set(err, CSD_EINVAL, "empty prompt");
    if (gp->max_tokens <= 0) return csd_err_set(err, CSD_EINVAL, "max_tokens must be > 0");
    if (n_prompt >= p->max_ctx)
        return csd_err_set(err, CSD_ERANGE,
                           "prompt of %lld tokens does not fit the context of %lld",
                           (long long)n_prompt, (long long)p->max_ctx);
    int32_t vocab = (int32_t)p->cfg.vocab_size;
    int spec = gp->spec_draft < 0                    ? 0
               : gp->spec_draft > CSD_SPEC_MAX_DRAFT ? CSD_SPEC_MAX_DRAFT
                                                     : gp->spec_draft;
    csd_gen_params g = *gp;
    g.spec_draft = spec;
    csd_sampler *s = NULL;
    gen_bufs b = {.draft_k = spec};
    b.logits = csd_alloc_array((size_t)(1 + spec) * (size_t)vocab, sizeof(float));
    b.raw = csd_alloc_array((size_t)vocab, sizeof(float));
    b.hist_cap = spec > 0 ? csd_spec_text_cap(n_prompt, gp->max_tokens, p->max_ctx) : 0;
    if (spec > 0) b.hist = csd_alloc_array((size_t)b.hist_cap, sizeof(int32_t));
    int rc = b.logits && b.raw && (spec == 0 || b.hist) ? 0
                                                        : csd_err_set(err, CSD_ENOMEM, "logits");
    if (!rc) rc = csd_sampler_create(&s, &gp->sampling, vocab, err);
    if (!rc) rc = p->ops->open(p, req, p->max_ctx, err);
    if (!rc) {
        for (int64_t i = 0; i < n_prompt; i++) csd_sampler_accept_prompt(s, prompt[i]);
        if (b.hist) memcpy(b.hist, prompt, (size_t)n_prompt * sizeof(int32_t));
        b.n_hist = b.hist ? n_prompt : 0;
        uint64_t t0 = csd_now_ns();
        rc = p->ops->forward(p, req, prompt, n_prompt, b.logits, err);
        st->prompt_s = (double)(csd_now_ns() - t0) * 1e-9;
        if (!rc) rc = decode_loop(p, req, n_prompt, &g, s, &b, on_token, ctx, st, err);
        p->ops->close(p, req);
    }
    csd_draft_model_release(gp->draft_model, GEN_DRAFT_KEY);
    csd_sampler_destroy(s);
    csd_free(b.logits);
    csd_free(b.raw);
    csd_free(b.hist);
    return rc;
}
