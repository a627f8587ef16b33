/* x86_avx2: AVX2 + FMA + F16C kernels for x86 CPUs without AVX-512 (built with their own -m flags,
 * called only when dispatch.c has checked the CPU). The Q4/Q8 block matmul is x86_avx2_common.h
 * with the dot products below: Q4 vpmaddubsw of unsigned nibbles (q + 8) by signed activations,
 * offset removed through the activation group sum; Q8 vpmaddubsw of |w| by sign(w) * x. Same
 * fixed per-element operation order in every tile (batch invariance). */
#include "x86_avx2_common.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/dtype.h"

AI float hsum8(__m256 v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4);
}

AI int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static void avx2_quantize_act_q8(uint8_t *act, const float *x, int64_t cols) {
    int64_t ng = csd_quant_groups(cols);
    int8_t *xq = (int8_t *)act;
    float *dx = (float *)(void *)(act + ng * CSD_QUANT_GROUP);
    int32_t *sums = (int32_t *)(void *)(dx + ng);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * CSD_QUANT_GROUP;
        __m256 v[16];
        __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int k = 0; k < 16; k++) {
            int64_t left = cols - c0 - 8 * k;
            v[k] = left >= 8  ? _mm256_loadu_ps(x + c0 + 8 * k)
                   : left > 0 ? _mm256_maskload_ps(x + c0 + 8 * k, lane_mask(left))
                              : _mm256_setzero_ps();
            __m256 a = _mm256_and_ps(v[k], absmask);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ)); /* NaN or infinite */
            mx = _mm256_max_ps(mx, a);
        }
        if (_mm256_movemask_ps(bad)) {
            csd_act_group_bad(xq + c0, &dx[g], &sums[g]);
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        __m256 inv = _mm256_set1_ps(csd_act_group_inv(amax));
        __m256i sum = _mm256_setzero_si256();
        const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
        for (int k = 0; k < 16; k += 4) {
            __m256i q[4];
            for (int j = 0; j < 4; j++) {
                q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k + j], inv)); /* nearest even */
                q[j] = _mm256_max_epi32(_mm256_min_epi32(q[j], lim), nlim);
                sum = _mm256_add_epi32(sum, q[j]);
            }
            /* packs interleave 128-bit lanes; the permute restores element order */
            __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
            __m256i p8 = _mm256_packs_epi16(p16a, p16b);
            p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(void *)(xq + c0 + 8 * k), p8);
        }
        dx[g] = amax / 127.0f;
        sums[g] = hsum8i(sum);
    }
}

/* AVX2 has no vpdpbusd: vpmaddubsw (u8 x s8 -> s16 pairs, saturating) then vpmaddwd by ones. */

/* Nibbles <= 15 and |x| <= 127: a pair is at most 3810, Q_CHUNK quads (8 products) fit int16. */
AI __m256i q4_dot4(__m256i part, __m256i w, __m256i x) {
    return _mm256_add_epi16(part, _mm256_maddubs_epi16(w, x));
}

AI __m256i q4_flush(__m256i isum, __m256i part) {
    return _mm256_add_epi32(isum, _mm256_madd_epi16(part, _mm256_set1_epi16(1)));
}

/* Q8 stays signed: |w| * sign(x, w) is at most 2 * 127 * 127 per pair, no saturation, but only
 * one pair fits int16, so every product is widened at once. */
AI __m256i q8_prep(__m256i w) { return w; }

AI __m256i q8_dot4(__m256i part, __m256i w, __m256i x) {
    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(part, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

AI int32_t q8_offset(void) { return 0; }

/* 8 halves (F16 or BF16 bits); the tail goes through a zero-padded copy. */
AI __m128i load_u16x8(const uint16_t *p, int64_t left) {
    if (left >= 8) return _mm_loadu_si128((const __m128i *)(const void *)p);
    uint16_t tmp[8] = {0};
    for (int64_t i = 0; i < left; i++) tmp[i] = p[i];
    return _mm_loadu_si128((const __m128i *)(const void *)tmp);
}

/* F16 weights: 8 columns at a time. */
AI __m256 load_f16x8(const uint16_t *p, int64_t left) {
    return _mm256_cvtph_ps(load_u16x8(p, left));
}

AI __m256 load_f32x8(const float *p, int64_t left) {
    return left >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(left));
}

/* Float weight kinds of the row-major matmul tiles. */
enum { WF16, WBF16, WF32 };

/* 8 weights of a row from column c as floats: whole (left >= 8) or the row's tail. */
AI __m256 load_w8(const int kind, const uint8_t *row, int64_t c, int64_t left) {
    if (kind == WF32) return load_f32x8((const float *)(const void *)row + c, left);
    const uint16_t *p = (const uint16_t *)(const void *)row + c;
    if (kind == WF16) return load_f16x8(p, left);
    /* bf16: the high half of a float */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_u16x8(p, left)), 16));
}

