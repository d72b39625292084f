"""Runs of two processes that a cluster launcher starts, stopped and started again: torchrun restarting a
worker killed with kill -9, SIGTERM to torchrun, SLURM's SIGUSR1 and requeue, and refusals that every
rank reports. Each continues from the last checkpoint with the same command and ends bit-equal to an
uninterrupted run of two processes.

Real processes joined by gloo on loopback (two torchrun "nodes" on one machine where the test is
about nodes), with the tiny quick-start run; SLURM is simulated (its variables, one process per task
as ``srun`` starts them, and a stand-in ``scontrol`` on PATH). Every process has a timeout: a hang fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import QUICKSTART, ROOT, ddp_env

from tfbuilder.runs import joblock
from tfbuilder.runs.checkpoints import RunLock, read_checkpoint

# One worker keeps the group's reference run and spares the two cores the others' processes.
pytestmark = pytest.mark.xdist_group("distributed_runs")

TIMEOUT = 300  # seconds for one command: two processes start and train in about 20 s on 2 busy cores
# The tiny run of test_faults.py, with enough validation examples for two ranks' batches.
TINY = [
    "trainer.progress=false", "data.train_size=300", "data.val_size=60", "data.lengths=[1, 6]", "data.max_tokens=64",
    "trainer.val_every=4", "trainer.log_every=2", "trainer.keep_last=3", "trainer.max_steps=16", "trainer.threads=1",
    "model.d_model=16", "model.attention.heads=2", "model.attention.key_dim=8", "model.attention.value_dim=8",
    "model.ffn.hidden=16", "model.encoder.layers=1", "model.decoder.layers=1",
    "model.dropout=0.1", "trainer.deterministic=true",  # random draws too must continue where they were
    "trainer.strategy=ddp", "trainer.accelerator=cpu",
]  # fmt: skip
TWO_NODES = ["trainer.devices=1", "trainer.num_nodes=2"]  # one process on each of two machines
ONE_NODE = ["trainer.devices=2", "trainer.num_nodes=1"]  # two processes on one machine

# `tfbuilder fit` with two test hooks, each on one rank, at one step, once (a marker file remembers):
# CRASH=rank:step:marker kills the process there with SIGKILL, as kill -9 would; PAUSE=rank:step:marker
# writes the marker and waits there until a signal has reached the training loop's handler, so the
# test strikes during training, never before it or after it. EXITS=folder: each rank writes its exit status there.
DRIVER = r"""
import os, signal, sys, time
from pathlib import Path
from tfbuilder.train import callbacks
from tfbuilder.train.task import Task
from tfbuilder.cli.commands import main

signalled = []
on_signal = callbacks.RunGuard._on_signal
def remember(self, *args):
    signalled.append(True)
    on_signal(self, *args)
callbacks.RunGuard._on_signal = remember

def hook(name):
    if not os.environ.get(name):
        return None
    rank, step, marker = os.environ[name].split(":", 2)
    return int(rank), int(step), Path(marker)

crash, pause = hook("CRASH"), hook("PAUSE")
step_end = Task.on_train_batch_end
def strike(self, *args):
    step_end(self, *args)
    here = (self.global_rank, self.global_step)
    if crash and here == crash[:2] and not crash[2].exists():
        crash[2].write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    if pause and here == pause[:2] and not pause[2].exists():
        pause[2].write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not signalled and time.monotonic() < deadline:
            time.sleep(0.05)
