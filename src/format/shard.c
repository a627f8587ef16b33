/* shard: encoder and validating decoder of the stage shard file (docs/shard-format.md).
 * Every field is read with explicit little-endian helpers; every offset and size is checked against
 * the file length, and against the sections before it, before anything is dereferenced. The
 * decoder is a pure function over a byte buffer, so it is fuzzed directly (fuzz_format_shard). */
#include "shard.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/file_map.h"

/* Byte offsets of the header fields (docs/shard-format.md, "Header"). */
enum {
    H_MAGIC = 0,
    H_VERSION = 8,
    H_HEADER_BYTES = 12,
    H_STAGE_INDEX = 16,
    H_STAGE_COUNT = 20,
    H_LAYER_BEGIN = 24,
    H_LAYER_END = 28,
    H_N_LAYERS = 32,
    H_FLAGS = 36,
    H_PRECISION = 40,
    H_KERNEL_LAYOUT = 44,
    H_MODEL_HASH = 48,
    H_CONFIG_OFFSET = 80,
    H_CONFIG_BYTES = 88,
    H_TABLE_OFFSET = 96,
    H_TENSOR_COUNT = 104,
    H_ENTRY_BYTES = 108,
    H_DATA_OFFSET = 112,
    H_DATA_BYTES = 120,
    H_FILE_BYTES = 128,
    H_CHECKSUM = 136,
    H_RESERVED = 144, /* to CSD_SHARD_HEADER_BYTES: zero */
};

/* Byte offsets inside a tensor table entry. */
enum {
    E_NAME = 0,
    E_DTYPE = 80,
    E_RESERVED = 84,
    E_ROWS = 88,
    E_COLS = 96,
    E_OFFSET = 104,
    E_NBYTES = 112,
    E_CHECKSUM = 120,
};

static_assert(H_RESERVED <= CSD_SHARD_HEADER_BYTES, "header fields overflow the header");
static_assert(E_CHECKSUM + 8 == CSD_SHARD_ENTRY_BYTES, "entry fields must fill the entry");
static_assert(E_DTYPE == CSD_SHARD_NAME_BYTES, "name field size");

/* A tensor dimension larger than this is refused (2^31: more than any real matrix side). */
#define MAX_TENSOR_SIDE (INT64_C(1) << 31)

struct csd_shard {
    char *label;      /* owned */
    csd_file_map map; /* when opened from a path */
    bool mapped;
    const uint8_t *buf; /* the whole file (mapping or caller's buffer) */
    size_t len;
    csd_shard_header hdr;
    csd_model_config cfg;
    const char *config_json; /* borrowed from buf */
    size_t config_len;
    int n;
    csd_shard_tensor *tensors; /* owned, n entries in table order */
    int *by_name;              /* owned, indices sorted by name */
};

/* ---- little-endian helpers ---- */

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t align_up(uint64_t v) {
    return (v + CSD_SHARD_ALIGN - 1) / CSD_SHARD_ALIGN * CSD_SHARD_ALIGN;
}

/* xxh64 of head[0, n) with the checksum field counted as zero bytes. */
static uint64_t header_checksum(const uint8_t *head, size_t n) {
    static const uint8_t zeros[8] = {0};
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    XXH64_update(&st, head, H_CHECKSUM);
    XXH64_update(&st, zeros, sizeof zeros);
    XXH64_update(&st, head + H_CHECKSUM + 8, n - (H_CHECKSUM + 8));
    return XXH64_digest(&st);
}

/* ---- reading ---- */

void csd_shard_close(csd_shard *s) {
    if (!s) return;
    if (s->mapped) csd_file_map_close(&s->map);
    csd_free(s->label);
    csd_free(s->tensors);
    csd_free(s->by_name);
    csd_free(s);
}

