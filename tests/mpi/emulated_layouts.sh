# tests/mpi/emulated_layouts.sh: the trainer's device paths on emulated device ranks
# (compute_backend: emulated; its collectives run through lib/parallel/emulated_comm.c, strictly as
# late as a device could run them). Each layout trains a few steps of the small layout model on
# emulated ranks and on CPU ranks; the losses, evaluations and exported parameters must be the same
# bit for bit (the emulated device's ops are the CPU's). LAYOUTS="tp2 pp2 ..." runs a subset.
source tests/lib.sh

need_mpi "layouts on emulated device ranks" || exit 0

words_dataset 200 7
source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

EMU=', "compute_backend": "emulated"'
TP=', "model_parallel_size": 2' PP=', "pipe_parallel_size": 2'
zero() { echo ", \"zero_optimization\": {\"stage\": $1, \"overlap_comm\": true, \"reduce_bucket_size\": 3000$2}"; }

# both NAME RANKS MICRO ACCUM EXTRA: NAME on CPU ranks and on emulated ranks, exported, compared.
both() {
    local name=$1 ranks=$2 micro=$3 accum=$4 extra=$5
    LAYERS=2 EVAL_INTERVAL=2 config "$name-cpu" neox "$micro" "$accum" 4 "$extra"
    LAYERS=2 EVAL_INTERVAL=2 config "$name-emu" neox "$micro" "$accum" 4 "$extra$EMU"
    for side in cpu emu; do
        train_layout "$name-$side" "$ranks"
        check "$name-$side: export" "$CONVERT" to-hf --input "$T/$name-$side/ckpt" --output "$T/$name-$side/hf"
    done
    check "$name on emulated device ranks equals $name on CPU ranks bit for bit" \
        "$PY" tests/mpi/layouts_check.py identical "$T/$name-cpu" "$T/$name-emu"
}

declare -A SPEC=(
    [tp2]="2 2 2 '$TP'"
    [pp2]="2 2 4 '$PP'"
    [dp2z1]="2 2 2 '$(zero 1)'"
    [dp2z2]="2 2 2 '$(zero 2)'"
    [dp2z1off]="2 2 2 '$(zero 1 ', "offload_optimizer": {"device": "cpu"}')'"
    [dp2z2off]="2 2 2 '$(zero 2 ', "offload_optimizer": {"device": "cpu"}')'"
    [tp2pp2]="4 2 4 '$TP$PP'"
    [dp2tp2]="4 2 2 '$TP'"
)
for name in ${LAYOUTS:-tp2 pp2 dp2z1 dp2z2 dp2z1off dp2z2off tp2pp2 dp2tp2}; do
    eval "both $name ${SPEC[$name]}"
done
