/* route_server: the router's libmicrohttpd front (see route_server.h). A connection thread reads
 * the body, checks it is a JSON object, acquires a slot (route_sched.c), and drives the upstream
 * transfer (route_proxy.c) until the answer's status and first bytes are known; only then is the
 * response queued, so an upstream that fails before answering is replaced by another. The rest of
 * the answer is relayed by a content-reader callback as it arrives, except to an HTTP/1.0 client,
 * which gets a plain answer whole (answer_whole). The router is a second HTTP front, not part of
 * the API: it shares only src/mhd's plumbing with src/http. */
#include "route_server.h"

#include <jansson.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "mhd/mhd_glue.h"
#include "route_proxy.h"
#include "route_sched.h"

/* Bytes handed to MHD per content-reader call. */
#define RELAY_BLOCK 16384
/* Seconds to connect to an upstream at most (or --upstream-timeout when shorter). */
#define CONNECT_TIMEOUT_S 10
/* Seconds a client should wait before retrying a 429 or 503. */
#define RETRY_AFTER "1"
/* Largest answer held whole for an HTTP/1.0 client (below): an answer of 32K tokens with 20
 * logprobs each is about this size. */
#define WHOLE_ANSWER_MAX ((size_t)32 << 20)

enum route_path {
    PATH_NONE = 0,
    PATH_CHAT,        /* POST /v1/chat/completions */
    PATH_COMPLETIONS, /* POST /v1/completions */
    PATH_MODELS,      /* GET /v1/models */
    PATH_MODEL_ONE,   /* GET /v1/models/{id} */
    PATH_HEALTH,
    PATH_METRICS,
    PATH_COUNT
};

typedef struct upstream {
    char *url;   /* the base, no trailing slash */
    char *key;   /* NULL: no Authorization */
    char *model; /* NULL: "model" forwarded as sent */
} upstream;

struct csd_route_server {
    struct MHD_Daemon *mhd;
    csd_route_sched sched;
    bool sched_ready;
    bool curl_ready;
    int n_up;
    upstream up[CSD_ROUTE_MAX_UPSTREAMS];
    char *api_key;
    char *model_name;
    size_t max_body;
    int queue_timeout_s;
    int upstream_timeout_s;
    int port;
    int max_connections; /* a thread each: every slot, the queue and a reserve */
    long long started;   /* unix seconds, for /v1/models "created" */
    atomic_int stopping;
};

/* Per connection (MHD's con_cls): the body being received. */
typedef struct conn_state {
    int path;
    bool replied; /* a response was queued on the first call (401, 404, 413, ...) */
    bool http10;  /* the client speaks HTTP/1.0: no chunked encoding (answer_whole) */
    csd_mhd_body body;
} conn_state;

/* What the abort callback looks at: the client's socket and the server's stop flag. */
typedef struct watch {
    csd_route_server *s;
    int fd;
} watch;

/* One answer being relayed: its transfer and the slot it holds. */
typedef struct relay {
    csd_route_server *s;
    struct MHD_Connection *conn;
    csd_route_xfer *x;
    watch w;
    int up;     /* the upstream whose slot it holds; -1 once given back */
    bool sse;   /* an event stream: a failure mid-way ends it with an error event */
    char *tail; /* that error event, being sent */
    size_t tail_len, tail_sent;
} relay;

void csd_route_opts_default(csd_route_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = CSD_ROUTE_DEFAULT_PORT;
    o->queue_max = CSD_ROUTE_DEFAULT_QUEUE;
    o->queue_timeout_s = CSD_ROUTE_DEFAULT_QUEUE_TIMEOUT;
    o->upstream_timeout_s = CSD_ROUTE_DEFAULT_UPSTREAM_TIMEOUT;
    o->max_body = CSD_ROUTE_DEFAULT_MAX_BODY;
    o->model_name = CSD_ROUTE_DEFAULT_MODEL_NAME;
}

/* The host part url[scheme, host_end) ends in a port 1..65535, if any; an IPv6 address is
 * bracketed. */
static int check_port(const char *url, size_t scheme, size_t host_end, csd_err *err) {
    const char *h = url + scheme, *end = url + host_end, *colon = NULL;
    if (*h == '[') {
        const char *close = memchr(h, ']', (size_t)(end - h));
        if (!close) return csd_err_set(err, CSD_EINVAL, "'%.200s': an unclosed '['", url);
        if (close + 1 < end && close[1] != ':')
            return csd_err_set(err, CSD_EINVAL, "'%.200s': text after the IPv6 address", url);
        colon = close + 1 < end ? close + 1 : NULL;
    } else {
        colon = memchr(h, ':', (size_t)(end - h));
    }
    if (!colon) return 0;
    long port = 0;
    const char *p = colon + 1;
    for (; p < end && *p >= '0' && *p <= '9' && port <= 65535; p++) port = port * 10 + (*p - '0');
    if (p == colon + 1 || p != end || port < 1 || port > 65535)
        return csd_err_set(err, CSD_EINVAL, "'%.200s': the port is not a number in 1..65535", url);
    return 0;
}

