"""tfbuilder sweep and compare: runs over seeds, the report, skipping and resuming, refusing a changed recipe."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

import tfbuilder.train.fit
from conftest import ROOT
from tfbuilder.cli.commands import main

# Under pytest-xdist (`--dist loadgroup`) one worker runs this module, so its module-scoped fixtures are made once.
pytestmark = pytest.mark.xdist_group("sweeps")


TINY = [
    "--set", "trainer.max_steps=12", "--set", "trainer.val_every=6", "--set", "trainer.log_every=3",
    "--set", "data.train_size=300", "--set", "data.val_size=40", "--set", "data.lengths=[1, 6]",
]  # fmt: skip


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("recipes")
    quickstart = ROOT / "recipes" / "quickstart.yaml"
    a = folder / "post.yaml"
    a.write_text(f"name: tiny-post\nextends: {quickstart}\n")
    b = folder / "pre.yaml"
    b.write_text(f"name: tiny-pre\nextends: {quickstart}\nmodel: {{placement: pre, ffn: {{hidden: 64}}}}\n")
    return [a, b]


@pytest.fixture(scope="module")
def swept(recipes, tmp_path_factory):
    """A sweep of two tiny copy-task recipes over two seeds, run once for the module."""
    out = tmp_path_factory.mktemp("sweep")
    assert main(["sweep", *map(str, recipes), "--seeds", "2", "--out", str(out), *TINY]) == 0
    return out


def summaries(out: Path, name: str) -> list[dict]:
    return [json.loads((out / "runs" / name / f"seed-{s}" / "summary.json").read_text()) for s in (0, 1)]


def test_sweep_writes_the_report_with_a_row_per_recipe(swept):
    with open(swept / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["recipe"] for r in rows] == ["tiny-post", "tiny-pre"]
    assert rows[0]["changes"] == "(baseline)" and "model.ffn.hidden" not in rows[1]["changes"]
    assert "placement=pre" in rows[1]["changes"] and "ffn.hidden=64" in rows[1]["changes"]
    for row in rows:
        runs = summaries(swept, row["recipe"])
        losses = [r["best_val_loss"] for r in runs]
        assert int(row["seeds"]) == 2
        assert float(row["val_loss_mean"]) == pytest.approx(statistics.fmean(losses))
        assert float(row["val_loss_std"]) == pytest.approx(statistics.stdev(losses))
        assert float(row["val_ppl_mean"]) == pytest.approx(statistics.fmean(math.exp(x) for x in losses))
        assert float(row["tokens_per_s_mean"]) == pytest.approx(statistics.fmean(r["tokens_per_s"] for r in runs))
        # Scored on the validation split: a synthetic task by exact match, not BLEU (0 for any one-word line).
        assert row["bleu_mean"] == "" and 0.0 <= float(row["exact_match_mean"]) <= 100.0
    assert losses[0] != losses[1]  # the seeds really differ
    with open(swept / "runs.csv", newline="") as f:
        runs = list(csv.DictReader(f))
    assert [(r["recipe"], r["seed"]) for r in runs] == [("tiny-post", "0"), ("tiny-post", "1"), ("tiny-pre", "0"), ("tiny-pre", "1")]
    report = (swept / "report.md").read_text()
    assert "| tiny-pre | ffn.hidden=64, placement=pre |" in report and " ± " in report
    assert "exact % (val, beam" in report and "BLEU (val" not in report
    assert (swept / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (swept / "curves.svg").read_text()
    assert "Against the baseline (tiny-post)" in report and "| tiny-pre | 0,1 |" in report
    assert rows[0]["val_loss_diff"] == "" and rows[1]["val_loss_diff_seeds"] == "2"
    recipes = json.loads((swept / "sweep.json").read_text())["recipes"]
    assert recipes == ["tiny-post", "tiny-pre"]


def test_every_run_trains_its_seed_with_the_sweeps_overrides_on_one_vocabulary(swept):
    vocabularies = set()
    for name in ("tiny-post", "tiny-pre"):
        for seed in (0, 1):
            run = swept / "runs" / name / f"seed-{seed}"
            recipe = yaml.safe_load((run / "recipe.yaml").read_text())
            assert recipe["trainer"]["seed"] == seed
            assert recipe["trainer"]["max_steps"] == 12 and json.loads((run / "summary.json").read_text())["steps"] == 12
            assert (recipe["data"]["train_size"], recipe["data"]["val_size"], recipe["data"]["lengths"]) == (300, 40, [1, 6])
            vocabularies.add((run / "tokenizer.json").read_text())
    assert len(vocabularies) == 1  # the same data, tokenized alike, for every recipe and seed


def test_a_second_invocation_runs_nothing_new(swept, recipes, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(tfbuilder.train.fit, "fit", refuse)
    stamp = {p: p.stat().st_mtime_ns for p in swept.rglob("*.ckpt")}
    assert main(["sweep", *map(str, recipes), "--seeds", "2", "--out", str(swept), *TINY]) == 0
    assert "4 finished, 0 to resume, 0 to score, 0 to train" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in swept.rglob("*.ckpt")} == stamp


def test_an_unfinished_run_resumes_and_only_it(swept, recipes, monkeypatch, capsys):
    run = swept / "runs" / "tiny-pre" / "seed-1"
    (run / "summary.json").unlink()
    for scores in run.glob("test-val-*.json"):
        scores.unlink()
    calls = []
    real = tfbuilder.train.fit.fit

    def counting(recipe, **kwargs):
        calls.append((recipe.name, recipe.trainer.seed, kwargs.get("resume")))
        return real(recipe, **kwargs)

    monkeypatch.setattr(tfbuilder.train.fit, "fit", counting)
    assert main(["sweep", *map(str, recipes), "--seeds", "2", "--out", str(swept), *TINY]) == 0
    assert "3 finished, 1 to resume" in capsys.readouterr().err
    assert calls == [("tiny-pre", 1, run)]
    assert (run / "summary.json").exists() and list(run.glob("test-val-*.json"))


def test_a_changed_recipe_is_refused_not_mixed_in(swept, recipes, capsys):
    assert main(["sweep", *map(str, recipes), "--seeds", "2", "--out", str(swept), *TINY, "--set", "optim.lr=1e-4"]) == 2
    err = capsys.readouterr().err
    assert "was trained from a different recipe" in err and "optim.lr (0.002 -> 0.0001)" in err
    assert "Traceback" not in err


def test_compare_gives_the_sweeps_table(swept, tmp_path, capsys):
    assert main(["compare", str(swept)]) == 0
    table = capsys.readouterr().out
    report = (swept / "report.md").read_text()
    assert table.strip() in report
    # Single run directories work too, and --out never overwrites.
    runs = [str(p) for p in sorted((swept / "runs").glob("*/seed-0"))]
    assert main(["compare", *runs, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").exists() and (tmp_path / "curves.png").exists()
    assert main(["compare", *runs, "--out", str(tmp_path)]) == 2
    assert "not overwriting" in capsys.readouterr().err
    figure_only = tmp_path / "figure-only"
    figure_only.mkdir()
    (figure_only / "curves.svg").write_text("mine")
    assert main(["compare", *runs, "--out", str(figure_only)]) == 2
    assert "already has curves.svg: not overwriting" in capsys.readouterr().err
    assert (figure_only / "curves.svg").read_text() == "mine" and not (figure_only / "report.md").exists()


def test_bad_sweeps_exit_2_without_traceback(recipes, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nextends: ../nowhere.yaml\n")
    typo = tmp_path / "typo.yaml"
    typo.write_text(f"name: y\nextends: {recipes[0]}\nmodel: {{d_modle: 3}}\n")
    assert main(["sweep", str(bad), str(typo), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:2" in err and "typo.yaml:3" in err and "did you mean 'd_model'" in err  # every recipe's problems
    twin = tmp_path / "twin.yaml"
    twin.write_text(f"name: tiny-post\nextends: {recipes[1]}\n")
    assert main(["sweep", str(recipes[0]), str(twin), "--out", str(tmp_path / "s"), *TINY]) == 2
    assert "recipes share a name (tiny-post)" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "nothing-here")]) == 2
    assert main(["compare", str(tmp_path)]) == 2  # a directory without runs
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


NOT_PLANS = [
    b"{}", b"not json", b"[1, 2]", b"\xff\xfe", b'{"recipes": "mine", "runs": [], "seeds": []}',
    b'{"command": "", "recipes": ["a"], "seeds": ["zero"], "bleu_beam": null, "runs": ["r"]}', "symlink", "folder",
]  # fmt: skip


@pytest.mark.parametrize("plan", NOT_PLANS)
def test_a_sweep_json_that_is_not_a_plan_keeps_the_reports_beside_it(recipes, tmp_path, capsys, plan):
    out = tmp_path / "mine"
    out.mkdir()
    mine = {"report.md": b"# my report\n", "runs.csv": b"my,runs\n"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    if plan == "symlink":
        (tmp_path / "elsewhere.json").write_text("{}")
        (out / "sweep.json").symlink_to(tmp_path / "elsewhere.json")
    elif plan == "folder":
        (out / "sweep.json").mkdir()
    else:
        (out / "sweep.json").write_bytes(plan)
    assert main(["sweep", str(recipes[0]), "--seeds", "1", "--no-bleu", "--out", str(out), *TINY]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'sweep.json'} is not a sweep plan that tfbuilder wrote" in err and "Traceback" not in err
    assert {n: (out / n).read_bytes() for n in mine} == mine
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "runs.csv", "sweep.json"]


def test_progress_shows_the_run_and_its_steps(recipes, tmp_path):
    import io

    from rich.console import Console

    from tfbuilder.use import sweeps
    from tfbuilder.cli.sweeps import _run_with_progress

    overrides = [o for o in TINY if o != "--set"]
    sweep = sweeps.plan([recipes[0]], seeds=1, overrides=overrides, out=tmp_path, bleu_beam=None)
    steps: list[tuple[int, int]] = []
    sweeps.execute(sweep.runs[0], bleu_beam=None, on_step=lambda step, total: steps.append((step, total)))
    assert steps == [(s, 12) for s in range(1, 13)]  # every optimizer step, out of max_steps

    sweep = sweeps.plan([recipes[1]], seeds=1, overrides=overrides, out=tmp_path, bleu_beam=None)
    screen = io.StringIO()
    _run_with_progress(sweep.runs, sweep, console=Console(file=screen, force_terminal=True, color_system=None, width=120))
    shown = screen.getvalue()
    assert "tiny-pre seed 0 (new)" in shown and "12/12" in shown and "done tiny-pre seed 0" in shown


def test_a_diverging_run_does_not_stop_the_others(recipes, tmp_path, capsys):
    wild = tmp_path / "wild.yaml"
    wild.write_text(f"name: tiny-wild\nextends: {recipes[0]}\noptim: {{lr: 1.0e+30}}\n")
    assert main(["sweep", str(wild), str(recipes[1]), "--out", str(tmp_path / "s"), "--no-bleu", *TINY]) == 1
    captured = capsys.readouterr()
    assert "diverged: tiny-wild seed 0 (the loss became" in captured.err and "Traceback" not in captured.err
    assert "| tiny-pre |" in captured.out and "| tiny-wild |" not in captured.out
    assert "Not in the table (diverged): tiny-wild seed 0" in (tmp_path / "s" / "report.md").read_text()


# --- fanned out: workers that share the sweep directory, job-array tasks, a report-only pass ------------


def trained_once(out: Path) -> dict[str, int]:
    """How many invocations trained each run of the sweep (its summary's history)."""
    return {
        f"{p.parent.parent.name}/{p.parent.name}": len(json.loads(p.read_text())["history"])
        for p in sorted((out / "runs").glob("*/seed-*/summary.json"))
    }


def test_two_workers_share_a_sweep_each_entry_once_and_one_report(recipes, tmp_path, capsys):
    from test_faults import held

    out = tmp_path / "sweep"
    command = ["sweep", *map(str, recipes), "--seeds", "2", "--out", str(out), "--no-bleu", *TINY]
    assert main([*command, "--entry", "3"]) == 0  # a job-array task ran first: the plan, and entry 3
    first = out / "runs" / "tiny-post" / "seed-0"
    first.mkdir(parents=True)
    with held(first / "fit.lock"):  # another worker is training entry 0
        assert main(command) == 0
    err = capsys.readouterr().err
    assert "3 of 4 runs finished; 1 were being trained by another worker" in err
    assert not (out / "report.md").exists()  # not every run finished: no report yet
    assert main(command) == 0  # the other worker, arriving later: only entry 0 is left
    assert trained_once(out) == {f"{n}/seed-{s}": 1 for n in ("tiny-post", "tiny-pre") for s in (0, 1)}
    assert (out / "report.md").exists() and "tiny-pre" in (out / "report.md").read_text()


def test_entry_i_runs_one_entry_and_report_only_writes_the_report(recipes, tmp_path, capsys):
    out = tmp_path / "sweep"
    command = ["sweep", *map(str, recipes), "--seeds", "1", "--out", str(out), "--no-bleu", *TINY]
    assert main([*command, "--report-only"]) == 2
    assert "no finished runs to report yet" in capsys.readouterr().err
    assert main([*command, "--entry", "1"]) == 0  # a job-array task: tiny-pre, seed 0
    assert trained_once(out) == {"tiny-pre/seed-0": 1} and not (out / "report.md").exists()
    assert main([*command, "--report-only"]) == 0  # the runs finished so far
    assert "tiny-pre" in (out / "report.md").read_text() and trained_once(out) == {"tiny-pre/seed-0": 1}
    assert main([*command, "--entry", "2"]) == 2
    assert "--entry 2: the plan has entries 0 to 1" in capsys.readouterr().err