/* Magic, version, header size, reserved bytes and file size: what the file is. */
static int decode_identity(csd_shard *s, csd_err *err) {
    const uint8_t *b = s->buf;
    const char *L = s->label;
    csd_shard_header *h = &s->hdr;
    if (s->len < CSD_SHARD_HEADER_BYTES) {
        if (s->len >= 8 && memcmp(b, CSD_SHARD_MAGIC, 8) != 0)
            return csd_err_set(err, CSD_EFORMAT, "%s: not a cascadia shard (bad magic)", L);
        return csd_err_set(err, CSD_EFORMAT, "%s: truncated: %zu bytes, the header alone is %d", L,
                           s->len, CSD_SHARD_HEADER_BYTES);
    }
    if (memcmp(b + H_MAGIC, CSD_SHARD_MAGIC, 8) != 0)
        return csd_err_set(err, CSD_EFORMAT, "%s: not a cascadia shard (bad magic)", L);
    h->version = get_u32(b + H_VERSION);
    if (h->version != CSD_SHARD_VERSION)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: shard format version %u, this build reads version %d", L,
                           h->version, CSD_SHARD_VERSION);
    uint32_t header_bytes = get_u32(b + H_HEADER_BYTES);
    if (header_bytes != CSD_SHARD_HEADER_BYTES)
        return csd_err_set(err, CSD_EFORMAT, "%s: header size %u, expected %d", L, header_bytes,
                           CSD_SHARD_HEADER_BYTES);
    for (int i = H_RESERVED; i < CSD_SHARD_HEADER_BYTES; i++)
        if (b[i])
            return csd_err_set(err, CSD_EFORMAT, "%s: reserved header byte %d is not zero", L, i);
    h->file_bytes = get_u64(b + H_FILE_BYTES);
    if (h->file_bytes != s->len)
        return csd_err_set(err, CSD_EFORMAT, "%s: %s: file is %zu bytes, its header says %llu", L,
                           s->len < h->file_bytes ? "truncated" : "trailing bytes", s->len,
                           (unsigned long long)h->file_bytes);
    return 0;
}

/* Which stage of how many, its layers, and whether it holds the embeddings and the head. */
static int decode_stage(csd_shard *s, csd_err *err) {
    const uint8_t *b = s->buf;
    const char *L = s->label;
    csd_shard_header *h = &s->hdr;
    h->stage_index = get_u32(b + H_STAGE_INDEX);
    h->stage_count = get_u32(b + H_STAGE_COUNT);
    if (h->stage_count < 1 || h->stage_count > CSD_SHARD_MAX_STAGES ||
        h->stage_index >= h->stage_count)
        return csd_err_set(err, CSD_EFORMAT, "%s: stage %u of %u is invalid (at most %d stages)", L,
                           h->stage_index, h->stage_count, CSD_SHARD_MAX_STAGES);
    h->layer_begin = get_u32(b + H_LAYER_BEGIN);
    h->layer_end = get_u32(b + H_LAYER_END);
    h->n_layers = get_u32(b + H_N_LAYERS);
    if (h->n_layers < 1 || h->n_layers > CSD_MAX_LAYERS || h->layer_begin >= h->layer_end ||
        h->layer_end > h->n_layers)
        return csd_err_set(
            err, CSD_EFORMAT, "%s: layer range [%lld, %lld) of %lld layers is invalid", L,
            (long long)h->layer_begin, (long long)h->layer_end, (long long)h->n_layers);
    uint32_t flags = get_u32(b + H_FLAGS);
    if (flags & ~(CSD_SHARD_FLAG_EMBED | CSD_SHARD_FLAG_HEAD))
        return csd_err_set(err, CSD_EFORMAT, "%s: unknown header flags 0x%x", L, flags);
    h->has_embed = flags & CSD_SHARD_FLAG_EMBED;
    h->has_head = flags & CSD_SHARD_FLAG_HEAD;
    if (h->has_embed != (h->layer_begin == 0) || h->has_head != (h->layer_end == h->n_layers))
        return csd_err_set(
            err, CSD_EFORMAT,
            "%s: embeddings/head flags (%d/%d) disagree with layers [%lld, %lld) of %lld", L,
            h->has_embed, h->has_head, (long long)h->layer_begin, (long long)h->layer_end,
            (long long)h->n_layers);
    return 0;
}

