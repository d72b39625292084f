"""Resuming from the past never destroys the future (no Lightning here).

``fit --resume RUN/checkpoints/step-N.ckpt`` continues a run from step N while the run directory may
hold later checkpoints, a later ``best.ckpt``, metrics rows after step N and the results of the end
it reached. None of it is deleted or replaced: before training, with the run's lock held, all of it
moves into ``RUN/abandoned/from-step-N/`` (``-2``, ``-3``, ... when that exists), keeping its
relative paths, so that the run directory tells one history and the abandoned one stays whole::

    RUN/abandoned/from-step-8/
        checkpoints/step-00000012.ckpt  checkpoints/best.ckpt  checkpoints/last.ckpt ...
        metrics.csv        the rows logged after step 8 (header included), and any row that could not
                           be read (not UTF-8, too few or too many cells), byte for byte
        summary.json  test-*.json   the results of the abandoned end

``last.ckpt`` then names the resumed checkpoint, and ``best.ckpt`` the best kept one up to step N
(the step the resumed checkpoint records as its best), so every command reads this history.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tfbuilder import atomic
from tfbuilder.runs import sharded
from tfbuilder.runs.checkpoints import RunDirError, display_path, present, step_checkpoints
from tfbuilder.runs.steps import OPTIMIZER, offset

ABANDONED = "abandoned"


@dataclass
class SetAside:
    """What :func:`set_aside` moved: into ``folder`` (None when nothing was later than the step)."""

    folder: Path | None = None
    files: list[str] = field(default_factory=list)  # relative to the run directory
    rows: int = 0  # metrics rows moved
    unplaced: int = 0  # of which rows that could not be read (not UTF-8, or not as many cells as columns)

    def line(self, step: int) -> str:
        """The one line a resume prints about it."""
        shown = ", ".join(self.files[:8]) + (f" and {len(self.files) - 8} more" if len(self.files) > 8 else "")
        rows = f"{self.rows} metrics row{'s' if self.rows != 1 else ''}" if self.rows else ""
        rows += f" ({self.unplaced} unreadable, kept byte for byte)" if self.unplaced else ""
        what = "; ".join(x for x in (shown, rows) if x)
        where = "nowhere" if self.folder is None else f"{display_path(self.folder)}/"
        return f"resuming from step {step}: what the run did after it ({what}) was moved to {where}"


def checkpoint_step(path: Path, known: dict[tuple[int, int], int]) -> int | None:
    """The step a checkpoint file holds: from the kept step file it is a hard link of, else read
    (memory-mapped, tensors untouched); None when it cannot be read (it is then left where it is)."""
    st = path.stat()
    if (st.st_dev, st.st_ino) in known:
        return known[(st.st_dev, st.st_ino)]
    try:
        if path.is_dir():  # a sharded checkpoint: its step is in meta.pt
            path = path / sharded.META
        step = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step")
    except Exception:  # noqa: BLE001 - a damaged file is not ours to judge here: it stays
        return None
    return step if isinstance(step, int) else None


def set_aside(
    run_dir: Path, *, step: int, resumed: Path, best_step: int | None, numbering: str = OPTIMIZER
) -> SetAside:
    """Move everything of ``run_dir`` later than ``step`` into ``abandoned/from-step-<step>[-k]/``
    and point ``last.ckpt`` (and ``best.ckpt`` where it moved) at this history. Call it holding the
    run's lock, before training."""
    ckpt_dir = run_dir / "checkpoints"
    steps = step_checkpoints(ckpt_dir) if ckpt_dir.is_dir() else []
    known = {(p.stat().st_dev, p.stat().st_ino): n for n, p in steps}
    later = [p for n, p in steps if n > step]
    for name in ("best.ckpt", "last.ckpt", "averaged.ckpt"):
        path = ckpt_dir / name
        if present(path) and not path.samefile(resumed):
            held = checkpoint_step(path, known)
            if held is not None and held > step:
                later.append(path)
    header, kept, future, unplaced = _split_metrics(run_dir / "metrics.csv", step - offset(numbering))
    if not later and not future:
        return SetAside()
    if later or len(future) > unplaced:  # the end the run reached: its results describe the abandoned history
        later += [p for p in (run_dir / "summary.json", *sorted(run_dir.glob("test-*.json"))) if p.is_file()]
    folder = _claim(run_dir / ABANDONED, f"from-step-{step}")
    moved = SetAside(folder, rows=len(future), unplaced=unplaced)
    if future:  # the copy first: a crash between the two writes repeats rows, never loses them
        atomic.write_bytes(folder / "metrics.csv", header + b"".join(future), what="metrics")
        atomic.write_bytes(run_dir / "metrics.csv", header + b"".join(kept), what="metrics")
    for path in later:
        relative = path.relative_to(run_dir)
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, folder / relative)  # same file system: nothing is copied, nothing can tear
        moved.files.append(str(relative))
    atomic.fsync_dir(ckpt_dir)
    if resumed.parent == ckpt_dir and not (ckpt_dir / "last.ckpt").exists():
        (sharded.link_folder if resumed.is_dir() else atomic.link)(resumed, ckpt_dir / "last.ckpt")
    if not (ckpt_dir / "best.ckpt").exists() and best_step is not None:
        best = resumed if best_step == step else ckpt_dir / f"step-{best_step:08d}.ckpt"
        if present(best) and best.parent == ckpt_dir:
            (sharded.link_folder if best.is_dir() else atomic.link)(best, ckpt_dir / "best.ckpt")
    return moved