int csd_route_url_check(const char *url, csd_err *err) {
    size_t n = strlen(url);
    size_t scheme = !strncasecmp(url, "http://", 7) ? 7 : !strncasecmp(url, "https://", 8) ? 8 : 0;
    if (!scheme)
        return csd_err_set(err, CSD_EINVAL, "'%.200s' is not an http:// or https:// URL", url);
    if (n > CSD_ROUTE_URL_MAX)
        return csd_err_set(err, CSD_EINVAL, "URL longer than %d bytes", CSD_ROUTE_URL_MAX);
    if (!url[scheme] || url[scheme] == '/' || url[scheme] == ':' || url[scheme] == '?')
        return csd_err_set(err, CSD_EINVAL, "'%.200s' names no host", url);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)url[i];
        /* it goes into metrics labels and log lines as it is */
        if (ch <= 0x20 || ch >= 0x7f || ch == '"' || ch == '\\')
            return csd_err_set(err, CSD_EINVAL,
                               "'%.200s' has a space, quote, backslash or non-ASCII byte", url);
        /* the paths are appended to it */
        if (ch == '?' || ch == '#')
            return csd_err_set(err, CSD_EINVAL, "'%.200s': a base URL has no query or fragment",
                               url);
    }
    /* user:password@ would be shown by /metrics, which needs no key */
    size_t host_end = scheme + strcspn(url + scheme, "/");
    if (memchr(url + scheme, '@', host_end - scheme))
        return csd_err_set(err, CSD_EINVAL,
                           "'%.200s' holds credentials: give them with --upstream-key", url);
    return check_port(url, scheme, host_end, err);
}

bool csd_route_url_same(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    while (la && a[la - 1] == '/') la--;
    while (lb && b[lb - 1] == '/') lb--;
    const char *sep = strstr(a, "://");
    size_t start = sep ? (size_t)(sep - a) + 3 : 0;
    size_t path = start + strcspn(a + start, "/"); /* where a's path begins */
    if (la != lb || path > la) return la == lb && !strncasecmp(a, b, la);
    /* the scheme and host in any case (as DNS and URLs read them), the path exactly */
    return !strncasecmp(a, b, path) && !strncmp(a + path, b + path, la - path);
}

/* ---- responses ---- */

/* Queues r (NULL: out of memory) with its Content-Type and one more header if h1. */
static enum MHD_Result queue_response(struct MHD_Connection *c, int status,
                                      struct MHD_Response *r, const char *ctype, const char *h1,
                                      const char *v1) {
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (h1) MHD_add_response_header(r, h1, v1);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *ctype,
                                 const char *body, const char *h1, const char *v1) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)(uintptr_t)body,
                                                             MHD_RESPMEM_MUST_COPY);
    return queue_response(c, status, r, ctype, h1, v1);
}

static bool is_event_stream(const char *ctype) {
    return !strncasecmp(ctype, "text/event-stream", 17);
}

/* OpenAI's error shape, as src/http answers: {"error": {"message", "type", "param", "code"}}. */
static char *error_json(const char *type, const char *param, const char *code, const char *msg) {
    json_t *root = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", msg, "type", type,
                             "param", param, "code", code);
    char *out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}

static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *type,
                                  const char *param, const char *code, const char *h1,
                                  const char *v1, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *type,
                                  const char *param, const char *code, const char *h1,
                                  const char *v1, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char *json = error_json(type, param, code, msg);
    /* a message that is not UTF-8 (cut inside a character) cannot be JSON: say less */
    if (!json) json = error_json(type, param, code, "error (message not representable)");
    enum MHD_Result ret =
        send_body(c, status, "application/json", json ? json : "{\"error\":{}}", h1, v1);
    free(json);
    return ret;
}

/* ---- paths and auth ---- */

static int path_of(const char *url) {
    if (!strncmp(url, "/v1/", 4)) url += 3; /* the /v1 prefix is optional, as in serve */
    if (!strcmp(url, "/chat/completions")) return PATH_CHAT;
    if (!strcmp(url, "/completions")) return PATH_COMPLETIONS;
    if (!strcmp(url, "/models")) return PATH_MODELS;
    if (!strncmp(url, "/models/", 8) && url[8]) return PATH_MODEL_ONE;
    if (!strcmp(url, "/health")) return PATH_HEALTH;
    if (!strcmp(url, "/metrics")) return PATH_METRICS;
    return PATH_NONE;
}

static bool path_is_post(int path) { return path == PATH_CHAT || path == PATH_COMPLETIONS; }

