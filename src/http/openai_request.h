/* openai_request: parses and validates the body of an OpenAI /v1/chat/completions or
 * /v1/completions request into a typed struct. Pure (no sockets, no engine), so it is unit-tested
 * and fuzzed alone. Unknown fields are ignored, as OpenAI does; null counts as absent. A wrong type
 * or a bad range is a 400 whose error names the field (OpenAI's "param"). Rendering and tokenizing
 * happen in server.c. See docs/api.md. */
#ifndef CSD_HTTP_OPENAI_REQUEST_H
#define CSD_HTTP_OPENAI_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/json_schema.h"
#include "model/sampler.h"

/* Stop strings per request: OpenAI allows 4; we accept more (local clients send longer lists). */
#define CSD_HTTP_MAX_STOP 16
/* Bytes per stop string: stop matching holds back this much text, so keep it small. */
#define CSD_HTTP_MAX_STOP_LEN 256
/* Top alternatives per token (OpenAI: 20 for chat, 5 for completions; we allow 20 for both). */
#define CSD_HTTP_MAX_TOP_LOGPROBS 20
/* Choices per request (`n`): each is a request of its own to the engine, with a slot of its own. */
#define CSD_HTTP_MAX_N 16
/* Messages per chat request and prompt ids per completion: bounds the work before tokenizing. */
#define CSD_HTTP_MAX_MESSAGES 4096
#define CSD_HTTP_MAX_PROMPT_IDS (1 << 20)
/* Variables in chat_template_kwargs. */
#define CSD_HTTP_MAX_TEMPLATE_KWARGS 64
/* JSON nesting accepted in a body (jansson recurses; deep nesting is only an attack). */
#define CSD_HTTP_MAX_JSON_DEPTH 64

enum csd_http_kind {
    CSD_HTTP_KIND_CHAT = 0,       /* POST /v1/chat/completions */
    CSD_HTTP_KIND_COMPLETION = 1, /* POST /v1/completions */
    CSD_HTTP_KIND_COUNT
};

const char *csd_http_kind_name(int kind);

/* An OpenAI error: HTTP status plus the {"error": {message, type, param, code}} fields. */
typedef struct csd_http_error {
    int status; /* 400, 404, ... */
    char message[256];
    char type[32];  /* "invalid_request_error", ... */
    char param[64]; /* the offending field ("temperature", "messages[2].role"), "" when none */
    char code[32];  /* "invalid_type", "invalid_value", "model_not_found", ... or "" */
} csd_http_error;

