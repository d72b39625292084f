"""The recipe's optim section as training applies it, checked against independent references:
gradient clipping (clip_grad_norm_: g * min(1, c / ||g||), Pascanu et al. 2013, arXiv:1211.5063),
gradient accumulation (k micro-batches step like one batch k times larger: the mean loss per target
token over all of them), and which parameters are weight-decayed (Loshchilov & Hutter 2019,
arXiv:1711.05101: weight matrices and embedding tables; not biases, norm gains or learned scalars)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tfbuilder
from conftest import ONE_LAYER, QUICKSTART, short_run, tiny_model
from recording import StepRecorder, fit_recording, global_norm
from tfbuilder.data.tokenizers import PAD
from tfbuilder.train.objectives import objective
from tfbuilder.spec.recipe import Recipe
from tfbuilder.runs.checkpoints import read_checkpoint
from tfbuilder.train.task import Task



def tiny_fit(tmp_path, *overrides: str) -> list[str]:
    """A one-layer quickstart on small batches of varying size (a budget of 64 tokens)."""
    return short_run(tmp_path, "data.max_tokens=64", *ONE_LAYER, "optim.label_smoothing=0.1", *overrides, train=300, val=20, longest=9)


def one_batch(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Micro-batches as one batch: rows stacked, right-padded to the widest."""
    out = {}
    for key in batches[0]:
        if batches[0][key].ndim == 1:
            out[key] = torch.cat([b[key] for b in batches])
            continue
        width = max(b[key].shape[1] for b in batches)
        out[key] = torch.cat([nn.functional.pad(b[key], (0, width - b[key].shape[1]), value=PAD) for b in batches])
    return out


def reference_grads(recipe: Recipe, initial: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gradients of the objective (mean smoothed loss per target token) of ``batch``, from ``initial``
    weights: one plain forward and backward, outside Lightning."""
    model = tfbuilder.build_model(recipe)
    model.load_state_dict(initial)
    model.train()
    objective(recipe, epsilon=recipe.optim.label_smoothing)(model, batch).loss.backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def target_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["tgt_out"] != PAD).sum())


def assert_grads_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], *, scale: float = 1.0) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name] * scale, rtol=1e-4, atol=1e-7, msg=name)


def first_step(tmp_path, monkeypatch, *overrides: str) -> tuple[Recipe, StepRecorder]:
    recorder = StepRecorder(grads=True)
    recipe = tfbuilder.load_recipe(QUICKSTART, tiny_fit(tmp_path, "trainer.max_steps=1", "trainer.val_every=1", *overrides))
    fit_recording(recipe, monkeypatch, recorder)
    assert len(recorder.grads) == 1
    return recipe, recorder


# --- gradient clipping ------------------------------------------------------------------------


def test_without_grad_clip_the_optimizer_gets_the_plain_gradient(tmp_path, monkeypatch):
    recipe, rec = first_step(tmp_path, monkeypatch)
    (batch,) = rec.batches[0]
    expected = reference_grads(recipe, rec.initial, batch)
    assert_grads_close(rec.grads[0], expected)
    assert global_norm(expected) > 0.05  # so the clipping test below clips


def test_grad_clip_scales_the_whole_gradient_to_the_clip_norm(tmp_path, monkeypatch):
    clip = 0.05
    recipe, rec = first_step(tmp_path, monkeypatch, f"optim.grad_clip={clip}")
    (batch,) = rec.batches[0]
    expected = reference_grads(recipe, rec.initial, batch)
    norm = global_norm(expected)
    assert norm > clip
    assert global_norm(rec.grads[0]) == pytest.approx(clip, rel=1e-4)  # at most grad_clip: clipped to it
    # One factor for all parameters together (the global norm), not per parameter: the direction is kept.
    assert_grads_close(rec.grads[0], expected, scale=clip / norm)


def test_a_grad_clip_above_the_norm_changes_nothing(tmp_path, monkeypatch):
    recipe, rec = first_step(tmp_path, monkeypatch, "optim.grad_clip=1000.0")
    (batch,) = rec.batches[0]
    assert_grads_close(rec.grads[0], reference_grads(recipe, rec.initial, batch))


# --- gradient accumulation ------------------------------------------------------------------------


def test_accumulated_micro_batches_step_like_one_batch_k_times_larger(tmp_path, monkeypatch):
    """The step's gradient is that of the mean loss per target token over all k micro-batches, as if
    they were one batch; not the mean of their means, which weighs a short batch's tokens more."""
    k = 3
    recipe, rec = first_step(tmp_path, monkeypatch, f"optim.accumulate={k}", "trainer.seed=1")  # a seed whose first batches differ in size
    micro = rec.batches[0]
    assert len(micro) == k
    tokens = [target_tokens(b) for b in micro]
    assert len(set(tokens)) > 1, tokens  # batches of different sizes: the two normalisations differ
    expected = reference_grads(recipe, rec.initial, one_batch(micro))
    assert_grads_close(rec.grads[0], expected)
    # ... and the comparison is sharp: the mean of the micro-batches' gradients is elsewhere.
    means = [reference_grads(recipe, rec.initial, b) for b in micro]
    mean_of_means = {n: sum(g[n] for g in means) / k for n in expected}
    assert not all(torch.allclose(mean_of_means[n], expected[n], rtol=1e-4, atol=1e-7) for n in expected)


def test_with_accumulation_steps_and_the_schedule_count_optimizer_steps(tmp_path, monkeypatch):
    recorder = StepRecorder()
    overrides = ["optim.accumulate=2", "optim.schedule={type: constant, warmup: 3}", "optim.lr=3.0e-3", "trainer.max_steps=4", "trainer.val_every=2"]
    recipe = tfbuilder.load_recipe(QUICKSTART, tiny_fit(tmp_path, *overrides))
    summary = fit_recording(recipe, monkeypatch, recorder)
    assert summary.steps == 4 and recorder.global_steps == [0, 1, 2, 3]
    assert [len(b) for b in recorder.batches] == [2, 2, 2, 2]  # every optimizer step consumed two batches
    assert [lr[0] for lr in recorder.lrs] == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3])  # one schedule step per optimizer step
    saved = read_checkpoint(summary.last_checkpoint)
    assert saved["global_step"] == 4 and saved["tfbuilder"]["batches_seen"] == 8
    assert summary.last_val_step == 4  # validated every val_every optimizer steps


