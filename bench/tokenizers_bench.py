"""tokenizers_bench.py: the peer side of bench/tokenizers.sh — writes two corpora (every text in
../shared/data as documents, and Tiny Shakespeare alone: one 1.1 MB document), and on each times
neox.c's driver and its peers called every way they offer, in interleaved rounds (the best round
counts): HF `tokenizers` per document (`encode`) and batched on its own rayon threads
(`encode_batch`, `encode_batch_fast` where the installed version has it; RAYON_NUM_THREADS), and
`tiktoken` per document (`encode_ordinary`) and batched (`encode_ordinary_batch(num_threads=)`).
One thread is timed in CPU time (the whole process's, so a peer's pool thread counts), more on
the wall clock. Prints MB/s and ratios against HF's best call and tiktoken's batch API at the same
thread count, and neox.c's speed-up from 1 to 2 threads with documents cut and whole — by the
clocks, by the threads' CPU-time balance and by the schedule of the items on idle cores (see
tokenizers_bench.c).
Usage: tokenizers_bench.py DRIVER WORKDIR [THREADS...]   (NEOX_BENCH_ROUNDS, default 2)
       tokenizers_bench.py --peer SETUP API THREADS DOCS_FILE   (one timed peer call; internal)"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "oracle"))
import tokenizer_corpus as tc  # noqa: E402

SETUPS = {  # name: (neox.c driver arguments, has a tiktoken equivalent)
    "GPT-2": (["GPT2BPETokenizer", tc.GPT2_VOCAB, tc.GPT2_MERGES], True),
    "GPT-NeoX-20B": (["HFTokenizer", tc.NEOX_JSON, "-"], False),
}


def hf_tokenizer(setup):
    return tc.hf_gpt2_from_files() if setup == "GPT-2" else tc.hf_from_json(tc.NEOX_JSON)


def peer_call(setup, api, threads):
    """The function that encodes a list of documents the given way."""
    if api.startswith("tiktoken"):
        enc = tc.tiktoken_gpt2()
        if api == "tiktoken.encode_ordinary":
            return lambda docs: [enc.encode_ordinary(d) for d in docs]
        return lambda docs: enc.encode_ordinary_batch(docs, num_threads=threads)
    hf = hf_tokenizer(setup)
    if api == "hf.encode":
        return lambda docs: [hf.encode(d).ids for d in docs]
    if api == "hf.encode_batch":
        return lambda docs: [e.ids for e in hf.encode_batch(docs)]
    return lambda docs: hf.encode_batch_fast(docs)  # ids are computed either way; offsets are not


def run_peer(setup, api, threads, docs_file):
    """Child process: times one call and prints MB/s (rayon reads RAYON_NUM_THREADS once, at start)."""
    with open(docs_file, "rb") as f:
        blob = f.read()
    docs = blob.decode("utf-8").split("\0")
    fn = peer_call(setup, api, threads)
    clock = time.process_time if threads == 1 else time.perf_counter
    t0 = clock()
    fn(docs)
    print(len(blob) / 1e6 / (clock() - t0))


def peer_rate(setup, api, threads, docs_file):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, __file__, "--peer", setup, api, str(threads), docs_file], env=env,
                         check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def neox_rates(driver, docs_file, args, threads, whole):
    env = dict(os.environ, NEOX_BENCH_WHOLE="1" if whole else "0")
    out = subprocess.run([driver, docs_file] + args + [str(t) for t in threads], env=env, check=True,
                         capture_output=True, text=True).stdout
    return {int(t): (float(r), float(b), float(sc)) for _, t, r, _, b, sc in (line.split() for line in out.splitlines())}


def apis(setup, threads):
    """(api, threads) pairs of the peers: per-document calls at 1 thread, batch calls at each count."""
    import tokenizers
    out = [("hf.encode", 1)] + [("hf.encode_batch", t) for t in threads]
    if hasattr(tokenizers.Tokenizer, "encode_batch_fast"):
        out += [("hf.encode_batch_fast", t) for t in threads]
    if SETUPS[setup][1]:
        out += [("tiktoken.encode_ordinary", 1)] + [("tiktoken.encode_ordinary_batch", t) for t in threads]
    return out


def bench_corpus(label, docs, driver, workdir, threads, rounds):
    blob = "\0".join(docs).encode("utf-8")
    path = os.path.join(workdir, f"{label}.bin")
    with open(path, "wb") as f:
        f.write(blob)
    print(f"\n#### corpus {label}: {len(docs)} documents, {len(blob) / 1e6:.1f} MB; best of {rounds} interleaved "
          f"rounds; load average {os.getloadavg()[0]:.1f} at start")
    for setup, (args, _) in SETUPS.items():
        best, balance, schedule = {}, {}, {}
        for _ in range(rounds):  # ours and the peers' in turn, so that a change of load hits both
            for whole in (False, True):
                for t, (r, b, sc) in neox_rates(driver, path, args, threads, whole).items():
                    key = ("neox.c (whole docs)" if whole else "neox.c", t)
                    best[key] = max(best.get(key, 0), r)
                    balance[key] = max(balance.get(key, 0), b)
                    schedule[key] = sc
            for api, t in apis(setup, threads):
                best[(api, t)] = max(best.get((api, t), 0), peer_rate(setup, api, t, path))
        print(f"\n== {setup} ({label}), load average {os.getloadavg()[0]:.1f} at end ==")
        for t in threads:
            hf_best = max(r for (a, tt), r in best.items() if a.startswith("hf.") and tt == t)
            tk = best.get(("tiktoken.encode_ordinary_batch", t))
            for (api, tt), r in sorted(best.items(), key=lambda kv: (kv[0][0].startswith("neox"), kv[0][0])):
                if tt != t:
                    continue
                ratios = ""
                if api.startswith("neox"):
                    ratios = f"  {r / hf_best:5.2f}x HF best  " + (f"{r / tk:5.2f}x tiktoken batch  " if tk else "")
                    ratios += f"balance {balance[(api, tt)]:.2f}  schedule {schedule[(api, tt)]:.2f}" if t > 1 else ""
                print(f"  threads={t}  {api:32s} {r:8.2f} MB/s{ratios}")
        for key in ("neox.c", "neox.c (whole docs)"):
            if (key, 1) in best and (key, 2) in best:
                print(f"  {key} 1 -> 2 threads: {best[(key, 2)] / best[(key, 1)]:.2f}x by the clocks above; on idle "
                      f"cores {balance[(key, 2)]:.2f}x by CPU-time balance (best round), {schedule[(key, 2)]:.2f}x by "
                      f"the schedule of its items")


def main():
    if sys.argv[1] == "--peer":
        run_peer(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    driver, workdir = sys.argv[1], sys.argv[2]
    threads = [int(t) for t in sys.argv[3:]] or [1, 2]
    rounds = int(os.environ.get("NEOX_BENCH_ROUNDS", "2"))
    docs = [d for items in tc.corpus_documents().values() for d in items if "\0" not in d]
    print("single-thread rates use CPU time; rates at more threads use wall-clock time")
    bench_corpus("all-texts", docs, driver, workdir, threads, rounds)
    with open(os.path.join(tc.SHARED, "text", "tinyshakespeare_input.txt"), encoding="utf-8") as f:
        bench_corpus("tinyshakespeare", [f.read()], driver, workdir, threads, rounds)


if __name__ == "__main__":
    main()
