/* x86_avx512: AVX-512 F/BW/VL/DQ + VNNI kernels (built with their own -m flags, called only when
 * dispatch.c has checked the CPU). Q4/Q8 matmul: vpdpbusd of unsigned weights (q + 8, q + 128)
 * by signed int8 activations, the offset removed through the group sum of the activations.
 * Tiles of TILE_R rows x TILE_T tokens load each weight group once for several tokens. Every
 * output element is computed by the same operation sequence whatever the tile it falls in. */
#include "kern_internal.h"

#include <immintrin.h>

#include "core/dtype.h"
#include "quant.h"

#define AI static inline __attribute__((always_inline))

/* Row x token register tile: 16 zmm accumulators + 8 unpacked weight vectors + temporaries. */
#define TILE_R 4
#define TILE_T 4
/* Matvec (one token) uses 8-row tiles: twice the independent streams in flight per thread. */
#define QR_MAX 8
/* Tokens whose activations stay in L2 while a row tile sweeps them (64 x 5.9 KB at cols 5632). */
#define TOK_CHUNK 64
/* Software prefetch of the same lines PF_TILES row tiles ahead, into L1: each row of a tile is a
 * stream of only ~16-44 lines, too short for the hardware prefetcher; measured on Zen 4, matvec
 * went from ~60% to 75-95% of a plain read's bandwidth (T1 hint or 2 tiles ahead: no better). */
#define PF_TILES 1
#define PF_HINT _MM_HINT_T0

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
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * CSD_QUANT_GROUP;
        __m512 v[8];
        __m512 mx = _mm512_setzero_ps();
        for (int k = 0; k < 8; k++) {
            int64_t left = cols - c0 - 16 * k;
            v[k] = left > 0 ? _mm512_maskz_loadu_ps(tail_mask(left), x + c0 + 16 * k)
                            : _mm512_setzero_ps();
            mx = _mm512_max_ps(mx, _mm512_and_ps(v[k], absmask));
        }
        float amax = _mm512_reduce_max_ps(mx); /* max is exact: order does not matter */
        __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
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

/* One tile of R rows x T tokens of a Q4 (q4 = 1) or Q8 matmul. */
AI void q_tile(const int R, const int T, const int q4, float *y, int64_t ldy,
               const uint8_t *row0, size_t row_bytes, const uint8_t *act, size_t stride,
               int64_t ng) {
    const size_t gbytes = q4 ? sizeof(csd_q4_group) : sizeof(csd_q8_group);
    const int32_t off = q4 ? -8 : -128;
    const __m512i low4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
    const float *dxs[TILE_T];
    const int32_t *sums[TILE_T];
    const uint16_t *dws[QR_MAX];
    __m512 acc[QR_MAX][TILE_T];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        dxs[t] = (const float *)(const void *)(act + (size_t)t * stride + ng * CSD_QUANT_GROUP);
        sums[t] = (const int32_t *)(const void *)(dxs[t] + ng);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        dws[r] = (const uint16_t *)(const void *)(row0 + (size_t)r * row_bytes + ng * gbytes);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    }
    /* Combined scales dw * dx for 16 groups at a time, so the group loop broadcasts them from
     * L1 (folded into the FMA) instead of converting f16 and multiplying per group. */
    float sc[QR_MAX][TILE_T][16] __attribute__((aligned(64)));
    for (int64_t gb = 0; gb < ng; gb += 16) {
        const int64_t gn = ng - gb < 16 ? ng - gb : 16;
        const __mmask16 gm = tail_mask(gn);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            /* this block's scales of the next row tile: read first thing there, so a miss on
             * them would stall its start */
            _mm_prefetch((const char *)(dws[r] + gb) + PF_TILES * R * row_bytes, PF_HINT);
            __m512 dwv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, dws[r] + gb));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                _mm512_store_ps(sc[r][t],
                                _mm512_mul_ps(dwv, _mm512_maskz_loadu_ps(gm, dxs[t] + gb)));
        }
        for (int64_t gi = 0; gi < gn; gi++) {
            const int64_t g = gb + gi;
            __m512i wl[QR_MAX], wh[QR_MAX];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const uint8_t *p = row0 + (size_t)r * row_bytes + (size_t)g * gbytes;
                /* the same lines of the row tile PF_TILES ahead: the hardware prefetcher alone
                 * leaves DRAM bandwidth unused with TILE_R interleaved streams */
                _mm_prefetch((const char *)(p + PF_TILES * R * row_bytes), PF_HINT);
                if (!q4) _mm_prefetch((const char *)(p + 64 + PF_TILES * R * row_bytes), PF_HINT);
                if (q4) {
                    __m512i b = _mm512_loadu_si512(p);
                    wl[r] = _mm512_and_si512(b, low4);
                    wh[r] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
                } else {
                    wl[r] = _mm512_xor_si512(_mm512_loadu_si512(p), flip);
                    wh[r] = _mm512_xor_si512(_mm512_loadu_si512(p + 64), flip);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const uint8_t *xg = act + (size_t)t * stride + (size_t)g * CSD_QUANT_GROUP;
                __m512i xl = _mm512_loadu_si512(xg), xh = _mm512_loadu_si512(xg + 64);
                __m512i init = _mm512_zextsi128_si512(_mm_cvtsi32_si128(off * sums[t][g]));
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    __m512i i = _mm512_dpbusd_epi32(init, wl[r], xl);
                    i = _mm512_dpbusd_epi32(i, wh[r], xh);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(sc[r][t][gi]),
                                                acc[r][t]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum(acc[r][t]);
}

typedef void (*q_tile_fn)(float *y, int64_t ldy, const uint8_t *row0, size_t row_bytes,
                          const uint8_t *act, size_t stride, int64_t ng);

#define DEF_Q_TILE(name, q4, R, T)                                                          \
    static void name##_##R##_##T(float *y, int64_t ldy, const uint8_t *row0, size_t row_bytes, \
                                 const uint8_t *act, size_t stride, int64_t ng) {          \
        q_tile(R, T, q4, y, ldy, row0, row_bytes, act, stride, ng);                        \
    }
