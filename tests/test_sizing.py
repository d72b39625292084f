"""The pre-flight's memory check counts what one process must hold: a whole replica under DDP (per
GPU, and per process on a CPU machine), one shard of the copy under FSDP."""

from __future__ import annotations

import pytest

import tfbuilder
from conftest import QUICKSTART
from tfbuilder.model import sizing


def _need(recipe) -> int:
    parameters = sizing.count_parameters(recipe)
    return parameters * sizing.BYTES_PER_PARAMETER[recipe.trainer.precision] + sizing.count_buffers(recipe) * 4


@pytest.mark.parametrize(
    "overrides, ram_over_need, refused",
    [
        ([], 0.6, True),  # one process: it must hold the whole model
        ([], 1.2, False),
        (["trainer.num_nodes=2"], 0.6, True),  # DDP over two machines: each holds a replica (was: summed)
        (["trainer.num_nodes=2", "trainer.strategy=fsdp"], 0.6, False),  # sharded over the two
        (["trainer.devices=2", "trainer.accelerator=cpu"], 1.2, True),  # two processes on one machine: two replicas
        (["trainer.devices=2", "trainer.accelerator=cpu"], 2.4, False),
    ],
)
def test_memory_is_checked_per_replica(overrides, ram_over_need, refused, monkeypatch):
    recipe = tfbuilder.load_recipe(QUICKSTART, ["trainer.accelerator=cpu", *overrides])
    page = 4096
    pages = int(_need(recipe) * ram_over_need) // page
    monkeypatch.setattr(sizing.os, "sysconf", lambda name: {"SC_PAGE_SIZE": page, "SC_PHYS_PAGES": pages}[name])
    problems = sizing.check_size(recipe, sizing.count_parameters(recipe))
    assert bool(problems) == refused, [str(p) for p in problems]
