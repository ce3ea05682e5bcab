// tasks.c: the tasks neox-eval scores, each as lm-evaluation-harness 0.4 defines it, read from
// local files: lambada_openai (loglikelihood of the last word; acc = greedy match, perplexity),
// piqa (two-way multiple choice; acc, acc_norm by the choice's length in characters), wikitext
// (rolling loglikelihood of each detokenized page; word_perplexity, byte_perplexity,
// bits_per_byte), and the generic formats mc:, loglikelihood: and rolling: (docs/eval.md).
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"

// ---- reading jsonl files --------------------------------------------------------------------------
typedef struct jsonl_file {
    const char *path;
    char *text;
    size_t size, pos;
    int64_t line;
} jsonl_file;

static int jsonl_open(jsonl_file *f, const char *path, neox_error *err) {
    *f = (jsonl_file){.path = path};
    f->text = neox_read_file(path, &f->size, err);
    return f->text ? 0 : -1;
}

// The next line as a JSON object (*obj, to json_decref), 0 at the end of the file, -1 on error.
static int jsonl_next(jsonl_file *f, json_t **obj, neox_error *err) {
    if (f->pos >= f->size) return 0;
    char *start = f->text + f->pos, *nl = memchr(start, '\n', f->size - f->pos);
    size_t len = nl ? (size_t)(nl - start) : f->size - f->pos;
    f->pos += len + (nl != NULL);
    f->line++;
    if (len > 0 && start[len - 1] == '\r') len--;
    json_error_t jerr;
    *obj = json_loadb(start, len, 0, &jerr);
    if (!*obj) return neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: %s", f->path, (long long)f->line, len ? jerr.text : "empty line");
    if (!json_is_object(*obj)) {
        json_decref(*obj);
        return neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: not a JSON object", f->path, (long long)f->line);
    }
    return 1;
}

static const char *field_str(const jsonl_file *f, json_t *obj, const char *key, neox_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) return neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: missing field \"%s\"", f->path, (long long)f->line, key), NULL;
    if (!json_is_string(v))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: field \"%s\" is not a string", f->path, (long long)f->line, key), NULL;
    return json_string_value(v);
}

// ---- metrics --------------------------------------------------------------------------------------
static void add_metric(neox_task_result *r, const char *name, double value, double stderr_value, int has_stderr) {
    r->metrics[r->nmetrics++] = (neox_metric){name, value, stderr_value, has_stderr};
}

// The harness's mean_stderr: sample standard deviation (n - 1) over sqrt(n).
static double mean_stderr(const double *x, int64_t n, double *mean) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    *mean = n > 0 ? sum / (double)n : NAN;
    if (n < 2) return NAN;
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
    return sqrt(ss / (double)(n - 1)) / sqrt((double)n);
}

// As the harness: a standard error needs two examples, and bootstrap_iters 0 turns them all off.
static void add_mean_metric(neox_task_result *r, const char *name, const double *x, int64_t n, const neox_task_options *o) {
    double mean, se = mean_stderr(x, n, &mean);
    add_metric(r, name, mean, se, n >= 2 && o->bootstrap_iters > 0);
}

// perplexity = exp(-mean loglikelihood), its standard error bootstrapped as the harness does
// (lib/eval/bootstrap.c); the data-parallel ranks draw a share of the chunks each and sum the
// resamples (each lies at its own place, zeros elsewhere), so every rank gets all of them.
static void add_perplexity_metric(neox_evaluator *ev, neox_task_result *r, const double *ll, int64_t n,
                                  const neox_task_options *o) {
    double mean;
    mean_stderr(ll, n, &mean);
    int64_t count = neox_bootstrap_count(o->bootstrap_iters);
    double se = NAN;
    if (n >= 2 && count >= 2) {
        double *rep = neox_calloc((size_t)count, sizeof *rep);
        neox_bootstrap_perplexity(ll, n, o->bootstrap_iters, ev->grid->data_rank, ev->grid->data_size, rep);
        if (ev->grid->data_size > 1) neox_allreduce_sum(&ev->grid->data, rep, (size_t)count, NEOX_F64);
        se = neox_sample_stddev(rep, count);
        free(rep);
    }
    add_metric(r, "perplexity", exp(-mean), se, n >= 2 && count >= 2);
}

