"""Comparing finished runs: one row per recipe, each number the mean over its seeds with a Student t
interval, and each recipe against the baseline (``sweep`` and ``compare``).

Writes ``report.md`` (the tables), ``report.csv`` (the same, numbers only), ``runs.csv`` (one row per
run), and ``curves.png`` and ``curves.svg`` (the loss curves, :mod:`tfbuilder.use.plots`). Reading the
runs is :mod:`tfbuilder.use.results`; the statistics, :mod:`tfbuilder.use.seed_stats`.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tfbuilder.atomic import write_atomic, write_text
from tfbuilder.use import plots
from tfbuilder.use.results import HEAD_KEYS, ReportError, Row, RunResult, find_runs, group, read_run, read_runs
from tfbuilder.use.seed_stats import MAX_SEEDS, Paired, paired_difference, seeds_needed, t_interval

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Reading runs lives in tfbuilder.use.results; its names stay importable from here.
__all__ = [
    "COLUMNS",
    "HEAD_KEYS",
    "ReportError",
    "Row",
    "RunResult",
    "find_runs",
    "group",
    "markdown",
    "mean_std",
    "plot_curves",
    "read_run",
    "read_runs",
    "report_csv",
    "write",
]


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None with fewer than two values)."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def _cell(values: list[float], digits: int) -> str:
    """The mean ± the half-width of its 95 % Student t interval (:func:`seed_stats.t_interval`);
    "(1 seed)" in place of an interval for one value."""
    interval = t_interval(values)
    if interval is None:
        return "n/a"
    mean = f"{interval.mean:,.{digits}f}"
    return mean + (" (1 seed)" if interval.half is None else f" ± {interval.half:,.{digits}f}")


class Column(NamedTuple):
    """A report column: its header, its CSV name, the number of one run, and the digits shown."""

    header: str
    key: str
    of: Callable[[RunResult], float | None]
    digits: int

    def values(self, row: Row) -> list[float]:
        return row.values(self.of)


def _perplexity(run: RunResult) -> float | None:
    # Of language models and translation; a sequence head's loss is per text, not per token.
    return None if run.best_val_loss is None or run.head_scores else math.exp(min(run.best_val_loss, 50))


def _head(key: str, scale: float = 1.0) -> Callable[[RunResult], float | None]:
    return lambda run: scale * run.head_scores[key] if key in run.head_scores else None


COLUMNS = (
    Column("val loss", "val_loss", lambda r: r.best_val_loss, 3),
    Column("val PPL", "val_ppl", _perplexity, 2),
    Column("val acc %", "val_acc", _head("val_acc", 100.0), 1),
    Column("val F1", "val_f1", _head("val_f1"), 3),
    Column("val MSE", "val_mse", _head("val_mse"), 4),
    Column("val r", "val_pearson", _head("val_pearson"), 3),
    Column("BLEU", "bleu", lambda r: r.bleu, 2),
    Column("exact %", "exact_match", lambda r: r.exact_match, 1),
    Column("tokens/s", "tokens_per_s", lambda r: r.tokens_per_s, 0),
    Column("peak MiB", "peak_memory_mb", lambda r: r.peak_memory_mb, 0),
    Column("wall s", "wall_s", lambda r: r.seconds, 1),
)
CELLS = (
    "Each cell: the mean over seeds ± the half-width of its 95 % confidence interval "
    "(Student's t, t(0.975, n−1) · s / √n); with one seed, no interval."
)


def _present(rows: list[Row]) -> list[Column]:
    # Scores no run has (BLEU of a synthetic task, exact match of a language model) get no column.
    return [c for c in COLUMNS if any(c.values(row) for row in rows)]


def _base(rows: list[Row]) -> Row:
    return next((r for r in rows if r.baseline), rows[0])


def paired(row: Row, base: Row, column: Column) -> Paired:
    """``row`` minus ``base`` in ``column``, seed by seed over the seeds both have (Student's t interval)."""
    return paired_difference(row.by_seed(column.of), base.by_seed(column.of))


def markdown(rows: list[Row], *, beam: int = 4) -> str:
    """The report table in Markdown, and (with two recipes or more) each recipe against the baseline."""
    columns = _present(rows)
    searched = {"BLEU": f"BLEU (val, beam {beam})", "exact %": f"exact % (val, beam {beam})"}
    headers = ["recipe", "changes", "params", "steps", "seeds"] + [searched.get(c.header, c.header) for c in columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        seeds = ",".join(str(r.seed) for r in row.runs)
        steps = sorted({r.steps for r in row.runs})
        cells = [row.name, row.changes or "-", f"{row.runs[0].parameters / 1e6:.2f}M", "/".join(map(str, steps)), seeds]
        cells += [_cell(c.values(row), c.digits) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", CELLS]
    if len(rows) > 1 and columns:
        lines += ["", *_against(rows, columns)]
    return "\n".join(lines)


def _against(rows: list[Row], columns: list[Column]) -> list[str]:
    """Markdown lines: each recipe minus the baseline (paired over seeds), then the seeds each would need."""
    base = _base(rows)
    headers = ["recipe", "seeds paired"] + [c.header for c in columns]
    lines = [
        f"Against the baseline ({base.name}): the recipe minus the baseline, seed by seed over the seeds both ran; "
        "the mean ± the half-width of its 95 % Student t interval, *within noise* when the interval contains 0, "
        "*beyond noise* when it does not.",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    others = [row for row in rows if row is not base]
    for row in others:
        shared = sorted({r.seed for r in row.runs} & {r.seed for r in base.runs})
        cells = [row.name, ",".join(map(str, shared)) or "none"]
        cells += [_difference_cell(paired(row, base, c), c.digits) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    first = columns[0]
    lines += [
        "",
        f"Seeds that would separate each recipe from the baseline in {first.header}, at the spread observed: "
        "the smallest n with t(0.975, n−1) · sd / √n < |mean difference|, sd that of the paired differences.",
        "",
    ]
    lines += [f"- {row.name}: {_needed(paired(row, base, first))}" for row in others]
    return lines


def _difference_cell(pair: Paired, digits: int) -> str:
    difference = pair.difference
    if difference is None:
        return "n/a (no seed in common)"
    mean = f"{difference.mean:+,.{digits}f}"
    if difference.half is None:
        return f"{mean}, cannot judge (1 seed in common)"
    return f"{mean} ± {difference.half:,.{digits}f} {'within noise' if pair.within_noise else 'beyond noise'}"


def _needed(pair: Paired) -> str:
    difference = pair.difference
    if difference is None or difference.sd is None:
        return "n/a (fewer than 2 seeds in common: no spread to go by)"
    if difference.mean == 0:
        return "n/a (the mean difference is 0)"
    needed = seeds_needed(difference)
    if needed is None:
        return f"n/a (more than {MAX_SEEDS:,} seeds)"
    now = f"{len(pair.seeds)} paired now"
    return f"about {needed} seeds ({now}{'' if pair.within_noise else ', already beyond noise'})"


def write(rows: list[Row], out_dir: Path, *, title: str, note: str = "", beam: int = 4) -> dict[str, Path]:
    """report.md, report.csv, runs.csv, curves.png and curves.svg in ``out_dir``, each written whole or
    not at all (:mod:`tfbuilder.atomic`); returns their paths. A folder that cannot be made is a
    :class:`ReportError`."""

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    paths = {name: out_dir / name for name in FILES}
    text = [f"# {title}", ""]
    if note:
        text += [note, ""]
    text += [markdown(rows, beam=beam), "", _legend(beam), "", "![validation and training loss](curves.png)", ""]
    write_text(paths["report.md"], "\n".join(text), what="report")
    write_text(paths["report.csv"], report_csv(rows), what="report")
    write_text(paths["runs.csv"], _runs_csv(rows), what="report")
    figure = plot_curves(rows, title=title)
    write_atomic(paths["curves.png"], lambda f: figure.savefig(f, format="png", dpi=110), what="plot")
    # No date in the SVG: the same runs give the same file.
    write_atomic(paths["curves.svg"], lambda f: figure.savefig(f, format="svg", metadata={"Date": None}), what="plot")
    return paths


FILES = ("report.md", "report.csv", "runs.csv", "curves.png", "curves.svg")  # what write makes
# Per column of report.csv after the mean and std: the interval, and the difference from the baseline.
_STATISTICS = ("ci_low", "ci_high", "diff", "diff_low", "diff_high", "diff_seeds", "within_noise", "seeds_needed")


def report_csv(rows: list[Row]) -> str:
    """report.csv: per recipe and column, the mean and sample std over seeds (``<key>_mean``, ``<key>_std``),
    then the 95 % Student t interval of the mean (``<key>_ci_low``, ``<key>_ci_high``) and the paired
    difference from the baseline (``<key>_diff`` with its interval, the seeds paired, ``<key>_within_noise``
    1 or 0, and ``<key>_seeds_needed``). Blank where there is no such number."""
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    legacy = [f"{c.key}_{s}" for c in COLUMNS for s in ("mean", "std")]
    writer.writerow(
        ["recipe", "changes", "parameters", "seeds", *legacy, *(f"{c.key}_{s}" for c in COLUMNS for s in _STATISTICS)]
    )
    base = _base(rows)
    for row in rows:
        cells: list = [row.name, row.changes, row.runs[0].parameters, len(row.runs)]
        for column in COLUMNS:
            cells += ["" if v is None else v for v in mean_std(column.values(row))]
        for column in COLUMNS:
            interval = t_interval(column.values(row))
            cells += ["", ""] if interval is None else [_blank(interval.low), _blank(interval.high)]
            cells += _difference_cells(None if row is base else paired(row, base, column))
        writer.writerow(cells)
    return table.getvalue()


def _blank(value: float | int | bool | None) -> float | int | str:
    return "" if value is None else int(value) if isinstance(value, bool) else value


def _difference_cells(pair: Paired | None) -> list[float | int | str]:
    """The CSV cells of a paired difference: mean, low, high, seeds, within noise, seeds needed."""
    if pair is None or pair.difference is None:
        return [""] * 6
    d = pair.difference
    return [d.mean, _blank(d.low), _blank(d.high), len(pair.seeds), _blank(pair.within_noise), _blank(seeds_needed(d))]


def _runs_csv(rows: list[Row]) -> str:
    """runs.csv: one line per run."""
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
    return table.getvalue()


def _legend(beam: int) -> str:
    return (
        "Each cell is the mean over the seeds ± the half-width of its 95 % confidence interval, from Student's "
        "t distribution: t(0.975, n−1) · s / √n for n seeds of sample standard deviation s (report.csv also "
        "holds the standard deviation); a recipe with one seed has no interval. Against the baseline, each "
        "recipe's difference is paired: taken seed by seed over the seeds both recipes ran, with the same t "
        "interval over those differences; *within noise* means that interval contains 0, so the seeds cannot "
        "tell the two recipes apart; fewer than 2 seeds in common cannot be judged. The seeds a recipe would "
        "need is the smallest n whose interval, at the spread of the differences seen, would leave 0 out. "
        "*val loss*: the best validation loss (per-token NLL, no label smoothing; of a sequence head: per-text "
        "cross-entropy or squared error) and *val PPL* its perplexity; *val acc %*, *val F1*, *val MSE*, "
        "*val r*: a sequence head's accuracy, macro-F1, mean squared error and Pearson correlation at the last "
        f"validation; *BLEU*: sacreBLEU of the best checkpoint's beam-{beam} translations of the validation "
        "split (text data only); *exact %*: the share of those translations equal to their reference; "
        "*tokens/s*: target tokens per second of training steps; *wall s*: the whole run, data preparation and "
        "validation included. The figure (curves.png, curves.svg) draws the mean loss over seeds at each step, "
        "its band from the lowest to the highest seed."
    )


def plot_curves(rows: list[Row], *, title: str) -> Figure:
    """The rows' loss curves (:func:`tfbuilder.use.plots.plot_curves`): validation loss of every recipe,
    training loss beside it when all recipes share one label smoothing; the title names the keys swept."""
    series = [
        plots.Series(
            row.name,
            [r.val_curve for r in row.runs],
            [r.train_curve for r in row.runs],
            row.runs[0].recipe.optim.label_smoothing,
            row.baseline,
        )
        for row in rows
    ]
    swept = list(dict.fromkeys(k for row in rows for k in row.keys))
    return plots.plot_curves(series, title=title, swept=swept)
