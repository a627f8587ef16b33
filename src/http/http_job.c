/* http_job: one HTTP request's bridge to the engine (see http_internal.h). The engine threads
 * detokenize, apply stop strings and format OpenAI chunks (SSE) or accumulate text; the
 * connection thread waits on the job's condition variable, polling its socket so a client that
 * hangs up cancels the request (and frees its KV cache) within a poll interval. */
#include <poll.h>
#include <stdio.h>
#include <sodium.h>
#include <string.h>

#include "core/alloc.h"
#include "core/build_info.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "http_internal.h"

/* How often a waiting connection thread checks its socket and the stop flag (ms). */
#define WAIT_POLL_MS 50

/* ---- byte buffer ---- */

int csd_http_buf_append(csd_http_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *nd = csd_alloc(cap);
        if (!nd) return CSD_ENOMEM;
        if (b->len) memcpy(nd, b->data, b->len);
        csd_free(b->data);
        b->data = nd;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

void csd_http_buf_fini(csd_http_buf *b) {
    csd_free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- lifecycle ---- */

/* An id's random part: 24 hex digits (96 bits) from libsodium's system generator (the server
 * initialises libsodium; its generator would also set itself up on first use). */
#define JOB_ID_RANDOM_BYTES 12
static void random_hex(char out[2 * JOB_ID_RANDOM_BYTES + 1]) {
    uint8_t raw[JOB_ID_RANDOM_BYTES];
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(out, 2 * JOB_ID_RANDOM_BYTES + 1, raw, sizeof raw);
}

int csd_http_job_create(csd_http_job **out, const csd_http_req *req, const csd_tok *tok,
                        const char *model_name, csd_engine *engine, int64_t n_prompt) {
    *out = NULL;
    csd_http_job *j = csd_alloc(sizeof *j);
    if (!j) return CSD_ENOMEM;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->kind = req->kind;
    j->stream = req->stream;
    j->include_usage = req->stream && req->include_usage;
    j->logprobs = req->logprobs;
    j->top_logprobs = req->top_logprobs;
    bool chat = req->kind == CSD_HTTP_KIND_CHAT;
    char hex[2 * JOB_ID_RANDOM_BYTES + 1];
    random_hex(hex);
    snprintf(j->id, sizeof j->id, "%s%s", chat ? "chatcmpl-" : "cmpl-", hex);
    j->created = (long long)time(NULL);
    snprintf(j->model, sizeof j->model, "%s", model_name);
    j->tok = tok;
    j->engine = engine;
    j->n_prompt = n_prompt;
    csd_detok_init(&j->detok, tok, true);
    /* a completion continues its prompt: keep the leading space a decoder strips at text start */
    if (!chat) j->detok.at_start = false;
    for (int i = 0; i < req->n_stop; i++) {
        if (!(j->stops[i] = csd_strdup(req->stop[i]))) {
            csd_http_job_release(j);
            return CSD_ENOMEM;
        }
        j->n_stop = i + 1;
    }
    csd_http_stop_init(&j->stop, j->stops, j->n_stop);
    if (j->logprobs && !j->stream) {
        j->lp = chat ? json_array()
                     : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                                 "top_logprobs", "text_offset");
        if (!j->lp) {
            csd_http_job_release(j);
            return CSD_ENOMEM;
        }
    }
    *out = j;
    return 0;
}

void csd_http_job_release(csd_http_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    csd_http_stop_fini(&j->stop);
    for (int i = 0; i < j->n_stop; i++)
        csd_free(j->stops[i]);
    csd_http_buf_fini(&j->out);
    csd_http_buf_fini(&j->text);
    json_decref(j->lp);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    csd_free(j);
}

/* ---- chunk formatting ---- */

static json_t *chunk_base(const csd_http_job *j) {
    bool chat = j->kind == CSD_HTTP_KIND_CHAT;
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", j->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", j->model, "system_fingerprint",
                          csd_build_fingerprint());
    if (c && j->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

/* Appends "data: <json>\n\n" (steals c). Call with mu held. */
static int emit_event(csd_http_job *j, json_t *c) {
    if (!c) return CSD_ENOMEM;
    char *s = json_dumps(c, JSON_COMPACT);
    json_decref(c);
    if (!s) return CSD_ENOMEM;
    int rc = csd_http_buf_append(&j->out, "data: ", 6);
    if (!rc) rc = csd_http_buf_append(&j->out, s, strlen(s));
    if (!rc) rc = csd_http_buf_append(&j->out, "\n\n", 2);
    free(s);
    return rc;
}

/* One choice chunk: text (may be NULL for the final one), logprobs (stolen, may be NULL),
 * finish reason (NULL while going on), role chunk for chat's first event. */
static int emit_choice(csd_http_job *j, const char *text, size_t len, json_t *lp,
                       const char *finish, bool role) {
    json_t *c = chunk_base(j);
    json_t *choice = json_pack("{s:i}", "index", 0);
    if (!c || !choice) {
        json_decref(c);
        json_decref(choice);
        json_decref(lp);
        return CSD_ENOMEM;
    }
    if (j->kind == CSD_HTTP_KIND_CHAT) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (text)
            json_object_set_new(delta, "content", json_stringn(text, len));
        else if (role)
            json_object_set_new(delta, "content", json_string(""));
        json_object_set_new(choice, "delta", delta);
        json_object_set_new(choice, "logprobs",
                            lp ? json_pack("{s:o}", "content", lp) : json_null());
    } else {
        json_object_set_new(choice, "text", text ? json_stringn(text, len) : json_string(""));
        json_object_set_new(choice, "logprobs", lp ? lp : json_null());
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    return emit_event(j, c);
}

int csd_http_job_begin(csd_http_job *j, const char *echo, size_t echo_len) {
    int rc = 0;
    pthread_mutex_lock(&j->mu);
    if (j->stream) {
        if (j->kind == CSD_HTTP_KIND_CHAT)
            rc = emit_choice(j, NULL, 0, NULL, NULL, true);
        else if (echo_len)
            rc = emit_choice(j, echo, echo_len, NULL, NULL, false);
    } else if (echo_len) {
        rc = csd_http_buf_append(&j->text, echo, echo_len);
    }
    j->text_offset = (int64_t)echo_len;
    pthread_mutex_unlock(&j->mu);
    return rc;
}

/* ---- logprobs ---- */

/* The text of one token for logprobs (special tokens included, as OpenAI shows them). */
static json_t *token_text(const csd_tok *tok, int32_t id) {
    char *s = NULL;
    if (csd_tok_decode(tok, &id, 1, false, &s, NULL) != 0 || !s) return json_string("");
    json_t *v = json_string(s); /* NULL when the token alone is not valid UTF-8 */
    if (!v) v = json_string("\xef\xbf\xbd");
    csd_free(s);
    return v;
}

static json_t *token_bytes(const csd_tok *tok, int32_t id) {
    char *s = NULL;
    json_t *arr = json_array();
    if (csd_tok_decode(tok, &id, 1, false, &s, NULL) == 0 && s)
        for (const unsigned char *p = (const unsigned char *)s; *p; p++)
            json_array_append_new(arr, json_integer(*p));
    csd_free(s);
    return arr;
}

/* Chat: {"token", "logprob", "bytes", "top_logprobs": [...]}. */
static json_t *chat_lp_entry(const csd_http_job *j, const csd_token_event *ev) {
    json_t *top = json_array();
    for (int i = 0; i < ev->n_top && i < j->top_logprobs; i++)
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token",
                                             token_text(j->tok, ev->top_ids[i]), "logprob",
                                             (double)ev->top_logprobs[i], "bytes",
                                             token_bytes(j->tok, ev->top_ids[i])));
    return json_pack("{s:o, s:f, s:o, s:o}", "token", token_text(j->tok, ev->id), "logprob",
                     (double)ev->logprob, "bytes", token_bytes(j->tok, ev->id), "top_logprobs",
                     top);
}

