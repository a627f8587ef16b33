/* arm_neon: AArch64 kernels for the Q4/Q8 matmuls and the activation quantization, with the
 * ARMv8.2 dot product SDOT (built with its own -march flag, called only when dispatch.c has seen
 * HWCAP_ASIMDDP). Raspberry Pi 5, Graviton 2+, Ampere Altra and Apple M-series cores have it.
 *
 * The quant.h block layout fits SDOT's by-element form as it is: a 16-byte load of a 64-byte
 * weight vector is 4 rows x 4 consecutive inputs, and vdotq_laneq_s32 adds to each row the dot
 * product of its 4 weights with one 4-byte lane of the activations. SDOT multiplies signed bytes:
 * Q4 nibbles stay as stored (q + 8, 0..15) and the offset leaves through the activation group sum
 * (the integer accumulator starts at -8 * sum), Q8 weights are used as they are. The float part is
 * the x86 tables' sequence, acc = fma(float(isum), dw * dx, acc) group by group, the same for every
 * tile and for the one-token streams (test_matvec_lanes_any_split compares them bit for bit).
 *
 * The dot and axpy helpers (attention over the f16 KV cache is composed from them, and from
 * f32_to_f16 for the cache writes) convert f16 in hardware, where ref converts in software. The
 * float matmuls, the fused attention kernels, softmax, SiLU and RMSNorm are ref's plain C. Not
 * measured on ARM hardware (none here): correctness is tested under qemu-aarch64
 * (tests/e2e_build_arm.sh), speed is not claimed. */
#include "kern_internal.h"

#include <arm_neon.h>
#include <string.h>

#include "core/dtype.h"
#include "quant.h"

#define AI static inline __attribute__((always_inline))

/* Most tokens per tile: per token 4 integer and 4 float accumulators of 4 rows each, with the
 * weight and activation registers inside the 32 vector registers. */
#define QT_MAX 2
/* Prefetch distance in the block stream: the x86 tables' measured value, not tuned on ARM. */
#define PF_AHEAD 2048

static void neon_quantize_act_q8(uint8_t *act, const float *x, int64_t cols) {
    int64_t ng = csd_quant_groups(cols);
    int8_t *xq = (int8_t *)act;
    float *dx = (float *)(void *)(act + ng * CSD_QUANT_GROUP);
    int32_t *sums = (int32_t *)(void *)(dx + ng);
    const int32x4_t lim = vdupq_n_s32(127), neg = vdupq_n_s32(-127);
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * CSD_QUANT_GROUP;
        int64_t n = cols - c0 < CSD_QUANT_GROUP ? cols - c0 : CSD_QUANT_GROUP;
        float pad[CSD_QUANT_GROUP];
        const float *src = x + c0;
        if (n < CSD_QUANT_GROUP) { /* a short last group: zeros past cols, as ref */
            memset(pad, 0, sizeof pad);
            memcpy(pad, src, (size_t)n * sizeof(float));
            src = pad;
        }
        float32x4_t mx = vdupq_n_f32(0.0f);
        for (int k = 0; k < CSD_QUANT_GROUP; k += 4) mx = vmaxq_f32(mx, vabsq_f32(vld1q_f32(src + k)));
        float amax = vmaxvq_f32(mx);
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32x4_t sum = vdupq_n_s32(0);
        for (int k = 0; k < CSD_QUANT_GROUP; k += 16) {
            int32x4_t q[4];
            for (int i = 0; i < 4; i++) { /* x * inv rounded to nearest even, as ref's nearbyintf */
                q[i] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(src + k + 4 * i), inv));
                q[i] = vminq_s32(vmaxq_s32(q[i], neg), lim);
                sum = vaddq_s32(sum, q[i]);
            }
            int16x8_t lo = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
            int16x8_t hi = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
            vst1q_s8(xq + c0 + k, vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
        }
        dx[g] = amax / 127.0f;
        sums[g] = vaddvq_s32(sum);
    }
}

