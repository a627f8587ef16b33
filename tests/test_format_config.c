/* test_format_config: config.json -> csd_model_config for every family (Llama 2/3.1 rope scaling,
 * Mistral sliding window null/int, Qwen2 biases, Qwen3 explicit head_dim and q/k norm), EOS lists
 * and generation_config.json merging, refusal of missing/negative/huge/inconsistent fields with a
 * message naming the field, the to_json round trip, and transformers 5's rope_parameters (read
 * as the older rope_theta and rope_scaling, refused where it says what is not implemented). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "format/model_config.h"
#include "test_util.h"

/* ---- sample configs, shaped like the real HF files ---- */

static const char *const llama2_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096,"
    " \"intermediate_size\": 11008, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
    " \"num_key_value_heads\": 32, \"vocab_size\": 32000, \"max_position_embeddings\": 4096,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"rope_scaling\": null,"
    " \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"bos_token_id\": 1,"
    " \"eos_token_id\": 2, \"torch_dtype\": \"float16\", \"attention_bias\": false}";

static const char *const llama31_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
    " \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
    " \"vocab_size\": 128256, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0,"
    " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": false, \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009], \"torch_dtype\": \"bfloat16\","
    " \"mlp_bias\": false, \"attention_bias\": false, \"pretraining_tp\": 1}";

/* Llama 3.2 1B: tied embeddings, explicit head_dim, older "type" key for rope scaling. */
static const char *const llama32_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 2048, \"intermediate_size\": 8192,"
    " \"num_hidden_layers\": 16, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
    " \"head_dim\": 64, \"vocab_size\": 128256, \"max_position_embeddings\": 131072,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 32.0,"
    " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
    " \"original_max_position_embeddings\": 8192, \"type\": \"llama3\"},"
    " \"tie_word_embeddings\": true, \"bos_token_id\": 128000, \"eos_token_id\": 128001,"
    " \"torch_dtype\": \"bfloat16\"}";

static const char *const mistral_json =
    "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\","
    " \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32,"
    " \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"vocab_size\": 32768,"
    " \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0,"
    " \"sliding_window\": null, \"tie_word_embeddings\": false, \"bos_token_id\": 1,"
    " \"eos_token_id\": 2, \"torch_dtype\": \"bfloat16\"}";

static const char *const qwen2_json =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": 896,"
    " \"intermediate_size\": 4864, \"num_hidden_layers\": 24, \"num_attention_heads\": 14,"
    " \"num_key_value_heads\": 2, \"vocab_size\": 151936, \"max_position_embeddings\": 32768,"
    " \"max_window_layers\": 21, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
    " \"sliding_window\": 32768, \"use_sliding_window\": false, \"tie_word_embeddings\": true,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"torch_dtype\": \"bfloat16\"}";

static const char *const qwen3_json =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 1024,"
    " \"intermediate_size\": 3072, \"num_hidden_layers\": 28, \"num_attention_heads\": 16,"
    " \"num_key_value_heads\": 8, \"head_dim\": 128, \"vocab_size\": 151936,"
    " \"max_position_embeddings\": 40960, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000,"
    " \"rope_scaling\": null, \"attention_bias\": false, \"sliding_window\": null,"
    " \"use_sliding_window\": false, \"tie_word_embeddings\": true, \"bos_token_id\": 151643,"
    " \"eos_token_id\": 151645, \"torch_dtype\": \"bfloat16\"}";

/* ---- helpers ---- */

static void parse_ok(const char *json, csd_model_config *cfg) {
    csd_err err = {0};
    int rc = csd_model_config_parse(cfg, json, strlen(json), &err);
    if (rc) print_error("parse failed: %s\n", err.msg);
    assert_int_equal(rc, 0);
}