// ---- loglikelihood tasks (lambada_openai, loglikelihood:) ------------------------------------------
typedef struct pair_list {
    neox_ll_request *reqs;
    int64_t n, cap;
} pair_list;

static neox_ll_request *pair_add(pair_list *p) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->reqs = neox_realloc(p->reqs, (size_t)p->cap * sizeof *p->reqs);
    }
    return &p->reqs[p->n++];
}

static void pair_free(pair_list *p) {
    for (int64_t i = 0; i < p->n; i++) neox_ll_request_release(&p->reqs[i]);
    free(p->reqs);
}

static int add_pair(neox_evaluator *ev, pair_list *p, const char *ctx, const char *cont, const jsonl_file *f,
                    neox_error *err) {
    neox_ll_request *r = pair_add(p);
    if (neox_eval_encode_pair(ev, ctx, cont, r, err) != 0) {
        p->n--;
        neox_ll_request_release(r);
        return neox_fail_context(err, "%s:%lld", f->path, (long long)f->line);
    }
    return 0;
}

// lambada_openai: context = the words before the last (split on ' '), target = ' ' + last word.
static int lambada_pair(neox_evaluator *ev, pair_list *p, const jsonl_file *f, json_t *obj, neox_error *err) {
    const char *text = field_str(f, obj, "text", err);
    if (!text) return -1;
    const char *space = strrchr(text, ' ');
    char *ctx = space ? neox_strndup(text, (size_t)(space - text)) : neox_strdup("");
    char *target = neox_asprintf(" %s", space ? space + 1 : text);
    int rc = add_pair(ev, p, ctx, target, f, err);
    free(ctx);
    free(target);
    return rc;
}

static int generic_pair(neox_evaluator *ev, pair_list *p, const jsonl_file *f, json_t *obj, neox_error *err) {
    const char *ctx = field_str(f, obj, "context", err), *cont = ctx ? field_str(f, obj, "continuation", err) : NULL;
    return cont ? add_pair(ev, p, ctx, cont, f, err) : -1;
}

typedef int (*pair_reader)(neox_evaluator *, pair_list *, const jsonl_file *, json_t *, neox_error *);

static int loglikelihood_task(neox_evaluator *ev, const char *path, pair_reader read, const neox_task_options *o,
                              neox_task_result *out, neox_error *err) {
    jsonl_file f;
    if (jsonl_open(&f, path, err) != 0) return -1;
    pair_list p = {0};
    json_t *obj;
    int rc = 0;
    while ((o->limit <= 0 || p.n < o->limit) && (rc = jsonl_next(&f, &obj, err)) > 0) {
        rc = read(ev, &p, &f, obj, err);
        json_decref(obj);
        if (rc != 0) break;
    }
    neox_ll_result *res = rc == 0 ? neox_malloc(((size_t)p.n + 1) * sizeof *res) : NULL;
    if (rc == 0) rc = neox_eval_loglikelihood(ev, p.reqs, p.n, res, out->task, err);
    if (rc == 0) {
        double *ll = neox_malloc(((size_t)p.n + 1) * sizeof *ll), *acc = neox_malloc(((size_t)p.n + 1) * sizeof *acc);
        for (int64_t i = 0; i < p.n; i++) ll[i] = res[i].ll, acc[i] = res[i].greedy;
        add_perplexity_metric(ev, out, ll, p.n, o);
        add_mean_metric(out, "acc", acc, p.n, o);
        out->examples = p.n;
        free(ll);
        free(acc);
    }
    free(res);
    pair_free(&p);
    free(f.text);
    return rc;
}

