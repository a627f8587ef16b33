/* stream_bench: how fast the Q4 decode kernels stream weights, apart from any forward pass (not a
 * test; built with the project, run by hand; docs/benchmarks.md, "Results (stop 22)").
 *
 * Two tables, every variant run once per round, rounds alternating, so that all of them see the
 * same machine (on a shared host the bandwidth drifts by tens of percent within seconds):
 * 1. One long region per thread: the bandwidth test's read (csd_read_streams, 1-4 parts side by
 *    side, with the non-temporal prefetch the kernels use and with the ordinary one, as `bench`'s
 *    read test tries both) against the Q4 matvec kernel walking the same bytes as
 *    1..CSD_MV_STREAMS streams. Tells whether the kernel itself keeps up with a bare read.
 * 2. The Q4 matrices of a TinyLlama-1.1B-shaped stage (22 layers; random bytes, valid scales)
 *    through csd_matvec_lanes, cut into pool jobs in several ways: as decode does (q/k/v, o,
 *    gate/up, down: 4 jobs a layer), one matrix a job, one job per input width a layer, or a
 *    width's matrices of every layer in one job (the stream ceiling's shape); and the stage's
 *    Q8 output head (32000 x 2048) alone, the Q8 kernel's rate on the model's largest matrix.
 * 3. With -a LIST only: the decode's pass (table 2's 4 jobs a layer, then the head) with each
 *    prefetch distance in LIST (bytes, as CSD_PF_AHEAD takes them), each round's time against
 *    the first distance's in the same round (every other round runs the list backwards). Tells
 *    which distance suits this machine's memory (docs/kernels.md, "Prefetch distance").
 *
 *   build/stream_bench [-t THREADS] [-r ROUNDS] [-m MIB] [-a BYTES,BYTES,...]
 *   (defaults: all cores, 8, 1024, no table 3) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/pool.h"
#include "kern/kern.h"
#include "kern/kern_internal.h"
#include "kern/quant.h"

#define MAX_ROUNDS 64
#define LAYERS 22
#define LAYER_MATS 7 /* q, k, v, o, gate, up, down */
#define DIM 2048
#define HIDDEN 5632
#define VOCAB 32000     /* the Q8 output head: VOCAB x DIM */
#define MAX_DISTANCES 8 /* table 3's prefetch distances */

static const int64_t MAT_ROWS[LAYER_MATS] = {DIM, 256, 256, DIM, HIDDEN, HIDDEN, DIM};
static const int64_t MAT_COLS[LAYER_MATS] = {DIM, DIM, DIM, DIM, DIM, DIM, HIDDEN};

typedef struct bench {
    csd_pool *pool;
    const csd_kern_ops *ops;
    uint8_t *region; /* Q4 blocks of DIM columns: table 1's streams, table 2's matrices */
    size_t region_bytes;
    uint8_t *act[2]; /* quantized activations of DIM and HIDDEN inputs */
    float *out;      /* table 1's outputs: 16 floats per block */
    csd_qmat mats[LAYERS][LAYER_MATS];
    float *mat_out[LAYERS][LAYER_MATS];
    csd_qmat head; /* Q8, after the layers' matrices */
    float *head_out;
    size_t model_bytes; /* the layers' matrices */
    int streams;        /* table 1: the current variant */
    bool kernel;
    bool nta; /* table 1's reads: the non-temporal prefetch hint (else the ordinary one) */
} bench;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Every group scale of a Q4 or Q8 matrix of `blocks` 16-row blocks and `cols` inputs at p set to
 * 1.0, so that the float part of the kernels never sees a NaN or a subnormal. */
static void set_scales(uint8_t *p, int dtype, int64_t blocks, int64_t cols) {
    size_t bb = csd_quant_block_bytes(dtype, cols);
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t g = 0; g < csd_quant_groups(cols); g++) {
            size_t at = (size_t)b * bb + csd_quant_scale_offset(dtype, g);
            for (int r = 0; r < CSD_QUANT_BLOCK_ROWS; r++) {
                uint16_t one = 0x3c00; /* f16 1.0 */
                memcpy(p + at + 2 * (size_t)r, &one, 2);
            }
        }
}

