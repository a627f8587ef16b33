/* quant: f32 -> weight dtype conversion (with the per-group clipping search for Q4/Q8), sizes and
 * row dequantization. Portable scalar code: it runs once per model, not per token. The layouts are
 * in quant.h. Deterministic: the same input always gives the same bytes. */
#include "kern.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "quant.h"

size_t csd_qmat_bytes(int dtype, int64_t rows, int64_t cols) {
    if (dtype == CSD_DTYPE_Q4 || dtype == CSD_DTYPE_Q8)
        return (size_t)csd_quant_blocks(rows) * csd_quant_block_bytes(dtype, cols);
    return (size_t)rows * csd_quant_row_bytes(dtype, cols);
}

/* Start of the block holding row, and the row's lane in it. */
static uint8_t *block_of(int dtype, int64_t cols, const uint8_t *mat, int64_t row, int *lane) {
    *lane = (int)(row % CSD_QUANT_BLOCK_ROWS);
    return (uint8_t *)mat +
           (size_t)(row / CSD_QUANT_BLOCK_ROWS) * csd_quant_block_bytes(dtype, cols);
}

/* Byte offset, inside a block group, of input j (0..127) of lane r; for Q4 the nibble too. */
static size_t group_offset(int dtype, int r, int j, int *high) {
    int jj = dtype == CSD_DTYPE_Q4 ? j & 63 : j;
    *high = dtype == CSD_DTYPE_Q4 && j >= 64;
    return (size_t)(jj / 4) * CSD_QUANT_VEC_BYTES + (size_t)r * 4 + (size_t)(jj % 4);
}

void csd_quant_pack_group(int dtype, int64_t cols, uint8_t *mat, int64_t row, int64_t g,
                          const int8_t *q, uint16_t scale) {
    int r, high;
    uint8_t *blk = block_of(dtype, cols, mat, row, &r);
    uint8_t *grp = blk + csd_quant_group_offset(dtype, g);
    for (int j = 0; j < CSD_QUANT_GROUP; j++) {
        size_t o = group_offset(dtype, r, j, &high);
        if (dtype == CSD_DTYPE_Q8) grp[o] = (uint8_t)q[j];
        else grp[o] |= (uint8_t)((q[j] + 8) << (high ? 4 : 0));
    }
    uint16_t *sc = (uint16_t *)(void *)(blk + csd_quant_scale_offset(dtype, g));
    sc[r] = scale;
}

int csd_quant_get_q(int dtype, int64_t cols, const uint8_t *mat, int64_t row, int64_t c) {
    int r, high;
    const uint8_t *blk = block_of(dtype, cols, mat, row, &r);
    const uint8_t *grp = blk + csd_quant_group_offset(dtype, c / CSD_QUANT_GROUP);
    uint8_t b = grp[group_offset(dtype, r, (int)(c % CSD_QUANT_GROUP), &high)];
    return dtype == CSD_DTYPE_Q8 ? (int8_t)b : (high ? b >> 4 : b & 15) - 8;
}

uint16_t csd_quant_get_scale(int dtype, int64_t cols, const uint8_t *mat, int64_t row, int64_t g) {
    int r;
    const uint8_t *blk = block_of(dtype, cols, mat, row, &r);
    return csd_quant_group_scales(dtype, blk, g)[r];
}

/* Round half to even for |v| < 2^22 with plain float adds, branch-free (vectorises on SSE2). */
static inline float round_even_f(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return copysignf((fabsf(v) + magic) - magic, v);
}

