/* ref: the portable scalar kernels. They ARE the spec: every ISA table must compute the same
 * values up to float summation order. Plain C, no intrinsics; built on every architecture. */
#include "kern_internal.h"

#include <float.h>
#include <math.h>

#include "core/dtype.h"
#include "quant.h"

/* Round to nearest, ties to even, like cvtps2dq under the default MXCSR, including its answer for
 * NaN and values out of range (INT32_MIN): a plain cast of those is undefined, and a NaN can
 * arrive in the hidden states a previous stage sends. */
static inline int32_t round_even(float v) {
    float r = nearbyintf(v);
    return r >= -2147483648.0f && r < 2147483648.0f ? (int32_t)r : INT32_MIN;
}

static void ref_quantize_act_q8(uint8_t *act, const float *x, int64_t cols) {
    int64_t ng = csd_quant_groups(cols);
    int8_t *xq = (int8_t *)act;
    float *dx = (float *)(void *)(act + ng * CSD_QUANT_GROUP);
    int32_t *sums = (int32_t *)(void *)(dx + ng);
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * CSD_QUANT_GROUP;
        int64_t n = cols - c0 < CSD_QUANT_GROUP ? cols - c0 : CSD_QUANT_GROUP;
        float amax = 0.0f;
        bool bad = false;
        for (int64_t j = 0; j < n; j++) {
            float a = fabsf(x[c0 + j]);
            bad |= !(a <= FLT_MAX);
            amax = fmaxf(amax, a);
        }
        if (bad) {
            csd_act_group_bad(xq + c0, &dx[g], &sums[g]);
            continue;
        }
        float inv = csd_act_group_inv(amax);
        int32_t sum = 0;
        for (int64_t j = 0; j < CSD_QUANT_GROUP; j++) {
            int32_t q = j < n ? round_even(x[c0 + j] * inv) : 0;
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            xq[c0 + j] = (int8_t)q;
            sum += q;
        }
        dx[g] = amax / 127.0f;
        sums[g] = sum;
    }
}

/* Unpacks group g of a Q4/Q8 block (quant.h layout) into q[lane][input]. */
static void unpack_block_group(int dtype, const uint8_t *grp, int8_t q[][CSD_QUANT_GROUP]) {
    int nvec = dtype == CSD_DTYPE_Q4 ? CSD_QUANT_GROUP / 8 : CSD_QUANT_GROUP / 4;
    for (int k = 0; k < nvec; k++) {
        const uint8_t *v = grp + (size_t)k * CSD_QUANT_VEC_BYTES;
        for (int r = 0; r < CSD_QUANT_BLOCK_ROWS; r++) {
            for (int i = 0; i < 4; i++) {
                uint8_t b = v[4 * r + i];
                if (dtype == CSD_DTYPE_Q4) {
                    q[r][4 * k + i] = (int8_t)((b & 15) - 8);
                    q[r][64 + 4 * k + i] = (int8_t)((b >> 4) - 8);
                } else {
                    q[r][4 * k + i] = (int8_t)b;
                }
            }
        }
    }
}

/* y = sum over groups of (dw * dx) * (integer dot of the group), groups in order. */
static void ref_matmul_q(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                         int64_t r0, int64_t r1) {
    int64_t ng = csd_quant_groups(w->cols);
    size_t block_bytes = csd_quant_block_bytes(w->dtype, w->cols);
    size_t stride = csd_quant_act_stride(w->cols);
    int8_t q[CSD_QUANT_BLOCK_ROWS][CSD_QUANT_GROUP];
    for (int64_t b0 = r0; b0 < r1; b0 += CSD_QUANT_BLOCK_ROWS) {
        const uint8_t *blk =
            (const uint8_t *)w->data + (size_t)(b0 / CSD_QUANT_BLOCK_ROWS) * block_bytes;
        int nr = (int)(r1 - b0 < CSD_QUANT_BLOCK_ROWS ? r1 - b0 : CSD_QUANT_BLOCK_ROWS);
        for (int64_t t = 0; t < n_tok; t++)
            for (int r = 0; r < nr; r++) y[t * w->rows + b0 + r] = 0.0f;
        for (int64_t g = 0; g < ng; g++) { /* each group unpacked once for all the tokens */
            unpack_block_group(w->dtype, blk + csd_quant_group_offset(w->dtype, g), q);
            const uint16_t *dw = csd_quant_group_scales(w->dtype, blk, g);
            for (int64_t t = 0; t < n_tok; t++) {
                const int8_t *xq = (const int8_t *)(act + (size_t)t * stride);
                const float *dx = (const float *)(const void *)(xq + ng * CSD_QUANT_GROUP);
                const int8_t *xg = xq + g * CSD_QUANT_GROUP;
                for (int r = 0; r < nr; r++) {
                    int32_t isum = 0;
                    for (int j = 0; j < CSD_QUANT_GROUP; j++) isum += (int32_t)q[r][j] * xg[j];
                    y[t * w->rows + b0 + r] += (csd_f16_to_f32(dw[r]) * dx[g]) *
                                               (float)isum;
                }
            }
        }
    }
}

