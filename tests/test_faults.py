"""Run directories under faults: resuming from the past, concurrent fits, interrupted sweeps, full
disks. Each case drives the CLI as a user would and checks the exit status, the message, and that
every file the user had is still there with the same bytes (hashed before and after)."""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import os
import shutil
import shlex
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import tfbuilder
from conftest import ROOT
from hostile import assert_refused, run_cli
from tfbuilder import atomic
from tfbuilder.train import diskspace, lifecycle, metrics_log
from tfbuilder.train import fit as fitting
from tfbuilder.train.task import Task
from tfbuilder.atomic import TEMP_MARK
from tfbuilder.cli.commands import main
from tfbuilder.runs.checkpoints import RunDirError, read_checkpoint

QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
# The quick-start task at its smallest: a fit of 16 steps takes well under a second.
TINY = [
    "trainer.progress=false", "data.train_size=300", "data.val_size=20", "data.lengths=[1, 6]",
    "trainer.val_every=4", "trainer.log_every=2", "trainer.keep_last=3", "trainer.max_steps=16", "trainer.threads=1",
    "model.d_model=16", "model.attention.heads=2", "model.attention.key_dim=8", "model.attention.value_dim=8",
    "model.ffn.hidden=16", "model.encoder.layers=1", "model.decoder.layers=1",
]  # fmt: skip


def tiny(tmp_path: Path, *more: str) -> list[str]:
    """``--set`` arguments of the tiny run, writing under ``tmp_path/runs``."""
    return sum((["--set", o] for o in [f"trainer.output={tmp_path / 'runs'}", *TINY, *more]), [])


def hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file below ``folder`` by relative path (fit.lock, which names its holder, and
    temporary files of writes under way aside)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "fit.lock" and TEMP_MARK not in p.name
    }


