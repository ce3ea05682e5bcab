#!/usr/bin/env bash
# bench/long_context.sh: how long a sequence a fixed per-rank memory budget trains, one rank against
# tensor parallelism with and without sequence_parallel and context parallelism, on CPU ranks.
#   (a) for each layout (one rank; tp2; tp2 + sequence_parallel; tp4; tp4 + sequence_parallel; cp2;
#       cp4; cp2 and cp4 with gradient buckets of 500,000 elements, +b; cp4 with ZeRO-1 over its 4
#       ranks and those buckets, +z1), the
#       longest seq_length (a multiple of `step`) whose start-up plan (every rank's planned total, the
#       "memory of rank N" lines; train_iters 0) fits `budget` per rank, found by doubling then
#       bisection; with the plan's activations per layer (memory_plan.json) at the one-rank length;
#   (b) each layout then trains at one common seq_length (the one-rank longest, so every layout
#       trains the same tokens), with every rank's measured peak resident set and the CPU seconds of
#       the training steps per token, as a ratio to one rank's. CPU seconds are user + system of all
#       the job's processes (the ranks share this machine's cores, so wall time would measure the
#       sharing, not the work), and only the steps': a run of 1 + `steps` steps less a run of 1 step
#       at the same layout, which takes out the start-up (MPI's, the data index, the weights'
#       initialisation: once per rank, so 4 times under 4 ranks) and the first step's one-time costs
#       (first touches of the planned memory, MPI's connections). Waiting is not work: on a cluster
#       each rank has its cores and a rank that waits for its peers spins on its own, but here 4
#       ranks share 2 cores and the spinning is CPU time taken from the peer being waited for. So
#       every row runs with NEOX_SHARED_CORES=1 (a wait polls for 50 us, then sleeps 20 us between
#       polls: lib/parallel/comm_timeout.c; every MPI wait of a training step polls there while
#       comm_timeout_seconds > 0, its default, so MPICH's own MPIR_CVAR_POLLS_BEFORE_YIELD does not
#       apply) and OMP_WAIT_POLICY=passive (an OpenMP thread at a barrier sleeps rather than
#       spins: one rank runs 2 threads), alike for every row.
# Needs `make`. Usage: bench/long_context.sh [key=value...]  keys (defaults):
#   budget=128M (per rank)   layers=4 hidden=256 heads=8   micro=1   step=256 (seq_length granularity)
#   steps=2 (measured per layout in (b), after 1)   ckpt=false (checkpoint_activations)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x build/cpu/bin/neox-train ] || { echo "bench/long_context.sh: build/cpu/bin/neox-train is missing (run 'make')" >&2; exit 1; }
declare -A opt=([budget]=128M [layers]=4 [hidden]=256 [heads]=8 [micro]=1 [step]=256 [steps]=2 [ckpt]=false)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/long_context.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
export NEOX_SHARED_CORES=1 OMP_WAIT_POLICY=passive  # waits sleep rather than spin, every row alike (above)
TRAIN=build/cpu/bin/neox-train
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-longctx.XXXXXX")
trap 'rm -rf "$work"' EXIT
budget=$(python3 bench/memory_report.py bytes "${opt[budget]}")
echo "# budget $(python3 bench/memory_report.py human "$budget") per rank; ${opt[layers]} layers, hidden ${opt[hidden]}," \
     "${opt[heads]} heads, rotary, micro-batch ${opt[micro]}, checkpoint_activations ${opt[ckpt]}, fp32"

python3 tests/mpi/words_corpus.py "$work/docs.jsonl" 400 7
build/cpu/bin/neox-preprocess --input "$work/docs.jsonl" --output-prefix "$work/docs" --tokenizer-type CharLevelTokenizer \
    --append-eod >/dev/null 2>&1

# config NAME SEQ ITERS EXTRA: the bench model at SEQ on its layout.
config() {
    cat >"$work/$1.yml" <<EOF
{ "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": $2, "max_position_embeddings": $2, "pos_emb": "rotary", "train_micro_batch_size_per_gpu": ${opt[micro]},
  "checkpoint_activations": ${opt[ckpt]}, "train_iters": $3, "do_valid": false, "do_test": false, "log_interval": 1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "log_dir": "$work/$1/log",
  "data_path": "$work/docs_text_document", "tokenizer_type": "CharLevelTokenizer" $4 }
EOF
}

# launch RANKS ARGS...: neox-train on RANKS ranks.
launch() {
    local n=$1; shift
    if [ "$n" -gt 1 ]; then "$MPIEXEC" -n "$n" "$TRAIN" "$@"; else "$TRAIN" "$@"; fi
}

# fits RANKS EXTRA SEQ: whether every rank's planned total fits the budget at SEQ.
fits() {
    config plan "$3" 0 "$2"
    launch "$1" "$work/plan.yml" >"$work/plan.out" 2>&1 || return 1
    python3 - "$work/plan/log/memory_plan.json" "$budget" <<'PY'
import json, sys
ranks = json.load(open(sys.argv[1]))["ranks"]
sys.exit(0 if max(sum(r.values()) for r in ranks) <= float(sys.argv[2]) else 1)
PY
}

