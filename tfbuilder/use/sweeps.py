"""Sweeps: several recipes, each over the same seeds, run into one directory and compared (no Lightning here).

    <sweep dir>/
        sweep.json                     what was asked: recipes, seeds, overrides (the order of the report)
        runs/<recipe name>/seed-<k>/   an ordinary run directory (recipe.yaml, checkpoints/, summary.json, ...)
        report.md, report.csv, runs.csv, curves.png

A run is *finished* when its ``summary.json`` exists (and, for translation, its validation scores);
running the same sweep again skips finished runs, resumes a run from its last checkpoint, and
starts over a run that never reached one. A run directory trained from a different recipe is never
reused: the sweep stops and says which keys differ.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tfbuilder import atomic
from tfbuilder.data.location import locate
from tfbuilder.errors import TfbuilderError
from tfbuilder.runs.checkpoints import default_checkpoint, is_empty, load_checkpoint
from tfbuilder.runs.checkpoints import scores_file as checkpoint_scores
from tfbuilder.spec.diffing import MISSING, differences
from tfbuilder.spec.recipe import Recipe, load_recipe, recipe_from_dict
from tfbuilder.train import fit as fitting
from tfbuilder.use.evaluation import evaluate, save_scores

Status = Literal["finished", "evaluate", "resume", "new"]
# Keys that say where and how a run is shown, not what it trains: they may differ between invocations.
_PRESENTATION = ("trainer.output", "trainer.progress")


class SweepError(TfbuilderError):
    """A sweep cannot run as asked (duplicate names, a run directory holding another recipe)."""


@dataclass
class Run:
    recipe: Recipe
    seed: int
    dir: Path
    status: Status = "new"


@dataclass
class Sweep:
    dir: Path
    runs: list[Run]
    bleu_beam: int | None  # validation BLEU with this beam after training (sequence-to-sequence), or None
    command: str = ""
    names: list[str] = field(default_factory=list)  # recipe names in the order asked


def default_dir(paths: Sequence[str | Path], output: str) -> Path:
    """``<output>/sweeps/<name>``: the recipes' common directory name (``table3``), else ``sweep``."""
    parents = {Path(p).resolve().parent for p in paths}
    name = next(iter(parents)).name if len(parents) == 1 else "sweep"
    return Path(output) / "sweeps" / name


def plan(
    paths: Sequence[str | Path],
    *,
    seeds: int = 1,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    bleu_beam: int | None = 4,
    command: str = "",
) -> Sweep:
    """Load every recipe (all problems reported together by the caller) and decide each run's status."""
    if seeds < 1:
        raise SweepError("--seeds must be at least 1")
    recipes = [load_recipe(p, overrides=list(overrides)) for p in dict.fromkeys(str(p) for p in paths)]
    names = [r.name for r in recipes]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SweepError(f"recipes share a name ({', '.join(repeated)}): each run directory is named after its recipe")
    sweep_dir = Path(out) if out is not None else default_dir(paths, recipes[0].trainer.output)
    runs = []
    for recipe in recipes:
        if recipe.data is not None:
            locate(recipe.data)  # each seed's recipe is a copy: the folder is settled before it is made
        for seed in range(seeds):
            seeded = recipe_from_dict(recipe.to_dict(), [f"trainer.seed={seed}", "trainer.progress=false"])
            run = Run(seeded, seed, sweep_dir / "runs" / recipe.name / f"seed-{seed}")
            run.status = status(run, bleu_beam)
            runs.append(run)
    return Sweep(sweep_dir, runs, bleu_beam if _translates(recipes[0]) else None, command, names)


def check_own(sweep_dir: Path) -> None:
    """Refuse a sweep directory that is a file, or a non-empty folder without ``sweep.json``: the
    reports a sweep writes would replace files it did not make."""
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise SweepError(f"sweep directory {sweep_dir} is a file, not a directory")
    if not sweep_dir.is_dir():
        return
    plan_file = sweep_dir / "sweep.json"
    if os.path.lexists(plan_file):
        if not _is_plan(plan_file):
            raise SweepError(
                f"{plan_file} is not a sweep plan that tfbuilder wrote: not writing into {sweep_dir}; "
                "choose another --out (a new or empty directory, or an earlier sweep's)"
            )
        return
    try:
        empty = is_empty(sweep_dir)
    except OSError as exc:
        raise SweepError(f"cannot read sweep directory {sweep_dir}: {exc.strerror or exc}") from None
    if not empty:
        raise SweepError(
            f"{sweep_dir} is not empty and is not a sweep directory (no sweep.json): not writing into it; "
            "choose another --out (a new or empty directory, or an earlier sweep's)"
        )


