// neox-train: trains a GPT-NeoX-family model from GPT-NeoX YAML configs. This file parses the
// command line and orchestrates; everything else is in lib/.
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core.h"
#include "version.h"
#include "parallel.h"
#include "train.h"

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s [OPTION]... CONFIG.yml [MORE.yml]...\n"
            "Train a GPT-NeoX-family model from GPT-NeoX YAML configs (merged as deepy.py merges them).\n"
            "Run under mpiexec or srun for several ranks.\n"
            "\n"
            "  --print-config     print every configuration key, its effective value and where it came\n"
            "                     from (default, derived or file:line), then exit\n"
            "  --print-config-format FORMAT\n"
            "                     'text' (default) or 'json' (value, source and the value as the file\n"
            "                     wrote it, per key)\n"
            "  --world-size N     with --print-config: derive sizes for N ranks (default: the MPI world\n"
            "                     size, or 1)\n"
            "  -q, --quiet        no notices or progress\n"
            "  -h, --help         show this help and exit\n"
            "  -V, --version      show version, backends and library versions, and exit\n"
            "\n"
            "Exit status: 0 success (train_iters or exit_interval reached), 1 runtime failure, 2 usage or\n"
            "configuration error, 3 stopped by SIGTERM or SIGUSR1 after saving a checkpoint (resume with\n"
            "the same command).\n"
            "Configuration keys: docs/config.md; training and checkpoints: docs/training.md.\n",
            neox_progname());
}

// GPT-NeoX reads a parallel size of 0 as 1.
static int at_least_1(int64_t n) { return n < 1 ? 1 : (int)n; }

// Sets up MPI and the process grid, loads the config for that world size and trains.
static int train(int nconfigs, const char *const *configs, int quiet, int *argc, char ***argv) {
    neox_error err = {0};
    neox_train_install_signal_handlers();
    if (neox_parallel_init(argc, argv, &err) != 0) neox_die_error(&err);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    neox_config_options opts = {.world_size = world, .quiet = quiet};
    neox_config *cfg = neox_config_load(configs, nconfigs, &opts, &err);
    if (!cfg) neox_die_error(&err);
    // Again after MPI_Init: MPI's transport libraries may have replaced the SIGHUP handler.
    neox_train_install_signal_handlers();
    neox_comm_set_timeout(neox_config_float(cfg, comm_timeout_seconds));
    neox_grid grid;
    if (neox_grid_make(&grid, at_least_1(neox_config_int(cfg, pipe_parallel_size)), at_least_1(neox_config_int(cfg, model_parallel_size)),
                       &err) != 0)
        neox_die_error(&err);
    neox_train_options topts = {.quiet = quiet};
    neox_trainer *t = neox_trainer_create(cfg, &grid, &topts, &err);
    int status = t ? neox_trainer_run(t, &err) : -1;
    if (status < 0) neox_die_error(&err);
    neox_trainer_free(t);
    neox_grid_free(&grid);
    neox_config_free(cfg);
    neox_parallel_finalize(status);
    return status;
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_log_from_launcher();
    enum { OPT_PRINT_CONFIG = 256, OPT_PRINT_FORMAT, OPT_WORLD_SIZE };
    static const struct option options[] = {
        {"print-config", no_argument, NULL, OPT_PRINT_CONFIG},
        {"print-config-format", required_argument, NULL, OPT_PRINT_FORMAT},
        {"world-size", required_argument, NULL, OPT_WORLD_SIZE},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int print_config = 0, quiet = 0, world_size = 0, c;
    const char *print_format = "text";
    opterr = 0;
    while ((c = getopt_long(argc, argv, "qhV", options, NULL)) != -1) {
        switch (c) {
        case OPT_PRINT_CONFIG: print_config = 1; break;
        case OPT_PRINT_FORMAT:
            if (strcmp(optarg, "text") != 0 && strcmp(optarg, "json") != 0)
                neox_usage_error("--print-config-format: '%s' is not 'text' or 'json'", optarg);
            print_format = optarg;
            break;
        case OPT_WORLD_SIZE: world_size = (int)neox_option_int("--world-size", optarg, 1, 1 << 24); break;
        case 'q': quiet = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': neox_print_version(stdout); return 0;
        default: neox_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) neox_usage_error("no config file given");
    if (quiet) neox_progress_set_enabled(0);

    neox_error err = {0};
    if (print_config) {
        neox_config_options opts = {.world_size = world_size ? world_size : neox_launcher_world_size(), .quiet = quiet};
        if (neox_config_print_files((const char *const *)argv + optind, argc - optind, &opts, print_format, stdout,
                                    &err) != 0)
            neox_die_error(&err);
        return 0;
    }
    if (world_size) neox_usage_error("--world-size is only for --print-config; the MPI launcher sets the ranks");
    return train(argc - optind, (const char *const *)argv + optind, quiet, &argc, &argv);
}
