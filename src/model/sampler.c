/* sampler: next-token selection (see sampler.h). Top-k, top-p and min-p select by partitioning
 * (quickselect), never by sorting the vocabulary, so a 150K vocabulary costs O(V) per token
 * whatever the settings and however flat the distribution. */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/alloc.h"

typedef struct cand {
    int32_t id;
    float logit;
} cand;

struct csd_sampler {
    csd_sampler_params p;
    int32_t vocab;
    uint64_t rng[4];   /* xoshiro256** state */
    int32_t *recent;   /* RECENT: ring of the last penalty_last_n tokens; OPENAI: each token seen
                        * (prompt or answer) once, in the order first seen */
    int32_t n_recent, head;
    int32_t *counts;   /* (vocab) RECENT: occurrences inside the ring; OPENAI: in the answer */
    uint8_t *seen;     /* (vocab) OPENAI: in recent[] already */
    cand *cands;       /* (vocab) working set */
};

void csd_sampler_params_default(csd_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repetition_penalty = 1.0f;
    p->penalty_last_n = 64;
    p->seed = 0x5eed;
}

int csd_sampler_params_check(const csd_sampler_params *p, int32_t vocab, csd_err *err) {
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f))
        return csd_err_set(err, CSD_ERANGE, "temperature must be in [0, 100]");
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return csd_err_set(err, CSD_ERANGE, "top_p must be in (0, 1]");
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return csd_err_set(err, CSD_ERANGE, "min_p must be in [0, 1]");
    if (p->top_k < 0) return csd_err_set(err, CSD_ERANGE, "top_k must be >= 0");
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 10.0f))
        return csd_err_set(err, CSD_ERANGE, "repetition_penalty must be in (0, 10]");
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return csd_err_set(err, CSD_ERANGE, "presence_penalty must be in [-2, 2]");
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return csd_err_set(err, CSD_ERANGE, "frequency_penalty must be in [-2, 2]");
    if (p->penalty_last_n < 0 || p->penalty_last_n > 1 << 20)
        return csd_err_set(err, CSD_ERANGE, "penalty_last_n must be in [0, 2^20]");
    if (p->penalty_scope != CSD_PENALTY_RECENT && p->penalty_scope != CSD_PENALTY_OPENAI)
        return csd_err_set(err, CSD_EINVAL, "unknown penalty scope %d", p->penalty_scope);
    if (p->n_logit_bias < 0 || p->n_logit_bias > CSD_SAMPLER_MAX_LOGIT_BIAS)
        return csd_err_set(err, CSD_ERANGE, "logit_bias holds at most %d tokens",
                           CSD_SAMPLER_MAX_LOGIT_BIAS);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const csd_logit_bias *b = &p->logit_bias[i];
        if (b->id < 0 || (vocab > 0 && b->id >= vocab))
            return csd_err_set(err, CSD_ERANGE, "logit_bias token %d is outside the vocabulary",
                               (int)b->id);
        if (!(b->bias >= -100.0f && b->bias <= 100.0f))
            return csd_err_set(err, CSD_ERANGE, "logit_bias of token %d must be in [-100, 100]",
                               (int)b->id);
    }
    return 0;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 bits. */
static double next_unit(uint64_t s[4]) {
    return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
}

int csd_sampler_create(csd_sampler **out, const csd_sampler_params *p, int32_t vocab,
                       csd_err *err) {
    *out = NULL;
    if (vocab <= 0) return csd_err_set(err, CSD_EINVAL, "vocabulary size %d", vocab);
    int rc = csd_sampler_params_check(p, vocab, err);
    if (rc) return rc;
    csd_sampler *s = csd_alloc(sizeof *s);
    if (!s) return csd_err_set(err, CSD_ENOMEM, "sampler");
    s->p = *p;
    s->vocab = vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    bool openai = p->penalty_scope == CSD_PENALTY_OPENAI;
    size_t n_recent =
        openai ? (size_t)vocab : (size_t)(p->penalty_last_n > 0 ? p->penalty_last_n : 1);
    s->recent = csd_alloc_array(n_recent, sizeof(int32_t));
    s->counts = csd_alloc_array((size_t)vocab, sizeof(int32_t));
    s->cands = csd_alloc_array((size_t)vocab, sizeof(cand));
    s->seen = openai ? csd_alloc_array((size_t)vocab, 1) : NULL;
    if (!s->recent || !s->counts || !s->cands || (openai && !s->seen)) {
        csd_sampler_destroy(s);
        return csd_err_set(err, CSD_ENOMEM, "sampler buffers");
    }
    *out = s;
    return 0;
}

void csd_sampler_destroy(csd_sampler *s) {
    if (!s) return;
    csd_free(s->recent);
    csd_free(s->counts);
    csd_free(s->cands);
    csd_free(s->seen);
    csd_free(s);
}

