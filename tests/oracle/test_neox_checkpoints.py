"""`neox-convert from-neox` on checkpoints written by DeepSpeed's own engine (DeepSpeed 0.14.4 on the
CPU, gloo; tests/oracle/neox_deepspeed_run.py): a GPT-NeoX-style model with GPT-NeoX's parameter
names trained 3 steps with AdamW and saved by `engine.save_checkpoint` at ZeRO-1 on one rank and
ZeRO-2 over two data-parallel ranks, then trained 3 more steps. The import must hold DeepSpeed's
fp32 master weights exactly (its own zero_to_fp32.py is the reference), Adam's moments exactly (the
ZeRO partitions joined by their param_slice_mappings, restated here), the iteration, optimizer steps
and AnnealingLR position; and neox-train, resumed from it, must log the losses DeepSpeed's run logged
for its next 3 steps (within 1e-5 relative, fp32). Every sample is the same tokens, so the batches
do not depend on the sample order (the data position is checked as a number). DeepSpeed's import and
the two runs take most of the time: one module-scoped fixture makes them once."""
import json
import os
import socket
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
from safetensors.numpy import load_file  # noqa: E402

from data_oracle import BIN, write_indexed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = {"vocab": 512, "hidden": 32, "layers": 2, "heads": 4, "rotary_pct": 0.25, "seq": 16}
BEFORE, AFTER, MICRO, LR, WD = 3, 3, 2, 1e-3, 0.01
CASES = {"zero1-dp1": (1, 1), "zero2-dp2": (2, 2)}  # name: (ZeRO stage, data-parallel ranks)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample_tokens():
    rng = np.random.default_rng(7)
    doc = [int(t) for t in rng.integers(1, 250, size=MODEL["seq"])]
    return doc, doc + doc[:1]  # the stream repeats doc, so every sample of seq + 1 tokens is this


def neox_config(tmp, data, zero, load=None, save=None, tp=1):
    cfg = {"num_layers": MODEL["layers"], "hidden_size": MODEL["hidden"], "num_attention_heads": MODEL["heads"],
           "seq_length": MODEL["seq"], "max_position_embeddings": MODEL["seq"], "pos_emb": "rotary",
           "rotary_pct": MODEL["rotary_pct"], "norm": "layernorm", "gpt_j_residual": True,
           "no_weight_tying": True, "activation": "gelu", "hidden_dropout": 0.0, "attention_dropout": 0.0,
           "optimizer": {"type": "Adam", "params": {"lr": LR, "betas": [0.9, 0.95]}},  # eps 1e-8, layernorm 1e-5: defaults
           "weight_decay": WD, "min_lr": 0.0, "lr_decay_style": "constant", "warmup": 0.0,
           "train_iters": BEFORE + AFTER, "lr_decay_iters": BEFORE + AFTER,
           "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": zero}, "model_parallel_size": tp, "pipe_parallel_size": 1,
           "eval_interval": 1000, "eval_iters": 1, "log_interval": 1, "split": "1000,0,0",
           "data_path": data, "tokenizer_type": "CharLevelTokenizer", "log_dir": str(tmp / "logs")}
    if load:
        cfg["load"] = str(load)
    if save:
        cfg.update(save=str(save), checkpoint_factor=1000)
    path = tmp / "neox.yml"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("neox_ckpt")
    doc, sample = sample_tokens()
    data = str(root / "docs_text_document")
    write_indexed(data, [doc] * 64, np.uint16)
    procs, out = [], {}
    for name, (zero, dp) in CASES.items():
        d = root / name
        d.mkdir()
        spec = {"out": str(d / "ds"), "model": MODEL, "zero": zero, "before": BEFORE, "after": AFTER,
                "micro_batch": MICRO, "lr": LR, "min_lr": 0.0, "weight_decay": WD, "sample": sample}
        (d / "spec.json").write_text(json.dumps(spec))
        port = str(free_port())
        for rank in range(dp):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(dp), MASTER_PORT=port, OMP_NUM_THREADS="1")
            log = open(d / f"rank{rank}.log", "w")
            procs.append((subprocess.Popen([sys.executable, os.path.join(HERE, "neox_deepspeed_run.py"),
                                            str(d / "spec.json")], env=env, stdout=log, stderr=log), d, rank))
        out[name] = (d, zero, dp, data)
    for p, d, rank in procs:
        if p.wait(timeout=600) != 0:
            pytest.fail(f"DeepSpeed run {d.name} rank {rank} failed:\n" + (d / f"rank{rank}.log").read_text()[-3000:])
    return out


