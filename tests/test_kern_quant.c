/* test_kern_quant: Q4/Q8/F16/BF16 quantization: sizes, error bounds, determinism, rows whose length
 * is not a multiple of 128, the clipping search against plain absmax, and weights a format cannot
 * store (refused, naming the place: never a NaN group). */
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
#include "kern/quant.h"

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

static float rng_uniform(rng *r) { return (float)((rng_next(r) >> 40) + 1) / 16777217.0f; }

static float rng_gauss(rng *r) {
    float u = rng_uniform(r), v = rng_uniform(r);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Gaussian data, with every 61st value an outlier 6x larger when outliers is set. Checked to be
 * non-constant (a broken generator would make every test pass trivially). */
static float *make_data(int64_t n, uint64_t seed, int outliers) {
    rng r = {seed * 2654435761u + 1};
    float *x = csd_alloc_array((size_t)n, sizeof *x);
    assert_non_null(x);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_gauss(&r) * (outliers && i % 61 == 7 ? 6.0f : 1.0f);
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    if (n > 16) assert_true(s2 / n - (s / n) * (s / n) > 0.1);
    return x;
}

static void test_sizes(void **state) {
    (void)state;
    assert_int_equal(csd_qmat_bytes(CSD_DTYPE_F32, 3, 10), 120);
    assert_int_equal(csd_qmat_bytes(CSD_DTYPE_F16, 3, 10), 60);
    assert_int_equal(csd_qmat_bytes(CSD_DTYPE_BF16, 3, 10), 60);
    /* 16-row blocks: per group 16 x 64 (Q4) or 16 x 128 (Q8) bytes + 16 f16 scales, 64-aligned */
    assert_int_equal(csd_quant_block_bytes(CSD_DTYPE_Q4, 2048), 16 * (1024 + 32));
    assert_int_equal(csd_quant_block_bytes(CSD_DTYPE_Q8, 2048), 16 * (2048 + 32));
    assert_int_equal(csd_quant_block_bytes(CSD_DTYPE_Q4, 130), 2 * 1056);
    assert_int_equal(csd_quant_block_bytes(CSD_DTYPE_Q8, 1), 2112); /* 2080 -> 64-aligned */
    assert_int_equal(csd_qmat_bytes(CSD_DTYPE_Q4, 16, 2048), 16 * 1056);
    assert_int_equal(csd_qmat_bytes(CSD_DTYPE_Q4, 7, 5632), 44 * 1056); /* one padded block */
    assert_int_equal(csd_qmat_bytes(CSD_DTYPE_Q4, 17, 128), 2 * 1088);
}

/* Max and RMS error of quantize + dequantize, relative to the group absmax and the data RMS. */
static void roundtrip(int dtype, int64_t rows, int64_t cols, const float *src,
                      double *max_rel_group, double *rms_rel) {
    size_t nb = csd_qmat_bytes(dtype, rows, cols);
    void *buf = csd_alloc(nb);
    float *out = csd_alloc_array((size_t)cols, sizeof *out);
    assert_int_equal(csd_qmat_quantize(dtype, src, rows, cols, buf, NULL), 0);
    csd_qmat w = {dtype, rows, cols, buf, nb};
    double se = 0, ss = 0, worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        csd_qmat_dequant_row(&w, r, out);
        for (int64_t g0 = 0; g0 < cols; g0 += 128) {
            int64_t g1 = g0 + 128 < cols ? g0 + 128 : cols;
            double amax = 0;
            for (int64_t c = g0; c < g1; c++) amax = fmax(amax, fabs(src[r * cols + c]));
            for (int64_t c = g0; c < g1; c++) {
                double e = fabs((double)out[c] - src[r * cols + c]);
                se += e * e;
                ss += (double)src[r * cols + c] * src[r * cols + c];
                if (amax > 0) worst = fmax(worst, e / amax);
            }
        }
    }
    *max_rel_group = worst;
    *rms_rel = sqrt(se / (ss > 0 ? ss : 1));
    csd_free(out);
    csd_free(buf);
}

