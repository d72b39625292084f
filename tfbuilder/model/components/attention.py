"""Attention components (family ``attention``)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field
from torch import Tensor, nn

from tfbuilder import masks
from tfbuilder.contracts import AttentionBase, AttentionParams, AttentionShape, KVCache, default_head_dim
from tfbuilder.model.components.position import AttentionPosition
from tfbuilder.registry import BuildContext, ModelDims, StackShared, register

Lambda = Annotated[float, Field(ge=-100.0, le=100.0)]


def init_projections(module: nn.Module) -> None:
    """Xavier-uniform on every projection of an attention, zero biases: what nn.MultiheadAttention does."""
    for linear in module.modules():
        if isinstance(linear, nn.Linear):
            nn.init.xavier_uniform_(linear.weight)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)


class MultiHeadParams(AttentionParams):
    """The fields of multi-head attention, shared by its variants (each names its own ``type``)."""

    heads: int = Field(8, ge=1, le=1024, description="number of query heads h")
    kv_heads: int | None = Field(
        None, ge=1, description="key/value heads (grouped-query; 1 = multi-query); default heads"
    )
    key_dim: int | None = Field(None, ge=1, description="query/key width per head d_k; default d_model / heads")
    value_dim: int | None = Field(None, ge=1, description="value width per head d_v; default d_model / heads")
    window: int | None = Field(
        None,
        ge=1,
        description="sliding-window self-attention: attend to keys at most window-1 positions away; default all",
    )
    qk_norm: Literal[False, True, "l2", "rms"] = Field(
        False,
        description="normalise queries and keys per head: l2 (or true): cosine similarity times one learned "
        "temperature (Henry et al. 2020); rms: an RMSNorm over the head's channels with a learned gain per channel, "
        "before the positions rotate them (Qwen3, Gemma 3, OLMo 2's per-head form)",
    )
    qk_norm_eps: float = Field(1e-6, gt=0.0, lt=1.0, description="epsilon of qk_norm: rms")
    qk_norm_over: Literal["head", "all"] = Field(
        "head",
        description="qk_norm rms: over each head's channels, a gain per channel shared by the heads (Qwen3, "
        "Gemma 3), or over all heads' channels at once, a gain per channel of the whole projection (OLMo 2, "
        "arXiv:2501.00656)",
    )
    gate: Literal["none", "elementwise", "headwise"] = Field(
        "none",
        description="gated attention (Qiu et al. 2025, arXiv:2505.06708, G1): "
        "each head's output times sigmoid(x W), x the attention's input; elementwise: one gate per value channel, "
        "headwise: one per head",
    )
    value_residual: Literal["none", "fixed", "learnable"] = Field(
        "none",
        description="value residual learning (ResFormer, Zhou et al. 2024, arXiv:2410.17897): "
        "self-attention layers after the first use lambda1 * V_1 + lambda2 * V_n as values, V_1 the first layer's; "
        "fixed or learnable lambdas",
    )
    value_lambdas: tuple[Lambda, Lambda] = Field(
        (0.5, 0.5),
        strict=False,
        description="value residual: (lambda1, lambda2), the weights of V_1 and of the layer's own values "
        "(learnable: their initial values); the paper's Identity-ResFormer: 0.5, 0.5",
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the attention weights")
    bias: bool | Literal["qkv"] = Field(
        True,
        description="learn biases in the input and output projections; qkv: in the query, key and value "
        "projections only (Qwen2)",
    )
    scale: float | None = Field(
        None, gt=0.0, description="multiplies q.k before the softmax; default 1/sqrt(d_k) (sec. 3.2.1); T5 uses 1"
    )
    softcap: float | None = Field(
        None,
        gt=0.0,
        le=1e4,
        description="soft-cap the scaled scores to softcap * tanh(scores / softcap) before the mask and the "
        "softmax (Gemma 2: 50); default none",
    )

    @property
    def qk_form(self) -> Literal["l2", "rms"] | None:
        """The query/key normalisation: None, ``l2`` (``qk_norm: true`` too) or ``rms``."""
        if self.qk_norm is False:
            return None
        return "rms" if self.qk_norm == "rms" else "l2"

    def shape(self, d_model: int) -> AttentionShape:
        return AttentionShape(self.heads, self.key_dim or default_head_dim(d_model, self.heads))

    def check(self, dims: ModelDims) -> list[tuple[str, str]]:
        problems = []
        if self.scale is not None and self.qk_form == "l2":
            problems.append(("scale", "qk_norm learns its own scale; remove scale or qk_norm"))
        if self.qk_norm_over == "all" and self.qk_form != "rms":
            problems.append(("qk_norm_over", "all normalises with an RMS norm: set qk_norm: rms"))
        if dims.d_model % self.heads and (self.key_dim is None or self.value_dim is None):
            unset = " and ".join(n for n, v in (("key_dim", self.key_dim), ("value_dim", self.value_dim)) if v is None)
            problems.append(
                ("heads", f"d_model ({dims.d_model}) must be divisible by heads ({self.heads}), or set {unset}")
            )
        if self.kv_heads is not None and self.heads % self.kv_heads:
            problems.append(("kv_heads", f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})"))
        return problems


@register("attention", "multihead")
class MultiHeadAttention(AttentionBase, nn.Module):
    """Scaled dot-product multi-head attention (Vaswani et al. 2017, arXiv:1706.03762, sec. 3.2), with
    grouped-query and multi-query attention (``kv_heads``; Ainslie et al. 2023, arXiv:2305.13245;
    Shazeer 2019, arXiv:1911.02150), sliding-window attention (``window``; Beltagy et al. 2020,
    arXiv:2004.05150), query/key normalisation (``qk_norm``; Henry et al. 2020, arXiv:2010.04245),
    score soft-capping (``softcap``; Gemma 2, Gemma Team 2024, arXiv:2408.00118), output gating
    (``gate``; Qiu et al. 2025, "Gated Attention for Large Language Models", arXiv:2505.06708) and
    value residual learning (``value_residual``; Zhou et al. 2024, ResFormer, arXiv:2410.17897).

    Self-attention projects queries, keys and values with one fused matrix; cross-attention
    (``ctx.cross``) projects queries from ``x`` and keys/values, fused, from ``context``. Positions that
    act inside attention (rotary, ALiBi, relative bias) are applied in self-attention.
    """

    keeps_weights = True  # keep_weights = True: the next forward keeps its weights in `weights`

    class Params(MultiHeadParams):
        type: Literal["multihead"] = "multihead"

    def __init__(self, params: MultiHeadParams, ctx: BuildContext):
        super().__init__()
        d, h = ctx.d_model, params.heads
        self.heads = h
        self.kv_heads = params.kv_heads or h
        self.key_dim = params.shape(d).key_dim
        self.value_dim = params.value_dim or default_head_dim(d, h)
        self.dropout = params.dropout
        self.cross = ctx.cross
        self.causal = ctx.causal
        self.window = params.window
        self.scale = params.scale if params.scale is not None else 1.0 / math.sqrt(self.key_dim)
        self.softcap = params.softcap
        # A position acting inside self-attention (see AttentionPosition). The embedding owns it: held in
        # a tuple, it is not registered again under every layer (nor saved once per layer).
        position = None if ctx.cross else ctx.position
        self._position: tuple[AttentionPosition, ...] = () if position is None else (position,)
        self.rotates = position is not None and position.rotates
        self.biased = position is not None and position.biases
        self.keep_weights = False  # set True to keep the last attention weights in `weights` (inspection)
        self.weights = None
        q, k, v = h * self.key_dim, self.kv_heads * self.key_dim, self.kv_heads * self.value_dim
        self.split = (q, k, v)
        if self.cross:
            self.to_q = nn.Linear(d, q, bias=bool(params.bias))
            self.to_kv = nn.Linear(d, k + v, bias=bool(params.bias))
        else:
            self.to_qkv = nn.Linear(d, q + k + v, bias=bool(params.bias))
        self.to_out = nn.Linear(h * self.value_dim, d, bias=params.bias is True)
        # Gated attention: the paper's Y' = Y * sigmoid(X W_theta), without a bias; one gate per value
        # channel of each head (elementwise) or one per head (headwise).
        self.gate = params.gate
        gates = {"none": 0, "elementwise": h * self.value_dim, "headwise": h}[params.gate]
        self.to_gate = nn.Linear(d, gates, bias=False) if gates else None
        # Value residual learning: the stack's first self-attention layer hands its values to the others
        # through the stack's shared scratch (held in a tuple: not a module); layers after it mix them in.
        shared = ctx.shared if params.value_residual != "none" and not ctx.cross else None
        self._shared: tuple[StackShared, ...] = () if shared is None else (shared,)
        self.layer, self.last_layer = ctx.layer, ctx.layer == ctx.num_layers - 1
        self.value_lambdas: nn.Parameter | tuple[float, float] | None = None
        if self._shared and ctx.layer > 0:
            first, own = params.value_lambdas
            lambdas = (float(first), float(own))
            self.value_lambdas = (
                nn.Parameter(torch.tensor(lambdas)) if params.value_residual == "learnable" else lambdas
            )
        # qk_norm l2: cosine similarity times a learned temperature, initialised to sqrt(d_k); rms: an
        # RMSNorm with a gain per channel over each head's queries and keys (shared by the heads).
        form = params.qk_form
        self.qk_scale = nn.Parameter(torch.tensor(math.sqrt(self.key_dim))) if form == "l2" else None
        self.q_norm: nn.RMSNorm | None = None
        self.k_norm: nn.RMSNorm | None = None
        self.qk_norm_all = params.qk_norm_over == "all"
        if form == "rms":
            q_width, k_width = (h, self.kv_heads) if self.qk_norm_all else (1, 1)
            self.q_norm = nn.RMSNorm(q_width * self.key_dim, eps=params.qk_norm_eps)
            self.k_norm = nn.RMSNorm(k_width * self.key_dim, eps=params.qk_norm_eps)
        self.reset_parameters()

    def output_projections(self) -> list[nn.Linear]:
        """The projection that ends the residual branch: ``to_out``."""
        return [self.to_out]

    def fused_widths(self) -> dict[str, list[int]]:
        """Queries, keys and values in one matrix (self-attention), keys and values (cross-attention)."""
        q, k, v = self.split
        return {"to_kv": [k, v]} if self.cross else {"to_qkv": [q, k, v]}

    def cache_per_token(self) -> int:
        """Keys and values of every key/value head: kv_heads * (d_k + d_v) numbers per token."""
        return self.kv_heads * (self.key_dim + self.value_dim)

    @property
    def position(self) -> AttentionPosition | None:
        """The position acting inside this attention (rotating queries and keys, biasing scores), or None."""
        return self._position[0] if self._position else None

    def reset_parameters(self) -> None:
        init_projections(self)

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """``x`` (b, i, d), ``context`` (b, j, d) for cross-attention, ``mask`` bool broadcastable
        to (b, h, i, j) with True where a query may attend; returns (b, i, d). Causal self-attention
        (``ctx.causal``) applies its own look-ahead: callers pass key masks only. ``positions`` (b, i),
        each row's own (left-padded prompts), are what a rotary position turns queries and keys by.

        ``cache`` (incremental decoding): self-attention appends this call's keys and values to it;
        cross-attention computes the context's keys and values once and reuses them."""
        if self.cross:
            q, k, v, group = self._cross_qkv(x, context, mask, cache)
            out = self._attend(q, k, v, mask, offset=0)
            if group > 1:
                out = rearrange(out, "b h (g i) v -> (b g) h i v", g=group)
        else:
            q, k, v, offset = self._self_qkv(x, cache, positions)
            out = self._attend(q, k, v, mask, offset=offset)
        if self.to_gate is not None:
            out = self._gated(out, x, self.to_gate)
        return self.to_out(rearrange(out, "b h i v -> b i (h v)"))

    def _gated(self, out: Tensor, x: Tensor, to_gate: nn.Linear) -> Tensor:
        """Each head's output (b, h, i, v) times sigmoid(x W_theta), query-dependent: from this layer's
        input ``x`` (b, i, d), per value channel (elementwise) or per head (headwise)."""
        scores = to_gate(x)
        if self.gate == "headwise":
            return out * rearrange(scores, "b i h -> b h i 1").sigmoid()
        return out * rearrange(scores, "b i (h v) -> b h i v", h=out.shape[1]).sigmoid()

    def _self_qkv(
        self, x: Tensor, cache: KVCache | None, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, int]:
        """Queries, keys and values of self-attention (b, h, n, k), with the cached keys and values
        before this call's; and ``offset``, the position of this call's first token."""
        q, k, v = self.to_qkv(x).split(list(self.split), dim=-1)
        q = rearrange(q, "b i (h k) -> b h i k", h=self.heads)
        k, v = self._heads_kv((k, v))
        q, k = self._rms_qk(q, k)
        if self._shared:
            v = self._value_residual(v)
        offset = cache["k"].shape[2] if cache is not None and "k" in cache else 0
        position = self.position
        if self.rotates and position is not None:
            # keys are cached rotated
            q, k = position.rotate(q, offset, positions), position.rotate(k, offset, positions)
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        return q, k, v, offset

    def _value_residual(self, v: Tensor) -> Tensor:
        """ResFormer (Zhou et al. 2024, arXiv:2410.17897): the first layer keeps its values V_1
        (b, h_kv, n, v) for the others, which attend over lambda1 * V_1 + lambda2 * V_n. Values of this
        call's tokens only: cached values are stored mixed, so decoding with a cache mixes the same."""
        shared = self._shared[0]
        if self.layer == 0:
            shared.first_values = v
            return v
        first = shared.first_values
        if first is None:
            raise RuntimeError("value residual: the stack's first layer did not run before this one")
        if self.last_layer:
            shared.first_values = None  # not kept alive between forwards
        lambdas = self.value_lambdas
        if lambdas is None:
            raise RuntimeError("value residual: a layer after the first needs its value_lambdas")
        return lambdas[0] * first + lambdas[1] * v

    def _cross_qkv(
        self, x: Tensor, context: Tensor | None, mask: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor, int]:
        """Queries from ``x``, keys and values from ``context`` (computed once per source when
        caching); and the number of consecutive query rows that share one source."""
        _, k_width, v_width = self.split
        if cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            if context is None:
                raise ValueError("cross-attention needs a context")
            k, v = self._heads_kv(self.to_kv(context).split([k_width, v_width], dim=-1))
            if self.k_norm is not None:
                k = self._normed(self.k_norm, k)
            if cache is not None:
                cache["k"], cache["v"] = k, v
        q = rearrange(self.to_q(x), "b i (h k) -> b h i k", h=self.heads)
        if self.q_norm is not None:
            q = self._normed(self.q_norm, q)
        group = 1
        if q.shape[0] != k.shape[0]:
            # `group` consecutive query rows share one source (the beams of beam search): their
            # queries attend side by side, so the source's keys and values are neither copied
            # per beam nor reordered as the beams move.
            group = self._group(q.shape[0], k.shape[0], mask)
            q = rearrange(q, "(b g) h i k -> b h (g i) k", g=group)
        return q, k, v, group

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, offset: int) -> Tensor:
        """softmax(q k^T / sqrt(d_k) + bias, masked) v for (b, h, i, k) queries and (b, h_kv, j, k)
        keys and values -> (b, h, i, v)."""
        attn_mask, is_causal = self._scores_mask(q, k.shape[2], mask, offset=offset)
        q, k, scale = self._scaled_qk(q, k)
        k, v = self._expand_kv(k), self._expand_kv(v)
        if self.keep_weights or self.softcap is not None:  # the fused kernel has no soft-cap
            return self._explicit(q, k, v, attn_mask, scale)
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
            scale=scale,
        )

    def _scores_mask(self, q: Tensor, n_k: int, mask: Tensor | None, *, offset: int) -> tuple[Tensor | None, bool]:
        """What restricts the scores of ``q`` against ``n_k`` keys: the caller's key mask, the
        look-ahead, the window, and a position's score bias (additive: the boolean mask joins it as
        -inf). Returns the mask for the kernel, and whether the kernel applies the look-ahead itself
        (``is_causal``: the plain causal case needs no mask tensor, and GPUs pick their fastest kernel)."""
        n_q = q.shape[2]
        is_causal = False
        if self.causal and not self.cross and n_q > 1:  # one new query may see every key so far
            plain = mask is None and offset == 0 and n_q == n_k
            if plain and self.window is None and not self.biased and not self.keep_weights and self.softcap is None:
                is_causal = True
            else:
                mask = masks.combine(mask, masks.causal_mask(n_q, n_k, offset=offset, device=q.device))
        if self.window is not None and not self.cross:
            mask = masks.combine(
                mask, masks.window_mask(n_q, n_k, self.window, offset=offset, causal=self.causal, device=q.device)
            )
        position = self.position
        if not self.biased or position is None:
            return mask, is_causal
        bias = position.bias(n_q, n_k, offset, self.heads).to(q.dtype)
        return (bias if mask is None else bias.masked_fill(~mask, float("-inf"))), is_causal

    def _rms_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """qk_norm rms: each head's queries and keys (b, h, n, k) through their RMSNorm, gain per channel
        (Qwen3's q_norm and k_norm), before positions rotate them and keys are cached."""
        if self.q_norm is None or self.k_norm is None:
            return q, k
        return self._normed(self.q_norm, q), self._normed(self.k_norm, k)

    def _normed(self, norm: nn.RMSNorm, x: Tensor) -> Tensor:
        """Queries or keys (b, h, n, k) through ``norm``: per head, or (``qk_norm_over: all``, OLMo 2's
        q_norm and k_norm) over the heads' channels together, as the projection made them."""
        if not self.qk_norm_all:
            return norm(x)
        return rearrange(norm(rearrange(x, "b h n k -> b n (h k)")), "b n (h k) -> b h n k", h=x.shape[1])

    def _scaled_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float]:
        """Queries, keys and the factor on their dot products: 1/sqrt(d_k) (or ``scale``); with
        qk_norm, cosine similarity times the learned temperature, folded into the queries so that the
        fused kernel still runs (and the temperature gets its gradient through q)."""
        if self.qk_scale is None:
            return q, k, self.scale
        return F.normalize(q, dim=-1) * self.qk_scale.to(q.dtype), F.normalize(k, dim=-1), 1.0

    def _expand_kv(self, x: Tensor) -> Tensor:
        """Keys or values (b, h_kv, j, .) -> (b, h, j, .): with grouped queries each key/value head
        serves heads / kv_heads consecutive query heads."""
        if self.kv_heads == self.heads:
            return x
        return x.repeat_interleave(self.heads // self.kv_heads, dim=1)

    @staticmethod
    def _group(queries: int, sources: int, mask: Tensor | None) -> int:
        group, rest = divmod(queries, sources)
        if rest or (mask is not None and (mask.shape[0] not in (1, sources) or mask.shape[-2] != 1)):
            raise ValueError(f"cross-attention: {queries} query rows do not group over {sources} sources")
        return group

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, scale: float) -> Tensor:
        """softmax(q k^T * scale + bias) v written out, so that the weights can be kept (and the scores
        soft-capped, Gemma 2: softcap * tanh(scores / softcap), before bias and mask). Equal to the
        fused kernel's output (tested)."""
        scores = (q @ k.transpose(-2, -1)) * scale
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        if attn_mask is not None:
            scores = (
                scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
            )
        weights = scores.softmax(dim=-1)
        if self.keep_weights:
            self.weights = weights.detach()
        if self.training and self.dropout:
            weights = F.dropout(weights, self.dropout)
        return weights @ v

    def _heads_kv(self, kv: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        k, v = kv
        return rearrange(k, "b j (h k) -> b h j k", h=self.kv_heads), rearrange(
            v, "b j (h v) -> b h j v", h=self.kv_heads
        )

