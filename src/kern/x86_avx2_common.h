/* x86_avx2_common: the Q4/Q8 block matmul of the 256-bit tables (avx2, avxvnni), written once.
 * The including file defines the integer dot-product hooks declared below (vpmaddubsw + vpmaddwd
 * on AVX2, vpdpbusd on AVX-VNNI) and gets q_matmul_q4 / q_matmul_q8 for its table.
 * Layout (quant.h): a 64-byte vector holds 4 inputs of 16 rows; its two 32-byte halves are rows
 * 0-7 and 8-15, one row per 32-bit lane, so a dot product against 4 activations broadcast to all
 * lanes advances 8 outputs with no horizontal sum. */
#ifndef CSD_X86_AVX2_COMMON_H
#define CSD_X86_AVX2_COMMON_H

#include <immintrin.h>
#include <string.h>

#include "kern_internal.h"
#include "quant.h"

#define AI static inline __attribute__((always_inline))

/* Hooks of the including file. part is a partial integer sum of one group for 8 rows; it stays
 * exact for Q_CHUNK input quads (Q4: q4_dot4 twice per quad, low and high nibbles). */
/* Q4: part += w * x, w = 4 unsigned nibbles (q + 8) per lane, x = 4 signed activations. */
AI __m256i q4_dot4(__m256i part, __m256i w, __m256i x);
/* Q4: the int32 group sum plus a finished part. */
AI __m256i q4_flush(__m256i isum, __m256i part);
/* Q8: raw signed weights -> the operand q8_dot4 takes (done once per vector, not per token). */
AI __m256i q8_prep(__m256i w);
/* Q8: part (int32) += w * x for 4 inputs per lane. */
AI __m256i q8_dot4(__m256i part, __m256i w, __m256i x);
/* Q8: what q8_prep adds to each weight (0 or 128); removed as -offset * sum(x). */
AI int32_t q8_offset(void);

/* Input quads per part: 4 Q4 quads = 8 vpmaddubsw of at most 2 * 15 * 127 each, the most an
 * int16 lane holds; also splits the dependency chains when there are few tokens. */
#define Q_CHUNK 4
/* Tokens per tile: the inner loop holds 2 x T parts, 4 unpacked weight vectors and 2 broadcast
 * activations in the 16 ymm registers (the int and float sums, touched once per chunk or group,
 * live on the stack). Measured on AMD EPYC: T = 4 beats 2, 3, 5, 6 (vpdpbusd latency needs the 8
 * independent parts; vpmaddubsw does not care). */
#define QT_MAX 4
/* Tiles: a block is one contiguous stream; prefetch this far ahead of the load. */
#define PF_AHEAD 2048
/* A vector's two parts hidden from the optimizer once its products are added. Without it GCC 12
 * turns a chunk's chain of adds into a tree: it computes every product of the chunk first, spills
 * them to the stack and adds them afterwards (stack accesses in the 2-stream Q4 kernel: 94, with
 * it 40, all outside the loop over a group's vectors; 4-token tile: 137, with it 97). Integer sums
 * are the same in any order, so results do not change (docs/kernels.md, "Partial sums"). */
#define KEEP_PARTS(part) __asm__("" : "+x"((part)[0]), "+x"((part)[1]))

/* 4 activation bytes (inputs 4k..4k+3 of a token) broadcast to every 32-bit lane. */
AI __m256i bcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, sizeof v);
    return _mm256_set1_epi32(v);
}

/* Mask of the first `left` lanes (all 8 when left >= 8) for maskload/maskstore. */
AI __m256i lane_mask(int64_t left) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left > 8 ? 8 : left)), idx);
}

/* One 64-byte weight vector (4 inputs of rows 0-7 and 8-15) made ready for the dot hooks, once
 * for every token that uses it: Q4 -> u[0..1] low nibbles (inputs 4k..4k+3), u[2..3] high
 * nibbles (inputs 64+4k..); Q8 -> u[0..1] through q8_prep. */
AI void q_unpack(const int q4, const uint8_t *v, __m256i u[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)v);
    __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(v + 32));
    if (q4) {
        u[0] = _mm256_and_si256(w0, low4);
        u[1] = _mm256_and_si256(w1, low4);
        u[2] = _mm256_and_si256(_mm256_srli_epi16(w0, 4), low4);
        u[3] = _mm256_and_si256(_mm256_srli_epi16(w1, 4), low4);
    } else {
        u[0] = q8_prep(w0);
        u[1] = q8_prep(w1);
    }
}