PLAN_KEYS = ("command", "recipes", "seeds", "bleu_beam", "runs")  # what write_plan records


def _is_plan(path: Path) -> bool:
    """Whether ``path`` is a plain file holding what :func:`write_plan` writes (its keys, the recipes
    and runs as lists of names, the seeds as numbers): only then are the reports beside it a sweep's."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode) or path.stat().st_size > 1 << 24:
            return False
        record = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(record, dict) or set(record) != set(PLAN_KEYS):
        return False
    recipes, runs, seeds = record["recipes"], record["runs"], record["seeds"]
    if not all(isinstance(x, list) for x in (recipes, runs, seeds)):
        return False
    return all(isinstance(x, str) for x in recipes + runs) and all(type(x) is int for x in seeds)


def _translates(recipe: Recipe) -> bool:
    return recipe.model.kind == "encoder_decoder"


def scores_file(run_dir: Path, beam: int) -> Path:
    """The validation scores a sweep computes for a run (the file ``tfbuilder test --split val`` writes)."""
    return checkpoint_scores(run_dir, "val", default_checkpoint(run_dir).stem, beam=beam)


def status(run: Run, bleu_beam: int | None) -> Status:
    """What running ``run`` again has to do; raises :class:`SweepError` if its directory holds another recipe."""
    saved = run.dir / "recipe.yaml"
    if saved.exists():
        before = load_recipe(saved)  # bounded like any recipe file: a damaged one is reported by its place
        changed = [d for d in differences(before, run.recipe, include_name=True) if d[0] not in _PRESENTATION]
        if changed:
            shown = ", ".join(f"{k} ({_shown(a)} -> {_shown(b)})" for k, a, b in changed[:5])
            raise SweepError(
                f"{run.dir} was trained from a different recipe ({shown}{', ...' if len(changed) > 5 else ''}); "
                "give the sweep another --out, or move that directory away"
            )
    if (run.dir / "summary.json").exists():
        needs_scores = (
            bleu_beam is not None and _translates(run.recipe) and not scores_file(run.dir, bleu_beam).exists()
        )
        return "evaluate" if needs_scores else "finished"
    if (run.dir / "checkpoints" / "last.ckpt").exists():
        return "resume"
    return "new"


def _shown(value) -> str:
    return "-" if value is MISSING else str(value)


def write_plan(sweep: Sweep) -> None:
    """``sweep.json``: the recipes (in order), seeds and run directories, for ``compare`` and humans."""

    try:
        sweep.dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SweepError(f"cannot create sweep directory {sweep.dir}: {exc.strerror or exc}") from None
    record = {  # PLAN_KEYS
        "command": sweep.command,
        "recipes": sweep.names,
        "seeds": sorted({r.seed for r in sweep.runs}),
        "bleu_beam": sweep.bleu_beam,
        "runs": [str(r.dir.relative_to(sweep.dir)) for r in sweep.runs],
    }
    atomic.write_text(sweep.dir / "sweep.json", json.dumps(record, indent=2), what="sweep plan")


def execute(
    run: Run,
    *,
    bleu_beam: int | None,
    on_step: Callable[[int, int], None] | None = None,
) -> None:
    """Train (or resume) ``run`` and score its best checkpoint on the validation split."""

    if run.status == "new":
        # A run that started before but stopped ahead of its first checkpoint starts over, holding the
        # run's lock; what each attempt logged is kept (metrics.interrupted-<n>.csv).
        fitting.fit(run.recipe, run_dir=run.dir, restart=True, on_step=on_step)
    elif run.status == "resume":
        fitting.fit(run.recipe, resume=run.dir, on_step=on_step)
    if bleu_beam is not None and _translates(run.recipe) and not scores_file(run.dir, bleu_beam).exists():
        loaded = load_checkpoint(run.dir)  # the checkpoint every command scores
        save_scores(loaded, evaluate(loaded, "val", beam=bleu_beam))
    run.status = "finished"