# longest RANKS EXTRA: the longest multiple of step that fits.
longest() {
    local lo=0 hi=${opt[step]} step=${opt[step]}
    while fits "$1" "$2" "$hi"; do lo=$hi; hi=$((hi * 2)); done
    while [ $((hi - lo)) -gt "$step" ]; do
        local mid=$(( (lo + hi) / 2 / step * step ))
        if fits "$1" "$2" "$mid"; then lo=$mid; else hi=$mid; fi
    done
    echo "$lo"
}

SP=', "sequence_parallel": true'
# Context-parallel ranks reduce gradients as data-parallel ranks do, and MPI's temporaries for a
# reduction are two of the largest bucket (the whole model under the default reduce_bucket_size):
# the +b rows cut the buckets to 500,000 elements, as long-context runs would.
BUCKETS=', "zero_optimization": {"stage": 0, "reduce_bucket_size": 500000}'
# The data group ZeRO partitions over spans the context ranks too (docs/parallel.md, "Context
# parallel"), as Megatron's distributed optimizer spans dp x cp: +z1 keeps a quarter of Adam's moments.
ZERO1=', "zero_optimization": {"stage": 1, "reduce_bucket_size": 500000}'
layouts=("1|1|" "tp2|2|, \"model_parallel_size\": 2" "tp2+SP|2|, \"model_parallel_size\": 2$SP"
         "tp4|4|, \"model_parallel_size\": 4" "tp4+SP|4|, \"model_parallel_size\": 4$SP"
         "cp2|2|, \"context_parallel_size\": 2" "cp4|4|, \"context_parallel_size\": 4"
         "cp2+b|2|, \"context_parallel_size\": 2$BUCKETS" "cp4+b|4|, \"context_parallel_size\": 4$BUCKETS"
         "cp4+z1|4|, \"context_parallel_size\": 4$ZERO1")
declare -A seq
echo
echo "## (a) the longest seq_length within the budget per rank"
echo
echo "| layout | ranks | longest seq_length | x one rank |"
echo "|---|---|---|---|"
for l in "${layouts[@]}"; do
    IFS='|' read -r name ranks extra <<<"$l"
    seq[$name]=$(longest "$ranks" "$extra")
    echo "| $name | $ranks | ${seq[$name]} | $(python3 -c "print(f'{${seq[$name]} / max(${seq[1]}, 1):.2f}')") |"
done

T=${seq[1]}
[ "$T" -gt 0 ] || { echo "bench/long_context.sh: one rank fits no seq_length of ${opt[step]} in the budget" >&2; exit 1; }
echo
echo "## (b) ${opt[steps]} steps at seq_length $T: activations, measured peak, the steps' CPU seconds per token"
echo
echo "| layout | activations per layer (rank 0) | all activations (rank 0) | SP saves | largest peak RSS | CPU s per token | x one rank |"
echo "|---|---|---|---|---|---|---|"
declare -A cpu act
for l in "${layouts[@]}"; do
    IFS='|' read -r name ranks extra <<<"$l"
    run=${name//+/}
    # The CPU time of every process a job ran (the ranks are the launcher's waited-for descendants),
    # for 1 step (run-1) and for 1 + steps (run); the second's peak resident sets are reported.
    config "$run-1" "$T" 1 "$extra"
    config "$run" "$T" "$((1 + ${opt[steps]}))" "$extra"
    for job in "$run-1" "$run"; do
        python3 - "$work/$job.cpu" "$ranks" "$MPIEXEC" "$TRAIN" "$work/$job.yml" "$work/$job.rss" <<'PY'
import resource, subprocess, sys
out, ranks, mpiexec, train, yml, rss = sys.argv[1:]
wrap = ["python3", "tests/mpi/peak_rss.py", rss, train, "-q", yml]
cmd = [mpiexec, "-n", ranks] + wrap if int(ranks) > 1 else wrap
subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
open(out, "w").write(f"{u.ru_utime + u.ru_stime}\n")
PY
    done
    read -r per all < <(python3 -c "
import json; d = json.load(open('$work/$run/log/memory_plan.json'))
print(d['activation_layers'][0]['per_layer'], d['ranks'][0]['activations'])")
    act[$name]=$per
    peak=$(cat "$work/$run.rss".* | sort -n | tail -1)
    cpu[$name]=$(python3 -c "print(($(cat "$work/$run.cpu") - $(cat "$work/$run-1.cpu")) / (${opt[steps]} * ${opt[micro]} * $T))")
    saves=""
    case $name in *+SP) saves=$(python3 -c "print(f'{100 * (1 - $per / ${act[${name%+SP}]}):.1f}% per layer')");; esac
    echo "| $name | $(python3 bench/memory_report.py human "$per") | $(python3 bench/memory_report.py human "$all") | $saves |" \
         "$(python3 bench/memory_report.py human "$peak") | $(python3 -c "print(f'{${cpu[$name]}:.3g}')") |" \
         "$(python3 -c "print(f'{${cpu[$name]} / ${cpu[1]}:.2f}')") |"
done
