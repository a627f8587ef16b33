/* test_net_link: real links over 127.0.0.1 ephemeral ports. Handshake with the same key works; a
 * different key, a model-hash, layer-range or link-mode mismatch are refused with a message naming
 * both sides; frames altered or replayed by a man in the middle are refused; the insecure checksum
 * catches a flipped byte; a large hidden-state frame round-trips with no allocation per frame. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "net/conn.h"
#include "net/fleet_key.h"
#include "net/wire.h"

#define TIMEOUT_MS 5000

/* ---- a test server: accept one link, handshake, echo frames until CLOSE or an error ---- */

typedef struct server_ctx {
    csd_listener *l;
    csd_link_cfg cfg;
    csd_wire_hello self;
    int hs_rc;
    csd_err hs_err;
    csd_wire_hello peer;
    int loop_rc;
    csd_err loop_err;
    int frames_ok;
    bool sink;              /* do not echo FORWARD frames (one-way throughput) */
    pthread_t th;
} server_ctx;

static void *server_main(void *arg) {
    server_ctx *s = arg;
    csd_conn *c = NULL;
    csd_err err = {0};
    s->hs_rc = csd_listener_accept(s->l, &c, TIMEOUT_MS, &err);
    if (s->hs_rc) {
        s->hs_err = err;
        return NULL;
    }
    s->hs_rc = csd_conn_handshake_server(c, &s->cfg, &s->self, &s->peer, &s->hs_err);
    if (s->hs_rc) {
        csd_conn_destroy(c);
        return NULL;
    }
    csd_netbuf buf = {0};
    for (;;) {
        csd_wire_hdr h;
        int rc = csd_conn_recv(c, &h, &buf, TIMEOUT_MS, &s->loop_err);
        if (rc) {
            s->loop_rc = rc;
            break;
        }
        s->frames_ok++;
        if (h.type == CSD_WIRE_CLOSE) break;
        if (s->sink && h.type == CSD_WIRE_FORWARD) continue;
        csd_wire_hdr r = h;
        if (h.type == CSD_WIRE_FORWARD) r.type = CSD_WIRE_RESULT;
        else if (h.type == CSD_WIRE_PING) r.type = CSD_WIRE_PONG;
        if (csd_conn_send(c, &r, buf.data, h.payload_len, &s->loop_err)) break;
    }
    csd_netbuf_fini(&buf);
    csd_conn_destroy(c);
    return NULL;
}

static csd_fleet_key key_a, key_b;

static csd_wire_hello hello_stage(uint32_t stage, uint32_t lb, uint32_t le, uint8_t hash_byte) {
    csd_wire_hello h;
    memset(&h, 0, sizeof h);
    h.role = CSD_WIRE_ROLE_STAGE;
    h.caps = CSD_WIRE_CAP_TRUNCATE;
    h.stage_index = stage;
    h.layer_begin = lb;
    h.layer_end = le;
    memset(h.model_hash, hash_byte, sizeof h.model_hash);
    return h;
}

static csd_wire_hello hello_coord(uint32_t stage, uint32_t lb, uint32_t le, uint8_t hash_byte) {
    csd_wire_hello h = hello_stage(stage, lb, le, hash_byte);
    h.role = CSD_WIRE_ROLE_COORD;
    return h;
}

static void server_start_sink(server_ctx *s, const csd_fleet_key *key, bool insecure,
                              csd_wire_hello self, bool sink) {
    memset(s, 0, sizeof *s);
    s->sink = sink;
    csd_err err = {0};
    assert_int_equal(csd_listener_open(&s->l, "127.0.0.1:0", &err), 0);
    assert_true(csd_listener_port(s->l) > 0);
    s->cfg = (csd_link_cfg){.key = key, .insecure = insecure, .timeout_ms = TIMEOUT_MS};
    s->self = self;
    assert_int_equal(pthread_create(&s->th, NULL, server_main, s), 0);
}

static void server_start(server_ctx *s, const csd_fleet_key *key, bool insecure,
                         csd_wire_hello self) {
    server_start_sink(s, key, insecure, self, false);
}

static void server_join(server_ctx *s) {
    pthread_join(s->th, NULL);
    csd_listener_destroy(s->l);
}

static int client_open(uint16_t port, const csd_fleet_key *key, bool insecure,
                       const csd_wire_hello *expect, csd_conn **out, csd_err *err) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
    int rc = csd_conn_connect(out, addr, TIMEOUT_MS, err);
    if (rc) return rc;
    csd_link_cfg cfg = {.key = key, .insecure = insecure, .timeout_ms = TIMEOUT_MS};
    csd_wire_hello peer;
    return csd_conn_handshake_client(*out, &cfg, expect, &peer, err);
}

static int setup(void **state) {
    (void)state;
    csd_err err = {0};
    if (csd_fleet_key_generate(&key_a, &err) || csd_fleet_key_generate(&key_b, &err)) return -1;
    return 0;
}

