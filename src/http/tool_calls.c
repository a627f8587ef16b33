/* tool_calls: Hermes-style tool calls split out of a streamed answer (see tool_calls.h).
 *
 * pending holds what is not handed out yet. Outside a call it is the answer's tail that may still
 * matter: trailing whitespace and a proper prefix of the open tag. Inside a call it is the
 * whitespace before the open tag (lead bytes), the tag and the body so far: if the call turns out
 * not to be one, all of it goes to the content as written. */
#include "tool_calls.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "tag_scan.h"

static const char OPEN_TAG[] = "<tool_call>";
static const char CLOSE_TAG[] = "</tool_call>";
#define OPEN_LEN (sizeof OPEN_TAG - 1)
#define CLOSE_LEN (sizeof CLOSE_TAG - 1)

void csd_tool_split_init(csd_tool_split *s, bool whole) {
    memset(s, 0, sizeof *s);
    s->whole = whole;
}

void csd_tool_split_fini(csd_tool_split *s) {
    if (!s) return;
    for (int i = 0; i < s->n_calls; i++) csd_tool_call_fini(&s->calls[i]);
    csd_http_buf_fini(&s->pending);
    csd_http_buf_fini(&s->out);
    memset(s, 0, sizeof *s);
}

/* ---- content ---- */

/* Hands out pending[0, n) as content and drops it from pending. */
static int give(csd_tool_split *s, size_t n) {
    if (!n) return 0;
    if (csd_http_buf_append(&s->out, s->pending.data, n)) return CSD_ENOMEM;
    csd_http_buf_drop(&s->pending, n);
    return 0;
}

static void drop(csd_tool_split *s, size_t n) { csd_http_buf_drop(&s->pending, n); }

/* ---- the scan ---- */

/* The whitespace run that ends at buf[n), counted up to CSD_TOOL_SPACE_MAX: what is held back is
 * bounded, and so is every scan of it. */
static size_t space_before(const char *buf, size_t n) {
    return csd_tag_space_before(buf, n, CSD_TOOL_SPACE_MAX);
}

/* Ends the open call: a call when its body parses, else content as written. body_end is where the
 * body ends in pending, used is how much of pending the call takes (its close tag included). */
static int close_call(csd_tool_split *s, size_t body_start, size_t body_end, size_t used) {
    csd_tool_call c;
    int rc = csd_tool_call_parse(s->pending.data + body_start, body_end - body_start, &c);
    if (rc < 0) return rc;
    s->in_call = false;
    s->whole = false;
    if (rc == 1) return give(s, used);
    s->calls[s->n_calls++] = c;
    drop(s, used);
    return 0;
}

/* Outside a call: hands out what can no longer be part of a tag or of dropped whitespace; enters a
 * call at an open tag. */
static int scan_text(csd_tool_split *s) {
    if (s->skipping) { /* the rest of a call too long to be one, through its close tag */
        const char *end = memmem(s->pending.data, s->pending.len, CLOSE_TAG, CLOSE_LEN);
        if (!end) {
            size_t n = s->pending.len;
            return give(s, n - csd_tag_partial(s->pending.data, n, CLOSE_TAG, CLOSE_LEN));
        }
        int rc = give(s, (size_t)(end - s->pending.data) + CLOSE_LEN);
        s->skipping = false;
        if (rc) return rc;
    }
    const char *p = s->pending.data;
    size_t n = s->pending.len;
    if (s->n_calls == CSD_TOOL_CALLS_MAX) return give(s, n);
    const char *hit = memmem(p, n, OPEN_TAG, OPEN_LEN);
    if (hit) {
        size_t at = (size_t)(hit - p);
        size_t lead = space_before(p, at);
        int rc = give(s, at - lead);
        s->lead = lead;
        s->searched = lead + OPEN_LEN;
        s->in_call = true;
        return rc;
    }
    size_t keep = csd_tag_partial(p, n, OPEN_TAG, OPEN_LEN);
    keep += space_before(p, n - keep);
    return give(s, n - keep);
}

/* Inside a call: closes it at its close tag, or gives it up as content when it grows too long.
 * The search starts where the last one left off, so a long body is scanned once, not per piece. */
static int scan_call(csd_tool_split *s) {
    const char *p = s->pending.data;
    size_t n = s->pending.len, body = s->lead + OPEN_LEN;
    const char *hit = memmem(p + s->searched, n - s->searched, CLOSE_TAG, CLOSE_LEN);
    if (hit) {
        size_t end = (size_t)(hit - p);
        if (end - body <= CSD_TOOL_CALL_MAX_BYTES) return close_call(s, body, end, end + CLOSE_LEN);
        s->in_call = false; /* too long to be a call, however it arrived */
        return give(s, end + CLOSE_LEN);
    }
    if (n - body >= CLOSE_LEN) s->searched = n - (CLOSE_LEN - 1);
    /* given up only once the body alone (not a close tag still arriving) is over the limit */
    size_t arriving = csd_tag_partial(p, n, CLOSE_TAG, CLOSE_LEN);
    if (n - arriving - body > CSD_TOOL_CALL_MAX_BYTES) {
        s->in_call = false;
        s->skipping = true; /* content through its close tag, as if it had come whole */
        return give(s, n - arriving);
    }
    return 0;
}

static void hand_out(const csd_tool_split *s, const char **content, size_t *content_len) {
    *content = s->out.data ? s->out.data : "";
    *content_len = s->out.len;
}

int csd_tool_split_push(csd_tool_split *s, const char *text, size_t len, const char **content,
                        size_t *content_len) {
    s->out.len = 0;
    hand_out(s, content, content_len);
    if (csd_http_buf_append(&s->pending, text, len)) return CSD_ENOMEM;
    int rc = 0;
    if (s->plain) {
        rc = give(s, s->pending.len);
    } else if (s->whole) {
        if (s->pending.len > CSD_TOOL_CALL_MAX_BYTES) { /* not a call: all of it is content */
            s->plain = true;
            rc = give(s, s->pending.len);
        }
    } else {
        /* each turn enters a call or ends one (consuming its tags), or finds nothing more */
        for (bool was = s->in_call; !rc; was = s->in_call) {
            rc = was ? scan_call(s) : scan_text(s);
            if (s->in_call == was) break;
        }
    }
    hand_out(s, content, content_len);
    return rc;
}

int csd_tool_split_finish(csd_tool_split *s, const char **content, size_t *content_len) {
    s->out.len = 0;
    const char *p = s->pending.data;
    size_t n = s->pending.len;
    int rc = 0;
    if (s->plain) /* everything was handed out as it came */
        rc = 0;
    else if (s->whole && n)
        rc = close_call(s, 0, n, n);
    else if (s->in_call) /* a call cut inside its close tag is parsed without the cut tag */
        rc = close_call(s, s->lead + OPEN_LEN, n - csd_tag_partial(p, n, CLOSE_TAG, CLOSE_LEN), n);
    n = s->pending.len;
    if (!rc && n) {
        /* what is left was held back: whitespace after the last call is dropped */
        if (s->n_calls && space_before(s->pending.data, n) == n)
            drop(s, n);
        else
            rc = give(s, n);
    }
    s->plain = true; /* anything pushed after the end is content */
    hand_out(s, content, content_len);
    return rc;
}
