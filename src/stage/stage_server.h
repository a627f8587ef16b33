/* stage_server: a worker serving one pipeline stage over the wire (docs/protocol.md).
 * Frames from upstream (the coordinator, or the previous stage) go through one ordered queue to a
 * compute thread, so OPEN, FORWARD, TRUNCATE and CLOSE of a request are applied in the order they
 * were sent, and reading the next frame overlaps computing the current one. Consecutive FORWARD
 * frames marked BATCH_MORE run as one batched forward (one read of the weights for all of them).
 * Hidden states go on to the next stage (set by the coordinator's ROUTE), the last stage answers
 * the coordinator with logits or sampled ids. Each request has its own KV cache; idle requests are
 * evicted least-recently-used when a new one would exceed the memory cap. */
#ifndef CSD_STAGE_SERVER_H
#define CSD_STAGE_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"
#include "model/model.h"
#include "net/conn.h"

typedef struct csd_stage_opts {
    const char *listen;            /* "host:port" */
    csd_link_cfg link;             /* fleet key or insecure */
    uint32_t stage_index;
    uint8_t model_hash[CSD_WIRE_HASH_SIZE];
    int max_requests;              /* open requests at most; default 64 */
    uint64_t kv_mem_cap;           /* bytes of KV cache in all; 0: 4 GiB */
    int coord_idle_ms;             /* a coordinator heard from within this is not replaced by
                                    * another; 0: CSD_STAGE_COORD_IDLE_MS */
} csd_stage_opts;

/* A coordinator PINGs its stages at least every CSD_WIRE_KEEPALIVE_MS while connected
 * (fleet_pipeline.c), so one silent for three of those has gone. */
#define CSD_STAGE_COORD_IDLE_MS (3 * CSD_WIRE_KEEPALIVE_MS)

typedef struct csd_stage_server csd_stage_server;

/* Borrows model (the caller destroys it after the server). Binds the listener. */
int csd_stage_server_create(csd_stage_server **out, csd_model *model, const csd_stage_opts *opts,
                            csd_err *err);
/* The port actually bound (for "host:0"). */
uint16_t csd_stage_server_port(const csd_stage_server *s);
/* Serves until csd_stage_server_stop; returns 0 on a clean stop. */
int csd_stage_server_run(csd_stage_server *s, csd_err *err);
/* Async-signal-safe: asks run() to return. */
void csd_stage_server_stop(csd_stage_server *s);
void csd_stage_server_destroy(csd_stage_server *s);

#endif