static void test_error_bounds(void **state) {
    (void)state;
    static const int64_t cols_list[] = {1, 5, 127, 128, 129, 130, 300, 2048};
    for (size_t k = 0; k < sizeof cols_list / sizeof cols_list[0]; k++) {
        int64_t rows = 6, cols = cols_list[k];
        float *src = make_data(rows * cols, 100 + k, 0);
        double worst, rms;
        roundtrip(CSD_DTYPE_Q8, rows, cols, src, &worst, &rms);
        assert_true(worst <= 0.2);
        if (cols >= 128) assert_true(rms < 0.01);
        roundtrip(CSD_DTYPE_Q4, rows, cols, src, &worst, &rms);
        assert_true(worst <= 0.45);
        if (cols >= 128) assert_true(rms < 0.13);
        roundtrip(CSD_DTYPE_F16, rows, cols, src, &worst, &rms);
        assert_true(rms < 1e-3);
        roundtrip(CSD_DTYPE_BF16, rows, cols, src, &worst, &rms);
        assert_true(rms < 5e-3);
        roundtrip(CSD_DTYPE_F32, rows, cols, src, &worst, &rms);
        assert_true(rms == 0.0);
        csd_free(src);
    }
}

static void test_zero_and_exact(void **state) {
    (void)state;
    /* All-zero rows give zero scales; values already on the grid come back exactly. */
    float src[2 * 130];
    for (int i = 0; i < 130; i++) src[i] = 0.0f;
    for (int dtype = CSD_DTYPE_Q8; dtype <= CSD_DTYPE_Q4; dtype++) {
        for (int i = 0; i < 130; i++) /* on the grid: q * 1/4 (Q4) or q * 1/64 (Q8) */
            src[130 + i] = dtype == CSD_DTYPE_Q4 ? (float)((i % 128 % 15) - 7) * 0.25f
                                                 : (float)(i % 128 - 127) / 64.0f;
        size_t nb = csd_qmat_bytes(dtype, 2, 130);
        void *buf = csd_alloc(nb);
        assert_int_equal(csd_qmat_quantize(dtype, src, 2, 130, buf, NULL), 0);
        csd_qmat w = {dtype, 2, 130, buf, nb};
        float out[130];
        csd_qmat_dequant_row(&w, 0, out);
        for (int i = 0; i < 130; i++) assert_true(out[i] == 0.0f);
        csd_qmat_dequant_row(&w, 1, out);
        for (int i = 0; i < 130; i++) assert_true(fabsf(out[i] - src[130 + i]) < 1e-6f);
        csd_free(buf);
    }
}

static void test_deterministic_and_padding(void **state) {
    (void)state;
    int64_t rows = 5, cols = 300; /* 3 groups, the last one 44 long */
    float *src = make_data(rows * cols, 7, 1);
    for (int dtype = 0; dtype < CSD_DTYPE_COUNT; dtype++) {
        size_t nb = csd_qmat_bytes(dtype, rows, cols);
        uint8_t *a = csd_alloc(nb), *b = csd_alloc(nb);
        memset(a, 0x00, nb);
        memset(b, 0xa5, nb); /* every byte must be written, padding included */
        assert_int_equal(csd_qmat_quantize(dtype, src, rows, cols, a, NULL), 0);
        assert_int_equal(csd_qmat_quantize(dtype, src, rows, cols, b, NULL), 0);
        assert_memory_equal(a, b, nb);
        if (dtype == CSD_DTYPE_Q4 || dtype == CSD_DTYPE_Q8) {
            for (int64_t r = 0; r < 16; r++) { /* rows 5..15 pad the block */
                for (int64_t c = 0; c < 384; c++) {
                    int q = csd_quant_get_q(dtype, cols, a, r, c);
                    if (r >= rows)
                        assert_int_equal(q, dtype == CSD_DTYPE_Q4 ? -8 : 0); /* 0 bytes */
                    else if (c >= cols) assert_int_equal(q, 0);
                }
                for (int64_t g = 0; g < 3 && r >= rows; g++)
                    assert_int_equal(csd_quant_get_scale(dtype, cols, a, r, g), 0);
            }
        }
        csd_free(a);
        csd_free(b);
    }
    csd_free(src);
}

/* The documented byte layout (quant.h): groups in pairs after a 64-byte scale line (16 f16 scales
 * of the pair's first group, then of its second); weight (r, c) of a block group sits in vector
 * c / 4 at byte 4 r + c % 4 (Q4: vector (c % 64) / 4, high nibble for c >= 64, stored as q + 8). */
