/* engine: the serving core behind the HTTP API. Accepts requests (token ids + sampling settings),
 * admits them into a bounded number of slots per pipeline (--parallel) behind a bounded queue,
 * and runs them with continuous batching: every step gathers the next token of every active
 * request (and chunks of prompts being prefilled) into one batched forward, so one read of the
 * weights serves the whole batch. Several pipelines (replicas) are served at once; each request
 * goes to the one with free capacity. Callbacks run on the engine's threads and must be quick.
 * A request's state has one owner (the engine) and one end: on_done, called exactly once. */
#ifndef CSD_ENGINE_H
#define CSD_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"
#include "draft_model.h"
#include "model/json_mask.h"
#include "model/json_schema.h"
#include "model/sampler.h"
#include "pipeline.h"

#define CSD_ENGINE_MAX_TOP_LOGPROBS 20

typedef struct csd_engine_opts {
    int parallel;          /* concurrent requests per pipeline (slots); default 4 */
    int queue_max;         /* waiting requests beyond the slots before CSD_EFULL; default 64 */
    int64_t max_ctx;       /* per request; 0: the pipeline's */
    int64_t prefill_chunk; /* prompt tokens per step while others decode; default 256 */
    int prefix_cache;      /* finished prompts kept (KV in every stage) for reuse, per pipeline;
                            * the pipeline needs parallel + prefix_cache request slots. 0: off */
    int64_t prefix_min;    /* shortest shared prefix worth reusing, in tokens; default 16 */
    int spec_draft;        /* speculative decoding: draft tokens a decoding request proposes per
                            * step from its own text (ngram_draft.h), all checked in that one
                            * step; 0 (default): off; at most CSD_SPEC_MAX_DRAFT */
    csd_draft_model *draft_model; /* with spec_draft: the drafts come from this model instead of
                                   * the text (draft_model.h); borrowed, it outlives the engine */
    int resume_wait_ms;    /* a request whose replica is lost (a worker gone) while no other is
                            * up waits this long in the queue for one to come back, then resumes
                            * there (or fails); 0: it fails at once. Default 30000 */
} csd_engine_opts;

void csd_engine_opts_default(csd_engine_opts *o);

typedef struct csd_req_params {
    csd_sampler_params sampling;
    int64_t max_tokens;   /* > 0 */
    bool ignore_eos;
    bool logprobs;        /* fill logprob / top entries of each token event */
    int top_logprobs;     /* 0..CSD_ENGINE_MAX_TOP_LOGPROBS */
    /* non-NULL: the answer is one JSON object (response_format json_object), over these token
     * bytes (borrowed; they outlive the request); it ends when the object closes */
    const csd_vocab_bytes *json_vocab;
    /* with json_vocab: the object's schema (response_format json_schema), or NULL for any object.
     * Borrowed only during submit: each request keeps its own copy. */
    const csd_json_schema *json_schema;
} csd_req_params;

typedef struct csd_token_event {
    int32_t id;
    float logprob;                                   /* when logprobs was asked */
    int n_top;
    int32_t top_ids[CSD_ENGINE_MAX_TOP_LOGPROBS];
    float top_logprobs[CSD_ENGINE_MAX_TOP_LOGPROBS];
} csd_token_event;

enum csd_req_end {
    CSD_REQ_END_STOP = 1,      /* end-of-generation token, or on_token asked to stop */
    CSD_REQ_END_LENGTH = 2,    /* max_tokens or the context */
    CSD_REQ_END_CANCELLED = 3, /* csd_engine_cancel */
    CSD_REQ_END_ERROR = 4,     /* see code and message */
};

typedef struct csd_req_result {
    int end;                   /* enum csd_req_end */
    int64_t prompt_tokens;
    int64_t completion_tokens;
    double queue_s;            /* submit to admission */
    double ttft_s;             /* submit to first token */
    double total_s;
    int64_t cached_tokens;     /* prompt tokens reused from the prefix cache */
    int code;                  /* CSD_E* when end == ERROR */
    char message[CSD_ERR_MSG_MAX];
} csd_req_result;

