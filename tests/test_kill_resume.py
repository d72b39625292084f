"""A fit killed at random moments (kill -9, also halfway through a checkpoint write), interrupted by
Ctrl-C and SIGTERM (Ctrl-C twice during a checkpoint write), and resumed each time ends bit-equal to an
uninterrupted run, with no corrupt file; while it trains, a second fit into its directory is refused.
(Signals at the other moments, start-up included, are sent in-process by test_faults.py.)"""

from __future__ import annotations

import csv
import random
import signal
import subprocess
import sys

import pytest
import torch

import tfbuilder
from conftest import ROOT
from tfbuilder.atomic import TEMP_MARK
from tfbuilder.cli.commands import main
from tfbuilder.runs.checkpoints import read_checkpoint, step_checkpoints

QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
OVERRIDES = [
    "trainer.progress=false",
    "data.train_size=600",
    "data.val_size=40",
    "data.lengths=[1, 6]",
    "model.dropout=0.1",  # random draws too must resume where they were
    "trainer.deterministic=true",
    "trainer.threads=1",  # every process alike, whatever the machine's load: bit-equal needs the same sums
    "trainer.val_every=4",
    "trainer.log_every=2",
    "trainer.keep_last=2",
    "trainer.max_steps=20",
]

# Runs `tfbuilder fit` announcing each step ("STEP n") and each checkpoint write ("WRITING", after
# half of the bytes are on disk), and waiting after each announcement until the test answers, so
# the test strikes exactly there: the run cannot move on before the signal lands. "SIGNALLED" says
# that the training loop's signal handler has run.
DRIVER = r"""
import io, sys
from tfbuilder import atomic
from tfbuilder.train import callbacks
from tfbuilder.train.task import Task
from tfbuilder.cli.commands import main

def wait_for_the_test(announcement):
    print(announcement, flush=True)
    sys.stdin.readline()  # a line, or the end of the input once the test has struck

step_end = Task.on_train_batch_end
def announce(self, *args):
    step_end(self, *args)
    wait_for_the_test(f"STEP {self.global_step}")
Task.on_train_batch_end = announce

serialize = atomic._serialize
def slow_write(obj, f):
    buffer = io.BytesIO()
    serialize(obj, buffer)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    wait_for_the_test("WRITING")
    f.write(data[len(data) // 2:])
atomic._serialize = slow_write

on_signal = callbacks.RunGuard._on_signal
def announce_signal(self, *args):  # the training loop's handler has run: the test may signal again
    try:
        on_signal(self, *args)
    finally:
        print("SIGNALLED", flush=True)
callbacks.RunGuard._on_signal = announce_signal
sys.exit(main(sys.argv[1:]))
"""


def strike(args: list[str], tmp_path, *, at: str, sig: int, again: int | None = None, while_paused=None) -> tuple[int, str]:
    """Run the driver until it announces ``at`` and waits, call ``while_paused(pid)``, send ``sig``
    (and ``again`` once the run's handler has taken it), then let it go on; returns (exit status, stderr)."""
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=tmp_path,
        )  # fmt: skip
        try:
            for line in proc.stdout:
                if line.strip() == at:
                    try:
                        if while_paused is not None:
                            while_paused(proc.pid)
                    finally:
                        proc.send_signal(sig)
                    if again is not None:
                        for announced in proc.stdout:
                            if announced.strip() == "SIGNALLED":
                                proc.send_signal(again)
                                break
                    break
                if line.startswith(("STEP ", "WRITING")):
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
        finally:
            try:
                proc.stdin.close()  # from now on the run goes on by itself
            except BrokenPipeError:  # killed
                pass
        proc.stdout.read()
        status = proc.wait(timeout=300)
    return status, (tmp_path / "stderr.txt").read_text()


def assert_nothing_corrupt(run) -> None:
    ckpts = run / "checkpoints"
    for path in ckpts.glob("*.ckpt"):
        read_checkpoint(path)  # every checkpoint file loads
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert len({len(r) for r in rows}) == 1, "a torn metrics row"


