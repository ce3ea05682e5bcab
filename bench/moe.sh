#!/usr/bin/env bash
# bench/moe.sh: Mixture-of-Experts training step time on CPU ranks, in one run on the same data and
# global batch: a MoE model (E experts of width F, top_k k, every layer) against the dense model of
# the same active parameters (MLP width k x F, no experts), on one rank; then the MoE model at dp2
# with every expert on both ranks (replicated) and at dp2 with the experts shared out
# (moe_expert_parallel_size 2: E/2 each, tokens exchanged by all-to-all). Prints each run's median
# iteration time after warm-up, the MoE/dense ratio at one rank and EP2/replicated at dp2, and the
# parameters each rank holds. Same total threads in every run (one rank T threads, two ranks T/2).
# Needs `make`. Usage: bench/moe.sh [key=value...]  keys: threads iters layers hidden heads seq micro
#        accum experts width topk  (defaults: threads=2 iters=20 layers=2 hidden=128 heads=4 seq=64
#        micro=4 accum=2 experts=8 width=256 topk=2)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x build/cpu/bin/neox-train ] || { echo "bench/moe.sh: build/cpu/bin/neox-train is missing (run 'make')" >&2; exit 1; }
declare -A opt=([threads]=2 [iters]=20 [layers]=2 [hidden]=128 [heads]=4 [seq]=64 [micro]=4 [accum]=2
                [experts]=8 [width]=256 [topk]=2)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/moe.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
BIN=build/cpu/bin
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-moebench.XXXXXX")
trap 'rm -rf "$work"' EXIT

python3 tests/mpi/words_corpus.py "$work/docs.jsonl" 3000 7
"$BIN/neox-preprocess" --input "$work/docs.jsonl" --output-prefix "$work/docs" --tokenizer-type CharLevelTokenizer \
    --append-eod >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }

# config NAME ACCUM MLP_JSON
config() {
    cat >"$work/$1.yml" <<EOF
{
  "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": ${opt[seq]}, "max_position_embeddings": ${opt[seq]}, "pos_emb": "rotary", "no_weight_tying": true,
  "make_vocab_size_divisible_by": 64, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
  "lr_decay_style": "constant", "train_micro_batch_size_per_gpu": ${opt[micro]}, "gradient_accumulation_steps": $2,
  "train_iters": ${opt[iters]}, "eval_interval": 1000000, "do_valid": false, "do_test": false, "log_interval": 1,
  "data_path": "$work/docs_text_document", "tokenizer_type": "CharLevelTokenizer", "log_dir": "$work/$1", $3
}
EOF
}
a=${opt[accum]} half=$(( opt[threads] / 2 > 0 ? opt[threads] / 2 : 1 ))
MOE="\"intermediate_size\": ${opt[width]}, \"moe_num_experts\": ${opt[experts]}, \"moe_top_k\": ${opt[topk]}"
config dense $((2 * a)) "\"intermediate_size\": $(( opt[topk] * opt[width] ))"
config moe $((2 * a)) "$MOE"
config moe-dp2 "$a" "$MOE"
config moe-dp2-ep2 "$a" "$MOE, \"moe_expert_parallel_size\": 2"

run() {  # run NAME RANKS THREADS
    local launch=()
    [ "$2" -gt 1 ] && launch=("$MPIEXEC" -n "$2")
    OMP_NUM_THREADS=$3 "${launch[@]}" "$BIN/neox-train" "$work/$1.yml" >"$work/$1.out" 2>&1 ||
        { cat "$work/$1.out" >&2; exit 1; }
}
run dense 1 "${opt[threads]}"
run moe 1 "${opt[threads]}"
run moe-dp2 2 "$half"
run moe-dp2-ep2 2 "$half"

python3 - "$work" <<'EOF'
import json, re, statistics, sys
work = sys.argv[1]
def iter_time(name):
    times = [r["runtime/iteration_time"] for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl"))
             if "runtime/iteration_time" in r]
    return statistics.median(times[3:])  # after warm-up
def held(name):  # rank 0's parameters, from its memory line (4 bytes each)
    line = next(l for l in open(f"{work}/{name}.out") if "memory of rank 0" in l)
    return re.search(r"parameters (\S+)", line).group(1)
t = {n: iter_time(n) for n in ("dense", "moe", "moe-dp2", "moe-dp2-ep2")}
for n, v in t.items():
    print(f"{n:12s} {v * 1e3:8.1f} ms per iteration   rank 0 holds {held(n)} of parameters")
print(f"one rank: MoE / dense of the same active parameters = {t['moe'] / t['dense']:.2f}x step time")
print(f"dp2: experts shared out (EP2) / replicated = {t['moe-dp2-ep2'] / t['moe-dp2']:.2f}x step time")
EOF
