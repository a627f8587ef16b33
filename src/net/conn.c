/* conn: TCP links with the Cascadia handshake, AEAD or checksum framing (see conn.h, protocol.md).
 * On the wire a frame is header(20, cleartext) | body(payload_len) | trailer, where the trailer is
 * xxhash64 (8 bytes) in plain mode, or the Poly1305 tag (16 bytes) with the body encrypted and the
 * header as associated data in secure mode. Nonces are implicit per-direction counters, so a
 * replayed, dropped or reordered frame fails authentication. */
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
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

#define CHECKSUM_SIZE 8u
#define TAG_SIZE crypto_aead_xchacha20poly1305_ietf_ABYTES
#define KEY_SIZE crypto_aead_xchacha20poly1305_ietf_KEYBYTES
#define NONCE_SIZE crypto_aead_xchacha20poly1305_ietf_NPUBBYTES
#define TRANSCRIPT_SIZE 32u

_Static_assert(TAG_SIZE == 16, "tag size is part of the wire format");
_Static_assert(KEY_SIZE == 32 && NONCE_SIZE == 24, "xchacha20poly1305 sizes");
_Static_assert(TRANSCRIPT_SIZE == CSD_WIRE_AUTH_SIZE, "AUTH carries the transcript hash");

/* Label of the session-key derivation; changing it is a protocol version bump. */
static const char kdf_label[] = "cascadia link v1 session keys";

enum link_mode { MODE_PLAIN = 0, MODE_SECURE = 1 };

/* One direction of a link: its key and the counter that forms the next nonce. */
typedef struct link_dir {
    uint8_t key[KEY_SIZE];
    uint64_t counter;
} link_dir;

struct csd_conn {
    int fd;
    int timeout_ms;       /* stall limit for a started frame, and for sends */
    atomic_int mode;      /* enum link_mode; switches once, during the handshake */
    atomic_bool closed;
    pthread_mutex_t send_lock; /* guards tx, sendbuf */
    pthread_mutex_t recv_lock; /* guards rx */
    link_dir tx, rx;
    uint8_t *sendbuf; /* ciphertext staging, grown once to the largest frame sent */
    size_t sendcap;
    atomic_uint_least64_t frames_in, frames_out, bytes_in, bytes_out;
    char peer[CSD_CONN_PEER_MAX];
};

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

void csd_conn_get_counters(const csd_conn *c, csd_conn_counters *out) {
    out->frames_in = atomic_load(&c->frames_in);
    out->frames_out = atomic_load(&c->frames_out);
    out->bytes_in = atomic_load(&c->bytes_in);
    out->bytes_out = atomic_load(&c->bytes_out);
}

static int remaining_ms(uint64_t deadline_ns) {
    uint64_t now = csd_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 1000000000ull ? 1000000000 : (int)ms;
}

