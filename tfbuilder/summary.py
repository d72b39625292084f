"""The old name of :mod:`tfbuilder.module_tree` (the module tree ``tfbuilder show`` prints), kept only
while cli.py imports it from here; not to be confused with :class:`tfbuilder.training.Summary`.
Remove this file once cli.py reads ``from .module_tree import format_tree, tree``."""

from .module_tree import format_tree, tree

__all__ = ["format_tree", "tree"]
