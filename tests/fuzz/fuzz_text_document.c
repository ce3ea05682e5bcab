// fuzz_text_document.c: a .txt input (one document per file) through the document reader.
#include "data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *path = fuzz_write("document.txt", data, size);
    neox_error err = {0};
    const char *inputs[] = {path};
    neox_doc_reader *r = neox_doc_reader_open(inputs, 1, &err);
    if (r) {
        neox_doc_reader_set_max_record(r, 1 << 20);  // a decompression bomb then stops at 1 MiB
        neox_record recs[4];
        while (neox_doc_reader_next(r, recs, 4, 1 << 20, &err) > 0) {
        }
        neox_doc_reader_close(r);
    }
    free(path);
    return 0;
}
