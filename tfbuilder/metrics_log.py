"""A CSV metrics logger for Lightning that never drops rows: a resumed run appends to the same file.

(Lightning's CSVLogger deletes an existing metrics.csv when its directory is not empty.)
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only


class MetricsCSV(Logger):
    """Writes ``<run_dir>/metrics.csv``: one row per logging call, columns added as metrics appear."""

    def __init__(self, run_dir: Path):
        super().__init__()
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.csv"
        self._pending: list[dict[str, Any]] = []
        self._columns: list[str] = []
        if self.path.exists():
            with self.path.open(newline="") as f:
                self._columns = next(csv.reader(f), [])

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
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._pending.append(row)

    @rank_zero_only
    def save(self) -> None:
        if not self._pending:
            return
        new = sorted({k for row in self._pending for k in row} - set(self._columns))
        if new:
            old_rows: list[dict[str, str]] = []
            if self.path.exists():
                with self.path.open(newline="") as f:
                    old_rows = list(csv.DictReader(f))
            self._columns = ["step"] + sorted((set(self._columns) | set(new)) - {"step"})
            with self.path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self._columns)
                writer.writeheader()
                writer.writerows(old_rows)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self._columns).writerows(self._pending)
        self._pending = []

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.save()
