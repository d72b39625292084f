"""Training through Lightning: learning, resume, checkpoints, summaries, and refusing bad input."""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import tfbuilder
from conftest import QUICKSTART, ROOT, ddp_env, short_run, text_folder
from tfbuilder.cli.commands import main
from tfbuilder.spec.recipe import recipe_from_dict
from tfbuilder.runs.checkpoints import CheckpointError, load_checkpoint, model_state, read_checkpoint
from tfbuilder.train.fit import fit



small = short_run  # a few-second quick-start run writing under tmp_path


def val_metrics(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return [row for row in csv.DictReader(f) if row.get("val_acc")]


def test_resume_ends_bit_equal_to_an_uninterrupted_run(tmp_path):
    """About 30 s on 2 cores: three short fits (30 steps, 16 steps, then resumed to 30) with dropout
    and validations, through Lightning. Bit-equality after a resume needs the real loop's checkpoint,
    data position and random state; a shorter run would not cross a validation and a checkpoint."""
    # One thread in every run, whatever the machine's load: bit-equal needs the same sums.
    common = small(tmp_path, "model.dropout=0.1", "trainer.val_every=10", "trainer.deterministic=true", "trainer.threads=1")
    full = fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=30"]))
    half = fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=16"]))
    assert full.run_dir != half.run_dir  # a new version: the first run is not overwritten
    resumed_recipe = recipe_from_dict(read_checkpoint(half.run_dir)["tfbuilder"]["recipe"], ["trainer.max_steps=30"])
    resumed = fit(resumed_recipe, resume=half.run_dir)
    assert resumed.run_dir == half.run_dir and resumed.steps == 30
    a = read_checkpoint(full.last_checkpoint)["state_dict"]
    b = read_checkpoint(resumed.last_checkpoint)["state_dict"]
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # ... and the comparison is sharp: another seed ends elsewhere.
    other = fit(tfbuilder.load_recipe(QUICKSTART, common + ["trainer.max_steps=30", "trainer.seed=1"]))
    c = read_checkpoint(other.last_checkpoint)["state_dict"]
    assert not all(torch.equal(a[k], c[k]) for k in a)
    # The metrics of the interrupted run are kept, with the resumed steps appended.
    steps = [int(r["step"]) for r in val_metrics(half.run_dir)]
    assert steps[0] < 16 < steps[-1]


def test_checkpoint_rebuilds_the_model_without_the_recipe_file(tmp_path):
    summary = fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.max_steps=5", "trainer.val_every=5")))
    run = os.path.join(summary.run_dir)
    loaded = load_checkpoint(run)  # a run directory means its last checkpoint
    assert loaded.step == 5
    assert loaded.recipe.model.d_model == 64
    src = torch.tensor([loaded.vocab.src.encode("abc") + [2]])
    tgt = torch.tensor([[1] + loaded.vocab.tgt.encode("ab")])
    state = read_checkpoint(summary.last_checkpoint)["state_dict"]
    reference = tfbuilder.build_model(loaded.recipe)
    reference.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    torch.testing.assert_close(loaded.model(src, tgt), reference.eval()(src, tgt))
    for name in ("recipe.yaml", "tokenizer.json", "metrics.csv", "summary.json", "checkpoints/best.ckpt"):
        assert os.path.exists(os.path.join(run, name)), name
    assert json.loads(open(os.path.join(run, "summary.json")).read())["steps"] == 5


def test_bad_checkpoints_are_refused_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.ckpt")
    truncated = tmp_path / "truncated.ckpt"
    torch.save({"state_dict": {"w": torch.ones(1000)}, "tfbuilder": {}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="damaged checkpoint .*truncated"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(CheckpointError, match="not a tfbuilder checkpoint"):
        load_checkpoint(foreign)
    # weights_only=True: a pickled object that would run code on load is refused.
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "tfbuilder": {}, "payload": CheckpointError("x")}, evil)
    with pytest.raises(CheckpointError, match="holds objects tfbuilder does not load"):
        load_checkpoint(evil)


def test_fit_prints_a_summary(tmp_path, capsys):
    args = ["fit", str(QUICKSTART), *sum((["--set", o] for o in small(tmp_path, "trainer.max_steps=4", "trainer.val_every=2")), [])]
    assert main(args) == 0
    out = capsys.readouterr().out
    for label in ("run directory", "steps", "wall time", "best validation loss", "tokens/s (training steps)", "last checkpoint"):
        assert label in out


def parallel_recipe(tmp_path, files: dict[str, list[str]], *extra: str) -> tfbuilder.Recipe:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for name, lines in files.items():
        with gzip.open(data / f"{name}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return tfbuilder.load_recipe(
        ROOT / "recipes" / "vanilla.yaml",
        [
            f"data.path={data}",
            "data.src_lang=de",
            "data.tgt_lang=en",
            "data.tokenizer.vocab_size=300",
            "data.max_tokens=400",
            f"trainer.output={tmp_path / 'runs'}",
            *extra,
        ],
    )


GOOD = [f"ein kleiner satz nummer {i} mit worten" for i in range(200)]
GOOD_EN = [f"a small sentence number {i} with words" for i in range(200)]


@pytest.mark.parametrize(
    "files, extra, message",
    [
        ({"train.de": GOOD, "val.de": GOOD[:5], "val.en": GOOD_EN[:5]}, [], r"missing data file: .*train\.en"),
        ({"train.de": GOOD, "train.en": GOOD_EN[:-1], "val.de": GOOD, "val.en": GOOD_EN}, [], "has 200 lines but"),
        ({"train.de": GOOD, "train.en": GOOD_EN, "val.de": [""], "val.en": [""]}, [], "is empty"),
        ({"train.de": GOOD, "train.en": GOOD_EN, "val.de": GOOD, "val.en": GOOD_EN}, ["data.tokenizer.vocab_size=90000"], "fills only"),
        ({"train.de": GOOD, "train.en": GOOD_EN, "val.de": GOOD, "val.en": GOOD_EN}, ["data.max_tokens=5"], "smaller than the longest"),
    ],
    ids=["missing-file", "line-counts-differ", "empty-file", "vocabulary-too-big", "budget-too-small"],
)
def test_bad_data_is_reported_before_training(tmp_path, files, extra, message):
    recipe = parallel_recipe(tmp_path, files, *extra)
    with pytest.raises(tfbuilder.errors.TfbuilderError, match=message):
        fit(recipe)
    assert not (tmp_path / "runs").exists()  # nothing was created, nothing trained


def test_unwritable_output_is_reported_before_training(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    args = ["fit", str(QUICKSTART), *sum((["--set", o] for o in small(tmp_path, f"trainer.output={blocker / 'runs'}")), [])]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "cannot create run directory" in err and "Traceback" not in err
    assert blocker.read_text() == "not a directory"


def test_fit_without_data_section_is_refused(tmp_path):
    recipe = tfbuilder.Recipe.model_validate({"model": {"vocab_size": 10, "encoder": {"layers": 1}, "decoder": {"layers": 1}}})
    with pytest.raises(tfbuilder.errors.TfbuilderError, match="no data section"):
        fit(recipe)


# `tfbuilder fit` that also saves each rank's final weights (Lightning starts the other rank by
# running this same file again).
DDP_DRIVER = """
import os, sys
import torch
from tfbuilder.train.task import Task
from tfbuilder.cli.commands import main

train_end = Task.on_train_end
def save_weights(self):
    train_end(self)
    state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
    state["train_tokens"] = torch.tensor(self.train_tokens)  # this rank's own count
    torch.save(state, os.path.join(os.environ["WEIGHTS_DIR"], f"rank-{self.global_rank}.pt"))
Task.on_train_end = save_weights
sys.exit(main(sys.argv[1:]))
"""


def test_ddp_on_two_cpu_processes_completes_and_ranks_agree(tmp_path):
    """Two ranks on text data: one prepares the store, the other opens it; both train in step.

    Over 30 s on 2 cores: two real processes joined by gloo. Only real ranks show that the store is
    prepared once, that neither rank waits forever on the other, and that their weights stay equal."""
    from test_store import corpus

    folder = corpus(tmp_path / "data")
    text_data = [
        "data.type=parallel", f"data.path={folder}", "data.src_lang=de", "data.tgt_lang=en", "data.tokenizer.type=bpe",
        "data.tokenizer.vocab_size=280", "data.max_tokens=300", "trainer.val_bleu=0",
    ]
    sets = small(tmp_path, "trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu", "trainer.max_steps=6", "trainer.val_every=3",
                 "trainer.threads=1", *text_data)  # two processes on two cores
    driver = tmp_path / "ddp_driver.py"
    driver.write_text(DDP_DRIVER)
    cmd = [sys.executable, str(driver), "fit", str(QUICKSTART), *sum((["--set", o] for o in sets), [])]
    env = ddp_env(WEIGHTS_DIR=str(tmp_path))
    env.pop("TFBUILDER_CACHE", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stores = [p for p in (folder / ".tfbuilder").iterdir() if p.is_dir()]
    assert len(stores) == 1, stores  # prepared once, by one rank
    assert len(re.findall(r"^data: (prepared \d|using the prepared store .* \(prepared by another process\))", proc.stderr, re.M)) == 1, proc.stderr
    assert re.search(r"^ranks agree +yes$", proc.stdout, re.M), proc.stdout
    runs = list((tmp_path / "runs" / "quickstart").iterdir())
    assert len(runs) == 1  # both ranks wrote into one run directory
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["ranks_agree"] is True
    rank0, rank1 = (torch.load(tmp_path / f"rank-{r}.pt", weights_only=True) for r in (0, 1))
    # The summary counts both ranks' tokens; the checkpoint says how many processes trained.
    tokens = [int(state.pop("train_tokens")) for state in (rank0, rank1)]
    assert summary["train_tokens"] == sum(tokens) and min(tokens) > 0
    assert read_checkpoint(runs[0] / "checkpoints" / "last.ckpt")["tfbuilder"]["world_size"] == 2
    # Every tensor of both ranks' final weights is equal, and equal to the last checkpoint's.
    saved = model_state(read_checkpoint(runs[0] / "checkpoints" / "last.ckpt"))
    assert rank0.keys() == rank1.keys() == saved.keys()
    assert all(torch.equal(rank0[k], rank1[k]) and torch.equal(rank0[k], saved[k]) for k in rank0)


@pytest.mark.slow
def test_quickstart_recipe_learns_the_copy_task_to_99_percent(quickstart_run):
    """The README's promise, kept: the quickstart recipe as shipped (its time is in the fit summary;
    the run is trained once per test run and shared, see conftest.py).
    (It is also the test that training learns: the fast subset has the translation BLEU test below.)"""
    final = val_metrics(quickstart_run)[-1]
    # A model that cannot see the source (or sees the answer) cannot land here: chance is 1/10 per token.
    assert float(final["val_acc"]) >= 0.99, final
    summary = json.loads((quickstart_run / "summary.json").read_text())
    assert summary["best_val_loss"] < 0.3 and summary["steps"] == 1200


def test_a_given_run_directory_starts_the_run_or_continues_it(tmp_path, monkeypatch):
    """TFBUILDER_RUN_DIR (for cluster launchers that start every rank) names the run directory: the same
    command starts the run there, and run again continues it from its last checkpoint."""
    target = tmp_path / "shared-run"
    monkeypatch.setenv("TFBUILDER_RUN_DIR", str(target))
    summary = fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.max_steps=2", "trainer.val_every=2")))
    assert summary.run_dir == str(target) and (target / "checkpoints" / "last.ckpt").exists()
    again = fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.max_steps=4", "trainer.val_every=2")))
    assert again.run_dir == str(target) and again.steps == 4
    assert [(h["kind"], h["from_step"], h.get("continued")) for h in again.history] == [("new", 0, None), ("resume", 2, True)]
    assert again.history[1]["changed"] == {"trainer.max_steps": [2, 4]}


@pytest.mark.filterwarnings("ignore:You are trying to `self.log()`")
def test_a_training_step_adds_the_moe_balancing_losses_to_the_objective():
    """The step's loss is the objective plus, for every mixture-of-experts layer, aux_weight times the
    Switch loss of the router logits that layer saw (recomputed here by hand)."""
    from test_component_references import switch_loss

    from tfbuilder.model.components.moe import MixtureOfExperts
    from tfbuilder.train.objectives import objective
    from tfbuilder.train.task import Task

    moe = "model.ffn={type: moe, experts: 3, top_k: 1, hidden: 32, aux_weight: 0.1}"
    recipe = tfbuilder.load_recipe(QUICKSTART, [moe, "model.encoder.layers=1", "model.decoder.layers=1"])
    model = tfbuilder.build_model(recipe)
    task = Task(recipe, model, "{}")
    routers = [m.router for m in model.modules() if isinstance(m, MixtureOfExperts)]
    seen: list[list[list[float]]] = []
    hooks = [r.register_forward_hook(lambda module, args, out: seen.append(out.tolist())) for r in routers]
    ids = torch.randint(5, 15, (4, 7))
    batch = {"src": ids, "tgt_in": ids, "tgt_out": ids}
    task.on_before_batch_transfer(batch, 0)
    loss = task.training_step(batch, 0)
    for hook in hooks:
        hook.remove()
    assert len(seen) == len(routers) == 2  # the encoder's and the decoder's feed-forward
    plain = objective(recipe, epsilon=recipe.optim.label_smoothing)(model, batch).loss  # deterministic: no dropout
    assert loss.item() == pytest.approx(plain.item() + sum(0.1 * switch_loss(logits) for logits in seen), rel=1e-6)


def test_moe_balancing_loss_is_logged(tmp_path):
    moe = ["model.ffn={type: moe, experts: 3, top_k: 1, hidden: 32}", "trainer.max_steps=6", "trainer.val_every=6"]
    summary = fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, "trainer.log_every=2", *moe)))
    with open(os.path.join(summary.run_dir, "metrics.csv")) as f:
        logged = [float(r["moe_aux_loss"]) for r in csv.DictReader(f) if r.get("moe_aux_loss")]
    assert len(logged) == 3  # at every log_every-th of the 6 steps