@pytest.mark.slow  # six processes start torch and Lightning: about a minute of CPU (it runs by default)
def test_killed_and_interrupted_runs_resume_bit_equal(tmp_path, capsys):
    """Over 30 s on 2 cores: real processes killed with SIGKILL and interrupted with SIGINT/SIGTERM at
    random steps, mid-checkpoint-write included, each resumed, and the end compared bit for bit with
    an uninterrupted run. What it proves (a resume after a real kill loses no step and draws the same
    random numbers) needs whole training processes; the in-process resume test cannot kill one."""
    rng = random.Random(11)
    sets = sum((["--set", o] for o in [f"trainer.output={tmp_path / 'runs'}", *OVERRIDES]), [])
    run = tmp_path / "runs" / "quickstart" / "version_0"
    resume = ["fit", "--resume", str(run)]

    # 1. kill -9 at a random step after the first checkpoint.
    status, _ = strike(["fit", str(QUICKSTART), *sets], tmp_path, at=f"STEP {rng.randint(5, 7)}", sig=signal.SIGKILL)
    assert status == -signal.SIGKILL
    assert_nothing_corrupt(run)

    # 2. kill -9 halfway through a checkpoint write; while it is paused there, a second fit into the
    #    same directory is refused (exit 2) and changes nothing.
    def second_fit(pid: int) -> None:
        before = sorted(p.name for p in (run / "checkpoints").iterdir())
        assert main(resume) == 2
        assert f"{run} is in use: a fit is training there (pid {pid} on " in capsys.readouterr().err
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before

    status, _ = strike(resume, tmp_path, at="WRITING", sig=signal.SIGKILL, while_paused=second_fit)
    assert status == -signal.SIGKILL
    assert [p for p in (run / "checkpoints").iterdir() if TEMP_MARK in p.name], "the kill did not land in a write"
    assert_nothing_corrupt(run)

    # 3. Ctrl-C: the current step is validated and checkpointed, exit 130, and we are told how to go on;
    #    until then a second fit is refused, naming the first.
    k = rng.randint(9, 12)
    status, err = strike(resume, tmp_path, at=f"STEP {k}", sig=signal.SIGINT, while_paused=second_fit)
    assert status == 130, err[-2000:]
    kept = int(read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"])
    assert kept >= k and f"last.ckpt holds step {kept}" in err and f"fit --resume {run}" in err
    assert "Traceback" not in err

    # 4. SIGTERM (a scheduler's notice): the same, exit 143.
    status, err = strike(resume, tmp_path, at=f"STEP {rng.randint(kept + 2, 16)}", sig=signal.SIGTERM)
    assert status == 143, err[-2000:]
    assert_nothing_corrupt(run)
    kept = int(read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"])

    # 5. Ctrl-C halfway through a checkpoint write, and Ctrl-C again: the run stops at once, exit 130;
    #    the checkpoint being written is absent (no temporary), the earlier ones whole, and the message
    #    names the step last.ckpt truly holds.
    status, err = strike(resume, tmp_path, at="WRITING", sig=signal.SIGINT, again=signal.SIGINT)
    assert status == 130 and "Traceback" not in err, err[-2000:]
    assert f"last.ckpt holds step {kept}, the last validated state. Continue with: tfbuilder fit --resume {run}" in err
    assert int(read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"]) == kept
    assert not [p for p in (run / "checkpoints").iterdir() if TEMP_MARK in p.name]
    assert [n for n, _ in step_checkpoints(run / "checkpoints")][-1] == kept
    assert_nothing_corrupt(run)
    assert main(resume) == 0
    assert_nothing_corrupt(run)
    assert not [p for p in (run / "checkpoints").iterdir() if TEMP_MARK in p.name]

    reference = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, [f"trainer.output={tmp_path / 'reference'}", *OVERRIDES]))
    a = read_checkpoint(reference.last_checkpoint)["state_dict"]
    b = read_checkpoint(run / "checkpoints" / "last.ckpt")["state_dict"]
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 20
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
