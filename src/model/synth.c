/* synth: deterministic random-weight models (see synth.h). Every tensor draws from its own stream
 * seeded by (seed, tensor name), so a tensor's values never depend on which others exist. */
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "format/safetensors.h"

#define TINY(ARCH_) {.arch = (ARCH_), .dim = 64, .hidden_dim = 176, .n_layers = 4, .n_heads = 4, \
    .n_kv_heads = 2, .head_dim = 16, .max_seq_len = 512, .norm_eps = 1e-5f, .rope_theta = 10000.0f}

const csd_synth_preset csd_synth_presets[] = {
    {"tiny", -1, "a few-MB model of any family, for tests", TINY(CSD_ARCH_LLAMA), CSD_DTYPE_F32},
    {"tinyllama-1.1b", CSD_ARCH_LLAMA, "TinyLlama-1.1B",
     {.dim = 2048, .hidden_dim = 5632, .n_layers = 22, .n_heads = 32, .n_kv_heads = 4,
      .head_dim = 64, .vocab_size = 32000, .max_seq_len = 2048, .norm_eps = 1e-5f,
      .rope_theta = 10000.0f},
     CSD_DTYPE_BF16},
    {"llama-3.2-1b", CSD_ARCH_LLAMA, "Llama-3.2-1B",
     {.dim = 2048, .hidden_dim = 8192, .n_layers = 16, .n_heads = 32, .n_kv_heads = 8,
      .head_dim = 64, .vocab_size = 128256, .max_seq_len = 131072, .norm_eps = 1e-5f,
      .rope_theta = 500000.0f, .rope_scaling = CSD_ROPE_SCALING_LLAMA3, .rope_factor = 32.0f,
      .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f, .rope_orig_max_pos = 8192,
      .tie_embeddings = true},
     CSD_DTYPE_BF16},
    {"llama-3.1-8b", CSD_ARCH_LLAMA, "Llama-3.1-8B",
     {.dim = 4096, .hidden_dim = 14336, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8,
      .head_dim = 128, .vocab_size = 128256, .max_seq_len = 131072, .norm_eps = 1e-5f,
      .rope_theta = 500000.0f, .rope_scaling = CSD_ROPE_SCALING_LLAMA3, .rope_factor = 8.0f,
      .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f, .rope_orig_max_pos = 8192},
     CSD_DTYPE_BF16},
    {"mistral-7b", CSD_ARCH_MISTRAL, "Mistral-7B-v0.1",
     {.dim = 4096, .hidden_dim = 14336, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8,
      .head_dim = 128, .vocab_size = 32000, .max_seq_len = 32768, .norm_eps = 1e-5f,
      .rope_theta = 10000.0f, .sliding_window = 4096},
     CSD_DTYPE_BF16},
    {"qwen2.5-0.5b", CSD_ARCH_QWEN2, "Qwen2.5-0.5B",
     {.dim = 896, .hidden_dim = 4864, .n_layers = 24, .n_heads = 14, .n_kv_heads = 2,
      .head_dim = 64, .vocab_size = 151936, .max_seq_len = 32768, .norm_eps = 1e-6f,
      .rope_theta = 1000000.0f, .tie_embeddings = true},
     CSD_DTYPE_BF16},
    {"qwen3-0.6b", CSD_ARCH_QWEN3, "Qwen3-0.6B",
     {.dim = 1024, .hidden_dim = 3072, .n_layers = 28, .n_heads = 16, .n_kv_heads = 8,
      .head_dim = 128, .vocab_size = 151936, .max_seq_len = 40960, .norm_eps = 1e-6f,
      .rope_theta = 1000000.0f, .tie_embeddings = true},
     CSD_DTYPE_BF16},
    {NULL, 0, NULL, {0}, 0},
};

const csd_synth_preset *csd_synth_preset_find(const char *name) {
    for (const csd_synth_preset *p = csd_synth_presets; p->name; p++)
        if (!strcmp(p->name, name)) return p;
    return NULL;
}

/* The tiny preset turns on what makes each family different at a size tests can afford, so the
 * reference comparisons exercise it: Llama 3.1 RoPE scaling with a short original context, a
 * Mistral window shorter than a test prompt, Qwen3's head_dim that differs from dim / heads. */
