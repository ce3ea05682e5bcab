# tests/mpi/fp8_layouts.sh: precision fp8 (docs/model.md, "FP8 training") under tensor, data and
# pipeline parallelism against one rank on the same global batch. The FP8 scaling state (the run
# state's amax histories and scales) after the first step must equal the single-rank run's bit for
# bit at tp2, dp2 ZeRO-1, dp2 ZeRO-3, pp2 and pp2 x dp2 (the amaxes are max-reduced over each stage's
# tp and dp groups, every data-parallel rank casts one rank's FP8 bytes, and each stage updates its
# scales in one rank's order); later steps differ only by the
# fp32 reductions' order (held to the measured bound, below; pp2 alone has none and stays bit for
# bit), and the losses stay within 1e-5. A dp2 checkpoint resumed at tp2 carries its amax histories
# bit for bit (the next step's state equals the straight dp2 run's but for that step's own tp2
# amaxes, within 1e-6); pp2 and one-rank checkpoints resume across each other bit for bit. dp3 (a
# data-parallel size whose mean is not exact in floating point: each rank's loss gradient divides by
# the global batch's tokens and the exchange sums) is one rank's bit for bit too, with ZeRO-1, ZeRO-2
# and gradient accumulation.
source tests/lib.sh

need_mpi "FP8 under parallel layouts" || exit 0
export OMP_NUM_THREADS=1  # (up to 3 ranks of a 2-layer model on the test machine's cores)

words_dataset 200 7

source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA
LAYERS=2 CKPT_FACTOR=1 EVAL_INTERVAL=6
FP8=', "precision": "fp8", "te_fp8_amax_history_len": 4, "te_fp8_amax_compute_algo": "max"'
TP=', "model_parallel_size": 2' PP=', "pipe_parallel_size": 2'
Z1=', "zero_optimization": {"stage": 1}' Z2=', "zero_optimization": {"stage": 2}'
Z3=', "zero_optimization": {"stage": 3}'
scales() {  # scales REF RUN STEP TOL [NEWEST_TOL]: the FP8 state of RUN's checkpoint at STEP against REF's (TOL 0: bit for bit)
    "$PY" tests/mpi/fp8_layouts_check.py scales "$T/$1/ckpt" "$T/$2/ckpt" "${@:3}"
}
losses() { "$PY" tests/mpi/fp8_layouts_check.py same_losses "$T/$1" "$T/$2" "$3"; }

config one neox 4 1 6 "$FP8"
train_layout one 1
# Measured after 6 steps: tp2 4e-6 on the scales (a row-parallel sum's order moves an amax by an
# ulp, and the next scale with it), dp2 1e-7; held to 1e-4.
for spec in "tp2 2 4 '$TP'" "dp2z1 2 2 '$Z1'" "dp2z3 2 2 '$Z3'"; do
    eval "set -- $spec"
    config "$1" neox "$3" 1 6 "$FP8$4"
    train_layout "$1" "$2"
    check "$1: the FP8 scales and amax histories after step 1 equal one rank's bit for bit" scales one "$1" 1 0
    check "$1: after step 6 within 1e-4" scales one "$1" 6 1e-4
    check "$1: the losses follow one rank's within 1e-5" losses one "$1" 1e-5
done

# Cross-layout resume: dp2 (ZeRO-1) stops at step 3, tp2 resumes it.
config dp2stop neox 2 1 6 "$FP8$Z1"', "exit_interval": 3'
train_layout dp2stop 2
config tp2resumed neox 4 1 6 "$FP8$TP"', "load": "'"$T/dp2stop/ckpt"'"'
train_layout tp2resumed 2
# Step 4's state against the straight dp2 run's: the amaxes carried from steps 2 and 3 bit for bit;
# step 4's own amaxes (and the scales) within 1e-6, since a row-parallel sum at tp2 can move one by
# an ulp (measured 1.6e-7).
check "dp2 -> tp2 resume: the carried FP8 amax history equals the straight dp2 run's bit for bit, step 4's within 1e-6" \
    scales dp2z1 tp2resumed 4 0 1e-6
check "dp2 -> tp2 resume: the losses follow one rank's within 1e-5" losses one tp2resumed 1e-5