static int decode_header(csd_shard *s, csd_err *err) {
    const uint8_t *b = s->buf;
    const char *L = s->label;
    csd_shard_header *h = &s->hdr;
    int rc = decode_identity(s, err);
    if (!rc) rc = decode_stage(s, err);
    if (rc) return rc;
    uint32_t precision = get_u32(b + H_PRECISION);
    if (precision >= CSD_DTYPE_COUNT)
        return csd_err_set(err, CSD_EFORMAT, "%s: unknown precision %u", L, precision);
    h->precision = (int)precision;
    h->kernel_layout = get_u32(b + H_KERNEL_LAYOUT);
    if (h->kernel_layout != CSD_SHARD_KERNEL_LAYOUT)
        return csd_err_set(
            err, CSD_EFORMAT,
            "%s: written for kernel layout %u, this build uses layout %d: export it again", L,
            h->kernel_layout, CSD_SHARD_KERNEL_LAYOUT);
    memcpy(h->model_hash, b + H_MODEL_HASH, CSD_SHARD_HASH_BYTES);
    h->header_checksum = get_u64(b + H_CHECKSUM);
    return 0;
}

static int name_cmp_ctx_sort(const void *a, const void *b, void *ctx) {
    const csd_shard_tensor *t = ctx;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

static int offset_cmp(const void *a, const void *b) {
    const csd_shard_tensor *x = *(const csd_shard_tensor *const *)a,
                           *y = *(const csd_shard_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* A table entry's name: printable ASCII, NUL-terminated and NUL-padded to the field's end. */
static int decode_name(const csd_shard *s, int i, const uint8_t *e, char *name, csd_err *err) {
    const char *L = s->label;
    size_t name_len = strnlen((const char *)e + E_NAME, CSD_SHARD_NAME_BYTES);
    if (name_len == 0 || name_len == CSD_SHARD_NAME_BYTES)
        return csd_err_set(err, CSD_EFORMAT, "%s: tensor %d: name empty or not NUL-terminated", L,
                           i);
    for (size_t k = name_len; k < CSD_SHARD_NAME_BYTES; k++)
        if (e[E_NAME + k])
            return csd_err_set(err, CSD_EFORMAT, "%s: tensor %d: name not NUL-padded", L, i);
    for (size_t k = 0; k < name_len; k++)
        if (e[E_NAME + k] < 0x21 || e[E_NAME + k] > 0x7e)
            return csd_err_set(err, CSD_EFORMAT, "%s: tensor %d: name has a non-printable byte", L,
                               i);
    memcpy(name, e + E_NAME, name_len);
    name[name_len] = '\0';
    return 0;
}

/* Table entry i into s->tensors[i]: a known dtype, a shape in range, and bytes inside the data
 * section at the required alignment. */
static int decode_entry(csd_shard *s, int i, uint64_t table_offset, uint64_t data_offset,
                        csd_err *err) {
    const char *L = s->label;
    const uint8_t *e = s->buf + table_offset + (uint64_t)i * CSD_SHARD_ENTRY_BYTES;
    csd_shard_tensor *t = &s->tensors[i];
    int rc = decode_name(s, i, e, t->name, err);
    if (rc) return rc;
    uint32_t dtype = get_u32(e + E_DTYPE);
    uint64_t rows = get_u64(e + E_ROWS), cols = get_u64(e + E_COLS);
    uint64_t off = get_u64(e + E_OFFSET), nbytes = get_u64(e + E_NBYTES);
    if (dtype >= CSD_DTYPE_COUNT || get_u32(e + E_RESERVED) != 0)
        return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%s': unknown dtype %u", L, t->name,
                           dtype);
    if (rows < 1 || cols < 1 || rows > (uint64_t)MAX_TENSOR_SIDE ||
        cols > (uint64_t)MAX_TENSOR_SIDE)
        return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%s': shape [%llu, %llu] out of range", L,
                           t->name, (unsigned long long)rows, (unsigned long long)cols);
    if (off % CSD_SHARD_ALIGN != 0 || off < data_offset || off > s->len || nbytes > s->len - off)
        return csd_err_set(
            err, CSD_EFORMAT,
            "%s: tensor '%s': bytes [%llu, +%llu) misaligned or outside the data section "
            "[%llu, %zu)",
            L, t->name, (unsigned long long)off, (unsigned long long)nbytes,
            (unsigned long long)data_offset, s->len);
    t->dtype = (int)dtype;
    t->rows = (int64_t)rows;
    t->cols = (int64_t)cols;
    t->offset = off;
    t->nbytes = (size_t)nbytes;
    t->checksum = get_u64(e + E_CHECKSUM);
    t->data = s->buf + off;
    return 0;
}

/* No name twice, no two tensors' bytes overlapping (sorts s->by_name and by_off). */
static int check_distinct(csd_shard *s, const csd_shard_tensor **by_off, csd_err *err) {
    const char *L = s->label;
    qsort_r(s->by_name, (size_t)s->n, sizeof *s->by_name, name_cmp_ctx_sort, s->tensors);
    for (int i = 1; i < s->n; i++)
        if (!strcmp(s->tensors[s->by_name[i]].name, s->tensors[s->by_name[i - 1]].name))
            return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%s' appears twice", L,
                               s->tensors[s->by_name[i]].name);
    qsort(by_off, (size_t)s->n, sizeof *by_off, offset_cmp);
    for (int i = 1; i < s->n; i++)
        if (by_off[i - 1]->offset + by_off[i - 1]->nbytes > by_off[i]->offset)
            return csd_err_set(err, CSD_EFORMAT, "%s: tensors '%s' and '%s' overlap", L,
                               by_off[i - 1]->name, by_off[i]->name);
    return 0;
}

