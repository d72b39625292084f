"""Property: a recipe composed at random from the registry's types and the schema's fields either fails
``tfbuilder validate`` with exit 2 and positioned problems, or its model builds, runs forward and
backward, and decodes one step. "validate OK" must never be followed by a failure.

A fixed budget (derandomized, 30 examples, tiny widths) keeps it a few seconds long."""

from __future__ import annotations

import re
import types
from typing import Any, Literal, Union, get_args, get_origin

import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfbuilder
from tfbuilder.inference import decoding
from tfbuilder import registry
from tfbuilder.model.builder import build_model
from tfbuilder.cli.commands import main
from tfbuilder.model.sizing import max_positions

PROBLEM_LINE = re.compile(r"^.+?:\d+:\d+: \S")
SMALL_INTS = st.one_of(st.integers(1, 12), st.integers(-1, 40))
FLOATS = st.sampled_from([0.0, 1e-6, 0.1, 0.5, 0.99, 1.0, 1.5, 2.0, 500.0, 10000.0])


def value_for(annotation: Any) -> st.SearchStrategy:
    """Values for a params field: mostly plausible, sometimes out of range or of the wrong kind."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return st.one_of(*(value_for(a) for a in get_args(annotation)))
    if origin is Literal:
        return st.one_of(st.sampled_from(get_args(annotation)), st.just("nonsense"))
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return SMALL_INTS
    if annotation is float:
        return FLOATS
    return st.just(None)


def component(family: str) -> st.SearchStrategy:
    def params(name: str) -> st.SearchStrategy:
        fields = registry.get(family, name).params.model_fields
        optional = {k: value_for(f.annotation) for k, f in fields.items() if k != "type"}
        return st.fixed_dictionaries({"type": st.just(name)}, optional=optional)

    names = registry.types(family)
    return st.one_of(st.sampled_from(names), st.sampled_from(names).flatmap(params))


@st.composite
def recipes(draw) -> dict:
    kind = draw(st.sampled_from(["encoder_decoder", "decoder", "encoder"]))
    model: dict[str, Any] = {"kind": kind, "vocab_size": draw(st.integers(8, 40)), "dropout": 0.0}
    model["d_model"] = draw(st.sampled_from([8, 12, 16, 15, 24]))
    model["placement"] = draw(st.sampled_from(["post", "pre", "sandwich"]))
    for family in registry.FAMILIES:
        if draw(st.booleans()):
            model[family] = draw(component(family))
    parts = {"encoder_decoder": ("encoder", "decoder"), "decoder": ("decoder",), "encoder": ("encoder",)}[kind]
    for part in parts:
        stack: dict[str, Any] = {"layers": draw(st.integers(1, 2))}
        if draw(st.integers(0, 3)) == 0:  # a per-stack override, heads and all
            stack["attention"] = draw(component("attention"))
        model[part] = stack
    for key in ("final_norm", "tie_output", "share_embeddings"):
        if draw(st.booleans()):
            model[key] = draw(st.booleans())
    return {"name": "property", "model": model}


def step(recipe: tfbuilder.Recipe) -> None:
    """Build, forward and backward on a small batch, and decode one step."""
    torch.manual_seed(0)
    model = build_model(recipe)
    spec = recipe.model
    limit = max_positions(spec)
    n = max(1, min(5, (limit or 5) - 1))
    ids = torch.randint(5, spec.vocab_size, (2, n))
    logits = model(ids, ids) if spec.kind == "encoder_decoder" else model(ids)
    assert logits.shape == (2, n, spec.vocab_size)
    assert torch.isfinite(logits).all()
    logits.float().square().mean().backward()
    model.eval()
    if spec.kind == "encoder_decoder":
        out = decoding.greedy(model, ids, max_len_a=0.0, max_len_b=1)
        assert len(out) == 2 and all(len(o) <= 1 for o in out)
    elif spec.kind == "decoder":
        out = decoding.sample(model, ids, max_new=1, temperature=0.0)
        assert len(out) == 2 and all(len(o) <= 1 for o in out)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=recipes())
def test_validate_ok_means_the_model_builds_steps_and_decodes(data, tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    try:
        rc = main(["validate", str(path)])
    except SystemExit as exc:  # never expected: validate has no usage errors here
        rc = exc.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert rc in (0, 2), captured.err
    if rc == 2:
        lines = captured.err.splitlines()
        assert lines and all(PROBLEM_LINE.match(line) for line in lines), captured.err
        return
    step(tfbuilder.load_recipe(path))
