/* The one-token step as one pool job (src/model/decode_step.c) against the general path: the same
 * prompt, then the same decode steps, must give bit-identical logits at every step, for Q4 and Q8
 * layers, KV heads split evenly, unevenly and not at all (one KV head: one thread owns none), a
 * ragged last hidden group, a hidden size under one group (a thread owns none of it), and every
 * KV cache type. The steps allocate nothing. The choice
 * between the paths follows the step times it is given. */
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
#include "model/decode_step.h"
#include "model/synth.h"
#include "test_synth.h"
#include "test_util.h"

#define N_PROMPT 7
#define N_STEPS 12
#define THREADS 2

static char g_root[256];
static const int32_t g_prompt[N_PROMPT] = {1, 17, 203, 5, 88, 140, 9};

/* The tiny preset (head size 16, hidden 176: one whole group of 128 and a ragged one) with 12
 * query heads over n_kv_heads. */
static void make_model(const char *dir, int64_t n_kv_heads) {
    csd_test_write_tiny(dir, 12, n_kv_heads, 11 + (uint64_t)n_kv_heads);
}

static const int64_t g_kv_heads[] = {1, 3, 4};

/* The tiny preset with a hidden size of 40: one short group, so with 2 threads one owns none of
 * the gate and up rows. */
static void make_narrow(const char *dir) {
    csd_model_config cfg;
    csd_err err = {0};
    assert_int_equal(mkdir(dir, 0755), 0);
    if (csd_synth_config(&cfg, csd_synth_preset_find("tiny"), CSD_ARCH_LLAMA, 300, 1, 2, &err))
        fail_msg("synth config: %s", err.msg);
    cfg.n_heads = 12;
    cfg.n_kv_heads = 4;
    cfg.hidden_dim = 40;
    if (csd_synth_write(&cfg, CSD_DTYPE_F32, 5, dir, &err)) fail_msg("synth: %s", err.msg);
}

static int setup(void **state) {
    (void)state;
    if (csd_test_make_tmpdir(g_root, sizeof g_root, "csd-step")) return -1;
    char dir[512];
    for (size_t i = 0; i < sizeof g_kv_heads / sizeof g_kv_heads[0]; i++) {
        snprintf(dir, sizeof dir, "%s/kvh-%lld", g_root, (long long)g_kv_heads[i]);
        make_model(dir, g_kv_heads[i]);
    }
    snprintf(dir, sizeof dir, "%s/narrow", g_root);
    make_narrow(dir);
    csd_kern_init();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return csd_test_remove_tree(g_root);
}

/* The model g_root/name. */
static csd_model *load_named(const char *name, int precision, int kv_dtype, int decode_path) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_root, name);
    csd_model_opts o;
    csd_model_opts_default(&o);
    o.precision = precision;
    o.kv_dtype = kv_dtype;
    o.n_threads = THREADS;
    o.max_ctx = 32;
    o.decode_path = decode_path;
    csd_model *m = NULL;
    csd_err err = {0};
    if (csd_model_load_hf(&m, dir, &o, &err)) fail_msg("load: %s", err.msg);
    return m;
}

static const char *kv_heads_name(int64_t n_kv_heads) {
    static char name[32];
    snprintf(name, sizeof name, "kvh-%lld", (long long)n_kv_heads);
    return name;
}

static csd_model *load(int64_t n_kv_heads, int precision, int kv_dtype, int decode_path) {
    return load_named(kv_heads_name(n_kv_heads), precision, kv_dtype, decode_path);
}

/* The prompt in one forward, then N_STEPS one-token forwards; logits of every step. */
static void run_steps(csd_model *m, float *logits) {
    int64_t vocab = csd_model_cfg(m)->vocab_size;
    csd_kv *kv = NULL;
    csd_err err = {0};
    if (csd_kv_create(&kv, m, 0, &err)) fail_msg("kv: %s", err.msg);
    if (csd_model_forward_seq(m, kv, g_prompt, NULL, N_PROMPT, logits, &err))
        fail_msg("prompt: %s", err.msg);
    uint64_t allocs = csd_alloc_count();
    for (int s = 0; s < N_STEPS; s++) {
        int32_t id = (int32_t)((s * 37 + 5) % vocab);
        if (csd_model_forward_seq(m, kv, &id, NULL, 1, logits + s * vocab, &err))
            fail_msg("step %d: %s", s, err.msg);
    }
    assert_int_equal(csd_alloc_count(), allocs);
    csd_kv_destroy(kv);
}

static void paths_agree_named(const char *name, int precision, int kv_dtype) {
    csd_model *step = load_named(name, precision, kv_dtype, CSD_DECODE_ONE_JOB);
    csd_model *general = load_named(name, precision, kv_dtype, CSD_DECODE_GENERAL);
    assert_non_null(step->decode); /* the path under test is taken */
    assert_null(general->decode);
    size_t n = (size_t)N_STEPS * (size_t)csd_model_cfg(step)->vocab_size;
    float *a = csd_alloc_array(n, sizeof(float)), *b = csd_alloc_array(n, sizeof(float));
    assert_true(a && b);
    run_steps(step, a);
    run_steps(general, b);
    assert_int_equal(csd_decode_step_taken(step), N_STEPS); /* the path under test ran */
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s, %s layers, %s cache: logit %zu of step %zu is %.9g, the "
                     "general path's %.9g",
                     name, csd_dtype_name(precision), csd_dtype_name(kv_dtype),
                     i % (n / N_STEPS), i / (n / N_STEPS), (double)a[i], (double)b[i]);
    csd_free(a);
    csd_free(b);
    csd_model_destroy(step);
    csd_model_destroy(general);
}

