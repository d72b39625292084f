"""benchmarks/gpu_check.py without a GPU: its dry run (tiny shapes on the CPU) writes the table and the
JSON with every part, each ok or skipped with a reason, and a part that runs past its budget is cut and
reported while the run goes on (docs/gpu.md, "Measuring on a GPU")."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the parent imports no torch: cheap
    return module


def _run(out: Path, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict, str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--dry-run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    state = json.loads((out / "gpu_check.json").read_text())
    return proc, state, (out / "gpu_check.md").read_text()


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("gpu_check"))


def test_the_dry_run_writes_every_part_ok_or_skipped(dry_run):
    """Over 30 s on 2 cores (its fixture runs benchmarks/gpu_check.py --dry-run: every part in its own
    process, tiny shapes). It is the only check that the one GPU command works end to end before a
    GPU is at hand; a part skipped here would first fail on the scarce GPU machine."""
    proc, state, table = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = [name for name, *_ in _script().PARTS]
    assert list(state["parts"]) == names
    assert state["dry_run"] is True and "seconds" in state
    for name, part in state["parts"].items():
        assert part["status"] in ("ok", "skipped"), (name, part)
        if part["status"] == "skipped":
            assert part["reason"], name
        assert f"| {name} | {part['title']} | {part['status']} |" in table
    parts = state["parts"]
    for name in ("env", "peak", "pytest", "train-base", "train-gpt2", "profile"):  # need neither CUDA nor data
        assert parts[name]["status"] == "ok", (name, parts[name])
    assert parts["peak"]["result"]["tflops"] > 0
    for name in ("train-base", "train-gpt2"):
        rows = parts[name]["result"]["rows"]
        assert len(rows) == 4 and all(row["tokens_per_s"] > 0 for row in rows)
    assert len(parts["profile"]["result"]["top"]) == 10
    assert "## Training step throughput" in table and "## Profile" in table
    if state["multi30k"]:  # beside the clone here and in CI; elsewhere MULTI30K_DIR
        for name in ("fit", "decode"):
            assert parts[name]["status"] == "ok", (name, parts[name])
        assert parts["fit"]["result"]["steps_done"] == parts["fit"]["result"]["steps_planned"]
        assert parts["fit"]["result"]["bare_steps_per_s"] > 0
        assert [row["search"] for row in parts["decode"]["result"]["rows"]] == ["greedy", "beam 4"]
        assert "## tfbuilder fit" in table and "## Decoding" in table
    else:
        assert "MULTI30K_DIR" in parts["fit"]["reason"]


def test_a_part_that_crashes_or_runs_past_its_budget_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_CHECK_FAIL", "env")  # env raises at once
    proc, state, table = _run(tmp_path, "--parts", "env,peak", "--budget", "peak=0.5", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env, peak = state["parts"]["env"], state["parts"]["peak"]
    assert env["status"] == "failed" and "injected failure of env" in env["reason"]
    assert peak["status"] == "timed out" and peak["reason"].startswith("timed out after 0.5 s")
    assert "| env | versions and device | failed |" in table
    assert "| peak | bf16 matmul peak | timed out |" in table
    assert "injected failure of env" in (tmp_path / "gpu_check.log").read_text()
