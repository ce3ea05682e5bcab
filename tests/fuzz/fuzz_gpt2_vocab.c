// fuzz_gpt2_vocab.c: GPT-2 tokenizer files (vocab.json and merges.txt) through the
// GPT2BPETokenizer loader. The input is the vocab.json, a line "=====", then the merges.txt.
#include "fuzz_util.h"
#include "tokenizer.h"

static const char text[] = "Hello world, \xc3\xa9t\xc3\xa9 <|endoftext|> 123\n\tend";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *vocab, *merges;
    size_t vocab_size, merges_size;
    fuzz_split(data, size, "\n=====\n", &vocab, &vocab_size, &merges, &merges_size);
    char *vocab_path = fuzz_write("vocab.json", vocab, vocab_size), *merges_path = fuzz_write("merges.txt", merges, merges_size);
    neox_error err = {0};
    neox_tokenizer_options opts = {.type = "GPT2BPETokenizer", .vocab_file = vocab_path, .merge_file = merges_path};
    neox_tokenizer *tok = neox_tokenizer_load(&opts, &err);
    if (tok) {
        int32_t *ids = NULL;
        size_t len = 0, cap = 0, out_size;
        if (neox_tokenizer_encode(tok, text, sizeof text - 1, &ids, &len, &cap, &err) >= 0)
            free(neox_tokenizer_decode(tok, ids, len, &out_size, &err));
        free(ids);
        neox_tokenizer_free(tok);
    }
    free(vocab_path);
    free(merges_path);
    return 0;
}
