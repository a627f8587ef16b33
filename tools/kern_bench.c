/* kern_bench: micro-benchmark of csd_matmul on TinyLlama-1.1B shapes (not a test, not built by
 * CTest). Matvec weights rotate through copies totalling > 512 MB so every call reads DRAM, as a
 * decode step does. Build by hand from a configured build directory, e.g.:
 *   cc -O2 -I src tools/kern_bench.c build-kern/libcsd_kern.a build-kern/libcsd_core.a \
 *      -lpthread -lm -o build-kern/kern_bench
 *   ./build-kern/kern_bench [table|-] [dtype|all] [shape index|-1] [quick] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/pool.h"
#include "kern/kern.h"
#include "kern/kern_internal.h"

#define ROTATE_BYTES (768ull << 20)

static const int64_t shapes[][2] = {{2048, 2048}, {256, 2048}, {5632, 2048}, {2048, 5632},
                                    {32000, 2048}};

static float *rand_floats(int64_t n, uint64_t seed) {
    float *x = csd_alloc_array((size_t)n, sizeof *x);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)((int64_t)(s >> 40) - 8388608) / 8388608.0f;
    }
    return x;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *table = argc > 1 && strcmp(argv[1], "-") != 0 ? argv[1] : NULL;
    int only_dtype = argc > 2 && strcmp(argv[2], "all") != 0 ? csd_dtype_parse(argv[2]) : -1;
    int only_shape = argc > 3 ? atoi(argv[3]) : -1;
    int quick = argc > 4;
    const csd_kern_ops *ops = table ? csd_kern_table(table) : csd_kern_ops_current();
    if (!ops) {
        fprintf(stderr, "table %s unavailable\n", table);
        return 1;
    }
    printf("table=%s\n", ops->name);
    csd_pool *pools[2];
    csd_pool_create(&pools[0], 1, NULL);
    csd_pool_create(&pools[1], 2, NULL);
    const int dtypes[] = {CSD_DTYPE_Q4, CSD_DTYPE_Q8, CSD_DTYPE_F16};
    printf("%-6s %-12s %-4s %10s %9s %12s %12s %9s\n", "dtype", "shape", "thr", "matvec_us",
           "GB/s", "n8_GFLOP/s", "n8/1_cost", "n512_GF/s");
    for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
        int dtype = dtypes[di];
        if (only_dtype >= 0 && dtype != only_dtype) continue;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            if (only_shape >= 0 && (size_t)only_shape != si) continue;
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            size_t nb = csd_qmat_bytes(dtype, rows, cols);
            float *src = rand_floats(rows * cols, 1 + si);
            int n_copies = (int)(ROTATE_BYTES / nb) + 2;
            uint8_t *big = csd_alloc(nb * (size_t)n_copies);
            if (!big) return 1;
            csd_qmat_quantize(dtype, src, rows, cols, big, NULL);
            for (int k = 1; k < n_copies; k++) memcpy(big + (size_t)k * nb, big, nb);
            csd_free(src);
            int64_t max_tok = 512;
            float *x = rand_floats(max_tok * cols, 99);
            float *y = csd_alloc_array((size_t)(max_tok * rows), sizeof(float));
            void *scratch = csd_alloc(csd_matmul_scratch_bytes(cols, max_tok));
            for (int th = 0; th < 2; th++) {
                csd_pool *pool = pools[th];
                /* matvec, cold weights */
                enum { REPS = 60 };
                double t1[REPS];
                int reps = quick ? 20 : REPS;
                for (int i = 0; i < reps; i++) {
                    csd_qmat w = {dtype, rows, cols, big + (size_t)(i % n_copies) * nb, nb};
                    uint64_t a = csd_now_ns();
                    csd_kern_matmul_with(ops, pool, &w, x, 1, y, scratch);
                    t1[i] = (double)(csd_now_ns() - a) * 1e-9;
                }
                qsort(t1, (size_t)reps, sizeof(double), cmp_double);
                double tv = t1[reps / 2];
                /* n_tok = 8, cold weights */
                double t8[REPS];
                for (int i = 0; i < reps; i++) {
                    csd_qmat w = {dtype, rows, cols, big + (size_t)((i + 7) % n_copies) * nb, nb};
                    uint64_t a = csd_now_ns();
                    csd_kern_matmul_with(ops, pool, &w, x, 8, y, scratch);
                    t8[i] = (double)(csd_now_ns() - a) * 1e-9;
                }
                qsort(t8, (size_t)reps, sizeof(double), cmp_double);
                double tb = t8[reps / 2];
                /* n_tok = 512 (prompt), best of 3 */
                double tp = 1e9;
                for (int i = 0; i < (quick ? 1 : 3); i++) {
                    csd_qmat w = {dtype, rows, cols, big, nb};
                    uint64_t a = csd_now_ns();
                    csd_kern_matmul_with(ops, pool, &w, x, 512, y, scratch);
                    double t = (double)(csd_now_ns() - a) * 1e-9;
                    if (t < tp) tp = t;
                }
                double flop = 2.0 * (double)rows * (double)cols;
                char shape[32];
                snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
                printf("%-6s %-12s %-4d %10.1f %9.2f %12.1f %12.2f %9.1f\n", csd_dtype_name(dtype),
                       shape, th + 1, tv * 1e6, (double)nb / tv * 1e-9, flop * 8 / tb * 1e-9,
                       tb / tv, flop * 512 / tp * 1e-9);
                fflush(stdout);
            }
            csd_free(scratch);
            csd_free(y);
            csd_free(x);
            csd_free(big);
        }
    }
    csd_pool_destroy(pools[0]);
    csd_pool_destroy(pools[1]);
    return 0;
}
