/* sampler: turns a logits row into the next token. Greedy, temperature, top-k, top-p, min-p,
 * repetition/presence/frequency penalties (over the tokens penalty_scope says), and a seeded
 * generator so a seed reproduces a run exactly. Per sequence; all memory is allocated at creation.
 * Order: logit bias, penalties, top-k, temperature, top-p, min-p, draw. */
#ifndef CSD_SAMPLER_H
#define CSD_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"

/* Added to one token's logit before anything else (OpenAI's logit_bias: -100 bans a token in
 * practice, +100 forces it). */
typedef struct csd_logit_bias {
    int32_t id;
    float bias; /* in [-100, 100] */
} csd_logit_bias;
#define CSD_SAMPLER_MAX_LOGIT_BIAS 1024

/* Which tokens the penalties count. */
enum csd_penalty_scope {
    /* llama.cpp's: all three over the last penalty_last_n tokens, prompt included */
    CSD_PENALTY_RECENT = 0,
    /* OpenAI's and vLLM's: presence and frequency over every token of the answer so far (the
     * prompt's do not count: a chat's earlier end-of-turn tokens must not keep this one from
     * ending), repetition over every token of the prompt and of the answer (no window) */
    CSD_PENALTY_OPENAI = 1,
};

typedef struct csd_sampler_params {
    float temperature;        /* <= 0: greedy (argmax after penalties) */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off; > 1 discourages repeats (CTRL-style divide/multiply) */
    float presence_penalty;   /* 0: off; subtracted once from tokens seen */
    float frequency_penalty;  /* 0: off; subtracted per occurrence */
    int32_t penalty_last_n;   /* window of recent tokens the penalties look at (RECENT) */
    int penalty_scope;        /* enum csd_penalty_scope */
    uint64_t seed;
    int32_t n_logit_bias; /* entries of logit_bias in use (ids distinct) */
    csd_logit_bias logit_bias[CSD_SAMPLER_MAX_LOGIT_BIAS];
} csd_sampler_params;

void csd_sampler_params_default(csd_sampler_params *p);
/* Checks ranges (logit bias ids against vocab when vocab > 0); the message names the field. */
int csd_sampler_params_check(const csd_sampler_params *p, int32_t vocab, csd_err *err);
/* True when sampling is the plain argmax of the logits (greedy, no penalties, no logit bias): a
 * fleet's last stage may then send back the token id instead of the logits row. */
bool csd_sampler_is_plain_argmax(const csd_sampler_params *p);

typedef struct csd_sampler csd_sampler;

int csd_sampler_create(csd_sampler **out, const csd_sampler_params *p, int32_t vocab, csd_err *err);
void csd_sampler_destroy(csd_sampler *s);
/* Records a token of the prompt, or a generated one, for the penalties. */
void csd_sampler_accept_prompt(csd_sampler *s, int32_t id);
void csd_sampler_accept(csd_sampler *s, int32_t id);
/* Picks the next token. logits (vocab floats) are modified in place. */
int32_t csd_sampler_sample(csd_sampler *s, float *logits);
/* csd_sampler_sample in two halves, for a caller that rules tokens out (a logit of -INFINITY) in
 * between: adjust applies the logit bias and the penalties, pick the rest (argmax or the draw). */
void csd_sampler_adjust(csd_sampler *s, float *logits);
int32_t csd_sampler_pick(csd_sampler *s, float *logits);

/* log-softmax of logits at id, and the top n (ids, logprobs) in descending order (n <= 20). */
float csd_logprob_of(const float *logits, int32_t vocab, int32_t id);
int csd_top_logprobs(const float *logits, int32_t vocab, int n, int32_t *ids, float *logprobs);

#endif
