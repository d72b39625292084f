"""A CSV metrics logger for Lightning that never drops rows: a resumed run appends to the same file.

(Lightning's CSVLogger deletes an existing metrics.csv when its directory is not empty.) Every save
rewrites the file atomically (temporary file, fsync, rename): a full disk or a kill leaves the
previous file whole, never a torn row.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from tfbuilder.atomic import write_text


class MetricsCSV(Logger):
    """Writes ``<run_dir>/metrics.csv``: one row per logging call, columns added as metrics appear."""

    def __init__(self, run_dir: Path):
        super().__init__()
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.csv"
        self._pending: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._rows: list[dict[str, str]] = []  # what the file holds
        self.step_of: Callable[[], int] | None = None  # the step a row is numbered by (else Lightning's)
        if self.path.exists():
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                self._columns = list(reader.fieldnames or [])
                self._rows = [
                    r for r in reader if None not in r and None not in r.values()
                ]  # a row torn by an older version is dropped

    @property
    def name(self) -> str:
        return self.run_dir.parent.name

    @property
    def version(self) -> str:
        return self.run_dir.name

    @property
    def log_dir(self) -> str:
        return str(self.run_dir)

    @property
    def save_dir(self) -> str:
        return str(self.run_dir)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass  # the resolved recipe is saved as recipe.yaml

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        row = {
            "step": self.step_of() if self.step_of is not None else step,
            **{k: float(v) for k, v in metrics.items()},
        }
        self._pending.append(row)

    @rank_zero_only
    def save(self) -> None:
        if not self._pending:
            return
        new = {k for row in self._pending for k in row} - set(self._columns)
        if new:
            self._columns = ["step"] + sorted((set(self._columns) | new) - {"step"})
        rows = self._rows + self._pending
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self._columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_text(self.path, text.getvalue(), what="metrics")
        self._rows = rows
        self._pending = []

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.save()
