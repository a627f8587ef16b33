/* A worker's limits and its accounting of open requests and their KV memory. At most 128 links
 * at once: a further connection is closed at once. One coordinator at a time: a second one is
 * refused while the first is alive, and replaces one that hung up or went quiet (which is told).
 * Its STATS answer (what `cascadia bench` asks each stage for) follows OPEN and CLOSE, and a STATS
 * asked while requests open and close is safe: the compute thread frees a request's KV cache
 * without a lock, so a reader thread answering STATS must not walk the requests (it once did; the
 * ThreadSanitizer pass of scripts/test reports that walk as a race here). The KV memory cap: a
 * request that could never fit is refused without evicting the requests that are open. The stage
 * is a whole tiny synthetic model, served in this process on a free port; the clients speak the
 * wire protocol in insecure mode. The frames waiting to be computed are bounded in bytes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/conn.h"
#include "net/wire.h"
#include "stage/stage_server.h"
#include "test_synth.h"
#include "test_util.h"

#define MAX_CTX 32

static uint64_t kv_cap_tokens; /* the next fixture's --kv-mem, in tokens of KV (0: default) */
static int coord_idle_ms;      /* the next fixture's coord_idle_ms (0: default) */

typedef struct fixture {
    char dir[64];
    uint8_t hash[CSD_WIRE_HASH_SIZE]; /* random: another test's coordinator cannot connect */
    csd_model *model;
    csd_stage_server *server;
    pthread_t thread;
    char addr[32];
} fixture;

static void *serve(void *arg) {
    fixture *f = arg;
    csd_err err = {0};
    csd_stage_server_run(f->server, &err);
    return NULL;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/csd-stage-XXXXXX");
    f->model = csd_test_load_tiny(f->dir, MAX_CTX, 1);
    csd_err err = {0};
    csd_stage_opts so;
    memset(&so, 0, sizeof so);
    so.listen = "127.0.0.1:0";
    so.link.insecure = true;
    so.max_requests = 8;
    so.kv_mem_cap = kv_cap_tokens * csd_model_kv_bytes_per_token(f->model);
    so.coord_idle_ms = coord_idle_ms;
    assert_true(sodium_init() >= 0);
    randombytes_buf(f->hash, sizeof f->hash);
    memcpy(so.model_hash, f->hash, sizeof f->hash);
    assert_int_equal(csd_stage_server_create(&f->server, f->model, &so, &err), 0);
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%u", csd_stage_server_port(f->server));
    assert_int_equal(pthread_create(&f->thread, NULL, serve, f), 0);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    csd_stage_server_stop(f->server);
    pthread_join(f->thread, NULL);
    csd_stage_server_destroy(f->server);
    csd_model_destroy(f->model);
    assert_int_equal(csd_test_remove_tree(f->dir), 0);
    free(f);
    return 0;
}

/* A coordinator's link to the stage. */
static csd_conn *connect_coord(const fixture *f) {
    csd_conn *c = NULL;
    csd_err err = {0};
    assert_int_equal(csd_conn_connect(&c, f->addr, 5000, &err), 0);
    csd_link_cfg link = {.insecure = true, .timeout_ms = 5000};
    csd_wire_hello expect, peer;
    memset(&expect, 0, sizeof expect);
    expect.proto_version = CSD_WIRE_VERSION;
    expect.role = CSD_WIRE_ROLE_COORD;
    expect.stage_index = 0;
    expect.layer_begin = CSD_WIRE_ANY;
    expect.layer_end = CSD_WIRE_ANY;
    memcpy(expect.model_hash, f->hash, sizeof f->hash);
    if (csd_conn_handshake_client(c, &link, &expect, &peer, &err) != 0)
        fail_msg("handshake: %s", err.msg);
    return c;
}

static void send_open_ctx(csd_conn *c, uint32_t req, uint32_t ctx) {
    csd_wire_open o = csd_wire_open_default(ctx);
    uint8_t buf[64];
    size_t len = 0;
    csd_err err = {0};
    assert_int_equal(csd_wire_encode_open(buf, sizeof buf, &o, &len, &err), 0);
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_OPEN, 0, req, 0, (uint32_t)len);
    assert_int_equal(csd_conn_send(c, &h, buf, len, &err), 0);
}

