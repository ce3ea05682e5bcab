#!/usr/bin/env bash
# scripts/deps.sh (make deps): installs what building, running and testing neox.c need.
#  1. Debian packages (apt-get; needs root, or sudo when available).
#  2. The oracle virtual environment .venv (Python packages from PyPI used only by tests and
#     benchmarks as independent references: HF tokenizers, tiktoken, numpy, pytest, ...).
#  3. The cudnn-frontend C++ headers (header-only; the CUDA build's fused attention through cuDNN,
#     kernels/cuda/cudnn_attention.cpp) into .deps/cudnn-frontend/include, from PyPI's
#     nvidia-cudnn-frontend wheel. Build time only: nothing is fetched when the tools run.
# Idempotent and quiet when everything is present.
#   scripts/deps.sh --cudnn-frontend   only step 3 (tests/gpu/device-check.sh --fetch calls it)
set -euo pipefail
cd "$(dirname "$0")/.."

# The cudnn-frontend release whose headers the CUDA build compiles against (its include/ folder is
# the same in every wheel of a release; pip fetches the one for the Python that runs it).
CUDNN_FRONTEND=nvidia-cudnn-frontend==1.32.0
CUDNN_FRONTEND_DIR=.deps/cudnn-frontend
install_cudnn_frontend() {
  local stamp=$CUDNN_FRONTEND_DIR/.version
  [ -f "$CUDNN_FRONTEND_DIR/include/cudnn_frontend.h" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$CUDNN_FRONTEND" ] && return 0
  local py=.venv/bin/python
  [ -x "$py" ] || py=/usr/bin/python3
  echo "make deps: installing the cudnn-frontend headers ($CUDNN_FRONTEND) into $CUDNN_FRONTEND_DIR"
  local tmp
  tmp=$(mktemp -d)
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" "$CUDNN_FRONTEND"
  rm -rf "$CUDNN_FRONTEND_DIR" && mkdir -p "$CUDNN_FRONTEND_DIR"
  "$py" - "$tmp"/nvidia_cudnn_frontend-*.whl "$CUDNN_FRONTEND_DIR" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("include/")])
PY
  rm -rf "$tmp"
  [ -f "$CUDNN_FRONTEND_DIR/include/cudnn_frontend.h" ] || { echo "make deps: error: no include/cudnn_frontend.h in the $CUDNN_FRONTEND wheel" >&2; exit 1; }
  echo "$CUDNN_FRONTEND" >"$stamp"
}
if [ "${1:-}" = --cudnn-frontend ]; then install_cudnn_frontend; exit 0; fi

