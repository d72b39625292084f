"""Where a recipe's data lies: a ``data.path`` that exists only from the working directory, read there
for one release, with a warning.

The schema makes a recipe file's relative ``data.path`` relative to that file's folder, reading no
other file; here, before the data is read, the folder is looked at: where it does not exist but the
same relative path does from the working directory (as such paths were read before), that one is
used, and the warning says how to write it now."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from tfbuilder.spec.sections import DataSection


def locate(data: DataSection) -> None:
    """Settle ``data.path`` before the data is read: where the folder a recipe file names (relative to
    that file) does not exist but the same relative path does from the working directory, read that
    one (made absolute, so that the run's recorded recipe finds it from anywhere) and warn."""
    written = data.written_path
    if data.path is None or written is None or Path(data.path).exists():
        return
    old = Path(written.value)
    if not old.exists():
        return  # reading reports the folder the recipe means as missing
    found = old.absolute()
    try:
        new_form = os.path.relpath(found, Path(written.file).absolute().parent)
    except ValueError:  # another drive (Windows): only an absolute path names it
        new_form = str(found)
    warnings.warn(
        f"{written.file}: data.path {written.value!r} is relative to the recipe's folder, where it does not exist; "
        f"reading {found} (relative to the working directory, as before) instead. Relative paths in a recipe now "
        f"start at the recipe file: write data.path: {new_form} (this fallback will be removed in a later release)",
        FutureWarning,
        stacklevel=3,
    )
    data.relocate(str(found))


__all__ = ["locate"]
