/* The serving engine over a pipeline that goes down and comes back, as a fleet does when a worker
 * dies and the reconnector brings the chain back: requests that waited in the queue meanwhile
 * start on their own once it is up (nothing else needs to arrive), a cancelled one leaves the
 * queue at once, a replica that is down lends no slots to admission, the prefix cache forgets
 * what the stages held before the reconnect, and /metrics can read the engine's figures while the
 * cache changes (a data race that the ThreadSanitizer pass of scripts/test reports). A replica
 * that refuses every request passes them to the other replica, in their order, and pauses,
 * rather than failing its share.
 * The pipeline is a fake one: it always answers token 5 (or refuses every request alone, as a
 * worker does when its --kv-mem holds no whole request), and counts what the engine asks of it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "coord/engine.h"
#include "coord/pipeline.h"
#include "core/clock.h"

#define VOCAB 32
#define ANSWER 5

typedef struct fake_pipe {
    csd_pipeline base;
    atomic_bool up;
    atomic_bool refuse; /* every step's entries refused alone */
    atomic_int step_ms; /* each step takes this long */
    _Atomic uint64_t epoch;
    atomic_int opens, copies, closes;
    atomic_int longest; /* the most tokens one entry of a step carried */
    float *logits; /* the step in flight's (the engine thread only) */
    int n_want, n_entries;
} fake_pipe;

static int down_error(csd_err *err) { return csd_err_set(err, CSD_ECLOSED, "fake pipeline down"); }

static int fake_open(csd_pipeline *p, uint32_t req, int64_t max_ctx, csd_err *err) {
    fake_pipe *f = (fake_pipe *)p;
    (void)req, (void)max_ctx;
    if (!atomic_load(&f->up)) return down_error(err);
    atomic_fetch_add(&f->opens, 1);
    return 0;
}

static int fake_step_begin(csd_pipeline *p, const csd_step_entry *entries, int n, float *logits,
                           csd_err *err) {
    fake_pipe *f = (fake_pipe *)p;
    if (!atomic_load(&f->up)) return down_error(err);
    f->logits = logits;
    f->n_entries = n;
    f->n_want = 0;
    for (int i = 0; i < n; i++) {
        f->n_want += entries[i].want_logits;
        if (entries[i].n > atomic_load(&f->longest)) atomic_store(&f->longest, (int)entries[i].n);
    }
    return 0;
}

static int fake_step_end(csd_pipeline *p, csd_err *entry_err, csd_err *err) {
    fake_pipe *f = (fake_pipe *)p;
    (void)err;
    int ms = atomic_load(&f->step_ms);
    if (ms > 0) nanosleep(&(struct timespec){0, ms * 1000000L}, NULL);
    if (entry_err) memset(entry_err, 0, (size_t)f->n_entries * sizeof *entry_err);
    if (atomic_load(&f->refuse)) {
        for (int i = 0; i < f->n_entries; i++)
            csd_err_set(&entry_err[i], CSD_EFULL, "fake stage refuses every request");
        return 0;
    }
    for (int r = 0; r < f->n_want; r++)
        for (int v = 0; v < VOCAB; v++) f->logits[r * VOCAB + v] = v == ANSWER ? 10.0f : 0.0f;
    return 0;
}

static int fake_truncate(csd_pipeline *p, uint32_t req, int64_t pos, csd_err *err) {
    (void)p, (void)req, (void)pos, (void)err;
    return 0;
}

static int fake_copy_prefix(csd_pipeline *p, uint32_t src, uint32_t dst, int64_t n,
                            csd_err *err) {
    (void)src, (void)dst, (void)n, (void)err;
    atomic_fetch_add(&((fake_pipe *)p)->copies, 1);
    return 0;
}

static void fake_close(csd_pipeline *p, uint32_t req) {
    (void)req;
    atomic_fetch_add(&((fake_pipe *)p)->closes, 1);
}

static void fake_destroy(csd_pipeline *p) { (void)p; }
static bool fake_ready(csd_pipeline *p) { return atomic_load(&((fake_pipe *)p)->up); }
static uint64_t fake_epoch(csd_pipeline *p) { return atomic_load(&((fake_pipe *)p)->epoch); }

