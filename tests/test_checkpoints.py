"""Runs you can trust: a checkpoint at every validation, atomic writes, divergence, early stopping,
averaging, --init-from, owned run directories, and scoring that says what it scored."""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import re
import shutil

import pytest
import torch

import tfbuilder
from conftest import ONE_LAYER, QUICKSTART, short_run
from tfbuilder import atomic
from tfbuilder.train import objectives
from tfbuilder.runs.averaging import average
from tfbuilder.cli.commands import main
from tfbuilder.errors import RecipeError
from tfbuilder.runs.checkpoints import RunLock, load_checkpoint, read_checkpoint

FROZEN = ["optim.schedule.type=constant", "optim.schedule.warmup=0", "optim.lr=1e-30"]  # updates below one ulp
TINY = ONE_LAYER


def small(tmp_path, *overrides: str) -> list[str]:
    return short_run(tmp_path, *overrides, train=1000, val=100)


def sets(overrides: list[str]) -> list[str]:
    return sum((["--set", o] for o in overrides), [])


def stderr(capsys) -> str:
    """Standard error without the "--- Logging error ---" reports of Lightning's log handler, which
    stays bound to an earlier test's (closed) captured stream."""
    return re.sub(r"--- Logging error ---.*?\nArguments: .*?\n", "", capsys.readouterr().err, flags=re.S)


def step_of(path) -> int:
    return int(read_checkpoint(path)["global_step"])


def only_run(tmp_path):
    (run,) = (tmp_path / "runs" / "quickstart").iterdir()
    return run


def test_last_checkpoint_follows_every_validation_when_the_loss_does_not_improve(tmp_path):
    summary = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, *FROZEN, "trainer.val_every=3", "trainer.max_steps=11")))
    ckpts = tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints"
    # Validations at 3, 6, 9 and the final step 11 (a run validates at its end); none improves on the first.
    assert step_of(ckpts / "last.ckpt") == 11 and summary.last_val_step == 11
    assert step_of(ckpts / "best.ckpt") == 3 and summary.best_step == 3
    assert summary.stopped == "max_steps"


def test_patience_stops_at_the_right_validation(tmp_path):
    summary = tfbuilder.fit(
        tfbuilder.load_recipe(QUICKSTART, small(tmp_path, *FROZEN, "trainer.val_every=3", "trainer.max_steps=60", "trainer.patience=2"))
    )
    assert summary.steps == 9  # best at 3, no improvement at 6 and 9: patience 2 is used up at 9
    assert summary.stopped.startswith("early stopping") and "patience 2" in summary.stopped
    assert step_of(summary.last_checkpoint) == 9 and summary.best_step == 3
    saved = json.loads((tmp_path / "runs" / "quickstart" / "version_0" / "summary.json").read_text())
    assert saved["stopped"] == summary.stopped


# Validation losses by step: best at 8, then three validations without improvement.
SCRIPTED_VAL_LOSS = {2: 5.0, 4: 4.0, 6: 4.5, 8: 3.0, 10: 3.5, 12: 3.0, 14: 3.7, 16: 1.0}


def scripted_validation(monkeypatch) -> None:
    """Make every validation report SCRIPTED_VAL_LOSS at its step (whatever the model does)."""
    from tfbuilder.train.task import Task

    def on_validation_epoch_end(self):
        loss = SCRIPTED_VAL_LOSS[self.global_step]
        self.log("val_loss", loss)
        self.log("val_ppl", math.exp(loss))

    monkeypatch.setattr(Task, "on_validation_epoch_end", on_validation_epoch_end)


def guard_state(path) -> dict:
    (state,) = [v for k, v in read_checkpoint(path)["callbacks"].items() if k.startswith("RunGuard")]
    return state


def test_early_stopping_state_survives_a_resume(tmp_path, monkeypatch):
    """Best score, best step, best.ckpt and the patience counter are carried by the checkpoint: a run
    stopped half-way (one validation without improvement) and resumed stops where an uninterrupted
    run stops, with the same best. (A tie, 3.0 at step 12, is not an improvement.)"""
    scripted_validation(monkeypatch)
    common = small(tmp_path, *FROZEN, *TINY, "trainer.val_every=2", "trainer.val_batches=1", "trainer.threads=1", "trainer.patience=3")
    full = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=40"]))
    assert (full.steps, full.best_step, full.best_score, full.best_val_loss) == (14, 8, 3.0, 3.0)
    assert full.stopped.startswith("early stopping") and "for 3 validations" in full.stopped
    half = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=10"]))
    assert half.steps == 10 and guard_state(half.last_checkpoint)["stale"] == 1
    resumed = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=40"]), resume=half.run_dir)
    for name in ("steps", "best_step", "best_score", "best_val_loss", "last_val_step", "stopped"):
        assert getattr(resumed, name) == getattr(full, name), name
    assert guard_state(resumed.last_checkpoint) == guard_state(full.last_checkpoint)
    assert step_of(resumed.best_checkpoint) == step_of(full.best_checkpoint) == 8