/* Sends a FORWARD carrying hidden states and checks the echoed RESULT byte for byte. */
static void forward_echo(csd_conn *c, uint32_t n, uint32_t dim, int dtype, csd_netbuf *rb) {
    float *x = csd_alloc_array((size_t)n * dim, sizeof(float));
    for (size_t i = 0; i < (size_t)n * dim; i++) x[i] = (float)((i * 2654435761u) % 1000u) / 100.0f;
    size_t cap = csd_wire_act_payload_size(CSD_WIRE_ACT_HIDDEN, dtype, n, dim);
    assert_true(cap > 0);
    uint8_t *p = csd_alloc(cap);
    size_t len = 0;
    csd_err err = {0};
    assert_int_equal(
        csd_wire_encode_rows_f32(p, cap, CSD_WIRE_ACT_HIDDEN, dtype, x, n, dim, &len, &err), 0);
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_HIDDEN, 42, 100,
                                       (uint32_t)len);
    assert_int_equal(csd_conn_send(c, &h, p, len, &err), 0);
    csd_wire_hdr r;
    assert_int_equal(csd_conn_recv(c, &r, rb, TIMEOUT_MS, &err), 0);
    assert_int_equal(r.type, CSD_WIRE_RESULT);
    assert_int_equal(r.request_id, 42);
    assert_int_equal(r.position, 100);
    assert_int_equal(r.payload_len, len);
    assert_memory_equal(rb->data, p, len);
    csd_wire_act a;
    assert_int_equal(csd_wire_decode_act(rb->data, r.payload_len, &a, &err), 0);
    assert_int_equal(a.n_tokens, n);
    assert_int_equal(a.dim, dim);
    csd_free(p);
    csd_free(x);
}

static void send_close(csd_conn *c) {
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_CLOSE, 0, 42, 0, 0);
    assert_int_equal(csd_conn_send(c, &h, NULL, 0, NULL), 0);
}

/* The usual link: a stage-0 server (layers [0,12), model hash 0xAB...) and a coordinator client
 * that expects exactly that, both with key_a; asserts that the handshake succeeded. */
static csd_conn *link_up(server_ctx *s) {
    server_start(s, &key_a, false, hello_stage(0, 0, 12, 0xAB));
    csd_conn *c = NULL;
    csd_err err = {0};
    csd_wire_hello want = hello_coord(0, 0, 12, 0xAB);
    assert_int_equal(client_open(csd_listener_port(s->l), &key_a, false, &want, &c, &err), 0);
    return c;
}

/* A handshake between a server that is self (with key_a) and a client that expects want (with
 * key, or insecure): returns the client's result, its message in err and the server's in
 * s->hs_err. */
static int handshake(server_ctx *s, csd_wire_hello self, const csd_fleet_key *key, bool insecure,
                     csd_wire_hello want, csd_err *err) {
    server_start(s, &key_a, false, self);
    csd_conn *c = NULL;
    int rc = client_open(csd_listener_port(s->l), key, insecure, &want, &c, err);
    if (!rc) send_close(c);
    server_join(s);
    csd_conn_destroy(c);
    return rc;
}

/* ---- tests ---- */

static void test_handshake_same_key(void **state) {
    (void)state;
    server_ctx s;
    server_start(&s, &key_a, false, hello_stage(1, 12, 24, 0xAB));
    csd_conn *c = NULL;
    csd_err err = {0};
    csd_wire_hello want = hello_coord(1, 12, 24, 0xAB);
    assert_int_equal(client_open(csd_listener_port(s.l), &key_a, false, &want, &c, &err), 0);
    csd_netbuf rb = {0};
    forward_echo(c, 3, 64, CSD_DTYPE_F16, &rb);
    /* PING / PONG */
    uint8_t p[8];
    size_t len;
    assert_int_equal(csd_wire_encode_ping(p, sizeof p, 99, &len, NULL), 0);
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_PING, 0, 0, 0, 8);
    assert_int_equal(csd_conn_send(c, &h, p, len, &err), 0);
    assert_int_equal(csd_conn_recv(c, &h, &rb, TIMEOUT_MS, &err), 0);
    assert_int_equal(h.type, CSD_WIRE_PONG);
    uint64_t t;
    assert_int_equal(csd_wire_decode_ping(rb.data, h.payload_len, &t, NULL), 0);
    assert_true(t == 99);
    send_close(c);
    server_join(&s);
    assert_int_equal(s.hs_rc, 0);
    assert_int_equal(s.peer.role, CSD_WIRE_ROLE_COORD);
    assert_int_equal(s.loop_rc, 0);
    assert_int_equal(s.frames_ok, 3);
    csd_conn_counters k;
    csd_conn_get_counters(c, &k);
    assert_true(k.frames_out >= 5 && k.frames_in >= 4); /* handshake frames count too */
    csd_netbuf_fini(&rb);
    csd_conn_destroy(c);
}

