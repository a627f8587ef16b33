/* stage_server: accept loop, per-connection readers, one ordered compute queue (see the header). */
#include "stage_server.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/log.h"

#define IDLE_POLL_MS 200        /* how often blocked loops look at the stop flag */
#define REFUSAL_WARN_NS 60000000000ull /* a refused coordinator is a warning once a minute */
#define BATCH_WAIT_MS 2000      /* longest wait for the rest of a BATCH_MORE group */
#define CSD_STEP_MAX_BATCH_ITEMS 256 /* frames (requests) in one batched forward */
/* Links at once (coordinators, the previous stage, benches, handshakes in progress): each has a
 * thread and a receive buffer, so a stranger opening connections must not get unbounded ones.
 * Not fewer: strangers holding every place would keep a coordinator from reconnecting, and a
 * stranger's place costs little now that a handshake reads at most 1 KB. */
#define MAX_PEERS 128
#define ACCEPT_RETRY_MS 100     /* after a failed accept (out of descriptors): no busy loop */
/* The frames queued for the compute thread are bounded in bytes (payloads plus this much per
 * frame): a peer that sends faster than the stage computes (a coordinator run amok, or anyone on
 * an --insecure link) gets ERRORs for the frames over the bound instead of the worker's memory.
 * The bound is QUEUE_STEPS of the largest steps this stage takes, more than a coordinator keeps
 * in flight (16 steps); copies kept for reuse are bounded by the same. */
#define QUEUE_ITEM_COST 256
#define QUEUE_STEPS 32

typedef struct peer {
    struct peer *next;
    struct csd_stage_server *s;
    csd_conn *conn;
    pthread_t reader;
    int role;                   /* enum csd_wire_role of the other side */
    atomic_bool finished;       /* reader thread has exited */
    atomic_bool superseded;     /* a coordinator that connected later took over (set once) */
    _Atomic uint64_t heard_ns;  /* the last frame from the other side */
    char superseded_by[CSD_CONN_PEER_MAX]; /* its address; written before superseded is set */
} peer;

typedef struct item {
    struct item *next;
    peer *src;
    csd_wire_hdr hdr;
    uint8_t *data;              /* payload copy */
    size_t cap;
} item;

typedef struct stage_req {
    uint32_t id;
    csd_kv *kv;                 /* NULL: free slot */
    int hidden_dtype;           /* dtype of hidden states sent on */
    uint64_t last_used;
} stage_req;

struct csd_stage_server {
    csd_model *model;
    csd_stage_opts opts;
    csd_listener *listener;
    atomic_bool stop;
    pthread_mutex_t mu;         /* queue, peers, downstream */
    pthread_mutex_t send_mu;    /* held while sending on the output link */
    pthread_cond_t cv;
    item *q_head, *q_tail, *free_items;
    size_t queued_bytes, free_bytes; /* charged (item_cost) in the queue; copies in free_items */
    size_t queue_cap;           /* bound of each (see QUEUE_STEPS) */
    peer *peers;
    peer *coord;                /* the coordinator's link: where the last stage answers */
    csd_conn *down;             /* the next stage (non-last stages, after ROUTE) */
    pthread_t compute;
    bool compute_started;
    /* compute thread only */
    stage_req *reqs;
    int n_reqs;
    uint64_t use_clock;
    item *batch[CSD_STEP_MAX_BATCH_ITEMS];
    int32_t *ids;               /* (max_batch) */
    float *hidden;              /* (max_batch, dim) input rows */
    float *out;                 /* (max_batch, dim) output rows */
    float *logits;              /* grown on demand */
    size_t logits_cap;          /* floats */
    csd_kv **batch_kv;          /* (max_batch) */
    bool *want;                 /* (max_batch) */
    uint8_t *send_buf;
    size_t send_cap;
    /* counters */
    atomic_uint_fast64_t forward_ns, forward_tokens;
    _Atomic uint64_t refusal_warned_ns; /* when a coordinator's refusal was last a warning */
    /* open requests and their KV bytes, for STATS: the compute thread owns reqs[] and frees
     * caches without a lock, so a reader thread must not walk it */
    atomic_int kv_open;
    atomic_uint_fast64_t kv_used;
};

/* ---- small helpers ---- */

static const csd_model_config *cfg_of(const csd_stage_server *s) { return csd_model_cfg(s->model); }
static const csd_weights *w_of(const csd_stage_server *s) { return csd_model_weights(s->model); }

static int ensure_send(csd_stage_server *s, size_t n, csd_err *err) {
    if (n <= s->send_cap) return 0;
    uint8_t *p = csd_alloc(n);
    if (!p) return csd_err_set(err, CSD_ENOMEM, "send buffer of %zu bytes", n);
    csd_free(s->send_buf);
    s->send_buf = p;
    s->send_cap = n;
    return 0;
}

static stage_req *find_req(csd_stage_server *s, uint32_t id) {
    for (int i = 0; i < s->n_reqs; i++)
        if (s->reqs[i].kv && s->reqs[i].id == id) return &s->reqs[i];
    return NULL;
}

static uint64_t kv_bytes(const csd_stage_server *s, const stage_req *r) {
    return (uint64_t)csd_kv_capacity(r->kv) * csd_model_kv_bytes_per_token(s->model);
}

/* The link to the next stage failed (send_mu held): it is closed, and the coordinator is told with
 * a link-level ERROR (request 0), which makes it fail the steps in flight and connect the chain
 * again (ROUTE included). Nothing reads that link, so a send is where its failure shows; without
 * this the coordinator, which hears every stage answer its PINGs, would wait for results that can
 * no longer come. Until the next ROUTE, results that would go down fail, each with an ERROR to
 * the coordinator (run_batch). */
