/* server: libmicrohttpd front end of the OpenAI API (see server.h). One thread per connection: a
 * handler parses the body, renders and tokenizes the prompt, submits it to the engine and then
 * waits for its job (http_job.c), streaming SSE through a content-reader callback. Routing,
 * authentication, limits, /health, /models and /metrics live here; the plumbing it shares with the
 * router (src/route) is src/mhd's. Only src/mhd, src/http and src/route include microhttpd.h. */
#include "server.h"

#include <microhttpd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sodium.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/build_info.h"
#include "core/clock.h"
#include "core/log.h"
#include "mhd/mhd_glue.h"
#include "http_internal.h"
#include "tok_gate.h"
#include "tokenize_api.h"
#include "openai_request.h"

/* Bytes of SSE handed to MHD per content-reader call. */
#define STREAM_BLOCK 16384
/* Seconds clients should wait before retrying a 429 / 503. */
#define RETRY_AFTER_FULL "1"
#define RETRY_AFTER_LOADING "5"

enum route {
    ROUTE_NONE = 0,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_MODELS,
    ROUTE_MODEL_ONE, /* GET /v1/models/{id} */
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,   /* POST /tokenize (llama-server, vLLM) */
    ROUTE_DETOKENIZE, /* POST /detokenize */
    ROUTE_COUNT
};

/* HTTP status classes counted for /metrics. */
enum status_class { SC_2XX = 0, SC_4XX, SC_5XX, SC_COUNT };

struct csd_http_server {
    struct MHD_Daemon *mhd;
    _Atomic(csd_engine *) engine;
    const csd_tok *tok;
    const csd_vocab_bytes *json_vocab; /* borrowed; NULL: response_format json_object refused */
    bool reasoning_none;               /* --reasoning-format none */
    int tool_format;                   /* enum csd_tool_split_mode: tags, bare or mistral */
    const csd_chat_template *tmpl;
    char *api_key;
    char *model_name;
    size_t max_body;
    unsigned idle_timeout_s; /* MHD's per-connection timeout, restored after each wait for tokens */
    int port;
    atomic_int draining; /* csd_http_server_drain: new generation requests get 503 */
    atomic_int stopping; /* csd_http_server_destroy: requests still running are stopped */
    atomic_int in_flight; /* generation requests between their body and their last byte */
    atomic_llong http_status[SC_COUNT];
    atomic_llong http_by_code[600]; /* responses by status code (/metrics) */
    atomic_llong client_cancels;    /* requests cancelled because the client went away */
    long long started;              /* unix seconds, for /v1/models "created" */
    csd_tok_gate tok_gate;          /* bounds the text being tokenized at once */
};

/* Per connection (MHD's con_cls): the body being received. */
typedef struct conn_state {
    int route;
    bool replied; /* a response was queued on the first call (401, 413, ...) */
    bool in_flight; /* a generation request, counted in the server's in_flight until completed */
    csd_mhd_body body;
} conn_state;

/* Per streaming response: the job and the socket it watches. */
typedef struct stream_state {
    csd_http_server *srv;
    csd_http_job *job;
    struct MHD_Connection *conn;
    int fd;
    bool cancelled; /* the reader already cancelled the request (count it once) */
} stream_state;

void csd_http_opts_default(csd_http_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_body = CSD_HTTP_DEFAULT_MAX_BODY;
    o->max_connections = CSD_HTTP_DEFAULT_MAX_CONNECTIONS;
    o->idle_timeout_s = CSD_HTTP_DEFAULT_IDLE_TIMEOUT;
}

/* ---- responses ---- */

static enum MHD_Result send_body(csd_http_server *s, struct MHD_Connection *c, int status,
                                 const char *ctype, const char *body, size_t len, const char *h1,
                                 const char *v1) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)(uintptr_t)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (h1) MHD_add_response_header(r, h1, v1);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    atomic_fetch_add(&s->http_status[status < 300 ? SC_2XX : status < 500 ? SC_4XX : SC_5XX], 1);
    if (status > 0 && status < 600) atomic_fetch_add(&s->http_by_code[status], 1);
    return ret;
}

static enum MHD_Result send_json(csd_http_server *s, struct MHD_Connection *c, int status,
                                 const char *json, const char *h1, const char *v1) {
    return send_body(s, c, status, "application/json", json, strlen(json), h1, v1);
}

static enum MHD_Result send_error(csd_http_server *s, struct MHD_Connection *c,
                                  const csd_http_error *e, const char *h1, const char *v1) {
    char *json = csd_http_error_json(e);
    enum MHD_Result ret = send_json(s, c, e->status, json ? json : "{\"error\":{}}", h1, v1);
    free(json);
    return ret;
}

static enum MHD_Result send_error_msg(csd_http_server *s, struct MHD_Connection *c, int status,
                                      const char *type, const char *param, const char *code,
                                      const char *msg, const char *h1, const char *v1) {
    csd_http_error e;
    csd_http_error_set(&e, status, type, param, code, "%s", msg);
    return send_error(s, c, &e, h1, v1);
}

/* ---- routing and auth ---- */

