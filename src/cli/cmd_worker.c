/* cmd_worker: `cascadia worker --shard FILE --listen HOST:PORT [--key FILE | --insecure]`: loads
 * one stage's shard (checksums verified) and serves it until SIGINT/SIGTERM. */
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "model/shard_model.h"
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
    "  --kv-mem BYTES      KV cache memory cap, e.g. 2G (default 4G)\n"
    "  --threads N, --ctx N   as for `cascadia run`\n";

static csd_stage_server *volatile running_server;

static void on_signal(int sig) {
    (void)sig;
    if (running_server) csd_stage_server_stop(running_server);
}

/* "2G", "512M", "1048576" -> bytes; 0 on error. */
static uint64_t parse_bytes(const char *text) {
    char *end = NULL;
    double v = text ? strtod(text, &end) : 0;
    if (!text || end == text || v <= 0) return 0;
    double mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    return *end ? 0 : (uint64_t)(v * mult);
}

int csd_cmd_worker(int argc, char **argv) {
    const char *shard_path = NULL, *listen = NULL, *key_path = NULL;
    bool insecure = false;
    csd_model_opts mopts;
    csd_model_opts_default(&mopts);
    csd_stage_opts sopts;
    memset(&sopts, 0, sizeof sopts);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t v;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(worker_usage, stdout);
            return 0;
        } else if (!strcmp(f, "--insecure")) {
            insecure = true;
        } else if (!value) {
            fprintf(stderr, "cascadia worker: %s needs a value\n%s", f, worker_usage);
            return 2;
        } else if (!strcmp(f, "--shard")) {
            shard_path = argv[++i];
        } else if (!strcmp(f, "--listen")) {
            listen = argv[++i];
        } else if (!strcmp(f, "--key")) {
            key_path = argv[++i];
        } else if (!strcmp(f, "--max-requests")) {
            if (!csd_cli_int("worker", f, value, 1, 4096, &v)) return 2;
            sopts.max_requests = (int)v;
            i++;
        } else if (!strcmp(f, "--kv-mem")) {
            sopts.kv_mem_cap = parse_bytes(value);
            if (!sopts.kv_mem_cap) {
                fprintf(stderr, "cascadia worker: --kv-mem expects a size like 2G, got '%s'\n",
                        value);
                return 2;
            }
            i++;
        } else {
            int r = csd_cli_model_flag("worker", f, value, &mopts);
            if (r <= 0 || !strcmp(f, "--precision")) {
                if (r >= 0)
                    fprintf(stderr, "cascadia worker: unknown option '%s'\n%s", f, worker_usage);
                return 2;
            }
            i++;
        }
    }
    if (!shard_path || !listen || (!key_path && !insecure) || (key_path && insecure)) {
        fprintf(stderr,
                "cascadia worker: --shard, --listen and one of --key/--insecure are required\n%s",
                worker_usage);
        return 2;
    }
    csd_err err = {0};
    csd_fleet_key key;
    csd_model_shard *shard = NULL;
    csd_model *model = NULL;
    csd_stage_server *server = NULL;
    csd_kern_init();
    uint64_t t0 = csd_now_ns();
    int rc = key_path ? csd_fleet_key_load(key_path, &key, &err) : 0;
    if (!rc) rc = csd_model_shard_open(&shard, shard_path, &err);
    if (!rc) rc = csd_model_create(&model, &shard->cfg, &shard->weights, &mopts, &err);
    if (!rc) {
        const csd_shard_header *h = csd_shard_hdr(shard->file);
        sopts.listen = listen;
        sopts.link.key = key_path ? &key : NULL;
        sopts.link.insecure = insecure;
        sopts.stage_index = h->stage_index;
        memcpy(sopts.model_hash, h->model_hash, CSD_WIRE_HASH_SIZE);
        rc = csd_stage_server_create(&server, model, &sopts, &err);
        if (!rc) {
            double kv_tok = (double)csd_model_kv_bytes_per_token(model);
            uint64_t cap = sopts.kv_mem_cap ? sopts.kv_mem_cap : 4ull << 30;
            fprintf(
                stderr,
                "worker: stage %u of %u, layers [%lld, %lld)%s%s, %s, loaded in %.2f s\n"
                "worker: memory: weights %.1f MiB, KV %.1f KiB/token (%s) = %.1f MiB per "
                "%lld-token request, cap %.0f MiB\n"
                "worker: listening on port %u (%s)\n",
                h->stage_index, h->stage_count, (long long)h->layer_begin, (long long)h->layer_end,
                h->has_embed ? " +embeddings" : "", h->has_head ? " +head" : "",
                csd_dtype_name(h->precision), (double)(csd_now_ns() - t0) * 1e-9,
                (double)csd_model_weight_bytes(model) / (1 << 20), kv_tok / 1024,
                csd_dtype_name(csd_model_kv_dtype(model)),
                kv_tok * (double)csd_model_max_ctx(model) / (1 << 20),
                (long long)csd_model_max_ctx(model), (double)cap / (1 << 20),
                csd_stage_server_port(server), insecure ? "insecure" : "encrypted");
        }
    }
    if (!rc) {
        running_server = server;
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        signal(SIGPIPE, SIG_IGN);
        rc = csd_stage_server_run(server, &err);
        running_server = NULL;
    }
    if (rc) csd_cli_error("worker", &err);
    csd_stage_server_destroy(server);
    csd_model_destroy(model);
    csd_model_shard_close(shard);
    if (key_path) csd_fleet_key_wipe(&key);
    return rc ? 1 : 0;
}
