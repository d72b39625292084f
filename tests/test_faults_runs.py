"""A finished run directory with hostile contents: its lock file a link, a pipe or a folder; its
metrics.csv with rows that cannot be read; its abandoned/ folder taken. Each is refused with exit 2
naming the path, or handled, and every byte the user had is still there afterwards."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from hostile import assert_refused, run_cli
import test_faults

from tfbuilder.atomic import TEMP_MARK
from tfbuilder.cli.commands import main
from tfbuilder.runs import rewind
from tfbuilder.runs.checkpoints import read_checkpoint
from tfbuilder.use.results import read_run

QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
TINY = [*test_faults.TINY, "trainer.log_every=1"]  # the tiny run of test_faults.py, every step in metrics.csv


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One tiny finished run (checkpoints at steps 8, 12 and 16); a test works on a copy of it."""
    out = tmp_path_factory.mktemp("trained")
    args = sum((["--set", o] for o in [f"trainer.output={out / 'runs'}", *TINY]), [])
    assert main(["fit", str(QUICKSTART), *args]) == 0
    return out / "runs" / "quickstart" / "version_0"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy, symlinks=True)
    return copy


def hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != "fit.lock" and TEMP_MARK not in p.name
    }


def resume(run: Path, capsys, *more: str):
    """``fit --resume`` of the copied run (--force: it was copied), two steps on."""
    return run_cli(["fit", "--resume", str(run), "--force", "--set", "trainer.max_steps=18", *more], capsys)


def from_step_8(run: Path, capsys):
    return run_cli(["fit", "--resume", str(run / "checkpoints" / "step-00000008.ckpt"), "--force",
                    "--set", "trainer.max_steps=10"], capsys)  # fmt: skip


# --- fit.lock: only a plain file of its own is ever opened, truncated or written ---------------------


def _symlink_to_mine(run: Path, tmp_path: Path) -> tuple[str, Path]:
    mine = tmp_path / "mine.txt"
    mine.write_text("my notes\n")
    (run / "fit.lock").symlink_to(mine)
    return f"is a symbolic link (to {mine})", mine


def _dangling(run: Path, tmp_path: Path) -> tuple[str, Path]:
    (run / "fit.lock").symlink_to(tmp_path / "elsewhere.txt")
    return "is a symbolic link", tmp_path / "elsewhere.txt"


def _fifo(run: Path, tmp_path: Path) -> tuple[str, Path]:
    os.mkfifo(run / "fit.lock")
    return "is a named pipe (FIFO)", run / "fit.lock"


def _hard_link(run: Path, tmp_path: Path) -> tuple[str, Path]:
    mine = tmp_path / "mine.txt"
    mine.write_text("my notes\n")
    os.link(mine, run / "fit.lock")
    return "is a file with 2 names (a hard link)", mine


def _folder(run: Path, tmp_path: Path) -> tuple[str, Path]:
    (run / "fit.lock").mkdir()
    (run / "fit.lock" / "inside.txt").write_text("kept")
    return "is a folder", run / "fit.lock" / "inside.txt"


def _someone_elses_text(run: Path, tmp_path: Path) -> tuple[str, Path]:
    (run / "fit.lock").write_text("my notes, not a lock\n")
    return "holds something other than a fit's lock line", run / "fit.lock"


@pytest.mark.parametrize("plant", [_symlink_to_mine, _dangling, _fifo, _hard_link, _folder, _someone_elses_text])
def test_a_lock_file_that_is_not_a_plain_file_of_its_own_is_refused(run, tmp_path, capsys, plant):
    (run / "fit.lock").unlink()
    said, theirs = plant(run, tmp_path)
    before, kept = hashes(run), (theirs.read_bytes() if theirs.is_file() else None)
    outcome = resume(run, capsys)
    assert_refused(outcome, f"{run / 'fit.lock'} {said}", "move it out of the run directory")
    assert hashes(run) == before
    if kept is None:
        assert not theirs.is_file() or theirs.is_fifo()  # a dangling link's target was not created
    else:
        assert theirs.read_bytes() == kept


def test_a_lock_line_an_earlier_fit_left_is_taken_over(run, capsys):
    (run / "fit.lock").write_text("pid 1234 on otherhost since 2026-01-01 00:00:00\n")
    assert resume(run, capsys).rc == 0
    assert (run / "fit.lock").read_text().startswith(f"pid {os.getpid()} on ")


# --- resuming from an older step: metrics rows that cannot be placed are set aside as they are --------