/* Completions: appends one token to {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static void completion_lp_add(const csd_http_job *j, json_t *lp, const csd_token_event *ev,
                              int64_t offset) {
    json_array_append_new(json_object_get(lp, "tokens"), token_text(j->tok, ev->id));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real((double)ev->logprob));
    json_t *top = json_object();
    for (int i = 0; i < ev->n_top && i < j->top_logprobs; i++) {
        json_t *t = token_text(j->tok, ev->top_ids[i]);
        json_object_set_new(top, json_string_value(t), json_real((double)ev->top_logprobs[i]));
        json_decref(t);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer(offset));
}

/* ---- engine callbacks ---- */

/* Queues generated text (and the logprobs of the token that produced it). mu held. */
static int add_text(csd_http_job *j, const char *text, size_t len, const csd_token_event *ev) {
    int rc = 0;
    if (j->stream) {
        json_t *lp = NULL;
        if (ev && j->logprobs) {
            if (j->kind == CSD_HTTP_KIND_CHAT) {
                lp = json_pack("[o]", chat_lp_entry(j, ev));
            } else {
                lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                               "top_logprobs", "text_offset");
                if (lp) completion_lp_add(j, lp, ev, j->text_offset);
            }
        }
        if (len || lp) rc = emit_choice(j, text, len, lp, NULL, false);
    } else {
        if (ev && j->lp) {
            if (j->kind == CSD_HTTP_KIND_CHAT)
                json_array_append_new(j->lp, chat_lp_entry(j, ev));
            else
                completion_lp_add(j, j->lp, ev, j->text_offset);
        }
        rc = csd_http_buf_append(&j->text, text, len);
    }
    j->text_offset += (int64_t)len;
    return rc;
}

