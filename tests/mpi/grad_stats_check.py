"""tests/mpi/grad_stats_check.py REF RUN TOL NOISE_TOL: the check of tests/mpi/grad_stats.sh. At every
iteration both runs logged, RUN's gradient_norms/NAME, pct_grad_zeros/NAME and optimizer_state_norms/NAME_STATE
(metrics.jsonl, log_interval 1) equal REF's within TOL relative (1e-9 absolute for values near 0), its
train/noise_scale within NOISE_TOL, and both runs logged the same tags: every tensor of the model, each once."""
import json
import sys

PREFIXES = ("gradient_norms/", "pct_grad_zeros/", "optimizer_state_norms/", "train/noise_scale")


def stats(run):
    out = {}
    for line in open(f"{run}/log/metrics.jsonl"):
        r = json.loads(line)
        if "train/lm_loss" in r:
            out[r["iteration"]] = {k: v for k, v in r.items() if k.startswith(PREFIXES)}
    return out


ref, run, tol, noise_tol = stats(sys.argv[1]), stats(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
assert sorted(ref) == sorted(run) and ref, (sorted(ref), sorted(run))
compared, worst, bad = 0, 0.0, []
for it in ref:
    assert sorted(ref[it]) == sorted(run[it]), (it, set(ref[it]) ^ set(run[it]))
    for tag, want in ref[it].items():
        got = run[it][tag]
        err = abs(got - want) / max(abs(want), 1e-300)
        worst = max(worst, err if abs(got - want) > 1e-9 else 0.0)
        if abs(got - want) > max((noise_tol if tag == "train/noise_scale" else tol) * abs(want), 1e-9):
            bad.append((it, tag, want, got))
        compared += 1
noise = [it for it in ref if "train/noise_scale" in ref[it]]
print(f"{compared} values over {len(ref)} iterations compared (noise scale at {noise}); "
      f"worst relative difference {worst:.2e}; {len(bad)} differ: {bad[:5]}")
assert not bad and noise and any(k.startswith("gradient_norms/") for k in ref[1])
