/* Shards: a tiny synthesized model cut into 1..4 stages, each stage written to a shard and mapped
 * back, chained in-process (stage k's hidden states feed stage k+1), gives logits bit-identical to
 * the single-process model at every precision, for a prompt and several decode steps. Corrupted,
 * truncated and foreign files are refused with a message naming the file (and the tensor). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/build_info.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "kern/kern.h"
#include "format/manifest.h"
#include "model/export.h"
#include "model/model.h"
#include "model/shard_model.h"
#include "model/synth.h"
#include "test_util.h"

#define THREADS 2
#define N_PROMPT 7
#define N_DECODE 5

static char g_root[256];

static void make_model(const char *dir, int arch) {
    const csd_synth_preset *p = csd_synth_preset_find("tiny");
    assert_non_null(p);
    csd_model_config cfg;
    csd_err err = {0};
    assert_int_equal(mkdir(dir, 0755), 0);
    if (csd_synth_config(&cfg, p, arch, 300, 1, 2, &err)) fail_msg("synth config: %s", err.msg);
    if (csd_synth_write(&cfg, CSD_DTYPE_F32, 42 + (uint64_t)arch, dir, &err))
        fail_msg("synth: %s", err.msg);
}

static int setup(void **state) {
    (void)state;
    if (csd_test_make_tmpdir(g_root, sizeof g_root, "csd-shard")) return -1;
    char dir[512];
    static const int arches[] = {CSD_ARCH_LLAMA, CSD_ARCH_QWEN2, CSD_ARCH_QWEN3};
    for (size_t i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/model-%d", g_root, arches[i]);
        make_model(dir, arches[i]);
    }
    csd_kern_init();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return csd_test_remove_tree(g_root);
}

static void model_dir(char *out, size_t cap, int arch) {
    snprintf(out, cap, "%s/model-%d", g_root, arch);
}

static csd_model_opts opts_for(int precision, int64_t begin, int64_t end) {
    csd_model_opts o;
    csd_model_opts_default(&o);
    o.precision = precision;
    o.n_threads = THREADS;
    o.layer_begin = begin;
    o.layer_end = end;
    o.max_ctx = 64;
    o.max_batch = 16;
    return o;
}

/* Writes stage k of n (even split) of the model at precision to path. */
static void write_stage(int arch, int precision, int64_t begin, int64_t end, int k, int n,
                        const char *path) {
    char dir[512];
    model_dir(dir, sizeof dir, arch);
    csd_model_opts o = opts_for(precision, begin, end);
    csd_model *m = NULL;
    csd_err err = {0};
    if (csd_model_load_hf(&m, dir, &o, &err))
        fail_msg("load [%lld,%lld): %s", (long long)begin, (long long)end, err.msg);
    csd_model_shard_info info;
    if (csd_model_shard_write(m, path, (uint32_t)k, (uint32_t)n, NULL, NULL, &info, &err))
        fail_msg("write: %s", err.msg);
    assert_int_equal(info.hdr.layer_begin, begin);
    assert_int_equal(info.hdr.layer_end, end);
    assert_true(info.n_tensors > 0);
    csd_model_shard_info_fini(&info);
    csd_model_destroy(m);
}

static int32_t argmax(const float *x, int64_t n) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

/* KiB of path's mappings resident in this process (/proc/self/smaps), or -1 without procfs. */
static long mapped_resident_kib(const char *path) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[1024];
    bool in_path = false;
    long kib = 0;
    size_t plen = strlen(path);
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\n");
        line[n] = 0;
        if (strchr(line, '-') &&
            strchr(line, '-') < strchr(line, ' ')) { /* a mapping's first line */
            in_path = n >= plen && strcmp(line + n - plen, path) == 0;
        } else if (in_path && strncmp(line, "Rss:", 4) == 0) {
            kib += strtol(line + 4, NULL, 10);
        }
    }
    fclose(f);
    return kib;
}

/* An opened shard keeps one copy of its weights: the mapped file's pages were let go. */
static void expect_file_not_resident(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size >=
                32 << 10); /* a resident copy would show well above the 8 KiB allowed */
    long kib = mapped_resident_kib(path);
    if (kib < 0) {
        print_message("no /proc/self/smaps: resident file pages not checked\n");
        return;
    }
    if (kib > 8)
        fail_msg("%s: %ld KiB of the mapped file still resident after the copy", path, kib);
}

