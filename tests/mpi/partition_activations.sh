# tests/mpi/partition_activations.sh: partitioned activation checkpoints (partition_activations, or
# activation_checkpointing.partition_activations) with checkpoint_activations under tensor
# parallelism. At tp2, tp2 x pp2, tp2 x dp2 and tp4 the same 20 steps train with and without it:
# losses, evaluations and final parameters must be bit for bit the same (the pieces are all-gathered
# exactly), and every rank's planned activations (log_dir/memory_plan.json) must fall by the
# checkpointed inputs' (P-1)/P share less the one gather buffer, as tests/mpi/partition_check.py
# computes from the model's shape. Where the switch can do nothing (model_parallel_size 1, no
# checkpoint_activations) a notice says so, and the checkpointing switches neox.c ignores are named
# in the start-up notice.
source tests/lib.sh

need_mpi "partitioned activations" || exit 0

words_dataset 500 7

source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

CKPT=', "checkpoint_activations": true'
PART=', "partition_activations": true'
DICT=', "activation_checkpointing": {"partition_activations": true}'

run() { train_export "$@"; }
# pair NAME RANKS LAYOUT KIND [SPELLING]: the run without and with partitioned checkpoints.
pair() {
    config "$1-off" "$4" 2 2 20 "$3$CKPT"; run "$1-off" "$2"
    config "$1-on" "$4" 2 2 20 "$3$CKPT${5:-$PART}"; run "$1-on" "$2"
    check "$1: partitioned equals whole checkpoints bit for bit (losses, evaluations, parameters)" \
        "$PY" tests/mpi/layouts_check.py identical "$T/$1-off" "$T/$1-on"
    check "$1: every rank's activations fall by the checkpointed inputs' (P-1)/P less one gather buffer" \
        "$PY" tests/mpi/partition_check.py saving "$T/$1-off" "$T/$1-on" "$T/$1-on.yml"
    sed 's/^/# /' "$_last_out"
    check "$1: no notice that the switch does nothing" bash -c "! grep -q 'no effect in this run' '$T/$1-on.out'"
}

pair tp2 2 ', "model_parallel_size": 2' neox
LAYERS=8 pair tp2pp2 4 ', "model_parallel_size": 2, "pipe_parallel_size": 2' neox
pair tp2dp2 4 ', "model_parallel_size": 2' llama "$DICT"
pair tp4 4 ', "model_parallel_size": 4' neox

# Where it can do nothing, a notice names the key and why.
config tp1 neox 2 2 2 "$CKPT$PART"
check_fails "model_parallel_size 1: the notice names partition_activations" 0 \
    "no effect in this run: partition_activations \(model_parallel_size 1" "$TRAIN" "$T/tp1.yml"
config nockpt neox 2 2 2 ', "model_parallel_size": 2'"$DICT"
check_fails "without checkpoint_activations: the notice names activation_checkpointing.partition_activations" 0 \
    "no effect in this run: activation_checkpointing.partition_activations \(.*checkpoint_activations, which is false" \
    "$MPIEXEC" -n 2 "$TRAIN" "$T/nockpt.yml"
config cpuhost neox 2 2 2 "$CKPT"', "checkpoint_in_cpu": true'
check_fails "cpu backend: the notice names checkpoint_in_cpu" 0 \
    "no effect in this run: checkpoint_in_cpu \(the cpu backend" "$TRAIN" "$T/cpuhost.yml"

# The switches with no meaning in neox.c are listed in the start-up notice (docs/config.md says why).
IGN=', "contiguous_checkpointing": true, "synchronize_each_layer": true, "profile_backward": true,
  "activation_checkpointing": {"contiguous_memory_optimization": true, "number_checkpoints": 4,
  "synchronize_checkpoint_boundary": true, "profile": true}'
config ignored neox 2 2 2 "$CKPT$IGN"
for key in contiguous_checkpointing synchronize_each_layer profile_backward activation_checkpointing.contiguous_memory_optimization \
    activation_checkpointing.number_checkpoints activation_checkpointing.synchronize_checkpoint_boundary activation_checkpointing.profile; do
    check_fails "$key is listed as having no effect" 0 "no effect in neox.c .*$key" "$TRAIN" --print-config "$T/ignored.yml"
done
