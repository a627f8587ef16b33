/* cmd_logits: `cascadia logits MODEL_DIR --ids 1,2,3 [--top K] [--out FILE]`: teacher-forced
 * next-token logits at every position. The tool for checking a converted or exported model against
 * another implementation: prints the top K per position, and --out writes every logit as raw
 * little-endian float32 [positions x vocab]. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "core/alloc.h"
#include "core/file_map.h"

static const char *const logits_usage =
    "usage: cascadia logits MODEL_DIR --ids 1,2,3 [--top K] [--out FILE] [model options]\n"
    "  --ids LIST   token ids (comma-separated), fed as one sequence\n"
    "  --top K      logits printed per position (default 5)\n"
    "  --out FILE   write all logits as float32 [positions x vocab]\n" CSD_CLI_MODEL_DIR_HELP
        CSD_CLI_MODEL_FLAGS_HELP;

/* Teacher-forced logits of every position, in chunks of the model's batch limit. */
static int all_logits(csd_model *m, const int32_t *ids, int64_t n, float *out, csd_err *err) {
    csd_kv *kv = NULL;
    int rc = csd_kv_create(&kv, m, n, err);
    int64_t vocab = csd_model_cfg(m)->vocab_size, max_batch = csd_model_max_batch(m);
    csd_kv **kvs = csd_alloc_array((size_t)max_batch, sizeof(csd_kv *));
    if (!rc && !kvs) rc = csd_err_set(err, CSD_ENOMEM, "batch");
    for (int64_t done = 0; !rc && done < n;) {
        int64_t chunk = n - done < max_batch ? n - done : max_batch;
        for (int64_t i = 0; i < chunk; i++) kvs[i] = kv;
        csd_batch b = {chunk, ids + done, NULL, kvs, NULL};
        rc = csd_model_forward(m, &b, out + done * vocab, err);
        done += chunk;
    }
    csd_free(kvs);
    csd_kv_destroy(kv);
    return rc;
}

static void print_top(const float *row, int64_t vocab, int64_t pos, int32_t id, int k) {
    printf("pos %lld (token %d):", (long long)pos, id);
    int32_t best[64];
    for (int j = 0; j < k; j++) { /* k is small: repeated max */
        int32_t b = -1;
        for (int64_t v = 0; v < vocab; v++) {
            bool taken = false;
            for (int t = 0; t < j; t++) taken |= best[t] == v;
            if (!taken && (b < 0 || row[v] > row[b])) b = (int32_t)v;
        }
        best[j] = b;
        printf(" %d=%.6f", b, row[b]);
    }
    printf("\n");
}

int csd_cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *out_path = NULL, *ids_text = NULL;
    int64_t top = 5;
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(logits_usage, stdout);
            return 0;
        } else if (!strcmp(f, "--ids") || !strcmp(f, "--out")) {
            if (!value) {
                fprintf(stderr, "cascadia logits: %s needs a value\n", f);
                return 2;
            }
            if (!strcmp(f, "--ids")) ids_text = value;
            else out_path = value;
            i++;
        } else if (!strcmp(f, "--top")) {
            if (!csd_cli_int("logits", f, value, 0, 64, &top)) return 2;
            i++;
        } else if (f[0] == '-') {
            int r = csd_cli_model_flag("logits", f, value, &opts);
            if (r <= 0) {
                if (r == 0)
                    fprintf(stderr, "cascadia logits: unknown option '%s'\n%s", f, logits_usage);
                return 2;
            }
            i++;
        } else if (!dir) {
            dir = f;
        } else {
            fprintf(stderr, "cascadia logits: unexpected argument '%s'\n", f);
            return 2;
        }
    }
    if (!dir || !ids_text) {
        fprintf(stderr, "cascadia logits: MODEL_DIR and --ids are required\n%s", logits_usage);
        return 2;
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    if (!csd_cli_id_list("logits", "--ids", ids_text, &ids, &n)) return 2;
    csd_err err = {0};
    csd_model *m = NULL;
    float *logits = NULL;
    csd_kern_init();
    if (opts.max_ctx == 0) opts.max_ctx = n > 16 ? n : 16;
    int rc = csd_model_open(&m, dir, &opts, &err);
    int64_t vocab = rc ? 0 : csd_model_cfg(m)->vocab_size;
    if (!rc && n > csd_model_max_ctx(m))
        rc = csd_err_set(&err, CSD_ERANGE, "%lld ids exceed the context", (long long)n);
    if (!rc) csd_cli_warn_ctx("logits", n, m);
    if (!rc && !(logits = csd_alloc_array((size_t)(n * vocab), sizeof(float))))
        rc = csd_err_set(&err, CSD_ENOMEM, "logits");
    if (!rc) rc = all_logits(m, ids, n, logits, &err);
    if (!rc && out_path)
        rc = csd_file_write_all(out_path, logits, (size_t)(n * vocab) * sizeof(float), &err);
    if (top > vocab) top = vocab; /* every id, best first */
    for (int64_t p = 0; !rc && top > 0 && p < n; p++)
        print_top(logits + p * vocab, vocab, p, ids[p], (int)top);
    if (rc) csd_cli_error("logits", &err);
    csd_free(logits);
    csd_free(ids);
    csd_model_destroy(m);
    return rc ? 1 : 0;
}