def test_moe_correction_bias_is_updated_once_per_optimizer_step(tmp_path, monkeypatch):
    """DeepSeek-V3's bias update runs once per optimizer step (Task.on_before_optimizer_step), not
    once per accumulated micro-batch, and moves the saved correction bias."""
    from tfbuilder.model.components.moe import MixtureOfExperts

    calls = []
    balance = MixtureOfExperts.balance
    def counted(self, load):
        calls.append(load.sum().item())
        balance(self, load)

    monkeypatch.setattr(MixtureOfExperts, "balance", counted)
    moe = ["model.ffn={type: moe, experts: 4, top_k: 2, hidden: 32, router: sigmoid, correction_bias: true, "
           "bias_update: 0.125}", "model.encoder.layers=1", "model.decoder.layers=1", "optim.accumulate=2",
           "trainer.max_steps=3", "trainer.val_every=3"]
    summary = fit(tfbuilder.load_recipe(QUICKSTART, small(tmp_path, *moe)))
    assert len(calls) == 3 * 2  # three steps, two layers (encoder and decoder)
    assert all(c > 0 for c in calls)  # each a step's routed tokens (two micro-batches)
    state = model_state(read_checkpoint(os.path.join(summary.run_dir, "checkpoints", "last.ckpt")))
    biases = [v for k, v in state.items() if k.endswith("correction_bias")]
    assert len(biases) == 2 and any(b.abs().sum() > 0 for b in biases)


