"""``tfbuilder sweep --launcher``: its options, and the jobs' states as they end (the submitting and
waiting are :mod:`tfbuilder.use.launch`'s)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import TYPE_CHECKING

from tfbuilder.cli.arguments import positive_int
from tfbuilder.errors import TfbuilderError

if TYPE_CHECKING:
    from pathlib import Path

    from tfbuilder.use.sweeps import Sweep

SLURM_OPTIONS = (
    "slurm_partition",
    "slurm_gpus_per_node",
    "slurm_cpus_per_task",
    "slurm_time",
    "slurm_array_parallelism",
)


def add_launcher(w: argparse.ArgumentParser) -> None:
    w.add_argument(
        "--launcher",
        choices=("submitit", "local"),
        help="submit one job per entry through submitit (pip install 'tfbuilder[slurm]'): 'submitit' on the "
        "cluster it finds (a SLURM job array), 'local' as processes on this machine; waits for them, then "
        "writes the report",
    )
    w.add_argument("--slurm-partition", metavar="P", help="the partition of the jobs (default the cluster's)")
    w.add_argument("--slurm-gpus-per-node", type=positive_int, metavar="N", help="GPUs for each job")
    w.add_argument("--slurm-cpus-per-task", type=positive_int, metavar="N", help="CPU cores for each job")
    w.add_argument(
        "--slurm-time",
        type=positive_int,
        metavar="MIN",
        help="each job's time limit in minutes, after which it is requeued and continues (default 1440, a day)",
    )
    w.add_argument("--slurm-array-parallelism", type=positive_int, metavar="K", help="run at most K entries at once")
    w.add_argument(
        "--no-wait",
        action="store_true",
        help="with --launcher: return once the jobs are submitted, printing their ids and the --report-only "
        "command to run when they end",
    )


def check(args: argparse.Namespace) -> None:
    """Refuse launcher options without ``--launcher``, and ``--entry``/``--report-only`` with it."""
    if args.launcher is None:
        given = [f"--{name.replace('_', '-')}" for name in (*SLURM_OPTIONS, "no_wait") if vars(args)[name]]
        if given:
            raise TfbuilderError(f"{', '.join(given)} only applies with --launcher submitit or local")
    elif args.entry is not None or args.report_only:
        raise TfbuilderError("--launcher submits every entry as its own job: leave out --entry and --report-only")
    else:
        from tfbuilder.use.launch import require  # deferred: start-up time

        require(args.launcher)


def worker_argv(args: argparse.Namespace, sweep: Sweep) -> list[str]:
    """The sweep command every job runs (before ``--entry I``): absolute paths, so it runs from anywhere."""
    argv = ["sweep", *(os.path.abspath(r) if os.path.exists(r) else r for r in dict.fromkeys(args.recipes))]
    argv += ["--seeds", str(args.seeds), "--out", os.path.abspath(sweep.dir)]
    argv += ["--no-bleu"] if args.no_bleu else ["--beam", str(args.beam)]
    if args.baseline:
        argv += ["--baseline", args.baseline]
    for override in args.overrides:
        argv += ["--set", override]
    for plugin in args.plugins:
        argv += ["--plugins", os.path.abspath(plugin) if os.path.exists(plugin) else plugin]
    return argv


def launch(args: argparse.Namespace, sweep: Sweep) -> tuple[dict[Path, str], int] | None:
    """Submit the sweep's entries; with ``--no-wait`` return None, else wait and return what diverged
    (run directory -> label) and how many jobs failed. The caller writes the report."""
    from tfbuilder.use import launch as launching  # deferred: start-up time

    argv = worker_argv(args, sweep)
    entries = [launching.Entry(args.main, tuple(argv), index) for index in range(len(sweep.runs))]
    resources = launching.Resources(
        partition=args.slurm_partition,
        gpus_per_node=args.slurm_gpus_per_node,
        cpus_per_task=args.slurm_cpus_per_task,
        timeout_min=args.slurm_time or launching.DAY_MIN,
        array_parallelism=args.slurm_array_parallelism,
    )
    folder = sweep.dir / "jobs"  # submitit's scripts, pickled entries, results and logs
    cluster, jobs = launching.submit(entries, launcher=args.launcher, folder=folder, resources=resources)
    print(f"sweep {sweep.dir}: {len(jobs)} jobs submitted ({cluster}); logs in {sweep.dir / 'jobs'}", file=sys.stderr)
    for index, job in enumerate(jobs):
        print(f"{index:>4}  job {job.job_id}  {sweep.runs[index].dir}")
    report = "tfbuilder " + shlex.join([*argv, "--report-only"])
    if args.no_wait:
        print(f"not waiting; when the jobs have ended, write the report with:\n{report}")
        return None
    diverged: dict[Path, str] = {}
    failed = 0
    for outcome in launching.outcomes(entries, jobs):
        run = sweep.runs[outcome.index]
        label = f"{run.recipe.name} seed {run.seed}"
        if outcome.code == 1:
            diverged[run.dir] = f"{label} (diverged: see job {outcome.job_id}'s log)"
        failed += outcome.code is None
        said = "finished" if outcome.code == 0 else "diverged" if outcome.code == 1 else outcome.error
        print(f"entry {outcome.index} ({label}, job {outcome.job_id}): {outcome.state}, {said}", file=sys.stderr)
    return diverged, failed
