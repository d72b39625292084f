"""Lines of text in batches that never wait for input that has not come.

A file is read ``most`` lines at a time (large batches decode fastest). A terminal or a pipe is
read as it arrives: a batch is every complete line already written, so someone typing a sentence,
or a program writing one line and waiting for its answer, gets the answer at once, while a fast
pipe (``cat file | ...``) still fills batches. Lines end at ``\\n`` (a ``\\r\\n`` ending is removed
too), never at other Unicode line breaks: the same rule as the training data.
"""

from __future__ import annotations

import errno
import os
import select
import stat
from collections.abc import Iterator
from typing import BinaryIO

READ_BYTES = 1 << 16
MAX_LINE_BYTES = 1 << 20  # a line longer than this is not a sentence: refused, not buffered


class NotText(ValueError):
    """The input is not UTF-8 text, or has a line too long to be one."""


def describe(path: str | os.PathLike[str]) -> str:
    """What ``path`` is, in words for a message: "a regular file", "a folder", "a FIFO", "a character
    device", "a block device", "a socket", "a loop of symbolic links", "a symbolic link to T, which does
    not exist", "missing" (nothing there), or "unreadable (REASON)". Never follows a loop, never opens."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a loop of symbolic links"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            if os.path.islink(path):
                return f"a symbolic link to {os.readlink(path)}, which does not exist"
            return "missing"
        return f"unreadable ({exc.strerror or exc})"
    for test, words in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def file_kind(path: str | os.PathLike[str], info: os.stat_result | None = None) -> str | None:
    """What ``path`` itself is when it is not a regular file (links not followed): "a symbolic link (to
    T)", "a loop of symbolic links", "a folder", "a named pipe (FIFO)", "a socket", "a device"; None for
    a regular file, or when it cannot be told. ``info``: its ``lstat`` (or ``fstat``), when known."""
    try:
        info = info if info is not None else os.lstat(path)
    except OSError:
        return None
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        target = os.readlink(path)
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "a loop of symbolic links"
            return f"a symbolic link (to {target}, which does not exist)"
        return f"a symbolic link (to {target})"
    kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a named pipe (FIFO)", stat.S_ISSOCK: "a socket",
             stat.S_ISCHR: "a device", stat.S_ISBLK: "a device"}  # fmt: skip
    return next((name for test, name in kinds.items() if test(mode)), None if stat.S_ISREG(mode) else "not a file")


def open_own(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> tuple[int | None, str | None]:
    """Open ``path`` as a file of its own (a lock file): never through a link, never waiting on a FIFO,
    and with no other name (a hard link). ``(descriptor, None)``, or ``(None, what it is)`` when it is
    something else (:func:`file_kind`); an ``OSError`` when it cannot be opened for another reason."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError:
        what = file_kind(path)
        if what is None:
            raise
        return None, what
    info = os.fstat(fd)
    what = file_kind(path, info)
    if what is None and info.st_nlink > 1:
        what = f"a file with {info.st_nlink} names (a hard link)"
    if what is not None:
        os.close(fd)
        return None, what
    return fd, None


def _line(raw: bytes) -> str:
    text = raw.decode("utf-8")
    return text[:-1] if text.endswith("\r") else text


def is_regular_file(stream: BinaryIO) -> bool:
    """Whether ``stream`` reads a regular file (everything is there already: read in big batches)."""
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, AttributeError, ValueError):  # no file descriptor: an in-memory stream
        return True


def batches(stream: BinaryIO, *, most: int) -> Iterator[list[str]]:
    """Batches of at most ``most`` lines of ``stream`` (binary), in order; see the module docstring.
    Raises :class:`NotText` for a line that is not UTF-8."""
    try:
        if is_regular_file(stream):
            yield from _file_batches(stream, most)
        else:
            yield from _arriving_batches(stream.fileno(), most)
    except UnicodeDecodeError:
        raise NotText("is not UTF-8 text") from None


def _too_long() -> NotText:
    return NotText(f"has a line longer than {MAX_LINE_BYTES:,} bytes")


def _file_batches(stream: BinaryIO, most: int) -> Iterator[list[str]]:
    batch: list[str] = []
    while raw := stream.readline(MAX_LINE_BYTES + 1):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise _too_long()
        batch.append(_line(raw[:-1] if raw.endswith(b"\n") else raw))
        if len(batch) >= most:
            yield batch
            batch = []
    if batch:
        yield batch


def _arriving_batches(fd: int, most: int) -> Iterator[list[str]]:
    pending = b""  # a line not yet ended
    ready: list[str] = []
    ended = False
    while not ended or ready:
        if not ended and (not ready or _readable_now(fd)):
            data = os.read(fd, READ_BYTES)  # blocks only while no complete line is waiting
            if data:
                *complete, pending = (pending + data).split(b"\n")
                if len(pending) > MAX_LINE_BYTES or any(len(raw) > MAX_LINE_BYTES for raw in complete):
                    raise _too_long()
                ready.extend(_line(raw) for raw in complete)
                if len(ready) < most and _readable_now(fd):
                    continue  # more is already there: fill the batch first
            else:
                ended = True
                if pending:
                    ready.append(_line(pending))
                    pending = b""
        if ready:
            batch, ready = ready[:most], ready[most:]
            yield batch


def _readable_now(fd: int) -> bool:
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


__all__ = ["NotText", "batches", "is_regular_file"]
