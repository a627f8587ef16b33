/* pipeline: what the generation loop drives: something that keeps a KV cache per request and turns
 * token ids into next-token logits. One implementation runs the whole model in this process
 * (local_pipeline.c); the fleet one chains remote stages over the wire. The loop above cannot
 * tell them apart, which is how N-stage output is proven equal to 1-stage output. */
#ifndef CSD_PIPELINE_H
#define CSD_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"
#include "format/model_config.h"

typedef struct csd_pipeline csd_pipeline;

/* One request's part of a batched step: n tokens appended to request req. */
typedef struct csd_step_entry {
    uint32_t req;
    const int32_t *ids;  /* borrowed until the step ends */
    int64_t n;
    bool want_logits;    /* next-token logits after the last of these tokens */
    bool argmax_only;    /* the caller only takes the argmax (greedy, no penalties): a fleet may
                          * return the token id instead of the logits, and a one-hot row stands
                          * in */
    bool all_logits;     /* with want_logits: the logits after every one of the n tokens (n
                          * rows, in order), to check a speculative draft */
} csd_step_entry;

/* Most entries one step may carry. */
#define CSD_STEP_MAX_ENTRIES 256
/* Most tokens of an entry with all_logits. */
#define CSD_STEP_MAX_ALL_ROWS 32

typedef struct csd_pipeline_ops {
    /* Creates request req's state (KV caches in every stage) for up to max_ctx positions. */
    int (*open)(csd_pipeline *p, uint32_t req, int64_t max_ctx, csd_err *err);
    /* Feeds n tokens of req; writes the next-token logits after the last one (vocab floats). */
    int (*forward)(csd_pipeline *p, uint32_t req, const int32_t *ids, int64_t n, float *logits,
                   csd_err *err);
    /* Starts a batched step over several requests (one forward per stage for all of them).
     * Logits of the entries with want_logits are written to logits, packed in entry order (one
     * row each, n rows for an entry with all_logits), by the time the matching step_end returns;
     * entries and logits must stay valid until then.
     * Up to max_in_flight steps may be begun before the oldest is ended: while stage 1 computes
     * step A, stage 0 computes step B. Steps end in the order they began. */
    int (*step_begin)(csd_pipeline *p, const csd_step_entry *entries, int n_entries, float *logits,
                      csd_err *err);
    /* Waits for the oldest step. A non-zero return failed the whole step (a link broke). With
     * entry_err (n_entries of them), an entry that failed alone (a stage refused that request)
     * gets its code and message there (code 0: it went through), and the step returns 0: the
     * others' logits are good. Without entry_err such a failure is the step's return value, with
     * the first such entry's message. */
    int (*step_end)(csd_pipeline *p, csd_err *entry_err, csd_err *err);
    /* Forgets positions >= pos of req. */
    int (*truncate)(csd_pipeline *p, uint32_t req, int64_t pos, csd_err *err);
    /* dst (open, empty) takes the first n positions of src's KV in every stage (prefix cache). */
    int (*copy_prefix)(csd_pipeline *p, uint32_t src, uint32_t dst, int64_t n, csd_err *err);
    /* Frees req's state everywhere. */
    void (*close)(csd_pipeline *p, uint32_t req);
    void (*destroy)(csd_pipeline *p);
    /* True when the pipeline can take requests (every stage connected); NULL: always. */
    bool (*ready)(csd_pipeline *p);
    /* Counts the pipeline's connections. When it changes, state the stages held for requests (KV
     * caches) may be gone: a worker restarted. NULL: never changes (in-process). */
    uint64_t (*epoch)(csd_pipeline *p);
    /* The engine stops: steps still in flight end now, with an error, rather than wait for a stage
     * that stopped answering. Called from another thread than the steps'. NULL: steps always end
     * (in-process). */
    void (*abort)(csd_pipeline *p);
} csd_pipeline_ops;

struct csd_pipeline {
    const csd_pipeline_ops *ops;
    csd_model_config cfg; /* the model being served */
    int64_t max_ctx;      /* longest request it accepts */
    /* steps that may overlap: 1 in-process; a fleet: --micro-batches (fleet_hosts.h) */
    int max_in_flight;
    int64_t max_step_tokens; /* tokens one step may carry in all */
};

/* In-process pipeline over a model directory (every layer here). */
typedef struct csd_model csd_model;
int csd_local_pipeline_create(csd_pipeline **out, csd_model *model, int max_requests, csd_err *err);

#endif
