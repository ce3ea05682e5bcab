# bench/llama_model.py: writes the generation benchmark's model, a Llama of SmolLM2-135M's shape
# (30 layers, hidden 576, 9 query heads and 3 key/value heads of 64, SwiGLU 1536, RMSNorm, tied
# embeddings) with transformers' random initialisation (seeded), as a Hugging Face folder with the
# GPT-2 tokenizer (vocab.json + merges.txt from the data folder), which both neox-convert from-hf and
# llama.cpp's convert_hf_to_gguf.py read. The vocabulary is 50304 rows (GPT-2's 50257 padded), as the
# earlier measurements used; SmolLM2's own is 49152.
# Usage: python bench/llama_model.py GPT2_TOKENIZER_DIR OUT_DIR [layers]
import json
import os
import sys

import torch
import transformers


def main():
    tok_dir, out = sys.argv[1], sys.argv[2]
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=50304, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                                   rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                                   bos_token_id=50256, eos_token_id=50256, torch_dtype="float32")
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(out, safe_serialization=True)
    tok = transformers.GPT2TokenizerFast(vocab_file=os.path.join(tok_dir, "vocab.json"),
                                         merges_file=os.path.join(tok_dir, "merges.txt"))
    tok.save_pretrained(out)
    # No beginning-of-sequence token before the prompt, in either program: GPT-NeoX adds none.
    path = os.path.join(out, "tokenizer_config.json")
    with open(path) as f:
        tc = json.load(f)
    tc["add_bos_token"] = False
    with open(path, "w") as f:
        json.dump(tc, f, indent=2)


if __name__ == "__main__":
    main()
