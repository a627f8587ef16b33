/* shard_model: a pipeline stage's weights to and from a shard file (format/shard.h). The reader
 * checks that the shard holds exactly the tensors its layer range needs, with the shapes the
 * embedded config implies and the byte sizes the kernels expect, and points csd_weights into the
 * mapping: csd_model_create(&m, &s->cfg, &s->weights, &opts, err) then runs the stage with no copy.
 * The writer stores a loaded model's weights (csd_model_load_hf for a layer range). */
#ifndef CSD_SHARD_MODEL_H
#define CSD_SHARD_MODEL_H

#include <stdint.h>

#include "core/err.h"
#include "format/shard.h"
#include "model.h"

/* Tensor name of the output head in a shard, also when the model ties it to the embeddings (the
 * last stage holds its own copy; a single-stage shard stores the tied matrix once, as the
 * embeddings). */
#define CSD_SHARD_TN_HEAD CSD_TN_LM_HEAD

typedef struct csd_model_shard {
    csd_shard *file;      /* owned: the file (checked, mapped) */
    void *mem;            /* open: the tensors copied to anonymous memory; the weights point here */
    size_t mem_bytes;
    csd_model_config cfg; /* from the shard's embedded config */
    csd_weights weights;  /* tensor pointers borrow mem (open) or file (bind); layers owned */
} csd_model_shard;

/* Maps path, verifies every checksum and builds cfg + weights. The weights are then copied into
 * anonymous memory (transparent huge pages where the kernel allows): decode streams every weight
 * once per token, and a file-backed mapping measured ~9% slower to stream. Errors name the file
 * (and tensor).
 * Close with csd_model_shard_close after every model created over it is destroyed. */
int csd_model_shard_open(csd_model_shard **out, const char *path, csd_err *err);
/* Builds weights over an already parsed shard (owned by the caller, which must outlive them). */
int csd_model_shard_bind(csd_model_shard **out, csd_shard *file, csd_err *err);
/* Frees the layer table and closes the file (bind: the file too). NULL is a no-op. */
void csd_model_shard_close(csd_model_shard *s);

/* What a written shard contains: the header as written and every tensor's entry (name, dtype,
 * shape, offset, nbytes, checksum; data is NULL), for the manifest and the model hash. */
typedef struct csd_model_shard_info {
    csd_shard_header hdr;
    int n_tensors;
    csd_shard_tensor *tensors; /* owned: csd_model_shard_info_fini */
} csd_model_shard_info;

/* Writes model's stage (its layer range, embeddings and head as it holds them) to path as stage
 * stage_index of stage_count, with a zero model hash (csd_shard_set_model_hash patches it once all
 * stages exist). info may be NULL. */
int csd_model_shard_write(const csd_model *model, const char *path, uint32_t stage_index,
                          uint32_t stage_count, csd_shard_progress_fn progress, void *progress_ctx,
                          csd_model_shard_info *info, csd_err *err);
void csd_model_shard_info_fini(csd_model_shard_info *info);

#endif
