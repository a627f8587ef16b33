/* fleet_pipeline: the coordinator's side of a chain of remote stages (see the header). */
#include "fleet_pipeline.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/log.h"
#include "fleet_hosts.h"
#include "model/model.h"

#define MAX_IN_FLIGHT 16
#define MAX_REFUSALS 16 /* refusals kept for a step to come (fleet.refusals) */
/* A step waits for as long as its stages compute (a 512-token prompt chunk of a 70B model can take
 * minutes on ordinary PCs), but not for a stage that has gone quiet: while connected, every stage
 * is PINGed a few times per silence limit (keep_alive), and a stage that answers nothing for that
 * long (a machine that froze, a network that dropped without a reset) takes the chain down, which
 * fails the steps in flight. */
#define STEP_SILENCE_MS 120000   /* default csd_fleet_opts.step_silence_ms */
#define STEP_PINGS_PER_SILENCE 8
#define STEP_LIMIT_S 3600.0      /* a step not answered in an hour fails even if its stages answer
                                  * PINGs: their compute has hung */
#define RECONNECT_PERIOD_MS 1000
#define RECONNECT_WARN_EVERY 60  /* failed attempts in a row between two warnings */
#define RECV_POLL_MS 200

typedef struct pending_step {
    int n;                                   /* entries */
    uint32_t req[CSD_STEP_MAX_ENTRIES];
    int64_t rows[CSD_STEP_MAX_ENTRIES];      /* logit rows it gets: 0, 1, or n (all_logits) */
    bool resolved[CSD_STEP_MAX_ENTRIES];
    int n_resolved;
    int entry_rc[CSD_STEP_MAX_ENTRIES];      /* a stage refused this entry's request alone */
    /* fields above are zeroed when a step begins */
    char entry_msg[CSD_STEP_MAX_ENTRIES][CSD_ERR_MSG_MAX]; /* why, where entry_rc is set */
    float *logits;                           /* caller's buffer, packed rows (rows) */
    int rc;                                  /* first error of the step */
    char msg[CSD_ERR_MSG_MAX];
    uint64_t t_begin;
} pending_step;

/* What the coordinator tracks of each open request: its length (the position of its next token)
 * and, with a local stage 0, its KV cache there. */
typedef struct local_req {
    uint32_t id;
    bool used;
    int64_t len;
    csd_kv *kv;                              /* local stage 0 only */
} local_req;

typedef struct link_reader {
    struct fleet *f;
    int index;                               /* into conns */
    pthread_t thread;
    bool started;
} link_reader;

typedef struct fleet {
    csd_pipeline base;
    csd_fleet_opts opts;
    csd_model *local0;                       /* borrowed, or NULL */
    local_req *locals;
    int n_locals;
    /* links */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_rwlock_t links_lock;             /* senders read-lock; closing the links write-locks */
    csd_conn *conns[CSD_FLEET_MAX_STAGES];
    link_reader readers[CSD_FLEET_MAX_STAGES];
    _Atomic uint64_t heard_ns[CSD_FLEET_MAX_STAGES]; /* the last frame from each stage */
    atomic_bool connected;
    atomic_bool stopping;
    _Atomic uint64_t epoch;                  /* connections made: +1 each time connected is set */
    bool lost_connecting;                    /* a link failed before connected was set (mu) */
    char lost_msg[CSD_ERR_MSG_MAX];          /* why (mu) */
    char broken_msg[CSD_ERR_MSG_MAX];        /* why the chain last went down (mu) */
    pthread_t reconnector;
    /* steps in flight, oldest first */
    pending_step steps[MAX_IN_FLIGHT];
    int head, count;
    /* encoding scratch (the calling thread only) */
    uint8_t *send_buf;
    size_t send_cap;
    float *hidden;                           /* local stage 0 output (max_step_tokens, dim) */
    csd_kv **batch_kv;
    int32_t *batch_ids;
    /* timing */
    csd_fleet_timing timing;
    csd_wire_stats last_stats[CSD_FLEET_MAX_STAGES];
    int stats_pending;
    /* refusals of requests with no step in flight (an OPEN a stage refused), kept (mu) for the
     * step that then fails as "not open": its error names the cause */
    struct {
        uint32_t req; /* 0: free */
        int rc;
        char msg[CSD_ERR_MSG_MAX];
    } refusals[MAX_REFUSALS];
    int next_refusal;
} fleet;

static csd_conn *first_link(fleet *f) { return f->conns[0]; }

/* ---- failure ---- */

/* Fails every step in flight and drops the links; the reconnector brings them back. A link that
 * fails while the chain is still connecting is remembered, so connect_chain does not declare a
 * chain connected with a dead link in it. */