def metrics_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def weights(path: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(path)["state_dict"]


# --- resuming from an older checkpoint moves the later history aside ----------------------------------


def test_resuming_from_the_past_moves_the_future_aside_whole(tmp_path, capsys):
    # A row at every step: the rows of step 8 stay, those of step 9 on go.
    assert run_cli(["fit", str(QUICKSTART), *tiny(tmp_path, "trainer.log_every=1")], capsys).rc == 0
    run = tmp_path / "runs" / "quickstart" / "version_0"
    ckpts = run / "checkpoints"
    before = hashes(run)
    rows_before = metrics_rows(run / "metrics.csv")
    assert {"checkpoints/step-00000012.ckpt", "checkpoints/step-00000016.ckpt", "checkpoints/best.ckpt", "summary.json"} <= before.keys()
    assert read_checkpoint(ckpts / "best.ckpt")["global_step"] == 16  # the best is in the future of step 8

    # Resume from step 8, stopping at step 10: its best (step 10) is worse than the abandoned one (step 16).
    outcome = run_cli(["fit", "--resume", str(ckpts / "step-00000008.ckpt"), "--set", "trainer.max_steps=10"], capsys)
    assert outcome.rc == 0, outcome.err
    aside = run / "abandoned" / "from-step-8"
    assert "resuming from step 8: what the run did after it" in outcome.err
    assert "was moved to" in outcome.err and "abandoned/from-step-8/" in outcome.err
    assert "Traceback" not in outcome.err

    # Every file the run had is still there, byte for byte: in place, or at the same path in the folder aside.
    after = hashes(run)
    for name, digest in before.items():
        if name == "metrics.csv":
            continue
        assert digest in (after.get(name), after.get(f"abandoned/from-step-8/{name}")), name
    for name in ("checkpoints/step-00000012.ckpt", "checkpoints/step-00000016.ckpt", "checkpoints/best.ckpt",
                 "checkpoints/last.ckpt", "summary.json"):  # fmt: skip
        assert after[f"abandoned/from-step-8/{name}"] == before[name], name
    # The better, later best.ckpt was not replaced: it lies aside whole; the run's best is its own history's.
    assert read_checkpoint(aside / "checkpoints" / "best.ckpt")["global_step"] == 16
    assert read_checkpoint(ckpts / "best.ckpt")["global_step"] <= 10
    assert read_checkpoint(ckpts / "last.ckpt")["global_step"] == 10

    # metrics.csv is cut at the resumed step: every row of the first run is kept once (here or aside),
    # and no step appears twice in the run's metrics.
    kept, moved = metrics_rows(run / "metrics.csv"), metrics_rows(aside / "metrics.csv")
    old = [r for r in kept if int(r["step"]) <= 8]
    assert old + moved == rows_before
    assert all(int(r["step"]) > 8 for r in moved)
    seen = [(r["step"], bool(r["val_loss"])) for r in kept]
    assert len(seen) == len(set(seen)), "a step logged twice"

    # Resuming from step 8 again: a second folder, the first untouched; the run continued to 16 ends
    # bit-equal to the first run's abandoned step 16.
    first_aside = hashes(aside)
    outcome = run_cli(["fit", "--resume", str(ckpts / "step-00000008.ckpt")], capsys)
    assert outcome.rc == 0, outcome.err
    assert "abandoned/from-step-8-2/" in outcome.err
    assert hashes(aside) == first_aside
    assert read_checkpoint(run / "abandoned" / "from-step-8-2" / "checkpoints" / "last.ckpt")["global_step"] == 10
    a, b = weights(ckpts / "last.ckpt"), weights(aside / "checkpoints" / "step-00000016.ckpt")
    assert all(torch.equal(a[k], b[k]) for k in a)

    # A checkpoint set aside is not resumed where it lies unless asked (it would make that folder a run).
    before = hashes(run)
    outcome = run_cli(["fit", "--resume", str(aside / "checkpoints" / "best.ckpt")], capsys)
    assert_refused(outcome, "belongs to the history that a resume from an earlier step set aside", "give --force", "--init-from")
    assert hashes(run) == before

    # An ordinary resume of a finished run moves nothing.
    outcome = run_cli(["fit", "--resume", str(run), "--set", "trainer.max_steps=20"], capsys)
    assert outcome.rc == 0 and "moved to" not in outcome.err
    assert sorted(p.name for p in (run / "abandoned").iterdir()) == ["from-step-8", "from-step-8-2"]


# --- fit.lock: every way into a run directory --------------------------------------------------------

HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, f"pid {os.getpid()} on testhost since now\n".encode())
print("held", flush=True)
sys.stdin.read()
"""


@contextmanager
def held(lock: Path):
    """Another process holds ``lock`` (as a fit training there does) until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_run_directory_in_use_is_refused_by_every_way_in(tmp_path, capsys, monkeypatch):
    assert run_cli(["fit", str(QUICKSTART), *tiny(tmp_path)], capsys).rc == 0
    run = tmp_path / "runs" / "quickstart" / "version_0"
    before = hashes(run)
    recipe = tfbuilder.load_recipe(QUICKSTART, [f"trainer.output={tmp_path / 'runs'}", *TINY])
    empty = tmp_path / "empty"
    empty.mkdir()
    with held(run / "fit.lock") as pid, held(empty / "fit.lock") as other:
        with monkeypatch.context() as patch:
            patch.setattr(fitting, "prepare", lambda *a, **k: pytest.fail("data prepared for a run in use"))
            for args in (["fit", "--resume", str(run)], ["fit", "--resume", str(run / "checkpoints" / "step-00000008.ckpt")]):
                outcome = run_cli(args, capsys)  # refused before preparing anything
                assert_refused(outcome, f"{run} is in use: a fit is training there (pid {pid} on testhost")
        # A new run into a directory in use, from scratch or from trained weights (the Python API's run_dir).
        for init_from in (None, run / "checkpoints" / "best.ckpt"):
            with pytest.raises(RunDirError, match=f"is in use: a fit is training there \\(pid {other} "):
                tfbuilder.fit(recipe, run_dir=empty, init_from=init_from)
        # A sweep's run being trained by another sweep.
        sweep = tmp_path / "sweep"
        seed = sweep / "runs" / "quickstart" / "seed-0"
        seed.mkdir(parents=True)
        plan = {"command": "", "recipes": ["quickstart"], "seeds": [0], "bleu_beam": None, "runs": []}
        (sweep / "sweep.json").write_text(json.dumps(plan))  # an earlier invocation's plan (rewritten by this one)
        with held(seed / "fit.lock"):  # another worker of the sweep: this one leaves the run to it
            outcome = run_cli(["sweep", str(QUICKSTART), "--no-bleu", "--out", str(sweep), *tiny(tmp_path)], capsys)
            assert outcome.rc == 0 and "quickstart seed 0: another worker is training it" in outcome.err
            assert sorted(p.name for p in seed.iterdir()) == ["fit.lock"]
    assert hashes(run) == before
    assert sorted(p.name for p in empty.iterdir()) == ["fit.lock"]
    # --init-from into a directory that holds a run not started from those weights is refused.
    with pytest.raises(RunDirError, match="holds a run that did not start from --init-from .*it started from scratch"):
        tfbuilder.fit(recipe, run_dir=run, init_from=run / "checkpoints" / "best.ckpt")
    assert hashes(run) == before


# --- a sweep run interrupted before its first checkpoint keeps every attempt's metrics -----------------


class Killed(BaseException):
    """What a kill does to the fit, as far as the files are concerned."""


