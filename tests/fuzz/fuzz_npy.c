// fuzz_npy.c: a .npy file (a cached sample index) through the reader and the int64 widening.
#include "data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *path = fuzz_write("index.npy", data, size);
    neox_error err = {0};
    neox_npy a;
    if (neox_npy_read(path, &a, &err) == 0) {
        free(neox_npy_to_i64(&a));
        free(a.data);
    }
    free(path);
    return 0;
}
