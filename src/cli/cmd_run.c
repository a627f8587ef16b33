/* cmd_run: `cascadia run MODEL_DIR -p TEXT`: generate on this machine and stream the text.
 * Prints the prompt and its continuation to stdout (like llama2.c and llama-cli), token rates to
 * stderr; --print-ids prints the generated ids instead of text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "draft_setup.h"
#include "fleet_setup.h"
#include "coord/generate.h"
#include "coord/ngram_draft.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "tok/tokenizer.h"

static const char *const run_usage =
    "usage: cascadia run MODEL_DIR -p TEXT [options]\n"
    "       cascadia run --fleet H:P,... --manifest DIR (--key FILE | --insecure)\n"
    "                      -p TEXT [options]\n"
    "  -p, --prompt TEXT   the prompt\n"
    "  -n N                tokens to generate (default 128)\n"
    "  --temp T            temperature, 0 = greedy (default 0.8)\n"
    "  --top-k K           (default 40, 0 = off)\n"
    "  --top-p P           (default 0.95)\n"
    "  --min-p P           (default 0.05)\n"
    "  --repeat-penalty R  (default 1.0 = off)\n"
    "  --presence-penalty F, --frequency-penalty F   (default 0)\n"
    "  --seed S            sampling seed (default 24301)\n"
    "  --logit-bias ID=B   add B (-100..100) to token ID's logit; repeatable (also ID+B, ID-B)\n"
    "  --ignore-eos        keep generating past end-of-text\n"
    "  --spec-draft N      speculative decoding: propose up to N tokens found after an earlier\n"
    "                      occurrence of the last ones, checked in one step (the text is the\n"
    "                      same; default 0 = off, at most 16)\n" CSD_CLI_DRAFT_FLAGS_HELP
    "  --print-ids         print the generated token ids instead of text\n" CSD_CLI_MODEL_DIR_HELP
        CSD_CLI_MODEL_FLAGS_HELP CSD_CLI_FLEET_FLAGS_HELP;

typedef struct run_args {
    const char *model_dir;
    const char *prompt;
    csd_gen_params gen;
    csd_model_opts model;
    bool print_ids;
    csd_cli_fleet fleet;
    csd_cli_draft draft;
} run_args;

/* --logit-bias ID=BIAS, or llama-cli's ID+BIAS / ID-BIAS; a repeated ID replaces its bias. */
static bool parse_logit_bias(const char *value, csd_sampler_params *sp) {
    size_t digits = value ? strspn(value, "0123456789") : 0;
    char sep = digits ? value[digits] : '\0';
    long long id = digits && digits <= 10 ? strtoll(value, NULL, 10) : -1;
    if (id < 0 || id > INT32_MAX || (sep != '=' && sep != '+' && sep != '-')) {
        fprintf(stderr,
                "cascadia run: --logit-bias expects ID=BIAS (or ID+BIAS, ID-BIAS), got '%s'\n",
                value ? value : "");
        return false;
    }
    double bias; /* the sign of ID+BIAS / ID-BIAS belongs to the number */
    if (!csd_cli_float("run", "--logit-bias", value + digits + (sep == '='), -100, 100, &bias))
        return false;
    int32_t i = 0;
    while (i < sp->n_logit_bias && sp->logit_bias[i].id != (int32_t)id) i++;
    if (i == CSD_SAMPLER_MAX_LOGIT_BIAS) {
        fprintf(stderr, "cascadia run: at most %d --logit-bias tokens\n",
                CSD_SAMPLER_MAX_LOGIT_BIAS);
        return false;
    }
    sp->logit_bias[i] = (csd_logit_bias){(int32_t)id, (float)bias};
    if (i == sp->n_logit_bias) sp->n_logit_bias++;
    return true;
}

