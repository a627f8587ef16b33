/* x86_avx512: AVX-512 F/BW/VL/DQ + VNNI kernels (built with their own -m flags, called only when
 * dispatch.c has checked the CPU). Q4/Q8 matmul: vpdpbusd of unsigned weights (q + 8, q + 128)
 * by signed int8 activations, the offset removed through the group sum of the activations.
 * Tiles of several rows x tokens load each weight group once for several tokens. Every
 * output element is computed by the same operation sequence whatever the tile it falls in. */
#include "kern_internal.h"

#include <assert.h>
#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "core/dtype.h"
#include "quant.h"

#define AI static inline __attribute__((always_inline))

/* Float tiles (kern_internal.h): CSD_F_TILE_R x CSD_F_TILE_T = 16 zmm accumulators + 8 weight
 * vectors + temporaries; one token takes CSD_F_MV_R = 8 rows, twice the independent streams in
 * flight per thread. */
/* Float matvec: software prefetch of the same lines PF_TILES row tiles ahead: each row of a tile
 * is a stream of only ~16-44 lines, too short for the hardware prefetcher alone. Non-temporal for
 * one token (each weight read once), into L1/L2 when later token tiles read the rows again. */
#define PF_TILES 1
/* Q tiles: a block is one contiguous stream; prefetch this far ahead of the load. Also the
 * default distance of the one-token streams and the bandwidth read (the table's mv_pf_ahead). */
#ifndef PF_AHEAD
#define PF_AHEAD 2048
#endif

/* Fixed-order horizontal sum (the same tree for every element: batch invariance). */
AI float hsum(__m512 v) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4);
}

AI __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

static void avx512_quantize_act_q8(uint8_t *act, const float *x, int64_t cols) {
    int64_t ng = csd_quant_groups(cols);
    int8_t *xq = (int8_t *)act;
    float *dx = (float *)(void *)(act + ng * CSD_QUANT_GROUP);
    int32_t *sums = (int32_t *)(void *)(dx + ng);
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * CSD_QUANT_GROUP;
        __m512 v[8];
        __m512 mx = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int k = 0; k < 8; k++) {
            int64_t left = cols - c0 - 16 * k;
            v[k] = left > 0 ? _mm512_maskz_loadu_ps(tail_mask(left), x + c0 + 16 * k)
                            : _mm512_setzero_ps();
            __m512 a = _mm512_and_ps(v[k], absmask);
            bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ); /* NaN or infinite */
            mx = _mm512_max_ps(mx, a);
        }
        if (bad) {
            csd_act_group_bad(xq + c0, &dx[g], &sums[g]);
            continue;
        }
        float amax = _mm512_reduce_max_ps(mx); /* max is exact: order does not matter */
        __m512 inv = _mm512_set1_ps(csd_act_group_inv(amax));
        __m512i sum = _mm512_setzero_si512();
        const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
        for (int k = 0; k < 8; k++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v[k], inv)); /* nearest even */
            q = _mm512_max_epi32(_mm512_min_epi32(q, lim), nlim);
            sum = _mm512_add_epi32(sum, q);
            _mm_storeu_si128((__m128i *)(void *)(xq + c0 + 16 * k), _mm512_cvtepi32_epi8(q));
        }
        dx[g] = amax / 127.0f;
        sums[g] = _mm512_reduce_add_epi32(sum); /* integer: exact */
    }
}

/* Most tokens in one Q tile: T float + T int accumulators + unpacked weights fit 32 zmm. */
#define QT_MAX 8

/* acc + vpdpbusd(w, x[0..3] in every 32-bit lane): 4 activation bytes (inputs 4k..4k+3 of a
 * token) times 4 unsigned weights per lane. The broadcast is the instruction's own {1to16} memory
 * operand. Written as an intrinsic, GCC and clang keep each broadcast in a register for the
 * streams or tokens sharing it: one more instruction per 64 weight bytes, and decode is bound by
 * the instructions between its loads (measured in one process, token by token: -2.3 to -3.5%
 * token time without them). */
AI __m512i dpbusd_x4(__m512i acc, __m512i w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int8_t(*)[4])x));
    return acc;
}