# Debian packages, each with why it is needed.
DEBS=(
  build-essential   # gcc, make
  pkg-config        # finds the libraries below
  libyaml-dev       # configs (libyaml)
  libjansson-dev    # JSON: tokenizer files, jsonl corpora, safetensors headers
  libutf8proc-dev   # Unicode categories and NFC for the tokenizers
  libpcre2-dev      # the regular expressions tokenizer files carry (Split pre-tokenizers, tiktoken patterns)
  libsentencepiece-dev  # SPMTokenizer: SentencePiece .model files (C++, behind lib/tokenizer/spm_shim.cc)
  libzstd-dev       # .jsonl.zst input
  zlib1g-dev        # .jsonl.gz input
  libhdf5-dev       # checkpoints
  libzip-dev        # PyTorch .pt files (torch.save's zip container): GPT-NeoX/DeepSpeed checkpoints
  hdf5-tools        # h5dump/h5ls for inspecting checkpoints in tests
  libopenblas-dev   # CPU GEMM
  libmpich-dev      # MPI (headers + library)
  mpich             # mpiexec
  libcmocka-dev     # C unit tests
  clang-14          # make fuzz: the fuzz targets (tests/fuzz) are built with clang's libFuzzer
  libclang-rt-14-dev  # libFuzzer and clang's ASan/UBSan runtimes
  libomp-14-dev     # OpenMP for the library built with clang
  libmicrohttpd-dev # neox-eval serve's HTTP server (GNU libmicrohttpd)
  slurm-wlm         # SLURM tests: slurmctld, slurmd, sbatch, srun on localhost
  munge             # SLURM authentication for those tests
  bible-kjv         # make demo's corpus: the King James Bible (4.4 MB of public-domain English, pulls in
                    # bible-kjv-text), printed by its `bible` program; a real text every Debian mirror has
  python3           # oracle tests
  python3-venv      # the oracle virtual environment
  python3-dev
  python3-torch     # oracle for the model parity tests: PyTorch 1.13 CPU (~0.8 GB, 40 s; PyPI's wheels pull GBs of CUDA)
)
# PyPI packages for the oracle environment (tests and benchmarks only; never used by the tools).
PIP_PKGS=(
  zstandard   # reads .jsonl.zst corpora in the data oracle tests (as lm_dataformat does)
  pytest
  "numpy<2"                # Debian's torch 1.13 is built against the NumPy 1.x ABI
  transformers==4.49.0     # newest release that runs on torch 1.13 (4.51 needs torch.distributed.tensor); GQA Llama
  tokenizers
  tiktoken
  sentencepiece  # oracle for SPMTokenizer (and its trainer builds the test models)
  PyYAML
  tensorboard   # reads back the event files lib/metrics writes (EventAccumulator); ~65 MB with grpcio, protobuf
  ml_dtypes     # float8_e4m3fn / float8_e5m2: the FP8 casts' oracle (torch 1.13 has no float8 dtypes)
)

# pip_install ARGS...: pip into .venv, quiet, leaving the byte-compiling to compile_venv at the end:
# pip compiles every module it installs on one core (9,454 files, 20 CPU-s), compileall on all of them.
# (The modules are compiled at install, not left to the first import: where PYTHONDONTWRITEBYTECODE is
# set, every test's Python would compile transformers' 1,800 modules again.)
venv_changed=0
pip_install() { venv_changed=1; .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile "$@"; }
compile_venv() {
  [ "$venv_changed" = 1 ] || return 0
  # -qq: a file that does not compile (a template, a Python 2 example) is skipped silently, as pip does.
  .venv/bin/python -m compileall -qq -j 0 .venv/lib >/dev/null || true
}

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "make deps: installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then SUDO=sudo; echo "make deps: apt-get needs root; using sudo"
    else echo "make deps: error: installing Debian packages needs root (run 'make deps' as root or install: ${missing[*]})" >&2; exit 1; fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# MPICH must be the mpiexec/mpicc the build finds, also where Open MPI is installed too.
if ! mpiexec --version 2>/dev/null | grep -qi 'hydra\|mpich'; then
  echo "make deps: warning: 'mpiexec' is not MPICH's; tests use mpiexec.mpich" >&2
fi

# The oracle environment, built with Debian's python3 so it does not depend on a user's pyenv.
PY=/usr/bin/python3
stamp=.venv/.neox-deps
want=$(printf '%s\n' "${PIP_PKGS[@]}")
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "make deps: preparing the oracle environment .venv (${PIP_PKGS[*]})"
  # System site packages: the venv sees Debian's python3-torch.
  grep -qs 'include-system-site-packages = true' .venv/pyvenv.cfg || "$PY" -m venv --system-site-packages .venv
  pip_install "${PIP_PKGS[@]}"
  printf '%s\n' "$want" >"$stamp"
fi

