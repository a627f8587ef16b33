/* decode_step: the layers of a one-token forward (a decode step) as a single pool job.
 *
 * The general path (forward.c) runs a layer as a chain of pool jobs: one per matmul group and one
 * for attention, with the norms, residual adds, SiLU and the activation quantization on the
 * calling thread in between. For one token that moves vectors between the cores several times a
 * layer (the caller reads the rows the other thread wrote, the other thread reads what the caller
 * quantized, an attention unit reads q/k/v rows the other core wrote), and a cache line crossing
 * cores costs ~200 ns here. In this job the threads meet at barriers instead, and:
 * - each thread keeps its own copy of the residual stream and does the norms and quantization
 *   itself, so a matmul's input never crosses cores (the same operations on the same inputs: the
 *   copies are identical);
 * - thread t owns a contiguous share of the KV heads: its lanes start on those heads' q, k and v
 *   rows and it runs their attention units, so the rows are in its own cache, and it prefetches
 *   their K/V rows while it waits for the other thread's last q/k/v rows;
 * - thread t owns a share of the hidden groups: its lanes start on those gate and up rows, and it
 *   does their SiLU and quantizes that part of the down projection's input;
 * - a thread waiting at a barrier reads the first weights of its lanes in the next matmul into
 *   L2 (kern.h: csd_lanes_ahead), since no weights stream between two matmuls.
 * The lanes still steal from each other (kern.h: csd_lanes): a slow or preempted thread's rows are
 * taken by the other, which then reads across cores as before. Every output element goes through
 * the same float operations as in the general path, so results are bit-identical
 * (tests/test_model_decode_step.c). docs/kernels.md has the measurements. */
#include "decode_step.h"

#include <string.h>

#include "core/alloc.h"
#include "kern/quant.h"

/* Which path a one-token step takes is measured, not assumed: the first DECODE_TRIAL_STEPS steps
 * of every DECODE_EPOCH_STEPS alternate the two paths, and the rest take the one whose median
 * step time was lower. Barriers need every thread on a core: with more busy threads than cores
 * (another process, a local fleet's other stages, a noisy host) each waits for a preempted
 * thread, where the general path's claimed chunks go on without it (measured with two processes
 * of 2 threads on 2 cores: 27% fewer tokens in all than the general path). So a one-job step
 * slower than DECODE_TRIAL_ABORT times the general step just before it ends the trial at once. */
#define DECODE_TRIAL_STEPS 32
#define DECODE_EPOCH_STEPS 512
#define DECODE_TRIAL_ABORT 2

typedef struct step_thread {
    float *x;           /* the residual stream (thread 0 uses m->x) */
    float *xn;          /* normed input */
    uint8_t *act;       /* quantized matmul input */
    uint8_t *part;      /* csd_quantize_act_groups scratch */
    int64_t kvh0, kvh1; /* owned KV heads */
    int64_t g0, g1;     /* owned hidden groups */
    int64_t h0, h1;     /* their rows of gate, up and the SiLU */
    int64_t qkv0, qkv1; /* first lanes: owned q/k/v row blocks (in the views' order) */
    int64_t gu0, gu1;   /* first lanes: owned gate/up row blocks */
} step_thread;

/* Per layer, the q/k/v and gate/up matrices cut into the threads' shares, thread by thread:
 * q, k, v of thread 0, then of thread 1, ...; gate, up of thread 0, ... */
struct csd_decode_step {
    int nth;
    step_thread *threads;
    csd_qmat *qkv, *gu;             /* (n_layers, 3 nth), (n_layers, 2 nth) */
    const csd_qmat **qkv_w, **gu_w; /* pointers to them */
    float **qkv_y, **gu_y;          /* their output rows in m->q/k/v, m->hb/hb2 */
    uint8_t *act_down;              /* the down projection's input, quantized by parts */
    csd_lanes *lanes[2];            /* alternate: one is set while the other may be in use */
    int64_t epoch_step;             /* one-token steps into the current epoch */
    bool chosen;                    /* this epoch's choice after its trial: the one-job step */
    uint64_t trial_ns[2][DECODE_TRIAL_STEPS / 2]; /* [general, one job]: the trial's steps */
    bool always;                                  /* no trial: every step takes the one job */
    int64_t taken;                                /* steps the one-job path has run (tests) */
};

