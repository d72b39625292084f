"""Where a run's metrics go: ``metrics.csv`` always, and any of TensorBoard, Weights & Biases and MLflow
beside it (Lightning's own loggers), named in ``trainer.loggers``.

``metrics.csv`` is written whatever else is chosen: ``tfbuilder report``, ``compare`` and sweeps read
it. Each extra logger is given the resolved recipe as hyperparameters (dotted keys), and the run
directory; where each one wrote (a W&B run's address, an MLflow run id) is recorded in the run
directory's ``loggers.json``. A logger whose package is missing is a recipe problem found by
``validate`` and before ``fit`` creates anything, naming the extra to install.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from tfbuilder.atomic import write_text
from tfbuilder.errors import TfbuilderError
from tfbuilder.spec.sections import LOGGER_NAMES
from tfbuilder.train.metrics_log import MetricsCSV

if TYPE_CHECKING:  # annotations only: validating a recipe needs no Lightning
    from lightning.pytorch.loggers.logger import Logger

    from tfbuilder.errors import Problem
    from tfbuilder.spec.recipe import Recipe
    from tfbuilder.spec.sections import TrainerSection

NAMES = LOGGER_NAMES
"""What ``trainer.loggers`` may name (the schema's list, :data:`tfbuilder.spec.sections.LOGGER_NAMES`)."""
# name -> (the module it imports, what to install)
PACKAGES = {
    "tensorboard": ("tensorboard", "pip install 'tfbuilder[tensorboard]'"),
    "wandb": ("wandb", "pip install 'tfbuilder[wandb]'"),
    "mlflow": ("mlflow", "pip install 'tfbuilder[mlflow]'"),
}
RECORD = "loggers.json"
LIGHTNING_MLFLOW_DEFAULT = "file:./mlruns"  # Lightning's MLFlowLogger without a tracking URI
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # the tracking URI schemes of MLflow's database store
SERVER_NAMES = ("databricks", "databricks-uc", "uc")  # tracking URIs without a scheme that are not folders
WANDB_PROJECT = "tfbuilder"  # unless WANDB_PROJECT says otherwise


def chosen(trainer: TrainerSection) -> list[str]:
    """The loggers a run writes to, in order, each once: ``csv`` first, then ``trainer.loggers``, then
    the older single ``trainer.logger`` (``tensorboard``)."""
    return list(dict.fromkeys(["csv", *trainer.loggers, trainer.logger]))


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def missing(name: str) -> str | None:
    """Why logger ``name`` cannot run here (its package is not installed), or None."""
    if name not in PACKAGES:
        return None
    module, install = PACKAGES[name]
    if name == "tensorboard" and installed("tensorboardX"):  # Lightning writes with either
        return None
    return None if installed(module) else f"the {name} logger needs the {module} package: {install}"


def unusable(name: str) -> str | None:
    """Why logger ``name`` cannot run here (its package is missing; MLflow: its tracking store cannot be
    written), or None."""
    return missing(name) or (mlflow_problem() if name == "mlflow" else None)


def mlflow_problem() -> str | None:
    """Why MLflow could not start a run at the tracking URI the run's logger would use (MLFLOW_TRACKING_URI,
    else Lightning's default ``file:./mlruns``), where that can be told without starting one
    (:func:`tracking_problem`). Not ``mlflow.get_tracking_uri()``: an earlier run in the same process sets
    MLflow's process-wide URI, which the next run's logger does not use."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or LIGHTNING_MLFLOW_DEFAULT
    try:
        import mlflow  # noqa: F401  # deferred: only a recipe that logs to MLflow pays for importing it
        from mlflow import environment_variables
    except Exception as exc:  # noqa: BLE001 (a broken install or setting: what stops it here stops fit too)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return f"the mlflow logger cannot start: {first}"
    allow = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)  # MLflow 3: file stores need opting in
    return tracking_problem(uri, database=installed("sqlalchemy"), file_store=allow is None or bool(allow.get()))


def tracking_problem(uri: str, *, database: bool, file_store: bool = True) -> str | None:
    """Why MLflow could not write to the local tracking store ``uri``: a SQLite file (``sqlite:///path``)
    whose folder is missing or read-only, or which needs MLflow's database store (``database``: SQLAlchemy
    is installed; mlflow-skinny has none); a file store (``file:path`` or a bare path) that cannot be
    made, or (``file_store`` false) that MLflow refuses. Servers are not contacted: None for them."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme == "sqlite" and uri.startswith("sqlite:///"):
        name = unquote(uri.split("?", 1)[0].removeprefix("sqlite:///"))
        path = Path(name)
        if name != ":memory:" and not path.parent.is_dir():
            return f"the folder {path.parent} of the SQLite tracking database {uri} does not exist"
        if name != ":memory:" and (
            not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not _writable_file(path))
        ):
            return f"the SQLite tracking database {uri} cannot be written here"
    if scheme.split("+")[0] in DATABASES:
        if not database:  # MLflow registers its database stores only where SQLAlchemy is installed
            return (
                f"the tracking URI {uri} is a database, which needs MLflow's database store (SQLAlchemy; "
                "mlflow-skinny has none): pip install mlflow, or set MLFLOW_TRACKING_URI to a server"
            )
        return None
    local = scheme == "file" or (scheme == "" and uri not in SERVER_NAMES) or (len(scheme) == 1 and os.name == "nt")
    if not local:  # a server (a drive letter is a path)
        return None
    folder = Path(unquote(urlsplit(uri).path)) if scheme == "file" else Path(uri)
    existing = next((p for p in (folder, *folder.absolute().parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"the MLflow file store {folder} cannot be made: {existing} is not a folder that can be written"
    if not file_store:
        return f"this MLflow keeps a file store ({uri}) only with MLFLOW_ALLOW_FILE_STORE=true"
    return None


def _writable_file(path: Path) -> bool:
    return path.is_file() and os.access(path, os.R_OK | os.W_OK)


def check(recipe: Recipe) -> list[Problem]:
    """A problem at ``trainer.loggers[i]`` (or ``trainer.logger``) for each logger that cannot run here."""
    problems = []
    for i, name in enumerate(recipe.trainer.loggers):
        why = unusable(name)
        if why:
            problems.append(recipe.problem(("trainer", "loggers", i), why))
    if recipe.trainer.logger not in recipe.trainer.loggers:
        why = unusable(recipe.trainer.logger)
        if why:
            problems.append(recipe.problem(("trainer", "logger"), why))
    return problems


def build(recipe: Recipe, run_dir: Path) -> list[Logger]:
    """Lightning loggers for a run in ``run_dir``: :class:`~tfbuilder.train.metrics_log.MetricsCSV` first
    (``trainer.log_dir`` is the run directory), then the others ``trainer.loggers`` names."""

    out: list[Logger] = [MetricsCSV(run_dir)]
    for name in chosen(recipe.trainer)[1:]:
        why = missing(name)
        if why:
            raise TfbuilderError(f"trainer.loggers: {why}")
        try:
            out.append(_make(name, recipe, run_dir))
        except Exception as exc:  # noqa: BLE001 (trackers raise their own kinds: a refused URI, a missing store)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise TfbuilderError(f"trainer.loggers: the {name} logger could not start: {first}") from None
    return out


def _make(name: str, recipe: Recipe, run_dir: Path) -> Logger:
    run_name = f"{recipe.name}/{run_dir.name}"
    if name == "tensorboard":  # beside metrics.csv, where `tensorboard --logdir <output>` finds it
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(
            save_dir=str(run_dir.parent.parent), name=run_dir.parent.name, version=run_dir.name, default_hp_metric=False
        )
    if name == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        # W&B keeps its local files in the run directory (or WANDB_DIR); WANDB_MODE=offline and WANDB_PROJECT apply.
        return WandbLogger(
            name=run_name,
            save_dir=os.environ.get("WANDB_DIR") or str(run_dir),
            project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT),
        )
    from lightning.pytorch.loggers import MLFlowLogger

    # MLFLOW_TRACKING_URI says where (a server, sqlite:///<file>, or file:<folder>); unset: MLflow's default.
    return MLFlowLogger(
        experiment_name=recipe.name,
        run_name=run_name,
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"),
        tags={"tfbuilder.run_dir": str(run_dir.resolve())},
    )


def hyperparameters(recipe: Recipe, run_dir: Path) -> dict[str, Any]:
    """The resolved recipe as flat dotted keys (``model.d_model``), with the run directory: what
    trackers show and filter on. Lists become their YAML-like text."""
    flat: dict[str, Any] = {"run_dir": str(run_dir.resolve())}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            flat[prefix] = value if isinstance(value, (str, int, float, bool)) or value is None else json.dumps(value)

    walk("", recipe.to_dict())
    return flat


def where(logger: Logger) -> dict[str, Any] | None:
    """Where one logger wrote, for ``loggers.json``: the W&B run's id and address, the MLflow run's id
    and tracking URI, the TensorBoard folder; None for metrics.csv and for loggers given in Python
    that say nothing of it."""
    # deferred: start-up time (validating a recipe imports this module, and needs no Lightning)
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    if isinstance(logger, MetricsCSV):
        return None
    record: dict[str, Any] = {"logger": type(logger).__name__}
    if isinstance(logger, WandbLogger):
        run = logger.experiment  # a wandb Run; wandb ships no types, and a disabled run lacks some fields
        record.update(
            id=getattr(run, "id", None),
            url=getattr(run, "url", None),
            project=getattr(run, "project", None),
            dir=getattr(run, "dir", None),
            offline=bool(getattr(getattr(run, "settings", None), "_offline", False)),
        )
    elif isinstance(logger, MLFlowLogger):
        record.update(run_id=logger.run_id, experiment_id=logger.experiment_id, tracking_uri=logger._tracking_uri)
    else:
        record.update(log_dir=logger.log_dir)
    return record


def start(loggers: list[Logger], recipe: Recipe, run_dir: Path) -> None:
    """Give every logger but metrics.csv the resolved recipe (which starts its run: a tracker that
    cannot start is an error naming it, before training), then record where each wrote."""

    params = hyperparameters(recipe, run_dir)
    for logger in loggers[1:]:
        try:
            logger.log_hyperparams(params)
        except Exception as exc:  # noqa: BLE001 (trackers raise their own kinds: a refused URI, no server)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise TfbuilderError(f"trainer.loggers: the {type(logger).__name__} could not start: {first}") from None
    record(run_dir, loggers)


def finish(loggers: list[Logger]) -> None:
    """End the tracker runs tfbuilder started (a W&B run stays open until its process exits, and the
    next ``fit`` in the same process would write into it)."""
    from lightning.pytorch.loggers import WandbLogger  # deferred: start-up time (as in where)

    for logger in loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:  # started: end it
            logger.experiment.finish()


def record(run_dir: Path, loggers: Iterable[Logger]) -> None:
    """Write ``<run_dir>/loggers.json``: where every logger but metrics.csv wrote (nothing when none did)."""

    entries = [entry for entry in map(where, loggers) if entry is not None]
    if entries:
        write_text(run_dir / RECORD, json.dumps(entries, indent=2, default=str) + "\n", what="logger record")


__all__ = [
    "NAMES",
    "build",
    "check",
    "chosen",
    "hyperparameters",
    "finish",
    "missing",
    "record",
    "start",
    "tracking_problem",
    "unusable",
]
