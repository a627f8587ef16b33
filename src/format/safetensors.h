/* safetensors: reader (mmap, single file or sharded via model.safetensors.index.json) and writer.
 * Pure validation at the edge: header size bounded, JSON well-formed, every tensor's dtype known,
 * shape product matching its byte length, offsets inside the data section and non-overlapping.
 * Tensor data pointers are borrowed from the mapping and live until csd_st_close. */
#ifndef CSD_SAFETENSORS_H
#define CSD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define CSD_ST_MAX_DIMS 4
/* Refuse headers larger than this: real ones are well under 10 MB even for 70B models. */
#define CSD_ST_MAX_HEADER_BYTES (100u * 1024u * 1024u)
#define CSD_ST_MAX_NAME 256

typedef struct csd_st_tensor {
    const char *name;                /* owned by the set */
    int dtype;                       /* CSD_DTYPE_F32, _F16 or _BF16 */
    int n_dims;                      /* 0..CSD_ST_MAX_DIMS */
    int64_t shape[CSD_ST_MAX_DIMS];  /* as in the file (row-major, outermost first) */
    const void *data;                /* borrowed from the mapping; may be unaligned */
    size_t nbytes;
} csd_st_tensor;

typedef struct csd_st_set csd_st_set;

/* Opens MODEL_DIR/model.safetensors, or every file listed by
 * MODEL_DIR/model.safetensors.index.json. */
int csd_st_open_dir(csd_st_set **out, const char *model_dir, csd_err *err);
/* The weights file csd_st_open_dir would open in model_dir: *name = "model.safetensors.index.json"
 * or "model.safetensors" when there, else NULL. Nonzero only when the path is too long. */
int csd_st_dir_weights(const char *model_dir, const char **name, csd_err *err);
/* Opens one .safetensors file. */
int csd_st_open_file(csd_st_set **out, const char *path, csd_err *err);
void csd_st_close(csd_st_set *set);

/* NULL when absent. */
const csd_st_tensor *csd_st_find(const csd_st_set *set, const char *name);
int csd_st_count(const csd_st_set *set);
const csd_st_tensor *csd_st_at(const csd_st_set *set, int index);

/* Parses and validates a whole in-memory file (8-byte length, JSON header, data). Fills a set that
 * borrows buf (buf must outlive the set). Used by csd_st_open_file and by the fuzz target. */
int csd_st_parse(csd_st_set **out, const uint8_t *buf, size_t len, const char *label, csd_err *err);

/* Writing. A descriptor per tensor; fill() is called once per tensor, in order, to produce its
 * bytes (dst has nbytes = product(shape) * dtype size), so huge models stream one tensor at a
 * time. */
typedef struct csd_st_desc {
    const char *name;
    int dtype;
    int n_dims;
    int64_t shape[CSD_ST_MAX_DIMS];
} csd_st_desc;

typedef int (*csd_st_fill_fn)(void *ctx, int index, void *dst, size_t nbytes, csd_err *err);

int csd_st_write(const char *path, const csd_st_desc *descs, int n, csd_st_fill_fn fill, void *ctx,
                 csd_err *err);

#endif
