"""The fused, chunked loss equals label-smoothed cross-entropy written plainly, and torch's own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tfbuilder
from conftest import tiny_model
from tfbuilder.train.objectives import LinearCrossEntropy, head_loss, smoothed_cross_entropy

IGNORE = 0


def _inputs(rows: int = 13, d: int = 6, vocab: int = 11, *, bias: bool = True):
    x = torch.randn(rows, d, dtype=torch.float64, requires_grad=True)
    linear = nn.Linear(d, vocab, bias=bias).double()
    target = torch.randint(1, vocab, (rows,))
    target[[2, 7, 8]] = IGNORE  # positions that do not count
    return x, linear, target


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("pieces", [1, 4, 13, 16])
def test_chunked_loss_and_gradients_equal_the_plain_loss(epsilon, bias, pieces):
    x, linear, target = _inputs(bias=bias)
    loss, nll, correct = LinearCrossEntropy.apply(x, linear.weight, linear.bias, target, epsilon, IGNORE, pieces, True, None, 0.0)
    grads = torch.autograd.grad(loss * 0.37, [x, linear.weight] + ([linear.bias] if bias else []))

    ref = smoothed_cross_entropy(linear(x), target, epsilon, ignore=IGNORE)
    tokens = int((target != IGNORE).sum())
    ref_sum = ref.loss * tokens
    ref_grads = torch.autograd.grad(ref_sum * 0.37, [x, linear.weight] + ([linear.bias] if bias else []))
    # Both take the softmax in float32 (whatever the input's dtype).
    torch.testing.assert_close(loss, ref_sum.detach().float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref.nll.float(), rtol=1e-5, atol=1e-5)
    assert int(correct) == int(ref.correct)
    for ours, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # Ignored positions get no gradient.
    assert grads[0][target == IGNORE].abs().max() == 0
    assert grads[0][target != IGNORE].abs().max() > 0


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_plain_loss_is_torchs_label_smoothed_cross_entropy(epsilon):
    x, linear, target = _inputs()
    logits = linear(x)
    ours = smoothed_cross_entropy(logits, target, epsilon, ignore=IGNORE)
    theirs = F.cross_entropy(logits, target, ignore_index=IGNORE, label_smoothing=epsilon)
    torch.testing.assert_close(ours.loss, theirs.float())
    nll = F.cross_entropy(logits, target, ignore_index=IGNORE).detach().float()
    torch.testing.assert_close(ours.nll / ours.tokens, nll)


def test_chunked_loss_in_bfloat16_is_close_to_float32():
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    linear = nn.Linear(32, 50)
    target = torch.randint(1, 50, (64,))
    full = LinearCrossEntropy.apply(x, linear.weight, linear.bias, target, 0.1, IGNORE, 4, False, None, 0.0)[0]
    half = LinearCrossEntropy.apply(x.bfloat16(), linear.weight, linear.bias, target, 0.1, IGNORE, 4, False, None, 0.0)[0]
    assert half.dtype == torch.float32  # the softmax is taken in float32 whatever the input
    torch.testing.assert_close(half, full, rtol=2e-2, atol=0)


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder", "encoder"])
def test_every_objective_counts_only_real_targets_and_trains(kind):
    spec = tiny_model(kind=kind, **({"encoder": None} if kind == "decoder" else {}), **({"decoder": None} if kind == "encoder" else {}))
    recipe = tfbuilder.Recipe.model_validate({"model": spec, "optim": {"label_smoothing": 0.1}})
    model = tfbuilder.build_model(recipe)
    objective = tfbuilder.train.objectives.objective(recipe, epsilon=0.1)
    ids = torch.randint(5, 53, (3, 7))
    ids[1, 4:] = 0  # padding
    batch = {"src": ids, "tgt_in": ids, "tgt_out": ids, "tokens": ids}
    result = objective(model, batch)
    if kind == "encoder_decoder":
        assert int(result.tokens) == int((ids != 0).sum())
    elif kind == "decoder":
        assert int(result.tokens) == int((ids[:, 1:] != 0).sum())
    else:
        assert 1 <= int(result.tokens) <= int((ids != 0).sum())
    result.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert torch.isfinite(result.loss) and result.loss > 0


@pytest.mark.parametrize("recipe_file", ["t5-small.yaml", "bert-base.yaml", "gpt2-small.yaml"])
def test_the_fused_loss_sees_what_the_head_computes(recipe_file):
    """Heads with a scale before a tied projection (T5), a transform and a bias (BERT): the fused
    loss equals the plain loss of the head's own logits."""
    from conftest import ROOT

    path = ROOT / "recipes" / "architectures" / recipe_file
    stacks = {"encoder_decoder": ["encoder", "decoder"], "decoder": ["decoder"], "encoder": ["encoder"]}
    small = ["model.d_model=32", "model.vocab_size=40", "model.dropout=0.0", "model.attention.heads=4"]
    small += ["model.attention.key_dim=8", "model.attention.value_dim=8"]
    small += [f"model.{part}.layers=1" for part in stacks[tfbuilder.load_recipe(path).model.kind]]
    recipe = tfbuilder.load_recipe(path, small)
    model = tfbuilder.build_model(recipe)
    hidden = torch.randn(2, 5, 32)
    target = torch.randint(1, 40, (2, 5))
    fused = head_loss(model.head, hidden, target, epsilon=0.1, ignore=0)
    plain = smoothed_cross_entropy(model.head(hidden).reshape(-1, 40), target.reshape(-1), 0.1, ignore=0)
    torch.testing.assert_close(fused.loss, plain.loss, rtol=1e-5, atol=1e-5)


