/* matvec_lanes: how the threads share a one-token Q matvec (a decode step's matmuls).
 *
 * The row blocks of the matrices (one after another) are cut into one contiguous slice per
 * thread, and each slice into CSD_MV_STREAMS lanes. A thread walks its lanes side by side, so
 * every lane is one long sequential weight stream for the whole job. A thread whose lanes are
 * empty takes the back half of the fullest lane left (its owner keeps the front), until no lane
 * has work. So:
 * - each thread starts CSD_MV_STREAMS streams per matrix, not a pair per chunk: the guided
 *   chunks cut a 2-4 MB matrix into 12 pieces, and each piece's start cost ~0.6 us (measured per
 *   chunk: 42-63 KB chunks streamed at 25-28 GB/s a thread, 0.7-3 MB ones at 38-40);
 * - the threads finish within about one block of each other, whatever their speed, and a
 *   preempted thread's blocks are taken by whoever runs.
 * Measured against the guided chunks (the same binary switching token by token, 1.1B, 2
 * threads): token time 0.992-0.995 (INT4, AVX-512), 0.991-0.998 (INT8), 0.994-0.995 (INT4 with
 * the AVX2 and AVX-VNNI tables).
 *
 * A kernel call runs every block a thread has claimed in its lanes, as far as they stay in one
 * matrix: a run of blocks per lane, not one block each. The work between two calls (finding the
 * blocks, the claims, the call) is small, but while it runs no load is issued: one block per call
 * made token time 1.9-2.8% longer (INT4, AVX-512), ~2% (AVX2, AVX-VNNI), 2.7% (INT8).
 * docs/kernels.md has the rest.
 *
 * Each block is computed by exactly one thread with the same kernel and the same float
 * sequence as in any other split, so results do not depend on the thread count or on who took
 * what. The lanes live on the caller's stack; nothing is allocated. */
#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/dtype.h"
#include "core/pool.h"
#include "kern_internal.h"

/* A lane is one atomic word: next block to run at the front (low 32 bits), end at the back
 * (high 32 bits); empty when front >= back. The owner moves the front, thieves move the back. */
typedef struct thread_lanes {
    _Alignas(64) _Atomic uint64_t lane[CSD_MV_STREAMS];
} thread_lanes;

/* An owner claims 1/LANE_BITE_DIV of what is left in its lane at a time (at least one block),
 * and runs the claim in one kernel call: long runs while the lane is long, single blocks near its
 * end, where thieves need something to take. Measured with runs (token time against 1/4): 1/2
 * 0.991-0.999 (INT4 AVX-512), 0.987-0.989 (AVX2), 0.996-0.998 (INT8); 1/8 +1%; the whole lane at
 * once (nothing left to steal) +0.1 to +13%. */
#define LANE_BITE_DIV 2
/* Lane words hold block indices in 32 bits. */
#define LANE_MAX_BLOCKS ((int64_t)1 << 32)

typedef struct lanes_job {
    const csd_kern_ops *ops;
    const csd_qmat *const *w;
    float *const *y;
    int n_mats;
    const uint8_t *act;
    thread_lanes *threads;
    int n_threads;
} lanes_job;

static uint64_t lane_word(int64_t front, int64_t back) {
    return (uint64_t)front | ((uint64_t)back << 32);
}
static int64_t lane_front(uint64_t v) { return (int64_t)(v & 0xffffffffu); }
static int64_t lane_back(uint64_t v) { return (int64_t)(v >> 32); }

/* The owner's bite: [*b0, *b1) from the front of its lane; false when the lane is empty. */
static bool lane_take_front(_Atomic uint64_t *lane, int64_t *b0, int64_t *b1) {
    uint64_t v = atomic_load_explicit(lane, memory_order_relaxed);
    for (;;) {
        int64_t f = lane_front(v), b = lane_back(v);
        if (f >= b) return false;
        int64_t k = (b - f) / LANE_BITE_DIV > 1 ? (b - f) / LANE_BITE_DIV : 1;
        if (atomic_compare_exchange_weak_explicit(lane, &v, lane_word(f + k, b),
                                                  memory_order_relaxed, memory_order_relaxed)) {
            *b0 = f;
            *b1 = f + k;
            return true;
        }
    }
}

