/* test_kern_matmul: every kernel table this CPU supports against ref.c (the spec), for every dtype,
 * odd shapes and batch sizes; ref against plain f32 maths on the dequantized weights; batch and
 * thread invariance (bit-identical), also under matvec_lanes.c's stealing; the lanes' read-ahead;
 * no allocation inside csd_matmul; the vector helpers. */
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
#include "core/pool.h"
#include "kern/kern.h"
#include "kern/kern_internal.h"
#include "kern/quant.h"

static const char *const table_names[] = {"ref", "avx2", "avxvnni", "avx512", "neon"};
#define N_TABLES (int)(sizeof table_names / sizeof table_names[0])

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

/* Uniform in (-1, 1). */
static float rng_sym(rng *r) {
    return (float)((int64_t)(rng_next(r) >> 40) - 8388608) / 8388608.0f;
}

/* Seeded, checked non-constant data (mean of |x| well away from 0 and not all equal). */
static float *make_data(int64_t n, uint64_t seed) {
    rng r = {seed * 0x9e3779b97f4a7c15ull + 1};
    float *x = csd_alloc_array((size_t)(n > 0 ? n : 1), sizeof *x);
    assert_non_null(x);
    double sa = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_sym(&r) * (i % 37 == 3 ? 4.0f : 1.0f);
        sa += fabs(x[i]);
    }
    if (n >= 8) {
        assert_true(sa / n > 0.2);
        assert_true(x[0] != x[1] || x[1] != x[2]);
    }
    return x;
}

typedef struct mat {
    csd_qmat w;
    void *buf;
    float *deq; /* rows x cols, the dequantized weights */
} mat;

static mat make_mat(int dtype, int64_t rows, int64_t cols, uint64_t seed) {
    mat m;
    float *src = make_data(rows * cols, seed);
    size_t nb = csd_qmat_bytes(dtype, rows, cols);
    m.buf = csd_alloc(nb);
    assert_int_equal(csd_qmat_quantize(dtype, src, rows, cols, m.buf, NULL), 0);
    m.w = (csd_qmat){dtype, rows, cols, m.buf, nb};
    m.deq = csd_alloc_array((size_t)(rows * cols > 0 ? rows * cols : 1), sizeof(float));
    for (int64_t r = 0; r < rows; r++) csd_qmat_dequant_row(&m.w, r, m.deq + r * cols);
    csd_free(src);
    return m;
}

static void free_mat(mat *m) {
    csd_free(m->buf);
    csd_free(m->deq);
}

static void run(const csd_kern_ops *ops, csd_pool *pool, const csd_qmat *w, const float *x,
                int64_t n_tok, float *y) {
    void *scratch = csd_alloc(csd_matmul_scratch_bytes(w->cols, n_tok));
    csd_kern_matmul_with(ops, pool, w, x, n_tok, y, scratch);
    csd_free(scratch);
}

/* sum_c |W[r,c] x[c]|: the scale of rounding differences of one output. */
static double abs_scale(const mat *m, const float *x, int64_t t, int64_t r) {
    double s = 0;
    for (int64_t c = 0; c < m->w.cols; c++)
        s += fabs((double)m->deq[r * m->w.cols + c] * x[t * m->w.cols + c]);
    return s;
}

static const int64_t shapes[][2] = {{3, 130}, {1, 1}, {5, 128}, {17, 257}, {33, 300}, {8, 2048},
                                    {6, 64}};
static const int64_t ntoks[] = {1, 2, 3, 7, 8, 33, 64};

