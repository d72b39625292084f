"""Writes that either happen whole or not at all (no Lightning here).

A file is written to a temporary name in its own directory, flushed and fsync'ed, renamed over the
target (``os.replace`` is atomic within a file system), and the directory is fsync'ed so the rename
itself survives a power loss. A crash, a kill -9 or a full disk at any moment leaves either the
previous file or the new one, never a torn one; a failed write removes its temporary file and says why.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import torch

from tfbuilder.errors import TfbuilderError

TEMP_MARK = ".tmp-"  # temporary files are ".<name>.tmp-<pid>": hidden, and never mistaken for the real file


class WriteError(TfbuilderError):
    """A file could not be written (disk full, permissions): the previous version is intact (exit 1)."""

    exit_code = 1

    def __init__(self, message: str, *, errno: int | None = None, path: Path | None = None, reason: str = ""):
        super().__init__(message)
        self.errno = errno  # of the OSError behind it (ENOSPC: the disk is full)
        self.path = path
        self.reason = reason or message  # the system's words alone ("Read-only file system")


def temp_path(path: Path) -> Path:
    return path.parent / f".{path.name}{TEMP_MARK}{os.getpid()}"


def discard(path: Path) -> None:
    """Remove a temporary file if it is there; never raise (on a read-only file system, or where the
    write never began, there may be nothing that can be removed: the error that matters is the write's)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # the rename is done: a directory that cannot be closed does not undo it


def _serialize(obj: object, f: BinaryIO) -> None:
    """How checkpoints become bytes (a seam: tests make it fail halfway)."""
    torch.save(obj, f)


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, or the one it was raised from or while handling
    (torch.save reports an error of its file, a full disk, as a RuntimeError)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        if isinstance(current, OSError):
            return current
        current, seen = current.__cause__ or current.__context__, seen + 1
    return None


def write_atomic(path: str | Path, write: Callable[[BinaryIO], None], *, what: str = "file") -> Path:
    """Write ``path`` through ``write(f)`` atomically; on failure the old file is kept and
    :class:`WriteError` says why."""

    def produce(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())

    return _commit(Path(path), produce, what=what)


def write_by_name(path: str | Path, write: Callable[[Path], None], *, what: str = "file") -> Path:
    """Atomically write ``path`` through a writer that takes a file name rather than a file
    (safetensors, ONNX): it writes a temporary name, which is fsync'ed and renamed over ``path``."""

    def produce(tmp: Path) -> None:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    return _commit(Path(path), produce, what=what)


def _commit(path: Path, produce: Callable[[Path], None], *, what: str) -> Path:
    """``produce(tmp)`` writes the whole file at a temporary name beside ``path``; it is renamed over
    ``path``. On failure the temporary goes and :class:`WriteError` says why (Ctrl-C stays Ctrl-C)."""
    tmp = temp_path(path)
    try:
        produce(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        discard(tmp)  # whatever stopped the write (Ctrl-C too), its temporary goes
        cause = _os_error(exc) if isinstance(exc, Exception) else None  # Ctrl-C stays Ctrl-C
        if cause is None:
            raise
        reason = cause.strerror or (os.strerror(cause.errno) if cause.errno else str(cause) or type(cause).__name__)
        kept = "the previous version is kept" if path.exists() else "nothing was written"
        message = f"cannot write {what} {path}: {reason} ({kept})"
        raise WriteError(message, errno=cause.errno, path=path, reason=reason) from None
    fsync_dir(path.parent)
    return path


def write_text(path: str | Path, text: str, *, what: str = "file") -> Path:
    """Write ``text`` to ``path`` in UTF-8, atomically."""
    return write_bytes(path, text.encode("utf-8"), what=what)


def write_bytes(path: str | Path, data: bytes, *, what: str = "file") -> Path:
    """Write ``data`` to ``path`` atomically."""

    def write(f: BinaryIO) -> None:
        f.write(data)

    return write_atomic(path, write, what=what)


@contextmanager
def text_file(path: str | Path, *, what: str = "file") -> Iterator[io.StringIO]:
    """A text stream (newlines as written) whose content replaces ``path`` atomically when the block
    ends without an exception; nothing is written when it raises."""
    buffer = io.StringIO(newline="")
    yield buffer
    write_text(path, buffer.getvalue(), what=what)


def copy(source: str | Path, path: str | Path, *, what: str = "file") -> Path:
    """Atomically write a copy of ``source`` at ``path``."""
    with open(source, "rb") as src:
        return write_atomic(path, lambda f: shutil.copyfileobj(src, f), what=what)


def write_new_text(path: str | Path, text: str, *, what: str = "file") -> Path | None:
    """Write ``text`` at ``path`` whole, only if nothing is there: returns None (writing nothing) when
    ``path`` exists. The complete temporary file is hard-linked to ``path``, which fails rather than
    replaces; where links are impossible, it is renamed after a check."""
    path = Path(path)
    if os.path.lexists(path):
        return None
    try:
        tmp = write_text(temp_path(path).with_name(temp_path(path).name + "-new"), text, what=what)
    except WriteError as exc:  # named by the file asked for, not its temporary name
        raise WriteError(f"cannot write {what} {path}: {exc.reason} (nothing was written)", errno=exc.errno) from None
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise WriteError(f"cannot write {what} {path}: {exc.strerror or exc} (nothing was written)") from None
            if os.path.lexists(path):
                return None
            os.replace(tmp, path)
    finally:
        discard(tmp)
    fsync_dir(path.parent)
    return path


def move_new(source: Path, pattern: str) -> Path:
    """Rename ``source`` to the first free ``pattern.format(n)`` (n = 1, 2, ...), never over an
    existing file: a hard link that fails when the name is taken, then the source goes; where links
    are impossible, a rename after a check."""
    for n in range(1, 100_000):
        target = Path(pattern.format(n))
        try:
            os.link(source, target)
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise WriteError(f"cannot rename {source} to {target}: {exc.strerror or exc}") from None
            if os.path.lexists(target):
                continue
            os.replace(source, target)
            fsync_dir(target.parent)
            return target
        source.unlink()
        fsync_dir(target.parent)
        return target
    raise WriteError(f"cannot rename {source}: every name like {Path(pattern).name} is taken")


def save(obj: object, path: str | Path, *, what: str = "checkpoint") -> Path:
    """``torch.save`` made atomic."""
    return write_atomic(path, lambda f: _serialize(obj, f), what=what)


def link(source: Path, target: Path) -> None:
    """Make ``target`` the same file as ``source`` atomically (a hard link; a copy where links are not
    possible): last.ckpt, best.ckpt and the kept step checkpoints share one write."""
    tmp = temp_path(target)
    discard(tmp)
    try:
        os.link(source, tmp)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise WriteError(f"cannot write checkpoint {target}: {exc.strerror or exc}") from None
        with open(source, "rb") as src:
            write_atomic(target, lambda f: shutil.copyfileobj(src, f), what="checkpoint")
        return
    try:
        os.replace(tmp, target)
    except OSError as exc:
        discard(tmp)
        raise WriteError(
            f"cannot write checkpoint {target}: {exc.strerror or exc} (the previous version is kept)"
        ) from None
    fsync_dir(target.parent)


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete temporary files a killed process left in ``directory`` (call only while holding the run's lock)."""
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if p.name.startswith(".") and TEMP_MARK in p.name]
    for p in stale:
        if p.is_dir() and not p.is_symlink():  # a sharded checkpoint's folder (trainer.strategy: fsdp)
            shutil.rmtree(p, ignore_errors=True)
        else:
            discard(p)
    return stale
