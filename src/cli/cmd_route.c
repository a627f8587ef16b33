/* cmd_route: `cascadia route --upstream URL [--max N] ...`: one OpenAI-compatible endpoint in front
 * of several providers (other `cascadia serve`s, llama-server, vLLM, Ollama's /v1), never sending
 * any more requests at once than its --max, queueing the rest, failing over when one fails.
 * Parses and checks the flags, runs the router (src/route) until SIGINT/SIGTERM. docs/route.md. */
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_util.h"
#include "commands.h"
#include "core/build_info.h"
#include "core/utf8.h"
#include "route/route_server.h"

static const char *const route_usage =
    "usage: cascadia route --upstream URL [--max N] [--upstream URL [--max N] ...] [options]\n"
    "  --upstream URL       an OpenAI-compatible provider's base URL, ending in /v1\n"
    "                       (http://127.0.0.1:8081/v1); the router adds /chat/completions or\n"
    "                       /completions. Up to 32. These apply to the --upstream before them:\n"
    "    --max N            requests it answers at once (default 1: a server without continuous\n"
    "                       batching slows down for every request it shares; 1..1024)\n"
    "    --upstream-key KEY sent to it as 'Authorization: Bearer KEY'\n"
    "    --upstream-model NAME\n"
    "                       the request's \"model\" is rewritten to NAME for it\n"
    "  --host ADDR          address to listen on (default 127.0.0.1)\n"
    "  --port N             TCP port (default 8080; 0 = any free port)\n"
    "  --queue N            requests waiting for a free upstream before 429 (default 64; each\n"
    "                       request holds a connection: the --max of all upstreams, the queue\n"
    "                       and 64 spare make at most 4096)\n"
    "  --queue-timeout SECONDS\n"
    "                       longest a request waits in the queue before 503 (default 60)\n"
    "  --upstream-timeout SECONDS\n"
    "                       longest an upstream may send nothing before the request fails\n"
    "                       (default 600; connecting: at most 10 s)\n"
    "  --api-key KEY        require 'Authorization: Bearer KEY' from clients (or env\n"
    "                       CASCADIA_API_KEY)\n"
    "  --model-name NAME    the model id /v1/models lists (default cascadia-route)\n"
    "  --max-body BYTES     largest request body (default 4194304)\n";

typedef struct route_args {
    csd_route_opts o;
    bool max_given[CSD_ROUTE_MAX_UPSTREAMS]; /* --max once per --upstream */
} route_args;

/* A lock-free atomic, which a signal handler may write (C11 7.14.1.1): the handler runs on
 * whichever thread the signal lands on, and the main thread reads it. */
static atomic_int g_stop_signal;

static void on_signal(int sig) { atomic_store(&g_stop_signal, sig); }

/* Whole well-formed UTF-8: a model name goes into JSON bodies. */
static bool utf8_text(const char *s) {
    for (size_t n = strlen(s), k; n; s += k, n -= k)
        if (!(k = csd_utf8_seq_len(s, n))) return false;
    return true;
}

