/* http_internal: shared internals of src/http: the per-request job that connects one HTTP
 * connection to one engine request. The engine's callbacks (engine threads) turn tokens into text
 * (incremental detokenizer, stop strings) and into response bytes; the connection thread waits for
 * them. A job has two owners (connection and engine), counted in refs; the last frees it. */
#ifndef CSD_HTTP_INTERNAL_H
#define CSD_HTTP_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "coord/engine.h"
#include "openai_request.h"
#include "stop_text.h"
#include "mhd/text_buf.h"
#include "think_split.h"
#include "tok/tokenizer.h"
#include "tool_calls.h"


typedef struct csd_http_job csd_http_job;

/* Seconds a request cancelled because the server stops may take to end (its error sent) before
 * its connection is closed without it. */
#define CSD_HTTP_SHUTDOWN_GRACE_S 5.0

/* One choice of a request (OpenAI's `n`): one engine request with its own text state. */
typedef struct csd_http_choice {
    csd_http_job *job;
    int index;
    uint64_t engine_id;
    /* touched only by the engine's callbacks (one request's callbacks never run concurrently) */
    csd_detok detok;
    csd_http_stop stop;
    char piece[CSD_DETOK_PIECE_MAX]; /* one token's text: never fills (tokenizer.h) */
    /* completions logprobs: characters of text before the next token's (the detokenized pieces,
     * counted whether or not a stop string holds them back), and before the current token's */
    int64_t text_offset, token_offset;
    csd_think_split think; /* chat: the thinking split from the answer (job->think) */
    csd_tool_split tools; /* chat with tools (auto, or "required" among several): the calls */
    int n_streamed;       /* of those, how many the stream has sent */
    /* results, under the job's mu */
    csd_http_buf text; /* non-stream: the generated text (the content, or a named call's
                        * arguments) */
    csd_http_buf reasoning; /* non-stream: the thinking (reasoning_content) */
    json_t *lp;        /* non-stream logprobs: chat array / completions object */
    csd_req_result res; /* once it has ended */
} csd_http_choice;

struct csd_http_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* connection + one per submitted choice (the engine's); under mu */
    /* set before submit, read-only afterwards */
    int kind; /* enum csd_http_kind */
    bool stream, include_usage, logprobs;
    int top_logprobs;
    int tool_mode;    /* enum csd_http_tool_mode */
    bool one_call;    /* parallel_tool_calls false: end the answer at its first call */
    int think;        /* enum csd_http_think */
    int tool_format;  /* auto mode: enum csd_tool_split_mode (tags, bare or mistral) */
    char *tool_name;  /* CSD_HTTP_TOOLS_NAMED: the function (owned) */
    char id[48];       /* "chatcmpl-..." / "cmpl-..." */
    long long created; /* unix seconds */
    char model[128];
    const csd_tok *tok; /* borrowed */
    csd_engine *engine; /* borrowed */
    int64_t n_prompt;
    int n_stop;
    char *stops[CSD_HTTP_MAX_STOP]; /* owned copies: the job outlives the parsed request */
    int n_choices;
    int n_submitted;           /* choices given to the engine (the rest are never started) */
    csd_http_choice *choices;  /* n_choices */
    /* results, under mu */
    csd_http_buf out; /* stream: SSE bytes; out_sent of them already sent (dropped as it goes) */
    size_t out_sent;
    int n_done;       /* submitted choices finished */
    bool failed;      /* a choice ended in an error: the others are stopped, the answer is it */
    bool others_stopped; /* ... and the connection thread has cancelled them */
    bool cancelled;   /* a choice ended cancelled, not for a failed one (the client left, the
                       * server stops) */
    /* the server stops while the request runs: it was cancelled for that, and its cancelled
     * choices end as errors the client is told about (503 server_shutting_down) */
    bool shutdown;
    bool shutdown_told; /* a stream has sent that error (once for all its choices) */
    double shutdown_at; /* csd_now_s() of that cancel */
};

/* Creates a job for a parsed request, with req->n choices (refs = 1, the connection's). */
int csd_http_job_create(csd_http_job **out, const csd_http_req *req, const csd_tok *tok,
                        const char *model_name, csd_engine *engine, int64_t n_prompt);
/* The echo text (completions echo) or role chunk (chat stream) of every choice, queued before
 * generation. */
int csd_http_job_begin(csd_http_job *j, const char *echo, size_t echo_len);
/* Engine callbacks (ctx = a choice); submit each with refs incremented for the engine. */
bool csd_http_job_on_token(void *ctx, const csd_token_event *ev);
void csd_http_job_on_done(void *ctx, const csd_req_result *res);
/* Drops one reference; frees the job at zero. */
void csd_http_job_release(csd_http_job *j);

/* Every submitted choice has ended (mu held). */
static inline bool csd_http_job_done(const csd_http_job *j) { return j->n_done == j->n_submitted; }
/* Cancels every submitted choice still running (not under mu). */
void csd_http_job_cancel(csd_http_job *j);
/* Waits until the job is done. When *stopping becomes true the request is cancelled and ends as
 * a shutdown error (still answered). Returns false (after cancelling the request) when the client
 * socket fd hung up, or the engine has not ended a request stopped for shutdown after
 * CSD_HTTP_SHUTDOWN_GRACE_S. */
bool csd_http_job_wait(csd_http_job *j, int fd, const atomic_int *stopping);
/* Streaming: copies up to max pending SSE bytes into buf, waiting for some. Returns the byte count,
 * 0 at the end of the stream, -1 when the client hung up (then cancelled) or, as for
 * csd_http_job_wait, a request stopped for shutdown did not end in time. A request stopped for
 * shutdown that ends in time closes its stream with an error event and [DONE]. */
ssize_t csd_http_job_read(csd_http_job *j, char *buf, size_t max, int fd,
                          const atomic_int *stopping);
/* Non-streaming: the response body (free()), and its HTTP status (200, or 500 on engine error). */
char *csd_http_job_response(csd_http_job *j, int *status);

#endif
