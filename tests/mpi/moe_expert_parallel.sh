# tests/mpi/moe_expert_parallel.sh: expert parallelism (moe_expert_parallel_size). The MoE model of
# tests/mpi/moe.sh (4 experts, every layer with the Sinkhorn router, every second layer with topk)
# trains 12 steps on one rank (4 micro-batches of 2 accumulated) and with the experts shared out
# over expert groups of data-parallel ranks: dp2/EP2, dp4/EP2 and dp4/EP4, ZeRO-1 too, top-1 and
# top-2. Every rank routes its own micro-batch, so the routing is one rank's; losses, evaluations
# and the final parameters (resharded to one shard, read with h5dump) must follow one rank within
# 1e-5, and so do the logged parameter norms. A checkpoint moves EP2 -> one rank -> EP4 on the
# straight run's trajectory, gated renormalised experts (Mixtral's) follow one rank under dp2/EP2,
# the combinations expert parallelism does not cover are refused
# naming both keys, and the communication report counts the expert group's all-to-all bytes exactly.
source tests/lib.sh

need_mpi "MoE expert parallelism" || exit 0
command -v h5dump >/dev/null || { skip "MoE expert parallelism" "h5dump (hdf5-tools) is not installed"; exit 0; }

words_dataset 400 5

source tests/moe_config.sh
config() { moe_config "$@"; }  # config NAME ACCUM ROUTER INTERVAL TOP_K EXTRA

# one_shard RUN: RUN's final checkpoint resharded to one rank, $T/RUN/one/global_step12/rank_00000.h5.
one_shard() {
    "$CONVERT" reshard --input "$T/$1/ckpt" --output "$T/$1/one" --dp 1 >/dev/null 2>&1
    echo "$T/$1/one/global_step12/rank_00000.h5"
}

for spec in "sinkhorn 1 2" "sinkhorn 1 1" "topk 2 2" "topk 2 1"; do
    set -- $spec
    router=$1 interval=$2 k=$3 ref="$1-k$3"
    config "$ref" 4 "$router" "$interval" "$k" ""
    check "$router router, top-$k: one rank, 4 micro-batches of 2" "$TRAIN" -q "$T/$ref.yml"
    for layout in "dp2ep2 2 2 2" "dp4ep2 4 1 2" "dp4ep4 4 1 4" "dp2ep2zero1 2 2 2" "dp4ep2zero1 4 1 2"; do
        set -- $layout
        extra=", \"moe_expert_parallel_size\": $4"
        case $1 in *zero1) extra="$extra, \"zero_optimization\": {\"stage\": 1}" ;; esac
        config "$ref-$1" "$3" "$router" "$interval" "$k" "$extra"
        check "$router top-$k: $1 on $2 ranks" "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/$ref-$1.yml"
        check "$router top-$k: $1 follows one rank (losses, evaluations within 1e-5)" \
            "$PY" tests/mpi/layouts_check.py same_losses "$T/$ref" "$T/$ref-$1"
        check "$router top-$k: $1's final parameters equal one rank's (relative L2 within 1e-5)" \
            "$PY" tests/mpi/layouts_check.py same_params "$(one_shard "$ref")" "$(one_shard "$ref-$1")"
    done
done

# Gated experts with renormalised top-2 weights (Mixtral's), shared out as the ungated ones are.
MIX=', "activation": "swiglu", "moe_topk_renormalize": true'
config mixtral 4 topk 1 2 "$MIX"
config mixtral-dp2ep2 2 topk 1 2 "$MIX, \"moe_expert_parallel_size\": 2"
check "gated renormalised experts: one rank" "$TRAIN" -q "$T/mixtral.yml"
check "gated renormalised experts: dp2/EP2" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/mixtral-dp2ep2.yml"
check "gated renormalised experts: dp2/EP2 follows one rank (losses, evaluations within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py same_losses "$T/mixtral" "$T/mixtral-dp2ep2"
check "gated renormalised experts: dp2/EP2's final parameters equal one rank's (relative L2 within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py same_params "$(one_shard mixtral)" "$(one_shard mixtral-dp2ep2)"

# Each rank holds only its experts: a dp2/EP2 shard has two of the four experts of a layer, and only
# the first rank of an expert group writes the tensors every rank holds.
shard=$T/sinkhorn-k2-dp2ep2/ckpt/global_step12
check "an EP2 rank writes its own experts only" bash -c \
    "[ \$(h5ls -r '$shard/rank_00000.h5' | grep -c '^/params/.*layers.0.block_sparse_moe.experts.*Dataset') = 4 ] &&
     h5ls -r '$shard/rank_00001.h5' | grep -q '^/params/.*layers.0.block_sparse_moe.experts.3.w2' &&
     ! h5ls -r '$shard/rank_00001.h5' | grep -q '^/params/.*layers.0.block_sparse_moe.experts.0.w1' &&
     ! h5ls -r '$shard/rank_00001.h5' | grep -q '^/params/.*embed_in'"

# EP2 (steps 1-4) -> one rank (5-8) -> EP4 (9-12), against the straight one-rank run.
config hop-a 2 sinkhorn 1 2 ', "moe_expert_parallel_size": 2, "exit_interval": 4'
config hop-b 4 sinkhorn 1 2 ', "exit_interval": 8, "load": "'"$T"'/hop-a/ckpt"'
config hop-c 1 sinkhorn 1 2 ', "moe_expert_parallel_size": 4, "load": "'"$T"'/hop-b/ckpt"'
check "checkpoint hop: EP2 trains steps 1-4" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/hop-a.yml"
check "checkpoint hop: one rank resumes for steps 5-8" "$TRAIN" -q "$T/hop-b.yml"
check "checkpoint hop: dp4/EP4 resumes for steps 9-12" "$MPIEXEC" -n 4 "$TRAIN" -q "$T/hop-c.yml"
check "checkpoint hop: every part continues the straight run (within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py segments "$T/sinkhorn-k2" "$T/hop-a" "$T/hop-b" "$T/hop-c"

