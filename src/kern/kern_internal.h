/* kern_internal: the dispatch table shared by ref.c, the per-ISA files, dispatch.c and the tests.
 * Every table has the same semantics as ref.c (the spec); ISA tables may differ from it only in
 * float summation order. Each table is deterministic: one output element is always computed by
 * the same sequence of operations, whatever n_tok, the row range or the thread count. */
#ifndef CSD_KERN_INTERNAL_H
#define CSD_KERN_INTERNAL_H

#include <assert.h>
#include <float.h>
#include <stdbool.h>
#include <stdint.h>

#include "kern.h"
#include "quant.h"

/* Integer matmul over quantized activations (quant.h layout, n_tok tokens at
 * csd_quant_act_stride(w->cols) bytes each): y[t * w->rows + r] for r in [r0, r1) only. */
typedef void (*csd_kern_matmul_q_fn)(float *y, const csd_qmat *w, const uint8_t *act,
                                     int64_t n_tok, int64_t r0, int64_t r1);
/* Float matmul, token t is x + t * ldx (w->cols f32): y[t * w->rows + r] for r in [r0, r1). */
typedef void (*csd_kern_matmul_f_fn)(float *y, const csd_qmat *w, const float *x, int64_t ldx,
                                     int64_t n_tok, int64_t r0, int64_t r1);

/* Matvec (one token) of the Q tables: S runs of blocks far apart walked side by side by one
 * thread, S weight streams in flight (DRAM serves several streams faster than one;
 * matvec_lanes.c deals the blocks). fn(y, nrows, blk, act, ng, nb, ahead) handles run i: nb
 * consecutive blocks from blk[i] into the rows from y[i], every block full (16 rows) but the
 * run's last, which has nrows[i]; csd_q_streams_fn tables hold the versions for
 * 1..CSD_MV_STREAMS streams. ahead: how many bytes past each weight vector a stream prefetches as
 * it loads it (the table's mv_pf_ahead). The best distance depends on the machine's memory, not
 * on the arithmetic, so it is a value rather than a constant of each kernel (docs/kernels.md,
 * "Prefetch distance"). Any value gives the same results: prefetches never change a sum. */
#define CSD_MV_STREAMS 2
/* Streams used, measured end to end (decode, token by token in one process): 2 for Q8 (1: +0.4%
 * token time) and for Q4 since the broadcast became the vpdpbusd operand (3 streams: +5-6% with
 * AVX-512, +1.5-2% with AVX2 and AVX-VNNI; 1: as 3). A 3rd stream paid for itself only while the
 * streams shared each broadcast. */
typedef void (*csd_q_streams_fn)(float *const *y, const int *nrows, const uint8_t *const *blk,
                                 const uint8_t *act, int64_t ng, int64_t nb, size_t ahead);