static bool authorized(const csd_route_server *s, struct MHD_Connection *c, int path) {
    if (!s->api_key || path == PATH_HEALTH || path == PATH_METRICS) return true;
    return csd_mhd_bearer_ok(c, s->api_key);
}

/* ---- GET endpoints ---- */

static json_t *model_object(const csd_route_server *s) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", s->model_name, "object", "model", "created",
                     (json_int_t)s->started, "owned_by", "cascadia-route");
}

static enum MHD_Result handle_models(csd_route_server *s, struct MHD_Connection *c, const char *url,
                                     int path) {
    json_t *root;
    if (path == PATH_MODEL_ONE) {
        const char *id = strstr(url, "/models/") + 8;
        if (strcmp(id, s->model_name) != 0)
            return send_error(c, 404, "invalid_request_error", "model", "model_not_found", NULL,
                              NULL, "The model '%.100s' does not exist", id);
        root = model_object(s);
    } else {
        root = json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(s));
    }
    char *body = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    enum MHD_Result ret =
        body ? send_body(c, 200, "application/json", body, NULL, NULL)
             : send_error(c, 500, "server_error", NULL, NULL, NULL, NULL, "out of memory");
    free(body);
    return ret;
}

static enum MHD_Result handle_health(csd_route_server *s, struct MHD_Connection *c) {
    if (csd_route_sched_any_up(&s->sched))
        return send_body(c, 200, "application/json", "{\"status\":\"ok\"}", NULL, NULL);
    return send_body(c, 503, "application/json", "{\"status\":\"down\"}", "Retry-After",
                     RETRY_AFTER);
}

/* One per-upstream family: its HELP and TYPE, then a line per upstream. which: the field. */
enum up_field { UF_IN_FLIGHT, UF_MAX, UF_PEAK, UF_DOWN, UF_REQUESTS, UF_FAILURES, UF_COUNT };

static void upstream_family(csd_http_buf *b, const csd_route_server *s,
                            const csd_route_stats *st, int which) {
    static const char *const names[UF_COUNT][3] = {
        {"upstream_in_flight", "gauge", "Requests an upstream is answering now."},
        {"upstream_max", "gauge", "Requests an upstream may answer at once (--max)."},
        {"upstream_peak_in_flight", "gauge", "The most requests an upstream held at once."},
        {"upstream_down", "gauge", "1 while an upstream whose connection failed is avoided."},
        {"upstream_requests_total", "counter",
         "Requests sent to an upstream (a request that fails over counts on each it tried)."},
        {"upstream_failures_total", "counter",
         "Requests an upstream failed: no connection, a 429 or 5xx status, or a broken answer."},
    };
    csd_http_buf_printf(b, "# HELP cascadia_route_%s %s\n# TYPE cascadia_route_%s %s\n",
            names[which][0], names[which][2], names[which][0], names[which][1]);
    for (int i = 0; i < st->n; i++) {
        const csd_route_upstream_stats *u = &st->up[i];
        long long v = which == UF_IN_FLIGHT  ? u->in_flight
                      : which == UF_MAX      ? u->max
                      : which == UF_PEAK     ? u->peak
                      : which == UF_DOWN     ? u->down
                      : which == UF_REQUESTS ? u->requests
                                             : u->failures;
        /* URLs were checked: no quote, backslash or newline needs escaping in the label */
        csd_http_buf_printf(b, "cascadia_route_%s{upstream=\"%s\"} %lld\n", names[which][0],
                s->up[i].url, v);
    }
}

static enum MHD_Result handle_metrics(csd_route_server *s, struct MHD_Connection *c) {
    csd_route_stats st;
    csd_route_sched_stats(&s->sched, &st);
    csd_http_buf b = {0};
    for (int f = 0; f < UF_COUNT; f++) upstream_family(&b, s, &st, f);
    csd_http_buf_printf(&b,
            "# HELP cascadia_route_queue_depth Requests waiting for a free upstream slot.\n"
            "# TYPE cascadia_route_queue_depth gauge\ncascadia_route_queue_depth %d\n",
            st.queue_depth);
    csd_http_buf_printf(&b,
            "# HELP cascadia_route_requests_rejected_total Requests refused with 429: the queue "
            "was full.\n# TYPE cascadia_route_requests_rejected_total counter\n"
            "cascadia_route_requests_rejected_total %lld\n",
            st.rejected);
    csd_http_buf_printf(&b,
            "# HELP cascadia_route_queue_timeouts_total Requests answered 503 after waiting "
            "--queue-timeout.\n# TYPE cascadia_route_queue_timeouts_total counter\n"
            "cascadia_route_queue_timeouts_total %lld\n",
            st.timeouts);
    enum MHD_Result ret =
        b.data ? send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, NULL, NULL)
               : send_error(c, 500, "server_error", NULL, NULL, NULL, NULL, "out of memory");
    csd_http_buf_fini(&b);
    return ret;
}

/* ---- watching the client ---- */

