"""tests/mpi/layouts_check.py: the checks of tests/mpi/layouts.sh.

  same REF RUN [TOL [PTOL]]    RUN's losses and evaluations equal REF's within TOL, its exported
                               parameters within PTOL (default TOL) relative L2
                               (default 1e-5)
  same_steps REF RUN TOL       RUN's gradient norms and losses equal REF's at every step within TOL
                               relative
  identical A B                A's losses, evaluations and exported parameters equal B's bit for bit
  resumed STRAIGHT A B         A (steps 1..10) then B (11..20) equal the straight run within 1e-5
  segments STRAIGHT RUN...      each RUN's losses and evaluations (a run resumed from the one before)
                               equal the straight run's at the same iterations within 1e-5
  same_params REF.h5 RUN.h5    the params/ datasets of two one-shard checkpoints (neox-convert
                               reshard --dp 1), read with HDF5's h5dump: relative L2 difference <= 1e-5
  same_group GROUP REF.h5 RUN.h5
                               the GROUP/ datasets (optimizer/sm3_cols, say) of two shards that each hold
                               them whole: every tensor's relative L2 difference <= 1e-5
  volume NAME CONFIG MICRO ACCUM RUN4 RUN6
                               bytes per step of each group (RUN6 - RUN4) / 2 equal the count below,
                               and the gradient reductions per step the layout's

The expected volumes are written out from the model's sizes (config.json of the HF export).
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file

TOL = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[1] == "same" else 1e-5
KEYS = ("train/lm_loss", "validation/lm_loss", "test/lm_loss")


def metrics(run):
    table = {}
    for line in open(f"{run}/log/metrics.jsonl"):
        r = json.loads(line)
        for k in KEYS:
            if k in r:
                table[(r["iteration"], k)] = r[k]
    return table


def compare(a, b, keys):
    bad = [(k, a[k], b[k]) for k in keys if abs(a[k] - b[k]) > TOL * abs(a[k])]
    print(f"{len(keys)} values compared, {len(bad)} differ: {bad[:5]}")
    return not bad and keys


def same(ref, run, tol=None, param_tol=None):
    del tol  # read into TOL at start-up (compare uses it too)
    a, b = metrics(ref), metrics(run)
    if a.keys() != b.keys():
        print("different records:", sorted(set(a) ^ set(b))[:10])
        return False
    ok = compare(a, b, sorted(a))
    pa, pb = load_file(f"{ref}/hf/model.safetensors"), load_file(f"{run}/hf/model.safetensors")
    # Relative L2 difference over all parameters. (Per tensor, the biases reach 2-3e-5: they start
    # at zero, and Adam turns reordering noise in their near-zero gradients into steps of size lr.)
    diff = sum(float(np.sum((pa[k].astype(np.float64) - pb[k]) ** 2)) for k in pa)
    norm = sum(float(np.sum(pa[k].astype(np.float64) ** 2)) for k in pa)
    worst_name = max(pa, key=lambda k: np.linalg.norm(pa[k] - pb[k]) / max(np.linalg.norm(pa[k]), 1e-30))
    worst = (diff / norm) ** 0.5
    print(f"{len(pa)} tensors, relative L2 difference {worst:.2e} (worst tensor {worst_name})")
    return bool(ok) and pa.keys() == pb.keys() and worst <= (float(param_tol) if param_tol else TOL)


def same_losses(ref, run):
    """Losses and evaluations within 1e-5, for models no Hugging Face class holds (ALiBi): every
    step's loss depends on every parameter the steps before it updated."""
    a, b = metrics(ref), metrics(run)
    return a.keys() == b.keys() and bool(compare(a, b, sorted(a)))


def same_steps(ref, run, tol):
    """Every step's gradient norm (before clipping) and loss within tol relative: for the first steps
    of a layout whose gradients must be one rank's values but for the fp32 sums' order."""
    def steps(p):
        records = map(json.loads, open(f"{p}/log/metrics.jsonl"))
        return {r["iteration"]: (r["train/grad_norm"], r["train/lm_loss"]) for r in records if "train/lm_loss" in r}
    a, b = steps(ref), steps(run)
    if a.keys() != b.keys() or not a:
        print(f"iterations {sorted(b)} against {sorted(a)}")
        return False
    worst = [max(abs(a[i][k] - b[i][k]) / abs(a[i][k]) for i in a) for k in (0, 1)]
    print(f"{len(a)} steps, largest relative difference: gradient norm {worst[0]:.2e}, loss {worst[1]:.2e}")
    return max(worst) <= float(tol)


