/* test_tok_load: tokenizer.json parsing from memory: both merge formats, added tokens with
 * lstrip/rstrip, template BOS/EOS vs config flags, and malformed or unsupported files refused with
 * a clean error (code + message, nothing leaked; run under ASan in CI), including a token too long
 * for the detokenizer's buffer and an added BOS the vocabulary lacks; a directory's
 * chat_template.jinja (transformers >= 4.50) wins over tokenizer_config.json's template. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "core/alloc.h"
#include "core/file_map.h"
#include "test_util.h"
#include "tok/tokenizer.h"

/* A tiny SentencePiece-style tokenizer; MERGES is spliced in. */
#define TINY(MERGES, ADDED, EXTRA)                                                              \
    "{\"added_tokens\": [" ADDED "], " EXTRA                                                    \
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "       \
    "\"prepend\": \"_\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "           \
    "\"content\": \"_\"}]}, \"pre_tokenizer\": null, \"decoder\": {\"type\": \"Sequence\", "    \
    "\"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"_\"}, \"content\": \" " \
    "\"}, "                                                                                     \
    "{\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": "  \
    "0}]}, "                                                                                    \
    "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "       \
    "\"<s>\": 1, \"_\": 2, \"a\": 3, \"b\": 4, \"ab\": 5, \"_ab\": 6, \"<X>\": 7}, "            \
    "\"merges\": " MERGES "}}"

#define SPECIALS                                                                                 \
    "{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, \"content\": \"<s>\", " \
    "\"special\": true}"

/* Fields of an added token: matched before normalizing; special. */
#define RAW "\"normalized\": false"
#define SP "\"special\": true, "

static csd_tok *load_ok(const char *json, const char *cfg) {
    csd_tok *tok = NULL;
    csd_err err = {0};
    int rc = csd_tok_load_mem(&tok, json, strlen(json), cfg, cfg ? strlen(cfg) : 0, &err);
    if (rc) printf("unexpected failure: %s\n", err.msg);
    assert_int_equal(rc, 0);
    return tok;
}

static void encode_expect(const csd_tok *tok, const char *s, bool add, const int32_t *want,
                          size_t n) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(csd_tok_encode(tok, s, strlen(s), add, true, &ids, &n_ids, NULL), 0);
    assert_int_equal(n_ids, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    csd_free(ids);
}

static void both_merge_formats(void **state) {
    (void)state;
    const char *forms[] = {TINY("[\"a b\", \"_ ab\"]", SPECIALS, ""),
                           TINY("[[\"a\", \"b\"], [\"_\", \"ab\"]]", SPECIALS, "")};
    for (int f = 0; f < 2; f++) {
        csd_tok *tok = load_ok(forms[f], NULL);
        const int32_t want[] = {6, 6, 2, 3}; /* "_ab" "_ab" "_" "a" */
        encode_expect(tok, "ab ab a", false, want, 4);
        char *text = NULL;
        assert_int_equal(csd_tok_decode(tok, want, 4, false, &text, NULL), 0);
        assert_string_equal(text, "ab ab a");
        csd_free(text);
        /* "c" is unknown, there is no byte fallback: unk (runs of unk fuse only with fuse_unk) */
        const int32_t unk[] = {2, 0, 0};
        encode_expect(tok, "cc", false, unk, 3);
        csd_tok_destroy(tok);
    }
}

static void bos_rules(void **state) {
    (void)state;
    const char *tmpl = "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
                       "[{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": "
                       "{\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": "
                       "\"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},";
    char json[4096];
    snprintf(json, sizeof json, "%s", TINY("[\"a b\", \"_ ab\"]", SPECIALS, "%s"));
    char full[4096];
    snprintf(full, sizeof full, json, tmpl);
    csd_tok *tok = load_ok(full, NULL); /* the template adds <s> */
    const int32_t with[] = {1, 6}, without[] = {6};
    encode_expect(tok, "ab", true, with, 2);
    encode_expect(tok, "ab", false, without, 1);
    assert_int_equal(csd_tok_bos(tok), 1);
    csd_tok_destroy(tok);
    /* explicit config flags win (as LlamaTokenizer does): no BOS, but EOS "<X>" */
    tok = load_ok(full, "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"<X>\"}, "
                        "\"add_bos_token\": false, \"add_eos_token\": true, \"model_max_length\": "
                        "1000000000000000019884624838656, \"chat_template\": \"{{ x }}\"}");
    const int32_t eos[] = {6, 7};
    encode_expect(tok, "ab", true, eos, 2);
    assert_int_equal(csd_tok_eos(tok), 7);
    assert_true(csd_tok_is_eog(tok, 7));
    assert_string_equal(csd_tok_eos_text(tok), "<X>");
    assert_string_equal(csd_tok_chat_template(tok), "{{ x }}");
    csd_tok_destroy(tok);
}

