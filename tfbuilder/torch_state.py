"""The process-wide state a training run changes, saved and given back (no Lightning here).

Training sets the number of CPU threads, seeds every random generator, and (through Lightning's
Trainer) may switch deterministic algorithms and cuDNN's autotuner on or off, and set environment
variables that ask for them. A notebook or a test that calls :func:`tfbuilder.fit` must find the
process as it was before, whether the fit returned or raised: :func:`kept` restores all of it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class TorchState:
    """A snapshot of the global settings and generators training may change."""

    threads: int
    deterministic: bool
    deterministic_warn_only: bool
    cudnn_benchmark: bool
    cudnn_deterministic: bool
    matmul_precision: str
    cpu_rng: torch.Tensor
    cuda_rng: tuple[torch.Tensor, ...] | None  # None: CUDA not initialised (restoring would initialise it)
    python_rng: tuple[Any, ...]  # what random.getstate() returns
    numpy_rng: dict
    # All of os.environ: Lightning's seeding sets PL_GLOBAL_SEED, loggers set theirs (W&B its service's address).
    environment: tuple[tuple[str, str], ...]

    @classmethod
    def now(cls) -> TorchState:
        cuda = (
            tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )
        return cls(
            threads=torch.get_num_threads(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            cudnn_deterministic=torch.backends.cudnn.deterministic,
            matmul_precision=torch.get_float32_matmul_precision(),
            cpu_rng=torch.get_rng_state(),
            cuda_rng=cuda,
            python_rng=random.getstate(),
            numpy_rng=np.random.get_state(legacy=False),
            environment=tuple(sorted(os.environ.items())),
        )

    def restore(self) -> None:
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.deterministic_warn_only)
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        torch.backends.cudnn.deterministic = self.cudnn_deterministic
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(list(self.cuda_rng))
        random.setstate(self.python_rng)
        np.random.set_state(self.numpy_rng)
        environment = dict(self.environment)
        for name in [n for n in os.environ if n not in environment]:
            del os.environ[name]
        for name, value in environment.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


@contextmanager
def kept() -> Iterator[TorchState]:
    """Run the body, then put back what :class:`TorchState` records (also when the body raises)."""
    before = TorchState.now()
    try:
        yield before
    finally:
        before.restore()
