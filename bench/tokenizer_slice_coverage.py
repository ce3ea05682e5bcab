"""tokenizer_slice_coverage.py: checks that the corpus slices the tokenizer oracle tests read
(tokenizer_corpus.representative_documents) reach every line and branch of lib/tokenizer that the
whole corpus reaches, with a neox-preprocess built with gcc's --coverage (bench/tokenizer_slice_coverage.sh
builds it and calls this).
Usage: tokenizer_slice_coverage.py run full|representative   (NEOX_BIN names the coverage build's bin)
       tokenizer_slice_coverage.py compare WHOLE_DIR SLICE_DIR  (gcov -j results of the two runs)
`run` encodes the texts plus the adversarial set with the four GPT-2-family forms the parity test
checks and decodes the ids back. `compare` prints what the whole corpus reached and the slices did
not, and exits 1 when there is any."""
import glob
import gzip
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "oracle"))
import tokenizer_corpus as tc  # noqa: E402

FORMS = ("GPT2BPETokenizer", "HFGPT2Tokenizer", "gpt2-json", "20B")


def run(which):
    texts = tc.corpus_documents() if which == "full" else tc.representative_documents()
    docs = [d for _, items in sorted(texts.items()) for d in items] + tc.adversarial_documents()
    if which != "full":  # (as test_tokenizer_parity.py's corpus)
        docs.append(tc.distinct_words_document())
    print(f"{which}: {len(docs)} documents, {sum(map(len, docs))} characters")
    for form in FORMS:
        args = tc.neox_args(form)
        ids = tc.neox_encode_many(args, docs)
        text = "".join(" ".join(map(str, i)) + "\n" for i in ids).encode()
        subprocess.run([tc.PREPROCESS, "decode", "--null"] + args, input=text, capture_output=True, check=True)


def reached(folder):
    """(file, line) executed and (file, line, branch) taken in lib/tokenizer, from gcov's JSON."""
    lines, branches = set(), set()
    for path in glob.glob(os.path.join(folder, "*.gcov.json.gz")):
        for f in json.load(gzip.open(path))["files"]:
            if not f["file"].startswith("lib/tokenizer/"):
                continue
            for line in f["lines"]:
                if line["count"] > 0:
                    lines.add((f["file"], line["line_number"]))
                branches |= {(f["file"], line["line_number"], i)
                             for i, b in enumerate(line.get("branches", [])) if b["count"] > 0}
    return lines, branches


def compare(whole_dir, slice_dir):
    (wl, wb), (sl, sb) = reached(whole_dir), reached(slice_dir)
    print(f"whole corpus: {len(wl)} lines, {len(wb)} branches taken; slices: {len(sl)} lines, {len(sb)} branches")
    print("reached by the whole corpus only:", sorted(wl - sl), sorted(wb - sb))
    return 1 if wl - sl or wb - sb else 0


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
