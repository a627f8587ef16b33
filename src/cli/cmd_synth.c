/* cmd_synth: `cascadia synth --arch A --preset P [--tokenizer DIR] --out DIR [--seed S]`: writes a
 * random-weight model of a real shape in the Hugging Face layout. Without --tokenizer it writes
 * a small built-in tokenizer so the demo needs no file from anywhere. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_util.h"
#include "commands.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "format/safetensors.h"
#include "model/synth.h"
#include "synth_tokenizer.h"
#include "tok/tokenizer.h"

static const char *const synth_usage =
    "usage: cascadia synth --arch llama|mistral|qwen2|qwen3 --preset NAME --out DIR\n"
    "                      [--tokenizer DIR] [--seed S] [--dtype f32|f16|bf16] [--force]\n"
    "                      [--attention-bias]\n"
    "       cascadia synth --list-presets\n"
    "Writes config.json, model.safetensors (random weights, deterministic for a seed) and the\n"
    "tokenizer files. Without --tokenizer, a small built-in tokenizer is written. A DIR that\n"
    "already holds a model is refused unless --force (its weights would be replaced).\n"
    "--attention-bias: q/k/v/o projections with biases (config attention_bias: true; not for\n"
    "qwen2, whose q/k/v biases are built in and whose o_proj has none).\n";

static void list_presets(void) {
    printf("%-16s %-8s %6s %6s %7s %5s %7s  %s\n", "preset", "family", "dim", "layers", "heads",
           "kv", "vocab", "mirrors");
    for (const csd_synth_preset *p = csd_synth_presets; p->name; p++) {
        char vocab[16];
        snprintf(vocab, sizeof vocab, "%lld", (long long)p->cfg.vocab_size);
        printf("%-16s %-8s %6lld %6lld %7lld %5lld %7s  %s\n", p->name,
               p->arch < 0 ? "any" : csd_arch_get(p->arch)->model_type, (long long)p->cfg.dim,
               (long long)p->cfg.n_layers, (long long)p->cfg.n_heads, (long long)p->cfg.n_kv_heads,
               p->cfg.vocab_size ? vocab : "tok", p->like);
    }
}

/* Copies DIR/name to out/name (bounded). Missing optional files are fine. */
static int copy_file(const char *dir, const char *out, const char *name, bool required,
                     csd_err *err) {
    char src[4096], dst[4096];
    if (csd_path_join(src, sizeof src, dir, name) || csd_path_join(dst, sizeof dst, out, name))
        return csd_err_set(err, CSD_ERANGE, "path too long");
    if (!required && !csd_file_exists(src)) return 0;
    char *data = NULL;
    size_t len = 0;
    int rc = csd_file_read_all(src, CSD_TOK_MAX_FILE_BYTES, &data, &len, err);
    if (!rc) rc = csd_file_write_all(dst, data, len, err);
    csd_free(data);
    return rc;
}

static int write_tokenizer(const char *tok_dir, const char *out, csd_err *err) {
    if (tok_dir) {
        int rc = copy_file(tok_dir, out, "tokenizer.json", true, err);
        if (!rc) rc = copy_file(tok_dir, out, "tokenizer_config.json", false, err);
        return rc;
    }
    char *tj = NULL, *cj = NULL, path[4096];
    int rc = csd_synth_tokenizer_json(&tj, &cj, err);
    if (!rc && !csd_path_join(path, sizeof path, out, "tokenizer.json"))
        rc = csd_file_write_all(path, tj, strlen(tj), err);
    if (!rc && !csd_path_join(path, sizeof path, out, "tokenizer_config.json"))
        rc = csd_file_write_all(path, cj, strlen(cj), err);
    csd_free(tj);
    csd_free(cj);
    return rc;
}

/* A model already in out (real weights, perhaps) is not overwritten without --force. */
static int check_out_free(const char *out, csd_err *err) {
    char config[4096];
    if (csd_path_join(config, sizeof config, out, "config.json"))
        return csd_err_set(err, CSD_ERANGE, "%s: path too long", out);
    const char *held = csd_file_exists(config) ? "config.json" : NULL;
    int rc = held ? 0 : csd_st_dir_weights(out, &held, err);
    if (!rc && held)
        rc = csd_err_set(err, CSD_EINVAL,
                         "%s already holds a model (%s): give another --out, or --force to "
                         "replace it with random weights",
                         out, held);
    return rc;
}

