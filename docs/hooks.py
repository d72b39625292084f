"""MkDocs hook: the build fails while a generated reference page is stale.

The pages in ``docs/reference/`` are made by ``python -m tfbuilder.cli.reference`` from the recipe schema,
the component registry and the argument parser; a build that published them stale would document
keys, components or options that are not the code's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError


def on_pre_build(config: MkDocsConfig) -> None:
    """Check the reference pages against the code of this checkout (not another installed copy)."""
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from tfbuilder.cli import reference

    directory = Path(config.docs_dir) / "reference"
    stale = reference.stale(directory)
    if stale:
        names = ", ".join(f"reference/{name}" for name in stale)
        raise PluginError(f"stale generated pages: {names}; regenerate them with `{reference.COMMAND}`")
