"""tests/mpi/memory_check.py: the checks of tests/mpi/memory.sh, on the start-up "memory of rank 0" line.

  table DIR D BUCKET HIDDEN
                       $DIR/{fp32,bf16,fp16}-s{0,1,2,3}.out: bytes per parameter of each region against the
                       closed forms, printed as the markdown table of docs/memory.md (stage 3 gathering
                       one layer at a time: nothing persistent, prefetched or kept between uses)
  wire OUT             communication is 2 bytes per parameter (the 16-bit wire copy of the gradients)
  startup BIG SMALL RANKS
                       every rank's measured peak resident set of run BIG ($BIG.out, $BIG.rss.RANK as
                       tests/mpi/peak_rss.py writes them) is at most its planned total plus the peak of
                       the same rank in run SMALL (a tiny model: the libraries' own memory)
  regions OUT          the line's regions and total in bytes, as JSON (tests/tools/train_memory.sh)
  bounded RUN S0 SMALL D  stage 3 (RUN) never plans more parameter bytes than stage 0 (S0): every rank's
                       planned parameters in RUN/log/memory_plan.json (exact bytes) at most S0's; and
                       every rank's measured peak resident set within its planned total plus the
                       libraries' (run SMALL)
  activations DIR TP ROWS SEQ HIDDEN HEADS NAME...
                       each run DIR/NAME (tp TP, micro-batch ROWS, sequential residual, gelu MLP of 4
                       HIDDEN; NAME's "sp" and "ck" mark sequence_parallel and checkpoint_activations):
                       every rank's activation_layers in memory_plan.json add up to its activations and
                       give per layer the bytes of the formula below; prints each run's saving per layer
                       against the one without sequence_parallel
  split RUN SMALL S0 D BUCKET HIDDEN VOCAB ROWS
                       stages 2 and 3 with embeddings larger than a bucket: planned gradients per rank
                       against the formula, no whole embedding in them, measured peaks (see split())

Psi is rank 0's parameter count, the fp32 parameters' bytes / 4 at stage 0 (tensor and pipeline size 1,
so every rank holds the whole model). The closed forms are written out here from the ZeRO paper's
accounting (Rajbhandari et al. 2020, section 3: (2 + 2 + K) Psi with mixed-precision Adam, K = 12),
restated for neox.c's buffers: fp32 master parameters (4; stage 3: 4/D plus the largest unit held whole,
here a transformer layer of 12 h^2 + 13 h elements: four h x h blocks of attention, two h x 4h of the
MLP, their biases and two norms), 16-bit copies in bf16/fp16 only (2; stage 3: of the unit held whole),
fp32 gradients (4; stages 2 and 3 keep 4/D plus the buckets in flight), Adam's two fp32 moments (8;
stages 1 to 3: 8/D).
"""
import json
import os
import re
import sys

UNITS = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def regions(path, rank=0):
    line = next(l for l in open(path) if f"memory of rank {rank}:" in l)
    parts = {n: float(v) * UNITS[u] for n, v, u in re.findall(r"(?:= |\+ )([a-z0-9 -]+?) ([0-9.]+)\s*([kKMGT]?)B", line)}
    total = re.search(r"memory of rank [0-9]+: ([0-9.]+)\s*([kKMGT]?)B =", line)
    parts["total"] = float(total.group(1)) * UNITS[total.group(2)]
    return parts


def expected(precision, stage, d, layer_share):
    """Bytes per parameter of each region; stages 2 and 3's gradients without the buckets in flight.
    layer_share: one transformer layer's elements / Psi (what stage 3 holds whole at most)."""
    half = 2 if precision != "fp32" else 0
    whole = layer_share if stage == 3 else 1
    return {"parameters": 4 / d + 4 * whole if stage == 3 else 4, "16-bit copies": half * whole,
            "gradients": 4 if stage < 2 else 4 / d, "optimizer": 8 if stage == 0 else 8 / d}