static void tiny_variant(csd_model_config *cfg, int arch) {
    if (arch == CSD_ARCH_LLAMA) {
        cfg->rope_scaling = CSD_ROPE_SCALING_LLAMA3;
        cfg->rope_factor = 8.0f;
        cfg->rope_low_freq_factor = 1.0f;
        cfg->rope_high_freq_factor = 4.0f;
        cfg->rope_orig_max_pos = 64;
        cfg->rope_theta = 500000.0f;
    } else if (arch == CSD_ARCH_MISTRAL) {
        cfg->sliding_window = 32;
    } else {
        cfg->tie_embeddings = true;
        cfg->norm_eps = 1e-6f;
        cfg->rope_theta = 1000000.0f;
        if (arch == CSD_ARCH_QWEN3) cfg->head_dim = 32;
    }
}

int csd_synth_config(csd_model_config *cfg, const csd_synth_preset *preset, int arch,
                     int64_t tokenizer_vocab, int bos_id, int eos_id, csd_err *err) {
    if (preset->arch >= 0 && preset->arch != arch)
        return csd_err_set(err, CSD_EINVAL, "preset %s is a %s model, not %s", preset->name,
                           csd_arch_get(preset->arch)->model_type, csd_arch_get(arch)->model_type);
    *cfg = preset->cfg;
    const csd_arch_desc *a = csd_arch_get(arch);
    cfg->arch = arch;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", a->model_type);
    cfg->qkv_bias = a->qkv_bias;
    cfg->qk_norm = a->qk_norm;
    if (preset->arch < 0) tiny_variant(cfg, arch);
    if (cfg->vocab_size == 0) cfg->vocab_size = tokenizer_vocab;
    if (tokenizer_vocab > cfg->vocab_size)
        return csd_err_set(err, CSD_EINVAL,
                           "tokenizer has %lld tokens but preset %s has a vocabulary of %lld",
                           (long long)tokenizer_vocab, preset->name, (long long)cfg->vocab_size);
    cfg->bos_id = bos_id;
    cfg->n_eos = eos_id >= 0 ? 1 : 0;
    cfg->eos_ids[0] = eos_id;
    cfg->torch_dtype = preset->dtype;
    return 0;
}

/* ---- deterministic normal generator (xoshiro256** + Box-Muller) ---- */

typedef struct rng {
    uint64_t s[4];
    double spare;
    int has_spare;
} rng;

static uint64_t mix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed, const char *name) {
    uint64_t x = seed;
    for (const char *c = name; *c; c++) x = (x ^ (uint8_t)*c) * 0x100000001b3ull; /* FNV-1a */
    for (int i = 0; i < 4; i++) r->s[i] = mix(&x);
    r->has_spare = 0;
}

