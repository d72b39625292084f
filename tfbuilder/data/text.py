"""Reading text: one sentence per line, plain or gzipped, checked before anything trains."""

from __future__ import annotations

import gzip
import zlib
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


def exists(directory: Path, stem: str, lang: str) -> bool:
    """Whether ``<directory>/<stem>.<lang>`` or its ``.gz`` is a file."""
    plain = directory / f"{stem}.{lang}"
    return plain.is_file() or plain.with_name(plain.name + ".gz").is_file()


def split_lines(text: str) -> list[str]:
    """Lines end at ``\\n`` (``\\r\\n`` too) and nowhere else: not at U+2028, U+0085, form feed or a
    lone ``\\r``, as ``str.splitlines`` would, which would shift every pair after such a character."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line end
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: Path) -> list[str]:
    """All lines of ``path`` without line ends; errors (unreadable, not UTF-8, empty) name the file."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"cannot read {path}: line {line:,} is not UTF-8 text") from None
    except (OSError, EOFError, zlib.error) as exc:
        reason = "a damaged or truncated gzip stream" if isinstance(exc, (EOFError, zlib.error, gzip.BadGzipFile)) else (exc.strerror or exc)
        raise DataError(f"cannot read {path}: {reason}") from None
    lines = split_lines(text)
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
