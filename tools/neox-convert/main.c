// neox-convert: checkpoints between parallel layouts and to/from Hugging Face. This file parses the command
// line and dispatches; the conversions are in lib/convert (lib/convert.h).
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "convert.h"
#include "core.h"
#include "version.h"

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s COMMAND [OPTION]...\n"
            "Reshard, export, import, inspect and verify neox.c checkpoints.\n"
            "\n"
            "Commands (CKPT is a save directory holding 'latest', or one global_stepN directory):\n"
            "  to-hf --input CKPT --output DIR [--dtype fp32|bf16|fp16] [--max-shard-size BYTES]\n"
            "        [--pad-token-id ID]\n"
            "                     write a Hugging Face model folder (config.json, generation_config.json,\n"
            "                     model.safetensors or shards + index above BYTES (default 5G), tokenizer files);\n"
            "                     a reward model (train_impl rm) as ...ForSequenceClassification; ID is\n"
            "                     config.json's pad_token_id (default: the tokenizer's pad token, if any)\n"
            "  from-hf --input DIR --output SAVE [--tp N] [--pp M]\n"
            "                     import a GPTNeoXForCausalLM or LlamaForCausalLM safetensors folder as a\n"
            "                     checkpoint in SAVE (global_step0 + latest) and SAVE/model.yml\n"
            "  from-neox --input DIR --config CONFIG.yml [--config MORE.yml]... --output SAVE\n"
            "        [--tp N] [--pp M] [--dp K] [--zero S]\n"
            "                     import a GPT-NeoX (DeepSpeed) checkpoint (global_stepN, or the save directory\n"
            "                     its 'latest' names) with the run's YAML configs: weights, fp32 master\n"
            "                     weights, Adam moments, schedule, loss scaler and data position, from which\n"
            "                     neox-train continues\n"
            "  to-neox --input CKPT --output DIR [--tp N] [--pp M] [--dp K] [--zero 1|2]\n"
            "        [--mlp-names dense_h_to_4h|linear1] [--inv-freq]\n"
            "                     write GPT-NeoX's DeepSpeed checkpoint (DIR/global_stepN/*.pt + DIR/latest):\n"
            "                     the module per tensor-parallel rank (with --pp: per pipeline layer, as\n"
            "                     pipe_parallel_size M writes it), ZeRO partitions per data-parallel rank;\n"
            "                     the MLP as GPT-NeoX until September 2024 (dense_h_to_4h, the default) or\n"
            "                     since (linear1) names it; --inv-freq adds the rotary inv_freq buffers\n"
            "                     (for GPT-NeoX with rotary_save_freqs_buffer true)\n"
            "  inspect CKPT       layout, iteration, tokens seen, model, every tensor with shape, norm, CRC-32\n"
            "  verify CKPT        completeness, checksums and metadata; exit 0 when sound, 1 when not\n"
            "  reshard --input CKPT --output SAVE [--tp N] [--pp M] [--dp K] [--zero S]\n"
            "                     write the checkpoint laid out for another parallel layout\n"
            "\n"
            "  --print-config CONFIG.yml [MORE.yml]...\n"
            "                     print every configuration key of the merged configs, its effective\n"
            "                     value and where it came from, then exit (as neox-train does)\n"
            "  --print-config-format FORMAT   'text' (default) or 'json'\n"
            "  -h, --help         show this help and exit\n"
            "  -V, --version      show version, backends and library versions, and exit\n"
            "\n"
            "Outputs are written under a temporary name and renamed when complete; an existing output is refused.\n"
            "Exit status: 0 success, 1 runtime failure, 2 usage error.\n",
            neox_progname());
}

typedef struct args {
    const char *input, *output, *dtype;
    unsigned long long max_shard;
    long long pad_token_id;  // -1: not given
    neox_cvt_layout layout;
    int pp_given;             // to-neox: --pp writes pipeline layer files, none the module files
    neox_to_neox_options to_neox;
    const char *configs[64];  // from-neox's --config files, in order
    int nconfigs;
} args;

static unsigned long long byte_size(const char *value) {
    char *end;
    double v = strtod(value, &end);
    double unit = !*end ? 1 : !strcmp(end, "K") ? 1e3 : !strcmp(end, "M") ? 1e6 : !strcmp(end, "G") ? 1e9 : -1;
    if (v <= 0 || unit < 0) neox_usage_error("--max-shard-size: '%s' is not a size (BYTES, or with K, M or G)", value);
    return (unsigned long long)(v * unit);
}

