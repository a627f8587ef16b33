/* dispatch: detects CPU features once, picks the best kernel table (CSD_KERN=ref|avx2|avxvnni|
 * avx512|neon forces one), fills the table's gaps (from the table it extends, then ref), applies
 * CSD_PF_AHEAD (the one-token streams' prefetch distance, for a CPU unlike the ones each table's
 * default was measured on) and logs the choice. Also the public entry points of the vector
 * helpers. The chosen table is one of the two allowed globals, set once. */
#include "kern_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

/* In order of preference, best last. */
enum { TABLE_REF, TABLE_AVX2, TABLE_AVXVNNI, TABLE_AVX512, TABLE_NEON, TABLE_COUNT };

static const char *const table_names[TABLE_COUNT] = {"ref", "avx2", "avxvnni", "avx512", "neon"};

static csd_kern_ops tables[TABLE_COUNT];  /* gap-filled copies, written once under init_once */
static bool table_ok[TABLE_COUNT];        /* compiled in and supported by this CPU */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static _Atomic(const csd_kern_ops *) chosen; /* the table every public entry point uses */

typedef struct cpu_features {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avxvnni, avx512bf16;
    bool asimddp; /* AArch64: the SDOT/UDOT dot product instructions (ARMv8.2 dotprod) */
} cpu_features;

static cpu_features detect(void) {
    cpu_features f = {0};
#if defined(__aarch64__) && defined(__linux__)
    f.asimddp = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f.fma = (c >> 12) & 1;
    f.f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return f;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv"
                     : "=a"(xlo), "=d"(xhi)
                     : "c"(0)); /* which register state the OS saves */
    (void)xhi;
    bool os_ymm = (xlo & 0x6) == 0x6, os_zmm = (xlo & 0xe6) == 0xe6;
    if (!os_ymm) return f;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f.avx2 = (b >> 5) & 1;
        f.avx512f = os_zmm && ((b >> 16) & 1);
        f.avx512dq = os_zmm && ((b >> 17) & 1);
        f.avx512bw = os_zmm && ((b >> 30) & 1);
        f.avx512vl = os_zmm && ((b >> 31) & 1);
        f.avx512vnni = os_zmm && ((c >> 11) & 1);
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        f.avxvnni = (a >> 4) & 1;
        f.avx512bf16 = os_zmm && ((a >> 5) & 1);
    }
#endif
    return f;
}

static void fill_gaps(csd_kern_ops *t, const csd_kern_ops *r) {
#define FILL(field) \
    if (!t->field) t->field = r->field
    FILL(quantize_act_q8);
    FILL(matmul_q4_q8);
    FILL(matmul_q8_q8);
    FILL(matmul_f32_f32);
    FILL(matmul_f16_f32);
    FILL(matmul_bf16_f32);
    FILL(dot_f32);
    FILL(dot_f32_f16);
    FILL(axpy_f32);
    FILL(axpy_f16);
    FILL(f32_to_f16);
    FILL(softmax);
    FILL(silu_mul);
    FILL(rmsnorm);
    FILL(read_streams);
    /* the grouped attention kernel must do its single-head path's arithmetic: inherited only by
     * avxvnni, which has all of avx2's attention helpers (ref has none) */
    FILL(attend_f16_group);
#undef FILL
}

bool csd_kern_parse_pf_ahead(const char *s, size_t *out) {
    if (!s || *s < '0' || *s > '9') return false; /* no sign, no space */
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > CSD_PF_AHEAD_MAX || v % 64) return false;
    *out = (size_t)v;
    return true;
}

/* CSD_PF_AHEAD, when set and valid, replaces every table's prefetch distance (it describes the
 * machine's memory, whichever table runs); when invalid, a warning says why and the defaults
 * stay. Returns whether it was applied. */
static bool apply_pf_ahead_env(void) {
    const char *env = getenv("CSD_PF_AHEAD");
    if (!env || !*env) return false;
    size_t ahead;
    if (!csd_kern_parse_pf_ahead(env, &ahead)) {
        CSD_LOGW("kern: CSD_PF_AHEAD=%s is not a multiple of 64 from 0 to %d bytes; using each "
                 "table's default",
                 env, CSD_PF_AHEAD_MAX);
        return false;
    }
    for (int i = 0; i < TABLE_COUNT; i++) tables[i].mv_pf_ahead = ahead;
    return true;
}