/* Parses base with key replaced by value_json (or removed when value_json is NULL). */
static int parse_edited(const char *base, const char *key, const char *value_json,
                        csd_model_config *cfg, csd_err *err) {
    json_t *root = json_loads(base, 0, NULL);
    assert_non_null(root);
    if (value_json) {
        json_t *v = json_loads(value_json, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        assert_int_equal(json_object_set_new(root, key, v), 0);
    } else {
        json_object_del(root, key);
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    int rc = csd_model_config_parse(cfg, text, strlen(text), err);
    free(text);
    return rc;
}

/* The edit must be refused with a message containing needle (and the same code in err). */
static void expect_refused(const char *base, const char *key, const char *value_json,
                           const char *needle) {
    csd_model_config cfg;
    csd_err err = {0};
    int rc = parse_edited(base, key, value_json, &cfg, &err);
    if (rc == 0 || !strstr(err.msg, needle))
        print_error("%s=%s: rc=%d msg='%s' (wanted '%s')\n", key, value_json ? value_json : "-",
                    rc, err.msg, needle);
    assert_int_not_equal(rc, 0);
    assert_int_equal(err.code, rc);
    assert_non_null(strstr(err.msg, needle));
}

/* parse(to_json(cfg)) == cfg, and the text is a plausible HF config. */
static void check_round_trip(const csd_model_config *cfg, const char *hf_class) {
    char *text = NULL;
    csd_err err = {0};
    int rc = csd_model_config_to_json(cfg, &text, &err);
    if (rc) print_error("to_json failed: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(text, hf_class));
    assert_non_null(strstr(text, "\"model_type\": \""));
    csd_model_config back;
    parse_ok(text, &back);
    assert_true(csd_model_config_equal(cfg, &back));
    /* Field by field on the ones most likely to drift. */
    assert_int_equal(back.arch, cfg->arch);
    assert_int_equal(back.head_dim, cfg->head_dim);
    assert_true(back.norm_eps == cfg->norm_eps);
    assert_true(back.rope_theta == cfg->rope_theta);
    assert_int_equal(back.n_eos, cfg->n_eos);
    assert_int_equal(back.bos_id, cfg->bos_id);
    assert_int_equal(back.sliding_window, cfg->sliding_window);
    assert_int_equal(back.qkv_bias, cfg->qkv_bias);
    assert_int_equal(back.torch_dtype, cfg->torch_dtype);
    csd_free(text);
}

/* ---- families ---- */

static void test_stories260k(void **state) {
    (void)state;
    CSD_REQUIRE_FILE(CSD_STORIES_DIR "/config.json");
    csd_model_config cfg;
    csd_err err = {0};
    int rc = csd_model_config_load(&cfg, CSD_STORIES_DIR, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(cfg.arch, CSD_ARCH_LLAMA);
    assert_string_equal(cfg.model_type, "llama");
    assert_int_equal(cfg.dim, 64);
    assert_int_equal(cfg.hidden_dim, 172);
    assert_int_equal(cfg.n_layers, 5);
    assert_int_equal(cfg.n_heads, 8);
    assert_int_equal(cfg.n_kv_heads, 4);
    assert_int_equal(cfg.head_dim, 8);
    assert_int_equal(cfg.vocab_size, 512);
    assert_int_equal(cfg.max_seq_len, 512);
    assert_true(cfg.norm_eps == 1e-5f);
    assert_true(cfg.rope_theta == 10000.0f);
    assert_int_equal(cfg.rope_scaling, CSD_ROPE_SCALING_NONE);
    assert_true(cfg.tie_embeddings);
    assert_false(cfg.qkv_bias);
    assert_false(cfg.qk_norm);
    assert_int_equal(cfg.bos_id, 1);
    /* eos 2 in both config.json and generation_config.json: listed once. */
    assert_int_equal(cfg.n_eos, 1);
    assert_int_equal(cfg.eos_ids[0], 2);
    assert_int_equal(cfg.torch_dtype, CSD_DTYPE_F32);
    assert_int_equal(cfg.sliding_window, 0);
    check_round_trip(&cfg, "LlamaForCausalLM");
}

static void test_llama(void **state) {
    (void)state;
    csd_model_config c;
    parse_ok(llama2_json, &c);
    assert_int_equal(c.arch, CSD_ARCH_LLAMA);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.n_kv_heads, 32);
    assert_int_equal(c.rope_scaling, CSD_ROPE_SCALING_NONE);
    assert_int_equal(c.torch_dtype, CSD_DTYPE_F16);
    assert_false(c.tie_embeddings);
    check_round_trip(&c, "LlamaForCausalLM");

    parse_ok(llama31_json, &c);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.rope_scaling, CSD_ROPE_SCALING_LLAMA3);
    assert_true(c.rope_factor == 8.0f);
    assert_true(c.rope_low_freq_factor == 1.0f);
    assert_true(c.rope_high_freq_factor == 4.0f);
    assert_int_equal(c.rope_orig_max_pos, 8192);
    assert_true(c.rope_theta == 500000.0f);
    assert_int_equal(c.max_seq_len, 131072);
    assert_int_equal(c.bos_id, 128000);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_ids[0], 128001);
    assert_int_equal(c.eos_ids[1], 128008);
    assert_int_equal(c.eos_ids[2], 128009);
    assert_int_equal(c.torch_dtype, CSD_DTYPE_BF16);
    check_round_trip(&c, "LlamaForCausalLM");

    parse_ok(llama32_json, &c);
    assert_int_equal(c.rope_scaling, CSD_ROPE_SCALING_LLAMA3);
    assert_true(c.rope_factor == 32.0f);
    assert_int_equal(c.head_dim, 64);
    assert_true(c.tie_embeddings);
    check_round_trip(&c, "LlamaForCausalLM");

    /* Linear scaling; attention_bias turns on q/k/v and o biases; "default" means none. */
    csd_err err = {0};
    assert_int_equal(parse_edited(llama2_json, "rope_scaling",
                                  "{\"type\": \"linear\", \"factor\": 2.0}", &c, &err),
                     0);
    assert_int_equal(c.rope_scaling, CSD_ROPE_SCALING_LINEAR);
    assert_true(c.rope_factor == 2.0f);
    check_round_trip(&c, "LlamaForCausalLM");
    assert_int_equal(parse_edited(llama2_json, "attention_bias", "true", &c, &err), 0);
    assert_true(c.qkv_bias);
    assert_true(c.o_bias);
    check_round_trip(&c, "LlamaForCausalLM");
    csd_model_config contradicts = c; /* one attention_bias cannot say q/k/v without o */
    contradicts.o_bias = false;
    char *json = NULL;
    assert_int_not_equal(csd_model_config_to_json(&contradicts, &json, &err), 0);
    assert_null(json);
    assert_int_equal(parse_edited(llama2_json, "rope_scaling", "{\"rope_type\": \"default\"}", &c,
                                  &err),
                     0);
    assert_int_equal(c.rope_scaling, CSD_ROPE_SCALING_NONE);
    /* Optional fields absent: defaults. */
    assert_int_equal(parse_edited(llama2_json, "bos_token_id", NULL, &c, &err), 0);
    assert_int_equal(c.bos_id, -1);
    assert_int_equal(parse_edited(llama2_json, "bos_token_id", "null", &c, &err), 0);
    assert_int_equal(c.bos_id, -1);
    check_round_trip(&c, "LlamaForCausalLM");
    assert_int_equal(parse_edited(llama2_json, "torch_dtype", NULL, &c, &err), 0);
    assert_int_equal(c.torch_dtype, CSD_DTYPE_F32);
    assert_int_equal(parse_edited(llama2_json, "num_key_value_heads", NULL, &c, &err), 0);
    assert_int_equal(c.n_kv_heads, 32);
    assert_int_equal(parse_edited(llama2_json, "tie_word_embeddings", NULL, &c, &err), 0);
    assert_false(c.tie_embeddings);
    assert_int_equal(parse_edited(llama2_json, "eos_token_id", NULL, &c, &err), 0);
    assert_int_equal(c.n_eos, 0);
    check_round_trip(&c, "LlamaForCausalLM");
    /* Duplicate ids in an eos list are kept once. */
    assert_int_equal(parse_edited(llama2_json, "eos_token_id", "[2, 5, 2]", &c, &err), 0);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_ids[1], 5);
}