/* The shards at paths[0..n), mapped and chained: logits equal the whole model's at precision. */
static void chain_check(int arch, int precision, int n, char paths[][600]) {
    char dir[512];
    model_dir(dir, sizeof dir, arch);
    csd_err err = {0};
    csd_model_opts whole_opts = opts_for(precision, -1, -1);
    csd_model *whole = NULL;
    if (csd_model_load_hf(&whole, dir, &whole_opts, &err)) fail_msg("load: %s", err.msg);
    const csd_model_config *c = csd_model_cfg(whole);
    int64_t dim = c->dim, vocab = c->vocab_size;

    csd_model_shard *shards[4] = {0};
    csd_model *stages[4] = {0};
    csd_kv *kvs[4] = {0};
    for (int k = 0; k < n; k++) {
        if (csd_model_shard_open(&shards[k], paths[k], &err))
            fail_msg("open %s: %s", paths[k], err.msg);
        expect_file_not_resident(paths[k]);
        assert_true(csd_model_config_equal(&shards[k]->cfg, c));
        assert_int_equal(shards[k]->weights.has_embed, k == 0);
        assert_int_equal(shards[k]->weights.has_head, k == n - 1);
        csd_model_opts so = opts_for(-1, -1, -1);
        if (csd_model_create(&stages[k], &shards[k]->cfg, &shards[k]->weights, &so, &err))
            fail_msg("create stage %d: %s", k, err.msg);
        assert_int_equal(csd_model_precision(stages[k]), precision);
        assert_int_equal(csd_kv_create(&kvs[k], stages[k], 0, &err), 0);
    }
    csd_kv *whole_kv = NULL;
    assert_int_equal(csd_kv_create(&whole_kv, whole, 0, &err), 0);

    float *want = csd_alloc_array((size_t)vocab, sizeof(float));
    float *got = csd_alloc_array((size_t)vocab, sizeof(float));
    float *h_in = csd_alloc_array((size_t)(N_PROMPT * dim), sizeof(float));
    float *h_out = csd_alloc_array((size_t)(N_PROMPT * dim), sizeof(float));
    assert_true(want && got && h_in && h_out);
    int32_t ids[N_PROMPT + N_DECODE] = {1, 17, 250, 3, 99, 42, 299};
    int64_t pos = 0, count = N_PROMPT;
    for (int step = 0; step <= N_DECODE; step++) {
        const int32_t *step_ids = ids + pos;
        assert_int_equal(csd_model_forward_seq(whole, whole_kv, step_ids, NULL, count, want, &err),
                         0);
        for (int k = 0; k < n; k++) {
            float *dst = k == n - 1 ? got : h_out;
            if (csd_model_forward_seq(stages[k], kvs[k], k == 0 ? step_ids : NULL,
                                      k == 0 ? NULL : h_in, count, dst, &err))
                fail_msg("stage %d step %d: %s", k, step, err.msg);
            if (k < n - 1) memcpy(h_in, h_out, (size_t)(count * dim) * sizeof(float));
        }
        if (memcmp(want, got, (size_t)vocab * sizeof(float)) != 0) {
            int64_t i = 0;
            while (want[i] == got[i]) i++;
            fail_msg("%s %s, %d stages, step %d: logit %lld differs: %.9g vs %.9g",
                     csd_arch_get(arch)->model_type, csd_dtype_name(precision), n, step,
                     (long long)i, (double)got[i], (double)want[i]);
        }
        pos += count;
        if (step < N_DECODE) ids[pos] = argmax(want, vocab);
        count = 1;
    }
    csd_free(want);
    csd_free(got);
    csd_free(h_in);
    csd_free(h_out);
    csd_kv_destroy(whole_kv);
    csd_model_destroy(whole);
    for (int k = 0; k < n; k++) {
        csd_kv_destroy(kvs[k]);
        csd_model_destroy(stages[k]);
        csd_model_shard_close(shards[k]);
    }
}

/* The model split evenly into n stages, each written by csd_model_shard_write, then chained. */
static void chain_matches(int arch, int precision, int n) {
    char paths[4][600];
    int64_t L = 4; /* the tiny preset */
    for (int k = 0; k < n; k++) {
        snprintf(paths[k], sizeof paths[k], "%s/a%d-p%d-n%d-s%d.shard", g_root, arch, precision, n,
                 k);
        write_stage(arch, precision, L * k / n, L * (k + 1) / n, k, n, paths[k]);
    }
    chain_check(arch, precision, n, paths);
}

static void chain_all_splits(int arch, int precision) {
    for (int n = 1; n <= 4; n++) chain_matches(arch, precision, n);
}