/* A thief's take: the back half of the fullest lane of any thread becomes the thief's own lane
 * `mine` (empty: nobody else writes an empty lane). False when every lane is empty. */
static bool lane_steal_half(const lanes_job *j, _Atomic uint64_t *mine) {
    for (;;) {
        _Atomic uint64_t *fullest = NULL;
        uint64_t seen = 0;
        int64_t most = 0;
        for (int t = 0; t < j->n_threads; t++)
            for (int s = 0; s < CSD_MV_STREAMS; s++) {
                _Atomic uint64_t *l = &j->threads[t].lane[s];
                uint64_t v = atomic_load_explicit(l, memory_order_relaxed);
                int64_t left = lane_back(v) - lane_front(v);
                if (left > most) {
                    most = left;
                    fullest = l;
                    seen = v;
                }
            }
        if (!fullest) return false;
        int64_t f = lane_front(seen), b = lane_back(seen), mid = b - (b - f + 1) / 2;
        if (atomic_compare_exchange_weak_explicit(fullest, &seen, lane_word(f, mid),
                                                  memory_order_relaxed, memory_order_relaxed)) {
            atomic_store_explicit(mine, lane_word(mid, b), memory_order_relaxed);
            return true;
        }
    }
}

/* Claimed blocks of one lane from its front, within one matrix: its weights and output rows. */
typedef struct lane_run {
    const csd_qmat *w;
    float *y;
    const uint8_t *blk;
    int64_t row; /* the first block's first row */
    int64_t len; /* blocks */
} lane_run;

/* Which matrix block gb of the matrices one after another is in: its index, and *gb becomes the
 * block's index inside it. */
static int locate_block(const csd_qmat *const *w, int64_t *gb) {
    int i = 0;
    while (*gb >= csd_quant_blocks(w[i]->rows)) *gb -= csd_quant_blocks(w[i++]->rows);
    return i;
}

static const uint8_t *block_data(const csd_qmat *w, int64_t b) {
    return (const uint8_t *)w->data + (size_t)b * csd_quant_block_bytes(w->dtype, w->cols);
}

/* The run from block gb of the matrices one after another: at most avail blocks, up to the end of
 * gb's matrix. */
static lane_run locate_run(const lanes_job *j, int64_t gb, int64_t avail) {
    int i = locate_block(j->w, &gb);
    const csd_qmat *w = j->w[i];
    int64_t left = csd_quant_blocks(w->rows) - gb;
    lane_run r = {w, j->y[i] + gb * CSD_QUANT_BLOCK_ROWS, block_data(w, gb),
                  gb * CSD_QUANT_BLOCK_ROWS, avail < left ? avail : left};
    return r;
}

/* Rows of the last block when a run is cut to len blocks (fewer than 16 only at a matrix end). */
static int run_last_rows(const lane_run *r, int64_t len) {
    int64_t row = r->row + (len - 1) * CSD_QUANT_BLOCK_ROWS;
    return (int)(r->w->rows - row < CSD_QUANT_BLOCK_ROWS ? r->w->rows - row : CSD_QUANT_BLOCK_ROWS);
}

static const csd_q_streams_fn *matvec_fns(const csd_kern_ops *ops, int dtype) {
    return dtype == CSD_DTYPE_Q4 ? ops->matvec_q4 : ops->matvec_q8;
}

/* Runs the claimed blocks at the fronts of n lanes (avail[i] blocks from first[i]) side by side,
 * as many of each as all of them have in their current matrix; lanes whose matrices differ in
 * dtype (Q4 next to Q8) one by one, each its whole run. ran[i]: blocks done in lane i. */
