/* The shard container on its own (no model): write -> parse round trip, every header and table
 * field refused when out of range (each with a message naming the file), checksums, the in-place
 * model-hash patch and the model hash's sensitivity. Set CSD_SHARD_SEED_DIR to also write the small
 * shard built here as a fuzzing seed (fuzz/fuzz_format_shard.c). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "format/shard.h"

static const char config_json[] =
    "{\"model_type\":\"llama\",\"hidden_size\":8,\"intermediate_size\":16,\"num_hidden_layers\":3,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"vocab_size\":5,\"max_position_"
    "embeddings\":32,"
    "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"bos_token_id\":1,\"eos_token_id\":2}";

static char g_path[256];
static uint8_t *g_buf; /* the pristine file */
static size_t g_len;

static float vec[8];
static uint16_t mat[3 * 5];

static void make_tensors(csd_shard_tensor *t) {
    memset(t, 0, 2 * sizeof *t);
    for (int i = 0; i < 8; i++) vec[i] = 0.5f * (float)i - 1.0f;
    for (int i = 0; i < 15; i++) mat[i] = csd_f32_to_f16((float)i / 7.0f);
    snprintf(t[0].name, sizeof t[0].name, "model.layers.1.input_layernorm.weight");
    t[0].dtype = CSD_DTYPE_F32;
    t[0].rows = 1;
    t[0].cols = 8;
    t[0].data = vec;
    t[0].nbytes = sizeof vec;
    snprintf(t[1].name, sizeof t[1].name, "model.layers.1.mlp.up_proj.weight");
    t[1].dtype = CSD_DTYPE_F16;
    t[1].rows = 3;
    t[1].cols = 5;
    t[1].data = mat;
    t[1].nbytes = sizeof mat;
}

static csd_shard_header make_header(void) {
    csd_shard_header h;
    memset(&h, 0, sizeof h);
    h.stage_index = 1;
    h.stage_count = 3;
    h.layer_begin = 1;
    h.layer_end = 2;
    h.n_layers = 3;
    h.precision = CSD_DTYPE_F16;
    for (int i = 0; i < CSD_SHARD_HASH_BYTES; i++) h.model_hash[i] = (uint8_t)(i * 7);
    return h;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "%s/csd-fmt-shard-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    int fd = mkstemp(g_path);
    if (fd < 0) return -1;
    close(fd);
    csd_shard_tensor t[2];
    make_tensors(t);
    csd_shard_header h = make_header();
    csd_err err = {0};
    if (csd_shard_write(g_path, &h, config_json, strlen(config_json), t, 2, NULL, NULL, &err)) {
        fprintf(stderr, "write: %s\n", err.msg);
        return -1;
    }
    char *data = NULL;
    if (csd_file_read_all(g_path, 1 << 20, &data, &g_len, &err)) return -1;
    g_buf = (uint8_t *)data;
    const char *seed_dir = getenv("CSD_SHARD_SEED_DIR");
    if (seed_dir) {
        char seed[512];
        snprintf(seed, sizeof seed, "%s/minimal.shard", seed_dir);
        if (csd_file_write_all(seed, g_buf, g_len, &err)) return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    csd_free(g_buf);
    unlink(g_path);
    return 0;
}

static void test_round_trip(void **state) {
    (void)state;
    csd_shard *s = NULL;
    csd_err err = {0};
    if (csd_shard_open(&s, g_path, &err)) fail_msg("%s", err.msg);
    const csd_shard_header *h = csd_shard_hdr(s);
    assert_int_equal(h->version, CSD_SHARD_VERSION);
    assert_int_equal(h->stage_index, 1);
    assert_int_equal(h->stage_count, 3);
    assert_int_equal(h->layer_begin, 1);
    assert_int_equal(h->layer_end, 2);
    assert_false(h->has_embed);
    assert_false(h->has_head);
    assert_int_equal(h->precision, CSD_DTYPE_F16);
    assert_int_equal(h->kernel_layout, CSD_SHARD_KERNEL_LAYOUT);
    assert_int_equal(h->model_hash[5], 35);
    assert_int_equal(h->file_bytes, g_len);
    assert_int_equal(csd_shard_config(s)->dim, 8);
    size_t len;
    const char *json = csd_shard_config_json(s, &len);
    assert_int_equal(len, strlen(config_json));
    assert_memory_equal(json, config_json, len);
    assert_int_equal(csd_shard_count(s), 2);
    const csd_shard_tensor *v = csd_shard_find(s, "model.layers.1.input_layernorm.weight");
    const csd_shard_tensor *m = csd_shard_find(s, "model.layers.1.mlp.up_proj.weight");
    assert_non_null(v);
    assert_non_null(m);
    assert_null(csd_shard_find(s, "model.layers.1.mlp.up_proj"));
    assert_int_equal(v->offset % CSD_SHARD_ALIGN, 0);
    assert_int_equal(m->offset % CSD_SHARD_ALIGN, 0);
    assert_int_equal((uintptr_t)v->data % CSD_SHARD_ALIGN,
                     0); /* page-aligned map + aligned offset */
    assert_memory_equal(v->data, vec, sizeof vec);
    assert_memory_equal(m->data, mat, sizeof mat);
    assert_int_equal(m->rows, 3);
    assert_int_equal(m->cols, 5);
    assert_int_equal(m->dtype, CSD_DTYPE_F16);
    csd_shard_close(s);
}

/* Parsing a copy of the file with bytes [at, at + n) replaced by val fails with a message naming
 * the label and containing frag. flags 0: the structural checks alone (the checksum would catch
 * any edit first). */
static void expect_bad(size_t at, const void *val, size_t n, unsigned flags, const char *frag) {
    uint8_t *copy = csd_alloc(g_len);
    memcpy(copy, g_buf, g_len);
    memcpy(copy + at, val, n);
    csd_shard *s = NULL;
    csd_err err = {0};
    int rc = csd_shard_parse(&s, copy, g_len, "probe.shard", flags, &err);
    csd_shard_close(s);
    csd_free(copy);
    if (rc != CSD_EFORMAT) fail_msg("edit at %zu: rc %d (%s)", at, rc, err.msg);
    if (!strstr(err.msg, "probe.shard") || !strstr(err.msg, frag))
        fail_msg("edit at %zu: message '%s' lacks '%s'", at, err.msg, frag);
}

static void put32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(size_t at) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | g_buf[at + (size_t)i];
    return v;
}

