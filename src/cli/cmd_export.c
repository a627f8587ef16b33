/* cmd_export: `cascadia export MODEL_DIR --stages N|auto ... --out DIR`: flags, the stage plan
 * (model/stage_plan.h) and progress display around csd_export_run (model/export.h), which writes
 * the stage shards and DIR/manifest.json one stage in memory at a time. docs/shard-format.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "commands.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "format/manifest.h"
#include "model/export.h"
#include "model/model.h"
#include "model/stage_plan.h"

static const char *const export_usage =
    "usage: cascadia export MODEL_DIR --stages N|auto [--memory 8G,16G,...] --precision P\n"
    "                       --out DIR [--ctx N] [--slots N] [--kv-type f32|f16|q8]\n"
    "Cuts a Hugging Face model directory into pipeline-stage shards and DIR/manifest.json.\n"
    "  --stages N        N stages (1 to the layer count), balanced by bytes\n"
    "  --stages auto     the fewest of the --memory machines (in order) that hold the model\n"
    "  --memory LIST     memory of each machine, e.g. 8G,16G,512M (with --stages auto)\n"
    "  --precision P     f32|f16|bf16|int8|int4 (default: the file's dtype)\n"
    "  --out DIR         output directory (created; an existing manifest there is replaced)\n"
    "  --ctx N           context per sequence of the memory estimate (default: <= 4096)\n"
    "  --slots N         concurrent sequences of the memory estimate (default 1)\n"
    "  --kv-type T       KV cache type of the estimate (default: f32 for f32 weights, else f16)\n";

typedef struct progress {
    bool tty;
    uint64_t t_stage; /* when the current stage started */
    int last_pct;     /* last percentage drawn (redraw only when it or the phase changes) */
    const char *last_phase;
} progress;

/* A bar redrawn in place on a terminal; one plain line per finished stage otherwise. */
static void on_progress(void *ctx, int stage, int n, const csd_plan_stage *ps, double frac,
                        const char *phase) {
    progress *p = ctx;
    if (frac == 0.0) p->t_stage = csd_now_ns();
    if (p->tty) {
        double total = ((double)stage + frac) / n;
        int pct = (int)(total * 100 + 0.5);
        if (pct == p->last_pct && p->last_phase && !strcmp(phase, p->last_phase)) return;
        p->last_pct = pct;
        p->last_phase = phase;
        int width = 30, fill = (int)(total * width + 0.5);
        char b[40];
        for (int i = 0; i < width; i++) b[i] = i < fill ? '#' : '.';
        b[width] = '\0';
        fprintf(stderr, "\r[%s] %3d%%  stage %d/%d layers [%lld, %lld) %-8s", b, pct, stage + 1, n,
                (long long)ps->layer_begin, (long long)ps->layer_end, phase);
        if (stage == n - 1 && !strcmp(phase, "done")) fputc('\n', stderr);
        fflush(stderr);
    } else if (!strcmp(phase, "done")) {
        char b1[32];
        fprintf(stderr,
                "export: stage %d/%d layers [%lld, %lld) written, memory estimate %s, %.1f s\n",
                stage + 1, n, (long long)ps->layer_begin, (long long)ps->layer_end,
                csd_plan_fmt_bytes(ps->total_bytes, b1, sizeof b1),
                (double)(csd_now_ns() - p->t_stage) * 1e-9);
    }
}

typedef struct export_args {
    const char *model_dir, *out, *memory;
    int n_stages; /* 0: --stages auto */
    int precision, kv_dtype;
    int64_t ctx, slots;
} export_args;

static int make_plan(const export_args *a, const csd_model_config *cfg, const csd_plan_opts *po,
                     csd_plan *plan, csd_err *err) {
    if (a->n_stages > 0) return csd_plan_even(plan, cfg, po, a->n_stages, err);
    uint64_t machines[CSD_PLAN_MAX_STAGES];
    int n = 0;
    int rc = csd_plan_parse_memory_list(a->memory, machines, CSD_PLAN_MAX_STAGES, &n, err);
    if (rc) return rc;
    return csd_plan_auto(plan, cfg, po, machines, n, err);
}

