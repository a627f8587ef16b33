/* manifest: reading, validating and writing DIR/manifest.json (see manifest.h). Every field is
 * type- and range-checked; file names are plain names (no '/', no leading '.') so a manifest cannot
 * point outside its directory. */
#include "manifest.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/build_info.h"
#include "core/dtype.h"
#include "core/file_map.h"

#define PATH_CAP 4096

void csd_manifest_destroy(csd_manifest *m) {
    if (!m) return;
    csd_free(m->dir);
    csd_free(m->stages);
    csd_free(m);
}

static bool safe_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= CSD_MANIFEST_NAME_BYTES || s[0] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_'))
            return false;
    }
    return true;
}

/* Field readers: fill *out or set err naming the field (where: "stage 2"). */
static int get_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   const char *where, csd_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return csd_err_set(err, CSD_EFORMAT, "%s: \"%s\" must be an integer in [%lld, %lld]", where,
                           key, (long long)lo, (long long)hi);
    *out = json_integer_value(v);
    return 0;
}

static int get_str(const json_t *o, const char *key, const char **out, const char *where,
                   csd_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return csd_err_set(err, CSD_EFORMAT, "%s: \"%s\" must be a string", where, key);
    *out = json_string_value(v);
    return 0;
}

static int get_bool(const json_t *o, const char *key, bool *out, const char *where, csd_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_boolean(v))
        return csd_err_set(err, CSD_EFORMAT, "%s: \"%s\" must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

static int get_hex64(const json_t *o, const char *key, uint64_t *out, const char *where,
                     csd_err *err) {
    const char *s = NULL;
    int rc = get_str(o, key, &s, where, err);
    if (rc) return rc;
    /* digits only: strtoull alone would also take a sign, leading blanks and "0x" */
    size_t n = strspn(s, "0123456789abcdefABCDEF");
    if (n != 16 || s[n] != '\0')
        return csd_err_set(err, CSD_EFORMAT, "%s: \"%s\" must be 16 hex digits", where, key);
    *out = strtoull(s, NULL, 16);
    return 0;
}

#define U64_FIELD_MAX (INT64_C(1) << 56) /* 64 PiB: any byte count beyond is corrupt */

static int parse_stage(const json_t *js, int i, csd_manifest_stage *s, csd_err *err) {
    char where[32];
    snprintf(where, sizeof where, "stage %d", i);
    if (!json_is_object(js)) return csd_err_set(err, CSD_EFORMAT, "%s: not an object", where);
    int64_t v;
    const char *file = NULL;
    int rc = get_int(js, "index", i, i, &v, where, err);
    if (!rc) rc = get_str(js, "file", &file, where, err);
    if (!rc && !safe_name(file))
        rc = csd_err_set(err, CSD_EFORMAT, "%s: file name '%.80s' is not a plain file name", where,
                         file);
    if (rc) return rc;
    s->index = i;
    snprintf(s->file, sizeof s->file, "%s", file);
    if (!rc) rc = get_int(js, "layer_begin", 0, CSD_MAX_LAYERS - 1, &s->layer_begin, where, err);
    if (!rc) rc = get_int(js, "layer_end", 1, CSD_MAX_LAYERS, &s->layer_end, where, err);
    if (!rc) rc = get_bool(js, "has_embed", &s->has_embed, where, err);
    if (!rc) rc = get_bool(js, "has_head", &s->has_head, where, err);
    if (!rc) rc = get_int(js, "bytes", 1, U64_FIELD_MAX, &v, where, err);
    if (!rc) s->bytes = (uint64_t)v;
    if (!rc) rc = get_hex64(js, "checksum", &s->checksum, where, err);
    if (!rc) rc = get_int(js, "weight_bytes", 0, U64_FIELD_MAX, &v, where, err);
    if (!rc) s->weight_bytes = (uint64_t)v;
    if (!rc) rc = get_int(js, "kv_bytes_per_token", 0, U64_FIELD_MAX, &v, where, err);
    if (!rc) s->kv_bytes_per_token = (uint64_t)v;
    if (!rc) rc = get_int(js, "memory_bytes", 0, U64_FIELD_MAX, &v, where, err);
    if (!rc) s->memory_bytes = (uint64_t)v;
    if (!rc) rc = get_int(js, "machine_bytes", 0, U64_FIELD_MAX, &v, where, err);
    if (!rc) s->machine_bytes = (uint64_t)v;
    return rc;
}

/* "exported_by": optional (older manifests lack it); shown to people, so short printable text. */
static int parse_exported_by(csd_manifest *m, const json_t *root, csd_err *err) {
    const json_t *v = json_object_get(root, "exported_by");
    if (!v) return 0;
    const char *s = json_string_value(v);
    size_t n = s ? strlen(s) : 0;
    bool ok = s && n > 0 && n < sizeof m->exported_by;
    for (size_t i = 0; ok && i < n; i++) ok = s[i] > 0x20 && s[i] < 0x7f;
    if (!ok)
        return csd_err_set(err, CSD_EFORMAT,
                           "\"exported_by\" must be 1 to %zu printable characters without blanks",
                           sizeof m->exported_by - 1);
    memcpy(m->exported_by, s, n + 1);
    return 0;
}

/* The versions this build must match, precision, KV type, context, slots and model hash. */
static int parse_header(csd_manifest *m, const json_t *root, csd_err *err) {
    const char *W = "manifest";
    const char *prec = NULL, *kv = NULL, *hash = NULL;
    int64_t v;
    const json_t *format = json_object_get(root, "format");
    if (!json_is_string(format) || strcmp(json_string_value(format), "cascadia-manifest") != 0)
        return csd_err_set(err, CSD_EFORMAT,
                           "not a cascadia manifest (no \"format\": \"cascadia-manifest\")");
    int rc = get_int(root, "version", 1, 1000000, &v, W, err);
    if (!rc && v != CSD_MANIFEST_VERSION)
        rc = csd_err_set(err, CSD_EFORMAT, "manifest version %lld, this build reads version %d",
                         (long long)v, CSD_MANIFEST_VERSION);
    if (!rc) rc = get_int(root, "shard_version", 0, 1000000, &v, W, err);
    if (!rc && v != CSD_SHARD_VERSION)
        rc = csd_err_set(err, CSD_EFORMAT,
                         "shards of format version %lld, this build reads version %d", (long long)v,
                         CSD_SHARD_VERSION);
    if (!rc) rc = get_int(root, "kernel_layout", 0, 1000000, &v, W, err);
    if (!rc && v != CSD_SHARD_KERNEL_LAYOUT)
        rc = csd_err_set(err, CSD_EFORMAT,
                         "exported for kernel layout %lld, this build uses %d: export it again",
                         (long long)v, CSD_SHARD_KERNEL_LAYOUT);
    if (!rc) rc = get_str(root, "precision", &prec, W, err);
    if (!rc && (m->precision = csd_dtype_parse(prec)) < 0)
        rc = csd_err_set(err, CSD_EFORMAT, "unknown precision '%.40s'", prec);
    if (!rc) rc = get_str(root, "kv_dtype", &kv, W, err);
    if (!rc && (m->kv_dtype = csd_dtype_parse(kv)) != CSD_DTYPE_F32 &&
        m->kv_dtype != CSD_DTYPE_F16 && m->kv_dtype != CSD_DTYPE_Q8)
        rc = csd_err_set(err, CSD_EFORMAT, "\"kv_dtype\" must be f32, f16 or int8, not '%.40s'",
                         kv);
    if (!rc) rc = get_int(root, "ctx", 1, CSD_MAX_CONTEXT, &m->ctx, W, err);
    if (!rc) rc = get_int(root, "slots", 1, 1 << 20, &m->slots, W, err);
    if (!rc) rc = get_str(root, "model_hash", &hash, W, err);
    if (!rc && !csd_shard_hash_parse(hash, m->model_hash))
        rc = csd_err_set(err, CSD_EFORMAT, "\"model_hash\" must be %d hex digits",
                         2 * CSD_SHARD_HASH_BYTES);
    return rc;
}

/* "config": the model's config.json as exported, parsed as one. */
static int parse_config(csd_manifest *m, const json_t *root, csd_err *err) {
    const json_t *cfg = json_object_get(root, "config");
    if (!json_is_object(cfg)) return csd_err_set(err, CSD_EFORMAT, "\"config\" must be an object");
    char *text = json_dumps(cfg, JSON_COMPACT);
    if (!text) return csd_err_set(err, CSD_ENOMEM, "config");
    int rc = csd_model_config_parse(&m->cfg, text, strlen(text), err);
    free(text);
    return rc ? csd_err_prefix(err, "\"config\": ") : 0;
}

/* "files": the tokenizer and config files copied beside the shards (plain names only). */
static int parse_files(csd_manifest *m, const json_t *root, csd_err *err) {
    const json_t *files = json_object_get(root, "files");
    if (!json_is_array(files) || json_array_size(files) > CSD_MANIFEST_MAX_FILES)
        return csd_err_set(err, CSD_EFORMAT, "\"files\" must be an array of at most %d names",
                           CSD_MANIFEST_MAX_FILES);
    m->n_files = (int)json_array_size(files);
    for (int i = 0; i < m->n_files; i++) {
        const json_t *f = json_array_get(files, (size_t)i);
        if (!json_is_string(f) || !safe_name(json_string_value(f)))
            return csd_err_set(err, CSD_EFORMAT, "\"files\"[%d] is not a plain file name", i);
        snprintf(m->files[i], sizeof m->files[i], "%s", json_string_value(f));
    }
    return 0;
}

/* Stage i continues the layers from next, carries the embeddings or head only at the ends and
 * has a file of its own. */
static int check_stage_place(const csd_manifest *m, int i, int64_t next, csd_err *err) {
    const csd_manifest_stage *s = &m->stages[i];
    if (s->layer_begin != next || s->layer_end <= s->layer_begin || s->layer_end > m->cfg.n_layers)
        return csd_err_set(err, CSD_EFORMAT,
                           "stage %d: layers [%lld, %lld) do not continue from %lld within %lld", i,
                           (long long)s->layer_begin, (long long)s->layer_end, (long long)next,
                           (long long)m->cfg.n_layers);
    if (s->has_embed != (i == 0) || s->has_head != (i == m->n_stages - 1))
        return csd_err_set(err, CSD_EFORMAT,
                           "stage %d: embeddings/head flags are wrong for its position", i);
    for (int k = 0; k < i; k++)
        if (!strcmp(m->stages[k].file, s->file))
            return csd_err_set(err, CSD_EFORMAT, "stages %d and %d share the file %s", k, i,
                               s->file);
    return 0;
}

/* "stages": one entry per stage, together covering every layer once, in order. */
static int parse_stages(csd_manifest *m, const json_t *root, csd_err *err) {
    const json_t *stages = json_object_get(root, "stages");
    size_t n = json_is_array(stages) ? json_array_size(stages) : 0;
    if (n < 1 || n > CSD_SHARD_MAX_STAGES || (int64_t)n > m->cfg.n_layers)
        return csd_err_set(err, CSD_EFORMAT,
                           "\"stages\" must list 1 to min(%d, %lld layers) stages",
                           CSD_SHARD_MAX_STAGES, (long long)m->cfg.n_layers);
    m->stages = csd_alloc_array(n, sizeof *m->stages);
    if (!m->stages) return csd_err_set(err, CSD_ENOMEM, "stage table");
    m->n_stages = (int)n;
    int64_t next = 0;
    for (int i = 0; i < m->n_stages; i++) {
        int rc = parse_stage(json_array_get(stages, (size_t)i), i, &m->stages[i], err);
        if (!rc) rc = check_stage_place(m, i, next, err);
        if (rc) return rc;
        next = m->stages[i].layer_end;
    }
    if (next != m->cfg.n_layers)
        return csd_err_set(err, CSD_EFORMAT, "stages cover layers [0, %lld) of %lld",
                           (long long)next, (long long)m->cfg.n_layers);
    return 0;
}

static int parse_root(csd_manifest *m, const json_t *root, csd_err *err) {
    if (!json_is_object(root)) return csd_err_set(err, CSD_EFORMAT, "not a JSON object");
    int rc = parse_header(m, root, err);
    if (!rc) rc = parse_exported_by(m, root, err);
    if (!rc) rc = parse_config(m, root, err);
    if (!rc) rc = parse_files(m, root, err);
    if (!rc) rc = parse_stages(m, root, err);
    return rc;
}

int csd_manifest_parse(csd_manifest **out, const char *json, size_t len, const char *dir,
                       csd_err *err) {
    *out = NULL;
    csd_manifest *m = csd_alloc(sizeof *m);
    if (!m) return csd_err_set(err, CSD_ENOMEM, "manifest");
    m->dir = csd_strdup(dir ? dir : ".");
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    int rc;
    if (!m->dir)
        rc = csd_err_set(err, CSD_ENOMEM, "manifest");
    else if (!root)
        rc = csd_err_set(err, CSD_EFORMAT, "line %d: %s", jerr.line, jerr.text);
    else
        rc = parse_root(m, root, err);
    json_decref(root);
    if (rc) {
        csd_manifest_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

int csd_manifest_load(csd_manifest **out, const char *path, csd_err *err) {
    *out = NULL;
    char file[PATH_CAP], dir[PATH_CAP];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (csd_path_join(file, sizeof file, path, CSD_MANIFEST_FILE))
            return csd_err_set(err, CSD_ERANGE, "%s: path too long", path);
        snprintf(dir, sizeof dir, "%s", path);
    } else {
        if (snprintf(file, sizeof file, "%s", path) >= (int)sizeof file)
            return csd_err_set(err, CSD_ERANGE, "%s: path too long", path);
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) + (slash == path), path);
        else
            snprintf(dir, sizeof dir, ".");
    }
    char *text = NULL;
    size_t len = 0;
    int rc = csd_file_read_all(file, CSD_MANIFEST_MAX_BYTES, &text, &len, err);
    if (rc) return rc;
    rc = csd_manifest_parse(out, text, len, dir, err);
    csd_free(text);
    if (rc) csd_err_prefix(err, "%s: ", file);
    return rc;
}

