"""The public Python API: recipes from dicts, fit with the user's own Lightning callbacks and loggers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger

import tfbuilder
from conftest import ONE_LAYER, QUICKSTART, ROOT, short_run


class StepCounter(Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.steps += 1


class Collecting(Logger):
    """A logger that keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[dict] = []
        self.params: dict = {}

    name = "collecting"
    version = "0"

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.params.update(params)

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append(dict(metrics))


def test_fit_passes_callbacks_and_loggers_through(tmp_path):
    counter, collecting = StepCounter(), Collecting()
    recipe = tfbuilder.load_recipe(QUICKSTART, ONE_LAYER + short_run(tmp_path, "trainer.max_steps=3", "trainer.val_every=3", train=64, val=8))
    summary = tfbuilder.fit(recipe, callbacks=[counter], loggers=[collecting])
    assert counter.steps == summary.steps == 3
    assert any("val_loss" in m for m in collecting.metrics) and any("train_loss" in m for m in collecting.metrics)
    assert collecting.params["model.d_model"] == 32
    with open(Path(summary.run_dir) / "metrics.csv") as f:
        assert any(row.get("val_loss") for row in csv.DictReader(f))  # still written


@pytest.mark.parametrize("options, message", [
    ({"callbacks": StepCounter()}, r"fit\(callbacks=...\) takes a list of Lightning Callback objects"),
    ({"loggers": [object()]}, r"fit\(loggers=...\)\[0\] is a object, not a Lightning Logger"),
])
def test_fit_refuses_what_lightning_would_not_take(tmp_path, options, message):
    recipe = tfbuilder.load_recipe(QUICKSTART, short_run(tmp_path))
    with pytest.raises(tfbuilder.errors.TfbuilderError, match=message):
        tfbuilder.fit(recipe, **options)
    assert not (tmp_path / "runs").exists()


def test_recipe_from_dict_validates_with_dotted_paths():
    data = {
        "name": "from-python",
        "model": {"kind": "decoder", "vocab_size": 40, "d_model": 16, "attention": {"type": "multihed", "heads": 2}, "decoder": {"layers": 1}},
        "trainer": {"max_step": 3},
    }
    with pytest.raises(tfbuilder.RecipeError) as caught:
        tfbuilder.recipe_from_dict(data)
    assert [str(p) for p in caught.value.problems] == [
        "model.attention: unknown attention type 'multihed'; did you mean 'multihead'?",
        "trainer.max_step: unknown key 'max_step'; did you mean 'max_steps'?",
    ]
    data["model"]["attention"]["type"] = "multihead"
    del data["trainer"]
    recipe = tfbuilder.recipe_from_dict(data, ["trainer.max_steps=7"])
    assert recipe.model.d_model == 16 and recipe.trainer.max_steps == 7


def test_recipe_from_dict_extends_a_recipe_file():
    recipe = tfbuilder.recipe_from_dict({"name": "mine", "extends": "quickstart.yaml", "model": {"d_model": 32}}, base=ROOT / "recipes")
    assert (recipe.name, recipe.model.d_model, recipe.data.task) == ("mine", 32, "copy")
    with pytest.raises(tfbuilder.RecipeError, match="extends a file that does not exist|no such recipe file"):
        tfbuilder.recipe_from_dict({"name": "mine", "extends": "absent.yaml"}, base=ROOT / "recipes")
