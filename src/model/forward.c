/* forward: the transformer forward pass over a stage's layer range, for a batch of tokens that may
 * belong to several sequences. Reads like the maths (HF names in comments); allocates nothing.
 *   x = embed(ids)                                  (stage 0) or hidden_in
 *   for each layer: x += o_proj(attn(rope(q(n(x))), rope(k(n(x))), v(n(x))))
 *                   x += down(silu(gate(n(x))) * up(n(x)))
 *   logits = lm_head(norm(x))                       (last stage) or hidden out */
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "model_internal.h"

static void add_bias(float *y, const float *b, int64_t n_tok, int64_t dim) {
    if (!b) return;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < dim; i++) y[t * dim + i] += b[i];
}

/* Rotate-half RoPE on every head of one token: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). */
static void rope_apply(float *vec, int64_t n_heads, int64_t hd, const float *cos_t,
                       const float *sin_t) {
    int64_t half = hd / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = vec + h * hd;
        for (int64_t i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos_t[i] - b * sin_t[i];
            v[i + half] = b * cos_t[i] + a * sin_t[i];
        }
    }
}

/* K and V of one token into the cache: f32, f16, or q8 (int8 per head row with an f32 scale,
 * absmax: half the memory of f16 for a small, measured quality cost; docs/kernels.md). */