/* One 16-row block x T tokens of a Q4 (q4 = 1) or Q8 matmul (quant.h block layout). Each lane is
 * one row: vpdpbusd of 4 unsigned weights (q + 8, q + 128) by 4 broadcast activations advances 16
 * outputs, the offset is removed through the activation group sum (initial value of the integer
 * accumulator). With few tokens the group's integer sum is split over P independent chains
 * (integer adds: exact in any order); the float part is the same sequence for every T:
 * acc = fma(float(isum), dw * dx, acc), group by group. */
AI void q_block(const int T, const int q4, float *y, int64_t ldy, int nrows, const uint8_t *blk,
                const uint8_t *act, size_t stride, int64_t ng, int pf) {
    const int P = T >= 4 ? 1 : 4 / T; /* integer chains per token */
    const int dtype = q4 ? CSD_DTYPE_Q4 : CSD_DTYPE_Q8;
    const int32_t off = q4 ? -8 : -128;
    const __m512i low4 = _mm512_set1_epi8(0x0f), high4 = _mm512_set1_epi8((char)0xf0);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const int8_t *xq[QT_MAX];
    const float *dx[QT_MAX];
    const int32_t *sums[QT_MAX];
    __m512 acc[QT_MAX];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        xq[t] = (const int8_t *)(act + (size_t)t * stride);
        dx[t] = (const float *)(const void *)(xq[t] + ng * CSD_QUANT_GROUP);
        sums[t] = (const int32_t *)(const void *)(dx[t] + ng);
        acc[t] = _mm512_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = blk + csd_quant_group_offset(dtype, g);
        __m256i dw = _mm256_loadu_si256(
            (const __m256i *)(const void *)csd_quant_group_scales(dtype, blk, g));
        if (pf) csd_q_prefetch_pair_gap(wg, dtype, g, PF_AHEAD, pf);
        __m512i is[QT_MAX][4], ih[QT_MAX][4]; /* ih: Q4 high nibbles, kept x16 (no shift) */
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            is[t][0] = _mm512_set1_epi32(off * sums[t][g]);
#pragma GCC unroll 4
            for (int p = 1; p < P; p++) is[t][p] = _mm512_setzero_si512();
            if (q4) { /* not `p < P && q4`: GCC at -O0 cannot unroll that loop */
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) ih[t][p] = _mm512_setzero_si512();
            }
        }
        if (q4) {
#pragma GCC unroll 16
            for (int k = 0; k < CSD_QUANT_GROUP / 8; k++) {
                if (pf) CSD_PREFETCH_WEIGHTS(wg + 64 * k + PF_AHEAD, pf);
                __m512i v = _mm512_loadu_si512(wg + 64 * k);
                __m512i lo = _mm512_and_si512(v, low4), hi16 = _mm512_and_si512(v, high4);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const int8_t *xg = xq[t] + g * CSD_QUANT_GROUP;
                    is[t][k % P] = dpbusd_x4(is[t][k % P], lo, xg + 4 * k);
                    ih[t][k % P] = dpbusd_x4(ih[t][k % P], hi16, xg + 64 + 4 * k);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
#pragma GCC unroll 4
                for (int p = 1; p < P; p++) ih[t][0] = _mm512_add_epi32(ih[t][0], ih[t][p]);
                is[t][0] = _mm512_add_epi32(is[t][0], _mm512_srai_epi32(ih[t][0], 4)); /* exact */
            }
        } else {
#pragma GCC unroll 32
            for (int k = 0; k < CSD_QUANT_GROUP / 4; k++) {
                if (pf) CSD_PREFETCH_WEIGHTS(wg + 64 * k + PF_AHEAD, pf);
                __m512i v = _mm512_xor_si512(_mm512_loadu_si512(wg + 64 * k), flip);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    int p = k % P;
                    is[t][p] = dpbusd_x4(is[t][p], v, xq[t] + g * CSD_QUANT_GROUP + 4 * k);
                }
            }
        }
        __m512 dwv = _mm512_cvtph_ps(dw);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512i isum = is[t][0];
