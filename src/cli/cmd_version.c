/* cmd_version: `cascadia version [--json]` (also `cascadia --version`) says what this binary is:
 * its version and commit, how it was built, the kernel table it would use here and the others this
 * CPU runs, and the versions of the file formats and the wire protocol it reads and speaks. The
 * last line is what decides whether machines can share a fleet: the same wire protocol and shard
 * versions, whatever their kernels. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli_json.h"
#include "commands.h"
#include "core/build_info.h"
#include "format/manifest.h"
#include "format/shard.h"
#include "kern/kern.h"
#include "net/wire.h"

#define MAX_TABLES 8

static void version_usage(FILE *out) {
    fprintf(out, "usage: cascadia version [--json]\n\n"
                 "Prints the version, the git commit it was built from, the compiler, the kernels\n"
                 "this CPU runs (CSD_KERN picks another of them) and the format versions.\n\n"
                 "  --json   the same as one JSON object\n");
}

static int print_json(const char **tables, int n_tables) {
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:[], s:{s:i, s:i, s:i}}", "version",
                  csd_version(), "commit", csd_build_commit(), "compiler", csd_build_compiler(),
                  "build_type", csd_build_type(), "arch", csd_build_arch(), "kernels",
                  csd_kern_name(), "kernels_available", "formats", "shard", CSD_SHARD_VERSION,
                  "manifest", CSD_MANIFEST_VERSION, "wire", (int)CSD_WIRE_VERSION);
    json_t *list = o ? json_object_get(o, "kernels_available") : NULL;
    for (int i = 0; list && i < n_tables; i++) json_array_append_new(list, json_string(tables[i]));
    if (!csd_cli_json_print(o)) {
        fprintf(stderr, "cascadia version: cannot write the JSON result\n");
        return 1;
    }
    return 0;
}

static void print_text(const char **tables, int n_tables) {
    printf("cascadia %s\n", csd_version());
    printf("commit:   %s\n", csd_build_commit());
    printf("built:    %s, %s, %s\n", csd_build_compiler(), csd_build_type(), csd_build_arch());
    printf("kernels:  %s (this CPU runs:", csd_kern_name());
    for (int i = 0; i < n_tables; i++) printf(" %s", tables[i]);
    printf(")\n");
    printf("formats:  shard %d, manifest %d, wire protocol %u\n", CSD_SHARD_VERSION,
           CSD_MANIFEST_VERSION, CSD_WIRE_VERSION);
}

int csd_cmd_version(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            version_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else {
            fprintf(stderr, "cascadia version: unknown argument '%s'\n\n", argv[i]);
            version_usage(stderr);
            return 2;
        }
    }
    const char *tables[MAX_TABLES];
    int n_tables = csd_kern_available(tables, MAX_TABLES);
    if (json) return print_json(tables, n_tables);
    print_text(tables, n_tables);
    return 0;
}