/* Random weight bytes, with valid scales where table 1 reads them (blocks of DIM inputs). */
static void fill_weights(uint8_t *p, size_t bytes) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = rng_next(&s);
        memcpy(p + i, &v, 8);
    }
    set_scales(p, CSD_DTYPE_Q4, (int64_t)(bytes / csd_quant_block_bytes(CSD_DTYPE_Q4, DIM)), DIM);
}

static uint8_t *make_act(const csd_kern_ops *ops, int64_t cols) {
    float *x = csd_alloc_array((size_t)cols, sizeof *x);
    uint8_t *act = csd_alloc(csd_quant_act_stride(cols));
    if (!x || !act) {
        fprintf(stderr, "stream_bench: out of memory (activations)\n");
        exit(1);
    }
    uint64_t s = 12345;
    for (int64_t i = 0; i < cols; i++) x[i] = (float)(rng_next(&s) >> 40) / (float)(1 << 24) - 0.5f;
    ops->quantize_act_q8(act, x, cols);
    csd_free(x);
    return act;
}

/* Table 2's matrices, one after another in the region (4 KiB apart, as separate tensors), then
 * the Q8 head, each with its own valid scales (only scale bytes are written: table 1's stay valid
 * too). */
static int lay_out_model(bench *b) {
    size_t off = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < LAYER_MATS; k++) {
            size_t n = csd_qmat_bytes(CSD_DTYPE_Q4, MAT_ROWS[k], MAT_COLS[k]);
            if (off + n > b->region_bytes) return -1;
            b->mats[l][k] = (csd_qmat){CSD_DTYPE_Q4, MAT_ROWS[k], MAT_COLS[k], b->region + off, n};
            set_scales(b->region + off, CSD_DTYPE_Q4, csd_quant_blocks(MAT_ROWS[k]), MAT_COLS[k]);
            b->mat_out[l][k] = csd_alloc_array((size_t)MAT_ROWS[k], sizeof(float));
            if (!b->mat_out[l][k]) return -1;
            off += (n + 4095) / 4096 * 4096;
        }
    b->model_bytes = off;
    size_t n = csd_qmat_bytes(CSD_DTYPE_Q8, VOCAB, DIM);
    if (off + n > b->region_bytes) return -1;
    b->head = (csd_qmat){CSD_DTYPE_Q8, VOCAB, DIM, b->region + off, n};
    set_scales(b->region + off, CSD_DTYPE_Q8, csd_quant_blocks(VOCAB), DIM);
    b->head_out = csd_alloc_array(VOCAB, sizeof(float));
    return b->head_out ? 0 : -1;
}

/* Table 1, pool job: thread ith's part of the region as b->streams streams. */
static void long_stream_job(void *ctx, int ith, int nth) {
    bench *b = ctx;
    size_t bb = csd_quant_block_bytes(CSD_DTYPE_Q4, DIM);
    int64_t part_blocks = (int64_t)(b->region_bytes / (size_t)nth / bb);
    int64_t nb = part_blocks / b->streams; /* blocks per stream */
    const uint8_t *p = b->region + (size_t)ith * (size_t)part_blocks * bb;
    if (!b->kernel) {
        csd_read_streams(p, (size_t)(nb * b->streams) * bb, b->streams, b->nta);
        return;
    }
    float *y[CSD_MV_STREAMS];
    int nrows[CSD_MV_STREAMS];
    const uint8_t *blk[CSD_MV_STREAMS];
    for (int i = 0; i < b->streams; i++) {
        y[i] = b->out + ((size_t)ith * (size_t)part_blocks + (size_t)(i * nb)) * 16;
        nrows[i] = CSD_QUANT_BLOCK_ROWS;
        blk[i] = p + (size_t)(i * nb) * bb;
    }
    b->ops->matvec_q4[b->streams - 1](y, nrows, blk, b->act[0], csd_quant_groups(DIM), nb,
                                      b->ops->mv_pf_ahead);
}

