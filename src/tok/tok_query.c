/* tok_query: read-only questions about a loaded tokenizer (sizes, special ids, pieces, strings from
 * the config). All returned strings are borrowed from the csd_tok and live as long as it does. */
#include "tok/tokenizer.h"

#include <string.h>

#include "tok/tok_internal.h"

int32_t csd_tok_vocab_size(const csd_tok *tok) { return tok->n_ids; }
int32_t csd_tok_bos(const csd_tok *tok) { return tok->bos; }
int32_t csd_tok_eos(const csd_tok *tok) { return tok->eos; }

bool csd_tok_is_special(const csd_tok *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && (tok->id_flags[id] & CSD_TOK_ID_SPECIAL);
}

bool csd_tok_is_eog(const csd_tok *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && (tok->id_flags[id] & CSD_TOK_ID_EOG);
}

const char *csd_tok_piece(const csd_tok *tok, int32_t id) {
    if (id < 0 || id >= tok->n_ids || tok->id_sym[id] < 0) return NULL;
    return csd_tok_strtab_get(&tok->syms, (uint32_t)tok->id_sym[id]);
}

int32_t csd_tok_find(const csd_tok *tok, const char *piece) {
    int64_t s = csd_tok_strtab_find(&tok->syms, piece, strlen(piece));
    return s < 0 ? -1 : tok->sym_id[s];
}

const char *csd_tok_chat_template(const csd_tok *tok) { return tok->chat_template; }
const char *csd_tok_bos_text(const csd_tok *tok) { return tok->bos_text ? tok->bos_text : ""; }
const char *csd_tok_eos_text(const csd_tok *tok) { return tok->eos_text ? tok->eos_text : ""; }
