"""The params half of the component contract, without tensors: the strict base every component's
``Params`` subclasses, the dimensions shared by the whole model, and what attention and position
params tell the builder before anything is built.

The recipe schema (:mod:`tfbuilder.spec`) validates component slots with these and imports no
tensors; the modules half of the contract (what a built component exposes) is :mod:`tfbuilder.contracts`,
which re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import PydanticCustomError

MAX_INT = 2**32 - 1
"""The largest integer any recipe value may be (a seed's range): sizes beyond it overflow torch and
numpy before any check of the model's size could say so."""


def bounded(value: object) -> object:
    """``value``, if no integer in it (or in its items) is beyond :data:`MAX_INT` either way."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_INT:
            raise PydanticCustomError("int_bound", f"integers here are at most {MAX_INT:,}")
    return value


class ComponentParams(BaseModel):
    """Base of every component's params: strict (unknown keys are errors), immutable, described; no
    integer beyond :data:`MAX_INT` (a plugin's fields included)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    family: ClassVar[str] = ""
    type: str

    _bounded = field_validator("*", mode="after")(bounded)

    def check(self, dims: ModelDims) -> list[tuple[str, str]]:
        """Checks that need the model's shared dimensions; returns ``(field, message)`` pairs."""
        return []


@dataclass(frozen=True)
class ModelDims:
    """Dimensions shared by the whole model, known when a recipe is validated."""

    d_model: int


@dataclass(frozen=True)
class AttentionShape:
    """Query heads and query/key width per head: what a position acting inside attention is built for."""

    heads: int
    key_dim: int
    rotary_dim: int | None = None  # the width per head a rotary position turns, when not key_dim (latent attention)


class AttentionParams(ComponentParams):
    """Base of attention params: :meth:`shape` tells the builder the heads and key width before the
    attention is built (whatever the params' fields are called)."""

    def shape(self, d_model: int) -> AttentionShape:
        raise NotImplementedError(f"{type(self).__qualname__} must define shape(d_model) -> AttentionShape")


@runtime_checkable
class Shaped(Protocol):
    """What every attention's params provide, whether or not they subclass :class:`AttentionParams`
    (the contract asks for the member, not the base class)."""

    def shape(self, d_model: int) -> AttentionShape: ...


class PositionParams(ComponentParams):
    """Base of position params: :meth:`max_positions` is the longest sequence the position covers."""

    def max_positions(self) -> int | None:
        """None: any length (computed on the fly past a precomputed table)."""
        return None

    def check_shape(self, shape: AttentionShape) -> list[tuple[str, str]]:
        """Checks of a position acting inside self-attention of ``shape`` (heads, key width); returns
        ``(field, message)`` pairs."""
        return []


__all__ = [
    "MAX_INT",
    "AttentionParams",
    "AttentionShape",
    "ComponentParams",
    "ModelDims",
    "PositionParams",
    "Shaped",
    "bounded",
]