// ---- multiple choice (piqa, mc:) --------------------------------------------------------------------
typedef struct mc_doc {
    int first, count;     // its requests
    int label;
    double *lengths;      // choice lengths in characters (acc_norm)
} mc_doc;

typedef struct mc_set {
    pair_list p;
    mc_doc *docs;
    int64_t n, cap;
} mc_set;

static mc_doc *mc_add(mc_set *s) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->docs = neox_realloc(s->docs, (size_t)s->cap * sizeof *s->docs);
    }
    s->docs[s->n] = (mc_doc){(int)s->p.n, 0, 0, NULL};
    return &s->docs[s->n++];
}

static void mc_free(mc_set *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->docs[i].lengths);
    free(s->docs);
    pair_free(&s->p);
}

// One document: context, choices (lengths for acc_norm), the continuations scored and the label.
static int mc_doc_add(neox_evaluator *ev, mc_set *s, const jsonl_file *f, const char *ctx, const char *const *choices,
                      const char *const *scored, int nchoices, int label, neox_error *err) {
    mc_doc *d = mc_add(s);
    d->label = label;
    d->lengths = neox_malloc((size_t)nchoices * sizeof *d->lengths);
    for (int c = 0; c < nchoices; c++) {
        if (add_pair(ev, &s->p, ctx, scored[c], f, err) != 0) return -1;
        d->lengths[c] = (double)neox_count_codepoints(choices[c]);
        d->count++;
    }
    return 0;
}

static int generic_mc_doc(neox_evaluator *ev, mc_set *s, const jsonl_file *f, json_t *obj, neox_error *err) {
    const char *ctx = field_str(f, obj, "context", err);
    if (!ctx) return -1;
    json_t *choices = json_object_get(obj, "choices"), *label = json_object_get(obj, "label");
    if (!json_is_array(choices) || json_array_size(choices) < 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: field \"choices\" %s", f->path, (long long)f->line,
                         choices ? "is not a non-empty list" : "is missing");
    if (!json_is_integer(label))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: field \"label\" %s", f->path, (long long)f->line,
                         label ? "is not an integer" : "is missing");
    int n = (int)json_array_size(choices);
    const char **text = neox_malloc((size_t)n * sizeof *text);
    for (int c = 0; c < n; c++) {
        text[c] = json_string_value(json_array_get(choices, (size_t)c));
        if (!text[c]) {
            free(text);
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: choice %d is not a string", f->path, (long long)f->line, c);
        }
    }
    json_int_t l = json_integer_value(label);
    if (l < 0 || l >= n) {
        free(text);
        return neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: label %lld is out of range (%d choices)", f->path,
                         (long long)f->line, (long long)l, n);
    }
    int rc = mc_doc_add(ev, s, f, ctx, text, text, n, (int)l, err);
    free(text);
    return rc;
}

// piqa: "Question: {goal}\nAnswer:" with the choices " {sol1}" and " {sol2}" (the harness's
// target_delimiter); acc_norm divides by the length of sol1/sol2 themselves.
static int piqa_doc(neox_evaluator *ev, mc_set *s, const jsonl_file *f, json_t *obj, neox_error *err) {
    const char *goal = field_str(f, obj, "goal", err), *sol1 = goal ? field_str(f, obj, "sol1", err) : NULL,
               *sol2 = sol1 ? field_str(f, obj, "sol2", err) : NULL;
    if (!sol2) return -1;
    char *ctx = neox_asprintf("Question: %s\nAnswer:", goal), *c1 = neox_asprintf(" %s", sol1), *c2 = neox_asprintf(" %s", sol2);
    const char *choices[2] = {sol1, sol2}, *scored[2] = {c1, c2};
    int rc = mc_doc_add(ev, s, f, ctx, choices, scored, 2, 0, err);  // labels come from their own file
    free(ctx);
    free(c1);
    free(c2);
    return rc;
}

