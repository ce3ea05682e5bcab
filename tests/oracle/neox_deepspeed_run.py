"""One rank of small GPT-NeoX training runs under DeepSpeed's own engine (on the CPU, gloo), for
tests/oracle/test_neox_checkpoints.py: a torch restatement of GPT-NeoX's model with GPT-NeoX's
parameter names (its PipelineModule's layers numbered as GPT-NeoX numbers them: 0 the embedding, 1
and L+2 functions without parameters, 2..L+1 the transformer layers, L+3 the final norm, L+4 the
output layer; each layer's attention carries GPT-NeoX's `rotary_emb.inv_freq` buffer, persistent as
with rotary_save_freqs_buffer unless a job says save_inv_freqs false), AdamW over GPT-NeoX's two
weight-decay groups, GPT-NeoX's AnnealingLR as the engine's scheduler. Each job of SPEC["jobs"] is
one configuration, run one after another in the same process (DeepSpeed's start-up paid once):
  - without a pipeline (`sequential.N` names), ZeRO stage 1 or 2 over the data-parallel ranks;
  - pp >= 1: GPT-NeoX's GPTModelPipe, a PipelineModule of LayerSpecs under DeepSpeed's PipelineEngine
    (tied: the embedding and output layer one TiedLayerSpec, GPT-NeoX's default weight tying);
  - tp > 1: Megatron's tensor-parallel layers restated (every rank one tensor-parallel rank), of the
    GPT-NeoX-style model or of the Llama-style one (GPT-NeoX's cuts of its QKV, with or without
    grouped-query attention, and of its gated linear1);
  - load: DeepSpeed's load_checkpoint of that directory (to-neox's files) before training on;
  - llama: GPT-NeoX's Llama-style model (its llama configs: norm rmsnorm, RMSNorm's `scale`, swiglu with
    `mlp.linear1` holding [x | gate] and `mlp.linear2`, no biases, rotary on the whole head, sequential
    residual, an untied output layer; grouped-query attention with model["kv_heads"]), restated in
    torch with GPT-NeoX's names.
A job trains `before` steps, saves with `engine.save_checkpoint` (GPT-NeoX's client state: the
iteration and the python, numpy and torch RNG states), trains `after` more steps and writes the losses
of every step to job["out"]/losses.json. Every sample is the same tokens (the test's corpus repeats
one document of seq_length tokens), so the batches do not depend on the sample order.
Each SPEC is a phase: the ranks wait for its file to appear (the test writes it once the phase's
inputs exist, the jobs of a later phase reading what the test made of an earlier one's files), run
its jobs, and rank 0 then writes SPEC.done, so DeepSpeed starts once for all of them.
  RANK=r WORLD_SIZE=n MASTER_PORT=p neox_deepspeed_run.py SPEC.json [SPEC.json...]"""
import json
import os
import random
import sys
import time

import numpy

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402
import deepspeed  # noqa: E402
# DeepSpeed's CPU shared-memory collectives are a C++ extension built at run time against torch's
# headers, which Debian's torch does not ship; without it DeepSpeed uses torch.distributed (gloo).
sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
# torch 1.13's gloo has no all_gather_into_tensor (_allgather_base): ZeRO then gathers the updated
# partitions with a list all_gather, DeepSpeed's own path for backends without it.
deepspeed.comm.has_all_gather_into_tensor = lambda: False
from transformers import GPTNeoXConfig  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer, GPTNeoXRotaryEmbedding  # noqa: E402
import test_model_parity as parity  # noqa: E402  (this folder is the script's: sys.path[0])


class EmbeddingPipe(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)

    @property
    def word_embeddings_weight(self):  # (the attribute GPT-NeoX's TiedLayerSpec names)
        return self.word_embeddings.weight

    def forward(self, ids):
        return self.word_embeddings(ids)


def tied_logits(embedding, h):  # GPT-NeoX's _logits_helper: the tied embedding as the output layer
    return torch.nn.functional.linear(h, embedding.word_embeddings_weight)


