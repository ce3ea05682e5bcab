"""bench/convert_model.py: writes a random GPTNeoXForCausalLM folder (config.json + model.safetensors,
fp32) of the requested size with numpy, for bench/convert.sh.
   convert_model.py DIR HIDDEN LAYERS VOCAB"""
import json
import sys

import numpy as np
from safetensors.numpy import save_file

out, hidden, layers, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
heads, ffn = hidden // 64, 4 * hidden
rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape, dtype=np.float32) * 0.02


t = {"gpt_neox.embed_in.weight": rand(vocab, hidden), "embed_out.weight": rand(vocab, hidden),
     "gpt_neox.final_layer_norm.weight": np.ones(hidden, np.float32),
     "gpt_neox.final_layer_norm.bias": np.zeros(hidden, np.float32)}
for i in range(layers):
    p = f"gpt_neox.layers.{i}."
    for ln in ("input_layernorm", "post_attention_layernorm"):
        t[p + ln + ".weight"], t[p + ln + ".bias"] = np.ones(hidden, np.float32), np.zeros(hidden, np.float32)
    t[p + "attention.query_key_value.weight"], t[p + "attention.query_key_value.bias"] = rand(3 * hidden, hidden), rand(3 * hidden)
    t[p + "attention.dense.weight"], t[p + "attention.dense.bias"] = rand(hidden, hidden), rand(hidden)
    t[p + "mlp.dense_h_to_4h.weight"], t[p + "mlp.dense_h_to_4h.bias"] = rand(ffn, hidden), rand(ffn)
    t[p + "mlp.dense_4h_to_h.weight"], t[p + "mlp.dense_4h_to_h.bias"] = rand(hidden, ffn), rand(hidden)
save_file(t, f"{out}/model.safetensors", metadata={"format": "pt"})
config = dict(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox", vocab_size=vocab, hidden_size=hidden,
              num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=2048,
              rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True, layer_norm_eps=1e-5,
              hidden_act="gelu", tie_word_embeddings=False)
with open(f"{out}/config.json", "w") as f:
    json.dump(config, f)
