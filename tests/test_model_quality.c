/* Quality of quantized models against f32 (model/quality.h): the metric functions on hand-made
 * distributions, then stories260K teacher-forced over golden.json's greedy_ids at INT8 and INT4,
 * with a plain-absmax quantizer (written here, same layout) as the baseline the kernels must
 * beat. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "kern/kern.h"
#include "kern/quant.h"
#include "model/model.h"
#include "model/quality.h"
#include "test_util.h"

/* ---- metric primitives ---- */

static void test_log_softmax_normalises(void **state) {
    (void)state;
    const float logits[4] = {1.0f, -2.0f, 0.5f, 3.0f};
    float shifted[4];
    double lp[4], ls[4], sum = 0.0;
    for (int v = 0; v < 4; v++) shifted[v] = logits[v] + 100.0f; /* shift-invariant */
    csd_quality_log_softmax(logits, 4, lp);
    csd_quality_log_softmax(shifted, 4, ls);
    for (int v = 0; v < 4; v++) {
        sum += exp(lp[v]);
        assert_true(fabs(lp[v] - ls[v]) < 1e-5);
    }
    assert_true(fabs(sum - 1.0) < 1e-12);
    assert_true(fabs(lp[3] - lp[0] - 2.0) < 1e-12); /* differences of logits survive */
}

static void test_kl_identical_is_zero(void **state) {
    (void)state;
    float logits[7];
    double lp[7];
    for (int v = 0; v < 7; v++) logits[v] = (float)(v * v % 5) - 1.5f;
    csd_quality_log_softmax(logits, 7, lp);
    assert_true(csd_quality_kl(lp, lp, 7) == 0.0);
}

/* P = (0.5, 0.5), Q = (0.9, 0.1): KL = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5 ln(25/9). */
static void test_kl_two_tokens(void **state) {
    (void)state;
    const float p_logits[2] = {0.0f, 0.0f};
    const float q_logits[2] = {logf(0.9f), logf(0.1f)};
    double lp[2], lq[2];
    csd_quality_log_softmax(p_logits, 2, lp);
    csd_quality_log_softmax(q_logits, 2, lq);
    double expect = 0.5 * log(25.0 / 9.0); /* 0.5108 */
    assert_true(fabs(csd_quality_kl(lp, lq, 2) - expect) < 1e-6);
    /* The reverse direction differs: KL is not symmetric. */
    double reverse = 0.9 * log(0.9 / 0.5) + 0.1 * log(0.1 / 0.5); /* 0.3681 */
    assert_true(fabs(csd_quality_kl(lq, lp, 2) - reverse) < 1e-6);
}

static void test_argmax_first_on_ties(void **state) {
    (void)state;
    const float x[5] = {0.0f, 2.0f, -1.0f, 2.0f, 1.0f};
    assert_int_equal(csd_quality_argmax(x, 5), 1);
    assert_int_equal(csd_quality_argmax(x, 1), 0);
}

/* Three positions over a vocabulary of 4: two agree on the argmax, one does not; the reference is
 * uniform, so its perplexity is exactly 4. */
static void test_accumulate_counts(void **state) {
    (void)state;
    const float ref[3 * 4] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const float test[3 * 4] = {0, 0, 0, 0,  /* uniform: argmax 0 == ref's 0 */
                               5, 1, 1, 1,  /* argmax 0: agrees */
                               0, 0, 3, 0}; /* argmax 2: disagrees */
    const int32_t next[3] = {1, 0, 3};
    double scratch[8];
    csd_quality_stats s = {0};
    csd_err err = {0};
    assert_int_equal(csd_quality_accumulate(&s, ref, test, 4, next, 3, scratch, &err), 0);
    assert_int_equal(s.positions, 3);
    assert_int_equal(s.top1_agree, 2);
    assert_true(fabs(csd_quality_top1(&s) - 2.0 / 3.0) < 1e-12);
    assert_true(fabs(csd_quality_ppl_ref(&s) - 4.0) < 1e-9);
    /* Test model: -ln P of next = ln 4, ln(e^5 + 3e) - 5, ln(e^3 + 3) - 0. */
    double nll = log(4.0) + (log(exp(5.0) + 3.0 * exp(1.0)) - 5.0) + log(exp(3.0) + 3.0);
    assert_true(fabs(csd_quality_ppl_test(&s) - exp(nll / 3.0)) < 1e-9);
    assert_true(s.kl_sum > 0.0 && s.kl_max > 0.0 && s.kl_max <= s.kl_sum);
    assert_true(fabs(csd_quality_mean_kl(&s) - s.kl_sum / 3.0) < 1e-15);
    /* An id outside the vocabulary is an error, not a read out of bounds. */
    const int32_t bad[1] = {4};
    assert_int_equal(csd_quality_accumulate(&s, ref, test, 4, bad, 1, scratch, &err), CSD_ERANGE);
    csd_quality_stats empty = {0};
    assert_true(csd_quality_ppl_ref(&empty) == 0.0 && csd_quality_top1(&empty) == 0.0);
}