static bool should_stop(void *ctx) {
    const watch *w = ctx;
    return atomic_load(&w->s->stopping) || csd_fd_peer_gone(w->fd);
}

/* A connection waiting for an upstream is not idle: MHD's timeout is off while it waits, and set
 * again after, which restarts its count (as src/http/server.c does for its streams). */
static void idle_timeout(struct MHD_Connection *c, bool on) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                              on ? (unsigned)CSD_ROUTE_IDLE_TIMEOUT : 0u);
}

/* ---- relaying an answer ---- */

/* Ends the transfer and gives the slot back. The transfer is closed first, so the upstream has
 * cancelled (or finished) this request before the slot can take another one to it. */
static void relay_release(relay *r, bool failed) {
    csd_route_xfer_destroy(r->x);
    r->x = NULL;
    if (r->up < 0) return;
    csd_route_sched_release(&r->s->sched, r->up, failed, false);
    r->up = -1;
}

/* The last event of a stream that broke after bytes were relayed: an OpenAI error, as llama-server
 * and vLLM end theirs. */
static void relay_error_event(relay *r, const char *why) {
    char msg[400];
    snprintf(msg, sizeof msg, "the upstream failed mid-answer: %s", why);
    char *json = error_json("server_error", NULL, "upstream_error", msg);
    if (!json) return;
    size_t n = strlen(json) + 16;
    r->tail = csd_alloc(n);
    if (r->tail) r->tail_len = (size_t)snprintf(r->tail, n, "\n\ndata: %s\n\n", json);
    free(json);
}

static ssize_t relay_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    relay *r = cls;
    if (max > RELAY_BLOCK) max = RELAY_BLOCK;
    if (r->tail) {
        size_t n = r->tail_len - r->tail_sent;
        if (!n) return MHD_CONTENT_READER_END_OF_STREAM;
        if (n > max) n = max;
        memcpy(buf, r->tail + r->tail_sent, n);
        r->tail_sent += n;
        return (ssize_t)n;
    }
    if (!r->x) return MHD_CONTENT_READER_END_WITH_ERROR; /* ended already */
    csd_route_abort ab = {should_stop, &r->w};
    csd_err err = {0};
    idle_timeout(r->conn, false);
    ssize_t n = csd_route_xfer_read(r->x, buf, max, &ab, &err);
    idle_timeout(r->conn, true);
    if (n > 0) return n;
    if (n == 0) {
        relay_release(r, false);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (n == -2) { /* the client left or the server stops */
        relay_release(r, false);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    CSD_LOGW("upstream failed mid-answer upstream=%s error=%s", r->s->up[r->up].url, err.msg);
    relay_release(r, true);
    if (r->sse) relay_error_event(r, err.msg);
    return r->tail ? relay_reader(cls, pos, buf, max) : MHD_CONTENT_READER_END_WITH_ERROR;
}

/* MHD calls this when the response is done with, finished or not. */
static void relay_free(void *cls) {
    relay *r = cls;
    relay_release(r, false); /* closes an unfinished transfer: the upstream cancels */
    csd_free(r->tail);
    csd_free(r);
}

/* Queues the upstream's answer: its status, Content-Type and, from the reader, its bytes. Takes
 * the transfer and the slot (given back when the answer ends). */
static enum MHD_Result start_relay(csd_route_server *s, struct MHD_Connection *c, csd_route_xfer *x,
                                   int up, int fd) {
    relay *r = csd_alloc(sizeof *r);
    struct MHD_Response *resp = r ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, RELAY_BLOCK,
                                                                      relay_reader, r, relay_free)
                                  : NULL;
    if (!resp) {
        csd_free(r);
        csd_route_xfer_destroy(x);
        csd_route_sched_release(&s->sched, up, false, false);
        return send_error(c, 500, "server_error", NULL, NULL, NULL, NULL, "out of memory");
    }
    *r = (relay){.s = s, .conn = c, .x = x, .w = {s, fd}, .up = up};
    const char *ctype = csd_route_xfer_content_type(x);
    r->sse = is_event_stream(ctype);
    /* the connection holds resp once queued; relay_free runs when it is done */
    return queue_response(c, csd_route_xfer_status(x), resp, ctype[0] ? ctype : "application/json",
                          r->sse ? "Cache-Control" : NULL, "no-cache");
}

/* An answer that must have no body (204, 304): HTTP forbids one, so it is not relayed as a
 * stream (whose chunked end would be read as the start of the next answer). */
static bool empty_answer(const csd_route_xfer *x) {
    int status = csd_route_xfer_status(x);
    return status == 204 || status == 304;
}

static enum MHD_Result relay_empty(csd_route_server *s, struct MHD_Connection *c,
                                   csd_route_xfer *x, int up) {
    int status = csd_route_xfer_status(x);
    csd_route_xfer_destroy(x);
    csd_route_sched_release(&s->sched, up, false, false);
    return send_body(c, status, "application/json", "", NULL, NULL);
}

