/* cli_stdin: stdin in full and base64 lines (see cli_stdin.h). */
#include "cli_stdin.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

/* Grows *buf (holding n bytes, capacity *cap) to twice its capacity; false when out of memory. */
static bool grow(char **buf, size_t n, size_t *cap) {
    char *nb = csd_alloc(*cap * 2);
    if (!nb) return false;
    memcpy(nb, *buf, n);
    csd_free(*buf);
    *buf = nb;
    *cap *= 2;
    return true;
}

bool csd_cli_read_stdin(const char *cmd, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = csd_alloc(cap);
    const char *problem = buf ? NULL : "out of memory";
    while (!problem) {
        if (n + 1 >= cap && cap >= CSD_CLI_STDIN_MAX) {
            problem = "stdin is larger than 256 MiB";
        } else if (n + 1 >= cap && !grow(&buf, n, &cap)) {
            problem = "out of memory";
        } else {
            size_t r = fread(buf + n, 1, cap - n - 1, stdin);
            n += r;
            if (r == 0 && ferror(stdin)) problem = "cannot read stdin";
            if (r == 0) break;
        }
    }
    if (problem) {
        fprintf(stderr, "%s: %s\n", cmd, problem);
        csd_free(buf);
        return false;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return true;
}

long csd_cli_base64_decode(char *s, size_t n) {
    /* libsodium does not promise in-place decoding, so the bytes go through a copy. */
    unsigned char *bin = csd_alloc(n + 1);
    if (!bin) return -1;
    size_t got = 0;
    int rc = sodium_base642bin(bin, n + 1, s, n, NULL, &got, NULL, sodium_base64_VARIANT_ORIGINAL);
    if (rc == 0) memcpy(s, bin, got);
    csd_free(bin);
    return rc == 0 ? (long)got : -1;
}

bool csd_cli_print_base64(const unsigned char *s, size_t n) {
    size_t cap = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
    char *text = csd_alloc(cap);
    if (!text) return false;
    sodium_bin2base64(text, cap, s, n, sodium_base64_VARIANT_ORIGINAL);
    puts(text);
    csd_free(text);
    return true;
}
