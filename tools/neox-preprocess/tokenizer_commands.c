// tokenizer_commands.c: the tokenizer subcommands of neox-preprocess — encode (text -> ids),
// decode (ids -> text) and train-tokenizer (a byte-level BPE tokenizer.json from text files).
// Argument parsing and I/O only; the tokenizers are lib/tokenizer.
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core.h"
#include "tokenizer.h"

typedef struct tokenizer_args {
    neox_tokenizer_options tok;
    int lines;
    char separator;     // with --lines: '\n', or '\0' for --null
    const char *input;  // file name, or "-" / NULL for stdin
    int threads;        // encode: > 0 cuts each document into pieces encoded on that many threads
    size_t piece_bytes; // ... of about this size (0: the library's default)
} tokenizer_args;

enum { OPT_TYPE = 256, OPT_VOCAB, OPT_MERGE, OPT_LINES, OPT_NULL, OPT_THREADS, OPT_PIECE };

static void usage_codec(FILE *out, const char *name) {
    int enc = !strcmp(name, "encode");
    fprintf(out, "Usage: %s %s --tokenizer-type TYPE [--vocab-file FILE] [--merge-file FILE] [--lines | --null]\n",
            neox_progname(), name);
    if (enc) fprintf(out, "       [--threads N [--piece-bytes B]] [FILE|-]\n");
    else fprintf(out, "       [FILE|-]\n");
    fprintf(out, "%s\n\n", enc ? "Encodes text to token ids, printed space-separated."
                               : "Decodes token ids (separated by spaces, commas or newlines) to text.");
    fprintf(out,
            "  --tokenizer-type TYPE  GPT2BPETokenizer, HFTokenizer, HFGPT2Tokenizer or CharLevelTokenizer\n"
            "  --vocab-file FILE      vocab.json (GPT-2 types) or tokenizer.json (HFTokenizer)\n"
            "  --merge-file FILE      merges.txt (GPT-2 types)\n"
            "  --lines                one %s per input line instead of the whole input as one document\n"
            "  --null                 like --lines, with documents separated by NUL bytes (text may hold newlines)\n",
            enc ? "line of ids" : "line of text");
    if (enc)
        fprintf(out, "  --threads N            cut each document where the ids cannot change and encode the pieces on\n"
                     "                         N threads (docs/tokenizers.md, \"Large documents\")\n"
                     "  --piece-bytes B        the pieces' size for --threads (default 16384)\n");
    fprintf(out, "  -h, --help             show this help and exit\n\n"
                 "Input is FILE, or standard input when FILE is '-' or absent.%s\n",
            enc ? "\nInvalid UTF-8 is read as U+FFFD, as Python's errors='replace' would (see docs/tokenizers.md)."
                : "");
}

// encode's options; decode takes the same but --threads and --piece-bytes (decoding is not cut).
static const struct option encode_options[] = {
    {"tokenizer-type", required_argument, NULL, OPT_TYPE},
    {"vocab-file", required_argument, NULL, OPT_VOCAB},
    {"merge-file", required_argument, NULL, OPT_MERGE},
    {"lines", no_argument, NULL, OPT_LINES},
    {"null", no_argument, NULL, OPT_NULL},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"piece-bytes", required_argument, NULL, OPT_PIECE},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};
static const struct option decode_options[] = {
    {"tokenizer-type", required_argument, NULL, OPT_TYPE},
    {"vocab-file", required_argument, NULL, OPT_VOCAB},
    {"merge-file", required_argument, NULL, OPT_MERGE},
    {"lines", no_argument, NULL, OPT_LINES},
    {"null", no_argument, NULL, OPT_NULL},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static void parse_codec_args(int argc, char **argv, tokenizer_args *a) {
    const struct option *options = strcmp(argv[0], "encode") == 0 ? encode_options : decode_options;
    memset(a, 0, sizeof *a);
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case OPT_TYPE: a->tok.type = optarg; break;
        case OPT_VOCAB: a->tok.vocab_file = optarg; break;
        case OPT_MERGE: a->tok.merge_file = optarg; break;
        case OPT_LINES: a->lines = 1, a->separator = '\n'; break;
        case OPT_NULL: a->lines = 1, a->separator = '\0'; break;
        case OPT_THREADS: a->threads = (int)neox_option_int("--threads", optarg, 1, 1024); break;
        case OPT_PIECE: a->piece_bytes = (size_t)neox_option_int("--piece-bytes", optarg, 1, INT64_MAX); break;
        case 'h': usage_codec(stdout, argv[0]); exit(0);
        default: neox_usage_error("%s: unrecognized option '%s'", argv[0], argv[optind - 1]);
        }
    }
    if (!a->tok.type) neox_usage_error("%s: --tokenizer-type is required", argv[0]);
    if (optind < argc) a->input = argv[optind++];
    if (optind < argc) neox_usage_error("%s: more than one input file given", argv[0]);
}

