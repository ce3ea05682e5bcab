// tokenizers_bench.c: the neox.c side of bench/tokenizers.sh — encodes NUL-separated documents
// with one tokenizer, once per thread count, and prints one line per run:
//   neox.c THREADS MB_PER_S TOKENS
// One thread is timed in CPU time (as the Python peers are), so a busy machine distorts the
// single-thread ratios less; more threads are timed on the wall clock. Threads take documents one
// at a time, longest first: with a few large documents in the corpus, handing them out in file
// order (or several at a time) left one thread tokenizing them while the other had finished.
// Usage: tokenizers_bench DOCS_FILE TYPE VOCAB [MERGES|-] THREADS...
#include <omp.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "core.h"
#include "tokenizer.h"

static const size_t *doc_lengths;
static int longer_first(const void *a, const void *b) {
    size_t la = doc_lengths[*(const size_t *)a], lb = doc_lengths[*(const size_t *)b];
    return la < lb ? 1 : la > lb ? -1 : 0;
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
    size_t *order = neox_malloc((n_docs ? n_docs : 1) * sizeof *order);
    for (size_t d = 0; d < n_docs; d++) order[d] = d;
    doc_lengths = len;
    qsort(order, n_docs, sizeof *order, longer_first);
    for (int a = 5; a < argc; a++) {
        int threads = atoi(argv[a]);
        long long tokens = 0;
        struct timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        double t0 = neox_now();
#pragma omp parallel num_threads(threads) reduction(+ : tokens)
        {
            int32_t *ids = NULL;
            size_t n = 0, c = 0;
#pragma omp for schedule(dynamic, 1)
            for (size_t i = 0; i < n_docs; i++) {
                size_t d = order[i];
                n = 0;
                tokens += neox_tokenizer_encode(tok, text + start[d], len[d], &ids, &n, &c, NULL);
            }
            free(ids);
        }
        double dt = neox_now() - t0;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        if (threads == 1) dt = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        printf("neox.c %d %.2f %lld\n", threads, size / dt / 1e6, tokens);
        fflush(stdout);
    }
    neox_tokenizer_free(tok);
    free(order);
    free(start);
    free(len);
    free(text);
    return 0;
}
