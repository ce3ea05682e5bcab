#!/usr/bin/env bash
# bench/memory.sh: what ZeRO saves per data-parallel rank, planned and measured, on CPU ranks.
#   (a) one GPT-NeoX-shaped model trains 2 steps at dp4 under ZeRO stages 0-3: each rank's planned
#       memory (the start-up "memory of rank N" lines) and measured peak resident set (tests/mpi/peak_rss.py
#       around every rank; rank 0's metrics.jsonl memory/peak_rss_bytes beside it), printed beside the
#       ZeRO paper's per-stage formulas and neox.c's closed forms, with ratios to stage 0;
#   (b) the largest model of GPT-NeoX's size ladder (its configs' layers and hidden sizes, with
#       intermediate widths between them) whose start-up plan fits a memory budget at dp4 under
#       stage 0 and under stage 3, each then trained 2 steps with every rank's peak resident set;
#   (c) the step time of stage 3 against stage 1 at dp4 on one model, with the stage-3 prefetch at
#       its default and off (stage3_prefetch_bucket_size 0), as ratios.
# The machine is shared: (b) probes sizes upward and never starts one whose plan, extrapolated from
# the last one probed, would pass the budget; (a) and (c) refuse to start when their plan does.
# Needs `make`. Usage: bench/memory.sh [key=value...]  keys (defaults):
#   parts=a,b,c   ranks=4   budget=MemAvailable (bytes, or with a k/M/G suffix)   precision=fp32
#   layers=6 hidden=256 heads=4 (the model of (a) and (c): Pythia-31M's shape)   vocab=50304 (GPT-NeoX's
#   padded GPT-2 vocabulary, pinned)   seq=128   micro=1   bucket=2000000 (reduce_bucket_size)
#   steps=2 (trained per run of (a) and (b))   iters=12 (timed iterations of (c), the first 3 warm-up)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
[ -x build/cpu/bin/neox-train ] || { echo "bench/memory.sh: build/cpu/bin/neox-train is missing (run 'make')" >&2; exit 1; }
declare -A opt=([parts]=a,b,c [ranks]=4 [budget]=MemAvailable [precision]=fp32 [layers]=6 [hidden]=256 [heads]=4
                [vocab]=50304 [seq]=128 [micro]=1 [bucket]=2000000 [steps]=2 [iters]=12)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/memory.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
BIN=build/cpu/bin
REPORT="python3 bench/memory_report.py"
R=${opt[ranks]}
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-membench.XXXXXX")
trap 'rm -rf "$work"' EXIT
budget=$($REPORT bytes "${opt[budget]}")
echo "# memory budget: $($REPORT human "$budget") (budget=${opt[budget]}); $R data-parallel ranks; precision ${opt[precision]};" \
     "seq ${opt[seq]}, micro-batch ${opt[micro]}, vocabulary ${opt[vocab]}, reduce_bucket_size ${opt[bucket]}"

python3 tests/mpi/words_corpus.py "$work/docs.jsonl" 400 7
"$BIN/neox-preprocess" --input "$work/docs.jsonl" --output-prefix "$work/docs" --tokenizer-type CharLevelTokenizer \
    --append-eod >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }

case ${opt[precision]} in
fp32) PRECISION="" ;;
bf16 | bfloat16) PRECISION=', "precision": "bfloat16"' ;;
fp16) PRECISION=', "fp16": {"enabled": true}' ;;
*) echo "bench/memory.sh: precision must be fp32, bf16 or fp16" >&2; exit 2 ;;
esac