/* R rows x T tokens of a float-weight matmul (constants after inlining: the R x T accumulators
 * stay in registers). Per (row, token) one FMA chain over the columns in order, then hsum8: the
 * same sequence for every R and T, so results depend neither on the batch nor on the tiling.
 * Whole 8-column steps first, then the tail: a tail branch inside the loop (its copy is a call)
 * made the compiler keep the accumulators on the stack, 4x slower. One row at a time (R = 1,
 * T = 1) is bound by the FMA latency (16 bytes per 4 cycles for F16, ~15 GB/s), so decode takes
 * 4 rows. */
AI void f_tile(const int kind, const int R, const int T, float *y, int64_t ldy, const uint8_t *row,
               size_t row_bytes, int64_t cols, const float *x, int64_t ldx) {
    const int64_t esize = kind == WF32 ? 4 : 2, line = 64 / esize; /* columns per 64-byte line */
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t full = cols & ~(int64_t)7, c = 0;
    for (; c < full; c += 8) {
        __m256 xv[3];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *p = row + (size_t)r * row_bytes;
            if (c % line == 0) /* the same line of the next rows; read once for one token */
                CSD_PREFETCH_WEIGHTS(p + (size_t)R * row_bytes + c * esize,
                                     T == 1 ? CSD_PF_ONCE : CSD_PF_REUSED);
            __m256 wv = load_w8(kind, p, c, 8);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (c < cols) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = load_w8(kind, row + (size_t)r * row_bytes, c, cols - c);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(wv, load_f32x8(x + t * ldx + c, cols - c), acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum8(acc[r][t]);
}

typedef void (*f_tile_fn)(float *y, int64_t ldy, const uint8_t *row, size_t row_bytes, int64_t cols,
                          const float *x, int64_t ldx);

#define DEF_F_TILE(name, kind, R, T)                                                         \
    static void name##_##R##_##T(float *y, int64_t ldy, const uint8_t *row, size_t row_bytes, \
                                 int64_t cols, const float *x, int64_t ldx) {                \
        f_tile(kind, R, T, y, ldy, row, row_bytes, cols, x, ldx);                            \
    }
#define DEF_F_TILES(name, kind)                                                              \
    DEF_F_TILE(name, kind, 1, 1) DEF_F_TILE(name, kind, 1, 2) DEF_F_TILE(name, kind, 1, 3)    \
    DEF_F_TILE(name, kind, 4, 1) DEF_F_TILE(name, kind, 4, 2) DEF_F_TILE(name, kind, 4, 3)    \
    static const f_tile_fn name[2][3] = {{name##_1_1, name##_1_2, name##_1_3},               \
                                         {name##_4_1, name##_4_2, name##_4_3}};
DEF_F_TILES(tiles_f16, WF16)
DEF_F_TILES(tiles_bf16, WBF16)
DEF_F_TILES(tiles_f32, WF32)

/* Tokens per chunk: a group of 4 rows stays in L1/L2 while the chunk's tokens sweep it. */
#define F_TOK_CHUNK 32

static void matmul_f(const f_tile_fn tiles[2][3], float *y, const csd_qmat *w, const float *x,
                     int64_t ldx, int64_t n_tok, int64_t r0, int64_t r1) {
    size_t row_bytes = csd_quant_row_bytes(w->dtype, w->cols);
    const uint8_t *base = w->data;
    for (int64_t t0 = 0; t0 < n_tok; t0 += F_TOK_CHUNK) {
        int64_t t1 = t0 + F_TOK_CHUNK < n_tok ? t0 + F_TOK_CHUNK : n_tok;
        for (int64_t r = r0; r < r1;) {
            int four = r1 - r >= 4;
            for (int64_t t = t0; t < t1; t += 3) {
                int nt = (int)(t1 - t < 3 ? t1 - t : 3);
                tiles[four][nt - 1](y + t * w->rows + r, w->rows, base + (size_t)r * row_bytes,
                                    row_bytes, w->cols, x + t * ldx, ldx);
            }
            r += four ? 4 : 1;
        }
    }
}

AI float dot_any(const int f16, const float *a, const void *b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 b0 =
            f16 ? load_f16x8((const uint16_t *)b + i, 8) : _mm256_loadu_ps((const float *)b + i);
        __m256 b1 = f16 ? load_f16x8((const uint16_t *)b + i + 8, 8)
                        : _mm256_loadu_ps((const float *)b + i + 8);
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, acc1);
    }
    for (; i < n; i += 8) {
        __m256 bv = f16 ? load_f16x8((const uint16_t *)b + i, n - i)
                        : load_f32x8((const float *)b + i, n - i);
        acc0 = _mm256_fmadd_ps(load_f32x8(a + i, n - i), bv, acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

static float avx2_dot_f32(const float *a, const float *b, int64_t n) { return dot_any(0, a, b, n); }

static float avx2_dot_f32_f16(const float *a, const uint16_t *b, int64_t n) {
    return dot_any(1, a, b, n);
}

static void avx2_axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, load_f16x8(x + i, 8), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = __builtin_fmaf(a, _cvtsh_ss(x[i]), y[i]);
}

static void avx2_axpy_f32(float *y, float a, const float *x, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = __builtin_fmaf(a, x[i], y[i]);
}

static void avx2_f32_to_f16(uint16_t *out, const float *in, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT);
}

/* ---- per-token vector ops (the avx512 table's, in 8 lanes) ---- */

/* Lanes [0, left) of 8 set: masked loads and stores for the tail. */
AI __m256i mask8(int64_t left) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left >= 8 ? 8 : (int)left), iota);
}

