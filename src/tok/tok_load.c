/* tok_load: parses tokenizer.json (+ tokenizer_config.json, generation_config.json) into a csd_tok.
 * Every field is validated before use (types, id ranges, counts bounded before allocation); any
 * component we do not implement is refused with CSD_EUNSUPPORTED naming it, never approximated.
 * See docs/tokenizer.md for the supported subset and the BOS/EOS rules. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok/tokenizer.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/file_map.h"
#include "core/log.h"
#include "tok/tok_internal.h"

int csd_tok_regex_compile_gpt2(csd_tok *tok, void **code, csd_err *err);

/* Metaspace's replacement character when tokenizer.json names none: U+2581 in UTF-8. */
#define METASPACE_DEFAULT "\xE2\x96\x81"

/* End-of-generation markers recognised by content when the vocabulary has them as added tokens
 * (one that is an ordinary piece, as "</s>" is in Qwen's vocabulary, is text). */
static const char *const eog_names[] = {
    "<|eot_id|>",      "<|eom_id|>",    "<|im_end|>", "<|endoftext|>",
    "<|end_of_text|>", "<end_of_turn>", "<|end|>",    "</s>"};

static void *gc_malloc(PCRE2_SIZE n, void *data) {
    (void)data;
    return csd_alloc(n);
}

static void gc_free(void *p, void *data) {
    (void)data;
    csd_free(p);
}

static int intern(csd_tok *tok, const char *s, size_t n, uint32_t *out, csd_err *err) {
    int rc = csd_tok_strtab_intern(&tok->syms, s, n, out);
    return rc ? csd_err_set(err, rc, "tokenizer.json: too many or too long strings") : 0;
}

/* A bool member: absent or null -> def; anything but a boolean is an error. */
static int get_bool(const json_t *obj, const char *key, bool def, bool *out, const char *what,
                    csd_err *err) {
    const json_t *v = json_object_get(obj, key);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: %s.%s must be a boolean", what, key);
    *out = json_is_true(v);
    return 0;
}

/* A string member that must be present. */
static int get_str(const json_t *obj, const char *key, const char **out, const char *what,
                   csd_err *err) {
    const json_t *v = json_object_get(obj, key);
    *out = "";
    if (!json_is_string(v))
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: %s.%s must be a string", what, key);
    *out = json_string_value(v);
    return 0;
}

static int dup_str(const char *s, char **out, csd_err *err) {
    *out = csd_strdup(s);
    return *out ? 0 : csd_err_set(err, CSD_ENOMEM, "out of memory");
}

static int get_id(const json_t *v, int32_t *out) {
    if (!json_is_integer(v)) return CSD_EFORMAT;
    json_int_t x = json_integer_value(v);
    if (x < 0 || x >= CSD_TOK_MAX_IDS) return CSD_ERANGE;
    *out = (int32_t)x;
    return 0;
}

/* ---- normalizer ---- */
static int parse_normalizer(csd_tok *tok, const json_t *n, int depth, csd_err *err) {
    if (!n || json_is_null(n)) return 0;
    const char *type;
    if (!json_is_object(n) || get_str(n, "type", &type, "normalizer", err))
        return csd_err_set(err, CSD_EFORMAT,
                           "tokenizer.json: normalizer must be an object with a type");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list) || depth > 4)
            return csd_err_set(err, CSD_EFORMAT,
                               "tokenizer.json: normalizer Sequence needs a normalizers array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            int rc = parse_normalizer(tok, json_array_get(list, i), depth + 1, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (tok->n_norm == CSD_TOK_MAX_STEPS)
        return csd_err_set(err, CSD_EUNSUPPORTED, "tokenizer.json: too many normalizer steps");
    csd_tok_norm_step *st = &tok->norm[tok->n_norm];
    const char *a, *b;
    if (strcmp(type, "Prepend") == 0) {
        if (get_str(n, "prepend", &a, "normalizer Prepend", err)) return CSD_EFORMAT;
        /* it is added to every text section, and added tokens can cut a text into as many
         * sections as it has bytes: a long one would multiply the text (real ones: "\u2581") */
        if (strlen(a) > CSD_TOK_MAX_PREPEND)
            return csd_err_set(err, CSD_EUNSUPPORTED,
                               "tokenizer.json: normalizer Prepend of %zu bytes (at most %d)",
                               strlen(a), CSD_TOK_MAX_PREPEND);
        st->kind = CSD_TOK_NORM_PREPEND;
        if (dup_str(a, &st->a, err)) return CSD_ENOMEM;
    } else if (strcmp(type, "Replace") == 0) {
        const json_t *pat = json_object_get(n, "pattern");
        const json_t *ps = json_object_get(pat, "String");
        if (!json_is_string(ps))
            return csd_err_set(err, CSD_EUNSUPPORTED,
                               "tokenizer.json: normalizer Replace supports only a String pattern");
        if (get_str(n, "content", &b, "normalizer Replace", err)) return CSD_EFORMAT;
        st->kind = CSD_TOK_NORM_REPLACE;
        if (dup_str(json_string_value(ps), &st->a, err) || dup_str(b, &st->b, err))
            return CSD_ENOMEM;
    } else if (strcmp(type, "NFC") == 0) {
        st->kind = CSD_TOK_NORM_NFC;
    } else {
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "tokenizer.json: normalizer '%.64s' is not supported", type);
    }
    tok->n_norm++;
    return 0;
}