static void test_handshake_wildcard_expectations(void **state) {
    (void)state;
    server_ctx s;
    server_start(&s, &key_a, false, hello_stage(2, 8, 16, 0x11));
    csd_conn *c = NULL;
    csd_err err = {0};
    csd_wire_hello want = hello_coord(CSD_WIRE_ANY, CSD_WIRE_ANY, CSD_WIRE_ANY, 0x11);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)csd_listener_port(s.l));
    assert_int_equal(csd_conn_connect(&c, addr, TIMEOUT_MS, &err), 0);
    csd_link_cfg cfg = {.key = &key_a, .timeout_ms = TIMEOUT_MS};
    csd_wire_hello peer;
    assert_int_equal(csd_conn_handshake_client(c, &cfg, &want, &peer, &err), 0);
    assert_int_equal(peer.stage_index, 2);
    assert_int_equal(peer.layer_begin, 8);
    assert_int_equal(peer.layer_end, 16);
    assert_int_equal(peer.role, CSD_WIRE_ROLE_STAGE);
    send_close(c);
    server_join(&s);
    assert_int_equal(s.hs_rc, 0);
    csd_conn_destroy(c);
    /* half wildcard: "the next stage starts at layer 8, ends anywhere" */
    csd_wire_hello self = hello_stage(2, 8, 16, 0x11);
    want = hello_stage(2, 8, CSD_WIRE_ANY, 0x11);
    assert_int_equal(handshake(&s, self, &key_a, false, want, &err), 0);
    assert_int_equal(s.hs_rc, 0);
    want = hello_stage(2, 9, CSD_WIRE_ANY, 0x11);
    assert_int_equal(handshake(&s, self, &key_a, false, want, &err), CSD_EMISMATCH);
    assert_non_null(strstr(err.msg, "[9,*)"));
    assert_non_null(strstr(err.msg, "[8,16)"));
}

static void test_handshake_different_key_refused(void **state) {
    (void)state;
    server_ctx s;
    server_start(&s, &key_a, false, hello_stage(0, 0, 12, 0xAB));
    csd_conn *c = NULL;
    csd_err err = {0};
    csd_wire_hello want = hello_coord(0, 0, 12, 0xAB);
    int rc = client_open(csd_listener_port(s.l), &key_b, false, &want, &c, &err);
    assert_int_equal(rc, CSD_EAUTH);
    assert_non_null(strstr(err.msg, "fleet key"));
    server_join(&s);
    assert_int_equal(s.hs_rc, CSD_EAUTH);
    assert_non_null(strstr(s.hs_err.msg, "fleet key"));
    /* the link is closed on both sides */
    assert_true(csd_conn_is_closed(c));
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_CLOSE, 0, 1, 0, 0);
    assert_int_equal(csd_conn_send(c, &h, NULL, 0, NULL), CSD_ECLOSED);
    csd_conn_destroy(c);
}

static void test_handshake_model_hash_mismatch(void **state) {
    (void)state;
    server_ctx s;
    csd_err err = {0};
    assert_int_equal(handshake(&s, hello_stage(0, 0, 12, 0xAB), &key_a, false,
                               hello_coord(0, 0, 12, 0xCD), &err),
                     CSD_EMISMATCH);
    assert_int_equal(s.hs_rc, CSD_EMISMATCH);
    /* both messages name both hashes */
    assert_non_null(strstr(err.msg, "model hash mismatch"));
    assert_non_null(strstr(err.msg, "cdcdcdcd"));
    assert_non_null(strstr(err.msg, "abababab"));
    assert_non_null(strstr(s.hs_err.msg, "cdcdcdcd"));
    assert_non_null(strstr(s.hs_err.msg, "abababab"));
}

static void test_handshake_layer_range_mismatch(void **state) {
    (void)state;
    server_ctx s;
    csd_err err = {0};
    csd_wire_hello self = hello_stage(1, 12, 24, 0xAB);
    assert_int_equal(handshake(&s, self, &key_a, false, hello_coord(1, 12, 20, 0xAB), &err),
                     CSD_EMISMATCH);
    assert_int_equal(s.hs_rc, CSD_EMISMATCH);
    assert_non_null(strstr(err.msg, "[12,20)"));
    assert_non_null(strstr(err.msg, "[12,24)"));
    assert_non_null(strstr(s.hs_err.msg, "[12,20)"));
    assert_non_null(strstr(s.hs_err.msg, "[12,24)"));
    /* and a different stage index */
    assert_int_equal(handshake(&s, self, &key_a, false, hello_coord(2, 12, 24, 0xAB), &err),
                     CSD_EMISMATCH);
    assert_non_null(strstr(err.msg, "stage 2"));
    assert_non_null(strstr(err.msg, "stage 1"));
}

static void test_handshake_link_mode_mismatch(void **state) {
    (void)state;
    server_ctx s;
    csd_err err = {0};
    assert_int_equal(handshake(&s, hello_stage(0, 0, 12, 0xAB), NULL, true,
                               hello_coord(0, 0, 12, 0xAB), &err),
                     CSD_EMISMATCH);
    assert_int_equal(s.hs_rc, CSD_EMISMATCH);
    assert_non_null(strstr(err.msg, "insecure"));
    assert_non_null(strstr(err.msg, "encrypted"));
}

