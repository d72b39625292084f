"""CPU threads beside a busy neighbour: why ``trainer.threads: auto`` counts only the idle cores.

Trains the quick-start recipe for ``--steps`` steps with each thread setting, first on a quiet
machine and then beside a neighbour process that keeps one core busy (a matrix-multiply loop),
and prints the wall time of the training (the summary's) per setting, median of ``--repeats``.

    python benchmarks/threads.py                 # the table in docs/getting-started.md, "Threads"
    python benchmarks/threads.py --steps 100 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def neighbour(stop) -> None:
    """Another job on the machine: one thread, a matrix multiply in a loop."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    while not stop.is_set():
        a = (a @ a).tanh()


def train_seconds(threads: str, steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        overrides = [f"trainer.output={out}", f"trainer.max_steps={steps}", f"trainer.val_every={steps}", "trainer.progress=false", f"trainer.threads={threads}"]
        cmd = [sys.executable, "-m", "tfbuilder", "fit", str(ROOT / "recipes" / "quickstart.yaml")]
        for o in overrides:
            cmd += ["--set", o]
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        subprocess.run(cmd, check=True, capture_output=True, cwd=out, env=env)
        summary = next(Path(out).rglob("summary.json"))
        return json.loads(summary.read_text())["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", nargs="+", default=["1", str(os.cpu_count() or 2), "auto"])
    args = ap.parse_args()
    rows = []
    for label, busy in (("quiet", False), ("one core busy", True)):
        stop = mp.Event()
        other = mp.Process(target=neighbour, args=(stop,), daemon=True) if busy else None
        if other:
            other.start()
            time.sleep(65)  # the load average (which auto reads) takes about a minute to see it
        for setting in args.settings:
            times = [train_seconds(setting, args.steps) for _ in range(args.repeats)]
            rows.append((label, setting, statistics.median(times)))
        if other:
            stop.set()
            other.join()
    print(f"# quickstart, {args.steps} steps, {os.cpu_count()} cores, median of {args.repeats}")
    print(f"# {' '.join(['python', *sys.argv])}")
    print(f"{'machine':<15} {'trainer.threads':>15} {'seconds':>8}")
    for label, setting, seconds in rows:
        print(f"{label:<15} {setting:>15} {seconds:>8.1f}")


if __name__ == "__main__":
    main()