def identical(a, b):
    """Bit for bit the same losses, evaluations and final parameters (the overlapped reduction
    must reduce exactly as the one after backward does)."""
    ma, mb = metrics(a), metrics(b)
    pa, pb = load_file(f"{a}/hf/model.safetensors"), load_file(f"{b}/hf/model.safetensors")
    differ = [k for k in pa if k not in pb or pa[k].tobytes() != pb[k].tobytes()]
    print(f"{len(ma)} values, {len(pa)} tensors; metrics {'equal' if ma == mb else 'differ'}, tensors differing: {differ[:5]}")
    return bool(ma) and ma == mb and pa.keys() == pb.keys() and not differ


def resumed(straight, first, second):
    s, a, b = metrics(straight), metrics(first), metrics(second)
    keys_a = [k for k in s if k[0] <= 10 and k[1] == "train/lm_loss"]
    keys_b = [k for k in s if k[0] > 10]
    missing = [k for k in keys_a if k not in a] + [k for k in keys_b if k not in b]
    if missing or not keys_a or not keys_b:
        print("missing records:", missing[:10])
        return False
    return bool(compare(s, a, keys_a)) and bool(compare(s, b, keys_b))


def segments(straight, *runs):
    s = metrics(straight)
    ok = True
    for run in runs:
        r = metrics(run)
        missing = [k for k in r if k not in s]
        if not r or missing:
            print(f"{run}: no records, or records the straight run lacks: {missing[:5]}")
            return False
        ok = bool(compare(s, r, sorted(r))) and ok
    return ok


