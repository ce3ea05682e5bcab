"""The compressed and sparse gradient exchanges' backend ops (kernels/cpu/compression.c, through the
cpu and the emulated device's tables) against numpy restatements: DeepSpeed's 1-bit compression with
error feedback (the formulas of tests/mpi/onebit_oracle.py: the scale is the L2 norm over sqrt(n),
signs >= 0 -> +1 packed most significant bit first, the error keeps x - scale * sign(x)), the
server's average of p compressed chunks and the receivers' decompression, PowerSGD's Gram-Schmidt
(torch.distributed's powerSGD_hook orthogonalises P column by column the same way) and its
error-feedback update, and the sparse embedding rows' sum and scaling by id. The C driver
tests/drivers/compression_ops.c runs the ops; both backends must give the same bits."""
import math
import os
import subprocess

import numpy as np
import pytest

DRIVER = "build/cpu/tests/drivers/compression_ops"
f32 = np.float32
N, PADDED, CHUNKS = 3001, 3008, 4
ROWS, COLS = 300, 5
V, C, NIDS = 50, 33, 120


def sgn(x):
    return np.where(x >= 0, f32(1), f32(-1)).astype(f32)


def scale_of(x):
    return f32(math.sqrt(float(np.sum(x.astype(np.float64) ** 2)))) / f32(math.sqrt(x.size))


def gram_schmidt(P):
    P = P.copy()
    for i in range(P.shape[1]):
        for j in range(i):
            dot = float(np.dot(P[:, i].astype(np.float64), P[:, j].astype(np.float64)))
            P[:, i] = P[:, i] - (dot * P[:, j].astype(np.float64)).astype(f32)
        norm = float(np.sum(P[:, i].astype(np.float64) ** 2))
        P[:, i] = P[:, i] * f32(1.0 / (math.sqrt(norm) + 1e-8))
    return P


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("compression_ops")
    rng = np.random.default_rng(7)
    x = {
        "error": (0.1 * rng.standard_normal(PADDED)).astype(f32),
        "x": rng.standard_normal(N).astype(f32),
        "P": rng.standard_normal((ROWS, COLS)).astype(f32),
        "acc": rng.standard_normal((ROWS, COLS)).astype(f32),
        "y": rng.standard_normal((ROWS, COLS)).astype(f32),
        "grad": rng.standard_normal((V, C)).astype(f32),
        "rows": rng.standard_normal((NIDS, C)).astype(f32),
        "ids": rng.integers(0, V - 5, NIDS).astype(np.int32),  # repeats; the last rows untouched
    }
    x["error"][N:] = f32(0.25)  # the padding's own error, which compensation keeps
    x["distinct"] = np.unique(x["ids"]).astype(np.int32)[::-1].copy()
    for name, a in x.items():
        a.tofile(d / f"{name}.{'i32' if a.dtype == np.int32 else 'f32'}")
    (d / "shapes.txt").write_text(f"{N} {PADDED} {CHUNKS} {ROWS} {COLS} {V} {C} {NIDS} {len(x['distinct'])}\n")
    return d, x


def run(d, backend):
    if not os.path.exists(DRIVER):
        pytest.fail(f"{DRIVER} is missing (run 'make test-drivers')")
    out = d / backend
    out.mkdir(exist_ok=True)
    for f in d.iterdir():
        if f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    subprocess.run([DRIVER, backend, str(out)], check=True)
    return out


def read(out, name, dtype=f32):
    return np.fromfile(out / name, dtype)


@pytest.fixture(scope="module", params=["cpu", "emulated"])
def result(request, inputs):
    d, x = inputs
    return run(d, request.param), x


def blocks(out):
    chunk = PADDED // CHUNKS
    wire = read(out, "wire.u8", np.uint8).reshape(CHUNKS, 5 + chunk // 8 + 3)
    scales = wire[:, 1:5].copy().view(f32).reshape(CHUNKS)
    signs = np.unpackbits(wire[:, 5:5 + chunk // 8], axis=1).astype(bool)
    return scales, signs


def test_onebit_compress(result):
    out, x = result
    buf = x["error"].copy()
    buf[:N] = buf[:N] + x["x"]
    scale = scale_of(buf)
    scales, signs = blocks(out)
    assert np.array_equal(signs.reshape(-1), buf >= 0)
    np.testing.assert_allclose(scales, np.full(CHUNKS, scale), rtol=1e-6)
    np.testing.assert_allclose(read(out, "error_out.f32"), buf - scale * sgn(buf), rtol=0, atol=1e-6)


def test_onebit_average_and_decompress(result):
    out, _ = result
    scales, signs = blocks(out)
    values = np.where(signs, f32(1), f32(-1)).astype(f32)
    want = values[0] * (scales[0] * f32(1.0 / CHUNKS))
    for q in range(1, CHUNKS):
        want = want + values[q] * (scales[q] * f32(1.0 / CHUNKS))
    assert np.array_equal(read(out, "average.f32"), want)
    full = (values * scales[:, None]).reshape(-1)[:N]
    assert np.array_equal(read(out, "decompress.f32"), full)


def test_orthonormalise_columns(result):
    out, x = result
    got = read(out, "P_out.f32").reshape(ROWS, COLS)
    np.testing.assert_allclose(got, gram_schmidt(x["P"]), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.T.astype(np.float64) @ got, np.eye(COLS), atol=1e-5)


def test_error_feedback_and_copy(result):
    out, x = result
    assert np.array_equal(read(out, "acc_out.f32").reshape(ROWS, COLS), x["acc"] + f32(-3) * x["y"])
    want = np.zeros((ROWS, COLS + 2), f32)
    want[:, :COLS - 1] = x["y"][:, :COLS - 1]
    assert np.array_equal(read(out, "copy_out.f32").reshape(ROWS, COLS + 2), want)


def test_rows_by_id(result):
    out, x = result
    grad = x["grad"].copy()
    grad[x["ids"]] = 0
    for i, r in enumerate(x["ids"]):
        grad[r] = grad[r] + x["rows"][i]
    assert np.array_equal(read(out, "grad_sum.f32").reshape(V, C), grad)
    grad[x["distinct"]] = grad[x["distinct"]] * f32(0.25)
    assert np.array_equal(read(out, "grad_scaled.f32").reshape(V, C), grad)


def test_backends_agree(inputs):
    d, _ = inputs
    a, b = run(d, "cpu"), run(d, "emulated")
    for f in sorted(a.iterdir()):
        if f.name.endswith(("_out.f32", ".u8", "average.f32", "decompress.f32", "grad_sum.f32", "grad_scaled.f32")):
            assert f.read_bytes() == (b / f.name).read_bytes(), f.name
