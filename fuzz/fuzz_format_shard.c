/* fuzz_format_shard: csd_shard_parse over arbitrary bytes. The structural checks run first without
 * checksums (so mutated inputs reach the table and config parsers), then again with every checksum.
 * Whatever parses must keep every tensor inside the buffer, aligned and findable by name; any
 * violation traps. Run it with `scripts/fuzz SECONDS format_shard`: the seed is the minimal shard
 * that test_format_shard writes (CSD_SHARD_SEED_DIR=DIR). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "format/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const csd_shard *s, const uint8_t *data, size_t size) {
    const csd_shard_header *h = csd_shard_hdr(s);
    if (h->file_bytes != size || h->layer_begin >= h->layer_end || h->layer_end > h->n_layers ||
        h->stage_index >= h->stage_count)
        __builtin_trap();
    size_t json_len;
    const char *json = csd_shard_config_json(s, &json_len);
    if ((const uint8_t *)json < data || json_len > size ||
        (const uint8_t *)json + json_len > data + size)
        __builtin_trap();
    for (int i = 0; i < csd_shard_count(s); i++) {
        const csd_shard_tensor *t = csd_shard_at(s, i);
        if (t->offset % CSD_SHARD_ALIGN || t->offset > size || t->nbytes > size - t->offset ||
            (const uint8_t *)t->data != data + t->offset || t->rows < 1 || t->cols < 1 ||
            strlen(t->name) == 0 || strlen(t->name) >= CSD_SHARD_NAME_BYTES)
            __builtin_trap();
        if (csd_shard_find(s, t->name) != t) __builtin_trap();
    }
    csd_shard_table tab = csd_shard_get_table(s);
    uint8_t hash[CSD_SHARD_HASH_BYTES];
    csd_shard_model_hash(hash, json, json_len, h->precision, &tab, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const unsigned modes[] = {0, CSD_SHARD_VERIFY_ALL};
    for (int m = 0; m < 2; m++) {
        csd_shard *s = NULL;
        csd_err err = {0};
        if (csd_shard_parse(&s, data, size, "fuzz.shard", modes[m], &err) != 0) {
            if (s || err.code == 0 || err.msg[0] == '\0') __builtin_trap();
            return 0;
        }
        check(s, data, size);
        csd_shard_close(s);
    }
    return 0;
}