static void added_tokens_strip(void **state) {
    (void)state;
    /* <X> strips spaces on its left only; <s> is special (not matched with parse_special off) */
    const char *json = TINY("[\"a b\", \"_ ab\"]",
                            SPECIALS ", {\"id\": 7, \"content\": \"<X>\", "
                                     "\"lstrip\": true, \"normalized\": false}",
                            "");
    csd_tok *tok = load_ok(json, NULL);
    const int32_t want[] = {6, 7, 2, 2, 3}; /* as the reference: " a" is normalized to "__a" */
    encode_expect(tok, "ab   <X> a", false, want, 5);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(csd_tok_encode(tok, "<s>", 3, false, false, &ids, &n, NULL), 0);
    assert_true(n > 1); /* read as text: "_", "<", "s", ">" pieces (unknown -> unk) */
    csd_free(ids);
    assert_false(csd_tok_is_special(tok, 7));
    assert_true(csd_tok_is_special(tok, 1));
    csd_tok_destroy(tok);
}

/* Added tokens that are prefixes of each other: the longest usable one wins at each place (a
 * special one only with parse_special), and a string registered twice takes the last id. */
static void added_tokens_longest(void **state) {
    (void)state;
    const char *json = TINY("[]",
                            SPECIALS ", {\"id\": 8, \"content\": \"<a\", " SP RAW "}, "
                                     "{\"id\": 9, \"content\": \"<ab\", " RAW "}, "
                                     "{\"id\": 10, \"content\": \"<abb\", " SP RAW "}, "
                                     "{\"id\": 11, \"content\": \"b<\", " RAW "}, "
                                     "{\"id\": 12, \"content\": \"b<\", " RAW "}",
                            "");
    csd_tok *tok = load_ok(json, NULL);
    /* as the reference: <abb, b< (id 12), "_a" "b" as text, b< again, then "_a" "b" */
    const int32_t with_special[] = {10, 12, 2, 3, 12, 2, 3, 4};
    encode_expect(tok, "<abbb<ab<ab", false, with_special, 8);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(csd_tok_encode(tok, "<abbb<ab", 8, false, false, &ids, &n, NULL), 0);
    const int32_t plain[] = {9, 2, 4, 12, 2, 3, 4}; /* <ab (the special <abb unused), "_b", ... */
    assert_int_equal(n, 7);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], plain[i]);
    csd_free(ids);
    csd_tok_destroy(tok);
}

/* A strip that trims an added token next to it leaves text, read as text (as the reference):
 * "a " loses its space to the lstrip of "b", "a" is text; " b" loses its to the rstrip of "a". */
static void strip_trims_added_neighbour(void **state) {
    (void)state;
    const char *lstrip = TINY("[]",
                              SPECIALS ", {\"id\": 8, \"content\": \"a \", " RAW "}, "
                                       "{\"id\": 9, \"content\": \"b\", \"lstrip\": true, "
                                       RAW "}",
                              "");
    csd_tok *tok = load_ok(lstrip, NULL);
    encode_expect(tok, "a b", false, (const int32_t[]){2, 3, 9}, 3);
    encode_expect(tok, "ab a  b", false, (const int32_t[]){2, 3, 9, 2, 2, 8, 9}, 7);
    csd_tok_destroy(tok);
    const char *rstrip = TINY("[]",
                              SPECIALS ", {\"id\": 8, \"content\": \"a\", \"rstrip\": true, "
                                       RAW "}, "
                                       "{\"id\": 9, \"content\": \" b\", " RAW "}",
                              "");
    tok = load_ok(rstrip, NULL);
    encode_expect(tok, "a b", false, (const int32_t[]){8, 2, 4}, 3);
    encode_expect(tok, "ab a  b", false, (const int32_t[]){8, 2, 4, 2, 8, 9}, 6);
    csd_tok_destroy(tok);
    /* " b" trimmed to "b" is the added token "b", whose own rstrip then trims after it */
    const char *chain = TINY("[]",
                             SPECIALS ", {\"id\": 8, \"content\": \"a\", \"rstrip\": true, "
                                      RAW "}, {\"id\": 9, \"content\": \" b\", " RAW "}, "
                                      "{\"id\": 10, \"content\": \"b\", \"rstrip\": true, "
                                      RAW "}",
                             "");
    tok = load_ok(chain, NULL);
    encode_expect(tok, "a b a", false, (const int32_t[]){8, 10, 8}, 3);
    encode_expect(tok, "a  b  a", false, (const int32_t[]){8, 9, 2, 2, 2, 8}, 6);
    csd_tok_destroy(tok);
}

