/* bench_engine: the serving-side benchmarks of `cascadia bench`. --concurrency submits N streams
 * at once to the continuous-batching engine (over a local pipeline or a fleet) and reports the
 * aggregate and per-stream rates, like llama-batched-bench. --fleet alone drives one stream
 * through the fleet and splits each token's time into stage compute, network + wait and the
 * coordinator's own overhead (csd_fleet_pipeline_timing). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "bench_internal.h"
#include "cli_json.h"
#include "cli_util.h"
#include "coord/engine.h"
#include "coord/pipeline.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"

/* Seconds to wait for a fleet to report ready before giving up. */
#define FLEET_READY_TIMEOUT_S 30.0

/* ---- the pipeline under test ---------------------------------------------------------------- */

typedef struct bench_target {
    csd_model *model;     /* local pipeline: owned */
    csd_pipeline *pipe;
} bench_target;

static int target_open(csd_bench_args *a, int max_requests, int64_t ctx, bench_target *t,
                       csd_err *err) {
    memset(t, 0, sizeof *t);
    if (a->model.max_ctx <= 0) a->model.max_ctx = ctx;
    int rc;
    if (a->fleet.fleet) {
        rc = csd_cli_fleet_open(&a->fleet, &a->model, max_requests, &t->pipe, err);
        if (rc) return rc;
        uint64_t t0 = csd_now_ns();
        while (t->pipe->ops->ready && !t->pipe->ops->ready(t->pipe)) {
            if ((double)(csd_now_ns() - t0) * 1e-9 > FLEET_READY_TIMEOUT_S)
                return csd_err_set(err, CSD_ETIMEOUT, "the fleet is not ready after %.0f s",
                                   FLEET_READY_TIMEOUT_S);
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        fprintf(stderr, "fleet ready in %.2f s\n", (double)(csd_now_ns() - t0) * 1e-9);
        return 0;
    }
    uint64_t t0 = csd_now_ns();
    rc = csd_model_open(&t->model, a->model_dir, &a->model, err);
    if (rc) return rc;
    fprintf(stderr, "loaded %s in %.2f s: %s weights (%.1f MiB), %d threads, kernels %s\n",
            a->model_dir, (double)(csd_now_ns() - t0) * 1e-9,
            csd_dtype_name(csd_model_precision(t->model)),
            (double)csd_model_weight_bytes(t->model) / (1 << 20),
            csd_pool_size(csd_model_pool(t->model)), csd_kern_name());
    return csd_local_pipeline_create(&t->pipe, t->model, max_requests, err);
}

static void target_close(csd_bench_args *a, bench_target *t) {
    if (t->pipe) t->pipe->ops->destroy(t->pipe);
    csd_cli_fleet_close(&a->fleet);
    csd_model_destroy(t->model);
    memset(t, 0, sizeof *t);
}

/* Threads of the stage computed in this process (0 when every stage is remote). */
static int local_threads(const csd_bench_args *a, const bench_target *t) {
    if (t->model) return csd_pool_size(csd_model_pool(t->model));
    if (a->fleet.model0) return csd_pool_size(csd_model_pool(a->fleet.model0));
    return 0;
}

static int count_stages(const csd_bench_args *a) {
    int n = 1;
    for (const char *p = a->fleet.fleet; *p; p++) n += *p == ',';
    return n + (a->fleet.local_stage == 0);
}

/* ---- --concurrency --------------------------------------------------------------------------- */

typedef struct level_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    csd_req_result res[CSD_BENCH_MAX_STREAMS];
} level_run;

typedef struct stream_ctx {
    level_run *run;
    int idx;
} stream_ctx;

static bool on_token(void *ctx, const csd_token_event *ev) {
    (void)ctx;
    (void)ev;
    return false;
}

static void on_done(void *ctx, const csd_req_result *res) {
    stream_ctx *s = ctx;
    pthread_mutex_lock(&s->run->mu);
    s->run->res[s->idx] = *res;
    s->run->done++;
    pthread_cond_signal(&s->run->cv);
    pthread_mutex_unlock(&s->run->mu);
}