/* ---- an answer held whole (HTTP/1.0) ---- */

/* An HTTP/1.0 client gets no chunked encoding: a relayed answer would end with the connection,
 * so an upstream failing mid-answer would look to it like a whole answer. Its answers (other
 * than event streams, which end with an error event) are therefore read whole first and sent
 * with their length; a failure before the end fails over, as a broken connection does. */
static bool hold_whole(const conn_state *cs, const csd_route_xfer *x) {
    return cs->http10 && !is_event_stream(csd_route_xfer_content_type(x));
}

enum { WHOLE_OK, WHOLE_FAILED, WHOLE_ABORTED, WHOLE_TOO_LONG };

/* Reads x's answer into b, up to WHOLE_ANSWER_MAX bytes. */
static int read_whole(csd_route_xfer *x, const csd_route_abort *ab, csd_http_buf *b,
                      csd_err *err) {
    char block[RELAY_BLOCK];
    for (;;) {
        ssize_t n = csd_route_xfer_read(x, block, sizeof block, ab, err);
        if (n == 0) return WHOLE_OK;
        if (n == -2) return WHOLE_ABORTED;
        if (n < 0) return WHOLE_FAILED;
        if (b->len + (size_t)n > WHOLE_ANSWER_MAX) return WHOLE_TOO_LONG;
        if (csd_http_buf_append(b, block, (size_t)n)) {
            csd_err_set(err, CSD_ENOMEM, "no memory to hold the answer");
            return WHOLE_FAILED;
        }
    }
}

/* Sends the answer b (taken) with its length, status and Content-Type. */
static enum MHD_Result send_whole(struct MHD_Connection *c, int status, const char *ctype,
                                  csd_http_buf *b) {
    if (!ctype[0]) ctype = "application/json";
    if (!b->data) return send_body(c, status, ctype, "", NULL, NULL);
    /* handed to MHD, which frees it: an answer is not held twice */
    struct MHD_Response *r =
        MHD_create_response_from_buffer(b->len, b->data, MHD_RESPMEM_MUST_FREE);
    if (r) *b = (csd_http_buf){0};
    return queue_response(c, status, r, ctype, NULL, NULL);
}

/* ---- forwarding ---- */

/* The body for upstream u: as sent, or with "model" rewritten (--upstream-model), parsed again
 * here so that no tree is held while a request waits (a 4 MiB body of small numbers is a tree
 * of about 80 MiB). NULL when that fails; *owned says whether to free() it. */
static const char *body_for(const upstream *u, const conn_state *cs, size_t *len, bool *owned) {
    *owned = false;
    *len = cs->body.buf.len;
    if (!u->model) return cs->body.buf.data;
    json_t *root = json_loadb(cs->body.buf.data, cs->body.buf.len, JSON_ALLOW_NUL, NULL);
    char *out = NULL;
    if (json_is_object(root) && !json_object_set_new(root, "model", json_string(u->model)))
        out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!out) return NULL;
    *owned = true;
    *len = strlen(out);
    return out;
}

/* One attempt on upstream up. CSD_ROUTE_XFER_OK with *xo set, or how it failed (err). */
static int attempt(csd_route_server *s, int up, int path, const conn_state *cs,
                   const csd_route_abort *ab, csd_route_xfer **xo, csd_err *err) {
    const upstream *u = &s->up[up];
    char url[CSD_ROUTE_URL_MAX + 32];
    snprintf(url, sizeof url, "%s%s", u->url,
             path == PATH_CHAT ? "/chat/completions" : "/completions");
    bool owned = false;
    size_t len = 0;
    const char *body = body_for(u, cs, &len, &owned);
    if (!body) {
        csd_err_set(err, CSD_ENOMEM, "the body could not be rewritten for --upstream-model");
        return CSD_ROUTE_XFER_BROKEN;
    }
    int timeout = s->upstream_timeout_s;
    csd_route_xfer_opts o = {
        url, body, len, u->key, timeout < CONNECT_TIMEOUT_S ? timeout : CONNECT_TIMEOUT_S, timeout};
    int rc = csd_route_xfer_create(xo, &o, err);
    if (owned) free((void *)(uintptr_t)body);
    if (rc) return CSD_ROUTE_XFER_BROKEN;
    rc = csd_route_xfer_start(*xo, ab, err);
    if (rc != CSD_ROUTE_XFER_OK) {
        csd_route_xfer_destroy(*xo);
        *xo = NULL;
    }
    return rc;
}

