"""What finished runs say about themselves, grouped by recipe: the numbers a report is made of.

:func:`find_runs` finds run directories, :func:`read_runs` reads each one's summary, validation scores and
loss curves (:class:`RunResult`), and :func:`group` gathers them into one :class:`Row` per recipe with
what it changes from the baseline recipe.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tfbuilder.errors import RecipeError, TfbuilderError
from tfbuilder.model.builder import build_model, count_parameters
from tfbuilder.runs import steps as numbering
from tfbuilder.runs.checkpoints import scores_file
from tfbuilder.spec.diffing import MISSING, differences
from tfbuilder.spec.recipe import Recipe, load_recipe
from tfbuilder.use.readback import DamagedFile, metric, number, read_json, read_metrics

HEAD_KEYS = ("val_acc", "val_f1", "val_mse", "val_pearson")  # what a sequence head's run summary holds

# Keys that differ between the runs of one comparison without being what is compared.
_IGNORED = ("trainer.seed", "trainer.output", "trainer.progress")


class ReportError(TfbuilderError):
    """Nothing to compare, or not a run directory."""


@dataclass
class RunResult:
    """What one finished run directory says about itself."""

    dir: Path
    recipe: Recipe
    parameters: int
    steps: int
    best_val_loss: float | None
    bleu: float | None
    tokens_per_s: float
    seconds: float
    exact_match: float | None = None  # percent of validation outputs equal to their reference
    peak_memory_mb: float | None = None  # the run's peak memory (summary.json; absent in older runs)
    head_scores: dict[str, float] = field(
        default_factory=dict
    )  # a sequence head's last validation (val_acc, val_f1, val_mse, val_pearson)
    val_curve: list[tuple[int, float]] = field(default_factory=list)
    train_curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def seed(self) -> int:
        return self.recipe.trainer.seed


@dataclass
class Row:
    """One recipe's runs, summarised."""

    name: str
    runs: list[RunResult]
    changes: str
    baseline: bool = False  # the row the others are compared with
    keys: tuple[str, ...] = ()  # the recipe keys that differ from the baseline's

    def values(self, of: Callable[[RunResult], float | None]) -> list[float]:
        """``of(run)`` of each run that has it."""
        out = [of(r) for r in self.runs]
        return [float(v) for v in out if v is not None]

    def by_seed(self, of: Callable[[RunResult], float | None]) -> dict[int, float]:
        """``of(run)`` per seed, of the runs that have it (the mean where runs share a seed)."""
        seen: dict[int, list[float]] = {}
        for run in self.runs:
            value = of(run)
            if value is not None:
                seen.setdefault(run.seed, []).append(float(value))
        return {seed: statistics.fmean(v) for seed, v in seen.items()}

    def perplexities(self) -> list[float]:
        # Of language models and translation; a sequence head's loss is per text, not per token.
        return [
            math.exp(min(r.best_val_loss, 50)) for r in self.runs if r.best_val_loss is not None and not r.head_scores
        ]

    def head(self, key: str, scale: float = 1.0) -> list[float]:
        """A sequence head's score ``key`` of each run that has it."""
        return [scale * r.head_scores[key] for r in self.runs if key in r.head_scores]


def find_runs(paths: Sequence[str | Path]) -> tuple[list[Path], list[Path]]:
    """Run directories under ``paths`` (a run, a sweep directory, or any directory holding runs), in
    order: (finished runs, unfinished ones)."""
    finished: list[Path] = []
    unfinished: list[Path] = []
    for given in paths:
        path = Path(given)
        if not path.is_dir():
            raise ReportError(f"{path}: not a directory")
        if (path / "sweep.json").exists():
            candidates = _planned(path)
        elif (path / "recipe.yaml").exists():
            candidates = [path]
        else:
            candidates = sorted(p.parent for p in path.rglob("recipe.yaml"))
        for run in candidates:
            if run in finished or run in unfinished:
                continue
            (finished if (run / "summary.json").exists() else unfinished).append(run)
    return finished, unfinished


def _planned(sweep_dir: Path) -> list[Path]:
    """The run directories a sweep's ``sweep.json`` lists (each inside the sweep directory)."""
    plan = sweep_dir / "sweep.json"
    runs = read_json(plan, what="sweep plan").get("runs")
    if not isinstance(runs, list) or not all(isinstance(r, str) and r and "\0" not in r for r in runs):
        raise DamagedFile(f"damaged sweep plan {plan}: runs is not a list of run directories")
    inside = [sweep_dir / r for r in runs if not Path(r).is_absolute() and ".." not in Path(r).parts]
    if len(inside) != len(runs):
        raise DamagedFile(f"damaged sweep plan {plan}: a run lies outside the sweep directory")
    return inside


