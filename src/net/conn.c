/* conn: TCP links with the Cascadia handshake, AEAD or checksum framing (see conn.h, protocol.md).
 * On the wire a frame is header(20, cleartext) | body(payload_len) | trailer, where the trailer is
 * xxhash64 (8 bytes) in plain mode, or the Poly1305 tag (16 bytes) with the body encrypted and the
 * header as associated data in secure mode. Nonces are implicit per-direction counters, so a
 * replayed, dropped or reordered frame fails authentication. The handshake that sets the keys is
 * conn_handshake.c. */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "conn_internal.h"

#define CHECKSUM_SIZE 8u

struct csd_listener {
    int fd;
    uint16_t port;
};

/* ---- buffers ---- */

void csd_netbuf_fini(csd_netbuf *b) {
    if (!b) return;
    if (b->data) sodium_memzero(b->data, b->cap);
    csd_free(b->data);
    b->data = NULL;
    b->cap = 0;
}

static int netbuf_reserve(csd_netbuf *b, size_t n, csd_err *err) {
    if (b->cap >= n && b->data) return 0;
    /* Grow geometrically (bounded by the protocol limit) so a slowly growing stream of frames
     * does not reallocate each time. */
    size_t want = b->cap ? b->cap : 4096;
    while (want < n) want *= 2;
    if (want > CSD_WIRE_MAX_PAYLOAD) want = n > CSD_WIRE_MAX_PAYLOAD ? n : CSD_WIRE_MAX_PAYLOAD;
    uint8_t *p = csd_alloc(want);
    if (!p) return csd_err_set(err, CSD_ENOMEM, "receive buffer of %zu bytes", want);
    csd_netbuf_fini(b);
    b->data = p;
    b->cap = want;
    return 0;
}

/* ---- sockets ---- */

/* Every socket option the project sets, in one place: non-blocking (all waits are poll()s with
 * deadlines), close-on-exec, no Nagle delay (frames are latency-bound), keepalive so a dead peer is
 * noticed on an idle link within ~1 minute. */
static int set_socket_options(int fd, bool is_stream_conn, csd_err *err) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return csd_err_set(err, CSD_EIO, "fcntl O_NONBLOCK: %s", strerror(errno));
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
        return csd_err_set(err, CSD_EIO, "fcntl FD_CLOEXEC: %s", strerror(errno));
    if (!is_stream_conn) return 0;
    /* TCP options only for TCP: a link may also run over an AF_UNIX socketpair (tests, fuzzing). */
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_UNIX) return 0;
    int one = 1, idle = 30, intvl = 10, cnt = 3;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0)
        return csd_err_set(err, CSD_EIO, "setsockopt NODELAY/KEEPALIVE: %s", strerror(errno));
#ifdef TCP_KEEPIDLE
    /* Best effort: not every platform has the fine-grained keepalive knobs. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
#else
    (void)idle, (void)intvl, (void)cnt;
#endif
    return 0;
}

static void addr_text(const struct sockaddr *sa, socklen_t len, char *out, size_t cap) {
    char host[INET6_ADDRSTRLEN], serv[8];
    if (sa->sa_family == AF_UNIX) {
        snprintf(out, cap, "unix");
        return;
    }
    if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, cap, "?");
        return;
    }
    if (sa->sa_family == AF_INET6)
        snprintf(out, cap, "[%s]:%s", host, serv);
    else
        snprintf(out, cap, "%s:%s", host, serv);
}

/* Splits "host:port" / "[v6]:port" into host and port strings. */
static int split_host_port(const char *hp, char *host, size_t hcap, char *port, size_t pcap,
                           csd_err *err) {
    if (!hp) return csd_err_set(err, CSD_EINVAL, "address is NULL");
    const char *colon = strrchr(hp, ':');
    if (!colon || colon[1] == '\0')
        return csd_err_set(err, CSD_EINVAL, "address '%s': expected host:port", hp);
    const char *hb = hp, *he = colon;
    if (*hb == '[') {
        if (he == hb || he[-1] != ']')
            return csd_err_set(err, CSD_EINVAL, "address '%s': unbalanced [", hp);
        hb++;
        he--;
    }
    size_t hl = (size_t)(he - hb), pl = strlen(colon + 1);
    if (hl == 0 || hl >= hcap || pl >= pcap)
        return csd_err_set(err, CSD_EINVAL, "address '%s': bad host or port", hp);
    for (size_t i = 0; i < pl; i++)
        if (colon[1 + i] < '0' || colon[1 + i] > '9')
            return csd_err_set(err, CSD_EINVAL, "address '%s': port is not a number", hp);
    if (pl > 9 || atoi(colon + 1) > 65535) /* getaddrinfo would take it modulo 65536 */
        return csd_err_set(err, CSD_EINVAL, "address '%s': port above 65535", hp);
    memcpy(host, hb, hl);
    host[hl] = '\0';
    memcpy(port, colon + 1, pl + 1);
    return 0;
}