static neox_tokenizer *load_or_die(const tokenizer_args *a) {
    neox_error err = {0};
    neox_tokenizer *tok = neox_tokenizer_load(&a->tok, &err);
    if (!tok) neox_die_error(&err);
    return tok;
}

static char *read_input(const char *path, size_t *size) {
    neox_error err = {0};
    if (path && strcmp(path, "-")) {
        char *data = neox_read_file(path, size, &err);
        if (!data) neox_die_error(&err);
        return data;
    }
    size_t cap = 1 << 16, len = 0;
    char *data = neox_malloc(cap);
    for (;;) {
        if (len + 1 >= cap) data = neox_realloc(data, cap *= 2);
        size_t got = fread(data + len, 1, cap - len - 1, stdin);
        len += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) neox_die(NEOX_EXIT_FAILURE, "reading standard input: %s", strerror(errno));
    data[len] = 0;
    *size = len;
    return data;
}

// Writes ids space-separated plus a newline, formatting by hand: stdio's printf is the bottleneck
// for large corpora otherwise.
static void print_ids(const int32_t *ids, size_t n) {
    char buf[1 << 14];
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (len + 16 > sizeof buf) { fwrite(buf, 1, len, stdout); len = 0; }
        char digits[12];
        int d = 0;
        uint32_t v = (uint32_t)ids[i];
        do digits[d++] = (char)('0' + v % 10); while ((v /= 10));
        if (i) buf[len++] = ' ';
        while (d) buf[len++] = digits[--d];
    }
    buf[len++] = '\n';
    fwrite(buf, 1, len, stdout);
}

static void encode_or_die(const tokenizer_args *a, const neox_tokenizer *tok, const char *text, size_t size,
                          int32_t **ids, size_t *len, size_t *cap) {
    neox_error err = {0};
    int64_t rc = a->threads > 0 ? neox_tokenizer_encode_threads(tok, text, size, a->threads, a->piece_bytes, ids, len,
                                                                cap, &err)
                                : neox_tokenizer_encode(tok, text, size, ids, len, cap, &err);
    if (rc < 0) neox_die_error(&err);
}

int command_encode(int argc, char **argv) {
    tokenizer_args a;
    parse_codec_args(argc, argv, &a);
    neox_tokenizer *tok = load_or_die(&a);
    if (a.threads > 0 && neox_tokenizer_cut_refusal(tok))
        neox_info("documents are encoded whole, on one thread each: %s", neox_tokenizer_cut_refusal(tok));
    size_t size;
    char *text = read_input(a.input, &size);
    int32_t *ids = NULL;
    size_t len = 0, cap = 0;
    if (!a.lines) {
        encode_or_die(&a, tok, text, size, &ids, &len, &cap);
        print_ids(ids, len);
    } else {
        for (size_t pos = 0; pos < size;) {
            char *eol = memchr(text + pos, a.separator, size - pos);
            size_t end = eol ? (size_t)(eol - text) : size;
            len = 0;
            encode_or_die(&a, tok, text + pos, end - pos, &ids, &len, &cap);
            print_ids(ids, len);
            pos = end + 1;
        }
    }
    free(ids);
    free(text);
    neox_tokenizer_free(tok);
    if (fflush(stdout) != 0) neox_die(NEOX_EXIT_FAILURE, "writing output: %s", strerror(errno));
    return 0;
}

// Parses the ids in text[0..size) (separated by spaces, tabs, commas; CR ignored).
static int32_t *parse_ids(const char *text, size_t size, size_t line_no, size_t *n) {
    int32_t *ids = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; i < size;) {
        char c = text[i];
        if (c == ' ' || c == '\t' || c == ',' || c == '\r' || c == '\n') { i++; continue; }
        size_t j = i;
        while (j < size && text[j] >= '0' && text[j] <= '9') j++;
        if (j == i || j - i > 10)
            neox_die(NEOX_EXIT_FAILURE, "line %zu: '%.*s' is not a token id", line_no, (int)(j > i ? j - i : 1), text + i);
        long long v = 0;
        for (size_t k = i; k < j; k++) v = v * 10 + (text[k] - '0');
        if (v > INT32_MAX) neox_die(NEOX_EXIT_FAILURE, "line %zu: token id %lld is out of range", line_no, v);
        if (len == cap) ids = neox_realloc(ids, (cap = cap ? cap * 2 : 256) * sizeof *ids);
        ids[len++] = (int32_t)v;
        i = j;
    }
    *n = len;
    return ids;
}

