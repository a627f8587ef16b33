/* test_synth: a tiny synthetic model on disk for the model tests, and a KV cache for a loaded one.
 * Include after cmocka.h. */
#ifndef CSD_TEST_SYNTH_H
#define CSD_TEST_SYNTH_H

#include <stdlib.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "model/model.h"
#include "model/synth.h"

/* The synth "tiny" preset (llama, vocab 300) with n_heads query heads over n_kv_heads, f32
 * weights from seed, written to dir (created here). */
static inline void csd_test_write_tiny(const char *dir, int64_t n_heads, int64_t n_kv_heads,
                                       uint64_t seed) {
    const csd_synth_preset *p = csd_synth_preset_find("tiny");
    assert_non_null(p);
    csd_model_config cfg;
    csd_err err = {0};
    assert_int_equal(mkdir(dir, 0755), 0);
    if (csd_synth_config(&cfg, p, CSD_ARCH_LLAMA, 300, 1, 2, &err))
        fail_msg("synth config: %s", err.msg);
    cfg.n_heads = n_heads;
    cfg.n_kv_heads = n_kv_heads;
    if (csd_synth_write(&cfg, CSD_DTYPE_F32, seed, dir, &err)) fail_msg("synth: %s", err.msg);
}

/* The synth "tiny" preset (llama, vocab 300, f32 weights from seed 11) written to a new
 * temporary directory (tmpl, e.g. "/tmp/csd-x-XXXXXX", becomes its path) and loaded with max_ctx
 * positions and threads threads. The caller removes the directory. */
static inline csd_model *csd_test_load_tiny(char *tmpl, int64_t max_ctx, int threads) {
    assert_non_null(mkdtemp(tmpl));
    csd_err err = {0};
    csd_model_config cfg;
    if (csd_synth_config(&cfg, csd_synth_preset_find("tiny"), CSD_ARCH_LLAMA, 300, 1, 2, &err) ||
        csd_synth_write(&cfg, CSD_DTYPE_F32, 11, tmpl, &err))
        fail_msg("synth: %s", err.msg);
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    opts.n_threads = threads;
    opts.max_ctx = max_ctx;
    csd_model *m = NULL;
    if (csd_model_load_hf(&m, tmpl, &opts, &err)) fail_msg("load: %s", err.msg);
    return m;
}

/* A KV cache for m with the model's context; fails the test when it cannot be made. */
static inline csd_kv *csd_test_new_kv(csd_model *m) {
    csd_kv *kv = NULL;
    csd_err err = {0};
    if (csd_kv_create(&kv, m, 0, &err)) fail_msg("kv: %s", err.msg);
    return kv;
}

#endif