typedef struct level_result {
    int concurrency;
    /* all generated tokens / wall time (submit of the first to the last end) */
    double aggregate_tps;
    double per_stream_tps;  /* mean decode rate one stream sees (after its first token) */
    double ttft_s;          /* mean time to first token */
    double step_ms;         /* mean batched step of the engine */
    double wall_s;
    double load_avg;        /* 1-minute load average at the end of the level */
    int spec_draft;         /* the engine's --spec-draft */
    double vs_no_draft;     /* aggregate against the same level without speculation (1 there) */
    int64_t drafted, accepted; /* draft tokens proposed and agreed with (over the reps) */
} level_result;

/* Submits c streams at once and waits for all of them. */
static int run_level(csd_engine *e, const csd_bench_args *a, int c, int64_t n_gen, uint64_t *rng,
                     level_run *run, stream_ctx *sc, int32_t *prompt, level_result *out,
                     csd_err *err) {
    csd_req_params params;
    memset(&params, 0, sizeof params);
    csd_sampler_params_default(&params.sampling);
    params.sampling.temperature = 0; /* greedy */
    params.max_tokens = n_gen;
    params.ignore_eos = true;
    csd_req_callbacks cb = {on_token, on_done};
    int64_t vocab = csd_engine_model(e)->vocab_size;
    csd_engine_stats st0, st1;
    csd_engine_get_stats(e, &st0);
    pthread_mutex_lock(&run->mu);
    run->done = 0;
    pthread_mutex_unlock(&run->mu);
    uint64_t t0 = csd_now_ns();
    for (int i = 0; i < c; i++) {
        csd_cli_bench_random_ids(prompt, a->stream_prompt, vocab, rng);
        sc[i].run = run;
        sc[i].idx = i;
        uint64_t id;
        int rc = csd_engine_submit(e, prompt, a->stream_prompt, &params, &cb, &sc[i], &id, err);
        if (rc) { /* let the ones already submitted finish before returning */
            pthread_mutex_lock(&run->mu);
            while (run->done < i) pthread_cond_wait(&run->cv, &run->mu);
            pthread_mutex_unlock(&run->mu);
            return rc;
        }
    }
    pthread_mutex_lock(&run->mu);
    while (run->done < c) pthread_cond_wait(&run->cv, &run->mu);
    pthread_mutex_unlock(&run->mu);
    double wall = (double)(csd_now_ns() - t0) * 1e-9;
    csd_engine_get_stats(e, &st1);
    int64_t tokens = 0;
    double per = 0, ttft = 0;
    for (int i = 0; i < c; i++) {
        const csd_req_result *r = &run->res[i];
        if (r->end == CSD_REQ_END_ERROR)
            return csd_err_set(err, r->code ? r->code : CSD_EIO, "%s", r->message);
        tokens += r->completion_tokens;
        double dec = r->total_s - r->ttft_s;
        per += dec > 0 && r->completion_tokens > 1 ? (double)(r->completion_tokens - 1) / dec : 0;
        ttft += r->ttft_s;
    }
    out->concurrency = c;
    out->wall_s = wall;
    out->aggregate_tps = (double)tokens / wall;
    out->per_stream_tps = per / c;
    out->ttft_s = ttft / c;
    int64_t steps = st1.step_count - st0.step_count;
    out->step_ms = steps > 0 ? (st1.step_sum_s - st0.step_sum_s) / (double)steps * 1e3 : 0;
    out->drafted = st1.spec_draft_tokens - st0.spec_draft_tokens;
    out->accepted = st1.spec_accepted_tokens - st0.spec_accepted_tokens;
    return 0;
}

/* Percent of the draft tokens the model agreed with (0 when none were proposed). */
static double accepted_pct(const level_result *r) {
    return r->drafted > 0 ? 100.0 * (double)r->accepted / (double)r->drafted : 0;
}

