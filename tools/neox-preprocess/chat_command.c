// chat_command.c: neox-preprocess chat, the flags of GPT-NeoX's
// tools/datasets/preprocess_data_with_chat_template.py (the work is lib/data/chat_data.c's).
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "data.h"

static void chat_usage(FILE *out) {
    fprintf(out,
            "Usage: %s chat --input PATHS --output-prefix PREFIX --tokenizer-type HFTokenizer --vocab-file FILE\n"
            "       [OPTION]...\n"
            "Render chat-formatted jsonl with the tokenizer's chat template into {PREFIX}_{KEY}_document and\n"
            "the label dataset {PREFIX}_{KEY}_label_document (-100 where the loss is masked), as GPT-NeoX's\n"
            "tools/datasets/preprocess_data_with_chat_template.py does.\n\n"
            "  --input PATHS          comma-separated .jsonl, .jsonl.zst, .jsonl.gz files and directories\n"
            "  --jsonl-keys KEY...    fields holding lists of {\"role\", \"content\"} messages (default: conversation)\n"
            "  --tokenizer-type TYPE  GPT2BPETokenizer, HFTokenizer, HFGPT2Tokenizer\n"
            "  --vocab-file FILE      the tokenizer.json (its folder's tokenizer_config.json gives the chat\n"
            "                         template and the bos/eos tokens)\n"
            "  --merge-file FILE      merges.txt (GPT2BPETokenizer)\n"
            "  --chat-template FILE   a Jinja chat template replacing tokenizer_config.json's\n"
            "  --generation-role R    the role whose turns are learned (default: assistant)\n"
            "  --only-last            learn only the last turn\n"
            "  --no-mask              learn every token\n"
            "  --for-rm               learn only a final end-of-sequence token (reward-model data)\n"
            "  --reward-key KEY       also write {PREFIX}_{KEY}_reward_document: each record's reward (KTO)\n"
            "  --binary-reward        the reward's truth as 1 or -1\n"
            "  --output-prefix PREFIX output path prefix\n"
            "  --dataset-impl mmap    the only format written\n"
            "  --max-document-bytes N longest record read, decoded (default 268435456)\n"
            "  --ftfy                 refused: ftfy is a Python library; fix the text before preprocessing\n"
            "  -h, --help             show this help and exit\n",
            neox_progname());
}

typedef struct chat_args {
    const char *input, *template_file, *dataset_impl;
    const char **keys;
    neox_tokenizer_options tok;
    neox_chat_preprocess_options o;
    long max_document_bytes;
} chat_args;

static const char *const refused_options[][2] = {
    {"ftfy", "ftfy is a Python library; fix the text before preprocessing"},
};

