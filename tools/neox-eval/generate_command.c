// generate_command.c: `neox-eval generate`, GPT-NeoX's generate.py: unconditional samples, one
// completion per prompt of an input file, or interactive prompts from stdin; greedy or sampled;
// jsonl output with GPT-NeoX's fields. Options override the config keys of the same names. Under
// mpiexec the prompts (or samples) are shared over the data-parallel ranks, k to rank k % ranks,
// and rank 0 writes the records in input order; interactive prompts are rank 0's.
#include <math.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core.h"
#include "eval.h"
#include "generate.h"
#include "kernels/kernels.h"

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s generate [OPTION]... CONFIG.yml [MORE.yml]...\n"
            "Generate text from the checkpoint the configs name (`load`), as GPT-NeoX's generate.py.\n"
            "Each option overrides the config key of the same name (with '_').\n"
            "\n"
            "  --text-gen-type TYPE     unconditional | input-file | interactive\n"
            "  --sample-input-file F    prompts, separated by --prompt-end (input-file)\n"
            "  --sample-output-file F   jsonl output: context, text, length, finished, duration_seconds\n"
            "  --prompt-end S           prompt separator in the input file (default: newline)\n"
            "  --maximum-tokens N       tokens to generate per prompt (stops early at end of document)\n"
            "  --temperature T, --top-k K, --top-p P\n"
            "                           sampling; greedy when all three are 0\n"
            "  --num-samples N          unconditional samples\n"
            "  --seed N                 sampling seed (default: the config's seed)\n"
            "  --stop-token ID          also stop after this token id (repeatable; end of document and the\n"
            "                           tokenizer's declared eos_token and\n"
            "                           generation_config.json's eos_token_id always stop)\n"
            "  --recompute              recompute the whole sequence for every token (no KV cache)\n"
            "  -q, --quiet              no notices\n"
            "  -h, --help               show this help and exit\n",
            neox_progname());
}

typedef struct gen_args {
    const char *type, *input, *output, *prompt_end;
    int64_t maximum_tokens, top_k, num_samples, seed;
    double temperature, top_p;
    int recompute, quiet;
    int have_max, have_top_k, have_samples, have_seed, have_temp, have_top_p;
    int32_t stop[32];           // stop ids: end of document first, then --stop-token ones, then the model's
    int nstop;
} gen_args;

typedef struct gen_state {
    neox_evaluator *ev;
    neox_generator *gen;
    neox_sampling sampling;
    unsigned long long seed;    // completion k samples with neox_hash64(seed, k)
    int maximum_tokens;
    int rank, ranks;            // this rank among the data-parallel ranks that share the prompts
    FILE *out;                  // jsonl (NULL: none; written by rank 0)
    const int32_t *stop;
    int nstop;
    int64_t tokens;             // generated, for tokens/s
    double seconds;
} gen_state;

// return_logits: GPT-NeoX's "logits" field, one row of the (padded) vocabulary's logits per
// generated token, the stop token included.
static json_t *logits_json(const float *logits, int n, int vocab) {
    json_t *rows = json_array();
    for (int i = 0; i < n; i++) {
        json_t *row = json_array();
        for (int v = 0; v < vocab; v++) json_array_append_new(row, json_real(logits[(size_t)i * vocab + v]));
        json_array_append_new(rows, row);
    }
    return rows;
}

