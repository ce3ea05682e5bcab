"""tests/gpu/e2e_check.py: the comparisons of tests/gpu/e2e.sh, over each run's LOG/metrics.jsonl (one
record per iteration: log_interval 1) and its checkpoint exported by `neox-convert to-hf` (hf/).

  close TOL NORM_TOL REF RUN [params]
                               losses (train per step, validation, test) within TOL relative and
                               gradient norms within NORM_TOL; with `params`, the final parameters
                               within TOL (relative L2 difference over all tensors). Prints the
                               largest differences.
  identical A B FIRST LAST [params]
                               every training and evaluation value of iterations FIRST..LAST bit for
                               bit; with `params`, also the final parameters byte for byte

Needs numpy and safetensors (the oracle .venv here; a GPU host's python3 usually has both).
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file

COMPARED = ("train/lm_loss", "train/grad_norm", "validation/lm_loss", "test/lm_loss")
# Everything a run computes (not its clock): what a bit-exact resume must reproduce.
EXACT_PREFIXES = ("train/", "validation/", "test/")


def records(run):
    table = {}
    for line in open(f"{run}/log/metrics.jsonl"):
        r = json.loads(line)
        for k, v in r.items():
            if k.startswith(EXACT_PREFIXES):
                table[(r["iteration"], k)] = v
    return table


def params(run):
    return load_file(f"{run}/hf/model.safetensors")


def rel(a, b):
    return abs(a - b) / max(abs(a), 1e-30)


def close(tol, norm_tol, ref, run, with_params=""):
    tol, norm_tol = float(tol), float(norm_tol)
    a, b = records(ref), records(run)
    keys = sorted(k for k in a if k[1] in COMPARED)
    missing = [k for k in keys if k not in b or b[k] is None or a[k] is None]
    if missing or not keys:
        print(f"records missing or not finite in {run}: {missing[:5]}")
        return False
    worst = {}
    for k in keys:
        worst.setdefault(k[1], (0.0, None))
        d = rel(a[k], b[k])
        if d > worst[k[1]][0]:
            worst[k[1]] = (d, k[0])
    for name, (d, it) in worst.items():
        print(f"# max relative difference {name}: {d:.3e}" + (f" (iteration {it})" if it else ""))
    ok = all(d <= (norm_tol if name == "train/grad_norm" else tol) for name, (d, _) in worst.items())
    if with_params:
        pa, pb = params(ref), params(run)
        if pa.keys() != pb.keys():
            print("different tensors:", sorted(set(pa) ^ set(pb))[:5])
            return False
        diff = sum(float(np.sum((pa[k].astype(np.float64) - pb[k]) ** 2)) for k in pa)
        norm = sum(float(np.sum(pa[k].astype(np.float64) ** 2)) for k in pa)
        d = (diff / norm) ** 0.5
        print(f"# max relative difference parameters (L2 over {len(pa)} tensors): {d:.3e}")
        ok = ok and d <= tol
    return ok


def identical(a, b, first, last, with_params=""):
    lo, hi = int(first), int(last)
    ra, rb = records(a), records(b)
    sa = {k: v for k, v in ra.items() if lo <= k[0] <= hi}
    sb = {k: v for k, v in rb.items() if lo <= k[0] <= hi}
    differ = [(k, sa[k], sb.get(k)) for k in sorted(sa) if sb.get(k) != sa[k] or k not in sb]
    extra = sorted(set(sb) - set(sa))
    print(f"# {len(sa)} values of iterations {lo}..{hi}: {len(differ)} differ {differ[:3]}, {len(extra)} extra")
    if not with_params:
        return bool(sa) and not differ and not extra
    pa, pb = params(a), params(b)
    tensors = [k for k in pa if k not in pb or pa[k].tobytes() != pb[k].tobytes()]
    print(f"# {len(pa)} tensors, {len(tensors)} differ {tensors[:3]}")
    return bool(sa) and not differ and not extra and pa.keys() == pb.keys() and not tensors


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    try:
        ok = {"close": close, "identical": identical}[cmd](*args)
    except OSError as e:  # a run that failed earlier (its own TAP line says why) left no output
        print(f"# cannot compare: {e}")
        ok = False
    sys.exit(0 if ok else 1)
