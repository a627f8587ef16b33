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

/* The wall-clock time ms milliseconds from now: the deadline pthread_cond_timedwait takes on a
 * condition variable with the default clock. */
static inline struct timespec csd_realtime_in_ms(int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = (int64_t)ts.tv_nsec + (ms % 1000) * 1000000;
    ts.tv_sec += (time_t)(ms / 1000 + ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    return ts;
}

#endif
