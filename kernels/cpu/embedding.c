// embedding.c: token (and learned position) embedding lookup and its gradient scatter-add, the
// latter in the order kernels.h fixes for every backend (tokens sorted by id, spans of
// NEOX_EMBEDDING_SPAN sorted tokens), so that a GPU's parallel sums equal these bit for bit.
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "parallel.h"
#include "scratch.h"

void neox_embedding_forward(float *out, const int *ids, const float *wte, const float *wpe, int B, int T, int C) {
    #pragma omp parallel for if ((size_t)B * T * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        if (ids[bt] < 0) memset(o, 0, (size_t)C * sizeof(float));
        else memcpy(o, wte + (size_t)ids[bt] * C, (size_t)C * sizeof(float));
        if (wpe) {
            const float *p = wpe + (size_t)(bt % T) * C;
            for (int c = 0; c < C; c++) o[c] += p[c];
        }
    }
}

void neox_embedding_rows(float *out, const int *ids, const float *rows, int v0, int v1, int N, int C) {
    #pragma omp parallel for if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++)
        if (ids[i] >= v0 && ids[i] < v1) memcpy(out + (size_t)i * C, rows + (size_t)(ids[i] - v0) * C, (size_t)C * sizeof(float));
}

// A token in the order of the gradient's sums: the id as an unsigned key (ids < 0, which add
// nothing, sort last, as a radix sort of the same keys leaves them) and its position, the tie-break
// that makes the sort stable.
typedef struct { unsigned key; int pos; } sorted_token;

static int by_key(const void *a, const void *b) {
    const sorted_token *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

// Adds the rows of dout that tokens order[j], j in [j0, j1), point at to acc[c0, c1).
static void add_rows(float *acc, const float *dout, const sorted_token *order, int j0, int j1, int c0, int c1, int C) {
    for (int j = j0; j < j1; j++) {
        const float *d = dout + (size_t)order[j].pos * C;
        for (int c = c0; c < c1; c++) acc[c - c0] += d[c];
    }
}

// One id's run of sorted tokens [s, e) into its row's channels [c0, c1): the part inside the span
// holding s straight onto the row, each later span's part summed from zero and then added.
static void add_run(float *row, const float *dout, const sorted_token *order, int s, int e, int c0, int c1, int C) {
    int stop = (s / NEOX_EMBEDDING_SPAN + 1) * NEOX_EMBEDDING_SPAN;
    add_rows(row + c0, dout, order, s, stop < e ? stop : e, c0, c1, C);
    for (int j = stop; j < e; j += NEOX_EMBEDDING_SPAN) {
        float piece[64] = {0};
        int j1 = j + NEOX_EMBEDDING_SPAN < e ? j + NEOX_EMBEDDING_SPAN : e;
        add_rows(piece, dout, order, j, j1, c0, c1, C);
        for (int c = c0; c < c1; c++) row[c] += piece[c - c0];
    }
}

void neox_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *ids, int B, int T, int C) {
    int n = B * T;
    sorted_token *order = neox_cpu_scratch((size_t)n * sizeof *order, "the embedding gradient's token order");
    for (int i = 0; i < n; i++) order[i] = (sorted_token){(unsigned)ids[i], i};
    qsort(order, (size_t)n, sizeof *order, by_key);
    // Threads split the channels (64 at a time), never an id's sum, so the result does not depend
    // on the thread count.
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += 64) {
        int c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int s = 0, e; s < n && (int)order[s].key >= 0; s = e) {
            for (e = s + 1; e < n && order[e].key == order[s].key; e++) {}
            add_run(dwte + (size_t)order[s].key * C, dout, order, s, e, c0, c1, C);
        }
        for (int bt = 0; dwpe && bt < n; bt++) {
            const float *d = dout + (size_t)bt * C;
            float *p = dwpe + (size_t)(bt % T) * C;
            for (int c = c0; c < c1; c++) p[c] += d[c];
        }
    }
    free(order);
}
