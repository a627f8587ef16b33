/* model_config: a Hugging Face config.json mapped onto one model-agnostic structure, and the
 * architecture table (one row per family: tensor names, biases, norms, RoPE style). Adding a family
 * means adding a row, not a code path. Unsupported model_type values are refused with the list. */
#ifndef CSD_MODEL_CONFIG_H
#define CSD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

enum csd_arch {
    CSD_ARCH_LLAMA = 0,
    CSD_ARCH_MISTRAL = 1,
    CSD_ARCH_QWEN2 = 2,
    CSD_ARCH_QWEN3 = 3,
    CSD_ARCH_COUNT
};

enum csd_rope_scaling {
    CSD_ROPE_SCALING_NONE = 0,
    CSD_ROPE_SCALING_LLAMA3 = 1, /* Llama 3.1/3.2: frequency-dependent scaling */
    CSD_ROPE_SCALING_LINEAR = 2, /* positions divided by factor */
    CSD_ROPE_SCALING_COUNT
};

#define CSD_MAX_EOS 8
/* Upper bounds that keep a hostile config from driving huge allocations. */
#define CSD_MAX_LAYERS 1024
#define CSD_MAX_DIM 65536
#define CSD_MAX_VOCAB 1048576
#define CSD_MAX_CONTEXT 1048576

/* One row of the architecture table. Names are printf patterns taking the layer index. */
typedef struct csd_arch_desc {
    int arch;                 /* enum csd_arch */
    const char *model_type;   /* config.json "model_type" */
    const char *display_name; /* "Llama", "Qwen3", ... */
    bool qkv_bias;            /* q/k/v projections carry biases (Qwen2) */
    bool qk_norm;             /* per-head RMSNorm on q and k before RoPE (Qwen3) */
    bool uses_sliding_window; /* honours config "sliding_window" (Mistral) */
} csd_arch_desc;

/* HF tensor names shared by all four families (the table is where a family would override them). */
#define CSD_TN_EMBED "model.embed_tokens.weight"
#define CSD_TN_FINAL_NORM "model.norm.weight"
#define CSD_TN_LM_HEAD "lm_head.weight"
#define CSD_TN_ATTN_NORM "model.layers.%d.input_layernorm.weight"
#define CSD_TN_WQ "model.layers.%d.self_attn.q_proj.weight"
#define CSD_TN_WK "model.layers.%d.self_attn.k_proj.weight"
#define CSD_TN_WV "model.layers.%d.self_attn.v_proj.weight"
#define CSD_TN_WO "model.layers.%d.self_attn.o_proj.weight"
#define CSD_TN_BQ "model.layers.%d.self_attn.q_proj.bias"
#define CSD_TN_BK "model.layers.%d.self_attn.k_proj.bias"
#define CSD_TN_BV "model.layers.%d.self_attn.v_proj.bias"
#define CSD_TN_BO "model.layers.%d.self_attn.o_proj.bias"
#define CSD_TN_Q_NORM "model.layers.%d.self_attn.q_norm.weight"
#define CSD_TN_K_NORM "model.layers.%d.self_attn.k_norm.weight"
#define CSD_TN_FFN_NORM "model.layers.%d.post_attention_layernorm.weight"
#define CSD_TN_GATE "model.layers.%d.mlp.gate_proj.weight"
#define CSD_TN_UP "model.layers.%d.mlp.up_proj.weight"
#define CSD_TN_DOWN "model.layers.%d.mlp.down_proj.weight"

typedef struct csd_model_config {
    int arch;               /* enum csd_arch */
    char model_type[32];    /* as in config.json */
    int64_t dim;            /* hidden_size */
    int64_t hidden_dim;     /* intermediate_size */
    int64_t n_layers;       /* num_hidden_layers */
    int64_t n_heads;        /* num_attention_heads */
    int64_t n_kv_heads;     /* num_key_value_heads (defaults to n_heads) */
    int64_t head_dim;       /* head_dim (defaults to dim / n_heads) */
    int64_t vocab_size;
    int64_t max_seq_len;    /* max_position_embeddings */
    float norm_eps;         /* rms_norm_eps */
    float rope_theta;
    int rope_scaling;       /* enum csd_rope_scaling */
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int64_t rope_orig_max_pos; /* original_max_position_embeddings */
    int64_t sliding_window; /* 0 = full attention; Mistral's window otherwise */
    bool tie_embeddings;    /* tie_word_embeddings: lm_head = embed_tokens */
    bool qkv_bias;          /* from the arch row, or attention_bias=true */
    bool o_bias;            /* o_proj carries a bias: attention_bias=true (Llama, Qwen3; Qwen2's
                             * built-in biases are q/k/v only) */
    bool qk_norm;           /* from the arch row */
    int bos_id;             /* -1 when absent */
    int eos_ids[CSD_MAX_EOS]; /* eos_token_id (int or list) */
    int n_eos;
    int torch_dtype;        /* CSD_DTYPE_* of torch_dtype, F32 when absent */
} csd_model_config;

/* Parses config.json text (len bytes, need not be NUL-terminated) and validates every field:
 * required ones present, positive, within the CSD_MAX_* bounds, heads dividing evenly. */
int csd_model_config_parse(csd_model_config *cfg, const char *json, size_t len, csd_err *err);
/* Reads MODEL_DIR/config.json (and generation_config.json for extra EOS ids when present). */
int csd_model_config_load(csd_model_config *cfg, const char *model_dir, csd_err *err);
/* Serialises back to HF config.json text (csd_free the result); parse(to_json(c)) == c. */
int csd_model_config_to_json(const csd_model_config *cfg, char **out, csd_err *err);
/* Field-by-field equality (floats compared exactly; rope_* parameters only where the scaling type
 * uses them): what the round-trip guarantee means. */
bool csd_model_config_equal(const csd_model_config *a, const csd_model_config *b);

const csd_arch_desc *csd_arch_find(const char *model_type); /* NULL when unsupported */
const csd_arch_desc *csd_arch_get(int arch);
/* "llama, mistral, qwen2, qwen3": for error messages and --help. */
const char *csd_arch_supported_list(void);
/* HF "architectures" class of a family ("LlamaForCausalLM"), written by csd_model_config_to_json;
 * NULL for an unknown arch. */
const char *csd_arch_hf_class(int arch);

#endif