static void drop_down_link(csd_stage_server *s, const char *why) {
    pthread_mutex_lock(&s->mu);
    csd_conn *old = s->down;
    s->down = NULL;
    csd_conn *coord = s->coord ? s->coord->conn : NULL;
    pthread_mutex_unlock(&s->mu);
    csd_conn_destroy(old);
    char text[CSD_WIRE_MAX_ERROR_TEXT];
    snprintf(text, sizeof text, "stage %u: the link to the next stage failed: %s",
             s->opts.stage_index, why);
    CSD_LOGW("%s", text);
    if (coord) csd_conn_send_error(coord, 0, CSD_ECLOSED, text, NULL);
}

/* Sends a frame where this stage's output goes: the next stage, or (last stage, or no next stage
 * yet) the coordinator. send_mu keeps the link alive while we use it: the accept loop and ROUTE
 * take it before they close or replace a link. */
static int send_out(csd_stage_server *s, const csd_wire_hdr *h, const void *payload, size_t len,
                    bool errors_to_coord, csd_err *err) {
    pthread_mutex_lock(&s->send_mu);
    pthread_mutex_lock(&s->mu);
    csd_conn *c = w_of(s)->has_head ? (s->coord ? s->coord->conn : NULL) : s->down;
    bool down = c && c == s->down;
    if (!c && errors_to_coord && s->coord) c = s->coord->conn;
    pthread_mutex_unlock(&s->mu);
    csd_err local = {0};
    if (!err) err = &local;
    int rc;
    if (down && csd_conn_peer_gone(c)) /* hung up: a send may still be taken by the socket */
        rc = csd_err_set(err, CSD_ECLOSED, "the next stage closed the link");
    else
        rc = c ? csd_conn_send(c, h, payload, len, err)
               : csd_err_set(err, CSD_ECLOSED, "no link to the next stage or the coordinator");
    if (rc && down) drop_down_link(s, err->msg);
    pthread_mutex_unlock(&s->send_mu);
    return rc;
}

/* A request's ERROR reaches the coordinator through the later stages, so its text names the
 * stage it comes from ("stage N: ..."): the coordinator tells its operator which worker to look
 * at. */
static void send_req_error(csd_stage_server *s, uint32_t req, int code, const char *text) {
    CSD_LOGW("stage=%u req=%u error: %s", s->opts.stage_index, req, text);
    char named[CSD_WIRE_MAX_ERROR_TEXT];
    snprintf(named, sizeof named, "stage %u: %s", s->opts.stage_index, text);
    uint8_t buf[CSD_WIRE_ERROR_HDR_SIZE + CSD_WIRE_MAX_ERROR_TEXT];
    size_t len = 0;
    if (csd_wire_encode_error(buf, sizeof buf, code, named, &len, NULL)) return;
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_ERROR, 0, req, 0, (uint32_t)len);
    send_out(s, &h, buf, len, true, NULL);
}

static void forward_frame(csd_stage_server *s, const item *it) {
    if (w_of(s)->has_head) return;
    send_out(s, &it->hdr, it->data, it->hdr.payload_len, false, NULL);
}

/* ---- request control ---- */

static void close_req(csd_stage_server *s, stage_req *r) {
    if (!r->kv) return;
    /* kv_used changes before kv_open, both ways: STATS reads the count first, so the bytes it
     * then reads already include every request that count includes (and none it has dropped) */
    atomic_fetch_sub(&s->kv_used, kv_bytes(s, r));
    atomic_fetch_sub(&s->kv_open, 1);
    csd_kv_destroy(r->kv);
    r->kv = NULL;
}

/* The open request used least recently, or NULL when none is open. */
static stage_req *lru_open(csd_stage_server *s) {
    stage_req *lru = NULL;
    for (int i = 0; i < s->n_reqs; i++)
        if (s->reqs[i].kv && (!lru || s->reqs[i].last_used < lru->last_used)) lru = &s->reqs[i];
    return lru;
}

/* Frees least-recently-used requests until `need` more bytes fit under the cap (need <= cap). */
static void make_room(csd_stage_server *s, uint64_t need) {
    stage_req *lru;
    while (atomic_load(&s->kv_used) + need > s->opts.kv_mem_cap && (lru = lru_open(s))) {
        CSD_LOGI("stage=%u evicting req=%u (least recently used) to fit a new request",
                 s->opts.stage_index, lru->id);
        close_req(s, lru);
    }
}

static void handle_open(csd_stage_server *s, item *it) {
    csd_wire_open o;
    csd_err err = {0};
    uint32_t id = it->hdr.request_id;
    if (csd_wire_decode_open(it->data, it->hdr.payload_len, &o, &err)) {
        send_req_error(s, id, CSD_EPROTO, err.msg);
        return;
    }
    stage_req *r = find_req(s, id);
    if (r) close_req(s, r); /* re-open: start over */
    uint64_t need = (uint64_t)o.max_context * csd_model_kv_bytes_per_token(s->model);
    if ((int64_t)o.max_context > csd_model_max_ctx(s->model)) {
        char msg[160];
        snprintf(msg, sizeof msg, "context %u exceeds this stage's limit of %lld tokens",
                 o.max_context, (long long)csd_model_max_ctx(s->model));
        send_req_error(s, id, CSD_ERANGE, msg);
        return;
    }
    if (need > s->opts.kv_mem_cap) { /* it would never fit: evict nobody for it */
        char msg[160];
        snprintf(msg, sizeof msg,
                 "request needs %.1f MiB of KV cache, more than the stage's cap of %.1f MiB",
                 (double)need / (1 << 20), (double)s->opts.kv_mem_cap / (1 << 20));
        send_req_error(s, id, CSD_EFULL, msg);
        return;
    }
    stage_req *slot = NULL;
    for (int i = 0; i < s->n_reqs && !slot; i++)
        if (!s->reqs[i].kv) slot = &s->reqs[i];
    if (!slot) { /* every slot busy: evict the least recently used */
        slot = lru_open(s);
        close_req(s, slot);
    }
    make_room(s, need);
    if (csd_kv_create(&slot->kv, s->model, o.max_context, &err)) {
        send_req_error(s, id, err.code, err.msg);
        return;
    }
    atomic_fetch_add(&s->kv_used, kv_bytes(s, slot)); /* before kv_open: see close_req */
    atomic_fetch_add(&s->kv_open, 1);
    slot->id = id;
    slot->hidden_dtype = o.hidden_dtype;
    slot->last_used = ++s->use_clock;
    forward_frame(s, it);
}