static void send_open(csd_conn *c, uint32_t req) { send_open_ctx(c, req, MAX_CTX); }

static void send_close(csd_conn *c, uint32_t req) {
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_CLOSE, 0, req, 0, 0);
    csd_err err = {0};
    assert_int_equal(csd_conn_send(c, &h, NULL, 0, &err), 0);
}

static csd_wire_stats ask_stats(csd_conn *c) {
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_STATS, 0, 0, 0, 0);
    csd_err err = {0};
    assert_int_equal(csd_conn_send(c, &h, NULL, 0, &err), 0);
    csd_netbuf buf = {0};
    csd_wire_hdr r;
    if (csd_conn_recv(c, &r, &buf, 5000, &err) != 0) fail_msg("no STATS reply: %s", err.msg);
    assert_int_equal(r.type, CSD_WIRE_STATS_REPLY);
    csd_wire_stats st;
    assert_int_equal(csd_wire_decode_stats(buf.data, r.payload_len, &st, &err), 0);
    csd_netbuf_fini(&buf);
    return st;
}

/* STATS until it reports `open` requests (OPEN and CLOSE queue behind earlier frames). */
static csd_wire_stats stats_once_open(csd_conn *c, uint32_t open) {
    csd_wire_stats st = ask_stats(c);
    for (int i = 0; i < 500 && st.open_requests != open; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        st = ask_stats(c);
    }
    assert_int_equal(st.open_requests, open);
    return st;
}

static void test_stats_follow_open_and_close(void **state) {
    fixture *f = *state;
    uint64_t per_req = (uint64_t)MAX_CTX * csd_model_kv_bytes_per_token(f->model);
    assert_true(per_req > 0);
    csd_conn *c = connect_coord(f);
    csd_wire_stats st = stats_once_open(c, 0);
    assert_int_equal(st.kv_bytes_used, 0);
    for (uint32_t id = 1; id <= 3; id++) send_open(c, id);
    st = stats_once_open(c, 3);
    assert_int_equal(st.kv_bytes_used, 3 * per_req);
    send_close(c, 1);
    send_close(c, 3);
    send_close(c, 7); /* not open: changes nothing */
    st = stats_once_open(c, 1);
    assert_int_equal(st.kv_bytes_used, per_req);
    send_open(c, 2); /* re-open: starts over, still one request */
    send_open(c, 4);
    st = stats_once_open(c, 2);
    assert_int_equal(st.kv_bytes_used, 2 * per_req);
    send_close(c, 2);
    send_close(c, 4);
    st = stats_once_open(c, 0);
    assert_int_equal(st.kv_bytes_used, 0);
    csd_conn_destroy(c);
}

/* One thread opens and closes requests as fast as it can while another asks for STATS on the same
 * link (a coordinator asks on its own link: `cascadia bench --fleet`). */
typedef struct churn {
    csd_conn *c;
    int rounds;
} churn;

static void *open_close(void *arg) {
    churn *ch = arg;
    for (int i = 0; i < ch->rounds; i++) {
        uint32_t id = 100 + (uint32_t)(i % 4);
        send_open(ch->c, id);
        send_close(ch->c, id);
    }
    return NULL;
}

static void test_stats_while_requests_churn(void **state) {
    fixture *f = *state;
    csd_conn *work = connect_coord(f), *stats = work; /* one coordinator: STATS on its link */
    churn ch = {work, 2000};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, open_close, &ch), 0);
    uint64_t per_req = (uint64_t)MAX_CTX * csd_model_kv_bytes_per_token(f->model);
    for (int i = 0; i < 300; i++) {
        csd_wire_stats st = ask_stats(stats);
        /* each is closed before the next opens (the two figures are read one after the other,
         * so one may already count a request the other does not yet) */
        assert_true(st.open_requests <= 1);
        assert_true(st.kv_bytes_used <= per_req);
    }
    pthread_join(t, NULL);
    csd_wire_stats st = stats_once_open(stats, 0);
    assert_int_equal(st.kv_bytes_used, 0);
    csd_conn_destroy(work);
}

