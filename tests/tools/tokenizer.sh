#!/usr/bin/env bash
# tests/tools/tokenizer.sh: the tokenizer subcommands of neox-preprocess (encode, decode,
# train-tokenizer) on the shared GPT-2 and GPT-NeoX-20B tokenizer files; expected ids are the
# published ggml vectors ("Hello World!" => 15496,2159,0 for GPT-2; 12092,3645,2 for 20B).
source tests/lib.sh
P=$NEOX_BIN/neox-preprocess
TOK=$DATA/tokenizers
GPT2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$TOK/gpt2/vocab.json" --merge-file "$TOK/gpt2/merges.txt")
NEOX=(--tokenizer-type HFTokenizer --vocab-file "$TOK/neox/20B_tokenizer.json")

check_output "encode --help" "--tokenizer-type" $P encode --help
check_output "train-tokenizer --help" "--vocab-size" $P train-tokenizer --help
check_fails "encode without --tokenizer-type" 2 "tokenizer-type is required" $P encode /dev/null
check_fails "unknown tokenizer type" 2 "unknown tokenizer type 'Nope'" $P encode --tokenizer-type Nope /dev/null
check_fails "SPMTokenizer without a vocab file" 2 "SPMTokenizer needs a vocab file" $P encode --tokenizer-type SPMTokenizer /dev/null
check_fails "SPMTokenizer on a file that is not a model" 1 "README.md: not a SentencePiece model" \
    $P encode --tokenizer-type SPMTokenizer --vocab-file README.md /dev/null
check_fails "TiktokenTokenizer on a file that is not a rank file" 1 "README.md:1: " \
    $P encode --tokenizer-type TiktokenTokenizer --vocab-file README.md /dev/null
printf 'Hello' >"$TEST_TMP/hello.txt"
check_output "char-level encode" "^72 101 108 108 111$" $P encode --tokenizer-type CharLevelTokenizer "$TEST_TMP/hello.txt"

if need_shared "tokenizer files"; then
    printf 'Hello World!' >"$TEST_TMP/hw.txt"
    check_output "GPT-2 encode" "^15496 2159 0$" $P encode "${GPT2[@]}" "$TEST_TMP/hw.txt"
    check_output "GPT-2 encode from stdin" "^15496 2159 0$" $P encode "${GPT2[@]}" - <"$TEST_TMP/hw.txt"
    check_output "20B encode" "^12092 3645 2$" $P encode "${NEOX[@]}" "$TEST_TMP/hw.txt"
    printf 'a   b\n' >"$TEST_TMP/spaces.txt"
    check_output "20B whitespace-run token (3 spaces -> 50275)" " 50275 " $P encode "${NEOX[@]}" "$TEST_TMP/spaces.txt"
    printf 'Hello World!\nHello World!\n' >"$TEST_TMP/two.txt"
    check "encode --lines: one line of ids per line" bash -c \
        "[ \"\$($P encode ${GPT2[*]} --lines $TEST_TMP/two.txt)\" = \"\$(printf '15496 2159 0\n15496 2159 0')\" ]"
    printf '15496 2159 0' >"$TEST_TMP/ids.txt"
    check_output "GPT-2 decode" "^Hello World!$" $P decode "${GPT2[@]}" "$TEST_TMP/ids.txt"
    printf '15496,2159,0\n15496\n' >"$TEST_TMP/ids2.txt"
    check "decode --lines" bash -c "[ \"\$($P decode ${GPT2[*]} --lines $TEST_TMP/ids2.txt)\" = \"\$(printf 'Hello World!\nHello')\" ]"
    printf '99999999' >"$TEST_TMP/bad_ids.txt"
    check_fails "decode of an out-of-range id" 1 "token id 99999999 is out of range" $P decode "${GPT2[@]}" "$TEST_TMP/bad_ids.txt"
    printf '12 x' >"$TEST_TMP/bad_ids2.txt"
    check_fails "decode of a non-number" 1 "'x' is not a token id" $P decode "${GPT2[@]}" "$TEST_TMP/bad_ids2.txt"
    check_fails "missing merge file" 2 "needs a vocab file" $P encode --tokenizer-type GPT2BPETokenizer \
        --vocab-file "$TOK/gpt2/vocab.json" "$TEST_TMP/hw.txt"
    check_fails "unreadable vocab file" 1 "/nonexistent/vocab.json" $P encode --tokenizer-type GPT2BPETokenizer \
        --vocab-file /nonexistent/vocab.json --merge-file "$TOK/gpt2/merges.txt" "$TEST_TMP/hw.txt"
    printf 'caf\xc3\xa9 \xff\xfe ok' >"$TEST_TMP/bad_utf8.txt"
    check_output "invalid UTF-8 is encoded (as U+FFFD)" "[0-9]" $P encode "${NEOX[@]}" "$TEST_TMP/bad_utf8.txt"
    # encode --threads: the published vector again, with a cut at every allowed point.
    check_output "encode --threads with one-byte pieces" "^12092 3645 2$" \
        $P encode "${NEOX[@]}" --threads 2 --piece-bytes 1 "$TEST_TMP/hw.txt"
    check_fails "encode --threads 0" 2 "--threads" $P encode "${NEOX[@]}" --threads 0 "$TEST_TMP/hw.txt"
    check_fails "encode --piece-bytes 0" 2 "--piece-bytes" $P encode "${NEOX[@]}" --threads 2 --piece-bytes 0 "$TEST_TMP/hw.txt"
    # Round trip through a freshly trained tokenizer.
    check "train-tokenizer" $P train-tokenizer --input "$DATA/text/tinyshakespeare_input.txt" --vocab-size 1000 \
        --output "$TEST_TMP/trained.json"
    head -c 2000 "$DATA/text/tinyshakespeare_input.txt" >"$TEST_TMP/sample.txt"
    # The trained pre-tokenizer adds a prefix space (add_prefix_space, as GPT-NeoX trains), which decode keeps.
    { printf ' '; cat "$TEST_TMP/sample.txt"; } >"$TEST_TMP/sample_prefixed.txt"
    check "trained tokenizer round-trips text" bash -c "$P encode --tokenizer-type HFTokenizer --vocab-file \
        $TEST_TMP/trained.json $TEST_TMP/sample.txt | $P decode --tokenizer-type HFTokenizer --vocab-file \
        $TEST_TMP/trained.json - | cmp - $TEST_TMP/sample_prefixed.txt"
    check_fails "train-tokenizer: vocab too small" 2 "below the 2 special tokens" $P train-tokenizer \
        --input "$TEST_TMP/sample.txt" --vocab-size 10 --output "$TEST_TMP/x.json"
    check_fails "train-tokenizer: missing input" 1 "/nonexistent.txt" $P train-tokenizer --input /nonexistent.txt \
        --vocab-size 1000 --output "$TEST_TMP/x.json"
fi
