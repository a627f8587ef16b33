/* test_format_safetensors: the safetensors reader and writer. Round-trips every loadable dtype and
 * 0-4 dims through csd_st_write and back, opens a two-file sharded checkpoint and the shared
 * stories260K model, and feeds a battery of malformed headers and indexes, each of which must be
 * refused with a message naming the problem. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "format/safetensors.h"
#include "test_util.h"

/* ---- helpers ---- */

static char tmp_dir[256];

static int setup_dir(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/csd_test_st_XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void tmp_path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", tmp_dir, name);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

/* A whole safetensors file in memory: 8-byte LE length (hlen, or strlen(header) when hlen < 0),
 * the header text, then data_len bytes of 0xAB. csd_free the result. */
static uint8_t *make_file(const char *header, int64_t hlen, size_t data_len, size_t *out_len) {
    size_t h = strlen(header);
    uint64_t field = hlen < 0 ? (uint64_t)h : (uint64_t)hlen;
    uint8_t *buf = csd_alloc(8 + h + data_len);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(field >> (8 * i));
    memcpy(buf + 8, header, h);
    memset(buf + 8 + h, 0xAB, data_len);
    *out_len = 8 + h + data_len;
    return buf;
}

/* Parses header + data and expects failure whose message contains each of the given needles. */
static void expect_bad(const char *header, size_t data_len, const char *needle1,
                       const char *needle2) {
    size_t len;
    uint8_t *buf = make_file(header, -1, data_len, &len);
    csd_st_set *set = (csd_st_set *)1;
    csd_err err = {0};
    int rc = csd_st_parse(&set, buf, len, "bad.safetensors", &err);
    if (rc == 0 || !strstr(err.msg, needle1) || (needle2 && !strstr(err.msg, needle2)))
        print_error("header %s\n  rc=%d msg='%s' (wanted '%s'%s%s)\n", header, rc, err.msg,
                    needle1, needle2 ? " and " : "", needle2 ? needle2 : "");
    assert_int_not_equal(rc, 0);
    assert_int_equal(err.code, rc);
    assert_null(set);
    assert_non_null(strstr(err.msg, needle1));
    if (needle2) assert_non_null(strstr(err.msg, needle2));
    assert_non_null(strstr(err.msg, "bad.safetensors")); /* names the file */
    csd_free(buf);
}

/* Deterministic, non-constant contents: element j of tensor i is sin(0.37 j + i) * (i + 1). */
static float value_of(int i, size_t j) {
    return sinf(0.37f * (float)j + (float)i) * (float)(i + 1);
}

static void fill_expected(int i, int dtype, void *dst, size_t nbytes) {
    size_t esize = dtype == CSD_DTYPE_F32 ? 4 : 2;
    for (size_t j = 0; j < nbytes / esize; j++) {
        float v = value_of(i, j);
        if (dtype == CSD_DTYPE_F32) {
            memcpy((uint8_t *)dst + 4 * j, &v, 4);
        } else {
            uint16_t h = dtype == CSD_DTYPE_F16 ? csd_f32_to_f16(v) : csd_f32_to_bf16(v);
            memcpy((uint8_t *)dst + 2 * j, &h, 2);
        }
    }
}

typedef struct fill_ctx {
    const csd_st_desc *descs;
    int calls;     /* fill invocations so far */
    int fail_at;   /* index whose fill fails, or -1 */
} fill_ctx;

static int fill_cb(void *vctx, int index, void *dst, size_t nbytes, csd_err *err) {
    fill_ctx *ctx = vctx;
    assert_int_equal(index, ctx->calls); /* called once per tensor, in order */
    ctx->calls++;
    if (index == ctx->fail_at) return csd_err_set(err, CSD_EIO, "synthetic failure");
    fill_expected(index, ctx->descs[index].dtype, dst, nbytes);
    return 0;
}

static size_t desc_bytes(const csd_st_desc *d) {
    size_t n = d->dtype == CSD_DTYPE_F32 ? 4 : 2;
    for (int k = 0; k < d->n_dims; k++) n *= (size_t)d->shape[k];
    return n;
}

/* Checks that descs[i] is in set with its shape and the bytes fill_expected(i) makes. */
static void check_one(const csd_st_set *set, const csd_st_desc *descs, int i) {
    const csd_st_tensor *t = csd_st_find(set, descs[i].name);
    assert_non_null(t);
    assert_string_equal(t->name, descs[i].name);
    assert_int_equal(t->dtype, descs[i].dtype);
    assert_int_equal(t->n_dims, descs[i].n_dims);
    for (int k = 0; k < t->n_dims; k++) assert_int_equal(t->shape[k], descs[i].shape[k]);
    size_t nbytes = desc_bytes(&descs[i]);
    assert_int_equal(t->nbytes, nbytes);
    uint8_t *want = csd_alloc(nbytes);
    fill_expected(i, descs[i].dtype, want, nbytes);
    if (nbytes) assert_memory_equal(t->data, want, nbytes);
    csd_free(want);
}

/* ---- writer -> reader ---- */

static const csd_st_desc round_descs[] = {
    {"f32.1d", CSD_DTYPE_F32, 1, {7}},
    {"f32.2d", CSD_DTYPE_F32, 2, {3, 5}},
    {"f32.3d", CSD_DTYPE_F32, 3, {2, 3, 4}},
    {"f32.4d", CSD_DTYPE_F32, 4, {2, 1, 3, 2}},
    {"f16.1d", CSD_DTYPE_F16, 1, {9}},
    {"f16.2d", CSD_DTYPE_F16, 2, {4, 3}},
    {"f16.3d", CSD_DTYPE_F16, 3, {3, 1, 5}},
    {"f16.4d", CSD_DTYPE_F16, 4, {1, 2, 2, 3}},
    {"bf16.1d", CSD_DTYPE_BF16, 1, {5}},
    {"bf16.2d", CSD_DTYPE_BF16, 2, {6, 2}},
    {"bf16.3d", CSD_DTYPE_BF16, 3, {2, 2, 2}},
    {"bf16.4d", CSD_DTYPE_BF16, 4, {3, 2, 1, 3}},
    {"scalar", CSD_DTYPE_F32, 0, {0}},
    {"empty \"quoted\" name", CSD_DTYPE_BF16, 2, {0, 4}},
};
#define N_ROUND ((int)(sizeof round_descs / sizeof round_descs[0]))

static void test_round_trip(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "round.safetensors");
    fill_ctx ctx = {round_descs, 0, -1};
    csd_err err = {0};
    assert_int_equal(csd_st_write(path, round_descs, N_ROUND, fill_cb, &ctx, &err), 0);
    assert_int_equal(ctx.calls, N_ROUND);

    /* The data section starts 8-aligned: header padded with spaces. */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len8[i];
    assert_int_equal(hlen % 8, 0);
    char *hdr = csd_alloc(hlen + 1);
    assert_int_equal(fread(hdr, 1, hlen, f), hlen);
    /* No gap and no trailing bytes: the file ends where the last tensor does (the reference
     * implementation insists on that). */
    size_t total = 0;
    for (int i = 0; i < N_ROUND; i++) total += desc_bytes(&round_descs[i]);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    assert_int_equal((size_t)ftell(f), 8 + hlen + total);
    fclose(f);
    size_t last = hlen;
    while (last > 0 && hdr[last - 1] == ' ') last--;
    assert_true(last > 0 && hdr[last - 1] == '}');
    assert_non_null(strstr(hdr, "\"__metadata__\":{\"format\":\"pt\"}"));
    csd_free(hdr);

    csd_st_set *set = NULL;
    int rc = csd_st_open_file(&set, path, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(csd_st_count(set), N_ROUND);
    for (int i = 0; i < N_ROUND; i++) check_one(set, round_descs, i);
    /* Tensors are contiguous in descriptor order, and csd_st_at keeps header order. */
    for (int i = 1; i < N_ROUND; i++) {
        const csd_st_tensor *a = csd_st_find(set, round_descs[i - 1].name);
        const csd_st_tensor *b = csd_st_find(set, round_descs[i].name);
        assert_ptr_equal((const uint8_t *)a->data + a->nbytes, b->data);
        assert_string_equal(csd_st_at(set, i)->name, round_descs[i].name);
    }
    assert_null(csd_st_at(set, N_ROUND));
    assert_null(csd_st_at(set, -1));
    assert_null(csd_st_find(set, "absent"));
    csd_st_close(set);
    csd_st_close(NULL);
}

static void test_write_refusals(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "refused.safetensors");
    csd_err err = {0};

    /* A failing fill leaves neither the file nor the temp file behind. */
    fill_ctx ctx = {round_descs, 0, 2};
    assert_int_equal(csd_st_write(path, round_descs, N_ROUND, fill_cb, &ctx, &err), CSD_EIO);
    assert_non_null(strstr(err.msg, "synthetic failure"));
    assert_non_null(strstr(err.msg, "f32.3d"));
    assert_false(access(path, F_OK) == 0);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_false(access(tmp, F_OK) == 0);

    csd_st_desc dup[2] = {{"a", CSD_DTYPE_F32, 1, {2}}, {"a", CSD_DTYPE_F16, 1, {2}}};
    ctx = (fill_ctx){dup, 0, -1};
    assert_int_not_equal(csd_st_write(path, dup, 2, fill_cb, &ctx, &err), 0);
    assert_non_null(strstr(err.msg, "duplicate"));
    assert_int_equal(ctx.calls, 0);

    csd_st_desc q8[1] = {{"q", CSD_DTYPE_Q8, 1, {128}}};
    assert_int_not_equal(csd_st_write(path, q8, 1, fill_cb, &ctx, &err), 0);
    assert_non_null(strstr(err.msg, "dtype"));

    csd_st_desc neg[1] = {{"n", CSD_DTYPE_F32, 2, {2, -1}}};
    assert_int_not_equal(csd_st_write(path, neg, 1, fill_cb, &ctx, &err), 0);
    assert_non_null(strstr(err.msg, "negative"));

    csd_st_desc meta[1] = {{"__metadata__", CSD_DTYPE_F32, 1, {1}}};
    assert_int_not_equal(csd_st_write(path, meta, 1, fill_cb, &ctx, &err), 0);
    assert_non_null(strstr(err.msg, "reserved"));
    assert_false(access(path, F_OK) == 0);
}