/* ---- validation ---- */

int csd_manifest_check_stage(const csd_manifest *m, int i, const csd_shard *f, const char *path,
                             csd_err *err) {
    const csd_manifest_stage *s = &m->stages[i];
    const csd_shard_header *h = csd_shard_hdr(f);
    if (h->stage_index != (uint32_t)i || h->stage_count != (uint32_t)m->n_stages ||
        h->layer_begin != s->layer_begin || h->layer_end != s->layer_end ||
        h->precision != m->precision)
        return csd_err_set(err, CSD_EMISMATCH,
                           "%s: stage %u of %u, layers [%lld, %lld), %s; the manifest lists stage "
                           "%d of %d, layers "
                           "[%lld, %lld), %s",
                           path, h->stage_index, h->stage_count, (long long)h->layer_begin,
                           (long long)h->layer_end, csd_dtype_name(h->precision), i, m->n_stages,
                           (long long)s->layer_begin, (long long)s->layer_end,
                           csd_dtype_name(m->precision));
    if (h->header_checksum != s->checksum)
        return csd_err_set(err, CSD_EMISMATCH,
                           "%s: header checksum %016llx, the manifest lists %016llx", path,
                           (unsigned long long)h->header_checksum, (unsigned long long)s->checksum);
    if (memcmp(h->model_hash, m->model_hash, CSD_SHARD_HASH_BYTES) != 0)
        return csd_err_set(
            err, CSD_EMISMATCH,
            "%s: model hash differs from the manifest's (a shard from another export?)", path);
    if (!csd_model_config_equal(csd_shard_config(f), &m->cfg))
        return csd_err_set(err, CSD_EMISMATCH, "%s: embedded config differs from the manifest's",
                           path);
    return 0;
}

