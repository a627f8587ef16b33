/* forward: the transformer forward pass over a stage's layer range, for a batch of tokens that may
 * belong to several sequences. Reads like the maths (HF names in comments); allocates nothing.
 *   x = embed(ids)                                  (stage 0) or hidden_in
 *   for each layer: x += o_proj(attn(rope(q(n(x))), rope(k(n(x))), v(n(x))))
 *                   x += down(silu(gate(n(x))) * up(n(x)))
 *   logits = lm_head(norm(x))                       (last stage) or hidden out */
#include <math.h>
#include <string.h>

#include "core/clock.h"
#include "decode_step.h"
#include "model_internal.h"

static void add_bias(float *y, const float *b, int64_t n_tok, int64_t dim) {
    if (!b) return;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < dim; i++) y[t * dim + i] += b[i];
}

/* Per-token work (norms, activation, residual; RoPE and cache writes of a prompt) runs on the pool
 * when a batch has enough tokens to pay for the fork-join; one token stays on the calling
 * thread. */
#define PARALLEL_MIN_TOKENS 4

typedef struct token_job {
    csd_model *m;
    const void *arg;
    int64_t n;
    csd_token_range_fn fn;
} token_job;

static void token_job_run(void *ctx, int ith, int nth) {
    const token_job *job = ctx;
    int64_t b, e;
    csd_split_range(job->n, ith, nth, &b, &e);
    if (b < e) job->fn(job->m, job->arg, b, e);
}

void csd_model_for_tokens(csd_model *m, int64_t n, csd_token_range_fn fn, const void *arg) {
    if (n < PARALLEL_MIN_TOKENS) {
        fn(m, arg, 0, n);
        return;
    }
    token_job job = {m, arg, n, fn};
    csd_pool_run(m->pool, token_job_run, &job);
}

/* xb = rmsnorm(x) * w for tokens [t0, t1); arg is the norm weight. */
static void norm_tokens(csd_model *m, const void *arg, int64_t t0, int64_t t1) {
    int64_t dim = m->cfg.dim;
    for (int64_t t = t0; t < t1; t++)
        csd_rmsnorm(m->xb + t * dim, m->x + t * dim, arg, dim, m->cfg.norm_eps);
}

/* x += tmp (the residual connection) for tokens [t0, t1). */
static void residual_tokens(csd_model *m, const void *arg, int64_t t0, int64_t t1) {
    (void)arg;
    int64_t dim = m->cfg.dim;
    for (int64_t i = t0 * dim; i < t1 * dim; i++) m->x[i] += m->tmp[i];
}

/* hb = act_fn(gate) * up, act_fn = SiLU, for tokens [t0, t1). */
static void silu_mul_tokens(csd_model *m, const void *arg, int64_t t0, int64_t t1) {
    (void)arg;
    int64_t hid = m->cfg.hidden_dim;
    csd_silu_mul(m->hb + t0 * hid, m->hb2 + t0 * hid, (t1 - t0) * hid);
}

static void attention_block(csd_model *m, const csd_batch *b, int64_t li) {
    const csd_layer_weights *lw = &m->w.layers[li];
    int64_t n = b->n;
    csd_model_for_tokens(m, n, norm_tokens, lw->attn_norm); /* input_layernorm */
    /* q_proj, k_proj, v_proj (+ biases for Qwen2) */
    const csd_qmat *qkv[3] = {&lw->wq, &lw->wk, &lw->wv};
    float *qkv_out[3] = {m->q, m->k, m->v};
    csd_matmul_multi(m->pool, qkv, 3, m->xb, n, qkv_out, m->mm_scratch);
    add_bias(m->q, lw->bq, n, m->q_dim);
    add_bias(m->k, lw->bk, n, m->kv_dim);
    add_bias(m->v, lw->bv, n, m->kv_dim);
    csd_attention_layer(m, b, li); /* RoPE, cache write, attention: q, k, v -> xb */
    csd_matmul(m->pool, &lw->wo, m->xb, n, m->tmp, m->mm_scratch); /* o_proj */
    add_bias(m->tmp, lw->bo, n, m->cfg.dim);
    csd_model_for_tokens(m, n, residual_tokens, NULL);
}

static void ffn_block(csd_model *m, int64_t n, int64_t li) {
    const csd_layer_weights *lw = &m->w.layers[li];
    csd_model_for_tokens(m, n, norm_tokens, lw->ffn_norm); /* post_attention_layernorm */
    const csd_qmat *gate_up[2] = {&lw->gate, &lw->up};
    float *gate_up_out[2] = {m->hb, m->hb2};
    csd_matmul_multi(m->pool, gate_up, 2, m->xb, n, gate_up_out, m->mm_scratch); /* gate, up */
    csd_model_for_tokens(m, n, silu_mul_tokens, NULL);
    csd_matmul(m->pool, &lw->down, m->hb, n, m->tmp, m->mm_scratch); /* down_proj */
    csd_model_for_tokens(m, n, residual_tokens, NULL);
}