Task.on_train_batch_end = strike
code = main(sys.argv[1:])
if os.environ.get("EXITS"):  # each rank's exit status, where a launcher reports none
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    Path(os.environ["EXITS"], f"rank-{rank}").write_text(str(code))
sys.exit(code)
"""


def driver(tmp_path: Path) -> Path:
    path = tmp_path / "fit_driver.py"
    path.write_text(DRIVER)
    return path


def fit_args(tmp_path: Path, run_dir: Path, *more: str) -> list[str]:
    sets = [f"trainer.output={tmp_path / 'runs'}", *TINY, *more]
    overrides = sum((["--set", s] for s in sets), [])
    return [str(driver(tmp_path)), "fit", str(QUICKSTART), "--run-dir", str(run_dir), *overrides]


def launcher_env(**extra: str) -> tuple[dict[str, str], int]:
    """The environment for torchrun (no MASTER_ADDR/PORT: torchrun sets them) and a free port for its rendezvous.
    PyTorch's agents share one store across restarts by default, and a restarted worker may then read a
    dead worker's address from it (pytorch/pytorch#135712): TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as
    docs/gpu.md says."""
    env = ddp_env(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **extra)
    port = int(env.pop("MASTER_PORT"))
    env.pop("MASTER_ADDR")
    env.pop("TFBUILDER_CACHE", None)
    return env, port


def torchrun(nnodes: int, nproc: int, port: int, *, restarts: int = 0) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
        "--max-restarts", str(restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
    ]  # fmt: skip


def finished(procs: list[subprocess.Popen], timeout: float = TIMEOUT) -> list[tuple[int, str]]:
    """Each process's exit status and output, once all have ended; a process still running at the
    timeout is killed and fails the test."""
    deadline = time.monotonic() + timeout
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"a process was still running after {timeout} s: {proc.args}")
        results.append((proc.returncode, out))
    return results


def start(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(marker: Path, procs: list[subprocess.Popen], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            pytest.fail(f"{marker.name} never appeared: {[p.communicate()[0][-3000:] for p in procs]}")
        time.sleep(0.1)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"]


def exits(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("rank-*"))}


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted run of two processes (torchrun, one machine)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    env, port = launcher_env()
    cmd = [*torchrun(1, 2, port), *fit_args(tmp_path, tmp_path / "run", *ONE_NODE)]
    ((rc, out),) = finished([start(cmd, env, tmp_path)])
    assert rc == 0, out[-3000:]
    assert read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == 16
    return weights(tmp_path / "run")


@pytest.mark.cluster
def test_torchrun_restarts_both_workers_after_kill_9_and_the_run_ends_bit_equal(tmp_path, reference):
    """Two torchrun agents (two "nodes" on loopback), --max-restarts 1: rank 1 is killed at step 10;
    torchrun starts both workers again with the same command, and they continue from step 8."""
    run_dir, marker = tmp_path / "run", tmp_path / "killed"
    env, port = launcher_env(CRASH=f"1:10:{marker}")
    cmd = [*torchrun(2, 1, port, restarts=1), *fit_args(tmp_path, run_dir, *TWO_NODES)]
    results = finished([start(cmd, env, tmp_path), start(cmd, env, tmp_path)])
    assert marker.exists()  # the worker was killed
    assert [rc for rc, _ in results] == [0, 0], "\n".join(out[-3000:] for _, out in results)
    both = "".join(out for _, out in results)
    assert "exitcode: -9" in both and both.count("training from step 8 to at most 16 steps") == 1, both[-3000:]
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 16
    assert_bit_equal(weights(run_dir), reference)


@pytest.mark.cluster
def test_sigterm_to_torchrun_checkpoints_and_the_same_command_finishes_bit_equal(tmp_path, reference):
    """torchrun passes SIGTERM on to its workers: they stop together after validating and checkpointing
    the step, each exits 143, only rank 0 speaks of the checkpoint, and torchrun reports a failure.
    The same command run again continues from that checkpoint."""
    run_dir, marker = tmp_path / "run", tmp_path / "paused"
    env, port = launcher_env(PAUSE=f"0:6:{marker}", EXITS=str(tmp_path))
    cmd = [*torchrun(1, 2, port), *fit_args(tmp_path, run_dir, *ONE_NODE)]
    proc = start(cmd, env, tmp_path)
    wait_for(marker, [proc])
    proc.send_signal(signal.SIGTERM)
    ((rc, out),) = finished([proc])
    assert rc == 1 and "SignalException: Process" in out, out[-3000:]  # torchrun's own status: a failure
    assert exits(tmp_path) == {"rank-0": "143", "rank-1": "143"}, out[-3000:]
    # Every rank stops at the same step (8: the first step the ranks compare after the signal).
    assert "SIGTERM: training stopped at step 8; checkpoints/last.ckpt holds step 8" in out, out[-3000:]
    assert "SIGTERM: rank 1 stopped at step 8 with every rank; rank 0 says what was checkpointed" in out
    assert "No checkpoint was written" not in out and out.count("last.ckpt holds") == 1
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 8
    env, port = launcher_env()
    cmd = [*torchrun(1, 2, port), *fit_args(tmp_path, run_dir, *ONE_NODE)]
    ((rc, again),) = finished([start(cmd, env, tmp_path)])
    assert rc == 0, again[-3000:]
    assert "training from step 8 to at most 16 steps" in again, again[-3000:]
    assert_bit_equal(weights(run_dir), reference)


def slurm_tasks(tmp_path: Path, **extra: str) -> list[dict[str, str]]:
    """The environments of a SLURM job's two tasks on two nodes, as srun starts them (one port for the
    job, as Lightning derives it from the job id), with a stand-in scontrol on PATH that appends its
    arguments to ``scontrol.calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.calls"}\n')
    scontrol.chmod(0o755)
    job = ddp_env(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PATH=f"{bin_dir}:/usr/bin:/bin", **extra)
    job.pop("TFBUILDER_CACHE", None)
    job.update(SLURM_JOB_ID="4242", SLURM_JOB_NAME="train", SLURM_NTASKS="2", SLURM_NNODES="2")
    job.update(SLURM_NTASKS_PER_NODE="1")
    return [{**job, "SLURM_PROCID": str(r), "SLURM_NODEID": str(r), "SLURM_LOCALID": "0"} for r in (0, 1)]


