/* model: a decoder-only transformer over a range of layers [layer_begin, layer_end), with the
 * embeddings when the range starts at 0 and the final norm + output head when it ends at n_layers.
 * A single-node run is the range [0, n_layers); a pipeline stage is any other range. The same code
 * computes both, so N-stage output equals 1-stage output exactly.
 *
 * Lifetimes (as in llama2.c): csd_model_config (hyperparameters) and the weights are read-only
 * after load and shared by threads; the model's scratch is per model and used by one forward at a
 * time; csd_kv is per sequence (request). Forward never allocates. */
#ifndef CSD_MODEL_H
#define CSD_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/pool.h"
#include "format/model_config.h"
#include "kern/kern.h"

/* Largest number of tokens one forward call may carry (prompt chunk or decode batch) when the
 * caller does not say: bounds the scratch. */
#define CSD_MODEL_DEFAULT_MAX_BATCH 512
/* Context when the caller does not say: the config's, capped here so a 128K-context model does not
 * reserve gigabytes of KV cache per request by default. */
#define CSD_MODEL_DEFAULT_MAX_CTX 4096

/* How a one-token forward (a decode step) runs its layers: the general path (a pool job per matmul
 * and per attention step), or one pool job whose threads meet at barriers (src/model/
 * decode_step.c; Q4/Q8 layers, 2 or more threads and no more than the cores). AUTO measures both
 * and takes the faster (the default); the others are for tests and comparisons. */
enum csd_decode_path { CSD_DECODE_AUTO = 0, CSD_DECODE_GENERAL, CSD_DECODE_ONE_JOB };

typedef struct csd_model_opts {
    int precision;           /* CSD_DTYPE_* for layer weights; -1: the file's dtype */
    int kv_dtype;            /* CSD_DTYPE_F32, _F16 or _Q8; -1: f32 for f32 weights, else f16 */
    int64_t layer_begin;     /* -1: 0 */
    int64_t layer_end;       /* -1: n_layers */
    int n_threads;           /* 0: all cores */
    int64_t max_batch;       /* tokens per forward call; 0: CSD_MODEL_DEFAULT_MAX_BATCH */
    int64_t max_ctx;         /* longest sequence; 0: max_position_embeddings capped at 4096 */
    int decode_path;         /* enum csd_decode_path: how one-token steps run */
} csd_model_opts;

void csd_model_opts_default(csd_model_opts *opts);

/* Per-layer weights. Norm weights and biases are f32; matrices in the model's precision. */
typedef struct csd_layer_weights {
    const float *attn_norm;  /* (dim) */
    const float *ffn_norm;   /* (dim) */
    const float *q_norm;     /* (head_dim) or NULL: Qwen3 */
    const float *k_norm;     /* (head_dim) or NULL: Qwen3 */
    const float *bq;         /* (n_heads * head_dim) or NULL: Qwen2 */
    const float *bk;         /* (n_kv_heads * head_dim) or NULL */
    const float *bv;         /* (n_kv_heads * head_dim) or NULL */
    const float *bo;         /* (dim) or NULL: attention_bias=true on Llama or Qwen3 */
    csd_qmat wq;             /* (n_heads * head_dim, dim) */
    csd_qmat wk;             /* (n_kv_heads * head_dim, dim) */
    csd_qmat wv;             /* (n_kv_heads * head_dim, dim) */
    csd_qmat wo;             /* (dim, n_heads * head_dim) */
    csd_qmat gate;           /* (hidden_dim, dim) */
    csd_qmat up;             /* (hidden_dim, dim) */
    csd_qmat down;           /* (dim, hidden_dim) */
} csd_layer_weights;

/* Everything a stage holds. Tensor memory is owned by the model (or borrowed from a mapped
 * shard). */
typedef struct csd_weights {
    int64_t layer_begin, layer_end;
    bool has_embed;          /* stage 0 */
    bool has_head;           /* last stage */
    csd_qmat embed;          /* (vocab, dim) when has_embed */
    const float *final_norm; /* (dim) when has_head */
    csd_qmat head;           /* (vocab, dim) when has_head (a copy of embed when tied) */
    csd_layer_weights *layers; /* layer_end - layer_begin entries */
} csd_weights;