static int parse_sampling_flag(const char *flag, const char *value, csd_sampler_params *sp) {
    double d;
    int64_t v;
    if (!strcmp(flag, "--temp")) {
        if (!csd_cli_float("run", flag, value, 0, 100, &d)) return -1;
        sp->temperature = (float)d;
    } else if (!strcmp(flag, "--top-k")) {
        if (!csd_cli_int("run", flag, value, 0, 1 << 20, &v)) return -1;
        sp->top_k = (int32_t)v;
    } else if (!strcmp(flag, "--top-p")) {
        if (!csd_cli_float("run", flag, value, 1e-6, 1, &d)) return -1;
        sp->top_p = (float)d;
    } else if (!strcmp(flag, "--min-p")) {
        if (!csd_cli_float("run", flag, value, 0, 1, &d)) return -1;
        sp->min_p = (float)d;
    } else if (!strcmp(flag, "--repeat-penalty")) {
        if (!csd_cli_float("run", flag, value, 1e-3, 10, &d)) return -1;
        sp->repetition_penalty = (float)d;
    } else if (!strcmp(flag, "--presence-penalty")) {
        if (!csd_cli_float("run", flag, value, -2, 2, &d)) return -1;
        sp->presence_penalty = (float)d;
    } else if (!strcmp(flag, "--frequency-penalty")) {
        if (!csd_cli_float("run", flag, value, -2, 2, &d)) return -1;
        sp->frequency_penalty = (float)d;
    } else if (!strcmp(flag, "--seed")) {
        if (!csd_cli_int("run", flag, value, 0, INT64_MAX, &v)) return -1;
        sp->seed = (uint64_t)v;
    } else if (!strcmp(flag, "--logit-bias")) {
        if (!parse_logit_bias(value, sp)) return -1;
    } else {
        return 0;
    }
    return 1;
}

/* Returns 0 to go on, or the exit code. */
static int parse_args(int argc, char **argv, run_args *a) {
    memset(a, 0, sizeof *a);
    csd_model_opts_default(&a->model);
    csd_cli_fleet_init(&a->fleet);
    csd_sampler_params_default(&a->gen.sampling);
    a->gen.max_tokens = 128;
    a->gen.spec_draft = -1; /* not given */
    a->draft = CSD_CLI_DRAFT_NONE;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t v;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(run_usage, stdout);
            return -1;
        } else if (!strcmp(f, "--print-ids")) {
            a->print_ids = true;
        } else if (!strcmp(f, "--ignore-eos")) {
            a->gen.ignore_eos = true;
        } else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) {
            if (!value) {
                fprintf(stderr, "cascadia run: %s needs a value\n", f);
                return 2;
            }
            a->prompt = argv[++i];
        } else if (!strcmp(f, "-n")) {
            if (!csd_cli_int("run", f, value, 1, 1 << 20, &v)) return 2;
            a->gen.max_tokens = v;
            i++;
        } else if (!strcmp(f, "--spec-draft")) {
            if (!csd_cli_int("run", f, value, 0, CSD_SPEC_MAX_DRAFT, &v)) return 2;
            a->gen.spec_draft = (int)v;
            i++;
        } else if (f[0] == '-') {
            bool takes = true;
            int r = csd_cli_fleet_flag("run", f, value, &a->fleet, &takes);
            if (r == 1) {
                i += takes;
                continue;
            }
            if (r == 0) r = parse_sampling_flag(f, value, &a->gen.sampling);
            if (r == 0) r = csd_cli_model_flag("run", f, value, &a->model);
            if (r == 0) r = csd_cli_draft_flag("run", f, value, &a->draft);
            if (r < 0) return 2;
            if (r == 0) {
                fprintf(stderr, "cascadia run: unknown option '%s'\n%s", f, run_usage);
                return 2;
            }
            i++;
        } else if (!a->model_dir) {
            a->model_dir = f;
        } else {
            fprintf(stderr, "cascadia run: unexpected argument '%s'\n", f);
            return 2;
        }
    }
    a->gen.spec_draft = (int)csd_cli_draft_spec("run", &a->draft, a->gen.spec_draft);
    if (a->gen.spec_draft < 0) return 2;
    if (!csd_cli_fleet_check("run", &a->fleet)) return 2;
    if (a->fleet.fleet && a->model_dir) {
        fprintf(stderr, "cascadia run: give MODEL_DIR or --fleet/--manifest, not both\n");
        return 2;
    }
    if (a->fleet.fleet) a->model_dir = a->fleet.manifest; /* the tokenizer lives there */
    if (!a->model_dir || !a->prompt) {
        fprintf(stderr,
                "cascadia run: MODEL_DIR (or --fleet/--manifest) and -p TEXT are required\n%s",
                run_usage);
        return 2;
    }
    return 0;
}

typedef struct run_output {
    bool print_ids;
    csd_detok detok;
    char buf[CSD_DETOK_PIECE_MAX]; /* one token's text: never fills (tokenizer.h) */
} run_output;

static bool on_token(void *ctx, int32_t id, const float *logits) {
    (void)logits;
    run_output *o = ctx;
    if (o->print_ids) {
        printf("%d ", id);
    } else {
        size_t len = 0;
        if (csd_detok_push(&o->detok, id, o->buf, sizeof o->buf, &len) == 0)
            fwrite(o->buf, 1, len, stdout);
    }
    fflush(stdout);
    return false;
}

