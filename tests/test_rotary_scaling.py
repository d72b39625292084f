"""Rotary scaling for longer contexts, YaRN (Peng et al. 2023, arXiv:2309.00071) and LongRoPE (Ding et al.
2024, arXiv:2402.13753), against Hugging Face transformers' ``ROPE_INIT_FUNCTIONS``, its rotary
embeddings (``dynamic_rope_update`` included) and DeepSeek-V3's attention, with random weights."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

import tfbuilder
from tfbuilder.errors import RecipeError
from tfbuilder.model.components.latent_attention import LatentAttention
from tfbuilder.model.components.position import RotaryPosition, rotary_frequencies, rotary_width
from tfbuilder.registry import BuildContext
from tfbuilder.spec.recipe import ModelSection, recipe_from_dict

transformers = pytest.importorskip("transformers")

HEADS, K, BASE = 2, 40, 10000.0

YARN_CASES = {
    "defaults": {"factor": 4.0, "original_max_position_embeddings": 64},
    "deepseek-v3": {"factor": 40.0, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0},
    "mscale differs": {"factor": 8.0, "original_max_position_embeddings": 64, "mscale": 0.707, "mscale_all_dim": 1.0},
    "attention_factor, betas": {"factor": 3.0, "original_max_position_embeddings": 50, "attention_factor": 1.3, "beta_fast": 16.0, "beta_slow": 2.0},
    "not truncated": {"factor": 6.0, "original_max_position_embeddings": 80, "truncate": False},
}


def reference(rope_parameters: dict, *, fraction: float = 1.0, max_position_embeddings: int = 256):
    """transformers' Llama rotary embedding and config for heads of K features at BASE."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    extra = {"partial_rotary_factor": fraction} if fraction != 1.0 else {}
    config = transformers.LlamaConfig(
        hidden_size=HEADS * K, num_attention_heads=HEADS, max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_theta": BASE} | rope_parameters | extra,
    )
    return LlamaRotaryEmbedding(config), config