bool csd_http_job_on_token(void *ctx, const csd_token_event *ev) {
    csd_http_job *j = ctx;
    size_t n = 0;
    const char *emit = "";
    size_t emit_len = 0;
    int stopped = 0;
    if (csd_detok_push(&j->detok, ev->id, j->piece, sizeof j->piece, &n) != 0) n = 0;
    stopped = csd_http_stop_push(&j->stop, j->piece, n, &emit, &emit_len);
    if (stopped < 0) return true; /* out of memory: end the request rather than lose text */
    pthread_mutex_lock(&j->mu);
    int rc = add_text(j, emit, emit_len, ev);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return stopped == 1 || rc != 0;
}

static const char *finish_name(int end) { return end == CSD_REQ_END_LENGTH ? "length" : "stop"; }

void csd_http_job_on_done(void *ctx, const csd_req_result *res) {
    csd_http_job *j = ctx;
    /* the detokenizer's held-back bytes may still complete a stop string */
    size_t n = 0;
    const char *emit = "", *rest = "";
    size_t emit_len = 0, rest_len = 0;
    if (csd_detok_flush(&j->detok, j->piece, sizeof j->piece, &n) != 0) n = 0;
    if (csd_http_stop_push(&j->stop, j->piece, n, &emit, &emit_len) < 0) emit_len = 0;
    pthread_mutex_lock(&j->mu);
    add_text(j, emit, emit_len, NULL);
    csd_http_stop_flush(&j->stop, &rest, &rest_len);
    add_text(j, rest, rest_len, NULL);
    j->res = *res;
    if (j->stream && res->end != CSD_REQ_END_CANCELLED) {
        if (res->end == CSD_REQ_END_ERROR) {
            csd_http_error e;
            csd_http_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                               res->message);
            char *s = csd_http_error_json(&e);
            if (s) {
                csd_http_buf_append(&j->out, "data: ", 6);
                csd_http_buf_append(&j->out, s, strlen(s));
                csd_http_buf_append(&j->out, "\n\n", 2);
                free(s);
            }
        } else {
            emit_choice(j, NULL, 0, NULL, finish_name(res->end), false);
            if (j->include_usage) {
                json_t *c = chunk_base(j);
                if (c) {
                    json_object_set_new(c, "choices", json_array());
                    json_object_set_new(
                        c, "usage",
                        json_pack("{s:I, s:I, s:I}", "prompt_tokens",
                                  (json_int_t)res->prompt_tokens, "completion_tokens",
                                  (json_int_t)res->completion_tokens, "total_tokens",
                                  (json_int_t)(res->prompt_tokens + res->completion_tokens)));
                    emit_event(j, c);
                }
            }
        }
        csd_http_buf_append(&j->out, "data: [DONE]\n\n", 14);
    }
    j->done = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    CSD_LOGD("request done req=%s end=%d prompt=%lld completion=%lld ttft=%.3f total=%.3f", j->id,
             res->end, (long long)res->prompt_tokens, (long long)res->completion_tokens,
             res->ttft_s, res->total_s);
    csd_http_job_release(j); /* the engine's reference */
}

