"""trainer.strategy: fsdp (FSDP2, one shard per process) and trainer.activation_checkpointing.

Two real CPU processes joined by gloo show that every layer is sharded, that the checkpoint is a folder
of shards that every command reads in one process, and that a resume continues where an uninterrupted
run would be; the wrapping, the precision policy and activation checkpointing are checked in one process.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import QUICKSTART, ddp_env, short_run, tiny_model

import tfbuilder
from tfbuilder.cli.commands import main
from tfbuilder.model.builder import build_model
from tfbuilder.runs import sharded
from tfbuilder.runs.checkpoints import CheckpointError, load_checkpoint, model_state, read_checkpoint
from tfbuilder.train import sharding

pytestmark = pytest.mark.xdist_group("fsdp")

ONE_LAYER = [
    "model.d_model=32",
    "model.attention.heads=2",
    "model.ffn.hidden=32",
    "model.encoder.layers=2",
    "model.decoder.layers=1",
]

# `tfbuilder fit` that also saves, per rank, the full weights gathered from the shards, each parameter's
# local (shard) and full shape, which modules are FSDP units, and whether the output head is still
# the embedding's parameter (Lightning starts the other rank by running this same file again).
DRIVER = """
import os, sys
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from tfbuilder.train.task import Task
from tfbuilder.cli.commands import main

train_end = Task.on_train_end
def record(self):
    train_end(self)
    model = self.model
    params = dict(model.named_parameters())
    state = {
        "full": {k: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu() for k, p in params.items()},
        "local": {k: tuple(p.to_local().shape) for k, p in params.items() if isinstance(p, DTensor)},
        "shape": {k: tuple(p.shape) for k, p in params.items()},
        "units": sorted(n for n, m in model.named_modules() if isinstance(m, FSDPModule)),
        "tied": model.head.weight is model.tgt_embed.tokens.weight,
    }
    torch.save(state, os.path.join(os.environ["WEIGHTS_DIR"], f"rank-{self.global_rank}.pt"))