/* A plain TCP connection to 127.0.0.1:port, for peers that speak raw bytes. */
static int raw_connect(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void test_handshake_version_mismatch(void **state) {
    (void)state;
    server_ctx s;
    server_start(&s, &key_a, false, hello_stage(0, 0, 12, 0xAB));
    /* A raw peer speaking version 2. */
    int fd = raw_connect(csd_listener_port(s.l));
    uint8_t b[20 + CSD_WIRE_HELLO_SIZE + 8];
    memset(b, 0, sizeof b);
    csd_wire_put_u16(b, CSD_WIRE_MAGIC);
    b[2] = 2;
    b[3] = CSD_WIRE_HELLO;
    csd_wire_put_u32(b + 16, CSD_WIRE_HELLO_SIZE);
    assert_int_equal(write(fd, b, sizeof b), (ssize_t)sizeof b);
    /* We get an ERROR frame back in version-1 framing, then EOF. */
    uint8_t r[2048];
    size_t got = 0;
    ssize_t n;
    while ((n = read(fd, r + got, sizeof r - got)) > 0) got += (size_t)n;
    server_join(&s);
    assert_int_equal(s.hs_rc, CSD_EPROTO);
    assert_non_null(strstr(s.hs_err.msg, "peer speaks 2, local speaks 1"));
    csd_wire_hdr h;
    assert_true(got >= 20);
    assert_int_equal(csd_wire_decode_hdr(r, got, &h, NULL), 0);
    assert_int_equal(h.type, CSD_WIRE_ERROR);
    csd_wire_error e;
    assert_int_equal(csd_wire_decode_error(r + 20, h.payload_len, &e, NULL), 0);
    assert_int_equal(e.code, CSD_EPROTO);
    assert_non_null(strstr(e.text, "peer speaks 2, local speaks 1"));
    close(fd);
}

/* ---- a man in the middle: relays client->server frame by frame and can tamper ---- */

enum mitm_action { MITM_NONE, MITM_FLIP_PAYLOAD, MITM_FLIP_HEADER, MITM_REPLAY, MITM_DROP };

typedef struct mitm {
    int lfd;        /* listening socket for the client */
    uint16_t port;  /* its port */
    uint16_t server_port;
    bool insecure;  /* trailer sizes */
    int target;     /* index of the client->server frame to act on */
    int action;
    int cfd, sfd;
    pthread_t th, back;
} mitm;

static bool read_n(int fd, uint8_t *p, size_t n) {
    size_t off = 0;
    while (off < n) {
        ssize_t r = read(fd, p + off, n - off);
        if (r <= 0) return false;
        off += (size_t)r;
    }
    return true;
}

static bool write_n(int fd, const uint8_t *p, size_t n) {
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(fd, p + off, n - off, MSG_NOSIGNAL);
        if (w <= 0) return false;
        off += (size_t)w;
    }
    return true;
}

static void *mitm_back(void *arg) { /* server -> client: plain byte relay */
    mitm *m = arg;
    uint8_t b[65536];
    ssize_t n;
    while ((n = read(m->sfd, b, sizeof b)) > 0)
        if (!write_n(m->cfd, b, (size_t)n)) break;
    shutdown(m->cfd, SHUT_WR);
    return NULL;
}

static void *mitm_main(void *arg) {
    mitm *m = arg;
    m->cfd = accept(m->lfd, NULL, NULL);
    m->sfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(m->server_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (m->cfd < 0 || connect(m->sfd, (struct sockaddr *)&sa, sizeof sa) != 0) return NULL;
    pthread_create(&m->back, NULL, mitm_back, m);
    uint8_t *frame = malloc(20 + CSD_WIRE_MAX_PAYLOAD + 16);
    for (int idx = 0;; idx++) {
        if (!read_n(m->cfd, frame, 20)) break;
        uint32_t len = csd_wire_get_u32(frame + 16);
        uint8_t type = frame[3];
        size_t trailer = (m->insecure || type == CSD_WIRE_HELLO || type == CSD_WIRE_HELLO_OK ||
                          type == CSD_WIRE_ERROR)
                             ? 8
                             : 16;
        if (len > CSD_WIRE_MAX_PAYLOAD || !read_n(m->cfd, frame + 20, len + trailer)) break;
        size_t total = 20 + len + trailer;
        if (idx == m->target) {
            if (m->action == MITM_FLIP_PAYLOAD) frame[20 + len / 2] ^= 0x01;
            if (m->action == MITM_FLIP_HEADER) frame[12] ^= 0x01; /* position */
            if (m->action == MITM_DROP) continue;
            if (m->action == MITM_REPLAY && !write_n(m->sfd, frame, total)) break;
        }
        if (!write_n(m->sfd, frame, total)) break;
    }
    free(frame);
    shutdown(m->sfd, SHUT_WR);
    pthread_join(m->back, NULL);
    close(m->cfd);
    close(m->sfd);
    return NULL;
}

static void mitm_start(mitm *m, uint16_t server_port, bool insecure, int target, int action) {
    memset(m, 0, sizeof *m);
    m->server_port = server_port;
    m->insecure = insecure;
    m->target = target;
    m->action = action;
    m->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(m->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(m->lfd, 4), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(m->lfd, (struct sockaddr *)&sa, &sl), 0);
    m->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&m->th, NULL, mitm_main, m), 0);
}

static void mitm_join(mitm *m) {
    pthread_join(m->th, NULL);
    close(m->lfd);
}