static void handle_control(csd_stage_server *s, item *it) {
    stage_req *r = find_req(s, it->hdr.request_id);
    if (it->hdr.type == CSD_WIRE_CLOSE) {
        if (r) close_req(s, r);
    } else if (it->hdr.type == CSD_WIRE_TRUNCATE) {
        uint32_t keep = 0;
        csd_err err = {0};
        int rc = csd_wire_decode_truncate(it->data, it->hdr.payload_len, &keep, &err);
        if (!rc && r && csd_kv_truncate(r->kv, keep))
            rc = csd_err_set(&err, CSD_ERANGE, "truncate beyond the request's length");
        if (rc) { /* answered once, here: the later stages' answers would be matched to the
                     request's next steps */
            send_req_error(s, it->hdr.request_id, rc, err.msg);
            return;
        }
    } else if (it->hdr.type == CSD_WIRE_COPY_PREFIX) {
        uint32_t src = 0, n = 0;
        csd_err err = {0};
        stage_req *from = NULL;
        int rc = csd_wire_decode_copy_prefix(it->data, it->hdr.payload_len, &src, &n, &err);
        if (!rc && (!r || !(from = find_req(s, src))))
            rc = csd_err_set(&err, CSD_ENOTFOUND,
                             "copy prefix: request %u is not open on this stage",
                             r ? src : it->hdr.request_id);
        if (!rc) rc = csd_kv_copy_prefix(r->kv, from->kv, n, &err);
        if (rc) {
            send_req_error(s, it->hdr.request_id, rc, err.msg);
            return; /* the coordinator fails the request; later stages never see it */
        }
        from->last_used = ++s->use_clock;
    } else if (it->hdr.type == CSD_WIRE_ERROR) {
        /* an upstream stage failed this request: pass it on toward the coordinator */
    }
    if (it->hdr.type == CSD_WIRE_ERROR && w_of(s)->has_head)
        send_out(s, &it->hdr, it->data, it->hdr.payload_len, true, NULL);
    else
        forward_frame(s, it);
}

/* ---- forward ---- */

/* Checks that frame it of request r may join the batch filled up to fill, before anything of it
 * is loaded: one output asked, r not in the batch already (its rows' positions follow the KV
 * length at the batch's start), and the frame's positions within r's context. A frame that fails
 * fails alone; the others of the batch go on. */
static int check_frame(csd_stage_server *s, const item *it, const stage_req *r, int64_t fill,
                       int64_t n, csd_err *err) {
    int rc = csd_wire_check_act_flags(it->hdr.flags, err);
    if (rc) return rc;
    for (int64_t i = 0; i < fill; i++)
        if (s->batch_kv[i] == r->kv)
            return csd_err_set(err, CSD_EPROTO, "request %u twice in one batch",
                               it->hdr.request_id);
    if ((int64_t)it->hdr.position + n > csd_kv_capacity(r->kv))
        return csd_err_set(err, CSD_EFULL, "sequence is full: %lld tokens at position %u, "
                           "context %lld", (long long)n, it->hdr.position,
                           (long long)csd_kv_capacity(r->kv));
    return 0;
}

/* Loads the rows of one FORWARD frame into the batch at offset *fill. */
static int load_rows(csd_stage_server *s, item *it, stage_req *r, int64_t *fill, csd_err *err) {
    csd_wire_act act;
    int rc = csd_wire_decode_act(it->data, it->hdr.payload_len, &act, err);
    if (!rc) rc = check_frame(s, it, r, *fill, act.n_tokens, err);
    if (rc) return rc;
    if (w_of(s)->has_head &&
        (it->hdr.flags & CSD_WIRE_FLAG_OUT_MASK) == CSD_WIRE_FLAG_OUT_HIDDEN)
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "the last stage returns logits or sampled ids, not hidden states");
    int64_t n = act.n_tokens, dim = cfg_of(s)->dim;
    if (*fill + n > csd_model_max_batch(s->model))
        return csd_err_set(err, CSD_ERANGE,
                           "frame of %lld tokens exceeds the stage's batch of %lld", (long long)n,
                           (long long)csd_model_max_batch(s->model));
    if (w_of(s)->has_embed) {
        if (act.kind != CSD_WIRE_ACT_TOKENS)
            return csd_err_set(err, CSD_EPROTO, "stage 0 expects token ids");
        rc = csd_wire_act_ids(&act, (uint32_t *)(s->ids + *fill), (uint32_t)n, err);
        for (int64_t i = 0; !rc && i < n; i++)
            if (s->ids[*fill + i] < 0 || s->ids[*fill + i] >= cfg_of(s)->vocab_size)
                rc = csd_err_set(err, CSD_ERANGE, "token id %d outside the vocabulary",
                                 s->ids[*fill + i]);
    } else {
        if (act.kind != CSD_WIRE_ACT_HIDDEN || act.dim != (uint32_t)dim)
            return csd_err_set(err, CSD_EPROTO, "expected hidden states of width %lld",
                               (long long)dim);
        rc = csd_wire_act_to_f32(&act, s->hidden + *fill * dim, (size_t)(n * dim), err);
    }
    if (rc) return rc;
    /* A position below the request's length rewinds it (a retried or speculative step). */
    if ((int64_t)it->hdr.position < csd_kv_len(r->kv)) csd_kv_truncate(r->kv, it->hdr.position);
    if ((int64_t)it->hdr.position != csd_kv_len(r->kv))
        return csd_err_set(err, CSD_EPROTO, "position %u but the request holds %lld tokens",
                           it->hdr.position, (long long)csd_kv_len(r->kv));
    bool all = it->hdr.flags & CSD_WIRE_FLAG_ALL_TOKENS;
    for (int64_t i = 0; i < n; i++) {
        s->batch_kv[*fill + i] = r->kv;
        s->want[*fill + i] = all || i == n - 1;
    }
    *fill += n;
    return 0;
}