/* The normalizers run on every text encoded, so their output must stay a bounded multiple of their
 * input: a Replace whose content holds its own pattern, chained, grows text exponentially (a
 * 2 KB tokenizer.json found by fuzzing took a minute and gigabytes to encode a line). Worst cases
 * per step: Replace multiplies by ceil(content / pattern), NFC by 3 (UAX #15's bound in UTF-8),
 * Prepend adds at most CSD_TOK_MAX_PREPEND bytes per section. Real tokenizers grow text 3 to 9
 * times (Llama 2: " " -> "\u2581"). */
static int check_norm_growth(const csd_tok *tok, csd_err *err) {
    uint64_t growth = 1;
    for (size_t s = 0; s < tok->n_norm; s++) {
        const csd_tok_norm_step *st = &tok->norm[s];
        uint64_t f = 1;
        if (st->kind == CSD_TOK_NORM_NFC) f = 3;
        if (st->kind == CSD_TOK_NORM_REPLACE && st->a[0] != '\0') {
            size_t from = strlen(st->a), to = strlen(st->b);
            f = to > from ? (to + from - 1) / from : 1;
        }
        growth = f > CSD_TOK_MAX_NORM_GROWTH ? f : growth * f; /* both <= 64 * 64: no overflow */
        if (growth > CSD_TOK_MAX_NORM_GROWTH)
            return csd_err_set(err, CSD_EUNSUPPORTED,
                               "tokenizer.json: normalizers 1-%zu can lengthen a text %llu-fold "
                               "or more (at most %d is supported)",
                               s + 1, (unsigned long long)growth, CSD_TOK_MAX_NORM_GROWTH);
    }
    return 0;
}

/* ---- pre-tokenizer ---- */
/* Split: a Regex (translated for PCRE2) or a literal String, Isolated or Removed, maybe
 * inverted. */
static int parse_split_step(csd_tok *tok, const json_t *p, csd_tok_pre_step *st, csd_err *err) {
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    const json_t *src = json_is_string(re) ? re : lit;
    if (!json_is_string(src))
        return csd_err_set(err, CSD_EFORMAT,
                           "tokenizer.json: Split needs a Regex or String pattern");
    const json_t *beh = json_object_get(p, "behavior");
    const char *b = json_is_string(beh) ? json_string_value(beh) : "Isolated";
    if (strcmp(b, "Isolated") != 0 && strcmp(b, "Removed") != 0)
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "tokenizer.json: Split behavior '%.32s' is not supported", b);
    st->removed = strcmp(b, "Removed") == 0;
    if (get_bool(p, "invert", false, &st->invert, "Split", err)) return CSD_EFORMAT;
    st->kind = CSD_TOK_PRE_SPLIT;
    return csd_tok_regex_compile(tok, json_string_value(src), json_string_length(src), src == re,
                                 &st->code, err);
}

/* ByteLevel: bytes to GPT-2's printable alphabet, split by its built-in regex unless use_regex is
 * false. */
static int parse_bytelevel_step(csd_tok *tok, const json_t *p, csd_tok_pre_step *st, csd_err *err) {
    bool use_regex;
    st->kind = CSD_TOK_PRE_BYTELEVEL;
    if (get_bool(p, "add_prefix_space", false, &st->add_prefix_space, "ByteLevel", err) ||
        get_bool(p, "use_regex", true, &use_regex, "ByteLevel", err))
        return CSD_EFORMAT;
    if (!use_regex) return 0;
    st->invert = true; /* the reference keeps only the matches of its built-in regex */
    return csd_tok_regex_compile_gpt2(tok, &st->code, err);
}

/* Metaspace: spaces become the replacement character, prepended per prepend_scheme. */
static int parse_metaspace_step(const json_t *p, csd_tok_pre_step *st, csd_err *err) {
    const json_t *r = json_object_get(p, "replacement");
    const json_t *scheme = json_object_get(p, "prepend_scheme");
    const char *sc = json_is_string(scheme) ? json_string_value(scheme) : "always";
    st->kind = CSD_TOK_PRE_METASPACE;
    st->prepend = strcmp(sc, "first") == 0   ? CSD_TOK_PREPEND_FIRST
                  : strcmp(sc, "never") == 0 ? CSD_TOK_PREPEND_NEVER
                                             : CSD_TOK_PREPEND_ALWAYS;
    if (dup_str(json_is_string(r) ? json_string_value(r) : METASPACE_DEFAULT, &st->replacement,
                err))
        return CSD_ENOMEM;
    return 0;
}