Task.on_train_end = record
sys.exit(main(sys.argv[1:]))
"""


def overrides(tmp_path, *more: str) -> list[str]:
    return short_run(
        tmp_path,
        *ONE_LAYER,
        "trainer.strategy=fsdp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "trainer.threads=1",
        "trainer.val_every=2",
        "trainer.keep_last=2",
        "model.dropout=0.1",
        "data.max_tokens=200",
        *more,
        train=1000,
        val=100,
    )


def fsdp_fit(tmp_path, args: list[str], weights) -> subprocess.CompletedProcess:
    driver = tmp_path / "fsdp_driver.py"
    driver.write_text(DRIVER)
    weights.mkdir(exist_ok=True)
    env = ddp_env(WEIGHTS_DIR=str(weights))
    env.pop("TFBUILDER_CACHE", None)
    proc = subprocess.run(
        [sys.executable, str(driver), *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def sets(values: list[str]) -> list[str]:
    return sum((["--set", v] for v in values), [])


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """A 4-step fit under fsdp on two CPU processes: (its run directory, what each rank recorded, stdout)."""
    tmp = tmp_path_factory.mktemp("fsdp")
    proc = fsdp_fit(tmp, ["fit", str(QUICKSTART), *sets(overrides(tmp, "trainer.max_steps=4"))], tmp / "w")
    run = next((tmp / "runs" / "quickstart").iterdir())
    ranks = [torch.load(tmp / "w" / f"rank-{r}.pt", weights_only=True) for r in (0, 1)]
    return run, ranks, proc.stdout


def test_fsdp_on_two_cpu_processes_shards_every_layer_and_ranks_agree(fsdp_run):
    run, ranks, stdout = fsdp_run
    assert re.search(r"^ranks agree +yes$", stdout, re.M), stdout
    for rank in ranks:
        # One unit per encoder and decoder layer, and the root.
        assert rank["units"] == ["", "decoder.layers.0", "encoder.layers.0", "encoder.layers.1"]
        assert rank["tied"]  # the output head is still the embedding's parameter
        # Every parameter is a DTensor whose local piece holds about half of its first dimension.
        assert rank["local"].keys() == rank["shape"].keys()
        for name, full in rank["shape"].items():
            assert rank["local"][name][0] == (full[0] + 1) // 2 or rank["local"][name][0] == full[0] // 2, name
            assert rank["local"][name][1:] == full[1:]
    assert all(torch.equal(ranks[0]["full"][k], ranks[1]["full"][k]) for k in ranks[0]["full"])
    last = run / "checkpoints" / "last.ckpt"
    assert last.is_dir() and {p.name for p in last.iterdir()} == {
        ".metadata",
        "meta.pt",
        "__0_0.distcp",
        "__1_0.distcp",
    }
    kept = (run / "checkpoints").iterdir()  # (averaged.ckpt too once the average test has run)
    assert sorted(p.name for p in kept if p.name != "averaged.ckpt") == [
        "best.ckpt",
        "last.ckpt",
        "step-00000002.ckpt",
        "step-00000004.ckpt",
    ]


def test_a_sharded_checkpoint_loads_in_one_process_with_the_full_weights(fsdp_run):
    run, ranks, _ = fsdp_run
    data = read_checkpoint(run / "checkpoints" / "last.ckpt")
    assert data["global_step"] == 4 and data["tfbuilder"]["world_size"] == 2
    assert "optimizer_states" not in data  # the optimizer state stays in the shards, for a resume
    saved = model_state(data)
    full = ranks[0]["full"]
    assert saved.keys() >= full.keys()
    assert all(torch.equal(saved[k], full[k]) for k in full)  # each tensor whole, from both shards
    loaded = load_checkpoint(run, checkpoint="last", device="cpu")
    assert loaded.model.head.weight is loaded.model.tgt_embed.tokens.weight  # tied again
    assert all(torch.equal(loaded.model.state_dict()[k], full[k]) for k in full)


def test_test_average_and_export_read_a_sharded_run(fsdp_run, capsys, tmp_path):
    from safetensors.torch import load_file

    run, ranks, _ = fsdp_run
    assert main(["export", str(run), "--format", "safetensors", "--out", str(tmp_path / "st")]) == 0
    exported = load_file(next((tmp_path / "st").glob("*.safetensors")))
    key = "decoder.layers.0.ffn.inner.ff_out.weight"
    assert torch.equal(exported[key], ranks[0]["full"][key])
    assert main(["test", str(run), "--checkpoint", "last", "--beam", "1"]) == 0
    assert "token accuracy" in capsys.readouterr().out
    assert main(["average", str(run), "--last", "2"]) == 0
    averaged = read_checkpoint(run / "checkpoints" / "averaged.ckpt")
    steps = [model_state(read_checkpoint(run / "checkpoints" / f"step-0000000{n}.ckpt")) for n in (2, 4)]
    key = "encoder.layers.0.ffn.inner.ff_in.weight"
    assert torch.allclose(model_state(averaged)[key], (steps[0][key] + steps[1][key]) / 2)


def test_init_from_a_sharded_checkpoint(fsdp_run, tmp_path):
    run, _, _ = fsdp_run
    recipe = tfbuilder.load_recipe(
        QUICKSTART, short_run(tmp_path, *ONE_LAYER, "trainer.max_steps=2", "trainer.val_every=2", train=300, val=30)
    )
    summary = tfbuilder.fit(recipe, init_from=str(run / "checkpoints" / "last.ckpt"))
    assert summary.history[-1]["kind"] == "init_from" and summary.steps == 2


@pytest.mark.cluster
def test_a_resumed_fsdp_run_ends_where_an_uninterrupted_one_does(fsdp_run, tmp_path):
    """Steps 5-6 after a resume from the sharded step-4 checkpoint (weights and optimizer state from the
    shards) equal steps 5-6 of a run that never stopped: same weights to the last bit."""
    import shutil

    run = tmp_path / "run"  # a copy: the other tests read the original
    shutil.copytree(fsdp_run[0], run)
    resumed = tmp_path / "resumed"
    fsdp_fit(tmp_path, ["fit", "--resume", str(run), "--force", *sets(["trainer.max_steps=6"])], resumed)
    straight = tmp_path / "straight"
    fsdp_fit(tmp_path, ["fit", str(QUICKSTART), *sets(overrides(tmp_path, "trainer.max_steps=6"))], straight)
    a, b = (torch.load(w / "rank-0.pt", weights_only=True)["full"] for w in (resumed, straight))
    assert all(torch.equal(a[k], b[k]) for k in a)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["ranks_agree"] is True


def test_a_damaged_index_or_a_shard_outside_the_folder_is_refused(fsdp_run, tmp_path):
    import pickle
    import shutil

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    run, _, _ = fsdp_run
    copy_ = tmp_path / "copy.ckpt"
    shutil.copytree(run / "checkpoints" / "step-00000002.ckpt", copy_)
    index = sharded.read_index(copy_)
    first = next(iter(index.storage_data))
    # A shard's name that leads out of the folder, to a file that is there (a copy of a real shard).
    shutil.copy(copy_ / index.storage_data[first].relative_path, tmp_path / "outside.distcp")
    index.storage_data[first] = _StorageInfo("../outside.distcp", 0, 8)
    (copy_ / ".metadata").write_bytes(pickle.dumps(index))
    with pytest.raises(CheckpointError, match="not a shard file of its folder"):
        read_checkpoint(copy_)

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    (copy_ / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match="builtins.print is not part of a checkpoint index"):
        read_checkpoint(copy_)


# --- in one process ---------------------------------------------------------------------------------


@pytest.fixture
def one_process_group():
    """A gloo group of one process (in memory: no port, no environment), destroyed afterwards."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def tiny(**changes):
    return build_model(tfbuilder.Recipe.model_validate({"model": tiny_model(**changes)}))


