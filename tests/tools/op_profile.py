"""op_profile.py: checks of neox-train's per-op profile (log_dir/op_profile.json) and of
bench/gpu_predict's output against FLOPs restated here from the model's shapes (not from our code).

    python3 tests/tools/op_profile.py train LOG_DIR LAYERS HIDDEN HEADS SEQ MICRO VOCAB ITERS
    python3 tests/tools/op_profile.py predict OUTPUT LAYERS HIDDEN HEADS SEQ MICRO VOCAB
    python3 tests/tools/op_profile.py route CUDNN_OUTPUT OWN_OUTPUT   (the built-in models' tables)
    python3 tests/tools/op_profile.py mlp FUSED_OUTPUT APART_OUTPUT   (table=2, cudnn_mlp=1 and 0)
    python3 tests/tools/op_profile.py residual OUTPUT LAYERS DROPOUT   (gpu_predict table=2 of a sequential model)

The restatement: every linear layer's product is 2·tokens·params forward and 4·tokens·params backward
(input and weight gradients), so the GEMM FLOPs of a step are 6·tokens·(12·L·H² + V·H) for a GPT-NeoX
layer (QKV 3H², dense H², MLP 8H²) and an untied output layer; causal attention scores T(T+1)/2
(query, key) pairs per head, with 2 products forward (q·k, p·v) and 5 backward (the scores
recomputed, dv, dp, dq, dk), 2·head_size FLOPs each."""
import json
import re
import sys


