/* fuzz_format_config: csd_model_config_parse over arbitrary text. Whatever parses must satisfy the
 * documented bounds and survive to_json -> parse unchanged; any violation traps. Run it with
 * `scripts/fuzz SECONDS format_config`: seeds are the config.json of a tiny synthetic model of
 * every family (without them the fuzzer rarely gets past the JSON, whose parser it cannot see). */
#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "format/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    csd_model_config cfg;
    csd_err err = {0};
    if (csd_model_config_parse(&cfg, (const char *)data, size, &err) != 0) {
        if (err.code == 0 || err.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    if (cfg.dim < 1 || cfg.dim > CSD_MAX_DIM || cfg.n_layers < 1 || cfg.n_layers > CSD_MAX_LAYERS ||
        cfg.vocab_size < 1 || cfg.vocab_size > CSD_MAX_VOCAB || cfg.n_kv_heads < 1 ||
        cfg.n_heads % cfg.n_kv_heads != 0 || cfg.head_dim < 2 || cfg.head_dim % 2 != 0 ||
        cfg.n_heads * cfg.head_dim > CSD_MAX_DIM || cfg.max_seq_len < 1 ||
        cfg.max_seq_len > CSD_MAX_CONTEXT || !(cfg.norm_eps > 0) || !(cfg.rope_theta > 0) ||
        cfg.n_eos < 0 || cfg.n_eos > CSD_MAX_EOS || cfg.bos_id >= cfg.vocab_size)
        __builtin_trap();
    for (int i = 0; i < cfg.n_eos; i++)
        if (cfg.eos_ids[i] < 0 || cfg.eos_ids[i] >= cfg.vocab_size) __builtin_trap();
    char *text = NULL;
    if (csd_model_config_to_json(&cfg, &text, &err) != 0) __builtin_trap(); /* must round-trip */
    csd_model_config back;
    size_t len = 0;
    while (text[len]) len++;
    if (csd_model_config_parse(&back, text, len, &err) != 0 || !csd_model_config_equal(&cfg, &back))
        __builtin_trap();
    csd_free(text);
    return 0;
}
