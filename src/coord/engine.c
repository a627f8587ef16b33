/* engine: admission, continuous batching and micro-batch interleaving (see engine.h).
 *
 * One scheduler thread per pipeline. Each pulls requests from the shared FIFO queue whenever it has
 * a free slot, so a request goes to whichever pipeline has capacity and no pipeline is ever sent
 * more than --parallel requests (the phase-0 lesson: a flooded backend slows 17x). A step carries
 * the next token of every decoding request plus a bounded chunk of prompt tokens, so running
 * streams keep producing while a long prompt is prefilled. With a fleet, up to max_in_flight steps
 * (one per machine by default, at most one per stage) are in flight over disjoint groups of
 * requests, so every machine has work. */
#include "engine.h"

#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "ngram_draft.h"

_Static_assert(CSD_SPEC_MAX_DRAFT + 1 <= CSD_STEP_MAX_ALL_ROWS,
               "a checked draft and its last token fit one entry's logit rows");

/* Draft tokens one step checks at most, over all its requests: drafts pay off while a step costs
 * about the same for a few more tokens (its weights are read once); a large batch has no such
 * slack, and the logits rows are held for every step in flight. */
#define SPEC_STEP_ROWS 64
/* How long a stopping engine waits for a step in flight before its pipeline ends it. */
#define ENGINE_STOP_WAIT_MS 2000

enum req_state { REQ_QUEUED, REQ_PREFILL, REQ_DECODE };

typedef struct req {
    struct req *next;         /* queue or active list */
    uint64_t id;
    uint32_t pid;             /* its pipeline id: id's low bits, a new one if it starts over */
    int32_t *prompt;          /* owned copy; with speculation, the answer follows it (hist_cap) */
    int64_t n_prompt;
    int64_t hist_cap;         /* room in prompt for the prompt and the answer; 0: prompt only */
    int32_t spec_ids[CSD_SPEC_MAX_DRAFT + 1]; /* a decode step's tokens: the last one, a draft */
    int draft_k;              /* its next draft's length from a draft model (csd_draft_next_k) */
    int64_t n_prefilled;
    int64_t n_gen;
    int64_t n_refeed;         /* answer tokens computed again after the prompt (resume) */
    int losses;               /* replicas lost while they served it (each may lose it once) */
    uint64_t wait_until;      /* lost: it fails if no replica can take it by then */
    int lost_on;              /* 1 + the replica it was last lost on; 0: none */
    uint64_t lost_epoch;      /* that replica's connection then: it takes r back once new */
    int32_t last_token;
    csd_req_params params;
    csd_req_callbacks cb;
    void *ctx;
    csd_sampler *sampler;
    int state;
    bool opened;              /* pipeline state exists */
    int in_flight;            /* steps not yet ended that carry part of this request */
    int64_t n_sent;           /* prompt tokens sent in steps (>= n_prefilled) */
    int fail_code;            /* a step failed it: finish once no step carries it any more */
    char fail_msg[CSD_ERR_MSG_MAX];
    int64_t cached_tokens;    /* prompt positions copied from the prefix cache or the group */
    uint32_t copied_from;     /* the cache entry's pipeline id it copied from; 0: none */
    bool no_copy;             /* a stage refused its copied prompt: it computes the whole prompt */
    bool step_failed;         /* a whole step carrying it failed (not this request alone) */
    uint64_t failed_on;       /* bit i: replica i refused it or failed it before its first token */
    csd_json_accept json;     /* the object so far, when params.json_vocab is set */
    csd_json_schema *schema;  /* its own copy of params.json_schema (which points to it), or NULL */
    uint64_t group;           /* requests submitted together share it (their first one's id) and
                               * their prompt; 0: alone */
    atomic_bool cancel;
    uint64_t t_submit, t_admit, t_first, t_last;
} req;

typedef struct inflight_step {
    int n;                                  /* entries */
    csd_step_entry entries[CSD_STEP_MAX_ENTRIES];
    req *reqs[CSD_STEP_MAX_ENTRIES];
    float *logits;                          /* (n_entries with logits, vocab) */
    csd_err entry_err[CSD_STEP_MAX_ENTRIES]; /* entries the pipeline failed alone, and why */
    uint64_t t_begin;
} inflight_step;

/* A finished request whose prompt's KV is kept in every stage, for requests that start the same. */
typedef struct cache_entry {
    struct cache_entry *next;
    uint32_t id;              /* its pipeline request id (still open) */
    int32_t *tokens;          /* its prompt (owned) */
    int64_t n;
    uint64_t last_used;
} cache_entry;

typedef struct worker {
    struct csd_engine *e;
    csd_draft_job draft_jobs[CSD_STEP_MAX_ENTRIES]; /* a step's drafts from the draft model */
    int draft_entry[CSD_STEP_MAX_ENTRIES];          /* the step entry of each */
    csd_pipeline *pipe;
    pthread_t thread;
    req *active;                            /* admitted requests */
    int n_active;
    inflight_step *steps;                   /* ring of max_in_flight */
    int head, count;
    float *scratch_logits;                  /* (vocab) raw copy for logprobs */
    cache_entry *cache;                     /* prefix cache, this pipeline's */
    int n_cache;                            /* this thread's; /metrics reads stats.prefix_entries */
    uint64_t epoch;                         /* the pipeline's connection the cache was filled on */
    int index;                              /* in e->workers */
    uint64_t backoff_ns;                    /* its admission pause after a refusal; 0: none */
    uint64_t backoff_until;                 /* it admits nothing before (csd_now_ns; lock held) */
} worker;

struct csd_engine {
    csd_engine_opts opts;
    csd_model_config cfg;
    int64_t max_ctx;
    int32_t *eog;
    int n_eog;
    worker *workers;
    int n_alloc;     /* entries of workers whose buffers may need freeing */
    int n_workers;   /* threads started */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req *queue_head, *queue_tail;
    int queue_len;
    bool stopping;
    bool draining;   /* serve stops taking requests: those waiting for a lost replica end */
    uint64_t expiry_check_at; /* take_expired's next walk of the queue (csd_now_ns) */
    uint64_t next_id;
    csd_engine_stats stats;
};

void csd_engine_opts_default(csd_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->parallel = 4;
    o->queue_max = 64;
    o->prefill_chunk = 256;
    o->prefix_min = 16;
    o->resume_wait_ms = 30000;
}

/* ---- prefix cache ---- */

static void drop_entry(worker *w, cache_entry *c) {
    for (cache_entry **p = &w->cache; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    w->n_cache--;
    pthread_mutex_lock(&w->e->mu);
    w->e->stats.prefix_entries--;
    pthread_mutex_unlock(&w->e->mu);
    w->pipe->ops->close(w->pipe, c->id);
    csd_free(c->tokens);
    csd_free(c);
}

/* Keeps a finished request's prompt KV (truncated to the prompt) instead of closing it. Takes the
 * prompt array from r. Returns false when the request should simply be closed. */
static bool retain_prompt(worker *w, struct req *r);

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t n = 0, lim = na < nb ? na : nb;
    while (n < lim && a[n] == b[n]) n++;
    return n;
}

static void req_free(req *r) {
    if (!r) return;
    csd_sampler_destroy(r->sampler);
    csd_free(r->prompt);
    csd_json_schema_destroy(r->schema);
    csd_free(r);
}

