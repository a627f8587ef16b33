/* tool_calls: tool calls split out of a streamed answer (see tool_calls.h).
 *
 * pending holds what is not handed out yet. Outside a call it is the answer's tail that may still
 * matter: trailing whitespace and a proper prefix of the open tag. Inside a call it is the
 * whitespace before the open tag (lead bytes), the tag and the body so far: if the call turns out
 * not to be one, all of it goes to the content as written. In bare and whole mode it is the whole
 * answer so far. */
#include "tool_calls.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "tag_scan.h"

static const char OPEN_TAG[] = "<tool_call>";
static const char CLOSE_TAG[] = "</tool_call>";
#define OPEN_LEN (sizeof OPEN_TAG - 1)
#define CLOSE_LEN (sizeof CLOSE_TAG - 1)
/* Llama 3.1's tag before a call (its vocabulary marks it special, so it is usually not seen) */
static const char PYTHON_TAG[] = "<|python_tag|>";
#define PYTHON_LEN (sizeof PYTHON_TAG - 1)
/* Mistral's tags (special tokens the detokenizer is told to show: http_job.c) */
static const char MISTRAL_TAG[] = "[TOOL_CALLS]";
static const char ARGS_TAG[] = "[ARGS]";
static const char CALL_ID_TAG[] = "[CALL_ID]";
#define MISTRAL_LEN (sizeof MISTRAL_TAG - 1)

void csd_tool_split_init(csd_tool_split *s, int mode) {
    memset(s, 0, sizeof *s);
    s->mode = mode;
    s->whole = mode == CSD_TOOL_SPLIT_WHOLE;
    s->sniffing = mode == CSD_TOOL_SPLIT_BARE;
}