typedef struct csd_req_callbacks {
    /* Each generated token, in order. Return true to stop (end = STOP): e.g. a stop string. */
    bool (*on_token)(void *ctx, const csd_token_event *ev);
    /* Exactly once, last; the engine never touches ctx afterwards. */
    void (*on_done)(void *ctx, const csd_req_result *res);
} csd_req_callbacks;

typedef struct csd_engine_stats {
    int64_t requests_total;    /* submitted and admitted to the queue */
    int64_t requests_rejected; /* refused with CSD_EFULL */
    int64_t prompt_tokens_total;
    int64_t completion_tokens_total;
    int queue_depth;
    int active;
    int slots;                 /* parallel * pipelines */
    double ttft_sum_s;         /* sums and counts for Prometheus summaries */
    int64_t ttft_count;
    double itl_sum_s;          /* inter-token latency */
    int64_t itl_count;
    double step_sum_s;         /* batched forward steps */
    int64_t step_count;
    int64_t prefix_hits;       /* requests that reused a cached prefix (counted at their first
                                * token, once every stage took the copy) */
    int64_t prefix_tokens;     /* prompt tokens they did not recompute */
    int64_t prefix_refused;    /* requests refused after a copy: they computed their prompt */
    int prefix_entries;        /* prompts held in the cache now */
    int64_t requests_rerouted; /* refused or lost by a replica, queued again (resumed included) */
    int64_t requests_resumed;  /* of those, lost after tokens went out, resumed where they were */
    int64_t spec_draft_tokens;    /* draft tokens proposed, each computed in a step
                                   * (speculative decoding) */
    int64_t spec_accepted_tokens; /* of them, the ones the model agreed with */
} csd_engine_stats;

typedef struct csd_engine csd_engine;

/* Pipelines (replicas) one engine serves at most. */
#define CSD_ENGINE_MAX_PIPES 64

/* The engine borrows the pipelines (the caller destroys them after the engine) and the eog ids. */
int csd_engine_create(csd_engine **out, csd_pipeline *const *pipes, int n_pipes,
                      const int32_t *eog_ids, int n_eog, const csd_engine_opts *opts, csd_err *err);
/* Cancels everything still running (on_done with CANCELLED) and stops the threads. */
void csd_engine_destroy(csd_engine *e);

/* Queues a request (the prompt is copied). CSD_EFULL when slots and queue are full (HTTP 429),
 * CSD_ERANGE when the prompt does not fit the context (HTTP 400). *id identifies it for cancel. */
int csd_engine_submit(csd_engine *e, const int32_t *prompt, int64_t n_prompt,
                      const csd_req_params *params, const csd_req_callbacks *cb, void *ctx,
                      uint64_t *id, csd_err *err);
/* Requests submitted together (OpenAI's n): the same prompt, params[i] and ctx[i] for request i,
 * queued all or none (CSD_EFULL), so that a group never holds slots it cannot complete; ids[i]
 * identifies request i for cancel. n is 1..CSD_ENGINE_MAX_GROUP. */
#define CSD_ENGINE_MAX_GROUP 16
int csd_engine_submit_group(csd_engine *e, const int32_t *prompt, int64_t n_prompt,
                            const csd_req_params *params, int n, const csd_req_callbacks *cb,
                            void *const *ctx, uint64_t *ids, csd_err *err);
/* Requests the engine holds at once: its slots and its queue. A group larger than this can never
 * be queued. */
int csd_engine_capacity(csd_engine *e);
/* Asks the engine to stop a request; on_done(CANCELLED) follows (unless it already ended). For a
 * request still in the queue it is called at once, from this call: the caller must not hold a
 * lock that its on_done takes. */
void csd_engine_cancel(csd_engine *e, uint64_t id);
/* Serve drains (SIGTERM): requests waiting for a lost replica to come back end now (they could
 * not finish in the drain without one); the others go on. */
void csd_engine_drain(csd_engine *e);
void csd_engine_get_stats(csd_engine *e, csd_engine_stats *st);
/* The model being served (all pipelines serve the same one). */
const csd_model_config *csd_engine_model(const csd_engine *e);
int64_t csd_engine_max_ctx(const csd_engine *e);
/* True while at least one pipeline is connected and can serve (GET /health). */
bool csd_engine_ready(csd_engine *e);

#endif
