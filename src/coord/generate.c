/* generate: prefill + decode loop (see generate.h). Allocates the logits buffers once per request,
 * never per token. */
#include "generate.h"

#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"

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

/* One decode step. A greedy request without penalties only needs the argmax, so a fleet may send
 * back the token id instead of the whole logits row (128 KB for a 32K vocabulary). */
static int decode_step(csd_pipeline *p, uint32_t req, const int32_t *id, bool argmax_only,
                       float *logits, csd_err *err) {
    csd_step_entry e = {req, id, 1, true, argmax_only, false};
    int rc = p->ops->step_begin(p, &e, 1, logits, err);
    return rc ? rc : p->ops->step_end(p, NULL, err);
}

static int decode_loop(csd_pipeline *p, uint32_t req, int64_t n_prompt, const csd_gen_params *gp,
                       csd_sampler *s, float *logits, float *raw, csd_gen_token_fn on_token,
                       void *ctx, csd_gen_stats *st, csd_err *err) {
    int32_t vocab = (int32_t)p->cfg.vocab_size;
    int64_t ctx_len = p->max_ctx;
    bool argmax_only = csd_sampler_is_plain_argmax(&gp->sampling) && !gp->need_logits;
    uint64_t t0 = csd_now_ns();
    for (;;) {
        memcpy(raw, logits, (size_t)vocab * sizeof(float)); /* sampler edits logits in place */
        int32_t id = csd_sampler_sample(s, logits);
        csd_sampler_accept(s, id);
        st->n_gen++;
        bool stop = on_token && on_token(ctx, id, raw);
        if (stop || (!gp->ignore_eos && is_eog(p, gp, id))) {
            st->finish = CSD_FINISH_STOP;
            break;
        }
        if (st->n_gen >= gp->max_tokens || n_prompt + st->n_gen >= ctx_len) {
            st->finish = CSD_FINISH_LENGTH;
            break;
        }
        int rc = decode_step(p, req, &id, argmax_only, logits, err);
        if (rc) return rc;
    }
    st->gen_s = (double)(csd_now_ns() - t0) * 1e-9;
    return 0;
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
    csd_sampler *s = NULL;
    float *logits = csd_alloc_array((size_t)vocab, sizeof(float));
    float *raw = csd_alloc_array((size_t)vocab, sizeof(float));
    int rc = logits && raw ? 0 : csd_err_set(err, CSD_ENOMEM, "logits");
    if (!rc) rc = csd_sampler_create(&s, &gp->sampling, vocab, err);
    if (!rc) rc = p->ops->open(p, req, p->max_ctx, err);
    if (!rc) {
        for (int64_t i = 0; i < n_prompt; i++) csd_sampler_accept_prompt(s, prompt[i]);
        uint64_t t0 = csd_now_ns();
        rc = p->ops->forward(p, req, prompt, n_prompt, logits, err);
        st->prompt_s = (double)(csd_now_ns() - t0) * 1e-9;
        if (!rc) rc = decode_loop(p, req, n_prompt, gp, s, logits, raw, on_token, ctx, st, err);
        p->ops->close(p, req);
    }
    csd_sampler_destroy(s);
    csd_free(logits);
    csd_free(raw);
    return rc;
}