#pragma GCC unroll 4
            for (int p = 1; p < P; p++) isum = _mm512_add_epi32(isum, is[t][p]);
            __m512 sc = _mm512_mul_ps(dwv, _mm512_set1_ps(dx[t][g]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[t]);
        }
    }
    const __mmask16 m = tail_mask(nrows);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * ldy, m, acc[t]);
}

typedef csd_q_block_fn q_block_fn;

#define DEF_Q_BLOCKS(name, q4)                                                             \
    CSD_DEF_Q_BLOCK(name, q4, 1) CSD_DEF_Q_BLOCK(name, q4, 2) CSD_DEF_Q_BLOCK(name, q4, 3)   \
    CSD_DEF_Q_BLOCK(name, q4, 4) CSD_DEF_Q_BLOCK(name, q4, 5) CSD_DEF_Q_BLOCK(name, q4, 6)   \
    CSD_DEF_Q_BLOCK(name, q4, 7) CSD_DEF_Q_BLOCK(name, q4, 8)                                \
    static const q_block_fn name[QT_MAX] = {name##_1, name##_2, name##_3, name##_4,          \
                                            name##_5, name##_6, name##_7, name##_8};

DEF_Q_BLOCKS(blocks_q4, 1)
DEF_Q_BLOCKS(blocks_q8, 0)

/* Matvec over S blocks far apart at once: S weight streams per thread. Same per-output float
 * sequence as q_block; only the exact integer part is split differently. */
AI void q_streams(const int S, const int q4, float *const *y, const int *nrows,
                  const uint8_t *const *blk, const uint8_t *act, int64_t ng, size_t ahead) {
    const int dtype = q4 ? CSD_DTYPE_Q4 : CSD_DTYPE_Q8;
    const int32_t off = q4 ? -8 : -128;
    const __m512i low4 = _mm512_set1_epi8(0x0f), high4 = _mm512_set1_epi8((char)0xf0);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const int8_t *xq = (const int8_t *)act;
    const float *dx = (const float *)(const void *)(xq + ng * CSD_QUANT_GROUP);
    const int32_t *sums = (const int32_t *)(const void *)(dx + ng);
    __m512 acc[CSD_MV_STREAMS];
#pragma GCC unroll 4
    for (int i = 0; i < S; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const int8_t *xg = xq + g * CSD_QUANT_GROUP;
        __m512i ia[CSD_MV_STREAMS], ib[CSD_MV_STREAMS];
        __m256i dw[CSD_MV_STREAMS];
        const uint8_t *wg[CSD_MV_STREAMS], *pa[CSD_MV_STREAMS];
#pragma GCC unroll 4
        for (int i = 0; i < S; i++) {
            wg[i] = blk[i] + csd_quant_group_offset(dtype, g);
            pa[i] = wg[i] + ahead; /* the group's prefetch address (kern_internal.h) */
            CSD_OPAQUE_PTR(pa[i]);
            /* the scale line came with the stream, just before the pair's weights */
            dw[i] = _mm256_loadu_si256(
                (const __m256i *)(const void *)csd_quant_group_scales(dtype, blk[i], g));
            csd_q_prefetch_pair_gap(wg[i], dtype, g, ahead, CSD_PF_ONCE);
            ia[i] = _mm512_set1_epi32(off * sums[g]);
            ib[i] = _mm512_setzero_si512();
        }
        if (q4) {
#pragma GCC unroll 16
            for (int k = 0; k < CSD_QUANT_GROUP / 8; k++) {
#pragma GCC unroll 4
                for (int i = 0; i < S; i++) {
                    CSD_PREFETCH_WEIGHTS(pa[i] + 64 * k, CSD_PF_ONCE);
                    __m512i v = _mm512_loadu_si512(wg[i] + 64 * k);
                    ia[i] = dpbusd_x4(ia[i], _mm512_and_si512(v, low4), xg + 4 * k);
                    ib[i] = dpbusd_x4(ib[i], _mm512_and_si512(v, high4), xg + 64 + 4 * k); /* x16 */
                }
            }
        } else {
#pragma GCC unroll 16
            for (int k = 0; k < CSD_QUANT_GROUP / 4; k += 2) {
#pragma GCC unroll 4
                for (int i = 0; i < S; i++) {
                    const uint8_t *p = wg[i] + 64 * k;
                    CSD_PREFETCH_WEIGHTS(pa[i] + 64 * k, CSD_PF_ONCE);
                    CSD_PREFETCH_WEIGHTS(pa[i] + 64 * k + 64, CSD_PF_ONCE);
                    ia[i] =
                        dpbusd_x4(ia[i], _mm512_xor_si512(_mm512_loadu_si512(p), flip), xg + 4 * k);
                    ib[i] = dpbusd_x4(ib[i], _mm512_xor_si512(_mm512_loadu_si512(p + 64), flip),
                                      xg + 4 * k + 4);
                }
            }
        }
        __m512 dxv = _mm512_set1_ps(dx[g]);
#pragma GCC unroll 4
        for (int i = 0; i < S; i++) {
            __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(dw[i]), dxv);
            __m512i hi = q4 ? _mm512_srai_epi32(ib[i], 4) : ib[i]; /* exact: a multiple of 16 */
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ia[i], hi)), sc, acc[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < S; i++) _mm512_mask_storeu_ps(y[i], tail_mask(nrows[i]), acc[i]);
}

