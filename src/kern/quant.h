/* quant: memory layouts of the quantized weight formats and of the quantized activations the
 * integer matmul reads. Q4 and Q8 are symmetric, one f16 scale per group of 128 inputs along a row.
 * Every row is self-contained at offset row * row_bytes, so a row slice of a matrix is one
 * contiguous byte range (tensor-parallel slicing, mmapped shards). See docs/kernels.md. */
#ifndef CSD_QUANT_H
#define CSD_QUANT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

/* Elements per quantization group (weights and activations). */
#define CSD_QUANT_GROUP 128
/* Row alignment in bytes for Q4/Q8: keeps every 64-byte vector load inside two 32-byte halves,
 * which is what Zen 4 and AVX2 load ports care about, at <= 31 bytes of padding per row. */
#define CSD_QUANT_ROW_ALIGN 32

/* Q4 group: 128 weights as 64 bytes. Byte j holds element j in its low nibble and element j + 64 in
 * its high nibble, both stored as q + 8 with q in [-8, 7]: one AND gives elements 0..63 and one
 * shift + AND gives 64..127, each in input order, ready for an unsigned x signed byte dot product.
 */
typedef struct csd_q4_group {
    uint8_t qs[CSD_QUANT_GROUP / 2];
} csd_q4_group;
static_assert(sizeof(csd_q4_group) == 64, "q4 group must be 64 bytes");

/* Q8 group: 128 weights as signed bytes, q in [-127, 127] (-128 is never produced). */
typedef struct csd_q8_group {
    int8_t qs[CSD_QUANT_GROUP];
} csd_q8_group;
static_assert(sizeof(csd_q8_group) == 128, "q8 group must be 128 bytes");

/* Row layout of Q4 and Q8 (ng = ceil(cols / 128) groups):
 *   [ng groups (csd_q4_group or csd_q8_group)][ng f16 scales][zero padding to 32 bytes]
 * Weight c of the row is d[c / 128] * q. In a short last group the missing weights are stored as
 * q = 0, so kernels always process whole groups (the activations are zero-padded as well). */
static inline int64_t csd_quant_groups(int64_t cols) {
    return (cols + CSD_QUANT_GROUP - 1) / CSD_QUANT_GROUP;
}

static inline size_t csd_quant_group_bytes(int dtype) {
    return dtype == CSD_DTYPE_Q4 ? sizeof(csd_q4_group) : sizeof(csd_q8_group);
}

/* Bytes of one row of a rows x cols matrix in dtype (plain types: cols * element size). */
static inline size_t csd_quant_row_bytes(int dtype, int64_t cols) {
    switch (dtype) {
    case CSD_DTYPE_F32: return (size_t)cols * 4;
    case CSD_DTYPE_F16:
    case CSD_DTYPE_BF16: return (size_t)cols * 2;
    case CSD_DTYPE_Q4:
    case CSD_DTYPE_Q8: {
        size_t ng = (size_t)csd_quant_groups(cols);
        size_t n = ng * csd_quant_group_bytes(dtype) + ng * sizeof(uint16_t);
        return (n + CSD_QUANT_ROW_ALIGN - 1) / CSD_QUANT_ROW_ALIGN * CSD_QUANT_ROW_ALIGN;
    }
    default: return 0;
    }
}

/* The f16 scales of a Q4/Q8 row start right after its groups. */
static inline const uint16_t *csd_quant_row_scales(int dtype, const uint8_t *row, int64_t cols) {
    return (const uint16_t *)(const void *)(row + (size_t)csd_quant_groups(cols) *
                                                      csd_quant_group_bytes(dtype));
}

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
