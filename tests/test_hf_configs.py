"""Every field the Hugging Face converter reads changes what the imported model computes, as it does
in ``transformers``: models of seeded random configs, with no field at its default and every weight
perturbed, give the reference logits after ``import-hf``; and no field that a config.json holds is
silently ignored (each is read, or listed below with why it changes nothing)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")  # in the test extra

from hostile import assert_refused, run_cli, run_limited  # noqa: E402
from test_hf import REFERENCE_CLASS, V, compare, ours, theirs  # noqa: E402
from tfbuilder.interop.hf import export, import_hf  # noqa: E402
from tfbuilder.interop.hf.configs import UnsupportedConfig, from_config  # noqa: E402
from tfbuilder.runs.checkpoints import load_checkpoint  # noqa: E402

N = 13  # tokens per row


def gpt2(r: random.Random, i: int) -> dict:
    heads = r.choice([2, 3, 4])
    return dict(
        n_head=heads, n_embd=heads * r.choice([8, 12]), n_layer=r.choice([1, 2]), n_positions=r.choice([16, 40]),
        n_inner=r.choice([24, 56, 72]), activation_function=["gelu", "relu", "silu", "gelu_pytorch_tanh"][i % 4],
        layer_norm_epsilon=r.uniform(0.05, 0.5), tie_word_embeddings=i % 2 == 1,
    )


def bert(r: random.Random, i: int) -> dict:
    heads = r.choice([2, 3, 4])
    return dict(
        num_attention_heads=heads, hidden_size=heads * r.choice([8, 12]), num_hidden_layers=r.choice([1, 2]),
        intermediate_size=r.choice([24, 56]), max_position_embeddings=r.choice([16, 40]), type_vocab_size=r.choice([1, 3]),
        layer_norm_eps=r.uniform(0.05, 0.5), pad_token_id=r.choice([1, 5]), tie_word_embeddings=i % 2 == 1,
    )


def t5(r: random.Random, i: int) -> dict:
    buckets, pad = r.choice([6, 10, 16]), r.choice([2, 7])
    return dict(
        num_heads=r.choice([2, 3]), d_kv=r.choice([6, 10]), d_model=r.choice([24, 32]), d_ff=r.choice([20, 56]),
        num_layers=r.choice([1, 2]), num_decoder_layers=r.choice([1, 3]), relative_attention_num_buckets=buckets,
        relative_attention_max_distance=buckets // 2 + r.choice([1, 5, 30]), layer_norm_epsilon=r.uniform(0.05, 0.5),
        pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=1,
    )


def llama(r: random.Random, i: int) -> dict:
    heads = r.choice([2, 4])
    return dict(
        num_attention_heads=heads, num_key_value_heads=r.choice([1, heads // 2]), head_dim=r.choice([6, 10]),
        hidden_size=r.choice([24, 40]), intermediate_size=r.choice([20, 56]), num_hidden_layers=r.choice([1, 2]),
        rope_parameters={"rope_type": "default", "rope_theta": r.choice([31.0, 700.0, 1e6])}, rms_norm_eps=r.uniform(0.05, 0.5),
        attention_bias=i % 2 == 0, mlp_bias=i % 3 != 0, tie_word_embeddings=i % 2 == 1, bos_token_id=1, eos_token_id=2,
    )


DRAWS: dict[str, Callable[[random.Random, int], dict]] = {"gpt2": gpt2, "bert": bert, "t5": t5, "llama": llama}
CONFIG_CLASS = {"gpt2": "GPT2Config", "bert": "BertConfig", "t5": "T5Config", "llama": "LlamaConfig"}

# Fields a family's config.json holds that the converter reads to decide nothing about the function:
# what only training or generation uses, and what transformers derives from a field that is read.
NOT_READ = {
    "*": {"model_type", "transformers_version", "dtype", "torch_dtype", "use_cache", "bos_token_id", "eos_token_id"},
    "gpt2": {"embd_pdrop", "pad_token_id", "summary_activation", "summary_first_dropout", "summary_proj_to_labels",
             "summary_type", "summary_use_proj",
             "reorder_and_upcast_attn"},  # float32 attention in another order: equal in float32
    "bert": {"classifier_dropout"},
    "t5": {"classifier_dropout", "initializer_factor", "is_decoder", "is_encoder_decoder",
           "dense_act_fn", "is_gated_act"},  # transformers derives both from feed_forward_proj
    "llama": {"pad_token_id",  # the embedding's padding_idx: initialisation only
              "max_position_embeddings"},  # default rotary positions are computed for any length
}
# Fields read only to carry dropout and initialisation into the recipe (no effect in eval mode).
TRAINING_ONLY = {"resid_pdrop", "attn_pdrop", "initializer_range", "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate", "attention_dropout"}
# Fields read to refuse what tfbuilder cannot express (tests/test_hf.py: test_unsupported_config_exits_2_naming_the_field).
REFUSED_UNLESS_DEFAULT = {
    "architectures", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention", "position_embedding_type",
    "is_decoder", "hidden_act", "feed_forward_proj", "rope_scaling", "pretraining_tp", "scale_decoder_outputs",
    "quantization_config",
}
REFUSED_UNLESS_DEFAULT_IN = {"t5": {"tie_word_embeddings"}}  # before transformers 5: whether the output is scaled


class Recording(dict):
    """A config whose reads are recorded."""

    def __init__(self, data: dict):
        super().__init__(data)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def reference(family: str, seed: int, tmp_path) -> tuple[torch.nn.Module, dict]:
    """A reference model of a random config of ``family`` with every weight perturbed (biases and
    norm gains included: a bias the converter dropped would show), saved; and its config.json."""
    config = getattr(transformers, CONFIG_CLASS[family])(vocab_size=V, **DRAWS[family](random.Random(seed), seed))
    torch.manual_seed(seed)
    model = getattr(transformers, REFERENCE_CLASS[family])(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path)
    return model, json.loads((tmp_path / "config.json").read_text())


def batch(family: str, cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Ids with 0 among them; rows padded with the config's pad id where the family pads (no real
    token has that id there: the imported model masks it, transformers masks what it is told)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (3, N), generator=g)
    if family in ("gpt2", "llama"):
        return {"input_ids": ids}
    pad = cfg["pad_token_id"]
    ids[ids == pad] = (pad + 1) % V
    ids[1, 9:] = ids[2, 4:] = pad
    out = {"input_ids": ids, "attention_mask": (ids != pad).long()}
    if family == "bert":
        out["token_type_ids"] = torch.randint(0, cfg["type_vocab_size"], ids.shape, generator=g)
    else:
        tgt = torch.randint(0, V, (3, 7), generator=g)
        tgt[tgt == pad] = (pad + 1) % V
        tgt[:, 0] = pad  # T5's decoder starts with its pad id
        out["decoder_input_ids"] = tgt
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("family", sorted(DRAWS))
def test_import_of_a_random_config_gives_the_reference_logits(family, seed, tmp_path):
    """... and the export of the import loads in transformers with the same logits."""
    ref, cfg = reference(family, seed, tmp_path / "hf")
    ckpt = import_hf(tmp_path / "hf", tmp_path / "run")
    inputs = batch(family, cfg, seed)
    want = theirs(ref, family, inputs)
    compare(family, ours(load_checkpoint(ckpt).model, family, inputs), want, inputs)
    export(ckpt, format="hf", out=tmp_path / "back")
    compare(family, theirs(type(ref).from_pretrained(tmp_path / "back"), family, inputs), want, inputs)


@pytest.mark.parametrize("family", sorted(DRAWS))
def test_every_field_of_a_config_is_read_or_known_to_change_nothing(family, tmp_path):
    _, cfg = reference(family, 0, tmp_path)
    recording = Recording(cfg)
    from_config(recording)
    varied = set(DRAWS[family](random.Random(0), 0)) | {"vocab_size"}
    unexplained = recording.read - varied - TRAINING_ONLY - REFUSED_UNLESS_DEFAULT - REFUSED_UNLESS_DEFAULT_IN.get(family, set())
    assert not unexplained, f"{family}: the converter reads {sorted(unexplained)}; vary them in DRAWS above"
    ignored = set(cfg) - recording.read - NOT_READ["*"] - NOT_READ[family]
    assert not ignored, f"{family}: config.json's {sorted(ignored)} are ignored by the converter: read them, or refuse them"


def test_t5_without_scaled_decoder_outputs_is_refused():
    """transformers >= 5: tie_word_embeddings=False keeps the tied head but drops its d_model^-0.5."""
    cfg = transformers.T5Config(vocab_size=V, d_model=16, num_heads=2, num_layers=1, tie_word_embeddings=False).to_dict()
    cfg["architectures"] = ["T5ForConditionalGeneration"]
    with pytest.raises(UnsupportedConfig, match="scale_decoder_outputs"):
        from_config(cfg)



# --- hostile config.json: exit 2 naming the file and the key, no traceback, bounded memory ----------------

GPT2 = {"architectures": ["GPT2LMHeadModel"], "n_embd": 16, "n_head": 2, "n_layer": 1, "vocab_size": 50}


@pytest.mark.parametrize(
    "config, expected",
    [
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "config.json: nested too deeply to be a config"),
        (json.dumps(GPT2)[:-1] + ', "n_head": ' + "[" * 500 + "2" + "]" * 500 + "}", "config.json: n_head: expected a positive integer, got [[[[...]]]]"),
        (json.dumps({**GPT2, "architectures": [{"class": "GPT2LMHeadModel"}]}), "config.json: architectures: [{'class': 'GPT2LMHeadModel'}] is not supported"),
        (json.dumps({**GPT2, "architectures": {"GPT2LMHeadModel": 1}}), "config.json: architectures: expected a list of class names"),
        (json.dumps({**GPT2, "n_inner": 10**12}), "config.json: n_inner: 1e+12 is larger than any model tfbuilder builds"),
        (json.dumps({**GPT2, "n_layer": 10**30}), "config.json: n_layer: 1e+30 is larger than any model"),
        (json.dumps({**GPT2, "layer_norm_epsilon": 10**400}), "config.json: layer_norm_epsilon: expected a finite number"),
        (json.dumps({**GPT2, "resid_pdrop": float("nan")}), "config.json: resid_pdrop: expected a finite number, got nan"),
        (json.dumps({**GPT2, "activation_function": "gelu" * 100_000}), "config.json: activation_function: 'gelugelugelugelug...lugelugelugelugelu' is not supported"),
        (json.dumps({**GPT2, "eos_token_id": {"id": [1] * 10_000}}), "config.json: eos_token_id: {'id': [1, 1, 1, 1, ...]} is not a token id"),
        ('{"n_embd": 1' + "0" * 5000 + "}", "config.json: not JSON"),
        (json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "num_attention_heads": 2, "rope_parameters": [1]}),
         "config.json: rope_parameters: expected an object, got [1]"),
    ],
    ids=["deep", "deep-value", "unhashable", "not-a-list", "n_inner", "layers", "overflow", "nan", "long-string", "bad-id", "long-int", "rope"],
)
def test_a_hostile_config_is_refused_by_file_and_key(config, expected, tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(config)
    outcome = run_cli(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], capsys)
    assert_refused(outcome, f"{tmp_path / 'hf' / expected}")
    assert len(outcome.err) < 500  # the value is shown bounded, however large (beside the supported list)
    assert not (tmp_path / "out").exists()


def test_a_config_too_large_for_the_machine_is_refused_before_anything_is_allocated(tmp_path):
    """Every size under the cap, the whole far beyond any memory: counted, not built (1 GiB of address space)."""
    (tmp_path / "hf").mkdir()
    config = {**GPT2, "n_embd": 65536, "n_head": 1, "n_inner": 1 << 24, "n_layer": 1000, "vocab_size": 1 << 20}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    outcome = run_limited(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], cwd=tmp_path)
    assert_refused(outcome, f"{tmp_path / 'hf' / 'config.json'}: ", "parameters")
    assert not (tmp_path / "out").exists()


def test_query_key_value_biases_without_an_output_bias_export_as_qwen2():
    """Llama biases every projection or none; q, k and v biases alone are Qwen2's layout."""
    from conftest import ROOT
    from tfbuilder import load_recipe
    from tfbuilder.interop.hf.convert import hf_family

    llama = load_recipe(ROOT / "recipes" / "architectures" / "llama-small.yaml", ["model.attention.bias=qkv"]).model
    assert hf_family(llama) == "qwen2"