static void init_tables(void) {
    cpu_features f = detect();
    tables[TABLE_REF] = csd_kern_ops_ref;
    table_ok[TABLE_REF] = true;
#if defined(__x86_64__)
    tables[TABLE_AVX2] = csd_kern_ops_avx2;
    table_ok[TABLE_AVX2] = f.avx2 && f.fma && f.f16c;
    /* avxvnni only has the Q kernels: the rest is avx2's, which its CPUs run */
    tables[TABLE_AVXVNNI] = csd_kern_ops_avxvnni;
    fill_gaps(&tables[TABLE_AVXVNNI], &csd_kern_ops_avx2);
    table_ok[TABLE_AVXVNNI] = table_ok[TABLE_AVX2] && f.avxvnni;
    tables[TABLE_AVX512] = csd_kern_ops_avx512;
    table_ok[TABLE_AVX512] = table_ok[TABLE_AVX2] && f.avx512f && f.avx512bw && f.avx512vl &&
                             f.avx512dq && f.avx512vnni;
#endif
#if defined(__aarch64__)
    tables[TABLE_NEON] = csd_kern_ops_neon;
    table_ok[TABLE_NEON] = f.asimddp;
#endif
    for (int i = 0; i < TABLE_COUNT; i++) fill_gaps(&tables[i], &csd_kern_ops_ref);
    bool pf_forced = apply_pf_ahead_env();

    int pick = TABLE_REF;
    for (int i = TABLE_COUNT - 1; i >= 0; i--) {
        if (table_ok[i]) {
            pick = i;
            break;
        }
    }
    const char *forced = getenv("CSD_KERN");
    if (forced && *forced) {
        int want = -1;
        for (int i = 0; i < TABLE_COUNT; i++)
            if (strcmp(forced, table_names[i]) == 0) want = i;
        if (want >= 0 && table_ok[want]) {
            pick = want;
        } else {
            CSD_LOGW("kern: CSD_KERN=%s is unknown or unsupported here, using %s", forced,
                     table_names[pick]);
        }
    }
    CSD_LOGI("kern: table=%s forced=%s pf_ahead=%zu%s avx2=%d fma=%d f16c=%d avx512f=%d "
             "avx512bw=%d avx512vl=%d avx512vnni=%d avxvnni=%d avx512bf16=%d asimddp=%d",
             table_names[pick], forced && *forced ? forced : "no", tables[pick].mv_pf_ahead,
             pf_forced ? " (CSD_PF_AHEAD)" : "", f.avx2, f.fma, f.f16c, f.avx512f, f.avx512bw,
             f.avx512vl, f.avx512vnni, f.avxvnni, f.avx512bf16, f.asimddp);
    atomic_store_explicit(&chosen, &tables[pick], memory_order_release);
}

const csd_kern_ops *csd_kern_ops_current(void) {
    const csd_kern_ops *ops = atomic_load_explicit(&chosen, memory_order_acquire);
    if (ops) return ops;
    pthread_once(&init_once, init_tables);
    return atomic_load_explicit(&chosen, memory_order_acquire);
}

const char *csd_kern_init(void) { return csd_kern_ops_current()->name; }
const char *csd_kern_name(void) { return csd_kern_ops_current()->name; }
size_t csd_kern_pf_ahead(void) { return csd_kern_ops_current()->mv_pf_ahead; }

int csd_kern_available(const char **names, int cap) {
    pthread_once(&init_once, init_tables);
    int n = 0;
    for (int i = 0; i < TABLE_COUNT && n < cap; i++)
        if (table_ok[i]) names[n++] = table_names[i];
    return n;
}

const csd_kern_ops *csd_kern_table(const char *name) {
    pthread_once(&init_once, init_tables);
    for (int i = 0; i < TABLE_COUNT; i++)
        if (name && strcmp(name, table_names[i]) == 0) return table_ok[i] ? &tables[i] : NULL;
    return NULL;
}

float csd_dot_f32(const float *a, const float *b, int64_t n) {
    return csd_kern_ops_current()->dot_f32(a, b, n);
}

void csd_axpy_f32(float *y, float a, const float *x, int64_t n) {
    csd_kern_ops_current()->axpy_f32(y, a, x, n);
}

void csd_silu_mul(float *g, const float *u, int64_t n) {
    csd_kern_ops_current()->silu_mul(g, u, n);
}

uint64_t csd_read_streams(const uint8_t *p, size_t bytes, int streams, bool nta) {
    if (streams < 1) streams = 1;
    if (streams > CSD_READ_STREAMS_MAX) streams = CSD_READ_STREAMS_MAX;
    const csd_kern_ops *ops = csd_kern_ops_current();
    return ops->read_streams(p, bytes, streams, nta, ops->mv_pf_ahead);
}

void csd_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    csd_kern_ops_current()->rmsnorm(out, x, w, n, eps);
}

void csd_f32_to_f16_vec(uint16_t *out, const float *in, int64_t n) {
    csd_kern_ops_current()->f32_to_f16(out, in, n);
}
