/* cascadia: the one binary. Dispatches to a subcommand from cli/commands.c; nothing else lives
 * here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/log.h"

static void usage(FILE *out) {
    fprintf(out,
            "cascadia: distributed LLM inference on ordinary PCs\n\n"
            "usage: cascadia COMMAND [options]   (cascadia COMMAND --help for its options)\n\n"
            "commands:\n");
    for (const csd_command *c = csd_commands; c->name; c++)
        fprintf(out, "  %-12s %s\n", c->name, c->summary);
    fprintf(
        out,
        "\nenvironment: CSD_LOG=error|warn|info|debug|trace,\n"
        "             CSD_KERN=ref|avx2|avxvnni|avx512|neon (default: the best this CPU runs),\n"
        "             CSD_PF_AHEAD=BYTES (decode's weight prefetch distance, a multiple of 64\n"
        "             up to 16384; default: the kernels' own, see build/stream_bench -a)\n");
}

/* A command's exit code, or 1 when what it printed could not all be written (a full disk, a
 * closed pipe): stdio buffers, so a failed write shows only at the flush. */
static int output_written(int rc) {
    errno = 0;
    int flushed = fflush(stdout) == 0;
    int why = errno; /* the flush's own failure; an earlier write's errno is long gone */
    if (flushed && !ferror(stdout)) return rc;
    fprintf(stderr, "cascadia: writing the output failed: %s\n",
            !flushed && why ? strerror(why) : "an earlier write failed");
    return rc ? rc : 1;
}

int main(int argc, char **argv) {
    const char *level = getenv("CSD_LOG");
    if (level && *level) {
        int parsed = csd_log_level_parse(level);
        if (parsed >= 0)
            csd_log_set_level(parsed);
        else
            fprintf(stderr,
                    "cascadia: CSD_LOG=%s is not error, warn, info, debug or trace; ignored\n",
                    level);
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return output_written(0);
    }
    if (strcmp(argv[1], "--version") == 0)
        return output_written(csd_cmd_version(argc - 1, argv + 1));
    for (const csd_command *c = csd_commands; c->name; c++)
        if (strcmp(argv[1], c->name) == 0) return output_written(c->run(argc - 1, argv + 1));
    fprintf(stderr, "cascadia: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
