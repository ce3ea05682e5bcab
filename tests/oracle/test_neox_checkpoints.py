"""`neox-convert from-neox` and `to-neox` on checkpoints written by DeepSpeed's own engine (DeepSpeed
0.14.4 on the CPU, gloo; tests/oracle/neox_deepspeed_run.py): a GPT-NeoX-style model with GPT-NeoX's
parameter names trained 3 steps with AdamW and saved by `engine.save_checkpoint` at ZeRO-1 on one rank,
ZeRO-2 over two data-parallel ranks, and as GPT-NeoX's PipelineModule (per-layer files) by DeepSpeed's
PipelineEngine with one stage (GPT-NeoX's default pipe_parallel_size 1) and with two, and a Llama-style
model (GPT-NeoX's llama configs: RMSNorm's `scale`, `mlp.linear1` = [x | gate], no biases) at ZeRO-1, with
and without grouped-query attention (its QKV [q | k | v] per tensor-parallel rank; also over two
tensor-parallel ranks), and pipelines with GPT-NeoX's tied embedding (TiedLayerSpec) at one and two
stages, then trained 3 more steps. The import must hold DeepSpeed's fp32 master weights exactly (its own zero_to_fp32.py is
the reference without a pipeline; with one, the partitions joined by their param_slice_mappings,
restated here, as the moments are), the iteration, optimizer steps and AnnealingLR position; and
neox-train, resumed from it, must log the losses DeepSpeed's run logged for its next 3 steps (within
1e-5 relative, fp32). Back the other way, to-neox of the import must equal DeepSpeed's files tensor for
tensor, and DeepSpeed's engine must load it (load_checkpoint with its optimizer) at the run's own
layout and go on with neox-train's losses. Every sample is the same tokens, so the batches do not depend on the sample order
(the data position is checked as a number). DeepSpeed's start-up and its runs take most of the time:
one launch per world size runs every configuration of that size, once per module, the training runs and
then the reloads as two phases of the same processes."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
from safetensors.numpy import load_file  # noqa: E402

from data_oracle import BIN, write_indexed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = {"vocab": 512, "hidden": 32, "layers": 2, "heads": 4, "rotary_pct": 0.25, "seq": 16}
BEFORE, AFTER, MICRO, LR, WD = 3, 3, 2, 1e-3, 0.01
# name: (ZeRO stage, data-parallel ranks, pipeline stages: 0 without GPT-NeoX's PipelineModule,
# tensor-parallel ranks: Megatron's cuts, mp_rank_00/01)
CASES = {"zero1-dp1": (1, 1, 0, 1), "zero2-dp2": (2, 2, 0, 1), "pipe-pp1": (1, 1, 1, 1), "pipe-pp2": (1, 1, 2, 1),
         "tp2": (1, 1, 0, 2), "llama-zero1": (1, 1, 0, 1), "llama-gqa": (1, 1, 0, 1),
         "pipe-pp1-tied": (1, 1, 1, 1), "pipe-pp2-tied": (1, 1, 2, 1), "llama-gqa-tp2": (1, 1, 0, 2)}
# Pipeline runs with GPT-NeoX's default weight tying (no_weight_tying false): its TiedLayerSpec "embed",
# the embedding in layer_00's file and, named tied_modules.embed.*, in both end stages' optimizers.
TIED = {"pipe-pp1-tied", "pipe-pp2-tied"}
# Llama-style runs (GPT-NeoX's llama configs: RMSNorm's `scale`, swiglu's `mlp.linear1` = [x | gate], no
# biases, rotary on the whole head, sequential residual). GPT-NeoX's gated ParallelMLP from
# intermediate_size 96, mlp_multiple_of 16: 96 x 2/3 = 64 rows of linear1 (rounded to 2 x 16), 32 of x.
LLAMA = {"llama-zero1", "llama-gqa", "llama-gqa-tp2"}
LLAMA_MODEL = dict(MODEL, rotary_pct=1.0, ffn=32, rms_eps=1e-4)  # (an eps JSON writes without an exponent)
# Grouped-query attention (num_kv_heads 2 of 4 heads): GPT-NeoX's fused QKV is then [q | k | v] of each
# tensor-parallel rank's heads, not interleaved per head (llama-gqa-tp2: two ranks, one key/value head each).
GQA_MODEL = dict(LLAMA_MODEL, kv_heads=2)


def model_of(case):
    return GQA_MODEL if case.startswith("llama-gqa") else LLAMA_MODEL if case in LLAMA else MODEL


def llama_job(case):
    """What a case's DeepSpeed job adds: the Llama-style model, or the tied embedding."""
    return {"model": model_of(case), "llama": True} if case in LLAMA else {"tied": True} if case in TIED else {}
