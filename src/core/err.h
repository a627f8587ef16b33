/* err: error codes and the error-detail struct every fallible function fills.
 * Functions return 0 on success or a negative CSD_E* code; details (a readable message naming the
 * problem: file, field, value) go into an optional csd_err. Codes and their names come from one
 * table. */
#ifndef CSD_ERR_H
#define CSD_ERR_H

#include <stdarg.h>

/* X(name, value, text): append only; values are stable (they cross the wire in ERROR frames). */
#define CSD_ERR_TABLE(X)                                   \
    X(CSD_OK, 0, "ok")                                     \
    X(CSD_EINVAL, -1, "invalid argument")                  \
    X(CSD_ENOMEM, -2, "out of memory")                     \
    X(CSD_EIO, -3, "input/output error")                   \
    X(CSD_EFORMAT, -4, "malformed or unsupported file")    \
    X(CSD_EPROTO, -5, "protocol error")                    \
    X(CSD_EUNSUPPORTED, -6, "unsupported")                 \
    X(CSD_ENOTFOUND, -7, "not found")                      \
    X(CSD_ERANGE, -8, "value out of range")                \
    X(CSD_EAUTH, -9, "authentication failed")              \
    X(CSD_ECLOSED, -10, "connection closed")               \
    X(CSD_ETIMEOUT, -11, "timed out")                      \
    X(CSD_EFULL, -12, "capacity exhausted")                \
    X(CSD_ECANCELED, -13, "canceled")                      \
    X(CSD_EMISMATCH, -14, "mismatch between peers or files")

enum csd_err_code {
#define CSD_ERR_ENUM(name, value, text) name = value,
    CSD_ERR_TABLE(CSD_ERR_ENUM)
#undef CSD_ERR_ENUM
};

#define CSD_ERR_MSG_MAX 256

typedef struct csd_err {
    int code;                   /* a CSD_E* value, 0 when no error was recorded */
    char msg[CSD_ERR_MSG_MAX];  /* human-readable detail, always NUL-terminated */
} csd_err;

/* The static text of a code ("malformed or unsupported file"); never NULL. */
const char *csd_strerror(int code);
/* The symbolic name of a code ("CSD_EFORMAT"); never NULL. */
const char *csd_err_name(int code);
/* A code a peer sent (an ERROR frame): one of ours as it is, anything else CSD_EPROTO. */
int csd_err_from_peer(int code);

/* Records code and a formatted message into err (err may be NULL) and returns code, so callers can
 * write `return csd_err_set(err, CSD_EFORMAT, "%s: header too large", path);`. */
int csd_err_set(csd_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__
/* For clang's static analyzer only (README, "Static analysis"): it reads one file at a time, so it
 * cannot see that csd_err_set returns its code and followed `rc = csd_err_set(...)` as if rc could
 * be 0. Here the call's value is the code itself (every caller passes one without side effects). */
#define csd_err_set(err, code, ...) (csd_err_set((err), (code), __VA_ARGS__), (code))
#endif
/* Prefixes an existing message with more context ("loading stage-1.shard: " + old message). */
int csd_err_prefix(csd_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void csd_err_clear(csd_err *err);

#endif
