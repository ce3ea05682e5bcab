// serve_command.c: `neox-eval serve`, the OpenAI-compatible completions server (lib/serve.h):
// parses the options, loads the checkpoint and runs the server until SIGTERM.
#include <math.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "commands.h"
#include "core.h"
#include "eval.h"
#include "serve.h"

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s serve [OPTION]... CONFIG.yml [MORE.yml]...\n"
            "Serve the checkpoint the configs name (`load`) over an OpenAI-compatible HTTP API:\n"
            "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health (docs/eval.md). Runs until SIGTERM or\n"
            "SIGINT, which finish the queued requests and exit 0.\n"
            "\n"
            "  --host ADDR            numeric address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N               TCP port (default 8000; 0: any free port, printed when listening)\n"
            "  --model-name NAME      the model id /v1/models lists and requests name (default neox)\n"
            "  --context N            longest prompt + completion in tokens (default max_position_embeddings)\n"
            "  --max-prompt-tokens N  longer prompts are answered 400 (default: the context)\n"
            "  --chat-template FILE   the Jinja template of /v1/chat/completions (default: chat_template of\n"
            "                         tokenizer_config.json beside vocab_file; without one, chat is refused)\n"
            "  --max-body-bytes N     larger request bodies are answered 413 (default 8388608)\n"
            "  --queue N              requests waiting or running at once; more are answered 503 (default 1024)\n"
            "  --decode-slots N       completions generated together, one pass over the weights per token\n"
            "                         (1 to 16, default 16; each holds a key/value cache of --context positions)\n"
            "  --max-connections N    open connections; more are refused (default 4096)\n"
            "  --timeout SECONDS      idle connections are closed after this (default 120; 0: never)\n"
            "  -q, --quiet            no notices\n"
            "  -h, --help             show this help and exit\n",
            neox_progname());
}

typedef struct serve_args {
    neox_serve_options engine;
    neox_serve_http_options http;
    const char *chat_template;  // --chat-template
    int quiet;
} serve_args;

static void announce(int port) {
    fprintf(stderr, "%s: listening on port %d\n", neox_progname(), port);
}

// Each connection takes a descriptor: the soft limit goes up to the hard one.
static void raise_descriptor_limit(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
    }
}

// The chat format of /v1/chat/completions: --chat-template must load; the tokenizer's own template
// may be missing or unsupported, which leaves chat refused with the reason (and a notice).
static int load_chat_format(neox_chat_format *chat, const neox_config *cfg, const neox_evaluator *ev, serve_args *a,
                            neox_error *err) {
    const char *vocab_file = neox_config_str(cfg, vocab_file);
    if (!vocab_file && !a->chat_template) {
        a->engine.no_chat = neox_strdup("the tokenizer has no vocab_file to find tokenizer_config.json beside");
        return 0;
    }
    if (neox_chat_format_load(chat, ev->tokenizer, vocab_file ? vocab_file : a->chat_template, a->chat_template, err) == 0) {
        a->engine.chat = chat;
        return 1;
    }
    if (a->chat_template) neox_die_error(err);
    a->engine.no_chat = neox_strdup(err->message);
    if (!a->quiet) neox_info("/v1/chat/completions is refused: %s", err->message);
    *err = (neox_error){0};
    return 0;
}

static int serve(int nconfigs, const char *const *configs, serve_args *a, int *argc, char ***argv) {
    neox_error err = {0};
    neox_grid grid;
    neox_config *cfg = neox_tool_setup(nconfigs, configs, a->quiet, &grid, argc, argv);
    neox_evaluator *ev = neox_evaluator_create(cfg, &grid, a->quiet, &err);
    if (!ev) neox_die_error(&err);
    int positions = ev->model->desc.max_positions;
    if (a->engine.context == 0) a->engine.context = positions;
    if (ev->model->desc.pos_emb == NEOX_POS_LEARNED && a->engine.context > positions)
        neox_usage_error("--context %d: the learned position table has %d rows", a->engine.context, positions);
    if (a->engine.max_prompt_tokens == 0 || a->engine.max_prompt_tokens > a->engine.context)
        a->engine.max_prompt_tokens = a->engine.context;
    raise_descriptor_limit();
    neox_chat_format chat;
    int has_chat = load_chat_format(&chat, cfg, ev, a, &err);
    neox_serve_engine *en = neox_serve_engine_create(ev, &a->engine, &err);
    if (!en) neox_die_error(&err);
    int rc = ev->grid->data_rank == 0 ? neox_serve_http_run(en, &a->http, announce, &err) : neox_serve_worker_run(en);
    neox_serve_engine_free(en);
    if (has_chat) neox_chat_format_free(&chat);
    free((char *)a->engine.no_chat);
    if (rc != 0) neox_die_error(&err);
    neox_evaluator_free(ev);
    neox_tool_teardown(cfg, &grid);
    return 0;
}

static int positive(const char *option, const char *text) { return (int)neox_option_int(option, text, 1, 1 << 30); }

int neox_serve_command(int argc, char **argv) {
    enum { O_HOST = 256, O_PORT, O_NAME, O_CONTEXT, O_PROMPT, O_BODY, O_QUEUE, O_CONNS, O_TIMEOUT, O_CHAT, O_SLOTS };
    static const struct option options[] = {
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"model-name", required_argument, NULL, O_NAME},
        {"context", required_argument, NULL, O_CONTEXT},
        {"max-prompt-tokens", required_argument, NULL, O_PROMPT},
        {"max-body-bytes", required_argument, NULL, O_BODY},
        {"queue", required_argument, NULL, O_QUEUE},
        {"max-connections", required_argument, NULL, O_CONNS},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"chat-template", required_argument, NULL, O_CHAT},
        {"decode-slots", required_argument, NULL, O_SLOTS},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    serve_args a = {.engine = {.model_name = "neox", .queue_size = 1024, .decode_slots = NEOX_DECODE_MAX_ROWS},
                    .http = {.host = "127.0.0.1", .port = 8000, .max_body_bytes = 8 << 20, .max_connections = 4096,
                             .connection_timeout = 120}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "qh", options, NULL)) != -1) {
        switch (c) {
        case O_HOST: a.http.host = optarg; break;
        case O_PORT:
            a.http.port = (int)neox_option_int("--port", optarg, 0, 65535);  // 0: any free port
            break;
        case O_NAME:
            if (!*optarg) neox_usage_error("--model-name: empty");
            a.engine.model_name = optarg;
            break;
        case O_CONTEXT: a.engine.context = positive("--context", optarg); break;
        case O_PROMPT: a.engine.max_prompt_tokens = positive("--max-prompt-tokens", optarg); break;
        case O_BODY: a.http.max_body_bytes = (size_t)positive("--max-body-bytes", optarg); break;
        case O_QUEUE: a.engine.queue_size = positive("--queue", optarg); break;
        case O_CONNS: a.http.max_connections = positive("--max-connections", optarg); break;
        case O_TIMEOUT: a.http.connection_timeout = neox_option_number("--timeout", optarg, 0, INFINITY); break;
        case O_CHAT: a.chat_template = optarg; break;
        case O_SLOTS: a.engine.decode_slots = (int)neox_option_int("--decode-slots", optarg, 1, NEOX_DECODE_MAX_ROWS); break;
        case 'q': a.quiet = 1; break;
        case 'h': usage(stdout); return 0;
        default: neox_usage_error("serve: unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) neox_usage_error("serve: no config file given");
    return serve(argc - optind, (const char *const *)argv + optind, &a, &argc, &argv);
}