def import_run(d, zero, data):
    cfg = neox_config(d, data, zero)
    save = d / "imported"
    if not save.exists():
        r = subprocess.run([f"{BIN}/neox-convert", "from-neox", "--input", str(d / "ds"), "--config", str(cfg),
                            "--output", str(save)], check=True, capture_output=True, text=True)
        (d / "import.log").write_text(r.stderr)
    return save


HF_OF = {"sequential.0.word_embeddings.weight": "gpt_neox.embed_in.weight",
         f"sequential.{MODEL['layers'] + 3}.norm.weight": "gpt_neox.final_layer_norm.weight",
         f"sequential.{MODEL['layers'] + 3}.norm.bias": "gpt_neox.final_layer_norm.bias",
         f"sequential.{MODEL['layers'] + 4}.final_linear.weight": "embed_out.weight"}


def hf_name(neox):
    if neox in HF_OF:
        return HF_OF[neox]
    parts = neox.split(".")
    return f"gpt_neox.layers.{int(parts[1]) - 2}." + ".".join(parts[2:])


def h5_bytes(save, name):
    """A dataset of the imported checkpoint (its one shard) as raw bytes, read with h5dump."""
    step = (save / "latest").read_text().strip()
    raw = save.parent / "dataset.bin"
    subprocess.run(["h5dump", "-b", "LE", "-d", name, "-o", str(raw), str(save / step / "rank_00000.h5")],
                   check=True, capture_output=True)
    return raw.read_bytes()


def h5_tensor(save, name, shape):
    return np.frombuffer(h5_bytes(save, name), dtype=np.float32).reshape(shape)