/* ---- stories260K ---- */

#define MAX_IDS 128

static int load_greedy_ids(int32_t *ids) {
    json_error_t jerr;
    json_t *root = json_load_file(CSD_STORIES_DIR "/golden.json", 0, &jerr);
    assert_non_null(root);
    json_t *a = json_object_get(root, "greedy_ids");
    int n = (int)json_array_size(a);
    assert_true(n >= 2 && n <= MAX_IDS);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    json_decref(root);
    return n;
}

static csd_model *load(int precision) {
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    opts.precision = precision;
    opts.n_threads = 2;
    if (precision == CSD_DTYPE_F32) opts.kv_dtype = CSD_DTYPE_F32;
    csd_model *m = NULL;
    csd_err err = {0};
    if (csd_model_load_hf(&m, CSD_STORIES_DIR, &opts, &err)) fail_msg("load: %s", err.msg);
    return m;
}

/* Plain symmetric absmax in the quant.h layout: d = f16(amax / qmax), q = round(w / d). */
static void absmax_quantize(int dtype, const float *src, int64_t rows, int64_t cols, uint8_t *dst) {
    int qmax = dtype == CSD_DTYPE_Q4 ? 7 : 127;
    memset(dst, 0, csd_qmat_bytes(dtype, rows, cols));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < csd_quant_groups(cols); g++) {
            const float *w = src + r * cols + g * CSD_QUANT_GROUP;
            int n = (int)(cols - g * CSD_QUANT_GROUP < CSD_QUANT_GROUP ? cols - g * CSD_QUANT_GROUP
                                                                       : CSD_QUANT_GROUP);
            float amax = 0.0f;
            for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(w[j]));
            uint16_t dh = csd_f32_to_f16(amax / (float)qmax);
            float d = csd_f16_to_f32(dh);
            int8_t q[CSD_QUANT_GROUP] = {0};
            for (int j = 0; j < n && d > 0.0f; j++) {
                long v = lrintf(w[j] / d);
                q[j] = (int8_t)(v < -qmax ? -qmax : v > qmax ? qmax : v);
            }
            csd_quant_pack_group(dtype, cols, dst, r, g, q, dh);
        }
    }
}

/* A model whose matrices are the f32 reference's, absmax-quantized to dtype (embeddings and head at
 * 8 bits, as the loader does under int4). It borrows ref's norms; bufs receives what to
 * csd_free. */
typedef struct absmax_model {
    csd_model *m;
    void *bufs[64];
    int n_bufs;
} absmax_model;

static void absmax_matrix(absmax_model *am, int dtype, const csd_qmat *src, csd_qmat *dst) {
    assert_int_equal(src->dtype, CSD_DTYPE_F32);
    size_t bytes = csd_qmat_bytes(dtype, src->rows, src->cols);
    uint8_t *p = csd_alloc(bytes);
    assert_non_null(p);
    assert_true(am->n_bufs < 64);
    am->bufs[am->n_bufs++] = p;
    absmax_quantize(dtype, src->data, src->rows, src->cols, p);
    *dst = (csd_qmat){dtype, src->rows, src->cols, p, bytes};
}

static void absmax_create(absmax_model *am, csd_model *ref, int dtype) {
    memset(am, 0, sizeof *am);
    const csd_weights *rw = csd_model_weights(ref);
    csd_weights w = *rw;
    int64_t nl = rw->layer_end - rw->layer_begin;
    csd_layer_weights *layers = csd_alloc_array((size_t)nl, sizeof *layers);
    assert_non_null(layers);
    am->bufs[am->n_bufs++] = layers;
    absmax_matrix(am, CSD_DTYPE_Q8, &rw->embed, &w.embed);
    if (rw->head.data == rw->embed.data)
        w.head = w.embed;
    else
        absmax_matrix(am, CSD_DTYPE_Q8, &rw->head, &w.head);
    for (int64_t l = 0; l < nl; l++) {
        const csd_layer_weights *s = &rw->layers[l];
        csd_layer_weights *d = &layers[l];
        *d = *s; /* norms and biases stay the reference's f32 */
        absmax_matrix(am, dtype, &s->wq, &d->wq);
        absmax_matrix(am, dtype, &s->wk, &d->wk);
        absmax_matrix(am, dtype, &s->wv, &d->wv);
        absmax_matrix(am, dtype, &s->wo, &d->wo);
        absmax_matrix(am, dtype, &s->gate, &d->gate);
        absmax_matrix(am, dtype, &s->up, &d->up);
        absmax_matrix(am, dtype, &s->down, &d->down);
    }
    w.layers = layers;
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    opts.n_threads = 2;
    csd_err err = {0};
    if (csd_model_create(&am->m, csd_model_cfg(ref), &w, &opts, &err))
        fail_msg("create: %s", err.msg);
}