/* Decodes and checks the table entries (sections already known to lie inside the file). */
static int decode_table(csd_shard *s, uint64_t table_offset, uint64_t data_offset, csd_err *err) {
    size_t n = (size_t)(s->n ? s->n : 1);
    s->tensors = csd_alloc_array(n, sizeof *s->tensors);
    s->by_name = csd_alloc_array(n, sizeof *s->by_name);
    const csd_shard_tensor **by_off = csd_alloc_array(n, sizeof *by_off);
    if (!s->tensors || !s->by_name || !by_off) {
        csd_free(by_off);
        return csd_err_set(err, CSD_ENOMEM, "%s: table of %d tensors", s->label, s->n);
    }
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        rc = decode_entry(s, i, table_offset, data_offset, err);
        s->by_name[i] = i;
        by_off[i] = &s->tensors[i];
    }
    if (!rc && s->n > 1) rc = check_distinct(s, by_off, err);
    csd_free(by_off);
    return rc;
}

int csd_shard_parse(csd_shard **out, const uint8_t *buf, size_t len, const char *label,
                    unsigned flags, csd_err *err) {
    *out = NULL;
    csd_shard *s = csd_alloc(sizeof *s);
    if (!s) return csd_err_set(err, CSD_ENOMEM, "shard");
    s->label = csd_strdup(label ? label : "shard");
    if (!s->label) {
        csd_free(s);
        return csd_err_set(err, CSD_ENOMEM, "shard");
    }
    s->buf = buf;
    s->len = len;
    const char *L = s->label;
    int rc = decode_header(s, err);
    if (rc) goto fail;
    const uint8_t *b = buf;
    uint64_t config_offset = get_u64(b + H_CONFIG_OFFSET),
             config_bytes = get_u64(b + H_CONFIG_BYTES);
    uint64_t table_offset = get_u64(b + H_TABLE_OFFSET);
    uint32_t count = get_u32(b + H_TENSOR_COUNT), entry_bytes = get_u32(b + H_ENTRY_BYTES);
    uint64_t data_offset = get_u64(b + H_DATA_OFFSET), data_bytes = get_u64(b + H_DATA_BYTES);
    /* Sections in order, each inside the file: header | config | table | data. */
    if (entry_bytes != CSD_SHARD_ENTRY_BYTES || count > CSD_SHARD_MAX_TENSORS) {
        rc = csd_err_set(err, CSD_EFORMAT,
                         "%s: table of %u entries of %u bytes (expected %d-byte entries, "
                         "at most %d)",
                         L, count, entry_bytes, CSD_SHARD_ENTRY_BYTES, CSD_SHARD_MAX_TENSORS);
        goto fail;
    }
    if (config_offset != CSD_SHARD_HEADER_BYTES || config_bytes < 2 ||
        config_bytes > CSD_SHARD_MAX_CONFIG_BYTES || table_offset % CSD_SHARD_ALIGN != 0 ||
        table_offset < config_offset + config_bytes || table_offset > len ||
        (uint64_t)count * CSD_SHARD_ENTRY_BYTES > len - table_offset ||
        data_offset % CSD_SHARD_ALIGN != 0 ||
        data_offset < table_offset + (uint64_t)count * CSD_SHARD_ENTRY_BYTES || data_offset > len ||
        data_bytes != len - data_offset) {
        rc = csd_err_set(
            err, CSD_EFORMAT,
            "%s: sections out of order or outside the file (config %llu+%llu, table %llu+%u*%d, "
            "data %llu+%llu, file %zu)",
            L, (unsigned long long)config_offset, (unsigned long long)config_bytes,
            (unsigned long long)table_offset, count, CSD_SHARD_ENTRY_BYTES,
            (unsigned long long)data_offset, (unsigned long long)data_bytes, len);
        goto fail;
    }
    if ((flags & CSD_SHARD_VERIFY_HEADER) &&
        header_checksum(b, (size_t)data_offset) != s->hdr.header_checksum) {
        rc = csd_err_set(err, CSD_EFORMAT,
                         "%s: header checksum mismatch (config or tensor table corrupted)", L);
        goto fail;
    }
    s->config_json = (const char *)b + config_offset;
    s->config_len = (size_t)config_bytes;
    rc = csd_model_config_parse(&s->cfg, s->config_json, s->config_len, err);
    if (rc) {
        csd_err_prefix(err, "%s: embedded config: ", L);
        goto fail;
    }
    if (s->cfg.n_layers != s->hdr.n_layers) {
        rc = csd_err_set(err, CSD_EFORMAT, "%s: header says %lld layers, embedded config %lld", L,
                         (long long)s->hdr.n_layers, (long long)s->cfg.n_layers);
        goto fail;
    }
    s->n = (int)count;
    rc = decode_table(s, table_offset, data_offset, err);
    if (rc) goto fail;
    if (flags & CSD_SHARD_VERIFY_TENSORS) {
        for (int i = 0; i < s->n; i++) {
            const csd_shard_tensor *t = &s->tensors[i];
            uint64_t sum = XXH64(t->data, t->nbytes, 0);
            if (sum != t->checksum) {
                rc = csd_err_set(
                    err, CSD_EFORMAT,
                    "%s: tensor '%s' is corrupted (checksum %016llx, expected %016llx)", L, t->name,
                    (unsigned long long)sum, (unsigned long long)t->checksum);
                goto fail;
            }
        }
    }
    *out = s;
    return 0;
fail:
    csd_shard_close(s);
    return rc;
}