static const csd_pipeline_ops fake_ops = {
    .open = fake_open,         .step_begin = fake_step_begin,     .step_end = fake_step_end,
    .truncate = fake_truncate, .copy_prefix = fake_copy_prefix,   .close = fake_close,
    .destroy = fake_destroy,   .ready = fake_ready,               .epoch = fake_epoch};

static void fake_init(fake_pipe *f) {
    memset(f, 0, sizeof *f);
    f->base.ops = &fake_ops;
    f->base.cfg.vocab_size = VOCAB;
    f->base.max_ctx = 1024;
    f->base.max_in_flight = 1;
    f->base.max_step_tokens = 256;
    atomic_store(&f->up, true);
}

/* ---- a request's outcome ---- */

typedef struct outcome {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int end;
    int code;
    int64_t cached_tokens;
    int first; /* 1 + how many requests had their first token before this one's; 0: none yet */
    atomic_int tokens;
    int64_t completion_tokens;
} outcome;

static atomic_int g_first_tokens; /* first tokens so far, over every request */

static bool on_token(void *ctx, const csd_token_event *ev) {
    outcome *o = ctx;
    (void)ev;
    if (!o->first) o->first = 1 + atomic_fetch_add(&g_first_tokens, 1);
    atomic_fetch_add(&o->tokens, 1);
    return false;
}

