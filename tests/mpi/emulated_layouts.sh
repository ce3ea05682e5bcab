# tests/mpi/emulated_layouts.sh: the trainer's device paths on emulated device ranks
# (compute_backend: emulated; its collectives run through lib/parallel/emulated_comm.c, strictly as
# late as a device could run them). Each layout trains a few steps of the small layout model on
# emulated ranks and on CPU ranks; the losses, evaluations and exported parameters must be the same
# bit for bit (the emulated device's ops are the CPU's). LAYOUTS="tp2 pp2 ..." runs a subset. What the
# device paths do not offer yet stays refused by name on emulated ranks.
source tests/lib.sh

need_mpi "layouts on emulated device ranks" || exit 0

words_dataset 200 7
source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

EMU=', "compute_backend": "emulated"'
TP=', "model_parallel_size": 2' PP=', "pipe_parallel_size": 2'
MOE=', "moe_num_experts": 4, "moe_top_k": 2, "moe_router_type": "topk", "moe_topk_renormalize": true'
zero() { echo ", \"zero_optimization\": {\"stage\": $1, \"overlap_comm\": true, \"reduce_bucket_size\": 3000$2}"; }

# both NAME RANKS MICRO ACCUM EXTRA: NAME on CPU ranks and on emulated ranks, exported, compared
# (MoE layouts, moe*, on the Llama-style model: GPT-NeoX's parallel residual takes no MoE).
both() {
    local name=$1 ranks=$2 micro=$3 accum=$4 extra=$5 kind=neox
    [ "${name#moe}" != "$name" ] && kind=llama
    LAYERS=2 EVAL_INTERVAL=2 config "$name-cpu" $kind "$micro" "$accum" 4 "$extra"
    LAYERS=2 EVAL_INTERVAL=2 config "$name-emu" $kind "$micro" "$accum" 4 "$extra$EMU"
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
    [moedp2tp2]="4 2 2 '$TP$MOE'"
)
for name in ${LAYOUTS:-tp2 pp2 dp2z1 dp2z2 dp2z1off dp2z2off tp2pp2 dp2tp2 moedp2tp2}; do
    eval "both $name ${SPEC[$name]}"
done

# Refused on device ranks, naming the key (host algorithms: another change may lift them).
LAYERS=2 config refused llama 2 2 4 "$EMU"
for spec in "moe_expert_parallel_size 2 with compute_backend|\"moe_num_experts\": 4, \"moe_expert_parallel_size\": 2" \
            "zero_optimization.stage 3|\"zero_optimization\": {\"stage\": 3}"; do
    echo "{${spec#*|}}" >"$T/refused-extra.yml"
    check_fails "emulated dp2: ${spec%%|*} is refused by name" 2 "${spec%%|*}" \
        $MPIEXEC -n 2 "$TRAIN" -q "$T/refused.yml" "$T/refused-extra.yml"
done