static void paths_agree(int64_t n_kv_heads, int precision, int kv_dtype) {
    paths_agree_named(kv_heads_name(n_kv_heads), precision, kv_dtype);
}

static bool enough_cores(void) {
    if (csd_cpu_count() >= THREADS) return true;
    printf("skipped: the one-job step needs %d cores, this machine has %d\n", THREADS,
           csd_cpu_count());
    return false;
}

static void test_q4_layers(void **state) {
    (void)state;
    if (!enough_cores()) return;
    for (size_t i = 0; i < sizeof g_kv_heads / sizeof g_kv_heads[0]; i++)
        paths_agree(g_kv_heads[i], CSD_DTYPE_Q4, CSD_DTYPE_F16);
}

static void test_q8_layers(void **state) {
    (void)state;
    if (!enough_cores()) return;
    for (size_t i = 0; i < sizeof g_kv_heads / sizeof g_kv_heads[0]; i++)
        paths_agree(g_kv_heads[i], CSD_DTYPE_Q8, CSD_DTYPE_F16);
}

static void test_every_cache_type(void **state) {
    (void)state;
    if (!enough_cores()) return;
    paths_agree(3, CSD_DTYPE_Q4, CSD_DTYPE_F32);
    paths_agree(3, CSD_DTYPE_Q4, CSD_DTYPE_Q8);
}

static void test_hidden_under_one_group(void **state) {
    (void)state;
    if (!enough_cores()) return;
    paths_agree_named("narrow", CSD_DTYPE_Q4, CSD_DTYPE_F16);
    paths_agree_named("narrow", CSD_DTYPE_Q8, CSD_DTYPE_F16);
}

/* Float layers, one thread: the general path does every step. */
static void test_path_not_taken(void **state) {
    (void)state;
    csd_model *f32 = load(3, CSD_DTYPE_F32, CSD_DTYPE_F32, CSD_DECODE_ONE_JOB);
    assert_null(f32->decode);
    csd_model_destroy(f32);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/kvh-3", g_root);
    csd_model_opts o;
    csd_model_opts_default(&o);
    o.precision = CSD_DTYPE_Q4;
    o.n_threads = 1;
    csd_model *one = NULL;
    csd_err err = {0};
    if (csd_model_load_hf(&one, dir, &o, &err)) fail_msg("load: %s", err.msg);
    assert_null(one->decode);
    csd_model_destroy(one);
}

/* The measured choice (CSD_DECODE_AUTO), fed step times: the trial alternates the paths for 32
 * steps, the lower median wins the rest of the 512-step epoch, and a one-job step over twice the
 * general step before it ends the trial at once. */
static int feed(csd_model *m, int64_t steps, uint64_t general_ns, uint64_t one_job_ns) {
    csd_batch b = {1, NULL, NULL, NULL, NULL};
    int last = -1;
    for (int64_t i = 0; i < steps; i++) {
        last = csd_decode_step_choose(m, &b);
        csd_decode_step_timed(m, last, last ? one_job_ns : general_ns);
    }
    return last;
}

static void test_measured_choice(void **state) {
    (void)state;
    if (!enough_cores()) return;
    csd_model *m = load(3, CSD_DTYPE_Q4, CSD_DTYPE_F16, CSD_DECODE_AUTO);
    assert_non_null(m->decode);
    csd_batch b = {1, NULL, NULL, NULL, NULL};
    /* The one job faster: the trial's 16 one-job steps, then every step of the epoch. */
    feed(m, 32, 100, 90);
    assert_int_equal(csd_decode_step_taken(m), 16);
    assert_int_equal(feed(m, 480, 100, 90), 1);
    assert_int_equal(csd_decode_step_taken(m), 16 + 480);
    /* A new epoch, and now the general path is faster (but within 2x): it wins the epoch. */
    assert_int_equal(csd_decode_step_choose(m, &b), 0);
    feed(m, 32, 100, 150);
    assert_int_equal(csd_decode_step_taken(m), 16 + 480 + 16);
    assert_int_equal(feed(m, 480, 100, 150), 0);
    assert_int_equal(csd_decode_step_taken(m), 16 + 480 + 16);
    /* A one-job step 3x the general one: the trial stops after it, the epoch goes general. */
    feed(m, 2, 100, 300);
    assert_int_equal(csd_decode_step_taken(m), 16 + 480 + 16 + 1);
    assert_int_equal(feed(m, 480, 100, 300), 0);
    assert_int_equal(csd_decode_step_taken(m), 16 + 480 + 16 + 1);
    assert_int_equal(csd_decode_step_choose(m, &b), 0); /* the next epoch's trial */
    feed(m, 1, 100, 300);
    assert_int_equal(csd_decode_step_choose(m, &b), 1);
    csd_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4_layers),
        cmocka_unit_test(test_q8_layers),
        cmocka_unit_test(test_every_cache_type),
        cmocka_unit_test(test_hidden_under_one_group),
        cmocka_unit_test(test_measured_choice),
        cmocka_unit_test(test_path_not_taken),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