def captured(monkeypatch, kind: str, batch: dict, **objective_kw) -> dict:
    """Run the ``kind`` objective with the model's features and the loss recorded: what the model was
    shown and what it was asked to predict."""
    spec = tiny_model(kind=kind, **({"encoder": None} if kind == "decoder" else {}), **({"decoder": None} if kind == "encoder" else {}))
    recipe = tfbuilder.Recipe.model_validate({"model": spec})
    model = tfbuilder.build_model(recipe)
    seen: dict = {}
    features = model.features

    def record_features(*inputs, **kw):
        seen["inputs"] = inputs
        return features(*inputs, **kw)

    def record_loss(head, hidden, target, **kw):
        seen["target"] = target
        return head_loss(head, hidden, target, **kw)

    monkeypatch.setattr(model, "features", record_features)
    monkeypatch.setattr(tfbuilder.train.objectives, "head_loss", record_loss)
    tfbuilder.train.objectives.objective(recipe, epsilon=0.0, **objective_kw)(model, batch)
    return seen


def test_causal_lm_predicts_each_next_token(monkeypatch):
    tokens = torch.randint(5, 53, (2, 6))
    seen = captured(monkeypatch, "decoder", {"tokens": tokens})
    assert torch.equal(seen["inputs"][0], tokens[:, :-1]) and torch.equal(seen["target"], tokens[:, 1:])
    assert tfbuilder.train.objectives.target_tokens({"tokens": tokens}, 0, "decoder") == 2 * 5


def test_seq2seq_predicts_tgt_out_from_src_and_tgt_in(monkeypatch):
    batch = {"src": torch.randint(5, 53, (2, 4)), "tgt_in": torch.randint(5, 53, (2, 3)), "tgt_out": torch.randint(5, 53, (2, 3))}
    seen = captured(monkeypatch, "encoder_decoder", batch)
    assert torch.equal(seen["inputs"][0], batch["src"]) and torch.equal(seen["inputs"][1], batch["tgt_in"])
    assert torch.equal(seen["target"], batch["tgt_out"])