/* Rows [r0, r1) of a Q4/Q8 matrix (r0 a multiple of 16) as a matrix of its own. */
static csd_qmat qmat_rows(const csd_qmat *w, int64_t r0, int64_t r1) {
    size_t bb = csd_quant_block_bytes(w->dtype, w->cols);
    size_t first = (size_t)(r0 / CSD_QUANT_BLOCK_ROWS);
    csd_qmat v = {w->dtype, r1 - r0, w->cols, (const uint8_t *)w->data + first * bb,
                  (size_t)csd_quant_blocks(r1 - r0) * bb};
    return v;
}

static bool layer_fits(const csd_layer_weights *lw) {
    const csd_qmat *qkv[3] = {&lw->wq, &lw->wk, &lw->wv}, *gu[2] = {&lw->gate, &lw->up};
    const csd_qmat *o = &lw->wo, *down = &lw->down;
    return !lw->bq && !lw->bk && !lw->bv && !lw->bo && csd_lanes_fit(qkv, 3) &&
           csd_lanes_fit(gu, 2) && csd_lanes_fit(&o, 1) && csd_lanes_fit(&down, 1);
}

/* The one-token path applies: several threads, Q4/Q8 layers the lanes run, no biases, and
 * heads whose rows start on 16-row blocks. */
static bool model_fits(const csd_model *m, int nth) {
    int64_t n_layers = m->w.layer_end - m->w.layer_begin;
    if (nth < 2 || n_layers <= 0 || m->cfg.head_dim % CSD_QUANT_BLOCK_ROWS) return false;
    for (int64_t li = 0; li < n_layers; li++)
        if (!layer_fits(&m->w.layers[li])) return false;
    return true;
}

static void cut_layer(csd_decode_step *d, const csd_model *m, int64_t li) {
    const csd_layer_weights *lw = &m->w.layers[li];
    int64_t hd = m->cfg.head_dim, group = m->cfg.n_heads / m->cfg.n_kv_heads;
    int64_t nth = d->nth;
    for (int t = 0; t < d->nth; t++) {
        const step_thread *th = &d->threads[t];
        int64_t i = li * 3 * nth + 3 * t, q0 = th->kvh0 * group * hd, q1 = th->kvh1 * group * hd;
        d->qkv[i] = qmat_rows(&lw->wq, q0, q1);
        d->qkv[i + 1] = qmat_rows(&lw->wk, th->kvh0 * hd, th->kvh1 * hd);
        d->qkv[i + 2] = qmat_rows(&lw->wv, th->kvh0 * hd, th->kvh1 * hd);
        d->qkv_y[i] = m->q + q0;
        d->qkv_y[i + 1] = m->k + th->kvh0 * hd;
        d->qkv_y[i + 2] = m->v + th->kvh0 * hd;
        int64_t g = li * 2 * nth + 2 * t;
        d->gu[g] = qmat_rows(&lw->gate, th->h0, th->h1);
        d->gu[g + 1] = qmat_rows(&lw->up, th->h0, th->h1);
        d->gu_y[g] = m->hb + th->h0;
        d->gu_y[g + 1] = m->hb2 + th->h0;
    }
    for (int64_t i = li * 3 * nth; i < (li + 1) * 3 * nth; i++) d->qkv_w[i] = &d->qkv[i];
    for (int64_t i = li * 2 * nth; i < (li + 1) * 2 * nth; i++) d->gu_w[i] = &d->gu[i];
}

/* Each thread's first lanes: its own views' row blocks (the same in every layer). */
static void own_blocks(csd_decode_step *d) {
    int64_t b_qkv = 0, b_gu = 0;
    for (int t = 0; t < d->nth; t++) {
        step_thread *th = &d->threads[t];
        th->qkv0 = b_qkv;
        th->gu0 = b_gu;
        for (int k = 0; k < 3; k++) b_qkv += csd_quant_blocks(d->qkv[3 * t + k].rows);
        for (int k = 0; k < 2; k++) b_gu += csd_quant_blocks(d->gu[2 * t + k].rows);
        th->qkv1 = b_qkv;
        th->gu1 = b_gu;
    }
}