static void on_done(void *ctx, const csd_req_result *res) {
    outcome *o = ctx;
    pthread_mutex_lock(&o->mu);
    o->done = true;
    o->end = res->end;
    o->code = res->code;
    o->cached_tokens = res->cached_tokens;
    o->completion_tokens = res->completion_tokens;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void outcome_init(outcome *o) {
    memset(o, 0, sizeof *o);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
}

/* True when the request ended within ms milliseconds. */
static bool wait_done_ms(outcome *o, int ms) {
    struct timespec ts = csd_realtime_in_ms(ms);
    pthread_mutex_lock(&o->mu);
    while (!o->done)
        if (pthread_cond_timedwait(&o->cv, &o->mu, &ts) != 0) break;
    bool done = o->done;
    pthread_mutex_unlock(&o->mu);
    return done;
}

/* Submits a greedy request of max_tokens; its id, or 0 with *rc (when rc) set on a refusal. */
static uint64_t submit_rc(csd_engine *e, const int32_t *prompt, int n, int64_t max_tokens,
                          outcome *o, int *rc) {
    csd_req_params p;
    memset(&p, 0, sizeof p);
    csd_sampler_params_default(&p.sampling);
    p.sampling.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    csd_req_callbacks cb = {on_token, on_done};
    csd_err err = {0};
    outcome_init(o);
    uint64_t id = 0;
    *rc = csd_engine_submit(e, prompt, n, &p, &cb, o, &id, &err);
    return *rc ? 0 : id;
}

static uint64_t submit(csd_engine *e, const int32_t *prompt, int n, int64_t max_tokens,
                       outcome *o) {
    int rc;
    uint64_t id = submit_rc(e, prompt, n, max_tokens, o, &rc);
    assert_int_equal(rc, 0);
    return id;
}

static int try_submit(csd_engine *e, const int32_t *prompt, int n, int64_t max_tokens,
                      outcome *o) {
    int rc;
    submit_rc(e, prompt, n, max_tokens, o, &rc);
    return rc;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* An engine over f alone (prefix_min 8; queue_max < 0: the default). */
static csd_engine *engine_with(fake_pipe *f, const csd_engine_opts *o) {
    csd_pipeline *pipe = &f->base;
    csd_engine *e = NULL;
    csd_err err = {0};
    assert_int_equal(csd_engine_create(&e, &pipe, 1, NULL, 0, o, &err), 0);
    return e;
}

static csd_engine *engine_over(fake_pipe *f, int parallel, int queue_max, int prefix_cache) {
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.parallel = parallel;
    if (queue_max >= 0) o.queue_max = queue_max;
    o.prefix_cache = prefix_cache;
    o.prefix_min = 8;
    return engine_with(f, &o);
}

/* ---- tests ---- */

/* A request queued while the only pipeline is down starts when it comes back, with nothing else
 * submitted: the engine thread had been waiting for a submit or a cancel to wake it. */
static void test_queued_request_starts_after_reconnect(void **state) {
    (void)state;
    static fake_pipe f; /* static: a failed test leaves its engine running */
    fake_init(&f);
    atomic_store(&f.up, false);
    csd_engine *e = engine_over(&f, 1, -1, 0);
    int32_t prompt[3] = {1, 2, 3};
    outcome queued;
    submit(e, prompt, 3, 4, &queued);
    sleep_ms(300); /* the engine has seen it and found the pipeline down */
    assert_false(queued.done);
    assert_int_equal(atomic_load(&f.opens), 0);
    atomic_store(&f.up, true); /* reconnected; nothing signals the engine */
    atomic_fetch_add(&f.epoch, 1);
    assert_true(wait_done_ms(&queued, 3000));
    assert_int_equal(queued.end, CSD_REQ_END_LENGTH);
    csd_engine_destroy(e);
}

/* A client that gives up on a queued request frees its place in the queue at once, even while no
 * pipeline is up to admit it (the request once held its place until admitted). */
static void test_cancel_frees_queue_place(void **state) {
    (void)state;
    static fake_pipe f; /* static: a failed test leaves its engine running */
    fake_init(&f);
    atomic_store(&f.up, false);
    csd_engine *e = engine_over(&f, 1, 2, 0); /* the pipeline down: the queue's two may wait */
    int32_t prompt[3] = {1, 2, 3};
    static outcome a, b, c;
    uint64_t id_a = submit(e, prompt, 3, 4, &a);
    submit(e, prompt, 3, 4, &b);
    assert_int_equal(try_submit(e, prompt, 3, 4, &c), CSD_EFULL); /* the queue is full */
    csd_engine_cancel(e, id_a);
    assert_true(wait_done_ms(&a, 1000)); /* told at once */
    assert_int_equal(a.end, CSD_REQ_END_CANCELLED);
    assert_int_equal(try_submit(e, prompt, 3, 4, &c), 0); /* its place is free */
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.queue_depth, 2);
    atomic_store(&f.up, true); /* the others run as usual */
    assert_true(wait_done_ms(&b, 3000));
    assert_true(wait_done_ms(&c, 3000));
    assert_int_equal(b.end, CSD_REQ_END_LENGTH);
    assert_int_equal(c.end, CSD_REQ_END_LENGTH);
    csd_engine_destroy(e);
}

/* Submits a group of two greedy requests; 0 or the engine's refusal. */
static int try_submit_pair(csd_engine *e, const int32_t *prompt, int n, outcome *o) {
    csd_req_params p[2];
    memset(p, 0, sizeof p);
    for (int i = 0; i < 2; i++) {
        csd_sampler_params_default(&p[i].sampling);
        p[i].sampling.temperature = 0.0f;
        p[i].max_tokens = 4;
        p[i].ignore_eos = true;
        outcome_init(&o[i]);
    }
    csd_req_callbacks cb = {on_token, on_done};
    void *ctx[2] = {&o[0], &o[1]};
    uint64_t ids[2];
    csd_err err = {0};
    return csd_engine_submit_group(e, prompt, n, p, 2, &cb, ctx, ids, &err);
}

/* An engine over the replicas f[0] and f[1] (no prefix cache). */
static csd_engine *engine_over_pair(fake_pipe *f, int parallel, int queue_max) {
    csd_pipeline *pipes[2] = {&f[0].base, &f[1].base};
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.parallel = parallel;
    o.queue_max = queue_max;
    o.prefix_cache = 0;
    csd_engine *e = NULL;
    csd_err err = {0};
    assert_int_equal(csd_engine_create(&e, pipes, 2, NULL, 0, &o, &err), 0);
    return e;
}

/* Two replicas of one slot each, no queue: while one is down (reconnecting) only the other's slot
 * takes a request, so two at once are refused at once rather than left waiting beyond --queue;
 * once it is back, both replicas' slots take them. */
static void test_down_replica_slots_not_counted(void **state) {
    (void)state;
    static fake_pipe f[2]; /* static: a failed test leaves its engine running */
    fake_init(&f[0]);
    fake_init(&f[1]);
    atomic_store(&f[1].up, false);
    csd_engine *e = engine_over_pair(f, 1, 0);
    int32_t prompt[3] = {1, 2, 3};
    static outcome pair[2], one, both[2];
    assert_int_equal(try_submit_pair(e, prompt, 3, pair), CSD_EFULL);
    submit(e, prompt, 3, 4, &one); /* the live replica's slot */
    assert_true(wait_done_ms(&one, 3000));
    assert_int_equal(one.end, CSD_REQ_END_LENGTH);
    atomic_store(&f[1].up, true);
    assert_int_equal(try_submit_pair(e, prompt, 3, both), 0);
    for (int i = 0; i < 2; i++) {
        assert_true(wait_done_ms(&both[i], 3000));
        assert_int_equal(both[i].end, CSD_REQ_END_LENGTH);
    }
    csd_engine_destroy(e);
}

/* Replicas f[0], which refuses every request alone, and f[1], whose steps take 2 ms; with
 * long_ctx, requests may run until stopped. */
static csd_engine *refusing_pair(fake_pipe *f, int parallel, int queue_max, bool long_ctx) {
    fake_init(&f[0]);
    fake_init(&f[1]);
    if (long_ctx) f[0].base.max_ctx = f[1].base.max_ctx = 1 << 20;
    atomic_store(&f[0].refuse, true);
    atomic_store(&f[1].step_ms, 2);
    return engine_over_pair(f, parallel, queue_max);
}

/* Waits until the engine has rerouted n requests in all. */
static void wait_rerouted(csd_engine *e, int64_t n) {
    csd_engine_stats st;
    for (csd_engine_get_stats(e, &st); st.requests_rerouted < n; csd_engine_get_stats(e, &st))
        sleep_ms(1);
}

/* Of two replicas, one refuses every request alone: every request still completes, on the other
 * one, and the refusing replica pauses between tries instead of taking its share of them. The
 * serving one's steps take 2 ms, so requests wait in the queue for a while: without the pause
 * the refusing replica would take nearly all of them, one after the other. */
static void test_refusing_replica_passes_requests_on(void **state) {
    (void)state;
    static fake_pipe f[2]; /* static: a failed test leaves its engine running */
    enum { N = 16 };
    csd_engine *e = refusing_pair(f, 1, N, false);
    int32_t prompt[3] = {1, 2, 3};
    static outcome out[N];
    for (int i = 0; i < N; i++) submit(e, prompt, 3, 4, &out[i]);
    for (int i = 0; i < N; i++) {
        assert_true(wait_done_ms(&out[i], 20000));
        assert_int_equal(out[i].end, CSD_REQ_END_LENGTH);
    }
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_true(st.requests_rerouted >= 1);
    /* paused 250 ms, then 500 ms, ...: a few tries while the other replica serves them all */
    assert_true(atomic_load(&f[0].opens) < N / 2);
    assert_int_equal(atomic_load(&f[1].opens), N);
    csd_engine_destroy(e);
}

/* When every replica refuses a request, it fails with the refusal's reason (once each replica
 * has tried it), rather than going round the replicas for ever. */
static void test_request_every_replica_refuses_fails(void **state) {
    (void)state;
    static fake_pipe f[2]; /* static: a failed test leaves its engine running */
    fake_init(&f[0]);
    fake_init(&f[1]);
    atomic_store(&f[0].refuse, true);
    atomic_store(&f[1].refuse, true);
    csd_engine *e = engine_over_pair(f, 1, 4);
    int32_t prompt[3] = {1, 2, 3};
    static outcome o;
    submit(e, prompt, 3, 2, &o);
    assert_true(wait_done_ms(&o, 5000));
    assert_int_equal(o.end, CSD_REQ_END_ERROR);
    assert_int_equal(o.code, CSD_EFULL);
    assert_int_equal(atomic_load(&f[0].opens) + atomic_load(&f[1].opens), 2);
    csd_engine_destroy(e);
}

/* A request one replica refused waits for the other only while that one is up: when it goes
 * down, the first replica tries the request again and it fails there with the refusal's reason,
 * rather than waiting in the queue for a replica that may never come back. The other goes down
 * after the first one's pause has ended, while its thread waits for work: nothing signals it. */
static void test_refused_request_not_stranded(void **state) {
    (void)state;
    static fake_pipe f[2]; /* static: a failed test leaves its engine running */
    csd_engine *e = refusing_pair(f, 1, 4, true); /* the busy request runs until stopped */
    int32_t prompt[3] = {1, 2, 3};
    static outcome busy, refused;
    submit(e, prompt, 3, 100000, &busy); /* holds the other replica's only slot */
    while (atomic_load(&f[1].opens) == 0) sleep_ms(1);
    submit(e, prompt, 3, 2, &refused);
    wait_rerouted(e, 1); /* the refusing replica has tried it: it waits for the busy one */
    sleep_ms(400); /* the pause (250 ms) is over */
    atomic_store(&f[1].up, false); /* the busy request fails with it */
    assert_true(wait_done_ms(&busy, 10000));
    assert_int_equal(busy.end, CSD_REQ_END_ERROR);
    assert_true(wait_done_ms(&refused, 10000));
    assert_int_equal(refused.end, CSD_REQ_END_ERROR);
    assert_int_equal(refused.code, CSD_EFULL); /* the refusing replica's reason */
    csd_engine_destroy(e);
}

/* A replica lost while a request's tokens stream (a worker gone) hands it to the other replica,
 * which computes its prompt and its answer so far in one prefill and goes on: the client gets
 * every token once, up to max_tokens, and nothing fails. A request the other replica then
 * refuses alone fails (a refusal is never resumed). */
static void test_replica_lost_mid_answer_resumes(void **state) {
    (void)state;
    static fake_pipe f[2]; /* static: a failed test leaves its engine running */
    fake_init(&f[0]);
    fake_init(&f[1]);
    atomic_store(&f[0].step_ms, 2);
    atomic_store(&f[1].step_ms, 2);
    csd_engine *e = engine_over_pair(f, 1, 4);
    int32_t prompt[3] = {1, 2, 3};
    static outcome o, refused;
    submit(e, prompt, 3, 120, &o);
    while (atomic_load(&o.tokens) < 20) sleep_ms(1);
    int on = atomic_load(&f[0].opens) ? 0 : 1, other = 1 - on;
    atomic_store(&f[on].up, false);
    assert_true(wait_done_ms(&o, 20000));
    assert_int_equal(o.end, CSD_REQ_END_LENGTH);
    assert_int_equal(o.completion_tokens, 120);
    assert_int_equal(atomic_load(&o.tokens), 120);
    /* the other replica's prefill: the prompt and the answer the client had (at least 20) */
    assert_true(atomic_load(&f[other].longest) >= 3 + 20);
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.requests_resumed, 1);
    /* the same loss while the replica left refuses everything: the request fails there */
    atomic_store(&f[on].up, true);
    submit(e, prompt, 3, 100000, &refused);
    while (atomic_load(&refused.tokens) < 5) sleep_ms(1);
    int holder = atomic_load(&f[other].opens) > 1 ? other : on; /* (the other is still free) */
    atomic_store(&f[1 - holder].refuse, true);
    atomic_store(&f[holder].up, false);
    assert_true(wait_done_ms(&refused, 20000));
    assert_int_equal(refused.end, CSD_REQ_END_ERROR);
    assert_int_equal(refused.code, CSD_EFULL);
    csd_engine_destroy(e);
}