/* csd_manifest_check_stage, and every stage's config text the same as stage 0's */
static int check_stage(const csd_manifest *m, int i, const csd_shard *f, const char *path,
                       const char **json0, size_t *json0_len, csd_err *err) {
    int rc = csd_manifest_check_stage(m, i, f, path, err);
    if (rc) return rc;
    size_t len;
    const char *json = csd_shard_config_json(f, &len);
    if (i == 0) {
        *json0 = json;
        *json0_len = len;
    } else if (len != *json0_len || memcmp(json, *json0, len) != 0) {
        return csd_err_set(err, CSD_EMISMATCH, "%s: embedded config text differs from stage 0's",
                           path);
    }
    return 0;
}

int csd_manifest_validate(const csd_manifest *m, bool deep, csd_err *err) {
    char path[PATH_CAP];
    for (int i = 0; i < m->n_files; i++) {
        if (csd_path_join(path, sizeof path, m->dir, m->files[i]))
            return csd_err_set(err, CSD_ERANGE, "path too long");
        if (!csd_file_exists(path))
            return csd_err_set(err, CSD_ENOTFOUND, "%s: listed in the manifest but missing", path);
    }
    csd_shard **open = csd_alloc_array((size_t)m->n_stages, sizeof *open);
    csd_shard_table *tables = csd_alloc_array((size_t)m->n_stages, sizeof *tables);
    int rc = 0;
    if (!open || !tables) rc = csd_err_set(err, CSD_ENOMEM, "validation tables");
    const char *json0 = NULL;
    size_t json0_len = 0;
    for (int i = 0; i < m->n_stages && !rc; i++) {
        const csd_manifest_stage *s = &m->stages[i];
        struct stat st;
        if (csd_path_join(path, sizeof path, m->dir, s->file)) {
            rc = csd_err_set(err, CSD_ERANGE, "path too long");
            break;
        }
        if (stat(path, &st) != 0) {
            rc = csd_err_set(err, CSD_ENOTFOUND, "%s: stage %d's shard is missing", path, i);
            break;
        }
        if ((uint64_t)st.st_size != s->bytes) {
            rc = csd_err_set(err, CSD_EMISMATCH, "%s: %lld bytes, the manifest lists %llu", path,
                             (long long)st.st_size, (unsigned long long)s->bytes);
            break;
        }
        rc =
            deep ? csd_shard_open(&open[i], path, err) : csd_shard_open_header(&open[i], path, err);
        if (!rc) rc = check_stage(m, i, open[i], path, &json0, &json0_len, err);
        if (!rc) tables[i] = csd_shard_get_table(open[i]);
    }
    if (!rc) {
        uint8_t hash[CSD_SHARD_HASH_BYTES];
        csd_shard_model_hash(hash, json0, json0_len, m->precision, tables, m->n_stages);
        if (memcmp(hash, m->model_hash, sizeof hash) != 0) {
            char a[2 * CSD_SHARD_HASH_BYTES + 1], b[2 * CSD_SHARD_HASH_BYTES + 1];
            csd_shard_hash_hex(m->model_hash, a);
            csd_shard_hash_hex(hash, b);
            rc = csd_err_set(err, CSD_EMISMATCH,
                             "%s: model hash %.16s... but the shards hash to %.16s...", m->dir, a,
                             b);
        }
    }
    for (int i = 0; open && i < m->n_stages; i++) csd_shard_close(open[i]);
    csd_free(open);
    csd_free(tables);
    return rc;
}