/* No control bytes: a key goes into an HTTP header line. */
static bool header_text(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return false;
    return true;
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints "cascadia route: MESSAGE" and returns 2, the exit code of a usage error. */
static int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cascadia route: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

static int add_upstream(route_args *a, const char *url) {
    csd_err err = {0};
    if (csd_route_url_check(url, &err)) return bad("--upstream: %s", err.msg);
    if (a->o.n_upstreams == CSD_ROUTE_MAX_UPSTREAMS)
        return bad("at most %d --upstream", CSD_ROUTE_MAX_UPSTREAMS);
    for (int i = 0; i < a->o.n_upstreams; i++)
        if (csd_route_url_same(a->o.upstreams[i].url, url))
            return bad("--upstream %s given twice (as %s)", url, a->o.upstreams[i].url);
    csd_route_upstream_opts *u = &a->o.upstreams[a->o.n_upstreams++];
    u->url = url;
    u->max = 1;
    return 0;
}

/* --max, --upstream-key, --upstream-model: they qualify the --upstream before them. */
static int upstream_flag(route_args *a, const char *f, const char *value) {
    if (!a->o.n_upstreams) return bad("%s must follow the --upstream it applies to", f);
    int i = a->o.n_upstreams - 1;
    csd_route_upstream_opts *u = &a->o.upstreams[i];
    if (!strcmp(f, "--max")) {
        int64_t v;
        if (a->max_given[i]) return bad("--max given twice for %s", u->url);
        if (!csd_cli_int("route", f, value, 1, CSD_ROUTE_MAX_IN_FLIGHT, &v)) return 2;
        u->max = (int)v;
        a->max_given[i] = true;
    } else if (!value[0]) {
        return bad("%s must not be empty", f);
    } else if (!strcmp(f, "--upstream-key")) {
        if (u->key) return bad("--upstream-key given twice for %s", u->url);
        if (!header_text(value)) return bad("--upstream-key holds a control character");
        u->key = value;
    } else {
        if (u->model) return bad("--upstream-model given twice for %s", u->url);
        if (!utf8_text(value)) return bad("--upstream-model is not UTF-8 text");
        u->model = value;
    }
    return 0;
}

static int route_flag(route_args *a, const char *f, const char *value) {
    int64_t v;
    if (!strcmp(f, "--upstream")) return add_upstream(a, value);
    if (!strcmp(f, "--max") || !strcmp(f, "--upstream-key") || !strcmp(f, "--upstream-model"))
        return upstream_flag(a, f, value);
    if (!strcmp(f, "--host")) {
        if (!value[0]) return bad("--host must not be empty");
        a->o.host = value;
        return 0;
    }
    if (!strcmp(f, "--api-key") || !strcmp(f, "--model-name")) {
        if (!value[0]) return bad("%s must not be empty", f);
        if (!utf8_text(value) || !header_text(value))
            return bad("%s must be UTF-8 text without control characters", f);
        *(!strcmp(f, "--api-key") ? &a->o.api_key : &a->o.model_name) = value;
        return 0;
    }
    static const struct {
        const char *flag;
        int64_t lo, hi;
    } ints[] = {{"--port", 0, 65535},
                {"--queue", 0, CSD_ROUTE_MAX_CONNECTIONS},
                {"--queue-timeout", 1, 86400},
                {"--upstream-timeout", 1, 86400},
                {"--max-body", 1024, (int64_t)1 << 30}};
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++) {
        if (strcmp(f, ints[k].flag)) continue;
        if (!csd_cli_int("route", f, value, ints[k].lo, ints[k].hi, &v)) return 2;
        if (k == 0) a->o.port = (int)v;
        if (k == 1) a->o.queue_max = (int)v;
        if (k == 2) a->o.queue_timeout_s = (int)v;
        if (k == 3) a->o.upstream_timeout_s = (int)v;
        if (k == 4) a->o.max_body = (size_t)v;
        return 0;
    }
    fprintf(stderr, "cascadia route: unknown option '%s'\n%s", f, route_usage);
    return 2;
}

/* Returns 0 to go on, -1 after --help, or the exit code (2, with the message printed). */
static int parse_args(int argc, char **argv, route_args *a) {
    memset(a, 0, sizeof *a);
    csd_route_opts_default(&a->o);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(route_usage, stdout);
            return -1;
        }
        if (f[0] != '-' || i + 1 >= argc) {
            fprintf(stderr, "cascadia route: %s '%s'\n%s",
                    f[0] != '-' ? "unexpected argument" : "a value is missing after", f,
                    route_usage);
            return 2;
        }
        int rc = route_flag(a, f, argv[++i]);
        if (rc) return rc;
    }
    if (!a->o.n_upstreams) {
        fprintf(stderr, "cascadia route: at least one --upstream URL is required\n%s", route_usage);
        return 2;
    }
    if (!a->o.api_key) {
        const char *env = getenv("CASCADIA_API_KEY");
        if (env && env[0]) a->o.api_key = env;
    }
    return 0;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client or upstream that hangs up must not kill the router */
}

/* Says what runs where; a base that does not end in /v1 is served, with a warning (most
 * providers want it). */
static void print_banner(const route_args *a, int port) {
    fprintf(stderr,
            "cascadia route: listening on http://%s:%d model=%s auth=%s upstreams=%d "
            "build=%s\n",
            a->o.host, port, a->o.model_name, a->o.api_key ? "on" : "off", a->o.n_upstreams,
            csd_build_fingerprint());
    for (int i = 0; i < a->o.n_upstreams; i++) {
        const csd_route_upstream_opts *u = &a->o.upstreams[i];
        size_t n = strlen(u->url);
        while (n > 1 && u->url[n - 1] == '/') n--;
        bool v1 = n >= 3 && !strncmp(u->url + n - 3, "/v1", 3);
        fprintf(stderr, "cascadia route: upstream %s max=%d%s%s%s\n", u->url, u->max,
                u->key ? " key=set" : "", u->model ? " model=" : "", u->model ? u->model : "");
        if (!v1)
            fprintf(stderr,
                    "cascadia route: warning: %s does not end in /v1; requests go to "
                    "%.*s/chat/completions\n",
                    u->url, (int)n, u->url);
    }
}

int csd_cmd_route(int argc, char **argv) {
    route_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    install_signals();
    csd_err err = {0};
    csd_route_server *srv = NULL;
    if ((rc = csd_route_server_create(&srv, &a.o, &err))) {
        csd_cli_error("route", &err);
        return rc == CSD_ERANGE || rc == CSD_EINVAL ? 2 : 1; /* flags that do not fit together */
    }
    print_banner(&a, csd_route_server_port(srv));
    while (!atomic_load(&g_stop_signal)) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "cascadia route: signal %d, shutting down\n", atomic_load(&g_stop_signal));
    csd_route_server_destroy(srv);
    return 0;
}
