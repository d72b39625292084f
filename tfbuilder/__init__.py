"""tfbuilder: declarative transformers from validated YAML recipes.

Public API: :func:`load_recipe`, :func:`recipe_from_dict`, :func:`build_model`, :func:`fit`, :func:`load_checkpoint`,
:func:`register`, :class:`Recipe`, :class:`RecipeError`, :class:`ComponentParams`, :class:`BuildContext`;
the component contract in :mod:`tfbuilder.contracts`.
"""

__version__ = "0.1.0"

from . import contracts
from .builder import build_model, count_parameters
from .errors import Problem, RecipeError
from .recipe import Recipe, json_schema, load_recipe, recipe_from_dict
from .registry import BuildContext, ComponentParams, ModelDims, register
from .runs import load_checkpoint


def fit(recipe: Recipe, **options):
    """Train a recipe through Lightning; returns a summary. ``options``: ``resume``, ``run_dir``,
    ``init_from``, ``on_step``, ``callbacks`` (Lightning callbacks) and ``loggers`` (Lightning
    loggers, beside metrics.csv) (see :func:`tfbuilder.training.fit`)."""
    from .training import fit as _fit  # Lightning is imported only when training

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
