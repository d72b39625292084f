"""Metrics loggers: metrics.csv always, TensorBoard, W&B (offline) and MLflow (a local file store) beside it."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

import pytest

import tfbuilder
from conftest import ONE_LAYER, QUICKSTART, short_run
from tfbuilder.train import loggers
from tfbuilder.cli.commands import main
from tfbuilder.train.fit import fit


def wandb_records(run_file: Path):
    """The records of an offline W&B run file (LevelDB's log format: 32 KiB blocks of records with a
    7-byte header each, after W&B's own 7-byte file header), as protobuf messages."""
    from wandb.proto import wandb_internal_pb2

    raw = run_file.read_bytes()
    assert raw[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # a block's zero-filled tail
            pos += left
            continue
        pending += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_logged(run_file: Path) -> tuple[set[str], dict[str, str]]:
    """The metric names a W&B run received, and its config."""
    metrics, config = set(), {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            metrics |= {item.key or "/".join(item.nested_key) for item in record.history.item}
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return metrics, config


def test_every_logger_receives_the_metrics_and_metrics_csv_stays(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: the run is written to a local file
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    for quiet in ("WANDB_X_DISABLE_STATS", "WANDB_X_DISABLE_MACHINE_INFO", "WANDB_DISABLE_GIT"):
        monkeypatch.setenv(quiet, "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    (tmp_path / "wandb").mkdir()
    # trainer.logger: tensorboard is the older spelling, still honoured beside trainer.loggers.
    overrides = ["trainer.max_steps=2", "trainer.val_every=2", "trainer.log_every=1", "trainer.logger=tensorboard", "trainer.loggers=[wandb, mlflow]"]
    summary = fit(tfbuilder.load_recipe(QUICKSTART, ONE_LAYER + short_run(tmp_path, *overrides, train=64, val=8)))
    run_dir = Path(summary.run_dir)

    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    val_steps = [int(r["step"]) for r in rows if r.get("val_loss")]
    assert val_steps == [2] and any(r.get("train_loss") for r in rows)  # the step the console names
    # TensorBoard, beside metrics.csv: read back with TensorBoard's own reader, at metrics.csv's steps.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir)).Reload()
    assert [e.step for e in events.Scalars("val_loss")] == val_steps and "train_loss" in events.Tags()["scalars"]

    record = {entry["logger"]: entry for entry in json.loads((run_dir / "loggers.json").read_text())}
    (run_file,) = (tmp_path / "wandb").rglob(f"run-{record['WandbLogger']['id']}.wandb")
    metrics, config = wandb_logged(run_file)
    assert {"train_loss", "val_loss", "val_acc"} <= metrics
    assert config["model.d_model"] == 32 and config["run_dir"] == str(run_dir.resolve())

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    run = client.get_run(record["MLFlowLogger"]["run_id"])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == val_steps
    assert run.data.params["model.d_model"] == "32" and run.data.tags["tfbuilder.run_dir"] == str(run_dir.resolve())


def test_logger_names_are_checked_with_a_suggestion(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nextends: {QUICKSTART}\ntrainer:\n  loggers: [csv, mlfow]\n")
    assert main(["validate", str(recipe)]) == 2
    assert "r.yaml:4:18: trainer.loggers[1]: unknown logger; did you mean 'mlflow'?" in capsys.readouterr().err


def test_a_missing_logger_package_names_the_extra_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loggers, "installed", lambda module: module != "wandb")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nextends: {QUICKSTART}\ntrainer:\n  loggers: [wandb]\n  output: {tmp_path / 'runs'}\n")
    assert main(["validate", str(recipe)]) == 2
    expected = "trainer.loggers[0]: the wandb logger needs the wandb package: pip install 'tfbuilder[wandb]'"
    assert expected in capsys.readouterr().err
    assert main(["fit", str(recipe)]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_chosen_loggers_keep_csv_first_and_each_once():
    trainer = tfbuilder.spec.recipe.Recipe.model_fields["trainer"].annotation
    assert loggers.chosen(trainer(loggers=["mlflow", "csv"], logger="tensorboard")) == ["csv", "mlflow", "tensorboard"]
    with pytest.raises(ValueError, match="names mlflow twice"):
        trainer(loggers=["mlflow", "mlflow"])


@pytest.mark.parametrize(
    "uri,database,file_store,message",
    [
        ("sqlite:///{tmp}/nowhere/mlflow.db", True, True, "the folder {tmp}/nowhere of the SQLite tracking database"),
        ("sqlite:///{tmp}/mlflow.db", False, True, "is a database, which needs MLflow's database store (SQLAlchemy"),
        ("postgresql+psycopg2://host/db", False, True, "is a database, which needs MLflow's database store"),
        ("sqlite:///{tmp}/folder", True, True, "the SQLite tracking database sqlite:///{tmp}/folder cannot be written"),
        ("sqlite:///{tmp}/mlflow.db", True, True, None),
        ("sqlite:///:memory:", True, True, None),
        ("file:{tmp}/file/mlruns", True, True, "the MLflow file store {tmp}/file/mlruns cannot be made: {tmp}/file is not"),
        ("file://{tmp}/new/mlruns", True, True, None),
        ("{tmp}/new/mlruns", True, False, "keeps a file store ({tmp}/new/mlruns) only with MLFLOW_ALLOW_FILE_STORE=true"),
        ("http://localhost:5000", False, False, None),
        ("databricks", False, False, None),
    ],
)
def test_a_local_mlflow_store_is_checked_without_starting_mlflow(tmp_path, uri, database, file_store, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    why = loggers.tracking_problem(uri.format(tmp=tmp_path), database=database, file_store=file_store)
    assert why == message if message is None else message.format(tmp=tmp_path) in why, why


def test_an_mlflow_store_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    """The SQLite database the docs suggest, in a folder that is not there: validate refuses it, and fit
    before it creates a run directory (not a traceback from inside MLflow, after it)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'nowhere' / 'mlflow.db'}")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nextends: {QUICKSTART}\ntrainer:\n  loggers: [mlflow]\n  output: {tmp_path / 'runs'}\n")
    expected = f"r.yaml:4:13: trainer.loggers[0]: the folder {tmp_path / 'nowhere'} of the SQLite tracking database"
    assert main(["validate", str(recipe)]) == 2
    assert expected in capsys.readouterr().err
    assert main(["fit", str(recipe)]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_logger_that_cannot_be_made_is_an_error_not_a_traceback(tmp_path, monkeypatch):
    def refuse(name, recipe, run_dir):
        raise RuntimeError("unsupported URI 'x'\nsee the docs")

    monkeypatch.setattr(loggers, "_make", refuse)
    recipe = tfbuilder.load_recipe(QUICKSTART, ["trainer.loggers=[mlflow]"])
    with pytest.raises(tfbuilder.errors.TfbuilderError, match=r"^trainer.loggers: the mlflow logger could not start: unsupported URI 'x'$"):
        loggers.build(recipe, tmp_path)


def test_a_tracker_that_will_not_start_leaves_no_half_made_run(tmp_path, monkeypatch, capsys):
    """What the pre-flight cannot tell (a server that refuses) stops fit with exit 2 after the run
    directory is set up: the recipe and vocabulary it wrote there go, and the folder with them."""

    def refuse(name, recipe, run_dir):
        raise RuntimeError("connection refused")

    monkeypatch.setattr(loggers, "_make", refuse)
    monkeypatch.setattr(loggers, "unusable", lambda name: None)
    args = ["fit", str(QUICKSTART), *sum((["--set", o] for o in [*ONE_LAYER, *short_run(tmp_path, "trainer.loggers=[mlflow]", train=20, val=5)]), [])]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "trainer.loggers: the mlflow logger could not start: connection refused" in err and "Traceback" not in err
    assert list((tmp_path / "runs").rglob("*")) == [tmp_path / "runs" / "quickstart"]  # no version_0
