"""The verbs that compare runs: ``sweep`` (train recipes over seeds into one directory, then report)
and ``compare`` (the same report from runs that exist)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from tfbuilder.cli.arguments import EXIT_USAGE, add_set, beam, count, directory_arg, seeds
from tfbuilder.cli.launching import add_launcher, check, launch
from tfbuilder.cli.recipes import preflight
from tfbuilder.errors import RecipeError, TfbuilderError, printable

if TYPE_CHECKING:  # rich and the sweeps (torch, Lightning) are imported in the commands (start-up time)
    from collections.abc import Callable
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress, TaskID

    from tfbuilder.cli.arguments import Subparsers
    from tfbuilder.use.sweeps import Run, Sweep


def add_sweep(sub: Subparsers) -> None:
    w = sub.add_parser("sweep", help="train recipes over seeds into one directory; write a comparison report")
    w.add_argument(
        "recipes",
        nargs="+",
        metavar="RECIPE",
        help="the recipes to compare (the first is the baseline unless --baseline)",
    )
    w.add_argument("--seeds", type=seeds, default=1, help="seeds 0..N-1 for every recipe (default 1)")
    w.add_argument("--out", metavar="DIR", help="sweep directory (default <trainer.output>/sweeps/<recipes' folder>)")
    w.add_argument("--beam", type=beam, default=4, help="beam of the validation BLEU after training (default 4)")
    w.add_argument("--no-bleu", action="store_true", help="skip the validation BLEU")
    w.add_argument(
        "--baseline", metavar="NAME", help="recipe name the 'changes' column is relative to (default the first)"
    )
    w.add_argument("--dry-run", action="store_true", help="say what would run, and stop")
    w.add_argument(
        "--entry",
        type=count,
        metavar="I",
        help="run entry I of the plan alone (0-based, recipes x seeds in order; --dry-run lists them): one "
        "task of a SLURM job array (--entry $SLURM_ARRAY_TASK_ID)",
    )
    w.add_argument(
        "--report-only", action="store_true", help="train nothing: write the report from the runs finished so far"
    )
    add_set(w)
    add_launcher(w)
    w.set_defaults(run=cmd_sweep)


def add_compare(sub: Subparsers) -> None:
    cp = sub.add_parser("compare", help="the sweep report from existing runs (run, sweep or output directories)")
    cp.add_argument(
        "dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories, sweep directories or output directories holding runs",
    )
    cp.add_argument(
        "--out", metavar="DIR", help="also write report.md/.csv, runs.csv, curves.png/.svg into DIR (new files only)"
    )
    cp.add_argument("--beam", type=beam, default=4, help="read the validation BLEU of this beam (default 4)")
    cp.add_argument(
        "--baseline", metavar="NAME", help="recipe name the 'changes' column is relative to (default the first)"
    )
    cp.set_defaults(run=cmd_compare)


def cmd_sweep(args: argparse.Namespace) -> int:
    from tfbuilder.use import sweeps  # deferred: start-up time

    problems = []
    for path in dict.fromkeys(args.recipes):  # every recipe's problems, before anything runs
        try:
            preflight(path, args.overrides)
        except RecipeError as exc:
            problems += exc.problems
    if problems:
        raise RecipeError(problems)
    check(args)
    if args.out:
        directory_arg(args.out, "--out")
    command = "tfbuilder " + shlex.join(args.argv)
    sweep = sweeps.plan(
        args.recipes,
        seeds=args.seeds,
        overrides=args.overrides,
        out=args.out,
        bleu_beam=None if args.no_bleu else args.beam,
        command=command,
    )
    sweeps.check_own(sweep.dir)  # never writes its reports over files it did not make
    if args.entry is not None and args.entry >= len(sweep.runs):
        print(f"sweep: --entry {args.entry}: the plan has entries 0 to {len(sweep.runs) - 1}", file=sys.stderr)
        return EXIT_USAGE
    chosen = sweep.runs if args.entry is None else [sweep.runs[args.entry]]
    todo = [] if args.report_only else [r for r in chosen if r.status != "finished"]
    counts = {s: sum(r.status == s for r in sweep.runs) for s in ("finished", "resume", "evaluate", "new")}
    print(
        f"sweep {sweep.dir}: {len(sweep.runs)} runs ({len(sweep.names)} recipes x {args.seeds} seeds); "
        f"{counts['finished']} finished, {counts['resume']} to resume, "
        f"{counts['evaluate']} to score, {counts['new']} to train",
        file=sys.stderr,
    )
    if args.dry_run:
        for index, run in enumerate(sweep.runs):
            print(f"{index:>4}  {run.status:>9}  {run.dir}")
        return 0
    if args.launcher is not None:
        return _launched(args, sweep, command)
    from tfbuilder.train.progress import global_rank  # deferred: start-up time
    from tfbuilder.train.trainer import quiet_lightning

    if global_rank() == 0:
        sweeps.write_plan(sweep)
    with quiet_lightning():
        diverged, elsewhere = _run_with_progress(todo, sweep)
    if global_rank() != 0:
        return 0  # another rank of a DDP sweep: rank 0 writes the report
    return _report(args, sweep, diverged, elsewhere, command)


def _launched(args: argparse.Namespace, sweep: Sweep, command: str) -> int:
    """One job per entry through submitit; once every job has ended, the report from the finished runs
    (the worker that finished the last run wrote it already, unless a run diverged or a job failed)."""
    from tfbuilder.use import sweeps  # deferred: start-up time

    sweeps.write_plan(sweep)
    ended = launch(args, sweep)
    if ended is None:  # --no-wait
        return 0
    diverged, failed = ended
    args.report_only = True
    code = _report(args, sweep, diverged, [], command)
    return max(code, 1) if failed else code


def _report(
    args: argparse.Namespace, sweep: Sweep, diverged: dict[Path, str], elsewhere: list[str], command: str
) -> int:
    """The sweep's report once its last run is finished (by this worker or another); 1 if a run diverged."""
    from tfbuilder.use import reports, sweeps  # deferred: start-up time

    failed = list(diverged.values())
    unfinished = [r for r in sweep.runs if r.dir not in diverged and sweeps.status(r, sweep.bleu_beam) != "finished"]
    if unfinished and not args.report_only:
        # Other workers (processes, nodes, job-array tasks) are training these: the one that finishes the
        # sweep's last run writes the report.
        print(
            f"sweep {sweep.dir}: {len(sweep.runs) - len(unfinished)} of {len(sweep.runs)} runs finished"
            + (f"; {len(elsewhere)} were being trained by another worker" if elsewhere else "")
            + "; the report is written when the last one finishes (or run this command with --report-only)",
            file=sys.stderr,
        )
        return 1 if failed else 0
    finished, _ = reports.find_runs([sweep.dir])
    if not finished:
        print(f"sweep {sweep.dir}: no finished runs to report yet", file=sys.stderr)
        return EXIT_USAGE
    rows = reports.group(reports.read_runs(finished, beam=args.beam, warn=_warn), baseline=args.baseline)
    note = f"Made by `{command}`." if command else ""
    if failed:
        note += "\n\nNot in the table (diverged): " + "; ".join(failed)
    paths = reports.write(rows, sweep.dir, title=f"sweep {sweep.dir.name}", note=note.strip(), beam=args.beam)
    print(reports.markdown(rows, beam=args.beam))
    print("\n" + "\n".join(f"wrote {p}" for p in paths.values()), file=sys.stderr)
    for line in failed:
        print(f"diverged: {line}", file=sys.stderr)
    return 1 if failed else 0