static void print_stats(const csd_gen_stats *st) {
    double pp = st->prompt_s > 0 ? (double)st->n_prompt / st->prompt_s : 0;
    /* the first generated token comes from the prefill; the rest from decode steps */
    double tg = st->gen_s > 0 && st->n_gen > 1 ? (double)(st->n_gen - 1) / st->gen_s : 0;
    fprintf(
        stderr,
        "\nprompt: %lld tokens, %.2f tok/s | generation: %lld tokens, %.2f tok/s | finish: %s\n",
        (long long)st->n_prompt, pp, (long long)st->n_gen, tg, csd_finish_name(st->finish));
    if (st->spec_draft_tokens > 0)
        fprintf(stderr, "speculative decoding: %lld of %lld draft tokens agreed\n",
                (long long)st->spec_accepted_tokens, (long long)st->spec_draft_tokens);
}

static int generate_text(const run_args *a, csd_pipeline *pipe, const csd_tok *tok, csd_err *err) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    /* before the prompt is echoed: a --logit-bias id outside the model's vocabulary */
    int rc = csd_sampler_params_check(&a->gen.sampling, (int32_t)pipe->cfg.vocab_size, err);
    if (!rc) rc = csd_tok_encode(tok, a->prompt, strlen(a->prompt), true, false, &ids, &n_ids, err);
    if (rc) return rc;
    run_output *out = csd_alloc(sizeof *out);
    if (!out) {
        csd_free(ids);
        return csd_err_set(err, CSD_ENOMEM, "output buffer");
    }
    out->print_ids = a->print_ids;
    csd_detok_init(&out->detok, tok, true);
    if (!a->print_ids) /* echo the prompt through the same detokenizer so spacing matches */
        for (size_t i = 0; i < n_ids; i++) on_token(out, ids[i], NULL);
    csd_gen_params gp = a->gen;
    int32_t eog[CSD_CLI_MAX_EOG];
    int n_eog = csd_cli_collect_eog(tok, eog, CSD_CLI_MAX_EOG);
    if (n_eog) {
        gp.eog_ids = eog;
        gp.n_eog = n_eog;
    }
    csd_gen_stats st;
    rc = csd_generate(pipe, 1, ids, (int64_t)n_ids, &gp, on_token, out, &st, err);
    if (!rc) {
        size_t len = 0;
        if (!a->print_ids && csd_detok_flush(&out->detok, out->buf, sizeof out->buf, &len) == 0)
            fwrite(out->buf, 1, len, stdout);
        printf("\n");
        fflush(stdout);
        print_stats(&st);
    }
    csd_free(out);
    csd_free(ids);
    return rc;
}

int csd_cmd_run(int argc, char **argv) {
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    csd_err err = {0};
    csd_model *model = NULL;
    csd_tok *tok = NULL;
    csd_pipeline *pipe = NULL;
    csd_kern_init();
    uint64_t t0 = csd_now_ns();
    rc = csd_tok_load(&tok, a.model_dir, &err);
    if (!rc && a.fleet.fleet) {
        rc = csd_cli_fleet_open(&a.fleet, &a.model, 1, &pipe, &err);
        if (!rc)
            fprintf(stderr, "connected to the fleet in %.2f s\n",
                    (double)(csd_now_ns() - t0) * 1e-9);
    } else if (!rc) {
        rc = csd_model_open(&model, a.model_dir, &a.model, &err);
        if (!rc) csd_cli_warn_ctx("run", csd_model_max_ctx(model), model);
    }
    if (!rc && !a.fleet.fleet) {
        fprintf(stderr, "loaded %s in %.2f s: %s, %lld layers, %s weights (%.1f MiB), kernels %s\n",
                a.model_dir, (double)(csd_now_ns() - t0) * 1e-9, csd_model_cfg(model)->model_type,
                (long long)csd_model_cfg(model)->n_layers,
                csd_dtype_name(csd_model_precision(model)),
                (double)csd_model_weight_bytes(model) / (1 << 20), csd_kern_name());
        rc = csd_local_pipeline_create(&pipe, model, 1, &err);
    }
    if (!rc)
        rc = csd_cli_draft_open(&a.draft, &a.model, tok, 1, 1, pipe->max_ctx,
                                pipe->cfg.vocab_size, &err);
    a.gen.draft_model = a.draft.draft;
    if (!rc) rc = generate_text(&a, pipe, tok, &err);
    if (rc) csd_cli_error("run", &err);
    csd_cli_draft_close(&a.draft);
    if (pipe) pipe->ops->destroy(pipe);
    csd_cli_fleet_close(&a.fleet);
    csd_model_destroy(model);
    csd_tok_destroy(tok);
    return rc ? 1 : 0;
}