def test_a_learning_run_keeps_its_best_and_the_last_n(tmp_path):
    learn = ["optim.schedule.type=constant", "optim.schedule.warmup=0", "optim.lr=3e-3"]
    summary = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, *learn, "trainer.val_every=2", "trainer.max_steps=10", "trainer.keep_last=3")))
    ckpts = only_run(tmp_path) / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step-*.ckpt")) == [f"step-{s:08d}.ckpt" for s in (6, 8, 10)]
    assert summary.best_step == 10 and step_of(ckpts / "best.ckpt") == 10  # a learning run improves


def nan_at(monkeypatch, step: int) -> None:
    """Make the loss of training step ``step`` NaN (its gradients then poison the weights)."""
    real, seen = objectives.seq2seq, []

    def poisoned(model, batch, **kwargs):
        result = real(model, batch, **kwargs)
        if torch.is_grad_enabled():
            seen.append(1)
            if len(seen) == step:
                result.loss = result.loss * float("nan")
        return result

    monkeypatch.setattr(objectives, "seq2seq", poisoned)


def test_a_non_finite_step_stops_the_run_and_leaves_a_finite_last_checkpoint(tmp_path, monkeypatch, capsys):
    nan_at(monkeypatch, 7)
    args = ["fit", str(QUICKSTART), *sets(small(tmp_path, "trainer.val_every=3", "trainer.log_every=2", "trainer.max_steps=30"))]
    assert main(args) == 1
    err = stderr(capsys)
    assert "non-finite at step 7" in err and "last.ckpt holds step 6" in err and "Traceback" not in err
    ckpts = only_run(tmp_path) / "checkpoints"
    for path in ckpts.glob("*.ckpt"):
        state = read_checkpoint(path)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), path
    assert step_of(ckpts / "last.ckpt") == 6
    assert not (only_run(tmp_path) / "summary.json").exists()  # not a finished run


def test_a_huge_learning_rate_is_reported_and_nothing_non_finite_is_saved(tmp_path, capsys):
    args = ["fit", str(QUICKSTART), *sets(small(tmp_path, "optim.lr=1e30", "trainer.val_every=1", "trainer.max_steps=50"))]
    assert main(args) == 1
    err = stderr(capsys)
    assert "at step 1; training stopped" in err and "Traceback" not in err
    for path in (only_run(tmp_path) / "checkpoints").glob("*.ckpt"):
        state = read_checkpoint(path)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), path


def test_a_write_failing_halfway_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    real, calls = atomic._serialize, []

    def disk_full(obj, f):
        calls.append(1)
        if len(calls) < 2:
            return real(obj, f)
        import io

        buffer = io.BytesIO()
        real(obj, buffer)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_serialize", disk_full)
    args = ["fit", str(QUICKSTART), *sets(small(tmp_path, "trainer.val_every=2", "trainer.max_steps=6"))]
    assert main(args) == 2  # a full disk is the machine's state, not a failed run: see docs/runs.md
    err = stderr(capsys)
    assert "No space left on device" in err and "step-00000004.ckpt" in err and "Traceback" not in err
    ckpts = only_run(tmp_path) / "checkpoints"
    assert step_of(ckpts / "last.ckpt") == 2  # the previous checkpoint, whole and loadable
    load_checkpoint(ckpts / "last.ckpt")
    assert not [p for p in ckpts.iterdir() if atomic.TEMP_MARK in p.name]  # the torn temporary is gone


def test_metrics_rows_are_written_atomically(tmp_path, monkeypatch):
    target = tmp_path / "metrics.csv"
    atomic.write_text(target, "step,val_loss\n1,2.0\n")

    def torn(f):
        f.write(b"step,val_loss\n1,2.0\n2,1.")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(atomic.WriteError, match="No space left on device.*previous version is kept"):
        atomic.write_atomic(target, torn, what="metrics")
    assert target.read_text() == "step,val_loss\n1,2.0\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]


