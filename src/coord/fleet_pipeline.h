/* fleet_pipeline: the pipeline interface over a chain of remote stages (docs/protocol.md).
 * The coordinator sends OPEN/FORWARD/TRUNCATE/CLOSE to the first stage; they flow stage to stage
 * in order, hidden states included, and the last stage answers with logits or sampled ids. With a
 * local first stage (--local-stage 0) the coordinator computes stage 0 itself and sends hidden
 * states to the first remote stage. Up to one step per stage is kept in flight (by default one per
 * machine the stages run on), so every stage computes while the others do. A dead worker fails the
 * requests in flight with a clear error; the pipeline reconnects in the background and serves again
 * once the worker is back. */
#ifndef CSD_FLEET_PIPELINE_H
#define CSD_FLEET_PIPELINE_H

#include <stdint.h>

#include "core/err.h"
#include "format/model_config.h"
#include "net/conn.h"
#include "pipeline.h"

#define CSD_FLEET_MAX_STAGES 64

typedef struct csd_fleet_opts {
    /* "host:port" per remote stage, in order */
    char addrs[CSD_FLEET_MAX_STAGES][CSD_WIRE_MAX_ROUTE + 1];
    int n_addrs;
    uint32_t first_remote_stage;             /* index of addrs[0] among the stages */
    uint32_t layer_ranges[CSD_FLEET_MAX_STAGES][2]; /* expected [begin, end) of each remote stage */
    uint8_t model_hash[CSD_WIRE_HASH_SIZE];
    csd_model_config cfg;
    csd_link_cfg link;
    int hidden_dtype;                        /* CSD_DTYPE_F16 (default), F32 or BF16 */
    int64_t max_ctx;
    int64_t max_step_tokens;                 /* the workers' batch limit */
    int micro_batches;                       /* steps in flight; 0: one a machine (fleet_hosts.h) */
    int step_silence_ms;                     /* a stage silent this long while a step waits fails
                                              * it (it is PINGed meanwhile); 0: 120 s */
} csd_fleet_opts;

typedef struct csd_model csd_model;

/* local_stage0: the coordinator's own stage 0 (NULL when every stage is remote); borrowed. */
int csd_fleet_pipeline_create(csd_pipeline **out, const csd_fleet_opts *opts,
                              csd_model *local_stage0, int max_requests, csd_err *err);

/* Per-token breakdown for `cascadia bench --fleet`, accumulated since creation. */
typedef struct csd_fleet_timing {
    uint64_t steps;
    double local_compute_s;   /* stage 0 in this process */
    double wait_s;            /* begin to result: remote compute + network */
    double remote_compute_s;  /* from the workers' STATS */
    double rtt_s;             /* PING round trips measured at creation, mean */
} csd_fleet_timing;

void csd_fleet_pipeline_timing(csd_pipeline *p, csd_fleet_timing *out);

#endif
