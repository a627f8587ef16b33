/* tag_scan: what the splitters of streamed answers (tool_calls.c, think_split.c) look for in text
 * that arrives piece by piece: JSON's whitespace, the start of a tag cut off at the end of what has
 * arrived, and whitespace runs counted up to a bound (so that nothing rescans a long run). */
#ifndef CSD_HTTP_TAG_SCAN_H
#define CSD_HTTP_TAG_SCAN_H

#include <stdbool.h>
#include <stddef.h>

/* Space, tab, newline or carriage return: JSON's whitespace, and what templates lay text out
 * with. */
bool csd_tag_is_space(char c);
/* The length of the longest suffix of buf[0, n) that is a proper prefix of tag[0, tag_len). */
size_t csd_tag_partial(const char *buf, size_t n, const char *tag, size_t tag_len);
/* The length of the whitespace run that starts at buf[0], counted up to max. */
size_t csd_tag_space_after(const char *buf, size_t n, size_t max);
/* The length of the whitespace run that ends at buf[n), counted up to max. */
size_t csd_tag_space_before(const char *buf, size_t n, size_t max);

#endif
