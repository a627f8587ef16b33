/* route_proxy: the libcurl transfer of one forwarded request (see route_proxy.h). Each transfer has
 * its own multi handle, driven only by the thread that reads it: there are no callbacks on other
 * threads and nothing is shared between transfers. */
#include "route_proxy.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "mhd/text_buf.h"

/* How long one wait for the upstream lasts before the abort callback is asked again (ms). */
#define POLL_MS 50

struct csd_route_xfer {
    CURLM *multi;
    CURL *easy;
    struct curl_slist *headers;
    char *body; /* the request body (owned: libcurl reads it while sending) */
    csd_http_buf data; /* answer bytes; those from `sent` on are not handed on yet */
    size_t sent;
    size_t header_bytes;  /* of the upstream's headers, for the bound */
    bool header_overflow; /* more than CSD_ROUTE_XFER_HEADERS_MAX: refused */
    bool final_headers;   /* the final answer's header block has ended: what follows is a
                           * trailer, which may not change the Content-Type */
    bool added;           /* the easy handle is in the multi handle */
    bool paused;          /* the write callback paused the transfer: data is full */
    bool done;            /* the transfer has ended (result says how) */
    int silence_s;        /* --upstream-timeout */
    double last_rx;       /* when the upstream last sent a byte (csd_now_s) */
    CURLcode result;
    char ctype[CSD_ROUTE_CTYPE_MAX]; /* the final answer's Content-Type, "" when none */
    char errbuf[CURL_ERROR_SIZE];
};

int csd_route_proxy_global_init(csd_err *err) {
    CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK)
        return csd_err_set(err, CSD_EIO, "libcurl initialisation failed: %s",
                           curl_easy_strerror(rc));
    return 0;
}

void csd_route_proxy_global_fini(void) { curl_global_cleanup(); }

/* ---- callbacks (on the reading thread, inside curl_multi_perform) ---- */

/* Keeps a header value only when it is short printable ASCII: it is relayed to the client. */
static void keep_content_type(csd_route_xfer *x, const char *v, size_t n) {
    while (n && (*v == ' ' || *v == '\t')) v++, n--;
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    x->ctype[0] = 0;
    if (n == 0 || n >= sizeof x->ctype) return;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] > 0x7e) return;
    memcpy(x->ctype, v, n);
    x->ctype[n] = 0;
}

static size_t on_header(char *line, size_t size, size_t n, void *ctx) {
    csd_route_xfer *x = ctx;
    size_t len = size * n;
    x->last_rx = csd_now_s();
    x->header_bytes += len;
    if (x->header_bytes > CSD_ROUTE_XFER_HEADERS_MAX) {
        x->header_overflow = true;
        return 0; /* aborts the transfer */
    }
    if (x->final_headers) return len; /* a trailer */
    if (len >= 5 && !strncmp(line, "HTTP/", 5)) x->ctype[0] = 0; /* a new (final) answer */
    if (len > 13 && !strncasecmp(line, "Content-Type:", 13))
        keep_content_type(x, line + 13, len - 13);
    long code = 0;
    if ((len == 2 && line[0] == '\r') || (len == 1 && line[0] == '\n')) /* a block's end */
        x->final_headers = curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK &&
                           code >= 200;
    return len;
}

static size_t on_data(char *ptr, size_t size, size_t n, void *ctx) {
    csd_route_xfer *x = ctx;
    size_t len = size * n;
    if (x->data.len - x->sent >= CSD_ROUTE_XFER_BUF_MAX) { /* the client reads slower: hold on */
        x->paused = true;
        return CURL_WRITEFUNC_PAUSE;
    }
    if (x->sent && x->sent >= x->data.len / 2) { /* what was handed on goes, when it is most */
        csd_http_buf_drop(&x->data, x->sent);
        x->sent = 0;
    }
    if (csd_http_buf_append(&x->data, ptr, len)) return 0; /* out of memory: aborts the transfer */
    x->last_rx = csd_now_s();
    return len;
}

/* ---- lifecycle ---- */

