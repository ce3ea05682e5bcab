#!/usr/bin/env bash
# bench/eval.sh: neox-eval's scoring and generation speed against transformers on the same model
# (trained for one step here and exported with `neox-convert to-hf`), the same requests and the same
# thread count, measured in one run: lambada_openai loglikelihood requests (the requests' input
# tokens per second; transformers runs them in padded batches of micro-batch rows, as the harness
# does) and greedy generation with a KV cache (generated tokens per second). Prints both rates and
# the neox.c/transformers ratios.
# Needs `make`, `make deps` (.venv with torch and transformers) and ../shared/data.
# Usage: bench/eval.sh [key=value...]  keys: threads layers hidden heads seq batch limit tokens
#        (defaults: threads=2 layers=6 hidden=512 heads=8 seq=512 batch=8 limit=200 tokens=128)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
DATA=../shared/data
[ -x .venv/bin/python ] || { echo "bench/eval.sh: .venv is missing (run 'make deps')" >&2; exit 1; }
[ -d $DATA/eval ] || { echo "bench/eval.sh: $DATA/eval is missing" >&2; exit 1; }
declare -A opt=([threads]=2 [layers]=6 [hidden]=512 [heads]=8 [seq]=512 [batch]=8 [limit]=200 [tokens]=128)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/eval.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
export OMP_NUM_THREADS=${opt[threads]} OPENBLAS_NUM_THREADS=${opt[threads]}
# Idle OpenMP threads sleep instead of spinning, for both sides (torch uses libgomp too): on a
# machine with other work, spinning workers take the cores the computing threads need.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-evalbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
BIN=build/cpu/bin
GPT2=$DATA/tokenizers/gpt2

# A model of the requested shape: one training step on Tiny Shakespeare, saved and exported.
python3 tests/tools/train_lib.py paragraphs $DATA/text/tinyshakespeare_input.txt "$work/text.jsonl"
$BIN/neox-preprocess --input "$work/text.jsonl" --output-prefix "$work/gpt2" --append-eod \
    --tokenizer-type GPT2BPETokenizer --vocab-file $GPT2/vocab.json --merge-file $GPT2/merges.txt >/dev/null 2>&1
cat >"$work/model.yml" <<EOF
{
  "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": ${opt[seq]}, "max_position_embeddings": ${opt[seq]}, "pos_emb": "rotary", "rotary_pct": 0.25,
  "gpt_j_residual": true, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "lr_decay_style": "constant",
  "train_micro_batch_size_per_gpu": ${opt[batch]}, "gradient_accumulation_steps": 1, "train_iters": 1,
  "eval_interval": 1000, "eval_iters": 1, "split": "90,5,5",
  "data_path": "$work/gpt2_text_document", "tokenizer_type": "GPT2BPETokenizer",
  "vocab_file": "$GPT2/vocab.json", "merge_file": "$GPT2/merges.txt",
  "save": "$work/ckpt", "load": "$work/ckpt", "checkpoint_factor": 1
}
EOF
$BIN/neox-train -q "$work/model.yml"
$BIN/neox-convert to-hf --input "$work/ckpt" --output "$work/hf" >/dev/null 2>&1
printf 'ROMEO:\nFirst Citizen:\nThe king is\nO, what a\n' >"$work/prompts.txt"

rate() { sed -n "s/.*: \([0-9.]*\) tokens\/s.*/\1/p" "$1" | tail -1; }
$BIN/neox-eval "$work/model.yml" --tasks lambada_openai --data-dir $DATA/eval --limit ${opt[limit]} \
    --results-prefix - >/dev/null 2>"$work/eval.log"
$BIN/neox-eval generate "$work/model.yml" --text-gen-type input-file --sample-input-file "$work/prompts.txt" \
    --sample-output-file "$work/out.jsonl" --maximum-tokens ${opt[tokens]} 2>"$work/gen.log" || { cat "$work/gen.log"; exit 1; }
neox_eval=$(rate "$work/eval.log") neox_gen=$(rate "$work/gen.log")
.venv/bin/python bench/eval_transformers.py "$work/hf" $DATA/eval/lambada_test.jsonl ${opt[limit]} ${opt[batch]} \
    ${opt[seq]} "$work/prompts.txt" ${opt[tokens]} ${opt[threads]} >"$work/hf.out"
hf_eval=$(sed -n 's/^eval_tokens_per_s //p' "$work/hf.out") hf_gen=$(sed -n 's/^gen_tokens_per_s //p' "$work/hf.out")
echo "model: layers=${opt[layers]} hidden=${opt[hidden]} seq=${opt[seq]} batch=${opt[batch]} threads=${opt[threads]} OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
printf "%-34s %12s %14s %8s\n" "" "neox.c" "transformers" "ratio"
printf "%-34s %12.1f %14.1f %7.2fx\n" "eval (lambada, input tokens/s)" "$neox_eval" "$hf_eval" \
    "$(python3 -c "print($neox_eval / $hf_eval)")"
printf "%-34s %12.1f %14.1f %7.2fx\n" "greedy generation (tokens/s)" "$neox_gen" "$hf_gen" \
    "$(python3 -c "print($neox_gen / $hf_gen)")"