/* The answer when no slot was acquired (rc from csd_route_sched_acquire). */
static enum MHD_Result no_slot(csd_route_server *s, struct MHD_Connection *c, int rc, int last_up,
                               const csd_err *last) {
    if (rc == CSD_EFULL)
        return send_error(c, 429, "rate_limit_error", NULL, "server_busy", "Retry-After",
                          RETRY_AFTER, "every upstream slot and the queue are full; retry shortly");
    if (rc == CSD_ETIMEOUT)
        return send_error(c, 503, "server_error", NULL, "queue_timeout", "Retry-After", RETRY_AFTER,
                          "no upstream slot became free within %d s", s->queue_timeout_s);
    if (rc == CSD_ECANCELED) return MHD_NO; /* nobody to answer: close the connection */
    if (last_up < 0)
        return send_error(c, 502, "server_error", NULL, "upstream_error", NULL, NULL,
                          "no upstream could be tried");
    return send_error(c, 502, "server_error", NULL, "upstream_error", NULL, NULL,
                      "every upstream failed; the last, %.300s: %.150s", s->up[last_up].url,
                      last->msg);
}

/* Answers an HTTP/1.0 client from upstream up's transfer x, read whole (hold_whole); takes x.
 * false when the upstream failed before the end: nothing was sent, err says why, and the slot
 * is still held (the caller gives it back as failed and tries another upstream). */
static bool answer_whole(csd_route_server *s, struct MHD_Connection *c, csd_route_xfer *x,
                         int up, const csd_route_abort *ab, csd_err *err, enum MHD_Result *sent) {
    csd_http_buf b = {0};
    int rc = read_whole(x, ab, &b, err);
    int status = csd_route_xfer_status(x);
    char ctype[CSD_ROUTE_CTYPE_MAX];
    snprintf(ctype, sizeof ctype, "%s", csd_route_xfer_content_type(x));
    /* closed before the slot is given back: the upstream has let go of the request by then */
    csd_route_xfer_destroy(x);
    if (rc == WHOLE_FAILED) {
        csd_http_buf_fini(&b);
        return false;
    }
    csd_route_sched_release(&s->sched, up, false, false);
    idle_timeout(c, true);
    if (rc == WHOLE_OK) *sent = send_whole(c, status, ctype, &b);
    else if (rc == WHOLE_ABORTED) *sent = MHD_NO; /* the client left, or the server stops */
    else
        *sent = send_error(c, 502, "server_error", NULL, "upstream_error", NULL, NULL,
                           "the answer is longer than %zu MiB, the most held for an HTTP/1.0 "
                           "client (HTTP/1.1 gets it as it comes)",
                           WHOLE_ANSWER_MAX >> 20);
    csd_http_buf_fini(&b);
    return true;
}

/* Forwards the request, failing over while nothing was relayed: each upstream at most once. */
static enum MHD_Result forward(csd_route_server *s, struct MHD_Connection *c, int path,
                               const conn_state *cs) {
    watch w = {s, csd_mhd_conn_fd(c)};
    csd_route_abort ab = {should_stop, &w};
    csd_route_waiter waiter;
    memset(&waiter, 0, sizeof waiter);
    double deadline = csd_now_s() + s->queue_timeout_s;
    csd_err last = {0};
    int last_up = -1;
    idle_timeout(c, false);
    for (bool retry = false;; retry = true) {
        if (retry) deadline = csd_now_s() + s->queue_timeout_s; /* a wait of its own */
        int up = csd_route_sched_acquire(&s->sched, &waiter, retry, deadline, &ab);
        if (up < 0) {
            idle_timeout(c, true);
            return no_slot(s, c, up, last_up, &last);
        }
        csd_route_xfer *x = NULL;
        csd_err err = {0};
        int rc = attempt(s, up, path, cs, &ab, &x, &err);
        if (rc == CSD_ROUTE_XFER_OK && !empty_answer(x) && hold_whole(cs, x)) {
            enum MHD_Result sent;
            if (answer_whole(s, c, x, up, &ab, &err, &sent)) return sent;
            rc = CSD_ROUTE_XFER_BROKEN; /* nothing was sent: the next upstream may answer */
        } else if (rc == CSD_ROUTE_XFER_OK) {
            idle_timeout(c, true);
            return empty_answer(x) ? relay_empty(s, c, x, up) : start_relay(s, c, x, up, w.fd);
        }
        bool failed = rc != CSD_ROUTE_XFER_ABORTED;
        csd_route_sched_release(&s->sched, up, failed, rc == CSD_ROUTE_XFER_CONNECT);
        if (!failed) return MHD_NO; /* the client left, or the server stops */
        CSD_LOGW("upstream failed, trying another upstream=%s error=%s", s->up[up].url, err.msg);
        waiter.tried |= UINT32_C(1) << up;
        last = err;
        last_up = up;
    }
}

/* Checks the body is a JSON object whose "stream", if any, is a boolean; then forwards it. Read
 * as the upstream will (NUL characters, integers of any size): only the shape is checked here. */
