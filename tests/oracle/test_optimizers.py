"""test_optimizers.py: neox.c's optimizers (lib/optim through the CPU backend's kernels) against the
PyPI packages GPT-NeoX itself builds them from: lion-pytorch's Lion, the madgrad package's MADGRAD
(with GPT-NeoX's madgrad_wd weight decay restated: p *= 1 - (lr + eps) * wd before each step, with
x0 taken before the first decay), torch-optimizer's SM3 (given GPT-NeoX's parameter groups, whose
weight_decay it ignores, as GPT-NeoX's sm3 does), torch.optim.SGD and torch.optim.AdamW (what DeepSpeed's CPU Adam computes for
cpu_adam and cpu_torch_adam). The same small GPT-NeoX model (Hugging Face's GPTNeoXForCausalLM) takes
20 steps on one batch, each with weight decay on all but biases and norms, gradient clipping by the
global norm (DeepSpeed's coefficient, torch's clip_grad_norm_) and GPT-NeoX's cosine schedule with
warmup (tests/oracle/test_train_lr.py's restatement); every parameter after the last step must
agree to 1e-6 of its tensor's largest magnitude.

The oracle runs in float64 (model and optimizer), and neox.c's fp32 side steps on the gradients
torch's model computed at each step, rounded to fp32 (the driver's grads=): these updates magnify
the last-place differences of two forward/backward implementations (Lion takes the sign of
gradients that are zero in exact arithmetic, MADGRAD a cube root, Adam divides by the root of a
tiny second moment) beyond 1e-6 within 20 steps, while the model's gradients have their own parity
tests (test_model_parity.py). Lion is also run end to end in fp32 on neox.c's own gradients, where
those are not ill-conditioned."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
lion_pytorch = pytest.importorskip("lion_pytorch")
madgrad = pytest.importorskip("madgrad")
torch_optimizer_sm3 = pytest.importorskip("torch_optimizer.sm3")

from safetensors.torch import save_file  # noqa: E402
from test_model_parity import CASES, batch, make_model, masked_loss, run_driver  # noqa: E402
from test_train_lr import annealing_lr  # noqa: E402

STEPS, WD, CLIP, MIN_FRACTION, WARMUP = 20, 0.1, 0.5, 0.1, 0.2
# No attention biases: the key bias has a gradient of exactly zero in exact arithmetic, which
# rounding makes a tiny number of either sign, and Lion steps by its sign.
MODEL = "neox-parallel-no-attn-bias-checkpointed"


def groups(model):
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "norm" in n)]
    return [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]


def lr_at(step, lr):
    """GPT-NeoX's cosine AnnealingLR over the 20 steps: step i trains with its value at i - 1."""
    return annealing_lr(step - 1, lr, lr * MIN_FRACTION, WARMUP * STEPS, STEPS, "cosine")


def torch_steps(model, ids, targets, mask, opt, lr, before_step=None):
    """The 20 steps; returns each step's gradients before clipping, as "grad.<step>.<name>"."""
    recorded = {}
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        masked_loss(model(input_ids=ids).logits, targets, mask).backward()
        recorded.update({f"grad.{step}.{n}": p.grad.detach().float() for n, p in model.named_parameters()})
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, lr)
        if before_step:
            before_step(step)
        opt.step()
    return recorded


def madgrad_wd_decay(model, opt, eps):
    """GPT-NeoX's madgrad_wd: the state (x0 included) made before the first decay, then each step
    p *= 1 - (lr + eps) * wd ahead of MADGRAD's own update (whose weight_decay is 0). madgrad_wd adds
    eps to the lr also when the lr is 0 (the first step under warmup), where the package adds
    nothing: there the package gets 1e-30, which adding eps absorbs exactly."""
    def decay(step):
        for g, wd in zip(opt.param_groups, (WD, 0.0)):
            if g["lr"] == 0.0:
                g["lr"] = 1e-30
                assert g["lr"] + eps == eps
            for p in g["params"]:
                state = opt.state[p]
                if "grad_sum_sq" not in state:
                    state["grad_sum_sq"] = torch.zeros_like(p.data)
                    state["s"] = torch.zeros_like(p.data)
                    if g["momentum"] != 0:
                        state["x0"] = p.data.clone()
                if wd:
                    p.data.mul_(1 - (g["lr"] + eps) * wd)
    return decay


def check_params(out, model, what):
    for name, p in model.named_parameters():
        ours, ref = out["param." + name].double(), p.detach().double()
        scale = ref.abs().max().item()
        err = (ours - ref).abs().max().item()
        assert err <= 1e-6 * scale, f"{what}: {name} differs by {err:.3g} (1e-6 of max |ref| {scale:.3g})"