static int conn_alloc(csd_conn **out, int fd, csd_err *err) {
    csd_conn *c = csd_alloc(sizeof *c);
    if (!c) {
        close(fd);
        return csd_err_set(err, CSD_ENOMEM, "connection state");
    }
    c->fd = fd;
    c->timeout_ms = CSD_CONN_DEFAULT_TIMEOUT_MS;
    atomic_init(&c->mode, MODE_PLAIN);
    atomic_init(&c->closed, false);
    atomic_init(&c->frames_in, 0);
    atomic_init(&c->frames_out, 0);
    atomic_init(&c->bytes_in, 0);
    atomic_init(&c->bytes_out, 0);
    pthread_mutex_init(&c->send_lock, NULL);
    pthread_mutex_init(&c->recv_lock, NULL);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        addr_text((struct sockaddr *)&ss, sl, c->peer, sizeof c->peer);
    else
        snprintf(c->peer, sizeof c->peer, "fd%d", fd);
    int rc = set_socket_options(fd, true, err);
    if (rc) {
        csd_conn_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

int csd_conn_from_fd(csd_conn **out, int fd, csd_err *err) {
    *out = NULL;
    if (fd < 0) return csd_err_set(err, CSD_EINVAL, "conn from fd: bad fd %d", fd);
    return conn_alloc(out, fd, err);
}

void csd_conn_destroy(csd_conn *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    pthread_mutex_destroy(&c->send_lock);
    pthread_mutex_destroy(&c->recv_lock);
    if (c->sendbuf) sodium_memzero(c->sendbuf, c->sendcap);
    csd_free(c->sendbuf);
    sodium_memzero(&c->tx, sizeof c->tx);
    sodium_memzero(&c->rx, sizeof c->rx);
    csd_free(c);
}

void csd_conn_shutdown(csd_conn *c) {
    if (!c) return;
    atomic_store(&c->closed, true);
    shutdown(c->fd, SHUT_RDWR);
}

const char *csd_conn_peer(const csd_conn *c) { return c->peer; }

bool csd_conn_is_closed(const csd_conn *c) { return atomic_load(&c->closed); }

void csd_conn_linger_close(csd_conn *c) {
    enum { LINGER_MS = 200, DRAIN_MAX = 1 << 20 };
    shutdown(c->fd, SHUT_WR);
    uint64_t deadline = csd_now_ns() + (uint64_t)LINGER_MS * 1000000ull;
    uint8_t sink[4096];
    size_t drained = 0;
    while (drained < DRAIN_MAX) {
        int wait = csd_conn_remaining_ms(deadline);
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (wait == 0 || poll(&pfd, 1, wait) <= 0) break;
        ssize_t r = recv(c->fd, sink, sizeof sink, 0);
        if (r <= 0) break;
        drained += (size_t)r;
    }
    csd_conn_fail_link(c);
}

bool csd_conn_peer_gone(const csd_conn *c) {
    if (atomic_load(&c->closed)) return true;
#ifdef POLLRDHUP
    short gone = POLLRDHUP | POLLHUP | POLLERR;
#else
    short gone = POLLHUP | POLLERR;
#endif
    struct pollfd p = {.fd = c->fd, .events = gone};
    return poll(&p, 1, 0) > 0 && (p.revents & gone);
}

void csd_conn_get_counters(const csd_conn *c, csd_conn_counters *out) {
    out->frames_in = atomic_load(&c->frames_in);
    out->frames_out = atomic_load(&c->frames_out);
    out->bytes_in = atomic_load(&c->bytes_in);
    out->bytes_out = atomic_load(&c->bytes_out);
}

int csd_conn_remaining_ms(uint64_t deadline_ns) {
    uint64_t now = csd_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 1000000000ull ? 1000000000 : (int)ms;
}

int csd_conn_connect(csd_conn **out, const char *host_port, int timeout_ms, csd_err *err) {
    *out = NULL;
    char host[256], port[16];
    int rc = split_host_port(host_port, host, sizeof host, port, sizeof port, err);
    if (!rc && atoi(port) == 0) /* only a listener may ask for any free port */
        rc = csd_err_set(err, CSD_EINVAL, "address '%s': port 0", host_port);
    if (rc) return rc;
    if (timeout_ms <= 0) timeout_ms = CSD_CONN_DEFAULT_TIMEOUT_MS;
    uint64_t deadline = csd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0)
        return csd_err_set(err, CSD_EIO, "connect %s: %s", host_port, gai_strerror(gai));
    rc = csd_err_set(err, CSD_EIO, "connect %s: no address", host_port);
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            rc = csd_err_set(err, CSD_EIO, "connect %s: socket: %s", host_port, strerror(errno));
            continue;
        }
        if ((rc = set_socket_options(fd, false, err))) {
            close(fd);
            continue;
        }
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int pr;
            do {
                pr = poll(&pfd, 1, csd_conn_remaining_ms(deadline));
            } while (pr < 0 && errno == EINTR);
            if (pr == 0) {
                close(fd);
                rc = csd_err_set(err, CSD_ETIMEOUT, "connect %s: timed out after %d ms",
                                 host_port, timeout_ms);
                continue;
            }
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (pr < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
            r = soerr ? -1 : 0;
            errno = soerr;
        }
        if (r != 0) {
            rc = csd_err_set(err, CSD_EIO, "connect %s: %s", host_port, strerror(errno));
            close(fd);
            continue;
        }
        freeaddrinfo(res);
        return conn_alloc(out, fd, err);
    }
    freeaddrinfo(res);
    return rc;
}