/* Client -> MITM -> server; frame 0 is HELLO, frame 1 AUTH (secure), data starts after. */
static void run_tamper(bool insecure, int target, int action, int n_frames, int *server_frames,
                       int *server_rc, csd_err *server_err) {
    server_ctx s;
    server_start(&s, insecure ? NULL : &key_a, insecure, hello_stage(0, 0, 12, 0xAB));
    mitm m;
    mitm_start(&m, csd_listener_port(s.l), insecure, target, action);
    csd_conn *c = NULL;
    csd_err err = {0};
    csd_wire_hello want = hello_coord(0, 0, 12, 0xAB);
    assert_int_equal(client_open(m.port, insecure ? NULL : &key_a, insecure, &want, &c, &err), 0);
    uint8_t p[12 + 4 * 16];
    uint32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = (uint32_t)(1000 + i);
    size_t len;
    assert_int_equal(csd_wire_encode_ids(p, sizeof p, CSD_WIRE_ACT_TOKENS, ids, 16, &len, NULL), 0);
    for (int i = 0; i < n_frames; i++) {
        csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_SAMPLE, 7,
                                           (uint32_t)(16 * i), (uint32_t)len);
        (void)csd_conn_send(c, &h, p, len, NULL);
    }
    csd_wire_hdr ch = csd_wire_hdr_make(CSD_WIRE_CLOSE, 0, 7, 0, 0);
    (void)csd_conn_send(c, &ch, NULL, 0, NULL); /* the server may have closed already */
    server_join(&s);
    csd_conn_shutdown(c); /* EOF for the MITM's client side */
    mitm_join(&m);
    assert_int_equal(s.hs_rc, 0);
    *server_frames = s.frames_ok;
    *server_rc = s.loop_rc;
    *server_err = s.loop_err;
    csd_conn_destroy(c);
}

static void test_mitm_untouched_passes(void **state) {
    (void)state;
    int frames, rc;
    csd_err e;
    run_tamper(false, -1, MITM_NONE, 3, &frames, &rc, &e);
    assert_int_equal(rc, 0);
    assert_int_equal(frames, 4); /* 3 FORWARD + CLOSE */
    run_tamper(true, -1, MITM_NONE, 3, &frames, &rc, &e);
    assert_int_equal(rc, 0);
    assert_int_equal(frames, 4);
}

static void test_mitm_altered_payload_refused(void **state) {
    (void)state;
    int frames, rc;
    csd_err e;
    run_tamper(false, 3, MITM_FLIP_PAYLOAD, 3, &frames, &rc, &e); /* 2nd FORWARD */
    assert_int_equal(rc, CSD_EAUTH);
    assert_int_equal(frames, 1);
    assert_non_null(strstr(e.msg, "failed authentication"));
}

static void test_mitm_altered_header_refused(void **state) {
    (void)state;
    int frames, rc;
    csd_err e;
    run_tamper(false, 2, MITM_FLIP_HEADER, 3, &frames, &rc, &e); /* 1st FORWARD's position */
    assert_int_equal(rc, CSD_EAUTH);
    assert_int_equal(frames, 0);
}

static void test_mitm_replayed_frame_refused(void **state) {
    (void)state;
    int frames, rc;
    csd_err e;
    run_tamper(false, 2, MITM_REPLAY, 3, &frames, &rc, &e);
    assert_int_equal(rc, CSD_EAUTH);
    assert_int_equal(frames, 1); /* the original got through, its copy did not */
}

static void test_mitm_dropped_frame_refused(void **state) {
    (void)state;
    int frames, rc;
    csd_err e;
    run_tamper(false, 2, MITM_DROP, 3, &frames, &rc, &e); /* then frame 3 arrives out of order */
    assert_int_equal(rc, CSD_EAUTH);
    assert_int_equal(frames, 0);
}

static void test_insecure_checksum_catches_flip(void **state) {
    (void)state;
    int frames, rc;
    csd_err e;
    run_tamper(true, 2, MITM_FLIP_PAYLOAD, 3, &frames, &rc, &e); /* insecure: no AUTH frame */
    assert_int_equal(rc, CSD_EPROTO);
    assert_int_equal(frames, 1);
    assert_non_null(strstr(e.msg, "checksum"));
    run_tamper(true, 1, MITM_FLIP_HEADER, 3, &frames, &rc, &e);
    assert_int_equal(rc, CSD_EPROTO);
    assert_int_equal(frames, 0);
}

static void test_large_hidden_frame(void **state) {
    (void)state;
    const bool modes[2] = {false, true};
    for (int mi = 0; mi < 2; mi++) {
        server_ctx s;
        server_start(&s, &key_a, modes[mi], hello_stage(0, 0, 32, 0x42));
        csd_conn *c = NULL;
        csd_err err = {0};
        csd_wire_hello want = hello_coord(0, 0, 32, 0x42);
        assert_int_equal(client_open(csd_listener_port(s.l), &key_a, modes[mi], &want, &c, &err),
                         0);
        csd_netbuf rb = {0};
        /* 512 tokens x 4096 f16 = 4 MiB; then f32 8 MiB; then again (buffers already big) */
        forward_echo(c, 512, 4096, CSD_DTYPE_F16, &rb);
        forward_echo(c, 512, 4096, CSD_DTYPE_F32, &rb);
        uint64_t a0 = csd_alloc_count();
        forward_echo(c, 512, 4096, CSD_DTYPE_BF16, &rb);
        forward_echo(c, 1, 4096, CSD_DTYPE_F16, &rb);
        /* The counter is global: in this window the server also received and echoed two frames,
         * so this proves neither side allocates per frame once its buffers are big enough. */
        assert_int_equal(csd_alloc_count() - a0, 4); /* only forward_echo's own x and p */
        send_close(c);
        server_join(&s);
        assert_int_equal(s.loop_rc, 0);
        assert_int_equal(s.frames_ok, 5);
        csd_netbuf_fini(&rb);
        csd_conn_destroy(c);
    }
}

