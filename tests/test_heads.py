"""Sequence heads: pooling, losses and scores against values computed by hand; the recipe rules of
``model.head`` (tfbuilder/spec/head.py, tfbuilder/model/heads.py, tfbuilder/train/heads)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tfbuilder.model.builder import build_model
from tfbuilder.errors import RecipeError
from tfbuilder.train.heads import metrics
from tfbuilder.model.heads import SequenceHead, pool
from tfbuilder.train.heads.objective import sequence_loss
from tfbuilder.spec.recipe import recipe_from_dict

# --- scores --------------------------------------------------------------------------------

# Labels and predictions of six texts, three classes. By hand, rows = true class:
#   class 0: [1, 1, 0]   class 1: [0, 2, 0]   class 2: [1, 0, 1]
# accuracy 4/6; F1 = 2tp / (2tp + fp + fn): class 0: 2/4, class 1: 4/5, class 2: 2/3.
TARGET = torch.tensor([0, 0, 1, 1, 2, 2])
PREDICTED = torch.tensor([0, 1, 1, 1, 0, 2])
MACRO_F1 = (0.5 + 0.8 + 2 / 3) / 3


def test_confusion_accuracy_and_macro_f1_by_hand():
    matrix = metrics.confusion(PREDICTED, TARGET, 3)
    assert matrix.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert metrics.accuracy(matrix) == pytest.approx(4 / 6)
    assert metrics.macro_f1(matrix) == pytest.approx(MACRO_F1)


def test_macro_f1_leaves_out_a_class_no_text_has_or_gets():
    # scikit-learn's f1_score(average="macro") over the labels present: class 3 neither occurs nor is predicted.
    assert metrics.macro_f1(metrics.confusion(PREDICTED, TARGET, 4)) == pytest.approx(MACRO_F1)
    # A class that occurs but is never predicted counts, with F1 0.
    assert metrics.macro_f1(metrics.confusion(torch.tensor([0, 0]), torch.tensor([0, 1]), 2)) == pytest.approx((2 / 3 + 0) / 2)


def test_scores_from_sums_added_over_batches():
    logits = nn.functional.one_hot(PREDICTED, 3).float()
    sums = metrics.batch_sums("classify", logits[:2], TARGET[:2], 3) + metrics.batch_sums("classify", logits[2:], TARGET[2:], 3)
    assert metrics.scores("classify", sums, 3, prefix="val_") == pytest.approx({"val_acc": 4 / 6, "val_f1": MACRO_F1})


# p = [1, 2, 3, 4], y = [2, 4, 5, 9]: errors -1, -2, -2, -5, MSE 34/4; deviations (-1.5, -0.5, 0.5, 1.5)
# and (-3, -1, 0, 4): r = 11 / sqrt(5 * 26).
P = torch.tensor([1.0, 2.0, 3.0, 4.0])
Y = torch.tensor([2.0, 4.0, 5.0, 9.0])


def test_mse_and_pearson_by_hand():
    sums = metrics.regress_sums(P[:1], Y[:1]) + metrics.regress_sums(P[1:], Y[1:])
    assert metrics.mse(sums) == pytest.approx(8.5)
    assert metrics.pearson(sums) == pytest.approx(11 / math.sqrt(130))
    assert metrics.pearson(metrics.regress_sums(-P, Y)) == pytest.approx(-11 / math.sqrt(130))
    assert math.isnan(metrics.pearson(metrics.regress_sums(torch.ones(4), Y)))  # constant predictions: undefined


# --- pooling and the head ------------------------------------------------------------------


def test_pooling_reads_the_first_the_mean_of_the_real_tokens_or_the_last_real_token():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)  # (b, n, d): values 0..7
    tokens = torch.tensor([[1, 7, 2, 0], [1, 8, 9, 2]])  # the first text is padded (id 0) after 3 tokens
    assert pool(hidden, tokens, pooling="cls", pad_id=0).flatten().tolist() == [0.0, 4.0]
    assert pool(hidden, tokens, pooling="mean", pad_id=0).flatten().tolist() == [1.0, 5.5]
    assert pool(hidden, tokens, pooling="last", pad_id=0).flatten().tolist() == [2.0, 7.0]
    assert pool(hidden, tokens, pooling="last", pad_id=None).flatten().tolist() == [3.0, 7.0]


class _Fixed(nn.Module):
    """A model whose features are given: the head's loss alone is under test."""

    def __init__(self, hidden: torch.Tensor, head: nn.Module):
        super().__init__()
        self.hidden, self.head = hidden, head

    def features(self, tokens, *, token_types=None):
        return self.hidden


