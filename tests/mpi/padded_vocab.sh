# tests/mpi/padded_vocab.sh: the padded vocabulary under tensor parallelism. With GPT-2's vocabulary
# (50257 tokens) and make_vocab_size_divisible_by 128, GPT-NeoX's rule pads to 50304 rows on one rank
# and to 50432 at model_parallel_size 2, which changes the trajectory and says so at start-up.
# pinned_padded_vocab_size: 50304 makes tp2 train the one-rank model (losses and evaluations within
# 1e-5 over 20 steps), a pinned run stopped at tp2 resumes on one rank on the straight run's
# trajectory, and values that cannot hold the vocabulary, do not divide among the tensor-parallel
# ranks or disagree with the checkpoint loaded are refused naming the key.
source tests/lib.sh

GPT2=$DATA/tokenizers/gpt2
need_mpi "pinned padded vocabulary" || exit 0
[ -f "$GPT2/vocab.json" ] || { skip "pinned padded vocabulary" "no GPT-2 tokenizer in $GPT2"; exit 0; }

python3 tests/mpi/words_corpus.py "$T/docs.jsonl" 500 7
check "preprocess (GPT-2)" "$NEOX_BIN/neox-preprocess" --input "$T/docs.jsonl" --output-prefix "$T/gpt2" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2/vocab.json" --merge-file "$GPT2/merges.txt" --append-eod

source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA
VOCAB_DIVISOR=128
DATA_KEYS='"data_path": "'$T/gpt2_text_document'", "tokenizer_type": "GPT2BPETokenizer",
  "vocab_file": "'$GPT2/vocab.json'", "merge_file": "'$GPT2/merges.txt'"'
TP=', "model_parallel_size": 2' PIN=', "pinned_padded_vocab_size": 50304'

config one neox 2 4 20 ""
check "one: train on 1 rank" "$TRAIN" -q "$T/one.yml"
config tp2 neox 2 4 20 "$TP"
check_output "tp2 without the pin: a notice says the padding differs from one rank's" \
    "model_parallel_size 2 pads the vocabulary to 50432 rows where model_parallel_size 1 pads it to 50304.*pinned_padded_vocab_size \(e\.g\. 50304\)" \
    bash -c "'$MPIEXEC' -n 2 '$TRAIN' '$T/tp2.yml' 2>&1"
check "tp2 without the pin leaves the single-rank trajectory" \
    bash -c "! $PY tests/mpi/layouts_check.py same_losses '$T/one' '$T/tp2' >/dev/null"
config tp2pin neox 2 4 20 "$TP$PIN"
check "tp2pin: train on 2 ranks" bash -c "'$MPIEXEC' -n 2 '$TRAIN' '$T/tp2pin.yml' >'$T/tp2pin.out' 2>&1"
check "tp2pin prints no padding notice" bash -c "grep -q 'iteration *20/' '$T/tp2pin.out' && ! grep -q 'pads the vocabulary' '$T/tp2pin.out'"
check_output "tp2pin's checkpoint holds 50304 vocabulary rows" "embed_in\.weight.*50304" \
    "$NEOX_BIN/neox-convert" inspect "$T/tp2pin/ckpt"
check "tp2 with pinned_padded_vocab_size 50304 follows the single-rank run (losses, evaluations within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py same_losses "$T/one" "$T/tp2pin"

# 10 steps pinned at tp2, 10 more pinned on one rank, against the straight one-rank run.
config pin-a neox 2 4 20 "$TP$PIN, \"exit_interval\": 10"
config pin-b neox 2 4 20 "$PIN, \"load\": \"$T/pin-a/ckpt\""
check "pinned tp2: first 10 steps" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/pin-a.yml"
check "pinned: resume on one rank for 10 more" "$TRAIN" -q "$T/pin-b.yml"
check "pinned tp2 -> one rank: the resumed run continues the straight run (within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py resumed "$T/one" "$T/pin-a" "$T/pin-b"

config small neox 2 4 20 ', "pinned_padded_vocab_size": 50000'
check_fails "a pin smaller than the vocabulary is refused naming the key" 2 \
    "key 'pinned_padded_vocab_size': 50000 rows cannot hold the tokenizer's vocabulary of 50257" "$TRAIN" -q "$T/small.yml"
config odd neox 2 4 20 "$TP"', "pinned_padded_vocab_size": 50305'
check_fails "a pin that model_parallel_size does not divide is refused naming the key" 2 \
    "key 'pinned_padded_vocab_size': 50305 is not divisible by model_parallel_size 2" \
    "$MPIEXEC" -n 2 "$TRAIN" -q "$T/odd.yml"
config other neox 2 4 20 "$PIN, \"load\": \"$T/tp2/ckpt\""
check_fails "a pin that differs from the loaded checkpoint's rows is refused naming the key" 2 \
    "key 'pinned_padded_vocab_size': 50304 does not match the 50432 vocabulary rows of the checkpoint" \
    "$TRAIN" -q "$T/other.yml"
