/* What a worker does when something goes wrong between stages. Stage 0 (layers [0, 2) of a tiny
 * synthetic model) and the last stage (layers [2, 4)) are stage servers in this process; the test
 * speaks the wire (insecure mode) as their coordinator and, for stage 0, as the next stage too (a
 * "sink" that ROUTE connects stage 0 to), so it sees exactly what stage 0 sends on:
 *  - the link to the next stage breaks while both stages live: stage 0 says so to the coordinator
 *    with a link-level ERROR (request 0), on which a coordinator fails its steps and connects the
 *    chain again, instead of waiting for results that cannot come (the coordinator hears every
 *    stage answer its PINGs); later frames are answered with an ERROR each;
 *  - a TRUNCATE a stage refuses is answered by that stage alone, not passed on (each later stage
 *    would answer it too, and the coordinator match the extra answers to later steps);
 *  - when the last frame of a BATCH_MORE group fails, the frame sent on for the group ends it, so
 *    the next stage does not wait for one that never comes;
 *  - the last stage refuses OUT_HIDDEN, which it does not serve, instead of answering logits;
 *  - a frame of a batched group that cannot run fails alone: one past its request's context, a
 *    second frame of a request already in the group, one asking no output or two; the group's
 *    other frames are answered. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "model/model.h"
#include "model/synth.h"
#include "net/conn.h"
#include "net/wire.h"
#include "stage/stage_server.h"
#include "test_util.h"

#define MAX_CTX 32
#define N_LAYERS 4 /* the tiny preset's */
#define RECV_MS 5000

typedef struct stage {
    csd_model *model;
    csd_stage_server *server;
    pthread_t thread;
    char addr[32];
} stage;

typedef struct fixture {
    char dir[64];
    uint8_t hash[CSD_WIRE_HASH_SIZE];
    stage st[2];
    csd_link_cfg link;
} fixture;

static void *serve(void *arg) {
    stage *s = arg;
    csd_err err = {0};
    csd_stage_server_run(s->server, &err);
    return NULL;
}

/* Stage `index` of 2 over layers [begin, end) of the model in f->dir, serving on a free port. */
static void start_stage(fixture *f, int index, int64_t begin, int64_t end) {
    stage *s = &f->st[index];
    csd_err err = {0};
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    opts.n_threads = 1;
    opts.max_ctx = MAX_CTX;
    opts.layer_begin = begin;
    opts.layer_end = end;
    if (csd_model_load_hf(&s->model, f->dir, &opts, &err)) fail_msg("load: %s", err.msg);
    csd_stage_opts so;
    memset(&so, 0, sizeof so);
    so.listen = "127.0.0.1:0";
    so.link = f->link;
    so.stage_index = (uint32_t)index;
    memcpy(so.model_hash, f->hash, sizeof f->hash);
    assert_int_equal(csd_stage_server_create(&s->server, s->model, &so, &err), 0);
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%u", csd_stage_server_port(s->server));
    assert_int_equal(pthread_create(&s->thread, NULL, serve, s), 0);
}

static void stop_stage(stage *s) {
    if (!s->server) return;
    csd_stage_server_stop(s->server);
    pthread_join(s->thread, NULL);
    csd_stage_server_destroy(s->server);
    csd_model_destroy(s->model);
    s->server = NULL;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/csd-stage-err-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    csd_err err = {0};
    csd_model_config cfg;
    if (csd_synth_config(&cfg, csd_synth_preset_find("tiny"), CSD_ARCH_LLAMA, 300, 1, 2, &err) ||
        csd_synth_write(&cfg, CSD_DTYPE_F32, 11, f->dir, &err))
        fail_msg("synth: %s", err.msg);
    assert_int_equal(cfg.n_layers, N_LAYERS);
    f->link = (csd_link_cfg){.insecure = true, .timeout_ms = RECV_MS};
    assert_true(sodium_init() >= 0);
    randombytes_buf(f->hash, sizeof f->hash);
    start_stage(f, 0, 0, 2);
    start_stage(f, 1, 2, N_LAYERS);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    for (int i = 0; i < 2; i++) stop_stage(&f->st[i]);
    assert_int_equal(csd_test_remove_tree(f->dir), 0);
    free(f);
    return 0;
}

