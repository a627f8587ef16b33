/* draft_model: greedy drafts from a small model, a KV cache per request (see draft_model.h). */
#include "draft_model.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "core/alloc.h"
#include "model/quality.h"

typedef struct draft_slot {
    uint64_t key;       /* the request holding it; 0: free (its KV may still serve a prefix) */
    csd_kv *kv;         /* NULL until a request first needs the slot */
    int32_t *tokens;    /* what kv holds, cap of them */
    int64_t len;
    uint64_t last_used; /* the propose call that last used it */
    uint64_t wanted;    /* the propose call whose jobs include its key: not to be evicted */
} draft_slot;

/* A job's progress through one propose call. */
typedef struct job_state {
    draft_slot *slot;   /* NULL: no draft for this job */
    int64_t next;       /* the next text position the slot has not computed */
    int got;            /* draft tokens written so far */
    bool waits;         /* an earlier job of the call computes a longer prefix of its text: it
                         * copies that, then catches up (the choices of an n group) */
} job_state;

/* Shortest prefix a job waits for another to compute: the wait costs a forward more (a read of
 * all the draft model's weights), which batched prompt positions repay from about here. */
#define SHARE_MIN 32

/* Releases wait here, under their own lock, for the next propose: a request that ends does not
 * wait for another pipeline's drafts. */
#define RELEASE_QUEUE 64

struct csd_draft_model {
    pthread_mutex_t mu;
    pthread_mutex_t release_mu;
    uint64_t released[RELEASE_QUEUE];
    int n_released;
    csd_model *model;   /* borrowed */
    int64_t cap;        /* positions per slot */
    int64_t vocab;      /* the draft model's */
    int64_t vocab_limit;
    float p_min;        /* a draft ends before a token the draft model gives less (0: never) */
    int64_t max_batch;
    int max_jobs;       /* per call: at most one batch of one token each */
    int n_slots;
    draft_slot *slots;
    uint64_t calls;
    int64_t computed;   /* positions fed to the model so far */
    /* one call's scratch */
    job_state *jobs;    /* (max_jobs) */
    int *row_job;       /* (max_jobs) the job of each logits row of a forward */
    float *logits;      /* (max_jobs, vocab) */
    csd_kv **batch_kv;  /* (max_batch) */
    int32_t *batch_ids; /* (max_batch) */
    bool *batch_want;   /* (max_batch) */
};

static int64_t shared_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Among free slots sharing as much with a text: one whose KV cache exists (memory grows with the
 * requests served at once, not with the slots), then the least recently used. */
static bool better_free(const draft_slot *s, const draft_slot *than) {
    if ((s->kv != NULL) != (than->kv != NULL)) return s->kv != NULL;
    return s->last_used < than->last_used;
}

/* The slot of key: its own, else the free one sharing the longest prefix with text, else the
 * least recently used one that no job of this call wants. */
static draft_slot *slot_for(csd_draft_model *d, uint64_t key, const int32_t *text, int64_t n) {
    draft_slot *best = NULL, *lru = NULL;
    int64_t best_shared = -1;
    for (int i = 0; i < d->n_slots; i++) {
        draft_slot *s = &d->slots[i];
        if (s->key == key) return s;
        if (s->key == 0) {
            int64_t shared = shared_prefix(s->tokens, s->len, text, n);
            if (shared > best_shared || (shared == best_shared && better_free(s, best))) {
                best = s;
                best_shared = shared;
            }
        } else if (s->last_used != d->calls && s->wanted != d->calls &&
                   (!lru || s->last_used < lru->last_used)) {
            lru = s;
        }
    }
    return best ? best : lru;
}

/* Marks the slots of the call's keys, so that a new request of the call does not evict one. */
static void mark_wanted(csd_draft_model *d, const csd_draft_job *jobs, int n) {
    for (int i = 0; i < d->n_slots; i++)
        for (int j = 0; d->slots[i].key && j < n; j++)
            if (d->slots[i].key == jobs[j].key) d->slots[i].wanted = d->calls;
}

static void slot_reset(draft_slot *s) {
    if (s->kv) csd_kv_truncate(s->kv, 0);
    s->len = 0;
}

/* The slot's KV cache and token list, made when a request first takes it. */
static bool slot_ready(csd_draft_model *d, draft_slot *s) {
    if (s->kv) return true;
    csd_err err = {0};
    s->tokens = csd_alloc_array((size_t)d->cap, sizeof(int32_t));
    if (s->tokens && !csd_kv_create(&s->kv, d->model, d->cap, &err)) return true;
    csd_free(s->tokens);
    s->tokens = NULL;
    return false;
}