typedef struct csd_kern_ops {
    const char *name;
    /* One-token Q4 / Q8 matvec, runs of blocks on 1..CSD_MV_STREAMS streams at a time (a table's
     * own kernels, never inherited from another table). NULL (ref): one token goes through
     * matmul_q4_q8 / matmul_q8_q8 like a batch. */
    const csd_q_streams_fn *matvec_q4, *matvec_q8;
    /* The prefetch distance (bytes) of matvec_q4/q8 and of read_streams: the one measured on a
     * CPU that runs this table, or CSD_PF_AHEAD from the environment (dispatch.c). */
    size_t mv_pf_ahead;
    /* One token: x (cols f32) -> act (csd_quant_act_stride(cols) bytes). Bit-identical in all
     * tables (same float operations, round-to-nearest-even, csd_act_group_bad and
     * csd_act_group_inv for the groups no plain rule covers). */
    void (*quantize_act_q8)(uint8_t *act, const float *x, int64_t cols);
    csd_kern_matmul_q_fn matmul_q4_q8;
    csd_kern_matmul_q_fn matmul_q8_q8;
    csd_kern_matmul_f_fn matmul_f32_f32;
    csd_kern_matmul_f_fn matmul_f16_f32;
    csd_kern_matmul_f_fn matmul_bf16_f32;
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    float (*dot_f32_f16)(const float *a, const uint16_t *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    void (*f32_to_f16)(uint16_t *out, const float *in, int64_t n);
    float (*softmax)(float *att, int64_t n, float max);          /* csd_attn_softmax */
    void (*silu_mul)(float *g, const float *u, int64_t n);        /* csd_silu_mul */
    /* csd_rmsnorm */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    /* csd_read_streams, prefetching `ahead` bytes ahead as the matvec streams do */
    uint64_t (*read_streams)(const uint8_t *p, size_t bytes, int streams, bool nta, size_t ahead);
    /* Fused single-head attention (csd_attend_f16_group with g = 1, see kern.h). Returns false for
     * a head size it does not handle; NULL or false: attention.c composes it from dot_f32_f16 and
     * axpy_f16 (with ref's: the spec). */
    bool (*attend_f16)(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                       int64_t ld, int64_t n, int64_t hd, float scale, float *att);
    /* Fused csd_attend_f16_group (see kern.h), the same contract; NULL or false: attention.c
     * calls attend_f16 head by head (bit-identical, the K/V rows read once per head). */
    bool (*attend_f16_group)(float *out, const float *q, int64_t g, const uint16_t *k,
                             const uint16_t *v, int64_t ld, int64_t n, int64_t hd, float scale,
                             float *att);
} csd_kern_ops;

/* How a kernel prefetches weights coming from DRAM. Weights read once per matmul (decode, or
 * every token in one tile) go through the cache non-temporally: a normal prefetch of a 600 MB
 * model per token evicts everything else (activations, norms, the KV cache) from L2 and L3 and
 * makes the caches write the weights back as victims; measured on AMD EPYC (AVX-512, AVX2 tables),
 * INT4 decode +17% and F16 decode +5% with the non-temporal hint, the same raw read bandwidth.
 * Weights that later token tiles read again keep the normal hint, so they stay in L1/L2. */
enum {
    CSD_PF_NONE = 0,   /* already in cache: no prefetch */
    CSD_PF_REUSED = 1, /* read again by later tiles: prefetch into L1/L2 */
    CSD_PF_ONCE = 2,   /* read once: prefetch non-temporally */
};
/* A statement, not a ?: of two prefetches: clang 14 at -O0 gives that expression a void phi and
 * crashes in instruction selection (a Debug build with clang). */
#define CSD_PREFETCH_WEIGHTS(p, pf)                                                          \
    do {                                                                                     \
        if ((pf) == CSD_PF_ONCE) __builtin_prefetch((p), 0, 0);                              \
        else __builtin_prefetch((p), 0, 3);                                                  \
    } while (0)

/* p's value hidden from the optimizer, so that p + a constant stays one address operand. With a
 * run-time distance, `w + 64 * k + ahead` over an unrolled k otherwise becomes w plus 16 hoisted
 * offsets, kept in registers, spilled and reloaded in the loop that streams the weights (GCC 12,
 * AVX-512 table). Kernels take pa = w + ahead once per group through this, then pa + 64 * k. */
#define CSD_OPAQUE_PTR(p) __asm__("" : "+r"(p))

/* Kernels prefetch `ahead` bytes past each 64-byte weight vector of group g (at wg) as they load
 * it; every pair's scale line moves the stream 64 bytes further, so the second group of a pair
 * adds the one line that would otherwise be missed. */
/* An activation group holding a NaN or an infinity (a previous stage's hidden state, say)
 * quantizes to NaN: scale NaN, values and sum 0, so every output that reads it is NaN as float
 * math would make it, never a finite guess. Every table detects such a group its own way and
 * writes it with this. */
static inline void csd_act_group_bad(int8_t *xq, float *dx, int32_t *sum) {
    for (int j = 0; j < CSD_QUANT_GROUP; j++) xq[j] = 0;
    *dx = __builtin_nanf("");
    *sum = 0;
}

/* The multiplier of a finite group whose largest magnitude is amax: 127 / amax, or 0 when that
 * is not finite (amax = 0, or below 127 / FLT_MAX: the group quantizes to zeros). */
static inline float csd_act_group_inv(float amax) {
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    return inv <= FLT_MAX ? inv : 0.0f;
}

static inline void csd_q_prefetch_pair_gap(const uint8_t *wg, int dtype, int64_t g, size_t ahead,
                                           int pf) {
    if (g % 2) CSD_PREFETCH_WEIGHTS(wg + csd_quant_block_group_bytes(dtype) + ahead, pf);
}

/* Defines name, the table's read_streams entry, from the including ISA file's always-inline
 * read_streams(pf, S, p, bytes, ahead) (S a constant: 1..CSD_READ_STREAMS_MAX). */
static_assert(CSD_READ_STREAMS_MAX == 4, "CSD_DEF_READ_STREAMS's switch covers 1-4 streams");
#define CSD_DEF_READ_STREAMS(name)                                                           \
    static uint64_t name##_any(const int pf, const uint8_t *p, size_t bytes, int streams,    \
                               size_t ahead) {                                               \
        switch (streams) {                                                                   \
        case 1: return read_streams(pf, 1, p, bytes, ahead);                                 \
        case 2: return read_streams(pf, 2, p, bytes, ahead);                                 \
        case 3: return read_streams(pf, 3, p, bytes, ahead);                                 \
        default: return read_streams(pf, 4, p, bytes, ahead);                                \
        }                                                                                    \
    }                                                                                        \
    static uint64_t name(const uint8_t *p, size_t bytes, int streams, bool nta,              \
                         size_t ahead) {                                                     \
        return nta ? name##_any(CSD_PF_ONCE, p, bytes, streams, ahead)                       \
                   : name##_any(CSD_PF_REUSED, p, bytes, streams, ahead);                    \
    }