#define DEF_Q_TILES(name, q4)                                                               \
    DEF_Q_TILE(name, q4, 1, 1) DEF_Q_TILE(name, q4, 1, 2) DEF_Q_TILE(name, q4, 1, 3)         \
    DEF_Q_TILE(name, q4, 1, 4) DEF_Q_TILE(name, q4, 4, 1) DEF_Q_TILE(name, q4, 4, 2)         \
    DEF_Q_TILE(name, q4, 4, 3) DEF_Q_TILE(name, q4, 4, 4) DEF_Q_TILE(name, q4, 8, 1)         \
    static const q_tile_fn name[3][TILE_T] = {                                              \
        {name##_1_1, name##_1_2, name##_1_3, name##_1_4},                                   \
        {name##_4_1, name##_4_2, name##_4_3, name##_4_4},                                   \
        {name##_8_1, NULL, NULL, NULL}};

DEF_Q_TILES(tiles_q4, 1)
DEF_Q_TILES(tiles_q8, 0)

static void matmul_q(const q_tile_fn tiles[3][TILE_T], float *y, const csd_qmat *w,
                     const uint8_t *act, int64_t n_tok, int64_t r0, int64_t r1) {
    int64_t ng = csd_quant_groups(w->cols);
    size_t row_bytes = csd_quant_row_bytes(w->dtype, w->cols);
    size_t stride = csd_quant_act_stride(w->cols);
    const uint8_t *base = w->data;
    for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_CHUNK) {
        int64_t t1 = t0 + TOK_CHUNK < n_tok ? t0 + TOK_CHUNK : n_tok;
        for (int64_t r = r0; r < r1;) {
            int big = n_tok == 1 && r1 - r >= QR_MAX ? 2 : r1 - r >= TILE_R ? 1 : 0;
            for (int64_t t = t0; t < t1; t += TILE_T) {
                int nt = (int)(t1 - t < TILE_T ? t1 - t : TILE_T);
                tiles[big][nt - 1](y + t * w->rows + r, w->rows, base + (size_t)r * row_bytes,
                                   row_bytes, act + (size_t)t * stride, stride, ng);
            }
            r += big == 2 ? QR_MAX : big ? TILE_R : 1;
        }
    }
}

static void avx512_matmul_q4_q8(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                                int64_t r0, int64_t r1) {
    matmul_q(tiles_q4, y, w, act, n_tok, r0, r1);
}

static void avx512_matmul_q8_q8(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                                int64_t r0, int64_t r1) {
    matmul_q(tiles_q8, y, w, act, n_tok, r0, r1);
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
    __m512 acc[QR_MAX][TILE_T];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 16) {
        __mmask16 m = tail_mask(cols - c);
        __m512 wv[QR_MAX];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const uint8_t *p = row0 + (size_t)r * row_bytes;
            _mm_prefetch((const char *)(p + PF_TILES * R * row_bytes) + c * (kind == WF32 ? 4 : 2),
                         PF_HINT);
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

typedef void (*f_tile_fn)(float *y, int64_t ldy, const uint8_t *row0, size_t row_bytes,
                          const float *x, int64_t ldx, int64_t cols);

#define DEF_F_TILE(name, kind, R, T)                                                         \
    static void name##_##R##_##T(float *y, int64_t ldy, const uint8_t *row0, size_t row_bytes, \
                                 const float *x, int64_t ldx, int64_t cols) {               \
        f_tile(R, T, kind, y, ldy, row0, row_bytes, x, ldx, cols);                           \
    }
#define DEF_F_TILES(name, kind)                                                              \
    DEF_F_TILE(name, kind, 1, 1) DEF_F_TILE(name, kind, 1, 2) DEF_F_TILE(name, kind, 1, 3)    \
    DEF_F_TILE(name, kind, 1, 4) DEF_F_TILE(name, kind, 4, 1) DEF_F_TILE(name, kind, 4, 2)    \
    DEF_F_TILE(name, kind, 4, 3) DEF_F_TILE(name, kind, 4, 4) DEF_F_TILE(name, kind, 8, 1)    \
    static const f_tile_fn name[3][TILE_T] = {                                               \
        {name##_1_1, name##_1_2, name##_1_3, name##_1_4},                                    \
        {name##_4_1, name##_4_2, name##_4_3, name##_4_4},                                    \
        {name##_8_1, NULL, NULL, NULL}};

DEF_F_TILES(tiles_f32, WF32)
DEF_F_TILES(tiles_f16, WF16)
DEF_F_TILES(tiles_bf16, WBF16)

/* Float activations are 4 bytes a column, so fewer tokens fit in L2 than for int8. */
#define F_TOK_CHUNK 32

static void matmul_f(const f_tile_fn tiles[3][TILE_T], float *y, const csd_qmat *w, const float *x,
                     int64_t ldx, int64_t n_tok, int64_t r0, int64_t r1) {
    size_t row_bytes = csd_quant_row_bytes(w->dtype, w->cols);
    const uint8_t *base = w->data;
    for (int64_t t0 = 0; t0 < n_tok; t0 += F_TOK_CHUNK) {
        int64_t t1 = t0 + F_TOK_CHUNK < n_tok ? t0 + F_TOK_CHUNK : n_tok;
        for (int64_t r = r0; r < r1;) {
            int big = n_tok == 1 && r1 - r >= QR_MAX ? 2 : r1 - r >= TILE_R ? 1 : 0;
            for (int64_t t = t0; t < t1; t += TILE_T) {
                int nt = (int)(t1 - t < TILE_T ? t1 - t : TILE_T);
                tiles[big][nt - 1](y + t * w->rows + r, w->rows, base + (size_t)r * row_bytes,
                                   row_bytes, x + t * ldx, ldx, w->cols);
            }
            r += big == 2 ? QR_MAX : big ? TILE_R : 1;
        }
    }
}

static void avx512_matmul_f32(float *y, const csd_qmat *w, const float *x, int64_t ldx,
                              int64_t n_tok, int64_t r0, int64_t r1) {
    matmul_f(tiles_f32, y, w, x, ldx, n_tok, r0, r1);
}

static void avx512_matmul_f16(float *y, const csd_qmat *w, const float *x, int64_t ldx,
                              int64_t n_tok, int64_t r0, int64_t r1) {
    matmul_f(tiles_f16, y, w, x, ldx, n_tok, r0, r1);
}

static void avx512_matmul_bf16(float *y, const csd_qmat *w, const float *x, int64_t ldx,
                              int64_t n_tok,
                               int64_t r0, int64_t r1) {
    matmul_f(tiles_bf16, y, w, x, ldx, n_tok, r0, r1);
}

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
    .matmul_f32_f32 = avx512_matmul_f32,
    .matmul_f16_f32 = avx512_matmul_f16,
    .matmul_bf16_f32 = avx512_matmul_bf16,
    .dot_f32 = avx512_dot_f32,
    .dot_f32_f16 = avx512_dot_f32_f16,
    .axpy_f32 = avx512_axpy_f32,
    .axpy_f16 = avx512_axpy_f16,
    .f32_to_f16 = avx512_f32_to_f16,
};