static int ensure_logits(csd_stage_server *s, size_t floats, csd_err *err) {
    if (floats <= s->logits_cap) return 0;
    float *p = csd_alloc_array(floats, sizeof(float));
    if (!p) return csd_err_set(err, CSD_ENOMEM, "logits buffer");
    csd_free(s->logits);
    s->logits = p;
    s->logits_cap = floats;
    return 0;
}

static int32_t argmax_row(const float *x, int64_t n) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

/* Sends the results of item k whose output rows start at row (hidden) or logit row lrow. */
static int send_output(csd_stage_server *s, item *it, stage_req *r, int64_t row, int64_t n,
                       int64_t lrow, int64_t n_logit_rows, csd_err *err) {
    const csd_model_config *c = cfg_of(s);
    size_t len = 0;
    csd_wire_hdr h;
    int rc;
    if (!w_of(s)->has_head) {
        size_t need = csd_wire_act_payload_size(CSD_WIRE_ACT_HIDDEN, r->hidden_dtype, (uint32_t)n,
                                                (uint32_t)c->dim);
        if ((rc = ensure_send(s, need, err))) return rc;
        rc = csd_wire_encode_rows_f32(s->send_buf, s->send_cap, CSD_WIRE_ACT_HIDDEN,
                                      r->hidden_dtype, s->out + row * c->dim, (uint32_t)n,
                                      (uint32_t)c->dim, &len, err);
        h = csd_wire_hdr_make(CSD_WIRE_FORWARD, it->hdr.flags, it->hdr.request_id, it->hdr.position,
                              (uint32_t)len);
    } else if (it->hdr.flags & CSD_WIRE_FLAG_OUT_SAMPLE) {
        uint32_t ids[CSD_WIRE_MAX_TOKENS > 512 ? 512 : CSD_WIRE_MAX_TOKENS];
        for (int64_t i = 0; i < n_logit_rows; i++)
            ids[i] = (uint32_t)argmax_row(s->logits + (lrow + i) * c->vocab_size, c->vocab_size);
        if ((rc = ensure_send(s, 64 + (size_t)n_logit_rows * 4, err))) return rc;
        rc = csd_wire_encode_ids(s->send_buf, s->send_cap, CSD_WIRE_ACT_SAMPLED, ids,
                                 (uint32_t)n_logit_rows, &len, err);
        h = csd_wire_hdr_make(CSD_WIRE_RESULT, it->hdr.flags, it->hdr.request_id, it->hdr.position,
                              (uint32_t)len);
    } else {
        size_t need = csd_wire_act_payload_size(CSD_WIRE_ACT_LOGITS, CSD_DTYPE_F32,
                                                (uint32_t)n_logit_rows, (uint32_t)c->vocab_size);
        if (need == 0)
            return csd_err_set(err, CSD_ERANGE, "logits of %lld rows exceed a frame",
                               (long long)n_logit_rows);
        if ((rc = ensure_send(s, need, err))) return rc;
        rc = csd_wire_encode_rows_f32(s->send_buf, s->send_cap, CSD_WIRE_ACT_LOGITS, CSD_DTYPE_F32,
                                      s->logits + lrow * c->vocab_size, (uint32_t)n_logit_rows,
                                      (uint32_t)c->vocab_size, &len, err);
        h = csd_wire_hdr_make(CSD_WIRE_RESULT, it->hdr.flags, it->hdr.request_id, it->hdr.position,
                              (uint32_t)len);
    }
    if (rc) return rc;
    return send_out(s, &h, s->send_buf, len, false, err);
}

/* Runs items[0..n) (consecutive FORWARD frames) as one batched forward and sends their outputs. */
static void run_batch(csd_stage_server *s, item **items, int n) {
    csd_err err = {0};
    int64_t fill = 0;
    int64_t starts[CSD_STEP_MAX_BATCH_ITEMS], ends[CSD_STEP_MAX_BATCH_ITEMS];
    stage_req *reqs[CSD_STEP_MAX_BATCH_ITEMS];
    int ok[CSD_STEP_MAX_BATCH_ITEMS];
    int64_t rows_before = 0;
    for (int k = 0; k < n; k++) {
        starts[k] = fill;
        reqs[k] = find_req(s, items[k]->hdr.request_id);
        ok[k] = 0;
        if (!reqs[k]) {
            send_req_error(s, items[k]->hdr.request_id, CSD_ENOTFOUND,
                           "request is not open on this stage (evicted or never opened)");
            continue;
        }
        if (load_rows(s, items[k], reqs[k], &fill, &err)) {
            send_req_error(s, items[k]->hdr.request_id, err.code, err.msg);
            fill = starts[k];
            continue;
        }
        ends[k] = fill;
        ok[k] = 1;
        reqs[k]->last_used = ++s->use_clock;
    }
    if (fill == 0) return;
    int64_t logit_rows = 0;
    for (int64_t i = 0; i < fill; i++) logit_rows += s->want[i];
    if (w_of(s)->has_head && ensure_logits(s, (size_t)(logit_rows * cfg_of(s)->vocab_size), &err)) {
        for (int k = 0; k < n; k++)
            if (ok[k]) send_req_error(s, items[k]->hdr.request_id, err.code, err.msg);
        return;
    }
    csd_batch b = {fill, s->ids, s->hidden, s->batch_kv, s->want};
    uint64_t t0 = csd_now_ns();
    int rc = csd_model_forward(s->model, &b, w_of(s)->has_head ? s->logits : s->out, &err);
    atomic_fetch_add(&s->forward_ns, csd_now_ns() - t0);
    atomic_fetch_add(&s->forward_tokens, (uint64_t)fill);
    /* The frames sent on form the next stage's group: the last of them ends it, even when the
     * group's last frame failed here (else the next stage would wait BATCH_WAIT_MS for it). */
    int last_ok = n - 1;
    while (last_ok >= 0 && !ok[last_ok]) last_ok--;
    for (int k = 0; k < n; k++) {
        if (!ok[k]) continue;
        int64_t end = ends[k], rows = 0;
        for (int64_t i = starts[k]; i < end; i++) rows += s->want[i];
        if (k == last_ok) items[k]->hdr.flags &= (uint16_t)~CSD_WIRE_FLAG_BATCH_MORE;
        csd_err send_err = {0};
        if (rc) send_req_error(s, items[k]->hdr.request_id, err.code, err.msg);
        else if (send_output(s, items[k], reqs[k], starts[k], end - starts[k], rows_before, rows,
                             &send_err))
            send_req_error(s, items[k]->hdr.request_id, send_err.code, send_err.msg);
        rows_before += rows;
    }
}

