// neox-eval: perplexity, task scores and generation from checkpoints. This file parses the command
// line and dispatches; the evaluation code is in lib/eval/ and generation in lib/model/generate.c.
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "config.h"
#include "core.h"
#include "version.h"
#include "eval.h"
#include "parallel.h"

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s [OPTION]... CONFIG.yml [MORE.yml]...\n"
            "       %s generate [OPTION]... CONFIG.yml [MORE.yml]...   (see generate --help)\n"
            "       %s serve [OPTION]... CONFIG.yml [MORE.yml]...      (see serve --help)\n"
            "Evaluate the checkpoint the configs name (`load`, `iteration`): perplexity of the valid and\n"
            "test splits and lm-evaluation-harness tasks from local files. Prints a table and writes\n"
            "{eval_results_prefix}_eval_results_yy-mm-dd-HH-MM.json. Run under mpiexec/srun for several\n"
            "data-parallel ranks.\n"
            "\n"
            "  --tasks LIST       comma-separated tasks (default: the config's eval_tasks, else\n"
            "                     valid,test): valid, test (split perplexity), lambada_openai, piqa,\n"
            "                     wikitext, mc:FILE.jsonl, loglikelihood:FILE.jsonl, rolling:FILE.jsonl\n"
            "  --data-dir DIR     where the task files are (default: the config's eval_data_dir, data/eval):\n"
            "                     lambada_test.jsonl, piqa_valid.jsonl + piqa_valid-labels.lst,\n"
            "                     wikitext-2-raw_test_hfrows_crlf.raw\n"
            "  --limit N          at most N examples per task (default: the config's eval_task_limit; 0: all)\n"
            "  --eval-iters N     batches per split for valid/test (default: eval_iters)\n"
            "  --results-prefix P override eval_results_prefix; '-' writes no results file\n"
            "  --bootstrap-iters N\n"
            "                     resamples for the standard error of perplexity, as the harness's\n"
            "                     bootstrap_iters (default 100000); 0: no standard errors\n"
            "  --print-config CONFIG.yml [MORE.yml]...\n"
            "                     print every configuration key of the merged configs, its effective\n"
            "                     value and where it came from, then exit (as neox-train does)\n"
            "  --print-config-format FORMAT   'text' (default) or 'json'\n"
            "  -q, --quiet        no notices or progress\n"
            "  -h, --help         show this help and exit\n"
            "  -V, --version      show version, backends and library versions, and exit\n"
            "\n"
            "Tasks, formats and metrics: docs/eval.md.\n"
            "Exit status: 0 success, 1 runtime failure, 2 usage error.\n",
            neox_progname(), neox_progname(), neox_progname());
}

// Splits the comma-separated --tasks, or takes the config's eval_tasks list.
static int task_list(const neox_config *cfg, const char *arg, char ***names) {
    int n = 0;
    *names = NULL;
    if (arg) {
        char *copy = neox_strdup(arg), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            *names = neox_realloc(*names, (size_t)(n + 1) * sizeof **names);
            (*names)[n++] = neox_strdup(t);
        }
        free(copy);
        return n;
    }
    const neox_value *v = neox_config_has(cfg, eval_tasks) ? neox_config_value(cfg, eval_tasks) : NULL;
    if (v && v->kind == NEOX_VALUE_LIST) {
        for (int i = 0; i < v->count; i++)
            if (v->items[i]->kind == NEOX_VALUE_STRING) {
                *names = neox_realloc(*names, (size_t)(n + 1) * sizeof **names);
                (*names)[n++] = neox_strdup(v->items[i]->string);
            }
        if (n > 0) return n;
    }
    *names = neox_malloc(2 * sizeof **names);
    (*names)[0] = neox_strdup("valid");
    (*names)[1] = neox_strdup("test");
    return 2;
}

typedef struct eval_args {
    const char *tasks, *data_dir, *results_prefix;
    int64_t limit, eval_iters, bootstrap_iters;
    int quiet;
} eval_args;

static int run_task(neox_evaluator *ev, const char *name, const eval_args *a, neox_task_result *r, neox_error *err) {
    if (!strcmp(name, "valid") || !strcmp(name, "test"))
        return neox_eval_split_perplexity(ev, name[0] == 'v' ? 1 : 2, a->eval_iters, r, err);
    neox_task_options o = {.data_dir = a->data_dir ? a->data_dir : neox_config_str(ev->cfg, eval_data_dir),
                           .limit = a->limit >= 0 ? a->limit : neox_config_int(ev->cfg, eval_task_limit),
                           .bootstrap_iters = a->bootstrap_iters};
    return neox_eval_task(ev, name, &o, r, err);
}

