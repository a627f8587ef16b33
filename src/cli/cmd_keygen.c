/* cmd_keygen: `cascadia keygen [--out FILE] [--force]` writes a new fleet key (32 random bytes as
 * hex, mode 0600). Every worker and the coordinator of one fleet load the same file; links between
 * processes without it are refused. The key itself is never printed, only its fingerprint. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "net/fleet_key.h"

#define KEYGEN_DEFAULT_PATH "cascadia-fleet.key"

static void keygen_usage(FILE *out) {
    fprintf(out,
            "usage: cascadia keygen [--out FILE] [--force]\n\n"
            "Writes a new fleet key (32 random bytes, hex) to FILE with mode 0600.\n"
            "Copy it to every machine of the fleet; pass it to `worker` and `run`/`serve`.\n\n"
            "  -o, --out FILE   where to write (default: " KEYGEN_DEFAULT_PATH ")\n"
            "  -f, --force      replace an existing file\n");
}

int csd_cmd_keygen(int argc, char **argv) {
    const char *path = KEYGEN_DEFAULT_PATH;
    bool force = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            keygen_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--out") == 0) {
            if (i + 1 == argc) {
                fprintf(stderr, "cascadia keygen: %s needs a value\n", argv[i]);
                return 2;
            }
            path = argv[++i];
        } else if (strcmp(argv[i], "-f") == 0 || strcmp(argv[i], "--force") == 0) {
            force = true;
        } else {
            fprintf(stderr, "cascadia keygen: unknown argument '%s'\n\n", argv[i]);
            keygen_usage(stderr);
            return 2;
        }
    }
    csd_fleet_key key;
    csd_err err = {0};
    if (csd_fleet_key_generate(&key, &err) || csd_fleet_key_save(path, &key, force, &err)) {
        fprintf(stderr, "cascadia keygen: %s\n", err.msg);
        csd_fleet_key_wipe(&key);
        return 1;
    }
    char fp[17];
    csd_fleet_key_fingerprint(&key, fp);
    csd_fleet_key_wipe(&key);
    fprintf(stderr, "wrote fleet key %s (mode 0600, fingerprint %s)\n", path, fp);
    return 0;
}
