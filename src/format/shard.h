/* shard: the file one pipeline stage's worker maps (docs/shard-format.md is the spec). A fixed
 * little-endian header (magic, versions, stage and layer range, precision, model hash), the model
 * config as JSON, a table of fixed-size tensor entries and 64-byte-aligned tensor data, each tensor
 * with an xxh64 checksum. The reader validates every offset and size against the file length before
 * touching data; tensor pointers borrow the mapping. No model knowledge here: which tensors a stage
 * needs, and their shapes, are checked by src/model/shard_model.c. */
#ifndef CSD_SHARD_H
#define CSD_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "model_config.h"

#define CSD_SHARD_MAGIC "CSDSHARD" /* 8 bytes, no NUL on disk */
/* Version of the container layout (header, table); bump on any change and note it in the spec. */
#define CSD_SHARD_VERSION 1
/* Version of the quantized byte layout of the tensors (kern/quant.h). Bump whenever the Q4/Q8 row
 * layout, group size or scale encoding changes: an old shard would be read as garbage otherwise.
 * src/model/shard_model.c pins the layout constants it was written for with static_asserts. */
#define CSD_SHARD_KERNEL_LAYOUT 3
#define CSD_SHARD_HEADER_BYTES 192 /* fixed part of the header */
#define CSD_SHARD_ENTRY_BYTES 128  /* one tensor table entry */
#define CSD_SHARD_NAME_BYTES 80    /* name field of an entry, NUL-padded (<= 79 characters) */
#define CSD_SHARD_ALIGN 64         /* config, table and every tensor start on this boundary */
#define CSD_SHARD_HASH_BYTES 32    /* BLAKE2b-256 model hash */
/* Limits that keep a hostile file from driving work or allocations. */
#define CSD_SHARD_MAX_TENSORS 20000
#define CSD_SHARD_MAX_CONFIG_BYTES (1u << 20)
#define CSD_SHARD_MAX_STAGES 1024

/* Header flag bits; any other bit set is refused. */
#define CSD_SHARD_FLAG_EMBED 1u /* the stage holds the token embeddings (stage 0) */
#define CSD_SHARD_FLAG_HEAD 2u  /* the stage holds the final norm and output head (last stage) */

/* Parse options. */
#define CSD_SHARD_VERIFY_HEADER 1u  /* check the header checksum (config + table) */
#define CSD_SHARD_VERIFY_TENSORS 2u /* check every tensor's xxh64 (reads all data) */
#define CSD_SHARD_VERIFY_ALL (CSD_SHARD_VERIFY_HEADER | CSD_SHARD_VERIFY_TENSORS)

/* The header fields, decoded. */
typedef struct csd_shard_header {
    uint32_t version;     /* CSD_SHARD_VERSION */
    uint32_t stage_index; /* 0-based */
    uint32_t stage_count;
    int64_t layer_begin; /* [layer_begin, layer_end) of the model's layers */
    int64_t layer_end;
    int64_t n_layers; /* the whole model's layer count (matches the config) */
    bool has_embed;
    bool has_head;
    int precision;                            /* CSD_DTYPE_* of the layer matrices */
    uint32_t kernel_layout;                   /* CSD_SHARD_KERNEL_LAYOUT at write time */
    uint8_t model_hash[CSD_SHARD_HASH_BYTES]; /* identifies the export (see manifest.h) */
    uint64_t header_checksum; /* xxh64 of bytes [0, data_offset) with this field zeroed */
    uint64_t file_bytes;      /* exact length of the file */
} csd_shard_header;

/* One tensor. Plain dtypes are row-major; Q4/Q8 follow kern/quant.h. Vectors have rows = 1. */
typedef struct csd_shard_tensor {
    char name[CSD_SHARD_NAME_BYTES]; /* NUL-terminated */
    int dtype;                       /* CSD_DTYPE_* */
    int64_t rows, cols;
    uint64_t offset; /* from the start of the file, multiple of CSD_SHARD_ALIGN */
    size_t nbytes;
    uint64_t checksum; /* xxh64 (seed 0) of the nbytes at offset */
    const void *data;  /* borrowed: the mapping (reader) or the caller's buffer (writer) */
} csd_shard_tensor;

