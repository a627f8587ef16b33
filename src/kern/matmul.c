/* matmul: the csd_matmul driver. Quantizes the activations once (Q4/Q8 weights) or copies them to a
 * padded stride (float weights, several tokens), then splits the output rows across the pool in
 * blocks of ROW_BLOCK; each table's kernel tiles tokens x rows inside its range. One token through
 * Q4/Q8 weights (a decode step) is dealt by matvec_lanes.c instead, when the table has matvec
 * kernels. An output element never depends on the split or on the other tokens (see
 * kern_internal.h). */
#include "kern_internal.h"

#include <assert.h>
#include <stdbool.h>
#include <string.h>

#include "core/dtype.h"
#include "quant.h"

/* Rows per unit of work: a multiple of every kernel's row tile, small enough to balance 2 cores
 * on the 256-row k/v projections. */
#define ROW_BLOCK 16
static_assert(ROW_BLOCK % CSD_QUANT_BLOCK_ROWS == 0, "Q kernels take whole 16-row blocks");
/* Below this many tokens the caller prepares the activations alone (a pool job costs more). */
#define PARALLEL_PREP_MIN_TOK 4
/* Guided rounds of chunks per thread (csd_split_guided): the last chunks are 1/64 of a matrix
 * each, so two threads end a matmul within ~1% of each other (measured on float-weight decode
 * steps, before Q decode moved to matvec_lanes.c: worker idle time at the joins fell from ~10% to
 * ~6% of a token). */
#define CHUNK_ROUNDS 6

typedef struct matmul_job {
    const csd_kern_ops *ops;
    const csd_qmat *w;
    const float *x;   /* caller's activations, n_tok x cols */
    uint8_t *act;     /* quantized activations (Q4/Q8) in scratch */
    float *xpad;      /* padded copy of x (float weights, n_tok > 1) in scratch, or NULL */
    int64_t ldx;      /* stride of xpad in floats */
    int64_t n_tok;
    float *y;
    int threads;      /* csd_split_guided's threads for the row chunks */
} matmul_job;

static uint8_t *scratch_base(void *scratch) {
    uintptr_t p = (uintptr_t)scratch;
    return (uint8_t *)scratch + ((64 - (p & 63)) & 63);
}

/* Token stride for float activations: rows whose stride is a multiple of 4 KiB (cols 1024, 2048,
 * ...) all map to the same L1 sets, and a 4-token tile then thrashes an 8-way L1; 64 more bytes
 * spread them. */
static int64_t padded_ldx(int64_t cols) {
    int64_t ldx = (cols + 15) / 16 * 16;
    if ((ldx * 4) % 4096 == 0) ldx += 16;
    return ldx;
}

size_t csd_matmul_scratch_bytes(int64_t cols, int64_t n_tok) {
    size_t q = csd_quant_act_stride(cols), f = (size_t)padded_ldx(cols) * sizeof(float);
    return (size_t)(n_tok > 0 ? n_tok : 0) * (q > f ? q : f) + 64;
}

static void prep_tokens(void *ctx, int ith, int nth) {
    const matmul_job *job = ctx;
    int64_t b, e, cols = job->w->cols;
    csd_split_range(job->n_tok, ith, nth, &b, &e);
    size_t stride = csd_quant_act_stride(cols);
    for (int64_t t = b; t < e; t++) {
        if (job->act)
            job->ops->quantize_act_q8(job->act + (size_t)t * stride, job->x + t * cols, cols);
        else
            memcpy(job->xpad + t * job->ldx, job->x + t * cols, (size_t)cols * sizeof(float));
    }
}

/* Quantizes (or pads) the activations, on the pool when there are enough tokens. */
static void prepare_activations(csd_pool *pool, matmul_job *job) {
    if (job->n_tok >= PARALLEL_PREP_MIN_TOK) csd_pool_run(pool, prep_tokens, job);
    else prep_tokens(job, 0, 1);
}

/* Chunks of a job over n row blocks: whoever is running takes the next chunk, so a preempted
 * thread does not hold the step up; guided rounds (big chunks first) keep the end of the job
 * even. Fewer rounds when the last would give a thread less than a block. */
static int row_chunks(int64_t n, int threads) {
    if (n <= threads) return (int)n;
    int rounds = CHUNK_ROUNDS;
    while (rounds > 1 && (n >> (rounds - 1)) < threads) rounds--;
    return rounds * threads;
}

static int64_t row_blocks(const csd_qmat *w) { return (w->rows + ROW_BLOCK - 1) / ROW_BLOCK; }

