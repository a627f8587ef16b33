/* cmd_serve: `cascadia serve MODEL_DIR`: the OpenAI-compatible HTTP API on one machine.
 * Loads the tokenizer and chat template first (a model without a template fails here, before the
 * slow weight load), starts listening (/health says loading), loads the model, builds the
 * pipelines and the engine, then serves until SIGINT/SIGTERM. The first signal drains: new
 * requests get 503 while those in flight finish (up to --shutdown-timeout); a second one, or the
 * timeout, stops them with an error. Then everything shuts down in reverse order.
 * Model/pipeline construction is one function (build_pipelines): remote stages slot in there. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/chat_template.h"
#include "cli_util.h"
#include "draft_setup.h"
#include "fleet_setup.h"
#include "commands.h"
#include "coord/engine.h"
#include "coord/ngram_draft.h"
#include "coord/pipeline.h"
#include "core/alloc.h"
#include "core/build_info.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "http/server.h"
#include "http/tool_calls.h"
#include "model/model.h"
#include "tok/tokenizer.h"

static const char *const serve_usage =
    "usage: cascadia serve MODEL_DIR [options]\n"
    "       cascadia serve --manifest DIR --fleet H:P,H:P [--fleet H:P,H:P ...]\n"
    "                      (--key F | --insecure) [options]\n"
    "       (each --fleet is one pipeline replica, stages in order; requests go to the one with\n"
    "       a free slot)\n"
    "  --host ADDR          address to listen on (default 127.0.0.1)\n"
    "  --port N             TCP port (default 8080; 0 = any free port)\n"
    "  --parallel N         requests decoded together (default 4)\n"
    "  --queue N            requests waiting beyond those before 429 (default 64)\n"
    "  --api-key KEY        require 'Authorization: Bearer KEY' (or env CASCADIA_API_KEY)\n"
    "  --chat-template NAME use a built-in template: chatml|llama3|llama2|mistral|gemma\n"
    "                       (a model with no template of its own and no --chat-template\n"
    "                       serves /v1/completions; chat requests get 400)\n"
    "  --reasoning-format none|deepseek\n"
    "                       deepseek (default): a chat answer's <think>...</think> becomes\n"
    "                       reasoning_content; none: it stays in the content\n"
    "  --tool-call-format auto|hermes|llama3-json|mistral\n"
    "                       how answers write tool calls: hermes (<tool_call> tags), llama3-json\n"
    "                       (an answer that is bare JSON calls), mistral ([TOOL_CALLS]); auto\n"
    "                       (default): from the chat template\n"
    "  --model-name NAME    the model id clients send (default: MODEL_DIR's last component)\n"
    "  --max-body BYTES     largest request body (default 4194304)\n"
    "  --max-connections N  HTTP connections held at once, a thread each (default 256;\n"
    "                       beyond it new ones are closed unanswered)\n"
    "  --max-connections-per-ip N\n"
    "                       connections one client IP address may hold; more are closed at\n"
    "                       once (default 0: no cap)\n"
    "  --idle-timeout SECONDS\n"
    "                       close a connection after this long without traffic (default 60;\n"
    "                       a response still generating is not idle)\n"
    "  --shutdown-timeout SECONDS\n"
    "                       on SIGTERM or SIGINT, requests in flight may finish for this long\n"
    "                       while new ones get 503 (default 20; 0 = stop them at once)\n"
    "  --prefix-cache N     finished prompts whose KV is kept for reuse per pipeline\n"
    "                       (default 4, 0 = off)\n";
/* the rest (one string literal may hold 4095 bytes in ISO C) */
static const char *const serve_usage_models =
    "  --spec-draft N       speculative decoding: each decoding request proposes up to N tokens\n"
    "                       found after an earlier occurrence of its last tokens (in its prompt\n"
    "                       or answer), and one step checks them all; the answer is the same\n"
    "                       (default 0 = off, 4 with --draft-model; at most 16)\n"
    "  --draft-model DIR    the drafts come from a small model sharing the tokenizer (a Hugging\n"
    "                       Face or one-stage export directory), run here for every request\n"
    "  --draft-precision P  the draft model's weights (default: an export's own, else\n"
    "                       --precision's)\n"
    "  --draft-p-min P      a draft ends before a token the draft model gives a probability\n"
    "                       below P (0-1; default 0: drafts run to --spec-draft)\n"
    "  --resume-wait SECONDS\n"
    "                       a request whose fleet is lost mid-answer (a worker gone) while no\n"
    "                       other replica is up waits this long for one to come back, then\n"
    "                       goes on where it was (default 30; 0 = it fails at once)\n"
    CSD_CLI_MODEL_DIR_HELP
        CSD_CLI_MODEL_FLAGS_HELP CSD_CLI_FLEET_FLAGS_HELP;

