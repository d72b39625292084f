"""tfbuilder: declarative transformers from validated YAML recipes.

Public API: :func:`load_recipe`, :func:`recipe_from_dict`, :func:`build_model`, :func:`fit`, :func:`load_checkpoint`,
:func:`register`, :class:`Recipe`, :class:`RecipeError`, :class:`ComponentParams`, :class:`BuildContext`;
the component contract in :mod:`tfbuilder.contracts`.
"""

from tfbuilder import contracts
from tfbuilder.data import pretrained as _pretrained
from tfbuilder.errors import Problem, RecipeError
from tfbuilder.model.builder import build_model, count_parameters
from tfbuilder.registry import BuildContext, ComponentParams, ModelDims, register
from tfbuilder.runs.checkpoints import load_checkpoint
from tfbuilder.spec import ports as _ports
from tfbuilder.spec.recipe import Recipe, json_schema, load_recipe, recipe_from_dict
from tfbuilder.version import __version__  # noqa: F401 (tfbuilder.__version__)

# The schema reads tokenizer files (data.tokenizer.path) through the data layer, below which it sits.
_ports.provide_tokenizer_files(_pretrained)


def fit(recipe: Recipe, **options):
    """Train a recipe through Lightning; returns a summary. ``options``: ``resume``, ``run_dir``,
    ``init_from``, ``on_step``, ``callbacks`` (Lightning callbacks) and ``loggers`` (Lightning
    loggers, beside metrics.csv) (see :func:`tfbuilder.train.fit.fit`)."""
    from tfbuilder.train.fit import fit as _fit  # deferred: start-up time (Lightning only when training)

    return _fit(recipe, **options)


__all__ = [
    "BuildContext",
    "ComponentParams",
    "ModelDims",
    "Problem",
    "Recipe",
    "RecipeError",
    "build_model",
    "contracts",
    "count_parameters",
    "fit",
    "load_checkpoint",
    "json_schema",
    "load_recipe",
    "recipe_from_dict",
    "register",
]