int command_decode(int argc, char **argv) {
    tokenizer_args a;
    parse_codec_args(argc, argv, &a);
    neox_tokenizer *tok = load_or_die(&a);
    size_t size;
    char *text = read_input(a.input, &size);
    neox_error err = {0};
    size_t line_no = 1;
    for (size_t pos = 0; pos < size || (pos == 0 && !a.lines);) {
        size_t end = size;
        if (a.lines) {
            char *eol = memchr(text + pos, '\n', size - pos);  // ids are one line per document either way
            if (eol) end = (size_t)(eol - text);
        }
        size_t n, out_size;
        int32_t *ids = parse_ids(text + pos, end - pos, line_no, &n);
        char *out = neox_tokenizer_decode(tok, ids, n, &out_size, &err);
        if (!out) neox_die(NEOX_EXIT_FAILURE, "line %zu: %s", line_no, err.message);
        fwrite(out, 1, out_size, stdout);
        if (a.lines) fputc(a.separator, stdout);
        free(out);
        free(ids);
        pos = end + 1;
        line_no++;
    }
    free(text);
    neox_tokenizer_free(tok);
    if (fflush(stdout) != 0) neox_die(NEOX_EXIT_FAILURE, "writing output: %s", strerror(errno));
    return 0;
}

static void usage_train(FILE *out) {
    fprintf(out,
            "Usage: %s train-tokenizer --input FILE[,FILE...] --vocab-size N --output tokenizer.json [OPTION]...\n"
            "Trains a byte-level BPE tokenizer (what GPT-NeoX's tools/datasets/train_tokenizer.py does with HF\n"
            "tokenizers: NFKC, ByteLevel with a prefix space, special tokens first) and writes a tokenizer.json\n"
            "for --tokenizer-type HFTokenizer. Each line of each input file is one training sequence.\n"
            "\n"
            "  --input FILES           text files, comma-separated; the option may be repeated\n"
            "  --vocab-size N          vocabulary size including special tokens and the 256 bytes\n"
            "  --special-tokens LIST   comma-separated (default <|endoftext|>,<|padding|>)\n"
            "  --min-frequency N       do not merge pairs seen fewer than N times (default 0)\n"
            "  --output FILE           the tokenizer.json to write (atomically)\n"
            "  -h, --help              show this help and exit\n",
            neox_progname());
}

// Splits a comma-separated list, appending to *list.
static void split_list(char *arg, const char ***list, size_t *n) {
    for (char *save = NULL, *item = strtok_r(arg, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        *list = neox_realloc(*list, (*n + 1) * sizeof **list);
        (*list)[(*n)++] = item;
    }
}

int command_train_tokenizer(int argc, char **argv) {
    enum { T_INPUT = 256, T_VOCAB, T_SPECIAL, T_MINFREQ, T_OUTPUT };
    static const struct option options[] = {
        {"input", required_argument, NULL, T_INPUT},
        {"vocab-size", required_argument, NULL, T_VOCAB},
        {"special-tokens", required_argument, NULL, T_SPECIAL},
        {"min-frequency", required_argument, NULL, T_MINFREQ},
        {"output", required_argument, NULL, T_OUTPUT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    neox_bpe_train_options o = {0};
    const char **inputs = NULL, **special = NULL;
    size_t n_special = 0;
    const char *output = NULL;
    int special_given = 0;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case T_INPUT: split_list(optarg, &inputs, &o.n_inputs); break;
        case T_VOCAB: o.vocab_size = neox_option_int("train-tokenizer: --vocab-size", optarg, 0, INT64_MAX); break;
        case T_SPECIAL: split_list(optarg, &special, &n_special), special_given = 1; break;
        case T_MINFREQ: o.min_frequency = neox_option_int("train-tokenizer: --min-frequency", optarg, 0, INT64_MAX); break;
        case T_OUTPUT: output = optarg; break;
        case 'h': usage_train(stdout); return 0;
        default: neox_usage_error("train-tokenizer: unrecognized option '%s'", argv[optind - 1]);
        }
    }
    while (optind < argc) split_list(argv[optind++], &inputs, &o.n_inputs);  // positional inputs too
    if (!o.n_inputs) neox_usage_error("train-tokenizer: --input is required");
    if (!o.vocab_size) neox_usage_error("train-tokenizer: --vocab-size is required");
    if (!output) neox_usage_error("train-tokenizer: --output is required");
    o.inputs = inputs;
    if (special_given) o.special_tokens = special, o.n_special = n_special;
    neox_error err = {0};
    double t0 = neox_now();
    if (neox_tokenizer_train_bpe(&o, output, &err) < 0) neox_die_error(&err);
    neox_info("wrote %s in %.1fs", output, neox_now() - t0);
    free(inputs);
    free(special);
    return 0;
}