def table(directory, d, bucket, hidden):
    d, bucket, h = int(d), int(bucket), int(hidden)
    ok = True
    print("| ZeRO stage | precision | parameters | 16-bit copies | gradients | optimizer | model states | "
          "closed form | DeepSpeed (mixed-precision Adam, K = 12) |")
    print("|---|---|---|---|---|---|---|---|---|")
    ds = {0: "(2 + 2 + K) = 16", 1: f"2 + 2 + K/D = {4 + 12 / d:.3g}", 2: f"2 + (2 + K)/D = {2 + 14 / d:.3g}",
          3: f"(2 + 2 + K)/D = {16 / d:.3g}"}
    for stage in (0, 1, 2, 3):
        for precision in ("fp32", "bf16", "fp16"):
            p = regions(f"{directory}/{precision}-s{stage}.out")
            psi = regions(f"{directory}/{precision}-s0.out")["parameters"] / 4
            want = expected(precision, stage, d, (12 * h * h + 13 * h) / psi)
            got = {k: p[k] / psi for k in want}
            # Stages 2 and 3 on the host keep the two largest buckets in flight besides their partition:
            # a bucket is filled with whole tensors up to BUCKET elements, so it holds less than BUCKET
            # plus the largest tensor (the MLP's 4h x h).
            buckets = got["gradients"] - want["gradients"] if stage >= 2 else 0
            if not 0 <= buckets <= 2 * 4 * (bucket + 4 * h * h) / psi:
                print(f"# {precision} stage {stage}: {buckets:.3f} bytes per parameter of buckets in flight")
                ok = False
            for k in want:
                have = got[k] - (buckets if k == "gradients" else 0)
                if abs(have - want[k]) > 0.02 * want[k] + 0.01:
                    print(f"# {precision} stage {stage} {k}: {have:.3f} bytes per parameter, want {want[k]:.3f}")
                    ok = False
            model = sum(got.values())
            form = " + ".join(f"{v:.3g}" for v in want.values() if v)
            if stage == 3:  # the partitions, then the layer held whole (its fp32 and 16-bit copies)
                share = (12 * h * h + 13 * h) / psi
                held = "(4 + 2)" if want["16-bit copies"] else "4"
                form = f"(4 + 4 + 8)/D + {held} x {share:.3f} (a layer)"
            if stage >= 2:
                form += f" + {buckets:.2f} (buckets)"
                want["gradients"] += buckets
            print(f"| {stage} | {precision} | {got['parameters']:.2f} | {got['16-bit copies']:.2f} | "
                  f"{got['gradients']:.2f} | {got['optimizer']:.2f} | {model:.2f} | {form} = {sum(want.values()):.3g} | "
                  f"{ds[stage]} |")
    return ok


def print_regions(out):
    print(json.dumps(regions(out)))
    return True


def wire(out):
    """The 16-bit wire copy (2 bytes per parameter) and MPI's two temporaries of the one bucket in
    flight, also at 2 bytes per element (one bucket holds the whole model): 6 bytes per parameter."""
    p = regions(out)
    got = p["communication"] / (p["parameters"] / 4)
    print(f"communication: {got:.3f} bytes per parameter")
    return abs(got - 6) <= 0.04


def startup(big, small, ranks):
    ok = True
    for r in range(int(ranks)):
        plan = regions(f"{big}.out", r)["total"]
        peak, libraries = (int(open(f"{run}.rss.{r}").read()) for run in (big, small))
        print(f"rank {r}: peak {peak / 1e6:.1f} MB, plan {plan / 1e6:.1f} MB + the libraries' {libraries / 1e6:.1f} MB")
        ok &= peak <= plan + libraries
    return ok