static void run_lanes(const lanes_job *j, const int64_t *first, const int64_t *avail, int n,
                      int64_t *ran) {
    lane_run r[CSD_MV_STREAMS];
    float *y[CSD_MV_STREAMS];
    int nrows[CSD_MV_STREAMS];
    const uint8_t *blk[CSD_MV_STREAMS];
    bool same = true;
    int64_t len = INT64_MAX;
    for (int i = 0; i < n; i++) {
        r[i] = locate_run(j, first[i], avail[i]);
        same = same && r[i].w->dtype == r[0].w->dtype;
        len = r[i].len < len ? r[i].len : len;
    }
    int64_t ng = csd_quant_groups(r[0].w->cols); /* the matrices share cols */
    for (int i = 0; i < n; i++) {
        ran[i] = same ? len : r[i].len;
        y[i] = r[i].y;
        blk[i] = r[i].blk;
        nrows[i] = run_last_rows(&r[i], ran[i]);
    }
    if (same) {
        matvec_fns(j->ops, r[0].w->dtype)[n - 1](y, nrows, blk, j->act, ng, len,
                                                 j->ops->mv_pf_ahead);
        return;
    }
    for (int i = 0; i < n; i++)
        matvec_fns(j->ops, r[i].w->dtype)[0](&y[i], &nrows[i], &blk[i], j->act, ng, ran[i],
                                             j->ops->mv_pf_ahead);
}

/* Thread slot ith's lanes, then stolen halves. */
static void lanes_run(const lanes_job *j, int ith) {
    thread_lanes *own = &j->threads[ith];
    int64_t next[CSD_MV_STREAMS] = {0}, end[CSD_MV_STREAMS] = {0}; /* claimed, not yet run */
    for (;;) {
        int64_t first[CSD_MV_STREAMS], avail[CSD_MV_STREAMS], ran[CSD_MV_STREAMS];
        int lane[CSD_MV_STREAMS], n = 0;
        for (int s = 0; s < CSD_MV_STREAMS; s++) {
            if (next[s] >= end[s] && !lane_take_front(&own->lane[s], &next[s], &end[s])) continue;
            first[n] = next[s];
            avail[n] = end[s] - next[s];
            lane[n++] = s;
        }
        if (n > 0) {
            run_lanes(j, first, avail, n, ran);
            for (int i = 0; i < n; i++) next[lane[i]] += ran[i];
            continue;
        }
        bool stole = false;
        for (int s = 0; s < CSD_MV_STREAMS; s++) stole = lane_steal_half(j, &own->lane[s]) || stole;
        if (!stole) return;
    }
}

/* Pool chunk ith of a csd_matvec_lanes job. */
static void lanes_worker(void *ctx, int ith, int nth) {
    (void)nth;
    lanes_run(ctx, ith);
}

static int64_t total_blocks(const csd_qmat *const *w, int n_mats) {
    int64_t total = 0;
    for (int i = 0; i < n_mats; i++) total += csd_quant_blocks(w[i]->rows);
    return total;
}

/* The table has lanes kernels, and total row blocks fit the lane words. */
static bool lanes_can(const csd_kern_ops *ops, int64_t total) {
    return ops->matvec_q4 && ops->matvec_q8 && total < LANE_MAX_BLOCKS;
}

/* Thread t's lanes: [b, e) of the row blocks cut into CSD_MV_STREAMS equal parts. */
static void lanes_set(thread_lanes *t, int64_t b, int64_t e) {
    if (e < b) e = b; /* nothing, never a negative length the lane word would wrap */
    for (int s = 0; s < CSD_MV_STREAMS; s++) {
        int64_t lb, le;
        csd_split_range(e - b, s, CSD_MV_STREAMS, &lb, &le);
        atomic_store_explicit(&t->lane[s], lane_word(b + lb, b + le), memory_order_relaxed);
    }
}