static float load_elem(int dtype, const void *row, int64_t c) {
    if (dtype == CSD_DTYPE_F32) return ((const float *)row)[c];
    if (dtype == CSD_DTYPE_F16) return csd_f16_to_f32(((const uint16_t *)row)[c]);
    return csd_bf16_to_f32(((const uint16_t *)row)[c]);
}

/* y = sum over c in order of W[r, c] * x[c], in f32. */
static void ref_matmul_f(float *y, const csd_qmat *w, const float *x, int64_t ldx, int64_t n_tok,
                         int64_t r0, int64_t r1) {
    size_t row_bytes = csd_quant_row_bytes(w->dtype, w->cols);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * ldx;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
            float acc = 0.0f;
            for (int64_t c = 0; c < w->cols; c++) acc += load_elem(w->dtype, row, c) * xt[c];
            y[t * w->rows + r] = acc;
        }
    }
}

static float ref_dot_f32(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static float ref_dot_f32_f16(const float *a, const uint16_t *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * csd_f16_to_f32(b[i]);
    return acc;
}

static void ref_axpy_f32(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void ref_axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * csd_f16_to_f32(x[i]);
}

static void ref_f32_to_f16(uint16_t *out, const float *in, int64_t n) {
    csd_f32_to_f16_row(out, in, n);
}

static float ref_softmax(float *att, int64_t n, float max) {
    double sum = 0.0;
    for (int64_t t = 0; t < n; t++) {
        att[t] = expf(att[t] - max);
        sum += att[t];
    }
    return (float)(1.0 / sum);
}

static void ref_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void ref_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

/* Eight accumulators per line: no carried dependency between words. No software prefetch (the
 * portable path has none), so nta and ahead change nothing. */
static uint64_t ref_read_streams(const uint8_t *p, size_t bytes, int streams, bool nta,
                                 size_t ahead) {
    (void)nta;
    (void)ahead;
    size_t part = bytes / (size_t)streams / 64 * 64;
    uint64_t sum[8] = {0};
    for (size_t o = 0; o < part; o += 64)
        for (int s = 0; s < streams; s++) {
            const uint64_t *w = (const uint64_t *)(const void *)(p + (size_t)s * part + o);
            for (int k = 0; k < 8; k++) sum[k] += w[k];
        }
    return sum[0] + sum[1] + sum[2] + sum[3] + sum[4] + sum[5] + sum[6] + sum[7];
}

const csd_kern_ops csd_kern_ops_ref = {
    .name = "ref",
    .quantize_act_q8 = ref_quantize_act_q8,
    .matmul_q4_q8 = ref_matmul_q,
    .matmul_q8_q8 = ref_matmul_q,
    .matmul_f32_f32 = ref_matmul_f,
    .matmul_f16_f32 = ref_matmul_f,
    .matmul_bf16_f32 = ref_matmul_f,
    .dot_f32 = ref_dot_f32,
    .dot_f32_f16 = ref_dot_f32_f16,
    .axpy_f32 = ref_axpy_f32,
    .axpy_f16 = ref_axpy_f16,
    .f32_to_f16 = ref_f32_to_f16,
    .softmax = ref_softmax,
    .silu_mul = ref_silu_mul,
    .rmsnorm = ref_rmsnorm,
    .read_streams = ref_read_streams,
};
