/* kern: the numeric kernels the forward pass calls, behind one dispatch table chosen at start-up
 * (AVX-512/VNNI, AVX-VNNI, AVX2/FMA, portable scalar; CSD_KERN=ref|avx2|avxvnni|avx512 forces
 * one). No model knowledge here. Weight matrices are [rows = outputs, cols = inputs] in any
 * csd_dtype: plain row-major, or the blocked Q4/Q8 layouts of kern/quant.h. Nothing here
 * allocates. */
#ifndef CSD_KERN_H
#define CSD_KERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/pool.h"

/* A weight matrix in memory. data layout depends on dtype (see quant.h); for F32/F16/BF16 it is
 * plain row-major. Borrowed: the owner (model weights or a mapped shard) keeps it alive. */
typedef struct csd_qmat {
    int dtype;     /* enum csd_dtype */
    int64_t rows;  /* output features */
    int64_t cols;  /* input features */
    const void *data;
    size_t nbytes;
} csd_qmat;

/* Selects the kernel table once (thread-safe, idempotent). Returns its name. */
const char *csd_kern_init(void);
const char *csd_kern_name(void);
/* How far ahead (bytes) the chosen table's one-token weight streams and csd_read_streams
 * prefetch: the table's measured default, or CSD_PF_AHEAD (a multiple of 64, at most
 * CSD_PF_AHEAD_MAX) when set. A tuning knob for CPUs unlike those the defaults were measured on;
 * results do not depend on it. */
size_t csd_kern_pf_ahead(void);
#define CSD_PF_AHEAD_MAX 16384
/* Names of the tables this CPU runs (compiled in and supported), worst first, at most cap of
 * them; returns how many. CSD_KERN can force any of these. */
int csd_kern_available(const char **names, int cap);

/* Bytes needed to store a rows x cols matrix in dtype. */
size_t csd_qmat_bytes(int dtype, int64_t rows, int64_t cols);
/* Converts rows x cols f32 into dtype (deterministic: same input, same bytes). For Q4/Q8 the scale
 * of each group is chosen to minimise reconstruction error, not plain absmax. */
int csd_qmat_quantize(int dtype, const float *src, int64_t rows, int64_t cols, void *dst,
                      csd_err *err);
/* Expands one row back to f32 (embedding lookup, tests). */
void csd_qmat_dequant_row(const csd_qmat *w, int64_t row, float *out);

/* Scratch the matmul needs for n_tok activations of `cols` inputs (quantized activations). */
size_t csd_matmul_scratch_bytes(int64_t cols, int64_t n_tok);
/* y[t*rows + r] = sum_c W[r, c] * x[t*cols + c] for t in [0, n_tok). Runs on all pool threads.
 * scratch has csd_matmul_scratch_bytes(W->cols, n_tok) bytes. Results for one token do not depend
 * on n_tok (batch-invariant: a user's answer never depends on who else is in the batch). */
void csd_matmul(csd_pool *pool, const csd_qmat *w, const float *x, int64_t n_tok, float *y,
                void *scratch);

/* y[i] = w[i] x for n_mats matrices with the same input (q/k/v, gate/up), as one parallel job
 * with one quantization of x when they are all Q4/Q8 of the same cols (else one csd_matmul each).
 * scratch has csd_matmul_scratch_bytes(cols, n_tok) bytes. Same results as separate calls. */
void csd_matmul_multi(csd_pool *pool, const csd_qmat *const *w, int n_mats, const float *x,
                      int64_t n_tok, float *const *y, void *scratch);

/* Vector helpers for attention over an F32 KV cache (the F16 one goes through
 * csd_attend_f16_group), dispatched like the matmul. Each table sums in its own fixed order (the
 * result depends only on the inputs and n, never on threads or batch); tables differ from each
 * other only by rounding. */
/* Returns sum_i a[i] * b[i]. */
float csd_dot_f32(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i] (the multiply-add may be fused). */
void csd_axpy_f32(float *y, float a, const float *x, int64_t n);
/* The softmax step of attention: att[t] = exp(att[t] - max) in place; returns 1 / sum. Every
 * attention path of a table uses its table's (same rounding on every path); tables differ by
 * their exp (libm's in ref, a vector polynomial within 2 ulp in avx2, avxvnni and avx512). */
float csd_attn_softmax(float *att, int64_t n, float max);
/* g[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)): the gated FFN's activation. */
void csd_silu_mul(float *g, const float *u, int64_t n);
/* out = x * rsqrt(mean(x^2) + eps) * w (LlamaRMSNorm); the sum of squares in double. out may be
 * x. */