static void mark_broken(fleet *f, const char *why) {
    pthread_mutex_lock(&f->mu);
    if (atomic_load(&f->connected)) {
        CSD_LOGW("fleet broken: %s", why);
        snprintf(f->broken_msg, sizeof f->broken_msg, "%s", why);
        atomic_store(&f->connected, false);
        for (int i = 0; i < f->opts.n_addrs; i++)
            if (f->conns[i]) csd_conn_shutdown(f->conns[i]);
    } else if (!f->lost_connecting) {
        f->lost_connecting = true;
        snprintf(f->lost_msg, sizeof f->lost_msg, "%s", why);
    }
    for (int k = 0; k < f->count; k++) {
        pending_step *s = &f->steps[(f->head + k) % MAX_IN_FLIGHT];
        if (!s->rc) {
            s->rc = CSD_ECLOSED;
            snprintf(s->msg, sizeof s->msg, "fleet link failed: %s", why);
        }
        s->n_resolved = s->n;
    }
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* ---- results ---- */

/* Resolves the oldest unresolved entry of req; returns its step and row, or NULL. */
static pending_step *match_entry(fleet *f, uint32_t req, int *entry, int64_t *row) {
    for (int k = 0; k < f->count; k++) {
        pending_step *s = &f->steps[(f->head + k) % MAX_IN_FLIGHT];
        int64_t r = 0;
        for (int i = 0; i < s->n; i++) {
            if (s->req[i] == req && !s->resolved[i]) {
                *entry = i;
                *row = r;
                return s;
            }
            r += s->rows[i];
        }
    }
    return NULL;
}

/* The last `rows` rows of a result into dst (rows, vocab): logits as they are, sampled ids as
 * logits that make each id the argmax (a greedy request). */
static int take_rows(const csd_wire_act *act, float *dst, int64_t rows, int64_t vocab,
                     csd_err *err) {
    if (act->n_tokens < (uint32_t)rows)
        return csd_err_set(err, CSD_EPROTO, "result of %u rows, %lld expected",
                           (unsigned)act->n_tokens, (long long)rows);
    size_t skip = (size_t)(act->n_tokens - (uint32_t)rows);
    csd_wire_act last = *act;
    last.n_tokens = (uint32_t)rows;
    if (act->kind == CSD_WIRE_ACT_LOGITS && act->dim == (uint32_t)vocab) {
        last.data = act->data + skip * (size_t)vocab * 4;
        last.data_bytes = (size_t)rows * (size_t)vocab * 4;
        return csd_wire_act_to_f32(&last, dst, (size_t)(rows * vocab), err);
    }
    if (act->kind != CSD_WIRE_ACT_SAMPLED)
        return csd_err_set(err, CSD_EPROTO, "result of kind %s",
                           csd_wire_act_kind_name(act->kind));
    uint32_t ids[CSD_STEP_MAX_ALL_ROWS]; /* step_begin bounds an entry's rows */
    last.data = act->data + skip * 4;
    last.data_bytes = (size_t)rows * 4;
    int rc = csd_wire_act_ids(&last, ids, (uint32_t)rows, err);
    for (int64_t r = 0; !rc && r < rows; r++) {
        if (ids[r] >= (uint32_t)vocab)
            return csd_err_set(err, CSD_EPROTO, "sampled id out of range");
        float *row = dst + r * vocab;
        for (int64_t v = 0; v < vocab; v++) row[v] = v == (int64_t)ids[r] ? 0.0f : -1e30f;
    }
    return rc;
}

static void on_result(fleet *f, const csd_wire_hdr *h, const uint8_t *data) {
    csd_err err = {0};
    csd_wire_act act;
    int rc = csd_wire_decode_act(data, h->payload_len, &act, &err);
    pthread_mutex_lock(&f->mu);
    int entry;
    int64_t row;
    pending_step *s = match_entry(f, h->request_id, &entry, &row);
    if (!s) {
        pthread_mutex_unlock(&f->mu);
        CSD_LOGW("fleet: unexpected result for req=%u", h->request_id);
        return;
    }
    if (!rc && s->rows[entry] > 0)
        rc = take_rows(&act, s->logits + row * f->opts.cfg.vocab_size, s->rows[entry],
                       f->opts.cfg.vocab_size, &err);
    if (rc && !s->rc) {
        s->rc = rc;
        snprintf(s->msg, sizeof s->msg, "%s", err.msg);
    }
    s->resolved[entry] = true;
    s->n_resolved++;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Keeps a refusal no step was waiting for (mu held); the oldest goes when all are taken. */
static void keep_refusal(fleet *f, uint32_t req, int rc, const char *msg) {
    int k = f->next_refusal;
    f->next_refusal = (k + 1) % MAX_REFUSALS;
    f->refusals[k].req = req;
    f->refusals[k].rc = rc;
    snprintf(f->refusals[k].msg, sizeof f->refusals[k].msg, "%s", msg);
}

/* Drops the kept refusals of req (mu held). */
static void forget_refusals(fleet *f, uint32_t req) {
    for (int k = 0; k < MAX_REFUSALS; k++)
        if (f->refusals[k].req == req) f->refusals[k].req = 0;
}

/* Takes the kept refusal of req into the step's entry (mu held); false when there is none. */
static bool claim_refusal(fleet *f, uint32_t req, pending_step *s, int entry) {
    for (int k = 0; k < MAX_REFUSALS; k++) {
        if (f->refusals[k].req != req) continue;
        f->refusals[k].req = 0;
        s->entry_rc[entry] = f->refusals[k].rc;
        snprintf(s->entry_msg[entry], sizeof s->entry_msg[entry], "%s", f->refusals[k].msg);
        return true;
    }
    return false;
}

/* A request's ERROR names its stage ("stage N: why", from the worker that refused it), while it
 * arrives on the last stage's link: msg names the worker that refused, by its address. */
static void error_source(const fleet *f, int index, const char *text, char *msg, size_t cap) {
    unsigned stage = 0;
    int used = 0;
    if (sscanf(text, "stage %u: %n", &stage, &used) == 1 && used > 0 &&
        stage >= f->opts.first_remote_stage &&
        stage - f->opts.first_remote_stage < (unsigned)f->opts.n_addrs) {
        snprintf(msg, cap, "stage %u at %s: %s", stage,
                 f->opts.addrs[stage - f->opts.first_remote_stage], text + used);
        return;
    }
    snprintf(msg, cap, "stage at %s: %s", f->opts.addrs[index], text);
}

static void on_error(fleet *f, int index, const csd_wire_hdr *h, const uint8_t *data) {
    csd_wire_error e;
    csd_err err = {0};
    if (csd_wire_decode_error(data, h->payload_len, &e, &err)) {
        e.code = CSD_EPROTO;
        snprintf(e.text, sizeof e.text, "%s", err.msg);
    }
    if (h->request_id == 0) {
        char why[CSD_ERR_MSG_MAX];
        snprintf(why, sizeof why, "stage at %s: %s", f->opts.addrs[index], e.text);
        mark_broken(f, why);
        return;
    }
    pthread_mutex_lock(&f->mu);
    int entry;
    int64_t row;
    pending_step *s = match_entry(f, h->request_id, &entry, &row);
    char msg[CSD_ERR_MSG_MAX];
    error_source(f, index, e.text, msg, sizeof msg);
    if (s) { /* the stage refused this request alone and went on with the step's others */
        if (!claim_refusal(f, h->request_id, s, entry)) { /* else its OPEN's refusal says why */
            snprintf(s->entry_msg[entry], sizeof s->entry_msg[entry], "%s", msg);
            s->entry_rc[entry] = csd_err_from_peer(e.code);
        }
        s->resolved[entry] = true;
        s->n_resolved++;
        pthread_cond_broadcast(&f->cv);
    } else {
        keep_refusal(f, h->request_id, csd_err_from_peer(e.code), msg);
    }
    pthread_mutex_unlock(&f->mu);
}

static void *reader_main(void *arg) {
    link_reader *lr = arg;
    fleet *f = lr->f;
    csd_conn *c = f->conns[lr->index];
    csd_netbuf buf = {0};
    while (!atomic_load(&f->stopping)) {
        csd_wire_hdr h;
        csd_err err = {0};
        int rc = csd_conn_recv(c, &h, &buf, RECV_POLL_MS, &err);
        if (rc == CSD_ETIMEOUT) continue;
        if (!rc) atomic_store(&f->heard_ns[lr->index], csd_now_ns()); /* PONGs count too */
        if (rc) {
            if (!atomic_load(&f->stopping)) {
                char why[CSD_ERR_MSG_MAX];
                snprintf(why, sizeof why, "stage at %s: %s", f->opts.addrs[lr->index],
                         rc == CSD_ECLOSED ? "connection closed" : err.msg);
                mark_broken(f, why);
            }
            break;
        }
        if (h.type == CSD_WIRE_RESULT && lr->index == f->opts.n_addrs - 1)
            on_result(f, &h, buf.data);
        else if (h.type == CSD_WIRE_ERROR) on_error(f, lr->index, &h, buf.data);
        else if (h.type == CSD_WIRE_STATS_REPLY) {
            pthread_mutex_lock(&f->mu);
            csd_wire_decode_stats(buf.data, h.payload_len, &f->last_stats[lr->index], NULL);
            f->stats_pending--;
            pthread_cond_broadcast(&f->cv);
            pthread_mutex_unlock(&f->mu);
        }
    }
    csd_netbuf_fini(&buf);
    return NULL;
}

/* ---- connecting ---- */

static void close_links(fleet *f) {
    for (int i = 0; i < f->opts.n_addrs; i++)
        if (f->conns[i]) csd_conn_shutdown(f->conns[i]);
    pthread_rwlock_wrlock(&f->links_lock); /* no sender is inside a link any more */
    /* every reader is joined before any link is destroyed: a reader that fails marks the fleet
     * broken, which shuts down every link, the others' included */
    for (int i = 0; i < f->opts.n_addrs; i++) {
        if (f->readers[i].started) pthread_join(f->readers[i].thread, NULL);
        f->readers[i].started = false;
    }
    pthread_mutex_lock(&f->mu); /* mark_broken reads conns[] under mu */
    for (int i = 0; i < f->opts.n_addrs; i++) {
        csd_conn_destroy(f->conns[i]);
        f->conns[i] = NULL;
    }
    pthread_mutex_unlock(&f->mu);
    pthread_rwlock_unlock(&f->links_lock);
}

static int send_simple(csd_conn *c, int type, uint32_t req, const uint8_t *payload, size_t len,
                       csd_err *err) {
    csd_wire_hdr h = csd_wire_hdr_make(type, 0, req, 0, (uint32_t)len);
    return csd_conn_send(c, &h, payload, len, err);
}

/* A stage's answer of ERROR (h, buf) while connecting, as our error: "stage at ADDR<what>: text"
 * with the worker's own code, so that a stage not up yet is worth retrying and another export's
 * is not (csd_cli_fleet_retryable). */
static int stage_refused(const char *addr, const char *what, const csd_netbuf *buf,
                         const csd_wire_hdr *h, csd_err *err) {
    csd_wire_error e;
    if (csd_wire_decode_error(buf->data, h->payload_len, &e, err)) return CSD_EPROTO;
    return csd_err_set(err, csd_err_from_peer(e.code), "stage at %s%s: %s", addr, what, e.text);
}

/* Connects stage i, checks who it is (handshake), and adds one PING round trip to *rtt. */
static int connect_stage(fleet *f, int i, double *rtt, csd_err *err) {
    const csd_fleet_opts *o = &f->opts;
    csd_wire_hello expect = {0}, peer;
    int rc = csd_conn_connect(&f->conns[i], o->addrs[i], o->link.timeout_ms, err);
    if (rc) return csd_err_prefix(err, "stage %u: ", o->first_remote_stage + (uint32_t)i);
    expect.proto_version = CSD_WIRE_VERSION;
    expect.role = CSD_WIRE_ROLE_COORD;
    expect.stage_index = o->first_remote_stage + (uint32_t)i;
    expect.layer_begin = o->layer_ranges[i][0];
    expect.layer_end = o->layer_ranges[i][1];
    memcpy(expect.model_hash, o->model_hash, CSD_WIRE_HASH_SIZE);
    rc = csd_conn_handshake_client(f->conns[i], &o->link, &expect, &peer, err);
    if (rc) {
        csd_err_prefix(err, "stage %u at %s: ", expect.stage_index, o->addrs[i]);
        return rc;
    }
    /* measure the round trip while the link is quiet */
    uint8_t ping[CSD_WIRE_PING_SIZE];
    size_t len = 0;
    uint64_t t0 = csd_now_ns();
    csd_wire_encode_ping(ping, sizeof ping, t0, &len, NULL);
    csd_netbuf buf = {0};
    csd_wire_hdr h;
    rc = send_simple(f->conns[i], CSD_WIRE_PING, 0, ping, len, err);
    if (!rc)
        rc = csd_conn_recv(f->conns[i], &h, &buf,
                           o->link.timeout_ms > 0 ? o->link.timeout_ms : 10000, err);
    if (!rc && h.type == CSD_WIRE_ERROR) { /* e.g. it serves another coordinator */
        rc = stage_refused(o->addrs[i], "", &buf, &h, err);
    } else if (!rc && h.type != CSD_WIRE_PONG) {
        rc = csd_err_set(err, CSD_EPROTO, "stage at %s did not answer PING", o->addrs[i]);
    }
    *rtt += (double)(csd_now_ns() - t0) * 1e-9;
    csd_netbuf_fini(&buf);
    return rc;
}

/* Tells stage i to forward to stage i + 1 (ROUTE), then PINGs: the PONG means routed. */
static int route_stage(fleet *f, int i, csd_err *err) {
    const csd_fleet_opts *o = &f->opts;
    uint8_t route[CSD_WIRE_MAX_ROUTE + 8], ping[CSD_WIRE_PING_SIZE];
    size_t len = 0;
    int rc = csd_wire_encode_route(route, sizeof route, o->addrs[i + 1], &len, err);
    if (!rc) rc = send_simple(f->conns[i], CSD_WIRE_ROUTE, 0, route, len, err);
    csd_wire_encode_ping(ping, sizeof ping, 0, &len, NULL);
    if (!rc) rc = send_simple(f->conns[i], CSD_WIRE_PING, 0, ping, len, err);
    csd_netbuf buf = {0};
    csd_wire_hdr h;
    if (!rc) rc = csd_conn_recv(f->conns[i], &h, &buf, 30000, err);
    if (!rc && h.type == CSD_WIRE_ERROR) {
        char what[CSD_WIRE_MAX_ROUTE + 32];
        snprintf(what, sizeof what, " could not connect to %s", o->addrs[i + 1]);
        rc = stage_refused(o->addrs[i], what, &buf, &h, err);
    } else if (!rc && h.type != CSD_WIRE_PONG) {
        rc = csd_err_set(err, CSD_EPROTO, "stage at %s answered ROUTE with message type %u",
                         o->addrs[i], (unsigned)h.type);
    }
    csd_netbuf_fini(&buf);
    return rc;
}

/* Connects every stage, checks who it is, routes each to the next, and waits until the chain
 * answers a PING end to end. */
static int connect_chain(fleet *f, csd_err *err) {
    const csd_fleet_opts *o = &f->opts;
    int rc = 0;
    double rtt = 0;
    for (int i = 0; i < o->n_addrs && !rc; i++) rc = connect_stage(f, i, &rtt, err);
    for (int i = 0; i + 1 < o->n_addrs && !rc; i++) rc = route_stage(f, i, err);
    if (rc) {
        close_links(f);
        return rc;
    }
    uint64_t now = csd_now_ns(); /* silence is counted from here */
    for (int i = 0; i < o->n_addrs; i++) atomic_store(&f->heard_ns[i], now);
    pthread_mutex_lock(&f->mu); /* the old readers are joined: what they saw is over */
    f->timing.rtt_s = rtt / o->n_addrs;
    f->lost_connecting = false;
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < o->n_addrs; i++) {
        f->readers[i] = (link_reader){f, i, 0, false};
        if (pthread_create(&f->readers[i].thread, NULL, reader_main, &f->readers[i]) != 0) {
            close_links(f);
            return csd_err_set(err, CSD_EIO, "cannot start a link reader");
        }
        f->readers[i].started = true;
    }
    pthread_mutex_lock(&f->mu);
    bool lost = f->lost_connecting;
    if (lost) {
        rc = csd_err_set(err, CSD_ECLOSED, "a link failed while connecting: %s", f->lost_msg);
    } else {
        atomic_store(&f->connected, true);
        atomic_fetch_add(&f->epoch, 1);
        f->broken_msg[0] = 0;
    }
    pthread_mutex_unlock(&f->mu);
    if (lost) {
        close_links(f);
        return rc;
    }
    CSD_LOGI("fleet connected: %d remote stage(s), rtt %.2f ms", o->n_addrs, f->timing.rtt_s * 1e3);
    return 0;
}

/* ---- liveness ---- */

/* PINGs every stage (a stage's reader answers while its compute thread works). */
static void ping_stages(fleet *f) {
    uint8_t ping[CSD_WIRE_PING_SIZE];
    size_t len = 0;
    csd_wire_encode_ping(ping, sizeof ping, csd_now_ns(), &len, NULL);
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_PING, 0, 0, 0, (uint32_t)len);
    for (int i = 0; i < f->opts.n_addrs; i++) {
        pthread_rwlock_rdlock(&f->links_lock);
        if (atomic_load(&f->connected) && f->conns[i])
            csd_conn_send(f->conns[i], &h, ping, len, NULL);
        pthread_rwlock_unlock(&f->links_lock);
    }
}

