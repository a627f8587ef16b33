/* arch: the architecture table, one row per supported family. Everything family-specific that the
 * config parser and the model need (qkv biases, q/k norm, sliding window, HF class name) lives in
 * a row here; adding a family means adding a row (and its enum value in model_config.h). */
#include "model_config.h"

#include <string.h>

/* X(arch, model_type, display, qkv_bias, qk_norm, sliding_window, hf_class) */
#define ARCH_ROWS(X)                                                               \
    X(CSD_ARCH_LLAMA, "llama", "Llama", false, false, false, "LlamaForCausalLM")     \
    X(CSD_ARCH_MISTRAL, "mistral", "Mistral", false, false, true, "MistralForCausalLM") \
    X(CSD_ARCH_QWEN2, "qwen2", "Qwen2", true, false, false, "Qwen2ForCausalLM")      \
    X(CSD_ARCH_QWEN3, "qwen3", "Qwen3", false, true, false, "Qwen3ForCausalLM")

#define ARCH_DESC(a, mt, disp, bias, qkn, sw, cls) \
    [a] = {.arch = a, .model_type = mt, .display_name = disp, .qkv_bias = bias, .qk_norm = qkn, \
           .uses_sliding_window = sw},
static const csd_arch_desc arch_table[CSD_ARCH_COUNT] = {ARCH_ROWS(ARCH_DESC)};

#define ARCH_CLASS(a, mt, disp, bias, qkn, sw, cls) [a] = cls,
static const char *const arch_class[CSD_ARCH_COUNT] = {ARCH_ROWS(ARCH_CLASS)};

/* ", llama, mistral, ..." built from the same rows; returned without the leading ", ". */
#define ARCH_LIST(a, mt, disp, bias, qkn, sw, cls) ", " mt
static const char arch_list[] = "" ARCH_ROWS(ARCH_LIST);

const csd_arch_desc *csd_arch_find(const char *model_type) {
    if (!model_type) return NULL;
    for (int i = 0; i < CSD_ARCH_COUNT; i++)
        if (strcmp(arch_table[i].model_type, model_type) == 0) return &arch_table[i];
    return NULL;
}

const csd_arch_desc *csd_arch_get(int arch) {
    if (arch < 0 || arch >= CSD_ARCH_COUNT) return NULL;
    return &arch_table[arch];
}

const char *csd_arch_supported_list(void) { return arch_list + 2; }

const char *csd_arch_hf_class(int arch) {
    if (arch < 0 || arch >= CSD_ARCH_COUNT) return NULL;
    return arch_class[arch];
}
