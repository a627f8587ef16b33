/* kern_bench: micro-benchmark of csd_matmul on TinyLlama-1.1B shapes (a developer's tool, not a
 * test). Matvec weights rotate through copies totalling > 512 MB so every call reads DRAM, as a
 * decode step does. Built with everything as build/kern_bench:
 *   ./build/kern_bench [table|-] [dtype|all] [shape index|-1] [quick]
 * KERN_BENCH_ROTATE_MB=0 keeps the weights hot in cache (compute-bound figures). */
#include <stdbool.h>
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

/* The 10th percentile of t[0..n) (sorts it): the machine is shared, so not the mean. */
static double low_percentile(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 10];
}

/* One shape's weights, quantized once and copied n_copies times (> ROTATE_BYTES together, or as
 * KERN_BENCH_ROTATE_MB says) so that every matvec reads DRAM; and the activations. */
typedef struct bench_matrix {
    int dtype;
    int64_t rows, cols;
    size_t nb; /* bytes of one copy */
    int n_copies;
    uint8_t *big;
    float *x, *y;
    void *scratch;
} bench_matrix;

enum { MAX_TOK = 512, REPS = 60 };

static bool make_matrix(bench_matrix *m, int dtype, const int64_t shape[2], uint64_t seed) {
    *m = (bench_matrix){.dtype = dtype, .rows = shape[0], .cols = shape[1]};
    m->nb = csd_qmat_bytes(dtype, m->rows, m->cols);
    const char *rot = getenv("KERN_BENCH_ROTATE_MB"); /* 0: hot caches (compute bound) */
    size_t rotate = rot ? (size_t)atoll(rot) << 20 : ROTATE_BYTES;
    m->n_copies = (int)(rotate / m->nb) + (rot ? 1 : 2);
    m->big = csd_alloc(m->nb * (size_t)m->n_copies);
    float *src = rand_floats(m->rows * m->cols, seed);
    m->x = rand_floats(MAX_TOK * m->cols, 99);
    m->y = csd_alloc_array((size_t)(MAX_TOK * m->rows), sizeof(float));
    m->scratch = csd_alloc(csd_matmul_scratch_bytes(m->cols, MAX_TOK));
    if (!m->big || !src || !m->x || !m->y || !m->scratch) return false;
    uint64_t q0 = csd_now_ns();
    csd_qmat_quantize(dtype, src, m->rows, m->cols, m->big, NULL);
    double qs = (double)(csd_now_ns() - q0) * 1e-9;
    printf("# %s %lldx%lld quantize: %.1f Mweights/s (1 thread)\n", csd_dtype_name(dtype),
           (long long)m->rows, (long long)m->cols, (double)m->rows * (double)m->cols / qs * 1e-6);
    for (int k = 1; k < m->n_copies; k++) memcpy(m->big + (size_t)k * m->nb, m->big, m->nb);
    csd_free(src);
    return true;
}

static void free_matrix(bench_matrix *m) {
    csd_free(m->scratch);
    csd_free(m->y);
    csd_free(m->x);
    csd_free(m->big);
}

static csd_qmat copy_of(const bench_matrix *m, int k) {
    return (csd_qmat){m->dtype, m->rows, m->cols, m->big + (size_t)(k % m->n_copies) * m->nb,
                      m->nb};
}

/* Seconds of n_tok tokens times one cold copy: the low percentile of reps calls. With read_s, a
 * plain read of another copy is timed before each call (interleaved, so both see the same
 * machine) and its low percentile stored there. */
static double time_cold(const csd_kern_ops *ops, csd_pool *pool, const bench_matrix *m,
                        int64_t n_tok, int reps, double *read_s) {
    double t[REPS], tr[REPS];
    static read_job rj;
    for (int i = 0; i < reps; i++) {
        if (read_s) {
            rj.p = (const uint64_t *)(const void *)copy_of(m, i + m->n_copies / 2).data;
            rj.n = (int64_t)(m->nb / 8);
            uint64_t a = csd_now_ns();
            csd_pool_run(pool, read_part, &rj);
            tr[i] = (double)(csd_now_ns() - a) * 1e-9;
        }
        csd_qmat w = copy_of(m, read_s ? i : i + 7);
        uint64_t a = csd_now_ns();
        csd_kern_matmul_with(ops, pool, &w, m->x, n_tok, m->y, m->scratch);
        t[i] = (double)(csd_now_ns() - a) * 1e-9;
    }
    if (read_s) *read_s = low_percentile(tr, reps);
    return low_percentile(t, reps);
}

