/* export: model directory -> stage shards + manifest.json (see export.h). */
#include "export.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "format/safetensors.h"
#include "model.h"
#include "shard_model.h"

const char *const csd_export_copied_files[] = {
    "config.json",           "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja",    NULL};
#define COPY_MAX_BYTES (512u << 20) /* tokenizer.json of large vocabularies is tens of MB */
#define PATH_CAP 4096

typedef struct write_ctx {
    csd_export_progress_fn fn;
    void *ctx;
    int stage, n_stages;
    const csd_plan_stage *ps;
} write_ctx;

static void on_write(void *ctx, uint64_t done, uint64_t total) {
    write_ctx *w = ctx;
    if (w->fn)
        w->fn(w->ctx, w->stage, w->n_stages, w->ps,
              0.5 + 0.5 * (total ? (double)done / (double)total : 1.0), "writing");
}

static int copy_file(const char *src_dir, const char *dst_dir, const char *name, bool *copied,
                     csd_err *err) {
    char src[PATH_CAP], dst[PATH_CAP];
    *copied = false;
    if (csd_path_join(src, sizeof src, src_dir, name) ||
        csd_path_join(dst, sizeof dst, dst_dir, name))
        return csd_err_set(err, CSD_ERANGE, "path too long");
    if (!csd_file_exists(src)) { /* an earlier export's copy would be read as this model's */
        if (unlink(dst) != 0 && errno != ENOENT)
            return csd_err_set(err, CSD_EIO, "%s: cannot remove: %s", dst, strerror(errno));
        return 0;
    }
    char *data = NULL;
    size_t len = 0;
    int rc = csd_file_read_all(src, COPY_MAX_BYTES, &data, &len, err);
    if (!rc) rc = csd_file_write_all(dst, data, len, err);
    csd_free(data);
    *copied = rc == 0;
    return rc;
}

/* Loads stage k, writes its shard and fills its manifest row and hash table entry. */
static int export_stage(const csd_export_opts *o, const csd_plan *plan, int k, int kv_dtype,
                        write_ctx *wc, csd_manifest_stage *ms, csd_model_shard_info *info,
                        char **cfg_json, csd_err *err) {
    const csd_plan_stage *ps = &plan->stages[k];
    csd_model_opts mo;
    csd_model_opts_default(&mo);
    mo.precision = o->precision;
    mo.layer_begin = ps->layer_begin;
    mo.layer_end = ps->layer_end;
    mo.n_threads = 1; /* no forward runs here */
    mo.max_batch = 1; /* minimal scratch */
    mo.max_ctx = 16;
    csd_model *m = NULL;
    int rc = csd_model_load_hf(&m, o->model_dir, &mo, err);
    if (rc) return rc;
    const csd_model_config *c = csd_model_cfg(m);
    if (k == 0) rc = csd_model_config_to_json(c, cfg_json, err);
    char path[PATH_CAP];
    snprintf(ms->file, sizeof ms->file, "stage-%d.shard", k);
    if (!rc && csd_path_join(path, sizeof path, o->out_dir, ms->file))
        rc = csd_err_set(err, CSD_ERANGE, "%s: path too long", o->out_dir);
    if (!rc)
        rc = csd_model_shard_write(m, path, (uint32_t)k, (uint32_t)plan->n_stages, on_write, wc,
                                   info, err);
    if (!rc) {
        ms->index = k;
        ms->layer_begin = ps->layer_begin;
        ms->layer_end = ps->layer_end;
        ms->has_embed = ps->has_embed;
        ms->has_head = ps->has_head;
        ms->bytes = info->hdr.file_bytes;
        ms->weight_bytes = csd_model_weight_bytes(m);
        ms->kv_bytes_per_token = 2 * (uint64_t)(ps->layer_end - ps->layer_begin) *
                                 csd_kv_row_bytes(kv_dtype, c->n_kv_heads, c->head_dim);
        ms->memory_bytes = ps->total_bytes;
        ms->machine_bytes = ps->machine_bytes;
    }
    csd_model_destroy(m);
    return rc;
}

