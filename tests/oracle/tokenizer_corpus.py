"""tokenizer_corpus.py: texts for the tokenizer oracle tests and benchmark — every text file and
jsonl document in ../shared/data plus a generated adversarial set — and the independent reference
tokenizers (HF `tokenizers`, `tiktoken`), all built offline from the local files."""
import functools
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import unicodedata

SHARED = os.path.join("..", "shared", "data")
TOK = os.path.join(SHARED, "tokenizers")
GPT2_VOCAB = os.path.join(TOK, "gpt2", "vocab.json")
GPT2_MERGES = os.path.join(TOK, "gpt2", "merges.txt")
GPT2_JSON = os.path.join(TOK, "gpt2", "gpt2_tokenizer.json")
NEOX_JSON = os.path.join(TOK, "neox", "20B_tokenizer.json")
NEOX_BIN = os.environ.get("NEOX_BIN", "build/cpu/bin")
PREPROCESS = os.path.join(NEOX_BIN, "neox-preprocess")

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _jsonl(lines, keys=("text",)):
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        ob = json.loads(line)
        for k in keys:
            if isinstance(ob.get(k), str):
                out.append(ob[k])
    return out


def _read(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def corpus_documents():
    """{name: [documents]} of every text in ../shared/data (strings)."""
    return {name: list(items) for name, items in _corpus_documents().items()}


@functools.lru_cache(maxsize=None)
def _corpus_documents():  # (read once a process: the parity and families fixtures all start from it)
    docs = {}
    for rel in ["text/tinyshakespeare_input.txt", "text/enwik8_first100.txt", "eval/wikitext-2_wiki.test.tokens",
                "eval/wikitext-2-raw_test_hfrows_crlf.raw", "vectors/ggml_prompts_test-cases.txt"]:
        docs[rel] = [_read(os.path.join(SHARED, rel))]
    docs["eval/lambada_test.jsonl"] = _jsonl(_read(os.path.join(SHARED, "eval/lambada_test.jsonl")).splitlines())
    docs["eval/piqa_valid.jsonl"] = _jsonl(_read(os.path.join(SHARED, "eval/piqa_valid.jsonl")).splitlines(),
                                           ("goal", "sol1", "sol2"))
    with gzip.open(os.path.join(SHARED, "jsonl/dolma_cc_sample_697docs.jsonl.gz"), "rt", encoding="utf-8") as f:
        docs["jsonl/dolma_cc_sample_697docs.jsonl.gz"] = _jsonl(f)
    if shutil.which("zstd"):
        raw = subprocess.run(["zstd", "-dc", os.path.join(SHARED, "jsonl/lmd_blns.jsonl.zst")], check=True,
                             capture_output=True).stdout
        docs["jsonl/lmd_blns.jsonl.zst"] = _jsonl(raw.decode("utf-8").splitlines())
    inp = _read(os.path.join(SHARED, "vectors/llamacpp_vocab_tests.inp"))
    docs["vectors/llamacpp_vocab_tests.inp"] = inp.split("\n__ggml_vocab_test__\n")
    return docs


@functools.lru_cache(maxsize=None)
def _char_class(c):
    """A character's Unicode general category and UTF-8 length: what the pre-tokenizers' classes
    (\\p{L}, \\p{N}, \\s, the rest), the normalizers and the byte-level map branch on."""
    o = ord(c)
    return unicodedata.category(c), 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4


@functools.lru_cache(maxsize=None)
def _run_of(kind, n):
    return re.compile(f"{kind}{{{n}}}")


def _longest_run(kind, text, at_least):
    """The longest run of the class KIND in TEXT when it is longer than AT_LEAST, else AT_LEAST
    (searches for a longer run only: most lines hold none)."""
    while m := _run_of(kind, at_least + 1).search(text):
        at_least = len(re.compile(kind + "+").match(text, m.start()).group())
    return at_least


# Runs whose length reaches different pre-token, merge and cut paths: whitespace (\s+(?!\S)),
# letters and digits (long words), punctuation and symbols.
_RUN_KINDS = (r"\s", r"\w", r"[^\s\w]")


def _representative(docs, budget):
    """The lines of DOCS (kept whole with their ends, in order, each document rebuilt from its kept
    lines) up to BUDGET characters, then every later line that brings a character class or a run
    longer than those kept: a slice that reaches what the whole file reaches, at a fraction of it."""
    classes, longest, out, size = set(), dict.fromkeys(_RUN_KINDS, 0), [], 0
    for doc in docs:
        kept = []
        for line in doc.splitlines(keepends=True):
            line_classes = {_char_class(c) for c in set(line)}
            runs = {k: _longest_run(k, line, longest[k]) for k in _RUN_KINDS}
            if size < budget or not line_classes <= classes or runs != longest:
                kept.append(line)
                size += len(line)
                classes |= line_classes
                longest = runs
        if kept or not doc:  # (an empty document stays: it is one)
            out.append("".join(kept))
    return out


def distinct_words_document(count=50_000):
    """One document of the corpus's first COUNT distinct words (\\w+, in the order they first
    appear), a space between each: what slices lack and the whole corpus reaches — a document over
    64 KiB (lib/tokenizer/tokenizer.c: the words of a long text in a team of threads become tasks)
    and more distinct words than a thread's BPE word cache holds (lib/tokenizer/bpe.c: 24,576; the
    cache is cleared and filled again)."""
    words = {}
    for _, items in sorted(corpus_documents().items()):
        for doc in items:
            words.update(dict.fromkeys(re.findall(r"\w+", doc)))
            if len(words) >= count:
                return " ".join(list(words)[:count])
    return " ".join(words)


def representative_documents(budget=20_000):
    """{name: [documents]}: every file of corpus_documents() cut to its first BUDGET characters plus
    each later line with a character class (Unicode category x UTF-8 length) or a whitespace, word
    or punctuation run longer than any kept before (see _representative). The tests that check every
    tokenizer form on the corpus use it; the whole files stay for the benchmarks, and for those tests
    with NEOX_FULL_CORPUS=1 in the environment."""
    if os.environ.get("NEOX_FULL_CORPUS"):
        return corpus_documents()
    return {name: _representative(items, budget) for name, items in corpus_documents().items()}


def adversarial_documents(seed=1234, count=400):
    """Generated hostile text (str): emoji/ZWJ, combining marks, CJK, RTL, odd spaces, controls,
    whitespace runs, long words, numbers, contractions and added-token look-alikes."""
    rng = random.Random(seed)
    pieces = [
        "👨‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🇩🇪", "e\u0301", "a\u0308\u0323", "Å", "ﬁ", "①②", "Ⅻ", "²³", "½",
        "漢字かなカナ", "한국어", "العربية", "עִבְרִית", "ไทย", "हिन्दी", "\u200b", "\u200d", "\u200c", "\ufeff",
        "\u00a0", "\u2009", "\u3000", "\u1680", "\u2028", "\u2029", "\u0085", "\u180e", "\x0b", "\x0c", "\x1c",
        "\x1f", "\x00", "\x07", "\x7f", "\t", "\n", "\r\n", " ", "  ", "   ", "'s", "'t", "'re", "'ve", "'m",
        "'ll", "'d", "'S", "''", "'", "n't", "<|endoftext|>", "<|padding|>", "<|endoftext", "|>", "12345",
        "3.14159", "1,000,000", "٣٤٥", "０１２", "hello", "World", "ÀÉÎÕÜ", "ǅ", "ß", "İstanbul", "$", "€100",
        "...", "—", "«»", "\\", "\"", "#!", "@user", "x" * 300, "ab" * 200, "🙂" * 50, "\ufffd", "\U0001f600",
        "\U00010348", "\ue000", "\U000e0041", "\u0378",
    ]
    docs = []
    for _ in range(count):
        n = rng.randint(1, 30)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.6:
                parts.append(rng.choice(pieces))
            elif r < 0.8:
                parts.append(rng.choice([" ", "\t", "\n", "\u00a0", "\u3000"]) * rng.randint(1, 40))
            else:
                parts.append("".join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                                     rng.randint(0x3000, 0xd7ff), rng.randint(0xe000, 0x10ffff)]))
                                     for _ in range(rng.randint(1, 12))))
        docs.append("".join(parts))
    docs += ["", " ", "  ", "\n", "\n\n\n", " \n ", "a", "'", "'s", " 's", "   a", "\t\ta", "a  ", "x" * 20000,
             " " * 1000, "\n" * 500 + "end", "9" * 5000]
    return docs