static void test_mistral(void **state) {
    (void)state;
    csd_model_config c;
    parse_ok(mistral_json, &c);
    assert_int_equal(c.arch, CSD_ARCH_MISTRAL);
    assert_int_equal(c.sliding_window, 0);
    assert_false(c.qkv_bias);
    check_round_trip(&c, "MistralForCausalLM");
    csd_err err = {0};
    assert_int_equal(parse_edited(mistral_json, "sliding_window", "4096", &c, &err), 0);
    assert_int_equal(c.sliding_window, 4096);
    check_round_trip(&c, "MistralForCausalLM");
    assert_int_equal(parse_edited(mistral_json, "sliding_window", NULL, &c, &err), 0);
    assert_int_equal(c.sliding_window, 4096); /* absent: transformers' MistralConfig default */
    expect_refused(mistral_json, "sliding_window", "-1", "sliding_window");
    expect_refused(mistral_json, "sliding_window", "\"4096\"", "sliding_window");
}

static void test_qwen(void **state) {
    (void)state;
    csd_model_config c;
    parse_ok(qwen2_json, &c);
    assert_int_equal(c.arch, CSD_ARCH_QWEN2);
    assert_true(c.qkv_bias); /* always on for Qwen2 */
    assert_false(c.o_bias);  /* q/k/v only, as transformers' Qwen2Attention */
    assert_false(c.qk_norm);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.sliding_window, 0); /* use_sliding_window is false */
    assert_true(c.tie_embeddings);
    assert_true(c.norm_eps == 1e-6f);
    check_round_trip(&c, "Qwen2ForCausalLM");
    expect_refused(qwen2_json, "use_sliding_window", "true", "use_sliding_window");

    parse_ok(qwen3_json, &c);
    assert_int_equal(c.arch, CSD_ARCH_QWEN3);
    assert_int_equal(c.head_dim, 128); /* explicit, not 1024 / 16 = 64 */
    assert_int_equal(c.dim / c.n_heads, 64);
    assert_true(c.qk_norm);
    assert_false(c.qkv_bias);
    assert_true(c.rope_theta == 1000000.0f); /* given as a JSON integer */
    check_round_trip(&c, "Qwen3ForCausalLM");
}

