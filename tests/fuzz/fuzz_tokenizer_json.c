// fuzz_tokenizer_json.c: a Hugging Face tokenizer.json through the HFTokenizer loader; a file that
// loads then encodes and decodes a fixed text.
#include "fuzz_util.h"
#include "tokenizer.h"

static const char text[] = "Hello world, \xc3\xa9t\xc3\xa9 <|endoftext|> 123\n\tend";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *path = fuzz_write("tokenizer.json", data, size);
    neox_error err = {0};
    neox_tokenizer_options opts = {.type = "HFTokenizer", .vocab_file = path};
    neox_tokenizer *tok = neox_tokenizer_load(&opts, &err);
    if (tok) {
        int32_t *ids = NULL;
        size_t len = 0, cap = 0, out_size;
        if (neox_tokenizer_encode(tok, text, sizeof text - 1, &ids, &len, &cap, &err) >= 0) {
            free(neox_tokenizer_decode(tok, ids, len, &out_size, &err));
        }
        free(ids);
        neox_tokenizer_free(tok);
    }
    free(path);
    return 0;
}
