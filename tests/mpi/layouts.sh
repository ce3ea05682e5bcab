# tests/mpi/layouts.sh: 3-D parallelism against one rank. The same model and global batch train
# 20 steps under each layout (dp2, tp2, pp2 with 4 micro-batches, tp2+pp2, dp2+tp2, dp2+pp2 with
# and without overlap_comm, dp2 with ZeRO-1 and ZeRO-2, dp4 with ZeRO-1); losses, evaluations and
# final parameters must equal the single-rank run's within 1e-5 relative; dp3 in bfloat16 computes
# one rank's gradients. A Llama-style model
# (rmsnorm, swiglu, GQA, untied, sequential residual, a sliding attention window as Mistral's)
# checks the cuts of its tensors under tp2, pp2
# and tp2+pp2, and the overlapped reduction's order under dp2; a progress thread (dp2+pp2, ZeRO-2)
# changes no bit. A model with non-parametric norms follows its single-rank run under tp2, pp2 and
# dp2 ZeRO-3. Sequence parallelism (tp2sp, with pp2, with dp2; the Llama-style model with dropout and
# activation checkpointing) follows the single-rank run too. Checkpoints move across layouts
# (tp2+pp2 -> dp4/ZeRO-1, the reverse, dp2 -> dp1) and the trajectory continues. The bytes each
# group moves per step equal the analytical count (tp2 with sequence_parallel: all-gathers and
# reduce-scatters in place of the all-reduces). Context parallelism (cp2, cp4, with dp2 ZeRO-1, tp2,
# pp2, the Llama-style model, ALiBi, use_qk_layernorm's split q, k, v, checkpoint_activations) follows the single-rank run, its keys' and values' gathers and
# their gradients' reduce-scatters move the analytical bytes per step, its checkpoints resume at cp1 and
# the reverse, and what it is not implemented with is refused by name. Killing one rank ends the job
# with `latest` intact.
source tests/lib.sh

need_mpi "3-D parallel layouts" || exit 0

words_dataset 500 7

source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

# run NAME RANKS: trains $T/NAME.yml on RANKS ranks and exports the final parameters.
run() {
    train_layout "$1" "$2"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}

same() {  # same NAME REFERENCE: losses, evaluations and parameters within 1e-5
    check "$1 follows the single-rank run (losses, evaluations, final parameters within 1e-5)" \
        "$PY" tests/mpi/layouts_check.py same "$T/$2" "$T/$1"
}

TP=', "model_parallel_size": 2' PP=', "pipe_parallel_size": 2'
Z1=', "zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_bucket_size": 3000}'
Z2=', "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 3000}'
ZO=', "zero_optimization": {"stage": 0, "overlap_comm": true, "reduce_bucket_size": 3000}'
config one neox 2 4 20 ""
run one 1
for spec in "dp2 2 2 2 ''" "tp2 2 2 4 '$TP'" "pp2 2 2 4 '$PP'" "tp2pp2 4 2 4 '$TP$PP'" "dp2tp2 4 2 2 '$TP'" \
            "dp2pp2 4 2 2 '$PP'" "dp2pp2o 4 2 2 '$PP$ZO'" "dp2z1 2 2 2 '$Z1'" "dp2z2 2 2 2 '$Z2'" "dp4z1 4 2 1 '$Z1'"; do
    eval "set -- $spec"
    config "$1" neox "$3" "$4" 20 "$5"
    run "$1" "$2"
    same "$1" one
done
# Sequence parallelism: the same training as tp2 with each rank's rows of the residual stream, norms
# and dropouts only (its activation plan smaller than tp2's: tests/mpi/memory.sh).
SP=', "sequence_parallel": true'
for spec in "tp2sp 2 2 4 '$TP$SP'" "tp2pp2sp 4 2 4 '$TP$PP$SP'" "dp2tp2sp 4 2 2 '$TP$SP'"; do
    eval "set -- $spec"
    config "$1" neox "$3" "$4" 20 "$5"
    run "$1" "$2"
    same "$1" one
done
sed 's/"seq_length": 32/"seq_length": 31/' "$T/tp2sp.yml" >"$T/seq31.yml"
check_fails "sequence_parallel with a seq_length not divisible by model_parallel_size is refused by name" 2 \
    "sequence_parallel.*seq_length 31 is not divisible by model_parallel_size 2" \
    "$MPIEXEC" -n 2 "$TRAIN" -q "$T/seq31.yml"