CSD_DEF_Q_STREAM_TABLES

static void avx512_matmul_q4_q8(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                                int64_t r0, int64_t r1) {
    csd_q_blocks_run(blocks_q4, QT_MAX, y, w, act, n_tok, r0, r1);
}

static void avx512_matmul_q8_q8(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                                int64_t r0, int64_t r1) {
    csd_q_blocks_run(blocks_q8, QT_MAX, y, w, act, n_tok, r0, r1);
}

/* Float weights: 16 columns at a time, f16 via vcvtph2ps, bf16 by a 16-bit shift. */
enum { WF32, WF16, WBF16 };

AI __m512 load_w16(const int kind, const void *row, int64_t c, __mmask16 m) {
    if (kind == WF32) return _mm512_maskz_loadu_ps(m, (const float *)row + c);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + c);
    if (kind == WF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AI void f_tile(const int R, const int T, const int kind, float *y, int64_t ldy, const uint8_t *row0,
               size_t row_bytes, const float *x, int64_t ldx, int64_t cols) {
    __m512 acc[CSD_F_MV_R][CSD_F_TILE_T];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 16) {
        __mmask16 m = tail_mask(cols - c);
        __m512 wv[CSD_F_MV_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const uint8_t *p = row0 + (size_t)r * row_bytes;
            CSD_PREFETCH_WEIGHTS(p + PF_TILES * R * row_bytes + c * (kind == WF32 ? 4 : 2),
                                 T == 1 ? CSD_PF_ONCE : CSD_PF_REUSED);
            wv[r] = load_w16(kind, p, c, m);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + t * ldx + c);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum(acc[r][t]);
}

CSD_DEF_MATMUL_F_TILED(avx512_matmul)

/* Dot products: 4 accumulators over 64 elements, masked tail, fixed combination order. */
AI float dot_any(const int f16, const float *a, const void *b, int64_t n) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512 bv = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((
                                  const __m256i *)(const void *)((const uint16_t *)b + i + 16 * k)))
                            : _mm512_loadu_ps((const float *)b + i + 16 * k);
            acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * k), bv, acc[k]);
        }
    }
    for (int k = 0; i < n; i += 16, k++) {
        __mmask16 m = tail_mask(n - i);
        __m512 bv = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)b + i))
                        : _mm512_maskz_loadu_ps(m, (const float *)b + i);
        acc[k] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), bv, acc[k]);
    }
    return hsum(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

static float avx512_dot_f32(const float *a, const float *b, int64_t n) {
    return dot_any(0, a, b, n);
}

static float avx512_dot_f32_f16(const float *a, const uint16_t *b, int64_t n) {
    return dot_any(1, a, b, n);
}

static void avx512_axpy_f32(float *y, float a, const float *x, int64_t n) {
    __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 yv = _mm512_maskz_loadu_ps(m, y + i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), yv));
    }
}

