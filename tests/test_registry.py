"""The registry: registration rules, third-party components from Python and from entry points."""

from __future__ import annotations

import importlib
import sys
import textwrap
from typing import Literal

import pytest
import torch
from pydantic import Field, ValidationError
from torch import nn

import tfbuilder
from conftest import tiny_model
from tfbuilder import registry
from tfbuilder.cli.commands import main
from tfbuilder.spec.recipe import ModelSection, json_schema
from tfbuilder.registry import ComponentParams, RegistryError
from tfbuilder.runs.checkpoints import CheckpointError, read_checkpoint


@pytest.fixture
def scaled_relu():
    """A third-party FFN registered from Python for the duration of a test."""

    @tfbuilder.register("ffn", "scaled_relu_test")
    class ScaledReLU(tfbuilder.contracts.FeedForwardBase, nn.Module):
        """A test-only feed-forward: relu(x) * scale."""

        class Params(ComponentParams):
            type: Literal["scaled_relu_test"] = "scaled_relu_test"
            scale: float = Field(2.0, gt=0, description="multiplies the output")

        def __init__(self, params, ctx):
            super().__init__()
            self.proj = nn.Linear(ctx.d_model, ctx.d_model)
            self.scale = params.scale

        def output_projections(self):
            return [self.proj]

        def forward(self, x):
            return torch.relu(self.proj(x)) * self.scale

    yield ScaledReLU
    registry.unregister("ffn", "scaled_relu_test")


def test_python_registration_is_usable_from_a_recipe(scaled_relu):
    spec = ModelSection.model_validate(tiny_model(ffn={"type": "scaled_relu_test", "scale": 3.0}))
    model = tfbuilder.build_model(spec)
    assert isinstance(model.encoder.layers[0].ffn.inner, scaled_relu)
    assert model.encoder.layers[0].ffn.inner.scale == 3.0
    # ... validated by its own params model, and visible to the schema and `components`.
    with pytest.raises(ValidationError, match="greater than 0"):
        ModelSection.model_validate(tiny_model(ffn={"type": "scaled_relu_test", "scale": -1}))
    ffn_schema = json_schema()["$defs"]["ModelSection"]["properties"]["ffn"]
    assert "scaled_relu_test" in str(ffn_schema)


def test_components_lists_the_plugin(scaled_relu, capsys):
    assert main(["components", "ffn"]) == 0
    out = capsys.readouterr().out
    assert "scaled_relu_test" in out and "multiplies the output" in out and "A test-only feed-forward" in out


def test_duplicate_registration_is_refused(scaled_relu):
    with pytest.raises(RegistryError, match="already registered"):

        @tfbuilder.register("ffn", "scaled_relu_test")
        class Again(nn.Module):
            class Params(ComponentParams):
                type: Literal["scaled_relu_test"] = "scaled_relu_test"


def test_builtin_names_cannot_be_taken():
    with pytest.raises(RegistryError, match="already registered"):

        @tfbuilder.register("attention", "multihead")
        class Impostor(nn.Module):
            class Params(ComponentParams):
                type: Literal["multihead"] = "multihead"


@pytest.mark.parametrize(
    "family, body, message",
    [
        ("colour", 'type: Literal["x"] = "x"', "unknown family"),
        ("ffn", 'type: Literal["other"] = "other"', "must be declared as"),
        ("ffn", "type: str = 'x'", "must be declared as"),
        ("ffn", 'type: Literal["x"] = "x"\n    width: int = 3', "needs a description"),
    ],
)
def test_malformed_components_are_refused(family, body, message):
    namespace: dict = {}
    source = (
        "from typing import Literal\nfrom tfbuilder.registry import ComponentParams\n"
        f"class Params(ComponentParams):\n    {body}\n"
    )
    # Each case's Params class is built from its one line above (without this file's __future__ flags).
    exec(compile(source, "<params>", "exec", dont_inherit=True), namespace)
    cls = type("Broken", (nn.Module,), {"Params": namespace["Params"]})
    with pytest.raises(RegistryError, match=message):
        tfbuilder.register(family, "x")(cls)
    assert "x" not in registry.types("ffn")


def test_a_class_without_params_is_refused():
    with pytest.raises(RegistryError, match="nested Params"):
        tfbuilder.register("norm", "nothing")(type("Nothing", (nn.Module,), {}))


def test_entry_point_plugin_registers_on_load(tmp_path, monkeypatch):
    """A package declaring the entry-point group `tfbuilder.components` is loaded, not named in YAML."""
    pkg = tmp_path / "tfb_plugin_demo.py"
    pkg.write_text(
        textwrap.dedent(
            '''
            from typing import Literal
            from pydantic import Field
            from torch import nn
            import tfbuilder

            @tfbuilder.register("norm", "demo_plugin_norm")
            class DemoNorm(nn.LayerNorm):
                """A plugin norm (test only)."""
                class Params(tfbuilder.ComponentParams):
                    type: Literal["demo_plugin_norm"] = "demo_plugin_norm"
                    eps: float = Field(1e-6, gt=0, description="stability")
                def __init__(self, params, ctx):
                    super().__init__(ctx.d_model, eps=params.eps)
            '''
        )
    )
    dist = tmp_path / "tfb_plugin_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tfb-plugin-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tfbuilder.components]\ndemo = tfb_plugin_demo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        assert "demo" in registry.load_plugins()
        assert "demo_plugin_norm" in registry.types("norm")
        spec = ModelSection.model_validate(tiny_model(norm={"type": "demo_plugin_norm"}))
        model = tfbuilder.build_model(spec)
        assert type(model.encoder.layers[0].ffn.norm).__name__ == "DemoNorm"
        # Checkpoints record who provides each component; without the package, loading says what to install.
        records = registry.provenance([params for _, params in spec.components()])
        assert {"family": "norm", "type": "demo_plugin_norm", "module": "tfb_plugin_demo", "package": "tfb-plugin-demo", "version": "1.0"} in records
        assert {"family": "attention", "type": "multihead", "module": "tfbuilder.model.components.attention", "package": "tfbuilder", "version": tfbuilder.__version__} in records
        ckpt = tmp_path / "plugin.ckpt"
        torch.save({"tfbuilder": {"recipe": {"model": spec.model_dump(mode="json")}, "vocab": "{}", "components": records}, "state_dict": {}}, ckpt)
        assert read_checkpoint(ckpt)["tfbuilder"]["components"] == records  # installed: loads
        registry.unregister("norm", "demo_plugin_norm")
        with pytest.raises(CheckpointError, match=r"norm type 'demo_plugin_norm' comes from the package tfb-plugin-demo 1\.0, which is not installed here: pip install 'tfb-plugin-demo==1\.0'"):
            read_checkpoint(ckpt)
        assert main(["test", str(ckpt)]) == 2
    finally:
        if "demo_plugin_norm" in registry.types("norm"):  # (unregistered above unless a check failed first)
            registry.unregister("norm", "demo_plugin_norm")
        sys.modules.pop("tfb_plugin_demo", None)


def test_a_broken_plugin_warns_and_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "tfb_broken_plugin.py").write_text("raise ImportError('missing dependency xyz')\n")
    dist = tmp_path / "tfb_broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tfb-broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tfbuilder.components]\nbroken = tfb_broken_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.warns(UserWarning, match="broken.*missing dependency xyz"):
        loaded = registry.load_plugins()
    assert "broken" not in loaded
