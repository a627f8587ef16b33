/* fake_stage: a one-stage "worker" inside a test process, for the fleet tests that need a stage to
 * misbehave in ways a real worker does not on demand. It speaks the wire protocol (insecure mode)
 * to one coordinator: answers PINGs (or, with answer_pings false, only the connect-time one),
 * answers each FORWARD compute_ms after it came, with logits that pick FAKE_STAGE_ANSWER, and
 * refuses the requests `refusal` names (an ERROR with that code and text instead of the logits),
 * and the OPENs `open_refusal` names (then "not open" for each of their FORWARDs).
 * With refuse_copies it refuses every COPY_PREFIX as a worker does whose source request was
 * evicted: an ERROR for the copy, then one for each FORWARD of that request that counts on the
 * copied positions. Include after <cmocka.h>; the fleet over it has vocabulary FAKE_STAGE_VOCAB and
 * dim 8. */
#ifndef CSD_TEST_FAKE_STAGE_H
#define CSD_TEST_FAKE_STAGE_H

#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "coord/fleet_pipeline.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "net/conn.h"
#include "net/wire.h"

#define FAKE_STAGE_VOCAB 32
#define FAKE_STAGE_ANSWER 7   /* the token the fake stage's logits pick */
#define FAKE_STAGE_QUEUE 16   /* FORWARDs waiting for their compute time */
#define FAKE_STAGE_MAX_LACKING 8 /* requests whose copy it refused, remembered */

typedef struct fake_stage {
    csd_listener *listener;
    uint8_t hash[CSD_WIRE_HASH_SIZE]; /* random: no other test's coordinator gets this stage */
    bool answer_pings;                /* after the connect-time PING */
    int compute_ms;                   /* per FORWARD */
    /* the text (and *code) to refuse a request with, or NULL to answer it */
    const char *(*refusal)(uint32_t request_id, int *code);
    /* the same for its OPEN: a request refused there is then "not open" for each FORWARD, as a
     * worker whose KV cap cannot hold it answers */
    const char *(*open_refusal)(uint32_t request_id, int *code);
    bool refuse_copies;
    uint32_t lacking[FAKE_STAGE_MAX_LACKING]; /* requests it refused a copy for (its thread's) */
    int n_lacking;
    atomic_bool stop;
    atomic_int pings, forwards, copies, opens_refused;
    atomic_int tokens; /* in the FORWARDs it took */
    pthread_t thread;
} fake_stage;

static bool fake_stage_lacks(const fake_stage *fs, uint32_t request_id) {
    for (int i = 0; i < fs->n_lacking; i++)
        if (fs->lacking[i] == request_id) return true;
    return false;
}

/* A COPY_PREFIX when refuse_copies is set: refused like a worker refuses a copy from a request it
 * evicted; the request holds no positions afterwards. */
static void fake_stage_refuse_copy(fake_stage *fs, csd_conn *c, const csd_wire_hdr *h) {
    atomic_fetch_add(&fs->copies, 1);
    if (fs->n_lacking < FAKE_STAGE_MAX_LACKING) fs->lacking[fs->n_lacking++] = h->request_id;
    csd_conn_send_error(c, h->request_id, CSD_ENOTFOUND,
                        "copy prefix: the source request is not open on this stage", NULL);
}

/* (This runs on the fake stage's thread, where a cmocka assert cannot report: a failure to encode
 * sends nothing, and the step then fails in the test's own thread.) */
static void fake_stage_answer(fake_stage *fs, csd_conn *c, const csd_wire_hdr *fwd) {
    int code = CSD_EPROTO;
    const char *why = fs->refusal ? fs->refusal(fwd->request_id, &code) : NULL;
    if (!why && fs->open_refusal && fs->open_refusal(fwd->request_id, &code)) {
        why = "request is not open on this stage (evicted or never opened)";
        code = CSD_ENOTFOUND;
    }
    if (!why && fwd->position > 0 && fake_stage_lacks(fs, fwd->request_id))
        why = "position beyond what the request holds (its copy was refused)";
    if (why) {
        csd_conn_send_error(c, fwd->request_id, code, why, NULL);
        return;
    }
    float logits[FAKE_STAGE_VOCAB] = {0};
    logits[FAKE_STAGE_ANSWER] = 5.0f;
    uint8_t payload[64 + FAKE_STAGE_VOCAB * 4];
    size_t len = 0;
    if (csd_wire_encode_rows_f32(payload, sizeof payload, CSD_WIRE_ACT_LOGITS, CSD_DTYPE_F32,
                                 logits, 1, FAKE_STAGE_VOCAB, &len, NULL) != 0)
        return;
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_RESULT, fwd->flags, fwd->request_id,
                                       fwd->position, (uint32_t)len);
    csd_conn_send(c, &h, payload, len, NULL);
}

