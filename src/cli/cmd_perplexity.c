/* cmd_perplexity: `cascadia perplexity MODEL_DIR --precision P (FILE | --ids 1,2,3)`: loads the
 * model twice, at f32 (the reference) and at P, runs both teacher-forced over the same tokens and
 * prints perplexity of each, mean KL(P_f32 || P_P) and top-1 agreement. The metrics are
 * model/quality.h; this file only parses flags, tokenizes and prints. See docs/quality.md. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "model/quality.h"
#include "tok/tokenizer.h"

/* Default window when --ctx is absent: the model's context, capped here (a longer window costs
 * quadratic attention time and changes perplexity little on story-length texts). */
#define PPL_DEFAULT_WINDOW 512
/* Largest text file read (bytes); a bigger corpus should be split by the caller. */
#define PPL_MAX_TEXT_BYTES (256u * 1024u * 1024u)

static const char *const ppl_usage =
    "usage: cascadia perplexity MODEL_DIR --precision P (FILE | --ids 1,2,3) [options]\n"
    "  FILE            text to score, tokenized with BOS\n"
    "  --ids LIST      token ids (comma-separated) instead of a file, used as given\n"
    "  --precision P   precision under test: f32|f16|bf16|int8|int4 (reference: f32)\n"
    "  --ctx N         window in tokens (default: the model's context, capped at 512)\n"
    "  --threads N     worker threads per model (default: all cores)\n"
    "  --kv-type T     f32|f16|q8 KV cache of the model under test (default: f16 unless f32)\n"
    "  --json          one JSON object on stdout instead of the table\n";

typedef struct ppl_args {
    const char *dir, *file, *ids_text;
    int precision;  /* CSD_DTYPE_* under test, -1 until given */
    int64_t window; /* 0: default */
    bool json;
    csd_model_opts opts;
} ppl_args;

/* Returns 0 to run, 1 when help was printed, 2 on a usage error. */
static int parse_args(int argc, char **argv, ppl_args *a) {
    memset(a, 0, sizeof *a);
    a->precision = -1;
    csd_model_opts_default(&a->opts);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(ppl_usage, stdout);
            return 1;
        } else if (!strcmp(f, "--json")) {
            a->json = true;
        } else if (!strcmp(f, "--ids")) {
            if (!value) {
                fprintf(stderr, "cascadia perplexity: --ids needs a value\n");
                return 2;
            }
            a->ids_text = argv[++i];
        } else if (!strcmp(f, "--ctx")) {
            if (!csd_cli_int("perplexity", f, value, 2, 1 << 20, &a->window)) return 2;
            i++;
        } else if (!strcmp(f, "--precision")) {
            a->precision = csd_dtype_parse(value);
            if (a->precision < 0) {
                fprintf(stderr, "cascadia perplexity: --precision: unknown '%s'\n",
                        value ? value : "");
                return 2;
            }
            i++;
        } else if (f[0] == '-') {
            int r = csd_cli_model_flag("perplexity", f, value, &a->opts);
            if (r <= 0) {
                if (r == 0)
                    fprintf(stderr, "cascadia perplexity: unknown option '%s'\n%s", f, ppl_usage);
                return 2;
            }
            i++;
        } else if (!a->dir) {
            a->dir = f;
        } else if (!a->file) {
            a->file = f;
        } else {
            fprintf(stderr, "cascadia perplexity: unexpected argument '%s'\n", f);
            return 2;
        }
    }
    if (!a->dir || a->precision < 0 || (!a->file == !a->ids_text)) {
        fprintf(stderr,
                "cascadia perplexity: MODEL_DIR, --precision and one of FILE or --ids are "
                "required\n%s",
                ppl_usage);
        return 2;
    }
    return 0;
}

/* Tokenizes the file with the model's tokenizer, BOS first when the tokenizer has one. */
static int tokenize_file(const char *dir, const char *path, int32_t **ids, int64_t *n,
                         csd_err *err) {
    char *text = NULL;
    size_t len = 0;
    csd_tok *tok = NULL;
    int32_t *raw = NULL;
    size_t n_raw = 0;
    int rc = csd_file_read_all(path, PPL_MAX_TEXT_BYTES, &text, &len, err);
    if (!rc) rc = csd_tok_load(&tok, dir, err);
    if (!rc) rc = csd_tok_encode(tok, text, len, false, false, &raw, &n_raw, err);
    if (!rc) {
        int32_t bos = csd_tok_bos(tok);
        size_t lead = bos >= 0 ? 1 : 0;
        *ids = csd_alloc_array(n_raw + lead, sizeof(int32_t));
        if (!*ids) {
            rc = csd_err_set(err, CSD_ENOMEM, "%zu token ids", n_raw + lead);
        } else {
            if (lead) (*ids)[0] = bos;
            if (n_raw) memcpy(*ids + lead, raw, n_raw * sizeof(int32_t));
            *n = (int64_t)(n_raw + lead);
        }
    }
    csd_free(raw);
    csd_tok_destroy(tok);
    csd_free(text);
    return rc;
}

