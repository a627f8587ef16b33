/* safetensors: the reader. Validates the 8-byte length and JSON header of a .safetensors buffer
 * (an mmap, or fuzz input) and builds a name-sorted table of tensors that borrow the buffer; opens
 * sharded checkpoints through model.safetensors.index.json. The writer is safetensors_write.c.
 * After a successful open every tensor lies inside its file's data section, overlaps no other
 * tensor and spans exactly product(shape) * dtype size bytes. See docs/formats.md. */
#include "safetensors.h"

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "json_file.h"
#include "safetensors_internal.h"

#define ST_SINGLE_NAME "model.safetensors"
#define ST_INDEX_NAME "model.safetensors.index.json"
/* The index of a 400B model is a few hundred KB; anything near this is hostile. */
#define ST_INDEX_MAX_BYTES (64u * 1024u * 1024u)
/* Shard count cap: real checkpoints use at most a few hundred files. */
#define ST_MAX_FILES 4096
#define ST_PATH_MAX 4096

/* One mapped file of the set (or the caller's buffer for csd_st_parse, then map is empty). */
typedef struct st_file {
    csd_file_map map;
    char *label; /* path or caller's label, owned; used in error messages */
} st_file;

struct csd_st_set {
    csd_st_tensor *tensors;   /* n of cap, in header order, file after file */
    int *file_of;             /* file index of each tensor */
    const csd_st_tensor **by_name; /* n pointers sorted by name, for csd_st_find */
    int n, cap;
    char **blobs;             /* name storage: one blob per parsed header, owned */
    int n_blobs;
    st_file *files;           /* n_files of files_cap */
    int n_files, files_cap;
};

/* ---- dtypes ---- */

static const char *const st_unsupported_dtypes[] = {
    "F64", "I64", "U64", "I32", "U32", "I16", "U16", "I8", "U8", "BOOL",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64",
};

int csd_st_dtype_from_name(const char *name) {
    if (!name) return -1;
    if (strcmp(name, "F32") == 0) return CSD_DTYPE_F32;
    if (strcmp(name, "F16") == 0) return CSD_DTYPE_F16;
    if (strcmp(name, "BF16") == 0) return CSD_DTYPE_BF16;
    for (size_t i = 0; i < sizeof st_unsupported_dtypes / sizeof st_unsupported_dtypes[0]; i++)
        if (strcmp(name, st_unsupported_dtypes[i]) == 0) return CSD_ST_DTYPE_UNSUPPORTED;
    return -1;
}

const char *csd_st_dtype_name(int dtype) {
    switch (dtype) {
    case CSD_DTYPE_F32: return "F32";
    case CSD_DTYPE_F16: return "F16";
    case CSD_DTYPE_BF16: return "BF16";
    default: return NULL;
    }
}

size_t csd_st_dtype_size(int dtype) {
    switch (dtype) {
    case CSD_DTYPE_F32: return 4;
    case CSD_DTYPE_F16:
    case CSD_DTYPE_BF16: return 2;
    default: return 0;
    }
}

/* ---- set construction ---- */

static int set_create(csd_st_set **out, int n_files, csd_err *err) {
    csd_st_set *set = csd_alloc(sizeof *set);
    if (set) set->files = csd_alloc_array((size_t)n_files, sizeof *set->files);
    if (!set || !set->files) {
        csd_free(set);
        return csd_err_set(err, CSD_ENOMEM, "safetensors: out of memory for %d files", n_files);
    }
    set->files_cap = n_files;
    *out = set;
    return 0;
}

void csd_st_close(csd_st_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_files; i++) {
        csd_file_map_close(&set->files[i].map);
        csd_free(set->files[i].label);
    }
    for (int i = 0; i < set->n_blobs; i++) csd_free(set->blobs[i]);
    csd_free(set->blobs);
    csd_free(set->files);
    csd_free(set->tensors);
    csd_free(set->file_of);
    csd_free(set->by_name);
    csd_free(set);
}

/* Adds a file slot (label copied); the mapping, if any, is filled by the caller. */
static int set_add_file(csd_st_set *set, const char *label, csd_err *err) {
    if (set->n_files >= set->files_cap)
        return csd_err_set(err, CSD_EINVAL, "safetensors: file table full");
    char *copy = csd_strdup(label);
    if (!copy) return csd_err_set(err, CSD_ENOMEM, "%s: out of memory", label);
    set->files[set->n_files].label = copy;
    return set->n_files++;
}

