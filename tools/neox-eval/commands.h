// commands.h: the pieces of neox-eval shared by its commands (evaluation in main.c, generation in
// generate_command.c, the server in serve_command.c): MPI and config set-up.
#ifndef NEOX_EVAL_COMMANDS_H
#define NEOX_EVAL_COMMANDS_H

#include <stdint.h>

#include "config.h"
#include "parallel.h"

// Initialises MPI, loads the configs for the world size and builds the grid; dies on error.
neox_config *neox_tool_setup(int nconfigs, const char *const *configs, int quiet, neox_grid *grid, int *argc, char ***argv);
void neox_tool_teardown(neox_config *cfg, neox_grid *grid);
// neox-eval generate ARGS (argv[0] is "generate").
int neox_generate_command(int argc, char **argv);
// neox-eval serve ARGS (argv[0] is "serve").
int neox_serve_command(int argc, char **argv);

#endif