static int route_of(const char *url) {
    /* the /v1 prefix is optional, as in llama-server */
    if (strncmp(url, "/v1/", 4) == 0) url += 3;
    if (!strcmp(url, "/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/completions")) return ROUTE_COMPLETIONS;
    if (!strcmp(url, "/models")) return ROUTE_MODELS;
    if (!strncmp(url, "/models/", 8) && url[8]) return ROUTE_MODEL_ONE;
    if (!strcmp(url, "/health")) return ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return ROUTE_METRICS;
    if (!strcmp(url, "/tokenize")) return ROUTE_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return ROUTE_DETOKENIZE;
    return ROUTE_NONE;
}

static bool route_is_post(int route) {
    return route == ROUTE_CHAT || route == ROUTE_COMPLETIONS || route == ROUTE_TOKENIZE ||
           route == ROUTE_DETOKENIZE;
}

static bool authorized(const csd_http_server *s, struct MHD_Connection *c, int route) {
    if (!s->api_key || route == ROUTE_HEALTH || route == ROUTE_METRICS) return true;
    return csd_mhd_bearer_ok(c, s->api_key);
}

/* ---- GET endpoints ---- */

static json_t *model_object(const csd_http_server *s) {
    csd_engine *e = atomic_load(&s->engine);
    json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", s->model_name, "object", "model", "created",
                          (json_int_t)s->started, "owned_by", "cascadia");
    if (m && e) json_object_set_new(m, "max_model_len", json_integer(csd_engine_max_ctx(e)));
    return m;
}

static enum MHD_Result handle_models(csd_http_server *s, struct MHD_Connection *c, const char *url,
                                     int route) {
    json_t *root;
    if (route == ROUTE_MODEL_ONE) {
        const char *id = strstr(url, "/models/") + 8;
        if (strcmp(id, s->model_name) != 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "The model '%.100s' does not exist", id);
            return send_error_msg(s, c, 404, "invalid_request_error", "model", "model_not_found",
                                  msg, NULL, NULL);
        }
        root = model_object(s);
    } else {
        root = json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(s));
    }
    char *body = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    enum MHD_Result ret =
        body ? send_json(s, c, 200, body, NULL, NULL)
             : send_error_msg(s, c, 500, "server_error", NULL, NULL, "out of memory", NULL, NULL);
    free(body);
    return ret;
}

static enum MHD_Result handle_health(csd_http_server *s, struct MHD_Connection *c) {
    if (atomic_load(&s->draining)) /* a load balancer stops sending requests here */
        return send_json(s, c, 503, "{\"status\":\"shutting_down\"}", "Connection", "close");
    csd_engine *e = atomic_load(&s->engine);
    if (e && csd_engine_ready(e)) return send_json(s, c, 200, "{\"status\":\"ok\"}", NULL, NULL);
    return send_json(s, c, 503, "{\"status\":\"loading\"}", "Retry-After", RETRY_AFTER_LOADING);
}

