// fuzz_manifest.c: a checkpoint's manifest.json through the manifest reader and its validation.
#include "ckpt.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    free(fuzz_write("manifest.json", data, size));
    neox_error err = {0};
    neox_ckpt_manifest m;
    if (neox_ckpt_manifest_read(fuzz_dir(), &m, &err) == 0) neox_ckpt_manifest_free(&m);
    return 0;
}
