/* kern_bench: micro-benchmark of csd_matmul on TinyLlama-1.1B shapes (not a test, not built by
 * CTest). Matvec weights rotate through copies totalling > 512 MB so every call reads DRAM, as a
 * decode step does. Build by hand from a configured build directory, e.g.:
 *   cc -O3 -march=native -I src tools/kern_bench.c build-kern/libcsd_kern.a \
 *      build-kern/libcsd_core.a -lpthread -lm -o build-kern/kern_bench
 *   ./build-kern/kern_bench [table|-] [dtype|all] [shape index|-1] [quick]
 * KERN_BENCH_ROTATE_MB=0 keeps the weights hot in cache (compute-bound figures). */
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

typedef struct read_job {
    const uint64_t *p;
    int64_t n;
    uint64_t sink[256];
} read_job;

static void read_part(void *ctx, int ith, int nth) {
    read_job *job = ctx;
    int64_t b, e;
    csd_split_range(job->n, ith, nth, &b, &e);
    uint64_t acc[8] = {0};
    for (int64_t i = b; i + 8 <= e; i += 8)
        for (int k = 0; k < 8; k++) acc[k] ^= job->p[i + k];
    job->sink[ith] = acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
}

/* Plain streaming read of 1 GiB: the decode roofline, measured in the same conditions. */
static double read_bw(csd_pool *pool) {
    static read_job job;
    int64_t n = (1ll << 30) / 8;
    uint64_t *buf = csd_alloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) buf[i] = (uint64_t)i;
    job.p = buf;
    job.n = n;
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t a = csd_now_ns();
        csd_pool_run(pool, read_part, &job);
        double t = (double)(csd_now_ns() - a) * 1e-9;
        if (t < best) best = t;
    }
    csd_free(buf);
    return (double)n * 8 / best * 1e-9;
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
    printf("read GB/s: 1 thread %.1f, 2 threads %.1f\n", read_bw(pools[0]), read_bw(pools[1]));
    const int dtypes[] = {CSD_DTYPE_Q4, CSD_DTYPE_Q8, CSD_DTYPE_F16};
    printf("%-6s %-12s %-4s %10s %9s %9s %7s %12s %10s %10s\n", "dtype", "shape", "thr",
           "matvec_us", "GB/s", "read_GB/s", "ratio", "n8_GFLOP/s", "n8/1_cost", "n512_GF/s");
    for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
        int dtype = dtypes[di];
        if (only_dtype >= 0 && dtype != only_dtype) continue;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            if (only_shape >= 0 && (size_t)only_shape != si) continue;
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            size_t nb = csd_qmat_bytes(dtype, rows, cols);
            float *src = rand_floats(rows * cols, 1 + si);
            const char *rot = getenv("KERN_BENCH_ROTATE_MB"); /* 0: hot caches (compute bound) */
            size_t rotate = rot ? (size_t)atoll(rot) << 20 : ROTATE_BYTES;
            int n_copies = (int)(rotate / nb) + (rot ? 1 : 2);
            uint8_t *big = csd_alloc(nb * (size_t)n_copies);
            if (!big) return 1;
            uint64_t q0 = csd_now_ns();
            csd_qmat_quantize(dtype, src, rows, cols, big, NULL);
            double qs = (double)(csd_now_ns() - q0) * 1e-9;
            printf("# %s %lldx%lld quantize: %.1f Mweights/s (1 thread)\n", csd_dtype_name(dtype),
                   (long long)rows, (long long)cols, (double)rows * (double)cols / qs * 1e-6);
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
                double t1[REPS], tr[REPS];
                int reps = quick ? 20 : REPS;
                static read_job rj;
                for (int i = 0; i < reps; i++) { /* a plain read of other copies, interleaved */
                    rj.p = (const uint64_t *)(const void *)(big + (size_t)((i + n_copies / 2) %
                                                                           n_copies) *
                                                                      nb);
                    rj.n = (int64_t)(nb / 8);
                    uint64_t a = csd_now_ns();
                    csd_pool_run(pool, read_part, &rj);
                    tr[i] = (double)(csd_now_ns() - a) * 1e-9;
                    csd_qmat w = {dtype, rows, cols, big + (size_t)(i % n_copies) * nb, nb};
                    a = csd_now_ns();
                    csd_kern_matmul_with(ops, pool, &w, x, 1, y, scratch);
                    t1[i] = (double)(csd_now_ns() - a) * 1e-9;
                }
                qsort(t1, (size_t)reps, sizeof(double), cmp_double);
                qsort(tr, (size_t)reps, sizeof(double), cmp_double);
                double tv = t1[reps / 10]; /* 10th percentile: the machine is shared */
                double tread = tr[reps / 10];
                /* n_tok = 8, cold weights */
                double t8[REPS];
                for (int i = 0; i < reps; i++) {
                    csd_qmat w = {dtype, rows, cols, big + (size_t)((i + 7) % n_copies) * nb, nb};
                    uint64_t a = csd_now_ns();
                    csd_kern_matmul_with(ops, pool, &w, x, 8, y, scratch);
                    t8[i] = (double)(csd_now_ns() - a) * 1e-9;
                }
                qsort(t8, (size_t)reps, sizeof(double), cmp_double);
                double tb = t8[reps / 10];
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
                printf("%-6s %-12s %-4d %10.1f %9.2f %9.2f %7.2f %12.1f %10.2f %10.1f\n",
                       csd_dtype_name(dtype), shape, th + 1, tv * 1e6, (double)nb / tv * 1e-9,
                       (double)nb / tread * 1e-9, tread / tv, flop * 8 / tb * 1e-9, tb / tv,
                       flop * 512 / tp * 1e-9);
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