static uint64_t silence_ns(const fleet *f) {
    return (uint64_t)f->opts.step_silence_ms * 1000000ull;
}

/* The first stage that sent nothing in the silence limit before now (counting from since at the
 * earliest), or -1. A reader may have stored a time later than now meanwhile: that stage spoke. */
static int silent_stage(fleet *f, uint64_t since, uint64_t now) {
    for (int i = 0; i < f->opts.n_addrs; i++) {
        uint64_t heard = atomic_load(&f->heard_ns[i]);
        uint64_t last = heard > since ? heard : since;
        if (now > last && now - last > silence_ns(f)) return i;
    }
    return -1;
}

/* How often a connected coordinator PINGs each stage: an eighth of the silence limit, and at least
 * every CSD_WIRE_KEEPALIVE_MS (a worker refuses another coordinator while this one is heard). */
static uint64_t keepalive_ns(const fleet *f) {
    uint64_t ns = silence_ns(f) / STEP_PINGS_PER_SILENCE;
    uint64_t cap = (uint64_t)CSD_WIRE_KEEPALIVE_MS * 1000000ull;
    return ns < cap ? ns : cap;
}

/* While connected, idle or not: PINGs the stages so that they know this coordinator is alive (a
 * worker's link reader answers while its compute thread works), and takes the chain down when a
 * stage has answered nothing for the silence limit. Silence counts from *since: the connection,
 * or the end of a gap in these calls (this process was stopped or its machine suspended: the
 * stages are given a fresh limit, not blamed). */
