// fuzz_serve_request.c: a /v1/completions or /v1/chat/completions request body, as `neox-eval
// serve` receives it from a client, through both request parsers and validators (every field's
// type and range, prompts as text or token ids, conversations, stop sequences, logprobs);
// malformed bodies must be refused, never crash.
#include "fuzz_util.h"
#include "serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return neox_serve_fuzz_request(data, size); }