/* part[h] (rows 8h..8h+7) += an unpacked vector times broadcast activations: xl for Q8 and Q4's
 * low nibbles, xh for Q4's high nibbles. */
AI void q_dot(const int q4, __m256i part[2], const __m256i u[4], __m256i xl, __m256i xh) {
    if (q4) {
        part[0] = q4_dot4(q4_dot4(part[0], u[0], xl), u[2], xh);
        part[1] = q4_dot4(q4_dot4(part[1], u[1], xl), u[3], xh);
    } else {
        part[0] = q8_dot4(part[0], u[0], xl);
        part[1] = q8_dot4(part[1], u[1], xl);
    }
}

/* The int32 group sum plus a finished part (Q4 parts are int16 pairs, Q8 parts int32). */
AI __m256i q_flush(const int q4, __m256i isum, __m256i part) {
    return q4 ? q4_flush(isum, part) : _mm256_add_epi32(isum, part);
}

/* One 16-row block x T tokens. Integer sums are exact (parts added in any order); the float part
 * is the same sequence for every T, tile and thread split: per group in order,
 * acc = fma(float(isum), dw * dx, acc). */
AI void q_block(const int T, const int q4, float *y, int64_t ldy, int nrows, const uint8_t *blk,
                const uint8_t *act, size_t stride, int64_t ng, int pf) {
    const int dtype = q4 ? CSD_DTYPE_Q4 : CSD_DTYPE_Q8;
    const int32_t off = q4 ? -8 : -q8_offset();
    const int8_t *xq[QT_MAX];
    const float *dx[QT_MAX];
    const int32_t *sums[QT_MAX];
    __m256 acc[QT_MAX][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        xq[t] = (const int8_t *)(act + (size_t)t * stride);
        dx[t] = (const float *)(const void *)(xq[t] + ng * CSD_QUANT_GROUP);
        sums[t] = (const int32_t *)(const void *)(dx[t] + ng);
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = blk + csd_quant_group_offset(dtype, g);
        if (pf) csd_q_prefetch_pair_gap(wg, dtype, g, PF_AHEAD, pf);
        __m256i isum[QT_MAX][2];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) isum[t][0] = isum[t][1] = _mm256_set1_epi32(off * sums[t][g]);
        const int nvec = q4 ? CSD_QUANT_GROUP / 8 : CSD_QUANT_GROUP / 4;
        for (int k0 = 0; k0 < nvec; k0 += Q_CHUNK) {
            __m256i part[QT_MAX][2];
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) part[t][0] = part[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int k = k0; k < k0 + Q_CHUNK; k++) {
                const uint8_t *v = wg + (size_t)k * CSD_QUANT_VEC_BYTES;
                if (pf) CSD_PREFETCH_WEIGHTS(v + PF_AHEAD, pf);
                __m256i u[4];
                q_unpack(q4, v, u);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const int8_t *xg = xq[t] + g * CSD_QUANT_GROUP + 4 * k;
                    __m256i xl = bcast4(xg), xh = q4 ? bcast4(xg + 64) : xl;
                    q_dot(q4, part[t], u, xl, xh);
                    KEEP_PARTS(part[t]);
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++)
                    isum[t][h] = q_flush(q4, isum[t][h], part[t][h]);
        }
        const __m128i *dwg = (const __m128i *)(const void *)csd_quant_group_scales(dtype, blk, g);
        __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(dwg));
        __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(dwg + 1));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256 dxv = _mm256_set1_ps(dx[t][g]);
            acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][0]), _mm256_mul_ps(dw0, dxv),
                                        acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][1]), _mm256_mul_ps(dw1, dxv),
                                        acc[t][1]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            int n = nrows - 8 * h;
            if (n >= 8) _mm256_storeu_ps(y + t * ldy + 8 * h, acc[t][h]);
            else if (n > 0) _mm256_maskstore_ps(y + t * ldy + 8 * h, lane_mask(n), acc[t][h]);
        }
    }
}

typedef csd_q_block_fn q_block_fn;