static void bad32(size_t at, uint32_t v, const char *frag) {
    uint8_t b[4];
    put32(b, v);
    expect_bad(at, b, 4, 0, frag);
}

static void bad64(size_t at, uint64_t v, const char *frag) {
    uint8_t b[8];
    put64(b, v);
    expect_bad(at, b, 8, 0, frag);
}

static void test_header_fields_refused(void **state) {
    (void)state;
    expect_bad(0, "CSDSHARX", 8, 0, "bad magic");
    bad32(8, 2, "format version 2");
    bad32(12, 128, "header size 128");
    bad32(16, 3, "stage 3 of 3");
    bad32(20, 0, "stage 1 of 0");
    bad32(20, 5000, "at most");
    bad32(24, 2, "layer range [2, 2)");
    bad32(28, 4, "layer range [1, 4) of 3");
    bad32(32, 0, "of 0 layers");
    bad32(32, 2, "disagree with layers [1, 2) of 2"); /* layer_end == n_layers but no head flag */
    bad32(36, 4, "unknown header flags");
    bad32(36, 1, "embeddings/head flags");
    bad32(40, 9, "unknown precision 9");
    bad32(44, 0, "kernel layout 0");
    uint8_t one = 1;
    expect_bad(150, &one, 1, 0, "reserved header byte 150");
    bad64(80, 256, "sections out of order"); /* config offset */
    bad64(88, 1, "sections out of order");   /* config bytes */
    bad64(88, 1u << 30, "sections out of order");
    bad64(96, get64(96) + 1, "sections out of order"); /* table offset misaligned */
    bad64(96, 1ull << 40, "sections out of order");
    bad32(104, 100000, "at most"); /* tensor count */
    bad32(104, 1000, "sections out of order");
    bad32(108, 64, "64 bytes"); /* entry size */
    bad64(112, get64(112) + 64, "sections out of order");
    bad64(120, get64(120) - 1, "sections out of order");
    bad64(128, get64(128) + 1, "truncated");
    bad64(128, get64(128) - 1, "trailing bytes");
    bad32(32, 4, "header says 4 layers, embedded config 3");
    uint8_t zero = 0;
    expect_bad(136, &zero, 1, CSD_SHARD_VERIFY_HEADER, "header checksum mismatch");
    expect_bad(200, "x", 1, 0, "embedded config");
}

static void test_table_fields_refused(void **state) {
    (void)state;
    size_t table = (size_t)get64(96), e0 = table, e1 = table + CSD_SHARD_ENTRY_BYTES;
    uint8_t name[CSD_SHARD_NAME_BYTES];
    memset(name, 'a', sizeof name);
    expect_bad(e0, name, sizeof name, 0, "not NUL-terminated");
    expect_bad(e0, "\0", 1, 0, "name empty");
    expect_bad(e0 + 3, "\n", 1, 0, "non-printable");
    expect_bad(e0 + 70, "z", 1, 0, "not NUL-padded");
    memcpy(name, g_buf + e0, sizeof name);
    expect_bad(e1, name, sizeof name, 0, "appears twice");
    bad32(e0 + 80, 5, "unknown dtype 5");
    bad32(e0 + 84, 1, "unknown dtype");
    bad64(e0 + 88, 0, "shape [0, 8]");
    bad64(e0 + 96, 1ull << 40, "out of range");
    bad64(e0 + 104, get64(e0 + 104) + 4, "misaligned");
    bad64(e1 + 104, get64(e0 + 104), "overlap");
    bad64(e0 + 104, 0, "outside the data section");
    bad64(e1 + 104, 1ull << 62, "outside the data section");
    bad64(e1 + 112, get64(e1 + 112) + 1, "outside the data section");
    bad64(e1 + 112, UINT64_MAX, "outside the data section");
    /* A flipped data byte passes the structural checks and fails the tensor checksum. */
    size_t at = (size_t)get64(e1 + 104) + 3;
    uint8_t flipped = g_buf[at] ^ 0x40;
    expect_bad(at, &flipped, 1, CSD_SHARD_VERIFY_TENSORS,
               "'model.layers.1.mlp.up_proj.weight' is corrupted");
}

