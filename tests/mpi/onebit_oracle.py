# onebit_oracle.py: an independent numpy implementation of DeepSpeed's 1-bit compressed all-reduce
# with error feedback (worker and server error buffers, one scale per segment on the worker side
# and per chunk on the server side, signs >= 0 -> +1 packed most significant bit first), for
# tests/mpi/onebit.sh.
#   onebit_oracle.py gen DIR P STEPS    writes DIR/segments.txt and DIR/input.f32
#   onebit_oracle.py check DIR P        compares DIR/out_<r>.f32 and DIR/pack_<r>.u8 with the oracle
import math
import sys

import numpy as np

SEGMENTS = [1, 7, 100, 1000, 3001, 64]
f32 = np.float32


def sgn(x):
    return np.where(x >= 0, f32(1), f32(-1)).astype(f32)


def scale_of(x):
    return f32(math.sqrt(float(np.sum(x.astype(np.float64) ** 2)))) / f32(math.sqrt(x.size))


def oracle(inputs, p):
    """inputs: steps x p x total. Returns outputs (steps x p x total), worker and server errors."""
    unit = p * (p * 8 // math.gcd(p, 8))
    padded = [(n + unit - 1) // unit * unit for n in SEGMENTS]
    werr = [[np.zeros(N, f32) for N in padded] for _ in range(p)]
    serr = [[np.zeros(N // p, f32) for N in padded] for _ in range(p)]
    outs = []
    for x in inputs:
        out = np.zeros_like(x)
        off = 0
        for s, (n, N) in enumerate(zip(SEGMENTS, padded)):
            C = N // p
            signs, scales = [], []
            for q in range(p):
                buf = np.zeros(N, f32)
                buf[:n] = x[q, off:off + n]
                buf = buf + werr[q][s]
                scale = scale_of(buf)
                werr[q][s] = buf - scale * sgn(buf)
                signs.append(sgn(buf))
                scales.append(scale)
            full = np.zeros(N, f32)
            for r in range(p):
                comp = np.zeros(C, f32)
                for q in range(p):
                    comp = comp + signs[q][r * C:(r + 1) * C] * (scales[q] * f32(1.0 / p))
                comp = comp + serr[r][s]
                scale = scale_of(comp)
                serr[r][s] = comp - scale * sgn(comp)
                full[r * C:(r + 1) * C] = sgn(comp) * scale
            out[:, off:off + n] = full[:n]
            off += n
        outs.append(out)
    return np.stack(outs), werr, serr


def main():
    mode, d, p = sys.argv[1], sys.argv[2], int(sys.argv[3])
    total = sum(SEGMENTS)
    if mode == "gen":
        steps = int(sys.argv[4])
        rng = np.random.default_rng(11)
        # Each segment its own magnitude; a drift shared by the ranks, so the mean is not noise.
        mags = np.concatenate([np.full(n, 10.0 ** rng.uniform(-3, 1)) for n in SEGMENTS])
        common = rng.standard_normal(total)
        x = np.stack([[(common + 0.5 * rng.standard_normal(total)) * mags for _ in range(p)] for _ in range(steps)])
        x.astype(f32).tofile(f"{d}/input.f32")
        with open(f"{d}/segments.txt", "w") as f:
            f.write(" ".join(map(str, SEGMENTS)) + "\n")
        return
    x = np.fromfile(f"{d}/input.f32", f32)
    steps = x.size // (p * total)
    x = x.reshape(steps, p, total)
    want, werr, serr = oracle(x, p)
    bad = []
    for r in range(p):
        got = np.fromfile(f"{d}/out_{r}.f32", f32)
        outs = got[:steps * total].reshape(steps, total)
        w = np.concatenate(werr[r])
        s = np.concatenate(serr[r])
        got_w = got[steps * total:steps * total + w.size]
        got_s = got[steps * total + w.size:]
        for name, a, b in (("outputs", outs, want[:, r]), ("worker error", got_w, w), ("server error", got_s, s)):
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-6 * float(np.abs(b).max() + 1e-30)):
                bad.append(f"rank {r} {name}: max difference {np.abs(a - b).max() if a.shape == b.shape else a.shape}")
        packed = np.fromfile(f"{d}/pack_{r}.u8", np.uint8)
        first = x[0, r, :total // 8 * 8]
        if not np.array_equal(packed, np.packbits(first >= 0)):
            bad.append(f"rank {r}: packed signs differ from numpy.packbits")
    # The compression must track the true mean: error feedback keeps the running sums close.
    mean_sum = x.mean(axis=1).sum(axis=0)
    got_sum = want[:, 0].sum(axis=0)
    rel = np.linalg.norm(got_sum - mean_sum) / np.linalg.norm(mean_sum)
    print(f"{p} ranks, {steps} steps, {total} elements: {len(bad)} mismatches; "
          f"|sum(compressed) - sum(mean)| / |sum(mean)| = {rel:.3f}")
    for b in bad:
        print(b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