static void keep_alive(fleet *f, uint64_t *next_ping, uint64_t *since, uint64_t *last_call) {
    uint64_t now = csd_now_ns();
    if (*last_call && now - *last_call > 4 * keepalive_ns(f)) *since = now;
    *last_call = now;
    if (now >= *next_ping) {
        ping_stages(f);
        *next_ping = now + keepalive_ns(f);
    }
    int quiet = silent_stage(f, *since, now);
    if (quiet >= 0) {
        char why[CSD_ERR_MSG_MAX];
        snprintf(why, sizeof why, "stage at %s answered nothing for %.0f s", f->opts.addrs[quiet],
                 (double)silence_ns(f) * 1e-9);
        mark_broken(f, why);
    }
}

/* Brings the chain back after a failure, one attempt a second, and keeps it alive meanwhile. */
static void *reconnect_main(void *arg) {
    fleet *f = arg;
    uint64_t tick_ns = keepalive_ns(f) < 1000000000ull ? keepalive_ns(f) : 1000000000ull;
    uint64_t next_ping = 0, since = 0, last_call = 0, next_attempt = 0;
    unsigned failures = 0; /* reconnect attempts failed in a row */
    while (!atomic_load(&f->stopping)) {
        /* tv_nsec must stay below 1e9, or nanosleep fails at once and this loop spins a core */
        struct timespec ts = {(time_t)(tick_ns / 1000000000ull), (long)(tick_ns % 1000000000ull)};
        nanosleep(&ts, NULL);
        if (atomic_load(&f->stopping)) break;
        if (atomic_load(&f->connected)) {
            keep_alive(f, &next_ping, &since, &last_call);
            continue;
        }
        last_call = 0;
        uint64_t now = csd_now_ns();
        if (now < next_attempt) continue;
        next_attempt = now + (uint64_t)RECONNECT_PERIOD_MS * 1000000ull;
        pthread_mutex_lock(&f->mu);
        bool idle = f->count == 0;
        pthread_mutex_unlock(&f->mu);
        if (!idle) continue; /* the steps in flight are being failed; wait for them to end */
        close_links(f);
        csd_err err = {0};
        if (connect_chain(f, &err) == 0) {
            CSD_LOGI("fleet reconnected");
            failures = 0;
            since = csd_now_ns();
        } else if (failures++ % RECONNECT_WARN_EVERY == 0) { /* the first, then once a minute */
            CSD_LOGW("fleet reconnect failed (retrying every %d ms): %s", RECONNECT_PERIOD_MS,
                     err.msg);
        } else {
            CSD_LOGD("fleet reconnect failed: %s", err.msg);
        }
    }
    return NULL;
}

