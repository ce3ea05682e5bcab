// commands.h: the subcommands of neox-preprocess. Each takes the arguments after its name
// (argv[0] is the subcommand name) and returns the exit status.
#ifndef NEOX_PREPROCESS_COMMANDS_H
#define NEOX_PREPROCESS_COMMANDS_H

typedef struct preprocess_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} preprocess_command;

#endif
