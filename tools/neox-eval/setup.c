// setup.c: process set-up shared by neox-eval's commands: MPI, the merged config, the grid.
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "commands.h"
#include "core.h"

// GPT-NeoX reads a parallel size of 0 as 1.
static int at_least_1(int64_t n) { return n < 1 ? 1 : (int)n; }

neox_config *neox_tool_setup(int nconfigs, const char *const *configs, int quiet, neox_grid *grid, int *argc, char ***argv) {
    neox_error err = {0};
    if (neox_parallel_init(argc, argv, &err) != 0) neox_die_error(&err);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    // Evaluation runs data parallel over every rank whatever layout trained the model (checkpoints
    // load into any layout), so the configs of a tensor- or pipeline-parallel run work as they are,
    // on any number of ranks: the two sizes only describe the checkpoint.
    neox_config_options opts = {.world_size = world, .quiet = quiet, .data_parallel_only = 1};
    neox_config *cfg = neox_config_load(configs, nconfigs, &opts, &err);
    if (!cfg) neox_die_error(&err);
    int pp = at_least_1(neox_config_int(cfg, pipe_parallel_size)), mp = at_least_1(neox_config_int(cfg, model_parallel_size));
    if ((pp > 1 || mp > 1) && !quiet && neox_launcher_rank() == 0)
        neox_notice("pipe_parallel_size %d, model_parallel_size %d: neox-eval runs data parallel over all %d ranks", pp, mp, world);
    int64_t cp = neox_config_int(cfg, context_parallel_size);
    if (cp > 1) {  // unlike the two sizes above, a layout of the run, not of the checkpoint
        err = (neox_error){0};
        neox_fail(&err, NEOX_EXIT_USAGE, "key 'context_parallel_size' %lld: neox-eval scores whole sequences on every "
                  "rank and does not share them over context ranks; set it to 1 to evaluate (a checkpoint loads at any "
                  "context_parallel_size)", (long long)cp);
        neox_die_error(&err);
    }
    neox_comm_set_timeout(neox_config_float(cfg, comm_timeout_seconds));
    if (neox_grid_make(grid, 1, 1, &err) != 0) neox_die_error(&err);
    if (quiet || grid->world_rank != 0) neox_progress_set_enabled(0);
    return cfg;
}

void neox_tool_teardown(neox_config *cfg, neox_grid *grid) {
    neox_grid_free(grid);
    neox_config_free(cfg);
    neox_parallel_finalize(0);
}