/* exp(x) for 8 floats, within 2 ulp: x = n ln2 + r (ln2 in two parts), the Cephes degree-6
 * polynomial for exp(r), then 2^n applied as two halves so every factor is a normal float
 * (exponents down to -150 give denormals or 0, above 128 inf). NaN stays NaN (max/min return
 * their second operand when one is NaN). */
AI __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(CSD_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(CSD_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(CSD_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(CSD_EXP_P5);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CSD_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CSD_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CSD_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CSD_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CSD_EXP_P0));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1),
            n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

static float avx2_softmax(float *att, int64_t n, float max) {
    __m256 mx = _mm256_set1_ps(max), sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; t += 8) {
        __m256i m = mask8(n - t);
        __m256 e = exp256(_mm256_sub_ps(_mm256_maskload_ps(att + t, m), mx));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(att + t, m, e);
        sum = _mm256_add_ps(sum, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    double total = 0.0;
    for (int i = 0; i < 8; i++) total += lanes[i];
    return (float)(1.0 / total);
}

/* Grouped-query attention: the g query heads sharing one K/V head in one pass over the rows.
 * Each K row and each block of V rows is converted to floats once for all the heads, where the
 * composed path (attention.c) converts them once per head. Per head the float operations are the
 * composed path's with this table's helpers: dot_any's two accumulators and hsum8 for the scores,
 * then avx2_softmax, then axpy's fma(p, v, out) in position order, so the result is bit-identical.
 * Rows are prefetched CSD_ATTN_PF_ROWS ahead. */
#define ATTN_MAX_CHUNKS 16 /* head sizes up to 128 */
#define ATTN_V_BLOCK 16    /* V rows converted per step */
#define ATTN_PASS_HEADS 4

/* dot_any(1, q, row, hd) from the row's chunks kf: hd / 16 steps of 16 on two accumulators, the
 * rest 8 at a time on acc0 (q zero-padded like dot_any's masked tail loads). */
AI float group_score(const int NC, int pairs, const float *q, const __m256 *kf) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int c = 0; c < 2 * pairs; c += 2) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), kf[c], acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c + 8), kf[c + 1], acc1);
    }
#pragma GCC unroll 16
    for (int c = 2 * pairs; c < NC; c++)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), kf[c], acc0);
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* att[t] *= inv over n positions: a head's probabilities, the same float product the composed
 * path forms per position (p = att * inv), formed once so that the value pass takes them straight
 * from memory. */
