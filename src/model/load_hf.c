/* load_hf: builds a stage's weights from a Hugging Face directory (config.json + safetensors).
 * Every tensor is checked against the shape the config implies; missing tensors and tensors the
 * architecture does not know are named in the error. Matrices are converted to the requested
 * precision (quantized at load, deterministically); norms and biases stay f32. Under int4 the
 * embeddings and output head stay at 8 bits, as NNCF does. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/log.h"
#include "format/safetensors.h"
#include "model_internal.h"

#define NAME_MAX_LEN 160

typedef struct loader {
    csd_model *m;
    const csd_st_set *st;
    float *f32;        /* conversion buffer, sized for the largest tensor */
    size_t f32_cap;    /* floats */
} loader;

static void *own(csd_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **grown = csd_alloc_array((size_t)cap, sizeof(void *));
        if (!grown) return NULL;
        if (m->owned) memcpy(grown, m->owned, (size_t)m->n_owned * sizeof(void *));
        csd_free(m->owned);
        m->owned = grown;
        m->cap_owned = cap;
    }
    void *p = csd_alloc(bytes);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

/* Finds name and checks it has exactly the shape (rows, cols) (cols == 0: a vector of rows). */
static int find_tensor(loader *ld, const char *name, int64_t rows, int64_t cols,
                       const csd_st_tensor **out, csd_err *err) {
    const csd_st_tensor *t = csd_st_find(ld->st, name);
    if (!t) return csd_err_set(err, CSD_EFORMAT, "missing tensor '%s'", name);
    bool ok = cols == 0 ? (t->n_dims == 1 && t->shape[0] == rows)
                        : (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols);
    if (!ok)
        return csd_err_set(
            err, CSD_EFORMAT,
            "tensor '%s' has shape [%lld, %lld] (%d dims), config implies [%lld, %lld]", name,
            (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0), t->n_dims,
            (long long)rows, (long long)cols);
    *out = t;
    return 0;
}

/* t's n values as f32 into dst. A NaN or infinity is refused, naming the tensor: quantizing one
 * is undefined (its scale is not a number), and at any precision it would make every logit NaN. */
static int to_f32(const csd_st_tensor *t, const char *name, float *dst, int64_t n, csd_err *err) {
    if (t->dtype == CSD_DTYPE_F32) {
        memcpy(dst, t->data, (size_t)n * sizeof(float));
    } else {
        const uint8_t *src = t->data; /* possibly unaligned: read element by element */
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = t->dtype == CSD_DTYPE_F16 ? csd_f16_to_f32(h) : csd_bf16_to_f32(h);
        }
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return csd_err_set(err, CSD_EFORMAT, "tensor '%s' holds %s at element %lld", name,
                               isnan(dst[i]) ? "NaN" : "an infinity", (long long)i);
    return 0;
}

static int load_vector(loader *ld, const char *name, int64_t n, const float **out, csd_err *err) {
    const csd_st_tensor *t;
    int rc = find_tensor(ld, name, n, 0, &t, err);
    if (rc) return rc;
    float *dst = own(ld->m, (size_t)n * sizeof(float));
    if (!dst) return csd_err_set(err, CSD_ENOMEM, "tensor '%s'", name);
    rc = to_f32(t, name, dst, n, err);
    if (rc) return rc;
    *out = dst;
    return 0;
}

static int load_matrix(loader *ld, const char *name, int64_t rows, int64_t cols, int dtype,
                       csd_qmat *out, csd_err *err) {
    const csd_st_tensor *t;
    int rc = find_tensor(ld, name, rows, cols, &t, err);
    if (rc) return rc;
    size_t n = (size_t)(rows * cols);
    if (n > ld->f32_cap) {
        csd_free(ld->f32);
        ld->f32 = csd_alloc_array(n, sizeof(float));
        ld->f32_cap = ld->f32 ? n : 0;
        if (!ld->f32) return csd_err_set(err, CSD_ENOMEM, "conversion buffer for '%s'", name);
    }
    rc = to_f32(t, name, ld->f32, (int64_t)n, err);
    if (rc) return rc;
    size_t bytes = csd_qmat_bytes(dtype, rows, cols);
    void *dst = own(ld->m, bytes);
    if (!dst) return csd_err_set(err, CSD_ENOMEM, "tensor '%s' (%zu bytes)", name, bytes);
    rc = csd_qmat_quantize(dtype, ld->f32, rows, cols, dst, err);
    if (rc) return csd_err_prefix(err, "tensor '%s': ", name);
    *out = (csd_qmat){dtype, rows, cols, dst, bytes};
    return 0;
}

