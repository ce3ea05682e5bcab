"""test_data_preprocess.py: neox-preprocess output against an independent pipeline equivalent to
GPT-NeoX's preprocess_data.py: documents read with the standard library (+ zstandard), tokenized by
Hugging Face `tokenizers`, written by the numpy MMIDIDX writer in data_oracle.py. The .bin/.idx
bytes must be identical, for --workers 1 and 4."""
import gzip
import io
import json
import os
import shutil

import numpy as np
import pytest

from data_oracle import DATA, neox, write_indexed

tokenizers = pytest.importorskip("tokenizers")
zstandard = pytest.importorskip("zstandard")

GPT2_JSON = os.path.join(DATA, "tokenizers", "gpt2", "gpt2_tokenizer.json")
NEOX_JSON = os.path.join(DATA, "tokenizers", "neox", "20B_tokenizer.json")


def need(path):
    if not os.path.exists(path):
        pytest.skip(f"{path} is absent")


def read_docs(path, key="text"):
    """lm_dataformat's reading: jsonl lines (optionally zstd/gzip), a list joined by blank lines, empty skipped;
    a .txt file is one document read with universal newlines."""
    if path.endswith(".txt"):
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
        return [text] if text else []
    with open(path, "rb") as raw:
        data = raw.read()
    if data[:4] == b"\x28\xb5\x2f\xfd":
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    elif data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    docs = []
    for line in data.decode("utf-8").split("\n"):
        if not line.strip():
            continue
        value = json.loads(line)[key]
        if isinstance(value, list):
            value = "\n\n".join(value)
        if value:
            docs.append(value)
    return docs


def oracle_dataset(prefix, paths, tokenizer_json, append_eod=True):
    tok = tokenizers.Tokenizer.from_file(tokenizer_json)
    eod = tok.token_to_id("<|endoftext|>")
    dtype = np.uint16 if tok.get_vocab_size() < 65500 else np.int32
    docs = []
    for p in paths:
        for text in read_docs(p):
            ids = tok.encode(text).ids
            if append_eod:
                ids.append(eod)
            if ids:
                docs.append(ids)
    write_indexed(prefix, docs, dtype)


def same_files(a, b):
    for ext in (".bin", ".idx"):
        with open(a + ext, "rb") as fa, open(b + ext, "rb") as fb:
            da, db = fa.read(), fb.read()
        assert len(da) == len(db), f"{ext}: {len(da)} bytes vs {len(db)}"
        assert da == db, f"{ext} differs at byte {next(i for i in range(len(da)) if da[i] != db[i])}"


CORPORA = [
    ("jsonl/dolma_cc_sample_697docs.jsonl.zst", GPT2_JSON),
    ("jsonl/dolma_cc_sample_697docs.jsonl.gz", NEOX_JSON),
    ("jsonl/lmd_blns.jsonl.zst", NEOX_JSON),
    ("text/tinyshakespeare_input.txt", GPT2_JSON),
    ("text/enwik8_first100.txt", NEOX_JSON),
]


@pytest.mark.parametrize("corpus,tokenizer", CORPORA)
def test_preprocess_bytes_equal_numpy_writer(tmp_path, corpus, tokenizer):
    path = os.path.join(DATA, corpus)
    need(path)
    need(tokenizer)
    want = str(tmp_path / "oracle")
    oracle_dataset(want, [path], tokenizer)
    for workers in (1, 4):
        out = str(tmp_path / f"w{workers}")
        r = neox("--input", path, "--output-prefix", out, "--tokenizer-type", "HFTokenizer", "--vocab-file", tokenizer,
                 "--append-eod", "--workers", workers)
        assert r.returncode == 0, r.stderr
        same_files(out + "_text_document", want)


def test_gpt2bpe_files_match_hf_gpt2(tmp_path):
    path = os.path.join(DATA, "jsonl", "dolma_cc_sample_697docs.jsonl.zst")
    need(path)
    need(GPT2_JSON)
    want = str(tmp_path / "oracle")
    oracle_dataset(want, [path], GPT2_JSON)
    r = neox("--input", path, "--output-prefix", str(tmp_path / "g"), "--tokenizer-type", "GPT2BPETokenizer",
             "--vocab-file", os.path.join(DATA, "tokenizers", "gpt2", "vocab.json"), "--merge-file",
             os.path.join(DATA, "tokenizers", "gpt2", "merges.txt"), "--append-eod", "--workers", "2")
    assert r.returncode == 0, r.stderr
    same_files(str(tmp_path / "g_text_document"), want)


