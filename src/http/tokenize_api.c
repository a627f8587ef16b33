/* tokenize_api: POST /tokenize and /detokenize (see tokenize_api.h). */
#include "tokenize_api.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* The text of one token as the streaming detokenizer gives it (llama-server's with_pieces), so
 * the pieces concatenate to the decoded text: leading-space rules applied once, and the bytes of a
 * character split over several tokens (byte fallback) in the piece of the token that completes
 * it. */
#define TOKENIZE_PIECE_MAX (64 << 10)
/* Answers are bounded as the requests are: ids at most as /detokenize takes (jansson holds each
 * as an object), and with pieces (an object, an id and a string each) a quarter of that. */
#define TOKENIZE_MAX_PIECES (CSD_HTTP_MAX_PROMPT_IDS / 4)

static json_t *pieces_list(const csd_tok *tok, const int32_t *ids, size_t n) {
    char *piece = csd_alloc(TOKENIZE_PIECE_MAX);
    json_t *list = piece ? json_array() : NULL;
    csd_detok d;
    csd_detok_init(&d, tok, false);
    for (size_t i = 0; list && i < n; i++) {
        size_t got = 0, more = 0;
        bool ok = csd_detok_push(&d, ids[i], piece, TOKENIZE_PIECE_MAX, &got) == 0 &&
                  (i + 1 < n ||
                   csd_detok_flush(&d, piece + got, TOKENIZE_PIECE_MAX - got, &more) == 0);
        json_t *t = ok ? json_pack("{s:i, s:s#}", "id", (int)ids[i], "piece", piece, got + more)
                       : NULL;
        if (!t || json_array_append_new(list, t)) {
            json_decref(list);
            list = NULL;
        }
    }
    csd_free(piece);
    return list;
}

static json_t *ids_list(const int32_t *ids, size_t n) {
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++) {
        if (json_array_append_new(list, json_integer(ids[i]))) {
            json_decref(list);
            list = NULL;
        }
    }
    return list;
}

bool csd_http_tokenize_is_chat(const json_t *root) {
    return json_is_object(root) && csd_http_member(root, "messages"); /* null is absent */
}

char *csd_http_tokens_json(const csd_tok *tok, const int32_t *ids, size_t n, bool with_pieces,
                           int64_t max_ctx) {
    json_t *list = with_pieces ? pieces_list(tok, ids, n) : ids_list(ids, n);
    if (!list) return NULL;
    json_t *root = json_pack("{s:o, s:I}", "tokens", list, "count", (json_int_t)n);
    if (root && max_ctx > 0) /* unknown while the model loads */
        json_object_set_new(root, "max_model_len", json_integer(max_ctx));
    char *out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}

char *csd_http_tokenize(const csd_tok *tok, const char *body, size_t len, int64_t max_ctx,
                        csd_http_error *e) {
    json_t *root = csd_http_body_object(body, len, e);
    if (!root) return NULL;
    char *out = csd_http_tokenize_object(tok, root, max_ctx, e);
    json_decref(root);
    return out;
}

char *csd_http_tokenize_object(const csd_tok *tok, const json_t *root, int64_t max_ctx,
                               csd_http_error *e) {
    const json_t *prompt = csd_http_member(root, "prompt"), /* null is absent, as elsewhere */
        *content = csd_http_member(root, "content");
    bool llama_style = !prompt && content;
    const char *field = llama_style ? "content" : "prompt";
    const json_t *text = llama_style ? content : prompt;
    /* the defaults of each convention: see tokenize_api.h */
    bool add_special = !llama_style, parse_special = llama_style, with_pieces = false;
    char *out = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!text || !json_is_string(text)) {
        csd_http_bad_type(e, field, "a string (the text to tokenize)");
    } else if (!csd_http_read_bool(root, "add_special_tokens", &add_special, e) &&
               !csd_http_read_bool(root, "add_special", &add_special, e) &&
               !csd_http_read_bool(root, "parse_special", &parse_special, e) &&
               !csd_http_read_bool(root, "with_pieces", &with_pieces, e)) {
        csd_err err = {0};
        if (csd_tok_encode(tok, json_string_value(text), json_string_length(text), add_special,
                           parse_special, &ids, &n, &err)) {
            csd_http_error_set(e, 400, NULL, field, "invalid_value", "could not tokenize: %s",
                               err.msg);
        } else if (n > (with_pieces ? TOKENIZE_MAX_PIECES : CSD_HTTP_MAX_PROMPT_IDS)) {
            csd_http_error_set(e, 400, NULL, field, "invalid_value",
                               "the text is %zu tokens; /tokenize answers at most %d%s", n,
                               with_pieces ? TOKENIZE_MAX_PIECES : CSD_HTTP_MAX_PROMPT_IDS,
                               with_pieces ? " with pieces" : "");
        } else if (!(out = csd_http_tokens_json(tok, ids, n, with_pieces, max_ctx))) {
            csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    csd_free(ids);
    return out;
}

/* root["tokens"] as ids inside the vocabulary (csd_free *ids), or e set. */
static int read_token_list(const json_t *root, int32_t vocab, int32_t **ids, size_t *n,
                           csd_http_error *e) {
    const json_t *list = json_object_get(root, "tokens");
    if (!json_is_array(list)) return csd_http_bad_type(e, "tokens", "a list of token ids");
    *n = json_array_size(list);
    if (*n > CSD_HTTP_MAX_PROMPT_IDS)
        return csd_http_bad_value(e, "tokens", "at most 1048576 token ids");
    *ids = csd_alloc_array(*n ? *n : 1, sizeof **ids);
    if (!*ids) return csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1; /* -1: not an id */
        if (id < 0 || id >= vocab)
            return csd_http_error_set(e, 400, NULL, "tokens", "invalid_value",
                                      "tokens[%zu] is not a token id in [0, %d)", i, (int)vocab);
        (*ids)[i] = (int32_t)id;
    }
    return 0;
}

char *csd_http_detokenize(const csd_tok *tok, const char *body, size_t len, csd_http_error *e) {
    json_t *root = csd_http_body_object(body, len, e);
    if (!root) return NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL, *out = NULL;
    size_t text_len = 0;
    csd_err err = {0};
    if (read_token_list(root, csd_tok_vocab_size(tok), &ids, &n, e) == 0) {
        if (csd_tok_decode_len(tok, ids, n, false, &text, &text_len, &err)) {
            csd_http_error_set(e, 400, NULL, "tokens", "invalid_value", "could not decode: %s",
                               err.msg);
        } else {
            /* decoded text is whole UTF-8: bytes that form no character came out as U+FFFD */
            json_t *res = json_pack("{s:s#, s:s#}", "prompt", text, text_len, "content", text,
                                    text_len); /* NUL bytes included */
            out = res ? json_dumps(res, JSON_COMPACT) : NULL;
            json_decref(res);
            if (!out) csd_http_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    csd_free(text);
    csd_free(ids);
    json_decref(root);
    return out;
}
