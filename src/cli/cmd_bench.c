/* cmd_bench: `cascadia bench`: speed as llama-bench measures it. Prompt processing (one batched
 * forward of -p random tokens) and generation (-n single-token steps) in tokens/s, optionally after
 * -d tokens already in the cache, and the generation roofline: weight and KV cache bytes read per
 * token over a memory bandwidth measured here.
 * --concurrency runs the continuous-batching engine; --fleet measures a fleet (bench_engine.c).
 * Results go to stdout (a table, or JSON with --json); progress goes to stderr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"
#include "cli_json.h"
#include "cli_util.h"
#include "commands.h"
#include "coord/ngram_draft.h"
#include "core/alloc.h"
#include "core/build_info.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/host_info.h"
#include "model/weight_stream.h"

static const char *const bench_usage =
    "usage: cascadia bench MODEL_DIR [--precision P] [-p 512] [-n 128] [-d 0] [-t THREADS]\n"
    "                      [-r REPS] [--json]\n"
    "       cascadia bench MODEL_DIR --concurrency 1,2,4,8,16 [-n 64] [options]\n"
    "       cascadia bench --fleet H:P,... --manifest DIR [--local-stage 0]\n"
    "                      (--key F | --insecure) [-n 128] [--concurrency LIST]\n"
    "  -p N                prompt tokens of the prompt-processing test (default 512, 0 = skip)\n"
    "  -n N                generated tokens (default 128; 64 with --concurrency)\n"
    "  -d, --depth N       tokens already in the cache before each pp/tg test (default 0), as\n"
    "                      llama-bench -d: the speed at a long context\n"
    "  -t, --threads N     threads (default: all cores)\n"
    "  -r N                repetitions of each test (1 to 1000, default 3)\n"
    "  --json              one JSON object (a list with --concurrency) instead of the table\n"
    "  --concurrency LIST  concurrent streams through the engine, e.g. 1,2,4,8,16\n"
    "  --stream-prompt N   prompt tokens of each concurrent stream (default 16)\n"
    "  --spec-draft N      with --concurrency: run each level twice, without speculative\n"
    "                      decoding and with up to N draft tokens (serve --spec-draft; at most\n"
    "                      16), on the same prompts, and give the share of drafts the model\n"
    "                      agreed with and the speed against the same level without\n"
    "  --draft-model DIR   with --concurrency: the drafts come from this model (serve\n"
    "                      --draft-model; --spec-draft defaults to 4), --draft-precision P,\n"
    "                      --draft-p-min P\n"
    "  --membw-mib N       buffer of the peak bandwidth test in MiB (default 1024; 0 skips it,\n"
    "                      the paired roofline (tg again, each token followed by a read of its\n"
    "                      bytes) and the stream ceiling (tg again, each token followed by every\n"
    "                      matrix times one token))\n"
    "  --peak-min-mib N    the paired reads, the weight-stream passes and the tokens raise the\n"
    "                      peak bandwidth when their rate beats the read test's, if each pass\n"
    "                      reads at least N MiB (default 256; smaller ones run from cache)\n"
    "  --seed S            seed of the random token ids (default 42)\n" CSD_CLI_MODEL_DIR_HELP
        CSD_CLI_MODEL_FLAGS_HELP CSD_CLI_FLEET_FLAGS_HELP;

void csd_cli_bench_random_ids(int32_t *ids, int64_t n, int64_t vocab, uint64_t *state) {
    const int64_t skip = vocab > 300 ? 259 : 0; /* special and byte tokens */
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(skip + (int64_t)(csd_bench_rand(state) % (uint64_t)(vocab - skip)));
}

double csd_cli_bench_loadavg(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l = -1;
    if (f && fscanf(f, "%lf", &l) != 1) l = -1;
    if (f) fclose(f);
    return l;
}

void csd_cli_bench_json_build(json_t *o) {
    char cpu[128];
    csd_cli_json_set_text(o, "version", csd_version());
    csd_cli_json_set_text(o, "build_commit", csd_build_commit());
    csd_cli_json_set_text(o, "cpu", csd_host_cpu_name(cpu, sizeof cpu));
}

