# tests/mpi/optimizer_layouts.sh: the optimizers beyond AdamW (tests/mpi/layouts.sh's) — lion, madgrad_wd,
# sm3, cpu_torch_adam and sgd — under tp2, pp2 and dp2 ZeRO-1 (SM3 also ZeRO-3, whose partitions cut its
# matrices, whose row and column accumulators stay whole) against one rank: the same model and global batch
# train 10 steps, and losses, evaluations and final parameters must equal the single-rank run's
# within 1e-5 relative. The Llama-style model has no biases: a key bias's gradient is zero in exact
# arithmetic, which rounding under another layout makes a tiny number of either sign, and Lion steps
# by its sign. Also DeepSpeed's rule for untested optimizers under ZeRO (zero_allow_untested_optimizer):
# madgrad_wd, sm3 and sgd under ZeRO are refused naming the key, and run with it set. SM3 resumes under
# another layout (dp2 ZeRO-3 to tp2) on the single-rank trajectory.
source tests/lib.sh

need_mpi "optimizers under 3-D parallel layouts" || exit 0

words_dataset 300 7

source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

LAYERS=2 CKPT_FACTOR=10 EVAL_INTERVAL=5
TP=', "model_parallel_size": 2' PP=', "pipe_parallel_size": 2'
Z1=', "zero_optimization": {"stage": 1}' Z3=', "zero_optimization": {"stage": 3}'
ALLOW=', "deepspeed_extra_args": {"zero_allow_untested_optimizer": true}'
declare -A OPTIMIZERS=(
    [lion]='{"type": "lion", "params": {"lr": 0.0003, "betas": [0.9, 0.99]}}'
    [madgrad_wd]='{"type": "madgrad_wd", "params": {"lr": 0.01, "momentum": 0.9, "eps": 1.0e-6}}'
    [sm3]='{"type": "sm3", "params": {"lr": 0.01, "momentum": 0.5}}'
    [cpu_torch_adam]='{"type": "cpu_torch_adam", "params": {"lr": 0.003}}'
    [sgd]='{"type": "sgd", "params": {"lr": 0.01, "momentum": 0.9}}'
)

# run NAME RANKS: trains $T/NAME.yml on RANKS ranks and exports the final parameters.
run() {
    train_layout "$1" "$2"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}

for opt in lion madgrad_wd sm3 cpu_torch_adam sgd; do
    OPTIMIZER=${OPTIMIZERS[$opt]}
    config "$opt-one" llama 2 4 10 ""
    run "$opt-one" 1
    z1=$Z1
    case $opt in madgrad_wd | sm3 | sgd) z1="$Z1$ALLOW" ;; esac
    specs=("tp2 2 2 4 '$TP'" "pp2 2 2 4 '$PP'" "dp2z1 2 2 2 '$z1'")
    [ "$opt" = sm3 ] && specs+=("dp2z3 2 2 2 '$Z3$ALLOW'")
    for spec in "${specs[@]}"; do
        eval "set -- $spec"
        config "$opt-$1" llama "$3" "$4" 10 "$5"
        run "$opt-$1" "$2"
        check "$opt-$1 follows the single-rank run (losses, evaluations, final parameters within 1e-5)" \
            "$PY" tests/mpi/layouts_check.py same "$T/$opt-one" "$T/$opt-$1"
        # SM3's accumulators themselves: a partition's partial maxima would rarely move the
        # parameters (each element reads the smaller of its row's and its column's), so they are
        # compared directly; rank 0 of a data-parallel layout holds them whole.
        [ "$opt" = sm3 ] && [ "${1#dp2}" != "$1" ] && for g in rows cols; do
            check "sm3-$1: the $g accumulators equal the single-rank run's (within 1e-5)" "$PY" tests/mpi/layouts_check.py \
                same_group optimizer/sm3_$g "$T/sm3-one/ckpt/global_step10/rank_00000.h5" "$T/sm3-$1/ckpt/global_step10/rank_00000.h5"
        done
    done
done

# DeepSpeed's engine: under ZeRO only its tested optimizers (Adam, AdamW, its CPU Adam, Lion) run
# unless zero_allow_untested_optimizer is set; the stage counts, not the data-parallel size.
OPTIMIZER=${OPTIMIZERS[madgrad_wd]}
config untested llama 2 2 2 "$Z1"
check_fails "madgrad_wd under ZeRO-1 without zero_allow_untested_optimizer is refused naming it" 2 \
    "madgrad_wd.*untested with ZeRO.*zero_allow_untested_optimizer" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/untested.yml"
check_fails "and so on one rank: the stage counts" 2 "zero_allow_untested_optimizer" "$TRAIN" -q "$T/untested.yml"
config stage0 llama 2 2 2 ', "zero_optimization": {"stage": 0}'
check "madgrad_wd at stage 0 needs no permission" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/stage0.yml"
OPTIMIZER=${OPTIMIZERS[sm3]}
config sm3-untested llama 2 2 2 "$Z1"
check_fails "sm3 under ZeRO-1 too" 2 "'sm3' is untested with ZeRO" "$TRAIN" -q "$T/sm3-untested.yml"
OPTIMIZER=${OPTIMIZERS[sgd]}
config sgd-untested llama 2 2 2 "$Z1"
check_fails "sgd under ZeRO-1 too" 2 "'sgd' is untested with ZeRO" "$TRAIN" -q "$T/sgd-untested.yml"
config sgd-allowed llama 2 2 2 "$Z1$ALLOW"
check "sgd under ZeRO-1 with zero_allow_untested_optimizer trains" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/sgd-allowed.yml"
OPTIMIZER=${OPTIMIZERS[lion]}
config lion-z1 llama 2 2 2 "$Z1"
check "lion under ZeRO-1 needs no permission (DeepSpeed's FusedLion is tested)" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/lion-z1.yml"

# SM3's accumulators are layout-free checkpoint tensors: 10 steps under dp2 ZeRO-3 and 10 more under
# tp2 continue the 20-step single-rank run (the accumulators the second run reads were partitioned
# differently when written).
OPTIMIZER=${OPTIMIZERS[sm3]}
config sm3-straight llama 2 4 20 ""
train_layout sm3-straight 1
config sm3-z3-a llama 2 2 20 "$Z3$ALLOW, \"exit_interval\": 10"
config sm3-tp2-b llama 2 4 20 "$TP, \"load\": \"$T/sm3-z3-a/ckpt\""
check "sm3: 10 steps under dp2 ZeRO-3" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/sm3-z3-a.yml"
check "sm3: 10 more under tp2 from that checkpoint" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/sm3-tp2-b.yml"
check "sm3: the resumed run continues the straight run's trajectory (within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py resumed "$T/sm3-straight" "$T/sm3-z3-a" "$T/sm3-tp2-b"
