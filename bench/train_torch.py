"""train_torch.py: the PyTorch side of bench/train_cpu.sh.

Trains Hugging Face transformers' GPTNeoXForCausalLM with the same architecture as bench/train_neox.c
(Pythia-70M's shape by default: rotary on a quarter of each head, parallel residual, exact GELU,
untied output) on random token ids with torch.optim.AdamW, on the CPU with a fixed thread count,
and prints one JSON line with tokens/s, the time in forward, backward and the optimizer, the CPU
seconds all threads used in the timed steps and the wall time of each warm-up step (compilation
happens in those).

    train_torch.py key=value...   keys: layers hidden heads vocab seq batch steps warmup threads
                                        bf16 weights compile adamw
    bf16=1         torch's CPU autocast to bfloat16 (the linear layers on bf16 operands)
    weights=bf16   the parameters, gradients and AdamW state held in bfloat16 ("pure bf16")
                   instead of fp32 (default weights=fp32)
    compile=1      torch.compile of the training step's forward and loss (AOTAutograd compiles the
                   backward from it); needs torch 2.x
    adamw=default|foreach|fused|compiled
                   torch.optim.AdamW as constructed by default (foreach on torch 2.x), its foreach
                   or fused implementation, or its default step under torch.compile
"""
import json
import resource
import sys
import time

import torch
import torch.nn.functional as F
import transformers

ADAMW_CHOICES = ("default", "foreach", "fused", "compiled")


def parse(argv):
    opts = dict(layers=6, hidden=512, heads=8, vocab=50304, seq=512, batch=8, steps=3, warmup=1, threads=2, bf16=0,
                weights="fp32", compile=0, adamw="default")
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in opts:
            sys.exit(f"train_torch.py: bad argument '{arg}' (keys: {' '.join(opts)})")
        opts[key] = value if isinstance(opts[key], str) else int(value)
    if opts["weights"] not in ("fp32", "bf16"):
        sys.exit(f"train_torch.py: weights must be fp32 or bf16, not '{opts['weights']}'")
    if opts["adamw"] not in ADAMW_CHOICES:
        sys.exit(f"train_torch.py: adamw must be one of {', '.join(ADAMW_CHOICES)}, not '{opts['adamw']}'")
    if (opts["compile"] or opts["adamw"] == "compiled") and not hasattr(torch, "compile"):
        sys.exit(f"train_torch.py: compile=1 and adamw=compiled need torch 2.x (this is {torch.__version__})")
    return opts


def build_model(opts):
    config = transformers.GPTNeoXConfig(
        vocab_size=opts["vocab"], hidden_size=opts["hidden"], num_hidden_layers=opts["layers"],
        num_attention_heads=opts["heads"], intermediate_size=4 * opts["hidden"], rotary_pct=0.25,
        rotary_emb_base=10000, max_position_embeddings=opts["seq"], use_parallel_residual=True,
        hidden_act="gelu", layer_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0,
        hidden_dropout=0.0, initializer_range=0.02, attention_bias=True, use_cache=False)
    model = transformers.GPTNeoXForCausalLM(config).float().train()
    return model.to(torch.bfloat16) if opts["weights"] == "bf16" else model


def build_optimizer(model, opts):
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(opts["adamw"], {})
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **impl)
    # The compiled step is the one the torch.compile tutorial on optimizers shows: the whole
    # opt.step under torch.compile (the lr stays a Python float, so it is a constant of the graph).
    step = torch.compile(opt.step) if opts["adamw"] == "compiled" else opt.step
    return opt, step


def main(argv):
    opts = parse(argv)
    torch.set_num_threads(opts["threads"])
    torch.manual_seed(1234)
    model = build_model(opts)
    opt, opt_step = build_optimizer(model, opts)
    n = opts["batch"] * opts["seq"]
    gen = torch.Generator().manual_seed(42)
    tokens = torch.randint(0, opts["vocab"], (n + 1,), generator=gen)
    ids = tokens[:-1].view(opts["batch"], opts["seq"])
    targets = tokens[1:].reshape(-1)

    def forward_loss(ids, targets):
        # bf16=1: torch's CPU autocast, its users' bfloat16 training (linear layers on bf16 operands).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(opts["bf16"])):
            logits = model(input_ids=ids).logits
        return F.cross_entropy(logits.float().view(n, -1), targets)

    loss_fn = torch.compile(forward_loss) if opts["compile"] else forward_loss
    compile_error = None

    def forward_backward(ids, targets):
        loss = loss_fn(ids, targets)
        t = time.perf_counter()
        loss.backward()
        return loss, t

    def first_forward_backward(ids, targets):
        # torch.compile can fail to build a graph's kernels (inductor's C++ for some bfloat16
        # reductions on this torch): the step then runs eagerly, as its user would have to, and the
        # output says so.
        nonlocal loss_fn, compile_error
        try:
            return forward_backward(ids, targets)
        except Exception as e:  # torch._inductor.exc.InductorError and whatever a backend raises
            compile_error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
            print(f"train_torch.py: torch.compile failed, running eagerly ({compile_error})", file=sys.stderr)
            loss_fn = forward_loss
            opt.zero_grad(set_to_none=True)
            return forward_backward(ids, targets)

    def cpu_seconds():
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    fwd = bwd = step = cpu = 0.0
    first = last = None
    warmup_s = []
    for s in range(opts["warmup"] + opts["steps"]):
        if s == opts["warmup"]:
            cpu = cpu_seconds()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, t1 = (first_forward_backward if s == 0 and opts["compile"] else forward_backward)(ids, targets)
        t2 = time.perf_counter()
        opt_step()
        t3 = time.perf_counter()
        first = loss.item() if first is None else first
        last = loss.item()
        if s >= opts["warmup"]:
            fwd, bwd, step = fwd + t1 - t0, bwd + t2 - t1, step + t3 - t2
        else:
            warmup_s.append(round(t3 - t0, 3))
    cpu = cpu_seconds() - cpu
    total = fwd + bwd + step
    precision = "bfloat16" if opts["bf16"] or opts["weights"] == "bf16" else "fp32"
    print(json.dumps({
        "impl": "pytorch", "precision": precision, "autocast": bool(opts["bf16"]), "weights": opts["weights"],
        "compile": bool(opts["compile"]) and compile_error is None, "compile_error": compile_error, "adamw": opts["adamw"],
        "torch": torch.__version__, "transformers": transformers.__version__,
        "params": sum(p.numel() for p in model.parameters()), "tokens_per_step": n, "steps": opts["steps"],
        "seconds": round(total, 4), "tokens_per_s": round(n * opts["steps"] / total, 2),
        "forward_s": round(fwd / opts["steps"], 4), "backward_s": round(bwd / opts["steps"], 4),
        "adamw_s": round(step / opts["steps"], 4), "cpu_s": round(cpu, 4), "warmup_step_s": warmup_s,
        "first_loss": round(first, 4), "last_loss": round(last, 4)}))


if __name__ == "__main__":
    main(sys.argv[1:])