static bool same_dir(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The export copies config.json and the tokenizer files into out_dir: a directory that holds
 * another Hugging Face model would lose its own. The model's own directory is refused too: its
 * manifest.json would make it read as an export from then on (`run` would ask for a fleet). */
static int check_out_dir(const csd_export_opts *o, csd_err *err) {
    if (same_dir(o->out_dir, o->model_dir))
        return csd_err_set(err, CSD_EINVAL,
                           "--out %s is the model's own directory: it would then read as an "
                           "export, not as the Hugging Face model; export into another directory",
                           o->out_dir);
    const char *weights;
    int rc = csd_st_dir_weights(o->out_dir, &weights, err);
    if (!rc && weights)
        rc = csd_err_set(err, CSD_EINVAL,
                         "%s holds another model (%s): its config.json and tokenizer files would "
                         "be replaced; export into another directory",
                         o->out_dir, weights);
    return rc;
}

/* An earlier export into the same directory with more stages left stage-n.shard, ...: the
 * manifest no longer names them, and a worker pointed at one would load a stage of another
 * export. They go, up to the first that is not there. */
static int remove_stale_shards(const char *out_dir, int n, csd_err *err) {
    char name[32], path[PATH_CAP];
    for (int k = n; k < CSD_PLAN_MAX_STAGES; k++) {
        snprintf(name, sizeof name, "stage-%d.shard", k);
        if (csd_path_join(path, sizeof path, out_dir, name)) return 0;
        if (unlink(path) == 0) continue;
        if (errno == ENOENT) return 0;
        return csd_err_set(err, CSD_EIO, "%s: cannot remove: %s", path, strerror(errno));
    }
    return 0;
}

int csd_export_run(const csd_export_opts *o, const csd_plan *plan, csd_export_progress_fn progress,
                   void *progress_ctx, csd_manifest **out, csd_err *err) {
    if (out) *out = NULL;
    int n = plan->n_stages;
    if (n < 1 || n > CSD_PLAN_MAX_STAGES || o->precision < 0 || o->precision >= CSD_DTYPE_COUNT)
        return csd_err_set(err, CSD_EINVAL, "export: %d stages at precision %d", n, o->precision);
    int kv_dtype = o->kv_dtype >= 0                ? o->kv_dtype
                   : o->precision == CSD_DTYPE_F32 ? CSD_DTYPE_F32
                                                   : CSD_DTYPE_F16;
    csd_manifest man;
    memset(&man, 0, sizeof man);
    man.precision = o->precision;
    man.kv_dtype = kv_dtype;
    man.ctx = o->ctx;
    man.slots = o->slots;
    man.n_stages = n;
    man.stages = csd_alloc_array((size_t)n, sizeof *man.stages);
    csd_model_shard_info *infos = csd_alloc_array((size_t)n, sizeof *infos);
    csd_shard_table *tables = csd_alloc_array((size_t)n, sizeof *tables);
    char *cfg_json = NULL;
    char path[PATH_CAP];
    int rc = 0;
    if (!man.stages || !infos || !tables) {
        rc = csd_err_set(err, CSD_ENOMEM, "stage tables");
        goto done;
    }
    rc = csd_model_config_load(&man.cfg, o->model_dir, err);
    if (rc) {
        csd_err_prefix(err, "%s: ", o->model_dir);
        goto done;
    }
    if (plan->stages[n - 1].layer_end != man.cfg.n_layers) {
        rc = csd_err_set(err, CSD_EINVAL, "export: the plan covers %lld layers, the model has %lld",
                         (long long)plan->stages[n - 1].layer_end, (long long)man.cfg.n_layers);
        goto done;
    }
    rc = check_out_dir(o, err);
    if (rc) goto done;
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST) {
        rc = csd_err_set(err, CSD_EIO, "%s: cannot create: %s", o->out_dir, strerror(errno));
        goto done;
    }
    /* An old manifest would describe shards this run overwrites: drop it first. */
    if (csd_path_join(path, sizeof path, o->out_dir, CSD_MANIFEST_FILE) == 0 && unlink(path) != 0 &&
        errno != ENOENT) {
        rc = csd_err_set(err, CSD_EIO, "%s: cannot remove: %s", path, strerror(errno));
        goto done;
    }
    for (int k = 0; k < n && !rc; k++) {
        write_ctx wc = {progress, progress_ctx, k, n, &plan->stages[k]};
        if (progress) progress(progress_ctx, k, n, &plan->stages[k], 0.0, "loading");
        rc = export_stage(o, plan, k, kv_dtype, &wc, &man.stages[k], &infos[k], &cfg_json, err);
        if (!rc) {
            tables[k] = (csd_shard_table){plan->stages[k].layer_begin, plan->stages[k].layer_end,
                                          infos[k].n_tensors, infos[k].tensors};
            if (progress) progress(progress_ctx, k, n, &plan->stages[k], 1.0, "done");
        }
    }
    if (rc) goto done;
    csd_shard_model_hash(man.model_hash, cfg_json, strlen(cfg_json), o->precision, tables, n);
    for (int k = 0; k < n && !rc; k++) {
        if (csd_path_join(path, sizeof path, o->out_dir, man.stages[k].file))
            rc = csd_err_set(err, CSD_ERANGE, "path too long");
        else
            rc = csd_shard_set_model_hash(path, man.model_hash, &man.stages[k].checksum, err);
    }
    for (int i = 0; csd_export_copied_files[i] && !rc; i++) {
        bool copied;
        rc = copy_file(o->model_dir, o->out_dir, csd_export_copied_files[i], &copied, err);
        if (!rc && copied)
            snprintf(man.files[man.n_files++], CSD_MANIFEST_NAME_BYTES, "%s",
                     csd_export_copied_files[i]);
    }
    if (!rc) rc = csd_manifest_write(&man, o->out_dir, err);
    if (!rc) rc = remove_stale_shards(o->out_dir, n, err);
    if (!rc) { /* read back what was written: the hash recomputed from the shards must agree */
        csd_manifest *back = NULL;
        rc = csd_manifest_load(&back, o->out_dir, err);
        if (!rc) rc = csd_manifest_validate(back, false, err);
        if (!rc && out)
            *out = back;
        else
            csd_manifest_destroy(back);
    }
done:
    for (int k = 0; infos && k < n; k++) csd_model_shard_info_fini(&infos[k]);
    csd_free(infos);
    csd_free(tables);
    csd_free(man.stages);
    csd_free(cfg_json);
    return rc;
}
