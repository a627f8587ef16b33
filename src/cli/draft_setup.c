/* draft_setup: loading and checking the draft model (see draft_setup.h). */
#include "draft_setup.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "cli_util.h"
#include "core/dtype.h"

int csd_cli_draft_flag(const char *cmd, const char *flag, const char *value, csd_cli_draft *d) {
    if (!strcmp(flag, "--draft-model")) {
        if (!value || !value[0]) {
            fprintf(stderr, "cascadia %s: --draft-model needs a directory\n", cmd);
            return -1;
        }
        d->dir = value;
        return 1;
    }
    if (!strcmp(flag, "--draft-p-min")) {
        if (!csd_cli_float(cmd, flag, value, 0, 1, &d->p_min)) return -1;
        d->p_min += 0.0; /* -0 is 0 */
        return 1;
    }
    if (strcmp(flag, "--draft-precision")) return 0;
    d->precision = csd_cli_precision(cmd, flag, value);
    return d->precision < 0 ? -1 : 1;
}

int64_t csd_cli_draft_spec(const char *cmd, const csd_cli_draft *d, int64_t spec_draft) {
    if ((d->precision >= 0 || d->p_min >= 0) && !d->dir) {
        fprintf(stderr, "cascadia %s: %s needs --draft-model\n", cmd,
                d->precision >= 0 ? "--draft-precision" : "--draft-p-min");
        return -1;
    }
    if (spec_draft < 0) return d->dir ? CSD_CLI_DRAFT_DEFAULT_K : 0;
    if (spec_draft == 0 && d->dir) {
        fprintf(stderr,
                "cascadia %s: --spec-draft 0 turns speculative decoding off, and --draft-model "
                "would never draft: give one or the other\n",
                cmd);
        return -1;
    }
    return spec_draft;
}

/* The first token the two tokenizers write differently, or -1 when they match. */
static int64_t first_difference(const csd_tok *a, const csd_tok *b) {
    int32_t n = csd_tok_vocab_size(a);
    if (csd_tok_vocab_size(b) != n) return n < csd_tok_vocab_size(b) ? n : csd_tok_vocab_size(b);
    uint8_t ba[CSD_DETOK_PIECE_MAX], bb[CSD_DETOK_PIECE_MAX];
    for (int32_t id = 0; id < n; id++) {
        size_t la = 0, lb = 0;
        int ra = csd_tok_token_bytes(a, id, ba, sizeof ba, &la);
        int rb = csd_tok_token_bytes(b, id, bb, sizeof bb, &lb);
        if (ra != rb || la != lb || memcmp(ba, bb, la)) return id;
    }
    return -1;
}

static int check_tokenizer(const char *dir, const csd_tok *served, csd_err *err) {
    csd_tok *tok = NULL;
    int rc = csd_tok_load(&tok, dir, err);
    if (rc) return csd_err_prefix(err, "--draft-model: its tokenizer: ");
    int64_t at = first_difference(served, tok);
    if (at >= 0)
        rc = csd_err_set(err, CSD_EINVAL,
                         "--draft-model %s: its tokenizer differs from the served model's (%d "
                         "against %d tokens; first difference at id %lld): a draft must write the "
                         "same tokens",
                         dir, csd_tok_vocab_size(tok), csd_tok_vocab_size(served), (long long)at);
    csd_tok_destroy(tok);
    return rc;
}

/* The draft's weights: --draft-precision; else an export's own (it has manifest.json), a
 * Hugging Face directory's converted as the served model's --precision. */
static int draft_precision(const csd_cli_draft *d, const csd_model_opts *served) {
    if (d->precision >= 0) return d->precision;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/manifest.json", d->dir);
    bool exported = n > 0 && (size_t)n < sizeof path && access(path, F_OK) == 0;
    return exported ? -1 : served->precision;
}

int csd_cli_draft_open(csd_cli_draft *d, const csd_model_opts *served, const csd_tok *tok,
                       int slots, int max_jobs, int64_t max_ctx, int64_t vocab_limit,
                       csd_err *err) {
    if (!d->dir) return 0;
    uint64_t t0 = csd_now_ns();
    int rc = check_tokenizer(d->dir, tok, err);
    if (rc) return rc;
    csd_model_opts o = *served;
    o.precision = draft_precision(d, served);
    o.layer_begin = o.layer_end = -1;
    o.max_ctx = max_ctx;
    rc = csd_model_open(&d->model, d->dir, &o, err);
    if (rc) return csd_err_prefix(err, "--draft-model: ");
    const csd_model_config *cfg = csd_model_cfg(d->model);
    /* drafts past the draft's trained context would be noise: they stop there */
    int64_t ctx = cfg->max_seq_len > 0 && cfg->max_seq_len < max_ctx ? cfg->max_seq_len : max_ctx;
    rc = csd_draft_model_create(&d->draft, d->model, slots, max_jobs, ctx, vocab_limit, err);
    if (rc) return csd_err_prefix(err, "--draft-model: ");
    double p_min = d->p_min >= 0 ? d->p_min : CSD_CLI_DRAFT_DEFAULT_P_MIN;
    csd_draft_model_set_p_min(d->draft, (float)p_min);
    fprintf(stderr,
            "draft model %s: %lld layers, %s weights (%.1f MiB), context %lld, KV %.1f MiB per "
            "request slot (%d slot%s, made when used), p-min %.2f, loaded in %.2f s\n",
            d->dir, (long long)cfg->n_layers, csd_dtype_name(csd_model_precision(d->model)),
            (double)csd_model_weight_bytes(d->model) / (1 << 20), (long long)ctx,
            (double)csd_model_kv_bytes_per_token(d->model) * (double)ctx / (1 << 20), slots,
            slots == 1 ? "" : "s", p_min, (double)(csd_now_ns() - t0) * 1e-9);
    return 0;
}

void csd_cli_draft_close(csd_cli_draft *d) {
    csd_draft_model_destroy(d->draft);
    csd_model_destroy(d->model);
    d->draft = NULL;
    d->model = NULL;
}