static void metric(csd_http_buf *b, const char *name, const char *type, const char *help,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Appends "# HELP", "# TYPE" and the sample lines (fmt gives the lines, each ending in \n). */
static void metric(csd_http_buf *b, const char *name, const char *type, const char *help,
                   const char *fmt, ...) {
    csd_http_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    va_list ap;
    va_start(ap, fmt);
    csd_http_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

/* The engine's counters and gauges (zeros while the model loads). */
static void append_engine_metrics(csd_http_buf *b, const csd_engine_stats *st, int ready,
                                  long long client_cancels) {
    metric(b, "cascadia_ready", "gauge", "1 when the model is loaded and a pipeline can serve.",
           "cascadia_ready %d\n", ready);
    metric(b, "cascadia_requests_total", "counter", "Generation requests admitted to the engine.",
           "cascadia_requests_total %lld\n", (long long)st->requests_total);
    metric(b, "cascadia_requests_rejected_total", "counter",
           "Generation requests refused because every slot and the queue were full (HTTP 429).",
           "cascadia_requests_rejected_total %lld\n", (long long)st->requests_rejected);
    metric(b, "cascadia_requests_client_cancelled_total", "counter",
           "Requests cancelled because the client disconnected.",
           "cascadia_requests_client_cancelled_total %lld\n", client_cancels);
    metric(b, "cascadia_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
           "cascadia_prompt_tokens_total %lld\n", (long long)st->prompt_tokens_total);
    metric(b, "cascadia_completion_tokens_total", "counter", "Generated tokens.",
           "cascadia_completion_tokens_total %lld\n", (long long)st->completion_tokens_total);
    metric(b, "cascadia_time_to_first_token_seconds", "summary",
           "Time from submission to the first generated token.",
           "cascadia_time_to_first_token_seconds_sum %.9f\n"
           "cascadia_time_to_first_token_seconds_count %lld\n",
           st->ttft_sum_s, (long long)st->ttft_count);
    metric(b, "cascadia_inter_token_latency_seconds", "summary",
           "Time between consecutive generated tokens of a request->",
           "cascadia_inter_token_latency_seconds_sum %.9f\n"
           "cascadia_inter_token_latency_seconds_count %lld\n",
           st->itl_sum_s, (long long)st->itl_count);
    metric(b, "cascadia_step_duration_seconds", "summary", "Duration of batched forward steps.",
           "cascadia_step_duration_seconds_sum %.9f\ncascadia_step_duration_seconds_count %lld\n",
           st->step_sum_s, (long long)st->step_count);
    metric(b, "cascadia_queue_depth", "gauge", "Requests waiting for a slot.",
           "cascadia_queue_depth %d\n", st->queue_depth);
    metric(b, "cascadia_active_requests", "gauge", "Requests holding a slot (prefill or decode).",
           "cascadia_active_requests %d\n", st->active);
    metric(b, "cascadia_slots", "gauge", "Request slots over all pipelines.", "cascadia_slots %d\n",
           st->slots);
    metric(b, "cascadia_prefix_cache_hits_total", "counter",
           "Requests that started from a cached prompt prefix, or from another choice's prompt "
           "(n), instead of recomputing it.",
           "cascadia_prefix_cache_hits_total %lld\n", (long long)st->prefix_hits);
    metric(b, "cascadia_prefix_cache_tokens_total", "counter",
           "Prompt tokens reused from the prefix cache or another choice (not recomputed).",
           "cascadia_prefix_cache_tokens_total %lld\n", (long long)st->prefix_tokens);
    metric(b, "cascadia_prefix_cache_refused_total", "counter",
           "Requests a stage refused after they copied prompt KV (a worker had evicted the "
           "source, say): they computed their whole prompt instead.",
           "cascadia_prefix_cache_refused_total %lld\n", (long long)st->prefix_refused);
    metric(b, "cascadia_prefix_cache_entries", "gauge", "Prompts whose KV is held for reuse.",
           "cascadia_prefix_cache_entries %d\n", st->prefix_entries);
    metric(b, "cascadia_requests_rerouted_total", "counter",
           "Requests a replica refused or lost, put back in the queue for a replica (before "
           "their first token: started over; after: resumed).",
           "cascadia_requests_rerouted_total %lld\n", (long long)st->requests_rerouted);
    metric(b, "cascadia_requests_resumed_total", "counter",
           "Requests whose replica was lost after tokens went out, resumed where they were (on "
           "another replica, or theirs once back).",
           "cascadia_requests_resumed_total %lld\n", (long long)st->requests_resumed);
    metric(b, "cascadia_spec_draft_tokens_total", "counter",
           "Draft tokens speculative decoding proposed and computed (--spec-draft).",
           "cascadia_spec_draft_tokens_total %lld\n", (long long)st->spec_draft_tokens);
    metric(b, "cascadia_spec_accepted_tokens_total", "counter",
           "Draft tokens the model agreed with: each saved a step.",
           "cascadia_spec_accepted_tokens_total %lld\n", (long long)st->spec_accepted_tokens);
}

/* Responses by status code (a code appears once it has been sent), and the shutdown state. */
static void append_http_metrics(csd_http_buf *b, csd_http_server *s) {
    metric(b, "cascadia_http_requests_in_flight", "gauge",
           "Generation requests taken and not yet fully answered.",
           "cascadia_http_requests_in_flight %d\n", atomic_load(&s->in_flight));
    metric(b, "cascadia_draining", "gauge",
           "1 once the server is shutting down: new generation requests get 503.",
           "cascadia_draining %d\n", atomic_load(&s->draining));
    static const char http_head[] =
        "# HELP cascadia_http_responses_total HTTP responses by status code.\n"
        "# TYPE cascadia_http_responses_total counter\n";
    csd_http_buf_append(b, http_head, sizeof http_head - 1);
    for (int code = 100; code < 600; code++) {
        long long n = atomic_load(&s->http_by_code[code]);
        if (!n) continue;
        csd_http_buf_printf(b, "cascadia_http_responses_total{code=\"%d\"} %lld\n", code, n);
    }
}

/* Prometheus' build_info convention: a constant 1 whose labels say which binary is serving. */
static void append_build_info(csd_http_buf *b) {
    metric(b, "cascadia_build_info", "gauge",
           "Always 1; the labels name the version and the git commit of this server.",
           "cascadia_build_info{version=\"%s\",commit=\"%s\"} 1\n", csd_version(),
           csd_build_commit());
}

static enum MHD_Result handle_metrics(csd_http_server *s, struct MHD_Connection *c) {
    csd_engine_stats st;
    memset(&st, 0, sizeof st);
    csd_engine *e = atomic_load(&s->engine);
    if (e) csd_engine_get_stats(e, &st);
    csd_http_buf b = {0};
    append_engine_metrics(&b, &st, e && csd_engine_ready(e) ? 1 : 0,
                          (long long)atomic_load(&s->client_cancels));
    append_http_metrics(&b, s);
    append_build_info(&b);
    enum MHD_Result ret = send_body(s, c, 200, "text/plain; version=0.0.4; charset=utf-8",
                                    b.data ? b.data : "", b.len, NULL, NULL);
    csd_http_buf_fini(&b);
    return ret;
}

/* ---- generation endpoints ---- */

static bool starts_with(const char *s, const char *prefix) {
    return prefix[0] && strncmp(s, prefix, strlen(prefix)) == 0;
}

/* How the answer's thinking is split from it (http/think_split.h): only chat answers that are not
 * constrained to JSON, unless --reasoning-format none. */
static int think_mode(const csd_http_server *s, const csd_http_req *req, const char *prompt) {
    if (s->reasoning_none || req->json_object) return CSD_HTTP_THINK_OFF;
    return csd_think_prompt_opens(prompt) ? CSD_HTTP_THINK_OPEN : CSD_HTTP_THINK_SPLIT;
}

/* The template's variables besides messages and tools: chat_template_kwargs and tool_choice. NULL
 * when there are none, or when out of memory. */
static json_t *template_extra(const csd_http_req *req) {
    if (!req->tool_choice && !req->template_kwargs) return NULL;
    json_t *extra = req->template_kwargs ? json_deep_copy(req->template_kwargs) : json_object();
    if (extra && req->tool_choice) json_object_set(extra, "tool_choice", req->tool_choice);
    return extra;
}

/* Renders the chat template and tokenizes. The template normally writes BOS itself; only when it
 * does not (its text does not start with the BOS string) do the tokenizer's rules add one. Sets
 * req->think from the rendered prompt. */
static int chat_prompt(const csd_http_server *s, csd_http_req *req, int32_t **ids, size_t *n,
                       csd_http_error *e) {
    if (!s->tmpl)
        return csd_http_error_set(e, 400, NULL, "messages", "unsupported_value",
                                  "this model has no chat template: use /v1/completions, or "
                                  "start the server with --chat-template");
    csd_chat_apply_params ap;
    memset(&ap, 0, sizeof ap);
    ap.messages = req->messages;
    ap.tools = req->tools;
    ap.add_generation_prompt = true;
    ap.bos_token = csd_tok_bos_text(s->tok);
    ap.eos_token = csd_tok_eos_text(s->tok);
    json_t *extra = template_extra(req);
    if (!extra && (req->tool_choice || req->template_kwargs))
        return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    ap.extra = extra;
    char *text = NULL;
    csd_err err = {0};
    int rc = csd_chat_template_apply(s->tmpl, &ap, &text, &err);
    json_decref(extra);
    if (rc)
        return csd_http_error_set(e, 400, NULL, "messages", "invalid_value",
                                  "the chat template failed on these messages: %s", err.msg);
    req->think = think_mode(s, req, text);
    req->tool_format = s->tool_format;
    bool add_special = !starts_with(text, csd_tok_bos_text(s->tok));
    rc = csd_tok_encode(s->tok, text, strlen(text), add_special, true, ids, n, &err);
    csd_free(text);
    if (rc)
        return csd_http_error_set(e, 400, NULL, "messages", "invalid_value",
                                  "could not tokenize the prompt: %s", err.msg);
    return 0;
}

static int completion_prompt(const csd_http_server *s, const csd_http_req *req, int32_t **ids,
                             size_t *n, csd_http_error *e) {
    if (req->prompt_ids) {
        *ids = csd_alloc_array((size_t)req->n_prompt_ids, sizeof **ids);
        if (!*ids) return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, req->prompt_ids, (size_t)req->n_prompt_ids * sizeof **ids);
        *n = (size_t)req->n_prompt_ids;
        return 0;
    }
    csd_err err = {0};
    /* the same tokenization as `cascadia run -p` (the tokenizer's BOS rules, special strings
     * taken literally), so greedy output matches it */
    if (csd_tok_encode(s->tok, req->prompt, req->prompt_len, true, false, ids, n, &err))
        return csd_http_error_set(e, 400, NULL, "prompt", "invalid_value",
                                  "could not tokenize the prompt: %s", err.msg);
    if (*n == 0)
        return csd_http_error_set(e, 400, NULL, "prompt", "invalid_value", "'prompt' is empty");
    return 0;
}

/* The next bytes of a stream, waiting for them as long as generation takes. A connection waiting
 * for its tokens is not idle: the idle timeout is off during the wait (the job notices a client
 * that hangs up), and set again after it, which restarts its count, so that it still closes a
 * client that stops reading what is sent. libmicrohttpd would otherwise count the whole wait
 * (a queued request, a long prompt) as idle and close the stream after its headers. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_state *ss = cls;
    MHD_set_connection_option(ss->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    ssize_t n = csd_http_job_read(ss->job, buf, max < STREAM_BLOCK ? max : STREAM_BLOCK, ss->fd,
                                  &ss->srv->stopping);
    MHD_set_connection_option(ss->conn, MHD_CONNECTION_OPTION_TIMEOUT, ss->srv->idle_timeout_s);
    if (n > 0) return n;
    if (n < 0) { /* the client left, or (not counted) the server stops */
        if (!ss->cancelled && !atomic_load(&ss->srv->stopping))
            atomic_fetch_add(&ss->srv->client_cancels, 1);
        ss->cancelled = true;
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return MHD_CONTENT_READER_END_OF_STREAM;
}

