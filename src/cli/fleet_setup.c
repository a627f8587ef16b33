/* fleet_setup: fleet flags and fleet pipeline construction (see fleet_setup.h). */
#include "fleet_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_util.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "core/log.h"
#include "format/manifest.h"

void csd_cli_fleet_init(csd_cli_fleet *f) {
    memset(f, 0, sizeof *f);
    f->local_stage = -1;
    f->hidden_dtype = CSD_DTYPE_F16;
    f->wait_workers_s = -1;
}

int csd_cli_fleet_flag(const char *cmd, const char *flag, const char *value, csd_cli_fleet *f,
                       bool *takes_value) {
    *takes_value = true;
    if (!strcmp(flag, "--insecure")) {
        *takes_value = false;
        f->insecure = true;
        f->fleet_only = flag;
        return 1;
    }
    if (strcmp(flag, "--fleet") && strcmp(flag, "--manifest") && strcmp(flag, "--local-stage") &&
        strcmp(flag, "--key") && strcmp(flag, "--hidden-dtype") &&
        strcmp(flag, "--micro-batches") && strcmp(flag, "--wait-workers"))
        return 0;
    if (!value) {
        fprintf(stderr, "cascadia %s: %s needs a value\n", cmd, flag);
        return -1;
    }
    if (strcmp(flag, "--fleet") && strcmp(flag, "--manifest")) f->fleet_only = flag;
    if (!strcmp(flag, "--fleet")) f->fleet = value;
    else if (!strcmp(flag, "--manifest")) f->manifest = value;
    else if (!strcmp(flag, "--key")) f->key_path = value;
    else if (!strcmp(flag, "--micro-batches")) {
        char *end = NULL;
        long n = strcmp(value, "auto") ? strtol(value, &end, 10) : 0;
        if (end && (*end || n < 1 || n > CSD_FLEET_MAX_STAGES)) {
            fprintf(stderr, "cascadia %s: --micro-batches takes auto or 1 to %d\n", cmd,
                    CSD_FLEET_MAX_STAGES);
            return -1;
        }
        f->micro_batches = (int)n;
    } else if (!strcmp(flag, "--wait-workers")) {
        int64_t s = 0;
        if (!csd_cli_int(cmd, flag, value, 0, CSD_CLI_FLEET_MAX_WAIT_S, &s)) return -1;
        f->wait_workers_s = (int)s;
    } else if (!strcmp(flag, "--local-stage")) {
        if (strcmp(value, "0")) {
            fprintf(stderr,
                    "cascadia %s: --local-stage takes 0 (the coordinator runs the first stage)\n",
                    cmd);
            return -1;
        }
        f->local_stage = 0;
    } else {
        int d = csd_dtype_parse(value);
        if (d != CSD_DTYPE_F16 && d != CSD_DTYPE_F32 && d != CSD_DTYPE_BF16) {
            fprintf(stderr, "cascadia %s: --hidden-dtype must be f16, bf16 or f32\n", cmd);
            return -1;
        }
        f->hidden_dtype = d;
    }
    return 1;
}

bool csd_cli_fleet_check(const char *cmd, const csd_cli_fleet *f) {
    if (!f->fleet && !f->manifest && f->fleet_only) { /* it would be ignored: say so */
        fprintf(stderr, "cascadia %s: %s applies to a fleet only (--fleet and --manifest)\n", cmd,
                f->fleet_only);
        return false;
    }
    if (!f->fleet && !f->manifest) return true;
    if (!f->fleet || !f->manifest) {
        fprintf(stderr, "cascadia %s: --fleet and --manifest go together\n", cmd);
        return false;
    }
    if (!!f->key_path == f->insecure) {
        fprintf(stderr, "cascadia %s: a fleet needs --key FILE or --insecure (one of them)\n", cmd);
        return false;
    }
    return true;
}

/* Splits "a,b,c" into opts->addrs. */
static int split_fleet(const char *fleet, csd_fleet_opts *o, csd_err *err) {
    char list[4096];
    if (snprintf(list, sizeof list, "%s", fleet) >= (int)sizeof list)
        return csd_err_set(err, CSD_ERANGE, "--fleet is longer than %zu bytes", sizeof list - 1);
    o->n_addrs = 0;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (o->n_addrs == CSD_FLEET_MAX_STAGES)
            return csd_err_set(err, CSD_ERANGE, "--fleet lists more than %d workers",
                               CSD_FLEET_MAX_STAGES);
        if (strlen(tok) > CSD_WIRE_MAX_ROUTE)
            return csd_err_set(err, CSD_ERANGE, "--fleet address '%.40s...' is too long", tok);
        snprintf(o->addrs[o->n_addrs++], sizeof o->addrs[0], "%s", tok);
    }
    return o->n_addrs ? 0 : csd_err_set(err, CSD_EINVAL, "--fleet lists no worker");
}

bool csd_cli_fleet_retryable(int code) {
    return code == CSD_EIO || code == CSD_ETIMEOUT || code == CSD_ECLOSED || code == CSD_EFULL;
}

static bool stopped(const csd_cli_fleet *f) { return f->stop && atomic_load(f->stop); }

