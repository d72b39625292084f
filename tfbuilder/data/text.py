"""Reading text: one sentence per line, plain or gzipped, checked before anything trains."""

from __future__ import annotations

import gzip
from pathlib import Path

from .tokenizers import DataError


def find(directory: Path, stem: str, lang: str) -> Path:
    """``<directory>/<stem>.<lang>`` or its ``.gz``; a clear error naming both when neither exists."""
    plain = directory / f"{stem}.{lang}"
    for candidate in (plain, plain.with_name(plain.name + ".gz")):
        if candidate.is_file():
            return candidate
    if not directory.is_dir():
        raise DataError(f"data directory {directory} does not exist (data.path)")
    raise DataError(f"missing data file: {plain} (or {plain.name}.gz) in {directory}")


def read_lines(path: Path) -> list[str]:
    """All lines of ``path`` without line ends; errors (unreadable, not UTF-8, empty) name the file."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                lines = f.read().splitlines()
        else:
            lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    if not any(line.strip() for line in lines):
        raise DataError(f"{path} is empty")
    return lines


def read_parallel(directory: Path, stem: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Aligned source and target lines of one split; line counts must agree."""
    src_path, tgt_path = find(directory, stem, src_lang), find(directory, stem, tgt_lang)
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src):,} lines but {tgt_path} has {len(tgt):,}: they must be aligned")
    return src, tgt
