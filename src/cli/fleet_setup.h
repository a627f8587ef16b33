/* fleet_setup: what `run --fleet` and `serve --fleet` share: the flags that describe a fleet, and
 * building a fleet pipeline from them (manifest, fleet key, optional local stage 0). */
#ifndef CSD_FLEET_SETUP_H
#define CSD_FLEET_SETUP_H

#include <stdatomic.h>
#include <stdbool.h>

#include "coord/fleet_pipeline.h"
#include "model/model.h"
#include "model/shard_model.h"
#include "net/fleet_key.h"

#define CSD_CLI_FLEET_MAX_WAIT_S 86400 /* --wait-workers' limit: a day */

typedef struct csd_cli_fleet {
    const char *fleet;          /* "host:port,host:port" in stage order */
    const char *manifest;       /* export directory (manifest.json, shards, tokenizer files) */
    int local_stage;            /* 0: this process runs stage 0; -1: every stage is remote */
    const char *key_path;
    bool insecure;
    int hidden_dtype;           /* CSD_DTYPE_F16 unless --hidden-dtype */
    int micro_batches;          /* --micro-batches; 0: auto (one per machine) */
    int wait_workers_s;         /* --wait-workers; -1 until given: the command sets its default */
    const char *fleet_only;     /* the last flag given that only a fleet uses, or NULL */
    const atomic_int *stop; /* set (by a signal handler) to give up waiting; or NULL */
    /* what was built */
    csd_fleet_key key;
    csd_model_shard *shard0;    /* local stage 0's shard */
    csd_model *model0;
} csd_cli_fleet;

#define CSD_CLI_FLEET_FLAGS_HELP                                                              \
    "  --fleet H:P,H:P     workers in stage order (one per stage; with --local-stage 0,\n"    \
    "                      stages 1..)\n"                                                     \
    "  --manifest DIR      the export directory (`cascadia export --out DIR`)\n"              \
    "  --local-stage 0     run stage 0 in this process (it must be on this machine:\n"        \
    "                      DIR/stage-0.shard)\n"                                              \
    "  --key FILE          the fleet key (`cascadia keygen`), or --insecure\n"                \
    "  --hidden-dtype T    f16 (default), bf16 or f32 hidden states between stages\n"         \
    "  --micro-batches N   steps kept in flight through the stages (default auto: one per\n"  \
    "                      machine, from the addresses; stages sharing a machine share its\n" \
    "                      cores)\n"                                                     \
    "  --wait-workers S    retry for up to S seconds while a worker cannot be reached or\n"  \
    "                      serves another coordinator (0: fail at once; serve's default\n"   \
    "                      is 60, run's and bench's 0); a wrong key, model or layer\n"      \
    "                      range fails at once\n"

void csd_cli_fleet_init(csd_cli_fleet *f);
/* 1: consumed (with its value when it takes one), 0: not a fleet flag, -1: bad value. *takes_value
 * says whether the flag consumed the next argument. */
int csd_cli_fleet_flag(const char *cmd, const char *flag, const char *value, csd_cli_fleet *f,
                       bool *takes_value);
/* Checks the combination (fleet and manifest both given, key or insecure; no fleet flag without
 * a fleet). */
bool csd_cli_fleet_check(const char *cmd, const csd_cli_fleet *f);
/* Loads the manifest, the key and (local stage) stage 0, connects the chain (waiting for the
 * workers as --wait-workers says). The manifest directory also holds the tokenizer. */
int csd_cli_fleet_open(csd_cli_fleet *f, const csd_model_opts *mopts, int max_requests,
                       csd_pipeline **out, csd_err *err);
void csd_cli_fleet_close(csd_cli_fleet *f);

/* Whether a failed connection is worth retrying: the worker may not be listening yet, its
 * machine may be booting, or it may still serve a coordinator that has gone (CSD_EIO,
 * CSD_ETIMEOUT, CSD_ECLOSED, CSD_EFULL). A wrong key, model or layer range is not. */
bool csd_cli_fleet_retryable(int code);

#endif
