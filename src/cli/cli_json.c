/* cli_json: JSON results on stdout (see cli_json.h). */
#include "cli_json.h"

#include <math.h>
#include <stdio.h>

#include "core/alloc.h"
#include "core/utf8.h"

/* Ten significant digits: every figure a benchmark prints, without %.17g's noise digits. */
#define CLI_JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(10))

void csd_cli_json_set_real(json_t *o, const char *key, double x) {
    json_object_set_new(o, key, isfinite(x) ? json_real(x) : json_null());
}

void csd_cli_json_set_text(json_t *o, const char *key, const char *text) {
    char *copy = csd_strdup(text);
    if (!copy) return; /* the key stays absent; csd_cli_json_print still prints the rest */
    csd_utf8_scrub(copy);
    json_object_set_new(o, key, json_string(copy));
    csd_free(copy);
}

bool csd_cli_json_print(json_t *v) {
    if (!v) return false;
    int rc = json_dumpf(v, stdout, CLI_JSON_FLAGS);
    json_decref(v);
    return rc == 0 && putchar('\n') != EOF;
}