static void absmax_destroy(absmax_model *am) {
    csd_model_destroy(am->m);
    for (int i = 0; i < am->n_bufs; i++) csd_free(am->bufs[i]);
}

static csd_quality_stats measure(csd_model *ref, csd_model *test, const int32_t *ids, int n,
                                 int64_t window) {
    csd_quality_stats s;
    csd_err err = {0};
    int64_t n_windows = 0;
    if (csd_quality_measure(ref, test, ids, n, window, &s, &n_windows, &err))
        fail_msg("measure: %s", err.msg);
    assert_int_equal(s.positions, n - 1);
    return s;
}

static void report(const char *name, const csd_quality_stats *s) {
    printf("stories260K %-13s ppl_ref %.5f ppl %.5f mean_kl %.6f max_kl %.5f top1 %.2f%% "
           "(%lld/%lld)\n",
           name, csd_quality_ppl_ref(s), csd_quality_ppl_test(s), csd_quality_mean_kl(s), s->kl_max,
           100.0 * csd_quality_top1(s), (long long)s->top1_agree, (long long)s->positions);
    fflush(stdout);
}

/* Prints a missed bound with its figure; returns whether value is on the right side. */
static bool within(const char *what, double value, double bound, bool at_least) {
    bool ok = at_least ? value >= bound : value <= bound;
    if (!ok) printf("MISSED %s: %.6f, bound %s %.6f\n", what, value, at_least ? ">=" : "<=", bound);
    return ok;
}

/* The reference against itself: KL exactly 0, full agreement, equal perplexities, and windows that
 * share one token still score every position once. */
static void test_self_and_windows(void **state) {
    (void)state;
    CSD_REQUIRE_FILE(CSD_STORIES_DIR "/golden.json");
    csd_kern_init();
    int32_t ids[MAX_IDS];
    int n = load_greedy_ids(ids);
    csd_model *ref = load(CSD_DTYPE_F32);
    csd_quality_stats s = measure(ref, ref, ids, n, n);
    assert_true(s.kl_sum == 0.0);
    assert_int_equal(s.top1_agree, s.positions);
    assert_true(csd_quality_ppl_ref(&s) == csd_quality_ppl_test(&s));
    /* Its own greedy text: confident, but not certain. */
    assert_true(csd_quality_ppl_ref(&s) > 1.0 && csd_quality_ppl_ref(&s) < 10.0);
    csd_quality_stats w;
    csd_err err = {0};
    int64_t n_windows = 0;
    assert_int_equal(csd_quality_measure(ref, ref, ids, n, 20, &w, &n_windows, &err), 0);
    assert_int_equal(w.positions, n - 1);
    assert_int_equal(n_windows, (n - 2) / 19 + 1); /* windows start every 19 tokens */
    /* Windowing equals measuring each window's tokens as a sequence of its own. */
    double nll = 0.0;
    int64_t pos = 0;
    for (int start = 0; start < n - 1; start += 19) {
        int len = n - start < 20 ? n - start : 20;
        csd_quality_stats part = measure(ref, ref, ids + start, len, len);
        nll += part.nll_ref;
        pos += part.positions;
    }
    assert_int_equal(pos, w.positions);
    assert_true(fabs(nll - w.nll_ref) < 1e-9 * nll);
    assert_true(w.nll_ref != s.nll_ref); /* the cut really removed context */
    assert_int_equal(csd_quality_measure(ref, ref, ids, n, 1, &w, NULL, &err), CSD_EINVAL);
    assert_int_equal(csd_quality_measure(ref, ref, ids, 1, 20, &w, NULL, &err), CSD_EINVAL);
    csd_model_destroy(ref);
}