def peaks(run, ranks):
    """RUN/log/memory_peaks.json against the wrapper's measure of each rank (RUN.rss.R) and the plan
    in RUN/log/memory_plan.json: every rank is there, its peak is the process's (written just before
    the end, so at most the wrapper's and within 2% or 8 MB of it) and its planned total is the sum of
    its plan's regions; with metrics (RUN/log/metrics.jsonl), the largest rank's gauge at each log is
    at least rank 0's and at most the largest final peak."""
    doc = json.load(open(f"{run}/log/memory_peaks.json"))["ranks"]
    plan = json.load(open(f"{run}/log/memory_plan.json"))["ranks"]
    ok = len(doc) == len(plan) == int(ranks)
    for r, (got, planned) in enumerate(zip(doc, plan)):
        wrapper = int(open(f"{run}.rss.{r}").read())
        print(f"rank {r}: memory_peaks.json {got['peak_rss_bytes'] / 1e6:.1f} MB, wrapper {wrapper / 1e6:.1f} MB, "
              f"planned {got['planned_bytes'] / 1e6:.1f} MB")
        ok &= got["peak_rss_bytes"] <= wrapper and wrapper - got["peak_rss_bytes"] <= max(0.02 * wrapper, 8e6)
        ok &= abs(got["planned_bytes"] - sum(planned.values())) <= len(planned)  # (rounding of each region)
        ok &= "device_peak_bytes" not in got  # the cpu backend
    metrics = f"{run}/log/metrics.jsonl"
    if os.path.exists(metrics):
        logs = [r for r in map(json.loads, open(metrics)) if "memory/peak_rss_bytes" in r]
        largest = max(p["peak_rss_bytes"] for p in doc)
        ok &= bool(logs) and all(r["memory/peak_rss_bytes"] <= r["memory/max_rank_peak_rss_bytes"] <= largest for r in logs)
        print(f"{len(logs)} logs with the largest rank's peak")
    return ok