/* A stage's tensors as the model hash sees them. */
typedef struct csd_shard_table {
    int64_t layer_begin, layer_end;
    int n_tensors;
    const csd_shard_tensor *tensors;
} csd_shard_table;

typedef struct csd_shard csd_shard;

/* ---- reading ---- */

/* Maps path and parses it with CSD_SHARD_VERIFY_ALL; every error message names the file (and the
 * tensor, for a checksum mismatch). Close with csd_shard_close. */
int csd_shard_open(csd_shard **out, const char *path, csd_err *err);
/* Maps path and checks only the header, config and table (no tensor data read): cheap. */
int csd_shard_open_header(csd_shard **out, const char *path, csd_err *err);
/* Parses an in-memory shard of len bytes; buf must outlive the shard. label names it in errors.
 * flags: CSD_SHARD_VERIFY_*. Used by csd_shard_open and by the fuzz target. */
int csd_shard_parse(csd_shard **out, const uint8_t *buf, size_t len, const char *label,
                    unsigned flags, csd_err *err);
void csd_shard_close(csd_shard *shard);

const csd_shard_header *csd_shard_hdr(const csd_shard *shard);
/* The label (path) the shard was opened with; owned by the shard. */
const char *csd_shard_label(const csd_shard *shard);
const csd_model_config *csd_shard_config(const csd_shard *shard);
/* The embedded config JSON (not NUL-terminated; len bytes), borrowed from the mapping. */
const char *csd_shard_config_json(const csd_shard *shard, size_t *len);
int csd_shard_count(const csd_shard *shard);
const csd_shard_tensor *csd_shard_at(const csd_shard *shard, int index);
const csd_shard_tensor *csd_shard_find(const csd_shard *shard, const char *name); /* NULL: absent */
csd_shard_table csd_shard_get_table(const csd_shard *shard);

/* ---- writing ---- */

/* Progress: bytes of tensor data written so far out of total. */
typedef void (*csd_shard_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Writes hdr (version, kernel_layout, header_checksum and file_bytes are filled in), the config
 * JSON and tensors[0..n) (name, dtype, rows, cols, data, nbytes given; offset and checksum are
 * computed and stored back into tensors[]) to path (via path.tmp + rename). hdr->header_checksum
 * and hdr->file_bytes are set on return. */
int csd_shard_write(const char *path, csd_shard_header *hdr, const char *config_json,
                    size_t config_len, csd_shard_tensor *tensors, int n,
                    csd_shard_progress_fn progress, void *progress_ctx, csd_err *err);
/* Rewrites the model hash of an existing shard in place (and its header checksum, returned in
 * *header_checksum). Export writes every stage first, then the hash of all of them. */
int csd_shard_set_model_hash(const char *path, const uint8_t hash[CSD_SHARD_HASH_BYTES],
                             uint64_t *header_checksum, csd_err *err);

/* ---- model hash ---- */

/* BLAKE2b-256 over a domain tag, the config JSON, the precision, the kernel layout and, for every
 * stage in order, its layer range and each tensor's name, dtype, shape, size and checksum. The wire
 * handshake compares it: two processes agree on it only when they serve the same export. */
void csd_shard_model_hash(uint8_t out[CSD_SHARD_HASH_BYTES], const char *config_json,
                          size_t config_len, int precision, const csd_shard_table *stages,
                          int n_stages);
/* Lower-case hex of a hash into out (2 * CSD_SHARD_HASH_BYTES + 1 bytes). */
void csd_shard_hash_hex(const uint8_t hash[CSD_SHARD_HASH_BYTES], char *out);
/* Parses 64 hex digits; returns false when malformed. */
bool csd_shard_hash_parse(const char *hex, uint8_t out[CSD_SHARD_HASH_BYTES]);

#endif