static void test_int8_int4_against_f32(void **state) {
    (void)state;
    CSD_REQUIRE_FILE(CSD_STORIES_DIR "/golden.json");
    csd_kern_init();
    int32_t ids[MAX_IDS];
    int n = load_greedy_ids(ids);
    csd_model *ref = load(CSD_DTYPE_F32);
    csd_model *q8 = load(CSD_DTYPE_Q8), *q4 = load(CSD_DTYPE_Q4);
    absmax_model a8, a4;
    absmax_create(&a8, ref, CSD_DTYPE_Q8);
    absmax_create(&a4, ref, CSD_DTYPE_Q4);
    csd_quality_stats s8 = measure(ref, q8, ids, n, n), s4 = measure(ref, q4, ids, n, n);
    csd_quality_stats b8 = measure(ref, a8.m, ids, n, n), b4 = measure(ref, a4.m, ids, n, n);
    printf("kernels: %s\n", csd_kern_name());
    report("int8", &s8);
    report("int8-absmax", &b8);
    report("int4", &s4);
    report("int4-absmax", &b4);
    /* Bounds from the issue "Quantized CPU kernels", section Quality (all checked, then
     * reported). */
    int failed = 0;
    failed += !within("int8 mean KL", csd_quality_mean_kl(&s8), 0.001, false);
    failed += !within("int8 top-1", csd_quality_top1(&s8), 0.97, true);
    failed += !within("int4 mean KL", csd_quality_mean_kl(&s4), 0.06, false);
    failed += !within("int4 top-1", csd_quality_top1(&s4), 0.93, true);
    absmax_destroy(&a4);
    absmax_destroy(&a8);
    csd_model_destroy(q4);
    csd_model_destroy(q8);
    csd_model_destroy(ref);
    if (failed) fail_msg("%d quality bound(s) missed (figures above)", failed);
}

/* tests/data/quality_text.txt (~1000 tokens, two 512-token windows), tokenized by the cascadia
 * binary (this test links csd_model only). The bounds of the issue are for the golden sequence;
 * here the figures are printed for docs/quality.md, and INT4 must beat plain absmax. */
#define LONG_MAX_IDS 4096

static int tokenize_long_text(int32_t *ids) {
    /* CSD_EMULATOR (empty unless cross-built), CSD_BINARY and the paths come from CMake; single
     * quotes keep spaces in the paths intact. */
    const char *cmd = CSD_EMULATOR " '" CSD_BINARY "' tokenize '" CSD_STORIES_DIR
                                   "' < '" CSD_SOURCE_DIR "/tests/data/quality_text.txt'";
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int n = 0;
    while (n < LONG_MAX_IDS && fscanf(p, "%d", &ids[n]) == 1) n++;
    assert_int_equal(pclose(p), 0);
    return n;
}

static void test_long_text(void **state) {
    (void)state;
    CSD_REQUIRE_FILE(CSD_STORIES_DIR "/tokenizer.json");
    CSD_REQUIRE_FILE(CSD_BINARY);
    csd_kern_init();
    static int32_t ids[LONG_MAX_IDS];
    int n = tokenize_long_text(ids);
    assert_true(n > 512 && n < LONG_MAX_IDS); /* more than one window */
    csd_model *ref = load(CSD_DTYPE_F32);
    int64_t window = csd_model_max_ctx(ref) < 512 ? csd_model_max_ctx(ref) : 512;
    csd_model *q8 = load(CSD_DTYPE_Q8), *q4 = load(CSD_DTYPE_Q4);
    absmax_model a8, a4;
    absmax_create(&a8, ref, CSD_DTYPE_Q8);
    absmax_create(&a4, ref, CSD_DTYPE_Q4);
    csd_quality_stats s8 = measure(ref, q8, ids, n, window), s4 = measure(ref, q4, ids, n, window);
    csd_quality_stats b8 = measure(ref, a8.m, ids, n, window),
                      b4 = measure(ref, a4.m, ids, n, window);
    printf("quality_text.txt: %d tokens, window %lld\n", n, (long long)window);
    report("int8", &s8);
    report("int8-absmax", &b8);
    report("int4", &s4);
    report("int4-absmax", &b4);
    assert_true(csd_quality_mean_kl(&s4) < csd_quality_mean_kl(&b4));
    assert_true(csd_quality_ppl_test(&s4) < csd_quality_ppl_test(&b4));
    absmax_destroy(&a4);
    absmax_destroy(&a8);
    csd_model_destroy(q4);
    csd_model_destroy(q8);
    csd_model_destroy(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_softmax_normalises),
        cmocka_unit_test(test_kl_identical_is_zero),
        cmocka_unit_test(test_kl_two_tokens),
        cmocka_unit_test(test_argmax_first_on_ties),
        cmocka_unit_test(test_accumulate_counts),
        cmocka_unit_test(test_self_and_windows),
        cmocka_unit_test(test_int8_int4_against_f32),
        cmocka_unit_test(test_long_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