/* Seconds of a 512-token prompt times the matrix: best of tries. */
static double time_prompt(const csd_kern_ops *ops, csd_pool *pool, const bench_matrix *m,
                          int tries) {
    double best = 1e9;
    for (int i = 0; i < tries; i++) {
        csd_qmat w = copy_of(m, 0);
        uint64_t a = csd_now_ns();
        csd_kern_matmul_with(ops, pool, &w, m->x, MAX_TOK, m->y, m->scratch);
        double t = (double)(csd_now_ns() - a) * 1e-9;
        if (t < best) best = t;
    }
    return best;
}

/* One table row per thread count for one dtype and shape. */
static bool bench_shape(const csd_kern_ops *ops, csd_pool *const pools[2], int dtype, size_t si,
                        bool quick) {
    bench_matrix m;
    bool ok = make_matrix(&m, dtype, shapes[si], 1 + si);
    for (int th = 0; ok && th < 2; th++) {
        int reps = quick ? 20 : REPS;
        double tread, tv = time_cold(ops, pools[th], &m, 1, reps, &tread);
        double tb = time_cold(ops, pools[th], &m, 8, reps, NULL);
        double tp = time_prompt(ops, pools[th], &m, quick ? 1 : 3);
        double flop = 2.0 * (double)m.rows * (double)m.cols;
        char shape[32];
        snprintf(shape, sizeof shape, "%lldx%lld", (long long)m.rows, (long long)m.cols);
        printf("%-6s %-12s %-4d %10.1f %9.2f %9.2f %7.2f %12.1f %10.2f %10.1f\n",
               csd_dtype_name(dtype), shape, th + 1, tv * 1e6, (double)m.nb / tv * 1e-9,
               (double)m.nb / tread * 1e-9, tread / tv, flop * 8 / tb * 1e-9, tb / tv,
               flop * MAX_TOK / tp * 1e-9);
        fflush(stdout);
    }
    free_matrix(&m);
    return ok;
}

int main(int argc, char **argv) {
    const char *table = argc > 1 && strcmp(argv[1], "-") != 0 ? argv[1] : NULL;
    int only_dtype = argc > 2 && strcmp(argv[2], "all") != 0 ? csd_dtype_parse(argv[2]) : -1;
    int only_shape = argc > 3 ? atoi(argv[3]) : -1;
    bool quick = argc > 4;
    const csd_kern_ops *ops = table ? csd_kern_table(table) : csd_kern_ops_current();
    if (!ops) {
        fprintf(stderr, "table %s unavailable\n", table);
        return 1;
    }
    printf("table=%s\n", ops->name);
    csd_pool *pools[2];
    if (csd_pool_create(&pools[0], 1, NULL) || csd_pool_create(&pools[1], 2, NULL)) return 1;
    printf("read GB/s: 1 thread %.1f, 2 threads %.1f\n", read_bw(pools[0]), read_bw(pools[1]));
    const int dtypes[] = {CSD_DTYPE_Q4, CSD_DTYPE_Q8, CSD_DTYPE_F16};
    printf("%-6s %-12s %-4s %10s %9s %9s %7s %12s %10s %10s\n", "dtype", "shape", "thr",
           "matvec_us", "GB/s", "read_GB/s", "ratio", "n8_GFLOP/s", "n8/1_cost", "n512_GF/s");
    int rc = 0;
    for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0] && !rc; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] && !rc; si++)
            if ((only_dtype < 0 || dtypes[di] == only_dtype) &&
                (only_shape < 0 || (size_t)only_shape == si))
                rc = bench_shape(ops, pools, dtypes[di], si, quick) ? 0 : 1;
    csd_pool_destroy(pools[0]);
    csd_pool_destroy(pools[1]);
    return rc;
}
