"""tfbuilder: declarative transformers from validated YAML recipes.

Public API: :func:`load_recipe`, :func:`build_model`, :func:`register`, :class:`Recipe`,
:class:`RecipeError`, :class:`ComponentParams`, :class:`BuildContext`.
"""

from .builder import build_model, count_parameters
from .errors import Problem, RecipeError
from .recipe import Recipe, json_schema, load_recipe
from .registry import BuildContext, ComponentParams, ModelDims, register

__version__ = "0.1.0"
__all__ = [
    "BuildContext",
    "ComponentParams",
    "ModelDims",
    "Problem",
    "Recipe",
    "RecipeError",
    "build_model",
    "count_parameters",
    "json_schema",
    "load_recipe",
    "register",
]
