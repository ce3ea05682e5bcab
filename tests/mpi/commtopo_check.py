"""tests/mpi/commtopo_check.py: the volume checks of tests/mpi/commtopo.sh (comm_stats.json of a 4-
and a 6-step run; per step = the difference / 2).

  sparse CONFIG DENSE4 DENSE6 RUN4 RUN6 TOKENS
                                   sparse_gradients: the data group all-reduces 4 V C bytes per step less
                                   than the dense run (the input embedding) and all-gathers
                                   4 p + k (4 + 4 C) bytes per step, k the rows the ranks touched,
                                   1 <= k <= p min(V, TOKENS) with TOKENS the tokens per rank per step
  hier CONFIG RUN4 RUN6 NODES      hierarchical all-reduce: per step every rank reduces and broadcasts
                                   4n bytes within its node, the node leaders all-reduce 4n across
                                   nodes (sending 2 (N-1)/N x 4n), and the flat data group carries only
                                   the 8-byte reductions
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from layouts_check import param_count  # noqa: E402


def steps(run4, run6, groups):
    r4, r6 = (json.load(open(f"{r}/log/comm_stats.json")) for r in (run4, run6))
    out = []
    for a, b in zip(r4["ranks"], r6["ranks"]):
        d = {}
        for g in groups:
            for op in set(a["groups"].get(g, {})) | set(b["groups"].get(g, {})):
                for field in ("bytes", "sent"):
                    v = (b["groups"][g].get(op, {}).get(field, 0) - a["groups"][g].get(op, {}).get(field, 0)) / 2
                    if v:
                        d[(g, op, field)] = v
        out.append((b["rank"], d))
    return out


def sparse(config, dense4, dense6, run4, run6, tokens):
    c = json.load(open(config))
    C, V = c["hidden_size"], c["vocab_size"]
    ok = True
    for (rank, d), (_, dd) in zip(steps(run4, run6, ("data",)), steps(dense4, dense6, ("data",))):
        p = 2
        gathered = d.get(("data", "all_gather", "bytes"), 0) - 4 * p
        k = gathered / (4 + 4 * C)
        dense = dd.get(("data", "all_reduce", "bytes"))
        print(f"rank {rank}: all_reduce {d.get(('data', 'all_reduce', 'bytes'))} (dense run {dense}, embedding "
              f"{4 * V * C}), all_gather {gathered + 4 * p} = {k} rows; sent {d.get(('data', 'all_gather', 'sent'))} "
              f"vs the embedding's all-reduce {2 * (p - 1) / p * 4 * V * C}")
        ok &= d.get(("data", "all_reduce", "bytes")) == dense - 4 * V * C
        ok &= k == int(k) and 1 <= k <= p * min(V, int(tokens))
    return ok


def hier(config, run4, run6, nodes):
    c = json.load(open(config))
    n, N = param_count(c), int(nodes)
    ok = True
    for rank, d in steps(run4, run6, ("data", "data_intra", "data_inter")):
        leader = ("data_inter", "all_reduce", "bytes") in d
        want = {("data", "all_reduce", "bytes"): 8, ("data_intra", "reduce", "bytes"): 4 * n,
                ("data_intra", "broadcast", "bytes"): 4 * n}
        if leader:
            want[("data_inter", "all_reduce", "bytes")] = 4 * n
            want[("data_inter", "all_reduce", "sent")] = 2 * (N - 1) / N * 4 * n
        got = {k: v for k, v in d.items() if k in want}
        print(f"rank {rank} ({'leader' if leader else 'member'}): {got}")
        ok &= all(abs(got.get(k, 0) - v) <= 1 for k, v in want.items())
    leaders = sum(1 for _, d in steps(run4, run6, ("data_inter",)) if d)
    print(f"{leaders} leaders, {N} nodes expected")
    return ok and leaders == N


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit(0 if {"sparse": sparse, "hier": hier}[cmd](*args) else 1)
