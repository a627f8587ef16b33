/* stage_plan: how to cut a model into pipeline stages. Pure functions of the config, the precision
 * and the serving budget (context x slots): no files, no allocation. `--stages N` balances bytes
 * (the embeddings weigh on stage 0, the head on the last); `--stages auto --memory A,B,...` takes
 * the fewest machines, in the order given, that hold the model and gives each a share of layers
 * proportional to its memory left after its fixed costs. Byte costs mirror csd_model_load_hf
 * (matrices in the precision, embeddings/head at 8 bits under int4, norms and biases f32). */
#ifndef CSD_STAGE_PLAN_H
#define CSD_STAGE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"
#include "format/model_config.h"

#define CSD_PLAN_MAX_STAGES 256
/* Per-process memory a stage needs besides weights, KV cache and forward scratch: code, thread
 * stacks, connection buffers, allocator slack. A deliberately round estimate. */
#define CSD_PLAN_DEFAULT_RUNTIME_BYTES (64ull << 20)
/* Largest machine memory accepted (1 PiB): keeps the planner's arithmetic far from overflow. */
#define CSD_PLAN_MAX_MACHINE_BYTES (1ull << 50)

typedef struct csd_plan_opts {
    int precision;     /* CSD_DTYPE_* of layer matrices */
    int kv_dtype;      /* CSD_DTYPE_F32, _F16 or _Q8; -1: f32 for f32 weights, else f16 */
    int64_t ctx;       /* tokens of context per slot */
    int64_t slots;     /* concurrent sequences */
    int64_t max_batch; /* tokens per forward call (sizes the scratch); 0: the model default */
    uint64_t
        runtime_bytes; /* fixed per-stage overhead, CSD_PLAN_DEFAULT_RUNTIME_BYTES by default */
} csd_plan_opts;

/* Byte costs derived from the config and opts. */
typedef struct csd_plan_costs {
    uint64_t layer_weight_bytes;       /* one transformer layer's weights */
    uint64_t kv_bytes_per_token_layer; /* K and V of one token in one layer */
    uint64_t layer_bytes;              /* layer_weight_bytes + KV for ctx * slots tokens */
    uint64_t embed_bytes;              /* token embeddings (stage 0) */
    uint64_t head_bytes;        /* final norm + output head (last stage, own copy when tied) */
    uint64_t head_shared_bytes; /* the head stage's cost when it also holds the tied embeddings */
    uint64_t overhead_bytes;    /* forward scratch for max_batch tokens + runtime_bytes */
} csd_plan_costs;

typedef struct csd_plan_stage {
    int64_t layer_begin, layer_end;
    bool has_embed, has_head;
    uint64_t weight_bytes; /* its layers plus the embeddings/head it holds */
    uint64_t kv_bytes;     /* KV cache for ctx * slots tokens over its layers */
    uint64_t overhead_bytes;
    uint64_t total_bytes;   /* the sum: the memory the stage's process needs */
    uint64_t machine_bytes; /* memory of the machine it was planned for; 0 with --stages N */
} csd_plan_stage;

typedef struct csd_plan {
    int n_stages;
    csd_plan_stage stages[CSD_PLAN_MAX_STAGES];
} csd_plan;

/* precision f32, kv -1, ctx 4096, slots 1, max_batch 0, runtime CSD_PLAN_DEFAULT_RUNTIME_BYTES. */
void csd_plan_opts_default(csd_plan_opts *opts);
int csd_plan_costs_get(csd_plan_costs *out, const csd_model_config *cfg, const csd_plan_opts *opts,
                       csd_err *err);
/* n_stages in [1, n_layers] contiguous stages of at least one layer each, minimising the largest
 * stage's bytes (weights + KV + overhead); ties go to the earlier stage. */
int csd_plan_even(csd_plan *out, const csd_model_config *cfg, const csd_plan_opts *opts,
                  int n_stages, csd_err *err);
/* The fewest of machines[0..n) (bytes of memory each, used in order) that fit; layers split in
 * proportion to each machine's memory left after its fixed costs, never above what fits.
 * CSD_EFULL with the missing amount (or the machine that cannot hold a single layer) otherwise. */
int csd_plan_auto(csd_plan *out, const csd_model_config *cfg, const csd_plan_opts *opts,
                  const uint64_t *machines, int n_machines, csd_err *err);

/* "8G", "512M", "1.5T", "123456" (bytes): binary units K, M, G, T, optional "B"/"iB" suffix. */
int csd_plan_parse_bytes(const char *text, uint64_t *out, csd_err *err);
/* "8G,16G,..." into out[0..cap); *n receives the count. */
int csd_plan_parse_memory_list(const char *text, uint64_t *out, int cap, int *n, csd_err *err);
/* "1.5 GiB" style rendering into buf (>= 16 bytes); returns buf. */
const char *csd_plan_fmt_bytes(uint64_t bytes, char *buf, int cap);

#endif
