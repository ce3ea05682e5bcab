// fuzz_indexed.c: a Megatron indexed dataset (.idx and .bin) through the reader, then every item
// read back, as token ids and as values (reward datasets, float dtypes included). The input is the
// .idx, a line "=====", then the .bin.
#include "data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *idx, *bin;
    size_t idx_size, bin_size;
    fuzz_split(data, size, "\n=====\n", &idx, &idx_size, &bin, &bin_size);
    free(fuzz_write("data.idx", idx, idx_size));
    free(fuzz_write("data.bin", bin, bin_size));
    char *prefix = fuzz_path("data");
    neox_error err = {0};
    neox_indexed_dataset *ds = neox_indexed_open(prefix, &err);
    if (ds) {
        for (int64_t i = 0; i < ds->num_items && i < 4096; i++) {
            int32_t *tokens = neox_malloc(((size_t)ds->sizes[i] + 1) * sizeof *tokens);
            neox_indexed_get(ds, i, 0, -1, tokens, &err);
            free(tokens);
            double *values = neox_malloc(((size_t)ds->sizes[i] + 1) * sizeof *values);
            neox_indexed_get_values(ds, i, 0, -1, values, &err);
            free(values);
        }
        neox_indexed_close(ds);
    }
    free(prefix);
    return 0;
}