/* Makes room for extra more tensors (no realloc in csd_alloc: allocate, copy, free). */
static int set_reserve(csd_st_set *set, size_t extra, const char *label, csd_err *err) {
    if (extra > (size_t)(CSD_ST_MAX_TENSORS - set->n))
        return csd_err_set(err, CSD_ERANGE, "%s: more than %d tensors", label,
                           CSD_ST_MAX_TENSORS);
    size_t need = (size_t)set->n + extra;
    if (need <= (size_t)set->cap) return 0;
    csd_st_tensor *t = csd_alloc_array(need, sizeof *t);
    int *f = csd_alloc_array(need, sizeof *f);
    if (!t || !f) {
        csd_free(t);
        csd_free(f);
        return csd_err_set(err, CSD_ENOMEM, "%s: out of memory for %zu tensors", label, need);
    }
    if (set->n) {
        memcpy(t, set->tensors, (size_t)set->n * sizeof *t);
        memcpy(f, set->file_of, (size_t)set->n * sizeof *f);
    }
    csd_free(set->tensors);
    csd_free(set->file_of);
    set->tensors = t;
    set->file_of = f;
    set->cap = (int)need;
    return 0;
}

static int set_add_blob(csd_st_set *set, char *blob, const char *label, csd_err *err) {
    char **b = csd_alloc_array((size_t)set->n_blobs + 1, sizeof *b);
    if (!b) {
        csd_free(blob);
        return csd_err_set(err, CSD_ENOMEM, "%s: out of memory", label);
    }
    if (set->n_blobs) memcpy(b, set->blobs, (size_t)set->n_blobs * sizeof *b);
    b[set->n_blobs++] = blob;
    csd_free(set->blobs);
    set->blobs = b;
    return 0;
}

/* ---- header parsing ---- */

typedef struct st_range {
    uint64_t begin, end;
    int index; /* into set->tensors */
} st_range;

static int range_cmp(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Validates one header entry and fills t (name set by the caller). begin/end are data offsets. */
static int parse_entry(csd_st_tensor *t, uint64_t *begin, uint64_t *end, const char *name,
                       json_t *v, const uint8_t *data, uint64_t data_len, const char *label,
                       csd_err *err) {
    if (!json_is_object(v))
        return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%.80s': entry is not a JSON object",
                           label, name);
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%.80s': missing or non-string dtype",
                           label, name);
    const char *ds = json_string_value(jd);
    int dtype = csd_st_dtype_from_name(ds);
    if (dtype == CSD_ST_DTYPE_UNSUPPORTED)
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "%s: tensor '%.80s': dtype %s is not supported (only F32, F16, BF16)",
                           label, name, ds);
    if (dtype < 0)
        return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%.80s': unknown dtype '%.32s'", label,
                           name, ds);
    if (!json_is_array(js))
        return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%.80s': missing or non-array shape",
                           label, name);
    size_t nd = json_array_size(js);
    if (nd > CSD_ST_MAX_DIMS)
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "%s: tensor '%.80s': shape has %zu dims, limit %d", label, name, nd,
                           CSD_ST_MAX_DIMS);
    t->n_dims = (int)nd;
    bool empty = false;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return csd_err_set(err, CSD_EFORMAT,
                               "%s: tensor '%.80s': shape dim %zu is not a non-negative integer",
                               label, name, i);
        t->shape[i] = (int64_t)json_integer_value(d);
        empty = empty || t->shape[i] == 0;
    }
    /* A zero dim makes the tensor empty whatever the others are; otherwise multiply with checks. */
    uint64_t count = empty ? 0 : 1, esize = csd_st_dtype_size(dtype);
    for (int i = 0; i < t->n_dims && !empty; i++) {
        uint64_t dim = (uint64_t)t->shape[i];
        if (count > UINT64_MAX / esize / dim)
            return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%.80s': shape size overflows",
                               label, name);
        count *= dim;
    }
    uint64_t nbytes = count * esize;
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: tensor '%.80s': data_offsets is not a [begin, end] pair", label,
                           name);
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < 0)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: tensor '%.80s': data_offsets are not non-negative integers", label,
                           name);
    uint64_t b = (uint64_t)json_integer_value(jb), e = (uint64_t)json_integer_value(je);
    if (b > e)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: tensor '%.80s': data_offsets begin %llu is after end %llu", label,
                           name, (unsigned long long)b, (unsigned long long)e);
    if (e > data_len)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: tensor '%.80s': data_offsets end %llu is past the end of the data "
                           "section (%llu bytes)",
                           label, name, (unsigned long long)e, (unsigned long long)data_len);
    if (e - b != nbytes)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: tensor '%.80s': shape and dtype need %llu bytes but data_offsets "
                           "span %llu (length mismatch)",
                           label, name, (unsigned long long)nbytes, (unsigned long long)(e - b));
    t->dtype = dtype;
    t->data = data + b;
    t->nbytes = (size_t)nbytes;
    *begin = b;
    *end = e;
    return 0;
}

