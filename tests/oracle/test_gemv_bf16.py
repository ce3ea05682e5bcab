"""The decoding step's bfloat16 one-row product (kernels/cpu/gemv.c, through the driver
tests/drivers/gemv_bf16.c) against numpy: random bfloat16 weights and inputs (numpy draws float32
values and keeps their high 16 bits, so both sides multiply the same bfloat16 numbers), the product
in float64 by numpy. Every build this CPU runs (the reference loop, AVX2 + FMA, AVX512_BF16) and the
threaded path neox_gemm_ex takes must be within 1e-5 of the sum of the products' magnitudes: the
products are exact in fp32, only the fp32 sums round. Shapes: SmolLM2-135M's (576 wide, its
fused QKV, gated MLP and down projection), a row length that is odd and not a multiple of any
vector, and a tied classifier's width."""
import os
import subprocess

import pytest

np = pytest.importorskip("numpy")
from safetensors.numpy import load_file  # noqa: E402

from data_oracle import BIN, ROOT  # noqa: E402

DRIVER = os.path.join(BIN, "..", "tests", "drivers", "gemv_bf16")


def bf16_bits(values):
    """float32 values cut to bfloat16 (their high half), as uint16 bits, and the float32 they stand for."""
    bits = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def write_bf16(path, tensors):
    """A safetensors file of BF16 tensors given as uint16 bits (safetensors.numpy has no bfloat16)."""
    import json
    import struct
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = arr.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.mark.parametrize("n,k", [(960, 576), (3072, 576), (576, 1536), (37, 301), (5000, 576)])
def test_bf16_gemv_matches_numpy(tmp_path, n, k):
    if not os.path.exists(DRIVER):
        pytest.skip(f"{DRIVER} is not built (make test-drivers)")
    rng = np.random.default_rng(n * 7919 + k)
    w_bits, w = bf16_bits(rng.standard_normal((n, k), dtype=np.float32) * 0.05)
    x_bits, x = bf16_bits(rng.standard_normal(k, dtype=np.float32))
    write_bf16(tmp_path / "in.safetensors", {"w": w_bits, "x": x_bits})
    subprocess.run([DRIVER, str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors")], check=True,
                   cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "2"})
    out = load_file(str(tmp_path / "out.safetensors"))
    want = w.astype(np.float64) @ x.astype(np.float64)
    scale = np.abs(w.astype(np.float64)) @ np.abs(x.astype(np.float64))
    assert "y_reference" in out and "y_gemm_ex" in out
    for name, y in out.items():
        err = np.abs(y.astype(np.float64) - want)
        worst = int(np.argmax(err / scale))
        assert np.all(err <= 1e-5 * scale), (name, worst, y[worst], want[worst])