def invalid_utf8_documents(seed=99, count=60):
    """Byte strings that are not valid UTF-8 (truncated sequences, surrogates, overlongs, stray
    continuation bytes, bytes 0xF5..0xFF)."""
    rng = random.Random(seed)
    bad = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xf4\x90\x80\x80",
           b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xc3\x28", b"\xa0\xa1"]
    good = [b"hello", b" world", "é".encode(), "😀".encode(), b"  ", b"\n", b"'s", b"123", "漢".encode()]
    docs = []
    for _ in range(count):
        docs.append(b"".join(rng.choice(bad if rng.random() < 0.4 else good) for _ in range(rng.randint(1, 12))))
    return docs + bad


# ---------------------------------------------------------------------------------------------
# Reference tokenizers.
def hf_gpt2_from_files(pad=False):
    """GPT-2 from vocab.json + merges.txt in HF tokenizers, as GPT2TokenizerFast sets it up; with
    pad, <|padding|> added as GPT-NeoX's HFGPT2Tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(GPT2_VOCAB, GPT2_MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if pad:
        tok.add_special_tokens(["<|endoftext|>", "<|padding|>"])
    return tok


def hf_from_json(path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path)


def bytelevel_decoder_map():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_gpt2():
    """tiktoken's gpt2 Encoding built from the local vocab.json (mergeable ranks = ids), nothing
    downloaded."""
    import tiktoken
    dec = bytelevel_decoder_map()
    with open(GPT2_VOCAB, encoding="utf-8") as f:
        vocab = json.load(f)
    ranks = {bytes(dec[c] for c in tok): i for tok, i in vocab.items() if tok != "<|endoftext|>"}
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": vocab["<|endoftext|>"]})


# ---------------------------------------------------------------------------------------------
# neox.c through its CLI.
def neox_args(kind):
    if kind in ("GPT2BPETokenizer", "HFGPT2Tokenizer"):
        return ["--tokenizer-type", kind, "--vocab-file", GPT2_VOCAB, "--merge-file", GPT2_MERGES]
    if kind == "gpt2-json":
        return ["--tokenizer-type", "HFTokenizer", "--vocab-file", GPT2_JSON]
    if kind == "20B":
        return ["--tokenizer-type", "HFTokenizer", "--vocab-file", NEOX_JSON]
    return ["--tokenizer-type", "HFTokenizer", "--vocab-file", kind]


def neox_encode_many(args, docs):
    """Encodes each document (str or bytes) with `neox-preprocess encode --null`; documents holding a
    NUL byte are encoded one at a time."""
    blobs = [d.encode("utf-8") if isinstance(d, str) else d for d in docs]
    out = [None] * len(blobs)
    batch = [i for i, b in enumerate(blobs) if b"\0" not in b]
    if batch:
        res = subprocess.run([PREPROCESS, "encode", "--null"] + args, input=b"\0".join(blobs[i] for i in batch),
                             capture_output=True, check=True)
        lines = res.stdout.decode().split("\n")[:-1]
        # --null reads separators, so a trailing empty document is not a document: pad with [].
        for j, i in enumerate(batch):
            out[i] = [int(x) for x in lines[j].split()] if j < len(lines) else []
    for i, b in enumerate(blobs):
        if out[i] is None:
            res = subprocess.run([PREPROCESS, "encode"] + args, input=b, capture_output=True, check=True)
            out[i] = [int(x) for x in res.stdout.split()]
    return out