static void test_recv_idle_timeout_keeps_link(void **state) {
    (void)state;
    server_ctx s;
    csd_conn *c = link_up(&s);
    csd_err err = {0};
    csd_netbuf rb = {0};
    csd_wire_hdr h;
    assert_int_equal(csd_conn_recv(c, &h, &rb, 50, &err), CSD_ETIMEOUT);
    assert_false(csd_conn_is_closed(c));
    forward_echo(c, 2, 16, CSD_DTYPE_F32, &rb);
    send_close(c);
    server_join(&s);
    assert_int_equal(s.loop_rc, 0);
    csd_netbuf_fini(&rb);
    csd_conn_destroy(c);
}

/* One thread sends while another receives on the same conn. */
typedef struct sender_ctx {
    csd_conn *c;
    int n;
    int rc;
} sender_ctx;

static void *sender_main(void *arg) {
    sender_ctx *sc = arg;
    uint8_t p[12 + 4];
    size_t len;
    for (int i = 0; i < sc->n && !sc->rc; i++) {
        uint32_t id = (uint32_t)i;
        csd_wire_encode_ids(p, sizeof p, CSD_WIRE_ACT_TOKENS, &id, 1, &len, NULL);
        csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_SAMPLE,
                                           (uint32_t)i, (uint32_t)i, (uint32_t)len);
        sc->rc = csd_conn_send(sc->c, &h, p, len, NULL);
    }
    return NULL;
}

static void test_concurrent_send_recv(void **state) {
    (void)state;
    server_ctx s;
    csd_conn *c = link_up(&s);
    csd_err err = {0};
    sender_ctx sc = {.c = c, .n = 2000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sender_main, &sc), 0);
    csd_netbuf rb = {0};
    for (int i = 0; i < sc.n; i++) {
        csd_wire_hdr h;
        assert_int_equal(csd_conn_recv(c, &h, &rb, TIMEOUT_MS, &err), 0);
        assert_int_equal(h.type, CSD_WIRE_RESULT);
        assert_int_equal(h.request_id, (uint32_t)i); /* in order */
    }
    pthread_join(th, NULL);
    assert_int_equal(sc.rc, 0);
    send_close(c);
    server_join(&s);
    assert_int_equal(s.loop_rc, 0);
    csd_netbuf_fini(&rb);
    csd_conn_destroy(c);
}

/* A thread blocked in recv (waiting forever) is woken by csd_conn_shutdown from another thread:
 * how a worker stops a connection thread. */
typedef struct blocked_ctx {
    csd_conn *c;
    int rc;
} blocked_ctx;

static void *blocked_main(void *arg) {
    blocked_ctx *b = arg;
    csd_netbuf buf = {0};
    csd_wire_hdr h;
    b->rc = csd_conn_recv(b->c, &h, &buf, -1, NULL);
    csd_netbuf_fini(&buf);
    return NULL;
}

static void test_shutdown_wakes_blocked_recv(void **state) {
    (void)state;
    server_ctx s;
    csd_conn *c = link_up(&s);
    blocked_ctx b = {.c = c, .rc = 1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, blocked_main, &b), 0);
    usleep(50 * 1000);
    csd_conn_shutdown(c);
    pthread_join(th, NULL);
    assert_int_equal(b.rc, CSD_ECLOSED);
    assert_true(csd_conn_is_closed(c));
    server_join(&s); /* the server saw EOF between frames */
    assert_int_equal(s.loop_rc, CSD_ECLOSED);
    csd_conn_destroy(c);
}

/* A client that connects and says nothing is dropped after the handshake timeout; one whose first
 * frame is not HELLO is refused with ERROR. */
static void test_server_handshake_timeout_and_wrong_first_frame(void **state) {
    (void)state;
    server_ctx s;
    server_start(&s, &key_a, false, hello_stage(0, 0, 12, 0xAB));
    csd_conn *c = NULL;
    csd_err err = {0};
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)csd_listener_port(s.l));
    /* wrong first frame: a PING in plain framing */
    assert_int_equal(csd_conn_connect(&c, addr, TIMEOUT_MS, &err), 0);
    uint8_t p[8] = {0};
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_PING, 0, 0, 0, 8);
    assert_int_equal(csd_conn_send(c, &h, p, 8, &err), 0);
    csd_netbuf rb = {0};
    assert_int_equal(csd_conn_recv(c, &h, &rb, TIMEOUT_MS, &err), 0);
    assert_int_equal(h.type, CSD_WIRE_ERROR);
    csd_wire_error e;
    assert_int_equal(csd_wire_decode_error(rb.data, h.payload_len, &e, NULL), 0);
    assert_non_null(strstr(e.text, "expected HELLO"));
    server_join(&s);
    assert_int_equal(s.hs_rc, CSD_EPROTO);
    csd_conn_destroy(c);
    csd_netbuf_fini(&rb);

    /* silent client: the server gives up after its timeout */
    memset(&s, 0, sizeof s);
    assert_int_equal(csd_listener_open(&s.l, "127.0.0.1:0", &err), 0);
    s.cfg = (csd_link_cfg){.key = &key_a, .timeout_ms = 200};
    s.self = hello_stage(0, 0, 12, 0xAB);
    assert_int_equal(pthread_create(&s.th, NULL, server_main, &s), 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)csd_listener_port(s.l));
    assert_int_equal(csd_conn_connect(&c, addr, TIMEOUT_MS, &err), 0);
    uint64_t t0 = csd_now_ns();
    server_join(&s);
    assert_int_equal(s.hs_rc, CSD_ETIMEOUT);
    assert_true(csd_now_ns() - t0 < 10000000000ull); /* ended by the 200 ms timeout, not hung */
    csd_conn_destroy(c);
}

