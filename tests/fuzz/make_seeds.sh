#!/usr/bin/env bash
# tests/fuzz/make_seeds.sh: builds the seed inputs of tests/fuzz/corpus/<target>/ from ../shared/data
# (cut down to a few kB each: the whole corpus stays a few hundred kB) and from what the tools write
# (a tiny checkpoint: its manifest, state and shard layout, its Hugging Face export). Run once after
# `make tools`; the fuzz runs then add the inputs that reach new code (tests/fuzz/fuzz.sh -merge).
#   tests/fuzz/make_seeds.sh [OUT_DIR]   (default tests/fuzz/corpus)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-tests/fuzz/corpus}
DATA=${NEOX_TEST_DATA:-../shared/data}
BIN=${NEOX_BIN:-build/cpu/bin}
PY=.venv/bin/python
W=$(mktemp -d "${TMPDIR:-/tmp}/neox-seeds.XXXXXX")
trap 'rm -rf "$W"' EXIT
for t in yaml_config tokenizer_json gpt2_vocab indexed npy shard manifest state_json safetensors documents \
         text_document hf_config chat_template serve_request spm_model_proto pt; do mkdir -p "$OUT/$t"; done
# The chat templates the oracle test renders (Llama 3, ChatML/Qwen2, Zephyr, Mistral, every construct).
cp tests/oracle/chat_templates/*.jinja "$OUT/chat_template/"

cp configs/tiny-test.yml configs/tiny-shakespeare.yml "$OUT/yaml_config/"
cp ../shared/reference/gpt-neox-configs/125M.yml "$OUT/yaml_config/" 2>/dev/null || true

# A tiny character-level run: 4 iterations, a checkpoint, its export.
head -c 20000 "$DATA/text/tinyshakespeare_input.txt" | $PY -c '
import json, sys
for para in sys.stdin.read().split("\n\n"):
    if para.strip(): print(json.dumps({"text": para}))' >"$W/corpus.jsonl"
"$BIN/neox-preprocess" --input "$W/corpus.jsonl" --output-prefix "$W/char" --tokenizer-type CharLevelTokenizer \
    --append-eod >/dev/null
cat >"$W/run.yml" <<YML
{"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 16, "max_position_embeddings": 16,
 "pos_emb": "rotary", "no_weight_tying": true, "train_micro_batch_size_per_gpu": 2, "train_iters": 4,
 "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "data_path": "$W/char_text_document",
 "tokenizer_type": "CharLevelTokenizer", "save": "$W/ckpt", "checkpoint_factor": 4, "log_dir": "$W/logs"}
YML
"$BIN/neox-train" "$W/run.yml" >/dev/null 2>&1
"$BIN/neox-convert" to-hf --input "$W/ckpt" --output "$W/hf" >/dev/null
cp "$W/ckpt/global_step4/manifest.json" "$OUT/manifest/trained.json"
# The stored run state, as raw bytes (h5dump's binary output of the byte string).
h5dump -b -d state/train.json -o "$W/state.bin" "$W/ckpt/global_step4/rank_00000.h5" >/dev/null
$PY - "$W" "$OUT" "$DATA" <<'PY'
import gzip, json, os, struct, sys
import numpy as np, zstandard
w, out, data = sys.argv[1:]
def put(target, name, content):
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode())
put("state_json", "trained.json", open(f"{w}/state.bin", "rb").read())
put("hf_config", "exported.json", open(f"{w}/hf/config.json", "rb").read())
put("safetensors", "exported.safetensors", open(f"{w}/hf/model.safetensors", "rb").read())
# The indexed dataset the run trained on (149 documents, 40 kB), and the header of Megatron's test .idx.
idx, binf = open(f"{w}/char_text_document.idx", "rb").read(), open(f"{w}/char_text_document.bin", "rb").read()
put("indexed", "preprocessed", idx + b"\n=====\n" + binf)
meg = open(f"{data}/megatron/megatron_test_text_document.idx", "rb").read()
put("indexed", "megatron_header", meg[:34 + 4 * 8 + 8 * 8 + 8 * 3])
# A float32 reward dataset (dtype code 6), one reward per document, as KTO reads them.
rw = np.array([1.0, -1.0, 0.75], dtype=np.float32)
head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 6, 3, 4)
put("indexed", "float32_rewards", head + np.ones(3, np.int32).tobytes() + np.arange(0, 12, 4, dtype=np.int64).tobytes()
    + np.arange(4, dtype=np.int64).tobytes() + b"\n=====\n" + rw.tobytes())
# GPT-NeoX's three cache arrays, as numpy.save writes them.
for name, arr in [("doc_idx", np.arange(7, dtype=np.int32)), ("sample_idx", np.array([[0, 0], [1, 3], [2, 5]], dtype=np.int32)),
                  ("shuffle_idx", np.array([2, 0, 1], dtype=np.int64)), ("u4", np.array([1, 2], dtype=np.uint32))]:
    np.save(f"{w}/{name}.npy", arr)
    put("npy", name + ".npy", open(f"{w}/{name}.npy", "rb").read())
# Tokenizers cut down to the byte alphabet and their first merges.
tok = json.load(open(f"{data}/tokenizers/neox/20B_tokenizer.json"))
merges = [m for m in tok["model"]["merges"][:60]]
vocab = {k: v for k, v in tok["model"]["vocab"].items() if v < 256}
for m in merges:
    a, b = m.split(" ") if isinstance(m, str) else m
    vocab.setdefault(a + b, len(vocab) + 1000)
tok["model"]["merges"], tok["model"]["vocab"] = merges, vocab
tok["added_tokens"] = tok["added_tokens"][:3]
put("tokenizer_json", "neox_small.json", json.dumps(tok))
gv = json.load(open(f"{data}/tokenizers/gpt2/vocab.json"))
lines = open(f"{data}/tokenizers/gpt2/merges.txt").read().split("\n")[:41]
small = {k: v for k, v in gv.items() if v < 256}
for m in lines[1:]:
    small.setdefault(m.replace(" ", ""), len(small))
small["<|endoftext|>"] = len(small)
put("gpt2_vocab", "gpt2_small", json.dumps(small) + "\n=====\n" + "\n".join(lines) + "\n")
# Corpus files: a few documents plain, zstd and gzip compressed, and txt documents.
docs = gzip.open(f"{data}/jsonl/dolma_cc_sample_697docs.jsonl.gz").read().split(b"\n")[:3]
plain = b"\n".join(json.dumps({"text": json.loads(d)["text"][:600], "meta": {"i": i}}).encode() for i, d in enumerate(docs)) + b"\n"
put("documents", "dolma.jsonl", plain)
put("documents", "dolma.jsonl.zst", zstandard.ZstdCompressor().compress(plain))
put("documents", "dolma.jsonl.gz", gzip.compress(plain))
put("documents", "list_text.jsonl", json.dumps({"text": ["a", "b"]}) + "\n" + "{\"text\": 3}\n")
put("text_document", "enwik8.txt", open(f"{data}/text/enwik8_first100.txt", "rb").read()[:2000])
put("text_document", "empty.txt", b"")
# Shard layouts: the trainer's pieces (blocks of a weight, a range of a flat state, byte strings).
put("shard", "trained_layout", "block params/embed dims=4,8 shape=8,8 offset=0,0\n"
    "block params/embed dims=4,8 shape=8,8 offset=4,0\nrange optim/exp_avg dims=10 shape=4,5 start=10\n"
    "range optim/exp_avg dims=10 shape=4,5 start=0\nbytes state/train.json dims=17\nblock params/scale shape=\n")
put("shard", "column_blocks", "block w dims=3,2 shape=3,4 offset=0,0\nblock w dims=3,2 shape=3,4 offset=0,2\n"
    "range w2 dims=12 shape=3,4 start=0\nblock b dims=4 shape=4 offset=0\n")
# /v1/completions bodies as lm-eval's local-completions sends them (loglikelihood: token ids,
# echo + logprobs, one token; generate_until: text, stop sequences), and the other fields.
for name, body in [
        ("lm_eval_loglikelihood", {"model": "neox", "prompt": [[510, 3158, 8516, 30013], [510, 3158, 32449]],
                                   "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}),
        ("lm_eval_generate", {"prompt": ["Question: What is 2 + 2?\nAnswer:"], "model": "neox", "max_tokens": 256,
                              "temperature": 0, "stop": ["\n\n", "Question:"], "seed": 1234}),
        ("greedy_batch", {"prompt": ["ROMEO:", "JULIET:"], "max_tokens": 20, "temperature": 0}),
        ("sampled", {"prompt": "To be, or not", "max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "top_k": 40,
                     "seed": 7, "n": 2, "stop": "\n"}),
        ("top_logprobs", {"prompt": "ROMEO: ", "max_tokens": 1, "temperature": 0, "logprobs": 5, "echo": True}),
        ("stream_refused", {"prompt": "a", "stream": False, "logprobs": None, "top_p": None})]:
    put("serve_request", name + ".json", json.dumps(body))
PY
# The other tokenizer kinds (tokenizer.json families, tiktoken, SentencePiece), trained small.
$PY tests/fuzz/tokenizer_seeds.py "$OUT/tokenizer_json" "$DATA"
cp "$OUT"/tokenizer_json/*.model "$OUT/spm_model_proto/"
# PyTorch .pt files as GPT-NeoX's checkpoints hold them, written by torch.save.
$PY tests/fuzz/pt_seeds.py "$OUT/pt"
ls -R "$OUT" | head -50
du -sh "$OUT"