static enum MHD_Result handle_forward(csd_route_server *s, struct MHD_Connection *c, int path,
                                      const conn_state *cs) {
    if (!cs->body.buf.len)
        return send_error(c, 400, "invalid_request_error", NULL, "invalid_json", NULL, NULL,
                          "the request body is empty; send a JSON object");
    json_error_t je;
    json_t *root = json_loadb(cs->body.buf.data, cs->body.buf.len,
                              JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!root)
        return send_error(c, 400, "invalid_request_error", NULL, "invalid_json", NULL, NULL,
                          "the request body is not valid JSON: %.200s (line %d, column %d)",
                          je.text, je.line, je.column);
    json_t *stream = json_object_get(root, "stream");
    bool object = json_is_object(root), streams = json_is_true(stream);
    bool bad_stream = stream && !json_is_null(stream) && !json_is_boolean(stream);
    json_decref(root); /* not held while the request waits */
    if (!object)
        return send_error(c, 400, "invalid_request_error", NULL, "invalid_json", NULL, NULL,
                          "the request body is not a JSON object");
    if (bad_stream)
        return send_error(c, 400, "invalid_request_error", "stream", "invalid_type", NULL, NULL,
                          "'stream' must be a boolean");
    CSD_LOGD("forwarding path=%s stream=%d bytes=%zu", path == PATH_CHAT ? "chat" : "completions",
             streams, cs->body.buf.len);
    return forward(s, c, path, cs);
}

/* ---- MHD glue ---- */

