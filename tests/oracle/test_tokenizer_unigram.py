"""SentencePiece unigram models: neox.c's ids against PyPI's `sentencepiece` (its release in .venv)
on every text in ../shared/data, the adversarial set and invalid UTF-8, for models this test trains
with sentencepiece's own trainer in several configurations (vocabulary sizes, byte fallback on and
off, nmt_nfkc / identity / nmt_nfkc_cf normalization with and without the dummy prefix and the
whitespace clean-up, user-defined and control symbols, split_digits, whitespace as suffix).
Decoding the oracle's ids is compared with the oracle's decode. Long documents check the score
rebasing of the lattice, the texts made of repeated pieces its ties."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus as tc  # noqa: E402
from test_tokenizer_families import (TRAIN_TEXT, check_encode_decode, corpus,  # noqa: E402,F401 (corpus: a fixture)
                                     first_mismatch, training_lines)

pytestmark = pytest.mark.skipif(not os.path.exists(TRAIN_TEXT), reason=f"{TRAIN_TEXT} is absent")

# name: the trainer's options beyond model_type=unigram.
CONFIGS = {
    "nfkc_1200": dict(vocab_size=1200),
    "nfkc_4000_byte_fallback": dict(vocab_size=4000, byte_fallback=True),
    "identity_raw_spaces": dict(vocab_size=2000, normalization_rule_name="identity", add_dummy_prefix=False,
                                remove_extra_whitespaces=False),
    "user_symbols_split_digits": dict(vocab_size=1500, split_digits=True, control_symbols=["<ctl>"],
                                      user_defined_symbols=["<|endoftext|>", "[MASK]", "--", "the", "ing", "▁▁"]),
    "nfkc_cf_suffix_byte_fallback": dict(vocab_size=800, normalization_rule_name="nmt_nfkc_cf", byte_fallback=True,
                                         treat_whitespace_as_suffix=True, user_defined_symbols=["http", "://"]),
}


@pytest.fixture(scope="module")
def lines():
    if not os.path.exists(tc.PREPROCESS):
        pytest.skip(f"{tc.PREPROCESS} is not built (run make)")
    # A quarter of the training set keeps each model's training to a few seconds.
    return [ln for ln in training_lines() if ln.strip()][::4]


@pytest.fixture(scope="module")
def train(lines, tmp_path_factory):
    """train(name) -> (model path, oracle processor), each configuration trained once."""
    import sentencepiece as spm
    tmp, models = tmp_path_factory.mktemp("unigram"), {}

    def get(name):
        if name not in models:
            prefix = str(tmp / name)
            spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=prefix, model_type="unigram",
                                           character_coverage=0.995, minloglevel=2, num_threads=2, **CONFIGS[name])
            models[name] = prefix + ".model", spm.SentencePieceProcessor(model_file=prefix + ".model")
        return models[name]
    return get


def spm_args(path):
    return ["--tokenizer-type", "SPMTokenizer", "--vocab-file", path]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_unigram_model_matches_sentencepiece(name, train, corpus):
    path, sp = train(name)
    check_encode_decode(spm_args(path), corpus, lambda ds: sp.encode(ds), lambda ids: sp.decode(ids))


def long_documents():
    """Whole files as single documents: their best paths score far below -1e5, where the lattice
    rebases its scores."""
    docs = tc.corpus_documents()
    return [docs["text/tinyshakespeare_input.txt"][0][:400000], docs["eval/wikitext-2_wiki.test.tokens"][0][:300000],
            "x" * 60000, " ".join(["---"] * 20000)]


def tie_documents():
    """Runs of one character and of short repeated strings: the segmentations of equal score that
    only the order of the float sums decides."""
    runs = [c * n for c in "0-x=.!a " for n in range(1, 40)]
    return runs + [s * n for s in ["ab", "--=", "00.", "ee"] for n in (7, 50)]


@pytest.mark.parametrize("name", ["nfkc_1200", "user_symbols_split_digits"])
def test_long_documents_and_ties_match_sentencepiece(name, train):
    path, sp = train(name)
    docs = long_documents() + tie_documents()
    got, want = tc.neox_encode_many(spm_args(path), docs), sp.encode(docs)
    assert first_mismatch(docs, got, want) is None, first_mismatch(docs, got, want)


def test_user_defined_symbols_are_kept_whole(train):
    """A user-defined symbol inside text comes out as its own id (sentencepiece's oracle agrees on
    every text above; this names the behaviour)."""
    path, sp = train("user_symbols_split_digits")
    text = "a[MASK]b<|endoftext|>c"
    got = tc.neox_encode_many(spm_args(path), [text])[0]
    assert sp.piece_to_id("[MASK]") in got and sp.piece_to_id("<|endoftext|>") in got
    assert got == sp.encode(text)


def test_damaged_model_is_refused_with_the_file_named(train, tmp_path):
    path, _ = train("nfkc_1200")
    with open(path, "rb") as f:
        data = f.read()
    bad = tmp_path / "cut.model"
    bad.write_bytes(data[: len(data) // 2])
    res = subprocess.run([tc.PREPROCESS, "encode"] + spm_args(str(bad)), input=b"x", capture_output=True)
    assert res.returncode != 0
    assert f"{bad}: not a SentencePiece model" in res.stderr.decode(), res.stderr