/* ---- connection side ---- */

/* True when the peer closed or reset the connection. */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void wait_a_bit(csd_http_job *j) {
    struct timespec ts = csd_realtime_in_ms(WAIT_POLL_MS);
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

/* mu held: is it time to give up on this request? Cancels it when so. */
static bool abandon(csd_http_job *j, int fd, const atomic_int *stopping) {
    if (!atomic_load(stopping) && !client_gone(fd)) return false;
    CSD_LOGI("client gone or server stopping, cancelling req=%s", j->id);
    if (!j->done) { /* not under our lock: the engine may hold its own while calling on_done */
        pthread_mutex_unlock(&j->mu);
        csd_engine_cancel(j->engine, j->engine_id);
        pthread_mutex_lock(&j->mu);
    }
    return true;
}

bool csd_http_job_wait(csd_http_job *j, int fd, const atomic_int *stopping) {
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        if (abandon(j, fd, stopping)) {
            pthread_mutex_unlock(&j->mu);
            return false;
        }
        wait_a_bit(j);
    }
    pthread_mutex_unlock(&j->mu);
    return true;
}

ssize_t csd_http_job_read(csd_http_job *j, char *buf, size_t max, int fd,
                          const atomic_int *stopping) {
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out_sent < j->out.len) {
            size_t n = j->out.len - j->out_sent;
            if (n > max) n = max;
            memcpy(buf, j->out.data + j->out_sent, n);
            j->out_sent += n;
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->done) break;
        if (abandon(j, fd, stopping)) {
            pthread_mutex_unlock(&j->mu);
            return -1;
        }
        wait_a_bit(j);
    }
    bool clean = j->res.end != CSD_REQ_END_CANCELLED;
    pthread_mutex_unlock(&j->mu);
    return clean ? 0 : -1;
}

char *csd_http_job_response(csd_http_job *j, int *status) {
    pthread_mutex_lock(&j->mu);
    const csd_req_result *res = &j->res;
    char *s = NULL;
    if (res->end == CSD_REQ_END_ERROR || res->end == CSD_REQ_END_CANCELLED) {
        csd_http_error e;
        csd_http_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                           res->end == CSD_REQ_END_CANCELLED ? "cancelled" : res->message);
        *status = 500;
        pthread_mutex_unlock(&j->mu);
        return csd_http_error_json(&e);
    }
    bool chat = j->kind == CSD_HTTP_KIND_CHAT;
    json_t *text = json_stringn(j->text.data ? j->text.data : "", j->text.len);
    if (!text) text = json_string("");
    json_t *choice;
    if (chat) {
        choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", 0, "message", "role",
                           "assistant", "content", text, "logprobs",
                           j->lp ? json_pack("{s:O}", "content", j->lp) : json_null(),
                           "finish_reason", finish_name(res->end));
    } else {
        choice = json_pack("{s:i, s:o, s:O, s:s}", "index", 0, "text", text, "logprobs",
                           j->lp ? j->lp : json_null(), "finish_reason", finish_name(res->end));
    }
    json_t *root =
        json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o], s:{s:I, s:I, s:I}}", "id", j->id, "object",
                  chat ? "chat.completion" : "text_completion", "created", (json_int_t)j->created,
                  "model", j->model, "system_fingerprint", csd_build_fingerprint(), "choices",
                  choice, "usage", "prompt_tokens", (json_int_t)res->prompt_tokens,
                  "completion_tokens", (json_int_t)res->completion_tokens, "total_tokens",
                  (json_int_t)(res->prompt_tokens + res->completion_tokens));
    pthread_mutex_unlock(&j->mu);
    if (root) s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    *status = s ? 200 : 500;
    return s;
}