def test_averaging(tmp_path, capsys):
    """(On the one-layer model: averaging is arithmetic over the tensors, whatever their number.)"""
    learn = ["optim.schedule.type=constant", "optim.schedule.warmup=0", "optim.lr=3e-3"]
    summary = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, *TINY, *learn, "trainer.val_every=2", "trainer.max_steps=6", "trainer.keep_last=3")))
    run = only_run(tmp_path)
    steps = sorted((run / "checkpoints").glob("step-*.ckpt"))
    # The average of identical checkpoints is each of them, exactly.
    same = average([steps[-1]] * 3)["state_dict"]
    last = read_checkpoint(steps[-1])["state_dict"]
    assert same.keys() == {k for k in last if k.startswith("model.")}
    assert all(torch.equal(same[k], last[k]) for k in same)
    # Three different ones: their mean.
    assert main(["average", str(run), "--last", "3"]) == 0
    assert "wrote" in capsys.readouterr().out
    averaged = read_checkpoint(run / "checkpoints" / "averaged.ckpt")["state_dict"]
    states = [read_checkpoint(p)["state_dict"] for p in steps]
    for k in averaged:
        torch.testing.assert_close(averaged[k], sum(s[k].double() for s in states).div(3).float(), rtol=0, atol=1e-7)
    assert not torch.equal(averaged["model.src_embed.tokens.weight"], last["model.src_embed.tokens.weight"])
    # The average is scored like any checkpoint, and the output names it.
    assert main(["test", str(run), "--checkpoint", "averaged", "--split", "val", "--beam", "1"]) == 0
    out = capsys.readouterr().out
    assert "averaged.ckpt" in out and "perplexity" in out
    # Never overwritten; more than kept is refused; so is a checkpoint of another recipe.
    assert main(["average", str(run), "--last", "3"]) == 2
    assert "not overwriting" in stderr(capsys)
    assert main(["average", str(run), "--last", "4", "--out", str(tmp_path / "x.ckpt")]) == 2
    assert "keeps 3" in stderr(capsys)
    other = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, *TINY, "model.ffn.hidden=16", "trainer.max_steps=2", "trainer.val_every=2")))
    shutil.copy(other.last_checkpoint, run / "checkpoints" / "step-00000099.ckpt")
    assert main(["average", str(run), "--last", "2", "--out", str(tmp_path / "y.ckpt")]) == 2
    assert "different recipes" in stderr(capsys) and not (tmp_path / "y.ckpt").exists()
    assert summary.steps == 6


def test_scoring_commands_say_which_checkpoint_they_use(tmp_path, capsys):
    summary = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, *FROZEN, "trainer.val_every=2", "trainer.max_steps=4")))
    run = summary.run_dir
    assert main(["test", run, "--split", "val", "--beam", "1"]) == 0  # best by default
    captured = capsys.readouterr()
    assert "best.ckpt (step 2)" in captured.out
    assert main(["test", run, "--split", "val", "--beam", "1", "--checkpoint", "last"]) == 0
    assert "last.ckpt (step 4)" in capsys.readouterr().out
    source = tmp_path / "in.txt"
    source.write_text("abc\n")
    out = tmp_path / "out.txt"
    assert main(["translate", run, "--beam", "1", "--input", str(source), "--output", str(out), "--checkpoint", "last"]) == 0
    assert "last.ckpt (step 4)" in stderr(capsys) and out.read_text().count("\n") == 1
    assert main(["translate", run, "--checkpoint", "averaged", "--input", str(source)]) == 2
    assert "tfbuilder average" in stderr(capsys)


def test_init_from_starts_from_the_weights_with_a_fresh_schedule(tmp_path, monkeypatch, capsys):
    learn = ["optim.schedule.type=constant", "optim.schedule.warmup=0", "optim.lr=3e-3"]
    source = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, *learn, "trainer.val_every=4", "trainer.max_steps=4")))
    from tfbuilder.train import fit as fitting

    seen = {}
    real = fitting.initial_model

    def spy(recipe, origin):
        model = seen["model"] = real(recipe, origin)
        seen["before"] = {k: v.clone() for k, v in model.state_dict().items()}
        return model

    monkeypatch.setattr(fitting, "initial_model", spy)
    new = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.val_every=3", "trainer.max_steps=3")), init_from=source.last_checkpoint)
    assert new.run_dir != source.run_dir and new.steps == 3  # a new run, counted from 0
    assert new.history[-1]["kind"] == "init_from"
    # At step 0 the new run's model is the source model: same outputs.
    loaded = load_checkpoint(source.last_checkpoint)
    src = torch.tensor([loaded.vocab.src.encode("abcab") + [2]])
    tgt = torch.tensor([[1] + loaded.vocab.tgt.encode("abc")])
    model = tfbuilder.build_model(loaded.recipe)
    model.load_state_dict(seen["before"])  # the weights the new run started from, before its first step
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(src, tgt), loaded.model(src, tgt), rtol=0, atol=0)
    # Other shapes: a clear error naming the parameters, nothing created.
    before = sorted((tmp_path / "runs" / "quickstart").iterdir())
    args = ["fit", str(QUICKSTART), "--init-from", source.last_checkpoint, *sets(small(tmp_path, "model.ffn.hidden=32"))]
    assert main(args) == 2
    err = stderr(capsys)
    assert "do not fit" in err and "ff_in.weight: checkpoint (128, 64), recipe (32, 64)" in err and "Traceback" not in err
    assert sorted((tmp_path / "runs" / "quickstart").iterdir()) == before