/* Assigns each token its position and checks capacities before anything is written. */
static int plan_positions(csd_model *m, const csd_batch *b, csd_err *err) {
    m->batch_distinct = true;
    for (int64_t i = 0; i < b->n; i++) {
        csd_kv *kv = b->kv[i];
        if (!kv)
            return csd_err_set(err, CSD_EINVAL, "batch token %lld has no sequence", (long long)i);
        int64_t rank = 0;
        for (int64_t j = 0; j < i; j++) rank += b->kv[j] == kv;
        m->batch_distinct = m->batch_distinct && rank == 0;
        m->pos[i] = kv->len + rank;
        if (m->pos[i] >= kv->cap)
            return csd_err_set(err, CSD_EFULL, "sequence is full: position %lld, context %lld",
                               (long long)m->pos[i], (long long)kv->cap);
    }
    int64_t half = m->cfg.head_dim / 2;
    for (int64_t i = 0; i < b->n; i++) {
        float p = (float)m->pos[i];
        for (int64_t j = 0; j < half; j++) {
            float angle = p * m->inv_freq[j]; /* float32 product, as torch.outer */
            m->rope_cos[i * half + j] = (float)cos((double)angle);
            m->rope_sin[i * half + j] = (float)sin((double)angle);
        }
    }
    return 0;
}

static int load_input(csd_model *m, const csd_batch *b, csd_err *err) {
    int64_t dim = m->cfg.dim;
    if (m->w.has_embed) {
        if (!b->ids) return csd_err_set(err, CSD_EINVAL, "stage 0 needs token ids");
        for (int64_t i = 0; i < b->n; i++) {
            if (b->ids[i] < 0 || b->ids[i] >= m->cfg.vocab_size)
                return csd_err_set(err, CSD_ERANGE, "token id %d outside vocabulary of %lld",
                                   b->ids[i], (long long)m->cfg.vocab_size);
            csd_qmat_dequant_row(&m->w.embed, b->ids[i], m->x + i * dim);
        }
    } else {
        if (!b->hidden_in) return csd_err_set(err, CSD_EINVAL, "stage needs hidden states");
        memcpy(m->x, b->hidden_in, (size_t)(b->n * dim) * sizeof(float));
    }
    return 0;
}

static void write_output(csd_model *m, const csd_batch *b, float *out) {
    const csd_model_config *c = &m->cfg;
    int64_t dim = c->dim;
    if (!m->w.has_head) {
        memcpy(out, m->x, (size_t)(b->n * dim) * sizeof(float));
        return;
    }
    int64_t rows = 0;
    for (int64_t i = 0; i < b->n; i++) { /* model.norm on the tokens that want logits */
        if (b->want_logits && !b->want_logits[i]) continue;
        csd_rmsnorm(m->xb + rows * dim, m->x + i * dim, m->w.final_norm, dim, c->norm_eps);
        rows++;
    }
    if (rows) csd_matmul(m->pool, &m->w.head, m->xb, rows, out, m->mm_scratch); /* lm_head */
}

int csd_model_forward(csd_model *m, const csd_batch *b, float *out, csd_err *err) {
    if (b->n <= 0 || b->n > m->max_batch)
        return csd_err_set(err, CSD_ERANGE, "batch of %lld tokens, limit %lld", (long long)b->n,
                           (long long)m->max_batch);
    int rc = plan_positions(m, b, err);
    if (rc == 0) rc = load_input(m, b, err);
    if (rc) return rc;
    int64_t n_layers = m->w.layer_end - m->w.layer_begin;
    int path = csd_decode_step_choose(m, b);
    uint64_t t0 = path >= 0 ? csd_now_ns() : 0;
    if (path == 1) {
        csd_decode_step_layers(m, b);
    } else {
        for (int64_t li = 0; li < n_layers; li++) {
            attention_block(m, b, li);
            ffn_block(m, b->n, li);
        }
    }
    if (path >= 0) csd_decode_step_timed(m, path, csd_now_ns() - t0);
    for (int64_t i = 0; i < b->n; i++)
        b->kv[i]->len = m->pos[i] + 1 > b->kv[i]->len ? m->pos[i] + 1 : b->kv[i]->len;
    write_output(m, b, out);
    return 0;
}

int csd_model_forward_seq(csd_model *m, csd_kv *kv, const int32_t *ids, const float *hidden_in,
                          int64_t n, float *out, csd_err *err) {
    if (n <= 0) return csd_err_set(err, CSD_EINVAL, "no tokens to forward");
    int64_t done = 0;
    while (done < n) { /* split long prompts into chunks of max_batch tokens */
        int64_t chunk = n - done < m->max_batch ? n - done : m->max_batch;
        csd_kv *kvs[CSD_MODEL_DEFAULT_MAX_BATCH];
        bool want[CSD_MODEL_DEFAULT_MAX_BATCH];
        if (chunk > CSD_MODEL_DEFAULT_MAX_BATCH) chunk = CSD_MODEL_DEFAULT_MAX_BATCH;
        for (int64_t i = 0; i < chunk; i++) {
            kvs[i] = kv;
            want[i] = done + i == n - 1;
        }
        csd_batch b = {chunk, ids ? ids + done : NULL,
                       hidden_in ? hidden_in + done * m->cfg.dim : NULL, kvs, want};
        bool last = done + chunk == n;
        float *dst = m->w.has_head ? out : out + done * m->cfg.dim;
        if (m->w.has_head && !last) { /* intermediate chunks produce no logits */
            for (int64_t i = 0; i < chunk; i++) want[i] = false;
        }
        int rc = csd_model_forward(m, &b, dst, err);
        if (rc) return rc;
        done += chunk;
    }
    return 0;
}
