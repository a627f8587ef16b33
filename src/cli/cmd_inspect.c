/* cmd_inspect: `cascadia inspect MODEL_DIR|EXPORT_DIR|manifest.json|FILE.shard`: what was
 * understood of a model directory (the family, every hyperparameter, the tensors found, and the
 * memory a stage of it needs), of an export (its manifest, checked against the shards on disk) or
 * of one shard (header, config, tensors, every checksum verified). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "cli_util.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "format/manifest.h"
#include "format/safetensors.h"
#include "format/shard.h"
#include "model/shard_model.h"
#include "model/stage_plan.h"

static const char *const inspect_usage =
    "usage: cascadia inspect MODEL_DIR | EXPORT_DIR | EXPORT_DIR/manifest.json | FILE.shard\n";

static void print_config(const csd_model_config *c) {
    const csd_arch_desc *a = csd_arch_get(c->arch);
    printf("family          %s (model_type %s)\n", a ? a->display_name : "?", c->model_type);
    printf("layers          %lld\n", (long long)c->n_layers);
    printf("hidden          %lld (intermediate %lld)\n", (long long)c->dim,
           (long long)c->hidden_dim);
    printf("heads           %lld query, %lld key/value, head_dim %lld\n", (long long)c->n_heads,
           (long long)c->n_kv_heads, (long long)c->head_dim);
    printf("vocab           %lld\n", (long long)c->vocab_size);
    printf("context         %lld\n", (long long)c->max_seq_len);
    printf("norm            RMSNorm eps %g%s\n", (double)c->norm_eps,
           c->qk_norm ? ", q/k norm per head" : "");
    printf("rope            theta %g, rotate-half", (double)c->rope_theta);
    if (c->rope_scaling == CSD_ROPE_SCALING_LLAMA3)
        printf(", llama3 scaling factor %g low %g high %g original %lld", (double)c->rope_factor,
               (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor,
               (long long)c->rope_orig_max_pos);
    else if (c->rope_scaling == CSD_ROPE_SCALING_LINEAR)
        printf(", linear scaling factor %g", (double)c->rope_factor);
    printf("\n");
    printf("attention       %s%s\n", c->sliding_window ? "sliding window" : "full causal",
           c->o_bias ? ", q/k/v/o biases" : c->qkv_bias ? ", q/k/v biases" : "");
    if (c->sliding_window) printf("window          %lld\n", (long long)c->sliding_window);
    printf("embeddings      %s\n",
           c->tie_embeddings ? "tied to the output head" : "separate output head");
    printf("bos/eos         %d /", c->bos_id);
    for (int i = 0; i < c->n_eos; i++) printf(" %d", c->eos_ids[i]);
    printf("\ndtype           %s\n", csd_dtype_name(c->torch_dtype));
}

static void print_tensors(const csd_st_set *st) {
    size_t bytes = 0;
    int64_t params = 0;
    for (int i = 0; i < csd_st_count(st); i++) {
        const csd_st_tensor *t = csd_st_at(st, i);
        /* a zero dim makes the product 0 before any other may overflow (the reader checks the
         * products of tensors that are not empty) */
        int64_t n = 1;
        for (int d = 0; d < t->n_dims; d++) n = t->shape[d] == 0 ? 0 : n;
        for (int d = 0; d < t->n_dims && n; d++) n *= t->shape[d];
        params += n;
        bytes += t->nbytes;
    }
    printf("tensors         %d, %.3f B parameters, %.1f MiB on disk\n", csd_st_count(st),
           (double)params * 1e-9, (double)bytes / (1 << 20));
}

static void print_memory(const csd_model_config *c) {
    int64_t kv_dim = c->n_kv_heads * c->head_dim;
    double kv_per_tok = 2.0 * (double)c->n_layers * (double)kv_dim * 2; /* f16 K and V */
    printf("kv cache        %.1f KiB per token (f16), %.1f MiB at 4096 tokens\n", kv_per_tok / 1024,
           kv_per_tok * 4096 / (1 << 20));
    int64_t layer_params =
        c->dim * (c->n_heads * c->head_dim) * 2 + c->dim * kv_dim * 2 + 3 * c->dim * c->hidden_dim;
    printf("per layer       %.1f M parameters: %.1f MiB int4, %.1f MiB int8, %.1f MiB f16\n",
           (double)layer_params * 1e-6, (double)layer_params * (0.5 + 2.0 / 128) / (1 << 20),
           (double)layer_params * (1 + 2.0 / 128) / (1 << 20),
           (double)layer_params * 2 / (1 << 20));
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static void print_hash(const char *label, const uint8_t hash[CSD_SHARD_HASH_BYTES]) {
    char hex[2 * CSD_SHARD_HASH_BYTES + 1];
    csd_shard_hash_hex(hash, hex);
    printf("%-16s%s\n", label, hex);
}

static int inspect_shard(const char *path) {
    csd_err err = {0};
    csd_model_shard *s = NULL;
    if (csd_model_shard_open(&s, path, &err)) {
        csd_cli_error("inspect", &err);
        return 1;
    }
    const csd_shard_header *h = csd_shard_hdr(s->file);
    char b1[32], b2[32];
    printf("shard           %s\n", path);
    printf("format          version %u, kernel layout %u, %llu bytes\n", h->version,
           h->kernel_layout, (unsigned long long)h->file_bytes);
    printf("stage           %u of %u\n", h->stage_index, h->stage_count);
    printf("layers          [%lld, %lld) of %lld%s%s\n", (long long)h->layer_begin,
           (long long)h->layer_end, (long long)h->n_layers, h->has_embed ? ", embeddings" : "",
           h->has_head ? ", final norm + head" : "");
    printf("precision       %s\n", csd_dtype_name(h->precision));
    print_hash("model hash", h->model_hash);
    printf("header checksum %016llx\n", (unsigned long long)h->header_checksum);
    print_config(&s->cfg);
    int n = csd_shard_count(s->file), per_dtype[CSD_DTYPE_COUNT] = {0};
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        const csd_shard_tensor *t = csd_shard_at(s->file, i);
        bytes += t->nbytes;
        per_dtype[t->dtype]++;
    }
    printf("tensors         %d, %s (", n, csd_plan_fmt_bytes(bytes, b1, sizeof b1));
    const char *sep = "";
    for (int d = 0; d < CSD_DTYPE_COUNT; d++)
        if (per_dtype[d]) {
            printf("%s%d %s", sep, per_dtype[d], csd_dtype_name(d));
            sep = ", ";
        }
    printf("), every checksum verified\n");
    int64_t kv_dim = s->cfg.n_kv_heads * s->cfg.head_dim, layers = h->layer_end - h->layer_begin;
    char b3[32];
    printf("memory          weights %s + KV %s per token (f16; %s f32)\n", b1,
           csd_plan_fmt_bytes((uint64_t)(2 * layers * kv_dim * 2), b2, sizeof b2),
           csd_plan_fmt_bytes((uint64_t)(2 * layers * kv_dim * 4), b3, sizeof b3));
    csd_model_shard_close(s);
    return 0;
}

