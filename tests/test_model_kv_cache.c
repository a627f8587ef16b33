/* The KV cache's prefix copy (src/model/kv_cache.c), what the prefix cache and the wire's
 * COPY_PREFIX frame use: a sequence continued from a copied prefix gives the logits it gives when
 * it computed the prefix itself, for every cache type; a cache copied onto itself keeps its first
 * n positions (the copy no longer memcpys the cache onto itself, which C leaves undefined; glibc
 * and ASan let an exact self-copy pass, so this checks the result, not the fault); a prefix longer
 * than the source or the destination, or caches of other shapes, are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "kern/kern.h"
#include "model/model.h"
#include "test_synth.h"
#include "test_util.h"

#define N_IDS 9
#define N_PREFIX 5

static char g_root[256];
static const int32_t g_ids[N_IDS] = {1, 17, 203, 5, 88, 140, 9, 42, 7};

static int setup(void **state) {
    (void)state;
    if (csd_test_make_tmpdir(g_root, sizeof g_root, "csd-kv")) return -1;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/kvh-3", g_root);
    csd_test_write_tiny(dir, 12, 3, 5);
    snprintf(dir, sizeof dir, "%s/kvh-4", g_root);
    csd_test_write_tiny(dir, 12, 4, 6);
    csd_kern_init();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return csd_test_remove_tree(g_root);
}

static csd_model *load(int64_t n_kv_heads, int kv_dtype) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/kvh-%lld", g_root, (long long)n_kv_heads);
    csd_model_opts o;
    csd_model_opts_default(&o);
    o.precision = CSD_DTYPE_F32;
    o.kv_dtype = kv_dtype;
    o.n_threads = 1;
    o.max_ctx = 16;
    csd_model *m = NULL;
    csd_err err = {0};
    if (csd_model_load_hf(&m, dir, &o, &err)) fail_msg("load: %s", err.msg);
    return m;
}

/* Feeds g_ids[from..N_IDS) one token at a time; the last token's logits into out. */
static void feed(csd_model *m, csd_kv *kv, int from, float *out) {
    csd_err err = {0};
    for (int i = from; i < N_IDS; i++)
        if (csd_model_forward_seq(m, kv, &g_ids[i], NULL, 1, out, &err))
            fail_msg("token %d: %s", i, err.msg);
}

static void assert_same_logits(const float *a, const float *b, int64_t vocab, const char *what,
                               int kv_dtype) {
    for (int64_t i = 0; i < vocab; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s (%s cache): logit %lld is %.9g, computed in place %.9g", what,
                     csd_dtype_name(kv_dtype), (long long)i, (double)a[i], (double)b[i]);
}

static void prefix_copies(int kv_dtype) {
    csd_model *m = load(3, kv_dtype);
    int64_t vocab = csd_model_cfg(m)->vocab_size;
    float *want = csd_alloc_array((size_t)vocab, sizeof(float));
    float *got = csd_alloc_array((size_t)vocab, sizeof(float));
    assert_true(want && got);
    csd_kv *a = csd_test_new_kv(m), *b = csd_test_new_kv(m);
    csd_err err = {0};
    feed(m, a, 0, want); /* every token in place */

    /* b continues from a's first N_PREFIX positions */
    assert_int_equal(csd_kv_copy_prefix(b, a, N_PREFIX, &err), 0);
    assert_int_equal(csd_kv_len(b), N_PREFIX);
    feed(m, b, N_PREFIX, got);
    assert_same_logits(got, want, vocab, "continued from a copied prefix", kv_dtype);

    /* a onto itself: it keeps its first N_PREFIX positions and continues from there */
    assert_int_equal(csd_kv_copy_prefix(a, a, N_PREFIX, &err), 0);
    assert_int_equal(csd_kv_len(a), N_PREFIX);
    feed(m, a, N_PREFIX, got);
    assert_same_logits(got, want, vocab, "continued from its own prefix", kv_dtype);

    csd_kv_destroy(a);
    csd_kv_destroy(b);
    csd_free(want);
    csd_free(got);
    csd_model_destroy(m);
}

static void test_prefix_copy_every_cache_type(void **state) {
    (void)state;
    prefix_copies(CSD_DTYPE_F32);
    prefix_copies(CSD_DTYPE_F16);
    prefix_copies(CSD_DTYPE_Q8);
}

static void test_prefix_copy_refusals(void **state) {
    (void)state;
    csd_model *m3 = load(3, CSD_DTYPE_F16), *m4 = load(4, CSD_DTYPE_F16);
    csd_kv *a = csd_test_new_kv(m3), *b = csd_test_new_kv(m3), *other = csd_test_new_kv(m4);
    float *logits = csd_alloc_array((size_t)csd_model_cfg(m3)->vocab_size, sizeof(float));
    assert_non_null(logits);
    csd_err err = {0};
    assert_int_equal(csd_model_forward_seq(m3, a, g_ids, NULL, 3, logits, &err), 0);

    assert_int_equal(csd_kv_copy_prefix(b, a, 4, &err), CSD_ERANGE); /* a holds 3 */
    assert_non_null(strstr(err.msg, "does not fit"));
    assert_int_equal(csd_kv_copy_prefix(a, a, 4, &err), CSD_ERANGE);
    assert_int_equal(csd_kv_copy_prefix(b, a, -1, &err), CSD_ERANGE);
    assert_int_equal(csd_kv_copy_prefix(other, a, 2, &err), CSD_EMISMATCH);
    assert_int_equal(csd_kv_len(a), 3); /* a refused copy changes nothing */
    assert_int_equal(csd_kv_len(b), 0);
    assert_int_equal(csd_kv_len(other), 0);

    csd_free(logits);
    csd_kv_destroy(a);
    csd_kv_destroy(b);
    csd_kv_destroy(other);
    csd_model_destroy(m3);
    csd_model_destroy(m4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_copy_every_cache_type),
        cmocka_unit_test(test_prefix_copy_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
