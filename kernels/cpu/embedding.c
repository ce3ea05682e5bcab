// embedding.c: token (and learned position) embedding lookup and its gradient scatter-add, the
// latter in the order kernels.h fixes for every backend (tokens sorted by id, spans of
// NEOX_EMBEDDING_SPAN sorted tokens), so that a GPU's parallel sums equal these bit for bit. The
// looked-up rows are stored as the activations are (kernels.h, "Activation storage"); the table and
// its gradient stay fp32.
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "parallel.h"
#include "scratch.h"
#include "storage.h"

void neox_embedding_forward(void *out, const int *ids, const float *wte, const float *wpe, int B, int T, int C,
                            neox_elem act) {
    #pragma omp parallel for if ((size_t)B * T * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int bt = 0; bt < B * T; bt++) {
        size_t o = (size_t)bt * C;
        const float *w = ids[bt] < 0 ? NULL : wte + (size_t)ids[bt] * C;
        const float *p = wpe ? wpe + (size_t)(bt % T) * C : NULL;
        for (int c = 0; c < C; c++) {
            float v = w ? w[c] : 0.0f;  // (no "+ 0.0f" without wpe: it would turn -0 into +0)
            if (p) v += p[c];
            neox_act_set(out, o + c, v, act);
        }
    }
}

void neox_embedding_rows(void *out, const int *ids, const float *rows, int v0, int v1, int N, int C, neox_elem act) {
    #pragma omp parallel for if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++)
        if (ids[i] >= v0 && ids[i] < v1)
            for (int c = 0; c < C; c++) neox_act_set(out, (size_t)i * C + c, rows[(size_t)(ids[i] - v0) * C + c], act);
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
static void add_rows(float *acc, const void *dout, const sorted_token *order, int j0, int j1, int c0, int c1, int C,
                     neox_elem act) {
    for (int j = j0; j < j1; j++) {
        size_t d = (size_t)order[j].pos * C;
        for (int c = c0; c < c1; c++) acc[c - c0] += neox_act_get(dout, d + c, act);
    }
}

// One id's run of sorted tokens [s, e) into its row's channels [c0, c1): the part inside the span
// holding s straight onto the row, each later span's part summed from zero and then added.
static void add_run(float *row, const void *dout, const sorted_token *order, int s, int e, int c0, int c1, int C,
                    neox_elem act) {
    int stop = (s / NEOX_EMBEDDING_SPAN + 1) * NEOX_EMBEDDING_SPAN;
    add_rows(row + c0, dout, order, s, stop < e ? stop : e, c0, c1, C, act);
    for (int j = stop; j < e; j += NEOX_EMBEDDING_SPAN) {
        float piece[64] = {0};
        int j1 = j + NEOX_EMBEDDING_SPAN < e ? j + NEOX_EMBEDDING_SPAN : e;
        add_rows(piece, dout, order, j, j1, c0, c1, C, act);
        for (int c = c0; c < c1; c++) row[c] += piece[c - c0];
    }
}

void neox_embedding_backward(float *dwte, float *dwpe, const void *dout, const int *ids, int B, int T, int C,
                             neox_elem act) {
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
            add_run(dwte + (size_t)order[s].key * C, dout, order, s, e, c0, c1, C, act);
        }
        for (int bt = 0; dwpe && bt < n; bt++) {
            float *p = dwpe + (size_t)(bt % T) * C;
            for (int c = c0; c < c1; c++) p[c] += neox_act_get(dout, (size_t)bt * C + c, act);
        }
    }
    free(order);
}
