# tests/tools/cpu_checkpointing.sh: activation checkpoints kept in host memory (checkpoint_in_cpu, or
# activation_checkpointing.cpu_checkpointing) with checkpoint_activations, on the emulated device
# (compute_backend emulated: device memory apart from the host's, and its own peak). Each layer's
# input goes to the host after its forward and comes back just before its recomputation: training must
# be bit for bit the run that keeps the inputs on the device, the planned device activations
# (log_dir/memory_plan.json) must fall and the host's offloaded bytes rise by the amounts
# tests/mpi/partition_check.py computes from the model's shape, and the device's measured peak
# (memory/device_peak_bytes) must fall by the planned saving (to a page).
source tests/lib.sh

[ -x "$PY" ] || { skip "checkpoint_in_cpu" ".venv is missing (make deps)"; exit 0; }

words_dataset 300 7
source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

EMU=', "compute_backend": "emulated", "checkpoint_activations": true, "hidden_dropout": 0.1, "attention_dropout": 0.1'
run() {  # run NAME: trains $T/NAME.yml and exports its parameters
    check "$1: 10 steps on the emulated device" "$TRAIN" "$T/$1.yml"
    cp "$_last_out" "$T/$1.out"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}
LAYERS=4 config device neox 4 1 10 "$EMU"; run device
LAYERS=4 config host neox 4 1 10 "$EMU"', "checkpoint_in_cpu": true'; run host
LAYERS=4 config dict neox 4 1 10 "$EMU"', "activation_checkpointing": {"cpu_checkpointing": true}'; run dict
for name in host dict; do
    check "$name: bit for bit the run with checkpoints on the device (losses, evaluations, parameters)" \
        "$PY" tests/mpi/layouts_check.py identical "$T/device" "$T/$name"
    check "$name: device activations fall and host bytes rise by the formula" \
        "$PY" tests/mpi/partition_check.py host "$T/device" "$T/$name" "$T/$name.yml"
    check "$name: the device's measured peak falls by the planned saving (within a 4 kB page)" "$PY" - "$T/device" "$T/$name" <<'PY'
import json, sys
def peak(run):
    return max(json.loads(l).get("memory/device_peak_bytes", 0) for l in open(f"{run}/log/metrics.jsonl"))
def plan(run):
    return json.load(open(f"{run}/log/memory_plan.json"))["ranks"][0]["activations"]
a, b = sys.argv[1], sys.argv[2]
fell, planned = peak(a) - peak(b), plan(a) - plan(b)
print(f"device peak {peak(a)} -> {peak(b)}: fell {fell}, planned {planned}")
sys.exit(0 if planned > 0 and fell > 0 and abs(fell - planned) < 4096 else 1)  # mappings are whole pages
PY
    sed 's/^/# /' "$_last_out"
done