static void test_block_layout(void **state) {
    (void)state;
    int64_t rows = 20, cols = 300; /* 2 blocks, the second one partial; 3 groups, the last short */
    float *src = make_data(rows * cols, 9, 1);
    for (int dtype = CSD_DTYPE_Q8; dtype <= CSD_DTYPE_Q4; dtype++) {
        size_t nb = csd_qmat_bytes(dtype, rows, cols), bb = csd_quant_block_bytes(dtype, cols);
        uint8_t *m = csd_alloc(nb);
        float *out = csd_alloc_array((size_t)cols, sizeof *out);
        assert_int_equal(csd_qmat_quantize(dtype, src, rows, cols, m, NULL), 0);
        csd_qmat w = {dtype, rows, cols, m, nb};
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *blk = m + (size_t)(r / 16) * bb;
            csd_qmat_dequant_row(&w, r, out);
            for (int64_t c = 0; c < cols; c++) {
                int64_t g = c / 128, j = c % 128, lane = r % 16;
                size_t gb = dtype == CSD_DTYPE_Q8 ? 2048 : 1024,
                       pair = (size_t)(g / 2) * (64 + 2 * gb);
                const uint8_t *grp = blk + pair + 64 + (size_t)(g % 2) * gb;
                uint16_t sc;
                memcpy(&sc, blk + pair + (size_t)(g % 2) * 32 + (size_t)lane * 2, sizeof sc);
                int q;
                if (dtype == CSD_DTYPE_Q8) {
                    q = (int8_t)grp[(j / 4) * 64 + lane * 4 + j % 4];
                } else {
                    uint8_t byte = grp[((j % 64) / 4) * 64 + lane * 4 + j % 4];
                    q = (j >= 64 ? byte >> 4 : byte & 15) - 8;
                }
                assert_int_equal(q, csd_quant_get_q(dtype, cols, m, r, c));
                assert_true(out[c] == csd_f16_to_f32(sc) * (float)q);
            }
        }
        csd_free(out);
        csd_free(m);
    }
    csd_free(src);
}

/* Plain absmax reference: d = amax / qmax on a symmetric grid, d rounded to f16 like ours. Returns
 * the squared error, and in *wse the error weighted by (x / amax)^2, the objective of the Q4
 * search. */
static double absmax_sse(const float *x, int n, int qmax, double *wse) {
    float amax = 0;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = csd_f16_to_f32(csd_f32_to_f16(amax / (float)qmax));
    double se = 0;
    *wse = 0;
    for (int i = 0; i < n; i++) {
        float q = d > 0 ? nearbyintf(x[i] / d) : 0;
        q = fminf(fmaxf(q, (float)-qmax), (float)qmax);
        double e2 = ((double)x[i] - q * d) * ((double)x[i] - q * d), r = x[i] / amax;
        se += e2;
        *wse += r * r * e2;
    }
    return se;
}

/* Absmax is one of the candidates, so the chosen scale is never worse than it by the search's own
 * objective: plain squared error for Q8, squared error weighted by (w / amax)^2 for Q4 (which keeps
 * the largest weights exact rather than minimising the plain error). Both also beat absmax on the
 * plain squared error overall. */
static void test_clipping_beats_absmax(void **state) {
    (void)state;
    int64_t rows = 64, cols = 1024;
    float *src = make_data(rows * cols, 42, 1);
    float *out = csd_alloc_array((size_t)cols, sizeof *out);
    for (int dtype = CSD_DTYPE_Q8; dtype <= CSD_DTYPE_Q4; dtype++) {
        int qmax = dtype == CSD_DTYPE_Q4 ? 7 : 127;
        size_t nb = csd_qmat_bytes(dtype, rows, cols);
        void *buf = csd_alloc(nb);
        assert_int_equal(csd_qmat_quantize(dtype, src, rows, cols, buf, NULL), 0);
        csd_qmat w = {dtype, rows, cols, buf, nb};
        double ours = 0, base = 0, ours_w = 0, base_w = 0;
        for (int64_t r = 0; r < rows; r++) {
            csd_qmat_dequant_row(&w, r, out);
            for (int64_t g = 0; g < cols; g += 128) {
                const float *x = src + r * cols + g;
                float amax = 0;
                for (int j = 0; j < 128; j++) amax = fmaxf(amax, fabsf(x[j]));
                double og = 0, ow = 0, bw;
                for (int j = 0; j < 128; j++) {
                    double e = (double)out[g + j] - x[j], rel = x[j] / amax;
                    og += e * e;
                    ow += rel * rel * e * e;
                }
                double bg = absmax_sse(x, 128, qmax, &bw);
                if (dtype == CSD_DTYPE_Q4)
                    assert_true(ow <= bw * (1 + 1e-5));
                else
                    assert_true(og <= bg * (1 + 1e-6));
                ours += og;
                base += bg;
                ours_w += ow;
                base_w += bw;
            }
        }
        printf("%s: sse ours/absmax = %.3f, weighted %.3f\n", csd_dtype_name(dtype), ours / base,
               ours_w / base_w);
        assert_true(ours < (dtype == CSD_DTYPE_Q4 ? 0.85 : 0.999) * base);
        if (dtype == CSD_DTYPE_Q4) assert_true(ours_w < 0.85 * base_w);
        csd_free(buf);
    }
    csd_free(out);
    csd_free(src);
}

