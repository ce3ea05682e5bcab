"""One rank of a small GPT-NeoX training run under DeepSpeed's own engine (on the CPU, gloo), for
tests/oracle/test_neox_checkpoints.py: a torch restatement of GPT-NeoX's model with GPT-NeoX's
parameter names (its PipelineModule's layers as `sequential.N`: 0 the embedding, 1 and L+2 functions
without parameters, 2..L+1 the transformer layers, L+3 the final norm, L+4 the output layer; each
layer's attention carries GPT-NeoX's persistent `rotary_emb.inv_freq` buffer), AdamW over GPT-NeoX's
two weight-decay groups, GPT-NeoX's AnnealingLR as the engine's scheduler, ZeRO stage 1 or 2 over the
ranks. It trains `before` steps, saves with `engine.save_checkpoint` (GPT-NeoX's client state:
the iteration and the python, numpy and torch RNG states), trains `after` more steps and writes the losses of every step to SPEC["out"]/losses.json.
Every sample is the same tokens (the test's corpus repeats one document of seq_length tokens), so
the batches do not depend on the sample order.
  RANK=r WORLD_SIZE=n MASTER_PORT=p neox_deepspeed_run.py SPEC.json"""
import json
import os
import random
import sys

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

    def forward(self, ids):
        return self.word_embeddings(ids)


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
    files layer_XX-model_YY)."""
    from deepspeed.pipe import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    L, save_freqs = cfg.num_hidden_layers, job.get("save_inv_freqs", True)
    specs = [LayerSpec(EmbeddingPipe, cfg), pre_transformer_block]
    specs += [LayerSpec(ParallelTransformerLayerPipe, cfg, i, save_freqs) for i in range(L)]
    specs += [post_transformer_block, LayerSpec(NormPipe, cfg), LayerSpec(ParallelLinearPipe, cfg)]
    topo = PipeModelDataParallelTopology(num_pp=job["pp"], num_mp=1, num_dp=world // job["pp"])
    return PipelineModule(layers=specs, loss_fn=loss_fn, topology=topo, partition_method="type:transformer|mlp",
                          activation_checkpoint_interval=0)


def pre_transformer_block(h):  # GPT-NeoX's layer 1 and L+2: functions without parameters
    return h


def post_transformer_block(h):
    return h


def run_job(job, rank, world):
    """One configuration: trains `before` steps and saves (or loads job["load"]), trains `after` more;
    the losses of every step go to job["out"]/losses.json."""
    cfg = hf_config(job["model"])
    loss_fn = lambda logits, labels: torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size),
                                                                       labels.reshape(-1))
    pipe = job.get("pp", 0) >= 1
    if pipe:
        model = pipeline_model(cfg, job, world, loss_fn)
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
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config,
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
        json.dump(losses, open(os.path.join(job["out"], "losses.json"), "w"))
    engine.destroy()


def main():
    spec = json.load(open(sys.argv[1]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.update(LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    deepspeed.init_distributed(dist_backend="gloo", rank=rank, world_size=world)
    for job in spec["jobs"]:  # several configurations in one process: DeepSpeed's start-up is paid once
        run_job(job, rank, world)


if __name__ == "__main__":
    main()