/* A stranger's first header claims a 64 MiB FORWARD payload and sends nothing more: the server
 * refuses the header itself instead of reserving a buffer for the payload and waiting for it
 * (every such connection once held 64 MiB for the handshake's timeout). */
static void test_server_handshake_refuses_large_frame(void **state) {
    (void)state;
    server_ctx s;
    server_start(&s, &key_a, false, hello_stage(0, 0, 12, 0xAB));
    int fd = raw_connect(csd_listener_port(s.l));
    uint8_t hb[CSD_WIRE_HDR_SIZE];
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_FORWARD, 0, 1, 0, 64u << 20);
    csd_err err = {0};
    assert_int_equal(csd_wire_encode_hdr(hb, &h, &err), 0);
    assert_true(write_n(fd, hb, sizeof hb));
    server_join(&s);
    assert_int_equal(s.hs_rc, CSD_EPROTO);
    assert_non_null(strstr(s.hs_err.msg, "during the handshake"));
    close(fd);
}

/* Bad addresses and refused connections are errors with messages, not crashes. */
static void test_connect_errors(void **state) {
    (void)state;
    csd_conn *c = NULL;
    csd_listener *l = NULL;
    csd_err err = {0};
    assert_int_equal(csd_conn_connect(&c, "127.0.0.1", 100, &err), CSD_EINVAL);
    assert_int_equal(csd_conn_connect(&c, "127.0.0.1:http", 100, &err), CSD_EINVAL);
    assert_int_equal(csd_conn_connect(&c, "[127.0.0.1:80", 100, &err), CSD_EINVAL);
    assert_int_equal(csd_listener_open(&l, ":0", &err), CSD_EINVAL);
    /* a port past 65535 (getaddrinfo took 99999 as 34463) or 0 is not an address to connect to */
    assert_int_equal(csd_conn_connect(&c, "127.0.0.1:99999", 100, &err), CSD_EINVAL);
    assert_non_null(strstr(err.msg, "port above 65535"));
    assert_int_equal(csd_listener_open(&l, "127.0.0.1:65536", &err), CSD_EINVAL);
    assert_int_equal(csd_conn_connect(&c, "127.0.0.1:0", 100, &err), CSD_EINVAL);
    assert_non_null(strstr(err.msg, "port 0"));
    /* a port nobody listens on: open and close a listener to find one */
    assert_int_equal(csd_listener_open(&l, "127.0.0.1:0", &err), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)csd_listener_port(l));
    csd_listener_destroy(l);
    assert_int_equal(csd_conn_connect(&c, addr, 1000, &err), CSD_EIO);
    assert_non_null(strstr(err.msg, "refused"));
    assert_null(c);
    /* accept with nothing pending times out */
    assert_int_equal(csd_listener_open(&l, "127.0.0.1:0", &err), 0);
    assert_int_equal(csd_listener_accept(l, &c, 20, &err), CSD_ETIMEOUT);
    csd_listener_destroy(l);
    /* a handshake without key and without insecure is a caller error */
    csd_link_cfg cfg = {0};
    assert_int_equal(csd_conn_handshake_client(NULL, &cfg, NULL, NULL, &err), CSD_EINVAL);
}

/* The cipher alone (what secure framing adds per frame on each side): seal and open of 4 KiB and
 * 16 KiB payloads with a 20-byte header as associated data, as conn.c does. Prints numbers. */