/* One 16-row block x n tokens of a Q4/Q8 matmul (an ISA file's tile): y[t * ldy + r] for the
 * block's first nrows rows; pf (CSD_PF_*): whether and how to prefetch ahead in the block
 * stream. */
typedef void (*csd_q_block_fn)(float *y, int64_t ldy, int nrows, const uint8_t *blk,
                               const uint8_t *act, size_t stride, int64_t ng, int pf);
/* Defines name_T, the csd_q_block_fn for T tokens, from the including ISA file's always-inline
 * q_block(T, q4, y, ldy, nrows, blk, act, stride, ng, pf). */
#define CSD_DEF_Q_BLOCK(name, q4, T)                                                         \
    static void name##_##T(float *y, int64_t ldy, int nrows, const uint8_t *blk,             \
                           const uint8_t *act, size_t stride, int64_t ng, int pf) {          \
        q_block(T, q4, y, ldy, nrows, blk, act, stride, ng, pf);                             \
    }

/* Float matmul tiles (f32/f16/bf16 weights) of the AVX-512 and NEON tables: tiles[0][T - 1] is
 * 1 row x T tokens, tiles[1][T - 1] CSD_F_TILE_R rows x T tokens, tiles[2][0] CSD_F_MV_R rows x 1
 * token (the one-token matvec: more independent row streams in flight). */
#define CSD_F_TILE_R 4
#define CSD_F_TILE_T 4
#define CSD_F_MV_R 8
typedef void (*csd_f_tile_fn)(float *y, int64_t ldy, const uint8_t *row0, size_t row_bytes,
                              const float *x, int64_t ldx, int64_t cols);
/* Rows [r0, r1) of a float matmul in those tiles, tokens in chunks inner, so a tile's rows stay in
 * cache while the chunk's tokens sweep them. */
void csd_f_tiles_run(const csd_f_tile_fn tiles[3][CSD_F_TILE_T], float *y, const csd_qmat *w,
                     const float *x, int64_t ldx, int64_t n_tok, int64_t r0, int64_t r1);
/* Defines the table name[3][CSD_F_TILE_T] from the including ISA file's always-inline
 * f_tile(R, T, kind, y, ldy, row0, row_bytes, x, ldx, cols). */
#define CSD_DEF_F_TILE(name, kind, R, T)                                                     \
    static void name##_##R##_##T(float *y, int64_t ldy, const uint8_t *row0, size_t row_bytes, \
                                 const float *x, int64_t ldx, int64_t cols) {               \
        f_tile(R, T, kind, y, ldy, row0, row_bytes, x, ldx, cols);                           \
    }
