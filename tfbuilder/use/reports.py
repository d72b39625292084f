"""Comparing finished runs: one row per recipe, mean ± std over its seeds (``sweep`` and ``compare``).

Writes ``report.md`` (the table), ``report.csv`` (the same, numbers only), ``runs.csv`` (one row per
run) and ``curves.png`` (validation and training loss against steps, mean over seeds, the band
spanning the seeds).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tfbuilder.atomic import write_atomic, write_text
from tfbuilder.errors import RecipeError, TfbuilderError
from tfbuilder.model.builder import build_model, count_parameters
from tfbuilder.runs.checkpoints import scores_file
from tfbuilder.spec.diffing import MISSING, differences
from tfbuilder.spec.recipe import Recipe, load_recipe
from tfbuilder.use.readback import DamagedFile, metric, number, read_json, read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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

    def values(self, of: Callable[[RunResult], float | None]) -> list[float]:
        """``of(run)`` of each run that has it."""
        out = [of(r) for r in self.runs]
        return [float(v) for v in out if v is not None]

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
        val_curve, train_curve = _curves(run_dir / "metrics.csv")
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


def _curves(metrics: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    val: list[tuple[int, float]] = []
    train: list[tuple[int, float]] = []
    if not metrics.exists():
        return val, train
    for line, row in enumerate(read_metrics(metrics), 2):
        step = metric(row, "step", metrics, line)
        if step is None:
            continue
        step = int(step) + 1  # Lightning logs the step about to be taken
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
        rows.append(Row(name, sorted(runs, key=lambda r: r.seed), changes if name != reference.name else "(baseline)"))
    return rows


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None with fewer than two values)."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def _cell(values: list[float], digits: int) -> str:
    mean, std = mean_std(values)
    if mean is None:
        return "n/a"
    return f"{mean:,.{digits}f}" + ("" if std is None else f" ± {std:,.{digits}f}")


HEAD_KEYS = ("val_acc", "val_f1", "val_mse", "val_pearson")  # what a sequence head's run summary holds
COLUMNS = (  # (header, CSV name, how to get the values, digits)
    ("val loss", "val_loss", lambda row: row.values(lambda r: r.best_val_loss), 3),
    ("val PPL", "val_ppl", lambda row: row.perplexities(), 2),
    ("val acc %", "val_acc", lambda row: row.head("val_acc", 100.0), 1),
    ("val F1", "val_f1", lambda row: row.head("val_f1"), 3),
    ("val MSE", "val_mse", lambda row: row.head("val_mse"), 4),
    ("val r", "val_pearson", lambda row: row.head("val_pearson"), 3),
    ("BLEU", "bleu", lambda row: row.values(lambda r: r.bleu), 2),
    ("exact %", "exact_match", lambda row: row.values(lambda r: r.exact_match), 1),
    ("tokens/s", "tokens_per_s", lambda row: row.values(lambda r: r.tokens_per_s), 0),
    ("peak MiB", "peak_memory_mb", lambda row: row.values(lambda r: r.peak_memory_mb), 0),
    ("wall s", "wall_s", lambda row: row.values(lambda r: r.seconds), 1),
)


def markdown(rows: list[Row], *, beam: int = 4) -> str:
    """The report table in Markdown."""
    # Scores no run has (BLEU of a synthetic task, exact match of a language model) get no column.
    columns = [c for c in COLUMNS if any(c[2](row) for row in rows)]
    searched = {"BLEU": f"BLEU (val, beam {beam})", "exact %": f"exact % (val, beam {beam})"}
    headers = ["recipe", "changes", "params", "steps", "seeds"] + [searched.get(c[0], c[0]) for c in columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        seeds = ",".join(str(r.seed) for r in row.runs)
        steps = sorted({r.steps for r in row.runs})
        cells = [row.name, row.changes or "-", f"{row.runs[0].parameters / 1e6:.2f}M", "/".join(map(str, steps)), seeds]
        cells += [_cell(get(row), digits) for _, _, get, digits in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(rows: list[Row], out_dir: Path, *, title: str, note: str = "", beam: int = 4) -> dict[str, Path]:
    """report.md, report.csv, runs.csv and curves.png in ``out_dir``, each written whole or not at
    all (:mod:`tfbuilder.atomic`); returns their paths. A folder that cannot be made is a :class:`ReportError`."""

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    paths = {name: out_dir / name for name in ("report.md", "report.csv", "runs.csv", "curves.png")}
    text = [f"# {title}", ""]
    if note:
        text += [note, ""]
    text += [markdown(rows, beam=beam), "", _legend(beam), "", "![validation and training loss](curves.png)", ""]
    write_text(paths["report.md"], "\n".join(text), what="report")
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    stats = [f"{key}_{s}" for _, key, _, _ in COLUMNS for s in ("mean", "std")]
    writer.writerow(["recipe", "changes", "parameters", "seeds", *stats])
    for row in rows:
        cells: list = [row.name, row.changes, row.runs[0].parameters, len(row.runs)]
        for _, _, get, _ in COLUMNS:
            cells += ["" if v is None else v for v in mean_std(get(row))]
        writer.writerow(cells)
    write_text(paths["report.csv"], table.getvalue(), what="report")
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(
        [
            "recipe",
            "seed",
            "run_dir",
            "parameters",
            "steps",
            "best_val_loss",
            "bleu",
            "exact_match",
            "tokens_per_s",
            "wall_s",
        ]
    )
    for row in rows:
        for r in row.runs:
            writer.writerow(
                [
                    r.name,
                    r.seed,
                    r.dir,
                    r.parameters,
                    r.steps,
                    r.best_val_loss,
                    r.bleu,
                    r.exact_match,
                    r.tokens_per_s,
                    r.seconds,
                ]
            )
    write_text(paths["runs.csv"], table.getvalue(), what="report")
    figure = plot_curves(rows, title=title)
    write_atomic(paths["curves.png"], lambda f: figure.savefig(f, format="png", dpi=110), what="plot")
    return paths


def _legend(beam: int) -> str:
    return (
        "Each cell is the mean ± sample standard deviation over the seeds. *val loss*: the best validation "
        "loss (per-token NLL, no label smoothing; of a sequence head: per-text cross-entropy or squared error) "
        "and *val PPL* its perplexity; *val acc %*, *val F1*, *val MSE*, *val r*: a sequence head's accuracy, "
        "macro-F1, mean squared error and Pearson correlation at the last validation; *BLEU*: sacreBLEU of the best "
        f"checkpoint's beam-{beam} translations of the validation split (text data only); *exact %*: the share "
        "of those translations equal to their reference; *tokens/s*: target tokens per second "
        "of training steps; *wall s*: the whole run, data preparation and validation included."
    )


def plot_curves(rows: list[Row], *, title: str) -> Figure:
    """Validation (left) and training (right) loss against steps: mean over seeds, band = min..max."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # no pyplot: no global state, the caller's backend untouched

    fig = Figure(figsize=(13, 5), layout="constrained")
    axes = fig.subplots(1, 2)
    colours = colormaps["tab20" if len(rows) > 10 else "tab10"]
    for index, row in enumerate(rows):
        colour = colours(index % colours.N)
        for ax, curves in zip(axes, ([r.val_curve for r in row.runs], [r.train_curve for r in row.runs]), strict=True):
            steps, mean, low, high = _band(curves)
            if not steps:
                continue
            ax.plot(steps, mean, color=colour, label=row.name, linewidth=1.4)
            if len(row.runs) > 1:
                ax.fill_between(steps, low, high, color=colour, alpha=0.15, linewidth=0)
    for ax, label in zip(axes, ("validation loss (per-token NLL)", "training loss (smoothed objective)"), strict=True):
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title(title, loc="left", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=7, loc="outside right upper")
    return fig


def _band(curves: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps every seed logged, with the mean, min and max of the values there."""
    common = sorted(set.intersection(*(set(s for s, _ in c) for c in curves))) if curves else []
    tables = [dict(c) for c in curves]
    values = [[t[s] for t in tables] for s in common]
    return common, [statistics.fmean(v) for v in values], [min(v) for v in values], [max(v) for v in values]