/* The next request id (lock held); never 0 in its low 32 bits, the wire's "no request". */
static uint64_t next_id(csd_engine *e) {
    uint64_t id = e->next_id++;
    if ((uint32_t)id == 0) id = e->next_id++;
    return id;
}

/* ---- finishing ---- */

/* Tells r's owner how it ended (with the tokens it streamed, a resumed one's included), counts
 * them, and frees r. Nothing of it is in a pipeline any more: finish closed it, or it waited in
 * the queue (cancelled, the engine stopping, no replica back in time). */
static void end_request(csd_engine *e, req *r, int end, int code, const char *msg) {
    csd_req_result res = {0};
    res.end = end;
    res.prompt_tokens = r->n_prompt;
    res.completion_tokens = r->n_gen;
    uint64_t now = csd_now_ns();
    res.queue_s = (double)((r->t_admit ? r->t_admit : now) - r->t_submit) * 1e-9;
    res.ttft_s = r->t_first ? (double)(r->t_first - r->t_submit) * 1e-9 : 0;
    res.total_s = (double)(now - r->t_submit) * 1e-9;
    res.cached_tokens = r->cached_tokens;
    res.code = code;
    if (msg) snprintf(res.message, sizeof res.message, "%s", msg);
    pthread_mutex_lock(&e->mu);
    e->stats.completion_tokens_total += r->n_gen;
    pthread_mutex_unlock(&e->mu);
    r->cb.on_done(r->ctx, &res);
    csd_draft_model_release(e->opts.draft_model, r->id);
    req_free(r);
}

static void finish(worker *w, req *r, int end, int code, const char *msg) {
    bool kept =
        r->opened && (end == CSD_REQ_END_STOP || end == CSD_REQ_END_LENGTH) && retain_prompt(w, r);
    if (r->opened && !kept) w->pipe->ops->close(w->pipe, r->pid);
    end_request(w->e, r, end, code, msg);
}

static bool retain_prompt(worker *w, req *r) {
    csd_engine *e = w->e;
    if (e->opts.prefix_cache <= 0 || r->n_prompt < e->opts.prefix_min || !w->pipe->ops->copy_prefix)
        return false;
    for (cache_entry *c = w->cache; c; c = c->next) /* the same prompt is cached already */
        if (c->n == r->n_prompt && common_prefix(c->tokens, c->n, r->prompt, r->n_prompt) == c->n) {
            c->last_used = csd_now_ns();
            return false;
        }
    csd_err err = {0};
    if (w->pipe->ops->truncate(w->pipe, r->pid, r->n_prompt, &err)) return false;
    cache_entry *c = csd_alloc(sizeof *c);
    if (!c) return false;
    /* evict the least recently used first, so that /metrics never sees more than the cap */
    while (w->cache && w->n_cache >= e->opts.prefix_cache) {
        cache_entry *lru = w->cache;
        for (cache_entry *x = w->cache; x; x = x->next)
            if (x->last_used < lru->last_used) lru = x;
        drop_entry(w, lru);
    }
    c->id = r->pid;
    c->tokens = r->prompt; /* ownership moves to the cache */
    c->n = r->n_prompt;
    c->last_used = csd_now_ns();
    r->prompt = NULL;
    c->next = w->cache;
    w->cache = c;
    w->n_cache++;
    pthread_mutex_lock(&e->mu);
    e->stats.prefix_entries++;
    pthread_mutex_unlock(&e->mu);
    return true;
}

static uint64_t pipe_epoch(csd_pipeline *p) { return p->ops->epoch ? p->ops->epoch(p) : 0; }

/* A pipeline that reconnected may have lost what its stages held (a worker restarted and lost
 * its KV caches): the cached prefixes name state that may be gone, so they are dropped, and
 * closed on the stages that still hold them. */
static void drop_cache_after_reconnect(worker *w) {
    uint64_t now = pipe_epoch(w->pipe);
    if (now == w->epoch) return;
    if (w->cache) CSD_LOGI("prefix cache: pipeline reconnected, %d entries dropped", w->n_cache);
    while (w->cache) drop_entry(w, w->cache);
    w->epoch = now;
}

/* r's first n prompt positions were copied into its KV: it computes only the rest. (The metrics
 * count the copy with r's first token, once every stage has taken it.) */
static void start_after_copy(req *r, int64_t n) {
    r->n_prefilled = n;
    r->n_sent = n;
    r->cached_tokens = n;
}

/* Starts a new request from the longest cached prefix it shares (at least prefix_min tokens,
 * and never the whole prompt: the last token must run to give the first logits). */
static void reuse_prefix(worker *w, req *r) {
    csd_engine *e = w->e;
    cache_entry *best = NULL;
    int64_t best_n = 0;
    for (cache_entry *c = w->cache; c; c = c->next) {
        int64_t n = common_prefix(c->tokens, c->n, r->prompt, r->n_prompt);
        if (n > best_n) {
            best = c;
            best_n = n;
        }
    }
    if (best_n > r->n_prompt - 1) best_n = r->n_prompt - 1;
    if (!best || best_n < e->opts.prefix_min) return;
    csd_err err = {0};
    if (w->pipe->ops->copy_prefix(w->pipe, best->id, r->pid, best_n, &err)) {
        CSD_LOGW("prefix cache: copy failed, computing the prompt instead: %s", err.msg);
        drop_entry(w, best);
        return;
    }
    best->last_used = csd_now_ns();
    r->copied_from = best->id;
    start_after_copy(r, best_n);
}

/* The member of r's group (submitted together, the same prompt) that r copies its prompt KV
 * from: the first one this worker opened that is still healthy. NULL when there is none here
 * (r is the first, the others run on another pipeline or have ended) or the prompt is too short
 * to be worth it. */
static req *group_leader(worker *w, const req *r) {
    if (!r->group || r->n_prompt - 1 < w->e->opts.prefix_min || !w->pipe->ops->copy_prefix)
        return NULL;
    for (req *l = w->active; l; l = l->next)
        if (l != r && l->group == r->group && l->opened && !l->fail_code &&
            !atomic_load(&l->cancel))
            return l;
    return NULL;
}

/* Starts r from a group member's prompt KV (lead, from group_leader): every position but the last,
 * which r computes itself for its first logits. lead must hold those positions. Returns false
 * when the copy failed (r then computes its prompt). */
static bool copy_from_leader(worker *w, req *r, const req *lead) {
    int64_t n = r->n_prompt - 1;
    csd_err err = {0};
    if (w->pipe->ops->copy_prefix(w->pipe, lead->pid, r->pid, n, &err)) {
        CSD_LOGW("group: prompt copy failed, computing it instead: %s", err.msg);
        return false;
    }
    start_after_copy(r, n);
    return true;
}

/* Only the worker's own thread changes its active list, and always under the engine lock, so
 * csd_engine_cancel (another thread, lock held) can walk it safely. */
static void unlink_active(worker *w, req *r) { /* lock held */
    for (req **p = &w->active; *p; p = &(*p)->next) {
        if (*p == r) {
            *p = r->next;
            w->n_active--;
            w->e->stats.active--;
            break;
        }
    }
}

