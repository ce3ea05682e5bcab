"""`neox-preprocess train-tokenizer`: the written tokenizer.json loads in HF `tokenizers`, HF and
neox.c encode the corpora to the same ids with it, and it equals what HF's own BpeTrainer makes
with the same settings (GPT-NeoX's train_tokenizer.py: NFKC, ByteLevel with prefix space, special
tokens first; plus the full byte alphabet)."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus as tc  # noqa: E402

TEXT = os.path.join(tc.SHARED, "text", "tinyshakespeare_input.txt")
WIKI = os.path.join(tc.SHARED, "eval", "wikitext-2-raw_test_hfrows_crlf.raw")
pytestmark = pytest.mark.skipif(not os.path.exists(TEXT), reason=f"{TEXT} is absent")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    if not os.path.exists(tc.PREPROCESS):
        pytest.skip(f"{tc.PREPROCESS} is not built")
    out = str(tmp_path_factory.mktemp("train") / "tokenizer.json")
    subprocess.run([tc.PREPROCESS, "train-tokenizer", "--input", f"{TEXT},{WIKI}", "--vocab-size", "3000",
                    "--output", out], check=True, capture_output=True)
    return out


def test_trained_tokenizer_matches_hf_trainer(trained):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train([TEXT, WIKI], trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>", "<|padding|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                show_progress=False))
    want = json.loads(tok.to_str())["model"]
    with open(trained, encoding="utf-8") as f:
        got = json.load(f)["model"]
    assert got["vocab"] == want["vocab"]
    assert got["merges"] == [m if isinstance(m, str) else " ".join(m) for m in want["merges"]]


def test_trained_tokenizer_encodes_the_same_in_hf_and_neox(trained):
    ref = tc.hf_from_json(trained)
    assert ref.get_vocab_size() == 3000
    docs = [d for items in tc.corpus_documents().values() for d in items][:3000] + tc.adversarial_documents(count=150)
    want = [e.ids for e in ref.encode_batch(docs)]
    got = tc.neox_encode_many(tc.neox_args(trained), docs)
    bad = [(d, g, w) for d, g, w in zip(docs, got, want) if g != w]
    assert not bad, f"{len(bad)} documents differ; first: {bad[0]!r}"[:2000]