/* The levels' table as a JSON array, one object per concurrency level. */
static void print_levels_json(const csd_bench_args *a, const char *where, int threads,
                              const level_result *res, int n) {
    json_t *all = json_array();
    for (int i = 0; all && i < n; i++) {
        json_t *o = json_pack("{s:s, s:i, s:i, s:I, s:I}", "pipeline", where, "threads", threads,
                              "concurrency", res[i].concurrency, "n_gen", (json_int_t)a->n_gen,
                              "prompt_tokens", (json_int_t)a->stream_prompt);
        if (!o) break;
        csd_cli_json_set_real(o, "aggregate_tps", res[i].aggregate_tps);
        csd_cli_json_set_real(o, "per_stream_tps", res[i].per_stream_tps);
        csd_cli_json_set_real(o, "speedup_vs_1", res[0].aggregate_tps > 0
                                                    ? res[i].aggregate_tps / res[0].aggregate_tps
                                                    : 0);
        csd_cli_json_set_real(o, "ttft_s", res[i].ttft_s);
        csd_cli_json_set_real(o, "step_ms", res[i].step_ms);
        csd_cli_json_set_real(o, "load_avg", res[i].load_avg);
        json_object_set_new(o, "spec_draft", json_integer(res[i].spec_draft));
        csd_cli_json_set_real(o, "speedup_vs_no_draft", res[i].vs_no_draft);
        json_object_set_new(o, "draft_tokens", json_integer(res[i].drafted));
        json_object_set_new(o, "accepted_tokens", json_integer(res[i].accepted));
        csd_cli_bench_json_build(o);
        json_array_append_new(all, o);
    }
    if (!csd_cli_json_print(all)) fprintf(stderr, "cascadia bench: cannot write the JSON result\n");
}

static void print_levels(const csd_bench_args *a, const bench_target *t, const level_result *res,
                         int n) {
    const char *where = a->fleet.fleet ? "fleet" : "local";
    int threads = local_threads(a, t);
    if (a->json) {
        print_levels_json(a, where, threads, res, n);
        return;
    }
    printf("| pipeline | threads | streams | spec draft | prompt | gen | aggregate t/s | "
           "per-stream t/s | vs first level | vs no draft | TTFT s | step ms | accepted | load "
           "|\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
           "---: | ---: |\n");
    for (int i = 0; i < n; i++) {
        char acc[32] = "-"; /* no draft proposed */
        if (res[i].drafted > 0) snprintf(acc, sizeof acc, "%.1f%%", accepted_pct(&res[i]));
        printf("| %s | %d | %d | %d | %lld | %lld | %.2f | %.2f | %.2fx | %.2fx | %.3f | %.1f | %s "
               "| %.2f |\n",
               where, threads, res[i].concurrency, res[i].spec_draft, (long long)a->stream_prompt,
               (long long)a->n_gen, res[i].aggregate_tps, res[i].per_stream_tps,
               res[0].aggregate_tps > 0 ? res[i].aggregate_tps / res[0].aggregate_tps : 0,
               res[i].vs_no_draft, res[i].ttft_s, res[i].step_ms, acc, res[i].load_avg);
    }
}

/* Adds one repetition's figures to a level's means over reps (its draft counts to totals). */
static void add_rep(level_result *sum, const level_result *one, int reps) {
    sum->aggregate_tps += one->aggregate_tps / reps;
    sum->per_stream_tps += one->per_stream_tps / reps;
    sum->ttft_s += one->ttft_s / reps;
    sum->step_ms += one->step_ms / reps;
    sum->wall_s += one->wall_s / reps;
    sum->drafted += one->drafted;
    sum->accepted += one->accepted;
}

/* The draft model of --draft-model, checked against the served model's tokenizer (in its
 * directory, or the fleet's manifest). */
static int open_draft(csd_bench_args *a, const bench_target *t, int slots, int64_t ctx,
                      csd_err *err) {
    if (!a->draft.dir) return 0;
    csd_tok *tok = NULL;
    int rc = csd_tok_load(&tok, a->model_dir ? a->model_dir : a->fleet.manifest, err);
    if (!rc)
        rc = csd_cli_draft_open(&a->draft, &a->model, tok, slots, slots, ctx,
                                t->pipe->cfg.vocab_size, err);
    csd_tok_destroy(tok);
    return rc;
}

/* The engines under test: without speculation, and with --spec-draft when it is given. Each
 * repetition runs both on the same prompts, one after the other, so that their figures share
 * the machine's moment. Returns how many engines were made (0 on failure). */
static int make_engines(const csd_bench_args *a, int max_c, bench_target *t, csd_engine **e,
                        csd_err *err) {
    int n = a->spec_draft > 0 ? 2 : 1;
    for (int k = 0; k < n; k++) {
        csd_engine_opts eo;
        csd_engine_opts_default(&eo);
        eo.parallel = max_c;
        eo.max_ctx = a->stream_prompt + a->n_gen + 8;
        eo.spec_draft = k ? (int)a->spec_draft : 0;
        eo.draft_model = k ? a->draft.draft : NULL;
        if (csd_engine_create(&e[k], &t->pipe, 1, NULL, 0, &eo, err)) return 0;
    }
    return n;
}