static void remove_active(worker *w, req *r) {
    pthread_mutex_lock(&w->e->mu);
    unlink_active(w, r);
    pthread_mutex_unlock(&w->e->mu);
}

/* ---- admission ---- */

static bool is_eog(const csd_engine *e, int32_t id) {
    for (int i = 0; i < e->n_eog; i++)
        if (e->eog[i] == id) return true;
    return false;
}

static bool pipe_ready(csd_pipeline *p);

/* Whether w's replica takes requests now (lock held): it is up and not pausing after a refusal. */
static bool worker_ready(const worker *w) {
    return pipe_ready(w->pipe) && csd_now_ns() >= w->backoff_until;
}

static uint64_t replica_bit(const worker *w) { return 1ull << w->index; }

/* Whether a replica other than w's that is up has not failed r yet (lock held). */
static bool other_replica_for(const worker *w, const req *r) {
    const csd_engine *e = w->e;
    for (int i = 0; i < e->n_workers; i++) {
        const worker *o = &e->workers[i];
        if (o != w && !(r->failed_on & replica_bit(o)) && pipe_ready(o->pipe)) return true;
    }
    return false;
}

/* Whether w's replica lost r and has not reconnected since: its pipeline may still look up for a
 * moment after a failed send, and r would fail there again at once. */
static bool gated(const worker *w, const req *r) {
    return r->lost_on == w->index + 1 && w->pipe->ops->epoch &&
           pipe_epoch(w->pipe) == r->lost_epoch;
}

/* Whether a replica that is up may take r (lock held). */
static bool taker_for(const csd_engine *e, const req *r) {
    for (int i = 0; i < e->n_workers; i++)
        if (pipe_ready(e->workers[i].pipe) && !gated(&e->workers[i], r)) return true;
    return false;
}

/* The first queued request w may take (lock held): not one w's replica has already failed while
 * another replica that is up has not (with none, w tries it again: it fails there, or serves),
 * nor one w's replica lost before its reconnection. */
static req *take_queued(worker *w) {
    csd_engine *e = w->e;
    req *prev = NULL;
    for (req *r = e->queue_head; r; prev = r, r = r->next) {
        if ((r->failed_on & replica_bit(w)) && other_replica_for(w, r)) continue;
        if (gated(w, r)) continue;
        if (prev) prev->next = r->next;
        else e->queue_head = r->next;
        if (e->queue_tail == r) e->queue_tail = prev;
        e->queue_len--;
        r->next = NULL;
        return r;
    }
    return NULL;
}

/* Moves queued requests into free slots (FIFO). Called with the lock held. A pipeline that is
 * down (a worker died, reconnecting) or pausing after a refusal takes nothing: its requests go
 * to the replicas that serve. */
static void admit(worker *w) {
    csd_engine *e = w->e;
    if (!worker_ready(w)) return;
    req *r;
    while (w->n_active < e->opts.parallel && (r = take_queued(w))) {
        r->state = REQ_PREFILL;
        if (!r->t_admit) r->t_admit = csd_now_ns(); /* (a rerouted one keeps its first) */
        r->wait_until = 0;
        req **tail = &w->active; /* append: keeps admission order for prefill fairness */
        while (*tail) tail = &(*tail)->next;
        *tail = r;
        w->n_active++;
        e->stats.active++;
    }
    e->stats.queue_depth = e->queue_len;
}

/* A replica that failed a request alone pauses its admission: BACKOFF_FIRST_NS, doubling with
 * each such failure in a row up to BACKOFF_MAX_NS; a first token it serves ends the run. One that
 * refuses everything (a worker whose --kv-mem holds no whole request, say) then takes a request
 * a few times a minute instead of draining the queue into errors. */
#define BACKOFF_FIRST_NS 250000000ull
#define BACKOFF_MAX_NS 8000000000ull

static void pause_replica(worker *w) { /* lock held */
    uint64_t now = csd_now_ns();
    if (now < w->backoff_until) return; /* requests admitted before the pause: no doubling */
    w->backoff_ns = w->backoff_ns ? w->backoff_ns * 2 : BACKOFF_FIRST_NS;
    if (w->backoff_ns > BACKOFF_MAX_NS) w->backoff_ns = BACKOFF_MAX_NS;
    w->backoff_until = now + w->backoff_ns;
}

/* Puts r back in the queue at its place by submission (ids grow with it), ahead of the requests
 * submitted after it: a burst of rerouted requests keeps its order (lock held). */
static void requeue_in_order(csd_engine *e, req *r) {
    req **p = &e->queue_head;
    while (*p && (*p)->id < r->id) p = &(*p)->next;
    r->next = *p;
    *p = r;
    if (!r->next) e->queue_tail = r;
    e->queue_len++;
    e->stats.queue_depth = e->queue_len;
}

/* Whether r, failed on a replica after tokens reached its client, can go on elsewhere: only when
 * the replica failed (a worker gone), not when r was refused alone (that may be r's own doing),
 * and with its whole answer so far kept to compute again. */
static bool resumable(const req *r) {
    return r->step_failed && r->n_prompt + r->n_gen <= r->hist_cap;
}

/* Whether r, lost with w's replica (lock held) and no other up, waits in the queue for one to
 * come back (a worker restarted, reconnected): for opts.resume_wait_ms, each replica losing it
 * once at most, where a replica can come back (a fleet: it reconnects). */
static bool wait_for_replica(const worker *w, const req *r) {
    const csd_engine *e = w->e;
    return r->step_failed && e->opts.resume_wait_ms > 0 && r->losses < e->n_workers &&
           !e->stopping && !e->draining && (w->pipe->ops->epoch || e->n_workers > 1);
}

/* r failed on w's replica (why: msg). Before its first token nothing of it has reached its client,
 * so it starts over whole on another replica, at its place in the queue, unless every other
 * replica that is up has failed it too. After tokens went out it resumes there when resumable:
 * the new replica computes its prompt and its answer so far (the last token included), and the
 * logits after them give its next token, so the client's answer goes on where it was. When the
 * replica was lost (not a refusal) and none other is up, r waits for one to come back, w's own
 * included (wait_for_replica). A replica that refused r alone (not one whose whole step failed:
 * it is down) pauses. Returns false when r must fail instead; true when r left w. */