static void print_table(const ppl_args *a, const csd_quality_stats *s, int64_t window,
                        int64_t n_windows) {
    const char *p = csd_dtype_name(a->precision);
    printf("model      %s\n", a->dir);
    printf("positions  %lld (windows %lld of <= %lld tokens)\n", (long long)s->positions,
           (long long)n_windows, (long long)window);
    printf("ppl f32    %.6f\n", csd_quality_ppl_ref(s));
    printf("ppl %-6s %.6f\n", p, csd_quality_ppl_test(s));
    printf("mean KL    %.6g nats (max %.6g)\n", csd_quality_mean_kl(s), s->kl_max);
    printf("top-1      %.2f%% (%lld/%lld)\n", 100.0 * csd_quality_top1(s), (long long)s->top1_agree,
           (long long)s->positions);
}

static int print_json(const ppl_args *a, const csd_quality_stats *s, int64_t window,
                      int64_t n_windows, csd_err *err) {
    json_t *o = json_pack(
        "{s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:I}", "model", a->dir, "precision",
        csd_dtype_name(a->precision), "positions", (json_int_t)s->positions, "windows",
        (json_int_t)n_windows, "ctx", (json_int_t)window, "ppl_ref", csd_quality_ppl_ref(s),
        "ppl_test", csd_quality_ppl_test(s), "mean_kl", csd_quality_mean_kl(s), "max_kl", s->kl_max,
        "top1", csd_quality_top1(s), "top1_agree", (json_int_t)s->top1_agree);
    char *text = o ? json_dumps(o, JSON_REAL_PRECISION(10)) : NULL;
    json_decref(o);
    if (!text) return csd_err_set(err, CSD_ENOMEM, "json output");
    printf("%s\n", text);
    free(text); /* jansson allocates with malloc */
    return 0;
}

int csd_cmd_perplexity(int argc, char **argv) {
    ppl_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc == 1 ? 0 : 2;
    int32_t *ids = NULL;
    int64_t n = 0;
    if (a.ids_text && !csd_cli_id_list("perplexity", "--ids", a.ids_text, &ids, &n)) return 2;
    csd_err err = {0};
    int rc = a.file ? tokenize_file(a.dir, a.file, &ids, &n, &err) : 0;
    csd_model *ref = NULL, *test = NULL;
    csd_quality_stats s = {0};
    int64_t window = a.window, n_windows = 0;
    csd_kern_init();
    if (!rc && n < 2)
        rc = csd_err_set(&err, CSD_EINVAL, "need at least 2 tokens, got %lld", (long long)n);
    /* Reference: f32 weights and f32 KV, whatever the flags say about the model under test. */
    csd_model_opts ropts = a.opts;
    ropts.precision = CSD_DTYPE_F32;
    ropts.kv_dtype = CSD_DTYPE_F32;
    ropts.max_ctx = window;
    if (!rc) rc = csd_model_load_hf(&ref, a.dir, &ropts, &err);
    if (!rc && window == 0) {
        int64_t model_ctx = csd_model_max_ctx(ref);
        window = model_ctx < PPL_DEFAULT_WINDOW ? model_ctx : PPL_DEFAULT_WINDOW;
    }
    if (!rc) csd_cli_warn_ctx("perplexity", window, ref);
    if (!rc && window > n) window = n; /* a short text needs no larger KV cache */
    csd_model_opts topts = a.opts;
    topts.precision = a.precision;
    topts.max_ctx = window;
    if (!rc) rc = csd_model_load_hf(&test, a.dir, &topts, &err);
    if (!rc) rc = csd_quality_measure(ref, test, ids, n, window, &s, &n_windows, &err);
    if (!rc && a.json)
        rc = print_json(&a, &s, window, n_windows, &err);
    else if (!rc)
        print_table(&a, &s, window, n_windows);
    if (rc) csd_cli_error("perplexity", &err);
    csd_model_destroy(test);
    csd_model_destroy(ref);
    csd_free(ids);
    return rc ? 1 : 0;
}