static void test_chain_llama_f32(void **s) {
    (void)s;
    chain_all_splits(CSD_ARCH_LLAMA, CSD_DTYPE_F32);
}
static void test_chain_llama_f16(void **s) {
    (void)s;
    chain_all_splits(CSD_ARCH_LLAMA, CSD_DTYPE_F16);
}
static void test_chain_llama_bf16(void **s) {
    (void)s;
    chain_all_splits(CSD_ARCH_LLAMA, CSD_DTYPE_BF16);
}
static void test_chain_llama_int8(void **s) {
    (void)s;
    chain_all_splits(CSD_ARCH_LLAMA, CSD_DTYPE_Q8);
}
static void test_chain_llama_int4(void **s) {
    (void)s;
    chain_all_splits(CSD_ARCH_LLAMA, CSD_DTYPE_Q4);
}
/* Tied embeddings (the last stage holds its own head copy), q/k/v biases, q/k norms. */
static void test_chain_qwen2_f32(void **s) {
    (void)s;
    chain_all_splits(CSD_ARCH_QWEN2, CSD_DTYPE_F32);
}
static void test_chain_qwen2_int4(void **s) {
    (void)s;
    chain_all_splits(CSD_ARCH_QWEN2, CSD_DTYPE_Q4);
}
static void test_chain_qwen3_int8(void **s) {
    (void)s;
    chain_all_splits(CSD_ARCH_QWEN3, CSD_DTYPE_Q8);
}

/* ---- corruption ---- */

/* A fresh 2-stage f32 llama stage 1 at path; returns its bytes (csd_free). */
static uint8_t *good_stage(const char *path, size_t *len) {
    write_stage(CSD_ARCH_LLAMA, CSD_DTYPE_F32, 2, 4, 1, 2, path);
    char *data = NULL;
    csd_err err = {0};
    if (csd_file_read_all(path, 64u << 20, &data, len, &err)) fail_msg("read: %s", err.msg);
    return (uint8_t *)data;
}

static void write_bytes(const char *path, const uint8_t *data, size_t len) {
    csd_err err = {0};
    if (csd_file_write_all(path, data, len, &err)) fail_msg("write: %s", err.msg);
}

/* Opening path fails with code and a message containing every one of the given fragments. */
static void expect_refused(const char *path, int code, const char *frag1, const char *frag2) {
    csd_model_shard *s = NULL;
    csd_err err = {0};
    int rc = csd_model_shard_open(&s, path, &err);
    assert_null(s);
    if (rc != code) fail_msg("%s: rc %d (%s), wanted %d", path, rc, err.msg, code);
    if (!strstr(err.msg, frag1) || (frag2 && !strstr(err.msg, frag2)))
        fail_msg("message '%s' lacks '%s'/'%s'", err.msg, frag1, frag2 ? frag2 : "");
}

static void test_flipped_tensor_byte_names_file_and_tensor(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/flip.shard", g_root);
    size_t len;
    uint8_t *bytes = good_stage(path, &len);
    csd_shard *f = NULL;
    csd_err err = {0};
    assert_int_equal(csd_shard_open(&f, path, &err), 0);
    const csd_shard_tensor *t = csd_shard_find(f, "model.layers.3.mlp.up_proj.weight");
    assert_non_null(t);
    size_t at = (size_t)t->offset + t->nbytes / 2;
    csd_shard_close(f);
    bytes[at] ^= 0x10;
    write_bytes(path, bytes, len);
    expect_refused(path, CSD_EFORMAT, path, "'model.layers.3.mlp.up_proj.weight' is corrupted");
    csd_free(bytes);
}

static void test_truncated(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/trunc.shard", g_root);
    size_t len;
    uint8_t *bytes = good_stage(path, &len);
    static const size_t cuts[] = {0, 7, 100, 191, 192, 300};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_bytes(path, bytes, cuts[i]);
        expect_refused(path, CSD_EFORMAT, path, "truncated");
    }
    write_bytes(path, bytes, len - 1);
    expect_refused(path, CSD_EFORMAT, path, "truncated");
    write_bytes(path, bytes, len / 2);
    expect_refused(path, CSD_EFORMAT, path, "truncated");
    csd_free(bytes);
}

