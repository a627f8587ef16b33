/* file_map: read-only memory maps of whole files, and bounded reads of small text files.
 * A mapping lives until csd_file_unmap; pointers into it are borrowed by whoever reads tensors. */
#ifndef CSD_FILE_MAP_H
#define CSD_FILE_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct csd_file_map {
    const uint8_t *data; /* mapped bytes, NULL for an empty file */
    size_t size;         /* file length in bytes */
} csd_file_map;

/* Maps path read-only. On failure fills err with the path and the OS reason. */
int csd_file_map_open(csd_file_map *map, const char *path, csd_err *err);
void csd_file_map_close(csd_file_map *map);
/* Takes the whole pages inside [p, p + n) of a mapping out of this process's resident memory
 * (a copy has been made elsewhere); the bytes stay readable, from the file, if touched again. */
void csd_file_map_drop_pages(const void *p, size_t n);

/* Reads a whole file into a NUL-terminated heap buffer (csd_free it); refuses files larger than
 * max_bytes so a hostile path cannot exhaust memory. *out_len excludes the NUL. */
int csd_file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len,
                      csd_err *err);
/* Writes len bytes to path atomically (temp file + rename: a symbolic link there is replaced, not
 * written through); what is not a regular file (a device, a FIFO) is written as it is. */
int csd_file_write_all(const char *path, const void *data, size_t len, csd_err *err);
/* Joins dir and name into out (size cap); returns CSD_ERANGE when it does not fit. */
int csd_path_join(char *out, size_t cap, const char *dir, const char *name);
int csd_file_exists(const char *path);

#endif