/* Bytes table 1 reads with s streams on nth threads. */
static double long_stream_bytes(const bench *b, int s, int nth) {
    size_t bb = csd_quant_block_bytes(CSD_DTYPE_Q4, DIM);
    int64_t part_blocks = (int64_t)(b->region_bytes / (size_t)nth / bb);
    return (double)nth * (double)(part_blocks / s * s) * (double)bb;
}

/* Matrices [k0, k1) of layers [l0, l1) in one csd_matvec_lanes job; all of one input width. */
static void lanes(bench *b, int l0, int l1, int k0, int k1) {
    const csd_qmat *w[LAYERS * LAYER_MATS];
    float *y[LAYERS * LAYER_MATS];
    int n = 0;
    for (int l = l0; l < l1; l++)
        for (int k = k0; k < k1; k++) {
            w[n] = &b->mats[l][k];
            y[n++] = b->mat_out[l][k];
        }
    csd_matvec_lanes(b->ops, b->pool, w, n, y, b->act[MAT_COLS[k0] == DIM ? 0 : 1]);
}

enum { SPLIT_ALL, SPLIT_WIDTH, SPLIT_DECODE, SPLIT_MATRIX, HEAD_ONLY, N_SPLITS };
static const char *SPLIT_NAMES[N_SPLITS] = {
    "2 jobs: a width's matrices of all layers", "2 jobs a layer: one per input width",
    "4 jobs a layer: q/k/v, o, gate/up, down (decode)", "7 jobs a layer: one per matrix",
    "the Q8 output head alone (1 job)"};

/* Bytes one pass of split reads. */
static double pass_bytes(const bench *b, int split) {
    return split == HEAD_ONLY ? (double)b->head.nbytes : (double)b->model_bytes;
}