/* MHD calls this when the response is finished or the connection failed mid-stream. */
static void stream_free(void *cls) {
    stream_state *ss = cls;
    pthread_mutex_lock(&ss->job->mu);
    bool done = csd_http_job_done(ss->job);
    pthread_mutex_unlock(&ss->job->mu);
    if (!done && !ss->cancelled) { /* a write failed before the end: the client went away */
        csd_http_job_cancel(ss->job);
        atomic_fetch_add(&ss->srv->client_cancels, 1);
    }
    csd_http_job_release(ss->job);
    csd_free(ss);
}

static enum MHD_Result start_stream(csd_http_server *s, struct MHD_Connection *c, csd_http_job *j) {
    stream_state *ss = csd_alloc(sizeof *ss);
    if (!ss) {
        csd_http_job_cancel(j);
        csd_http_job_release(j);
        return send_error_msg(s, c, 500, "server_error", NULL, NULL, "out of memory", NULL, NULL);
    }
    ss->srv = s;
    ss->job = j;
    ss->conn = c;
    ss->fd = csd_mhd_conn_fd(c);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK,
                                                               stream_reader, ss, stream_free);
    if (!r) {
        stream_free(ss);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    atomic_fetch_add(&s->http_status[SC_2XX], 1);
    atomic_fetch_add(&s->http_by_code[200], 1);
    return ret;
}

