"""The peak memory a run reports: measured from the reset, not over the process's life."""

from __future__ import annotations

import sys

import pytest
import torch

from tfbuilder.train import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the resettable high-water mark is Linux's")
def test_the_cpu_peak_counts_from_its_reset():
    memory.reset_peak(False)
    before = memory.peak_mb(False)
    big = torch.ones(64 * 2**20 // 4 * 4)  # 256 MiB, touched
    during = memory.peak_mb(False)
    del big
    memory.reset_peak(False)
    after = memory.peak_mb(False)
    assert during - before >= 200
    assert after < during - 200  # a later run of the same process is not charged for this one