/* ---- the test's two roles ---- */

/* The coordinator's link to stage `index`. */
static csd_conn *connect_coord(const fixture *f, int index) {
    csd_conn *c = NULL;
    csd_err err = {0};
    assert_int_equal(csd_conn_connect(&c, f->st[index].addr, RECV_MS, &err), 0);
    csd_wire_hello expect = {0}, peer;
    expect.proto_version = CSD_WIRE_VERSION;
    expect.role = CSD_WIRE_ROLE_COORD;
    expect.stage_index = (uint32_t)index;
    expect.layer_begin = CSD_WIRE_ANY;
    expect.layer_end = CSD_WIRE_ANY;
    memcpy(expect.model_hash, f->hash, sizeof f->hash);
    if (csd_conn_handshake_client(c, &f->link, &expect, &peer, &err))
        fail_msg("handshake: %s", err.msg);
    return c;
}

static void send_frame(csd_conn *c, int type, uint16_t flags, uint32_t req, uint32_t pos,
                       const uint8_t *payload, size_t len) {
    csd_wire_hdr h = csd_wire_hdr_make(type, flags, req, pos, (uint32_t)len);
    csd_err err = {0};
    if (csd_conn_send(c, &h, payload, len, &err)) fail_msg("send: %s", err.msg);
}

static void send_open_ctx(csd_conn *c, uint32_t req, uint32_t max_ctx) {
    csd_wire_open o = csd_wire_open_default(max_ctx);
    uint8_t buf[64];
    size_t len = 0;
    assert_int_equal(csd_wire_encode_open(buf, sizeof buf, &o, &len, NULL), 0);
    send_frame(c, CSD_WIRE_OPEN, 0, req, 0, buf, len);
}

static void send_open(csd_conn *c, uint32_t req) { send_open_ctx(c, req, MAX_CTX); }

/* FORWARD of n token ids (stage 0's input) at position pos. */
static void send_tokens(csd_conn *c, uint32_t req, uint32_t pos, const uint32_t *ids, uint32_t n,
                        uint16_t flags) {
    uint8_t buf[256];
    size_t len = 0;
    assert_int_equal(
        csd_wire_encode_ids(buf, sizeof buf, CSD_WIRE_ACT_TOKENS, ids, n, &len, NULL), 0);
    send_frame(c, CSD_WIRE_FORWARD, flags, req, pos, buf, len);
}

/* The next frame on c that is not a PONG. */
static csd_wire_hdr next_frame(csd_conn *c, csd_netbuf *buf) {
    csd_wire_hdr h;
    csd_err err = {0};
    do {
        if (csd_conn_recv(c, &h, buf, RECV_MS, &err)) fail_msg("no frame: %s", err.msg);
    } while (h.type == CSD_WIRE_PONG);
    return h;
}

static void error_text(const csd_wire_hdr *h, const csd_netbuf *buf, csd_wire_error *e) {
    assert_int_equal(h->type, CSD_WIRE_ERROR);
    assert_int_equal(csd_wire_decode_error(buf->data, h->payload_len, e, NULL), 0);
}

/* Tells stage 0 to send on to a sink listening here, takes the sink's end of that link (the
 * handshake as stage 1 would answer it), and waits for the PONG that says ROUTE is done. */
