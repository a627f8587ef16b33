/* commands: the table of `cascadia` subcommands. Each lives in its own cli/cmd_<name>.c as
 * `int csd_cmd_<name>(int argc, char **argv)` (argv[0] is the subcommand name) and returns the
 * process exit code: 0 ok, 1 runtime failure, 2 usage error. */
#ifndef CSD_COMMANDS_H
#define CSD_COMMANDS_H

typedef struct csd_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} csd_command;

/* NULL-name-terminated table. */
extern const csd_command csd_commands[];

int csd_cmd_run(int argc, char **argv);
int csd_cmd_inspect(int argc, char **argv);
int csd_cmd_logits(int argc, char **argv);
int csd_cmd_synth(int argc, char **argv);
int csd_cmd_tokenize(int argc, char **argv);
int csd_cmd_detokenize(int argc, char **argv);
int csd_cmd_export(int argc, char **argv);
int csd_cmd_worker(int argc, char **argv);
int csd_cmd_serve(int argc, char **argv);
int csd_cmd_route(int argc, char **argv);
int csd_cmd_keygen(int argc, char **argv);
int csd_cmd_bench(int argc, char **argv);
int csd_cmd_perplexity(int argc, char **argv);
int csd_cmd_version(int argc, char **argv);

#endif
