"""bench/shapes_table.py: a Markdown table of several bench/shapes.sh runs (their stdout saved to files):
each side's tokens/s per run, and the median over the runs of each run's own neox.c/peer ratio (the sides
of one run ran minutes apart, the runs tens of minutes apart, so the ratios within a run are the fair
ones on a loaded machine). Training is compared with the faster of torch eager and torch.compile.

    python3 bench/shapes_table.py RUN1.log RUN2.log ..."""
import json
import statistics
import sys
runs = [[json.loads(l) for l in open(f) if l.startswith('{"shape"')] for f in sys.argv[1:]]
runs = [{(r["shape"], r["side"]): r["tokens_per_s"] for r in run} for run in runs]
fmt = lambda k: " / ".join(f"{r[k]:.0f}" if r[k] >= 100 else f"{r[k]:.1f}" for r in runs)
ratio = lambda f: statistics.median(f(r) for r in runs)
print("| shape | train: neox.c | torch eager | torch.compile | ratio to best torch | score: neox.c | transformers | ratio | generate: neox.c | transformers | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for s in dict.fromkeys(k[0] for k in runs[0]):
    tr = ratio(lambda r: r[s, "neox.c train fp32"] / max(r[s, "torch eager"], r[s, "torch compile"]))
    sc = ratio(lambda r: r[s, "neox.c score"] / r[s, "transformers score"])
    ge = ratio(lambda r: r[s, "neox.c generate"] / r[s, "transformers generate"])
    print(f"| {s} | {fmt((s,'neox.c train fp32'))} | {fmt((s,'torch eager'))} | {fmt((s,'torch compile'))} | **{tr:.2f}x** "
          f"| {fmt((s,'neox.c score'))} | {fmt((s,'transformers score'))} | **{sc:.2f}x** "
          f"| {fmt((s,'neox.c generate'))} | {fmt((s,'transformers generate'))} | **{ge:.2f}x** |")