static void test_tables_vs_ref(void **state) {
    (void)state;
    const csd_kern_ops *ref = csd_kern_table("ref");
    assert_non_null(ref);
    int compared = 0;
    for (int ti = 1; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (!ops) {
            printf("table %s not supported here\n", table_names[ti]);
            continue;
        }
        for (int dtype = 0; dtype < CSD_DTYPE_COUNT; dtype++) {
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                int64_t rows = shapes[si][0], cols = shapes[si][1];
                mat m = make_mat(dtype, rows, cols, 11 + si);
                for (size_t ni = 0; ni < sizeof ntoks / sizeof ntoks[0]; ni++) {
                    int64_t n_tok = ntoks[ni];
                    float *x = make_data(n_tok * cols, 1000 + ni);
                    float *ya = csd_alloc_array((size_t)(n_tok * rows), sizeof(float));
                    float *yb = csd_alloc_array((size_t)(n_tok * rows), sizeof(float));
                    run(ref, NULL, &m.w, x, n_tok, ya);
                    run(ops, NULL, &m.w, x, n_tok, yb);
                    for (int64_t t = 0; t < n_tok; t++) {
                        for (int64_t r = 0; r < rows; r++) {
                            double s = abs_scale(&m, x, t, r);
                            double d = fabs((double)ya[t * rows + r] - yb[t * rows + r]);
                            if (d > 2e-6 * s + 1e-30) {
                                printf("%s %s %lldx%lld n_tok=%lld t=%lld r=%lld ref=%g got=%g\n",
                                       ops->name, csd_dtype_name(dtype), (long long)rows,
                                       (long long)cols, (long long)n_tok, (long long)t,
                                       (long long)r, ya[t * rows + r], yb[t * rows + r]);
                                fail();
                            }
                        }
                    }
                    compared++;
                    csd_free(x);
                    csd_free(ya);
                    csd_free(yb);
                }
                free_mat(&m);
            }
        }
    }
    printf("compared %d (table, dtype, shape, n_tok) cases\n", compared);
}

/* The spec itself: ref against f64 maths on the dequantized weights. Q4/Q8 also quantize the
 * activations to int8 per group, an error of at most half a step (absmax / 254) per element. */
static void test_ref_vs_f64(void **state) {
    (void)state;
    const csd_kern_ops *ref = csd_kern_table("ref");
    for (int dtype = 0; dtype < CSD_DTYPE_COUNT; dtype++) {
        int64_t rows = 9, cols = 300, n_tok = 3;
        mat m = make_mat(dtype, rows, cols, 5);
        float *x = make_data(n_tok * cols, 6);
        float y[27];
        run(ref, NULL, &m.w, x, n_tok, y);
        int q = dtype == CSD_DTYPE_Q4 || dtype == CSD_DTYPE_Q8;
        for (int64_t t = 0; t < n_tok; t++) {
            for (int64_t r = 0; r < rows; r++) {
                double exact = 0, bound = 0;
                for (int64_t c = 0; c < cols; c++) {
                    exact += (double)m.deq[r * cols + c] * x[t * cols + c];
                    bound += fabs(m.deq[r * cols + c]) * (q ? 4.0 / 254.0 : 1e-6); /* |x|<=4 */
                }
                assert_true(fabs(y[t * rows + r] - exact) <= bound + 1e-5);
            }
        }
        csd_free(x);
        free_mat(&m);
    }
}

static void test_batch_and_thread_invariance(void **state) {
    (void)state;
    csd_pool *pool2 = NULL;
    assert_int_equal(csd_pool_create(&pool2, 2, NULL), 0);
    for (int ti = 0; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (!ops) continue;
        for (int dtype = 0; dtype < CSD_DTYPE_COUNT; dtype++) {
            int64_t rows = 45, cols = 300, n_tok = 37;
            mat m = make_mat(dtype, rows, cols, 77);
            float *x = make_data(n_tok * cols, 78);
            float *yb = csd_alloc_array((size_t)(n_tok * rows), sizeof(float));
            float *y1 = csd_alloc_array((size_t)(n_tok * rows), sizeof(float));
            float *ys = csd_alloc_array((size_t)rows, sizeof(float));
            run(ops, pool2, &m.w, x, n_tok, yb);
            run(ops, NULL, &m.w, x, n_tok, y1);
            assert_memory_equal(yb, y1, (size_t)(n_tok * rows) * sizeof(float));
            for (int64_t t = 0; t < n_tok; t++) { /* each token alone, 1 and 2 threads */
                run(ops, NULL, &m.w, x + t * cols, 1, ys);
                assert_memory_equal(ys, yb + t * rows, (size_t)rows * sizeof(float));
                run(ops, pool2, &m.w, x + t * cols, 1, ys);
                assert_memory_equal(ys, yb + t * rows, (size_t)rows * sizeof(float));
            }
            /* a token inside sub-batches of other sizes */
            for (int64_t nb = 2; nb <= 9; nb += 7) {
                run(ops, pool2, &m.w, x + 5 * cols, nb, y1);
                assert_memory_equal(y1, yb + 5 * rows, (size_t)(nb * rows) * sizeof(float));
            }
            csd_free(x);
            csd_free(yb);
            csd_free(y1);
            csd_free(ys);
            free_mat(&m);
        }
    }
    csd_pool_destroy(pool2);
}