static int parse_pretok(csd_tok *tok, const json_t *p, int depth, csd_err *err) {
    if (!p || json_is_null(p)) return 0;
    const char *type;
    if (!json_is_object(p) || get_str(p, "type", &type, "pre_tokenizer", err))
        return csd_err_set(err, CSD_EFORMAT,
                           "tokenizer.json: pre_tokenizer must be an object with a type");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list))
            return csd_err_set(
                err, CSD_EFORMAT,
                "tokenizer.json: pre_tokenizer Sequence needs a pretokenizers array");
        if (depth > 4)
            return csd_err_set(err, CSD_EUNSUPPORTED,
                               "tokenizer.json: pre_tokenizer Sequences nest too deeply");
        for (size_t i = 0; i < json_array_size(list); i++) {
            int rc = parse_pretok(tok, json_array_get(list, i), depth + 1, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (tok->n_pre == CSD_TOK_MAX_STEPS)
        return csd_err_set(err, CSD_EUNSUPPORTED, "tokenizer.json: too many pre-tokenizer steps");
    csd_tok_pre_step *st = &tok->pre[tok->n_pre];
    int rc;
    if (strcmp(type, "Split") == 0)
        rc = parse_split_step(tok, p, st, err);
    else if (strcmp(type, "ByteLevel") == 0)
        rc = parse_bytelevel_step(tok, p, st, err);
    else if (strcmp(type, "Metaspace") == 0)
        rc = parse_metaspace_step(p, st, err);
    else
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "tokenizer.json: pre_tokenizer '%.64s' is not supported", type);
    if (rc) return rc;
    tok->n_pre++;
    return 0;
}

/* ---- decoder ---- */
/* Metaspace: the replacement character (default U+2581) decodes to a space; a prefix space is
 * stripped at the start unless prepend_scheme is "never" (or add_prefix_space false). */
static int parse_metaspace_decoder(csd_tok *tok, const json_t *d, csd_err *err) {
    const char *rep = METASPACE_DEFAULT;
    const json_t *r = json_object_get(d, "replacement");
    if (json_is_string(r)) rep = json_string_value(r);
    const json_t *scheme = json_object_get(d, "prepend_scheme");
    bool prefix = true;
    if (json_is_string(scheme))
        prefix = strcmp(json_string_value(scheme), "never") != 0;
    else if (get_bool(d, "add_prefix_space", true, &prefix, "Metaspace", err))
        return CSD_EFORMAT;
    tok->dec_kind = CSD_TOK_DEC_SP;
    tok->dec_strip_start = prefix ? 1 : 0;
    if (dup_str(rep, &tok->dec_from, err) || dup_str(" ", &tok->dec_to, err)) return CSD_ENOMEM;
    return 0;
}

/* A Sequence's Replace step: one String pattern replaced by content. */
static int parse_replace_step(csd_tok *tok, const json_t *x, csd_err *err) {
    const json_t *ps = json_object_get(json_object_get(x, "pattern"), "String");
    const json_t *c = json_object_get(x, "content");
    if (!json_is_string(ps) || !json_is_string(c) || json_string_length(ps) == 0)
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "tokenizer.json: decoder Replace supports only a String pattern");
    if (dup_str(json_string_value(ps), &tok->dec_from, err) ||
        dup_str(json_string_value(c), &tok->dec_to, err))
        return CSD_ENOMEM;
    return 0;
}

/* A Sequence's Strip step: only what Llama/Mistral tokenizers use (one leading space at most). */
static int parse_strip_step(csd_tok *tok, const json_t *x, csd_err *err) {
    const json_t *c = json_object_get(x, "content");
    const json_t *start = json_object_get(x, "start"), *stop = json_object_get(x, "stop");
    json_int_t a = json_is_integer(start) ? json_integer_value(start) : 0;
    json_int_t b = json_is_integer(stop) ? json_integer_value(stop) : 0;
    if (!json_is_string(c) || strcmp(json_string_value(c), " ") != 0 || a < 0 || a > 1 || b != 0)
        return csd_err_set(
            err, CSD_EUNSUPPORTED,
            "tokenizer.json: decoder Strip supports content \" \", start 0-1, stop 0");
    tok->dec_strip_start = (int)a;
    return 0;
}

/* Sequence: Replace -> ByteFallback -> Fuse -> Strip, each optional, in this order. */
static int parse_sequence_decoder(csd_tok *tok, const json_t *d, csd_err *err) {
    const json_t *list = json_object_get(d, "decoders");
    if (!json_is_array(list))
        return csd_err_set(err, CSD_EFORMAT,
                           "tokenizer.json: decoder Sequence needs a decoders array");
    tok->dec_kind = CSD_TOK_DEC_SP;
    int stage = 0, rc = 0;
    for (size_t i = 0; i < json_array_size(list) && !rc; i++) {
        const json_t *x = json_array_get(list, i);
        const char *t;
        if (!json_is_object(x) || get_str(x, "type", &t, "decoder", err))
            return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: decoder %zu must have a type", i);
        if (strcmp(t, "Replace") == 0 && stage == 0 && !tok->dec_from) {
            rc = parse_replace_step(tok, x, err);
        } else if (strcmp(t, "ByteFallback") == 0 && stage <= 1) {
            tok->dec_byte_fallback = true;
            stage = 2;
        } else if (strcmp(t, "Fuse") == 0 && stage <= 2) {
            stage = 3;
        } else if (strcmp(t, "Strip") == 0 && stage == 3) {
            rc = parse_strip_step(tok, x, err);
            stage = 4;
        } else {
            return csd_err_set(
                err, CSD_EUNSUPPORTED,
                "tokenizer.json: decoder step '%.32s' at position %zu is not supported", t, i);
        }
    }
    return rc;
}