static inline void scale_probs(float *att, int64_t n, float inv) {
    const __m256 iv = _mm256_set1_ps(inv);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8)
        _mm256_storeu_ps(att + t, _mm256_mul_ps(_mm256_loadu_ps(att + t), iv));
    for (; t < n; t++) att[t] *= inv;
}

AI void attend_group_nc(const int NC, float *out, const float *q, int H, const uint16_t *k,
                        const uint16_t *v, int64_t ld, int64_t n, int64_t hd, float scale,
                        float *att) {
    float qp[ATTN_PASS_HEADS][ATTN_MAX_CHUNKS * 8], op[ATTN_PASS_HEADS][ATTN_MAX_CHUNKS * 8];
    float max[ATTN_PASS_HEADS];
    __m256 kf[ATTN_MAX_CHUNKS], vf[ATTN_V_BLOCK][ATTN_MAX_CHUNKS];
    for (int h = 0; h < H; h++) { /* zero-padded copies: the masked tail loads of dot_any */
        memset(qp[h], 0, sizeof qp[h]);
        memcpy(qp[h], q + h * hd, (size_t)hd * sizeof(float));
        memset(op[h], 0, sizeof op[h]);
        max[h] = -INFINITY;
    }
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *row = k + t * ld;
        if (t + CSD_ATTN_PF_ROWS < n) csd_attn_prefetch_row(row + CSD_ATTN_PF_ROWS * ld, hd);
#pragma GCC unroll 16
        for (int c = 0; c < NC; c++) kf[c] = load_f16x8(row + 8 * c, hd - 8 * c);
        for (int h = 0; h < H; h++) {
            float s = group_score(NC, (int)(hd / 16), qp[h], kf) * scale;
            att[h * n + t] = s;
            if (s > max[h]) max[h] = s;
        }
    }
    for (int h = 0; h < H; h++) scale_probs(att + h * n, n, avx2_softmax(att + h * n, n, max[h]));
    for (int64_t t0 = 0; t0 < n; t0 += ATTN_V_BLOCK) {
        int nt = n - t0 < ATTN_V_BLOCK ? (int)(n - t0) : ATTN_V_BLOCK;
        for (int i = 0; i < nt; i++) {
            const uint16_t *row = v + (t0 + i) * ld;
            if (t0 + i + CSD_ATTN_PF_ROWS < n)
                csd_attn_prefetch_row(row + CSD_ATTN_PF_ROWS * ld, hd);
#pragma GCC unroll 16
            for (int c = 0; c < NC; c++) vf[i][c] = load_f16x8(row + 8 * c, hd - 8 * c);
        }
        for (int h = 0; h < H; h++) {
            __m256 o[ATTN_MAX_CHUNKS] = {0}; /* all set below; the 0 quiets -Wmaybe-uninitialized */
#pragma GCC unroll 16
            for (int c = 0; c < NC; c++) o[c] = _mm256_loadu_ps(op[h] + 8 * c);
            for (int i = 0; i < nt; i++) {
                __m256 p = _mm256_set1_ps(att[h * n + t0 + i]);
#pragma GCC unroll 16
                for (int c = 0; c < NC; c++) o[c] = _mm256_fmadd_ps(p, vf[i][c], o[c]);
            }
#pragma GCC unroll 16
            for (int c = 0; c < NC; c++) _mm256_storeu_ps(op[h] + 8 * c, o[c]);
        }
    }
    for (int h = 0; h < H; h++) memcpy(out + h * hd, op[h], (size_t)hd * sizeof(float));
}

static bool avx2_attend_f16_group(float *out, const float *q, int64_t g, const uint16_t *k,
                                  const uint16_t *v, int64_t ld, int64_t n, int64_t hd,
                                  float scale, float *att) {
    int nc = hd > 0 ? (int)((hd + 7) / 8) : 0;
    if (nc < 1 || nc > ATTN_MAX_CHUNKS) return false; /* wider heads: the composed path */
    for (int64_t h = 0; h < g; h += ATTN_PASS_HEADS) {
        int H = g - h < ATTN_PASS_HEADS ? (int)(g - h) : ATTN_PASS_HEADS;
        /* head sizes 64 and 128 unrolled with hd a constant (no tail loads in the loops: their
         * copy calls would push the loop state to the stack); the others through the same code
         * with a loop count */
        if (hd == 64) attend_group_nc(8, out + h * hd, q + h * hd, H, k, v, ld, n, 64, scale, att);
        else if (hd == 128)
            attend_group_nc(16, out + h * hd, q + h * hd, H, k, v, ld, n, 128, scale, att);
        else attend_group_nc(nc, out + h * hd, q + h * hd, H, k, v, ld, n, hd, scale, att);
    }
    return true;
}