static void avx512_axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, xv, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* exp(x) for 16 floats, within 2 ulp over the whole float range: x = n ln2 + r with |r| <= ln2/2
 * (ln2 split in two so n ln2 is exact), exp(r) by the Cephes degree-6 polynomial, 2^n by
 * scalef (which also gives 0 below -104 and inf above 88.7). NaN stays NaN. */
AI __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x); /* the max returns x when x is NaN */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(CSD_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(CSD_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(CSD_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(CSD_EXP_P5);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CSD_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CSD_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CSD_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CSD_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CSD_EXP_P0));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* The sum runs in 16 float lanes, then in double across them: a fixed order for every n. */
static float avx512_softmax(float *att, int64_t n, float max) {
    __m512 mx = _mm512_set1_ps(max), sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t += 16) {
        __mmask16 m = tail_mask(n - t);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, att + t), mx));
        _mm512_mask_storeu_ps(att + t, m, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, sum);
    double total = 0.0;
    for (int i = 0; i < 16; i++) total += lanes[i];
    return (float)(1.0 / total);
}

/* The bandwidth test's read: 64-byte loads over S parts side by side, prefetched as far ahead
 * as the matvec kernels prefetch, with the hint pf (CSD_PF_ONCE or CSD_PF_REUSED). S is a
 * constant so the sums stay in registers (with S a variable they went through the stack, and one
 * stream read at half the speed of the same loop with S = 1 known). */
AI uint64_t read_streams(const int pf, const int S, const uint8_t *p, size_t bytes, size_t ahead) {
    size_t part = bytes / (size_t)S / 64 * 64;
    __m512i acc[CSD_READ_STREAMS_MAX];
#pragma GCC unroll 4
    for (int s = 0; s < S; s++) acc[s] = _mm512_setzero_si512();
    for (size_t o = 0; o < part; o += 64)
#pragma GCC unroll 4
        for (int s = 0; s < S; s++) {
            const uint8_t *a = p + (size_t)s * part + o;
            CSD_PREFETCH_WEIGHTS(a + ahead, pf);
            acc[s] = _mm512_add_epi64(acc[s], _mm512_loadu_si512(a));
        }
#pragma GCC unroll 4
    for (int s = 1; s < S; s++) acc[0] = _mm512_add_epi64(acc[0], acc[s]);
    /* summed as unsigned: the intrinsic's reduction adds signed lanes, which overflow (UB) */
    uint64_t lanes[8], sum = 0;
    _mm512_storeu_si512((void *)lanes, acc[0]);
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}

CSD_DEF_READ_STREAMS(avx512_read_streams)

/* Squares summed in 2 x 8 double lanes (a fixed order), then across them; the scaling is the
 * same float sequence per element as ref's. */
static void avx512_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi =
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    double lanes[8], ss = 0.0;
    _mm512_storeu_pd(lanes, _mm512_add_pd(s0, s1));
    for (int i = 0; i < 8; i++) ss += lanes[i];
    __m512 scale = _mm512_set1_ps((float)(1.0 / sqrt(ss / (double)n + (double)eps)));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

static void avx512_silu_mul(float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 s =
            _mm512_div_ps(x, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* Fused attention of one head: q (NV chunks of 16, the last one masked) stays in registers for
 * the scores, the output accumulates in registers over the positions. hd <= 256. */
AI void attend_nv(const int NV, float *out, const float *q, const uint16_t *k, const uint16_t *v,
                  int64_t ld, int64_t n, int64_t hd, float scale, float *att) {
    __m512 qv[16], o[16];
    __mmask16 m[16];
#pragma GCC unroll 16
    for (int j = 0; j < NV; j++) {
        m[j] = tail_mask(hd - 16 * j);
        qv[j] = _mm512_maskz_loadu_ps(m[j], q + 16 * j);
        o[j] = _mm512_setzero_ps();
    }
    float max = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *kt = k + t * ld;
        __m512 acc = _mm512_mul_ps(qv[0], _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[0], kt)));
#pragma GCC unroll 16
        for (int j = 1; j < NV; j++)
            acc = _mm512_fmadd_ps(
                qv[j], _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[j], kt + 16 * j)), acc);
        float s = hsum(acc) * scale;
        att[t] = s;
        max = s > max ? s : max;
    }
    float inv = avx512_softmax(att, n, max);
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *vt = v + t * ld;
        __m512 p = _mm512_set1_ps(att[t] * inv);
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++)
            o[j] = _mm512_fmadd_ps(p, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[j], vt + 16 * j)),
                                   o[j]);
    }
