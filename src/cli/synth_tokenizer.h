/* synth_tokenizer: a small self-made tokenizer.json for synthetic demo models (see the .c file). */
#ifndef CSD_SYNTH_TOKENIZER_H
#define CSD_SYNTH_TOKENIZER_H

#include "core/err.h"

/* Both strings are csd_alloc'd NUL-terminated JSON (csd_free them). */
int csd_synth_tokenizer_json(char **tokenizer_json, char **config_json, csd_err *err);

#endif
