/* commands: the subcommand table (see commands.h). Keep it sorted by how often users need them. */
#include "commands.h"

#include <stddef.h>

const csd_command csd_commands[] = {
    {"run", "generate text from a model directory (or a fleet)", csd_cmd_run},
    {"inspect", "print what was understood of a model directory, shard or manifest", csd_cmd_inspect},
    {"logits", "print next-token logits at every position (compare with other engines)",
     csd_cmd_logits},
    {"synth", "write a random-weight model of a real shape (for benchmarks and tests)",
     csd_cmd_synth},
    {"tokenize", "read text on stdin, print token ids", csd_cmd_tokenize},
    {"detokenize", "read token ids on stdin, print text", csd_cmd_detokenize},
    {NULL, NULL, NULL},
};