static void test_wrong_magic_version_layout(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/magic.shard", g_root);
    size_t len;
    uint8_t *bytes = good_stage(path, &len);
    uint8_t *copy = csd_alloc(len);
    memcpy(copy, bytes, len);
    copy[0] = 'X';
    write_bytes(path, copy, len);
    expect_refused(path, CSD_EFORMAT, path, "bad magic");
    memcpy(copy, bytes, len);
    copy[8] = 2; /* version */
    write_bytes(path, copy, len);
    expect_refused(path, CSD_EFORMAT, path, "format version 2");
    memcpy(copy, bytes, len);
    copy[44] = 9; /* kernel layout */
    write_bytes(path, copy, len);
    expect_refused(path, CSD_EFORMAT, path, "kernel layout 9");
    memcpy(copy, bytes, len);
    copy[200] ^= 1; /* inside the embedded config JSON */
    write_bytes(path, copy, len);
    expect_refused(path, CSD_EFORMAT, path, "header checksum");
    memcpy(copy, bytes, len);
    write_bytes(path, copy, len); /* and the pristine copy still opens */
    csd_model_shard *s = NULL;
    csd_err err = {0};
    assert_int_equal(csd_model_shard_open(&s, path, &err), 0);
    csd_model_shard_close(s);
    csd_free(copy);
    csd_free(bytes);
}

/* Valid containers whose tensors do not match the stage: missing, extra, wrong dtype. */
static void test_table_mismatch(void **state) {
    (void)state;
    char good[600], bad[600];
    snprintf(good, sizeof good, "%s/good.shard", g_root);
    snprintf(bad, sizeof bad, "%s/bad.shard", g_root);
    size_t len;
    csd_free(good_stage(good, &len));
    csd_shard *f = NULL;
    csd_err err = {0};
    assert_int_equal(csd_shard_open(&f, good, &err), 0);
    int n = csd_shard_count(f);
    csd_shard_tensor *t = csd_alloc_array((size_t)n + 1, sizeof *t);
    size_t json_len;
    const char *json = csd_shard_config_json(f, &json_len);
    csd_shard_header hdr = *csd_shard_hdr(f);
    /* Missing: drop the last entry. */
    for (int i = 0; i < n; i++) t[i] = *csd_shard_at(f, i);
    char dropped[CSD_SHARD_NAME_BYTES];
    memcpy(dropped, t[n - 1].name, sizeof dropped);
    assert_int_equal(csd_shard_write(bad, &hdr, json, json_len, t, n - 1, NULL, NULL, &err), 0);
    expect_refused(bad, CSD_EFORMAT, bad, dropped);
    /* Extra: a tensor no stage defines. */
    for (int i = 0; i < n; i++) t[i] = *csd_shard_at(f, i);
    t[n] = t[0];
    snprintf(t[n].name, sizeof t[n].name, "model.layers.0.mlp.up_proj.weight");
    assert_int_equal(csd_shard_write(bad, &hdr, json, json_len, t, n + 1, NULL, NULL, &err), 0);
    expect_refused(bad, CSD_EFORMAT, bad, "unexpected tensor 'model.layers.0.mlp.up_proj.weight'");
    /* Wrong dtype for the precision the header states. */
    hdr.precision = CSD_DTYPE_F16;
    for (int i = 0; i < n; i++) t[i] = *csd_shard_at(f, i);
    assert_int_equal(csd_shard_write(bad, &hdr, json, json_len, t, n, NULL, NULL, &err), 0);
    expect_refused(bad, CSD_EFORMAT, bad, "expected f16");
    csd_free(t);
    csd_shard_close(f);
    /* A missing file is an I/O error naming it. */
    snprintf(bad, sizeof bad, "%s/absent.shard", g_root);
    expect_refused(bad, CSD_EIO, bad, NULL);
}

/* ---- export and manifest ---- */

/* Exports the llama model into n even stages at precision to out (under g_root). */
static csd_manifest *export_to(const char *name, int precision, int n) {
    char dir[512], out[600];
    model_dir(dir, sizeof dir, CSD_ARCH_LLAMA);
    snprintf(out, sizeof out, "%s/%s", g_root, name);
    csd_model_config cfg;
    csd_err err = {0};
    assert_int_equal(csd_model_config_load(&cfg, dir, &err), 0);
    csd_plan_opts po;
    csd_plan_opts_default(&po);
    po.precision = precision;
    po.ctx = 64;
    csd_plan plan;
    if (csd_plan_even(&plan, &cfg, &po, n, &err)) fail_msg("plan: %s", err.msg);
    csd_export_opts eo = {dir, out, precision, -1, 64, 1};
    csd_manifest *man = NULL;
    if (csd_export_run(&eo, &plan, NULL, NULL, &man, &err)) fail_msg("export: %s", err.msg);
    return man;
}