static int load_layer(loader *ld, int layer, csd_layer_weights *lw, csd_err *err) {
    const csd_model_config *c = &ld->m->cfg;
    int64_t dim = c->dim, q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    int p = ld->m->precision;
    char name[NAME_MAX_LEN];
#define LAYER_NAME(pattern) (snprintf(name, sizeof name, pattern, layer), name)
    int rc = 0;
    if (!rc) rc = load_vector(ld, LAYER_NAME(CSD_TN_ATTN_NORM), dim, &lw->attn_norm, err);
    if (!rc) rc = load_vector(ld, LAYER_NAME(CSD_TN_FFN_NORM), dim, &lw->ffn_norm, err);
    if (!rc) rc = load_matrix(ld, LAYER_NAME(CSD_TN_WQ), q_dim, dim, p, &lw->wq, err);
    if (!rc) rc = load_matrix(ld, LAYER_NAME(CSD_TN_WK), kv_dim, dim, p, &lw->wk, err);
    if (!rc) rc = load_matrix(ld, LAYER_NAME(CSD_TN_WV), kv_dim, dim, p, &lw->wv, err);
    if (!rc) rc = load_matrix(ld, LAYER_NAME(CSD_TN_WO), dim, q_dim, p, &lw->wo, err);
    if (!rc) rc = load_matrix(ld, LAYER_NAME(CSD_TN_GATE), c->hidden_dim, dim, p, &lw->gate, err);
    if (!rc) rc = load_matrix(ld, LAYER_NAME(CSD_TN_UP), c->hidden_dim, dim, p, &lw->up, err);
    if (!rc) rc = load_matrix(ld, LAYER_NAME(CSD_TN_DOWN), dim, c->hidden_dim, p, &lw->down, err);
    if (!rc && c->qkv_bias) {
        rc = load_vector(ld, LAYER_NAME(CSD_TN_BQ), q_dim, &lw->bq, err);
        if (!rc) rc = load_vector(ld, LAYER_NAME(CSD_TN_BK), kv_dim, &lw->bk, err);
        if (!rc) rc = load_vector(ld, LAYER_NAME(CSD_TN_BV), kv_dim, &lw->bv, err);
    }
    if (!rc && c->o_bias) rc = load_vector(ld, LAYER_NAME(CSD_TN_BO), dim, &lw->bo, err);
    if (!rc && c->qk_norm) {
        rc = load_vector(ld, LAYER_NAME(CSD_TN_Q_NORM), c->head_dim, &lw->q_norm, err);
        if (!rc) rc = load_vector(ld, LAYER_NAME(CSD_TN_K_NORM), c->head_dim, &lw->k_norm, err);
    }
#undef LAYER_NAME
    return rc;
}

/* The part of name after "model.layers.L." when L is a layer index below n_layers, else NULL.
 * The digits are counted by hand: sscanf's %d is undefined for a number out of int's range, and
 * tensor names come from the file. */
static const char *layer_suffix(const char *name, int64_t n_layers) {
    static const char prefix[] = "model.layers.";
    if (strncmp(name, prefix, sizeof prefix - 1)) return NULL;
    const char *p = name + sizeof prefix - 1;
    int64_t layer = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        layer = layer * 10 + (*p - '0');
        if (layer >= n_layers) return NULL; /* also keeps the product from overflowing */
    }
    bool canonical = digits == 1 || (digits > 1 && name[sizeof prefix - 1] != '0');
    return canonical && *p == '.' ? p + 1 : NULL; /* "01" is not a name the loader reads */
}

/* True when name is a tensor this architecture defines (for any layer of the model). */
static bool known_tensor(const csd_model_config *c, const char *name) {
    if (!strcmp(name, CSD_TN_EMBED) || !strcmp(name, CSD_TN_FINAL_NORM) ||
        !strcmp(name, CSD_TN_LM_HEAD))
        return true;
    const char *rest = layer_suffix(name, c->n_layers);
    if (!rest) return false;
    static const char *const always[] = {
        "input_layernorm.weight",  "post_attention_layernorm.weight",
        "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",
        "mlp.down_proj.weight",    "self_attn.rotary_emb.inv_freq"};
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++)
        if (!strcmp(rest, always[i])) return true;
    if (c->qkv_bias &&
        (!strcmp(rest, "self_attn.q_proj.bias") || !strcmp(rest, "self_attn.k_proj.bias") ||
         !strcmp(rest, "self_attn.v_proj.bias")))
        return true;
    if (c->o_bias && !strcmp(rest, "self_attn.o_proj.bias")) return true;
    return c->qk_norm &&
           (!strcmp(rest, "self_attn.q_norm.weight") || !strcmp(rest, "self_attn.k_norm.weight"));
}