@pytest.mark.cluster
def test_sigusr1_under_slurm_checkpoints_and_requeues_once_and_the_requeued_job_ends_bit_equal(tmp_path, reference):
    """SLURM's warning (SIGUSR1) to both tasks during training: one checkpoint, one ``scontrol requeue``
    (rank 0's), both tasks exit 138; the requeued job (the same command and variables) continues from
    the checkpoint on both ranks and ends bit-equal to an uninterrupted run."""
    run_dir, marker, calls = tmp_path / "run", tmp_path / "paused", tmp_path / "scontrol.calls"
    cmd = [sys.executable, *fit_args(tmp_path, run_dir, *TWO_NODES)]
    tasks = slurm_tasks(tmp_path, PAUSE=f"0:6:{marker}")
    procs = [start(cmd, env, tmp_path) for env in tasks]
    wait_for(marker, procs)
    for proc in procs:
        proc.send_signal(signal.SIGUSR1)
    results = finished(procs)
    out = "".join(o for _, o in results)
    assert [rc for rc, _ in results] == [138, 138], out[-3000:]
    assert "SIGUSR1: training stopped at step 8; checkpoints/last.ckpt holds step 8" in out, out[-3000:]
    assert "SLURM job 4242 requeued" in out and "SIGUSR1: rank 1 stopped at step 8 with every rank" in out
    assert calls.read_text() == "requeue 4242\n"  # once, by rank 0
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 8
    assert not list(run_dir.rglob("hpc_ckpt*"))

    procs = [start(cmd, env, tmp_path) for env in slurm_tasks(tmp_path)]  # the requeued job
    results = finished(procs)
    assert [rc for rc, _ in results] == [0, 0], "".join(o[-3000:] for _, o in results)
    assert "training from step 8 to at most 16 steps" in results[0][1]
    assert calls.read_text() == "requeue 4242\n"
    assert_bit_equal(weights(run_dir), reference)


HOLD = """import sys, time
from tfbuilder.runs.checkpoints import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("case", ["lock held by another job", pytest.param("corrupt last.ckpt", marks=pytest.mark.cluster)])
def test_a_refusal_on_rank_0_is_a_refusal_on_every_rank_and_none_waits(tmp_path, case):
    """Both tasks of a SLURM job exit 2 with the reason, in seconds: none waits for a rank 0 that refused."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    holder = None
    if case == "corrupt last.ckpt":
        (run_dir / "recipe.yaml").write_text((ROOT / "recipes" / "quickstart.yaml").read_text())
        (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"not a checkpoint")
        reason = "last.ckpt"
    else:  # another job trains there: a live process holds the lock
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=env, stdout=subprocess.PIPE,
                                  text=True)
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        reason = f"{run_dir} is in use: a fit is training there (pid {holder.pid} on"
    try:
        cmd = [sys.executable, *fit_args(tmp_path, run_dir, *TWO_NODES)]
        results = finished([start(cmd, env, tmp_path) for env in slurm_tasks(tmp_path)], timeout=120)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(timeout=30)
    for rc, out in results:
        assert rc == 2 and reason in out and "Traceback" not in out, out[-3000:]


@pytest.fixture
def no_job(monkeypatch):
    """A process of no launcher's job: neither SLURM's variables nor a rendezvous address."""
    for name in [n for n in os.environ if n.startswith("SLURM_")] + ["MASTER_ADDR", "MASTER_PORT"]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_lock_names_its_job_and_another_rank_of_the_job_sees_it_is_its_own(tmp_path, no_job):
    assert joblock.held_by_another(tmp_path) is None  # no lock yet
    no_job.setenv("SLURM_JOB_ID", "4242")
    lock = RunLock(tmp_path).acquire()
    try:
        assert (tmp_path / "fit.lock").read_text().endswith(" job slurm 4242\n")
        assert joblock.held_by_another(tmp_path) is None  # this job's rank 0 holds it
        no_job.setenv("SLURM_JOB_ID", "4243")  # another job's rank looks at it
        assert joblock.held_by_another(tmp_path) == (tmp_path / "fit.lock").read_text().strip()
        no_job.delenv("SLURM_JOB_ID")
        no_job.setenv("MASTER_ADDR", "127.0.0.1")
        no_job.setenv("MASTER_PORT", "29500")
        assert joblock.job() == "rendezvous 127.0.0.1:29500"
        assert joblock.held_by_another(tmp_path) is not None
    finally:
        lock.release()
    assert joblock.held_by_another(tmp_path) is None  # let go: free, whatever its line says


def test_a_lock_held_without_a_job_is_another_process_unless_it_is_the_parent(tmp_path, no_job):
    lock = RunLock(tmp_path).acquire()
    try:
        assert joblock.job() == "" and " job " not in (tmp_path / "fit.lock").read_text()
        assert joblock.held_by_another(tmp_path) is not None  # this process is not its own parent
        no_job.setattr(os, "getppid", os.getpid)  # as Lightning's launcher starts rank 1: rank 0's child
        assert joblock.held_by_another(tmp_path) is None
    finally:
        lock.release()