/* An engine over f alone whose requests wait resume_wait_ms for a lost pipeline to come back. */
static csd_engine *engine_waiting(fake_pipe *f, int resume_wait_ms) {
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.parallel = 1;
    o.prefix_cache = 0;
    o.resume_wait_ms = resume_wait_ms;
    return engine_with(f, &o);
}

/* With one replica, a request whose pipeline is lost mid-answer waits for it to come back (a
 * worker restarted and reconnected) and goes on there: every token once, up to max_tokens. Lost
 * a second time on that replica, a request fails (no request bounces for ever). */
static void test_lost_alone_waits_for_the_replica(void **state) {
    (void)state;
    static fake_pipe f; /* static: a failed test leaves its engine running */
    fake_init(&f);
    atomic_store(&f.step_ms, 2);
    csd_engine *e = engine_waiting(&f, 20000);
    int32_t prompt[3] = {1, 2, 3};
    static outcome o, twice;
    submit(e, prompt, 3, 120, &o);
    while (atomic_load(&o.tokens) < 20) sleep_ms(1);
    atomic_store(&f.up, false);
    sleep_ms(300);
    assert_false(o.done); /* waiting, not failed */
    atomic_store(&f.longest, 0);
    /* up on its old connection (a pipeline that still looked up after a failed send): not taken
     * back there, where it would fail at once */
    int held = atomic_load(&o.tokens);
    atomic_store(&f.up, true);
    sleep_ms(300);
    assert_false(o.done);
    assert_int_equal(atomic_load(&o.tokens), held);
    atomic_fetch_add(&f.epoch, 1); /* reconnected: a new connection */
    assert_true(wait_done_ms(&o, 20000));
    assert_int_equal(o.end, CSD_REQ_END_LENGTH);
    assert_int_equal(o.completion_tokens, 120);
    assert_int_equal(atomic_load(&o.tokens), 120);
    assert_true(atomic_load(&f.longest) >= 3 + 20); /* its prompt and answer, computed again */
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.requests_resumed, 1);
    submit(e, prompt, 3, 100000, &twice);
    for (int loss = 0; loss < 2; loss++) {
        int seen = atomic_load(&twice.tokens);
        while (atomic_load(&twice.tokens) < seen + 5) sleep_ms(1);
        atomic_store(&f.up, false);
        sleep_ms(100);
        atomic_fetch_add(&f.epoch, 1);
        atomic_store(&f.up, true);
    }
    assert_true(wait_done_ms(&twice, 20000));
    assert_int_equal(twice.end, CSD_REQ_END_ERROR);
    csd_engine_destroy(e);
}