/* Frees the slot of key (lock held). */
static void release_now(csd_draft_model *d, uint64_t key) {
    for (int i = 0; i < d->n_slots; i++)
        if (d->slots[i].key == key) d->slots[i].key = 0;
}

/* Applies the releases queued since the last call (lock held). */
static void apply_releases(csd_draft_model *d) {
    pthread_mutex_lock(&d->release_mu);
    for (int i = 0; i < d->n_released; i++) release_now(d, d->released[i]);
    d->n_released = 0;
    pthread_mutex_unlock(&d->release_mu);
}

/* The first id of text[from..n) the draft model cannot embed, or -1: a request may carry ids of
 * the served model's vocabulary beyond the draft's (an embedding padded differently). */
static int64_t foreign_token(const csd_draft_model *d, const int32_t *text, int64_t from,
                             int64_t n) {
    for (int64_t i = from; i < n; i++)
        if (text[i] < 0 || text[i] >= d->vocab) return i;
    return -1;
}

/* Whether the draft model gives its greedy token top (the row's largest logit) a probability of
 * p_min or more: 1 / sum exp(l - l_top) >= p_min. The sum stops once past 1 / p_min; infinite
 * or NaN logits give false. */
static bool sure_of(const float *logits, int64_t vocab, int64_t top, float p_min) {
    double limit = 1.0 / p_min, sum = 0;
    for (int64_t v = 0; v < vocab && sum <= limit; v++)
        sum += exp((double)logits[v] - (double)logits[top]);
    return sum <= limit;
}

/* Runs the batch of fill tokens; the logits rows go to their jobs' next draft token, ending a
 * job's draft at a token beyond the served model's vocabulary or one it is unsure of (p_min). */
static int run_batch(csd_draft_model *d, csd_draft_job *jobs, int64_t fill, int rows,
                     csd_err *err) {
    csd_batch b = {fill, d->batch_ids, NULL, d->batch_kv, d->batch_want};
    int rc = csd_model_forward(d->model, &b, d->logits, err);
    if (rc) return rc;
    d->computed += fill;
    for (int r = 0; r < rows; r++) {
        int j = d->row_job[r];
        const float *row = d->logits + (int64_t)r * d->vocab;
        int32_t id = (int32_t)csd_quality_argmax(row, d->vocab);
        if (id >= d->vocab_limit || (d->p_min > 0 && !sure_of(row, d->vocab, id, d->p_min)))
            jobs[j].k = d->jobs[j].got; /* the draft ends here */
        else jobs[j].out[d->jobs[j].got++] = id;
    }
    return 0;
}

/* Appends token id of job j's slot to the batch; want: its logits give the next draft token. */
static void batch_add(csd_draft_model *d, int j, int32_t id, bool want, int64_t *fill, int *rows) {
    draft_slot *s = d->jobs[j].slot;
    d->batch_kv[*fill] = s->kv;
    d->batch_ids[*fill] = id;
    d->batch_want[*fill] = want;
    (*fill)++;
    if (want) d->row_job[(*rows)++] = j;
    s->tokens[s->len++] = id;
}

/* Feeds every job's text beyond what its slot holds, in batches; each job's last text token
 * gives its first draft token. */
static int catch_up(csd_draft_model *d, csd_draft_job *jobs, int n, csd_err *err) {
    int64_t fill = 0;
    int rows = 0;
    for (int j = 0; j < n; j++) {
        job_state *js = &d->jobs[j];
        while (js->slot && !js->waits && js->next < jobs[j].n_text) {
            bool last = js->next == jobs[j].n_text - 1;
            batch_add(d, j, jobs[j].text[js->next++], last, &fill, &rows);
            if (fill < d->max_batch) continue;
            int rc = run_batch(d, jobs, fill, rows, err);
            if (rc) return rc;
            fill = 0;
            rows = 0;
        }
    }
    return fill > 0 ? run_batch(d, jobs, fill, rows, err) : 0;
}

/* Feeds every job's latest draft token while it wants more, one batch per draft position. */
static int extend_drafts(csd_draft_model *d, csd_draft_job *jobs, int n, csd_err *err) {
    for (;;) {
        int64_t fill = 0;
        int rows = 0;
        for (int j = 0; j < n; j++) {
            job_state *js = &d->jobs[j];
            if (!js->slot || js->got == 0 || js->got >= jobs[j].k) continue;
            batch_add(d, j, jobs[j].out[js->got - 1], true, &fill, &rows);
        }
        if (fill == 0) return 0;
        int rc = run_batch(d, jobs, fill, rows, err);
        if (rc) return rc;
    }
}

