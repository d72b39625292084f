"""Positional encodings added to the token embeddings (family ``position``)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from tfbuilder.contracts import AttentionPosition, PositionParams, default_head_dim  # noqa: F401 (AttentionPosition re-exported)
from tfbuilder.model.components.rotary_scaling import (  # noqa: F401 (the scalings re-exported)
    LinearRotaryScaling,
    Llama3RotaryScaling,
    LongRopeRotaryScaling,
    RotaryScaling,
    YarnRotaryScaling,
)
from tfbuilder.params import AttentionShape
from tfbuilder.registry import BuildContext, ModelDims, register


def sinusoids(n: int, d: int, *, base: float = 10000.0, offset: int = 0, device=None) -> Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)); shape (n, d),
    computed in float64 on ``device``."""
    return sinusoids_at(torch.arange(offset, offset + n, dtype=torch.float64, device=device), d, base=base)


def sinusoids_at(positions: Tensor, d: int, *, base: float = 10000.0) -> Tensor:
    """:func:`sinusoids` at the positions ``positions`` (any shape, (b, n) for each row's own): (..., d)."""
    pos = positions.to(torch.float64).unsqueeze(-1)
    inv_freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) * (-math.log(base) / d))
    pe = torch.zeros(*positions.shape, d, dtype=torch.float64, device=positions.device)
    pe[..., 0::2] = torch.sin(pos * inv_freq)
    pe[..., 1::2] = torch.cos(pos * inv_freq[: d // 2])
    return pe.to(torch.get_default_dtype())


@register("position", "sinusoidal")
class SinusoidalPosition(nn.Module):
    """Fixed sinusoidal positions added to the embeddings (Vaswani et al. 2017, sec. 3.5)."""

    class Params(PositionParams):
        type: Literal["sinusoidal"] = "sinusoidal"
        base: float = Field(10000.0, gt=1.0, description="wavelength base (10000 in the paper)")
        max_len: int = Field(
            1024, ge=1, le=1_000_000, description="positions precomputed; longer inputs are computed on the fly"
        )

    table: Tensor  # (max_len, d), a buffer

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.base = params.base
        self.d_model = ctx.d_model
        # Not persistent: a function of the params, so it stays out of checkpoints.
        self.register_buffer("table", sinusoids(params.max_len, ctx.d_model, base=params.base), persistent=False)

    def forward(self, x: Tensor, *, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x`` (b, n, d) -> x + PE[offset : offset + n], or x + PE[positions] for per-row ``positions`` (b, n)."""
        n = x.shape[1]
        if positions is not None:
            return x + sinusoids_at(positions, self.d_model, base=self.base).to(x.dtype)
        if offset + n <= self.table.shape[0]:
            pe = self.table[offset : offset + n]
        else:
            pe = sinusoids(n, self.d_model, base=self.base, offset=offset, device=x.device)
        return x + pe.to(x.dtype)


@register("position", "learned")
class LearnedPosition(nn.Module):
    """Learned absolute position embeddings (Vaswani et al. 2017, Table 3 row E; Gehring et al. 2017)."""

    class Params(PositionParams):
        type: Literal["learned"] = "learned"
        max_len: int = Field(1024, ge=1, le=1_000_000, description="longest sequence the table covers")

        def max_positions(self) -> int | None:
            """The table's length: a longer sequence has no position."""
            return self.max_len

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.table = nn.Embedding(params.max_len, ctx.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, x: Tensor, *, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x`` (b, n, d) -> x + P[offset : offset + n], or x + P[positions] for per-row ``positions`` (b, n)
        (each at most its column, so the bound on columns holds them)."""
        n, max_len = x.shape[1], self.table.num_embeddings
        if offset + n > max_len:
            raise ValueError(f"sequence of {offset + n} positions exceeds learned max_len ({max_len})")
        if positions is not None:
            return x + self.table(positions)
        return x + self.table.weight[offset : offset + n]


@register("position", "none")
class NoPosition(nn.Module):
    """No positional information (an ablation: attention alone is permutation-equivariant)."""

    class Params(PositionParams):
        type: Literal["none"] = "none"

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()

    def forward(self, x: Tensor, *, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x`` (b, n, d) unchanged."""
        return x


def rotary_frequencies(
    k: int, *, base: float, scaling: RotaryScaling | None = None, long: bool = False, device=None
) -> Tensor:
    """Inverse frequencies base^(-2i/k) of the pairs i < k/2, then ``scaling``'s (``long``: LongRoPE's
    long set): (k/2,), float32."""
    inv_freq = base ** (-torch.arange(0, k, 2, device=device, dtype=torch.float32) / k)
    return inv_freq if scaling is None else scaling.frequencies(inv_freq, base=base, long=long)


def rotary_angles(
    n: int,
    k: int,
    *,
    base: float,
    offset: int = 0,
    device=None,
    scaling: RotaryScaling | None = None,
    long: bool = False,
) -> Tensor:
    """Angles pos * f_i of positions offset..offset+n-1 and pairs i < k/2, f_i those of
    :func:`rotary_frequencies`: (n, k/2), float32."""
    inv_freq = rotary_frequencies(k, base=base, scaling=scaling, long=long, device=device)
    return torch.arange(offset, offset + n, device=device, dtype=torch.float32)[:, None] * inv_freq


def rotary_tables(
    n: int,
    k: int,
    *,
    base: float,
    offset: int = 0,
    device=None,
    scaling: RotaryScaling | None = None,
    long: bool = False,
) -> tuple[Tensor, Tensor]:
    """cos and sin of :func:`rotary_angles`, times the scaling's table factor (YaRN's and LongRoPE's
    attention factor; 1 for the others): two (n, k/2), float32."""
    angles = rotary_angles(n, k, base=base, offset=offset, device=device, scaling=scaling, long=long)
    factor = 1.0 if scaling is None else scaling.table_factor()
    return angles.cos() * factor, angles.sin() * factor


def rotary_width(k: int, fraction: float) -> int:
    """The features of a head of width ``k`` that rotate: int(fraction * k), as GPT-NeoX's ``rotary_ndims``
    and transformers' ``int(head_dim * partial_rotary_factor)``."""
    return int(fraction * k)


def full_width(
    cos: Tensor, sin: Tensor, pairing: Literal["interleaved", "half"]
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` (..., r/2), one value per pair, at full width (..., r): each pair's value on
    both of its features, x_2i and x_2i+1 (``interleaved``) or x_i and x_i+r/2 (``half``), so that a
    rotation is two full-width products (GPT-NeoX's and Llama's ``x * cos + rotate_half(x) * sin``)."""
    if pairing == "half":
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)


def rotary_partners(x: Tensor, pairing: Literal["interleaved", "half"]) -> Tensor:
    """Each feature's partner in its pair (a, b), signed: -x_b in place of x_a, x_a in place of x_b, so
    that ``x * cos + partners * sin`` turns each pair by its angle (``rotate_half`` with ``half``)."""
    if pairing == "half":
        first, second = x.chunk(2, dim=-1)
        return torch.cat([-second, first], dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([-odd, even], dim=-1).flatten(-2)


@register("position", "rotary")
class RotaryPosition(AttentionPosition):
    """Rotary position embedding (Su et al. 2021, RoFormer, arXiv:2104.09864).

    Queries and keys are rotated by their positions, so that scores depend on relative offsets only.
    The cos/sin tables of the first ``max_len`` positions are buffers on the model's device. ``fraction``
    rotates only the first features of each head (GPT-NeoX's partial rotary); ``scaling`` stretches the
    positions for contexts longer than the trained one (linear position interpolation, Llama 3.1's, YaRN,
    LongRoPE)."""

    rotates = True

    class Params(PositionParams):
        type: Literal["rotary"] = "rotary"
        base: float = Field(10000.0, gt=1.0, description="wavelength base of the rotation frequencies")
        max_len: int = Field(
            4096,
            ge=1,
            le=1_000_000,
            description="positions whose cos/sin tables are precomputed; longer ones are computed on the fly",
        )
        pairing: Literal["interleaved", "half"] = Field(
            "interleaved",
            description="which features rotate together: interleaved (x_2i, x_2i+1), the paper's; half (x_i, x_i+k/2), "
            "GPT-NeoX's and Llama's",
        )
        fraction: float = Field(
            1.0,
            gt=0.0,
            le=1.0,
            description="share of each head's features that rotate: the first int(fraction * head width) (an even "
            "count), with frequencies base^(-2i/that width); the rest pass unchanged (GPT-NeoX's rotary_pct, "
            "Black et al. 2022; Phi's partial_rotary_factor). With pairing half, the halves are those of the "
            "rotated features",
        )
        scaling: RotaryScaling | None = Field(
            None,
            discriminator="type",
            description="frequency scaling for longer contexts: null (none); {type: linear, factor} divides "
            "positions by factor (1 to 1e6, default 1; position interpolation, Chen et al. 2023; transformers' "
            "rope_type linear); {type: llama3, factor, low_freq_factor, high_freq_factor, "
            "original_max_position_embeddings} is Llama 3.1's (transformers' rope_type llama3; defaults 8, 1, 4, "
            "8192, Llama 3.1's; high_freq_factor above low_freq_factor): frequencies of wavelengths longer than "
            "original_max_position_embeddings / low_freq_factor divided by factor, of those shorter than "
            "original_max_position_embeddings / high_freq_factor kept, interpolated in between; {type: yarn, "
            "factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim, "
            "attention_factor, truncate} is YaRN (Peng et al. 2023; transformers' rope_type yarn; beta_fast 32 "
            "and beta_slow 1 by default): NTK-by-parts frequencies and cos/sin times an attention factor; "
            "{type: longrope, short_factor, long_factor, original_max_position_embeddings, factor, "
            "attention_factor} is LongRoPE (Ding et al. 2024; Phi-3's; transformers' rope_type longrope): "
            "one factor per rotated pair, the long ones for calls whose positions end past "
            "original_max_position_embeddings, and cos/sin times an attention factor",
        )

        def check_shape(self, shape: AttentionShape) -> list[tuple[str, str]]:
            width = rotary_width(shape.key_dim if shape.rotary_dim is None else shape.rotary_dim, self.fraction)
            problem = None if self.scaling is None or width == 0 else self.scaling.width_problem(width)
            return [] if problem is None else [("scaling", problem)]

    cos: Tensor  # (max_len, r), buffers, r the rotated width: each pair's value on both its features
    sin: Tensor
    cos_long: Tensor | None  # LongRoPE's long-factor tables, else None
    sin_long: Tensor | None

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.base, self.fraction, self.scaling = params.base, params.fraction, params.scaling
        self.pairing = params.pairing
        r = rotary_width(ctx.head_dim or default_head_dim(ctx.d_model, ctx.heads), params.fraction)
        r -= r % 2
        switches = params.scaling is not None and params.scaling.switches
        # Not persistent: functions of the params, so they stay out of checkpoints.
        for suffix, long in (("", False), ("_long", True)):
            tables: tuple[Tensor | None, Tensor | None] = (None, None)
            if switches or not long:
                tables = full_width(
                    *rotary_tables(params.max_len, r, base=params.base, scaling=params.scaling, long=long),
                    self.pairing,
                )
            for name, table in zip(("cos", "sin"), tables, strict=True):
                self.register_buffer(name + suffix, table, persistent=False)

    def tables(self, offset: int, n: int, r: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos and sin (n, r) of positions offset..offset+n-1 at full width: the precomputed ones where they
        cover the call, else computed; LongRoPE's long ones when the call's positions end past its trained
        context."""
        long = self.scaling is not None and self.scaling.is_long(offset + n)
        cos, sin = (self.cos_long, self.sin_long) if long else (self.cos, self.sin)
        if cos is not None and sin is not None and offset + n <= cos.shape[0] and cos.shape[1] == r:
            return cos[offset : offset + n], sin[offset : offset + n]
        tables = rotary_tables(n, r, base=self.base, offset=offset, device=device, scaling=self.scaling, long=long)
        return full_width(*tables, self.pairing)

    def row_tables(self, positions: Tensor, offset: int, r: int) -> tuple[Tensor, Tensor]:
        """cos and sin (b, 1, n, r) at full width of each row's own ``positions`` (b, n) (left-padded
        prompts), times the scaling's table factor; LongRoPE's long set when the padded width ``offset + n`` passes its
        trained context (a bound on every row's last position, read without a host sync)."""
        long = self.scaling is not None and self.scaling.is_long(offset + positions.shape[-1])
        inv_freq = rotary_frequencies(r, base=self.base, scaling=self.scaling, long=long, device=positions.device)
        angles = positions.float()[:, None, :, None] * inv_freq
        factor = 1.0 if self.scaling is None else self.scaling.table_factor()
        return full_width(angles.cos() * factor, angles.sin() * factor, self.pairing)

    def rotate(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x`` (b, h, n, k), positions offset..offset+n-1: of the first r = int(fraction * k) features,
        pairs (x_2i, x_2i+1), or (x_i, x_i+r/2) with ``pairing: half``, rotated by pos * f_i, f_i =
        base^(-2i/r) after ``scaling``, and multiplied by the scaling's table factor; the other k - r
        features unchanged."""
        n, k = x.shape[-2], x.shape[-1]
        r = rotary_width(k, self.fraction)
        if r % 2 or r == 0:
            if self.fraction == 1.0:
                raise ValueError(f"rotary positions need an even key width per head, got {k}")
            raise ValueError(
                f"rotary positions turn pairs: fraction {self.fraction} of the key width per head ({k}) rotates "
                f"{r} features, which must be even and at least 2"
            )
        if positions is not None:  # each row's own positions (b, n), left-padded prompts: (b, 1, n, r)
            cos, sin = self.row_tables(positions, offset, r)
        else:
            cos, sin = self.tables(offset, n, r, x.device)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if r == k:
            return x * cos + rotary_partners(x, self.pairing) * sin
        turned, rest = x[..., :r], x[..., r:]
        return torch.cat([turned * cos + rotary_partners(turned, self.pairing) * sin, rest], dim=-1)


def alibi_slopes(heads: int) -> Tensor:
    """Per-head slopes: the geometric sequence 2^(-8/h), 2^(-16/h), ... for h a power of two; otherwise
    those of the next lower power of two, then every other slope of the next higher (Press et al. 2021)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(heads).is_integer():
        return torch.tensor(power_of_two(heads))
    lower = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_two(lower) + power_of_two(2 * lower)[0::2][: heads - lower])


@register("position", "alibi")
class ALiBiPosition(AttentionPosition):
    """Attention with linear biases: scores minus slope_h * distance (Press et al. 2021, arXiv:2108.12409);
    symmetric distances in encoders."""

    biases = True

    class Params(PositionParams):
        type: Literal["alibi"] = "alibi"

    slopes: Tensor  # (h,), a buffer

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.causal = ctx.causal
        self.register_buffer("slopes", alibi_slopes(ctx.heads), persistent=False)

    def bias(self, n_query: int, n_key: int, offset: int, heads: int) -> Tensor:
        """Additive scores (1, h, i, j): minus slope_h times the distance between query and key."""
        if heads != self.slopes.shape[0]:
            raise ValueError(f"alibi was built for {self.slopes.shape[0]} heads, attention has {heads}")
        device = self.slopes.device
        i = torch.arange(offset, offset + n_query, device=device)[:, None]
        j = torch.arange(n_key, device=device)[None, :]
        distance = (i - j).clamp(min=0) if self.causal else (i - j).abs()
        return -(self.slopes[:, None, None] * distance)[None]


@register("position", "relative_bias")
class RelativeBiasPosition(AttentionPosition):
    """T5's learned relative position bias (Raffel et al. 2020, arXiv:1910.10683).

    One scalar per head and log-spaced distance bucket, shared by a stack's layers."""

    biases = True

    class Params(PositionParams):
        type: Literal["relative_bias"] = "relative_bias"
        buckets: int = Field(32, ge=2, description="distance buckets (halved per direction in encoders)")
        max_distance: int = Field(128, ge=2, description="distances beyond this share the last bucket")

        def check(self, dims: ModelDims) -> list[tuple[str, str]]:
            # Decoders keep buckets/2 exact distances, encoders buckets/4 per direction; the
            # log-spaced buckets run from there to max_distance (log(max_distance / exact) > 0).
            if self.buckets < 4:
                return [
                    (
                        "buckets",
                        f"buckets ({self.buckets}) must be at least 4: encoders halve them per direction, "
                        "and each half needs an exact bucket",
                    )
                ]
            if self.max_distance <= self.buckets // 2:
                return [
                    (
                        "max_distance",
                        f"max_distance ({self.max_distance}) must exceed buckets / 2 ({self.buckets // 2}), "
                        "the distances with exact buckets",
                    )
                ]
            return []

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.causal = ctx.causal
        self.buckets, self.max_distance, self.heads = params.buckets, params.max_distance, ctx.heads
        self.table = nn.Embedding(params.buckets, ctx.heads)
        nn.init.zeros_(self.table.weight)

    def bucket(self, relative: Tensor) -> Tensor:
        """Bucket of key position minus query position."""
        buckets, n = self.buckets, -relative
        out = torch.zeros_like(n)
        if not self.causal:
            buckets //= 2
            out += (n < 0).long() * buckets
            n = n.abs()
        else:
            n = n.clamp(min=0)
        exact = buckets // 2
        large = (
            exact
            + (
                torch.log(n.float().clamp(min=1) / exact) / math.log(self.max_distance / exact) * (buckets - exact)
            ).long()
        )
        return out + torch.where(n < exact, n, large.clamp(max=buckets - 1))

    def bias(self, n_query: int, n_key: int, offset: int, heads: int) -> Tensor:
        """Additive scores (1, h, i, j): the learned scalar of each head and distance bucket."""
        if heads != self.heads:
            raise ValueError(f"relative_bias was built for {self.heads} heads, attention has {heads}")
        i = torch.arange(offset, offset + n_query, device=self.table.weight.device)[:, None]
        j = torch.arange(n_key, device=self.table.weight.device)[None, :]
        return self.table(self.bucket(j - i)).permute(2, 0, 1)[None]
