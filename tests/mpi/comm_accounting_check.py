"""tests/mpi/comm_accounting_check.py: the checks of tests/mpi/comm_accounting.sh.

  logged NAME CONFIG MICRO ACCUM RUN   every metrics.jsonl record's per-iteration bytes of each group
                                       and operation equal the analytical per-step volume of the layout
                                       (layouts_check.expected), and comm/bytes is their total
                                       (NAME may also be dp2bf16: dp2 with bf16 gradients on the wire;
                                       dp2z1ar: ZeRO-1 with reduce_scatter false, which all-reduces;
                                       cp2: context parallelism's all-gathers and reduce-scatters)
  gather_calls CONFIG RUN BUCKET       every record has ceil(n / BUCKET) parameter all-gathers of 4n
                                       bytes in all per step (allgather_bucket_size)
  losses A B TOL                       A's and B's logged losses agree within TOL relative
  summary RUN [OPS]                    log_dir/comms_summary.txt (comms_logger) per rank, group and
                                       operation: counts, bytes (count x message size) and total latency
                                       equal comm_stats.json's; with OPS (comma-separated) only those
                                       operations appear
"""
import json
import re
import sys

from layouts_check import GROUPS, expected, metrics, param_count

UNITS = {"B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3}


def volume(name, c, micro, accum):
    """The analytical per-step bytes, with the variants the communication options make."""
    if name == "dp2bf16":  # the gradient in 2 bytes; the loss and gradient norm (8 bytes) stay fp32
        return {"data": {"all_reduce": (expected("dp2", c, micro, accum)["data"]["all_reduce"] - 8) // 2 + 8}}
    if name == "dp2z1ar":  # reduce_scatter false: the gradient is all-reduced, then the partition kept
        z1 = expected("dp2z1", c, micro, accum)["data"]
        return {"data": {"all_reduce": z1["reduce_scatter"] + z1["all_reduce"], "all_gather": z1["all_gather"]}}
    return expected(name, c, micro, accum)


def gather_calls(config, run, bucket):
    n = param_count(json.load(open(config)))
    want = (-(-n // int(bucket)), 4 * n)
    ok = True
    for r in (json.loads(line) for line in open(f"{run}/log/metrics.jsonl") if '"comm/bytes"' in line):
        got = (r.get("comm/data/all_gather/calls"), r.get("comm/data/all_gather/bytes"))
        if got != want:
            print(f"iteration {r['iteration']}: all-gather calls and bytes {got}, expected {want}")
            ok = False
    print(f"parameter all-gather per step: {want[0]} calls, {want[1]} bytes: {'as expected' if ok else 'differs'}")
    return ok


def losses(a, b, tol):
    la, lb = ({k: v for k, v in metrics(r).items() if k[1] == "train/lm_loss"} for r in (a, b))
    worst = max(abs(la[k] - lb[k]) / abs(la[k]) for k in la)
    print(f"{len(la)} losses, largest relative difference {worst:.3g} (tolerance {tol})")
    return bool(la) and la.keys() == lb.keys() and worst <= float(tol)


def logged(name, config, micro, accum, run):
    want = volume(name, json.load(open(config)), int(micro), int(accum))
    records = [json.loads(line) for line in open(f"{run}/log/metrics.jsonl") if '"comm/bytes"' in line]
    ok = bool(records)
    for r in records:
        got = {}
        for key, value in r.items():
            parts = key.split("/")
            if len(parts) == 4 and parts[0] == "comm" and parts[3] == "bytes" and parts[1] in GROUPS:
                got.setdefault(parts[1], {})[parts[2]] = value
        if got != want:
            print(f"iteration {r['iteration']}: logged {got}, expected {want}")
            ok = False
        total = sum(v for k, v in r.items() if k.startswith("comm/") and k.endswith("/bytes") and k.count("/") == 3)
        if total != r["comm/bytes"]:
            print(f"iteration {r['iteration']}: comm/bytes {r['comm/bytes']} is not the sum {total}")
            ok = False
    print(f"{len(records)} records: logged per-step bytes {'match' if ok else 'differ from'} the analytical volume")
    return ok


def unit(size):
    """The power of 1024 a size is printed in (DeepSpeed's convert_size)."""
    u = 1
    while size >= u * 1024:
        u *= 1024
    return u


def parse_summary(path):
    """{rank: {"group/op": [(bytes or None, count, total ms)]}} from the summary's table."""
    ranks, rank, op = {}, None, None
    for line in open(path):
        if m := re.match(r"rank (\d+)$", line.strip()):
            rank = ranks.setdefault(int(m.group(1)), {})
        elif re.match(r"\w+/\w+$", line.strip()):
            op = rank.setdefault(line.strip(), [])
        elif line.startswith(" ") and op is not None:
            m = re.match(r"\s+(other sizes|0B|[\d.]+ \w+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
            size = None if m.group(1) == "other sizes" else 0.0 if m.group(1) == "0B" else \
                float(m.group(1).split()[0]) * UNITS[m.group(1).split()[1]]
            op.append((size, int(m.group(2)), float(m.group(3))))
    return ranks


def summary(run, ops=""):
    stats = json.load(open(f"{run}/log/comm_stats.json"))
    table = parse_summary(f"{run}/log/comms_summary.txt")
    only = set(ops.split(",")) if ops else None
    ok = len(table) == len(stats["ranks"])
    for r in stats["ranks"]:
        want = {f"{g}/{op}": s for g, group in r["groups"].items() for op, s in group.items()
                if only is None or op in only}
        got = table.get(r["rank"], {})
        if set(got) != set(want):
            print(f"rank {r['rank']}: summary has {sorted(got)}, comm_stats.json {sorted(want)}")
            ok = False
            continue
        for key, rows in got.items():
            s = want[key]
            count = sum(c for _, c, _ in rows)
            # Sizes are printed with two decimals of their unit, latencies with three of a millisecond.
            size = sum(b * c for b, c, _ in rows if b is not None)
            slack = sum(c * 0.005 * unit(b) for b, c, _ in rows if b is not None and b >= 1024)
            ms = sum(t for _, _, t in rows)
            if count != s["calls"] or abs(size - s["bytes"]) > slack or abs(ms - s["seconds"] * 1e3) > 0.0005 * len(rows) + 1e-9:
                print(f"rank {r['rank']} {key}: summary {count} calls, {size} bytes, {ms} ms; comm_stats.json {s}")
                ok = False
    print("summary totals match comm_stats.json" if ok else "summary totals differ")
    return ok


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit(0 if {"logged": logged, "summary": summary, "gather_calls": gather_calls, "losses": losses}[cmd](*args) else 1)
