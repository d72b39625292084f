"""The ``scaling`` of rotary positions: frequency rules that stretch a rotary model's trained context
(linear, Llama 3.1's, YaRN, LongRoPE), each as Hugging Face transformers' ``ROPE_INIT_FUNCTIONS``
computes it (``modeling_rope_utils.py``).

A scaling gives the inverse frequencies of the rotated pairs (:meth:`frequencies`) and the factor the
cos/sin tables are multiplied by (:meth:`table_factor`; queries and keys are both rotated, so
scores grow by its square). LongRoPE has two sets of frequencies and picks one by the length a call
spans (:meth:`is_long`).
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import Tensor

from tfbuilder.params import MAX_INT, bounded


class _RotaryScaling(BaseModel):
    """Base of the ``scaling`` of rotary positions: strict and immutable like component params, no integer
    beyond :data:`~tfbuilder.params.MAX_INT`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    _bounded = field_validator("*", mode="after")(bounded)
    switches: ClassVar[bool] = False  # True: two sets of frequencies, chosen per call by is_long

    def frequencies(self, inv_freq: Tensor, *, base: float, long: bool = False) -> Tensor:
        """The inverse frequencies base^(-2i/k) of the pairs i < k/2, scaled (``long``: LongRoPE's long set)."""
        raise NotImplementedError

    def table_factor(self) -> float:
        """What the cos/sin tables are multiplied by (1: none)."""
        return 1.0

    def is_long(self, length: int) -> bool:
        """Whether a call over positions 0..length-1 uses the long set of frequencies."""
        return False

    def width_problem(self, width: int) -> str | None:
        """What is wrong with rotating ``width`` features per head with this scaling, or None."""
        return None


class LinearRotaryScaling(_RotaryScaling):
    """Position interpolation (Chen et al. 2023, arXiv:2306.15595; Hugging Face transformers'
    ``rope_type: linear``): positions are divided by ``factor``, so that ``factor`` times the trained
    context maps onto the trained angles. Dividing the frequencies instead is the same angle
    (transformers' ``_compute_linear_scaling_rope_parameters``)."""

    type: Literal["linear"]
    factor: float = Field(1.0, ge=1.0, le=1e6, description="positions are divided by this")

    def frequencies(self, inv_freq: Tensor, *, base: float, long: bool = False) -> Tensor:
        return inv_freq / self.factor


class Llama3RotaryScaling(_RotaryScaling):
    """Llama 3.1's frequency-dependent scaling (Meta's llama-models ``apply_scaling``; Hugging Face
    transformers' ``rope_type: llama3``, ``_compute_llama3_parameters``). With L =
    ``original_max_position_embeddings``, a pair whose wavelength 2 pi / f is shorter than
    L / ``high_freq_factor`` keeps its frequency f; one longer than L / ``low_freq_factor`` gets
    f / ``factor``; in between, s = (L / wavelength - low_freq_factor) / (high_freq_factor -
    low_freq_factor) and the frequency is (1 - s) f / factor + s f."""

    type: Literal["llama3"]
    factor: float = Field(8.0, ge=1.0, le=1e6, description="long wavelengths' frequencies are divided by this")
    low_freq_factor: float = Field(
        1.0, gt=0.0, le=1e6, description="wavelengths beyond original_max_position_embeddings / this are scaled fully"
    )
    high_freq_factor: float = Field(
        4.0, gt=0.0, le=1e6, description="wavelengths below original_max_position_embeddings / this are kept"
    )
    original_max_position_embeddings: int = Field(
        8192, ge=1, le=MAX_INT, description="the context length the model was trained for"
    )

    @model_validator(mode="after")
    def _ordered(self) -> Llama3RotaryScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor ({self.low_freq_factor})"
            )
        return self

    def frequencies(self, inv_freq: Tensor, *, base: float, long: bool = False) -> Tensor:
        context = self.original_max_position_embeddings
        wavelength = 2 * math.pi / inv_freq
        smooth = (context / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        between = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
        out = torch.where(wavelength > context / self.low_freq_factor, inv_freq / self.factor, between)
        return torch.where(wavelength < context / self.high_freq_factor, inv_freq, out)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023, arXiv:2309.00071, eq. 22),
    with DeepSeek's coefficient ``mscale`` on the log: 0.1 mscale ln(s) + 1; 1 for s <= 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class YarnRotaryScaling(_RotaryScaling):
    """YaRN (Peng et al. 2023, arXiv:2309.00071, sec. 3.2-3.4; transformers' ``rope_type: yarn``,
    ``_compute_yarn_parameters``): "NTK-by-parts" interpolation plus an attention temperature.

    With L = ``original_max_position_embeddings`` and k the rotated width, pair i turns L / wavelength_i
    times over the trained context; the pair index where that count is b is
    d(b) = k ln(L / (2 pi b)) / (2 ln base). Pairs below d(``beta_fast``) keep their frequency f
    (extrapolation), pairs above d(``beta_slow``) get f / ``factor`` (interpolation), and a linear ramp
    (i - low) / (high - low), clamped to [0, 1], mixes the two in between: f (1 - ramp) + f / factor
    ramp. ``truncate`` rounds low down and high up (transformers' default; the paper's code too); the
    range is clamped to [0, k - 1]. The cos/sin tables are multiplied by :meth:`table_factor`:
    ``attention_factor`` if set, else yarn_mscale(factor, mscale) / yarn_mscale(factor,
    mscale_all_dim) when both are set and non-zero (DeepSeek's), else yarn_mscale(factor) = 0.1
    ln(factor) + 1."""

    type: Literal["yarn"]
    factor: float = Field(ge=1.0, le=1e6, description="the context extension s: long wavelengths' frequencies over s")
    original_max_position_embeddings: int = Field(
        ge=1, le=MAX_INT, description="the context length L the model was trained for"
    )
    beta_fast: float = Field(
        32.0, gt=0.0, le=1e6, description="pairs turning more than this often over L keep their frequency"
    )
    beta_slow: float = Field(1.0, gt=0.0, le=1e6, description="pairs turning less than this often over L are scaled")
    mscale: float | None = Field(
        None, ge=0.0, le=1e3, description="DeepSeek's log coefficient of the attention factor's numerator"
    )
    mscale_all_dim: float | None = Field(
        None,
        ge=0.0,
        le=1e3,
        description="DeepSeek's log coefficient of the attention factor's denominator; latent attention also "
        "multiplies its softmax scale by yarn_mscale(factor, mscale_all_dim)^2",
    )
    attention_factor: float | None = Field(
        None, gt=0.0, le=1e3, description="the cos/sin factor; default from factor, mscale and mscale_all_dim"
    )
    truncate: bool = Field(True, description="round the ramp's ends to whole pairs (low down, high up)")

    @model_validator(mode="after")
    def _ordered(self) -> YarnRotaryScaling:
        if self.beta_fast < self.beta_slow:
            raise ValueError(f"beta_fast ({self.beta_fast}) must be at least beta_slow ({self.beta_slow})")
        return self

    def correction_range(self, width: int, base: float) -> tuple[float, float]:
        """The ramp's ends (low, high), in pairs, for ``width`` rotated features."""

        def pair(rotations: float) -> float:
            context = self.original_max_position_embeddings
            return width * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair(self.beta_fast), pair(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, width - 1)
        return (low, high + 0.001) if low == high else (low, high)  # no division by zero (transformers')

    def frequencies(self, inv_freq: Tensor, *, base: float, long: bool = False) -> Tensor:
        low, high = self.correction_range(2 * inv_freq.shape[-1], base)
        pairs = torch.arange(inv_freq.shape[-1], dtype=torch.float32, device=inv_freq.device)
        ramp = ((pairs - low) / (high - low)).clamp(0, 1)
        return inv_freq / self.factor * ramp + inv_freq * (1 - ramp)

    def table_factor(self) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def score_scale(self) -> float:
        """What DeepSeek's attention multiplies its softmax scale by: yarn_mscale(factor, mscale_all_dim)^2
        when mscale_all_dim is set and non-zero, else 1 (transformers' ``yarn_apply_mscale``)."""
        return yarn_mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