@pytest.mark.parametrize("recipe_name", ["decoder-lm.yaml", "encoder-mlm.yaml"])
def test_language_model_recipes_train_on_monolingual_text(tmp_path, recipe_name, capsys):
    data = tmp_path / "text"
    data.mkdir()
    lines = [f"a person number {i} walks a dog in the park" for i in range(300)]
    for split in ("train", "val"):
        (data / f"{split}.en").write_text("\n".join(lines) + "\n")
    overrides = [
        *text_folder(data),
        "data.tokenizer.vocab_size=300",
        "model.d_model=32",
        "model.attention.key_dim=8",
        "model.attention.value_dim=8",
        "trainer.max_steps=4",
        "trainer.val_every=2",
        f"trainer.output={tmp_path / 'runs'}",
        "trainer.progress=false",
    ]
    summary = fit(tfbuilder.load_recipe(ROOT / "recipes" / recipe_name, overrides))
    assert summary.steps == 4 and summary.best_val_loss is not None and math.isfinite(summary.best_val_loss)
    if recipe_name.startswith("decoder"):
        assert main(["generate", summary.run_dir, "--prompt", "a person", "--max-new", "5", "--temperature", "0"]) == 0
        assert capsys.readouterr().out.strip() != ""
    else:
        assert main(["test", summary.run_dir, "--split", "val"]) == 0
        assert "perplexity" in capsys.readouterr().out


