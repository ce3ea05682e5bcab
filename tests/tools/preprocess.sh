#!/usr/bin/env bash
# tests/tools/preprocess.sh: neox-preprocess on the shared corpora: the default mode with
# preprocess_data.py's flags (every input kind, any --workers gives the same bytes), merge, info,
# index, bad input (malformed JSON, missing key, truncated .zst, unreadable file) and interrupted runs.
source tests/lib.sh
P=$NEOX_BIN/neox-preprocess

check_output "help lists the preprocess flags and commands" "--jsonl-keys.*" $P --help
check_output "help lists merge and info" "merge .*" $P --help
check_fails "--ftfy is refused" 2 "ftfy" $P --input x --output-prefix $T/x --tokenizer-type CharLevelTokenizer --ftfy
check_fails "--dataset-impl lazy is refused" 2 "dataset-impl lazy" $P --input x --output-prefix $T/x \
    --tokenizer-type CharLevelTokenizer --dataset-impl lazy
check_fails "--input is required" 2 "input is required" $P --output-prefix $T/x --tokenizer-type CharLevelTokenizer
check_fails "unknown option" 2 "unrecognized option" $P --input x --bogus

need_shared "shared corpora" || exit 0
GPT2=(--tokenizer-type GPT2BPETokenizer --vocab-file $DATA/tokenizers/gpt2/vocab.json --merge-file $DATA/tokenizers/gpt2/merges.txt)
ZST=$DATA/jsonl/dolma_cc_sample_697docs.jsonl.zst
GZ=$DATA/jsonl/dolma_cc_sample_697docs.jsonl.gz

check "jsonl.zst, 1 worker" $P --input $ZST --output-prefix $T/z1 "${GPT2[@]}" --append-eod --workers 1
check "jsonl.zst, 4 workers" $P --input $ZST --output-prefix $T/z4 "${GPT2[@]}" --append-eod --workers 4
check "same .bin for 1 and 4 workers" cmp $T/z1_text_document.bin $T/z4_text_document.bin
check "same .idx for 1 and 4 workers" cmp $T/z1_text_document.idx $T/z4_text_document.idx
check "jsonl.gz" $P --input $GZ --output-prefix $T/g "${GPT2[@]}" --append-eod --workers 2
check "jsonl.gz gives the same dataset as jsonl.zst" cmp $T/g_text_document.bin $T/z1_text_document.bin
check "stdin ('-')" bash -c "zstd -dc $ZST | $P --input - --output-prefix $T/s ${GPT2[*]} --append-eod"
check "stdin gives the same dataset" cmp $T/s_text_document.idx $T/z1_text_document.idx
check "txt files and a directory" bash -c "mkdir -p $T/dir/sub && cp $DATA/text/enwik8_first100.txt $T/dir/a.txt &&
    cp $DATA/text/enwik8_first100.txt $T/dir/sub/b.txt && $P --input $T/dir,$DATA/text/tinyshakespeare_input.txt \
    --output-prefix $T/t ${GPT2[*]} --num-docs 3"
check_output "info counts the three text documents" "documents: +3$" $P info $T/t_text_document
check_output "info on the dataset" "check: +ok" $P info $T/z1_text_document
check_output "info reads Megatron's own dataset" "tokens: +5000$" $P info $DATA/megatron/megatron_test_text_document

check "merge" $P merge --output-prefix $T/m $T/z1_text_document $T/g_text_document
check_output "merge keeps every document" "documents: +1340$" $P info $T/m
check_fails "merge refuses different dtypes" 2 "dtype" $P merge --output-prefix $T/m2 $T/z1_text_document \
    $DATA/megatron/megatron_test_text_document

check "index builds GPT-NeoX's caches" $P index --data-path $T/z1_text_document --seq-length 64 --train-iters 10 \
    --train-batch-size 4 --eval-interval 5 --eval-iters 1
