/* dtype: names and IEEE half conversions (see dtype.h). */
#include "dtype.h"

#include <string.h>

static const char *const dtype_names[CSD_DTYPE_COUNT] = {"f32", "f16", "bf16", "int8", "int4"};

const char *csd_dtype_name(int dtype) {
    if (dtype < 0 || dtype >= CSD_DTYPE_COUNT) return "?";
    return dtype_names[dtype];
}

int csd_dtype_parse(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < CSD_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_names[i]) == 0) return i;
    if (strcmp(name, "q8") == 0) return CSD_DTYPE_Q8;
    if (strcmp(name, "q4") == 0) return CSD_DTYPE_Q4;
    return -1;
}

float csd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ffu;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t csd_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
    if (exp <= 0) {                                     /* subnormal or zero */
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++; /* may carry into exp: fine */
    return (uint16_t)half;
}

void csd_f16_to_f32_row(float *out, const uint16_t *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = csd_f16_to_f32(in[i]);
}

void csd_bf16_to_f32_row(float *out, const uint16_t *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = csd_bf16_to_f32(in[i]);
}

void csd_f32_to_f16_row(uint16_t *out, const float *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = csd_f32_to_f16(in[i]);
}
