/* test_kern_read: the bandwidth test's read (the tables' read_streams, behind `cascadia bench`'s
 * roofline) in every table this CPU supports. Each must read every byte it is given: its sum is
 * the wrapping sum of all 64-bit words, for 1 to 4 streams and both prefetch hints. A read that
 * skipped a line or a stream would measure a bandwidth the weights never get. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "kern/kern.h"
#include "kern/kern_internal.h"

static const char *const table_names[] = {"ref", "avx2", "avxvnni", "avx512", "neon"};
#define N_TABLES (int)(sizeof table_names / sizeof table_names[0])

/* 64 * 4 * 3 * 5 bytes: whole lines for every stream count, with prefetches running past the end
 * of short parts (into the rest of the buffer, as in the benchmark). */
#define WORDS (8 * 4 * 3 * 5)

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
            for (int nta = 0; nta < 2; nta++) {
                uint64_t got = ops->read_streams((const uint8_t *)buf, bytes, streams, nta != 0);
                if (got != want)
                    fail_msg("table %s, %d streams, nta %d: sum %llx, want %llx", table_names[ti],
                             streams, nta, (unsigned long long)got, (unsigned long long)want);
            }
            /* and one word changed in the last stream's last line changes the sum */
            buf[bytes / sizeof *buf - 1] ^= 1;
            uint64_t changed = ops->read_streams((const uint8_t *)buf, bytes, streams, true);
            buf[bytes / sizeof *buf - 1] ^= 1;
            assert_true(changed != want);
            checked++;
        }
    }
    csd_free(buf);
    printf("read_streams: %d (table, streams) cases\n", checked);
    assert_true(checked >= CSD_READ_STREAMS_MAX);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_streams_sums_every_word),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