static int alloc_threads(csd_decode_step *d, const csd_model *m) {
    const csd_model_config *c = &m->cfg;
    int64_t wide = c->hidden_dim > c->dim ? c->hidden_dim : c->dim;
    wide = m->q_dim > wide ? m->q_dim : wide;
    size_t act = csd_quant_act_stride(wide);
    for (int t = 0; t < d->nth; t++) {
        step_thread *th = &d->threads[t];
        th->x = t == 0 ? m->x : csd_alloc_array((size_t)c->dim, sizeof(float));
        th->xn = csd_alloc_array((size_t)wide, sizeof(float));
        th->act = csd_alloc(act);
        th->part = csd_alloc(act);
        if (!th->x || !th->xn || !th->act || !th->part) return -1;
        csd_split_range(c->n_kv_heads, t, d->nth, &th->kvh0, &th->kvh1);
        csd_split_range(csd_quant_groups(c->hidden_dim), t, d->nth, &th->g0, &th->g1);
        /* the last group may be short, and a thread past it (more threads than groups) has an
         * empty range at the end, not one that starts beyond it */
        int64_t h0 = th->g0 * CSD_QUANT_GROUP, h1 = th->g1 * CSD_QUANT_GROUP;
        th->h0 = h0 < c->hidden_dim ? h0 : c->hidden_dim;
        th->h1 = h1 < c->hidden_dim ? h1 : c->hidden_dim;
    }
    return 0;
}

int csd_decode_step_create(csd_model *m, bool always, csd_err *err) {
    int nth = csd_pool_size(m->pool);
    /* More threads than cores would stall at every barrier: the general path does every step. */
    if (nth > csd_cpu_count() || !model_fits(m, nth)) return 0;
    int64_t n_layers = m->w.layer_end - m->w.layer_begin;
    size_t nq = (size_t)(n_layers * 3 * nth), ng = (size_t)(n_layers * 2 * nth);
    csd_decode_step *d = csd_alloc(sizeof *d);
    if (!d) return csd_err_set(err, CSD_ENOMEM, "decode step");
    m->decode = d;
    d->nth = nth;
    d->always = always;
    d->threads = csd_alloc_array((size_t)nth, sizeof *d->threads);
    d->qkv = csd_alloc_array(nq, sizeof *d->qkv);
    d->gu = csd_alloc_array(ng, sizeof *d->gu);
    d->qkv_w = csd_alloc_array(nq, sizeof *d->qkv_w);
    d->gu_w = csd_alloc_array(ng, sizeof *d->gu_w);
    d->qkv_y = csd_alloc_array(nq, sizeof *d->qkv_y);
    d->gu_y = csd_alloc_array(ng, sizeof *d->gu_y);
    d->act_down = csd_alloc(csd_quant_act_stride(m->cfg.hidden_dim));
    d->lanes[0] = csd_alloc(csd_lanes_bytes());
    d->lanes[1] = csd_alloc(csd_lanes_bytes());
    if (!d->threads || !d->qkv || !d->gu || !d->qkv_w || !d->gu_w || !d->qkv_y || !d->gu_y ||
        !d->act_down || !d->lanes[0] || !d->lanes[1] || alloc_threads(d, m))
        return csd_err_set(err, CSD_ENOMEM, "decode step scratch for %d threads", nth);
    for (int64_t li = 0; li < n_layers; li++) cut_layer(d, m, li);
    own_blocks(d);
    return 0;
}

