/* export: a Hugging Face model directory cut into stage shards plus manifest.json, following a
 * stage plan. One stage is in memory at a time (csd_model_load_hf for its layer range, converted,
 * written, freed), so exporting needs about one stage's memory. The model hash covers every stage,
 * so it is patched into the shards once all exist; manifest.json is written last (and any old one
 * removed first), so a directory without one is an unfinished export.
 * Spec: docs/shard-format.md. */
#ifndef CSD_EXPORT_H
#define CSD_EXPORT_H

#include <stdint.h>

#include "core/err.h"
#include "format/manifest.h"
#include "stage_plan.h"

typedef struct csd_export_opts {
    const char *model_dir; /* config.json + safetensors (+ tokenizer files, copied when present) */
    const char *out_dir;   /* created when missing */
    int precision;         /* CSD_DTYPE_* */
    int kv_dtype;          /* of the memory estimate: CSD_DTYPE_F32/_F16/_Q8, -1: as the model */
    int64_t ctx, slots;    /* the serving budget the plan's memory estimate assumed */
} csd_export_opts;

/* Called at each step: stage (0-based) of n_stages, frac of that stage done (0 loading, 0.5..1
 * writing), phase "loading" | "writing" | "done". */
typedef void (*csd_export_progress_fn)(void *ctx, int stage, int n_stages, const csd_plan_stage *ps,
                                       double frac, const char *phase);

/* Files copied next to the shards when the model directory has them. */
extern const char *const csd_export_copied_files[];

/* Writes out_dir/stage-K.shard for every stage of plan, the tokenizer/config files and
 * out_dir/manifest.json, then reloads and validates the manifest. man (may be NULL) receives the
 * written manifest (csd_manifest_destroy it). */
int csd_export_run(const csd_export_opts *opts, const csd_plan *plan,
                   csd_export_progress_fn progress, void *progress_ctx, csd_manifest **man,
                   csd_err *err);

#endif