Factor = Annotated[float, Field(gt=0.0, le=1e6)]


class LongRopeRotaryScaling(_RotaryScaling):
    """LongRoPE (Ding et al. 2024, arXiv:2402.13753; Phi-3's ``rope_scaling``, transformers' ``rope_type:
    longrope``, ``_compute_longrope_parameters``): pair i's frequency is divided by a searched factor,
    ``short_factor[i]`` or ``long_factor[i]``.

    As transformers chooses (``dynamic_rope_update``): a call whose positions end past
    ``original_max_position_embeddings`` (offset + n > L) uses the long factors for all its positions,
    any other the short ones. When decoding with a cache crosses L, the keys cached before keep their
    short-factor rotation, so the logits then differ from those of one forward over the whole sequence
    (transformers' generation does the same). The cos/sin tables are multiplied by
    ``attention_factor``, default sqrt(1 + ln(factor) / ln(L)) (1 for factor <= 1)."""

    type: Literal["longrope"]
    short_factor: list[Factor] = Field(
        min_length=1, max_length=65536, description="per pair i, what f_i is divided by within the trained context"
    )
    long_factor: list[Factor] = Field(
        min_length=1, max_length=65536, description="per pair i, what f_i is divided by past the trained context"
    )
    original_max_position_embeddings: int = Field(
        ge=2, le=MAX_INT, description="the context length L the model was trained for"
    )
    factor: float | None = Field(
        None,
        ge=1.0,
        le=1e6,
        description="the extended context over L (Phi-3: max_position_embeddings / "
        "original_max_position_embeddings); sets the default attention_factor",
    )
    attention_factor: float | None = Field(
        None, gt=0.0, le=1e3, description="the cos/sin factor; default sqrt(1 + ln(factor) / ln(L))"
    )

    switches: ClassVar[bool] = True

    @model_validator(mode="after")
    def _consistent(self) -> LongRopeRotaryScaling:
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(
                f"short_factor ({len(self.short_factor)} entries) and long_factor ({len(self.long_factor)}) "
                "must have one entry per rotated pair each"
            )
        if self.factor is None and self.attention_factor is None:
            raise ValueError(
                "set factor (the extended context over original_max_position_embeddings, e.g. Phi-3's "
                "max_position_embeddings / original_max_position_embeddings) or attention_factor"
            )
        return self

    def width_problem(self, width: int) -> str | None:
        if len(self.short_factor) != width // 2:
            return (
                f"short_factor and long_factor have {len(self.short_factor)} entries; the {width} rotated "
                f"features per head make {width // 2} pairs"
            )
        return None

    def is_long(self, length: int) -> bool:
        return length > self.original_max_position_embeddings

    def frequencies(self, inv_freq: Tensor, *, base: float, long: bool = False) -> Tensor:
        problem = self.width_problem(2 * inv_freq.shape[-1])
        if problem is not None:
            raise ValueError(f"longrope: {problem}")
        factors = torch.tensor(self.long_factor if long else self.short_factor, dtype=torch.float32)
        return inv_freq / factors.to(inv_freq.device)

    def table_factor(self) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        factor = self.factor or 1.0
        if factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(factor) / math.log(self.original_max_position_embeddings))


RotaryScaling = LinearRotaryScaling | Llama3RotaryScaling | YarnRotaryScaling | LongRopeRotaryScaling