static csd_conn *route_to_sink(const fixture *f, csd_conn *coord0) {
    csd_listener *l = NULL;
    csd_err err = {0};
    assert_int_equal(csd_listener_open(&l, "127.0.0.1:0", &err), 0);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", csd_listener_port(l));
    uint8_t route[CSD_WIRE_MAX_ROUTE + 8], ping[CSD_WIRE_PING_SIZE];
    size_t len = 0, plen = 0;
    assert_int_equal(csd_wire_encode_route(route, sizeof route, addr, &len, NULL), 0);
    send_frame(coord0, CSD_WIRE_ROUTE, 0, 0, 0, route, len);
    csd_conn *sink = NULL;
    if (csd_listener_accept(l, &sink, RECV_MS, &err)) fail_msg("no ROUTE link: %s", err.msg);
    csd_wire_hello self = {0}, other;
    self.proto_version = CSD_WIRE_VERSION;
    self.role = CSD_WIRE_ROLE_STAGE;
    self.caps = CSD_WIRE_CAP_HIDDEN_F32 | CSD_WIRE_CAP_TRUNCATE;
    self.stage_index = 1;
    self.layer_begin = 2;
    self.layer_end = N_LAYERS;
    memcpy(self.model_hash, f->hash, sizeof f->hash);
    if (csd_conn_handshake_server(sink, &f->link, &self, &other, &err))
        fail_msg("sink handshake: %s", err.msg);
    csd_listener_destroy(l);
    assert_int_equal(csd_wire_encode_ping(ping, sizeof ping, 1, &plen, NULL), 0);
    send_frame(coord0, CSD_WIRE_PING, 0, 0, 0, ping, plen);
    csd_netbuf buf = {0};
    csd_wire_hdr h;
    if (csd_conn_recv(coord0, &h, &buf, RECV_MS, &err)) fail_msg("no PONG: %s", err.msg);
    assert_int_equal(h.type, CSD_WIRE_PONG);
    csd_netbuf_fini(&buf);
    return sink;
}

/* ---- the tests ---- */

static void test_broken_next_link_is_reported(void **state) {
    fixture *f = *state;
    csd_conn *coord = connect_coord(f, 0);
    csd_conn *sink = route_to_sink(f, coord);
    csd_conn_destroy(sink); /* the link between the stages breaks; stage 0 lives on */
    send_open(coord, 1);
    /* The first sends after the break may still be taken by the socket: keep stepping until
     * stage 0's send fails and it says so. */
    csd_netbuf buf = {0};
    csd_wire_error e;
    bool reported = false;
    for (uint32_t pos = 0; pos < MAX_CTX && !reported; pos++) {
        const uint32_t id = 5 + pos;
        send_tokens(coord, 1, pos, &id, 1, CSD_WIRE_FLAG_OUT_SAMPLE);
        csd_wire_hdr h;
        csd_err err = {0};
        while (!reported && csd_conn_recv(coord, &h, &buf, 200, &err) == 0) {
            error_text(&h, &buf, &e);
            if (h.request_id != 0) continue; /* this request's own (after the break) */
            if (!strstr(e.text, "stage 0: the link to the next stage failed"))
                fail_msg("link-level ERROR '%s'", e.text);
            reported = true;
        }
    }
    assert_true(reported);
    /* From then on a frame that would go down is answered, not dropped in silence. */
    const uint32_t id = 9;
    send_open(coord, 2);
    send_tokens(coord, 2, 0, &id, 1, CSD_WIRE_FLAG_OUT_SAMPLE);
    csd_wire_hdr h;
    do { /* (request 1's own ERROR for the send that failed may come first) */
        h = next_frame(coord, &buf);
        error_text(&h, &buf, &e);
    } while (h.request_id == 1);
    assert_int_equal(h.request_id, 2);
    if (!strstr(e.text, "no link to the next stage")) fail_msg("ERROR '%s'", e.text);
    csd_netbuf_fini(&buf);
    csd_conn_destroy(coord);
}