static bool reroute(worker *w, req *r, const char *msg) {
    csd_engine *e = w->e;
    bool resume = r->n_gen > 0;
    if ((resume && !resumable(r)) || atomic_load(&r->cancel)) return false;
    if (e->n_workers < 2 && !r->step_failed) return false; /* a refusal, nowhere else to go */
    r->failed_on |= replica_bit(w);
    pthread_mutex_lock(&e->mu);
    if (!r->step_failed) pause_replica(w);
    bool elsewhere = !e->stopping && e->n_workers > 1 && other_replica_for(w, r);
    bool wait = !elsewhere && wait_for_replica(w, r);
    pthread_mutex_unlock(&e->mu);
    if (!elsewhere && !wait) return false;
    if (r->step_failed) { /* a loss: w takes r back only once reconnected, and not for ever */
        r->losses += r->opened; /* (lost while it ran there, not at its open) */
        r->lost_on = w->index + 1;
        r->lost_epoch = pipe_epoch(w->pipe);
        r->wait_until = csd_now_ns() + (uint64_t)e->opts.resume_wait_ms * 1000000u;
    }
    if (wait)
        CSD_LOGW("request %llu: replica %d lost after %lld tokens (%s); waiting up to %d ms for a "
                 "replica to come back",
                 (unsigned long long)r->id, w->index, (long long)r->n_gen, msg,
                 e->opts.resume_wait_ms);
    else if (resume)
        CSD_LOGW("request %llu: replica %d failed after %lld tokens (%s); resuming on another",
                 (unsigned long long)r->id, w->index, (long long)r->n_gen, msg);
    else
        CSD_LOGW("request %llu: replica %d failed it before its first token (%s); trying another",
                 (unsigned long long)r->id, w->index, msg);
    if (r->opened) w->pipe->ops->close(w->pipe, r->pid);
    r->opened = r->step_failed = false;
    r->no_copy = resume; /* (its prompt and answer are computed whole: no prefix copies) */
    r->n_refeed = r->n_gen;
    r->n_prefilled = r->n_sent = 0;
    if (!resume) r->cached_tokens = 0; /* (a resumed one reports its first run's) */
    r->copied_from = 0;
    r->fail_code = 0;
    r->fail_msg[0] = '\0';
    r->state = REQ_QUEUED;
    pthread_mutex_lock(&e->mu);
    unlink_active(w, r);
    /* csd_engine_destroy may have emptied the queue already; a cancel since the check above
     * found r active, not queued: it ends here rather than wait in the queue */
    bool stopping = e->stopping, cancelled = atomic_load(&r->cancel);
    if (!stopping && !cancelled) {
        r->pid = (uint32_t)next_id(e);
        requeue_in_order(e, r);
        e->stats.requests_rerouted++;
        e->stats.requests_resumed += resume;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (stopping || cancelled)
        finish(w, r, CSD_REQ_END_CANCELLED, 0, stopping ? "server shutting down" : "cancelled");
    return true;
}

/* Opens pipeline state for newly admitted requests and ends cancelled ones. */
static void prepare_requests(worker *w) {
    for (req *r = w->active, *next; r; r = next) {
        next = r->next;
        if (r->in_flight > 0) continue;
        if (atomic_load(&r->cancel)) {
            remove_active(w, r);
            finish(w, r, CSD_REQ_END_CANCELLED, 0, "cancelled");
            continue;
        }
        if (!r->opened) {
            /* a group member waits for another's prompt instead of computing it again */
            req *lead = r->no_copy ? NULL : group_leader(w, r);
            if (lead && lead->n_prefilled < r->n_prompt - 1) continue;
            csd_err err = {0};
            int rc = w->pipe->ops->open(w->pipe, r->pid, w->e->max_ctx, &err);
            r->step_failed = rc == CSD_ECLOSED; /* the fleet's link is down: a loss */
            if (rc && !reroute(w, r, err.msg)) {
                remove_active(w, r);
                finish(w, r, CSD_REQ_END_ERROR, rc, err.msg);
            }
            if (rc) continue;
            r->opened = true;
            if (r->no_copy) continue;
            if (!lead || !copy_from_leader(w, r, lead)) reuse_prefix(w, r);
        }
    }
}

/* ---- steps ---- */

/* Tokens r's prefill computes: its prompt, and after a resume its answer so far. */
static int64_t prefill_len(const req *r) { return r->n_prompt + r->n_refeed; }

/* A request can join a new step when no step carries it, or while its prompt still has tokens no
 * step carries yet: chunks of one long prompt then travel the pipeline back to back, so stage k+1
 * computes chunk i while stage k computes chunk i+1. A cancelled one joins none: its steps in
 * flight drain and prepare_requests ends it (else a prompt that always has a chunk in flight
 * would be computed to its end for a client that has gone). */
static bool can_step(const req *r) {
    if (!r->opened || r->fail_code || atomic_load(&r->cancel)) return false;
    if (r->state == REQ_PREFILL) return r->n_sent < prefill_len(r);
    return r->in_flight == 0;
}

static int idle_count(const worker *w) {
    int n = 0;
    for (const req *r = w->active; r; r = r->next) n += can_step(r);
    return n;
}

/* r started from copied prompt KV and a stage refused it alone before its first token. The likely
 * cause is the copy's source gone from that stage (a worker evicts the least recently used
 * request to make room, and a cached prompt is the likeliest), so r starts over and computes its
 * whole prompt, once: a second refusal is r's own and fails it. The cache entry it copied from is
 * dropped, as it may no longer hold what it names. Returns false when r must fail instead. */
static bool recompute_prompt(worker *w, req *r) {
    if (r->cached_tokens == 0 || r->n_gen > 0 || r->no_copy || r->step_failed ||
        atomic_load(&r->cancel))
        return false;
    CSD_LOGW("request %llu: refused after copying %lld prompt tokens (%s); computing them instead",
             (unsigned long long)r->id, (long long)r->cached_tokens, r->fail_msg);
    for (cache_entry *c = w->cache; c && r->copied_from; c = c->next)
        if (c->id == r->copied_from) {
            drop_entry(w, c);
            break;
        }
    w->pipe->ops->close(w->pipe, r->pid);
    /* a new pipeline id: answers a stage still sends for the old one (a refused copy and then each
     * FORWARD that followed it) cannot be taken for the new steps' */
    pthread_mutex_lock(&w->e->mu);
    r->pid = (uint32_t)next_id(w->e);
    w->e->stats.prefix_refused++;
    pthread_mutex_unlock(&w->e->mu);
    r->opened = false;
    r->no_copy = true;
    r->n_prefilled = r->n_sent = r->cached_tokens = 0;
    r->fail_code = 0;
    r->fail_msg[0] = '\0';
    return true;
}

/* A step that carried r has ended with rc (alone: r's own refusal, not the whole step's failure):
 * r leaves it; a failed r ends when no step has it, unless it can start over (recompute_prompt). */
static void step_release(worker *w, req *r, int rc, bool alone, const char *msg) {
    r->in_flight--;
    if (rc && !alone) r->step_failed = true;
    if (rc && !r->fail_code) {
        r->fail_code = rc;
        snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg ? msg : "step failed");
    }
    if (r->fail_code && r->in_flight == 0 && !recompute_prompt(w, r) &&
        !reroute(w, r, r->fail_msg)) {
        remove_active(w, r);
        finish(w, r, CSD_REQ_END_ERROR, r->fail_code, r->fail_msg);
    }
}

/* Draft tokens one step may check (SPEC_STEP_ROWS). */
static int64_t spec_rows(const csd_engine *e) {
    int64_t n = (int64_t)e->opts.parallel * e->opts.spec_draft;
    return n < SPEC_STEP_ROWS ? n : SPEC_STEP_ROWS;
}

/* Draft tokens a decoding request r may propose after its last token (speculative decoding): at
 * most `room`, none past its max_tokens or its context (0: none, or speculation is off). */
static int draft_room(const csd_engine *e, const req *r, int64_t room) {
    int64_t k = csd_spec_draft_limit(e->opts.spec_draft, r->params.max_tokens, e->max_ctx,
                                     r->n_prompt, r->n_gen);
    if (room < k) k = room;
    return k <= 0 || r->hist_cap == 0 ? 0 : (int)k;
}