static int inspect_manifest(const char *path) {
    csd_err err = {0};
    csd_manifest *m = NULL;
    if (csd_manifest_load(&m, path, &err)) {
        csd_cli_error("inspect", &err);
        return 1;
    }
    char b1[32], b2[32], b3[32], b4[32];
    printf("export          %s\n", m->dir);
    printf("exported by     %s\n", m->exported_by[0] ? m->exported_by : "(not recorded)");
    printf("precision       %s\n", csd_dtype_name(m->precision));
    print_hash("model hash", m->model_hash);
    printf("files          ");
    for (int i = 0; i < m->n_files; i++) printf(" %s", m->files[i]);
    printf("%s\n", m->n_files ? "" : " (none)");
    print_config(&m->cfg);
    printf("stages          %d (memory estimate for %lld tokens x %lld slots, %s KV cache)\n",
           m->n_stages, (long long)m->ctx, (long long)m->slots, csd_dtype_name(m->kv_dtype));
    printf("  %-3s %-16s %-14s %-13s %11s %11s %12s %11s  %s\n", "#", "file", "layers", "holds",
           "bytes", "weights", "KV/token", "memory", "checksum");
    uint64_t total = 0;
    for (int i = 0; i < m->n_stages; i++) {
        const csd_manifest_stage *s = &m->stages[i];
        char layers[32];
        snprintf(layers, sizeof layers, "[%lld, %lld)", (long long)s->layer_begin,
                 (long long)s->layer_end);
        total += s->bytes;
        printf("  %-3d %-16s %-14s %-13s %11s %11s %12s %11s  %016llx\n", i, s->file, layers,
               s->has_embed && s->has_head ? "embed+head"
               : s->has_embed              ? "embed"
               : s->has_head               ? "head"
                                           : "-",
               csd_plan_fmt_bytes(s->bytes, b1, sizeof b1),
               csd_plan_fmt_bytes(s->weight_bytes, b2, sizeof b2),
               csd_plan_fmt_bytes(s->kv_bytes_per_token, b3, sizeof b3),
               csd_plan_fmt_bytes(s->memory_bytes, b4, sizeof b4), (unsigned long long)s->checksum);
    }
    printf("total           %s on disk\n", csd_plan_fmt_bytes(total, b1, sizeof b1));
    if (m->stages[0].machine_bytes) {
        printf("planned for    ");
        for (int i = 0; i < m->n_stages; i++)
            printf(" %s%s", csd_plan_fmt_bytes(m->stages[i].machine_bytes, b1, sizeof b1),
                   i + 1 < m->n_stages ? "," : " machines (--memory)\n");
    }
    int rc = csd_manifest_validate(m, false, &err);
    if (rc) {
        printf("check           FAILED\n");
        csd_cli_error("inspect", &err);
    } else {
        printf("check           ok: files present, sizes, header checksums and model hash "
               "consistent\n");
    }
    csd_manifest_destroy(m);
    return rc ? 1 : 0;
}

int csd_cmd_inspect(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(inspect_usage, argc == 2 ? stdout : stderr);
        return argc == 2 ? 0 : 2;
    }
    const char *dir = argv[1];
    struct stat info;
    char manifest[4096];
    bool is_dir = stat(dir, &info) == 0 && S_ISDIR(info.st_mode);
    if (ends_with(dir, ".shard")) return inspect_shard(dir);
    if (ends_with(dir, ".json")) return inspect_manifest(dir);
    if (is_dir && !csd_path_join(manifest, sizeof manifest, dir, CSD_MANIFEST_FILE) &&
        csd_file_exists(manifest))
        return inspect_manifest(dir);
    csd_err err = {0};
    csd_model_config cfg;
    csd_st_set *st = NULL;
    int rc = csd_model_config_load(&cfg, dir, &err);
    if (!rc) rc = csd_st_open_dir(&st, dir, &err);
    if (rc) {
        csd_cli_error("inspect", &err);
        return 1;
    }
    printf("model           %s\n", dir);
    print_config(&cfg);
    print_tensors(st);
    print_memory(&cfg);
    csd_st_close(st);
    return 0;
}