#define DEF_Q_BLOCKS(name, q4)                                                             \
    CSD_DEF_Q_BLOCK(name, q4, 1) CSD_DEF_Q_BLOCK(name, q4, 2) CSD_DEF_Q_BLOCK(name, q4, 3)   \
    CSD_DEF_Q_BLOCK(name, q4, 4)                                                             \
    static const q_block_fn name[QT_MAX] = {name##_1, name##_2, name##_3, name##_4};

DEF_Q_BLOCKS(blocks_q4, 1)
DEF_Q_BLOCKS(blocks_q8, 0)

/* Matvec over S blocks far apart at once: S weight streams per thread (DRAM serves several streams
 * faster than one, as in the AVX-512 table), each prefetched `ahead` bytes ahead: the table's
 * mv_pf_ahead, whose default the including file sets (docs/kernels.md, "Prefetch distance"). Per
 * output the same float sequence as q_block with one token; only the exact integer part is split
 * differently. */
AI void q_streams(const int S, const int q4, float *const *y, const int *nrows,
                  const uint8_t *const *blk, const uint8_t *act, int64_t ng, size_t ahead) {
    const int dtype = q4 ? CSD_DTYPE_Q4 : CSD_DTYPE_Q8;
    const int32_t off = q4 ? -8 : -q8_offset();
    const int8_t *xq = (const int8_t *)act;
    const float *dx = (const float *)(const void *)(xq + ng * CSD_QUANT_GROUP);
    const int32_t *sums = (const int32_t *)(const void *)(dx + ng);
    __m256 acc[CSD_MV_STREAMS][2];
#pragma GCC unroll 4
    for (int i = 0; i < S; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const int nvec = q4 ? CSD_QUANT_GROUP / 8 : CSD_QUANT_GROUP / 4;
    for (int64_t g = 0; g < ng; g++) {
        const int8_t *xg = xq + g * CSD_QUANT_GROUP;
        __m256i isum[CSD_MV_STREAMS][2];
        const uint8_t *wg[CSD_MV_STREAMS], *pa[CSD_MV_STREAMS];
#pragma GCC unroll 4
        for (int i = 0; i < S; i++) {
            isum[i][0] = isum[i][1] = _mm256_set1_epi32(off * sums[g]);
            wg[i] = blk[i] + csd_quant_group_offset(dtype, g);
            pa[i] = wg[i] + ahead; /* the group's prefetch address (kern_internal.h) */
            CSD_OPAQUE_PTR(pa[i]);
            csd_q_prefetch_pair_gap(wg[i], dtype, g, ahead, CSD_PF_ONCE);
        }
        for (int k0 = 0; k0 < nvec; k0 += Q_CHUNK) {
            __m256i part[CSD_MV_STREAMS][2];
#pragma GCC unroll 4
            for (int i = 0; i < S; i++) part[i][0] = part[i][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int k = k0; k < k0 + Q_CHUNK; k++) {
                __m256i xl = bcast4(xg + 4 * k), xh = q4 ? bcast4(xg + 64 + 4 * k) : xl;
#pragma GCC unroll 4
                for (int i = 0; i < S; i++) {
                    const uint8_t *v = wg[i] + (size_t)k * CSD_QUANT_VEC_BYTES;
                    CSD_PREFETCH_WEIGHTS(pa[i] + (size_t)k * CSD_QUANT_VEC_BYTES, CSD_PF_ONCE);
                    __m256i u[4];
                    q_unpack(q4, v, u);
                    q_dot(q4, part[i], u, xl, xh);
                    KEEP_PARTS(part[i]);
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < S; i++)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++)
                    isum[i][h] = q_flush(q4, isum[i][h], part[i][h]);
        }
        __m256 dxv = _mm256_set1_ps(dx[g]);
#pragma GCC unroll 4
        for (int i = 0; i < S; i++) {
            const __m128i *dwg =
                (const __m128i *)(const void *)csd_quant_group_scales(dtype, blk[i], g);
            __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(dwg));
            __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(dwg + 1));
            acc[i][0] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][0]), _mm256_mul_ps(dw0, dxv), acc[i][0]);
            acc[i][1] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][1]), _mm256_mul_ps(dw1, dxv), acc[i][1]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < S; i++) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            int n = nrows[i] - 8 * h;
            if (n >= 8) _mm256_storeu_ps(y[i] + 8 * h, acc[i][h]);
            else if (n > 0) _mm256_maskstore_ps(y[i] + 8 * h, lane_mask(n), acc[i][h]);
        }
    }
}

CSD_DEF_Q_STREAM_TABLES

static void q_matmul_q4(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                        int64_t r0, int64_t r1) {
    csd_q_blocks_run(blocks_q4, QT_MAX, y, w, act, n_tok, r0, r1);
}

static void q_matmul_q8(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                        int64_t r0, int64_t r1) {
    csd_q_blocks_run(blocks_q8, QT_MAX, y, w, act, n_tok, r0, r1);
}

#endif
