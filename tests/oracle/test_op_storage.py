"""The CPU ops with bfloat16 activation storage (kernels/kernels.h, "Activation storage") against
torch restatements: the driver tests/drivers/op_storage.c runs one op on bf16 inputs and the
restatement computes the same formula in float64 on the same (widened) inputs and rounds the result
to bf16 once, as torch's .to(torch.bfloat16) does (to nearest even). Ops that round one fp32 sum or
product (add, add_bias, dropout) must give the same bits; the others may differ by one unit in the
last place of bf16 where the float64 and the kernel's fp32 value fall on either side of a rounding
boundary. Statistics and parameter gradients stay fp32 and are held to 1e-5 relative."""
import math
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from safetensors.torch import load_file, save_file  # noqa: E402

DRIVER = "build/cpu/tests/drivers/op_storage"
N, C = 37, 200
F64 = torch.float64
BF16_ULP = 2.0 ** -8  # the spacing of bf16 relative to the value, at worst

# neox_act_fn numbers (kernels/kernels.h) and their torch restatements
ACTS = {
    0: lambda x: torch.nn.functional.gelu(x),
    1: lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    4: lambda x: torch.nn.functional.silu(x),
}


def run(tmp_path, op, inputs, n=N, c=C, fn=None):
    if not os.access(DRIVER, os.X_OK):
        pytest.fail(f"{DRIVER} is missing (run 'make test-drivers')")
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    cmd = [DRIVER, op, str(tmp_path / "in.safetensors"), str(out), str(n), str(c)] + ([str(fn)] if fn is not None else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert proc.returncode == 0, proc.stderr
    return load_file(str(out))


def bf16(shape, lo=-2.0, hi=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)).to(torch.bfloat16)


def f32(shape, lo=-1.0, hi=1.0, seed=0):
    g = torch.Generator().manual_seed(1000 + seed)
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)


def exact(ours, ref_f64, what):
    ref = ref_f64.to(torch.float32).to(torch.bfloat16)
    assert ours.dtype == torch.bfloat16, what
    diff = (ours.float() != ref.float().reshape(-1)).sum().item()
    assert diff == 0, f"{what}: {diff} elements differ from the restatement rounded once"


def within_ulp(ours, ref_f64, what, atol=1e-6):
    """Each bf16 element within one bf16 unit of the float64 restatement (plus atol near zero)."""
    assert ours.dtype == torch.bfloat16, what
    err = (ours.to(F64).reshape(ref_f64.shape) - ref_f64).abs()
    allowed = BF16_ULP * ref_f64.abs() + atol
    worst = (err / allowed).max().item()
    assert worst <= 1.0, f"{what}: error {worst:.3g} times one bf16 unit"


def close32(ours, ref_f64, what, rtol=1e-5):
    scale = ref_f64.abs().max().item()
    err = (ours.to(F64).reshape(ref_f64.shape) - ref_f64).abs().max().item()
    assert err <= rtol * max(scale, 1e-6), f"{what}: {err:.3g} exceeds {rtol} of {scale:.3g}"


def test_add(tmp_path):
    x, y = bf16((N, C), seed=1), bf16((N, C), seed=2)
    exact(run(tmp_path, "add", {"x": x, "y": y})["out"], x.to(F64) + y.to(F64), "add")


def test_add_bias(tmp_path):
    x, b = bf16((N, C), seed=3), f32((C,), seed=3)
    exact(run(tmp_path, "add_bias", {"x": x, "bias": b})["out"], (x.float() + b).to(F64), "add_bias")