/* ---- refusals ---- */

static void test_unsupported(void **state) {
    (void)state;
    assert_string_equal(csd_arch_supported_list(), "llama, mistral, qwen2, qwen3");
    for (int a = 0; a < CSD_ARCH_COUNT; a++) {
        const csd_arch_desc *row = csd_arch_get(a);
        assert_non_null(row);
        assert_int_equal(row->arch, a);
        assert_ptr_equal(csd_arch_find(row->model_type), row);
        assert_non_null(strstr(csd_arch_supported_list(), row->model_type));
        assert_non_null(csd_arch_hf_class(a));
    }
    assert_null(csd_arch_get(CSD_ARCH_COUNT));
    assert_null(csd_arch_find("gemma"));

    csd_model_config c;
    csd_err err = {0};
    assert_int_equal(parse_edited(llama2_json, "model_type", "\"gemma\"", &c, &err),
                     CSD_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "'gemma'"));
    assert_non_null(strstr(err.msg, "llama, mistral, qwen2, qwen3"));
    expect_refused(llama2_json, "model_type", NULL, "llama, mistral, qwen2, qwen3");
    expect_refused(llama2_json, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}",
                   "'yarn'");
    expect_refused(llama2_json, "rope_scaling", "{\"factor\": 4.0}", "rope_type");
    expect_refused(llama2_json, "hidden_act", "\"gelu\"", "hidden_act");
    expect_refused(llama2_json, "mlp_bias", "true", "mlp_bias");
    expect_refused(llama2_json, "torch_dtype", "\"float64\"", "'float64'");
}

