"""The sweep report's statistics (Student t intervals, paired differences, seeds needed) and its figure,
from runs made up in memory: the numbers are chosen so that every interval can be worked out by hand."""

from __future__ import annotations

import csv
import io
import math
from functools import cache
from pathlib import Path

import pytest

from conftest import ROOT
from tfbuilder.spec.recipe import Recipe, recipe_from_dict
from tfbuilder.use import plots, reports
from tfbuilder.use.results import RunResult, group
from tfbuilder.use.seed_stats import Interval, paired_difference, seeds_needed, t_interval

# By hand, from a table of Student's t: t(0.975, 2) = 4.302653, so [1, 2, 3] (mean 2, s = 1) has the
# 95 % half-width 4.302653 / sqrt(3).
T_975_2 = 4.302652729749464
HALF_123 = T_975_2 / math.sqrt(3)  # 2.4841...


@cache
def _recipe(name: str, seed: int, smoothing: float, hidden: int) -> Recipe:
    data = {
        "name": name,
        "extends": str(ROOT / "recipes" / "quickstart.yaml"),
        "trainer": {"seed": seed},
        "optim": {"label_smoothing": smoothing},
        "model": {"ffn": {"hidden": hidden}},
    }
    return recipe_from_dict(data)


def run(name: str, seed: int, loss: float, *, smoothing: float = 0.0, hidden: int = 128) -> RunResult:
    """A finished run of recipe ``name`` whose best validation loss is ``loss``."""
    curve = [(step, loss + 1.0 / step) for step in (1, 2, 4)]
    return RunResult(
        dir=Path(f"runs/{name}/seed-{seed}"),
        recipe=_recipe(name, seed, smoothing, hidden),
        parameters=1000,
        steps=4,
        best_val_loss=loss,
        bleu=None,
        tokens_per_s=100.0 + seed,
        seconds=2.0,
        val_curve=curve,
        train_curve=[(s, v + 0.1) for s, v in curve],
    )


def recipes(base: dict[int, float], other: dict[int, float]) -> list[reports.Row]:
    """Two recipes, ``base`` the baseline, each a run per seed with the loss given."""
    runs = [run("base", s, v) for s, v in base.items()] + [run("wide", s, v, hidden=256) for s, v in other.items()]
    return group(runs)


def csv_rows(rows: list[reports.Row]) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(reports.report_csv(rows))))


# --- the interval over seeds ------------------------------------------------------------------


def test_the_interval_of_three_values_is_students_t():
    interval = t_interval([1.0, 2.0, 3.0])
    assert interval is not None
    assert interval.mean == pytest.approx(2.0) and interval.sd == pytest.approx(1.0)
    assert interval.half == pytest.approx(2.4841377117503)
    assert interval.half == pytest.approx(HALF_123)
    assert (interval.low, interval.high) == pytest.approx((2.0 - HALF_123, 2.0 + HALF_123))
    # Two values: t(0.975, 1) = 12.706205 (a table's value), s = sqrt(2)/2 * |a - b|.
    two = t_interval([1.0, 3.0])
    assert two is not None and two.half == pytest.approx(12.706204736174704 * math.sqrt(2) / math.sqrt(2))


def test_one_seed_has_no_interval_and_the_report_says_so():
    one = t_interval([5.0])
    assert one is not None and (one.mean, one.half, one.low) == (5.0, None, None)
    assert t_interval([]) is None
    assert reports._cell([1.0, 2.0, 3.0], 3) == f"2.000 ± {HALF_123:.3f}"
    assert reports._cell([5.0], 3) == "5.000 (1 seed)"
    table = reports.markdown(group([run("base", 0, 5.0)]))
    assert "| 5.000 (1 seed) |" in table and "Student's t" in table


# --- the paired difference against the baseline ------------------------------------------------


def test_the_paired_difference_uses_matching_seeds_only():
    pair = paired_difference({0: 1.0, 1: 2.0, 2: 3.0, 7: 100.0}, {0: 0.0, 1: 0.0, 2: 0.0, 9: -50.0})
    assert pair.seeds == (0, 1, 2)
    assert pair.difference is not None
    assert pair.difference.mean == pytest.approx(2.0) and pair.difference.half == pytest.approx(HALF_123)
    # Through the report: the baseline's seed 3 and the other's seed 5 have no partner and change nothing.
    rows = recipes({0: 3.0, 1: 3.0, 2: 3.0, 3: 99.0}, {0: 4.0, 1: 5.0, 2: 6.0, 5: -99.0})
    wide = csv_rows(rows)[1]
    assert float(wide["val_loss_diff"]) == pytest.approx(2.0)
    assert float(wide["val_loss_diff_low"]) == pytest.approx(2.0 - HALF_123)
    assert float(wide["val_loss_diff_high"]) == pytest.approx(2.0 + HALF_123)
    assert wide["val_loss_diff_seeds"] == "3"
    assert "| wide | 0,1,2 |" in reports.markdown(rows)


