// fuzz_safetensors.c: a safetensors file through the parser, then every tensor's numel.
#include "fuzz_util.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *buf = neox_malloc(size);
    memcpy(buf, data, size);
    neox_error err = {0};
    neox_safetensors *st = neox_safetensors_parse(buf, size, "model.safetensors", &err);
    if (st) {
        for (int i = 0; i < st->count; i++) {
            (void)neox_st_numel(&st->tensors[i]);
            (void)neox_safetensors_find(st, st->tensors[i].name);
        }
        neox_safetensors_close(st);
    }
    return 0;
}
