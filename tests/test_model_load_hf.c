/* test_model_load_hf: a Hugging Face directory whose tensors do not match its config.json is
 * refused with the tensor named: one missing, one of the wrong shape, and tensors the
 * architecture does not define (a layer past the last one, a layer index too large for any
 * integer, a zero-padded index, an unknown suffix), and a weight that is NaN or infinite. The
 * untouched directory loads. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "format/safetensors.h"
#include "kern/kern.h"
#include "model/model.h"
#include "test_synth.h"
#include "test_util.h"

static char g_root[256];
static int g_cases;

static int setup(void **state) {
    (void)state;
    if (csd_test_make_tmpdir(g_root, sizeof g_root, "csd-load-hf")) return -1;
    csd_kern_init();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return csd_test_remove_tree(g_root);
}

/* What to change in the synthesized tensor list (NULL: nothing). */
typedef struct {
    const char *drop;       /* a tensor left out */
    const char *reshape;    /* a tensor whose first dimension is cut by one row */
    const char *extra_name; /* a copy of the final norm under this name */
    const char *poison;     /* a tensor whose element 3 becomes poison_value */
    float poison_value;
} edit;

typedef struct {
    const csd_st_set *src;
    const int *from; /* descriptor i takes its bytes from source tensor from[i] */
    const edit *e;
} copy_ctx;

static int copy_fill(void *ctx, int index, void *dst, size_t nbytes, csd_err *err) {
    (void)err;
    const copy_ctx *c = ctx;
    const csd_st_tensor *t = csd_st_at(c->src, c->from[index]);
    memcpy(dst, t->data, nbytes);
    if (c->e->poison && !strcmp(t->name, c->e->poison)) {
        assert_int_equal(t->dtype, CSD_DTYPE_F32); /* as csd_test_write_tiny writes them */
        memcpy((float *)dst + 3, &c->e->poison_value, sizeof(float));
    }
    return 0;
}

/* Rewrites dir/model.safetensors with the edit applied. */
static void apply_edit(const char *dir, const edit *e) {
    char path[600], tmp[640];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.new", path);
    csd_st_set *st = NULL;
    csd_err err = {0};
    if (csd_st_open_file(&st, path, &err)) fail_msg("open: %s", err.msg);
    int n = csd_st_count(st);
    csd_st_desc *d = csd_alloc_array((size_t)n + 1, sizeof *d);
    int *from = csd_alloc_array((size_t)n + 1, sizeof *from);
    assert_non_null(d);
    assert_non_null(from);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const csd_st_tensor *t = csd_st_at(st, i);
        if (e->drop && !strcmp(t->name, e->drop)) continue;
        d[k] = (csd_st_desc){.name = t->name, .dtype = t->dtype, .n_dims = t->n_dims};
        memcpy(d[k].shape, t->shape, sizeof t->shape);
        if (e->reshape && !strcmp(t->name, e->reshape)) d[k].shape[0]--;
        from[k++] = i;
    }
    if (e->extra_name) {
        int norm = 0;
        while (norm < n && strcmp(csd_st_at(st, norm)->name, CSD_TN_FINAL_NORM)) norm++;
        assert_true(norm < n);
        const csd_st_tensor *t = csd_st_at(st, norm);
        d[k] = (csd_st_desc){.name = e->extra_name, .dtype = t->dtype, .n_dims = 1};
        d[k].shape[0] = t->shape[0];
        from[k++] = norm;
    }
    copy_ctx c = {st, from, e};
    if (csd_st_write(tmp, d, k, copy_fill, &c, &err)) fail_msg("write: %s", err.msg);
    csd_st_close(st);
    csd_free(d);
    csd_free(from);
    assert_int_equal(rename(tmp, path), 0);
}

/* Writes a fresh tiny model (4 layers) with the edit applied and loads it; returns the loader's
 * status, *m the model on success. */
static int load_edited(const edit *e, csd_model **m, csd_err *err) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/case-%d", g_root, g_cases++);
    csd_test_write_tiny(dir, 4, 2, 7);
    apply_edit(dir, e);
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    opts.n_threads = 1;
    return csd_model_load_hf(m, dir, &opts, err);
}

/* Loading the model with the edit applied fails naming want. */
static void expect_refused(const edit *e, const char *want) {
    csd_model *m = NULL;
    csd_err err = {0};
    int rc = load_edited(e, &m, &err);
    assert_null(m);
    if (rc != CSD_EFORMAT) fail_msg("rc %d (%s), wanted CSD_EFORMAT", rc, err.msg);
    if (!strstr(err.msg, want)) fail_msg("message '%s' lacks '%s'", err.msg, want);
}

static void test_untouched_model_loads(void **state) {
    (void)state;
    csd_model *m = NULL;
    csd_err err = {0};
    /* an empty edit still rewrites the file: the rewrite itself keeps a loadable model */
    if (load_edited(&(edit){0}, &m, &err)) fail_msg("load: %s", err.msg);
    assert_int_equal(csd_model_cfg(m)->n_layers, 4);
    csd_model_destroy(m);
}

static void test_missing_tensor_is_named(void **state) {
    (void)state;
    expect_refused(&(edit){.drop = "model.layers.1.mlp.down_proj.weight"},
                   "missing tensor 'model.layers.1.mlp.down_proj.weight'");
}

static void test_wrong_shape_is_named(void **state) {
    (void)state;
    expect_refused(&(edit){.reshape = "model.layers.0.self_attn.k_proj.weight"},
                   "tensor 'model.layers.0.self_attn.k_proj.weight' has shape");
}

static void test_unexpected_tensors_are_named(void **state) {
    (void)state;
    static const char *const names[] = {
        "model.layers.4.input_layernorm.weight",                    /* past the last layer */
        "model.layers.99999999999999999999.input_layernorm.weight", /* beyond any integer */
        "model.layers.-1.input_layernorm.weight",
        "model.layers.01.input_layernorm.weight", /* a name the loader never reads */
        "model.layers. 1.input_layernorm.weight",
        "model.layers.1input_layernorm.weight",
        "model.layers..input_layernorm.weight",
        "model.layers.1.input_layernorm.weight.extra",
        "lm_head.bias",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char want[160];
        snprintf(want, sizeof want, "unexpected tensor '%s'", names[i]);
        expect_refused(&(edit){.extra_name = names[i]}, want);
    }
}

/* A NaN or infinite weight is refused naming the tensor (quantizing it is undefined, and at any
 * precision every logit would be NaN). */
static void test_non_finite_weight_is_named(void **state) {
    (void)state;
    expect_refused(&(edit){.poison = "model.layers.0.self_attn.q_proj.weight",
                           .poison_value = NAN},
                   "tensor 'model.layers.0.self_attn.q_proj.weight' holds NaN at element 3");
    expect_refused(&(edit){.poison = "model.layers.1.mlp.down_proj.weight",
                           .poison_value = -INFINITY},
                   "tensor 'model.layers.1.mlp.down_proj.weight' holds an infinity at element 3");
    expect_refused(&(edit){.poison = "model.norm.weight", .poison_value = INFINITY},
                   "tensor 'model.norm.weight' holds an infinity");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_untouched_model_loads),
        cmocka_unit_test(test_missing_tensor_is_named),
        cmocka_unit_test(test_wrong_shape_is_named),
        cmocka_unit_test(test_unexpected_tensors_are_named),
        cmocka_unit_test(test_non_finite_weight_is_named),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
