"""A sweep's loss curves as a figure a paper can take (``curves.png`` and ``curves.svg``).

The title says what was swept; the legend, how many seeds each recipe ran; the caption, what the
line and the band are. Every recipe has its own colour and line style. Up to :data:`OVERLAID`
recipes share one panel; beyond that each has its own (small multiples), the baseline drawn faintly
in every panel. The validation loss (per-token NLL, no label smoothing) always compares; a
training-loss panel is drawn only when every recipe trains with the same label smoothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Curve = list[tuple[int, float]]  # (step, value)

# Matplotlib's tab10 colours crossed with three line styles: neighbours differ in both, and no two
# of the first 30 recipes look alike.
COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
LINE_STYLES = ("-", "--", "-.")
OVERLAID = 8  # more recipes than this: one panel each
BAND = "band: lowest to highest seed at each step (no band with one seed)"
VAL_LABEL = "validation loss (per-token NLL)"


@dataclass
class Series:
    """One recipe's curves, one per seed, and what the figure says about it."""

    name: str
    val: list[Curve]
    train: list[Curve]
    label_smoothing: float
    baseline: bool = False

    @property
    def label(self) -> str:
        seeds = len(self.val)
        return f"{self.name} ({seeds} seed{'' if seeds == 1 else 's'})"


def style(index: int) -> tuple[str, str]:
    """The colour and line style of the ``index``-th recipe: unique for the first 30."""
    return COLOURS[index % len(COLOURS)], LINE_STYLES[index % len(LINE_STYLES)]


def plot_curves(series: Sequence[Series], *, title: str, swept: Sequence[str] = ()) -> Figure:
    """The loss curves of each recipe: the mean over its seeds at each step, the band from the lowest
    to the highest seed. One panel (plus a training-loss panel when every recipe's label smoothing is
    the same) up to :data:`OVERLAID` recipes, one panel per recipe beyond."""
    from matplotlib.figure import Figure  # no pyplot: no global state, the caller's backend untouched

    smoothing = sorted({s.label_smoothing for s in series})
    with_train = len(smoothing) == 1
    if len(series) > OVERLAID:
        fig = _small_multiples(series, Figure)
        shown = "validation loss, one panel per recipe, the baseline faint in each"
    else:
        fig = Figure(figsize=(12 if with_train else 7.5, 4.8), layout="constrained")
        axes = fig.subplots(1, 2 if with_train else 1, squeeze=False)[0]
        for index, one in enumerate(series):
            _draw(axes[0], one.val, index, one.label)
            if with_train:
                _draw(axes[1], one.train, index, one.label)
        _label(axes[0], VAL_LABEL)
        if with_train:
            _label(axes[1], f"training loss (smoothed objective, ε_ls = {smoothing[0]:g})")
        shown = "validation loss" + (" (left) and training loss (right)" if with_train else "")
    handles, labels = fig.axes[0].get_legend_handles_labels()
    if len(series) > OVERLAID:
        handles, labels = _all_handles(fig)
    if handles:
        fig.legend(handles, labels, fontsize=7, loc="outside right upper")
    fig.suptitle(_title(title, swept, series), fontsize=10)
    fig.supxlabel(_caption(shown, smoothing), fontsize=7)
    return fig


def _title(title: str, swept: Sequence[str], series: Sequence[Series]) -> str:
    baseline = next((s.name for s in series if s.baseline), series[0].name if series else "")
    keys = list(swept)
    what = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
    return f"{title}\nswept: {what or 'nothing (the recipes agree)'}; baseline {baseline}"


def _caption(shown: str, smoothing: list[float]) -> str:
    caption = f"{shown[0].upper()}{shown[1:]}. Line: mean over seeds; {BAND}."
    if len(smoothing) > 1:
        values = ", ".join(f"{s:g}" for s in smoothing)
        caption += (
            f"\nNo training-loss panel: the recipes' label smoothing differs ({values}), "
            "so their training objectives do not compare."
        )
    return caption


def _label(ax: Axes, ylabel: str) -> None:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def _draw(ax: Axes, curves: list[Curve], index: int, label: str, *, faint: bool = False) -> None:
    """One recipe's mean line and min..max band on ``ax`` in its own colour and style."""
    steps, mean, low, high = band(curves)
    if not steps:
        return
    colour, line = style(index)
    width, alpha = (1.0, 0.4) if faint else (1.5, 1.0)
    ax.plot(steps, mean, color=colour, linestyle=line, label=label, linewidth=width, alpha=alpha)
    if len(curves) > 1 and not faint:
        ax.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)


def _small_multiples(series: Sequence[Series], make: type[Figure]) -> Figure:
    """One panel per recipe, sharing both axes; the baseline faint in each other panel."""
    columns = min(4, len(series))
    rows = math.ceil(len(series) / columns)
    fig = make(figsize=(3.2 * columns + 2.2, 2.6 * rows + 1.2), layout="constrained")
    axes = fig.subplots(rows, columns, sharex=True, sharey=True, squeeze=False).ravel()
    base = next((i for i, s in enumerate(series) if s.baseline), 0)
    for index, (ax, one) in enumerate(zip(axes, series, strict=False)):
        if index != base:
            _draw(ax, series[base].val, base, "_baseline", faint=True)
        _draw(ax, one.val, index, one.label)
        ax.set_title(one.label, fontsize=8)
        _label(ax, VAL_LABEL if index % columns == 0 else "")
        ax.set_xlabel("step" if index >= len(series) - columns else "")  # under each column's last panel
    for ax in axes[len(series) :]:
        ax.set_visible(False)
    return fig


def _all_handles(fig: Figure) -> tuple[list, list[str]]:
    """Each panel's own recipe line, for one legend over the small multiples."""
    handles, labels = [], []
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if not label.startswith("_") and label not in labels:
                handles.append(handle)
                labels.append(label)
    return handles, labels


def band(curves: list[Curve]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps every seed logged, with the mean, min and max of the values there."""
    common = sorted(set.intersection(*(set(s for s, _ in c) for c in curves))) if curves else []
    tables = [dict(c) for c in curves]
    values = [[t[s] for t in tables] for s in common]
    return common, [statistics.fmean(v) for v in values], [min(v) for v in values], [max(v) for v in values]