/* Parses one file's bytes and appends its tensors to set (tagged with file). Leaves set->n
 * unchanged on failure. */
static int parse_append(csd_st_set *set, const uint8_t *buf, size_t len, const char *label,
                        int file, csd_err *err) {
    if (len < 8)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: truncated: %zu bytes, too short for the 8-byte header length",
                           label, len);
    uint64_t hlen = read_le64(buf);
    if (hlen > CSD_ST_MAX_HEADER_BYTES)
        return csd_err_set(err, CSD_EFORMAT, "%s: header length %llu exceeds the limit of %u bytes",
                           label, (unsigned long long)hlen, CSD_ST_MAX_HEADER_BYTES);
    if (hlen > len - 8)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: header length %llu is larger than the file (%zu bytes after the "
                           "length field): truncated?",
                           label, (unsigned long long)hlen, len - 8);
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = (uint64_t)(len - 8 - hlen);

    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_duplicate_key)
            return csd_err_set(err, CSD_EFORMAT,
                               "%s: header repeats a key (duplicate tensor name or field) near "
                               "header byte %d",
                               label, je.position);
        return csd_err_set(err, CSD_EFORMAT, "%s: header is not valid JSON: %s (byte %d)", label,
                           je.text, je.position);
    }
    int rc = 0;
    st_range *ranges = NULL;
    if (!json_is_object(root)) {
        rc = csd_err_set(err, CSD_EFORMAT, "%s: header is JSON but not an object", label);
        goto done;
    }

    /* Pass 1: validate names and size the name blob. */
    const char *key;
    json_t *val;
    size_t n_entries = 0, blob_bytes = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue; /* free-form string map: ignored */
        size_t nl = strlen(key);
        if (nl == 0) {
            rc = csd_err_set(err, CSD_EFORMAT, "%s: a tensor has an empty name", label);
            goto done;
        }
        if (nl >= CSD_ST_MAX_NAME) {
            rc = csd_err_set(err, CSD_EFORMAT,
                             "%s: tensor name '%.40s...' is %zu bytes long, limit %d", label, key,
                             nl, CSD_ST_MAX_NAME - 1);
            goto done;
        }
        n_entries++;
        blob_bytes += nl + 1;
    }
    if ((rc = set_reserve(set, n_entries, label, err)) != 0) goto done;
    char *blob = csd_alloc(blob_bytes);
    if (!blob) {
        rc = csd_err_set(err, CSD_ENOMEM, "%s: out of memory for tensor names", label);
        goto done;
    }
    if ((rc = set_add_blob(set, blob, label, err)) != 0) goto done;
    ranges = csd_alloc_array(n_entries, sizeof *ranges);
    if (!ranges) {
        rc = csd_err_set(err, CSD_ENOMEM, "%s: out of memory", label);
        goto done;
    }

    /* Pass 2: validate each entry into the reserved slots. */
    size_t k = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        csd_st_tensor *t = &set->tensors[set->n + (int)k];
        memset(t, 0, sizeof *t);
        rc = parse_entry(t, &ranges[k].begin, &ranges[k].end, key, val, data, data_len, label,
                         err);
        if (rc != 0) goto done;
        size_t nl = strlen(key);
        memcpy(blob, key, nl + 1);
        t->name = blob;
        blob += nl + 1;
        ranges[k].index = set->n + (int)k;
        set->file_of[set->n + (int)k] = file;
        k++;
    }

    /* Overlap: sort by begin; a non-empty range must start at or after every earlier end. */
    qsort(ranges, n_entries, sizeof *ranges, range_cmp);
    uint64_t max_end = 0;
    int max_idx = -1;
    for (size_t i = 0; i < n_entries; i++) {
        if (ranges[i].begin == ranges[i].end) continue;
        if (max_idx >= 0 && ranges[i].begin < max_end) {
            rc = csd_err_set(err, CSD_EFORMAT,
                             "%s: tensors '%.80s' and '%.80s' overlap in the data section",
                             label, set->tensors[max_idx].name,
                             set->tensors[ranges[i].index].name);
            goto done;
        }
        max_end = ranges[i].end;
        max_idx = ranges[i].index;
    }
    set->n += (int)n_entries;
