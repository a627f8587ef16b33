/* cli_stdin: what tokenize and detokenize share: all of stdin in one buffer, and the base64 lines
 * of their --batch modes (the tokenizer parity test passes texts with newlines, NULs and invalid
 * UTF-8 through them). Base64 is libsodium's (standard alphabet, padded). */
#ifndef CSD_CLI_STDIN_H
#define CSD_CLI_STDIN_H

#include <stdbool.h>
#include <stddef.h>

/* Reads stdin to its end into *out (NUL-terminated, csd_free it), refusing more than
 * CSD_CLI_STDIN_MAX bytes. False after printing "cmd: " and what went wrong (too large, a read
 * error, out of memory). */
#define CSD_CLI_STDIN_MAX ((size_t)256 << 20)
bool csd_cli_read_stdin(const char *cmd, char **out, size_t *len);

/* Decodes the base64 text s[0..n) into s itself (the bytes are never longer than their text);
 * returns the byte count, or -1 when s is not padded standard base64. */
long csd_cli_base64_decode(char *s, size_t n);

/* Prints base64 of s[0..n) and a newline on stdout; false when out of memory. */
bool csd_cli_print_base64(const unsigned char *s, size_t n);

#endif
