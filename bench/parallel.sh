#!/usr/bin/env bash
# bench/parallel.sh: neox-train's parallel layouts on CPU ranks, measured in one run with the same
# total threads: one rank with T threads, then dp2, tp2 and pp2 (two ranks, T/2 threads each), all
# on the same model, data and global batch. Prints the median iteration time of each layout after
# warm-up and its throughput relative to one rank, and, at dp2, the fraction of gradient-reduction
# time hidden behind backward: 1 - (time blocked in the data group's reductions with overlap_comm)
# / (the same without overlap, where every bucket is reduced after backward), both from
# log_dir/comm_stats.json's gradient_reduction.exposed_seconds: per reduction, the time the last
# rank to finish backward spends blocked in it (an earlier rank also waits for that rank's backward,
# which is load imbalance, not communication). It also prints the share hidden when the calls made
# during backward to start and progress the reductions count as not hidden, and rank 0's raw blocked
# time, waiting for the other rank included.
# Needs `make`. Usage: bench/parallel.sh [key=value...]  keys: threads iters layers hidden heads seq
#        micro accum bucket layouts  (defaults: threads=2 iters=30 layers=4 hidden=256 heads=8 seq=256
#        micro=4 accum=2 bucket=200000 layouts=dp2,tp2,pp2; e.g. layouts=dp2 to repeat only the dp2 pair)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x build/cpu/bin/neox-train ] || { echo "bench/parallel.sh: build/cpu/bin/neox-train is missing (run 'make')" >&2; exit 1; }
declare -A opt=([threads]=2 [iters]=30 [layers]=4 [hidden]=256 [heads]=8 [seq]=256 [micro]=4 [accum]=2 [bucket]=200000 [layouts]=dp2,tp2,pp2)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/parallel.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
BIN=build/cpu/bin
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-parbench.XXXXXX")
trap 'rm -rf "$work"' EXIT

python3 - "$work/docs.jsonl" <<'EOF'
import json, random, sys
random.seed(3)
words = "the king queen sword crown night day love war speak thou art doth hath shall".split()
with open(sys.argv[1], "w") as f:
    for _ in range(3000):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(50, 400)))}) + "\n")
EOF
"$BIN/neox-preprocess" --input "$work/docs.jsonl" --output-prefix "$work/docs" --tokenizer-type CharLevelTokenizer \
    --append-eod >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }

# config NAME MICRO ACCUM EXTRA
config() {
    cat >"$work/$1.yml" <<EOF
{
  "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": ${opt[seq]}, "max_position_embeddings": ${opt[seq]}, "pos_emb": "rotary",
  "make_vocab_size_divisible_by": 64, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
  "lr_decay_style": "constant", "train_micro_batch_size_per_gpu": $2, "gradient_accumulation_steps": $3,
  "train_iters": ${opt[iters]}, "eval_interval": 1000000, "do_valid": false, "do_test": false, "log_interval": 1,
  "data_path": "$work/docs_text_document", "tokenizer_type": "CharLevelTokenizer", "log_dir": "$work/$1" $4
}
EOF
}
m=${opt[micro]} a=${opt[accum]} half=$(( opt[threads] / 2 > 0 ? opt[threads] / 2 : 1 ))
Z="\"zero_optimization\": {\"stage\": 0, \"reduce_bucket_size\": ${opt[bucket]}"
config one "$m" $((2 * a)) ""
config dp2 "$m" "$a" ", $Z, \"overlap_comm\": true}"
config dp2-serial "$m" "$a" ", $Z, \"overlap_comm\": false}"
config tp2 "$m" $((2 * a)) ', "model_parallel_size": 2'
config pp2 "$m" $((2 * a)) ', "pipe_parallel_size": 2'

OMP_NUM_THREADS=${opt[threads]} "$BIN/neox-train" -q "$work/one.yml" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
runs=()
for layout in ${opt[layouts]//,/ }; do
    case $layout in
    dp2) runs+=(dp2 dp2-serial) ;;
    tp2 | pp2) runs+=("$layout") ;;
    *) echo "bench/parallel.sh: unknown layout '$layout' in layouts=" >&2; exit 2 ;;
    esac
done
for name in "${runs[@]}"; do
    OMP_NUM_THREADS=$half "$MPIEXEC" -n 2 "$BIN/neox-train" -q "$work/$name.yml" >"$work/log" 2>&1 ||
        { cat "$work/log" >&2; exit 1; }
done

python3 - "$work" "${opt[threads]}" "$half" "${runs[@]}" <<'EOF'
import json, statistics, sys
work, threads, half, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def iter_time(name):
    times = [r["runtime/iteration_time"] for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl"))
             if "runtime/iteration_time" in r]
    return statistics.median(times[3:])  # after warm-up
def reduction(name):  # rank 0's gradient_reduction record (exposed_* are the data group's)
    return json.load(open(f"{work}/{name}/comm_stats.json"))["ranks"][0]["gradient_reduction"]
def pct(part, whole):
    return f"{100 * (1 - part / whole) if whole > 0 else 0:.0f}%"
one = iter_time("one")
print(f"one rank, {threads} threads: {one * 1e3:.1f} ms per iteration")
for name in runs:
    t = iter_time(name)
    print(f"{name} (2 ranks x {half} threads): {t * 1e3:.1f} ms per iteration, throughput {one / t:.2f}x one rank")
if "dp2" not in runs:
    sys.exit(0)
ovl, ser = reduction("dp2"), reduction("dp2-serial")
n = ser["reductions"]
print(f"dp2 gradient reduction, per iteration: {ser['exposed_seconds'] / n * 1e3:.2f} ms blocked without overlap, "
      f"{ovl['exposed_seconds'] / n * 1e3:.2f} ms with overlap_comm: {pct(ovl['exposed_seconds'], ser['exposed_seconds'])} "
      f"hidden behind backward")
print(f"  counting the {ovl['progress_seconds'] / n * 1e3:.2f} ms per iteration backward spends starting and progressing "
      f"reductions as not hidden: {pct(ovl['exposed_with_progress_seconds'], ser['exposed_seconds'])} hidden")
print(f"  rank 0 blocked, waiting for the other rank's backward included: {ser['finish_seconds'] / n * 1e3:.2f} ms without, "
      f"{ovl['finish_seconds'] / n * 1e3:.2f} ms with overlap ({pct(ovl['finish_seconds'], ser['finish_seconds'])})")
EOF
