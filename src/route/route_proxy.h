/* route_proxy: one request forwarded to one upstream with libcurl, driven by the caller's thread
 * (a curl multi handle of its own, polled in short steps so that a client that leaves or a server
 * that stops aborts the transfer, and the upstream sees its connection close and cancels). The
 * answer's bytes are handed on as they arrive; at most CSD_ROUTE_XFER_BUF_MAX of them wait here
 * (the transfer pauses beyond that): the caller decides whether to hold an answer whole (the
 * router does for HTTP/1.0 clients). Knows nothing of HTTP servers or of slots. See
 * docs/route.md. */
#ifndef CSD_ROUTE_PROXY_H
#define CSD_ROUTE_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "core/err.h"

/* Answer bytes held between the upstream and the client before the transfer pauses. */
#define CSD_ROUTE_XFER_BUF_MAX (1u << 20)
/* Bytes of response headers accepted from an upstream (more: the answer is refused as garbage). */
#define CSD_ROUTE_XFER_HEADERS_MAX (64u << 10)
/* Longest Content-Type relayed. */
#define CSD_ROUTE_CTYPE_MAX 128

/* Asked between polls: true when the transfer should stop (client gone, server stopping). */
typedef struct csd_route_abort {
    bool (*stop)(void *ctx);
    void *ctx;
} csd_route_abort;

typedef struct csd_route_xfer_opts {
    const char *url;  /* the whole URL: base + "/chat/completions" */
    const char *body; /* the request body (copied) */
    size_t body_len;
    const char *bearer;    /* NULL: no Authorization header */
    int connect_timeout_s; /* to connect */
    int silence_timeout_s; /* longest the upstream may send nothing, from the request's start
                            * or its last byte (a non-stream answer is silent while it
                            * computes) */
} csd_route_xfer_opts;

/* How a failed start failed (csd_route_xfer_start). */
enum csd_route_xfer_fail {
    CSD_ROUTE_XFER_OK = 0,
    CSD_ROUTE_XFER_CONNECT, /* no connection (refused, unresolved, timed out): mark it down */
    CSD_ROUTE_XFER_BROKEN,  /* connected, then no usable answer (reset, garbage, timeout) */
    CSD_ROUTE_XFER_STATUS,  /* answered a status worth another upstream: 429 or 5xx */
    CSD_ROUTE_XFER_ABORTED, /* the abort callback said stop */
    CSD_ROUTE_XFER_FAIL_COUNT
};

typedef struct csd_route_xfer csd_route_xfer;

/* Prepares the transfer (nothing is sent yet). Destroy with csd_route_xfer_destroy. */
int csd_route_xfer_create(csd_route_xfer **out, const csd_route_xfer_opts *o, csd_err *err);
/* Sends the request and waits for the answer's headers and its first bytes (or its end), so that
 * an upstream that fails before answering anything can still be replaced by another. Returns
 * CSD_ROUTE_XFER_OK or how it failed, with a message in err ("connection refused",
 * "answered HTTP 503"). */
int csd_route_xfer_start(csd_route_xfer *x, const csd_route_abort *ab, csd_err *err);
/* After a successful start: the upstream's status and Content-Type ("" when it sent none). */
int csd_route_xfer_status(const csd_route_xfer *x);
const char *csd_route_xfer_content_type(const csd_route_xfer *x);
/* The next bytes of the answer, waiting for some: the count, 0 at its clean end, -1 when the
 * transfer failed (err says why) and -2 when the abort callback said stop. */
ssize_t csd_route_xfer_read(csd_route_xfer *x, char *buf, size_t max, const csd_route_abort *ab,
                            csd_err *err);
/* Aborts a transfer still running (its connection is closed). NULL is a no-op. */
void csd_route_xfer_destroy(csd_route_xfer *x);

/* Once per process, before any thread uses libcurl. */
int csd_route_proxy_global_init(csd_err *err);
void csd_route_proxy_global_fini(void);

#endif