MOST = 10_000  # folders named from-step-N[-k] tried before giving up


def _claim(parent: Path, name: str) -> Path:
    """A new folder ``parent/name`` (``name-2``, ``name-3``, ... when taken): an earlier one is never reused.
    Nothing has moved yet when it is refused."""
    if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
        raise RunDirError(
            f"{parent} is not a folder: a resume from an earlier step moves the later history there; "
            "move it out of the run directory, then resume again"
        )
    try:
        parent.mkdir(exist_ok=True)
        for k in range(1, MOST + 1):
            folder = parent / (name if k == 1 else f"{name}-{k}")
            try:
                folder.mkdir()
                return folder
            except FileExistsError:
                continue
    except OSError as exc:
        raise RunDirError(f"cannot make a folder in {parent}: {exc.strerror or exc}") from None
    raise RunDirError(f"{parent} holds {MOST} folders named {name}[-k] already: move some away, then resume again")


def _split_metrics(path: Path, last: int) -> tuple[bytes, list[bytes], list[bytes], int]:
    """(header line, lines up to logged step ``last``, lines after it, how many of those could not be
    placed) of a metrics.csv, each line as its bytes. A checkpoint of step N holds the history up to
    logged step N (N - 1 in a run numbered as Lightning counts: :mod:`tfbuilder.runs.steps`). A line
    that is not UTF-8 or has another number of cells than the header cannot be placed: it goes with
    the later ones, as it is (the run's own file is read again as CSV)."""
    if not os.path.lexists(path):
        return b"", [], [], 0
    if path.is_symlink() or not path.is_file():
        raise RunDirError(
            f"{path} is not a plain file (a link, a pipe or a folder): the run's metrics are rewritten "
            "when it resumes; move it out of the run directory, then resume again"
        )
    data = path.read_bytes()
    if not data.strip():
        return b"", [], [], 0
    lines = [line + b"\n" for line in data.removesuffix(b"\n").split(b"\n")]
    header, columns = lines[0], _cells(lines[0])
    if columns is None or "step" not in columns:
        raise RunDirError(
            f"{path}: line 1 is not the header of tfbuilder's metrics (a CSV line naming a step column, "
            "in UTF-8); repair or move the file, then resume again"
        )
    kept: list[bytes] = []
    future: list[bytes] = []
    unplaced = 0
    for line in lines[1:]:
        if not line.strip():
            continue  # an empty line is no row
        cells = _cells(line)
        if cells is None or len(cells) != len(columns):
            future.append(line)
            unplaced += 1
            continue
        logged = cells[columns.index("step")]
        (future if logged.isascii() and logged.isdigit() and int(logged) > last else kept).append(line)
    return header, kept, future, unplaced


def _cells(line: bytes) -> list[str] | None:
    """The cells of one CSV line; None when it is not UTF-8 or not one whole CSV row."""
    try:
        rows = list(csv.reader(io.StringIO(line.decode("utf-8"), newline=""), strict=True))
    except (UnicodeDecodeError, csv.Error):
        return None
    return rows[0] if len(rows) == 1 else None