void csd_cli_bench_print_build(void) {
    char cpu[128];
    printf("build: cascadia %s (commit %s), %s, %s; CPU: %s\n", csd_version(), csd_build_commit(),
           csd_build_compiler(), csd_build_type(), csd_host_cpu_name(cpu, sizeof cpu));
}

void csd_cli_bench_stats(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = n ? s / n : 0;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

static bool parse_levels(const char *text, csd_bench_args *a) {
    int32_t *ids = NULL;
    int64_t n = 0;
    if (!csd_cli_id_list("bench", "--concurrency", text, &ids, &n)) return false;
    bool ok = n <= CSD_BENCH_MAX_LEVELS;
    for (int64_t i = 0; ok && i < n; i++) ok = ids[i] >= 1 && ids[i] <= CSD_BENCH_MAX_STREAMS;
    if (!ok)
        fprintf(stderr, "cascadia bench: --concurrency takes up to %d levels in 1..%d\n",
                CSD_BENCH_MAX_LEVELS, CSD_BENCH_MAX_STREAMS);
    for (int64_t i = 0; ok && i < n; i++) a->levels[i] = ids[i];
    a->n_levels = ok ? (int)n : 0;
    csd_free(ids);
    return ok;
}

static void default_args(csd_bench_args *a) {
    memset(a, 0, sizeof *a);
    csd_model_opts_default(&a->model);
    csd_cli_fleet_init(&a->fleet);
    a->n_prompt = 512;
    a->n_gen = -1; /* 128, or 64 with --concurrency (finish_args) */
    a->reps = 3;
    a->seed = 42;
    a->membw_mib = 1024;
    a->peak_min_mib = 256;
    a->stream_prompt = 16;
    a->spec_draft = -1; /* not given */
    a->draft = CSD_CLI_DRAFT_NONE;
}

/* A numeric flag of bench's own: 1 when f is one (value taken), 0 when not, -1 on a bad value. */
static int parse_number_flag(const char *f, const char *value, csd_bench_args *a) {
    const int64_t max = 1 << 20;
    int64_t seed = 0, reps = 0;
    const struct {
        const char *flag;
        int64_t lo, hi, *dst;
    } flags[] = {
        {"-p", 0, max, &a->n_prompt},
        {"-n", 0, max, &a->n_gen},
        {"-d", 0, max, &a->depth},
        {"--depth", 0, max, &a->depth},
        {"-r", 1, 1000, &reps},
        {"--seed", 0, INT64_MAX, &seed},
        {"--membw-mib", 0, max, &a->membw_mib},
        {"--peak-min-mib", 0, max, &a->peak_min_mib},
        {"--stream-prompt", 1, max, &a->stream_prompt},
        {"--spec-draft", 0, CSD_SPEC_MAX_DRAFT, &a->spec_draft},
    };
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        if (strcmp(f, flags[i].flag)) continue;
        if (!csd_cli_int("bench", f, value, flags[i].lo, flags[i].hi, flags[i].dst)) return -1;
        if (flags[i].dst == &reps) a->reps = (int)reps;
        if (flags[i].dst == &seed) a->seed = (uint64_t)seed;
        return 1;
    }
    return 0;
}

/* A flag with a value (or --insecure): 1 when taken (*takes: whether it used the value), -1 on a
 * bad value or an unknown flag (message printed). */
static int parse_flag(const char *f, const char *value, csd_bench_args *a, bool *takes) {
    *takes = true;
    if (!strcmp(f, "--concurrency")) {
        if (value && parse_levels(value, a)) return 1;
        if (!value) fprintf(stderr, "cascadia bench: --concurrency needs a value\n");
        return -1;
    }
    int r = parse_number_flag(f, value, a);
    if (r == 0) r = csd_cli_fleet_flag("bench", f, value, &a->fleet, takes);
    if (r == 0) r = csd_cli_draft_flag("bench", f, value, &a->draft);
    if (r == 0)
        r = csd_cli_model_flag("bench", !strcmp(f, "-t") ? "--threads" : f, value, &a->model);
    if (r == 0) fprintf(stderr, "cascadia bench: unknown option '%s'\n%s", f, bench_usage);
    return r == 1 ? 1 : -1;
}

/* What the flags need of each other, and the defaults that depend on them; false (message
 * printed) when they do not fit. */
