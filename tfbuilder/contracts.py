"""The component contract: what every attention, position, norm and feed-forward exposes to the rest
of tfbuilder, written as types.

The builder, the initialiser, the objectives, the decoders, the Hugging Face converter and the
attention maps read components only through these members; nothing looks a component up by the
names its author happened to choose. :func:`missing` is what :func:`tfbuilder.register` checks, so a
component that does not satisfy its family's contract is refused when it registers, with the
members it lacks named.

=========  ==============================================================================================
family     the component (an ``nn.Module`` built as ``cls(params, ctx)``) and its ``Params``
=========  ==============================================================================================
attention  ``Params.shape(d_model) -> AttentionShape`` (heads and query/key width per head, known before
           the model is built: a position acting inside attention is built for them); ``heads``,
           ``key_dim`` (the same, on the module); ``output_projections()`` (the projections that end
           the residual branch); ``fused_widths()``; ``keeps_weights`` (class flag) with ``keep_weights``/``weights``;
           ``forward(x, *, context=None, mask=None, cache=None)``, where ``cache`` is a :data:`KVCache`
position   ``Params.max_positions() -> int | None`` (the longest sequence it covers, None: any);
           ``Params.check_shape(shape)`` (what it refuses inside a self-attention of that shape);
           ``forward(x, *, offset=0)``; one acting inside attention subclasses
           :class:`~tfbuilder.model.components.position.AttentionPosition`
norm       ``forward(x)``
ffn        ``output_projections()`` (a mixture of experts: every expert's); ``fused_widths()``; ``forward(x)``
=========  ==============================================================================================

The mixins :class:`AttentionBase`, :class:`FeedForwardBase`, :class:`AttentionParams` and
:class:`PositionParams` give the defaults; a third-party component may subclass them or declare the
members itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from torch import Tensor, nn

from tfbuilder.params import (  # re-exported: the params half of the contract
    AttentionParams,
    AttentionShape,
    ComponentParams,
    ModelDims,
    PositionParams,
)

KVCache = dict[str, Tensor]
"""One attention layer's key/value cache for incremental decoding: an empty dict the first time;
the attention stores what it needs (self-attention appends this call's keys and values; cross-
attention keeps the source's), and the decoder hands the same dict back at the next step."""

FFN_WIDTH = 4
"""The inner width of a feed-forward network is ``FFN_WIDTH * d_model`` unless set (Vaswani et al.
2017, sec. 3.3: 2048 for d_model 512)."""


def default_ffn_hidden(d_model: int) -> int:
    """The feed-forward inner width when a recipe does not set one: 4 * d_model."""
    return FFN_WIDTH * d_model


def default_head_dim(d_model: int, heads: int) -> int:
    """The query/key (and value) width per head when a recipe does not set one: d_model / heads
    (Vaswani et al. 2017, sec. 3.2.2)."""
    return d_model // heads


@dataclass(frozen=True)
class BuildContext:
    """What a component learns at build time instead of repeating it in its params."""

    d_model: int
    causal: bool = False
    cross: bool = False
    heads: int = 1  # the stack's attention heads (positions that bias attention need it)
    # The stack's query/key width per head, or the narrower width a rotary position turns (latent
    # attention's rotary part): what rotary tables are built for, when known.
    head_dim: int | None = None
    # The stack's position when it acts inside self-attention (rotary, ALiBi, relative bias), else None:
    # the interface between the two is documented on AttentionPosition (below).
    position: AttentionPosition | None = None
    layer: int = 0  # this layer's index in its stack, from 0 (differential attention's lambda_init reads it)
    num_layers: int = 1  # the layers of the stack
    # What the self-attention layers of one stack share within a forward (the first layer's values,
    # for value residual learning): one per stack, created by the builder; None outside a stack.
    shared: StackShared | None = None


class StackShared:
    """A per-stack scratch space that the self-attention layers of one stack share within a forward:
    the first layer writes, later layers read (value residual learning, Zhou et al. 2024,
    arXiv:2410.17897). Not a module: it holds no parameters and is never saved."""

    def __init__(self) -> None:
        self.first_values: Tensor | None = None


class AuxiliaryLoss:
    """Interface of a component whose forward also computes a loss for the training objective (the
    load-balancing loss of a mixture of experts). :meth:`auxiliary_loss` returns it, already weighted,
    for the component's last forward; a model sums them in ``model.auxiliary_loss()`` and training
    adds that sum to the objective (evaluation scores without it)."""

    def auxiliary_loss(self) -> Tensor:
        raise NotImplementedError


class RoutingBalance:
    """Interface of a component whose routing is balanced by state that training updates once per
    optimizer step, outside the gradient (DeepSeek-V3's auxiliary-loss-free balancing, arXiv:2412.19437):
    the training forward counts what it routed, :meth:`routing_load` returns the count (None when the
    component does not balance), and :meth:`balance` takes it summed over the ranks, updates and
    restarts the count. A model calls them in ``model.balance_routing()``."""

    def routing_load(self) -> Tensor | None:
        raise NotImplementedError

    def balance(self, load: Tensor) -> None:
        raise NotImplementedError


class AttentionPosition(nn.Module):
    """The interface of a position that acts inside self-attention (rotary, ALiBi, T5's relative bias).

    The contract, both sides:

    * the builder gives the module to every self-attention layer of the stack its side feeds, as
      ``BuildContext.position`` (cross-attention and additive positions get None); layers whose
      kind or override changes the position get one built for their params instead (None for
      ``type: none``);
    * the embedding owns it (registered once per side, shared by the layers), and its ``forward``
      passes the embeddings through unchanged; a stack owns the ones built for its layers;
    * a position that ``rotates`` implements :meth:`rotate`, which self-attention applies to its
      queries and keys (keys are cached rotated); one that ``biases`` implements :meth:`bias`, which
      self-attention adds to its scores before the softmax. A position may do both.

    A third-party position that acts inside attention subclasses this and sets the flags it needs.
    """

    rotates: ClassVar[bool] = False
    biases: ClassVar[bool] = False

    def forward(self, x: Tensor, *, offset: int = 0) -> Tensor:
        """``x`` (b, n, d) unchanged."""
        return x

    def rotate(self, x: Tensor, offset: int = 0) -> Tensor:
        """Queries or keys ``x`` (b, h, n, k) at positions offset..offset+n-1 -> rotated, same shape."""
        raise NotImplementedError(f"{type(self).__name__} does not rotate (rotates is False)")

    def bias(self, n_query: int, n_key: int, offset: int, heads: int) -> Tensor:
        """Additive scores (1, h, i, j) for queries at positions offset..offset+i-1 and keys at 0..j-1."""
        raise NotImplementedError(f"{type(self).__name__} adds no score bias (biases is False)")


@runtime_checkable
class Attention(Protocol):
    """What an attention component exposes (see the module's table)."""

    heads: int
    key_dim: int
    keeps_weights: ClassVar[bool]
    keep_weights: bool
    weights: Tensor | None

    def output_projections(self) -> list[nn.Linear]: ...

    def fused_widths(self) -> dict[str, list[int]]: ...

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor: ...


@runtime_checkable
class FeedForward(Protocol):
    """What a feed-forward component exposes."""

    def output_projections(self) -> list[nn.Linear]: ...

    def fused_widths(self) -> dict[str, list[int]]: ...

    def forward(self, x: Tensor) -> Tensor: ...


@runtime_checkable
class Position(Protocol):
    """What a position component exposes (its params tell the longest sequence it covers)."""

    def forward(self, x: Tensor, *, offset: int = 0) -> Tensor: ...


@runtime_checkable
class Norm(Protocol):
    """What a norm component exposes."""

    def forward(self, x: Tensor) -> Tensor: ...


class AttentionBase:
    """Defaults of the attention contract: no fused projections to split, weights not kept."""

    heads: int
    key_dim: int
    keeps_weights: ClassVar[bool] = False
    keep_weights: bool = False
    weights: Tensor | None = None

    def output_projections(self) -> list[nn.Linear]:
        """The projections that end the residual branch: GPT-2's residual scaling (Radford et al. 2019,
        sec. 2.3) initialises them with std / sqrt(2 * layers)."""
        raise NotImplementedError(f"{type(self).__name__} must define output_projections()")

    def fused_widths(self) -> dict[str, list[int]]:
        """``{"to_qkv": [q, k, v]}``: output widths of each fused projection (named relative to the
        module), for exporters that split them; empty when nothing is fused."""
        return {}

    def cache_per_token(self) -> int | None:
        """How many numbers the KV cache keeps per token of self-attention (``tfbuilder show``
        reports the sum over a decoder's layers); None when the component does not say."""
        return None


class FeedForwardBase:
    """Defaults of the feed-forward contract: no fused projections."""

    def output_projections(self) -> list[nn.Linear]:
        """The projections that end the residual branch: GPT-2's residual scaling (Radford et al. 2019,
        sec. 2.3) initialises them with std / sqrt(2 * layers)."""
        raise NotImplementedError(f"{type(self).__name__} must define output_projections()")

    def fused_widths(self) -> dict[str, list[int]]:
        """``{"ff_in": [hidden, hidden]}``: output widths of each fused projection; empty when none."""
        return {}


# family -> (members of the component class, members of its Params), each with what it is for.
REQUIRED: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "attention": (
        {
            "heads": "the number of query heads",
            "key_dim": "the query/key width per head",
            "output_projections": "output_projections() -> list[nn.Linear]: "
            "what ends the residual branch (GPT-2 residual scaling)",
            "fused_widths": "the widths of its fused projections (exporters split them)",
            "keeps_weights": "whether it can keep its attention weights (attention maps)",
            "forward": "forward(x, *, context=None, mask=None, cache=None)",
        },
        {"shape": "shape(d_model) -> AttentionShape: heads and key width, before the model is built"},
    ),
    "position": (
        {"forward": "forward(x, *, offset=0)"},
        {"max_positions": "max_positions() -> int | None: the longest sequence it covers"},
    ),
    "norm": ({"forward": "forward(x)"}, {}),
    "ffn": (
        {
            "output_projections": "output_projections() -> list[nn.Linear]: "
            "what ends the residual branch (GPT-2 residual scaling)",
            "fused_widths": "the widths of its fused projections (exporters split them)",
            "forward": "forward(x)",
        },
        {},
    ),
}