int csd_conn_connect(csd_conn **out, const char *host_port, int timeout_ms, csd_err *err) {
    *out = NULL;
    char host[256], port[16];
    int rc = split_host_port(host_port, host, sizeof host, port, sizeof port, err);
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
                pr = poll(&pfd, 1, remaining_ms(deadline));
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
        int wait = timeout_ms >= 0 ? remaining_ms(deadline) : -1;
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
        int wait = *deadline_ns ? remaining_ms(*deadline_ns) : first_wait_ms;
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
            int wait = remaining_ms(deadline);
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

static int send_frame(csd_conn *c, const csd_wire_hdr *h, const void *payload, size_t len,
                      int mode, csd_err *err) {
    pthread_mutex_lock(&c->send_lock);
    int rc = send_frame_locked(c, h, payload, len, mode, err);
    pthread_mutex_unlock(&c->send_lock);
    return rc;
}

/* Hex dump of at most n bytes for a protocol-error log line (sanitized: hex only). */
static void hex_dump(const uint8_t *p, size_t n, char *out, size_t cap) {
    static const char hx[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n && o + 3 < cap; i++) {
        out[o++] = hx[p[i] >> 4];
        out[o++] = hx[p[i] & 15];
    }
    out[o] = '\0';
}

/* Receives one frame. In secure mode with allow_plain_error, an ERROR frame is accepted in plain
 * framing (a peer that failed to authenticate us cannot encrypt to us). Caller holds recv_lock.
 * Does not close the link: the callers decide (and log). */
static int recv_frame_locked(csd_conn *c, csd_wire_hdr *h, csd_netbuf *buf, int idle_timeout_ms,
                             bool allow_plain_error, csd_err *err) {
    uint8_t hb[CSD_WIRE_HDR_SIZE];
    uint64_t deadline = 0;
    size_t got = 0;
    int rc = read_exact(c, hb, sizeof hb, idle_timeout_ms, &deadline, &got, err);
    if (rc) return rc;
    rc = csd_wire_decode_hdr(hb, sizeof hb, h, err);
    if (rc) {
        char dump[2 * CSD_WIRE_HDR_SIZE + 1];
        hex_dump(hb, sizeof hb, dump, sizeof dump);
        CSD_LOGW("net: bad frame header peer=%s bytes=%s: %s", c->peer, dump,
                 err ? err->msg : "");
        return rc;
    }
    int mode = atomic_load(&c->mode);
    if (mode == MODE_SECURE && allow_plain_error && h->type == CSD_WIRE_ERROR) mode = MODE_PLAIN;
    size_t len = h->payload_len;
    if ((rc = netbuf_reserve(buf, len ? len : 1, err))) return rc;
    uint8_t trailer[TAG_SIZE];
    size_t tlen = mode == MODE_PLAIN ? CHECKSUM_SIZE : TAG_SIZE;
    if (len && (rc = read_exact(c, buf->data, len, 0, &deadline, &got, err))) return rc;
    if ((rc = read_exact(c, trailer, tlen, 0, &deadline, &got, err))) return rc;
    if (mode == MODE_PLAIN) {
        uint64_t want = frame_checksum(hb, buf->data, len), have = csd_wire_get_u64(trailer);
        if (want != have) {
            char dump[2 * CSD_WIRE_HDR_SIZE + 1];
            hex_dump(hb, sizeof hb, dump, sizeof dump);
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

/* Marks the link failed and wakes the peer (it sees EOF). */
static void fail_link(csd_conn *c) {
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
    if (rc && rc != CSD_EINVAL) fail_link(c);
    return rc;
}

int csd_conn_recv(csd_conn *c, csd_wire_hdr *h, csd_netbuf *buf, int idle_timeout_ms,
                  csd_err *err) {
    if (atomic_load(&c->closed))
        return csd_err_set(err, CSD_ECLOSED, "peer %s: link closed", c->peer);
    pthread_mutex_lock(&c->recv_lock);
    int rc = recv_frame_locked(c, h, buf, idle_timeout_ms, false, err);
    pthread_mutex_unlock(&c->recv_lock);
    if (rc && rc != CSD_ETIMEOUT) {
        if (rc != CSD_ECLOSED)
            CSD_LOGW("net: closing link peer=%s code=%s: %s", c->peer, csd_err_name(rc),
                     err ? err->msg : "");
        fail_link(c);
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

/* ---- handshake ---- */

/* Closes after a refusal so the peer can still read our ERROR: half-close, then drain what it had
 * already sent (bounded), because closing with unread input makes TCP send RST, which can destroy
 * the ERROR in the peer's receive queue. */
static void linger_close(csd_conn *c) {
    enum { LINGER_MS = 200, DRAIN_MAX = 1 << 20 };
    shutdown(c->fd, SHUT_WR);
    uint64_t deadline = csd_now_ns() + (uint64_t)LINGER_MS * 1000000ull;
    uint8_t sink[4096];
    size_t drained = 0;
    while (drained < DRAIN_MAX) {
        int wait = remaining_ms(deadline);
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (wait == 0 || poll(&pfd, 1, wait) <= 0) break;
        ssize_t r = recv(c->fd, sink, sizeof sink, 0);
        if (r <= 0) break;
        drained += (size_t)r;
    }
    fail_link(c);
}

/* Refuses the handshake: best-effort ERROR frame in plain framing, log, close. Returns code. */
static int refuse(csd_conn *c, int code, const char *text, const char *side) {
    uint8_t p[CSD_WIRE_ERROR_HDR_SIZE + CSD_WIRE_MAX_ERROR_TEXT];
    size_t len = 0;
    if (csd_wire_encode_error(p, sizeof p, code, text, &len, NULL) == 0) {
        csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_ERROR, 0, 0, 0, (uint32_t)len);
        (void)send_frame(c, &h, p, len, MODE_PLAIN, NULL);
    }
    CSD_LOGW("net: handshake refused side=%s peer=%s code=%s: %s", side, c->peer,
             csd_err_name(code), text);
    linger_close(c);
    return code;
}

/* The peer refused us: turn its ERROR payload into our error. */
static int peer_refused(csd_conn *c, const csd_netbuf *buf, const csd_wire_hdr *h, csd_err *err) {
    csd_wire_error e;
    int rc = csd_wire_decode_error(buf->data, h->payload_len, &e, err);
    fail_link(c);
    if (rc) return rc;
    int code = e.code;
    /* Only our own negative codes are meaningful; anything else is a protocol error. */
    if (code >= 0 || strcmp(csd_err_name(code), "CSD_E?") == 0) code = CSD_EPROTO;
    CSD_LOGW("net: handshake refused by peer=%s code=%s: %s", c->peer, csd_err_name(code), e.text);
    return csd_err_set(err, code, "peer %s refused the handshake: %s", c->peer, e.text);
}

static void hash_short(const uint8_t h[CSD_WIRE_HASH_SIZE], char out[17]) {
    sodium_bin2hex(out, 17, h, 8);
}

/* A HELLO number for messages: "*" for CSD_WIRE_ANY. */
static void num_text(uint32_t v, char *out, size_t cap) {
    if (v == CSD_WIRE_ANY)
        snprintf(out, cap, "*");
    else
        snprintf(out, cap, "%u", (unsigned)v);
}

static void range_text(const csd_wire_hello *h, char *out, size_t cap) {
    char b[12], e[12];
    num_text(h->layer_begin, b, sizeof b);
    num_text(h->layer_end, e, sizeof e);
    snprintf(out, cap, "[%s,%s)", b, e);
}

/* Compares a HELLO the client sent (want) with what the server serves (have). want may use
 * CSD_WIRE_ANY for stage and layers. Writes a message naming both sides on mismatch. */
static int compare_hello(const csd_wire_hello *want, const csd_wire_hello *have,
                         const char *want_name, const char *have_name, char *msg, size_t cap) {
    if (want->proto_version != have->proto_version) {
        snprintf(msg, cap, "protocol version mismatch: %s %u, %s %u", want_name,
                 (unsigned)want->proto_version, have_name, (unsigned)have->proto_version);
        return CSD_EMISMATCH;
    }
    bool wi = want->caps & CSD_WIRE_CAP_INSECURE, hi = have->caps & CSD_WIRE_CAP_INSECURE;
    if (wi != hi) {
        snprintf(msg, cap, "link mode mismatch: %s %s, %s %s", want_name,
                 wi ? "insecure" : "encrypted", have_name, hi ? "insecure" : "encrypted");
        return CSD_EMISMATCH;
    }
    if (memcmp(want->model_hash, have->model_hash, CSD_WIRE_HASH_SIZE) != 0) {
        char a[17], b[17];
        hash_short(want->model_hash, a);
        hash_short(have->model_hash, b);
        snprintf(msg, cap, "model hash mismatch: %s %s..., %s %s...", want_name, a, have_name, b);
        return CSD_EMISMATCH;
    }
    char wr[32], hr[32], ws[12], hs[12];
    range_text(want, wr, sizeof wr);
    range_text(have, hr, sizeof hr);
    num_text(want->stage_index, ws, sizeof ws);
    num_text(have->stage_index, hs, sizeof hs);
    if (want->stage_index != CSD_WIRE_ANY && want->stage_index != have->stage_index) {
        snprintf(msg, cap, "stage mismatch: %s stage %s layers %s, %s stage %s layers %s",
                 want_name, ws, wr, have_name, hs, hr);
        return CSD_EMISMATCH;
    }
    if ((want->layer_begin != CSD_WIRE_ANY && want->layer_begin != have->layer_begin) ||
        (want->layer_end != CSD_WIRE_ANY && want->layer_end != have->layer_end)) {
        snprintf(msg, cap, "layer range mismatch: %s %s, %s %s", want_name, wr, have_name, hr);
        return CSD_EMISMATCH;
    }
    return 0;
}

/* th = BLAKE2b-256(HELLO payload | HELLO_OK payload); (k_c2s | k_s2c) = BLAKE2b-512 keyed with the
 * fleet key over label | th. Both nonces are in the transcript, so every link gets fresh keys. */
static void derive_keys(const csd_fleet_key *key, const uint8_t *hello, const uint8_t *hello_ok,
                        uint8_t th[TRANSCRIPT_SIZE], uint8_t k_c2s[KEY_SIZE],
                        uint8_t k_s2c[KEY_SIZE]) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, TRANSCRIPT_SIZE);
    crypto_generichash_update(&st, hello, CSD_WIRE_HELLO_SIZE);
    crypto_generichash_update(&st, hello_ok, CSD_WIRE_HELLO_SIZE);
    crypto_generichash_final(&st, th, TRANSCRIPT_SIZE);
    uint8_t okm[2 * KEY_SIZE];
    crypto_generichash_init(&st, key->bytes, CSD_FLEET_KEY_SIZE, sizeof okm);
    crypto_generichash_update(&st, (const uint8_t *)kdf_label, sizeof kdf_label - 1);
    crypto_generichash_update(&st, th, TRANSCRIPT_SIZE);
    crypto_generichash_final(&st, okm, sizeof okm);
    memcpy(k_c2s, okm, KEY_SIZE);
    memcpy(k_s2c, okm + KEY_SIZE, KEY_SIZE);
    sodium_memzero(okm, sizeof okm);
    sodium_memzero(&st, sizeof st);
}

static int check_cfg(const csd_link_cfg *cfg, csd_err *err) {
    if (!cfg) return csd_err_set(err, CSD_EINVAL, "handshake: no link configuration");
    if (!cfg->insecure && !cfg->key)
        return csd_err_set(err, CSD_EINVAL, "handshake: a fleet key is required (or --insecure)");
    if (sodium_init() < 0) return csd_err_set(err, CSD_EIO, "libsodium initialisation failed");
    return 0;
}

static int send_auth(csd_conn *c, const uint8_t th[TRANSCRIPT_SIZE], csd_err *err) {
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_AUTH, 0, 0, 0, TRANSCRIPT_SIZE);
    return send_frame(c, &h, th, TRANSCRIPT_SIZE, MODE_SECURE, err);
}

int csd_conn_handshake_client(csd_conn *c, const csd_link_cfg *cfg, const csd_wire_hello *expect,
                              csd_wire_hello *peer, csd_err *err) {
    int rc = check_cfg(cfg, err);
    if (rc) return rc;
    if (atomic_load(&c->closed))
        return csd_err_set(err, CSD_ECLOSED, "peer %s: link closed", c->peer);
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : CSD_CONN_DEFAULT_TIMEOUT_MS;
    csd_wire_hello mine = *expect;
    mine.proto_version = CSD_WIRE_VERSION;
    mine.caps = cfg->insecure ? (mine.caps | CSD_WIRE_CAP_INSECURE)
                              : (mine.caps & ~(uint32_t)CSD_WIRE_CAP_INSECURE);
    randombytes_buf(mine.nonce, sizeof mine.nonce);
    uint8_t hello[CSD_WIRE_HELLO_SIZE], hello_ok[CSD_WIRE_HELLO_SIZE];
    size_t len = 0;
    if ((rc = csd_wire_encode_hello(hello, sizeof hello, &mine, &len, err))) return rc;
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_HELLO, 0, 0, 0, (uint32_t)len);
    csd_netbuf buf = {0};
    uint8_t th[TRANSCRIPT_SIZE], k_c2s[KEY_SIZE], k_s2c[KEY_SIZE];
    pthread_mutex_lock(&c->recv_lock);
    if ((rc = send_frame(c, &h, hello, len, MODE_PLAIN, err))) goto fail;
    if ((rc = recv_frame_locked(c, &h, &buf, c->timeout_ms, true, err))) goto fail;
    if (h.type == CSD_WIRE_ERROR) {
        rc = peer_refused(c, &buf, &h, err);
        goto done;
    }
    if (h.type != CSD_WIRE_HELLO_OK) {
        rc = csd_err_set(err, CSD_EPROTO, "peer %s: expected HELLO_OK, got %s", c->peer,
                         csd_wire_type_name(h.type));
        goto fail;
    }
    csd_wire_hello theirs;
    if ((rc = csd_wire_decode_hello(buf.data, h.payload_len, &theirs, err))) goto fail;
    memcpy(hello_ok, buf.data, CSD_WIRE_HELLO_SIZE);
    char msg[CSD_ERR_MSG_MAX];
    if ((rc = compare_hello(&mine, &theirs, "local expects", "peer serves", msg, sizeof msg))) {
        /* The server accepted what it should not have, or answered with other values. */
        char text[CSD_ERR_MSG_MAX + 32];
        snprintf(text, sizeof text, "client refuses: %s", msg);
        refuse(c, rc, text, "client");
        rc = csd_err_set(err, rc, "peer %s: %s", c->peer, msg);
        goto done;
    }
    if (peer) *peer = theirs;
    if (cfg->insecure) {
        rc = 0;
        goto done;
    }
    derive_keys(cfg->key, hello, hello_ok, th, k_c2s, k_s2c);
    pthread_mutex_lock(&c->send_lock);
    memcpy(c->tx.key, k_c2s, KEY_SIZE);
    memcpy(c->rx.key, k_s2c, KEY_SIZE);
    c->tx.counter = c->rx.counter = 0;
    atomic_store(&c->mode, MODE_SECURE);
    pthread_mutex_unlock(&c->send_lock);
    if ((rc = send_auth(c, th, err))) goto fail;
    if ((rc = recv_frame_locked(c, &h, &buf, c->timeout_ms, true, err))) goto fail;
    if (h.type == CSD_WIRE_ERROR) {
        rc = peer_refused(c, &buf, &h, err);
        goto done;
    }
    if (h.type != CSD_WIRE_AUTH || sodium_memcmp(buf.data, th, TRANSCRIPT_SIZE) != 0) {
        rc = csd_err_set(err, CSD_EAUTH, "peer %s: bad AUTH from server", c->peer);
        goto fail;
    }
    CSD_LOGD("net: link up side=client peer=%s stage=%u layers=[%u,%u) mode=encrypted", c->peer,
             (unsigned)theirs.stage_index, (unsigned)theirs.layer_begin,
             (unsigned)theirs.layer_end);
    rc = 0;
    goto done;
fail:
    CSD_LOGW("net: handshake failed side=client peer=%s code=%s: %s", c->peer, csd_err_name(rc),
             err ? err->msg : "");
    fail_link(c);
done:
    pthread_mutex_unlock(&c->recv_lock);
    sodium_memzero(k_c2s, sizeof k_c2s);
    sodium_memzero(k_s2c, sizeof k_s2c);
    csd_netbuf_fini(&buf);
    return rc;
}

int csd_conn_handshake_server(csd_conn *c, const csd_link_cfg *cfg, const csd_wire_hello *self,
                              csd_wire_hello *peer, csd_err *err) {
    int rc = check_cfg(cfg, err);
    if (rc) return rc;
    if (atomic_load(&c->closed))
        return csd_err_set(err, CSD_ECLOSED, "peer %s: link closed", c->peer);
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : CSD_CONN_DEFAULT_TIMEOUT_MS;
    csd_wire_hello mine = *self;
    mine.proto_version = CSD_WIRE_VERSION;
    mine.caps = cfg->insecure ? (mine.caps | CSD_WIRE_CAP_INSECURE)
                              : (mine.caps & ~(uint32_t)CSD_WIRE_CAP_INSECURE);
    randombytes_buf(mine.nonce, sizeof mine.nonce);
    uint8_t hello[CSD_WIRE_HELLO_SIZE], hello_ok[CSD_WIRE_HELLO_SIZE];
    size_t len = 0;
    if ((rc = csd_wire_encode_hello(hello_ok, sizeof hello_ok, &mine, &len, err))) return rc;
    csd_netbuf buf = {0};
    csd_wire_hdr h;
    uint8_t th[TRANSCRIPT_SIZE], k_c2s[KEY_SIZE], k_s2c[KEY_SIZE];
    char msg[CSD_ERR_MSG_MAX];
    pthread_mutex_lock(&c->recv_lock);
    rc = recv_frame_locked(c, &h, &buf, c->timeout_ms, true, err);
    if (rc) {
        if (rc == CSD_EPROTO) { /* e.g. another protocol version: tell the peer why */
            refuse(c, rc, err ? err->msg : "bad HELLO frame", "server");
            goto done;
        }
        goto fail;
    }
    if (h.type == CSD_WIRE_ERROR) {
        rc = peer_refused(c, &buf, &h, err);
        goto done;
    }
    if (h.type != CSD_WIRE_HELLO) {
        snprintf(msg, sizeof msg, "expected HELLO as the first frame, got %s",
                 csd_wire_type_name(h.type));
        rc = refuse(c, CSD_EPROTO, msg, "server");
        csd_err_set(err, rc, "peer %s: %s", c->peer, msg);
        goto done;
    }
    csd_wire_hello theirs;
    if ((rc = csd_wire_decode_hello(buf.data, h.payload_len, &theirs, err))) {
        refuse(c, rc, err ? err->msg : "bad HELLO", "server");
        goto done;
    }
    memcpy(hello, buf.data, CSD_WIRE_HELLO_SIZE);
    if ((rc = compare_hello(&theirs, &mine, "peer expects", "local serves", msg, sizeof msg))) {
        refuse(c, rc, msg, "server");
        csd_err_set(err, rc, "peer %s: %s", c->peer, msg);
        goto done;
    }
    h = csd_wire_hdr_make(CSD_WIRE_HELLO_OK, 0, 0, 0, (uint32_t)len);
    if ((rc = send_frame(c, &h, hello_ok, len, MODE_PLAIN, err))) goto fail;
    if (peer) *peer = theirs;
    if (cfg->insecure) {
        rc = 0;
        goto done;
    }
    derive_keys(cfg->key, hello, hello_ok, th, k_c2s, k_s2c);
    pthread_mutex_lock(&c->send_lock);
    memcpy(c->tx.key, k_s2c, KEY_SIZE);
    memcpy(c->rx.key, k_c2s, KEY_SIZE);
    c->tx.counter = c->rx.counter = 0;
    atomic_store(&c->mode, MODE_SECURE);
    pthread_mutex_unlock(&c->send_lock);
    rc = recv_frame_locked(c, &h, &buf, c->timeout_ms, true, err);
    if (rc == CSD_EAUTH) {
        refuse(c, CSD_EAUTH,
               "fleet key mismatch: the client's AUTH frame failed authentication", "server");
        csd_err_set(err, CSD_EAUTH, "peer %s: fleet key mismatch (AUTH failed authentication)",
                    c->peer);
        goto done;
    }
    if (rc) goto fail;
    if (h.type == CSD_WIRE_ERROR) {
        rc = peer_refused(c, &buf, &h, err);
        goto done;
    }
    if (h.type != CSD_WIRE_AUTH || sodium_memcmp(buf.data, th, TRANSCRIPT_SIZE) != 0) {
        rc = refuse(c, CSD_EAUTH, "expected AUTH with the transcript hash", "server");
        csd_err_set(err, rc, "peer %s: bad AUTH frame", c->peer);
        goto done;
    }
    if ((rc = send_auth(c, th, err))) goto fail;
    CSD_LOGD("net: link up side=server peer=%s role=%s mode=encrypted", c->peer,
             csd_wire_role_name(theirs.role));
    rc = 0;
    goto done;
fail:
    CSD_LOGW("net: handshake failed side=server peer=%s code=%s: %s", c->peer, csd_err_name(rc),
             err ? err->msg : "");
    fail_link(c);
done:
    pthread_mutex_unlock(&c->recv_lock);
    sodium_memzero(k_c2s, sizeof k_c2s);
    sodium_memzero(k_s2c, sizeof k_s2c);
    csd_netbuf_fini(&buf);
    return rc;
}
