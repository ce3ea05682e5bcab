// neox-eval: perplexity, task scores and generation from checkpoints. This file parses the command
// line and dispatches; the evaluation code is in lib/.
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core.h"

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s [OPTION]...\n"
            "Evaluate neox.c checkpoints: perplexity, tasks, generation.\n"
            "\n"
            "  --print-config CONFIG.yml [MORE.yml]...\n"
            "                     print every configuration key of the merged configs, its effective\n"
            "                     value and where it came from, then exit (as neox-train does)\n"
            "  --print-config-format FORMAT   'text' (default) or 'json'\n"
            "  -h, --help         show this help and exit\n"
            "  -V, --version      show version, backends and library versions, and exit\n"
            "\n"
            "Exit status: 0 success, 1 runtime failure, 2 usage error.\n",
            neox_progname());
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_log_from_launcher();
    static const struct option options[] = {
        {"print-config", no_argument, NULL, 'P'},
        {"print-config-format", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int c, print_config = 0;
    const char *print_format = "text";
    opterr = 0;
    while ((c = getopt_long(argc, argv, "hV", options, NULL)) != -1) {
        switch (c) {
        case 'P': print_config = 1; break;
        case 'F': print_format = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'V': neox_print_version(stdout); return 0;
        default: neox_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (print_config) {
        if (optind >= argc) neox_usage_error("--print-config: no config file given");
        neox_error err = {0};
        neox_config_options opts = {.world_size = 1};
        if (neox_config_print_files((const char *const *)argv + optind, argc - optind, &opts, print_format, stdout, &err) < 0)
            neox_die_error(&err);
        return 0;
    }
    neox_usage_error("nothing to do");
}
