"""SLURM's warning before a time limit (``--signal=USR1@90``): SIGUSR1 stops a run as SIGTERM does (the
current step validated and checkpointed), then tfbuilder asks SLURM to requeue the job; the requeued job
runs the same command (``fit --run-dir``), which continues the run to the end an uninterrupted run reaches.
SLURM is simulated: its job variables, and a stand-in ``scontrol`` on PATH that records its arguments."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from hostile import run_cli
from test_faults import EXACT, QUICKSTART, TINY, Escaped, signal_at, tiny, weights

import tfbuilder
from tfbuilder.runs.checkpoints import read_checkpoint
from tfbuilder.train import stopping
from tfbuilder.train.task import Task


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """A SLURM job's environment and a stand-in scontrol that appends its arguments to a file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    # One task of a batch job, as srun starts it: Lightning sees SLURM managing the process.
    for name, value in (("SLURM_JOB_ID", "4242"), ("SLURM_NTASKS", "1"), ("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"),
                        ("SLURM_NODEID", "0"), ("SLURM_JOB_NAME", "train"), ("SLURM_NTASKS_PER_NODE", "1")):  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    return calls


@pytest.fixture
def net():
    """SIGUSR1 that tfbuilder does not handle fails the test here (its default would end the test run)."""

    def escaped(signum, frame):
        raise Escaped(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGUSR1, escaped)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_sigusr1_checkpoints_requeues_once_and_the_same_command_finishes_bit_equal(tmp_path, slurm, net, monkeypatch, capsys):
    here = tmp_path / "job"
    command = ["fit", str(QUICKSTART), "--run-dir", str(here), *tiny(tmp_path, *EXACT)]
    with monkeypatch.context() as patch:
        signal_at(patch, Task, "on_train_batch_end", signal.SIGUSR1, step=6)  # seen by the guard at step 7
        outcome = run_cli(command, capsys)
    assert outcome.rc == 128 + signal.SIGUSR1, outcome.err
    assert "SIGUSR1: training stopped at step 7; checkpoints/last.ckpt holds step 7" in outcome.err
    assert "SLURM job 4242 requeued: it runs the same command again" in outcome.err and "Traceback" not in outcome.err
    assert slurm.read_text() == "requeue 4242\n"  # once
    assert not list(here.rglob("hpc_ckpt*"))  # Lightning's own requeue checkpoint: none

    assert run_cli(command, capsys).rc == 0  # the requeued job: the same command
    assert slurm.read_text() == "requeue 4242\n"
    reference = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, [f"trainer.output={tmp_path / 'reference'}", *TINY, *EXACT]))
    a, b = weights(Path(reference.last_checkpoint)), weights(here / "checkpoints" / "last.ckpt")
    assert read_checkpoint(here / "checkpoints" / "last.ckpt")["global_step"] == 16
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigusr2_submitits_notice_checkpoints_without_asking_slurm(tmp_path, slurm, monkeypatch, capsys):
    """submitit's jobs are told of their time limit (and of preemption) with SIGUSR2: a stop like
    SIGTERM's, status 140; submitit's handler requeues (tfbuilder.use.launch.Entry), so tfbuilder does not."""

    def escaped(signum, frame):
        raise Escaped(signal.Signals(signum).name)

    here = tmp_path / "job"
    previous = signal.signal(signal.SIGUSR2, escaped)
    try:
        with monkeypatch.context() as patch:
            signal_at(patch, Task, "on_train_batch_end", signal.SIGUSR2, step=6)
            outcome = run_cli(["fit", str(QUICKSTART), "--run-dir", str(here), *tiny(tmp_path, *EXACT)], capsys)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert outcome.rc == 128 + signal.SIGUSR2, outcome.err
    assert "SIGUSR2: training stopped at step 7; checkpoints/last.ckpt holds step 7" in outcome.err
    assert not slurm.exists()  # no scontrol requeue


def test_requeue_asks_only_after_sigusr1_in_a_slurm_job(slurm, monkeypatch):
    assert stopping.requeue(signal.SIGTERM) is None and not slurm.exists()
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert stopping.requeue(signal.SIGUSR1) == "SLURM job 7_3 requeued: it runs the same command again, which continues the run"
    assert slurm.read_text() == "requeue 7_3\n"
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID")
    assert stopping.requeue(signal.SIGUSR1) is None  # not a SLURM job
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "not requeued: scontrol is not on PATH" in stopping.requeue(signal.SIGUSR1)


def test_lightnings_own_requeue_is_switched_off_under_slurm(slurm, monkeypatch):
    from tfbuilder.train.trainer import _cluster_environment

    (environment,) = _cluster_environment()
    assert environment.auto_requeue is False  # else Lightning writes hpc_ckpt_<n>.ckpt and requeues as well
    monkeypatch.delenv("SLURM_NTASKS")
    assert _cluster_environment() == []


def test_sigusr1_before_the_first_step_requeues_too(tmp_path, slurm, net, monkeypatch, capsys):
    from tfbuilder.train import lifecycle

    here = tmp_path / "job"
    with monkeypatch.context() as patch:
        signal_at(patch, lifecycle, "_set_up_run_dir", signal.SIGUSR1)
        outcome = run_cli(["fit", str(QUICKSTART), "--run-dir", str(here), *tiny(tmp_path)], capsys)
    assert outcome.rc == 128 + signal.SIGUSR1, outcome.err
    assert "SIGUSR1: stopped before the first step" in outcome.err and "SLURM job 4242 requeued" in outcome.err
    assert slurm.read_text() == "requeue 4242\n"