int csd_listener_open(csd_listener **out, const char *host_port, csd_err *err) {
    *out = NULL;
    char host[256], port[16];
    int rc = split_host_port(host_port, host, sizeof host, port, sizeof port, err);
    if (rc) return rc;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) return csd_err_set(err, CSD_EIO, "listen %s: %s", host_port, gai_strerror(gai));
    rc = csd_err_set(err, CSD_EIO, "listen %s: no address", host_port);
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            rc = csd_err_set(err, CSD_EIO, "listen %s: %s", host_port, strerror(errno));
            close(fd);
            continue;
        }
        if ((rc = set_socket_options(fd, false, err))) {
            close(fd);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        uint16_t p = 0;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            if (ss.ss_family == AF_INET)
                p = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            else if (ss.ss_family == AF_INET6)
                p = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
        csd_listener *l = csd_alloc(sizeof *l);
        if (!l) {
            close(fd);
            rc = csd_err_set(err, CSD_ENOMEM, "listener");
            break;
        }
        l->fd = fd;
        l->port = p;
        freeaddrinfo(res);
        *out = l;
        CSD_LOGD("net: listening addr=%s port=%u", host, (unsigned)p);
        return 0;
    }
    freeaddrinfo(res);
    return rc;
}

uint16_t csd_listener_port(const csd_listener *l) { return l->port; }

int csd_listener_accept(csd_listener *l, csd_conn **out, int timeout_ms, csd_err *err) {
    *out = NULL;
    uint64_t deadline = timeout_ms >= 0 ? csd_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
    for (;;) {
        int fd = accept(l->fd, NULL, NULL);
        if (fd >= 0) return conn_alloc(out, fd, err);
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return csd_err_set(err, CSD_EIO, "accept: %s", strerror(errno));
        struct pollfd pfd = {.fd = l->fd, .events = POLLIN};
        int wait = timeout_ms >= 0 ? csd_conn_remaining_ms(deadline) : -1;
        if (timeout_ms >= 0 && wait == 0)
            return csd_err_set(err, CSD_ETIMEOUT, "accept: no connection within %d ms",
                               timeout_ms);
        int pr = poll(&pfd, 1, wait);
        if (pr < 0 && errno != EINTR) return csd_err_set(err, CSD_EIO, "poll: %s", strerror(errno));
    }
}

void csd_listener_destroy(csd_listener *l) {
    if (!l) return;
    close(l->fd);
    csd_free(l);
}

/* ---- raw I/O with deadlines ---- */

