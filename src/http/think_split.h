/* think_split: a reasoning model's thinking, split from its answer while the text streams.
 *
 * Qwen3, DeepSeek-R1, QwQ and their distillations think first, between <think> and </think>, and
 * answer after. With the server's --reasoning-format deepseek (the default, as llama-server's),
 * the thinking becomes message.reasoning_content (delta.reasoning_content when streamed) and the
 * rest message.content. The answer thinks when it starts with <think> (after whitespace), or when
 * the prompt already opened it (templates such as DeepSeek-R1's end the prompt with "<think>\n"):
 * then everything up to </think> is thinking. Whitespace right inside the tags and right after the
 * close tag is dropped (it only lays the text out; before </think>, the last CSD_THINK_SPACE_MAX
 * bytes of a run, so that what is held back stays bounded).
 * An answer that does not start thinking is all content, byte for byte; thinking that never closes
 * (max_tokens) is all reasoning_content.
 *
 * Pure and bounded (what is held back is a partial tag and at most CSD_THINK_SPACE_MAX bytes of
 * whitespace); unit-tested apart from the server. */
#ifndef CSD_HTTP_THINK_SPLIT_H
#define CSD_HTTP_THINK_SPLIT_H

#include <stdbool.h>
#include <stddef.h>

#include "mhd/text_buf.h"

#define CSD_THINK_SPACE_MAX 1024

enum csd_think_state {
    CSD_THINK_START,   /* nothing but whitespace and a partial "<think>" yet */
    CSD_THINK_INSIDE,  /* thinking */
    CSD_THINK_AFTER,   /* past </think>: dropping whitespace */
    CSD_THINK_CONTENT, /* the answer: passed through */
};

typedef struct csd_think_split {
    int state;     /* enum csd_think_state */
    bool at_start; /* inside: no thinking text handed out yet (leading whitespace is dropped) */
    csd_http_buf pending; /* held back: whitespace, a partial tag */
    csd_http_buf out[2];  /* the last call's reasoning [0] and content [1] (the caller borrows) */
} csd_think_split;

/* True when a rendered prompt ends inside an open <think> (whitespace after it allowed): a
 * template that starts the answer's thinking itself, as DeepSeek-R1's does. */
bool csd_think_prompt_opens(const char *prompt);

/* open: the prompt ended inside <think> (the answer starts thinking without writing the tag). */
void csd_think_split_init(csd_think_split *s, bool open);
void csd_think_split_fini(csd_think_split *s);

/* Adds len bytes of answer text. Sets the reasoning and content now safe to show (borrowed until
 * the next call). Returns 0 or CSD_ENOMEM. */
int csd_think_split_push(csd_think_split *s, const char *text, size_t len, const char **reasoning,
                         size_t *reasoning_len, const char **content, size_t *content_len);
/* End of the answer: hands out what was held back (a partial tag as the text it is). */
int csd_think_split_finish(csd_think_split *s, const char **reasoning, size_t *reasoning_len,
                           const char **content, size_t *content_len);

#endif
