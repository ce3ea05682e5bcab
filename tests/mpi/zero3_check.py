"""tests/mpi/zero3_check.py: the checks of tests/mpi/zero3.sh, from the model exported to Hugging
Face (its tensors, grouped into the units ZeRO-3 gathers: the embedding, each layer, the final norm
and output layer) and the run's comm_stats.json.

  planned OUT HF D RULE      the parameter bytes every rank plans at start-up (OUT) are within 10%
                             of 4 * psi / D (its partition of the fp32 master weights) plus 4 bytes
                             per element held whole at most: RULE one (one unit at a time, the
                             final norm with the tied embedding it uses, when nothing is
                             prefetched or kept), or pieces:BUCKET (one unit at a time, the head's
                             final norm beside one piece of BUCKET // hidden rows of the untied
                             output layer or embedding, which are gathered by pieces, never whole)
  stat RUN KEY OP VALUE      every rank's parameter_gathers[KEY] OP VALUE (OP: eq, gt, le)
  same_stat RUN_A RUN_B KEY  every rank's parameter_gathers[KEY] is the same in both runs
  more_stat RUN_A RUN_B KEY  every rank's parameter_gathers[KEY] is larger in RUN_A
  norms RUN_A RUN_B          the per-step parameter norms (log_param_norm) of both runs agree within 1e-5
  bounded RUN_S3 RUN_S0 D [MAX_LIVE]
                             stage 3 never plans more parameter bytes than stage 0: every rank's
                             planned parameters (log/memory_plan.json, exact bytes) are at most
                             stage 0's; the elements it measured whole at once beside its partition
                             (comm_stats.json: peak_live_elements + persistent_elements) are at most
                             what its plan counts for them (planned parameters / 4 - its partition
                             of n * r / D to n * (r + 1) / D); the persistent tensors are at most
                             half the elements outside the partition; with MAX_LIVE,
                             peak_live_elements is at most MAX_LIVE
"""
import json
import re
import sys

from safetensors.numpy import load_file

UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def units(hf):
    """Elements of each unit in the order a training pass uses them: embedding, layers, head."""
    tensors = load_file(f"{hf}/model.safetensors")
    embed, head, layers = 0, 0, {}
    tied = not any("embed_out" in n or "lm_head" in n for n in tensors)
    for name, t in tensors.items():
        m = re.search(r"\.layers\.(\d+)\.", name)
        if m:
            layers[int(m.group(1))] = layers.get(int(m.group(1)), 0) + t.size
        elif "embed_in" in name or "embed_tokens" in name:
            embed += t.size
        else:
            head += t.size
    # tied weights: the output layer is the embedding, which the head then uses with the final norm
    head_use = head + embed if tied else head
    return embed, [layers[i] for i in sorted(layers)], head_use, sum(t.size for t in tensors.values())


def peak(hf, rule):
    embed, layers, head, _ = units(hf)
    if rule.startswith("pieces:"):  # untied embeddings gathered by pieces of BUCKET // hidden rows
        h = json.load(open(f"{hf}/config.json"))["hidden_size"]
        piece = int(rule[7:]) // h * h  # the head's final norm or the embedding unit's rest, beside one piece
        return max([head - embed + piece, piece] + layers)
    return max([embed, head] + layers)


def planned(out, hf, d, rule):
    psi = units(hf)[3]
    want = 4 * psi / d + 4 * peak(hf, rule)
    got = [float(v) * UNITS[u] for v, u in re.findall(r"parameters ([0-9.]+)([kMGT]?)B", open(out).read())]
    print(f"psi {psi}: formula {want:.0f} bytes; ranks report {got}")
    return bool(got) and all(abs(g - want) <= 0.1 * want for g in got)


def gathers(run):
    return [r.get("parameter_gathers", {}) for r in json.load(open(f"{run}/log/comm_stats.json"))["ranks"]]


def stat(run, key, op, value):
    got = [g.get(key, 0) for g in gathers(run)]
    print(f"{key}: {got}")
    test = {"eq": lambda v: v == int(value), "gt": lambda v: v > int(value), "le": lambda v: v <= int(value)}[op]
    return bool(got) and all(test(v) for v in got)


def same_stat(a, b, key):
    x, y = [g.get(key, 0) for g in gathers(a)], [g.get(key, 0) for g in gathers(b)]
    print(f"{key}: {x} and {y}")
    return x == y and bool(x)


def more_stat(a, b, key):
    x, y = [g.get(key, 0) for g in gathers(a)], [g.get(key, 0) for g in gathers(b)]
    print(f"{key}: {x} and {y}")
    return bool(x) and all(p > q for p, q in zip(x, y))


def norms(a, b):
    def table(run):
        out = {}
        for line in open(f"{run}/log/metrics.jsonl"):
            r = json.loads(line)
            out.update({(r["iteration"], k): v for k, v in r.items() if k.startswith("parameter_norms/") or k == "train/param_norm"})
        return out
    x, y = table(a), table(b)
    bad = [k for k in x if k not in y or abs(x[k] - y[k]) > 1e-5 * abs(x[k])]
    print(f"{len(x)} norms, {len(bad)} differ: {bad[:5]}")
    return bool(x) and x.keys() == y.keys() and not bad


def bounded(s3, s0, d, max_live=None):
    d = int(d)
    plan3, plan0 = (json.load(open(f"{run}/log/memory_plan.json"))["ranks"] for run in (s3, s0))
    n = plan0[0]["parameters"] // 4  # (stage 0: every rank holds the whole model)
    ok = len(plan3) == len(plan0) == d
    for r, (p3, p0, g) in enumerate(zip(plan3, plan0, gathers(s3))):
        partition = n * (r + 1) // d - n * r // d
        planned_whole = p3["parameters"] / 4 - partition
        measured = g.get("peak_live_elements", 0) + g.get("persistent_elements", 0)
        print(f"rank {r}: parameters planned {p3['parameters']} bytes (stage 0: {p0['parameters']}); whole beside the "
              f"partition: planned {planned_whole:.0f}, measured {measured} (live {g.get('peak_live_elements', 0)})")
        ok &= p3["parameters"] <= p0["parameters"] and measured <= planned_whole
        ok &= g.get("persistent_elements", 0) <= (n - partition) // 2
        ok &= max_live is None or g.get("peak_live_elements", 0) <= int(max_live)
    return ok


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "planned":
        ok = planned(args[0], args[1], int(args[2]), args[3])
    elif cmd == "stat":
        ok = stat(*args)
    elif cmd == "same_stat":
        ok = same_stat(*args)
    elif cmd == "more_stat":
        ok = more_stat(*args)
    elif cmd == "norms":
        ok = norms(*args)
    elif cmd == "bounded":
        ok = bounded(*args)
    else:
        ok = False
    sys.exit(0 if ok else 1)
