"""Shared fixtures: paths, tiny recipes, deterministic seeds, and trained runs made once per test run."""

from __future__ import annotations

import copy
import dataclasses
import os
import socket
import tempfile
from pathlib import Path

import lightning.pytorch  # noqa: F401  (its import sets up its loggers: the baseline, not a test's doing)
import pytest
import torch

import state_guard
from tfbuilder import devices
from trained import TRAIN_ORDER, Trained, close_shared

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
# Multi30k lies beside the clone here and in CI; elsewhere point MULTI30K_DIR at a copy (docs/multi30k.md, "Data").
MULTI30K = Path(os.environ.get("MULTI30K_DIR", ROOT.parent / "shared" / "data" / "multi30k"))
# A small generated corpus with Multi30k's file names (tests/fixtures/make_multi30k.py), committed: what
# the tests that need Multi30k's files, not its content, read where the real data is absent.
MULTI30K_FIXTURE = ROOT / "tests" / "fixtures" / "multi30k"


def multi30k_or_fixture() -> tuple[Path, bool]:
    """Multi30k where it is here, else the generated stand-in; and whether it is the real data."""
    real = (MULTI30K / "train.de.gz").exists()
    return (MULTI30K, True) if real else (MULTI30K_FIXTURE, False)


def text_folder(folder: Path | str, *, parallel: bool = False) -> list[str]:
    """The overrides that make a shipped Multi30k recipe (which reads the Hub, bentrevett/multi30k) read
    a folder of text files in Multi30k's layout instead (``<stem>.<lang>[.gz]``), as docs/multi30k.md
    shows: no test needs the network."""
    langs = ["data.src_lang=de", "data.tgt_lang=en"] if parallel else ["data.lang=en"]
    return [
        "data.format=text",
        "data.hub=null",
        "data.columns=null",
        f"data.path={folder}",
        *langs,
        "data.splits.val=val",
        "data.splits.test=test_2016_flickr",
    ]

# The smallest model that still has every part: used wherever a test needs "some model".
TINY_MODEL = {
    "kind": "encoder_decoder",
    "vocab_size": 53,
    "d_model": 32,
    "dropout": 0.0,
    "attention": {"type": "multihead", "heads": 4},
    "ffn": {"type": "mlp", "hidden": 48},
    "encoder": {"layers": 2},
    "decoder": {"layers": 2},
}


QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
# The quick-start model at its smallest: one layer a side, width 32.
ONE_LAYER = ["model.d_model=32", "model.attention.heads=2", "model.ffn.hidden=32", "model.encoder.layers=1", "model.decoder.layers=1"]


def short_run(tmp_path, *overrides: str, train: int = 2000, val: int = 200, longest: int = 8) -> list[str]:
    """Overrides that make the quick-start recipe a short run writing under ``tmp_path``: ``train``
    and ``val`` examples of 1 to ``longest`` symbols, then ``overrides``."""
    return [
        f"trainer.output={tmp_path / 'runs'}",
        "trainer.progress=false",
        f"data.train_size={train}",
        f"data.val_size={val}",
        f"data.lengths=[1, {longest}]",
        *overrides,
    ]


# What would make a DDP run join another job: a fixed port or rank from the environment (torchrun, SLURM).
_DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "STANDALONE_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
                    "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def ddp_env(**extra: str) -> dict[str, str]:
    """The environment for a DDP run started by a test: this process's, less anything that would join
    another job, with a port of its own (one the kernel gave out just now, so two DDP tests running
    at once under pytest-xdist, or anything else listening, never share it)."""
    env = {k: v for k, v in os.environ.items() if k not in _DISTRIBUTED_ENV and not k.startswith("SLURM_")}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **extra}


def tiny_model(**changes) -> dict:
    """A copy of TINY_MODEL with ``changes`` applied (None removes a key)."""
    spec = copy.deepcopy(TINY_MODEL)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


