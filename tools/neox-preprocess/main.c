// neox-preprocess: text -> token ids -> Megatron .bin/.idx datasets, plus tokenizer subcommands.
// This file dispatches on the first argument; each subcommand lives in its own file here, and
// the tokenizers and dataset code are in lib/.
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core.h"
#include "version.h"

// Subcommands register here as they are written: {"name", "one-line summary", function}.
static const preprocess_command commands[] = {
    {"encode", "print the token ids of text", command_encode},
    {"decode", "print the text of token ids", command_decode},
    {"train-tokenizer", "train a byte-level BPE tokenizer.json", command_train_tokenizer},
    {"chat", "chat-formatted jsonl into token and label datasets (chat template, loss masks)", chat_main},
    {"mask", "token and label datasets, masked up to a delimiter (--mask-before-token)", mask_main},
    {"merge", "concatenate datasets, keeping document boundaries", merge_main},
    {"info", "describe a dataset and check .bin against .idx", info_main},
    {"index", "build GPT-NeoX's sample index caches (.npy) for training settings", index_main},
    {NULL, NULL, NULL},
};

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s --input PATHS --output-prefix PREFIX --tokenizer-type TYPE [OPTION]...\n"
            "       %s COMMAND [OPTION]...\n"
            "Tokenize corpora into Megatron/GPT-NeoX .bin/.idx datasets.\n"
            "\n"
            "Commands:\n",
            neox_progname(), neox_progname());
    for (const preprocess_command *c = commands; c->name; c++) fprintf(out, "  %-17s %s\n", c->name, c->summary);
    fprintf(out,
            "\n"
            "Without a command, neox-preprocess tokenizes documents into {PREFIX}_{KEY}_document.bin/.idx\n"
            "with the flags of GPT-NeoX's tools/datasets/preprocess_data.py:\n");
    preprocess_options_help(out);
    fprintf(out,
            "\n"
            "  -h, --help         show this help (or COMMAND --help) and exit\n"
            "  -V, --version      show version, backends and library versions, and exit\n"
            "\n"
            "Exit status: 0 success, 1 runtime failure, 2 usage error.\n");
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_log_from_launcher();
    if (argc >= 2 && argv[1][0] != '-') {
        for (const preprocess_command *c = commands; c->name; c++)
            if (!strcmp(argv[1], c->name)) return c->run(argc - 1, argv + 1);
        neox_usage_error("unknown command '%s'", argv[1]);
    }
    // An option other than --help/--version first means the default mode, preprocess_data.py's.
    if (argc >= 2 && strcmp(argv[1], "-h") && strcmp(argv[1], "--help") && strcmp(argv[1], "-V") &&
        strcmp(argv[1], "--version"))
        return preprocess_main(argc, argv);
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
    neox_usage_error("no command given");
}