def test_directory_and_list_input(tmp_path):
    need(GPT2_JSON)
    src = [os.path.join(DATA, "text", "enwik8_first100.txt"), os.path.join(DATA, "jsonl", "lmd_blns.jsonl.zst")]
    for p in src:
        need(p)
    d = tmp_path / "corpus"
    (d / "b").mkdir(parents=True)
    shutil.copy(src[0], d / "a.txt")
    shutil.copy(src[1], d / "b" / "c.jsonl.zst")
    shutil.copy(src[0], d / "z.txt")
    want = str(tmp_path / "oracle")
    # Depth-first, names sorted within each directory; then the second --input entry.
    oracle_dataset(want, [str(d / "a.txt"), str(d / "b" / "c.jsonl.zst"), str(d / "z.txt"), src[0]], GPT2_JSON,
                   append_eod=False)
    r = neox("--input", f"{d},{src[0]}", "--output-prefix", str(tmp_path / "o"), "--tokenizer-type", "HFTokenizer",
             "--vocab-file", GPT2_JSON, "--workers", "3")
    assert r.returncode == 0, r.stderr
    same_files(str(tmp_path / "o_text_document"), want)


def test_jsonl_keys_each_their_own_dataset(tmp_path):
    need(NEOX_JSON)
    lines = [{"text": "first text", "title": "Title one", "body": ["para a", "para b"]},
             {"text": "second", "title": "", "body": ["only"]}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = neox("--input", str(src), "--jsonl-keys", "title", "body", "--output-prefix", str(tmp_path / "k"),
             "--tokenizer-type", "HFTokenizer", "--vocab-file", NEOX_JSON)
    assert r.returncode == 0, r.stderr
    tok = tokenizers.Tokenizer.from_file(NEOX_JSON)
    write_indexed(str(tmp_path / "t"), [tok.encode("Title one").ids], np.uint16)
    write_indexed(str(tmp_path / "b"), [tok.encode("para a\n\npara b").ids, tok.encode("only").ids], np.uint16)
    same_files(str(tmp_path / "k_title_document"), str(tmp_path / "t"))
    same_files(str(tmp_path / "k_body_document"), str(tmp_path / "b"))


def masked_before(ids, pattern):
    """preprocess_data_with_mask.py's mask(): -100 up to and including the first occurrence of pattern."""
    for at in range(len(ids) - len(pattern) + 1):
        if ids[at:at + len(pattern)] == pattern:
            cut = at + len(pattern)
            return [-100] * cut + ids[cut:]
    return list(ids)


@pytest.mark.parametrize("workers", [1, 3])
def test_mask_before_token_matches_numpy_writer(tmp_path, workers):
    """`neox-preprocess mask`: int32 token and label datasets, the label masked through the first
    occurrence of the delimiter's ids (a document without it unmasked), against HF tokenizers."""
    need(NEOX_JSON)
    tok = tokenizers.Tokenizer.from_file(NEOX_JSON)
    eod = tok.token_to_id("<|endoftext|>")
    records = ["Question: what is 2+2?\nAnswer: 4", "no delimiter in this one", "Answer: first\nAnswer: second",
               "Q: ünïcödé ☃ 𝔘\nAnswer: ✓ done", "Answer:", ""]
    with open(tmp_path / "qa.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({"text": r}) + "\n")
    pattern = tok.encode("\nAnswer:").ids
    docs, labels = [], []
    for r in records:
        ids = tok.encode(r).ids
        if not ids:
            continue
        ids.append(eod)
        docs.append(ids)
        labels.append(masked_before(ids, pattern))
    assert any(-100 in l for l in labels) and any(-100 not in l for l in labels)
    write_indexed(str(tmp_path / "want_text"), docs, np.int32)
    write_indexed(str(tmp_path / "want_label"), labels, np.int32)
    out = str(tmp_path / "qa")
    r = neox("mask", "--input", str(tmp_path / "qa.jsonl"), "--output-prefix", out, "--tokenizer-type", "HFTokenizer",
             "--vocab-file", NEOX_JSON, "--append-eod", "--workers", workers,
             "--mask-before-token", ",".join(map(str, pattern)))
    assert r.returncode == 0, r.stderr
    same_files(out + "_text_document", str(tmp_path / "want_text"))
    same_files(out + "_label_document", str(tmp_path / "want_label"))


def test_mask_refusals(tmp_path):
    need(NEOX_JSON)
    (tmp_path / "a.jsonl").write_text('{"text": "x", "other": "y"}\n')
    base = ["--input", str(tmp_path / "a.jsonl"), "--output-prefix", str(tmp_path / "o"), "--tokenizer-type",
            "HFTokenizer", "--vocab-file", NEOX_JSON]
    r = neox("mask", *base)
    assert r.returncode == 2 and "--mask-before-token IDS is required" in r.stderr, r.stderr
    r = neox("mask", *base, "--mask-before-token", "12,x")
    assert r.returncode == 2 and "--mask-before-token" in r.stderr, r.stderr
    r = neox("mask", *base, "--mask-before-token", "12", "--jsonl-keys", "text", "other")
    assert r.returncode == 2 and "one jsonl key" in r.stderr, r.stderr
    assert not (tmp_path / "o_label_document.bin").exists() and not (tmp_path / "o_text_document.bin").exists()
