/* cmd_perplexity: placeholder while the command is being written (replaced by its owner). */
#include <stdio.h>

#include "commands.h"

int csd_cmd_perplexity(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "cascadia perplexity: not available yet\n");
    return 1;
}