static int parse_decoder(csd_tok *tok, const json_t *d, csd_err *err) {
    if (!d || json_is_null(d)) return 0;
    const char *type;
    if (!json_is_object(d) || get_str(d, "type", &type, "decoder", err))
        return csd_err_set(err, CSD_EFORMAT,
                           "tokenizer.json: decoder must be an object with a type");
    if (strcmp(type, "ByteLevel") == 0) {
        tok->dec_kind = CSD_TOK_DEC_BYTELEVEL;
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) return parse_metaspace_decoder(tok, d, err);
    if (strcmp(type, "Sequence") == 0) return parse_sequence_decoder(tok, d, err);
    return csd_err_set(err, CSD_EUNSUPPORTED, "tokenizer.json: decoder '%.64s' is not supported",
                       type);
}

/* ---- post-processor: the ids TemplateProcessing puts around a single sequence ---- */
static int template_token(const csd_tok *tok, const json_t *specials, const char *name,
                          int32_t *ids, size_t *n, csd_err *err) {
    const json_t *ent = json_object_get(specials, name);
    const json_t *list = json_object_get(ent, "ids");
    if (json_is_array(list) && json_array_size(list) > 0) {
        for (size_t i = 0; i < json_array_size(list); i++) {
            int32_t id;
            if (get_id(json_array_get(list, i), &id) || id >= tok->n_ids ||
                tok->id_sym[id] < 0 || *n == 8) /* an id of no token: none to encode */
                return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: bad template token '%.64s'",
                                   name);
            ids[(*n)++] = id;
        }
        return 0;
    }
    int32_t id = csd_tok_find(tok, name);
    if (id < 0 || *n == 8)
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: template token '%.64s' is unknown",
                           name);
    ids[(*n)++] = id;
    return 0;
}

static int parse_post(csd_tok *tok, const json_t *p, int depth, csd_err *err) {
    if (!p || json_is_null(p)) return 0;
    const char *type;
    if (!json_is_object(p) || get_str(p, "type", &type, "post_processor", err))
        return csd_err_set(err, CSD_EFORMAT,
                           "tokenizer.json: post_processor must be an object with a type");
    if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(p, "processors");
        if (!json_is_array(list) || depth > 4)
            return csd_err_set(err, CSD_EFORMAT,
                               "tokenizer.json: post_processor Sequence needs processors");
        for (size_t i = 0; i < json_array_size(list); i++) {
            int rc = parse_post(tok, json_array_get(list, i), depth + 1, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return csd_err_set(err, CSD_EUNSUPPORTED,
                           "tokenizer.json: post_processor '%.64s' is not supported", type);
    const json_t *single = json_object_get(p, "single");
    const json_t *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single))
        return csd_err_set(err, CSD_EFORMAT,
                           "tokenizer.json: TemplateProcessing needs a single template");
    bool seen_a = false;
    tok->n_prefix = tok->n_suffix = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *item = json_array_get(single, i);
        const json_t *sp = json_object_get(item, "SpecialToken");
        if (sp) {
            const char *name;
            if (get_str(sp, "id", &name, "SpecialToken", err)) return CSD_EFORMAT;
            int rc = seen_a ? template_token(tok, specials, name, tok->suffix, &tok->n_suffix, err)
                            : template_token(tok, specials, name, tok->prefix, &tok->n_prefix, err);
            if (rc) return rc;
        } else if (json_object_get(item, "Sequence")) {
            seen_a = true;
        } else {
            return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: bad TemplateProcessing item %zu",
                               i);
        }
    }
    return 0;
}

/* ---- model ---- */
static int parse_vocab(csd_tok *tok, const json_t *vocab, uint32_t **vsym, int32_t **vid,
                       size_t *nv, int32_t *max_id, csd_err *err) {
    if (!json_is_object(vocab))
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: model.vocab must be an object");
    size_t n = json_object_size(vocab);
    if (n == 0 || n > CSD_TOK_MAX_IDS)
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: model.vocab has %zu entries", n);
    *vsym = csd_alloc_array(n, sizeof **vsym);
    *vid = csd_alloc_array(n, sizeof **vid);
    if (!*vsym || !*vid) return csd_err_set(err, CSD_ENOMEM, "out of memory for the vocabulary");
    const char *key;
    const json_t *val;
    size_t i = 0;
    json_object_foreach((json_t *)vocab, key, val) {
        int32_t id;
        if (get_id(val, &id))
            return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: vocab entry '%.64s' has a bad id",
                               key);
        if (intern(tok, key, strlen(key), &(*vsym)[i], err)) return CSD_EFORMAT;
        (*vid)[i++] = id;
        if (id > *max_id) *max_id = id;
    }
    *nv = i;
    return 0;
}

