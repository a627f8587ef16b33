/* cli_json: JSON results on stdout (bench --json) built with jansson, so that a model directory
 * named with a quote, a backslash or bytes that are not UTF-8, or a figure that came out NaN,
 * still gives one valid JSON document a script can read. */
#ifndef CSD_CLI_JSON_H
#define CSD_CLI_JSON_H

#include <jansson.h>
#include <stdbool.h>

/* o[key] = x; null when x is not finite (JSON has no NaN or infinity). */
void csd_cli_json_set_real(json_t *o, const char *key, double x);
/* o[key] = text, with every byte outside well-formed UTF-8 replaced by '?'. */
void csd_cli_json_set_text(json_t *o, const char *key, const char *text);
/* Prints v on one line, then a newline, and releases it. False (nothing printed) when v is NULL
 * or cannot be written. */
bool csd_cli_json_print(json_t *v);

#endif