/* Sleeps about ms, in short slices so that a stop request is seen at once. */
static void nap(const csd_cli_fleet *f, int ms) {
    for (int left = ms; left > 0 && !stopped(f); left -= 100) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Creates the fleet pipeline, trying again every second for f->wait_workers_s while the failure
 * is one a worker can outgrow: it starts after the coordinator (a service started in any order),
 * or it still serves a coordinator that died without closing its link (replaced once quiet for
 * 45 s). Says why it waits when it starts and every WAIT_REPORT_S after. A stop request (f->stop)
 * ends the wait with CSD_ECANCELED. */
#define WAIT_REPORT_S 10
static int connect_waiting(csd_cli_fleet *f, const csd_fleet_opts *o, int max_requests,
                           csd_pipeline **out, csd_err *err) {
    int wait_s = f->wait_workers_s > 0 ? f->wait_workers_s : 0;
    uint64_t t0 = csd_now_ns(), limit_ns = (uint64_t)wait_s * 1000000000ull, next_report = 0;
    while (!stopped(f)) {
        int rc = csd_fleet_pipeline_create(out, o, f->model0, max_requests, err);
        if (!rc || !csd_cli_fleet_retryable(rc)) return rc;
        uint64_t waited = csd_now_ns() - t0;
        if (waited >= limit_ns) {
            if (waited >= 1000000000ull)
                csd_err_prefix(err, "after waiting %.0f s for the workers: ",
                               (double)waited * 1e-9);
            return rc;
        }
        if (waited >= next_report) {
            CSD_LOGW("waiting for the fleet (%.0f of %d s): %s", (double)waited * 1e-9, wait_s,
                     err->msg);
            next_report = waited + WAIT_REPORT_S * 1000000000ull;
        }
        nap(f, 1000);
    }
    return csd_err_set(err, CSD_ECANCELED, "stopped waiting for the workers (a signal)");
}

int csd_cli_fleet_open(csd_cli_fleet *f, const csd_model_opts *mopts, int max_requests,
                       csd_pipeline **out, csd_err *err) {
    *out = NULL;
    csd_manifest *m = NULL;
    csd_fleet_opts o;
    memset(&o, 0, sizeof o);
    int rc = csd_manifest_load(&m, f->manifest, err);
    if (!rc && mopts->precision >= 0 && mopts->precision != m->precision) /* the shards' own */
        rc = csd_err_set(err, CSD_EINVAL, "the fleet's export is %s, not --precision %s",
                         csd_dtype_name(m->precision), csd_dtype_name(mopts->precision));
    if (!rc) rc = split_fleet(f->fleet, &o, err);
    int first = f->local_stage == 0 ? 1 : 0;
    if (!rc && o.n_addrs != m->n_stages - first)
        rc = csd_err_set(err, CSD_EINVAL,
                         "--fleet lists %d workers but the manifest has %d stages%s", o.n_addrs,
                         m->n_stages, first ? " (stage 0 runs here)" : "");
    if (!rc && f->key_path) rc = csd_fleet_key_load(f->key_path, &f->key, err);
    if (!rc && first) {
        char path[4096];
        if (csd_path_join(path, sizeof path, m->dir, m->stages[0].file))
            rc = csd_err_set(err, CSD_ERANGE, "path too long");
        if (!rc) rc = csd_model_shard_open(&f->shard0, path, err);
        if (!rc) rc = csd_manifest_check_stage(m, 0, f->shard0->file, path, err);
        if (!rc)
            rc = csd_model_create(&f->model0, &f->shard0->cfg, &f->shard0->weights, mopts, err);
    }
    if (!rc) {
        o.first_remote_stage = (uint32_t)first;
        for (int i = 0; i < o.n_addrs; i++) {
            o.layer_ranges[i][0] = (uint32_t)m->stages[first + i].layer_begin;
            o.layer_ranges[i][1] = (uint32_t)m->stages[first + i].layer_end;
        }
        memcpy(o.model_hash, m->model_hash, CSD_WIRE_HASH_SIZE);
        o.cfg = m->cfg;
        o.link.key = f->key_path ? &f->key : NULL;
        o.link.insecure = f->insecure;
        o.hidden_dtype = f->hidden_dtype;
        o.micro_batches = f->micro_batches;
        int64_t ctx = mopts->max_ctx > 0                               ? mopts->max_ctx
                      : m->cfg.max_seq_len < CSD_MODEL_DEFAULT_MAX_CTX ? m->cfg.max_seq_len
                                                                       : CSD_MODEL_DEFAULT_MAX_CTX;
        o.max_ctx = f->model0 ? csd_model_max_ctx(f->model0) : ctx;
        o.max_step_tokens = CSD_MODEL_DEFAULT_MAX_BATCH;
        rc = connect_waiting(f, &o, max_requests, out, err);
    }
    csd_manifest_destroy(m);
    return rc;
}

void csd_cli_fleet_close(csd_cli_fleet *f) {
    csd_model_destroy(f->model0);
    csd_model_shard_close(f->shard0);
    f->model0 = NULL;
    f->shard0 = NULL;
    if (f->key_path) csd_fleet_key_wipe(&f->key);
}