static int open_path(csd_shard **out, const char *path, unsigned flags, csd_err *err) {
    *out = NULL;
    csd_file_map map;
    int rc = csd_file_map_open(&map, path, err);
    if (rc) return rc;
    rc = csd_shard_parse(out, map.data, map.size, path, flags, err);
    if (rc) {
        csd_file_map_close(&map);
        return rc;
    }
    (*out)->map = map;
    (*out)->mapped = true;
    return 0;
}

int csd_shard_open(csd_shard **out, const char *path, csd_err *err) {
    return open_path(out, path, CSD_SHARD_VERIFY_ALL, err);
}

int csd_shard_open_header(csd_shard **out, const char *path, csd_err *err) {
    return open_path(out, path, CSD_SHARD_VERIFY_HEADER, err);
}

const csd_shard_header *csd_shard_hdr(const csd_shard *s) { return &s->hdr; }
const char *csd_shard_label(const csd_shard *s) { return s->label; }
const csd_model_config *csd_shard_config(const csd_shard *s) { return &s->cfg; }
int csd_shard_count(const csd_shard *s) { return s->n; }

const char *csd_shard_config_json(const csd_shard *s, size_t *len) {
    *len = s->config_len;
    return s->config_json;
}

const csd_shard_tensor *csd_shard_at(const csd_shard *s, int i) {
    return i >= 0 && i < s->n ? &s->tensors[i] : NULL;
}

