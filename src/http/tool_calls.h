/* tool_calls: the tool calls in a chat answer, found while the answer streams.
 *
 * Models trained on the Hermes format (Qwen2.5, Qwen3, Hermes 2 and 3, and their fine-tunes; their
 * chat templates ask for it) write each call as
 *   <tool_call>
 *   {"name": "get_weather", "arguments": {"city": "Paris"}}
 *   </tool_call>
 * Text outside the tags is the answer's content. What could still be the start of a tag is held
 * back, as stop strings are, and so is trailing whitespace: whitespace just before a call or at the
 * end of an answer with calls is dropped (it only separates the calls; up to CSD_TOOL_SPACE_MAX
 * bytes of each run).
 *
 * A call whose body is not an object with a non-empty string "name" (and "arguments" an object, a
 * string, null or absent; "parameters" is taken as its other name) goes back into the content as
 * it was written, tags included: nothing the model wrote is lost. Arguments are kept as written
 * (tool_call_parse.c). A call still open when the answer ends
 * (cut by max_tokens, or the close tag never came) is parsed as it stands.
 *
 * Llama 3.1 and 3.2 write their calls bare instead (their chat templates ask for it): the answer
 * is the call, {"name": "get_weather", "parameters": {"city": "Paris"}}, optionally after
 * <|python_tag|>, and several calls are separated by ';'. In bare mode an answer whose first
 * non-whitespace byte (after the tag and at most CSD_TOOL_SPACE_MAX bytes in all) is '{' is held
 * back whole and split into calls at its end; when any part of it is not a call (one must name its
 * "parameters" or "arguments" here), all of it is content as written. Any other answer is content
 * as it streams.
 *
 * Mistral's models write [TOOL_CALLS] and then the calls, to the end of the answer: a JSON list
 * of {"name", "arguments"} objects (tokenizer v3: Mistral 7B v0.3, Nemo), or name[ARGS]{...} with
 * [TOOL_CALLS] before each call (v11 and later; a [CALL_ID]id before [ARGS] is skipped). In
 * mistral mode the text before the tag is content as it streams; from the tag on the answer is
 * held back and split at its end, all of it content as written when any part is not a call.
 *
 * In whole mode (tool_choice "required" among several tools) the answer is one call's body, with
 * no tags: the constrained decoder writes {"name": ..., "arguments": {...}} and nothing else.
 *
 * Pure and bounded: at most CSD_TOOL_CALLS_MAX calls (later tags stay content) and a body of at
 * most CSD_TOOL_CALL_MAX_BYTES (a longer one is content). Unit-tested apart from the server. */
#ifndef CSD_HTTP_TOOL_CALLS_H
#define CSD_HTTP_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>

#include "mhd/text_buf.h"

#define CSD_TOOL_CALLS_MAX 64
#define CSD_TOOL_CALL_MAX_BYTES (1u << 20)
/* Whitespace dropped before a call or at the end: the last this many bytes of a run (the rest
 * stays content). */
#define CSD_TOOL_SPACE_MAX 1024

typedef struct csd_tool_call {
    char *name;      /* owned, NUL-terminated */
    char *arguments; /* owned: the arguments as JSON text, as written; "{}" when absent */
} csd_tool_call;

/* How an answer's calls are written (csd_tool_split_init). */
enum csd_tool_split_mode {
    CSD_TOOL_SPLIT_TAGS,  /* Hermes: <tool_call>{...}</tool_call> anywhere in the answer */
    CSD_TOOL_SPLIT_BARE,  /* Llama 3.1/3.2: an answer that starts with '{' is ';'-separated calls */
    CSD_TOOL_SPLIT_WHOLE, /* tool_choice "required" among several: the answer is one call */
    CSD_TOOL_SPLIT_MISTRAL, /* Mistral: [TOOL_CALLS] and the calls, to the answer's end */
};

typedef struct csd_tool_split {
    int mode;      /* enum csd_tool_split_mode */
    bool sniffing; /* bare mode, before the answer's first byte that is not whitespace or the tag */
    bool whole;   /* the answer (mistral: from its tag on) is calls: held back to its end */
    bool in_call; /* inside <tool_call>: pending holds the body so far (open tag included) */
    bool plain;   /* every byte from now on is content (a whole answer too long to be a call) */
    bool skipping; /* a call too long to be one: content until its close tag has passed */
    size_t lead;  /* in a call: the whitespace bytes before its open tag in pending */
    size_t searched; /* in a call: no close tag starts in pending before this */
    csd_http_buf pending; /* text not yet handed out */
    csd_http_buf out;     /* the content handed out by the last call (the caller borrows it) */
    int n_calls;
    csd_tool_call calls[CSD_TOOL_CALLS_MAX];
} csd_tool_split;

/* mode: enum csd_tool_split_mode. */
void csd_tool_split_init(csd_tool_split *s, int mode);
void csd_tool_split_fini(csd_tool_split *s);

/* Adds len bytes of answer text (whole UTF-8 pieces). *content / *content_len: the content now safe
 * to show (borrowed until the next call); calls completed by this text are appended to s->calls.
 * Returns 0, or CSD_ENOMEM (the text is then lost to this splitter: the caller ends the
 * request). */
int csd_tool_split_push(csd_tool_split *s, const char *text, size_t len, const char **content,
                        size_t *content_len);
/* End of the answer: an open call is parsed as it stands (else it is content); the held-back text
 * is handed out. Returns 0 or CSD_ENOMEM. */
int csd_tool_split_finish(csd_tool_split *s, const char **content, size_t *content_len);

/* The mode a chat template's answers call tools in: CSD_TOOL_SPLIT_MISTRAL for Mistral's (they
 * write [TOOL_CALLS]), CSD_TOOL_SPLIT_BARE for Llama 3.1/3.2's (they mention <|python_tag|> or ask
 * for a JSON function call), CSD_TOOL_SPLIT_TAGS for the rest (and any with a <tool_call> tag). */
int csd_tool_split_mode_for_template(const char *template_src);

/* Parses one call's body (surrounding whitespace allowed) into *out (owned strings); with
 * need_arguments, "arguments" or "parameters" must be present (a bare call has no tag to say it is
 * one). Returns 0, 1 when the body is not a call, or CSD_ENOMEM. */
int csd_tool_call_parse(const char *body, size_t len, bool need_arguments, csd_tool_call *out);
/* One past the bracket that closes the object or list starting at p[0] ('{' or '['), or 0 when it
 * does not close in p[0, n). Brackets inside strings do not count; nothing else is checked. */
size_t csd_tool_json_close(const char *p, size_t n);
/* A call from its name and its arguments' text, which must be one JSON object (copied as written).
 * Returns 0, 1 when they are not a call (an empty name, a NUL in it), or CSD_ENOMEM. */
int csd_tool_call_make(const char *name, size_t name_len, const char *args, size_t args_len,
                       csd_tool_call *out);
void csd_tool_call_fini(csd_tool_call *c);

#endif