/* vLLM's chat form of /tokenize: the ids a chat completion with these messages would start
 * from (the template rendered with the generation prompt). NULL with e set. */
static char *tokenize_chat(const csd_http_server *s, const json_t *root, int64_t max_ctx,
                           csd_http_error *e) {
    csd_http_req req;
    if (csd_http_req_parse_object(&req, CSD_HTTP_KIND_CHAT, root, csd_tok_vocab_size(s->tok), e))
        return NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *out = NULL;
    bool rendered = chat_prompt(s, &req, &ids, &n, e) == 0; /* else e is set */
    if (rendered && n > CSD_HTTP_MAX_PROMPT_IDS) /* the bound of the text form (tokenize_api.c) */
        csd_http_error_set(e, 400, NULL, "messages", "invalid_value",
                           "the rendered messages are %zu tokens; /tokenize answers at most %d",
                           n, CSD_HTTP_MAX_PROMPT_IDS);
    else if (rendered && !(out = csd_http_tokens_json(s->tok, ids, n, false, max_ctx)))
        csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    csd_free(ids);
    csd_http_req_fini(&req);
    return out;
}

/* POST /tokenize, /detokenize: the tokenizer (and template) only, so they answer while the model
 * loads too. */
static enum MHD_Result handle_tokenizer(csd_http_server *s, struct MHD_Connection *c, int route,
                                        const conn_state *cs) {
    csd_engine *engine = atomic_load(&s->engine);
    int64_t max_ctx = engine ? csd_engine_max_ctx(engine) : 0;
    csd_http_error e;
    memset(&e, 0, sizeof e);
    char *body = NULL;
    json_t *root = NULL; /* the /tokenize body, parsed once to tell its two forms apart */
    csd_tok_gate_enter(&s->tok_gate, cs->body.buf.len);
    if (route == ROUTE_DETOKENIZE)
        body = csd_http_detokenize(s->tok, cs->body.buf.data, cs->body.buf.len, &e);
    else if ((root = csd_http_body_object(cs->body.buf.data, cs->body.buf.len, &e)))
        body = csd_http_tokenize_is_chat(root)
                   ? tokenize_chat(s, root, max_ctx, &e)
                   : csd_http_tokenize_object(s->tok, root, max_ctx, &e);
    json_decref(root);
    csd_tok_gate_leave(&s->tok_gate, cs->body.buf.len);
    enum MHD_Result ret =
        body ? send_json(s, c, 200, body, NULL, NULL) : send_error(s, c, &e, NULL, NULL);
    free(body);
    return ret;
}

/* Gives every choice of j to the engine, the same prompt each, all or none (a choice never holds a
 * slot while its siblings cannot get one). Choice i samples with seed + i when the request set one
 * (each choice reproducible, and no two alike), else with a fresh seed. */
static int submit_choices(csd_engine *engine, csd_http_job *j, const int32_t *ids, int64_t n_ids,
                          const csd_req_params *base, bool has_seed, csd_err *err) {
    static atomic_ullong counter;
    csd_req_callbacks cb = {csd_http_job_on_token, csd_http_job_on_done};
    csd_req_params rp[CSD_HTTP_MAX_N];
    void *ctx[CSD_HTTP_MAX_N];
    uint64_t engine_ids[CSD_HTTP_MAX_N];
    for (int i = 0; i < j->n_choices; i++) {
        rp[i] = *base;
        uint64_t k = atomic_fetch_add(&counter, 1);
        /* a fresh seed per choice without one in the request, as OpenAI */
        rp[i].sampling.seed = has_seed ? base->sampling.seed + (uint64_t)i
                                       : csd_now_ns() ^ (k * 0x9e3779b97f4a7c15ull);
        ctx[i] = &j->choices[i];
    }
    /* the job is not shared yet (no lock needed); counted before the first choice can finish */
    j->n_submitted = j->n_choices;
    j->refs += j->n_choices; /* the engine's references, one dropped by each on_done */
    int rc = csd_engine_submit_group(engine, ids, n_ids, rp, j->n_choices, &cb, ctx, engine_ids,
                                     err);
    if (rc) { /* none was queued: no callback will come */
        j->n_submitted = 0;
        j->refs -= j->n_choices;
        return rc;
    }
    for (int i = 0; i < j->n_choices; i++) j->choices[i].engine_id = engine_ids[i];
    return 0;
}

