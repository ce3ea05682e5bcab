"""bench/memory_report.py: the arithmetic and tables of bench/memory.sh, from neox-train's start-up
"memory of rank N" lines (RUN.out) and each rank's peak resident set (RUN.rss.RANK, bytes, as
tests/mpi/peak_rss.py writes them).

  bytes SPEC                     SPEC (MemAvailable, or bytes with an optional k/M/G suffix) in bytes
  human N                        N bytes, readable
  ladder                         "layers hidden heads" of GPT-NeoX's size ladder, smallest first
  libraries_bytes DIR            the libraries' memory per rank (below)
  fits RUN BUDGET RANKS          whether the ranks' planned totals plus the libraries' memory fit BUDGET
  predict RUN VOCAB L H BUDGET RANKS
                                 whether a model of L layers, hidden H fits, by RUN's planned bytes per parameter
  stages DIR RANKS               part (a): $DIR/a-s{0,1,2,3}
  largest DIR BUDGET RANKS RUN...  part (b)
  steps DIR RUN...               part (c): median iteration time of each run, as ratios to the first

The libraries' memory per rank (MPI, OpenBLAS, the C library: not in the plan) is the peak of a run
of a tiny model that stops after start-up, less its plan ($DIR/libraries, as bench/memory.sh runs it).
"""
import glob
import json
import os
import re
import statistics
import sys

UNITS = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
REGIONS = ["parameters", "16-bit copies", "gradients", "optimizer", "activations", "communication", "offloaded"]
# GPT-NeoX's configs (configs/*.yml and configs/pythia/*.yml): layers, hidden size, heads, named by size.
LADDER = [(6, 128, 4, "pythia-14M"), (6, 256, 8, "pythia-31M"), (6, 512, 8, "19M / pythia-70M"),
          (10, 640, 10, "49M"), (12, 768, 12, "125M / pythia-160M"), (24, 1024, 16, "350M / pythia-410M"),
          (24, 1536, 16, "760M"), (16, 2048, 8, "800M / pythia-1B"), (24, 2048, 16, "1.3B / pythia-1.4B"),
          (32, 2560, 32, "2.7B / pythia-2.8B"), (32, 4096, 32, "6.7B / pythia-6.9B"), (40, 5120, 40, "13B"),
          (44, 6144, 64, "20B")]


def human(n):
    n = float(n)
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}B"
        n /= 1000
    return f"{n:.3g} TB"


def count(n):
    return f"{n / 1e6:.1f}M" if n < 1e9 else f"{n / 1e9:.2f}B"


def to_bytes(spec):
    if spec == "MemAvailable":
        kb = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemAvailable:"))
        return kb * 1024
    m = re.fullmatch(r"([0-9.]+)\s*([kKMGT]?)B?", spec)
    if not m:
        sys.exit(f"bench/memory.sh: budget '{spec}' is not MemAvailable or a size like 3G")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def psi_of(vocab, layers, hidden):
    """Parameters of a GPT-NeoX model (untied embedding and output layer, biases, two layernorms per
    layer and a final one): per layer QKV 3h^2 + 3h, dense h^2 + h, MLP 8h^2 + 5h, norms 4h."""
    return 2 * vocab * hidden + layers * (12 * hidden * hidden + 13 * hidden) + 2 * hidden


