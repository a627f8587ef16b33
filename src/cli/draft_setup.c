/* draft_setup: loading and checking the draft model (see draft_setup.h). */
#include "draft_setup.h"

#include <stdio.h>
#include <string.h>

#include "core/clock.h"
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
    if (strcmp(flag, "--draft-precision")) return 0;
    int p = csd_dtype_parse(value);
    if (p != CSD_DTYPE_F32 && p != CSD_DTYPE_F16 && p != CSD_DTYPE_BF16 && p != CSD_DTYPE_Q8 &&
        p != CSD_DTYPE_Q4) {
        fprintf(stderr,
                "cascadia %s: --draft-precision must be f32, f16, bf16, int8 or int4, got '%s'\n",
                cmd, value ? value : "");
        return -1;
    }
    d->precision = p;
    return 1;
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
    if (rc) return csd_err_prefix(err, "--draft-model %s: its tokenizer: ", dir);
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

int csd_cli_draft_open(csd_cli_draft *d, const csd_model_opts *served, const csd_tok *tok,
                       int slots, int64_t max_ctx, int64_t vocab_limit, csd_err *err) {
    if (!d->dir) return 0;
    uint64_t t0 = csd_now_ns();
    int rc = check_tokenizer(d->dir, tok, err);
    if (rc) return rc;
    csd_model_opts o = *served;
    o.precision = d->precision >= 0 ? d->precision : served->precision;
    o.layer_begin = o.layer_end = -1;
    o.max_ctx = max_ctx;
    rc = csd_model_open(&d->model, d->dir, &o, err);
    if (rc) return csd_err_prefix(err, "--draft-model %s: ", d->dir);
    const csd_model_config *cfg = csd_model_cfg(d->model);
    rc = csd_draft_model_create(&d->draft, d->model, slots, max_ctx, vocab_limit, err);
    if (rc) return csd_err_prefix(err, "--draft-model %s: ", d->dir);
    fprintf(stderr, "draft model %s: %lld layers, %s weights (%.1f MiB), loaded in %.2f s\n",
            d->dir, (long long)cfg->n_layers, csd_dtype_name(csd_model_precision(d->model)),
            (double)csd_model_weight_bytes(d->model) / (1 << 20),
            (double)(csd_now_ns() - t0) * 1e-9);
    return 0;
}

void csd_cli_draft_close(csd_cli_draft *d) {
    csd_draft_model_destroy(d->draft);
    csd_model_destroy(d->model);
    d->draft = NULL;
    d->model = NULL;
}