// Parses the options of a subcommand (argv[0] is the subcommand); positional arguments stay in argv[optind..].
static args parse_command(int argc, char **argv) {
    static const struct option options[] = {
        {"input", required_argument, NULL, 'i'}, {"output", required_argument, NULL, 'o'},
        {"dtype", required_argument, NULL, 'd'}, {"max-shard-size", required_argument, NULL, 's'},
        {"tp", required_argument, NULL, 't'},    {"pp", required_argument, NULL, 'p'},
        {"dp", required_argument, NULL, 'D'},    {"zero", required_argument, NULL, 'z'},
        {"pad-token-id", required_argument, NULL, 'P'}, {"config", required_argument, NULL, 'c'},
        {"mlp-names", required_argument, NULL, 'm'}, {"inv-freq", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
    };
    args a = {.layout = {1, 1, 1, 0}, .pad_token_id = -1};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case 'i': a.input = optarg; break;
        case 'o': a.output = optarg; break;
        case 'd': a.dtype = optarg; break;
        case 's': a.max_shard = byte_size(optarg); break;
        case 't': a.layout.tp = (int)neox_option_int("--tp", optarg, 1, 1 << 20); break;
        case 'p': a.layout.pp = (int)neox_option_int("--pp", optarg, 1, 1 << 20), a.pp_given = 1; break;
        case 'D': a.layout.dp = (int)neox_option_int("--dp", optarg, 1, 1 << 20); break;
        case 'z': a.layout.zero = (int)neox_option_int("--zero", optarg, 0, 3); break;
        case 'm':
            if (strcmp(optarg, "dense_h_to_4h") != 0 && strcmp(optarg, "linear1") != 0)
                neox_usage_error("--mlp-names: '%s' is not dense_h_to_4h or linear1", optarg);
            a.to_neox.mlp_names = optarg;
            break;
        case 'f': a.to_neox.inv_freq = 1; break;
        case 'P': a.pad_token_id = neox_option_int("--pad-token-id", optarg, 0, (1LL << 31) - 1); break;
        case 'c':
            if (a.nconfigs == (int)(sizeof a.configs / sizeof a.configs[0])) neox_usage_error("--config: too many files");
            a.configs[a.nconfigs++] = optarg;
            break;
        case 'h': usage(stdout); exit(0);
        default: neox_usage_error("%s: unrecognized option '%s'", argv[0], argv[optind - 1]);
        }
    }
    return a;
}

static void need_io(const args *a, const char *command) {
    if (!a->input) neox_usage_error("%s: --input is required", command);
    if (!a->output) neox_usage_error("%s: --output is required", command);
}

// inspect and verify take the checkpoint as their one positional argument (or --input).
static const char *checkpoint_arg(const args *a, int argc, char **argv, const char *command) {
    if (a->input && optind == argc) return a->input;
    if (optind != argc - 1) neox_usage_error("%s: give exactly one checkpoint", command);
    return argv[optind];
}

static int run_command(int argc, char **argv) {
    const char *command = argv[0];
    args a = parse_command(argc, argv);
    neox_error err = {0};
    int rc;
    if (strcmp(command, "to-neox") != 0 && (a.to_neox.mlp_names || a.to_neox.inv_freq))
        neox_usage_error("%s: --mlp-names and --inv-freq are to-neox's options", command);
    if (!strcmp(command, "to-hf")) {
        need_io(&a, command);
        neox_to_hf_options o = {.dtype = a.dtype, .max_shard_bytes = a.max_shard, .pad_token_id = a.pad_token_id};
        rc = neox_convert_to_hf(a.input, a.output, &o, &err);
    } else if (!strcmp(command, "inspect")) {
        rc = neox_convert_inspect(checkpoint_arg(&a, argc, argv, command), stdout, &err);
    } else if (!strcmp(command, "verify")) {
        rc = neox_convert_verify(checkpoint_arg(&a, argc, argv, command), stdout, &err);
    } else if (!strcmp(command, "from-hf")) {
        need_io(&a, command);
        rc = neox_convert_from_hf(a.input, a.output, &a.layout, &err);
    } else if (!strcmp(command, "from-neox")) {
        need_io(&a, command);
        if (!a.nconfigs) neox_usage_error("from-neox: --config is required (the run's GPT-NeoX YAML configs)");
        rc = neox_convert_from_neox(a.input, a.configs, a.nconfigs, a.output, &a.layout, &err);
    } else if (!strcmp(command, "to-neox")) {
        need_io(&a, command);
        if (!a.pp_given) a.layout.pp = 0;
        rc = neox_convert_to_neox(a.input, a.output, &a.layout, &a.to_neox, &err);
    } else if (!strcmp(command, "reshard")) {
        need_io(&a, command);
        rc = neox_convert_reshard(a.input, a.output, &a.layout, &err);
    } else {
        neox_usage_error("unknown command '%s' (to-hf, from-hf, from-neox, to-neox, inspect, verify, reshard)", command);
    }
    if (rc != 0) neox_die_error(&err);
    return 0;
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_log_from_launcher();
    if (argc > 1 && argv[1][0] != '-') return run_command(argc - 1, argv + 1);
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
    neox_usage_error("nothing to do (give a command: to-hf, from-hf, from-neox, to-neox, inspect, verify, reshard)");
}