static void test_bad_dtype(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    uint8_t buf[64];
    csd_err err = {0};
    assert_int_equal(csd_qmat_quantize(99, x, 1, 4, buf, &err), CSD_EUNSUPPORTED);
    assert_int_equal(err.code, CSD_EUNSUPPORTED);
    assert_int_equal(csd_qmat_quantize(CSD_DTYPE_Q4, x, -1, 4, buf, &err), CSD_EINVAL);
}

/* The largest weight each format stores comes back finite and close; one just beyond it, an
 * infinity or a NaN is refused with the row and column named. */
static void test_out_of_range_weights(void **state) {
    (void)state;
    enum { ROWS = 2, COLS = 256 };
    const int dtypes[4] = {CSD_DTYPE_Q4, CSD_DTYPE_Q8, CSD_DTYPE_F16, CSD_DTYPE_BF16};
    const float limits[4] = {65504.0f * 7, 65504.0f * 127, 65504.0f, 0x1.FEp127f};
    float *x = make_data(ROWS * COLS, 5, 0), out[COLS];
    size_t bytes = csd_qmat_bytes(CSD_DTYPE_F32, ROWS, COLS);
    for (int d = 0; d < 4; d++) /* Q4/Q8 blocks of rows are padded: maybe more than f32's */
        if (csd_qmat_bytes(dtypes[d], ROWS, COLS) > bytes)
            bytes = csd_qmat_bytes(dtypes[d], ROWS, COLS);
    void *buf = csd_alloc(bytes);
    assert_non_null(buf);
    for (int d = 0; d < 4; d++) {
        csd_err err = {0};
        x[COLS + 130] = -limits[d];
        assert_int_equal(csd_qmat_quantize(dtypes[d], x, ROWS, COLS, buf, &err), 0);
        csd_qmat w = {dtypes[d], ROWS, COLS, buf, csd_qmat_bytes(dtypes[d], ROWS, COLS)};
        csd_qmat_dequant_row(&w, 1, out);
        for (int c = 0; c < COLS; c++) assert_true(isfinite(out[c]));
        assert_true(fabsf(out[130] + limits[d]) <= limits[d] * 0.01f);
        const float bad[3] = {nextafterf(limits[d], INFINITY), INFINITY, NAN};
        for (int b = 0; b < 3; b++) {
            x[COLS + 130] = b == 0 ? -bad[b] : bad[b];
            assert_int_equal(csd_qmat_quantize(dtypes[d], x, ROWS, COLS, buf, &err), CSD_ERANGE);
            assert_non_null(strstr(err.msg, "row 1, column 130"));
            assert_non_null(strstr(err.msg, csd_dtype_name(dtypes[d])));
        }
        x[COLS + 130] = 0;
    }
    csd_err err = {0}; /* f32 stores any finite weight, and no NaN */
    x[3] = NAN;
    assert_int_equal(csd_qmat_quantize(CSD_DTYPE_F32, x, ROWS, COLS, buf, &err), CSD_ERANGE);
    csd_free(buf);
    csd_free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_block_layout),
        cmocka_unit_test(test_error_bounds),
        cmocka_unit_test(test_zero_and_exact),
        cmocka_unit_test(test_deterministic_and_padding),
        cmocka_unit_test(test_clipping_beats_absmax),
        cmocka_unit_test(test_bad_dtype),
        cmocka_unit_test(test_out_of_range_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