typedef struct csd_model csd_model;
typedef struct csd_kv csd_kv;

/* Loads a Hugging Face model directory (config.json + safetensors) for the range in opts,
 * converting weights to opts->precision. */
int csd_model_load_hf(csd_model **out, const char *dir, const csd_model_opts *opts, csd_err *err);
/* Loads a one-stage export directory (`cascadia export --stages 1`: manifest.json + stage-0.shard):
 * the weights as exported, no conversion; opts->precision, when set, must match the export's. */
int csd_model_load_export(csd_model **out, const char *dir, const csd_model_opts *opts,
                          csd_err *err);
/* Either: an export directory (it has manifest.json) or a Hugging Face one. */
int csd_model_open(csd_model **out, const char *dir, const csd_model_opts *opts, csd_err *err);
/* Builds a model around weights someone else owns (a mapped shard); the model borrows them. */
int csd_model_create(csd_model **out, const csd_model_config *cfg, const csd_weights *weights,
                     const csd_model_opts *opts, csd_err *err);
void csd_model_destroy(csd_model *model);

const csd_model_config *csd_model_cfg(const csd_model *model);
const csd_weights *csd_model_weights(const csd_model *model);
int csd_model_precision(const csd_model *model);
int csd_model_kv_dtype(const csd_model *model);
int64_t csd_model_max_batch(const csd_model *model);
int64_t csd_model_max_ctx(const csd_model *model);
csd_pool *csd_model_pool(csd_model *model);
/* Bytes of weights held by this stage. */
size_t csd_model_weight_bytes(const csd_model *model);
/* Bytes of KV cache per token of context for this stage's layers. */
size_t csd_model_kv_bytes_per_token(const csd_model *model);

/* A sequence's KV cache for the model's layers, with room for max_ctx tokens (0: model's max). */
int csd_kv_create(csd_kv **out, const csd_model *model, int64_t max_ctx, csd_err *err);
void csd_kv_destroy(csd_kv *kv);
/* Number of positions filled. */
int64_t csd_kv_len(const csd_kv *kv);
int64_t csd_kv_capacity(const csd_kv *kv);
/* Bytes of one position's keys (or values) in one layer of a KV cache of dtype (CSD_DTYPE_F32,
 * _F16 or _Q8, whose per-head scales it includes). */
size_t csd_kv_row_bytes(int dtype, int64_t n_kv_heads, int64_t head_dim);
/* Bytes one cached position occupies over the stage's layers (k and v, q8 scales included):
 * what attention reads per position per generated token. */
size_t csd_kv_position_bytes(const csd_kv *kv);
/* Forgets every position >= pos (speculative decoding, prefix reuse). */
int csd_kv_truncate(csd_kv *kv, int64_t pos);
/* Copies the first n positions of src into dst (prefix cache); dst == src keeps its first n. */
int csd_kv_copy_prefix(csd_kv *dst, const csd_kv *src, int64_t n, csd_err *err);

/* One forward step over a batch of tokens, possibly from several sequences.
 * Token i belongs to kv[i] at position csd_kv_len(kv[i]) + (its rank among earlier tokens of the
 * same sequence in this batch); each sequence's tokens must appear in order. Input: ids[i] when the
 * stage has the embeddings, else hidden_in[i * dim]. Output: when the stage has the head, logits
 * (vocab floats) for each token i with want_logits[i] (want_logits NULL: every token), packed in
 * token order; otherwise the hidden states of all n tokens (n * dim).
 * After the call each sequence's length has grown by its token count. */
typedef struct csd_batch {
    int64_t n;                 /* tokens in this batch, <= max_batch */
    const int32_t *ids;        /* (n) when the stage has embeddings */
    const float *hidden_in;    /* (n, dim) otherwise */
    csd_kv *const *kv;         /* (n) the sequence of each token */
    const bool *want_logits;   /* (n) or NULL for all; only read by the head stage */
} csd_batch;

int csd_model_forward(csd_model *model, const csd_batch *batch, float *out, csd_err *err);

/* Convenience for one sequence: n tokens, logits of the last only (head stage) or all hidden. */
int csd_model_forward_seq(csd_model *model, csd_kv *kv, const int32_t *ids, const float *hidden_in,
                          int64_t n, float *out, csd_err *err);

#endif