// Generates completion k of text and returns its jsonl record (malloc'ed; the text is printed too
// when echo is set). Its sampling seed comes from k, so a completion depends on its place in the
// input only, not on the rank that makes it or on the completions before it.
static char *complete(gen_state *st, const char *text, int64_t k, int echo, neox_error *err) {
    neox_evaluator *ev = st->ev;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (*text == 0) {
        ids = neox_malloc(sizeof *ids);
        ids[n++] = ev->eod_id;  // unconditional: the end-of-document token as the only context
    } else if (neox_tokenizer_encode(ev->tokenizer, text, strlen(text), &ids, &n, &cap, err) < 0) {
        return NULL;
    }
    neox_generation g;
    st->sampling.seed = neox_hash64(st->seed, (unsigned long long)k);
    double start = neox_now();
    int rc = neox_generate(st->gen, ids, (int)n, st->maximum_tokens, &st->sampling, st->stop, st->nstop, &g, err);
    free(ids);
    if (rc != 0) {
        free(g.tokens);
        free(g.logits);
        return neox_fail_context(err, "prompt '%.40s%s'", text, strlen(text) > 40 ? "..." : ""), NULL;
    }
    double seconds = neox_now() - start;
    st->tokens += g.n;
    st->seconds += seconds;
    int keep = g.finished ? g.n - 1 : g.n;  // the text ends before the stop token
    size_t size;
    char *generated = neox_tokenizer_decode(ev->tokenizer, g.tokens, (size_t)keep, &size, err);
    free(g.tokens);
    if (!generated) return NULL;
    json_t *rec = json_pack("{s:s, s:s%, s:i, s:b, s:n, s:f}", "context", text, "text", generated, size, "length", keep,
                            "finished", g.finished, "message", "duration_seconds", seconds);
    if (g.logits) json_object_set_new(rec, "logits", logits_json(g.logits, g.n, ev->model->desc.vocab_size));
    free(g.logits);
    char *line = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    if (echo) printf("%s\n", generated);
    free(generated);
    return line;
}

typedef struct prompt_list {
    gen_state *st;
    char **prompts;
} prompt_list;

static char *complete_item(void *ctx, int64_t k, neox_error *err) {
    prompt_list *p = ctx;
    return complete(p->st, p->prompts[k], k, 0, err);
}

static void write_record(void *ctx, int64_t k, const char *record) {
    (void)k;
    prompt_list *p = ctx;
    if (p->st->out) fprintf(p->st->out, "%s\n", record);
}

static int all_ranks_ok(gen_state *st, int rc, neox_error *err) {
    return neox_eval_ranks_agree(&st->ev->grid->data, rc, "generating", err) == 0;
}

// The n prompts shared over the data-parallel ranks, the records written in input order.
static int generate_all(gen_state *st, char **prompts, int64_t n, neox_error *err) {
    prompt_list p = {st, prompts};
    return neox_eval_share_records(&st->ev->grid->data, n, complete_item, write_record, &p, "generating", err);
}

// The prompts of an input file: split on prompt_end, stripped, empty ones dropped (as generate.py).
static char **read_prompts(const char *path, const char *prompt_end, int *count, neox_error *err) {
    size_t size;
    *count = -1;
    char *text = neox_read_file(path, &size, err);
    if (!text) return NULL;
    char **prompts = NULL;
    int n = 0;
    size_t sep = strlen(prompt_end);
    for (char *p = text; p;) {
        char *end = sep ? strstr(p, prompt_end) : NULL;
        char *piece = end ? neox_strndup(p, (size_t)(end - p)) : neox_strdup(p);
        p = end ? end + sep : NULL;
        char *a = piece, *b = piece + strlen(piece);
        while (*a == ' ' || (*a >= '\t' && *a <= '\r')) a++;
        while (b > a && (b[-1] == ' ' || (b[-1] >= '\t' && b[-1] <= '\r'))) b--;
        if (b > a) {
            prompts = neox_realloc(prompts, (size_t)(n + 1) * sizeof *prompts);
            prompts[n++] = neox_strndup(a, (size_t)(b - a));
        }
        free(piece);
    }
    free(text);
    *count = n;
    return prompts;
}

// Interactive: rank 0 reads prompts from stdin, one a line, and prints each completion.
static int interactive(gen_state *st, neox_error *err) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (int64_t k = 0; rc == 0 && (fprintf(stderr, "Context prompt >>> "), len = getline(&line, &cap, stdin)) >= 0; k++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!strcmp(line, "exit")) break;
        char *rec = len > 0 ? complete(st, line, k, 1, err) : NULL;
        if (len > 0 && !rec) rc = -1;
        if (rec && st->out) fprintf(st->out, "%s\n", rec);
        free(rec);
    }
    free(line);
    return rc;
}

// The prompts the text_gen_type asks for: num_samples empty ones (unconditional) or the input
// file's; *n = -1 on error.
static char **prompts_of(const gen_args *a, int64_t *n, neox_error *err) {
    *n = -1;
    if (!strcmp(a->type, "unconditional")) {
        *n = a->num_samples;
        char **p = neox_calloc((size_t)*n + 1, sizeof *p);
        for (int64_t i = 0; i < *n; i++) p[i] = neox_strdup("");
        return p;
    }
    if (!a->input) return neox_fail(err, NEOX_EXIT_USAGE, "sample_input_file: not set (text_gen_type input-file)"), NULL;
    int count = 0;
    char **p = read_prompts(a->input, a->prompt_end, &count, err);
    if (count == 0) neox_fail(err, NEOX_EXIT_USAGE, "%s: no prompts (separated by prompt_end)", a->input);
    if (count > 0) *n = count;
    return p;
}

