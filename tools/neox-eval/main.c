// neox-eval: perplexity, task scores and generation from checkpoints. This file parses the command
// line and dispatches; the evaluation code is in lib/.
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s [OPTION]...\n"
            "Evaluate neox.c checkpoints: perplexity, tasks, generation.\n"
            "\n"
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
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "hV", options, NULL)) != -1) {
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'V': neox_print_version(stdout); return 0;
        default: neox_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    neox_usage_error("nothing to do");
}