/* ---- sharded ---- */

static const csd_st_desc shard_a[] = {
    {"model.embed_tokens.weight", CSD_DTYPE_BF16, 2, {8, 4}},
    {"model.layers.0.input_layernorm.weight", CSD_DTYPE_F32, 1, {4}},
};
static const csd_st_desc shard_b[] = {
    {"model.norm.weight", CSD_DTYPE_F16, 1, {4}},
};

static void write_shards(const char *dir) {
    char path[512];
    csd_err err = {0};
    fill_ctx ca = {shard_a, 0, -1}, cb = {shard_b, 0, -1};
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(csd_st_write(path, shard_a, 2, fill_cb, &ca, &err), 0);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(csd_st_write(path, shard_b, 1, fill_cb, &cb, &err), 0);
}

static void write_index(const char *dir, const char *embed_file, const char *norm_file) {
    char path[512], text[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    snprintf(text, sizeof text,
             "{\"metadata\": {\"total_size\": 88}, \"weight_map\": {\n"
             "  \"model.embed_tokens.weight\": \"%s\",\n"
             "  \"model.layers.0.input_layernorm.weight\": \"model-00001-of-00002.safetensors\",\n"
             "  \"model.norm.weight\": \"%s\"}}\n",
             embed_file, norm_file);
    write_text(path, text);
}

static void expect_dir_bad(const char *needle1, const char *needle2) {
    csd_st_set *set = NULL;
    csd_err err = {0};
    int rc = csd_st_open_dir(&set, tmp_dir, &err);
    if (rc == 0 || !strstr(err.msg, needle1) || (needle2 && !strstr(err.msg, needle2)))
        print_error("rc=%d msg='%s' wanted '%s' '%s'\n", rc, err.msg, needle1,
                    needle2 ? needle2 : "");
    assert_int_not_equal(rc, 0);
    assert_null(set);
    assert_non_null(strstr(err.msg, needle1));
    if (needle2) assert_non_null(strstr(err.msg, needle2));
}

static void test_sharded(void **state) {
    (void)state;
    write_shards(tmp_dir);
    write_index(tmp_dir, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors");
    csd_st_set *set = NULL;
    csd_err err = {0};
    int rc = csd_st_open_dir(&set, tmp_dir, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(csd_st_count(set), 3);
    /* Each tensor's data is the one its own file's fill produced. */
    check_one(set, shard_a, 0);
    check_one(set, shard_a, 1);
    check_one(set, shard_b, 0);
    csd_st_close(set);

    /* The index names a file that does not exist. */
    write_index(tmp_dir, "model-00001-of-00002.safetensors", "model-missing.safetensors");
    expect_dir_bad("model-missing.safetensors", "cannot open");
    /* The index puts a tensor in a file that does not hold it. */
    write_index(tmp_dir, "model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors");
    expect_dir_bad("model.embed_tokens.weight", "is mapped to model-00002-of-00002.safetensors");
    /* The index names a tensor that no file has. */
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp_dir);
    write_text(path, "{\"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\","
                     "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    expect_dir_bad("lm_head.weight", "does not contain");
    /* Shard names must stay in the model directory. */
    write_index(tmp_dir, "../model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors");
    expect_dir_bad("model.embed_tokens.weight", "does not name a file");
    /* The same tensor in two shards. */
    char path_c[512];
    snprintf(path_c, sizeof path_c, "%s/model-extra.safetensors", tmp_dir);
    fill_ctx cc = {shard_b, 0, -1};
    assert_int_equal(csd_st_write(path_c, shard_b, 1, fill_cb, &cc, &err), 0);
    write_text(path, "{\"weight_map\": {"
                     "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                     "\"model.norm.weight\": \"model-00002-of-00002.safetensors\","
                     "\"other\": \"model-extra.safetensors\"}}");
    expect_dir_bad("duplicate tensor name 'model.norm.weight'", NULL);
    /* Not JSON / no weight_map. */
    write_text(path, "{\"weight_map\": ");
    expect_dir_bad("not valid JSON", NULL);
    write_text(path, "{\"metadata\": {}}");
    expect_dir_bad("weight_map", NULL);
    unlink(path);
    /* Neither single file nor index. */
    expect_dir_bad("no model.safetensors", NULL);
}

/* ---- the real model ---- */

static void test_stories260k(void **state) {
    (void)state;
    const char *path = CSD_STORIES_DIR "/model.safetensors";
    CSD_REQUIRE_FILE(path);
    csd_st_set *set = NULL;
    csd_err err = {0};
    int rc = csd_st_open_dir(&set, CSD_STORIES_DIR, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    /* embed + 5 layers x 9 + final norm; tied embeddings, so no lm_head. */
    assert_int_equal(csd_st_count(set), 1 + 5 * 9 + 1);
    assert_null(csd_st_find(set, "lm_head.weight"));
    const csd_st_tensor *emb = csd_st_find(set, "model.embed_tokens.weight");
    assert_non_null(emb);
    assert_int_equal(emb->dtype, CSD_DTYPE_F32);
    assert_int_equal(emb->n_dims, 2);
    assert_int_equal(emb->shape[0], 512);
    assert_int_equal(emb->shape[1], 64);
    assert_int_equal(emb->nbytes, 512 * 64 * 4);
    const char *names[] = {"model.layers.%d.self_attn.q_proj.weight",
                           "model.layers.%d.self_attn.k_proj.weight",
                           "model.layers.%d.mlp.gate_proj.weight",
                           "model.layers.%d.post_attention_layernorm.weight"};
    const int64_t rows[] = {64, 32, 172, 64};
    for (int l = 0; l < 5; l++)
        for (int k = 0; k < 4; k++) {
            char name[128];
            snprintf(name, sizeof name, names[k], l);
            const csd_st_tensor *t = csd_st_find(set, name);
            assert_non_null(t);
            assert_int_equal(t->shape[0], rows[k]);
            assert_int_equal(t->n_dims, k == 3 ? 1 : 2);
        }
    /* The mapping points at the right bytes: compare with an independent read of the file. */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len8[i];
    const csd_st_tensor *norm = csd_st_find(set, "model.norm.weight");
    assert_non_null(norm);
    size_t off = (size_t)((const uint8_t *)norm->data - (const uint8_t *)emb->data);
    uint8_t *direct = csd_alloc(norm->nbytes);
    assert_int_equal(fseek(f, (long)(8 + hlen + off), SEEK_SET), 0);
    assert_int_equal(fread(direct, 1, norm->nbytes, f), norm->nbytes);
    assert_memory_equal(direct, norm->data, norm->nbytes);
    /* RMSNorm weights of a trained model: finite and not all equal. */
    const float *w = norm->data;
    assert_true(isfinite(w[0]) && w[0] != w[1]);
    csd_free(direct);
    fclose(f);
    csd_st_close(set);
}

/* ---- malformed input ---- */

static void test_bad_framing(void **state) {
    (void)state;
    csd_st_set *set = NULL;
    csd_err err = {0};
    size_t len;
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";

    /* Truncated: fewer than 8 bytes. */
    uint8_t five[5] = {1, 0, 0, 0, 0};
    assert_int_equal(csd_st_parse(&set, five, sizeof five, "bad.safetensors", &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "truncated"));
    assert_int_not_equal(csd_st_parse(&set, NULL, 0, "bad.safetensors", &err), 0);
    assert_non_null(strstr(err.msg, "truncated"));

    /* Header length larger than the file. */
    uint8_t *buf = make_file(hdr, (int64_t)strlen(hdr) + 100, 4, &len);
    assert_int_equal(csd_st_parse(&set, buf, len, "bad.safetensors", &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "larger than the file"));
    csd_free(buf);

    /* Header length huge (would drive a huge read). */
    buf = make_file(hdr, (int64_t)1 << 40, 4, &len);
    assert_int_equal(csd_st_parse(&set, buf, len, "bad.safetensors", &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "exceeds the limit"));
    csd_free(buf);
    buf = make_file(hdr, -2, 4, &len); /* all ones: 2^64 - 2 */
    for (int i = 0; i < 8; i++) buf[i] = 0xff;
    assert_int_equal(csd_st_parse(&set, buf, len, "bad.safetensors", &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "exceeds the limit"));
    csd_free(buf);

    /* A valid header parses (the control for everything above). */
    buf = make_file(hdr, -1, 4, &len);
    assert_int_equal(csd_st_parse(&set, buf, len, "ok.safetensors", &err), 0);
    assert_int_equal(csd_st_count(set), 1);
    csd_st_close(set);
    /* The same file cut inside its data section. */
    assert_int_equal(csd_st_parse(&set, buf, len - 1, "bad.safetensors", &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "past the end"));
    csd_free(buf);
}

static void test_bad_headers(void **state) {
    (void)state;
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offs", 4, "not valid JSON",
               NULL);
    expect_bad("not json at all", 0, "not valid JSON", NULL);
    expect_bad("", 0, "not valid JSON", NULL);
    expect_bad("[1, 2, 3]", 0, "not an object", NULL);
    expect_bad("{\"a\": 5}", 0, "'a'", "not a JSON object");
    /* Offsets past the end of the data section. */
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "'w'",
               "past the end");
    /* Overlapping tensors. */
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, "overlap", "'x'");
    expect_bad("{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
               "\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
               16, "overlap", "'y'");
    /* Shape and byte length disagree. */
    expect_bad("{\"m\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "'m'",
               "length mismatch");
    expect_bad("{\"m\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, "'m'",
               "length mismatch");
    /* Unknown and unsupported dtypes, naming tensor and dtype. */
    expect_bad("{\"u\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
               "unknown dtype 'Q7'", "'u'");
    expect_bad("{\"emb\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
               "dtype I8 is not supported", "'emb'");
    expect_bad("{\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
               "dtype F64 is not supported", "'d'");
    /* Duplicate names. */
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "duplicate", NULL);
    /* Missing and mistyped fields. */
    expect_bad("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'t'", "dtype");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "'t'", "shape");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'t'", "data_offsets");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "'t'",
               "data_offsets");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4, "'t'",
               "data_offsets");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "'t'",
               "data_offsets");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "'t'",
               "after end");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "'t'",
               "shape dim 0");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,\"2\"],\"data_offsets\":[0,8]}}", 8, "'t'",
               "shape dim 1");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               "'t'", "5 dims");
    /* Shape product overflows 64 bits (and would wrap to a small length if unchecked). */
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
               "\"data_offsets\":[0,0]}}",
               0, "'t'", "overflows");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,2],"
               "\"data_offsets\":[0,0]}}",
               0, "'t'", "overflows");
    /* Names: empty, too long. */
    expect_bad("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name",
               NULL);
    char longhdr[1024], name[400];
    memset(name, 'n', 300);
    name[300] = '\0';
    snprintf(longhdr, sizeof longhdr,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", name);
    expect_bad(longhdr, 4, "300 bytes long", NULL);
}