/* (?i:...) folds ASCII only, as the reference does, and leaves \p{...} names alone */
static void regex_case_folding(void **state) {
    (void)state;
    const char *json =
        "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
        "\"pattern\": {\"Regex\": \"(?i:'s|\\\\p{Lu}x)|\\\\p{L}+\"}, \"behavior\": \"Isolated\"}, "
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}, "
        "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
        "{\"'\": 0, \"S\": 1, \"s\": 2, \"'S\": 3, \"\u00c5\": 4, \"\u00bf\": 5, \"'\u00c5\": 6, "
        "\"A\": 7, \"X\": 8, \"AX\": 9}, \"merges\": [[\"'\", \"S\"], [\"'\", \"\u00c5\"], [\"A\", "
        "\"X\"]]}}";
    csd_tok *tok = load_ok(json, NULL);
    const int32_t folded[] = {3};
    encode_expect(tok, "'S", false, folded, 1);
    /* U+017F (long s) is not folded to s: "'" and "\u017f" are separate pieces */
    const int32_t longs[] = {0, 4, 5};
    encode_expect(tok, "'\xC5\xBF", false, longs, 3);
    const int32_t ax[] = {9};
    encode_expect(tok, "AX", false, ax, 1);
    char *text = NULL;
    assert_int_equal(csd_tok_decode(tok, longs, 3, false, &text, NULL), 0);
    assert_string_equal(text, "'\xC5\xBF");
    csd_free(text);
    csd_tok_destroy(tok);
}

/* Metaspace pre-tokenizer (prepend_scheme "first": only the first section gets "_") and decoder;
 * expected ids and texts are the reference's */
static void metaspace(void **state) {
    (void)state;
    const char *json =
        "{\"added_tokens\": [" SPECIALS "], \"pre_tokenizer\": {\"type\": \"Metaspace\", "
        "\"replacement\": \"_\", \"prepend_scheme\": \"first\", \"split\": false}, \"decoder\": "
        "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"first\"}, "
        "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "
        "\"<s>\": 1, \"_\": 2, \"a\": 3, \"b\": 4, \"ab\": 5, \"_ab\": 6}, \"merges\": [\"a b\", "
        "\"_ ab\"]}}";
    csd_tok *tok = load_ok(json, NULL);
    const char *in[] = {"ab ab", "<s>ab ab", " ab", "ab<s>ab"};
    const int32_t want[4][3] = {{6, 6}, {1, 5, 6}, {6}, {6, 1, 5}};
    const size_t nwant[] = {2, 3, 1, 3};
    const char *text[] = {"ab ab", "<s>ab ab", "ab", "ab<s>ab"};
    for (int i = 0; i < 4; i++) {
        encode_expect(tok, in[i], false, want[i], nwant[i]);
        char *out = NULL;
        assert_int_equal(csd_tok_decode(tok, want[i], nwant[i], false, &out, NULL), 0);
        assert_string_equal(out, text[i]);
        csd_free(out);
    }
    csd_tok_destroy(tok);
}

static void expect_refused(const char *json, int code, const char *needle) {
    csd_tok *tok = (csd_tok *)1;
    csd_err err = {0};
    int rc = csd_tok_load_mem(&tok, json, strlen(json), NULL, 0, &err);
    if (rc != code || !strstr(err.msg, needle))
        printf("input %.80s: rc %d msg '%s' (want %d, '%s')\n", json, rc, err.msg, code, needle);
    assert_int_equal(rc, code);
    assert_null(tok);
    assert_non_null(strstr(err.msg, needle));
}

