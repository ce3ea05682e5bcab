#!/usr/bin/env bash
# bench/peers_torch.sh: sets up the benchmark peer "newest PyTorch + newest transformers" in a venv
# of its own, "${NEOX_BENCH_PEERS:-build/bench-peers}/torch-venv" (ignored by git, never committed),
# for bench/shapes.sh. Idempotent: a venv that already imports torch and transformers is kept.
# PyPI's Linux torch wheel depends on the whole CUDA stack (nvidia-* wheels, several GB). On a CPU it
# needs only the four CUDA libraries its shared objects are linked against (cuFile, cuSPARSELt,
# NVSHMEM, NCCL: about 0.7 GB), so torch is installed with --no-deps, then those four at the versions
# torch pins (read from its metadata) and its pure-Python requirements; cuDNN, cuBLAS, the CUDA
# runtime and triton are loaded only when a GPU is used and are left out. Prints the versions and
# whether torch.compile works here (inductor builds C++ with the system's compiler).
# Usage: bench/peers_torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
peers=${NEOX_BENCH_PEERS:-build/bench-peers}
venv=$peers/torch-venv
py=$venv/bin/python
check='import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
# torch's pins of the linked CUDA libraries (cuFile comes as cuda-toolkit's cufile extra).
linked_pins='
from importlib.metadata import requires
for r in requires("torch"):
    spec = r.split(";")[0].strip()
    if spec.startswith("cuda-toolkit["):
        print("cuda-toolkit[cufile]" + spec.split("]")[1])
    elif spec.startswith(("nvidia-cusparselt", "nvidia-nvshmem", "nvidia-nccl")):
        print(spec)
'
quiet() { grep -v "requires\|dependency resolver" || true; }   # pip's notes on the deps left out

if ! { [ -x "$py" ] && "$py" -c "$check" >/dev/null 2>&1; }; then
    mkdir -p "$peers"
    python3 -m venv "$venv"
    "$py" -m pip install -q --upgrade pip
    "$py" -m pip install -q --no-deps torch
    mapfile -t linked < <("$py" -c "$linked_pins")
    "$py" -m pip install -q "${linked[@]}" filelock typing-extensions sympy networkx jinja2 fsspec \
        "setuptools>=77.0.3" 2>&1 | quiet
    "$py" -m pip install -q transformers 2>&1 | quiet
fi
"$py" -c "$check"
# torch.compile on the CPU: inductor writes C++ and builds it with the system's compiler.
if "$py" - <<'EOF' 2>"$peers/compile.log"; then echo "torch.compile: works"; else echo "torch.compile: fails (see $peers/compile.log)"; fi
import torch
f = torch.compile(lambda x: torch.nn.functional.gelu(x @ x.T).sum())
x = torch.randn(64, 64)
assert torch.allclose(f(x), torch.nn.functional.gelu(x @ x.T).sum(), rtol=1e-4)
EOF