/* ---- sending ---- */

static int ensure_send(fleet *f, size_t n, csd_err *err) {
    if (n <= f->send_cap) return 0;
    uint8_t *p = csd_alloc(n);
    if (!p) return csd_err_set(err, CSD_ENOMEM, "send buffer of %zu bytes", n);
    csd_free(f->send_buf);
    f->send_buf = p;
    f->send_cap = n;
    return 0;
}

/* The error for an operation while the fleet is down, naming why it went down. */
static int not_connected(fleet *f, csd_err *err) {
    pthread_mutex_lock(&f->mu);
    int rc = csd_err_set(err, CSD_ECLOSED, "fleet not connected (%s)",
                         f->broken_msg[0] ? f->broken_msg : "starting");
    pthread_mutex_unlock(&f->mu);
    return rc;
}

/* Sends on the first remote link, failing cleanly while the fleet is disconnected. */
static int send_first(fleet *f, const csd_wire_hdr *h, const void *payload, size_t len,
                      csd_err *err) {
    pthread_rwlock_rdlock(&f->links_lock);
    int rc;
    if (!atomic_load(&f->connected) || !first_link(f)) rc = not_connected(f, err);
    else
        rc = csd_conn_send(first_link(f), h, payload, len, err);
    pthread_rwlock_unlock(&f->links_lock);
    if (rc && rc != CSD_ECLOSED) mark_broken(f, err->msg);
    return rc;
}

static local_req *find_local(fleet *f, uint32_t id) {
    for (int i = 0; i < f->n_locals; i++)
        if (f->locals[i].used && f->locals[i].id == id) return &f->locals[i];
    return NULL;
}

static void free_local(local_req *l) {
    if (!l) return;
    csd_kv_destroy(l->kv);
    l->kv = NULL;
    l->used = false;
}

/* ---- the pipeline operations ---- */

static int fleet_open(csd_pipeline *p, uint32_t req, int64_t max_ctx, csd_err *err) {
    fleet *f = (fleet *)p;
    if (!atomic_load(&f->connected)) return not_connected(f, err);
    local_req *slot = NULL;
    for (int i = 0; i < f->n_locals && !slot; i++)
        if (!f->locals[i].used) slot = &f->locals[i];
    if (!slot) return csd_err_set(err, CSD_EFULL, "all %d request slots are busy", f->n_locals);
    if (f->local0) {
        int rc = csd_kv_create(&slot->kv, f->local0, max_ctx, err);
        if (rc) return rc;
    }
    slot->id = req;
    slot->used = true;
    slot->len = 0;
    pthread_mutex_lock(&f->mu);
    forget_refusals(f, req); /* a kept refusal belongs to an earlier life of the id */
    pthread_mutex_unlock(&f->mu);
    csd_wire_open o = csd_wire_open_default((uint32_t)max_ctx);
    o.hidden_dtype = (uint8_t)f->opts.hidden_dtype;
    uint8_t buf[CSD_WIRE_OPEN_SIZE];
    size_t len = 0;
    int rc = csd_wire_encode_open(buf, sizeof buf, &o, &len, err);
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_OPEN, 0, req, 0, (uint32_t)len);
    if (!rc) rc = send_first(f, &h, buf, len, err);
    if (rc) free_local(find_local(f, req));
    return rc;
}

