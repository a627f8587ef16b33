/* The weight stream behind `cascadia bench`'s stream ceiling: one pass must multiply every matrix
 * of the stage (each layer's seven, and the output head on the last stage) by the input
 * of its width, exactly as csd_matmul does matrix by matrix, and allocate nothing while it runs.
 * Checked for INT4 (one lanes job per width and dtype), INT8 and F32 weights (one csd_matmul per
 * matrix). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "kern/kern.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/weight_stream.h"
#include "test_util.h"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    if (csd_test_make_tmpdir(g_dir, sizeof g_dir, "csd-wstream")) return -1;
    const csd_synth_preset *p = csd_synth_preset_find("tiny");
    csd_model_config cfg;
    csd_err err = {0};
    if (!p || csd_synth_config(&cfg, p, CSD_ARCH_LLAMA, 300, 1, 2, &err)) return -1;
    csd_kern_init();
    return csd_synth_write(&cfg, CSD_DTYPE_F32, 11, g_dir, &err) ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    return csd_test_remove_tree(g_dir);
}

static csd_model *load(int precision, int64_t layer_begin, int64_t layer_end) {
    csd_model_opts o;
    csd_model_opts_default(&o);
    o.precision = precision;
    o.n_threads = 2;
    o.max_ctx = 16;
    o.layer_begin = layer_begin;
    o.layer_end = layer_end;
    csd_model *m = NULL;
    csd_err err = {0};
    if (csd_model_load_hf(&m, g_dir, &o, &err)) fail_msg("load: %s", err.msg);
    return m;
}

/* Every output of a pass equals csd_matmul of its matrix and input, bit for bit; no output is
 * all zeros (the pass ran). */
static void check_pass(csd_model *m, int expect_mats) {
    csd_weight_stream *s = NULL;
    csd_err err = {0};
    if (csd_weight_stream_create(&s, m, &err)) fail_msg("create: %s", err.msg);
    assert_int_equal(csd_weight_stream_count(s), expect_mats);
    uint64_t allocs = csd_alloc_count();
    csd_weight_stream_run(s);
    assert_int_equal(csd_alloc_count(), allocs);
    for (int i = 0; i < expect_mats; i++) {
        const csd_qmat *w;
        const float *x, *y;
        csd_weight_stream_get(s, i, &w, &x, &y);
        float *ref = csd_alloc_array((size_t)w->rows, sizeof(float));
        void *scratch = csd_alloc(csd_matmul_scratch_bytes(w->cols, 1));
        assert_non_null(ref);
        assert_non_null(scratch);
        csd_matmul(csd_model_pool(m), w, x, 1, ref, scratch);
        if (memcmp(ref, y, (size_t)w->rows * sizeof(float)) != 0)
            fail_msg("matrix %d differs from csd_matmul", i);
        bool nonzero = false;
        for (int64_t r = 0; r < w->rows; r++) nonzero = nonzero || y[r] != 0.0f;
        assert_true(nonzero);
        csd_free(ref);
        csd_free(scratch);
    }
    csd_weight_stream_destroy(s);
}

/* The whole model at precision dtype: seven matrices a layer, then the head. */
static void check_whole_model(int dtype) {
    csd_model *m = load(dtype, -1, -1);
    check_pass(m, (int)(7 * csd_model_cfg(m)->n_layers) + 1);
    csd_model_destroy(m);
}

static void test_every_matrix_int4(void **state) {
    (void)state;
    check_whole_model(CSD_DTYPE_Q4);
}

static void test_every_matrix_int8(void **state) {
    (void)state;
    check_whole_model(CSD_DTYPE_Q8);
}

static void test_every_matrix_f32(void **state) {
    (void)state;
    check_whole_model(CSD_DTYPE_F32);
}

/* Jobs a pass of the whole model at precision dtype runs; *head_dtype: the head's. */
static int whole_model_jobs(int dtype, int *head_dtype) {
    csd_model *m = load(dtype, -1, -1);
    *head_dtype = csd_model_weights(m)->head.dtype;
    csd_weight_stream *s = NULL;
    csd_err err = {0};
    if (csd_weight_stream_create(&s, m, &err)) fail_msg("create: %s", err.msg);
    int jobs = csd_weight_stream_jobs(s);
    csd_weight_stream_destroy(s);
    csd_model_destroy(m);
    return jobs;
}

/* An INT4 model keeps its head at 8 bits; the head then gets a job of its own, as in decode,
 * instead of sharing the dim-wide Q4 job, where a lane running from Q4 into Q8 walks one stream
 * at a time. INT8 (every matrix Q8) has one job per input width. */
static void test_head_of_another_dtype_alone(void **state) {
    (void)state;
    int head4, head8;
    int jobs4 = whole_model_jobs(CSD_DTYPE_Q4, &head4);
    int jobs8 = whole_model_jobs(CSD_DTYPE_Q8, &head8);
    assert_int_equal(head4, CSD_DTYPE_Q8);
    assert_int_equal(head8, CSD_DTYPE_Q8);
    assert_true(jobs8 >= 2); /* dim-wide and hidden-wide inputs */
    assert_int_equal(jobs4, jobs8 + 1);
}

/* A first stage of one layer: its seven matrices, no head. */
static void test_stage_without_head(void **state) {
    (void)state;
    csd_model *m = load(CSD_DTYPE_Q4, 0, 1);
    assert_false(csd_model_weights(m)->has_head);
    check_pass(m, 7);
    csd_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_matrix_int4),
        cmocka_unit_test(test_every_matrix_int8),
        cmocka_unit_test(test_every_matrix_f32),
        cmocka_unit_test(test_head_of_another_dtype_alone),
        cmocka_unit_test(test_stage_without_head),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
