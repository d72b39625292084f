"""The recipe's ``model.head``: what a one-stack model predicts from a whole text (schema only, no tensors).

Left out (the default), a model keeps its language-model or translation output. ``classify`` puts a
linear layer over a pooled hidden state and trains it with cross-entropy; ``regress`` predicts one
number and trains it with the mean squared error (Devlin et al. 2019, sec. 4.1; Radford et al. 2018,
sec. 3.3).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tfbuilder.spec.base import Issue, Section, fail

Pooling = Literal["cls", "mean", "last"]
MAX_CLASSES = 100_000
MAX_LABEL = 200  # characters of a label name


class HeadSection(Section):
    """A sequence head: a class (``classify``) or a number (``regress``) for each text."""

    type: Literal["classify", "regress"] = Field(
        description="classify (cross-entropy over classes) or regress (one number, squared error)"
    )
    classes: int | None = Field(
        None,
        ge=2,
        le=MAX_CLASSES,
        description="classify: how many classes (or give labels); "
        "the training split must have exactly this many labels",
    )
    labels: list[str] | None = Field(
        None,
        min_length=2,
        max_length=MAX_CLASSES,
        description="classify: the label names, class i is labels[i]; default: the training split's labels, sorted "
        "(numerically when every label is an integer), recorded in the run's recipe",
    )
    pooling: Pooling | None = Field(
        None,
        description="the hidden state the head reads: cls (the first token, <s>: encoders), mean (of the real "
        "tokens), last (the last real token: decoders, the only one that has seen the whole text); "
        "default cls for an encoder, last for a decoder",
    )
    dropout: float | None = Field(
        None, ge=0.0, lt=1.0, description="dropout on the pooled state; default model.dropout"
    )
    pooler: bool = Field(
        False,
        description="a d_model x d_model dense layer and tanh on the pooled state before the output (BERT's pooler, "
        "Devlin et al. 2019, arXiv:1810.04805, as BertForSequenceClassification computes)",
    )
    bias: bool = Field(
        True,
        description="learn a bias on the output layer; false: none, as transformers' *ForSequenceClassification "
        "decoders (Llama, Mistral, Qwen2, ...) have, so that export --format hf can write the model as one",
    )

    @field_validator("labels")
    @classmethod
    def _names(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        for name in value:
            if not name.strip() or len(name) > MAX_LABEL:
                raise PydanticCustomError(
                    "label_name", "a label is a non-blank name of at most {n} characters", {"n": MAX_LABEL}
                )
        twice = sorted({n for n in value if value.count(n) > 1})
        if twice:
            raise PydanticCustomError(
                "label_twice", "labels lists {names} more than once", {"names": ", ".join(map(repr, twice))}
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> HeadSection:
        problems: list[Issue] = []
        if self.type == "regress":
            for name in ("classes", "labels"):
                if getattr(self, name) is not None:
                    problems.append(
                        (
                            (name,),
                            f"a regress head predicts one number: remove {name} (or use type: classify)",
                            getattr(self, name),
                        )
                    )
        elif self.classes is None and self.labels is None:
            problems.append((("classes",), "a classify head needs classes: N (or labels: [names])", None))
        elif self.labels is not None and self.classes is not None and self.classes != len(self.labels):
            problems.append(
                (
                    ("classes",),
                    f"classes ({self.classes}) differs from the {len(self.labels)} labels given; leave it out",
                    self.classes,
                )
            )
        fail("HeadSection", problems)
        return self

    @property
    def outputs(self) -> int:
        """Numbers the head outputs per text: one per class, or one to regress."""
        if self.type == "regress":
            return 1
        return self.classes if self.classes is not None else len(self.labels or ())

    def pooling_for(self, kind: str) -> Pooling:
        """The pooling used with a model of ``kind``: the given one, or cls (encoder) / last (decoder)."""
        return self.pooling or ("cls" if kind == "encoder" else "last")


def head_problems(head: HeadSection, kind: str) -> list[Issue]:
    """What is wrong with ``head`` on a model of ``kind`` (locations relative to ``model``)."""
    if kind == "encoder_decoder":
        return [
            (
                ("head",),
                "a sequence head reads one stack: use kind encoder or decoder (an encoder_decoder model translates)",
                head.type,
            )
        ]
    if head.pooling == "cls" and kind == "decoder":
        return [
            (
                ("head", "pooling"),
                "cls reads the first token, which in a decoder (causal attention) has seen only itself: "
                "use last or mean",
                "cls",
            )
        ]
    if head.pooling == "last" and kind == "encoder":
        return [
            (
                ("head", "pooling"),
                "last is for decoders (the last token is the only one that has seen the whole text): "
                "an encoder uses cls or mean",
                "last",
            )
        ]
    return []