/* Where another slot holds a longer prefix of text than s keeps (a request with the same system
 * prompt, a choice of the same n group, in a later step), s copies it: far cheaper than computing
 * it. Returns the positions s holds of text now. */
static int64_t borrow_prefix(draft_slot *s, const draft_slot *slots, int n_slots,
                             const int32_t *text, int64_t n, int64_t keep) {
    const draft_slot *from = NULL;
    int64_t best = keep;
    for (int i = 0; i < n_slots; i++) {
        int64_t shared = &slots[i] == s ? 0 : shared_prefix(slots[i].tokens, slots[i].len, text, n);
        if (shared > best) {
            from = &slots[i];
            best = shared;
        }
    }
    csd_err err = {0};
    if (!from || csd_kv_copy_prefix(s->kv, from->kv, best, &err)) return keep;
    memcpy(s->tokens, from->tokens, (size_t)best * sizeof(int32_t));
    s->len = best;
    return best;
}

/* Sets job's slot to keep the first `keep` positions of its text (or all but the last: those
 * logits are wanted again), taking a longer prefix another slot holds. */
static void settle(csd_draft_model *d, const csd_draft_job *job, job_state *js, int64_t keep) {
    draft_slot *s = js->slot;
    keep = borrow_prefix(s, d->slots, d->n_slots, job->text, job->n_text, keep);
    if (keep == job->n_text) keep--; /* the last token is fed again: its logits are not kept */
    csd_kv_truncate(s->kv, keep);
    s->len = keep;
    js->next = keep;
}

/* Whether an earlier job of the call (jobs[0..j)) will compute at least SHARE_MIN more of
 * job j's text than its slot keeps. */
static bool worth_waiting(const csd_draft_model *d, const csd_draft_job *jobs, int j) {
    for (int i = 0; i < j; i++)
        if (d->jobs[i].slot && !d->jobs[i].waits &&
            shared_prefix(jobs[i].text, jobs[i].n_text, jobs[j].text, jobs[j].n_text) >=
                d->jobs[j].next + SHARE_MIN)
            return true;
    return false;
}

/* Gives job j a slot that holds the longest prefix of its text it can keep, and bounds its k by
 * the slot's room: the slot ends holding the text and all but the last draft token. */
static void start_job(csd_draft_model *d, csd_draft_job *jobs, int j) {
    csd_draft_job *job = &jobs[j];
    job_state *js = &d->jobs[j];
    int64_t room = d->cap - job->n_text + 1;
    if (job->k > room) job->k = room > 0 ? (int)room : 0;
    js->slot = NULL;
    js->got = 0;
    js->waits = false;
    if (job->k <= 0 || job->n_text <= 0 || job->key == 0) {
        job->k = 0;
        return;
    }
    draft_slot *s = slot_for(d, job->key, job->text, job->n_text);
    /* none free, the key twice in one call, or no memory for its cache: no draft this time */
    if (!s || (s->key == job->key && s->last_used == d->calls) || !slot_ready(d, s)) {
        job->k = 0;
        return;
    }
    int64_t keep = shared_prefix(s->tokens, s->len, job->text, job->n_text);
    /* (no slot holds such a token: none is in a prefix it could borrow) */
    if (foreign_token(d, job->text, keep, job->n_text) >= 0) { /* the others still draft */
        job->k = 0;
        return;
    }
    s->key = job->key;
    s->last_used = d->calls;
    js->slot = s;
    settle(d, job, js, keep);
    js->waits = worth_waiting(d, jobs, j);
}

/* The jobs that waited take the prefix an earlier job computed; true when there were any. */
static bool rejoin(csd_draft_model *d, const csd_draft_job *jobs, int n) {
    bool any = false;
    for (int j = 0; j < n; j++) {
        job_state *js = &d->jobs[j];
        if (!js->waits) continue;
        js->waits = false;
        settle(d, &jobs[j], js, js->next);
        any = true;
    }
    return any;
}

int csd_draft_model_propose(csd_draft_model *d, csd_draft_job *jobs, int n, csd_err *err) {
    pthread_mutex_lock(&d->mu);
    d->calls++;
    apply_releases(d);
    for (int j = n > d->max_jobs ? d->max_jobs : n; j < n; j++) jobs[j].k = 0;
    if (n > d->max_jobs) n = d->max_jobs;
    mark_wanted(d, jobs, n);
    for (int j = 0; j < n; j++) start_job(d, jobs, j);
    int rc = catch_up(d, jobs, n, err);
    if (!rc && rejoin(d, jobs, n)) rc = catch_up(d, jobs, n, err);
    if (!rc) rc = extend_drafts(d, jobs, n, err);
    for (int j = 0; j < n; j++) {
        if (rc && d->jobs[j].slot) slot_reset(d->jobs[j].slot);
        jobs[j].k = rc || !d->jobs[j].slot ? 0 : d->jobs[j].got;
    }
    csd_pool_rest(csd_model_pool(d->model)); /* the served model's step comes next */
    pthread_mutex_unlock(&d->mu);
    return rc;
}

