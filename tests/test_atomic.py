"""Atomic writes, checked at every system call: a failure (a full disk, EIO) or a crash at any of
them leaves the target whole, old or new, and the temporary file is never left behind by a failure.

The protocol (POSIX rename(2) is atomic; fsync(2) makes data and, on the directory, a rename
durable): write the temporary file, flush Python's buffer, fsync it, close it, rename it over the
target, fsync the directory. Data must be on disk before the rename makes it the target, or a power
loss could leave the new name pointing at an empty or partial file.
"""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest
import torch

from tfbuilder import atomic

OLD, NEW = "old contents\n" * 50, "new contents, longer than the old\n" * 80


class Crash(BaseException):
    """The process dies here (kill -9, power loss): no except clause runs."""


class System:
    """Wraps the calls a write makes (open, write, flush, fsync, close, replace, link), recording
    each in ``trace``; the ``fail_at``-th call raises ``error`` instead of running."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail_at: int | None = None, error: BaseException | None = None):
        self.trace: list[str] = []
        self.fail_at = fail_at
        self.error = error or OSError(errno.EIO, os.strerror(errno.EIO))
        self.dir_fds: set[int] = set()
        real = {name: getattr(os, name) for name in ("fsync", "replace", "open", "close", "link")}

        def wrap(name, label):
            def call(*args, **kwargs):
                try:
                    self.step(label(*args))
                except BaseException:
                    if name == "close":  # a failing close(2) still releases the descriptor
                        real[name](*args, **kwargs)
                    raise
                result = real[name](*args, **kwargs)
                if name == "open":
                    self.dir_fds.add(result)
                return result

            return call

        monkeypatch.setattr(os, "fsync", wrap("fsync", lambda fd: "fsync dir" if fd in self.dir_fds else "fsync file"))
        monkeypatch.setattr(os, "replace", wrap("replace", lambda a, b: f"replace {Path(a).name} -> {Path(b).name}"))
        monkeypatch.setattr(os, "open", wrap("open", lambda path, flags: "open dir"))
        monkeypatch.setattr(os, "close", wrap("close", lambda fd: "close dir" if fd in self.dir_fds else "close fd"))
        monkeypatch.setattr(os, "link", wrap("link", lambda a, b: f"link {Path(a).name} -> {Path(b).name}"))
        monkeypatch.setattr(atomic, "open", self.open, raising=False)  # the module's open(), not the builtin

    def step(self, what: str) -> None:
        if self.fail_at is not None and len(self.trace) == self.fail_at:
            self.trace.append(f"FAIL {what}")
            raise self.error
        self.trace.append(what)

    def open(self, path, mode="r", *args, **kwargs):
        self.step(f"open {Path(path).name}")
        return _File(self, open(path, mode, *args, **kwargs))


class _File:
    """A file whose write, flush and close go through :class:`System`."""

    def __init__(self, system: System, f):
        self.system, self.f = system, f

    def write(self, data) -> int:
        self.system.step("write")
        return self.f.write(data)

    def flush(self) -> None:
        self.system.step("flush")
        self.f.flush()

    def fileno(self) -> int:
        return self.f.fileno()

    def close(self) -> None:
        try:
            if not self.f.closed:
                self.system.step("close file")
        finally:
            self.f.close()  # a failing close(2) still releases the descriptor

    def __getattr__(self, name):  # torch.save asks for seek/tell and the like
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def others(directory: Path, target: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p != target)


def test_the_protocol_is_write_flush_fsync_close_rename_then_fsync_the_directory(tmp_path, monkeypatch):
    target = tmp_path / "metrics.csv"
    system = System(monkeypatch)
    atomic.write_text(target, NEW)
    tmp = atomic.temp_path(target).name
    assert system.trace == [
        f"open {tmp}", "write", "flush", "fsync file", "close file",
        f"replace {tmp} -> metrics.csv", "open dir", "fsync dir", "close dir",
    ]
    assert target.read_text() == NEW and others(tmp_path, target) == []


WRITERS = {
    "text": (lambda path: atomic.write_text(path, NEW, what="metrics"), lambda path: path.read_text() == NEW),
    # torch.save writes in many pieces, and reports an error of its file as a RuntimeError.
    "checkpoint": (lambda path: atomic.save({"w": torch.arange(3000.0)}, path), lambda path: torch.load(path)["w"].shape == (3000,)),
    # Writers that take a file name (safetensors, ONNX) write the temporary name.
    "by-name": (lambda path: atomic.write_by_name(path, lambda tmp: torch.save({"w": torch.arange(3000.0)}, tmp)), lambda path: torch.load(path)["w"].shape == (3000,)),
    "text-file": (lambda path: _text_file(path), lambda path: path.read_text() == NEW),
}


def _text_file(path: Path) -> None:
    with atomic.text_file(path) as f:
        f.write(NEW)


def calls_of(write, directory: Path, monkeypatch) -> int:
    with monkeypatch.context() as m:
        system = System(m)
        write(directory / "probe")
    (directory / "probe").unlink()
    return len(system.trace)


@pytest.mark.parametrize("writer", WRITERS, ids=WRITERS)
@pytest.mark.parametrize("old", [OLD, None], ids=["replacing", "new-file"])
def test_a_failure_at_any_call_keeps_the_old_file_whole_and_no_temporary(tmp_path, monkeypatch, old, writer):
    write, is_new = WRITERS[writer]
    target = tmp_path / "target"
    calls = calls_of(write, tmp_path, monkeypatch)
    assert calls >= (7 if writer == "by-name" else 9)  # a writer given a name does its own writes
    for k in range(calls):
        if old is not None:
            target.write_text(old)
        else:
            target.unlink(missing_ok=True)
        with monkeypatch.context() as m:
            system = System(m, fail_at=k, error=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
            try:
                write(target)
                failed = None
            except atomic.WriteError as exc:
                failed = str(exc)
        where = system.trace[-1]
        renamed = any(t.startswith("replace") for t in system.trace[:-1])
        if renamed:  # the new file is in place: what fails after (the directory's fsync) cannot undo it
            assert failed is None and is_new(target), where
        else:
            assert failed is not None and "No space left on device" in failed, where
            if old is not None:
                assert target.read_text() == old and "previous version is kept" in failed, where
            else:
                assert not target.exists() and "nothing was written" in failed, where
        assert others(tmp_path, target) == [], where  # the temporary is gone either way


def test_a_crash_at_any_call_leaves_the_target_whole(tmp_path, monkeypatch):
    """A process killed mid-write runs no clean-up: its temporary may stay (the next fit removes it
    under the run's lock), but the target is the old file or the new one, never a mix."""
    target = tmp_path / "last.ckpt"
    old, new = {"step": 1, "w": torch.arange(2000.0)}, {"step": 2, "w": -torch.arange(3000.0)}
    atomic.save(old, target)
    counting = System(monkeypatch)
    atomic.save(new, tmp_path / "probe.ckpt")
    calls = len(counting.trace)
    monkeypatch.undo()
    assert counting.trace.count("write") > 1  # torch.save writes in pieces: a crash can fall between them
    for k in range(calls):
        atomic.save(old, target)
        with monkeypatch.context() as m:
            System(m, fail_at=k, error=Crash())
            with pytest.raises(BaseException):  # Crash, or torch.save's RuntimeError unwinding from it
                atomic.save(new, target)
        saved = torch.load(target, weights_only=True)  # loads: whole
        assert saved["step"] in (1, 2) and torch.equal(saved["w"], (old if saved["step"] == 1 else new)["w"])
        atomic.remove_temporaries(tmp_path)
        assert others(tmp_path, target) == ["probe.ckpt"]


def test_links_replace_the_target_atomically(tmp_path, monkeypatch):
    """last.ckpt and best.ckpt are hard links to the step's checkpoint, made under a temporary name
    and renamed over the target; a failing link or rename keeps the old target and no temporary."""
    source, target = tmp_path / "step-00000002.ckpt", tmp_path / "last.ckpt"
    source.write_text(NEW)
    for k in range(2):  # the link, the rename
        target.write_text(OLD)
        with monkeypatch.context() as m:
            system = System(m, fail_at=k)
            with pytest.raises(atomic.WriteError, match="cannot write checkpoint"):
                atomic.link(source, target)
        assert target.read_text() == OLD, system.trace
        assert others(tmp_path, target) == [source.name]
    system = System(monkeypatch)
    atomic.link(source, target)
    tmp = atomic.temp_path(target).name
    assert system.trace == [f"link {source.name} -> {tmp}", f"replace {tmp} -> last.ckpt", "open dir", "fsync dir", "close dir"]
    assert target.read_text() == NEW and os.path.samefile(source, target)


def test_where_links_are_impossible_the_target_is_an_atomic_copy(tmp_path, monkeypatch):
    source, target = tmp_path / "step-00000002.ckpt", tmp_path / "last.ckpt"
    source.write_text(NEW)
    target.write_text(OLD)
    system = System(monkeypatch, fail_at=0, error=OSError(errno.EXDEV, os.strerror(errno.EXDEV)))
    atomic.link(source, target)
    assert system.trace[0].startswith("FAIL link")
    assert "flush" in system.trace and system.trace.index("fsync file") < next(i for i, t in enumerate(system.trace) if t.startswith("replace"))
    assert target.read_text() == NEW and not os.path.samefile(source, target)
    assert others(tmp_path, target) == [source.name]


def test_temporaries_a_killed_process_left_are_removed_and_nothing_else(tmp_path):
    """kill -9 runs no clean-up: the next fit removes what it left (under the run's lock)."""
    target = tmp_path / "last.ckpt"
    left = atomic.temp_path(target)  # what a write killed before its rename leaves
    left.write_bytes(b"half a checkpoint")
    keep = [tmp_path / "last.ckpt", tmp_path / ".hidden", tmp_path / "notes.tmp-1", tmp_path / "step-00000002.ckpt"]
    for path in keep:
        path.write_text("mine")
    assert atomic.remove_temporaries(tmp_path) == [left]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in keep)
    assert atomic.remove_temporaries(tmp_path / "absent") == []