/* The draft a decoding request r proposes into r->spec_ids[1..], up to k tokens: looked up in its
 * text now, or left to the draft model (model_drafts) with k reserved. Returns the tokens it
 * takes in the step for now. */
static int draft(worker *w, inflight_step *s, req *r, int k, int *n_jobs) {
    if (k <= 0) return 0;
    if (!w->e->opts.draft_model)
        return csd_ngram_draft(r->prompt, r->n_prompt + r->n_gen, r->spec_ids + 1, k);
    if (k > r->draft_k) k = r->draft_k;
    w->draft_jobs[*n_jobs] = (csd_draft_job){.key = r->id, .text = r->prompt,
                                             .n_text = r->n_prompt + r->n_gen,
                                             .out = r->spec_ids + 1, .k = k};
    w->draft_entry[(*n_jobs)++] = s->n;
    return k;
}

/* The draft model's drafts for the n_jobs decoding entries of s that reserved room for one: an
 * entry carries its last token and what the draft model proposed (maybe fewer, or none). */
static void model_drafts(worker *w, inflight_step *s, int n_jobs) {
    csd_err err = {0};
    if (n_jobs > 0 && csd_draft_model_propose(w->e->opts.draft_model, w->draft_jobs, n_jobs, &err))
        CSD_LOGW("draft model: %s (this step goes without drafts)", err.msg);
    for (int i = 0; i < n_jobs; i++) {
        csd_step_entry *en = &s->entries[w->draft_entry[i]];
        en->n = 1 + w->draft_jobs[i].k;
        en->all_logits = en->n > 1;
    }
}

/* Builds a step from idle requests: every decoding one contributes its last token (and a draft
 * to check, with speculation), prefilling ones a chunk within the prefill budget. Takes at most
 * `limit` requests. */
static void build_step(worker *w, inflight_step *s, int limit) {
    int64_t budget = w->e->opts.prefill_chunk, tokens = 0, drafts = spec_rows(w->e);
    int64_t max_tokens = w->pipe->max_step_tokens;
    int n_jobs = 0;
    s->n = 0;
    for (req *r = w->active; r && s->n < limit && s->n < CSD_STEP_MAX_ENTRIES; r = r->next) {
        if (!can_step(r)) continue;
        csd_step_entry *en = &s->entries[s->n];
        *en = (csd_step_entry){.req = r->pid}; /* nothing left of the step this slot carried */
        en->argmax_only = csd_sampler_is_plain_argmax(&r->params.sampling) &&
                          !r->params.logprobs && !r->params.json_vocab;
        if (r->state == REQ_DECODE) {
            if (tokens + 1 > max_tokens) break;
            int64_t room = max_tokens - tokens - 1;
            int k = draft(w, s, r, draft_room(w->e, r, room < drafts ? room : drafts), &n_jobs);
            drafts -= k;
            r->spec_ids[0] = r->last_token;
            en->ids = r->spec_ids;
            en->n = 1 + k;
            en->want_logits = true;
            en->all_logits = k > 0;
        } else {
            int64_t left = prefill_len(r) - r->n_sent;
            int64_t take = left < budget ? left : budget;
            if (take + tokens > max_tokens) take = max_tokens - tokens;
            if (take <= 0) continue;
            en->ids = r->prompt + r->n_sent;
            en->n = take;
            en->want_logits = take == left;
            r->n_sent += take;
            budget -= take;
        }
        tokens += en->n;
        s->reqs[s->n++] = r;
        r->in_flight++;
    }
    model_drafts(w, s, n_jobs);
}

/* The next token of r from its logits (modified in place). A JSON answer (response_format) allows
 * only the tokens that continue its object, ruled out after the penalties and before the draw;
 * -1 when none can. */
static int32_t next_token(req *r, float *logits, int32_t vocab) {
    const csd_vocab_bytes *v = r->params.json_vocab;
    if (!v) return csd_sampler_sample(r->sampler, logits);
    csd_sampler_adjust(r->sampler, logits);
    /* greedy: the best token, when the rules allow it (the usual case), is the best allowed one,
     * so the vocabulary is masked (about 1 ms per token at 150K tokens, serial) only when not */
    if (r->params.sampling.temperature <= 0.0f) {
        int32_t best = csd_sampler_pick(r->sampler, logits); /* an argmax: logits unchanged */
        if (logits[best] != -INFINITY && csd_json_accept_token(&r->json, v, best)) return best;
    }
    if (csd_json_mask(&r->json, v, logits, vocab) == 0) return -1;
    int32_t id = csd_sampler_pick(r->sampler, logits);
    if (csd_json_accept_token(&r->json, v, id)) return id;
    /* a draw's rounding past the last allowed weight, or NaN logits: the first allowed token */
    for (id = 0; id < vocab; id++)
        if (logits[id] != -INFINITY && csd_json_accept_token(&r->json, v, id)) return id;
    return -1;
}

/* Turns one request's logits into a token event and decides whether it goes on: false when r
 * has ended (and is freed). */
static bool emit_token(worker *w, req *r, float *logits) {
    csd_engine *e = w->e;
    int32_t vocab = (int32_t)e->cfg.vocab_size;
    csd_token_event ev = {0};
    if (r->params.logprobs) memcpy(w->scratch_logits, logits, (size_t)vocab * sizeof(float));
    ev.id = next_token(r, logits, vocab);
    if (ev.id < 0) {
        remove_active(w, r);
        finish(w, r, CSD_REQ_END_ERROR, CSD_EINVAL,
               "response_format: no token of the vocabulary can continue the JSON object");
        return false;
    }
    csd_sampler_accept(r->sampler, ev.id);
    if (r->params.logprobs) {
        ev.logprob = csd_logprob_of(w->scratch_logits, vocab, ev.id);
        /* a vocabulary smaller than the asked count has only so many alternatives */
        ev.n_top = r->params.top_logprobs < vocab ? r->params.top_logprobs : (int)vocab;
        csd_top_logprobs(w->scratch_logits, vocab, ev.n_top, ev.top_ids, ev.top_logprobs);
    }
    uint64_t now = csd_now_ns();
    pthread_mutex_lock(&e->mu);
    if (!r->t_first) {
        w->backoff_ns = 0; /* this replica serves again */
        e->stats.ttft_sum_s += (double)(now - r->t_submit) * 1e-9;
        e->stats.ttft_count++;
        e->stats.prefix_hits += r->cached_tokens > 0;
        e->stats.prefix_tokens += r->cached_tokens;
    } else {
        e->stats.itl_sum_s += (double)(now - r->t_last) * 1e-9;
        e->stats.itl_count++;
    }
    pthread_mutex_unlock(&e->mu);
    if (!r->t_first) r->t_first = now;
    r->t_last = now;
    if (r->n_prompt + r->n_gen < r->hist_cap) r->prompt[r->n_prompt + r->n_gen] = ev.id;
    r->n_gen++;
    r->last_token = ev.id;
    r->state = REQ_DECODE;
    bool stop = r->cb.on_token(r->ctx, &ev);
    int end = 0;
    if (stop || atomic_load(&r->cancel)) end = stop ? CSD_REQ_END_STOP : CSD_REQ_END_CANCELLED;
    else if (r->params.json_vocab && csd_json_accept_done(&r->json)) end = CSD_REQ_END_STOP;
    /* a JSON answer ends with its object, not at an end-of-generation id with bytes (an ordinary
     * piece a generation_config lists, say), which is text there */
    else if (!r->params.json_vocab && !r->params.ignore_eos && is_eog(e, ev.id))
        end = CSD_REQ_END_STOP;
    else if (r->n_gen >= r->params.max_tokens || r->n_prompt + r->n_gen >= e->max_ctx)
        end = CSD_REQ_END_LENGTH;
    if (end) {
        remove_active(w, r);
        finish(w, r, end, 0, NULL);
    }
    return !end;
}

