/* utf8: well-formedness of UTF-8 text (RFC 3629: no overlong forms, no surrogates, nothing past
 * U+10FFFF). For text that came from outside and must go into JSON, whose strings jansson refuses
 * unless they are valid UTF-8 (an HTTP error that quotes the bad request, say). */
#ifndef CSD_UTF8_H
#define CSD_UTF8_H

#include <stddef.h>

/* Bytes of the well-formed sequence at s[0..n): 1 to 4, or 0 when s does not start one (including
 * a sequence cut short by n). n == 0 returns 0. */
size_t csd_utf8_seq_len(const char *s, size_t n);
/* Characters in s[0..n) as a decoder that replaces bad bytes shows them: a well-formed sequence
 * is one, and so is each maximal start of one that is cut short or broken, and each byte that
 * starts nothing (each a U+FFFD). Python's len(b.decode("utf-8", "replace")), as OpenAI's
 * text_offset counts. */
size_t csd_utf8_chars(const char *s, size_t n);
/* Replaces, in place, every byte of the NUL-terminated s that does not belong to a well-formed
 * sequence with '?'. Returns how many bytes it replaced. */
size_t csd_utf8_scrub(char *s);

#endif