# zero STAGE LAYER_ELEMENTS [MORE]: the zero_optimization dict. Stage 3 saves memory as a DeepSpeed
# user sets it up for that: nothing kept whole between a unit's uses (stage3_max_reuse_distance 0)
# and one layer gathered ahead; tensors of at most 1e5 elements stay persistent (the default).
zero() {
    local s3=""
    [ "$1" = 3 ] && s3=", \"stage3_max_reuse_distance\": 0, \"stage3_prefetch_bucket_size\": $2"
    echo "\"zero_optimization\": {\"stage\": $1, \"reduce_bucket_size\": ${opt[bucket]}$s3${3:+, $3}}"
}
# config NAME LAYERS HIDDEN HEADS ITERS ZERO (VOCAB: the pinned vocabulary, default vocab=)
config() {
    cat >"$work/$1.yml" <<EOF
{
  "num_layers": $2, "hidden_size": $3, "num_attention_heads": $4, "seq_length": ${opt[seq]},
  "max_position_embeddings": ${opt[seq]}, "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true,
  "no_weight_tying": true, "pinned_padded_vocab_size": ${VOCAB:-${opt[vocab]}}, "checkpoint_activations": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.0006}}, "lr_decay_style": "constant",
  "train_micro_batch_size_per_gpu": ${opt[micro]}, "gradient_accumulation_steps": 1, "train_iters": $5,
  "log_interval": 1, "do_valid": false, "do_test": false, "eval_interval": 1000000,
  "data_path": "$work/docs_text_document", "tokenizer_type": "CharLevelTokenizer", "log_dir": "$work/$1",
  $6 $PRECISION
}
EOF
}
# launch NAME: runs $work/NAME.yml on R ranks, each rank's peak resident set in $work/NAME.rss.RANK.
launch() {
    OMP_NUM_THREADS=1 "$MPIEXEC" -n "$R" python3 tests/mpi/peak_rss.py "$work/$1.rss" "$BIN/neox-train" "$work/$1.yml" </dev/null \
        >"$work/$1.out" 2>&1 || { tail -20 "$work/$1.out" >&2; exit 1; }
}
# plan_fits NAME LAYERS HIDDEN HEADS ZERO: the start-up plan of a run that stops there (train_iters 0)
# against the budget; refuses to go on when it does not fit.
plan_fits() {
    config "$1-plan" "$2" "$3" "$4" 0 "$5"
    launch "$1-plan"
    $REPORT fits "$work/$1-plan" "$budget" "$R" ||
        { echo "bench/memory.sh: $1 does not fit the budget; pass a smaller model or a larger budget=" >&2; exit 1; }
}
L=${opt[layers]} H=${opt[hidden]} A=${opt[heads]} LAYER=$((12 * opt[hidden] * opt[hidden]))
# The libraries' own memory per rank (MPI, OpenBLAS, the C library), which the plan leaves out: the
# peak of a tiny model's start-up.
VOCAB=512 config libraries 1 64 4 0 "$(zero 3 0)"
launch libraries
echo "# the libraries' memory per rank: $($REPORT human "$($REPORT libraries_bytes "$work")") (a tiny model's start-up peak less its plan)"

if [[ ,${opt[parts]}, == *,a,* ]]; then
    echo
    echo "## (a) memory per rank by ZeRO stage: $L layers, hidden $H, dp$R, ${opt[steps]} steps"
    for s in 0 1 2 3; do
        plan_fits "a-s$s" "$L" "$H" "$A" "$(zero $s $LAYER)"
        config "a-s$s" "$L" "$H" "$A" "${opt[steps]}" "$(zero $s $LAYER)"
        launch "a-s$s"
    done
    $REPORT stages "$work" "$R"
fi

if [[ ,${opt[parts]}, == *,b,* ]]; then
    echo
    echo "## (b) the largest model of GPT-NeoX's size ladder whose plan fits $($REPORT human "$budget") at dp$R"
    for s in 0 3; do
        found=() last=""
        while read -r layers hidden heads; do
            name="b-s$s-${layers}x$hidden"
            # Not started when the last probe's bytes per parameter, applied to this size, pass the budget.
            [ -n "$last" ] && ! $REPORT predict "$work/$last-plan" "${opt[vocab]}" "$layers" "$hidden" "$budget" "$R" &&
                break
            config "$name-plan" "$layers" "$hidden" "$heads" 0 "$(zero $s $((12 * hidden * hidden)))"
            launch "$name-plan"
            $REPORT fits "$work/$name-plan" "$budget" "$R" || break
            found=("$layers" "$hidden" "$heads") last=$name
        done < <($REPORT ladder)
        [ -n "$last" ] || { echo "stage $s: not even the smallest model fits"; continue; }
        config "b-s$s" "${found[@]}" "${opt[steps]}" "$(zero $s $((12 * found[1] * found[1])))"
        launch "b-s$s"
        echo "b-s$s" >>"$work/b.runs"
    done
    $REPORT largest "$work" "$budget" "$R" $(cat "$work/b.runs")
fi

if [[ ,${opt[parts]}, == *,c,* ]]; then
    echo
    echo "## (c) step time at dp$R, $L layers, hidden $H: stage 3 against stage 1 (median of ${opt[iters]} iterations after 3)"
    plan_fits c-s1 "$L" "$H" "$A" "$(zero 1 0)"
    config c-s1 "$L" "$H" "$A" "${opt[iters]}" "$(zero 1 0)"
    # Stage 3 at DeepSpeed's defaults (prefetch 5e7 elements, units kept whole until their reuse) and with
    # the prefetch off.
    config c-s3 "$L" "$H" "$A" "${opt[iters]}" '"zero_optimization": {"stage": 3, "reduce_bucket_size": '"${opt[bucket]}"'}'
    config c-s3-noprefetch "$L" "$H" "$A" "${opt[iters]}" \
        '"zero_optimization": {"stage": 3, "reduce_bucket_size": '"${opt[bucket]}"', "stage3_prefetch_bucket_size": 0}'
    for name in c-s1 c-s3 c-s3-noprefetch; do launch "$name"; done
    $REPORT steps "$work" c-s1 c-s3 c-s3-noprefetch
fi
echo
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
