"""Resuming from the past never destroys the future (no Lightning here).

``fit --resume RUN/checkpoints/step-N.ckpt`` continues a run from step N while the run directory may
hold later checkpoints, a later ``best.ckpt``, metrics rows after step N and the results of the end
it reached. None of it is deleted or replaced: before training, with the run's lock held, all of it
moves into ``RUN/abandoned/from-step-N/`` (``-2``, ``-3``, ... when that exists), keeping its
relative paths, so that the run directory tells one history and the abandoned one stays whole::

    RUN/abandoned/from-step-8/
        checkpoints/step-00000012.ckpt  checkpoints/best.ckpt  checkpoints/last.ckpt ...
        metrics.csv        the rows logged after step 8 (header included)
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
from tfbuilder.runs.checkpoints import display_path, step_checkpoints

ABANDONED = "abandoned"


@dataclass
class SetAside:
    """What :func:`set_aside` moved: into ``folder`` (None when nothing was later than the step)."""

    folder: Path | None = None
    files: list[str] = field(default_factory=list)  # relative to the run directory
    rows: int = 0  # metrics rows moved

    def line(self, step: int) -> str:
        """The one line a resume prints about it."""
        shown = ", ".join(self.files[:8]) + (f" and {len(self.files) - 8} more" if len(self.files) > 8 else "")
        rows = f"{self.rows} metrics row{'s' if self.rows != 1 else ''}" if self.rows else ""
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
        step = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step")
    except Exception:  # noqa: BLE001 - a damaged file is not ours to judge here: it stays
        return None
    return step if isinstance(step, int) else None


def set_aside(run_dir: Path, *, step: int, resumed: Path, best_step: int | None) -> SetAside:
    """Move everything of ``run_dir`` later than ``step`` into ``abandoned/from-step-<step>[-k]/``
    and point ``last.ckpt`` (and ``best.ckpt`` where it moved) at this history. Call it holding the
    run's lock, before training."""
    ckpt_dir = run_dir / "checkpoints"
    steps = step_checkpoints(ckpt_dir) if ckpt_dir.is_dir() else []
    known = {(p.stat().st_dev, p.stat().st_ino): n for n, p in steps}
    later = [p for n, p in steps if n > step]
    for name in ("best.ckpt", "last.ckpt", "averaged.ckpt"):
        path = ckpt_dir / name
        if path.is_file() and not path.samefile(resumed):
            held = checkpoint_step(path, known)
            if held is not None and held > step:
                later.append(path)
    header, kept, future = _split_metrics(run_dir / "metrics.csv", step)
    if not later and not future:
        return SetAside()
    # The results of the end the run reached describe the abandoned history, not this one.
    later += [p for p in (run_dir / "summary.json", *sorted(run_dir.glob("test-*.json"))) if p.is_file()]
    folder = _claim(run_dir / ABANDONED, f"from-step-{step}")
    moved = SetAside(folder, rows=len(future))
    if future:  # the copy first: a crash between the two writes repeats rows, never loses them
        atomic.write_text(folder / "metrics.csv", _csv(header, future), what="metrics")
        atomic.write_text(run_dir / "metrics.csv", _csv(header, kept), what="metrics")
    for path in later:
        relative = path.relative_to(run_dir)
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, folder / relative)  # same file system: nothing is copied, nothing can tear
        moved.files.append(str(relative))
    atomic.fsync_dir(ckpt_dir)
    if resumed.parent == ckpt_dir and not (ckpt_dir / "last.ckpt").exists():
        atomic.link(resumed, ckpt_dir / "last.ckpt")
    if not (ckpt_dir / "best.ckpt").exists() and best_step is not None:
        best = resumed if best_step == step else ckpt_dir / f"step-{best_step:08d}.ckpt"
        if best.is_file() and best.parent == ckpt_dir:
            atomic.link(best, ckpt_dir / "best.ckpt")
    return moved


def _claim(parent: Path, name: str) -> Path:
    """A new folder ``parent/name`` (``name-2``, ``name-3``, ... when taken): an earlier one is never reused."""
    parent.mkdir(exist_ok=True)
    for k in range(1, 10_000):
        folder = parent / (name if k == 1 else f"{name}-{k}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent} holds too many folders named {name}")


def _split_metrics(path: Path, step: int) -> tuple[list[str], list[dict[str, str]], list[dict[str, str]]]:
    """(columns, rows before ``step``, rows from ``step`` on) of a metrics.csv. Lightning logs the
    metrics of optimizer step n (and of the validation after it) as step n - 1, so a checkpoint of
    step N holds the history up to logged step N - 1."""
    if not path.is_file():
        return [], [], []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        rows = [r for r in reader if None not in r and None not in r.values()]
    kept: list[dict[str, str]] = []
    future: list[dict[str, str]] = []
    for row in rows:
        logged = row.get("step") or ""
        (future if logged.isdigit() and int(logged) >= step else kept).append(row)
    return header, kept, future


def _csv(header: list[str], rows: list[dict]) -> str:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()