done:
    csd_free(ranges);
    json_decref(root);
    return rc;
}

static int name_cmp(const void *a, const void *b) {
    const csd_st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Builds the by-name index; a name in two files of one set is an error. */
static int set_finish(csd_st_set *set, csd_err *err) {
    set->by_name = csd_alloc_array((size_t)set->n, sizeof *set->by_name);
    if (!set->by_name) return csd_err_set(err, CSD_ENOMEM, "safetensors: out of memory");
    for (int i = 0; i < set->n; i++) set->by_name[i] = &set->tensors[i];
    qsort(set->by_name, (size_t)set->n, sizeof *set->by_name, name_cmp);
    for (int i = 1; i < set->n; i++) {
        if (strcmp(set->by_name[i - 1]->name, set->by_name[i]->name) != 0) continue;
        int fa = set->file_of[set->by_name[i - 1] - set->tensors];
        int fb = set->file_of[set->by_name[i] - set->tensors];
        return csd_err_set(err, CSD_EFORMAT, "duplicate tensor name '%.80s' (in %s and %s)",
                           set->by_name[i]->name, set->files[fa].label, set->files[fb].label);
    }
    return 0;
}

/* ---- public: single buffer and file ---- */

int csd_st_parse(csd_st_set **out, const uint8_t *buf, size_t len, const char *label,
                 csd_err *err) {
    *out = NULL;
    if (!label) label = "safetensors";
    if (!buf && len) return csd_err_set(err, CSD_EINVAL, "%s: NULL buffer", label);
    csd_st_set *set;
    int rc = set_create(&set, 1, err);
    if (rc != 0) return rc;
    if ((rc = set_add_file(set, label, err)) < 0) goto fail;
    if ((rc = parse_append(set, buf, len, label, 0, err)) != 0) goto fail;
    if ((rc = set_finish(set, err)) != 0) goto fail;
    *out = set;
    return 0;
fail:
    csd_st_close(set);
    return rc;
}

/* Maps path into a new file slot and parses it into set. */
static int set_load_file(csd_st_set *set, const char *path, csd_err *err) {
    int f = set_add_file(set, path, err);
    if (f < 0) return f;
    int rc = csd_file_map_open(&set->files[f].map, path, err);
    if (rc != 0) return rc;
    return parse_append(set, set->files[f].map.data, set->files[f].map.size, path, f, err);
}

int csd_st_open_file(csd_st_set **out, const char *path, csd_err *err) {
    *out = NULL;
    csd_st_set *set;
    int rc = set_create(&set, 1, err);
    if (rc != 0) return rc;
    if ((rc = set_load_file(set, path, err)) != 0) goto fail;
    if ((rc = set_finish(set, err)) != 0) goto fail;
    *out = set;
    return 0;
fail:
    csd_st_close(set);
    return rc;
}

/* ---- public: sharded checkpoints ---- */

static int str_ptr_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard file name must stay inside the model directory: no separators, no "." or "..". */
static bool shard_name_ok(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 256 && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") != 0 &&
           strcmp(s, "..") != 0;
}

/* The distinct file names the weight map lists, sorted (so each entry's file is a binary search),
 * into files (room for every entry); *n_files their count. */
static int index_files(json_t *wm, const char *index_path, const char **files, size_t *n_files,
                       csd_err *err) {
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val) || !shard_name_ok(json_string_value(val)))
            return csd_err_set(err, CSD_EFORMAT,
                               "%s: weight_map entry '%.80s' does not name a file in the model "
                               "directory",
                               index_path, key);
        files[n++] = json_string_value(val);
    }
    qsort(files, n, sizeof *files, str_ptr_cmp);
    size_t uniq = 0;
    for (size_t i = 0; i < n; i++)
        if (uniq == 0 || strcmp(files[uniq - 1], files[i]) != 0) files[uniq++] = files[i];
    if (uniq > ST_MAX_FILES)
        return csd_err_set(err, CSD_ERANGE, "%s: names %zu files, limit %d", index_path, uniq,
                           ST_MAX_FILES);
    *n_files = uniq;
    return 0;
}