def deepspeed_moments(d, dp):
    """Adam's exp_avg and exp_avg_sq per parameter: every rank's partition cut by its param_slice_mappings."""
    moments = {}
    for rank in range(dp):
        sd = torch.load(d / "ds" / f"global_step{BEFORE}" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
                        map_location="cpu")["optimizer_state_dict"]
        for g, mapping in enumerate(sd["param_slice_mappings"]):
            state = sd["base_optimizer_state"]["state"][g]
            for name, frag in mapping.items():
                for key in ("exp_avg", "exp_avg_sq"):
                    part = state[key].narrow(0, frag.start, frag.numel)
                    moments.setdefault((name, key), []).append(part)
    return {k: torch.cat(v) for k, v in moments.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_holds_deepspeed_state(runs, case, tmp_path):
    d, zero, dp, data = runs[case]
    save = import_run(d, zero, data)
    step = (save / "latest").read_text().strip()
    assert step == f"global_step{BEFORE}"
    ds = d / "ds" / f"global_step{BEFORE}"
    subprocess.run([f"{BIN}/neox-convert", "to-hf", "--input", str(save), "--output", str(tmp_path / "hf")],
                   check=True, capture_output=True)
    ours = load_file(str(tmp_path / "hf" / "model.safetensors"))
    # DeepSpeed's own reconstruction of the fp32 master weights from its ZeRO partitions.
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    master = get_fp32_state_dict_from_zero_checkpoint(str(d / "ds"), tag=f"global_step{BEFORE}")
    master = {k: v for k, v in master.items() if not k.endswith("rotary_emb.inv_freq")}  # buffers, not parameters
    assert len(ours) == len(master)
    for name, t in master.items():
        np.testing.assert_array_equal(ours[hf_name(name)], t.detach().numpy(), err_msg=name)
    for (name, key), t in deepspeed_moments(d, dp).items():
        shape = tuple(master[name].shape)
        np.testing.assert_array_equal(h5_tensor(save, f"optimizer/{key}/{hf_name(name)}", shape),
                                      t.numpy().reshape(shape), err_msg=f"{key} {name}")
    state = json.loads(h5_bytes(save, "state/train.json"))
    client = torch.load(ds / "mp_rank_00_model_states.pt", map_location="cpu")
    assert state["iteration"] == client["iteration"] == BEFORE
    assert state["optimizer_steps"] == BEFORE and state["train_position"] == BEFORE
    assert state["lr_schedule"]["num_iters"] == client["lr_scheduler"]["num_iters"] == BEFORE
    log = (d / "import.log").read_text()  # the RNG states are named as not imported, numpy's skipped unread
    assert "'np_rng_state' is not imported (numpy's RNG state, skipped unread)" in log, log
    assert "'torch_rng_state' is not imported" in log and "'random_rng_state' is not imported" in log, log


@pytest.mark.parametrize("case", sorted(CASES))
def test_neox_train_continues_the_run(runs, case):
    d, zero, dp, data = runs[case]
    save = import_run(d, zero, data)
    run = d / "continue"
    run.mkdir(exist_ok=True)
    cfg = neox_config(run, data, zero, load=save)
    subprocess.run([f"{BIN}/neox-train", "-q", str(cfg)], check=True, capture_output=True, text=True)
    logged = {r["iteration"]: r["train/lm_loss"] for r in map(json.loads, (run / "logs" / "metrics.jsonl").read_text()
                                                              .splitlines()) if "train/lm_loss" in r}
    want = json.loads((d / "ds" / "losses.json").read_text())
    assert sorted(logged) == list(range(BEFORE + 1, BEFORE + AFTER + 1))
    for i in range(BEFORE + 1, BEFORE + AFTER + 1):
        assert abs(logged[i] - want[i - 1]) <= 1e-5 * abs(want[i - 1]), \
            f"iteration {i}: neox.c {logged[i]:.8g}, DeepSpeed {want[i - 1]:.8g}"


# Globals torch's weights_only loader allows that to-neox may write (torch 1.13's loader also lacks the
# BINFLOAT opcode every float needs, so where it is that old the files are checked by their globals).
WEIGHTS_ONLY_GLOBALS = {"torch._utils _rebuild_tensor_v2", "collections OrderedDict", "torch FloatStorage"}


def pickle_globals(path):
    import pickletools
    import zipfile
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    return {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


def load_plain(path):
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 0):
        return torch.load(path, weights_only=True)
    assert pickle_globals(path) <= WEIGHTS_ONLY_GLOBALS, path
    return torch.load(path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_to_neox_writes_deepspeeds_files(runs, case, tmp_path):
    d, zero, dp, data = runs[case]
    save = import_run(d, zero, data)
    subprocess.run([f"{BIN}/neox-convert", "to-neox", "--input", str(save), "--output", str(tmp_path / "neox"),
                    "--dp", str(dp), "--zero", str(zero)], check=True, capture_output=True, text=True)
    ours, ds = tmp_path / "neox" / f"global_step{BEFORE}", d / "ds" / f"global_step{BEFORE}"
    assert (tmp_path / "neox" / "latest").read_text().strip() == f"global_step{BEFORE}"
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in ds.iterdir())
    a, b = load_plain(ours / "mp_rank_00_model_states.pt"), torch.load(ds / "mp_rank_00_model_states.pt")
    module = {k: v for k, v in b["module"].items() if not k.endswith("inv_freq")}
    assert list(a["module"]) == list(module)
    for k, v in module.items():
        assert a["module"][k].dtype == v.dtype and torch.equal(a["module"][k], v), k
    assert a["iteration"] == b["iteration"] and a["lr_scheduler"] == b["lr_scheduler"]
    for rank in range(dp):
        name = f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        A, B = load_plain(ours / name)["optimizer_state_dict"], torch.load(ds / name)["optimizer_state_dict"]
        assert A["zero_stage"] == B["zero_stage"] and A["group_paddings"] == B["group_paddings"]
        assert A["partition_count"] == B["partition_count"]
        for g in range(2):
            assert torch.equal(A["single_partition_of_fp32_groups"][g], B["single_partition_of_fp32_groups"][g])
            sa, sb = A["base_optimizer_state"]["state"][g], B["base_optimizer_state"]["state"][g]
            assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
            assert float(sa["step"]) == float(sb["step"])
            assert {k: (v["numel"], v["start"]) for k, v in A["param_slice_mappings"][g].items()} == \
                {k: (v.numel, v.start) for k, v in B["param_slice_mappings"][g].items()}
            pa, pb = A["base_optimizer_state"]["param_groups"][g], B["base_optimizer_state"]["param_groups"][g]
            assert {k: pa[k] for k in ("lr", "eps", "weight_decay", "params")} == \
                {k: pb[k] for k in ("lr", "eps", "weight_decay", "params")} and tuple(pa["betas"]) == tuple(pb["betas"])


@pytest.mark.parametrize("tp,dp", [(1, 3), (2, 2)])
def test_round_trip_is_bit_exact(runs, tmp_path, tp, dp):
    """neox.c -> to-neox (ZeRO-1 over three data ranks, whose partitions cut tensors; or two tensor-parallel
    ranks, Megatron's shards, by two data ranks) -> from-neox."""
    d, zero, _, data = runs["zero2-dp2"]
    save = import_run(d, zero, data)
    subprocess.run([f"{BIN}/neox-convert", "to-neox", "--input", str(save), "--output", str(tmp_path / "neox"),
                    "--tp", str(tp), "--dp", str(dp), "--zero", "1"], check=True, capture_output=True, text=True)
    step = tmp_path / "neox" / f"global_step{BEFORE}"
    assert sorted(p.name for p in step.iterdir()) == sorted(
        [f"mp_rank_{r:02d}_model_states.pt" for r in range(tp)]
        + [f"zero_pp_rank_{q}_mp_rank_{r:02d}_optim_states.pt" for r in range(tp) for q in range(dp)])
    if tp == 2:  # Megatron's cuts: QKV by rows, the attention output by columns, norms whole
        whole = torch.load(d / "ds" / f"global_step{BEFORE}" / "mp_rank_00_model_states.pt")["module"]
        shards = [torch.load(step / f"mp_rank_{r:02d}_model_states.pt")["module"] for r in range(2)]
        for name, dim in [("sequential.2.attention.query_key_value.weight", 0), ("sequential.2.attention.dense.weight", 1),
                          ("sequential.0.word_embeddings.weight", 0), ("sequential.2.input_layernorm.weight", None)]:
            if dim is None:
                assert all(torch.equal(s[name], whole[name]) for s in shards)
            else:
                assert torch.equal(torch.cat([s[name] for s in shards], dim), whole[name]), name
    back = tmp_path / "back"
    subprocess.run([f"{BIN}/neox-convert", "from-neox", "--input", str(tmp_path / "neox"), "--config",
                    str(neox_config(tmp_path, data, 1, tp=tp)), "--output", str(back)], check=True, capture_output=True,
                   text=True)
    for which in (save, back):
        subprocess.run([f"{BIN}/neox-convert", "to-hf", "--input", str(which), "--output", str(tmp_path / f"hf-{which.name}")],
                       check=True, capture_output=True)
    a, b = (load_file(str(tmp_path / f"hf-{w.name}" / "model.safetensors")) for w in (save, back))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        for key in ("exp_avg", "exp_avg_sq"):
            assert h5_bytes(save, f"optimizer/{key}/{k}") == h5_bytes(back, f"optimizer/{key}/{k}"), (key, k)
    sa, sb = json.loads(h5_bytes(save, "state/train.json")), json.loads(h5_bytes(back, "state/train.json"))
    for field in ("iteration", "optimizer_steps", "train_position", "lr_schedule", "optimizer", "model"):
        assert sa[field] == sb[field], field