def test_shard_wraps_each_layer_then_the_root_with_float32_reduction(one_process_group):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = tiny(tie_output=True)
    sharding.shard(model, one_process_group, "bf16-mixed")
    units = [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]
    assert units == ["", "encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "decoder.layers.1"]
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert model.head.weight is model.tgt_embed.tokens.weight
    for name in units:
        policy = model.get_submodule(name)._get_fsdp_state()._mp_policy
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)


@pytest.mark.parametrize(
    "precision, param, reduce",
    [
        ("bf16-mixed", torch.bfloat16, torch.float32),
        ("16-mixed", torch.float16, torch.float32),
        ("32-true", None, None),
    ],
)
def test_mixed_precision_computes_in_half_and_reduces_in_float32(precision, param, reduce):
    policy = sharding.mixed_precision(precision)
    assert (policy.param_dtype, policy.reduce_dtype) == (param, reduce)


def loss_and_grads(model, *, seed: int = 0):
    torch.manual_seed(seed)
    src = torch.randint(4, 53, (3, 7))
    tgt = torch.randint(4, 53, (3, 6))
    model.train()
    loss = model(src, tgt).float().logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_activation_checkpointing_changes_neither_loss_nor_gradients(dropout):
    torch.manual_seed(0)
    plain = tiny(dropout=dropout)
    recomputed = copy.deepcopy(plain)
    sharding.checkpoint_activations(recomputed)
    loss, grads = loss_and_grads(plain)
    loss_ac, grads_ac = loss_and_grads(recomputed)
    assert torch.allclose(loss, loss_ac, atol=1e-6)
    assert grads.keys() == grads_ac.keys()
    assert all(torch.allclose(grads[k], grads_ac[k], atol=1e-6) for k in grads)
    assert plain.state_dict().keys() == recomputed.state_dict().keys()  # parameter names unchanged


def test_activation_checkpointing_recomputes_each_layer_in_the_backward():
    torch.manual_seed(0)
    model = tiny()
    sharding.checkpoint_activations(model)
    calls = []
    for name, block in ((n, m) for n, m in model.named_modules() if isinstance(m, sharding.BLOCKS)):
        block.ffn.register_forward_pre_hook(lambda *_, name=name: calls.append(name))
    loss_and_grads(model)
    assert len(calls) == 2 * 4  # four layers, each run in the forward and again in the backward
    calls.clear()
    with torch.no_grad():
        model.eval()
        model(torch.randint(4, 53, (1, 5)), torch.randint(4, 53, (1, 4)))
    assert len(calls) == 4  # evaluation: once