/* is[t][r] += rows 4r..4r+3 of one 64-byte weight vector (w) times lane j of token t's 16
 * activation bytes x[t]. j must be a constant: SDOT's lane is an immediate. */
#define SDOT_VEC(T, is, w, x, j)                                                             \
    do {                                                                                     \
        for (int r_ = 0; r_ < 4; r_++)                                                       \
            for (int t_ = 0; t_ < (T); t_++)                                                 \
                (is)[t_][r_] = vdotq_laneq_s32((is)[t_][r_], (w)[r_], (x)[t_], (j));         \
    } while (0)

/* The 4 row quads of the 64-byte weight vector at v: Q4 as two nibble halves (lo: inputs 4k..,
 * hi: inputs 64 + 4k..), Q8 as signed bytes. */
AI void load_q4_vec(const uint8_t *v, int8x16_t lo[4], int8x16_t hi[4]) {
    const uint8x16_t m = vdupq_n_u8(0x0f);
    for (int r = 0; r < 4; r++) {
        uint8x16_t w = vld1q_u8(v + 16 * r);
        lo[r] = vreinterpretq_s8_u8(vandq_u8(w, m));
        hi[r] = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
    }
}

AI void load_q8_vec(const uint8_t *v, int8x16_t w[4]) {
    for (int r = 0; r < 4; r++) w[r] = vld1q_s8((const int8_t *)v + 16 * r);
}

/* Integer sums of one group of a block for T tokens (xg[t]: the token's 128 activations of the
 * group; is: the starting values). Four weight vectors share each 16-byte activation load. */
AI void q_group_isum(const int T, const int q4, int32x4_t is[][4], const uint8_t *wg,
                     const int8_t *const *xg, int pf) {
    if (q4) {
#pragma GCC unroll 4
        for (int k = 0; k < CSD_QUANT_GROUP / 8; k += 4) {
            int8x16_t xl[QT_MAX], xh[QT_MAX], lo[4], hi[4];
            for (int t = 0; t < T; t++) {
                xl[t] = vld1q_s8(xg[t] + 4 * k);
                xh[t] = vld1q_s8(xg[t] + 64 + 4 * k);
            }
#define Q4_STEP(j)                                                                           \
    do {                                                                                     \
        const uint8_t *v_ = wg + 64 * (k + (j));                                             \
        if (pf) CSD_PREFETCH_WEIGHTS(v_ + PF_AHEAD, pf);                                     \
        load_q4_vec(v_, lo, hi);                                                             \
        SDOT_VEC(T, is, lo, xl, j);                                                          \
        SDOT_VEC(T, is, hi, xh, j);                                                          \
    } while (0)
            Q4_STEP(0);
            Q4_STEP(1);
            Q4_STEP(2);
            Q4_STEP(3);
#undef Q4_STEP
        }
    } else {
#pragma GCC unroll 8
        for (int k = 0; k < CSD_QUANT_GROUP / 4; k += 4) {
            int8x16_t xv[QT_MAX], w[4];
            for (int t = 0; t < T; t++) xv[t] = vld1q_s8(xg[t] + 4 * k);
#define Q8_STEP(j)                                                                           \
    do {                                                                                     \
        const uint8_t *v_ = wg + 64 * (k + (j));                                             \
        if (pf) CSD_PREFETCH_WEIGHTS(v_ + PF_AHEAD, pf);                                     \
        load_q8_vec(v_, w);                                                                  \
        SDOT_VEC(T, is, w, xv, j);                                                           \
    } while (0)
            Q8_STEP(0);
            Q8_STEP(1);
            Q8_STEP(2);
            Q8_STEP(3);
#undef Q8_STEP
        }
    }
}

