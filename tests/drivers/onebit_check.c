// onebit_check.c: runs lib/parallel's 1-bit compressed all-reduce on inputs a numpy oracle wrote,
// and writes what it produced for the oracle to compare (tests/mpi/onebit.sh).
//   mpiexec -n P onebit_check DIR
// DIR/segments.txt: the segment sizes; DIR/input.f32: steps x P x total float32 (rank r's buffer of
// each step). Rank r writes DIR/out_<r>.f32 (steps x total: the buffer after each all-reduce, then
// its final worker and server errors) and DIR/pack_<r>.u8 (the signs of its first input, packed).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradient.h"
#include "kernels/kernels.h"

static void *read_all(const char *path, size_t *size) {
    neox_error err = {0};
    void *data = neox_read_file(path, size, &err);
    if (!data) neox_die_error(&err);
    return data;
}

static void write_all(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) neox_die(NEOX_EXIT_FAILURE, "cannot write %s", path);
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_error err = {0};
    if (neox_parallel_init(&argc, &argv, &err) < 0) neox_die_error(&err);
    if (argc != 2) neox_die(NEOX_EXIT_USAGE, "usage: onebit_check DIR");
    neox_grid grid;
    if (neox_grid_make(&grid, 1, 1, &err) != 0) neox_die_error(&err);
    const char *dir = argv[1];
    size_t n;
    char *path = neox_asprintf("%s/segments.txt", dir);
    char *text = read_all(path, &n);
    free(path);
    size_t sizes[64], total = 0;
    int nseg = 0;
    for (char *p = text, *end; nseg < 64 && (sizes[nseg] = strtoull(p, &end, 10), end != p); p = end) total += sizes[nseg++];
    free(text);

    path = neox_asprintf("%s/input.f32", dir);
    float *input = read_all(path, &n);
    free(path);
    int p = grid.data.size, r = grid.data.rank;
    size_t steps = n / sizeof(float) / total / (size_t)p;
    neox_onebit *o = neox_onebit_make(&grid.data, NULL, sizes, nseg);
    size_t nw, ns;
    float *werr = neox_onebit_error(o, 0, &nw), *serr = neox_onebit_error(o, 1, &ns);
    float *out = neox_malloc((steps * total + nw + ns) * sizeof(float));
    for (size_t s = 0; s < steps; s++) {
        float *buf = out + s * total;
        memcpy(buf, input + (s * (size_t)p + (size_t)r) * total, total * sizeof(float));
        neox_onebit_allreduce(o, buf);
    }
    memcpy(out + steps * total, werr, nw * sizeof(float));
    memcpy(out + steps * total + nw, serr, ns * sizeof(float));
    path = neox_asprintf("%s/out_%d.f32", dir, r);
    write_all(path, out, (steps * total + nw + ns) * sizeof(float));
    free(path);

    // The signs alone: the compression op on a zero error packs exactly the input's signs.
    size_t packed = total / 8 * 8;
    uint8_t *bits = neox_malloc(total / 8 + 1), scale[4];
    float *zero = neox_calloc(packed + 1, sizeof(float));
    neox_onebit_compress(bits, 0, scale, 0, zero, input + (size_t)r * total, packed, packed, 1);
    free(zero);
    path = neox_asprintf("%s/pack_%d.u8", dir, r);
    write_all(path, bits, total / 8);
    free(path);

    free(bits);
    free(out);
    free(input);
    neox_onebit_free(o);
    neox_grid_free(&grid);
    neox_parallel_finalize(0);
    return 0;
}