def test_validation_bleu_is_logged_and_is_the_checkpoints_score(tmp_path):
    import sacrebleu

    from tfbuilder.inference.translate import translate

    words = ["haus", "baum", "hund", "katze", "auto", "buch"]
    en = {"haus": "house", "baum": "tree", "hund": "dog", "katze": "cat", "auto": "car", "buch": "book"}
    src = [f"ein {words[i % 6]} und ein {words[i // 6 % 6]}" for i in range(300)]
    tgt = [f"a {en[words[i % 6]]} and a {en[words[i // 6 % 6]]}" for i in range(300)]
    files = {"train.de": src, "train.en": tgt, "val.de": src[:40], "val.en": tgt[:40]}
    tiny = ["model.d_model=64", "model.ffn.hidden=128", "model.attention.heads=4", "model.encoder.layers=1", "model.decoder.layers=1"]
    schedule = ["optim.schedule.type=constant", "optim.schedule.warmup=20", "optim.lr=3e-3", "model.dropout=0.0"]
    recipe = parallel_recipe(
        tmp_path, files, *tiny, *schedule, "trainer.max_steps=150", "trainer.val_every=75",
        "trainer.val_bleu=25", "trainer.progress=false",
    )
    summary = fit(recipe)
    logged = [float(r["val_bleu"]) for r in val_metrics(summary.run_dir)]
    assert len(logged) == 2 and summary.last_val_bleu == pytest.approx(logged[-1])
    loaded = load_checkpoint(summary.last_checkpoint)  # the weights of the last validation
    hypotheses = list(translate(loaded.model, loaded.vocab, src[:25], beam=1))
    assert logged[-1] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [tgt[:25]]).score)
    assert logged[-1] > 50, hypotheses[:5]  # learned: a score that can only come from real translations