/* The first call of a request: headers only. Answers at once what needs no body. */
static enum MHD_Result on_headers(csd_route_server *s, struct MHD_Connection *c, conn_state *cs,
                                  const char *method) {
    if (cs->path == PATH_NONE) {
        cs->replied = true;
        return send_error(c, 404, "invalid_request_error", NULL, "not_found", NULL, NULL,
                          "Unknown request URL; see /v1/chat/completions, /v1/completions, "
                          "/v1/models, /health, /metrics");
    }
    bool post = path_is_post(cs->path);
    if (strcmp(method, post ? "POST" : "GET") != 0 && (post || strcmp(method, "HEAD") != 0)) {
        cs->replied = true;
        return send_error(c, 405, "invalid_request_error", NULL, "method_not_allowed", "Allow",
                          post ? "POST" : "GET, HEAD", "Only %s is allowed here",
                          post ? "POST" : "GET");
    }
    if (!authorized(s, c, cs->path)) {
        cs->replied = true;
        return send_error(c, 401, "invalid_request_error", NULL, "invalid_api_key",
                          "WWW-Authenticate", "Bearer",
                          "Missing or incorrect API key: send 'Authorization: Bearer KEY'");
    }
    /* a declared body far beyond the limit is refused now; a slightly larger one is read and
     * dropped so the client (still sending) reliably sees the 413, as serve does */
    if (csd_mhd_body_declared_too_large(c, s->max_body)) {
        cs->replied = true;
        return send_error(c, 413, "invalid_request_error", NULL, "request_too_large", NULL, NULL,
                          "The request body is larger than %zu bytes", s->max_body);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    csd_route_server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = csd_alloc(sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        cs->path = path_of(url);
        cs->http10 = version && !strcmp(version, MHD_HTTP_VERSION_1_0);
        return on_headers(s, c, cs, method);
    }
    if (cs->replied) { /* discard the body of a request already answered */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        bool kept = csd_mhd_body_add(&cs->body, upload, *upload_size, s->max_body);
        *upload_size = 0;
        return kept ? MHD_YES : MHD_NO;
    }
    cs->replied = true; /* the whole body is here */
    if (cs->body.too_large)
        return send_error(c, 413, "invalid_request_error", NULL, "request_too_large", NULL, NULL,
                          "The request body is larger than %zu bytes", s->max_body);
    switch (cs->path) {
    case PATH_CHAT:
    case PATH_COMPLETIONS:
        return handle_forward(s, c, cs->path, cs);
    case PATH_MODELS:
    case PATH_MODEL_ONE:
        return handle_models(s, c, url, cs->path);
    case PATH_HEALTH:
        return handle_health(s, c);
    case PATH_METRICS:
        return handle_metrics(s, c);
    default:
        return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    csd_http_buf_fini(&cs->body.buf);
    csd_free(cs);
    *con_cls = NULL;
}

/* ---- lifecycle ---- */

/* Connections to hold at once: every request running or queued holds its own, and /health,
 * /metrics and the refusals of a full queue need room beside them. */
static int connections_needed(const csd_route_opts *o) {
    int n = CSD_ROUTE_SPARE_CONNECTIONS + o->queue_max;
    for (int i = 0; i < o->n_upstreams; i++) n += o->upstreams[i].max;
    return n;
}

static int check_opts(const csd_route_opts *o, csd_err *err) {
    if (o->n_upstreams < 1 || o->n_upstreams > CSD_ROUTE_MAX_UPSTREAMS)
        return csd_err_set(err, CSD_ERANGE, "%d upstreams: 1 to %d are served", o->n_upstreams,
                           CSD_ROUTE_MAX_UPSTREAMS);
    for (int i = 0; i < o->n_upstreams; i++) {
        const csd_route_upstream_opts *u = &o->upstreams[i];
        int rc = csd_route_url_check(u->url, err);
        if (rc) return rc;
        if (u->max < 1 || u->max > CSD_ROUTE_MAX_IN_FLIGHT)
            return csd_err_set(err, CSD_ERANGE, "upstream %s: max %d not in 1..%d", u->url, u->max,
                               CSD_ROUTE_MAX_IN_FLIGHT);
    }
    if (o->queue_max < 0 || o->queue_timeout_s < 1 || o->upstream_timeout_s < 1 ||
        o->max_body < 1 || o->port < 0 || o->port > 65535)
        return csd_err_set(err, CSD_ERANGE, "queue, timeouts, body limit or port out of range");
    if (!o->model_name || !o->model_name[0])
        return csd_err_set(err, CSD_EINVAL, "the router needs a model name");
    if (connections_needed(o) > CSD_ROUTE_MAX_CONNECTIONS)
        return csd_err_set(err, CSD_ERANGE,
                           "the upstreams' --max (in all) and --queue need %d connections, a "
                           "thread each; at most %d",
                           connections_needed(o), CSD_ROUTE_MAX_CONNECTIONS);
    return 0;
}

/* Copies the upstreams (URLs without a trailing slash) and the strings. false: out of memory. */
static bool copy_opts(csd_route_server *s, const csd_route_opts *o) {
    s->n_up = o->n_upstreams;
    for (int i = 0; i < s->n_up; i++) {
        const csd_route_upstream_opts *u = &o->upstreams[i];
        upstream *d = &s->up[i];
        d->url = csd_strdup(u->url);
        if (!d->url) return false;
        for (size_t n = strlen(d->url); n > 8 && d->url[n - 1] == '/'; n--) d->url[n - 1] = 0;
        if (u->key && !(d->key = csd_strdup(u->key))) return false;
        if (u->model && !(d->model = csd_strdup(u->model))) return false;
    }
    s->model_name = csd_strdup(o->model_name);
    if (o->api_key && o->api_key[0] && !(s->api_key = csd_strdup(o->api_key))) return false;
    return s->model_name != NULL;
}

int csd_route_server_create(csd_route_server **out, const csd_route_opts *opts, csd_err *err) {
    *out = NULL;
    int rc = check_opts(opts, err);
    if (rc) return rc;
    csd_route_server *s = csd_alloc(sizeof *s);
    if (!s) return csd_err_set(err, CSD_ENOMEM, "router");
    s->max_body = opts->max_body;
    s->queue_timeout_s = opts->queue_timeout_s;
    s->upstream_timeout_s = opts->upstream_timeout_s;
    s->started = (long long)time(NULL);
    s->max_connections = connections_needed(opts);
    if (s->max_connections < CSD_ROUTE_MIN_CONNECTIONS)
        s->max_connections = CSD_ROUTE_MIN_CONNECTIONS;
    if (!copy_opts(s, opts)) {
        rc = csd_err_set(err, CSD_ENOMEM, "router");
        goto fail;
    }
    int max[CSD_ROUTE_MAX_UPSTREAMS];
    for (int i = 0; i < s->n_up; i++) max[i] = opts->upstreams[i].max;
    if ((rc = csd_route_sched_init(&s->sched, s->n_up, max, opts->queue_max))) {
        csd_err_set(err, rc, "router: cannot create its lock");
        goto fail;
    }
    s->sched_ready = true;
    if ((rc = csd_route_proxy_global_init(err))) goto fail;
    s->curl_ready = true;
    csd_mhd_listen l = {opts->host ? opts->host : "127.0.0.1", opts->port,
                        (unsigned)s->max_connections, CSD_ROUTE_IDLE_TIMEOUT, 0};
    if ((rc = csd_mhd_start(&s->mhd, &s->port, &l, on_request, on_completed, s, err))) goto fail;
    *out = s;
    return 0;
fail:
    csd_route_server_destroy(s);
    return rc;
}

int csd_route_server_port(const csd_route_server *s) { return s->port; }

void csd_route_server_destroy(csd_route_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1); /* waiting connections give up within a poll */
    if (s->mhd) MHD_stop_daemon(s->mhd);
    if (s->curl_ready) csd_route_proxy_global_fini();
    if (s->sched_ready) csd_route_sched_fini(&s->sched);
    for (int i = 0; i < s->n_up; i++) {
        csd_free(s->up[i].url);
        csd_free(s->up[i].key);
        csd_free(s->up[i].model);
    }
    csd_free(s->api_key);
    csd_free(s->model_name);
    csd_free(s);
}
