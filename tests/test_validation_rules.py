"""Every rule that checks fields against each other (the sections' and components' validators, the
recipe's, pre-flight's and fit's), each alone: a recipe that only this rule rejects, valid in every
other respect, is refused with one problem at the rule's dotted path; where the rule is a bound, the
recipe just inside it is accepted. Dropping or loosening any one rule fails its row here.

Schema rules are written out in sections.py (DataSection, OptimSection, TrainerSection), recipe.py
(InitSection, ModelSection, Recipe) and the components' ``Params.check``; pre-flight's in preflight.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import tfbuilder
from conftest import ROOT, text_folder
from tfbuilder.train import fit as fitting
from tfbuilder.train import preflight
from tfbuilder.data.prepare import Split
from tfbuilder.errors import DataError
from tfbuilder.errors import RecipeError, TfbuilderError

RECIPES = ROOT / "recipes"
SYNTHETIC = RECIPES / "quickstart.yaml"  # encoder-decoder on synthetic data, char vocabulary of 15
PARALLEL = RECIPES / "vanilla.yaml"  # encoder-decoder on parallel text, shared 37k BPE
DECODER = RECIPES / "decoder-lm.yaml"  # decoder-only on monolingual text, 8k BPE
ENCODER = RECIPES / "encoder-mlm.yaml"  # encoder-only, learned positions (512), monolingual text
PACKED = RECIPES / "decoder-lm-packed.yaml"  # decoder-only, packed blocks of 128 tokens
NO_DATA = ["data=null", "model.vocab_size=100"]
SMALL_SYNTHETIC = ["data.train_size=100", "data.val_size=100", "data.test_size=100"]


@dataclass(frozen=True)
class Rule:
    id: str
    base: object  # a recipe file
    overrides: tuple[str, ...]  # what breaks the rule, alone
    path: str  # where the one problem is reported
    message: str  # a part of its message
    valid: tuple[str, ...] | None = None  # the nearest recipe the rule accepts (bounds: just inside)


SCHEMA_RULES = [
    # DataSection
    Rule("synthetic-needs-task", SYNTHETIC, ("data.task=null",), "data.task", "synthetic data needs a task"),
    Rule("lengths-min-above-max", SYNTHETIC, ("data.lengths=[5, 4]",), "data.lengths", "1 <= min <= max, got [5, 4]", ("data.lengths=[4, 4]",)),
    Rule("lengths-min-zero", SYNTHETIC, ("data.lengths=[0, 4]",), "data.lengths", "1 <= min <= max, got [0, 4]", ("data.lengths=[1, 4]",)),
    Rule("lengths-too-long", SYNTHETIC, ("data.lengths=[1, 100001]", *SMALL_SYNTHETIC), "data.lengths", "at most 100,000, got 100,001",
         ("data.lengths=[1, 100000]", *SMALL_SYNTHETIC)),
    Rule("synthetic-tokens-in-memory", SYNTHETIC, ("data.lengths=[1, 101]", "data.train_size=200000"), "data.train_size",
         "20,200,000 synthetic tokens", ("data.lengths=[1, 100]", "data.train_size=200000")),
    Rule("synthetic-uses-char", SYNTHETIC, ("data.tokenizer.type=bpe",), "data.tokenizer.type", "synthetic data uses the char tokenizer"),
    Rule("text-needs-path", PARALLEL, ("data.path=null",), "data.path", "parallel data needs a path"),
    Rule("parallel-needs-src_lang", PARALLEL, ("data.src_lang=null",), "data.src_lang", "parallel data needs src_lang"),
    Rule("parallel-needs-tgt_lang", PARALLEL, ("data.tgt_lang=null",), "data.tgt_lang", "parallel data needs tgt_lang"),
    Rule("monolingual-needs-lang", DECODER, (*text_folder("x"), "data.lang=null"), "data.lang", "monolingual data needs lang"),
    Rule("text-needs-vocab_size", PARALLEL, ("data.tokenizer.vocab_size=null",), "data.tokenizer.vocab_size", "needs tokenizer.vocab_size"),
    Rule("max_tokens-or-batch_size", PARALLEL, ("data.batch_size=32",), "data.batch_size", "set max_tokens or batch_size, not both",
         ("data.batch_size=32", "data.max_tokens=null")),
    # OptimSection
    Rule("beta1-below-one", PARALLEL, ("optim.betas=[1.0, 0.98]",), "optim.betas[0]", "beta1 must be in [0, 1), got 1.0", ("optim.betas=[0.0, 0.98]",)),
    Rule("beta2-below-one", PARALLEL, ("optim.betas=[0.9, 1.0]",), "optim.betas[1]", "beta2 must be in [0, 1), got 1.0", ("optim.betas=[0.9, 0.9999]",)),
    # TrainerSection
    Rule("devices-once-each", PARALLEL, ("trainer.devices=[1, 0, 1]",), "trainer.devices", "names a device twice", ("trainer.devices=[1, 0]",)),
    Rule("monitor-bleu-needs-bleu", PARALLEL, ("trainer.monitor=val_bleu",), "trainer.monitor", "needs trainer.val_bleu",
         ("trainer.monitor=val_bleu", "trainer.val_bleu=8")),
    # InitSection
    Rule("residual-scaling-needs-std", PARALLEL, ("model.init.residual_scaling=true",), "model.init.residual_scaling", "needs init.std",
         ("model.init.residual_scaling=true", "model.init.std=0.02")),
    # ModelSection
    Rule("encoder_decoder-needs-encoder", PARALLEL, ("model.encoder=null",), "model.encoder", "kind 'encoder_decoder' needs an encoder section"),
    Rule("encoder_decoder-needs-decoder", PARALLEL, ("model.decoder=null",), "model.decoder", "kind 'encoder_decoder' needs a decoder section"),
    Rule("decoder-has-no-encoder", DECODER, ("model.encoder={layers: 2}",), "model.encoder", "kind 'decoder' has no encoder"),
    Rule("encoder-has-no-decoder", ENCODER, ("model.decoder={layers: 2}",), "model.decoder", "kind 'encoder' has no decoder"),
    Rule("one-vocabulary-kinds", DECODER, ("model.src_vocab_size=8000",), "model.src_vocab_size", "kind 'decoder' has one vocabulary"),
    Rule("shared-embeddings-one-size", PARALLEL, ("model.src_vocab_size=36000", *NO_DATA), "model.src_vocab_size",
         "share_embeddings needs src_vocab_size (36000) == vocab_size (100)", ("model.src_vocab_size=100", *NO_DATA)),
    Rule("token-types-one-stack", PARALLEL, ("model.token_types=2",), "model.token_types", "token_types are for one-stack models"),
    Rule("encoder_decoder-needs-pad", PARALLEL, ("model.pad_id=null",), "model.pad_id", "needs pad_id (source padding must be masked)"),
    Rule("pad-below-vocab_size", PARALLEL, ("model.pad_id=100", *NO_DATA), "model.pad_id", "pad_id (100) must be smaller than vocab_size (100)",
         ("model.pad_id=99", *NO_DATA)),
    Rule("pad-below-src_vocab_size", PARALLEL, ("model.pad_id=50", "model.src_vocab_size=50", "model.share_embeddings=false", *NO_DATA), "model.pad_id",
         "pad_id (50) must be smaller than src_vocab_size (50)", ("model.pad_id=49", "model.src_vocab_size=50", "model.share_embeddings=false", *NO_DATA)),
    # components (Params.check), wherever they sit
    Rule("attention-heads-divide", PARALLEL, ("model.attention={type: multihead, heads: 7}",), "model.attention.heads",
         "d_model (512) must be divisible by heads (7), or set key_dim and value_dim", ("model.attention={type: multihead, heads: 8}",)),
    Rule("attention-heads-divide-value_dim", PARALLEL, ("model.attention={type: multihead, heads: 7, key_dim: 64}",), "model.attention.heads",
         "or set value_dim", ("model.attention={type: multihead, heads: 7, key_dim: 64, value_dim: 64}",)),
    Rule("attention-heads-divide-in-a-stack", PARALLEL, ("model.encoder.attention={type: multihead, heads: 7}",), "model.encoder.attention.heads",
         "divisible by heads (7)"),
    Rule("attention-kv_heads-divide", PARALLEL, ("model.attention.kv_heads=3",), "model.attention.kv_heads", "heads (8) must be divisible by kv_heads (3)",
         ("model.attention.kv_heads=2",)),
    Rule("attention-scale-or-qk_norm", PARALLEL, ("model.attention.scale=1.0", "model.attention.qk_norm=true"), "model.attention.scale",
         "qk_norm learns its own scale", ("model.attention.qk_norm=true",)),
    Rule("moe-top_k-at-most-experts", PARALLEL, ("model.ffn={type: moe, experts: 2, top_k: 3}",), "model.ffn.top_k", "top_k (3) cannot exceed experts (2)",
         ("model.ffn={type: moe, experts: 2, top_k: 2}",)),
    Rule("moe-experts-divisible-by-groups", PARALLEL, ("model.ffn={type: moe, experts: 6, groups: 4}",), "model.ffn.groups",
         "experts (6) must be divisible by groups (4)", ("model.ffn={type: moe, experts: 8, groups: 4}",)),
    Rule("moe-two-experts-per-group", PARALLEL, ("model.ffn={type: moe, experts: 4, groups: 4}",), "model.ffn.groups",
         "each group of experts needs 2 or more (4 experts in 4 groups)", ("model.ffn={type: moe, experts: 4, groups: 2}",)),
    Rule("moe-top_groups-at-most-groups", PARALLEL, ("model.ffn={type: moe, experts: 8, groups: 4, top_groups: 5}",),
         "model.ffn.top_groups", "top_groups (5) cannot exceed groups (4)",
         ("model.ffn={type: moe, experts: 8, groups: 4, top_groups: 4}",)),
    Rule("moe-top_k-within-top_groups", PARALLEL, ("model.ffn={type: moe, experts: 8, groups: 4, top_k: 3}",),
         "model.ffn.top_k", "top_k (3) exceeds the 2 experts of top_groups", ("model.ffn={type: moe, experts: 8, groups: 4, top_k: 2}",)),
    Rule("moe-bias_update-needs-correction_bias", PARALLEL, ("model.ffn={type: moe, bias_update: 0.001}",), "model.ffn.bias_update",
         "set correction_bias: true", ("model.ffn={type: moe, bias_update: 0.001, correction_bias: true}",)),
    Rule("moe-shared_gate-needs-shared-experts", PARALLEL, ("model.ffn={type: moe, shared_gate: true}",), "model.ffn.shared_gate",
         "needs shared_experts of 1 or more", ("model.ffn={type: moe, shared_gate: true, shared_experts: 1}",)),
    Rule("moe-shared_hidden-needs-shared-experts", PARALLEL, ("model.ffn={type: moe, shared_hidden: 8}",), "model.ffn.shared_hidden",
         "needs shared_experts of 1 or more", ("model.ffn={type: moe, shared_hidden: 8, shared_experts: 1}",)),
    Rule("moe-activation-is-for-mlp-experts", PARALLEL, ("model.ffn={type: moe, expert: swiglu, activation: gelu}",),
         "model.ffn.activation", "is for mlp experts", ("model.ffn={type: moe, expert: swiglu}",)),
    # Recipe: the model against its data and trainer
    Rule("data-for-encoder_decoder", PARALLEL, ("data={type: monolingual, path: x, lang: en, tokenizer: {vocab_size: 37000}}",), "data.type", "kind 'encoder_decoder' trains on parallel or synthetic data"),
    Rule("data-for-decoder", DECODER, ("data={type: parallel, path: x, src_lang: de, tgt_lang: en, tokenizer: {vocab_size: 8000}}",), "data.type", "kind 'decoder' trains on monolingual data"),
    Rule("vocab_size-is-the-datas", PARALLEL, ("model.vocab_size=36000",), "model.vocab_size", "model.vocab_size (36000) differs from the data's vocabulary (37000)",
         ("model.vocab_size=37000",)),
    Rule("src_vocab_size-is-the-datas", SYNTHETIC, ("model.share_embeddings=false", "model.src_vocab_size=14"), "model.src_vocab_size",
         "model.src_vocab_size (14) differs from the data's vocabulary (15)", ("model.share_embeddings=false", "model.src_vocab_size=15")),
    Rule("shared-embeddings-need-shared-tokenizer", PARALLEL, ("data.tokenizer.shared=false",), "model.share_embeddings", "needs data.tokenizer.shared: true",
         ("data.tokenizer.shared=false", "model.share_embeddings=false")),
    Rule("data-pads-with-0", PARALLEL, ("model.pad_id=1",), "model.pad_id", "model.pad_id (1) must be 0 when training on data", ("model.pad_id=1", *NO_DATA)),
    Rule("val_bleu-translates", DECODER, ("trainer.val_bleu=5",), "trainer.val_bleu", "needs an encoder_decoder model (this one is 'decoder')"),
]


def only_problem(error: RecipeError) -> tuple[str, str]:
    problems = [(p.path, p.message) for p in error.problems]
    assert len(problems) == 1, problems  # this rule alone
    return problems[0]


@pytest.mark.parametrize("rule", SCHEMA_RULES, ids=[r.id for r in SCHEMA_RULES])
def test_each_schema_rule_alone_refuses_its_recipe(rule):
    with pytest.raises(RecipeError) as info:
        tfbuilder.load_recipe(rule.base, list(rule.overrides))
    path, message = only_problem(info.value)
    assert path == rule.path and rule.message in message, (path, message)


BOUNDS = [r for r in SCHEMA_RULES if r.valid is not None]


@pytest.mark.parametrize("rule", BOUNDS, ids=[r.id for r in BOUNDS])
def test_just_inside_each_schema_rule_is_accepted(rule):
    tfbuilder.load_recipe(rule.base, list(rule.valid))


def test_the_base_recipes_are_valid():
    for base in (SYNTHETIC, PARALLEL, DECODER, ENCODER):
        tfbuilder.load_recipe(base)
        tfbuilder.load_recipe(base, NO_DATA if base is not SYNTHETIC else [])


# --- pre-flight: what needs a built model or this machine ---------------------------------------

HUGE = ("model.d_model=65536", "model.ffn.hidden=262144", "model.encoder.layers=1000")  # about 35 trillion parameters

PREFLIGHT_RULES = [
    Rule("learned-positions-cover-synthetic", SYNTHETIC, ("model.position={type: learned, max_len: 12}",), "model.position.max_len",
         "learned positions cover 12 but data.lengths allows 12 tokens (13 positions", ("model.position={type: learned, max_len: 13}",)),
    Rule("learned-positions-cover-text", ENCODER, ("data.max_len=511",), "model.position.max_len",
         "learned positions cover 512 but data.max_len allows 511 tokens (513 positions", ("data.max_len=510",)),
    Rule("learned-positions-cover-packed-blocks", PACKED, ("model.position={type: learned, max_len: 64}", "data.block_size=65"),
         "model.position.max_len", "learned positions cover 64 but data.block_size packs blocks of 65 tokens",
         ("model.position={type: learned, max_len: 64}", "data.block_size=64")),  # data.max_len (256) drops nothing here
    Rule("trial-step-runs", SYNTHETIC, ("model.position=rotary", "model.attention.key_dim=15"), "model",
         "fails a forward/backward pass: rotary positions need an even key width", ("model.position=rotary",)),
    Rule("fits-in-memory", SYNTHETIC, HUGE, "model", "training needs about", ()),
    Rule("nodes-need-a-launcher", SYNTHETIC, ("trainer.num_nodes=2",), "trainer.num_nodes", "needs a launcher that starts every node"),
]


@pytest.mark.parametrize("rule", PREFLIGHT_RULES, ids=[r.id for r in PREFLIGHT_RULES])
def test_each_preflight_rule_alone_refuses_its_recipe(rule, monkeypatch):
    for name in preflight.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    recipe = tfbuilder.load_recipe(rule.base, list(rule.overrides))  # valid to the schema
    with pytest.raises(RecipeError) as info:
        preflight.check(recipe)
    path, message = only_problem(info.value)
    assert path == rule.path and rule.message in message, (path, message)
    if rule.valid is not None:
        preflight.check(tfbuilder.load_recipe(rule.base, list(rule.valid)), environment=False)


def test_a_launcher_is_what_multi_node_needs(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert preflight.check_launcher(tfbuilder.load_recipe(SYNTHETIC, ["trainer.num_nodes=2"])) == []


def test_every_prepared_example_fits_the_learned_positions():
    """Validation and test lines are not filtered by data.max_len: each must fit the table too."""
    recipe = tfbuilder.load_recipe(SYNTHETIC, ["model.position={type: learned, max_len: 13}"])
    fits = {"train": Split([[5] * 12], [[6] * 12]), "val": Split([[5] * 3], [[6] * 12])}
    preflight.check_split_lengths(recipe, fits)  # 12 tokens + one special = 13 positions
    over = {**fits, "val": Split([[5] * 3, [5] * 2], [[6] * 12, [6] * 13])}
    with pytest.raises(DataError, match="the val split's example 2 has 13 target tokens, more than the 12"):
        preflight.check_split_lengths(recipe, over)


# --- what fit refuses before it starts ------------------------------------------------------------


def test_a_model_without_padding_trains_only_on_batches_of_one():
    decoder = tfbuilder.load_recipe(DECODER, ["model.pad_id=null"])
    with pytest.raises(TfbuilderError, match="model.pad_id is null"):
        fitting._refuse_untrainable(decoder, resume=None, init_from=None)
    ones = tfbuilder.load_recipe(DECODER, ["model.pad_id=null", "data.max_tokens=null", "data.batch_size=1"])
    fitting._refuse_untrainable(ones, resume=None, init_from=None)
    with pytest.raises(TfbuilderError, match="model.pad_id is null"):
        fitting._refuse_untrainable(tfbuilder.load_recipe(DECODER, ["model.pad_id=null", "data.max_tokens=null", "data.batch_size=2"]), resume=None, init_from=None)