def read_runs(run_dirs: Sequence[Path], *, beam: int = 4, warn: Callable[[str], None]) -> list[RunResult]:
    """:func:`read_run` of each directory; a run whose recipe or summary is damaged is left out, and
    ``warn`` says which and why (the report goes on without it)."""
    results = []
    for run_dir in run_dirs:
        try:
            results.append(read_run(run_dir, beam=beam, warn=warn))
        except DamagedFile as exc:
            warn(f"skipping {run_dir}: {exc}")
        except RecipeError as exc:
            warn(f"skipping {run_dir}: damaged recipe.yaml: {exc.problems[0]}")
    return results


def read_run(run_dir: Path, *, beam: int = 4, warn: Callable[[str], None] = lambda line: None) -> RunResult:
    """The summary, validation scores and curves of a finished run. A damaged recipe or summary
    raises (:class:`RecipeError`, :class:`DamagedFile`); damaged scores or metrics are left out with a warning."""
    import torch

    recipe = load_recipe(run_dir / "recipe.yaml")  # bounded like any recipe file
    summary_path = run_dir / "summary.json"
    summary = read_json(summary_path, what="run summary")
    steps = number(summary, "steps", summary_path, what="run summary")
    seconds = number(summary, "seconds", summary_path, what="run summary")
    best = number(summary, "best_val_loss", summary_path, what="run summary", optional=True)
    speed = number(summary, "tokens_per_s", summary_path, what="run summary", optional=True)
    peak = number(summary, "peak_memory_mb", summary_path, what="run summary", optional=True)
    stored = summary.get("head_scores")
    saved_head = stored if isinstance(stored, dict) else {}
    head_scores = {
        k: number(saved_head, k, summary_path, what="run summary") for k in HEAD_KEYS if saved_head.get(k) is not None
    }
    with torch.device("meta"):
        parameters = count_parameters(build_model(recipe))
    bleu = exact = None
    for stem in ("best", "last"):
        scores = scores_file(run_dir, "val", stem, beam=beam)
        if scores.exists():
            try:
                saved = read_json(scores, what="scores")
                bleu = number(saved, "bleu", scores, what="scores", optional=True)
                exact = number(saved, "exact_match", scores, what="scores", optional=True)
            except DamagedFile as exc:
                warn(f"{run_dir}: scores left out: {exc}")
            exact = None if exact is None else 100.0 * exact
            break
    try:
        val_curve, train_curve = _curves(run_dir / "metrics.csv", numbering.offset(numbering.of(summary)))
    except DamagedFile as exc:
        warn(f"{run_dir}: curves left out: {exc}")
        val_curve, train_curve = [], []
    return RunResult(
        dir=run_dir,
        recipe=recipe,
        parameters=parameters,
        steps=int(steps),
        best_val_loss=best,
        bleu=bleu,
        exact_match=exact,
        tokens_per_s=speed or 0.0,
        seconds=seconds,
        peak_memory_mb=peak,
        val_curve=val_curve,
        train_curve=train_curve,
        head_scores=head_scores,
    )


def _curves(metrics: Path, offset: int) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """Validation and training loss by optimizer step (``offset``: what the file's step numbers lack of it)."""
    val: list[tuple[int, float]] = []
    train: list[tuple[int, float]] = []
    if not metrics.exists():
        return val, train
    for line, row in enumerate(read_metrics(metrics), 2):
        step = metric(row, "step", metrics, line)
        if step is None:
            continue
        step = int(step) + offset
        for key, curve in (("val_loss", val), ("train_loss", train)):
            value = metric(row, key, metrics, line)
            if value is not None:
                curve.append((step, value))
    return val, train


def group(results: Sequence[RunResult], *, baseline: str | None = None) -> list[Row]:
    """One row per recipe name, in first-seen order; ``changes`` lists the keys that differ from
    the baseline recipe (default: the first)."""
    by_name: dict[str, list[RunResult]] = {}
    for result in results:
        by_name.setdefault(result.name, []).append(result)
    if not by_name:
        raise ReportError("no finished runs to compare")
    if baseline is not None and baseline not in by_name:
        raise ReportError(f"baseline '{baseline}' is not among the runs ({', '.join(by_name)})")
    reference = by_name[baseline or next(iter(by_name))][0].recipe
    rows = []
    for name, runs in by_name.items():
        diffs = [(k, a, b) for k, a, b in differences(reference, runs[0].recipe) if k not in _IGNORED]
        changes = ", ".join(f"{k.removeprefix('model.')}={'-' if b is MISSING else b}" for k, _, b in diffs)
        first = name == reference.name
        keys = tuple(k.removeprefix("model.") for k, _, _ in diffs)
        rows.append(Row(name, sorted(runs, key=lambda r: r.seed), "(baseline)" if first else changes, first, keys))
    return rows
