"""tokenizer_families_bench.py: the tokenizer kinds beyond GPT-2 (bench/tokenizers.sh runs it) —
Llama-3-, Qwen-, SmolLM2- and Llama-2-like tokenizer.json files, a tiktoken rank file and
SentencePiece BPE and unigram models, built as the oracle tests build them — timed on
the whole corpus in neox.c against each kind's reference called its fastest way: HF tokenizers'
encode_batch (its rayon threads), tiktoken's encode_ordinary_batch, sentencepiece's batch encode,
at 1 and 2 threads. One thread is timed in CPU time on both sides (what a busy shared machine
distorts least, as bench/tokenizers.sh does), two threads on the wall clock. Prints MB/s and ratios.
Usage: tokenizer_families_bench.py DRIVER WORKDIR [THREADS...]
NEOX_BENCH_KINDS=spm-bpe,spm-unigram (a comma-separated list of the kind names printed) runs only those;
NEOX_BENCH_ROUNDS (default 2) interleaved rounds of neox.c and the reference, the best of each kept."""
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))
import test_tokenizer_families as fam  # noqa: E402
import tokenizer_corpus as tc  # noqa: E402


def reference_rate(kind, path, docs_path, threads):
    """MB/s of the reference in a fresh process (rayon reads RAYON_NUM_THREADS once, at start)."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    code = f"""
import sys, time
sys.path.insert(0, {os.path.join(HERE, '..', 'tests', 'oracle')!r})
docs = open({docs_path!r}, 'rb').read().decode('utf-8').split('\\0')
mb = sum(len(d.encode('utf-8')) for d in docs) / 1e6
kind, path, threads = {kind!r}, {path!r}, {threads}
if kind == 'hf':
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    run = lambda: tok.encode_batch(docs)
elif kind == 'tiktoken':
    import test_tokenizer_families as fam, tiktoken, base64
    ranks = {{base64.b64decode(t): int(r) for t, r in (l.split() for l in open(path))}}
    enc = tiktoken.Encoding(name='bench', pat_str=fam.CL100K_PATTERN, mergeable_ranks=ranks,
                            special_tokens={{'<|endoftext|>': len(ranks)}})
    run = lambda: enc.encode_ordinary_batch(docs, num_threads=threads)
else:
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=path)
    run = lambda: sp.encode(docs, num_threads=threads)
clock = time.process_time if threads == 1 else time.perf_counter
t0 = clock(); run(); print(mb / (clock() - t0))
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def neox_rates(driver, docs_path, type_, path, threads):
    out = subprocess.run([driver, docs_path, type_, path, "-"] + [str(t) for t in threads], check=True,
                         capture_output=True, text=True).stdout
    return {int(t): float(r) for _, t, r, *_ in (line.split() for line in out.splitlines())}


def tiktoken_file(work, lines):
    rank_file = str(work / "bench.tiktoken")
    fam.write_rank_file(rank_file, fam.byte_level_bpe(lines))
    return rank_file


def spm_file(work, lines, model_type):
    """A SentencePiece model of 1,200 pieces with byte fallback (nmt_nfkc normalization)."""
    import sentencepiece as spm
    prefix = str(work / f"bench_spm_{model_type}")
    spm.SentencePieceTrainer.train(sentence_iterator=iter([ln for ln in lines if ln.strip()]), model_prefix=prefix,
                                   model_type=model_type, vocab_size=1200, byte_fallback=True, minloglevel=2,
                                   num_threads=2)
    return prefix + ".model"


def main():
    driver, work, threads = sys.argv[1], Path(sys.argv[2]), [int(t) for t in sys.argv[3:]] or [1, 2]
    docs = [d for items in tc.corpus_documents().values() for d in items if "\0" not in d]
    docs_path = str(work / "family_docs.bin")
    with open(docs_path, "wb") as f:
        f.write("\0".join(docs).encode("utf-8"))
    lines = fam.training_lines()
    # name: (reference kind, neox.c tokenizer type, a function building the file and returning its path)
    builders = {name: ("hf", "HFTokenizer", lambda name=name: fam.HF_BUILDERS[name](work, lines))
                for name in ("llama3", "qwen", "smollm2", "llama2")}
    builders["tiktoken"] = ("tiktoken", "TiktokenTokenizer", lambda: tiktoken_file(work, lines))
    builders["spm-bpe"] = ("spm", "SPMTokenizer", lambda: spm_file(work, lines, "bpe"))
    builders["spm-unigram"] = ("spm", "SPMTokenizer", lambda: spm_file(work, lines, "unigram"))
    wanted = os.environ.get("NEOX_BENCH_KINDS")
    names = [n for n in builders if not wanted or n in wanted.split(",")]
    kinds = [(name, builders[name][0], builders[name][1], builders[name][2]()) for name in names]
    mb = os.path.getsize(docs_path) / 1e6
    print(f"\n== tokenizer families: {len(docs)} documents, {mb:.1f} MB; 1 thread CPU time, 2 threads wall clock; load {os.getloadavg()[0]:.1f} ==")
    print(f"  {'kind':10s} threads  neox.c MB/s  reference MB/s  ratio")
    rounds = int(os.environ.get("NEOX_BENCH_ROUNDS", "2"))
    for name, kind, type_, path in kinds:
        for t in threads:
            # Rounds of ours and the reference's interleaved; the best of each (the least disturbed).
            ours = ref = 0.0
            for _ in range(rounds):
                ours = max(ours, neox_rates(driver, docs_path, type_, path, [t])[t])
                ref = max(ref, reference_rate(kind, path, docs_path, t))
            print(f"  {name:10s} {t:7d}  {ours:11.2f}  {ref:14.2f}  {ours / ref:5.2f}x")


if __name__ == "__main__":
    main()
