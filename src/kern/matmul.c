/* matmul: the csd_matmul driver. Quantizes the activations once (Q4/Q8 weights), then splits the
 * output rows across the pool in blocks of ROW_BLOCK; each table's kernel tiles tokens x rows
 * inside its range. An output element never depends on the split (see kern_internal.h). */
#include "kern_internal.h"

#include "core/dtype.h"
#include "quant.h"

/* Rows per unit of work: a multiple of every kernel's row tile, small enough to balance 2 cores
 * on the 256-row k/v projections. */
#define ROW_BLOCK 16
/* Below this many tokens the caller quantizes the activations alone (a pool job costs more). */
#define PARALLEL_QUANT_MIN_TOK 4

typedef struct matmul_job {
    const csd_kern_ops *ops;
    const csd_qmat *w;
    const float *x;
    uint8_t *act;
    int64_t n_tok;
    float *y;
} matmul_job;

static uint8_t *act_base(void *scratch) {
    uintptr_t p = (uintptr_t)scratch;
    return (uint8_t *)scratch + ((64 - (p & 63)) & 63);
}

size_t csd_matmul_scratch_bytes(int64_t cols, int64_t n_tok) {
    return (size_t)(n_tok > 0 ? n_tok : 0) * csd_quant_act_stride(cols) + 64;
}

static void quant_tokens(void *ctx, int ith, int nth) {
    const matmul_job *job = ctx;
    int64_t b, e;
    csd_split_range(job->n_tok, ith, nth, &b, &e);
    size_t stride = csd_quant_act_stride(job->w->cols);
    for (int64_t t = b; t < e; t++)
        job->ops->quantize_act_q8(job->act + (size_t)t * stride, job->x + t * job->w->cols,
                                  job->w->cols);
}

static void matmul_rows(void *ctx, int ith, int nth) {
    const matmul_job *job = ctx;
    const csd_qmat *w = job->w;
    int64_t b, e;
    csd_split_range((w->rows + ROW_BLOCK - 1) / ROW_BLOCK, ith, nth, &b, &e);
    int64_t r0 = b * ROW_BLOCK, r1 = e * ROW_BLOCK < w->rows ? e * ROW_BLOCK : w->rows;
    if (r0 >= r1) return;
    const csd_kern_ops *ops = job->ops;
    switch (w->dtype) {
    case CSD_DTYPE_Q4: ops->matmul_q4_q8(job->y, w, job->act, job->n_tok, r0, r1); break;
    case CSD_DTYPE_Q8: ops->matmul_q8_q8(job->y, w, job->act, job->n_tok, r0, r1); break;
    case CSD_DTYPE_F32: ops->matmul_f32_f32(job->y, w, job->x, job->n_tok, r0, r1); break;
    case CSD_DTYPE_F16: ops->matmul_f16_f32(job->y, w, job->x, job->n_tok, r0, r1); break;
    case CSD_DTYPE_BF16: ops->matmul_bf16_f32(job->y, w, job->x, job->n_tok, r0, r1); break;
    default: break;
    }
}

void csd_kern_matmul_with(const csd_kern_ops *ops, csd_pool *pool, const csd_qmat *w,
                          const float *x, int64_t n_tok, float *y, void *scratch) {
    if (n_tok <= 0 || w->rows <= 0) return;
    matmul_job job = {ops, w, x, NULL, n_tok, y};
    if (w->dtype == CSD_DTYPE_Q4 || w->dtype == CSD_DTYPE_Q8) {
        job.act = act_base(scratch);
        if (n_tok >= PARALLEL_QUANT_MIN_TOK) csd_pool_run(pool, quant_tokens, &job);
        else quant_tokens(&job, 0, 1);
    }
    csd_pool_run(pool, matmul_rows, &job);
}

void csd_matmul(csd_pool *pool, const csd_qmat *w, const float *x, int64_t n_tok, float *y,
                void *scratch) {
    csd_kern_matmul_with(csd_kern_ops_current(), pool, w, x, n_tok, y, scratch);
}