/* OPENAI scope: id joins the tokens the penalties look at; counted when generated. */
static void accept_openai(csd_sampler *s, int32_t id, bool generated) {
    if (!s->seen[id]) {
        s->seen[id] = 1;
        s->recent[s->n_recent++] = id;
    }
    s->counts[id] += generated;
}

static void accept_recent(csd_sampler *s, int32_t id) {
    if (s->p.penalty_last_n <= 0) return;
    if (s->n_recent == s->p.penalty_last_n) { /* evict the oldest */
        s->counts[s->recent[s->head]]--;
    } else {
        s->n_recent++;
    }
    s->recent[s->head] = id;
    s->counts[id]++;
    s->head = (s->head + 1) % s->p.penalty_last_n;
}

void csd_sampler_accept_prompt(csd_sampler *s, int32_t id) {
    if (id < 0 || id >= s->vocab) return;
    if (s->p.penalty_scope == CSD_PENALTY_OPENAI) accept_openai(s, id, false);
    else accept_recent(s, id);
}

void csd_sampler_accept(csd_sampler *s, int32_t id) {
    if (id < 0 || id >= s->vocab) return;
    if (s->p.penalty_scope == CSD_PENALTY_OPENAI) accept_openai(s, id, true);
    else accept_recent(s, id);
}

static void apply_logit_bias(const csd_sampler *s, float *logits) {
    for (int32_t i = 0; i < s->p.n_logit_bias; i++)
        logits[s->p.logit_bias[i].id] += s->p.logit_bias[i].bias;
}

/* A logit under the penalties: a token seen is repeated (CTRL-style divide or multiply), and one
 * counted c times loses the presence penalty once and the frequency penalty c times. */
static float penalized(const csd_sampler_params *p, float l, int32_t c) {
    if (p->repetition_penalty != 1.0f)
        l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
    if (c > 0) l -= (float)c * p->frequency_penalty + p->presence_penalty;
    /* a penalty near 0 divides a logit past the float range: an infinite logit would make the
     * softmax NaN (inf - inf), so it stops at the largest float */
    return isinf(l) ? copysignf(FLT_MAX, l) : l;
}

static void apply_penalties(csd_sampler *s, float *logits) {
    const csd_sampler_params *p = &s->p;
    if (p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
        p->frequency_penalty == 0.0f)
        return;
    if (p->penalty_scope == CSD_PENALTY_OPENAI) { /* recent[] holds each token seen once */
        for (int32_t i = 0; i < s->n_recent; i++)
            logits[s->recent[i]] = penalized(p, logits[s->recent[i]], s->counts[s->recent[i]]);
        return;
    }
    for (int32_t i = 0; i < s->n_recent; i++) {
        int32_t id = s->recent[i];
        int32_t c = s->counts[id];
        if (c <= 0) continue;
        logits[id] = penalized(p, logits[id], c);
        s->counts[id] = -c; /* mark as done for duplicates in the ring; restored below */
    }
    for (int32_t i = 0; i < s->n_recent; i++)
        if (s->counts[s->recent[i]] < 0) s->counts[s->recent[i]] = -s->counts[s->recent[i]];
}

static int32_t argmax(const float *x, int32_t n) { /* the first best; NaN only when all are */
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i]))) best = i;
    return best;
}