void csd_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* Lanes of a one-token Q4/Q8 matvec driven from inside a caller's own pool job
 * (src/model/decode_step.c), with the same kernels, lanes and stealing as csd_matmul's decode
 * path: each thread sets its own lanes to a slice [begin, end) of the matrices' row blocks (one
 * after another, 16 rows a block), the job's threads meet at a barrier, then each calls
 * csd_lanes_work, which returns once every lane is empty and this thread's claimed blocks are
 * written. The plan may be set again once every thread has returned from it. */
typedef struct csd_lanes csd_lanes;
size_t csd_lanes_bytes(void); /* of a plan: allocate with csd_alloc (64-byte aligned) */
/* True when the current kernel table runs these matrices by lanes (Q4/Q8, equal cols). */
bool csd_lanes_fit(const csd_qmat *const *w, int n_mats);
void csd_lanes_own(csd_lanes *l, int ith, int64_t begin, int64_t end);
void csd_lanes_work(csd_lanes *l, const csd_qmat *const *w, int n_mats, float *const *y,
                    const uint8_t *act, int ith, int nth);
/* The first weights of a thread's lanes in its next plan, read into L2 while the thread waits at
 * the barriers before that matmul (memory is idle then: nothing streams during the norms,
 * attention and barriers between a decode step's matmuls). csd_lanes_ahead_set takes the
 * thread's slice [begin, end) as csd_lanes_own will (the plan need not be set yet) and the
 * matrices' row blocks one after another; csd_lanes_ahead_step asks for the next few lines of
 * each lane and returns false once the read-ahead is all asked for. Reads only, so a read-ahead
 * that goes unused costs nothing but bandwidth. */
#define CSD_LANES_AHEAD_STREAMS 2
typedef struct csd_lanes_ahead {
    const uint8_t *next[CSD_LANES_AHEAD_STREAMS], *end[CSD_LANES_AHEAD_STREAMS];
} csd_lanes_ahead;
void csd_lanes_ahead_set(csd_lanes_ahead *a, const csd_qmat *const *w, int64_t begin,
                         int64_t end);
void csd_lanes_ahead_clear(csd_lanes_ahead *a); /* nothing to read ahead */
bool csd_lanes_ahead_step(csd_lanes_ahead *a);
/* The Q8 activations of x for a Q4/Q8 matvec (kern/quant.h layout, act 64-byte aligned, of
 * csd_quant_act_stride(cols) bytes): what csd_matmul computes from x first. */
void csd_quantize_act(uint8_t *act, const float *x, int64_t cols);
/* Only groups [g0, g1) of them (x is the whole cols-wide input): a thread's share of an input
 * whose other groups other threads quantize. part: 64-byte aligned scratch of
 * csd_quant_act_stride(cols) bytes. Each group comes out as csd_quantize_act makes it. */
void csd_quantize_act_groups(uint8_t *act, const float *x, int64_t cols, int64_t g0, int64_t g1,
                             uint8_t *part);

/* Most parts csd_read_streams walks side by side. */
#define CSD_READ_STREAMS_MAX 4
/* Reads bytes (a multiple of 64 * streams) as `streams` equal parts walked side by side (1..4),
 * the way the matvec kernels walk weights, with the table's widest loads and software prefetch
 * (non-temporal when nta, as the matvec prefetches weights; else into L1/L2); returns a sum of the
 * data so the reads cannot be optimised away. For the bandwidth test of `cascadia bench`. */
uint64_t csd_read_streams(const uint8_t *p, size_t bytes, int streams, bool nta);
/* Attention of g query heads that share one K/V head (grouped-query attention; g = 1 for plain
 * multi-head) over n cached positions whose f16 K and V rows are ld halves apart: for each head h,
 * out[h hd .. (h+1) hd) = sum_t p[t] v_t with p = softmax(scale * q_h . k_t). q and out hold g
 * rows of hd floats, att g * n floats of scratch. Each head's output is bit-identical to the same
 * call with that head alone, and depends only on the inputs (never on threads or batch); tables
 * with a fused kernel read each K/V row once for several heads instead of once per head. */
void csd_attend_f16_group(float *out, const float *q, int64_t g, const uint16_t *k,
                          const uint16_t *v, int64_t ld, int64_t n, int64_t hd, float scale,
                          float *att);
/* out[i] = half(in[i]), round to nearest even; bit-identical to csd_f32_to_f16 in every table
 * (NaN payloads aside). */
void csd_f32_to_f16_vec(uint16_t *out, const float *in, int64_t n);

#endif