#define SERVE_MAX_FLEETS 16
/* --resume-wait's default and bound: long enough for a restarted worker to load its shard and
 * be reconnected (the coordinator retries every second). */
#define SERVE_RESUME_WAIT_S 30
#define SERVE_RESUME_WAIT_MAX_S 3600
/* --wait-workers' default: longer than a worker waits (45 s) before it replaces a quiet
 * coordinator */
#define SERVE_WAIT_WORKERS_S 60
/* --shutdown-timeout's default: the drain and then the stop (up to 6 s for the requests, 2 s for
 * a pipeline step) fit in Kubernetes' default 30 s before it kills a pod */
#define SERVE_SHUTDOWN_TIMEOUT_S 20

typedef struct serve_args {
    const char *model_dir;
    const char *host;
    int port;
    int parallel;
    int queue_max;
    const char *api_key;
    const char *chat_template;
    const char *model_name;
    bool reasoning_none; /* --reasoning-format none */
    int tool_format;     /* --tool-call-format: enum csd_tool_split_mode, or -1 for auto */
    size_t max_body;
    int max_connections;
    int max_per_ip;
    int idle_timeout_s;
    int shutdown_timeout_s;
    int resume_wait_s;      /* --resume-wait */
    int prefix_cache;
    int spec_draft;      /* -1: not given */
    csd_cli_draft draft; /* --draft-model */
    csd_model_opts model;
    csd_cli_fleet fleet;                      /* shared fleet settings (manifest, key, ...) */
    const char *fleets[SERVE_MAX_FLEETS];     /* one --fleet per pipeline replica */
    int n_fleets;
} serve_args;

/* What serving runs on; freed by serve_backend_fini. */
typedef struct serve_backend {
    csd_model *model;
    csd_cli_fleet fleets[SERVE_MAX_FLEETS];   /* a replica's connections and local stage 0 */
    csd_pipeline *pipes[SERVE_MAX_FLEETS];
    int n_pipes;
    csd_cli_draft draft;                      /* the draft model, when one is given */
} serve_backend;

/* Lock-free atomics, which a signal handler may write (C11 7.14.1.1): the handler runs on
 * whichever thread the signal lands on, and the main thread reads them. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "a signal handler may only write lock-free atomics");
static atomic_int g_stop_signal;
static atomic_int g_signal_count; /* a second signal ends the drain at once */

static void on_signal(int sig) {
    atomic_store(&g_stop_signal, sig);
    atomic_fetch_add(&g_signal_count, 1);
}

/* --tool-call-format's names of the formats (enum csd_tool_split_mode), or -1. */
static const char *const tool_format_names[] = {
    [CSD_TOOL_SPLIT_TAGS] = "hermes",
    [CSD_TOOL_SPLIT_BARE] = "llama3-json",
    [CSD_TOOL_SPLIT_MISTRAL] = "mistral",
};

static int tool_format_named(const char *name) {
    for (int i = 0; i < (int)(sizeof tool_format_names / sizeof *tool_format_names); i++)
        if (tool_format_names[i] && !strcmp(name, tool_format_names[i])) return i;
    return -1;
}

/* One of serve's own flags that take a value (the fleet flags are csd_cli_fleet_flag's, the
 * model flags csd_cli_model_flag's). 0, or 2 with the message printed. */