static int export_model(const export_args *a, csd_err *err) {
    csd_model_config cfg;
    int rc = csd_model_config_load(&cfg, a->model_dir, err);
    if (rc) return csd_err_prefix(err, "%s: ", a->model_dir);
    csd_export_opts eo = {a->model_dir,
                          a->out,
                          a->precision >= 0 ? a->precision : cfg.torch_dtype,
                          a->kv_dtype,
                          a->ctx > 0                                    ? a->ctx
                          : cfg.max_seq_len < CSD_MODEL_DEFAULT_MAX_CTX ? cfg.max_seq_len
                                                                        : CSD_MODEL_DEFAULT_MAX_CTX,
                          a->slots};
    csd_plan_opts po;
    csd_plan_opts_default(&po);
    po.precision = eo.precision;
    po.kv_dtype = eo.kv_dtype;
    po.ctx = eo.ctx;
    po.slots = eo.slots;
    csd_plan *plan = csd_alloc(sizeof *plan);
    if (!plan) return csd_err_set(err, CSD_ENOMEM, "plan");
    rc = make_plan(a, &cfg, &po, plan, err);
    progress pr = {isatty(2) != 0, csd_now_ns(), -1, NULL};
    uint64_t t0 = csd_now_ns();
    csd_manifest *man = NULL;
    if (!rc) rc = csd_export_run(&eo, plan, on_progress, &pr, &man, err);
    csd_free(plan);
    if (rc) return rc;
    char hex[2 * CSD_SHARD_HASH_BYTES + 1], b1[32], b2[32], b3[32];
    csd_shard_hash_hex(man->model_hash, hex);
    uint64_t total = 0;
    for (int k = 0; k < man->n_stages; k++) total += man->stages[k].bytes;
    printf("exported %s -> %s: %d stage%s, %s, %s, model hash %.16s\n", a->model_dir, a->out,
           man->n_stages, man->n_stages > 1 ? "s" : "", csd_dtype_name(man->precision),
           csd_plan_fmt_bytes(total, b1, sizeof b1), hex);
    for (int k = 0; k < man->n_stages; k++) {
        const csd_manifest_stage *s = &man->stages[k];
        printf("  %-14s layers [%lld, %lld)%s%s  %s, memory estimate %s (%lld tokens x %lld "
               "slots), KV %s/token\n",
               s->file, (long long)s->layer_begin, (long long)s->layer_end,
               s->has_embed ? " +embed" : "", s->has_head ? " +head" : "",
               csd_plan_fmt_bytes(s->bytes, b1, sizeof b1),
               csd_plan_fmt_bytes(s->memory_bytes, b2, sizeof b2), (long long)man->ctx,
               (long long)man->slots, csd_plan_fmt_bytes(s->kv_bytes_per_token, b3, sizeof b3));
    }
    fprintf(stderr, "export: done in %.1f s\n", (double)(csd_now_ns() - t0) * 1e-9);
    csd_manifest_destroy(man);
    return 0;
}

/* --stages N|auto: N in 1..CSD_PLAN_MAX_STAGES here; against the layer count once the model's
 * config is read. */
static bool parse_stages(const char *value, int *n_stages) {
    if (!strcmp(value, "auto")) {
        *n_stages = 0;
        return true;
    }
    char *end = NULL;
    long n = value[0] >= '0' && value[0] <= '9' ? strtol(value, &end, 10) : 0;
    if (n >= 1 && n <= CSD_PLAN_MAX_STAGES && *end == '\0') {
        *n_stages = (int)n;
        return true;
    }
    fprintf(stderr,
            "cascadia export: --stages must be a number (1 to the layer count, at most %d) or "
            "auto, got '%s'\n",
            CSD_PLAN_MAX_STAGES, value);
    return false;
}

/* One flag with its value; false (message printed) on a bad value or an unknown flag. */
static bool parse_export_flag(const char *f, const char *value, export_args *a) {
    int64_t v;
    if (!strcmp(f, "--stages")) return parse_stages(value, &a->n_stages);
    if (!strcmp(f, "--memory")) return (a->memory = value), true;
    if (!strcmp(f, "--out")) return (a->out = value), true;
    if (!strcmp(f, "--precision")) {
        if ((a->precision = csd_dtype_parse(value)) >= 0) return true;
        fprintf(stderr,
                "cascadia export: --precision must be f32, f16, bf16, int8 or int4, got '%s'\n",
                value);
        return false;
    }
    if (!strcmp(f, "--kv-type")) {
        a->kv_dtype = csd_dtype_parse(value);
        if (a->kv_dtype == CSD_DTYPE_F32 || a->kv_dtype == CSD_DTYPE_F16 ||
            a->kv_dtype == CSD_DTYPE_Q8)
            return true;
        fprintf(stderr, "cascadia export: --kv-type must be f32, f16 or q8, got '%s'\n", value);
        return false;
    }
    if (!strcmp(f, "--ctx")) {
        if (!csd_cli_int("export", f, value, 1, CSD_MAX_CONTEXT, &v)) return false;
        return (a->ctx = v), true;
    }
    if (!strcmp(f, "--slots")) {
        if (!csd_cli_int("export", f, value, 1, 4096, &v)) return false;
        return (a->slots = v), true;
    }
    fprintf(stderr, "cascadia export: unknown option '%s'\n%s", f, export_usage);
    return false;
}

/* What the flags need of each other; false (message printed) when they do not fit. */
static bool check_args(const export_args *a) {
    if (!a->model_dir || a->n_stages < 0 || !a->out) {
        fprintf(stderr, "cascadia export: MODEL_DIR, --stages and --out are required\n%s",
                export_usage);
        return false;
    }
    if (a->n_stages == 0 && !a->memory) {
        fputs("cascadia export: --stages auto needs --memory (e.g. --memory 8G,16G)\n", stderr);
        return false;
    }
    if (a->n_stages > 0 && a->memory) {
        fputs("cascadia export: --memory goes with --stages auto\n", stderr);
        return false;
    }
    return true;
}

int csd_cmd_export(int argc, char **argv) {
    export_args a = {.n_stages = -1, .precision = -1, .kv_dtype = -1, .slots = 1};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(export_usage, stdout);
            return 0;
        } else if (f[0] != '-') {
            if (a.model_dir) {
                fprintf(stderr, "cascadia export: one MODEL_DIR expected, got '%s' and '%s'\n%s",
                        a.model_dir, f, export_usage);
                return 2;
            }
            a.model_dir = f;
        } else if (!value) {
            fprintf(stderr, "cascadia export: %s needs a value\n%s", f, export_usage);
            return 2;
        } else if (!parse_export_flag(f, value, &a)) {
            return 2;
        } else {
            i++;
        }
    }
    if (!check_args(&a)) return 2;
    csd_err err = {0};
    if (export_model(&a, &err)) {
        csd_cli_error("export", &err);
        return 1;
    }
    return 0;
}