/* A lost request that no replica takes back within resume_wait_ms fails with a message saying so,
 * its streamed tokens counted; with 0 it fails at once, without waiting in the queue; when serve
 * drains (SIGTERM), one waiting ends at once rather than hold the drain. */
static void test_lost_wait_ends(void **state) {
    (void)state;
    static fake_pipe f[3]; /* static: a failed test leaves its engine running */
    static outcome o[3];
    int32_t prompt[3] = {1, 2, 3};
    for (int i = 0; i < 3; i++) {
        fake_init(&f[i]);
        atomic_store(&f[i].step_ms, 2);
        csd_engine *e = engine_waiting(&f[i], i == 0 ? 300 : i == 1 ? 0 : 60000);
        submit(e, prompt, 3, 100000, &o[i]);
        while (atomic_load(&o[i].tokens) < 10) sleep_ms(1);
        atomic_store(&f[i].up, false);
        if (i == 2) {
            sleep_ms(200);
            assert_false(o[i].done); /* waiting */
            csd_engine_drain(e);
        }
        assert_true(wait_done_ms(&o[i], 10000));
        assert_int_equal(o[i].end, CSD_REQ_END_ERROR);
        assert_int_equal(o[i].completion_tokens, atomic_load(&o[i].tokens));
        csd_engine_stats st;
        csd_engine_get_stats(e, &st);
        assert_int_equal(st.requests_rerouted, i == 1 ? 0 : 1); /* waited, or not at all */
        csd_engine_destroy(e);
    }
    assert_int_equal(o[0].code, CSD_ECLOSED);
}