/* Fills e and returns CSD_EINVAL (so parsers can `return csd_http_error_set(...)`). */
int csd_http_error_set(csd_http_error *e, int status, const char *type, const char *param,
                       const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* 400 naming field, "'field' must be WANT", with code invalid_type or invalid_value. Return
 * CSD_EINVAL, as csd_http_error_set. */
int csd_http_bad_type(csd_http_error *e, const char *field, const char *want);
int csd_http_bad_value(csd_http_error *e, const char *field, const char *want);
/* The request body as a JSON object (json_decref it), or NULL with e set (400, invalid_json): an
 * empty body, text that is not JSON, or JSON that is not an object. */
json_t *csd_http_body_object(const char *body, size_t len, csd_http_error *e);
/* root[key] when present and not null, else NULL. */
json_t *csd_http_member(const json_t *root, const char *key);
/* The JSON nesting depth of v, counted no further than just past limit. */
int csd_http_json_depth(const json_t *v, int limit);
/* *out = root[key] when present and not null; a 400 when it is not a boolean. */
int csd_http_read_bool(const json_t *root, const char *key, bool *out, csd_http_error *e);
/* The OpenAI error body as a NUL-terminated string (free with free(): jansson's json_dumps). */
char *csd_http_error_json(const csd_http_error *e);

/* What a chat answer does with the request's tools (tool_request.h). */
enum csd_http_tool_mode {
    CSD_HTTP_TOOLS_OFF = 0, /* no tools, or tool_choice "none": the answer is text */
    CSD_HTTP_TOOLS_AUTO,    /* the model may write calls: they are split out of the answer */
    CSD_HTTP_TOOLS_NAMED,   /* the answer is tool_name's arguments (constrained) */
    CSD_HTTP_TOOLS_PICK,    /* the answer is {"name", "arguments"} for one tool (constrained) */
};

/* How a chat answer's thinking is split from it (http/think_split.h). */
enum csd_http_think {
    CSD_HTTP_THINK_OFF = 0, /* no split: --reasoning-format none, completions, JSON answers */
    CSD_HTTP_THINK_SPLIT,   /* <think>...</think> at the answer's start is reasoning_content */
    CSD_HTTP_THINK_OPEN,    /* the prompt opened <think>: the answer starts thinking */
};

/* A parsed request. Strings and JSON are owned by the struct; release with csd_http_req_fini. */
typedef struct csd_http_req {
    int kind;    /* enum csd_http_kind */
    char *model; /* NULL when absent */
    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    int64_t max_tokens;          /* 0: not given (until the context is full) */
    csd_sampler_params sampling; /* OpenAI defaults where absent (temperature 1, top_p 1) */
    bool has_seed;               /* sampling.seed came from the request */
    bool ignore_eos;             /* vLLM / llama-server extension: no stop at end-of-generation */
    int n;                       /* choices, 1..CSD_HTTP_MAX_N */
    int n_stop;
    char *stop[CSD_HTTP_MAX_STOP]; /* non-empty UTF-8 strings */
    bool logprobs;                 /* return logprobs of the chosen tokens */
    int top_logprobs;              /* alternatives per token, 0..CSD_HTTP_MAX_TOP_LOGPROBS */
    char *user;                    /* NULL when absent; only logged */
    bool json_object;              /* response_format json_object or json_schema: the answer is
                                    * one JSON object */
    csd_json_schema *json_schema;  /* response_format json_schema: the object's schema (owned) */
    /* chat */
    json_t *messages;    /* normalized array of {role, content[, name, tool_calls,
                            tool_call_id]}: content is a string (text parts joined) or null */
    json_t *tools;       /* owned reference to the request's array, or NULL */
    json_t *tool_choice; /* owned reference, or NULL */
    int tool_mode;       /* enum csd_http_tool_mode */
    char *tool_name;     /* CSD_HTTP_TOOLS_NAMED: the function's name (owned) */
    bool one_tool_call;  /* parallel_tool_calls false: the answer ends with its first call */
    json_t *template_kwargs; /* chat_template_kwargs: more template variables (owned), or NULL */
    int think;           /* enum csd_http_think: set by the server once the prompt is rendered */
    int tool_format;     /* auto mode: enum csd_tool_split_mode (tags, bare, mistral), set by the
                          * server */
    /* completions: exactly one of prompt / prompt_ids */
    char *prompt; /* NUL-terminated */
    size_t prompt_len;
    int32_t *prompt_ids; /* csd_alloc'd */
    int64_t n_prompt_ids;
    bool echo; /* completions: prepend the prompt to the text */
} csd_http_req;

/* Parses len bytes of body for an endpoint of the given kind. vocab_size > 0 bounds token ids in a
 * completions prompt. On failure returns CSD_EINVAL with err filled (status 400 or 413) and leaves
 * req empty (fini still safe). */
int csd_http_req_parse(csd_http_req *req, int kind, const char *body, size_t len,
                       int32_t vocab_size, csd_http_error *err);
/* The same for a body already parsed into an object (root is only read; req keeps its own
 * references). */
int csd_http_req_parse_object(csd_http_req *req, int kind, const json_t *root, int32_t vocab_size,
                              csd_http_error *err);
void csd_http_req_fini(csd_http_req *req);
/* Compiles schema into r->json_schema and makes the answer JSON (r->json_object); a schema outside
 * the supported subset is a 400 naming param, its message "PARAM at '/pointer': problem". */
int csd_http_compile_schema(csd_http_req *r, const json_t *schema, const char *param,
                            csd_http_error *e);

#endif