/* ---- the compute thread ---- */

static size_t item_cost(const csd_wire_hdr *h) { return (size_t)h->payload_len + QUEUE_ITEM_COST; }

/* Keeps it for reuse while the copies kept stay within queue_cap, else frees it (mu held). */
static void stash_locked(csd_stage_server *s, item *it) {
    if (s->free_bytes + it->cap > s->queue_cap) {
        csd_free(it->data);
        csd_free(it);
        return;
    }
    s->free_bytes += it->cap;
    it->next = s->free_items;
    s->free_items = it;
}

static item *pop_item(csd_stage_server *s, int wait_ms) {
    pthread_mutex_lock(&s->mu);
    uint64_t deadline = csd_now_ns() + (uint64_t)wait_ms * 1000000ull;
    while (!s->q_head && !atomic_load(&s->stop) && csd_now_ns() < deadline) {
        struct timespec ts = csd_realtime_in_ms(50);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    item *it = s->q_head;
    if (it) {
        s->q_head = it->next;
        if (!s->q_head) s->q_tail = NULL;
        s->queued_bytes -= item_cost(&it->hdr);
    }
    pthread_mutex_unlock(&s->mu);
    return it;
}

static bool queue_empty(csd_stage_server *s) {
    pthread_mutex_lock(&s->mu);
    bool empty = !s->q_head;
    pthread_mutex_unlock(&s->mu);
    return empty;
}

static void recycle(csd_stage_server *s, item *it) {
    pthread_mutex_lock(&s->mu);
    stash_locked(s, it);
    pthread_mutex_unlock(&s->mu);
}

static void *compute_main(void *arg) {
    csd_stage_server *s = arg;
    while (!atomic_load(&s->stop)) {
        item *it = pop_item(s, IDLE_POLL_MS);
        if (!it) continue;
        if (it->hdr.type != CSD_WIRE_FORWARD) {
            if (it->hdr.type == CSD_WIRE_OPEN) handle_open(s, it);
            else handle_control(s, it);
            recycle(s, it);
            continue;
        }
        int n = 0;
        s->batch[n++] = it;
        while ((s->batch[n - 1]->hdr.flags & CSD_WIRE_FLAG_BATCH_MORE) &&
               n < CSD_STEP_MAX_BATCH_ITEMS) {
            item *more = pop_item(s, BATCH_WAIT_MS);
            if (!more) break;
            if (more->hdr.type != CSD_WIRE_FORWARD) { /* protocol slip: run what we have first */
                run_batch(s, s->batch, n);
                for (int k = 0; k < n; k++) recycle(s, s->batch[k]);
                n = 0;
                if (more->hdr.type == CSD_WIRE_OPEN) handle_open(s, more);
                else handle_control(s, more);
                recycle(s, more);
                break;
            }
            s->batch[n++] = more;
        }
        if (n) run_batch(s, s->batch, n);
        for (int k = 0; k < n; k++) recycle(s, s->batch[k]);
        if (queue_empty(s))
            csd_pool_rest(csd_model_pool(s->model)); /* the next step is a round trip away */
    }
    return NULL;
}

/* ---- connections ---- */

static item *new_item(csd_stage_server *s, size_t len) {
    pthread_mutex_lock(&s->mu);
    item *it = s->free_items;
    if (it) {
        s->free_items = it->next;
        s->free_bytes -= it->cap;
    }
    pthread_mutex_unlock(&s->mu);
    if (!it && !(it = csd_alloc(sizeof *it))) return NULL;
    if (it->cap < len) {
        csd_free(it->data);
        it->data = csd_alloc(len);
        it->cap = it->data ? len : 0;
        if (!it->data) {
            csd_free(it);
            return NULL;
        }
    }
    it->next = NULL;
    return it;
}

/* Charges a frame to the queue's bound before it is copied; false (and the frame refused with an
 * ERROR for its request) when it would go over. */
static bool reserve_queue(csd_stage_server *s, const csd_wire_hdr *h) {
    pthread_mutex_lock(&s->mu);
    size_t cost = item_cost(h), queued = s->queued_bytes;
    bool fits = queued + cost <= s->queue_cap;
    if (fits) s->queued_bytes += cost;
    pthread_mutex_unlock(&s->mu);
    if (!fits) {
        char text[200];
        snprintf(text, sizeof text,
                 "%.1f MiB of frames already wait to be computed (at most %.1f MiB): "
                 "a %s frame of %u bytes was dropped",
                 (double)queued / (1 << 20),
                 (double)s->queue_cap / (1 << 20), csd_wire_type_name(h->type), h->payload_len);
        send_req_error(s, h->request_id, CSD_EFULL, text);
    }
    return fits;
}

static void unreserve_queue(csd_stage_server *s, const csd_wire_hdr *h) {
    pthread_mutex_lock(&s->mu);
    s->queued_bytes -= item_cost(h);
    pthread_mutex_unlock(&s->mu);
}

static void enqueue(csd_stage_server *s, peer *p, const csd_wire_hdr *h, const uint8_t *data) {
    if (!reserve_queue(s, h)) return;
    item *it = new_item(s, h->payload_len);
    if (!it) {
        unreserve_queue(s, h);
        CSD_LOGE("stage=%u out of memory queueing a frame", s->opts.stage_index);
        send_req_error(s, h->request_id, CSD_ENOMEM, "the stage is out of memory");
        return;
    }
    it->src = p;
    it->hdr = *h;
    if (h->payload_len) memcpy(it->data, data, h->payload_len);
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&p->superseded)) { /* from a coordinator replaced meanwhile: not its turn */
        s->queued_bytes -= item_cost(h);
        stash_locked(s, it);
    } else {
        if (s->q_tail) s->q_tail->next = it;
        else s->q_head = it;
        s->q_tail = it;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Drops the queued frames that came from p (mu held). */
static void drop_queued_from(csd_stage_server *s, const peer *p) {
    item **pp = &s->q_head;
    s->q_tail = NULL;
    while (*pp) {
        item *it = *pp;
        if (it->src == p) {
            *pp = it->next;
            s->queued_bytes -= item_cost(&it->hdr);
            stash_locked(s, it);
        } else {
            s->q_tail = it;
            pp = &it->next;
        }
    }
}

/* ROUTE: connect to the next stage named by the coordinator and check it is the right one. */
static int handle_route(csd_stage_server *s, const uint8_t *data, size_t len, csd_err *err) {
    char addr[CSD_WIRE_MAX_ROUTE + 1];
    int rc = csd_wire_decode_route(data, len, addr, sizeof addr, err);
    if (rc) return rc;
    if (w_of(s)->has_head) return csd_err_set(err, CSD_EPROTO, "the last stage has no next stage");
    csd_conn *c = NULL;
    if ((rc = csd_conn_connect(&c, addr, s->opts.link.timeout_ms, err))) return rc;
    csd_wire_hello expect = {0}, peer_hello;
    expect.proto_version = CSD_WIRE_VERSION;
    expect.role = CSD_WIRE_ROLE_STAGE;
    expect.stage_index = s->opts.stage_index + 1;
    expect.layer_begin = (uint32_t)w_of(s)->layer_end;
    expect.layer_end = CSD_WIRE_ANY;
    memcpy(expect.model_hash, s->opts.model_hash, CSD_WIRE_HASH_SIZE);
    rc = csd_conn_handshake_client(c, &s->opts.link, &expect, &peer_hello, err);
    if (rc) {
        csd_conn_destroy(c);
        return csd_err_prefix(err, "next stage %s: ", addr);
    }
    pthread_mutex_lock(&s->send_mu); /* no send in progress on the old link */
    pthread_mutex_lock(&s->mu);
    csd_conn *old = s->down;
    s->down = c;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&s->send_mu);
    csd_conn_destroy(old);
    CSD_LOGI("stage=%u routed to next stage at %s", s->opts.stage_index, addr);
    return 0;
}