int csd_tool_split_mode_for_template(const char *src) {
    if (!src || strstr(src, OPEN_TAG)) return CSD_TOOL_SPLIT_TAGS;
    if (strstr(src, MISTRAL_TAG)) return CSD_TOOL_SPLIT_MISTRAL;
    bool llama3 = strstr(src, PYTHON_TAG) || strstr(src, "respond with a JSON for a function call");
    return llama3 ? CSD_TOOL_SPLIT_BARE : CSD_TOOL_SPLIT_TAGS;
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
    int rc = csd_tool_call_parse(s->pending.data + body_start, body_end - body_start, false, &c);
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
    bool mistral = s->mode == CSD_TOOL_SPLIT_MISTRAL;
    const char *tag = mistral ? MISTRAL_TAG : OPEN_TAG;
    size_t tag_len = mistral ? MISTRAL_LEN : OPEN_LEN;
    const char *hit = memmem(p, n, tag, tag_len);
    if (hit) {
        size_t at = (size_t)(hit - p);
        size_t lead = space_before(p, at);
        int rc = give(s, at - lead);
        if (mistral) { /* the rest of the answer is calls: held back to its end */
            s->whole = true;
            return rc;
        }
        s->lead = lead;
        s->searched = lead + OPEN_LEN;
        s->in_call = true;
        return rc;
    }
    size_t keep = csd_tag_partial(p, n, tag, tag_len);
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

/* ---- bare calls ---- */

/* Where the answer's calls start in p[0, n): past leading whitespace and the tag. Sets *open when
 * no call starts there: what follows is still undecided (all whitespace, or a proper prefix of the
 * tag), or what comes before it is over CSD_TOOL_SPACE_MAX bytes (too long a lead to be calls,
 * the same bound however the text arrives). */
static size_t bare_start(const char *p, size_t n, bool *open) {
    size_t i = csd_tag_space_after(p, n, n);
    *open = i == n || csd_tag_partial(p + i, n - i, PYTHON_TAG, PYTHON_LEN) == n - i;
    if (!*open && n - i >= PYTHON_LEN && !memcmp(p + i, PYTHON_TAG, PYTHON_LEN)) {
        i += PYTHON_LEN;
        i += csd_tag_space_after(p + i, n - i, n - i);
        *open = i == n;
    }
    if (i > CSD_TOOL_SPACE_MAX) *open = true;
    return i;
}

/* Bare mode, before the answer's first telling byte: '{' holds the answer back as calls (whole),
 * anything else makes it all content. What comes before it (whitespace, the tag) is held for at
 * most CSD_TOOL_SPACE_MAX bytes. */
static int sniff(csd_tool_split *s) {
    bool open;
    size_t at = bare_start(s->pending.data, s->pending.len, &open);
    if (open && at <= CSD_TOOL_SPACE_MAX) return 0;
    s->sniffing = false;
    if (!open && s->pending.data[at] == '{') {
        s->whole = true;
        return 0;
    }
    s->plain = true;
    return give(s, s->pending.len);
}

/* Keeps call c (s owns it from here), or 1 when s holds CSD_TOOL_CALLS_MAX calls already. */
static int add_call(csd_tool_split *s, const csd_tool_call *c) {
    if (s->n_calls == CSD_TOOL_CALLS_MAX) return 1;
    s->calls[s->n_calls++] = *c;
    return 0;
}

/* Ends a held-back answer: when calls (rc 0) the calls split off since `first` stay and pending
 * is dropped; else they are undone and all of pending is content as written (rc 1), or rc is an
 * error. */
static int settle(csd_tool_split *s, int first, int rc) {
    s->whole = false;
    if (!rc) {
        drop(s, s->pending.len);
        return 0;
    }
    while (s->n_calls > first) csd_tool_call_fini(&s->calls[--s->n_calls]);
    return rc < 0 ? rc : give(s, s->pending.len);
}

/* The held-back answer as calls: the tag (bare mode), then objects separated by ';' (one after the
 * last is taken too), whitespace around each. */
static int close_calls(csd_tool_split *s) {
    const char *p = s->pending.data;
    size_t n = s->pending.len;
    bool open;
    size_t i = bare_start(p, n, &open);
    int first = s->n_calls, rc = 1;
    while (!open && i < n && p[i] == '{') {
        size_t end = csd_tool_json_close(p + i, n - i);
        if (!end) break;
        csd_tool_call c;
        if ((rc = csd_tool_call_parse(p + i, end, s->mode == CSD_TOOL_SPLIT_BARE, &c))) break;
        if ((rc = add_call(s, &c))) {
            csd_tool_call_fini(&c);
            break;
        }
        i += end;
        i += csd_tag_space_after(p + i, n - i, n - i);
        if (i == n) break;
        rc = 1; /* a ';' and another call, or this is not a list of calls */
        if (p[i] != ';') break;
        i++;
        i += csd_tag_space_after(p + i, n - i, n - i);
        if (i == n) rc = 0;
    }
    return settle(s, first, rc);
}

/* ---- Mistral's calls ---- */

/* Does p[i, n) start with tag? */
static bool at_tag(const char *p, size_t i, size_t n, const char *tag) {
    size_t len = strlen(tag);
    return n - i >= len && !memcmp(p + i, tag, len);
}

/* Tokenizer v3's list at p[*i] == '[': [{"name", "arguments"}, ...], at least one. */
static int mistral_list(csd_tool_split *s, const char *p, size_t n, size_t *i) {
    size_t k = *i + 1;
    for (;;) {
        k += csd_tag_space_after(p + k, n - k, n - k);
        size_t end = k < n && p[k] == '{' ? csd_tool_json_close(p + k, n - k) : 0;
        if (!end) return 1;
        csd_tool_call c;
        int rc = csd_tool_call_parse(p + k, end, true, &c);
        if (!rc && (rc = add_call(s, &c))) csd_tool_call_fini(&c);
        if (rc) return rc;
        k += end;
        k += csd_tag_space_after(p + k, n - k, n - k);
        if (k < n && p[k] == ']') break;
        if (k >= n || p[k] != ',') return 1;
        k++;
    }
    *i = k + 1;
    return 0;
}

/* A byte of a function's name or of a call id: ASCII letters, digits and _ - . : */
static bool name_byte(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("_-.:", c));
}