def test_every_interrupted_attempt_of_a_sweep_run_keeps_its_metrics(tmp_path, capsys, monkeypatch):
    sweep = tmp_path / "sweep"
    args = ["sweep", str(QUICKSTART), "--no-bleu", "--out", str(sweep), *tiny(tmp_path, "trainer.log_every=1")]
    seed = sweep / "runs" / "quickstart" / "seed-0"
    step_end = Task.on_train_batch_end
    for attempt in (1, 2):  # killed at steps 2 and 3, having logged 1 and 2 rows: before the first checkpoint (step 4)

        def die(self, *a, attempt=attempt):
            step_end(self, *a)
            if self.global_step == attempt + 1:
                raise Killed

        monkeypatch.setattr(Task, "on_train_batch_end", die)
        with pytest.raises(Killed):
            main(args)
        assert not list((seed / "checkpoints").glob("*.ckpt"))
    # The last attempt was killed halfway through its first checkpoint write: its temporary remains.
    (seed / "checkpoints").mkdir(exist_ok=True)
    (seed / "checkpoints" / f".step-00000004.ckpt{TEMP_MARK}99999").write_bytes(b"half a checkpoint")
    monkeypatch.setattr(Task, "on_train_batch_end", step_end)
    before = hashes(seed)
    assert main(args) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "starting over; its metrics were kept as metrics.interrupted-2.csv" in err, err
    after = hashes(seed)
    for n in (1, 2):  # attempt n, its rows each step it made
        name = f"metrics.interrupted-{n}.csv" if n < 2 else "metrics.csv"
        kept = f"metrics.interrupted-{n}.csv"
        assert kept in after and (after[kept] == before[name])
        assert [r["step"] for r in metrics_rows(seed / kept)] == [str(s) for s in range(1, n + 1)]
    assert all(before[k] == after[k] for k in before if k.startswith("metrics.interrupted"))
    assert int(metrics_rows(seed / "metrics.csv")[-1]["step"]) == 16


# --- a full disk ---------------------------------------------------------------------------------------