static void malformed_refused(void **state) {
    (void)state;
    expect_refused("", CSD_EFORMAT, "tokenizer.json");
    expect_refused("{", CSD_EFORMAT, "line");
    expect_refused("[]", CSD_EFORMAT, "no model");
    expect_refused("{\"model\": {}}", CSD_EUNSUPPORTED, "BPE");
    expect_refused("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", CSD_EUNSUPPORTED,
                   "Unigram");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
                   CSD_EFORMAT, "bad id");
    expect_refused(
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999999}, \"merges\": []}}",
        CSD_EFORMAT, "bad id");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}}",
                   CSD_EFORMAT, "merge 0");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": {}}}",
                   CSD_EFORMAT, "merges");
    expect_refused(
        "{\"added_tokens\": [{\"id\": 1}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
        "\"merges\": []}}",
        CSD_EFORMAT, "added_tokens[0]");
    expect_refused(
        "{\"normalizer\": {\"type\": \"NFKD\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
        "{\"a\": 0}, \"merges\": []}}",
        CSD_EUNSUPPORTED, "NFKD");
    expect_refused("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}, "
                   "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                   CSD_EFORMAT, "regex");
    expect_refused("{\"decoder\": {\"type\": \"CTC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
                   "{\"a\": 0}, \"merges\": []}}",
                   CSD_EUNSUPPORTED, "CTC");
    /* a real file cut in half */
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", CSD_STORIES_DIR);
    struct stat st;
    if (stat(path, &st) == 0) {
        char *buf = NULL;
        size_t len = 0;
        assert_int_equal(csd_file_read_all(path, 1 << 24, &buf, &len, NULL), 0);
        buf[len / 2] = '\0';
        expect_refused(buf, CSD_EFORMAT, "line");
        csd_free(buf);
    }
    /* a config that is not an object */
    csd_tok *tok = NULL;
    csd_err err = {0};
    const char *json = TINY("[]", SPECIALS, "");
    assert_int_equal(csd_tok_load_mem(&tok, json, strlen(json), "[1]", 3, &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "tokenizer_config.json"));
    assert_null(tok);
    /* a directory without tokenizer.json */
    assert_int_not_equal(csd_tok_load(&tok, "/nonexistent-dir", &err), 0);
    assert_null(tok);
    csd_tok_destroy(NULL);
}

/* The tiny tokenizer with an added token (id 8) of n copies of 'Y'; the caller frees it. */
static char *with_long_token(size_t n) {
    char *y = csd_alloc(n + 1), *json = csd_alloc(n + 4096);
    assert_non_null(y);
    assert_non_null(json);
    memset(y, 'Y', n);
    y[n] = '\0';
    snprintf(json, n + 4096, TINY("[]", SPECIALS ", {\"id\": 8, \"content\": \"%s\"}", ""), y);
    csd_free(y);
    return json;
}

/* A token's text always fits the detokenizer's buffer (CSD_DETOK_PIECE_MAX), so a stream never
 * drops one: a 4000-byte token decodes whole, a tokenizer with one of 5000 bytes is refused. */
static void long_tokens_bounded(void **state) {
    (void)state;
    char *json = with_long_token(4000);
    csd_tok *tok = load_ok(json, NULL);
    csd_detok d;
    csd_detok_init(&d, tok, true);
    static char piece[CSD_DETOK_PIECE_MAX];
    size_t n = 0;
    assert_int_equal(csd_detok_push(&d, 3, piece, sizeof piece, &n), 0); /* "a" first */
    assert_int_equal(csd_detok_push(&d, 8, piece, sizeof piece, &n), 0);
    assert_int_equal(n, 4000);
    assert_int_equal(strspn(piece, "Y"), 4000);
    csd_tok_destroy(tok);
    csd_free(json);
    json = with_long_token(5000);
    expect_refused(json, CSD_EUNSUPPORTED, "token 8 decodes to more than");
    csd_free(json);
}

/* A config that adds a BOS (or EOS) to every prompt must name a token the vocabulary has; a
 * config with a NUL in a string (a chat template cut short) is refused. */