/* Higher logit first; lower id first on ties, so results never depend on memory order. */
static inline bool before(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void swap_cand(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Partitions c[lo..hi) (hi - lo >= 2) around the median of its first, middle and last: the
 * candidates before it go first, then it, then the rest. Returns its place. */
static int32_t partition(cand *c, int32_t lo, int32_t hi) {
    int32_t a = lo, b = lo + (hi - lo) / 2, z = hi - 1;
    if (before(&c[b], &c[a])) swap_cand(&c[a], &c[b]);
    if (before(&c[z], &c[b])) swap_cand(&c[b], &c[z]);
    if (before(&c[b], &c[a])) swap_cand(&c[a], &c[b]);
    swap_cand(&c[b], &c[z]); /* the median waits at the end */
    int32_t i = lo;
    for (int32_t j = lo; j < z; j++)
        if (before(&c[j], &c[z])) swap_cand(&c[i++], &c[j]);
    swap_cand(&c[i], &c[z]);
    return i;
}

/* Moves the k best candidates of c[0..n) to the front (unordered). */
static void select_top(cand *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n; /* the k-th best lies in [lo, hi) */
    while (hi - lo > 1) {
        int32_t p = partition(c, lo, hi);
        if (p == k || p == k - 1) return;
        if (p < k) lo = p + 1;
        else hi = p;
    }
}

/* Top-p's cut: moves to the front of c[0..n) (weights in .logit) the fewest best candidates
 * whose weights sum to at least mass, in no particular order, and returns how many (n when all
 * of them sum to less). The answer lies in [lo, hi) and the candidates before lo are in it. */
static int32_t select_mass(cand *c, int32_t n, double mass) {
    int32_t lo = 0, hi = n;
    while (hi - lo > 1) {
        int32_t k = partition(c, lo, hi);
        double better = 0.0;
        for (int32_t i = lo; i < k; i++) better += c[i].logit;
        if (better >= mass) {
            hi = k; /* reached before the pivot */
            continue;
        }
        mass -= better + c[k].logit;
        if (mass <= 0.0) return k + 1; /* the pivot completes it */
        lo = k + 1;
    }
    return hi;
}

/* Min-p: moves the candidates whose weight is at least floor to the front, keeping their order;
 * returns how many. */
static int32_t keep_above(cand *c, int32_t n, float floor) {
    int32_t kept = 0;
    for (int32_t i = 0; i < n; i++)
        if (c[i].logit >= floor) c[kept++] = c[i];
    return kept;
}

bool csd_sampler_is_plain_argmax(const csd_sampler_params *p) {
    return p->temperature <= 0.0f && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f && p->n_logit_bias == 0;
}

void csd_sampler_adjust(csd_sampler *s, float *logits) {
    apply_logit_bias(s, logits);
    apply_penalties(s, logits);
}

int32_t csd_sampler_sample(csd_sampler *s, float *logits) {
    csd_sampler_adjust(s, logits);
    return csd_sampler_pick(s, logits);
}

int32_t csd_sampler_pick(csd_sampler *s, float *logits) {
    const csd_sampler_params *p = &s->p;
    if (p->temperature <= 0.0f) return argmax(logits, s->vocab);
    int32_t n = s->vocab;
    /* a NaN logit (a poisoned hidden state quantizes to NaN on purpose) is never drawn, and the
     * selections below see a total order */
    for (int32_t i = 0; i < n; i++)
        s->cands[i] = (cand){i, isnan(logits[i]) ? -INFINITY : logits[i]};
    if (p->top_k > 0 && p->top_k < n) {
        select_top(s->cands, n, p->top_k);
        n = p->top_k;
    }
    /* softmax with temperature over the survivors */
    float max = -INFINITY;
    for (int32_t i = 0; i < n; i++) max = s->cands[i].logit > max ? s->cands[i].logit : max;
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) {
        float w = expf((s->cands[i].logit - max) / p->temperature);
        s->cands[i].logit = w >= 0.0f ? w : 0.0f; /* now a weight; inf - inf gives none */
        total += s->cands[i].logit;
    }
    /* No weight at all: an infinite logit (it is the choice), or no finite one */
    if (!(total > 0.0)) return argmax(logits, s->vocab);
    /* Each cut keeps the best candidates (in weight order) down to some point, so the two
     * together keep the shorter of the two: min-p's (the best weighs exactly 1, so its floor is
     * min_p), then, of those, the fewest that hold top_p of the whole mass. */
    int32_t kept = n;
    if (p->top_p < 1.0f || p->min_p > 0.0f) {
        if (p->min_p > 0.0f) kept = keep_above(s->cands, n, p->min_p);
        if (p->top_p < 1.0f) kept = select_mass(s->cands, kept, p->top_p * total);
        total = 0.0;
        for (int32_t i = 0; i < kept; i++) total += s->cands[i].logit;
    }
    double r = next_unit(s->rng) * total, acc = 0.0;
    for (int32_t i = 0; i < kept; i++) {
        acc += s->cands[i].logit;
        if (r < acc) return s->cands[i].id;
    }
    return s->cands[kept - 1].id;
}

float csd_logprob_of(const float *logits, int32_t vocab, int32_t id) {
    float max = -INFINITY;
    for (int32_t i = 0; i < vocab; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; i++) sum += exp((double)logits[i] - max);
    return (float)((double)logits[id] - max - log(sum));
}

int csd_top_logprobs(const float *logits, int32_t vocab, int n, int32_t *ids, float *logprobs) {
    if (n < 0 || n > 20) return CSD_ERANGE;
    if (n > vocab) n = vocab;
    float max = -INFINITY;
    for (int32_t i = 0; i < vocab; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    int k = 0; /* ids[0..k) hold the best so far, best first (lower id first on ties) */
    for (int32_t i = 0; i < vocab; i++) {
        sum += exp((double)logits[i] - max);
        if (n == 0 || (k == n && logits[i] <= logits[ids[n - 1]])) continue;
        int j = k < n ? k++ : n - 1;
        while (j > 0 && logits[i] > logits[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    double lse = max + log(sum);
    for (int j = 0; j < n; j++) logprobs[j] = (float)((double)logits[ids[j]] - lse);
    return 0;
}