def test_a_new_file_is_written_whole_and_never_over_an_existing_one(tmp_path):
    target = tmp_path / "scores.json"
    assert atomic.write_new_text(target, NEW) == target and target.read_text() == NEW
    assert atomic.write_new_text(target, OLD) is None
    assert target.read_text() == NEW and others(tmp_path, target) == []


def test_a_text_file_that_raises_writes_nothing(tmp_path):
    target = tmp_path / "report.csv"
    target.write_text(OLD)
    with pytest.raises(ValueError):
        with atomic.text_file(target) as f:
            f.write(NEW)
            raise ValueError("a report that cannot be finished")
    assert target.read_text() == OLD and others(tmp_path, target) == []



# Writes that are deliberately not atomic: answers streamed to a new file as they come (translate
# --output, flushed per batch), the run lock (created exclusively; its content is a note), the
# probe of a failing standard output (not a file), and the kernel's reset of the peak memory
# (/proc/self/clear_refs, not a file anyone keeps).
STREAMED = {("decoding.py", "_open_sink"), ("checkpoints.py", "acquire"), ("commands.py", "_stdout_failed"), ("memory.py", "reset_peak")}
SAVERS = {"save", "save_file", "save_model", "savefig", "copyfile", "copy2", "tofile"}


def _temporary(call: ast.Call) -> bool:
    """A saver given a temporary name (``tmp``), which an atomic step then puts in place."""
    return any("tmp" in ast.unparse(a) for a in call.args[:2])


