/* manifest: DIR/manifest.json, the table of contents of an exported model: the config, the
 * precision, the model hash, the tokenizer files copied next to it and one row per stage shard
 * (file, layer range, size, header checksum, memory estimate). Loading checks the JSON's structure
 * (types, bounds, contiguous layer ranges, safe file names); validation then checks the files on
 * disk against it and recomputes the model hash from the shards. Spec: docs/shard-format.md. */
#ifndef CSD_MANIFEST_H
#define CSD_MANIFEST_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"
#include "model_config.h"
#include "shard.h"

#define CSD_MANIFEST_FILE "manifest.json"
#define CSD_MANIFEST_VERSION 1
#define CSD_MANIFEST_MAX_BYTES (16u << 20) /* far above any real manifest */
#define CSD_MANIFEST_NAME_BYTES 64         /* file names in the directory, NUL included */
#define CSD_MANIFEST_MAX_FILES 8           /* tokenizer/config files copied next to the shards */

typedef struct csd_manifest_stage {
    int index;
    char file[CSD_MANIFEST_NAME_BYTES]; /* a plain file name inside the manifest's directory */
    int64_t layer_begin, layer_end;
    bool has_embed, has_head;
    uint64_t bytes;              /* exact file size */
    uint64_t checksum;           /* the shard's header checksum (covers its tensor checksums) */
    uint64_t weight_bytes;       /* tensor bytes the stage maps */
    uint64_t kv_bytes_per_token; /* KV cache per token of context over its layers */
    uint64_t memory_bytes;       /* estimate: weights + KV for ctx x slots + overhead */
    uint64_t machine_bytes;      /* memory of the machine planned for it (--memory), 0 if none */
} csd_manifest_stage;

/* Open: export fills one and writes it; csd_manifest_load returns one on the heap. */
typedef struct csd_manifest {
    char *dir; /* owned (load): the directory holding manifest.json */
    csd_model_config cfg;
    int precision;      /* CSD_DTYPE_* of the layer matrices */
    int kv_dtype;       /* CSD_DTYPE_F32 or _F16: the memory estimate's KV type */
    int64_t ctx, slots; /* the serving budget the memory estimate assumed */
    uint8_t model_hash[CSD_SHARD_HASH_BYTES];
    int n_files;
    char files[CSD_MANIFEST_MAX_FILES][CSD_MANIFEST_NAME_BYTES]; /* tokenizer.json, ... */
    int n_stages;
    csd_manifest_stage *stages; /* owned (load); the caller's (write) */
    /* load only: "exported_by", the build that wrote it ("cascadia-VERSION-COMMIT"), "" when the
     * manifest predates the field. The writer always records the running build. */
    char exported_by[CSD_MANIFEST_NAME_BYTES];
} csd_manifest;

/* path: a manifest.json or a directory containing one. Destroy with csd_manifest_destroy. */
int csd_manifest_load(csd_manifest **out, const char *path, csd_err *err);
/* Parses manifest text (len bytes); dir is where its files live. For tests and the fuzz target. */
int csd_manifest_parse(csd_manifest **out, const char *json, size_t len, const char *dir,
                       csd_err *err);
void csd_manifest_destroy(csd_manifest *m);

/* Checks the directory against the manifest: every file present, every shard's size, header
 * checksum, stage fields, config and model hash as listed, and the model hash recomputed from the
 * shards' tensor tables. deep: also verify every tensor checksum (reads all the data). */
int csd_manifest_validate(const csd_manifest *m, bool deep, csd_err *err);

/* Checks one opened shard against the manifest's stage i: its stage fields, header checksum, model
 * hash and embedded config as listed (what a process that loads a stage itself, not through a
 * worker's handshake, must know before trusting the shard's shapes). path names it in errors. */
int csd_manifest_check_stage(const csd_manifest *m, int i, const csd_shard *f, const char *path,
                             csd_err *err);

/* Writes dir/manifest.json atomically. */
int csd_manifest_write(const csd_manifest *m, const char *dir, csd_err *err);

#endif