def _identity_head(outputs: int) -> SequenceHead:
    head = SequenceHead(d_model=2, outputs=outputs, pooling="cls", dropout=0.0, pad_id=0)
    with torch.no_grad():
        head.out.weight.copy_(torch.eye(2)[:outputs])
        head.out.bias.zero_()
    return head


def test_cross_entropy_of_the_head_by_hand():
    # Logits (2, 0) and (0, 0), labels 0 and 1: -log softmax = log(1 + e^-2) and log 2.
    hidden = torch.tensor([[[2.0, 0.0]], [[0.0, 0.0]]])
    batch = {"tokens": torch.ones(2, 1, dtype=torch.long), "labels": torch.tensor([0, 1])}
    result = sequence_loss(_Fixed(hidden, _identity_head(2)), batch, epsilon=0.0, regress=False)
    nll = [math.log(1 + math.exp(-2)), math.log(2)]
    assert float(result.loss.detach()) == pytest.approx(sum(nll) / 2)
    assert float(result.nll) == pytest.approx(sum(nll))
    assert int(result.correct) == 2 - 1 and int(result.tokens) == 2  # (0, 0) argmax is class 0: wrong
    smoothed = sequence_loss(_Fixed(hidden, _identity_head(2)), batch, epsilon=0.1, regress=False)
    # (1 - eps) NLL + eps * mean over classes of -log p (Szegedy et al. 2016)
    uniform = [(math.log(1 + math.exp(-2)) + math.log(1 + math.exp(2))) / 2, math.log(2)]
    assert float(smoothed.loss.detach()) == pytest.approx(sum(0.9 * n + 0.1 * u for n, u in zip(nll, uniform)) / 2)


def test_squared_error_of_the_head_by_hand():
    hidden = torch.tensor([[[1.5, 0.0]], [[-1.0, 0.0]], [[0.0, 0.0]]])
    batch = {"tokens": torch.ones(3, 1, dtype=torch.long), "labels": torch.tensor([1.0, 1.0, 0.5])}
    result = sequence_loss(_Fixed(hidden, _identity_head(1)), batch, epsilon=0.1, regress=True)
    assert float(result.loss.detach()) == pytest.approx((0.25 + 4.0 + 0.25) / 3)  # no smoothing of a number
    assert float(result.nll) == pytest.approx(4.5)


# --- the recipe ----------------------------------------------------------------------------

BODY = {"vocab_size": 40, "d_model": 16, "attention": {"type": "multihead", "heads": 2}, "ffn": {"type": "mlp", "hidden": 32}}
LABELLED = {"type": "labelled", "format": "jsonl", "path": "x", "columns": {"text": "t", "label": "l"}, "tokenizer": {"type": "char", "vocab_size": 40}}


def _recipe(kind: str, head: dict | None, data: dict | None = None, monitor: str | None = None):
    stack = {"encoder": {"layers": 1}} if kind == "encoder" else {"decoder": {"layers": 1}}
    if kind == "encoder_decoder":
        stack = {"encoder": {"layers": 1}, "decoder": {"layers": 1}}
    mtp = head.pop("mtp", None) if head is not None else None  # a key of the model section, given beside the head here
    model = {**BODY, "kind": kind, **stack} | ({"head": head} if head is not None else {}) | ({"mtp": {"depth": 1}} if mtp else {})
    trainer = {"trainer": {"monitor": monitor}} if monitor else {}
    return recipe_from_dict({"model": model} | ({"data": data} if data is not None else {}) | trainer)