def _guarded(where: str, before: state_guard.Snapshot, *, warnings_filters: bool = True) -> None:
    after = state_guard.Snapshot.now()
    if not warnings_filters:
        after = dataclasses.replace(after, warnings_filters=before.warnings_filters)
    message = state_guard.report(where, before, after)
    if message is not None:
        before.restore()  # the next test starts from the state this one found
        pytest.fail(message, pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _module_state_guard(request):
    """A test module's own module-scoped fixtures give back what they changed (state_guard.py)."""
    before = state_guard.Snapshot.now()
    yield
    # Not the warnings filters: pytest sets them around each phase of each test (a test's
    # filterwarnings marks included) and puts them back after it, so a module fixture set up in the
    # first test's setup sees that test's filters, and cannot leave its own behind. The per-test guard
    # checks them.
    _guarded(f"{request.node.nodeid} (its module-scoped fixtures)", before, warnings_filters=False)


@pytest.fixture(autouse=True)
def _state_guard(request):
    """Each test gives back the process-global state it changed (state_guard.py); the first
    function-scoped fixture, so its check runs after every other fixture's teardown."""
    before = state_guard.Snapshot.now()
    yield
    _guarded(request.node.nodeid, before)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# The real measurement, for the tests of it (the fixture below replaces it during a test run).
MEASURE_BUSY_CORES = devices.busy_cores


@pytest.fixture(scope="session", autouse=True)
def _one_training_thread():
    """``trainer.threads: auto`` gives one thread to every run trained in the test process, as if
    all cores but one were busy (the shared trained runs and subprocesses use the others): a model
    trained in a test is the same whatever the machine's load, and no fit spends 0.25 s measuring it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(devices, "busy_cores", lambda seconds=0.25, **_: float(devices.usable_cores() - 1))
        yield


_trained: list[Trained] = []
# Under pytest-xdist: the folder the workers share the trained runs in (made by the controller).
_shared: Path | None = None


def pytest_configure(config):
    """An xdist worker takes the shared folder from the controller, and its share of the cores for torch."""
    global _shared
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    if "tfbuilder_trained" in workerinput:
        _shared = Path(workerinput["tfbuilder_trained"])
    # N workers on N cores: one torch thread each, not N each fighting for the same cores.
    torch.set_num_threads(max(1, devices.usable_cores() // int(workerinput["workercount"])))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core this process may run on (as ``trainer.threads: auto`` counts
    them), hyper-threads included, with or without psutil; PYTEST_XDIST_AUTO_NUM_WORKERS still wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return devices.usable_cores()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """The xdist controller gives every worker the same folder for the trained runs (trained.py)."""
    config = node.config
    if not hasattr(config, "_tfbuilder_trained"):
        config._tfbuilder_trained = Path(tempfile.mkdtemp(prefix="tfbuilder-trained-"))
    node.workerinput["tfbuilder_trained"] = str(config._tfbuilder_trained)


def _needs(item: pytest.Item) -> list[str]:
    return [name for name in TRAIN_ORDER if name in getattr(item, "fixturenames", ())]


@pytest.fixture(scope="session")
def quickstart_run() -> Path:
    """The run directory of recipes/quickstart.yaml trained as shipped (trained.py). A test that
    writes into a run directory copies it first."""
    return _wait_for("quickstart_run")


def _wait_for(name: str) -> Path:
    trainer = next((t for t in _trained if name in t.names), None)
    if trainer is None:  # e.g. requested through getfixturevalue, unseen at collection
        trainer = Trained([name], _shared)
        _trained.append(trainer)
    return trainer.run_dir(name)


def pytest_sessionfinish(session, exitstatus):
    while _trained:
        _trained.pop().close()
    if hasattr(session.config, "_tfbuilder_trained"):  # the xdist controller, once every worker is done
        close_shared(session.config._tfbuilder_trained)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run wherever CUDA is present; elsewhere they are reported as skipped.
    Modules whose tests need a shared trained run go last (in TRAIN_ORDER), and training starts now."""
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    needed = {name for item in items for name in _needs(item)}
    if not needed or config.option.collectonly:
        return
    # Whole modules move, so that their module-scoped fixtures are still made once.
    rank = {}
    for item in items:
        for name in _needs(item):
            rank[item.module] = max(rank.get(item.module, 0), 1 + TRAIN_ORDER.index(name))
    items.sort(key=lambda item: rank.get(getattr(item, "module", None), 0))
    _trained.append(Trained([name for name in TRAIN_ORDER if name in needed], _shared))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The shuffle's seed on the last lines, where `-q` still shows it: the order a failure came in
    is repeated with `--randomly-seed=N` (pytest-randomly's own header line is hidden by `-q`)."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"test order shuffled with --randomly-seed={seed} (add it to the command to repeat it)")
