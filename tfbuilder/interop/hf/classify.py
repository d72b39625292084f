"""A model of one of the families with a sequence head (``model.head``) as transformers'
``<X>ForSequenceClassification``. A decoder (``LlamaForSequenceClassification``, ``MistralFor...``,
``Qwen2For...``): the body is the family's, the head its ``score`` layer, a linear map without bias read
at the last token that is not ``pad_token_id`` (tfbuilder's ``pooling: last``: the last real token of a
right-padded row). BERT (``BertForSequenceClassification``, Devlin et al. 2019, arXiv:1810.04805): the
first token's state through the pooler, tanh(W h + b) (``pooler: true``), then the ``classifier`` layer
with its bias.
"""

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
    finds the last token or masks padding: transformers masks padding by the attention mask, so the body
    has none; :func:`config` writes the model's as ``pad_token_id``)."""
    return model.model_copy(update={"head": None, "pad_id": None})


def check(model: ModelSection, head: HeadSection, family: str) -> None:
    """Refuse, naming the key, a head that ``<X>ForSequenceClassification`` does not compute."""
    if family == "bert":
        _check_bert(model, head)
        return
    if family not in DECODERS:
        raise TfbuilderError(
            f"model.head: a sequence head is written as <X>ForSequenceClassification for BERT and the decoder "
            f"families ({', '.join(DECODERS)}); this body is {family}"
        )
    if head.pooler:
        raise TfbuilderError(
            "model.head.pooler: true: transformers' ForSequenceClassification decoders read the last token's state "
            "directly, with no pooler"
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


def _check_bert(model: ModelSection, head: HeadSection) -> None:
    """BertForSequenceClassification: the first token ([CLS]), the pooler, a classifier with a bias."""
    pooling = head.pooling_for(model.kind)
    for key, value, want in (("pooling", pooling, "cls"), ("pooler", head.pooler, True), ("bias", head.bias, True)):
        if value != want:
            raise TfbuilderError(
                f"model.head.{key}: {value}: transformers' BertForSequenceClassification reads the first token "
                f"through its pooler into a classifier with a bias (pooling: cls, pooler: true, bias: true)"
            )


def config(model: ModelSection, head: HeadSection, family: str) -> dict:
    """The keys that make a family's ``config.json`` a sequence classifier's."""
    labels = head.labels or [f"LABEL_{i}" for i in range(head.outputs)]
    name = "Bert" if family == "bert" else DECODERS[family].architecture.removesuffix("ForCausalLM")
    out = {
        "architectures": [f"{name}ForSequenceClassification"],
        "num_labels": head.outputs,
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        "pad_token_id": model.pad_id,
    }
    if family == "bert" and head.dropout is not None:
        out["classifier_dropout"] = head.dropout  # (null: hidden_dropout_prob, as tfbuilder's model.dropout)
    if head.type == "regress":
        out["problem_type"] = "regression"
    return out


def rules(family_rules: list[Rule], family: str) -> list[Rule]:
    """The family's weight names with the language-model output replaced by the ``score`` layer (BERT: the
    masked-LM head by the pooler and the ``classifier`` layer)."""
    if family == "bert":
        body = [r for r in family_rules if not r[0].startswith("head.")]
        return body + [
            ("head.pooler.weight", ("bert.pooler.dense.weight",), "copy"),
            ("head.pooler.bias", ("bert.pooler.dense.bias",), "copy"),
            ("head.out.weight", ("classifier.weight",), "copy"),
            ("head.out.bias", ("classifier.bias",), "copy"),
        ]
    return [r for r in family_rules if r[0] != "head.weight"] + [("head.out.weight", ("score.weight",), "copy")]
