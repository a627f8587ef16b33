/* attention: query heads against a span of the KV cache, softmax(scale * q K^T) V, the inner
 * loop of the forward pass. Tables with fused kernels keep q and the output in registers and loop
 * over positions themselves (a group of heads sharing a K/V head at once); the others are composed
 * here, head by head, from their dot and axpy helpers (composed from ref's, this is the spec). */
#include "kern_internal.h"

#include <math.h>
#include <string.h>

float csd_attn_softmax(float *att, int64_t n, float max) {
    return csd_kern_ops_current()->softmax(att, n, max);
}

static void attend_composed(const csd_kern_ops *ops, float *out, const float *q,
                            const uint16_t *k, const uint16_t *v, int64_t ld, int64_t n,
                            int64_t hd, float scale, float *att) {
    float max = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        att[t] = ops->dot_f32_f16(q, k + t * ld, hd) * scale;
        if (att[t] > max) max = att[t];
    }
    float inv = ops->softmax(att, n, max);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t t = 0; t < n; t++) ops->axpy_f16(out, att[t] * inv, v + t * ld, hd);
}

void csd_attend_f16_with(const csd_kern_ops *ops, float *out, const float *q, const uint16_t *k,
                         const uint16_t *v, int64_t ld, int64_t n, int64_t hd, float scale,
                         float *att) {
    if (ops->attend_f16 && ops->attend_f16(out, q, k, v, ld, n, hd, scale, att)) return;
    attend_composed(ops, out, q, k, v, ld, n, hd, scale, att);
}

void csd_attend_f16_group_with(const csd_kern_ops *ops, float *out, const float *q, int64_t g,
                               const uint16_t *k, const uint16_t *v, int64_t ld, int64_t n,
                               int64_t hd, float scale, float *att) {
    if (ops->attend_f16_group && ops->attend_f16_group(out, q, g, k, v, ld, n, hd, scale, att))
        return;
    for (int64_t h = 0; h < g; h++)
        csd_attend_f16_with(ops, out + h * hd, q + h * hd, k, v, ld, n, hd, scale, att);
}

void csd_attend_f16_group(float *out, const float *q, int64_t g, const uint16_t *k,
                          const uint16_t *v, int64_t ld, int64_t n, int64_t hd, float scale,
                          float *att) {
    csd_attend_f16_group_with(csd_kern_ops_current(), out, q, g, k, v, ld, n, hd, scale, att);
}
