/* chat_template: renders a model's Jinja `chat_template` (tokenizer_config.json) into a prompt.
 * A small Jinja subset interpreter whose output matches @huggingface/jinja (the reference used by
 * transformers.js) for the templates of Llama 3.x, Qwen2.5/3, Mistral and Gemma; it does not do
 * tokenization. Any template text and any context is safe: depth, step, memory and output limits
 * turn hostile input into errors with line/column. See docs/chat_templates.md. */
#ifndef CSD_CHAT_H
#define CSD_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/err.h"

/* Largest template source accepted by create (bytes). */
#define CSD_CHAT_MAX_TEMPLATE (4u << 20)
/* Render defaults when csd_chat_render_opts leaves a field 0. */
#define CSD_CHAT_DEFAULT_MAX_OUTPUT (16u << 20) /* bytes of rendered text (and any one string) */
#define CSD_CHAT_DEFAULT_MAX_MEMORY (256u << 20)    /* bytes the interpreter may allocate */
#define CSD_CHAT_DEFAULT_MAX_STEPS 20000000ull      /* statements + expression nodes evaluated */
#define CSD_CHAT_DEFAULT_MAX_MS 5000ull             /* a render's time (real ones take < 50 ms) */

typedef struct csd_chat_template csd_chat_template;

typedef struct csd_chat_render_opts {
    size_t max_output;        /* 0: CSD_CHAT_DEFAULT_MAX_OUTPUT */
    size_t max_memory;        /* 0: CSD_CHAT_DEFAULT_MAX_MEMORY */
    uint64_t max_steps;       /* 0: CSD_CHAT_DEFAULT_MAX_STEPS */
    uint64_t max_ms;          /* 0: CSD_CHAT_DEFAULT_MAX_MS */
    const struct tm *now; /* time seen by strftime_now(); NULL: the local clock (tests fix it) */
} csd_chat_render_opts;

/* What csd_chat_template_apply puts into the context besides the messages. */
typedef struct csd_chat_apply_params {
    const json_t *messages;   /* required: array of {role, content, tool_calls?, ...} */
    const json_t *tools;      /* optional array (NULL: `tools` is undefined in the template) */
    bool add_generation_prompt;
    const char *bos_token;    /* NULL: undefined in the template */
    const char *eos_token;    /* NULL: undefined in the template */
    const json_t *extra;      /* optional object of more variables (e.g. enable_thinking) */
    bool keep_content_parts;  /* false: a content list made only of text parts is joined into one
                                 string first (most templates expect strings); true: pass lists */
    const csd_chat_render_opts *opts; /* optional */
} csd_chat_apply_params;

/* ---- lifecycle ---- */

/* Parses src (NUL-terminated). On a syntax error returns CSD_EFORMAT with "line L, column C" in
 * err. *out is owned by the caller: free with csd_chat_template_destroy. */
int csd_chat_template_create(csd_chat_template **out, const char *src, csd_err *err);
void csd_chat_template_destroy(csd_chat_template *t);

/* ---- rendering ---- */

/* Renders with ctx (a JSON object; its keys become template variables). *out is a NUL-terminated
 * string owned by the caller (csd_free). Errors: CSD_EINVAL (bad context, runtime error,
 * raise_exception: the template's message), CSD_ERANGE (depth/steps/output limit), CSD_EFULL
 * (memory limit). The template is not modified: concurrent renders of one template are safe. */
int csd_chat_template_render(const csd_chat_template *t, const json_t *ctx, char **out,
                             csd_err *err);
int csd_chat_template_render_opts(const csd_chat_template *t, const json_t *ctx,
                                  const csd_chat_render_opts *opts, char **out, csd_err *err);

/* Validates an OpenAI-style "messages" array (roles are strings; content is a string, null, or a
 * list of {type:"text", text} parts; tool_calls is a list of objects) and renders with
 * messages, add_generation_prompt, bos_token, eos_token, tools and the extra variables. */
int csd_chat_template_apply(const csd_chat_template *t, const csd_chat_apply_params *p, char **out,
                            csd_err *err);
/* The validation step of csd_chat_template_apply on its own. */
int csd_chat_messages_validate(const json_t *messages, csd_err *err);

/* ---- built-in templates ---- */

/* Template text for "chatml", "llama3", "llama2", "mistral" or "gemma" (static storage), or NULL.
 * For models whose tokenizer_config.json has no chat_template. */
const char *csd_chat_template_builtin(const char *name);

#endif
