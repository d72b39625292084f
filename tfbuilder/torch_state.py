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

import numpy as np
import torch

# Set by Lightning's seeding and deterministic mode; a fit's own settings, not the caller's.
ENVIRONMENT = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG")


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
    python_rng: object
    numpy_rng: dict
    environment: tuple[tuple[str, str | None], ...]

    @classmethod
    def now(cls) -> "TorchState":
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() and torch.cuda.is_initialized() else None
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
            environment=tuple((name, os.environ.get(name)) for name in ENVIRONMENT),
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
        for name, value in self.environment:
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def kept() -> Iterator[TorchState]:
    """Run the body, then put back what :class:`TorchState` records (also when the body raises)."""
    before = TorchState.now()
    try:
        yield before
    finally:
        before.restore()