static bool set_options(csd_route_xfer *x, const csd_route_xfer_opts *o) {
    CURL *e = x->easy;
    bool ok = curl_easy_setopt(e, CURLOPT_URL, o->url) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) == CURLE_OK; /* threads: no SIGALRM */
    ok = ok && curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->body) == CURLE_OK;
    ok =
        ok && curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)o->body_len) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->headers) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_HEADERDATA, x) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_WRITEDATA, x) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf) == CURLE_OK;
    ok = ok && curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, (long)o->connect_timeout_s) == CURLE_OK;
    /* a fresh connection per request: closing it is how the upstream learns a client left */
    ok = ok && curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L) == CURLE_OK;
    /* decided: upstreams are reached directly, whatever http_proxy says (through a proxy a
     * client's leaving would not reach the upstream as a cancel) */
    ok = ok && curl_easy_setopt(e, CURLOPT_PROXY, "") == CURLE_OK;
#if LIBCURL_VERSION_NUM >= 0x075700
    /* closing does not wait for a name still being resolved (a client that left, a stop) */
    ok = ok && curl_easy_setopt(e, CURLOPT_QUICK_EXIT, 1L) == CURLE_OK;
#endif
    return ok;
}

static bool add_header(csd_route_xfer *x, const char *h) {
    struct curl_slist *l = curl_slist_append(x->headers, h);
    if (!l) return false;
    x->headers = l;
    return true;
}

static bool build_headers(csd_route_xfer *x, const char *bearer) {
    /* no "Expect: 100-continue" round trip before a large body */
    if (!add_header(x, "Content-Type: application/json") || !add_header(x, "Expect:")) return false;
    if (!bearer) return true;
    size_t n = strlen(bearer) + 32;
    char *h = csd_alloc(n);
    if (!h) return false;
    snprintf(h, n, "Authorization: Bearer %s", bearer);
    bool ok = add_header(x, h);
    csd_free(h);
    return ok;
}

int csd_route_xfer_create(csd_route_xfer **out, const csd_route_xfer_opts *o, csd_err *err) {
    *out = NULL;
    csd_route_xfer *x = csd_alloc(sizeof *x);
    if (!x) return csd_err_set(err, CSD_ENOMEM, "upstream transfer");
    x->body = csd_alloc(o->body_len + 1);
    x->multi = curl_multi_init();
    x->easy = curl_easy_init();
    if (!x->body || !x->multi || !x->easy || !build_headers(x, o->bearer)) goto fail;
    memcpy(x->body, o->body, o->body_len);
    x->silence_s = o->silence_timeout_s > 0 ? o->silence_timeout_s : 1;
    if (!set_options(x, o)) goto fail;
    *out = x;
    return 0;
fail:
    csd_route_xfer_destroy(x);
    return csd_err_set(err, CSD_ENOMEM, "upstream transfer: libcurl set-up failed");
}

void csd_route_xfer_destroy(csd_route_xfer *x) {
    if (!x) return;
    if (x->added) curl_multi_remove_handle(x->multi, x->easy);
    if (x->easy) curl_easy_cleanup(x->easy); /* closes the connection: the upstream cancels */
    if (x->multi) curl_multi_cleanup(x->multi);
    curl_slist_free_all(x->headers);
    csd_free(x->body);
    csd_http_buf_fini(&x->data);
    csd_free(x);
}

/* ---- driving ---- */

/* One round of the transfer: runs it, notes its end, and waits up to POLL_MS for the upstream.
 * false when libcurl itself failed. */
static bool step(csd_route_xfer *x, bool wait) {
    int running = 0;
    if (curl_multi_perform(x->multi, &running) != CURLM_OK) return false;
    int left = 0;
    for (CURLMsg *m; (m = curl_multi_info_read(x->multi, &left));) {
        if (m->msg != CURLMSG_DONE) continue;
        x->done = true;
        x->result = m->data.result;
    }
    if (!running && !x->done) { /* cannot happen with a handle added; end rather than spin */
        x->done = true;
        x->result = CURLE_RECV_ERROR;
    }
    /* silence, not duration: a stream may run for an hour as long as bytes keep coming. Our own
     * clock: libcurl's low-speed check averages over seconds, so it ends a silence late. A pause
     * (the client reads slowly) is not the upstream's silence. */
    if (!x->done && !x->paused && csd_now_s() - x->last_rx > x->silence_s) {
        x->done = true;
        x->result = CURLE_OPERATION_TIMEDOUT;
        snprintf(x->errbuf, sizeof x->errbuf, "the upstream sent nothing for %d s", x->silence_s);
    }
    if (wait && !x->done && x->data.len == x->sent)
        return curl_multi_poll(x->multi, NULL, 0, POLL_MS, NULL) == CURLM_OK;
    return true;
}

