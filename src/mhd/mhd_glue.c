/* mhd_glue: see mhd_glue.h. */
#include "mhd_glue.h"

#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"

/* The address to listen on: host (a name or a numeric IPv4/IPv6 address) and port. */
static int listen_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len,
                       csd_err *err) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0 || !res)
        return csd_err_set(err, CSD_EINVAL, "cannot resolve host '%s': %s", host,
                           gai_strerror(gai));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int csd_mhd_start(struct MHD_Daemon **out, int *port, const csd_mhd_listen *l,
                  MHD_AccessHandlerCallback handler, MHD_RequestCompletedCallback completed,
                  void *cls, csd_err *err) {
    struct sockaddr_storage addr;
    socklen_t addr_len = 0;
    int rc = listen_addr(l->host, l->port, &addr, &addr_len, err);
    if (rc) return rc;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* no MHD_OPTION_LISTENING_ADDRESS_REUSE: on Linux it is SO_REUSEPORT, which would let a second
     * server silently share the port; MHD's default SO_REUSEADDR is enough for restarts */
    *out = MHD_start_daemon(
        flags, (uint16_t)l->port, NULL, NULL, handler, cls, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT, l->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, l->idle_timeout_s, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        l->max_per_ip, MHD_OPTION_NOTIFY_COMPLETED, completed, cls, MHD_OPTION_EXTERNAL_LOGGER,
        csd_mhd_log, cls, MHD_OPTION_END);
    if (!*out)
        return csd_err_set(err, CSD_EIO, "cannot listen on %s:%d (address in use or not available)",
                           l->host, l->port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(*out, MHD_DAEMON_INFO_BIND_PORT);
    *port = di ? di->port : l->port;
    return 0;
}

/* MHD has already refused a Content-Length that is not plain digits (400); one beyond 64 bits
 * reads as ULLONG_MAX here. */
bool csd_mhd_body_declared_too_large(struct MHD_Connection *c, size_t max) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    return cl && strtoull(cl, NULL, 10) / 16 > max;
}

bool csd_mhd_body_add(csd_mhd_body *b, const char *data, size_t n, size_t max) {
    b->seen = n > SIZE_MAX - b->seen ? SIZE_MAX : b->seen + n;
    if (b->seen / 16 > max) return false;
    if (!b->too_large && b->buf.len + n > max) {
        b->too_large = true;
        csd_http_buf_fini(&b->buf);
    }
    return b->too_large || csd_http_buf_append(&b->buf, data, n) == 0;
}


int csd_mhd_conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

bool csd_fd_peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static bool same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)(a[i] ^ b[lb ? i % lb : 0]);
    return diff == 0;
}

bool csd_mhd_bearer_ok(struct MHD_Connection *c, const char *key) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    return same_secret(h, key);
}

void csd_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (CSD_LOG_DEBUG > csd_log_level_current) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    CSD_LOGD("microhttpd: %s", msg);
}