/* Serves one coordinator link until stopped or hung up. */
static void fake_stage_serve(fake_stage *fs, csd_conn *c) {
    csd_netbuf buf = {0};
    csd_wire_hdr queue[FAKE_STAGE_QUEUE];
    uint64_t due[FAKE_STAGE_QUEUE];
    int n = 0;
    while (!atomic_load(&fs->stop)) {
        while (n > 0 && csd_now_ns() >= due[0]) { /* in order: each was due after the one before */
            fake_stage_answer(fs, c, &queue[0]);
            memmove(queue, queue + 1, (size_t)(n - 1) * sizeof *queue);
            memmove(due, due + 1, (size_t)(n - 1) * sizeof *due);
            n--;
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
        } else if (h.type == CSD_WIRE_FORWARD && n < FAKE_STAGE_QUEUE) {
            atomic_fetch_add(&fs->forwards, 1);
            csd_wire_act act;
            if (csd_wire_decode_act(buf.data, h.payload_len, &act, NULL) == 0)
                atomic_fetch_add(&fs->tokens, (int)act.n_tokens);
            queue[n] = h;
            due[n++] = csd_now_ns() + (uint64_t)fs->compute_ms * 1000000ull;
        } else if (h.type == CSD_WIRE_COPY_PREFIX && fs->refuse_copies) {
            fake_stage_refuse_copy(fs, c, &h);
        } else if (h.type == CSD_WIRE_OPEN && fs->open_refusal) {
            int code = CSD_EPROTO;
            const char *why = fs->open_refusal(h.request_id, &code);
            if (why) csd_conn_send_error(c, h.request_id, code, why, NULL);
            if (why) atomic_fetch_add(&fs->opens_refused, 1);
        } /* OPEN, CLOSE and the rest need no answer */
    }
    csd_netbuf_fini(&buf);
}

static void *fake_stage_main(void *arg) {
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
    if (csd_conn_handshake_server(c, &link, &self, &peer, &err) == 0) fake_stage_serve(fs, c);
    csd_conn_destroy(c);
    return NULL;
}

/* Starts fs (its fields set by the caller are kept) and a fleet over it, connected. */
static csd_pipeline *fake_stage_fleet(fake_stage *fs, int silence_ms) {
    assert_true(sodium_init() >= 0);
    randombytes_buf(fs->hash, sizeof fs->hash);
    atomic_init(&fs->stop, false);
    atomic_init(&fs->pings, 0);
    atomic_init(&fs->forwards, 0);
    atomic_init(&fs->copies, 0);
    atomic_init(&fs->tokens, 0);
    csd_err err = {0};
    assert_int_equal(csd_listener_open(&fs->listener, "127.0.0.1:0", &err), 0);
    assert_int_equal(pthread_create(&fs->thread, NULL, fake_stage_main, fs), 0);
    csd_fleet_opts o;
    memset(&o, 0, sizeof o);
    snprintf(o.addrs[0], sizeof o.addrs[0], "127.0.0.1:%u",
             (unsigned)csd_listener_port(fs->listener));
    o.n_addrs = 1;
    o.layer_ranges[0][1] = 1;
    memcpy(o.model_hash, fs->hash, sizeof fs->hash);
    o.cfg.vocab_size = FAKE_STAGE_VOCAB;
    o.cfg.dim = 8;
    o.cfg.n_layers = 1;
    o.link.insecure = true;
    o.link.timeout_ms = 500; /* a reconnect to the fake stage's listener gives up soon */
    o.hidden_dtype = CSD_DTYPE_F16;
    o.max_ctx = 64;
    o.step_silence_ms = silence_ms;
    csd_pipeline *p = NULL;
    if (csd_fleet_pipeline_create(&p, &o, NULL, 8, &err)) fail_msg("fleet: %s", err.msg);
    return p;
}

static void fake_stage_done(csd_pipeline *p, fake_stage *fs) {
    p->ops->destroy(p);
    atomic_store(&fs->stop, true);
    pthread_join(fs->thread, NULL);
    csd_listener_destroy(fs->listener);
}

#endif
