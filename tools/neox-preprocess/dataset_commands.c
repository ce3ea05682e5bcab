// dataset_commands.c: the dataset commands of neox-preprocess — the default mode (the flags of
// GPT-NeoX's tools/datasets/preprocess_data.py), `merge` (merge_datasets.py, keeping doc_idx) and
// `info`. Argument parsing and reporting only; the work is in lib/data.
#include <math.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "config.h"
#include "core.h"
#include "data.h"
#include "tokenizer.h"

// ---------------------------------------------------------------------------------------------
// preprocess (default mode)

void preprocess_options_help(FILE *out) {
    fprintf(out,
            "Input:\n"
            "  --input PATHS          comma-separated .jsonl, .jsonl.zst, .jsonl.gz, .txt files and directories\n"
            "                         (walked recursively in sorted order); '-' reads jsonl from stdin\n"
            "  --jsonl-keys KEY...    jsonl fields to tokenize, each into its own dataset (default: text)\n"
            "  --num-docs N           documents in the input, for the progress ETA\n"
            "  --skip-invalid         skip and count malformed records instead of failing\n"
            "  --max-document-bytes N longest document read, decoded (default 268435456, 256 MiB);\n"
            "                         a longer one is an error naming its file and line\n"
            "Tokenizer:\n"
            "  --tokenizer-type TYPE  GPT2BPETokenizer, HFTokenizer, HFGPT2Tokenizer, CharLevelTokenizer\n"
            "  --vocab-file FILE      vocab.json, or the tokenizer.json of an HFTokenizer\n"
            "  --merge-file FILE      merges.txt (GPT2BPETokenizer)\n"
            "  --append-eod           append the end-of-document token to every document\n"
            "  --ftfy                 refused: ftfy is a Python library with no C counterpart\n"
            "Output:\n"
            "  --output-prefix PREFIX output path prefix\n"
            "  --dataset-impl mmap    the only format written (lazy and cached are legacy)\n"
            "  --mask-before-token IDS  (one key) also write {PREFIX}_label_document: each document's ids with\n"
            "                         those up to and including the first occurrence of the comma-separated\n"
            "                         ids masked (-100), as preprocess_data_with_mask.py; int32 datasets\n"
            "Runtime:\n"
            "  --workers N            tokenizing threads (default 1); output is identical for any N\n"
            "  --log-interval N       documents between progress updates (default 100)\n");
}

static void preprocess_usage(FILE *out) {
    fprintf(out,
            "Usage: %s --input PATHS --output-prefix PREFIX --tokenizer-type TYPE [OPTION]...\n"
            "Tokenize documents into Megatron .bin/.idx datasets, {PREFIX}_{KEY}_document.{bin,idx}\n"
            "(the flags of GPT-NeoX's tools/datasets/preprocess_data.py).\n\n",
            neox_progname());
    preprocess_options_help(out);
    fprintf(out, "  -h, --help             show this help and exit\n");
}

char **split_commas(const char *list, int *count) {
    char *copy = neox_strdup(list), *save = NULL;
    char **out = NULL;
    *count = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        out = neox_realloc(out, (size_t)(*count + 1) * sizeof *out);
        out[(*count)++] = neox_strdup(t);
    }
    free(copy);
    return out;
}

static int64_t encode_with(void *ctx, const char *text, size_t size, int32_t **ids, size_t *len, size_t *cap,
                           neox_error *err) {
    return neox_tokenizer_encode(ctx, text, size, ids, len, cap, err);
}

static size_t cut_with(void *ctx, const char *text, size_t size, size_t piece_bytes, size_t *cuts, size_t max_cuts) {
    return neox_tokenizer_cuts(ctx, text, size, piece_bytes, cuts, max_cuts);
}

static int64_t encode_piece_with(void *ctx, const char *text, size_t size, int starts, int ends, int32_t **ids,
                                 size_t *len, size_t *cap, neox_error *err) {
    return neox_tokenizer_encode_piece(ctx, text, size, starts, ends, ids, len, cap, err);
}