#define CSD_DEF_F_TILES(name, kind)                                                          \
    CSD_DEF_F_TILE(name, kind, 1, 1) CSD_DEF_F_TILE(name, kind, 1, 2)                        \
    CSD_DEF_F_TILE(name, kind, 1, 3) CSD_DEF_F_TILE(name, kind, 1, 4)                        \
    CSD_DEF_F_TILE(name, kind, 4, 1) CSD_DEF_F_TILE(name, kind, 4, 2)                        \
    CSD_DEF_F_TILE(name, kind, 4, 3) CSD_DEF_F_TILE(name, kind, 4, 4)                        \
    CSD_DEF_F_TILE(name, kind, 8, 1)                                                         \
    static const csd_f_tile_fn name[3][CSD_F_TILE_T] = {                                     \
        {name##_1_1, name##_1_2, name##_1_3, name##_1_4},                                    \
        {name##_4_1, name##_4_2, name##_4_3, name##_4_4},                                    \
        {name##_8_1, NULL, NULL, NULL}};
static_assert(CSD_F_TILE_R == 4 && CSD_F_TILE_T == 4 && CSD_F_MV_R == 8,
              "CSD_DEF_F_TILES instantiates these shapes");
/* A table's float matmul entries (name_f32, name_f16, name_bf16) over those tiles, from the
 * including ISA file's f_tile and its weight kinds WF32, WF16, WBF16. */
#define CSD_DEF_MATMUL_F_TILED(name)                                                         \
    CSD_DEF_F_TILES(tiles_f32, WF32)                                                         \
    CSD_DEF_F_TILES(tiles_f16, WF16)                                                         \
    CSD_DEF_F_TILES(tiles_bf16, WBF16)                                                       \
    static void matmul_f(const csd_f_tile_fn tiles[3][CSD_F_TILE_T], float *y,               \
                         const csd_qmat *w, const float *x, int64_t ldx, int64_t n_tok,      \
                         int64_t r0, int64_t r1) {                                           \
        csd_f_tiles_run(tiles, y, w, x, ldx, n_tok, r0, r1);                                 \
    }                                                                                        \
    CSD_DEF_MATMUL_F(name)

/* Attention's K/V rows: a head's row is hd halves at the stride of the whole cache row, too short
 * a run for the hardware prefetcher, so the fused attention kernels prefetch the row this many
 * positions ahead (callers keep row inside the cache). */
#define CSD_ATTN_PF_ROWS 16
static inline void csd_attn_prefetch_row(const uint16_t *row, int64_t hd) {
    for (int64_t b = 0; b < hd * 2; b += 64) __builtin_prefetch((const char *)row + b, 0, 3);
}

/* The vector tables' exp (Cephes expf): x = n ln2 + r with n = round(x log2 e), ln2 split in two
 * so that n * LN2_HI is exact, exp(r) = 1 + r + r^2 (P0 + r (P1 + ... + r P5)) on |r| <= ln2/2,
 * then times 2^n. Within 2 ulp; the ISA files apply it (and 2^n) in their own registers. */
#define CSD_EXP_LOG2E 1.44269504088896341f
#define CSD_EXP_LN2_HI 0.693359375f
#define CSD_EXP_LN2_LO -2.12194440e-4f
#define CSD_EXP_P0 5.0000001201e-1f
#define CSD_EXP_P1 1.6666665459e-1f
#define CSD_EXP_P2 4.1665795894e-2f
#define CSD_EXP_P3 8.3334519073e-3f
#define CSD_EXP_P4 1.3981999507e-3f
#define CSD_EXP_P5 1.9875691500e-4f

/* The blocked Q matmul loop shared by the ISA files: blocks[n - 1] handles n tokens (1..tile_max).
 * Rows [r0, r1) in blocks, tokens in chunks of 64 inner, so a block stays in L1/L2 while they
 * sweep it; the first tile of each block and token chunk prefetches (CSD_PF_ONCE when that tile
 * holds every token of the chunk). */
void csd_q_blocks_run(const csd_q_block_fn *blocks, int tile_max, float *y, const csd_qmat *w,
                      const uint8_t *act, int64_t n_tok, int64_t r0, int64_t r1);

/* Defines name_f32, name_f16 and name_bf16, a table's float matmul entries, from the including
 * ISA file's matmul_f(tiles, y, w, x, ldx, n_tok, r0, r1) and its tiles_f32/_f16/_bf16. */
#define CSD_DEF_MATMUL_F_ONE(name, kind)                                                     \
    static void name##_##kind(float *y, const csd_qmat *w, const float *x, int64_t ldx,      \
                              int64_t n_tok, int64_t r0, int64_t r1) {                       \
        matmul_f(tiles_##kind, y, w, x, ldx, n_tok, r0, r1);                                 \
    }
#define CSD_DEF_MATMUL_F(name)                                                               \
    CSD_DEF_MATMUL_F_ONE(name, f32) CSD_DEF_MATMUL_F_ONE(name, f16)                          \
    CSD_DEF_MATMUL_F_ONE(name, bf16)

/* Defines the tables streams_q4 and streams_q8 (1-2 streams) from the including ISA file's
 * always-inline q_streams(S, q4, y, nrows, blk, act, ng, ahead), one block per stream, called
 * for each block of the runs in turn: one call per run rather than per block keeps a thread's
 * loads going from one block into the next (measured: see matvec_lanes.c). The pointer arrays
 * are built afresh for each block: advancing one array across the blocks gave wrong rows from the
 * second block on in the AVX2 table with GCC 12 at -O3 (not at -O2, nor with clang); the test
 * test_matvec_lanes_any_split caught it. */
#define CSD_DEF_Q_STREAM(name, q4, S)                                                        \
    static void name##_##S(float *const *y, const int *nrows, const uint8_t *const *blk,      \
                           const uint8_t *act, int64_t ng, int64_t nb, size_t ahead) {       \
        const size_t bytes = csd_quant_block_bytes_ng(q4 ? CSD_DTYPE_Q4 : CSD_DTYPE_Q8, ng);  \
        for (int64_t b = 0; b < nb; b++) {                                                   \
            float *yb[S];                                                                    \
            const uint8_t *wb[S];                                                            \
            int rows[S];                                                                     \
            for (int i = 0; i < S; i++) {                                                    \
                yb[i] = y[i] + b * CSD_QUANT_BLOCK_ROWS;                                     \
                wb[i] = blk[i] + (size_t)b * bytes;                                          \
                rows[i] = b == nb - 1 ? nrows[i] : CSD_QUANT_BLOCK_ROWS;                     \
            }                                                                                \
            q_streams(S, q4, yb, rows, wb, act, ng, ahead);                                  \
        }                                                                                    \
    }
#define CSD_DEF_Q_STREAM_TABLES                                                              \
    CSD_DEF_Q_STREAM(streams_q4, 1, 1)                                                       \
    CSD_DEF_Q_STREAM(streams_q4, 1, 2)                                                       \
    CSD_DEF_Q_STREAM(streams_q8, 0, 1)                                                       \
    CSD_DEF_Q_STREAM(streams_q8, 0, 2)                                                       \
    static const csd_q_streams_fn streams_q4[CSD_MV_STREAMS] = {streams_q4_1, streams_q4_2};  \
    static const csd_q_streams_fn streams_q8[CSD_MV_STREAMS] = {streams_q8_1, streams_q8_2};
/* One token through n_mats Q4/Q8 matrices of equal cols (y[i] = w[i] x, act: the token's quantized
 * activations) with ops' matvec kernels, on every thread of pool (matvec_lanes.c). False, with
 * nothing done, when ops has no matvec kernels (ref). */
bool csd_matvec_lanes(const csd_kern_ops *ops, csd_pool *pool, const csd_qmat *const *w, int n_mats,
                      float *const *y, const uint8_t *act);

/* A prefetch distance as CSD_PF_AHEAD gives it: decimal bytes, a multiple of 64 (whole cache
 * lines) from 0 to CSD_PF_AHEAD_MAX. False, *out untouched, for anything else. */
bool csd_kern_parse_pf_ahead(const char *s, size_t *out);

/* Per-file tables: NULL entries are filled by dispatch.c (avxvnni from avx2, then all from ref). */
extern const csd_kern_ops csd_kern_ops_ref;
#if defined(__x86_64__)
extern const csd_kern_ops csd_kern_ops_avx2;
extern const csd_kern_ops csd_kern_ops_avxvnni;
extern const csd_kern_ops csd_kern_ops_avx512;
#endif
#if defined(__aarch64__)
extern const csd_kern_ops csd_kern_ops_neon;
#endif

/* The complete (gap-filled) table called name ("ref", "avx2", "avxvnni", "avx512", "neon"), or
 * NULL when unknown or not supported by this CPU. Lives for the whole process. */
const csd_kern_ops *csd_kern_table(const char *name);
/* The table chosen by csd_kern_init (initialises on first use). */
const csd_kern_ops *csd_kern_ops_current(void);
/* One head's attention with an explicit table: the single-head path csd_attend_f16_group
 * matches. */
void csd_attend_f16_with(const csd_kern_ops *ops, float *out, const float *q, const uint16_t *k,
                         const uint16_t *v, int64_t ld, int64_t n, int64_t hd, float scale,
                         float *att);
/* Most query heads per K/V head a fused group kernel takes in one call (more: head by head). */
#define CSD_ATTN_GROUP_MAX 64
/* csd_attend_f16_group with an explicit table. */
void csd_attend_f16_group_with(const csd_kern_ops *ops, float *out, const float *q, int64_t g,
                               const uint16_t *k, const uint16_t *v, int64_t ld, int64_t n,
                               int64_t hd, float scale, float *att);
/* csd_matmul with an explicit table (tests compare tables through it). */
void csd_kern_matmul_with(const csd_kern_ops *ops, csd_pool *pool, const csd_qmat *w,
                          const float *x, int64_t n_tok, float *y, void *scratch);

#endif