check "cache names are GPT-NeoX's" test -f $T/z1_text_document_train_indexmap_40ns_64sl_1234s_packedpi_ac_shuffle_idx.npy
# index applies lib/data's rules for data settings, with neox-train's messages (the GPT-NeoX keys).
Z=$T/z1_text_document IDX=(--seq-length 64 --train-iters 10 --train-batch-size 4)
check_fails "index: a weight per data path, as the config rule says" 2 \
    "one weight per path in \*_data_paths \(train_data_weights has 1, train_data_paths 2\)" \
    $P index --train-data-paths $Z,$Z --valid-data-paths $Z --test-data-paths $Z --train-data-weights 1 "${IDX[@]}"
check_fails "index: reward datasets only unpacked, as neox-train says" 2 \
    "reward datasets are read with pack_impl: unpacked only .* not packed" \
    $P index --train-data-paths $Z --valid-data-paths $Z --test-data-paths $Z --train-reward-data-paths $Z "${IDX[@]}"
check_fails "index: rejected-side labels need pairwise data" 2 \
    "neg_train_label_data_paths: rejected data goes with dataset_impl pairwise" \
    $P index --train-data-paths $Z --valid-data-paths $Z --test-data-paths $Z --neg-train-label-data-paths $Z "${IDX[@]}"
check_fails "index: a rejected dataset per chosen one" 2 \
    "pos_valid_data_paths has 1 paths but neg_valid_data_paths has 0" \
    $P index --train-data-paths $Z --valid-data-paths $Z --test-data-paths $Z --neg-train-data-paths $Z "${IDX[@]}"

# Bad input
printf '{"text": "fine"}\n{"text": "broken\n{"other": 1}\n' >$T/bad.jsonl
check_fails "malformed JSON names file:line:column" 1 "bad.jsonl:2:[0-9]+: invalid JSON" \
    $P --input $T/bad.jsonl --output-prefix $T/b "${GPT2[@]}"
check "a failed run leaves no dataset" test ! -e $T/b_text_document.idx -a ! -e $T/b_text_document.bin
check_fails "--skip-invalid counts what it skipped" 0 "2 invalid records skipped" \
    $P --input $T/bad.jsonl --output-prefix $T/b "${GPT2[@]}" --skip-invalid
printf '{"text": "fine"}\n{"body": "no text"}\n' >$T/nokey.jsonl
check_fails "a missing key names file:line and the key" 1 "nokey.jsonl:2: no key 'text'" \
    $P --input $T/nokey.jsonl --output-prefix $T/k "${GPT2[@]}"
head -c 500000 $ZST >$T/cut.jsonl.zst
check_fails "a truncated .zst is an error naming it" 1 "cut.jsonl.zst: truncated zstd" \
    $P --input $T/cut.jsonl.zst --output-prefix $T/c "${GPT2[@]}"
head -c 500000 $GZ >$T/cut.jsonl.gz
check_fails "a truncated .gz is an error naming it" 1 "cut.jsonl.gz: truncated gzip" \
    $P --input $T/cut.jsonl.gz --output-prefix $T/c "${GPT2[@]}"
check_fails "a missing input names it" 1 "nothere.jsonl" $P --input $T/nothere.jsonl --output-prefix $T/c "${GPT2[@]}"
check_fails "an unwritable output names it" 1 "/proc/x_text_document" $P --input $T/bad.jsonl --output-prefix /proc/x "${GPT2[@]}"

# Interrupted runs: stdin stays open, so the run is still going when it is killed.
interrupted() {  # interrupted SIGNAL PREFIX
    (zstd -dc $ZST; sleep 5) | $P --input - --output-prefix $2 "${GPT2[@]}" --workers 2 2>/dev/null &
    local pid=$! status  # the last command of the pipeline: neox-preprocess itself
    sleep 1.5
    kill -$1 $pid
    wait $pid 2>/dev/null
    status=$?
    [ $status -gt 128 ] || { echo "exit status $status: the run was not interrupted"; return 1; }
    [ ! -e $2_text_document.bin ] && [ ! -e $2_text_document.idx ]
}
check "SIGTERM during a run leaves no dataset" interrupted TERM $T/i1
check "SIGTERM removes the temporaries" bash -c "! ls $T/i1_* 2>/dev/null | grep -q ."
check "kill -9 during a run leaves no dataset under the final names" interrupted KILL $T/i2