#pragma GCC unroll 16
    for (int j = 0; j < NV; j++) _mm512_mask_storeu_ps(out + 16 * j, m[j], o[j]);
}

/* Sixteen horizontal sums at once: lane L of the result is the sum of the 16 lanes of the vector
 * in slot REDUCE16_SLOT[L]. Each lane goes through exactly hsum's tree (halves of 256, 128, then
 * lanes 0+2 / 1+3, then the pair), so the sums are bit-identical to sixteen hsum calls for a third
 * of the instructions and none of hsum's long dependency chain. */
static const int REDUCE16_SLOT[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
AI __m512 reduce16(const __m512 *a) {
    __m512 x[8], y[4], z[2];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[k], a[k + 8], 0x44),
                             _mm512_shuffle_f32x4(a[k], a[k + 8], 0xEE));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        y[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x[k], x[k + 4], 0x88),
                             _mm512_shuffle_f32x4(x[k], x[k + 4], 0xDD));
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++)
        z[k] = _mm512_add_ps(_mm512_shuffle_ps(y[k], y[k + 2], 0x44),
                             _mm512_shuffle_ps(y[k], y[k + 2], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xDD));
}

/* att[t] *= inv over n positions: a head's probabilities, the same float product attend_nv forms
 * per position (p = att * inv), formed once so that the value passes take them straight from
 * memory as broadcasts. */
static inline void scale_probs(float *att, int64_t n, float inv) {
    const __m512 iv = _mm512_set1_ps(inv);
    for (int64_t t = 0; t < n; t += 16) {
        __mmask16 m = tail_mask(n - t);
        _mm512_mask_storeu_ps(att + t, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, att + t), iv));
    }
}

/* The scores of g heads sharing one K/V head, 16 positions per step: each block of K rows is
 * converted to floats once for all g heads. Per head and position the operations are attend_nv's
 * (q . k by one multiply and NV - 1 FMAs, hsum's tree through reduce16, times scale), then the same
 * softmax, then the probabilities: att[h * n + t] = exp(score - max) * (1 / sum). */
#define ATTN_BLOCK 16
AI void attend_scores(const int NV, const float *q, int64_t g, const uint16_t *k, int64_t ld,
                      int64_t n, int64_t hd, float scale, float *att) {
    __m512 blk[ATTN_BLOCK][8];
    __mmask16 m[8];
    const __m512 scalev = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) m[j] = tail_mask(hd - 16 * j);
    for (int64_t t0 = 0; t0 < n; t0 += ATTN_BLOCK) {
        int nt = n - t0 < ATTN_BLOCK ? (int)(n - t0) : ATTN_BLOCK;
        for (int i = 0; i < ATTN_BLOCK; i++) { /* the block's K rows (zeros past the end) */
            const uint16_t *row = k + (t0 + i) * ld;
            if (i < nt && t0 + i + CSD_ATTN_PF_ROWS < n)
                csd_attn_prefetch_row(row + CSD_ATTN_PF_ROWS * ld, hd);
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++)
                blk[i][j] = i < nt ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[j], row + 16 * j))
                                   : _mm512_setzero_ps();
        }
        __mmask16 valid = tail_mask(nt);
        for (int64_t h = 0; h < g; h++) {
            __m512 qv[8], acc[ATTN_BLOCK];
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++) qv[j] = _mm512_maskz_loadu_ps(m[j], q + h * hd + 16 * j);
#pragma GCC unroll 16
            for (int s = 0; s < ATTN_BLOCK; s++) {
                const __m512 *kr = blk[REDUCE16_SLOT[s]];
                acc[s] = _mm512_mul_ps(qv[0], kr[0]);
#pragma GCC unroll 8
                for (int j = 1; j < NV; j++) acc[s] = _mm512_fmadd_ps(qv[j], kr[j], acc[s]);
            }
            _mm512_mask_storeu_ps(att + h * n + t0, valid, _mm512_mul_ps(reduce16(acc), scalev));
        }
    }
    for (int64_t h = 0; h < g; h++) {
        __m512 mx = _mm512_set1_ps(-INFINITY); /* a maximum is exact in any order */
        for (int64_t t = 0; t < n; t += 16)
            mx = _mm512_mask_max_ps(mx, tail_mask(n - t),
                                    _mm512_maskz_loadu_ps(tail_mask(n - t), att + h * n + t), mx);
        scale_probs(att + h * n, n, avx512_softmax(att + h * n, n, _mm512_reduce_max_ps(mx)));
    }
}