static bool finish_args(csd_bench_args *a) {
    if (!csd_cli_fleet_check("bench", &a->fleet)) return false;
    if (a->fleet.fleet && a->model_dir) {
        fprintf(stderr, "cascadia bench: give MODEL_DIR or --fleet/--manifest, not both\n");
        return false;
    }
    if (!a->model_dir && !a->fleet.fleet) {
        fprintf(stderr, "cascadia bench: MODEL_DIR (or --fleet/--manifest) is required\n%s",
                bench_usage);
        return false;
    }
    if (a->depth > 0 && (a->n_levels || a->fleet.fleet)) {
        fprintf(stderr, "cascadia bench: --depth applies to the single-model pp/tg tests, not to "
                        "--concurrency or --fleet\n");
        return false;
    }
    if (a->n_gen < 0) a->n_gen = a->n_levels ? 64 : 128;
    if (!a->n_levels && a->n_prompt == 0 && a->n_gen == 0) {
        fprintf(stderr, "cascadia bench: -p 0 and -n 0 leave nothing to measure\n");
        return false;
    }
    a->spec_draft = csd_cli_draft_spec("bench", &a->draft, a->spec_draft);
    if (a->spec_draft < 0) return false;
    if ((a->spec_draft > 0 || a->draft.dir) && !a->n_levels) {
        fprintf(stderr, "cascadia bench: --spec-draft and --draft-model apply to --concurrency\n");
        return false;
    }
    if (a->n_levels && a->n_gen < 2) {
        fprintf(stderr, "cascadia bench: --concurrency needs -n >= 2\n");
        return false;
    }
    return true;
}

/* Returns 0 to go on, -1 after --help, or the exit code. */
static int parse_args(int argc, char **argv, csd_bench_args *a) {
    default_args(a);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = false;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(bench_usage, stdout);
            return -1;
        } else if (!strcmp(f, "--json")) {
            a->json = true;
        } else if (f[0] == '-') {
            if (parse_flag(f, value, a, &takes) < 0) return 2;
            i += takes;
        } else if (!a->model_dir) {
            a->model_dir = f;
        } else {
            fprintf(stderr, "cascadia bench: unexpected argument '%s'\n", f);
            return 2;
        }
    }
    return finish_args(a) ? 0 : 2;
}

/* What the single-model benchmark measured. */
typedef struct bench_result {
    double pp_tps, pp_sd;
    double tg_tps, tg_sd;
    size_t weight_bytes;  /* read per generated token: layers + final norm + head */
    size_t kv_bytes;      /* KV cache read per generated token, at the tg test's mean context */
    double membw_gbs;     /* peak: test_gbs, or a higher rate the run sustained (set_peak) */
    const char *peak_source;      /* what membw_gbs is: "read test", "paired reads", ... */
    double test_gbs;              /* the read test's best pass over a 1 GiB buffer */
    csd_bench_read_way membw_way; /* how that pass read */
    csd_bench_passes passes;      /* every pass of the read test, by way */
    double test_median_gbs;       /* the median pass of membw_way */
    int test_median_n;            /* over this many passes */
    double paired_gbs;    /* the reads paired with generated tokens (bench_membw.c) */
    double paired_tg_tps; /* those tokens' rate */
    double ceiling_tps;    /* weight-stream passes per second (model/weight_stream.h) */
    size_t stream_bytes;   /* what one weight-stream pass reads */
    double ceiling_tg_tps; /* the tokens alternated with those passes */
    double load_before, load_after; /* 1-minute load average around the tests */
} bench_result;

/* Bytes a generation step reads: every layer matrix and norm, the final norm and the head. The
 * embedding table is not read whole (one row per token), so it does not count. */
static size_t bytes_per_token(const csd_model *m) {
    const csd_weights *w = csd_model_weights(m);
    size_t total = csd_model_weight_bytes(m);
    if (w->has_embed) total -= w->embed.nbytes;
    if (w->has_head && w->has_embed && w->head.data == w->embed.data) total += w->head.nbytes;
    return total;
}

static int run_pp(csd_model *m, csd_kv *kv, const int32_t *ids, const csd_bench_args *a, double *v,
                  float *logits, csd_err *err) {
    for (int r = 0; r < a->reps; r++) {
        csd_kv_truncate(kv, a->depth);
        uint64_t t0 = csd_now_ns();
        int rc = csd_model_forward_seq(m, kv, ids, NULL, a->n_prompt, logits, err);
        if (rc) return rc;
        v[r] = (double)a->n_prompt / ((double)(csd_now_ns() - t0) * 1e-9);
    }
    return 0;
}