static int parse_merges(csd_tok *tok, const json_t *merges, csd_err *err) {
    size_t n = json_is_array(merges) ? json_array_size(merges) : 0;
    if (merges && !json_is_null(merges) && !json_is_array(merges))
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: model.merges must be an array");
    if (n > CSD_TOK_MAX_MERGES)
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: %zu merges is too many", n);
    if (csd_tok_pairmap_init(&tok->merges, n))
        return csd_err_set(err, CSD_ENOMEM, "out of memory for merges");
    csd_tok_buf cat = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(m)) {
            /* "a b": as the reference's split(" ", 2): the text up to the first space, then up to
             * the next one; a rule without a space can never match a pair */
            a = json_string_value(m);
            const char *sp = memchr(a, ' ', json_string_length(m));
            if (!sp) continue;
            al = (size_t)(sp - a);
            b = sp + 1;
            const char *sp2 = strchr(b, ' ');
            bl = sp2 ? (size_t)(sp2 - b) : strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            al = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bl = json_string_length(json_array_get(m, 1));
        } else {
            rc = csd_err_set(err, CSD_EFORMAT,
                             "tokenizer.json: merge %zu is neither \"a b\" nor [a, b]", i);
            break;
        }
        uint32_t sa, sb, sr;
        cat.len = 0;
        if (csd_tok_buf_put(&cat, a, al) || csd_tok_buf_put(&cat, b, bl)) {
            rc = csd_err_set(err, CSD_ENOMEM, "out of memory for merges");
            break;
        }
        if (intern(tok, a, al, &sa, err) || intern(tok, b, bl, &sb, err) ||
            intern(tok, cat.p, cat.len, &sr, err)) {
            rc = CSD_EFORMAT;
            break;
        }
        if (csd_tok_pairmap_put(&tok->merges, sa, sb, (int32_t)i, sr))
            rc = csd_err_set(err, CSD_ENOMEM, "merge table full");
    }
    csd_tok_buf_free(&cat);
    return rc;
}

/* Parses "<0xHH>" the way the reference's ByteFallback decoder does; -1 when not a byte piece. */
static int byte_piece(const char *s) {
    size_t n = strlen(s);
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0, digits = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) break;
        v = v * 16 + d;
        digits++;
    }
    return digits ? v : -1;
}

static int parse_added(csd_tok *tok, const json_t *list, int32_t *max_id, csd_err *err) {
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list) || json_array_size(list) > CSD_TOK_MAX_ADDED)
        return csd_err_set(err, CSD_EFORMAT,
                           "tokenizer.json: added_tokens must be an array (<= %d)",
                           CSD_TOK_MAX_ADDED);
    size_t n = json_array_size(list);
    tok->added = csd_alloc_array(n ? n : 1, sizeof *tok->added);
    if (!tok->added) return csd_err_set(err, CSD_ENOMEM, "out of memory for added tokens");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(list, i);
        csd_tok_added *a = &tok->added[i];
        const char *content;
        if (!json_is_object(t) || get_str(t, "content", &content, "added_tokens[]", err) ||
            get_id(json_object_get(t, "id"), &a->id))
            return csd_err_set(err, CSD_EFORMAT,
                               "tokenizer.json: added_tokens[%zu] needs content and id", i);
        size_t cl = json_string_length(json_object_get(t, "content"));
        if (cl == 0)
            return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: added_tokens[%zu] is empty", i);
        if (get_bool(t, "special", false, &a->special, "added_tokens[]", err) ||
            get_bool(t, "lstrip", false, &a->lstrip, "added_tokens[]", err) ||
            get_bool(t, "rstrip", false, &a->rstrip, "added_tokens[]", err) ||
            get_bool(t, "normalized", !a->special, &a->normalized, "added_tokens[]", err))
            return CSD_EFORMAT;
        if (intern(tok, content, cl, &a->sym, err)) return CSD_EFORMAT;
        a->norm_sym = -1;
        if (a->id > *max_id) *max_id = a->id;
        tok->n_added++;
    }
    return 0;
}

/* ---- tokenizer_config.json ---- */
static const char *token_text(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    const json_t *c = json_object_get(v, "content"); /* older configs store AddedToken objects */
    return json_is_string(c) ? json_string_value(c) : NULL;
}

