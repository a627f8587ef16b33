/* http_job: one HTTP request's bridge to the engine (see http_internal.h). The engine threads
 * detokenize, apply stop strings and format OpenAI chunks (SSE) or accumulate text; the
 * connection thread waits on the job's condition variable, polling its socket so a client that
 * hangs up cancels the request (and frees its KV cache) within a poll interval. */
#include <stdio.h>
#include <sodium.h>
#include <string.h>

#include "core/alloc.h"
#include "core/build_info.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "mhd/mhd_glue.h"
#include "core/utf8.h"
#include "http_internal.h"

/* How often a waiting connection thread checks its socket and the stop flag (ms). */
#define WAIT_POLL_MS 50

/* ---- lifecycle ---- */

/* An id's random part: 24 hex digits (96 bits) from libsodium's system generator (the server
 * initialises libsodium; its generator would also set itself up on first use). */
#define JOB_ID_RANDOM_BYTES 12
static void random_hex(char out[2 * JOB_ID_RANDOM_BYTES + 1]) {
    uint8_t raw[JOB_ID_RANDOM_BYTES];
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(out, 2 * JOB_ID_RANDOM_BYTES + 1, raw, sizeof raw);
}

/* Sets up choice i's text state. */
static int choice_init(csd_http_job *j, int i) {
    csd_http_choice *ch = &j->choices[i];
    ch->job = j;
    ch->index = i;
    csd_detok_init(&ch->detok, j->tok, true);
    /* a completion continues its prompt: keep the leading space a decoder strips at text start */
    if (j->kind != CSD_HTTP_KIND_CHAT) ch->detok.at_start = false;
    csd_http_stop_init(&ch->stop, j->stops, j->n_stop);
    bool pick = j->tool_mode == CSD_HTTP_TOOLS_PICK;
    csd_tool_split_init(&ch->tools, pick ? CSD_TOOL_SPLIT_WHOLE : j->tool_format);
    csd_think_split_init(&ch->think, j->think == CSD_HTTP_THINK_OPEN);
    /* the tags are text even where a vocabulary marks them special */
    if (j->tool_mode == CSD_HTTP_TOOLS_AUTO && j->tool_format == CSD_TOOL_SPLIT_MISTRAL) {
        csd_detok_keep(&ch->detok, csd_tok_find(j->tok, "[TOOL_CALLS]"));
        csd_detok_keep(&ch->detok, csd_tok_find(j->tok, "[ARGS]"));
        csd_detok_keep(&ch->detok, csd_tok_find(j->tok, "[CALL_ID]"));
    } else if (j->tool_mode == CSD_HTTP_TOOLS_AUTO) {
        csd_detok_keep(&ch->detok, csd_tok_find(j->tok, "<tool_call>"));
        csd_detok_keep(&ch->detok, csd_tok_find(j->tok, "</tool_call>"));
    }
    /* the thinking tags are part of a chat answer's text whether or not it is split off
     * (--reasoning-format none shows them in the content, as llama-server does) */
    if (j->kind == CSD_HTTP_KIND_CHAT) {
        csd_detok_keep(&ch->detok, csd_tok_find(j->tok, "<think>"));
        csd_detok_keep(&ch->detok, csd_tok_find(j->tok, "</think>"));
    }
    if (j->logprobs && !j->stream) {
        ch->lp = j->kind == CSD_HTTP_KIND_CHAT
                     ? json_array()
                     : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                                 "top_logprobs", "text_offset");
        if (!ch->lp) return CSD_ENOMEM;
    }
    return 0;
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
    j->tool_mode = chat ? req->tool_mode : CSD_HTTP_TOOLS_OFF;
    /* a JSON response_format asked for a JSON answer, not calls: nothing is split out of it */
    if (j->tool_mode == CSD_HTTP_TOOLS_AUTO && req->json_object) j->tool_mode = CSD_HTTP_TOOLS_OFF;
    j->one_call = req->one_tool_call;
    j->think = chat ? req->think : CSD_HTTP_THINK_OFF;
    j->tool_format = req->tool_format;
    char hex[2 * JOB_ID_RANDOM_BYTES + 1];
    random_hex(hex);
    snprintf(j->id, sizeof j->id, "%s%s", chat ? "chatcmpl-" : "cmpl-", hex);
    j->created = (long long)time(NULL);
    snprintf(j->model, sizeof j->model, "%s", model_name);
    j->tok = tok;
    j->engine = engine;
    j->n_prompt = n_prompt;
    if (j->tool_mode == CSD_HTTP_TOOLS_NAMED && !(j->tool_name = csd_strdup(req->tool_name))) {
        csd_http_job_release(j);
        return CSD_ENOMEM;
    }
    for (int i = 0; i < req->n_stop; i++) {
        if (!(j->stops[i] = csd_strdup(req->stop[i]))) {
            csd_http_job_release(j);
            return CSD_ENOMEM;
        }
        j->n_stop = i + 1;
    }
    int n = req->n >= 1 && req->n <= CSD_HTTP_MAX_N ? req->n : 1;
    j->choices = csd_alloc_array((size_t)n, sizeof *j->choices);
    if (!j->choices) {
        csd_http_job_release(j);
        return CSD_ENOMEM;
    }
    for (; j->n_choices < n; j->n_choices++) {
        if (choice_init(j, j->n_choices)) {
            j->n_choices++; /* partly set up: release frees it */
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
    for (int i = 0; i < j->n_choices; i++) {
        csd_http_stop_fini(&j->choices[i].stop);
        csd_tool_split_fini(&j->choices[i].tools);
        csd_think_split_fini(&j->choices[i].think);
        csd_http_buf_fini(&j->choices[i].reasoning);
        csd_http_buf_fini(&j->choices[i].text);
        json_decref(j->choices[i].lp);
    }
    csd_free(j->choices);
    for (int i = 0; i < j->n_stop; i++)
        csd_free(j->stops[i]);
    csd_free(j->tool_name);
    csd_http_buf_fini(&j->out);
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

/* Appends "data: <s>\n\n" and frees s (jansson's, free()); s may be NULL (out of memory). Call
 * with mu held. */
static int emit_data(csd_http_job *j, char *s) {
    if (!s) return CSD_ENOMEM;
    int rc = csd_http_buf_append(&j->out, "data: ", 6);
    if (!rc) rc = csd_http_buf_append(&j->out, s, strlen(s));
    if (!rc) rc = csd_http_buf_append(&j->out, "\n\n", 2);
    free(s);
    return rc;
}

/* Appends "data: <json>\n\n" (steals c). Call with mu held. */
static int emit_event(csd_http_job *j, json_t *c) {
    if (!c) return CSD_ENOMEM;
    char *s = json_dumps(c, JSON_COMPACT);
    json_decref(c);
    return emit_data(j, s);
}

/* One chunk of choice `index`: text (may be NULL for the final one), logprobs (stolen, may be
 * NULL), finish reason (NULL while going on), role chunk for chat's first event. */
static int emit_choice(csd_http_job *j, int index, const char *text, size_t len, json_t *lp,
                       const char *finish, bool role) {
    json_t *c = chunk_base(j);
    json_t *choice = json_pack("{s:i}", "index", index);
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

/* ---- tool calls ---- */

/* {"id": "call_...", "type": "function", "function": {"name": ..., "arguments": ...}}, with the
 * call's "index" first when index >= 0 (a streamed delta). */
static json_t *call_json(int index, const char *name, const char *args, size_t args_len) {
    char hex[2 * JOB_ID_RANDOM_BYTES + 1], id[40];
    random_hex(hex);
    snprintf(id, sizeof id, "call_%s", hex);
    json_t *call = index >= 0 ? json_pack("{s:i}", "index", index) : json_object();
    json_t *fn = json_pack("{s:s, s:s%}", "name", name, "arguments", args, args_len);
    if (!call || !fn || json_object_set_new(call, "id", json_string(id)) ||
        json_object_set_new(call, "type", json_string("function")) ||
        json_object_set_new(call, "function", fn)) {
        json_decref(call);
        return NULL;
    }
    return call;
}

/* A chat chunk of choice index with the given delta (stolen; NULL: out of memory) and logprobs
 * (stolen; NULL: none), no finish reason. mu held. */
static int emit_delta(csd_http_job *j, int index, json_t *delta, json_t *lp) {
    json_t *c = chunk_base(j);
    json_t *choice = delta ? json_pack("{s:i, s:o, s:o, s:n}", "index", index, "delta", delta,
                                       "logprobs", lp ? lp : json_null(), "finish_reason")
                           : NULL;
    if (!delta) json_decref(lp);
    if (!c || !choice) {
        json_decref(c);
        json_decref(choice);
        return CSD_ENOMEM;
    }
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    return emit_event(j, c);
}

/* A chat chunk of choice index whose delta is one tool call's part (stolen). mu held. */
static int emit_tool_delta(csd_http_job *j, int index, json_t *call) {
    return emit_delta(j, index, call ? json_pack("{s:[o]}", "tool_calls", call) : NULL, NULL);
}

/* Streams the calls the splitter has completed and the stream has not had yet. mu held. */
static int emit_new_calls(csd_http_choice *ch) {
    while (ch->job->stream && ch->n_streamed < ch->tools.n_calls) {
        const csd_tool_call *c = &ch->tools.calls[ch->n_streamed];
        int rc = emit_tool_delta(ch->job, ch->index, call_json(ch->n_streamed, c->name,
                                                               c->arguments, strlen(c->arguments)));
        if (rc) return rc; /* not counted: the next call tries it again */
        ch->n_streamed++;
    }
    return 0;
}

/* The message's tool_calls (NULL when it has none): a named call's arguments are the answer's
 * text; otherwise the calls the splitter found. mu held. */
static json_t *tool_calls_json(const csd_http_job *j, const csd_http_choice *ch) {
    if (j->tool_mode == CSD_HTTP_TOOLS_NAMED)
        return json_pack("[o]", call_json(-1, j->tool_name, ch->text.data ? ch->text.data : "",
                                          ch->text.len));
    if (!ch->tools.n_calls) return NULL;
    json_t *arr = json_array();
    for (int i = 0; i < ch->tools.n_calls && arr; i++) {
        const csd_tool_call *c = &ch->tools.calls[i];
        json_array_append_new(arr, call_json(-1, c->name, c->arguments, strlen(c->arguments)));
    }
    return arr;
}

int csd_http_job_begin(csd_http_job *j, const char *echo, size_t echo_len) {
    int rc = 0;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n_choices && !rc; i++) {
        if (j->stream) {
            if (j->kind == CSD_HTTP_KIND_CHAT) {
                rc = emit_choice(j, i, NULL, 0, NULL, NULL, true);
                /* a named call streams its arguments: its id and name come first */
                if (!rc && j->tool_mode == CSD_HTTP_TOOLS_NAMED)
                    rc = emit_tool_delta(j, i, call_json(0, j->tool_name, "", 0));
            } else if (echo_len) {
                rc = emit_choice(j, i, echo, echo_len, NULL, NULL, false);
            }
        } else if (echo_len) {
            rc = csd_http_buf_append(&j->choices[i].text, echo, echo_len);
        }
        j->choices[i].text_offset = (int64_t)csd_utf8_chars(echo, echo_len);
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

/* ---- logprobs ---- */

/* A token's own bytes, as OpenAI gives them: a piece of a multi-byte character is its part of
 * that character's bytes, and a SentencePiece piece keeps its leading space (decoding it alone
 * would strip it, as at the start of a text). A special token, which has no bytes of its own,
 * gives those of its text, in *owned (csd_free it). Returns them, *n long, in raw or *owned. */
static const uint8_t *own_bytes(const csd_tok *tok, int32_t id, uint8_t *raw, size_t cap,
                                size_t *n, char **owned) {
    *owned = NULL;
    if (csd_tok_token_bytes(tok, id, raw, cap, n) == 0 && *n > 0) return raw;
    *n = 0;
    if (csd_tok_decode_len(tok, &id, 1, false, owned, n, NULL) != 0 || !*owned) *n = 0;
    return (const uint8_t *)*owned;
}

/* The text of one token for logprobs: its own bytes, so that the tokens spell the text at
 * text_offset; U+FFFD for a piece of a multi-byte character (not valid UTF-8 alone). */
static json_t *token_text(const csd_tok *tok, int32_t id) {
    uint8_t raw[CSD_DETOK_PIECE_MAX];
    size_t n = 0;
    char *owned = NULL;
    const uint8_t *b = own_bytes(tok, id, raw, sizeof raw, &n, &owned);
    json_t *v = b ? json_stringn((const char *)b, n) : json_string(""); /* NUL bytes included */
    if (!v) v = json_string("\xef\xbf\xbd");
    csd_free(owned);
    return v;
}

static json_t *token_bytes(const csd_tok *tok, int32_t id) {
    uint8_t raw[CSD_DETOK_PIECE_MAX];
    size_t n = 0;
    char *owned = NULL;
    const uint8_t *b = own_bytes(tok, id, raw, sizeof raw, &n, &owned);
    json_t *arr = json_array();
    for (size_t i = 0; arr && b && i < n; i++) json_array_append_new(arr, json_integer(b[i]));
    csd_free(owned);
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

/* Queues a choice's generated text (and the logprobs of the token that produced it). mu held. */
static int add_text(csd_http_choice *ch, const char *text, size_t len,
                    const csd_token_event *ev) {
    csd_http_job *j = ch->job;
    int rc = 0;
    if (j->stream) {
        json_t *lp = NULL;
        if (ev && j->logprobs) {
            if (j->kind == CSD_HTTP_KIND_CHAT) {
                lp = json_pack("[o]", chat_lp_entry(j, ev));
            } else {
                lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                               "top_logprobs", "text_offset");
                if (lp) completion_lp_add(j, lp, ev, ch->token_offset);
            }
        }
        if (len || lp) rc = emit_choice(j, ch->index, text, len, lp, NULL, false);
    } else {
        if (ev && ch->lp) {
            if (j->kind == CSD_HTTP_KIND_CHAT)
                json_array_append_new(ch->lp, chat_lp_entry(j, ev));
            else
                completion_lp_add(j, ch->lp, ev, ch->token_offset);
        }
        rc = csd_http_buf_append(&ch->text, text, len);
    }
    return rc;
}

/* The answer goes through the tool-call splitter: auto, or "required" among several tools. */
static bool splits_calls(const csd_http_job *j) {
    return j->tool_mode == CSD_HTTP_TOOLS_AUTO || j->tool_mode == CSD_HTTP_TOOLS_PICK;
}

/* Hands a choice's answer text on (mu held): streamed as a named call's arguments, through the
 * tool-call splitter (auto, "required" among several), or as it is. */
static int route_text(csd_http_choice *ch, const char *text, size_t len,
                      const csd_token_event *ev) {
    csd_http_job *j = ch->job;
    if (j->tool_mode == CSD_HTTP_TOOLS_NAMED && j->stream) {
        if (len) {
            int rc = emit_tool_delta(j, ch->index, json_pack("{s:i, s:{s:s%}}", "index", 0,
                                                             "function", "arguments", text, len));
            if (rc) return rc;
        }
        return add_text(ch, "", 0, ev); /* the logprobs, if asked for */
    }
    if (!splits_calls(j)) return add_text(ch, text, len, ev);
    const char *content = "";
    size_t n = 0;
    int rc = csd_tool_split_push(&ch->tools, text, len, &content, &n);
    if (!rc) rc = add_text(ch, content, n, ev);
    int calls_rc = emit_new_calls(ch); /* the calls it completed, whatever became of the text */
    return rc ? rc : calls_rc;
}

/* The end of a choice's text: the splitter's held-back text and a call still open. mu held. */
static int route_end(csd_http_choice *ch) {
    if (!splits_calls(ch->job)) return 0;
    const char *content = "";
    size_t n = 0;
    int rc = csd_tool_split_finish(&ch->tools, &content, &n);
    /* parallel_tool_calls false: one call, also where the calls split off only at the end (bare) */
    while (ch->job->one_call && ch->tools.n_calls > 1)
        csd_tool_call_fini(&ch->tools.calls[--ch->tools.n_calls]);
    if (!rc) rc = add_text(ch, content, n, NULL);
    int calls_rc = emit_new_calls(ch);
    return rc ? rc : calls_rc;
}

/* Queues a choice's thinking: a reasoning_content delta, or the non-streamed text. mu held. */
static int add_reasoning(csd_http_choice *ch, const char *text, size_t len,
                         const csd_token_event *ev) {
    csd_http_job *j = ch->job;
    if (!len) return 0;
    if (!j->stream) {
        if (ev && ch->lp) json_array_append_new(ch->lp, chat_lp_entry(j, ev));
        return csd_http_buf_append(&ch->reasoning, text, len);
    }
    json_t *lp = ev && j->logprobs ? json_pack("{s:[o]}", "content", chat_lp_entry(j, ev)) : NULL;
    return emit_delta(j, ch->index, json_pack("{s:s%}", "reasoning_content", text, len), lp);
}

/* Hands answer text on (mu held): the thinking split off first when the job splits it, the rest
 * to route_text. */
static int think_text(csd_http_choice *ch, const char *text, size_t len,
                      const csd_token_event *ev) {
    if (ch->job->think == CSD_HTTP_THINK_OFF) return route_text(ch, text, len, ev);
    const char *r = "", *c = "";
    size_t rn = 0, cn = 0;
    int rc = csd_think_split_push(&ch->think, text, len, &r, &rn, &c, &cn);
    /* the token's logprobs go with its thinking when it gave no content, else with the content */
    const csd_token_event *r_ev = rn && !cn ? ev : NULL;
    if (!rc) rc = add_reasoning(ch, r, rn, r_ev);
    return rc ? rc : route_text(ch, c, cn, r_ev ? NULL : ev);
}

/* The end of the answer's thinking split: what it held back. mu held. */
static int think_end(csd_http_choice *ch) {
    if (ch->job->think == CSD_HTTP_THINK_OFF) return 0;
    const char *r = "", *c = "";
    size_t rn = 0, cn = 0;
    int rc = csd_think_split_finish(&ch->think, &r, &rn, &c, &cn);
    if (!rc) rc = add_reasoning(ch, r, rn, NULL);
    return rc ? rc : route_text(ch, c, cn, NULL);
}

bool csd_http_job_on_token(void *ctx, const csd_token_event *ev) {
    csd_http_choice *ch = ctx;
    csd_http_job *j = ch->job;
    size_t n = 0;
    const char *emit = "";
    size_t emit_len = 0;
    int stopped = 0;
    if (csd_detok_push(&ch->detok, ev->id, ch->piece, sizeof ch->piece, &n) != 0) n = 0;
    /* the token's text starts after what only ended an earlier token (its broken character) */
    size_t carried = n ? ch->detok.carried : 0;
    ch->token_offset = ch->text_offset + (int64_t)csd_utf8_chars(ch->piece, carried);
    ch->text_offset += (int64_t)csd_utf8_chars(ch->piece, n);
    stopped = csd_http_stop_push(&ch->stop, ch->piece, n, &emit, &emit_len);
    if (stopped < 0) return true; /* out of memory: end the request rather than lose text */
    pthread_mutex_lock(&j->mu);
    int rc = think_text(ch, emit, emit_len, ev);
    /* parallel_tool_calls false: one call is the whole answer */
    bool called = j->one_call && j->tool_mode == CSD_HTTP_TOOLS_AUTO && ch->tools.n_calls > 0;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return stopped == 1 || rc != 0 || called;
}

/* "length" when max_tokens cut the answer (and no stop string did); "stop" when a stop string cut
 * a named call (its arguments are then incomplete); else "tool_calls" when the answer is or holds
 * a call (the calls split out of it are whole), and "stop" when it is not. */
static const char *finish_reason(const csd_http_job *j, const csd_http_choice *ch) {
    /* a stop string that the last token (or the detokenizer's final flush) completed cut the
     * answer, even when that token was also the last max_tokens allowed */
    if (ch->res.end == CSD_REQ_END_LENGTH && !ch->stop.stopped) return "length";
    if (ch->stop.stopped && j->tool_mode == CSD_HTTP_TOOLS_NAMED) return "stop";
    bool called = j->tool_mode == CSD_HTTP_TOOLS_NAMED || ch->tools.n_calls > 0;
    return called ? "tool_calls" : "stop";
}

/* The error of a request whose choice ch ended in error (or, non-streamed, was cancelled). */
static void failure_error(const csd_http_job *j, const csd_http_choice *ch, csd_http_error *e) {
    if (j->shutdown && ch->res.code == CSD_ECANCELED) {
        csd_http_error_set(e, 503, "server_error", NULL, "server_shutting_down",
                           "the server is shutting down; the answer was stopped after %lld "
                           "tokens",
                           (long long)ch->res.completion_tokens);
        return;
    }
    csd_http_error_set(e, 500, "server_error", NULL, NULL, "generation failed: %s",
                       ch->res.end == CSD_REQ_END_CANCELLED ? "cancelled" : ch->res.message);
}

/* Appends "data: <error json>\n\n" for a choice that failed; the shutdown's error once for all
 * the choices it stopped. mu held. */
static void emit_failure(csd_http_job *j, const csd_http_choice *ch) {
    csd_http_error e;
    failure_error(j, ch, &e);
    if (e.status == 503) {
        if (j->shutdown_told) return;
        j->shutdown_told = true;
    }
    emit_data(j, csd_http_error_json(&e));
}

/* The usage chunk (include_usage) once every choice has ended: the prompt counts once, the
 * completion tokens of every choice add up (as OpenAI and vLLM count them). mu held. */
static void emit_usage(csd_http_job *j) {
    json_t *c = chunk_base(j);
    if (!c) return;
    int64_t completion = 0;
    for (int i = 0; i < j->n_submitted; i++)
        completion += j->choices[i].res.completion_tokens;
    int64_t prompt = j->choices[0].res.prompt_tokens;
    json_object_set_new(c, "choices", json_array());
    json_object_set_new(c, "usage",
                        json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)prompt,
                                  "completion_tokens", (json_int_t)completion, "total_tokens",
                                  (json_int_t)(prompt + completion)));
    emit_event(j, c);
}

/* A stream's events for a choice that ended, and the end of the stream after the last. mu held. */
static void stream_choice_end(csd_http_job *j, const csd_http_choice *ch) {
    if (ch->res.end == CSD_REQ_END_ERROR)
        emit_failure(j, ch);
    else if (ch->res.end != CSD_REQ_END_CANCELLED)
        emit_choice(j, ch->index, NULL, 0, NULL, finish_reason(j, ch), false);
    if (!csd_http_job_done(j) || j->cancelled) return;
    if (j->include_usage && !j->failed) emit_usage(j);
    csd_http_buf_append(&j->out, "data: [DONE]\n\n", 14);
}

void csd_http_job_on_done(void *ctx, const csd_req_result *res) {
    csd_http_choice *ch = ctx;
    csd_http_job *j = ch->job;
    /* the detokenizer's held-back bytes may still complete a stop string */
    size_t n = 0;
    const char *emit = "", *rest = "";
    size_t emit_len = 0, rest_len = 0;
    if (csd_detok_flush(&ch->detok, ch->piece, sizeof ch->piece, &n) != 0) n = 0;
    if (csd_http_stop_push(&ch->stop, ch->piece, n, &emit, &emit_len) < 0) emit_len = 0;
    pthread_mutex_lock(&j->mu);
    int lost = think_text(ch, emit, emit_len, NULL);
    csd_http_stop_flush(&ch->stop, &rest, &rest_len);
    if (!lost) lost = think_text(ch, rest, rest_len, NULL);
    if (!lost) lost = think_end(ch);
    if (!lost) lost = route_end(ch);
    ch->res = *res;
    if (lost && res->end != CSD_REQ_END_ERROR) { /* text held back to the end could not be added */
        ch->res.end = CSD_REQ_END_ERROR;
        ch->res.code = lost;
        snprintf(ch->res.message, sizeof ch->res.message,
                 "out of memory while finishing the answer");
    }
    if (j->shutdown && ch->res.end == CSD_REQ_END_CANCELLED) { /* stopped for the shutdown */
        ch->res.end = CSD_REQ_END_ERROR;
        ch->res.code = CSD_ECANCELED;
        snprintf(ch->res.message, sizeof ch->res.message, "the server is shutting down");
    }
    j->n_done++;
    if (ch->res.end == CSD_REQ_END_ERROR) j->failed = true;
    else if (ch->res.end == CSD_REQ_END_CANCELLED && !j->failed) j->cancelled = true;
    if (j->stream) stream_choice_end(j, ch);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    CSD_LOGD("request done req=%s choice=%d end=%d prompt=%lld completion=%lld ttft=%.3f "
             "total=%.3f",
             j->id, ch->index, res->end, (long long)res->prompt_tokens,
             (long long)res->completion_tokens, res->ttft_s, res->total_s);
    csd_http_job_release(j); /* this choice's engine reference */
}

/* ---- connection side ---- */

static void wait_a_bit(csd_http_job *j) {
    struct timespec ts = csd_realtime_in_ms(WAIT_POLL_MS);
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

void csd_http_job_cancel(csd_http_job *j) {
    /* not under our lock: the engine may hold its own while calling on_done. n_submitted and the
     * engine ids are written before the connection thread can get here. */
    for (int i = 0; i < j->n_submitted; i++) csd_engine_cancel(j->engine, j->choices[i].engine_id);
}

/* mu held: once a choice has failed, the answer is that error: the other choices are stopped
 * rather than left to run to their end for nothing. */
static void stop_others(csd_http_job *j) {
    if (!j->failed || j->others_stopped || csd_http_job_done(j)) return;
    j->others_stopped = true;
    pthread_mutex_unlock(&j->mu);
    csd_http_job_cancel(j); /* the finished ones are no longer known to the engine: no-ops */
    pthread_mutex_lock(&j->mu);
}

/* mu held: the server stops: cancels the request once, marked so that it ends as a shutdown
 * error the client is still sent. True once that has taken too long: then give up on it. */
static bool stop_for_shutdown(csd_http_job *j) {
    if (!j->shutdown) {
        j->shutdown = true;
        j->shutdown_at = csd_now_s();
        CSD_LOGI("server stopping, cancelling req=%s", j->id);
        pthread_mutex_unlock(&j->mu);
        csd_http_job_cancel(j);
        pthread_mutex_lock(&j->mu);
    }
    return csd_now_s() - j->shutdown_at > CSD_HTTP_SHUTDOWN_GRACE_S;
}

/* mu held: is it time to give up on this request? Cancels it when so. */
static bool abandon(csd_http_job *j, int fd, const atomic_int *stopping) {
    bool gone = csd_fd_peer_gone(fd);
    if (!gone && (!atomic_load(stopping) || !stop_for_shutdown(j))) return false;
    CSD_LOGI("%s, cancelling req=%s", gone ? "client gone" : "shutdown grace over", j->id);
    if (!csd_http_job_done(j)) {
        pthread_mutex_unlock(&j->mu);
        csd_http_job_cancel(j);
        pthread_mutex_lock(&j->mu);
    }
    return true;
}

bool csd_http_job_wait(csd_http_job *j, int fd, const atomic_int *stopping) {
    pthread_mutex_lock(&j->mu);
    while (!csd_http_job_done(j)) {
        if (abandon(j, fd, stopping)) {
            pthread_mutex_unlock(&j->mu);
            return false;
        }
        stop_others(j);
        if (!csd_http_job_done(j)) wait_a_bit(j);
    }
    pthread_mutex_unlock(&j->mu);
    return true;
}

/* Drops the SSE bytes already sent (mu held), so that a long stream holds only what waits to be
 * sent: at once when all of it went (no copy), else once the sent part is the larger half. */
static void forget_sent(csd_http_job *j) {
    if (j->out_sent == j->out.len || (j->out_sent >= 65536 && j->out_sent >= j->out.len / 2)) {
        csd_http_buf_drop(&j->out, j->out_sent);
        j->out_sent = 0;
    }
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
            forget_sent(j);
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (csd_http_job_done(j)) break;
        if (abandon(j, fd, stopping)) {
            pthread_mutex_unlock(&j->mu);
            return -1;
        }
        stop_others(j);
        if (!csd_http_job_done(j) && j->out_sent == j->out.len) wait_a_bit(j);
    }
    bool clean = !j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return clean ? 0 : -1;
}

/* Choice ch of a non-streamed answer. mu held. */
static json_t *choice_json(const csd_http_job *j, const csd_http_choice *ch) {
    json_t *text = json_stringn(ch->text.data ? ch->text.data : "", ch->text.len);
    if (!text) text = json_string("");
    const char *finish = finish_reason(j, ch);
    if (j->kind == CSD_HTTP_KIND_CHAT) {
        json_t *calls = tool_calls_json(j, ch);
        /* with calls, content is null unless the model also wrote text (a named call's text is
         * its arguments) */
        if (calls && (j->tool_mode == CSD_HTTP_TOOLS_NAMED || ch->text.len == 0)) {
            json_decref(text);
            text = json_null();
        }
        json_t *message = json_pack("{s:s, s:o}", "role", "assistant", "content", text);
        if (calls) json_object_set_new(message, "tool_calls", calls);
        if (ch->reasoning.len)
            json_object_set_new(message, "reasoning_content",
                                json_stringn(ch->reasoning.data, ch->reasoning.len));
        return json_pack("{s:i, s:o, s:o, s:s}", "index", ch->index, "message", message,
                         "logprobs", ch->lp ? json_pack("{s:O}", "content", ch->lp) : json_null(),
                         "finish_reason", finish);
    }
    return json_pack("{s:i, s:o, s:O, s:s}", "index", ch->index, "text", text, "logprobs",
                     ch->lp ? ch->lp : json_null(), "finish_reason", finish);
}

/* The choice that makes the answer an error, or NULL: one that failed (the others were then
 * stopped), else one that was cancelled. mu held. */
static const csd_http_choice *failed_choice(const csd_http_job *j) {
    const csd_http_choice *cancelled = NULL;
    for (int i = 0; i < j->n_submitted; i++) {
        if (j->choices[i].res.end == CSD_REQ_END_ERROR) return &j->choices[i];
        if (j->choices[i].res.end == CSD_REQ_END_CANCELLED && !cancelled)
            cancelled = &j->choices[i];
    }
    return cancelled;
}

char *csd_http_job_response(csd_http_job *j, int *status) {
    pthread_mutex_lock(&j->mu);
    const csd_http_choice *bad = failed_choice(j);
    if (bad) {
        csd_http_error e;
        failure_error(j, bad, &e);
        *status = e.status;
        pthread_mutex_unlock(&j->mu);
        return csd_http_error_json(&e);
    }
    bool chat = j->kind == CSD_HTTP_KIND_CHAT;
    json_t *choices = json_array();
    int64_t completion = 0;
    for (int i = 0; i < j->n_submitted; i++) {
        json_array_append_new(choices, choice_json(j, &j->choices[i]));
        completion += j->choices[i].res.completion_tokens;
    }
    int64_t prompt = j->choices[0].res.prompt_tokens;
    json_t *root =
        json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:{s:I, s:I, s:I}}", "id", j->id, "object",
                  chat ? "chat.completion" : "text_completion", "created", (json_int_t)j->created,
                  "model", j->model, "system_fingerprint", csd_build_fingerprint(), "choices",
                  choices, "usage", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                  (json_int_t)completion, "total_tokens", (json_int_t)(prompt + completion));
    pthread_mutex_unlock(&j->mu);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    *status = s ? 200 : 500;
    return s;
}
