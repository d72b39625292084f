"""Reading text: one sentence (or document) per line, plain or gzipped, streamed with bounded memory.

Lines are read one at a time through a bounded buffer: a file of any size, or a small gzip that
expands to gigabytes, costs at most :data:`MAX_LINE_BYTES` of memory per line, and an absurdly long
line is an error naming the file and the line. Paths are checked before they are opened: a directory,
a FIFO or a device is named for what it is, never read (a FIFO would block, ``/dev/zero`` never end).
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path

from tfbuilder.errors import DataError
from tfbuilder.streams import describe

MAX_LINE_BYTES = 16 * 2**20  # a longer "line" is a binary file or a missing line end, not a sentence
# Blank lines in a row: a corpus has a few (a missing sentence, paragraphs' separators); a million is
# a file padded or damaged, or a small gzip that expands to gigabytes of nothing, read for minutes.
MAX_BLANK_RUN = 100_000


def find(directory: Path, stem: str, lang: str) -> Path:
    """``<directory>/<stem>.<lang>`` or its ``.gz``; a clear error naming both when neither exists."""
    plain = directory / f"{stem}.{lang}"
    for candidate in (plain, plain.with_name(plain.name + ".gz")):
        if candidate.exists() or candidate.is_symlink():
            check_regular(candidate)
            return candidate
    if directory.exists() and not directory.is_dir():
        raise DataError(f"data.path {directory} is a file, not a directory")
    if not directory.is_dir():
        raise DataError(f"data directory {directory} does not exist (data.path)")
    raise DataError(f"missing data file: {plain} (or {plain.name}.gz) in {directory}")


def exists(directory: Path, stem: str, lang: str) -> bool:
    """Whether ``<directory>/<stem>.<lang>`` or its ``.gz`` exists (a file or not: :func:`find` says)."""
    plain = directory / f"{stem}.{lang}"
    return any(p.exists() or p.is_symlink() for p in (plain, plain.with_name(plain.name + ".gz")))


def check_regular(path: Path) -> None:
    """A :class:`DataError` unless ``path`` is (a link to) a regular file that can be read."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == 40:  # ELOOP
            raise DataError(f"cannot read {path}: a loop of symbolic links") from None
        if path.is_symlink():
            raise DataError(f"cannot read {path}: a symbolic link to nothing") from None
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise DataError(f"cannot read {path}: it is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise DataError(f"cannot read {path}: not a regular file ({describe(path)})")


def lines(path: Path, *, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of ``path`` without line ends, one at a time. Lines end at ``\\n`` (``\\r\\n`` too) and
    nowhere else: not at U+2028, U+0085, form feed or a lone ``\\r``, as ``str.splitlines`` would,
    which would shift every pair after such a character. Errors (unreadable, not UTF-8, a damaged
    gzip stream, a line over ``max_line_bytes``, more than :data:`MAX_BLANK_RUN` blank lines in a
    row) name the file and the line."""
    check_regular(path)
    number = blank = 0
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            while True:
                raw = f.readline(max_line_bytes + 1)
                if not raw:
                    return
                number += 1
                blank = blank + 1 if raw in (b"\n", b"\r\n") else 0
                if blank > MAX_BLANK_RUN:
                    raise DataError(
                        f"cannot read {path}: lines {number - blank + 1:,} to {number:,} are all blank: "
                        f"more than {MAX_BLANK_RUN:,} blank lines in a row is not text (a padded or damaged file)"
                    )
                if len(raw) > max_line_bytes:
                    raise DataError(f"cannot read {path}: line {number:,} is longer than {max_line_bytes // 2**20} MiB")
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise DataError(f"cannot read {path}: line {number:,} is not UTF-8 text") from None
                if line.endswith("\n"):
                    line = line[:-2] if line.endswith("\r\n") else line[:-1]
                yield line
    except (OSError, EOFError, zlib.error) as exc:
        if isinstance(exc, (EOFError, zlib.error, gzip.BadGzipFile)):
            reason = "a damaged or truncated gzip stream"
        else:
            reason = exc.strerror or str(exc)
        raise DataError(f"cannot read {path}: {reason} (line {number + 1:,})") from None


def read_lines(path: Path) -> list[str]:
    """All lines of ``path`` (see :func:`lines`); an error if none holds text. For small files: the
    data pipeline streams instead."""
    out = list(lines(path))
    if not any(line.strip() for line in out):
        raise DataError(f"{path} is empty")
    return out


def parallel_lines(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """Aligned (source, target) lines, streamed; line counts must agree (checked when one file ends)."""
    src, tgt = lines(src_path), lines(tgt_path)
    count = rest_src = rest_tgt = 0
    for s in src:
        t = next(tgt, None)
        if t is None:
            rest_src = 1
            break
        count += 1
        yield s, t
    rest_src += sum(1 for _ in src)
    rest_tgt = sum(1 for _ in tgt)
    if rest_src or rest_tgt:
        raise DataError(
            f"{src_path} has {count + rest_src:,} lines but {tgt_path} has {count + rest_tgt:,}: they must be aligned"
        )


def read_parallel(directory: Path, stem: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Aligned source and target lines of one split (small files); line counts must agree."""
    src_path, tgt_path = find(directory, stem, src_lang), find(directory, stem, tgt_lang)
    pairs = list(parallel_lines(src_path, tgt_path))
    for path, side in ((src_path, 0), (tgt_path, 1)):
        if not any(p[side].strip() for p in pairs):
            raise DataError(f"{path} is empty")
    return [p[0] for p in pairs], [p[1] for p in pairs]


def paragraphs(path: Path) -> Iterator[str]:
    """Documents separated by blank lines; a document's lines are joined with ``\\n``."""
    current: list[str] = []
    for line in lines(path):
        if line.strip():
            current.append(line)
        elif current:
            yield "\n".join(current)
            current = []
    if current:
        yield "\n".join(current)