def test_within_noise_when_the_interval_holds_zero_and_beyond_when_not():
    noisy = recipes({0: 3.0, 1: 3.0, 2: 3.0}, {0: 4.0, 1: 5.0, 2: 6.0})  # +2 ± 2.48: holds 0
    clear = recipes({0: 3.0, 1: 3.0, 2: 3.0}, {0: 4.9, 1: 5.0, 2: 5.1})  # +2 ± 0.248: does not
    assert f"+2.000 ± {HALF_123:.3f} within noise" in reports.markdown(noisy)
    assert f"+2.000 ± {HALF_123 / 10:.3f} beyond noise" in reports.markdown(clear)
    assert csv_rows(noisy)[1]["val_loss_within_noise"] == "1"
    assert csv_rows(clear)[1]["val_loss_within_noise"] == "0"
    lower = recipes({0: 3.0, 1: 3.0, 2: 3.0}, {0: 1.1, 1: 1.0, 2: 0.9})  # -2 ± 0.248: below, and beyond noise
    assert f"-2.000 ± {HALF_123 / 10:.3f} beyond noise" in reports.markdown(lower)
    # Just inside and just outside: a difference of mean 2 whose half-width is a hair above or below 2.
    sd = 2.0 * math.sqrt(3) / T_975_2
    for scale, within in ((1.001, True), (0.999, False)):
        pair = paired_difference({0: 2.0 - sd * scale, 1: 2.0, 2: 2.0 + sd * scale}, {0: 0.0, 1: 0.0, 2: 0.0})
        assert pair.within_noise is within


def test_fewer_than_two_matching_seeds_cannot_be_judged():
    rows = recipes({0: 3.0, 1: 3.0}, {1: 4.0, 2: 5.0})
    table = reports.markdown(rows)
    assert "+1.000, cannot judge (1 seed in common)" in table
    assert "- wide: n/a (fewer than 2 seeds in common" in table
    wide = csv_rows(rows)[1]
    assert wide["val_loss_diff"] == "1.0" and wide["val_loss_within_noise"] == "" and wide["val_loss_seeds_needed"] == ""
    assert paired_difference({1: 1.0}, {2: 1.0}).within_noise is None
    assert "n/a (no seed in common)" in reports.markdown(recipes({0: 3.0}, {1: 4.0}))


# --- how many seeds would tell them apart -------------------------------------------------------


def test_the_seeds_needed_are_the_smallest_n_whose_interval_leaves_zero_out():
    # Mean 2, sd 1: t(0.975, n-1) / sqrt(n) is 8.98 at n = 2, 2.48 at n = 3, 1.59 at n = 4 (< 2).
    assert seeds_needed(Interval(2.0, None, 1.0, 3)) == 4
    assert seeds_needed(Interval(-2.0, None, 1.0, 3)) == 4
    # Mean 0.5, sd 1: t(0.975, 16) / sqrt(17) = 2.1199 / 4.1231 = 0.514; t(0.975, 17) / sqrt(18) = 2.1098 / 4.2426 = 0.497.
    assert seeds_needed(Interval(0.5, None, 1.0, 3)) == 18
    assert seeds_needed(Interval(1.0, None, 0.0, 2)) == 2  # no spread: two seeds do
    assert seeds_needed(Interval(0.0, None, 1.0, 3)) is None  # no difference to find
    assert seeds_needed(Interval(1.0, None, None, 1)) is None  # no spread known
    assert seeds_needed(Interval(1e-9, None, 1.0, 3)) is None  # more than any sweep would run


def test_the_report_says_per_recipe_how_many_seeds_would_separate_it():
    noisy = recipes({0: 3.0, 1: 3.0, 2: 3.0}, {0: 4.0, 1: 5.0, 2: 6.0})
    assert "- wide: about 4 seeds (3 paired now)" in reports.markdown(noisy)
    clear = recipes({0: 3.0, 1: 3.0, 2: 3.0}, {0: 4.9, 1: 5.0, 2: 5.1})
    assert "- wide: about 2 seeds (3 paired now, already beyond noise)" in reports.markdown(clear)
    same = recipes({0: 3.0, 1: 3.0, 2: 3.0}, {0: 2.0, 1: 3.0, 2: 4.0})
    assert "- wide: n/a (the mean difference is 0)" in reports.markdown(same)
    assert csv_rows(noisy)[1]["val_loss_seeds_needed"] == "4"


# --- report.csv ---------------------------------------------------------------------------------


