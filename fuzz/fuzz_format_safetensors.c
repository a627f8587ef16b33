/* fuzz_format_safetensors: csd_st_parse over arbitrary bytes. On success every tensor must lie
 * inside the input and be findable by name; any violation traps. Run it with
 * `scripts/fuzz SECONDS format_safetensors`: seeds are fuzz/seeds/format_safetensors/. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    csd_st_set *set = NULL;
    csd_err err = {0};
    if (csd_st_parse(&set, data, size, "fuzz", &err) != 0) {
        if (set || err.code == 0 || err.msg[0] == '\0') __builtin_trap(); /* error must explain */
        return 0;
    }
    const uint8_t *end = data + size;
    for (int i = 0; i < csd_st_count(set); i++) {
        const csd_st_tensor *t = csd_st_at(set, i);
        const uint8_t *p = t->data;
        if (p < data || p > end || t->nbytes > (size_t)(end - p)) __builtin_trap();
        if (csd_st_find(set, t->name) != t) __builtin_trap();
        if (t->dtype != CSD_DTYPE_F32 && t->dtype != CSD_DTYPE_F16 && t->dtype != CSD_DTYPE_BF16)
            __builtin_trap();
        volatile uint8_t sink = 0;
        if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1]; /* touch both ends under ASan */
        (void)sink;
    }
    csd_st_close(set);
    return 0;
}
