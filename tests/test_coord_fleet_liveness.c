/* A fleet step waits as long as its stages compute, but not for a stage that has gone quiet.
 * The stage is a fake one in this process: it speaks the wire protocol (insecure mode), answers
 * PINGs, and answers each FORWARD with logits after a delay. With a silence limit of 1 s, a step
 * whose stage computes for 3 s while answering PINGs succeeds (a fixed deadline, as the fleet
 * had before, failed every step slower than it: long prompt chunks of large models on slow
 * machines), and a stage that stops answering anything fails the step after about the limit,
 * with a message naming it. An idle fleet keeps PINGing: a stage that goes quiet then takes it
 * down too. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "coord/fleet_pipeline.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "net/conn.h"
#include "net/wire.h"

#define VOCAB 32
#define ANSWER 7          /* the token the fake stage's logits pick */
#define SILENCE_MS 1000
#define COMPUTE_MS 3000   /* the fake stage's time per FORWARD: three silence limits */

typedef struct fake_stage {
    csd_listener *listener;
    uint8_t hash[CSD_WIRE_HASH_SIZE]; /* random: no other test's coordinator gets this stage */
    bool answer_pings;    /* after the connect-time PING */
    atomic_bool stop;
    atomic_int pings, forwards;
    pthread_t thread;
} fake_stage;

/* (This runs on the fake stage's thread, where a cmocka assert cannot report: a failure to encode
 * sends nothing, and the step then fails in the test's own thread.) */
static void send_logits(csd_conn *c, const csd_wire_hdr *fwd) {
    float logits[VOCAB] = {0};
    logits[ANSWER] = 5.0f;
    uint8_t payload[64 + VOCAB * 4];
    size_t len = 0;
    if (csd_wire_encode_rows_f32(payload, sizeof payload, CSD_WIRE_ACT_LOGITS, CSD_DTYPE_F32,
                                 logits, 1, VOCAB, &len, NULL) != 0)
        return;
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_RESULT, fwd->flags, fwd->request_id,
                                       fwd->position, (uint32_t)len);
    csd_conn_send(c, &h, payload, len, NULL);
}

/* Serves one coordinator link: PONG for PING, logits COMPUTE_MS after each FORWARD. */
static void serve_link(fake_stage *fs, csd_conn *c) {
    csd_netbuf buf = {0};
    csd_wire_hdr pending;
    uint64_t due = 0;
    while (!atomic_load(&fs->stop)) {
        if (due && csd_now_ns() >= due) {
            send_logits(c, &pending);
            due = 0;
        }
        csd_wire_hdr h;
        csd_err err = {0};
        int rc = csd_conn_recv(c, &h, &buf, 20, &err);
        if (rc == CSD_ETIMEOUT) continue;
        if (rc) break;
        if (h.type == CSD_WIRE_PING) {
            if (atomic_fetch_add(&fs->pings, 1) == 0 || fs->answer_pings) {
                csd_wire_hdr pong = csd_wire_hdr_make(CSD_WIRE_PONG, 0, h.request_id, 0,
                                                      h.payload_len);
                csd_conn_send(c, &pong, buf.data, h.payload_len, NULL);
            }
        } else if (h.type == CSD_WIRE_FORWARD) {
            atomic_fetch_add(&fs->forwards, 1);
            pending = h;
            due = csd_now_ns() + (uint64_t)COMPUTE_MS * 1000000ull;
        } /* OPEN, CLOSE and the rest need no answer */
    }
    csd_netbuf_fini(&buf);
}

static void *fake_main(void *arg) {
    fake_stage *fs = arg;
    csd_conn *c = NULL;
    csd_err err = {0};
    while (!atomic_load(&fs->stop) && !c)
        if (csd_listener_accept(fs->listener, &c, 100, &err) && err.code != CSD_ETIMEOUT) break;
    if (!c) return NULL;
    csd_link_cfg link = {.insecure = true};
    csd_wire_hello self = {0}, peer;
    self.proto_version = CSD_WIRE_VERSION;
    self.role = CSD_WIRE_ROLE_STAGE;
    self.caps = CSD_WIRE_CAP_HIDDEN_F32 | CSD_WIRE_CAP_SAMPLE | CSD_WIRE_CAP_TRUNCATE;
    self.layer_end = 1;
    memcpy(self.model_hash, fs->hash, sizeof fs->hash);
    if (csd_conn_handshake_server(c, &link, &self, &peer, &err) == 0) serve_link(fs, c);
    csd_conn_destroy(c);
    return NULL;
}

