/* test_kern_elementwise: the softmax step, the SiLU gate and RMSNorm of every table this CPU
 * supports against float64, over the whole range their inputs take (and beyond: large magnitudes,
 * NaN), and deterministic call to call. A table with its own exp (avx512) must stay within a few
 * ulp. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "kern/kern.h"
#include "kern/kern_internal.h"

static const char *const table_names[] = {"ref", "avx2", "avxvnni", "avx512", "neon"};
#define N_TABLES (int)(sizeof table_names / sizeof table_names[0])
#define N_MAX 1000

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform in [lo, hi). */
static float rng_range(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)(rng_next(s) >> 40) / 16777216.0f;
}

static void test_silu_mul_matches_f64(void **state) {
    (void)state;
    float g[N_MAX + 6], u[N_MAX + 6], out[N_MAX + 6], again[N_MAX + 6];
    uint64_t seed = 0xfeed;
    int64_t n = N_MAX;
    for (int64_t i = 0; i < n; i++) {
        float span = i < n / 2 ? 8.0f : 90.0f; /* typical gates, then the exp's far range */
        g[i] = rng_range(&seed, -span, span);
        u[i] = rng_range(&seed, -3.0f, 3.0f);
    }
    const float edge[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, -88.0f, 120.0f, -120.0f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) g[i] = edge[i];
    int checked = 0;
    for (int ti = 0; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (!ops) continue;
        /* lengths that are and are not a multiple of the vector width */
        for (int64_t len = 1; len <= n; len = len * 3 + 1) {
            memcpy(out, g, sizeof g);
            memcpy(again, g, sizeof g);
            ops->silu_mul(out, u, len);
            ops->silu_mul(again, u, len);
            assert_memory_equal(out, again, (size_t)len * sizeof *out);
            assert_memory_equal(out + len, g + len, sizeof(float)); /* nothing past len */
            for (int64_t i = 0; i < len; i++) {
                double x = g[i], want = x / (1.0 + exp(-x)) * u[i];
                if (fabs(out[i] - want) > 4e-7 * fabs(want) + 1e-37)
                    fail_msg("table %s silu_mul(%.9g) * %.9g = %.9g, want %.9g", table_names[ti],
                             g[i], u[i], out[i], want);
            }
            checked++;
        }
        float nan_g = NAN, one = 1.0f;
        ops->silu_mul(&nan_g, &one, 1);
        assert_true(isnan(nan_g));
    }
    printf("silu_mul: %d (table, length) cases\n", checked);
    assert_true(checked >= 7);
}

static void test_softmax_matches_f64(void **state) {
    (void)state;
    float s[N_MAX], att[N_MAX], again[N_MAX];
    uint64_t seed = 0xabc;
    int checked = 0;
    for (int64_t n = 1; n <= N_MAX; n = n * 2 + 3) {
        float max = -INFINITY;
        for (int64_t t = 0; t < n; t++) {
            s[t] = rng_range(&seed, -40.0f, 12.0f); /* scaled scores, some far below the max */
            if (s[t] > max) max = s[t];
        }
        double sum = 0; /* over the differences as the kernels form them, in float */
        for (int64_t t = 0; t < n; t++) sum += exp((double)(s[t] - max));
        for (int ti = 0; ti < N_TABLES; ti++) {
            const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
            if (!ops) continue;
            memcpy(att, s, (size_t)n * sizeof *s);
            memcpy(again, s, (size_t)n * sizeof *s);
            float inv = ops->softmax(att, n, max);
            float inv2 = ops->softmax(again, n, max);
            assert_memory_equal(att, again, (size_t)n * sizeof *att);
            assert_true(inv == inv2);
            if (fabs(inv * sum - 1.0) > 2e-6)
                fail_msg("table %s n %lld: 1/sum = %.9g, want %.9g", table_names[ti], (long long)n,
                         inv, 1.0 / sum);
            for (int64_t t = 0; t < n; t++) {
                double want = exp((double)(s[t] - max));
                if (fabs(att[t] - want) > 3e-7 * want + 1e-38)
                    fail_msg("table %s n %lld: exp(%.9g) = %.9g, want %.9g", table_names[ti],
                             (long long)n, s[t] - max, att[t], want);
            }
            checked++;
        }
    }
    printf("softmax: %d (table, length) cases\n", checked);
    assert_true(checked >= 8);
}

static void test_rmsnorm_matches_f64(void **state) {
    (void)state;
    static float x[N_MAX], w[N_MAX], out[N_MAX], again[N_MAX];
    uint64_t seed = 0x5eed;
    for (int64_t i = 0; i < N_MAX; i++) {
        x[i] = rng_range(&seed, -4.0f, 4.0f) * (i % 97 == 0 ? 50.0f : 1.0f); /* a few outliers */
        w[i] = rng_range(&seed, 0.5f, 1.5f);
    }
    int checked = 0;
    for (int ti = 0; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (!ops) continue;
        for (int64_t n = 1; n <= N_MAX; n = n * 2 + 5) {
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
            double scale = 1.0 / sqrt(ss / (double)n + 1e-5);
            ops->rmsnorm(out, x, w, n, 1e-5f);
            memcpy(again, x, sizeof x);
            ops->rmsnorm(again, again, w, n, 1e-5f); /* in place, as the q/k head norms run */
            assert_memory_equal(out, again, (size_t)n * sizeof *out);
            for (int64_t i = 0; i < n; i++) {
                double want = x[i] * scale * w[i];
                if (fabs(out[i] - want) > 3e-7 * fabs(want) + 1e-30)
                    fail_msg("table %s n %lld: out[%lld] = %.9g, want %.9g", table_names[ti],
                             (long long)n, (long long)i, out[i], want);
            }
            checked++;
        }
    }
    printf("rmsnorm: %d (table, length) cases\n", checked);
    assert_true(checked >= 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_silu_mul_matches_f64),
        cmocka_unit_test(test_softmax_matches_f64),
        cmocka_unit_test(test_rmsnorm_matches_f64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