static inline float clampf(float v, float lo, float hi) {
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

/* Lanes of the error sums: a fixed 8-way split the compiler can vectorise without reassociating
 * (the order of additions is the same on every machine, so the chosen scale is too). */
#define ERR_LANES 8

/* Weighted squared reconstruction error sum a_j (w_j - q_j d)^2 of one zero-padded group of 128 on
 * the grid d * [qmin, qmax] (padding contributes 0 for every d). */
static float grid_error(const float *w, const float *a, float d, float qmin, float qmax) {
    float inv = 1.0f / d, acc[ERR_LANES] = {0};
    for (int j = 0; j < CSD_QUANT_GROUP; j += ERR_LANES) {
        for (int k = 0; k < ERR_LANES; k++) {
            float q = clampf(round_even_f(w[j + k] * inv), qmin, qmax);
            float e = w[j + k] - q * d;
            acc[k] += a[j + k] * e * e;
        }
    }
    float err = 0.0f;
    for (int k = 0; k < ERR_LANES; k++) err += acc[k];
    return err;
}

/* d rounded through f16, the precision it is stored in. */
static float f16_round(float d) { return csd_f16_to_f32(csd_f32_to_f16(d)); }

/* Weighted least squares: with the assignment q of scale d fixed, d' = sum a w q / sum a q q
 * minimises the weighted error. Returns d' rounded to f16, 0 when there is none. */
static float refit_scale(const float *w, const float *a, float d, float qmin, float qmax) {
    float inv = 1.0f / d, wq_l[ERR_LANES] = {0}, qq_l[ERR_LANES] = {0}, wq = 0.0f, qq = 0.0f;
    for (int j = 0; j < CSD_QUANT_GROUP; j += ERR_LANES) {
        for (int k = 0; k < ERR_LANES; k++) {
            float q = clampf(round_even_f(w[j + k] * inv), qmin, qmax);
            wq_l[k] += a[j + k] * w[j + k] * q;
            qq_l[k] += a[j + k] * q * q;
        }
    }
    for (int k = 0; k < ERR_LANES; k++) {
        wq += wq_l[k];
        qq += qq_l[k];
    }
    float r = qq > 0.0f ? f16_round(wq / qq) : 0.0f;
    return isfinite(r) ? r : 0.0f;
}

/* Chooses the group scale by the lowest weighted error over a few candidates, each judged after
 * rounding d to f16: plain absmax d = amax / qmax (the baseline), then d = s * amax / t with s
 * chosen so the largest-magnitude weight lands on qmin's side (-8 for Q4 leaves 8 steps, not 7),
 * then one least-squares refit of d for the best assignment.
 * - Q4: t = 7, 7 1/6, ..., 8, so no candidate clips the extremes, and the error of weight j is
 *   weighted by (w_j / amax)^2 (in the refit too, which keeps the largest weights close). Measured
 *   on stories260K (docs/quality.md): clipping the largest weights, or weighting all errors
 *   equally, lowers the plain squared error but costs top-1 agreement with f32.
 * - Q8: t = 127 / c for c in {1, 0.95, 0.9, 0.85} (clipping by up to 15%), unweighted error.
 * Returns the f16 scale (0 for an all-zero group). */
static uint16_t choose_scale(const float *w, int qmin, int qmax) {
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < CSD_QUANT_GROUP; j++) {
        if (fabsf(w[j]) > amax) {
            amax = fabsf(w[j]);
            vmax = w[j];
        }
    }
    if (!(amax > 0.0f) || !isfinite(amax)) return 0;
    int q4 = qmin == -8;
    float fmin = (float)qmin, fmax = (float)qmax, a[CSD_QUANT_GROUP];
    for (int j = 0; j < CSD_QUANT_GROUP; j++) {
        float r = w[j] / amax; /* in [-1, 1]: no overflow or underflow to 0 for the largest */
        a[j] = q4 ? r * r : 1.0f;
    }
    /* Baseline: plain symmetric absmax, amax -> qmax. */
    float best_d = f16_round(amax / fmax);
    float best = best_d > 0.0f ? grid_error(w, a, best_d, fmin, fmax) : INFINITY;
    float sign = vmax > 0.0f ? -1.0f : 1.0f;
    static const float q8_clip[] = {1.0f, 0.95f, 0.9f, 0.85f};
    int n_cand = q4 ? 7 : (int)(sizeof q8_clip / sizeof q8_clip[0]);
    for (int k = 0; k < n_cand; k++) {
        float d = f16_round(q4 ? sign * amax / (7.0f + (float)k / 6.0f)
                               : sign * amax * q8_clip[k] / (float)-qmin);
        if (d == 0.0f || !isfinite(d)) continue;
        float e = grid_error(w, a, d, fmin, fmax);
        if (e < best) {
            best = e;
            best_d = d;
        }
    }
    if (best_d == 0.0f) return 0; /* below f16 range: the group quantizes to zero */
    float d = refit_scale(w, a, best_d, fmin, fmax);
    if (d != 0.0f && grid_error(w, a, d, fmin, fmax) < best) best_d = d;
    return csd_f32_to_f16(best_d);
}

/* Quantizes row `row` of a Q4/Q8 matrix into the block layout (the matrix is zeroed already). */
static void quantize_row_q(int dtype, const float *src, int64_t cols, uint8_t *mat, int64_t row) {
    int qmin = dtype == CSD_DTYPE_Q4 ? -8 : -127, qmax = dtype == CSD_DTYPE_Q4 ? 7 : 127;
    for (int64_t g = 0; g < csd_quant_groups(cols); g++) {
        int64_t c0 = g * CSD_QUANT_GROUP;
        int n = (int)(cols - c0 < CSD_QUANT_GROUP ? cols - c0 : CSD_QUANT_GROUP);
        float wg[CSD_QUANT_GROUP] = {0}; /* zero-padded group */
        memcpy(wg, src + c0, (size_t)n * sizeof(float));
        uint16_t dh = choose_scale(wg, qmin, qmax);
        float d = csd_f16_to_f32(dh);
        float inv = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t q[CSD_QUANT_GROUP] = {0}; /* missing weights of a short group are 0 */
        for (int j = 0; j < n; j++)
            q[j] = (int8_t)clampf(round_even_f(wg[j] * inv), (float)qmin, (float)qmax);
        csd_quant_pack_group(dtype, cols, mat, row, g, q, dh);
    }
}

