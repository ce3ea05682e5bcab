// fuzz_yaml_config.c: a YAML config file through the config loader (YAML parsing, merging,
// validation of every key, derivation), as neox-train reads its --conf files.
#include "config.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *path = fuzz_write("config.yml", data, size);
    neox_error err = {0};
    const char *paths[] = {path};
    neox_config_options opts = {.world_size = 1, .quiet = 1};
    neox_config *cfg = neox_config_load(paths, 1, &opts, &err);
    if (cfg) {
        FILE *null = fopen("/dev/null", "w");
        neox_config_print_json(cfg, null);
        fclose(null);
        neox_config_free(cfg);
    }
    free(path);
    return 0;
}