static int run_type(gen_state *st, const gen_args *a, neox_error *err) {
    if (!strcmp(a->type, "interactive")) return all_ranks_ok(st, st->rank == 0 ? interactive(st, err) : 0, err) ? 0 : -1;
    if (strcmp(a->type, "unconditional") && strcmp(a->type, "input-file"))
        return neox_fail(err, NEOX_EXIT_USAGE, "text_gen_type: '%s' is not unconditional, input-file or interactive", a->type);
    int64_t n;
    char **prompts = prompts_of(a, &n, err);
    int rc = n < 0 ? -1 : generate_all(st, prompts, n, err);
    for (int64_t k = 0; k < n; k++) free(prompts[k]);
    free(prompts);
    return rc;
}

// Fills what the command line left unset from the config.
static void from_config(gen_args *a, const neox_config *cfg) {
    if (!a->type) a->type = neox_config_str(cfg, text_gen_type) ? neox_config_str(cfg, text_gen_type) : "unconditional";
    if (!a->input) a->input = neox_config_str(cfg, sample_input_file);
    if (!a->output) a->output = neox_config_str(cfg, sample_output_file);
    if (!a->prompt_end) {
        const char *end = neox_config_str(cfg, prompt_end);
        a->prompt_end = end && *end ? end : "\n";
    }
    if (!a->have_max) a->maximum_tokens = neox_config_int(cfg, maximum_tokens);
    if (!a->have_top_k) a->top_k = neox_config_int(cfg, top_k);
    if (!a->have_samples) a->num_samples = neox_config_int(cfg, num_samples);
    if (!a->have_seed) a->seed = neox_config_int(cfg, seed);
    if (!a->have_temp) a->temperature = neox_config_float(cfg, temperature);
    if (!a->have_top_p) a->top_p = neox_config_float(cfg, top_p);
    if (!a->recompute) a->recompute = neox_config_bool(cfg, recompute);
}

// tokens/s over the ranks: all the tokens over the longest any rank spent generating.
static void report_rate(gen_state *st, const gen_args *a) {
    double v[2] = {(double)st->tokens, st->seconds};
    neox_eval_sum_and_max(&st->ev->grid->data, &v[0], &v[1]);
    if (st->ev->rank0 && !a->quiet)
        neox_info("generated %.0f tokens in %.2f s: %.1f tokens/s (%s, %d rank%s)", v[0], v[1], v[0] / (v[1] + 1e-9),
                  a->recompute ? "recompute" : "KV cache", st->ranks, st->ranks > 1 ? "s" : "");
}

static int generate(int nconfigs, const char *const *configs, gen_args *a, int *argc, char ***argv) {
    neox_error err = {0};
    neox_grid grid;
    neox_config *cfg = neox_tool_setup(nconfigs, configs, a->quiet, &grid, argc, argv);
    from_config(a, cfg);
    neox_evaluator *ev = neox_evaluator_create(cfg, &grid, a->quiet, &err);
    if (!ev) neox_die_error(&err);
    a->stop[0] = ev->eod_id;
    for (int i = 0; i < ev->nend; i++) {  // the declared eos_token and generation_config.json's end a text too
        if (ev->end_ids[i] == ev->eod_id) continue;
        if (a->nstop == (int)(sizeof a->stop / sizeof *a->stop))
            neox_usage_error("--stop-token: at most %d stop ids with the model's own %d",
                             (int)(sizeof a->stop / sizeof *a->stop), ev->nend);
        a->stop[a->nstop++] = ev->end_ids[i];
    }
    for (int i = 1; i < a->nstop; i++)
        if (a->stop[i] >= neox_tokenizer_vocab_size(ev->tokenizer))
            neox_usage_error("--stop-token %d: not an id of the tokenizer (%lld ids)", a->stop[i],
                             (long long)neox_tokenizer_vocab_size(ev->tokenizer));
    gen_state st = {.ev = ev, .maximum_tokens = (int)a->maximum_tokens, .stop = a->stop, .nstop = a->nstop,
                    .seed = (unsigned long long)a->seed, .rank = grid.data_rank, .ranks = grid.data_size,
                    .sampling = {a->temperature, (int)a->top_k, a->top_p, 0, (int)neox_tokenizer_vocab_size(ev->tokenizer),
                                 neox_config_bool(cfg, return_logits)}};
    st.gen = neox_generator_create(ev->model, ev->seq_length, a->recompute, &err);
    neox_atomic_file *af = NULL;
    int rc = st.gen ? 0 : -1;
    if (rc == 0 && grid.world_rank == 0 && a->output) {  // rank 0 writes every record
        if (strcmp(a->output, "-") == 0) st.out = stdout;
        else if ((af = neox_atomic_open(a->output, &err))) st.out = af->fp;
        else rc = -1;
    }
    if (all_ranks_ok(&st, rc, &err)) rc = run_type(&st, a, &err);
    else rc = -1;
    if (af) rc = rc == 0 ? neox_atomic_commit(af, &err) : (neox_atomic_abort(af), rc);
    if (rc == 0) report_rate(&st, a);
    neox_generator_free(st.gen);
    if (rc != 0) neox_die_error(&err);
    neox_evaluator_free(ev);
    neox_tool_teardown(cfg, &grid);
    return 0;
}

