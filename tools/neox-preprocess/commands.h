// commands.h: the subcommands of neox-preprocess. Each takes the arguments after its name
// (argv[0] is the subcommand name) and returns the exit status.
#ifndef NEOX_PREPROCESS_COMMANDS_H
#define NEOX_PREPROCESS_COMMANDS_H

#include <stdio.h>

typedef struct preprocess_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} preprocess_command;

// tokenizer_commands.c
int command_encode(int argc, char **argv);
int command_decode(int argc, char **argv);
int command_train_tokenizer(int argc, char **argv);

// dataset_commands.c
int preprocess_main(int argc, char **argv);  // the default mode: preprocess_data.py's flags
int mask_main(int argc, char **argv);  // preprocess_data_with_mask.py: the default mode with label masks
int merge_main(int argc, char **argv);
int info_main(int argc, char **argv);
int index_main(int argc, char **argv);
void preprocess_options_help(FILE *out);  // the default mode's options, for the main --help
char **split_commas(const char *list, int *count);  // a comma-separated list (malloc'ed strings)

// chat_command.c
int chat_main(int argc, char **argv);

#endif
