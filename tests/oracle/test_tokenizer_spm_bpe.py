"""SentencePiece BPE models: neox.c's ids (lib/tokenizer/spm_bpe.c) against PyPI's `sentencepiece`
(its release in .venv) on every text in ../shared/data, the hostile set and invalid UTF-8, whole files
as single documents and runs of one character, for models this test trains with sentencepiece's own
trainer in several configurations (byte fallback on and off, nmt_nfkc / identity / nmt_nfkc_cf
normalization with and without the dummy prefix and the whitespace clean-up, user-defined and
control symbols, split_digits, whitespace as suffix, pieces across words) and for trained models edited so that many
pairs tie on score or some merged pieces are unused (re-split into the pair that formed them).
Decoding the oracle's ids is compared with the oracle's decode."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus as tc  # noqa: E402
from test_tokenizer_families import (TRAIN_TEXT, check_encode_decode, corpus,  # noqa: E402,F401 (fixtures)
                                     first_mismatch, hard_corpus)
from test_tokenizer_unigram import lines, long_documents  # noqa: E402,F401 (fixtures)

pytestmark = pytest.mark.skipif(not os.path.exists(TRAIN_TEXT), reason=f"{TRAIN_TEXT} is absent")

# name: the trainer's options beyond model_type=bpe.
CONFIGS = {
    "nfkc_1200_byte_fallback": dict(vocab_size=1200, byte_fallback=True),
    "nfkc_3000": dict(vocab_size=3000),
    "identity_raw_spaces": dict(vocab_size=2000, normalization_rule_name="identity", add_dummy_prefix=False,
                                remove_extra_whitespaces=False),
    "user_symbols_split_digits": dict(vocab_size=1500, split_digits=True, control_symbols=["<ctl>"],
                                      user_defined_symbols=["<|endoftext|>", "[MASK]", "--", "the", "ing", "▁▁"]),
    # Pieces across words ("s▁the"): the text is merged whole, never in words.
    "no_whitespace_split": dict(vocab_size=1500, split_by_whitespace=False, byte_fallback=True),
    "nfkc_cf_suffix_byte_fallback": dict(vocab_size=800, normalization_rule_name="nmt_nfkc_cf", byte_fallback=True,
                                         treat_whitespace_as_suffix=True, user_defined_symbols=["http", "://"]),
}


def bucket_scores(proto):
    """Normal pieces' scores rounded down to multiples of 50: trained BPE scores are all distinct,
    so this makes different pieces tie, and the leftmost pair must win."""
    for p in proto.pieces:
        if p.type == p.NORMAL:
            p.score = float(int(p.score // 50) * 50)


def unuse_pieces(proto):
    """Every third normal piece of two or more characters becomes unused: merges still form it,
    then it is split back into the pair that formed it."""
    k = 0
    for p in proto.pieces:
        if p.type == p.NORMAL and len(p.piece) >= 2:
            k += 1
            if k % 3 == 0:
                p.type = p.UNUSED


# name: (the trained configuration, the edit of its ModelProto).
EDITED = {"bucketed_scores": ("nfkc_1200_byte_fallback", bucket_scores),
          "unused_pieces": ("nfkc_1200_byte_fallback", unuse_pieces),
          "unused_bucketed_user_symbols": ("user_symbols_split_digits",
                                           lambda p: (bucket_scores(p), unuse_pieces(p)))}
ALL = sorted(CONFIGS) + sorted(EDITED)


@pytest.fixture(scope="module")
def train(lines, tmp_path_factory):
    """train(name) -> (model path, oracle processor), each model built once."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    tmp, models = tmp_path_factory.mktemp("spm_bpe"), {}

    def get(name):
        if name in models:
            return models[name]
        prefix = str(tmp / name)
        if name in CONFIGS:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=prefix, model_type="bpe",
                                           character_coverage=0.995, minloglevel=2, num_threads=2, **CONFIGS[name])
        else:
            base, change = EDITED[name]
            proto = model_pb2.ModelProto()
            with open(get(base)[0], "rb") as f:
                proto.ParseFromString(f.read())
            change(proto)
            with open(prefix + ".model", "wb") as f:
                f.write(proto.SerializeToString())
        models[name] = prefix + ".model", spm.SentencePieceProcessor(model_file=prefix + ".model")
        return models[name]
    return get