# Pipelining: 1F1B runs micro-batch 1's forward before micro-batch 0's backward, so the runs
# accumulate 4 micro-batches: each stage's forwards and its backwards must each update the scales in
# one rank's order, and each backward cast with its own forward's scales. Each stage scales its own
# layers and the run state gathers the stages' columns into one model's. Untied embeddings: the tied
# embedding's two gradients are summed between the stages in another order than one rank's, which
# moves the parameters by an ulp from step 2 on; untied, pp2 is one rank bit for bit.
UNTIED=', "no_weight_tying": true'
config onea neox 2 4 6 "$FP8$UNTIED"
train_layout onea 1
# (pp2 runs on the emulated device, which is the CPU bit for bit: the device step's slot scales too)
config pp2 neox 2 4 6 "$FP8$UNTIED$PP"', "compute_backend": "emulated"'
train_layout pp2 2
check "pp2: the FP8 scales and amax histories after step 1 equal one rank's bit for bit" scales onea pp2 1 0
check "pp2 (emulated device): after step 6 too" scales onea pp2 6 0
check "pp2: the losses follow one rank's within 1e-5" losses onea pp2 1e-5
# pp2 x dp2: the data-parallel gradient sum's order moves amaxes by an ulp from step 3 (measured
# 4e-7 after 6 steps); held to 1e-5.
config pp2dp2 neox 1 4 6 "$FP8$UNTIED$PP$Z1"
train_layout pp2dp2 4
check "pp2dp2: the FP8 scales and amax histories after step 1 equal one rank's bit for bit" scales onea pp2dp2 1 0
check "pp2dp2: after step 6 within 1e-5" scales onea pp2dp2 6 1e-5
check "pp2dp2: the losses follow one rank's within 1e-5" losses onea pp2dp2 1e-5
# Resumes across pipelining: the stages' states resume as one model's, and one model's as stages'.
config pp2stop neox 2 4 6 "$FP8$UNTIED$PP"', "exit_interval": 3'
train_layout pp2stop 2
config pp1resumed neox 2 4 6 "$FP8$UNTIED"', "load": "'"$T/pp2stop/ckpt"'"'
train_layout pp1resumed 1
check "pp2 -> one rank resume: the FP8 state after step 6 is the straight run's bit for bit" scales onea pp1resumed 6 0
check "pp2 -> one rank resume: the losses follow one rank's within 1e-5" losses onea pp1resumed 1e-5
config pp1stop neox 2 4 6 "$FP8$UNTIED"', "exit_interval": 3'
train_layout pp1stop 1
# (with checkpoint_activations: a backward's recomputed forward casts with its micro-batch's own
# scales, though later forwards have moved them, and records no amax)
config pp2resumed neox 2 4 6 "$FP8$UNTIED$PP"', "checkpoint_activations": true, "load": "'"$T/pp1stop/ckpt"'"'
train_layout pp2resumed 2
check "one rank -> pp2 resume (recomputing activations): the FP8 state after step 6 is the straight run's bit for bit" \
    scales onea pp2resumed 6 0
check "one rank -> pp2 resume: the losses follow one rank's within 1e-5" losses onea pp2resumed 1e-5

# dp3: each rank's loss gradient divides by the global batch's tokens (3 x its own), as one rank's
# does over the same 6 samples, and the data-parallel reduction sums, so every output gradient a rank
# casts to FP8 is one rank's value and the state after the first step is one rank's bit for bit
# (before, each rank's mean was averaged: scales 1e-2 apart after one step). Later steps differ by
# the fp32 sum's order only, as dp2's (measured 2.3e-7 after six steps; losses 2.7e-8).
config one6 neox 6 1 6 "$FP8"
train_layout one6 1
config dp3 neox 2 1 6 "$FP8"
train_layout dp3 3
check "dp3: the FP8 scales and amax histories after step 1 equal one rank's bit for bit" scales one6 dp3 1 0
check "dp3: after step 6 within 1e-6" scales one6 dp3 6 1e-6
check "dp3: the losses follow one rank's within 1e-6" losses one6 dp3 1e-6
# The same through ZeRO-1's and ZeRO-2's reduce-scatter into partitions (2 steps), and with 2
# micro-batches per step accumulated (each micro-batch's scales updated after it, as one rank's).
config one6a2 neox 6 2 2 "$FP8"
train_layout one6a2 1
for spec in "dp3z1 2 1 '$Z1' one6" "dp3z2 2 1 '$Z2' one6" "dp3a2 2 2 '' one6a2"; do
    eval "set -- $spec"
    config "$1" neox "$2" "$3" 2 "$FP8$4"
    train_layout "$1" 3
    check "$1: the FP8 scales and amax histories after step 1 equal one rank's bit for bit" scales "$5" "$1" 1 0
    check "$1: the losses follow one rank's within 1e-6" losses "$5" "$1" 1e-6
done