static enum MHD_Result handle_generate(csd_http_server *s, struct MHD_Connection *c, int route,
                                       conn_state *cs) {
    /* counted before draining is read, so that a drain that sees none in flight has made every
     * later request see it (both are sequentially consistent) */
    cs->in_flight = true;
    atomic_fetch_add(&s->in_flight, 1);
    if (atomic_load(&s->draining))
        return send_error_msg(s, c, 503, "server_error", NULL, "server_shutting_down",
                              "the server is shutting down; send the request to another "
                              "server or retry later",
                              "Connection", "close");
    csd_engine *engine = atomic_load(&s->engine);
    if (!engine || !csd_engine_ready(engine))
        return send_error_msg(s, c, 503, "server_error", NULL, "model_loading",
                              "the model is still loading; retry shortly", "Retry-After",
                              RETRY_AFTER_LOADING);
    int kind = route == ROUTE_CHAT ? CSD_HTTP_KIND_CHAT : CSD_HTTP_KIND_COMPLETION;
    csd_http_req req;
    csd_http_error e;
    const csd_http_buf *in = &cs->body.buf;
    if (csd_http_req_parse(&req, kind, in->data, in->len, csd_tok_vocab_size(s->tok), &e))
        return send_error(s, c, &e, NULL, NULL);
    enum MHD_Result ret;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    csd_http_job *j = NULL;
    if (req.json_object && !s->json_vocab) {
        if (req.tool_mode == CSD_HTTP_TOOLS_NAMED || req.tool_mode == CSD_HTTP_TOOLS_PICK)
            csd_http_error_set(&e, 400, NULL, "tool_choice", "unsupported_value",
                               "a forced tool call is not available on this server");
        else
            csd_http_error_set(&e, 400, NULL, "response_format", "unsupported_value",
                               "response_format '%s' is not available on this server",
                               req.json_schema ? "json_schema" : "json_object");
        ret = send_error(s, c, &e, NULL, NULL);
        goto done;
    }
    if (req.model && strcmp(req.model, s->model_name) != 0) {
        csd_http_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                           "The model '%.100s' does not exist (this server serves '%.100s')",
                           req.model, s->model_name);
        ret = send_error(s, c, &e, NULL, NULL);
        goto done;
    }
    csd_tok_gate_enter(&s->tok_gate, cs->body.buf.len);
    int rc = kind == CSD_HTTP_KIND_CHAT ? chat_prompt(s, &req, &ids, &n_ids, &e)
                                        : completion_prompt(s, &req, &ids, &n_ids, &e);
    csd_tok_gate_leave(&s->tok_gate, cs->body.buf.len);
    if (!rc && atomic_load(&s->stopping)) /* stopped while this prompt was tokenized */
        rc = csd_http_error_set(&e, 503, "server_error", NULL, "server_shutting_down",
                                "the server is shutting down; send the request to another "
                                "server or retry later");
    if (rc) {
        ret = send_error(s, c, &e, NULL, NULL);
        goto done;
    }
    int64_t max_ctx = csd_engine_max_ctx(engine);
    const char *prompt_field = kind == CSD_HTTP_KIND_CHAT ? "messages" : "prompt";
    if ((int64_t)n_ids >= max_ctx) {
        csd_http_error_set(
            &e, 400, NULL, prompt_field, "context_length_exceeded",
            "This model's maximum context length is %lld tokens, but the %s %s %zu "
            "tokens (at least one must remain for the completion)",
            (long long)max_ctx, prompt_field, kind == CSD_HTTP_KIND_CHAT ? "take" : "takes", n_ids);
        ret = send_error(s, c, &e, NULL, NULL);
        goto done;
    }
    csd_req_params rp;
    memset(&rp, 0, sizeof rp);
    rp.sampling = req.sampling;
    /* without max_tokens, generate until the context is full (the engine stops there) */
    rp.max_tokens = req.max_tokens > 0 ? req.max_tokens : max_ctx - (int64_t)n_ids;
    rp.logprobs = req.logprobs;
    rp.ignore_eos = req.ignore_eos;
    rp.top_logprobs = req.top_logprobs;
    rp.json_vocab = req.json_object ? s->json_vocab : NULL;
    rp.json_schema = req.json_schema;
    if (csd_http_job_create(&j, &req, s->tok, s->model_name, engine, (int64_t)n_ids)) {
        ret = send_error_msg(s, c, 500, "server_error", NULL, NULL, "out of memory", NULL, NULL);
        goto done;
    }
    /* completions echo: the prompt text before the generated text */
    char *decoded = NULL;
    const char *echo = "";
    size_t echo_len = 0;
    if (req.echo && req.prompt) {
        echo = req.prompt;
        echo_len = req.prompt_len; /* NUL bytes included */
    } else if (req.echo && !csd_tok_decode_len(s->tok, ids, n_ids, false, &decoded, &echo_len,
                                               NULL)) {
        echo = decoded;
    }
    rc = csd_http_job_begin(j, echo, echo_len);
    csd_free(decoded);
    if (rc) {
        ret = send_error_msg(s, c, 500, "server_error", NULL, NULL, "out of memory", NULL, NULL);
        goto done;
    }
    int capacity = csd_engine_capacity(engine);
    if (req.n > capacity) { /* a 429 would say retry: it never fits */
        csd_http_error_set(&e, 400, NULL, "n", "invalid_value",
                           "'n' is %d, but this server holds at most %d requests at once "
                           "(slots and queue)",
                           req.n, capacity);
        ret = send_error(s, c, &e, NULL, NULL);
        goto done;
    }
    csd_err err = {0};
    rc = submit_choices(engine, j, ids, (int64_t)n_ids, &rp, req.has_seed, &err);
    if (rc) {
        if (rc == CSD_EFULL) {
            ret = send_error_msg(s, c, 429, "rate_limit_error", NULL, "server_busy",
                                 "every slot and the queue are full; retry shortly", "Retry-After",
                                 RETRY_AFTER_FULL);
        } else if (rc == CSD_ERANGE || rc == CSD_EINVAL) {
            csd_http_error_set(&e, 400, NULL, prompt_field, "invalid_value", "%s", err.msg);
            ret = send_error(s, c, &e, NULL, NULL);
        } else {
            csd_http_error_set(&e, 500, "server_error", NULL, NULL, "%s", err.msg);
            ret = send_error(s, c, &e, NULL, NULL);
        }
        goto done;
    }
    CSD_LOGD("request submitted req=%s kind=%s prompt=%zu stream=%d n=%d", j->id,
             csd_http_kind_name(kind), n_ids, req.stream, j->n_choices);
    if (req.stream) {
        ret = start_stream(s, c, j);
        j = NULL; /* owned by the stream now */
        goto done;
    }
    if (!csd_http_job_wait(j, csd_mhd_conn_fd(c), &s->stopping)) {
        if (!atomic_load(&s->stopping)) atomic_fetch_add(&s->client_cancels, 1);
        ret = MHD_NO; /* nobody to answer: close the connection */
        goto done;
    }
    int status = 500;
    char *body = csd_http_job_response(j, &status);
    ret = body ? send_json(s, c, status, body, NULL, NULL)
               : send_error_msg(s, c, 500, "server_error", NULL, NULL, "out of memory", NULL, NULL);
    free(body);