def test_masked_lm_chooses_15_percent_of_real_tokens_and_shows_80_10_10(monkeypatch):
    """Devlin et al. 2019, sec. 3.1: 15% of the tokens are predicted; of those, 80% are shown as
    <mask>, 10% as a random token, 10% unchanged; special tokens are never chosen. A batch of 24,000
    tokens with a fixed seed: the shares are within 5 standard deviations of the paper's."""
    from tfbuilder.data.tokenizers import MASK

    tokens = torch.randint(5, 53, (120, 200))
    tokens[:, 0], tokens[:, -1], tokens[::7, -20:] = 1, 2, 0  # <s>, </s>, padding
    seen = captured(monkeypatch, "encoder", {"tokens": tokens})
    shown, target = seen["inputs"][0], seen["target"]
    chosen = target != -100
    real = tokens >= 5
    assert not (chosen & ~real).any() and torch.equal(shown[~real], tokens[~real])
    assert torch.equal(target[chosen], tokens[chosen]) and torch.equal(shown[~chosen], tokens[~chosen])

    def near(count: int, total: int, p: float) -> bool:
        return abs(count - p * total) < 5 * (total * p * (1 - p)) ** 0.5

    n = int(chosen.sum())
    masked = int((shown[chosen] == MASK).sum())
    unchanged = int((shown[chosen] == tokens[chosen]).sum())
    assert near(n, int(real.sum()), 0.15), n
    assert near(masked, n, 0.8), masked
    assert near(unchanged, n, 0.1 + 0.1 / 48), unchanged  # a random token is the same one time in 48
    assert (shown[chosen] >= 5).sum() == n - masked  # random replacements are real tokens


@pytest.mark.parametrize("pieces", [1, 4])
def test_logit_softcap_and_z_loss_are_the_papers_formulas(pieces):
    """Gemma 2's capped logits c * tanh(l / c) (arXiv:2408.00118) and PaLM's z-loss w * log(Z)^2 per
    token (arXiv:2204.02311, sec. 5), written out with autograd: the fused loss and its gradients."""
    x, linear, target = _inputs()
    loss, nll, _ = LinearCrossEntropy.apply(x, linear.weight, linear.bias, target, 0.1, IGNORE, pieces, True, 0.9, 0.3)
    grads = torch.autograd.grad(loss, [x, linear.weight, linear.bias])
    capped = 0.9 * torch.tanh(linear(x) / 0.9)
    valid = target != IGNORE
    log_z = torch.logsumexp(capped, dim=-1)
    ce = F.cross_entropy(capped[valid], target[valid], reduction="sum", label_smoothing=0.1)
    ref = ce + 0.3 * (log_z[valid] ** 2).sum()
    ref_grads = torch.autograd.grad(ref, [x, linear.weight, linear.bias])
    torch.testing.assert_close(loss, ref.detach().float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, F.cross_entropy(capped[valid], target[valid], reduction="sum").detach().float())
    for ours, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


KIND_BATCHES = {
    "decoder": lambda t: {"tokens": t},
    "encoder": lambda t: {"tokens": t},  # the masked LM
    "encoder_decoder": lambda t: {"src": t, "tgt_in": t[:, :-1], "tgt_out": t[:, 1:]},
}


@pytest.mark.parametrize("kind", sorted(KIND_BATCHES))
def test_the_recipes_z_loss_reaches_the_objective_of_every_model_kind(monkeypatch, kind):
    """optim.z_loss adds w * log(Z)^2 per predicted token to the loss of every kind of model (the
    masked LM: the chosen tokens only), and leaves the nll (perplexity) alone."""
    from tfbuilder.train.objectives import objective

    spec = tiny_model(kind=kind, **({"encoder": None} if kind == "decoder" else {}), **({"decoder": None} if kind == "encoder" else {}))
    plain = tfbuilder.Recipe.model_validate({"model": spec})
    with_z = tfbuilder.Recipe.model_validate({"model": spec, "optim": {"z_loss": 0.5}})
    assert plain.model.kind == kind
    model = tfbuilder.build_model(plain).eval()
    batch = KIND_BATCHES[kind](torch.randint(5, 53, (3, 7)))
    seen = []

    def record(head, hidden, target, **kw):
        seen.append((head(hidden), target, kw["ignore"]))
        return head_loss(head, hidden, target, **kw)

    monkeypatch.setattr("tfbuilder.train.objectives.head_loss", record)
    results = []
    for recipe in (plain, with_z):
        torch.manual_seed(0)  # the masked LM draws the same tokens to predict
        with torch.no_grad():
            results.append(objective(recipe, epsilon=0.0)(model, batch))
    (logits, target, ignore), again = seen
    assert torch.equal(target, again[1])
    log_z = torch.logsumexp(logits.float(), dim=-1)[target != ignore]
    assert 0 < len(log_z) and log_z.abs().min() > 0.1
    a, b = results
    torch.testing.assert_close(b.loss - a.loss, 0.5 * log_z.square().mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.nll, b.nll)