/* The cap holds 20 tokens of KV: two requests of 8 fit; one of 32 never can. It is refused
 * (ERROR for it) and the two stay open: nothing was evicted to make room that could not be made.
 * A third of 8 fits once the least recently used one is evicted. */
static int setup_small_cap(void **state) {
    kv_cap_tokens = 20;
    int rc = setup(state);
    kv_cap_tokens = 0;
    return rc;
}

static void test_request_over_cap_evicts_nobody(void **state) {
    fixture *f = *state;
    uint64_t bpt = csd_model_kv_bytes_per_token(f->model);
    csd_conn *c = connect_coord(f);
    send_open_ctx(c, 1, 8);
    send_open_ctx(c, 2, 8);
    csd_wire_stats st = stats_once_open(c, 2);
    assert_int_equal(st.kv_bytes_used, 16 * bpt);
    send_open_ctx(c, 3, MAX_CTX);
    csd_netbuf buf = {0};
    csd_wire_hdr h;
    csd_err err = {0};
    assert_int_equal(csd_conn_recv(c, &h, &buf, 5000, &err), 0); /* the refusal, to this link */
    assert_int_equal(h.type, CSD_WIRE_ERROR);
    assert_int_equal(h.request_id, 3);
    csd_wire_error e;
    assert_int_equal(csd_wire_decode_error(buf.data, h.payload_len, &e, &err), 0);
    assert_non_null(strstr(e.text, "more than the stage's cap"));
    csd_netbuf_fini(&buf);
    st = ask_stats(c);
    assert_int_equal(st.open_requests, 2);
    assert_int_equal(st.kv_bytes_used, 16 * bpt);
    /* one that fits once the least recently used is gone: that one goes, the other stays */
    send_open_ctx(c, 4, 8);
    send_close(c, 2);
    send_close(c, 4);
    st = stats_once_open(c, 0); /* frames apply in order: 2 and 4 were open, 1 was evicted */
    assert_int_equal(st.kv_bytes_used, 0);
    csd_conn_destroy(c);
}

/* 128 strangers connect and say nothing (each waits out the handshake's timeout on the worker):
 * the next connection is closed at once, where it once got a thread and a buffer like them. */
#define LINKS_MAX 128