# The dimension Megatron cuts a parameter along over tensor-parallel ranks (None: whole on every rank).
TP_DIM = {"word_embeddings.weight": 0, "final_linear.weight": 0, "query_key_value.weight": 0, "query_key_value.bias": 0,
          "dense_h_to_4h.weight": 0, "dense_h_to_4h.bias": 0, "attention.dense.weight": 1, "dense_4h_to_h.weight": 1,
          "mlp.linear1.weight": 0, "mlp.linear2.weight": 1}


def tp_dim(name):
    return next((dim for part, dim in TP_DIM.items() if name.endswith(part)), None)
# to-neox's files DeepSpeed loads back, each at its run's layout (one launch per world size, as `runs`)
RELOADED = ["zero1-dp1", "pipe-pp1", "llama-zero1", "llama-gqa", "zero2-dp2", "pipe-pp2", "pipe-pp2-tied", "tp2",
            "llama-gqa-tp2"]
# Reloaded with to-neox's rotary inv_freq buffers into modules that register them as persistent
# (GPT-NeoX's rotary_save_freqs_buffer true), whose strict load needs them.
RELOADED_WITH_INV_FREQ = {"pipe-pp1"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample_tokens():
    rng = np.random.default_rng(7)
    doc = [int(t) for t in rng.integers(1, 250, size=MODEL["seq"])]
    return doc, doc + doc[:1]  # the stream repeats doc, so every sample of seq + 1 tokens is this


def neox_config(tmp, data, zero, load=None, save=None, tp=1, pp=1, llama=False, kv_heads=None, tied=False):
    cfg = {"num_layers": MODEL["layers"], "hidden_size": MODEL["hidden"], "num_attention_heads": MODEL["heads"],
           "seq_length": MODEL["seq"], "max_position_embeddings": MODEL["seq"], "pos_emb": "rotary",
           "rotary_pct": MODEL["rotary_pct"], "norm": "layernorm", "gpt_j_residual": True,
           "no_weight_tying": not tied, "activation": "gelu", "hidden_dropout": 0.0, "attention_dropout": 0.0,
           "optimizer": {"type": "Adam", "params": {"lr": LR, "betas": [0.9, 0.95]}},  # eps 1e-8, layernorm 1e-5: defaults
           "weight_decay": WD, "min_lr": 0.0, "lr_decay_style": "constant", "warmup": 0.0,
           "train_iters": BEFORE + AFTER, "lr_decay_iters": BEFORE + AFTER,
           "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": zero}, "model_parallel_size": tp, "pipe_parallel_size": pp,
           "eval_interval": 1000, "eval_iters": 1, "log_interval": 1, "split": "1000,0,0",
           "data_path": data, "tokenizer_type": "CharLevelTokenizer", "log_dir": str(tmp / "logs")}
    if llama:  # (GPT-NeoX's configs/llama/*.yml, small)
        cfg.update(norm="rmsnorm", rms_norm_epsilon=LLAMA_MODEL["rms_eps"], activation="swiglu", rotary_pct=1,
                   gpt_j_residual=False, use_bias_in_norms=False, use_bias_in_attn_linear=False, use_bias_in_mlp=False,
                   intermediate_size=96, mlp_multiple_of=16)
    if kv_heads:
        cfg["num_kv_heads"] = kv_heads
    if load:
        cfg["load"] = str(load)
    if save:
        cfg.update(save=str(save), checkpoint_factor=1000)
    path = tmp / "neox.yml"
    path.write_text(json.dumps(cfg))
    return path


def job(out, **extra):
    _, sample = sample_tokens()
    return dict({"out": str(out), "model": MODEL, "before": BEFORE, "after": AFTER, "micro_batch": MICRO, "lr": LR,
                 "min_lr": 0.0, "weight_decay": WD, "sample": sample}, **extra)


# The phases of each launch: the training runs, then DeepSpeed loading to-neox's files (`reloaded`).
PHASES = ("train", "reload")


def launch(root, name, world):
    """One DeepSpeed launch of `world` ranks that runs each phase's jobs once `start` writes them."""
    port, procs = str(free_port()), []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_PORT=port, OMP_NUM_THREADS="1")
        log = open(root / f"{name}-rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "neox_deepspeed_run.py"),
                                       *(str(root / f"{name}-{phase}.json") for phase in PHASES)],
                                      env=env, stdout=log, stderr=log))
    return [(p, root / f"{name}-rank{rank}.log") for rank, p in enumerate(procs)]


def start(root, name, phase, jobs):
    """Hands a phase its jobs (written whole, then renamed, so no rank reads part of the file)."""
    path = root / f"{name}-{phase}.json"
    path.with_suffix(".tmp").write_text(json.dumps({"jobs": jobs}))
    os.replace(path.with_suffix(".tmp"), path)


