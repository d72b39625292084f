"""What the schema asks of the layers above it, as small typed ports.

The schema reads no file but the recipe's YAML. Where a recipe names a tokenizer file, validating it
needs the file's vocabulary size and special ids: the schema asks :func:`tokenizer_files` for them,
and the data layer's implementation (:mod:`tfbuilder.data.pretrained`) is set up by
``tfbuilder/__init__.py`` through :func:`provide_tokenizer_files`. (Importing any ``tfbuilder.spec``
module imports the ``tfbuilder`` package first, so the port is always set up when a recipe is validated.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Facts:
    """What a recipe needs to know of a tokenizer file: its size and special ids (role -> id or None)."""

    vocab_size: int
    found: dict[str, int | None]


class TokenizerFiles(Protocol):
    """Reads tokenizer files for the schema (``kind`` is ``pretrained`` or ``sentencepiece``)."""

    def facts(self, kind: str, path: str | Path, named: dict[str, str | None] | None = None) -> Facts | None:
        """The file's size and specials, or None when it cannot be read."""
        ...

    def unreadable(self, kind: str, path: str | Path, named: dict[str, str | None] | None = None) -> str:
        """Why the file cannot be used (for a recipe problem)."""
        ...

    def exists(self, path: str | Path) -> bool:
        """Whether anything is at ``path`` (a stat; nothing is read)."""
        ...


_tokenizer_files: TokenizerFiles | None = None


def provide_tokenizer_files(files: TokenizerFiles) -> None:
    """Set the implementation the schema reads tokenizer files through."""
    global _tokenizer_files
    _tokenizer_files = files


def tokenizer_files() -> TokenizerFiles:
    if _tokenizer_files is None:
        raise RuntimeError(
            "no tokenizer-file reader is set up (tfbuilder/__init__.py provides tfbuilder.data.pretrained)"
        )
    return _tokenizer_files


__all__ = ["Facts", "TokenizerFiles", "provide_tokenizer_files", "tokenizer_files"]
