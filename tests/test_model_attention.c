/* Attention paths: a prompt forwarded whole (the RoPE and cache writes done first for all its
 * tokens, then attention), the same prompt token by token (each (token, KV head) unit doing its own
 * RoPE, cache write and attention in one job), and two sequences decoded in one batch must all give
 * bit-identical logits, for every KV cache type, with one KV head (fewer units than threads: heads
 * dealt one part at a time) and with several, on 1 and 3 threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "kern/kern.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_synth.h"
#include "test_util.h"

#define N_PROMPT 9

static char g_root[256];
static const int32_t g_prompt[N_PROMPT] = {1, 17, 203, 5, 88, 140, 9, 250, 31};
static const int32_t g_other[N_PROMPT] = {1, 44, 3, 190, 61, 7, 299, 12, 150};

/* With one KV head, 8 query heads are 2 parts of CSD_ATTN_TASK_HEADS. */
static void make_model(const char *dir, int64_t n_kv_heads) {
    csd_test_write_tiny(dir, 8, n_kv_heads, 7 + (uint64_t)n_kv_heads);
}

static int setup(void **state) {
    (void)state;
    if (csd_test_make_tmpdir(g_root, sizeof g_root, "csd-attn")) return -1;
    char dir[512];
    for (int kvh = 1; kvh <= 4; kvh *= 4) {
        snprintf(dir, sizeof dir, "%s/kvh-%d", g_root, kvh);
        make_model(dir, kvh);
    }
    csd_kern_init();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return csd_test_remove_tree(g_root);
}

static csd_model *load(int n_kv_heads, int kv_dtype, int threads) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/kvh-%d", g_root, n_kv_heads);
    csd_model_opts o;
    csd_model_opts_default(&o);
    o.kv_dtype = kv_dtype;
    o.n_threads = threads;
    o.max_ctx = 32;
    o.max_batch = 16;
    csd_model *m = NULL;
    csd_err err = {0};
    if (csd_model_load_hf(&m, dir, &o, &err)) fail_msg("load: %s", err.msg);
    return m;
}

/* Logits after the whole prompt in one forward (the prompt path). */
static void prompt_whole(csd_model *m, const int32_t *ids, float *logits) {
    csd_kv *kv = csd_test_new_kv(m);
    csd_err err = {0};
    if (csd_model_forward_seq(m, kv, ids, NULL, N_PROMPT, logits, &err))
        fail_msg("forward: %s", err.msg);
    assert_int_equal(csd_kv_len(kv), N_PROMPT);
    csd_kv_destroy(kv);
}

/* Logits after the prompt fed one token per forward (the decode path). */
static void prompt_by_token(csd_model *m, const int32_t *ids, float *logits) {
    csd_kv *kv = csd_test_new_kv(m);
    csd_err err = {0};
    for (int i = 0; i < N_PROMPT; i++)
        if (csd_model_forward_seq(m, kv, ids + i, NULL, 1, logits, &err))
            fail_msg("step %d: %s", i, err.msg);
    csd_kv_destroy(kv);
}

/* Both prompts decoded side by side, one token of each per forward: logits of each after the
 * last. */
static void prompts_batched(csd_model *m, float *logits_a, float *logits_b) {
    int64_t vocab = csd_model_cfg(m)->vocab_size;
    csd_kv *kv[2] = {csd_test_new_kv(m), csd_test_new_kv(m)};
    float *out = csd_alloc_array(2 * (size_t)vocab, sizeof *out);
    assert_non_null(out);
    csd_err err = {0};
    for (int i = 0; i < N_PROMPT; i++) {
        int32_t ids[2] = {g_prompt[i], g_other[i]};
        csd_batch b = {2, ids, NULL, kv, NULL};
        if (csd_model_forward(m, &b, out, &err)) fail_msg("batched step %d: %s", i, err.msg);
    }
    memcpy(logits_a, out, (size_t)vocab * sizeof *out);
    memcpy(logits_b, out + vocab, (size_t)vocab * sizeof *out);
    csd_free(out);
    csd_kv_destroy(kv[0]);
    csd_kv_destroy(kv[1]);
}

static void paths_agree(int n_kv_heads, int kv_dtype, int threads) {
    csd_model *m = load(n_kv_heads, kv_dtype, threads);
    int64_t vocab = csd_model_cfg(m)->vocab_size;
    size_t bytes = (size_t)vocab * sizeof(float);
    float *whole = csd_alloc(bytes), *stepped = csd_alloc(bytes), *other = csd_alloc(bytes);
    float *batched = csd_alloc(bytes), *batched_other = csd_alloc(bytes);
    assert_true(whole && stepped && other && batched && batched_other);
    prompt_whole(m, g_prompt, whole);
    prompt_by_token(m, g_prompt, stepped);
    prompt_whole(m, g_other, other);
    prompts_batched(m, batched, batched_other);
    if (memcmp(whole, stepped, bytes) != 0)
        fail_msg("kv heads %d, kv %s, %d threads: token by token differs from the whole prompt",
                 n_kv_heads, csd_dtype_name(kv_dtype), threads);
    if (memcmp(whole, batched, bytes) != 0 || memcmp(other, batched_other, bytes) != 0)
        fail_msg("kv heads %d, kv %s, %d threads: a batch of two sequences differs from each alone",
                 n_kv_heads, csd_dtype_name(kv_dtype), threads);
    csd_free(whole);
    csd_free(stepped);
    csd_free(other);
    csd_free(batched);
    csd_free(batched_other);
    csd_model_destroy(m);
}

static void all_caches(int n_kv_heads) {
    static const int kv_dtypes[] = {CSD_DTYPE_F32, CSD_DTYPE_F16, CSD_DTYPE_Q8};
    for (size_t i = 0; i < sizeof kv_dtypes / sizeof kv_dtypes[0]; i++) {
        paths_agree(n_kv_heads, kv_dtypes[i], 1);
        paths_agree(n_kv_heads, kv_dtypes[i], 3);
    }
}

static void test_one_kv_head(void **state) {
    (void)state;
    all_caches(1);
}

static void test_four_kv_heads(void **state) {
    (void)state;
    all_caches(4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_kv_head),
        cmocka_unit_test(test_four_kv_heads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
