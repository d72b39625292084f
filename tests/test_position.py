"""Every registered position type, past its precomputed table and in both directions, against the
papers' formulas written out here (not the implementation's code): sinusoids (Vaswani et al. 2017,
sec. 3.5), rotary (Su et al. 2021, eq. 34), ALiBi (Press et al. 2022) and T5's relative buckets
(Raffel et al. 2020; Hugging Face's ``_relative_position_bucket``, written out below)."""

from __future__ import annotations

import math

import pytest
import torch

import tfbuilder
from conftest import tiny_model
from tfbuilder import registry
from tfbuilder.spec.recipe import ModelSection
from tfbuilder.registry import BuildContext

D, HEADS, TABLE = 8, 2, 4  # a table of 4 positions; the checks run to position 14


def position(name: str, *, causal: bool = True, heads: int = HEADS, **params) -> torch.nn.Module:
    ctx = BuildContext(d_model=D, causal=causal, heads=heads)
    return registry.build("position", registry.get("position", name).params(**params), ctx)


def sinusoid(pos: int, d: int, base: float = 10000.0) -> list[float]:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""
    return [(math.sin if c % 2 == 0 else math.cos)(pos / base ** (2 * (c // 2) / d)) for c in range(d)]


def rotated(x: list[float], pos: int, *, base: float, pairing: str) -> list[float]:
    """RoFormer's rotation of one query or key ``x`` at ``pos``: the pair of features (a, b) number i
    turns by the angle pos * base^(-2i/k). ``interleaved`` pairs (x_2i, x_2i+1), the paper's;
    ``half`` pairs (x_i, x_i+k/2), GPT-NeoX's and Llama's."""
    k, out = len(x), list(x)
    for i in range(k // 2):
        a, b = (2 * i, 2 * i + 1) if pairing == "interleaved" else (i, i + k // 2)
        theta = pos * base ** (-2 * i / k)
        out[a] = x[a] * math.cos(theta) - x[b] * math.sin(theta)
        out[b] = x[a] * math.sin(theta) + x[b] * math.cos(theta)
    return out


def alibi(query: int, key: int, head: int, heads: int, *, causal: bool) -> float:
    """-m_h * (query - key), m_h = 2^(-8(h+1)/heads) for heads a power of two (Press et al. 2022);
    the distance |query - key| in encoders, which see both sides. Causal keys after the query are
    masked anyway: they get 0."""
    slope = 2.0 ** (-8 * (head + 1) / heads)
    return -slope * (abs(query - key) if not causal else max(query - key, 0))


def t5_bucket(relative: int, *, bidirectional: bool, buckets: int, max_distance: int) -> int:
    """Bucket of key position minus query position (Raffel et al. 2020; HF's _relative_position_bucket):
    bidirectional, half the buckets for keys after the query; distances below half of (the remaining)
    buckets are exact, then log-spaced up to ``max_distance``, then the last bucket."""
    offset = 0
    if bidirectional:
        buckets //= 2
        offset = buckets if relative > 0 else 0
        distance = abs(relative)
    else:
        distance = max(-relative, 0)  # keys after the query: masked, bucket 0
    exact = buckets // 2
    if distance < exact:
        return offset + distance
    spaced = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (buckets - exact))
    return offset + min(spaced, buckets - 1)


def check_sinusoidal(offset: int, n: int) -> None:
    module = position("sinusoidal", max_len=TABLE)
    got = module(torch.zeros(1, n, D), offset=offset)[0]
    want = torch.tensor([sinusoid(p, D) for p in range(offset, offset + n)])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def check_learned(offset: int, n: int) -> None:
    module = position("learned", max_len=TABLE)
    x = torch.zeros(1, n, D)
    if offset + n <= TABLE:
        torch.testing.assert_close(module(x, offset=offset)[0], module.table.weight[offset : offset + n].detach())
        return
    with pytest.raises(ValueError, match=rf"sequence of {offset + n} positions exceeds learned max_len \({TABLE}\)"):
        module(x, offset=offset)


def check_none(offset: int, n: int) -> None:
    x = torch.randn(1, n, D)
    assert torch.equal(position("none")(x, offset=offset), x)


def check_rotary(offset: int, n: int) -> None:
    for pairing, base in (("interleaved", 10000.0), ("half", 500.0)):
        module = position("rotary", max_len=TABLE, pairing=pairing, base=base)
        x = torch.randn(1, HEADS, n, D // HEADS)
        want = [[rotated(x[0, h, t].tolist(), offset + t, base=base, pairing=pairing) for t in range(n)] for h in range(HEADS)]
        torch.testing.assert_close(module.rotate(x, offset), torch.tensor([want]), atol=1e-5, rtol=0)


def check_alibi(offset: int, n: int) -> None:
    for causal in (True, False):
        got = position("alibi", causal=causal).bias(n, offset + n, offset, HEADS)
        want = [[[alibi(offset + i, j, h, HEADS, causal=causal) for j in range(offset + n)] for i in range(n)] for h in range(HEADS)]
        torch.testing.assert_close(got, torch.tensor([want]))


def check_relative_bias(offset: int, n: int) -> None:
    for causal in (True, False):
        module = position("relative_bias", causal=causal, buckets=8, max_distance=6)
        torch.nn.init.normal_(module.table.weight)
        got = module.bias(n, offset + n, offset, HEADS)
        table = module.table.weight.detach()
        want = [
            [[table[t5_bucket(j - (offset + i), bidirectional=not causal, buckets=8, max_distance=6), h] for j in range(offset + n)] for i in range(n)]
            for h in range(HEADS)
        ]
        torch.testing.assert_close(got, torch.tensor([want]))


PAST_THE_TABLE = {
    "sinusoidal": check_sinusoidal,
    "learned": check_learned,
    "none": check_none,
    "rotary": check_rotary,
    "alibi": check_alibi,
    "relative_bias": check_relative_bias,
}


def test_every_position_type_has_a_reference_here():
    assert sorted(PAST_THE_TABLE) == sorted(registry.types("position"))


@pytest.mark.parametrize("name", registry.types("position"))
@pytest.mark.parametrize("offset, n", [(0, 3), (0, 15), (2, 5), (10, 5)], ids=["in-table", "across", "to-the-edge-and-past", "past"])
def test_position_is_the_papers_formula_past_its_table(name, offset, n):
    """Positions offset..offset+n-1 (a cache offset when decoding) with a table of 4: in it, across its
    end and wholly past it, the paper's formula; a learned table refuses past its end, naming it."""
    PAST_THE_TABLE[name](offset, n)


def test_rotary_beyond_the_table_keeps_its_tables_width():
    """Past the table, the angles are those of the key width, not the table's (a stack may have its own heads)."""
    module = position("rotary", max_len=TABLE)
    x = torch.randn(1, 1, 6, 6)  # width 6, the table was made for 4
    want = [[[rotated(x[0, 0, t].tolist(), t, base=10000.0, pairing="interleaved") for t in range(6)]]]
    torch.testing.assert_close(module.rotate(x, 0), torch.tensor(want), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["sinusoidal", "rotary", "alibi", "relative_bias", "none"])
def test_cached_decoding_past_the_table_gives_the_full_forwards_logits(name):
    """A decoder-only model whose positions table (if any) holds 4, decoding 12 tokens one at a time
    with a key/value cache: each step's logits equal those of one forward over the whole sequence,
    and those equal the logits of the same weights with a table long enough for all 12."""
    params = {"type": name} | ({"max_len": TABLE} if name in ("sinusoidal", "rotary") else {})
    short = tfbuilder.build_model(ModelSection.model_validate(tiny_model(kind="decoder", encoder=None, position=params))).eval()
    if name == "relative_bias":
        torch.nn.init.normal_(short.embed.position.table.weight)
    long = tfbuilder.build_model(ModelSection.model_validate(tiny_model(kind="decoder", encoder=None, position={"type": name}))).eval()
    long.load_state_dict(short.state_dict())  # tables are not state: only the weights move
    tokens = torch.randint(1, 53, (2, 12))
    with torch.no_grad():
        full = short(tokens)
        torch.testing.assert_close(full, long(tokens), atol=1e-5, rtol=1e-5)
        cache = short.new_cache()
        steps = [short(tokens[:, t : t + 1], cache=cache, offset=t) for t in range(12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_learned_positions_refuse_to_decode_past_their_table():
    model = tfbuilder.build_model(
        ModelSection.model_validate(tiny_model(kind="decoder", encoder=None, position={"type": "learned", "max_len": TABLE}))
    ).eval()
    cache = model.new_cache()
    tokens = torch.randint(1, 53, (1, TABLE + 1))
    with torch.no_grad():
        for t in range(TABLE):
            model(tokens[:, t : t + 1], cache=cache, offset=t)
        with pytest.raises(ValueError, match=r"exceeds learned max_len \(4\)"):
            model(tokens[:, TABLE:], cache=cache, offset=TABLE)


@pytest.mark.parametrize("heads", [4, 8, 6], ids=["4", "8", "6-not-a-power-of-two"])
def test_alibi_penalises_both_directions_alike_in_encoders(heads):
    """Encoders see keys on both sides: -m_h |i - j|, symmetric, growing with distance either way;
    decoders penalise only the keys behind (those ahead are masked)."""
    both = position("alibi", causal=False, heads=heads).bias(9, 9, 0, heads)[0]
    torch.testing.assert_close(both, both.transpose(-2, -1))
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)]) if heads != 6 else None
    distance = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).abs()
    if slopes is not None:
        torch.testing.assert_close(both, -slopes[:, None, None] * distance)
    assert (both[:, 4, 5:].diff(dim=-1) < 0).all() and (both[:, 4, :4].diff(dim=-1) > 0).all()
    causal = position("alibi", causal=True, heads=heads).bias(9, 9, 0, heads)[0]
    torch.testing.assert_close(causal.tril(), both.tril())


@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 20), (12, 30), (4, 3)])
def test_t5_bidirectional_buckets_split_by_sign_and_are_log_spaced(buckets, max_distance):
    """Encoder buckets: keys before the query take buckets 0..B/2-1, keys after it B/2..B-1, each half
    exact up to B/4 and log-spaced to max_distance; decoder buckets: all B for keys behind."""
    for causal in (False, True):
        module = position("relative_bias", causal=causal, buckets=buckets, max_distance=max_distance)
        relative = torch.arange(-3 * max_distance, 3 * max_distance + 1)
        want = [t5_bucket(r, bidirectional=not causal, buckets=buckets, max_distance=max_distance) for r in relative.tolist()]
        assert module.bucket(relative).tolist() == want
    half = buckets // 2
    module = position("relative_bias", causal=False, buckets=buckets, max_distance=max_distance)
    ahead, behind = module.bucket(torch.arange(1, 500)), module.bucket(-torch.arange(1, 500))
    assert ahead.min() == half + 1 and ahead.max() == buckets - 1  # keys after the query: the upper half
    assert behind.min() == 1 and behind.max() == half - 1  # keys before it: the lower half (0 is distance 0)
    assert module.bucket(torch.tensor([0])).item() == 0


def test_relative_bias_needs_room_for_exact_and_log_spaced_buckets():
    """With max_distance not past the exact buckets, the log spacing would divide by log(1) or go
    negative (an index error mid-training); with fewer than 4 buckets an encoder has no exact one."""
    from tfbuilder.errors import RecipeError

    for position_params, field in [({"buckets": 32, "max_distance": 16}, "max_distance"), ({"buckets": 3}, "buckets")]:
        with pytest.raises(RecipeError, match=rf"position\.{field}"):
            tfbuilder.spec.recipe.recipe_from_dict({"name": "x", "model": tiny_model(position={"type": "relative_bias", **position_params})})
    ModelSection.model_validate(tiny_model(position={"type": "relative_bias", "buckets": 4, "max_distance": 3}))


# --- rotary's knobs: partial rotary (fraction) and frequency scaling -----------------------------------


def llama3_frequency(f: float, *, factor: float, low: float, high: float, context: int) -> float:
    """Llama 3.1's scaling of one frequency f (Meta's llama-models ``apply_scaling``): wavelengths 2 pi / f
    shorter than context / high keep f; longer than context / low get f / factor; in between, with
    s = (context / wavelength - low) / (high - low), (1 - s) f / factor + s f."""
    wavelength = 2 * math.pi / f
    if wavelength < context / high:
        return f
    if wavelength > context / low:
        return f / factor
    s = (context / wavelength - low) / (high - low)
    return (1 - s) * f / factor + s * f


def rotated_by(x: list[float], pos: int, frequencies: list[float], *, pairing: str, width: int) -> list[float]:
    """The first ``width`` features of ``x`` rotated pair i by pos * frequencies[i] (pairs of ``rotated``,
    within those features); the others unchanged (GPT-NeoX's partial rotary)."""
    out = list(x)
    for i, f in enumerate(frequencies):
        a, b = (2 * i, 2 * i + 1) if pairing == "interleaved" else (i, i + width // 2)
        out[a] = x[a] * math.cos(pos * f) - x[b] * math.sin(pos * f)
        out[b] = x[a] * math.sin(pos * f) + x[b] * math.cos(pos * f)
    return out


ROTARY_KNOBS = {
    "fraction": ({"fraction": 0.5}, lambda f: f),
    "linear": ({"scaling": {"type": "linear", "factor": 4.0}}, lambda f: f / 4.0),
    "llama3": (
        {"scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 40}},
        lambda f: llama3_frequency(f, factor=8.0, low=1.0, high=4.0, context=40),
    ),
    "fraction and llama3": (
        {"fraction": 0.75, "scaling": {"type": "llama3", "factor": 3.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0, "original_max_position_embeddings": 40}},
        lambda f: llama3_frequency(f, factor=3.0, low=2.0, high=8.0, context=40),
    ),
}


@pytest.mark.parametrize("knob", ROTARY_KNOBS)
@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("offset, n", [(0, 3), (0, 15), (10, 5)], ids=["in-table", "across", "past"])
def test_rotary_knobs_are_their_published_formulas_in_and_past_the_table(knob, pairing, offset, n):
    """Of a head of 16 features, the first int(fraction * 16) rotate with frequencies base^(-2i/width),
    scaled (positions over factor; Llama 3.1's per-wavelength rule, its three regimes all present at
    base 10000 and a trained context of 40); the rest pass unchanged. Same in the table and past it."""
    params, scale = ROTARY_KNOBS[knob]
    k, base = 16, 10000.0
    width = int(params.get("fraction", 1.0) * k)
    module = registry.build("position", registry.get("position", "rotary").params(max_len=TABLE, pairing=pairing, **params),
                            BuildContext(d_model=2 * k, causal=True, heads=2))
    frequencies = [scale(base ** (-2 * i / width)) for i in range(width // 2)]
    x = torch.randn(1, 2, n, k)
    want = [[rotated_by(x[0, h, t].tolist(), offset + t, frequencies, pairing=pairing, width=width) for t in range(n)] for h in range(2)]
    torch.testing.assert_close(module.rotate(x, offset), torch.tensor([want]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_half_the_features_rotating_is_full_rotary_of_half_the_width(pairing):
    """fraction 0.5: the last half of each head is untouched, the first half is rotary of width k/2."""
    partial = position("rotary", max_len=TABLE, pairing=pairing, fraction=0.5)
    full = position("rotary", max_len=TABLE, pairing=pairing)
    x = torch.randn(2, HEADS, 9, 8)  # past the table of 4, too
    got = partial.rotate(x, 3)
    assert torch.equal(got[..., 4:], x[..., 4:])
    torch.testing.assert_close(got[..., :4], full.rotate(x[..., :4].contiguous(), 3))


def rotate_as_before(x: torch.Tensor, offset: int, *, base: float, pairing: str) -> torch.Tensor:
    """RotaryPosition.rotate as it was before fraction and scaling (on the fly), to compare bit for bit."""
    n, k = x.shape[-2], x.shape[-1]
    inv_freq = base ** (-torch.arange(0, k, 2, dtype=torch.float32) / k)
    angles = torch.arange(offset, offset + n, dtype=torch.float32)[:, None] * inv_freq
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if pairing == "half":
        first, second = x[..., : k // 2], x[..., k // 2 :]
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


@pytest.mark.parametrize("params", [{}, {"fraction": 1.0, "scaling": None}, {"scaling": {"type": "linear", "factor": 1.0}}], ids=["defaults", "explicit", "linear-1"])
@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_rotary_knobs_at_their_defaults_change_nothing(params, pairing):
    """fraction 1 and no scaling (or a linear factor of 1) rotate exactly as before the knobs existed,
    in the table and past it."""
    module = position("rotary", max_len=TABLE, pairing=pairing, **params)
    x = torch.randn(1, HEADS, 12, 4)
    for offset in (0, 2, 9):
        assert torch.equal(module.rotate(x[..., : 12 - offset, :], offset), rotate_as_before(x[..., : 12 - offset, :], offset, base=10000.0, pairing=pairing))


def test_rotary_knobs_bounds_are_validation_errors():
    from pydantic import ValidationError

    params = registry.get("position", "rotary").params
    for bad in ({"fraction": 0.0}, {"fraction": 1.5}, {"scaling": {"type": "linear", "factor": 0.5}},
                {"scaling": {"type": "dynamic", "factor": 2.0}}, {"scaling": {"factor": 2.0}},
                {"scaling": {"type": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 4.0}},
                {"scaling": {"type": "llama3", "original_max_position_embeddings": 2**32}},
                {"scaling": {"type": "linear", "factor": 2.0, "extra": 1}}):
        with pytest.raises(ValidationError):
            params.model_validate({"type": "rotary"} | bad)


def test_an_odd_rotated_width_is_refused_when_rotating():
    module = position("rotary", fraction=0.5)
    with pytest.raises(ValueError, match="rotates 3 features, which must be even"):
        module.rotate(torch.randn(1, 1, 2, 6), 0)


@pytest.mark.parametrize("params", [{"fraction": 0.5, "pairing": "half"}, {"scaling": {"type": "llama3", "original_max_position_embeddings": 4}}], ids=["fraction", "llama3"])
def test_cached_decoding_with_rotary_knobs_past_the_table_gives_the_full_forwards_logits(params):
    """As above for rotary with its knobs: a table of 4, 12 tokens decoded one at a time."""
    spec = tiny_model(kind="decoder", encoder=None, position={"type": "rotary", "max_len": TABLE} | params)
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    tokens = torch.randint(1, 53, (2, 12))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, t : t + 1], cache=cache, offset=t) for t in range(12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