def test_resume_keeps_history_validates_at_its_end_and_refuses_other_shapes(tmp_path, capsys):
    first = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.val_every=2", "trainer.max_steps=5")))
    run = first.run_dir
    assert main(["fit", "--resume", run, "--set", "trainer.max_steps=7"]) == 0
    summary = json.loads(open(os.path.join(run, "summary.json")).read())
    assert summary["steps"] == 7 and summary["last_val_step"] == 7  # validated at its end
    assert summary["history"][-1]["changed"] == {"trainer.max_steps": [5, 7]}  # the override is recorded
    acc = summary["last_val_acc"]
    assert main(["fit", "--resume", run]) == 0  # a finished run: nothing to train, nothing forgotten
    again = json.loads(open(os.path.join(run, "summary.json")).read())
    assert again["last_val_acc"] == acc and again["steps"] == 7
    assert [h["kind"] for h in again["history"]] == ["new", "resume", "resume"]
    assert [h["to_step"] for h in again["history"]] == [5, 7, 7]
    capsys.readouterr()
    assert main(["fit", "--resume", run, "--set", "model.d_model=32", "--set", "trainer.max_steps=9"]) == 2
    err = stderr(capsys)
    assert "do not fit the recipe's model" in err and "checkpoint (15, 64), recipe (15, 32)" in err and "Traceback" not in err
    assert step_of(os.path.join(run, "checkpoints", "last.ckpt")) == 7


def test_resume_refuses_a_moved_run_and_a_loose_checkpoint(tmp_path, capsys):
    first = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.val_every=2", "trainer.max_steps=2")))
    copy = tmp_path / "copied-run"
    shutil.copytree(first.run_dir, copy)
    assert main(["fit", "--resume", str(copy), "--set", "trainer.max_steps=4"]) == 2
    assert "copied or moved" in stderr(capsys)
    original = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints").iterdir()}
    assert main(["fit", "--resume", str(copy), "--force", "--set", "trainer.max_steps=4"]) == 0
    assert step_of(copy / "checkpoints" / "last.ckpt") == 4
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints").iterdir()}
    assert after == original  # the run it was copied from is untouched
    loose = tmp_path / "some" / "dir"
    loose.mkdir(parents=True)
    shutil.copy(first.last_checkpoint, loose / "model.ckpt")
    (loose / "summary.json").write_text("mine")
    assert main(["fit", "--resume", str(loose / "model.ckpt")]) == 2
    assert "--init-from" in stderr(capsys)
    assert sorted(p.name for p in loose.iterdir()) == ["model.ckpt", "summary.json"]
    assert (loose / "summary.json").read_text() == "mine"


def test_a_run_directory_in_use_is_refused(tmp_path, monkeypatch, capsys):
    target = tmp_path / "shared"
    target.mkdir()
    holder = RunLock(target).acquire()  # as a running fit holds it
    try:
        monkeypatch.setenv("TFBUILDER_RUN_DIR", str(target))
        assert main(["fit", str(QUICKSTART), *sets(small(tmp_path, "trainer.max_steps=2"))]) == 2
        err = stderr(capsys)
        assert "in use" in err and f"pid {os.getpid()}" in err
        assert sorted(p.name for p in target.iterdir()) == ["fit.lock"]  # nothing of the second fit
    finally:
        holder.release()


def test_a_missing_accelerator_leaves_no_run_directory(tmp_path, capsys):
    absent = "mps" if torch.cuda.is_available() else "gpu"
    assert main(["fit", str(QUICKSTART), *sets(small(tmp_path, f"trainer.accelerator={absent}"))]) == 2
    assert "trainer:" in stderr(capsys)
    assert not (tmp_path / "runs").exists()


def test_monitoring_bleu_needs_bleu(tmp_path):
    with pytest.raises(RecipeError, match="monitor: val_bleu needs trainer.val_bleu"):
        tfbuilder.load_recipe(QUICKSTART, ["trainer.monitor=val_bleu"])


def test_metrics_survive_a_resume_as_well_formed_rows(tmp_path):
    first = tfbuilder.fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.val_every=2", "trainer.max_steps=2", "trainer.log_every=1")))
    assert main(["fit", "--resume", first.run_dir, "--set", "trainer.max_steps=4"]) == 0
    with open(os.path.join(first.run_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.reader(f))
    assert len({len(r) for r in rows}) == 1 and len(rows) > 4