def spm_args(path):
    return ["--tokenizer-type", "SPMTokenizer", "--vocab-file", path]


def assert_same_ids(path, sp, docs):
    got, want = tc.neox_encode_many(spm_args(path), docs), sp.encode(docs)
    assert first_mismatch(docs, got, want) is None, first_mismatch(docs, got, want)


@pytest.mark.parametrize("name", ALL)
def test_bpe_model_matches_sentencepiece(name, train, corpus):
    path, sp = train(name)
    check_encode_decode(spm_args(path), corpus, lambda ds: sp.encode(ds), lambda ids: sp.decode(ids))


@pytest.mark.parametrize("name", ["nfkc_1200_byte_fallback", "unused_bucketed_user_symbols"])
def test_hostile_texts_match_sentencepiece(name, train, hard_corpus):
    assert_same_ids(*train(name), hard_corpus)


def tie_documents():
    """Runs of one character and of short repeated strings: the same piece fits at overlapping
    places, and the leftmost must be merged first."""
    runs = [c * n for c in "0-x=.!a e" for n in range(1, 40)]
    return runs + [s * n for s in ["ab", "--=", "00.", "ee", "the ", "ing", "ss"] for n in (7, 50)]


@pytest.mark.parametrize("name", ALL)
def test_long_documents_and_ties_match_sentencepiece(name, train):
    """Whole files as single documents (one merge heap over hundreds of thousands of symbols)."""
    assert_same_ids(*train(name), long_documents() + tie_documents())


def test_user_defined_symbols_are_kept_whole(train):
    """A user-defined symbol inside text is never merged with its neighbours."""
    path, sp = train("user_symbols_split_digits")
    text = "a[MASK]b<|endoftext|>c the ingthe --- 12345"
    got = tc.neox_encode_many(spm_args(path), [text])[0]
    assert sp.piece_to_id("[MASK]") in got and sp.piece_to_id("<|endoftext|>") in got
    assert got == sp.encode(text)


def test_unused_pieces_never_come_out(train):
    """The edited model's unused pieces are matched by merges (the oracle agrees on every text
    above) but never emitted."""
    path, sp = train("unused_pieces")
    unused = {i for i in range(sp.get_piece_size()) if sp.is_unused(i)}
    assert unused
    docs = tc.corpus_documents()["text/tinyshakespeare_input.txt"][0][:100000].split("\n")
    got = tc.neox_encode_many(spm_args(path), docs)
    assert not unused & {i for ids in got for i in ids}
    assert got == sp.encode(docs)


def test_unknown_characters_with_and_without_byte_fallback(train):
    """Characters outside the vocabulary: byte pieces with byte_fallback, else one unknown id per
    run of them."""
    text = "a\u4e00\u4e01b \U0001f600\U0001f601 c\u0800"
    for name in ("nfkc_1200_byte_fallback", "nfkc_3000"):
        path, sp = train(name)
        got = tc.neox_encode_many(spm_args(path), [text])[0]
        assert got == sp.encode(text), name
        if name == "nfkc_3000":
            assert sp.unk_id() in got
        else:
            assert sp.piece_to_id("<0xE4>") in got and sp.unk_id() not in got


def unused_piece_texts(sp, count=3000, seed=7):
    """Random strings over the letters of unused pieces that two pairs of pieces can form, alone and
    joined into longer texts: the unused piece is formed, re-split, or blocked by its neighbours."""
    import random
    rng = random.Random(seed)
    pieces = {sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_unused(i)}
    alphabets = []
    for i in range(sp.get_piece_size()):
        u = sp.id_to_piece(i)
        if sp.is_unused(i) and sum(u[:k] in pieces and u[k:] in pieces for k in range(1, len(u))) >= 2:
            alphabets.append(u.replace("▁", " "))
    assert alphabets
    texts = []
    for _ in range(count):
        letters = rng.choice(alphabets) + rng.choice(alphabets)
        texts.append("".join(rng.choice(letters) for _ in range(rng.randint(3, 40))))
    return texts + [" ".join(texts[k:k + 50]) for k in range(0, len(texts), 50)]


@pytest.mark.parametrize("name", ["unused_pieces", "unused_bucketed_user_symbols"])
def test_texts_around_unused_pieces_match_sentencepiece(name, train):
    path, sp = train(name)
    assert_same_ids(path, sp, unused_piece_texts(sp))
