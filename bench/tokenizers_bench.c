// tokenizers_bench.c: the neox.c side of bench/tokenizers.sh — encodes NUL-separated documents
// with one tokenizer, once per thread count, and prints one line per run:
//   neox.c THREADS MB_PER_S TOKENS BALANCE SCHEDULE
// A loaded machine's wall clock cannot show how well the threads share the work, so two measures
// of it follow. BALANCE: the threads' CPU time summed over the busiest thread's (THREADS when
// evenly shared; under load it also moves work away from a thread the system stalled). SCHEDULE:
// the speed-up on THREADS idle cores of handing out this run's items (pieces and documents,
// longest first, each to the first free thread), from each item's CPU time measured alone on one
// thread; an item is indivisible there, so the OpenMP-task help a whole document gets
// (tokenizer.c) is not counted.
// One thread is timed in CPU time (as the Python peers are), so a busy machine distorts the
// single-thread ratios less; more threads are timed on the wall clock. Documents larger than two
// pieces (NEOX_TOKENIZER_PIECE_BYTES) are cut where the tokenizer says the ids cannot change
// (neox_tokenizer_cuts), and threads take the pieces and the other documents one at a time,
// longest first: a corpus with a few 1 MB documents then no longer leaves one thread encoding
// them while the others have finished. NEOX_BENCH_WHOLE=1 encodes every document whole (the
// same ids, for comparing).
// Usage: tokenizers_bench DOCS_FILE TYPE VOCAB [MERGES|-] THREADS...
#include <omp.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "core.h"
#include "tokenizer.h"

// One unit of work: a whole document or a piece of one.
typedef struct item { size_t start, len; int starts, ends; } item;

static double thread_cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int longer_first(const void *a, const void *b) {
    size_t la = ((const item *)a)->len, lb = ((const item *)b)->len;
    return la < lb ? 1 : la > lb ? -1 : 0;
}

// The documents' items: large documents cut into pieces unless whole is set.
static item *work_items(const neox_tokenizer *tok, const char *text, const size_t *start, const size_t *len,
                        size_t n_docs, int whole, size_t *n_items) {
    size_t cap = n_docs + 16, n = 0, piece = NEOX_TOKENIZER_PIECE_BYTES;
    item *items = neox_malloc(cap * sizeof *items);
    for (size_t d = 0; d < n_docs; d++) {
        size_t max_cuts = len[d] / piece + 1, *cuts = neox_malloc((max_cuts + 2) * sizeof *cuts), n_cuts = 0;
        if (!whole && len[d] >= 2 * piece)
            n_cuts = neox_tokenizer_cuts(tok, text + start[d], len[d], piece, cuts + 1, max_cuts);
        cuts[0] = 0, cuts[n_cuts + 1] = len[d];
        for (size_t i = 0; i <= n_cuts; i++) {
            if (n == cap) items = neox_realloc(items, (cap *= 2) * sizeof *items);
            items[n++] = (item){start[d] + cuts[i], cuts[i + 1] - cuts[i], i == 0, i == n_cuts};
        }
        free(cuts);
    }
    qsort(items, n, sizeof *items, longer_first);
    *n_items = n;
    return items;
}

// Each item's CPU time, encoded alone on this thread.
static double *item_costs(const neox_tokenizer *tok, const char *text, const item *items, size_t n) {
    double *cost = neox_malloc((n ? n : 1) * sizeof *cost);
    int32_t *ids = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; i < n; i++) {
        double t0 = thread_cpu_seconds();
        len = 0;
        neox_tokenizer_encode_piece(tok, text + items[i].start, items[i].len, items[i].starts, items[i].ends, &ids,
                                    &len, &cap, NULL);
        cost[i] = thread_cpu_seconds() - t0;
    }
    free(ids);
    return cost;
}

// Total cost over the makespan of dynamic scheduling in list order on `threads` idle workers.
static double schedule_speedup(const double *cost, size_t n, int threads) {
    double *free_at = neox_calloc((size_t)threads, sizeof *free_at), total = 0, end = 0;
    for (size_t i = 0; i < n; i++) {
        int w = 0;
        for (int k = 1; k < threads; k++)
            if (free_at[k] < free_at[w]) w = k;
        free_at[w] += cost[i];
        total += cost[i];
        if (free_at[w] > end) end = free_at[w];
    }
    free(free_at);
    return end > 0 ? total / end : 1.0;
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    if (argc < 6) neox_die(2, "usage: %s DOCS_FILE TYPE VOCAB MERGES|- THREADS...", argv[0]);
    neox_error err = {0};
    size_t size;
    char *text = neox_read_file(argv[1], &size, &err);
    if (!text) neox_die_error(&err);
    neox_tokenizer_options o = {argv[2], argv[3], strcmp(argv[4], "-") ? argv[4] : NULL};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    if (!tok) neox_die_error(&err);
    size_t n_docs = 0, cap = 1024;
    size_t *start = neox_malloc(cap * sizeof *start), *len = neox_malloc(cap * sizeof *len);
    for (size_t pos = 0; pos <= size;) {
        char *end = memchr(text + pos, 0, size - pos);
        size_t e = end ? (size_t)(end - text) : size;
        if (n_docs == cap) {
            start = neox_realloc(start, (cap *= 2) * sizeof *start);
            len = neox_realloc(len, cap * sizeof *len);
        }
        start[n_docs] = pos, len[n_docs++] = e - pos;
        pos = e + 1;
    }
    // One thread gains nothing from cuts: it encodes whole documents.
    const char *env = getenv("NEOX_BENCH_WHOLE");
    size_t n_cut, n_whole;
    item *cut = work_items(tok, text, start, len, n_docs, env && *env == '1', &n_cut);
    item *whole = work_items(tok, text, start, len, n_docs, 1, &n_whole);
    double *cut_cost = item_costs(tok, text, cut, n_cut);
    for (int a = 5; a < argc; a++) {
        int threads = atoi(argv[a]);
        const item *items = threads > 1 ? cut : whole;
        size_t n_items = threads > 1 ? n_cut : n_whole;
        long long tokens = 0;
        double cpu_sum = 0, cpu_max = 0;
        struct timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        double t0 = neox_now();
#pragma omp parallel num_threads(threads) reduction(+ : tokens)
        {
            double cpu0 = thread_cpu_seconds();
            int32_t *ids = NULL;
            size_t n = 0, c = 0;
#pragma omp for schedule(dynamic, 1)
            for (size_t i = 0; i < n_items; i++) {
                const item *it = &items[i];
                n = 0;
                tokens += neox_tokenizer_encode_piece(tok, text + it->start, it->len, it->starts, it->ends, &ids, &n,
                                                      &c, NULL);
            }
            free(ids);
            double cpu = thread_cpu_seconds() - cpu0;
#pragma omp critical
            {
                cpu_sum += cpu;
                if (cpu > cpu_max) cpu_max = cpu;
            }
        }
        double dt = neox_now() - t0;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        if (threads == 1) dt = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        double balance = cpu_max > 0 ? cpu_sum / cpu_max : 1.0;
        double schedule = threads > 1 ? schedule_speedup(cut_cost, n_cut, threads) : 1.0;
        printf("neox.c %d %.2f %lld %.2f %.2f\n", threads, size / dt / 1e6, tokens, balance, schedule);
        fflush(stdout);
    }
    neox_tokenizer_free(tok);
    free(cut_cost);
    free(cut);
    free(whole);
    free(start);
    free(len);
    free(text);
    return 0;
}
