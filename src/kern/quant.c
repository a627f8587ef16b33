/* quant: f32 -> weight dtype conversion (with the per-group clipping search for Q4/Q8), sizes and
 * row dequantization. Portable scalar code: it runs once per model, not per token. The layouts are
 * in quant.h. Deterministic: the same input always gives the same bytes. */
#include "kern.h"

#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "quant.h"

size_t csd_qmat_bytes(int dtype, int64_t rows, int64_t cols) {
    return (size_t)rows * csd_quant_row_bytes(dtype, cols);
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

/* Squared reconstruction error of one zero-padded group of 128 on the grid d * [qmin, qmax]
 * (padding contributes 0 for every d). */
static inline float grid_error(const float *w, float d, float qmin, float qmax) {
    float inv = 1.0f / d, acc[ERR_LANES] = {0};
    for (int j = 0; j < CSD_QUANT_GROUP; j += ERR_LANES) {
        for (int k = 0; k < ERR_LANES; k++) {
            float q = clampf(round_even_f(w[j + k] * inv), qmin, qmax);
            float e = w[j + k] - q * d;
            acc[k] += e * e;
        }
    }
    float err = 0.0f;
    for (int k = 0; k < ERR_LANES; k++) err += acc[k];
    return err;
}

/* d rounded through f16, the precision it is stored in. */
static float f16_round(float d) { return csd_f16_to_f32(csd_f32_to_f16(d)); }

/* EXPERIMENT */
#include <stdio.h>
#include <stdlib.h>
static int env_i(const char *n, int def) { const char *s = getenv(n); return s ? atoi(s) : def; }
static float env_f(const char *n, float def) { const char *s = getenv(n); return s ? (float)atof(s) : def; }

/* weighted error: a_j = |w|^pw */
static float werr(const float *w, const float *a, float d, float qmin, float qmax) {
    float inv = 1.0f / d, acc[ERR_LANES] = {0};
    for (int j = 0; j < CSD_QUANT_GROUP; j += ERR_LANES)
        for (int k = 0; k < ERR_LANES; k++) {
            float q = clampf(round_even_f(w[j + k] * inv), qmin, qmax);
            float e = w[j + k] - q * d;
            acc[k] += a[j + k] * e * e;
        }
    float err = 0.0f;
    for (int k = 0; k < ERR_LANES; k++) err += acc[k];
    return err;
}

static float wls(const float *w, const float *a, float d, float qmin, float qmax) {
    float inv = 1.0f / d, wq = 0, qq = 0;
    for (int j = 0; j < CSD_QUANT_GROUP; j++) {
        float q = clampf(round_even_f(w[j] * inv), qmin, qmax);
        wq += a[j] * w[j] * q;
        qq += a[j] * q * q;
    }
    return qq > 0 ? f16_round(wq / qq) : 0.0f;
}

static uint16_t choose_scale(const float *w, int qmin, int qmax) {
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < CSD_QUANT_GROUP; j++)
        if (fabsf(w[j]) > amax) { amax = fabsf(w[j]); vmax = w[j]; }
    if (!(amax > 0.0f) || !isfinite(amax)) return 0;
    int q8 = qmax >= 100;
    const char *pre = q8 ? "Q8_" : "Q4_";
    char nb[64];
#define P(x) (snprintf(nb, sizeof nb, "%s%s", pre, x), nb)
    int mode = env_i(P("MODE"), q8 ? 0 : 0);  /* 0 orig, 1 noclip range, 2 absmax only */
    int pw = env_i(P("PW"), 0);
    int ncand = env_i(P("N"), 8);
    int iters = env_i(P("IT"), 0);
    float lo = env_f(P("LO"), 7.0f), hi = env_f(P("HI"), 8.0f);
    float fb = env_f(P("FB"), 0.0f); /* fallback: require gain > fb fraction */
    float fmin = (float)qmin, fmax = (float)qmax;
    float a[CSD_QUANT_GROUP];
    for (int j = 0; j < CSD_QUANT_GROUP; j++)
        a[j] = pw == 0 ? 1.0f : pw == 1 ? fabsf(w[j]) : w[j] * w[j];
    float base_d = f16_round(amax / fmax);
    if (mode == 2) return csd_f32_to_f16(base_d);
    float base = base_d > 0.0f ? werr(w, a, base_d, fmin, fmax) : INFINITY;
    float best = base, best_d = base_d;
    float sign = vmax > 0.0f ? -1.0f : 1.0f;
    if (mode == 0) {
        static const float clip[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.75f, 0.7f};
        int n_clip = q8 ? 4 : 7;
        for (int k = 0; k < n_clip; k++) {
            float d = f16_round(sign * amax * clip[k] / (float)-qmin);
            if (d == 0.0f || !isfinite(d)) continue;
            float e = werr(w, a, d, fmin, fmax);
            if (e < best) { best = e; best_d = d; }
        }
        if (iters == 0) iters = 1;
    } else {
        float span_lo = q8 ? lo * 127.0f / 7.0f : lo, span_hi = q8 ? hi * 128.0f / 8.0f : hi;
        for (int k = 0; k < ncand; k++) {
            float t = ncand > 1 ? span_lo + (span_hi - span_lo) * (float)k / (float)(ncand - 1) : span_hi;
            float d = f16_round(sign * amax / t);
            if (d == 0.0f || !isfinite(d)) continue;
            float e = werr(w, a, d, fmin, fmax);
            if (e < best) { best = e; best_d = d; }
        }
    }
    if (best_d == 0.0f) return 0;
    for (int it = 0; it < iters; it++) {
        float d = wls(w, a, best_d, fmin, fmax);
        if (d == 0.0f || !isfinite(d)) break;
        float e = werr(w, a, d, fmin, fmax);
        if (e < best) { best = e; best_d = d; } else break;
    }
    if (fb > 0.0f && best > (1.0f - fb) * base) best_d = base_d;
    return csd_f32_to_f16(best_d);
#undef P
}