/* Reads exactly n bytes. first_wait_ms bounds the wait for the first byte (< 0: forever); after
 * that the whole read must finish by stall_deadline_ns (0: computed from the first byte).
 * Returns CSD_ETIMEOUT (nothing read yet), CSD_ECLOSED (EOF before the first byte) or CSD_EPROTO
 * (EOF or stall mid-read). *got receives the number of bytes read. */
static int read_exact(csd_conn *c, uint8_t *p, size_t n, int first_wait_ms, uint64_t *deadline_ns,
                      size_t *got, csd_err *err) {
    size_t off = 0;
    while (off < n) {
        if (atomic_load(&c->closed))
            return csd_err_set(err, CSD_ECLOSED, "peer %s: link closed", c->peer);
        ssize_t r = recv(c->fd, p + off, n - off, 0);
        if (r > 0) {
            if (*deadline_ns == 0)
                *deadline_ns = csd_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
            off += (size_t)r;
            *got = off;
            continue;
        }
        if (r == 0) {
            if (off == 0 && *deadline_ns == 0)
                return csd_err_set(err, CSD_ECLOSED, "peer %s closed the connection", c->peer);
            return csd_err_set(err, CSD_EPROTO, "peer %s: connection closed mid-frame", c->peer);
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            if (off == 0 && *deadline_ns == 0)
                return csd_err_set(err, CSD_ECLOSED, "peer %s: %s", c->peer, strerror(errno));
            return csd_err_set(err, CSD_EPROTO, "peer %s: %s mid-frame", c->peer,
                               strerror(errno));
        }
        int wait = *deadline_ns ? csd_conn_remaining_ms(*deadline_ns) : first_wait_ms;
        if (*deadline_ns && wait == 0)
            return csd_err_set(err, CSD_EPROTO, "peer %s: frame stalled for %d ms", c->peer,
                               c->timeout_ms);
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&pfd, 1, wait);
        if (pr < 0 && errno != EINTR)
            return csd_err_set(err, CSD_EIO, "peer %s: poll: %s", c->peer, strerror(errno));
        if (pr == 0 && *deadline_ns == 0)
            return csd_err_set(err, CSD_ETIMEOUT, "peer %s: no frame within %d ms", c->peer,
                               first_wait_ms);
    }
    return 0;
}