/* Runs every level a->reps times on each engine; rows of res: a level's engines in order. */
static int run_levels(const csd_bench_args *a, csd_engine **e, int n_eng, level_run *run,
                      stream_ctx *sc, int32_t *prompt, level_result *res, csd_err *err) {
    uint64_t rng = a->seed;
    level_result warm;
    int rc = 0;
    for (int k = 0; !rc && k < n_eng; k++) /* pages, scratch */
        rc = run_level(e[k], a, 1, 8, &rng, run, sc, prompt, &warm, err);
    for (int l = 0; !rc && l < a->n_levels; l++) {
        level_result *rows = res + l * n_eng;
        for (int r = 0; !rc && r < a->reps; r++) {
            uint64_t start = rng;
            for (int k = 0; !rc && k < n_eng; k++) {
                level_result one;
                rng = start; /* the same prompts for every engine */
                rc = run_level(e[k], a, a->levels[l], a->n_gen, &rng, run, sc, prompt, &one, err);
                if (rc) break;
                fprintf(stderr,
                        "streams %d spec %d rep %d: %.2f t/s aggregate, %.2f t/s per stream, "
                        "step %.1f ms\n",
                        a->levels[l], k ? (int)a->spec_draft : 0, r + 1, one.aggregate_tps,
                        one.per_stream_tps, one.step_ms);
                add_rep(&rows[k], &one, a->reps);
            }
        }
        for (int k = 0; k < n_eng; k++) {
            rows[k].vs_no_draft =
                rows[0].aggregate_tps > 0 ? rows[k].aggregate_tps / rows[0].aggregate_tps : 0;
            rows[k].concurrency = a->levels[l];
            rows[k].spec_draft = k ? (int)a->spec_draft : 0;
            rows[k].load_avg = csd_cli_bench_loadavg();
        }
    }
    return rc;
}

int csd_cli_bench_concurrency(csd_bench_args *a) {
    csd_err err = {0};
    int max_c = 1;
    for (int i = 0; i < a->n_levels; i++) max_c = a->levels[i] > max_c ? a->levels[i] : max_c;
    bench_target t;
    csd_engine *e[2] = {NULL, NULL};
    level_run *run = csd_alloc(sizeof *run);
    stream_ctx *sc = csd_alloc_array((size_t)max_c, sizeof *sc);
    int32_t *prompt = csd_alloc_array((size_t)a->stream_prompt, sizeof(int32_t));
    level_result res[2 * CSD_BENCH_MAX_LEVELS];
    memset(res, 0, sizeof res);
    if (!run || !sc || !prompt) {
        csd_free(run);
        csd_free(sc);
        csd_free(prompt);
        fprintf(stderr, "cascadia bench: out of memory\n");
        return 1;
    }
    pthread_mutex_init(&run->mu, NULL);
    pthread_cond_init(&run->cv, NULL);
    int rc = target_open(a, max_c, a->stream_prompt + a->n_gen + 16, &t, &err);
    int64_t need = a->stream_prompt + a->n_gen + 8; /* the engines' context (make_engines) */
    if (!rc && t.pipe->max_ctx < need) /* else every stream would end early, unreported */
        rc = csd_err_set(&err, CSD_ERANGE,
                         "a context of %lld tokens (--ctx) cannot hold %lld prompt and %lld "
                         "generated tokens; give at least %lld",
                         (long long)t.pipe->max_ctx, (long long)a->stream_prompt,
                         (long long)a->n_gen, (long long)need);
    if (!rc) rc = open_draft(a, &t, max_c, need, &err);
    int n_eng = rc ? 0 : make_engines(a, max_c, &t, e, &err);
    if (!rc && n_eng == 0) rc = err.code ? err.code : CSD_EINVAL;
    if (!rc) rc = run_levels(a, e, n_eng, run, sc, prompt, res, &err);
    if (!rc) print_levels(a, &t, res, a->n_levels * n_eng);
    if (rc) csd_cli_error("bench", &err);
    csd_engine_destroy(e[0]);
    csd_engine_destroy(e[1]);
    csd_cli_draft_close(&a->draft);
    target_close(a, &t);
    pthread_cond_destroy(&run->cv);
    pthread_mutex_destroy(&run->mu);
    csd_free(run);
    csd_free(sc);
    csd_free(prompt);
    return rc ? 1 : 0;
}

