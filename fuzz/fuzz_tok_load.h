/* fuzz_tok_load: the tokenizer the tokenizer fuzz targets share: stories260K's real one, from
 * $CSD_FUZZ_TOK_DIR (scripts/fuzz sets it) or ../shared/models/stories260K. Exits on failure: a
 * target without its tokenizer has nothing to fuzz. */
#ifndef CSD_FUZZ_TOK_LOAD_H
#define CSD_FUZZ_TOK_LOAD_H

#include <stdio.h>
#include <stdlib.h>

#include "tok/tokenizer.h"

static inline csd_tok *fuzz_tok_load(const char *target) {
    const char *dir = getenv("CSD_FUZZ_TOK_DIR");
    csd_tok *tok = NULL;
    csd_err err = {0};
    if (csd_tok_load(&tok, dir ? dir : "../shared/models/stories260K", &err) != 0) {
        fprintf(stderr, "%s: %s (set CSD_FUZZ_TOK_DIR)\n", target, err.msg);
        exit(1);
    }
    return tok;
}

#endif
