"""Reward-model training's loss and gradients against a torch restatement of GPT-NeoX's forward_step
for train_impl: rm (megatron/training.py): the model is the decoder with its output layer replaced by
a bias-free hidden -> 1 projection (GPT-NeoX's RowParallelLinear(hidden, 1) of ParallelLinear with
is_rm; here Hugging Face's ...ForSequenceClassification `score` applied at every position, before its
own pooling), the chosen rows then the rejected rows of one batch, each row's value gathered at the
nonzero positions of its loss mask exactly as forward_step gathers them, and loss =
-logsigmoid(pos - neg).mean() + (z_loss * (pos**2 + neg**2)).mean(). The C driver
(tests/drivers/model_parity.c, value_head=1 z_loss=) runs neox.c's forward, its loss (neox_rm_loss)
and the backward of the value gradients it gives; the values, loss and every parameter gradient must
agree to 1e-5."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import test_model_parity as parity  # noqa: E402

F = torch.nn.functional
PAIRS, T, VOCAB = 3, 9, parity.VOCAB


def reward_model(kind, kwargs):
    """A ...ForSequenceClassification (num_labels 1) with random weights, as parity.make_model makes them."""
    _, cfg = parity.make_model(kind, kwargs)
    cfg.num_labels = 1
    cls = {"neox": transformers.GPTNeoXForSequenceClassification,
           "llama": transformers.LlamaForSequenceClassification}[kind]
    torch.manual_seed(4321)
    model = cls(cfg)
    model.config._attn_implementation = "eager"
    parity.randomize_weights(model)
    return model.float().train(), cfg


def per_position_values(model, ids):
    backbone = model.gpt_neox if hasattr(model, "gpt_neox") else model.model
    return model.score(backbone(input_ids=ids).last_hidden_state)  # (2B, T, 1)


def pair_batch():
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, VOCAB, (2 * PAIRS, T), generator=g)
    targets = torch.randint(0, VOCAB, (2 * PAIRS, T), generator=g)
    # One scored position per row (the reward token), at different places in chosen and rejected rows.
    mask = torch.zeros(2 * PAIRS, T)
    for row in range(2 * PAIRS):
        mask[row, T - 1 - (row * 2) % 5] = 1.0
    return ids, targets, mask


def neox_rm_forward_step(model, ids, loss_mask, z_loss):
    """GPT-NeoX's forward_step for train_impl rm, restated."""
    outputs = per_position_values(model, ids)
    pos, neg = torch.chunk(outputs, 2, 0)
    pos_loss_mask, neg_loss_mask = torch.chunk(loss_mask, 2, 0)
    pos_indx = pos_loss_mask.nonzero()[:, 1].unsqueeze(1)
    neg_indx = neg_loss_mask.nonzero()[:, 1].unsqueeze(1)
    pos = torch.gather(pos.squeeze(), dim=1, index=pos_indx)
    neg = torch.gather(neg.squeeze(), dim=1, index=neg_indx)
    metrics = {"pos_values": pos.detach().mean(), "neg_values": neg.detach().mean(),
               "margin": (pos - neg).detach().mean(), "accuracy": ((pos - neg) > 0).float().mean()}
    loss = (-F.logsigmoid(pos - neg).mean()) + ((z_loss * (pos ** 2 + neg ** 2)).mean())
    return loss, outputs, metrics


CASES = ["neox-sequential-rotary25-gelu-untied", "llama-gqa-swiglu-rmsnorm-untied",
         "neox-parallel-no-attn-bias-checkpointed"]


def run(tmp_path, model, cfg, kind, extra, ids, targets, mask, z_loss):
    return parity.run_driver(tmp_path, model, cfg, kind, extra, ids, targets, mask,
                             more=["value_head=1", f"z_loss={z_loss}"])


@pytest.mark.parametrize("case,z_loss", [(CASES[0], 0.0), (CASES[1], 0.1), (CASES[2], 1.0)])
def test_rm_loss_and_gradients(case, z_loss, tmp_path):
    kind, kwargs, extra = parity.CASES[case]
    model, cfg = reward_model(kind, kwargs)
    ids, targets, mask = pair_batch()
    loss, outputs, _ = neox_rm_forward_step(model, ids, mask, z_loss)
    loss.backward()
    out = run(tmp_path, model, cfg, kind, extra, ids, targets, mask, z_loss)
    parity.close(out["values"], outputs.detach().squeeze(-1), "values")
    parity.close(out["loss"], loss.detach().reshape(1), "reward-model loss")
    names = [name for name, _ in model.named_parameters()]
    assert "score.weight" in names and model.score.bias is None
    # Without z_loss the final norm's bias gets (-g + g) w per pair: zero in exact arithmetic, so its
    # rounding noise is compared with the largest gradient of the model rather than its own.
    largest = max(p.grad.abs().max().item() for p in model.parameters())
    for name, p in model.named_parameters():
        ours, ref = out["grad." + name], p.grad
        if ref.abs().max().item() < 1e-6:
            assert (ours - ref).abs().max().item() <= 1e-5 * largest, name
        else:
            parity.close(ours, ref, "gradient of " + name)


def test_z_loss_gradient_pulls_rewards_to_zero(tmp_path):
    """With a large z_loss, one SGD step along the returned gradients shrinks the rewards' squares;
    without it the same step widens the margin."""
    kind, kwargs, extra = parity.CASES[CASES[1]]
    model, cfg = reward_model(kind, kwargs)
    ids, targets, mask = pair_batch()

    def rewards(m):
        with torch.no_grad():
            _, _, metrics = neox_rm_forward_step(m, ids, mask, 0.0)
            v = per_position_values(m, ids).squeeze(-1)[mask.bool()]
        return metrics["margin"].item(), (v ** 2).mean().item()

    margin0, square0 = rewards(model)
    for z_loss, lr, check in ((0.0, 0.02, "margin"), (1.0, 0.005, "square")):
        stepped, _ = reward_model(kind, kwargs)
        out = run(tmp_path, stepped, cfg, kind, extra, ids, targets, mask, z_loss)
        with torch.no_grad():
            for name, p in stepped.named_parameters():
                p -= lr * out["grad." + name]
        margin, square = rewards(stepped)
        if check == "margin":
            assert margin > margin0, (margin0, margin)
        else:
            assert square < 0.9 * square0, (square0, square)