# The overlapped reduction (buckets started during backward, the experts' in their own reducer).
ZO='"zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_bucket_size": 2000}'
config overlap 1 sinkhorn 1 2 ", \"moe_expert_parallel_size\": 2, $ZO"
check "dp4/EP2 with overlap_comm and small buckets" "$MPIEXEC" -n 4 "$TRAIN" -q "$T/overlap.yml"
check "dp4/EP2 with overlap_comm follows one rank (losses, evaluations within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py same_losses "$T/sinkhorn-k2" "$T/overlap"

# log_param_norm counts each expert once, from the ranks that hold it: dp4/EP2's norms are one rank's.
config norm-one 4 sinkhorn 1 2 ', "log_param_norm": true'
config norm-ep 1 sinkhorn 1 2 ', "log_param_norm": true, "moe_expert_parallel_size": 2'
check "log_param_norm: one rank" "$TRAIN" -q "$T/norm-one.yml"
check "log_param_norm: dp4/EP2" "$MPIEXEC" -n 4 "$TRAIN" -q "$T/norm-ep.yml"
check "log_param_norm: dp4/EP2's per-tensor and total norms equal one rank's (within 1e-5)" \
    "$PY" tests/mpi/zero3_check.py norms "$T/norm-one" "$T/norm-ep"

# The communication report lists the expert group: every rank's all-to-alls of an exchange (a count per
# local expert to each rank, 4E bytes, then the rows out and back, in forward and again in backward)
# summed over the ranks are 4E + 4 x (N top_k rows x C x 4 bytes) per micro-batch and MoE layer for each
# rank; the comms summary and the per-step metrics name the group too. (No evaluation: its exchanges
# would count as well.)
config comm-ep 2 sinkhorn 1 2 ', "moe_expert_parallel_size": 2, "do_valid": false, "do_test": false,
  "comms_logger": {"enabled": true}'
check "the expert group's report: dp2/EP2" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/comm-ep.yml"
check "comm_stats.json: the expert group's all-to-all bytes are the analytical count" \
    "$PY" - "$T/comm-ep/log" <<'PY'
import json, sys
log = sys.argv[1]
ranks = json.load(open(f"{log}/comm_stats.json"))["ranks"]
iters, accum, dp, moe_layers, E, K, N, C = 12, 2, 2, 2, 4, 2, 2 * 32, 32
want = iters * accum * dp * moe_layers * (4 * E + 4 * N * K * C * 4)
got = sum(r["groups"]["expert"]["all_to_all"]["bytes"] for r in ranks)
print(f"expert all_to_all bytes {got}, analytical {want}")
assert got == want
assert all("expert_data" in r["groups"] for r in ranks)
summary = open(f"{log}/comms_summary.txt").read()
assert "expert/all_to_all" in summary, "the comms summary does not list the expert group"
steps = [json.loads(l) for l in open(f"{log}/metrics.jsonl")]
assert any("comm/expert/all_to_all/bytes" in s for s in steps), "no per-step expert metrics"
PY

# Refusals: each names moe_expert_parallel_size and the key it cannot go with.
refuse() {  # refuse NAME RANKS PATTERN EXTRA [SED]: SED edits the config's own keys
    config "bad$2-${1// /_}" 2 sinkhorn 1 2 "$4"
    [ -n "${5:-}" ] && sed -i "$5" "$T/bad$2-${1// /_}.yml"
    check_fails "refused: $1" 2 "$3" "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/bad$2-${1// /_}.yml"
}
refuse "EP not dividing the experts" 3 "moe_expert_parallel_size 3 must divide moe_num_experts 4" \
    ', "moe_expert_parallel_size": 3'
refuse "EP not dividing the data-parallel size" 2 "moe_expert_parallel_size 4 must divide the data-parallel size 2" \
    ', "moe_expert_parallel_size": 4'
refuse "EP without experts" 2 "moe_expert_parallel_size 2 with moe_num_experts" \
    ', "moe_expert_parallel_size": 2' 's/"moe_num_experts": 4/"moe_num_experts": 1/'
refuse "EP with ZeRO-2" 2 "moe_expert_parallel_size 2 with zero_optimization.stage" \
    ', "moe_expert_parallel_size": 2, "zero_optimization": {"stage": 2}'
refuse "EP with pipelining" 2 "moe_expert_parallel_size 2 with pipe_parallel_size" \
    ', "moe_expert_parallel_size": 2, "pipe_parallel_size": 2'
refuse "EP with tensor parallelism" 2 "moe_expert_parallel_size 2 with model_parallel_size" \
    ', "moe_expert_parallel_size": 2, "model_parallel_size": 2'
refuse "EP with gradient compression" 2 "moe_expert_parallel_size 2 with gradient_compression" \
    ', "moe_expert_parallel_size": 2, "gradient_compression": "powersgd"'
refuse "EP with 1-bit Adam" 2 "moe_expert_parallel_size 2 with optimizer.type" \
    ', "moe_expert_parallel_size": 2' 's/"type": "Adam"/"type": "OneBitAdam"/'
refuse "EP with train_impl dpo" 2 "moe_expert_parallel_size 2 with train_impl" \
    ', "moe_expert_parallel_size": 2, "train_impl": "dpo"'