static void test_bad_fields(void **state) {
    (void)state;
    static const char *const required[] = {"hidden_size", "intermediate_size",
                                           "num_hidden_layers", "num_attention_heads",
                                           "vocab_size", "max_position_embeddings"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        expect_refused(llama2_json, required[i], NULL, required[i]);      /* missing */
        expect_refused(llama2_json, required[i], "null", required[i]);    /* null */
        expect_refused(llama2_json, required[i], "-4", required[i]);      /* negative */
        expect_refused(llama2_json, required[i], "0", required[i]);       /* zero */
        expect_refused(llama2_json, required[i], "4000000000", required[i]); /* huge */
        expect_refused(llama2_json, required[i], "4096.5", required[i]);  /* not an integer */
        expect_refused(llama2_json, required[i], "\"64\"", required[i]);  /* string */
    }
    expect_refused(llama2_json, "num_hidden_layers", "1025", "num_hidden_layers");
    expect_refused(llama2_json, "vocab_size", "1048577", "vocab_size");
    /* Heads that do not divide. */
    expect_refused(llama2_json, "num_key_value_heads", "5", "num_key_value_heads");
    expect_refused(llama2_json, "num_key_value_heads", "64", "num_key_value_heads");
    expect_refused(llama2_json, "hidden_size", "4100", "not divisible");
    expect_refused(llama2_json, "head_dim", "127", "odd");
    expect_refused(llama2_json, "head_dim", "0", "head_dim");
    expect_refused(llama2_json, "head_dim", "65536", "head_dim");
    /* Floats. */
    expect_refused(llama2_json, "rms_norm_eps", "-1e-5", "rms_norm_eps");
    expect_refused(llama2_json, "rms_norm_eps", "0", "rms_norm_eps");
    expect_refused(llama2_json, "rms_norm_eps", "1e-60", "rms_norm_eps"); /* 0 as a float */
    expect_refused(llama2_json, "rope_theta", "\"10000\"", "rope_theta");
    expect_refused(llama2_json, "rope_theta", "1e300", "rope_theta");
    /* small enough that 1 / theta**x overflows: every logit would be NaN */
    expect_refused(llama2_json, "rope_theta", "1e-45", "rope_theta");
    expect_refused(llama2_json, "rope_theta", "0.5", "rope_theta");
    expect_refused(llama2_json, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0,"
                                                " \"high_freq_factor\": 4.0,"
                                                " \"original_max_position_embeddings\": 8192}",
                   "low_freq_factor");
    expect_refused(llama2_json, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0,"
                                                " \"low_freq_factor\": 4.0,"
                                                " \"high_freq_factor\": 4.0,"
                                                " \"original_max_position_embeddings\": 8192}",
                   "high_freq_factor");
    expect_refused(llama2_json, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": -2}",
                   "factor");
    expect_refused(llama2_json, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 1e-45}",
                   "factor");
    expect_refused(llama2_json, "rope_scaling", "[1]", "rope_scaling");
    /* Token ids. */
    expect_refused(llama2_json, "bos_token_id", "32000", "bos_token_id");
    expect_refused(llama2_json, "bos_token_id", "-1", "bos_token_id");
    expect_refused(llama2_json, "eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8, 9]", "eos_token_id");
    expect_refused(llama2_json, "eos_token_id", "[1, \"2\"]", "eos_token_id");
    expect_refused(llama2_json, "eos_token_id", "99999", "eos_token_id");
    expect_refused(llama2_json, "tie_word_embeddings", "1", "tie_word_embeddings");

    /* Not JSON, not an object, duplicate keys. */
    csd_model_config c;
    csd_err err = {0};
    const char *bad = "{\"model_type\": \"llama\",";
    assert_int_equal(csd_model_config_parse(&c, bad, strlen(bad), &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "not valid JSON"));
    assert_int_equal(csd_model_config_parse(&c, "[]", 2, &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "not a JSON object"));
    /* Length is honoured: the text need not be NUL-terminated. */
    assert_int_not_equal(csd_model_config_parse(&c, llama2_json, strlen(llama2_json) - 1, &err), 0);
}