static int parse_serve_flag(const char *f, const char *value, serve_args *a) {
    int64_t v;
    if (!strcmp(f, "--prefix-cache")) {
        if (!csd_cli_int("serve", f, value, 0, 1024, &v)) return 2;
        a->prefix_cache = (int)v;
    } else if (!strcmp(f, "--spec-draft")) {
        if (!csd_cli_int("serve", f, value, 0, CSD_SPEC_MAX_DRAFT, &v)) return 2;
        a->spec_draft = (int)v;
    } else if (!strcmp(f, "--host")) {
        a->host = value;
    } else if (!strcmp(f, "--port")) {
        if (!csd_cli_int("serve", f, value, 0, 65535, &v)) return 2;
        a->port = (int)v;
    } else if (!strcmp(f, "--parallel")) {
        if (!csd_cli_int("serve", f, value, 1, 256, &v)) return 2;
        a->parallel = (int)v;
    } else if (!strcmp(f, "--queue")) {
        if (!csd_cli_int("serve", f, value, 0, 1 << 16, &v)) return 2;
        a->queue_max = (int)v;
    } else if (!strcmp(f, "--max-body")) {
        if (!csd_cli_int("serve", f, value, 1024, (int64_t)1 << 30, &v)) return 2;
        a->max_body = (size_t)v;
    } else if (!strcmp(f, "--max-connections")) {
        if (!csd_cli_int("serve", f, value, 1, CSD_HTTP_MAX_CONNECTIONS_LIMIT, &v)) return 2;
        a->max_connections = (int)v;
    } else if (!strcmp(f, "--max-connections-per-ip")) {
        if (!csd_cli_int("serve", f, value, 0, CSD_HTTP_MAX_CONNECTIONS_LIMIT, &v)) return 2;
        a->max_per_ip = (int)v;
    } else if (!strcmp(f, "--idle-timeout")) {
        if (!csd_cli_int("serve", f, value, 1, CSD_HTTP_IDLE_TIMEOUT_LIMIT, &v)) return 2;
        a->idle_timeout_s = (int)v;
    } else if (!strcmp(f, "--shutdown-timeout")) {
        if (!csd_cli_int("serve", f, value, 0, CSD_HTTP_IDLE_TIMEOUT_LIMIT, &v)) return 2;
        a->shutdown_timeout_s = (int)v;
    } else if (!strcmp(f, "--resume-wait")) {
        if (!csd_cli_int("serve", f, value, 0, SERVE_RESUME_WAIT_MAX_S, &v)) return 2;
        a->resume_wait_s = (int)v;
    } else if (!strcmp(f, "--api-key")) {
        if (!value[0]) { /* an empty key would check nothing while the banner says auth=on */
            fprintf(stderr, "cascadia serve: --api-key must not be empty\n");
            return 2;
        }
        a->api_key = value;
    } else if (!strcmp(f, "--chat-template")) {
        if (!csd_chat_template_builtin(value)) {
            fprintf(stderr,
                    "cascadia serve: --chat-template: unknown template '%s' "
                    "(chatml|llama3|llama2|mistral|gemma)\n",
                    value);
            return 2;
        }
        a->chat_template = value;
    } else if (!strcmp(f, "--reasoning-format")) {
        if (strcmp(value, "none") && strcmp(value, "deepseek")) {
            fprintf(stderr, "cascadia serve: --reasoning-format: '%s' is not none or deepseek\n",
                    value);
            return 2;
        }
        a->reasoning_none = !strcmp(value, "none");
    } else if (!strcmp(f, "--tool-call-format")) {
        if (!strcmp(value, "auto")) {
            a->tool_format = -1;
        } else if ((a->tool_format = tool_format_named(value)) < 0) {
            fprintf(stderr, "cascadia serve: --tool-call-format: '%s' is not auto, hermes, "
                    "llama3-json or mistral\n", value);
            return 2;
        }
    } else if (!strcmp(f, "--model-name")) {
        if (!value[0]) {
            fprintf(stderr, "cascadia serve: --model-name must not be empty\n");
            return 2;
        }
        a->model_name = value;
    } else {
        int r = csd_cli_model_flag("serve", f, value, &a->model);
        if (r == 0) r = csd_cli_draft_flag("serve", f, value, &a->draft);
        if (r < 0) return 2;
        if (r == 0) {
            fprintf(stderr, "cascadia serve: unknown option '%s'\n%s%s", f, serve_usage,
                    serve_usage_models);
            return 2;
        }
    }
    return 0;
}

