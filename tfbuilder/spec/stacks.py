"""The encoder and decoder stack sections, with their layer patterns and per-layer changes, and the
checks of those changes (schema only, no tensors).

A stack's layers are alike unless ``pattern`` repeats named ``kinds`` over the depth (Gemma 2's
local and global layers, Gemma Team 2024, arXiv:2408.00118) or ``overrides`` change single layers.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError
from pydantic_core import PydanticCustomError

from tfbuilder import registry
from tfbuilder.contracts import AttentionPosition
from tfbuilder.errors import did_you_mean
from tfbuilder.params import ComponentParams, Shaped
from tfbuilder.spec.base import Issue, Section
from tfbuilder.spec.slots import Attention, Ffn, Norm, merged_params

LAYER_FAMILIES = ("attention", "ffn", "norm", "position")


class LayerChanges(Section):
    """Changes to some layers' components: each a partial mapping merged over the stack's component
    (``{window: null}`` changes one param; naming another ``type`` starts that type from its defaults).
    The merged params are validated as the type's own."""

    attention: dict[str, Any] | None = Field(None, description="changes to the self-attention's params")
    ffn: dict[str, Any] | None = Field(None, description="changes to the feed-forward's params")
    norm: dict[str, Any] | None = Field(None, description="changes to the norms' params")
    position: dict[str, Any] | None = Field(
        None,
        description="changes to model.position for these layers' self-attention (Gemma 3's local layers: {base: "
        "10000}); only a position acting inside attention (rotary, alibi, relative_bias) can differ per layer, "
        "and {type: none} leaves it out of these layers (NoPE layers)",
    )


class StackSection(Section):
    """An encoder or decoder stack; components left out come from the model section. Layers are alike
    unless ``pattern`` (named ``kinds`` repeated over the depth) or ``overrides`` (single layers)
    change their components."""

    layers: int = Field(6, ge=1, le=1000, description="number of layers N")
    attention: Attention | None = Field(None, description="self-attention; default model.attention")
    ffn: Ffn | None = Field(None, description="feed-forward sub-layer; default model.ffn")
    norm: Norm | None = Field(None, description="normalisation; default model.norm")
    kinds: dict[Annotated[str, Field(min_length=1, max_length=64)], LayerChanges] = Field(
        default_factory=dict,
        max_length=64,
        description="named kinds of layer, each its changes to the stack's components (used by pattern)",
    )
    pattern: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="the kinds of consecutive layers, repeated over the depth: "
        "layer i is pattern[i % len(pattern)] (Gemma 2: [local, global]); default all alike",
    )
    overrides: dict[Annotated[int, Field(strict=False)], LayerChanges] = Field(
        default_factory=dict,
        max_length=1000,
        description="changes to single layers by index (from 0; negative from the end: -1 is the last), "
        "applied over the pattern's",
    )


class DecoderSection(StackSection):
    """A decoder stack: masked self-attention, cross-attention (encoder-decoder only), feed-forward."""

    cross_attention: Attention | None = Field(
        None, description="attention over the encoder output; default the decoder's self-attention"
    )


def pattern_problems(part: str, stack: StackSection) -> list[Issue]:
    """A pattern naming unknown kinds, and kinds the pattern never uses."""
    problems: list[Issue] = []
    kinds = sorted(stack.kinds)
    for i, name in enumerate(stack.pattern or []):
        if name not in stack.kinds:
            known = ", ".join(kinds) if kinds else "none; define them under kinds"
            problems.append(
                (
                    (part, "pattern", i),
                    f"unknown layer kind '{name}' (kinds: {known}){did_you_mean(name, kinds)}",
                    name,
                )
            )
    for name in kinds:
        if name not in (stack.pattern or []):
            problems.append(((part, "kinds", name), f"kind '{name}' is not in {part}.pattern", None))
    return problems


def index_problems(part: str, stack: StackSection) -> list[Issue]:
    """Overrides of layers the stack does not have."""
    return [
        (
            (part, "overrides", index),
            f"no layer {index} in a stack of {stack.layers} layers (0 to {stack.layers - 1}, or -1 to -{stack.layers})",
            index,
        )
        for index in stack.overrides
        if not -stack.layers <= index < stack.layers
    ]


def change_problems(loc: tuple[Any, ...], base: ComponentParams, change: dict[str, Any], d_model: int) -> list[Issue]:
    """What is wrong with the layer change at ``loc``, merged over the stack's component ``base``:
    params the merged type refuses, and (attention) a shape or value residual unlike the stack's."""
    try:
        merged = merged_params(base, change)
    except ValidationError as exc:
        return [(loc + tuple(err["loc"]), err["msg"], err.get("input")) for err in exc.errors()]
    except PydanticCustomError as exc:
        return [(loc + ("type",), exc.message(), change.get("type"))]
    if base.family == "position":
        return position_change_problems(loc, base, merged)
    if base.family != "attention" or not (isinstance(base, Shaped) and isinstance(merged, Shaped)):
        return []
    problems: list[Issue] = []
    if merged.shape(d_model) != base.shape(d_model):
        problems.append(
            (
                loc,
                "a layer's heads and key width must be the stack's (positions inside attention are built for them)",
                None,
            )
        )
    residual = [getattr(p, "value_residual", "none") for p in (merged, base)]
    if residual[0] != residual[1]:
        problems.append(
            (
                loc + ("value_residual",),
                f"value_residual must be the stack's ({residual[1]}) in every layer "
                "(the first layer hands its values on); "
                "to leave some layers out (Sparse-ResFormer), give them value_lambdas: [0, 1]",
                residual[0],
            )
        )
    return problems


def acts_in_attention(name: str) -> bool:
    """Whether the registered position type ``name`` acts inside self-attention (an
    :class:`~tfbuilder.contracts.AttentionPosition`: rotary, alibi, relative_bias) rather than on the embeddings."""
    return issubclass(registry.get("position", name).cls, AttentionPosition)


def position_change_problems(loc: tuple[Any, ...], base: ComponentParams, merged: ComponentParams) -> list[Issue]:
    """A layer's position change where it cannot apply: the model's position is added to the embeddings
    once for all layers, or the change makes one that would be."""
    inside = [name for name in registry.types("position") if acts_in_attention(name)]
    if not acts_in_attention(base.type):
        message = (
            f"model.position ({base.type}) is added to the embeddings once, for every layer; only a position "
            f"acting inside attention ({', '.join(inside)}) can differ per layer"
        )
        return [(loc, message, None)]
    if merged.type != "none" and not acts_in_attention(merged.type):
        message = (
            f"a layer's position must act inside its attention ({', '.join(inside)}) or be none; "
            f"'{merged.type}' would be added to the embeddings"
        )
        return [(loc + ("type",), message, merged.type)]
    return []
