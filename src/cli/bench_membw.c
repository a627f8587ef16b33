/* bench_membw: the memory bandwidth a generation step can hope for, measured here rather than
 * quoted: a STREAM-like read (a sum over a buffer much larger than the caches), on the same pool
 * threads the model uses. Decode reads every weight once per token, so bytes per token divided by
 * this bandwidth is the generation roofline. The read is the kernel table's csd_read_streams
 * (its widest loads, prefetched like the matvec), walking 1 to 4 parts per thread side by side;
 * the best of all is the bandwidth. (A plain C loop measured ~15% below what vector loads over
 * three streams reach here: a roofline from it would be too easy.) */
#include <string.h>

#include "bench_internal.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "kern/kern.h"

#define MEMBW_MAX_STREAMS 4

typedef struct membw_job {
    uint64_t *buf;
    int64_t n;          /* uint64 words */
    bool fill;          /* first pass: write (first touch) instead of read */
    int streams;        /* parts per thread read side by side */
    uint64_t sums[CSD_BENCH_MAX_STREAMS]; /* per thread: stored, so the reads are not optimised out */
} membw_job;

static void membw_fn(void *ctx, int ith, int nth) {
    membw_job *j = ctx;
    int64_t b, e;
    csd_split_range(j->n / 8, ith, nth, &b, &e); /* in 64-byte lines */
    uint64_t *p = j->buf + b * 8, *end = j->buf + e * 8;
    if (j->fill) {
        for (uint64_t *q = p; q < end; q++) *q = (uint64_t)(q - j->buf) * 0x9e3779b97f4a7c15ull;
        return;
    }
    size_t bytes = (size_t)(end - p) * sizeof *p;
    bytes -= bytes % (64 * (size_t)j->streams); /* whole lines in every part */
    uint64_t sum = csd_read_streams((const uint8_t *)p, bytes, j->streams);
    if (ith < CSD_BENCH_MAX_STREAMS) j->sums[ith] = sum;
}

int csd_cli_bench_membw(csd_pool *pool, int64_t mib, int reps, double *gbs, csd_err *err) {
    *gbs = 0;
    size_t bytes = (size_t)mib << 20;
    membw_job *j = csd_alloc(sizeof *j);
    if (!j) return csd_err_set(err, CSD_ENOMEM, "bandwidth test state");
    j->buf = csd_alloc(bytes);
    if (!j->buf) {
        csd_free(j);
        return csd_err_set(err, CSD_ENOMEM, "bandwidth test buffer of %lld MiB", (long long)mib);
    }
    j->n = (int64_t)(bytes / sizeof(uint64_t));
    j->fill = true;
    csd_pool_run(pool, membw_fn, j);
    j->fill = false;
    j->streams = 1;
    csd_pool_run(pool, membw_fn, j); /* warm-up pass: page-table and TLB state settle */
    double best = 1e30;
    for (int r = 0; r < (reps > 0 ? reps : 1); r++)
        for (int s = 1; s <= MEMBW_MAX_STREAMS; s++) {
            j->streams = s;
            uint64_t t0 = csd_now_ns();
            csd_pool_run(pool, membw_fn, j);
            double t = (double)(csd_now_ns() - t0) * 1e-9;
            if (t < best) best = t;
        }
    *gbs = (double)bytes / best / 1e9;
    csd_free(j->buf);
    csd_free(j);
    return 0;
}
