"""Generated over every file in recipes/: each validates, builds, has the model properties, and is what it says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
import yaml

import tfbuilder
from conftest import RECIPES, ROOT
from properties import PROPERTIES
from tfbuilder.cli.commands import main
from tfbuilder.spec.recipe import json_schema
from tfbuilder.spec.sources import load_source

IDS = [str(p.relative_to(ROOT / "recipes")) for p in RECIPES]


def shrunk(path) -> tfbuilder.Recipe:
    """The recipe at a size a unit test can run: fewer layers, narrower, small vocabulary; its kind
    and component types unchanged."""
    full = tfbuilder.load_recipe(path)
    spec = full.model
    overrides = ["model.d_model=64", "model.dropout=0.0"]
    if full.data is None:
        overrides.append("model.vocab_size=61")
    elif full.data.tokenizer.vocab_size:  # the data decides the vocabulary (synthetic ones are small already)
        overrides += ["data.tokenizer.vocab_size=61", "model.vocab_size=61"]  # a recipe may state both (an imported model's)
    if spec.src_vocab_size:
        overrides.append("model.src_vocab_size=61")
    for part in ("encoder", "decoder"):
        if getattr(spec, part) is not None:
            overrides.append(f"model.{part}.layers=1")
    heads = getattr(spec.attention, "heads", 1)
    if 64 % heads and getattr(spec.attention, "key_dim", None) is None:  # e.g. GPT-2's and BERT's 12 heads
        overrides.append("model.attention.heads=4")
    if getattr(spec.ffn, "hidden", None):
        overrides.append("model.ffn.hidden=96")
    return tfbuilder.load_recipe(path, overrides=overrides)


def model_key(recipe: tfbuilder.Recipe) -> str:
    return json.dumps(recipe.to_dict()["model"], sort_keys=True)


def distinct_models(resolve) -> list:
    """One (path, id) per distinct model section among the recipes (``resolve(path)`` gives the recipe
    whose model counts), named by the first recipe file that has it: many files differ only in what
    they train on or how (Table 3's rows D and the multi30k studies share models)."""
    first: dict[str, tuple] = {}
    for path, name in zip(RECIPES, IDS):
        first.setdefault(model_key(resolve(path)), (path, name))
    return list(first.values())


FULL_MODELS = distinct_models(tfbuilder.load_recipe)
SHRUNK_MODELS = distinct_models(shrunk)


@pytest.fixture(scope="module")
def schema_validator():
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)  # once, not once per recipe
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_recipe_file_validates_round_trips_and_satisfies_the_json_schema(path, schema_validator, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # from any working directory: its paths are relative to the recipe file
    recipe = tfbuilder.load_recipe(path)
    if recipe.data is not None and recipe.data.path is not None:
        assert Path(recipe.data.path).is_absolute() and Path(recipe.data.path).is_relative_to(ROOT), recipe.data.path
    # The resolved recipe (what `show` prints and checkpoints keep) is itself a valid, equal recipe.
    assert tfbuilder.Recipe.model_validate(recipe.to_dict()).to_dict() == recipe.to_dict()
    schema_validator.validate(load_source(path).data)


@pytest.mark.parametrize("path", [p for p, _ in FULL_MODELS], ids=[i for _, i in FULL_MODELS])
def test_model_builds_at_full_size_with_the_analytic_parameter_count(path):
    recipe = tfbuilder.load_recipe(path)
    with torch.device("meta"):
        model = tfbuilder.build_model(recipe)
    assert model.kind == recipe.model.kind
    assert tfbuilder.count_parameters(model) == analytic_parameters(recipe.model)


# An encoder is bidirectional by design, so it has no causality case (test_components checks the opposite).
PROPERTY_CASES = [
    pytest.param(path, prop, id=f"{name}-{prop}")
    for path, name in SHRUNK_MODELS
    for prop in PROPERTIES
    # nor has a sequence head (its one output per text reads every position)
    if not (prop == "causal" and (tfbuilder.load_recipe(path).model.kind == "encoder" or tfbuilder.load_recipe(path).model.head is not None))
]


@pytest.mark.parametrize("path, prop", PROPERTY_CASES)
def test_recipe_model_properties(path, prop):
    recipe = shrunk(path)
    model = tfbuilder.build_model(recipe).eval()
    PROPERTIES[prop](model, vocab=recipe.model.vocab_size, src_vocab=recipe.model.src_vocab_size)


@pytest.mark.parametrize("path", [p for p, _ in FULL_MODELS], ids=[i for _, i in FULL_MODELS])
def test_show_prints_the_module_counts(path, capsys):
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    total = int(re.search(r"^total parameters: ([\d,]+)$", out, re.M).group(1).replace(",", ""))
    recipe = tfbuilder.load_recipe(path)
    assert total == analytic_parameters(recipe.model)
    # The first-level parts add up to the total (tied weights are counted once, under their owner).
    parts = re.findall(r"^  \w+: \w+ +([\d,]+)", out, re.M)
    assert sum(int(p.replace(",", "")) for p in parts) == total
    # The resolved recipe printed first is itself a valid recipe, equal to the loaded one.
    resolved = yaml.safe_load(out.split("\n# modules")[0])
    assert tfbuilder.Recipe.model_validate(resolved).to_dict() == recipe.to_dict()


def analytic_parameters(spec) -> int:
    """Parameter count written out from the architecture, for every built-in component type."""
    d = spec.d_model

    def attention(p, cross: bool = False) -> int:
        if p.type == "latent":  # DeepSeek-V2: query (latent), key/value latent + shared rotary key, up, out
            h, d_h = p.heads, p.head_dim or d // p.heads
            dv, dc = p.value_dim or d_h, p.kv_rank or 4 * d_h
            r = 0 if cross else (p.rope_dim if p.rope_dim is not None else d_h // 4 * 2)
            widths = [p.q_rank, h * (d_h + r)] if p.q_rank else [h * (d_h + r)]
            inputs = [d, p.q_rank] if p.q_rank else [d]
            widths += [dc + r, h * (d_h + dv), d]
            inputs += [d, dc, h * dv]
            norms = ((p.q_rank or 0) + dc) if p.latent_norm else 0
            return sum(i * w for i, w in zip(inputs, widths)) + norms + (sum(widths) if p.bias else 0)
        if p.type == "differential":  # h heads: queries and keys 2d wide (two halves), values 2d; lambdas, head norm
            h, kv = p.heads, p.kv_heads or p.heads
            half, dv = p.key_dim or d // (2 * h), p.value_dim or d // h
            widths = h * 2 * half + kv * 2 * half + kv * dv
            total = d * widths + h * dv * d + (widths + d if p.bias else 0) + 4 * half + dv
            return total + (1 if p.qk_norm else 0) + d * {"none": 0, "elementwise": h * dv, "headwise": h}[p.gate]
        h, kv = p.heads, p.kv_heads or p.heads
        dk, dv = p.key_dim or d // h, p.value_dim or d // h
        widths = h * dk + kv * dk + kv * dv
        total = d * widths + h * dv * d + (widths if p.bias else 0) + (d if p.bias is True else 0)  # qkv: no output bias
        gates = {"none": 0, "elementwise": h * dv, "headwise": h}[p.gate]  # gated attention's W_theta, no bias
        # a temperature, or two gain vectors: per head (d_k each) or over the whole projections (OLMo 2)
        qk = {None: 0, "l2": 1, "rms": 2 * dk if p.qk_norm_over == "head" else (h + kv) * dk}[p.qk_form]
        return total + qk + d * gates

    def mlp(hidden, bias) -> int:
        return 2 * d * hidden + (hidden + d if bias else 0)

    def ffn(p) -> int:
        if p.type == "mlp":
            return mlp(p.hidden or 4 * d, p.bias)
        if p.type == "moe":  # a router, then mlp experts or gated (three-matrix) ones; shared ones, their gate
            hidden = p.hidden or 4 * d

            def expert(width: int) -> int:
                return mlp(width, p.bias) if p.expert == "mlp" else 3 * d * width + (2 * width + d if p.bias else 0)

            shared = expert(p.shared_hidden or hidden * p.shared_experts) if p.shared_experts else 0
            return d * p.experts + p.experts * expert(hidden) + shared + (d if p.shared_gate else 0)
        hidden = p.hidden or (-(-(8 * d) // 3 // 8) * 8 if p.match_params else 4 * d)  # GLU variants
        return 3 * d * hidden + (2 * hidden + d if p.bias else 0)

    def norm(p) -> int:
        return {"layernorm": d * (2 if getattr(p, "bias", True) else 1), "rmsnorm": d, "scalenorm": 1}[p.type]

    sides = 2 if spec.kind == "encoder_decoder" else 1
    total = spec.vocab_size * d
    if spec.kind == "encoder_decoder" and not spec.share_embeddings:
        total += (spec.src_vocab_size or spec.vocab_size) * d
    if spec.head is not None:  # a sequence head replaces the output: one linear layer to its outputs
        total += d * spec.head.outputs + (spec.head.outputs if spec.head.bias else 0)
        total += d * d + d if spec.head.pooler else 0  # BERT's pooler: a dense layer before it
    elif not spec.tie_output:
        total += spec.vocab_size * d
    if spec.position.type == "learned":
        total += spec.position.max_len * d * sides
    if spec.position.type == "relative_bias":  # one table per side, as wide as the heads of the stack it feeds
        total += sum(spec.position.buckets * spec.self_attention(part).heads for part in ("encoder", "decoder") if getattr(spec, part))
    norms_per_sublayer = 2 if spec.placement == "sandwich" else 1
    for part, sublayers in (("encoder", 2), ("decoder", 3 if spec.kind == "encoder_decoder" else 2)):
        stack = getattr(spec, part)
        if stack is None:
            continue
        attn = stack.attention or spec.attention
        cross = getattr(stack, "cross_attention", None) or attn
        stack_norm = norm(stack.norm or spec.norm)
        per_layer = attention(attn) + ffn(stack.ffn or spec.ffn) + sublayers * norms_per_sublayer * stack_norm
        if spec.block == "parallel" and spec.parallel_norms == "shared":  # the branches share one input norm
            per_layer -= stack_norm
        if sublayers == 3:
            per_layer += attention(cross, cross=True)
        total += stack.layers * per_layer + (stack_norm if spec.uses_final_norm else 0)
        for i in stack.overrides:  # a layer whose feed-forward differs (DeepSeek-V3's dense first layers)
            total += ffn(spec.layer_components(part, i)["ffn"]) - ffn(stack.ffn or spec.ffn)
        if part == "decoder" and spec.mtp is not None:  # per depth: two norms, W_k (2d x d), one layer (and its final norm)
            total += spec.mtp.depth * (2 * stack_norm + 2 * d * d + per_layer + (stack_norm if spec.uses_final_norm else 0))
        if getattr(attn, "value_residual", "none") == "learnable":  # two lambdas in every self-attention but the first
            total += 2 * (stack.layers - 1)
    if spec.kind == "encoder" and spec.head is None:
        total += d * d + d + norm(spec.norm)  # the MLM head's dense layer and norm
    total += spec.token_types * d + (norm(spec.norm) * sides if spec.embed_norm else 0)
    total += spec.vocab_size if spec.head_bias and spec.head is None else 0
    return total


# Table 3 of the paper, written out independently of the recipe files: row -> the values it changes.
TABLE3 = {
    "A1": {"model.attention.heads": 1, "model.attention.key_dim": 512, "model.attention.value_dim": 512},
    "A2": {"model.attention.heads": 4, "model.attention.key_dim": 128, "model.attention.value_dim": 128},
    "A3": {"model.attention.heads": 16, "model.attention.key_dim": 32, "model.attention.value_dim": 32},
    "A4": {"model.attention.heads": 32, "model.attention.key_dim": 16, "model.attention.value_dim": 16},
    "B1": {"model.attention.key_dim": 16},
    "B2": {"model.attention.key_dim": 32},
    "C1": {"model.encoder.layers": 2, "model.decoder.layers": 2},
    "C2": {"model.encoder.layers": 4, "model.decoder.layers": 4},
    "C3": {"model.encoder.layers": 8, "model.decoder.layers": 8},
    "C4": {"model.d_model": 256, "model.attention.key_dim": 32, "model.attention.value_dim": 32},
    "C5": {"model.d_model": 1024, "model.attention.key_dim": 128, "model.attention.value_dim": 128},
    "C6": {"model.ffn.hidden": 1024},
    "C7": {"model.ffn.hidden": 4096},
    "D1": {"model.dropout": 0.0},
    "D2": {"model.dropout": 0.2},
    "D3": {"optim.label_smoothing": 0.0},
    "D4": {"optim.label_smoothing": 0.2},
    "E": {"model.position.type": "learned", "model.position.base": None},
}


def flat(data, prefix="") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_table3_has_every_row_of_the_paper():
    rows = sorted(p.stem for p in (ROOT / "recipes" / "table3").glob("*.yaml"))
    assert rows == sorted(TABLE3)


@pytest.mark.parametrize("row", sorted(TABLE3))
def test_table3_row_changes_exactly_what_the_paper_says(row):
    base = flat(tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml").to_dict())
    mine = flat(tfbuilder.load_recipe(ROOT / "recipes" / "table3" / f"{row}.yaml").to_dict())
    changed = {k: mine.get(k) for k in set(base) | set(mine) if k != "name" and base.get(k) != mine.get(k)}
    assert changed == TABLE3[row]


# The CPU-scaled study (recipes/multi30k/table3/): every row changes its base in the keys the paper's row
# changes, at the base's scale (a quarter of the width, half the depth).
TABLE3_CPU = {
    "A1": {"model.attention.heads": 1, "model.attention.key_dim": 128, "model.attention.value_dim": 128},
    "A2": {"model.attention.heads": 4, "model.attention.key_dim": 32, "model.attention.value_dim": 32},
    "A3": {"model.attention.heads": 16, "model.attention.key_dim": 8, "model.attention.value_dim": 8},
    "A4": {"model.attention.heads": 32, "model.attention.key_dim": 4, "model.attention.value_dim": 4},
    "B1": {"model.attention.key_dim": 4},
    "B2": {"model.attention.key_dim": 8},
    "C1": {"model.encoder.layers": 1, "model.decoder.layers": 1},
    "C2": {"model.encoder.layers": 2, "model.decoder.layers": 2},
    "C3": {"model.encoder.layers": 4, "model.decoder.layers": 4},
    "C4": {"model.d_model": 64, "model.attention.key_dim": 8, "model.attention.value_dim": 8},
    "C5": {"model.d_model": 256, "model.attention.key_dim": 32, "model.attention.value_dim": 32},
    "C6": {"model.ffn.hidden": 256},
    "C7": {"model.ffn.hidden": 1024},
    "D1": {"model.dropout": 0.0},
    "D2": {"model.dropout": 0.2},
    "D3": {"optim.label_smoothing": 0.0},
    "D4": {"optim.label_smoothing": 0.2},
    "E": {"model.position.type": "learned", "model.position.base": None},
}


@pytest.mark.parametrize("row", sorted(TABLE3))
def test_cpu_table3_row_is_the_papers_row_at_the_bases_scale(row):
    folder = ROOT / "recipes" / "multi30k" / "table3"
    assert sorted(p.stem for p in folder.glob("*.yaml")) == sorted([*TABLE3, "base"])
    base = flat(tfbuilder.load_recipe(folder / "base.yaml").to_dict())
    mine = flat(tfbuilder.load_recipe(folder / f"{row}.yaml").to_dict())
    changed = {k: mine.get(k) for k in set(base) | set(mine) if k != "name" and base.get(k) != mine.get(k)}
    assert changed == TABLE3_CPU[row]
    assert changed.keys() == TABLE3[row].keys()  # the same knobs as the paper's row
    paper = flat(tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml").to_dict())
    for key, value in changed.items():  # ... moved in the same direction
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "model.dropout" and "smoothing" not in key:
            assert (value > base[key]) == (TABLE3[row][key] > paper[key]), key


def test_vanilla_big_is_the_papers_big_model():
    big = tfbuilder.load_recipe(ROOT / "recipes" / "vanilla-big.yaml")
    m = big.model
    assert (m.d_model, m.ffn.hidden, m.attention.heads, m.dropout) == (1024, 4096, 16, 0.3)
    assert (m.encoder.layers, m.decoder.layers, big.trainer.max_steps) == (6, 6, 300_000)


def test_vanilla_is_the_papers_base_model():
    r = tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml")
    m = r.model
    assert (m.kind, m.d_model, m.ffn.hidden, m.ffn.activation, m.attention.heads) == ("encoder_decoder", 512, 2048, "relu", 8)
    assert (m.attention.key_dim, m.attention.value_dim, m.dropout, m.placement) == (64, 64, 0.1, "post")
    assert (m.encoder.layers, m.decoder.layers, m.vocab_size, m.position.type) == (6, 6, 37000, "sinusoidal")
    assert m.share_embeddings and m.tie_output and not m.uses_final_norm
    assert (r.optim.optimizer, r.optim.betas, r.optim.eps, r.optim.label_smoothing) == ("adam", (0.9, 0.98), 1e-9, 0.1)
    assert (r.optim.schedule.type, r.optim.schedule.warmup) == ("inverse_sqrt", 4000)


def test_wmt14_recipes_are_the_papers_setup():
    """WMT 2014 En->De from the Hub, a shared 37k BPE, 25,000 tokens per step (8 x 3,125 accumulated on
    one device, as on the paper's 8 GPUs), 100k/300k steps, the last 5/20 checkpoints kept for averaging."""
    for size, steps, keep, model in (("base", 100_000, 5, "vanilla.yaml"), ("big", 300_000, 20, "vanilla-big.yaml")):
        r = tfbuilder.load_recipe(ROOT / "recipes" / "wmt14" / f"{size}.yaml")
        parent = tfbuilder.load_recipe(ROOT / "recipes" / model)
        assert r.model == parent.model and r.optim.model_copy(update={"accumulate": 1}) == parent.optim
        d = r.data
        assert (d.format, d.hub.name, d.hub.config, d.path) == ("datasets", "wmt/wmt14", "de-en", None)
        assert (d.columns.source, d.columns.target) == ("translation.en", "translation.de")
        assert (d.splits.train, d.splits.val, d.splits.test) == ("train", "validation", "test")
        assert (d.tokenizer.type, d.tokenizer.vocab_size, d.tokenizer.shared) == ("bpe", 37000, True)
        assert d.max_tokens * r.optim.accumulate * r.trainer.devices == 25_000
        assert (r.trainer.max_steps, r.trainer.keep_last) == (steps, keep)



EXAMPLES = sorted(p for p in (ROOT / "docs" / "examples").rglob("*.yaml") if p.name != "bad-recipe.yaml")


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT / "docs")) for p in EXAMPLES])
def test_the_docs_example_recipes_validate(path):
    from tfbuilder.train.preflight import check

    check(tfbuilder.load_recipe(path))  # what `tfbuilder validate` checks: the schema, then the pre-flight
