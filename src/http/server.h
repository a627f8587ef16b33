/* server: the OpenAI-compatible HTTP API over a serving engine (libmicrohttpd, one thread per
 * connection so a handler may wait for its tokens). Endpoints: POST /v1/chat/completions,
 * POST /v1/completions, GET /v1/models, GET /health, GET /metrics (Prometheus text). Streams as
 * server-sent events; a client that goes away cancels its request. Text concerns (chat template,
 * tokenizing, detokenizing, stop strings) live here; the engine only sees token ids.
 * The server can start before the model is loaded (/health says 503 until
 * csd_http_server_set_engine). See docs/api.md. */
#ifndef CSD_HTTP_SERVER_H
#define CSD_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat/chat_template.h"
#include "coord/engine.h"
#include "core/err.h"
#include "model/json_mask.h"
#include "tok/tokenizer.h"

/* Largest request body accepted (413 beyond). */
#define CSD_HTTP_DEFAULT_MAX_BODY (4u << 20)
/* Connections served at once (each costs a thread). */
#define CSD_HTTP_DEFAULT_MAX_CONNECTIONS 256
/* Seconds a connection may stay idle before it is closed. */
#define CSD_HTTP_DEFAULT_IDLE_TIMEOUT 60
/* Upper bounds for the options above (a connection costs a thread; a day of idling is plenty). */
#define CSD_HTTP_MAX_CONNECTIONS_LIMIT 4096
#define CSD_HTTP_IDLE_TIMEOUT_LIMIT 86400

typedef struct csd_http_opts {
    const char *host;       /* address to bind ("127.0.0.1", "0.0.0.0", "::1"); NULL: 127.0.0.1 */
    int port;               /* 0: any free port (see csd_http_server_port) */
    const char *api_key;    /* NULL or "": no authentication */
    const char *model_name; /* the id /v1/models lists and requests must name (required) */
    size_t max_body;        /* 0: CSD_HTTP_DEFAULT_MAX_BODY */
    int max_connections;    /* 0: CSD_HTTP_DEFAULT_MAX_CONNECTIONS */
    int idle_timeout_s;     /* 0: CSD_HTTP_DEFAULT_IDLE_TIMEOUT */
    int max_per_ip;         /* connections one client IP address may hold; 0: no cap */
    /* the tokens' bytes for response_format json_object (borrowed: it must outlive the engine's
     * requests); NULL: such requests are refused */
    const csd_vocab_bytes *json_vocab;
    bool reasoning_none; /* --reasoning-format none: thinking stays in the content */
    int tool_format;     /* how answers write tool calls: enum csd_tool_split_mode, tags, bare or
                          * mistral (serve picks it from the chat template, or
                          * --tool-call-format) */
} csd_http_opts;

void csd_http_opts_default(csd_http_opts *o);

typedef struct csd_http_server csd_http_server;

/* Starts listening. tok and tmpl are borrowed and must outlive the server (tmpl may be NULL: then
 * chat requests are refused). Strings in opts are copied. */
int csd_http_server_create(csd_http_server **out, const csd_http_opts *opts, const csd_tok *tok,
                           const csd_chat_template *tmpl, csd_err *err);
/* Makes the engine serve requests (borrowed; destroy it after the server). Until then every API
 * call answers 503 with Retry-After and /health says loading. */
void csd_http_server_set_engine(csd_http_server *s, csd_engine *engine);
/* The bound TCP port (useful with port 0). */
int csd_http_server_port(const csd_http_server *s);
/* Graceful shutdown, first step: from now on generation requests get 503 server_shutting_down
 * (with Connection: close) and /health says 503 shutting_down; requests already taken go on. */
void csd_http_server_drain(csd_http_server *s);
/* Generation requests taken and not yet fully answered (a stream counts until its last byte). */
int csd_http_server_in_flight(csd_http_server *s);
/* Stops: cancels the requests still running, which end with a 503 server_shutting_down error
 * (a stream's last event, before [DONE]) unless the engine takes longer than
 * CSD_HTTP_SHUTDOWN_GRACE_S to end them; then stops listening, closes every connection and waits
 * for their threads. Requests still inside the engine end when the engine is destroyed (after
 * this). NULL is a no-op. */
void csd_http_server_destroy(csd_http_server *s);

#endif