check "dp2pp2 with overlap_comm gives bit for bit the results without" \
    "$PY" tests/mpi/layouts_check.py identical "$T/dp2pp2" "$T/dp2pp2o"
# A progress thread testing the buckets in flight (comm_progress_thread_us) changes when a reduction
# completes, never what it sums: stage 0 across pipeline stages and ZeRO-2 landing buckets early.
PT=', "comm_progress_thread_us": 50'
for spec in "dp2pp2ot 4 2 2 '$PP$ZO$PT' dp2pp2o" "dp2z2t 2 2 2 '$Z2$PT' dp2z2"; do
    eval "set -- $spec"
    config "$1" neox "$3" "$4" 20 "$5"
    run "$1" "$2"
    check "$1 (a progress thread) gives bit for bit the results of $6" \
        "$PY" tests/mpi/layouts_check.py identical "$T/$6" "$T/$1"
done
echo '{"comm_progress_thread_us": 50}' >"$T/pt-alone.yml"
check_fails "comm_progress_thread_us without overlap_comm is refused by name" 2 \
    "comm_progress_thread_us: .*overlap_comm" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/dp2.yml" "$T/pt-alone.yml"
WIN=', "sliding_window_width": 11'  # Mistral-style: 12 of the 32 positions
config llama1 llama 2 4 20 "$WIN"
run llama1 1
for spec in "llamatp2 2 4 '$TP'" "llamapp2 2 4 '$PP'" "llamatp2pp2 4 4 '$TP$PP'" "llamadp2o 2 2 '$ZO'"; do
    eval "set -- $spec"
    config "$1" llama 2 "$3" 20 "$4$WIN"
    run "$1" "$2"
    same "$1" llama1
done

# Context parallelism (context_parallel_size): each rank of a context group holds 2 of the 2 cp chunks
# of every sequence (its rotary positions global) and all-gathers the layer's keys and values; with
# data parallelism and ZeRO-1, tensor and pipeline parallelism, and on the Llama-style model (GQA and a
# sliding window over the gathered keys), it follows the single-rank run.
CP2=', "context_parallel_size": 2'
for spec in "cp2 2 2 4 '$CP2' one" "cp2dp2z1 4 2 2 '$CP2$Z1' one" "cp2tp2 4 2 4 '$CP2$TP' one" \
            "cp2pp2 4 2 4 '$CP2$PP' one" "cp4 4 2 4 ', \"context_parallel_size\": 4' one"; do
    eval "set -- $spec"
    config "$1" neox "$3" "$4" 20 "$5"
    run "$1" "$2"
    same "$1" "$6"
done
check "cp2: every step's bytes of the context and data groups (metrics.jsonl) equal the analytical count" \
    "$PY" tests/mpi/comm_accounting_check.py logged cp2 "$T/one/hf/config.json" 2 4 "$T/cp2"
config llamacp2 llama 2 4 20 "$CP2$WIN"
run llamacp2 2
same llamacp2 llama1
# cp2_follows NAME KEY EXTRA: one rank and cp2 trained with EXTRA added, cp2 following one rank.
cp2_follows() {
    config "${1}1" neox 2 4 20 "$3"
    check "${1}1: train on 1 rank(s)" "$TRAIN" -q "$T/${1}1.yml"
    config "${1}cp2" neox 2 4 20 "$CP2$3"
    check "${1}cp2: train on 2 rank(s)" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/${1}cp2.yml"
    check "${1}cp2 follows the single-rank $2 run (losses, evaluations within 1e-5)" \
        "$PY" tests/mpi/layouts_check.py same_losses "$T/${1}1" "$T/${1}cp2"
}
# use_qk_layernorm keeps q, k and v in split copies (the head norm's contiguous tensors): cp gathers
# the keys and values from those, as it otherwise does from the fused QKV output's views.
cp2_follows qk use_qk_layernorm ', "use_qk_layernorm": true'
# checkpoint_activations: the recomputed forward gathers the keys and values through the room the
# MLP's backward and the key/value gradients share, between the layer's MLP backward and its attention's.
cp2_follows ck checkpoint_activations ', "checkpoint_activations": true'
sed 's/"seq_length": 32/"seq_length": 30/' "$T/cp2.yml" >"$T/cpseq30.yml"
check_fails "context_parallel_size with a seq_length not divisible by 2 x context_parallel_size is refused by name" 2 \
    "context_parallel_size.*seq_length 30 is not divisible by 2 x context_parallel_size" \
    "$MPIEXEC" -n 2 "$TRAIN" -q "$T/cpseq30.yml"