static void reply_stats(csd_stage_server *s, peer *p) {
    csd_wire_stats st = {0};
    st.open_requests = (uint32_t)atomic_load(&s->kv_open);
    uint64_t used = atomic_load(&s->kv_used), total = s->opts.kv_mem_cap;
    csd_conn_counters cc;
    csd_conn_get_counters(p->conn, &cc);
    st.frames_in = cc.frames_in;
    st.frames_out = cc.frames_out;
    st.bytes_in = cc.bytes_in;
    st.bytes_out = cc.bytes_out;
    st.kv_bytes_used = used;
    st.kv_bytes_total = total;
    st.forward_ns = atomic_load(&s->forward_ns);
    st.forward_tokens = atomic_load(&s->forward_tokens);
    uint8_t buf[CSD_WIRE_STATS_SIZE];
    size_t len = 0;
    if (csd_wire_encode_stats(buf, sizeof buf, &st, &len, NULL) == 0) {
        csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_STATS_REPLY, 0, 0, 0, (uint32_t)len);
        csd_conn_send(p->conn, &h, buf, len, NULL);
    }
}

/* A worker sends its results to one coordinator. A coordinator that connects while another is
 * alive (heard from within coord_idle_ms, its link not hung up) is refused with the reason: say
 * `cascadia run` pointed at the workers of a running `cascadia serve`, which then goes on
 * unharmed (a coordinator PINGs its stages while idle, docs/protocol.md). One that has gone quiet
 * (its machine froze, its network dropped without a reset) is replaced: the new one takes the
 * results, and the old one is told so and its link closed (by its own reader, say_superseded).
 * The old one's queued frames are dropped and it can queue no more: their results would go to the
 * new coordinator. (A frame the compute thread holds already still runs.) Returns false, with
 * why set, to refuse p. */
