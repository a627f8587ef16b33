/* attention_layer: one layer's attention for a batch, from the projected q, k, v (m->q, m->k,
 * m->v) to the heads' outputs (m->xb): (Qwen3) head norms, RoPE, the cache write, then
 * softmax(q K^T / sqrt(hd)) V over each token's own sequence (causal, sliding window).
 *
 * Work is dealt in units of (token, KV head): a unit runs every query head of its KV head's group,
 * so its K/V rows come from memory once and from cache for the next heads. When the batch's tokens
 * all belong to different sequences (decode: one token, or one per sequence), no token needs
 * another's new K/V row, and each unit also does its own heads' RoPE and cache write in the same
 * job: no serial step and no join between the projections and attention. */
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "model_internal.h"

/* Rows of K and V a decode unit prefetches before it starts: the cache was written a whole token
 * ago and the weights streamed since have pushed it out to DRAM, where row by row it is read at
 * latency instead of bandwidth (measured: the attention step of a 1.1B decode took 25-30% less).
 * Longer contexts go on with the kernels' own prefetch a few rows ahead. */
#define ATTN_PREFETCH_ROWS 256

/* Rotate-half RoPE on n_heads heads: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). */
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

/* One head's K or V row into a q8 cache: int8 with an f32 scale (absmax), half the memory of f16
 * for a small, measured quality cost (docs/kernels.md). */
static void quantize_head_q8(int8_t *q, float *scale, const float *x, int64_t hd) {
    float amax = 0.0f;
    for (int64_t i = 0; i < hd; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    for (int64_t i = 0; i < hd; i++) q[i] = (int8_t)lrintf(x[i] * inv);
    *scale = d;
}

/* KV head kvh's K and V rows (k, v: hd floats each) into the cache at pos: f32, f16 or q8. */
static void kv_store_head(csd_kv *kv, int64_t layer, int64_t pos, int64_t kvh, const float *k,
                          const float *v, int64_t hd) {
    int64_t off = csd_kv_row(kv, layer, kvh, pos);
    if (kv->dtype == CSD_DTYPE_F32) {
        memcpy((float *)kv->k + off, k, (size_t)hd * sizeof(float));
        memcpy((float *)kv->v + off, v, (size_t)hd * sizeof(float));
    } else if (kv->dtype == CSD_DTYPE_F16) {
        csd_f32_to_f16_vec((uint16_t *)kv->k + off, k, hd);
        csd_f32_to_f16_vec((uint16_t *)kv->v + off, v, hd);
    } else {
        int64_t slot = csd_kv_slot(kv, layer, kvh, pos);
        quantize_head_q8((int8_t *)kv->k + off, kv->k_scale + slot, k, hd);
        quantize_head_q8((int8_t *)kv->v + off, kv->v_scale + slot, v, hd);
    }
}

/* Token tok's query heads of KV head kvh, and that KV head: (Qwen3) per-head RMSNorm on q and k,
 * RoPE on both, then the K and V rows into the token's cache. */
static void qk_unit(csd_model *m, const csd_batch *b, int64_t layer, int64_t tok, int64_t kvh) {
    const csd_model_config *c = &m->cfg;
    const csd_layer_weights *lw = &m->w.layers[layer];
    int64_t hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    float *q = m->q + tok * m->q_dim + kvh * group * hd, *k = m->k + tok * m->kv_dim + kvh * hd;
    if (lw->q_norm) {
        for (int64_t h = 0; h < group; h++)
            csd_rmsnorm(q + h * hd, q + h * hd, lw->q_norm, hd, c->norm_eps);
        csd_rmsnorm(k, k, lw->k_norm, hd, c->norm_eps);
    }
    const float *cos_t = m->rope_cos + tok * (hd / 2), *sin_t = m->rope_sin + tok * (hd / 2);
    rope_apply(q, group, hd, cos_t, sin_t);
    rope_apply(k, 1, hd, cos_t, sin_t);
    kv_store_head(b->kv[tok], layer, m->pos[tok], kvh, k, m->v + tok * m->kv_dim + kvh * hd, hd);
}

/* The qk step of every token in [t0, t1) (arg: the batch), before any attention of a batch in
 * which one sequence has several tokens. */
typedef struct qk_job {
    const csd_batch *batch;
    int64_t layer;
} qk_job;

static void qk_tokens(csd_model *m, const void *arg, int64_t t0, int64_t t1) {
    const qk_job *job = arg;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t kvh = 0; kvh < m->cfg.n_kv_heads; kvh++)
            qk_unit(m, job->batch, job->layer, t, kvh);
}