static void fleet_close(csd_pipeline *p, uint32_t req) {
    fleet *f = (fleet *)p;
    free_local(find_local(f, req));
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_CLOSE, 0, req, 0, 0);
    csd_err err = {0};
    send_first(f, &h, NULL, 0, &err); /* a broken fleet lost the state anyway */
}

static int fleet_truncate(csd_pipeline *p, uint32_t req, int64_t pos, csd_err *err) {
    fleet *f = (fleet *)p;
    local_req *l = find_local(f, req);
    if (!l) return csd_err_set(err, CSD_ENOTFOUND, "request %u is not open", req);
    if (pos < 0 || pos > l->len || (l->kv && csd_kv_truncate(l->kv, pos)))
        return csd_err_set(err, CSD_ERANGE, "truncate to %lld", (long long)pos);
    l->len = pos;
    uint8_t buf[CSD_WIRE_TRUNCATE_SIZE];
    size_t len = 0;
    int rc = csd_wire_encode_truncate(buf, sizeof buf, (uint32_t)pos, &len, err);
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_TRUNCATE, 0, req, 0, (uint32_t)len);
    return rc ? rc : send_first(f, &h, buf, len, err);
}

static int fleet_copy_prefix(csd_pipeline *p, uint32_t src, uint32_t dst, int64_t n, csd_err *err) {
    fleet *f = (fleet *)p;
    local_req *ls = find_local(f, src), *ld = find_local(f, dst);
    if (!ls || !ld)
        return csd_err_set(err, CSD_ENOTFOUND, "request %u is not open", ls ? dst : src);
    if (n < 0 || n > ls->len)
        return csd_err_set(err, CSD_ERANGE, "prefix of %lld tokens", (long long)n);
    int rc = ld->kv ? csd_kv_copy_prefix(ld->kv, ls->kv, n, err) : 0;
    uint8_t buf[CSD_WIRE_COPY_PREFIX_SIZE];
    size_t len = 0;
    if (!rc) rc = csd_wire_encode_copy_prefix(buf, sizeof buf, src, (uint32_t)n, &len, err);
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_COPY_PREFIX, 0, dst, 0, (uint32_t)len);
    if (!rc) rc = send_first(f, &h, buf, len, err);
    if (!rc) ld->len = n;
    return rc;
}

/* Stage 0 in this process: ids of all entries -> hidden rows, one batched forward. */
static int run_local_stage(fleet *f, const csd_step_entry *e, int n, csd_err *err) {
    int64_t fill = 0;
    for (int i = 0; i < n; i++) {
        local_req *l = find_local(f, e[i].req);
        for (int64_t t = 0; t < e[i].n; t++) {
            f->batch_kv[fill] = l->kv;
            f->batch_ids[fill++] = e[i].ids[t];
        }
    }
    csd_batch b = {fill, f->batch_ids, NULL, f->batch_kv, NULL};
    uint64_t t0 = csd_now_ns();
    int rc = csd_model_forward(f->local0, &b, f->hidden, err);
    f->timing.local_compute_s += (double)(csd_now_ns() - t0) * 1e-9;
    return rc;
}

static int fleet_step_begin(csd_pipeline *p, const csd_step_entry *e, int n, float *logits,
                            csd_err *err) {
    fleet *f = (fleet *)p;
    if (n <= 0 || n > CSD_STEP_MAX_ENTRIES)
        return csd_err_set(err, CSD_EINVAL, "step of %d entries", n);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        total += e[i].n;
        if (e[i].all_logits && e[i].n > CSD_STEP_MAX_ALL_ROWS)
            return csd_err_set(err, CSD_EINVAL, "logits of %lld rows for one request",
                               (long long)e[i].n);
    }
    if (total > f->opts.max_step_tokens)
        return csd_err_set(err, CSD_ERANGE, "step of %lld tokens exceeds the fleet's %lld",
                           (long long)total, (long long)f->opts.max_step_tokens);
    pthread_mutex_lock(&f->mu);
    if (f->count == MAX_IN_FLIGHT) {
        pthread_mutex_unlock(&f->mu);
        return csd_err_set(err, CSD_EFULL, "too many steps in flight");
    }
    pthread_mutex_unlock(&f->mu);
    int64_t positions[CSD_STEP_MAX_ENTRIES];
    for (int i = 0; i < n; i++) { /* a request appears at most once per step */
        local_req *l = find_local(f, e[i].req);
        if (!l) return csd_err_set(err, CSD_ENOTFOUND, "request %u is not open", e[i].req);
        for (int j = 0; j < i; j++)
            if (e[j].req == e[i].req)
                return csd_err_set(err, CSD_EINVAL, "request %u twice in a step", e[i].req);
        positions[i] = l->len;
    }
    int rc = f->local0 ? run_local_stage(f, e, n, err) : 0;
    if (rc) return rc;
    for (int i = 0; i < n; i++) find_local(f, e[i].req)->len += e[i].n;
    /* register the step before sending, so a fast answer always finds it */
    pthread_mutex_lock(&f->mu);
    pending_step *s = &f->steps[(f->head + f->count) % MAX_IN_FLIGHT];
    memset(s, 0, offsetof(pending_step, logits));
    s->n = n;
    for (int i = 0; i < n; i++) {
        s->req[i] = e[i].req;
        s->rows[i] = !e[i].want_logits ? 0 : e[i].all_logits ? e[i].n : 1;
    }
    s->logits = logits;
    s->rc = 0;
    s->t_begin = csd_now_ns();
    f->count++;
    pthread_mutex_unlock(&f->mu);
    int64_t row = 0, dim = f->opts.cfg.dim;
    for (int i = 0; i < n && !rc; i++) {
        /* the last stage answers with the token id unless the caller needs the distribution */
        uint16_t flags = (e[i].want_logits && !e[i].argmax_only ? CSD_WIRE_FLAG_OUT_LOGITS
                                                                : CSD_WIRE_FLAG_OUT_SAMPLE) |
                         (e[i].want_logits && e[i].all_logits ? CSD_WIRE_FLAG_ALL_TOKENS : 0) |
                         (i + 1 < n ? CSD_WIRE_FLAG_BATCH_MORE : 0);
        size_t len = 0;
        uint32_t pos;
        if (f->local0) {
            size_t need = csd_wire_act_payload_size(CSD_WIRE_ACT_HIDDEN, f->opts.hidden_dtype,
                                                    (uint32_t)e[i].n, (uint32_t)dim);
            rc = ensure_send(f, need, err);
            if (!rc)
                rc = csd_wire_encode_rows_f32(f->send_buf, f->send_cap, CSD_WIRE_ACT_HIDDEN,
                                              f->opts.hidden_dtype, f->hidden + row * dim,
                                              (uint32_t)e[i].n, (uint32_t)dim, &len, err);
        } else {
            rc = ensure_send(f, 64 + (size_t)e[i].n * 4, err);
            if (!rc)
                rc = csd_wire_encode_ids(f->send_buf, f->send_cap, CSD_WIRE_ACT_TOKENS,
                                         (const uint32_t *)e[i].ids, (uint32_t)e[i].n, &len, err);
        }
        pos = (uint32_t)positions[i];
        row += e[i].n;
        csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_FORWARD, flags, e[i].req, pos, (uint32_t)len);
        if (!rc) rc = send_first(f, &h, f->send_buf, len, err);
    }
    if (rc) { /* the step is registered: let step_end report it */
        pthread_mutex_lock(&f->mu);
        if (!s->rc) {
            s->rc = rc;
            snprintf(s->msg, sizeof s->msg, "%s", err->msg);
        }
        s->n_resolved = s->n;
        pthread_mutex_unlock(&f->mu);
    }
    return 0;
}