static void model_pass(bench *b, int split) {
    if (split == HEAD_ONLY) {
        const csd_qmat *w = &b->head;
        csd_matvec_lanes(b->ops, b->pool, &w, 1, &b->head_out, b->act[0]);
        return;
    }
    if (split == SPLIT_ALL) {
        lanes(b, 0, LAYERS, 0, 6);
        lanes(b, 0, LAYERS, 6, 7);
        return;
    }
    static const int DECODE_JOBS[] = {0, 3, 4, 6, 7}; /* job boundaries in a layer's matrices */
    for (int l = 0; l < LAYERS; l++) {
        if (split == SPLIT_WIDTH) {
            lanes(b, l, l + 1, 0, 6);
            lanes(b, l, l + 1, 6, 7);
        } else if (split == SPLIT_DECODE) {
            for (int j = 0; j < 4; j++) lanes(b, l, l + 1, DECODE_JOBS[j], DECODE_JOBS[j + 1]);
        } else {
            for (int k = 0; k < LAYER_MATS; k++) lanes(b, l, l + 1, k, k + 1);
        }
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void print_row(const char *what, double *gbs, int rounds) {
    qsort(gbs, (size_t)rounds, sizeof *gbs, cmp_double);
    printf("| %s | %.1f | %.1f |\n", what, gbs[rounds / 2], gbs[rounds - 1]);
}

/* Table 1's variants in order: the reads with 1..CSD_READ_STREAMS_MAX parts, non-temporal hint
 * then ordinary; then the Q4 kernel with 1..CSD_MV_STREAMS streams. */
enum { READS = 2 * CSD_READ_STREAMS_MAX, VARIANTS = READS + CSD_MV_STREAMS };

static void set_variant(bench *b, int v) {
    b->kernel = v >= READS;
    b->nta = v < CSD_READ_STREAMS_MAX;
    b->streams = b->kernel ? v - READS + 1 : v % CSD_READ_STREAMS_MAX + 1;
}

static void table_long_streams(bench *b, int rounds) {
    static double gbs[VARIANTS][MAX_ROUNDS];
    int nth = csd_pool_size(b->pool);
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < VARIANTS; v++) {
            set_variant(b, v);
            uint64_t t0 = csd_now_ns();
            csd_pool_run(b->pool, long_stream_job, b);
            double sec = (double)(csd_now_ns() - t0) * 1e-9;
            gbs[v][r] = long_stream_bytes(b, b->streams, nth) / sec / 1e9;
        }
    printf("\n%d threads, %.0f MiB, one region per thread, %d rounds (GB/s)\n\n", nth,
           (double)b->region_bytes / (1 << 20), rounds);
    printf("| variant | median | best |\n| --- | ---: | ---: |\n");
    for (int v = 0; v < VARIANTS; v++) {
        char what[96];
        set_variant(b, v);
        const char *plural = b->streams > 1 ? "s" : "";
        if (!b->kernel)
            snprintf(what, sizeof what, "read, %d part%s a thread, %s prefetch", b->streams, plural,
                     b->nta ? "non-temporal" : "ordinary");
        else
            snprintf(what, sizeof what, "Q4 kernel, %d stream%s a thread", b->streams, plural);
        print_row(what, gbs[v], rounds);
    }
}

static void table_model(bench *b, int rounds) {
    static double gbs[N_SPLITS][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int s = 0; s < N_SPLITS; s++) {
            uint64_t t0 = csd_now_ns();
            model_pass(b, s);
            double sec = (double)(csd_now_ns() - t0) * 1e-9;
            gbs[s][r] = pass_bytes(b, s) / sec / 1e9;
        }
    printf("\nQ4 matrices of a TinyLlama-1.1B-shaped stage (%d layers, %.1f MB) and its Q8 output "
           "head (%.1f MB) through the lanes, %d rounds (GB/s)\n\n",
           LAYERS, (double)b->model_bytes / 1e6, (double)b->head.nbytes / 1e6, rounds);
    printf("| jobs | median | best |\n| --- | ---: | ---: |\n");
    for (int s = 0; s < N_SPLITS; s++) print_row(SPLIT_NAMES[s], gbs[s], rounds);
}

/* Table 3: the decode pass (4 jobs a layer, then the head) with each of n prefetch distances, the
 * table's own kernels otherwise. Per round, every distance's time over the first one's; the
 * median of those ratios is robust to the host's drift between rounds. */
static void table_distances(bench *b, const size_t *dist, int n, int rounds) {
    static double gbs[MAX_DISTANCES][MAX_ROUNDS], ratio[MAX_DISTANCES][MAX_ROUNDS];
    const csd_kern_ops *own = b->ops;
    csd_kern_ops tuned[MAX_DISTANCES];
    for (int d = 0; d < n; d++) {
        tuned[d] = *own;
        tuned[d].mv_pf_ahead = dist[d];
    }
    double bytes = pass_bytes(b, SPLIT_DECODE) + pass_bytes(b, HEAD_ONLY);
    for (int r = 0; r < rounds; r++) {
        double sec[MAX_DISTANCES];
        for (int k = 0; k < n; k++) {
            /* every other round backwards: no distance always runs first */
            int d = r % 2 ? n - 1 - k : k;
            b->ops = &tuned[d];
            uint64_t t0 = csd_now_ns();
            model_pass(b, SPLIT_DECODE);
            model_pass(b, HEAD_ONLY);
            sec[d] = (double)(csd_now_ns() - t0) * 1e-9;
            gbs[d][r] = bytes / sec[d] / 1e9;
        }
        for (int d = 0; d < n; d++) ratio[d][r] = sec[d] / sec[0];
    }
    b->ops = own;
    printf("\nThe decode pass (4 jobs a layer, then the head: %.1f MB) by prefetch distance, %d "
           "rounds; this table's default: %zu bytes\n\n",
           bytes / 1e6, rounds, own->mv_pf_ahead);
    printf("| distance (bytes) | median GB/s | best GB/s | time / time at %zu B (median, range) |\n"
           "| ---: | ---: | ---: | ---: |\n",
           dist[0]);
    for (int d = 0; d < n; d++) {
        qsort(gbs[d], (size_t)rounds, sizeof(double), cmp_double);
        qsort(ratio[d], (size_t)rounds, sizeof(double), cmp_double);
        printf("| %zu | %.1f | %.1f | %.3f (%.3f-%.3f) |\n", dist[d], gbs[d][rounds / 2],
               gbs[d][rounds - 1], ratio[d][rounds / 2], ratio[d][0], ratio[d][rounds - 1]);
    }
}

/* -a's list: 1..MAX_DISTANCES distances, each as CSD_PF_AHEAD takes it. Returns how many. */
static int parse_distances(char *list, size_t *dist) {
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (n == MAX_DISTANCES || !csd_kern_parse_pf_ahead(tok, &dist[n])) {
            fprintf(stderr,
                    "stream_bench: -a takes 1 to %d distances, each a multiple of 64 from 0 to "
                    "%d bytes; got '%s'\n",
                    MAX_DISTANCES, CSD_PF_AHEAD_MAX, tok);
            exit(2);
        }
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "stream_bench: -a needs at least one distance\n");
        exit(2);
    }
    return n;
}