static void added_bos_must_exist(void **state) {
    (void)state;
    const char *json = TINY("[]", SPECIALS, "");
    const char *cfgs[] = {"{\"bos_token\": \"<bos>\", \"add_bos_token\": true}",
                          "{\"eos_token\": \"</e>\", \"add_eos_token\": true}",
                          /* a NUL (which would cut the template short) is refused by the parser */
                          "{\"chat_template\": \"{{ a }}\\u0000{{ b }}\"}"};
    const char *want[] = {"bos_token '<bos>' is not in the vocabulary",
                          "eos_token '</e>' is not in the vocabulary",
                          "tokenizer_config.json: line 1: \\u0000 is not allowed"};
    for (int i = 0; i < 3; i++) {
        csd_tok *tok = NULL;
        csd_err err = {0};
        assert_int_equal(csd_tok_load_mem(&tok, json, strlen(json), cfgs[i], strlen(cfgs[i]),
                                          &err),
                         CSD_EFORMAT);
        assert_null(tok);
        if (!strstr(err.msg, want[i])) fail_msg("message '%s' lacks '%s'", err.msg, want[i]);
    }
    /* not added: a name the vocabulary lacks is only unused */
    csd_tok_destroy(load_ok(json, "{\"bos_token\": \"<bos>\", \"add_bos_token\": false}"));
}

/* A tokenizer whose normalizer is a Sequence of NORMS. */
#define NORM_TOK(NORMS)                                                                    \
    "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [" NORMS "]}, "            \
    "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"x\": 1}, \"merges\": []}}"
#define REPLACE_SPACE(CONTENT)                                                             \
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" CONTENT "\"}"
#define X64 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"

/* Normalizers run on every text encoded: a chain that lengthens text more than 64-fold (a Replace
 * whose content holds its pattern, repeated, grows it exponentially) is refused at load. */
static void normalizer_growth_bounded(void **state) {
    (void)state;
    /* one space becomes 64 bytes: the most allowed, and it encodes */
    csd_tok *tok = load_ok(NORM_TOK(REPLACE_SPACE(X64)), NULL);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(csd_tok_encode(tok, "a a", 3, false, true, &ids, &n, NULL), 0);
    assert_int_equal(n, 66); /* a, 64 x, a */
    csd_free(ids);
    csd_tok_destroy(tok);
    /* NFC after it can triple that */
    expect_refused(NORM_TOK(REPLACE_SPACE(X64) ", {\"type\": \"NFC\"}"), CSD_EUNSUPPORTED,
                   "normalizers 1-2 can lengthen a text 192-fold");
    /* a space becomes 9 bytes with 4 spaces in them, twice: 81-fold */
    expect_refused(NORM_TOK(REPLACE_SPACE("a a a a a") ", " REPLACE_SPACE("a a a a a")),
                   CSD_EUNSUPPORTED, "81-fold");
    expect_refused(NORM_TOK(REPLACE_SPACE(X64 "x")), CSD_EUNSUPPORTED, "65-fold");
    /* a Prepend goes before every section between added tokens: 16 bytes at most */
#define X16 "xxxxxxxxxxxxxxxx"
    tok = load_ok(NORM_TOK("{\"type\": \"Prepend\", \"prepend\": \"" X16 "\"}"), NULL);
    csd_tok_destroy(tok);
    expect_refused(NORM_TOK("{\"type\": \"Prepend\", \"prepend\": \"" X16 "x\"}"),
                   CSD_EUNSUPPORTED, "Prepend of 17 bytes (at most 16)");
}

/* A post-processor template naming an id that no token has (a hole below the largest id) is
 * refused: every prompt would carry an id nothing can decode. */
static void template_id_must_exist(void **state) {
    (void)state;
    const char *post =
        "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
        "{\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
        "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [%d], \"tokens\": [\"<s>\"]}}}, ";
    char extra[1024], json[4096];
    snprintf(extra, sizeof extra, post, 1);
    snprintf(json, sizeof json, TINY("[]", SPECIALS ", {\"id\": 20, \"content\": \"<Z>\"}", "%s"),
             extra);
    csd_tok_destroy(load_ok(json, NULL));
    snprintf(extra, sizeof extra, post, 15); /* ids 9 to 19 are holes */
    snprintf(json, sizeof json, TINY("[]", SPECIALS ", {\"id\": 20, \"content\": \"<Z>\"}", "%s"),
             extra);
    expect_refused(json, CSD_EFORMAT, "bad template token '<s>'");
}