/* Speculative decoding: en carried r's last token and a draft of en->n - 1 tokens, and rows holds
 * the logits after each. The token drawn from row i is r's next token exactly as without a draft
 * (the same sampler, in the same order); while it equals draft token i + 1, that token's KV is
 * already computed and row i + 1 gives the next. The first difference ends the step, and the KV
 * of the draft tokens after it is dropped. */
static void check_draft(worker *w, req *r, const csd_step_entry *en, float *rows) {
    csd_engine *e = w->e;
    int64_t vocab = e->cfg.vocab_size, base = r->n_prompt + r->n_gen - 1; /* ids[0]'s position */
    int64_t used = 0; /* tokens of en whose KV stays: ids[0] and the agreed draft */
    /* Counted before the tokens go out (the last one's on_done may be read at once): every draft
     * token was computed, also those after a disagreement or after the answer ended. */
    pthread_mutex_lock(&e->mu);
    e->stats.spec_draft_tokens += en->n - 1;
    pthread_mutex_unlock(&e->mu);
    bool going = true;
    for (;;) {
        going = emit_token(w, r, rows + used * vocab);
        used++;
        if (!going || used == en->n || r->last_token != en->ids[used]) break;
        pthread_mutex_lock(&e->mu);
        e->stats.spec_accepted_tokens++;
        pthread_mutex_unlock(&e->mu);
    }
    if (!going) return; /* ended: r is freed */
    r->draft_k = csd_draft_next_k(r->draft_k, (int)en->n - 1, (int)used - 1, e->opts.spec_draft);
    if (used == en->n) return; /* the whole draft held */
    csd_err err = {0};
    if (w->pipe->ops->truncate(w->pipe, r->pid, base + used, &err)) {
        remove_active(w, r);
        finish(w, r, CSD_REQ_END_ERROR, err.code ? err.code : CSD_EIO, err.msg);
    }
}

static void complete_step(worker *w, inflight_step *s) {
    csd_err err = {0};
    int rc = w->pipe->ops->step_end(w->pipe, s->entry_err, &err);
    csd_engine *e = w->e;
    pthread_mutex_lock(&e->mu);
    e->stats.step_sum_s += (double)(csd_now_ns() - s->t_begin) * 1e-9;
    e->stats.step_count++;
    pthread_mutex_unlock(&e->mu);
    int64_t vocab = e->cfg.vocab_size, row = 0;
    for (int i = 0; i < s->n; i++) {
        req *r = s->reqs[i];
        const csd_step_entry *en = &s->entries[i];
        int64_t wanted = !en->want_logits ? 0 : en->all_logits ? en->n : 1;
        /* the pipeline failed (a worker died) or refused this request: fail it, keep serving */
        const csd_err *alone = &s->entry_err[i];
        int failed = rc ? rc : alone->code ? alone->code : r->fail_code;
        if (failed) {
            step_release(w, r, failed, !rc, rc ? err.msg : alone->msg);
            row += wanted;
            continue;
        }
        if (r->state == REQ_PREFILL) r->n_prefilled += en->n;
        r->in_flight--;
        if (en->all_logits) check_draft(w, r, en, s->logits + row * vocab);
        else if (wanted) emit_token(w, r, s->logits + row * vocab);
        row += wanted;
    }
}

/* Waits (lock held) for a request or a cancel. Nothing signals when a pipeline comes back up or
 * goes down, or when a pause ends, so while requests wait in the queue that this thread did not
 * take (its pipeline down or pausing, or another one's to try first), it looks again every
 * RECHECK_MS: a fleet that reconnects takes them without waiting for the next submit. */
#define RECHECK_MS 100

static void wait_for_work(worker *w) {
    csd_engine *e = w->e;
    if (!e->queue_head) {
        pthread_cond_wait(&e->cv, &e->mu);
        return;
    }
    struct timespec ts = csd_realtime_in_ms(RECHECK_MS);
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
}

/* The queued requests lost with their replica that no replica can take (none is up, or the one up
 * lost them and has not reconnected) once their wait is over, or at once while serve drains (lock
 * held), taken out of the queue as a list. */
static req *take_expired(csd_engine *e) {
    req *out = NULL;
    uint64_t now = csd_now_ns();
    /* a walk of the whole queue: not at every step of a busy engine, RECHECK_MS apart */
    if (!e->queue_head || (now < e->expiry_check_at && !e->draining)) return NULL;
    e->expiry_check_at = now + RECHECK_MS * 1000000ull;
    for (req **p = &e->queue_head, *prev = NULL; *p;) {
        req *r = *p;
        if (!r->wait_until || (now < r->wait_until && !e->draining) || taker_for(e, r)) {
            prev = r;
            p = &r->next;
            continue;
        }
        *p = r->next;
        if (e->queue_tail == r) e->queue_tail = prev;
        e->queue_len--;
        r->next = out;
        out = r;
    }
    e->stats.queue_depth = e->queue_len;
    return out;
}

static void end_expired(csd_engine *e, req *list) {
    if (!list) return;
    char msg[160];
    snprintf(msg, sizeof msg,
             "the fleet was lost mid-request and no replica came back within %d ms",
             e->opts.resume_wait_ms);
    for (req *r = list, *next; r; r = next) {
        next = r->next;
        end_request(e, r, CSD_REQ_END_ERROR, CSD_ECLOSED, msg);
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    csd_engine *e = w->e;
    int max_flight = w->pipe->max_in_flight > 0 ? w->pipe->max_in_flight : 1;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        admit(w);
        req *expired = take_expired(e);
        while (!expired && !e->stopping && w->n_active == 0 && w->count == 0) {
            wait_for_work(w);
            admit(w);
            expired = take_expired(e);
        }
        bool stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        end_expired(e, expired);
        if (stopping && w->count == 0) break;
        drop_cache_after_reconnect(w);
        prepare_requests(w);
        /* Fill the pipeline: begin steps over disjoint groups of idle requests. */
        while (!stopping && w->count < max_flight) {
            int idle = idle_count(w);
            if (idle == 0) break;
            int groups = max_flight - w->count;
            int limit = (w->n_active + max_flight - 1) / max_flight;
            if (limit < 1 || groups == 1) limit = idle;
            inflight_step *s = &w->steps[(w->head + w->count) % max_flight];
            build_step(w, s, limit);
            if (s->n == 0) break;
            s->t_begin = csd_now_ns();
            csd_err err = {0};
            int rc = w->pipe->ops->step_begin(w->pipe, s->entries, s->n, s->logits, &err);
            if (rc) {
                for (int i = 0; i < s->n; i++) step_release(w, s->reqs[i], rc, false, err.msg);
                continue;
            }
            w->count++;
        }
        if (w->count > 0) {
            inflight_step *s = &w->steps[w->head];
            w->head = (w->head + 1) % max_flight;
            w->count--;
            complete_step(w, s);
        }
    }
    while (w->cache) drop_entry(w, w->cache);
    while (w->active) { /* engine shutting down: everything left is cancelled */
        req *r = w->active;
        remove_active(w, r);
        finish(w, r, CSD_REQ_END_CANCELLED, 0, "server shutting down");
    }
    return NULL;
}