/* The first position a token at pos attends to: 0, or the start of the sliding window. */
static int64_t first_position(const csd_model_config *c, int64_t pos) {
    return c->sliding_window > 0 && pos + 1 > c->sliding_window ? pos + 1 - c->sliding_window : 0;
}

static float dot_q8(const float *q, const int8_t *k, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += q[i] * (float)k[i];
    return acc;
}

static void axpy_q8(float *y, float a, const int8_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * (float)x[i];
}

/* One (token, head) over an F32 or Q8 cache: softmax(q . K^T / sqrt(hd)) V over the token's own
 * sequence up to its position (causal), from first_position. att: max_ctx floats of scratch. */
static void attend_one(csd_model *m, csd_kv *kv, int64_t layer, int64_t tok, int64_t h,
                       float *att) {
    const csd_model_config *c = &m->cfg;
    int64_t hd = c->head_dim, pos = m->pos[tok];
    int64_t kvh = h / (c->n_heads / c->n_kv_heads);
    int64_t first = first_position(c, pos);
    const float *q = m->q + tok * m->q_dim + h * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int64_t base = csd_kv_row(kv, layer, kvh, 0), sbase = csd_kv_slot(kv, layer, kvh, 0);
    float *out = m->xb + tok * m->q_dim + h * hd;
    float max = -INFINITY;
    for (int64_t t = first; t <= pos; t++) {
        int64_t off = base + t * hd;
        float s;
        if (kv->dtype == CSD_DTYPE_F32) s = csd_dot_f32(q, (const float *)kv->k + off, hd);
        else s = dot_q8(q, (const int8_t *)kv->k + off, hd) * kv->k_scale[sbase + t];
        s *= scale;
        att[t] = s;
        if (s > max) max = s;
    }
    float inv = csd_attn_softmax(att + first, pos + 1 - first, max);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t t = first; t <= pos; t++) {
        int64_t off = base + t * hd;
        float p = att[t] * inv;
        if (kv->dtype == CSD_DTYPE_F32) csd_axpy_f32(out, p, (const float *)kv->v + off, hd);
        else axpy_q8(out, p * kv->v_scale[sbase + t], (const int8_t *)kv->v + off, hd);
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
    int64_t off = csd_kv_row(kv, layer, kvh, first);
    csd_attend_f16_group(m->xb + tok * m->q_dim + h0 * hd, m->q + tok * m->q_dim + h0 * hd, h1 - h0,
                         (const uint16_t *)kv->k + off, (const uint16_t *)kv->v + off, hd,
                         pos + 1 - first, hd, 1.0f / sqrtf((float)hd), att);
}

/* Starts loading the first ATTN_PREFETCH_ROWS K and V rows token tok will read for KV head kvh
 * (contiguous: the cache is head-major). */
static void prefetch_unit_rows(const csd_model *m, const csd_kv *kv, int64_t layer, int64_t tok,
                               int64_t kvh) {
    int64_t pos = m->pos[tok], first = first_position(&m->cfg, pos);
    int64_t last = pos - first > ATTN_PREFETCH_ROWS ? first + ATTN_PREFETCH_ROWS : pos;
    size_t elem = csd_kv_elem_bytes(kv->dtype),
           off = (size_t)csd_kv_row(kv, layer, kvh, first) * elem;
    size_t bytes = (size_t)((last - first) * kv->head_dim) * elem;
    const char *k = (const char *)kv->k + off, *v = (const char *)kv->v + off;
    for (size_t b = 0; b < bytes; b += 64) {
        __builtin_prefetch(k + b, 0, 3);
        __builtin_prefetch(v + b, 0, 3);
    }
}