class ParallelTransformerLayerPipe(torch.nn.Module):
    """GPT-NeoX's ParallelTransformerLayer with parallel residual: its parts registered in its order
    (input_layernorm, attention, post_attention_layernorm, mlp: the parameters' order, which ZeRO's
    flat groups follow), computed by transformers' GPT-NeoX attention and MLP."""

    def __init__(self, cfg, index, save_inv_freqs=True):
        super().__init__()
        hf = GPTNeoXLayer(cfg, index)
        self.input_layernorm = hf.input_layernorm
        self.attention = hf.attention
        self.post_attention_layernorm = hf.post_attention_layernorm
        self.mlp = hf.mlp
        # GPT-NeoX's rotary_emb.inv_freq buffer, in the state dict with rotary_save_freqs_buffer (GPT-NeoX before
        # March 2024 always; from-neox skips it), not without (GPT-NeoX's default now, what to-neox writes).
        self.attention.rotary_emb = torch.nn.Module()
        self.rope = GPTNeoXRotaryEmbedding(cfg)  # its inv_freq is not persistent: no parameter, no state
        self.attention.rotary_emb.register_buffer("inv_freq", self.rope.inv_freq.clone(), persistent=save_inv_freqs)

    def forward(self, h):
        t = h.shape[1]
        pos = torch.arange(t)[None]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        attn = self.attention(self.input_layernorm(h), attention_mask=mask, position_ids=pos,
                              position_embeddings=self.rope(h, pos))[0]
        return h + attn + self.mlp(self.post_attention_layernorm(h))


class NormPipe(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = torch.nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, h):
        return self.norm(h)


class ParallelLinearPipe(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.final_linear = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, h):
        return self.final_linear(h)


class GPTNeoXSequential(torch.nn.Module):
    """GPT-NeoX's model without a pipeline (pipe_parallel_size 0): its layers as `sequential.N`."""

    def __init__(self, cfg, save_inv_freqs=True):
        super().__init__()
        layers = [ParallelTransformerLayerPipe(cfg, i, save_inv_freqs) for i in range(cfg.num_hidden_layers)]
        self.sequential = torch.nn.Sequential(EmbeddingPipe(cfg), torch.nn.Identity(), *layers, torch.nn.Identity(),
                                              NormPipe(cfg), ParallelLinearPipe(cfg))

    def forward(self, ids):
        return self.sequential(ids)


class AnnealingLR:
    """GPT-NeoX's megatron/learning_rates.py AnnealingLR, constant style (the state dict its checkpoints hold)."""

    def __init__(self, optimizer, start_lr, warmup_iter, total_iters, min_lr):
        self.optimizer, self.start_lr, self.warmup_iter = optimizer, start_lr, warmup_iter
        self.end_iter, self.min_lr, self.num_iters, self.decay_style = total_iters, min_lr, 0, "constant"
        self.step(0)

    def get_lr(self):
        if self.warmup_iter > 0 and self.num_iters <= self.warmup_iter:
            return float(self.start_lr) * self.num_iters / self.warmup_iter
        return max(self.start_lr, self.min_lr)

    def step(self, step_num=None):
        self.num_iters = self.num_iters + 1 if step_num is None else step_num
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr()

    def state_dict(self):
        return {"start_lr": self.start_lr, "warmup_iter": self.warmup_iter, "num_iters": self.num_iters,
                "decay_style": self.decay_style, "end_iter": self.end_iter, "min_lr": self.min_lr}

    def load_state_dict(self, sd):
        self.num_iters = sd["num_iters"]


def init_weights(model):
    torch.manual_seed(1234)
    parity.randomize_weights(model)
    with torch.no_grad():  # RMSNorm's `scale` around 1, as the other norms' weights
        for name, p in model.named_parameters():
            if name.endswith("norm.scale"):
                p.copy_(1 + 0.2 * torch.randn_like(p))