/* Every table quantizes activations to the same bytes, ordinary ones and those no plain rule
 * covers alike: a group with a NaN or an infinity becomes NaN (scale NaN, values and sum 0), a
 * group too small for 127 / amax quantizes to zeros. The last cases put those in group 1. */
static void test_activation_quant_identical(void **state) {
    (void)state;
    const csd_kern_ops *ref = csd_kern_table("ref");
    static const int64_t cols_list[] = {1, 15, 128, 130, 300, 2048, 300, 300, 300, 300};
    for (size_t k = 0; k < sizeof cols_list / sizeof cols_list[0]; k++) {
        int64_t cols = cols_list[k];
        size_t stride = csd_quant_act_stride(cols);
        float *x = make_data(cols, 300 + k);
        if (cols > 20) x[cols - 1] = 0.0f; /* exact zeros and ties */
        const float odd[4] = {NAN, INFINITY, -INFINITY, 0};
        if (k >= 6) { /* group 1: a large value, then NaN / inf / -inf / only tiny values */
            x[128] = 100.0f;
            x[136] = x[144] = odd[k - 6];
            if (k == 9)
                for (int j = 128; j < 256; j++) x[j] = j == 129 ? -2e-39f : j == 128 ? 1e-38f : 0;
        }
        uint8_t *a = csd_alloc(stride), *b = csd_alloc(stride);
        ref->quantize_act_q8(a, x, cols);
        for (int ti = 1; ti < N_TABLES; ti++) {
            const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
            if (!ops) continue;
            memset(b, 0x5a, stride);
            ops->quantize_act_q8(b, x, cols);
            size_t used = (size_t)csd_quant_groups(cols) * (CSD_QUANT_GROUP + 8);
            assert_memory_equal(a, b, used);
        }
        if (k >= 6) { /* the rule itself, in ref (the others equal it) */
            const int8_t *xq = (const int8_t *)a;
            const float *dx = (const float *)(const void *)(a + 3 * CSD_QUANT_GROUP);
            const int32_t *sums = (const int32_t *)(const void *)(dx + 3);
            assert_true(k < 9 ? isnan(dx[1]) : isfinite(dx[1]));
            for (int j = 128; j < 256; j++) assert_int_equal(xq[j], 0);
            assert_int_equal(sums[1], 0);
            assert_true(isfinite(dx[0]) && isfinite(dx[2])); /* the other groups as ever */
        }
        csd_free(a);
        csd_free(b);
        csd_free(x);
    }
}

static void test_no_alloc(void **state) {
    (void)state;
    csd_pool *pool = NULL;
    assert_int_equal(csd_pool_create(&pool, 2, NULL), 0);
    mat m = make_mat(CSD_DTYPE_Q4, 64, 256, 3);
    float *x = make_data(8 * 256, 4);
    float *y = csd_alloc_array(8 * 64, sizeof(float));
    void *scratch = csd_alloc(csd_matmul_scratch_bytes(256, 8));
    csd_kern_init();
    uint64_t before = csd_alloc_count();
    csd_matmul(pool, &m.w, x, 8, y, scratch);
    csd_matmul(pool, &m.w, x, 1, y, scratch);
    assert_int_equal(csd_alloc_count(), before);
    csd_free(scratch);
    csd_free(y);
    csd_free(x);
    free_mat(&m);
    csd_pool_destroy(pool);
}

