/* log: stderr writer behind CSD_LOG (see log.h). One fprintf per line so lines from threads
 * do not interleave mid-line. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int csd_log_level_current = CSD_LOG_WARN;

static const char *const level_names[CSD_LOG_LEVEL_COUNT] = {"error", "warn", "info", "debug",
                                                             "trace"};

void csd_log_set_level(int level) {
    if (level < 0) level = 0;
    if (level >= CSD_LOG_LEVEL_COUNT) level = CSD_LOG_LEVEL_COUNT - 1;
    csd_log_level_current = level;
}

int csd_log_level_parse(const char *name) {
    for (int i = 0; i < CSD_LOG_LEVEL_COUNT; i++)
        if (name && strcmp(name, level_names[i]) == 0) return i;
    return -1;
}

void csd_log_write(int level, const char *file, int line, const char *fmt, ...) {
    char body[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (level < 0 || level >= CSD_LOG_LEVEL_COUNT) level = CSD_LOG_ERROR;
    fprintf(stderr, "%02d:%02d:%02d.%03ld %-5s %s (%s:%d)\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, level_names[level], body, base, line);
}