bool csd_matvec_lanes(const csd_kern_ops *ops, csd_pool *pool, const csd_qmat *const *w, int n_mats,
                      float *const *y, const uint8_t *act) {
    int64_t total = total_blocks(w, n_mats);
    if (!lanes_can(ops, total)) return false;
    int n_threads = csd_pool_size(pool);
    thread_lanes threads[CSD_POOL_MAX_THREADS];
    for (int t = 0; t < n_threads; t++) {
        int64_t b, e;
        csd_split_range(total, t, n_threads, &b, &e);
        lanes_set(&threads[t], b, e);
    }
    lanes_job job = {ops, w, y, n_mats, act, threads, n_threads};
    csd_pool_run(pool, lanes_worker, &job);
    return true;
}

/* ---- Lanes driven from inside a caller's own pool job (kern.h: csd_lanes) ---- */

struct csd_lanes {
    thread_lanes threads[CSD_POOL_MAX_THREADS];
};

size_t csd_lanes_bytes(void) { return sizeof(csd_lanes); }

bool csd_lanes_fit(const csd_qmat *const *w, int n_mats) {
    const csd_kern_ops *ops = csd_kern_ops_current();
    for (int i = 0; i < n_mats; i++)
        if ((w[i]->dtype != CSD_DTYPE_Q4 && w[i]->dtype != CSD_DTYPE_Q8) ||
            w[i]->cols != w[0]->cols)
            return false;
    return n_mats > 0 && lanes_can(ops, total_blocks(w, n_mats));
}

void csd_lanes_own(csd_lanes *l, int ith, int64_t begin, int64_t end) {
    lanes_set(&l->threads[ith], begin, end);
}

void csd_lanes_work(csd_lanes *l, const csd_qmat *const *w, int n_mats, float *const *y,
                    const uint8_t *act, int ith, int nth) {
    lanes_job job = {csd_kern_ops_current(), w, y, n_mats, act, l->threads, nth};
    lanes_run(&job, ith);
}

/* ---- Reading a plan's first weights ahead (kern.h: csd_lanes_ahead) ---- */

static_assert(CSD_LANES_AHEAD_STREAMS == CSD_MV_STREAMS, "one read-ahead stream per lane");
/* Bytes read ahead per lane: what a thread streams in about 2 us, the length of a typical wait
 * at a decode step's barrier; measured with 32, 64 and 256 KB (docs/kernels.md). */
#define LANES_AHEAD_BYTES ((size_t)64 << 10)
/* Lines asked for per lane and step: a few, so the waiting thread still sees the barrier open
 * within a fraction of a microsecond. */
#define LANES_AHEAD_LINES 2

void csd_lanes_ahead_set(csd_lanes_ahead *a, const csd_qmat *const *w, int64_t begin,
                         int64_t end) {
    for (int s = 0; s < CSD_MV_STREAMS; s++) {
        int64_t lb, le; /* the lane lanes_set would make, and its matrix */
        csd_split_range(end - begin, s, CSD_MV_STREAMS, &lb, &le);
        a->next[s] = a->end[s] = NULL;
        if (le <= lb) continue;
        int64_t gb = begin + lb;
        const csd_qmat *m = w[locate_block(w, &gb)];
        int64_t in_mat = csd_quant_blocks(m->rows) - gb;
        int64_t blocks = in_mat < le - lb ? in_mat : le - lb;
        size_t bytes = (size_t)blocks * csd_quant_block_bytes(m->dtype, m->cols);
        a->next[s] = block_data(m, gb);
        a->end[s] = a->next[s] + (bytes < LANES_AHEAD_BYTES ? bytes : LANES_AHEAD_BYTES);
    }
}

void csd_lanes_ahead_clear(csd_lanes_ahead *a) {
    for (int s = 0; s < CSD_MV_STREAMS; s++) a->next[s] = a->end[s] = NULL;
}

bool csd_lanes_ahead_step(csd_lanes_ahead *a) {
    bool more = false;
    for (int s = 0; s < CSD_MV_STREAMS; s++) {
        for (int i = 0; i < LANES_AHEAD_LINES && a->next[s] < a->end[s]; i++, a->next[s] += 64)
            __builtin_prefetch(a->next[s], 0, 2); /* into L2 (prefetcht1) */
        more = more || a->next[s] < a->end[s];
    }
    return more;
}
