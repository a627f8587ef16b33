/* think_split: thinking split from the answer (see think_split.h). pending holds what is not
 * handed out yet: leading whitespace and a partial "<think>" at the start, trailing whitespace and
 * a partial "</think>" inside, nothing after. */
#include "think_split.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "tag_scan.h"

static const char OPEN_TAG[] = "<think>";
static const char CLOSE_TAG[] = "</think>";
#define OPEN_LEN (sizeof OPEN_TAG - 1)
#define CLOSE_LEN (sizeof CLOSE_TAG - 1)

enum { REASONING = 0, CONTENT = 1 };

bool csd_think_prompt_opens(const char *prompt) {
    size_t n = strlen(prompt);
    n -= csd_tag_space_before(prompt, n, n);
    return n >= OPEN_LEN && !memcmp(prompt + n - OPEN_LEN, OPEN_TAG, OPEN_LEN);
}

void csd_think_split_init(csd_think_split *s, bool open) {
    memset(s, 0, sizeof *s);
    s->state = open ? CSD_THINK_INSIDE : CSD_THINK_START;
    s->at_start = true;
}

void csd_think_split_fini(csd_think_split *s) {
    if (!s) return;
    csd_http_buf_fini(&s->pending);
    csd_http_buf_fini(&s->out[0]);
    csd_http_buf_fini(&s->out[1]);
    memset(s, 0, sizeof *s);
}

static void drop(csd_think_split *s, size_t n) { csd_http_buf_drop(&s->pending, n); }

/* Hands out pending[0, n) as reasoning or content, and drops it. */
static int give(csd_think_split *s, int to, size_t n) {
    if (!n) return 0;
    if (csd_http_buf_append(&s->out[to], s->pending.data, n)) return CSD_ENOMEM;
    drop(s, n);
    return 0;
}

/* Leading whitespace of pending, counted up to limit. */
static size_t space_after_start(const csd_think_split *s, size_t limit) {
    return csd_tag_space_after(s->pending.data, s->pending.len, limit);
}

/* Trailing whitespace ending at pending[n), counted up to CSD_THINK_SPACE_MAX. */
static size_t space_before(const csd_think_split *s, size_t n) {
    return csd_tag_space_before(s->pending.data, n, CSD_THINK_SPACE_MAX);
}

/* Before anything but whitespace: the open tag starts thinking; anything else is the answer.
 * Returns 1 when it moved to another state. */
static int step_start(csd_think_split *s, int *rc) {
    size_t ws = space_after_start(s, CSD_THINK_SPACE_MAX + 1);
    size_t rest = s->pending.len - ws;
    bool short_space = ws <= CSD_THINK_SPACE_MAX;
    if (short_space && rest >= OPEN_LEN && !memcmp(s->pending.data + ws, OPEN_TAG, OPEN_LEN)) {
        drop(s, ws + OPEN_LEN);
        s->state = CSD_THINK_INSIDE;
        return 1;
    }
    if (short_space && rest < OPEN_LEN && !memcmp(s->pending.data + ws, OPEN_TAG, rest))
        return 0; /* may still become the tag */
    s->state = CSD_THINK_CONTENT;
    *rc = give(s, CONTENT, s->pending.len);
    return 1;
}

/* Thinking: hands out all but trailing whitespace and a partial close tag; the close tag ends
 * it. */
static int step_inside(csd_think_split *s, int *rc) {
    if (s->at_start) { /* whitespace right after <think> is layout */
        size_t ws = space_after_start(s, s->pending.len);
        drop(s, ws);
        if (!s->pending.len) return 0;
        s->at_start = false;
    }
    const char *hit = memmem(s->pending.data, s->pending.len, CLOSE_TAG, CLOSE_LEN);
    if (hit) {
        size_t at = (size_t)(hit - s->pending.data);
        size_t ws = space_before(s, at);
        *rc = give(s, REASONING, at - ws);
        drop(s, ws + CLOSE_LEN);
        s->state = CSD_THINK_AFTER;
        return 1;
    }
    size_t keep = csd_tag_partial(s->pending.data, s->pending.len, CLOSE_TAG, CLOSE_LEN);
    keep += space_before(s, s->pending.len - keep);
    *rc = give(s, REASONING, s->pending.len - keep);
    return 0;
}

/* Past </think>: whitespace is dropped until the answer starts. */
static int step_after(csd_think_split *s, int *rc) {
    drop(s, space_after_start(s, s->pending.len));
    if (!s->pending.len) return 0;
    s->state = CSD_THINK_CONTENT;
    *rc = give(s, CONTENT, s->pending.len);
    return 1;
}

static void hand_out(const csd_think_split *s, const char **reasoning, size_t *reasoning_len,
                     const char **content, size_t *content_len) {
    *reasoning = s->out[REASONING].data ? s->out[REASONING].data : "";
    *reasoning_len = s->out[REASONING].len;
    *content = s->out[CONTENT].data ? s->out[CONTENT].data : "";
    *content_len = s->out[CONTENT].len;
}

int csd_think_split_push(csd_think_split *s, const char *text, size_t len, const char **reasoning,
                         size_t *reasoning_len, const char **content, size_t *content_len) {
    s->out[REASONING].len = s->out[CONTENT].len = 0;
    int rc = csd_http_buf_append(&s->pending, text, len);
    for (int moved = 1; moved && !rc;) {
        switch (s->state) {
        case CSD_THINK_START: moved = step_start(s, &rc); break;
        case CSD_THINK_INSIDE: moved = step_inside(s, &rc); break;
        case CSD_THINK_AFTER: moved = step_after(s, &rc); break;
        default: rc = give(s, CONTENT, s->pending.len), moved = 0; break;
        }
    }
    hand_out(s, reasoning, reasoning_len, content, content_len);
    return rc;
}

int csd_think_split_finish(csd_think_split *s, const char **reasoning, size_t *reasoning_len,
                           const char **content, size_t *content_len) {
    s->out[REASONING].len = s->out[CONTENT].len = 0;
    int rc = 0;
    if (s->state == CSD_THINK_START) {
        rc = give(s, CONTENT, s->pending.len); /* whitespace or a partial "<think>": text */
    } else if (s->state == CSD_THINK_INSIDE) {
        /* thinking cut short: a partial close tag is thinking text; trailing whitespace is not */
        if (space_before(s, s->pending.len) == s->pending.len) drop(s, s->pending.len);
        rc = give(s, REASONING, s->pending.len);
    } else {
        drop(s, s->pending.len);
    }
    s->state = CSD_THINK_CONTENT; /* anything pushed after the end is content */
    hand_out(s, reasoning, reasoning_len, content, content_len);
    return rc;
}