static void test_vector_helpers(void **state) {
    (void)state;
    const csd_kern_ops *ref = csd_kern_table("ref");
    static const int64_t ns[] = {0, 1, 7, 16, 31, 63, 64, 65, 128, 130, 1000};
    for (int ti = 0; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (!ops) continue;
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int64_t n = ns[k];
            float *a = make_data(n, 10 + k), *b = make_data(n, 20 + k);
            uint16_t *h = csd_alloc_array((size_t)n + 1, 2),
                     *h2 = csd_alloc_array((size_t)n + 1, 2);
            float *y1 = make_data(n, 30 + k), *y2 = make_data(n, 30 + k);
            ref->f32_to_f16(h, b, n);
            h[n] = 0x1234;
            h2[n] = 0x1234; /* nothing past n is written */
            ops->f32_to_f16(h2, b, n);
            assert_memory_equal(h, h2, (size_t)(n + 1) * 2);
            double s = 0;
            for (int64_t i = 0; i < n; i++) s += fabs(a[i] * b[i]);
            assert_true(fabs(ref->dot_f32(a, b, n) - ops->dot_f32(a, b, n)) <= 1e-6 * s + 1e-30);
            assert_true(fabs(ref->dot_f32_f16(a, h, n) - ops->dot_f32_f16(a, h, n)) <=
                        1e-6 * s + 1e-30);
            ref->axpy_f32(y1, 0.37f, a, n);
            ops->axpy_f32(y2, 0.37f, a, n);
            for (int64_t i = 0; i < n; i++) assert_true(fabsf(y1[i] - y2[i]) <= 1e-6f);
            ref->axpy_f16(y1, -1.25f, h, n);
            ops->axpy_f16(y2, -1.25f, h, n);
            for (int64_t i = 0; i < n; i++) assert_true(fabsf(y1[i] - y2[i]) <= 4e-6f);
            csd_free(a);
            csd_free(b);
            csd_free(h);
            csd_free(h2);
            csd_free(y1);
            csd_free(y2);
        }
        /* f16 edge cases: subnormals, ties, overflow, infinities */
        float edge[] = {0.0f, -0.0f, 6e-8f, 3e-5f, -6.1e-5f, 65504.0f, 65520.0f, 1e9f, -1e9f,
                        1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f, 2.98e-8f, INFINITY};
        int n = (int)(sizeof edge / sizeof edge[0]);
        uint16_t e1[16], e2[16];
        ref->f32_to_f16(e1, edge, n);
        ops->f32_to_f16(e2, edge, n);
        assert_memory_equal(e1, e2, (size_t)n * 2);
        /* the public wrappers dispatch */
        float a2[3] = {1, 2, 3}, b2[3] = {4, 5, 6};
        assert_true(csd_dot_f32(a2, b2, 3) == 32.0f);
    }
}

/* csd_matmul_multi gives exactly what separate csd_matmul calls give: fused (all quantized, a
 * chunk crossing from one matrix into the next) and composed (a float matrix among them). */
static void test_matmul_multi(void **state) {
    (void)state;
    csd_pool *pool = NULL;
    assert_int_equal(csd_pool_create(&pool, 2, NULL), 0);
    static const int64_t rows[3] = {70, 16, 33};
    static const int dtypes[2][3] = {{CSD_DTYPE_Q4, CSD_DTYPE_Q8, CSD_DTYPE_Q4},
                                     {CSD_DTYPE_Q4, CSD_DTYPE_F16, CSD_DTYPE_Q8}};
    int64_t cols = 300;
    for (int d = 0; d < 2; d++) {
        for (int64_t n_tok = 1; n_tok <= 9; n_tok += 4) {
            mat m[3];
            const csd_qmat *ws[3];
            float *got[3], *want[3];
            float *x = make_data(n_tok * cols, 77 + (uint64_t)n_tok);
            for (int i = 0; i < 3; i++) {
                m[i] = make_mat(dtypes[d][i], rows[i], cols, 10 + (uint64_t)i);
                ws[i] = &m[i].w;
                got[i] = csd_alloc_array((size_t)(n_tok * rows[i]), sizeof(float));
                want[i] = csd_alloc_array((size_t)(n_tok * rows[i]), sizeof(float));
                run(csd_kern_ops_current(), pool, ws[i], x, n_tok, want[i]);
            }
            void *scratch = csd_alloc(csd_matmul_scratch_bytes(cols, n_tok));
            csd_matmul_multi(pool, ws, 3, x, n_tok, got, scratch);
            for (int i = 0; i < 3; i++) {
                assert_memory_equal(got[i], want[i], (size_t)(n_tok * rows[i]) * sizeof(float));
                csd_free(got[i]);
                csd_free(want[i]);
                free_mat(&m[i]);
            }
            csd_free(scratch);
            csd_free(x);
        }
    }
    csd_pool_destroy(pool);
}

/* y = w x for one token through the table's batch kernel (16-row tiles, no lanes, no runs). */
static void run_batch_kernel(const csd_kern_ops *ops, const csd_qmat *w, const float *x, float *y) {
    uint8_t *act = csd_alloc(csd_quant_act_stride(w->cols));
    ops->quantize_act_q8(act, x, w->cols);
    if (w->dtype == CSD_DTYPE_Q4) ops->matmul_q4_q8(y, w, act, 1, 0, w->rows);
    else ops->matmul_q8_q8(y, w, act, 1, 0, w->rows);
    csd_free(act);
}

