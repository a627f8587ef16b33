/* cmd_bench: placeholder while the command is being written (replaced by its owner). */
#include <stdio.h>

#include "commands.h"

int csd_cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "cascadia bench: not available yet\n");
    return 1;
}
