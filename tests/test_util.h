/* test_util: what every cmocka test file shares: paths to the shared models and a skip that says
 * why. Include after <cmocka.h>'s prerequisites (stdarg, stddef, setjmp, stdint). */
#ifndef CSD_TEST_UTIL_H
#define CSD_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* Skips the current test with a printed reason when a shared file is missing (../shared absent). */
#define CSD_REQUIRE_FILE(path)                                                              \
    do {                                                                                    \
        struct stat csd_st_;                                                                \
        if (stat((path), &csd_st_) != 0) {                                                  \
            printf("SKIP %s: %s not found (../shared is absent?)\n", __func__, (path));     \
            fflush(stdout);                                                                 \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

#define CSD_STORIES_DIR CSD_SHARED_DIR "/models/stories260K"

/* Makes a fresh directory $TMPDIR/<prefix>-XXXXXX (or under /tmp) into dir; 0 on success. */
static inline int csd_test_make_tmpdir(char *dir, size_t cap, const char *prefix) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/%s-XXXXXX", tmp ? tmp : "/tmp", prefix);
    return mkdtemp(dir) ? 0 : -1;
}

/* Removes dir and everything under it; 0 on success. */
static inline int csd_test_remove_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