static void test_refused_truncate_answered_once(void **state) {
    fixture *f = *state;
    csd_conn *coord = connect_coord(f, 0);
    csd_conn *sink = route_to_sink(f, coord);
    const uint32_t ids[3] = {1, 2, 3};
    send_open(coord, 1);
    send_tokens(coord, 1, 0, ids, 3, CSD_WIRE_FLAG_OUT_SAMPLE);
    uint8_t keep[16];
    size_t len = 0;
    assert_int_equal(csd_wire_encode_truncate(keep, sizeof keep, 10, &len, NULL), 0);
    send_frame(coord, CSD_WIRE_TRUNCATE, 0, 1, 0, keep, len); /* 10 of the 3 held: refused */
    send_frame(coord, CSD_WIRE_CLOSE, 0, 1, 0, NULL, 0);
    /* what stage 0 sends on, in order, up to the CLOSE */
    int types[8], n = 0;
    csd_netbuf buf = {0};
    for (;;) {
        csd_wire_hdr h = next_frame(sink, &buf);
        assert_true(n < 8);
        types[n++] = h.type;
        if (h.type == CSD_WIRE_ERROR) {
            csd_wire_error e;
            error_text(&h, &buf, &e);
            assert_int_equal(h.request_id, 1);
            if (!strstr(e.text, "truncate beyond")) fail_msg("ERROR '%s'", e.text);
        }
        if (h.type == CSD_WIRE_CLOSE) break;
    }
    const int want[] = {CSD_WIRE_OPEN, CSD_WIRE_FORWARD, CSD_WIRE_ERROR, CSD_WIRE_CLOSE};
    assert_int_equal(n, 4); /* no TRUNCATE among them */
    for (int i = 0; i < n; i++) assert_int_equal(types[i], want[i]);
    csd_netbuf_fini(&buf);
    csd_conn_destroy(sink);
    csd_conn_destroy(coord);
}

static void test_failed_group_end_still_ends_group(void **state) {
    fixture *f = *state;
    csd_conn *coord = connect_coord(f, 0);
    csd_conn *sink = route_to_sink(f, coord);
    const uint32_t a[2] = {1, 2}, b = 3;
    send_open(coord, 1);
    send_tokens(coord, 1, 0, a, 2, CSD_WIRE_FLAG_OUT_SAMPLE | CSD_WIRE_FLAG_BATCH_MORE);
    send_tokens(coord, 9, 0, &b, 1, CSD_WIRE_FLAG_OUT_SAMPLE); /* request 9 is not open */
    csd_netbuf buf = {0};
    csd_wire_hdr h = next_frame(sink, &buf);
    assert_int_equal(h.type, CSD_WIRE_OPEN);
    bool refused = false;
    for (h = next_frame(sink, &buf); h.type == CSD_WIRE_ERROR; h = next_frame(sink, &buf)) {
        assert_int_equal(h.request_id, 9);
        refused = true;
    }
    assert_true(refused);
    assert_int_equal(h.type, CSD_WIRE_FORWARD);
    assert_int_equal(h.request_id, 1);
    assert_int_equal(h.flags & CSD_WIRE_FLAG_BATCH_MORE, 0); /* the group ends with it */
    csd_netbuf_fini(&buf);
    csd_conn_destroy(sink);
    csd_conn_destroy(coord);
}

static void test_last_stage_refuses_out_hidden(void **state) {
    fixture *f = *state;
    csd_conn *coord = connect_coord(f, 1);
    send_open(coord, 4);
    float x[2 * 64];
    for (int i = 0; i < 2 * 64; i++) x[i] = (float)(i % 7) * 0.1f;
    uint8_t payload[CSD_WIRE_ACT_HDR_SIZE + sizeof x];
    size_t len = 0;
    assert_int_equal(csd_wire_encode_rows_f32(payload, sizeof payload, CSD_WIRE_ACT_HIDDEN,
                                              CSD_DTYPE_F32, x, 2, 64, &len, NULL),
                     0);
    send_frame(coord, CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_HIDDEN, 4, 0, payload, len);
    csd_netbuf buf = {0};
    csd_wire_hdr h = next_frame(coord, &buf);
    csd_wire_error e;
    error_text(&h, &buf, &e);
    assert_int_equal(h.request_id, 4);
    if (!strstr(e.text, "not hidden states")) fail_msg("ERROR '%s'", e.text);
    /* the same rows asking for sampled ids are answered */
    send_frame(coord, CSD_WIRE_FORWARD, CSD_WIRE_FLAG_OUT_SAMPLE, 4, 0, payload, len);
    h = next_frame(coord, &buf);
    assert_int_equal(h.type, CSD_WIRE_RESULT);
    csd_netbuf_fini(&buf);
    csd_conn_destroy(coord);
}

