"""How many tfbuilder source files a recipe passes through in ``fit`` before the Lightning Trainer is built.

Calls :func:`tfbuilder.fit` on ``recipes/quickstart.yaml`` made tiny (one step, a few hundred examples, output in
a temporary folder), records with :func:`sys.setprofile` every function call from the start of ``fit`` until
``lightning.pytorch.Trainer.__init__`` is first called (``--nth 2``: the second time), and prints the distinct
``tfbuilder/`` files entered, in order, and their count. Module bodies run by an import (``fit`` imports Lightning
late), and what they call, are left out: only the calls of the fit itself count.

    python benchmarks/fit_path.py
    python benchmarks/fit_path.py --nth 2      # up to the Trainer that trains (the first one only probes)
"""

from __future__ import annotations

import argparse
import inspect
import shlex
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import lightning.pytorch as pl  # noqa: E402 (after the path is set)

import tfbuilder  # noqa: E402 (after the path is set)

PACKAGE = ROOT / "tfbuilder"
OVERRIDES = ("trainer.max_steps=1", "trainer.progress=false", "data.train_size=200", "data.val_size=20")


class Reached(BaseException):
    """Raised from the profiler when the Trainer is built: the fit has nothing more to show (a BaseException, so
    that no ``except Exception`` on the way turns it into an error message)."""


def files_until_trainer(overrides: list[str], nth: int) -> list[str]:
    """The ``tfbuilder/`` files (relative to the repository) that ``fit`` enters until the ``nth`` Trainer."""
    trainer_init = inspect.unwrap(pl.Trainer.__init__).__code__
    seen: dict[str, str] = {}  # file -> the step of the fit that first entered it
    importing: list[FrameType] = []  # module bodies being run by an import, and what they call, are left out
    built = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal built
        if event == "return" and importing and frame is importing[-1]:
            importing.pop()
        if event != "call":
            return
        code = frame.f_code
        if code.co_name == "<module>":
            importing.append(frame)
        if importing:
            return
        if code is trainer_init:
            built += 1
            if built == nth:
                raise Reached
            return
        path = Path(code.co_filename)
        if path.is_relative_to(PACKAGE) and str(path.relative_to(ROOT)) not in seen:
            seen[str(path.relative_to(ROOT))] = _step(frame, seen)

    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "quickstart.yaml", overrides)
    sys.setprofile(profile)
    try:
        tfbuilder.fit(recipe)
    except Reached:
        pass
    finally:
        sys.setprofile(None)
    if built < nth:
        raise SystemExit(f"fit returned before Trainer.__init__ was called {nth} time(s)")
    return [f"{name}  ({step})" if step else name for name, step in seen.items()]


def _step(frame: FrameType, seen: dict[str, str]) -> str:
    """The call of the orchestrating module (the second file entered: the one ``tfbuilder.fit`` calls) that
    ``frame`` runs under, e.g. ``preflight.check_run``; empty for the orchestrator's own frames."""
    files = list(seen)
    if len(files) < 2:
        return ""
    orchestrator = str(ROOT / files[1])
    here: FrameType | None = frame
    outermost: FrameType | None = None  # the tfbuilder frame nearest the orchestrator's
    while here is not None and here.f_code.co_filename != orchestrator:
        if Path(here.f_code.co_filename).is_relative_to(PACKAGE):
            outermost = here
        here = here.f_back
    if here is None or outermost is None:
        return ""
    module = Path(outermost.f_code.co_filename).stem
    return f"under {module}.{outermost.f_code.co_qualname}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nth", type=int, default=1, help="stop at the nth Trainer.__init__ (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [*OVERRIDES, f"trainer.output={tmp}"]
        files = files_until_trainer(overrides, args.nth)
    print("command: python " + shlex.join(["benchmarks/fit_path.py", *sys.argv[1:]]))
    print(f"overrides: {' '.join(OVERRIDES)} trainer.output=<temporary folder>")
    for i, name in enumerate(files, 1):
        print(f"{i:3d}  {name}")
    steps = Counter(name.partition("(under ")[2].rstrip(")") or "the orchestrator itself" for name in files)
    print("by step: " + "; ".join(f"{step}: {n}" for step, n in steps.most_common()))
    print(f"{len(files)} tfbuilder files entered before Trainer.__init__ (call {args.nth})")


if __name__ == "__main__":
    main()
