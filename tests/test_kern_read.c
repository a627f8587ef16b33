/* test_kern_read: the bandwidth test's read (the tables' read_streams, behind `cascadia bench`'s
 * roofline) in every table this CPU supports. Each must read every byte it is given: its sum is
 * the wrapping sum of all 64-bit words, for 1 to 4 streams, both prefetch hints and several
 * prefetch distances. A read that skipped a line or a stream would measure a bandwidth the
 * weights never get. Also the prefetch distance itself: CSD_PF_AHEAD, set here before the first
 * kernel call, must reach every table, and its parser must refuse what is not a distance. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kern/kern.h"
#include "kern/kern_internal.h"

static const char *const table_names[] = {"ref", "avx2", "avxvnni", "avx512", "neon"};
#define N_TABLES (int)(sizeof table_names / sizeof table_names[0])

/* 64 * 4 * 3 * 5 bytes: whole lines for every stream count, with prefetches running past the end
 * of short parts (into the rest of the buffer, as in the benchmark). */
#define WORDS (8 * 4 * 3 * 5)
/* What main sets CSD_PF_AHEAD to: not any table's default, so applying it is visible. */
#define ENV_AHEAD 576

static uint64_t word_sum(const uint64_t *w, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += w[i];
    return s;
}

static void test_read_streams_sums_every_word(void **state) {
    (void)state;
    uint64_t *buf = csd_alloc(WORDS * sizeof *buf);
    assert_non_null(buf);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < WORDS; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = x;
    }
    int checked = 0;
    for (int ti = 0; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (!ops) continue;
        for (int streams = 1; streams <= CSD_READ_STREAMS_MAX; streams++) {
            size_t bytes = WORDS * sizeof *buf / (64u * (size_t)streams) * (64u * (size_t)streams);
            uint64_t want = word_sum(buf, bytes / sizeof *buf);
            static const size_t aheads[] = {0, 64, 1024, CSD_PF_AHEAD_MAX};
            for (int nta = 0; nta < 2; nta++)
                for (int a = 0; a < 4; a++) {
                    uint64_t got = ops->read_streams((const uint8_t *)buf, bytes, streams, nta != 0,
                                                     aheads[a]);
                    if (got != want)
                        fail_msg("table %s, %d streams, nta %d, ahead %zu: sum %llx, want %llx",
                                 table_names[ti], streams, nta, aheads[a], (unsigned long long)got,
                                 (unsigned long long)want);
                }
            /* and one word changed in the last stream's last line changes the sum */
            buf[bytes / sizeof *buf - 1] ^= 1;
            uint64_t changed =
                ops->read_streams((const uint8_t *)buf, bytes, streams, true, ops->mv_pf_ahead);
            buf[bytes / sizeof *buf - 1] ^= 1;
            assert_true(changed != want);
            checked++;
        }
    }
    csd_free(buf);
    printf("read_streams: %d (table, streams) cases\n", checked);
    assert_true(checked >= CSD_READ_STREAMS_MAX);
}

/* CSD_PF_AHEAD (set by main before the tables were chosen) is every table's distance. */
static void test_env_distance_applied(void **state) {
    (void)state;
    assert_int_equal(csd_kern_pf_ahead(), ENV_AHEAD);
    for (int ti = 0; ti < N_TABLES; ti++) {
        const csd_kern_ops *ops = csd_kern_table(table_names[ti]);
        if (ops) assert_int_equal(ops->mv_pf_ahead, ENV_AHEAD);
    }
}

static void test_parse_distance(void **state) {
    (void)state;
    static const struct {
        const char *s;
        bool ok;
        size_t want;
    } cases[] = {
        {"0", true, 0},       {"64", true, 64},
        {"1024", true, 1024}, {"16384", true, 16384},
        {"16448", false, 0},  {"100", false, 0},
        {"-64", false, 0},    {"+64", false, 0},
        {" 64", false, 0},    {"64 ", false, 0},
        {"", false, 0},       {"1k", false, 0},
        {"0x40", false, 0},   {"99999999999999999999999", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t got = 12345;
        bool ok = csd_kern_parse_pf_ahead(cases[i].s, &got);
        if (ok != cases[i].ok)
            fail_msg("'%s': %s, want %s", cases[i].s, ok ? "taken" : "refused",
                     cases[i].ok ? "taken" : "refused");
        assert_int_equal(got, ok ? cases[i].want : 12345); /* untouched when refused */
    }
    assert_false(csd_kern_parse_pf_ahead(NULL, &(size_t){0}));
}

int main(void) {
    /* before anything chooses the tables: the distance must come from the environment */
    if (setenv("CSD_PF_AHEAD", "576", 1) != 0) return 1;
    static_assert(ENV_AHEAD == 576, "the string above");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_distance_applied),
        cmocka_unit_test(test_parse_distance),
        cmocka_unit_test(test_read_streams_sums_every_word),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
