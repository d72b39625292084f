"""--plugins: user code registering components, named on the command line, recorded in checkpoints."""

from __future__ import annotations

import pytest

from conftest import ONE_LAYER, QUICKSTART, short_run
from tfbuilder import plugins, registry
from tfbuilder.cli.commands import main
from tfbuilder.runs.checkpoints import read_checkpoint

PLUGIN = '''
from typing import Literal

from pydantic import Field
from torch import nn

import tfbuilder


@tfbuilder.register("ffn", "halfmlp")
class HalfMLP(nn.Module):
    """A two-layer MLP of width d_model / 2 (a test plugin)."""

    class Params(tfbuilder.ComponentParams):
        type: Literal["halfmlp"] = "halfmlp"
        scale: float = Field(1.0, gt=0, description="multiplies the output")

    def __init__(self, params, ctx):
        super().__init__()
        self.scale = params.scale
        self.ff_in = nn.Linear(ctx.d_model, ctx.d_model // 2)
        self.ff_out = nn.Linear(ctx.d_model // 2, ctx.d_model)

    def output_projections(self):
        return [self.ff_out]

    def fused_widths(self):
        return {}

    def forward(self, x):
        return self.ff_out(self.ff_in(x).relu()) * self.scale
'''


@pytest.fixture
def plugin(tmp_path):
    """A plugin file; what it registered is forgotten afterwards, as if the process ended."""
    path = tmp_path / "half_mlp.py"
    path.write_text(PLUGIN)
    yield path
    if "halfmlp" in registry.types("ffn"):
        registry.unregister("ffn", "halfmlp")
    plugins._loaded.clear()


def sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def test_a_plugin_file_registers_a_component_for_validate_fit_and_test(tmp_path, plugin, capsys):
    recipe = ONE_LAYER + short_run(tmp_path, "trainer.max_steps=2", "trainer.val_every=2", train=64, val=8) + ["model.ffn={type: halfmlp, scale: 0.5}"]
    assert main(["validate", str(QUICKSTART), *sets(*recipe)]) == 2  # without the plugin: an unknown type
    assert "model.ffn: unknown ffn type 'halfmlp'" in capsys.readouterr().err

    assert main(["validate", str(QUICKSTART), *sets(*recipe), "--plugins", str(plugin)]) == 0
    assert main(["fit", str(QUICKSTART), *sets(*recipe), "--plugins", str(plugin)]) == 0
    (run_dir,) = (tmp_path / "runs" / "quickstart").iterdir()
    records = read_checkpoint(run_dir)["tfbuilder"]["components"]
    assert {"family": "ffn", "type": "halfmlp", "plugin": str(plugin.resolve())}.items() <= next(r for r in records if r["type"] == "halfmlp").items()
    assert all("plugin" not in r for r in records if r["type"] != "halfmlp")
    capsys.readouterr()
    assert main(["test", str(run_dir), "--split", "val", "--plugins", str(plugin)]) == 0
    assert "perplexity" in capsys.readouterr().out

    registry.unregister("ffn", "halfmlp")  # a new process, without the plugin
    plugins._loaded.clear()
    assert main(["test", str(run_dir), "--split", "val"]) == 2
    err = capsys.readouterr().err
    assert f"ffn type 'halfmlp' was registered by the plugin {plugin.resolve()}, which is not loaded" in err
    assert f"that path comes from the checkpoint, and --plugins runs the file's code: read it first, and if you trust it, pass --plugins {plugin.resolve()}" in err


def test_plugins_that_cannot_load_are_named(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import tfbuilder\n\ntfbuilder.register('ffn', 'nothing')(object)\n")  # fails inside tfbuilder
    for spec, message in (
        (str(tmp_path / "absent.py"), "absent.py: no such file"),
        ("no_such_module_here", "--plugins no_such_module_here: no such module"),
        (str(broken), f"failed to import: {broken}:3: RegistryError: object must define a nested Params"),
    ):
        assert main(["validate", str(QUICKSTART), "--plugins", spec]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("code", ["import sys\nsys.exit(0)\n", "raise SystemExit('bye')\n", "import sys\nsys.exit()\n"])
def test_a_plugin_that_exits_while_imported_is_an_error_naming_it(tmp_path, capsys, code):
    exits = tmp_path / "exits.py"
    exits.write_text(code)
    try:
        assert main(["validate", str(QUICKSTART), "--plugins", str(exits)]) == 2
    finally:
        plugins._loaded.clear()
    err = capsys.readouterr().err
    assert f"--plugins {exits}: its code called sys.exit(" in err and "Traceback" not in err


def test_the_help_of_every_command_says_plugins_run_code(capsys):
    for command in ("validate", "fit", "test", "translate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "runs the file's code: pass only files you trust" in " ".join(capsys.readouterr().out.split())