/* ---- writing ---- */

/* One stage's object (NULL when out of memory). */
static json_t *stage_json(const csd_manifest_stage *s, int index) {
    json_t *o = json_object();
    if (!o) return NULL;
    char sum[17];
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)s->checksum);
    json_object_set_new(o, "index", json_integer(index));
    json_object_set_new(o, "file", json_string(s->file));
    json_object_set_new(o, "layer_begin", json_integer(s->layer_begin));
    json_object_set_new(o, "layer_end", json_integer(s->layer_end));
    json_object_set_new(o, "has_embed", json_boolean(s->has_embed));
    json_object_set_new(o, "has_head", json_boolean(s->has_head));
    json_object_set_new(o, "bytes", json_integer((json_int_t)s->bytes));
    json_object_set_new(o, "checksum", json_string(sum));
    json_object_set_new(o, "weight_bytes", json_integer((json_int_t)s->weight_bytes));
    json_object_set_new(o, "kv_bytes_per_token", json_integer((json_int_t)s->kv_bytes_per_token));
    json_object_set_new(o, "memory_bytes", json_integer((json_int_t)s->memory_bytes));
    json_object_set_new(o, "machine_bytes", json_integer((json_int_t)s->machine_bytes));
    return o;
}

/* The manifest's root object around cfg (the model config as JSON; a reference is taken), or
 * NULL when out of memory. */