/* Checks that the flags fit together and fills what follows from them. 0, or 2. */
static int finish_args(serve_args *a) {
    if (!csd_cli_fleet_check("serve", &a->fleet)) return 2;
    a->spec_draft = (int)csd_cli_draft_spec("serve", &a->draft, a->spec_draft);
    if (a->spec_draft < 0) return 2;
    /* a service may start before its workers: wait for them, and stop waiting on a signal */
    if (a->fleet.wait_workers_s < 0) a->fleet.wait_workers_s = SERVE_WAIT_WORKERS_S;
    a->fleet.stop = &g_stop_signal;
    if (a->max_per_ip > a->max_connections) {
        fprintf(stderr,
                "cascadia serve: --max-connections-per-ip %d is above --max-connections %d\n",
                a->max_per_ip, a->max_connections);
        return 2;
    }
    if (a->n_fleets && a->model_dir) {
        fprintf(stderr, "cascadia serve: give MODEL_DIR or --manifest/--fleet, not both\n");
        return 2;
    }
    if (a->n_fleets) a->model_dir = a->fleet.manifest; /* tokenizer and templates live there */
    if (!a->model_dir) {
        fprintf(stderr,
                "cascadia serve: MODEL_DIR (or --manifest with --fleet) is required\n%s%s",
                serve_usage, serve_usage_models);
        return 2;
    }
    if (!a->api_key) {
        const char *env = getenv("CASCADIA_API_KEY");
        if (env && env[0]) a->api_key = env;
    }
    return 0;
}

static void default_args(serve_args *a) {
    memset(a, 0, sizeof *a);
    csd_model_opts_default(&a->model);
    a->host = "127.0.0.1";
    a->port = 8080;
    a->tool_format = -1;
    a->parallel = 4;
    a->queue_max = 64;
    a->max_body = CSD_HTTP_DEFAULT_MAX_BODY;
    a->max_connections = CSD_HTTP_DEFAULT_MAX_CONNECTIONS;
    a->idle_timeout_s = CSD_HTTP_DEFAULT_IDLE_TIMEOUT;
    a->shutdown_timeout_s = SERVE_SHUTDOWN_TIMEOUT_S;
    a->resume_wait_s = SERVE_RESUME_WAIT_S;
    a->prefix_cache = 4;
    a->spec_draft = -1;
    a->draft = CSD_CLI_DRAFT_NONE;
    csd_cli_fleet_init(&a->fleet);
}

/* Returns 0 to go on, -1 after --help, or the exit code (2, with the message printed). */
static int parse_args(int argc, char **argv, serve_args *a) {
    default_args(a);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(serve_usage, stdout);
            fputs(serve_usage_models, stdout);
            return -1;
        }
        if (f[0] != '-') {
            if (a->model_dir) {
                fprintf(stderr, "cascadia serve: unexpected argument '%s'\n", f);
                return 2;
            }
            a->model_dir = f;
            continue;
        }
        if (!strcmp(f, "--fleet") && value) { /* repeatable: one pipeline replica each */
            if (a->n_fleets == SERVE_MAX_FLEETS) {
                fprintf(stderr, "cascadia serve: at most %d --fleet groups\n", SERVE_MAX_FLEETS);
                return 2;
            }
            a->fleets[a->n_fleets++] = value;
            a->fleet.fleet = value;
            i++;
            continue;
        }
        bool takes = true;
        int fr = csd_cli_fleet_flag("serve", f, value, &a->fleet, &takes);
        if (fr < 0) return 2;
        if (fr > 0) {
            i += takes;
            continue;
        }
        if (!value) {
            fprintf(stderr, "cascadia serve: %s needs a value\n", f);
            return 2;
        }
        i++;
        if (parse_serve_flag(f, value, a)) return 2;
    }
    return finish_args(a);
}

/* The model id: --model-name, else the directory's last path component. */
static void default_model_name(const char *dir, char *out, size_t cap) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    snprintf(out, cap, "%.*s", (int)(len - start), dir + start);
    if (!out[0]) snprintf(out, cap, "model");
}

/* The chat template's text: --chat-template's built-in one, else the model's own (or NULL). */
static const char *template_source(const serve_args *a, const csd_tok *tok) {
    return a->chat_template ? csd_chat_template_builtin(a->chat_template)
                            : csd_tok_chat_template(tok);
}

/* The chat template: --chat-template's, else the model's. A model without one (a base model) is
 * still served: /v1/completions works and /v1/chat/completions answers 400 (*out stays NULL). */
