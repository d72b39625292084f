"""Muon with AdamW (optim.optimizer: muon): which parameters each optimizer gets (the standard
split: the stacks' 2-D weights to Muon, embeddings, head, norms, biases and scalars to AdamW), that
Muon's update is the orthogonalised momentum (Jordan et al. 2024), that a tiny model learns with it,
and that its state survives a checkpoint."""

from __future__ import annotations

import copy
import typing

import pytest
import torch

import tfbuilder
from conftest import tiny_model
from tfbuilder.train.objectives import objective
from tfbuilder.train.optimizers import MuonWithAdamW, build_optimizer
from tfbuilder.spec.recipe import Recipe
from tfbuilder.spec.sections import OptimSection
from tfbuilder.train.training import Task

SPECS = {
    "encoder_decoder-untied": tiny_model(tie_output=False, head_bias=True, position={"type": "learned", "max_len": 32}),
    "decoder-differential-moe": tiny_model(
        kind="decoder", encoder=None, placement="pre", norm={"type": "rmsnorm"},
        attention={"type": "differential", "heads": 2, "value_residual": "learnable"}, ffn={"type": "moe", "experts": 2, "hidden": 16},
    ),
    "encoder-mlm": tiny_model(kind="encoder", decoder=None, token_types=2),
}


def scheduled(recipe: Recipe, model: torch.nn.Module) -> MuonWithAdamW:
    """The optimizer training builds, its learning rates set by the schedule for step 1."""
    return Task(recipe, model, "{}").configure_optimizers()["optimizer"]


def muon_recipe(spec: dict, **muon) -> Recipe:
    optim = {"optimizer": "muon", "lr": 1e-3, "weight_decay": 0.0, "muon": {"lr": 0.02, **muon}, "schedule": {"type": "constant", "warmup": 0}}
    return Recipe.model_validate({"model": spec, "optim": optim})


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_muon_gets_the_stacks_weight_matrices_and_adamw_the_rest(spec):
    recipe = muon_recipe(spec)
    model = tfbuilder.build_model(recipe)
    optimizer = build_optimizer(model, recipe.optim)
    assert isinstance(optimizer, MuonWithAdamW) and isinstance(optimizer.muon, torch.optim.Muon)
    names = {id(p): n for n, p in model.named_parameters()}
    to_muon = {names[id(p)] for g in optimizer.muon.param_groups for p in g["params"]}
    to_adamw = {names[id(p)] for g in optimizer.adamw.param_groups for p in g["params"]}
    # The rule written out: matrices under encoder./decoder., and nothing else.
    expected = {n for n, p in model.named_parameters() if n.split(".")[0] in ("encoder", "decoder") and p.ndim == 2}
    assert to_muon == expected and expected
    assert to_adamw == set(names.values()) - expected and not to_muon & to_adamw
    assert any(n.startswith("embed") or n.startswith("src_embed") for n in to_adamw)
    assert any(n.endswith(".bias") or "norm" in n for n in to_adamw)
    assert not any(n.startswith("head") for n in to_muon)
    # The learning rates the schedule scales: Muon's group at muon.lr / optim.lr, AdamW's at 1.
    assert [g["lr"] for g in optimizer.muon.param_groups] == [pytest.approx(20.0)]
    assert {g["lr"] for g in optimizer.adamw.param_groups} == {1.0}


def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of the Muon reference: X <- aX + (bA + cA^2)X, A = XX^T,
    from X = G / ||G||_F, with (a, b, c) = (3.4445, -4.7750, 2.0315), on the wide orientation (in
    float64 here; torch iterates in bfloat16, as the reference does)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def test_the_first_muon_step_is_the_orthogonalised_nesterov_momentum():
    """Step 1 of the reference (momentum as an average: B = mu B + (1 - mu) g from B = 0; Nesterov:
    update = (1 - mu) g + mu B), orthogonalised, scaled by lr * sqrt(max(1, rows / cols))
    (adjust_lr original)."""
    recipe = muon_recipe(tiny_model(kind="decoder", encoder=None))
    model = tfbuilder.build_model(recipe)
    optimizer = scheduled(recipe, model)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.02, 1e-3, 1e-3])
    weight = model.decoder.layers[0].self_attn.inner.to_qkv.weight  # (96, 32): tall
    before = weight.detach().clone()
    tokens = torch.randint(5, 53, (4, 8))
    objective(recipe, epsilon=0.0)(model, {"tokens": tokens}).loss.backward()
    grad = weight.grad.clone()
    optimizer.step()
    momentum = (1 - 0.95) * grad
    expected = newton_schulz((1 - 0.95) * grad + 0.95 * momentum)
    got = (before - weight.detach()).double() / (0.02 * (96 / 32) ** 0.5)  # the update, from the step
    # Compared in the gradient's singular basis (U^T O V), over its directions that carry gradient:
    # torch iterates in bfloat16, which moves single entries by a few per cent (the loose quintic
    # amplifies rounding) but keeps the update's singular vectors and values.
    u, sv, vh = torch.linalg.svd(grad.double(), full_matrices=False)
    k = int((sv > 1e-3 * sv[0]).sum())
    ours, theirs = ((u.T @ m @ vh.T)[:k, :k] for m in (got, expected))
    torch.testing.assert_close(ours.diagonal(), theirs.diagonal(), rtol=0.03, atol=0.0)
    assert (ours - ours.diagonal().diag()).norm() < 0.05 * ours.norm()


