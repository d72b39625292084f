"""Every tensor the model, the losses and decoding make is made on the model's device.

Without a GPU this is checked by watching tensor factories: inside tfbuilder's model, objective and
decoding code, a factory (``torch.arange``, ``torch.zeros``, ``torch.tensor`` ...) called without
``device=`` would make a CPU tensor next to a GPU model. Tests marked ``gpu`` run the same paths on
CUDA wherever it is present.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import tfbuilder
from conftest import MEASURE_BUSY_CORES, tiny_model
from test_components import KINDS
from tfbuilder.inference import decoding
from tfbuilder import devices
from tfbuilder.errors import TfbuilderError
from tfbuilder.train.objectives import objective
from tfbuilder.spec.recipe import Recipe

PACKAGE = Path(tfbuilder.__file__).parent
FACTORIES = {
    torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor, torch.as_tensor,
    torch.rand, torch.randn, torch.randint, torch.eye, torch.linspace,
}  # fmt: skip


class FactoryWatch(TorchFunctionMode):
    """Records tfbuilder lines (outside data/, which builds host-side batches) that call a tensor
    factory without ``device=``."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs:
            frame = sys._getframe(1)
            while frame is not None:
                path = Path(frame.f_code.co_filename)
                if PACKAGE in path.parents:
                    if "data" not in path.relative_to(PACKAGE).parts:
                        self.found.append(f"{path.relative_to(PACKAGE)}:{frame.f_lineno} {func.__name__}")
                    break
                frame = frame.f_back
        return func(*args, **kwargs)


def _model(kind: str, **changes):
    spec = tiny_model(kind=kind, **KINDS[kind])
    spec.update(changes)
    recipe = Recipe.model_validate({"model": spec})
    return recipe, tfbuilder.build_model(recipe)


COMPONENTS = [
    {},
    {"position": {"type": "rotary", "max_len": 4}},  # also past the cached table
    {"position": {"type": "alibi"}},
    {"position": {"type": "relative_bias"}},
    {"position": {"type": "sinusoidal", "max_len": 4}},
    {"attention": {"type": "multihead", "heads": 4, "window": 3, "qk_norm": True}},
    {"ffn": {"type": "moe"}},
    {"ffn": {"type": "moe", "capacity_factor": 1.0}},
]


@pytest.mark.parametrize("changes", COMPONENTS, ids=lambda c: "-".join(v["type"] for v in c.values()) or "default")
@pytest.mark.parametrize("kind", list(KINDS))
def test_training_objective_makes_no_tensor_off_the_models_device(kind, changes):
    recipe, model = _model(kind, **changes)
    ids = torch.randint(5, 53, (3, 8))
    ids[0, 5:] = 0
    batch = {"src": ids, "tgt_in": ids, "tgt_out": ids, "tokens": ids}
    with FactoryWatch() as watch:
        objective(recipe, epsilon=0.1)(model.train(), batch).loss.backward()
    assert not watch.found, watch.found


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_translation_search_makes_no_tensor_off_the_models_device(search):
    _, model = _model("encoder_decoder", position={"type": "rotary", "max_len": 4})
    src = torch.randint(5, 53, (3, 6))
    src[1, 3:] = 0
    with FactoryWatch() as watch:
        if search == "greedy":
            decoding.greedy(model, src, max_len_b=6)
        else:
            decoding.beam_search(model, src, beam=3, max_len_b=6)
    assert not watch.found, watch.found


def test_sampling_makes_no_tensor_off_the_models_device():
    _, model = _model("decoder")
    with FactoryWatch() as watch:
        decoding.sample(model, torch.randint(5, 53, (2, 3)), max_new=5, top_k=5, top_p=0.9)
    _, model = _model("encoder_decoder")
    with FactoryWatch() as watch2:
        decoding.sample_translations(model, torch.randint(5, 53, (2, 4)), n=3, top_k=5, max_len_b=5)
        decoding.beam_search_nbest(model, torch.randint(5, 53, (2, 4)), beam=3, nbest=2, max_len_b=5)
    assert not watch.found and not watch2.found, watch.found + watch2.found