static int parse_config(csd_tok *tok, const char *cfg, size_t cfg_len, bool *explicit_flags,
                        bool *add_bos, bool *add_eos, csd_err *err) {
    *explicit_flags = *add_bos = *add_eos = false;
    const char *bos = NULL, *eos = NULL;
    json_t *root = NULL;
    int rc = 0;
    if (cfg) {
        if (cfg_len > CSD_TOK_MAX_FILE_BYTES)
            return csd_err_set(err, CSD_EFORMAT, "tokenizer_config.json is too large");
        json_error_t je;
        /* numbers are read as reals: configs hold ints too big for 64 bits (model_max_length) */
        root = json_loadb(cfg, cfg_len, JSON_DECODE_INT_AS_REAL, &je);
        if (!root || !json_is_object(root)) {
            json_decref(root);
            return csd_err_set(err, CSD_EFORMAT, "tokenizer_config.json: line %d: %.120s", je.line,
                               root ? "not an object" : je.text);
        }
        bos = token_text(json_object_get(root, "bos_token"));
        eos = token_text(json_object_get(root, "eos_token"));
        const json_t *ab = json_object_get(root, "add_bos_token");
        const json_t *ae = json_object_get(root, "add_eos_token");
        if (json_is_boolean(ab) || json_is_boolean(ae)) {
            *explicit_flags = true;
            *add_bos = json_is_true(ab);
            *add_eos = json_is_true(ae);
        }
        const json_t *ct = json_object_get(root, "chat_template");
        const char *tmpl = json_is_string(ct) ? json_string_value(ct) : NULL;
        for (size_t i = 0; !tmpl && json_is_array(ct) && i < json_array_size(ct); i++) {
            const json_t *e = json_array_get(ct, i);
            const json_t *name = json_object_get(e, "name");
            if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0 &&
                json_is_string(json_object_get(e, "template")))
                tmpl = json_string_value(json_object_get(e, "template"));
        }
        if (tmpl) rc = dup_str(tmpl, &tok->chat_template, err);
        const json_t *extra = json_object_get(root, "additional_special_tokens");
        for (size_t i = 0; !rc && json_is_array(extra) && i < json_array_size(extra); i++) {
            const char *s = token_text(json_array_get(extra, i));
            int32_t id = s ? csd_tok_find(tok, s) : -1;
            if (id >= 0) tok->id_flags[id] |= CSD_TOK_ID_SPECIAL;
        }
    }
    if (!rc) rc = dup_str(bos ? bos : "", &tok->bos_text, err);
    if (!rc) rc = dup_str(eos ? eos : "", &tok->eos_text, err);
    tok->bos = bos ? csd_tok_find(tok, bos) : -1;
    tok->eos = eos ? csd_tok_find(tok, eos) : -1;
    /* a token the config adds to every prompt must exist, or every prompt silently lacks it */
    if (!rc && *add_bos && bos && tok->bos < 0)
        rc = csd_err_set(err, CSD_EFORMAT,
                         "tokenizer_config.json: add_bos_token is true but bos_token '%.64s' is "
                         "not in the vocabulary",
                         bos);
    if (!rc && *add_eos && eos && tok->eos < 0)
        rc = csd_err_set(err, CSD_EFORMAT,
                         "tokenizer_config.json: add_eos_token is true but eos_token '%.64s' is "
                         "not in the vocabulary",
                         eos);
    json_decref(root);
    return rc;
}

static int build_ids(csd_tok *tok, const uint32_t *vsym, const int32_t *vid, size_t nv,
                     csd_err *err) {
    tok->id_sym = csd_alloc_array((size_t)tok->n_ids, sizeof *tok->id_sym);
    tok->id_flags = csd_alloc((size_t)tok->n_ids);
    tok->id_byte = csd_alloc((size_t)tok->n_ids);
    tok->sym_id = csd_alloc_array(tok->syms.n, sizeof *tok->sym_id);
    if (!tok->id_sym || !tok->id_flags || !tok->id_byte || !tok->sym_id)
        return csd_err_set(err, CSD_ENOMEM, "out of memory for %d ids", tok->n_ids);
    for (int32_t i = 0; i < tok->n_ids; i++) tok->id_sym[i] = -1;
    for (size_t i = 0; i < tok->syms.n; i++) tok->sym_id[i] = -1;
    for (size_t i = 0; i < nv; i++) {
        tok->id_sym[vid[i]] = (int32_t)vsym[i];
        tok->sym_id[vsym[i]] = vid[i];
    }
    tok->unk_id = -1;
    for (size_t i = 0; i < tok->n_added; i++) {
        const csd_tok_added *a = &tok->added[i];
        tok->id_sym[a->id] = (int32_t)a->sym;
        tok->sym_id[a->sym] = a->id;
        tok->id_flags[a->id] |= CSD_TOK_ID_ADDED | (a->special ? CSD_TOK_ID_SPECIAL : 0);
        /* the strips of the last token registered under the id */
        uint8_t strip = (a->lstrip ? CSD_TOK_ID_LSTRIP : 0) | (a->rstrip ? CSD_TOK_ID_RSTRIP : 0);
        tok->id_flags[a->id] &= (uint8_t)~(CSD_TOK_ID_LSTRIP | CSD_TOK_ID_RSTRIP);
        tok->id_flags[a->id] |= strip;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_ids[b] = csd_tok_find(tok, name);
    }
    for (int32_t i = 0; i < tok->n_ids; i++) {
        if (tok->id_sym[i] < 0) continue;
        int v = byte_piece(csd_tok_strtab_get(&tok->syms, (uint32_t)tok->id_sym[i]));
        if (v >= 0) {
            tok->id_flags[i] |= CSD_TOK_ID_BYTE;
            tok->id_byte[i] = (uint8_t)v;
        }
    }
    return 0;
}

static int normalize_added(csd_tok *tok, csd_err *err) {
    if (tok->n_norm == 0) return 0;
    for (size_t i = 0; i < tok->n_added; i++) {
        csd_tok_added *a = &tok->added[i];
        if (!a->normalized) continue;
        csd_tok_buf nb = {0};
        const char *c = csd_tok_strtab_get(&tok->syms, a->sym);
        int rc = csd_tok_normalize(tok, c, tok->syms.slen[a->sym], &nb);
        uint32_t s = 0;
        if (!rc) rc = intern(tok, nb.p ? nb.p : "", nb.len, &s, err);
        csd_tok_buf_free(&nb);
        if (rc) return csd_err_set(err, rc, "normalizing added token %zu", i);
        a->norm_sym = s;
        tok->any_normalized_added = true;
    }
    return 0;
}