static json_t *manifest_json(const csd_manifest *m, json_t *cfg) {
    char hash[2 * CSD_SHARD_HASH_BYTES + 1];
    csd_shard_hash_hex(m->model_hash, hash);
    json_t *root = json_object(), *files = json_array(), *stages = json_array();
    bool ok = root && files && stages;
    for (int i = 0; ok && i < m->n_files; i++)
        ok = json_array_append_new(files, json_string(m->files[i])) == 0;
    for (int i = 0; ok && i < m->n_stages; i++)
        ok = json_array_append_new(stages, stage_json(&m->stages[i], i)) == 0;
    if (ok) {
        json_object_set_new(root, "format", json_string("cascadia-manifest"));
        json_object_set_new(root, "version", json_integer(CSD_MANIFEST_VERSION));
        json_object_set_new(root, "shard_version", json_integer(CSD_SHARD_VERSION));
        json_object_set_new(root, "kernel_layout", json_integer(CSD_SHARD_KERNEL_LAYOUT));
        json_object_set_new(root, "exported_by", json_string(csd_build_fingerprint()));
        json_object_set_new(root, "precision", json_string(csd_dtype_name(m->precision)));
        json_object_set_new(root, "kv_dtype", json_string(csd_dtype_name(m->kv_dtype)));
        json_object_set_new(root, "ctx", json_integer(m->ctx));
        json_object_set_new(root, "slots", json_integer(m->slots));
        json_object_set_new(root, "model_hash", json_string(hash));
        json_object_set(root, "config", cfg);
        json_object_set(root, "files", files);
        json_object_set(root, "stages", stages);
    }
    json_decref(files);
    json_decref(stages);
    if (!ok) json_decref(root);
    return ok ? root : NULL;
}

int csd_manifest_write(const csd_manifest *m, const char *dir, csd_err *err) {
    char *cfg_text = NULL;
    int rc = csd_model_config_to_json(&m->cfg, &cfg_text, err);
    if (rc) return rc;
    json_error_t jerr;
    json_t *cfg = json_loads(cfg_text, 0, &jerr);
    csd_free(cfg_text);
    json_t *root = cfg ? manifest_json(m, cfg) : NULL;
    json_decref(cfg);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text) return csd_err_set(err, CSD_ENOMEM, "manifest JSON");
    char path[PATH_CAP];
    if (csd_path_join(path, sizeof path, dir, CSD_MANIFEST_FILE)) {
        rc = csd_err_set(err, CSD_ERANGE, "%s: path too long", dir);
    } else {
        size_t len = strlen(text);
        text[len] = '\n'; /* json_dumps leaves room for its NUL: reuse it for a final newline */
        rc = csd_file_write_all(path, text, len + 1, err);
    }
    free(text);
    return rc;
}