class RMSNorm(torch.nn.Module):
    """GPT-NeoX's megatron/model/norms.py RMSNorm (no partial RMSNorm, no bias): x * rsqrt(mean(x^2) + eps) * scale."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.scale = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.scale * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class LlamaLayerPipe(torch.nn.Module):
    """GPT-NeoX's ParallelTransformerLayer as its llama configs make it: sequential residual, RMSNorms,
    the fused QKV interleaved per head ([q k v] of each head), rotary (rotate_half) on the whole head,
    no biases (use_bias_in_attn_linear, use_bias_in_mlp false), the gated MLP's ParallelMLP: `linear1`
    of 2 x ffn rows whose output Gated_Activation chunks into x then gate, silu(gate) * x, `linear2`.
    With m["kv_heads"] below the heads, GPT-NeoX's grouped-query attention (ParallelSelfAttention's
    gqa_project): the QKV's output split into all query heads, then the key heads, then the value
    heads, keys and values repeat_interleave'd over the query heads."""

    def __init__(self, m, save_inv_freqs=True):
        super().__init__()
        c, ffn, self.heads = m["hidden"], m["ffn"], m["heads"]
        hd = c // self.heads
        self.kv_heads = m.get("kv_heads", self.heads)
        self.input_layernorm = RMSNorm(c, m["rms_eps"])
        self.attention = torch.nn.Module()
        self.attention.query_key_value = torch.nn.Linear(c, c + 2 * self.kv_heads * hd, bias=False)
        self.attention.dense = torch.nn.Linear(c, c, bias=False)
        self.attention.rotary_emb = torch.nn.Module()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        self.attention.rotary_emb.register_buffer("inv_freq", inv_freq, persistent=save_inv_freqs)
        self.post_attention_layernorm = RMSNorm(c, m["rms_eps"])
        self.mlp = torch.nn.Module()
        self.mlp.linear1 = torch.nn.Linear(c, 2 * ffn, bias=False)
        self.mlp.linear2 = torch.nn.Linear(ffn, c, bias=False)

    def attend(self, x):
        b, t, c = x.shape
        hd = c // self.heads
        if self.kv_heads == self.heads:
            q, k, v = self.attention.query_key_value(x).view(b, t, self.heads, 3 * hd).permute(0, 2, 1, 3).split(hd, -1)
        else:  # gqa_project: [q of every head | k of every kv head | v of every kv head]
            q, k, v = self.attention.query_key_value(x).split([c, self.kv_heads * hd, self.kv_heads * hd], -1)
            q = q.view(b, t, self.heads, hd).permute(0, 2, 1, 3)
            k, v = (u.view(b, t, self.kv_heads, hd).permute(0, 2, 1, 3).repeat_interleave(self.heads // self.kv_heads, 1)
                    for u in (k, v))
        freqs = torch.outer(torch.arange(t).float(), self.attention.rotary_emb.inv_freq)
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()

        def rotate(u):  # rotate_half over the whole head (rotary_pct 1)
            return u * cos + torch.cat((-u[..., hd // 2:], u[..., :hd // 2]), -1) * sin

        scores = rotate(q) @ rotate(k).transpose(-1, -2) / hd ** 0.5 + torch.full((t, t), float("-inf")).triu(1)
        return self.attention.dense((scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, t, c))

    def feed_forward(self, x):
        up, gate = self.mlp.linear1(x).chunk(2, dim=-1)
        return self.mlp.linear2(torch.nn.functional.silu(gate) * up)

    def forward(self, h):
        h = h + self.attend(self.input_layernorm(h))
        return h + self.feed_forward(self.post_attention_layernorm(h))


class LlamaNormPipe(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.norm = RMSNorm(m["hidden"], m["rms_eps"])

    def forward(self, h):
        return self.norm(h)


class LlamaSequential(torch.nn.Module):
    """GPT-NeoX's Llama-style model without a pipeline: `sequential.N` as GPTNeoXSequential numbers them."""

    def __init__(self, cfg, m, save_inv_freqs=True):
        super().__init__()
        layers = [LlamaLayerPipe(m, save_inv_freqs) for _ in range(m["layers"])]
        self.sequential = torch.nn.Sequential(EmbeddingPipe(cfg), torch.nn.Identity(), *layers, torch.nn.Identity(),
                                              LlamaNormPipe(m), ParallelLinearPipe(cfg))

    def forward(self, ids):
        return self.sequential(ids)


def hf_config(m):
    cfg = GPTNeoXConfig(vocab_size=m["vocab"], hidden_size=m["hidden"], num_hidden_layers=m["layers"],
                        num_attention_heads=m["heads"], intermediate_size=4 * m["hidden"], rotary_pct=m["rotary_pct"],
                        max_position_embeddings=m["seq"], layer_norm_eps=1e-5, use_parallel_residual=True,
                        hidden_act="gelu", attention_dropout=0.0, hidden_dropout=0.0)
    cfg._attn_implementation = "eager"
    return cfg


def pipeline_model(cfg, job, world, loss_fn):
    """GPT-NeoX's GPTModelPipe: a PipelineModule of LayerSpecs in GPT-NeoX's numbering, partitioned by
    its default pipe_partition_method, over its pipe x data x model topology (which names the layer
    files layer_XX-model_YY). With job["tied"] (GPT-NeoX's no_weight_tying false) the embedding and
    the output layer are one TiedLayerSpec "embed", the output a forward_fn over it, as GPT-NeoX's."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    L, save_freqs = cfg.num_hidden_layers, job.get("save_inv_freqs", True)
    tied = job.get("tied", False)
    embed = TiedLayerSpec("embed", EmbeddingPipe, cfg, tied_weight_attr="word_embeddings_weight") if tied else \
        LayerSpec(EmbeddingPipe, cfg)
    specs = [embed, pre_transformer_block]
    specs += [LayerSpec(ParallelTransformerLayerPipe, cfg, i, save_freqs) for i in range(L)]
    specs += [post_transformer_block, LayerSpec(NormPipe, cfg)]
    specs += [TiedLayerSpec("embed", EmbeddingPipe, cfg, forward_fn=tied_logits, tied_weight_attr="word_embeddings_weight")
              if tied else LayerSpec(ParallelLinearPipe, cfg)]
    topo = PipeModelDataParallelTopology(num_pp=job["pp"], num_mp=1, num_dp=world // job["pp"])
    return PipelineModule(layers=specs, loss_fn=loss_fn, topology=topo, partition_method="type:transformer|mlp",
                          activation_checkpoint_interval=0)


class TensorParallel:
    """Megatron's model-parallel unit (mpu) as DeepSpeed asks for it: every rank one tensor-parallel
    rank of one model (tensor-parallel size = world, data-parallel size 1)."""

    def __init__(self, world):
        self.rank, self.world = torch.distributed.get_rank(), world
        self.model_group = torch.distributed.new_group(list(range(world)))
        self.data_groups = [torch.distributed.new_group([r]) for r in range(world)]

    def get_model_parallel_rank(self):
        return self.rank

    def get_model_parallel_world_size(self):
        return self.world

    def get_model_parallel_group(self):
        return self.model_group

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_world_size(self):
        return 1

    def get_data_parallel_group(self):
        return self.data_groups[self.rank]

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group


class ReduceForward(torch.autograd.Function):  # Megatron's reduce_from_model_parallel_region
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        torch.distributed.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class ReduceBackward(torch.autograd.Function):  # Megatron's copy_to_model_parallel_region
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        torch.distributed.all_reduce(g, group=ctx.group)
        return g, None


class GatherLastDim(torch.autograd.Function):  # Megatron's gather_from_model_parallel_region
    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.rank, ctx.size = group, torch.distributed.get_rank(group), x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size(group))]
        torch.distributed.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, -1)

    @staticmethod
    def backward(ctx, g):
        return g[..., ctx.rank * ctx.size:(ctx.rank + 1) * ctx.size].contiguous(), None


def shard(param, dim, mpu):
    """Tensor-parallel rank mpu.rank's piece of a whole parameter along dim, marked as Megatron marks
    it (DeepSpeed counts such parameters on every rank in the gradient norm, the others on rank 0)."""
    piece = torch.nn.Parameter(param.detach().chunk(mpu.world, dim)[mpu.rank].clone())
    piece.model_parallel = True
    return piece


class TensorParallelLayer(torch.nn.Module):
    """ParallelTransformerLayer with parallel residual cut as Megatron cuts it: QKV and dense_h_to_4h
    column-parallel (rows: whole heads, since GPT-NeoX's fused QKV is interleaved per head), dense and
    dense_4h_to_h row-parallel (columns; their biases whole, added after the all-reduce), norms whole."""

    def __init__(self, whole, cfg, mpu):
        super().__init__()
        self.mpu, self.cfg = mpu, cfg
        # (registered in GPT-NeoX's order, which the module's state dict and ZeRO's flat groups follow)
        self.input_layernorm, self.attention = whole.input_layernorm, torch.nn.Module()
        self.post_attention_layernorm, self.mlp = whole.post_attention_layernorm, torch.nn.Module()
        for module, name, dim in ((whole.attention, "query_key_value", 0), (whole.attention, "dense", 1),
                                  (whole.mlp, "dense_h_to_4h", 0), (whole.mlp, "dense_4h_to_h", 1)):
            part = torch.nn.Module()
            part.weight = shard(getattr(module, name).weight, dim, mpu)
            part.bias = shard(getattr(module, name).bias, 0, mpu) if dim == 0 else getattr(module, name).bias
            setattr(self.attention if module is whole.attention else self.mlp, name, part)
        self.rope = whole.rope

    def attend(self, x):
        group, cfg = self.mpu.model_group, self.cfg
        b, t, hd = x.shape[0], x.shape[1], cfg.hidden_size // cfg.num_attention_heads
        qkv = torch.nn.functional.linear(ReduceBackward.apply(x, group), self.attention.query_key_value.weight,
                                         self.attention.query_key_value.bias)
        q, k, v = qkv.view(b, t, -1, 3 * hd).permute(0, 2, 1, 3).split(hd, dim=-1)  # (B, heads, T, hd) each
        cos, sin = self.rope(x, torch.arange(t)[None])
        rot = cos.shape[-1]

        def rotate(u):  # GPT-NeoX's rotary on the first rotary_pct of each head (rotate_half)
            r, rest = u[..., :rot], u[..., rot:]
            half = torch.cat((-r[..., rot // 2:], r[..., :rot // 2]), -1)
            return torch.cat((r * cos[:, None] + half * sin[:, None], rest), -1)

        scores = rotate(q) @ rotate(k).transpose(-1, -2) / hd ** 0.5
        scores = scores + torch.full((t, t), float("-inf")).triu(1)
        ctx = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, t, -1)
        out = ReduceForward.apply(torch.nn.functional.linear(ctx, self.attention.dense.weight), group)
        return out + self.attention.dense.bias

    def feed_forward(self, x):
        group = self.mpu.model_group
        h = torch.nn.functional.linear(ReduceBackward.apply(x, group), self.mlp.dense_h_to_4h.weight,
                                       self.mlp.dense_h_to_4h.bias)
        out = ReduceForward.apply(torch.nn.functional.linear(torch.nn.functional.gelu(h), self.mlp.dense_4h_to_h.weight),
                                  group)
        return out + self.mlp.dense_4h_to_h.bias

    def forward(self, h):
        return h + self.attend(self.input_layernorm(h)) + self.feed_forward(self.post_attention_layernorm(h))


class TensorParallelEmbedding(torch.nn.Module):  # VocabParallelEmbedding: rows cut by vocabulary ranges
    def __init__(self, whole, mpu):
        super().__init__()
        self.mpu = mpu
        self.word_embeddings = torch.nn.Module()
        self.word_embeddings.weight = shard(whole.word_embeddings.weight, 0, mpu)

    def forward(self, ids):
        rows = self.word_embeddings.weight.shape[0]
        local = ids - self.mpu.rank * rows
        outside = (local < 0) | (local >= rows)
        x = torch.nn.functional.embedding(local.masked_fill(outside, 0), self.word_embeddings.weight)
        return ReduceForward.apply(x.masked_fill(outside[..., None], 0.0), self.mpu.model_group)


class TensorParallelOutput(torch.nn.Module):  # the output layer column-parallel, the logits gathered
    def __init__(self, whole, mpu):
        super().__init__()
        self.mpu = mpu
        self.final_linear = torch.nn.Module()
        self.final_linear.weight = shard(whole.final_linear.weight, 0, mpu)

    def forward(self, h):
        h = ReduceBackward.apply(h, self.mpu.model_group)
        return GatherLastDim.apply(torch.nn.functional.linear(h, self.final_linear.weight), self.mpu.model_group)


def tensor_parallel_model(cfg, job, mpu):
    """GPT-NeoX's model without a pipeline, its whole weights drawn as the other runs draw them, then cut."""
    whole = GPTNeoXSequential(cfg, job.get("save_inv_freqs", True))
    init_weights(whole)
    seq = whole.sequential
    L = cfg.num_hidden_layers
    layers = [TensorParallelLayer(seq[i + 2], cfg, mpu) for i in range(L)]
    for layer, original in zip(layers, seq[2:L + 2]):
        layer.attention.rotary_emb = original.attention.rotary_emb  # (its buffer whole on every rank, as GPT-NeoX's)
    model = torch.nn.Module()
    model.sequential = torch.nn.Sequential(TensorParallelEmbedding(seq[0], mpu), torch.nn.Identity(), *layers,
                                           torch.nn.Identity(), seq[L + 3], TensorParallelOutput(seq[L + 4], mpu))
    model.forward = model.sequential.forward
    return model


class TensorParallelLlamaLayer(torch.nn.Module):
    """LlamaLayerPipe cut as GPT-NeoX cuts it over tensor-parallel ranks: the QKV column-parallel, each
    rank holding its own query heads and (grouped-query attention) its own key/value heads, in
    gqa_project's [q_r | k_r | v_r] (per head [q k v] without it); linear1 column-parallel, each rank
    its rows of x then of gate (Gated_Activation chunks the rank's output); dense and linear2
    row-parallel; the RMSNorms whole."""

    def __init__(self, whole, m, mpu):
        super().__init__()
        self.mpu, self.heads, self.kv_heads = mpu, m["heads"] // mpu.world, whole.kv_heads // mpu.world
        hd = m["hidden"] // m["heads"]
        self.gqa, self.hd = whole.kv_heads != m["heads"], hd
        self.input_layernorm, self.attention = whole.input_layernorm, torch.nn.Module()
        qkv = whole.attention.query_key_value.weight.detach()
        if self.gqa:  # whole [Q | K | V] -> this rank's [q_r | k_r | v_r]
            q, k, v = qkv.split([m["hidden"], whole.kv_heads * hd, whole.kv_heads * hd])
            rows = torch.cat([t.chunk(mpu.world)[mpu.rank] for t in (q, k, v)])
        else:  # interleaved per head: this rank's heads are its chunk of rows
            rows = qkv.chunk(mpu.world)[mpu.rank]
        self.attention.query_key_value = torch.nn.Module()
        self.attention.query_key_value.weight = torch.nn.Parameter(rows.clone())
        self.attention.query_key_value.weight.model_parallel = True
        self.attention.dense = torch.nn.Module()
        self.attention.dense.weight = shard(whole.attention.dense.weight, 1, mpu)
        self.attention.rotary_emb = whole.attention.rotary_emb
        self.post_attention_layernorm, self.mlp = whole.post_attention_layernorm, torch.nn.Module()
        up, gate = whole.mlp.linear1.weight.detach().chunk(2)
        self.mlp.linear1 = torch.nn.Module()
        self.mlp.linear1.weight = torch.nn.Parameter(torch.cat([up.chunk(mpu.world)[mpu.rank],
                                                                gate.chunk(mpu.world)[mpu.rank]]).clone())
        self.mlp.linear1.weight.model_parallel = True
        self.mlp.linear2 = torch.nn.Module()
        self.mlp.linear2.weight = shard(whole.mlp.linear2.weight, 1, mpu)

    def attend(self, x):
        group, (b, t, _), hd = self.mpu.model_group, x.shape, self.hd
        qkv = torch.nn.functional.linear(ReduceBackward.apply(x, group), self.attention.query_key_value.weight)
        if self.gqa:
            q, k, v = qkv.split([self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], -1)
            q = q.view(b, t, self.heads, hd).permute(0, 2, 1, 3)
            k, v = (u.view(b, t, self.kv_heads, hd).permute(0, 2, 1, 3).repeat_interleave(self.heads // self.kv_heads, 1)
                    for u in (k, v))
        else:
            q, k, v = qkv.view(b, t, self.heads, 3 * hd).permute(0, 2, 1, 3).split(hd, -1)
        freqs = torch.outer(torch.arange(t).float(), self.attention.rotary_emb.inv_freq)
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()

        def rotate(u):
            return u * cos + torch.cat((-u[..., hd // 2:], u[..., :hd // 2]), -1) * sin

        scores = rotate(q) @ rotate(k).transpose(-1, -2) / hd ** 0.5 + torch.full((t, t), float("-inf")).triu(1)
        ctx = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, t, -1)
        return ReduceForward.apply(torch.nn.functional.linear(ctx, self.attention.dense.weight), group)

    def feed_forward(self, x):
        group = self.mpu.model_group
        up, gate = torch.nn.functional.linear(ReduceBackward.apply(x, group), self.mlp.linear1.weight).chunk(2, dim=-1)
        return ReduceForward.apply(torch.nn.functional.linear(torch.nn.functional.silu(gate) * up,
                                                              self.mlp.linear2.weight), group)

    def forward(self, h):
        h = h + self.attend(self.input_layernorm(h))
        return h + self.feed_forward(self.post_attention_layernorm(h))


def tensor_parallel_llama_model(cfg, job, mpu):
    """The Llama-style model without a pipeline, its whole weights drawn as the one-rank run draws them, then cut."""
    whole = LlamaSequential(cfg, job["model"], job.get("save_inv_freqs", True))
    init_weights(whole)
    seq, L = whole.sequential, job["model"]["layers"]
    layers = [TensorParallelLlamaLayer(seq[i + 2], job["model"], mpu) for i in range(L)]
    model = torch.nn.Module()
    model.sequential = torch.nn.Sequential(TensorParallelEmbedding(seq[0], mpu), torch.nn.Identity(), *layers,
                                           torch.nn.Identity(), seq[L + 3], TensorParallelOutput(seq[L + 4], mpu))
    model.forward = model.sequential.forward
    return model


def pre_transformer_block(h):  # GPT-NeoX's layer 1 and L+2: functions without parameters
    return h


def post_transformer_block(h):
    return h


def run_job(job, rank, world):
    """One configuration: trains `before` steps and saves (or loads job["load"]), trains `after` more;
    the losses of every step go to job["out"]/losses.json."""
    # Each job starts as in a fresh process: an engine given an mpu (the tensor-parallel jobs) leaves it
    # in DeepSpeed's groups, where a later engine without one would take its ranks for model-parallel ones.
    deepspeed.utils.groups.mpu = None
    cfg = hf_config(job["model"])
    loss_fn = lambda logits, labels: torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size),
                                                                       labels.reshape(-1))
    pipe, mpu = job.get("pp", 0) >= 1, None
    if job.get("llama") and job.get("tp", 1) > 1:
        mpu = TensorParallel(world)
        model = tensor_parallel_llama_model(cfg, job, mpu)
    elif job.get("llama"):
        model = LlamaSequential(cfg, job["model"], job.get("save_inv_freqs", True))
        init_weights(model)
    elif pipe:
        model = pipeline_model(cfg, job, world, loss_fn)
        init_weights(model)
    elif job.get("tp", 1) > 1:
        mpu = TensorParallel(world)
        model = tensor_parallel_model(cfg, job, mpu)
    else:
        model = GPTNeoXSequential(cfg, job.get("save_inv_freqs", True))
        init_weights(model)
    # GPT-NeoX's get_params_for_weight_decay_optimization: no decay on biases and norms.
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "norm" in n)]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    ds_config = {"train_micro_batch_size_per_gpu": job["micro_batch"], "gradient_accumulation_steps": 1,
                 "optimizer": {"type": "Adam", "params": {"lr": job["lr"], "betas": [0.9, 0.95], "eps": 1e-8,
                                                          "weight_decay": job["weight_decay"], "torch_adam": True}},
                 "zero_optimization": {"stage": job["zero"]}, "fp16": {"enabled": False}, "steps_per_print": 10**9,
                 "gradient_clipping": 1.0}  # GPT-NeoX's default, which it passes to DeepSpeed (neox.c's too)
    total = job["before"] + job["after"]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config, mpu=mpu,
                                           lr_scheduler=lambda opt: AnnealingLR(opt, job["lr"], 0, total, job["min_lr"]))
    tokens = torch.tensor(job["sample"], dtype=torch.long)[None].repeat(job["micro_batch"], 1)
    first = 0
    if job.get("load"):
        _, client = engine.load_checkpoint(job["load"])
        first = client["iteration"]
    losses = []
    for step in range(first, total):
        if pipe:
            loss = engine.train_batch(data_iter=iter([(tokens[:, :-1], tokens[:, 1:])]))
        else:
            loss = loss_fn(engine(tokens[:, :-1]), tokens[:, 1:])
            engine.backward(loss)
            engine.step()
        losses.append(loss.item())
        if step + 1 == job["before"] and not job.get("load"):
            # GPT-NeoX's client state: the iteration and its ranks' RNG states (numpy's pickles numpy objects).
            client = {"iteration": step + 1, "random_rng_state": random.getstate(),
                      "np_rng_state": numpy.random.get_state(), "torch_rng_state": torch.get_rng_state()}
            engine.save_checkpoint(job["out"], tag=f"global_step{step + 1}", client_state=client)
    if rank == 0:
        os.makedirs(job["out"], exist_ok=True)
        with open(os.path.join(job["out"], "losses.json"), "w") as f:
            json.dump(losses, f)
    engine.destroy()


def wait_for(path, parent, seconds=1800):
    """The phase file the test (process `parent`) writes atomically once that phase's inputs exist."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline or os.getppid() != parent:
            sys.exit(f"{path} did not appear in {seconds} s, or the test ended")
        time.sleep(0.1)
    return json.load(open(path))


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.update(LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    parent = os.getppid()
    deepspeed.init_distributed(dist_backend="gloo", rank=rank, world_size=world)
    for path in sys.argv[1:]:
        for job in wait_for(path, parent)["jobs"]:  # several configurations in one process: DeepSpeed's start-up is paid once
            run_job(job, rank, world)
        torch.distributed.barrier()  # every rank's files of the phase are written
        if rank == 0:
            open(path + ".done", "w").close()
    # Every file is written and closed. Leave without the interpreter's teardown: gloo's threads,
    # destroyed there in no fixed order, sometimes end the process in std::terminate ("terminate
    # called without an active exception") after all the work is done, failing the launch.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