refused() {  # refused NAME RANKS KEY: $T/NAME.yml is refused naming context_parallel_size and KEY
    check_fails "context_parallel_size with $3 is refused by name" 2 "context_parallel_size.* with $3" \
        "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/$1.yml"
}
config cpnosp neox 2 4 20 "$CP2$TP$SP"
refused cpnosp 4 sequence_parallel
config cpnodrop neox 2 4 20 "$CP2, \"attention_dropout\": 0.1"
refused cpnodrop 2 attention_dropout
POS_EMB=learned config cpnolearned neox 2 4 20 "$CP2"
refused cpnolearned 2 pos_emb

# Sequence parallelism on the Llama-style model (sequential residual, RMSNorm) with hidden and
# attention dropout and activation checkpointing: each rank draws its rows' masks and recomputes from
# its rows of each layer's input.
DR=', "hidden_dropout": 0.1, "attention_dropout": 0.1, "checkpoint_activations": true'
config llamadr1 llama 2 4 20 "$DR"
run llamadr1 1
config llamadrtp2sp llama 2 4 20 "$DR$TP$SP"
run llamadrtp2sp 2
same llamadrtp2sp llamadr1

# ALiBi (pos_emb alibi, GPT-NeoX's slopes): each tensor-parallel rank biases its own heads with its
# slice of the slopes. Losses and evaluations only: no Hugging Face class holds an ALiBi model.
# follow VAR=VALUE REF WHAT SPEC...: REF trains on one rank with VAR set (config reads it; once, when
# an earlier follow trained it), then each SPEC "NAME RANKS MICRO ACCUM EXTRA" trains under the same
# setting and must follow REF's losses.
follow() {
    local "$1"; local ref=$2 what=$3; shift 3
    if [ ! -f "$T/$ref.yml" ]; then
        config "$ref" neox 2 4 20 ""
        check "$ref: train on 1 rank(s)" "$TRAIN" -q "$T/$ref.yml"
    fi
    for spec in "$@"; do
        eval "set -- $spec"
        config "$1" neox "$3" "$4" 20 "$5"
        check "$1: train on $2 rank(s)" "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/$1.yml"
        check "$1 follows the single-rank $what run (losses, evaluations within 1e-5)" \
            "$PY" tests/mpi/layouts_check.py same_losses "$T/$ref" "$T/$1"
    done
}
follow POS_EMB=alibi alibi1 ALiBi "alibitp2 2 2 4 '$TP'" "alibitp2pp2 4 2 4 '$TP$PP'"
# Context parallelism under ALiBi: the bias takes each rank's queries' global positions.
follow POS_EMB=alibi alibi1 ALiBi "alibicp2 2 2 4 ', \"context_parallel_size\": 2'"
check "ALiBi changes the losses (its slopes reach the scores)" bash -c \
    "! $PY tests/mpi/layouts_check.py same_losses '$T/one' '$T/alibi1' >/dev/null"

# ScaleNorm (norm: scalenorm): one gain per norm, replicated on every tensor-parallel rank.
follow NORM=scalenorm scale1 ScaleNorm "scaletp2 2 2 4 '$TP'"
check "ScaleNorm changes the losses" bash -c \
    "! $PY tests/mpi/layouts_check.py same_losses '$T/one' '$T/scale1' >/dev/null"

# Non-parametric LayerNorm (norm: non_parametric_layernorm): no norm tensors; every rank, every stage
# and every ZeRO-3 unit computes its norms with the model's constant weight of ones.
follow NORM=non_parametric_layernorm np1 "non-parametric LayerNorm" "nptp2 2 2 4 '$TP'" "nppp2 2 2 4 '$PP'" \
    "npz3 2 2 2 ', \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0}'"
check "non_parametric_layernorm changes the losses" bash -c \
    "! $PY tests/mpi/layouts_check.py same_losses '$T/one' '$T/np1' >/dev/null"

