"""Attention components (family ``attention``)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field
from torch import Tensor, nn

from ..registry import BuildContext, ComponentParams, ModelDims, register


@register("attention", "multihead")
class MultiHeadAttention(nn.Module):
    """Scaled dot-product multi-head attention (Vaswani et al. 2017, arXiv:1706.03762, sec. 3.2).

    Self-attention projects queries, keys and values with one fused matrix; cross-attention
    (``ctx.cross``) projects queries from ``x`` and keys/values, fused, from ``context``.
    """

    class Params(ComponentParams):
        type: Literal["multihead"] = "multihead"
        heads: int = Field(8, ge=1, le=1024, description="number of attention heads h")
        key_dim: int | None = Field(
            None, ge=1, description="query/key width per head d_k; default d_model / heads"
        )
        value_dim: int | None = Field(
            None, ge=1, description="value width per head d_v; default d_model / heads"
        )
        dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the attention weights")
        bias: bool = Field(True, description="learn biases in the input and output projections")

        def check(self, dims: ModelDims) -> list[tuple[str, str]]:
            if dims.d_model % self.heads and (self.key_dim is None or self.value_dim is None):
                unset = " and ".join(n for n in ("key_dim", "value_dim") if getattr(self, n) is None)
                return [
                    (
                        "heads",
                        f"d_model ({dims.d_model}) must be divisible by heads ({self.heads}), or set {unset}",
                    )
                ]
            return []

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        d, h = ctx.d_model, params.heads
        self.heads = h
        self.key_dim = params.key_dim or d // h
        self.value_dim = params.value_dim or d // h
        self.dropout = params.dropout
        self.cross = ctx.cross
        qk, v = h * self.key_dim, h * self.value_dim
        if self.cross:
            self.to_q = nn.Linear(d, qk, bias=params.bias)
            self.to_kv = nn.Linear(d, qk + v, bias=params.bias)
        else:
            self.to_qkv = nn.Linear(d, 2 * qk + v, bias=params.bias)
        self.to_out = nn.Linear(v, d, bias=params.bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Xavier-uniform on each projection, zero biases: what nn.MultiheadAttention does.
        for linear in self.modules():
            if isinstance(linear, nn.Linear):
                nn.init.xavier_uniform_(linear.weight)
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, mask: Tensor | None = None, cache: dict | None = None
    ) -> Tensor:
        """``x`` (b, i, d), ``context`` (b, j, d) for cross-attention, ``mask`` bool broadcastable
        to (b, h, i, j) with True where a query may attend; returns (b, i, d).

        ``cache`` (incremental decoding): self-attention appends this call's keys and values to it;
        cross-attention computes the context's keys and values once and reuses them."""
        h = self.heads
        if self.cross:
            q = self.to_q(x)
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                if context is None:
                    raise ValueError("cross-attention needs a context")
                k, v = self._heads_kv(self.to_kv(context).split([h * self.key_dim, h * self.value_dim], dim=-1))
                if cache is not None:
                    cache["k"], cache["v"] = k, v
        else:
            q, k, v = self.to_qkv(x).split([h * self.key_dim, h * self.key_dim, h * self.value_dim], dim=-1)
            k, v = self._heads_kv((k, v))
            if cache is not None:
                if "k" in cache:
                    k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        q = rearrange(q, "b i (h k) -> b h i k", h=h)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            scale=1.0 / math.sqrt(self.key_dim),
        )
        return self.to_out(rearrange(out, "b h i v -> b i (h v)"))

    def _heads_kv(self, kv: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        k, v = kv
        return rearrange(k, "b j (h k) -> b h j k", h=self.heads), rearrange(v, "b j (h v) -> b h j v", h=self.heads)