static int raw_connect(const fixture *f) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(csd_stage_server_port(f->server))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void test_links_beyond_limit_closed(void **state) {
    fixture *f = *state;
    int fds[LINKS_MAX];
    for (int i = 0; i < LINKS_MAX; i++) fds[i] = raw_connect(f);
    struct timespec settle = {0, 300 * 1000 * 1000}; /* the worker accepts them all */
    nanosleep(&settle, NULL);
    int extra = raw_connect(f);
    struct timeval tv = {8, 0}; /* less than the handshake's 10 s timeout */
    assert_int_equal(setsockopt(extra, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    char b;
    assert_int_equal(recv(extra, &b, 1, 0), 0); /* closed by the worker, not left waiting */
    close(extra);
    for (int i = 0; i < LINKS_MAX; i++) close(fds[i]);
}

/* The next frame on c is an ERROR for request_id: its text in e (borrowing buf). */
static void recv_error(csd_conn *c, uint32_t request_id, csd_netbuf *buf, csd_wire_error *e) {
    csd_wire_hdr h;
    csd_err err = {0};
    if (csd_conn_recv(c, &h, buf, 5000, &err)) fail_msg("no ERROR: %s", err.msg);
    assert_int_equal(h.type, CSD_WIRE_ERROR);
    assert_int_equal(h.request_id, request_id);
    assert_int_equal(csd_wire_decode_error(buf->data, h.payload_len, e, &err), 0);
}

/* The next ERROR on c (request 0): its text. */
static void expect_error(csd_conn *c, const char *text) {
    csd_netbuf buf = {0};
    csd_wire_error e;
    recv_error(c, 0, &buf, &e);
    if (!strstr(e.text, text)) fail_msg("ERROR '%s' does not say '%s'", e.text, text);
    csd_wire_hdr h;
    csd_err err = {0};
    assert_int_equal(csd_conn_recv(c, &h, &buf, 5000, &err), CSD_ECLOSED); /* then closed */
    csd_netbuf_fini(&buf);
}

/* A second coordinator while the first is alive is refused, naming the first; the first goes on. */
static void test_second_coordinator_refused(void **state) {
    fixture *f = *state;
    csd_conn *first = connect_coord(f);
    ask_stats(first); /* the worker has taken it (the handshake returns before that) */
    csd_conn *second = connect_coord(f);
    expect_error(second, "this worker serves the coordinator at 127.0.0.1:");
    send_open(first, 7);
    assert_int_equal(stats_once_open(first, 1).open_requests, 1);
    csd_conn_destroy(second);
    csd_conn_destroy(first);
}

/* One that has hung up is replaced at once; one quiet for coord_idle_ms (200 ms here) is replaced
 * too, and told why. */
static int setup_short_idle(void **state) {
    coord_idle_ms = 200;
    int rc = setup(state);
    coord_idle_ms = 0;
    return rc;
}

static void test_gone_or_quiet_coordinator_replaced(void **state) {
    fixture *f = *state;
    csd_conn_destroy(connect_coord(f)); /* hangs up */
    csd_conn *quiet = connect_coord(f);
    ask_stats(quiet); /* served: the one that hung up was replaced */
    struct timespec pause = {0, 400 * 1000 * 1000};
    nanosleep(&pause, NULL);
    csd_conn *next = connect_coord(f);
    expect_error(quiet, "another coordinator connected (from 127.0.0.1:");
    ask_stats(next);
    csd_conn_destroy(quiet);
    csd_conn_destroy(next);
}

/* The frames waiting for the compute thread are bounded in bytes: a frame over the bound (16 MiB
 * here, where the bound is a few MiB: 32 full batches of this model's hidden rows) is refused
 * with an ERROR for its request instead of being copied, and the worker goes on serving. */
static void test_queue_bounded(void **state) {
    fixture *f = *state;
    csd_conn *c = connect_coord(f);
    send_open(c, 7);
    size_t big = 16u << 20;
    uint8_t *junk = calloc(1, big);
    assert_non_null(junk);
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_SAMPLE, 7, 0,
                                       (uint32_t)big);
    csd_err err = {0};
    assert_int_equal(csd_conn_send(c, &h, junk, big, &err), 0);
    free(junk);
    csd_netbuf buf = {0};
    csd_wire_error e;
    recv_error(c, 7, &buf, &e);
    if (!strstr(e.text, "a FORWARD frame of 16777216 bytes was dropped"))
        fail_msg("ERROR '%s'", e.text);
    /* a frame of a proper size is computed */
    const uint32_t ids[2] = {1, 2};
    uint8_t payload[64];
    size_t len = 0;
    assert_int_equal(
        csd_wire_encode_ids(payload, sizeof payload, CSD_WIRE_ACT_TOKENS, ids, 2, &len, &err), 0);
    h = csd_wire_hdr_make(CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_SAMPLE, 7, 0, (uint32_t)len);
    assert_int_equal(csd_conn_send(c, &h, payload, len, &err), 0);
    if (csd_conn_recv(c, &h, &buf, 5000, &err)) fail_msg("no RESULT: %s", err.msg);
    assert_int_equal(h.type, CSD_WIRE_RESULT);
    assert_int_equal(h.request_id, 7);
    csd_netbuf_fini(&buf);
    csd_conn_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stats_follow_open_and_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_while_requests_churn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_over_cap_evicts_nobody, setup_small_cap,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_links_beyond_limit_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_coordinator_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gone_or_quiet_coordinator_replaced, setup_short_idle,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
