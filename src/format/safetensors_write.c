/* safetensors_write: the writer. Emits the 8-byte length, a compact JSON header padded with spaces
 * to a multiple of 8 bytes (so the data section starts 8-aligned), then each tensor's bytes in
 * descriptor order, produced one tensor at a time by a fill callback. Tensors are contiguous (no
 * gaps), as the reference implementation requires. Writes PATH.tmp and renames it over PATH. */
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "safetensors_internal.h"

static int desc_name_cmp(const void *a, const void *b) {
    const csd_st_desc *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Checks every descriptor and computes each tensor's byte size into sizes[]. */
static int check_descs(const csd_st_desc *descs, int n, size_t *sizes, size_t *max_size,
                       uint64_t *total, const char *path, csd_err *err) {
    *max_size = 0;
    *total = 0;
    for (int i = 0; i < n; i++) {
        const csd_st_desc *d = &descs[i];
        if (!d->name || !d->name[0] || strlen(d->name) >= CSD_ST_MAX_NAME)
            return csd_err_set(err, CSD_EINVAL, "%s: tensor %d: name missing or longer than %d",
                               path, i, CSD_ST_MAX_NAME - 1);
        if (strcmp(d->name, "__metadata__") == 0)
            return csd_err_set(err, CSD_EINVAL, "%s: tensor %d: name __metadata__ is reserved",
                               path, i);
        size_t esize = csd_st_dtype_size(d->dtype);
        if (esize == 0)
            return csd_err_set(err, CSD_EINVAL,
                               "%s: tensor '%.80s': dtype %d cannot be written (F32, F16, BF16)",
                               path, d->name, d->dtype);
        if (d->n_dims < 0 || d->n_dims > CSD_ST_MAX_DIMS)
            return csd_err_set(err, CSD_EINVAL, "%s: tensor '%.80s': %d dims, limit %d", path,
                               d->name, d->n_dims, CSD_ST_MAX_DIMS);
        uint64_t bytes = esize;
        for (int k = 0; k < d->n_dims; k++) {
            if (d->shape[k] < 0)
                return csd_err_set(err, CSD_EINVAL, "%s: tensor '%.80s': negative dim %d", path,
                                   d->name, k);
            uint64_t dim = (uint64_t)d->shape[k];
            if (dim != 0 && bytes > (uint64_t)INT64_MAX / dim)
                return csd_err_set(err, CSD_EINVAL, "%s: tensor '%.80s': size overflows", path,
                                   d->name);
            bytes *= dim;
        }
        if (bytes > (uint64_t)INT64_MAX - *total || bytes > SIZE_MAX)
            return csd_err_set(err, CSD_EINVAL, "%s: total data size overflows", path);
        sizes[i] = (size_t)bytes;
        *total += bytes;
        if (sizes[i] > *max_size) *max_size = sizes[i];
    }
    return 0;
}

/* One header entry: {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}; NULL on OOM. */
static json_t *header_entry(const csd_st_desc *d, uint64_t begin, uint64_t end) {
    json_t *t = json_object(), *shape = json_array(), *offs = json_array();
    bool ok = t && shape && offs;
    for (int k = 0; k < d->n_dims && ok; k++)
        ok = json_array_append_new(shape, json_integer(d->shape[k])) == 0;
    ok = ok && json_array_append_new(offs, json_integer((json_int_t)begin)) == 0 &&
         json_array_append_new(offs, json_integer((json_int_t)end)) == 0 &&
         json_object_set_new(t, "dtype", json_string(csd_st_dtype_name(d->dtype))) == 0 &&
         json_object_set(t, "shape", shape) == 0 && json_object_set(t, "data_offsets", offs) == 0;
    json_decref(shape);
    json_decref(offs);
    if (!ok) {
        json_decref(t);
        return NULL;
    }
    return t;
}

/* Builds the padded header text (csd_free it). Offsets are cumulative in descriptor order. */
static int build_header(const csd_st_desc *descs, int n, const size_t *sizes, char **out,
                        size_t *out_len, const char *path, csd_err *err) {
    json_t *root = json_object();
    bool bad = !root || json_object_set_new(root, "__metadata__",
                                            json_pack("{s:s}", "format", "pt")) != 0;
    uint64_t offset = 0;
    for (int i = 0; i < n && !bad; i++) {
        json_t *t = header_entry(&descs[i], offset, offset + sizes[i]);
        if (!t) {
            bad = true;
            break;
        }
        /* set_new refuses keys that are not valid UTF-8 (and consumes t either way). */
        if (json_object_set_new(root, descs[i].name, t) != 0) {
            json_decref(root);
            return csd_err_set(err, CSD_EINVAL, "%s: tensor name '%.80s' is not valid UTF-8",
                               path, descs[i].name);
        }
        offset += sizes[i];
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) return csd_err_set(err, CSD_ENOMEM, "%s: cannot build the header", path);
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    if (padded > CSD_ST_MAX_HEADER_BYTES) {
        free(text);
        return csd_err_set(err, CSD_ERANGE, "%s: header would be %zu bytes, limit %u", path,
                           padded, CSD_ST_MAX_HEADER_BYTES);
    }
    char *hdr = csd_alloc(padded);
    if (!hdr) {
        free(text); /* json_dumps uses jansson's allocator (malloc) */
        return csd_err_set(err, CSD_ENOMEM, "%s: out of memory", path);
    }
    memcpy(hdr, text, len);
    memset(hdr + len, ' ', padded - len);
    free(text);
    *out = hdr;
    *out_len = padded;
    return 0;
}

int csd_st_write(const char *path, const csd_st_desc *descs, int n, csd_st_fill_fn fill, void *ctx,
                 csd_err *err) {
    if (!path || n < 0 || n > CSD_ST_MAX_TENSORS || (n > 0 && (!descs || !fill)))
        return csd_err_set(err, CSD_EINVAL, "safetensors write: bad arguments");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return csd_err_set(err, CSD_ERANGE, "%s: path too long", path);

    int rc = 0;
    size_t *sizes = csd_alloc_array((size_t)n, sizeof *sizes);
    const csd_st_desc **sorted = csd_alloc_array((size_t)n, sizeof *sorted);
    char *hdr = NULL;
    void *buf = NULL;
    FILE *f = NULL;
    bool created = false;
    if (!sizes || !sorted) {
        rc = csd_err_set(err, CSD_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t max_size = 0, hdr_len = 0;
    uint64_t total = 0;
    if ((rc = check_descs(descs, n, sizes, &max_size, &total, path, err)) != 0) goto done;
    for (int i = 0; i < n; i++) sorted[i] = &descs[i];
    qsort(sorted, (size_t)n, sizeof *sorted, desc_name_cmp);
    for (int i = 1; i < n; i++) {
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            rc = csd_err_set(err, CSD_EINVAL, "%s: duplicate tensor name '%.80s'", path,
                             sorted[i]->name);
            goto done;
        }
    }
    if ((rc = build_header(descs, n, sizes, &hdr, &hdr_len, path, err)) != 0) goto done;
    buf = csd_alloc(max_size); /* one tensor at a time, reused */
    if (!buf) {
        rc = csd_err_set(err, CSD_ENOMEM, "%s: cannot allocate %zu bytes for one tensor", path,
                         max_size);
        goto done;
    }

    f = fopen(tmp, "wb");
    if (!f) {
        rc = csd_err_set(err, CSD_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    created = true;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hdr_len >> (8 * i));
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(hdr, 1, hdr_len, f) != hdr_len) {
        rc = csd_err_set(err, CSD_EIO, "%s: write failed: %s", tmp, strerror(errno));
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (err) csd_err_clear(err);
        rc = fill(ctx, i, buf, sizes[i], err);
        if (rc != 0) {
            if (err && err->code == 0) csd_err_set(err, rc, "fill failed");
            csd_err_prefix(err, "%s: tensor '%.80s': ", path, descs[i].name);
            goto done;
        }
        if (sizes[i] && fwrite(buf, 1, sizes[i], f) != sizes[i]) {
            rc = csd_err_set(err, CSD_EIO, "%s: write failed: %s", tmp, strerror(errno));
            goto done;
        }
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        rc = csd_err_set(err, CSD_EIO, "%s: flush failed: %s", tmp, strerror(errno));
        goto done;
    }
    int close_rc = fclose(f);
    f = NULL;
    if (close_rc != 0) {
        rc = csd_err_set(err, CSD_EIO, "%s: close failed: %s", tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        rc = csd_err_set(err, CSD_EIO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        goto done;
    }
done:
    if (f) fclose(f);
    if (rc != 0 && created) unlink(tmp);
    csd_free(buf);
    csd_free(hdr);
    csd_free(sorted);
    csd_free(sizes);
    return rc;
}
