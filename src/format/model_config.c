/* model_config: Hugging Face config.json (plus generation_config.json's EOS ids) parsed into
 * csd_model_config, and the reverse. Every field is validated at this edge: required ones present,
 * integers in [1, CSD_MAX_*], heads dividing evenly, floats finite and positive; anything the
 * runtime cannot honour (other model types, rope types, activations) is refused by name.
 * The family table is arch.c; the field mapping is documented in docs/formats.md. */
#include "model_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "json_file.h"

/* config.json files are a few KB; a few MB allows big id2label maps and nothing hostile. */
#define CONFIG_MAX_BYTES (4u * 1024u * 1024u)
/* Bounds on float fields: beyond these a value is a typo or an attack, not a model. */
#define ROPE_THETA_MAX 1e12
#define ROPE_FACTOR_MAX 1024.0
/* Below these the frequencies overflow (1 / theta**x, f / factor) and every logit is NaN; real
 * models use theta 10^4-10^7 and factors 1-64. */
#define ROPE_THETA_MIN 1.0
#define ROPE_FACTOR_MIN 1e-3
#define CONFIG_PATH_MAX 4096

/* ---- field readers: absent and null mean "use the default" unless the field is required ---- */

static bool absent(const json_t *v) { return !v || json_is_null(v); }

