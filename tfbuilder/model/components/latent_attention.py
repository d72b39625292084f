"""Multi-head latent attention (family ``attention``, type ``latent``): DeepSeek-V2's low-rank joint
key/value compression, whose KV cache holds one small latent per token instead of every head's keys
and values.

Shapes as in :mod:`tfbuilder.model.components`, and ``c`` the latent width (``kv_rank``), ``r`` the width of
the decoupled rotary part of queries and keys (``rope_dim``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field, model_validator
from torch import Tensor, nn

from tfbuilder import masks
from tfbuilder.contracts import AttentionBase, AttentionParams, AttentionShape, KVCache, default_head_dim
from tfbuilder.model.components.attention import MultiHeadAttention, init_projections
from tfbuilder.model.components.position import AttentionPosition, RotaryPosition
from tfbuilder.model.components.rotary_scaling import YarnRotaryScaling
from tfbuilder.registry import BuildContext, ModelDims, register


def yarn_score_scale(position: AttentionPosition | None) -> float:
    """What DeepSeek's attention multiplies its softmax scale by under YaRN rotary scaling:
    yarn_mscale(factor, mscale_all_dim)^2 (DeepSeek-V2/V3's released code; transformers'
    ``yarn_apply_mscale``), 1 otherwise. It makes up for the cos/sin factor
    yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) leaving the scores unscaled."""
    if isinstance(position, RotaryPosition) and isinstance(position.scaling, YarnRotaryScaling):
        return position.scaling.score_scale()
    return 1.0


@register("attention", "latent")
class LatentAttention(AttentionBase, nn.Module):
    """Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434, sec. 2.1).

    Keys and values are up-projected from one latent per token, ``c = W_DKV x`` (eq. 9-11); queries
    from ``W_UQ W_DQ x`` or, without ``q_rank``, ``W_Q x`` (eq. 12-13). Position enters through a
    decoupled part (eq. 14-18): ``r`` more query dimensions per head and ``r`` key dimensions shared
    by every head, computed from ``x`` and rotated by the stack's rotary position (unrotated when the
    stack's position is not rotary). Scores are ``[q_C; q_R] . [k_C; k_R] / sqrt(d_h + r)`` (times
    DeepSeek's yarn_mscale(factor, mscale_all_dim)^2 under a rotary ``scaling: {type: yarn}`` that sets
    ``mscale_all_dim``, see :func:`yarn_score_scale`), the output ``W_O`` of the heads' value mixtures
    (eq. 19). The latents are RMS-normalised, as in the released model. The cache keeps the latent
    and the rotated shared key: ``c + r`` numbers per token and layer, against ``2 h d_h`` for
    multi-head attention.

    Cross-attention compresses the source the same way, without the decoupled part (no positions
    act there).
    """

    keeps_weights = True

    class Params(AttentionParams):
        type: Literal["latent"] = "latent"
        heads: int = Field(8, ge=1, le=1024, description="number of heads h")
        head_dim: int | None = Field(
            None, ge=1, description="query/key width per head d_h, without the rotary part; default d_model / heads"
        )
        value_dim: int | None = Field(None, ge=1, description="value width per head; default head_dim")
        kv_rank: int | None = Field(
            None,
            ge=1,
            description="width d_c of the key/value latent kept in the cache; default 4 * head_dim (the paper's)",
        )
        q_rank: int | None = Field(
            None, ge=1, description="width d_c' of the query latent; default none: queries project from x directly"
        )
        rope_dim: int | None = Field(
            None,
            ge=0,
            description="decoupled rotary width r per head (even; 0: none); default head_dim / 2 (the paper's)",
        )
        latent_norm: bool = Field(True, description="RMS-normalise the latents (as DeepSeek-V2's released model does)")
        dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the attention weights")
        bias: bool = Field(False, description="learn biases in the projections")

        @model_validator(mode="after")
        def _even_rope(self) -> LatentAttention.Params:
            if self.rope_dim is not None and self.rope_dim % 2:
                raise ValueError(f"rope_dim ({self.rope_dim}) must be even: rotary positions turn pairs")
            return self

        def widths(self, d_model: int) -> tuple[int, int, int, int]:
            """(d_h, value width, d_c, r) with the defaults filled in."""
            d_h = self.head_dim or default_head_dim(d_model, self.heads)
            rope = self.rope_dim if self.rope_dim is not None else 2 * (d_h // 4)
            return d_h, self.value_dim or d_h, self.kv_rank or 4 * d_h, rope

        def shape(self, d_model: int) -> AttentionShape:
            # Scores span d_h + r per head; a rotary position turns only the last r of them (its
            # angles are computed for that width).
            d_h, _, _, rope = self.widths(d_model)
            return AttentionShape(self.heads, d_h + rope, rotary_dim=rope)

        def check(self, dims: ModelDims) -> list[tuple[str, str]]:
            if self.head_dim is None and dims.d_model < self.heads:
                return [("heads", f"d_model ({dims.d_model}) is narrower than heads ({self.heads}); set head_dim")]
            return []

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        d, h = ctx.d_model, params.heads
        d_h, d_v, d_c, rope = params.widths(d)
        self.cross = ctx.cross
        self.causal = ctx.causal
        self.heads, self.head_dim, self.value_dim, self.kv_rank = h, d_h, d_v, d_c
        self.rope_dim = 0 if ctx.cross else rope
        self.key_dim = d_h + self.rope_dim
        self.dropout = params.dropout
        position = None if ctx.cross else ctx.position
        self._position: tuple[AttentionPosition, ...] = () if position is None else (position,)
        self.rotates = position is not None and position.rotates
        self.scale = 1.0 / math.sqrt(self.key_dim) * yarn_score_scale(position)
        self.biased = position is not None and position.biases
        self.keep_weights = False
        self.weights = None
        q_width = h * self.key_dim
        self.to_q_latent: nn.Linear | None
        self.norm_q: nn.Module
        if params.q_rank:
            self.to_q_latent = nn.Linear(d, params.q_rank, bias=params.bias)
            self.norm_q = nn.RMSNorm(params.q_rank, eps=1e-6) if params.latent_norm else nn.Identity()
            self.to_q = nn.Linear(params.q_rank, q_width, bias=params.bias)
        else:
            self.to_q_latent, self.norm_q = None, nn.Identity()
            self.to_q = nn.Linear(d, q_width, bias=params.bias)
        self.to_kv_latent = nn.Linear(d, d_c + self.rope_dim, bias=params.bias)  # [c; k_R] (eq. 9, 17)
        self.norm_kv = nn.RMSNorm(d_c, eps=1e-6) if params.latent_norm else nn.Identity()
        self.to_kv = nn.Linear(d_c, h * (d_h + d_v), bias=params.bias)  # [W_UK; W_UV] (eq. 10, 11)
        self.to_out = nn.Linear(h * d_v, d, bias=params.bias)
        self.reset_parameters()

    def output_projections(self) -> list[nn.Linear]:
        """The projection that ends the residual branch: ``to_out``."""
        return [self.to_out]

    def fused_widths(self) -> dict[str, list[int]]:
        """The latent beside the shared rotary key; every head's keys beside the values."""
        h = self.heads
        return {"to_kv_latent": [self.kv_rank, self.rope_dim], "to_kv": [h * self.head_dim, h * self.value_dim]}

    def cache_per_token(self) -> int:
        """Numbers the KV cache keeps per token: the latent and the shared rotary key."""
        return self.kv_rank + self.rope_dim

    @property
    def position(self) -> AttentionPosition | None:
        """The position acting inside this attention (its rotary turns the decoupled part), or None."""
        return self._position[0] if self._position else None

    def reset_parameters(self) -> None:
        init_projections(self)  # the norms' gains stay 1

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        """``x`` (b, i, d), ``context`` (b, j, d) for cross-attention, ``mask`` bool broadcastable to
        (b, h, i, j), True where a query may attend; returns (b, i, d). ``cache``: self-attention
        appends this call's latents; cross-attention compresses the source once."""
        source = context if self.cross else x
        if self.cross and source is None and not (cache and "latent" in cache):
            raise ValueError("cross-attention needs a context")
        offset = cache["latent"].shape[1] if cache and "latent" in cache and not self.cross else 0
        q = rearrange(self.to_q(self.norm_q(self._q_latent(x))), "b i (h k) -> b h i k", h=self.heads)
        latent, k_rope = self._latents(source, cache, offset)
        k, v = rearrange(self.to_kv(latent), "b j (h k) -> b h j k", h=self.heads).split(
            [self.head_dim, self.value_dim], -1
        )
        if k_rope is not None:  # a decoupled rotary part (self-attention with rope_dim)
            q_c, q_r = q.split([self.head_dim, self.rope_dim], dim=-1)
            position = self.position
            q = torch.cat([q_c, position.rotate(q_r, offset) if self.rotates and position else q_r], dim=-1)
            k = torch.cat([k, k_rope.expand(-1, self.heads, -1, -1)], dim=-1)
        if k.shape[0] != q.shape[0]:  # consecutive query rows (the beams of one input) share a source
            group = MultiHeadAttention._group(q.shape[0], k.shape[0], mask)
            k, v = (t.repeat_interleave(group, dim=0) for t in (k, v))
            mask = mask.repeat_interleave(group, dim=0) if mask is not None and mask.shape[0] > 1 else mask
        out = self._attend(q, k, v, mask, offset)
        return self.to_out(rearrange(out, "b h i v -> b i (h v)"))

    def _q_latent(self, x: Tensor) -> Tensor:
        return x if self.to_q_latent is None else self.to_q_latent(x)

    def _latents(self, source: Tensor | None, cache: KVCache | None, offset: int) -> tuple[Tensor, Tensor | None]:
        """The latents (b, j, c) of every key so far, and the shared rotary keys (b, 1, j, r), rotated
        (None without a decoupled part); this call's appended to the cache's."""
        if self.cross and cache and "latent" in cache:
            return cache["latent"], None
        latent, k_rope = self.to_kv_latent(source).split([self.kv_rank, self.rope_dim], dim=-1)
        latent = self.norm_kv(latent)
        k_rope = rearrange(k_rope, "b j r -> b 1 j r")
        position = self.position
        if self.rotates and self.rope_dim and position is not None:
            k_rope = position.rotate(k_rope, offset)
        if cache is not None:
            if "latent" in cache and not self.cross:
                latent = torch.cat([cache["latent"], latent], dim=1)
                k_rope = torch.cat([cache["k_rope"], k_rope], dim=2)
            cache["latent"], cache["k_rope"] = latent, k_rope
        return latent, (k_rope if self.rope_dim else None)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, offset: int) -> Tensor:
        """softmax(q k^T / sqrt(d_h + r) + bias, masked) v: (b, h, i, k), (b, h, j, k) -> (b, h, i, v)."""
        n_q, n_k = q.shape[2], k.shape[2]
        is_causal = False
        if self.causal and not self.cross and n_q > 1:
            if mask is None and offset == 0 and n_q == n_k and not self.biased and not self.keep_weights:
                is_causal = True
            else:
                mask = masks.combine(mask, masks.causal_mask(n_q, n_k, offset=offset, device=q.device))
        position = self.position
        if self.biased and position is not None:
            bias = position.bias(n_q, n_k, offset, self.heads).to(q.dtype)
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        if self.keep_weights:
            scores = (q @ k.transpose(-2, -1)) * self.scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
            self.weights = scores.softmax(dim=-1).detach()
            return self.weights @ v
        dropout = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, scale=self.scale
        )
