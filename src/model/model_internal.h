/* model_internal: the model struct shared by the files of src/model/ (load, forward, kv).
 * Not for other layers: they use model.h. */
#ifndef CSD_MODEL_INTERNAL_H
#define CSD_MODEL_INTERNAL_H

#include "model.h"

/* Query heads one attention task takes from a KV head's group: each K/V row is read once for
 * them all, while a decode step still has n_kv_heads * group / 4 tasks to spread over threads. */
#define CSD_ATTN_TASK_HEADS 4

typedef struct csd_decode_step csd_decode_step;

struct csd_model {
    csd_model_config cfg;
    csd_weights w;
    void **owned;        /* buffers this model frees (converted weights); NULL when borrowed */
    struct csd_model_shard *shard; /* csd_model_load_export's shard (the weights), closed last */
    int n_owned, cap_owned;
    int precision;       /* CSD_DTYPE_* of layer matrices */
    int kv_dtype;        /* CSD_DTYPE_F32, _F16 or _Q8 */
    int64_t max_batch;
    int64_t max_ctx;
    int64_t q_dim;       /* n_heads * head_dim */
    int64_t kv_dim;      /* n_kv_heads * head_dim */
    csd_pool *pool;
    /* Scratch, sized once at creation; forward only indexes into it. */
    float *x;            /* (max_batch, dim) residual stream */
    float *xb;           /* (max_batch, max(dim, q_dim)) normed input, then attention output */
    float *tmp;          /* (max_batch, dim) projection output before the residual add */
    float *q;            /* (max_batch, q_dim) */
    float *k;            /* (max_batch, kv_dim) */
    float *v;            /* (max_batch, kv_dim) */
    float *hb;           /* (max_batch, hidden_dim) gate, then silu(gate) * up */
    float *hb2;          /* (max_batch, hidden_dim) up */
    float *att;          /* (n_threads, CSD_ATTN_TASK_HEADS * max_ctx) attention scores */
    float *rope_cos;     /* (max_batch, head_dim / 2) */
    float *rope_sin;     /* (max_batch, head_dim / 2) */
    float *inv_freq;     /* (head_dim / 2) RoPE frequencies after scaling */
    int64_t *pos;        /* (max_batch) position of each batch token */
    bool batch_distinct; /* the current batch's tokens all belong to different sequences */
    void *mm_scratch;    /* csd_matmul scratch for max_batch tokens */
    csd_decode_step *decode; /* one-token steps as one job (decode_step.c), or NULL */
};

/* Keys and values are stored head-major, (n_layers, n_kv_heads, cap, head_dim): a KV head's
 * positions are contiguous, so attention over one head streams them instead of picking 128-256
 * bytes out of every position's whole row (csd_kv_row). */
struct csd_kv {
    int dtype;           /* CSD_DTYPE_F32, _F16 or _Q8 */
    int64_t n_layers;    /* layers of the owning stage */
    int64_t n_kv_heads;
    int64_t head_dim;
    int64_t cap;         /* positions allocated */
    int64_t len;         /* positions filled */
    void *k;             /* (n_layers, n_kv_heads, cap, head_dim) */
    void *v;             /* (n_layers, n_kv_heads, cap, head_dim) */
    float *k_scale;      /* q8 only: (n_layers, n_kv_heads, cap) */
    float *v_scale;      /* q8 only */
};

/* Index of KV head kvh's scale at pos in layer (q8 caches); times head_dim, of its first
 * element. */
static inline int64_t csd_kv_slot(const csd_kv *kv, int64_t layer, int64_t kvh, int64_t pos) {
    return (layer * kv->n_kv_heads + kvh) * kv->cap + pos;
}
/* Element offset of KV head kvh's row at pos in layer, in k or v. Rows of one head are head_dim
 * elements apart. */
static inline int64_t csd_kv_row(const csd_kv *kv, int64_t layer, int64_t kvh, int64_t pos) {
    return csd_kv_slot(kv, layer, kvh, pos) * kv->head_dim;
}

/* fn(m, arg, t0, t1) over tokens [0, n): on the pool in token ranges when a batch has enough
 * tokens to pay for the fork-join, else on the calling thread. forward.c. */
typedef void (*csd_token_range_fn)(csd_model *m, const void *arg, int64_t t0, int64_t t1);
void csd_model_for_tokens(csd_model *m, int64_t n, csd_token_range_fn fn, const void *arg);
/* One layer's attention (index li within the stage) for batch b: from the projected m->q, m->k,
 * m->v to the heads' outputs in m->xb, with RoPE and the cache write. attention_layer.c. */
void csd_attention_layer(csd_model *m, const csd_batch *b, int64_t li);
/* A one-token batch's attention units of KV heads [kvh0, kvh1) in layer li, on thread ith of a
 * job of the caller's (decode_step.c): each with its RoPE and cache write, as
 * csd_attention_layer does them. Call csd_attention_prefetch_units for them first. */
void csd_attention_units(csd_model *m, const csd_batch *b, int64_t li, int64_t kvh0, int64_t kvh1,
                         int ith);
/* Starts loading the K/V rows those units will read (while the thread waits at a barrier). */
void csd_attention_prefetch_units(const csd_model *m, const csd_batch *b, int64_t li, int64_t kvh0,
                                  int64_t kvh1);

/* Bytes of one element of a KV cache of dtype (q8: the int8 value; scales are extra). */
size_t csd_kv_elem_bytes(int dtype);

/* Fills inv_freq from the config (RoPE theta and scaling). */
void csd_rope_init_freqs(const csd_model_config *cfg, float *inv_freq);
/* Sizes and allocates the scratch and the pool; weights must already be in place. */
int csd_model_init_runtime(csd_model *model, const csd_model_opts *opts, csd_err *err);

#endif