static void matmul_rows(void *ctx, int ith, int nth) {
    const matmul_job *job = ctx;
    const csd_qmat *w = job->w;
    int64_t b, e;
    csd_split_guided(row_blocks(w), ith, nth, job->threads, &b, &e);
    int64_t r0 = b * ROW_BLOCK, r1 = e * ROW_BLOCK < w->rows ? e * ROW_BLOCK : w->rows;
    if (r0 >= r1) return;
    const csd_kern_ops *ops = job->ops;
    const float *x = job->xpad ? job->xpad : job->x;
    int64_t ldx = job->xpad ? job->ldx : w->cols;
    switch (w->dtype) {
    case CSD_DTYPE_Q4: ops->matmul_q4_q8(job->y, w, job->act, job->n_tok, r0, r1); break;
    case CSD_DTYPE_Q8: ops->matmul_q8_q8(job->y, w, job->act, job->n_tok, r0, r1); break;
    case CSD_DTYPE_F32: ops->matmul_f32_f32(job->y, w, x, ldx, job->n_tok, r0, r1); break;
    case CSD_DTYPE_F16: ops->matmul_f16_f32(job->y, w, x, ldx, job->n_tok, r0, r1); break;
    case CSD_DTYPE_BF16: ops->matmul_bf16_f32(job->y, w, x, ldx, job->n_tok, r0, r1); break;
    default: break;
    }
}

/* Tokens whose activations stay in L2 while a block sweeps them (64 x 5.9 KB at cols 5632). */
#define Q_TOK_CHUNK 64

void csd_q_blocks_run(const csd_q_block_fn *blocks, int tile_max, float *y, const csd_qmat *w,
                      const uint8_t *act, int64_t n_tok, int64_t r0, int64_t r1) {
    int64_t ng = csd_quant_groups(w->cols);
    size_t block_bytes = csd_quant_block_bytes(w->dtype, w->cols);
    size_t stride = csd_quant_act_stride(w->cols);
    const uint8_t *base = w->data;
    for (int64_t t0 = 0; t0 < n_tok; t0 += Q_TOK_CHUNK) {
        int64_t t1 = t0 + Q_TOK_CHUNK < n_tok ? t0 + Q_TOK_CHUNK : n_tok;
        for (int64_t r = r0; r < r1; r += CSD_QUANT_BLOCK_ROWS) {
            const uint8_t *blk = base + (size_t)(r / CSD_QUANT_BLOCK_ROWS) * block_bytes;
            int nrows = (int)(r1 - r < CSD_QUANT_BLOCK_ROWS ? r1 - r : CSD_QUANT_BLOCK_ROWS);
            int pf = t1 - t0 <= tile_max ? CSD_PF_ONCE : CSD_PF_REUSED;
            for (int64_t t = t0; t < t1; t += tile_max) {
                int nt = (int)(t1 - t < tile_max ? t1 - t : tile_max);
                blocks[nt - 1](y + t * w->rows + r, w->rows, nrows, blk, act + (size_t)t * stride,
                               stride, ng, t == t0 ? pf : CSD_PF_NONE);
            }
        }
    }
}

/* Float activations are 4 bytes a column, so fewer tokens fit in L2 than for int8. */
#define F_TOK_CHUNK 32

void csd_f_tiles_run(const csd_f_tile_fn tiles[3][CSD_F_TILE_T], float *y, const csd_qmat *w,
                     const float *x, int64_t ldx, int64_t n_tok, int64_t r0, int64_t r1) {
    size_t row_bytes = csd_quant_row_bytes(w->dtype, w->cols);
    const uint8_t *base = w->data;
    for (int64_t t0 = 0; t0 < n_tok; t0 += F_TOK_CHUNK) {
        int64_t t1 = t0 + F_TOK_CHUNK < n_tok ? t0 + F_TOK_CHUNK : n_tok;
        for (int64_t r = r0; r < r1;) {
            int big = n_tok == 1 && r1 - r >= CSD_F_MV_R ? 2 : r1 - r >= CSD_F_TILE_R ? 1 : 0;
            for (int64_t t = t0; t < t1; t += CSD_F_TILE_T) {
                int nt = (int)(t1 - t < CSD_F_TILE_T ? t1 - t : CSD_F_TILE_T);
                tiles[big][nt - 1](y + t * w->rows + r, w->rows, base + (size_t)r * row_bytes,
                                   row_bytes, x + t * ldx, ldx, w->cols);
            }
            r += big == 2 ? CSD_F_MV_R : big ? CSD_F_TILE_R : 1;
        }
    }
}