static void test_to_json_refusals(void **state) {
    (void)state;
    csd_model_config c;
    parse_ok(llama2_json, &c);
    char *text = (char *)1;
    csd_err err = {0};
    csd_model_config bad = c;
    bad.dim = 0;
    assert_int_equal(csd_model_config_to_json(&bad, &text, &err), CSD_EINVAL);
    assert_null(text);
    assert_non_null(strstr(err.msg, "hidden_size"));
    bad = c;
    bad.arch = 99;
    assert_int_equal(csd_model_config_to_json(&bad, &text, &err), CSD_EINVAL);
    bad = c;
    bad.sliding_window = 128; /* llama has no window */
    assert_int_equal(csd_model_config_to_json(&bad, &text, &err), CSD_EINVAL);
    /* A hand-built struct (empty model_type, rope params zero) still serialises. */
    csd_model_config hand;
    memset(&hand, 0, sizeof hand);
    hand.arch = CSD_ARCH_QWEN3;
    hand.dim = 64;
    hand.hidden_dim = 96;
    hand.n_layers = 2;
    hand.n_heads = 4;
    hand.n_kv_heads = 2;
    hand.head_dim = 32;
    hand.vocab_size = 100;
    hand.max_seq_len = 256;
    hand.norm_eps = 1e-6f;
    hand.rope_theta = 1e6f;
    hand.qk_norm = true;
    hand.bos_id = -1;
    hand.n_eos = 2;
    hand.eos_ids[0] = 7;
    hand.eos_ids[1] = 9;
    hand.torch_dtype = CSD_DTYPE_BF16;
    assert_int_equal(csd_model_config_to_json(&hand, &text, &err), 0);
    assert_non_null(strstr(text, "\"rms_norm_eps\": 1e-6,")); /* shortest float form */
    assert_non_null(strstr(text, "\"eos_token_id\": [\n    7,\n    9\n  ]"));
    parse_ok(text, &c);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.n_eos, 2);
    assert_string_equal(c.model_type, "qwen3");
    csd_free(text);
}

/* ---- model directory ---- */

static void test_load_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/csd_test_cfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(llama2_json, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"bos_token_id\": 1, \"eos_token_id\": [2, 32001, 7], \"do_sample\": true}", f);
    fclose(f);
    csd_model_config c;
    csd_err err = {0};
    /* 32001 is outside the 32000-token vocabulary: refused, naming the file. */
    assert_int_equal(csd_model_config_load(&c, dir, &err), CSD_ERANGE);
    assert_non_null(strstr(err.msg, "generation_config.json"));
    /* Not JSON, and a key given twice: refused, naming the file and what is wrong. */
    static const char *const not_json[][2] = {
        {"{\"eos_token_id\": [2,", "not valid JSON"},
        {"{\"eos_token_id\": 2, \"eos_token_id\": 3}", "duplicate object key"}};
    for (int i = 0; i < 2; i++) {
        f = fopen(path, "w");
        assert_non_null(f);
        fputs(not_json[i][0], f);
        fclose(f);
        assert_int_equal(csd_model_config_load(&c, dir, &err), CSD_EFORMAT);
        assert_non_null(strstr(err.msg, "generation_config.json: not valid JSON"));
        if (!strstr(err.msg, not_json[i][1]))
            fail_msg("message '%s' lacks '%s'", err.msg, not_json[i][1]);
    }
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"eos_token_id\": [2, 31999, 7]}", f);
    fclose(f);
    int rc = csd_model_config_load(&c, dir, &err);
    if (rc) print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(c.n_eos, 3); /* 2 from config.json, then 31999 and 7 appended */
    assert_int_equal(c.eos_ids[0], 2);
    assert_int_equal(c.eos_ids[1], 31999);
    assert_int_equal(c.eos_ids[2], 7);
    unlink(path);
    assert_int_equal(csd_model_config_load(&c, dir, &err), 0);
    assert_int_equal(c.n_eos, 1);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    assert_int_equal(csd_model_config_load(&c, dir, &err), CSD_EIO);
    assert_non_null(strstr(err.msg, "config.json"));
    rmdir(dir);
}

/* base with rope_parameters set to rp_json; its rope_theta and rope_scaling removed unless
 * keep_old. */
static int parse_v5(const char *base, const char *rp_json, bool keep_old, csd_model_config *cfg,
                    csd_err *err) {
    json_t *root = json_loads(base, 0, NULL), *rp = json_loads(rp_json, 0, NULL);
    assert_non_null(root);
    assert_non_null(rp);
    if (!keep_old) {
        json_object_del(root, "rope_theta");
        json_object_del(root, "rope_scaling");
    }
    assert_int_equal(json_object_set_new(root, "rope_parameters", rp), 0);
    char *text = json_dumps(root, 0);
    json_decref(root);
    int rc = csd_model_config_parse(cfg, text, strlen(text), err);
    free(text);
    return rc;
}