static int parse_int(const char *s, int lo, int hi, const char *what) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "stream_bench: %s must be %d..%d, got '%s'\n", what, lo, hi, s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    int threads = 0, rounds = 8, mib = 1024, n_dist = 0;
    size_t dist[MAX_DISTANCES];
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 == argc) {
            fprintf(stderr, "stream_bench: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "-t"))
            threads = parse_int(argv[i + 1], 1, CSD_POOL_MAX_THREADS, "-t");
        else if (!strcmp(argv[i], "-r"))
            rounds = parse_int(argv[i + 1], 1, MAX_ROUNDS, "-r");
        else if (!strcmp(argv[i], "-m"))
            mib = parse_int(argv[i + 1], 600, 65536, "-m");
        else if (!strcmp(argv[i], "-a"))
            n_dist = parse_distances(argv[i + 1], dist);
        else {
            fprintf(stderr, "usage: stream_bench [-t THREADS] [-r ROUNDS] [-m MIB >= 600] "
                            "[-a BYTES,BYTES,...]\n");
            return 2;
        }
    }
    csd_kern_init();
    bench b = {.ops = csd_kern_ops_current(), .region_bytes = (size_t)mib << 20};
    csd_err err = {0};
    if (csd_pool_create(&b.pool, threads, &err)) {
        fprintf(stderr, "stream_bench: %s\n", err.msg);
        return 1;
    }
    if (!b.ops->matvec_q4) {
        fprintf(stderr, "stream_bench: the %s kernel table has no matvec kernels\n", b.ops->name);
        return 1;
    }
    b.region = csd_alloc(b.region_bytes);
    b.out = csd_alloc(b.region_bytes / csd_quant_block_bytes(CSD_DTYPE_Q4, DIM) * 16 * 4 + 64);
    if (b.region) fill_weights(b.region, b.region_bytes);
    if (!b.region || !b.out || lay_out_model(&b)) {
        fprintf(stderr, "stream_bench: out of memory (%d MiB of weights)\n", mib);
        return 1;
    }
    b.act[0] = make_act(b.ops, DIM);
    b.act[1] = make_act(b.ops, HIDDEN);
    printf("stream_bench: %s kernels, prefetch distance %zu bytes\n", b.ops->name,
           b.ops->mv_pf_ahead);
    table_long_streams(&b, rounds);
    table_model(&b, rounds);
    if (n_dist) table_distances(&b, dist, n_dist, rounds);
    return 0;
}