/* Maps every listed file of dir into set. */
static int load_index_files(csd_st_set *set, const char *dir, const char **files, size_t n,
                            csd_err *err) {
    for (size_t i = 0; i < n; i++) {
        char path[ST_PATH_MAX];
        if (csd_path_join(path, sizeof path, dir, files[i]) != 0)
            return csd_err_set(err, CSD_ERANGE, "%s/%s: path too long", dir, files[i]);
        int rc = set_load_file(set, path, err);
        if (rc) {
            csd_err_prefix(err, "%s lists %s: ", ST_INDEX_NAME, files[i]);
            return rc;
        }
    }
    return 0;
}

/* Every mapped tensor must be in the file the index names. */
static int check_weight_map(const csd_st_set *set, json_t *wm, const char *index_path,
                            const char **files, size_t n_files, csd_err *err) {
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *fname = json_string_value(val);
        const char **pos = bsearch(&fname, files, n_files, sizeof *files, str_ptr_cmp);
        int want = (int)(pos - files);
        const csd_st_tensor *t = csd_st_find(set, key);
        if (!t)
            return csd_err_set(
                err, CSD_EFORMAT,
                "%s: tensor '%.80s' is mapped to %s but that file does not contain it", index_path,
                key, fname);
        int got = set->file_of[t - set->tensors];
        if (got != want)
            return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%.80s' is mapped to %s but is in %s",
                               index_path, key, fname, set->files[got].label);
    }
    return 0;
}

static int open_index(csd_st_set **out, const char *dir, const char *index_path, csd_err *err) {
    json_t *root = NULL;
    int rc = csd_json_read_file(index_path, ST_INDEX_MAX_BYTES, &root, err);
    if (rc != 0) return rc;
    const char **files = NULL;
    csd_st_set *set = NULL;
    size_t n_files = 0;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm) || json_object_size(wm) == 0)
        rc =
            csd_err_set(err, CSD_EFORMAT, "%s: missing or empty \"weight_map\" object", index_path);
    else if (!(files = csd_alloc_array(json_object_size(wm), sizeof *files)))
        rc = csd_err_set(err, CSD_ENOMEM, "%s: out of memory", index_path);
    if (!rc) rc = index_files(wm, index_path, files, &n_files, err);
    if (!rc) rc = set_create(&set, (int)n_files, err);
    if (!rc) rc = load_index_files(set, dir, files, n_files, err);
    if (!rc) rc = set_finish(set, err);
    if (!rc) rc = check_weight_map(set, wm, index_path, files, n_files, err);
    csd_free(files);
    json_decref(root);
    if (rc) {
        csd_st_close(set);
        return rc;
    }
    *out = set;
    return 0;
}

int csd_st_dir_weights(const char *model_dir, const char **name, csd_err *err) {
    static const char *const names[] = {ST_INDEX_NAME, ST_SINGLE_NAME}; /* the index wins */
    *name = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[ST_PATH_MAX];
        if (csd_path_join(path, sizeof path, model_dir, names[i]) != 0)
            return csd_err_set(err, CSD_ERANGE, "%s: path too long", model_dir);
        if (csd_file_exists(path)) {
            *name = names[i];
            return 0;
        }
    }
    return 0;
}

int csd_st_open_dir(csd_st_set **out, const char *model_dir, csd_err *err) {
    *out = NULL;
    const char *name;
    int rc = csd_st_dir_weights(model_dir, &name, err);
    if (rc) return rc;
    if (!name)
        return csd_err_set(err, CSD_ENOTFOUND, "%s: no %s or %s", model_dir, ST_SINGLE_NAME,
                           ST_INDEX_NAME);
    char path[ST_PATH_MAX];
    csd_path_join(path, sizeof path, model_dir, name); /* fits: csd_st_dir_weights checked */
    return !strcmp(name, ST_INDEX_NAME) ? open_index(out, model_dir, path, err)
                                        : csd_st_open_file(out, path, err);
}

/* ---- lookup ---- */

const csd_st_tensor *csd_st_find(const csd_st_set *set, const char *name) {
    if (!set || !name || !set->by_name) return NULL;
    csd_st_tensor key = {.name = name};
    const csd_st_tensor *kp = &key;
    const csd_st_tensor *const *hit =
        bsearch(&kp, set->by_name, (size_t)set->n, sizeof *set->by_name, name_cmp);
    return hit ? *hit : NULL;
}

int csd_st_count(const csd_st_set *set) { return set ? set->n : 0; }

const csd_st_tensor *csd_st_at(const csd_st_set *set, int index) {
    if (!set || index < 0 || index >= set->n) return NULL;
    return &set->tensors[index];
}