/* One token through matvec_lanes.c with 1 to 5 threads (more threads than blocks, lanes of one
 * block, threads stealing the back halves of each other's lanes, runs of several blocks per
 * kernel call): every table with matvec kernels gives the bits of its batch kernel whoever ran
 * which block, single matrices and fused Q4/Q8 ones (a Q8 block side by side with a Q4 one).
 * 50 runs each, as who steals what varies run by run. */
static void test_matvec_lanes_any_split(void **state) {
    (void)state;
    static const int64_t rows[3] = {16 * 23 + 5, 33, 16 * 9};
    static const int dtypes[3] = {CSD_DTYPE_Q4, CSD_DTYPE_Q8, CSD_DTYPE_Q4};
    int64_t cols = 300;
    float *x = make_data(cols, 91);
    mat m[3];
    const csd_qmat *ws[3];
    float *want[3], *got[3];
    for (int i = 0; i < 3; i++) {
        m[i] = make_mat(dtypes[i], rows[i], cols, 40 + (uint64_t)i);
        ws[i] = &m[i].w;
        want[i] = csd_alloc_array((size_t)rows[i], sizeof(float));
        got[i] = csd_alloc_array((size_t)rows[i], sizeof(float));
    }
    void *scratch = csd_alloc(csd_matmul_scratch_bytes(cols, 1));
    int tables = 0;
    for (int ti = 1; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (!ops || !ops->matvec_q4) continue;
        tables++;
        for (int i = 0; i < 3; i++) run_batch_kernel(ops, ws[i], x, want[i]);
        for (int nt = 1; nt <= 5; nt++) {
            csd_pool *pool = NULL;
            assert_int_equal(csd_pool_create(&pool, nt, NULL), 0);
            for (int rep = 0; rep < 50; rep++) {
                for (int i = 0; i < 3; i++) {
                    memset(got[i], 0xff, (size_t)rows[i] * sizeof(float));
                    run(ops, pool, ws[i], x, 1, got[i]);
                    assert_memory_equal(got[i], want[i], (size_t)rows[i] * sizeof(float));
                }
                if (ops != csd_kern_ops_current())
                    continue; /* csd_matmul_multi: the current table */
                for (int i = 0; i < 3; i++) memset(got[i], 0xff, (size_t)rows[i] * sizeof(float));
                csd_matmul_multi(pool, ws, 3, x, 1, got, scratch);
                for (int i = 0; i < 3; i++)
                    assert_memory_equal(got[i], want[i], (size_t)rows[i] * sizeof(float));
            }
            csd_pool_destroy(pool);
        }
    }
    if (tables == 0) print_message("no table with matvec kernels on this CPU: lanes not tested\n");
    for (int i = 0; i < 3; i++) {
        csd_free(want[i]);
        csd_free(got[i]);
        free_mat(&m[i]);
    }
    csd_free(scratch);
    csd_free(x);
}

/* The prefetch distance (mv_pf_ahead, CSD_PF_AHEAD) is a tuning knob only: every distance a
 * user may set, from none to the most, gives the bits of the batch kernel, Q4 and Q8, with the
 * far prefetches running past the end of the matrix. A kernel that loaded at the distance, or
 * skipped or repeated a line by it, would differ. */
static void test_matvec_any_distance(void **state) {
    (void)state;
    static const int dtypes[2] = {CSD_DTYPE_Q4, CSD_DTYPE_Q8};
    static const size_t aheads[] = {0, 64, 576, 1024, 2048, 4096, CSD_PF_AHEAD_MAX};
    int64_t rows = 16 * 37 + 3, cols = 1000;
    float *x = make_data(cols, 17);
    float *want = csd_alloc_array((size_t)rows, sizeof(float));
    float *got = csd_alloc_array((size_t)rows, sizeof(float));
    csd_pool *pool = NULL;
    assert_int_equal(csd_pool_create(&pool, 2, NULL), 0);
    int tables = 0;
    for (int ti = 1; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (!ops || !ops->matvec_q4) continue;
        tables++;
        for (int di = 0; di < 2; di++) {
            mat m = make_mat(dtypes[di], rows, cols, 70 + (uint64_t)di);
            run_batch_kernel(ops, &m.w, x, want);
            for (size_t a = 0; a < sizeof aheads / sizeof aheads[0]; a++) {
                csd_kern_ops tuned = *ops;
                tuned.mv_pf_ahead = aheads[a];
                memset(got, 0xff, (size_t)rows * sizeof(float));
                run(&tuned, pool, &m.w, x, 1, got);
                assert_memory_equal(got, want, (size_t)rows * sizeof(float));
            }
            free_mat(&m);
        }
    }
    if (tables == 0)
        print_message("no table with matvec kernels on this CPU: distances not tested\n");
    csd_pool_destroy(pool);
    csd_free(got);
    csd_free(want);
    csd_free(x);
}

