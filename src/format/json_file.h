/* json_file: reads a JSON file of bounded size (generation_config.json, the safetensors index)
 * into a jansson tree, duplicate keys refused. */
#ifndef CSD_JSON_FILE_H
#define CSD_JSON_FILE_H

#include <jansson.h>
#include <stddef.h>

#include "core/err.h"

/* *out = the parsed file (json_decref it), or an error naming path: unreadable, larger than
 * max_bytes, or not valid JSON (with jansson's message and line). */
int csd_json_read_file(const char *path, size_t max_bytes, json_t **out, csd_err *err);

#endif