# bfloat16 linear layers: each layout rounds the same values to 16 bits except where a reduction
# order differs by an fp32 ulp and a rounding flips, which training amplifies: measured 1.1e-5 on
# the losses and 1.0e-4 / 6.5e-5 relative L2 on the parameters (tp2pp2 / dp2 ZeRO-1) after 20 steps;
# held to 5e-4. Activations are stored in bfloat16 (docs/model.md, "Activation storage"), so under
# tensor parallelism each rank's partial sum of a row-parallel product is rounded to bf16 before the
# fp32 sum over the group, where one rank rounds the whole sum once: a bf16 rounding more per
# element, which Adam turns into steps of size lr on near-zero gradients (the biases). Measured
# 2.1e-3 relative L2 on tp2pp2's parameters after 20 steps (its losses stay within 5e-4): held to 5e-3.
# Context parallelism in bf16 (cp2) moves the stored bf16 keys and values and sums their gradients in
# fp32, each rank's whole gradient rounded to bf16 first (the attention's output): the same extra
# rounding, measured 1.9e-3 on the parameters (the QKV bias) and 3.8e-5 on the losses: held to 5e-3.
BF16=', "precision": "bfloat16"'
config bf16one neox 2 4 20 "$BF16"
run bf16one 1
for spec in "bf16tp2pp2 4 2 4 '$BF16$TP$PP' 5e-3" "bf16dp2z1 2 2 2 '$BF16$Z1' 5e-4" "bf16cp2 2 2 4 '$BF16$CP2' 5e-3"; do
    eval "set -- $spec"
    config "$1" neox "$3" "$4" 20 "$5"
    run "$1" "$2"
    check "$1 follows the single-rank bfloat16 run (losses, evaluations within 5e-4; final parameters within $6)" \
        "$PY" tests/mpi/layouts_check.py same "$T/bf16one" "$T/$1" 5e-4 "$6"
done
# A data-parallel size whose mean is not exact in floating point (dp3, bf16): each rank's loss
# gradient divides by the global batch's tokens (3 x its own) and the exchange sums, so each rank's
# bf16 products round one rank's values and the reduced gradient is one rank's but for the fp32
# sum's order: measured 7.8e-9 on the gradient norms and 5.3e-8 on the losses of 3 steps (averaging
# each rank's own mean instead: 2.3e-3 on the gradient norms, 2.8e-6 on the losses); held to 1e-6.
LAYERS=2 config bf16one6 neox 6 1 3 "$BF16"
train_layout bf16one6 1
LAYERS=2 config bf16dp3 neox 2 1 3 "$BF16"
train_layout bf16dp3 3
check "bf16dp3 follows the single-rank run's gradient norms and losses within 1e-6" \
    "$PY" tests/mpi/layouts_check.py same_steps "$T/bf16one6" "$T/bf16dp3" 1e-6

# fp16 with forced overflows (2^26 x the output gradient exceeds 65504): tensor and pipeline
# parallelism must skip the same steps and move the loss scale the same way (the overflow test is on
# the global gradient norm, which all ranks share), and otherwise follow the single-rank fp16 run.
# (Data parallelism with another micro-batch split scales each rank's micro-batch gradient
# differently before the average, 1 / accumulation steps, as DeepSpeed does, so which values
# overflow fp16 depends on the split: measured, dp2 skipped 8 steps of 20 where one rank skipped 7.)
FP16=', "fp16": {"enabled": true, "initial_scale_power": 26, "loss_scale_window": 5, "hysteresis": 2}'
config fp16one neox 2 4 20 "$FP16"
run fp16one 1
same_scaling() {  # same_scaling REF RUN: identical skip flags and loss scales, and at least one skip
    "$PY" - "$1/log/metrics.jsonl" "$2/log/metrics.jsonl" <<'PY'
import json, sys
def seq(p):
    return [(r["train/skipped_iterations"], r["train/loss_scale"]) for r in map(json.loads, open(p)) if "train/lm_loss" in r]
a, b = seq(sys.argv[1]), seq(sys.argv[2])
print(f"{sum(s for s, _ in a)} skipped of {len(a)}; scales {[x for _, x in a]}")
assert a == b, (a, b)
assert any(s for s, _ in a) and not all(s for s, _ in a)
PY
}
for spec in "fp16tp2pp2 4 2 4 '$FP16$TP$PP'"; do
    eval "set -- $spec"
    config "$1" neox "$3" "$4" 20 "$5"
    run "$1" "$2"
    check "$1 skips the single-rank fp16 run's steps with the same loss scales" same_scaling "$T/fp16one" "$T/$1"
    check "$1 follows the single-rank fp16 run (losses, evaluations, final parameters within 5e-4)" \
        "$PY" tests/mpi/layouts_check.py same "$T/fp16one" "$T/$1" 5e-4
