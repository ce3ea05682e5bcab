// fuzz_spm_model_proto.c: the SentencePiece ModelProto field reader (lib/tokenizer/spm_model_proto.c)
// on raw bytes. The tokenizer target reaches it only through what libsentencepiece accepted and
// re-serialized; here every byte string must give the fields or -1, with no read out of bounds.
#include "fuzz_util.h"
#include "tokenizer/spm.h"

static volatile unsigned type_sum;  // keeps the reads below

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    spm_proto_fields fields;
    if (spm_proto_read(data, size, &fields) == 0) {
        // Reading every piece's type lets ASan check the array's extent against n_pieces.
        unsigned sum = 0;
        for (size_t i = 0; i < fields.n_pieces; i++) sum += fields.types[i];
        type_sum = sum;
        spm_proto_fields_free(&fields);
    }
    return 0;
}