def expected(layers, hidden, heads, seq, micro, vocab):
    tokens = micro * seq
    gemm = 6.0 * tokens * (12 * layers * hidden * hidden + vocab * hidden)
    pairs = seq * (seq + 1) / 2
    attention = (2 + 5) * 2.0 * (hidden // heads) * pairs * heads * micro * layers
    return gemm, attention


def neox_formula(layers, hidden, seq, micro, vocab):
    # GPT-NeoX's get_flops (megatron/logging.py), no activation checkpointing.
    return 24 * 3 * micro * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def check_train(log_dir, layers, hidden, heads, seq, micro, vocab, iters):
    prof = json.load(open(f"{log_dir}/op_profile.json"))
    assert prof["iterations"] == iters, prof["iterations"]
    gemm, attention = expected(layers, hidden, heads, seq, micro, vocab)
    step = {k: v for k, v in prof["by_phase"].items() if k != "other"}
    # The step's ops only (the set-up's, phase "other", compute no products).
    got_gemm = prof["by_class"]["gemm"]["flops"]
    got_attn = prof["by_class"]["attention"]["flops"]
    assert close(got_gemm, gemm * iters), (got_gemm, gemm * iters)
    assert close(got_attn, attention * iters), (got_attn, attention * iters)
    for name, s in prof["by_op"].items():
        assert s["calls"] > 0 and s["ms"] > 0, (name, s)
    total = sum(s["ms"] for s in prof["by_class"].values())
    assert close(total, prof["total"]["ms"], 1e-6)
    # The step's ops happen inside the iterations, so their time is within the iterations' time.
    rows = [json.loads(line) for line in open(f"{log_dir}/metrics.jsonl")]
    iteration_ms = 1e3 * sum(r["runtime/iteration_time"] for r in rows if "runtime/iteration_time" in r) * \
        (iters / len([r for r in rows if "runtime/iteration_time" in r]))
    step_ms = sum(s["ms"] for s in step.values())
    assert 0 < step_ms <= iteration_ms, (step_ms, iteration_ms)
    assert set(step) == {"forward", "backward", "optimizer"}, step
    # Every layer has its forward and backward, with a layer's share of the products.
    assert [e["layer"] for e in prof["by_layer"]] == list(range(layers)), prof["by_layer"]
    per_layer = 6.0 * micro * seq * 12 * hidden * hidden + attention / layers
    for e in prof["by_layer"]:
        assert e["forward"]["ms"] > 0 and e["backward"]["ms"] > 0, e
        flops = e["forward"]["flops"] + e["backward"]["flops"]
        assert close(flops, per_layer * iters), (e, per_layer * iters)
    print(f"ok: {iters} iterations: GEMM {got_gemm:.6g} and attention {got_attn:.6g} FLOPs as restated; "
          f"step ops {step_ms:.1f} ms of {iteration_ms:.1f} ms; {layers} layers")


def check_predict(path, layers, hidden, heads, seq, micro, vocab):
    text = open(path).read()
    gemm, attention = expected(layers, hidden, heads, seq, micro, vocab)
    assert "the same ops, order, scopes and costs" in text, text
    table = {m.group(1): (int(m.group(2)), float(m.group(3)) * 1e9)
             for m in re.finditer(r"^  (\w+)\s+(\d+)\s+([\d.]+)\s+[\d.]+", text, re.M)}
    num = r"(\d[\d.e+-]*)"
    lines = re.findall(rf"^predict: (H100|H200) .*: {num} ms per step, .*? {num} model TFLOP/s, "
                       rf"MFU {num}% of 989 .*model FLOPs (\S+) \(GPT-NeoX's formula\), op FLOPs (\S+)$",
                       text, re.M)
    assert {l[0] for l in lines} == {"H100", "H200"}, lines
    formula = neox_formula(layers, hidden, seq, micro, vocab)
    for gpu, ms, tflops, mfu, model, ops in lines:
        ms, tflops, mfu, model, ops = map(float, (ms, tflops, mfu, model, ops))
        assert close(model, formula, 1e-3), (model, formula)
        # The op FLOPs are the restated products; GPT-NeoX's formula counts attention as full (not
        # causal) with a backward of twice the forward and the output layer at 3/4 of its products,
        # so the two agree to within 15% on GPT-NeoX shapes.
        assert close(ops, gemm + attention, 1e-3), (ops, gemm + attention)
        assert abs(ops / formula - 1) < 0.15, (ops, formula)
        assert close(tflops, formula / (ms * 1e-3) * 1e-12, 0.01), (tflops, formula, ms)
        assert close(mfu, 100 * tflops / 989, 0.01), (mfu, tflops)
    # The table: GEMM's FLOPs to its printed precision (0.1 GFLOP).
    assert abs(table["gemm"][1] - gemm) <= 0.051e9 + 1e-6 * gemm, (table["gemm"], gemm)
    print(f"ok: predicted op FLOPs {gemm + attention:.6g} = restated; formula {formula:.6g}")


# The attention rates docs/cuda.md gives ("Predicting a step"): cuDNN's published H100 rates at head
# size 64, sequence 2k (FlashAttention-3's paper), and the own kernels' modelled shares of the bf16
# GEMM rate the H200 measured; 4 us per call.
CUDNN_TFLOPS = {"forward": 334.0, "backward": 334.0}
OWN_SHARE = {"forward": 0.35, "backward": 0.35 * 0.7 * 0.78}
GEMM_TFLOPS, LAUNCH_MS = 692.8, 0.004


def attention_ms(layers, hidden, heads, seq, micro, rates):
    # Causal pairs; 2 products forward, 5 backward, 2·head_size FLOPs each, over micro·heads per
    # layer. At these sizes the products bound each call (their bytes take a fifth of the time).
    pairs = seq * (seq + 1) / 2
    products = {"forward": 2, "backward": 5}
    return sum(layers * (products[k] * 2.0 * (hidden // heads) * pairs * heads * micro / (rates[k] * 1e12) * 1e3
                         + LAUNCH_MS) for k in products)


def check_route(cudnn_path, own_path):
    # The 125M model (12 layers, 768 hidden, 12 heads, seq 2048) at micro-batch 32 on the H200: bf16
    # attention without dropout takes cuDNN's rates by default, the own kernels' with cudnn=0.
    shape = (12, 768, 12, 2048, 32)
    want = {"cudnn": attention_ms(*shape, CUDNN_TFLOPS),
            "own": attention_ms(*shape, {k: OWN_SHARE[k] * GEMM_TFLOPS for k in OWN_SHARE})}
    for route, path in (("cudnn", cudnn_path), ("own", own_path)):
        text = open(path).read()
        block = text.split("# 125M:")[1].split("# 350M:")[0]
        row = re.search(r"^  attention\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+%\s+([\d.]+)", block, re.M)
        assert row and int(row.group(1)) == 24, block
        got = float(row.group(2))
        assert abs(got - want[route]) <= 0.011, (route, got, want[route])
        print(f"ok: 125M attention on the H200, route {route}: {got} ms = restated {want[route]:.2f}")


COPY_GBS = 3942.0


def op_ms(block, op):
    row = re.search(rf"^  {op}\s+(\d+)\s+[\d.]+\s+[\d.]+\s+([\d.]+) ms", block, re.M)
    assert row, (op, block)
    return int(row.group(1)), float(row.group(2))


def check_mlp(fused_path, apart_path):
    # The 125M model at micro-batch 32 on the H200: with cuDNN's graphs the exact GELU costs nothing
    # beside the products (no activation rows at all); without, GELU's forward pass reads pre and
    # writes out, its backward reads the product's result and pre and writes dpre, all bf16 over
    # tokens x 4 hidden, at the copy bandwidth, plus a launch each, in each of the 12 layers.
    layers, hidden, tokens = 12, 768, 32 * 2048
    elems = tokens * 4 * hidden
    want = {"forward": layers * (2 * 2 * elems / (COPY_GBS * 1e9) * 1e3 + LAUNCH_MS),
            "backward": layers * (3 * 2 * elems / (COPY_GBS * 1e9) * 1e3 + LAUNCH_MS)}
    blocks = [open(p).read().split("# 125M:")[1].split("# 350M:")[0] for p in (fused_path, apart_path)]
    assert "activation_forward" not in blocks[0] and "activation_backward" not in blocks[0], blocks[0]
    for way in want:
        (n0, fused), (n1, apart) = op_ms(blocks[0], f"linear_act_{way}"), op_ms(blocks[1], f"linear_act_{way}")
        assert n0 == n1 == layers, (way, n0, n1)
        assert abs(apart - fused - want[way]) <= 0.011, (way, apart, fused, want[way])
        print(f"ok: 125M MLP {way} on the H200: {fused} ms fused, {apart} ms apart = + restated {want[way]:.2f}")
    # The QKV product's bias: with cuDNN its graph adds the fp32 bias and stores bf16; without, the
    # product goes into fp32 rows, which a pass of its own reads (4 bytes) and stores (2) over tokens x
    # 3 hidden, plus a launch, in each layer.
    rows = layers * ((4 + 2) * tokens * 3 * hidden / (COPY_GBS * 1e9) * 1e3 + LAUNCH_MS)
    (_, fused), (_, apart) = op_ms(blocks[0], "linear_forward"), op_ms(blocks[1], "linear_forward")
    assert abs(apart - fused - rows) <= 0.011, (apart, fused, rows)
    print(f"ok: 125M biased products on the H200: {fused} ms on cuDNN, {apart} ms through fp32 rows = + {rows:.2f}")
    steps = [float(re.search(r"^predict: H200 125M .*?: ([\d.]+) ms per step", open(p).read(), re.M).group(1))
             for p in (fused_path, apart_path)]
    assert abs(steps[1] - steps[0] - sum(want.values()) - rows) <= 0.06, (steps, want, rows)  # (4 digits)
    print(f"ok: 125M step on the H200 {steps[0]} ms fused, {steps[1]} ms apart")


def check_residual(path, layers, dropout):
    """The step's passes around the norms, counted from docs/model.md ("The residual adds and the
    norms"): each of a layer's two branches joins the residual stream in one add that makes the next
    norm (the MLP's, the next layer's first, the final one), so the only lone norm is the first
    layer's; the row-parallel bias is added by that add, or under hidden dropout before the mask by
    add_bias (one per branch); no separate residual add is left."""
    calls = {m.group(1): int(m.group(2)) for m in
             re.finditer(r"^  ([a-z_0-9]+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+ ms", open(path).read(), re.M)}
    want = {"add_layernorm_forward": 2 * layers, "layernorm_forward": 1, "add": 0,
            "add_bias": 2 * layers if dropout else 0}
    got = {op: calls.get(op, 0) for op in want}
    assert got == want, (got, want)
    print(f"ok: residual adds and norms {got}")


if __name__ == "__main__":
    mode, path, *rest = sys.argv[1:]
    if mode == "route":
        check_route(path, *rest)
    elif mode == "mlp":
        check_mlp(path, *rest)
    elif mode == "residual":
        check_residual(path, int(rest[0]), int(rest[1]))
    else:
        nums = [int(x) for x in rest]
        (check_train if mode == "train" else check_predict)(path, *nums)