static uint64_t rng_next(rng *r) {
    uint64_t *s = r->s, result = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

static double rng_normal(rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u = ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double v = (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    double mag = sqrt(-2.0 * log(u));
    r->spare = mag * sin(2.0 * M_PI * v);
    r->has_spare = 1;
    return mag * cos(2.0 * M_PI * v);
}

/* ---- the tensor list ---- */

typedef struct synth_tensor {
    char name[96];
    int64_t rows, cols;  /* cols 0: a vector */
    double std;          /* normal(0, std), or around 1 for norms */
    int is_norm;
} synth_tensor;

typedef struct synth_plan {
    synth_tensor *t;
    int n;
    int dtype;
    uint64_t seed;
} synth_plan;

static void add(synth_plan *p, const char *name, int64_t rows, int64_t cols, double std,
                int is_norm) {
    synth_tensor *t = &p->t[p->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows;
    t->cols = cols;
    t->std = std;
    t->is_norm = is_norm;
}

static void plan_tensors(synth_plan *p, const csd_model_config *c) {
    int64_t q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    double in_std = 1.0 / sqrt((double)c->dim), damp = 1.0 / sqrt(2.0 * (double)c->n_layers);
    double qk_std = in_std * 1.6; /* sharpens attention a little, as trained q/k do */
    char n[96];
    add(p, CSD_TN_EMBED, c->vocab_size, c->dim, 1.0, 0);
    for (int l = 0; l < c->n_layers; l++) {
#define L(pattern) (snprintf(n, sizeof n, pattern, l), n)
        add(p, L(CSD_TN_ATTN_NORM), c->dim, 0, 0, 1);
        add(p, L(CSD_TN_WQ), q, c->dim, qk_std, 0);
        add(p, L(CSD_TN_WK), kv, c->dim, qk_std, 0);
        add(p, L(CSD_TN_WV), kv, c->dim, in_std, 0);
        add(p, L(CSD_TN_WO), c->dim, q, damp / sqrt((double)q), 0);
        if (c->qkv_bias) {
            add(p, L(CSD_TN_BQ), q, 0, 0.1, 0);
            add(p, L(CSD_TN_BK), kv, 0, 0.1, 0);
            add(p, L(CSD_TN_BV), kv, 0, 0.1, 0);
        }
        if (c->o_bias) add(p, L(CSD_TN_BO), c->dim, 0, 0.1, 0);
        if (c->qk_norm) {
            add(p, L(CSD_TN_Q_NORM), c->head_dim, 0, 0, 1);
            add(p, L(CSD_TN_K_NORM), c->head_dim, 0, 0, 1);
        }
        add(p, L(CSD_TN_FFN_NORM), c->dim, 0, 0, 1);
        add(p, L(CSD_TN_GATE), c->hidden_dim, c->dim, in_std, 0);
        add(p, L(CSD_TN_UP), c->hidden_dim, c->dim, in_std, 0);
        add(p, L(CSD_TN_DOWN), c->dim, c->hidden_dim, damp / sqrt((double)c->hidden_dim), 0);
#undef L
    }
    add(p, CSD_TN_FINAL_NORM, c->dim, 0, 0, 1);
    if (!c->tie_embeddings) add(p, CSD_TN_LM_HEAD, c->vocab_size, c->dim, in_std, 0);
}

static int fill_tensor(void *ctx, int index, void *dst, size_t nbytes, csd_err *err) {
    const synth_plan *p = ctx;
    const synth_tensor *t = &p->t[index];
    int64_t n = t->rows * (t->cols ? t->cols : 1);
    size_t elem = p->dtype == CSD_DTYPE_F32 ? 4 : 2;
    if ((size_t)n * elem != nbytes)
        return csd_err_set(err, CSD_EINVAL, "synth: size of %s", t->name);
    rng r;
    rng_seed(&r, p->seed, t->name);
    for (int64_t i = 0; i < n; i++) {
        double g = rng_normal(&r);
        float v = (float)(t->is_norm ? 1.0 + 0.1 * g : t->std * g);
        if (p->dtype == CSD_DTYPE_F32) ((float *)dst)[i] = v;
        else if (p->dtype == CSD_DTYPE_F16) ((uint16_t *)dst)[i] = csd_f32_to_f16(v);
        else ((uint16_t *)dst)[i] = csd_f32_to_bf16(v);
    }
    return 0;
}

int csd_synth_write(const csd_model_config *cfg, int dtype, uint64_t seed, const char *out_dir,
                    csd_err *err) {
    char path[4096];
    char *json = NULL;
    int max_tensors = 4 + (int)cfg->n_layers * 16; /* 9 matrices and norms, 4 biases, 2 q/k norms */
    synth_plan plan = {csd_alloc_array((size_t)max_tensors, sizeof(synth_tensor)), 0, dtype, seed};
    csd_st_desc *descs = csd_alloc_array((size_t)max_tensors, sizeof(csd_st_desc));
    int rc = plan.t && descs ? 0 : csd_err_set(err, CSD_ENOMEM, "synth plan");
    if (!rc) rc = csd_model_config_to_json(cfg, &json, err);
    if (!rc && csd_path_join(path, sizeof path, out_dir, "config.json"))
        rc = csd_err_set(err, CSD_ERANGE, "path too long");
    if (!rc) rc = csd_file_write_all(path, json, strlen(json), err);
    if (!rc) {
        plan_tensors(&plan, cfg);
        for (int i = 0; i < plan.n; i++) {
            descs[i] = (csd_st_desc){plan.t[i].name, dtype, plan.t[i].cols ? 2 : 1,
                                     {plan.t[i].rows, plan.t[i].cols, 0, 0}};
        }
        if (csd_path_join(path, sizeof path, out_dir, "model.safetensors"))
            rc = csd_err_set(err, CSD_ERANGE, "path too long");
        else
            rc = csd_st_write(path, descs, plan.n, fill_tensor, &plan, err);
    }
    csd_free(json);
    csd_free(descs);
    csd_free(plan.t);
    return rc;
}
