/* kv_cache: one sequence's keys and values for the layers of a stage. Allocated once at the
 * capacity asked for; truncate and prefix copy make speculative decoding and prefix reuse cheap. */
#include <stdbool.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "model_internal.h"

size_t csd_kv_elem_bytes(int dtype) {
    return dtype == CSD_DTYPE_F32 ? 4 : dtype == CSD_DTYPE_F16 ? 2 : 1;
}

int csd_kv_create(csd_kv **out, const csd_model *m, int64_t max_ctx, csd_err *err) {
    *out = NULL;
    if (max_ctx <= 0) max_ctx = m->max_ctx;
    if (max_ctx > m->max_ctx)
        return csd_err_set(err, CSD_ERANGE, "context %lld exceeds the model's %lld",
                           (long long)max_ctx, (long long)m->max_ctx);
    csd_kv *kv = csd_alloc(sizeof *kv);
    if (!kv) return csd_err_set(err, CSD_ENOMEM, "kv cache");
    kv->dtype = m->kv_dtype;
    kv->n_layers = m->w.layer_end - m->w.layer_begin;
    kv->n_kv_heads = m->cfg.n_kv_heads;
    kv->head_dim = m->cfg.head_dim;
    kv->cap = max_ctx;
    size_t elem = csd_kv_elem_bytes(kv->dtype);
    size_t n = (size_t)(kv->n_layers * kv->n_kv_heads * kv->cap * kv->head_dim);
    kv->k = csd_alloc_array(n ? n : 1, elem);
    kv->v = csd_alloc_array(n ? n : 1, elem);
    bool scales_ok = true;
    if (kv->dtype == CSD_DTYPE_Q8) {
        size_t ns = (size_t)(kv->n_layers * kv->n_kv_heads * kv->cap);
        kv->k_scale = csd_alloc_array(ns ? ns : 1, sizeof(float));
        kv->v_scale = csd_alloc_array(ns ? ns : 1, sizeof(float));
        scales_ok = kv->k_scale && kv->v_scale;
    }
    if (!kv->k || !kv->v || !scales_ok) {
        csd_kv_destroy(kv);
        return csd_err_set(err, CSD_ENOMEM, "kv cache of %zu bytes", 2 * n * elem);
    }
    *out = kv;
    return 0;
}

void csd_kv_destroy(csd_kv *kv) {
    if (!kv) return;
    csd_free(kv->k);
    csd_free(kv->v);
    csd_free(kv->k_scale);
    csd_free(kv->v_scale);
    csd_free(kv);
}

int64_t csd_kv_len(const csd_kv *kv) { return kv->len; }
int64_t csd_kv_capacity(const csd_kv *kv) { return kv->cap; }

size_t csd_kv_row_bytes(int dtype, int64_t n_kv_heads, int64_t head_dim) {
    size_t row = (size_t)(n_kv_heads * head_dim) * csd_kv_elem_bytes(dtype);
    if (dtype == CSD_DTYPE_Q8) row += (size_t)n_kv_heads * sizeof(float);
    return row;
}

size_t csd_kv_position_bytes(const csd_kv *kv) {
    return (size_t)kv->n_layers * 2 * csd_kv_row_bytes(kv->dtype, kv->n_kv_heads, kv->head_dim);
}

int csd_kv_truncate(csd_kv *kv, int64_t pos) {
    if (pos < 0 || pos > kv->len) return CSD_ERANGE;
    kv->len = pos;
    return 0;
}

int csd_kv_copy_prefix(csd_kv *dst, const csd_kv *src, int64_t n, csd_err *err) {
    if (dst->dtype != src->dtype || dst->n_layers != src->n_layers ||
        dst->n_kv_heads != src->n_kv_heads || dst->head_dim != src->head_dim)
        return csd_err_set(err, CSD_EMISMATCH, "kv caches of different shapes");
    if (n < 0 || n > src->len || n > dst->cap)
        return csd_err_set(err, CSD_ERANGE, "prefix of %lld positions does not fit", (long long)n);
    if (dst == src) return csd_kv_truncate(dst, n); /* its own prefix: memcpy may not overlap */
    size_t elem = csd_kv_elem_bytes(src->dtype), bytes = (size_t)(n * src->head_dim) * elem;
    for (int64_t l = 0; l < src->n_layers; l++)
        for (int64_t h = 0; h < src->n_kv_heads; h++) { /* each head's first n positions */
            size_t so = (size_t)csd_kv_row(src, l, h, 0) * elem,
                   d_o = (size_t)csd_kv_row(dst, l, h, 0) * elem;
            memcpy((uint8_t *)dst->k + d_o, (const uint8_t *)src->k + so, bytes);
            memcpy((uint8_t *)dst->v + d_o, (const uint8_t *)src->v + so, bytes);
            if (src->dtype == CSD_DTYPE_Q8) {
                int64_t ss = csd_kv_slot(src, l, h, 0), ds = csd_kv_slot(dst, l, h, 0);
                memcpy(dst->k_scale + ds, src->k_scale + ss, (size_t)n * sizeof(float));
                memcpy(dst->v_scale + ds, src->v_scale + ss, (size_t)n * sizeof(float));
            }
        }
    dst->len = n;
    return 0;
}