static void test_export_manifest_and_chain(void **state) {
    (void)state;
    csd_manifest *man = export_to("exp3", CSD_DTYPE_Q8, 3);
    assert_int_equal(man->n_stages, 3);
    assert_int_equal(man->precision, CSD_DTYPE_Q8);
    assert_int_equal(man->n_files, 1); /* config.json: the synthesized model has no tokenizer */
    assert_string_equal(man->files[0], "config.json");
    csd_err err = {0};
    if (csd_manifest_validate(man, true, &err)) fail_msg("validate: %s", err.msg);
    char paths[4][600];
    for (int k = 0; k < 3; k++) {
        snprintf(paths[k], sizeof paths[k], "%s/%s", man->dir, man->stages[k].file);
        csd_shard *f = NULL;
        assert_int_equal(csd_shard_open(&f, paths[k], &err), 0);
        assert_memory_equal(csd_shard_hdr(f)->model_hash, man->model_hash, CSD_SHARD_HASH_BYTES);
        assert_true(csd_shard_hdr(f)->header_checksum == man->stages[k].checksum);
        assert_true(man->stages[k].memory_bytes > man->stages[k].weight_bytes);
        csd_shard_close(f);
    }
    chain_check(CSD_ARCH_LLAMA, CSD_DTYPE_Q8, 3, paths);
    /* The same export again gives the same hash; another precision or split does not. */
    csd_manifest *again = export_to("exp3b", CSD_DTYPE_Q8, 3);
    csd_manifest *f16 = export_to("exp3c", CSD_DTYPE_F16, 3);
    csd_manifest *two = export_to("exp2", CSD_DTYPE_Q8, 2);
    assert_memory_equal(again->model_hash, man->model_hash, CSD_SHARD_HASH_BYTES);
    assert_memory_not_equal(f16->model_hash, man->model_hash, CSD_SHARD_HASH_BYTES);
    assert_memory_not_equal(two->model_hash, man->model_hash, CSD_SHARD_HASH_BYTES);
    csd_manifest_destroy(again);
    csd_manifest_destroy(f16);
    csd_manifest_destroy(two);
    csd_manifest_destroy(man);
}

static void expect_invalid(const char *dir, int code, const char *frag) {
    csd_manifest *m = NULL;
    csd_err err = {0};
    int rc = csd_manifest_load(&m, dir, &err);
    if (!rc) rc = csd_manifest_validate(m, true, &err);
    csd_manifest_destroy(m);
    if (rc != code) fail_msg("%s: rc %d (%s), wanted %d", dir, rc, err.msg, code);
    if (!strstr(err.msg, frag)) fail_msg("message '%s' lacks '%s'", err.msg, frag);
}

static void run(const char *fmt, const char *a, const char *b) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    assert_int_equal(system(cmd), 0);
}

/* dst becomes a fresh copy of src. */
static void reset(const char *dst, const char *src) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
    assert_int_equal(system(cmd), 0);
}

