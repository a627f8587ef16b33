/* bench_internal: what the parts of `cascadia bench` share: the parsed flags, the seeded token
 * generator, and the three measurements (memory bandwidth; the engine under concurrency; the fleet
 * breakdown). cmd_bench.c parses flags and runs the single-model benchmark (prompt processing,
 * generation, roofline); bench_membw.c and bench_engine.c hold the rest. See docs/benchmarks.md. */
#ifndef CSD_BENCH_INTERNAL_H
#define CSD_BENCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli_json.h"
#include "core/err.h"
#include "core/pool.h"
#include "draft_setup.h"
#include "fleet_setup.h"
#include "model/model.h"

/* Concurrency levels one run may list (--concurrency 1,2,4,...). */
#define CSD_BENCH_MAX_LEVELS 16
/* Most concurrent streams one level may ask for (the engine's slots). */
#define CSD_BENCH_MAX_STREAMS 256

typedef struct csd_bench_args {
    const char *model_dir;        /* NULL with --fleet */
    csd_model_opts model;         /* --precision, -t/--threads, --ctx, --kv-type */
    int64_t n_prompt;             /* -p: prompt tokens of the pp test (0: skip it) */
    int64_t n_gen;                /* -n: generated tokens of the tg test (0: skip it) */
    int64_t depth;                /* -d: tokens already in the cache before each pp/tg test */
    int reps;                     /* -r: repetitions of every test */
    bool json;                    /* one JSON object (or list) on stdout instead of a table */
    uint64_t seed;                /* token ids are drawn from it */
    int64_t membw_mib;            /* size of the bandwidth test's buffer (0: skip the test) */
    int64_t peak_min_mib;         /* passes this long or longer may raise the peak (set_peak) */
    int levels[CSD_BENCH_MAX_LEVELS]; /* --concurrency */
    int n_levels;
    int64_t stream_prompt;        /* prompt tokens of each concurrent stream */
    int64_t spec_draft;           /* --spec-draft: also run each level with speculation */
    csd_cli_draft draft;          /* --draft-model: the speculation's drafts come from it */
    csd_cli_fleet fleet;
} csd_bench_args;

/* A tiny seeded generator (splitmix64) for reproducible random token ids. */
static inline uint64_t csd_bench_rand(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Fills ids with n token ids in [0, vocab), avoiding the first few (special) ids. */
void csd_cli_bench_random_ids(int32_t *ids, int64_t n, int64_t vocab, uint64_t *state);

/* The 1-minute load average (/proc/loadavg), or -1 where there is none: printed next to every
 * figure, since a benchmark on a shared machine means little without it. */
double csd_cli_bench_loadavg(void);

/* Which binary and machine made a result, so that figures copied into docs/ can be traced back:
 * o gets "version", "build_commit" and "cpu"; the text form is the table's last line
 * (llama-bench's "build:" line). */
void csd_cli_bench_json_build(json_t *o);
void csd_cli_bench_print_build(void);

/* Mean and sample standard deviation of v[0..n). */
void csd_cli_bench_stats(const double *v, int n, double *mean, double *sd);

/* How a read pass walks each thread's slice: csd_read_streams' streams and prefetch hint. */
typedef struct csd_bench_read_way {
    int streams; /* 1..4 parts side by side */
    bool nta;    /* non-temporal prefetch (the matvec's), else into L1/L2 */
} csd_bench_read_way;

/* Every pass of the read test, by way, so that its best pass can be set beside the same way's
 * median pass: on a shared host the best of many 30 ms passes sits well above what the loop
 * sustains (docs/benchmarks.md, "Methodology"). */
#define CSD_BENCH_READ_PARTS 4   /* csd_read_streams' 1..CSD_READ_STREAMS_MAX parts */
#define CSD_BENCH_MAX_PASSES 32  /* per way; further passes are not recorded */
typedef struct csd_bench_passes {
    double gbs[2][CSD_BENCH_READ_PARTS][CSD_BENCH_MAX_PASSES]; /* [nta][streams - 1][pass] */
    int n[2][CSD_BENCH_READ_PARTS];
} csd_bench_passes;

/* The median rate (GB/s) of way's recorded passes (the mean of the middle two for an even
 * count), *n_passes (when not NULL) their number; 0 when there are none. */
double csd_cli_bench_median_gbs(const csd_bench_passes *p, csd_bench_read_way way, int *n_passes);

/* Read bandwidth in GB/s (1e9 bytes/s) over a buffer of mib MiB, best of reps passes in each way
 * (1 to 4 streams per thread, each prefetch hint; best, when not NULL, gets the winning way),
 * every pool thread reading its own contiguous slice (STREAM "read": a sum). The buffer is
 * written first by the same threads (first touch), so it is backed by real pages. passes, when not
 * NULL, gets every pass added to what it holds. */
int csd_cli_bench_membw(csd_pool *pool, int64_t mib, int reps, double *gbs,
                        csd_bench_read_way *best, csd_bench_passes *passes, csd_err *err);

/* A bandwidth a benchmark run sustained (GB/s), over passes of pass_bytes each. */
typedef struct csd_bench_rate {
    const char *source; /* e.g. "paired reads" */
    double gbs;
    size_t pass_bytes;
} csd_bench_rate;

/* The peak bandwidth of the roofline: the read test's best pass (test_gbs), raised to the highest
 * of the n rates whose passes read at least min_bytes (shorter ones run from cache, and the
 * roofline is a memory one). *source gets the winner's name, "read test" when none beats it. */
double csd_cli_bench_peak(double test_gbs, const csd_bench_rate *rates, int n, size_t min_bytes,
                          const char **source);

/* A buffer read by the pool threads on demand: the paired roofline reads one of exactly a token's
 * bytes after every generated token. */
typedef struct csd_bench_reader csd_bench_reader;
int csd_cli_bench_reader_create(csd_pool *pool, size_t bytes, csd_bench_reader **out, csd_err *err);
/* One read pass over the whole buffer, walked the given way; returns its seconds. */
double csd_cli_bench_reader_pass(csd_bench_reader *r, csd_bench_read_way way);
size_t csd_cli_bench_reader_bytes(const csd_bench_reader *r);
void csd_cli_bench_reader_destroy(csd_bench_reader *r);

/* `--concurrency`: the engine over a local pipeline (model_dir) or the fleet. Prints the table or
 * the JSON list. Returns the exit code. */
int csd_cli_bench_concurrency(csd_bench_args *a);

/* `--fleet` without --concurrency: single-stream generation through the fleet and the per-token
 * breakdown. Decode steps are greedy (argmax_only: the last stage sends back the token id, as for
 * `run`); the prompt test asks for logits. Returns the exit code. */
int csd_cli_bench_fleet(csd_bench_args *a);

#endif