/* --attention-bias: biases on q, k, v and o, as attention_bias=true gives Llama and Qwen3. */
static int add_attention_bias(csd_model_config *cfg, const csd_arch_desc *arch, csd_err *err) {
    if (arch->qkv_bias)
        return csd_err_set(err, CSD_EINVAL,
                           "--attention-bias: %s has q/k/v biases built in and no o_proj bias",
                           arch->model_type);
    cfg->qkv_bias = cfg->o_bias = true;
    return 0;
}

static int synth(const char *arch_name, const char *preset_name, const char *tok_dir,
                 const char *out, uint64_t seed, int dtype, bool attention_bias, csd_err *err) {
    const csd_arch_desc *arch = csd_arch_find(arch_name);
    if (!arch)
        return csd_err_set(err, CSD_EUNSUPPORTED, "unknown --arch '%s' (supported: %s)", arch_name,
                           csd_arch_supported_list());
    const csd_synth_preset *preset = csd_synth_preset_find(preset_name);
    if (!preset)
        return csd_err_set(err, CSD_ENOTFOUND, "unknown --preset '%s' (see --list-presets)",
                           preset_name);
    if (mkdir(out, 0755) != 0 && errno != EEXIST)
        return csd_err_set(err, CSD_EIO, "%s: cannot create: %s", out, strerror(errno));
    int rc = write_tokenizer(tok_dir, out, err);
    csd_tok *tok = NULL;
    if (!rc) rc = csd_tok_load(&tok, out, err);
    csd_model_config cfg;
    if (!rc)
        rc = csd_synth_config(&cfg, preset, arch->arch, csd_tok_vocab_size(tok), csd_tok_bos(tok),
                              csd_tok_eos(tok), err);
    csd_tok_destroy(tok);
    if (!rc && attention_bias) rc = add_attention_bias(&cfg, arch, err);
    if (!rc) rc = csd_synth_write(&cfg, dtype >= 0 ? dtype : preset->dtype, seed, out, err);
    return rc;
}

int csd_cmd_synth(int argc, char **argv) {
    const char *arch = NULL, *preset = NULL, *tok_dir = NULL, *out = NULL;
    int64_t seed = 1;
    int dtype = -1;
    bool force = false, attention_bias = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(synth_usage, stdout);
            return 0;
        } else if (!strcmp(f, "--list-presets")) {
            list_presets();
            return 0;
        } else if (!strcmp(f, "--force")) {
            force = true;
        } else if (!strcmp(f, "--attention-bias")) {
            attention_bias = true;
        } else if (!value) {
            fprintf(stderr, "cascadia synth: %s needs a value\n%s", f, synth_usage);
            return 2;
        } else if (!strcmp(f, "--arch")) {
            arch = argv[++i];
        } else if (!strcmp(f, "--preset")) {
            preset = argv[++i];
        } else if (!strcmp(f, "--tokenizer")) {
            tok_dir = argv[++i];
        } else if (!strcmp(f, "--out")) {
            out = argv[++i];
        } else if (!strcmp(f, "--seed")) {
            if (!csd_cli_int("synth", f, value, 0, INT64_MAX, &seed)) return 2;
            i++;
        } else if (!strcmp(f, "--dtype")) {
            dtype = csd_dtype_parse(argv[++i]);
            if (dtype < 0 || dtype > CSD_DTYPE_BF16) {
                fprintf(stderr, "cascadia synth: --dtype must be f32, f16 or bf16\n");
                return 2;
            }
        } else {
            fprintf(stderr, "cascadia synth: unknown option '%s'\n%s", f, synth_usage);
            return 2;
        }
    }
    if (!arch || !preset || !out) {
        fprintf(stderr, "cascadia synth: --arch, --preset and --out are required\n%s", synth_usage);
        return 2;
    }
    csd_err err = {0};
    uint64_t t0 = csd_now_ns();
    int rc = force ? 0 : check_out_free(out, &err);
    if (!rc) rc = synth(arch, preset, tok_dir, out, (uint64_t)seed, dtype, attention_bias, &err);
    if (rc) {
        csd_cli_error("synth", &err);
        return 1;
    }
    fprintf(stderr, "wrote %s (%s, preset %s, seed %lld) in %.1f s\n", out, arch, preset,
            (long long)seed, (double)(csd_now_ns() - t0) * 1e-9);
    return 0;
}