/* The read-ahead of a thread's lanes (kern.h: csd_lanes_ahead): each lane starts at its first
 * block's weights, as csd_lanes_own cuts the slice [b0, b1) into lanes, stays inside that
 * block's matrix and the lane, and is used up by stepping. Slices: across the Q4/Q8 boundary,
 * inside one matrix, and one block (the second lane empty). */
static void test_lanes_ahead(void **state) {
    (void)state;
    static const int64_t rows[2] = {16 * 20, 16 * 40};
    static const int dtypes[2] = {CSD_DTYPE_Q4, CSD_DTYPE_Q8};
    static const int64_t slices[3][2] = {{12, 44}, {25, 60}, {7, 8}};
    int64_t cols = 1000;
    mat m[2];
    const csd_qmat *ws[2];
    for (int i = 0; i < 2; i++) {
        m[i] = make_mat(dtypes[i], rows[i], cols, 70 + (uint64_t)i);
        ws[i] = &m[i].w;
    }
    for (int si = 0; si < 3; si++) {
        int64_t b0 = slices[si][0], b1 = slices[si][1];
        csd_lanes_ahead a;
        csd_lanes_ahead_set(&a, ws, b0, b1);
        size_t lines = 0;
        for (int s = 0; s < CSD_LANES_AHEAD_STREAMS; s++) {
            int64_t lb, le;
            csd_split_range(b1 - b0, s, CSD_LANES_AHEAD_STREAMS, &lb, &le);
            if (le == lb) {
                assert_null(a.next[s]);
                continue;
            }
            int64_t gb = b0 + lb, blocks_0 = csd_quant_blocks(rows[0]);
            int i = gb < blocks_0 ? 0 : 1;
            int64_t in_mat = i == 0 ? gb : gb - blocks_0;
            int64_t mat_end = i == 0 ? blocks_0 : blocks_0 + csd_quant_blocks(rows[1]);
            int64_t last = le + b0 < mat_end ? le + b0 : mat_end; /* the lane's end in the matrix */
            size_t bb = csd_quant_block_bytes(dtypes[i], cols);
            const uint8_t *first = (const uint8_t *)ws[i]->data + (size_t)in_mat * bb;
            assert_ptr_equal(a.next[s], first);
            assert_true(a.end[s] > a.next[s]);
            assert_true(a.end[s] <= first + (size_t)(last - gb) * bb);
            lines += (size_t)(a.end[s] - a.next[s] + 63) / 64;
        }
        size_t steps = 0;
        while (csd_lanes_ahead_step(&a)) assert_true(++steps <= lines);
        for (int s = 0; s < CSD_LANES_AHEAD_STREAMS; s++) assert_true(a.next[s] >= a.end[s]);
        assert_false(csd_lanes_ahead_step(&a));
    }
    csd_lanes_ahead a;
    csd_lanes_ahead_clear(&a);
    assert_false(csd_lanes_ahead_step(&a));
    for (int i = 0; i < 2; i++) free_mat(&m[i]);
}

static void test_tables_and_names(void **state) {
    (void)state;
    const char *name = csd_kern_init();
    assert_non_null(name);
    assert_string_equal(name, csd_kern_name());
    assert_non_null(csd_kern_table(name));
    assert_null(csd_kern_table("bogus"));
    const csd_kern_ops *ops = csd_kern_ops_current();
    assert_non_null(ops->matmul_q4_q8); /* gaps are filled */
    assert_non_null(ops->matmul_bf16_f32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_and_names),
        cmocka_unit_test(test_activation_quant_identical),
        cmocka_unit_test(test_ref_vs_f64),
        cmocka_unit_test(test_tables_vs_ref),
        cmocka_unit_test(test_batch_and_thread_invariance),
        cmocka_unit_test(test_no_alloc),
        cmocka_unit_test(test_matmul_multi),
        cmocka_unit_test(test_matvec_lanes_any_split),
        cmocka_unit_test(test_matvec_any_distance),
        cmocka_unit_test(test_lanes_ahead),
        cmocka_unit_test(test_vector_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