/* Requests a replica refused together go back to the queue in the order they were submitted:
 * the other replica starts them in that order. Two long requests hold the serving replica's two
 * slots while the refusing one refuses r[0] and r[1] in one step, then r[2] and r[3]; once the
 * long ones are cancelled, the serving replica admits the four in turn. */
static void test_rerouted_requests_keep_order(void **state) {
    (void)state;
    static fake_pipe f[2]; /* static: a failed test leaves its engine running */
    csd_engine *e = refusing_pair(f, 2, 8, true); /* the long requests run until cancelled */
    int32_t prompt[3] = {1, 2, 3};
    static outcome busy[2], r[4];
    uint64_t busy_id[2];
    for (int i = 0; i < 2; i++) busy_id[i] = submit(e, prompt, 3, 1 << 19, &busy[i]);
    csd_engine_stats st;
    do { /* both long ones generate on the serving replica */
        sleep_ms(1);
        csd_engine_get_stats(e, &st);
    } while (st.ttft_count < 2);
    int64_t base = st.requests_rerouted;
    for (int i = 0; i < 4; i++) submit(e, prompt, 3, 2, &r[i]);
    wait_rerouted(e, base + 4); /* all four refused (two at a time, after its pauses) */
    for (int i = 0; i < 2; i++) csd_engine_cancel(e, busy_id[i]);
    for (int i = 0; i < 4; i++) {
        assert_true(wait_done_ms(&r[i], 10000));
        assert_int_equal(r[i].end, CSD_REQ_END_LENGTH);
        if (i > 0) assert_true(r[i].first > r[i - 1].first);
    }
    csd_engine_destroy(e);
}

