/* cmd_inspect: `cascadia inspect MODEL_DIR`: what was understood of a model directory: the family,
 * every hyperparameter, the tensors found, and the memory a stage of it needs. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "cli_util.h"
#include "core/dtype.h"
#include "format/safetensors.h"

static const char *const inspect_usage = "usage: cascadia inspect MODEL_DIR\n";

static void print_config(const csd_model_config *c) {
    const csd_arch_desc *a = csd_arch_get(c->arch);
    printf("family          %s (model_type %s)\n", a ? a->display_name : "?", c->model_type);
    printf("layers          %lld\n", (long long)c->n_layers);
    printf("hidden          %lld (intermediate %lld)\n", (long long)c->dim, (long long)c->hidden_dim);
    printf("heads           %lld query, %lld key/value, head_dim %lld\n", (long long)c->n_heads,
           (long long)c->n_kv_heads, (long long)c->head_dim);
    printf("vocab           %lld\n", (long long)c->vocab_size);
    printf("context         %lld\n", (long long)c->max_seq_len);
    printf("norm            RMSNorm eps %g%s\n", (double)c->norm_eps, c->qk_norm ? ", q/k norm per head" : "");
    printf("rope            theta %g, rotate-half", (double)c->rope_theta);
    if (c->rope_scaling == CSD_ROPE_SCALING_LLAMA3)
        printf(", llama3 scaling factor %g low %g high %g original %lld", (double)c->rope_factor,
               (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor,
               (long long)c->rope_orig_max_pos);
    else if (c->rope_scaling == CSD_ROPE_SCALING_LINEAR)
        printf(", linear scaling factor %g", (double)c->rope_factor);
    printf("\n");
    printf("attention       %s%s\n", c->sliding_window ? "sliding window" : "full causal",
           c->qkv_bias ? ", q/k/v biases" : "");
    if (c->sliding_window) printf("window          %lld\n", (long long)c->sliding_window);
    printf("embeddings      %s\n", c->tie_embeddings ? "tied to the output head" : "separate output head");
    printf("bos/eos         %d /", c->bos_id);
    for (int i = 0; i < c->n_eos; i++) printf(" %d", c->eos_ids[i]);
    printf("\ndtype           %s\n", csd_dtype_name(c->torch_dtype));
}

static void print_tensors(const csd_st_set *st) {
    size_t bytes = 0;
    int64_t params = 0;
    for (int i = 0; i < csd_st_count(st); i++) {
        const csd_st_tensor *t = csd_st_at(st, i);
        int64_t n = 1;
        for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
        params += n;
        bytes += t->nbytes;
    }
    printf("tensors         %d, %.3f B parameters, %.1f MiB on disk\n", csd_st_count(st), (double)params * 1e-9,
           (double)bytes / (1 << 20));
}

static void print_memory(const csd_model_config *c) {
    int64_t kv_dim = c->n_kv_heads * c->head_dim;
    double kv_per_tok = 2.0 * (double)c->n_layers * (double)kv_dim * 2; /* f16 K and V */
    printf("kv cache        %.1f KiB per token (f16), %.1f MiB at 4096 tokens\n", kv_per_tok / 1024,
           kv_per_tok * 4096 / (1 << 20));
    int64_t layer_params = c->dim * (c->n_heads * c->head_dim) * 2 + c->dim * kv_dim * 2 + 3 * c->dim * c->hidden_dim;
    printf("per layer       %.1f M parameters: %.1f MiB int4, %.1f MiB int8, %.1f MiB f16\n",
           (double)layer_params * 1e-6, (double)layer_params * (0.5 + 2.0 / 128) / (1 << 20),
           (double)layer_params * (1 + 2.0 / 128) / (1 << 20), (double)layer_params * 2 / (1 << 20));
}

int csd_cmd_inspect(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(inspect_usage, argc == 2 ? stdout : stderr);
        return argc == 2 ? 0 : 2;
    }
    const char *dir = argv[1];
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
