"""DPO's loss and gradients against a torch restatement of GPT-NeoX's forward_step for
train_impl: dpo (megatron/training.py): the chosen rows then the rejected rows of one batch,
log p(label) of every position gathered from the policy's fp32 log-softmax, summed over each
sequence's loss mask, the frozen reference model's sums the same way (here a second Hugging Face
model with other weights; zero with dpo_reference_free), and loss = -logsigmoid(beta * ((chosen -
rejected) - (ref_chosen - ref_rejected))).mean(). The C driver (tests/drivers/model_parity.c,
dpo_beta=) runs neox.c's policy forward, its DPO loss (neox_dpo_loss) and the backward of the
token weights it gives; the loss and every parameter gradient must agree to 1e-5."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import test_model_parity as parity  # noqa: E402

PAIRS, T, VOCAB = 3, 9, parity.VOCAB


def pair_batch():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (2 * PAIRS, T), generator=g)
    targets = torch.randint(0, VOCAB, (2 * PAIRS, T), generator=g)
    # Prompt positions unscored, as a label dataset masks them; chosen and rejected of different lengths.
    mask = torch.zeros(2 * PAIRS, T)
    for row in range(2 * PAIRS):
        start, end = 2 + row % 3, T - (row % 2) * 2
        mask[row, start:end] = 1.0
    return ids, targets, mask


def sequence_logps(model, ids, targets, mask):
    logits = model(input_ids=ids).logits.float()
    token = torch.gather(logits.log_softmax(-1), 2, targets.unsqueeze(-1)).squeeze(-1)
    return (token * mask).sum(-1), token


def dpo_loss(policy, ref_sums, ids, targets, mask, beta):
    sums, _ = sequence_logps(policy, ids, targets, mask)
    chosen, rejected = torch.chunk(sums, 2, 0)
    ref_chosen, ref_rejected = torch.chunk(ref_sums, 2, 0)
    logits = (chosen - rejected) - (ref_chosen - ref_rejected)
    return -torch.nn.functional.logsigmoid(beta * logits).mean()


@pytest.mark.parametrize("case,beta,reference_free", [
    ("neox-sequential-rotary25-gelu-untied", 0.1, False),
    ("llama-gqa-swiglu-rmsnorm-untied", 0.5, False),
    ("neox-parallel-rotary100-gelutanh-tied", 0.01, True),
])
def test_dpo_loss_and_gradients(case, beta, reference_free, tmp_path):
    kind, kwargs, extra = parity.CASES[case]
    torch.manual_seed(3)
    policy, cfg = parity.make_model(kind, kwargs)
    reference, _ = parity.make_model(kind, kwargs)
    ids, targets, mask = pair_batch()
    with torch.no_grad():
        ref_sums, ref_token = sequence_logps(reference.eval(), ids, targets, mask)
    if reference_free:
        ref_sums, ref_token = torch.zeros_like(ref_sums), torch.zeros_like(ref_token)
    loss = dpo_loss(policy, ref_sums, ids, targets, mask, beta)
    loss.backward()
    out = run(tmp_path, policy, cfg, kind, extra, ids, targets, mask, ref_token, beta)
    parity.close(out["loss"], loss.detach().reshape(1), "DPO loss")
    for name, p in policy.named_parameters():
        parity.close(out["grad." + name], p.grad, "gradient of " + name)


def run(tmp_path, model, cfg, kind, extra, ids, targets, mask, ref_token, beta):
    return parity.run_driver(tmp_path, model, cfg, kind, extra, ids, targets, mask, more=[f"dpo_beta={beta}"],
                             inputs={"ref_logprobs": ref_token.double().contiguous()})


def test_dpo_gradient_sign_favours_chosen(tmp_path):
    """One SGD step along the returned gradients raises the chosen-minus-rejected margin."""
    kind, kwargs, extra = parity.CASES["llama-gqa-swiglu-rmsnorm-untied"]
    torch.manual_seed(4)
    policy, cfg = parity.make_model(kind, kwargs)
    ids, targets, mask = pair_batch()
    ref = torch.zeros(2 * PAIRS, T)
    out = run(tmp_path, policy, cfg, kind, extra, ids, targets, mask, ref, 0.1)
    with torch.no_grad():
        before, _ = sequence_logps(policy, ids, targets, mask)
        for name, p in policy.named_parameters():
            p -= 0.05 * out["grad." + name]
        after, _ = sequence_logps(policy, ids, targets, mask)
    margin = lambda s: (torch.chunk(s, 2, 0)[0] - torch.chunk(s, 2, 0)[1]).mean().item()  # noqa: E731
    assert margin(after) > margin(before), (margin(before), margin(after))