/* The outputs of exactly H heads (H * NV <= 16), held in registers over all positions; each V
 * row is converted once and used for the H heads from registers. The fast path for the common
 * shapes (4 heads of 64, 2 of 128). Per head: o = fma(p, v, o) in position order, as attend_nv,
 * with p = att * inv already formed (attend_scores). */
AI void attend_values_regs(const int NV, const int H, float *out, const uint16_t *v, int64_t ld,
                           int64_t n, int64_t hd, const float *p) {
    __m512 o[16], vr[8];
    __mmask16 m[8];
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) m[j] = tail_mask(hd - 16 * j);
#pragma GCC unroll 16
    for (int i = 0; i < H * NV; i++) o[i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t++) {
        if (t + CSD_ATTN_PF_ROWS < n) csd_attn_prefetch_row(v + (t + CSD_ATTN_PF_ROWS) * ld, hd);
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++)
            vr[j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[j], v + t * ld + 16 * j));
#pragma GCC unroll 4
        for (int h = 0; h < H; h++) {
            __m512 ph = _mm512_set1_ps(p[h * n + t]);
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++) o[h * NV + j] = _mm512_fmadd_ps(ph, vr[j], o[h * NV + j]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < H; h++)
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++)
            _mm512_mask_storeu_ps(out + h * hd + 16 * j, m[j], o[h * NV + j]);
}

/* The outputs of any number of heads: 16 V rows converted per step, then each head's output
 * loaded, advanced over them and stored back. Same per-head operations as attend_values_regs. */
AI void attend_values(const int NV, float *out, int64_t g, const uint16_t *v, int64_t ld, int64_t n,
                      int64_t hd, const float *p) {
    __m512 blk[ATTN_BLOCK][8];
    __mmask16 m[8];
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) m[j] = tail_mask(hd - 16 * j);
    for (int64_t h = 0; h < g; h++)
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++)
            _mm512_mask_storeu_ps(out + h * hd + 16 * j, m[j], _mm512_setzero_ps());
    for (int64_t t0 = 0; t0 < n; t0 += ATTN_BLOCK) {
        int nt = n - t0 < ATTN_BLOCK ? (int)(n - t0) : ATTN_BLOCK;
        for (int i = 0; i < nt; i++) {
            const uint16_t *row = v + (t0 + i) * ld;
            if (t0 + i + CSD_ATTN_PF_ROWS < n)
                csd_attn_prefetch_row(row + CSD_ATTN_PF_ROWS * ld, hd);
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++)
                blk[i][j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[j], row + 16 * j));
        }
        for (int64_t h = 0; h < g; h++) {
            __m512 o[8];
            float *oh = out + h * hd;
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++) o[j] = _mm512_maskz_loadu_ps(m[j], oh + 16 * j);
            for (int i = 0; i < nt; i++) {
                __m512 ph = _mm512_set1_ps(p[h * n + t0 + i]);
#pragma GCC unroll 8
                for (int j = 0; j < NV; j++) o[j] = _mm512_fmadd_ps(ph, blk[i][j], o[j]);
            }
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++) _mm512_mask_storeu_ps(oh + 16 * j, m[j], o[j]);
        }
    }
}

/* Fused attention of the g heads sharing one K/V head: the scores, then the outputs, each block
 * of K and V rows converted once for all the heads (for the common shapes, each V row used from
 * registers for a pass of heads). Per head the operations are attend_nv's, so the outputs are
 * bit-identical to it. */