void csd_kern_matmul_with(const csd_kern_ops *ops, csd_pool *pool, const csd_qmat *w,
                          const float *x, int64_t n_tok, float *y, void *scratch) {
    if (n_tok <= 0 || w->rows <= 0) return;
    matmul_job job = {ops, w, x, NULL, NULL, w->cols, n_tok, y, csd_pool_size(pool)};
    if (w->dtype == CSD_DTYPE_Q4 || w->dtype == CSD_DTYPE_Q8) {
        job.act = scratch_base(scratch);
    } else if (n_tok > 1 && padded_ldx(w->cols) != w->cols) {
        job.xpad = (float *)(void *)scratch_base(scratch);
        job.ldx = padded_ldx(w->cols);
    }
    if (job.act || job.xpad) prepare_activations(pool, &job);
    if (job.act && n_tok == 1 && csd_matvec_lanes(ops, pool, &w, 1, &y, job.act)) return;
    csd_pool_run_chunks(pool, matmul_rows, &job, row_chunks(row_blocks(w), job.threads));
}

void csd_quantize_act(uint8_t *act, const float *x, int64_t cols) {
    csd_kern_ops_current()->quantize_act_q8(act, x, cols);
}

void csd_quantize_act_groups(uint8_t *act, const float *x, int64_t cols, int64_t g0, int64_t g1,
                             uint8_t *part) {
    int64_t ng = csd_quant_groups(cols), c0 = g0 * CSD_QUANT_GROUP;
    int64_t c1 = g1 * CSD_QUANT_GROUP < cols ? g1 * CSD_QUANT_GROUP : cols, pg = g1 - g0;
    if (pg <= 0) return;
    /* The groups as a short input of their own, then each of its three parts into place. */
    csd_kern_ops_current()->quantize_act_q8(part, x + c0, c1 - c0);
    memcpy(act + c0, part, (size_t)(pg * CSD_QUANT_GROUP));
    float *dx = (float *)(void *)(act + ng * CSD_QUANT_GROUP);
    const float *pdx = (const float *)(const void *)(part + pg * CSD_QUANT_GROUP);
    memcpy(dx + g0, pdx, (size_t)pg * sizeof(float));
    memcpy((int32_t *)(void *)(dx + ng) + g0, pdx + pg, (size_t)pg * sizeof(int32_t));
}

void csd_matmul(csd_pool *pool, const csd_qmat *w, const float *x, int64_t n_tok, float *y,
                void *scratch) {
    csd_kern_matmul_with(csd_kern_ops_current(), pool, w, x, n_tok, y, scratch);
}

/* Several quantized matrices sharing one input: the row blocks of all of them form one list that
 * the pool's chunks cut through, so a chunk may end in one matrix and go on in the next. */
typedef struct multi_job {
    const csd_kern_ops *ops;
    const csd_qmat *const *w;
    float *const *y;
    int n_mats;
    const uint8_t *act;
    int64_t n_tok, total_blocks;
    int threads;
} multi_job;

static void multi_rows(void *ctx, int ith, int nth) {
    const multi_job *job = ctx;
    int64_t b, e, base = 0;
    csd_split_guided(job->total_blocks, ith, nth, job->threads, &b, &e);
    for (int i = 0; i < job->n_mats && b < e; i++) {
        const csd_qmat *w = job->w[i];
        int64_t blocks = row_blocks(w);
        if (b < base + blocks) {
            int64_t end = e < base + blocks ? e : base + blocks;
            int64_t r0 = (b - base) * ROW_BLOCK, r1 = (end - base) * ROW_BLOCK;
            if (r1 > w->rows) r1 = w->rows;
            if (w->dtype == CSD_DTYPE_Q4)
                job->ops->matmul_q4_q8(job->y[i], w, job->act, job->n_tok, r0, r1);
            else
                job->ops->matmul_q8_q8(job->y[i], w, job->act, job->n_tok, r0, r1);
            b = end;
        }
        base += blocks;
    }
}

void csd_matmul_multi(csd_pool *pool, const csd_qmat *const *w, int n_mats, const float *x,
                      int64_t n_tok, float *const *y, void *scratch) {
    bool fused = n_tok > 0;
    int64_t total = 0;
    for (int i = 0; i < n_mats; i++) {
        fused = fused && (w[i]->dtype == CSD_DTYPE_Q4 || w[i]->dtype == CSD_DTYPE_Q8) &&
                w[i]->cols == w[0]->cols;
        total += row_blocks(w[i]);
    }
    if (!fused) { /* float weights or mixed shapes: one matmul each */
        for (int i = 0; i < n_mats; i++) csd_matmul(pool, w[i], x, n_tok, y[i], scratch);
        return;
    }
    const csd_kern_ops *ops = csd_kern_ops_current();
    matmul_job prep = {ops, w[0], x, scratch_base(scratch), NULL, w[0]->cols, n_tok, NULL, 1};
    prepare_activations(pool, &prep);
    if (n_tok == 1 && csd_matvec_lanes(ops, pool, w, n_mats, y, prep.act)) return;
    multi_job job = {ops, w, y, n_mats, prep.act, n_tok, total, csd_pool_size(pool)};
    csd_pool_run_chunks(pool, multi_rows, &job, row_chunks(total, job.threads));
}