def run_ours(tmp_path, model0, name, lr, extra, recorded=None):
    """neox.c's 20 steps from model0's weights: on recorded gradients, or on its own."""
    kind, kwargs, args = CASES[MODEL]
    _, cfg = make_model(kind, kwargs)
    ids, targets, mask = batch()
    more = [f"optimizer={name}", f"opt_steps={STEPS}", f"opt_lr={lr}", f"min_lr={lr * MIN_FRACTION}",
            f"warmup={WARMUP}", f"decay_iters={STEPS}", f"wd={WD}", f"clip={CLIP}"] + extra
    if recorded is not None:
        save_file({k: v.contiguous() for k, v in recorded.items()}, str(tmp_path / "grads.safetensors"))
        more.append(f"grads={tmp_path / 'grads.safetensors'}")
    return run_driver(tmp_path, model0, cfg, kind, args, ids, targets, mask, more=more)


def run_both(tmp_path, name, lr, extra, make_opt, before_step=None):
    kind, kwargs, _ = CASES[MODEL]
    model0, _ = make_model(kind, kwargs)
    model = make_model(kind, kwargs)[0].double()
    ids, targets, mask = batch()
    opt = make_opt(model)
    recorded = torch_steps(model, ids, targets, mask, opt, lr, before_step(model, opt) if before_step else None)
    return run_ours(tmp_path, model0, name, lr, extra, recorded), model


def test_lion(tmp_path):
    lr, betas = 3e-4, (0.9, 0.99)
    make = lambda m: lion_pytorch.Lion(groups(m), lr=lr, betas=betas)  # noqa: E731
    out, model = run_both(tmp_path, "lion", lr, [f"beta1={betas[0]}", f"beta2={betas[1]}"], make)
    check_params(out, model, "lion")


def test_lion_end_to_end(tmp_path):
    lr, betas = 3e-4, (0.9, 0.99)
    kind, kwargs, _ = CASES[MODEL]
    model, _ = make_model(kind, kwargs)
    out = run_ours(tmp_path, model, "lion", lr, [f"beta1={betas[0]}", f"beta2={betas[1]}"])
    ids, targets, mask = batch()
    torch_steps(model, ids, targets, mask, lion_pytorch.Lion(groups(model), lr=lr, betas=betas), lr)
    check_params(out, model, "lion on neox.c's own gradients")


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_madgrad_wd(tmp_path, momentum):
    lr, eps = 1e-2, 1e-6  # madgrad_wd's defaults
    make = lambda m: madgrad.MADGRAD([dict(g, weight_decay=0.0) for g in groups(m)], lr=lr, momentum=momentum,  # noqa: E731
                                     eps=eps)
    out, model = run_both(tmp_path, "madgrad_wd", lr, [f"momentum={momentum}", f"opt_eps={eps}"], make,
                          lambda m, opt: madgrad_wd_decay(m, opt, eps))
    check_params(out, model, f"madgrad_wd momentum {momentum}")


@pytest.mark.parametrize("momentum,beta", [(0.0, 0.0), (0.9, 0.5)])
def test_sm3(tmp_path, momentum, beta):
    # GPT-NeoX builds SM3(param_groups, **optimizer.params): its groups carry weight_decay, which SM3
    # ignores; neox.c is given wd= too and must ignore it the same way.
    lr, eps = 1e-2, 1e-30  # eps: torch-optimizer's default
    make = lambda m: torch_optimizer_sm3.SM3(groups(m), lr=lr, momentum=momentum, beta=beta, eps=eps)  # noqa: E731
    out, model = run_both(tmp_path, "sm3", lr, [f"momentum={momentum}", f"sm3_beta={beta}", f"opt_eps={eps}"], make)
    check_params(out, model, f"sm3 momentum {momentum} beta {beta}")


def test_sgd(tmp_path):
    # torch.optim.SGD with momentum, weight decay added to the gradient (GPT-NeoX's groups), no
    # dampening and no Nesterov.
    lr, momentum = 1e-2, 0.9
    make = lambda m: torch.optim.SGD(groups(m), lr=lr, momentum=momentum)  # noqa: E731
    out, model = run_both(tmp_path, "sgd", lr, [f"momentum={momentum}"], make)
    check_params(out, model, "sgd")


def test_cpu_torch_adam(tmp_path):
    # cpu_adam and cpu_torch_adam run neox.c's adam type on the host; DeepSpeed's CPU Adam is AdamW.
    lr, betas, eps = 1e-3, (0.9, 0.95), 1e-8
    make = lambda m: torch.optim.AdamW(groups(m), lr=lr, betas=betas, eps=eps)  # noqa: E731
    out, model = run_both(tmp_path, "adam", lr, [f"beta1={betas[0]}", f"beta2={betas[1]}", f"opt_eps={eps}"], make)
    check_params(out, model, "adam")