def theirs_rotated(embedding, q: torch.Tensor, positions: torch.Tensor, width: int) -> torch.Tensor:
    """transformers' rotation (pairing half) of the first ``width`` features at ``positions``, the rest kept."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cos, sin = embedding(q, positions[None])
    rotated, _ = apply_rotary_pos_emb(q[..., :width], q[..., :width], cos, sin)
    return torch.cat([rotated, q[..., width:]], dim=-1)


def ours(scaling: dict, *, fraction: float = 1.0, max_len: int = 32) -> RotaryPosition:
    params = RotaryPosition.Params(base=BASE, pairing="half", max_len=max_len, fraction=fraction, scaling=scaling)
    return RotaryPosition(params, BuildContext(d_model=HEADS * K, heads=HEADS))


@pytest.mark.parametrize("fraction", [1.0, 0.5], ids=["full", "partial"])
@pytest.mark.parametrize("case", YARN_CASES)
def test_yarn_is_transformers_yarn(case, fraction):
    """Frequencies equal ``_compute_yarn_parameters``' (to 1e-6) and queries rotated at positions 0..99
    (a table of 32: in it and past it) equal transformers' cos/sin, attention factor included."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = YARN_CASES[case]
    embedding, config = reference({"rope_type": "yarn"} | params, fraction=fraction)
    want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    module = ours({"type": "yarn"} | params, fraction=fraction)
    width = rotary_width(K, fraction)
    assert module.scaling is not None
    torch.testing.assert_close(rotary_frequencies(width, base=BASE, scaling=module.scaling), want_freq, rtol=1e-6, atol=0)
    assert module.scaling.table_factor() == pytest.approx(want_factor, rel=1e-12)
    q = torch.randn(1, HEADS, 100, K)
    torch.testing.assert_close(module.rotate(q, 0), theirs_rotated(embedding, q, torch.arange(100), width), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(module.rotate(q[:, :, :7], 3), theirs_rotated(embedding, q[:, :, :7], torch.arange(3, 10), width), atol=1e-5, rtol=1e-5)


def yarn_frequency(i: int, width: int, *, factor: float, context: int, fast: float, slow: float) -> float:
    """The paper's NTK-by-parts (sec. 3.2) for pair i, as its code rounds: the pair index where the
    wavelength fits ``rotations`` times into the context is width ln(context / (2 pi rotations)) / (2 ln base);
    below that of ``fast`` extrapolate, above that of ``slow`` interpolate, a linear ramp between."""
    def index(rotations: float) -> float:
        return width * math.log(context / (2 * math.pi * rotations)) / (2 * math.log(BASE))

    low, high = max(math.floor(index(fast)), 0), min(math.ceil(index(slow)), width - 1)
    ramp = min(max((i - low) / (high - low), 0.0), 1.0)
    f = BASE ** (-2 * i / width)
    return f * (1 - ramp) + f / factor * ramp


def test_yarn_is_the_papers_ntk_by_parts_with_all_three_regimes():
    """Written from the paper: for a trained context of 64 at base 10000, 40 features, the first pairs
    keep their frequency, the last are divided by the factor, and the ramp between is linear; the
    attention factor is 0.1 ln(s) + 1 (eq. 22)."""
    module = ours({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    got = rotary_frequencies(K, base=BASE, scaling=module.scaling).tolist()
    want = [yarn_frequency(i, K, factor=4.0, context=64, fast=32.0, slow=1.0) for i in range(K // 2)]
    assert got == pytest.approx(want, rel=1e-6)
    unscaled = [BASE ** (-2 * i / K) for i in range(K // 2)]
    assert got[0] == pytest.approx(unscaled[0]) and got[-1] == pytest.approx(unscaled[-1] / 4.0)
    assert any(unscaled[i] / 4.0 * 1.01 < got[i] < unscaled[i] * 0.99 for i in range(K // 2))  # the ramp
    assert module.scaling is not None and module.scaling.table_factor() == pytest.approx(0.1 * math.log(4.0) + 1)


LONGROPE_SHORT = [1.0 + 0.05 * i for i in range(K // 2)]
LONGROPE_LONG = [1.5 + 0.4 * i for i in range(K // 2)]


@pytest.mark.parametrize("fraction", [1.0, 0.5], ids=["full", "partial"])
@pytest.mark.parametrize("offset, n", [(0, 20), (0, 64), (0, 65), (60, 10), (70, 1)], ids=["short", "to-the-edge", "one-past", "across", "decoding-past"])
def test_longrope_is_transformers_longrope_with_its_short_and_long_choice(offset, n, fraction):
    """Phi-3's config (no factor: max_position_embeddings / original, here 256 / 64 = 4) against ours
    with factor 4: positions offset..offset+n-1 with the long factors when offset + n > 64 (transformers'
    ``dynamic_rope_update``: max position + 1 past the original context), the short ones otherwise;
    cos/sin times sqrt(1 + ln 4 / ln 64). Our table holds 128 positions, so both sets come from tables."""
    width = rotary_width(K, fraction)
    short, long = LONGROPE_SHORT[: width // 2], LONGROPE_LONG[: width // 2]
    embedding, _ = reference({"rope_type": "longrope", "short_factor": short, "long_factor": long, "original_max_position_embeddings": 64}, fraction=fraction)
    module = ours({"type": "longrope", "short_factor": short, "long_factor": long, "original_max_position_embeddings": 64, "factor": 4.0},
                  fraction=fraction, max_len=128)
    assert module.scaling is not None
    assert module.scaling.table_factor() == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    q = torch.randn(1, HEADS, n, K)
    torch.testing.assert_close(module.rotate(q, offset), theirs_rotated(embedding, q, torch.arange(offset, offset + n), width), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("long", [False, True])
def test_longrope_frequencies_are_the_factors_division(long):
    """f_i = base^(-2i/k) / factor_i, and an explicit attention_factor is the cos/sin factor."""
    module = ours({"type": "longrope", "short_factor": LONGROPE_SHORT, "long_factor": LONGROPE_LONG,
                   "original_max_position_embeddings": 64, "attention_factor": 1.25})
    factors = LONGROPE_LONG if long else LONGROPE_SHORT
    got = rotary_frequencies(K, base=BASE, scaling=module.scaling, long=long)
    torch.testing.assert_close(got, torch.tensor([BASE ** (-2 * i / K) / factors[i] for i in range(K // 2)]), rtol=1e-6, atol=0)
    q = torch.randn(1, 1, 1, K)
    assert float(module.rotate(q, 0).norm()) == pytest.approx(1.25 * float(q.norm()), rel=1e-5)  # position 0: scaled only


def decoder(scaling: dict, **position) -> torch.nn.Module:
    spec = tiny_model(kind="decoder", encoder=None, position={"type": "rotary", "max_len": 4, "scaling": scaling} | position)
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


@pytest.mark.parametrize("scaling", [
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 6},
    {"type": "longrope", "short_factor": [1.0, 2.0, 1.5, 3.0], "long_factor": [3.0, 5.0, 2.0, 7.0], "original_max_position_embeddings": 20, "factor": 2.0},
], ids=["yarn", "longrope-short"])
def test_cached_decoding_with_scaling_gives_the_full_forwards_logits(scaling):
    """A table of 4, 12 tokens decoded one at a time equal one forward (LongRoPE within its trained context)."""
    model = decoder(scaling)
    tokens = torch.randint(1, 53, (2, 12))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, t : t + 1], cache=cache, offset=t) for t in range(12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_longrope_decoding_past_its_context_keeps_the_short_rotation_of_cached_keys():
    """As transformers' generation: steps past original_max_position_embeddings (6) rotate with the long
    factors, keys cached before keep the short ones; the steps up to 6 equal the full forward's."""
    model = decoder({"type": "longrope", "short_factor": [1.0, 2.0, 1.5, 3.0], "long_factor": [3.0, 5.0, 2.0, 7.0], "original_max_position_embeddings": 6, "factor": 2.0})
    tokens = torch.randint(1, 53, (1, 9))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = torch.cat([model(tokens[:, t : t + 1], cache=cache, offset=t) for t in range(9)], dim=1)
    torch.testing.assert_close(steps[:, :6], model(tokens[:, :6]), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(steps[:, 6:], full[:, 6:], atol=1e-3)


@pytest.mark.parametrize("scaling, message", [
    ({"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3, "original_max_position_embeddings": 8, "factor": 2.0},
     r"model\.position\.scaling: short_factor and long_factor have 3 entries; the 8 rotated features per head make 4 pairs"),
    ({"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 3, "original_max_position_embeddings": 8, "factor": 2.0},
     r"short_factor \(4 entries\) and long_factor \(3\)"),
    ({"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4, "original_max_position_embeddings": 8},
     r"set factor .* or attention_factor"),
    ({"type": "longrope", "short_factor": [1.0, 0.0, 1.0, 1.0], "long_factor": [1.0] * 4, "original_max_position_embeddings": 8, "factor": 2.0},
     r"short_factor\[1\]: Input should be greater than 0"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 1.0, "beta_slow": 2.0},
     r"beta_fast \(1\.0\) must be at least beta_slow \(2\.0\)"),
    ({"type": "yarn", "factor": 4.0}, r"scaling\.original_max_position_embeddings: missing required key"),
    ({"type": "yarn", "factor": 0.5, "original_max_position_embeddings": 8}, r"factor: Input should be greater than or equal to 1"),
], ids=["longrope-length", "longrope-unequal", "longrope-no-factor", "longrope-zero", "yarn-betas", "yarn-no-context", "yarn-factor"])
def test_bad_scaling_is_refused_at_its_recipe_line(scaling, message):
    """tiny_model's heads are 8 features wide: LongRoPE needs 4 factors per list."""
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict({"name": "x", "model": tiny_model(kind="decoder", encoder=None, position={"type": "rotary", "scaling": scaling})})


def test_longrope_lists_are_checked_against_latent_attentions_rotary_part():
    """Latent attention rotates only its rope_dim (4) features per head: two factors, not (d_h + r) / 2."""
    spec = tiny_model(kind="decoder", encoder=None, position={"type": "rotary", "scaling": {
        "type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [2.0, 3.0], "original_max_position_embeddings": 8, "factor": 2.0}})
    spec["attention"] = {"type": "latent", "heads": 2, "head_dim": 8, "rope_dim": 4}
    model = tfbuilder.build_model(ModelSection.model_validate(spec))
    model(torch.randint(1, 53, (1, 10)))  # past the context: the long factors
    spec["attention"]["rope_dim"] = 6
    with pytest.raises(RecipeError, match="have 2 entries; the 6 rotated features per head make 3 pairs"):
        recipe_from_dict({"name": "x", "model": spec})


# --- DeepSeek-V3's attention under YaRN: cos/sin factor and softmax scale ------------------------------


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("rope", [
    {"factor": 40.0, "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0},
    {"factor": 8.0, "original_max_position_embeddings": 16, "mscale": 0.707, "mscale_all_dim": 1.0},
    {"factor": 4.0, "original_max_position_embeddings": 16},
], ids=["deepseek-v3", "mscales-differ", "no-mscale"])
def test_latent_attention_with_yarn_is_deepseek_v3s_attention(rope, pairing):
    """transformers' DeepseekV3Attention (eager, causal) with the same random weights: YaRN's frequencies
    on the decoupled rotary part, cos/sin times the attention factor, and the softmax scale times
    yarn_mscale(factor, mscale_all_dim)^2 (``yarn_apply_mscale``). DeepSeek's rope_interleave lays the
    rotated pairs out differently from our interleaved pairing; the scores are the same."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    torch.manual_seed(0)
    d, h, d_h, d_v, d_c, d_q, r, n = 32, 2, 8, 6, 12, 10, 8, 24
    config = transformers.DeepseekV3Config(
        hidden_size=d, num_attention_heads=h, num_key_value_heads=h, q_lora_rank=d_q, kv_lora_rank=d_c,
        qk_nope_head_dim=d_h, qk_rope_head_dim=r, v_head_dim=d_v, max_position_embeddings=640,
        rope_interleave=pairing == "interleaved", rope_parameters={"rope_type": "yarn", "rope_theta": BASE} | rope,
        attn_implementation="eager",
    )
    theirs = DeepseekV3Attention(config, layer_idx=0).eval()
    for norm in (theirs.q_a_layernorm, theirs.kv_a_layernorm):
        torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    ctx = BuildContext(d_model=d, causal=True, heads=h, head_dim=d_h + r)
    position = RotaryPosition(RotaryPosition.Params(base=BASE, pairing=pairing, max_len=8, scaling={"type": "yarn"} | rope), ctx)
    params = LatentAttention.Params(heads=h, head_dim=d_h, value_dim=d_v, kv_rank=d_c, q_rank=d_q, rope_dim=r)
    mla = LatentAttention(params, BuildContext(d_model=d, causal=True, heads=h, head_dim=d_h + r, position=position)).eval()
    pairs = [("to_q_latent", "q_a_proj"), ("norm_q", "q_a_layernorm"), ("to_q", "q_b_proj"),
             ("to_kv_latent", "kv_a_proj_with_mqa"), ("norm_kv", "kv_a_layernorm"), ("to_kv", "kv_b_proj"), ("to_out", "o_proj")]
    mla.load_state_dict({f"{o}.{k}": v for o, t in pairs for k, v in getattr(theirs, t).state_dict().items()})
    x = torch.randn(2, n, d)
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        cos_sin = DeepseekV3RotaryEmbedding(config)(x, torch.arange(n)[None])
        want, _ = theirs(x, position_embeddings=cos_sin, attention_mask=mask)
        torch.testing.assert_close(mla(x), want, atol=1e-5, rtol=1e-4)
    assert mla.scale == pytest.approx(theirs.scaling, rel=1e-12)