def splitmix_uniform(seed, index):
    """neox_uniform restated: splitmix64 of (seed, index), the top 24 bits as a fraction."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + index.astype(np.uint64) + np.uint64(0x632BE59BD9B4E019)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)).astype(np.float64) / 16777216.0


def test_dropout(tmp_path):
    x = bf16((N * C,), seed=4)
    keep = torch.from_numpy(splitmix_uniform(7, np.arange(100, 100 + N * C, dtype=np.uint64)) >= 0.25)
    scale = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(0.75, dtype=torch.float32)
    ref = torch.where(keep, x.float() * scale, torch.zeros(())).to(F64)
    exact(run(tmp_path, "dropout", {"x": x})["out"], ref, "dropout")


@pytest.mark.parametrize("fn", sorted(ACTS))
def test_activation(fn, tmp_path):
    x, d = bf16((N, C), -5, 5, seed=5), bf16((N, C), seed=6)
    xr = x.to(F64).requires_grad_()
    y = ACTS[fn](xr)
    (g,) = torch.autograd.grad(y, xr, d.to(F64))
    # atol: the fp32 erf/tanh of the kernels lose a few fp32 units where 1 + erf cancels (x near -5)
    within_ulp(run(tmp_path, "activation_forward", {"x": x}, fn=fn)["out"], y.detach(), f"activation {fn}", atol=1e-5)
    within_ulp(run(tmp_path, "activation_backward", {"x": x, "dout": d}, fn=fn)["out"], g, f"activation grad {fn}",
               atol=1e-5)


@pytest.mark.parametrize("fn", sorted(ACTS))
def test_gated(fn, tmp_path):
    x, d = bf16((N, 2 * C), -5, 5, seed=7), bf16((N, C), seed=8)
    xr = x.to(F64).requires_grad_()
    y = ACTS[fn](xr[:, C:]) * xr[:, :C]  # GPT-NeoX's Gated_Activation: the gate is the second half
    (g,) = torch.autograd.grad(y, xr, d.to(F64))
    within_ulp(run(tmp_path, "gated_forward", {"x": x}, fn=fn)["out"], y.detach(), f"gated {fn}", atol=1e-5)
    within_ulp(run(tmp_path, "gated_backward", {"x": x, "dout": d}, fn=fn)["out"], g, f"gated grad {fn}", atol=1e-5)


def test_qkv_split_merge(tmp_path):
    """The split into heads and its inverse move bf16 elements as they are."""
    HS = C // 8
    x = bf16((N, 8 * HS), seed=17)
    out = run(tmp_path, "qkv_split", {"x": x})
    q, k, v = x[:, :4 * HS], x[:, 4 * HS:6 * HS], x[:, 6 * HS:]
    heads = lambda t, h: t.reshape(N, h, HS).transpose(0, 1).reshape(-1)  # (T, H*HS) -> (H, T, HS)
    for name, t, h in (("q", q, 4), ("k", k, 2), ("v", v, 2)):
        exact(out[name], heads(t, h).to(F64), "qkv_split " + name)
    back = run(tmp_path, "qkv_merge", {"q": out["q"], "k": out["k"], "v": out["v"]})["out"]
    exact(back, x.to(F64), "qkv_merge")


@pytest.mark.parametrize("inverse", [0, 1])
def test_rotary(inverse, tmp_path):
    """GPT-NeoX's rotate-half on bf16 heads: pairs (i, i + C/2) rotated by the tables' angles."""
    x = bf16((N, C), seed=18)
    ang = torch.arange(N, dtype=F64)[:, None] * 10000.0 ** (-torch.arange(C // 2, dtype=F64) * 2 / C)
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    sn = (-1 if inverse else 1) * sin.to(F64)
    x1, x2 = x[:, :C // 2].to(F64), x[:, C // 2:].to(F64)
    ref = torch.cat([x1 * cos.to(F64) - x2 * sn, x2 * cos.to(F64) + x1 * sn], 1)
    out = run(tmp_path, "rotary_apply", {"x": x, "cos": cos, "sin": sin}, fn=inverse)["out"]
    within_ulp(out, ref, f"rotary inverse={inverse}", atol=1e-5)


def norm_ref(x, w, b, rms, eps=1e-5):
    if rms:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


@pytest.mark.parametrize("rms", [0, 1], ids=["layernorm", "rmsnorm"])
def test_norm_forward(rms, tmp_path):
    x, w, b = bf16((N, C), -2, 3, seed=9), f32((C,), 0.5, 1.5, seed=9), f32((C,), seed=10)
    name = "rmsnorm" if rms else "layernorm"
    out = run(tmp_path, f"{name}_forward", {"x": x, "weight": w, **({} if rms else {"bias": b})})
    xd = x.to(F64)
    within_ulp(out["out"], norm_ref(xd, w.to(F64), b.to(F64), rms), name, atol=1e-5)
    ms = xd.pow(2).mean(-1) if rms else xd.var(-1, unbiased=False)
    close32(out["rstd"], torch.rsqrt(ms + 1e-5), name + " rstd")
    if not rms:
        close32(out["mean"], xd.mean(-1), name + " mean")


@pytest.mark.parametrize("rms", [0, 1], ids=["layernorm", "rmsnorm"])
def test_add_norm_forward(rms, tmp_path):
    """The residual add fused before the norm: the sum is stored (rounded) and the norm reads it."""
    x, y = bf16((N, C), seed=11), bf16((N, C), seed=12)
    w, b = f32((C,), 0.5, 1.5, seed=11), f32((C,), seed=12)
    name = "rmsnorm" if rms else "layernorm"
    out = run(tmp_path, f"add_{name}_forward", {"x": x, "y": y, "weight": w, **({} if rms else {"bias": b})})
    s = (x.float() + y.float()).to(torch.bfloat16)
    exact(out["sum"], s.to(F64), "add_" + name + " sum")
    within_ulp(out["out"], norm_ref(s.to(F64), w.to(F64), b.to(F64), rms), "add_" + name, atol=1e-5)


@pytest.mark.parametrize("rms", [0, 1], ids=["layernorm", "rmsnorm"])
def test_norm_backward(rms, tmp_path):
    x, dout, dinp = bf16((N, C), -2, 3, seed=13), bf16((N, C), seed=14), bf16((N, C), seed=15)
    w, b = f32((C,), 0.5, 1.5, seed=13), f32((C,), seed=14)
    dw0, db0 = f32((C,), seed=15), f32((C,), seed=16)
    xd = x.to(F64)
    ms = xd.pow(2).mean(-1) if rms else xd.var(-1, unbiased=False)
    rstd = torch.rsqrt(ms + 1e-5).float()
    mean = xd.mean(-1).float()
    name = "rmsnorm" if rms else "layernorm"
    inputs = {"x": x, "dout": dout, "dinp": dinp, "weight": w, "dweight": dw0, "rstd": rstd}
    if not rms:
        inputs.update(bias=b, dbias=db0, mean=mean)
    out = run(tmp_path, f"{name}_backward", inputs)
    xr, wr, br = xd.clone().requires_grad_(), w.to(F64).requires_grad_(), b.to(F64).requires_grad_()
    y = norm_ref(xr, wr, br, rms)
    gx, gw, gb = torch.autograd.grad(y, (xr, wr, br), dout.to(F64), allow_unused=True)
    # dinp is added to (the residual stream's gradient), then stored once
    within_ulp(out["dinp"], dinp.to(F64) + gx, name + " dinp", atol=1e-4)
    close32(out["dweight"], dw0.to(F64) + gw, name + " dweight", rtol=1e-4)
    if not rms:
        close32(out["dbias"], db0.to(F64) + gb, name + " dbias", rtol=1e-4)


EMB_V = 11  # the driver's table rows


def test_embedding(tmp_path):
    """The lookup (+ positions) summed in fp32 and rounded once; the gradient widens the bf16 rows and
    adds them into the fp32 tables."""
    g = torch.Generator().manual_seed(19)
    ids = torch.randint(-1, EMB_V, (N,), generator=g, dtype=torch.int32)
    wte, wpe = f32((EMB_V, C), seed=19), f32((N, C), seed=20)
    rows = torch.where((ids >= 0)[:, None], wte[ids.clamp(min=0).long()], torch.zeros(()))
    out = run(tmp_path, "embedding_forward", {"ids": ids, "wte": wte, "wpe": wpe})["out"]
    exact(out, (rows + wpe).to(F64), "embedding_forward")
    dout, dwte0, dwpe0 = bf16((N, C), seed=21), f32((EMB_V, C), seed=22), f32((N, C), seed=23)
    got = run(tmp_path, "embedding_backward", {"ids": ids, "dout": dout, "dwte": dwte0, "dwpe": dwpe0})
    keep = ids >= 0
    ref = dwte0.to(F64).index_add(0, ids[keep].long(), dout[keep].to(F64))
    close32(got["dwte"], ref, "embedding_backward dwte")
    close32(got["dwpe"], dwpe0.to(F64) + dout.to(F64), "embedding_backward dwpe")


@pytest.mark.parametrize("V", [C, 2500])
def test_cross_entropy(tmp_path, V):
    """Logits stored in bf16: the statistics from the widened logits (fp32 losses and lse, the sums of
    exponentials in double), the gradient (softmax - onehot) x mask / N rounded once, in place. The
    CPU visits a 16-bit row in blocks of 1024 elements: V = 2500 spans two and a short one."""
    x = bf16((N, V), -8, 8, seed=24)
    g = torch.Generator().manual_seed(24)
    t = torch.randint(0, V, (N,), generator=g, dtype=torch.int32)
    t[0] = -1  # a position that is not scored
    w = f32((N,), 0, 1, seed=24)
    out = run(tmp_path, "cross_entropy", {"x": x, "targets": t, "weight": w}, c=V)
    z = x.to(F64)
    lse = torch.logsumexp(z, -1)
    scored = t >= 0
    tl = torch.where(scored, z.gather(1, t.clamp(min=0).long()[:, None])[:, 0], torch.zeros((), dtype=F64))
    close32(out["lse"], lse, "cross_entropy lse")
    close32(out["losses"], torch.where(scored, lse - tl, torch.zeros((), dtype=F64)), "cross_entropy losses")
    close32(out["mx"], z.max(-1).values, "cross_entropy row_max", rtol=0)
    close32(out["sumexp"], torch.exp(z - z.max(-1, keepdim=True).values).sum(-1), "cross_entropy row_sumexp")
    close32(out["target_logit"], tl, "cross_entropy target_logit", rtol=0)
    onehot = torch.nn.functional.one_hot(t.clamp(min=0).long(), V).to(F64) * scored[:, None]
    grad = (torch.softmax(z, -1) - onehot) * (w.to(F64) / N)[:, None]
    within_ulp(out["dlogits"], grad, "cross_entropy dlogits", atol=1e-7)


LIN_OC = 24  # the driver's linear layer outputs


@pytest.mark.parametrize("accumulate", [0, 1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear(accumulate, with_bias, tmp_path):
    """bf16 inputs and weights (the weights' bf16 copy), the products and the bias summed in fp32 and
    rounded once; the input gradient (plus its old value when accumulating) rounded once; the weight
    and bias gradients fp32, added to. Without a bias (the output layer) the forward rounds the
    product as it is stored (on AVX512_BF16 CPUs, straight from the product's registers)."""
    x, w, b = bf16((N, C), seed=25), bf16((LIN_OC, C), seed=26), f32((LIN_OC,), seed=25)
    dout, dinp0 = bf16((N, LIN_OC), seed=27), bf16((N, C), seed=28)
    dw0, db0 = f32((LIN_OC, C), seed=26), f32((LIN_OC,), seed=27)
    out = run(tmp_path, "linear", {"x": x, "w16": w, "bias": b, "dout": dout, "dinp": dinp0, "dweight": dw0,
                                   "dbias": db0}, fn=accumulate | (0 if with_bias else 2))
    xd, wd, dd = x.to(F64), w.to(F64), dout.to(F64)
    # atol: fp32 sums of 200 products near a cancellation to zero
    within_ulp(out["out"], xd @ wd.T + (b.to(F64) if with_bias else 0), "linear out", atol=1e-5)
    within_ulp(out["dinp"], dd @ wd + (dinp0.to(F64) if accumulate else 0), "linear dinp", atol=1e-5)
    close32(out["dweight"], dw0.to(F64) + dd.T @ xd, "linear dweight")
    close32(out["dbias"], db0.to(F64) + dd.sum(0), "linear dbias")


ATT_NH, ATT_NKV, ATT_HS = 4, 2, 16  # the driver's heads (GQA groups of two) and head size


def test_attention(tmp_path):
    """Causal GQA attention on bf16 q, k, v (fp32 operands): out is the float64 attention of the
    stored values, rounded once; lse stays fp32. The backward is flash attention's (as torch's
    scaled_dot_product_attention backward is): D_i = dout_i . out_i from the stored (bf16) out,
    dS = P * (dout v^T - D) * scale, dq = dS k, dk = dS^T q, dv = P^T dout, each rounded once."""
    T, group = N, ATT_NH // ATT_NKV
    q, k, v = (bf16((h, T, ATT_HS), seed=29 + i) for i, h in enumerate((ATT_NH, ATT_NKV, ATT_NKV)))
    dout = bf16((T, ATT_NH * ATT_HS), seed=32)
    out = run(tmp_path, "attention", {"q": q, "k": k, "v": v, "dout": dout})
    qd, kd, vd = q.to(F64), k.to(F64).repeat_interleave(group, 0), v.to(F64).repeat_interleave(group, 0)
    s = qd @ kd.transpose(1, 2) * 0.25
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    p = torch.softmax(s, -1)
    heads = lambda t: t.reshape(T, ATT_NH, ATT_HS).transpose(0, 1)  # (T, NH * HS) -> (NH, T, HS)
    within_ulp(out["out"], (p @ vd).transpose(0, 1).reshape(T, -1), "attention out", atol=1e-5)
    close32(out["lse"], torch.logsumexp(s, -1), "attention lse")
    do, o = heads(dout.to(F64)), heads(out["out"].to(F64))
    D = (do * o).sum(-1, keepdim=True)
    ds = p * (do @ vd.transpose(1, 2) - D) * 0.25
    per_group = lambda t: t.reshape(ATT_NKV, group, T, ATT_HS).sum(1)
    within_ulp(out["dq"], ds @ kd, "attention dq", atol=1e-5)
    within_ulp(out["dk"], per_group(ds.transpose(1, 2) @ qd), "attention dk", atol=1e-5)
    within_ulp(out["dv"], per_group(p.transpose(1, 2) @ do), "attention dv", atol=1e-5)


def test_jitter(tmp_path):
    """GPT-NeoX's router noise: x * (low + u * (high - low)), the fp32 product rounded once."""
    x = bf16((N * C,), seed=30)
    u = torch.from_numpy(splitmix_uniform(7, np.arange(N * C, dtype=np.uint64))).float()
    low = torch.tensor(1.0 - 0.1, dtype=torch.float32)
    span = torch.tensor(1.0 + 0.1, dtype=torch.float32) - low
    exact(run(tmp_path, "jitter", {"x": x})["out"], (x.float() * (low + u * span)).to(F64), "jitter")


SCALE_EPS = 1e-8  # the driver's ScaleNorm eps


def scalenorm_ref(x, g):
    """GPT-NeoX's ScaleNorm: x / clamp(||x||, eps) * g."""
    return x / x.norm(dim=-1, keepdim=True).clamp(min=SCALE_EPS) * g


def scalenorm_input():
    x = bf16((N, C), -2, 3, seed=31)
    x[0] = torch.full((C,), 1e-12).to(torch.bfloat16)  # a row whose norm is clamped to eps
    return x


def test_scalenorm_forward(tmp_path):
    x, g = scalenorm_input(), f32((1,), 0.5, 1.5, seed=31)
    out = run(tmp_path, "scalenorm_forward", {"x": x, "g": g})
    xd = x.to(F64)
    within_ulp(out["out"], scalenorm_ref(xd, g.to(F64)), "scalenorm", atol=1e-5)
    close32(out["rnorm"], 1.0 / xd.norm(dim=-1).clamp(min=SCALE_EPS), "scalenorm rnorm")


def test_scalenorm_backward(tmp_path):
    x, g = scalenorm_input(), f32((1,), 0.5, 1.5, seed=32)
    dout, dinp, dg0 = bf16((N, C), seed=33), bf16((N, C), seed=34), f32((1,), seed=35)
    xd = x.to(F64)
    rnorm = (1.0 / xd.norm(dim=-1).clamp(min=SCALE_EPS)).float()
    out = run(tmp_path, "scalenorm_backward", {"x": x, "g": g, "dout": dout, "dinp": dinp, "dg": dg0, "rnorm": rnorm})
    xr, gr = xd.clone().requires_grad_(), g.to(F64).requires_grad_()
    gx, gg = torch.autograd.grad(scalenorm_ref(xr, gr), (xr, gr), dout.to(F64))
    within_ulp(out["dinp"], dinp.to(F64) + gx, "scalenorm dinp", atol=1e-4)
    close32(out["dg"], dg0.to(F64) + gg, "scalenorm dg", rtol=1e-4)


HN_H = 4  # the driver's query/key norm heads: x is (1, HN_H, N, C / HN_H)


def head_norm_ref(x, w, b, rms, eps=1e-5):
    """x: (H, T, HS). GPT-NeoX's LayerNorm([heads, head_size]) over all heads of a token, or its
    RMSNorm over each head's last dim; weight and bias (H, HS)."""
    xt = x.transpose(0, 1)  # (T, H, HS)
    if rms:
        y = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + eps) * w
    else:
        y = torch.nn.functional.layer_norm(xt, tuple(xt.shape[1:]), w, b, eps)
    return y.transpose(0, 1)


def head_norm_stats(xd, rms, eps=1e-5):
    xt = xd.transpose(0, 1)  # (T, H, HS)
    if rms:
        return None, torch.rsqrt(xt.pow(2).mean(-1) + eps).reshape(-1)
    flat = xt.reshape(xt.shape[0], -1)
    return flat.mean(-1), torch.rsqrt(flat.var(-1, unbiased=False) + eps)


@pytest.mark.parametrize("rms", [0, 1], ids=["layernorm", "rmsnorm"])
def test_head_norm_forward(rms, tmp_path):
    HS = C // HN_H
    x, w, b = bf16((HN_H, N, HS), -2, 3, seed=36), f32((HN_H, HS), 0.5, 1.5, seed=36), f32((HN_H, HS), seed=37)
    out = run(tmp_path, "head_norm_forward", {"x": x, "weight": w, **({} if rms else {"bias": b})}, fn=rms)
    xd = x.to(F64)
    within_ulp(out["out"], head_norm_ref(xd, w.to(F64), b.to(F64), rms), "head_norm", atol=1e-5)
    mean, rstd = head_norm_stats(xd, rms)
    close32(out["rstd"], rstd, "head_norm rstd")
    if not rms:
        close32(out["mean"], mean, "head_norm mean")


@pytest.mark.parametrize("rms", [0, 1], ids=["layernorm", "rmsnorm"])
def test_head_norm_backward(rms, tmp_path):
    HS = C // HN_H
    x, dout = bf16((HN_H, N, HS), -2, 3, seed=38), bf16((HN_H, N, HS), seed=39)
    w, b = f32((HN_H, HS), 0.5, 1.5, seed=38), f32((HN_H, HS), seed=39)
    dw0, db0 = f32((HN_H, HS), seed=40), f32((HN_H, HS), seed=41)
    xd = x.to(F64)
    mean, rstd = head_norm_stats(xd, rms)
    inputs = {"x": x, "dout": dout, "weight": w, "dweight": dw0, "rstd": rstd.float()}
    if not rms:
        inputs.update(bias=b, dbias=db0, mean=mean.float())
    out = run(tmp_path, "head_norm_backward", inputs, fn=rms)
    xr, wr, br = xd.clone().requires_grad_(), w.to(F64).requires_grad_(), b.to(F64).requires_grad_()
    gx, gw, gb = torch.autograd.grad(head_norm_ref(xr, wr, br, rms), (xr, wr, br), dout.to(F64), allow_unused=True)
    within_ulp(out["dinp"], gx, "head_norm dinp (overwritten, in place)", atol=1e-4)
    close32(out["dweight"], dw0.to(F64) + gw, "head_norm dweight", rtol=1e-4)
    if not rms:
        close32(out["dbias"], db0.to(F64) + gb, "head_norm dbias", rtol=1e-4)


MOE_K = 2  # the driver's expert slots per token


def test_gather_rows(tmp_path):
    """MoE's gather moves the stored bf16 elements as they are."""
    x = bf16((N, C), seed=42)
    perm = torch.randperm(N * MOE_K, generator=torch.Generator().manual_seed(42)).to(torch.int32) % N
    out = run(tmp_path, "gather_rows", {"x": x, "perm": perm})["out"]
    exact(out, x[perm.long()].to(F64), "gather_rows")


def test_moe_combine(tmp_path):
    """out[t] = sum_k weight[t, k] * rows[slot[t, k]] (fp32 sum rounded once) and its backward:
    drows[slot[t, k]] = weight[t, k] * dout[t] (one product rounded once), dweight = dout[t] . rows."""
    nk = N * MOE_K
    rows, dout = bf16((nk, C), seed=43), bf16((N, C), seed=44)
    slot = torch.randperm(nk, generator=torch.Generator().manual_seed(43)).to(torch.int32)
    w = f32((nk,), 0.0, 1.0, seed=43)
    out = run(tmp_path, "moe_combine", {"rows": rows, "slot": slot, "weight": w, "dout": dout})
    rr, wr = rows.to(F64).requires_grad_(), w.to(F64).requires_grad_()
    picked = rr[slot.long()].reshape(N, MOE_K, C)
    y = (wr.reshape(N, MOE_K, 1) * picked).sum(1)
    within_ulp(out["out"], y.detach(), "moe_combine", atol=1e-6)
    g_rows, g_w = torch.autograd.grad(y, (rr, wr), dout.to(F64))
    drows = (w.reshape(N, MOE_K, 1) * dout.float().reshape(N, 1, C)).reshape(nk, C)  # fp32 products, by token slot
    ref = torch.empty_like(drows)
    ref[slot.long()] = drows
    exact(out["drows"], ref.to(F64), "moe_combine_backward drows")
    assert torch.allclose(ref.to(F64), g_rows, rtol=1e-6, atol=0), "the restated drows is the autograd gradient"
    close32(out["dweight"], g_w, "moe_combine_backward dweight")