# lm-evaluation-harness in the oracle environment (tests/oracle/test_serve.py and bench/serve.sh run
# it against neox-eval serve). Installed so that pip changes nothing the oracles above pin: the
# versions of transformers, tokenizers, numpy, huggingface_hub and safetensors present are
# constraints. lm-eval, accelerate and peft go in without their dependencies, because they ask for
# torch >= 1.13 and pip counts Debian's 1.13.0a0 as older; their other dependencies follow.
LM_EVAL=(lm-eval==0.4.8 accelerate==0.34.2 peft==0.13.2)
LM_EVAL_DEPS=(evaluate datasets==3.6.0 pyarrow==17.0.0 jsonlines numexpr pybind11 pytablewriter rouge-score sacrebleu
              scikit-learn sqlitedict tqdm-multiprocess dill word2number more_itertools jinja2 tenacity)
lm_stamp=.venv/.neox-deps-lm-eval
lm_want=$(printf '%s\n' "${LM_EVAL[@]}" "${LM_EVAL_DEPS[@]}")
if [ "$(cat "$lm_stamp" 2>/dev/null)" != "$lm_want" ]; then
  echo "make deps: installing lm-evaluation-harness into .venv (${LM_EVAL[*]})"
  constraints=$(mktemp)
  .venv/bin/python - >"$constraints" <<'PY'
from importlib.metadata import version
for p in ("transformers", "tokenizers", "numpy", "huggingface_hub", "safetensors"):
    print(f"{p}=={version(p)}")
PY
  pip_install --no-deps "${LM_EVAL[@]}"
  pip_install -c "$constraints" "${LM_EVAL_DEPS[@]}"
  rm -f "$constraints"
  printf '%s\n' "$lm_want" >"$lm_stamp"
fi

# The optimizer oracles (tests/oracle/test_optimizers.py): the PyPI packages GPT-NeoX builds its
# optimizers from. Without their dependencies, as lm-eval above (they ask for a torch newer than pip
# counts Debian's 1.13.0a0); torch-optimizer 0.2.0 is the last release with SM3, and its import needs
# pytorch-ranger. The import is checked, so a broken install fails here and not in a test.
OPTIM_ORACLES=(torch-optimizer==0.2.0 pytorch-ranger==0.1.1 madgrad==1.3 lion-pytorch==0.2.3)
optim_stamp=.venv/.neox-deps-optim
optim_want=$(printf '%s\n' "${OPTIM_ORACLES[@]}")
if [ "$(cat "$optim_stamp" 2>/dev/null)" != "$optim_want" ]; then
  echo "make deps: installing the optimizer oracles into .venv (${OPTIM_ORACLES[*]})"
  pip_install --no-deps "${OPTIM_ORACLES[@]}"
  .venv/bin/python -c 'from torch_optimizer.sm3 import SM3; from madgrad import MADGRAD; from lion_pytorch import Lion'
  printf '%s\n' "$optim_want" >"$optim_stamp"
fi

# DeepSpeed, whose own engine writes the GPT-NeoX checkpoints tests/oracle/test_neox_checkpoints.py
# imports (on the CPU: DS_ACCELERATOR=cpu, gloo). Without its dependencies, as lm-eval above (it asks
# for a torch pip counts newer than Debian's 1.13.0a0); DS_BUILD_OPS=0: no C++ ops are built at install
# (the test's run uses torch's Adam and gloo, none of DeepSpeed's extensions). pydantic 1.x: what the
# test was run with. The import is checked.
DEEPSPEED=(deepspeed==0.14.4 hjson==3.1.0 py-cpuinfo==9.0.0 ninja==1.13.2 "pydantic<2")
ds_stamp=.venv/.neox-deps-deepspeed
ds_want=$(printf '%s\n' "${DEEPSPEED[@]}")
if [ "$(cat "$ds_stamp" 2>/dev/null)" != "$ds_want" ]; then
  echo "make deps: installing DeepSpeed into .venv (${DEEPSPEED[*]})"
  DS_BUILD_OPS=0 pip_install --no-deps "${DEEPSPEED[@]}"
  DS_ACCELERATOR=cpu .venv/bin/python -c 'import deepspeed' >/dev/null
  printf '%s\n' "$ds_want" >"$ds_stamp"
fi

compile_venv
install_cudnn_frontend
