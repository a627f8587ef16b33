/* build_info: what this binary is, for `cascadia version`, bench results and the API's
 * system_fingerprint. The version comes from CMakeLists.txt, the commit from git at build time
 * (cmake/build_commit.cmake). Every string is static and lives as long as the program. */
#ifndef CSD_BUILD_INFO_H
#define CSD_BUILD_INFO_H

const char *csd_version(void);        /* "0.1.0" */
const char *csd_build_commit(void);   /* short hash, "<hash>-dirty" or "unknown" (no git) */
const char *csd_build_compiler(void); /* "gcc 12.2.0", "clang 14.0.6" */
/* CMAKE_BUILD_TYPE, with "+sanitizers" appended under ASan, "+tsan" under ThreadSanitizer */
const char *csd_build_type(void);
const char *csd_build_arch(void);     /* the target processor, e.g. "x86_64", "aarch64" */
/* "cascadia-<version>-<commit>": changes whenever the code that produces the results does. */
const char *csd_build_fingerprint(void);

#endif