static bool take_over_results(csd_stage_server *s, peer *p, char *why, size_t why_cap) {
    pthread_mutex_lock(&s->mu);
    peer *old = s->coord;
    bool refuse = false;
    if (old && old != p && !atomic_load(&old->superseded)) {
        uint64_t heard = atomic_load(&old->heard_ns), now = csd_now_ns();
        uint64_t quiet_ns = now > heard ? now - heard : 0; /* its reader may store after now */
        refuse = quiet_ns < (uint64_t)s->opts.coord_idle_ms * 1000000ull &&
                 !csd_conn_peer_gone(old->conn);
        if (refuse) {
            snprintf(why, why_cap,
                     "this worker serves the coordinator at %s (last heard %.1f s ago): one "
                     "coordinator at a time (one not heard from for %d s is replaced)",
                     csd_conn_peer(old->conn), (double)quiet_ns * 1e-9,
                     s->opts.coord_idle_ms / 1000);
        } else {
            snprintf(old->superseded_by, sizeof old->superseded_by, "%s", csd_conn_peer(p->conn));
            atomic_store(&old->superseded, true);
            drop_queued_from(s, old);
            CSD_LOGW("stage=%u coordinator %s (quiet for %.1f s) replaced by %s",
                     s->opts.stage_index, csd_conn_peer(old->conn), (double)quiet_ns * 1e-9,
                     old->superseded_by);
        }
    }
    if (!refuse) s->coord = p;
    pthread_mutex_unlock(&s->mu);
    if (refuse) { /* a second coordinator may retry every second: warn once a minute at most */
        uint64_t now = csd_now_ns(), last = atomic_load(&s->refusal_warned_ns);
        bool warn = last == 0 || now - last > REFUSAL_WARN_NS;
        if (warn) atomic_store(&s->refusal_warned_ns, now);
        CSD_LOG(warn ? CSD_LOG_WARN : CSD_LOG_DEBUG, "stage=%u refused coordinator %s: %s",
                s->opts.stage_index, csd_conn_peer(p->conn), why);
    }
    return !refuse;
}

static void say_superseded(peer *p) {
    char text[CSD_CONN_PEER_MAX + 128];
    snprintf(text, sizeof text,
             "another coordinator connected (from %s) and took over this worker: it serves one "
             "coordinator at a time",
             p->superseded_by);
    csd_conn_send_error(p->conn, 0, CSD_EFULL, text, NULL);
}

static void *reader_main(void *arg) {
    peer *p = arg;
    csd_stage_server *s = p->s;
    csd_netbuf buf = {0};
    csd_wire_hello self = {0}, other;
    self.proto_version = CSD_WIRE_VERSION;
    self.role = CSD_WIRE_ROLE_STAGE;
    self.caps = CSD_WIRE_CAP_HIDDEN_F32 | CSD_WIRE_CAP_HIDDEN_BF16 | CSD_WIRE_CAP_TRUNCATE |
                (w_of(s)->has_head ? CSD_WIRE_CAP_SAMPLE : 0);
    self.stage_index = s->opts.stage_index;
    self.layer_begin = (uint32_t)w_of(s)->layer_begin;
    self.layer_end = (uint32_t)w_of(s)->layer_end;
    memcpy(self.model_hash, s->opts.model_hash, CSD_WIRE_HASH_SIZE);
    csd_err err = {0};
    if (csd_conn_handshake_server(p->conn, &s->opts.link, &self, &other, &err)) {
        CSD_LOGW("stage=%u refused %s: %s", s->opts.stage_index, csd_conn_peer(p->conn), err.msg);
        atomic_store(&p->finished, true);
        return NULL;
    }
    p->role = other.role;
    atomic_store(&p->heard_ns, csd_now_ns());
    char why[CSD_CONN_PEER_MAX + 128];
    if (p->role == CSD_WIRE_ROLE_COORD && !take_over_results(s, p, why, sizeof why)) {
        csd_conn_send_error(p->conn, 0, CSD_EFULL, why, NULL);
        csd_conn_linger_close(p->conn); /* it may have sent a PING already: let it read why */
        atomic_store(&p->finished, true);
        return NULL;
    }
    CSD_LOGI("stage=%u connected %s role=%s", s->opts.stage_index, csd_conn_peer(p->conn),
             csd_wire_role_name(p->role));
    while (!atomic_load(&s->stop)) {
        if (atomic_load(&p->superseded)) {
            say_superseded(p);
            csd_conn_linger_close(p->conn);
            break;
        }
        csd_wire_hdr h;
        int rc = csd_conn_recv(p->conn, &h, &buf, IDLE_POLL_MS, &err);
        if (rc == CSD_ETIMEOUT) continue;
        if (!rc) atomic_store(&p->heard_ns, csd_now_ns());
        if (rc) {
            if (rc != CSD_ECLOSED)
                CSD_LOGW("stage=%u link %s: %s", s->opts.stage_index, csd_conn_peer(p->conn),
                         err.msg);
            break;
        }
        if (h.type == CSD_WIRE_PING) {
            csd_wire_hdr pong = csd_wire_hdr_make(CSD_WIRE_PONG, 0, h.request_id, 0, h.payload_len);
            csd_conn_send(p->conn, &pong, buf.data, h.payload_len, NULL);
        } else if (h.type == CSD_WIRE_STATS) {
            reply_stats(s, p);
        } else if (h.type == CSD_WIRE_ROUTE) {
            if (handle_route(s, buf.data, h.payload_len, &err))
                csd_conn_send_error(p->conn, 0, err.code, err.msg, NULL);
        } else if (h.type == CSD_WIRE_OPEN || h.type == CSD_WIRE_FORWARD ||
                   h.type == CSD_WIRE_TRUNCATE || h.type == CSD_WIRE_CLOSE ||
                   h.type == CSD_WIRE_COPY_PREFIX ||
                   (h.type == CSD_WIRE_ERROR && h.request_id != 0)) {
            enqueue(s, p, &h, buf.data);
        } else {
            CSD_LOGW("stage=%u unexpected %s from %s", s->opts.stage_index,
                     csd_wire_type_name(h.type), csd_conn_peer(p->conn));
        }
    }
    pthread_mutex_lock(&s->mu);
    if (s->coord == p) s->coord = NULL;
    pthread_mutex_unlock(&s->mu);
    csd_netbuf_fini(&buf);
    atomic_store(&p->finished, true);
    return NULL;
}