int csd_tok_load_mem(csd_tok **out, const char *tokenizer_json, size_t len, const char *config_json,
                     size_t config_len, csd_err *err) {
    *out = NULL;
    if (!tokenizer_json || len > CSD_TOK_MAX_FILE_BYTES)
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json missing or larger than %u bytes",
                           CSD_TOK_MAX_FILE_BYTES);
    json_error_t je;
    json_t *root = json_loadb(tokenizer_json, len, 0, &je);
    if (!root)
        return csd_err_set(err, CSD_EFORMAT, "tokenizer.json: line %d column %d: %.160s", je.line,
                           je.column, je.text);
    uint32_t *vsym = NULL;
    int32_t *vid = NULL;
    size_t nv = 0;
    int rc = 0;
    csd_tok *tok = csd_alloc(sizeof *tok);
    if (!tok) {
        json_decref(root);
        return csd_err_set(err, CSD_ENOMEM, "out of memory");
    }
    tok->bos = tok->eos = tok->unk_id = -1;
    tok->gctx = pcre2_general_context_create(gc_malloc, gc_free, NULL);
    if (!tok->gctx) {
        rc = csd_err_set(err, CSD_ENOMEM, "pcre2 context");
        goto fail;
    }
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(root) || !json_is_object(model)) {
        rc = csd_err_set(err, CSD_EFORMAT, "tokenizer.json: no model object");
        goto fail;
    }
    const json_t *mtype = json_object_get(model, "type");
    if (json_is_string(mtype) ? strcmp(json_string_value(mtype), "BPE") != 0
                              : !json_object_get(model, "merges")) {
        rc = csd_err_set(err, CSD_EUNSUPPORTED,
                         "tokenizer.json: model type '%.32s' is not supported (BPE only)",
                         json_is_string(mtype) ? json_string_value(mtype) : "?");
        goto fail;
    }
    const json_t *cs = json_object_get(model, "continuing_subword_prefix");
    const json_t *ew = json_object_get(model, "end_of_word_suffix");
    if ((json_is_string(cs) && json_string_length(cs)) ||
        (json_is_string(ew) && json_string_length(ew))) {
        rc = csd_err_set(err, CSD_EUNSUPPORTED,
                         "tokenizer.json: subword prefixes/suffixes are not supported");
        goto fail;
    }
    int32_t max_id = -1;
    if ((rc = parse_vocab(tok, json_object_get(model, "vocab"), &vsym, &vid, &nv, &max_id, err)) ||
        (rc = parse_added(tok, json_object_get(root, "added_tokens"), &max_id, err)) ||
        (rc = parse_merges(tok, json_object_get(model, "merges"), err)) ||
        (rc = parse_normalizer(tok, json_object_get(root, "normalizer"), 0, err)) ||
        (rc = check_norm_growth(tok, err)) || (rc = normalize_added(tok, err)))
        goto fail;
    tok->n_ids = max_id + 1;
    if ((rc = build_ids(tok, vsym, vid, nv, err)) || (rc = csd_tok_build_added_tries(tok, err)))
        goto fail;
    if ((rc = get_bool(model, "byte_fallback", false, &tok->byte_fallback, "model", err)) ||
        (rc = get_bool(model, "fuse_unk", false, &tok->fuse_unk, "model", err)) ||
        (rc = get_bool(model, "ignore_merges", false, &tok->ignore_merges, "model", err)))
        goto fail;
    const json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) tok->unk_id = csd_tok_find(tok, json_string_value(unk));
    if ((rc = parse_pretok(tok, json_object_get(root, "pre_tokenizer"), 0, err)) ||
        (rc = parse_decoder(tok, json_object_get(root, "decoder"), err)) ||
        (rc = parse_post(tok, json_object_get(root, "post_processor"), 0, err)) ||
        (rc = csd_tok_check_pieces(tok, err)))
        goto fail;
    bool explicit_flags, add_bos, add_eos;
    if ((rc = parse_config(tok, config_json, config_len, &explicit_flags, &add_bos, &add_eos, err)))
        goto fail;
    if (explicit_flags) { /* LlamaTokenizer-style configs say it directly; they override the
                             template */
        tok->n_prefix = tok->n_suffix = 0;
        if (add_bos && tok->bos >= 0) tok->prefix[tok->n_prefix++] = tok->bos;
        if (add_eos && tok->eos >= 0) tok->suffix[tok->n_suffix++] = tok->eos;
    }
    if (tok->bos < 0 && tok->n_prefix > 0) tok->bos = tok->prefix[0];
    if (tok->eos < 0 && tok->n_suffix > 0) tok->eos = tok->suffix[tok->n_suffix - 1];
    if (tok->eos >= 0) tok->id_flags[tok->eos] |= CSD_TOK_ID_EOG;
    for (size_t i = 0; i < sizeof eog_names / sizeof eog_names[0]; i++) {
        int32_t id = csd_tok_find(tok, eog_names[i]);
        if (id >= 0 && (tok->id_flags[id] & (CSD_TOK_ID_ADDED | CSD_TOK_ID_SPECIAL)))
            tok->id_flags[id] |= CSD_TOK_ID_EOG;
    }
    csd_free(vsym);
    csd_free(vid);
    json_decref(root);
    CSD_LOGD("tokenizer loaded ids=%d merges=%zu added=%zu pre=%zu norm=%zu", tok->n_ids,
             tok->merges.n, tok->n_added, tok->n_pre, tok->n_norm);
    *out = tok;
    return 0;