def test_a_full_disk_is_refused_before_training_with_the_space_needed(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(diskspace, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    outcome = run_cli(["fit", str(QUICKSTART), *tiny(tmp_path)], capsys)
    need = 5 * diskspace.checkpoint_bytes(tfbuilder.load_recipe(QUICKSTART, TINY))  # keep_last 3, best, one being written
    assert_refused(outcome, f"not enough free space for the checkpoints in {tmp_path / 'runs' / 'quickstart'}",
                   f"{diskspace.size(need)} needed", "1.0 kB free")  # fmt: skip
    assert not (tmp_path / "runs").exists()  # nothing made


def test_the_checkpoint_size_is_estimated_from_the_parameter_count(tmp_path, capsys):
    assert run_cli(["fit", str(QUICKSTART), *tiny(tmp_path, "trainer.max_steps=4")], capsys).rc == 0
    actual = (tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints" / "last.ckpt").stat().st_size
    estimate = diskspace.checkpoint_bytes(tfbuilder.load_recipe(QUICKSTART, TINY))
    assert actual <= estimate <= 1.5 * actual


def test_a_disk_filling_during_a_checkpoint_write_keeps_every_earlier_file(tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "quickstart" / "version_0"
    serialize, seen = atomic._serialize, {}

    def full_at_step_8(obj, f):
        if obj.get("global_step") == 8:
            seen["before"] = hashes(run)
            f.write(b"x" * 1000)  # some bytes made it to the disk, then none more
            raise OSError(errno.ENOSPC, "No space left on device")
        serialize(obj, f)

    monkeypatch.setattr(atomic, "_serialize", full_at_step_8)
    outcome = run_cli(["fit", str(QUICKSTART), *tiny(tmp_path)], capsys)
    assert_refused(outcome, f"the disk holding {run / 'checkpoints'} is full (No space left on device): writing checkpoints/step-00000008.ckpt failed",
                   "checkpoints/last.ckpt holds step 4", f"then continue with: tfbuilder fit --resume {run}")  # fmt: skip
    after = hashes(run)
    assert {k: after.get(k) for k in seen["before"] if k != "metrics.csv"} == {k: v for k, v in seen["before"].items() if k != "metrics.csv"}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt", "step-00000004.ckpt"]
    monkeypatch.setattr(atomic, "_serialize", serialize)  # space freed
    assert run_cli(["fit", "--resume", str(run)], capsys).rc == 0
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 16


# --- signals at every moment ------------------------------------------------------------------------------

# Dropout draws too must resume where they were; one thread: bit-equal needs the same sums.
EXACT = ["model.dropout=0.1", "trainer.deterministic=true"]


class Escaped(BaseException):
    """A signal that reached the test's own handler: tfbuilder did not handle it."""


@pytest.fixture
def safety_net():
    """Signals this process sends itself land in tfbuilder's handlers, or fail the test here (never
    stop the test run)."""

    def escaped(signum, frame):
        raise Escaped(signal.Signals(signum).name)

    previous = {s: signal.signal(s, escaped) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in previous.items():
        signal.signal(s, h)


def signal_at(monkeypatch, owner, name: str, sig: int, *, step: int | None = None) -> None:
    """Send ``sig`` to this process once, right after ``owner.name`` runs (at ``step`` for a Task hook)."""
    original, sent = getattr(owner, name), []

    def then_signal(*args, **kwargs):
        result = original(*args, **kwargs)
        if not sent and (step is None or args[0].global_step == step):
            sent.append(sig)
            os.kill(os.getpid(), sig)  # delivered before kill returns; handled at the next bytecode
        return result

    monkeypatch.setattr(owner, name, then_signal)


def test_a_signal_at_every_moment_keeps_what_was_done_and_says_how_to_go_on(tmp_path, capsys, monkeypatch, safety_net):
    args = ["fit", str(QUICKSTART), *tiny(tmp_path, *EXACT)]
    run = tmp_path / "runs" / "quickstart" / "version_0"
    resume = ["fit", "--resume", str(run)]

    def strike(cli_args, owner, hook, sig, *, step=None):
        with monkeypatch.context() as patch:
            signal_at(patch, owner, hook, sig, step=step)
            outcome = run_cli(cli_args, capsys)
        assert outcome.rc == 128 + sig, outcome.err
        assert "Traceback" not in outcome.err
        return outcome.err

    def kept() -> int:
        return read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"]

    # Start-up of a new run (its directory made, nothing trained): SIGTERM; the empty run directory goes.
    err = strike(args, lifecycle, "_set_up_run_dir", signal.SIGTERM)
    assert f"SIGTERM: stopped before the first step; nothing was trained or kept. Start again with: tfbuilder {shlex.join(args)}" in err
    assert not run.exists()
    # Mid-step, before the first checkpoint: the current step is validated and checkpointed.
    err = strike(args, Task, "on_train_batch_end", signal.SIGINT, step=2)
    assert f"Ctrl-C: training stopped at step {kept()}; checkpoints/last.ckpt holds step {kept()}" in err
    assert f"Continue with: tfbuilder fit --resume {run}" in err
    # Start-up of a resume: nothing changes.
    before = hashes(run)
    err = strike(resume, lifecycle, "_set_up_run_dir", signal.SIGINT)
    assert f"Ctrl-C: stopped before training went on; checkpoints/last.ckpt holds step {kept()}. Continue with: tfbuilder fit --resume {run}" in err
    assert hashes(run) == before
    # Right after a resume: SIGTERM.
    first = kept()
    err = strike(resume, Task, "on_train_batch_end", signal.SIGTERM, step=first + 1)
    assert kept() == first + 1 and f"SIGTERM: training stopped at step {first + 1}; checkpoints/last.ckpt holds step {first + 1}" in err
    # During a validation (of step 8): that validation completes and is the checkpoint.
    strike(resume, Task, "on_validation_epoch_start", signal.SIGINT, step=8)
    assert kept() == 8
    # During a checkpoint write (of step 12): the write completes; the next step is validated and kept.
    err = strike(resume, atomic, "_serialize", signal.SIGTERM)
    assert kept() == 13 and (run / "checkpoints" / "step-00000012.ckpt").is_file() and "holds step 13" in err
    assert run_cli(resume, capsys).rc == 0

    reference = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, [f"trainer.output={tmp_path / 'reference'}", *TINY, *EXACT]))
    a, b = weights(Path(reference.last_checkpoint)), weights(run / "checkpoints" / "last.ckpt")
    assert kept() == 16 and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    seen = [(r["step"], bool(r["val_loss"])) for r in metrics_rows(run / "metrics.csv")]
    assert len(seen) == len(set(seen)), (run / "metrics.csv").read_text()



def test_a_disk_filling_during_a_metrics_write_says_so_and_keeps_the_checkpoints(tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "quickstart" / "version_0"
    written, seen = metrics_log.write_text, {}

    def full_after_the_first_checkpoint(path, text, *, what):
        if not (run / "checkpoints" / "last.ckpt").exists():
            return written(path, text, what=what)
        seen["before"] = hashes(run)

        def write(f):
            raise OSError(errno.ENOSPC, "No space left on device")

        return atomic.write_atomic(path, write, what=what)

    monkeypatch.setattr(metrics_log, "write_text", full_after_the_first_checkpoint)
    outcome = run_cli(["fit", str(QUICKSTART), *tiny(tmp_path)], capsys)
    kept = read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"]
    assert_refused(outcome, f"the disk holding {run} is full (No space left on device): writing metrics.csv failed (",
                   "no part of it was written (an earlier version stays whole)", f"checkpoints/last.ckpt holds step {kept}",
                   f"Free some space there, then continue with: tfbuilder fit --resume {run}")  # fmt: skip
    assert hashes(run) == seen["before"]
