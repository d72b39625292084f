"""The process-global state a test may touch, snapshotted before and compared after.

Tests share processes (pytest-xdist workers run many test files each, in an order that depends on
timing and on the shuffle seed), so a test that leaves a global changed breaks another test later,
somewhere else, by the luck of the order. The autouse fixtures in ``conftest.py`` take a
:class:`Snapshot` before each test (and each test module) and fail the one that left something
changed, naming what, then put the state back so that the next test starts clean.

What is watched: every environment variable, torch's intra- and inter-op thread counts, the default
dtype, deterministic-algorithms mode, the cuDNN and TF32 flags, the float32 matmul precision, the
working directory, the SIGINT/SIGTERM/SIGUSR1 handlers, the level, handlers and propagation of the
``lightning``/``tfbuilder`` loggers (and their children), the warnings filters, and the csv module's
field size limit.
"""

from __future__ import annotations

import csv
import logging
import os
import signal
import warnings
from dataclasses import dataclass, fields

import torch

# Set by pytest itself around every phase of every test: not the test's doing.
_PYTEST_OWN = frozenset({"PYTEST_CURRENT_TEST"})
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
LOGGER_ROOTS = ("lightning", "pytorch_lightning", "tfbuilder")


# A logger that did not exist yet is as good as one in this state (made by an import, untouched).
_FRESH_LOGGER = (logging.NOTSET, (), True, False)


def _loggers() -> dict[str, tuple]:
    """Level, handlers, propagation and disabled flag of every logger under LOGGER_ROOTS that is not
    in its fresh state."""
    seen = {}
    for name, logger in sorted(logging.root.manager.loggerDict.items()):
        if name.split(".")[0] in LOGGER_ROOTS and isinstance(logger, logging.Logger):  # not a PlaceHolder
            state = (logger.level, tuple(logger.handlers), logger.propagate, logger.disabled)
            if state != _FRESH_LOGGER:
                seen[name] = state
    return seen


@dataclass(frozen=True)
class Snapshot:
    environment: dict[str, str]
    threads: int
    interop_threads: int
    default_dtype: torch.dtype
    deterministic: tuple[bool, bool]
    cudnn: tuple[bool, bool, bool, bool]
    matmul_tf32: bool
    matmul_precision: str
    cwd: str
    signals: dict[int, object]
    loggers: dict[str, tuple]
    warnings_filters: tuple
    csv_field_limit: int

    @classmethod
    def now(cls) -> Snapshot:
        cudnn = torch.backends.cudnn
        limit = csv.field_size_limit()
        return cls(
            environment={k: v for k, v in os.environ.items() if k not in _PYTEST_OWN},
            threads=torch.get_num_threads(),
            interop_threads=torch.get_num_interop_threads(),
            default_dtype=torch.get_default_dtype(),
            deterministic=(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
            cudnn=(cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32),
            matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
            matmul_precision=torch.get_float32_matmul_precision(),
            cwd=os.getcwd(),
            signals={int(s): signal.getsignal(s) for s in SIGNALS},
            loggers=_loggers(),
            warnings_filters=tuple(warnings.filters),
            csv_field_limit=limit,
        )

    def changes(self, after: Snapshot) -> list[str]:
        """What ``after`` has changed from this snapshot, one line each ("" if nothing)."""
        said = []
        for f in fields(self):
            before_value, after_value = getattr(self, f.name), getattr(after, f.name)
            if before_value == after_value:
                continue
            if f.name == "environment":
                for key in sorted(set(before_value) | set(after_value)):
                    b, a = before_value.get(key), after_value.get(key)
                    if b != a:
                        said.append(f"environment variable {key} {_was(a)} (was {_was(b)})")
            elif f.name in ("signals", "loggers"):
                for key in sorted(set(before_value) | set(after_value)):
                    b, a = before_value.get(key), after_value.get(key)
                    if b != a:
                        if f.name == "signals":
                            said.append(f"{signal.Signals(key).name} handler at {a!r} (was {b!r})")
                        else:
                            said.append(f"logger {key!r}: {_logger_change(b or _FRESH_LOGGER, a or _FRESH_LOGGER)}")
            elif f.name == "warnings_filters":
                added = [w for w in after_value if w not in before_value]
                removed = [w for w in before_value if w not in after_value]
                said.append(f"warnings filters: added {added}, removed {removed}")
            else:
                said.append(f"{f.name} at {after_value!r} (was {before_value!r})")
        return said

    def restore(self) -> None:
        """Put back what can be put back (the inter-op thread count is set once per process)."""
        for key in [k for k in os.environ if k not in _PYTEST_OWN and k not in self.environment]:
            del os.environ[key]
        for key, value in self.environment.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        torch.set_default_dtype(self.default_dtype)
        torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        cudnn = torch.backends.cudnn
        cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = self.cudnn
        torch.backends.cuda.matmul.allow_tf32 = self.matmul_tf32
        torch.set_float32_matmul_precision(self.matmul_precision)
        os.chdir(self.cwd)
        for signum, handler in self.signals.items():
            if handler is not None:  # None: set outside Python; cannot be put back from here
                signal.signal(signum, handler)  # type: ignore[arg-type]
        now = _loggers()
        for name in set(now) | set(self.loggers):
            state = self.loggers.get(name, _FRESH_LOGGER)
            if now.get(name, _FRESH_LOGGER) != state:
                logger = logging.getLogger(name)
                logger.setLevel(state[0])
                logger.handlers, logger.propagate, logger.disabled = list(state[1]), state[2], state[3]
        warnings.filters[:] = list(self.warnings_filters)
        warnings._filters_mutated()  # type: ignore[attr-defined]
        csv.field_size_limit(self.csv_field_limit)


def _logger_change(before: tuple, after: tuple) -> str:
    parts = []
    if before[0] != after[0]:
        parts.append(f"level {logging.getLevelName(after[0])} (was {logging.getLevelName(before[0])})")
    if before[1] != after[1]:
        parts.append(f"handlers {list(after[1])} (was {list(before[1])})")
    for i, name in ((2, "propagate"), (3, "disabled")):
        if before[i] != after[i]:
            parts.append(f"{name} {after[i]} (was {before[i]})")
    return ", ".join(parts)


def _was(value: str | None) -> str:
    return "unset" if value is None else f"set to {value!r}"


def report(where: str, before: Snapshot, after: Snapshot) -> str | None:
    """The failure message for ``where`` (a test id or a module) if it left something changed."""
    changes = before.changes(after)
    if not changes:
        return None
    lines = "\n".join(f"  - {c}" for c in changes)
    return f"{where} left process-global state changed (restored now; fix the test or the code it calls):\n{lines}"