/* A fake stage and a fleet over it, connected. */
static csd_pipeline *fleet_over(fake_stage *fs, bool answer_pings) {
    memset(fs, 0, sizeof *fs);
    fs->answer_pings = answer_pings;
    assert_true(sodium_init() >= 0);
    randombytes_buf(fs->hash, sizeof fs->hash);
    csd_err err = {0};
    assert_int_equal(csd_listener_open(&fs->listener, "127.0.0.1:0", &err), 0);
    assert_int_equal(pthread_create(&fs->thread, NULL, fake_main, fs), 0);
    csd_fleet_opts o;
    memset(&o, 0, sizeof o);
    snprintf(o.addrs[0], sizeof o.addrs[0], "127.0.0.1:%u",
             (unsigned)csd_listener_port(fs->listener));
    o.n_addrs = 1;
    o.layer_ranges[0][1] = 1;
    memcpy(o.model_hash, fs->hash, sizeof fs->hash);
    o.cfg.vocab_size = VOCAB;
    o.cfg.dim = 8;
    o.cfg.n_layers = 1;
    o.link.insecure = true;
    o.link.timeout_ms = 500; /* a reconnect to the fake stage's listener gives up soon */
    o.hidden_dtype = CSD_DTYPE_F16;
    o.max_ctx = 64;
    o.step_silence_ms = SILENCE_MS;
    csd_pipeline *p = NULL;
    if (csd_fleet_pipeline_create(&p, &o, NULL, 2, &err)) fail_msg("fleet: %s", err.msg);
    return p;
}

static void fleet_done(csd_pipeline *p, fake_stage *fs) {
    p->ops->destroy(p);
    atomic_store(&fs->stop, true);
    pthread_join(fs->thread, NULL);
    csd_listener_destroy(fs->listener);
}

/* One step of two tokens; returns its code (err says why) and the time it took. */
static int one_step(csd_pipeline *p, float *logits, double *seconds, csd_err *err) {
    if (p->ops->open(p, 1, 64, err)) fail_msg("open: %s", err->msg);
    int32_t ids[2] = {1, 2};
    csd_step_entry e = {.req = 1, .ids = ids, .n = 2, .want_logits = true};
    uint64_t t0 = csd_now_ns();
    int rc = p->ops->step_begin(p, &e, 1, logits, err);
    if (!rc) rc = p->ops->step_end(p, NULL, err);
    *seconds = (double)(csd_now_ns() - t0) * 1e-9;
    return rc;
}

static void test_slow_stage_that_answers_pings(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = fleet_over(&fs, true);
    float logits[VOCAB];
    double s = 0;
    csd_err err = {0};
    int rc = one_step(p, logits, &s, &err);
    if (rc) fail_msg("step: %s", err.msg);
    assert_true(s >= COMPUTE_MS * 1e-3 * 0.9);
    int best = 0;
    for (int v = 1; v < VOCAB; v++)
        if (logits[v] > logits[best]) best = v;
    assert_int_equal(best, ANSWER);
    assert_int_equal(atomic_load(&fs.forwards), 1);
    assert_true(atomic_load(&fs.pings) >= 1 + COMPUTE_MS / SILENCE_MS); /* pinged meanwhile */
    assert_true(p->ops->ready(p));
    fleet_done(p, &fs);
}

static void test_silent_stage_fails_the_step(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = fleet_over(&fs, false);
    float logits[VOCAB];
    double s = 0;
    csd_err err = {0};
    /* the fleet's keep-alive sees the silence and takes the chain down, failing the step */
    assert_int_equal(one_step(p, logits, &s, &err), CSD_ECLOSED);
    assert_non_null(strstr(err.msg, "answered nothing for 1 s"));
    assert_non_null(strstr(err.msg, "127.0.0.1:"));
    assert_true(s >= SILENCE_MS * 1e-3 * 0.5 && s < COMPUTE_MS * 1e-3);
    assert_false(p->ops->ready(p)); /* the fleet reconnects after a silent stage */
    fleet_done(p, &fs);
}

/* With no step waiting, the fleet PINGs its stages: one that answers keeps it up, one that has gone
 * quiet takes it down (to reconnect) after about the silence limit. */
static void test_idle_fleet_watches_its_stages(void **state) {
    (void)state;
    fake_stage alive, quiet;
    csd_pipeline *up = fleet_over(&alive, true), *down = fleet_over(&quiet, false);
    bool went_down = false;
    for (int waited = 0; waited < 3 * SILENCE_MS && !went_down; waited += 50) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        went_down = !down->ops->ready(down);
    }
    assert_true(went_down);
    assert_true(up->ops->ready(up));
    assert_true(atomic_load(&alive.pings) >= 3); /* PINGed while idle */
    fleet_done(down, &quiet);
    fleet_done(up, &alive);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_stage_that_answers_pings),
        cmocka_unit_test(test_silent_stage_fails_the_step),
        cmocka_unit_test(test_idle_fleet_watches_its_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