def _declares(cls: type, name: str, *, ignore: tuple[type, ...]) -> bool:
    """Whether ``cls`` (or a base other than ``ignore``) defines or annotates ``name``, and not only as
    a default of the mixins that raises (``output_projections``, ``shape``)."""
    for base in cls.__mro__:
        if base in ignore or base is object:
            continue
        if name in vars(base) or name in vars(base).get("__annotations__", {}):
            return (base, name) not in _ABSTRACT
    return False


_ABSTRACT = {(AttentionBase, "output_projections"), (FeedForwardBase, "output_projections"), (AttentionParams, "shape")}


def missing(family: str, cls: type) -> list[str]:
    """The members of ``family``'s contract that ``cls`` (and its ``Params``) lack: ``"name (what it
    is for)"`` each; empty when the class satisfies it."""
    members, params_members = REQUIRED[family]
    out = [f"{name} ({why})" for name, why in members.items() if not _declares(cls, name, ignore=(nn.Module,))]
    params = getattr(cls, "Params", None)
    out += [
        f"Params.{name} ({why})"
        for name, why in params_members.items()
        if params is None or not _declares(params, name, ignore=(ComponentParams,))
    ]
    return out


def satisfies(family: str, module: nn.Module) -> bool:
    """Whether a built ``module`` is what its family's protocol says (a check for tests and tools)."""
    return isinstance(module, {"attention": Attention, "position": Position, "norm": Norm, "ffn": FeedForward}[family])


__all__ = [
    "FFN_WIDTH",
    "REQUIRED",
    "Attention",
    "AttentionBase",
    "AttentionParams",
    "AttentionPosition",
    "AttentionShape",
    "AuxiliaryLoss",
    "BuildContext",
    "ComponentParams",
    "FeedForward",
    "FeedForwardBase",
    "KVCache",
    "ModelDims",
    "Norm",
    "Position",
    "PositionParams",
    "RoutingBalance",
    "StackShared",
    "default_ffn_hidden",
    "default_head_dim",
    "missing",
    "satisfies",
]