/* What runs after every generated token in a tg test, timed apart from it: a read of the token's
 * bytes (the paired roofline) or a pass of the weight stream (the stream ceiling). */
typedef struct tg_after {
    void (*fn)(void *ctx);
    void *ctx;
    double seconds; /* summed over every call */
} tg_after;

/* tg: -r repetitions of -n single-token steps from the depth; v[r] = tokens/s of repetition r,
 * from the steps' own times. With after, every step is followed by after->fn, timed into
 * after->seconds. */
static int run_tg(csd_model *m, csd_kv *kv, const int32_t *ids, const csd_bench_args *a, double *v,
                  float *logits, tg_after *after, csd_err *err) {
    for (int r = 0; r < a->reps; r++) {
        csd_kv_truncate(kv, a->depth);
        double t_rep = 0;
        for (int64_t i = 0; i < a->n_gen; i++) {
            uint64_t t0 = csd_now_ns();
            int rc = csd_model_forward_seq(m, kv, &ids[i], NULL, 1, logits, err);
            if (rc) return rc;
            uint64_t t1 = csd_now_ns();
            t_rep += (double)(t1 - t0) * 1e-9;
            if (after) {
                after->fn(after->ctx);
                after->seconds += (double)(csd_now_ns() - t1) * 1e-9;
            }
        }
        v[r] = (double)a->n_gen / t_rep;
    }
    return 0;
}

/* The tokens' rate over all repetitions of a tg test (v from run_tg). */
static double tg_overall_tps(const csd_bench_args *a, const double *v) {
    double t_tokens = 0;
    for (int r = 0; r < a->reps; r++) t_tokens += (double)a->n_gen / v[r];
    return (double)a->reps * (double)a->n_gen / t_tokens;
}

/* The paired roofline: tg again, every token followed by one read of exactly the bytes a token
 * reads, so reads and tokens share the machine's state, second by second. */
typedef struct paired_read {
    csd_bench_reader *reader;
    csd_bench_read_way way;
} paired_read;

static void paired_read_pass(void *ctx) {
    paired_read *p = ctx;
    csd_cli_bench_reader_pass(p->reader, p->way);
}

static int run_paired(csd_model *m, csd_kv *kv, const int32_t *ids, const csd_bench_args *a,
                      double *v, bench_result *res, float *logits, csd_err *err) {
    paired_read p = {NULL, res->membw_way};
    int rc = csd_cli_bench_reader_create(csd_model_pool(m), res->weight_bytes + res->kv_bytes,
                                         &p.reader, err);
    if (rc) return rc;
    tg_after after = {paired_read_pass, &p, 0};
    rc = run_tg(m, kv, ids, a, v, logits, &after, err);
    if (!rc) {
        double n = (double)a->reps * (double)a->n_gen;
        res->paired_gbs = n * (double)csd_cli_bench_reader_bytes(p.reader) / after.seconds / 1e9;
        res->paired_tg_tps = tg_overall_tps(a, v);
    }
    csd_cli_bench_reader_destroy(p.reader);
    return rc;
}

/* The stream ceiling: tg again, every token followed by one weight-stream pass (every matrix of
 * the stage times one token, one job per input width and dtype, nothing between them), so the
 * two rates share the machine's state second by second. */
static void weight_stream_pass(void *ctx) { csd_weight_stream_run(ctx); }

static int run_ceiling(csd_model *m, csd_kv *kv, const int32_t *ids, const csd_bench_args *a,
                       double *v, bench_result *res, float *logits, csd_err *err) {
    csd_weight_stream *ws;
    int rc = csd_weight_stream_create(&ws, m, err);
    if (rc) return rc;
    csd_weight_stream_run(ws); /* warm-up: the pass's own outputs and scratch paged in */
    res->stream_bytes = 0;
    for (int i = 0; i < csd_weight_stream_count(ws); i++) {
        const csd_qmat *w;
        const float *x, *y;
        csd_weight_stream_get(ws, i, &w, &x, &y);
        res->stream_bytes += w->nbytes;
    }
    tg_after after = {weight_stream_pass, ws, 0};
    rc = run_tg(m, kv, ids, a, v, logits, &after, err);
    if (!rc) {
        res->ceiling_tps = (double)a->reps * (double)a->n_gen / after.seconds;
        res->ceiling_tg_tps = tg_overall_tps(a, v);
    }
    csd_weight_stream_destroy(ws);
    return rc;
}