void csd_decode_step_destroy(csd_decode_step *d) {
    if (!d) return;
    for (int t = 0; d->threads && t < d->nth; t++) {
        if (t > 0) csd_free(d->threads[t].x);
        csd_free(d->threads[t].xn);
        csd_free(d->threads[t].act);
        csd_free(d->threads[t].part);
    }
    void *bufs[] = {d->threads, d->qkv,  d->gu,       d->qkv_w,    d->gu_w,
                    d->qkv_y,   d->gu_y, d->act_down, d->lanes[0], d->lanes[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) csd_free(bufs[i]);
    csd_free(d);
}

int csd_decode_step_choose(csd_model *m, const csd_batch *b) {
    csd_decode_step *d = m->decode;
    if (!d || b->n != 1) return -1;
    if (d->always) return 1;
    if (d->epoch_step < DECODE_TRIAL_STEPS) return (int)(d->epoch_step % 2);
    return d->chosen;
}

static uint64_t median_ns(uint64_t *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: a few elements */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            uint64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

void csd_decode_step_timed(csd_model *m, int path, uint64_t ns) {
    csd_decode_step *d = m->decode;
    if (path < 0 || !d) return;
    d->taken += path;
    if (d->always) return;
    int64_t k = d->epoch_step / 2;
    if (d->epoch_step < DECODE_TRIAL_STEPS) d->trial_ns[path][k] = ns;
    if (path == 1 && d->epoch_step < DECODE_TRIAL_STEPS &&
        ns > DECODE_TRIAL_ABORT * d->trial_ns[0][k]) {
        d->chosen = false;
        d->epoch_step = DECODE_TRIAL_STEPS; /* the rest of the epoch: the general path */
        return;
    }
    if (d->epoch_step == DECODE_TRIAL_STEPS - 1) {
        int n = DECODE_TRIAL_STEPS / 2;
        d->chosen = median_ns(d->trial_ns[1], n) <= median_ns(d->trial_ns[0], n);
    }
    d->epoch_step = (d->epoch_step + 1) % DECODE_EPOCH_STEPS;
}

int64_t csd_decode_step_taken(const csd_model *m) { return m->decode ? m->decode->taken : 0; }

/* One thread's walk through the job. */
typedef struct step_run {
    csd_model *m;
    const csd_batch *b;
    csd_decode_step *d;
    step_thread *th;
    csd_pool_barrier *barrier;
    int64_t passed;        /* barriers this thread has passed */
    int set;               /* the lanes plan the next matmul uses */
    csd_lanes_ahead ahead; /* the next matmul's first weights, read while waiting */
    int ith, nth;
} step_run;

static bool read_ahead(void *ctx) { return csd_lanes_ahead_step(&((step_run *)ctx)->ahead); }

/* Waiting threads read their next matmul's first weights (s->ahead, set after each matmul for
 * the next one): between two matmuls nothing else streams, and that read is where the thread will
 * start. Token time 0.989-0.999 against waiting idle, median per run (docs/kernels.md). */
static void meet(step_run *s) {
    csd_pool_barrier_wait_idle(s->barrier, &s->passed, s->nth, read_ahead, s);
}

/* This thread's even slice of w's row blocks (o_proj and down start on these). */
static void even_slice(const step_run *s, const csd_qmat *w, int64_t *b0, int64_t *b1) {
    csd_split_range(csd_quant_blocks(w->rows), s->ith, s->nth, b0, b1);
}

/* The read-ahead for a matmul whose threads start on even slices (lanes_even). */
static void ahead_even(step_run *s, const csd_qmat *w) {
    int64_t b0, b1;
    even_slice(s, w, &b0, &b1);
    csd_lanes_ahead_set(&s->ahead, &w, b0, b1);
}

/* Sets this thread's lanes of the next plan to blocks [b0, b1). A thread may take rows from the
 * others' lanes only once every thread has set them: a barrier must come between this and the
 * plan's csd_lanes_work. */
static csd_lanes *lanes_set(step_run *s, int64_t b0, int64_t b1) {
    csd_lanes *l = s->d->lanes[s->set];
    s->set ^= 1;
    csd_lanes_own(l, s->ith, b0, b1);
    return l;
}

/* A matmul whose threads start on even slices of its row blocks, set and met: after this every
 * thread's lanes are set and everything written before it is visible. */
static csd_lanes *lanes_even(step_run *s, const csd_qmat *w) {
    int64_t b0, b1;
    even_slice(s, w, &b0, &b1);
    csd_lanes *l = lanes_set(s, b0, b1);
    meet(s);
    return l;
}

/* The next plan, on this thread's owned blocks [b0, b1) of the matrices w, and its read-ahead. */
static csd_lanes *lanes_set_ahead(step_run *s, const csd_qmat *const *w, int64_t b0, int64_t b1) {
    csd_lanes_ahead_set(&s->ahead, w, b0, b1);
    return lanes_set(s, b0, b1);
}

/* Layer li's q/k/v plan and read-ahead, set before the barrier just ahead of that layer (none
 * past the last layer). */
static csd_lanes *qkv_ahead(step_run *s, int64_t li) {
    if (li >= s->m->w.layer_end - s->m->w.layer_begin) {
        csd_lanes_ahead_clear(&s->ahead);
        return NULL;
    }
    return lanes_set_ahead(s, s->d->qkv_w + li * 3 * s->nth, s->th->qkv0, s->th->qkv1);
}

static void residual_add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* The q/k/v plan `l` was set before the barrier that ended the previous layer (or the step's
 * first one); the gate/up plan is set here before the barrier after o_proj. A plan set ahead
 * saves the barrier that would otherwise stand between setting it and working on it, two a layer
 * (a barrier is a cross-core round trip). Setting it early is safe: the two plans alternate, and
 * the one set was last used by a matmul every thread finished before an earlier barrier. */
static csd_lanes *attention_block(step_run *s, int64_t li, float *x, csd_lanes *l) {
    csd_model *m = s->m;
    const csd_layer_weights *lw = &m->w.layers[li];
    step_thread *th = s->th;
    int64_t dim = m->cfg.dim, nq = 3 * s->nth;
    csd_rmsnorm(th->xn, x, lw->attn_norm, dim, m->cfg.norm_eps); /* input_layernorm */
    csd_quantize_act(th->act, th->xn, dim);
    /* q_proj, k_proj, v_proj */
    csd_lanes_work(l, s->d->qkv_w + li * nq, (int)nq, s->d->qkv_y + li * nq, th->act, s->ith,
                   s->nth);
    csd_attention_prefetch_units(m, s->b, li, th->kvh0, th->kvh1);
    ahead_even(s, &lw->wo);
    meet(s); /* the rows another thread took */
    csd_attention_units(m, s->b, li, th->kvh0, th->kvh1, s->ith);
    const csd_qmat *o = &lw->wo;
    l = lanes_even(s, o); /* and every head's output is in m->xb */
    csd_quantize_act(th->act, m->xb, m->q_dim);
    csd_lanes_work(l, &o, 1, &m->tmp, th->act, s->ith, s->nth); /* o_proj */
    /* the next plan: gate_proj, up_proj */
    l = lanes_set_ahead(s, s->d->gu_w + li * 2 * s->nth, th->gu0, th->gu1);
    meet(s);
    residual_add(x, m->tmp, dim);
    return l;
}

/* The gate/up plan `l` was set in attention_block; the next layer's q/k/v plan (if there is a
 * next layer) is set here before the barrier after down_proj, and returned. */
static csd_lanes *ffn_block(step_run *s, int64_t li, float *x, csd_lanes *l) {
    csd_model *m = s->m;
    const csd_layer_weights *lw = &m->w.layers[li];
    step_thread *th = s->th;
    int64_t dim = m->cfg.dim, hid = m->cfg.hidden_dim, ng = 2 * s->nth;
    csd_rmsnorm(th->xn, x, lw->ffn_norm, dim, m->cfg.norm_eps); /* post_attention_layernorm */
    csd_quantize_act(th->act, th->xn, dim);
    csd_lanes_work(l, s->d->gu_w + li * ng, (int)ng, s->d->gu_y + li * ng, th->act, s->ith, s->nth);
    ahead_even(s, &lw->down);
    meet(s); /* the rows another thread took */
    if (th->h1 > th->h0) csd_silu_mul(m->hb + th->h0, m->hb2 + th->h0, th->h1 - th->h0);
    csd_quantize_act_groups(s->d->act_down, m->hb, hid, th->g0, th->g1, th->part);
    const csd_qmat *down = &lw->down;
    l = lanes_even(s, down); /* and every part of the input is quantized */
    csd_lanes_work(l, &down, 1, &m->tmp, s->d->act_down, s->ith, s->nth); /* down_proj */
    l = qkv_ahead(s, li + 1); /* the next layer's q_proj, k_proj, v_proj */
    meet(s);
    residual_add(x, m->tmp, dim);
    return l;
}

typedef struct step_job {
    csd_model *m;
    const csd_batch *b;
    csd_pool_barrier barrier;
} step_job;

static void step_worker(void *ctx, int ith, int nth) {
    step_job *job = ctx;
    csd_model *m = job->m;
    csd_decode_step *d = m->decode;
    step_run s = {m, job->b, d, &d->threads[ith], &job->barrier, 0, 0, {{0}, {0}}, ith, nth};
    float *x = s.th->x;
    /* Thread 0's copy is m->x itself; it first changes it after the first barrier. */
    if (ith > 0) memcpy(x, m->x, (size_t)m->cfg.dim * sizeof(float));
    csd_lanes *l = qkv_ahead(&s, 0); /* the first layer's q/k/v */
    meet(&s);
    int64_t n_layers = m->w.layer_end - m->w.layer_begin;
    for (int64_t li = 0; li < n_layers; li++) {
        l = attention_block(&s, li, x, l);
        l = ffn_block(&s, li, x, l);
    }
}

void csd_decode_step_layers(csd_model *m, const csd_batch *b) {
    step_job job = {m, b, {0}};
    csd_pool_run(m->pool, step_worker, &job);
}
