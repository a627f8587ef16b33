/* tokenize_api: POST /tokenize and /detokenize, the helper endpoints of llama-server and vLLM
 * (docs/api.md). Both request conventions are accepted:
 *   vLLM:         {"prompt": "text", "add_special_tokens": true}
 *   llama-server: {"content": "text", "add_special": false, "with_pieces": true}
 * and the answer serves both: {"tokens", "count", "max_model_len"}.
 * "prompt" is tokenized exactly as /v1/completions tokenizes it (BOS by the tokenizer's rules,
 * special-token strings taken literally); "content" as llama-server does (no BOS unless asked,
 * special-token strings recognised). "parse_special" overrides the second. /detokenize takes
 * {"tokens": [ids]} and answers {"prompt": text, "content": text} (special tokens kept).
 * vLLM's chat form ({"messages": [...]}) renders the chat template, so the server handles it
 * (it holds the template) and answers with csd_http_tokens_json. */
#ifndef CSD_HTTP_TOKENIZE_API_H
#define CSD_HTTP_TOKENIZE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "openai_request.h"
#include "tok/tokenizer.h"

/* The response body (free() it), or NULL with e filled (400 for a bad request, 500). */
char *csd_http_tokenize(const csd_tok *tok, const char *body, size_t len, int64_t max_ctx,
                        csd_http_error *e);
/* The same for a body already parsed into an object (the server parses it once to tell the
 * forms apart). */
char *csd_http_tokenize_object(const csd_tok *tok, const json_t *root, int64_t max_ctx,
                               csd_http_error *e);
/* True when root is vLLM's chat form of /tokenize: an object with "messages". */
bool csd_http_tokenize_is_chat(const json_t *root);
/* The /tokenize answer for ids (free() it); NULL when out of memory. */
char *csd_http_tokens_json(const csd_tok *tok, const int32_t *ids, size_t n, bool with_pieces,
                           int64_t max_ctx);
char *csd_http_detokenize(const csd_tok *tok, const char *body, size_t len, csd_http_error *e);

#endif
