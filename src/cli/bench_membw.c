/* bench_membw: the memory bandwidth a generation step can hope for, measured here rather than
 * quoted: a STREAM-like read (a sum over a buffer much larger than the caches), on the same pool
 * threads the model uses. Decode reads every weight once per token, so bytes per token divided by
 * this bandwidth is the generation roofline. The read is the kernel table's csd_read_streams
 * (its widest loads, prefetched like the matvec), walking 1 to 4 parts per thread side by side,
 * with the matvec's non-temporal prefetch and with the ordinary one: the best way counts.
 * (A plain C loop measured ~15% below what vector loads over three streams reach here: a roofline
 * from it would be too easy.)
 *
 * Two figures come from it. The peak: the best of many passes over a 1 GiB buffer. The paired
 * bandwidth: a buffer of exactly the bytes a token reads, read once after every generated token,
 * so that the reads see the same machine, in the same seconds, as the tokens they are compared
 * with (on a shared host the bandwidth drifts by tens of percent within seconds).
 *
 * The peak is an upper bound on every rate the run measured: when the paired reads, the weight
 * stream or the tokens themselves sustained more than the read test's best pass (the test ran in
 * a slower moment of the host), their rate is the peak (csd_cli_bench_peak). Stop 23 saw the
 * weight stream alone at 101% of the read test in 2 of 6 runs. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "kern/kern.h"

struct csd_bench_reader {
    csd_pool *pool;
    uint64_t *buf;
    int64_t n;          /* uint64 words */
    bool fill;          /* first pass: write (first touch) instead of read */
    csd_bench_read_way way;
    /* per thread: stored, so the reads are not optimised out */
    uint64_t sums[CSD_BENCH_MAX_STREAMS];
};

static void reader_fn(void *ctx, int ith, int nth) {
    csd_bench_reader *j = ctx;
    int64_t b, e;
    csd_split_range(j->n / 8, ith, nth, &b, &e); /* in 64-byte lines */
    uint64_t *p = j->buf + b * 8, *end = j->buf + e * 8;
    if (j->fill) {
        for (uint64_t *q = p; q < end; q++) *q = (uint64_t)(q - j->buf) * 0x9e3779b97f4a7c15ull;
        return;
    }
    size_t bytes = (size_t)(end - p) * sizeof *p;
    bytes -= bytes % (64 * (size_t)j->way.streams); /* whole lines in every part */
    uint64_t sum = csd_read_streams((const uint8_t *)p, bytes, j->way.streams, j->way.nta);
    if (ith < CSD_BENCH_MAX_STREAMS) j->sums[ith] = sum;
}

int csd_cli_bench_reader_create(csd_pool *pool, size_t bytes, csd_bench_reader **out,
                                csd_err *err) {
    *out = NULL;
    csd_bench_reader *j = csd_alloc(sizeof *j);
    if (!j) return csd_err_set(err, CSD_ENOMEM, "bandwidth test state");
    memset(j, 0, sizeof *j);
    bytes = (bytes + 63) / 64 * 64;
    j->buf = csd_alloc(bytes);
    if (!j->buf) {
        csd_free(j);
        return csd_err_set(err, CSD_ENOMEM, "bandwidth test buffer of %.1f MiB",
                           (double)bytes / (1 << 20));
    }
    j->pool = pool;
    j->n = (int64_t)(bytes / sizeof(uint64_t));
    j->fill = true;
    csd_pool_run(pool, reader_fn, j);
    j->fill = false;
    j->way = (csd_bench_read_way){1, false};
    csd_pool_run(pool, reader_fn, j); /* warm-up pass: page-table and TLB state settle */
    *out = j;
    return 0;
}

double csd_cli_bench_reader_pass(csd_bench_reader *r, csd_bench_read_way way) {
    if (way.streams < 1) way.streams = 1;
    if (way.streams > CSD_READ_STREAMS_MAX) way.streams = CSD_READ_STREAMS_MAX;
    r->way = way;
    uint64_t t0 = csd_now_ns();
    csd_pool_run(r->pool, reader_fn, r);
    return (double)(csd_now_ns() - t0) * 1e-9;
}

size_t csd_cli_bench_reader_bytes(const csd_bench_reader *r) {
    return (size_t)r->n * sizeof(uint64_t);
}

void csd_cli_bench_reader_destroy(csd_bench_reader *r) {
    if (!r) return;
    csd_free(r->buf);
    csd_free(r);
}

static_assert(CSD_BENCH_READ_PARTS == CSD_READ_STREAMS_MAX, "one row of passes per way");

static void record_pass(csd_bench_passes *p, csd_bench_read_way way, size_t bytes, double secs) {
    int *n = &p->n[way.nta][way.streams - 1];
    if (*n >= CSD_BENCH_MAX_PASSES || secs <= 0) return;
    p->gbs[way.nta][way.streams - 1][(*n)++] = (double)bytes / secs / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double csd_cli_bench_median_gbs(const csd_bench_passes *p, csd_bench_read_way way, int *n_passes) {
    int n = 0;
    if (way.streams >= 1 && way.streams <= CSD_BENCH_READ_PARTS) n = p->n[way.nta][way.streams - 1];
    if (n_passes) *n_passes = n;
    if (n <= 0) return 0;
    double v[CSD_BENCH_MAX_PASSES];
    memcpy(v, p->gbs[way.nta][way.streams - 1], (size_t)n * sizeof *v);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int csd_cli_bench_membw(csd_pool *pool, int64_t mib, int reps, double *gbs,
                        csd_bench_read_way *best, csd_bench_passes *passes, csd_err *err) {
    *gbs = 0;
    csd_bench_reader *r;
    int rc = csd_cli_bench_reader_create(pool, (size_t)mib << 20, &r, err);
    if (rc) return rc;
    size_t bytes = csd_cli_bench_reader_bytes(r);
    double best_t = 1e30;
    for (int rep = 0; rep < (reps > 0 ? reps : 1); rep++)
        for (int nta = 0; nta <= 1; nta++)
            for (int s = 1; s <= CSD_READ_STREAMS_MAX; s++) {
                csd_bench_read_way way = {s, nta == 1};
                double t = csd_cli_bench_reader_pass(r, way);
                if (passes) record_pass(passes, way, bytes, t);
                if (t < best_t) {
                    best_t = t;
                    if (best) *best = way;
                }
            }
    *gbs = (double)bytes / best_t / 1e9;
    csd_cli_bench_reader_destroy(r);
    return 0;
}

double csd_cli_bench_peak(double test_gbs, const csd_bench_rate *rates, int n, size_t min_bytes,
                          const char **source) {
    double peak = test_gbs;
    *source = "read test";
    for (int i = 0; i < n; i++)
        if (rates[i].pass_bytes >= min_bytes && rates[i].gbs > peak) {
            peak = rates[i].gbs;
            *source = rates[i].source;
        }
    return peak;
}
