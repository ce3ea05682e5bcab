"""tests/mpi/fp8_layouts_check.py: the checks of tests/mpi/fp8_layouts.sh on the FP8 scaling state
(the run state's "fp8" key: docs/model.md, "FP8 training") of two checkpoints.

  scales REF RUN STEP TOL [NEWEST_TOL]
                               the scales and amax histories of RUN's checkpoint at STEP against REF's
                               (the run state's numbers). TOL 0: bit for
                               bit; otherwise every value within TOL relative. With NEWEST_TOL the
                               history's last row (the amaxes of STEP's own pass) and the scales made
                               from it are held to it instead, the older rows (carried from the steps
                               before) to TOL
  same_losses REF RUN TOL      RUN's training losses equal REF's at the same iterations within TOL
                               relative (RUN may be a resumed run, logging from its first step on)

A run state is rank 0's state/train.json, a JSON document inside the checkpoint's HDF5 file, found by
decoding the file's bytes (no HDF5 reader is needed for one text dataset).
"""
import json
import sys

import numpy as np


def run_state(ckpt, step):
    data = open(f"{ckpt}/global_step{step}/rank_00000.h5", "rb").read().decode("latin-1")
    at = data.index('"fp8"')
    for start in (i for i in range(at, -1, -1) if data[i] == "{"):
        try:
            doc, _ = json.JSONDecoder().raw_decode(data, start)
        except ValueError:
            continue
        if "fp8" in doc and "iteration" in doc:
            return doc
    raise SystemExit(f"{ckpt}: no run state with an fp8 key at step {step}")


def arrays(fp8):
    """(history (len, tensors), scale (tensors)) as float32."""
    history = np.array(fp8["amax_history"], dtype=np.float32).reshape(fp8["amax_history_len"], fp8["tensors"])
    return history, np.array(fp8["scale"], dtype=np.float32)


def scales(ref, run, step, tol, newest_tol=None):
    a, b = run_state(ref, int(step))["fp8"], run_state(run, int(step))["fp8"]
    assert (a["tensors"], a["amax_history_len"]) == (b["tensors"], b["amax_history_len"]), (a, b)
    (ha, sa), (hb, sb) = arrays(a), arrays(b)
    groups = [("amax histories", ha, hb, tol)]
    if newest_tol is not None:  # (the update rolls the newest amaxes into the last row)
        groups = [("carried amax history rows", ha[:-1], hb[:-1], tol), ("newest amaxes", ha[-1], hb[-1], newest_tol)]
    ok = True
    # (the scales come from the newest amaxes too)
    for what, x, y, tol in groups + [("scales", sa, sb, tol if newest_tol is None else newest_tol)]:
        tol = float(tol)
        same_bits = int(np.sum(x.view(np.uint32) == y.view(np.uint32)))
        rel = float(np.max(np.abs(x.astype(np.float64) - y) / np.maximum(np.abs(x), 1e-30)))
        print(f"{what}: {same_bits} of {x.size} bit for bit, largest relative difference {rel:.2e}")
        for j in np.flatnonzero((x != y).reshape(-1))[:8]:
            print(f"  {what} [{j}]: {x.reshape(-1)[j]!r} vs {y.reshape(-1)[j]!r}")
        ok &= same_bits == x.size if tol == 0 else rel <= tol
    assert len(set(sa.tolist())) > 3, "the scales never moved"
    return ok


def same_losses(ref, run, tol):
    def losses(p):
        return {r["iteration"]: r["train/lm_loss"] for r in map(json.loads, open(f"{p}/log/metrics.jsonl"))
                if "train/lm_loss" in r}
    a, b = losses(ref), losses(run)
    if not b or not b.keys() <= a.keys():
        print(f"iterations {sorted(b)} are not among the reference's {sorted(a)}")
        return False
    worst = max(abs(a[i] - b[i]) / abs(a[i]) for i in b)
    last = max(b)
    print(f"{len(b)} losses, largest relative difference {worst:.2e}; last {a[last]:.6f} vs {b[last]:.6f}")
    return worst <= float(tol)


if __name__ == "__main__":
    sys.exit(0 if {"scales": scales, "same_losses": same_losses}[sys.argv[1]](*sys.argv[2:]) else 1)