def test_the_recipes_z_loss_and_logit_softcap_reach_the_objective_and_decoding():
    spec = tiny_model(kind="decoder", encoder=None, logit_softcap=2.0)
    plain = tfbuilder.Recipe.model_validate({"model": spec})
    with_z = tfbuilder.Recipe.model_validate({"model": spec, "optim": {"z_loss": 0.5}})
    torch.manual_seed(0)
    model = tfbuilder.build_model(plain)
    tokens = torch.randint(5, 53, (2, 6))
    logits = model(tokens)
    assert logits.abs().max() < 2.0  # decoding sees the capped logits
    a = tfbuilder.train.objectives.objective(plain, epsilon=0.0)(model, {"tokens": tokens})
    b = tfbuilder.train.objectives.objective(with_z, epsilon=0.0)(model, {"tokens": tokens})
    log_z = torch.logsumexp(logits[:, :-1], dim=-1)
    torch.testing.assert_close(b.loss - a.loss, 0.5 * log_z.square().mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.nll, b.nll)  # perplexity is of the model, without the z-loss


def test_an_objective_refuses_a_model_of_another_kind_by_name():
    """The recipe's kind chooses the objective; a model of another kind is refused, not half-trained."""
    translation = tfbuilder.Recipe.model_validate({"model": tiny_model()})
    decoder = tfbuilder.build_model(tfbuilder.Recipe.model_validate({"model": tiny_model(kind="decoder", encoder=None)}))
    with pytest.raises(TypeError, match="trains EncoderDecoder models, not DecoderOnly"):
        tfbuilder.train.objectives.objective(translation, epsilon=0.0)(decoder, {"tokens": torch.ones(1, 3, dtype=torch.long)})


def test_packed_documents_need_an_end_id():
    from tfbuilder.data.packing import segments

    assert segments(torch.tensor([[5, 1, 6, 7, 1, 8]]), 1).tolist() == [[0, 1, 1, 1, 2, 2]]
    with pytest.raises(ValueError, match="no end-of-text id"):
        segments(torch.tensor([[5, 6]]), None)


def test_chunked_loss_multiplies_in_the_autocast_dtype():
    """Under bf16 autocast every matrix product of the fused loss, the weight gradient's included, runs in
    bfloat16 as nn.Linear's would; the softmax stays float32."""
    from torch.utils._python_dispatch import TorchDispatchMode

    products = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.addmm_.default}

    class Dtypes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, torch.dtype]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in products:
                self.seen += [(str(func), a.dtype) for a in args if isinstance(a, torch.Tensor) and a.dim() == 2]
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    x, linear, target = torch.randn(16, 8), nn.Linear(8, 40), torch.randint(1, 40, (16,))
    with torch.autocast("cpu", dtype=torch.bfloat16), Dtypes() as mode:
        loss = LinearCrossEntropy.apply(x, linear.weight, linear.bias, target, 0.1, IGNORE, 2, True, None, 0.0)[0]
    assert loss.dtype == torch.float32
    assert len(mode.seen) >= 3 * 2 * 2  # logits, input gradient, weight gradient; two operands; two chunks
    assert {dtype for _, dtype in mode.seen} == {torch.bfloat16}, mode.seen
