"""GPT-NeoX's dropless Mixture of Experts against a torch restatement of its code (the oracle):
megatron/model/router.py (SinkhornRouter: Sinkhorn-balanced choice in training, sigmoid or softmax
weights; TopKTokenChoiceRouter: softmax top k), megatron/model/moe.py (every token to its top_k
experts, none dropped, outputs weighted by the router's scores and summed) and moe_mlp.py
(ParallelGroupedMLP: act(x @ w1^T) @ w2, no biases), in the Hugging Face GPT-NeoX model whose MLP is
replaced by that layer on every moe_expert_interval-th layer and added to the residual without
dropout. The C driver tests/drivers/model_parity.c runs the same weights; logits, loss and every
parameter gradient must agree within 1e-5 of each tensor's largest magnitude."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_model_parity import (B, T, batch, check_losses, check_parity, make_model, run_driver,  # noqa: E402
                               torch_adamw_losses)

HIDDEN, FFN = 32, 40


def sinkhorn(cost, tol=0.0001, max_iter=3):  # SinkhornRouter.sinkhorn
    cost = torch.exp(cost)
    d0 = torch.ones(cost.size(0), dtype=cost.dtype)
    d1 = 1 / (cost.size(1) * torch.sum(cost, 0))
    eps = 0.00000001
    d1_old = d1
    for _ in range(max_iter):
        d0 = (1 / d0.size(0)) * 1 / (torch.sum(d1 * cost, 1) + eps)
        d1 = (1 / d1.size(0)) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + eps)
        error = torch.mean(torch.abs(d1_old - d1))
        d1_old = d1
        if error < tol:
            break
    return d1 * cost * d0.unsqueeze(1)


class Expert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = torch.nn.Linear(FFN, HIDDEN, bias=False)  # GPT-NeoX stores w2 as (FFN, HIDDEN): x @ w2

    def forward(self, x):
        return self.w2(torch.nn.functional.gelu(self.w1(x)))


class DroplessMoE(torch.nn.Module):
    def __init__(self, experts, top_k, router):
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, experts, bias=False)
        self.experts = torch.nn.ModuleList(Expert() for _ in range(experts))
        self.top_k, self.router = top_k, router
        self.chosen = None
        self.jitter = None  # the noise factors (tokens, hidden) of TopKTokenChoiceRouter.jitter, when given

    def route(self, logits):
        k = self.top_k
        if self.router == "topk":
            scores = logits.softmax(dim=-1)
            return scores.max(dim=-1, keepdim=True) if k == 1 else torch.topk(scores, k, dim=-1)
        act = torch.sigmoid(logits) if k == 1 else torch.softmax(logits, dim=-1, dtype=torch.float32)
        if self.training:
            with torch.no_grad():
                _, idx = torch.topk(sinkhorn(logits.float()), k=k, dim=1)
            return torch.gather(act, 1, idx), idx
        return torch.topk(act, k=k, dim=1)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, idx = self.route(self.gate(x * self.jitter if self.jitter is not None else x))
        self.chosen = idx
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slots = (idx == e).nonzero(as_tuple=True)
            if len(rows):
                out = out.index_add(0, rows, weights[rows, slots].unsqueeze(1) * expert(x[rows]))
        return out.reshape(shape)


class Calls:  # calls a module without registering it a second time
    def __init__(self, module):
        self.module = module

    def __call__(self, x):
        return self.module(x)


def make_moe_model(experts, top_k, router, interval, training):
    model, cfg = make_model("neox", dict(use_parallel_residual=False, rotary_pct=0.5, hidden_act="gelu",
                                         tie_word_embeddings=False))
    torch.manual_seed(4321)
    moes = []
    for i, layer in enumerate(model.gpt_neox.layers):
        if i % interval:
            continue
        moe = DroplessMoE(experts, top_k, router)
        with torch.no_grad():
            for p in moe.parameters():
                p.copy_(0.15 * torch.randn_like(p))
            moe.gate.weight.mul_(4)  # decisive scores, so the routing matters
        del layer.mlp
        layer.block_sparse_moe = moe
        object.__setattr__(layer, "mlp", Calls(moe))
        moes.append(moe)
    model.train(bool(training))
    return model, cfg, moes


CASES = {  # name: (experts, top_k, router, interval, training, checkpoint)
    "sinkhorn-top1-training": (4, 1, "sinkhorn", 1, 1, 0),
    "sinkhorn-top2-training": (4, 2, "sinkhorn", 1, 1, 0),
    "sinkhorn-top2-eval": (4, 2, "sinkhorn", 1, 0, 0),
    "topk-top2-interval2-checkpointed": (5, 2, "topk", 2, 1, 1),
    "topk-top1": (3, 1, "topk", 1, 1, 0),
}


def moe_args(experts, top_k, router, interval, training, checkpoint):
    return {"moe_experts": experts, "moe_top_k": top_k, "moe_router": router, "moe_interval": interval,
            "moe_ffn": FFN, "training": training, "checkpoint": checkpoint}


@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_parity(case, tmp_path):
    experts, top_k, router, interval, training, checkpoint = CASES[case]
    model, cfg, moes = make_moe_model(experts, top_k, router, interval, training)
    ids, targets, mask = batch()
    out = run_driver(tmp_path, model, cfg, "neox", moe_args(*CASES[case]), ids, targets, mask)
    assert any(".block_sparse_moe.experts." in n for n, _ in model.named_parameters())
    check_parity(out, model, ids, targets, mask)
    # Experts in use (topk-top1 leaves one idle: its gradients must be zero), and (Sinkhorn in
    # training) choices the plain top k would not make.
    used = [len(moe.chosen.unique()) for moe in moes]
    assert min(used) >= 2 and (min(used) < experts) == (case == "topk-top1"), used
    if router == "sinkhorn" and training:
        x = torch.randn(B * T, HIDDEN)
        assert any((moe.route(moe.gate(x))[1] != torch.topk(moe.gate(x), top_k, dim=1)[1]).any() for moe in moes)


def test_moe_jitter_parity(tmp_path):
    """moe_jitter_eps: the topk router's input times uniform noise in [1 - eps, 1 + eps) in training
    (TopKTokenChoiceRouter.jitter). The noise is neox.c's own stream; the driver writes the factors
    it drew, which must lie in that range and vary, and the restatement then uses them."""
    eps = 0.2
    spec = (4, 2, "topk", 1, 1, 0)
    model, cfg, moes = make_moe_model(*spec[:5])
    ids, targets, mask = batch()
    out = run_driver(tmp_path, model, cfg, "neox", {**moe_args(*spec), "moe_jitter": eps}, ids, targets, mask)
    plain = model(input_ids=ids).logits.detach()
    for l, moe in enumerate(moes):
        f = out[f"moe_jitter.{l}"]
        assert f.min() >= 1 - eps - 1e-5 and f.max() <= 1 + eps + 1e-5 and f.std() > eps / 4, (f.min(), f.max())
        moe.jitter = f
    check_parity(out, model, ids, targets, mask, unlike=plain, change="the jitter changed no routing")


def test_moe_adamw_losses(tmp_path):
    spec = CASES["sinkhorn-top2-training"]
    model, cfg, _ = make_moe_model(*spec[:5])
    ids, targets, mask = batch()
    steps, lr = 10, 1e-3
    out = run_driver(tmp_path, model, cfg, "neox", moe_args(*spec), ids, targets, mask,
                     more=[f"adam_steps={steps}", f"lr={lr}"])
    check_losses(out["losses"].tolist(), torch_adamw_losses(model, ids, targets, mask, steps, lr))
