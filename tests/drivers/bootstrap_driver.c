// bootstrap_driver.c: lib/eval/bootstrap.c for tests/oracle/test_eval.py, which compares it with
// lm-evaluation-harness's definition run on CPython's own random module.
//   bootstrap_driver random SEED K      random.Random(SEED).random() after K earlier calls
//   bootstrap_driver stderr ITERS PARTS the bootstrapped standard error of perplexity of the
//                                       loglikelihoods on stdin (one a line), the chunks drawn in
//                                       PARTS interleaved shares as data-parallel ranks draw them
// Numbers are printed with 17 significant digits (they read back exactly).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"

static double *read_numbers(int64_t *n) {
    double *x = NULL, v;
    int64_t cap = 0;
    *n = 0;
    while (scanf("%lf", &v) == 1) {
        if (*n == cap) x = neox_realloc(x, (size_t)(cap = cap ? 2 * cap : 256) * sizeof *x);
        x[(*n)++] = v;
    }
    return x;
}

static int print_stderr(int64_t iters, int parts) {
    int64_t n, count = neox_bootstrap_count(iters);
    double *ll = read_numbers(&n), *rep = neox_calloc((size_t)count + 1, sizeof *rep);
    for (int part = 0; part < parts; part++) neox_bootstrap_perplexity(ll, n, iters, part, parts, rep);
    printf("%.17g\n", neox_sample_stddev(rep, count));
    free(ll);
    free(rep);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "random")) {
        printf("%.17g\n", neox_python_random(strtoull(argv[2], NULL, 10), strtoll(argv[3], NULL, 10)));
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "stderr")) return print_stderr(strtoll(argv[2], NULL, 10), atoi(argv[3]));
    fprintf(stderr, "usage: %s random SEED K | stderr ITERS PARTS < numbers\n", argv[0]);
    return 2;
}