def test_gpus_are_chosen_by_index_and_threads_by_idle_cores(monkeypatch):
    from pydantic import ValidationError

    from tfbuilder.spec.sections import TrainerSection

    assert TrainerSection.model_validate({"devices": [1]}).devices == [1]
    assert devices.count([0, 2], gpu=True) == 2 and devices.count(3, gpu=False) == 3 and devices.count("auto", gpu=False) == 1
    with pytest.raises(ValidationError, match="names a device twice"):
        TrainerSection.model_validate({"devices": [0, 0]})
    with pytest.raises(ValidationError):
        TrainerSection.model_validate({"devices": [-1]})
    # auto: the usable cores minus the cores others keep busy, at least one.
    monkeypatch.setattr(devices, "usable_cores", lambda: 8)
    for busy, want in ((0.0, 8), (2.6, 5), (7.9, 1), (30.0, 1)):
        monkeypatch.setattr(devices, "busy_cores", lambda busy=busy: busy)
        assert devices.threads("auto") == want
    assert devices.threads(3) == 3


def stat(user: int, nice: int, system: int, idle: int, iowait: int, irq: int = 0, softirq: int = 0, steal: int = 0,
         guest: int = 0, guest_nice: int = 0) -> str:
    """The text of /proc/stat as proc(5) lays it out: the whole machine's line, then one per core."""
    fields = (user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice)
    return "cpu  " + " ".join(map(str, fields)) + "\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 12345\n"


def readings(*texts: str):
    """A /proc/stat that gives ``texts`` in turn, and a sleep that records when it was called."""
    calls: list[str] = []
    pending = list(texts)

    def read() -> str:
        calls.append("read")
        return pending.pop(0)

    return read, lambda seconds: calls.append(f"sleep {seconds}"), calls


def test_busy_cores_is_the_busy_share_between_two_readings_times_the_cores():
    # proc(5): busy = 1 - (delta idle + delta iowait) / delta(user+nice+system+idle+iowait+irq+softirq+steal);
    # guest time is already counted in user and nice. Here: 400 jiffies passed, 100 of them idle, 20 iowait.
    before = stat(1000, 10, 300, 5000, 40, 5, 5, 0, guest=70)
    after = stat(1000 + 150, 10 + 10, 300 + 100, 5000 + 100, 40 + 20, 5 + 10, 5 + 5, 0 + 5, guest=70 + 150)
    read, sleep, calls = readings(before, after)
    assert MEASURE_BUSY_CORES(0.3, read_stat=read, sleep=sleep, cpus=4) == pytest.approx((1 - 120 / 400) * 4)
    assert calls == ["read", "sleep 0.3", "read"]  # this process sleeps between the readings


def test_busy_cores_counts_only_the_interval_not_past_work():
    """Work done before the call (a test run, a notebook cell) is in both readings and cancels."""
    past = stat(9_000_000, 0, 1_000_000, 10, 0)  # the machine has been all but busy until now
    read, sleep, _ = readings(past, stat(9_000_000, 0, 1_000_000, 10 + 200, 0))
    assert MEASURE_BUSY_CORES(read_stat=read, sleep=sleep, cpus=2) == 0.0
    read, sleep, _ = readings(past, stat(9_000_000 + 100, 0, 1_000_000, 10 + 100, 0))  # one of two cores busy
    assert MEASURE_BUSY_CORES(read_stat=read, sleep=sleep, cpus=2) == pytest.approx(1.0)
    read, sleep, _ = readings(past, past)  # no time passed: nothing is known to be busy
    assert MEASURE_BUSY_CORES(read_stat=read, sleep=sleep, cpus=2) == 0.0