/* The weight stream's rate alone (GB/s): its passes' bytes over their time. */
static double stream_gbs(const bench_result *r) {
    return r->ceiling_tps * (double)r->stream_bytes / 1e9;
}

/* The peak bandwidth of the roofline: the read test's best pass, raised to any rate the run
 * sustained over passes of at least --peak-min-mib (csd_cli_bench_peak). */
static void set_peak(const csd_bench_args *a, bench_result *res) {
    size_t token = res->weight_bytes + res->kv_bytes;
    double tokens = res->tg_tps > res->paired_tg_tps ? res->tg_tps : res->paired_tg_tps;
    tokens = tokens > res->ceiling_tg_tps ? tokens : res->ceiling_tg_tps;
    const csd_bench_rate rates[] = {
        {"paired reads", res->paired_gbs, token},
        {"weight stream", stream_gbs(res), res->stream_bytes},
        {"tokens", tokens * (double)token / 1e9, token},
    };
    res->membw_gbs = csd_cli_bench_peak(res->test_gbs, rates, 3, (size_t)a->peak_min_mib << 20,
                                        &res->peak_source);
}

/* The cache every test starts from: -d tokens, prefilled once (each test truncates back to it). */
static int fill_depth(csd_model *m, csd_kv *kv, const int32_t *ids, const csd_bench_args *a,
                      float *logits, csd_err *err) {
    csd_kv_truncate(kv, 0);
    if (a->depth == 0) return 0;
    fprintf(stderr, "filling the cache to depth %lld\n", (long long)a->depth);
    return csd_model_forward_seq(m, kv, ids, NULL, a->depth, logits, err);
}

static int bench_model(csd_model *m, const csd_bench_args *a, bench_result *res, csd_err *err) {
    const csd_model_config *c = csd_model_cfg(m);
    int64_t n_ids = a->n_prompt > a->n_gen ? a->n_prompt : a->n_gen;
    if (a->depth > n_ids) n_ids = a->depth;
    int32_t *ids = csd_alloc_array((size_t)(n_ids + 1), sizeof(int32_t));
    float *logits = csd_alloc_array((size_t)c->vocab_size, sizeof(float));
    double *v = csd_alloc_array((size_t)a->reps, sizeof(double));
    csd_kv *kv = NULL;
    int rc = ids && logits && v ? 0 : csd_err_set(err, CSD_ENOMEM, "benchmark buffers");
    if (!rc) rc = csd_kv_create(&kv, m, a->depth + a->n_prompt + a->n_gen + 16, err);
    uint64_t rng = a->seed;
    res->load_before = csd_cli_bench_loadavg();
    if (!rc) {
        csd_cli_bench_random_ids(ids, n_ids + 1, c->vocab_size, &rng);
        res->weight_bytes = bytes_per_token(m);
        /* attention reads every cached position once per token: depth + i at step i */
        res->kv_bytes = (size_t)((double)csd_kv_position_bytes(kv) *
                                 ((double)a->depth + (double)(a->n_gen + 1) / 2.0));
        /* warm-up: page in every weight and the scratch, as llama-bench does */
        int64_t warm = a->n_prompt > 0 ? (a->n_prompt < 32 ? a->n_prompt : 32) : 1;
        rc = csd_model_forward_seq(m, kv, ids, NULL, warm, logits, err);
    }
    if (!rc && a->membw_mib > 0) {
        fprintf(stderr, "measuring memory bandwidth (%lld MiB, %d threads)\n",
                (long long)a->membw_mib, csd_pool_size(csd_model_pool(m)));
        rc = csd_cli_bench_membw(csd_model_pool(m), a->membw_mib, 5, &res->test_gbs,
                                 &res->membw_way, &res->passes, err);
    }
    if (!rc) rc = fill_depth(m, kv, ids, a, logits, err);
    if (!rc && a->n_prompt > 0) {
        fprintf(stderr, "pp%lld x %d\n", (long long)a->n_prompt, a->reps);
        rc = run_pp(m, kv, ids, a, v, logits, err);
        if (!rc) csd_cli_bench_stats(v, a->reps, &res->pp_tps, &res->pp_sd);
    }
    if (!rc && a->n_gen > 0) {
        fprintf(stderr, "tg%lld x %d\n", (long long)a->n_gen, a->reps);
        rc = run_tg(m, kv, ids, a, v, logits, NULL, err);
        if (!rc) csd_cli_bench_stats(v, a->reps, &res->tg_tps, &res->tg_sd);
    }
    if (!rc && a->membw_mib > 0) { /* again after the tests: the best of both, as the load drifts */
        double again = 0;
        csd_bench_read_way way;
        rc = csd_cli_bench_membw(csd_model_pool(m), a->membw_mib, 3, &again, &way, &res->passes,
                                 err);
        if (again > res->test_gbs) {
            res->test_gbs = again;
            res->membw_way = way;
        }
        res->test_median_gbs =
            csd_cli_bench_median_gbs(&res->passes, res->membw_way, &res->test_median_n);
    }
    if (!rc && a->membw_mib > 0 && a->n_gen > 0) {
        fprintf(stderr, "tg%lld x %d, each token paired with a read of its bytes\n",
                (long long)a->n_gen, a->reps);
        rc = run_paired(m, kv, ids, a, v, res, logits, err);
    }
    if (!rc && a->membw_mib > 0 && a->n_gen > 0) {
        fprintf(stderr, "tg%lld x %d, each token followed by a pass of the weight stream alone\n",
                (long long)a->n_gen, a->reps);
        rc = run_ceiling(m, kv, ids, a, v, res, logits, err);
    }
    if (!rc && a->membw_mib > 0) set_peak(a, res);
    res->load_after = csd_cli_bench_loadavg();
    csd_kv_destroy(kv);
    csd_free(v);
    csd_free(logits);
    csd_free(ids);
    return rc;
}

