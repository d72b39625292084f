"""The training metrics a step logs mean what they say: loss, perplexity and accuracy over the tokens
the objective predicts, for every model kind, checked against values computed here by hand."""

from __future__ import annotations

import math

import pytest
import torch

import tfbuilder
from conftest import tiny_model
from tfbuilder.train import objectives
from tfbuilder.spec.recipe import recipe_from_dict
from tfbuilder.train.task import Task

EPSILON = 0.1  # label smoothing: the logged loss is smoothed, perplexity is not

TEXT = {"path": "text", "tokenizer": {"type": "bpe", "vocab_size": 53}}
DATA = {
    "encoder_decoder": {"type": "parallel", "src_lang": "de", "tgt_lang": "en", **TEXT},
    "decoder": {"type": "monolingual", "lang": "en", **TEXT},
    "encoder": {"type": "monolingual", "lang": "en", "mlm_probability": 0.3, **TEXT},
}


def recipe(kind: str) -> tfbuilder.Recipe:
    sides = {"encoder_decoder": {}, "decoder": {"encoder": None}, "encoder": {"decoder": None}}[kind]
    model = tiny_model(kind=kind, **sides)
    return recipe_from_dict({"name": f"metrics-{kind}", "model": model, "data": DATA[kind], "optim": {"label_smoothing": EPSILON}})


def batch(kind: str) -> dict[str, torch.Tensor]:
    """A fixed batch with padding (id 0), starts (1) and ends (2)."""
    g = torch.Generator().manual_seed(7)
    body = torch.randint(5, 53, (3, 6), generator=g)
    body[1, 4:] = 0
    body[2, 2:] = 0
    if kind == "encoder_decoder":
        tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), body], dim=1)
        out = torch.cat([body, torch.zeros(3, 1, dtype=torch.long)], dim=1)
        out[torch.arange(3), (body != 0).sum(1)] = 2
        return {"src": body.flip(1), "tgt_in": tgt.masked_fill(tgt == 2, 0), "tgt_out": out}
    tokens = torch.cat([torch.ones(3, 1, dtype=torch.long), body, torch.zeros(3, 1, dtype=torch.long)], dim=1)
    tokens[torch.arange(3), 1 + (body != 0).sum(1)] = 2
    return {"tokens": tokens}


def logged_step(task: Task, data: dict[str, torch.Tensor], monkeypatch) -> dict[str, float]:
    logged: dict[str, float] = {}
    monkeypatch.setattr(task, "log", lambda name, value, **_: logged.__setitem__(name, float(torch.as_tensor(value).detach())))
    task.on_before_batch_transfer(data, 0)
    task.training_step(data, 0)
    return logged


def by_hand(logits: torch.Tensor, target: torch.Tensor, counts: torch.Tensor) -> dict[str, float]:
    """Mean smoothed loss, perplexity and accuracy over the positions ``counts`` marks."""
    logp = logits.double().log_softmax(-1)[counts]
    t = target[counts]
    nll = -logp[torch.arange(len(t)), t]
    smoothed = (1 - EPSILON) * nll - EPSILON * logp.mean(-1)
    return {
        "train_loss": smoothed.mean().item(),
        "train_ppl": math.exp(nll.mean().item()),
        "train_acc": (logp.argmax(-1) == t).double().mean().item(),
        "predicted": int(counts.sum()),
    }


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder", "encoder"])
def test_logged_training_metrics_are_per_predicted_token(kind, monkeypatch):
    r = recipe(kind)
    model = tfbuilder.build_model(r)
    task = Task(r, model, "{}")
    data = batch(kind)
    seen: dict[str, torch.Tensor] = {}
    head_loss = objectives.head_loss

    def spy(head, hidden, target, **kw):  # the targets the objective chose (a masked LM draws them)
        seen["target"], seen["ignore"] = target, kw["ignore"]
        return head_loss(head, hidden, target, **kw)

    features = model.features

    def inputs_spy(*args, **kw):  # the masked LM's corrupted inputs
        seen["inputs"] = args
        return features(*args, **kw)

    monkeypatch.setattr(objectives, "head_loss", spy)
    monkeypatch.setattr(model, "features", inputs_spy)
    logged = logged_step(task, data, monkeypatch)
    monkeypatch.undo()

    with torch.no_grad():
        logits = model(*seen["inputs"])
    target = seen["target"]
    expected = by_hand(logits, target.masked_fill(target == seen["ignore"], 0), target != seen["ignore"])
    for name in ("train_loss", "train_ppl", "train_acc"):
        assert logged[name] == pytest.approx(expected[name], rel=1e-5), name
    # tokens/s still counts every target token: for the masked LM, more than it predicts.
    host = objectives.target_tokens(data, model.pad_id, kind)
    if kind == "encoder":
        assert expected["predicted"] < host
    else:
        assert expected["predicted"] == host