def test_a_tiny_model_learns_with_muon_and_its_state_round_trips():
    torch.manual_seed(0)
    recipe = muon_recipe(tiny_model(kind="decoder", encoder=None, placement="pre"))
    model = tfbuilder.build_model(recipe).train()
    optimizer = scheduled(recipe, model)
    fn = objective(recipe, epsilon=0.0)
    tokens = torch.randint(5, 53, (8, 10))

    def step() -> float:
        optimizer.zero_grad()
        loss = fn(model, {"tokens": tokens}).loss
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    losses = [step() for _ in range(15)]
    assert losses[-1] < 0.75 * losses[0], losses  # memorising one batch
    saved = copy.deepcopy(optimizer.state_dict())  # (state_dict holds the live tensors)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    step()
    continued = {k: v.clone() for k, v in model.state_dict().items()}
    for state in (saved, None):  # with the saved state: the same step; without: another one
        model.load_state_dict(weights)
        optimizer = scheduled(recipe, model)
        if state is not None:
            optimizer.load_state_dict(state)
        step()
        same = all(torch.equal(model.state_dict()[k], continued[k]) for k in continued)
        assert same == (state is not None)


def test_muon_settings_without_muon_are_refused():
    with pytest.raises(ValueError, match="optimizer: muon"):
        Recipe.model_validate({"model": tiny_model(), "optim": {"optimizer": "adamw", "muon": {"lr": 0.02}}})


def test_training_with_muon_resumes_bit_equal(tmp_path):
    """Through Lightning: the two optimizers' states go into the checkpoint and come back (weights_only)."""
    from conftest import ONE_LAYER, QUICKSTART, short_run
    from tfbuilder.spec.recipe import recipe_from_dict
    from tfbuilder.runs.checkpoints import read_checkpoint
    from tfbuilder.train.training import fit

    common = short_run(tmp_path, *ONE_LAYER, "optim.optimizer=muon", "optim.muon.lr=0.02", "trainer.val_every=3", "trainer.threads=1", train=200, val=10)
    full = fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=6"]))
    half = fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=3"]))
    resumed = fit(recipe_from_dict(read_checkpoint(half.run_dir)["tfbuilder"]["recipe"], ["trainer.max_steps=6"]), resume=half.run_dir)
    a, b = (read_checkpoint(s.last_checkpoint) for s in (full, resumed))
    assert set(a["optimizer_states"][0]) == {"muon", "adamw"}
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


OPTIMIZERS = typing.get_args(OptimSection.model_fields["optimizer"].annotation)  # every one the recipe schema allows


def batch_for(kind: str) -> dict:
    tokens = torch.randint(5, 53, (4, 8))
    if kind == "encoder_decoder":
        return {"src": tokens, "tgt_in": tokens[:, :-1], "tgt_out": tokens[:, 1:]}
    return {"tokens": tokens}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_one_step_changes_every_parameter_that_has_a_gradient(name, spec):
    """Whatever the optimizer: Muon's matrices and AdamW's half (embeddings, head, norms, biases,
    scalars) alike. A tiny model still learns from Muon alone, so learning says nothing of the rest."""
    assert set(OPTIMIZERS) >= {"adam", "adamw", "muon"}
    optim = {"optimizer": name, "lr": 1e-3, "weight_decay": 0.0, "schedule": {"type": "constant", "warmup": 0}}
    if name == "muon":
        optim["muon"] = {"lr": 0.02}
    recipe = Recipe.model_validate({"model": spec, "optim": optim})
    model = tfbuilder.build_model(recipe).train()
    optimizer = Task(recipe, model, "{}").configure_optimizers()["optimizer"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = objective(recipe, epsilon=0.0)(model, batch_for(recipe.model.kind)).loss
    auxiliary = model.auxiliary_loss()  # the MoE's balancing loss: its router's gradient
    (loss if auxiliary is None else loss + auxiliary).backward()
    stepped = {n for n, p in model.named_parameters() if p.grad is not None and bool(p.grad.ne(0).any())}
    optimizer.step()
    assert any("embed" in n for n in stepped) and any(n.endswith("bias") or "norm" in n for n in stepped)
    unchanged = sorted(n for n, p in model.named_parameters() if n in stepped and torch.equal(p.detach(), before[n]))
    assert not unchanged, f"{name}: a gradient but no step for {unchanged}"