/* Added tokens longer than the trie's depth (256 bytes) are compared whole, and the longest match
 * still wins over the trie's ones (ids as the reference gives them); more than 64 such tokens are
 * refused. */
static void long_added_tokens(void **state) {
    (void)state;
    char a300[301], a200b[202], a300b[302];
    memset(a300, 'a', 300);
    a300[300] = '\0';
    memset(a200b, 'a', 200);
    strcpy(a200b + 200, "b");
    memset(a300b, 'a', 300);
    strcpy(a300b + 300, "b");
    static char json[8192];
    snprintf(json, sizeof json,
             TINY("[]", SPECIALS ", {\"id\": 8, \"content\": \"%s\", " RAW "}, "
                                 "{\"id\": 9, \"content\": \"%s\", " RAW "}, "
                                 "{\"id\": 10, \"content\": \"%s\", " SP RAW "}",
                  ""),
             a300, a200b, a300b);
    csd_tok *tok = load_ok(json, NULL);
    static char text[1200];
    snprintf(text, sizeof text, "%sa%s%s%s", a300b, a200b, a300, a300);
    encode_expect(tok, text, false, (const int32_t[]){10, 2, 3, 9, 8, 8}, 6);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(csd_tok_encode(tok, text, strlen(text), false, false, &ids, &n, NULL), 0);
    const int32_t plain[] = {8, 2, 4, 3, 9, 8, 8}; /* the special a300b unused */
    assert_int_equal(n, 7);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], plain[i]);
    csd_free(ids);
    csd_tok_destroy(tok);
    /* 65 of them */
    static char many[65 * 400 + 4096], added[65 * 400];
    size_t at = 0;
    for (int k = 0; k < 65; k++)
        at += (size_t)snprintf(added + at, sizeof added - at,
                               ", {\"id\": %d, \"content\": \"%.*sb%d\", " RAW "}", 8 + k, 300,
                               a300, k);
    snprintf(many, sizeof many, TINY("[]", SPECIALS "%s", ""), added);
    expect_refused(many, CSD_EUNSUPPORTED, "at most 64 longer than 256 bytes");
}

/* Writes text (len bytes) to dir/name. */
static void put_file(const char *dir, const char *name, const char *text, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(csd_file_write_all(path, text, len, NULL), 0);
}

static void chat_template_file(void **state) {
    (void)state;
    char dir[256];
    assert_int_equal(csd_test_make_tmpdir(dir, sizeof dir, "csd-tok-tmpl"), 0);
    const char *json = TINY("[]", SPECIALS, "");
    const char *cfg = "{\"chat_template\": \"from the config\"}";
    put_file(dir, "tokenizer.json", json, strlen(json));
    put_file(dir, "tokenizer_config.json", cfg, strlen(cfg));
    csd_tok *tok = NULL;
    csd_err err = {0};
    assert_int_equal(csd_tok_load(&tok, dir, &err), 0);
    assert_string_equal(csd_tok_chat_template(tok), "from the config");
    csd_tok_destroy(tok);
    put_file(dir, "chat_template.jinja", "{{ messages }} from the file\n", 29);
    assert_int_equal(csd_tok_load(&tok, dir, &err), 0);
    assert_string_equal(csd_tok_chat_template(tok), "{{ messages }} from the file\n");
    csd_tok_destroy(tok);
    put_file(dir, "chat_template.jinja", "a\0b", 3); /* would be cut at the NUL: refused */
    assert_int_equal(csd_tok_load(&tok, dir, &err), CSD_EFORMAT);
    assert_non_null(strstr(err.msg, "chat_template.jinja holds a NUL byte"));
    assert_null(tok);
    assert_int_equal(csd_test_remove_tree(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(both_merge_formats), cmocka_unit_test(bos_rules),
        cmocka_unit_test(added_tokens_strip), cmocka_unit_test(regex_case_folding),
        cmocka_unit_test(metaspace),
        cmocka_unit_test(malformed_refused), cmocka_unit_test(normalizer_growth_bounded),
        cmocka_unit_test(long_tokens_bounded), cmocka_unit_test(added_bos_must_exist),
        cmocka_unit_test(template_id_must_exist), cmocka_unit_test(added_tokens_longest),
        cmocka_unit_test(strip_trims_added_neighbour), cmocka_unit_test(long_added_tokens),
        cmocka_unit_test(chat_template_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