def wait_phase(root, name, phase, procs, seconds=600):
    """Until the launch's ranks have finished the phase; a rank that ends first fails the test."""
    done, deadline = root / f"{name}-{phase}.json.done", time.monotonic() + seconds
    while not done.exists():
        for p, log in procs:
            if p.poll() is not None:
                pytest.fail(f"DeepSpeed launch {log.name} ended (status {p.returncode}) in phase {phase}:\n"
                            + log.read_text()[-3000:])
        if time.monotonic() > deadline:
            pytest.fail(f"DeepSpeed launch {name}: phase {phase} not done in {seconds} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """DeepSpeed's ranks for the module, one launch per world size of CASES; at the end, the phases no
    test asked for are handed no jobs and every rank must exit cleanly."""
    root = tmp_path_factory.mktemp("neox_ds")
    worlds = sorted({dp * max(pp, 1) * tp for _, dp, pp, tp in CASES.values()})
    procs = {world: launch(root, f"world{world}", world) for world in worlds}
    yield root, procs
    for world, ranks in procs.items():
        for phase in PHASES:
            if not (root / f"world{world}-{phase}.json").exists():
                start(root, f"world{world}", phase, [])
    failed = []
    for ranks in procs.values():
        for p, log in ranks:
            try:
                status = p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
                status = "killed after 300 s"
            if status != 0:
                failed.append(f"{log.name}: {status}\n" + log.read_text()[-3000:])
    assert not failed, "DeepSpeed launches did not exit cleanly:\n" + "\n".join(failed)


def run_phase(launches, phase, by_world):
    """Runs each world size's jobs of one phase in its launch and waits for all of them."""
    root, procs = launches
    assert set(by_world) <= set(procs), (by_world.keys(), procs.keys())
    for world in procs:
        start(root, f"world{world}", phase, by_world.get(world, []))
    for world, ranks in procs.items():
        wait_phase(root, f"world{world}", phase, ranks)


@pytest.fixture(scope="module")
def runs(launches, tmp_path_factory):
    root = tmp_path_factory.mktemp("neox_ckpt")
    doc, _ = sample_tokens()
    data = str(root / "docs_text_document")
    write_indexed(data, [doc] * 64, np.uint16)
    by_world, out = {}, {}
    for name, (zero, dp, pp, tp) in CASES.items():
        d = root / name
        d.mkdir()
        llama = llama_job(name)
        by_world.setdefault(dp * max(pp, 1) * tp, []).append(job(d / "ds", zero=zero, pp=pp, tp=tp, **llama))
        out[name] = (d, zero, dp, data, pp)
    run_phase(launches, "train", by_world)
    return out


def to_neox(d, pp, out, *extra):
    args = ["--pp", str(pp)] if pp else []
    subprocess.run([f"{BIN}/neox-convert", "to-neox", "--input", str(d / "imported"), "--output", str(out), *args,
                    *extra], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def reloaded(runs, launches, tmp_path_factory):
    """DeepSpeed's engine (GPT-NeoX's default now: no rotary_emb.inv_freq in the state dict) loading
    to-neox's files of the imports, written for the run's own layout (data-parallel ranks and ZeRO
    stage, pipeline stages, tensor-parallel ranks), with load_checkpoint, optimizer and scheduler
    included, and training on: its losses per case, and neox-train's (one rank) from the import."""
    root = tmp_path_factory.mktemp("neox_reload")
    by_world, want = {}, {}
    for name in RELOADED:
        d, zero, dp, data, pp = runs[name]
        tp = CASES[name][3]
        import_run(d, zero, data)
        inv_freq = name in RELOADED_WITH_INV_FREQ
        to_neox(d, pp, root / name, "--dp", str(dp), "--zero", str(zero), "--tp", str(tp), *["--inv-freq"] * inv_freq)
        by_world.setdefault(dp * max(pp, 1) * tp, []).append(
            job(root / name / "ds", zero=zero, pp=pp, tp=tp, load=str(root / name), save_inv_freqs=inv_freq,
                **llama_job(name)))
        want[name] = neox_train_losses(d, zero, data)
    run_phase(launches, "reload", by_world)
    return {name: (json.loads((root / name / "ds" / "losses.json").read_text()), want[name]) for name in RELOADED}


def import_run(d, zero, data):
    cfg = neox_config(d, data, zero, tp=CASES[d.name][3], pp=max(CASES[d.name][2], 1),  # (the run's GPT-NeoX config)
                      llama=d.name in LLAMA, kv_heads=model_of(d.name).get("kv_heads"), tied=d.name in TIED)
    save = d / "imported"
    if not save.exists():
        r = subprocess.run([f"{BIN}/neox-convert", "from-neox", "--input", str(d / "ds"), "--config", str(cfg),
                            "--output", str(save)], check=True, capture_output=True, text=True)
        (d / "import.log").write_text(r.stderr)
    return save


HF_OF = {"0.word_embeddings.weight": "gpt_neox.embed_in.weight",
         f"{MODEL['layers'] + 3}.norm.weight": "gpt_neox.final_layer_norm.weight",
         f"{MODEL['layers'] + 3}.norm.bias": "gpt_neox.final_layer_norm.bias",
         f"{MODEL['layers'] + 4}.final_linear.weight": "embed_out.weight"}


def hf_name(neox):
    """GPT-NeoX's name (sequential.N.PART without a pipeline, N.PART in a PipelineModule) -> Hugging Face's."""
    neox = neox.removeprefix("sequential.")
    if neox in HF_OF:
        return HF_OF[neox]
    parts = neox.split(".")
    return f"gpt_neox.layers.{int(parts[0]) - 2}." + ".".join(parts[1:])


def llama_as_neox(hf, names, tp=1):
    """A Llama-style model's tensors under Hugging Face's names (`hf(name)`) restated under GPT-NeoX's
    (names: GPT-NeoX's, sequential.N.PART), as tp tensor-parallel ranks' shards join: the fused QKV
    interleaved per head from q_proj, k_proj, v_proj, or with fewer key/value heads (GPT-NeoX's
    gqa_project) each rank's [q_r; k_r; v_r]; linear1 each rank's [up_r; gate_r] (Gated_Activation's x,
    then gate); RMSNorm's `scale`."""
    L, heads = MODEL["layers"], MODEL["heads"]
    ends = {"0.word_embeddings.weight": "model.embed_tokens.weight", f"{L + 3}.norm.scale": "model.norm.weight",
            f"{L + 4}.final_linear.weight": "lm_head.weight"}
    parts = {"input_layernorm.scale": "input_layernorm.weight", "post_attention_layernorm.scale":
             "post_attention_layernorm.weight", "attention.dense.weight": "self_attn.o_proj.weight",
             "mlp.linear2.weight": "mlp.down_proj.weight"}
    out = {}
    for name in names:
        short = name.removeprefix("sequential.")
        layer, part = short.split(".", 1)
        pre = f"model.layers.{int(layer) - 2}."
        if short in ends:
            out[name] = hf(ends[short])
        elif part in parts:
            out[name] = hf(pre + parts[part])
        elif part == "attention.query_key_value.weight":
            q, k, v = (hf(pre + f"self_attn.{x}_proj.weight") for x in "qkv")
            if k.shape[0] != q.shape[0]:
                out[name] = np.concatenate([np.split(t, tp)[r] for r in range(tp) for t in (q, k, v)])
                continue
            per_head = [t.reshape(heads, -1, t.shape[-1]) for t in (q, k, v)]
            out[name] = np.concatenate(per_head, axis=1).reshape(-1, q.shape[-1])
        elif part == "mlp.linear1.weight":
            up, gate = hf(pre + "mlp.up_proj.weight"), hf(pre + "mlp.gate_proj.weight")
            out[name] = np.concatenate([np.split(t, tp)[r] for r in range(tp) for t in (up, gate)])
        else:
            raise AssertionError(f"no Llama-style restatement of {name}")
    return out


def h5_bytes(save, name):
    """A dataset of the imported checkpoint (its one shard) as raw bytes, read with h5dump."""
    step = (save / "latest").read_text().strip()
    raw = save.parent / "dataset.bin"
    subprocess.run(["h5dump", "-b", "LE", "-d", name, "-o", str(raw), str(save / step / "rank_00000.h5")],
                   check=True, capture_output=True)
    return raw.read_bytes()


def optimizer_checksums(save):
    """{optimizer/...: (shape, dtype, CRC-32)} of a checkpoint, read from `neox-convert inspect`."""
    out = subprocess.run([f"{BIN}/neox-convert", "inspect", str(save)], check=True, capture_output=True, text=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("optimizer/")]
    return {r[0]: (r[1], r[2], r[-1]) for r in rows}


def h5_tensor(save, name, shape):
    return np.frombuffer(h5_bytes(save, name), dtype=np.float32).reshape(shape)


def deepspeed_shapes(d, pp, tp_rank):
    """Each parameter's shape on a tensor-parallel rank, from the module (without a pipeline) or the layer files."""
    step = d / "ds" / f"global_step{BEFORE}"
    if not pp:
        module = torch.load(step / f"mp_rank_{tp_rank:02d}_model_states.pt")["module"]
        return {k: v.shape for k, v in module.items() if not k.endswith("rotary_emb.inv_freq")}  # (a buffer)
    return {f"{f.name.split('-')[0].removeprefix('layer_').lstrip('0') or '0'}.{k}": v.shape
            for f in step.glob(f"layer_*-model_{tp_rank:02d}-model_states.pt") for k, v in torch.load(f).items()
            if not k.endswith("rotary_emb.inv_freq")}


def deepspeed_optimizer(d, dp, pp, tp):
    """The fp32 master weights and Adam's exp_avg and exp_avg_sq per parameter, whole: every rank's
    partition (of every pipeline stage and tensor-parallel rank, mp_rank_YY = stage x tp + rank) cut
    by its param_slice_mappings, tensor-parallel shards joined along Megatron's cuts. A tied embedding
    (tied_modules.embed.*) is layer 0's; the last stage's copy must equal the first stage's."""
    pieces, later = {}, {}
    for stage, tp_rank in ((s, r) for s in range(max(pp, 1)) for r in range(tp)):
        for rank in range(dp):
            sd = torch.load(d / "ds" / f"global_step{BEFORE}" /
                            f"zero_pp_rank_{rank}_mp_rank_{stage * tp + tp_rank:02d}_optim_states.pt",
                            map_location="cpu")["optimizer_state_dict"]
            for g, mapping in enumerate(sd["param_slice_mappings"]):
                state = sd["base_optimizer_state"]["state"][g]
                for name, frag in mapping.items():
                    tied = name.startswith("tied_modules.embed.")
                    name = "0." + name.removeprefix("tied_modules.embed.") if tied else name
                    into = later if tied and stage > 0 else pieces
                    for key, t in (("master", sd["single_partition_of_fp32_groups"][g]), ("exp_avg", state["exp_avg"]),
                                   ("exp_avg_sq", state["exp_avg_sq"])):
                        into.setdefault((name, key), {}).setdefault(tp_rank, []).append(t.narrow(0, frag.start, frag.numel))
    for (name, key), by_rank in later.items():
        for r, parts in by_rank.items():
            assert torch.equal(torch.cat(parts), torch.cat(pieces[(name, key)][r])), (name, key, r)
    shapes = [deepspeed_shapes(d, pp, r) for r in range(tp)]
    whole = {}
    for (name, key), by_rank in pieces.items():
        shards = [torch.cat(by_rank[r]).reshape(shapes[r][name]) for r in range(tp)]
        whole[(name, key)] = shards[0] if tp_dim(name) is None else torch.cat(shards, tp_dim(name))
        if tp_dim(name) is None:
            assert all(torch.equal(s, shards[0]) for s in shards), (name, key)  # whole and equal on every rank
    return whole


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_holds_deepspeed_state(runs, case, tmp_path):
    d, zero, dp, data, pp = runs[case]
    tp = CASES[case][3]
    save = import_run(d, zero, data)
    step = (save / "latest").read_text().strip()
    assert step == f"global_step{BEFORE}"
    ds = d / "ds" / f"global_step{BEFORE}"
    subprocess.run([f"{BIN}/neox-convert", "to-hf", "--input", str(save), "--output", str(tmp_path / "hf")],
                   check=True, capture_output=True)
    ours = load_file(str(tmp_path / "hf" / "model.safetensors"))
    flat = deepspeed_optimizer(d, dp, pp, tp)
    shapes = {name: t.shape for (name, key), t in flat.items() if key == "master"}
    if pp or tp > 1:  # (zero_to_fp32 joins neither pipeline stages nor tensor-parallel shards)
        master = {name: flat[(name, "master")] for name in shapes}
    else:  # DeepSpeed's own reconstruction of the fp32 master weights from its ZeRO partitions
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        master = get_fp32_state_dict_from_zero_checkpoint(str(d / "ds"), tag=f"global_step{BEFORE}")
        master = {k: v for k, v in master.items() if k in shapes}
    llama = case in LLAMA
    mine = llama_as_neox(ours.__getitem__, master, tp) if llama else {name: ours[hf_name(name)] for name in master}
    assert len(mine) == len(master) == len(shapes) and len(ours) == len(master) + 3 * llama * MODEL["layers"]
    for name, t in master.items():
        np.testing.assert_array_equal(mine[name], t.detach().numpy(), err_msg=name)
    for key in ("exp_avg", "exp_avg_sq"):
        def moment(hf):
            return h5_tensor(save, f"optimizer/{key}/{hf}", ours[hf].shape)
        mine = llama_as_neox(moment, master, tp) if llama else {name: moment(hf_name(name)) for name in master}
        for name in master:
            np.testing.assert_array_equal(mine[name], flat[(name, key)].numpy().reshape(master[name].shape),
                                          err_msg=f"{key} {name}")
    state = json.loads(h5_bytes(save, "state/train.json"))
    client = torch.load(ds / "mp_rank_00_model_states.pt", map_location="cpu")
    assert state["iteration"] == client["iteration"] == BEFORE
    assert state["optimizer_steps"] == BEFORE and state["train_position"] == BEFORE
    assert state["lr_schedule"]["num_iters"] == client["lr_scheduler"]["num_iters"] == BEFORE
    log = (d / "import.log").read_text()  # the RNG states are named as not imported, numpy's skipped unread
    assert "'np_rng_state' is not imported (numpy's RNG state, skipped unread)" in log, log
    assert "'torch_rng_state' is not imported" in log and "'random_rng_state' is not imported" in log, log


def neox_train_losses(d, zero, data):
    """neox-train resumed from the import (once per case): its losses by iteration."""
    run = d / "continue"
    if not run.exists():
        run.mkdir()
        cfg = neox_config(run, data, zero, load=import_run(d, zero, data), llama=d.name in LLAMA,
                          kv_heads=model_of(d.name).get("kv_heads"), tied=d.name in TIED)
        subprocess.run([f"{BIN}/neox-train", "-q", str(cfg)], check=True, capture_output=True, text=True)
    return {r["iteration"]: r["train/lm_loss"] for r in map(json.loads, (run / "logs" / "metrics.jsonl").read_text()
                                                            .splitlines()) if "train/lm_loss" in r}


@pytest.mark.parametrize("case", sorted(CASES))
def test_neox_train_continues_the_run(runs, case):
    d, zero, dp, data, pp = runs[case]
    logged = neox_train_losses(d, zero, data)
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


def assert_same_state_dict(a, b, what):
    b = {k: v for k, v in b.items() if not k.endswith("inv_freq")}  # (a buffer of the older GPT-NeoX runs)
    assert list(a) == list(b), what
    for k, v in b.items():
        assert a[k].dtype == v.dtype and torch.equal(a[k], v), (what, k)


@pytest.mark.parametrize("case", sorted(CASES))
def test_to_neox_writes_deepspeeds_files(runs, case, tmp_path):
    d, zero, dp, data, pp = runs[case]
    tp = CASES[case][3]
    import_run(d, zero, data)
    to_neox(d, pp, tmp_path / "neox", "--dp", str(dp), "--zero", str(zero), "--tp", str(tp))
    ours, ds = tmp_path / "neox" / f"global_step{BEFORE}", d / "ds" / f"global_step{BEFORE}"
    assert (tmp_path / "neox" / "latest").read_text().strip() == f"global_step{BEFORE}"
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in ds.iterdir())
    for layer_file in ds.glob("layer_*"):  # a PipelineModule's layers, as DeepSpeed's save_state_dict wrote them
        assert_same_state_dict(load_plain(ours / layer_file.name), torch.load(layer_file), layer_file.name)
    for mp in range(max(pp, 1) * tp):
        a, b = load_plain(ours / f"mp_rank_{mp:02d}_model_states.pt"), torch.load(ds / f"mp_rank_{mp:02d}_model_states.pt")
        if pp:
            assert a["module"] is None and b["module"] is None
        else:
            assert_same_state_dict(a["module"], b["module"], "module")
        assert a["iteration"] == b["iteration"] and a["lr_scheduler"] == b["lr_scheduler"]
        assert a["mp_world_size"] == b["mp_world_size"] and a["dp_world_size"] == b["dp_world_size"]
    for rank, mp in ((r, m) for r in range(dp) for m in range(max(pp, 1) * tp)):
        name = f"zero_pp_rank_{rank}_mp_rank_{mp:02d}_optim_states.pt"
        A, B = load_plain(ours / name)["optimizer_state_dict"], torch.load(ds / name)["optimizer_state_dict"]
        assert A["zero_stage"] == B["zero_stage"] and A["group_paddings"] == B["group_paddings"]
        assert "loss_scaler" not in A and not B["loss_scaler"].dynamic  # (DeepSpeed keeps its own static one)
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


def test_to_neox_writes_gpt_neox_names(runs, tmp_path):
    """to-neox --mlp-names linear1 --inv-freq: the module DeepSpeed's run saved (its rotary_emb.inv_freq
    buffers persistent, as with GPT-NeoX's rotary_save_freqs_buffer) under GPT-NeoX's names since
    September 2024 (ParallelMLP's linear1/linear2 for dense_h_to_4h/dense_4h_to_h), every tensor equal,
    the buffers included; from-neox reads the files back bit-exact."""
    d, zero, _, data, _ = runs["zero1-dp1"]
    save = import_run(d, zero, data)
    to_neox(d, 0, tmp_path / "neox", "--mlp-names", "linear1", "--inv-freq")
    ours = load_plain(tmp_path / "neox" / f"global_step{BEFORE}" / "mp_rank_00_model_states.pt")["module"]
    ds = torch.load(d / "ds" / f"global_step{BEFORE}" / "mp_rank_00_model_states.pt")["module"]
    renamed = {k.replace("mlp.dense_h_to_4h.", "mlp.linear1.").replace("mlp.dense_4h_to_h.", "mlp.linear2."): v
               for k, v in ds.items()}
    assert sum(k.endswith("rotary_emb.inv_freq") for k in ours) == MODEL["layers"]
    assert sorted(ours) == sorted(renamed) and any("mlp.linear1." in k for k in ours)
    for k, v in renamed.items():
        assert ours[k].dtype == v.dtype and torch.equal(ours[k], v), k
    back = tmp_path / "back"
    subprocess.run([f"{BIN}/neox-convert", "from-neox", "--input", str(tmp_path / "neox"), "--config",
                    str(neox_config(tmp_path, data, zero)), "--output", str(back)], check=True, capture_output=True)
    assert optimizer_checksums(back) == optimizer_checksums(save)


@pytest.mark.parametrize("tp,dp", [(1, 3), (2, 2)])
def test_round_trip_is_bit_exact(runs, tmp_path, tp, dp):
    """neox.c -> to-neox (ZeRO-1 over three data ranks, whose partitions cut tensors; or two tensor-parallel
    ranks, Megatron's shards, by two data ranks) -> from-neox."""
    d, zero, _, data, _ = runs["zero2-dp2"]
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
    # Adam's moments: every tensor's shape and CRC-32 as `inspect` lists them (one call, not one h5dump a tensor).
    moments_a, moments_b = (optimizer_checksums(w) for w in (save, back))
    assert len(moments_a) == 2 * len(a) and moments_a == moments_b
    sa, sb = json.loads(h5_bytes(save, "state/train.json")), json.loads(h5_bytes(back, "state/train.json"))
    for field in ("iteration", "optimizer_steps", "train_position", "lr_schedule", "optimizer", "model"):
        assert sa[field] == sb[field], field


def rank_qkv(hf, layer, r, tp, kv_heads):
    """Tensor-parallel rank r's fused QKV of a Llama-style layer as GPT-NeoX's ParallelSelfAttention
    holds it (its ColumnParallelLinear's rows r of tp): [q k v] of each of its heads, or with fewer
    key/value heads (gqa_project splits the rank's output as [q | k | v]) its query heads, then its
    key heads, then its value heads, as GPT-NeoX's tools/ckpts/convert_neox_to_hf.py splits them."""
    heads, hd = MODEL["heads"], MODEL["hidden"] // MODEL["heads"]
    q, k, v = (hf[f"model.layers.{layer}.self_attn.{x}_proj.weight"] for x in "qkv")
    if kv_heads == heads:
        mine = [t.reshape(heads, hd, -1)[r * heads // tp:(r + 1) * heads // tp] for t in (q, k, v)]
        return np.concatenate(mine, axis=1).reshape(-1, MODEL["hidden"])
    return np.concatenate([np.split(t, tp)[r] for t in (q, k, v)])


@pytest.mark.parametrize("case", ["llama-zero1", "llama-gqa"])
def test_llama_tensor_parallel_files(runs, tmp_path, case):
    """A Llama-style import -> to-neox over two tensor-parallel ranks: each rank's fused QKV holds its
    own heads (rank_qkv) and its linear1 [up | gate] of its own rows (Gated_Activation chunks the shard's
    output), restated here from the Hugging Face export; -> from-neox is bit-exact."""
    d, zero, _, data, _ = runs[case]
    kv_heads = model_of(case).get("kv_heads", MODEL["heads"])
    save = import_run(d, zero, data)
    subprocess.run([f"{BIN}/neox-convert", "to-neox", "--input", str(save), "--output", str(tmp_path / "neox"),
                    "--tp", "2"], check=True, capture_output=True, text=True)
    subprocess.run([f"{BIN}/neox-convert", "to-hf", "--input", str(save), "--output", str(tmp_path / "hf")],
                   check=True, capture_output=True)
    hf = load_file(str(tmp_path / "hf" / "model.safetensors"))
    step = tmp_path / "neox" / f"global_step{BEFORE}"
    shards = [torch.load(step / f"mp_rank_{r:02d}_model_states.pt")["module"] for r in range(2)]
    for r, sd in enumerate(shards):
        np.testing.assert_array_equal(sd["sequential.3.attention.query_key_value.weight"].numpy(),
                                      rank_qkv(hf, 1, r, 2, kv_heads))
        rows = slice(r * LLAMA_MODEL["ffn"] // 2, (r + 1) * LLAMA_MODEL["ffn"] // 2)
        np.testing.assert_array_equal(sd["sequential.3.mlp.linear1.weight"].numpy(), np.concatenate(
            [hf["model.layers.1.mlp.up_proj.weight"][rows], hf["model.layers.1.mlp.gate_proj.weight"][rows]]))
        np.testing.assert_array_equal(sd["sequential.3.mlp.linear2.weight"].numpy(),
                                      hf["model.layers.1.mlp.down_proj.weight"][:, rows])
        np.testing.assert_array_equal(sd["sequential.3.input_layernorm.scale"].numpy(),
                                      hf["model.layers.1.input_layernorm.weight"])
    back = tmp_path / "back"
    subprocess.run([f"{BIN}/neox-convert", "from-neox", "--input", str(tmp_path / "neox"), "--config",
                    str(neox_config(tmp_path, data, 1, tp=2, llama=True, kv_heads=model_of(case).get("kv_heads"))),
                    "--output", str(back)], check=True,
                   capture_output=True, text=True)
    subprocess.run([f"{BIN}/neox-convert", "to-hf", "--input", str(back), "--output", str(tmp_path / "hf-back")],
                   check=True, capture_output=True)
    again = load_file(str(tmp_path / "hf-back" / "model.safetensors"))
    assert hf.keys() == again.keys()
    for k in hf:
        np.testing.assert_array_equal(hf[k], again[k], err_msg=k)
    assert optimizer_checksums(save) == optimizer_checksums(back)


@pytest.mark.parametrize("case", RELOADED)
def test_deepspeed_continues_from_to_neox(reloaded, case):
    """neox.c -> to-neox -> DeepSpeed's load_checkpoint (module or layer files, ZeRO partitions, Adam's
    state, AnnealingLR) -> 3 steps: neox-train's losses for the same steps."""
    ds, neox = reloaded[case]
    assert len(ds) == AFTER and sorted(neox) == list(range(BEFORE + 1, BEFORE + AFTER + 1))
    for i, loss in enumerate(ds, BEFORE + 1):
        assert abs(loss - neox[i]) <= 1e-5 * abs(neox[i]), f"iteration {i}: DeepSpeed {loss:.8g}, neox-train {neox[i]:.8g}"


def test_fp16_loss_scaler_is_deepspeeds(runs, tmp_path):
    """An fp16 neox.c run (2 steps, a dynamic scaler from the fp16 dict) -> to-neox: the ZeRO files hold
    DeepSpeed's own DynamicLossScaler (the object its optimizer takes back on load_checkpoint), equal to
    the one DeepSpeed's constructor makes from the same fp16 dict stepped as often; from-neox reads it back."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    _, _, _, data, _ = runs["zero1-dp1"]
    fp16 = {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 50, "hysteresis": 3, "min_loss_scale": 2}
    cfg = neox_config(tmp_path, data, 1, save=tmp_path / "save")
    cfg.write_text(json.dumps(dict(json.loads(cfg.read_text()), precision="fp16", fp16=fp16, train_iters=2)))
    subprocess.run([f"{BIN}/neox-train", "-q", str(cfg)], check=True, capture_output=True, text=True)
    subprocess.run([f"{BIN}/neox-convert", "to-neox", "--input", str(tmp_path / "save"), "--output", str(tmp_path / "neox")],
                   check=True, capture_output=True, text=True)
    path = tmp_path / "neox" / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4: weights_only with DeepSpeed's class allowed
        torch.serialization.add_safe_globals([DynamicLossScaler])
        osd = torch.load(path, weights_only=True)["optimizer_state_dict"]
    else:
        assert pickle_globals(path) <= WEIGHTS_ONLY_GLOBALS | {
            "deepspeed.runtime.fp16.loss_scaler DynamicLossScaler", "torch float16"}, pickle_globals(path)
        osd = torch.load(path)["optimizer_state_dict"]
    ours = osd["loss_scaler"]
    want = DynamicLossScaler(init_scale=2.0 ** 12, scale_window=50, min_scale=2, delayed_shift=3,
                             consecutive_hysteresis=False, dtype=torch.float16)
    for _ in range(2):
        want.update_scale(False)
    assert type(ours) is DynamicLossScaler and osd["dynamic_loss_scale"] is True
    assert vars(ours) == vars(want)
    subprocess.run([f"{BIN}/neox-convert", "from-neox", "--input", str(tmp_path / "neox"), "--config", str(cfg),
                    "--output", str(tmp_path / "back")], check=True, capture_output=True, text=True)
    a, b = (json.loads(h5_bytes(w, "state/train.json"))["loss_scaler"] for w in (tmp_path / "save", tmp_path / "back"))
    assert a == b and a["scale"] == 4096.0