fail:
    csd_free(vsym);
    csd_free(vid);
    json_decref(root);
    csd_tok_destroy(tok);
    return rc ? rc : CSD_EFORMAT;
}

/* Marks the ids of generation_config.json's eos_token_id (an int or a list) as end-of-generation.
 */
static void load_generation_config(csd_tok *tok, const char *dir) {
    char path[4096];
    char *buf = NULL;
    size_t len = 0;
    if (csd_path_join(path, sizeof path, dir, "generation_config.json") || !csd_file_exists(path) ||
        csd_file_read_all(path, 1u << 20, &buf, &len, NULL))
        return;
    json_t *root = json_loadb(buf, len, 0, NULL);
    const json_t *e = json_object_get(root, "eos_token_id");
    for (size_t i = 0; i < (json_is_array(e) ? json_array_size(e) : 1); i++) {
        const json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
        int32_t id;
        if (v && !get_id(v, &id) && id < tok->n_ids) tok->id_flags[id] |= CSD_TOK_ID_EOG;
    }
    json_decref(root);
    csd_free(buf);
}

/* transformers >= 4.50 saves the chat template as chat_template.jinja beside the tokenizer
 * instead of inside tokenizer_config.json; when both are there the file wins, as it does in
 * transformers. A NUL byte would cut the template short: refused. */
#define CHAT_TEMPLATE_FILE "chat_template.jinja"
#define CHAT_TEMPLATE_MAX_BYTES (4u << 20)

static int load_chat_template_file(csd_tok *tok, const char *dir, csd_err *err) {
    char path[4096];
    if (csd_path_join(path, sizeof path, dir, CHAT_TEMPLATE_FILE) || !csd_file_exists(path))
        return 0;
    char *text = NULL;
    size_t len = 0;
    int rc = csd_file_read_all(path, CHAT_TEMPLATE_MAX_BYTES, &text, &len, err);
    if (rc) return rc;
    if (memchr(text, '\0', len)) {
        csd_free(text);
        return csd_err_set(err, CSD_EFORMAT, "%s holds a NUL byte", CHAT_TEMPLATE_FILE);
    }
    csd_free(tok->chat_template);
    tok->chat_template = text; /* csd_file_read_all ends it with a NUL */
    return 0;
}

int csd_tok_load(csd_tok **out, const char *dir, csd_err *err) {
    char path[4096];
    char *tj = NULL, *cj = NULL;
    size_t tl = 0, cl = 0;
    *out = NULL;
    if (csd_path_join(path, sizeof path, dir, "tokenizer.json"))
        return csd_err_set(err, CSD_ERANGE, "path too long: %.200s", dir);
    int rc = csd_file_read_all(path, CSD_TOK_MAX_FILE_BYTES, &tj, &tl, err);
    if (rc) return rc;
    if (csd_path_join(path, sizeof path, dir, "tokenizer_config.json") == 0 &&
        csd_file_exists(path)) {
        rc = csd_file_read_all(path, CSD_TOK_MAX_FILE_BYTES, &cj, &cl, err);
        if (rc) {
            csd_free(tj);
            return rc;
        }
    }
    rc = csd_tok_load_mem(out, tj, tl, cj, cl, err);
    if (!rc) rc = load_chat_template_file(*out, dir, err);
    if (rc) {
        csd_tok_destroy(*out);
        *out = NULL;
        csd_err_prefix(err, "%.200s: ", dir);
    } else {
        load_generation_config(*out, dir);
    }
    csd_free(tj);
    csd_free(cj);
    return rc;
}

void csd_tok_destroy(csd_tok *tok) {
    if (!tok) return;
    for (size_t i = 0; i < tok->n_norm; i++) {
        csd_free(tok->norm[i].a);
        csd_free(tok->norm[i].b);
    }
    for (size_t i = 0; i < tok->n_pre; i++) {
        if (tok->pre[i].code) csd_tok_regex_free(tok->pre[i].code);
        csd_free(tok->pre[i].replacement);
    }
    /* a step being parsed when loading failed may hold a compiled regex not yet counted */
    if (tok->n_pre < CSD_TOK_MAX_STEPS) {
        if (tok->pre[tok->n_pre].code) csd_tok_regex_free(tok->pre[tok->n_pre].code);
        csd_free(tok->pre[tok->n_pre].replacement);
    }
    if (tok->n_norm < CSD_TOK_MAX_STEPS) {
        csd_free(tok->norm[tok->n_norm].a);
        csd_free(tok->norm[tok->n_norm].b);
    }
    if (tok->gctx) pcre2_general_context_free(tok->gctx);
    csd_tok_strtab_free(&tok->syms);
    csd_tok_pairmap_free(&tok->merges);
    csd_free(tok->sym_id);
    csd_free(tok->id_sym);
    csd_free(tok->id_flags);
    csd_free(tok->id_byte);
    csd_tok_free_added_index(tok);
    csd_free(tok->added);
    csd_free(tok->dec_from);
    csd_free(tok->dec_to);
    csd_free(tok->bos_text);
    csd_free(tok->eos_text);
    csd_free(tok->chat_template);
    csd_free(tok);
}
