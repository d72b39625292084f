"""Generated over the registry: every registered type, in every model kind, has the model properties.

A new component is covered here the day it registers, with no test written for it by hand; its
params must build with their defaults inside TINY_MODEL.
"""

from __future__ import annotations

import pytest
import torch

import tfbuilder
from conftest import tiny_model
from properties import PROPERTIES
from tfbuilder import registry
from tfbuilder.spec.recipe import ModelSection, json_schema

KINDS = {
    "encoder_decoder": {},
    "decoder": {"encoder": None},
    "encoder": {"decoder": None},
}
CASES = [
    pytest.param(family, name, kind, prop, id=f"{family}-{name}-{kind}-{prop}")
    for family in registry.FAMILIES
    for name in registry.types(family)
    for kind in KINDS
    for prop in PROPERTIES
    if not (prop == "causal" and kind == "encoder")
]


def build(family: str, name: str, kind: str) -> torch.nn.Module:
    spec = tiny_model(kind=kind, **KINDS[kind])
    spec[family] = {"type": name}
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


@pytest.mark.parametrize("family, name, kind, prop", CASES)
def test_component_properties(family, name, kind, prop):
    model = build(family, name, kind)
    PROPERTIES[prop](model, vocab=tiny_model()["vocab_size"])


@pytest.mark.parametrize("family", registry.FAMILIES)
def test_every_family_has_documented_members_and_the_recipe_schema_shows_their_params(family):
    """Registration insists that every params field is described; here, that each type has a
    docstring and that those descriptions reach the JSON Schema editors check recipes with."""
    entries = registry.entries(family)
    assert entries
    slot = json_schema()["$defs"]["ModelSection"]["properties"][family]
    members = {m["properties"]["type"].get("const", m["properties"]["type"].get("default")): m for m in slot["anyOf"] if "properties" in m}
    for entry in entries:
        assert entry.doc, f"{family}/{entry.name} needs a docstring citing its source"
        shown = members[entry.name]["properties"]
        for field_name, field in entry.params.model_fields.items():
            if field_name != "type":
                assert shown[field_name]["description"] == field.description, f"{family}/{entry.name}.{field_name}"


def test_encoder_is_bidirectional():
    """The encoder-only kind sees the future: the complement of the causal property."""
    model = build("attention", "multihead", "encoder")
    tokens = torch.randint(1, 53, (2, 6))
    changed = tokens.clone()
    changed[:, -1] = changed[:, -1] % 52 + 1
    assert not torch.allclose(model(tokens)[:, 0], model(changed)[:, 0])


@pytest.mark.parametrize("position", ["relative_bias", "alibi", "rotary"])
def test_a_stack_may_have_its_own_heads_and_positions_follow_it(position):
    """Positions acting inside attention take the heads and key width of the stack they feed."""
    spec = tiny_model(position={"type": position})
    spec["decoder"] = {"layers": 2, "attention": {"type": "multihead", "heads": 2, "key_dim": 6, "value_dim": 8}}
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    src, tgt = torch.randint(1, 53, (2, 7)), torch.randint(1, 53, (2, 5))
    assert model(src, tgt).shape == (2, 5, 53)
    for embed, heads, key_dim in ((model.src_embed, 4, 8), (model.tgt_embed, 2, 6)):  # 32 / 4 = 8; the decoder's own 6
        if position == "relative_bias":
            assert embed.position.table.embedding_dim == heads
        elif position == "alibi":
            assert embed.position.slopes.shape == (heads,)
        else:
            assert embed.position.cos.shape[1] == key_dim
