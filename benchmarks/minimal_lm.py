"""A minimal decoder-only LM written directly in PyTorch, in the style of nanoGPT, shaped like a recipe:
the speed reference of ``benchmarks/recipe_speed.py --minimal``.

Pre-norm blocks (LayerNorm or RMSNorm), fused qkv, SDPA (grouped-query through ``enable_gqa``), rotary
positions in the rotate-half form with full-width cos/sin tables precomputed (GPT-NeoX, Llama; the
recipe's pairing changes which features pair up, not the work) or learned positions, an MLP or SwiGLU,
tied or untied head, and ``F.cross_entropy`` over the whole batch's logits. Only the architecture's
shape is copied: no weight of the recipe's model, no special initialisation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbuilder.data.packing import segments
from tfbuilder.spec.recipe import Recipe


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int, hidden: int, *, rms: bool, swiglu: bool, bias: tuple[bool, bool], dropout: float):
        super().__init__()
        norm = (lambda: nn.RMSNorm(d, eps=1e-6)) if rms else (lambda: nn.LayerNorm(d))
        self.heads, self.kv_heads, self.head_dim, self.dropout, self.swiglu = heads, kv_heads, head_dim, dropout, swiglu
        self.ln1, self.ln2 = norm(), norm()
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * head_dim, bias=bias[0])
        self.proj = nn.Linear(heads * head_dim, d, bias=bias[0])
        self.fc = nn.Linear(d, 2 * hidden if swiglu else hidden, bias=bias[1])
        self.out = nn.Linear(hidden, d, bias=bias[1])

    def forward(self, x: Tensor, cos: Tensor | None, sin: Tensor | None, mask: Tensor | None) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split([self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        q, k, v = (t.view(b, n, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if cos is not None and sin is not None:
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=self.kv_heads != self.heads
        )
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, n, -1)), self.dropout, self.training)
        h = self.fc(self.ln2(x))
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return x + F.dropout(self.out(h), self.dropout, self.training)


class MinimalLM(nn.Module):
    """A recipe's decoder shape (d_model, layers, heads, kv heads, head width, FFN width, norm, FFN
    kind, positions, tie, dropout, embedding scale) written directly in PyTorch."""

    def __init__(self, recipe: Recipe, *, hidden: int):
        super().__init__()
        spec = recipe.model
        att, d = spec.attention, spec.d_model
        heads = att.heads
        head_dim = att.key_dim or d // heads
        if spec.decoder is None or spec.position.type not in ("rotary", "learned", "none"):
            raise SystemExit(f"{recipe.name}: the minimal model has rotary, learned or no positions")
        self.position, self.documents = spec.position.type, recipe.data.document_mask
        self.scale = math.sqrt(d) if spec.embed_scale == "sqrt_d_model" else float(spec.embed_scale)
        self.dropout, self.pad = spec.dropout, spec.pad_id
        self.tok = nn.Embedding(spec.vocab_size, d)
        self.pos = nn.Embedding(spec.position.max_len, d) if self.position == "learned" else None
        self.blocks = nn.ModuleList(
            Block(d, heads, att.kv_heads or heads, head_dim, hidden, rms=spec.norm.type == "rmsnorm",
                  swiglu=spec.ffn.type == "swiglu", bias=(bool(att.bias), spec.ffn.bias), dropout=spec.dropout)
            for _ in range(spec.decoder.layers)
        )  # fmt: skip
        self.ln = nn.RMSNorm(d, eps=1e-6) if spec.norm.type == "rmsnorm" else nn.LayerNorm(d)
        self.head = None if spec.tie_output else nn.Linear(d, spec.vocab_size, bias=False)
        if self.position == "rotary":
            base, max_len = spec.position.base, spec.position.max_len
            inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
            angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq
            angles = torch.cat([angles, angles], dim=-1)  # full width: rotate-half pairs i and i + k/2
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        """``ids`` (b, n) -> logits (b, n, vocab)."""
        n = ids.shape[1]
        x = self.tok(ids) * self.scale
        if self.pos is not None:
            x = x + self.pos.weight[:n]
        x = F.dropout(x, self.dropout, self.training)
        cos = sin = mask = None
        if self.position == "rotary":
            cos, sin = self.cos[:n], self.sin[:n]
        if self.documents:  # packed documents see only themselves (recipe data.document_mask)
            seg = segments(ids)
            causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
            mask = (seg[:, :, None] == seg[:, None, :])[:, None] & causal
        for block in self.blocks:
            x = block(x, cos, sin, mask)
        x = self.ln(x)
        return x @ self.tok.weight.T if self.head is None else self.head(x)

    def loss(self, tokens: Tensor) -> Tensor:
        """Next-token cross-entropy of a packed batch ``tokens`` (b, n + 1), over the whole batch's logits."""
        logits = self(tokens[:, :-1])
        ignore = -100 if self.pad is None else self.pad
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten(), ignore_index=ignore)