/* Joins and frees readers whose links ended. */
static void reap_peers(csd_stage_server *s, bool all) {
    pthread_mutex_lock(&s->mu);
    peer **pp = &s->peers;
    while (*pp) {
        peer *p = *pp;
        if (all) csd_conn_shutdown(p->conn);
        if (all || atomic_load(&p->finished)) {
            *pp = p->next;
            pthread_mutex_unlock(&s->mu);
            pthread_join(p->reader, NULL);
            pthread_mutex_lock(&s->send_mu); /* the compute thread may be answering on it */
            pthread_mutex_unlock(&s->send_mu);
            csd_conn_destroy(p->conn);
            csd_free(p);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        pp = &p->next;
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- lifecycle ---- */

int csd_stage_server_create(csd_stage_server **out, csd_model *model, const csd_stage_opts *opts,
                            csd_err *err) {
    *out = NULL;
    csd_stage_server *s = csd_alloc(sizeof *s);
    if (!s) return csd_err_set(err, CSD_ENOMEM, "stage server");
    s->model = model;
    s->opts = *opts;
    if (s->opts.max_requests <= 0) s->opts.max_requests = 64;
    if (s->opts.kv_mem_cap == 0) s->opts.kv_mem_cap = 4ull << 30;
    if (s->opts.coord_idle_ms <= 0) s->opts.coord_idle_ms = CSD_STAGE_COORD_IDLE_MS;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->send_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int64_t mb = csd_model_max_batch(model), dim = csd_model_cfg(model)->dim;
    s->n_reqs = s->opts.max_requests;
    /* the largest step: a full batch of hidden rows in f32 */
    s->queue_cap = QUEUE_STEPS * ((size_t)mb * (size_t)dim * sizeof(float) + (64u << 10));
    s->reqs = csd_alloc_array((size_t)s->n_reqs, sizeof(stage_req));
    s->ids = csd_alloc_array((size_t)mb, sizeof(int32_t));
    s->hidden = csd_alloc_array((size_t)(mb * dim), sizeof(float));
    s->out = csd_alloc_array((size_t)(mb * dim), sizeof(float));
    s->batch_kv = csd_alloc_array((size_t)mb, sizeof(csd_kv *));
    s->want = csd_alloc_array((size_t)mb, sizeof(bool));
    int rc = s->reqs && s->ids && s->hidden && s->out && s->batch_kv && s->want
                 ? 0 : csd_err_set(err, CSD_ENOMEM, "stage buffers");
    if (!rc) rc = csd_listener_open(&s->listener, opts->listen, err);
    if (!rc && pthread_create(&s->compute, NULL, compute_main, s) != 0)
        rc = csd_err_set(err, CSD_EIO, "cannot start the compute thread");
    if (rc) {
        csd_stage_server_destroy(s);
        return rc;
    }
    s->compute_started = true;
    *out = s;
    return 0;
}

uint16_t csd_stage_server_port(const csd_stage_server *s) { return csd_listener_port(s->listener); }

static int count_peers(csd_stage_server *s) {
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (peer *p = s->peers; p; p = p->next) n++;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* A warning at most once a second: a flood of connections must not become a flood of lines. */
static bool warn_now(uint64_t *last_ns) {
    uint64_t now = csd_now_ns();
    if (*last_ns && now - *last_ns < 1000000000ull) return false;
    *last_ns = now;
    return true;
}

int csd_stage_server_run(csd_stage_server *s, csd_err *err) {
    uint64_t last_warn = 0;
    while (!atomic_load(&s->stop)) {
        csd_conn *c = NULL;
        int rc = csd_listener_accept(s->listener, &c, IDLE_POLL_MS, err);
        reap_peers(s, false);
        if (rc == CSD_ETIMEOUT) continue;
        if (rc) {
            if (warn_now(&last_warn))
                CSD_LOGW("stage=%u accept: %s", s->opts.stage_index, err->msg);
            struct timespec ts = {0, ACCEPT_RETRY_MS * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (count_peers(s) >= MAX_PEERS) {
            if (warn_now(&last_warn))
                CSD_LOGW("stage=%u refusing a connection: %d links open already",
                         s->opts.stage_index, MAX_PEERS);
            csd_conn_destroy(c);
            continue;
        }
        peer *p = csd_alloc(sizeof *p);
        if (!p) {
            csd_conn_destroy(c);
            continue;
        }
        p->s = s;
        p->conn = c;
        if (pthread_create(&p->reader, NULL, reader_main, p) != 0) {
            csd_conn_destroy(c);
            csd_free(p);
            continue;
        }
        pthread_mutex_lock(&s->mu);
        p->next = s->peers;
        s->peers = p;
        pthread_mutex_unlock(&s->mu);
    }
    return 0;
}

void csd_stage_server_stop(csd_stage_server *s) { atomic_store(&s->stop, true); }

void csd_stage_server_destroy(csd_stage_server *s) {
    if (!s) return;
    atomic_store(&s->stop, true);
    reap_peers(s, true);
    if (s->compute_started) pthread_join(s->compute, NULL);
    csd_conn_destroy(s->down);
    csd_listener_destroy(s->listener);
    for (item *lists[2] = {s->q_head, s->free_items}, **l = lists; l < lists + 2; l++)
        for (item *it = *l, *next; it; it = next) {
            next = it->next;
            csd_free(it->data);
            csd_free(it);
        }
    for (int i = 0; s->reqs && i < s->n_reqs; i++) csd_kv_destroy(s->reqs[i].kv);
    csd_free(s->reqs);
    csd_free(s->ids);
    csd_free(s->hidden);
    csd_free(s->out);
    csd_free(s->batch_kv);
    csd_free(s->want);
    csd_free(s->logits);
    csd_free(s->send_buf);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->send_mu);
    pthread_cond_destroy(&s->cv);
    csd_free(s);
}