/* FORWARD of n hidden rows (the last stage's input) at position pos. */
static void send_hidden(csd_conn *c, uint32_t req, uint32_t pos, uint32_t n, uint16_t flags) {
    float x[2 * 64];
    for (int i = 0; i < 2 * 64; i++) x[i] = (float)(i % 7) * 0.1f;
    uint8_t payload[CSD_WIRE_ACT_HDR_SIZE + sizeof x];
    size_t len = 0;
    assert_true(n <= 2);
    assert_int_equal(csd_wire_encode_rows_f32(payload, sizeof payload, CSD_WIRE_ACT_HIDDEN,
                                              CSD_DTYPE_F32, x, n, 64, &len, NULL),
                     0);
    send_frame(c, CSD_WIRE_FORWARD, flags, req, pos, payload, len);
}

/* One frame of a group: request, position, rows, flags. */
typedef struct frame {
    uint32_t req, pos, n;
    uint16_t flags;
} frame;

/* Sends a group of two frames (the first with BATCH_MORE) and takes the two answers: an ERROR
 * for frame fr[bad] (its text must hold why) and the RESULT of the other. */
static void expect_one_refused(csd_conn *c, const frame fr[2], int bad, const char *why) {
    send_hidden(c, fr[0].req, fr[0].pos, fr[0].n, fr[0].flags | CSD_WIRE_FLAG_BATCH_MORE);
    send_hidden(c, fr[1].req, fr[1].pos, fr[1].n, fr[1].flags);
    const frame *good = &fr[1 - bad];
    csd_netbuf buf = {0};
    int errors = 0, results = 0;
    for (int k = 0; k < 2; k++) {
        csd_wire_hdr h = next_frame(c, &buf);
        if (h.type == CSD_WIRE_RESULT) {
            assert_int_equal(h.request_id, good->req);
            assert_int_equal(h.position, good->pos);
            results++;
            continue;
        }
        csd_wire_error e;
        error_text(&h, &buf, &e);
        assert_int_equal(h.request_id, fr[bad].req);
        if (!strstr(e.text, why)) fail_msg("ERROR '%s', expected '%s'", e.text, why);
        errors++;
    }
    assert_int_equal(errors, 1);
    assert_int_equal(results, 1);
    csd_netbuf_fini(&buf);
}

static void test_batch_member_fails_alone(void **state) {
    fixture *f = *state;
    csd_conn *coord = connect_coord(f, 1);
    const uint16_t sample = CSD_WIRE_FLAG_OUT_SAMPLE;
    send_open_ctx(coord, 5, 1); /* room for one position */
    send_open(coord, 6);
    /* two rows past request 5's context of one: 5 fails, 6 is answered */
    expect_one_refused(coord, (frame[2]){{5, 0, 2, sample}, {6, 0, 1, sample}}, 0,
                       "sequence is full");
    /* request 6 twice in one group: its second frame fails */
    expect_one_refused(coord, (frame[2]){{6, 1, 1, sample}, {6, 2, 1, sample}}, 1,
                       "twice in one batch");
    /* no output asked, then two: refused, not answered with a guess */
    expect_one_refused(coord, (frame[2]){{6, 2, 1, 0}, {5, 0, 1, sample}}, 0,
                       "exactly one output");
    const uint16_t both = sample | CSD_WIRE_FLAG_OUT_HIDDEN;
    expect_one_refused(coord, (frame[2]){{6, 2, 1, both}, {5, 0, 1, sample}}, 0,
                       "exactly one output");
    csd_conn_destroy(coord);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_broken_next_link_is_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_truncate_answered_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_group_end_still_ends_group, setup, teardown),
        cmocka_unit_test_setup_teardown(test_last_stage_refuses_out_hidden, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_member_fails_alone, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
