"""Run directories under faults: resuming from the past, concurrent fits, interrupted sweeps, full
disks. Each case drives the CLI as a user would and checks the exit status, the message, and that
every file the user had is still there with the same bytes (hashed before and after)."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import torch

from conftest import ROOT
from hostile import run_cli
from tfbuilder.runs import read_checkpoint

QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
# The quick-start task at its smallest: a fit of 16 steps takes well under a second.
TINY = [
    "trainer.progress=false", "data.train_size=300", "data.val_size=20", "data.lengths=[1, 6]",
    "trainer.val_every=4", "trainer.log_every=2", "trainer.keep_last=3", "trainer.max_steps=16", "trainer.threads=1",
    "model.d_model=16", "model.attention.heads=2", "model.attention.key_dim=8", "model.attention.value_dim=8",
    "model.ffn.hidden=16", "model.encoder.layers=1", "model.decoder.layers=1",
]  # fmt: skip


def tiny(tmp_path: Path, *more: str) -> list[str]:
    """``--set`` arguments of the tiny run, writing under ``tmp_path/runs``."""
    return sum((["--set", o] for o in [f"trainer.output={tmp_path / 'runs'}", *TINY, *more]), [])


def hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file below ``folder`` by relative path (fit.lock aside: it names its holder)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "fit.lock"
    }


def metrics_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def weights(path: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(path)["state_dict"]


# --- resuming from an older checkpoint moves the later history aside ----------------------------------


def test_resuming_from_the_past_moves_the_future_aside_whole(tmp_path, capsys):
    # A row at every step: the rows of step 8 (logged as 7) stay, those of step 9 (logged as 8) go.
    assert run_cli(["fit", str(QUICKSTART), *tiny(tmp_path, "trainer.log_every=1")], capsys).rc == 0
    run = tmp_path / "runs" / "quickstart" / "version_0"
    ckpts = run / "checkpoints"
    before = hashes(run)
    rows_before = metrics_rows(run / "metrics.csv")
    assert {"checkpoints/step-00000012.ckpt", "checkpoints/step-00000016.ckpt", "checkpoints/best.ckpt", "summary.json"} <= before.keys()
    assert read_checkpoint(ckpts / "best.ckpt")["global_step"] == 16  # the best is in the future of step 8

    # Resume from step 8, stopping at step 10: its best (step 10) is worse than the abandoned one (step 16).
    outcome = run_cli(["fit", "--resume", str(ckpts / "step-00000008.ckpt"), "--set", "trainer.max_steps=10"], capsys)
    assert outcome.rc == 0, outcome.err
    aside = run / "abandoned" / "from-step-8"
    assert "resuming from step 8: what the run did after it" in outcome.err
    assert "was moved to" in outcome.err and "abandoned/from-step-8/" in outcome.err
    assert "Traceback" not in outcome.err

    # Every file the run had is still there, byte for byte: in place, or at the same path in the folder aside.
    after = hashes(run)
    for name, digest in before.items():
        if name == "metrics.csv":
            continue
        assert digest in (after.get(name), after.get(f"abandoned/from-step-8/{name}")), name
    for name in ("checkpoints/step-00000012.ckpt", "checkpoints/step-00000016.ckpt", "checkpoints/best.ckpt",
                 "checkpoints/last.ckpt", "summary.json"):  # fmt: skip
        assert after[f"abandoned/from-step-8/{name}"] == before[name], name
    # The better, later best.ckpt was not replaced: it lies aside whole; the run's best is its own history's.
    assert read_checkpoint(aside / "checkpoints" / "best.ckpt")["global_step"] == 16
    assert read_checkpoint(ckpts / "best.ckpt")["global_step"] <= 10
    assert read_checkpoint(ckpts / "last.ckpt")["global_step"] == 10

    # metrics.csv is cut at the resumed step: every row of the first run is kept once (here or aside),
    # and no step appears twice in the run's metrics.
    kept, moved = metrics_rows(run / "metrics.csv"), metrics_rows(aside / "metrics.csv")
    old = [r for r in kept if int(r["step"]) < 8]
    assert old + moved == rows_before
    assert all(int(r["step"]) >= 8 for r in moved)
    seen = [(r["step"], bool(r["val_loss"])) for r in kept]
    assert len(seen) == len(set(seen)), "a step logged twice"

    # Resuming from step 8 again: a second folder, the first untouched; the run continued to 16 ends
    # bit-equal to the first run's abandoned step 16.
    first_aside = hashes(aside)
    outcome = run_cli(["fit", "--resume", str(ckpts / "step-00000008.ckpt")], capsys)
    assert outcome.rc == 0, outcome.err
    assert "abandoned/from-step-8-2/" in outcome.err
    assert hashes(aside) == first_aside
    assert read_checkpoint(run / "abandoned" / "from-step-8-2" / "checkpoints" / "last.ckpt")["global_step"] == 10
    a, b = weights(ckpts / "last.ckpt"), weights(aside / "checkpoints" / "step-00000016.ckpt")
    assert all(torch.equal(a[k], b[k]) for k in a)

    # An ordinary resume of a finished run moves nothing.
    outcome = run_cli(["fit", "--resume", str(run), "--set", "trainer.max_steps=20"], capsys)
    assert outcome.rc == 0 and "moved to" not in outcome.err
    assert sorted(p.name for p in (run / "abandoned").iterdir()) == ["from-step-8", "from-step-8-2"]
