/* tokenizer: Hugging Face tokenizer.json + tokenizer_config.json, encode and decode.
 * Two model families: byte-level BPE with a pre-tokenizer regex (Llama 3, Qwen) and
 * SentencePiece-style BPE with byte fallback and the "▁" normalizer (Llama 2, Mistral,
 * stories260K). Added and special tokens, BOS/EOS rules from the config. Decoding is incremental
 * and never emits broken UTF-8. */
#ifndef CSD_TOKENIZER_H
#define CSD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* Refuse tokenizer files larger than this (the largest real ones are ~12 MB). */
#define CSD_TOK_MAX_FILE_BYTES (64u * 1024u * 1024u)

typedef struct csd_tok csd_tok;

/* Loads DIR/tokenizer.json and DIR/tokenizer_config.json (the latter optional). */
int csd_tok_load(csd_tok **out, const char *dir, csd_err *err);
/* Same from memory (config_json may be NULL); used by tests and the fuzz target. */
int csd_tok_load_mem(csd_tok **out, const char *tokenizer_json, size_t len, const char *config_json,
                     size_t config_len, csd_err *err);
void csd_tok_destroy(csd_tok *tok);

/* Encodes text (len bytes, any bytes: invalid UTF-8 is handled as the reference does).
 * add_special: apply the config's BOS/EOS rules (add_bos_token / post_processor).
 * parse_special: recognise special-token strings inside text ("<|eot_id|>") as their ids.
 * *ids is allocated with csd_alloc (csd_free it); *n_ids its length. */
int csd_tok_encode(const csd_tok *tok, const char *text, size_t len, bool add_special,
                   bool parse_special, int32_t **ids, size_t *n_ids, csd_err *err);

/* Decodes a whole sequence into a NUL-terminated csd_alloc'd string. skip_special drops special
 * tokens (BOS, EOS, ...) from the text. */
int csd_tok_decode(const csd_tok *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
                   csd_err *err);
/* The same, with *len the text's length: the text may hold NUL bytes (a <0x00> piece, say). */
int csd_tok_decode_len(const csd_tok *tok, const int32_t *ids, size_t n, bool skip_special,
                       char **text, size_t *len, csd_err *err);

int32_t csd_tok_vocab_size(const csd_tok *tok);       /* including added tokens */
int32_t csd_tok_bos(const csd_tok *tok);              /* -1 when none */
int32_t csd_tok_eos(const csd_tok *tok);              /* -1 when none */
bool csd_tok_is_special(const csd_tok *tok, int32_t id);
/* End of generation: EOS, and end-of-turn tokens such as <|eot_id|>, <|im_end|>,
 * <|end_of_text|>. */
bool csd_tok_is_eog(const csd_tok *tok, int32_t id);
/* The vocabulary string of id (as in tokenizer.json, e.g. "▁the" or "Ġthe"); NULL when out of
 * range. */
const char *csd_tok_piece(const csd_tok *tok, int32_t id);
/* The bytes id adds to a decoded text in its middle (at most cap, to out; *len their count), before
 * UTF-8 decoding: none for a special token. CSD_ERANGE for an id outside the vocabulary, CSD_EFULL
 * when they exceed cap. */
int csd_tok_token_bytes(const csd_tok *tok, int32_t id, uint8_t *out, size_t cap, size_t *len);
/* Id of an exact vocabulary or added-token string, -1 when absent. */
int32_t csd_tok_find(const csd_tok *tok, const char *piece);
/* The chat template string from tokenizer_config.json, NULL when absent (borrowed). */
const char *csd_tok_chat_template(const csd_tok *tok);
/* bos_token / eos_token strings from tokenizer_config.json ("" when absent; borrowed). */
const char *csd_tok_bos_text(const csd_tok *tok);
const char *csd_tok_eos_text(const csd_tok *tok);

/* Incremental detokenizer for streaming: push ids one at a time, get text that is always whole
 * UTF-8 (bytes of an unfinished character are held back until complete). Produces exactly the same
 * concatenated text as csd_tok_decode over the same ids (unless csd_detok_keep shows a special id
 * that the decode would skip). Caller-provided storage. */
#define CSD_DETOK_MAX_PENDING 64
#define CSD_DETOK_MAX_KEEP 8
/* Bytes one csd_detok_push or csd_detok_flush writes at most, NUL included: a tokenizer with a
 * token that decodes to more (csd_tok_load refuses it; real vocabularies stay under 300 bytes) is
 * not loaded, so a buffer of this size never fills and no token's text is ever dropped. */
#define CSD_DETOK_PIECE_MAX 4096

typedef struct csd_detok {
    const csd_tok *tok;
    bool skip_special;
    int32_t keep[CSD_DETOK_MAX_KEEP];      /* special ids shown all the same (-1: none) */
    bool at_start;                         /* for leading-space rules of the decoder */
    size_t n_pending;
    uint8_t pending[CSD_DETOK_MAX_PENDING]; /* bytes of an incomplete UTF-8 sequence */
    /* Bytes at the start of the last push's text that belong to earlier ids: the U+FFFD of a
     * character they began and this id broke (0 or 3). Where this id's own text starts. */
    size_t carried;
} csd_detok;

void csd_detok_init(csd_detok *d, const csd_tok *tok, bool skip_special);
/* Shows id as text although it is special and skip_special is set (the tags of tool calls and of
 * thinking, which some vocabularies mark special). At most CSD_DETOK_MAX_KEEP ids; id < 0 is
 * ignored. */
void csd_detok_keep(csd_detok *d, int32_t id);
/* Appends the text for id to out (capacity cap, NUL-terminated); *out_len is the bytes written. */
int csd_detok_push(csd_detok *d, int32_t id, char *out, size_t cap, size_t *out_len);
/* Emits what is still held back (invalid trailing bytes become U+FFFD, as the reference does). */
int csd_detok_flush(csd_detok *d, char *out, size_t cap, size_t *out_len);

#endif