static int argmax(const double *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int mc_score(neox_evaluator *ev, mc_set *s, const neox_task_options *o, neox_task_result *out, neox_error *err) {
    neox_ll_result *res = neox_malloc(((size_t)s->p.n + 1) * sizeof *res);
    int rc = neox_eval_loglikelihood(ev, s->p.reqs, s->p.n, res, out->task, err);
    if (rc == 0) {
        double *acc = neox_malloc(((size_t)s->n + 1) * sizeof *acc), *acc_norm = neox_malloc(((size_t)s->n + 1) * sizeof *acc_norm);
        for (int64_t i = 0; i < s->n; i++) {
            const mc_doc *d = &s->docs[i];
            double ll[d->count > 0 ? d->count : 1], norm[d->count > 0 ? d->count : 1];
            for (int c = 0; c < d->count; c++) {
                ll[c] = res[d->first + c].ll;
                norm[c] = ll[c] / d->lengths[c];  // a zero length gives ±inf as numpy does
            }
            acc[i] = argmax(ll, d->count) == d->label;
            acc_norm[i] = argmax(norm, d->count) == d->label;
        }
        add_mean_metric(out, "acc", acc, s->n, o);
        add_mean_metric(out, "acc_norm", acc_norm, s->n, o);
        out->examples = s->n;
        free(acc);
        free(acc_norm);
    }
    free(res);
    return rc;
}

static int generic_mc_task(neox_evaluator *ev, const char *path, const neox_task_options *o, neox_task_result *out,
                           neox_error *err) {
    jsonl_file f;
    if (jsonl_open(&f, path, err) != 0) return -1;
    mc_set s = {0};
    json_t *obj;
    int rc = 0;
    while ((o->limit <= 0 || s.n < o->limit) && (rc = jsonl_next(&f, &obj, err)) > 0) {
        rc = generic_mc_doc(ev, &s, &f, obj, err);
        json_decref(obj);
        if (rc != 0) break;
    }
    if (rc == 0) rc = mc_score(ev, &s, o, out, err);
    mc_free(&s);
    free(f.text);
    return rc;
}

// The labels file: one integer (0 or 1) a line, as many lines as questions.
static int read_labels(const char *path, int64_t need, int *labels, neox_error *err) {
    size_t size;
    char *text = neox_read_file(path, &size, err);
    if (!text) return -1;
    int64_t line = 0;
    char *p = text, *end = text + size;
    int rc = 0;
    while (line < need && rc == 0) {
        if (p >= end) {
            rc = neox_fail(err, NEOX_EXIT_USAGE, "%s: has %lld labels, %lld questions need one each", path, (long long)line,
                           (long long)need);
            break;
        }
        char *nl = memchr(p, '\n', (size_t)(end - p)), *stop = nl ? nl : end;
        line++;
        if (stop > p && stop[-1] == '\r') stop--;
        if (stop - p == 1 && (*p == '0' || *p == '1')) labels[line - 1] = *p - '0';
        else rc = neox_fail(err, NEOX_EXIT_USAGE, "%s:%lld: expected a label 0 or 1", path, (long long)line);
        p = nl ? nl + 1 : end;
    }
    free(text);
    return rc;
}

static int piqa_task(neox_evaluator *ev, const neox_task_options *o, neox_task_result *out, neox_error *err) {
    char *path = neox_asprintf("%s/piqa_valid.jsonl", o->data_dir), *lpath = neox_asprintf("%s/piqa_valid-labels.lst", o->data_dir);
    jsonl_file f;
    mc_set s = {0};
    int rc = jsonl_open(&f, path, err);
    json_t *obj;
    while (rc == 0 && (o->limit <= 0 || s.n < o->limit) && (rc = jsonl_next(&f, &obj, err)) > 0) {
        rc = piqa_doc(ev, &s, &f, obj, err);
        json_decref(obj);
        if (rc != 0) break;
    }
    if (rc == 0) {
        int *labels = neox_malloc(((size_t)s.n + 1) * sizeof *labels);
        rc = read_labels(lpath, s.n, labels, err);
        for (int64_t i = 0; rc == 0 && i < s.n; i++) s.docs[i].label = labels[i];
        free(labels);
    }
    if (rc == 0) rc = mc_score(ev, &s, o, out, err);
    mc_free(&s);
    if (f.text) free(f.text);
    free(path);
    free(lpath);
    return rc;
}

// ---- rolling loglikelihood (wikitext, rolling:) ----------------------------------------------------
typedef struct rolling_doc {
    char *text;           // scored (wikitext: detokenized)
    int64_t words, bytes; // of the original text
} rolling_doc;

static int rolling_score(neox_evaluator *ev, rolling_doc *docs, int64_t n, neox_task_result *out, neox_error *err) {
    pair_list p = {0};
    int64_t *first = neox_malloc(((size_t)n + 1) * sizeof *first);
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        int32_t *ids = NULL;
        size_t len = 0, cap = 0;
        first[i] = p.n;
        if (neox_tokenizer_encode(ev->tokenizer, docs[i].text, strlen(docs[i].text), &ids, &len, &cap, err) < 0) {
            rc = -1;
        } else {
            neox_ll_request *w;
            int64_t nw = neox_rolling_windows(ids, (int64_t)len, ev->prefix_id, ev->seq_length, &w);
            for (int64_t k = 0; k < nw; k++) *pair_add(&p) = w[k];
            free(w);
        }
        free(ids);
    }
    first[n] = p.n;
    neox_ll_result *res = neox_malloc(((size_t)p.n + 1) * sizeof *res);
    if (rc == 0) rc = neox_eval_loglikelihood(ev, p.reqs, p.n, res, out->task, err);
    if (rc == 0) {
        double ll = 0.0, words = 0.0, bytes = 0.0;
        for (int64_t i = 0; i < n; i++) {
            double doc_ll = 0.0;  // summed per document first, as the harness does
            for (int64_t k = first[i]; k < first[i + 1]; k++) doc_ll += res[k].ll;
            ll += doc_ll;
            words += (double)docs[i].words;
            bytes += (double)docs[i].bytes;
        }
        add_metric(out, "word_perplexity", exp(-ll / words), NAN, 0);
        add_metric(out, "byte_perplexity", exp(-ll / bytes), NAN, 0);
        add_metric(out, "bits_per_byte", -ll / bytes / log(2.0), NAN, 0);
        out->examples = n;
    }
    free(res);
    free(first);
    pair_free(&p);
    return rc;
}

