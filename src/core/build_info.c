/* build_info: see build_info.h. CSD_VERSION, CSD_BUILD_TYPE and CSD_BUILD_ARCH are set by
 * CMakeLists.txt for this file alone; CSD_BUILD_COMMIT comes from the generated header. */
#include "build_info.h"

#include "csd_build_commit.h"

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

#if defined(__clang__) /* __clang_version__ ends in a space and sometimes a vendor's words */
#define COMPILER_NAME                                                                              \
    "clang " STRINGIFY(__clang_major__) "." STRINGIFY(__clang_minor__) "." STRINGIFY(              \
        __clang_patchlevel__)
#elif defined(__GNUC__)
#define COMPILER_NAME "gcc " __VERSION__
#else
#define COMPILER_NAME "unknown compiler"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define THREAD_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define THREAD_SANITIZED 1
#endif
#endif

#if defined(SANITIZED)
#define TYPE_SUFFIX "+sanitizers"
#elif defined(THREAD_SANITIZED)
#define TYPE_SUFFIX "+tsan"
#else
#define TYPE_SUFFIX ""
#endif

const char *csd_version(void) { return CSD_VERSION; }
const char *csd_build_commit(void) { return CSD_BUILD_COMMIT; }
const char *csd_build_compiler(void) { return COMPILER_NAME; }
const char *csd_build_type(void) { return CSD_BUILD_TYPE TYPE_SUFFIX; }
const char *csd_build_arch(void) { return CSD_BUILD_ARCH; }
const char *csd_build_fingerprint(void) { return "cascadia-" CSD_VERSION "-" CSD_BUILD_COMMIT; }