typedef struct preprocess_args {
    const char *input, *output_prefix, *dataset_impl;
    const char **keys;
    int nkeys;
    neox_tokenizer_options tok;
    int append_eod, workers, skip_invalid;
    long num_docs, log_interval, max_document_bytes;
    int32_t *mask_before;  // --mask-before-token
    int mask_before_len;
} preprocess_args;

// --mask-before-token X,Y,Z: token ids (each a non-negative integer).
static void parse_mask_pattern(const char *list, preprocess_args *a) {
    int n;
    char **items = split_commas(list, &n);
    if (n == 0) neox_usage_error("--mask-before-token: no token ids given");
    a->mask_before = neox_malloc((size_t)n * sizeof *a->mask_before);
    for (int i = 0; i < n; i++) {
        a->mask_before[i] = (int32_t)neox_option_int("--mask-before-token", items[i], 0, INT32_MAX);
        free(items[i]);
    }
    free(items);
    a->mask_before_len = n;
}

static void parse_preprocess(int argc, char **argv, preprocess_args *a) {
    enum { O_INPUT = 256, O_KEYS, O_NUM_DOCS, O_TYPE, O_VOCAB, O_MERGE, O_EOD, O_FTFY, O_PREFIX, O_IMPL, O_WORKERS,
           O_LOG, O_SKIP, O_MAX_DOC, O_MASK };
    static const struct option options[] = {
        {"input", required_argument, NULL, O_INPUT}, {"jsonl-keys", required_argument, NULL, O_KEYS},
        {"num-docs", required_argument, NULL, O_NUM_DOCS}, {"tokenizer-type", required_argument, NULL, O_TYPE},
        {"vocab-file", required_argument, NULL, O_VOCAB}, {"merge-file", required_argument, NULL, O_MERGE},
        {"append-eod", no_argument, NULL, O_EOD}, {"ftfy", no_argument, NULL, O_FTFY},
        {"output-prefix", required_argument, NULL, O_PREFIX}, {"dataset-impl", required_argument, NULL, O_IMPL},
        {"workers", required_argument, NULL, O_WORKERS}, {"log-interval", required_argument, NULL, O_LOG},
        {"skip-invalid", no_argument, NULL, O_SKIP}, {"max-document-bytes", required_argument, NULL, O_MAX_DOC},
        {"mask-before-token", required_argument, NULL, O_MASK}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    *a = (preprocess_args){.dataset_impl = "mmap", .workers = 1, .log_interval = 100};
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        switch (c) {
        case O_INPUT: a->input = optarg; break;
        case O_KEYS:  // nargs="+": this value and every following argument up to the next option
            a->nkeys = 0;
            a->keys = neox_realloc(a->keys, (size_t)argc * sizeof *a->keys);
            a->keys[a->nkeys++] = optarg;
            while (optind < argc && argv[optind][0] != '-') a->keys[a->nkeys++] = argv[optind++];
            break;
        case O_NUM_DOCS: a->num_docs = neox_option_int("--num-docs", optarg, 0, INT64_MAX); break;
        case O_TYPE: a->tok.type = optarg; break;
        case O_VOCAB: a->tok.vocab_file = optarg; break;
        case O_MERGE: a->tok.merge_file = optarg; break;
        case O_EOD: a->append_eod = 1; break;
        case O_FTFY: neox_usage_error("--ftfy is not supported: ftfy is a Python library; fix the text before preprocessing");
        case O_PREFIX: a->output_prefix = optarg; break;
        case O_IMPL: a->dataset_impl = optarg; break;
        case O_WORKERS: a->workers = (int)neox_option_int("--workers", optarg, 1, 4096); break;
        case O_LOG: a->log_interval = neox_option_int("--log-interval", optarg, 1, INT64_MAX); break;
        case O_SKIP: a->skip_invalid = 1; break;
        case O_MAX_DOC: a->max_document_bytes = neox_option_int("--max-document-bytes", optarg, 1, INT64_MAX); break;
        case O_MASK: free(a->mask_before); parse_mask_pattern(optarg, a); break;
        case 'h': preprocess_usage(stdout); exit(0);
        case ':': neox_usage_error("option '%s' needs a value", argv[optind - 1]);
        default: neox_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) neox_usage_error("unexpected argument '%s'", argv[optind]);
    if (!a->input) neox_usage_error("--input is required");
    if (!a->output_prefix) neox_usage_error("--output-prefix is required");
    if (!a->tok.type) neox_usage_error("--tokenizer-type is required");
    if (strcmp(a->dataset_impl, "mmap") != 0)
        neox_usage_error("--dataset-impl %s is not supported: only mmap datasets are written", a->dataset_impl);
    if (a->workers > 256) neox_usage_error("--workers: at most 256");
    if (!a->keys) {
        static const char *text_key[] = {"text"};
        a->keys = neox_malloc(sizeof *a->keys);
        a->keys[0] = text_key[0];
        a->nkeys = 1;
    }
}

static void print_summary(const preprocess_args *a, const neox_preprocess_stats *st) {
    char t[16];
    neox_info("%lld documents, %lld tokens, %lld empty documents skipped, %lld invalid records skipped, %.1f MB of text "
              "in %s (%.0f docs/s, %.2f MB/s)",
              (long long)st->documents, (long long)st->tokens, (long long)st->skipped_empty, (long long)st->skipped_invalid,
              st->text_bytes / 1e6, neox_format_duration(st->seconds, t, sizeof t), st->documents / (st->seconds + 1e-9),
              st->text_bytes / 1e6 / (st->seconds + 1e-9));
    for (int k = 0; k < a->nkeys; k++) neox_info("wrote %s_%s_document.bin/.idx", a->output_prefix, a->keys[k]);
    if (a->mask_before_len > 0) neox_info("wrote %s_label_document.bin/.idx", a->output_prefix);
}

int preprocess_main(int argc, char **argv) {
    preprocess_args a;
    parse_preprocess(argc, argv, &a);
    neox_error err = {0};
    neox_tokenizer *tok = neox_tokenizer_load(&a.tok, &err);
    if (!tok) neox_die_error(&err);
    int ninputs;
    char **inputs = split_commas(a.input, &ninputs);
    if (ninputs == 0) neox_usage_error("--input: no paths given");
    neox_preprocess_options o = {
        .inputs = (const char *const *)inputs, .ninputs = ninputs, .keys = a.keys, .nkeys = a.nkeys,
        .output_prefix = a.output_prefix, .encode = encode_with, .encode_ctx = tok,
        .cut = cut_with, .encode_piece = encode_piece_with,
        .vocab_size = neox_tokenizer_vocab_size(tok), .eod_id = neox_tokenizer_eod_id(tok), .append_eod = a.append_eod,
        .workers = a.workers, .skip_invalid = a.skip_invalid, .num_docs = a.num_docs, .log_interval = a.log_interval,
        .max_document_bytes = (size_t)a.max_document_bytes, .mask_before = a.mask_before,
        .mask_before_len = a.mask_before_len,
    };
    neox_preprocess_stats st;
    int rc = neox_preprocess_run(&o, &st, &err);
    if (rc == 0) print_summary(&a, &st);
    for (int i = 0; i < ninputs; i++) free(inputs[i]);
    free(inputs);
    free(a.keys);
    free(a.mask_before);
    neox_tokenizer_free(tok);
    if (rc != 0) neox_die_error(&err);
    return 0;
}

// `mask`: preprocess_data_with_mask.py, the default mode with --mask-before-token required.
int mask_main(int argc, char **argv) {
    int given = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--mask-before-token") || !strncmp(argv[i], "--mask-before-token=", 20) ||
            !strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            given = 1;
    if (!given) neox_usage_error("mask: --mask-before-token IDS is required (the ids of the delimiter, e.g. from 'encode')");
    return preprocess_main(argc, argv);
}

// ---------------------------------------------------------------------------------------------
// merge

int merge_main(int argc, char **argv) {
    static const struct option options[] = {
        {"output-prefix", required_argument, NULL, 'o'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":o:h", options, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'h':
            printf("Usage: %s merge --output-prefix OUT PREFIX...\n"
                   "Concatenate indexed datasets (e.g. the shards of a job array) in the order given, keeping each\n"
                   "document boundary (doc_idx), into OUT.bin/.idx.\n"
                   "  --output-prefix OUT    the merged dataset's path prefix\n"
                   "  -h, --help             show this help and exit\n",
                   neox_progname());
            return 0;
        case ':': neox_usage_error("option '%s' needs a value", argv[optind - 1]);
        default: neox_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (!out) neox_usage_error("merge: --output-prefix is required");
    if (optind >= argc) neox_usage_error("merge: no input datasets given");
    neox_error err = {0};
    neox_indexed_writer *w = NULL;
    for (int i = optind; i < argc; i++) {
        neox_indexed_dataset *ds = neox_indexed_open(argv[i], &err);
        if (ds && !w) w = neox_indexed_writer_open(out, ds->dtype, &err);
        int rc = ds && w ? neox_indexed_writer_append(w, ds, &err) : -1;
        neox_indexed_close(ds);
        if (rc != 0) {
            neox_indexed_writer_abort(w);
            neox_die_error(&err);
        }
    }
    int64_t items = neox_indexed_writer_items(w), tokens = neox_indexed_writer_tokens(w);
    if (neox_indexed_writer_commit(w, &err) != 0) neox_die_error(&err);
    neox_info("merged %d datasets into %s.bin/.idx: %lld documents, %lld tokens", argc - optind, out, (long long)items,
              (long long)tokens);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// info

static int compare_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int info_main(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("Usage: %s info PREFIX...\n"
               "Describe indexed datasets PREFIX.bin/.idx and check that the two files agree.\n",
               neox_progname());
        return 0;
    }
    if (argc < 2) neox_usage_error("info: no dataset given");
    for (int i = 1; i < argc; i++) {
        neox_error err = {0};
        neox_indexed_dataset *ds = neox_indexed_open(argv[i], &err);
        if (!ds) neox_die_error(&err);
        int32_t *sorted = neox_malloc((size_t)ds->num_items * sizeof *sorted + 1);
        memcpy(sorted, ds->sizes, (size_t)ds->num_items * sizeof *sorted);
        qsort(sorted, (size_t)ds->num_items, sizeof *sorted, compare_i32);
        int64_t n = ds->num_items;
        printf("dataset:     %s\n", argv[i]);
        printf("dtype:       %s (%zu bytes per token)\n", neox_index_dtype_name(ds->dtype), ds->elem_size);
        printf("items:       %lld\n", (long long)n);
        printf("documents:   %lld\n", (long long)(ds->num_doc_idx - 1));
        printf("tokens:      %lld\n", (long long)ds->total_tokens);
        if (n > 0)
            printf("item length: min %d, median %d, mean %.1f, p99 %d, max %d\n", sorted[0], sorted[n / 2],
                   (double)ds->total_tokens / (double)n, sorted[(n * 99) / 100], sorted[n - 1]);
        printf("bin bytes:   %zu\n", ds->bin_size);
        printf("check:       ok (.idx and .bin agree)\n");
        free(sorted);
        neox_indexed_close(ds);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// index: build GPT-NeoX's sample index caches ahead of training (and show the first samples)

static double *parse_doubles(const char *flag, const char *list, int *count) {
    char **parts = split_commas(list, count);
    double *out = neox_malloc((size_t)(*count + 1) * sizeof *out);
    for (int i = 0; i < *count; i++) {
        char *end;
        out[i] = strtod(parts[i], &end);
        if (end == parts[i] || *end) neox_usage_error("%s: '%s' is not a number", flag, parts[i]);
        free(parts[i]);
    }
    free(parts);
    return out;
}

static void index_usage(void) {
    printf("Usage: %s index (--data-path PREFIX [--split S] | --train-data-paths P,... --valid-data-paths P,...\n"
           "       --test-data-paths P,... [--train-data-weights W,...] ...) --seq-length N --train-iters N\n"
           "       --train-batch-size N [OPTION]...\n"
           "Build the doc_idx/sample_idx/shuffle_idx .npy caches GPT-NeoX (and neox-train) use for these\n"
           "settings, next to the data, exactly as GPT-NeoX would name and fill them.\n"
           "  --seed N (1234)  --eval-interval N (1000)  --eval-iters N (100)  --split S (969, 30, 1)\n"
           "  --pack-impl packed|pack_until_overflow|unpacked  --no-allow-chopped\n"
           "  --weight-by-num-documents  --weighted-sampler-alpha A (1.0)\n"
           "  --valid-data-weights W,...  --test-data-weights W,...\n"
           "  --dump-samples K   print the first K training samples (token ids, one per line) to stdout\n"
           "Pairwise (DPO) data: the *-data-paths above are the chosen side, and\n"
           "  --neg-train-data-paths P,...  --neg-valid-data-paths P,...  --neg-test-data-paths P,...\n"
           "  the rejected side; --neg-train-label-data-paths P,... its labels (with --train-label-data-paths,\n"
           "  the training data's labels, which pack_until_overflow and unpacked read to skip documents\n"
           "  whose labels are all masked). --dump-samples then prints each sample's chosen and rejected rows.\n"
           "KTO data: --train-reward-data-paths P,... one reward dataset per training data path (pack-impl\n"
           "  unpacked); --dump-samples then prints each sample's token row and its reward row.\n"
           "  -h, --help   show this help and exit\n",
           neox_progname());
}

int index_main(int argc, char **argv) {
    enum { O_DATA = 256, O_SPLIT, O_TRAIN, O_VALID, O_TEST, O_TRAIN_W, O_VALID_W, O_TEST_W, O_SEQ, O_SEED, O_ITERS,
           O_EVAL_INT, O_EVAL_ITERS, O_BATCH, O_PACK, O_NO_CHOP, O_BY_DOCS, O_ALPHA, O_DUMP, O_NEG_TRAIN, O_NEG_VALID,
           O_NEG_TEST, O_TRAIN_LABELS, O_NEG_TRAIN_LABELS, O_TRAIN_REWARDS };
    static const struct option options[] = {
        {"data-path", required_argument, NULL, O_DATA}, {"split", required_argument, NULL, O_SPLIT},
        {"train-data-paths", required_argument, NULL, O_TRAIN}, {"valid-data-paths", required_argument, NULL, O_VALID},
        {"test-data-paths", required_argument, NULL, O_TEST}, {"train-data-weights", required_argument, NULL, O_TRAIN_W},
        {"valid-data-weights", required_argument, NULL, O_VALID_W}, {"test-data-weights", required_argument, NULL, O_TEST_W},
        {"seq-length", required_argument, NULL, O_SEQ}, {"seed", required_argument, NULL, O_SEED},
        {"train-iters", required_argument, NULL, O_ITERS}, {"eval-interval", required_argument, NULL, O_EVAL_INT},
        {"eval-iters", required_argument, NULL, O_EVAL_ITERS}, {"train-batch-size", required_argument, NULL, O_BATCH},
        {"pack-impl", required_argument, NULL, O_PACK}, {"no-allow-chopped", no_argument, NULL, O_NO_CHOP},
        {"weight-by-num-documents", no_argument, NULL, O_BY_DOCS}, {"weighted-sampler-alpha", required_argument, NULL, O_ALPHA},
        {"dump-samples", required_argument, NULL, O_DUMP}, {"neg-train-data-paths", required_argument, NULL, O_NEG_TRAIN},
        {"neg-valid-data-paths", required_argument, NULL, O_NEG_VALID},
        {"neg-test-data-paths", required_argument, NULL, O_NEG_TEST},
        {"train-label-data-paths", required_argument, NULL, O_TRAIN_LABELS},
        {"neg-train-label-data-paths", required_argument, NULL, O_NEG_TRAIN_LABELS},
        {"train-reward-data-paths", required_argument, NULL, O_TRAIN_REWARDS},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    // The defaults are the config keys' (the schema's), as neox-train would read them.
    char *default_split = neox_key_default_str(NEOX_K_split);
    neox_data_settings s = {.split = default_split, .seed = (uint32_t)neox_key_default_int(NEOX_K_seed),
                            .eval_interval = neox_key_default_int(NEOX_K_eval_interval),
                            .eval_iters = neox_key_default_int(NEOX_K_eval_iters),
                            .allow_chopped = 1, .weighted_sampler_alpha = 1.0, .use_cache = 1};
    char **paths[3] = {NULL, NULL, NULL}, **neg[3] = {NULL, NULL, NULL}, **labels[2] = {NULL, NULL};
    int npaths[3] = {0, 0, 0}, nweights[3] = {0, 0, 0}, nneg[3] = {0, 0, 0}, nlabels[2] = {0, 0}, nrewards = 0;
    char **rewards = NULL;
    double *weights[3] = {NULL, NULL, NULL};
    long dump = 0;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        switch (c) {
        case O_DATA: s.data_path = optarg; break;
        case O_SPLIT: s.split = optarg; break;
        case O_TRAIN: case O_VALID: case O_TEST: paths[c - O_TRAIN] = split_commas(optarg, &npaths[c - O_TRAIN]); break;
        case O_TRAIN_W: case O_VALID_W: case O_TEST_W:
            weights[c - O_TRAIN_W] = parse_doubles(argv[optind - 1], optarg, &nweights[c - O_TRAIN_W]);
            break;
        case O_SEQ: s.seq_length = (int)neox_option_int("--seq-length", optarg, 1, INT32_MAX - 1); break;
        case O_SEED: s.seed = (uint32_t)neox_option_int("--seed", optarg, 0, UINT32_MAX); break;
        case O_ITERS: s.train_iters = neox_option_int("--train-iters", optarg, 0, INT64_MAX); break;
        case O_EVAL_INT: s.eval_interval = neox_option_int("--eval-interval", optarg, 1, INT64_MAX); break;
        case O_EVAL_ITERS: s.eval_iters = neox_option_int("--eval-iters", optarg, 0, INT64_MAX); break;
        case O_BATCH: s.train_batch_size = neox_option_int("--train-batch-size", optarg, 1, INT64_MAX); break;
        case O_PACK:
            if (neox_pack_impl_parse(optarg, &s.pack_impl) != 0)
                neox_usage_error("--pack-impl: '%s' is not packed, pack_until_overflow or unpacked", optarg);
            break;
        case O_NO_CHOP: s.allow_chopped = 0; break;
        case O_BY_DOCS: s.weight_by_num_documents = 1; break;
        case O_ALPHA: s.weighted_sampler_alpha = neox_option_number("--weighted-sampler-alpha", optarg, 0, INFINITY); break;
        case O_DUMP: dump = neox_option_int("--dump-samples", optarg, 0, INT64_MAX); break;
        case O_NEG_TRAIN: case O_NEG_VALID: case O_NEG_TEST: neg[c - O_NEG_TRAIN] = split_commas(optarg, &nneg[c - O_NEG_TRAIN]); break;
        case O_TRAIN_LABELS: case O_NEG_TRAIN_LABELS:
            labels[c - O_TRAIN_LABELS] = split_commas(optarg, &nlabels[c - O_TRAIN_LABELS]);
            break;
        case O_TRAIN_REWARDS: rewards = split_commas(optarg, &nrewards); break;
        case 'h': index_usage(); return 0;
        case ':': neox_usage_error("option '%s' needs a value", argv[optind - 1]);
        default: neox_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) neox_usage_error("unexpected argument '%s'", argv[optind]);
    if (!s.seq_length || !s.train_batch_size) neox_usage_error("index: --seq-length and --train-batch-size are required");
    s.train_paths = (const char *const *)paths[0], s.ntrain = npaths[0];
    s.valid_paths = (const char *const *)paths[1], s.nvalid = npaths[1];
    s.test_paths = (const char *const *)paths[2], s.ntest = npaths[2];
    s.train_weights = weights[0], s.valid_weights = weights[1], s.test_weights = weights[2];
    s.pairwise = neg[0] != NULL;
    s.train_neg_paths = (const char *const *)neg[0], s.valid_neg_paths = (const char *const *)neg[1];
    s.test_neg_paths = (const char *const *)neg[2];
    s.train_label_paths = (const char *const *)labels[0], s.train_neg_label_paths = (const char *const *)labels[1];
    s.train_reward_paths = (const char *const *)rewards;
    neox_data_list_lengths lengths = {.weights = {nweights[0], nweights[1], nweights[2]},
                                      .neg = {nneg[0], nneg[1], nneg[2]}, .labels = {nlabels[0]},
                                      .neg_labels = {nlabels[1]}, .rewards = {nrewards}};
    neox_error err = {0};
    if (neox_data_settings_check(&s, &lengths, &err) != 0) neox_die_error(&err);
    neox_dataset *sets[3];
    if (neox_build_datasets(&s, sets, &err) != 0) neox_die_error(&err);
    static const char *names[3] = {"train", "valid", "test"};
    for (int i = 0; i < 3; i++)
        neox_info("%s: %lld samples", names[i], sets[i] ? (long long)sets[i]->size : 0LL);
    size_t n = (size_t)s.seq_length + 1;
    int32_t *tokens = neox_malloc(2 * n * sizeof *tokens), *rejected = tokens + n;
    float *reward_row = neox_malloc(n * sizeof *reward_row);
    for (long k = 0; sets[0] && k < dump; k++) {
        int rc = s.pairwise ? neox_dataset_pair_sample(sets[0], k, tokens, NULL, rejected, NULL, &err)
                            : neox_dataset_sample(sets[0], k, tokens, NULL, &err);
        if (rc != 0) neox_die_error(&err);
        for (int row = 0; row < (s.pairwise ? 2 : 1); row++) {
            for (size_t t = 0; t < n; t++) printf(t ? " %d" : "%d", tokens[row * n + t]);
            printf("\n");
        }
        if (!rewards) continue;
        if (neox_dataset_sample_rewards(sets[0], k, reward_row, &err) != 0) neox_die_error(&err);
        for (size_t t = 0; t < n; t++) printf(t ? " %.9g" : "%.9g", reward_row[t]);
        printf("\n");
    }
    free(tokens);
    free(reward_row);
    for (int j = 0; j < nrewards; j++) free(rewards[j]);
    free(rewards);
    for (int i = 0; i < 3; i++) {
        neox_dataset_free(sets[i]);
        for (int j = 0; j < npaths[i]; j++) free(paths[i][j]);
        for (int j = 0; j < nneg[i]; j++) free(neg[i][j]);
        free(paths[i]);
        free(neg[i]);
        free(weights[i]);
    }
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < nlabels[i]; j++) free(labels[i][j]);
        free(labels[i]);
    }
    free(default_split);
    return 0;
}