def test_report_csv_keeps_its_columns_first_and_adds_the_statistics_after():
    rows = recipes({0: 3.0, 1: 3.0, 2: 3.0}, {0: 4.0, 1: 5.0, 2: 6.0})
    header = next(csv.reader(io.StringIO(reports.report_csv(rows))))
    legacy = ["recipe", "changes", "parameters", "seeds"] + [f"{c.key}_{s}" for c in reports.COLUMNS for s in ("mean", "std")]
    assert header[: len(legacy)] == legacy  # old readers, by name or by position, read what they read
    added = ["ci_low", "ci_high", "diff", "diff_low", "diff_high", "diff_seeds", "within_noise", "seeds_needed"]
    assert header[len(legacy) :] == [f"{c.key}_{s}" for c in reports.COLUMNS for s in added]
    base, wide = csv_rows(rows)
    assert float(wide["val_loss_mean"]) == pytest.approx(5.0) and float(wide["val_loss_std"]) == pytest.approx(1.0)
    assert float(wide["val_loss_ci_low"]) == pytest.approx(5.0 - HALF_123)
    assert float(wide["val_loss_ci_high"]) == pytest.approx(5.0 + HALF_123)
    assert base["changes"] == "(baseline)" and base["val_loss_diff"] == "" and base["val_loss_ci_low"] == "3.0"
    assert wide["bleu_mean"] == "" and wide["bleu_ci_low"] == "" and wide["bleu_diff"] == ""  # no run has BLEU


def test_baseline_by_name_is_the_one_differences_are_taken_from():
    runs = [run("base", s, 3.0) for s in (0, 1)] + [run("wide", s, 4.0 + s, hidden=256) for s in (0, 1)]
    rows = group(runs, baseline="wide")
    assert [r.baseline for r in rows] == [False, True]
    assert "Against the baseline (wide)" in reports.markdown(rows)
    assert float(csv_rows(rows)[0]["val_loss_diff"]) == pytest.approx(-1.5)


# --- the figure ---------------------------------------------------------------------------------


def many(count: int, *, smoothing: tuple[float, ...] = (0.0,)) -> list[reports.Row]:
    """``count`` recipes (the first the baseline) of three seeds each, widths 128, 129, ..."""
    runs = [
        run(f"r{i:02d}", s, 3.0 + i / 10 + s / 100, hidden=128 + i, smoothing=smoothing[i % len(smoothing)])
        for i in range(count)
        for s in range(3)
    ]
    return group(runs)


def lines_by_label(fig) -> dict[str, tuple]:
    return {line.get_label(): (line.get_color(), line.get_linestyle()) for ax in fig.axes for line in ax.get_lines()}


def test_the_figure_says_what_was_swept_and_how_many_seeds():
    fig = reports.plot_curves(many(3), title="sweep demo")
    title = fig.get_suptitle()
    assert title.startswith("sweep demo") and "swept: ffn.hidden" in title and "baseline r00" in title
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["r00 (3 seeds)", "r01 (3 seeds)", "r02 (3 seeds)"]
    caption = fig.get_supxlabel()
    assert "band: lowest to highest seed" in caption and "mean over seeds" in caption
    assert len(fig.axes) == 2 and "training loss" in fig.axes[1].get_ylabel()  # one label smoothing: both panels
    assert "NLL" in fig.axes[0].get_ylabel()


def test_no_training_loss_panel_when_the_label_smoothing_differs():
    fig = reports.plot_curves(many(2, smoothing=(0.0, 0.1)), title="t")
    assert len(fig.axes) == 1 and "NLL" in fig.axes[0].get_ylabel()
    assert "No training-loss panel" in fig.get_supxlabel() and "(0, 0.1)" in fig.get_supxlabel()


def test_every_recipe_has_its_own_colour_and_line_style():
    assert len({plots.style(i) for i in range(30)}) == 30
    assert all(plots.style(i)[0] != plots.style(i + 1)[0] and plots.style(i)[1] != plots.style(i + 1)[1] for i in range(29))
    fig = reports.plot_curves(many(8), title="t")
    drawn = lines_by_label(fig)
    assert len(drawn) == 8 and len(set(drawn.values())) == 8


def test_beyond_eight_recipes_each_has_a_panel_with_the_baseline_faint():
    fig = reports.plot_curves(many(9), title="t")
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == 9
    assert [ax.get_title() for ax in shown] == [f"r{i:02d} (3 seeds)" for i in range(9)]
    for ax in shown[1:]:
        faint = [line for line in ax.get_lines() if line.get_label() == "_baseline"]
        assert len(faint) == 1 and faint[0].get_alpha() < 1
    assert len(set(lines_by_label(fig).values()) - {None}) >= 9
    assert "one panel per recipe" in fig.get_supxlabel()


def test_write_makes_the_report_and_both_pictures(tmp_path):
    paths = reports.write(many(2), tmp_path, title="demo")
    assert set(paths) == set(reports.FILES) and all(p.exists() for p in paths.values())
    assert paths["curves.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = paths["curves.svg"].read_text()
    assert "<svg" in svg and "<dc:date>" not in svg  # no date: the same runs give the same file
    report = paths["report.md"].read_text()
    assert "Student's t" in report and "Against the baseline (r00)" in report
