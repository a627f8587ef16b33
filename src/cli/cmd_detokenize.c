/* cmd_detokenize: `cascadia detokenize DIR`: token ids on stdin (space, comma or newline separated)
 * -> text on stdout. --batch decodes one line of ids per line and prints base64 of each text (used
 * by tests/e2e_tok_parity.sh). Ids are validated: a non-number or an out-of-range id is an error.
 */
#include "cli/commands.h"

#include <stdio.h>
#include <string.h>

#include "cli/cli_stdin.h"
#include "core/alloc.h"
#include "tok/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: cascadia detokenize DIR [--skip-special] [--batch]\n"
               "  Reads token ids (separated by spaces, commas or newlines) on stdin and prints "
               "the text.\n"
               "  DIR             a model or tokenizer directory (tokenizer.json [+ "
               "tokenizer_config.json])\n"
               "  --skip-special  leave special tokens (BOS, EOS, ...) out of the text\n"
               "  --batch         one sequence of ids per line; print base64 of each text on its "
               "own line\n");
}

/* Parses the ids of s[0..n); returns 0, or -1 with a message naming the bad item. */
static int parse_ids(const char *s, size_t n, int32_t vocab, int32_t *ids, size_t *n_ids) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t') {
            i++;
            continue;
        }
        if (c < '0' || c > '9') {
            fprintf(stderr, "detokenize: '%c' at byte %zu is not part of an id\n", c, i);
            return -1;
        }
        long long v = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            v = v * 10 + (s[i++] - '0');
            if (v >= vocab) break;
        }
        if (v >= vocab || (i < n && s[i] >= '0' && s[i] <= '9')) {
            fprintf(stderr, "detokenize: id %lld... is out of range (vocabulary %d)\n", v, vocab);
            return -1;
        }
        ids[k++] = (int32_t)v;
    }
    *n_ids = k;
    return 0;
}

/* Decodes through the streaming detokenizer: exact bytes (a decoded NUL survives), and it is the
 * same code path a generating server uses. In batch mode the text is collected for base64. */
static int decode_stream(const csd_tok *tok, const int32_t *ids, size_t n, bool skip_special,
                         bool batch) {
    csd_detok d;
    csd_detok_init(&d, tok, skip_special);
    static char piece[1 << 16];
    size_t cap = 1 << 16, len = 0;
    unsigned char *all = batch ? csd_alloc(cap) : NULL;
    if (batch && !all) {
        fprintf(stderr, "detokenize: out of memory\n");
        return -1;
    }
    for (size_t i = 0; i <= n; i++) {
        size_t got = 0;
        int rc = i < n ? csd_detok_push(&d, ids[i], piece, sizeof piece, &got)
                       : csd_detok_flush(&d, piece, sizeof piece, &got);
        if (rc) {
            fprintf(stderr, "detokenize: id %d: %s\n", i < n ? ids[i] : -1, csd_strerror(rc));
            csd_free(all);
            return -1;
        }
        if (!batch) {
            fwrite(piece, 1, got, stdout);
            continue;
        }
        if (len + got > cap) {
            while (len + got > cap) cap *= 2;
            unsigned char *nb = csd_alloc(cap);
            if (!nb) {
                fprintf(stderr, "detokenize: out of memory\n");
                csd_free(all);
                return -1;
            }
            memcpy(nb, all, len);
            csd_free(all);
            all = nb;
        }
        memcpy(all + len, piece, got);
        len += got;
    }
    bool printed = !batch || csd_cli_print_base64(all, len);
    csd_free(all);
    if (!printed) fprintf(stderr, "detokenize: out of memory\n");
    return printed ? 0 : -1;
}

typedef struct {
    const char *dir;
    bool skip_special, batch;
} detokenize_args;

/* Fills a from argv; returns -1 to go on, or the exit status (0 after --help, 2 on a bad flag). */
static int parse_args(int argc, char **argv, detokenize_args *a) {
    *a = (detokenize_args){0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--skip-special") == 0) {
            a->skip_special = true;
        } else if (strcmp(argv[i], "--batch") == 0) {
            a->batch = true;
        } else if (argv[i][0] == '-' || a->dir) {
            fprintf(stderr, "detokenize: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            a->dir = argv[i];
        }
    }
    if (!a->dir) {
        fprintf(stderr, "detokenize: missing DIR\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Decodes all of in[0..len), or with --batch each line; ids has room for len / 2 + 1 ids (ids
 * are >= 2 bytes apart). 0, or 1 at the first line that fails, with the message printed. */
static int decode_input(const csd_tok *tok, const detokenize_args *a, const char *in, size_t len,
                        int32_t *ids) {
    for (size_t pos = 0; pos < len || (!a->batch && pos == 0);) {
        const char *s = in + pos;
        size_t n = len - pos;
        if (a->batch) {
            const char *nl = memchr(s, '\n', n);
            n = nl ? (size_t)(nl - s) : n;
            pos += n + 1;
        } else {
            pos = len + 1;
        }
        size_t n_ids = 0;
        if (parse_ids(s, n, csd_tok_vocab_size(tok), ids, &n_ids)) return 1;
        if (decode_stream(tok, ids, n_ids, a->skip_special, a->batch)) return 1;
    }
    return 0;
}

int csd_cmd_detokenize(int argc, char **argv) {
    detokenize_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    csd_err err = {0};
    csd_tok *tok = NULL;
    if (csd_tok_load(&tok, a.dir, &err)) {
        fprintf(stderr, "detokenize: %s\n", err.msg);
        return 1;
    }
    char *in = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    bool read = csd_cli_read_stdin("detokenize", &in, &len);
    if (read && !(ids = csd_alloc_array(len / 2 + 1, sizeof *ids)))
        fprintf(stderr, "detokenize: out of memory\n");
    if (!ids) {
        csd_free(in);
        csd_tok_destroy(tok);
        return 1;
    }
    int status = decode_input(tok, &a, in, len, ids);
    csd_free(ids);
    csd_free(in);
    csd_tok_destroy(tok);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "detokenize: cannot write stdout\n");
        return 1;
    }
    return status;
}