# --- parameter groups: what is weight-decayed -------------------------------------------------------


def decayed_by_rule(model: nn.Module) -> set[str]:
    """Names of the parameters the documented rule decays: the weights of linear layers and embedding
    tables (a tied output projection is the embedding itself)."""
    ids = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def groups_by_name(task: Task) -> list[tuple[set[str], float]]:
    names = {id(p): n for n, p in task.model.named_parameters()}
    optimizer = task.configure_optimizers()["optimizer"]
    return [({names[id(p)] for p in g["params"]}, g["weight_decay"]) for g in optimizer.param_groups]


ARCHITECTURES = {
    "paper": tiny_model(),
    "biases-untied-learned": tiny_model(
        tie_output=False, share_embeddings=False, src_vocab_size=40, head_bias=True,
        position={"type": "learned", "max_len": 64}, attention={"type": "multihead", "heads": 4, "bias": True},
    ),
    "rmsnorm-swiglu-rotary-qknorm": tiny_model(
        norm={"type": "rmsnorm"}, ffn={"type": "swiglu", "hidden": 48}, position={"type": "rotary"},
        attention={"type": "multihead", "heads": 4, "qk_norm": True}, placement="pre",
    ),
    "scalenorm-moe-relative": tiny_model(
        norm={"type": "scalenorm"}, ffn={"type": "moe", "experts": 2, "hidden": 16}, position={"type": "relative_bias"},
    ),
    "bert-like": tiny_model(
        kind="encoder", decoder=None, token_types=2, embed_norm=True, head_bias=True, position={"type": "learned", "max_len": 64},
    ),
}


@pytest.mark.parametrize("spec", ARCHITECTURES.values(), ids=ARCHITECTURES.keys())
def test_adamw_decays_exactly_the_weight_matrices_and_embeddings(spec):
    recipe = Recipe.model_validate({"model": spec, "optim": {"optimizer": "adamw", "weight_decay": 0.01}})
    task = Task(recipe, tfbuilder.build_model(recipe), "{}")
    everything = {name for name, _ in task.model.named_parameters()}
    expected = decayed_by_rule(task.model)
    groups = groups_by_name(task)
    decayed = set().union(*(names for names, wd in groups if wd == 0.01))
    plain = set().union(*(names for names, wd in groups if wd == 0.0))
    assert decayed == expected
    assert plain == everything - expected
    assert sum(len(names) for names, _ in groups) == len(everything)  # each parameter in one group, once
    # The rule's two sides both occur (biases or norm gains are never decayed).
    assert any(n.endswith(".bias") or "norm" in n for n in plain) and expected


def test_adam_decays_nothing():
    recipe = Recipe.model_validate({"model": tiny_model(), "optim": {"optimizer": "adam", "weight_decay": 0.01}})
    task = Task(recipe, tfbuilder.build_model(recipe), "{}")
    assert {wd for _, wd in groups_by_name(task)} == {0.0}
