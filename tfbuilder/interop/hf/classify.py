"""A decoder of one of the families with a sequence head (``model.head``) as transformers'
``<X>ForSequenceClassification`` (``LlamaForSequenceClassification``, ``MistralFor...``, ``Qwen2For...``):
the body is the family's, the head its ``score`` layer, a linear map without bias read at the last
token that is not ``pad_token_id`` (tfbuilder's ``pooling: last``: the last real token of a
right-padded row)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfbuilder.errors import TfbuilderError
from tfbuilder.interop.hf.families import DECODERS

if TYPE_CHECKING:
    from tfbuilder.interop.hf.weights import Rule
    from tfbuilder.spec.head import HeadSection
    from tfbuilder.spec.recipe import ModelSection


def body(model: ModelSection) -> ModelSection:
    """The model section without its sequence head: what the family's config describes (a pad id only
    finds the last token: transformers masks padding by the attention mask, so the body has none)."""
    return model.model_copy(update={"head": None, "pad_id": None})


def check(model: ModelSection, head: HeadSection, family: str) -> None:
    """Refuse, naming the key, a head that ``<X>ForSequenceClassification`` does not compute."""
    if family not in DECODERS:
        raise TfbuilderError(
            f"model.head: a sequence head is written as <X>ForSequenceClassification for the decoder families "
            f"({', '.join(DECODERS)}); this body is {family}"
        )
    pooling = head.pooling_for(model.kind)
    if pooling != "last":
        raise TfbuilderError(
            f"model.head.pooling: {pooling}: transformers' {DECODERS[family].architecture.removesuffix('ForCausalLM')}"
            "ForSequenceClassification reads the last real token (pooling: last)"
        )
    if head.bias:
        raise TfbuilderError(
            "model.head.bias: true: transformers' ForSequenceClassification decoders have no bias on their score "
            "layer; train the head with head.bias: false to export it"
        )


def config(model: ModelSection, head: HeadSection, family: str) -> dict:
    """The keys that make a family's ``config.json`` a sequence classifier's."""
    labels = head.labels or [f"LABEL_{i}" for i in range(head.outputs)]
    out = {
        "architectures": [DECODERS[family].architecture.replace("ForCausalLM", "ForSequenceClassification")],
        "num_labels": head.outputs,
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        "pad_token_id": model.pad_id,
    }
    if head.type == "regress":
        out["problem_type"] = "regression"
    return out


def rules(family_rules: list[Rule]) -> list[Rule]:
    """The family's weight names with the language-model output replaced by the ``score`` layer."""
    return [r for r in family_rules if r[0] != "head.weight"] + [("head.out.weight", ("score.weight",), "copy")]