/* Writes all iovecs (modified in place) by the link timeout. */
static int write_all(csd_conn *c, struct iovec *iov, int niov, csd_err *err) {
    uint64_t deadline = csd_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    while (niov > 0) {
        if (atomic_load(&c->closed))
            return csd_err_set(err, CSD_ECLOSED, "peer %s: link closed", c->peer);
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)niov;
        ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return csd_err_set(err, CSD_ECLOSED, "peer %s: send: %s", c->peer,
                                   strerror(errno));
            int wait = csd_conn_remaining_ms(deadline);
            if (wait == 0)
                return csd_err_set(err, CSD_ETIMEOUT, "peer %s: send stalled for %d ms", c->peer,
                                   c->timeout_ms);
            struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
            (void)poll(&pfd, 1, wait);
            continue;
        }
        size_t left = (size_t)w;
        while (niov > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            niov--;
        }
        if (niov > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* ---- framing ---- */

static void nonce_from_counter(uint8_t nonce[NONCE_SIZE], uint64_t counter) {
    memset(nonce, 0, NONCE_SIZE);
    csd_wire_put_u64(nonce, counter);
}

static uint64_t frame_checksum(const uint8_t hdr[CSD_WIRE_HDR_SIZE], const uint8_t *payload,
                               size_t len) {
    /* The header hash seeds the payload hash so a flipped header bit is caught too. */
    uint64_t seed = XXH64(hdr, CSD_WIRE_HDR_SIZE, 0);
    return XXH64(len ? payload : hdr, len, seed);
}

/* Sends one frame in the given mode. Caller holds send_lock. */
static int send_frame_locked(csd_conn *c, const csd_wire_hdr *h, const void *payload, size_t len,
                             int mode, csd_err *err) {
    if (h->payload_len != len)
        return csd_err_set(err, CSD_EINVAL, "send: header payload_len %u != %zu",
                           (unsigned)h->payload_len, len);
    uint8_t hb[CSD_WIRE_HDR_SIZE];
    int rc = csd_wire_encode_hdr(hb, h, err);
    if (rc) return rc;
    uint8_t trailer[TAG_SIZE];
    struct iovec iov[3];
    int niov = 0;
    iov[niov++] = (struct iovec){.iov_base = hb, .iov_len = sizeof hb};
    if (mode == MODE_PLAIN) {
        csd_wire_put_u64(trailer, frame_checksum(hb, payload, len));
        if (len)
            iov[niov++] = (struct iovec){.iov_base = (void *)(uintptr_t)payload, .iov_len = len};
        iov[niov++] = (struct iovec){.iov_base = trailer, .iov_len = CHECKSUM_SIZE};
    } else {
        if (c->tx.counter == UINT64_MAX)
            return csd_err_set(err, CSD_EPROTO, "peer %s: send nonce counter exhausted", c->peer);
        if (len > c->sendcap) {
            size_t want = c->sendcap ? c->sendcap : 4096;
            while (want < len) want *= 2;
            uint8_t *p = csd_alloc(want);
            if (!p) return csd_err_set(err, CSD_ENOMEM, "send buffer of %zu bytes", want);
            csd_free(c->sendbuf);
            c->sendbuf = p;
            c->sendcap = want;
        }
        uint8_t nonce[NONCE_SIZE];
        nonce_from_counter(nonce, c->tx.counter);
        unsigned long long maclen = 0;
        uint8_t *ct = c->sendbuf ? c->sendbuf : trailer; /* any valid pointer when len == 0 */
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
            ct, trailer, &maclen, (const unsigned char *)payload, len, hb, sizeof hb, NULL, nonce,
            c->tx.key);
        c->tx.counter++;
        if (len) iov[niov++] = (struct iovec){.iov_base = c->sendbuf, .iov_len = len};
        iov[niov++] = (struct iovec){.iov_base = trailer, .iov_len = TAG_SIZE};
    }
    rc = write_all(c, iov, niov, err);
    if (rc) return rc;
    atomic_fetch_add(&c->frames_out, 1);
    atomic_fetch_add(&c->bytes_out, CSD_WIRE_HDR_SIZE + len +
                                        (mode == MODE_PLAIN ? CHECKSUM_SIZE : TAG_SIZE));
    return 0;
}

int csd_conn_send_frame(csd_conn *c, const csd_wire_hdr *h, const void *payload, size_t len,
                        int mode, csd_err *err) {
    pthread_mutex_lock(&c->send_lock);
    int rc = send_frame_locked(c, h, payload, len, mode, err);
    pthread_mutex_unlock(&c->send_lock);
    return rc;
}

