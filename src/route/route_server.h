/* route_server: `cascadia route`'s HTTP front (libmicrohttpd, a thread per connection). It forwards
 * POST /v1/chat/completions and /v1/completions to OpenAI-compatible upstreams ("providers"),
 * never more than an upstream's max at once, queueing the rest first come, first served, and
 * fails over to another upstream when one fails before answering. Also GET /v1/models, /health
 * and /metrics. It knows no model, tokenizer or engine. See docs/route.md. */
#ifndef CSD_ROUTE_SERVER_H
#define CSD_ROUTE_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "core/err.h"
#include "route_pick.h"

/* Defaults of the flags (docs/route.md). */
#define CSD_ROUTE_DEFAULT_PORT 8080
#define CSD_ROUTE_DEFAULT_QUEUE 64
#define CSD_ROUTE_DEFAULT_QUEUE_TIMEOUT 60
#define CSD_ROUTE_DEFAULT_UPSTREAM_TIMEOUT 600
#define CSD_ROUTE_DEFAULT_MAX_BODY (4u << 20)
#define CSD_ROUTE_DEFAULT_MODEL_NAME "cascadia-route"
/* Longest upstream URL accepted (it becomes a metrics label). */
#define CSD_ROUTE_URL_MAX 1024
/* Connections held at once, a thread each: at least serve's default, more when the upstreams'
 * max and the queue need them (each running or queued request holds one), up to the limit. */
#define CSD_ROUTE_MIN_CONNECTIONS 256
#define CSD_ROUTE_MAX_CONNECTIONS 4096
/* Connections kept beside the requests' for /health, /metrics and 429s. */
#define CSD_ROUTE_SPARE_CONNECTIONS 64
/* Seconds a connection may idle before it is closed (a request waiting for its answer is not
 * idle). */
#define CSD_ROUTE_IDLE_TIMEOUT 60

typedef struct csd_route_upstream_opts {
    const char *url;   /* the base, ending in /v1 as a rule: "http://10.0.0.2:8080/v1" */
    int max;           /* requests in flight at most, 1..CSD_ROUTE_MAX_IN_FLIGHT */
    const char *key;   /* sent as "Authorization: Bearer KEY"; NULL: none */
    const char *model; /* the body's "model" is rewritten to it; NULL: forwarded as sent */
} csd_route_upstream_opts;

typedef struct csd_route_opts {
    const char *host; /* NULL: 127.0.0.1 */
    int port;         /* 0: any free port (csd_route_server_port) */
    int n_upstreams;  /* 1..CSD_ROUTE_MAX_UPSTREAMS */
    csd_route_upstream_opts upstreams[CSD_ROUTE_MAX_UPSTREAMS];
    int queue_max;          /* requests waiting for a slot before 429 (each holds a connection) */
    int queue_timeout_s;    /* seconds one may wait before 503 */
    int upstream_timeout_s; /* longest an upstream may stay silent (connecting: at most 10 s) */
    size_t max_body;        /* 413 beyond */
    const char *api_key;    /* NULL: no authentication of clients */
    const char *model_name; /* what /v1/models lists */
} csd_route_opts;

void csd_route_opts_default(csd_route_opts *o);

/* Checks an upstream base URL: http:// or https://, a host without user:password@, at most
 * CSD_ROUTE_URL_MAX bytes of printable ASCII without quotes, backslashes, spaces, a query or a
 * fragment. 0, or CSD_EINVAL with a message. */
int csd_route_url_check(const char *url, csd_err *err);
/* Two checked URLs name the same upstream: scheme and host in any case, trailing slashes aside. */
bool csd_route_url_same(const char *a, const char *b);

typedef struct csd_route_server csd_route_server;

/* Starts listening (strings in opts are copied). Calls libcurl's global set-up: create it before
 * starting other threads that use libcurl. */
int csd_route_server_create(csd_route_server **out, const csd_route_opts *opts, csd_err *err);
int csd_route_server_port(const csd_route_server *s);
/* Stops listening, aborts the transfers of open connections and waits for their threads. NULL is
 * a no-op. */
void csd_route_server_destroy(csd_route_server *s);

#endif
