/* draft_setup: the draft model of speculative decoding for run and serve (--draft-model DIR,
 * --draft-precision P): loads it next to the served model, checks that it writes the same tokens
 * (its tokenizer must match the served one id for id), and gives it a KV slot per request. */
#ifndef CSD_CLI_DRAFT_SETUP_H
#define CSD_CLI_DRAFT_SETUP_H

#include "coord/draft_model.h"
#include "model/model.h"
#include "tok/tokenizer.h"

typedef struct csd_cli_draft {
    const char *dir;          /* --draft-model; NULL: none */
    int precision;            /* --draft-precision; -1: an export's own, a Hugging Face
                               * directory's converted as the served model's --precision */
    double p_min;             /* --draft-p-min; -1: not given (CSD_CLI_DRAFT_DEFAULT_P_MIN) */
    csd_model *model;
    csd_draft_model *draft;
} csd_cli_draft;

/* Draft tokens per step when --draft-model is given without --spec-draft. */
#define CSD_CLI_DRAFT_DEFAULT_K 4

#define CSD_CLI_DRAFT_FLAGS_HELP                                                            \
    "  --draft-model DIR   speculative decoding with a small model sharing the tokenizer (a\n" \
    "                      Hugging Face or one-stage export directory): it proposes\n"        \
    "                      --spec-draft tokens (default 4), one step checks them, the text\n" \
    "                      is the same\n"                                                      \
    "  --draft-precision P the draft model's weights (default: an export's own, else\n"      \
    "                      --precision's)\n"                                                  \
    "  --draft-p-min P     a draft ends before a token the draft model gives a probability\n"  \
    "                      below P (0-1; default 0: drafts run to --spec-draft)\n"

/* The confidence cut-off when --draft-p-min is not given: a draft ends before a token the draft
 * model gives less probability than this (docs/benchmarks.md has the measurements). */
#define CSD_CLI_DRAFT_DEFAULT_P_MIN 0.0

/* A csd_cli_draft with nothing given. */
#define CSD_CLI_DRAFT_NONE ((csd_cli_draft){.precision = -1, .p_min = -1})

/* 1 when flag is --draft-model, --draft-precision or --draft-p-min (its value taken), 0 when not
 * one of them, -1 on a bad value (printed). */
int csd_cli_draft_flag(const char *cmd, const char *flag, const char *value, csd_cli_draft *d);

/* The --spec-draft to use (spec_draft: the flag's value, -1 when not given): 4 with
 * --draft-model, else 0; -1 (message printed) for --spec-draft 0 with --draft-model, or
 * --draft-precision or --draft-p-min without it. */
int64_t csd_cli_draft_spec(const char *cmd, const csd_cli_draft *d, int64_t spec_draft);

/* Loads d->dir (when set) with served's threads and KV type, and slots request slots (drafted
 * for up to max_jobs at a time) of the context max_ctx, or the draft's trained one when shorter;
 * refuses a model whose tokenizer differs from tok. vocab_limit is the served model's vocabulary
 * (its embedding rows may be padded differently: a draft stops before a token beyond it). */
int csd_cli_draft_open(csd_cli_draft *d, const csd_model_opts *served, const csd_tok *tok,
                       int slots, int max_jobs, int64_t max_ctx, int64_t vocab_limit,
                       csd_err *err);
void csd_cli_draft_close(csd_cli_draft *d);

#endif
