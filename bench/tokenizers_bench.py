"""tokenizers_bench.py: the peer side of bench/tokenizers.sh — writes the corpus (every text in
../shared/data, as documents), times HF `tokenizers` and `tiktoken` single-threaded on it, runs
the neox.c driver on the same documents, and prints MB/s and ratios."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "oracle"))
import tokenizer_corpus as tc  # noqa: E402


def timed(fn, docs):
    # CPU time of this process: the peers run single-threaded, and CPU time is what a busy shared
    # machine distorts least (neox.c's single-thread run is timed the same way).
    t0 = time.process_time()
    n = sum(len(ids) for ids in fn(docs))
    return time.process_time() - t0, n


def main():
    driver, workdir, threads = sys.argv[1], sys.argv[2], sys.argv[3:]
    docs = [d for items in tc.corpus_documents().values() for d in items if "\0" not in d]
    blob = "\0".join(docs).encode("utf-8")
    path = os.path.join(workdir, "docs.bin")
    with open(path, "wb") as f:
        f.write(blob)
    mb = len(blob) / 1e6
    print(f"corpus: {len(docs)} documents, {mb:.1f} MB (every text in {tc.SHARED})")
    print("single-thread rates use CPU time; neox.c rows with threads > 1 use wall-clock time")
    setups = [
        ("GPT-2", ["GPT2BPETokenizer", tc.GPT2_VOCAB, tc.GPT2_MERGES], tc.hf_gpt2_from_files(), True),
        ("GPT-NeoX-20B", ["HFTokenizer", tc.NEOX_JSON, "-"], tc.hf_from_json(tc.NEOX_JSON), False),
    ]
    enc = tc.tiktoken_gpt2()
    for name, args, hf, with_tiktoken in setups:
        print(f"\n== {name} ==")
        # HF tokenizers: one call per document on this thread (its batch API would use rayon threads).
        hf_s, hf_n = timed(lambda ds: [hf.encode(d).ids for d in ds], docs)
        rows = [("HF tokenizers", 1, mb / hf_s, hf_n)]
        if with_tiktoken:
            tk_s, tk_n = timed(lambda ds: [enc.encode_ordinary(d) for d in ds], docs)
            rows.append(("tiktoken", 1, mb / tk_s, tk_n))
        out = subprocess.run([driver, path] + args + threads, check=True, capture_output=True, text=True).stdout
        neox = [(f"neox.c", int(t), float(r), int(n)) for _, t, r, n in (line.split() for line in out.splitlines())]
        for label, t, rate, n in rows + neox:
            ratios = "  ".join(f"{rate / r[2]:.2f}x {r[0]}" for r in rows if r[0] != label)
            print(f"  {label:14s} threads={t:<2d} {rate:8.2f} MB/s  tokens={n}  {ratios}")
        if neox[0][3] != hf_n:
            print(f"  WARNING: token counts differ (neox.c {neox[0][3]}, HF {hf_n})")


if __name__ == "__main__":
    main()