static int load_template(const serve_args *a, const csd_tok *tok, csd_chat_template **out,
                         csd_err *err) {
    *out = NULL;
    const char *src = template_source(a, tok);
    if (!src) {
        fprintf(stderr,
                "cascadia serve: %s has no chat_template in tokenizer_config.json: "
                "/v1/chat/completions will answer 400 (pass --chat-template "
                "chatml|llama3|llama2|mistral|gemma to serve chat)\n",
                a->model_dir);
        return 0;
    }
    int rc = csd_chat_template_create(out, src, err);
    if (rc)
        csd_err_prefix(err,
                       "chat template of %s: ", a->chat_template ? a->chat_template : a->model_dir);
    return rc;
}

/* Builds what requests run on: one in-process pipeline over the whole model, or one fleet
 * pipeline per --fleet group. Each needs a request slot per parallel request and per cached
 * prompt. */
static int build_pipelines(const serve_args *a, serve_backend *b, csd_err *err) {
    uint64_t t0 = csd_now_ns();
    int slots = a->parallel + a->prefix_cache;
    if (a->n_fleets) {
        for (int i = 0; i < a->n_fleets; i++) {
            b->fleets[i] = a->fleet;
            b->fleets[i].fleet = a->fleets[i];
            int rc = csd_cli_fleet_open(&b->fleets[i], &a->model, slots, &b->pipes[i], err);
            if (rc) return csd_err_prefix(err, "--fleet %s: ", a->fleets[i]);
            b->n_pipes = i + 1;
        }
        fprintf(stderr, "cascadia serve: connected %d fleet pipeline(s) in %.2f s\n", b->n_pipes,
                (double)(csd_now_ns() - t0) * 1e-9);
        return 0;
    }
    int rc = csd_model_open(&b->model, a->model_dir, &a->model, err);
    if (rc) return rc;
    csd_cli_warn_ctx("serve", csd_model_max_ctx(b->model), b->model);
    fprintf(
        stderr,
        "cascadia serve: loaded %s in %.2f s: %s, %lld layers, %s weights (%.1f MiB), kernels %s\n",
        a->model_dir, (double)(csd_now_ns() - t0) * 1e-9, csd_model_cfg(b->model)->model_type,
        (long long)csd_model_cfg(b->model)->n_layers, csd_dtype_name(csd_model_precision(b->model)),
        (double)csd_model_weight_bytes(b->model) / (1 << 20), csd_kern_name());
    rc = csd_local_pipeline_create(&b->pipes[0], b->model, slots, err);
    if (rc) return rc;
    b->n_pipes = 1;
    return 0;
}

static void serve_backend_fini(serve_backend *b) {
    csd_cli_draft_close(&b->draft);
    for (int i = 0; i < SERVE_MAX_FLEETS; i++) {
        if (b->pipes[i]) b->pipes[i]->ops->destroy(b->pipes[i]);
        csd_cli_fleet_close(&b->fleets[i]);
    }
    csd_model_destroy(b->model);
    memset(b, 0, sizeof *b);
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up must not kill the server */
}

static int token_bytes(void *tok, int32_t id, uint8_t *out, size_t cap, size_t *len) {
    return csd_tok_token_bytes(tok, id, out, cap, len);
}

