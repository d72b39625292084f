"""A sweep fanned out through submitit (https://github.com/facebookincubator/submitit): one job per entry,
submitted together as a job array (SLURM, found by submitit's ``AutoExecutor``) or run as local processes.

Each job is an :class:`Entry`: it runs ``tfbuilder sweep ... --entry I`` in the job's own process, the same
code as a task of a hand-written job array, so the rules are the same: a run's ``fit.lock`` keeps a second
worker out, a finished run is skipped, an interrupted one continues from its last checkpoint, and the
worker that finishes the sweep's last run writes the report. When SLURM's time limit or a preemption
stops a job, submitit calls :meth:`Entry.checkpoint`, requeues the job, and the requeued job runs the same
entry again, which continues the run from its last checkpoint.

submitit is optional (``pip install 'tfbuilder[slurm]'``) and imported only here, when a sweep is launched.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tfbuilder.errors import TfbuilderError

if TYPE_CHECKING:
    from types import ModuleType

    from submitit import AutoExecutor, Job
    from submitit.helpers import DelayedSubmission

Launcher = Literal["submitit", "local"]
DAY_MIN = 24 * 60  # each job's time limit unless told: then submitit requeues it (3 times at most)
INSTALL = "pip install 'tfbuilder[slurm]'"


class LaunchError(TfbuilderError):
    """A sweep cannot be launched: submitit is missing, or the cluster refused the jobs."""


@dataclass(frozen=True)
class Entry:
    """One entry of a sweep as a submitit job: ``command([*argv, "--entry", str(index)])`` in the job.

    ``command`` is the ``tfbuilder`` command line's entry point, handed in by the caller (pickled by its
    name, imported in the job), so a job runs exactly what ``tfbuilder sweep ... --entry I`` runs."""

    command: Callable[[list[str]], int]
    argv: tuple[str, ...]  # the sweep command without --entry: "sweep", the recipes, --seeds, --out, ...
    index: int  # the entry of the plan: recipes x seeds in order, as --dry-run numbers them

    def __call__(self) -> int:
        code = self.command([*self.argv, "--entry", str(self.index)])
        if code == 128 + signal.SIGUSR2:
            # submitit's notice before the time limit, which tfbuilder took as a stop: the step was
            # checkpointed, and the handler submitit installed in the job (given back when training
            # ended) now requeues this entry, which continues its run (it exits the job itself).
            signal.raise_signal(signal.SIGUSR2)
        if code > 128:  # Ctrl-C, SIGTERM, SIGUSR1 (tfbuilder.runs.checkpoints.Interrupted): a checkpoint was kept
            raise LaunchError(
                f"entry {self.index}: stopped by signal {code - 128}; the same sweep command continues its run"
            )
        if code not in (0, 1):  # 1: its run diverged, which the sweep's report says; anything else failed
            raise LaunchError(f"entry {self.index}: tfbuilder sweep exited {code} (see this job's log)")
        return code

    def checkpoint(self, *args: object, **kwargs: object) -> DelayedSubmission:
        """What submitit requeues when the job is stopped (time limit, preemption): this same entry, which
        continues its run from the run's last checkpoint (start-or-continue)."""
        from submitit.helpers import DelayedSubmission  # deferred: submitit is optional

        return DelayedSubmission(self)


@dataclass(frozen=True)
class Resources:
    """What each job asks of the cluster (None: the cluster's default); local jobs heed only the time."""

    partition: str | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    timeout_min: int = DAY_MIN  # submitit's own default is 5 minutes on SLURM, 2 for local jobs
    array_parallelism: int | None = None  # at most this many entries run at once


@dataclass(frozen=True)
class Outcome:
    """How one entry's job ended: ``state`` is submitit's (DONE, FAILED, ...), ``code`` the sweep's exit
    status (0, or 1 when its run diverged), ``error`` the first line of a failure."""

    index: int
    job_id: str
    state: str
    code: int | None
    error: str = ""


def require(launcher: Launcher) -> ModuleType:
    """submitit itself, or a :class:`LaunchError` naming what to install (checked before the sweep's
    directory is made, so a refused launch leaves nothing behind)."""
    try:
        import submitit  # deferred: optional, and only a launched sweep needs it
    except ImportError:
        raise LaunchError(f"--launcher {launcher} needs submitit: {INSTALL}") from None
    return submitit


def executor(launcher: Launcher, folder: Path, resources: Resources) -> AutoExecutor:
    """submitit's ``AutoExecutor``: the cluster it finds (SLURM where ``srun`` is on PATH), or local processes."""
    submitit = require(launcher)
    try:
        chosen = submitit.AutoExecutor(folder=folder, cluster="local" if launcher == "local" else None)
    except RuntimeError as exc:  # no cluster submitit knows
        raise LaunchError(f"--launcher {launcher}: {exc}") from None
    chosen.update_parameters(
        name="tfbuilder-sweep",
        timeout_min=resources.timeout_min,
        gpus_per_node=resources.gpus_per_node,
        cpus_per_task=resources.cpus_per_task,
        slurm_partition=resources.partition,
        slurm_array_parallelism=resources.array_parallelism,
    )
    return chosen


def submit(
    entries: Sequence[Entry], *, launcher: Launcher, folder: Path, resources: Resources
) -> tuple[str, list[Job]]:
    """Submit one job per entry, as one job array; returns the cluster's name and the jobs (in entry order)."""
    chosen = executor(launcher, folder, resources)
    try:
        jobs = chosen.submit_array(list(entries))
    except Exception as exc:  # sbatch refused (a partition, a limit), or a local process failed to start
        raise LaunchError(f"submitting the sweep's jobs failed: {_first_line(exc)}") from None
    return chosen.cluster, jobs


def outcomes(entries: Sequence[Entry], jobs: Sequence[Job], *, poll_s: float = 1.0) -> Iterator[Outcome]:
    """Each entry's outcome as its job ends (in the order they end)."""
    from submitit.helpers import as_completed  # deferred: submitit is optional

    index = {job.job_id: entry.index for entry, job in zip(entries, jobs, strict=True)}
    for job in as_completed(list(jobs), poll_frequency=poll_s):
        failure = job.exception()
        code = None if failure is not None else job.result()
        yield Outcome(index[job.job_id], job.job_id, job.state, code, "" if failure is None else _first_line(failure))


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    # submitit's FailedJobError holds the job's traceback: its last line is the error itself
    return lines[-1].strip() if lines else type(exc).__name__
