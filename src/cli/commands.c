/* commands: the subcommand table (see commands.h). Keep it sorted by how often users need them. */
#include "commands.h"

#include <stddef.h>

const csd_command csd_commands[] = {
    {"run", "generate text from a model directory (or a fleet)", csd_cmd_run},
    {"serve", "serve the OpenAI-compatible API from a model directory or a fleet", csd_cmd_serve},
    {"route", "one OpenAI-compatible endpoint over several providers, at most N requests each",
     csd_cmd_route},
    {"export", "cut a model into one self-contained shard per pipeline stage", csd_cmd_export},
    {"worker", "serve one stage's shard to the coordinator over TCP", csd_cmd_worker},
    {"keygen", "write a fleet key that authenticates and encrypts every link", csd_cmd_keygen},
    {"inspect", "print what was understood of a model directory, shard or manifest",
     csd_cmd_inspect},
    {"logits", "print next-token logits at every position (compare with other engines)",
     csd_cmd_logits},
    {"bench", "measure prompt and generation speed, the roofline, concurrency and fleet breakdowns",
     csd_cmd_bench},
    {"perplexity", "perplexity, KL divergence and top-1 agreement of a precision against f32",
     csd_cmd_perplexity},
    {"synth", "write a random-weight model of a real shape (for benchmarks and tests)",
     csd_cmd_synth},
    {"tokenize", "read text on stdin, print token ids", csd_cmd_tokenize},
    {"detokenize", "read token ids on stdin, print text", csd_cmd_detokenize},
    {"version", "print the version, commit, build and the kernels this CPU runs (also --version)",
     csd_cmd_version},
    {NULL, NULL, NULL},
};
