"""Bookkeeping that holds for any number of processes: the global data position (a resume on another
world size continues the global order of batches), train_loss reduced over ranks, and one run directory
for processes a launcher started (torchrun). Real processes joined by gloo on the CPU."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUICKSTART, ddp_env, short_run

pytestmark = pytest.mark.xdist_group("ranks")  # several processes each: kept on one pytest-xdist worker

# `tfbuilder fit` recording, on every rank, the examples of each training batch and the loss and target
# count of each step as the rank computed them (one JSON line each, in $RECORD_DIR/rank-<r>.jsonl).
DRIVER = """
import json, os, sys
from tfbuilder.train.task import Task
from tfbuilder.cli.commands import main

def record(self, **fields):
    with open(os.path.join(os.environ["RECORD_DIR"], f"rank-{self.global_rank}.jsonl"), "a") as f:
        f.write(json.dumps({"phase": os.environ["PHASE"], "step": self.global_step + 1, **fields}) + "\\n")

batch_start = Task.on_train_batch_start
def on_batch(self, batch, batch_idx):
    record(self, index=batch["index"].tolist())
    return batch_start(self, batch, batch_idx)
Task.on_train_batch_start = on_batch

log_loss = Task.log_train_loss
def on_loss(self, loss, tokens, size):
    record(self, loss=float(loss), tokens=int(tokens))
    return log_loss(self, loss, tokens, size)
Task.log_train_loss = on_loss
sys.exit(main(sys.argv[1:]))
"""

TIMEOUT = 300  # seconds for one fit: two processes on two busy cores


def settings(tmp_path: Path, *extra: str) -> list[str]:
    """A short copy-task run: about 20 batches an epoch (600 examples, 256 tokens a batch), checkpoints
    every 3 steps, train_loss logged every 2."""
    sets = short_run(tmp_path, "data.max_tokens=256", "trainer.accelerator=cpu", "trainer.threads=1",
                     "trainer.val_every=3", "trainer.log_every=2", *extra, train=600, val=40)  # fmt: skip
    return sum((["--set", s] for s in sets), [])


def fit_cmd(driver: Path, *args: str, torchrun: bool = False, port: str = "") -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", port] if torchrun else [sys.executable]  # fmt: skip
    return [*launcher, str(driver), "fit", str(QUICKSTART), *args]


def run_phase(cmd: list[str], tmp_path: Path, phase: str, **env: str) -> subprocess.CompletedProcess:
    environment = ddp_env(RECORD_DIR=str(tmp_path), PHASE=phase, **env)
    if "--master-port" in cmd:
        cmd[cmd.index("--master-port") + 1] = environment["MASTER_PORT"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=environment)


def records(tmp_path: Path, phase: str, key: str) -> list[dict]:
    out = []
    for rank in (0, 1):
        path = tmp_path / f"rank-{rank}.jsonl"
        if path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            out += [{**r, "rank": rank} for r in rows if r["phase"] == phase and key in r]
    return sorted(out, key=lambda r: (r["step"], r["rank"]))  # the global order: step by step, rank by rank


@pytest.mark.cluster
def test_a_run_continues_the_global_order_on_another_number_of_processes(tmp_path):
    """One process trains 3 steps, two processes (torchrun) 3 more, one process 3 more, all through the
    same ``--run-dir``: the 12 batches are, in order, the first 12 of an uninterrupted one-process run
    (the global order: no batch trained twice, none skipped). On two processes, train_loss in metrics.csv
    and the summary is the token-weighted mean of what the two ranks computed.

    About 2 minutes on 2 busy cores: four fits, one of them on two processes."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    run = tmp_path / "run"
    plan = [("one", 3, 1), ("two", 6, 2), ("one-again", 9, 1)]
    summaries = {}
    for phase, steps, devices in plan:
        sets = settings(tmp_path, f"trainer.max_steps={steps}", f"trainer.devices={devices}",
                        *(["trainer.strategy=ddp"] if devices > 1 else []))  # fmt: skip
        cmd = fit_cmd(driver, "--run-dir", str(run), *sets, torchrun=devices > 1)
        proc = run_phase(cmd, tmp_path, phase)
        assert proc.returncode == 0, (phase, proc.stderr[-3000:])
        summaries[phase] = json.loads((run / "summary.json").read_text())
    # The one run directory the processes shared, and no other (no stray version_<n> of rank 1).
    assert not (tmp_path / "runs").exists()
    reference = run_phase(fit_cmd(driver, *settings(tmp_path, "trainer.max_steps=12")), tmp_path, "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    trained = [r["index"] for phase, _, _ in plan for r in records(tmp_path, phase, "index")]
    uninterrupted = [r["index"] for r in records(tmp_path, "reference", "index")]
    assert len(trained) == len(uninterrupted) == 12
    assert trained == uninterrupted
    flat = [i for batch in trained for i in batch]
    assert len(flat) == len(set(flat))  # one epoch, not crossed: no example twice
    assert [r["rank"] for r in records(tmp_path, "two", "index")] == [0, 1] * 3  # both ranks trained
    # train_loss of the two-process steps: the token-weighted mean over both ranks (steps 4 and 6 logged).
    losses = records(tmp_path, "two", "loss")
    expected = {}
    for step in (4, 5, 6):
        mine = [r for r in losses if r["step"] == step]
        assert len(mine) == 2
        expected[step] = sum(r["loss"] * r["tokens"] for r in mine) / sum(r["tokens"] for r in mine)
    assert len({r["tokens"] for r in losses}) > 1  # the ranks' batches differ in size: weighting matters
    with open(run / "metrics.csv", newline="") as f:
        logged = {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(f) if row.get("train_loss")}
    assert logged[4] == pytest.approx(expected[4], rel=1e-6) and logged[6] == pytest.approx(expected[6], rel=1e-6)
    assert 5 not in logged
    assert summaries["two"]["last_train_loss"] == pytest.approx(expected[6], rel=1e-6)
    last = records(tmp_path, "one-again", "loss")[-1]["loss"]  # one process: its own loss
    assert summaries["one-again"]["last_train_loss"] == pytest.approx(last, rel=1e-6)


def test_processes_a_launcher_started_need_one_run_directory(tmp_path):
    """Two processes started by torchrun, no run directory named: each would claim a version_<n> of its
    own, so both are refused before anything is made, naming --run-dir and TFBUILDER_RUN_DIR."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    sets = settings(tmp_path, "trainer.max_steps=2", "trainer.devices=2", "trainer.strategy=ddp")
    proc = run_phase(fit_cmd(driver, *sets, torchrun=True), tmp_path, "refused")
    assert proc.returncode != 0
    assert proc.stderr.count("give them all one run directory with --run-dir DIR or TFBUILDER_RUN_DIR=DIR") == 2
    assert not (tmp_path / "runs").exists()  # no run directory, no stray version_0