done:
    csd_http_job_release(j);
    csd_free(ids);
    csd_http_req_fini(&req);
    return ret;
}

/* ---- MHD glue ---- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    csd_http_server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) { /* first call: headers only */
        cs = csd_alloc(sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        cs->route = route_of(url);
        if (cs->route == ROUTE_NONE) {
            cs->replied = true;
            return send_error_msg(s, c, 404, "invalid_request_error", NULL, "not_found",
                                  "Unknown request URL; see /v1/models, /v1/chat/completions, "
                                  "/v1/completions, /tokenize, /detokenize, /health, /metrics",
                                  NULL, NULL);
        }
        bool post = route_is_post(cs->route);
        if (strcmp(method, post ? "POST" : "GET") != 0 && !(!post && !strcmp(method, "HEAD"))) {
            cs->replied = true;
            return send_error_msg(s, c, 405, "invalid_request_error", NULL, "method_not_allowed",
                                  post ? "Only POST is allowed here" : "Only GET is allowed here",
                                  "Allow", post ? "POST" : "GET, HEAD");
        }
        if (!authorized(s, c, cs->route)) {
            cs->replied = true;
            return send_error_msg(s, c, 401, "invalid_request_error", NULL, "invalid_api_key",
                                  "Missing or incorrect API key: send 'Authorization: Bearer KEY'",
                                  "WWW-Authenticate", "Bearer");
        }
        if (csd_mhd_body_declared_too_large(c, s->max_body)) {
            cs->replied = true;
            char msg[128];
            snprintf(msg, sizeof msg, "The request body is larger than %zu bytes", s->max_body);
            return send_error_msg(s, c, 413, "invalid_request_error", NULL, "request_too_large",
                                  msg, NULL, NULL);
        }
        return MHD_YES;
    }
    if (cs->replied) { /* discard any body of a request already answered */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!csd_mhd_body_add(&cs->body, upload, *upload_size, s->max_body)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    /* the whole body is here */
    cs->replied = true;
    if (cs->body.too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "The request body is larger than %zu bytes", s->max_body);
        return send_error_msg(s, c, 413, "invalid_request_error", NULL, "request_too_large", msg,
                              NULL, NULL);
    }
    switch (cs->route) {
    case ROUTE_CHAT:
    case ROUTE_COMPLETIONS:
        return handle_generate(s, c, cs->route, cs);
    case ROUTE_MODELS:
    case ROUTE_MODEL_ONE:
        return handle_models(s, c, url, cs->route);
    case ROUTE_HEALTH:
        return handle_health(s, c);
    case ROUTE_METRICS:
        return handle_metrics(s, c);
    case ROUTE_TOKENIZE:
    case ROUTE_DETOKENIZE:
        return handle_tokenizer(s, c, cs->route, cs);
    default:
        return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    if (cs->in_flight) atomic_fetch_sub(&((csd_http_server *)cls)->in_flight, 1);
    csd_http_buf_fini(&cs->body.buf);
    csd_free(cs);
    *con_cls = NULL;
}

