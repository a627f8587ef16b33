/* mhd_glue: the libmicrohttpd plumbing that both HTTP fronts share, the OpenAI API server
 * (src/http) and the router (src/route): the listening address, the client's socket and whether
 * it hung up, the bearer key check and MHD's log. Only src/mhd, src/http and src/route include
 * microhttpd.h. */
#ifndef CSD_MHD_GLUE_H
#define CSD_MHD_GLUE_H

#include <microhttpd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "core/err.h"

/* The address to listen on: host (a name or a numeric IPv4/IPv6 address) and port. */
int csd_mhd_listen_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len,
                        csd_err *err);
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
