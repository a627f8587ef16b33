/* log: leveled logging to stderr, one line per event ending in key=value fields.
 * The level is checked before any argument is evaluated, so DEBUG lines cost nothing when off.
 * The level is one of the two allowed globals, set once at start-up (CSD_LOG env or --verbose). */
#ifndef CSD_LOG_H
#define CSD_LOG_H

enum csd_log_level {
    CSD_LOG_ERROR = 0,
    CSD_LOG_WARN = 1,
    CSD_LOG_INFO = 2,
    CSD_LOG_DEBUG = 3,
    CSD_LOG_TRACE = 4,
    CSD_LOG_LEVEL_COUNT
};

extern int csd_log_level_current;

void csd_log_set_level(int level);
/* Parses "error|warn|info|debug|trace"; returns -1 for anything else. */
int csd_log_level_parse(const char *name);
void csd_log_write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define CSD_LOG(level, ...)                                                   \
    do {                                                                      \
        if ((level) <= csd_log_level_current)                                 \
            csd_log_write((level), __FILE__, __LINE__, __VA_ARGS__);          \
    } while (0)

#define CSD_LOGE(...) CSD_LOG(CSD_LOG_ERROR, __VA_ARGS__)
#define CSD_LOGW(...) CSD_LOG(CSD_LOG_WARN, __VA_ARGS__)
#define CSD_LOGI(...) CSD_LOG(CSD_LOG_INFO, __VA_ARGS__)
#define CSD_LOGD(...) CSD_LOG(CSD_LOG_DEBUG, __VA_ARGS__)

#endif
