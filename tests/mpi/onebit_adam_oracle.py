# onebit_adam_oracle.py: DeepSpeed's OnebitAdam restated in torch over P simulated ranks, for
# tests/mpi/onebit_adam.sh: the first step only creates the state; steps 2 .. freeze_step are Adam
# without bias correction on the rank-averaged gradient; from then on the variance is frozen, each
# rank folds its own gradient into its momentum, and the momentum goes through the compressed
# all-reduce (per tensor: padded to a multiple of P x lcm(P, 8), worker error added, signs with
# scale |x| / sqrt(numel), chunk r served by rank r which averages the P compressed chunks, adds its
# server error and re-compresses), then update = exp_avg / (sqrt(exp_avg_sq) + eps) (+ wd x p).
#   onebit_adam_oracle.py gen DIR P STEPS FREEZE   writes segments, settings, params and gradients
#   onebit_adam_oracle.py check DIR P              compares DIR/trace_<r>.f32 step by step
import math
import sys

import numpy as np
import torch

SEGMENTS = [5, 64, 300, 1024, 2047]
LR, BETA1, BETA2, EPS, WD = 0.002, 0.9, 0.95, 1e-8, 0.01


def sign_pm1(x):
    # DeepSpeed: x.sign().add_(1).bool().float().add_(-0.5).mul_(2.0): 0 counts as +1
    return x.sign().add(1).bool().float().add(-0.5).mul(2.0)


def compressed_allreduce(ms, worker_error, server_error, p):
    """ms: each rank's flat momentum of one tensor; the errors are updated in place."""
    n, padded = ms[0].numel(), worker_error[0].numel()
    chunk = padded // p
    signs, scales = [], []
    for q in range(p):
        buf = torch.cat([ms[q], torch.zeros(padded - n)]) + worker_error[q]
        scale = torch.linalg.norm(buf) / np.sqrt(buf.numel())
        worker_error[q].copy_(buf - scale * sign_pm1(buf))
        signs.append(sign_pm1(buf).view(p, chunk))
        scales.append(scale)
    served = []
    for r in range(p):
        comp = sum(signs[q][r] * (scales[q] * (1.0 / p)) for q in range(p)) + server_error[r]
        scale = torch.linalg.norm(comp) / np.sqrt(comp.numel())
        server_error[r].copy_(comp - scale * sign_pm1(comp))
        served.append(scale * sign_pm1(comp))
    full = torch.cat(served)[:n]
    return [full.clone() for _ in range(p)]


def onebit_adam(params, grads, p, freeze):
    """grads: steps x p x total. Returns steps x p x 3 x total (parameters, exp_avg, exp_avg_sq)."""
    divider = p * 8 // math.gcd(p, 8)
    unit = p * divider
    offsets = np.cumsum([0] + SEGMENTS)
    tensors = [[torch.tensor(params[offsets[i]:offsets[i + 1]]) for i in range(len(SEGMENTS))] for _ in range(p)]
    m = [[torch.zeros(n) for n in SEGMENTS] for _ in range(p)]
    v = [[torch.zeros(n) for n in SEGMENTS] for _ in range(p)]
    werr = [[torch.zeros((n + unit - 1) // unit * unit) for _ in range(p)] for n in SEGMENTS]
    serr = [[torch.zeros((n + unit - 1) // unit * unit // p) for _ in range(p)] for n in SEGMENTS]
    trace = []
    for step, g in enumerate(grads, start=1):
        g = torch.tensor(g)
        frozen = step - 1 >= freeze  # DeepSpeed freezes after the step whose state['step'] reaches freeze_step
        if step > 1:
            for i, n in enumerate(SEGMENTS):
                sl = slice(offsets[i], offsets[i + 1])
                if not frozen:
                    mean = sum(g[q, sl] for q in range(p)) * (1.0 / p)
                    for q in range(p):
                        m[q][i].mul_(BETA1).add_(mean, alpha=1 - BETA1)
                        v[q][i].mul_(BETA2).addcmul_(mean, mean, value=1 - BETA2)
                else:
                    for q in range(p):
                        m[q][i].mul_(BETA1).add_(g[q, sl], alpha=1 - BETA1)
                    if p > 1:
                        out = compressed_allreduce([m[q][i] for q in range(p)], werr[i], serr[i], p)
                        for q in range(p):
                            m[q][i] = out[q]
                for q in range(p):
                    update = m[q][i] / (v[q][i].sqrt() + EPS)
                    update += WD * tensors[q][i]
                    tensors[q][i].add_(-LR * update)
        trace.append([[torch.cat(x).numpy() for x in (tensors[q], m[q], v[q])] for q in range(p)])
    return np.array(trace, dtype=np.float32)


def main():
    mode, d, p = sys.argv[1], sys.argv[2], int(sys.argv[3])
    total = sum(SEGMENTS)
    if mode == "gen":
        steps, freeze = int(sys.argv[4]), int(sys.argv[5])
        rng = np.random.default_rng(5)
        mags = np.concatenate([np.full(n, 10.0 ** rng.uniform(-3, 0)) for n in SEGMENTS])
        drift = rng.standard_normal(total)
        grads = np.stack([[(drift + rng.standard_normal(total)) * mags for _ in range(p)] for _ in range(steps)])
        grads.astype(np.float32).tofile(f"{d}/grads.f32")
        (0.02 * rng.standard_normal(total)).astype(np.float32).tofile(f"{d}/params.f32")
        with open(f"{d}/segments.txt", "w") as f:
            f.write(" ".join(map(str, SEGMENTS)) + "\n")
        with open(f"{d}/settings.txt", "w") as f:
            f.write(f"{LR} {BETA1} {BETA2} {EPS} {WD} {freeze}\n")
        return
    freeze = int(open(f"{d}/settings.txt").read().split()[5])
    grads = np.fromfile(f"{d}/grads.f32", np.float32)
    steps = grads.size // (p * total)
    params = np.fromfile(f"{d}/params.f32", np.float32)
    want = onebit_adam(params, grads.reshape(steps, p, total), p, freeze)
    worst, bad = 0.0, []
    for r in range(p):
        got = np.fromfile(f"{d}/trace_{r}.f32", np.float32).reshape(steps, 3, total)
        for t in range(steps):
            for k, name in enumerate(("parameters", "exp_avg", "exp_avg_sq")):
                a, b = got[t, k], want[t, r, k]
                err = float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30))
                worst = max(worst, err)
                if err > 1e-5:
                    bad.append(f"rank {r} step {t + 1} {name}: max |ours - oracle| / max |oracle| = {err:.2e}")
    # The compression phase must have changed something: ranks' momenta agree, parameters moved.
    moved = float(np.abs(want[-1, 0, 0] - params).max())
    print(f"{p} ranks, {steps} steps, freeze_step {freeze}: worst relative difference {worst:.2e}, "
          f"{len(bad)} mismatches; parameters moved up to {moved:.3g}")
    for b in bad[:10]:
        print(b)
    sys.exit(1 if bad or moved == 0.0 else 0)


if __name__ == "__main__":
    main()