/* Quantizes one row into the quant.h row layout. */
static void quantize_row_q(int dtype, const float *src, int64_t cols, uint8_t *dst) {
    int64_t ng = csd_quant_groups(cols);
    size_t gbytes = csd_quant_group_bytes(dtype);
    int qmin = dtype == CSD_DTYPE_Q4 ? -8 : -127, qmax = dtype == CSD_DTYPE_Q4 ? 7 : 127;
    memset(dst, 0, csd_quant_row_bytes(dtype, cols));
    uint16_t *scales = (uint16_t *)(void *)(dst + (size_t)ng * gbytes);
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * CSD_QUANT_GROUP;
        int n = (int)(cols - c0 < CSD_QUANT_GROUP ? cols - c0 : CSD_QUANT_GROUP);
        float wg[CSD_QUANT_GROUP] = {0}; /* zero-padded group */
        memcpy(wg, src + c0, (size_t)n * sizeof(float));
        uint16_t dh = choose_scale(wg, qmin, qmax);
        float d = csd_f16_to_f32(dh);
        float inv = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t q[CSD_QUANT_GROUP] = {0}; /* missing weights of a short group are 0 */
        for (int j = 0; j < n; j++)
            q[j] = (int8_t)clampf(round_even_f(src[c0 + j] * inv), (float)qmin, (float)qmax);
        scales[g] = dh;
        uint8_t *out = dst + (size_t)g * gbytes;
        if (dtype == CSD_DTYPE_Q4) {
            for (int j = 0; j < 64; j++)
                out[j] = (uint8_t)((q[j] + 8) | ((q[j + 64] + 8) << 4));
        } else {
            memcpy(out, q, CSD_QUANT_GROUP);
        }
    }
}

int csd_qmat_quantize(int dtype, const float *src, int64_t rows, int64_t cols, void *dst,
                      csd_err *err) {
    if (rows < 0 || cols < 0)
        return csd_err_set(err, CSD_EINVAL, "quantize: bad shape %lld x %lld", (long long)rows,
                           (long long)cols);
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
        case CSD_DTYPE_Q4:
        case CSD_DTYPE_Q8: quantize_row_q(dtype, s, cols, d); break;
        default:
            return csd_err_set(err, CSD_EUNSUPPORTED, "quantize: dtype %d (%s)", dtype,
                               csd_dtype_name(dtype));
        }
    }
    return 0;
}

void csd_qmat_dequant_row(const csd_qmat *w, int64_t row, float *out) {
    const uint8_t *p =
        (const uint8_t *)w->data + (size_t)row * csd_quant_row_bytes(w->dtype, w->cols);
    switch (w->dtype) {
    case CSD_DTYPE_F32: memcpy(out, p, (size_t)w->cols * sizeof(float)); return;
    case CSD_DTYPE_F16: csd_f16_to_f32_row(out, (const uint16_t *)(const void *)p, w->cols); return;
    case CSD_DTYPE_BF16:
        csd_bf16_to_f32_row(out, (const uint16_t *)(const void *)p, w->cols);
        return;
    case CSD_DTYPE_Q4:
    case CSD_DTYPE_Q8: {
        const uint16_t *scales = csd_quant_row_scales(w->dtype, p, w->cols);
        for (int64_t c = 0; c < w->cols; c++) {
            int64_t g = c / CSD_QUANT_GROUP, j = c % CSD_QUANT_GROUP;
            int q;
            if (w->dtype == CSD_DTYPE_Q4) {
                uint8_t b = p[g * 64 + (j & 63)];
                q = (j < 64 ? (b & 15) : (b >> 4)) - 8;
            } else {
                q = ((const int8_t *)p)[g * CSD_QUANT_GROUP + j];
            }
            out[c] = csd_f16_to_f32(scales[g]) * (float)q;
        }
        return;
    }
    default: return;
    }
}
