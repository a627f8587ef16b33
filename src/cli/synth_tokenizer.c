/* synth_tokenizer: the tokenizer `cascadia synth` writes when no --tokenizer is given, so the
 * built-in demo needs no file from anywhere: SentencePiece-style BPE with byte fallback (every
 * byte string encodes), the 94 printable ASCII characters, and merges that spell a list of common
 * English words. The model's weights are random, so this only has to round-trip text. */
#include "synth_tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

static const char *const common_words[] = {
    "the", "and", "was", "to", "a", "of", "in", "he", "she", "it", "they", "with", "on", "for",
    "that", "his", "her", "had", "said", "one", "day", "little", "big", "time", "once", "upon",
    "there", "play", "friend", "happy", "saw", "went", "wanted", "very", "fleet", "stage", "token",
    "model", "worker", "cascadia", "hello", "world", "is", "are", "be", "this", "from", "at", NULL};

static int add_piece(json_t *vocab, const char *piece, int *next_id) {
    if (json_object_get(vocab, piece)) return 0;
    return json_object_set_new(vocab, piece, json_integer((*next_id)++));
}

/* Adds the merges that build "▁word" left to right, and every prefix as a token. */
static int add_word(json_t *vocab, json_t *merges, const char *word, int *next_id) {
    char prefix[64] = "\xe2\x96\x81"; /* ▁ */
    size_t len = strlen(prefix);
    for (const char *c = word; *c && len + 2 < sizeof prefix; c++) {
        char right[2] = {*c, 0};
        char merge[80];
        snprintf(merge, sizeof merge, "%s %s", prefix, right);
        prefix[len++] = *c;
        prefix[len] = 0;
        if (json_object_get(vocab, prefix)) continue;
        if (json_array_append_new(merges, json_string(merge)) || add_piece(vocab, prefix, next_id))
            return -1;
    }
    return 0;
}

static json_t *special(int id, const char *content) {
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

static json_t *build_tokenizer(int *vocab_size) {
    json_t *vocab = json_object(), *merges = json_array();
    int next = 0;
    const char *specials[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) add_piece(vocab, specials[i], &next);
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        add_piece(vocab, piece, &next);
    }
    add_piece(vocab, "\xe2\x96\x81", &next);
    for (char c = 33; c < 127; c++) {
        char piece[2] = {c, 0};
        add_piece(vocab, piece, &next);
    }
    for (int i = 0; common_words[i]; i++) add_word(vocab, merges, common_words[i], &next);
    *vocab_size = next;
    json_t *added = json_array();
    for (int i = 0; i < 3; i++) json_array_append_new(added, special(i, specials[i]));
    return json_pack(
        "{s:s, s:n, s:n, s:o, s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n,"
        " s:{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[], s:{s:{s:s, s:[i], s:[s]}}},"
        " s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]},"
        " s:{s:s, s:n, s:s, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type",
        "Sequence", "normalizers", "type", "Prepend", "prepend", "\xe2\x96\x81", "type", "Replace",
        "pattern", "String", " ", "content", "\xe2\x96\x81", "pre_tokenizer", "post_processor",
        "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>", "type_id", 0,
        "Sequence", "id", "A", "type_id", 0, "pair", "special_tokens", "<s>", "id", "<s>", "ids", 1,
        "tokens", "<s>", "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern",
        "String", "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse", "type",
        "Strip", "content", " ", "start", 1, "stop", 0, "model", "type", "BPE", "dropout",
        "unk_token", "<unk>", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 1,
        "byte_fallback", 1, "ignore_merges", 0, "vocab", vocab, "merges", merges);
}

int csd_synth_tokenizer_json(char **tokenizer_json, char **config_json, csd_err *err) {
    *tokenizer_json = *config_json = NULL;
    int vocab_size = 0;
    json_t *tok = build_tokenizer(&vocab_size);
    json_t *cfg =
        json_pack("{s:b, s:b, s:s, s:s, s:s, s:i, s:s}", "add_bos_token", 1, "add_eos_token", 0,
                  "bos_token", "<s>", "eos_token", "</s>", "unk_token", "<unk>", "model_max_length",
                  2048, "tokenizer_class", "LlamaTokenizer");
    char *t = tok ? json_dumps(tok, JSON_COMPACT) : NULL;
    char *c = cfg ? json_dumps(cfg, JSON_INDENT(2)) : NULL;
    json_decref(tok);
    json_decref(cfg);
    if (!t || !c) {
        free(t);
        free(c);
        return csd_err_set(err, CSD_ENOMEM, "built-in tokenizer");
    }
    *tokenizer_json = csd_strdup(t);
    *config_json = csd_strdup(c);
    free(t);
    free(c);
    if (!*tokenizer_json || !*config_json) {
        csd_free(*tokenizer_json);
        csd_free(*config_json);
        return csd_err_set(err, CSD_ENOMEM, "built-in tokenizer");
    }
    return 0;
}