int csd_conn_recv_frame_locked(csd_conn *c, csd_wire_hdr *h, csd_netbuf *buf, int idle_timeout_ms,
                               bool allow_plain_error, csd_err *err) {
    uint8_t hb[CSD_WIRE_HDR_SIZE];
    uint64_t deadline = 0;
    size_t got = 0;
    int rc = read_exact(c, hb, sizeof hb, idle_timeout_ms, &deadline, &got, err);
    if (rc) return rc;
    rc = csd_wire_decode_hdr(hb, sizeof hb, h, err);
    if (rc) {
        char dump[2 * CSD_WIRE_HDR_SIZE + 1];
        sodium_bin2hex(dump, sizeof dump, hb, sizeof hb);
        CSD_LOGW("net: bad frame header peer=%s bytes=%s: %s", c->peer, dump,
                 err ? err->msg : "");
        return rc;
    }
    int mode = atomic_load(&c->mode);
    if (mode == MODE_SECURE && allow_plain_error && h->type == CSD_WIRE_ERROR) mode = MODE_PLAIN;
    size_t len = h->payload_len;
    /* In a handshake (the only reads that take a plain ERROR) nobody is authenticated yet: a
     * stranger's header must not make this side reserve a 64 MiB buffer for its payload. */
    if (allow_plain_error && len > CSD_WIRE_HANDSHAKE_MAX_PAYLOAD)
        return csd_err_set(err, CSD_EPROTO,
                           "peer %s: a %s frame of %zu bytes during the handshake (at most %u)",
                           c->peer, csd_wire_type_name(h->type), len,
                           CSD_WIRE_HANDSHAKE_MAX_PAYLOAD);
    if ((rc = netbuf_reserve(buf, len ? len : 1, err))) return rc;
    uint8_t trailer[TAG_SIZE];
    size_t tlen = mode == MODE_PLAIN ? CHECKSUM_SIZE : TAG_SIZE;
    if (len && (rc = read_exact(c, buf->data, len, 0, &deadline, &got, err))) return rc;
    if ((rc = read_exact(c, trailer, tlen, 0, &deadline, &got, err))) return rc;
    if (mode == MODE_PLAIN) {
        uint64_t want = frame_checksum(hb, buf->data, len), have = csd_wire_get_u64(trailer);
        if (want != have) {
            char dump[2 * CSD_WIRE_HDR_SIZE + 1];
            sodium_bin2hex(dump, sizeof dump, hb, sizeof hb);
            CSD_LOGW("net: checksum mismatch peer=%s type=%s len=%zu hdr=%s", c->peer,
                     csd_wire_type_name(h->type), len, dump);
            return csd_err_set(err, CSD_EPROTO,
                               "peer %s: %s frame checksum mismatch (corrupted in transit)",
                               c->peer, csd_wire_type_name(h->type));
        }
    } else {
        if (c->rx.counter == UINT64_MAX)
            return csd_err_set(err, CSD_EPROTO, "peer %s: receive nonce counter exhausted",
                               c->peer);
        uint8_t nonce[NONCE_SIZE];
        nonce_from_counter(nonce, c->rx.counter);
        if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(buf->data, NULL, buf->data, len,
                                                                trailer, hb, sizeof hb, nonce,
                                                                c->rx.key) != 0) {
            CSD_LOGW("net: frame failed authentication peer=%s type=%s len=%zu counter=%llu",
                     c->peer, csd_wire_type_name(h->type), len,
                     (unsigned long long)c->rx.counter);
            return csd_err_set(err, CSD_EAUTH,
                               "peer %s: %s frame failed authentication (altered, replayed, "
                               "reordered or wrong key)",
                               c->peer, csd_wire_type_name(h->type));
        }
        c->rx.counter++;
    }
    atomic_fetch_add(&c->frames_in, 1);
    atomic_fetch_add(&c->bytes_in, CSD_WIRE_HDR_SIZE + len + tlen);
    return 0;
}

void csd_conn_fail_link(csd_conn *c) {
    atomic_store(&c->closed, true);
    shutdown(c->fd, SHUT_RDWR);
}

int csd_conn_send(csd_conn *c, const csd_wire_hdr *h, const void *payload, size_t len,
                  csd_err *err) {
    if (atomic_load(&c->closed))
        return csd_err_set(err, CSD_ECLOSED, "peer %s: link closed", c->peer);
    pthread_mutex_lock(&c->send_lock);
    int rc = send_frame_locked(c, h, payload, len, atomic_load(&c->mode), err);
    pthread_mutex_unlock(&c->send_lock);
    /* A partly written frame desynchronizes the stream: the link cannot be used again. */
    if (rc && rc != CSD_EINVAL) csd_conn_fail_link(c);
    return rc;
}

int csd_conn_recv(csd_conn *c, csd_wire_hdr *h, csd_netbuf *buf, int idle_timeout_ms,
                  csd_err *err) {
    if (atomic_load(&c->closed))
        return csd_err_set(err, CSD_ECLOSED, "peer %s: link closed", c->peer);
    pthread_mutex_lock(&c->recv_lock);
    int rc = csd_conn_recv_frame_locked(c, h, buf, idle_timeout_ms, false, err);
    pthread_mutex_unlock(&c->recv_lock);
    if (rc && rc != CSD_ETIMEOUT) {
        if (rc != CSD_ECLOSED)
            CSD_LOGW("net: closing link peer=%s code=%s: %s", c->peer, csd_err_name(rc),
                     err ? err->msg : "");
        csd_conn_fail_link(c);
    }
    return rc;
}

int csd_conn_send_error(csd_conn *c, uint32_t request_id, int code, const char *text,
                        csd_err *err) {
    uint8_t p[CSD_WIRE_ERROR_HDR_SIZE + CSD_WIRE_MAX_ERROR_TEXT];
    size_t len = 0;
    int rc = csd_wire_encode_error(p, sizeof p, code, text, &len, err);
    if (rc) return rc;
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_ERROR, 0, request_id, 0, (uint32_t)len);
    return csd_conn_send(c, &h, p, len, err);
}