static int start_http(const serve_args *a, csd_tok *tok, csd_chat_template *tmpl,
                      const csd_vocab_bytes *json_vocab, const char *model_name,
                      csd_http_server **srv, csd_err *err) {
    csd_http_opts o;
    csd_http_opts_default(&o);
    o.host = a->host;
    o.port = a->port;
    o.api_key = a->api_key;
    o.model_name = model_name;
    o.max_body = a->max_body;
    o.max_connections = a->max_connections;
    o.max_per_ip = a->max_per_ip;
    o.idle_timeout_s = a->idle_timeout_s;
    o.json_vocab = json_vocab;
    o.reasoning_none = a->reasoning_none;
    o.tool_format = a->tool_format >= 0
                        ? a->tool_format
                        : csd_tool_split_mode_for_template(template_source(a, tok));
    int rc = csd_http_server_create(srv, &o, tok, tmpl, err);
    if (!rc)
        fprintf(stderr,
                "cascadia serve: listening on http://%s:%d model=%s auth=%s tool-calls=%s "
                "build=%s\n",
                a->host, csd_http_server_port(*srv), model_name, a->api_key ? "on" : "off",
                tool_format_names[o.tool_format],
                csd_build_fingerprint());
    return rc;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* The first signal's graceful part: no new requests, and those in flight may finish until the
 * timeout or a second signal. */
static void drain(csd_http_server *srv, csd_engine *engine, int timeout_s) {
    csd_http_server_drain(srv);
    csd_engine_drain(engine);
    int n = csd_http_server_in_flight(srv);
    fprintf(stderr,
            "cascadia serve: signal %d: draining, new requests get 503; %d in flight may finish "
            "within %d s (a second signal stops them)\n",
            atomic_load(&g_stop_signal), n, timeout_s);
    double give_up = csd_now_s() + timeout_s;
    while ((n = csd_http_server_in_flight(srv)) > 0 && atomic_load(&g_signal_count) < 2 &&
           csd_now_s() < give_up)
        sleep_ms(50);
    if (n > 0)
        fprintf(stderr, "cascadia serve: stopping %d request%s still in flight\n", n,
                n == 1 ? "" : "s");
}

static int start_engine(const serve_args *a, const csd_tok *tok, serve_backend *b,
                        csd_engine **engine, csd_err *err) {
    int32_t eog[CSD_CLI_MAX_EOG];
    int n_eog = csd_cli_collect_eog(tok, eog, CSD_CLI_MAX_EOG);
    csd_engine_opts eo;
    csd_engine_opts_default(&eo);
    eo.parallel = a->parallel;
    eo.queue_max = a->queue_max;
    eo.resume_wait_ms = a->resume_wait_s * 1000;
    eo.prefix_cache = a->prefix_cache;
    eo.spec_draft = a->spec_draft;
    b->draft = a->draft;
    /* a slot per request the engine decodes at once, over every pipeline */
    int rc = csd_cli_draft_open(&b->draft, &a->model, tok, a->parallel * b->n_pipes,
                                a->parallel, b->pipes[0]->max_ctx, b->pipes[0]->cfg.vocab_size,
                                err);
    eo.draft_model = b->draft.draft;
    return rc ? rc : csd_engine_create(engine, b->pipes, b->n_pipes, eog, n_eog, &eo, err);
}

int csd_cmd_serve(int argc, char **argv) {
    serve_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    install_signals();
    csd_err err = {0};
    csd_tok *tok = NULL;
    csd_chat_template *tmpl = NULL;
    csd_vocab_bytes *json_vocab = NULL; /* response_format json_object: after the engine ends */
    csd_http_server *srv = NULL;
    csd_engine *engine = NULL;
    serve_backend b;
    memset(&b, 0, sizeof b);
    char model_name[256];
    if (a.model_name)
        snprintf(model_name, sizeof model_name, "%s", a.model_name);
    else
        default_model_name(a.model_dir, model_name, sizeof model_name);
    csd_kern_init();

    rc = csd_tok_load(&tok, a.model_dir, &err);
    if (!rc) rc = load_template(&a, tok, &tmpl, &err);
    /* listening first: /health answers 503 "loading" while the weights load */
    if (!rc)
        rc = csd_vocab_bytes_create(&json_vocab, csd_tok_vocab_size(tok), token_bytes, tok, &err);
    if (!rc) rc = start_http(&a, tok, tmpl, json_vocab, model_name, &srv, &err);
    if (!rc) rc = build_pipelines(&a, &b, &err);
    if (!rc && !atomic_load(&g_stop_signal)) rc = start_engine(&a, tok, &b, &engine, &err);
    if (!rc && engine) {
        csd_http_server_set_engine(srv, engine);
        fprintf(stderr, "cascadia serve: ready (context %lld tokens, %d parallel)\n",
                (long long)csd_engine_max_ctx(engine), a.parallel);
        while (!atomic_load(&g_stop_signal)) sleep_ms(100);
        drain(srv, engine, a.shutdown_timeout_s);
    }
    int sig = atomic_load(&g_stop_signal);
    if (sig) fprintf(stderr, "cascadia serve: signal %d, shutting down\n", sig);
    if (rc && err.code == CSD_ECANCELED && sig) rc = 0; /* stopped while waiting */
    if (rc) csd_cli_error("serve", &err);
    /* reverse order: no new requests (those still running end with an error), then the engine
     * ends what is left, then the model */
    csd_http_server_destroy(srv);
    csd_engine_destroy(engine);
    serve_backend_fini(&b);
    csd_vocab_bytes_destroy(json_vocab);
    csd_chat_template_destroy(tmpl);
    csd_tok_destroy(tok);
    return rc ? 1 : 0;
}