def test_the_recipe_switches_activation_checkpointing_on():
    from tfbuilder.train.task import Task

    recipe = tfbuilder.load_recipe(QUICKSTART, [*ONE_LAYER, "trainer.activation_checkpointing=true"])
    model = build_model(recipe)
    Task(recipe, model, "{}").configure_model()
    assert all("forward" in vars(block) for block in sharding.blocks(model))
    off = build_model(tfbuilder.load_recipe(QUICKSTART, ONE_LAYER))
    Task(
        recipe.model_copy(update={"trainer": recipe.trainer.model_copy(update={"activation_checkpointing": False})}),
        off,
        "{}",
    ).configure_model()
    assert not any("forward" in vars(block) for block in sharding.blocks(off))


@pytest.mark.gpu
def test_fsdp_bf16_on_a_cuda_gpu(tmp_path):
    """One GPU: FSDP2 with bf16 compute and float32 reduction trains, and its checkpoint loads."""
    recipe = tfbuilder.load_recipe(
        QUICKSTART,
        short_run(
            tmp_path,
            *ONE_LAYER,
            "trainer.strategy=fsdp",
            "trainer.devices=1",
            "trainer.accelerator=gpu",
            "trainer.precision=bf16-mixed",
            "trainer.max_steps=4",
            "trainer.val_every=2",
            "trainer.activation_checkpointing=true",
            train=1000,
            val=100,
        ),
    )
    summary = tfbuilder.fit(recipe)
    assert summary.steps == 4
    loaded = load_checkpoint(summary.run_dir, checkpoint="last", device="cpu")
    assert (sharded.is_sharded(loaded.path)) and loaded.step == 4


def test_a_sharded_checkpoint_left_half_written_is_cleared_like_a_temporary_file(tmp_path):
    from tfbuilder import atomic

    left = atomic.temp_path(tmp_path / "step-00000002.ckpt")
    left.mkdir()
    (left / "__0_0.distcp").write_bytes(b"part")
    assert atomic.remove_temporaries(tmp_path) == [left] and not left.exists()


@pytest.mark.cluster
def test_a_resume_from_an_older_sharded_checkpoint_sets_the_later_ones_aside(fsdp_run, tmp_path):
    """Resuming from step 2 moves the step-4 folder, and best.ckpt and last.ckpt that held step 4, into
    abandoned/from-step-2/, whole; the run then trains steps 3-4 again."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fsdp_run[0], run)
    (run / "checkpoints" / "averaged.ckpt").unlink(missing_ok=True)
    older = run / "checkpoints" / "step-00000002.ckpt"
    fsdp_fit(tmp_path, ["fit", "--resume", str(older), "--force", *sets(["trainer.max_steps=4"])], tmp_path / "w")
    aside = run / "abandoned" / "from-step-2" / "checkpoints"
    assert sorted(p.name for p in aside.iterdir()) == ["best.ckpt", "last.ckpt", "step-00000004.ckpt"]
    assert read_checkpoint(aside / "step-00000004.ckpt")["global_step"] == 4
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 4  # trained again


@pytest.mark.cluster
def test_a_sharded_run_of_two_processes_continues_on_one(fsdp_run, tmp_path):
    """The shards of 2 processes are read into the one shard of 1 (torch.distributed.checkpoint reshards
    on load); the global data position carries the run on from the first batch no process trained."""
    import shutil

    run = tmp_path / "run"  # a copy: the other tests read the original
    shutil.copytree(fsdp_run[0], run)
    one = tmp_path / "one"
    resume = ["fit", "--resume", str(run), "--force", *sets(["trainer.max_steps=6", "trainer.devices=1"])]
    fsdp_fit(tmp_path, resume, one)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6
    state = read_checkpoint(run / "checkpoints" / "last.ckpt")
    assert state["global_step"] == 6 and state["tfbuilder"]["world_size"] == 1
    weights = torch.load(one / "rank-0.pt", weights_only=True)["full"]
    assert all(torch.isfinite(w).all() for w in weights.values())
