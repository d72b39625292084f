"""Running a hostile case through the CLI: exit 2, the place or argument named, no traceback, within
10 s of CPU time (in-process) or 1 GiB of address space (a subprocess under RLIMIT_AS), nothing
overwritten. CPU time, not wall time: other work on a shared machine does not count."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tfbuilder.cli.commands import main

SECONDS = 10.0
MEMORY = 1 << 30  # RLIMIT_AS of a subprocess case (importing torch alone takes about half of it)


@dataclass
class Outcome:
    rc: int
    out: str
    err: str
    seconds: float  # CPU time the command used


def run_cli(args: list[str], capsys, *, cwd: Path | None = None) -> Outcome:
    """``tfbuilder ARGS`` in this process; argparse's own exit (usage errors) counts as a return code."""
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    start = time.process_time()  # every thread of this process
    try:
        try:
            rc = main(args)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(old)
    seconds = time.process_time() - start
    captured = capsys.readouterr()
    return Outcome(rc, captured.out, captured.err, seconds)


def _limit() -> None:
    """In the child, before it runs: at most MEMORY bytes of address space."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _python(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` under the memory limit, importing this checkout's tfbuilder."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, preexec_fn=_limit, env=env
    )


def run_limited(args: list[str], *, cwd: Path, timeout: float = 120.0) -> Outcome:
    """``python -m tfbuilder ARGS`` in a subprocess limited to MEMORY bytes of address space."""
    start = _children_cpu()
    proc = _python(["-m", "tfbuilder", *args], cwd, timeout)
    return Outcome(proc.returncode, proc.stdout, proc.stderr, _children_cpu() - start)


# Runs each command of argv[1] (JSON) in turn in one process, each one's exit status and output in argv[2].
_MANY = r"""
import contextlib, io, json, sys, time
from tfbuilder.cli.commands import main
results = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    results.append([rc, out.getvalue(), err.getvalue(), time.process_time() - start])
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def run_limited_many(commands: list[list[str]], *, cwd: Path, timeout: float = 120.0) -> list[Outcome]:
    """Each of ``commands`` (``tfbuilder ARGS``) in turn, in one subprocess limited as
    :func:`run_limited` is (torch imported once, not once a case): a case that took gigabytes would
    end the process, and the cases after it with it (the process's output says which)."""
    results = cwd / ".limited-results.json"
    proc = _python(["-c", _MANY, json.dumps(commands), str(results)], cwd, timeout)
    assert results.exists(), f"the process ended before its last case (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
    outcomes = [Outcome(rc, out, err, seconds) for rc, out, err, seconds in json.loads(results.read_text())]
    results.unlink()
    return outcomes


def _children_cpu() -> float:
    """CPU seconds of the finished child processes of this process."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def assert_refused(outcome: Outcome, *expected: str, seconds: float = SECONDS) -> None:
    """Exit 2, every ``expected`` text in stderr, no traceback, within ``seconds`` of CPU time."""
    report = f"\nrc={outcome.rc} in {outcome.seconds:.1f} s of CPU time\n--- stderr ---\n{outcome.err}--- stdout ---\n{outcome.out}"
    assert outcome.rc == 2, report
    assert "Traceback" not in outcome.err and "Traceback" not in outcome.out, report
    for text in expected:
        assert text in outcome.err, f"expected {text!r}{report}"
    assert outcome.seconds < seconds, report
