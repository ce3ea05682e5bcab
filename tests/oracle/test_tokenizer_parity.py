"""Tokenizer parity: neox.c's encode (through `neox-preprocess encode`) against HF `tokenizers` and
`tiktoken` on every text file of ../shared/data, a generated adversarial set and invalid UTF-8, for
GPT-2 (vocab+merges and tokenizer.json forms, plus HFGPT2Tokenizer) and GPT-NeoX-20B. Each file is
its representative slice (tokenizer_corpus.representative_documents: the first 20,000 characters and
every later line bringing a character class or a longer whitespace, word or punctuation run): it
reaches the same lines and branches of lib/tokenizer as the whole file but for two that only size
reaches, which one more document reaches: the corpus's first 50,000 distinct words (measured with
gcov: bench/tokenizer_slice_coverage.sh, docs/tokenizers.md). 600K characters where the files hold
8.7M."""
import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus as tc  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir(tc.SHARED), reason=f"{tc.SHARED} is absent")


@pytest.fixture(scope="module")
def corpus():
    if not os.path.exists(tc.PREPROCESS):
        pytest.skip(f"{tc.PREPROCESS} is not built (run make)")
    docs = []
    for name, items in sorted(tc.representative_documents().items()):
        docs += [(name, d) for d in items]
    docs += [("adversarial", d) for d in tc.adversarial_documents()]
    if not os.environ.get("NEOX_FULL_CORPUS"):  # (the whole corpus has its long documents)
        docs.append(("distinct-words", tc.distinct_words_document()))
    return docs


def first_mismatch(names, docs, got, want):
    for name, d, g, w in zip(names, docs, got, want):
        if g != w:
            i = next((k for k in range(min(len(g), len(w))) if g[k] != w[k]), min(len(g), len(w)))
            return f"{name}: {d[:200]!r}...: first difference at id {i}: neox.c {g[i:i+8]} vs reference {w[i:i+8]}"
    return None


# GPT-NeoX's own GPT2BPETokenizer matches no special tokens in text: HF's BPE without added tokens.
REFERENCES = {
    "GPT2BPETokenizer": lambda: tc.hf_gpt2_from_files(),
    "HFGPT2Tokenizer": lambda: tc.hf_gpt2_from_files(pad=True),
    "gpt2-json": lambda: tc.hf_from_json(tc.GPT2_JSON),
    "20B": lambda: tc.hf_from_json(tc.NEOX_JSON),
}


@functools.lru_cache(maxsize=None)
def reference_ids(kind, docs):
    """The reference's ids for DOCS (a tuple), computed once per kind: the corpus test and the decode
    test share them (HF encodes the corpus's megabyte documents slowly)."""
    return [e.ids for e in REFERENCES[kind]().encode_batch(list(docs))]


@pytest.mark.parametrize("kind", sorted(REFERENCES))
def test_corpus_matches_hf_tokenizers(kind, corpus):
    names, docs = [n for n, _ in corpus], [d for _, d in corpus]
    want = reference_ids(kind, tuple(docs))
    got = tc.neox_encode_many(tc.neox_args(kind), docs)
    assert first_mismatch(names, docs, got, want) is None, first_mismatch(names, docs, got, want)


def test_corpus_matches_tiktoken(corpus):
    enc = tc.tiktoken_gpt2()
    names, docs = [n for n, _ in corpus], [d for _, d in corpus]
    want = enc.encode_ordinary_batch(docs, num_threads=2)
    got = tc.neox_encode_many(tc.neox_args("GPT2BPETokenizer"), docs)
    assert first_mismatch(names, docs, got, want) is None, first_mismatch(names, docs, got, want)


@pytest.mark.parametrize("kind", ["GPT2BPETokenizer", "20B"])
def test_invalid_utf8_matches_hf_on_replaced_text(kind):
    """Invalid bytes: neox.c gets the raw bytes, HF gets what Python's decode('utf-8', 'replace')
    makes of them (docs/tokenizers.md explains why this is the right reference)."""
    if not os.path.exists(tc.PREPROCESS):
        pytest.skip("neox-preprocess is not built")
    ref = REFERENCES[kind]()
    raw = tc.invalid_utf8_documents()
    texts = [b.decode("utf-8", "replace") for b in raw]
    got = tc.neox_encode_many(tc.neox_args(kind), raw)
    want = [e.ids for e in ref.encode_batch(texts)]
    names = ["invalid-utf8"] * len(raw)
    assert first_mismatch(names, texts, got, want) is None, first_mismatch(names, texts, got, want)


def neox_decode_many(args, id_lists):
    import subprocess
    text = "".join(" ".join(map(str, ids)) + "\n" for ids in id_lists).encode()
    res = subprocess.run([tc.PREPROCESS, "decode", "--null"] + args, input=text, capture_output=True, check=True)
    return res.stdout.decode("utf-8").split("\0")[:-1]


@pytest.mark.parametrize("kind", sorted(REFERENCES))
def test_decode_matches_hf_and_round_trips(kind, corpus):
    """decode(ids) equals HF's decode of the same ids (HFGPT2Tokenizer keeps special tokens, as
    transformers' decode does by default), and decode(encode(x)) == x (NFC(x) for 20B) for text
    without special tokens."""
    import unicodedata
    ref = REFERENCES[kind]()
    everything = [d for _, d in corpus]
    ids_of = dict(zip(everything, reference_ids(kind, tuple(everything))))
    docs = [d for d in everything if "\0" not in d]  # NUL separates the decoded texts
    ids = [ids_of[d] for d in docs]
    got = neox_decode_many(tc.neox_args(kind), ids)
    want = ref.decode_batch(ids, skip_special_tokens=(kind != "HFGPT2Tokenizer"))
    assert len(got) == len(want)
    bad = [(d, g, w) for d, g, w in zip(docs, got, want) if g != w]
    assert not bad, f"{len(bad)} decodes differ from HF; first: {bad[0]!r}"[:2000]
    for d, g in zip(docs, got):
        if kind != "GPT2BPETokenizer" and ("<|endoftext|>" in d or "<|padding|>" in d):
            continue
        assert g == (unicodedata.normalize("NFC", d) if kind == "20B" else d), f"round trip of {d[:200]!r}"