AI void attend_group_nv(const int NV, float *out, const float *q, int64_t g, const uint16_t *k,
                        const uint16_t *v, int64_t ld, int64_t n, int64_t hd, float scale,
                        float *att) {
    attend_scores(NV, q, g, k, ld, n, hd, scale, att);
    int64_t h = 0;
    if (NV == 4) /* the common shapes: passes with the outputs in registers */
        for (; h + 4 <= g; h += 4)
            attend_values_regs(4, 4, out + h * hd, v, ld, n, hd, att + h * n);
    if (NV == 8)
        for (; h + 2 <= g; h += 2)
            attend_values_regs(8, 2, out + h * hd, v, ld, n, hd, att + h * n);
    if (h < g) attend_values(NV, out + h * hd, g - h, v, ld, n, hd, att + h * n);
}

/* Head sizes up to 128 (8 vectors); wider heads go one at a time through attend_nv. */
static bool avx512_attend_f16_group(float *out, const float *q, int64_t g, const uint16_t *k,
                                    const uint16_t *v, int64_t ld, int64_t n, int64_t hd,
                                    float scale, float *att) {
    int nv = hd > 0 ? (int)((hd + 15) / 16) : 0;
    if (g < 1 || g > CSD_ATTN_GROUP_MAX || nv < 1 || nv > 8) return false;
    switch (nv) { /* constant vector counts: q, the scores and the outputs stay in registers */
#define GROUP_CASE(nv_) \
    case nv_: attend_group_nv(nv_, out, q, g, k, v, ld, n, hd, scale, att); break;
        GROUP_CASE(1) GROUP_CASE(2) GROUP_CASE(3) GROUP_CASE(4)
        GROUP_CASE(5) GROUP_CASE(6) GROUP_CASE(7) GROUP_CASE(8)
#undef GROUP_CASE
    }
    return true;
}

static bool avx512_attend_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                              int64_t ld, int64_t n, int64_t hd, float scale, float *att) {
    /* constant chunk counts let the compiler keep q and out in zmm registers */
#define ATTEND_CASE(nv) \
    case nv: attend_nv(nv, out, q, k, v, ld, n, hd, scale, att); return true;
    switch (hd > 0 ? (hd + 15) / 16 : 0) {
        ATTEND_CASE(1) ATTEND_CASE(2) ATTEND_CASE(3) ATTEND_CASE(4) ATTEND_CASE(5) ATTEND_CASE(6)
        ATTEND_CASE(7) ATTEND_CASE(8) ATTEND_CASE(9) ATTEND_CASE(10) ATTEND_CASE(11)
        ATTEND_CASE(12) ATTEND_CASE(13) ATTEND_CASE(14) ATTEND_CASE(15) ATTEND_CASE(16)
    default: return false; /* hd > 256: composed from dot and axpy */
    }
#undef ATTEND_CASE
}

static void avx512_f32_to_f16(uint16_t *out, const float *in, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, in + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(out + i, m, h);
    }
}

const csd_kern_ops csd_kern_ops_avx512 = {
    .name = "avx512",
    .quantize_act_q8 = avx512_quantize_act_q8,
    .matmul_q4_q8 = avx512_matmul_q4_q8,
    .matmul_q8_q8 = avx512_matmul_q8_q8,
    .matvec_q4 = streams_q4,
    .matvec_q8 = streams_q8,
    .mv_pf_ahead = PF_AHEAD, /* measured on Zen 4: 1 KB, 1.5 KB and 4 KB were no faster */
    .matmul_f32_f32 = avx512_matmul_f32,
    .matmul_f16_f32 = avx512_matmul_f16,
    .matmul_bf16_f32 = avx512_matmul_bf16,
    .dot_f32 = avx512_dot_f32,
    .dot_f32_f16 = avx512_dot_f32_f16,
    .axpy_f32 = avx512_axpy_f32,
    .axpy_f16 = avx512_axpy_f16,
    .f32_to_f16 = avx512_f32_to_f16,
    .attend_f16 = avx512_attend_f16,
    .attend_f16_group = avx512_attend_f16_group,
    .softmax = avx512_softmax,
    .silu_mul = avx512_silu_mul,
    .rmsnorm = avx512_rmsnorm,
    .read_streams = avx512_read_streams,
};
