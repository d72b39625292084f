"""The component contract: every registered type satisfies it; a plugin whose params and modules are
named differently from the built-ins works through it, and one that does not satisfy it is refused
when it registers, with what it lacks named."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field
from torch import Tensor, nn

import tfbuilder
from conftest import tiny_model
from tfbuilder import contracts, registry
from tfbuilder.model.blocks import Residual
from tfbuilder.contracts import AttentionParams, AttentionShape, FeedForwardBase, KVCache
from tfbuilder.interop.hf.weights import split_sizes
from tfbuilder.spec.recipe import ModelSection
from tfbuilder.registry import BuildContext, ComponentParams, RegistryError

D_MODEL = 64


class PluginAttention(contracts.AttentionBase, nn.Module):
    """A test-only attention whose params say ``n_heads`` and ``head_width`` (Vaswani et al. 2017)."""

    class Params(AttentionParams):
        type: Literal["plugin_attention_test"] = "plugin_attention_test"
        n_heads: int = Field(4, ge=1, description="query heads")
        head_width: int = Field(8, ge=2, description="query/key/value width per head")

        def shape(self, d_model: int) -> AttentionShape:
            return AttentionShape(heads=self.n_heads, key_dim=self.head_width)

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.heads, self.key_dim = params.n_heads, params.head_width
        self.cross, self.causal = ctx.cross, ctx.causal
        self.pos = None if ctx.cross else ctx.position
        inner = self.heads * self.key_dim
        self.q, self.kv = nn.Linear(ctx.d_model, inner), nn.Linear(ctx.d_model, 2 * inner)
        self.proj_out = nn.Linear(inner, ctx.d_model)

    def output_projections(self) -> list[nn.Linear]:
        return [self.proj_out]

    def fused_widths(self) -> dict[str, list[int]]:
        return {"kv": [self.heads * self.key_dim] * 2}

    def forward(self, x: Tensor, *, context: Tensor | None = None, mask: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        source = context if self.cross else x
        q = rearrange(self.q(x), "b i (h k) -> b h i k", h=self.heads)
        k, v = (rearrange(t, "b j (h k) -> b h j k", h=self.heads) for t in self.kv(source).chunk(2, dim=-1))
        offset = 0
        if cache is not None and not self.cross:
            offset = cache["k"].shape[2] if "k" in cache else 0
        if self.pos is not None and self.pos.rotates:
            q, k = self.pos.rotate(q, offset), self.pos.rotate(k, offset)
        if cache is not None and not self.cross and "k" in cache:
            k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
        if cache is not None and not self.cross:
            cache["k"], cache["v"] = k, v
        scores = q @ k.transpose(-2, -1) / self.key_dim**0.5
        if self.pos is not None and self.pos.biases:
            scores = scores + self.pos.bias(q.shape[2], k.shape[2], offset, self.heads)
        if self.causal and not self.cross:
            i = torch.arange(offset, offset + q.shape[2])[:, None]
            scores = scores.masked_fill(torch.arange(k.shape[2])[None] > i, float("-inf"))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return self.proj_out(rearrange(F.softmax(scores, -1) @ v, "b h i k -> b i (h k)"))


class PluginFFN(FeedForwardBase, nn.Module):
    """A test-only feed-forward whose output projection is called ``down`` (Vaswani et al. 2017)."""

    class Params(ComponentParams):
        type: Literal["plugin_ffn_test"] = "plugin_ffn_test"
        width: int = Field(256, ge=1, description="inner width")

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.up, self.down = nn.Linear(ctx.d_model, params.width), nn.Linear(params.width, ctx.d_model)

    def output_projections(self) -> list[nn.Linear]:
        return [self.down]

    def forward(self, x: Tensor) -> Tensor:
        return self.down(torch.relu(self.up(x)))


@pytest.fixture
def plugins():
    tfbuilder.register("attention", "plugin_attention_test")(PluginAttention)
    tfbuilder.register("ffn", "plugin_ffn_test")(PluginFFN)
    yield
    registry.unregister("attention", "plugin_attention_test")
    registry.unregister("ffn", "plugin_ffn_test")


def plugin_model(position: str, **changes) -> nn.Module:
    spec = tiny_model(
        kind="decoder", encoder=None, d_model=D_MODEL, position={"type": position},
        attention={"type": "plugin_attention_test", "n_heads": 4, "head_width": 8}, ffn={"type": "plugin_ffn_test"}, **changes,
    )
    return tfbuilder.build_model(ModelSection.model_validate(spec))


@pytest.mark.parametrize("position", ["alibi", "relative_bias", "rotary"])
def test_positions_inside_attention_are_built_for_the_plugins_declared_shape(plugins, position):
    model = plugin_model(position)
    built = model.embed.position
    if position == "alibi":
        assert built.slopes.shape == (4,)
    elif position == "relative_bias":
        assert built.heads == 4
    else:
        assert built.cos.shape[1] == 8  # the table covers the declared key width: not recomputed per call
    tokens = torch.randint(5, 53, (2, 7))
    logits = model(tokens)
    assert logits.shape == (2, 7, 53) and torch.isfinite(logits).all()
    # Incremental decoding through the plugin's cache gives the same last logits.
    cache = model.new_cache()
    model(tokens[:, :4], cache=cache)
    step = model(tokens[:, 4:], cache=cache, offset=4)
    torch.testing.assert_close(step, logits[:, 4:], atol=1e-5, rtol=1e-4)


def test_residual_scaling_reaches_a_plugins_output_projection(plugins):
    """GPT-2's scaling (std / sqrt(2 * layers)) reaches the projections the contract names, whatever
    they are called: the FFN's ``down``, the attention's ``proj_out``; the others keep std."""
    model = plugin_model("learned", decoder={"layers": 8}, init={"std": 0.02, "residual_scaling": True})
    layer = model.decoder.layers[0]
    scaled = 0.02 / 16**0.5
    assert layer.ffn.inner.down.weight.std().item() == pytest.approx(scaled, rel=0.1)
    assert layer.self_attn.inner.proj_out.weight.std().item() == pytest.approx(scaled, rel=0.15)
    assert layer.ffn.inner.up.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_exporters_split_what_the_plugin_says_it_fused(plugins):
    sizes = split_sizes(plugin_model("learned"), "gpt2")
    assert sizes["decoder.layers.0.self_attn.inner.kv.weight"] == [32, 32]


def test_a_plugin_that_does_not_satisfy_the_contract_is_refused_naming_what_it_lacks():
    class Bare(nn.Module):
        """A test-only attention written without the contract."""

        class Params(ComponentParams):
            type: Literal["bare_attention_test"] = "bare_attention_test"
            n_heads: int = Field(4, description="query heads")

        def __init__(self, params, ctx):
            super().__init__()
            self.n_heads = params.n_heads

        def forward(self, x, **kwargs):
            return x

    with pytest.raises(RegistryError) as refused:
        tfbuilder.register("attention", "bare_attention_test")(Bare)
    message = str(refused.value)
    assert message.startswith("Bare does not satisfy the attention contract")
    for member in ("heads", "key_dim", "output_projections", "fused_widths", "keeps_weights", "Params.shape"):
        assert f"{member} (" in message, member
    assert "forward (" not in message
    assert "bare_attention_test" not in registry.types("attention")

    class NoDown(FeedForwardBase, nn.Module):
        """A test-only feed-forward that does not say which projection ends it."""

        class Params(ComponentParams):
            type: Literal["no_down_test"] = "no_down_test"

        def forward(self, x):
            return x

    with pytest.raises(RegistryError, match=r"lacks output_projections \("):
        tfbuilder.register("ffn", "no_down_test")(NoDown)
    assert "no_down_test" not in registry.types("ffn")


@pytest.mark.parametrize(
    "family, name", [(family, name) for family in registry.FAMILIES for name in registry.types(family)]
)
def test_every_registered_component_satisfies_its_contract(family, name):
    entry = registry.get(family, name)
    assert contracts.missing(family, entry.cls) == []
    params = entry.params()
    heads = 4
    ctx = BuildContext(d_model=D_MODEL, heads=heads, head_dim=D_MODEL // heads)
    module = entry.cls(params, ctx)
    assert contracts.satisfies(family, module)
    if family == "attention":
        shape = params.shape(D_MODEL)
        assert (module.heads, module.key_dim) == (shape.heads, shape.key_dim)
        assert all(isinstance(p, nn.Linear) for p in module.output_projections())
    if family == "ffn":
        assert module.output_projections() and all(isinstance(p, nn.Linear) for p in module.output_projections())
    if family == "position":
        assert params.max_positions() is None or params.max_positions() >= 1


def test_residuals_hold_components_that_satisfy_the_contract():
    model = tfbuilder.build_model(ModelSection.model_validate(tiny_model()))
    for residual in (m for m in model.modules() if isinstance(m, Residual)):
        assert contracts.satisfies("attention", residual.inner) or contracts.satisfies("ffn", residual.inner)
