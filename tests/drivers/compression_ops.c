// compression_ops.c: runs the compressed and sparse gradient exchanges' backend ops (kernels.h:
// onebit_compress, onebit_average, onebit_decompress, add_scaled, orthonormalise_columns,
// copy_matrix, rows_sum_by_id, scale_rows) on inputs a numpy oracle wrote, through one backend's
// table, and writes what they produced for the oracle to compare (tests/oracle/test_compression_ops.py).
//   compression_ops BACKEND DIR    BACKEND: cpu or emulated (every buffer in its memory)
// DIR/shapes.txt: n padded chunks rows cols V C nids ndistinct; inputs error.f32 (padded), x.f32 (n),
// P.f32 (rows x cols), acc.f32 and y.f32 (rows x cols), grad.f32 (V x C), rows.f32 (nids x C),
// ids.i32 (nids), distinct.i32 (ndistinct). Message blocks: the scale's 4 bytes at offset 1 (not
// aligned, as on the wire), the chunk's signs from offset 5, 3 bytes of slack.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/backend.h"

static const neox_backend *be;
static const char *dir;

static void *load(const char *name, size_t bytes) {
    char *path = neox_asprintf("%s/%s", dir, name);
    neox_error err = {0};
    size_t size = 0;
    void *host = neox_read_file(path, &size, &err);
    if (!host) neox_die_error(&err);
    if (size != bytes) neox_die(NEOX_EXIT_FAILURE, "%s: %zu bytes, expected %zu", path, size, bytes);
    free(path);
    void *dev = be->alloc(bytes + 1);
    be->to_device(dev, host, bytes);
    free(host);
    return dev;
}

static void *zeros(size_t bytes) {
    void *dev = be->alloc(bytes + 1);
    be->memset_zero(dev, bytes + 1);
    return dev;
}

static void save(const char *name, const void *dev, size_t bytes) {
    char *path = neox_asprintf("%s/%s", dir, name);
    void *host = neox_malloc(bytes + 1);
    be->to_host(host, dev, bytes);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(host, 1, bytes, f) != bytes || fclose(f) != 0) neox_die(NEOX_EXIT_FAILURE, "cannot write %s", path);
    free(host);
    free(path);
}

// 1-bit: every chunk compressed into its own block, then averaged as a server would (p = chunks) and
// decompressed as the all-gather's receivers do.
static void onebit(size_t n, size_t padded, int chunks) {
    size_t chunk = padded / (size_t)chunks, block = 5 + chunk / 8 + 3;
    float *error = load("error.f32", padded * 4), *x = load("x.f32", n * 4);
    uint8_t *wire = zeros((size_t)chunks * block);
    be->onebit_compress(wire + 5, block, wire + 1, block, error, x, n, padded, chunks);
    save("error_out.f32", error, padded * 4);
    save("wire.u8", wire, (size_t)chunks * block);
    float *avg = zeros(chunk * 4), *full = zeros(n * 4);
    be->onebit_average(avg, wire, block, 5, 1, chunk, chunks);
    be->onebit_decompress(full, wire, block, 5, 1, chunk, n);
    save("average.f32", avg, chunk * 4);
    save("decompress.f32", full, n * 4);
}

static void powersgd(int rows, int cols) {
    size_t len = (size_t)rows * (size_t)cols * 4;
    float *P = load("P.f32", len), *acc = load("acc.f32", len), *y = load("y.f32", len);
    be->orthonormalise_columns(P, rows, cols);
    save("P_out.f32", P, len);
    be->add_scaled(acc, y, (size_t)rows * (size_t)cols, -3.0f);
    save("acc_out.f32", acc, len);
    float *wide = zeros((size_t)rows * (size_t)(cols + 2) * 4);
    be->copy_matrix(wide, cols + 2, y, cols, rows, cols - 1);
    save("copy_out.f32", wide, (size_t)rows * (size_t)(cols + 2) * 4);
}

static void sparse(int V, int C, int nids, int ndistinct) {
    size_t gbytes = (size_t)V * (size_t)C * 4;
    float *grad = load("grad.f32", gbytes), *rows = load("rows.f32", (size_t)nids * (size_t)C * 4);
    int *ids = load("ids.i32", (size_t)nids * 4), *distinct = load("distinct.i32", (size_t)ndistinct * 4);
    be->rows_sum_by_id(grad, rows, ids, nids, C);
    save("grad_sum.f32", grad, gbytes);
    be->scale_rows(grad, distinct, ndistinct, C, 0.25f);
    save("grad_scaled.f32", grad, gbytes);
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    if (argc != 3) neox_die(NEOX_EXIT_USAGE, "usage: compression_ops cpu|emulated DIR");
    char err[256];
    be = neox_backend_select(argv[1], err, sizeof err);
    if (!be) neox_die(NEOX_EXIT_USAGE, "%s", err);
    dir = argv[2];
    char *path = neox_asprintf("%s/shapes.txt", dir);
    FILE *f = fopen(path, "r");
    size_t n, padded;
    int chunks, rows, cols, V, C, nids, ndistinct;
    if (!f || fscanf(f, "%zu %zu %d %d %d %d %d %d %d", &n, &padded, &chunks, &rows, &cols, &V, &C, &nids,
                     &ndistinct) != 9)
        neox_die(NEOX_EXIT_FAILURE, "%s: expected n padded chunks rows cols V C nids ndistinct", path);
    fclose(f);
    free(path);
    onebit(n, padded, chunks);
    powersgd(rows, cols);
    sparse(V, C, nids, ndistinct);
    return 0;
}