void csd_draft_model_release(csd_draft_model *d, uint64_t key) {
    if (!d || key == 0) return;
    pthread_mutex_lock(&d->release_mu);
    bool queued = d->n_released < RELEASE_QUEUE;
    if (queued) d->released[d->n_released++] = key;
    pthread_mutex_unlock(&d->release_mu);
    if (queued) return;
    pthread_mutex_lock(&d->mu); /* a full queue: the next propose's work, done now */
    apply_releases(d);
    release_now(d, key);
    pthread_mutex_unlock(&d->mu);
}

int csd_draft_next_k(int k, int drafted, int agreed, int max) {
    if (drafted > 0) k = agreed == drafted ? k + 2 : k - 1;
    return k > max ? max : k < 1 ? 1 : k;
}

int64_t csd_draft_model_computed(csd_draft_model *d) {
    pthread_mutex_lock(&d->mu);
    int64_t n = d->computed;
    pthread_mutex_unlock(&d->mu);
    return n;
}
int64_t csd_draft_model_max_ctx(const csd_draft_model *d) { return d->cap; }

void csd_draft_model_set_p_min(csd_draft_model *d, float p_min) {
    pthread_mutex_lock(&d->mu);
    d->p_min = p_min;
    pthread_mutex_unlock(&d->mu);
}

void csd_draft_model_destroy(csd_draft_model *d) {
    if (!d) return;
    for (int i = 0; d->slots && i < d->n_slots; i++) {
        csd_kv_destroy(d->slots[i].kv);
        csd_free(d->slots[i].tokens);
    }
    csd_free(d->slots);
    csd_free(d->jobs);
    csd_free(d->row_job);
    csd_free(d->logits);
    csd_free(d->batch_kv);
    csd_free(d->batch_ids);
    csd_free(d->batch_want);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->release_mu);
    csd_free(d);
}

int csd_draft_model_create(csd_draft_model **out, csd_model *model, int n_slots, int max_jobs,
                           int64_t max_ctx, int64_t vocab_limit, csd_err *err) {
    *out = NULL;
    const csd_model_config *cfg = csd_model_cfg(model);
    const csd_weights *w = csd_model_weights(model);
    if (!w->has_embed || !w->has_head)
        return csd_err_set(err, CSD_EINVAL, "a draft model needs all its layers in one place");
    if (n_slots <= 0 || max_jobs <= 0)
        return csd_err_set(err, CSD_EINVAL, "%d draft model slots, %d per call", n_slots,
                           max_jobs);
    csd_draft_model *d = csd_alloc(sizeof *d);
    if (!d) return csd_err_set(err, CSD_ENOMEM, "draft model");
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->release_mu, NULL);
    d->model = model;
    d->cap = max_ctx > 0 && max_ctx < csd_model_max_ctx(model) ? max_ctx : csd_model_max_ctx(model);
    d->vocab = cfg->vocab_size;
    d->vocab_limit = vocab_limit;
    d->max_batch = csd_model_max_batch(model);
    d->n_slots = n_slots;
    if (max_jobs > n_slots) max_jobs = n_slots;
    d->max_jobs = max_jobs < d->max_batch ? max_jobs : (int)d->max_batch;
    d->jobs = csd_alloc_array((size_t)d->max_jobs, sizeof *d->jobs);
    d->row_job = csd_alloc_array((size_t)d->max_jobs, sizeof *d->row_job);
    d->logits = csd_alloc_array((size_t)d->max_jobs * (size_t)d->vocab, sizeof(float));
    d->batch_kv = csd_alloc_array((size_t)d->max_batch, sizeof(csd_kv *));
    d->batch_ids = csd_alloc_array((size_t)d->max_batch, sizeof(int32_t));
    d->batch_want = csd_alloc_array((size_t)d->max_batch, sizeof(bool));
    d->slots = csd_alloc_array((size_t)n_slots, sizeof *d->slots);
    if (!d->jobs || !d->row_job || !d->logits || !d->batch_kv || !d->batch_ids ||
        !d->batch_want || !d->slots) {
        csd_draft_model_destroy(d);
        return csd_err_set(err, CSD_ENOMEM, "draft model buffers");
    }
    *out = d;
    return 0;
}