/* ---- lifecycle ---- */

int csd_http_server_create(csd_http_server **out, const csd_http_opts *opts, const csd_tok *tok,
                           const csd_chat_template *tmpl, csd_err *err) {
    *out = NULL;
    csd_http_opts o;
    csd_http_opts_default(&o);
    if (opts) o = *opts;
    if (!o.host) o.host = "127.0.0.1";
    if (!o.max_body) o.max_body = CSD_HTTP_DEFAULT_MAX_BODY;
    if (o.max_connections <= 0) o.max_connections = CSD_HTTP_DEFAULT_MAX_CONNECTIONS;
    if (o.idle_timeout_s <= 0) o.idle_timeout_s = CSD_HTTP_DEFAULT_IDLE_TIMEOUT;
    if (o.max_connections > CSD_HTTP_MAX_CONNECTIONS_LIMIT)
        return csd_err_set(err, CSD_ERANGE, "max connections %d above %d", o.max_connections,
                           CSD_HTTP_MAX_CONNECTIONS_LIMIT);
    if (o.idle_timeout_s > CSD_HTTP_IDLE_TIMEOUT_LIMIT)
        return csd_err_set(err, CSD_ERANGE, "idle timeout %d s above %d", o.idle_timeout_s,
                           CSD_HTTP_IDLE_TIMEOUT_LIMIT);
    if (o.max_per_ip < 0 || o.max_per_ip > o.max_connections)
        return csd_err_set(err, CSD_ERANGE, "connections per IP address %d not in 0..%d",
                           o.max_per_ip, o.max_connections);
    if (o.tool_format != CSD_TOOL_SPLIT_TAGS && o.tool_format != CSD_TOOL_SPLIT_BARE &&
        o.tool_format != CSD_TOOL_SPLIT_MISTRAL)
        return csd_err_set(err, CSD_EINVAL, "tool call format %d is not tags, bare or mistral",
                           o.tool_format);
    if (!tok) return csd_err_set(err, CSD_EINVAL, "server needs a tokenizer");
    if (!o.model_name || !o.model_name[0])
        return csd_err_set(err, CSD_EINVAL, "server needs a model name");
    if (o.port < 0 || o.port > 65535)
        return csd_err_set(err, CSD_ERANGE, "port %d out of range", o.port);
    if (sodium_init() < 0) /* response ids come from its random generator */
        return csd_err_set(err, CSD_EIO, "libsodium initialisation failed");
    int rc = 0;
    csd_http_server *s = csd_alloc(sizeof *s);
    if (!s) return csd_err_set(err, CSD_ENOMEM, "server");
    csd_tok_gate_init(&s->tok_gate, CSD_TOK_GATE_BUDGET);
    s->tok = tok;
    s->json_vocab = o.json_vocab;
    s->reasoning_none = o.reasoning_none;
    s->tool_format = o.tool_format;
    s->tmpl = tmpl;
    s->max_body = o.max_body;
    s->idle_timeout_s = (unsigned)o.idle_timeout_s;
    s->started = (long long)time(NULL);
    s->model_name = csd_strdup(o.model_name);
    if (o.api_key && o.api_key[0]) s->api_key = csd_strdup(o.api_key);
    if (!s->model_name || (o.api_key && o.api_key[0] && !s->api_key)) {
        rc = csd_err_set(err, CSD_ENOMEM, "server");
        goto fail;
    }
    csd_mhd_listen l = {o.host, o.port, (unsigned)o.max_connections, (unsigned)o.idle_timeout_s,
                        (unsigned)o.max_per_ip};
    rc = csd_mhd_start(&s->mhd, &s->port, &l, on_request, on_completed, s, err);
    if (rc) goto fail;
    CSD_LOGI("http server listening host=%s port=%d model=%s auth=%s", o.host, s->port,
             s->model_name, s->api_key ? "on" : "off");
    *out = s;
    return 0;
fail:
    csd_http_server_destroy(s);
    return rc;
}

void csd_http_server_set_engine(csd_http_server *s, csd_engine *engine) {
    atomic_store(&s->engine, engine);
}

int csd_http_server_port(const csd_http_server *s) { return s->port; }

void csd_http_server_drain(csd_http_server *s) { atomic_store(&s->draining, 1); }

int csd_http_server_in_flight(csd_http_server *s) { return atomic_load(&s->in_flight); }

void csd_http_server_destroy(csd_http_server *s) {
    if (!s) return;
    atomic_store(&s->draining, 1);
    /* running requests are cancelled and end with a shutdown error; MHD_stop_daemon shuts every
     * socket, so their connections get the time to send it first */
    atomic_store(&s->stopping, 1);
    double give_up = csd_now_s() + CSD_HTTP_SHUTDOWN_GRACE_S + 1.0;
    while (atomic_load(&s->in_flight) > 0 && csd_now_s() < give_up) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (s->mhd) MHD_stop_daemon(s->mhd);
    csd_tok_gate_fini(&s->tok_gate);
    csd_free(s->api_key);
    csd_free(s->model_name);
    csd_free(s);
}