static int check_no_extra(const csd_model_config *c, const csd_st_set *st, csd_err *err) {
    for (int i = 0; i < csd_st_count(st); i++) {
        const char *name = csd_st_at(st, i)->name;
        if (!known_tensor(c, name))
            return csd_err_set(err, CSD_EFORMAT,
                               "unexpected tensor '%s' for a %s model with %lld layers", name,
                               c->model_type, (long long)c->n_layers);
    }
    return 0;
}

static int resolve_precision(const csd_model_opts *opts, const csd_model_config *c, csd_err *err) {
    int p = opts->precision >= 0 ? opts->precision : c->torch_dtype;
    if (p < 0 || p >= CSD_DTYPE_COUNT)
        return csd_err_set(err, CSD_EINVAL, "unknown precision %d", p);
    return p;
}

static int load_weights(loader *ld, const csd_model_opts *opts, csd_err *err) {
    csd_model *m = ld->m;
    const csd_model_config *c = &m->cfg;
    csd_weights *w = &m->w;
    w->layer_begin = opts->layer_begin >= 0 ? opts->layer_begin : 0;
    w->layer_end = opts->layer_end >= 0 ? opts->layer_end : c->n_layers;
    if (w->layer_begin >= w->layer_end || w->layer_end > c->n_layers)
        return csd_err_set(
            err, CSD_ERANGE, "layer range [%lld, %lld) outside the model's %lld layers",
            (long long)w->layer_begin, (long long)w->layer_end, (long long)c->n_layers);
    w->has_embed = w->layer_begin == 0;
    w->has_head = w->layer_end == c->n_layers;
    /* Embeddings and head: 8 bits under int4 (NNCF keeps them at 8 bits too). */
    int outer = m->precision == CSD_DTYPE_Q4 ? CSD_DTYPE_Q8 : m->precision;
    int rc = 0;
    if (w->has_embed)
        rc = load_matrix(ld, CSD_TN_EMBED, c->vocab_size, c->dim, outer, &w->embed, err);
    if (!rc && w->has_head) {
        rc = load_vector(ld, CSD_TN_FINAL_NORM, c->dim, &w->final_norm, err);
        if (!rc && c->tie_embeddings && csd_st_find(ld->st, CSD_TN_LM_HEAD))
            CSD_LOGI("tie_word_embeddings is true: the output head is the embedding and the "
                     "file's '%s' is not used (as transformers does)", CSD_TN_LM_HEAD);
        if (!rc && c->tie_embeddings && w->has_embed) w->head = w->embed;
        else if (!rc)
            rc = load_matrix(ld, c->tie_embeddings ? CSD_TN_EMBED : CSD_TN_LM_HEAD, c->vocab_size,
                             c->dim, outer, &w->head, err);
    }
    if (rc) return rc;
    int64_t n = w->layer_end - w->layer_begin;
    csd_layer_weights *layers = own(m, (size_t)n * sizeof *layers);
    if (!layers) return csd_err_set(err, CSD_ENOMEM, "layer table");
    w->layers = layers;
    for (int64_t l = 0; l < n && !rc; l++)
        rc = load_layer(ld, (int)(w->layer_begin + l), &layers[l], err);
    return rc;
}

int csd_model_load_hf(csd_model **out, const char *dir, const csd_model_opts *opts, csd_err *err) {
    *out = NULL;
    csd_model *m = csd_alloc(sizeof *m);
    if (!m) return csd_err_set(err, CSD_ENOMEM, "model");
    csd_st_set *st = NULL;
    loader ld = {m, NULL, NULL, 0};
    int rc = csd_model_config_load(&m->cfg, dir, err);
    if (!rc) rc = csd_st_open_dir(&st, dir, err);
    ld.st = st;
    if (!rc) rc = check_no_extra(&m->cfg, st, err);
    if (!rc) {
        rc = resolve_precision(opts, &m->cfg, err);
        if (rc >= 0) {
            m->precision = rc;
            rc = 0;
        }
    }
    if (!rc) {
        m->kv_dtype = opts->kv_dtype >= 0 ? opts->kv_dtype
                      : m->precision == CSD_DTYPE_F32 ? CSD_DTYPE_F32 : CSD_DTYPE_F16;
        rc = load_weights(&ld, opts, err);
    }
    csd_free(ld.f32);
    csd_st_close(st);
    if (!rc) rc = csd_model_init_runtime(m, opts, err);
    if (rc) {
        csd_err_prefix(err, "%s: ", dir);
        csd_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}