static void rolling_free(rolling_doc *docs, int64_t n) {
    for (int64_t i = 0; i < n; i++) free(docs[i].text);
    free(docs);
}

// WikiText-2 test pages rebuilt from the dataset's rows (one row a line, CRLF or LF): a row
// " = Title = " (a level-1 heading) starts a page; each row keeps its line end as "\n".
static int wikitext_pages(const char *path, int64_t limit, rolling_doc **out, int64_t *count, neox_error *err) {
    size_t size;
    char *text = neox_read_file(path, &size, err);
    if (!text) return -1;
    rolling_doc *docs = NULL;
    int64_t n = 0;
    char *page = NULL;
    size_t page_len = 0;
    for (char *p = text, *end = text + size; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *stop = nl ? nl : end;
        size_t len = (size_t)(stop - p) - (stop > p && stop[-1] == '\r');
        int heading = len >= 3 && !strncmp(p, " = ", 3) && !(len >= 5 && !strncmp(p, " = = ", 5));
        if (heading && page) {
            docs = neox_realloc(docs, (size_t)(n + 1) * sizeof *docs);
            docs[n++].text = page;
            page = NULL;
            page_len = 0;
        }
        page = neox_realloc(page, page_len + len + 2);
        memcpy(page + page_len, p, len);
        page_len += len;
        page[page_len++] = '\n';
        page[page_len] = 0;
        p = nl ? nl + 1 : end;
    }
    if (page) {
        docs = neox_realloc(docs, (size_t)(n + 1) * sizeof *docs);
        docs[n++].text = page;
    }
    free(text);
    if (limit > 0 && n > limit) {
        for (int64_t i = limit; i < n; i++) free(docs[i].text);
        n = limit;
    }
    for (int64_t i = 0; i < n; i++) {
        char *original = docs[i].text;
        docs[i].words = neox_count_words(original, strlen(original));
        docs[i].bytes = (int64_t)strlen(original);
        docs[i].text = neox_wikitext_detokenize(original);
        free(original);
    }
    *out = docs;
    *count = n;
    return 0;
}

