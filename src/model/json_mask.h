/* json_mask: what OpenAI's response_format {"type": "json_object"} does to sampling. Every token's
 * bytes are kept in one table (built once per tokenizer); before each sampled token, the tokens
 * whose bytes cannot continue the object so far (json_accept.h) get a logit of -infinity. Tokens
 * without bytes (special ones: end of generation, chat markers) are never allowed: generation ends
 * when the object closes. */
#ifndef CSD_JSON_MASK_H
#define CSD_JSON_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "model/json_accept.h"

typedef struct csd_vocab_bytes csd_vocab_bytes;

/* Writes the bytes token id adds to a text (at most cap) to out and their count to *len; none for
 * a special token. Returns 0 or a CSD_E* code. */
typedef int (*csd_token_bytes_fn)(void *ctx, int32_t id, uint8_t *out, size_t cap, size_t *len);

/* The table of n_ids tokens' bytes, each at most CSD_VOCAB_MAX_TOKEN_BYTES. */
#define CSD_VOCAB_MAX_TOKEN_BYTES 1024
int csd_vocab_bytes_create(csd_vocab_bytes **out, int32_t n_ids, csd_token_bytes_fn fn, void *ctx,
                           csd_err *err);
void csd_vocab_bytes_destroy(csd_vocab_bytes *v);

/* Sets logits[id] (vocab entries) to -INFINITY for every token that cannot follow a: ids beyond
 * the table too. Returns how many tokens remain allowed (0: the object cannot go on). */
int32_t csd_json_mask(const csd_json_accept *a, const csd_vocab_bytes *v, float *logits,
                      int32_t vocab);
/* Moves a on by token id's bytes; false (a unchanged) when they cannot follow. */
bool csd_json_accept_token(csd_json_accept *a, const csd_vocab_bytes *v, int32_t id);

#endif