static void parse_chat(int argc, char **argv, chat_args *a) {
    enum { O_INPUT = 256, O_KEYS, O_TYPE, O_VOCAB, O_MERGE, O_TEMPLATE, O_ROLE, O_ONLY_LAST, O_NO_MASK, O_FOR_RM,
           O_PREFIX, O_IMPL, O_MAX_DOC, O_REWARD, O_BINARY, O_REFUSED };
    static const struct option options[] = {
        {"input", required_argument, NULL, O_INPUT}, {"jsonl-keys", required_argument, NULL, O_KEYS},
        {"tokenizer-type", required_argument, NULL, O_TYPE}, {"vocab-file", required_argument, NULL, O_VOCAB},
        {"merge-file", required_argument, NULL, O_MERGE}, {"chat-template", required_argument, NULL, O_TEMPLATE},
        {"generation-role", required_argument, NULL, O_ROLE}, {"only-last", no_argument, NULL, O_ONLY_LAST},
        {"no-mask", no_argument, NULL, O_NO_MASK}, {"for-rm", no_argument, NULL, O_FOR_RM},
        {"output-prefix", required_argument, NULL, O_PREFIX}, {"dataset-impl", required_argument, NULL, O_IMPL},
        {"max-document-bytes", required_argument, NULL, O_MAX_DOC},
        {"reward-key", required_argument, NULL, O_REWARD}, {"binary-reward", no_argument, NULL, O_BINARY},
        {"ftfy", no_argument, NULL, O_REFUSED}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    *a = (chat_args){.dataset_impl = "mmap", .o.generation_role = "assistant"};
    int c, nkeys = 0, index = 0;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", options, &index)) != -1) {
        switch (c) {
        case O_INPUT: a->input = optarg; break;
        case O_KEYS:  // nargs="+": this value and every following argument up to the next option
            nkeys = 0;
            a->keys = neox_realloc(a->keys, (size_t)argc * sizeof *a->keys);
            a->keys[nkeys++] = optarg;
            while (optind < argc && argv[optind][0] != '-') a->keys[nkeys++] = argv[optind++];
            break;
        case O_TYPE: a->tok.type = optarg; break;
        case O_VOCAB: a->tok.vocab_file = optarg; break;
        case O_MERGE: a->tok.merge_file = optarg; break;
        case O_TEMPLATE: a->template_file = optarg; break;
        case O_ROLE: a->o.generation_role = optarg; break;
        case O_ONLY_LAST: a->o.only_last = 1; break;
        case O_NO_MASK: a->o.no_mask = 1; break;
        case O_FOR_RM: a->o.for_rm = 1; break;
        case O_REWARD: a->o.reward_key = optarg; break;
        case O_BINARY: a->o.binary_reward = 1; break;
        case O_PREFIX: a->o.output_prefix = optarg; break;
        case O_IMPL: a->dataset_impl = optarg; break;
        case O_MAX_DOC: a->max_document_bytes = neox_option_int("--max-document-bytes", optarg, 1, INT64_MAX); break;
        case O_REFUSED:
            for (size_t i = 0; i < sizeof refused_options / sizeof *refused_options; i++)
                if (!strcmp(options[index].name, refused_options[i][0]))
                    neox_usage_error("--%s is not supported: %s", refused_options[i][0], refused_options[i][1]);
            break;
        case 'h': chat_usage(stdout); exit(0);
        case ':': neox_usage_error("option '%s' needs a value", argv[optind - 1]);
        default: neox_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) neox_usage_error("unexpected argument '%s'", argv[optind]);
    if (!a->input) neox_usage_error("chat: --input is required");
    if (!a->o.output_prefix) neox_usage_error("chat: --output-prefix is required");
    if (!a->tok.type || !a->tok.vocab_file) neox_usage_error("chat: --tokenizer-type and --vocab-file are required");
    if (strcmp(a->dataset_impl, "mmap") != 0)
        neox_usage_error("--dataset-impl %s is not supported: only mmap datasets are written", a->dataset_impl);
    if (a->o.binary_reward && !a->o.reward_key) neox_usage_error("chat: --binary-reward reads the --reward-key field; give it");
    if (a->o.no_mask + a->o.for_rm + a->o.only_last > 1) neox_usage_error("chat: --no-mask, --for-rm and --only-last exclude each other");
    if (!a->keys) {
        a->keys = neox_malloc(sizeof *a->keys);
        a->keys[nkeys++] = "conversation";
    }
    a->o.keys = a->keys;
    a->o.nkeys = nkeys;
    a->o.max_document_bytes = (size_t)a->max_document_bytes;
}

int chat_main(int argc, char **argv) {
    chat_args a;
    parse_chat(argc, argv, &a);
    neox_error err = {0};
    neox_tokenizer *tok = neox_tokenizer_load(&a.tok, &err);
    if (!tok) neox_die_error(&err);
    neox_chat_format format;
    if (neox_chat_format_load(&format, tok, a.tok.vocab_file, a.template_file, &err) != 0) neox_die_error(&err);
    int ninputs;
    char **inputs = split_commas(a.input, &ninputs);
    if (ninputs == 0) neox_usage_error("--input: no paths given");
    a.o.inputs = (const char *const *)inputs;
    a.o.ninputs = ninputs;
    a.o.tok = tok;
    a.o.format = &format;
    neox_preprocess_stats st;
    int rc = neox_chat_preprocess_run(&a.o, &st, &err);
    if (rc == 0) {
        neox_info("%lld conversations, %lld tokens", (long long)st.documents, (long long)st.tokens);
        for (int k = 0; k < a.o.nkeys; k++)
        {
            neox_info("wrote %s_%s_document.bin/.idx and %s_%s_label_document.bin/.idx", a.o.output_prefix, a.keys[k],
                      a.o.output_prefix, a.keys[k]);
            if (a.o.reward_key) neox_info("wrote %s_%s_reward_document.bin/.idx", a.o.output_prefix, a.keys[k]);
        }
    }
    for (int i = 0; i < ninputs; i++) free(inputs[i]);
    free(inputs);
    free(a.keys);
    neox_chat_format_free(&format);
    neox_tokenizer_free(tok);
    if (rc != 0) neox_die_error(&err);
    return 0;
}
