// fuzz_tokenizer_json.c: the tokenizer files users bring, through their loaders — a Hugging Face
// tokenizer.json (an input starting with '{': HFTokenizer), a SentencePiece .model (a protobuf
// starting with field 1's tag 0x0A: SPMTokenizer, the shim's error path) or else a tiktoken rank
// file (TiktokenTokenizer). A file that loads then encodes and decodes a fixed text.
#include "fuzz_util.h"
#include "tokenizer.h"

static const char text[] = "Hello world, \xc3\xa9t\xc3\xa9 <|endoftext|> 123\n\tend \xe2\x96\x81x 4567";

static const char *type_of(const uint8_t *data, size_t size) {
    if (size && data[0] == '{') return "HFTokenizer";
    if (size && data[0] == 0x0A) return "SPMTokenizer";
    return "TiktokenTokenizer";
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *type = type_of(data, size);
    char *path = fuzz_write(!strcmp(type, "HFTokenizer") ? "tokenizer.json"
                            : !strcmp(type, "SPMTokenizer") ? "tokenizer.model" : "tokenizer.tiktoken",
                            data, size);
    neox_error err = {0};
    neox_tokenizer_options opts = {.type = type, .vocab_file = path};
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
