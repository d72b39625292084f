"""Differential attention (family ``attention``, type ``differential``): two softmax maps per head,
subtracted (Ye et al. 2025, arXiv:2410.05258)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field
from torch import Tensor, nn

from tfbuilder.contracts import AttentionShape, default_head_dim
from tfbuilder.model.components.attention import MultiHeadAttention, MultiHeadParams
from tfbuilder.registry import BuildContext, ModelDims, register


def lambda_init(layer: int) -> float:
    """Differential attention's lambda_init = 0.8 - 0.6 * exp(-0.3 * (l - 1)) for layer l = 1, 2, ...
    (Ye et al. 2025, arXiv:2410.05258, sec. 2.1); ``layer`` counts from 0 (= l - 1)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


@register("attention", "differential")
class DifferentialAttention(MultiHeadAttention):
    """Differential attention (Ye et al. 2025, "Differential Transformer", ICLR 2025, arXiv:2410.05258):
    each head's weights are the difference of two softmax maps, (softmax(Q1 K1^T / sqrt(d)) -
    lambda softmax(Q2 K2^T / sqrt(d))) V, with lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
    then a per-head RMSNorm and the factor (1 - lambda_init).

    A head's queries and keys are split into two halves of width d (``key_dim``), its values are 2d
    wide (``value_dim``): with ``heads`` h the projections have the shapes of multi-head attention with
    2h heads. The 2h softmax maps run as 2h heads of the fused kernel (``heads`` on the module is 2h:
    positions inside attention, rotary over d, and kept weights are per map); grouped-query values
    serve heads / kv_heads consecutive heads.

    Grouped-query keys (``kv_layout``), where the authors' implementations (microsoft/unilm,
    Diff-Transformer) differ once kv_heads < heads: ``pairs`` (the default) gives head i the key pair
    (2g, 2g+1) of its group g = i // (heads / kv_heads), one key per map, as their FlashAttention
    versions ``multihead_flashdiff_1.py`` and ``multihead_flashdiff_2.py`` do (both maps attend with
    flash_attn's own grouping); ``repeat`` is their plain version ``multihead_diffattn.py``, which
    repeats the 2 kv_heads key maps heads / kv_heads times each (``repeat_kv``), so that map m of the 2h
    maps reads key map m // (heads / kv_heads): with an even ratio both maps of a head read one key.
    """

    class Params(MultiHeadParams):
        type: Literal["differential"] = "differential"
        heads: int = Field(8, ge=1, le=512, description="number of differential heads h (each with two softmax maps)")
        kv_heads: int | None = Field(
            None, ge=1, description="key/value heads (grouped-query; 1 = multi-query); default heads"
        )
        key_dim: int | None = Field(
            None, ge=1, description="width d of each of a head's two queries and keys; default d_model / heads / 2"
        )
        value_dim: int | None = Field(
            None, ge=2, description="value width per head, 2d in the paper (even); default d_model / heads"
        )
        bias: bool = Field(False, description="learn biases in the input and output projections (the paper: none)")
        norm_eps: float = Field(1e-5, gt=0.0, lt=1.0, description="epsilon of the per-head RMSNorm")
        kv_layout: Literal["pairs", "repeat"] = Field(
            "pairs",
            description="which key each softmax map reads when kv_heads < heads: pairs, the key pair of the head's "
            "group, one per map (the authors' FlashAttention code, multihead_flashdiff_*.py); repeat, key map "
            "m // (heads / kv_heads) for map m of the 2 heads maps (their plain multihead_diffattn.py's repeat_kv "
            "over the 2 kv_heads key maps: both maps of a head read one key when the ratio is even)",
        )

        def shape(self, d_model: int) -> AttentionShape:
            # Two softmax maps per head, each over queries and keys of width d: what positions act on.
            return AttentionShape(2 * self.heads, self.key_dim or default_head_dim(d_model, 2 * self.heads))

        def check(self, dims: ModelDims) -> list[tuple[str, str]]:
            problems = []
            if self.scale is not None and self.qk_form == "l2":
                problems.append(("scale", "qk_norm learns its own scale; remove scale or qk_norm"))
            if self.qk_form == "rms" or self.qk_norm_over == "all":
                problems.append(("qk_norm", "differential attention takes qk_norm l2 (true), not rms"))
            if self.key_dim is None and dims.d_model % (2 * self.heads):
                problems.append(
                    (
                        "heads",
                        f"d_model ({dims.d_model}) must be divisible by 2 * heads ({2 * self.heads}), or set key_dim",
                    )
                )
            if self.value_dim is None and dims.d_model % self.heads:
                problems.append(
                    ("heads", f"d_model ({dims.d_model}) must be divisible by heads ({self.heads}), or set value_dim")
                )
            if self.value_dim is not None and self.value_dim % 2:
                problems.append(
                    ("value_dim", f"value_dim ({self.value_dim}) must be even (2d: two halves of a head's values)")
                )
            if self.kv_heads is not None and self.heads % self.kv_heads:
                problems.append(("kv_heads", f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})"))
            return problems

    def __init__(self, params: Params, ctx: BuildContext):
        h, d = params.heads, params.shape(ctx.d_model).key_dim
        value_dim = params.value_dim or default_head_dim(ctx.d_model, h)
        kv_heads = params.kv_heads or h
        # The projections of multi-head attention with 2h heads of width d and values of width value_dim / 2.
        maps = params.model_copy(
            update={"heads": 2 * h, "kv_heads": 2 * kv_heads, "key_dim": d, "value_dim": value_dim // 2}
        )
        super().__init__(maps, ctx)
        self.diff_heads, self.diff_kv_heads, self.kv_layout = h, kv_heads, params.kv_layout
        if params.gate == "headwise":  # one gate per differential head
            self.to_gate = nn.Linear(ctx.d_model, h, bias=False)
        self.lambda_init = lambda_init(ctx.layer)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.empty(d)) for _ in range(4)
        )
        self.head_norm = nn.RMSNorm(value_dim, eps=params.norm_eps)  # per head ("GroupNorm"), shared gain
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "lambda_q1"):
            for lam in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
                nn.init.normal_(lam, mean=0.0, std=0.1)
            self.head_norm.reset_parameters()

    def lam(self) -> Tensor:
        """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init (sec. 2.1), a scalar per layer."""
        q1k1 = torch.dot(self.lambda_q1, self.lambda_k1)
        q2k2 = torch.dot(self.lambda_q2, self.lambda_k2)
        return torch.exp(q1k1) - torch.exp(q2k2) + self.lambda_init

    def _expand_keys(self, k: Tensor, group: int) -> Tensor:
        """Keys (b, 2h_kv, j, d) -> (b, 2h, j, d), one per softmax map, in ``kv_layout``: ``pairs``, the
        pair (2g, 2g+1) of head i's group g = i // group for its two maps; ``repeat``, key map m // group
        for map m (multihead_diffattn.py's repeat_kv)."""
        if self.kv_layout == "repeat":
            return k.repeat_interleave(group, dim=1)
        k = rearrange(k, "b (g two) j d -> b g two j d", two=2).repeat_interleave(group, dim=1)
        return rearrange(k, "b h two j d -> b (h two) j d")

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, offset: int) -> Tensor:
        """Queries (b, 2h, i, d), keys (b, 2h_kv, j, d) and values (b, 2h_kv, j, v/2) -> (b, h, i, v):
        the two maps of each head attend over its group's whole values; their outputs are subtracted,
        normalised per head and scaled by (1 - lambda_init)."""
        attn_mask, is_causal = self._scores_mask(q, k.shape[2], mask, offset=offset)
        q, k, scale = self._scaled_qk(q, k)
        group = self.diff_heads // self.diff_kv_heads
        k = self._expand_keys(k, group)
        v = rearrange(v, "b (g two) j v -> b g j (two v)", two=2).repeat_interleave(group, dim=1)
        v = v.repeat_interleave(2, dim=1)  # both maps of a head read its whole values
        if self.keep_weights or self.softcap is not None:
            out = self._explicit(q, k, v, attn_mask, scale)
        else:
            dropout = self.dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal, scale=scale
            )
        first, second = rearrange(out, "b (h two) i v -> two b h i v", two=2)
        return self.head_norm(first - self.lam().to(out.dtype) * second) * (1 - self.lambda_init)