def split(run, small, s0, ranks, bucket, hidden, vocab, rows):
    """Stages 2 and 3 with embeddings (VOCAB x HIDDEN) larger than a bucket: every rank's planned
    gradients are within 10% of 4 (n/D + 2 BUCKET + F) bytes, n the parameters (run S0's, stage 0),
    F the most elements one product of backward writes at once: the MLP's 4h x h, a piece of
    BUCKET // h rows of the output layer, or the ROWS x h rows a micro-batch touches in the input
    embedding; that plan holds less than one embedding's fp32 gradient; and each rank's measured
    peak is at most its plan (which counts MPI's temporaries) plus the libraries' memory (run SMALL)."""
    d, bucket, h, vocab, rows = int(ranks), int(bucket), int(hidden), int(vocab), int(rows)
    n = regions(f"{s0}.out")["parameters"] / 4
    fill = max(4 * h * h, bucket // h * h, min(rows * h, vocab * h))
    want = 4 * (n / d + 2 * bucket + fill)
    embedding = 4 * vocab * h
    ok = True
    for r in range(d):
        p = regions(f"{run}.out", r)
        peak, libraries = (int(open(f"{x}.rss.{r}").read()) for x in (run, small))
        print(f"rank {r}: gradients planned {p['gradients'] / 1e6:.2f} MB, formula {want / 1e6:.2f} MB, one embedding "
              f"{embedding / 1e6:.2f} MB; peak {peak / 1e6:.1f} MB, plan {p['total'] / 1e6:.1f} MB + libraries "
              f"{libraries / 1e6:.1f} MB")
        ok &= abs(p["gradients"] - want) <= 0.1 * want
        ok &= p["gradients"] - 4 * n / d < embedding
        ok &= peak <= p["total"] + libraries
    return ok


def r16(n):
    return (n + 15) // 16 * 16  # the plan's 64-byte alignment of each tensor


def layer_bytes(tp, rows, seq, hidden, heads, sp, ck):
    """What one layer keeps per micro-batch, restated from neox.c's fused attention (no s x s scores;
    the dropout masks regenerated from counters, never kept): fp32 (N, C) tensors whole on every
    tensor-parallel rank (the input, both norms' outputs, the sequential residual's sum), or 1/TP of
    their rows under sequence parallelism, with the norms' two statistics per row; and the tensors
    cut by heads or MLP rows (QKV, the attention output and its log-sum-exp, the MLP's two 4C-wide
    ones; attention reads q, k, v in the QKV output). checkpoint_activations keeps the input only."""
    N, C = rows * seq, hidden
    n = N // tp if sp else N
    t = tp
    whole = 3 * r16(n * C) + 4 * r16(n)  # ln1, mid, ln2 and their statistics
    cut = r16(N * 3 * C // t) + r16(N * C // t) + r16(N * heads // t) + 2 * r16(N * 4 * C // t)  # (+ the attention output)
    return 4 * (n * C + (0 if ck else whole + cut))


def activations(root, tp, rows, seq, hidden, heads, *names):
    tp, rows, seq, hidden, heads = map(int, (tp, rows, seq, hidden, heads))
    ok, per = True, {}
    for name in names:
        doc = json.load(open(f"{root}/{name}/log/memory_plan.json"))
        sp, ck = "sp" in name, "ck" in name
        want = layer_bytes(tp, rows, seq, hidden, heads, sp, ck)
        for r, (regions_, lay) in enumerate(zip(doc["ranks"], doc["activation_layers"])):
            total = lay["slots"] * lay["layers"] * lay["per_layer"] + lay["rest"]
            ok &= total == regions_["activations"] and lay["per_layer"] == want
            if r == 0 or lay["per_layer"] != want:
                print(f"{name} rank {r}: {lay['slots']} x {lay['layers']} x {lay['per_layer']} + {lay['rest']} = {total} "
                      f"(activations {regions_['activations']}); formula per layer {want}")
        per[name] = doc["activation_layers"][0]["per_layer"], doc["ranks"][0]["activations"]
    for name in names:
        base = name.replace("sp", "")
        if "sp" in name and base in per:
            (a, ta), (b, tb) = per[base], per[name]
            print(f"{name}: per layer {b} bytes against {base}'s {a} ({100 * (a - b) / a:.1f}% saved); "
                  f"all activations {tb} against {ta} ({100 * (ta - tb) / ta:.1f}% saved)")
    return ok


def context(run, ranks, rows, seq, hidden, heads, cp):
    """Context parallelism: per layer, the formula of `layer_bytes` (attention reading q, k, v in
    the QKV output, as on one rank) for seq / cp positions on every rank (its two chunks); the
    plan's remainder holds at least the whole sequence's keys and values, 2 x (rows, seq, hidden)
    fp32 (every head its own key/value head here), and the room their gradients share with the MLP's
    backward scratch (its two (rows, seq / cp, 4 hidden) tensors): the larger of the two."""
    ranks, rows, seq, hidden, heads, cp = map(int, (ranks, rows, seq, hidden, heads, cp))
    doc = json.load(open(f"{run}/log/memory_plan.json"))
    whole, mlp = 4 * rows * seq * hidden, 4 * 2 * rows * (seq // cp) * 4 * hidden
    want, gathered = layer_bytes(1, rows, seq // cp, hidden, heads, False, False), 2 * whole + max(2 * whole, mlp)
    ok = len(doc["activation_layers"]) == ranks
    for r, (regions_, lay) in enumerate(zip(doc["ranks"], doc["activation_layers"])):
        total = lay["slots"] * lay["layers"] * lay["per_layer"] + lay["rest"]
        ok &= total == regions_["activations"] and lay["per_layer"] == want and lay["rest"] >= gathered
        print(f"rank {r}: per layer {lay['per_layer']} (formula at seq {seq // cp}: {want}); rest {lay['rest']} "
              f"holds the gathered keys and values and their gradients' room ({gathered})")
    return ok


def bounded(run, s0, small, ranks):
    plan, plan0 = (json.load(open(f"{x}/log/memory_plan.json"))["ranks"] for x in (run, s0))
    ok = len(plan) == len(plan0) == int(ranks)
    for r, (p, p0) in enumerate(zip(plan, plan0)):
        peak, libraries = (int(open(f"{x}.rss.{r}").read()) for x in (run, small))
        total = sum(p.values())
        print(f"rank {r}: parameters planned {p['parameters'] / 1e6:.2f} MB, stage 0 {p0['parameters'] / 1e6:.2f} MB; "
              f"peak {peak / 1e6:.1f} MB, plan {total / 1e6:.1f} MB + libraries {libraries / 1e6:.1f} MB")
        ok &= p["parameters"] <= p0["parameters"] and peak <= total + libraries
    return ok


if __name__ == "__main__":
    command = {"table": table, "wire": wire, "regions": print_regions, "startup": startup, "peaks": peaks,
               "split": split, "bounded": bounded, "activations": activations,
               "context": context}[sys.argv[1]]
    sys.exit(0 if command(*sys.argv[2:]) else 1)
