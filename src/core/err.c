/* err: the error-code table and message helpers (see err.h). */
#include "err.h"

#include <stdio.h>
#include <string.h>

#undef csd_err_set /* the static analyzer's stand-in (err.h); here is the function itself */

const char *csd_strerror(int code) {
    switch (code) {
#define CSD_ERR_TEXT(name, value, text) \
    case value: return text;
        CSD_ERR_TABLE(CSD_ERR_TEXT)
#undef CSD_ERR_TEXT
    }
    return "unknown error";
}

const char *csd_err_name(int code) {
    switch (code) {
#define CSD_ERR_NAME(name, value, text) \
    case value: return #name;
        CSD_ERR_TABLE(CSD_ERR_NAME)
#undef CSD_ERR_NAME
    }
    return "CSD_E?";
}

int csd_err_from_peer(int code) {
    switch (code) {
#define CSD_ERR_KNOWN(name, value, text) \
    case value: return code;
        CSD_ERR_TABLE(CSD_ERR_KNOWN)
#undef CSD_ERR_KNOWN
    }
    return CSD_EPROTO;
}

int csd_err_set(csd_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

int csd_err_prefix(csd_err *err, const char *fmt, ...) {
    if (!err) return CSD_EINVAL;
    char prefix[CSD_ERR_MSG_MAX];
    char old[CSD_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    size_t plen = strlen(prefix), olen = strlen(old), cap = sizeof err->msg - 1;
    if (plen > cap) plen = cap;
    if (olen > cap - plen) olen = cap - plen; /* the tail of a long message is dropped */
    memcpy(err->msg, prefix, plen);
    memcpy(err->msg + plen, old, olen);
    err->msg[plen + olen] = '\0';
    return err->code;
}

void csd_err_clear(csd_err *err) {
    if (!err) return;
    err->code = 0;
    err->msg[0] = '\0';
}