/* Waits (mu held) until step s is resolved, or fails (a silent stage takes the chain down:
 * keep_alive), or the step limit passes. Returns false at the limit, with why set: the chain is
 * then to be reconnected, even if the step had failed for another reason already. */
static bool wait_step(fleet *f, pending_step *s, char *why, size_t why_cap) {
    uint64_t limit = s->t_begin + (uint64_t)(STEP_LIMIT_S * 1e9);
    while (s->n_resolved < s->n) {
        if (csd_now_ns() >= limit) {
            snprintf(why, why_cap, "no answer from the fleet in %.0f s", STEP_LIMIT_S);
            return false;
        }
        struct timespec ts = csd_realtime_in_ms(100);
        pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    return true;
}

/* Hands the entries a stage refused alone to the caller (entry_err), or without entry_err fails
 * the step with the first of them. Returns the step's code. */
static int report_entries(const pending_step *s, csd_err *entry_err, csd_err *err) {
    int first = -1;
    for (int i = 0; i < s->n; i++) {
        if (entry_err && s->entry_rc[i])
            csd_err_set(&entry_err[i], s->entry_rc[i], "%s", s->entry_msg[i]);
        else if (entry_err)
            csd_err_clear(&entry_err[i]);
        if (s->entry_rc[i] && first < 0) first = i;
    }
    if (first < 0 || entry_err) return 0;
    return csd_err_set(err, s->entry_rc[first], "%s", s->entry_msg[first]);
}

static int fleet_step_end(csd_pipeline *p, csd_err *entry_err, csd_err *err) {
    fleet *f = (fleet *)p;
    pthread_mutex_lock(&f->mu);
    if (f->count == 0) {
        pthread_mutex_unlock(&f->mu);
        return csd_err_set(err, CSD_EINVAL, "no step in flight");
    }
    pending_step *s = &f->steps[f->head];
    char gave_up[CSD_ERR_MSG_MAX] = "";
    if (!wait_step(f, s, gave_up, sizeof gave_up) && !s->rc) {
        s->rc = CSD_ETIMEOUT;
        snprintf(s->msg, sizeof s->msg, "%s", gave_up);
    }
    int rc = s->rc ? csd_err_set(err, s->rc, "%s", s->msg) : report_entries(s, entry_err, err);
    f->timing.steps++;
    f->timing.wait_s += (double)(csd_now_ns() - s->t_begin) * 1e-9;
    f->head = (f->head + 1) % MAX_IN_FLIGHT;
    f->count--;
    pthread_mutex_unlock(&f->mu);
    if (gave_up[0]) mark_broken(f, gave_up);
    return rc; /* the engine closes the failed requests, which frees their state */
}

static int fleet_forward(csd_pipeline *p, uint32_t req, const int32_t *ids, int64_t n,
                         float *logits, csd_err *err) {
    fleet *f = (fleet *)p;
    for (int64_t done = 0; done < n;) { /* prompts in chunks the workers accept */
        int64_t chunk = n - done < f->opts.max_step_tokens ? n - done : f->opts.max_step_tokens;
        csd_step_entry e = {req, ids + done, chunk, done + chunk == n, false, false};
        int rc = fleet_step_begin(p, &e, 1, logits, err);
        if (!rc) rc = fleet_step_end(p, NULL, err);
        if (rc) return rc;
        done += chunk;
    }
    return 0;
}

static bool fleet_ready(csd_pipeline *p) { return atomic_load(&((fleet *)p)->connected); }
static uint64_t fleet_epoch(csd_pipeline *p) { return atomic_load(&((fleet *)p)->epoch); }

static void fleet_abort(csd_pipeline *p) {
    fleet *f = (fleet *)p;
    atomic_store(&f->stopping, true); /* no reconnecting either */
    mark_broken(f, "the coordinator is shutting down");
}

static void fleet_destroy(csd_pipeline *p) {
    fleet *f = (fleet *)p;
    if (!f) return;
    atomic_store(&f->stopping, true);
    if (f->reconnector) pthread_join(f->reconnector, NULL);
    close_links(f);
    for (int i = 0; f->locals && i < f->n_locals; i++) csd_kv_destroy(f->locals[i].kv);
    csd_free(f->locals);
    csd_free(f->send_buf);
    csd_free(f->hidden);
    csd_free(f->batch_kv);
    csd_free(f->batch_ids);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    pthread_rwlock_destroy(&f->links_lock);
    csd_free(f);
}

static const csd_pipeline_ops fleet_ops = {
    .open = fleet_open,         .forward = fleet_forward,   .step_begin = fleet_step_begin,
    .step_end = fleet_step_end, .truncate = fleet_truncate, .copy_prefix = fleet_copy_prefix,
    .close = fleet_close,       .destroy = fleet_destroy,   .ready = fleet_ready,
    .epoch = fleet_epoch,       .abort = fleet_abort};

/* Steps in flight: as asked, or one per machine; never more than the stages (a stage serves one
 * step at a time) nor the ring. */
static int micro_batches(const csd_fleet_opts *o, bool local0) {
    int stages = o->n_addrs + (local0 ? 1 : 0);
    int machines = csd_fleet_count_machines(o, local0);
    int n = o->micro_batches > 0 ? o->micro_batches : machines;
    if (n > stages) n = stages;
    if (n > MAX_IN_FLIGHT) n = MAX_IN_FLIGHT;
    CSD_LOGI("fleet: %d stage(s) on %d machine(s): %d micro-batch(es) in flight%s", stages,
             machines, n, o->micro_batches > 0 ? " (--micro-batches)" : "");
    return n;
}

int csd_fleet_pipeline_create(csd_pipeline **out, const csd_fleet_opts *opts, csd_model *local0,
                              int max_requests, csd_err *err) {
    *out = NULL;
    if (opts->n_addrs <= 0 || opts->n_addrs > CSD_FLEET_MAX_STAGES)
        return csd_err_set(err, CSD_EINVAL, "a fleet needs 1 to %d remote stages",
                           CSD_FLEET_MAX_STAGES);
    fleet *f = csd_alloc(sizeof *f);
    if (!f) return csd_err_set(err, CSD_ENOMEM, "fleet");
    f->opts = *opts;
    if (f->opts.hidden_dtype < 0) f->opts.hidden_dtype = CSD_DTYPE_F16;
    if (f->opts.max_step_tokens <= 0) f->opts.max_step_tokens = CSD_MODEL_DEFAULT_MAX_BATCH;
    if (f->opts.step_silence_ms <= 0) f->opts.step_silence_ms = STEP_SILENCE_MS;
    f->local0 = local0;
    if (local0 && f->opts.max_step_tokens > csd_model_max_batch(local0))
        f->opts.max_step_tokens = csd_model_max_batch(local0);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    pthread_rwlock_init(&f->links_lock, NULL);
    f->base.ops = &fleet_ops;
    f->base.cfg = opts->cfg;
    f->base.max_ctx = opts->max_ctx;
    f->base.max_in_flight = micro_batches(opts, local0 != NULL);
    f->base.max_step_tokens = f->opts.max_step_tokens;
    int rc = 0;
    f->n_locals = max_requests > 0 ? max_requests : 1;
    f->locals = csd_alloc_array((size_t)f->n_locals, sizeof(local_req));
    if (!f->locals) rc = csd_err_set(err, CSD_ENOMEM, "fleet requests");
    if (local0 && !rc) {
        f->hidden =
            csd_alloc_array((size_t)(f->opts.max_step_tokens * opts->cfg.dim), sizeof(float));
        f->batch_kv = csd_alloc_array((size_t)f->opts.max_step_tokens, sizeof(csd_kv *));
        f->batch_ids = csd_alloc_array((size_t)f->opts.max_step_tokens, sizeof(int32_t));
        if (!f->hidden || !f->batch_kv || !f->batch_ids)
            rc = csd_err_set(err, CSD_ENOMEM, "fleet stage 0");
    }
    if (!rc) rc = connect_chain(f, err);
    if (!rc && pthread_create(&f->reconnector, NULL, reconnect_main, f) != 0)
        rc = csd_err_set(err, CSD_EIO, "cannot start the reconnect thread");
    if (rc) {
        fleet_destroy(&f->base);
        return rc;
    }
    *out = &f->base;
    return 0;
}

void csd_fleet_pipeline_timing(csd_pipeline *p, csd_fleet_timing *out) {
    fleet *f = (fleet *)p;
    pthread_mutex_lock(&f->mu);
    *out = f->timing;
    pthread_mutex_unlock(&f->mu);
    /* remote compute: ask every stage for its counters. The read lock and `connected` together
     * keep the links still: while the fleet is down the reconnector rewrites conns[] without the
     * lock, and it sets `connected` only after its last write (as send_first relies on too). */
    pthread_mutex_lock(&f->mu);
    f->stats_pending = f->opts.n_addrs;
    pthread_mutex_unlock(&f->mu);
    int unsent = 0;
    for (int i = 0; i < f->opts.n_addrs; i++) {
        csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_STATS, 0, 0, 0, 0);
        pthread_rwlock_rdlock(&f->links_lock);
        if (!atomic_load(&f->connected) || !f->conns[i] ||
            csd_conn_send(f->conns[i], &h, NULL, 0, NULL) != 0)
            unsent++;
        pthread_rwlock_unlock(&f->links_lock);
    }
    pthread_mutex_lock(&f->mu);
    f->stats_pending -= unsent; /* no answer is coming for those: do not wait for it */
    uint64_t deadline = csd_now_ns() + 2000000000ull;
    while (f->stats_pending > 0 && csd_now_ns() < deadline) {
        struct timespec ts = csd_realtime_in_ms(1000);
        pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    out->remote_compute_s = 0;
    for (int i = 0; i < f->opts.n_addrs; i++)
        out->remote_compute_s += (double)f->last_stats[i].forward_ns * 1e-9;
    pthread_mutex_unlock(&f->mu);
}
