/* cmd_worker: `cascadia worker --shard FILE --listen HOST:PORT [--key FILE | --insecure]`: loads
 * one stage's shard (checksums verified) and serves it until SIGINT/SIGTERM. */
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "core/build_info.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/log.h"
#include "model/shard_model.h"
#include "model/stage_plan.h"
#include "net/fleet_key.h"
#include "stage/stage_server.h"

static const char *const worker_usage =
    "usage: cascadia worker --shard FILE --listen HOST:PORT (--key FILE | --insecure) [options]\n"
    "  --shard FILE        a stage-K.shard written by `cascadia export`\n"
    "  --listen HOST:PORT  where the coordinator and the previous stage connect (port 0: any)\n"
    "  --key FILE          the fleet key (`cascadia keygen`): links are authenticated and\n"
    "                      encrypted\n"
    "  --insecure          no encryption (a checksum per frame only): benchmarks on a trusted\n"
    "                      network\n"
    "  --max-requests N    open requests at most (default 64; the least recently used is evicted)\n"
    "  --kv-mem SIZE       KV cache memory cap: 512M, 2G, 1.5T, or bytes (default 4G)\n"
    "  --threads N, --ctx N   as for `cascadia run`\n";

static csd_stage_server *volatile running_server;

static void on_signal(int sig) {
    (void)sig;
    csd_stage_server *s = running_server; /* read once: main may clear it meanwhile */
    if (s) csd_stage_server_stop(s);
}

typedef struct {
    const char *shard_path, *key_path;
    csd_model_opts model;
    csd_stage_opts stage; /* --listen and --insecure go straight in; the rest after loading */
} worker_args;

/* argv into *a. Returns -1 to go on, else the exit code: 0 after --help, 2 on a bad flag. */
static int parse_args(int argc, char **argv, worker_args *a) {
    memset(a, 0, sizeof *a);
    csd_model_opts_default(&a->model);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t v;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(worker_usage, stdout);
            return 0;
        } else if (!strcmp(f, "--insecure")) {
            a->stage.link.insecure = true;
            continue;
        } else if (!value) {
            fprintf(stderr, "cascadia worker: %s needs a value\n%s", f, worker_usage);
            return 2;
        } else if (!strcmp(f, "--shard")) {
            a->shard_path = value;
        } else if (!strcmp(f, "--listen")) {
            a->stage.listen = value;
        } else if (!strcmp(f, "--key")) {
            a->key_path = value;
        } else if (!strcmp(f, "--max-requests")) {
            if (!csd_cli_int("worker", f, value, 1, 4096, &v)) return 2;
            a->stage.max_requests = (int)v;
        } else if (!strcmp(f, "--kv-mem")) {
            csd_err err = {0};
            if (csd_plan_parse_bytes(value, &a->stage.kv_mem_cap, &err)) {
                fprintf(stderr, "cascadia worker: --kv-mem: %s\n", err.msg);
                return 2;
            }
        } else {
            int r = csd_cli_model_flag("worker", f, value, &a->model);
            if (r <= 0 || !strcmp(f, "--precision")) {
                if (r >= 0)
                    fprintf(stderr, "cascadia worker: unknown option '%s'\n%s", f, worker_usage);
                return 2;
            }
        }
        i++; /* the flag's value */
    }
    bool one_link_mode = (a->key_path != NULL) != a->stage.link.insecure; /* --key xor --insecure */
    if (!a->shard_path || !a->stage.listen || !one_link_mode) {
        fprintf(stderr,
                "cascadia worker: --shard, --listen and one of --key/--insecure are required\n%s",
                worker_usage);
        return 2;
    }
    return -1;
}

/* What was loaded and what a request will cost, so an operator can size --kv-mem. */
static void print_banner(const csd_model *model, const csd_shard_header *h,
                         const csd_stage_server *server, const worker_args *a, uint64_t t0) {
    double kv_tok = (double)csd_model_kv_bytes_per_token(model);
    uint64_t cap = a->stage.kv_mem_cap ? a->stage.kv_mem_cap : 4ull << 30;
    fprintf(stderr,
            "worker: stage %u of %u, layers [%lld, %lld)%s%s, %s, loaded in %.2f s\n"
            "worker: memory: weights %.1f MiB, KV %.1f KiB/token (%s) = %.1f MiB per "
            "%lld-token request, cap %.0f MiB\n"
            "worker: listening on port %u (%s, build %s)\n",
            h->stage_index, h->stage_count, (long long)h->layer_begin, (long long)h->layer_end,
            h->has_embed ? " +embeddings" : "", h->has_head ? " +head" : "",
            csd_dtype_name(h->precision), (double)(csd_now_ns() - t0) * 1e-9,
            (double)csd_model_weight_bytes(model) / (1 << 20), kv_tok / 1024,
            csd_dtype_name(csd_model_kv_dtype(model)),
            kv_tok * (double)csd_model_max_ctx(model) / (1 << 20),
            (long long)csd_model_max_ctx(model), (double)cap / (1 << 20),
            csd_stage_server_port(server), a->stage.link.insecure ? "insecure" : "encrypted",
            csd_build_fingerprint());
    if ((double)cap < kv_tok * (double)csd_model_max_ctx(model)) /* a request may need it all */
        CSD_LOGW("worker: --kv-mem %.1f MiB holds less than one %lld-token request: a "
                 "coordinator asking for that context has its requests refused (lower --ctx "
                 "here and on the coordinator, or raise --kv-mem)",
                 (double)cap / (1 << 20), (long long)csd_model_max_ctx(model));
}

int csd_cmd_worker(int argc, char **argv) {
    worker_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc >= 0) return prc;
    csd_err err = {0};
    csd_fleet_key key;
    csd_model_shard *shard = NULL;
    csd_model *model = NULL;
    csd_stage_server *server = NULL;
    csd_kern_init();
    uint64_t t0 = csd_now_ns();
    int rc = a.key_path ? csd_fleet_key_load(a.key_path, &key, &err) : 0;
    if (!rc) rc = csd_model_shard_open(&shard, a.shard_path, &err);
    if (!rc) rc = csd_model_create(&model, &shard->cfg, &shard->weights, &a.model, &err);
    if (!rc) {
        const csd_shard_header *h = csd_shard_hdr(shard->file);
        a.stage.link.key = a.key_path ? &key : NULL;
        a.stage.stage_index = h->stage_index;
        memcpy(a.stage.model_hash, h->model_hash, CSD_WIRE_HASH_SIZE);
        rc = csd_stage_server_create(&server, model, &a.stage, &err);
        if (!rc) print_banner(model, h, server, &a, t0);
    }
    if (!rc) {
        running_server = server;
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        signal(SIGPIPE, SIG_IGN);
        rc = csd_stage_server_run(server, &err);
        signal(SIGINT, SIG_DFL); /* no handler may hold the server once it is destroyed */
        signal(SIGTERM, SIG_DFL);
        running_server = NULL;
    }
    if (rc) csd_cli_error("worker", &err);
    csd_stage_server_destroy(server);
    csd_model_destroy(model);
    csd_model_shard_close(shard);
    if (a.key_path) csd_fleet_key_wipe(&key);
    return rc ? 1 : 0;
}