static void test_every_truncation_refused(void **state) {
    (void)state;
    for (size_t n = 0; n < g_len; n++) {
        csd_shard *s = NULL;
        csd_err err = {0};
        int rc = csd_shard_parse(&s, g_buf, n, "cut.shard", CSD_SHARD_VERIFY_ALL, &err);
        assert_int_equal(rc, CSD_EFORMAT);
        assert_null(s);
        assert_non_null(strstr(err.msg, "cut.shard"));
    }
}

static void test_model_hash_patch(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s.patch", g_path);
    csd_err err = {0};
    assert_int_equal(csd_file_write_all(path, g_buf, g_len, &err), 0);
    uint8_t hash[CSD_SHARD_HASH_BYTES];
    for (int i = 0; i < CSD_SHARD_HASH_BYTES; i++) hash[i] = (uint8_t)(255 - i);
    uint64_t sum = 0;
    assert_int_equal(csd_shard_set_model_hash(path, hash, &sum, &err), 0);
    csd_shard *s = NULL;
    if (csd_shard_open(&s, path, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(csd_shard_hdr(s)->model_hash, hash, sizeof hash);
    assert_true(csd_shard_hdr(s)->header_checksum == sum);
    csd_shard_close(s);
    /* A damaged header is refused rather than given a fresh valid checksum. */
    uint8_t *copy = csd_alloc(g_len);
    memcpy(copy, g_buf, g_len);
    copy[250] ^= 1;
    assert_int_equal(csd_file_write_all(path, copy, g_len, &err), 0);
    csd_free(copy);
    assert_int_equal(csd_shard_set_model_hash(path, hash, &sum, &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "header checksum mismatch"));
    unlink(path);
    assert_int_not_equal(csd_shard_set_model_hash(path, hash, &sum, &err), 0); /* gone */
}

static void test_model_hash_sensitivity(void **state) {
    (void)state;
    csd_shard_tensor t[2];
    make_tensors(t);
    t[0].checksum = 1;
    t[1].checksum = 2;
    csd_shard_table tab = {1, 2, 2, t};
    size_t n = strlen(config_json);
    uint8_t base[32], h[32];
    csd_shard_model_hash(base, config_json, n, CSD_DTYPE_F16, &tab, 1);
    csd_shard_model_hash(h, config_json, n, CSD_DTYPE_F16, &tab, 1);
    assert_memory_equal(base, h, 32);
    csd_shard_model_hash(h, config_json, n, CSD_DTYPE_Q8, &tab, 1);
    assert_memory_not_equal(base, h, 32);
    csd_shard_model_hash(h, config_json, n - 1, CSD_DTYPE_F16, &tab, 1);
    assert_memory_not_equal(base, h, 32);
    t[1].checksum = 3;
    csd_shard_model_hash(h, config_json, n, CSD_DTYPE_F16, &tab, 1);
    assert_memory_not_equal(base, h, 32);
    t[1].checksum = 2;
    tab.layer_end = 3;
    csd_shard_model_hash(h, config_json, n, CSD_DTYPE_F16, &tab, 1);
    assert_memory_not_equal(base, h, 32);
    char hex[65];
    csd_shard_hash_hex(base, hex);
    assert_int_equal(strlen(hex), 64);
    uint8_t back[32];
    assert_true(csd_shard_hash_parse(hex, back));
    assert_memory_equal(back, base, 32);
    assert_false(csd_shard_hash_parse("12", back));
    for (int i = 0; i < 64; i++) hex[i] = (char)toupper((unsigned char)hex[i]); /* either case */
    memset(back, 0, sizeof back);
    assert_true(csd_shard_hash_parse(hex, back));
    assert_memory_equal(back, base, 32);
    hex[10] = ':'; /* no separators, not even ones a looser parser would skip */
    assert_false(csd_shard_hash_parse(hex, back));
    hex[10] = 'g';
    assert_false(csd_shard_hash_parse(hex, back));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_header_fields_refused),
        cmocka_unit_test(test_table_fields_refused),
        cmocka_unit_test(test_every_truncation_refused),
        cmocka_unit_test(test_model_hash_patch),
        cmocka_unit_test(test_model_hash_sensitivity),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