/* The last path component of dir (for the table's model column). */
static const char *base_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    const char *s = dir;
    for (size_t i = 0; i + 1 < n; i++)
        if (dir[i] == '/') s = dir + i + 1;
    return s;
}

/* What a result means against the bandwidth: the peak roofline (t/s) and the fractions reached. */
typedef struct bench_fractions {
    double roof;         /* peak bandwidth / bytes read per token */
    double peak;         /* tg / roof */
    double paired;       /* tg against reads of the same bytes in the same seconds */
    double read_ceiling; /* those reads / the peak: what a step that only read its bytes reaches */
    double ceiling;      /* the weight stream alone / roof */
    double ceiling_tg;   /* the tokens alternated with the stream / the stream */
} bench_fractions;

static bench_fractions fractions_of(const bench_result *r) {
    size_t read = r->weight_bytes + r->kv_bytes;
    bench_fractions f = {0};
    f.roof = r->membw_gbs > 0 && read ? r->membw_gbs * 1e9 / (double)read : 0;
    f.peak = f.roof > 0 ? r->tg_tps / f.roof : 0;
    f.paired = r->paired_gbs > 0 ? r->paired_tg_tps * (double)read / (r->paired_gbs * 1e9) : 0;
    f.read_ceiling = r->membw_gbs > 0 ? r->paired_gbs / r->membw_gbs : 0;
    f.ceiling = f.roof > 0 ? r->ceiling_tps / f.roof : 0;
    f.ceiling_tg = r->ceiling_tps > 0 ? r->ceiling_tg_tps / r->ceiling_tps : 0;
    return f;
}