int neox_generate_command(int argc, char **argv) {
    enum { O_TYPE = 256, O_INPUT, O_OUTPUT, O_END, O_MAX, O_TEMP, O_TOPK, O_TOPP, O_SAMPLES, O_SEED, O_RECOMPUTE, O_STOP };
    static const struct option options[] = {
        {"text-gen-type", required_argument, NULL, O_TYPE},
        {"sample-input-file", required_argument, NULL, O_INPUT},
        {"sample-output-file", required_argument, NULL, O_OUTPUT},
        {"prompt-end", required_argument, NULL, O_END},
        {"maximum-tokens", required_argument, NULL, O_MAX},
        {"temperature", required_argument, NULL, O_TEMP},
        {"top-k", required_argument, NULL, O_TOPK},
        {"top-p", required_argument, NULL, O_TOPP},
        {"num-samples", required_argument, NULL, O_SAMPLES},
        {"seed", required_argument, NULL, O_SEED},
        {"recompute", no_argument, NULL, O_RECOMPUTE},
        {"stop-token", required_argument, NULL, O_STOP},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    gen_args a = {.nstop = 1};  // stop[0], the end-of-document id, is filled in once the tokenizer is loaded
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "qh", options, NULL)) != -1) {
        switch (c) {
        case O_TYPE: a.type = optarg; break;
        case O_INPUT: a.input = optarg; break;
        case O_OUTPUT: a.output = optarg; break;
        case O_END: a.prompt_end = optarg; break;
        case O_MAX: a.maximum_tokens = neox_option_int("--maximum-tokens", optarg, 0, INT64_MAX), a.have_max = 1; break;
        case O_TEMP: a.temperature = neox_option_number("--temperature", optarg, 0, INFINITY), a.have_temp = 1; break;
        case O_TOPK: a.top_k = neox_option_int("--top-k", optarg, 0, INT64_MAX), a.have_top_k = 1; break;
        case O_TOPP: a.top_p = neox_option_number("--top-p", optarg, 0, INFINITY), a.have_top_p = 1; break;
        case O_SAMPLES: a.num_samples = neox_option_int("--num-samples", optarg, 0, INT64_MAX), a.have_samples = 1; break;
        case O_SEED: a.seed = neox_option_int("--seed", optarg, 0, INT64_MAX), a.have_seed = 1; break;
        case O_RECOMPUTE: a.recompute = 1; break;
        case O_STOP:
            if (a.nstop == (int)(sizeof a.stop / sizeof *a.stop)) neox_usage_error("--stop-token: at most %d", a.nstop - 1);
            a.stop[a.nstop++] = (int32_t)neox_option_int("--stop-token", optarg, 0, INT32_MAX);
            break;
        case 'q': a.quiet = 1; break;
        case 'h': usage(stdout); return 0;
        default: neox_usage_error("generate: unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) neox_usage_error("generate: no config file given");
    return generate(argc - optind, (const char *const *)argv + optind, &a, &argc, &argv);
}