/* ---- public API ---- */

int csd_engine_create(csd_engine **out, csd_pipeline *const *pipes, int n_pipes,
                      const int32_t *eog_ids, int n_eog, const csd_engine_opts *opts,
                      csd_err *err) {
    *out = NULL;
    if (n_pipes <= 0 || n_pipes > CSD_ENGINE_MAX_PIPES)
        return csd_err_set(err, CSD_EINVAL, "%d pipelines to serve (1 to %d)", n_pipes,
                           CSD_ENGINE_MAX_PIPES);
    csd_engine *e = csd_alloc(sizeof *e);
    if (!e) return csd_err_set(err, CSD_ENOMEM, "engine");
    e->opts = *opts;
    if (e->opts.parallel <= 0) e->opts.parallel = 4;
    if (e->opts.parallel > CSD_STEP_MAX_ENTRIES) e->opts.parallel = CSD_STEP_MAX_ENTRIES;
    if (e->opts.queue_max < 0) e->opts.queue_max = 0;
    if (e->opts.prefill_chunk <= 0) e->opts.prefill_chunk = 256;
    if (e->opts.spec_draft < 0) e->opts.spec_draft = 0;
    if (e->opts.spec_draft > CSD_SPEC_MAX_DRAFT) e->opts.spec_draft = CSD_SPEC_MAX_DRAFT;
    e->cfg = pipes[0]->cfg;
    e->max_ctx =
        opts->max_ctx > 0 && opts->max_ctx < pipes[0]->max_ctx ? opts->max_ctx : pipes[0]->max_ctx;
    /* Ids start at a random place, so that two coordinators (or one restarted) that reach the
     * same workers do not number their requests alike: a stage's late answer to one of them
     * then matches no request of the other (docs/protocol.md, "Topology"). */
    e->next_id = sodium_init() >= 0 ? 1 + (uint64_t)randombytes_uniform(1u << 30) : 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->eog = csd_alloc_array((size_t)(n_eog > 0 ? n_eog : 1), sizeof(int32_t));
    e->workers = csd_alloc_array((size_t)n_pipes, sizeof(worker));
    if (!e->eog || !e->workers) {
        csd_engine_destroy(e);
        return csd_err_set(err, CSD_ENOMEM, "engine");
    }
    if (n_eog > 0) memcpy(e->eog, eog_ids, (size_t)n_eog * sizeof(int32_t));
    e->n_eog = n_eog;
    e->stats.slots = e->opts.parallel * n_pipes;
    e->n_alloc = n_pipes;
    for (int i = 0; i < n_pipes; i++) {
        worker *w = &e->workers[i];
        w->e = e;
        w->index = i;
        w->pipe = pipes[i];
        w->epoch = pipe_epoch(pipes[i]);
        int flight = pipes[i]->max_in_flight > 0 ? pipes[i]->max_in_flight : 1;
        w->steps = csd_alloc_array((size_t)flight, sizeof(inflight_step));
        w->scratch_logits = csd_alloc_array((size_t)e->cfg.vocab_size, sizeof(float));
        int ok = w->steps && w->scratch_logits;
        /* a row per request, or its last token's and its draft's with speculation */
        size_t rows = (size_t)e->opts.parallel + (size_t)spec_rows(e);
        for (int s = 0; ok && s < flight; s++) {
            w->steps[s].logits = csd_alloc_array(rows * (size_t)e->cfg.vocab_size, sizeof(float));
            ok = w->steps[s].logits != NULL;
        }
        if (!ok || pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            pthread_mutex_lock(&e->mu);
            e->n_workers = i;
            pthread_mutex_unlock(&e->mu);
            csd_engine_destroy(e);
            return csd_err_set(err, CSD_ENOMEM, "engine worker %d", i);
        }
        pthread_mutex_lock(&e->mu); /* the threads started read it (take_expired) */
        e->n_workers = i + 1;
        pthread_mutex_unlock(&e->mu);
    }
    *out = e;
    return 0;
}

/* Joins a worker of a stopping engine. One whose step still waits on a stage that stopped
 * answering (a worker machine frozen) would wait for the pipeline's silence limit (two minutes):
 * after ENGINE_STOP_WAIT_MS its pipeline ends the step instead. */
static void join_worker(worker *w) {
    struct timespec ts = csd_realtime_in_ms(ENGINE_STOP_WAIT_MS);
    if (pthread_timedjoin_np(w->thread, NULL, &ts) == 0) return;
    CSD_LOGW("a pipeline step is still in flight at shutdown: ending it");
    if (w->pipe->ops->abort) w->pipe->ops->abort(w->pipe);
    pthread_join(w->thread, NULL);
}

void csd_engine_destroy(csd_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    req *q = e->queue_head;
    e->queue_head = e->queue_tail = NULL;
    e->queue_len = 0;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < e->n_workers; i++) join_worker(&e->workers[i]);
    while (q) { /* waiting: tell their owners */
        req *next = q->next;
        end_request(e, q, CSD_REQ_END_CANCELLED, 0, "server shutting down");
        q = next;
    }
    for (int i = 0; e->workers && i < e->n_alloc; i++) {
        worker *w = &e->workers[i];
        int flight = w->pipe && w->pipe->max_in_flight > 0 ? w->pipe->max_in_flight : 1;
        for (int s = 0; w->steps && s < flight; s++) csd_free(w->steps[s].logits);
        csd_free(w->steps);
        csd_free(w->scratch_logits);
    }
    csd_free(e->workers);
    csd_free(e->eog);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    csd_free(e);
}

/* Checks what a request asks before anything is allocated for it. */
static int check_request(const csd_engine *e, const int32_t *prompt, int64_t n_prompt,
                         const csd_req_params *params, csd_err *err) {
    if (n_prompt <= 0) return csd_err_set(err, CSD_EINVAL, "empty prompt");
    if (n_prompt >= e->max_ctx)
        return csd_err_set(err, CSD_ERANGE,
                           "prompt of %lld tokens does not fit the context of %lld tokens",
                           (long long)n_prompt, (long long)e->max_ctx);
    if (params->max_tokens <= 0) return csd_err_set(err, CSD_ERANGE, "max_tokens must be > 0");
    if (params->top_logprobs < 0 || params->top_logprobs > CSD_ENGINE_MAX_TOP_LOGPROBS)
        return csd_err_set(err, CSD_ERANGE, "top_logprobs must be in [0, %d]",
                           CSD_ENGINE_MAX_TOP_LOGPROBS);
    if (params->json_schema && !params->json_vocab)
        return csd_err_set(err, CSD_EINVAL, "a JSON schema needs the tokens' bytes (json_vocab)");
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->cfg.vocab_size)
            return csd_err_set(err, CSD_ERANGE, "token id %d outside the vocabulary", prompt[i]);
    return 0;
}