static int get_int(const json_t *root, const char *key, bool required, int64_t def, int64_t lo,
                   int64_t hi, int64_t *out, csd_err *err) {
    const json_t *v = json_object_get(root, key);
    if (absent(v)) {
        if (required) return csd_err_set(err, CSD_EFORMAT, "config: %s is missing", key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return csd_err_set(err, CSD_EFORMAT, "config: %s is not an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return csd_err_set(err, CSD_ERANGE, "config: %s = %lld is out of range [%lld, %lld]", key,
                           (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

/* A JSON number (integer or real) in (lo, hi], stored as float. */
static int get_float(const json_t *obj, const char *where, const char *key, bool required,
                     double def, double lo, double hi, float *out, csd_err *err) {
    const json_t *v = json_object_get(obj, key);
    if (absent(v)) {
        if (required) return csd_err_set(err, CSD_EFORMAT, "config: %s%s is missing", where, key);
        *out = (float)def;
        return 0;
    }
    if (!json_is_number(v))
        return csd_err_set(err, CSD_EFORMAT, "config: %s%s is not a number", where, key);
    double x = json_number_value(v);
    if (!isfinite(x) || !(x > lo) || x > hi || !isfinite((float)x) || (float)x <= 0.0f)
        return csd_err_set(err, CSD_ERANGE, "config: %s%s = %g is out of range (%g, %g]", where,
                           key, x, lo, hi);
    *out = (float)x;
    return 0;
}

static int get_bool(const json_t *root, const char *key, bool def, bool *out, csd_err *err) {
    const json_t *v = json_object_get(root, key);
    if (absent(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return csd_err_set(err, CSD_EFORMAT, "config: %s is not true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* Appends token id x to the EOS list unless already there. */
static int add_eos(csd_model_config *cfg, const json_t *v, const char *where, csd_err *err) {
    if (!json_is_integer(v))
        return csd_err_set(err, CSD_EFORMAT, "%seos_token_id entries must be integers", where);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x >= cfg->vocab_size)
        return csd_err_set(err, CSD_ERANGE,
                           "%seos_token_id %lld is outside the vocabulary [0, %lld)",
                           where, (long long)x, (long long)cfg->vocab_size);
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == (int)x) return 0;
    if (cfg->n_eos >= CSD_MAX_EOS)
        return csd_err_set(err, CSD_ERANGE, "%smore than %d distinct eos_token_id values", where,
                           CSD_MAX_EOS);
    cfg->eos_ids[cfg->n_eos++] = (int)x;
    return 0;
}

/* eos_token_id: absent, null, an int, or a list of ints. */
static int add_eos_field(csd_model_config *cfg, const json_t *root, const char *where,
                         csd_err *err) {
    const json_t *v = json_object_get(root, "eos_token_id");
    if (absent(v)) return 0;
    if (!json_is_array(v)) return add_eos(cfg, v, where, err);
    for (size_t i = 0; i < json_array_size(v); i++) {
        int rc = add_eos(cfg, json_array_get(v, i), where, err);
        if (rc != 0) return rc;
    }
    return 0;
}

/* ---- rope_scaling ---- */

/* The scaling object rs (named `where`: rope_scaling, or transformers 5's rope_parameters) into
 * cfg. */
static int parse_scaling_object(csd_model_config *cfg, const json_t *rs, const char *where,
                                csd_err *err) {
    cfg->rope_scaling = CSD_ROPE_SCALING_NONE;
    cfg->rope_factor = 1.0f;
    if (absent(rs)) return 0;
    if (!json_is_object(rs))
        return csd_err_set(err, CSD_EFORMAT, "config: %s is not an object or null", where);
    /* Newer configs say "rope_type", older ones "type"; they must agree when both appear. */
    const json_t *t1 = json_object_get(rs, "rope_type"), *t2 = json_object_get(rs, "type");
    const json_t *t = t1 ? t1 : t2;
    if (!json_is_string(t) || (t1 && t2 && !json_equal(t1, t2)))
        return csd_err_set(err, CSD_EFORMAT, "config: %s needs one string rope_type (or type)",
                           where);
    const char *type = json_string_value(t);
    char at[48]; /* at before a field's name in messages */
    snprintf(at, sizeof at, "%s.", where);
    int rc;
    if (strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "linear") == 0) {
        cfg->rope_scaling = CSD_ROPE_SCALING_LINEAR;
        return get_float(rs, at, "factor", true, 1.0, ROPE_FACTOR_MIN, ROPE_FACTOR_MAX,
                         &cfg->rope_factor, err);
    }
    if (strcmp(type, "llama3") != 0)
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "config: %s type '%.40s' is not supported (llama3, linear)", where,
                           type);
    cfg->rope_scaling = CSD_ROPE_SCALING_LLAMA3;
    if ((rc = get_float(rs, at, "factor", true, 1.0, ROPE_FACTOR_MIN, ROPE_FACTOR_MAX,
                        &cfg->rope_factor, err)) != 0 ||
        (rc = get_float(rs, at, "low_freq_factor", true, 1.0, 0.0, ROPE_FACTOR_MAX,
                        &cfg->rope_low_freq_factor, err)) != 0 ||
        (rc = get_float(rs, at, "high_freq_factor", true, 1.0, 0.0,
                        ROPE_FACTOR_MAX, &cfg->rope_high_freq_factor, err)) != 0 ||
        (rc = get_int(rs, "original_max_position_embeddings", true, 0, 1, CSD_MAX_CONTEXT,
                      &cfg->rope_orig_max_pos, err)) != 0)
        return rc;
    /* The llama3 formula divides by (high - low): equal factors would divide by zero. */
    if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
        return csd_err_set(err, CSD_ERANGE,
                           "config: %s high_freq_factor (%g) must exceed low_freq_factor (%g)",
                           where, (double)cfg->rope_high_freq_factor,
                           (double)cfg->rope_low_freq_factor);
    return 0;
}

/* partial_rotary_factor (at the top or in rope_parameters): RoPE on a part of each head is not
 * implemented, so anything but 1 is refused rather than computed as a whole rotation. */
static int check_partial_rotary(const json_t *obj, const char *where, csd_err *err) {
    const json_t *v = json_object_get(obj, "partial_rotary_factor");
    if (absent(v) || (json_is_number(v) && json_number_value(v) == 1.0)) return 0;
    return csd_err_set(err, CSD_EUNSUPPORTED,
                       "config: %spartial_rotary_factor other than 1 is not supported", where);
}

/* The same rotary embedding: base and scaling (the rope_* parameters only mean something for the
 * scaling type that uses them). */
static bool scaling_equal(const csd_model_config *a, const csd_model_config *b) {
    if (a->rope_scaling != b->rope_scaling) return false;
    if (a->rope_scaling != CSD_ROPE_SCALING_NONE && a->rope_factor != b->rope_factor) return false;
    return a->rope_scaling != CSD_ROPE_SCALING_LLAMA3 ||
           (a->rope_low_freq_factor == b->rope_low_freq_factor &&
            a->rope_high_freq_factor == b->rope_high_freq_factor &&
            a->rope_orig_max_pos == b->rope_orig_max_pos);
}

static bool rope_equal(const csd_model_config *a, const csd_model_config *b) {
    return a->rope_theta == b->rope_theta && scaling_equal(a, b);
}

/* transformers 5 writes "rope_parameters": {"rope_theta": ..., "rope_type": ..., factors} in
 * place of rope_theta and rope_scaling. Either form is read (rope_parameters without a type is
 * the default rope); what both forms state (a config written for old and new readers) must be
 * the same. */
static int parse_rope(csd_model_config *cfg, const json_t *root, csd_err *err) {
    int rc;
    if ((rc = check_partial_rotary(root, "", err)) != 0 ||
        (rc = get_float(root, "", "rope_theta", false, 10000.0, ROPE_THETA_MIN, ROPE_THETA_MAX,
                        &cfg->rope_theta, err)) != 0 ||
        (rc = parse_scaling_object(cfg, json_object_get(root, "rope_scaling"), "rope_scaling",
                                   err)) != 0)
        return rc;
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (absent(rp)) return 0;
    if (!json_is_object(rp))
        return csd_err_set(err, CSD_EFORMAT, "config: rope_parameters is not an object or null");
    const char *key;
    const json_t *v;
    json_object_foreach ((json_t *)rp, key, v) {
        if (json_is_object(v))
            return csd_err_set(err, CSD_EUNSUPPORTED,
                               "config: rope_parameters per layer type ('%.40s') is not supported",
                               key);
    }
    csd_model_config old = *cfg, neu = *cfg;
    bool typed = json_object_get(rp, "rope_type") || json_object_get(rp, "type");
    if ((rc = check_partial_rotary(rp, "rope_parameters.", err)) != 0 ||
        (rc = get_float(rp, "rope_parameters.", "rope_theta", false, old.rope_theta,
                        ROPE_THETA_MIN, ROPE_THETA_MAX, &neu.rope_theta, err)) != 0 ||
        (rc = parse_scaling_object(&neu, typed ? rp : NULL, "rope_parameters", err)) != 0)
        return rc;
    if (!absent(json_object_get(root, "rope_theta")) &&
        !absent(json_object_get(rp, "rope_theta")) && old.rope_theta != neu.rope_theta)
        return csd_err_set(err, CSD_EFORMAT, "config: rope_theta and rope_parameters disagree");
    if (!absent(json_object_get(root, "rope_scaling")) && !scaling_equal(&old, &neu))
        return csd_err_set(err, CSD_EFORMAT, "config: rope_scaling and rope_parameters disagree");
    *cfg = neu;
    return 0;
}

/* ---- the whole object ---- */

static int parse_dtype(csd_model_config *cfg, const json_t *root, csd_err *err) {
    /* transformers >= 4.56 writes "dtype"; older versions "torch_dtype". */
    const char *key = "torch_dtype";
    const json_t *v = json_object_get(root, key);
    if (absent(v)) v = json_object_get(root, key = "dtype");
    cfg->torch_dtype = CSD_DTYPE_F32;
    if (absent(v)) return 0;
    if (!json_is_string(v))
        return csd_err_set(err, CSD_EFORMAT, "config: %s is not a string", key);
    const char *s = json_string_value(v);
    if (strcmp(s, "float32") == 0) cfg->torch_dtype = CSD_DTYPE_F32;
    else if (strcmp(s, "float16") == 0) cfg->torch_dtype = CSD_DTYPE_F16;
    else if (strcmp(s, "bfloat16") == 0) cfg->torch_dtype = CSD_DTYPE_BF16;
    else
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "config: %s '%.40s' is not supported (float32, float16, bfloat16)", key,
                           s);
    return 0;
}

static int parse_heads(csd_model_config *cfg, const json_t *root, csd_err *err) {
    int rc;
    if ((rc = get_int(root, "num_attention_heads", true, 0, 1, CSD_MAX_DIM, &cfg->n_heads,
                      err)) != 0 ||
        (rc = get_int(root, "num_key_value_heads", false, cfg->n_heads, 1, cfg->n_heads,
                      &cfg->n_kv_heads, err)) != 0)
        return rc;
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return csd_err_set(err, CSD_EFORMAT,
                           "config: num_attention_heads (%lld) is not a multiple of "
                           "num_key_value_heads (%lld)",
                           (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
    if (absent(json_object_get(root, "head_dim")) && cfg->dim % cfg->n_heads != 0)
        return csd_err_set(err, CSD_EFORMAT,
                           "config: hidden_size (%lld) is not divisible by num_attention_heads "
                           "(%lld) and no head_dim is given",
                           (long long)cfg->dim, (long long)cfg->n_heads);
    if ((rc = get_int(root, "head_dim", false, cfg->dim / cfg->n_heads, 1, CSD_MAX_DIM,
                      &cfg->head_dim, err)) != 0)
        return rc;
    if (cfg->head_dim % 2 != 0) /* RoPE rotates pairs of dimensions */
        return csd_err_set(err, CSD_EFORMAT, "config: head_dim %lld is odd; RoPE needs it even",
                           (long long)cfg->head_dim);
    if (cfg->n_heads * cfg->head_dim > CSD_MAX_DIM)
        return csd_err_set(err, CSD_ERANGE,
                           "config: num_attention_heads * head_dim = %lld exceeds %d",
                           (long long)(cfg->n_heads * cfg->head_dim), CSD_MAX_DIM);
    return 0;
}

/* Fields with no family-specific meaning; validated in dependency order. */
static int parse_root(csd_model_config *cfg, const json_t *root, csd_err *err) {
    const json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return csd_err_set(err, CSD_EFORMAT, "config: model_type is missing (supported: %s)",
                           csd_arch_supported_list());
    const csd_arch_desc *row = csd_arch_find(json_string_value(mt));
    if (!row)
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "config: model_type '%.40s' is not supported (supported: %s)",
                           json_string_value(mt), csd_arch_supported_list());
    cfg->arch = row->arch;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", row->model_type);

    int rc;
    if ((rc = get_int(root, "hidden_size", true, 0, 1, CSD_MAX_DIM, &cfg->dim, err)) != 0 ||
        (rc = get_int(root, "intermediate_size", true, 0, 1, CSD_MAX_DIM, &cfg->hidden_dim,
                      err)) != 0 ||
        (rc = get_int(root, "num_hidden_layers", true, 0, 1, CSD_MAX_LAYERS, &cfg->n_layers,
                      err)) != 0 ||
        (rc = parse_heads(cfg, root, err)) != 0 ||
        (rc = get_int(root, "vocab_size", true, 0, 1, CSD_MAX_VOCAB, &cfg->vocab_size, err)) !=
            0 ||
        (rc = get_int(root, "max_position_embeddings", true, 0, 1, CSD_MAX_CONTEXT,
                      &cfg->max_seq_len, err)) != 0 ||
        (rc = get_float(root, "", "rms_norm_eps", false, 1e-6, 0.0, 1.0, &cfg->norm_eps, err)) !=
            0 ||
        (rc = parse_rope(cfg, root, err)) != 0 ||
        (rc = get_bool(root, "tie_word_embeddings", false, &cfg->tie_embeddings, err)) != 0 ||
        (rc = parse_dtype(cfg, root, err)) != 0)
        return rc;

    /* Sliding window: honoured for families whose row says so; refused where it would be
     * silently ignored (Qwen2's use_sliding_window). */
    bool use_sw = false;
    if (row->uses_sliding_window) {
        /* absent is transformers' MistralConfig default (4096); null is full attention */
        int64_t def = json_object_get(root, "sliding_window") ? 0 : 4096;
        if ((rc = get_int(root, "sliding_window", false, def, 0, CSD_MAX_CONTEXT,
                          &cfg->sliding_window, err)) != 0)
            return rc;
    } else {
        if ((rc = get_bool(root, "use_sliding_window", false, &use_sw, err)) != 0) return rc;
        if (use_sw)
            return csd_err_set(err, CSD_EUNSUPPORTED,
                               "config: use_sliding_window=true is not supported for %s",
                               row->model_type);
    }

    bool attn_bias = false, mlp_bias = false;
    if ((rc = get_bool(root, "attention_bias", false, &attn_bias, err)) != 0 ||
        (rc = get_bool(root, "mlp_bias", false, &mlp_bias, err)) != 0)
        return rc;
    if (mlp_bias)
        return csd_err_set(err, CSD_EUNSUPPORTED, "config: mlp_bias=true is not supported");
    cfg->qkv_bias = row->qkv_bias || attn_bias;
    cfg->o_bias = attn_bias && !row->qkv_bias; /* as transformers builds each family's o_proj */
    cfg->qk_norm = row->qk_norm;
    const json_t *act = json_object_get(root, "hidden_act");
    if (!absent(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "config: hidden_act must be \"silu\" (the only supported activation)");

    int64_t bos;
    if ((rc = get_int(root, "bos_token_id", false, -1, 0, cfg->vocab_size - 1, &bos, err)) != 0)
        return rc;
    cfg->bos_id = (int)bos;
    return add_eos_field(cfg, root, "config: ", err);
}

int csd_model_config_parse(csd_model_config *cfg, const char *json, size_t len, csd_err *err) {
    memset(cfg, 0, sizeof *cfg);
    if (!json && len) return csd_err_set(err, CSD_EINVAL, "config: NULL text");
    if (len > CONFIG_MAX_BYTES)
        return csd_err_set(err, CSD_ERANGE, "config: %zu bytes, limit %u", len, CONFIG_MAX_BYTES);
    json_error_t je;
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return csd_err_set(err, CSD_EFORMAT, "config: not valid JSON: %s (line %d, column %d)",
                           je.text, je.line, je.column);
    int rc = json_is_object(root)
                 ? parse_root(cfg, root, err)
                 : csd_err_set(err, CSD_EFORMAT, "config: top level is not a JSON object");
    json_decref(root);
    return rc;
}

/* ---- loading from a model directory ---- */

/* Appends generation_config.json's eos_token_id values (int or list) to cfg. */
static int merge_generation_config(csd_model_config *cfg, const char *path, csd_err *err) {
    json_t *root = NULL;
    int rc = csd_json_read_file(path, CONFIG_MAX_BYTES, &root, err);
    if (rc != 0) return rc;
    char where[CONFIG_PATH_MAX + 8];
    snprintf(where, sizeof where, "%s: ", path);
    rc = json_is_object(root) ? add_eos_field(cfg, root, where, err)
                              : csd_err_set(err, CSD_EFORMAT, "%s: not a JSON object", path);
    json_decref(root);
    return rc;
}

int csd_model_config_load(csd_model_config *cfg, const char *model_dir, csd_err *err) {
    memset(cfg, 0, sizeof *cfg);
    char path[CONFIG_PATH_MAX];
    if (csd_path_join(path, sizeof path, model_dir, "config.json") != 0)
        return csd_err_set(err, CSD_ERANGE, "%s: path too long", model_dir);
    char *text = NULL;
    size_t len = 0;
    int rc = csd_file_read_all(path, CONFIG_MAX_BYTES, &text, &len, err);
    if (rc != 0) return rc;
    rc = csd_model_config_parse(cfg, text, len, err);
    csd_free(text);
    if (rc != 0) {
        csd_err_prefix(err, "%s: ", path);
        return rc;
    }
    if (csd_path_join(path, sizeof path, model_dir, "generation_config.json") != 0)
        return csd_err_set(err, CSD_ERANGE, "%s: path too long", model_dir);
    if (csd_file_exists(path)) return merge_generation_config(cfg, path, err);
    return 0;
}

/* ---- serialising ---- */

/* A JSON real whose shortest decimal form reads back as exactly f; *prec tracks the digits the
 * dump needs (the largest over all reals), so 1e-05f prints as 1e-05, not 9.99999975e-06. */
static json_t *real_of(float f, int *prec) {
    char buf[64];
    int p = 6;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    snprintf(buf, sizeof buf, "%.*g", p, (double)f);
    if (p > *prec) *prec = p;
    return json_real(strtod(buf, NULL));
}

static json_t *int_or_null(int64_t v) { return v < 0 ? json_null() : json_integer(v); }

static json_t *rope_scaling_json(const csd_model_config *cfg, int *prec) {
    switch (cfg->rope_scaling) {
    case CSD_ROPE_SCALING_LINEAR:
        return json_pack("{s:s, s:o}", "rope_type", "linear", "factor",
                         real_of(cfg->rope_factor, prec));
    case CSD_ROPE_SCALING_LLAMA3:
        return json_pack("{s:s, s:o, s:o, s:o, s:I}", "rope_type", "llama3", "factor",
                         real_of(cfg->rope_factor, prec), "low_freq_factor",
                         real_of(cfg->rope_low_freq_factor, prec), "high_freq_factor",
                         real_of(cfg->rope_high_freq_factor, prec),
                         "original_max_position_embeddings", (json_int_t)cfg->rope_orig_max_pos);
    default: return json_null();
    }
}

static json_t *eos_json(const csd_model_config *cfg) {
    if (cfg->n_eos == 0) return json_null();
    if (cfg->n_eos == 1) return json_integer(cfg->eos_ids[0]);
    json_t *a = json_array();
    for (int i = 0; a && i < cfg->n_eos; i++)
        if (json_array_append_new(a, json_integer(cfg->eos_ids[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Refuses structs that no config.json could produce, so to_json never writes a lie. */
static int check_expressible(const csd_model_config *cfg, const csd_arch_desc *row, csd_err *err) {
    if (!row) return csd_err_set(err, CSD_EINVAL, "config to_json: unknown arch %d", cfg->arch);
    if (cfg->model_type[0] && strcmp(cfg->model_type, row->model_type) != 0)
        return csd_err_set(err, CSD_EINVAL, "config to_json: model_type '%.31s' is not arch %s",
                           cfg->model_type, row->model_type);
    if (cfg->qk_norm != row->qk_norm || (row->qkv_bias && !cfg->qkv_bias) ||
        cfg->o_bias != (!row->qkv_bias && cfg->qkv_bias)) /* one attention_bias says both */
        return csd_err_set(err, CSD_EINVAL,
                           "config to_json: qk_norm/qkv_bias/o_bias contradict %s",
                           row->model_type);
    if (cfg->sliding_window != 0 && !row->uses_sliding_window)
        return csd_err_set(err, CSD_EINVAL, "config to_json: %s has no sliding window",
                           row->model_type);
    if (cfg->n_eos < 0 || cfg->n_eos > CSD_MAX_EOS)
        return csd_err_set(err, CSD_EINVAL, "config to_json: n_eos %d", cfg->n_eos);
    if (cfg->torch_dtype != CSD_DTYPE_F32 && cfg->torch_dtype != CSD_DTYPE_F16 &&
        cfg->torch_dtype != CSD_DTYPE_BF16)
        return csd_err_set(err, CSD_EINVAL, "config to_json: torch_dtype %d", cfg->torch_dtype);
    if (cfg->rope_scaling < 0 || cfg->rope_scaling >= CSD_ROPE_SCALING_COUNT)
        return csd_err_set(err, CSD_EINVAL, "config to_json: rope_scaling %d", cfg->rope_scaling);
    return 0;
}

int csd_model_config_to_json(const csd_model_config *cfg, char **out, csd_err *err) {
    *out = NULL;
    const csd_arch_desc *row = csd_arch_get(cfg->arch);
    int rc = check_expressible(cfg, row, err);
    if (rc != 0) return rc;
    static const char *const dtype_names[] = {
        [CSD_DTYPE_F32] = "float32", [CSD_DTYPE_F16] = "float16", [CSD_DTYPE_BF16] = "bfloat16"};
    int prec = 1;
    json_t *root = json_pack(
        "{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:s, s:b, s:b, s:o, "
        "s:o, s:s}",
        "architectures", csd_arch_hf_class(cfg->arch), "model_type", row->model_type,
        "hidden_size", (json_int_t)cfg->dim, "intermediate_size", (json_int_t)cfg->hidden_dim,
        "num_hidden_layers", (json_int_t)cfg->n_layers, "num_attention_heads",
        (json_int_t)cfg->n_heads, "num_key_value_heads", (json_int_t)cfg->n_kv_heads, "head_dim",
        (json_int_t)cfg->head_dim, "vocab_size", (json_int_t)cfg->vocab_size,
        "max_position_embeddings", (json_int_t)cfg->max_seq_len, "rms_norm_eps",
        real_of(cfg->norm_eps, &prec), "rope_theta", real_of(cfg->rope_theta, &prec),
        "rope_scaling", rope_scaling_json(cfg, &prec), "hidden_act", "silu",
        "tie_word_embeddings", (int)cfg->tie_embeddings, "mlp_bias", 0, "bos_token_id",
        int_or_null(cfg->bos_id), "eos_token_id", eos_json(cfg), "torch_dtype",
        dtype_names[cfg->torch_dtype]);
    /* Only families without built-in biases spell the bias switch out. */
    if (root && !row->qkv_bias &&
        json_object_set_new(root, "attention_bias", json_boolean(cfg->qkv_bias)) != 0) {
        json_decref(root);
        root = NULL;
    }
    if (root && row->uses_sliding_window &&
        json_object_set_new(root, "sliding_window", cfg->sliding_window > 0
                                                        ? json_integer(cfg->sliding_window)
                                                        : json_null()) != 0) {
        json_decref(root);
        root = NULL;
    }
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(prec)) : NULL;
    json_decref(root);
    if (!text) return csd_err_set(err, CSD_ENOMEM, "config to_json: out of memory");

    /* The guarantee: the text parses back to the same struct. Anything else (a zero dimension, an
     * eos id outside the vocabulary, ...) means the struct was not a valid config. */
    size_t len = strlen(text);
    csd_model_config back;
    csd_model_config want = *cfg; /* a hand-built struct may leave model_type empty */
    if (!want.model_type[0])
        snprintf(want.model_type, sizeof want.model_type, "%s", row->model_type);
    rc = csd_model_config_parse(&back, text, len, err);
    if (rc == 0 && !csd_model_config_equal(&want, &back))
        rc = csd_err_set(err, CSD_EINVAL, "config to_json: struct does not round-trip");
    if (rc != 0) {
        free(text);
        if (err && err->code == rc) csd_err_prefix(err, "config to_json: invalid struct: ");
        return rc == CSD_ENOMEM ? rc : CSD_EINVAL;
    }
    *out = csd_alloc(len + 1);
    if (*out) memcpy(*out, text, len + 1);
    free(text); /* jansson's allocator */
    return *out ? 0 : csd_err_set(err, CSD_ENOMEM, "config to_json: out of memory");
}

bool csd_model_config_equal(const csd_model_config *a, const csd_model_config *b) {
    if (a->n_eos != b->n_eos || !rope_equal(a, b)) return false;
    for (int i = 0; i < a->n_eos && i < CSD_MAX_EOS; i++)
        if (a->eos_ids[i] != b->eos_ids[i]) return false;
    return a->arch == b->arch &&
           strncmp(a->model_type, b->model_type, sizeof a->model_type) == 0 && a->dim == b->dim &&
           a->hidden_dim == b->hidden_dim && a->n_layers == b->n_layers &&
           a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->vocab_size == b->vocab_size &&
           a->max_seq_len == b->max_seq_len && a->norm_eps == b->norm_eps &&
           a->sliding_window == b->sliding_window &&
           a->tie_embeddings == b->tie_embeddings && a->qkv_bias == b->qkv_bias &&
           a->o_bias == b->o_bias && a->qk_norm == b->qk_norm && a->bos_id == b->bos_id &&
           a->torch_dtype == b->torch_dtype;
}
