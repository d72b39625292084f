"""Learning-rate schedules against their published definitions, and what the optimizer sees in a fit.

- inverse_sqrt: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1
  (Vaswani et al. 2017, sec. 5.3, eq. 3): linear warm-up, a peak at step == warmup, then step^-0.5.
- cosine: linear warm-up to the peak, then eta_min + (eta_max - eta_min) * (1 + cos(pi * t / T)) / 2
  (Loshchilov & Hutter 2017, arXiv:1608.03983, eq. 5), with t counted from the END of warm-up.
- constant: linear warm-up to the peak, then constant.
"""

from __future__ import annotations

import math

import pytest

import tfbuilder
from conftest import ONE_LAYER, QUICKSTART, short_run
from recording import StepRecorder, fit_recording
from tfbuilder.train.schedules import learning_rate
from tfbuilder.spec.sections import ScheduleSection



def rate(type: str, *, d_model: int = 512, lr: float = 1e-3, max_steps: int = 100, **schedule):
    return learning_rate(ScheduleSection(type=type, **schedule), d_model=d_model, lr=lr, max_steps=max_steps)


# --- inverse_sqrt: the paper's formula -----------------------------------------------------------


def test_inverse_sqrt_is_the_papers_formula_at_chosen_steps():
    f = rate("inverse_sqrt", d_model=512, warmup=4000)
    # Written out by hand from eq. 3: 512^-0.5 = 0.044194..., 4000^-1.5 = 3.9528e-6, 4000^-0.5 = 0.015811...
    assert f(1) == pytest.approx(512**-0.5 * 1 * 4000**-1.5, rel=1e-12)
    assert f(1) == pytest.approx(1.7469e-7, rel=1e-4)
    assert f(4000) == pytest.approx(6.9877e-4, rel=1e-4)  # the peak of the base model's schedule
    assert f(16000) == pytest.approx(6.9877e-4 / 2, rel=1e-4)  # step^-0.5: four times the steps, half the rate
    assert f(100_000) == pytest.approx(512**-0.5 * 100_000**-0.5, rel=1e-12)


def test_inverse_sqrt_warms_up_linearly_and_peaks_at_step_warmup():
    d_model, warmup = 64, 10
    f = rate("inverse_sqrt", d_model=d_model, warmup=warmup)
    slope = d_model**-0.5 * warmup**-1.5
    for step in range(1, warmup + 1):
        assert f(step) == pytest.approx(step * slope, rel=1e-12)  # a straight line through 0, from step 1
    values = [f(s) for s in range(1, 5 * warmup)]
    assert values.index(max(values)) + 1 == warmup  # the peak is at step == warmup, not one off
    assert f(warmup) == pytest.approx(d_model**-0.5 * warmup**-0.5, rel=1e-12)
    assert all(a > b for a, b in zip(values[warmup - 1 :], values[warmup:]))  # decays after


def test_inverse_sqrt_scale_multiplies_and_no_warmup_is_step_to_the_minus_half():
    assert rate("inverse_sqrt", d_model=256, warmup=50, scale=2.5)(7) == pytest.approx(2.5 * 256**-0.5 * 7 * 50**-1.5)
    no_warmup = rate("inverse_sqrt", d_model=256, warmup=0)
    assert [no_warmup(s) for s in (1, 4, 9)] == pytest.approx([256**-0.5 / s for s in (1, 2, 3)])


def test_inverse_sqrt_ignores_optim_lr():
    """The paper's schedule sets the rate itself (optim.lr is the peak of the other schedules)."""
    assert rate("inverse_sqrt", lr=1.0, warmup=8)(5) == rate("inverse_sqrt", lr=1e-5, warmup=8)(5)


# --- cosine: warm-up, then decay from the end of warm-up ------------------------------------------


def cosine_reference(step: int, *, lr: float, min_lr: float, warmup: int, max_steps: int) -> float:
    if step <= warmup:
        return lr * step / warmup
    t, T = min(step - warmup, max_steps - warmup), max_steps - warmup
    return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * t / T)) / 2


def test_cosine_warms_up_to_lr_then_decays_from_the_end_of_warmup_to_min_lr():
    lr, min_lr, warmup, max_steps = 2e-3, 1e-4, 10, 110
    f = rate("cosine", lr=lr, warmup=warmup, max_steps=max_steps, min_lr=min_lr)
    assert f(1) == pytest.approx(lr / warmup)
    assert f(5) == pytest.approx(lr / 2)
    assert f(warmup) == pytest.approx(lr)  # the peak, at the end of warm-up
    assert f(warmup + 50) == pytest.approx((lr + min_lr) / 2)  # half-way through the decay: the mean
    assert f(warmup + 25) == pytest.approx(min_lr + (lr - min_lr) * (1 + math.sqrt(0.5)) / 2)
    assert f(max_steps) == pytest.approx(min_lr)
    assert f(max_steps + 40) == pytest.approx(min_lr)  # stays there
    for step in range(1, max_steps + 1):
        assert f(step) == pytest.approx(cosine_reference(step, lr=lr, min_lr=min_lr, warmup=warmup, max_steps=max_steps), rel=1e-12)


def test_cosine_without_warmup_starts_at_lr():
    f = rate("cosine", lr=1e-3, warmup=0, max_steps=100)
    assert f(1) == pytest.approx(1e-3 * (1 + math.cos(math.pi / 100)) / 2)
    assert f(50) == pytest.approx(0.5e-3)


def test_constant_warms_up_then_holds():
    f = rate("constant", lr=3e-3, warmup=4)
    assert [f(s) for s in range(1, 8)] == pytest.approx([0.75e-3, 1.5e-3, 2.25e-3, 3e-3, 3e-3, 3e-3, 3e-3])
    assert rate("constant", lr=3e-3, warmup=0)(1) == 3e-3


# --- what the optimizer sees at step k of a real fit ---------------------------------------------


def tiny_fit(tmp_path, *overrides: str) -> list[str]:
    return short_run(tmp_path, *ONE_LAYER, *overrides, train=200, val=20, longest=6)


@pytest.mark.parametrize(
    "schedule, reference",
    [
        (["optim.schedule={type: inverse_sqrt, warmup: 3, scale: 2.0}"], lambda s: 2.0 * 32**-0.5 * min(s**-0.5, s * 3**-1.5)),
        (["optim.schedule={type: cosine, warmup: 2, min_lr: 1.0e-4}", "optim.lr=1.0e-3"],
         lambda s: cosine_reference(s, lr=1e-3, min_lr=1e-4, warmup=2, max_steps=6)),
        (["optim.schedule={type: constant, warmup: 4}", "optim.lr=1.0e-3"], lambda s: 1e-3 * min(1, s / 4)),
    ],
    ids=["inverse_sqrt", "cosine", "constant"],
)
def test_the_optimizer_steps_with_the_schedules_rate(tmp_path, monkeypatch, schedule, reference):
    recorder = StepRecorder()
    recipe = tfbuilder.load_recipe(QUICKSTART, tiny_fit(tmp_path, *schedule, "trainer.max_steps=6", "trainer.val_every=6"))
    summary = fit_recording(recipe, monkeypatch, recorder)
    assert summary.steps == 6 and recorder.global_steps == list(range(6))
    expected = [reference(step) for step in range(1, 7)]  # optimizer step k (1-based) uses rate(k)
    for group in range(len(recorder.groups)):  # every parameter group follows the schedule
        assert [lrs[group] for lrs in recorder.lrs] == pytest.approx(expected, rel=1e-9)
