#!/usr/bin/env python3
"""Checks of a profiled run's outputs (tests/tools/profile.sh, tests/mpi/profile.sh), restated from
the Chrome trace-event format and the model's shape, not from neox.c's code:

  trace DIR RANKS START STOP ACCUM LAYERS  each log_dir/trace_rankN.json parses as trace-event JSON;
      every complete event has ts and dur >= 0 and pid = its rank; on each track the events nest
      (each lies inside the one it starts in); there are STOP - START step ranges, named for
      iterations START+1..STOP; each step holds ACCUM micro-batch forwards and backwards and an
      optimizer range, and each forward holds one range per layer of LAYERS ("0-1": layers 0 and 1).
  collectives DIR RANKS GROUP  the collectives on GROUP (op, bytes, in time order) are the same on
      every rank, and there are some.
  memory SNAPDIR LOGDIR RANKS ITERS PARAMS  each rank's memory_snapshot_rankR_iterN.json for N in ITERS
      ("3,4") has the regions of log_dir/memory_plan.json's rank R exactly, its owners' bytes sum to
      them, the model's parameters are 4 x PARAMS bytes and Adam's moments 8 x PARAMS (PARAMS "-": a
      layout whose ranks hold parts, not checked), and the peak's owners are its largest owners.
"""
import json
import re
import sys

TOLERANCE_US = 2.0  # the writer rounds ts and dur to nanoseconds; start and end are read separately


def load_trace(path, rank):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    for e in complete:
        assert e["pid"] == rank, f"{path}: pid {e['pid']} in rank {rank}'s trace"
        assert e["ts"] >= 0 and e["dur"] >= 0, f"{path}: negative time in {e}"
    names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert names and names[0]["args"]["name"] == f"rank {rank}", f"{path}: no process name for rank {rank}"
    return complete


def check_nesting(path, events):
    by_track = {}
    for e in events:
        by_track.setdefault(e["tid"], []).append(e)
    for tid, track in by_track.items():
        track.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for e in track:
            end = e["ts"] + e["dur"]
            while open_ends and open_ends[-1][0] <= e["ts"] + TOLERANCE_US:
                open_ends.pop()
            if open_ends:
                assert end <= open_ends[-1][0] + TOLERANCE_US, \
                    f"{path}: track {tid}: {e['name']} at {e['ts']} overlaps the end of {open_ends[-1][1]}"
            open_ends.append((end, e["name"]))


def inside(outer, events, pattern):
    lo, hi = outer["ts"] - TOLERANCE_US, outer["ts"] + outer["dur"] + TOLERANCE_US
    return [e for e in events if re.fullmatch(pattern, e["name"]) and e["tid"] == outer["tid"]
            and e["ts"] >= lo and e["ts"] + e["dur"] <= hi]


def layer_range(text):
    first, last = (int(x) for x in text.split("-"))
    return list(range(first, last + 1))


def check_trace(directory, ranks, start, stop, accum, layers):
    for rank in range(int(ranks)):
        path = f"{directory}/trace_rank{rank}.json"
        events = load_trace(path, rank)
        check_nesting(path, events)
        steps = sorted((e for e in events if re.fullmatch(r"step \d+", e["name"])), key=lambda e: e["ts"])
        numbers = [int(e["name"].split()[1]) for e in steps]
        assert numbers == list(range(int(start) + 1, int(stop) + 1)), f"{path}: step ranges {numbers}"
        for step in steps:
            for kind in ("forward", "backward"):
                found = inside(step, events, rf"micro-batch \d+ {kind}")
                assert len(found) == int(accum), f"{path}: {step['name']}: {len(found)} micro-batch {kind}s"
            assert len(inside(step, events, "optimizer")) == 1, f"{path}: {step['name']}: no optimizer range"
            for forward in inside(step, events, r"micro-batch \d+ forward"):
                found = sorted(int(e["name"].split()[2]) for e in inside(forward, events, r"forward layer \d+"))
                assert found == layer_range(layers), f"{path}: {forward['name']}: layers {found}"
        print(f"rank {rank}: {len(events)} events, steps {numbers}")


def collectives(directory, rank, group):
    events = load_trace(f"{directory}/trace_rank{rank}.json", rank)
    calls = [e for e in events if e.get("cat") == "collective" and e["args"]["group"] == group]
    calls.sort(key=lambda e: e["ts"])
    return [(e["args"]["op"], e["args"].get("bytes")) for e in calls]


def check_collectives(directory, ranks, group):
    first = collectives(directory, 0, group)
    assert first, f"rank 0 has no collective on {group}"
    for rank in range(1, int(ranks)):
        other = collectives(directory, rank, group)
        assert other == first, f"{group}: rank {rank}'s collectives {other[:8]}... differ from rank 0's {first[:8]}..."
    print(f"{group}: {len(first)} collectives in the same order on {ranks} ranks")


def check_memory(snapdir, logdir, ranks, iters, params):
    with open(f"{logdir}/memory_plan.json") as f:
        plan = json.load(f)["ranks"]
    for rank in range(int(ranks)):
        for it in iters.split(","):
            path = f"{snapdir}/memory_snapshot_rank{rank}_iter{it}.json"
            with open(path) as f:
                snap = json.load(f)
            assert snap["iteration"] == int(it) and snap["rank"] == rank, path
            assert snap["regions"] == plan[rank], f"{path}: regions {snap['regions']} != plan {plan[rank]}"
            assert snap["planned_bytes"] == sum(plan[rank].values()), path
            sums = {}
            for o in snap["owners"]:
                sums[o["region"]] = sums.get(o["region"], 0) + o["bytes"]
                assert o["memory"] in ("host", "device"), path
            assert sums == {k: v for k, v in plan[rank].items() if v}, f"{path}: owners sum to {sums}"
            owned = {(o["owner"], o["region"]): o["bytes"] for o in snap["owners"]}
            if params != "-":
                assert owned[("model parameters", "parameters")] == 4 * int(params), f"{path}: {owned}"
                assert owned[("optimizer state", "optimizer")] == 8 * int(params), f"{path}: {owned}"
            peak = snap["peak"]
            largest = sorted((o["bytes"] for o in snap["owners"]), reverse=True)[:5]
            assert [o["bytes"] for o in peak["owners"]] == largest, f"{path}: peak owners {peak['owners']}"
            assert peak["planned_bytes"] == snap["planned_bytes"], path
            assert peak["unplanned_bytes"] == peak["measured_bytes"] - peak["planned_bytes"], path
    print(f"snapshots of {ranks} ranks at iterations {iters} match memory_plan.json")


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    {"trace": check_trace, "collectives": check_collectives, "memory": check_memory}[what](*args)
