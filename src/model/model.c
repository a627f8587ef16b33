/* model: creation, scratch sizing and accessors of csd_model (loading from files is in
 * load_hf.c). */
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "decode_step.h"
#include "model_internal.h"
#include "shard_model.h"

void csd_model_opts_default(csd_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->precision = -1;
    o->kv_dtype = -1;
    o->layer_begin = -1;
    o->layer_end = -1;
}

static float *scratch_floats(int64_t n, int *failed) {
    float *p = csd_alloc_array((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) *failed = 1;
    return p;
}

int csd_model_init_runtime(csd_model *m, const csd_model_opts *opts, csd_err *err) {
    const csd_model_config *c = &m->cfg;
    m->q_dim = c->n_heads * c->head_dim;
    m->kv_dim = c->n_kv_heads * c->head_dim;
    m->max_batch = opts->max_batch > 0 ? opts->max_batch : CSD_MODEL_DEFAULT_MAX_BATCH;
    m->max_ctx = opts->max_ctx > 0 ? opts->max_ctx
                 : c->max_seq_len < CSD_MODEL_DEFAULT_MAX_CTX ? c->max_seq_len
                                                              : CSD_MODEL_DEFAULT_MAX_CTX;
    if (m->max_ctx > CSD_MAX_CONTEXT)
        return csd_err_set(err, CSD_ERANGE, "context %lld exceeds %d", (long long)m->max_ctx,
                           CSD_MAX_CONTEXT);
    if (m->kv_dtype != CSD_DTYPE_F32 && m->kv_dtype != CSD_DTYPE_F16 && m->kv_dtype != CSD_DTYPE_Q8)
        return csd_err_set(err, CSD_EINVAL, "KV cache type must be f32, f16 or q8, not %s",
                           csd_dtype_name(m->kv_dtype));
    int rc = csd_pool_create(&m->pool, opts->n_threads, err);
    if (rc) return rc;
    int64_t b = m->max_batch, wide = c->dim > m->q_dim ? c->dim : m->q_dim;
    int failed = 0;
    m->x = scratch_floats(b * c->dim, &failed);
    m->xb = scratch_floats(b * wide, &failed);
    m->tmp = scratch_floats(b * c->dim, &failed);
    m->q = scratch_floats(b * m->q_dim, &failed);
    m->k = scratch_floats(b * m->kv_dim, &failed);
    m->v = scratch_floats(b * m->kv_dim, &failed);
    m->hb = scratch_floats(b * c->hidden_dim, &failed);
    m->hb2 = scratch_floats(b * c->hidden_dim, &failed);
    m->att =
        scratch_floats((int64_t)csd_pool_size(m->pool) * CSD_ATTN_TASK_HEADS * m->max_ctx, &failed);
    m->rope_cos = scratch_floats(b * (c->head_dim / 2), &failed);
    m->rope_sin = scratch_floats(b * (c->head_dim / 2), &failed);
    m->inv_freq = scratch_floats(c->head_dim / 2, &failed);
    m->pos = csd_alloc_array((size_t)b, sizeof(int64_t));
    int64_t widest = c->hidden_dim > wide ? c->hidden_dim : wide;
    m->mm_scratch = csd_alloc(csd_matmul_scratch_bytes(widest, b));
    if (failed || !m->pos || !m->mm_scratch)
        return csd_err_set(err, CSD_ENOMEM, "model scratch for %lld tokens", (long long)b);
    csd_rope_init_freqs(c, m->inv_freq);
    if (opts->decode_path == CSD_DECODE_GENERAL) return 0;
    return csd_decode_step_create(m, opts->decode_path == CSD_DECODE_ONE_JOB, err);
}

int csd_model_create(csd_model **out, const csd_model_config *cfg, const csd_weights *weights,
                     const csd_model_opts *opts, csd_err *err) {
    *out = NULL;
    csd_model *m = csd_alloc(sizeof *m);
    if (!m) return csd_err_set(err, CSD_ENOMEM, "model");
    m->cfg = *cfg;
    m->w = *weights;
    m->precision = weights->layers && weights->layer_end > weights->layer_begin
                       ? weights->layers[0].wq.dtype
                       : CSD_DTYPE_F32;
    m->kv_dtype = opts->kv_dtype >= 0 ? opts->kv_dtype
                  : m->precision == CSD_DTYPE_F32 ? CSD_DTYPE_F32 : CSD_DTYPE_F16;
    int rc = csd_model_init_runtime(m, opts, err);
    if (rc) {
        m->w.layers = NULL; /* borrowed: not ours to free */
        csd_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void csd_model_destroy(csd_model *m) {
    if (!m) return;
    csd_pool_destroy(m->pool);
    csd_decode_step_destroy(m->decode);
    for (int i = 0; i < m->n_owned; i++) csd_free(m->owned[i]);
    csd_free(m->owned);
    float *bufs[] = {m->x, m->xb, m->tmp, m->q, m->k, m->v, m->hb, m->hb2, m->att,
                     m->rope_cos, m->rope_sin, m->inv_freq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) csd_free(bufs[i]);
    csd_free(m->pos);
    csd_free(m->mm_scratch);
    csd_model_shard_close(m->shard);
    csd_free(m);
}

const csd_model_config *csd_model_cfg(const csd_model *m) { return &m->cfg; }
const csd_weights *csd_model_weights(const csd_model *m) { return &m->w; }
int csd_model_precision(const csd_model *m) { return m->precision; }
int csd_model_kv_dtype(const csd_model *m) { return m->kv_dtype; }
int64_t csd_model_max_batch(const csd_model *m) { return m->max_batch; }
int64_t csd_model_max_ctx(const csd_model *m) { return m->max_ctx; }
csd_pool *csd_model_pool(csd_model *m) { return m->pool; }

size_t csd_model_weight_bytes(const csd_model *m) {
    const csd_model_config *c = &m->cfg;
    size_t total = 0;
    if (m->w.has_embed) total += m->w.embed.nbytes;
    if (m->w.has_head) {
        total += (size_t)c->dim * sizeof(float);
        if (!(m->w.has_embed && m->w.head.data == m->w.embed.data)) total += m->w.head.nbytes;
    }
    for (int64_t l = 0; l < m->w.layer_end - m->w.layer_begin; l++) {
        const csd_layer_weights *lw = &m->w.layers[l];
        total += lw->wq.nbytes + lw->wk.nbytes + lw->wv.nbytes + lw->wo.nbytes + lw->gate.nbytes +
                 lw->up.nbytes + lw->down.nbytes + 2 * (size_t)c->dim * sizeof(float);
    }
    return total;
}

size_t csd_model_kv_bytes_per_token(const csd_model *m) {
    size_t per_layer = csd_kv_row_bytes(m->kv_dtype, m->cfg.n_kv_heads, m->cfg.head_dim);
    return 2 * (size_t)(m->w.layer_end - m->w.layer_begin) * per_layer;
}
