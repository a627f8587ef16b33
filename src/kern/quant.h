/* quant: memory layouts of the quantized weight formats and of the quantized activations the
 * integer matmul reads. Q4 and Q8 are symmetric, one f16 scale per group of 128 inputs along a row,
 * stored in row-interleaved blocks of 16 rows (below). See docs/kernels.md. */
#ifndef CSD_QUANT_H
#define CSD_QUANT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

/* Elements per quantization group (weights and activations). */
#define CSD_QUANT_GROUP 128
/* Q4/Q8 matrices are stored in blocks of 16 consecutive rows, interleaved 4 inputs at a time, so
 * one 64-byte vector holds 4 inputs of each of the 16 rows: one integer dot-product instruction
 * (vpdpbusd) against 4 broadcast activations advances 16 outputs at once, and the per-group
 * float work (convert, scale, accumulate) is spread over 16 rows instead of repeated per row.
 * A block is one contiguous byte range (long streams for the prefetcher; stage and row-block
 * slices stay contiguous). */
#define CSD_QUANT_BLOCK_ROWS 16
/* Bytes of one 16-row x 4-input interleaved vector. */
#define CSD_QUANT_VEC_BYTES 64
/* Block alignment in bytes (one cache line). */
#define CSD_QUANT_BLOCK_ALIGN 64

/* Q4 group of one block: 16 rows x 128 weights as 16 vectors of 64 bytes. In vector k (0..15),
 * byte 4 * r + i holds row r's weight 4k + i in its low nibble and weight 64 + 4k + i in its high
 * nibble, both stored as q + 8 with q in [-8, 7]: one AND gives inputs 4k..4k+3 of all 16 rows,
 * one shift + AND gives inputs 64+4k..64+4k+3, ready for an unsigned x signed byte dot product. */
#define CSD_Q4_BLOCK_GROUP_BYTES 1024
/* Q8 group of one block: 32 vectors of 64 bytes; in vector k (0..31) byte 4 * r + i is row r's
 * weight 4k + i as a signed byte, q in [-127, 127] (-128 is never produced). */
#define CSD_Q8_BLOCK_GROUP_BYTES 2048

/* Block layout of Q4 and Q8 (ng = ceil(cols / 128) groups), in pairs of groups:
 *   [64-byte scale line: 16 f16 scales of group 2j, then of group 2j + 1][group 2j][group 2j + 1]
 * repeated; a last odd group has its pair's line to itself (second half zero). Weight (r, c) of
 * the block is (scale r of group c / 128) * q. A decode kernel walks a block as one sequential
 * stream and meets each group's scales just before its weights, so no scale waits on DRAM
 * (scales stored after all the groups cost ~10% of INT4 decode bandwidth: a second, scattered
 * access per block). In a short last group the missing weights are stored as q = 0, and the rows
 * past the end of the matrix in its last block are zero bytes (scale 0: they add nothing), so
 * kernels always process whole groups of whole blocks (the activations are zero-padded as well)
 * and only mask the store. */
static inline int64_t csd_quant_groups(int64_t cols) {
    return (cols + CSD_QUANT_GROUP - 1) / CSD_QUANT_GROUP;
}

static inline int64_t csd_quant_blocks(int64_t rows) {
    return (rows + CSD_QUANT_BLOCK_ROWS - 1) / CSD_QUANT_BLOCK_ROWS;
}

static inline size_t csd_quant_block_group_bytes(int dtype) {
    return dtype == CSD_DTYPE_Q4 ? CSD_Q4_BLOCK_GROUP_BYTES : CSD_Q8_BLOCK_GROUP_BYTES;
}

/* Bytes of one pair of groups with its scale line. */
static inline size_t csd_quant_pair_bytes(int dtype) {
    return CSD_QUANT_BLOCK_ALIGN + 2 * csd_quant_block_group_bytes(dtype);
}

/* Offset in a block of group g's weights, and of its 16 f16 scales. */
static inline size_t csd_quant_group_offset(int dtype, int64_t g) {
    return (size_t)(g / 2) * csd_quant_pair_bytes(dtype) + CSD_QUANT_BLOCK_ALIGN +
           (size_t)(g % 2) * csd_quant_block_group_bytes(dtype);
}
static inline size_t csd_quant_scale_offset(int dtype, int64_t g) {
    return (size_t)(g / 2) * csd_quant_pair_bytes(dtype) +
           (size_t)(g % 2) * CSD_QUANT_BLOCK_ROWS * sizeof(uint16_t);
}

/* Bytes of one 16-row block of a Q4/Q8 matrix with ng groups of inputs (a multiple of 64). */
static inline size_t csd_quant_block_bytes_ng(int dtype, int64_t ng) {
    return (size_t)ng * csd_quant_block_group_bytes(dtype) +
           (size_t)(ng + 1) / 2 * CSD_QUANT_BLOCK_ALIGN;
}

/* Bytes of one 16-row block of a Q4/Q8 matrix with cols inputs (a multiple of 64 bytes). */
static inline size_t csd_quant_block_bytes(int dtype, int64_t cols) {
    return csd_quant_block_bytes_ng(dtype, csd_quant_groups(cols));
}

/* The 16 f16 scales of group g of a block. */
static inline const uint16_t *csd_quant_group_scales(int dtype, const uint8_t *block, int64_t g) {
    return (const uint16_t *)(const void *)(block + csd_quant_scale_offset(dtype, g));
}

/* Bytes of one row of a plain (F32/F16/BF16) matrix: cols * element size; 0 for Q4/Q8, whose
 * rows are not separable (see the block layout). */
static inline size_t csd_quant_row_bytes(int dtype, int64_t cols) {
    switch (dtype) {
    case CSD_DTYPE_F32: return (size_t)cols * 4;
    case CSD_DTYPE_F16:
    case CSD_DTYPE_BF16: return (size_t)cols * 2;
    default: return 0;
    }
}

/* Writes group g of row `row` of a Q4/Q8 matrix (cols inputs) into the block layout at mat: q
 * holds 128 values in the dtype's range (zero past cols), scale is the group's f16 scale. The
 * caller zeroes the matrix first (Q4 nibbles are or-ed in; padding rows and bytes stay zero). */
void csd_quant_pack_group(int dtype, int64_t cols, uint8_t *mat, int64_t row, int64_t g,
                          const int8_t *q, uint16_t scale);
/* Weight q (row, c) of a Q4/Q8 matrix, and the f16 scale of its group. */
int csd_quant_get_q(int dtype, int64_t cols, const uint8_t *mat, int64_t row, int64_t c);
uint16_t csd_quant_get_scale(int dtype, int64_t cols, const uint8_t *mat, int64_t row, int64_t g);

/* Quantized activations (matmul scratch), per token, for a Q4/Q8 matmul:
 *   [ng * 128 int8 xq, zero-padded][ng float dx][ng int32 sum of xq in the group][pad to 64]
 * x[c] ~= dx[c / 128] * xq[c], xq in [-127, 127], dx = absmax / 127 (0 for an all-zero group).
 * The sums let a kernel use unsigned weights (q + 8, q + 128) and subtract the offset once. */
static inline size_t csd_quant_act_stride(int64_t cols) {
    size_t ng = (size_t)csd_quant_groups(cols);
    size_t n = ng * CSD_QUANT_GROUP + ng * sizeof(float) + ng * sizeof(int32_t);
    return (n + 63) / 64 * 64;
}

#endif