static void avx2_silu_mul(float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = mask8(n - i);
        __m256 x = _mm256_maskload_ps(g + i, m);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(s, _mm256_maskload_ps(u + i, m)));
    }
}

/* Squares summed in 2 x 4 double lanes, then across them; the scaling as ref's. */
static void avx2_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_maskload_ps(x + i, mask8(n - i));
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    double lanes[4], ss = 0.0;
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    for (int i = 0; i < 4; i++) ss += lanes[i];
    __m256 scale = _mm256_set1_ps((float)(1.0 / sqrt(ss / (double)n + (double)eps)));
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = mask8(n - i);
        __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), scale);
        _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(v, _mm256_maskload_ps(w + i, m)));
    }
}

/* The bandwidth test's read (kern.h): 32-byte loads over S parts, prefetched as the matvec
 * prefetches (`ahead` bytes ahead), with the hint pf (CSD_PF_ONCE or CSD_PF_REUSED); S a constant
 * (as in avx512). */
AI uint64_t read_streams(const int pf, const int S, const uint8_t *p, size_t bytes, size_t ahead) {
    size_t part = bytes / (size_t)S / 64 * 64;
    __m256i acc[CSD_READ_STREAMS_MAX];
#pragma GCC unroll 4
    for (int s = 0; s < S; s++) acc[s] = _mm256_setzero_si256();
    for (size_t o = 0; o < part; o += 64)
#pragma GCC unroll 4
        for (int s = 0; s < S; s++) {
            const uint8_t *a = p + (size_t)s * part + o;
            CSD_PREFETCH_WEIGHTS(a + ahead, pf);
            __m256i v =
                _mm256_add_epi64(_mm256_loadu_si256((const __m256i *)(const void *)a),
                                 _mm256_loadu_si256((const __m256i *)(const void *)(a + 32)));
            acc[s] = _mm256_add_epi64(acc[s], v);
        }
    uint64_t lanes[4], sum = 0;
#pragma GCC unroll 4
    for (int s = 1; s < S; s++) acc[0] = _mm256_add_epi64(acc[0], acc[s]);
    _mm256_storeu_si256((__m256i *)(void *)lanes, acc[0]);
    for (int i = 0; i < 4; i++) sum += lanes[i];
    return sum;
}

CSD_DEF_READ_STREAMS(avx2_read_streams)

CSD_DEF_MATMUL_F(avx2_matmul)

const csd_kern_ops csd_kern_ops_avx2 = {
    .name = "avx2",
    .quantize_act_q8 = avx2_quantize_act_q8,
    .matmul_q4_q8 = q_matmul_q4,
    .matmul_q8_q8 = q_matmul_q8,
    .matvec_q4 = streams_q4,
    .matvec_q8 = streams_q8,
    /* 1 KB: on the AMD EPYC (Zen 3) hosts here, where this table is the one that runs, token
     * time was 6-12% lower than with 2 KB (INT4 and INT8, the two distances alternating token by
     * token in one process; about 9% at the median); 512 B and 1.5 KB lost part of that. */
    .mv_pf_ahead = 1024,
    .matmul_f32_f32 = avx2_matmul_f32,
    .matmul_f16_f32 = avx2_matmul_f16,
    .matmul_bf16_f32 = avx2_matmul_bf16,
    .dot_f32 = avx2_dot_f32,
    .dot_f32_f16 = avx2_dot_f32_f16,
    .axpy_f32 = avx2_axpy_f32,
    .axpy_f16 = avx2_axpy_f16,
    .attend_f16_group = avx2_attend_f16_group,
    .f32_to_f16 = avx2_f32_to_f16,
    .softmax = avx2_softmax,
    .silu_mul = avx2_silu_mul,
    .rmsnorm = avx2_rmsnorm,
    .read_streams = avx2_read_streams,
};