static void test_aead_cost_report(void **state) {
    (void)state;
    assert_true(sodium_init() >= 0);
    const size_t sizes[2] = {4096, 16384};
    uint8_t key[32], nonce[24] = {0}, ad[20] = {0}, tag[16];
    randombytes_buf(key, sizeof key);
    uint8_t *buf = csd_alloc(16384);
    for (int si = 0; si < 2; si++) {
        const int n = 5000;
        uint64_t t0 = csd_now_ns();
        for (int i = 0; i < n; i++) {
            csd_wire_put_u64(nonce, (uint64_t)i);
            unsigned long long ml;
            crypto_aead_xchacha20poly1305_ietf_encrypt_detached(buf, tag, &ml, buf, sizes[si], ad,
                                                                20, NULL, nonce, key);
        }
        double seal = (double)(csd_now_ns() - t0) * 1e-9;
        t0 = csd_now_ns();
        for (int i = 0; i < n; i++) {
            csd_wire_put_u64(nonce, (uint64_t)i);
            unsigned long long ml;
            crypto_aead_xchacha20poly1305_ietf_encrypt_detached(buf, tag, &ml, buf, sizes[si], ad,
                                                                20, NULL, nonce, key);
            assert_int_equal(crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                                 buf, NULL, buf, sizes[si], tag, ad, 20, nonce, key),
                             0);
        }
        double open = (double)(csd_now_ns() - t0) * 1e-9 - seal;
        printf("BENCH aead xchacha20poly1305 payload=%5zu B: seal %7.0f frames/s %6.0f MB/s "
               "(%.1f us), open %7.0f frames/s %6.0f MB/s (%.1f us), one core\n",
               sizes[si], n / seal, n * (double)sizes[si] / seal / 1e6, seal / n * 1e6, n / open,
               n * (double)sizes[si] / open / 1e6, open / n * 1e6);
    }
    csd_free(buf);
}

/* Measures one-way link throughput (client streams FORWARD frames, the server receives and drops
 * them, a final PING/PONG waits for the last one) and prints it; asserts only that it ran. */
static void test_throughput_report(void **state) {
    (void)state;
    const size_t sizes[2] = {4096, 16384};
    for (int mi = 0; mi < 2; mi++) {
        bool insecure = mi == 1;
        for (int si = 0; si < 2; si++) {
            server_ctx s;
            server_start_sink(&s, &key_a, insecure, hello_stage(0, 0, 12, 0xAB), true);
            csd_conn *c = NULL;
            csd_err err = {0};
            csd_wire_hello want = hello_coord(0, 0, 12, 0xAB);
            assert_int_equal(
                client_open(csd_listener_port(s.l), &key_a, insecure, &want, &c, &err), 0);
            size_t len = sizes[si];
            uint32_t dim = (uint32_t)((len - 12) / 2);
            assert_int_equal(csd_wire_act_payload_size(CSD_WIRE_ACT_HIDDEN, CSD_DTYPE_F16, 1, dim),
                             len);
            uint8_t *p = csd_alloc(len);
            p[0] = CSD_WIRE_ACT_HIDDEN;
            p[1] = CSD_DTYPE_F16;
            csd_wire_put_u32(p + 4, 1);
            csd_wire_put_u32(p + 8, dim);
            csd_netbuf rb = {0};
            const int n = 20000;
            uint64_t t0 = csd_now_ns();
            for (int i = 0; i < n; i++) {
                csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_HIDDEN, 1,
                                                   (uint32_t)i, (uint32_t)len);
                assert_int_equal(csd_conn_send(c, &h, p, len, &err), 0);
            }
            uint8_t pp[8];
            size_t plen;
            csd_wire_encode_ping(pp, sizeof pp, 1, &plen, NULL);
            csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_PING, 0, 0, 0, 8);
            assert_int_equal(csd_conn_send(c, &h, pp, plen, &err), 0);
            assert_int_equal(csd_conn_recv(c, &h, &rb, TIMEOUT_MS, &err), 0);
            assert_int_equal(h.type, CSD_WIRE_PONG);
            double dt = (double)(csd_now_ns() - t0) * 1e-9;
            printf("BENCH link %-9s payload=%5zu B: %8.0f frames/s, %7.1f MB/s (one way, "
                   "127.0.0.1)\n",
                   insecure ? "insecure" : "encrypted", len, n / dt, n * (double)len / dt / 1e6);
            send_close(c);
            server_join(&s);
            assert_int_equal(s.frames_ok, n + 2);
            csd_netbuf_fini(&rb);
            csd_free(p);
            csd_conn_destroy(c);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake_same_key),
        cmocka_unit_test(test_handshake_wildcard_expectations),
        cmocka_unit_test(test_handshake_different_key_refused),
        cmocka_unit_test(test_handshake_model_hash_mismatch),
        cmocka_unit_test(test_handshake_layer_range_mismatch),
        cmocka_unit_test(test_handshake_link_mode_mismatch),
        cmocka_unit_test(test_handshake_version_mismatch),
        cmocka_unit_test(test_mitm_untouched_passes),
        cmocka_unit_test(test_mitm_altered_payload_refused),
        cmocka_unit_test(test_mitm_altered_header_refused),
        cmocka_unit_test(test_mitm_replayed_frame_refused),
        cmocka_unit_test(test_mitm_dropped_frame_refused),
        cmocka_unit_test(test_insecure_checksum_catches_flip),
        cmocka_unit_test(test_large_hidden_frame),
        cmocka_unit_test(test_recv_idle_timeout_keeps_link),
        cmocka_unit_test(test_concurrent_send_recv),
        cmocka_unit_test(test_shutdown_wakes_blocked_recv),
        cmocka_unit_test(test_server_handshake_refuses_large_frame),
        cmocka_unit_test(test_server_handshake_timeout_and_wrong_first_frame),
        cmocka_unit_test(test_connect_errors),
        cmocka_unit_test(test_aead_cost_report),
        cmocka_unit_test(test_throughput_report),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