static const char *failure_text(const csd_route_xfer *x) {
    if (x->header_overflow) return "response headers over the size limit";
    return x->errbuf[0] ? x->errbuf : curl_easy_strerror(x->result);
}

static bool is_connect_failure(CURLcode rc, const csd_route_xfer *x) {
    if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
        rc == CURLE_COULDNT_RESOLVE_PROXY)
        return true;
    /* a timeout before the connection was made is the connect timeout */
    curl_off_t connected = 0;
    if (rc == CURLE_OPERATION_TIMEDOUT &&
        curl_easy_getinfo(x->easy, CURLINFO_CONNECT_TIME_T, &connected) == CURLE_OK)
        return connected == 0;
    return false;
}

/* The transfer ended in an error before any answer byte. */
static int start_failed(csd_route_xfer *x, csd_err *err) {
    csd_err_set(err, CSD_EIO, "%s", failure_text(x));
    return is_connect_failure(x->result, x) ? CSD_ROUTE_XFER_CONNECT : CSD_ROUTE_XFER_BROKEN;
}

int csd_route_xfer_start(csd_route_xfer *x, const csd_route_abort *ab, csd_err *err) {
    if (curl_multi_add_handle(x->multi, x->easy) != CURLM_OK) {
        csd_err_set(err, CSD_ENOMEM, "libcurl could not start the transfer");
        return CSD_ROUTE_XFER_BROKEN;
    }
    x->added = true;
    x->last_rx = csd_now_s(); /* silence counts from the request's start */
    /* until the first answer byte (or the end): the status is known, and nothing was relayed */
    while (x->data.len == x->sent && !x->done) {
        if (ab && ab->stop(ab->ctx)) {
            csd_err_set(err, CSD_ECANCELED, "client gone or server stopping");
            return CSD_ROUTE_XFER_ABORTED;
        }
        if (!step(x, true)) {
            csd_err_set(err, CSD_EIO, "libcurl failed while driving the transfer");
            return CSD_ROUTE_XFER_BROKEN;
        }
    }
    if (x->done && x->result != CURLE_OK) return start_failed(x, err);
    int status = csd_route_xfer_status(x);
    if (status < 200 || status > 599) { /* a final 1xx (101: no upgrade here) is not an answer */
        csd_err_set(err, CSD_EPROTO, "not an HTTP answer (status %d)", status);
        return CSD_ROUTE_XFER_BROKEN;
    }
    if (status == 429 || status >= 500) {
        csd_err_set(err, CSD_EIO, "answered HTTP %d", status);
        return CSD_ROUTE_XFER_STATUS;
    }
    return CSD_ROUTE_XFER_OK;
}

int csd_route_xfer_status(const csd_route_xfer *x) {
    long code = 0;
    if (curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK) return 0;
    return code < 0 || code > 999 ? 0 : (int)code;
}

const char *csd_route_xfer_content_type(const csd_route_xfer *x) { return x->ctype; }

/* Copies out waiting bytes, and lets a paused transfer go on once there is room again. */
static size_t take_bytes(csd_route_xfer *x, char *buf, size_t max) {
    size_t n = x->data.len - x->sent;
    if (n > max) n = max;
    memcpy(buf, x->data.data + x->sent, n);
    x->sent += n;
    if (x->paused && x->data.len - x->sent < CSD_ROUTE_XFER_BUF_MAX) {
        x->paused = false;
        x->last_rx = csd_now_s(); /* the upstream's silence counts from here again */
        curl_easy_pause(x->easy, CURLPAUSE_CONT); /* may call on_data at once */
    }
    return n;
}

ssize_t csd_route_xfer_read(csd_route_xfer *x, char *buf, size_t max, const csd_route_abort *ab,
                            csd_err *err) {
    for (;;) {
        if (x->data.len > x->sent) return (ssize_t)take_bytes(x, buf, max);
        if (x->done) {
            if (x->result == CURLE_OK) return 0;
            csd_err_set(err, CSD_EIO, "%s", failure_text(x));
            return -1;
        }
        if (ab && ab->stop(ab->ctx)) return -2;
        if (!step(x, true)) {
            csd_err_set(err, CSD_EIO, "libcurl failed while driving the transfer");
            return -1;
        }
    }
}
