/* ngram_draft: the draft tokens of prompt-lookup speculative decoding. The text so far (prompt
 * and answer) is searched for an earlier occurrence of its last few tokens; the tokens that
 * followed that occurrence are proposed as the next ones. Answers that quote their prompt (code
 * edits, summaries, extraction) or repeat themselves then take several tokens per step, each
 * checked by the model before it is kept (engine.c). No draft model is needed. */
#ifndef CSD_NGRAM_DRAFT_H
#define CSD_NGRAM_DRAFT_H

#include <stdint.h>

/* Longest draft a request may propose per step. */
#define CSD_SPEC_MAX_DRAFT 16

/* Longest and shortest suffix looked up: a longer match is tried first, as it predicts better. */
#define CSD_NGRAM_MAX 3
#define CSD_NGRAM_MIN 2

/* Finds the latest earlier occurrence of the last n tokens of hist[0..n_hist) (n from
 * CSD_NGRAM_MAX down to CSD_NGRAM_MIN) and writes the max_out tokens that followed it into out,
 * continuing periodically past the end of hist; returns max_out, or 0 when there is no such
 * occurrence. Linear in n_hist. */
int csd_ngram_draft(const int32_t *hist, int64_t n_hist, int32_t *out, int max_out);

/* Draft tokens a request may propose after its last token: want, but none a step would compute
 * for nothing: the step yields up to k + 1 tokens (max_tokens) and its KV ends at
 * n_prompt + n_gen + k (max_ctx). n_gen counts the tokens generated so far. <= 0: none. */
int64_t csd_spec_draft_limit(int64_t want, int64_t max_tokens, int64_t max_ctx, int64_t n_prompt,
                             int64_t n_gen);

/* Tokens a request's text (prompt, then answer) can reach: what its drafts are looked up in. */
int64_t csd_spec_text_cap(int64_t n_prompt, int64_t max_tokens, int64_t max_ctx);

#endif