typedef struct attn_job {
    csd_model *m;
    const csd_batch *batch;
    int64_t layer;  /* index within the stage */
    bool with_qk;   /* each unit does its own qk_unit first (tokens of different sequences) */
    bool whole_units; /* a unit's heads stay on one thread; else (fewer units than threads) each
                       * CSD_ATTN_TASK_HEADS heads of a unit are dealt on their own */
} attn_job;

/* Query heads [p0, p1) parts of CSD_ATTN_TASK_HEADS of token tok's KV head kvh. */
static void attend_parts(csd_model *m, csd_kv *kv, int64_t layer, int64_t tok, int64_t kvh,
                         int64_t p0, int64_t p1, float *att) {
    int64_t group = m->cfg.n_heads / m->cfg.n_kv_heads;
    for (int64_t p = p0; p < p1; p++) {
        int64_t h0 = kvh * group + p * CSD_ATTN_TASK_HEADS;
        int64_t h1 = h0 + CSD_ATTN_TASK_HEADS < (kvh + 1) * group ? h0 + CSD_ATTN_TASK_HEADS
                                                                  : (kvh + 1) * group;
        attend_heads(m, kv, layer, tok, h0, h1, att);
    }
}

/* Items (units, or parts of units) are dealt round-robin: under the causal mask later tokens cost
 * more, so contiguous slices would leave the first thread idle for most of a prompt. */
static void attention_worker(void *ctx, int ith, int nth) {
    const attn_job *job = ctx;
    csd_model *m = job->m;
    int64_t n_kvh = m->cfg.n_kv_heads, group = m->cfg.n_heads / n_kvh;
    int64_t parts = (group + CSD_ATTN_TASK_HEADS - 1) / CSD_ATTN_TASK_HEADS; /* per unit */
    int64_t units = job->batch->n * n_kvh, items = job->whole_units ? units : units * parts;
    float *att = m->att + (int64_t)ith * CSD_ATTN_TASK_HEADS * m->max_ctx;
    for (int64_t it = ith; it < items; it += nth) {
        int64_t u = job->whole_units ? it : it / parts;
        int64_t p0 = job->whole_units ? 0 : it % parts, p1 = job->whole_units ? parts : p0 + 1;
        int64_t tok = u / n_kvh, kvh = u % n_kvh;
        csd_kv *kv = job->batch->kv[tok];
        if (job->with_qk) {
            prefetch_unit_rows(m, kv, job->layer, tok, kvh);
            qk_unit(m, job->batch, job->layer, tok, kvh);
        }
        attend_parts(m, kv, job->layer, tok, kvh, p0, p1, att);
    }
}

void csd_attention_layer(csd_model *m, const csd_batch *b, int64_t layer) {
    int nth = csd_pool_size(m->pool);
    bool whole_units = b->n * m->cfg.n_kv_heads >= nth;
    attn_job job = {m, b, layer, m->batch_distinct && whole_units, whole_units};
    if (!job.with_qk) {
        qk_job qk = {b, layer};
        csd_model_for_tokens(m, b->n, qk_tokens, &qk);
    }
    csd_pool_run(m->pool, attention_worker, &job);
}

void csd_attention_prefetch_units(const csd_model *m, const csd_batch *b, int64_t layer,
                                  int64_t kvh0, int64_t kvh1) {
    for (int64_t kvh = kvh0; kvh < kvh1; kvh++) prefetch_unit_rows(m, b->kv[0], layer, 0, kvh);
}

void csd_attention_units(csd_model *m, const csd_batch *b, int64_t layer, int64_t kvh0,
                         int64_t kvh1, int ith) {
    int64_t group = m->cfg.n_heads / m->cfg.n_kv_heads;
    int64_t parts = (group + CSD_ATTN_TASK_HEADS - 1) / CSD_ATTN_TASK_HEADS;
    float *att = m->att + (int64_t)ith * CSD_ATTN_TASK_HEADS * m->max_ctx;
    for (int64_t kvh = kvh0; kvh < kvh1; kvh++) { /* rows: csd_attention_prefetch_units */
        qk_unit(m, b, layer, 0, kvh);
        attend_parts(m, b->kv[0], layer, 0, kvh, 0, parts, att);
    }
}
