"""bench/preprocess_python.py: a Python pipeline equivalent to GPT-NeoX's tools/datasets/preprocess_data.py
for benchmarking neox-preprocess: documents streamed from jsonl(.zst/.gz) files, a multiprocessing
pool tokenizing with Hugging Face `tokenizers` (imap, chunksize 25, as preprocess_data.py), and a
numpy MMIDIDX writer (one np.array per document, as MMapIndexedDatasetBuilder.add_item).
Usage: preprocess_python.py --input A,B --tokenizer FILE --output-prefix P --workers N
Prints one line: docs=N bytes=N tokens=N seconds=S"""
import argparse
import gzip
import io
import json
import multiprocessing
import os
import struct
import time

import numpy as np


def stream(paths):
    for path in paths:
        with open(path, "rb") as raw:
            head = raw.read(4)
            raw.seek(0)
            if head == b"\x28\xb5\x2f\xfd":
                import zstandard
                fh = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), encoding="utf-8")
            elif head[:2] == b"\x1f\x8b":
                fh = io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8")
            else:
                fh = io.TextIOWrapper(raw, encoding="utf-8")
            for line in fh:
                if line.strip():
                    text = json.loads(line)["text"]
                    if isinstance(text, list):
                        text = "\n\n".join(text)
                    if text:
                        yield text


class Encoder:
    def __init__(self, tokenizer_file):
        self.tokenizer_file = tokenizer_file

    def initializer(self):
        from tokenizers import Tokenizer
        Encoder.tok = Tokenizer.from_file(self.tokenizer_file)
        Encoder.eod = Encoder.tok.token_to_id("<|endoftext|>")

    def encode(self, text):
        ids = Encoder.tok.encode(text).ids
        ids.append(Encoder.eod)
        return ids, len(text.encode("utf-8"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--output-prefix", required=True)
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    start = time.time()
    enc = Encoder(a.tokenizer)
    from tokenizers import Tokenizer
    dtype = np.uint16 if Tokenizer.from_file(a.tokenizer).get_vocab_size() < 65500 else np.int32
    pool = multiprocessing.Pool(a.workers, initializer=enc.initializer)
    docs = nbytes = ntokens = 0
    sizes = []
    with open(a.output_prefix + ".bin", "wb") as out:
        for ids, size in pool.imap(enc.encode, stream(a.input.split(",")), 25):
            out.write(np.array(ids, dtype=dtype).tobytes(order="C"))
            sizes.append(len(ids))
            docs += 1
            nbytes += size
            ntokens += len(ids)
    pool.close()
    sizes = np.array(sizes, dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * np.dtype(dtype).itemsize)
    with open(a.output_prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8 if dtype == np.uint16 else 4, len(sizes), len(sizes) + 1))
        f.write(sizes.tobytes() + pointers.tobytes() + np.arange(len(sizes) + 1, dtype=np.int64).tobytes())
    print(f"docs={docs} bytes={nbytes} tokens={ntokens} seconds={time.time() - start:.3f}")


if __name__ == "__main__":
    main()
