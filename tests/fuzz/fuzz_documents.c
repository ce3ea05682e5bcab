// fuzz_documents.c: a jsonl corpus file (plain, zstd or gzip: the reader tells them by their magic
// bytes) through the document reader, and the "text" field of every record it splits out.
#include "data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *path = fuzz_write("corpus.jsonl", data, size);
    neox_error err = {0};
    const char *inputs[] = {path};
    neox_doc_reader *r = neox_doc_reader_open(inputs, 1, &err);
    if (r) {
        neox_doc_reader_set_max_record(r, 1 << 20);  // a decompression bomb then stops at 1 MiB
        neox_record recs[16];
        int n;
        while ((n = neox_doc_reader_next(r, recs, 16, 1 << 20, &err)) > 0)
            for (int i = 0; i < n; i++) {
                size_t text_size;
                neox_error rec_err = {0};
                free(neox_record_text(&recs[i], "text", &text_size, &rec_err));
            }
        neox_doc_reader_close(r);
    }
    free(path);
    return 0;
}