def ladder():
    """The configs' shapes and between each two the widths a multiple of 128 apart (layers
    interpolated, heads of 64 dimensions), ordered by parameters; none after a config with fewer
    layers than the one before (800M's 16 layers of 2048)."""
    shapes = []
    for (l0, h0, a0, _), (l1, h1, _, _) in zip(LADDER, LADDER[1:] + [LADDER[-1]]):
        shapes.append((l0, h0, a0))
        for h in range(h0 + 128, h1 if l1 >= l0 else h0, 128):
            layers = round(l0 + (l1 - l0) * (h - h0) / (h1 - h0))
            shapes.append((layers, h, max(4, h // 64)))
    return sorted(set(shapes), key=lambda s: psi_of(50304, s[0], s[1]))


def plan(run):
    """{rank: {region: bytes, total}} from the start-up lines."""
    ranks = {}
    for line in open(f"{run}.out"):
        m = re.search(r"memory of rank (\d+): ([0-9.]+)\s*([kKMGT]?)B = (.*)", line)
        if not m:
            continue
        parts = {n: float(v) * UNITS[u] for n, v, u in re.findall(r"([a-z0-9 -]+?) ([0-9.]+)\s*([kKMGT]?)B", m.group(4))}
        parts = {k.strip().lstrip("+ ").strip(): v for k, v in parts.items()}
        parts["total"] = float(m.group(2)) * UNITS[m.group(3)]
        ranks[int(m.group(1))] = parts
    return ranks


def measured(run):
    files = sorted(glob.glob(f"{run}.rss.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    return {int(f.rsplit(".", 1)[1]): int(open(f).read()) for f in files}


def model_line(run):
    m = next((re.search(r"model: (\S+) parameters, (\d+) layers, hidden (\d+)", l) for l in open(f"{run}.out")
              if "model:" in l), None)
    return m.group(1) if m else "?"


def libraries(directory):
    """The libraries' memory per rank: the most over the ranks of the tiny run's peak less its plan."""
    run, p = f"{directory}/libraries", plan(f"{directory}/libraries")
    return max(0, max(rss - p[r]["total"] for r, rss in measured(run).items()))


def fits(run, budget, ranks):
    p = plan(run)
    need = sum(p[r]["total"] for r in p) + int(ranks) * libraries(os.path.dirname(run))
    print(f"{os.path.basename(run)}: planned {human(sum(p[r]['total'] for r in p))} on {len(p)} ranks "
          f"+ libraries {human(libraries(os.path.dirname(run)))} per rank = {human(need)} of {human(float(budget))}")
    return need <= float(budget)


def predict(run, vocab, layers, hidden, budget, ranks):
    p = plan(run)
    m = re.search(r"-(\d+)x(\d+)-plan$", run)
    known = psi_of(int(vocab), int(m.group(1)), int(m.group(2)))
    scale = psi_of(int(vocab), int(layers), int(hidden)) / known
    need = sum(p[r]["total"] for r in p) * scale + int(ranks) * libraries(os.path.dirname(run))
    return need <= float(budget)


def stages(directory, ranks):
    d = int(ranks)
    runs = {s: f"{directory}/a-s{s}" for s in range(4)}
    plans = {s: plan(r) for s, r in runs.items()}
    peaks = {s: measured(r) for s, r in runs.items()}
    psi = plans[0][0]["parameters"] / 4
    half = plans[0][0]["16-bit copies"] / psi  # 2 in bf16/fp16, 0 in fp32
    model_states = ["parameters", "16-bit copies", "gradients", "optimizer"]
    print(f"model: {count(psi)} parameters ({model_line(runs[0])}); D = {d}; K = 12 (DeepSpeed's mixed-precision Adam)")
    print()
    print("| ZeRO stage | DeepSpeed (ZeRO paper) | bytes | neox.c closed form | bytes | planned model states (rank 0) "
          "| planned total (rank 0) | measured peak per rank | peak vs stage 0 |")
    print("|---|---|---|---|---|---|---|---|---|")
    paper = {0: ("(2 + 2 + K) Psi", 16), 1: ("2 Psi + 2 Psi + K Psi/D", 4 + 12 / d),
             2: ("2 Psi + (2 + K) Psi/D", 2 + 14 / d), 3: ("(2 + 2 + K) Psi/D", 16 / d)}
    hp = " + 2" if half else ""
    for s in range(4):
        p, rss = plans[s][0], peaks[s]
        states = sum(p[k] for k in model_states)
        extra = ""
        buckets = p["gradients"] - 4 * psi / d  # stages 2 and 3: the two buckets in flight, as planned
        if s == 0:
            form, closed = f"(4{hp} + 4 + 8) Psi", (16 + half) * psi
        elif s == 1:
            form, closed = f"(4{hp} + 4) Psi + 8 Psi/D", (8 + half) * psi + 8 * psi / d
        elif s == 2:
            form, closed = f"(4{hp}) Psi + 12 Psi/D + buckets", (4 + half) * psi + 12 * psi / d + buckets
            extra = f" (buckets {human(buckets)})"
        else:
            held = (p["parameters"] - 4 * psi / d) / 4  # elements held whole at most (units, persistent)
            form, closed = f"16 Psi/D + (4{hp}) W + buckets", 16 * psi / d + (4 + half) * held + buckets
            extra = f" (W = {count(held)} held whole, buckets {human(buckets)})"
        peak0 = max(peaks[0].values())
        print(f"| {s} | {paper[s][0]} | {human(paper[s][1] * psi)} | {form}{extra} | {human(closed)} | "
              f"{human(states)} ({states / psi:.2f} B/param) | {human(p['total'])} | "
              f"{', '.join(human(rss[r]) for r in sorted(rss))} | {max(rss.values()) / peak0:.2f}x |")
    print()
    m0 = [r["memory/peak_rss_bytes"] for r in map(json.loads, open(f"{directory}/a-s0/metrics.jsonl"))
          if "memory/peak_rss_bytes" in r][-1]
    print(f"rank 0's memory/peak_rss_bytes in metrics.jsonl at the last step of stage 0: {human(m0)} "
          f"(the wrapper measured {human(peaks[0][0])})")
    return True


def largest(directory, budget, ranks, *runs):
    print(f"| ZeRO stage | model (layers x hidden) | parameters | planned, all ranks | measured peak per rank "
          f"| measured, all ranks | budget |")
    print("|---|---|---|---|---|---|---|")
    sizes = {}
    for run in runs:
        path = f"{directory}/{run}"
        p, rss = plan(path), measured(path)
        layers, hidden = re.search(r"\"num_layers\": (\d+), \"hidden_size\": (\d+)", open(f"{path}.yml").read()).groups()
        vocab = int(re.search(r"\"pinned_padded_vocab_size\": (\d+)", open(f"{path}.yml").read()).group(1))
        psi = psi_of(vocab, int(layers), int(hidden))
        sizes[run] = psi
        print(f"| {run[3]} | {layers} x {hidden} | {count(psi)} (start-up: {model_line(path)}) | "
              f"{human(sum(q['total'] for q in p.values()))} | {', '.join(human(rss[r]) for r in sorted(rss))} | "
              f"{human(sum(rss.values()))} | {human(float(budget))} |")
    if len(sizes) == 2:
        a, b = sizes.values()
        print(f"\nstage 3 holds {b / a:.2f}x the parameters of stage 0 in the same budget")
    return True


def steps(directory, *runs):
    def median(run):
        times = [r["runtime/iteration_time"] for r in map(json.loads, open(f"{directory}/{run}/metrics.jsonl"))
                 if "runtime/iteration_time" in r]
        return statistics.median(times[3:])
    base = median(runs[0])
    for run in runs:
        t = median(run)
        print(f"{run}: {t * 1e3:.0f} ms per iteration, {t / base:.2f}x {runs[0]}")
    return True


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "bytes":
        print(to_bytes(args[0]))
    elif cmd == "human":
        print(human(float(args[0])))
    elif cmd == "libraries_bytes":
        print(libraries(args[0]))
    elif cmd == "ladder":
        for layers, hidden, heads in ladder():
            print(layers, hidden, heads)
    else:
        f = {"fits": fits, "predict": predict, "stages": stages, "largest": largest, "steps": steps}[cmd]
        sys.exit(0 if f(*args) else 1)