/* The figures of the table below as one JSON object. */
static void print_result_json(const csd_bench_args *a, const csd_model *m, const bench_result *r,
                              const bench_fractions *f) {
    json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:I, s:I, s:I, s:i}", "model_type",
                          csd_model_cfg(m)->model_type, "precision",
                          csd_dtype_name(csd_model_precision(m)), "threads",
                          csd_pool_size(csd_model_pool((csd_model *)m)), "kernels",
                          csd_kern_name(), "n_prompt", (json_int_t)a->n_prompt, "n_gen",
                          (json_int_t)a->n_gen, "depth", (json_int_t)a->depth, "reps", a->reps);
    if (!o) {
        fprintf(stderr, "cascadia bench: out of memory\n");
        return;
    }
    csd_cli_json_set_text(o, "model", base_name(a->model_dir));
    json_object_set_new(o, "pf_ahead", json_integer((json_int_t)csd_kern_pf_ahead()));
    csd_cli_bench_json_build(o);
    csd_cli_json_set_real(o, "pp_tps", r->pp_tps);
    csd_cli_json_set_real(o, "pp_sd", r->pp_sd);
    csd_cli_json_set_real(o, "tg_tps", r->tg_tps);
    csd_cli_json_set_real(o, "tg_sd", r->tg_sd);
    json_object_set_new(o, "weight_bytes", json_integer((json_int_t)r->weight_bytes));
    json_object_set_new(o, "kv_bytes", json_integer((json_int_t)r->kv_bytes));
    csd_cli_json_set_real(o, "membw_gbs", r->membw_gbs);
    csd_cli_json_set_real(o, "membw_test_gbs", r->test_gbs);
    csd_cli_json_set_real(o, "membw_test_median_gbs", r->test_median_gbs);
    if (r->peak_source) csd_cli_json_set_text(o, "membw_source", r->peak_source);
    csd_cli_json_set_real(o, "roofline_tps", f->roof);
    csd_cli_json_set_real(o, "roofline_fraction", f->peak);
    csd_cli_json_set_real(o, "paired_membw_gbs", r->paired_gbs);
    csd_cli_json_set_real(o, "paired_tg_tps", r->paired_tg_tps);
    csd_cli_json_set_real(o, "paired_roofline_fraction", f->paired);
    csd_cli_json_set_real(o, "read_ceiling_fraction", f->read_ceiling);
    csd_cli_json_set_real(o, "ceiling_tps", r->ceiling_tps);
    csd_cli_json_set_real(o, "stream_gbs", stream_gbs(r));
    csd_cli_json_set_real(o, "ceiling_fraction", f->ceiling);
    csd_cli_json_set_real(o, "ceiling_tg_tps", r->ceiling_tg_tps);
    csd_cli_json_set_real(o, "ceiling_tg_fraction", f->ceiling_tg);
    json_object_set_new(o, "membw_streams", json_integer(r->membw_way.streams));
    json_object_set_new(o, "membw_nta", json_boolean(r->membw_way.nta));
    json_t *load = json_array();
    json_array_append_new(load, json_real(r->load_before));
    json_array_append_new(load, json_real(r->load_after));
    json_object_set_new(o, "load_avg", load);
    if (!csd_cli_json_print(o)) fprintf(stderr, "cascadia bench: cannot write the JSON result\n");
}