def _problems(*args) -> list[str]:
    with pytest.raises(RecipeError) as caught:
        _recipe(*args)
    return [f"{p.path}: {p.message}" for p in caught.value.problems]


@pytest.mark.parametrize("kind, pooling, outputs", [("encoder", "cls", 3), ("encoder", "mean", 3), ("decoder", "last", 3), ("decoder", "mean", 3)])
def test_a_head_gives_one_output_per_class_per_text(kind, pooling, outputs):
    model = build_model(_recipe(kind, {"type": "classify", "classes": outputs, "pooling": pooling}))
    assert model(torch.tensor([[1, 9, 9, 2], [1, 9, 2, 0]])).shape == (2, outputs)
    assert not any("head.out." in k and k.endswith("weight") and v.shape[0] == 40 for k, v in model.state_dict().items())


def test_the_default_pooling_follows_the_kind_and_no_head_keeps_the_language_model():
    assert build_model(_recipe("encoder", {"type": "regress"})).head.pooling == "cls"
    assert build_model(_recipe("decoder", {"type": "classify", "labels": ["a", "b"]})).head.pooling == "last"
    assert build_model(_recipe("encoder", None))(torch.tensor([[1, 9, 2]])).shape == (1, 3, 40)
    assert "head" not in _recipe("encoder", None).to_dict()["model"]  # existing recipes are unchanged


@pytest.mark.parametrize(
    "args, expected",
    [
        (("decoder", {"type": "classify", "classes": 2, "pooling": "cls"}), "model.head.pooling: cls reads the first token"),
        (("encoder", {"type": "classify", "classes": 2, "pooling": "last"}), "model.head.pooling: last is for decoders"),
        (("encoder_decoder", {"type": "classify", "classes": 2}), "model.head: a sequence head reads one stack"),
        (("encoder", {"type": "regress", "classes": 2}), "model.head.classes: a regress head predicts one number"),
        (("encoder", {"type": "classify"}), "model.head.classes: a classify head needs classes"),
        (("encoder", {"type": "classify", "classes": 3, "labels": ["a", "b"]}), "model.head.classes: classes (3) differs from the 2 labels"),
        (("encoder", {"type": "classify", "labels": ["a", "a"]}), "model.head.labels: labels lists 'a' more than once"),
        (("encoder", {"type": "classify", "classes": 1}), "model.head.classes: Input should be greater than or equal to 2"),
        (("encoder", None, LABELLED), "model.head: labelled data trains a sequence head"),
        (("encoder", {"type": "regress"}, {**LABELLED, "type": "monolingual", "columns": {"text": "t"}}), "data.type: a model of kind 'encoder' trains on labelled data"),
        (("encoder", {"type": "regress"}, {**LABELLED, "format": "text", "columns": None}), "data.format: labelled data is read from records"),
        (("encoder", {"type": "regress"}, {**LABELLED, "columns": {"text": "t"}}), "data.columns.label: labelled data in format jsonl needs columns.label"),
        (("encoder", {"type": "regress"}, None, "val_f1"), "trainer.monitor: val_f1 is a score of a classify head"),
        (("decoder", {"type": "regress", "mtp": True}), "model.mtp: multi-token prediction trains next-token outputs"),
        (("encoder", None, None, "val_mse"), "trainer.monitor: val_mse is a score of a regress head"),
        (("encoder", {"type": "regress"}, None, "val_acc"), "trainer.monitor: a regress head has no accuracy"),
    ],
)
def test_nonsense_heads_are_refused_at_their_key(args, expected):
    assert any(p.startswith(expected) for p in _problems(*args)), _problems(*args)


def test_a_head_score_may_pick_the_best_checkpoint():
    assert _recipe("encoder", {"type": "classify", "classes": 2}, None, "val_f1").trainer.monitor == "val_f1"
    from tfbuilder.train.callbacks import RunGuard

    assert RunGuard(Path("."), monitor="val_f1", patience=None, keep_last=0, log_every=1).mode == "max"
    assert RunGuard(Path("."), monitor="val_mse", patience=None, keep_last=0, log_every=1).mode == "min"