static void test_accepted_edges(void **state) {
    (void)state;
    /* __metadata__ is ignored; zero-size tensors, gaps and a 0-dim scalar are fine. */
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]},"
                      "\"z\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[2,2]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}  ";
    size_t len;
    uint8_t *buf = make_file(hdr, -1, 12, &len);
    csd_st_set *set = NULL;
    csd_err err = {0};
    int rc = csd_st_parse(&set, buf, len, "edge.safetensors", &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(csd_st_count(set), 3);
    assert_null(csd_st_find(set, "__metadata__"));
    const csd_st_tensor *s = csd_st_find(set, "s");
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->nbytes, 4);
    assert_ptr_equal(s->data, buf + len - 4);
    assert_int_equal(csd_st_find(set, "z")->nbytes, 0);
    assert_int_equal(csd_st_find(set, "b")->dtype, CSD_DTYPE_BF16);
    csd_st_close(set);
    csd_free(buf);
}

static void test_bad_files(void **state) {
    (void)state;
    char path[512];
    csd_st_set *set = NULL;
    csd_err err = {0};
    tmp_path(path, sizeof path, "empty.safetensors");
    write_text(path, "");
    assert_int_equal(csd_st_open_file(&set, path, &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "truncated"));
    assert_non_null(strstr(err.msg, "empty.safetensors"));
    tmp_path(path, sizeof path, "absent.safetensors");
    assert_int_equal(csd_st_open_file(&set, path, &err), CSD_EIO);
    assert_non_null(strstr(err.msg, "absent.safetensors"));

    /* A written file cut short in its data section. */
    tmp_path(path, sizeof path, "cut.safetensors");
    fill_ctx ctx = {round_descs, 0, -1};
    assert_int_equal(csd_st_write(path, round_descs, N_ROUND, fill_cb, &ctx, &err), 0);
    FILE *f = fopen(path, "rb+");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    fclose(f);
    assert_int_equal(truncate(path, size - 3), 0);
    assert_int_equal(csd_st_open_file(&set, path, &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "past the end"));
    assert_null(set);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_write_refusals, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_sharded, setup_dir, teardown_dir),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_bad_framing),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_accepted_edges),
        cmocka_unit_test_setup_teardown(test_bad_files, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