/* ---- --fleet: one stream and where its time goes ------------------------------------------ */

typedef struct fleet_result {
    double pp_tps, pp_sd, tg_tps, tg_sd;
    double token_ms;       /* wall time per generated token */
    double local_ms;       /* stage 0 in this process */
    double remote_ms;      /* the workers' forward time */
    double network_ms;     /* wait minus the workers' compute: transfers, queueing, wake-ups */
    double coord_ms;       /* the rest: the coordinator's own work between and around steps */
    double rtt_ms;
    uint64_t steps;
    double load_avg;       /* 1-minute load average after the tests */
} fleet_result;

static int fleet_measure(csd_bench_args *a, csd_pipeline *p, fleet_result *out, csd_err *err) {
    const uint32_t req = 1;
    int64_t n_ids = (a->n_prompt > a->n_gen ? a->n_prompt : a->n_gen) + 1;
    int32_t *ids = csd_alloc_array((size_t)n_ids, sizeof(int32_t));
    float *logits = csd_alloc_array((size_t)p->cfg.vocab_size, sizeof(float));
    double *v = csd_alloc_array((size_t)a->reps, sizeof(double));
    int rc = ids && logits && v ? 0 : csd_err_set(err, CSD_ENOMEM, "benchmark buffers");
    bool opened = false;
    uint64_t rng = a->seed;
    if (!rc) {
        csd_cli_bench_random_ids(ids, n_ids, p->cfg.vocab_size, &rng);
        rc = p->ops->open(p, req, a->n_prompt + a->n_gen + 16, err);
        opened = !rc;
    }
    /* warm-up: as the single-model test's (cmd_bench.c), within the ids and the context */
    int64_t warm = a->n_prompt > 0 ? (a->n_prompt < 32 ? a->n_prompt : 32) : 1;
    if (!rc) rc = p->ops->forward(p, req, ids, warm, logits, err);
    for (int r = 0; !rc && a->n_prompt > 0 && r < a->reps; r++) {
        rc = p->ops->truncate(p, req, 0, err);
        uint64_t t0 = csd_now_ns();
        if (!rc) rc = p->ops->forward(p, req, ids, a->n_prompt, logits, err);
        v[r] = (double)a->n_prompt / ((double)(csd_now_ns() - t0) * 1e-9);
    }
    if (!rc && a->n_prompt > 0) csd_cli_bench_stats(v, a->reps, &out->pp_tps, &out->pp_sd);
    csd_fleet_timing t0, t1;
    if (!rc) csd_fleet_pipeline_timing(p, &t0);
    double wall = 0;
    for (int r = 0; !rc && a->n_gen > 0 && r < a->reps; r++) {
        rc = p->ops->truncate(p, req, 0, err);
        uint64_t s = csd_now_ns();
        /* greedy decode steps, as `run` makes them */
        for (int64_t i = 0; !rc && i < a->n_gen; i++) {
            csd_step_entry e = {req, &ids[i], 1, true, true, false};
            rc = p->ops->step_begin(p, &e, 1, logits, err);
            if (!rc) rc = p->ops->step_end(p, NULL, err);
        }
        double dt = (double)(csd_now_ns() - s) * 1e-9;
        wall += dt;
        v[r] = (double)a->n_gen / dt;
    }
    if (!rc && a->n_gen > 0) {
        csd_cli_bench_stats(v, a->reps, &out->tg_tps, &out->tg_sd);
        csd_fleet_pipeline_timing(p, &t1);
        double tokens = (double)a->n_gen * a->reps;
        out->steps = t1.steps - t0.steps;
        out->token_ms = wall / tokens * 1e3;
        out->local_ms = (t1.local_compute_s - t0.local_compute_s) / tokens * 1e3;
        out->remote_ms = (t1.remote_compute_s - t0.remote_compute_s) / tokens * 1e3;
        double wait_ms = (t1.wait_s - t0.wait_s) / tokens * 1e3;
        out->network_ms = wait_ms - out->remote_ms;
        out->coord_ms = out->token_ms - out->local_ms - wait_ms;
        out->rtt_ms = t1.rtt_s * 1e3;
    }
    out->load_avg = csd_cli_bench_loadavg();
    if (opened) p->ops->close(p, req);
    csd_free(v);
    csd_free(logits);
    csd_free(ids);
    return rc;
}

