#!/usr/bin/env bash
# bench/profile.sh: what `profile` costs a training run on this CPU (docs/metrics.md, "Profiling a
# run"). One small model trains the same steps with four builds/configs, run in turns `reps` times
# so the machine's load falls on each alike:
#   ref   the tools built before the range API existed (OLD, default /work/ref-bin), no profile keys
#   off   this build, no profile keys (each range is one untaken branch)
#   on    this build, profile with the window over every step (every range and collective recorded)
#   mem   as on, plus memory_profiling (a snapshot file after every step)
# Each run's time per iteration is the median of metrics.jsonl's runtime/iteration_time after the
# warm-up; the table prints each variant's median over the turns and its ratio to `off`. The trace
# is written after the last step (outside the timed iterations); its size is printed.
# Needs `make`. Usage: bench/profile.sh [key=value...]  keys (defaults):
#   layers=4 hidden=128 heads=4 seq=128 micro=4 accum=2 iters=14 warmup=4 reps=3 ranks=1 old=/work/ref-bin
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x build/cpu/bin/neox-train ] || { echo "bench/profile.sh: build/cpu/bin/neox-train is missing (run 'make')" >&2; exit 1; }
declare -A opt=([layers]=4 [hidden]=128 [heads]=4 [seq]=128 [micro]=4 [accum]=2 [iters]=14 [warmup]=4 [reps]=3
                [ranks]=1 [old]=/work/ref-bin)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/profile.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
OLD=${opt[old]}
[ -x "$OLD/neox-train" ] || { echo "bench/profile.sh: no $OLD/neox-train (old=DIR: tools built without the range API)" >&2; exit 1; }
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-profbench.XXXXXX")
trap 'rm -rf "$work"' EXIT

python3 tests/mpi/words_corpus.py "$work/docs.jsonl" 400 7
build/cpu/bin/neox-preprocess --input "$work/docs.jsonl" --output-prefix "$work/docs" --tokenizer-type CharLevelTokenizer \
    --append-eod >/dev/null
cat >"$work/model.yml" <<YML
{ "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": ${opt[seq]}, "max_position_embeddings": ${opt[seq]},
  "train_micro_batch_size_per_gpu": ${opt[micro]}, "gradient_accumulation_steps": ${opt[accum]},
  "train_iters": ${opt[iters]}, "log_interval": 1, "do_valid": false, "do_test": false, "split": "100,0,0",
  "optimizer": {"type": "Adam", "params": {"lr": 0.0006}},
  "data_path": "$work/docs_text_document", "tokenizer_type": "CharLevelTokenizer" }
YML
WINDOW="\"profile_step_start\": 0, \"profile_step_stop\": ${opt[iters]}"

# run VARIANT TURN: one training run; its log_dir is $work/VARIANT-TURN.
run() {
    local dir="$work/$1-$2" bin=build/cpu/bin extra=""
    case $1 in
        ref) bin=$OLD ;;
        on) extra=", \"profile\": true, $WINDOW" ;;
        mem) extra=", \"profile\": true, \"memory_profiling\": true, \"memory_profiling_path\": \"$dir/mem\", $WINDOW" ;;
    esac
    echo "{\"log_dir\": \"$dir\" $extra}" >"$work/$1-$2.yml"
    local launch=()
    [ "${opt[ranks]}" -gt 1 ] && launch=("$MPIEXEC" -n "${opt[ranks]}")
    "${launch[@]}" "$bin/neox-train" -q "$work/model.yml" "$work/$1-$2.yml" >"$dir.out" 2>&1 ||
        { echo "bench/profile.sh: the $1 run failed:" >&2; tail -5 "$dir.out" >&2; exit 1; }
}

VARIANTS="ref off on mem"
for turn in $(seq 1 "${opt[reps]}"); do
    for v in $VARIANTS; do run "$v" "$turn"; done
done

echo "# ${opt[layers]} layers, hidden ${opt[hidden]}, seq ${opt[seq]}, micro-batch ${opt[micro]} x ${opt[accum]}," \
     "${opt[ranks]} rank(s); ${opt[iters]} iterations, the first ${opt[warmup]} not timed; ${opt[reps]} turns"
python3 - "$work" "${opt[reps]}" "${opt[warmup]}" $VARIANTS <<'PY'
import json, os, statistics, sys
work, reps, warmup, variants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def per_iteration(path):
    times = [json.loads(l).get("runtime/iteration_time") for l in open(path)]
    return statistics.median([t for t in times[warmup:] if t is not None])
medians = {v: statistics.median(per_iteration(f"{work}/{v}-{t}/metrics.jsonl") for t in range(1, reps + 1)) for v in variants}
print(f"{'variant':8} {'ms/iteration':>13} {'vs off':>8}")
for v in variants:
    print(f"{v:8} {1e3 * medians[v]:13.2f} {medians[v] / medians['off']:8.3f}")
trace = f"{work}/on-1/trace_rank0.json"
events = len(json.load(open(trace))["traceEvents"])
print(f"trace of one run: {os.path.getsize(trace) / 1e3:.0f} kB, {events} events")
PY