static void test_manifest_detects_tampering(void **state) {
    (void)state;
    csd_manifest_destroy(export_to("t1", CSD_DTYPE_F32, 2));
    csd_manifest_destroy(export_to("t2", CSD_DTYPE_F32, 3));
    char d1[600], d2[600], d3[600], path[700];
    snprintf(d1, sizeof d1, "%s/t1", g_root);
    snprintf(d2, sizeof d2, "%s/t2", g_root);
    snprintf(d3, sizeof d3, "%s/t3", g_root);
    /* A shard from another export (same layer range and precision, other split) is caught. */
    run("cp -r '%s' '%s'", d1, d3);
    run("cp '%s/stage-0.shard' '%s/stage-0.shard'", d2, d3);
    expect_invalid(d3, CSD_EMISMATCH, "stage-0.shard");
    /* A missing shard, a missing tokenizer/config file. */
    reset(d3, d1);
    snprintf(path, sizeof path, "%s/stage-1.shard", d3);
    assert_int_equal(unlink(path), 0);
    expect_invalid(d3, CSD_ENOTFOUND, "stage-1.shard");
    reset(d3, d1);
    snprintf(path, sizeof path, "%s/config.json", d3);
    assert_int_equal(unlink(path), 0);
    expect_invalid(d3, CSD_ENOTFOUND, "config.json");
    /* A truncated shard: the size no longer matches. */
    reset(d3, d1);
    run("truncate -s -1 '%s/stage-1.shard'%s", d3, "");
    expect_invalid(d3, CSD_EMISMATCH, "stage-1.shard");
    /* A flipped tensor byte: found by the deep check, naming file and tensor. */
    reset(d3, d1);
    run("printf '\\377' | dd of='%s/stage-1.shard' bs=1 seek=40000 conv=notrunc status=none%s", d3,
        "");
    expect_invalid(d3, CSD_EFORMAT, "is corrupted");
    /* Edited manifest fields: the hash, a layer range, the version. */
    reset(d3, d1);
    run("sed -i 's/\"model_hash\": \"./\"model_hash\": \"0/' '%s/manifest.json'%s", d3, "");
    expect_invalid(d3, CSD_EMISMATCH, "model hash");
    /* A stage checksum that is 16 characters but not 16 hex digits. */
    static const char *const not_hex[] = {"0x", " 0", "+0", "-0", "0g"};
    for (size_t i = 0; i < sizeof not_hex / sizeof not_hex[0]; i++) {
        reset(d3, d1);
        run("sed -i '0,/\"checksum\": \"../s//\"checksum\": \"%s/' '%s/manifest.json'", not_hex[i],
            d3);
        expect_invalid(d3, CSD_EFORMAT, "\"checksum\" must be 16 hex digits");
    }
    reset(d3, d1);
    run("sed -i 's/\"layer_end\": 2/\"layer_end\": 3/' '%s/manifest.json'%s", d3, "");
    expect_invalid(d3, CSD_EFORMAT, "do not continue");
    reset(d3, d1);
    run("sed -i 's/\"version\": 1/\"version\": 7/' '%s/manifest.json'%s", d3, "");
    expect_invalid(d3, CSD_EFORMAT, "manifest version 7");
    reset(d3, d1);
    run("sed -i 's/\"file\": \"stage-1.shard\"/\"file\": \"..\\/x\"/' '%s/manifest.json'%s", d3,
        "");
    expect_invalid(d3, CSD_EFORMAT, "not a plain file name");
    /* And the untouched export still validates, as a directory and as a file path. */
    expect_invalid(d1, 0, "");
    snprintf(path, sizeof path, "%s/manifest.json", d1);
    expect_invalid(path, 0, "");
}

/* "exported_by" names the build that wrote the manifest. A manifest without it (written before
 * the field) still loads; a value that is not short printable text is refused. */
static void test_manifest_exported_by(void **state) {
    (void)state;
    csd_manifest_destroy(export_to("eb1", CSD_DTYPE_F32, 2));
    char d1[600], d2[600];
    snprintf(d1, sizeof d1, "%s/eb1", g_root);
    snprintf(d2, sizeof d2, "%s/eb2", g_root);
    csd_manifest *m = NULL;
    csd_err err = {0};
    if (csd_manifest_load(&m, d1, &err)) fail_msg("load: %s", err.msg);
    assert_string_equal(m->exported_by, csd_build_fingerprint());
    csd_manifest_destroy(m);
    reset(d2, d1);
    run("sed -i '/\"exported_by\"/d' '%s/manifest.json'%s", d2, "");
    if (csd_manifest_load(&m, d2, &err)) fail_msg("load without exported_by: %s", err.msg);
    assert_string_equal(m->exported_by, "");
    csd_manifest_destroy(m);
    expect_invalid(d2, 0, "");
    static const char *const bad[] = {
        "\"a b\"", "\"\"", "17", "null",
        "\"0123456789012345678901234567890123456789012345678901234567890123\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        reset(d2, d1);
        run("sed -i 's/\"exported_by\": \"[^\"]*\"/\"exported_by\": %s/' '%s/manifest.json'",
            bad[i], d2);
        expect_invalid(d2, CSD_EFORMAT, "\"exported_by\" must be");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_llama_f32),
        cmocka_unit_test(test_chain_llama_f16),
        cmocka_unit_test(test_chain_llama_bf16),
        cmocka_unit_test(test_chain_llama_int8),
        cmocka_unit_test(test_chain_llama_int4),
        cmocka_unit_test(test_chain_qwen2_f32),
        cmocka_unit_test(test_chain_qwen2_int4),
        cmocka_unit_test(test_chain_qwen3_int8),
        cmocka_unit_test(test_flipped_tensor_byte_names_file_and_tensor),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_wrong_magic_version_layout),
        cmocka_unit_test(test_table_mismatch),
        cmocka_unit_test(test_export_manifest_and_chain),
        cmocka_unit_test(test_manifest_detects_tampering),
        cmocka_unit_test(test_manifest_exported_by),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