def _run_with_progress(
    todo: list[Run], sweep: Sweep, console: Console | None = None
) -> tuple[dict[Path, str], list[str]]:
    """Each run in turn under a rich progress display (plain lines when the output is not a terminal).
    A run that diverges does not stop the others. A run another worker holds (its ``fit.lock``) is left
    to it, and a run that worker finished meanwhile is not trained again. Returns what diverged, and
    what other workers were training."""
    import time

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from tfbuilder.runs.checkpoints import RunInUse
    from tfbuilder.train.callbacks import NonFiniteLoss  # deferred: start-up time
    from tfbuilder.use.sweeps import execute, status  # deferred: start-up time

    console = console or Console(stderr=True)
    failed: dict[Path, str] = {}  # run directory -> what diverged
    elsewhere: list[str] = []
    columns = (
        TextColumn("{task.description:<36}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        overall = progress.add_task("runs", total=len(todo))
        for index, run in enumerate(todo, 1):
            label = f"{run.recipe.name} seed {run.seed}"
            current = progress.add_task(f"{label} ({run.status})", total=run.recipe.trainer.max_steps)
            progress.refresh()  # show the run now, not at the next tick
            if not console.is_terminal:
                print(f"[{index}/{len(todo)}] {label}: {run.status} -> {run.dir}", file=sys.stderr, flush=True)
            start = time.perf_counter()
            run.status = status(run, sweep.bleu_beam)  # another worker may have trained it since the plan
            try:
                if run.status != "finished":
                    execute(run, bleu_beam=sweep.bleu_beam, on_step=_moving(progress, current))
            except NonFiniteLoss as exc:
                failed[run.dir] = f"{label} ({exc})"
            except RunInUse:
                elsewhere.append(label)  # another worker holds it: the next entry
                if not console.is_terminal:
                    print(f"[{index}/{len(todo)}] {label}: another worker is training it", file=sys.stderr)
            progress.refresh()  # the run's last state (a short run can end between ticks)
            progress.remove_task(current)
            progress.advance(overall)
            if console.is_terminal:
                progress.console.print(f"done {label} in {time.perf_counter() - start:.0f} s")
    return failed, elsewhere


def _moving(progress: Progress, task: TaskID) -> Callable[[int, int], None]:
    """A run's ``on_step``: moves its bar to ``step`` of ``total``."""

    def on_step(step: int, total: int) -> None:
        progress.update(task, completed=step, total=total)

    return on_step


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tfbuilder.use import reports  # deferred: start-up time

    if args.out:
        directory_arg(args.out, "--out")
    finished, unfinished = reports.find_runs(args.dirs)
    for run in unfinished:
        print(f"skipping {run}: not finished (no summary.json)", file=sys.stderr)
    rows = reports.group(reports.read_runs(finished, beam=args.beam, warn=_warn), baseline=args.baseline)
    print(reports.markdown(rows, beam=args.beam))
    if args.out:
        out = Path(args.out)
        taken = [n for n in reports.FILES if (out / n).exists()]
        if taken:
            raise TfbuilderError(f"{out} already has {', '.join(taken)}: not overwriting; choose another --out")
        paths = reports.write(rows, out, title="comparison of " + ", ".join(args.dirs), beam=args.beam)
        print("\n" + "\n".join(f"wrote {p}" for p in paths.values()), file=sys.stderr)
    return 0


def _warn(line: str) -> None:
    print(f"warning: {printable(line)}", file=sys.stderr)