static int evaluate(int nconfigs, const char *const *configs, const eval_args *a, int *argc, char ***argv) {
    neox_error err = {0};
    neox_grid grid;
    neox_config *cfg = neox_tool_setup(nconfigs, configs, a->quiet, &grid, argc, argv);
    neox_evaluator *ev = neox_evaluator_create(cfg, &grid, a->quiet, &err);
    if (!ev) neox_die_error(&err);
    char **names;
    int n = task_list(cfg, a->tasks, &names);
    neox_task_result *results = neox_calloc((size_t)n, sizeof *results);
    double start = neox_now();
    for (int i = 0; i < n; i++)
        if (run_task(ev, names[i], a, &results[i], &err) != 0) neox_die_error(&err);
    double seconds = neox_now() - start;
    if (ev->rank0) {
        neox_eval_print_table(stdout, results, n);
        int64_t tokens = ev->tokens_scored * grid.data_size;
        if (!a->quiet)
            neox_info("%lld tokens scored in %.2f s: %.0f tokens/s over %d ranks", (long long)tokens, seconds,
                      (double)tokens / (ev->forward_seconds + 1e-9), grid.data_size);
        const char *prefix = a->results_prefix ? a->results_prefix : neox_config_str(cfg, eval_results_prefix);
        if (!prefix || strcmp(prefix, "-") != 0) {
            char *path = neox_eval_results_path(prefix);
            if (neox_eval_write_results(path, results, n, ev, &err) != 0) neox_die_error(&err);
            if (!a->quiet) neox_info("wrote %s", path);
            free(path);
        }
    }
    for (int i = 0; i < n; i++) {
        neox_task_result_release(&results[i]);
        free(names[i]);
    }
    free(results);
    free(names);
    neox_evaluator_free(ev);
    neox_tool_teardown(cfg, &grid);
    return 0;
}

// Idle OpenMP threads should sleep, not spin: a request or a decoding step is many short kernels,
// and on a machine with other work spinning threads take the cores the working ones need
// (measured with one other busy process on 2 cores: generation 1-4 tokens/s with libgomp's default
// policy, 20-30 with passive). libgomp reads OMP_WAIT_POLICY once, when it is loaded, before main
// runs, so setting it here takes effect only in a fresh image: neox-eval executes itself again
// with it set, once, unless the user chose a policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT).
static void passive_openmp_wait(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    neox_debug("OMP_WAIT_POLICY is not set: running again with OMP_WAIT_POLICY=passive");
    execv("/proc/self/exe", argv);
    neox_debug("cannot execute /proc/self/exe; OpenMP keeps its default wait policy");
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_log_from_launcher();
    passive_openmp_wait(argv);
    if (argc > 1 && !strcmp(argv[1], "generate")) return neox_generate_command(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "serve")) return neox_serve_command(argc - 1, argv + 1);
    enum { OPT_PRINT_CONFIG = 256, OPT_PRINT_FORMAT, OPT_TASKS, OPT_DATA_DIR, OPT_LIMIT, OPT_EVAL_ITERS, OPT_PREFIX, OPT_BOOTSTRAP };
    static const struct option options[] = {
        {"print-config", no_argument, NULL, OPT_PRINT_CONFIG},
        {"print-config-format", required_argument, NULL, OPT_PRINT_FORMAT},
        {"tasks", required_argument, NULL, OPT_TASKS},
        {"data-dir", required_argument, NULL, OPT_DATA_DIR},
        {"limit", required_argument, NULL, OPT_LIMIT},
        {"eval-iters", required_argument, NULL, OPT_EVAL_ITERS},
        {"results-prefix", required_argument, NULL, OPT_PREFIX},
        {"bootstrap-iters", required_argument, NULL, OPT_BOOTSTRAP},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int c, print_config = 0;
    const char *print_format = "text";
    eval_args a = {.limit = -1, .bootstrap_iters = 100000};  // the harness's default
    opterr = 0;
    while ((c = getopt_long(argc, argv, "qhV", options, NULL)) != -1) {
        switch (c) {
        case OPT_PRINT_CONFIG: print_config = 1; break;
        case OPT_PRINT_FORMAT: print_format = optarg; break;
        case OPT_TASKS: a.tasks = optarg; break;
        case OPT_DATA_DIR: a.data_dir = optarg; break;
        case OPT_LIMIT: a.limit = neox_option_int("--limit", optarg, 0, INT64_MAX); break;
        case OPT_EVAL_ITERS: a.eval_iters = neox_option_int("--eval-iters", optarg, 0, INT64_MAX); break;
        case OPT_PREFIX: a.results_prefix = optarg; break;
        case OPT_BOOTSTRAP: a.bootstrap_iters = neox_option_int("--bootstrap-iters", optarg, 0, INT64_MAX); break;
        case 'q': a.quiet = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': neox_print_version(stdout); return 0;
        default: neox_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) neox_usage_error(print_config ? "--print-config: no config file given" : "no config file given");
    if (print_config) {
        neox_error err = {0};
        neox_config_options opts = {.world_size = 1, .data_parallel_only = 1};
        if (neox_config_print_files((const char *const *)argv + optind, argc - optind, &opts, print_format, stdout, &err) < 0)
            neox_die_error(&err);
        return 0;
    }
    return evaluate(argc - optind, (const char *const *)argv + optind, &a, &argc, &argv);
}
