"""Encoder and decoder layers. Residual connections and norm placement live only here.

``post``     (Vaswani et al. 2017, sec. 5.4):         x = Norm(x + Dropout(Sublayer(x)))
``pre``      (Xiong et al. 2020, arXiv:2002.04745):   x = x + Dropout(Sublayer(Norm(x)))
``sandwich`` (Ding et al. 2021, CogView, arXiv:2105.13290): x = x + Dropout(Norm'(Sublayer(Norm(x))))
``output``   (OLMo 2, OLMo et al. 2024, arXiv:2501.00656, "reordered norm"; Swin v2's res-post-norm):
                                                      x = x + Dropout(Norm(Sublayer(x)))

A parallel layer (GPT-J, Wang & Komatsuzaki 2021; PaLM, Chowdhery et al. 2022, arXiv:2204.02311,
sec. 2) adds both branches to the same input: x = x + Dropout(Attn(Norm(x))) + Dropout(FFN(Norm(x))),
with one norm shared by the branches (both papers) or one each (GPT-NeoX's ``use_parallel_residual``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from torch import Tensor, nn

from tfbuilder.model.dropout import Dropout

Placement = Literal["post", "pre", "sandwich", "output"]


def self_kwargs(positions: Tensor | None) -> dict[str, Tensor]:
    """What self-attention is given beyond its mask and cache: each row's own ``positions`` (b, n) when
    the rows are left-padded prompts, nothing otherwise (an attention that never continues padded
    prompts need not take them)."""
    return {} if positions is None else {"positions": positions}


class Residual(nn.Module):
    """A sub-layer wrapped with dropout, a residual connection and a norm placed by ``placement``."""

    def __init__(
        self,
        inner: nn.Module,
        norm: nn.Module,
        *,
        placement: Placement,
        dropout: float,
        norm_out: nn.Module | None = None,
    ):
        super().__init__()
        if (placement == "sandwich") != (norm_out is not None):
            raise ValueError("a sandwich residual needs norm_out, and only it")
        self.inner = inner
        self.norm = norm
        self.norm_out = norm_out
        self.placement = placement
        self.drop = Dropout(dropout)

    def forward(self, x: Tensor, **kwargs) -> Tensor:
        """``x`` (b, n, d) -> (b, n, d); ``kwargs`` go to the inner sub-layer."""
        if self.placement == "post":
            return self.norm(x + self.drop(self.inner(x, **kwargs)))
        if self.placement == "output":  # OLMo 2's reordered norm: x + Norm(Sublayer(x))
            return x + self.drop(self.norm(self.inner(x, **kwargs)))
        return x + self.branch(self.norm(x), **kwargs)

    def branch(self, normed: Tensor, **kwargs) -> Tensor:
        """The residual branch of a pre-norm or sandwich sub-layer on its already normalised input:
        Dropout(Sublayer(h)), or Dropout(Norm'(Sublayer(h)))."""
        out = self.inner(normed, **kwargs)
        if self.norm_out is not None:
            out = self.norm_out(out)
        return self.drop(out)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each a :class:`Residual` (Vaswani et al. 2017, sec. 3.1)."""

    def __init__(self, *, self_attn: Residual, ffn: Residual):
        super().__init__()
        self.self_attn = self_attn
        self.ffn = ffn

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """``x`` (b, n, d), ``mask`` broadcastable to (b, h, n, n) -> (b, n, d)."""
        return self.ffn(self.self_attn(x, mask=mask))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output (absent in decoder-only
    models), then feed-forward (Vaswani et al. 2017, sec. 3.1)."""

    def __init__(self, *, self_attn: Residual, cross_attn: Residual | None, ffn: Residual):
        super().__init__()
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: dict | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """``x`` (b, i, d), ``mask`` to (b, h, i, i), ``memory`` (b, j, d), ``memory_mask`` to
        (b, h, i, j) -> (b, i, d). ``cache`` holds this layer's keys and values while decoding;
        ``positions`` (b, i) are each row's own (left-padded prompts, see :func:`self_kwargs`)."""
        x = self.self_attn(
            x, mask=mask, cache=None if cache is None else cache.setdefault("self", {}), **self_kwargs(positions)
        )
        if self.cross_attn is not None:
            cross = None if cache is None else cache.setdefault("cross", {})
            x = self.cross_attn(x, context=memory, mask=memory_mask, cache=cross)
        return self.ffn(x)


class ParallelLayer(nn.Module):
    """Self-attention and feed-forward side by side on the same input (GPT-J; PaLM, Chowdhery et al.
    2022, arXiv:2204.02311, sec. 2): x + Attn(Norm(x)) + FFN(Norm(x)). With ``shared_norm`` the
    feed-forward reads the attention's normalised input (its own norm is then an identity); else it
    normalises ``x`` with its own. Pre-norm or sandwich residuals only (the norm comes first)."""

    def __init__(self, *, self_attn: Residual, ffn: Residual, shared_norm: bool):
        super().__init__()
        if {"post", "output"} & {self_attn.placement, ffn.placement}:
            raise ValueError("a parallel layer normalises before its branches: placement pre or sandwich")
        self.self_attn = self_attn
        self.ffn = ffn
        self.shared_norm = shared_norm

    def forward(
        self, x: Tensor, *, mask: Tensor | None = None, cache: dict | None = None, positions: Tensor | None = None
    ) -> Tensor:
        """``x`` (b, n, d), ``mask`` to (b, h, n, n) -> (b, n, d); ``cache`` holds this layer's keys
        and values while decoding (decoder-only models); ``positions`` (b, n) are each row's own."""
        normed = self.self_attn.norm(x)
        cached = None if cache is None else cache.setdefault("self", {})
        attn = self.self_attn.branch(normed, mask=mask, cache=cached, **self_kwargs(positions))
        return x + attn + self.ffn.branch(normed if self.shared_norm else self.ffn.norm(x))


class Stack(nn.Module):
    """``layers`` (alike, or differing per layer by a pattern), then an optional final norm (pre-norm needs one).
    ``positions``: the position modules that act in some layers' self-attention instead of the
    embedding's (a layer kind's own rotary base), owned here so that they move and save with the stack."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module | None, *, positions: Sequence[nn.Module] = ()):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.positions = nn.ModuleList(positions) if positions else None  # none: no row in `tfbuilder show`

    def forward(self, x: Tensor, *, cache: list[dict] | None = None, **kwargs) -> Tensor:
        """``x`` (b, n, d) -> (b, n, d); ``kwargs`` (masks, memory) go to every layer, and
        ``cache[i]`` to (decoder) layer i when decoding incrementally."""
        for i, layer in enumerate(self.layers):
            x = layer(x, **kwargs) if cache is None else layer(x, cache=cache[i], **kwargs)
        return x if self.final_norm is None else self.final_norm(x)