/* acc[r] = fma(float(is[r]), dw[r] * dx, acc[r]) for the 4 row quads (dwp: the 16 f16 scales). */
AI void q_group_scale(float32x4_t acc[4], const int32x4_t is[4], const uint16_t *dwp, float dx) {
    float16x8_t h0 = vreinterpretq_f16_u16(vld1q_u16(dwp));
    float16x8_t h1 = vreinterpretq_f16_u16(vld1q_u16(dwp + 8));
    float32x4_t dw[4] = {vcvt_f32_f16(vget_low_f16(h0)), vcvt_high_f32_f16(h0),
                         vcvt_f32_f16(vget_low_f16(h1)), vcvt_high_f32_f16(h1)};
    float32x4_t dxv = vdupq_n_f32(dx);
    for (int r = 0; r < 4; r++) acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(is[r]), vmulq_f32(dw[r], dxv));
}

AI void store_rows(float *y, int nrows, const float32x4_t acc[4]) {
    float out[CSD_QUANT_BLOCK_ROWS];
    for (int r = 0; r < 4; r++) vst1q_f32(out + 4 * r, acc[r]);
    memcpy(y, out, (size_t)nrows * sizeof(float));
}

/* The view of token t's quantized activations (ref's layout: int8s, then scales, then sums). */
typedef struct act_view {
    const int8_t *xq;
    const float *dx;
    const int32_t *sums;
} act_view;

AI act_view view_act(const uint8_t *act, int64_t ng) {
    act_view a;
    a.xq = (const int8_t *)act;
    a.dx = (const float *)(const void *)(a.xq + ng * CSD_QUANT_GROUP);
    a.sums = (const int32_t *)(const void *)(a.dx + ng);
    return a;
}

/* Group g of a block (blk) for T tokens (a[t]): acc[t] += the group's rows, scaled. The one
 * sequence q_block and q_streams share, so a token's rows come out the same from either. */
AI void q_group(const int T, const int q4, float32x4_t acc[][4], const uint8_t *blk, int64_t g,
                const act_view *a, int pf) {
    const int dtype = q4 ? CSD_DTYPE_Q4 : CSD_DTYPE_Q8;
    const uint8_t *wg = blk + csd_quant_group_offset(dtype, g);
    if (pf) csd_q_prefetch_pair_gap(wg, dtype, g, PF_AHEAD, pf);
    int32x4_t is[QT_MAX][4];
    const int8_t *xg[QT_MAX];
    for (int t = 0; t < T; t++) {
        xg[t] = a[t].xq + g * CSD_QUANT_GROUP;
        for (int r = 0; r < 4; r++) is[t][r] = vdupq_n_s32(q4 ? -8 * a[t].sums[g] : 0);
    }
    q_group_isum(T, q4, is, wg, xg, pf);
    const uint16_t *dwp = csd_quant_group_scales(dtype, blk, g);
    for (int t = 0; t < T; t++) q_group_scale(acc[t], is[t], dwp, a[t].dx[g]);
}

/* One 16-row block x T tokens (the csd_q_block_fn contract). */
AI void q_block(const int T, const int q4, float *y, int64_t ldy, int nrows, const uint8_t *blk,
                const uint8_t *act, size_t stride, int64_t ng, int pf) {
    act_view a[QT_MAX];
    float32x4_t acc[QT_MAX][4];
    for (int t = 0; t < T; t++) {
        a[t] = view_act(act + (size_t)t * stride, ng);
        for (int r = 0; r < 4; r++) acc[t][r] = vdupq_n_f32(0.0f);
    }
    for (int64_t g = 0; g < ng; g++) q_group(T, q4, acc, blk, g, a, pf);
    for (int t = 0; t < T; t++) store_rows(y + t * ldy, nrows, acc[t]);
}

CSD_DEF_Q_BLOCK(blocks_q4, 1, 1)
CSD_DEF_Q_BLOCK(blocks_q4, 1, 2)
CSD_DEF_Q_BLOCK(blocks_q8, 0, 1)
CSD_DEF_Q_BLOCK(blocks_q8, 0, 2)
static const csd_q_block_fn blocks_q4[QT_MAX] = {blocks_q4_1, blocks_q4_2};
static const csd_q_block_fn blocks_q8[QT_MAX] = {blocks_q8_1, blocks_q8_2};

