/* clock: monotonic time for measurements (never wall-clock for durations). */
#ifndef CSD_CLOCK_H
#define CSD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t csd_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double csd_now_s(void) { return (double)csd_now_ns() * 1e-9; }

#endif