def test_metrics_rows_that_cannot_be_read_go_aside_byte_for_byte(run, capsys):
    header = (run / "metrics.csv").read_bytes().split(b"\n")[0]
    odd = [
        b"39,0.1\n",
        b"3" + b",1" * (header.count(b",") + 3) + b"\n",
        b"5" + b",\xff\xfe" * header.count(b",") + b"\n",
        b"7," + b"x" * 200_000 + b"\n",  # past the csv module's field limit (128 KiB)
    ]
    with (run / "metrics.csv").open("ab") as f:
        f.write(b"".join(odd))
    lines_before = (run / "metrics.csv").read_bytes().splitlines(keepends=True)
    outcome = from_step_8(run, capsys)
    assert outcome.rc == 0, outcome.err
    assert "(4 unreadable, kept byte for byte)" in outcome.err and "Traceback" not in outcome.err
    aside = (run / "abandoned" / "from-step-8" / "metrics.csv").read_bytes()
    kept = (run / "metrics.csv").read_bytes()
    assert all(line in aside for line in odd)  # verbatim
    # Every line the file had is in one of the two files (the header in both).
    assert all(line in aside or line in kept for line in lines_before)


def test_an_ordinary_resume_sets_unreadable_rows_aside_and_nothing_else(run, capsys):
    with (run / "metrics.csv").open("ab") as f:
        f.write(b"39,0.1\n")
    outcome = resume(run, capsys)
    assert outcome.rc == 0, outcome.err
    aside = run / "abandoned" / "from-step-16"
    assert sorted(p.name for p in aside.iterdir()) == ["metrics.csv"]
    assert (aside / "metrics.csv").read_bytes().endswith(b"\n39,0.1\n")
    assert b"39,0.1" not in (run / "metrics.csv").read_bytes()


def test_a_metrics_header_that_cannot_be_read_is_refused_naming_the_file(run, capsys):
    (run / "metrics.csv").write_bytes(b"\xff\xfe,step\n1,2\n")
    before = hashes(run)
    assert_refused(from_step_8(run, capsys), f"{run / 'metrics.csv'}: line 1 is not the header")
    assert hashes(run) == before


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_metrics_file_that_is_not_a_plain_file_is_refused(run, tmp_path, capsys, kind):
    metrics = run / "metrics.csv"
    if kind == "symlink":
        mine = tmp_path / "mine.csv"
        metrics.rename(mine)
        metrics.symlink_to(mine)
    else:
        metrics.unlink()
        os.mkfifo(metrics)
    before = hashes(run)
    assert_refused(from_step_8(run, capsys), f"{metrics} is not a plain file")
    assert hashes(run) == before and (metrics.is_symlink() if kind == "symlink" else metrics.is_fifo())


def test_abandoned_being_a_file_is_refused_before_anything_moves(run, capsys):
    (run / "abandoned").write_text("mine")
    before = hashes(run)
    assert_refused(from_step_8(run, capsys), f"{run / 'abandoned'} is not a folder")
    assert hashes(run) == before


def test_every_abandoned_name_being_taken_is_refused_before_anything_moves(run, capsys, monkeypatch):
    monkeypatch.setattr(rewind, "MOST", 2)
    for name in ("from-step-8", "from-step-8-2"):
        (run / "abandoned" / name).mkdir(parents=True)
    before = hashes(run)
    assert_refused(from_step_8(run, capsys), f"{run / 'abandoned'} holds 2 folders named from-step-8")
    assert hashes(run) == before


# --- average --out: a symbolic link is neither written through nor replaced ----------------------------


@pytest.mark.parametrize("where", ["out", "default"])
def test_average_refuses_a_dangling_symbolic_link(run, tmp_path, capsys, where):
    link = tmp_path / "avg.ckpt" if where == "out" else run / "checkpoints" / "averaged.ckpt"
    link.symlink_to(tmp_path / "nowhere.ckpt")
    before = hashes(run)
    args = ["average", str(run), "--last", "2", *(["--out", str(link)] if where == "out" else [])]
    assert_refused(run_cli(args, capsys), f"{link} is a symbolic link (to {tmp_path / 'nowhere.ckpt'})")
    assert link.is_symlink() and not (tmp_path / "nowhere.ckpt").exists()
    assert hashes(run) == before


# --- one step numbering: a row of step n is numbered n; a run begun as n - 1 keeps it ------------------


def logged(run: Path) -> list[tuple[int, bool]]:
    with (run / "metrics.csv").open(newline="") as f:
        return [(int(r["step"]), bool(r["val_loss"])) for r in csv.DictReader(f)]


def test_metrics_rows_carry_the_step_the_console_and_checkpoints_name(run, capsys):
    rows = logged(run)
    assert [step for step, val in rows if val] == [4, 8, 12, 16]  # the validations (every 4 steps)
    assert [step for step, val in rows if not val] == list(range(1, 17))
    assert json.loads((run / "summary.json").read_text())["metrics_steps"] == "optimizer"
    assert [step for step, _ in read_run(run).val_curve] == [4, 8, 12, 16]
    assert resume(run, capsys).rc == 0
    assert [step for step, val in logged(run) if not val][-2:] == [17, 18]


