/* synth: random-weight models of real shapes, written in the Hugging Face layout (config.json +
 * model.safetensors), deterministically from a seed. Weights are scaled like a trained model's:
 * matrices with std 1/sqrt(fan_in) keep activations at unit scale, output projections are damped
 * by 1/sqrt(2 * n_layers) so the residual stream does not grow with depth, and q/k are scaled so
 * attention is neither uniform nor one-hot. It is how speed is measured on 1B-8B shapes here. */
#ifndef CSD_SYNTH_H
#define CSD_SYNTH_H

#include <stdint.h>

#include "core/err.h"
#include "format/model_config.h"

typedef struct csd_synth_preset {
    const char *name;
    int arch;              /* enum csd_arch; -1: any family (the tiny preset) */
    const char *like;      /* the real model it mirrors */
    csd_model_config cfg;  /* vocab_size 0: take the tokenizer's */
    int dtype;             /* safetensors dtype written */
} csd_synth_preset;

/* NULL-name-terminated table. */
extern const csd_synth_preset csd_synth_presets[];
const csd_synth_preset *csd_synth_preset_find(const char *name);

/* Fills cfg for preset under arch with vocab (>= tokenizer size), bos and eos ids. */
int csd_synth_config(csd_model_config *cfg, const csd_synth_preset *preset, int arch,
                     int64_t tokenizer_vocab, int bos_id, int eos_id, csd_err *err);
/* Writes out_dir/config.json and out_dir/model.safetensors (the directory must exist). */
int csd_synth_write(const csd_model_config *cfg, int dtype, uint64_t seed, const char *out_dir,
                    csd_err *err);

#endif