/* Tokenizer v11's name[ARGS]{...} at p[*i], or name[CALL_ID]id[ARGS]{...} (the id is ours to give,
 * so it is skipped). Names and ids are name_bytes. */
static int mistral_named(csd_tool_split *s, const char *p, size_t n, size_t *i) {
    size_t k = *i;
    while (k < n && name_byte(p[k])) k++;
    size_t name_end = k;
    if (at_tag(p, k, n, CALL_ID_TAG)) {
        k += sizeof CALL_ID_TAG - 1;
        while (k < n && name_byte(p[k])) k++;
    }
    if (name_end == *i || !at_tag(p, k, n, ARGS_TAG)) return 1;
    k += sizeof ARGS_TAG - 1;
    k += csd_tag_space_after(p + k, n - k, n - k);
    size_t end = k < n && p[k] == '{' ? csd_tool_json_close(p + k, n - k) : 0;
    if (!end) return 1;
    csd_tool_call c;
    int rc = csd_tool_call_make(p + *i, name_end - *i, p + k, end, &c);
    if (!rc && (rc = add_call(s, &c))) csd_tool_call_fini(&c);
    *i = k + end;
    return rc;
}

/* The held-back answer from [TOOL_CALLS] on: each tag followed by a list of calls or by one named
 * call, whitespace between; one call at least. */
static int close_mistral(csd_tool_split *s) {
    const char *p = s->pending.data;
    size_t n = s->pending.len, i = csd_tag_space_after(p, n, n);
    int first = s->n_calls, rc = i < n ? 0 : 1;
    while (!rc && i < n) {
        if (!at_tag(p, i, n, MISTRAL_TAG)) {
            rc = 1;
            break;
        }
        i += MISTRAL_LEN;
        i += csd_tag_space_after(p + i, n - i, n - i);
        rc = i < n && p[i] == '[' ? mistral_list(s, p, n, &i) : mistral_named(s, p, n, &i);
        if (!rc) i += csd_tag_space_after(p + i, n - i, n - i);
    }
    return settle(s, first, rc ? rc : s->n_calls > first ? 0 : 1);
}

static void hand_out(const csd_tool_split *s, const char **content, size_t *content_len) {
    *content = s->out.data ? s->out.data : "";
    *content_len = s->out.len;
}

/* Hands out what the text so far makes content, and splits off the calls it completes. */
static int scan(csd_tool_split *s) {
    if (s->sniffing) {
        int rc = sniff(s);
        if (rc || s->sniffing) return rc; /* bare mode, still undecided: held back */
    }
    if (s->plain) return give(s, s->pending.len);
    /* each turn enters a call or ends one (consuming its tags), or finds nothing more; Mistral's
     * tag makes the rest of the answer whole */
    int rc = 0;
    for (bool was = s->in_call; !s->whole && !rc; was = s->in_call) {
        rc = was ? scan_call(s) : scan_text(s);
        if (s->in_call == was) break;
    }
    /* held back to the end, unless too long to be calls (the same bound however it arrived) */
    if (rc || !s->whole || s->pending.len <= CSD_TOOL_CALL_MAX_BYTES) return rc;
    s->plain = true;
    return give(s, s->pending.len);
}

int csd_tool_split_push(csd_tool_split *s, const char *text, size_t len, const char **content,
                        size_t *content_len) {
    s->out.len = 0;
    hand_out(s, content, content_len);
    if (csd_http_buf_append(&s->pending, text, len)) return CSD_ENOMEM;
    int rc = scan(s);
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
        rc = s->mode == CSD_TOOL_SPLIT_MISTRAL ? close_mistral(s) : close_calls(s);
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
    s->sniffing = false;
    s->plain = true; /* anything pushed after the end is content */
    hand_out(s, content, content_len);
    return rc;
}