static void quantize_head_q8(int8_t *q, float *scale, const float *x, int64_t hd) {
    float amax = 0.0f;
    for (int64_t i = 0; i < hd; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    for (int64_t i = 0; i < hd; i++) q[i] = (int8_t)lrintf(x[i] * inv);
    *scale = d;
}

static void kv_store(csd_kv *kv, int64_t layer, int64_t pos, const float *k, const float *v, int64_t hd) {
    int64_t row = layer * kv->cap + pos, off = row * kv->kv_dim;
    if (kv->dtype == CSD_DTYPE_F32) {
        memcpy((float *)kv->k + off, k, (size_t)kv->kv_dim * sizeof(float));
        memcpy((float *)kv->v + off, v, (size_t)kv->kv_dim * sizeof(float));
    } else if (kv->dtype == CSD_DTYPE_F16) {
        csd_f32_to_f16_vec((uint16_t *)kv->k + off, k, kv->kv_dim);
        csd_f32_to_f16_vec((uint16_t *)kv->v + off, v, kv->kv_dim);
    } else {
        int64_t heads = kv->kv_dim / hd;
        for (int64_t h = 0; h < heads; h++) {
            quantize_head_q8((int8_t *)kv->k + off + h * hd, kv->k_scale + row * heads + h, k + h * hd, hd);
            quantize_head_q8((int8_t *)kv->v + off + h * hd, kv->v_scale + row * heads + h, v + h * hd, hd);
        }
    }
}

static float dot_q8(const float *q, const int8_t *k, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += q[i] * (float)k[i];
    return acc;
}

static void axpy_q8(float *y, float a, const int8_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * (float)x[i];
}

/* Per-token work (norms, RoPE, cache writes, activation, residual) runs on the pool when a batch
 * has enough tokens to pay for the fork-join; one token stays on the calling thread. */
#define PARALLEL_MIN_TOKENS 4

typedef void (*token_range_fn)(csd_model *m, const void *arg, int64_t t0, int64_t t1);

typedef struct token_job {
    csd_model *m;
    const void *arg;
    int64_t n;
    token_range_fn fn;
} token_job;

static void token_job_run(void *ctx, int ith, int nth) {
    const token_job *job = ctx;
    int64_t b, e;
    csd_split_range(job->n, ith, nth, &b, &e);
    if (b < e) job->fn(job->m, job->arg, b, e);
}

static void for_tokens(csd_model *m, int64_t n, token_range_fn fn, const void *arg) {
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

typedef struct attn_job {
    csd_model *m;
    const csd_batch *batch;
    int64_t layer;      /* index within the stage */
} attn_job;

/* The first position a token at pos attends to: 0, or the start of the sliding window. */
static int64_t first_position(const csd_model_config *c, int64_t pos) {
    return c->sliding_window > 0 && pos + 1 > c->sliding_window ? pos + 1 - c->sliding_window : 0;
}

/* One (token, head) over an F32 or Q8 cache: softmax(q . K^T / sqrt(hd)) V over the token's own
 * sequence up to its position (causal), from first_position. att: max_ctx floats of scratch. */
static void attend_one(csd_model *m, csd_kv *kv, int64_t layer, int64_t tok, int64_t h, float *att) {
    const csd_model_config *c = &m->cfg;
    int64_t hd = c->head_dim, pos = m->pos[tok];
    int64_t kvh = h / (c->n_heads / c->n_kv_heads);
    int64_t first = first_position(c, pos);
    const float *q = m->q + tok * m->q_dim + h * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int64_t base = layer * kv->cap * kv->kv_dim + kvh * hd;
    int64_t n_kvh = kv->kv_dim / hd, srow = layer * kv->cap * n_kvh + kvh; /* q8 scales */
    float *out = m->xb + tok * m->q_dim + h * hd;
    float max = -INFINITY;
    for (int64_t t = first; t <= pos; t++) {
        int64_t off = base + t * kv->kv_dim;
        float s;
        if (kv->dtype == CSD_DTYPE_F32) s = csd_dot_f32(q, (const float *)kv->k + off, hd);
        else s = dot_q8(q, (const int8_t *)kv->k + off, hd) * kv->k_scale[srow + t * n_kvh];
        s *= scale;
        att[t] = s;
        if (s > max) max = s;
    }
    float inv = csd_attn_softmax(att + first, pos + 1 - first, max);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t t = first; t <= pos; t++) {
        int64_t off = base + t * kv->kv_dim;
        float p = att[t] * inv;
        if (kv->dtype == CSD_DTYPE_F32) csd_axpy_f32(out, p, (const float *)kv->v + off, hd);
        else axpy_q8(out, p * kv->v_scale[srow + t * n_kvh], (const int8_t *)kv->v + off, hd);
    }
}

/* Query heads [h0, h1) of one token, all of one KV head's group. The default F16 cache goes
 * through one grouped kernel, which reads each K/V row once for several heads. att: scratch of
 * CSD_ATTN_TASK_HEADS * max_ctx floats. */
static void attend_heads(csd_model *m, csd_kv *kv, int64_t layer, int64_t tok, int64_t h0,
                         int64_t h1, float *att) {
    if (kv->dtype != CSD_DTYPE_F16) {
        for (int64_t h = h0; h < h1; h++) attend_one(m, kv, layer, tok, h, att);
        return;
    }
    const csd_model_config *c = &m->cfg;
    int64_t hd = c->head_dim, pos = m->pos[tok], first = first_position(c, pos);
    int64_t kvh = h0 / (c->n_heads / c->n_kv_heads);
    int64_t off = layer * kv->cap * kv->kv_dim + first * kv->kv_dim + kvh * hd;
    csd_attend_f16_group(m->xb + tok * m->q_dim + h0 * hd, m->q + tok * m->q_dim + h0 * hd, h1 - h0,
                         (const uint16_t *)kv->k + off, (const uint16_t *)kv->v + off, kv->kv_dim,
                         pos + 1 - first, hd, 1.0f / sqrtf((float)hd), att);
}

/* Tasks are (token, KV head, up to CSD_ATTN_TASK_HEADS of the query heads that share it), dealt
 * round-robin: under the causal mask later tokens cost more, so contiguous slices would leave
 * the first thread idle for most of a prompt. */
static void attention_worker(void *ctx, int ith, int nth) {
    attn_job *job = ctx;
    csd_model *m = job->m;
    int64_t group = m->cfg.n_heads / m->cfg.n_kv_heads;
    int64_t parts = (group + CSD_ATTN_TASK_HEADS - 1) / CSD_ATTN_TASK_HEADS; /* tasks per group */
    int64_t per_tok = m->cfg.n_kv_heads * parts;
    float *att = m->att + (int64_t)ith * CSD_ATTN_TASK_HEADS * m->max_ctx;
    for (int64_t task = ith; task < job->batch->n * per_tok; task += nth) {
        int64_t tok = task / per_tok, kvh = task % per_tok / parts, part = task % parts;
        int64_t h0 = kvh * group + part * CSD_ATTN_TASK_HEADS;
        int64_t h1 = h0 + CSD_ATTN_TASK_HEADS < (kvh + 1) * group ? h0 + CSD_ATTN_TASK_HEADS
                                                                 : (kvh + 1) * group;
        attend_heads(m, job->batch->kv[tok], job->layer, tok, h0, h1, att);
    }
}

/* Per token: (Qwen3) q/k head norms, RoPE on q and k, then k and v into the token's cache. */
typedef struct qk_job {
    const csd_batch *batch;
    int64_t layer;
} qk_job;

static void qk_tokens(csd_model *m, const void *arg, int64_t t0, int64_t t1) {
    const qk_job *job = arg;
    const csd_model_config *c = &m->cfg;
    const csd_layer_weights *lw = &m->w.layers[job->layer];
    int64_t hd = c->head_dim;
    for (int64_t t = t0; t < t1; t++) {
        float *q = m->q + t * m->q_dim, *k = m->k + t * m->kv_dim;
        if (lw->q_norm) { /* Qwen3: per-head RMSNorm on q and k before RoPE */
            for (int64_t h = 0; h < c->n_heads; h++) csd_rmsnorm(q + h * hd, q + h * hd, lw->q_norm, hd, c->norm_eps);
            for (int64_t h = 0; h < c->n_kv_heads; h++) csd_rmsnorm(k + h * hd, k + h * hd, lw->k_norm, hd, c->norm_eps);
        }
        const float *cos_t = m->rope_cos + t * (hd / 2), *sin_t = m->rope_sin + t * (hd / 2);
        rope_apply(q, c->n_heads, hd, cos_t, sin_t);
        rope_apply(k, c->n_kv_heads, hd, cos_t, sin_t);
        kv_store(job->batch->kv[t], job->layer, m->pos[t], k, m->v + t * m->kv_dim, hd);
    }
}

static void attention_block(csd_model *m, const csd_batch *b, int64_t li) {
    const csd_layer_weights *lw = &m->w.layers[li];
    int64_t n = b->n;
    for_tokens(m, n, norm_tokens, lw->attn_norm); /* input_layernorm */
    /* q_proj, k_proj, v_proj (+ biases for Qwen2) */
    const csd_qmat *qkv[3] = {&lw->wq, &lw->wk, &lw->wv};
    float *qkv_out[3] = {m->q, m->k, m->v};
    csd_matmul_multi(m->pool, qkv, 3, m->xb, n, qkv_out, m->mm_scratch);
    add_bias(m->q, lw->bq, n, m->q_dim);
    add_bias(m->k, lw->bk, n, m->kv_dim);
    add_bias(m->v, lw->bv, n, m->kv_dim);
    qk_job qk = {b, li};
    for_tokens(m, n, qk_tokens, &qk);
    attn_job job = {m, b, li};
    csd_pool_run(m->pool, attention_worker, &job);
    csd_matmul(m->pool, &lw->wo, m->xb, n, m->tmp, m->mm_scratch); /* o_proj */
    for_tokens(m, n, residual_tokens, NULL);
}

static void ffn_block(csd_model *m, int64_t n, int64_t li) {
    const csd_layer_weights *lw = &m->w.layers[li];
    for_tokens(m, n, norm_tokens, lw->ffn_norm); /* post_attention_layernorm */
    const csd_qmat *gate_up[2] = {&lw->gate, &lw->up};
    float *gate_up_out[2] = {m->hb, m->hb2};
    csd_matmul_multi(m->pool, gate_up, 2, m->xb, n, gate_up_out, m->mm_scratch); /* gate, up */
    for_tokens(m, n, silu_mul_tokens, NULL);
    csd_matmul(m->pool, &lw->down, m->hb, n, m->tmp, m->mm_scratch); /* down_proj */
    for_tokens(m, n, residual_tokens, NULL);
}

/* Assigns each token its position and checks capacities before anything is written. */
static int plan_positions(csd_model *m, const csd_batch *b, csd_err *err) {
    for (int64_t i = 0; i < b->n; i++) {
        csd_kv *kv = b->kv[i];
        if (!kv) return csd_err_set(err, CSD_EINVAL, "batch token %lld has no sequence", (long long)i);
        int64_t rank = 0;
        for (int64_t j = 0; j < i; j++) rank += b->kv[j] == kv;
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
    for (int64_t li = 0; li < n_layers; li++) {
        attention_block(m, b, li);
        ffn_block(m, b->n, li);
    }
    for (int64_t i = 0; i < b->n; i++) b->kv[i]->len = m->pos[i] + 1 > b->kv[i]->len ? m->pos[i] + 1 : b->kv[i]->len;
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
