"""``fit`` leaves the process as it found it: thread count, random generators, deterministic settings."""

from __future__ import annotations

import logging
import os
import random
import warnings

import numpy as np
import pytest
import torch

import tfbuilder
from conftest import QUICKSTART, short_run
from tfbuilder.train import trainer
from tfbuilder.torch_state import TorchState


def assert_same(before: TorchState, after: TorchState) -> None:
    assert after.threads == before.threads
    assert after.deterministic == before.deterministic
    assert after.cudnn_benchmark == before.cudnn_benchmark
    assert after.matmul_precision == before.matmul_precision
    assert torch.equal(after.cpu_rng, before.cpu_rng)
    assert after.python_rng == before.python_rng
    assert after.environment == before.environment


@pytest.fixture
def caller_threads():
    """The caller runs with a thread count no fit would choose here (3), and gets its own back."""
    own = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(own)


def test_fit_gives_back_threads_generators_and_deterministic_mode(tmp_path, caller_threads):
    random.seed(5)
    np.random.seed(5)
    before = TorchState.now()
    # trainer.threads=1 and deterministic=true: fit changes the thread count, the deterministic mode,
    # the seeds and Lightning's environment variables while it trains.
    overrides = short_run(tmp_path, "trainer.max_steps=2", "trainer.val_every=2", "trainer.threads=1", "trainer.deterministic=true")
    tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, overrides))
    assert_same(before, TorchState.now())
    assert torch.get_num_threads() == caller_threads and "PL_GLOBAL_SEED" not in os.environ
    assert np.array_equal(np.random.get_state(legacy=False)["state"]["key"], before.numpy_rng["state"]["key"])


def test_fit_gives_them_back_when_it_raises(tmp_path, caller_threads, monkeypatch):
    seen = {}

    def broken_trainer(*args, **kwargs):
        seen["threads"] = torch.get_num_threads()  # what the fit set before building its Trainer
        raise RuntimeError("no trainer today")

    monkeypatch.setattr(trainer, "new_trainer", broken_trainer)
    before = TorchState.now()
    with pytest.raises(RuntimeError, match="no trainer today"):
        tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, short_run(tmp_path, "trainer.max_steps=2", "trainer.threads=1")))
    assert seen["threads"] == 1
    assert_same(before, TorchState.now())


def test_fit_gives_back_the_whole_environment_logger_levels_and_warnings_filters(tmp_path, monkeypatch):
    """What a logger or callback sets during a fit (W&B sets its service's address) is gone after it,
    and what the caller had is back, changed or removed during the fit or not; the Lightning loggers
    fit quietens keep the caller's levels, and fit's warnings filters are not left behind."""
    quietened = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    monkeypatch.setattr(quietened, "level", logging.DEBUG)
    filters = list(warnings.filters)
    monkeypatch.setenv("CALLERS_OWN", "kept")
    monkeypatch.setenv("CALLERS_OTHER", "kept too")

    def on_step(step: int, max_steps: int) -> None:
        os.environ["SET_DURING_FIT"] = str(step)
        os.environ["CALLERS_OWN"] = "changed"
        os.environ.pop("CALLERS_OTHER", None)

    before = dict(os.environ)
    tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, short_run(tmp_path, "trainer.max_steps=2", "trainer.val_every=2")), on_step=on_step)
    assert dict(os.environ) == before
    assert quietened.level == logging.DEBUG and warnings.filters == filters