static int wikitext_task(neox_evaluator *ev, const neox_task_options *o, neox_task_result *out, neox_error *err) {
    char *path = neox_asprintf("%s/wikitext-2-raw_test_hfrows_crlf.raw", o->data_dir);
    rolling_doc *docs = NULL;
    int64_t n = 0;
    int rc = wikitext_pages(path, o->limit, &docs, &n, err);
    if (rc == 0) rc = rolling_score(ev, docs, n, out, err);
    rolling_free(docs, n);
    free(path);
    return rc;
}

static int generic_rolling_task(neox_evaluator *ev, const char *path, const neox_task_options *o, neox_task_result *out,
                                neox_error *err) {
    jsonl_file f;
    if (jsonl_open(&f, path, err) != 0) return -1;
    rolling_doc *docs = NULL;
    int64_t n = 0;
    json_t *obj;
    int rc = 0;
    while ((o->limit <= 0 || n < o->limit) && (rc = jsonl_next(&f, &obj, err)) > 0) {
        const char *text = field_str(&f, obj, "text", err);
        if (text) {
            docs = neox_realloc(docs, (size_t)(n + 1) * sizeof *docs);
            docs[n++] = (rolling_doc){neox_strdup(text), neox_count_words(text, strlen(text)), (int64_t)strlen(text)};
        }
        json_decref(obj);
        if (!text) {
            rc = -1;
            break;
        }
    }
    if (rc == 0) rc = rolling_score(ev, docs, n, out, err);
    rolling_free(docs, n);
    free(f.text);
    return rc;
}

// ---- dispatch -------------------------------------------------------------------------------------
int neox_eval_task(neox_evaluator *ev, const char *name, const neox_task_options *o, neox_task_result *out,
                   neox_error *err) {
    *out = (neox_task_result){.task = neox_strdup(name)};
    double start = neox_now();
    int rc = 0;
    if (!strcmp(name, "lambada_openai")) {
        char *path = neox_asprintf("%s/lambada_test.jsonl", o->data_dir);
        rc = loglikelihood_task(ev, path, lambada_pair, o, out, err);
        free(path);
    } else if (!strcmp(name, "piqa")) {
        rc = piqa_task(ev, o, out, err);
    } else if (!strcmp(name, "wikitext")) {
        rc = wikitext_task(ev, o, out, err);
    } else if (!strncmp(name, "mc:", 3)) {
        rc = generic_mc_task(ev, name + 3, o, out, err);
    } else if (!strncmp(name, "loglikelihood:", 14)) {
        rc = loglikelihood_task(ev, name + 14, generic_pair, o, out, err);
    } else if (!strncmp(name, "rolling:", 8)) {
        rc = generic_rolling_task(ev, name + 8, o, out, err);
    } else {
        rc = neox_fail(err, NEOX_EXIT_USAGE, "eval_tasks: unknown task '%s' (known: lambada_openai, piqa, wikitext, "
                       "mc:FILE, loglikelihood:FILE, rolling:FILE)", name);
    }
    out->seconds = neox_now() - start;
    return rc;
}

void neox_task_result_release(neox_task_result *r) {
    free(r->task);
    r->task = NULL;
}
