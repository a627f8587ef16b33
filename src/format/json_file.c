/* json_file: see json_file.h. */
#include "json_file.h"

#include "core/alloc.h"
#include "core/file_map.h"

int csd_json_read_file(const char *path, size_t max_bytes, json_t **out, csd_err *err) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = csd_file_read_all(path, max_bytes, &text, &len, err);
    if (rc != 0) return rc;
    json_error_t je;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    csd_free(text);
    if (!*out)
        return csd_err_set(err, CSD_EFORMAT, "%s: not valid JSON: %s (line %d)", path, je.text,
                           je.line);
    return 0;
}
