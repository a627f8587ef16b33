/* load_export: a whole model from a one-stage export directory, and csd_model_open, which takes
 * either kind of directory (see model.h). A shard loads in a fraction of a second where a Hugging
 * Face directory is quantized again on every load. */
#include <stdio.h>

#include "core/dtype.h"
#include "core/file_map.h"
#include "format/manifest.h"
#include "model_internal.h"
#include "shard_model.h"

static int open_stage0(csd_model_shard **shard, const csd_manifest *m, const csd_model_opts *opts,
                       csd_err *err) {
    if (m->n_stages != 1)
        return csd_err_set(
            err, CSD_EINVAL,
            "an export in %d stages: serve it as a fleet (one `cascadia worker` per stage)",
            m->n_stages);
    if (opts->precision >= 0 && opts->precision != m->precision)
        return csd_err_set(err, CSD_EINVAL,
                           "the export is %s; --precision %s needs the Hugging Face directory",
                           csd_dtype_name(m->precision), csd_dtype_name(opts->precision));
    if (opts->layer_begin > 0 || (opts->layer_end >= 0 && opts->layer_end != m->cfg.n_layers))
        return csd_err_set(err, CSD_EINVAL, "a layer range needs the Hugging Face directory");
    char path[4096];
    if (csd_path_join(path, sizeof path, m->dir, m->stages[0].file))
        return csd_err_set(err, CSD_ERANGE, "path too long");
    int rc = csd_model_shard_open(shard, path, err);
    if (!rc) rc = csd_manifest_check_stage(m, 0, (*shard)->file, path, err);
    return rc;
}

int csd_model_load_export(csd_model **out, const char *dir, const csd_model_opts *opts,
                          csd_err *err) {
    *out = NULL;
    csd_manifest *m = NULL;
    csd_model_shard *shard = NULL;
    int rc = csd_manifest_load(&m, dir, err);
    if (!rc) rc = open_stage0(&shard, m, opts, err);
    if (!rc) rc = csd_model_create(out, &shard->cfg, &shard->weights, opts, err);
    csd_manifest_destroy(m);
    if (rc) {
        csd_model_shard_close(shard);
        return csd_err_prefix(err, "%s: ", dir);
    }
    (*out)->shard = shard; /* closed by csd_model_destroy, after the model */
    return 0;
}

int csd_model_open(csd_model **out, const char *dir, const csd_model_opts *opts, csd_err *err) {
    char manifest[4096];
    if (csd_path_join(manifest, sizeof manifest, dir, "manifest.json") == 0 &&
        csd_file_exists(manifest))
        return csd_model_load_export(out, dir, opts, err);
    return csd_model_load_hf(out, dir, opts, err);
}