/* A prefix cached before a reconnect is not used after it (the stage that held it may have been
 * restarted), and the entry is closed; before the reconnect the same prompt does use it. */
static void test_reconnect_forgets_prefix_cache(void **state) {
    (void)state;
    static fake_pipe f; /* static: a failed test leaves its engine running */
    fake_init(&f);
    csd_engine *e = engine_over(&f, 1, -1, 4);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 1 + i;
    outcome first, again, after;
    submit(e, prompt, 20, 2, &first);
    assert_true(wait_done_ms(&first, 3000));
    submit(e, prompt, 20, 2, &again);
    assert_true(wait_done_ms(&again, 3000));
    assert_int_equal(again.cached_tokens, 19); /* the cache works on one connection */
    assert_int_equal(atomic_load(&f.copies), 1);
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.prefix_entries, 1);
    int closes = atomic_load(&f.closes);

    atomic_fetch_add(&f.epoch, 1); /* the link broke and came back between two requests */
    submit(e, prompt, 20, 2, &after);
    assert_true(wait_done_ms(&after, 3000));
    assert_int_equal(after.end, CSD_REQ_END_LENGTH);
    assert_int_equal(after.cached_tokens, 0);
    assert_int_equal(atomic_load(&f.copies), 1);         /* no copy from the old entry */
    assert_true(atomic_load(&f.closes) >= closes + 1);   /* the old entry was closed */
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.prefix_entries, 1);              /* the new prompt, cached afresh */
    csd_engine_destroy(e);
}

/* /metrics reads the engine's figures from another thread while requests fill and evict the
 * prefix cache. The figures stay in range; under ThreadSanitizer an unguarded count is a race. */
typedef struct poller {
    csd_engine *e;
    atomic_bool stop;
    atomic_int bad;
} poller;

static void *poll_stats(void *arg) {
    poller *p = arg;
    while (!atomic_load(&p->stop)) {
        csd_engine_stats st;
        csd_engine_get_stats(p->e, &st);
        if (st.prefix_entries < 0 || st.prefix_entries > 2) atomic_fetch_add(&p->bad, 1);
    }
    return NULL;
}

static void test_stats_read_while_cache_changes(void **state) {
    (void)state;
    static fake_pipe f; /* static: a failed test leaves its engine running */
    fake_init(&f);
    csd_engine *e = engine_over(&f, 2, -1, 2);
    poller p = {.e = e};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, poll_stats, &p), 0);
    enum { N = 2000 };
    static outcome out[N];
    for (int r = 0; r < N; r++) { /* back to back: entries are kept, reused and evicted */
        int32_t prompt[12];
        for (int i = 0; i < 12; i++) prompt[i] = 1 + (i + (i == 11 ? r % 7 : 0)) % 30;
        submit(e, prompt, 12, 2, &out[r]);
        if (r >= 32) assert_true(wait_done_ms(&out[r - 32], 3000)); /* within the queue's room */
    }
    for (int r = N - 32; r < N; r++) assert_true(wait_done_ms(&out[r], 3000));
    atomic_store(&p.stop, true);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&p.bad), 0);
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.prefix_entries, 2); /* full, the oldest evicted */
    csd_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queued_request_starts_after_reconnect),
        cmocka_unit_test(test_cancel_frees_queue_place),
        cmocka_unit_test(test_down_replica_slots_not_counted),
        cmocka_unit_test(test_refusing_replica_passes_requests_on),
        cmocka_unit_test(test_request_every_replica_refuses_fails),
        cmocka_unit_test(test_refused_request_not_stranded),
        cmocka_unit_test(test_replica_lost_mid_answer_resumes),
        cmocka_unit_test(test_lost_alone_waits_for_the_replica),
        cmocka_unit_test(test_lost_wait_ends),
        cmocka_unit_test(test_rerouted_requests_keep_order),
        cmocka_unit_test(test_reconnect_forgets_prefix_cache),
        cmocka_unit_test(test_stats_read_while_cache_changes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
