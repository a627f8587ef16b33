/* test_kern_attention: single-head attention (csd_attend_f16_with) in every table this CPU
 * supports against a float64 softmax-attention over the same f16 cache, for head sizes with and
 * without a fused kernel, strided rows and one to hundreds of positions; results deterministic call
 * to call. The grouped form (several query heads over one K/V head) gives each head exactly its
 * single-head result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "kern/kern.h"
#include "kern/kern_internal.h"

static const char *const table_names[] = {"ref", "avx2", "avxvnni", "avx512", "neon"};
#define N_TABLES (int)(sizeof table_names / sizeof table_names[0])

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform in (-a, a). */
static float rng_sym(uint64_t *s, float a) {
    return a * (float)((int64_t)(rng_next(s) >> 40) - 8388608) / 8388608.0f;
}

/* softmax(scale * q . k_t) V in double over the f16 values as stored. */
static void attend_f64(double *out, const float *q, const uint16_t *k, const uint16_t *v,
                       int64_t ld, int64_t n, int64_t hd, float scale) {
    double s[512], max = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n; t++) {
        double d = 0;
        for (int64_t i = 0; i < hd; i++) d += (double)q[i] * csd_f16_to_f32(k[t * ld + i]);
        s[t] = d * scale;
        max = fmax(max, s[t]);
    }
    for (int64_t t = 0; t < n; t++) sum += s[t] = exp(s[t] - max);
    for (int64_t i = 0; i < hd; i++) {
        double o = 0;
        for (int64_t t = 0; t < n; t++) o += s[t] / sum * csd_f16_to_f32(v[t * ld + i]);
        out[i] = o;
    }
}

static void test_attend_matches_f64(void **state) {
    (void)state;
    static const int64_t hds[] = {16, 18, 32, 64, 80, 128, 200, 264}; /* 18: vector tails */
    static const int64_t ns[] = {1, 2, 7, 64, 301, 512};
    uint64_t seed = 0x1234567;
    int checked = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
        int64_t hd = hds[hi], ld = hd * 3 + 8; /* rows of a cache with several kv heads */
        uint16_t *k = csd_alloc_array((size_t)(512 * ld), sizeof *k);
        uint16_t *v = csd_alloc_array((size_t)(512 * ld), sizeof *v);
        float *q = csd_alloc_array((size_t)hd, sizeof *q), *out = csd_alloc_array((size_t)hd, 4);
        float *out2 = csd_alloc_array((size_t)hd, 4), *att = csd_alloc_array(512, sizeof *att);
        double *want = csd_alloc_array((size_t)hd, sizeof *want);
        for (int64_t i = 0; i < 512 * ld; i++) {
            k[i] = csd_f32_to_f16(rng_sym(&seed, 2.0f));
            v[i] = csd_f32_to_f16(rng_sym(&seed, 1.0f));
        }
        for (int64_t i = 0; i < hd; i++) q[i] = rng_sym(&seed, 1.5f);
        float scale = 1.0f / sqrtf((float)hd);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            int64_t n = ns[ni];
            attend_f64(want, q, k, v, ld, n, hd, scale);
            for (int ti = 0; ti < N_TABLES; ti++) {
                const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
                if (!ops) continue;
                csd_attend_f16_with(ops, out, q, k, v, ld, n, hd, scale, att);
                csd_attend_f16_with(ops, out2, q, k, v, ld, n, hd, scale, att);
                assert_memory_equal(out, out2, (size_t)hd * sizeof *out);
                for (int64_t i = 0; i < hd; i++) {
                    if (fabs(out[i] - want[i]) > 2e-5 * (1.0 + fabs(want[i]))) {
                        fail_msg("table %s hd %lld n %lld out[%lld] = %.8f, want %.8f",
                                 table_names[ti], (long long)hd, (long long)n, (long long)i,
                                 out[i], want[i]);
                    }
                }
                checked++;
            }
        }
        csd_free(k);
        csd_free(v);
        csd_free(q);
        csd_free(out);
        csd_free(out2);
        csd_free(att);
        csd_free(want);
    }
    printf("attention: %d (table, head size, length) cases checked\n", checked);
    assert_true(checked >= 7 * 6); /* at least ref */
}

/* csd_attend_f16_group == csd_attend_f16_with head by head, bit for bit, for group sizes that fill
 * a kernel pass, leave a partial one or span several. */
static void test_attend_group_matches_heads(void **state) {
    (void)state;
    static const int64_t hds[] = {16, 18, 64, 76, 80, 128, 200, 264};
    static const int64_t gs[] = {1, 2, 3, 4, 5, 8};
    static const int64_t ns[] = {1, 7, 64, 301};
    uint64_t seed = 0xabcdef;
    int checked = 0, fused = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
        int64_t hd = hds[hi], ld = hd * 2 + 8, gmax = 8, nmax = 301;
        uint16_t *k = csd_alloc_array((size_t)(nmax * ld), sizeof *k);
        uint16_t *v = csd_alloc_array((size_t)(nmax * ld), sizeof *v);
        float *q = csd_alloc_array((size_t)(gmax * hd), sizeof *q);
        float *out = csd_alloc_array((size_t)(gmax * hd), sizeof *out);
        float *one = csd_alloc_array((size_t)hd, sizeof *one);
        float *att = csd_alloc_array((size_t)(gmax * nmax), sizeof *att);
        for (int64_t i = 0; i < nmax * ld; i++) {
            k[i] = csd_f32_to_f16(rng_sym(&seed, 2.0f));
            v[i] = csd_f32_to_f16(rng_sym(&seed, 1.0f));
        }
        for (int64_t i = 0; i < gmax * hd; i++) q[i] = rng_sym(&seed, 1.5f);
        float scale = 1.0f / sqrtf((float)hd);
        for (int ti = 0; ti < N_TABLES; ti++) {
            const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
            if (!ops) continue;
            fused += hi == 0 && ops->attend_f16_group != NULL;
            for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                    int64_t g = gs[gi], n = ns[ni];
                    csd_attend_f16_group_with(ops, out, q, g, k, v, ld, n, hd, scale, att);
                    for (int64_t h = 0; h < g; h++) {
                        csd_attend_f16_with(ops, one, q + h * hd, k, v, ld, n, hd, scale, att);
                        if (memcmp(one, out + h * hd, (size_t)hd * sizeof *one) != 0)
                            fail_msg("table %s hd %lld group %lld n %lld: head %lld differs",
                                     table_names[ti], (long long)hd, (long long)g, (long long)n,
                                     (long long)h);
                    }
                    checked++;
                }
        }
        csd_free(k);
        csd_free(v);
        csd_free(q);
        csd_free(out);
        csd_free(one);
        csd_free(att);
    }
    printf("grouped attention: %d cases checked; %d of the tables have a fused group kernel\n",
           checked, fused);
    assert_true(checked >= 6 * 6 * 4); /* at least ref */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attend_matches_f64),
        cmocka_unit_test(test_attend_group_matches_heads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