def plain_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that write a file in place: ``open`` for writing, ``Path.write_text``/``write_bytes``,
    ``torch.save`` or another saver given a final path, not a temporary (a lambda's ``tmp`` or ``f``)."""
    inside_writers = {id(n) for lam in ast.walk(tree) if isinstance(lam, ast.Lambda) for n in ast.walk(lam.body)}
    found = []
    function = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                function[id(n)] = fn.name  # the innermost function wins (walked later)
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or id(call) in inside_writers:
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        owner = call.func.value.id if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) else None
        modes = [a.value for a in call.args[1:2] + [k.value for k in call.keywords if k.arg == "mode"] if isinstance(a, ast.Constant)]
        plain = (name == "open" and any(isinstance(m, str) and set(m) & set("wxa") for m in modes)) or (
            name in ("write_text", "write_bytes") and isinstance(call.func, ast.Attribute) and owner != "atomic"
        ) or (name in SAVERS and owner not in ("atomic", "self") and not _temporary(call)) or (name == "write" and owner == "os")
        if plain:
            found.append((call.lineno, function.get(id(call), "")))
    return found


def test_every_file_tfbuilder_writes_goes_through_the_atomic_writer():
    """Over the package's syntax trees: a plain write appears only in atomic.py. The data layer
    builds its prepared stores in a temporary directory renamed whole, and is not scanned here."""
    package = Path(atomic.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] == "data" or rel.name == "atomic.py":
            continue
        for line, function in plain_writes(ast.parse(path.read_text(encoding="utf-8"))):
            if (rel.name, function) not in STREAMED:
                found.append(f"{rel}:{line} (in {function or 'the module'})")
    assert found == []


def test_the_scan_finds_a_plain_write():
    code = "def f(p, x):\n    p.write_text(x)\n    torch.save(x, p)\n    atomic.write_atomic(p, lambda f: torch.save(x, f))\n"
    assert [line for line, _ in plain_writes(ast.parse(code))] == [2, 3]


def test_a_read_only_file_system_is_a_write_error_naming_the_target(tmp_path, monkeypatch):
    """On a read-only file system the temporary cannot be made, nor removed (unlink says EROFS even
    for a name that is not there): the write's error is what the user reads, about their file."""
    rofs = OSError(errno.EROFS, os.strerror(errno.EROFS))

    def refuse(*args, **kwargs):
        raise rofs

    monkeypatch.setattr(Path, "unlink", refuse)
    monkeypatch.setattr(atomic, "_serialize", refuse)
    target = tmp_path / "scores.json"
    with pytest.raises(atomic.WriteError, match=f"cannot write checkpoint {target}: Read-only file system"):
        atomic.save({"a": 1}, target)
    with pytest.raises(atomic.WriteError, match=f"cannot write file {target}: Read-only file system"):
        atomic.write_atomic(target, refuse)
    monkeypatch.setattr(atomic, "open", refuse, raising=False)  # the temporary cannot be made
    with pytest.raises(atomic.WriteError) as found:
        atomic.write_new_text(target, "{}")
    assert found.value.errno == errno.EROFS
    assert str(found.value) == f"cannot write file {target}: Read-only file system (nothing was written)"
    monkeypatch.undo()
    atomic.discard(tmp_path / "never-there")  # nothing to remove: no error