#define LLAMA31_ROPE                                                                             \
    "{\"rope_theta\": 500000.0, \"rope_type\": \"llama3\", \"factor\": 8.0, "                  \
    "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "                                      \
    "\"original_max_position_embeddings\": 8192}"

static void test_rope_parameters(void **state) {
    (void)state;
    csd_model_config old, c;
    csd_err err = {0};
    assert_int_equal(csd_model_config_parse(&old, llama31_json, strlen(llama31_json), &err), 0);
    /* Llama 3.1 in the new form reads as in the old one; both forms together, when they agree */
    assert_int_equal(parse_v5(llama31_json, LLAMA31_ROPE, false, &c, &err), 0);
    assert_true(csd_model_config_equal(&old, &c));
    assert_int_equal(parse_v5(llama31_json, LLAMA31_ROPE, true, &c, &err), 0);
    assert_true(csd_model_config_equal(&old, &c));
    /* a default rope with its own base (Qwen3's 1e6) */
    assert_int_equal(
        parse_v5(llama2_json, "{\"rope_type\": \"default\", \"rope_theta\": 1000000.0}", false,
                 &c, &err),
        0);
    assert_true(c.rope_theta == 1000000.0f);
    assert_int_equal(c.rope_scaling, CSD_ROPE_SCALING_NONE);
    /* no type: the default rope */
    assert_int_equal(parse_v5(llama2_json, "{\"rope_theta\": 1000000.0}", false, &c, &err), 0);
    assert_true(c.rope_theta == 1000000.0f);
    assert_int_equal(c.rope_scaling, CSD_ROPE_SCALING_NONE);
    /* the old base beside the new scaling (no rope_scaling): what both state agrees */
    json_t *mixed = json_loads(llama31_json, 0, NULL);
    assert_non_null(mixed);
    json_object_del(mixed, "rope_scaling");
    char *mixed_text = json_dumps(mixed, 0);
    json_decref(mixed);
    assert_int_equal(parse_v5(mixed_text, LLAMA31_ROPE, true, &c, &err), 0);
    free(mixed_text);
    assert_true(csd_model_config_equal(&old, &c));
    /* llama3 scaling in rope_scaling, none in rope_parameters */
    assert_int_not_equal(
        parse_v5(llama31_json, "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}", true,
                 &c, &err),
        0);
    assert_non_null(strstr(err.msg, "rope_scaling and rope_parameters disagree"));
    /* refused: forms that disagree, a type or factor not implemented, per-layer-type nesting */
    const char *const refused[][2] = {
        {"{\"rope_type\": \"default\", \"rope_theta\": 20000.0}", "disagree"},
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_parameters type 'yarn'"},
        {"{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}", "partial_rotary"},
        {"{\"full_attention\": {\"rope_type\": \"default\"}}", "per layer type"},
        {"{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, "
         "\"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}",
         "rope_parameters high_freq_factor"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int rc = parse_v5(llama2_json, refused[i][0], i == 0, &c, &err);
        if (rc == 0 || !strstr(err.msg, refused[i][1]))
            print_error("%s: rc=%d msg='%s'\n", refused[i][0], rc, err.msg);
        assert_int_not_equal(rc, 0);
        assert_non_null(strstr(err.msg, refused[i][1]));
    }
    expect_refused(llama2_json, "partial_rotary_factor", "0.25", "partial_rotary_factor");
    expect_refused(llama2_json, "rope_parameters", "[1]", "rope_parameters is not an object");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),    cmocka_unit_test(test_llama),
        cmocka_unit_test(test_mistral),        cmocka_unit_test(test_qwen),
        cmocka_unit_test(test_unsupported),    cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_to_json_refusals), cmocka_unit_test(test_load_dir),
        cmocka_unit_test(test_rope_parameters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
