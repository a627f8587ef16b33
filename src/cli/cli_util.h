/* cli_util: helpers shared by the subcommands: numeric flag parsing with range checks, model
 * options from flags, and printing errors. Only src/cli and src/bin print to stdout. */
#ifndef CSD_CLI_UTIL_H
#define CSD_CLI_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"
#include "model/model.h"

/* Parses a whole decimal integer in [lo, hi]; prints "cascadia CMD: --flag: ..." and returns
 * false. */
bool csd_cli_int(const char *cmd, const char *flag, const char *text, int64_t lo, int64_t hi,
                 int64_t *out);
bool csd_cli_float(const char *cmd, const char *flag, const char *text, double lo, double hi,
                   double *out);
/* Parses "1,2,3" into ids (csd_free *ids): whole numbers in [0, INT32_MAX] separated by a comma
 * and/or blanks. An empty item (",," or a trailing comma), a sign or any other character is
 * refused with a message pointing at it; *ids stays NULL and *n 0. */
bool csd_cli_id_list(const char *cmd, const char *flag, const char *text, int32_t **ids,
                     int64_t *n);

/* A weight precision's name (f32|f16|bf16|int8|int4) as a CSD_DTYPE_*, or -1 with a message
 * naming flag. */
int csd_cli_precision(const char *cmd, const char *flag, const char *value);

/* Model flags common to run, logits, bench: --precision, --threads, --ctx, --kv-type.
 * Returns 1 when the flag was one of them (consumed), 0 when not, -1 on a bad value. */
int csd_cli_model_flag(const char *cmd, const char *flag, const char *value, csd_model_opts *opts);
#define CSD_CLI_MODEL_DIR_HELP                                                              \
    "  MODEL_DIR         a Hugging Face directory (converted to --precision at load), or a\n"   \
    "                    one-stage export (`cascadia export --stages 1`: loads as exported)\n"
#define CSD_CLI_MODEL_FLAGS_HELP                                                            \
    "  --precision P     f32|f16|bf16|int8|int4 (default: the file's dtype)\n"               \
    "  --threads N       worker threads (default: all cores)\n"                              \
    "  --ctx N           context length (default: the model's, capped at 4096)\n"            \
    "  --kv-type T       f32|f16|q8 KV cache (default: f32 for f32 weights, else f16)\n"

void csd_cli_error(const char *cmd, const csd_err *err);
/* Warns (as llama.cpp does) when a context of ctx positions exceeds the model's trained one
 * (max_position_embeddings): it runs, but the positions past it were never trained. */
void csd_cli_warn_ctx(const char *cmd, int64_t ctx, const csd_model *m);

/* The tokenizer's end-of-generation ids (EOS, end-of-turn tokens), at most cap of them. */
#define CSD_CLI_MAX_EOG 64
typedef struct csd_tok csd_tok;
int csd_cli_collect_eog(const csd_tok *tok, int32_t *eog, int cap);

#endif
