/* fuzz_format_manifest: csd_manifest_parse over arbitrary text. Whatever parses must hold stages
 * that are contiguous, cover the model, carry plain file names and consistent embed/head flags;
 * any violation traps. Run it with `scripts/fuzz SECONDS format_manifest`: seeds are the
 * manifest.json files `cascadia export` writes for tiny synthetic models of every family. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    csd_manifest *m = NULL;
    csd_err err = {0};
    if (csd_manifest_parse(&m, (const char *)data, size, "/nonexistent", &err) != 0) {
        if (m || err.code == 0 || err.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    if (m->n_stages < 1 || m->n_stages > CSD_SHARD_MAX_STAGES || m->n_files < 0 ||
        m->n_files > CSD_MANIFEST_MAX_FILES)
        __builtin_trap();
    int64_t next = 0;
    for (int i = 0; i < m->n_stages; i++) {
        const csd_manifest_stage *s = &m->stages[i];
        if (s->layer_begin != next || s->layer_end <= s->layer_begin || s->has_embed != (i == 0) ||
            s->has_head != (i == m->n_stages - 1) || strchr(s->file, '/') || s->file[0] == '.' ||
            s->file[0] == '\0')
            __builtin_trap();
        next = s->layer_end;
    }
    if (next != m->cfg.n_layers) __builtin_trap();
    /* Validation against a directory that does not exist must fail cleanly. */
    if (csd_manifest_validate(m, false, &err) == 0) __builtin_trap();
    csd_manifest_destroy(m);
    return 0;
}
