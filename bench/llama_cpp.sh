#!/usr/bin/env bash
# bench/llama_cpp.sh: sets up llama.cpp as a benchmark peer (idempotent). Builds the llama.cpp that
# PyPI's llama-cpp-python source distribution vendors (CPU only, Release, fp32 as it comes) into
# $NEOX_BENCH_PEERS/llama.cpp (default build/bench-peers/llama.cpp): bin/ holds its tools
# llama-bench, llama-completion (the prompt-in, text-out program; this version's llama-cli is a chat
# client built on its server), llama-simple and llama-quantize (F32 GGUF to Q4_1 and the other
# quantized types), convert_hf_to_gguf.py its Hugging Face to GGUF
# converter, venv/ a Python environment with the converter's `gguf` package (the sdist's own gguf-py)
# on top of .venv's packages. Nothing goes into .venv or the repository.
# Its programs run with their default threading (OpenMP, threads spinning between ops as shipped):
# callers set no OMP_WAIT_POLICY for them.
# Usage: bench/llama_cpp.sh            (prints the peer folder on its last line)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${NEOX_BENCH_PEERS:-build/bench-peers}
mkdir -p "$PEERS"
PEERS=$(cd "$PEERS" && pwd)
DEST=$PEERS/llama.cpp
JOBS=${JOBS:-2}
if [ -x "$DEST/bin/llama-bench" ] && [ -x "$DEST/bin/llama-completion" ] && [ -x "$DEST/bin/llama-quantize" ] && [ -f "$DEST/convert_hf_to_gguf.py" ] && [ -d "$DEST/conversion" ] &&
   "$DEST/venv/bin/python" -c 'import gguf, torch; torch.float8_e4m3fn' 2>/dev/null; then
    echo "$DEST"
    exit 0
fi
[ -x .venv/bin/python ] || { echo "bench/llama_cpp.sh: .venv is missing (run 'make deps')" >&2; exit 1; }
src=$PEERS/src
mkdir -p "$src" "$DEST/bin"
if ! ls "$src"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    .venv/bin/python -m pip download --no-binary llama-cpp-python --no-deps -d "$src" llama-cpp-python >&2
fi
sdist=$(ls "$src"/llama_cpp_python-*.tar.gz | sort -V | tail -1)
tree=${sdist%.tar.gz}
[ -d "$tree" ] || tar -xzf "$sdist" -C "$src"
LL=$tree/vendor/llama.cpp
[ -f "$LL/CMakeLists.txt" ] || { echo "bench/llama_cpp.sh: $sdist vendors no llama.cpp" >&2; exit 1; }

# Native code for this CPU (GGML_NATIVE), OpenMP threads as llama.cpp ships them, no GPU, no curl.
nice -n 19 cmake -S "$LL" -B "$PEERS/llama.cpp-build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
nice -n 19 cmake --build "$PEERS/llama.cpp-build" --config Release -j "$JOBS" \
    --target llama-bench llama-completion llama-simple llama-quantize >&2
for t in llama-bench llama-completion llama-simple llama-quantize; do
    cp "$PEERS/llama.cpp-build/bin/$t" "$DEST/bin/"
done
cp "$LL/convert_hf_to_gguf.py" "$DEST/"
rm -rf "$DEST/gguf-py" "$DEST/conversion"
cp -r "$LL/gguf-py" "$DEST/gguf-py"
cp -r "$LL/conversion" "$DEST/conversion"  # the converter's model classes, imported from beside it

# The converter needs gguf (and numpy, torch, transformers, sentencepiece: .venv's).
if ! "$DEST/venv/bin/python" -c 'import gguf, torch; torch.float8_e4m3fn' 2>/dev/null; then
    rm -rf "$DEST/venv"
    .venv/bin/python -m venv --system-site-packages "$DEST/venv"
    base=$(.venv/bin/python -c 'import os, sysconfig; print(os.path.realpath(sysconfig.get_paths()["purelib"]))')
    site=$("$DEST/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$base" >"$site/neox-venv.pth"        # .venv's packages, read-only
    echo "$DEST/gguf-py" >"$site/gguf-py.pth"  # the sdist's gguf, matching its converter
    # .venv's torch (1.13) predates the dtypes the converter names in its tables (float8, uint16..64):
    # when torch is first imported (it sits in a system folder added after this one), placeholders
    # that equal no tensor's dtype are set, and an fp32 model never meets them.
    cat >"$site/neox_torch_dtypes.py" <<'PY'
import importlib.abc
import importlib.util
import sys


class _AddDtypes(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for dtype in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
                if not hasattr(module, dtype):
                    setattr(module, dtype, type(dtype, (), {})())

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AddDtypes())
PY
    echo "import neox_torch_dtypes" >"$site/neox_torch_dtypes.pth"
fi
"$DEST/venv/bin/python" -c 'import gguf' >&2
echo "$DEST"