static void print_result(const csd_bench_args *a, const csd_model *m, const bench_result *r) {
    const char *prec = csd_dtype_name(csd_model_precision(m));
    int threads = csd_pool_size(csd_model_pool((csd_model *)m));
    bench_fractions f = fractions_of(r);
    if (a->json) {
        print_result_json(a, m, r, &f);
        return;
    }
    printf("| model | precision | size | threads | test | t/s |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
    double mib = (double)csd_model_weight_bytes(m) / (1 << 20);
    char at[32] = ""; /* llama-bench's label for a test at depth */
    if (a->depth > 0) snprintf(at, sizeof at, " @ d%lld", (long long)a->depth);
    if (a->n_prompt > 0)
        printf("| %s | %s | %.1f MiB | %d | pp%lld%s | %.2f ± %.2f |\n", base_name(a->model_dir),
               prec, mib, threads, (long long)a->n_prompt, at, r->pp_tps, r->pp_sd);
    if (a->n_gen > 0)
        printf("| %s | %s | %.1f MiB | %d | tg%lld%s | %.2f ± %.2f |\n", base_name(a->model_dir),
               prec, mib, threads, (long long)a->n_gen, at, r->tg_tps, r->tg_sd);
    if (a->membw_mib > 0 && a->n_gen > 0) {
        char kv[64] = "";
        if (r->kv_bytes > 0)
            snprintf(kv, sizeof kv, " + %.2f MiB KV cache", (double)r->kv_bytes / (1 << 20));
        char way[160], peak[256]; /* how the read test read; what the peak is */
        snprintf(way, sizeof way,
                 "%d threads, %d streams each, %s prefetch; the best of %d passes, whose median "
                 "is %.2f GB/s",
                 threads, r->membw_way.streams, r->membw_way.nta ? "non-temporal" : "ordinary",
                 r->test_median_n, r->test_median_gbs);
        if (r->peak_source && strcmp(r->peak_source, "read test"))
            snprintf(peak, sizeof peak,
                     "bandwidth sustained by the %s, above the read test's %.2f GB/s (%s)",
                     r->peak_source, r->test_gbs, way);
        else
            snprintf(peak, sizeof peak, "read bandwidth (%s)", way);
        printf("\nroofline: %.1f MiB weights%s read per token / %.2f GB/s %s = %.2f t/s; "
               "generation reaches %.1f%% of it (kernels %s, prefetch %zu B ahead)\n",
               (double)r->weight_bytes / (1 << 20), kv, r->membw_gbs, peak, f.roof, 100 * f.peak,
               csd_kern_name(), csd_kern_pf_ahead());
        printf(
            "paired:   each generated token followed by a read of its bytes: %.2f GB/s read "
            "(%.1f%% of the peak: a step that only read its bytes would reach that), %.2f t/s "
            "generated in the same seconds; generation reaches %.1f%% of that roofline\n",
            r->paired_gbs, 100 * f.read_ceiling, r->paired_tg_tps, 100 * f.paired);
        printf(
            "ceiling:  the weight stream alone (every matrix times one token, one job per input "
            "width and dtype, nothing between): %.2f t/s = %.1f%% of the roofline; the tokens "
            "alternated with it: %.2f t/s, %.1f%% of it\n",
            r->ceiling_tps, 100 * f.ceiling, r->ceiling_tg_tps, 100 * f.ceiling_tg);
    }
    printf("load average (1 min) before / after: %.2f / %.2f\n", r->load_before, r->load_after);
}

/* The single-model benchmark: prompt processing, generation and the roofline. */
static int bench_one_model(csd_bench_args *a) {
    csd_err err = {0};
    csd_model *model = NULL;
    /* llama-bench's sizing: the context holds the longest test, one batch holds the prompt */
    if (a->model.max_ctx <= 0) a->model.max_ctx = a->depth + a->n_prompt + a->n_gen + 16;
    if (a->n_prompt > CSD_MODEL_DEFAULT_MAX_BATCH) a->model.max_batch = a->n_prompt;
    uint64_t t0 = csd_now_ns();
    int rc = csd_model_open(&model, a->model_dir, &a->model, &err);
    if (!rc) {
        fprintf(stderr, "loaded %s in %.2f s: %s weights (%.1f MiB), %d threads, kernels %s\n",
                a->model_dir, (double)(csd_now_ns() - t0) * 1e-9,
                csd_dtype_name(csd_model_precision(model)),
                (double)csd_model_weight_bytes(model) / (1 << 20),
                csd_pool_size(csd_model_pool(model)), csd_kern_name());
        int64_t trained = csd_model_cfg(model)->max_seq_len,
                longest = a->depth + a->n_prompt + a->n_gen;
        if (trained > 0 && longest > trained) /* as llama-bench: measured anyway, but say so */
            fprintf(stderr,
                    "cascadia bench: warning: -d %lld + -p %lld + -n %lld = %lld tokens is past "
                    "the model's trained context of %lld (max_position_embeddings)\n",
                    (long long)a->depth, (long long)a->n_prompt, (long long)a->n_gen,
                    (long long)longest, (long long)trained);
        bench_result res;
        memset(&res, 0, sizeof res);
        rc = bench_model(model, a, &res, &err);
        if (!rc) print_result(a, model, &res);
    }
    if (rc) csd_cli_error("bench", &err);
    csd_model_destroy(model);
    return rc ? 1 : 0;
}

int csd_cmd_bench(int argc, char **argv) {
    csd_bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    csd_kern_init();
    if (a.n_levels)
        rc = csd_cli_bench_concurrency(&a);
    else if (a.fleet.fleet)
        rc = csd_cli_bench_fleet(&a);
    else
        rc = bench_one_model(&a);
    if (rc == 0 && !a.json) {
        printf("\n");
        csd_cli_bench_print_build();
    }
    return rc;
}
