"""Outputs and run directories under faults: nothing the user had is overwritten, a damaged run or
sweep directory is reported by path or skipped with a warning, never a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import QUICKSTART, ONE_LAYER, short_run
from hostile import assert_refused, run_cli, run_limited

TINY = ["--set", "trainer.max_steps=2", "--set", "trainer.val_every=2", *(x for o in ONE_LAYER for x in ("--set", o))]


def _sets(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def _hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """A finished sweep of one tiny run (two steps)."""
    from tfbuilder.cli.commands import main

    root = tmp_path_factory.mktemp("faults")
    out = root / "sweep"
    args = ["sweep", str(QUICKSTART), "--out", str(out), "--no-bleu", *TINY, *_sets(short_run(root, train=200, val=20))]
    assert main(args) == 0
    return out


# --- what the user had is never overwritten -----------------------------------------------------------


def test_sweep_out_refuses_a_folder_of_the_users_files(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes\n")
    (mine / "sweep-notes.txt").write_text("keep\n")
    before = _hashes(mine)
    outcome = run_cli(["sweep", str(QUICKSTART), "--out", str(mine), *TINY, *_sets(short_run(tmp_path, train=200, val=20))], capsys)
    assert_refused(outcome, "not a sweep directory (no sweep.json)", seconds=60)
    assert _hashes(mine) == before


def test_run_dir_variable_naming_a_foreign_folder_is_refused(tmp_path, capsys, monkeypatch):
    foreign = tmp_path / "results"
    foreign.mkdir()
    (foreign / "summary.json").write_text('{"mine": true}\n')
    (foreign / "metrics.csv").write_text("step,loss\n1,2\n")
    before = _hashes(foreign)
    monkeypatch.setenv("TFBUILDER_RUN_DIR", str(foreign))
    outcome = run_cli(["fit", str(QUICKSTART), *TINY, *_sets(short_run(tmp_path, train=200, val=20))], capsys)
    assert_refused(outcome, "is not a tfbuilder run directory", seconds=60)
    assert _hashes(foreign) == before


# --- damaged run and sweep directories ----------------------------------------------------------------

DAMAGE = {  # file (relative to the run) -> (bytes, what compare does)
    "summary-not-json": ("summary.json", b"{not json", "skipping"),
    "summary-list": ("summary.json", b"[1, 2]", "skipping"),
    "summary-steps-text": ("summary.json", b'{"steps": "many", "seconds": 1}', "skipping"),
    "summary-deep": ("summary.json", b"[" * 100_000 + b"]" * 100_000, "skipping"),
    "summary-binary": ("summary.json", b"\xff\xfe\x00garbage", "skipping"),
    "metrics-garbage": ("metrics.csv", b"step,val_loss\nx,y\n", "curves left out"),
    "metrics-no-step": ("metrics.csv", b"a,b\n1,2\n", "curves left out"),
    "metrics-binary": ("metrics.csv", b"\xff\x00\xfe", "curves left out"),
    "recipe-not-yaml": ("recipe.yaml", b"model: [unclosed\n", "skipping"),
    "recipe-invalid": ("recipe.yaml", b"model: {d_model: wide}\n", "skipping"),
    "recipe-list": ("recipe.yaml", b"- 1\n- 2\n", "skipping"),
}


def _copy(sweep_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    runs = sorted(p.parent for p in (copy / "runs").rglob("summary.json"))
    return copy, runs[0]


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_compare_goes_on_without_a_damaged_file(sweep_dir, tmp_path, capsys, damage):
    name, data, said = DAMAGE[damage]
    copy, run = _copy(sweep_dir, tmp_path)
    (run / name).write_bytes(data)
    outcome = run_cli(["compare", str(copy)], capsys)
    report = f"rc={outcome.rc}\n{outcome.err}"
    assert "Traceback" not in outcome.err, report
    assert said in outcome.err and str(run / name if said != "skipping" else run) in outcome.err, report
    # the only run skipped: nothing left to compare (exit 2); curves left out: the table is still made
    assert outcome.rc == (2 if said == "skipping" else 0), report


@pytest.mark.parametrize("plan", [b"{bad", b'{"runs": 3}', b'{"runs": ["../../etc"]}', b"[]"])
def test_a_damaged_sweep_plan_is_named(sweep_dir, tmp_path, capsys, plan):
    copy, _ = _copy(sweep_dir, tmp_path)
    (copy / "sweep.json").write_bytes(plan)
    assert_refused(run_cli(["compare", str(copy)], capsys), str(copy / "sweep.json"))


BOMB = "a: &a [" + ",".join(["x"] * 9) + "]\n" + "".join(
    f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi")
) + "model: *i\n"


def test_an_alias_bomb_in_a_sweeps_run_directory_is_refused_within_bounds(sweep_dir, tmp_path):
    copy, run = _copy(sweep_dir, tmp_path)
    (run / "recipe.yaml").write_text(BOMB)
    before = _hashes(copy)
    args = ["sweep", str(QUICKSTART), "--out", str(copy), "--no-bleu", "--dry-run", *TINY, *_sets(short_run(tmp_path, train=200, val=20))]
    outcome = run_limited(args, cwd=tmp_path, timeout=300)
    assert_refused(outcome, "recipe.yaml", "YAML aliases expand", seconds=60)
    assert _hashes(copy) == before


# --- outputs on bad targets ------------------------------------------------------------------------


def test_compare_out_under_a_regular_file_is_refused(sweep_dir, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine\n")
    outcome = run_cli(["compare", str(sweep_dir), "--out", str(tmp_path / "afile" / "report")], capsys)
    assert_refused(outcome, "is a file, not a directory")
    assert (tmp_path / "afile").read_text() == "mine\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_compare_out_on_a_read_only_folder_is_refused(sweep_dir, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert_refused(run_cli(["compare", str(sweep_dir), "--out", str(locked / "r")], capsys), "is not writable")
        assert not any(locked.iterdir())
    finally:
        locked.chmod(0o755)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_standard_output_on_a_full_device_is_an_error(tmp_path):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "tfbuilder", "components"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "cannot write to standard output" in proc.stderr, proc.stderr
