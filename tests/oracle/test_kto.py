"""KTO's loss, gradients and metrics against a torch restatement of GPT-NeoX's forward_step for
train_impl: kto (megatron/training.py, after TRL's KTO trainer): log p(label) of every position from
the fp32 log-softmax of a Hugging Face model, times the loss mask, for the policy and for a frozen
reference (a second model with other weights); the batch split into halves by torch.chunk, each
half's clamped KL estimate detached as the other half's baseline, the per-row weights from the
rewards' sums against the 0.001 thresholds, and GPT-NeoX's nine metrics. The C driver
(tests/drivers/model_parity.c, kto_beta=) runs neox.c's policy forward, its KTO loss (neox_kto_loss)
and the backward of the token weights it gives; loss, metrics and every parameter gradient must
agree to 1e-5."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import torch.nn.functional as F  # noqa: E402
import test_model_parity as parity  # noqa: E402

B, T, VOCAB = 6, 9, parity.VOCAB


def kto_batch():
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    targets = torch.randint(0, VOCAB, (B, T), generator=g)
    mask = torch.zeros(B, T)
    rewards = torch.zeros(B, T)
    # Rows as GPT2Dataset gives them unpacked: a document's reward over its tokens, then the next
    # document's reward on one position, then padding (0); prompts unscored.
    per_row = [1.0, -1.0, 1.0, -1.0, 0.0, 1.0]
    for row in range(B):
        length = T - row % 3
        mask[row, 1 + row % 2:length - 1] = 1.0
        rewards[row, :length] = per_row[row]
        if length < T:
            rewards[row, length] = per_row[(row + 1) % B]
    return ids, targets, mask, rewards


def token_logps(model, ids, targets, mask):
    logits = model(input_ids=ids).logits.float()  # kto_fp32
    return torch.gather(logits.log_softmax(-1), 2, targets.unsqueeze(-1)).squeeze(-1) * mask


def gpt_neox_kto(chosen_logp, ref_logp, rewards, loss_mask, beta, w_d, w_u):
    """GPT-NeoX's forward_step for train_impl kto, from the log-probabilities on."""
    scaling = (rewards.sum(-1) > 0.001).float() * w_d
    scaling += (rewards.sum(-1) < -0.001).float() * w_u
    pos_mask = (rewards > 0.001).float()
    neg_mask = (rewards < -0.001).float()
    with torch.no_grad():
        metrics = [
            ref_logp.sum(-1).mean(),
            chosen_logp.detach().sum(-1).mean(),
            (ref_logp * pos_mask).sum(-1).mean(),
            (ref_logp * neg_mask).sum(-1).mean(),
            (chosen_logp.detach() * pos_mask).sum(-1).mean(),
            (chosen_logp.detach() * neg_mask).sum(-1).mean(),
            (chosen_logp.detach() - ref_logp).sum() / loss_mask.sum(),
        ]
        policy_rewards = beta * rewards * (chosen_logp.detach() - ref_logp)
        metrics += [(policy_rewards.sum(-1) > 0.0).float().mean(), policy_rewards.sum()]
    pol1, pol2 = torch.chunk(chosen_logp, 2, 0)
    ref1, ref2 = torch.chunk(ref_logp, 2, 0)
    rw1, rw2 = torch.chunk(rewards, 2, 0)
    sc1, sc2 = torch.chunk(scaling, 2, 0)
    kl1 = torch.clamp((pol1 - ref1).sum(-1), min=0).mean()
    kl2 = torch.clamp((pol2 - ref2).sum(-1), min=0).mean()
    loss = (0.5 * sc1.mean(-1) * (1 - torch.sigmoid(beta * rw1.mean(-1) * ((pol1 - ref1).sum(-1) - kl2.detach())))) + (
        0.5 * sc2.mean(-1) * (1 - torch.sigmoid(beta * rw2.mean(-1) * ((pol2 - ref2).sum(-1) - kl1.detach()))))
    return loss.mean(), torch.stack([m.reshape(()) for m in metrics])


@pytest.mark.parametrize("case,beta,w_d,w_u", [
    ("neox-sequential-rotary25-gelu-untied", 0.1, 1.0, 1.0),
    ("llama-gqa-swiglu-rmsnorm-untied", 0.5, 1.0, 1.33),
    ("neox-parallel-rotary100-gelutanh-tied", 2.0, 0.7, 1.0),
])
def test_kto_loss_metrics_and_gradients(case, beta, w_d, w_u, tmp_path):
    kind, kwargs, extra = parity.CASES[case]
    torch.manual_seed(5)
    policy, cfg = parity.make_model(kind, kwargs)
    reference, _ = parity.make_model(kind, kwargs)
    with torch.no_grad():  # other weights than the policy's
        g = torch.Generator().manual_seed(8)
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    ids, targets, mask, rewards = kto_batch()
    with torch.no_grad():
        ref = token_logps(reference.eval(), ids, targets, mask)
    loss, metrics = gpt_neox_kto(token_logps(policy, ids, targets, mask), ref, rewards, mask, beta, w_d, w_u)
    assert loss.item() > 0 and metrics[6].abs() > 1e-3  # a reference that differs from the policy
    loss.backward()
    out = run(tmp_path, policy, cfg, kind, extra, ids, targets, mask, ref, rewards, beta, w_d, w_u)
    parity.close(out["loss"], loss.detach().reshape(1), "KTO loss")
    parity.close(out["kto_metrics"], metrics.float(), "KTO metrics")
    for name, p in policy.named_parameters():
        parity.close(out["grad." + name], p.grad, "gradient of " + name)


def run(tmp_path, model, cfg, kind, extra, ids, targets, mask, ref, rewards, beta, w_d=1.0, w_u=1.0):
    more = [f"kto_beta={beta}", f"kto_desirable_weight={w_d}", f"kto_undesirable_weight={w_u}"]
    return parity.run_driver(tmp_path, model, cfg, kind, extra, ids, targets, mask, more=more,
                             inputs={"ref_logprobs": ref.double().contiguous(), "rewards": rewards.contiguous()})


def test_kto_step_raises_desirable_and_lowers_undesirable(tmp_path):
    """One SGD step along the returned gradients raises the log-probability of the desirable rows
    and lowers that of the undesirable ones (reference = policy)."""
    kind, kwargs, extra = parity.CASES["llama-gqa-swiglu-rmsnorm-untied"]
    torch.manual_seed(6)
    policy, cfg = parity.make_model(kind, kwargs)
    ids, targets, mask, rewards = kto_batch()
    with torch.no_grad():
        ref = token_logps(policy, ids, targets, mask)
    out = run(tmp_path, policy, cfg, kind, extra, ids, targets, mask, ref, rewards, 1.0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            p -= 0.5 * out["grad." + name]
        after = token_logps(policy, ids, targets, mask).sum(-1) - ref.sum(-1)
    good, bad = rewards.sum(-1) > 0.001, rewards.sum(-1) < -0.001
    assert after[good].mean() > 0 > after[bad].mean(), after