/* A request's state (its own copy of the prompt, a sampler that has seen it) into *out. */
static int req_new(const csd_engine *e, const int32_t *prompt, int64_t n_prompt,
                   const csd_req_params *params, const csd_req_callbacks *cb, void *ctx,
                   req **out, csd_err *err) {
    req *r = csd_alloc(sizeof *r);
    int rc = r ? csd_sampler_create(&r->sampler, &params->sampling, (int32_t)e->cfg.vocab_size, err)
               : csd_err_set(err, CSD_ENOMEM, "request");
    /* with speculation the answer is kept after the prompt: drafts are looked up in both; a
     * replica lost mid-answer hands it on whole to another, or to itself once back (reroute) */
    bool keep_answer = e->opts.spec_draft > 0 || e->n_workers > 1 || e->opts.resume_wait_ms > 0;
    int64_t cap = keep_answer ? csd_spec_text_cap(n_prompt, params->max_tokens, e->max_ctx)
                              : n_prompt;
    if (!rc && !(r->prompt = csd_alloc_array((size_t)cap, sizeof(int32_t))))
        rc = csd_err_set(err, CSD_ENOMEM, "prompt copy");
    if (!rc && params->json_schema && !(r->schema = csd_json_schema_copy(params->json_schema)))
        rc = csd_err_set(err, CSD_ENOMEM, "schema copy");
    if (rc) {
        req_free(r);
        return rc;
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    for (int64_t i = 0; i < n_prompt; i++) csd_sampler_accept_prompt(r->sampler, prompt[i]);
    r->n_prompt = n_prompt;
    r->hist_cap = keep_answer ? cap : 0;
    r->draft_k = e->opts.spec_draft;
    r->params = *params;
    r->params.json_schema = r->schema;
    if (r->schema) csd_json_accept_init_schema(&r->json, r->schema);
    else csd_json_accept_init(&r->json);
    r->cb = *cb;
    r->ctx = ctx;
    r->t_submit = csd_now_ns();
    *out = r;
    return 0;
}

/* Free slots on the pipelines that take requests (lock held). A replica that is down
 * (reconnecting) or pausing admits nothing, so its slots would only let requests wait beyond
 * --queue. */
static int free_ready_slots(csd_engine *e) {
    int n = 0;
    for (int i = 0; i < e->n_workers; i++)
        if (worker_ready(&e->workers[i])) n += e->opts.parallel - e->workers[i].n_active;
    return n;
}

/* Queues rs[0..n) together, or none of them (lock held): CSD_EFULL when the free slots and the
 * queue cannot take all n. */
static int enqueue_all(csd_engine *e, req **rs, int n, uint64_t *ids, csd_err *err) {
    int free_slots = free_ready_slots(e);
    if (e->stopping || e->queue_len + n > e->opts.queue_max + (free_slots > 0 ? free_slots : 0)) {
        e->stats.requests_rejected += n;
        return csd_err_set(err, CSD_EFULL,
                           "server is at capacity (%d slots, %d free on the pipelines that are "
                           "up, %d may wait)",
                           e->stats.slots, free_slots > 0 ? free_slots : 0, e->opts.queue_max);
    }
    for (int i = 0; i < n; i++) {
        req *r = rs[i];
        r->id = next_id(e);
        r->pid = (uint32_t)r->id;
        if (e->queue_tail) e->queue_tail->next = r;
        else e->queue_head = r;
        e->queue_tail = r;
        e->queue_len++;
        e->stats.requests_total++;
        e->stats.prompt_tokens_total += r->n_prompt;
        if (ids) ids[i] = r->id;
        if (n > 1) r->group = rs[0]->id; /* the same prompt: members copy each other's KV */
    }
    e->stats.queue_depth = e->queue_len;
    pthread_cond_broadcast(&e->cv);
    return 0;
}

int csd_engine_submit_group(csd_engine *e, const int32_t *prompt, int64_t n_prompt,
                            const csd_req_params *params, int n, const csd_req_callbacks *cb,
                            void *const *ctx, uint64_t *ids, csd_err *err) {
    if (n < 1 || n > CSD_ENGINE_MAX_GROUP)
        return csd_err_set(err, CSD_EINVAL, "a group of %d requests (1 to %d)", n,
                           CSD_ENGINE_MAX_GROUP);
    req *rs[CSD_ENGINE_MAX_GROUP] = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        rc = check_request(e, prompt, n_prompt, &params[i], err);
        if (!rc) rc = req_new(e, prompt, n_prompt, &params[i], cb, ctx[i], &rs[i], err);
    }
    if (!rc) {
        pthread_mutex_lock(&e->mu);
        rc = enqueue_all(e, rs, n, ids, err);
        pthread_mutex_unlock(&e->mu);
    }
    if (rc)
        for (int i = 0; i < n; i++) req_free(rs[i]);
    return rc;
}

int csd_engine_submit(csd_engine *e, const int32_t *prompt, int64_t n_prompt,
                      const csd_req_params *params, const csd_req_callbacks *cb, void *ctx,
                      uint64_t *id, csd_err *err) {
    return csd_engine_submit_group(e, prompt, n_prompt, params, 1, cb, &ctx, id, err);
}

int csd_engine_capacity(csd_engine *e) {
    pthread_mutex_lock(&e->mu);
    int n = e->stats.slots + e->opts.queue_max;
    pthread_mutex_unlock(&e->mu);
    return n;
}

/* Takes request id out of the queue (lock held); NULL when it is not queued. */
static req *unqueue(csd_engine *e, uint64_t id) {
    req *prev = NULL;
    for (req *r = e->queue_head; r; prev = r, r = r->next) {
        if (r->id != id) continue;
        if (prev) prev->next = r->next;
        else e->queue_head = r->next;
        if (e->queue_tail == r) e->queue_tail = prev;
        e->queue_len--;
        e->stats.queue_depth = e->queue_len;
        r->next = NULL;
        return r;
    }
    return NULL;
}

void csd_engine_cancel(csd_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    /* a queued request leaves the queue now: its place goes to the next client at once, even
     * while no pipeline is up to admit it (it would hold it until admitted) */
    req *queued = unqueue(e, id);
    for (int i = 0; i < e->n_workers; i++)
        for (req *r = e->workers[i].active; r; r = r->next)
            if (r->id == id) atomic_store(&r->cancel, true);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (queued) end_request(e, queued, CSD_REQ_END_CANCELLED, 0, "cancelled");
}

void csd_engine_drain(csd_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->draining = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void csd_engine_get_stats(csd_engine *e, csd_engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->stats;
    st->queue_depth = e->queue_len;
    pthread_mutex_unlock(&e->mu);
}

const csd_model_config *csd_engine_model(const csd_engine *e) { return &e->cfg; }
int64_t csd_engine_max_ctx(const csd_engine *e) { return e->max_ctx; }
static bool pipe_ready(csd_pipeline *p) { return !p->ops->ready || p->ops->ready(p); }

bool csd_engine_ready(csd_engine *e) {
    for (int i = 0; i < e->n_workers; i++)
        if (pipe_ready(e->workers[i].pipe)) return true;
    return false;
}
