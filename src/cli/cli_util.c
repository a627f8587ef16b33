/* cli_util: flag parsing helpers (see cli_util.h). */
#include "cli_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "tok/tokenizer.h"

bool csd_cli_int(const char *cmd, const char *flag, const char *text, int64_t lo, int64_t hi,
                 int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || *text == '\0' || *end != '\0' || errno || v < lo || v > hi) {
        fprintf(stderr, "cascadia %s: %s expects an integer in [%lld, %lld], got '%s'\n", cmd, flag,
                (long long)lo, (long long)hi, text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

bool csd_cli_float(const char *cmd, const char *flag, const char *text, double lo, double hi,
                   double *out) {
    char *end = NULL;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || *text == '\0' || *end != '\0' || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "cascadia %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo,
                hi, text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

/* One id of a list at *p: decimal digits only (no sign, no "0x"), at most INT32_MAX. Moves *p past
 * it. */
static bool parse_id(const char **p, int32_t *id) {
    int64_t v = 0;
    const char *s = *p;
    if (*s < '0' || *s > '9') return false;
    for (; *s >= '0' && *s <= '9'; s++) {
        v = v * 10 + (*s - '0');
        if (v > INT32_MAX) return false;
    }
    *id = (int32_t)v;
    *p = s;
    return true;
}

/* Past the blanks, at most one comma and the blanks after it; false for an empty item (",," or a
 * trailing comma). */
static bool skip_separator(const char **p) {
    const char *s = *p + strspn(*p, " ");
    if (*s == ',') {
        s += 1 + strspn(s + 1, " ");
        if (*s == '\0' || *s == ',') return false;
    }
    *p = s;
    return true;
}

bool csd_cli_id_list(const char *cmd, const char *flag, const char *text, int32_t **ids,
                     int64_t *n) {
    *ids = NULL;
    *n = 0;
    size_t len = strlen(text), cap = len / 2 + 1;
    int32_t *out = csd_alloc_array(cap, sizeof(int32_t));
    if (!out) return false;
    const char *p = text + strspn(text, " ");
    bool ok = true;
    while (ok && *p) {
        ok = parse_id(&p, &out[*n]) && (*p == '\0' || *p == ' ' || *p == ',') && skip_separator(&p);
        if (!ok)
            fprintf(stderr,
                    "cascadia %s: %s expects whole numbers (0 to %d) separated by commas: "
                    "'%s' at '%s'\n",
                    cmd, flag, INT32_MAX, text, p);
        *n += ok;
    }
    if (ok && *n == 0) {
        fprintf(stderr, "cascadia %s: %s is empty\n", cmd, flag);
        ok = false;
    }
    if (!ok) {
        csd_free(out);
        *n = 0;
        return false;
    }
    *ids = out;
    return true;
}

int csd_cli_precision(const char *cmd, const char *flag, const char *value) {
    int d = csd_dtype_parse(value);
    if (d < 0)
        fprintf(stderr, "cascadia %s: %s must be f32, f16, bf16, int8 or int4, got '%s'\n", cmd,
                flag, value ? value : "");
    return d;
}

int csd_cli_model_flag(const char *cmd, const char *flag, const char *value, csd_model_opts *opts) {
    int64_t v;
    if (!strcmp(flag, "--precision")) {
        int d = csd_cli_precision(cmd, flag, value);
        if (d < 0) return -1;
        opts->precision = d;
        return 1;
    }
    if (!strcmp(flag, "--kv-type")) {
        int d = csd_dtype_parse(value);
        if (d != CSD_DTYPE_F32 && d != CSD_DTYPE_F16 && d != CSD_DTYPE_Q8) {
            fprintf(stderr, "cascadia %s: --kv-type must be f32, f16 or q8, got '%s'\n", cmd,
                    value ? value : "");
            return -1;
        }
        opts->kv_dtype = d;
        return 1;
    }
    if (!strcmp(flag, "--threads")) {
        if (!csd_cli_int(cmd, flag, value, 1, 256, &v)) return -1;
        opts->n_threads = (int)v;
        return 1;
    }
    if (!strcmp(flag, "--ctx")) {
        if (!csd_cli_int(cmd, flag, value, 16, 1 << 20, &v)) return -1;
        opts->max_ctx = v;
        return 1;
    }
    return 0;
}

void csd_cli_error(const char *cmd, const csd_err *err) {
    fprintf(stderr, "cascadia %s: %s (%s)\n", cmd, err->msg[0] ? err->msg : csd_strerror(err->code),
            csd_err_name(err->code));
}

void csd_cli_warn_ctx(const char *cmd, int64_t ctx, const csd_model *m) {
    int64_t trained = csd_model_cfg(m)->max_seq_len;
    if (ctx > trained)
        fprintf(stderr,
                "cascadia %s: warning: a context of %lld exceeds the model's trained context of "
                "%lld (max_position_embeddings): the positions past it were never trained\n",
                cmd, (long long)ctx, (long long)trained);
}

int csd_cli_collect_eog(const csd_tok *tok, int32_t *eog, int cap) {
    int n = 0;
    for (int32_t id = 0; id < csd_tok_vocab_size(tok) && n < cap; id++)
        if (csd_tok_is_eog(tok, id)) eog[n++] = id;
    return n;
}