def test_a_run_begun_with_the_older_numbering_keeps_it_when_resumed(run, capsys):
    # As an older version left it: rows numbered n - 1, checkpoints and summary silent on the numbering.
    for ckpt in (run / "checkpoints").glob("*.ckpt"):
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        del state["tfbuilder"]["metrics_steps"]
        torch.save(state, ckpt)
    lines = (run / "metrics.csv").read_text().splitlines()
    older = [lines[0]] + [str(int(line.split(",", 1)[0]) - 1) + "," + line.split(",", 1)[1] for line in lines[1:]]
    (run / "metrics.csv").write_text("\n".join(older) + "\n")
    summary = json.loads((run / "summary.json").read_text())
    del summary["metrics_steps"]
    (run / "summary.json").write_text(json.dumps(summary))
    assert [step for step, _ in read_run(run).val_curve] == [4, 8, 12, 16]

    outcome = from_step_8(run, capsys)  # rows of steps 9..16 (logged 8..15) go aside; 7 (step 8) stays
    assert outcome.rc == 0, outcome.err
    aside = logged(run / "abandoned" / "from-step-8")
    assert min(step for step, _ in aside) == 8 and (7, True) not in aside
    rows = logged(run)
    assert [step for step, val in rows if val] == [3, 7, 9]  # steps 4, 8 and 10, numbered as the run began
    assert [step for step, val in rows if not val] == list(range(0, 10))
    assert json.loads((run / "summary.json").read_text())["metrics_steps"] == "lightning"


# --- --run-dir: the same command starts the run, then continues it -----------------------------------


def test_the_same_command_starts_a_run_then_continues_it(run, tmp_path, capsys):
    here = tmp_path / "job"
    command = ["fit", str(QUICKSTART), "--run-dir", str(here), *test_faults.tiny(tmp_path, "trainer.max_steps=8")]
    assert run_cli(command, capsys).rc == 0
    assert read_run(here).steps == 8
    outcome = run_cli([*command, "--set", "trainer.max_steps=12"], capsys)  # requeued, with more steps
    assert outcome.rc == 0, outcome.err
    history = json.loads((here / "summary.json").read_text())["history"]
    assert [(h["kind"], h["from_step"], h["to_step"]) for h in history] == [("new", 0, 8), ("resume", 8, 12)]
    # Started from weights: run again, it continues (the run began from them); other weights are refused.
    tuned = tmp_path / "tuned"
    from_weights = ["fit", str(QUICKSTART), "--run-dir", str(tuned), "--init-from", str(run), *test_faults.tiny(tmp_path, "trainer.max_steps=2")]
    assert run_cli(from_weights, capsys).rc == 0
    assert run_cli([*from_weights, "--set", "trainer.max_steps=4"], capsys).rc == 0
    assert read_run(tuned).steps == 4
    before = hashes(tuned)
    other = [*from_weights[:4], "--init-from", str(here), *from_weights[6:]]
    assert_refused(run_cli(other, capsys), f"holds a run that did not start from --init-from {here}", "it started from")
    assert hashes(tuned) == before
    assert_refused(run_cli(["fit", "--resume", str(here), "--run-dir", str(here)], capsys), "--run-dir starts or continues")


def test_the_same_command_starts_over_a_run_stopped_before_its_first_checkpoint(run, tmp_path, capsys):
    here = tmp_path / "job"
    (here / "checkpoints").mkdir(parents=True)  # as an attempt killed before its first checkpoint leaves it
    for name in ("recipe.yaml", "metrics.csv"):
        shutil.copy(run / name, here / name)
    attempt = (here / "metrics.csv").read_bytes()
    command = ["fit", str(QUICKSTART), "--run-dir", str(here), *test_faults.tiny(tmp_path, "trainer.max_steps=4")]
    outcome = run_cli(command, capsys)
    assert outcome.rc == 0, outcome.err
    assert "stopped before its first checkpoint: starting over" in outcome.err
    assert (here / "metrics.interrupted-1.csv").read_bytes() == attempt and read_run(here).steps == 4


# --- the world size: a resume runs with as many processes as the run had -------------------------------


def test_a_resume_on_another_number_of_processes_is_refused_naming_both(run, capsys):
    last = read_checkpoint(run / "checkpoints" / "last.ckpt")
    assert last["tfbuilder"]["world_size"] == 1
    last["tfbuilder"]["world_size"] = 2  # as two processes of an older tfbuilder would have written it:
    del last["tfbuilder"]["data_position"]  # each rank's own count of batches, no global position
    torch.save(last, run / "checkpoints" / "moved.ckpt")
    (run / "checkpoints" / "last.ckpt").unlink()
    (run / "checkpoints" / "moved.ckpt").rename(run / "checkpoints" / "last.ckpt")
    before = hashes(run)
    assert_refused(resume(run, capsys), "the run was trained by 2 processes (world size 2); this resume would run 1",
                   "continues exactly only with 2")  # fmt: skip
    assert hashes(run) == before
