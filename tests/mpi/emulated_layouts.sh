# tests/mpi/emulated_layouts.sh: the trainer's device paths on emulated device ranks
# (compute_backend: emulated; its collectives run through lib/parallel/emulated_comm.c, strictly as
# late as a device could run them; context parallelism's key and value all-gathers and their
# gradients' reduce-scatters among them). Each layout trains a few steps of the small layout model on
# emulated ranks and on CPU ranks; the losses, evaluations and exported parameters must be the same
# bit for bit (the emulated device's ops are the CPU's). LAYOUTS="tp2 pp2 ..." runs a subset.
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
    [tp2sp]="2 2 2 '$TP, \"sequence_parallel\": true'"
    [pp2]="2 2 4 '$PP'"
    [dp2z1]="2 2 2 '$(zero 1)'"
    [dp2z2]="2 2 2 '$(zero 2)'"
    [dp2z3]="2 2 2 '$(zero 3)'"
    [dp2z1off]="2 2 2 '$(zero 1 ', "offload_optimizer": {"device": "cpu"}')'"
    [dp2z3pre]="2 2 2 '$(zero 3 ', "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 1, "stage3_max_reuse_distance": 0')'"
    [dp2z2off]="2 2 2 '$(zero 2 ', "offload_optimizer": {"device": "cpu"}')'"
    [tp2pp2]="4 2 4 '$TP$PP'"
    [dp2tp2]="4 2 2 '$TP'"
    [moedp2tp2]="4 2 2 '$TP$MOE'"
    [moeep2]="2 2 2 '$MOE, \"moe_expert_parallel_size\": 2'"
    [cp2]="2 2 4 ', \"context_parallel_size\": 2'"
    # bf16 activation storage across ranks: pipeline messages and all-gathers of bf16 elements, the
    # tensor-parallel reductions summed in fp32 around the collective
    [bf16tp2sp]="2 2 2 '$TP, \"sequence_parallel\": true, \"precision\": \"bfloat16\"'"
    [bf16pp2]="2 2 4 '$PP, \"precision\": \"bfloat16\"'"
    # context parallelism's bf16 keys and values gathered, their gradients summed in fp32
    [bf16cp2]="2 2 4 ', \"context_parallel_size\": 2, \"precision\": \"bfloat16\"'"
)
for name in ${LAYOUTS:-tp2 tp2sp pp2 dp2z1 dp2z2 dp2z3 dp2z3pre dp2z1off dp2z2off tp2pp2 dp2tp2 moedp2tp2 moeep2 cp2 bf16tp2sp bf16pp2 bf16cp2}; do
    eval "both $name ${SPEC[$name]}"
done

# overlap_comm on emulated ranks: the buckets backward started still run when it ends (the reducer
# leaves them to the device's stream until finish waits for them), on every rank and step.
for name in dp2z1 dp2z2; do
    [[ " ${LAYOUTS:-$name} " == *" $name "* ]] || continue
    check "$name on emulated ranks: overlapped buckets still pending when backward ended, every rank" \
        python3 - "$T/$name-emu/log/comm_stats.json" <<'PY'
import json, sys
ranks = json.load(open(sys.argv[1]))["ranks"]
pending = [r["gradient_reduction"]["pending_at_backward_end"] for r in ranks]
steps = [r["gradient_reduction"]["reductions"] for r in ranks]
print(f"# pending_at_backward_end per rank {pending}, reductions {steps}", file=sys.stderr)
sys.exit(0 if ranks and all(p >= n > 0 for p, n in zip(pending, steps)) else 1)
PY
done

# ZeRO-3 with a layer at a time (nothing persistent or kept) gathers the next layers ahead of use on
# emulated ranks (non-blocking, waited for right before use: a unit used without its wait would
# compute on NaN, which the bit-for-bit comparison above sees).
if [[ " ${LAYOUTS:-dp2z3pre} " == *" dp2z3pre "* ]]; then
    check "dp2z3pre on emulated ranks: every rank prefetched parameter gathers" python3 - "$T/dp2z3pre-emu/log/comm_stats.json" <<'PY'
import json, sys
ranks = json.load(open(sys.argv[1]))["ranks"]
g = [r["parameter_gathers"] for r in ranks]
print(f"# gathers, prefetched per rank: {[(x['gathers'], x['prefetched']) for x in g]}", file=sys.stderr)
sys.exit(0 if g and all(x["prefetched"] > 0 for x in g) else 1)
PY
fi

# ZeRO-3 gives back the device memory of the units it releases (the emulated device counts a released
# page again only once it is written): each emulated rank's device peak stays within its plan and falls
# below the device peak of the same model trained with stage 0 on emulated ranks.
if [[ " ${LAYOUTS:-dp2z3} " == *" dp2z3 "* ]]; then
    LAYERS=2 EVAL_INTERVAL=2 config dp2z0-emu neox 2 2 4 "$(zero 0)$EMU"
    train_layout dp2z0-emu 2
    check "dp2z3 on emulated ranks: each rank's device peak is within its plan and below stage 0's" \
        python3 - "$T/dp2z3-emu" "$T/dp2z0-emu" <<'PY'
import glob, json, sys
def ranks(run):
    return json.load(open(glob.glob(f"{run}/**/memory_peaks.json", recursive=True)[0]))["ranks"]
z3, z0 = ranks(sys.argv[1]), ranks(sys.argv[2])
for r, (x, y) in enumerate(zip(z3, z0)):
    print(f"# rank {r}: device peak {x['device_peak_bytes']} B, planned {x['planned_bytes']} B, "
          f"stage 0's device peak {y['device_peak_bytes']} B", file=sys.stderr)
ok = len(z3) == len(z0) > 0 and all(0 < x["device_peak_bytes"] <= x["planned_bytes"] and
                                    x["device_peak_bytes"] < y["device_peak_bytes"] for x, y in zip(z3, z0))
sys.exit(0 if ok else 1)
PY
fi
