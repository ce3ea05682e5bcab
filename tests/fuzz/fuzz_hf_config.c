// fuzz_hf_config.c: a Hugging Face config.json through neox-convert from-hf, which reads it into
// a GPT-NeoX model config and loads that back; the folder has no weights, so an import that gets
// past the config ends at the missing model.safetensors.
#include <sys/stat.h>

#include "convert.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *hf = fuzz_path("hf"), *out = fuzz_path("out");
    mkdir(hf, 0755);
    char *config = neox_asprintf("%s/config.json", hf);
    FILE *f = fopen(config, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
    neox_error err = {0};
    neox_cvt_layout lay = {.tp = 1, .pp = 1, .dp = 1};
    neox_convert_from_hf(hf, out, &lay, &err);
    free(config);
    free(hf);
    free(out);
    return 0;
}