/* The largest weight magnitude dtype stores: F16's and BF16's largest finite values, and for
 * Q4/Q8 what keeps a group's absmax scale (amax / qmax, itself an f16) finite. */
static float weight_limit(int dtype) {
    switch (dtype) {
    case CSD_DTYPE_F16: return 65504.0f;
    case CSD_DTYPE_BF16: return 0x1.FEp127f;
    case CSD_DTYPE_Q4: return 65504.0f * 7.0f;
    case CSD_DTYPE_Q8: return 65504.0f * 127.0f;
    default: return FLT_MAX;
    }
}

/* Every weight finite and within what dtype stores: one out of range would turn its group's scale
 * or its own value infinite, and the outputs that read it NaN. */
static int check_weights(int dtype, const float *src, int64_t rows, int64_t cols, csd_err *err) {
    float limit = weight_limit(dtype);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float v = src[r * cols + c];
            if (!(fabsf(v) <= limit))
                return csd_err_set(err, CSD_ERANGE,
                                   "the weight at row %lld, column %lld is %g, beyond what %s "
                                   "stores (magnitude at most %g); use a wider precision",
                                   (long long)r, (long long)c, (double)v, csd_dtype_name(dtype),
                                   (double)limit);
        }
    return 0;
}

int csd_qmat_quantize(int dtype, const float *src, int64_t rows, int64_t cols, void *dst,
                      csd_err *err) {
    if (rows < 0 || cols < 0)
        return csd_err_set(err, CSD_EINVAL, "quantize: bad shape %lld x %lld", (long long)rows,
                           (long long)cols);
    int rc = check_weights(dtype, src, rows, cols, err);
    if (rc) return rc;
    if (dtype == CSD_DTYPE_Q4 || dtype == CSD_DTYPE_Q8) {
        memset(dst, 0, csd_qmat_bytes(dtype, rows, cols));
        for (int64_t r = 0; r < rows; r++) quantize_row_q(dtype, src + r * cols, cols, dst, r);
        return 0;
    }
    size_t row_bytes = csd_quant_row_bytes(dtype, cols);
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * cols;
        uint8_t *d = (uint8_t *)dst + (size_t)r * row_bytes;
        switch (dtype) {
        case CSD_DTYPE_F32: memcpy(d, s, (size_t)cols * sizeof(float)); break;
        case CSD_DTYPE_F16: csd_f32_to_f16_row((uint16_t *)(void *)d, s, cols); break;
        case CSD_DTYPE_BF16:
            for (int64_t c = 0; c < cols; c++) ((uint16_t *)(void *)d)[c] = csd_f32_to_bf16(s[c]);
            break;
        default:
            return csd_err_set(err, CSD_EUNSUPPORTED, "quantize: dtype %d (%s)", dtype,
                               csd_dtype_name(dtype));
        }
    }
    return 0;
}

void csd_qmat_dequant_row(const csd_qmat *w, int64_t row, float *out) {
    if (w->dtype == CSD_DTYPE_Q4 || w->dtype == CSD_DTYPE_Q8) { /* e.g. an embedding lookup */
        int r, high;
        const uint8_t *blk = block_of(w->dtype, w->cols, w->data, row, &r);
        for (int64_t c = 0; c < w->cols; c++) {
            int64_t g = c / CSD_QUANT_GROUP;
            uint8_t b = blk[csd_quant_group_offset(w->dtype, g) +
                            group_offset(w->dtype, r, (int)(c % CSD_QUANT_GROUP), &high)];
            int q = w->dtype == CSD_DTYPE_Q8 ? (int8_t)b : (high ? b >> 4 : b & 15) - 8;
            out[c] = csd_f16_to_f32(csd_quant_group_scales(w->dtype, blk, g)[r]) * (float)q;
        }
        return;
    }
    const uint8_t *p =
        (const uint8_t *)w->data + (size_t)row * csd_quant_row_bytes(w->dtype, w->cols);
    switch (w->dtype) {
    case CSD_DTYPE_F32: memcpy(out, p, (size_t)w->cols * sizeof(float)); return;
    case CSD_DTYPE_F16: csd_f16_to_f32_row(out, (const uint16_t *)(const void *)p, w->cols); return;
    case CSD_DTYPE_BF16:
        csd_bf16_to_f32_row(out, (const uint16_t *)(const void *)p, w->cols);
        return;
    default: return;
    }
}