const csd_shard_tensor *csd_shard_find(const csd_shard *s, const char *name) {
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const csd_shard_tensor *t = &s->tensors[s->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

csd_shard_table csd_shard_get_table(const csd_shard *s) {
    return (csd_shard_table){s->hdr.layer_begin, s->hdr.layer_end, s->n, s->tensors};
}

/* ---- writing ---- */

static int write_all(FILE *f, const void *p, size_t n) {
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

int csd_shard_write(const char *path, csd_shard_header *hdr, const char *config_json,
                    size_t config_len, csd_shard_tensor *tensors, int n,
                    csd_shard_progress_fn progress, void *progress_ctx, csd_err *err) {
    if (n < 0 || n > CSD_SHARD_MAX_TENSORS || config_len < 2 ||
        config_len > CSD_SHARD_MAX_CONFIG_BYTES)
        return csd_err_set(err, CSD_EINVAL, "%s: %d tensors, %zu-byte config: out of range", path,
                           n, config_len);
    if (hdr->stage_count < 1 || hdr->stage_count > CSD_SHARD_MAX_STAGES ||
        hdr->stage_index >= hdr->stage_count || hdr->layer_begin < 0 ||
        hdr->layer_begin >= hdr->layer_end || hdr->layer_end > hdr->n_layers ||
        hdr->n_layers > CSD_MAX_LAYERS || hdr->precision < 0 || hdr->precision >= CSD_DTYPE_COUNT)
        return csd_err_set(err, CSD_EINVAL, "%s: invalid stage header", path);
    uint64_t table_offset = align_up(CSD_SHARD_HEADER_BYTES + (uint64_t)config_len);
    uint64_t data_offset = align_up(table_offset + (uint64_t)n * CSD_SHARD_ENTRY_BYTES);
    uint64_t pos = data_offset;
    for (int i = 0; i < n; i++) {
        csd_shard_tensor *t = &tensors[i];
        size_t name_len = strlen(t->name);
        if (name_len == 0 || name_len >= CSD_SHARD_NAME_BYTES || t->dtype < 0 ||
            t->dtype >= CSD_DTYPE_COUNT || t->rows < 1 || t->cols < 1 || (!t->data && t->nbytes))
            return csd_err_set(err, CSD_EINVAL, "%s: tensor %d ('%.80s') cannot be written", path,
                               i, t->name);
        t->offset = pos;
        t->checksum = XXH64(t->data, t->nbytes, 0);
        pos = align_up(pos + t->nbytes);
    }
    /* The last tensor is not padded: the file ends with its last byte. */
    uint64_t file_bytes = n ? tensors[n - 1].offset + tensors[n - 1].nbytes : data_offset;
    uint8_t *head = csd_alloc((size_t)data_offset);
    if (!head)
        return csd_err_set(err, CSD_ENOMEM, "%s: header of %llu bytes", path,
                           (unsigned long long)data_offset);
    memcpy(head + H_MAGIC, CSD_SHARD_MAGIC, 8);
    put_u32(head + H_VERSION, CSD_SHARD_VERSION);
    put_u32(head + H_HEADER_BYTES, CSD_SHARD_HEADER_BYTES);
    put_u32(head + H_STAGE_INDEX, hdr->stage_index);
    put_u32(head + H_STAGE_COUNT, hdr->stage_count);
    put_u32(head + H_LAYER_BEGIN, (uint32_t)hdr->layer_begin);
    put_u32(head + H_LAYER_END, (uint32_t)hdr->layer_end);
    put_u32(head + H_N_LAYERS, (uint32_t)hdr->n_layers);
    put_u32(head + H_FLAGS, (hdr->has_embed ? CSD_SHARD_FLAG_EMBED : 0u) |
                                (hdr->has_head ? CSD_SHARD_FLAG_HEAD : 0u));
    put_u32(head + H_PRECISION, (uint32_t)hdr->precision);
    put_u32(head + H_KERNEL_LAYOUT, CSD_SHARD_KERNEL_LAYOUT);
    memcpy(head + H_MODEL_HASH, hdr->model_hash, CSD_SHARD_HASH_BYTES);
    put_u64(head + H_CONFIG_OFFSET, CSD_SHARD_HEADER_BYTES);
    put_u64(head + H_CONFIG_BYTES, config_len);
    put_u64(head + H_TABLE_OFFSET, table_offset);
    put_u32(head + H_TENSOR_COUNT, (uint32_t)n);
    put_u32(head + H_ENTRY_BYTES, CSD_SHARD_ENTRY_BYTES);
    put_u64(head + H_DATA_OFFSET, data_offset);
    put_u64(head + H_DATA_BYTES, file_bytes - data_offset);
    put_u64(head + H_FILE_BYTES, file_bytes);
    memcpy(head + CSD_SHARD_HEADER_BYTES, config_json, config_len);
    for (int i = 0; i < n; i++) {
        uint8_t *e = head + table_offset + (uint64_t)i * CSD_SHARD_ENTRY_BYTES;
        const csd_shard_tensor *t = &tensors[i];
        memcpy(e + E_NAME, t->name, strlen(t->name));
        put_u32(e + E_DTYPE, (uint32_t)t->dtype);
        put_u64(e + E_ROWS, (uint64_t)t->rows);
        put_u64(e + E_COLS, (uint64_t)t->cols);
        put_u64(e + E_OFFSET, t->offset);
        put_u64(e + E_NBYTES, t->nbytes);
        put_u64(e + E_CHECKSUM, t->checksum);
    }
    uint64_t sum = header_checksum(head, (size_t)data_offset);
    put_u64(head + H_CHECKSUM, sum);

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        csd_free(head);
        return csd_err_set(err, CSD_ERANGE, "%s: path too long", path);
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int e = errno;
        csd_free(head);
        return csd_err_set(err, CSD_EIO, "%s: cannot create: %s", tmp, strerror(e));
    }
    static const uint8_t zeros[CSD_SHARD_ALIGN] = {0};
    int bad = write_all(f, head, (size_t)data_offset);
    uint64_t done = 0, total = file_bytes - data_offset;
    for (int i = 0; i < n && !bad; i++) {
        const csd_shard_tensor *t = &tensors[i];
        bad = write_all(f, t->data, t->nbytes);
        if (!bad && i + 1 < n)
            bad = write_all(f, zeros, (size_t)(tensors[i + 1].offset - t->offset - t->nbytes));
        done = i + 1 < n ? tensors[i + 1].offset - data_offset : total;
        if (progress) progress(progress_ctx, done, total);
    }
    int e = errno;
    if (!bad && (fflush(f) != 0 || fsync(fileno(f)) != 0)) {
        bad = 1;
        e = errno;
    }
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    csd_free(head);
    if (bad) {
        unlink(tmp);
        return csd_err_set(err, CSD_EIO, "%s: write failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return csd_err_set(err, CSD_EIO, "%s: cannot rename: %s", path, strerror(e));
    }
    hdr->version = CSD_SHARD_VERSION;
    hdr->kernel_layout = CSD_SHARD_KERNEL_LAYOUT;
    hdr->header_checksum = sum;
    hdr->file_bytes = file_bytes;
    return 0;
}

static int pread_full(int fd, uint8_t *p, size_t n, uint64_t off) {
    while (n) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got <= 0) {
            if (got < 0 && errno == EINTR) continue;
            return -1;
        }
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

int csd_shard_set_model_hash(const char *path, const uint8_t hash[CSD_SHARD_HASH_BYTES],
                             uint64_t *header_checksum_out, csd_err *err) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return csd_err_set(err, CSD_EIO, "%s: cannot open: %s", path, strerror(errno));
    uint8_t fixed[CSD_SHARD_HEADER_BYTES];
    uint8_t *head = NULL;
    int rc = 0;
    if (pread_full(fd, fixed, sizeof fixed, 0) != 0 || memcmp(fixed, CSD_SHARD_MAGIC, 8) != 0) {
        rc = csd_err_set(err, CSD_EFORMAT, "%s: not a cascadia shard", path);
        goto done;
    }
    uint64_t data_offset = get_u64(fixed + H_DATA_OFFSET);
    uint64_t max_head = CSD_SHARD_HEADER_BYTES + CSD_SHARD_MAX_CONFIG_BYTES + 2 * CSD_SHARD_ALIGN +
                        (uint64_t)CSD_SHARD_MAX_TENSORS * CSD_SHARD_ENTRY_BYTES;
    if (data_offset < CSD_SHARD_HEADER_BYTES || data_offset > max_head) {
        rc = csd_err_set(err, CSD_EFORMAT, "%s: data offset %llu out of range", path,
                         (unsigned long long)data_offset);
        goto done;
    }
    head = csd_alloc((size_t)data_offset);
    if (!head) {
        rc = csd_err_set(err, CSD_ENOMEM, "%s: header", path);
        goto done;
    }
    if (pread_full(fd, head, (size_t)data_offset, 0) != 0) {
        rc = csd_err_set(err, CSD_EIO, "%s: cannot read the header", path);
        goto done;
    }
    if (header_checksum(head, (size_t)data_offset) != get_u64(head + H_CHECKSUM)) {
        /* Never launder a damaged header into one with a valid checksum. */
        rc = csd_err_set(err, CSD_EFORMAT, "%s: header checksum mismatch, not patching it", path);
        goto done;
    }
    memcpy(head + H_MODEL_HASH, hash, CSD_SHARD_HASH_BYTES);
    uint64_t sum = header_checksum(head, (size_t)data_offset);
    put_u64(head + H_CHECKSUM, sum);
    if (pwrite(fd, head, CSD_SHARD_HEADER_BYTES, 0) != CSD_SHARD_HEADER_BYTES || fsync(fd) != 0) {
        rc = csd_err_set(err, CSD_EIO, "%s: cannot rewrite the header: %s", path, strerror(errno));
        goto done;
    }
    if (header_checksum_out) *header_checksum_out = sum;
done:
    csd_free(head);
    close(fd);
    return rc;
}

/* ---- model hash ---- */

static void hash_u32(crypto_generichash_state *st, uint32_t v) {
    uint8_t b[4];
    put_u32(b, v);
    crypto_generichash_update(st, b, sizeof b);
}

static void hash_u64(crypto_generichash_state *st, uint64_t v) {
    uint8_t b[8];
    put_u64(b, v);
    crypto_generichash_update(st, b, sizeof b);
}

void csd_shard_model_hash(uint8_t out[CSD_SHARD_HASH_BYTES], const char *config_json,
                          size_t config_len, int precision, const csd_shard_table *stages,
                          int n_stages) {
    static const char tag[] = "cascadia-model-hash-v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, CSD_SHARD_HASH_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)tag, sizeof tag); /* with its NUL */
    hash_u64(&st, config_len);
    crypto_generichash_update(&st, (const unsigned char *)config_json, config_len);
    hash_u32(&st, (uint32_t)precision);
    hash_u32(&st, CSD_SHARD_KERNEL_LAYOUT);
    hash_u32(&st, (uint32_t)n_stages);
    for (int s = 0; s < n_stages; s++) {
        const csd_shard_table *t = &stages[s];
        hash_u64(&st, (uint64_t)t->layer_begin);
        hash_u64(&st, (uint64_t)t->layer_end);
        hash_u32(&st, (uint32_t)t->n_tensors);
        for (int i = 0; i < t->n_tensors; i++) {
            const csd_shard_tensor *x = &t->tensors[i];
            size_t len = strlen(x->name);
            hash_u32(&st, (uint32_t)len);
            crypto_generichash_update(&st, (const unsigned char *)x->name, len);
            hash_u32(&st, (uint32_t)x->dtype);
            hash_u64(&st, (uint64_t)x->rows);
            hash_u64(&st, (uint64_t)x->cols);
            hash_u64(&st, x->nbytes);
            hash_u64(&st, x->checksum);
        }
    }
    crypto_generichash_final(&st, out, CSD_SHARD_HASH_BYTES);
}

void csd_shard_hash_hex(const uint8_t hash[CSD_SHARD_HASH_BYTES], char *out) {
    sodium_bin2hex(out, 2 * CSD_SHARD_HASH_BYTES + 1, hash, CSD_SHARD_HASH_BYTES);
}

bool csd_shard_hash_parse(const char *hex, uint8_t out[CSD_SHARD_HASH_BYTES]) {
    size_t got = 0;
    return hex && strlen(hex) == 2 * CSD_SHARD_HASH_BYTES &&
           sodium_hex2bin(out, CSD_SHARD_HASH_BYTES, hex, strlen(hex), NULL, &got, NULL) == 0 &&
           got == CSD_SHARD_HASH_BYTES;
}