done

# Cross-layout resume: 10 steps under one layout, 10 more under another, against the 20-step run.
resume() {  # resume NAME FROM_RANKS FROM_MICRO FROM_ACCUM FROM_EXTRA TO_RANKS TO_MICRO TO_ACCUM TO_EXTRA
    config "$1-a" neox "$3" "$4" 20 "$5, \"exit_interval\": 10"
    config "$1-b" neox "$7" "$8" 20 "$9, \"load\": \"$T/$1-a/ckpt\""
    local a=() b=()
    [ "$2" -gt 1 ] && a=("$MPIEXEC" -n "$2")
    [ "$6" -gt 1 ] && b=("$MPIEXEC" -n "$6")
    check "$1: first 10 steps" "${a[@]}" "$TRAIN" -q "$T/$1-a.yml"
    check "$1: resume for 10 more under the other layout" "${b[@]}" "$TRAIN" -q "$T/$1-b.yml"
    check "$1: the resumed run continues the straight run's trajectory (within 1e-5)" \
        "$PY" tests/mpi/layouts_check.py resumed "$T/one" "$T/$1-a" "$T/$1-b"
}
resume "tp2pp2-to-dp4z1" 4 2 4 "$TP$PP" 4 2 1 "$Z1"
resume "dp4z1-to-tp2pp2" 4 2 1 "$Z1" 4 2 4 "$TP$PP"
resume "dp2-to-dp1" 2 2 2 "" 1 2 4 ""
resume "cp2-to-cp1" 2 2 4 "$CP2" 1 2 4 ""
resume "cp1-to-cp2" 1 2 4 "" 2 2 4 "$CP2"

# Communication volume: the bytes per step (the difference of a 6- and a 4-step run) per group.
volume() {  # volume NAME RANKS MICRO ACCUM EXTRA
    local launch=("$MPIEXEC" -n "$2")
    for n in 4 6; do
        config "$1-$n" neox "$3" "$4" "$n" "$5, \"do_valid\": false, \"do_test\": false"
        check "$1: $n steps" "${launch[@]}" "$TRAIN" -q "$T/$1-$n.yml"
    done
    check "$1: bytes per step of every group equal the analytical count" \
        "$PY" tests/mpi/layouts_check.py volume "$1" "$T/one/hf/config.json" "$3" "$4" "$T/$1-4" "$T/$1-6"
}
volume dp2 2 2 2 ""
volume dp2z1 2 2 2 "$Z1"
volume dp2z2 2 2 2 "$Z2"
volume tp2 2 2 4 "$TP"
volume tp2sp 2 2 4 "$TP$SP"
volume pp2 2 2 4 "$PP"

# One rank killed mid-run: the job ends with a failure, no hang, and `latest` names a sound checkpoint.
CKPT_FACTOR=5 config kill neox 2 2 100000 ""
kill_rank_mid_run kill
check "killing rank 1 mid-run ends the job with a failure status within 60 s" \
    test -n "$KILL_VICTIM" -a "$KILL_STATUS" -ne 0 -a "$KILL_TOOK" -lt 60
check_output "latest still names a sound checkpoint" "is sound" "$CONVERT" verify "$T/kill/ckpt"

# Ranks that load different configurations are stopped at start-up.
echo '{"seed": 5}' >"$T/other-seed.yml"
cat >"$T/differ.sh" <<EOF
#!/bin/sh
if [ "\$PMI_RANK" = 1 ]; then exec "$TRAIN" -q "$T/one.yml" "$T/other-seed.yml"; fi
exec "$TRAIN" -q "$T/one.yml"
EOF
chmod +x "$T/differ.sh"
check_fails "ranks with different configurations are refused at start-up" 2 "different configurations" \
    timeout 60 "$MPIEXEC" -n 2 "$T/differ.sh"