/* One token over S blocks far apart (S weight streams), group by group across the streams. */
AI void q_streams(const int S, const int q4, float *const *y, const int *nrows,
                  const uint8_t *const *blk, const uint8_t *act, int64_t ng) {
    act_view a = view_act(act, ng);
    float32x4_t acc[CSD_MV_STREAMS][4];
    for (int i = 0; i < S; i++)
        for (int r = 0; r < 4; r++) acc[i][r] = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < ng; g++)
        for (int i = 0; i < S; i++) q_group(1, q4, &acc[i], blk[i], g, &a, CSD_PF_ONCE);
    for (int i = 0; i < S; i++) store_rows(y[i], nrows[i], acc[i]);
}

CSD_DEF_Q_STREAM_TABLES

static void neon_matmul_q4_q8(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                              int64_t r0, int64_t r1) {
    csd_q_blocks_run(blocks_q4, QT_MAX, y, w, act, n_tok, r0, r1);
}

static void neon_matmul_q8_q8(float *y, const csd_qmat *w, const uint8_t *act, int64_t n_tok,
                              int64_t r0, int64_t r1) {
    csd_q_blocks_run(blocks_q8, QT_MAX, y, w, act, n_tok, r0, r1);
}

/* 4 f16 -> 4 f32 (hardware conversion, exact). */
AI float32x4_t load_f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* Dot products over 4 accumulators of 4 lanes, then one fixed reduction and the scalar tail. */
#define DEF_DOT(name, btype, load_b, elem_b)                                                 \
    static float name(const float *a, const btype *b, int64_t n) {                           \
        float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)}; \
        int64_t i = 0;                                                                       \
        for (; i + 16 <= n; i += 16)                                                         \
            for (int k = 0; k < 4; k++)                                                      \
                acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + i + 4 * k), load_b(b + i + 4 * k)); \
        for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + i), load_b(b + i)); \
        float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]))); \
        for (; i < n; i++) s += a[i] * elem_b(b[i]);                                         \
        return s;                                                                            \
    }
#define ELEM_F32(v) (v)
DEF_DOT(neon_dot_f32, float, vld1q_f32, ELEM_F32)
DEF_DOT(neon_dot_f32_f16, uint16_t, load_f16x4, csd_f16_to_f32)

/* y += a * x, 4 lanes at a time. */
#define DEF_AXPY(name, xtype, load_x, elem_x)                                                \
    static void name(float *y, float a, const xtype *x, int64_t n) {                         \
        int64_t i = 0;                                                                       \
        for (; i + 4 <= n; i += 4)                                                           \
            vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), load_x(x + i), a));              \
        for (; i < n; i++) y[i] += a * elem_x(x[i]);                                         \
    }
DEF_AXPY(neon_axpy_f32, float, vld1q_f32, ELEM_F32)
DEF_AXPY(neon_axpy_f16, uint16_t, load_f16x4, csd_f16_to_f32)

/* Round to nearest even in hardware (FPCR's default mode): bit-identical to ref's conversion. */
static void neon_f32_to_f16(uint16_t *out, const float *in, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(in + i))));
    if (i < n) csd_f32_to_f16_row(out + i, in + i, n - i);
}

const csd_kern_ops csd_kern_ops_neon = {
    .name = "neon",
    .quantize_act_q8 = neon_quantize_act_q8,
    .matmul_q4_q8 = neon_matmul_q4_q8,
    .matmul_q8_q8 = neon_matmul_q8_q8,
    .matvec_q4 = streams_q4,
    .matvec_q8 = streams_q8,
    .dot_f32 = neon_dot_f32,
    .dot_f32_f16 = neon_dot_f32_f16,
    .axpy_f32 = neon_axpy_f32,
    .axpy_f16 = neon_axpy_f16,
    .f32_to_f16 = neon_f32_to_f16,
};