def h5_params(path, group="params"):
    """name -> float32 array of every GROUP/ dataset of one shard, through HDF5's own tools."""
    import os
    import subprocess
    import tempfile
    out = {}
    listing = subprocess.run(["h5ls", "-r", path], capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        for line in listing.splitlines():
            name = line.split()[0]
            if not name.startswith(f"/{group}/") or "Dataset" not in line:
                continue
            raw = os.path.join(tmp, "x.bin")
            subprocess.run(["h5dump", "-b", "LE", "-d", name, "-o", raw, path], capture_output=True, check=True)
            out[name] = np.fromfile(raw, dtype="<f4")
    return out


def same_params(ref, run):
    pa, pb = h5_params(ref), h5_params(run)
    if not pa or pa.keys() != pb.keys() or any(pa[k].size != pb[k].size for k in pa):
        print("different tensors:", sorted(set(pa) ^ set(pb))[:5])
        return False
    diff = sum(float(np.sum((pa[k].astype(np.float64) - pb[k]) ** 2)) for k in pa)
    norm = sum(float(np.sum(pa[k].astype(np.float64) ** 2)) for k in pa)
    worst = (diff / norm) ** 0.5
    print(f"{len(pa)} tensors, relative L2 difference {worst:.2e}")
    return worst <= TOL


def same_group(group, ref, run):
    pa, pb = h5_params(ref, group), h5_params(run, group)
    if not pa or pa.keys() != pb.keys() or any(pa[k].size != pb[k].size for k in pa):
        print("different tensors:", sorted(set(pa) ^ set(pb))[:5])
        return False
    errors = {k: float(np.linalg.norm(pa[k].astype(np.float64) - pb[k]) / max(np.linalg.norm(pa[k]), 1e-30)) for k in pa}
    worst = max(errors, key=errors.get)
    print(f"{len(pa)} tensors, largest relative L2 difference {errors[worst]:.2e} ({worst})")
    return errors[worst] <= TOL


# The groups whose per-step bytes the volume checks compare (comm_stats.json's names).
GROUPS = ("data", "model", "pipe", "embed", "context")


def per_step(run4, run6):
    r4, r6 = (json.load(open(f"{r}/log/comm_stats.json")) for r in (run4, run6))
    out = []
    for a, b in zip(r4["ranks"], r6["ranks"]):
        groups = {}
        for g in GROUPS:
            ops = set(a["groups"][g]) | set(b["groups"][g])
            groups[g] = {op: (b["groups"][g].get(op, {}).get("bytes", 0) - a["groups"][g].get(op, {}).get("bytes", 0)) / 2
                         for op in ops}
            groups[g] = {op: v for op, v in groups[g].items() if v}
        out.append((b, groups))
    return out


def param_count(c):
    C, L, V, F = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    layer = 4 * C + 3 * C * C + 3 * C + C * C + C + F * C + F + C * F + C
    return V * C + L * layer + 2 * C + (0 if c.get("tie_word_embeddings", True) else V * C)


def expected(name, c, micro, accum):
    C, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    N, M, n = micro * 32, accum, param_count(c)
    if name == "dp2":
        return {"data": {"all_reduce": 4 * n + 8}}
    if name == "dp2z1":
        return {"data": {"reduce_scatter": 4 * n, "all_gather": 4 * n, "all_reduce": 16}}
    if name == "dp2z2":  # reduce-scatter after every micro-batch
        return {"data": {"reduce_scatter": M * 4 * n, "all_gather": 4 * n, "all_reduce": 16}}
    if name == "tp2":
        forward = 4 * N * C * (1 + 2 * L) + 4 * N + 16 * N  # embedding, 2 row-parallel per layer, CE max + stats
        backward = 8 * N * C * L + 4 * N * C               # one (2, N, C) reduction per layer, the output layer
        return {"model": {"all_reduce": M * (forward + backward) + 8}}
    if name == "tp2sp":  # the neox model (parallel residual, LayerNorm with biases) under sequence_parallel
        # all-gathers: forward each layer's two norm outputs and the final norm's, backward each layer's two
        # branch output gradients and two norm outputs again, and the embedding's input gradient
        gather = 4 * N * C * ((2 * L + 1) + (4 * L + 1))
        # reduce-scatters: the embedding, the two row-parallel outputs per layer; backward the output
        # layer's and each layer's two column-parallel input gradients
        scatter = 4 * N * C * ((1 + 2 * L) + (1 + 2 * L))
        # all-reduces: CE max + stats, the norms' weight and bias gradients (2 per layer, the final one)
        reduce = 4 * N + 16 * N + 8 * C * (2 * L + 1)
        return {"model": {"all_gather": M * gather, "reduce_scatter": M * scatter, "all_reduce": M * reduce + 8}}
    if name == "cp2":  # context parallelism: per layer and micro-batch the forward all-gathers k and v (each
        # the whole sequences' N x NKV HS floats), backward gathers them again and reduce-scatters their
        # gradients, and the loss's sum and count (two doubles) are summed once per micro-batch; the data
        # group reduces the gradients as dp2's (the context ranks are data-parallel ways for them)
        kv = 4 * N * C * c.get("num_key_value_heads", c["num_attention_heads"]) // c["num_attention_heads"]
        return {"context": {"all_gather": M * L * 4 * kv, "reduce_scatter": M * L * 2 * kv, "all_reduce": 16 * M},
                "data": expected("dp2", c, micro, accum)["data"]}
    if name == "pp2":
        return {"pipe": {"send": 4 * N * C * M, "recv": 4 * N * C * M, "broadcast": 8, "all_reduce": 8},
                "embed": {"all_reduce": 4 * V * C}}
    raise SystemExit(f"no expectation for {name}")


def volume(name, config, micro, accum, run4, run6):
    c = json.load(open(config))
    ok = True
    for info, got in per_step(run4, run6):
        want = expected(name, c, int(micro), int(accum))
        for g in GROUPS:
            if got[g] != want.get(g, {}):
                print(f"rank {info['rank']} group {g}: got {got[g]}, expected {want.get(g, {})}")
                ok = False
    print("per-step volumes match" if ok else "per-step volumes differ")
    return reductions(name, int(accum), run4, run6) and ok


def reductions(name, accum, run4, run6):
    """The gradient reducer's timing record: one reduction per step (per micro-batch under ZeRO-2),
    only with data parallelism; the group's exposed time is the least of its ranks' finish times (0
    when a rank found every bucket landed during backward, as ZeRO-2's one bucket in flight allows)."""
    want = {"dp2": 1, "dp2z1": 1, "dp2z2": accum}.get(name, 0)
    r4, r6 = (json.load(open(f"{r}/log/comm_stats.json")) for r in (run4, run6))
    ok = True
    for a, b in zip(r4["ranks"], r6["ranks"]):
        ga, gb = a.get("gradient_reduction"), b.get("gradient_reduction")
        got = (gb["reductions"] - ga["reductions"]) / 2 if ga and gb else 0
        if got != want or bool(ga) != bool(want) or bool(gb) != bool(want):
            print(f"rank {b['rank']}: {got} reductions per step, expected {want}")
            ok = False
        if not gb:
            continue
        least = min(r["gradient_reduction"]["finish_seconds"] for r in r6["ranks"])
        positive = gb["exposed_seconds"] > 0 or (name == "dp2z2" and least == 0)
        if not (positive and gb["exposed_seconds"] <= least + 1e-6 and gb["exposed_seconds"] <= gb["exposed_with_progress_seconds"]):
            print(f"rank {b['rank']}: inconsistent gradient_reduction {gb}")
            ok = False
    print("gradient reductions per step match" if ok else "gradient reductions per step differ")
    return ok


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit(0 if {"same": same, "same_losses": same_losses, "identical": identical, "resumed": resumed, "volume": volume,
                     "segments": segments, "same_params": same_params, "same_group": same_group,
                     "same_steps": same_steps}[cmd](*args) else 1)
