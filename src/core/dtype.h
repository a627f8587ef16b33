/* dtype: element types of tensors on disk, in memory and on the wire, and scalar conversions.
 * Values are persisted (shard files, wire frames): append only, never renumber. */
#ifndef CSD_DTYPE_H
#define CSD_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum csd_dtype {
    CSD_DTYPE_F32 = 0,
    CSD_DTYPE_F16 = 1,
    CSD_DTYPE_BF16 = 2,
    CSD_DTYPE_Q8 = 3, /* int8 symmetric, one f16 scale per group of 128 along a row */
    CSD_DTYPE_Q4 = 4, /* int4 symmetric, one f16 scale per group of 128 along a row */
    CSD_DTYPE_COUNT
};

const char *csd_dtype_name(int dtype);
/* Parses "f32|f16|bf16|int8|q8|int4|q4"; returns -1 when unknown. */
int csd_dtype_parse(const char *name);

static inline float csd_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t csd_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float csd_f16_to_f32(uint16_t h);
uint16_t csd_f32_to_f16(float f);

/* Bulk conversions (scalar; kernels have faster ones). */
void csd_f16_to_f32_row(float *out, const uint16_t *in, int64_t n);
void csd_bf16_to_f32_row(float *out, const uint16_t *in, int64_t n);
void csd_f32_to_f16_row(uint16_t *out, const float *in, int64_t n);

#endif
