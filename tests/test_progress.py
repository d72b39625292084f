"""The progress display: fields and totals in a pseudo-terminal and through a pipe, after a resume,
and with a time limit that stops the run before max_steps."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time

import pytest

import tfbuilder
from conftest import ONE_LAYER
from test_training import QUICKSTART, small
from tfbuilder.runs.checkpoints import display_path
from tfbuilder.train.progress import clock, forecast, scientific
from tfbuilder.train.fit import fit

STEP_LINE = re.compile(r"^step (?P<step>[\d,]+)/(?P<total>[\d,]+)  loss \d+\.\d{3}  \S+ tok/s  lr \d\.\de[-+]\d\d( .*)?  eta \d+:\d\d:\d\d$")


def test_scientific_learning_rates_stay_readable_at_every_scale():
    assert scientific(0.0004) == "4.0e-04"
    assert scientific(3.2e-9) == "3.2e-09"  # the end of a cosine schedule is not "0.000"
    assert scientific(0.0) == "0.0e+00"


def test_clock():
    assert clock(3725) == "1:02:05"
    assert clock(-3) == "0:00:00"


def test_forecast_chooses_the_limit_that_comes_first():
    # 1 s a step, 900 steps left, 60 s left: the time limit stops the run at about step 160.
    assert forecast(100, 1000, 1.0, 60.0) == ("~160 (time limit)", 60.0)
    # The same pace with an hour left: max_steps comes first.
    assert forecast(100, 1000, 1.0, 3600.0) == ("1,000", 900.0)
    assert forecast(100, 1000, 1.0, None) == ("1,000", 900.0)
    # No pace yet: the step total, and the time limit as the most it can take.
    assert forecast(0, 1000, None, None) == ("1,000", None)
    assert forecast(0, 1000, None, 30.0) == ("1,000", 30.0)


def test_piped_output_is_plain_lines_that_count_on_after_a_resume(tmp_path, capsys):
    common = small(tmp_path, "trainer.progress=true", "trainer.log_every=5", "trainer.val_every=10")
    first = fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=20"]))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == f"run directory: {display_path(first.run_dir)}"
    assert lines[1].startswith("training from step 0 to at most 20 steps;")
    steps = [STEP_LINE.match(line) for line in lines if line.startswith("step ")]
    assert all(steps), [line for line in lines if line.startswith("step ")]
    assert [(int(m["step"]), m["total"]) for m in steps] == [(5, "20"), (10, "20"), (15, "20"), (20, "20")]
    assert [line.split(":")[0] for line in lines if line.startswith("validation")] == ["validation at step 10", "validation at step 20"]
    assert "\r" not in err and "Epoch" not in err and "it/s" not in err  # no terminal bar through a pipe
    assert "GPU available" not in err and "💡" not in err  # Lightning's start-up chatter stays off

    resumed = recipe_for_resume(first.run_dir, "trainer.max_steps=30")
    fit(resumed, resume=first.run_dir)
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith("training from step 20 to at most 30 steps;")
    assert [int(STEP_LINE.match(line)["step"]) for line in lines if line.startswith("step ")] == [25, 30]
    assert all(STEP_LINE.match(line)["total"] == "30" for line in lines if line.startswith("step "))


def recipe_for_resume(run_dir, *overrides: str) -> tfbuilder.Recipe:
    from tfbuilder.spec.recipe import recipe_from_dict
    from tfbuilder.runs.checkpoints import read_checkpoint

    return recipe_from_dict(read_checkpoint(run_dir)["tfbuilder"]["recipe"], list(overrides))


def test_progress_false_keeps_the_start_and_the_validations(tmp_path, capsys):
    fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.max_steps=6", "trainer.val_every=3", "trainer.log_every=1")))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("run directory: ")
    assert not [line for line in lines if line.startswith("step ")]
    assert len([line for line in lines if line.startswith("validation at step")]) == 2


def test_a_time_limit_is_the_total_when_it_comes_first(capsys, monkeypatch):
    """10 s a step by the display's clock, a minute's limit, 1,000 steps asked for."""
    import tfbuilder.train.progress as progress

    ticks = iter(range(0, 100_000, 10))
    monkeypatch.setattr(progress.time, "monotonic", lambda: float(next(ticks)))
    monkeypatch.setattr(progress, "_time_left", lambda trainer: 60.0 - 10.0 * trainer.global_step)

    class Trainer:  # what the display reads of Lightning's trainer
        is_global_zero = True
        max_steps = 1000
        callback_metrics = {"train_loss": 2.0, "tokens_per_s": 1000.0, "lr": 1e-3}
        global_step = 0

    shown, trainer = progress.Progress(run_dir="r", every=1, live=False), Trainer()
    for step in (1, 2, 3):
        trainer.global_step = step
        shown.on_train_batch_end(trainer, None, None, None, step)
    lines = capsys.readouterr().err.splitlines()
    # At step 3 with 30 s left: the run ends near step 6, in 30 s (not at 1,000 steps, hours away).
    assert lines[-1].startswith("step 3/~6 (time limit)  loss 2.000  1.0e+03 tok/s  lr 1.0e-03"), lines
    assert lines[-1].endswith("eta 0:00:30"), lines


def test_in_a_terminal_one_line_is_redrawn(tmp_path):
    """A real pseudo-terminal: the line is redrawn in place with carriage returns, then the summary.
    (The smallest model and two validations: what is drawn does not depend on the model's size.)"""
    primary, secondary = os.openpty()
    sets = small(tmp_path, *ONE_LAYER, "data.train_size=200", "data.val_size=20", "trainer.progress=true", "trainer.max_steps=6", "trainer.val_every=3")
    args = ["fit", str(QUICKSTART), *sum((["--set", o] for o in sets), [])]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "tfbuilder", *args], stdout=secondary, stderr=secondary, cwd=tmp_path, env=env)
    os.close(secondary)
    output = read_all(primary, proc)
    assert proc.returncode == 0, output
    text = output.decode()
    assert text.startswith("run directory: ")
    redraws = [part for part in text.split("\r") if part.startswith("step ")]
    assert len(redraws) >= 2, text
    last = redraws[-1].split("\n")[0].rstrip()
    assert last.startswith("step 6/6  loss "), text
    assert "validation at step 3: val_loss" in text and "validation at step 6: val_loss" in text
    assert "best validation loss" in text
    assert "Epoch" not in text and "it/s" not in text


def read_all(fd: int, proc: subprocess.Popen, timeout: float = 240.0) -> bytes:
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the terminal closed: the child exited
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=max(deadline - time.monotonic(), 1))
    os.close(fd)
    return b"".join(chunks)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_every_place_shows_a_metric_the_same_way():
    from tfbuilder.train.shown import show

    assert show("val_acc", 0.97776) == "97.78%"
    assert show("val_f1", 0.97776) == "0.9778" and show("val_loss", 1.234567) == "1.2346"