/* The fleet's figures as one JSON object. */
static void print_fleet_json(const csd_bench_args *a, int stages, int threads,
                             const fleet_result *r) {
    double T = r->token_ms > 0 ? r->token_ms : 1;
    json_t *o = json_pack("{s:s, s:i, s:b, s:i, s:I, s:I, s:i}", "mode", "fleet", "stages",
                          stages, "local_stage", a->fleet.local_stage == 0, "local_threads",
                          threads, "n_prompt", (json_int_t)a->n_prompt, "n_gen",
                          (json_int_t)a->n_gen, "reps", a->reps);
    if (o) {
        csd_cli_json_set_real(o, "pp_tps", r->pp_tps);
        csd_cli_json_set_real(o, "pp_sd", r->pp_sd);
        csd_cli_json_set_real(o, "tg_tps", r->tg_tps);
        csd_cli_json_set_real(o, "tg_sd", r->tg_sd);
        csd_cli_json_set_real(o, "ms_per_token", r->token_ms);
        csd_cli_json_set_real(o, "local_compute_ms", r->local_ms);
        csd_cli_json_set_real(o, "remote_compute_ms", r->remote_ms);
        csd_cli_json_set_real(o, "network_wait_ms", r->network_ms);
        csd_cli_json_set_real(o, "coordinator_ms", r->coord_ms);
        csd_cli_json_set_real(o, "coordinator_pct", 100 * r->coord_ms / T);
        csd_cli_json_set_real(o, "rtt_ms", r->rtt_ms);
        csd_cli_json_set_real(o, "load_avg", r->load_avg);
        csd_cli_bench_json_build(o);
    }
    if (!csd_cli_json_print(o)) fprintf(stderr, "cascadia bench: cannot write the JSON result\n");
}

static void print_fleet(const csd_bench_args *a, const bench_target *t, const fleet_result *r) {
    int stages = count_stages(a), threads = local_threads(a, t);
    double T = r->token_ms > 0 ? r->token_ms : 1;
    if (a->json) {
        print_fleet_json(a, stages, threads, r);
        return;
    }
    printf("| fleet | stages | test | t/s |\n| --- | ---: | ---: | ---: |\n");
    if (a->n_prompt > 0)
        printf("| %s | %d | pp%lld | %.2f ± %.2f |\n", a->fleet.fleet, stages,
               (long long)a->n_prompt, r->pp_tps, r->pp_sd);
    if (a->n_gen <= 0) return;
    printf("| %s | %d | tg%lld | %.2f ± %.2f |\n", a->fleet.fleet, stages, (long long)a->n_gen,
           r->tg_tps, r->tg_sd);
    printf("\nwhere the %.2f ms of a generated token go (%llu steps, link RTT %.3f ms):\n\n",
           r->token_ms, (unsigned long long)r->steps, r->rtt_ms);
    printf("| part | ms/token | share |\n| --- | ---: | ---: |\n");
    if (a->fleet.local_stage == 0)
        printf("| stage 0 compute (this process, %d threads) | %.2f | %.1f%% |\n", threads,
               r->local_ms, 100 * r->local_ms / T);
    printf("| remote stage compute (workers' forward) | %.2f | %.1f%% |\n", r->remote_ms,
           100 * r->remote_ms / T);
    printf("| network + wait | %.2f | %.1f%% |\n", r->network_ms, 100 * r->network_ms / T);
    printf("| coordinator overhead | %.2f | %.1f%% |\n", r->coord_ms, 100 * r->coord_ms / T);
    printf("| total | %.2f | 100%% |\n", r->token_ms);
    printf("\nload average (1 min): %.2f\n", r->load_avg);
}

int csd_cli_bench_fleet(csd_bench_args *a) {
    csd_err err = {0};
    bench_target t;
    int rc = target_open(a, 1, a->n_prompt + a->n_gen + 16, &t, &err);
    fleet_result res;
    memset(&res, 0, sizeof res);
    if (!rc) rc = fleet_measure(a, t.pipe, &res, &err);
    if (!rc) print_fleet(a, &t, &res);
    if (rc) csd_cli_error("bench", &err);
    target_close(a, &t);
    return rc ? 1 : 0;
}
