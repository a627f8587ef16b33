/* cmd_tokenize: `cascadia tokenize DIR`: text on stdin -> token ids on stdout. A thin wrapper over
 * tok/tokenizer.h; --batch encodes one base64 string per input line (used by
 * tests/e2e_tok_parity.sh so thousands of strings, including invalid UTF-8, need one tokenizer
 * load). See docs/tokenizer.md. */
#include "cli/commands.h"

#include <stdio.h>
#include <string.h>

#include "cli/cli_stdin.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "tok/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: cascadia tokenize DIR [--tokens] [--no-special] [--split-special] [--batch]\n"
            "  Reads all of stdin as text and prints its token ids, space-separated, on one line.\n"
            "  DIR              a model or tokenizer directory (tokenizer.json [+ "
            "tokenizer_config.json])\n"
            "  --tokens         also print one line per token: id, then its vocabulary piece\n"
            "  --no-special     do not add BOS/EOS (the config's add_bos_token / post-processor)\n"
            "  --split-special  read special-token strings such as <|eot_id|> as plain text\n"
            "  --batch          each stdin line is base64 of one text; print one line of ids per "
            "line\n");
}

static void print_piece(const char *p) {
    for (; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 || c == 0x7F || c == '\\')
            printf("\\x%02X", c);
        else
            putchar(c);
    }
}

typedef struct {
    const char *dir;
    bool tokens, add_special, parse_special, batch;
} tokenize_args;

/* Fills a from argv; returns -1 to go on, or the exit status (0 after --help, 2 on a bad flag). */
static int parse_args(int argc, char **argv, tokenize_args *a) {
    *a = (tokenize_args){.add_special = true, .parse_special = true};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--tokens") == 0) {
            a->tokens = true;
        } else if (strcmp(argv[i], "--no-special") == 0) {
            a->add_special = false;
        } else if (strcmp(argv[i], "--split-special") == 0) {
            a->parse_special = false;
        } else if (strcmp(argv[i], "--batch") == 0) {
            a->batch = true;
        } else if (argv[i][0] == '-' || a->dir) {
            fprintf(stderr, "tokenize: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            a->dir = argv[i];
        }
    }
    if (!a->dir) {
        fprintf(stderr, "tokenize: missing DIR\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Encodes s[0..n) and prints its ids on one line (and with --tokens, a line per token). Adds the
 * text's bytes and ids to the totals. 0, or 1 with the message printed. */
static int encode_and_print(const csd_tok *tok, const tokenize_args *a, const char *s, size_t n,
                            size_t *total_bytes, size_t *total_ids) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    csd_err err = {0};
    if (csd_tok_encode(tok, s, n, a->add_special, a->parse_special, &ids, &n_ids, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        return 1;
    }
    *total_bytes += n;
    *total_ids += n_ids;
    for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    for (size_t i = 0; a->tokens && i < n_ids; i++) {
        printf("%d\t", ids[i]);
        print_piece(csd_tok_piece(tok, ids[i]));
        putchar('\n');
    }
    csd_free(ids);
    return 0;
}

/* Encodes all of text[0..len), or with --batch each line's base64-decoded text (decoded in
 * place). 0, or 1 at the first line that fails, with the message printed. */
static int encode_input(const csd_tok *tok, const tokenize_args *a, char *text, size_t len) {
    size_t line_no = 0, total_bytes = 0, total_ids = 0;
    double t0 = csd_now_s();
    int status = 0;
    for (size_t pos = 0; !status && (pos < len || (!a->batch && pos == 0));) {
        char *s = text + pos;
        size_t n = len - pos;
        if (a->batch) {
            char *nl = memchr(s, '\n', n);
            n = nl ? (size_t)(nl - s) : n;
            pos += n + 1;
            line_no++;
            if (n && s[n - 1] == '\r') n--;
            long d = csd_cli_base64_decode(s, n);
            if (d < 0) {
                fprintf(stderr, "tokenize: line %zu is not base64\n", line_no);
                status = 1;
                break;
            }
            n = (size_t)d;
        } else {
            pos = len + 1;
        }
        status = encode_and_print(tok, a, s, n, &total_bytes, &total_ids);
    }
    CSD_LOGI("tokenize done bytes=%zu ids=%zu seconds=%.3f", total_bytes, total_ids,
             csd_now_s() - t0);
    return status;
}

int csd_cmd_tokenize(int argc, char **argv) {
    tokenize_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    csd_err err = {0};
    csd_tok *tok = NULL;
    if (csd_tok_load(&tok, a.dir, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    if (!csd_cli_read_stdin("tokenize", &text, &len)) {
        csd_tok_destroy(tok);
        return 1;
    }
    int status = encode_input(tok, &a, text, len);
    csd_free(text);
    csd_tok_destroy(tok);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "tokenize: cannot write stdout\n");
        return 1;
    }
    return status;
}