def test_busy_cores_without_proc_stat_falls_back_to_the_load_average(monkeypatch):
    def missing() -> str:
        raise FileNotFoundError("/proc/stat")

    monkeypatch.setattr(devices.os, "getloadavg", lambda: (1.5, 0.7, 0.2))
    assert MEASURE_BUSY_CORES(read_stat=missing, sleep=lambda s: None, cpus=2) == 1.5
    assert MEASURE_BUSY_CORES(read_stat=lambda: "garbage", sleep=lambda s: None, cpus=2) == 1.5


def test_auto_threads_are_the_idle_cores_of_the_readings(monkeypatch):
    """trainer.threads auto end to end on a fake machine: 4 usable cores, 2.6 kept busy by others."""
    read, sleep, _ = readings(stat(0, 0, 0, 0, 0), stat(260, 0, 0, 140, 0))
    monkeypatch.setattr(devices, "busy_cores", lambda: MEASURE_BUSY_CORES(read_stat=read, sleep=sleep, cpus=4))
    monkeypatch.setattr(devices, "usable_cores", lambda: 4)
    assert devices.threads("auto") == 1  # round(4 - 2.6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gives")
def test_gpu_indices_on_a_cpu_are_a_clear_error(tmp_path):
    from conftest import ROOT
    from tfbuilder.train.fit import fit

    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "quickstart.yaml", [f"trainer.output={tmp_path}", "trainer.devices=[1]"])
    with pytest.raises(TfbuilderError, match=r"trainer.devices \[1\] names GPUs by index, but training runs on the CPU"):
        fit(recipe)
    assert not any(tmp_path.iterdir())  # refused before any run directory exists


def test_the_watch_sees_a_factory_without_device():
    """The check above can fail: a factory without device= in tfbuilder code is reported."""
    from tfbuilder.model.components import position

    with FactoryWatch() as watch:
        position.alibi_slopes(4)
    assert watch.found and "components/position.py" in watch.found[0]


def test_devices_that_are_not_there_are_clear_errors():
    assert devices.resolve("cpu") == torch.device("cpu")
    assert devices.resolve(None) == devices.default_device()
    for bad in ("gpu0", "tpu"):
        with pytest.raises(TfbuilderError, match="--device"):
            devices.resolve(bad)
    if not torch.cuda.is_available():
        with pytest.raises(TfbuilderError, match="no CUDA GPU"):
            devices.resolve("cuda:1")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(KINDS))
def test_training_step_on_cuda_matches_the_cpu(kind):
    recipe, model = _model(kind)
    ids = torch.randint(5, 53, (3, 8))
    ids[0, 5:] = 0
    batch = {"src": ids, "tgt_in": ids, "tgt_out": ids, "tokens": ids}
    fn = objective(recipe, epsilon=0.1)
    torch.manual_seed(0)
    cpu = fn(model.eval(), batch)
    gpu_model = model.to("cuda")
    torch.manual_seed(0)
    gpu = fn(gpu_model, {k: v.cuda() for k, v in batch.items()})
    if kind != "encoder":  # the masked LM draws its masks on each device's generator
        torch.testing.assert_close(gpu.loss.cpu(), cpu.loss, rtol=1e-4, atol=1e-4)
    gpu.loss.backward()


@pytest.mark.gpu
def test_decoding_on_cuda_matches_the_cpu():
    _, model = _model("encoder_decoder")
    src = torch.randint(5, 53, (4, 6))
    src[1, 3:] = 0
    tgt = torch.randint(5, 53, (4, 5))
    on_cpu = decoding.incremental_logits(model.eval(), tgt, src)
    gpu_model = model.to("cuda")
    # Random weights give near-ties, so compare the cached step logits rather than the chosen tokens.
    torch.testing.assert_close(decoding.incremental_logits(gpu_model, tgt.cuda(), src.cuda()).cpu(), on_cpu, rtol=1e-4, atol=1e-4)
    hyps = decoding.beam_search(gpu_model, src.cuda(), beam=3, max_len_b=6)
    assert len(hyps) == 4 and all(isinstance(i, int) for h in hyps for i in h)
