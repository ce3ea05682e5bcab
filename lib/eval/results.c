// results.c: reporting — the table lm-evaluation-harness prints and the JSON file GPT-NeoX's
// eval.py writes ({eval_results_prefix}_eval_results_yy-mm-dd-HH-MM.json) with the harness 0.4
// key style ("acc,none", "acc_stderr,none"; "N/A" where the harness has no standard error).
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval.h"

void neox_eval_print_table(FILE *out, const neox_task_result *r, int n) {
    fprintf(out, "|%-16s|%8s|%-16s|%12s|   |%10s|\n", "Tasks", "n", "Metric", "Value", "Stderr");
    fprintf(out, "|%.16s|%.8s|%.16s|%.12s|---|%.10s|\n", "----------------", "--------", "----------------",
            "------------", "----------");
    for (int i = 0; i < n; i++)
        for (int m = 0; m < r[i].nmetrics; m++) {
            const neox_metric *x = &r[i].metrics[m];
            char se[32];
            if (x->has_stderr) snprintf(se, sizeof se, "%.4f", x->stderr_value);
            else snprintf(se, sizeof se, "N/A");
            char count[24] = "";
            if (m == 0) snprintf(count, sizeof count, "%lld", (long long)r[i].examples);
            fprintf(out, "|%-16s|%8s|%-16s|%12.4f|±  |%10s|\n", m == 0 ? r[i].task : "", count, x->name, x->value, se);
        }
}

char *neox_eval_results_path(const char *prefix) {
    char stamp[32];
    time_t now = time(NULL);
    strftime(stamp, sizeof stamp, "%y-%m-%d-%H-%M", localtime(&now));
    return prefix && *prefix ? neox_asprintf("%s_eval_results_%s.json", prefix, stamp)
                             : neox_asprintf("eval_results_%s.json", stamp);
}

static json_t *number_or_na(double v, int has) { return has && isfinite(v) ? json_real(v) : json_string("N/A"); }

int neox_eval_write_results(const char *path, const neox_task_result *r, int n, const neox_evaluator *ev,
                            neox_error *err) {
    json_t *results = json_object(), *samples = json_object();
    for (int i = 0; i < n; i++) {
        json_t *task = json_object();
        json_object_set_new(task, "alias", json_string(r[i].task));
        for (int m = 0; m < r[i].nmetrics; m++) {
            const neox_metric *x = &r[i].metrics[m];
            char key[64];
            snprintf(key, sizeof key, "%s,none", x->name);
            json_object_set_new(task, key, number_or_na(x->value, 1));
            snprintf(key, sizeof key, "%s_stderr,none", x->name);
            json_object_set_new(task, key, number_or_na(x->stderr_value, x->has_stderr));
        }
        json_object_set_new(results, r[i].task, task);
        json_object_set_new(samples, r[i].task, json_integer((json_int_t)r[i].examples));
    }
    const char *load = neox_config_str(ev->cfg, load);
    json_t *root = json_pack("{s:o, s:o, s:{s:s?, s:I, s:i, s:i, s:i}}", "results", results, "n-samples", samples, "config",
                             "load", load, "iteration", (json_int_t)ev->iteration, "max_length", ev->seq_length,
                             "batch_size", ev->micro_batch, "data_parallel_size", ev->grid->data_size);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    size_t len = strlen(text);
    text = neox_realloc(text, len + 2);
    text[len++] = '\n';
    int rc = neox_atomic_write(path, text, len, err);
    free(text);
    json_decref(root);
    return rc;
}
