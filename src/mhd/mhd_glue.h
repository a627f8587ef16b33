/* mhd_glue: the libmicrohttpd plumbing that both HTTP fronts share, the OpenAI API server
 * (src/http) and the router (src/route): starting the daemon, a request body within its bound,
 * the client's socket and whether it hung up, the bearer key check and MHD's log. Only src/mhd,
 * src/http and src/route include microhttpd.h. */
#ifndef CSD_MHD_GLUE_H
#define CSD_MHD_GLUE_H

#include <microhttpd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "core/err.h"
#include "mhd/text_buf.h"

/* Where and how a front listens: a thread per connection. */
typedef struct csd_mhd_listen {
    const char *host; /* a name or a numeric IPv4/IPv6 address */
    int port;         /* 0: any free port */
    unsigned max_connections, idle_timeout_s;
    unsigned max_per_ip; /* 0: no cap */
} csd_mhd_listen;

/* Starts the daemon: handler answers requests, completed frees their state (cls to both). *port
 * gets the bound port. */
int csd_mhd_start(struct MHD_Daemon **out, int *port, const csd_mhd_listen *l,
                  MHD_AccessHandlerCallback handler, MHD_RequestCompletedCallback completed,
                  void *cls, csd_err *err);

/* A request body, kept up to a bound. */
typedef struct csd_mhd_body {
    csd_http_buf buf;
    size_t seen;     /* bytes received, kept or not (saturating) */
    bool too_large;  /* past the bound: dropped, the answer is a 413 */
} csd_mhd_body;

/* A declared Content-Length far beyond max (16 times): refused before any byte is read. A body
 * slightly larger is read and dropped instead, so that the client, still sending, sees the 413. */
bool csd_mhd_body_declared_too_large(struct MHD_Connection *c, size_t max);
/* Takes n more bytes: kept while the body stays within max, else dropped (too_large). False when
 * the connection must close unanswered: the body went past 16 times max (one sent chunked, with
 * no length declared), or out of memory. */
bool csd_mhd_body_add(csd_mhd_body *b, const char *data, size_t n, size_t max);

/* The connection's socket, or -1. */
int csd_mhd_conn_fd(struct MHD_Connection *c);
/* The peer of socket fd hung up, or closed its sending side (it cannot be told from one that left
 * until something is written to it: docs/api.md, "Streaming"). False for fd < 0. */
bool csd_fd_peer_gone(int fd);
/* The request carries "Authorization: Bearer KEY" with key (compared in constant time, so that
 * the key cannot be guessed byte by byte from response times). */
bool csd_mhd_bearer_ok(struct MHD_Connection *c, const char *key);
/* MHD_OPTION_EXTERNAL_LOGGER: MHD's messages at debug level (CSD_LOG=debug). */
void csd_mhd_log(void *cls, const char *fmt, va_list ap);

#endif
